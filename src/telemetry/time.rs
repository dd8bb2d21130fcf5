//! Wall-clock time as records carry it (approvals, grants, admin actions).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Parse `30s`, `15m`, `1h`, `7d` into a duration.
pub fn parse_since(s: &str) -> Option<std::time::Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(secs))
}
