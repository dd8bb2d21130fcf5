//! Traces: `serve --otlp-endpoint` exports OpenTelemetry spans over
//! OTLP/HTTP to a real receiver (started here, decoding the protobuf with
//! `opentelemetry-proto`): one tool call is one trace whose spans have the
//! right parents, continuing the caller's `traceparent`, and the upstream
//! is told tessera's own span.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::*;

/// A span as received, with its service's name.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    kind: i32,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    attributes: HashMap<String, String>,
    error: bool,
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Got>>>,
    arrived: Arc<Notify>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Notify::new());
        let content_types = Arc::new(Mutex::new(Vec::new()));
        let (s, a, c) = (spans.clone(), arrived.clone(), content_types.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (s, a, c) = (s.clone(), a.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (s, a, c) = (s.clone(), a.clone(), c.clone());
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            let ct = req
                                .headers()
                                .get("content-type")
                                .map(|v| v.to_str().unwrap().to_string())
                                .unwrap_or_default();
                            c.lock().unwrap().push(ct);
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            s.lock().unwrap().extend(flatten(export));
                            a.notify_waiters();
                            let answer = ExportTraceServiceResponse::default().encode_to_vec();
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::from(answer)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            spans,
            arrived,
            content_types,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Wait until `n` spans of `trace_id` have arrived; all of them.
    async fn trace(&self, trace_id: &[u8], n: usize) -> Vec<Got> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self.arrived.notified();
            let of: Vec<Got> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            if of.len() >= n {
                return of;
            }
            tokio::time::timeout_at(deadline, arrived)
                .await
                .unwrap_or_else(|_| panic!("{} of {n} spans arrived: {of:#?}", of.len()));
        }
    }
}

fn flatten(export: ExportTraceServiceRequest) -> Vec<Got> {
    let mut out = Vec::new();
    for rs in export.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Got {
                    service: service.clone(),
                    name: s.name,
                    kind: s.kind,
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                    parent: s.parent_span_id,
                    attributes: s
                        .attributes
                        .into_iter()
                        .map(|kv| {
                            (
                                kv.key,
                                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    error: s.status.is_some_and(|st| st.code == 2),
                });
            }
        }
    }
    out
}

fn text(v: Option<&AnyValue>) -> String {
    match v {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn one<'a>(spans: &'a [Got], name: &str) -> &'a Got {
    let of: Vec<&Got> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(of.len(), 1, "one {name} span: {spans:#?}");
    of[0]
}

/// One tool call with the caller's `traceparent`: one trace, continuing
/// the caller's, of a server span (its parent the caller's span), with an
/// authorization span and an upstream client span as its children; the
/// upstream received the client span's context; no span holds a secret or
/// a token; and what was still queued is exported at SIGTERM.
#[tokio::test]
async fn a_tool_call_is_one_trace_and_the_upstream_is_told_tesseras_span() {
    let receiver = Receiver::start().await;
    let upstream = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let agent = register(dir.path(), &public, "gh", &upstream.url("/mcp"), "agent");
    // Spans leave on the batch processor's schedule (shortened here) and
    // at shutdown.
    let mut served = Served::start(
        dir.path(),
        port,
        &["--otlp-endpoint", &receiver.url()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    assert!(served.log.contains("exporting traces"), "{}", served.log);

    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let r = client()
        .post(&agent.url)
        .bearer_auth(&agent.token)
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .header("tracestate", "vendor=abc")
        .body(tools_call(1, "search"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The request id is the trace's id.
    assert_eq!(r.headers()["x-request-id"], caller_trace);
    let _ = r.bytes().await.unwrap();

    let spans = receiver.trace(&unhex(caller_trace), 3).await;
    let root = one(&spans, "POST /c/{address}");
    let authorize = one(&spans, "authorize");
    let up = one(&spans, "upstream");
    assert_eq!(root.service, "tessera");
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert_eq!(
        hex(&root.parent),
        caller_span,
        "continues the caller's span"
    );
    assert_eq!(authorize.parent, root.span_id);
    assert_eq!(up.parent, root.span_id);
    assert_eq!(up.kind, SpanKind::Client as i32);
    assert_eq!(root.attributes["mcp.method.name"], "tools/call");
    assert_eq!(root.attributes["gen_ai.tool.name"], "search");
    assert_eq!(root.attributes["tessera.caller"], "agent");
    assert_eq!(root.attributes["tessera.verdict"], "forwarded");
    assert_eq!(root.attributes["http.response.status_code"], "200");
    assert!(!root.error && !up.error);
    assert_eq!(authorize.attributes["tessera.verdict"], "allow");
    assert_eq!(authorize.attributes["tessera.decided_by"], "policy");
    assert_eq!(up.attributes["server.address"], "127.0.0.1");
    assert_eq!(
        up.attributes["server.port"],
        upstream.addr.port().to_string()
    );
    assert_eq!(up.attributes["http.response.status_code"], "200");

    // The upstream was told the upstream span, in the caller's trace, with
    // the caller's tracestate carried on.
    let seen = upstream.seen();
    let told = seen.last().unwrap();
    assert_eq!(
        told.headers["traceparent"],
        format!("00-{caller_trace}-{}-01", hex(&up.span_id)).as_str()
    );
    assert_eq!(told.headers["tracestate"], "vendor=abc");

    // No span says anything secret: the stored credential, the caller's
    // token, the connection's full address.
    let address = agent.url.rsplit('/').next().unwrap().to_string();
    for s in &spans {
        for (k, v) in &s.attributes {
            for needle in [SECRET, agent.token.as_str(), address.as_str()] {
                assert!(!v.contains(needle), "{}: {k}={v}", s.name);
            }
        }
    }

    // Without a traceparent: a new trace, its root without a parent, and
    // the upstream told a span of it. Spans still queued when serve is
    // told to stop are exported before it exits.
    let r = client()
        .post(&agent.url)
        .bearer_auth(&agent.token)
        .body(tools_call(2, "search"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let minted = r.headers()["x-request-id"].to_str().unwrap().to_string();
    let _ = r.bytes().await.unwrap();
    let seen = upstream.seen();
    let told = seen.last().unwrap().headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    let trace_id = unhex(&told[3..35]);
    assert_ne!(hex(&trace_id), caller_trace);
    // A minted request id is the new trace's id.
    assert_eq!(minted, hex(&trace_id));
    let spans = receiver.trace(&trace_id, 3).await;
    let root = one(&spans, "POST /c/{address}");
    assert!(root.parent.is_empty(), "a new trace's root has no parent");
    assert_eq!(hex(&one(&spans, "upstream").span_id), &told[36..52]);

    served.signal("TERM");
    served.read_to_end().await;
    let types = receiver.content_types.lock().unwrap().clone();
    assert!(
        types.iter().all(|t| t == "application/x-protobuf"),
        "{types:?}"
    );
}

/// A refusal is traced too: the request span is marked with the reason,
/// and nothing reaches the upstream (no upstream span).
#[tokio::test]
async fn a_refused_call_is_traced_with_its_reason_and_no_upstream_span() {
    let receiver = Receiver::start().await;
    let upstream = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let agent = register(dir.path(), &public, "gh", &upstream.url("/mcp"), "agent");
    let mut served = Served::start(
        dir.path(),
        port,
        &["--otlp-endpoint", &receiver.url()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let r = client()
        .post(&agent.url)
        .bearer_auth("not-a-token")
        .header("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))
        .body(tools_call(1, "search"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert!((400..500).contains(&status), "{status}");
    let spans = receiver.trace(&unhex(trace), 1).await;
    let root = one(&spans, "POST /c/{address}");
    assert_eq!(root.attributes["tessera.verdict"], "refused");
    assert_eq!(
        root.attributes["http.response.status_code"],
        status.to_string()
    );
    // A client's error is not the server's: the span is not failed.
    assert!(!root.error);
    assert!(root.attributes.contains_key("tessera.reason"), "{root:?}");
    assert!(!spans.iter().any(|s| s.name == "upstream"));
    assert!(upstream.seen().is_empty());
    served.signal("TERM");
    served.read_to_end().await;
}

/// The external authorizer's exchange is a client span under the
/// authorization span, which says the authorizer decided.
#[tokio::test]
async fn the_external_authorizer_is_a_span_under_authorize() {
    use crate::ext_authz::{Authz, Mode};
    let receiver = Receiver::start().await;
    let authz = Authz::start(Mode::Answer(r#"{"decision":"allow","reason":"fine"}"#)).await;
    let upstream = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let agent = register(dir.path(), &public, "gh", &upstream.url("/mcp"), "agent");
    let mut served = Served::start(
        dir.path(),
        port,
        &[
            "--otlp-endpoint",
            &receiver.url(),
            "--authorizer-url",
            &authz.url,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let r = client()
        .post(&agent.url)
        .bearer_auth(&agent.token)
        .header("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))
        .body(tools_call(1, "search"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let spans = receiver.trace(&unhex(trace), 4).await;
    let root = one(&spans, "POST /c/{address}");
    let authorize = one(&spans, "authorize");
    let asked = one(&spans, "authorizer");
    assert_eq!(authorize.parent, root.span_id);
    assert_eq!(asked.parent, authorize.span_id);
    assert_eq!(asked.kind, SpanKind::Client as i32);
    assert_eq!(asked.attributes["tessera.verdict"], "allow");
    assert_eq!(authorize.attributes["tessera.decided_by"], "authorizer");
    served.signal("TERM");
    served.read_to_end().await;
}

/// An OAuth credential's first call fetches a token: an `oauth.refresh`
/// client span in the call's trace, naming the credential and holding no
/// secret (the client secret, the token).
#[tokio::test]
async fn an_oauth_refresh_is_a_span_of_the_call_that_needed_it() {
    use crate::oauth::{AuthServer, CLIENT_ID, CLIENT_SECRET};
    let receiver = Receiver::start().await;
    let auth = AuthServer::start(3600, false).await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let (token_url, upstream) = (format!("{}/token", auth.base), format!("{}/mcp", auth.base));
    let o = tessera(dir.path())
        .args([
            "credential",
            "add",
            "saas",
            "--upstream",
            &upstream,
            "--scheme",
            "oauth2",
            "--token-url",
            &token_url,
            "--client-id",
            CLIENT_ID,
            "--client-secret-env",
            "CLIENT_SECRET",
        ])
        .env("CLIENT_SECRET", CLIENT_SECRET)
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = last_line(&cli(dir.path(), &["caller", "add", "agent"]));
    let url = last_line(&cli(
        dir.path(),
        &[
            "connection",
            "add",
            "--caller",
            "agent",
            "--credential",
            "saas",
            "--public-url",
            &public,
        ],
    ));
    let mut served = Served::start(
        dir.path(),
        port,
        &["--otlp-endpoint", &receiver.url()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let trace = "5af7651916cd43dd8448eb211c80319c";
    let r = client()
        .post(&url)
        .bearer_auth(&token)
        .header("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let spans = receiver.trace(&unhex(trace), 4).await;
    let root = one(&spans, "POST /c/{address}");
    let refresh = one(&spans, "oauth.refresh");
    assert_eq!(refresh.parent, root.span_id);
    assert_eq!(refresh.kind, SpanKind::Client as i32);
    assert_eq!(refresh.attributes["tessera.credential"], "saas");
    assert!(!refresh.error);
    assert_eq!(auth.token_requests(), 1);
    for s in &spans {
        for (k, v) in &s.attributes {
            assert!(!v.contains(CLIENT_SECRET), "{}: {k}={v}", s.name);
        }
    }
    served.signal("TERM");
    served.read_to_end().await;
}

/// `config check` checks the endpoint as `serve` does at start and shows
/// where spans go (found by a new user: a URL without its scheme passed
/// the check, then `serve` refused it).
#[test]
fn config_check_validates_the_endpoint_and_shows_where_spans_go() {
    let dir = Proxy::dir();
    let o = tessera(dir.path())
        .args(["config", "check", "--otlp-endpoint", "127.0.0.1:4318"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(out.contains("not an http:// or https:// URL"), "{out}");
    let o = tessera(dir.path())
        .args([
            "config",
            "check",
            "--otlp-endpoint",
            "http://127.0.0.1:4318/",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("traces-url") && l.contains("http://127.0.0.1:4318/v1/traces")),
        "{out}"
    );
    let o = tessera(dir.path())
        .args([
            "config",
            "check",
            "--otlp-endpoint",
            "http://127.0.0.1:4318",
        ])
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(out.contains("http/protobuf"), "{out}");
}
