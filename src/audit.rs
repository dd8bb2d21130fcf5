//! The audit trail: one row per authorization decision, written off the
//! request's path.
//!
//! A request hands its record to a bounded queue and goes on; one task
//! drains the queue in batches, each batch one transaction. Nothing is
//! dropped: when the queue is full the request waits for room (and
//! [`Audit::waited`] counts it), and a failed write is retried until it
//! succeeds.
//!
//! While the database fails (an error, or no answer within the database
//! timeout) the queue holds what cannot be written. Once it is full, new
//! requests are refused before they are forwarded ([`Audit::has_room`]):
//! an action the trail cannot record is not taken. Writing resumes by
//! itself when the database answers again. A write abandoned on Postgres
//! rolls back; only one abandoned while its commit was on the wire can
//! land besides its retry: a record may then be written twice, never lost. Records hold names, ids, methods, the verdict and its reason,
//! and a SHA-256 of the tool arguments (the arguments themselves only with
//! `--audit-arguments`); never a credential or a caller token, which the
//! request path never hands over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::store::audit::AuditSink;
use crate::store::model::AuditRecord;
use crate::store::{Backend, StoreError};
use crate::telemetry::metrics::Metrics;

// Records are nearly every item; boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Item {
    Record(AuditRecord),
    /// Answered once everything queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// The sending side, shared by every request.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<Item>,
    waited: Arc<AtomicU64>,
    /// Set while the writer's last attempt failed.
    failing: Arc<AtomicBool>,
}

/// Records per transaction, at most.
const BATCH: usize = 512;

impl Audit {
    /// Start the writer on `sink` with room for `capacity` records; a
    /// write not done within `timeout` counts as failed and is retried.
    /// Each batch written is timed in `metrics`.
    pub fn start(
        sink: AuditSink,
        capacity: usize,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> (Audit, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let failing = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_batches(sink, rx, timeout, failing.clone(), metrics));
        (
            Audit {
                tx,
                waited: Arc::new(AtomicU64::new(0)),
                failing,
            },
            writer,
        )
    }

    /// Whether a new request's records can be kept: false once the writer
    /// fails and the queue is full (or the writer has stopped). Requests
    /// then are refused rather than forwarded unrecorded or left waiting
    /// for a database that may not come back soon.
    pub fn has_room(&self) -> bool {
        if !self.failing.load(Ordering::Relaxed) {
            return !self.tx.is_closed();
        }
        self.tx.capacity() > 0
    }

    /// Whether the writer's last attempt failed.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Queue a record; waits only when the queue is full.
    pub async fn record(&self, r: AuditRecord) {
        match self.tx.try_send(Item::Record(r)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(item)) => {
                self.waited.fetch_add(1, Ordering::Relaxed);
                if self.tx.send(item).await.is_err() {
                    tracing::error!("the audit writer has stopped; a record was not written");
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!("the audit writer has stopped; a record was not written");
            }
        }
    }

    /// Wait until every record queued so far is in the database, or
    /// `limit` has passed: false then (the records stay queued).
    pub async fn flush(&self, limit: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        let flushed = async { self.tx.send(Item::Flush(tx)).await.is_ok() && rx.await.is_ok() };
        tokio::time::timeout(limit, flushed).await.unwrap_or(false)
    }

    /// How many records had to wait for room in the queue.
    pub fn waited(&self) -> u64 {
        self.waited.load(Ordering::Relaxed)
    }

    /// Records waiting to be written.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// How long the writer lingers for more records before writing a batch
/// that is not full: per-row cost in SQLite falls steeply with batch size,
/// and the writer shares the proxy's core.
const LINGER: Duration = Duration::from_millis(20);

async fn write_batches(
    sink: AuditSink,
    mut rx: mpsc::Receiver<Item>,
    timeout: Duration,
    failing: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) {
    let mut items = Vec::with_capacity(BATCH);
    let mut batch = Vec::with_capacity(BATCH);
    let mut waiting = Vec::new();
    loop {
        if rx.recv_many(&mut items, BATCH).await == 0 {
            return;
        }
        // Gather more until the batch is full, the linger is over, or
        // someone waits for a flush.
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        let flush_asked = |items: &[Item]| items.iter().any(|i| matches!(i, Item::Flush(_)));
        while items.len() < BATCH && !flush_asked(&items) {
            let room = BATCH - items.len();
            tokio::select! {
                n = rx.recv_many(&mut items, room) => if n == 0 { break },
                () = &mut linger => break,
            }
        }
        for item in items.drain(..) {
            match item {
                Item::Record(r) => batch.push(r),
                Item::Flush(done) => waiting.push(done),
            }
        }
        let mut backoff = Duration::from_millis(50);
        while !batch.is_empty() {
            let started = Instant::now();
            match write_within(&sink, &mut batch, timeout, &failing).await {
                Ok(()) => {
                    metrics.audit_batch(started.elapsed());
                    batch.clear();
                    if failing.swap(false, Ordering::Relaxed) {
                        tracing::warn!("the audit trail is written again");
                    }
                }
                Err(e) => {
                    failing.store(true, Ordering::Relaxed);
                    tracing::error!(error = %e, records = batch.len(), queued = rx.len(), "writing audit records failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Write one batch. A write not done within `timeout` marks the trail
/// failing; on Postgres it is then abandoned (its transaction rolls back)
/// to be retried, on SQLite it is waited for: SQLite ends it itself within
/// its busy timeout, and an abandoned statement could still land after its
/// retry.
async fn write_within(
    sink: &AuditSink,
    batch: &mut Vec<AuditRecord>,
    timeout: Duration,
    failing: &AtomicBool,
) -> Result<(), StoreError> {
    let write = sink.write(batch);
    tokio::pin!(write);
    tokio::select! {
        r = &mut write => r,
        () = tokio::time::sleep(timeout) => {
            failing.store(true, Ordering::Relaxed);
            match sink.backend() {
                Backend::Sqlite => write.await,
                Backend::Postgres => Err(StoreError::Timeout(timeout.as_millis() as u64)),
            }
        }
    }
}

pub use crate::telemetry::time::parse_since;
