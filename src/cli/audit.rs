//! `tessera audit`: the decision trail.

use std::time::Duration;

use anyhow::Result;
use tessera::store::Store;

/// Print audit records; with `follow`, keep polling for new ones.
pub(crate) async fn audit(
    store: &Store,
    mut q: tessera::store::model::AuditQuery,
    json: bool,
    follow: bool,
) -> Result<()> {
    if !json {
        out!(
            "{:<27} {:<32} {:<16} {:<8} {:<6} {:<26} {:<20} {:<7} {:<6} REASON",
            "TIME",
            "REQUEST",
            "CALLER",
            "CONN",
            "HTTP",
            "METHOD",
            "TOOL",
            "VERDICT",
            "STATUS"
        );
    }
    loop {
        let rows = store.audit(&q).await?;
        for r in &rows {
            if json {
                out!("{}", serde_json::to_string(r)?);
            } else {
                let at = std::time::UNIX_EPOCH + Duration::from_millis(r.at.max(0) as u64);
                // Method, tool and reason are an agent's words: printable.
                let p = |s: Option<&str>| {
                    tessera::telemetry::log::printable(s.unwrap_or("-")).into_owned()
                };
                out!(
                    "{:<27} {:<32} {:<16} {:<8} {:<6} {:<26} {:<20} {:<7} {:<6} {}",
                    tessera::telemetry::log::rfc3339(at),
                    // Written by tessera (hex) or read from an old row:
                    // printable either way.
                    p(r.request_id.as_deref()),
                    r.caller,
                    r.connection.chars().take(8).collect::<String>(),
                    r.http_method,
                    p(r.rpc_method.as_deref()),
                    p(r.tool.as_deref()),
                    r.verdict,
                    r.status,
                    p(r.reason.as_deref()),
                );
            }
        }
        if let Some(last) = rows.last() {
            q.after_id = Some(last.id);
        }
        if !follow {
            return Ok(());
        }
        if q.after_id.is_none() {
            q.after_id = Some(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
