//! Held calls on the request path: recorded (sealed), announced to the
//! webhook, and with `--approval-wait-ms` waited on until a person decides
//! (`crate::authz::approvals` keeps the records and the rules; this is the
//! serving process's side, which needs its state).

use crate::authz::approvals::{
    settle_with, Held, Notice, Settle, SettleError, Settled, PREVIEW_CHARS,
};
use crate::state::State;
use crate::telemetry::time::now_ms;

/// Settle a request's held calls for the serving process: record them
/// (sealed, with `--approval-ttl`), announce new ones to the webhook, and
/// with `--approval-wait-ms` wait that long for a person's decision,
/// woken by each change the store reports (never polling), ending early
/// at shutdown. A grant within the wait is used as on a retry; a denial
/// is answered; otherwise the calls are still pending.
pub async fn hold(state: &State, held: &[Held]) -> Result<Vec<Settled>, SettleError> {
    let cfg = &state.config;
    let s = Settle {
        store: &state.store,
        key: Some(state.master_key()),
        max_pending: cfg.max_pending_approvals,
        ttl: cfg.approval_ttl,
    };
    let once = || async {
        crate::store::timed(cfg.db_timeout, async { Ok(settle_with(&s, held).await) })
            .await
            .map_err(SettleError::Store)
            .and_then(|r| r)
    };
    // Watched from before the first look: a decision made in between is
    // not missed.
    let mut changes = state.approvals.changes();
    changes.mark_unchanged();
    let draining = state.draining.notified();
    tokio::pin!(draining);
    draining.as_mut().enable();
    let first = once().await?;
    for &i in &first.new {
        announce(state, &held[i], first.settled[i].id());
    }
    let waits = |s: &[Settled]| {
        s.iter().any(|s| matches!(s, Settled::Pending(_)))
            && !s.iter().any(|s| matches!(s, Settled::Denied(_)))
    };
    let mut last = first.settled;
    if cfg.approval_wait.is_zero() || !waits(&last) {
        return Ok(last);
    }
    let deadline = tokio::time::Instant::now() + cfg.approval_wait;
    loop {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return Ok(last) },
            () = tokio::time::sleep_until(deadline) => return Ok(last),
            () = &mut draining => {
                tracing::info!("a held call stopped waiting for a decision: shutting down");
                return Ok(last);
            }
        }
        // A decision can end the first approval (a grant used up by another
        // waiting call, a revocation): a new one asked for meanwhile is
        // announced like the first.
        let next = once().await?;
        for &i in &next.new {
            announce(state, &held[i], next.settled[i].id());
        }
        last = next.settled;
        if !waits(&last) {
            return Ok(last);
        }
    }
}

/// The prediction for a held call an `@ask("learn")` permit holds, or
/// `None` when a person's record of this very call stands (a pending
/// request, a denial or a grant in force: it is settled as before). A call
/// denied by prediction before is not predicted again: it is held for a
/// person (so an agent can always still reach one), and the outcome says
/// so. Store look-ups run under `--db-timeout-ms`; the prediction itself
/// under `--predict-timeout-ms`, where any failure asks.
pub async fn predict(
    state: &State,
    h: &Held,
    question: crate::authz::predict::Question,
) -> Result<Option<crate::authz::predict::Outcome>, crate::store::StoreError> {
    let cfg = &state.config;
    let now = now_ms();
    let ttl = i64::try_from(cfg.approval_ttl.as_millis()).unwrap_or(i64::MAX);
    let (recorded, denied_before) = crate::store::timed(cfg.db_timeout, async {
        if state.store.call_has_record(&h.key, now).await? {
            return Ok((true, false));
        }
        let denied = state
            .store
            .predicted_denial(&h.key, now.saturating_sub(ttl))
            .await?;
        Ok((false, denied))
    })
    .await?;
    if recorded {
        return Ok(None);
    }
    if denied_before {
        return Ok(Some(crate::authz::predict::Outcome::Retried));
    }
    let outcome = state.prediction.predict(question, now).await;
    if let crate::authz::predict::Outcome::Failed(why) = &outcome {
        // The call asks a person; the operator should still hear of it.
        tracing::warn!(reason = %why, "a prediction failed: a person decides");
        state.metrics.prediction_failed();
    }
    Ok(Some(outcome))
}

/// Remember that this call was denied by prediction, so that its retry is
/// held for a person.
pub async fn remember_denial(
    state: &State,
    key: &crate::store::model::CallKey,
) -> Result<(), crate::store::StoreError> {
    let now = now_ms();
    let ttl = i64::try_from(state.config.approval_ttl.as_millis()).unwrap_or(i64::MAX);
    crate::store::timed(
        state.config.db_timeout,
        state
            .store
            .add_predicted_denial(key, now, now.saturating_sub(ttl)),
    )
    .await
}

/// Queue the webhook's notice of a new pending approval: its arguments
/// preview redacted of the connection's secrets before it is cut short
/// (a secret cut in half would not be recognised).
fn announce(state: &State, h: &Held, id: &str) {
    state.approvals.announce(|console_url| {
        let redactor = state
            .snapshot
            .load()
            .connections
            .get(&h.key.connection)
            .map(|c| c.upstream.redactor());
        let preview = h.shown.params.as_deref().map(|p| {
            let args = serde_json::from_str::<serde_json::Value>(p)
                .ok()
                .and_then(|v| v.get("arguments").map(ToString::to_string))
                .unwrap_or_else(|| p.to_string());
            let clean = match &redactor {
                Some(r) => r.text(&args).into_owned(),
                None => args,
            };
            let mut out: String = clean.chars().take(PREVIEW_CHARS).collect();
            if out.len() < clean.len() {
                out.push('…');
            }
            out
        });
        // What an agent chose (the tool's name, the method) is shown
        // redacted, cut short and inert: no credential, no chat markup (a
        // Slack `<!channel>` or disguised link), no control or direction
        // characters (found by the attack review).
        let tool = agent_text(&h.key.tool, redactor.as_deref());
        let method = agent_text(&h.key.rpc_method, redactor.as_deref());
        let what = if tool.is_empty() {
            method.clone()
        } else {
            format!("tool {tool}")
        };
        let short: String = h.key.connection.chars().take(8).collect();
        let mut text = format!(
            "tessera: {} asks to run {what} on connection {short} (approval {id}): tessera approval grant {id}",
            h.key.caller
        );
        if let Some(u) = &console_url {
            text.push_str(&format!(" or {u}"));
        }
        Notice {
            text,
            id: id.to_string(),
            caller: h.key.caller.clone(),
            connection: h.key.connection.clone(),
            rpc_method: method,
            tool,
            arguments_preview: preview,
            reason: h.reason.clone(),
            expires_at: now_ms()
                .saturating_add(i64::try_from(state.config.approval_ttl.as_millis()).unwrap_or(i64::MAX)),
            console_url,
        }
    });
}

/// The longest tool name or method a notice repeats, in characters.
const NAME_CHARS: usize = 120;

/// Text an agent chose, for a notice: the connection's secret redacted,
/// cut to [`NAME_CHARS`], shown printable (control, line and direction
/// characters escaped) and with `&`, `<`, `>` escaped as Slack's message
/// format asks (so `<!channel>` or `<url|label>` is text, not markup).
fn agent_text(s: &str, redactor: Option<&crate::redact::Redactor>) -> String {
    let clean = match redactor {
        Some(r) => r.text(s).into_owned(),
        None => s.to_string(),
    };
    let mut cut: String = clean.chars().take(NAME_CHARS).collect();
    if cut.len() < clean.len() {
        cut.push('…');
    }
    crate::telemetry::log::printable(&cut)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn agent_text_is_inert_in_a_notice() {
        let shown = super::agent_text("write <!channel> <https://evil|ok>\n\u{202e}x", None);
        assert!(
            !shown.contains('<') && !shown.contains('\n') && !shown.contains('\u{202e}'),
            "{shown}"
        );
        let long = "t".repeat(10_000);
        assert!(super::agent_text(&long, None).chars().count() <= super::NAME_CHARS + 1);
    }
}
