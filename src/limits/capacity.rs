//! What all callers together may hold of tessera: open data-plane
//! connections (in total and per source address), and the memory of the
//! request bodies being read.
//!
//! - **Connections** ([`Connections`]). `--max-connections` caps the open
//!   connections of the data plane, so a flood of sockets cannot take the
//!   descriptors tessera needs for upstreams, its database and the admin
//!   listener; `--max-connections-per-source` caps those of one source
//!   (an IPv4 address, or an IPv6 /64: one host holds a whole /64).
//!   A new connection over a cap takes the place of the oldest *idle*
//!   connection under that cap: one with no request in progress (nothing
//!   sent yet, a head half-sent, or kept alive between requests). Only
//!   when every connection under the cap is busy is the new one refused
//!   (per source: a 503, then closed) or left to wait in the kernel's
//!   accept queue (in total, until one ends). So idle or half-sent heads,
//!   however many, never lock out a caller who sends a request, and a
//!   request in progress (an open event stream included) is never cut to
//!   make room.
//! - **Body memory** ([`BodyMemory`]). `--max-body-memory` caps the bytes
//!   of request bodies held at once across all requests: a body's
//!   declared `Content-Length` is reserved before it is read, a chunked
//!   body's bytes as they arrive, and the reservation is held until the
//!   request's handler returns (the body has then been written to the
//!   upstream). Over the budget: 503 with `Retry-After`, and nothing
//!   reaches the upstream.
//!
//! Both are in memory, per process, and sized by what is open: a source
//! whose connections have all closed leaves nothing behind.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Descriptors kept back from `--max-connections`'s default for what is
/// not a caller's connection: the listeners, the database's pool, the
/// admin API's connections, the log, the policy folder and the runtime.
pub const RESERVED_DESCRIPTORS: u64 = 64;
/// The default `--max-connections` when the descriptor limit is unknown.
/// A known limit bounds the default by itself: a sidecar whose operator
/// raised `ulimit -n` to hold 10,000 idle agent streams (about 17 KiB
/// each, BENCHMARKS.md) gets them.
pub const MAX_DEFAULT_CONNECTIONS: usize = 4096;
/// The least default `--max-connections`, whatever the descriptor limit.
pub const MIN_DEFAULT_CONNECTIONS: usize = 16;
/// The default `--max-body-memory` (at least `--max-body-bytes`).
pub const DEFAULT_BODY_MEMORY: usize = 256 * 1024 * 1024;

/// The process's limit on open descriptors (`RLIMIT_NOFILE`, soft), when
/// it has one.
pub fn open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The default `--max-connections`: half the descriptors left after
/// [`RESERVED_DESCRIPTORS`], since each connection with a request in
/// flight may hold an upstream connection too ([`MAX_DEFAULT_CONNECTIONS`]
/// when the limit is unknown or unlimited).
pub fn default_max_connections(open_files: Option<u64>) -> usize {
    match open_files {
        Some(n) if n < u64::from(u32::MAX) => {
            let half = n.saturating_sub(RESERVED_DESCRIPTORS) / 2;
            usize::try_from(half)
                .unwrap_or(usize::MAX)
                .max(MIN_DEFAULT_CONNECTIONS)
        }
        _ => MAX_DEFAULT_CONNECTIONS,
    }
}

/// The default `--max-connections-per-source`: half the total (none when
/// the total is unlimited), so one source holds at most half the places
/// whatever it does. On a loopback listener (the sidecar default) every
/// caller is one source, 127.0.0.1, so a per-source cap there would only
/// be a second, smaller total: it is the total; the oldest idle
/// connections making room is what keeps a flood from locking callers
/// out (see README, Limits on callers).
pub fn default_max_connections_per_source(max_connections: usize, loopback: bool) -> usize {
    if loopback {
        return max_connections;
    }
    (max_connections / 2).max(usize::from(max_connections > 0))
}

/// Whom a connection is counted against: an IPv4 address, or an IPv6
/// address's /64 (an IPv4-mapped IPv6 address is its IPv4 address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    Source::V6(prefix)
                }
            },
        }
    }
}

/// Set in [`Slot::state`] when the connection is evicted.
const EVICTED: u32 = 1 << 31;

/// One open connection's state: its requests in progress (the low bits)
/// and whether it was evicted.
#[derive(Debug, Default)]
pub struct Slot {
    state: AtomicU32,
    evict: Notify,
}

impl Slot {
    /// Whether the connection was closed to make room for another.
    pub fn evicted(&self) -> bool {
        self.state.load(Ordering::Acquire) & EVICTED != 0
    }

    /// A request on this connection has begun; it is in progress until
    /// the guard is dropped (with the response body, once written).
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.state.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Evicts the connection if it is idle: true when it was.
    fn evict_if_idle(&self) -> bool {
        let evicted = self
            .state
            .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            // Stored if the connection's task is not waiting yet.
            self.evict.notify_one();
        }
        evicted
    }
}

/// A request in progress on a connection (see [`Slot::busy`]).
#[derive(Debug)]
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.state.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it is dropped:
/// an open event stream is never evicted.
pub struct WhileBusy<B> {
    inner: B,
    _busy: Busy,
}

impl<B> WhileBusy<B> {
    pub fn new(inner: B, busy: Busy) -> Self {
        WhileBusy { inner, _busy: busy }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for WhileBusy<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The open connections of the data plane, oldest first.
#[derive(Debug)]
pub struct Connections {
    /// Places for connections (None: no total limit).
    total: Option<Arc<Semaphore>>,
    /// 0: no limit.
    per_source: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// Connections not evicted, by the order they were accepted.
    by_age: BTreeMap<u64, (Source, Arc<Slot>)>,
    /// Connections not evicted, per source; a source with none is removed.
    counts: HashMap<Source, usize>,
    /// Connections evicted that have not ended yet: each gives back its
    /// place in the total when it does.
    evicting: usize,
}

impl Open {
    /// Evicts the oldest idle connection among those `of` picks.
    fn evict_oldest(&mut self, of: impl Fn(Source) -> bool) -> bool {
        let found = self
            .by_age
            .iter()
            .find(|(_, (source, slot))| of(*source) && slot.evict_if_idle())
            .map(|(&id, &(source, _))| (id, source));
        match found {
            Some((id, source)) => {
                self.by_age.remove(&id);
                self.release(source);
                self.evicting += 1;
                true
            }
            None => false,
        }
    }

    fn release(&mut self, source: Source) {
        if let Some(n) = self.counts.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&source);
            }
        }
    }
}

/// A connection over `--max-connections-per-source` whose source has no
/// idle connection to give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverSource;

/// An accepted connection's place: counted until dropped (when the
/// connection ends).
#[derive(Debug)]
pub struct Place {
    conns: Arc<Connections>,
    id: u64,
    source: Source,
    slot: Arc<Slot>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Place {
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// Resolves when the connection is evicted.
    pub async fn evicted(&self) {
        self.slot.evict.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.conns.lock();
        if open.by_age.remove(&self.id).is_some() {
            open.release(self.source);
        } else {
            open.evicting -= 1;
        }
        drop(open);
        // The total place, last: the next connection may take it now.
        self.permit.take();
    }
}

impl Connections {
    /// `max_total` and `max_per_source`: 0 for no limit.
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Connections> {
        Arc::new(Connections {
            total: (max_total > 0)
                .then(|| Arc::new(Semaphore::new(max_total.min(Semaphore::MAX_PERMITS)))),
            per_source: max_per_source,
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection just accepted from `peer`. At its source's cap,
    /// the source's oldest idle connection is evicted for it; when there
    /// is none, it is refused. Then it waits for a place in the total: at
    /// the total cap, the oldest idle connection of any source is evicted
    /// for it, and when there is none it waits until a connection ends
    /// (the caller, the accept loop, then accepts nothing more meanwhile:
    /// the kernel's queue holds the next ones).
    pub async fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Place, OverSource> {
        let source = Source::from(peer);
        // Busy (waiting for its place) until admitted: never evicted.
        let slot = Arc::new(Slot::default());
        let waiting = slot.busy();
        let id = {
            let mut open = self.lock();
            let at_cap = self.per_source > 0
                && open.counts.get(&source).copied().unwrap_or(0) >= self.per_source;
            if at_cap && !open.evict_oldest(|s| s == source) {
                return Err(OverSource);
            }
            let id = open.next;
            open.next += 1;
            open.by_age.insert(id, (source, slot.clone()));
            *open.counts.entry(source).or_insert(0) += 1;
            id
        };
        let mut place = Place {
            conns: self.clone(),
            id,
            source,
            slot,
            permit: None,
        };
        if let Some(total) = &self.total {
            let permit = match total.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    // No more evicted than needed: one evicted already (for
                    // this source's cap, say) gives its place back soon.
                    {
                        let mut open = self.lock();
                        if open.evicting == 0 {
                            open.evict_oldest(|_| true);
                        }
                    }
                    total
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed")
                }
            };
            place.permit = Some(permit);
        }
        drop(waiting);
        Ok(place)
    }

    /// Connections open now (evicted ones that have not ended yet aside).
    pub fn open(&self) -> usize {
        self.lock().by_age.len()
    }
}

/// The memory of request bodies held at once, across all requests
/// (`--max-body-memory`; 0: no limit).
#[derive(Debug)]
pub struct BodyMemory {
    budget: usize,
    used: AtomicUsize,
}

/// Bytes reserved for one request's body, given back when dropped.
#[derive(Debug)]
pub struct Held<'a> {
    memory: &'a BodyMemory,
    bytes: usize,
}

impl BodyMemory {
    pub fn new(budget: usize) -> BodyMemory {
        BodyMemory {
            budget,
            used: AtomicUsize::new(0),
        }
    }

    /// Reserves `bytes`, or None when the budget has not that much left.
    pub fn reserve(&self, bytes: usize) -> Option<Held<'_>> {
        let mut held = Held {
            memory: self,
            bytes: 0,
        };
        held.grow(bytes).then_some(held)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn take(&self, bytes: usize) -> bool {
        if self.budget == 0 {
            // Counted all the same, to be shown.
            self.used.fetch_add(bytes, Ordering::AcqRel);
            return true;
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.budget)
            })
            .is_ok()
    }
}

impl Held<'_> {
    /// Reserves `more` bytes besides; false (and nothing more reserved)
    /// when the budget has not that much left.
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        let ok = self.memory.take(more);
        if ok {
            self.bytes += more;
        }
        ok
    }

    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.memory.used.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_descriptor_limit() {
        assert_eq!(default_max_connections(Some(1024)), 480);
        assert_eq!(default_max_connections(Some(256)), 96);
        assert_eq!(default_max_connections(Some(10)), MIN_DEFAULT_CONNECTIONS);
        assert_eq!(default_max_connections(Some(20_000)), 9968);
        assert_eq!(default_max_connections(Some(u64::MAX)), 4096);
        assert_eq!(default_max_connections(None), 4096);
        assert_eq!(default_max_connections_per_source(480, false), 240);
        assert_eq!(default_max_connections_per_source(480, true), 480);
        assert_eq!(default_max_connections_per_source(1, false), 1);
        assert_eq!(default_max_connections_per_source(0, false), 0);
    }

    #[test]
    fn sources_are_addresses_and_ipv6_prefixes() {
        let s = |a: &str| Source::from(a.parse::<IpAddr>().unwrap());
        assert_eq!(s("127.0.0.1"), s("::ffff:127.0.0.1"));
        assert_ne!(s("127.0.0.1"), s("127.0.0.2"));
        assert_eq!(s("2001:db8:1:2::1"), s("2001:db8:1:2:ffff::9"));
        assert_ne!(s("2001:db8:1:2::1"), s("2001:db8:1:3::1"));
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[tokio::test]
    async fn a_source_at_its_cap_gives_up_its_oldest_idle_connection() {
        let c = Connections::new(0, 2);
        let a = c.admit(ip(2)).await.unwrap();
        let b = c.admit(ip(2)).await.unwrap();
        let _busy = b.slot().busy();
        // Another source is not affected.
        let _other = c.admit(ip(1)).await.unwrap();
        let third = c.admit(ip(2)).await.unwrap();
        assert!(a.slot().evicted() && !b.slot().evicted());
        a.evicted().await;
        // Now both of the source's are busy: refused.
        let _busy3 = third.slot().busy();
        assert_eq!(c.admit(ip(2)).await.unwrap_err(), OverSource);
        drop(_busy3);
        assert!(c.admit(ip(2)).await.is_ok());
        assert!(third.slot().evicted());
        drop((a, b, third, _other));
        // Nothing left behind.
        assert_eq!(c.open(), 0);
        assert!(c.lock().counts.is_empty());
        assert_eq!(c.lock().evicting, 0);
    }

    #[tokio::test]
    async fn at_the_total_cap_the_oldest_idle_connection_makes_room() {
        let c = Connections::new(2, 0);
        let a = c.admit(ip(1)).await.unwrap();
        let b = c.admit(ip(2)).await.unwrap();
        let _busy = a.slot().busy();
        let admitting = tokio::spawn({
            let c = c.clone();
            async move { c.admit(ip(3)).await }
        });
        // b, idle, is evicted; its place is free once it ends.
        b.evicted().await;
        drop(b);
        let third = admitting.await.unwrap().unwrap();
        assert!(!a.slot().evicted() && !third.slot().evicted());
    }

    #[test]
    fn body_memory_is_reserved_and_given_back() {
        let m = BodyMemory::new(100);
        let mut a = m.reserve(60).unwrap();
        assert!(m.reserve(41).is_none());
        assert!(!a.grow(41));
        assert!(a.grow(40));
        assert_eq!((a.bytes(), m.used()), (100, 100));
        drop(a);
        assert_eq!(m.used(), 0);
        assert!(m.reserve(100).is_some());
        let unlimited = BodyMemory::new(0);
        let held = unlimited.reserve(usize::MAX / 2).unwrap();
        assert!(unlimited.reserve(usize::MAX / 4).is_some());
        assert_eq!(unlimited.used(), usize::MAX / 2);
        drop(held);
        assert_eq!(unlimited.used(), 0);
    }
}
