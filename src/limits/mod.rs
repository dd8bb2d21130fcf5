//! Limits on what one caller, or one stranger, can make tessera do.
//!
//! - **Per caller**: requests in flight (a streamed answer counts until it
//!   ends) and a request rate (a token bucket). Over either, 429 with
//!   `Retry-After`. The counters live in [`CallerUse`], one per caller,
//!   carried from snapshot to snapshot so a reload never resets them.
//! - **Failed authentication**, per source address and per connection
//!   address presented, whether it exists or not ([`AuthThrottle`]):
//!   after a few failures in a row, further
//!   failures are answered 429 with an exponentially growing
//!   `Retry-After` instead of 401. A request with a valid token is never
//!   throttled, so a burst of wrong tokens against an address cannot lock
//!   out its real caller; tokens are 256 random bits, so the valid-token
//!   exemption gives a guesser nothing. The throttle sheds and flags the
//!   flood (metrics, one log line per back-off step). Its tables have a
//!   fixed size, whatever a flood sprays.
//!
//! All of it is in memory, per process, and lock-light: one short mutex per
//! caller for the bucket, atomics for the in-flight count, and the
//! throttle's tables are touched only by failed requests.

pub mod capacity;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The per-caller limits (`serve --caller-max-in-flight`, `--caller-rate`,
/// `--caller-burst`). Zero turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallerLimits {
    pub max_in_flight: u32,
    /// Requests per second, sustained.
    pub rate: f64,
    /// Requests allowed at once above the rate.
    pub burst: u32,
}

/// Why a caller's request was not admitted, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    InFlight { retry_after_s: u32 },
    Rate { retry_after_s: u32 },
}

impl Refusal {
    pub fn retry_after_s(self) -> u32 {
        match self {
            Refusal::InFlight { retry_after_s } | Refusal::Rate { retry_after_s } => retry_after_s,
        }
    }
}

/// One caller's use: requests in flight and its token bucket.
#[derive(Debug)]
pub struct CallerUse {
    in_flight: AtomicU32,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for CallerUse {
    fn default() -> Self {
        CallerUse {
            in_flight: AtomicU32::new(0),
            // Filled on first use, from the limits then in force.
            bucket: Mutex::new(Bucket {
                tokens: f64::NAN,
                at: Instant::now(),
            }),
        }
    }
}

/// A request admitted: it counts as in flight until this is dropped (with
/// the response body, for a stream).
#[derive(Debug)]
pub struct Admitted(Arc<CallerUse>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

impl CallerUse {
    /// Admit one request under `limits`, at `now`.
    pub fn admit(
        self: &Arc<Self>,
        limits: &CallerLimits,
        now: Instant,
    ) -> Result<Admitted, Refusal> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let admitted = Admitted(self.clone());
        if limits.max_in_flight > 0 && before >= limits.max_in_flight {
            return Err(Refusal::InFlight { retry_after_s: 1 });
        }
        if limits.rate > 0.0 {
            let capacity = f64::from(limits.burst.max(1));
            let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
            if b.tokens.is_nan() {
                b.tokens = capacity;
                b.at = now;
            }
            let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * limits.rate).min(capacity);
            b.at = now;
            if b.tokens < 1.0 {
                let wait = (1.0 - b.tokens) / limits.rate;
                return Err(Refusal::Rate {
                    retry_after_s: (wait.ceil() as u32).max(1),
                });
            }
            b.tokens -= 1.0;
        }
        Ok(admitted)
    }

    /// Requests (and streams) of this caller now in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// Failed authentication, remembered per source address and per connection
/// address presented.
///
/// An address is counted whether a connection lives there or not: were
/// only existing addresses counted, an existing one would answer 429 after
/// a few wrong tokens and a random one 401 forever, and a stranger could
/// tell which addresses exist. Counting every address a stranger names
/// must not let the stranger grow memory, so each table is a fixed array
/// of [`SLOTS`] records indexed by a keyed hash (a random key per process,
/// so slots cannot be aimed at): nothing is ever inserted or evicted. Two
/// keys that share a slot share a count; that can only bring a wrong
/// token's 429 sooner, never hold a valid token, and it happens to an
/// existing address and a random one alike.
#[derive(Debug)]
pub struct AuthThrottle {
    /// Failures in a row tolerated before back-off starts.
    free: u32,
    /// The longest back-off.
    cap: Duration,
    /// A key's record is forgotten after this long without a failure.
    forget: Duration,
    hasher: RandomState,
    by_source: Mutex<Box<[Failures]>>,
    by_address: Mutex<Box<[Failures]>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    /// Back-offs started so far: the next lasts 2^(level+1) s.
    level: u32,
    last: Instant,
    /// Failures before this instant are answered 429.
    until: Instant,
}

/// The records in each table (40 bytes each: 160 KiB per table).
const SLOTS: usize = 4096;

impl Default for AuthThrottle {
    fn default() -> Self {
        AuthThrottle::new(10, Duration::from_secs(60), Duration::from_secs(600))
    }
}

impl AuthThrottle {
    pub fn new(free: u32, cap: Duration, forget: Duration) -> Self {
        let now = Instant::now();
        // count 0: a fresh record, whatever its times.
        let table = || {
            Mutex::new(
                vec![
                    Failures {
                        count: 0,
                        level: 0,
                        last: now,
                        until: now,
                    };
                    SLOTS
                ]
                .into_boxed_slice(),
            )
        };
        AuthThrottle {
            free,
            cap,
            forget,
            hasher: RandomState::new(),
            by_source: table(),
            by_address: table(),
        }
    }

    /// Record a failed authentication from `source` on `address` at `now`.
    /// `Some(seconds)` when the failure falls in a back-off (answer 429
    /// with that `Retry-After`), `None` for a plain 401.
    pub fn failed(&self, source: IpAddr, address: Option<&str>, now: Instant) -> Option<u32> {
        let a = self.record(&self.by_source, self.slot(source_key(source)), now);
        let b = address.and_then(|addr| self.record(&self.by_address, self.slot(addr), now));
        a.max(b)
    }

    fn slot(&self, key: impl std::hash::Hash) -> usize {
        (self.hasher.hash_one(key) % SLOTS as u64) as usize
    }

    fn backoff(&self, level: u32) -> Duration {
        Duration::from_secs(1u64 << level.min(16)).min(self.cap)
    }

    /// Count one failure in `slot`; the back-off it falls in, if any.
    fn record(&self, table: &Mutex<Box<[Failures]>>, slot: usize, now: Instant) -> Option<u32> {
        let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
        let f = &mut t[slot];
        if f.count == 0 || now.saturating_duration_since(f.last) >= self.forget {
            f.count = 0;
            f.level = 0;
            f.until = now;
        }
        let throttled = now < f.until;
        f.count = f.count.saturating_add(1);
        f.last = now;
        if f.count > self.free && !throttled {
            // The next failures wait out a back-off that doubles each time.
            f.level += 1;
            f.until = now + self.backoff(f.level);
            tracing::warn!(
                failures = f.count,
                backoff_s = self.backoff(f.level).as_secs(),
                "repeated failed authentication; answering 429 for a while"
            );
        }
        throttled.then(|| {
            let left = f.until.saturating_duration_since(now).as_secs_f64().ceil() as u32;
            left.max(1)
        })
    }
}

/// The source a failure is counted on: an IPv4 address, or an IPv6
/// address's /64 (one host commonly holds a whole /64, and could rotate
/// through it); an IPv4-mapped IPv6 address is its IPv4 address.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_is_bounded_and_released() {
        let limits = CallerLimits {
            max_in_flight: 2,
            rate: 0.0,
            burst: 0,
        };
        let u = Arc::new(CallerUse::default());
        let now = Instant::now();
        let a = u.admit(&limits, now).unwrap();
        let b = u.admit(&limits, now).unwrap();
        assert_eq!(
            u.admit(&limits, now).unwrap_err(),
            Refusal::InFlight { retry_after_s: 1 }
        );
        assert_eq!(u.in_flight(), 2, "a refusal does not stay counted");
        drop(a);
        let _c = u.admit(&limits, now).unwrap();
        drop(b);
        assert_eq!(u.in_flight(), 1);
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let limits = CallerLimits {
            max_in_flight: 0,
            rate: 2.0,
            burst: 3,
        };
        let u = Arc::new(CallerUse::default());
        let t0 = Instant::now();
        for _ in 0..3 {
            drop(u.admit(&limits, t0).unwrap());
        }
        assert_eq!(
            u.admit(&limits, t0).unwrap_err(),
            Refusal::Rate { retry_after_s: 1 }
        );
        // Half a second at 2/s refills one token.
        drop(u.admit(&limits, t0 + Duration::from_millis(500)).unwrap());
        assert!(u.admit(&limits, t0 + Duration::from_millis(500)).is_err());
        // A long pause refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            drop(u.admit(&limits, later).unwrap());
        }
        assert!(u.admit(&limits, later).is_err());
    }

    #[test]
    fn failed_authentication_backs_off_exponentially_and_is_forgotten() {
        let t = AuthThrottle::new(3, Duration::from_secs(8), Duration::from_secs(100));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        // Three free failures, the fourth starts a 2 s back-off.
        for _ in 0..4 {
            assert_eq!(t.failed(ip, Some("addr"), t0), None);
        }
        assert_eq!(t.failed(ip, Some("addr"), t0), Some(2));
        // After it, the next failure doubles it (4 s), then 8 s, capped.
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(t.failed(ip, None, t1), None);
        assert_eq!(t.failed(ip, None, t1), Some(4));
        let t2 = t1 + Duration::from_secs(4);
        assert_eq!(t.failed(ip, None, t2), None);
        assert_eq!(t.failed(ip, None, t2), Some(8));
        let t3 = t2 + Duration::from_secs(8);
        assert_eq!(t.failed(ip, None, t3), None);
        assert_eq!(t.failed(ip, None, t3), Some(8), "capped");
        // The address is throttled on its own, from any source.
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(t.failed(other, Some("addr"), t0), Some(2));
        // Long quiet: forgotten.
        let much_later = t3 + Duration::from_secs(1000);
        assert_eq!(t.failed(ip, None, much_later), None);
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = AuthThrottle::default();
        let now = Instant::now();
        for i in 0..(SLOTS as u32 * 4) {
            t.failed(IpAddr::from(i.to_be_bytes()), Some(&format!("a{i}")), now);
        }
        assert_eq!(t.by_source.lock().unwrap().len(), SLOTS);
        assert_eq!(t.by_address.lock().unwrap().len(), SLOTS);
    }

    #[test]
    fn an_unknown_address_is_throttled_like_a_known_one() {
        // Each failure from a new source: only the address counts. (A
        // throttle each: two addresses may share a slot by chance.)
        let now = Instant::now();
        let statuses = |addr: &str, net: u8| -> Vec<Option<u32>> {
            let t = AuthThrottle::new(3, Duration::from_secs(8), Duration::from_secs(100));
            (0..6)
                .map(|i| t.failed(IpAddr::from([10, net, 0, i]), Some(addr), now))
                .collect()
        };
        let known = statuses("real-connection-id", 1);
        assert_eq!(known, [None, None, None, None, Some(2), Some(2)]);
        assert_eq!(statuses("random-address-xyz", 2), known);
    }

    #[test]
    fn an_ipv6_source_is_counted_by_its_64() {
        let t = AuthThrottle::new(2, Duration::from_secs(8), Duration::from_secs(100));
        let now = Instant::now();
        let got: Vec<_> = (0..4u16)
            .map(|i| {
                let ip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, i, i, i, i);
                t.failed(IpAddr::V6(ip), None, now)
            })
            .collect();
        assert_eq!(got, [None, None, None, Some(2)]);
    }
}
