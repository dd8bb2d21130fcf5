//! Wall-clock time as the store records it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
