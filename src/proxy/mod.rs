//! The data-plane request handler: one linear function through the stages
//! route → check origin/host → authenticate → authorize → forward → filter.
//! Each stage passes the request on or returns early through `?`; one place
//! turns the error into the response and one access-log event is written at
//! the end, errors included.

pub mod announced;
pub mod authn;
pub mod body;
pub mod error;
pub mod forward;
pub mod held;

/// The longest tool name forwarded: eight times what the MCP specification
/// recommends (128 characters), so that no real tool is refused.
const MAX_TOOL_NAME_BYTES: usize = 1024;
/// The longest JSON-RPC method name forwarded: MCP's are under 40 bytes.
const MAX_METHOD_BYTES: usize = 256;
pub mod jsonrpc;
pub mod legacy_sse;
pub mod listener;
pub mod origin;
pub mod path;
pub mod raw_head;
pub mod response;
pub mod route;
pub mod session;
pub mod shape;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use compact_str::CompactString;
use http::{header, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::authz::approvals::{self, arguments_digest, Held, Settled};
use crate::authz::{AuthzRequest, Verdict};
use crate::crypto::tokens::sha256_hex;
use crate::limits::Refusal;
use crate::model::Auth;
use crate::proxy::authn::{authenticate, connection_for};
use crate::proxy::error::{ProxyError, TooMany};
use crate::proxy::forward::{upstream_request, upstream_uri};
use crate::proxy::jsonrpc::peek;
use crate::proxy::response::body::{Metered, ProxyBody};
use crate::proxy::response::headers::{
    credential_rejected, filter_response_headers, host_is_tessera, keep_locations_within_upstream,
};
use crate::proxy::response::tool_list::ToolFilter;
use crate::proxy::route::route;
use crate::state::State;
use crate::store::model::{AuditRecord, CallKey};
use crate::telemetry::metrics::Reason;
use crate::telemetry::trace;
use crate::telemetry::traceparent::{RequestId, X_REQUEST_ID};
use crate::wire::headers::MCP_PROTOCOL_VERSION;

/// What the access log records of one request. Never a secret: the
/// connection id is shortened, tokens and credential values never enter.
struct Access {
    /// The request's id (`crate::telemetry::traceparent`): in the access
    /// line, every audit row, `X-Request-Id` and a refusal's body. 32
    /// bytes inline, copied rather than allocated.
    request_id: RequestId,
    caller: Option<Arc<crate::model::Caller>>,
    // Short strings are kept inline (no allocation per request for the
    // usual method and tool names).
    connection: Option<CompactString>,
    rpc_method: Option<CompactString>,
    tool: Option<CompactString>,
    reason: Option<Reason>,
    /// The raw JSON id, to answer a refusal with it.
    id: Option<CompactString>,
    /// The full connection id, for the audit trail.
    connection_id: Option<String>,
    /// Each authorization decision made, for the audit trail.
    decisions: Vec<Decided>,
    /// The caller speaks a revision whose results carry `resultType`.
    result_type: bool,
    /// A POST to an endpoint a 2024-11-05 server announced: its answer
    /// travels on the GET stream, and the client reads only the status
    /// of this one.
    legacy: bool,
}

impl Access {
    fn new(request_id: RequestId) -> Access {
        Access {
            request_id,
            caller: None,
            connection: None,
            rpc_method: None,
            tool: None,
            reason: None,
            id: None,
            connection_id: None,
            decisions: Vec::new(),
            result_type: false,
            legacy: false,
        }
    }
}

/// One decision, kept until the response status is known.
struct Decided {
    rpc_method: Option<String>,
    /// The policy action (`tools/call`, `stream/open`, …).
    action: &'static str,
    tool: Option<String>,
    verdict: Verdict,
    /// What became of a call held for approval.
    settled: Option<Settled>,
    arguments_sha256: Option<String>,
    /// For a held call: the key it is bound to and what the approver is
    /// shown of it (set by [`bind_held`]).
    call_sha256: Option<String>,
    shown: crate::store::model::Shown,
    /// For a held call: its key before calls were bound whole, to find
    /// approvals recorded then.
    legacy_sha256: Option<String>,
    arguments: Option<String>,
    /// For a held call: its arguments' shape (names and JSON types), kept
    /// with its approval as evidence for approvals that learn.
    shape: Option<String>,
    /// For a call an `@ask("learn")` permit holds: what the prediction
    /// did, and why (redacted), when one was made.
    predicted: Option<(crate::authz::predict::Action, String)>,
    /// For a call tool pinning refused: where its tool stands.
    pinned: Option<crate::authz::pins::PinStatus>,
}

/// Handle one request to the data plane.
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
    peer: std::net::IpAddr,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let method = req.method().clone();
    // The request's span (with traces on) and id, continuing the caller's
    // trace context; every span the stages start is its child. The id
    // first, so that every answer carries it, refusals included: the
    // caller's trace id when it sent a valid `traceparent` (its choice, so
    // not unique across callers), else the new trace's.
    let (request_id, span) = trace::start_request(span_name(&method), req.headers());
    let mut access = Access::new(request_id);
    let mut resp = match span.run(proxy(&state, req, peer, &mut access)).await {
        Ok(r) => r,
        Err(e) => {
            access.reason = Some(e.reason());
            // The id was valid JSON when read; a refusal is rare enough to
            // re-wrap it here rather than keep a heap copy per request.
            let id = access
                .id
                .as_deref()
                .and_then(|s| serde_json::value::RawValue::from_string(s.to_owned()).ok());
            // The error's text may quote an upstream (a TLS peer's names):
            // it is redacted like the upstream's own answer.
            let redactor = access.connection_id.as_deref().and_then(|c| {
                state
                    .snapshot
                    .load()
                    .connections
                    .get(c)
                    .map(|c| c.upstream.redactor())
            });
            let mut resp = e.into_response(
                id.as_deref(),
                redactor.as_deref(),
                access.result_type,
                &access.request_id,
            );
            // The 2024-11-05 client reads its answers on the GET stream and
            // drops a 2xx POST answer unread: a refusal written as a tool
            // result would never reach it, and its call would wait out
            // its timeout. An error status fails the call with the text.
            if access.legacy && resp.status().is_success() {
                *resp.status_mut() = http::StatusCode::FORBIDDEN;
            }
            resp
        }
    };
    // Inserted over whatever the upstream sent: one `X-Request-Id`, and
    // it is tessera's (an upstream's own id would name another request).
    resp.headers_mut()
        .insert(X_REQUEST_ID, access.request_id.header_value());
    let elapsed = started.elapsed();
    tracing::info!(
        target: "tessera::access",
        request_id = access.request_id.as_str(),
        caller = access.caller.as_ref().map(|c| c.name.as_str()),
        connection = access.connection.as_deref(),
        http_method = method.as_str(),
        rpc_method = access.rpc_method.as_deref(),
        tool = access.tool.as_deref(),
        verdict = if access.reason.is_some() { "refused" } else { "forwarded" },
        reason = access.reason.map(Reason::as_str),
        status = resp.status().as_u16(),
        micros = elapsed.as_micros() as u64,
    );
    let outcome = match access.reason {
        Some(_) => crate::telemetry::metrics::Outcome::Refused,
        None => crate::telemetry::metrics::Outcome::Forwarded,
    };
    state
        .metrics
        .request(outcome, resp.status().as_u16(), access.reason);
    state.metrics.request_duration(elapsed);
    if span.is_on() {
        request_span_attributes(&span, &access, &method, resp.status());
    }
    drop(span);
    audit(&state, access, &method, resp.status().as_u16(), started).await;
    resp
}

/// A request span's name: the method and the route's template (the
/// address is a capability, never a span's name).
fn span_name(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "POST /c/{address}",
        http::Method::GET => "GET /c/{address}",
        http::Method::DELETE => "DELETE /c/{address}",
        _ => "HTTP",
    }
}

/// What a request's span tells of it once answered: as the access line,
/// never a token, a secret or an argument (the tool's name is redacted as
/// it is there, and the address is shortened).
fn request_span_attributes(
    span: &trace::Span,
    access: &Access,
    method: &http::Method,
    status: http::StatusCode,
) {
    use opentelemetry::KeyValue;
    span.set(|| {
        let mut a = vec![
            KeyValue::new("http.request.method", method.as_str().to_string()),
            KeyValue::new("http.route", "/c/{address}"),
            KeyValue::new("http.response.status_code", i64::from(status.as_u16())),
            KeyValue::new(
                "tessera.verdict",
                if access.reason.is_some() {
                    "refused"
                } else {
                    "forwarded"
                },
            ),
        ];
        let text = |k: &'static str, v: Option<&str>| v.map(|v| KeyValue::new(k, v.to_string()));
        a.extend(
            [
                text(
                    "tessera.caller",
                    access.caller.as_ref().map(|c| c.name.as_str()),
                ),
                text("tessera.connection", access.connection.as_deref()),
                text("mcp.method.name", access.rpc_method.as_deref()),
                text("gen_ai.tool.name", access.tool.as_deref()),
                text("tessera.reason", access.reason.map(Reason::as_str)),
            ]
            .into_iter()
            .flatten(),
        );
        a
    });
    if status.is_server_error() {
        span.error(|| format!("answered {}", status.as_u16()));
    }
}

/// Queue one audit record per decision made (none for requests refused
/// before authorization: those are in the access log).
async fn audit(
    state: &State,
    access: Access,
    method: &http::Method,
    status: u16,
    started: Instant,
) {
    let (Some(caller), Some(connection)) = (access.caller, access.connection_id) else {
        return;
    };
    let at = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let duration_us = started.elapsed().as_micros() as i64;
    for d in access.decisions {
        let (verdict, reason) = d.audited();
        state.metrics.decision(d.counted());
        state
            .audit
            .record(AuditRecord {
                id: 0,
                at,
                caller: caller.name.clone(),
                connection: connection.clone(),
                http_method: method.as_str().to_string(),
                rpc_method: d.rpc_method,
                tool: d.tool,
                verdict: verdict.to_string(),
                reason,
                arguments_sha256: d.arguments_sha256,
                arguments: d.arguments,
                status,
                duration_us,
                request_id: Some(access.request_id.as_str().to_string()),
            })
            .await;
    }
}

async fn proxy(
    state: &Arc<State>,
    req: Request<Incoming>,
    peer: std::net::IpAddr,
    access: &mut Access,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let limits = &state.config.limits;

    // The request's shape before anything else: no lookup is spent on an
    // oversized or ambiguous request.
    shape::check_shape(&parts, limits)?;

    // Route first: a wrong method or a path that is not an address is
    // refused before anything is loaded. So is a sub-path a server could
    // read otherwise than tessera (`route::normalize_sub_path`), and a
    // query that carries a credential: alike for every address, so
    // neither tells an unauthenticated caller whether an address exists.
    // Routed on a copy of the target (reference-counted, not copied), so
    // the route outlives the request's parts moving on to the upstream.
    let target = parts.uri.clone();
    let r = route(&parts.method, target.path())?;
    shape::refuse_credential_query(parts.uri.query())?;

    // Origin and Host before authentication: a DNS-rebound browser request
    // is refused whatever credentials it carries.
    state.check_origin_and_host(&parts.headers, &parts.uri)?;

    // Authenticate against the snapshot (no I/O), then resolve the address
    // as this caller's; someone else's address is as unknown as a random one.
    let snap = state.snapshot.load();
    let caller = authenticate(&snap, &parts.headers).map_err(|e| {
        // Failures are counted per source and per address presented,
        // whether the address exists or not: were only existing addresses
        // counted, their 429s would tell a stranger which ones exist. In
        // a back-off they are answered 429. A valid token is never held.
        match state
            .auth_throttle
            .failed(peer, Some(r.connection_id), Instant::now())
        {
            Some(s) => ProxyError::TooMany(TooMany::FailedAuth, s),
            None => e,
        }
    })?;
    access.caller = Some(caller.clone());
    // The caller's limits, before its body is read: a caller over them
    // costs no more than this.
    let admitted = caller
        .usage
        .admit(&limits.caller, Instant::now())
        .map_err(|refused| match refused {
            Refusal::InFlight { retry_after_s } => {
                ProxyError::TooMany(TooMany::InFlight, retry_after_s)
            }
            Refusal::Rate { retry_after_s } => ProxyError::TooMany(TooMany::Rate, retry_after_s),
        })?;
    let conn = connection_for(&snap, &caller, r.connection_id)?;
    access.connection = Some(r.connection_id.chars().take(8).collect());
    access.connection_id = Some(r.connection_id.to_string());
    let upstream = conn.upstream.clone();
    // A session goes on only for the caller and connection that opened it
    // (`crate::proxy::session`): anyone else's session id is unknown here.
    let owner = session::Owner {
        caller_id: caller.id,
        caller: &caller.name,
        connection: r.connection_id,
    };
    session::for_upstream(state.master_key(), owner, &mut parts.headers)?;
    // A POST to an endpoint a 2024-11-05 server announced on its stream
    // goes to the path it announced, if it announced it to this caller
    // (`crate::proxy::legacy_sse`); checked before the body is read.
    let announced = announced::upstream_uri(
        state.master_key(),
        owner,
        &parts.method,
        &upstream.url,
        &r.sub_path,
        parts.uri.query(),
    )?;
    access.legacy = announced.is_some();

    // A POST body is one bounded JSON-RPC message (or a 2025-03-26 batch):
    // read it once, inspect it, forward that same buffer. Its bytes are
    // reserved from the body memory of all requests until this returns.
    let (body, _body_memory) = tokio::time::timeout(
        limits.body_timeout,
        body::read_bounded(
            &parts.headers,
            body,
            state.config.max_body_bytes,
            &state.body_memory,
        ),
    )
    .await
    .map_err(|_| ProxyError::RequestTimeout(limits.body_timeout.as_millis() as u64))??;
    state.metrics.bytes_in(body.len());
    let peeked = if parts.method == http::Method::POST {
        Some(peek(&body)?)
    } else {
        None
    };
    access.id = peeked
        .as_ref()
        .and_then(|p| p.id())
        .map(|id| CompactString::from(id.get()));
    let version_header = parts
        .headers
        .get(MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok());
    access.result_type = version_header
        .or_else(|| peeked.as_ref()?.messages().first()?.protocol_version())
        .is_some_and(jsonrpc::results_carry_type);
    // The routing headers (2026-07-28) say what the body says, or the
    // request goes no further: the upstream must not be told two calls.
    jsonrpc::check_routing_headers(&parts.headers, peeked.as_ref())?;

    // Authorize every message of the body (or the bare GET/DELETE) before
    // anything reaches the upstream; one refusal refuses the whole body.
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let mut ask = AuthzRequest {
        caller: &caller,
        connection_id: r.connection_id,
        connection: conn,
        entities: &snap.entities,
        revision: snap.revision,
        http_method: &parts.method,
        // A POST to an announced endpoint: the path the upstream announced
        // (on its origin), not the tag that vouches for it, so that a
        // policy on paths reads what the upstream is sent.
        path: announced.as_ref().map_or(&r.sub_path[..], |u| u.path()),
        rpc_method: None,
        tool: None,
        arguments: None,
        protocol_version: version_header,
        origin: header("origin"),
        time: SystemTime::now(),
    };
    let messages = peeked.as_ref().map(|p| p.messages()).unwrap_or_default();
    if messages.len() > limits.max_batch {
        return Err(ProxyError::InvalidRequest(
            "the JSON-RPC batch holds more messages than tessera accepts (--max-batch)",
        ));
    }
    // A method's name is the agent's to choose too: JSON-RPC names are
    // short, and one far longer would be written into the access line,
    // the audit trail and a span (found by the attack review).
    if messages.iter().any(|m| {
        m.method
            .as_deref()
            .is_some_and(|m| m.len() > MAX_METHOD_BYTES)
    }) {
        return Err(ProxyError::InvalidRequest(
            "the JSON-RPC method name is longer than tessera accepts (256 bytes)",
        ));
    }
    if let Some(first) = messages.first() {
        access.rpc_method = first
            .method
            .as_deref()
            .map(|m| CompactString::from(written_method(&upstream, m).as_ref()));
        // The tool's name is the agent's to choose: logged with the
        // connection's secret redacted, like anything else tessera writes.
        access.tool = first
            .tool()
            .map(|t| CompactString::from(upstream.redactor().text(t).as_ref()));
    }
    if messages.is_empty() {
        let v = verdict(state, &ask).await;
        access.decisions.push(Decided::new(state, &ask, v));
    }
    for m in messages {
        ask.rpc_method = m.method.as_deref();
        ask.tool = m.tool();
        // MCP names a tool in at most 128 characters; a name far longer is
        // no tool, and would be written into every record of the call (the
        // audit trail, a held call's approval, its notice).
        if ask.tool.is_some_and(|t| t.len() > MAX_TOOL_NAME_BYTES) {
            return Err(ProxyError::InvalidRequest(
                "the tool name is longer than tessera accepts (1,024 bytes)",
            ));
        }
        ask.arguments = m.arguments();
        ask.protocol_version = version_header.or_else(|| m.protocol_version());
        // Tool pinning before authorization: a tool whose definition is
        // not the pinned one is held whatever the policies say, and its
        // refusal is audited as pinning's (`crate::authz::pins`).
        if let Some(status) = ask
            .tool
            .and_then(|t| state.pins.refuses_call(&snap.pins, &upstream.credential, t))
        {
            let mut d = Decided::new(state, &ask, Verdict::Deny(Default::default()));
            d.pinned = Some(status);
            access.decisions.push(d);
            return Err(ProxyError::ToolPinned {
                tool: ask.tool.unwrap_or_default().to_string(),
                connection: r.connection_id.chars().take(8).collect(),
                status,
                lone: messages.len() == 1,
            });
        }
        let v = verdict(state, &ask).await;
        access.decisions.push(Decided::new(state, &ask, v));
    }
    // A tools/list answer is filtered to the tools this caller may call,
    // and so is every event of every SSE answer (below): a list can travel
    // on another request's stream.
    let lists = messages
        .iter()
        .any(|m| m.method.as_deref() == Some("tools/list"));
    let get_stream = parts.method == http::Method::GET;
    // The ids a POST's JSON answer may answer (`response::own_answers`).
    let sent = (parts.method == http::Method::POST && !lists).then(|| {
        // Requests' ids only: a client's own responses in a batch are
        // answered by nothing.
        response::own_answers::sent_ids(
            messages.iter().filter(|m| m.method.is_some()).map(|m| m.id),
        )
    });
    // What a filter built after the answer's head needs of the request
    // (reference-counted copies).
    let (list_version, list_origin) = (
        parts.headers.get(MCP_PROTOCOL_VERSION).cloned(),
        parts.headers.get(header::ORIGIN).cloned(),
    );
    drop(peeked);
    drop(snap);
    // A request whose decisions the audit trail cannot keep is not
    // forwarded (nor recorded: its refusal is in the access log).
    if !state.audit.has_room() {
        access.decisions.clear();
        return Err(ProxyError::AuditUnavailable);
    }
    bind_held(&mut access.decisions, &r.sub_path, &parts, &body);
    enforce(
        state,
        &caller,
        r.connection_id,
        &upstream,
        &mut access.decisions,
    )
    .await?;

    // Forward: strip, inject, send on the pooled client. An OAuth
    // credential's token is fetched first when none is fresh, and once more
    // when the upstream refuses it (401), the request then sent again.
    let uri = match announced {
        Some(uri) => uri,
        None => upstream_uri(&upstream, &r.sub_path, parts.uri.query())?,
    };
    // `--forwarded set`: tessera says who the caller is, truthfully.
    let forwarded = state
        .config
        .forwarded
        .then_some(forward::Forwarded { peer });
    let credential = || upstream.credential.clone();
    let (resp, redactor) = match &upstream.auth {
        Auth::Static(inj) => {
            let up_req = upstream_request(
                parts.method,
                uri,
                parts.headers,
                inj,
                body,
                state.config.allow_range,
                forwarded,
            );
            (
                forward::send(state, up_req, &upstream.credential).await?,
                inj.redactor.clone(),
            )
        }
        Auth::OAuth(source) => {
            let sent = forward::send_oauth(
                state,
                source,
                &upstream.credential,
                parts,
                (uri, forwarded),
                body,
            );
            Box::pin(sent).await?
        }
    };

    // Filter: an upstream challenge is never relayed; headers that would
    // let the caller act as the upstream's client are dropped; the body is
    // streamed through frame by frame.
    if credential_rejected(resp.status()) {
        return Err(ProxyError::CredentialRejected {
            credential: credential(),
            status: resp.status().as_u16(),
        });
    }
    let (mut parts, body) = resp.into_parts();
    // What is read (redaction, the tools/list filter) is the answer as the
    // caller will decode it: a content coding tessera asked not to get is
    // undone here, and the caller gets the answer uncoded. Before the
    // header filter: a `Connection: content-encoding` would have it drop
    // the coding's name and pass the coded bytes on unread (found by the
    // attack review).
    let codings = response::undo_codings(&mut parts).map_err(|e| {
        tracing::warn!(credential = %upstream.credential, error = %e, "an upstream answer tessera cannot decode");
        ProxyError::UpstreamEncoding {
            credential: credential(),
        }
    })?;
    filter_response_headers(&mut parts.headers);
    // The secret injected on this request never comes back, in headers or
    // body, in any form a client can decode (`crate::redact`).
    redactor.headers(&mut parts.headers);
    // Locations are judged as the caller will get them: after redaction
    // (found by fuzzing: a redacted host could no longer be parsed).
    if parts.headers.contains_key(header::LOCATION)
        || parts.headers.contains_key(header::CONTENT_LOCATION)
    {
        let listen = state.config.listen.ip();
        keep_locations_within_upstream(&mut parts.headers, &upstream.url, |h| {
            host_is_tessera(h, |name| state.is_own_host(name), listen)
        });
    }
    if let Some(connection) = access.connection_id.as_deref() {
        let owner = session::Owner {
            caller_id: caller.id,
            caller: &caller.name,
            connection,
        };
        session::for_caller(state.master_key(), owner, &mut parts.headers);
    }
    // Read as a client would (media types ignore letter case), so no
    // spelling of it streams past the filter below.
    // JavaScript's `trim()` also drops a no-break space (0xA0) and a
    // vertical tab (found by the attack review).
    let event_stream = parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        let blank = |b: &u8| b.is_ascii_whitespace() || matches!(b, 0x0b | 0xa0);
        let v = &v[v.iter().position(|b| !blank(b)).unwrap_or(v.len())..];
        v.get(..17)
            .is_some_and(|t| t.eq_ignore_ascii_case(b"text/event-stream"))
    });
    // An event stream is UTF-8, as tessera reads it; a client that decodes
    // it in the charset a Content-Type names (Python's `httpx`) would read
    // another text than the one filtered (found by the attack review).
    if event_stream {
        parts.headers.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
    }
    // The caller's request counts as in flight until this body ends.
    let body = Metered::new(
        redactor
            .clone()
            .body(crate::wire::decode::decode_body(codings, body)),
        &state.metrics,
        event_stream,
        admitted,
        &state.draining,
    );
    // Any SSE answer (a POST's or the GET stream) is filtered event by
    // event: the SDKs route a result by its JSON-RPC id, whichever stream
    // it arrives on, so a tools/list result on a ping's stream or the GET
    // stream reaches the caller as the list (`response::tool_list`).
    // The TypeScript SDK reads any 2xx answer to its GET as SSE, whatever
    // its Content-Type says: so does tessera (found by the attack review).
    let tool_filter = (lists || event_stream || get_stream).then(|| {
        fn text(v: &Option<http::HeaderValue>) -> Option<&str> {
            v.as_ref().and_then(|v| v.to_str().ok())
        }
        ToolFilter::new(
            state.authorizer.clone(),
            state.snapshot.load_full(),
            caller.clone(),
            r.connection_id,
            text(&list_version),
            text(&list_origin),
            state.config.tools_list_max_bytes,
        )
        .with_path(&r.sub_path)
        .with_pins(state.pins.clone())
        .read_as_sse(get_stream)
        .with_endpoints(legacy_sse::Endpoints::new(
            state.clone(),
            caller.clone(),
            r.connection_id,
            upstream.clone(),
            get_stream && r.sub_path.is_empty() && event_stream && parts.status.is_success(),
        ))
    });
    let body = match (tool_filter, sent) {
        // A POST's JSON answer holds the answers to that POST's requests,
        // and none to another's: a tools/list result for a request in
        // flight elsewhere would pass the filter unread (found by the
        // attack review).
        // Not only 2xx: the Python SDK (2.x) reads a 3xx answer's JSON
        // as messages too (found by the attack review). An error status's
        // body no client dispatches as an answer.
        // An answer no client reads as messages (no type, or one naming
        // neither JSON nor an event stream: a file's bytes) streams as it
        // came.
        (None, Some(sent))
            if parts.status.as_u16() < 400
                && !response::tool_list::plainly_neither(&parts.headers) =>
        {
            response::own_answers::OwnAnswers::new(
                body,
                sent,
                upstream.clone(),
                state.config.tools_list_max_bytes,
            )
            .boxed()
        }
        (None, _) => body.boxed(),
        (Some(f), _) => {
            let filtered = f.apply(parts.status, &mut parts.headers, body);
            let filtered = match tokio::time::timeout(state.config.upstream_timeout, filtered).await
            {
                Err(_) => {
                    return Err(ProxyError::UpstreamTimeout {
                        credential: credential(),
                    })
                }
                Ok(r) => r.map_err(|error| ProxyError::ToolsList {
                    credential: credential(),
                    error,
                })?,
            };
            // The filter decoded the answer's JSON and wrote it anew: what
            // it writes is redacted as well (an escaped secret it read is
            // plain in what it wrote).
            redactor.body(filtered).boxed()
        }
    };
    Ok(Response::from_parts(parts, body))
}

/// The verdict on a request: [`crate::authz::decide::verdict`] with this
/// process's policies and external authorizer.
async fn verdict(state: &State, ask: &AuthzRequest<'_>) -> Verdict {
    let span = trace::Span::child("authorize");
    let v = span
        .run(crate::authz::decide::verdict(
            &*state.authorizer,
            state.external.as_ref(),
            ask,
        ))
        .await;
    span.set(|| {
        use opentelemetry::KeyValue;
        let mut a = vec![
            KeyValue::new(
                "tessera.action",
                crate::authz::action_name(ask.http_method, ask.rpc_method),
            ),
            KeyValue::new("tessera.verdict", v.name()),
            KeyValue::new(
                "tessera.decided_by",
                if v.grounds().reason.is_some() {
                    "authorizer"
                } else {
                    "policy"
                },
            ),
        ];
        if let Some(t) = ask.tool {
            let t = ask.connection.upstream.redactor().text(t).into_owned();
            a.push(KeyValue::new("gen_ai.tool.name", t));
        }
        a
    });
    v
}

/// A JSON-RPC method as tessera writes it (the access line, the audit
/// trail, a span): the agent chose it, so it is redacted, unless it is one
/// of the methods MCP names, public words with nothing to redact (the
/// common case, spared a scan).
fn written_method<'a>(upstream: &crate::model::Upstream, m: &'a str) -> std::borrow::Cow<'a, str> {
    if crate::authz::METHOD_ACTIONS.contains(&m) {
        return std::borrow::Cow::Borrowed(m);
    }
    std::borrow::Cow::Owned(upstream.redactor().text(m).into_owned())
}

impl Decided {
    fn new(state: &State, ask: &AuthzRequest<'_>, verdict: Verdict) -> Decided {
        let verdict_is_ask = matches!(verdict, Verdict::Ask(_));
        let legacy_sha256 = verdict_is_ask.then(|| arguments_digest(ask.arguments));
        Decided {
            // Redacted like the tool's name: the agent chose it.
            rpc_method: ask
                .rpc_method
                .map(|m| written_method(&ask.connection.upstream, m).into_owned()),
            action: crate::authz::action_name(ask.http_method, ask.rpc_method),
            tool: ask.tool.map(str::to_string),
            verdict,
            settled: None,
            // The audit trail keeps a digest of the text as sent (cheap);
            // a held call is keyed by its canonical digest (a parse), which
            // only held calls pay for.
            arguments_sha256: ask.arguments.map(|a| sha256_hex(a.as_bytes())),
            call_sha256: None,
            shown: crate::store::model::Shown::default(),
            legacy_sha256,
            arguments: ask
                .arguments
                .filter(|_| state.config.audit_arguments)
                .map(str::to_string),
            shape: verdict_is_ask.then(|| crate::authz::predict::model::shape(ask.arguments)),
            predicted: None,
            pinned: None,
        }
    }

    /// What decided, for `/metrics`: the policies, the external
    /// authorizer, a person, or a prediction.
    fn counted(&self) -> crate::telemetry::metrics::Decision {
        use crate::authz::predict::Action;
        use crate::telemetry::metrics::{Decision, DecisionAction as A, DecisionSource as S};
        if self.pinned.is_some() {
            return Decision {
                action: A::Deny,
                source: S::Pinning,
            };
        }
        let (action, source) = match (&self.settled, &self.predicted) {
            (Some(Settled::Granted(_)), _) => (A::Allow, S::Person),
            (Some(Settled::Denied(_)), _) => (A::Deny, S::Person),
            (_, Some((Action::Allow, _))) => (A::Allow, S::Prediction),
            (_, Some((Action::Deny, _))) => (A::Deny, S::Prediction),
            (_, Some((Action::Ask, _))) => (A::Ask, S::Prediction),
            _ => (
                match self.verdict {
                    Verdict::Allow(_) => A::Allow,
                    Verdict::Deny(_) => A::Deny,
                    Verdict::Ask(_) => A::Ask,
                },
                // The external authorizer's verdict carries its reason
                // (`ExternalAuthorizer::consult`); the policies' has none.
                if self.verdict.grounds().reason.is_some() {
                    S::Authorizer
                } else {
                    S::Policy
                },
            ),
        };
        Decision { action, source }
    }

    /// The verdict and its reason as the audit trail records them.
    fn audited(&self) -> (&'static str, Option<String>) {
        if let Some(status) = self.pinned {
            return (
                "deny",
                Some(format!(
                    "tool pinning: the tool is {status}; it awaits an admin's review (tessera tool diff)"
                )),
            );
        }
        let grounds = self.verdict.grounds().summary();
        let with = |s: String| match &grounds {
            Some(g) => format!("{s}; {g}"),
            None => s,
        };
        let with_prediction = |s: String| match &self.predicted {
            Some((_, why)) => with(format!("{s}; {why}")),
            None => with(s),
        };
        if let (None, Some((action, why))) = (&self.settled, &self.predicted) {
            use crate::authz::predict::Action;
            match action {
                Action::Allow => return ("allow", Some(with(why.clone()))),
                Action::Deny => return ("deny", Some(with(why.clone()))),
                Action::Ask => {}
            }
        }
        match &self.settled {
            Some(Settled::Granted(id)) => ("allow", Some(with(format!("approval {id} granted")))),
            Some(Settled::Pending(id)) => (
                "ask",
                Some(with_prediction(format!("approval {id} pending"))),
            ),
            Some(Settled::Denied(id)) => {
                ("deny", Some(format!("approval {id} denied by a person")))
            }
            None => (
                self.verdict.name(),
                grounds.or_else(|| {
                    matches!(self.verdict, Verdict::Deny(_)).then(|| "no policy permits it".into())
                }),
            ),
        }
    }
}

/// The `Retry-After` of a call refused for `--max-pending-approvals`:
/// pending approvals end when a person decides them, in minutes.
const PENDING_RETRY_AFTER_S: u32 = 60;

/// Bind each held call to the whole call as it reaches the upstream
/// (`approvals::Call`: sub-path, query, complete `params`, session). Only
/// held calls pay for reading their `params` again.
fn bind_held(decided: &mut [Decided], sub_path: &str, parts: &http::request::Parts, body: &[u8]) {
    if !decided.iter().any(|d| matches!(d.verdict, Verdict::Ask(_))) {
        return;
    }
    let session: Vec<&[u8]> = parts
        .headers
        .get_all(crate::wire::headers::MCP_SESSION_ID)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let posted = parts.method == http::Method::POST;
    let params = posted.then(|| approvals::params_of(body)).flatten();
    for (i, d) in decided.iter_mut().enumerate() {
        if !matches!(d.verdict, Verdict::Ask(_)) {
            continue;
        }
        let call = approvals::Call {
            sub_path,
            query: parts.uri.query(),
            params: match &params {
                Some(p) => p.get(i).copied().flatten(),
                // Not reached (the body was read before): bind it whole.
                None => posted.then(|| std::str::from_utf8(body).ok()).flatten(),
            },
            session: &session,
        };
        d.call_sha256 = Some(approvals::call_digest(&call));
        d.shown = approvals::shown(&call);
    }
}

/// Act on the verdicts: any deny refuses the request; calls held for
/// approval go through only when a person granted each of them. A refused
/// lone `tools/call` is answered as a tool result the model can read;
/// anything else refused is a 403.
async fn enforce(
    state: &State,
    caller: &crate::model::Caller,
    connection_id: &str,
    upstream: &crate::model::Upstream,
    decided: &mut [Decided],
) -> Result<(), ProxyError> {
    let single = decided.len() == 1;
    let connection = || connection_id.chars().take(8).collect::<String>();
    if let Some(d) = decided
        .iter()
        .find(|d| matches!(d.verdict, Verdict::Deny(_)))
    {
        let denial = d.verdict.grounds().clone();
        return Err(match &d.tool {
            Some(tool) if single => ProxyError::ToolDenied {
                tool: tool.clone(),
                connection: connection(),
                denial,
            },
            _ => ProxyError::Denied(format!(
                "{} is not allowed for caller {} on connection {}: {denial}",
                d.action,
                caller.name,
                connection(),
            )),
        });
    }
    let mut asked: Vec<usize> = (0..decided.len())
        .filter(|&i| matches!(decided[i].verdict, Verdict::Ask(_)))
        .collect();
    if asked.is_empty() {
        return Ok(());
    }
    let redactor = upstream.redactor();
    let held_call = |i: usize| {
        let d = &decided[i];
        Held {
            key: CallKey {
                caller: caller.name.clone(),
                connection: connection_id.to_string(),
                rpc_method: d.rpc_method.clone().unwrap_or_else(|| d.action.to_string()),
                tool: d.tool.clone().unwrap_or_default(),
                arguments_sha256: d.call_sha256.clone().unwrap_or_default(),
            },
            legacy_sha256: d.legacy_sha256.clone(),
            reason: d.verdict.grounds().summary(),
            shown: d.shown.clone(),
            credential: Some(upstream.credential.clone()),
            // Argument names are the agent's words: kept (and shown, and
            // sent to a predictor) with the connection's secret redacted.
            shape: d.shape.as_deref().map(|s| redactor.text(s).into_owned()),
        }
    };
    let mut held: Vec<Held> = asked.iter().map(|&i| held_call(i)).collect();

    // Approvals that learn: a prediction may answer for the person.
    learn(
        state,
        caller,
        connection_id,
        upstream,
        decided,
        &mut asked,
        &mut held,
    )
    .await?;
    if asked.is_empty() {
        return Ok(());
    }
    let span = trace::Span::child("approval");
    span.set(|| {
        vec![opentelemetry::KeyValue::new(
            "tessera.held_calls",
            held.len() as i64,
        )]
    });
    let settled = span.run(held::hold(state, &held)).await;
    span.set(|| {
        let outcome = match &settled {
            Ok(s) if s.iter().all(|s| matches!(s, Settled::Granted(_))) => "granted",
            Ok(s) if s.iter().any(|s| matches!(s, Settled::Denied(_))) => "denied",
            Ok(_) => "pending",
            Err(_) => "failed",
        };
        vec![opentelemetry::KeyValue::new("tessera.approval", outcome)]
    });
    drop(span);
    let settled = settled.map_err(|e| match e {
        approvals::SettleError::TooManyPending { .. } => {
            ProxyError::TooMany(TooMany::PendingApprovals, PENDING_RETRY_AFTER_S)
        }
        approvals::SettleError::Store(e) => {
            tracing::error!(error = %e, "recording an approval request failed");
            ProxyError::ApprovalUnavailable
        }
    })?;
    for (&i, s) in asked.iter().zip(&settled) {
        decided[i].settled = Some(s.clone());
    }
    let Some(first) = asked
        .iter()
        .zip(&settled)
        .find(|(_, s)| !matches!(s, Settled::Granted(_)))
    else {
        return Ok(());
    };
    let (&i, s) = first;
    let denied = matches!(s, Settled::Denied(_));
    Err(match &decided[i].tool {
        Some(tool) if single => ProxyError::ToolHeld {
            tool: tool.clone(),
            connection: connection(),
            approval: s.id().to_string(),
            denied,
        },
        _ => {
            let ids: Vec<&str> = settled
                .iter()
                .filter(|s| !matches!(s, Settled::Granted(_)))
                .map(Settled::id)
                .collect();
            ProxyError::Held(format!(
                "{} on connection {} needs a person's approval ({} {}); it has not run. {}",
                decided[i].action,
                connection(),
                if ids.len() == 1 {
                    "approval"
                } else {
                    "approvals"
                },
                ids.join(", "),
                if denied {
                    "A person denied it: do not retry it."
                } else {
                    "Retry the same request once a person approves."
                },
            ))
        }
    })
}

/// For each call an `@ask("learn")` permit holds (and no person's record
/// of it stands), let a prediction answer for the person
/// ([`crate::authz::predict`]): a predicted denial refuses the request
/// (every such call remembered, so the request sent again is held for a
/// person); a predicted allow takes that call out of `asked` and `held`
/// (it goes through without a record); an ask, or any failure to predict,
/// leaves it held, the prediction's reason kept with its approval.
async fn learn(
    state: &State,
    caller: &crate::model::Caller,
    connection_id: &str,
    upstream: &crate::model::Upstream,
    decided: &mut [Decided],
    asked: &mut Vec<usize>,
    held: &mut Vec<Held>,
) -> Result<(), ProxyError> {
    let single = decided.len() == 1;
    let connection = || connection_id.chars().take(8).collect::<String>();
    let redactor = upstream.redactor();
    // Only tool calls are learnt: people's answers are kept per tool.
    let learning: Vec<usize> = (0..asked.len())
        .filter(|&k| {
            let d = &decided[asked[k]];
            d.verdict.grounds().learn && d.rpc_method.as_deref() == Some("tools/call")
        })
        .collect();
    if learning.is_empty() {
        return Ok(());
    }
    for k in learning {
        let i = asked[k];
        // What the agent chose (tool, argument names, the arguments
        // with --audit-arguments) leaves redacted, as everything tessera
        // writes does: a predictor is another party (found by the tests).
        let question = crate::authz::predict::Question {
            caller: caller.name.clone(),
            connection: connection_id.to_string(),
            credential: upstream.credential.clone(),
            tool: redactor
                .text(decided[i].tool.as_deref().unwrap_or_default())
                .into_owned(),
            rpc_method: held[k].key.rpc_method.clone(),
            shape: held[k].shape.clone().unwrap_or_default(),
            arguments: decided[i].arguments.as_deref().and_then(|a| {
                serde_json::value::RawValue::from_string(redactor.text(a).into_owned()).ok()
            }),
        };
        let span = trace::Span::child("predict");
        let predicted = span
            .run(held::predict(state, &held[k], question.clone()))
            .await;
        span.set(|| {
            let action = match &predicted {
                Ok(Some(o)) => match o.action() {
                    crate::authz::predict::Action::Allow => "allow",
                    crate::authz::predict::Action::Deny => "deny",
                    crate::authz::predict::Action::Ask => "ask",
                },
                Ok(None) => "none",
                Err(_) => "failed",
            };
            vec![opentelemetry::KeyValue::new("tessera.prediction", action)]
        });
        drop(span);
        let Some(outcome) = predicted.map_err(|e| {
            tracing::error!(error = %e, "looking up a held call's records failed");
            ProxyError::ApprovalUnavailable
        })?
        else {
            continue;
        };
        let why = redactor.text(&outcome.reason(&question)).into_owned();
        held[k].reason = Some(match &held[k].reason {
            Some(r) => format!("{why}; {r}"),
            None => why.clone(),
        });
        decided[i].predicted = Some((outcome.action(), why));
    }
    use crate::authz::predict::Action;
    let denied: Vec<usize> = (0..asked.len())
        .filter(|&k| matches!(decided[asked[k]].predicted, Some((Action::Deny, _))))
        .collect();
    if let Some(&k) = denied.first() {
        // Every call denied by prediction is remembered, so that the
        // same request sent again is held for a person whole (found
        // by the tests: a batch's second denial was denied again).
        for &j in &denied {
            if let Err(e) = held::remember_denial(state, &held[j].key).await {
                tracing::error!(error = %e, "recording a predicted denial failed");
                return Err(ProxyError::ApprovalUnavailable);
            }
        }
        let d = &decided[asked[k]];
        return Err(match &d.tool {
            Some(tool) if single => ProxyError::ToolPredictedDenied {
                tool: tool.clone(),
                connection: connection(),
            },
            _ => ProxyError::Denied(format!(
                "{} on connection {} was denied: people have denied calls like it. A person can still decide it: send the same request again and it is held for a person",
                d.action,
                connection(),
            )),
        });
    }
    // Predicted allows go through without a record.
    let mut k = 0;
    asked.retain(|&i| {
        let keep = !matches!(decided[i].predicted, Some((Action::Allow, _)));
        if !keep {
            held.remove(k);
        } else {
            k += 1;
        }
        keep
    });
    Ok(())
}
