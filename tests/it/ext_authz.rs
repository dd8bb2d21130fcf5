//! The external authorizer: asked after the policies allow, with a JSON
//! description of the request and nothing secret in it; its deny and ask
//! stand; a timeout, a 500 or a garbage answer is never an allow; a hanging
//! authorizer's connection is closed when the wait ends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tessera::config::{AuthorizerConfig, OnFailure};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::support::*;

/// How the test authorizer answers.
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    Answer(&'static str),
    Status500,
    Hang,
}

pub(crate) struct Authz {
    pub(crate) url: String,
    mode: Arc<Mutex<Mode>>,
    questions: Arc<Mutex<Vec<serde_json::Value>>>,
    closed: Arc<Notify>,
}

impl Authz {
    pub(crate) async fn start(mode: Mode) -> Authz {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/authorize", listener.local_addr().unwrap());
        let mode = Arc::new(Mutex::new(mode));
        let questions = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(Notify::new());
        let (m, q, c) = (mode.clone(), questions.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (m, q, c) = (m.clone(), q.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (m, q) = (m.clone(), q.clone());
                        async move {
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            q.lock()
                                .unwrap()
                                .push(serde_json::from_slice(&body).unwrap());
                            let mode = *m.lock().unwrap();
                            let (status, text) = match mode {
                                Mode::Answer(t) => (200, t),
                                Mode::Status500 => (500, "oops"),
                                Mode::Hang => std::future::pending().await,
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(text)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    c.notify_waiters();
                });
            }
        });
        Authz {
            url,
            mode,
            questions,
            closed,
        }
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }

    fn asked(&self) -> usize {
        self.questions.lock().unwrap().len()
    }
}

async fn proxy_with(authz: &Authz, timeout_ms: u64, on_failure: OnFailure) -> Proxy {
    let url = url::Url::parse(&authz.url).unwrap();
    Proxy::start_with_policies(
        Proxy::dir(),
        move |c| {
            c.authorizer = Some(AuthorizerConfig {
                url,
                timeout: Duration::from_millis(timeout_ms),
                on_failure,
            });
            c.allowed_origins = vec!["http://127.0.0.1".into()];
        },
        policies_with(&["tool-deny-list"]),
    )
    .await
}

async fn call(a: &Agent, tool: &str) -> (u16, serde_json::Value) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{{"q":"x"}}}}}}"#
    );
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("origin", "http://127.0.0.1")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn tool_text(v: &serde_json::Value) -> &str {
    assert_eq!(v["result"]["isError"], true, "{v}");
    v["result"]["content"][0]["text"].as_str().unwrap()
}

#[tokio::test]
async fn allow_deny_and_ask_answers_stand() {
    let authz = Authz::start(Mode::Answer(r#"{"decision":"allow","reason":"fine"}"#)).await;
    let up = Upstream::start().await;
    let p = proxy_with(&authz, 2_000, OnFailure::Deny).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let (s, v) = call(&a, "search").await;
    assert_eq!(
        (s, &v["result"]["echo"]),
        (200, &serde_json::json!("tools/call")),
        "{v}"
    );
    // What the authorizer was told: the request, never a secret.
    let q = authz.questions.lock().unwrap()[0].clone();
    assert_eq!(q["caller"], "agent");
    assert_eq!(q["groups"], serde_json::json!([]));
    assert_eq!(q["connection"], a.url.rsplit('/').next().unwrap());
    assert_eq!(q["credential"], "gh");
    assert_eq!(q["upstream_host"], "127.0.0.1");
    assert_eq!(
        (&q["action"], &q["method"]),
        (
            &serde_json::json!("tools/call"),
            &serde_json::json!("tools/call")
        )
    );
    assert_eq!(q["tool"], "search");
    assert_eq!(q["arguments"], serde_json::json!({"q": "x"}));
    assert_eq!(q["http_method"], "POST");
    assert_eq!(q["origin"], "http://127.0.0.1");
    assert!(q["time"].as_str().unwrap().ends_with('Z'));
    let text = q.to_string();
    assert!(!text.contains(SECRET) && !text.contains(&a.token), "{text}");

    authz.set(Mode::Answer(
        r#"{"decision":"deny","reason":"not on Fridays"}"#,
    ));
    let (s, v) = call(&a, "search").await;
    assert_eq!(s, 200);
    assert!(tool_text(&v).contains("not on Fridays"), "{v}");

    authz.set(Mode::Answer(
        r#"{"decision":"ask","reason":"large change"}"#,
    ));
    let (_, v) = call(&a, "search").await;
    assert!(tool_text(&v).contains("approval ap_"), "{v}");
    let list = String::from_utf8(p.cli(&["approval", "list"]).stdout).unwrap();
    assert!(list.contains("authorizer: large change"), "{list}");
    assert_eq!(up.seen().len(), 1, "only the allowed call was forwarded");

    // A policy deny is final: the authorizer is not asked.
    let asked = authz.asked();
    let (s, v) = call(&a, "delete_repo").await;
    assert_eq!(s, 200);
    assert!(tool_text(&v).contains("no-destructive-tools"), "{v}");
    assert_eq!(authz.asked(), asked);

    // The audit trail names the authorizer's reason.
    let rows = audit_rows(&p).await;
    let reasons: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.verdict.as_str(), r.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(reasons[0], ("allow", "own-connections; authorizer: fine"));
    assert_eq!(
        reasons[1],
        ("deny", "own-connections; authorizer: not on Fridays")
    );
    assert_eq!(reasons[2].0, "ask");
    assert!(
        reasons[2].1.ends_with("authorizer: large change"),
        "{reasons:?}"
    );

    // `/metrics` says who decided: the authorizer's three answers, the
    // policy's deny.
    let text = tessera::admin::ops::metrics_text(&p.state);
    for line in [
        "tessera_decisions_total{action=\"allow\",source=\"authorizer\"} 1",
        "tessera_decisions_total{action=\"deny\",source=\"authorizer\"} 1",
        "tessera_decisions_total{action=\"ask\",source=\"authorizer\"} 1",
        "tessera_decisions_total{action=\"deny\",source=\"policy\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[tokio::test]
async fn failures_are_never_an_allow() {
    let authz = Authz::start(Mode::Status500).await;
    let up = Upstream::start().await;
    let p = proxy_with(&authz, 300, OnFailure::Deny).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let (s, v) = call(&a, "search").await;
    assert_eq!(s, 200);
    assert!(tool_text(&v).contains("HTTP 500"), "{v}");

    for garbage in [
        "not json",
        r#"{"decision":"yes"}"#,
        r#"{"allow":true}"#,
        r#"["allow"]"#,
    ] {
        authz.set(Mode::Answer(garbage));
        let (s, v) = call(&a, "search").await;
        assert_eq!(s, 200);
        assert!(
            tool_text(&v).contains("authorizer failed"),
            "{garbage}: {v}"
        );
    }

    // A hanging authorizer: denied at the timeout, and its connection is
    // closed (the waiting exchange was dropped, not left behind).
    authz.set(Mode::Hang);
    let closed = authz.closed.notified();
    let (s, v) = call(&a, "search").await;
    assert_eq!(s, 200);
    assert!(tool_text(&v).contains("no answer within 300 ms"), "{v}");
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the hanging authorizer's connection stayed open");
    assert!(
        up.seen().is_empty(),
        "a failed authorization reached the upstream"
    );

    // An unreachable authorizer, and a GET stream: a 403, not a forward.
    let unreachable = Authz::start(Mode::Status500).await;
    let p2 = proxy_with(
        &Authz {
            url: "http://127.0.0.1:9/authorize".into(),
            ..unreachable
        },
        300,
        OnFailure::Deny,
    )
    .await;
    let b = p2.agent("gh", &up.url("/sse"), "agent").await;
    let r = client()
        .get(&b.url)
        .bearer_auth(&b.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("stream/open") && msg.contains("could not connect"),
        "{msg}"
    );
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn failure_can_mean_ask() {
    let authz = Authz::start(Mode::Status500).await;
    let up = Upstream::start().await;
    let p = proxy_with(&authz, 300, OnFailure::Ask).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (s, v) = call(&a, "search").await;
    assert_eq!(s, 200);
    let text = tool_text(&v);
    assert!(
        text.contains("approval ap_") && text.contains("pending"),
        "{text}"
    );
    assert!(up.seen().is_empty());
}

/// An authorizer behind a private CA is reached when the CA is configured
/// for upstream TLS (`--upstream-ca-file`), as an upstream is, and not
/// before: the handshake fails and the call is refused, never allowed.
#[tokio::test]
async fn the_authorizer_trusts_the_configured_certificate_authorities() {
    let authz = TlsUpstream::start(&[b"http/1.1"]).await;
    let url = url::Url::parse(&format!("https://localhost:{}/authorize", authz.port)).unwrap();
    let up = Upstream::start().await;
    let start = |roots: Option<rustls::RootCertStore>| {
        let url = url.clone();
        Proxy::start_with(Proxy::dir(), move |c| {
            c.authorizer = Some(AuthorizerConfig {
                url,
                timeout: Duration::from_secs(5),
                on_failure: OnFailure::Deny,
            });
            c.allowed_origins = vec!["http://127.0.0.1".into()];
            if let Some(r) = roots {
                c.upstream_roots = Arc::new(r);
            }
        })
    };

    let p = start(None).await;
    let a = p.agent("gh", &up.url("/echo"), "agent").await;
    let (s, v) = call(&a, "search").await;
    assert_eq!(s, 200);
    assert!(tool_text(&v).contains("authorizer"), "{v}");
    assert_eq!(
        authz.seen.lock().unwrap().len(),
        0,
        "reached without its CA"
    );

    let mut roots = rustls::RootCertStore::empty();
    roots.add(authz.cert.clone()).unwrap();
    let p = start(Some(roots)).await;
    let a = p.agent("gh", &up.url("/echo"), "agent").await;
    let (s, _) = call(&a, "search").await;
    assert_eq!(s, 200);
    assert_eq!(
        authz.seen.lock().unwrap().len(),
        1,
        "not reached with its CA"
    );
}
