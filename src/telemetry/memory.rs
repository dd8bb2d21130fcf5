//! Memory handed back to the system after a wave of streams closes.
//!
//! Each open event stream holds about 19 KiB in tessera (hyper's connection
//! buffers, its task). When thousands close, glibc's malloc keeps the freed
//! memory for reuse rather than returning it: after 6,000 streams opened and
//! closed three times, RSS stayed at 163 MB, and one `malloc_trim(0)` brought
//! it to 35 MB against a 18 MB baseline (`bench/soak.py`). The memory was
//! free, not leaked, but a sidecar that once had a burst should not hold its
//! peak for the rest of its life.
//!
//! So a background task compares the count of open streams with its
//! high-water mark once per `every`; when it has fallen by [`WAVE`] or more
//! since the last release and has stopped falling, the allocator is asked
//! to return its free pages
//! (the binary passes glibc's `malloc_trim`; the library holds no unsafe
//! code). The release runs on the blocking pool, never on a request's path,
//! and only after such a wave: steady traffic never triggers it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::telemetry::metrics::Metrics;

/// How many streams must have closed since the high-water mark before
/// memory is released: about 10 MB at 19 KiB each.
pub const WAVE: i64 = 512;

/// Checks waited through for a wave that is still closing, at most.
const SETTLE_CHECKS: u32 = 10;

/// Releases free memory with `release` after each wave of closed streams;
/// runs until the process ends.
pub async fn release_after_waves(metrics: Arc<Metrics>, every: Duration, release: fn()) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut waves = Waves::default();
    loop {
        tick.tick().await;
        waves.check(&metrics, release).await;
    }
}

/// What the checks remember between ticks.
#[derive(Default)]
pub struct Waves {
    /// Open streams at the last check.
    last: i64,
    /// Checks since a wave was first seen, while it keeps closing.
    waited: u32,
}

impl Waves {
    /// One check: releases once a wave of streams has closed since the
    /// last release and has stopped closing (or kept closing for
    /// [`SETTLE_CHECKS`] checks), and says whether it did. Waiting for the
    /// wave to settle releases once, after it, rather than once per tick
    /// while thousands of streams wind down.
    pub async fn check(&mut self, metrics: &Metrics, release: fn()) -> bool {
        let (peak, now) = metrics.streams_peak();
        let settled = now == std::mem::replace(&mut self.last, now);
        if peak - now < WAVE {
            self.waited = 0;
            return false;
        }
        self.waited += 1;
        if !settled && self.waited <= SETTLE_CHECKS {
            return false;
        }
        self.waited = 0;
        let started = Instant::now();
        // A release walks the heap under the allocator's lock: about 10 ms
        // after 6,000 streams (bench/soak.py), kept off the runtime's
        // threads; allocations wait for it once per wave.
        if tokio::task::spawn_blocking(release).await.is_err() {
            return false;
        }
        metrics.memory_released();
        // The high-water mark starts again from what is open now.
        metrics.reset_streams_peak();
        tracing::info!(
            streams_closed = peak - now,
            micros = started.elapsed().as_micros() as u64,
            "a wave of streams closed: free memory returned to the system"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static RELEASES: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        RELEASES.fetch_add(1, Relaxed);
    }

    #[tokio::test]
    async fn memory_is_released_once_per_wave_of_closed_streams_when_it_settles() {
        let metrics = Arc::new(Metrics::default());
        let mut waves = Waves::default();
        let released = || RELEASES.load(Relaxed);
        let open = |n: i64| (0..n).map(|_| metrics.stream_opened()).collect::<Vec<_>>();

        // Fewer than a wave opened and closed: nothing to release.
        let small = open(WAVE - 1);
        assert!(!waves.check(&metrics, count).await);
        drop(small);
        assert!(!waves.check(&metrics, count).await);
        assert!(!waves.check(&metrics, count).await);
        assert_eq!(released(), 0);

        // A wave opened and closed between two checks: the high-water mark
        // still sees it. It is released once the count holds still.
        drop(open(WAVE * 2));
        let mut closing = open(WAVE);
        assert!(!waves.check(&metrics, count).await, "still closing");
        closing.clear();
        assert!(!waves.check(&metrics, count).await, "still closing");
        assert!(waves.check(&metrics, count).await);
        assert!(!waves.check(&metrics, count).await);
        assert_eq!(released(), 1);
        assert!(metrics
            .render(&crate::telemetry::metrics::Gauges {
                audit_queue_depth: 0,
                audit_failing: false,
                ..Default::default()
            })
            .contains("tessera_memory_releases_total 1"));

        // Streams still open are not a wave, however many; once they
        // close, they are.
        let held = open(WAVE * 2);
        assert!(!waves.check(&metrics, count).await);
        assert!(!waves.check(&metrics, count).await);
        drop(held);
        assert!(!waves.check(&metrics, count).await, "just closed");
        assert!(waves.check(&metrics, count).await);
        assert_eq!(released(), 2);

        // A wave that never stops closing is released after SETTLE_CHECKS.
        let mut slow = open(WAVE + SETTLE_CHECKS as i64 + 1);
        let mut checks = 0;
        loop {
            slow.pop();
            checks += 1;
            if waves.check(&metrics, count).await {
                break;
            }
            assert!(checks <= WAVE + SETTLE_CHECKS as i64 + 1, "never released");
        }
        assert_eq!(released(), 3);
    }
}
