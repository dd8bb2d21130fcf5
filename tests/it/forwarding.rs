//! The forwarding path: strip, inject, pass through, filter back.

use crate::support::*;

#[tokio::test]
async fn forwards_with_the_stored_credential_and_never_the_callers() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let p = Proxy::start(dir).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let session = a.session().await;
    let body = serde_json::json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
        "params":{"name":"search","arguments":{"owner":"octo"}}})
    .to_string();
    let r = client()
        .post(format!("{}/sub/path?x=1", a.url))
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("cookie", "caller=1")
        .header("proxy-authorization", "Basic eA==")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "search")
        .header("mcp-param-owner", "octo")
        .header("last-event-id", "e9")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Filtered on the way back; the session id passes, bound to the
    // caller (`tessera::proxy::session`).
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.headers().get("www-authenticate").is_none());
    assert_eq!(r.headers()["mcp-session-id"], session.as_str());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["result"]["echo"], "tools/call");
    assert_eq!(v["id"], 7);

    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    let s = &seen[1];
    assert_eq!(s.path, "/mcp/sub/path?x=1");
    assert_eq!(s.body, body.as_bytes(), "body forwarded byte for byte");
    let auth: Vec<_> = s.headers.get_all("authorization").iter().collect();
    assert_eq!(auth, [format!("Bearer {SECRET}").as_str()]);
    assert!(
        !format!("{:?}", s.headers).contains(&a.token),
        "caller token reached the upstream"
    );
    for gone in ["cookie", "proxy-authorization"] {
        assert!(s.headers.get(gone).is_none(), "{gone} reached the upstream");
    }
    for (k, v) in [
        ("mcp-session-id", "sess-1"),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "search"),
        ("mcp-param-owner", "octo"),
        ("last-event-id", "e9"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        ("host", up.addr.to_string().as_str()),
    ] {
        assert_eq!(
            s.headers.get(k).map(|v| v.to_str().unwrap()),
            Some(v),
            "{k}"
        );
    }
}

#[tokio::test]
async fn header_and_basic_schemes_inject_their_header() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let o = p.cli(&[
        "credential",
        "add",
        "keyed",
        "--upstream",
        &up.url("/mcp"),
        "--scheme",
        "header",
        "--header-name",
        "X-Api-Key",
        "--secret-env",
        "TEST_SECRET",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = p.cli(&[
        "credential",
        "add",
        "basic",
        "--upstream",
        &up.url("/mcp"),
        "--scheme",
        "basic",
        "--username",
        "bot",
        "--secret-env",
        "TEST_SECRET",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = last_line(&p.cli(&["caller", "add", "a"]));
    let keyed = last_line(&p.cli(&[
        "connection",
        "add",
        "--caller",
        "a",
        "--credential",
        "keyed",
        "--public-url",
        &p.base(),
    ]));
    let basic = last_line(&p.cli(&[
        "connection",
        "add",
        "--caller",
        "a",
        "--credential",
        "basic",
        "--public-url",
        &p.base(),
    ]));
    p.synced().await;
    let r = client()
        .post(&basic)
        .bearer_auth(&token)
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .post(&keyed)
        .bearer_auth(&token)
        .header("x-api-key", "forged")
        .body(tools_call(2, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = up.seen();
    let b = &seen[0].headers;
    use base64::Engine;
    let expect = base64::engine::general_purpose::STANDARD.encode(format!("bot:{SECRET}"));
    assert_eq!(b["authorization"], format!("Basic {expect}").as_str());
    let k = &seen.last().unwrap().headers;
    assert_eq!(k.get_all("x-api-key").iter().collect::<Vec<_>>(), [SECRET]);
    assert!(
        k.get("authorization").is_none(),
        "the caller's Authorization was forwarded"
    );
}

#[tokio::test]
async fn get_and_delete_are_forwarded() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let session = a.session().await;
    let r = client()
        .delete(&a.url)
        .bearer_auth(&a.token)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let methods: Vec<_> = up.seen().iter().map(|s| s.method.clone()).collect();
    assert_eq!(
        methods,
        [http::Method::POST, http::Method::DELETE, http::Method::GET]
    );
    assert_eq!(up.seen()[1].headers["mcp-session-id"], "sess-1");
}

#[tokio::test]
async fn upstream_401_becomes_a_502_naming_the_credential() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("github-prod", &up.url("/deny"), "agent").await;
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(3, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert!(r.headers().get("www-authenticate").is_none());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["id"], 3);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("github-prod") && msg.contains("rejected"),
        "{msg}"
    );
    assert!(!msg.contains(SECRET));
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_slow_one_504() {
    let up = Upstream::start().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.upstream_timeout = std::time::Duration::from_millis(300)
    })
    .await;
    let a = p.agent("down", &format!("http://{closed}/mcp"), "a1").await;
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unreachable"));
    let b = p.agent("slow", &up.url("/hang"), "a2").await;
    let closed = up.connection_closed();
    let r = client()
        .post(&b.url)
        .bearer_auth(&b.token)
        .body(tools_call(2, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["id"], 2);
    // The abandoned upstream request does not keep its connection open.
    closed.await;
}

#[tokio::test]
async fn upstream_redirects_are_not_followed() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/redirect"), "agent").await;
    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    // A Location to another origin than the upstream's is dropped
    // (`proxy::response::headers::keep_locations_within_upstream`): tessera would not send
    // the agent where neither the admin nor the agent chose.
    assert!(r.headers().get("location").is_none(), "{:?}", r.headers());
    // tessera made exactly one upstream request: it did not chase the
    // redirect with the credential attached.
    assert_eq!(up.seen().len(), 1);

    // A Location that would lead back into tessera is dropped.
    let home = p.agent("home", &up.url("/redirect-home"), "agent2").await;
    let r = c
        .post(&home.url)
        .bearer_auth(&home.token)
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    assert!(r.headers().get("location").is_none(), "{:?}", r.headers());

    // A redirect that carries the stored credential comes back without it
    // (and, pointing to another origin, without its Location).
    let leak = p.agent("leak", &up.url("/redirect-leak"), "agent3").await;
    let r = c
        .post(&leak.url)
        .bearer_auth(&leak.token)
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 307);
    assert!(r.headers().get("location").is_none(), "{:?}", r.headers());
    assert_eq!(up.seen().len(), 3);
}

/// `Expect` never reaches the upstream: tessera holds the whole body, and an
/// upstream told to expect one may answer before reading it. `Range` and
/// `If-Range` reach it only with `--allow-range`: slices of an answer that
/// reflects the secret could be joined around its redaction.
#[tokio::test]
async fn expect_and_range_headers_are_stripped_unless_ranges_are_allowed() {
    let up = Upstream::start().await;
    let strict = Proxy::start(Proxy::dir()).await;
    let ranged = Proxy::start_with(Proxy::dir(), |c| c.allow_range = true).await;
    for (p, ranges) in [(&strict, false), (&ranged, true)] {
        let a = p.agent("gh", &up.url("/mcp"), "agent").await;
        let before = up.seen().len();
        for method in [http::Method::GET, http::Method::POST] {
            let body = if method == http::Method::POST {
                tools_call(1, "t")
            } else {
                String::new()
            };
            let r = client()
                .request(method.clone(), &a.url)
                .bearer_auth(&a.token)
                .header("expect", "100-continue")
                .header("range", "bytes=0-5")
                .header("if-range", "\"v1\"")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{method}");
        }
        let seen = up.seen();
        assert_eq!(seen.len(), before + 2);
        for s in &seen[before..] {
            let what = format!("{} with --allow-range {ranges}", s.method);
            assert!(s.headers.get("expect").is_none(), "{what}: Expect");
            let range = s.headers.get("range").map(|v| v.to_str().unwrap());
            let if_range = s.headers.get("if-range").map(|v| v.to_str().unwrap());
            if ranges {
                assert_eq!(range, Some("bytes=0-5"), "{what}");
                assert_eq!(if_range, Some("\"v1\""), "{what}");
            } else {
                assert_eq!((range, if_range), (None, None), "{what}");
            }
        }
    }
}
