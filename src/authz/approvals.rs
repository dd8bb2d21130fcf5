//! Approvals: calls an `@ask` policy (or the external authorizer) holds for
//! a person.
//!
//! A held call is recorded once as a pending approval keyed by caller,
//! connection, JSON-RPC method, tool and a SHA-256 of the whole call as it
//! reaches the upstream ([`Call`]: sub-path, query string, the complete
//! canonical `params`, session), and the caller is told its id. A person
//! grants it (for a TTL, once unless more uses are given) or denies it
//! with `tessera approval grant|deny ID`. A retry of the *same* call then
//! finds the grant and goes through, using it up; any other call (other
//! arguments, another sub-path, query, `params` member or session
//! included) needs its own approval. A denial stands: the same call is
//! refused with the denial's id, and the record stays listed, so an agent
//! switching to something else leaves a visible trail of pending requests
//! rather than quietly getting its way.
//!
//! One caller may have at most `--max-pending-approvals` calls waiting; a
//! call that would wait beyond that is refused (429) before anything is
//! recorded, so a caller cannot bury the approvers' view.
//!
//! Only held calls touch the database here; allowed and denied requests
//! never do.

use std::sync::OnceLock;
use std::time::Duration;

use crate::crypto::keyring::{MasterKey, SecretString};
use crate::store::model::{CallKey, NewApproval, Sealed, Shown, Status};
use crate::store::{Store, StoreError};
use crate::telemetry::time::now_ms;

/// The default `--approval-ttl`: a pending approval nobody decided within
/// a day is stale.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

/// One held call of a request, to settle.
#[derive(Debug)]
pub struct Held {
    /// The key, its digest a [`call_digest`].
    pub key: CallKey,
    /// The digest this call had before calls were bound whole
    /// ([`arguments_digest`]), to find the rows recorded then.
    pub legacy_sha256: Option<String>,
    pub reason: Option<String>,
    /// What the approver is shown; `params` is the complete call, which is
    /// stored only sealed.
    pub shown: Shown,
    /// The connection's credential and the arguments' shape, kept with
    /// the approval so that a person's answer counts as evidence for
    /// approvals that learn.
    pub credential: Option<String>,
    pub shape: Option<String>,
}

/// What became of a held call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// A person granted this call; one use was taken.
    Granted(String),
    /// Waiting for a person.
    Pending(String),
    /// A person denied this call.
    Denied(String),
}

impl Settled {
    pub fn id(&self) -> &str {
        match self {
            Settled::Granted(id) | Settled::Pending(id) | Settled::Denied(id) => id,
        }
    }
}

/// Why held calls could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Recording the calls would leave the caller more pending approvals
    /// than `--max-pending-approvals`; nothing was recorded.
    #[error("the caller has {pending} pending approvals, at most {max} allowed")]
    TooManyPending { pending: i64, max: u32 },
}

/// How held calls are settled: where, with what key the calls are sealed,
/// the per-caller cap and how long a pending approval lives.
pub struct Settle<'a> {
    pub store: &'a Store,
    /// Seals each new approval's call (`None`: the call is not kept).
    pub key: Option<&'a MasterKey>,
    /// `--max-pending-approvals` (0: no limit).
    pub max_pending: u32,
    /// `--approval-ttl`.
    pub ttl: Duration,
}

/// What [`settle_with`] did: each call's outcome, and which of them are
/// new pending approvals (to announce).
#[derive(Debug)]
pub struct Outcome {
    pub settled: Vec<Settled>,
    pub new: Vec<usize>,
}

/// [`settle_with`] with a call kept unsealed-nowhere (no key) and the
/// default TTL: for tests and tools that only need the outcome.
pub async fn settle(
    store: &Store,
    held: &[Held],
    max_pending: u32,
) -> Result<Vec<Settled>, SettleError> {
    let s = Settle {
        store,
        key: None,
        max_pending,
        ttl: DEFAULT_TTL,
    };
    Ok(settle_with(&s, held).await?.settled)
}

/// Settle the held calls of one request. Grants are used only when every
/// held call has one (a batch goes through whole or not at all, and a
/// refused batch spends nothing); otherwise each call without a grant gets
/// its pending (or standing denied) record. New pending records are made
/// only when the caller would then have at most `max_pending` (0: no
/// limit); otherwise none is made and the request is refused. A new
/// record keeps the complete call sealed and expires after `ttl`.
pub async fn settle_with(s: &Settle<'_>, held: &[Held]) -> Result<Outcome, SettleError> {
    let store = s.store;
    let now = now_ms();
    let mut grants = Vec::with_capacity(held.len());
    for h in held {
        grants.push(store.live_grant(&h.key, now).await?);
    }
    if grants.iter().all(Option::is_some) {
        let mut out = Vec::with_capacity(held.len());
        let mut all_taken = true;
        for id in grants.iter().flatten() {
            all_taken &= store.take_grant(id, now).await?;
            out.push(Settled::Granted(id.clone()));
        }
        if all_taken {
            return Ok(Outcome {
                settled: out,
                new: Vec::new(),
            });
        }
        // A concurrent request used a grant up first: fall through and
        // record the call as held again.
        grants.iter_mut().for_each(|g| *g = None);
    }
    let mut out = Vec::with_capacity(held.len());
    let mut new = Vec::new();
    for (i, (h, grant)) in held.iter().zip(grants).enumerate() {
        if let Some(id) = grant {
            out.push(Some(Settled::Granted(id)));
            continue;
        }
        let open = match store.open_approval(&h.key, now).await? {
            Some(found) => Some(found),
            None => adopt_legacy(s, h, now).await?,
        };
        out.push(match open {
            Some((id, Status::Denied)) => Some(Settled::Denied(id)),
            Some((id, _)) => Some(Settled::Pending(id)),
            None => {
                new.push(i);
                None
            }
        });
    }
    if !new.is_empty() && s.max_pending > 0 {
        // Counted, then recorded: requests racing past the count can
        // overshoot by at most the caller's requests in flight.
        let pending = store
            .pending_approvals_of(&held[new[0]].key.caller, now)
            .await?;
        if pending + new.len() as i64 > i64::from(s.max_pending) {
            return Err(SettleError::TooManyPending {
                pending,
                max: s.max_pending,
            });
        }
    }
    let ttl = i64::try_from(s.ttl.as_millis()).unwrap_or(i64::MAX);
    let mut created = Vec::new();
    for &i in &new {
        let h = &held[i];
        let id = new_id();
        let mine = id.clone();
        let recorded = store
            .add_approval(&NewApproval {
                sealed_call: seal_call(s.key, &id, h.shown.params.as_deref()),
                id,
                created_at: now,
                expires_at: now.saturating_add(ttl),
                key: h.key.clone(),
                reason: h.reason.clone(),
                shown: h.shown.clone(),
                credential: h.credential.clone(),
                shape: h.shape.clone(),
            })
            .await?;
        // A concurrent request recorded the same call first: its approval
        // is this one's, and it was announced there (found by the attack
        // review: one approval, many notices).
        if recorded == mine {
            created.push(i);
        }
        out[i] = Some(Settled::Pending(recorded));
    }
    Ok(Outcome {
        settled: out.into_iter().flatten().collect(),
        new: created,
    })
}

/// The call's `params` sealed to the approval `id` ([`Sealed::Approval`]).
fn seal_call(key: Option<&MasterKey>, id: &str, params: Option<&str>) -> Option<Vec<u8>> {
    let (key, params) = (key?, params?);
    Some(key.seal(
        &Sealed::Approval.aad(id),
        &SecretString::from(params.to_string()),
    ))
}

/// The held call an approval keeps, opened: `None` when none was kept or
/// it does not open with `key` (another master key, a tampered row).
pub fn open_call(key: &MasterKey, a: &crate::store::model::Approval) -> Option<String> {
    use crate::crypto::keyring::ExposeSecret;
    let sealed = a.sealed_call.as_deref()?;
    key.open(&Sealed::Approval.aad(&a.id), sealed)
        .ok()
        .map(|s| s.expose_secret().to_string())
}

/// Fill in what an approver is shown from the sealed call: `params` (the
/// complete call) and `arguments` (its `arguments` member, for a tool
/// call), whatever `--audit-arguments` said. With `redactor` (the
/// connection's, from the snapshot), the connection's credential is
/// redacted from both, as from anything else tessera answers (an agent
/// that somehow learnt it cannot show it to the approver's screen either).
pub fn reveal(
    key: Option<&MasterKey>,
    redactor: Option<&crate::redact::Redactor>,
    a: &mut crate::store::model::Approval,
) {
    if let Some(params) = key.and_then(|k| open_call(k, a)) {
        if let Ok(serde_json::Value::Object(m)) = serde_json::from_str(&params) {
            if let Some(args) = m.get("arguments") {
                a.arguments = Some(args.to_string());
            }
        }
        a.shown.params = Some(params);
    }
    if let Some(r) = redactor {
        // What the agent chose besides the params too: the tool's name,
        // the sub-path and the query (found by the attack review).
        let chosen = [
            &mut a.shown.params,
            &mut a.arguments,
            &mut a.shown.sub_path,
            &mut a.shown.query,
            &mut a.shape,
        ];
        for text in chosen.into_iter().flatten().chain([&mut a.key.tool]) {
            if let std::borrow::Cow::Owned(clean) = r.text(text) {
                *text = clean;
            }
        }
    }
}

/// The record of this call made before calls were bound whole, found by
/// its old key. A denial stands as it was. A pending request is adopted:
/// rebound to this call's whole key (same id, so a person looking at it
/// decides the call that is now waiting, with its sub-path, query and
/// session shown). A grant made then is not used: it was given for any
/// sub-path, query and session, and for every number its arguments
/// rounded to, which is what this binding ends; the call waits anew.
async fn adopt_legacy(
    s: &Settle<'_>,
    h: &Held,
    now: i64,
) -> Result<Option<(String, Status)>, StoreError> {
    let store = s.store;
    let Some(legacy) = &h.legacy_sha256 else {
        return Ok(None);
    };
    let old = CallKey {
        arguments_sha256: legacy.clone(),
        ..h.key.clone()
    };
    match store.open_approval(&old, now).await? {
        Some((id, Status::Pending)) => {
            let sealed = seal_call(s.key, &id, h.shown.params.as_deref());
            let shown = Shown {
                params: None,
                ..h.shown.clone()
            };
            if store
                .rebind_approval(&id, &old, &h.key, &shown, sealed.as_deref())
                .await?
            {
                return Ok(Some((id, Status::Pending)));
            }
            // Adopted by a concurrent request (for this call or another):
            // whatever holds this call now is found by its own key.
            store.open_approval(&h.key, now).await
        }
        other => Ok(other),
    }
}

/// The serving process's side of approvals: held calls that wait for a
/// decision (`--approval-wait-ms`) and announcements of new pending
/// approvals (`--approval-webhook`).
pub struct Hub {
    /// The data revision of the snapshot in force: it moves when the
    /// store changed, a decision on any replica included (each decision
    /// moves the revision; Postgres notifies every replica at once, and
    /// the `--refresh-ms` poll catches the rest).
    changes: tokio::sync::watch::Receiver<i64>,
    webhook: Option<tokio::sync::mpsc::Sender<Notice>>,
    /// Deliveries: (delivered, given up), for tests and operators.
    delivered: tokio::sync::watch::Sender<(u64, u64)>,
    /// The console's address, once the admin listener is up.
    console: OnceLock<String>,
}

/// New pending approvals queued for the webhook before more are dropped
/// (a request never waits for a notification).
const WEBHOOK_QUEUE: usize = 256;
/// Attempts per notification, the first included.
const WEBHOOK_TRIES: u32 = 5;
/// The first retry's delay; each next one doubles it.
const WEBHOOK_BACKOFF: Duration = Duration::from_millis(250);
/// How long one delivery attempt may take, connect to answer.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// The arguments preview's length in characters.
pub const PREVIEW_CHARS: usize = 200;

/// One new pending approval, as the webhook posts it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Notice {
    /// A one-line summary (Slack and compatible receivers show `text`).
    pub text: String,
    pub id: String,
    pub caller: String,
    pub connection: String,
    pub rpc_method: String,
    pub tool: String,
    /// The start of the call's arguments, with the connection's secrets
    /// redacted.
    pub arguments_preview: Option<String>,
    pub reason: Option<String>,
    /// Unix milliseconds: when it expires undecided.
    pub expires_at: i64,
    /// The console, when the admin listener is known.
    pub console_url: Option<String>,
}

impl Hub {
    /// A hub following `changes`; with a webhook URL, the task that
    /// delivers notices on `client` (whose egress rule applies).
    pub fn start(
        changes: tokio::sync::watch::Receiver<i64>,
        webhook: Option<url::Url>,
        client: &crate::upstream::pool::UpstreamClient,
    ) -> Hub {
        let (delivered, _) = tokio::sync::watch::channel((0, 0));
        let webhook = webhook.map(|url| {
            let (tx, rx) = tokio::sync::mpsc::channel(WEBHOOK_QUEUE);
            tokio::spawn(deliver(client.clone(), url, rx, delivered.clone()));
            tx
        });
        Hub {
            changes,
            webhook,
            delivered,
            console: OnceLock::new(),
        }
    }

    /// The admin listener is up at `addr`: notices link to its console.
    pub fn console_at(&self, addr: std::net::SocketAddr) {
        let _ = self.console.set(format!("http://{addr}/ui"));
    }

    /// The store's changes (its data revision), for a held call waiting
    /// on a decision.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.changes.clone()
    }

    /// Webhook deliveries so far: (delivered, given up).
    pub fn deliveries(&self) -> tokio::sync::watch::Receiver<(u64, u64)> {
        self.delivered.subscribe()
    }

    /// Queue a notice (built with the console's link, when known); a full
    /// queue drops it with a warning.
    pub fn announce(&self, notice: impl FnOnce(Option<String>) -> Notice) {
        let Some(tx) = &self.webhook else { return };
        if tx.try_send(notice(self.console.get().cloned())).is_err() {
            tracing::warn!("approval webhook queue full: a notification was dropped");
            self.delivered.send_modify(|d| d.1 += 1);
        }
    }
}

/// The webhook task: each notice posted as JSON, retried with exponential
/// back-off up to [`WEBHOOK_TRIES`] attempts, then given up (logged). A
/// 2xx answer is delivered.
async fn deliver(
    client: crate::upstream::pool::UpstreamClient,
    url: url::Url,
    mut rx: tokio::sync::mpsc::Receiver<Notice>,
    delivered: tokio::sync::watch::Sender<(u64, u64)>,
) {
    use bytes::Bytes;
    use http::{header, HeaderValue, Method, Request};
    let Ok(uri) = url.as_str().parse::<http::Uri>() else {
        tracing::error!("the approval webhook URL is not a valid URI");
        return;
    };
    let host = uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .unwrap_or_else(|| HeaderValue::from_static(""));
    while let Some(n) = rx.recv().await {
        let body = Bytes::from(serde_json::to_vec(&n).expect("a notice serializes"));
        let mut ok = false;
        for attempt in 0..WEBHOOK_TRIES {
            if attempt > 0 {
                tokio::time::sleep(WEBHOOK_BACKOFF * 2u32.pow(attempt - 1)).await;
            }
            let mut r = Request::new(body.clone());
            *r.method_mut() = Method::POST;
            *r.uri_mut() = uri.clone();
            let h = r.headers_mut();
            h.insert(header::HOST, host.clone());
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            // One receiver that never answers must not hold every later
            // notice: an attempt has a deadline (found by the attack review).
            let sent = tokio::time::timeout(
                WEBHOOK_TIMEOUT,
                client.exchange(r, "approval-webhook", 64 * 1024),
            )
            .await;
            match sent {
                Err(_) => {
                    tracing::warn!(approval = %n.id, attempt, "approval webhook did not answer within {} s", WEBHOOK_TIMEOUT.as_secs())
                }
                Ok(Ok(x)) if x.status.is_success() => {
                    ok = true;
                    break;
                }
                Ok(Ok(x)) => {
                    tracing::warn!(approval = %n.id, status = x.status.as_u16(), attempt, "approval webhook refused the notification")
                }
                Ok(Err(e)) => {
                    tracing::warn!(approval = %n.id, error = %e, attempt, "approval webhook unreachable")
                }
            }
        }
        if !ok {
            tracing::warn!(approval = %n.id, "approval webhook: gave up after {WEBHOOK_TRIES} attempts");
        }
        delivered.send_modify(|d| if ok { d.0 += 1 } else { d.1 += 1 });
    }
}

/// A new approval id: `ap_` and 60 random bits, short enough to type.
pub fn new_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
    let mut rng = rand::rngs::OsRng;
    let mut s = String::from("ap_");
    for _ in 0..12 {
        s.push(char::from(ALPHABET[rng.gen_range(0..32)]));
    }
    s
}

/// What a held call is bound to besides caller, connection, method and
/// tool: the whole call as it reaches the upstream.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The normalized sub-path (what is forwarded).
    pub sub_path: &'a str,
    /// The query string as sent (`None`: no `?`).
    pub query: Option<&'a str>,
    /// The message's `params` as sent (`None`: absent or `null`).
    pub params: Option<&'a str>,
    /// Each `Mcp-Session-Id` value the caller sent, in order.
    pub session: &'a [&'a [u8]],
}

/// The version prefix of a [`call_digest`]. A digest without one is the
/// arguments-only key of the first version ([`arguments_digest`]).
pub const DIGEST_VERSION: &str = "v2:";

/// Members of `params._meta` that clients set anew on every request and
/// that cannot change what a call does: MCP's `progressToken` (which
/// progress notifications to send) and W3C trace context. Were they bound,
/// no retry of a granted call would ever match its grant.
pub const VOLATILE_META: [&str; 3] = ["progressToken", "traceparent", "tracestate"];

/// The key of a held call: `v2:` and the SHA-256 (hex) of the JSON array
/// `[sub_path, query, session, params]`, where `session` is the array of
/// `Mcp-Session-Id` values (each a string, or an array of its bytes when
/// not UTF-8) and `params` is canonical ([`canonical_params`]). Every part
/// is written as JSON, so no two calls share one text.
pub fn call_digest(call: &Call<'_>) -> String {
    let mut text = String::from("[");
    write_json_string(call.sub_path, &mut text);
    text.push(',');
    match call.query {
        Some(q) => write_json_string(q, &mut text),
        None => text.push_str("null"),
    }
    text.push(',');
    text.push_str(&session_json(call.session));
    text.push(',');
    match call.params {
        Some(p) => text.push_str(&canonical_params(p)),
        None => text.push_str("null"),
    }
    text.push(']');
    format!(
        "{DIGEST_VERSION}{}",
        crate::crypto::tokens::sha256_hex(text.as_bytes())
    )
}

/// What the approver is shown of `call`: its `params` as sent (kept only
/// sealed: [`settle_with`]), whatever `--audit-arguments` says.
pub fn shown(call: &Call<'_>) -> Shown {
    Shown {
        sub_path: Some(call.sub_path.to_string()),
        query: call.query.map(str::to_string),
        session: Some(session_fingerprint(call.session)),
        params: call.params.map(str::to_string),
    }
}

/// A short fingerprint of the session values (`""` with none): enough to
/// tell sessions apart, never the id itself.
pub fn session_fingerprint(session: &[&[u8]]) -> String {
    if session.is_empty() {
        return String::new();
    }
    crate::crypto::tokens::sha256_hex(session_json(session).as_bytes())[..12].to_string()
}

fn session_json(session: &[&[u8]]) -> String {
    let values: Vec<serde_json::Value> = session
        .iter()
        .map(|v| match std::str::from_utf8(v) {
            Ok(s) => serde_json::Value::from(s),
            Err(_) => serde_json::Value::from(v.to_vec()),
        })
        .collect();
    serde_json::Value::from(values).to_string()
}

fn write_json_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

/// The canonical text of a message's `params` ([`crate::authz::canonical`]:
/// members sorted, escapes undone, numbers as written, never through
/// `f64`), without the [`VOLATILE_META`] members of `_meta` (and without
/// `_meta` when nothing else is in it). Every other member counts: an
/// extra member is another call. `params` that have no canonical form
/// (members equal ignoring case deeper than tessera reads, say) are
/// keyed by their exact text, marked so that it is never a canonical one:
/// only the same bytes are the same call.
pub fn canonical_params(params: &str) -> String {
    use serde_json::value::RawValue;
    use std::borrow::Cow;
    use std::collections::BTreeMap;
    type Members<'a> = BTreeMap<String, &'a RawValue>;
    let exact = || format!("raw:{params}");
    let Ok(members) = serde_json::from_str::<Members>(params) else {
        return exact();
    };
    let mut text = String::from("{");
    for (k, v) in &members {
        let meta = (k == "_meta")
            .then(|| serde_json::from_str::<Members>(v.get()).ok())
            .flatten();
        let value = match meta {
            Some(mut meta) => {
                meta.retain(|k, _| !VOLATILE_META.contains(&k.as_str()));
                if meta.is_empty() {
                    continue;
                }
                Cow::Owned(object_text(meta.iter().map(|(k, v)| (k, v.get()))))
            }
            None => Cow::Borrowed(v.get()),
        };
        if text.len() > 1 {
            text.push(',');
        }
        write_json_string(k, &mut text);
        text.push(':');
        text.push_str(&value);
    }
    text.push('}');
    crate::authz::canonical::canonical(&text).unwrap_or_else(|_| exact())
}

fn object_text<'a>(members: impl Iterator<Item = (&'a String, &'a str)>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(k, &mut out);
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    out
}

/// The `params` of each message of a POST body (one, or a batch), as
/// sent, for the held calls among them. `None` where the body cannot be
/// read so (not reached: it was read before); the caller then binds the
/// whole body.
pub fn params_of(body: &[u8]) -> Option<Vec<Option<&str>>> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow, default)]
        params: Option<&'a RawValue>,
    }
    let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
    let messages: Vec<Message> = if *first == b'[' {
        serde_json::from_slice(body).ok()?
    } else {
        vec![serde_json::from_slice(body).ok()?]
    };
    Some(
        messages
            .into_iter()
            .map(|m| m.params.map(RawValue::get))
            .collect(),
    )
}

/// The first version's key: the SHA-256 (hex) of a tool's arguments in
/// canonical form through `serde_json::Value` (which rounds numbers to
/// `f64`), without a version prefix. Kept only to find the pending
/// approvals recorded under it ([`settle`]); new ones use [`call_digest`].
pub fn arguments_digest(arguments: Option<&str>) -> String {
    let Some(text) = arguments else {
        return String::new();
    };
    let canonical = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => {
            let mut out = String::with_capacity(text.len());
            canonical(&v, &mut out);
            out
        }
        // Not reachable for a peeked body (its arguments parsed as JSON);
        // the raw text is still a faithful key.
        Err(_) => text.to_string(),
    };
    crate::crypto::tokens::sha256_hex(canonical.as_bytes())
}

fn canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut entries: Vec<_> = m.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ignores_spacing_and_key_order() {
        let a = arguments_digest(Some(r#"{"b":[1,{"y":2,"x":"s"}],"a":null}"#));
        let b = arguments_digest(Some(r#"{ "a" : null, "b" : [ 1, { "x": "s", "y": 2 } ] }"#));
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert_ne!(
            a,
            arguments_digest(Some(r#"{"a":null,"b":[1,{"x":"s","y":3}]}"#))
        );
        assert_eq!(arguments_digest(None), "");
        // Escapes are normalised too.
        assert_eq!(
            arguments_digest(Some(r#"{"k":"\u0061"}"#)),
            arguments_digest(Some(r#"{"k":"a"}"#))
        );
    }

    fn digest(sub_path: &str, query: Option<&str>, params: &str, session: &[&[u8]]) -> String {
        call_digest(&Call {
            sub_path,
            query,
            params: Some(params),
            session,
        })
    }

    #[test]
    fn the_call_key_binds_the_whole_call() {
        let base = r#"{"name":"write_file","arguments":{"path":"notes.txt"}}"#;
        let a = digest("", None, base, &[b"s1"]);
        assert!(a.starts_with(DIGEST_VERSION) && a.len() == 3 + 64, "{a}");
        // Spacing, member order and escapes are not part of the call; a
        // progress token or trace context is not either.
        for same in [
            r#"{ "arguments" : { "path" : "notes.txt" }, "name" : "write_file" }"#,
            r#"{"name":"write\u005ffile","arguments":{"path":"notes.txt"}}"#,
            r#"{"name":"write_file","arguments":{"path":"notes.txt"},"_meta":{"progressToken":7}}"#,
            r#"{"name":"write_file","arguments":{"path":"notes.txt"},"_meta":{"traceparent":"00-1"}}"#,
        ] {
            assert_eq!(digest("", None, same, &[b"s1"]), a, "{same}");
        }
        // Everything else is.
        for (other, why) in [
            (digest("/x", None, base, &[b"s1"]), "sub-path"),
            (digest("", Some(""), base, &[b"s1"]), "an empty query"),
            (digest("", Some("a=1"), base, &[b"s1"]), "a query"),
            (digest("", None, base, &[b"s2"]), "another session"),
            (digest("", None, base, &[]), "no session"),
            (digest("", None, base, &[b"s1", b"s2"]), "two sessions"),
            (digest("", None, base, &[b"s1\xff"]), "a non-UTF-8 session"),
            (
                digest(
                    "",
                    None,
                    r#"{"name":"write_file","arguments":{"path":"notes.txt"},"x":1}"#,
                    &[b"s1"],
                ),
                "an extra params member",
            ),
            (
                digest(
                    "",
                    None,
                    r#"{"name":"write_file","arguments":{"path":"notes.txt"},"_meta":{"x":1}}"#,
                    &[b"s1"],
                ),
                "a _meta member that is not volatile",
            ),
        ] {
            assert_ne!(other, a, "{why}");
        }
        // Parts cannot run into each other.
        assert_ne!(
            digest("/a", Some("b"), "{}", &[]),
            digest("/a?b", None, "{}", &[])
        );
    }

    #[test]
    fn numbers_keep_every_digit() {
        let key = |n: &str| {
            digest(
                "",
                None,
                &format!(r#"{{"arguments":{{"amount":{n}}}}}"#),
                &[],
            )
        };
        let big = key("1000000000000000000000");
        assert_ne!(big, key("1000000000000000000001"));
        assert_ne!(key("0.1"), key("0.10000000000000001"));
        // The first version's key made them one.
        assert_eq!(
            arguments_digest(Some(r#"{"amount":1000000000000000000000}"#)),
            arguments_digest(Some(r#"{"amount":1000000000000000000001}"#))
        );
    }

    #[test]
    fn params_are_read_per_message() {
        let one = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1}}"#;
        assert_eq!(params_of(one), Some(vec![Some(r#"{"a":1}"#)]));
        let batch = br#" [{"jsonrpc":"2.0","method":"x"},{"params":null},{"params":{"b":[2]}}]"#;
        assert_eq!(
            params_of(batch),
            Some(vec![None, None, Some(r#"{"b":[2]}"#)])
        );
        // What has no canonical form is keyed by its exact text.
        assert_eq!(
            canonical_params(r#"{"a":{"k":1,"K":2}}"#),
            r#"raw:{"a":{"k":1,"K":2}}"#
        );
        assert_eq!(
            canonical_params(r#"{"_meta":{"progressToken":1},"b":2,"a":1}"#),
            r#"{"a":1,"b":2}"#
        );
        assert_eq!(session_fingerprint(&[]), "");
        assert_eq!(session_fingerprint(&[b"s"]).len(), 12);
    }

    #[test]
    fn ids_are_distinct_and_typable() {
        let a = new_id();
        assert!(a.starts_with("ap_") && a.len() == 15);
        assert!(a[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(a, new_id());
    }
}
