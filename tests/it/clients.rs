//! Clients as they meet tessera (issue 25): a refused caller token reads
//! as one (not as an OAuth challenge), `/c/<id>/mcp` and `/c/<id>/sse` are
//! the address itself, and the 2024-11-05 HTTP+SSE transport's announced
//! endpoint is rewritten under the connection's address and routed back
//! to the path the upstream announced, for that caller only.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::support::*;

/// A 2024-11-05 server: `GET` answers a comment event, then
/// `event: endpoint` with the test's [`Plan`]'s endpoint as its data.
/// Uncoded, the bytes are cut at byte `at` of the endpoint event: the
/// first frame (the comment and the endpoint event's first `at` bytes)
/// goes at once, the second only once the test adds a permit to `gate`
/// (after the caller received the comment, so tessera read the first frame
/// alone). Coded, the coded bytes are cut at byte `at` and both frames go
/// at once. Any POST is recorded and answered 202.
struct LegacyServer {
    addr: SocketAddr,
    gate: Arc<Semaphore>,
    plan: Arc<Mutex<Plan>>,
    posts: Posts,
}

/// The POSTs the server received: target and `Authorization`.
type Posts = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[derive(Clone, Default)]
struct Plan {
    endpoint: String,
    at: usize,
    coding: Option<&'static str>,
    /// The endpoint event's bytes as given (uncoded), instead of the
    /// usual spelling.
    raw: Option<String>,
}

const EVENT_HEAD: &str = ": hello\n\n";

fn endpoint_event(ep: &str) -> String {
    format!("id: 7\nevent: endpoint\ndata: {ep}\n\n")
}

impl LegacyServer {
    async fn start() -> LegacyServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let plan = Arc::new(Mutex::new(Plan::default()));
        let posts = Arc::new(Mutex::new(Vec::new()));
        let (g, pl, p) = (gate.clone(), plan.clone(), posts.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (g, pl, p) = (g.clone(), pl.clone(), p.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let plan = pl.lock().unwrap().clone();
                        answer(req, plan, g.clone(), p.clone())
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        LegacyServer {
            addr,
            gate,
            plan,
            posts,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn plan(&self, endpoint: &str, at: usize, coding: Option<&'static str>) {
        *self.plan.lock().unwrap() = Plan {
            endpoint: endpoint.to_string(),
            at,
            coding,
            raw: None,
        };
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    plan: Plan,
    gate: Arc<Semaphore>,
    posts: Posts,
) -> Result<Response<Body>, Infallible> {
    if req.method() == http::Method::POST {
        let auth = req
            .headers()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_string());
        posts.lock().unwrap().push((req.uri().to_string(), auth));
        return Ok(Response::builder()
            .status(202)
            .body(http_body_util::Full::new(Bytes::from_static(b"Accepted")).boxed())
            .unwrap());
    }
    let ep = plan.endpoint;
    let mut b = Response::builder().header("content-type", "text/event-stream");
    let (first, second, gated) = match plan.coding {
        Some(coding) => {
            let all = compress(
                coding,
                format!("{EVENT_HEAD}{}", endpoint_event(&ep)).as_bytes(),
            );
            b = b.header("content-encoding", coding);
            let at = plan.at.min(all.len());
            (all[..at].to_vec(), all[at..].to_vec(), false)
        }
        None => {
            let event = plan.raw.unwrap_or_else(|| endpoint_event(&ep)).into_bytes();
            let mut first = EVENT_HEAD.as_bytes().to_vec();
            first.extend_from_slice(&event[..plan.at]);
            (first, event[plan.at..].to_vec(), true)
        }
    };
    let frames = futures_util::stream::unfold(0, move |n| {
        let (first, second, gate) = (first.clone(), second.clone(), gate.clone());
        async move {
            match n {
                0 => Some((Ok(Frame::data(Bytes::from(first))), 1)),
                1 => {
                    if gated {
                        gate.acquire().await.unwrap().forget();
                    }
                    Some((Ok(Frame::data(Bytes::from(second))), 2))
                }
                _ => None,
            }
        }
    });
    Ok(b.body(BodyExt::boxed(StreamBody::new(frames))).unwrap())
}

/// The whole body of a GET stream, or what came before it broke, and
/// whether it broke. With `gate`, a permit is added once the comment
/// event arrived.
async fn read_stream(a: &Agent, gate: Option<&Semaphore>) -> (String, bool) {
    let mut r = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut got = Vec::new();
    let mut opened = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .expect("the stream stalled")
        {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return (String::from_utf8(got).unwrap(), false),
            Err(_) => return (String::from_utf8(got).unwrap(), true),
        }
        if !opened && got.starts_with(EVENT_HEAD.as_bytes()) {
            opened = true;
            if let Some(g) = gate {
                g.add_permits(1);
            }
        }
    }
}

/// The connection id of an agent's URL.
fn connection_of(a: &Agent) -> String {
    a.url.rsplit("/c/").next().unwrap().to_string()
}

/// The endpoint the caller was told, from its stream's text.
fn announced(text: &str) -> String {
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no endpoint data in {text:?}"));
    data.to_string()
}

#[tokio::test]
async fn a_missing_or_unknown_caller_token_is_a_403_that_says_so_with_no_challenge() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let call = tools_call(1, "t");
    for (auth, says) in [
        (None, "no caller token"),
        (
            Some("Bearer tsr_wrong".to_string()),
            "does not know this caller token",
        ),
        (Some(format!("Basic {}", a.token)), "no caller token"),
        (
            Some(format!("Bearer {}x", a.token)),
            "does not know this caller token",
        ),
    ] {
        let mut rq = client().post(&a.url).body(call.clone());
        if let Some(h) = &auth {
            rq = rq.header("authorization", h);
        }
        let r = rq.send().await.unwrap();
        // Not 401: MCP clients answer any 401 with OAuth discovery
        // (Inspector: "Interactive OAuth requires a TTY").
        assert_eq!(r.status(), 403, "{auth:?}");
        assert!(r.headers().get("www-authenticate").is_none(), "{auth:?}");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
        // Refused before the body is read: no id to answer with.
        assert_eq!(v["id"], serde_json::Value::Null, "{auth:?}");
        assert_eq!(v["error"]["code"], -32001, "{auth:?}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{auth:?}: {msg}");
        assert!(msg.contains("'Authorization: Bearer <token>'"), "{msg}");
        assert!(!msg.contains(&a.token), "{msg}");
    }
    // A GET stream and a DELETE alike.
    for m in [http::Method::GET, http::Method::DELETE] {
        let r = client()
            .request(m.clone(), &a.url)
            .bearer_auth("tsr_wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{m}");
        assert!(r.headers().get("www-authenticate").is_none(), "{m}");
    }
    assert!(up.seen().is_empty(), "{:?}", up.seen());
}

/// `/c/<id>/mcp` and `/c/<id>/sse` are the address itself (Inspector picks
/// the transport by that last segment); deeper sub-paths are forwarded.
#[tokio::test]
async fn mcp_and_sse_after_the_address_reach_the_upstream_url_itself() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    for sub in ["", "/mcp", "/sse", "/mcp/x", "/mcp/"] {
        let r = client()
            .post(format!("{}{sub}", a.url))
            .bearer_auth(&a.token)
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{sub}");
    }
    let paths: Vec<String> = up.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/mcp", "/mcp", "/mcp", "/mcp/mcp/x", "/mcp/mcp/"]);
}

/// The endpoint event, cut at every byte across two frames (tessera read
/// the first alone), reaches the caller rewritten under its address; a
/// POST there reaches the path the upstream announced, with the stored
/// credential.
#[tokio::test]
async fn the_announced_endpoint_is_rewritten_whatever_byte_it_is_cut_at() {
    let up = LegacyServer::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("legacy", &up.url("/sse"), "agent").await;
    let prefix = format!("/c/{}/~sse/", connection_of(&a));
    let ep = "/message?sessionId=s-1";
    let mut told = None;
    for at in 0..=endpoint_event(ep).len() {
        up.plan(ep, at, None);
        let (text, broke) = read_stream(&a, Some(&up.gate)).await;
        assert!(!broke, "cut at {at}: {text:?}");
        let data = announced(&text);
        assert!(
            data.starts_with(&prefix) && data.ends_with("/message?sessionId=s-1"),
            "cut at {at}: {data}"
        );
        assert_eq!(
            text,
            format!("{EVENT_HEAD}id: 7\nevent: endpoint\ndata: {data}\n\n"),
            "cut at {at}"
        );
        // The same endpoint each time (the tag is a MAC, not random).
        assert_eq!(told.get_or_insert_with(|| data.clone()), &data);
    }
    // POSTed to: the announced path and query, with the stored credential
    // and never the caller's token.
    let r = client()
        .post(format!("{}{}", p.base(), told.unwrap()))
        .bearer_auth(&a.token)
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let posts = up.posts.lock().unwrap().clone();
    assert_eq!(
        posts,
        [(
            "/message?sessionId=s-1".to_string(),
            Some(format!("Bearer {SECRET}"))
        )]
    );
}

/// A gzip-coded stream: the endpoint is rewritten in what tessera decoded,
/// whatever byte of the coded stream the frames are cut at.
#[tokio::test]
async fn the_announced_endpoint_is_rewritten_in_a_compressed_stream() {
    let up = LegacyServer::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("legacy", &up.url("/sse"), "agent").await;
    let prefix = format!("/c/{}/~sse/", connection_of(&a));
    // Absolute, on the upstream's origin.
    let ep = up.url("/messages/?session_id=ab");
    let coded = compress(
        "gzip",
        format!("{EVENT_HEAD}{}", endpoint_event(&ep)).as_bytes(),
    );
    for at in 0..=coded.len() {
        up.plan(&ep, at, Some("gzip"));
        let (text, broke) = read_stream(&a, None).await;
        assert!(!broke, "cut at {at}: {text:?}");
        assert!(text.starts_with(EVENT_HEAD), "cut at {at}: {text:?}");
        let data = announced(&text);
        assert!(data.starts_with(&prefix), "cut at {at}: {data}");
        assert!(
            data.ends_with("/messages/?session_id=ab"),
            "cut at {at}: {data}"
        );
    }
}

/// An endpoint on another origin is never passed on nor followed; nor is
/// one whose path a server could read otherwise than a client: the stream
/// ends before that event.
#[tokio::test]
async fn a_hostile_endpoint_ends_the_stream_before_its_event() {
    let up = LegacyServer::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("legacy", &up.url("/sse"), "agent").await;
    let other = format!("http://127.0.0.1:{}/message", up.addr.port() + 1);
    for ep in [
        "http://evil.example/message?sessionId=1",
        "//evil.example/message",
        other.as_str(),
        "https://127.0.0.1/message",
        "/a/../message",
        "/%2e%2e/admin",
        "/a%2fb/message",
        "/a\\b",
        "/message;x",
    ] {
        up.plan(ep, 0, None);
        let (text, broke) = read_stream(&a, Some(&up.gate)).await;
        assert!(broke, "{ep}: {text:?}");
        assert_eq!(text, EVENT_HEAD, "{ep}");
    }
    assert!(up.posts.lock().unwrap().is_empty());
}

/// An announced endpoint is good for the caller it was announced to, on
/// that connection, for that path and query, and for POST only.
#[tokio::test]
async fn an_announced_endpoint_is_bound_to_its_caller_path_and_query() {
    let up = LegacyServer::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    up.plan("/message?sessionId=s-1", 0, None);
    let url = up.url("/sse");
    let a = p.agent("legacy", &url, "agent").await;
    let b = p.agent("legacy", &url, "other").await;
    let (text, _) = read_stream(&a, Some(&up.gate)).await;
    let data = announced(&text);
    let good = format!("{}{data}", p.base());
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let post = |url: String, token: &str| client().post(url).bearer_auth(token).body(body).send();
    // B at A's endpoint, or at its own address with A's tag.
    let b_conn = connection_of(&b);
    let a_conn = connection_of(&a);
    for (url, token) in [
        (good.clone(), b.token.as_str()),
        (good.replace(&a_conn, &b_conn), b.token.as_str()),
        // A elsewhere on the upstream's origin, another session, no tag.
        (good.replace("/message?", "/admin?"), a.token.as_str()),
        (
            good.replace("sessionId=s-1", "sessionId=s-2"),
            a.token.as_str(),
        ),
        (good.replace("?sessionId=s-1", ""), a.token.as_str()),
        (format!("{}/~sse/x/message", a.url), a.token.as_str()),
    ] {
        let r = post(url.clone(), token).await.unwrap();
        assert_eq!(r.status(), 404, "{url}");
    }
    let r = client()
        .get(&good)
        .bearer_auth(&a.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(up.posts.lock().unwrap().is_empty());
    let r = post(good, &a.token).await.unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(up.posts.lock().unwrap().len(), 1);
}

/// A refused call at an announced endpoint gets an error status: the
/// 2024-11-05 client reads answers on the stream and drops a 2xx POST
/// answer unread, so a refusal written as a 200 tool result would leave
/// its call waiting.
#[tokio::test]
async fn a_refused_call_at_an_announced_endpoint_is_an_error_status() {
    let up = LegacyServer::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    up.plan("/message?sessionId=s-1", 0, None);
    let a = p.agent("legacy", &up.url("/sse"), "agent").await;
    let (text, _) = read_stream(&a, Some(&up.gate)).await;
    let endpoint = format!("{}{}", p.base(), announced(&text));
    let r = client()
        .post(&endpoint)
        .bearer_auth(&a.token)
        .body(tools_call(1, "delete_repo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("delete_repo"), "{v}");
    // At the connection's own address, the same refusal stays a tool
    // result (Streamable HTTP reads the POST's answer).
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(1, "delete_repo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(up.posts.lock().unwrap().is_empty());
}

/// The event is read as an `EventSource` reads it: `event:` with or
/// without a space, CR LF line ends, comments and other fields kept, the
/// last `event` field deciding; other events pass untouched. Data lines
/// joined with a newline are no URL a client reads alike: refused.
#[tokio::test]
async fn endpoint_events_are_read_as_an_event_source_reads_them() {
    let up = LegacyServer::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("legacy", &up.url("/sse"), "agent").await;
    let prefix = format!("/c/{}/~sse/", connection_of(&a));
    for (raw, kept) in [
        (
            "event:endpoint\r\ndata:/message?sessionId=1\r\n\r\n",
            vec!["event:endpoint"],
        ),
        (
            "event: endpoint\n: a comment\ndata: /message\nid: 3\n\n",
            vec!["event: endpoint", ": a comment", "id: 3"],
        ),
    ] {
        up.posts.lock().unwrap().clear();
        *up.plan.lock().unwrap() = Plan {
            raw: Some(raw.to_string()),
            ..Plan::default()
        };
        let (text, broke) = read_stream(&a, Some(&up.gate)).await;
        assert!(!broke, "{raw:?}: {text:?}");
        let event = text.strip_prefix(EVENT_HEAD).unwrap();
        let lines: Vec<&str> = event.lines().filter(|l| !l.is_empty()).collect();
        let data = lines.iter().find_map(|l| l.strip_prefix("data: ")).unwrap();
        let want = raw
            .split("data:")
            .nth(1)
            .unwrap()
            .trim()
            .split('\n')
            .next()
            .unwrap();
        assert!(
            data.starts_with(&prefix) && data.ends_with(want.trim()),
            "{raw:?}: {text:?}"
        );
        let others: Vec<&str> = lines
            .into_iter()
            .filter(|l| !l.starts_with("data"))
            .collect();
        assert_eq!(others, kept, "{raw:?}");
    }
    // Not endpoint events: passed as sent.
    for raw in [
        "event: endpoint\nevent: message\ndata: /message\n\n",
        "event: message\ndata: {\"endpoint\":\"http://evil.example/\"}\n\n",
        "event : endpoint\ndata: http://evil.example/\n\n",
        "event: endpoint\n\n",
    ] {
        *up.plan.lock().unwrap() = Plan {
            raw: Some(raw.to_string()),
            ..Plan::default()
        };
        let (text, broke) = read_stream(&a, Some(&up.gate)).await;
        assert!(!broke, "{raw:?}");
        assert_eq!(text, format!("{EVENT_HEAD}{raw}"));
    }
    // Two data lines: "/mess\nage", which WHATWG parsers read as
    // "/message" and others not.
    *up.plan.lock().unwrap() = Plan {
        raw: Some("event: endpoint\ndata: /mess\ndata: age\n\n".into()),
        ..Plan::default()
    };
    let (text, broke) = read_stream(&a, Some(&up.gate)).await;
    assert!(broke);
    assert_eq!(text, EVENT_HEAD);
}
