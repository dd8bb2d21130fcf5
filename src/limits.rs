//! Limits on what one caller, or one stranger, can make tessera do.
//!
//! - **Per caller**: requests in flight (a streamed answer counts until it
//!   ends) and a request rate (a token bucket). Over either, 429 with
//!   `Retry-After`. The counters live in [`CallerUse`], one per caller,
//!   carried from snapshot to snapshot so a reload never resets them.
//! - **Failed authentication**, per source address and per connection
//!   address ([`AuthThrottle`]): after a few failures in a row, further
//!   failures are answered 429 with an exponentially growing
//!   `Retry-After` instead of 401. A request with a valid token is never
//!   throttled, so a burst of wrong tokens against an address cannot lock
//!   out its real caller; tokens are 256 random bits, so the valid-token
//!   exemption gives a guesser nothing. The throttle sheds and flags the
//!   flood (metrics, one log line per back-off step).
//!
//! All of it is in memory, per process, and lock-light: one short mutex per
//! caller for the bucket, atomics for the in-flight count, and the
//! throttle's tables are touched only by failed requests.

use std::collections::HashMap;
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
/// address.
#[derive(Debug)]
pub struct AuthThrottle {
    /// Failures in a row tolerated before back-off starts.
    free: u32,
    /// The longest back-off.
    cap: Duration,
    /// A key's record is forgotten after this long without a failure.
    forget: Duration,
    by_source: Mutex<HashMap<IpAddr, Failures>>,
    by_address: Mutex<HashMap<Box<str>, Failures>>,
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

/// The most keys each table holds; past it, the oldest records go first.
const MAX_KEYS: usize = 4096;

impl Default for AuthThrottle {
    fn default() -> Self {
        AuthThrottle::new(10, Duration::from_secs(60), Duration::from_secs(600))
    }
}

impl AuthThrottle {
    pub fn new(free: u32, cap: Duration, forget: Duration) -> Self {
        AuthThrottle {
            free,
            cap,
            forget,
            by_source: Mutex::default(),
            by_address: Mutex::default(),
        }
    }

    /// Record a failed authentication from `source` on `address` at `now`.
    /// `Some(seconds)` when the failure falls in a back-off (answer 429
    /// with that `Retry-After`), `None` for a plain 401.
    pub fn failed(&self, source: IpAddr, address: Option<&str>, now: Instant) -> Option<u32> {
        let a = record(&self.by_source, source, now, self);
        let b = address.and_then(|addr| {
            // Addresses are bounded by the route (a fixed id length), so a
            // key is small; only failures ever insert one.
            record(&self.by_address, Box::<str>::from(addr), now, self)
        });
        a.max(b)
    }

    fn backoff(&self, level: u32) -> Duration {
        Duration::from_secs(1u64 << level.min(16)).min(self.cap)
    }
}

/// Count one failure under `key`; the back-off it falls in, if any.
fn record<K: std::hash::Hash + Eq + Clone>(
    table: &Mutex<HashMap<K, Failures>>,
    key: K,
    now: Instant,
    t: &AuthThrottle,
) -> Option<u32> {
    let mut map = table.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= MAX_KEYS && !map.contains_key(&key) {
        map.retain(|_, f| now.saturating_duration_since(f.last) < t.forget);
        if map.len() >= MAX_KEYS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
    }
    let f = map.entry(key).or_insert(Failures {
        count: 0,
        level: 0,
        last: now,
        until: now,
    });
    if now.saturating_duration_since(f.last) >= t.forget {
        f.count = 0;
        f.level = 0;
        f.until = now;
    }
    let throttled = now < f.until;
    f.count = f.count.saturating_add(1);
    f.last = now;
    if f.count > t.free && !throttled {
        // The next failures wait out a back-off that doubles each time.
        f.level += 1;
        f.until = now + t.backoff(f.level);
        tracing::warn!(
            failures = f.count,
            backoff_s = t.backoff(f.level).as_secs(),
            "repeated failed authentication; answering 429 for a while"
        );
    }
    throttled.then(|| {
        let left = f.until.saturating_duration_since(now).as_secs_f64().ceil() as u32;
        left.max(1)
    })
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
        for i in 0..(MAX_KEYS as u32 + 100) {
            t.failed(IpAddr::from(i.to_be_bytes()), None, now);
        }
        assert!(t.by_source.lock().unwrap().len() <= MAX_KEYS);
    }
}
