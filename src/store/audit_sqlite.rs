//! The SQLite audit trail's writer: a connection of its own, on a thread
//! of its own.
//!
//! Why not the pool (issue 27): through sqlx every bound value of a batch
//! was copied into an owned buffer and every statement was handed to
//! sqlx's worker thread and back, and the binding ran on the proxy's
//! runtime. Here the batch moves to this thread (no copy), the statements
//! are prepared once and bound in place, and the proxy's runtime only
//! hands the batch over and waits for the answer. CPU per record at 512
//! records a batch: BENCHMARKS.md ("audit CPU").
//!
//! SQLite serialises writers with its file lock; this connection waits
//! for it up to the store's busy timeout, as the pool's connections do,
//! and takes it at `BEGIN` (`IMMEDIATE`), as admin transactions do.

use std::path::PathBuf;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::oneshot;

use super::audit::{audit_insert_sql, chunks};
use super::model::AuditRecord;
use super::{Backend, StoreError, SQLITE_BUSY_TIMEOUT};

/// A batch to write, and where to send it back with the outcome.
struct Job {
    rows: Vec<AuditRecord>,
    done: oneshot::Sender<(Vec<AuditRecord>, Result<(), StoreError>)>,
}

/// The handle the store keeps; the thread ends when it is dropped.
pub(super) struct SqliteAuditWriter {
    jobs: mpsc::Sender<Job>,
}

impl SqliteAuditWriter {
    /// Start the thread for the database file at `path` (created and
    /// migrated already). It opens its connection on its first batch, and
    /// again after a batch that could not open it.
    pub(super) fn start(path: PathBuf) -> Result<Self, StoreError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tessera-audit".into())
            .spawn(move || run(&path, rx))
            .map_err(|e| StoreError::AuditWriter(format!("starting its thread: {e}")))?;
        Ok(SqliteAuditWriter { jobs })
    }

    /// Write `rows` in one transaction. They are back in `rows` when this
    /// returns, written or not (the caller retries a failed batch).
    pub(super) async fn write(&self, rows: &mut Vec<AuditRecord>) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        let job = Job {
            rows: std::mem::take(rows),
            done,
        };
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            *rows = job.rows;
            return Err(StoreError::AuditWriter("its thread has stopped".into()));
        }
        // The thread answers every job it takes, a panic included; a
        // missing answer means the thread is gone with the batch.
        let (back, result) = answer
            .await
            .map_err(|_| StoreError::AuditWriter("its thread stopped mid-batch".into()))?;
        *rows = back;
        result
    }
}

fn run(path: &std::path::Path, jobs: mpsc::Receiver<Job>) {
    let mut conn: Option<Connection> = None;
    for Job { rows, done } in jobs {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let c = match &mut conn {
                Some(c) => c,
                None => conn.insert(open(path)?),
            };
            insert(c, &rows)
        }))
        .unwrap_or_else(|_| Err(StoreError::AuditWriter("a batch panicked".into())));
        if result.is_err() {
            // Open afresh next time: the connection may be what failed.
            conn = None;
        }
        let _ = done.send((rows, result));
    }
}

fn open(path: &std::path::Path) -> Result<Connection, StoreError> {
    // No mutex of SQLite's own: this thread is the connection's only user.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(path, flags)?;
    c.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
    // As the pool's connections: a committed batch survives a power cut.
    c.pragma_update(None, "synchronous", "FULL")?;
    // The seven chunk texts stay prepared (rusqlite's default cache holds 16).
    Ok(c)
}

fn insert(c: &mut Connection, rows: &[AuditRecord]) -> Result<(), StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for chunk in chunks(rows) {
        let mut st = tx.prepare_cached(audit_insert_sql(Backend::Sqlite, chunk.len()))?;
        for (i, r) in chunk.iter().enumerate() {
            let at = |c: usize| i * 12 + c;
            st.raw_bind_parameter(at(1), r.at)?;
            st.raw_bind_parameter(at(2), &r.caller)?;
            st.raw_bind_parameter(at(3), &r.connection)?;
            st.raw_bind_parameter(at(4), &r.http_method)?;
            st.raw_bind_parameter(at(5), &r.rpc_method)?;
            st.raw_bind_parameter(at(6), &r.tool)?;
            st.raw_bind_parameter(at(7), &r.verdict)?;
            st.raw_bind_parameter(at(8), &r.reason)?;
            st.raw_bind_parameter(at(9), &r.arguments_sha256)?;
            st.raw_bind_parameter(at(10), &r.arguments)?;
            st.raw_bind_parameter(at(11), i64::from(r.status))?;
            st.raw_bind_parameter(at(12), r.duration_us)?;
        }
        st.raw_execute()?;
    }
    // Dropped uncommitted (an error above), the transaction rolls back.
    tx.commit()?;
    Ok(())
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e)
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::{AuditQuery, AuditRecord};
    use super::super::Store;

    fn record(i: i64, verdict: &str) -> AuditRecord {
        AuditRecord {
            id: 0,
            at: 1_796_300_000_000 + i,
            caller: format!("agent-{i}"),
            connection: "c0ffee".into(),
            http_method: "POST".into(),
            rpc_method: Some("tools/call".into()),
            tool: Some("run".into()),
            verdict: verdict.into(),
            reason: None,
            arguments_sha256: None,
            arguments: None,
            status: 200,
            duration_us: 1,
        }
    }

    async fn count(store: &Store) -> usize {
        let q = AuditQuery {
            limit: 10_000,
            ..Default::default()
        };
        store.audit(&q).await.unwrap().len()
    }

    /// A row the table refuses (a verdict outside its CHECK) in the last
    /// chunk of a batch: the batch fails whole, its earlier chunks are
    /// rolled back, every record is handed back for the retry, and the
    /// writer goes on writing the next batch.
    #[tokio::test]
    async fn a_failed_batch_lands_nowhere_and_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_data_dir(dir.path()).await.unwrap();
        let mut batch: Vec<_> = (0..100).map(|i| record(i, "allow")).collect();
        batch[99].verdict = "maybe".into();
        let sent = batch.clone();
        let e = store.insert_audit(&mut batch).await.unwrap_err();
        assert!(e.to_string().contains("CHECK constraint"), "{e}");
        assert_eq!(batch, sent, "the batch comes back as it went");
        assert_eq!(count(&store).await, 0, "no chunk of it landed");
        batch[99].verdict = "deny".into();
        store.insert_audit(&mut batch).await.unwrap();
        assert_eq!(count(&store).await, 100);
    }
}
