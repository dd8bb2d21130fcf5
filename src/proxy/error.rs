//! The one error type at the request boundary, and the one function that
//! turns it into an HTTP status and a JSON-RPC error body.
//!
//! Refusals are everyday events (a wrong token, a probe of a random
//! address): their variants carry no data and their messages are static
//! strings, so refusing costs no formatting beyond the response body.
//! No variant ever holds a secret.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;

use crate::proxy::response::body::{full, ProxyBody};
use crate::telemetry::metrics::Reason;
use crate::telemetry::traceparent::RequestId;

/// The `_meta` key of the request id on a result tessera writes itself
/// (a refused or held tool call). A prefix of tessera's own, in reverse DNS
/// as MCP asks (2025-11-25 on), outside the prefixes MCP reserves (a second
/// label `modelcontextprotocol` or `mcp`).
pub const META_REQUEST_ID: &str = "io.tessera/request_id";

/// Why tessera answered a request itself instead of forwarding it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    // ---- refused before anything was loaded -------------------------------
    #[error("method not allowed: tessera forwards POST, GET and DELETE only")]
    MethodNotAllowed,
    #[error("not found: no connection at this address")]
    NotFound,
    #[error("forbidden: the Origin header is not in tessera's allowed origins")]
    ForbiddenOrigin,
    #[error("forbidden: the Host header names neither tessera's public host nor a loopback name")]
    ForbiddenHost,
    #[error("URI too long: tessera accepts request targets of at most {0} bytes")]
    UriTooLong(usize),
    #[error("request header fields too large: tessera accepts at most {0} header fields and {1} bytes of them")]
    HeadersTooLarge(usize, usize),
    // ---- the caller ------------------------------------------------------
    /// No caller token (no `Authorization: Bearer`, another scheme, two
    /// headers). Answered 403, not 401: see [`ProxyError::status`].
    #[error("unauthenticated: no caller token; send the caller token tessera issued as 'Authorization: Bearer <token>'")]
    Unauthorized,
    /// A caller token tessera does not know.
    #[error("unauthenticated: tessera does not know this caller token (mistyped, revoked or rotated); send the caller token tessera issued as 'Authorization: Bearer <token>'")]
    UnknownToken,
    #[error("forbidden: {0}")]
    Denied(String),
    /// A `tools/call` that policy refused: answered as a tool result with
    /// `isError: true`, which the model reads as feedback.
    #[error("tessera refused the call of tool {tool:?} on connection {connection}: {denial}. This is the proxy's policy, not a fault in the call: do not retry it; pick another way or ask the user.")]
    ToolDenied {
        tool: String,
        connection: String,
        denial: crate::authz::Grounds,
    },
    /// A `tools/call` held for a person's approval (pending, or denied by
    /// a person): answered as a tool result the model reads.
    #[error("{}", held_text(tool, connection, approval, *denied))]
    ToolHeld {
        tool: String,
        connection: String,
        approval: String,
        denied: bool,
    },
    /// A lone `tools/call` denied by a prediction of a person's answer
    /// (`@ask("learn")`): answered as a tool result the model reads, which
    /// says a person can still be asked (its retry is held for one).
    /// The model is not told the evidence (counts, levels, shapes): it
    /// would learn when another spelling of its call gets through (found
    /// by the attack review); the audit trail keeps it.
    #[error("tessera refused the call of tool {tool:?} on connection {connection}: people have denied calls like it, so tessera predicts this one would be denied. It has not run. If it is needed, retry the same call (same arguments, on the same path and session): the retry is held for a person to decide.")]
    ToolPredictedDenied { tool: String, connection: String },
    /// A `tools/call` of a tool that tool pinning holds (its definition
    /// changed since it was pinned, or it is new, or an admin rejected
    /// it: `crate::authz::pins`). A lone call is answered as a tool result
    /// the model reads; a batch holding one is refused (403).
    #[error("{}", pinned_text(tool, connection, *status))]
    ToolPinned {
        tool: String,
        connection: String,
        status: crate::authz::pins::PinStatus,
        lone: bool,
    },
    /// Any other request held for approval, or a batch with a held call.
    #[error("forbidden: {0}")]
    Held(String),
    #[error("tessera could not record or check the approval for this call (its database failed); try again shortly")]
    ApprovalUnavailable,
    /// The audit trail cannot take the request's record: its database
    /// fails and the queue of unwritten records is full.
    #[error("tessera cannot write its audit trail (its database is failing and the queue of unwritten records is full), so the request was not forwarded; try again shortly")]
    AuditUnavailable,
    #[error("request body too large: the limit is {0} bytes")]
    PayloadTooLarge(usize),
    /// The memory for request bodies across all requests is in use
    /// (`--max-body-memory`; see [`crate::limits::capacity::BodyMemory`]).
    #[error("service unavailable: the memory tessera sets aside for request bodies (--max-body-memory) is in use by other requests, so this one was not read nor forwarded; retry after the time in Retry-After")]
    BodyMemory,
    #[error("parse error: the request body is not valid JSON")]
    ParseError,
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// A sub-path an upstream's server could read otherwise than tessera
    /// (see [`crate::proxy::route::normalize_sub_path`]).
    #[error("invalid request: {} (rule {})", .0.text(), .0.reason())]
    SubPath(PathRule),
    /// A query parameter named like a credential (see
    /// [`crate::proxy::shape::refuse_credential_query`]).
    #[error("invalid request: the query may not carry a credential (a parameter named access_token, token, api_key, key, secret, password, auth or the like); tessera injects the upstream's credential itself, and the caller's token goes in 'Authorization: Bearer <token>' (rule query_credential)")]
    QueryCredential,
    /// A message upstreams could read otherwise than tessera did (names
    /// equal ignoring letter case, a method in another letter case):
    /// refused, since its original bytes are what would be forwarded.
    #[error("invalid request: ambiguous message: {0}; an upstream could read it otherwise than tessera would decide it, so it is not forwarded")]
    Ambiguous(&'static str),
    /// The 2026-07-28 routing headers (`Mcp-Method`, `Mcp-Name`) say other
    /// than the body: an intermediary routing on them and the upstream
    /// running the body would act on different calls.
    #[error("invalid request: header mismatch: {0}")]
    HeaderMismatch(&'static str),
    /// `MCP-Protocol-Version` says another revision than the body's
    /// `_meta` (2026-07-28): policies and the upstream would read
    /// different revisions.
    #[error("invalid request: the MCP-Protocol-Version header ({header}) is not the protocol version in the body's _meta ({meta})")]
    VersionMismatch { header: String, meta: String },
    /// An `Mcp-Session-Id` this caller did not open on this connection
    /// (another caller's, a forged one, one from another connection):
    /// answered as an unknown session is, whoever owns it.
    #[error("session not found: this Mcp-Session-Id was not opened by this caller on this connection; start a new session (initialize)")]
    SessionUnknown,
    #[error("reading the request body failed")]
    RequestBody,
    #[error("request timeout: the request body did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// A caller over its limits, or a source failing authentication over
    /// and over (see [`crate::limits`]).
    #[error("{}", too_many_text(*.0))]
    TooMany(TooMany, u32),
    // ---- the upstream ----------------------------------------------------
    #[error(
        "upstream unreachable for credential {credential:?}: could not connect to the MCP server"
    )]
    UpstreamUnreachable { credential: String },
    /// The egress rule refused the upstream (see [`crate::upstream::egress`]); the
    /// address itself goes to the log, not to the caller.
    #[error("tessera will not connect to the upstream of credential {credential:?}: it is an internal address or plain http://, which this tessera does not allow (--allow-private-upstreams); ask the admin")]
    UpstreamForbidden { credential: String },
    /// The upstream's TLS could not be trusted or negotiated.
    #[error("TLS to {host}, the upstream of credential {credential:?}, failed: {why}; ask the admin (a private certificate authority goes in --upstream-ca-file)")]
    UpstreamTls {
        credential: String,
        host: String,
        why: String,
    },
    #[error(
        "upstream timeout for credential {credential:?}: the MCP server did not answer in time"
    )]
    UpstreamTimeout { credential: String },
    #[error("the upstream rejected the stored credential {credential:?} for this connection (HTTP {status}); ask the admin to check or replace it")]
    CredentialRejected { credential: String, status: u16 },
    #[error(
        "upstream error for credential {credential:?}: the MCP server broke the HTTP exchange"
    )]
    UpstreamProtocol { credential: String },
    /// No OAuth token could be had for the credential.
    #[error("cannot get an OAuth token for credential {credential:?}: {error}; ask the admin to check the credential")]
    TokenEndpoint {
        credential: String,
        error: crate::credentials::oauth::TokenError,
    },
    /// The upstream answered in a content coding tessera cannot undo (so
    /// it could not be scanned for the secret, nor filtered).
    #[error("upstream error for credential {credential:?}: the MCP server answered in a content coding tessera cannot decode")]
    UpstreamEncoding { credential: String },
    /// A `tools/list` answer that could not be filtered is not passed on.
    #[error("upstream error for credential {credential:?}: {error}")]
    ToolsList {
        credential: String,
        error: crate::proxy::response::tool_list::ListError,
    },
}

pub use crate::proxy::path::PathRule;

/// Which limit a 429 is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TooMany {
    /// The caller's requests (and streams) in flight.
    InFlight,
    /// The caller's request rate.
    Rate,
    /// Failed authentication from this source or on this address.
    FailedAuth,
    /// The caller's approvals waiting for a person
    /// (`--max-pending-approvals`).
    PendingApprovals,
}

fn too_many_text(kind: TooMany) -> &'static str {
    match kind {
        TooMany::InFlight => "too many requests: this caller has too many requests and streams open at once; retry after the time in Retry-After",
        TooMany::Rate => "too many requests: this caller is over its request rate; retry after the time in Retry-After",
        TooMany::PendingApprovals => "too many calls of this caller are waiting for a person's approval; this call was not recorded and has not run. Wait until a person decides the pending ones, then retry (no sooner than Retry-After)",
        TooMany::FailedAuth => "too many failed authentications from this source or on this address; send the caller token tessera issued as 'Authorization: Bearer <token>', after the time in Retry-After",
    }
}

/// The `Retry-After` of a refusal for a failing database: its outages are
/// not measured in milliseconds, nor is a retry loop wanted.
const DB_RETRY_AFTER_S: u32 = 2;

/// The model-facing text of a held tool call.
fn held_text(tool: &str, connection: &str, approval: &str, denied: bool) -> String {
    if denied {
        format!("A person denied the call of tool {tool:?} on connection {connection} (approval {approval}). It has not run. Do not retry it; pick another way or ask the user.")
    } else {
        format!("tessera is holding the call of tool {tool:?} on connection {connection} for a person's approval (approval {approval}, pending). It has not run. Once a person approves it, retry the same call (same arguments, on the same path and session); a different call needs its own approval.")
    }
}

impl ProxyError {
    /// The HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        use ProxyError::*;
        match self {
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            NotFound | SessionUnknown => StatusCode::NOT_FOUND,
            ForbiddenOrigin | ForbiddenHost | Denied(_) | Held(_) => StatusCode::FORBIDDEN,
            ToolDenied { .. } | ToolHeld { .. } | ToolPredictedDenied { .. } => StatusCode::OK,
            ToolPinned { lone: true, .. } => StatusCode::OK,
            ToolPinned { lone: false, .. } => StatusCode::FORBIDDEN,
            ApprovalUnavailable | AuditUnavailable | BodyMemory => StatusCode::SERVICE_UNAVAILABLE,
            // Not 401: to an MCP client a 401 means "run OAuth for this
            // resource" (MCP authorization), whatever its challenge says.
            // Inspector starts OAuth discovery on any 401 (and fails with
            // "Interactive OAuth requires a TTY" without a terminal), as
            // do clients with an OAuth provider; tessera's callers hold a
            // static token, and no OAuth can fix a wrong one. A 403 with
            // no challenge is an error every client reports with this
            // body's message (the TypeScript 1.x and 2.x SDKs, the Python
            // SDK, Inspector, rmcp).
            Unauthorized | UnknownToken => StatusCode::FORBIDDEN,
            PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            UriTooLong(_) => StatusCode::URI_TOO_LONG,
            HeadersTooLarge(..) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            TooMany(..) => StatusCode::TOO_MANY_REQUESTS,
            ParseError
            | InvalidRequest(_)
            | SubPath(_)
            | QueryCredential
            | Ambiguous(_)
            | HeaderMismatch(_)
            | VersionMismatch { .. }
            | RequestBody => StatusCode::BAD_REQUEST,
            UpstreamUnreachable { .. }
            | UpstreamForbidden { .. }
            | UpstreamTls { .. }
            | CredentialRejected { .. }
            | UpstreamProtocol { .. }
            | ToolsList { .. }
            | UpstreamEncoding { .. }
            | TokenEndpoint { .. } => StatusCode::BAD_GATEWAY,
            UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The JSON-RPC error code: the standard ones where they fit, else the
    /// implementation-defined server-error range.
    pub fn code(&self) -> i32 {
        use ProxyError::*;
        match self {
            ParseError => -32700,
            InvalidRequest(_) | SubPath(_) | QueryCredential | Ambiguous(_) | HeaderMismatch(_)
            | RequestBody | PayloadTooLarge(_) | MethodNotAllowed | UriTooLong(_)
            | HeadersTooLarge(..) | RequestTimeout(_) => -32600,
            TooMany(..) => -32029,
            // The code the SDKs' servers use for an unknown session.
            Unauthorized | UnknownToken | SessionUnknown => -32001,
            // 2026-07-28's code for a version header that is not `_meta`'s.
            VersionMismatch { .. } => -32020,
            ForbiddenOrigin
            | ForbiddenHost
            | Denied(_)
            | ToolDenied { .. }
            | ToolPredictedDenied { .. }
            | ToolPinned { .. } => -32003,
            Held(_) | ToolHeld { .. } => -32005,
            ApprovalUnavailable => -32012,
            AuditUnavailable => -32013,
            BodyMemory => -32014,
            NotFound => -32004,
            UpstreamUnreachable { .. }
            | UpstreamForbidden { .. }
            | UpstreamTls { .. }
            | UpstreamProtocol { .. }
            | CredentialRejected { .. }
            | ToolsList { .. }
            | UpstreamEncoding { .. }
            | TokenEndpoint { .. } => -32010,
            UpstreamTimeout { .. } => -32011,
        }
    }

    /// Why tessera answered: the access log's and the metrics' label.
    pub fn reason(&self) -> Reason {
        use ProxyError::*;
        match self {
            MethodNotAllowed => Reason::Method,
            NotFound => Reason::NotFound,
            ForbiddenOrigin => Reason::Origin,
            ForbiddenHost => Reason::Host,
            Unauthorized | UnknownToken => Reason::Unauthenticated,
            Denied(_) | ToolDenied { .. } | ToolPredictedDenied { .. } => Reason::Denied,
            Held(_) | ToolHeld { .. } => Reason::Held,
            ToolPinned { .. } => Reason::ToolPinning,
            ApprovalUnavailable => Reason::ApprovalUnavailable,
            AuditUnavailable => Reason::AuditUnavailable,
            ToolsList { .. } => Reason::ToolsList,
            TokenEndpoint { .. } => Reason::TokenEndpoint,
            PayloadTooLarge(_) => Reason::TooLarge,
            BodyMemory => Reason::BodyMemory,
            ParseError => Reason::Parse,
            InvalidRequest(_) => Reason::Invalid,
            SubPath(rule) => rule.reason(),
            QueryCredential => Reason::QueryCredential,
            Ambiguous(_) => Reason::Ambiguous,
            HeaderMismatch(_) => Reason::HeaderMismatch,
            VersionMismatch { .. } => Reason::VersionMismatch,
            SessionUnknown => Reason::SessionUnknown,
            RequestBody => Reason::RequestBody,
            UriTooLong(_) => Reason::UriTooLong,
            HeadersTooLarge(..) => Reason::HeadersTooLarge,
            RequestTimeout(_) => Reason::RequestTimeout,
            TooMany(self::TooMany::InFlight, _) => Reason::CallerInFlight,
            TooMany(self::TooMany::Rate, _) => Reason::CallerRate,
            TooMany(self::TooMany::FailedAuth, _) => Reason::AuthThrottled,
            TooMany(self::TooMany::PendingApprovals, _) => Reason::ApprovalsPendingCap,
            UpstreamUnreachable { .. } => Reason::UpstreamUnreachable,
            UpstreamForbidden { .. } => Reason::UpstreamForbidden,
            UpstreamTls { .. } => Reason::UpstreamTls,
            UpstreamTimeout { .. } => Reason::UpstreamTimeout,
            CredentialRejected { .. } => Reason::CredentialRejected,
            UpstreamProtocol { .. } => Reason::UpstreamProtocol,
            UpstreamEncoding { .. } => Reason::UpstreamEncoding,
        }
    }

    /// The response: status, JSON-RPC error body carrying the request's id
    /// when it could be read (`null` otherwise), and the headers a client
    /// needs to act (`Allow`, `Retry-After`). No `WWW-Authenticate`: tessera
    /// offers its callers no scheme to negotiate, and a challenge starts
    /// OAuth in MCP clients (see [`ProxyError::status`]). With the
    /// credential's `redactor`, the body is redacted like an upstream's.
    /// `result_type`: the caller speaks a revision (2026-07-28 on) whose
    /// results carry `resultType`, without which its SDK throws a result
    /// away unread (see [`crate::proxy::jsonrpc::results_carry_type`]).
    ///
    /// `request_id` is written where a client can read it and the model is
    /// not asked to: `error.data.request_id` in an error, the result's
    /// `_meta` ([`META_REQUEST_ID`]) in a tool result (its `content` is the
    /// model's to read). The caller also gets it as `X-Request-Id`.
    pub fn into_response(
        self,
        id: Option<&RawValue>,
        redactor: Option<&crate::redact::Redactor>,
        result_type: bool,
        request_id: &RequestId,
    ) -> Response<ProxyBody> {
        let body = match self {
            ProxyError::ToolDenied { .. }
            | ProxyError::ToolHeld { .. }
            | ProxyError::ToolPinned { lone: true, .. }
            | ProxyError::ToolPredictedDenied { .. } => {
                let mut result = serde_json::json!({
                    "content": [{ "type": "text", "text": self.to_string() }],
                    "isError": true,
                    "_meta": { META_REQUEST_ID: request_id.as_str() },
                });
                if result_type {
                    result["resultType"] = "complete".into();
                }
                serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result })
            }
            _ => serde_json::json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": self.code(),
                    "message": self.to_string(),
                    "data": { "request_id": request_id.as_str() },
                },
            }),
        };
        let body = body.to_string();
        let body = match redactor {
            Some(r) => r.text(&body).into_owned(),
            None => body,
        };
        let mut resp = Response::new(full(Bytes::from(body)));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match self {
            ProxyError::MethodNotAllowed => {
                h.insert(header::ALLOW, HeaderValue::from_static("POST, GET, DELETE"));
            }
            ProxyError::TooMany(_, seconds) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            ProxyError::ApprovalUnavailable | ProxyError::AuditUnavailable => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(DB_RETRY_AFTER_S));
            }
            ProxyError::BodyMemory => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            ProxyError::RequestTimeout(_) | ProxyError::HeadersTooLarge(..) => {
                // The connection's state is unknown (half a body, a head
                // cut short): the client starts afresh on a new one.
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }
}

/// What the model reads of a call tool pinning refused.
fn pinned_text(tool: &str, connection: &str, status: crate::authz::pins::PinStatus) -> String {
    use crate::authz::pins::PinStatus;
    let why = match status {
        PinStatus::Changed => "its definition changed since it was pinned",
        PinStatus::New => "it is new (its definition was never reviewed)",
        PinStatus::Rejected => "an admin rejected its definition",
        // Not refused; said plainly should it ever be.
        PinStatus::Pinned => "its definition is under review",
    };
    format!("tessera refused the call of tool {tool:?} on connection {connection}: {why}, and it awaits an admin's review (tool pinning). It has not run. Do not retry it until the tool is listed again by tools/list; pick another way or ask the user.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(ProxyError::MethodNotAllowed.status(), 405);
        assert_eq!(ProxyError::Unauthorized.status(), 403);
        assert_eq!(ProxyError::UnknownToken.status(), 403);
        assert_eq!(ProxyError::NotFound.status(), 404);
        assert_eq!(ProxyError::PayloadTooLarge(1).status(), 413);
        let c = || "gh".to_string();
        assert_eq!(
            ProxyError::UpstreamTimeout { credential: c() }.status(),
            504
        );
        assert_eq!(
            ProxyError::CredentialRejected {
                credential: c(),
                status: 401
            }
            .status(),
            502
        );
    }

    #[test]
    fn response_carries_id_and_headers() {
        let id = RawValue::from_string("7".into()).unwrap();
        let rid = RequestId::for_request(None);
        let r = ProxyError::UnknownToken.into_response(Some(&id), None, false, &rid);
        assert!(!r.headers().contains_key("www-authenticate"));
        let r = ProxyError::MethodNotAllowed.into_response(None, None, false, &rid);
        assert_eq!(r.headers()["allow"], "POST, GET, DELETE");
    }

    async fn body_of(r: Response<ProxyBody>) -> serde_json::Value {
        use http_body_util::BodyExt;
        let b = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    /// An error carries the request id in `error.data`; a tool result in
    /// its `_meta`, never in the text the model reads.
    #[tokio::test]
    async fn the_request_id_is_in_the_body_where_a_client_reads_it() {
        let rid = RequestId::for_request(None);
        let v = body_of(ProxyError::NotFound.into_response(None, None, false, &rid)).await;
        assert_eq!(v["error"]["data"]["request_id"], rid.as_str());
        let denied = ProxyError::ToolPredictedDenied {
            tool: "t".into(),
            connection: "c0ffee00".into(),
        };
        let v = body_of(denied.into_response(None, None, true, &rid)).await;
        assert_eq!(v["result"]["_meta"][META_REQUEST_ID], rid.as_str());
        assert_eq!(v["result"]["resultType"], "complete");
        let text = v["result"]["content"][0]["text"].as_str().unwrap();
        assert!(!text.contains(rid.as_str()), "{text}");
    }
}
