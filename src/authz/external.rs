//! The external authorizer: a second opinion after the policies allow or
//! ask (a policy deny is final and never leaves the process).
//!
//! tessera POSTs a JSON description of the request (caller, groups,
//! connection, credential, upstream host, action, method, sub-path, tool, arguments,
//! protocol version, Origin, time) and expects
//! `{"decision": "allow"|"deny"|"ask", "reason": "..."}`. The stricter of
//! the two verdicts stands. A timeout, a connection error, a non-2xx
//! status or an answer that is not that shape is never an allow: it is the
//! configured failure verdict (deny, or ask), with the reason recorded.
//!
//! The call runs inside the request's own task under a timeout; when it
//! fires the exchange's future is dropped, which closes its connection, so
//! a hanging authorizer leaves nothing behind.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Uri};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::authz::{AuthzRequest, Grounds, Verdict};
use crate::config::{AuthorizerConfig, OnFailure};
use crate::upstream::pool::UpstreamClient;

/// The largest answer read from the authorizer.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The longest reason kept (it reaches the audit trail and the model).
const MAX_REASON_CHARS: usize = 300;

/// The external authorizer, as configured.
#[derive(Debug)]
pub struct ExternalAuthorizer {
    config: AuthorizerConfig,
    /// Its own client: the authorizer is the operator's service (often a
    /// sidecar on loopback), not an upstream, so the upstreams' egress
    /// rule (no internal addresses) does not apply to it.
    client: UpstreamClient,
    uri: Uri,
    host: HeaderValue,
}

/// What tessera tells the authorizer.
#[derive(Serialize)]
struct Question<'a> {
    caller: &'a str,
    groups: &'a [String],
    connection: &'a str,
    credential: &'a str,
    upstream_host: &'a str,
    http_method: &'a str,
    /// The sub-path after the connection address, as forwarded.
    path: &'a str,
    /// The policy action (`tools/call`, `stream/open`, …).
    action: &'a str,
    method: Option<&'a str>,
    tool: Option<&'a str>,
    arguments: Option<&'a RawValue>,
    protocol_version: Option<&'a str>,
    origin: Option<&'a str>,
    time: String,
}

/// What the authorizer answers.
#[derive(Deserialize)]
struct Answer {
    decision: Decision,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Decision {
    Allow,
    Deny,
    Ask,
}

impl ExternalAuthorizer {
    /// Must be called inside a Tokio runtime (its client sweeps idle
    /// connections in a task). `roots`: the certificate authorities
    /// upstream TLS trusts (`--upstream-roots`, `--upstream-ca-file`), so
    /// an authorizer behind a private CA is reached like an upstream.
    pub fn new(
        config: AuthorizerConfig,
        connect_timeout: Duration,
        roots: rustls::RootCertStore,
    ) -> ExternalAuthorizer {
        let uri: Uri = config
            .url
            .as_str()
            .parse()
            .expect("a validated URL is a URI");
        let host = HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str()))
            .expect("a URI authority is a header value");
        let client = crate::upstream::client_with_roots(
            connect_timeout,
            Duration::from_secs(90),
            crate::upstream::egress::Egress {
                allow_private: true,
            },
            roots,
        );
        ExternalAuthorizer {
            config,
            uri,
            host,
            client,
        }
    }

    /// Ask the authorizer about a request the policies allowed or asked
    /// (`policy`), and return the stricter verdict.
    pub async fn consult(&self, req: &AuthzRequest<'_>, policy: Verdict) -> Verdict {
        if matches!(policy, Verdict::Deny(_)) {
            return policy;
        }
        let policies = policy.grounds().policies.clone();
        let grounds = |reason: String| Grounds {
            policies: policies.clone(),
            reason: Some(reason),
            learn: false,
        };
        let span = crate::telemetry::trace::Span::child_of_kind(
            "authorizer",
            opentelemetry::trace::SpanKind::Client,
        );
        let answer = span
            .run(tokio::time::timeout(self.config.timeout, self.ask(req)))
            .await;
        match &answer {
            Ok(Ok(a)) => span.set(|| {
                let d = match a.decision {
                    Decision::Allow => "allow",
                    Decision::Deny => "deny",
                    Decision::Ask => "ask",
                };
                vec![opentelemetry::KeyValue::new("tessera.verdict", d)]
            }),
            Ok(Err(_)) => span.error(|| "the authorizer failed".into()),
            Err(_) => span.error(|| "no answer within the authorizer timeout".into()),
        }
        drop(span);
        let second = match answer {
            Ok(Ok(a)) => {
                let reason = a
                    .reason
                    .map(|r| r.chars().take(MAX_REASON_CHARS).collect())
                    .unwrap_or_else(|| "no reason given".into());
                match a.decision {
                    Decision::Allow => Verdict::Allow(grounds(reason)),
                    Decision::Deny => Verdict::Deny(grounds(reason)),
                    Decision::Ask => Verdict::Ask(grounds(reason)),
                }
            }
            Ok(Err(why)) => self.failed(grounds(format!("authorizer failed: {why}"))),
            Err(_) => self.failed(grounds(format!(
                "authorizer failed: no answer within {} ms",
                self.config.timeout.as_millis()
            ))),
        };
        policy.and(second)
    }

    fn failed(&self, g: Grounds) -> Verdict {
        tracing::warn!(
            reason = g.reason.as_deref(),
            "the external authorizer failed"
        );
        match self.config.on_failure {
            OnFailure::Deny => Verdict::Deny(g),
            OnFailure::Ask => Verdict::Ask(g),
        }
    }

    async fn ask(&self, req: &AuthzRequest<'_>) -> Result<Answer, String> {
        let up = &req.connection.upstream;
        let q = Question {
            caller: &req.caller.name,
            groups: &req.caller.groups,
            connection: req.connection_id,
            credential: &up.credential,
            upstream_host: up.url.host_str().unwrap_or_default(),
            http_method: req.http_method.as_str(),
            path: req.path,
            action: super::action_name(req.http_method, req.rpc_method),
            method: req.rpc_method,
            tool: req.tool,
            arguments: req
                .arguments
                .and_then(|a| serde_json::from_str::<&RawValue>(a).ok()),
            protocol_version: req.protocol_version,
            origin: req.origin,
            time: crate::telemetry::log::rfc3339(req.time),
        };
        let body = serde_json::to_vec(&q).map_err(|e| e.to_string())?;
        let mut r = Request::new(Bytes::from(body));
        *r.method_mut() = Method::POST;
        *r.uri_mut() = self.uri.clone();
        let h = r.headers_mut();
        h.insert(header::HOST, self.host.clone());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        // No credential travels to the authorizer: its questions share one
        // pool.
        use crate::upstream::pool::{ExchangeError, SendError};
        let answer = self
            .client
            .exchange(r, "authorizer", MAX_ANSWER_BYTES)
            .await
            .map_err(|e| match e {
                ExchangeError::Send(SendError::Connect(e)) => format!("could not connect: {e}"),
                ExchangeError::Send(SendError::Http(e)) => format!("broken HTTP exchange: {e}"),
                e @ ExchangeError::Body(_) => format!("reading the answer: {e}"),
            })?;
        let (status, body) = (answer.status, answer.body);
        if !status.is_success() {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        // Only an object: serde would also read a struct from an array.
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(serde_json::Value::is_object)
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| {
                "the answer is not {\"decision\": \"allow\"|\"deny\"|\"ask\", \"reason\": \"...\"}"
                    .to_string()
            })
    }
}
