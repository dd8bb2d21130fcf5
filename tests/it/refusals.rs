//! Every refusal: its status, its JSON-RPC body, and that nothing reached
//! the upstream.

use crate::support::*;

async fn error_of(r: reqwest::Response) -> (u16, serde_json::Value) {
    let s = r.status().as_u16();
    (s, r.json().await.unwrap())
}

#[tokio::test]
async fn refusals_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.max_body_bytes = 1024;
        c.allowed_origins = vec!["http://app.localhost:3000".into()];
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let other = p.agent("gh", &up.url("/mcp"), "other").await;
    let c = client();
    let call = tools_call(5, "t");

    // Methods other than POST, GET, DELETE: 405 with Allow, even with no
    // token and on an unknown address.
    for m in ["PUT", "PATCH", "OPTIONS"] {
        let r = c
            .request(m.parse().unwrap(), format!("{}/c/nowhere", p.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["allow"], "POST, GET, DELETE");
        let (s, v) = error_of(r).await;
        assert_eq!((s, v["error"]["code"].as_i64()), (405, Some(-32600)), "{m}");
    }

    // No token, a wrong token, another scheme: 403 naming the fault, and
    // no challenge (a 401 starts OAuth in MCP clients: tests/it/clients.rs).
    let cases = [
        None,
        Some("Bearer tsr_wrong"),
        Some(format!("Basic {}", a.token).leak() as &str),
    ];
    for auth in cases {
        let mut rq = c.post(&a.url).body(call.clone());
        if let Some(h) = auth {
            rq = rq.header("authorization", h);
        }
        let r = rq.send().await.unwrap();
        assert!(r.headers().get("www-authenticate").is_none());
        let (s, v) = error_of(r).await;
        assert_eq!(s, 403);
        assert_eq!(v["id"], serde_json::Value::Null);
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"));
    }

    // Another caller's address answers exactly like an unknown one.
    let (s1, v1) = error_of(
        c.post(&other.url)
            .bearer_auth(&a.token)
            .body(call.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    let (s2, v2) = error_of(
        c.post(format!("{}/c/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", p.base()))
            .bearer_auth(&a.token)
            .body(call.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    // Each names its own request id (per request, not per address).
    let (mut v1, mut v2) = (v1, v2);
    for v in [&mut v1, &mut v2] {
        let data = v["error"]["data"].as_object_mut().unwrap();
        assert!(data.remove("request_id").is_some(), "{data:?}");
    }
    assert_eq!((s1, &v1), (404, &v2));
    assert_eq!(s2, 404);

    // DNS rebinding: a foreign Origin or Host.
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("origin", "http://evil.example")
        .body(call.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("host", "evil.example")
        .body(call.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Bodies: too large, not JSON, not JSON-RPC.
    let (s, _) = error_of(
        c.post(&a.url)
            .bearer_auth(&a.token)
            .body("x".repeat(2000))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 413);
    let (s, v) = error_of(
        c.post(&a.url)
            .bearer_auth(&a.token)
            .body("{oops")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, v["error"]["code"].as_i64()), (400, Some(-32700)));
    let (s, v) = error_of(
        c.post(&a.url)
            .bearer_auth(&a.token)
            .body(r#"{"id":1,"method":"x"}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, v["error"]["code"].as_i64()), (400, Some(-32600)));
    // A sub-path climbing out of the upstream's path.
    // (Sent raw: an HTTP client library would normalise the dots away.)
    let path = a.url.strip_prefix(&p.base()).unwrap();
    let raw = raw_request(p.addr, &format!(
        "POST {path}/%2e%2e/admin HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{call}",
        a.token, call.len()
    ).into_bytes()).await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");

    assert!(
        up.seen().is_empty(),
        "a refused request reached the upstream: {:?}",
        up.seen()
    );

    // The allowed origin passes, which proves the 403 above was the Origin check.
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("origin", "http://app.localhost:3000")
        .body(call.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.seen().len(), 1);
    // So does tessera's own origin (same-origin: the scheme and the Host),
    // which a DNS-rebound page cannot have: its Host is the attacker's.
    let host = p.addr.to_string();
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("origin", format!("http://{host}"))
        .body(call.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("host", "evil.example")
        .header("origin", "http://evil.example")
        .body(call.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(up.seen().len(), 2);
}
