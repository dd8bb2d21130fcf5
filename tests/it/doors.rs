//! The doors besides the front one (issue 23): a sub-path the upstream
//! would read otherwise, headers and query parameters in which a caller
//! vouches for itself or carries a credential, the throttle telling which
//! addresses exist, log lines forged with Unicode line breaks, and an
//! upstream's redirect headers pointing back into tessera. Every case is
//! in tests/hostile/README.md.

use std::convert::Infallible;
use std::net::IpAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::*;

/// POST `body` to `target` as raw bytes (an HTTP client library would
/// normalise the path); the status and the JSON body.
async fn raw_post(p: &Proxy, target: &str, token: &str, body: &str) -> (u16, serde_json::Value) {
    let req = format!(
        "POST {target} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = raw_request(p.addr, req.as_bytes()).await;
    let status = got
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {got:?}"));
    let body = got.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// Assert `/metrics` counts `n` refusals for `reason`.
fn assert_refusals(p: &Proxy, reason: &str, n: u64) {
    let metrics = p
        .state
        .metrics
        .render(&tessera::telemetry::metrics::Gauges {
            audit_queue_depth: 0,
            audit_failing: false,
            ..Default::default()
        });
    let line = format!("tessera_refusals_total{{reason=\"{reason}\"}} {n}");
    assert!(
        metrics.lines().any(|l| l == line),
        "no {line} in\n{metrics}"
    );
}

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

/// Each sub-path form a server could read otherwise than tessera is
/// refused with 400 naming its rule, and the upstream sees nothing; a
/// plain sub-path is forwarded in its normal form.
#[tokio::test]
async fn hostile_sub_paths_are_refused_by_rule_and_never_forwarded() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| c.limits.caller.rate = 0.0).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let cases = [
        ("/..;/admin", "path_parameter"),
        ("/a;b", "path_parameter"),
        ("/a%3Bb", "path_parameter"),
        ("/..%2fadmin", "path_encoded_separator"),
        ("/a%2Fb", "path_encoded_separator"),
        ("/%2e%2e%2fadmin", "path_encoded_separator"),
        ("/a%5cb", "path_encoded_separator"),
        ("/a%5C..%5Cb", "path_encoded_separator"),
        ("/a\\..\\b", "path_backslash"),
        ("/%252e%252e/admin", "path_double_encoding"),
        ("/a%252Fb", "path_double_encoding"),
        ("/%25%32%65%25%32%65/admin", "path_double_encoding"),
        ("/%%32e", "path_bad_escape"),
        ("/..", "path_dot_segment"),
        ("/./x", "path_dot_segment"),
        ("/%2e%2e/admin", "path_dot_segment"),
        ("/.%2E/admin", "path_dot_segment"),
        ("/a//b", "path_empty_segment"),
    ];
    for (sub, rule) in cases {
        let (status, v) = raw_post(&p, &format!("{path}{sub}"), &a.token, PING).await;
        assert_eq!(status, 400, "{sub}: {v}");
        assert_eq!(v["error"]["code"], -32600, "{sub}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("rule {rule}")), "{sub}: {msg}");
    }
    for rule in [
        "path_parameter",
        "path_encoded_separator",
        "path_backslash",
        "path_double_encoding",
        "path_bad_escape",
        "path_dot_segment",
        "path_empty_segment",
    ] {
        let n = cases.iter().filter(|(_, r)| *r == rule).count() as u64;
        assert_refusals(&p, rule, n);
    }
    assert!(up.seen().is_empty(), "the upstream saw {:?}", up.seen());

    // A plain sub-path is forwarded, in the form policies see: escapes of
    // unreserved characters decoded, others in upper case.
    let (status, _) = raw_post(
        &p,
        &format!("{path}/files/%61b%2dc/my%2afile/"),
        &a.token,
        PING,
    )
    .await;
    assert_eq!(status, 200);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/mcp/files/ab-c/my%2Afile/");
}

/// Policies read the sub-path as `context.path`, in its normal form: a
/// rule on `/admin` also holds for `/%61dmin`.
#[tokio::test]
async fn a_policy_on_context_path_decides_by_the_forwarded_sub_path() {
    let up = Upstream::start().await;
    let policies = tessera::authz::cedar::Policies::from_texts(
        "test",
        None,
        vec![
            (
                "default.cedar".into(),
                tessera::authz::cedar::BUILTIN_DEFAULT.into(),
            ),
            (
                "paths.cedar".into(),
                "@id(\"no-admin\")\nforbid (principal, action, resource) when { context.path like \"/admin*\" };\n"
                    .into(),
            ),
        ],
    )
    .unwrap();
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    for sub in ["/admin", "/admin/users", "/%61dmin", "/%61%64min/x"] {
        let (status, v) = raw_post(&p, &format!("{path}{sub}"), &a.token, PING).await;
        assert_eq!(status, 403, "{sub}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("no-admin"),
            "{v}"
        );
    }
    assert!(up.seen().is_empty(), "the upstream saw {:?}", up.seen());
    for sub in ["", "/public", "/public%20x"] {
        let (status, v) = raw_post(&p, &format!("{path}{sub}"), &a.token, PING).await;
        assert_eq!(status, 200, "{sub}: {v}");
    }
    let paths: Vec<String> = up.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/mcp", "/mcp/public", "/mcp/public%20x"]);
}

/// Headers a caller could vouch for itself with, and headers named like
/// a credential, never reach the upstream; with `--forwarded set` tessera
/// says who the caller is itself, truthfully.
#[tokio::test]
async fn callers_cannot_vouch_for_themselves_or_bring_their_own_credentials() {
    let up = Upstream::start().await;
    let forged = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-host", "admin.internal"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-user", "root"),
        ("x-forwarded-prefix", "/admin"),
        ("forwarded", "for=6.6.6.6;proto=https"),
        ("x-real-ip", "6.6.6.6"),
        ("x-original-url", "/admin/wipe"),
        ("x-rewrite-url", "/admin/wipe"),
        ("x-http-method-override", "DELETE"),
        ("x-http-method", "DELETE"),
        ("x-method-override", "DELETE"),
        ("x-client-ip", "6.6.6.6"),
        ("true-client-ip", "6.6.6.6"),
        ("cf-connecting-ip", "6.6.6.6"),
        ("x-api-key", "callers-own-key"),
        ("api-key", "callers-own-key"),
        ("x-auth-token", "callers-own-token"),
        ("x-access-token", "callers-own-token"),
        ("cookie", "session=callers"),
        ("proxy-authorization", "Basic Y2FsbGVyOnB3"),
        ("x-session-token", "s"),
        ("x-client-secret", "s"),
        ("x-db-password", "s"),
        ("x-upstream-credential", "s"),
    ];
    for forwarded in [false, true] {
        let p = Proxy::start_with(Proxy::dir(), |c| c.forwarded = forwarded).await;
        let a = p.agent("gh", &up.url("/mcp"), "agent").await;
        let session = a.session().await;
        let before = up.seen().len();
        let mut req = client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .header("mcp-session-id", &session)
            .header("x-request-id", "r-1")
            .body(PING);
        for (n, v) in forged {
            req = req.header(n, v);
        }
        assert_eq!(req.send().await.unwrap().status(), 200);
        let seen = up.seen();
        assert_eq!(seen.len(), before + 1);
        let h = &seen[before].headers;
        for (n, _) in forged {
            if forwarded && (n == "forwarded" || n == "x-forwarded-for") {
                continue;
            }
            assert!(!h.contains_key(n), "{n} reached the upstream: {h:?}");
        }
        for v in h.values() {
            let v = v.to_str().unwrap_or("");
            assert!(
                !v.contains("6.6.6.6") && !v.contains("callers") && !v.contains("admin"),
                "{v}"
            );
        }
        assert_eq!(h["authorization"], format!("Bearer {SECRET}"));
        assert_eq!(h["mcp-session-id"], "sess-1");
        assert_eq!(h["x-request-id"], "r-1");
        if forwarded {
            let all = |n: &str| h.get_all(n).iter().collect::<Vec<_>>();
            assert_eq!(all("forwarded"), ["for=127.0.0.1;proto=http"]);
            assert_eq!(all("x-forwarded-for"), ["127.0.0.1"]);
        }
    }
}

/// A query parameter named like a credential is refused (400), not
/// dropped: the caller learns why. Other parameters pass.
#[tokio::test]
async fn credential_query_parameters_are_refused() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let queries = [
        "access_token=t",
        "a=1&TOKEN=t",
        "api_key=k",
        "apikey=k",
        "Api-Key=k",
        "key=k",
        "secret=s",
        "password=p",
        "client_secret=s",
        "auth=a",
        "%61ccess_token=t",
    ];
    for q in queries {
        let r = client()
            .post(format!("{}?{q}", a.url))
            .bearer_auth(&a.token)
            .body(PING)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], -32600);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("rule query_credential"),
            "{v}"
        );
    }
    assert_refusals(&p, "query_credential", queries.len() as u64);
    assert!(up.seen().is_empty(), "the upstream saw {:?}", up.seen());
    let r = client()
        .post(format!("{}?page=2&max_tokens=5&sessionId=s", a.url))
        .bearer_auth(&a.token)
        .body(PING)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.seen()[0].path, "/mcp?page=2&max_tokens=5&sessionId=s");
}

/// With wrong tokens, an address that exists and a random one answer the
/// same sequence of statuses, each failure from a new source (so that
/// only the address is counted).
#[tokio::test]
async fn an_existing_address_and_a_random_one_answer_wrong_tokens_alike() {
    let up = Upstream::start().await;
    // A tessera each: two addresses of one tessera may share a throttle
    // slot by chance (see `limits::AuthThrottle`).
    let real = Proxy::start(Proxy::dir()).await;
    let a = real.agent("gh", &up.url("/mcp"), "agent").await;
    let other = Proxy::start(Proxy::dir()).await;
    let b = other.agent("gh", &up.url("/mcp"), "agent").await;
    let id_len = b.url.rsplit('/').next().unwrap().len();
    let random: String = {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        (0..id_len)
            .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
            .collect()
    };
    let random_url = format!("{}/c/{random}", other.base());
    let statuses = |url: String, net: u8| async move {
        let mut got = Vec::new();
        for i in 1..=13u8 {
            let c = reqwest::Client::builder()
                .no_proxy()
                .local_address(IpAddr::from([127, net, 0, i]))
                .build()
                .unwrap();
            let r = c
                .post(&url)
                .bearer_auth("not-a-token-of-anyone")
                .body(PING)
                .send()
                .await
                .unwrap();
            got.push(r.status().as_u16());
        }
        got
    };
    let existing = statuses(a.url.clone(), 31).await;
    let unknown = statuses(random_url, 32).await;
    let mut expected = vec![403; 11];
    expected.extend([429, 429]);
    assert_eq!(existing, expected);
    assert_eq!(unknown, existing, "a random address answers otherwise");
    assert!(up.seen().is_empty());
}

/// Caller-chosen text (a tool name, a method) holding U+2028, U+2029,
/// U+0085 or a bidirectional control is escaped in text and JSON logs.
#[tokio::test]
async fn unicode_line_breaks_never_forge_a_log_line() {
    let hostile = "x\u{2028}INFO tessera::access forged=1\u{2029}\u{85}\u{202e}y";
    for format in ["text", "json"] {
        let up = Upstream::start().await;
        let dir = Proxy::dir();
        let port = Served::free_port();
        let a = register(
            dir.path(),
            &format!("http://127.0.0.1:{port}"),
            "gh",
            &up.url("/mcp"),
            "agent",
        );
        let mut served = Served::start(dir.path(), port, &["--log-format", format], &[]).await;
        let call = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name": hostile, "arguments":{}}});
        let method = serde_json::json!({"jsonrpc":"2.0","id":2,"method": hostile});
        for body in [call, method] {
            let r = client()
                .post(&a.url)
                .bearer_auth(&a.token)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        // The second access line (the method's) comes last; it is awaited
        // in its escaped form.
        served
            .wait_for(match format {
                "json" => r#""rpc_method":"x\u2028INFO"#,
                _ => r#"rpc_method="x\u{2028}INFO"#,
            })
            .await;
        let access: Vec<&str> = served
            .log
            .lines()
            .filter(|l| l.contains("forged=1"))
            .collect();
        assert_eq!(access.len(), 2, "{}", served.log);
        for c in ['\u{2028}', '\u{2029}', '\u{85}', '\u{202e}'] {
            assert!(
                !served.log.contains(c),
                "{c:?} raw in the log: {}",
                served.log
            );
        }
        for line in access {
            if format == "json" {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let field = if v["tool"].is_null() {
                    "rpc_method"
                } else {
                    "tool"
                };
                assert_eq!(v[field], hostile, "{line}");
                assert!(
                    line.contains(r"\u2028") && line.contains(r"\u0085"),
                    "{line}"
                );
            } else {
                assert!(
                    line.contains(r"\u{2028}") && line.contains(r"\u{85}"),
                    "{line}"
                );
            }
        }
        served.signal("TERM");
        served.read_to_end().await;
    }
}

/// An upstream that answers 302 with `Location`, `Content-Location`,
/// `Link` and `Refresh` all pointing at the query's `to`.
async fn redirecting_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let to: String =
                        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                            .find(|(k, _)| k == "to")
                            .map(|(_, v)| v.into_owned())
                            .unwrap_or_default();
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(302)
                            .header("location", &to)
                            .header("content-location", &to)
                            .header("link", format!("<{to}>; rel=preload"))
                            .header("refresh", format!("0; url={to}"))
                            .header("x-kept", "1")
                            .body(Empty::<Bytes>::new().boxed())
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// `Link` and `Refresh` never pass; `Location` and `Content-Location` pass
/// only on the upstream's own origin and never into tessera, however it is
/// spelled.
#[tokio::test]
async fn an_upstreams_redirect_headers_never_point_into_tessera_or_elsewhere() {
    let up = redirecting_upstream().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &format!("http://{up}/mcp"), "agent").await;
    let port = p.addr.port();
    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for to in [
        format!("http://[::ffff:127.0.0.1]:{port}/c/x"),
        format!("http://0.0.0.0:{port}/c/x"),
        format!("http://localhost.:{port}/c/x"),
        format!("http://127.1:{port}/c/x"),
        format!("http://2130706433:{port}/c/x"),
        format!("http://127.0.0.2:{port}/c/x"),
        "http://[::1]:7471/v1/credentials".to_string(),
        "/c/another".to_string(),
        "https://elsewhere.example/phish".to_string(),
        // The upstream's own origin, which is a loopback one here: the
        // caller's client would reach tessera's host through it.
        format!("http://{up}/mcp/v2"),
    ] {
        let q: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("to", &to)
            .finish();
        let r = c
            .post(format!("{}?{q}", a.url))
            .bearer_auth(&a.token)
            .body(PING)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 302, "{to}");
        let h = r.headers();
        assert_eq!(h["x-kept"], "1");
        for gone in ["location", "content-location", "link", "refresh"] {
            assert!(!h.contains_key(gone), "{to}: {gone} passed: {h:?}");
        }
    }
}

/// `--forwarded` is a setting like the others: flag, `TESSERA_FORWARDED`,
/// settings-file key; anything but off or set is refused.
#[test]
fn the_forwarded_setting_is_read_from_env_and_checked() {
    let dir = Proxy::dir();
    let out = tessera(dir.path())
        .args(["config", "check"])
        .env("TESSERA_FORWARDED", "set")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("forwarded"))
        .unwrap_or_else(|| panic!("no forwarded in {text}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["forwarded", "set", "(env)"]
    );
    let out = tessera(dir.path())
        .args(["config", "check", "--forwarded", "sometimes"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A session belongs to the caller and connection that opened it: with
/// one injected credential the upstream cannot tell callers apart, so
/// another caller's session id (or the upstream's bare one, or one opened
/// on another connection) is answered 404 and never reaches the upstream,
/// on POST, GET and DELETE alike.
#[tokio::test]
async fn a_session_belongs_to_the_caller_and_connection_that_opened_it() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "alice").await;
    let b = p.agent("gh", &up.url("/mcp"), "bob").await;
    // Alice's second connection to the same credential.
    let o = p.cli(&[
        "connection",
        "add",
        "--caller",
        "alice",
        "--credential",
        "gh",
        "--public-url",
        &p.base(),
    ]);
    let a2 = Agent {
        token: a.token.clone(),
        url: String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .unwrap()
            .trim()
            .to_string(),
    };
    p.synced().await;
    let b_session = b.session().await;
    let a_session = a.session().await;
    assert_ne!(
        a_session, b_session,
        "bound to the caller, not only the upstream's id"
    );

    let send = |agent: &Agent, method: http::Method, session: &str| {
        let mut req = client()
            .request(method.clone(), &agent.url)
            .bearer_auth(&agent.token)
            .header("mcp-session-id", session);
        if method == http::Method::POST {
            req = req.body(PING);
        }
        req.send()
    };
    let before = up.seen().len();
    for method in [http::Method::POST, http::Method::GET, http::Method::DELETE] {
        for (who, session) in [
            (&a, b_session.as_str()),
            (&a2, a_session.as_str()),
            (&a, "sess-1"),
            (&a, &format!("sess-1.{}", &b_session[7..])),
        ] {
            let r = send(who, method.clone(), session).await.unwrap();
            assert_eq!(r.status(), 404, "{method} with {session}");
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], -32001, "{v}");
        }
    }
    assert_eq!(
        up.seen().len(),
        before,
        "a foreign session reached the upstream"
    );

    // Each caller goes on with its own, as the upstream knows it.
    for (who, session) in [(&a, &a_session), (&b, &b_session)] {
        let r = send(who, http::Method::POST, session).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["mcp-session-id"], session.as_str());
    }
    let seen = up.seen();
    assert_eq!(seen.len(), before + 2);
    for s in &seen[before..] {
        assert_eq!(s.headers["mcp-session-id"], "sess-1");
    }
}
