//! Hostile callers over real sockets: every input in tests/hostile/README.md
//! gets its documented answer, none reaches the upstream (not even as a
//! request smuggled in a body), and the limits (in flight, rate, failed
//! authentication) answer 429 with Retry-After.

use std::time::Duration;

use crate::support::*;

/// A request sent as raw bytes to `path` with `headers` (each a full line,
/// no CRLF) and `body`; the answer's head and body as text.
async fn raw(p: &Proxy, method: &str, path: &str, headers: &[String], body: &[u8]) -> String {
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw_request(p.addr, &bytes).await
}

/// The status line's code, and the JSON-RPC error code of the body if any.
fn answer(raw: &str) -> (u16, Option<i64>) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("");
    let code = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_i64());
    (status, code)
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

/// What a hostile request is, its target, header lines and body, and the
/// expected status and JSON-RPC code (None: hyper answers before tessera,
/// without a body).
type Case = (&'static str, String, Vec<String>, Vec<u8>, u16, Option<i64>);

#[tokio::test]
async fn malformed_requests_get_a_clear_4xx_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.limits.caller.rate = 0.0;
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let auth = format!("authorization: Bearer {}", a.token);
    let json = "content-type: application/json".to_string();
    let call = tools_call(1, "t");
    let len = |b: &[u8]| format!("content-length: {}", b.len());

    let big_batch = {
        let one = r#"{"jsonrpc":"2.0","method":"n"}"#;
        let mut b = String::from("[");
        for i in 0..100_000 {
            if i > 0 {
                b.push(',');
            }
            b.push_str(one);
        }
        b.push(']');
        b.into_bytes()
    };
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes();
    let deep_object =
        format!("{}1{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000)).into_bytes();
    let many_headers: Vec<String> = (0..101).map(|i| format!("x-h{i}: v")).collect();
    let long_header = vec![format!("x-long: {}", "a".repeat(17 * 1024))];
    let cases: Vec<Case> = vec![
        (
            "invalid JSON",
            path.clone(),
            vec![auth.clone(), json.clone()],
            b"{oops".to_vec(),
            400,
            Some(-32700),
        ),
        (
            "JSON that is not JSON-RPC",
            path.clone(),
            vec![auth.clone(), json.clone()],
            br#"{"id":1,"method":7}"#.to_vec(),
            400,
            Some(-32600),
        ),
        (
            "not UTF-8",
            path.clone(),
            vec![auth.clone(), json.clone()],
            b"{\"id\":1,\"method\":\"\xff\xfe\"}".to_vec(),
            400,
            Some(-32700),
        ),
        (
            "a batch of 100,000 messages",
            path.clone(),
            vec![auth.clone(), json.clone()],
            big_batch,
            400,
            Some(-32600),
        ),
        (
            "arrays nested 100,000 deep",
            path.clone(),
            vec![auth.clone(), json.clone()],
            deep,
            400,
            Some(-32600),
        ),
        (
            "objects nested 100,000 deep",
            path.clone(),
            vec![auth.clone(), json.clone()],
            deep_object,
            400,
            // Skipped as an unknown member (serde_json skips without
            // recursing), then refused: no "jsonrpc".
            Some(-32600),
        ),
        (
            "a body over 4 MiB",
            path.clone(),
            vec![auth.clone(), json.clone()],
            vec![b' '; 4 * 1024 * 1024 + 1],
            413,
            Some(-32600),
        ),
        (
            "101 header fields",
            path.clone(),
            [vec![auth.clone()], many_headers].concat(),
            call.clone().into_bytes(),
            431,
            Some(-32600),
        ),
        (
            "17 KiB of header fields",
            path.clone(),
            [vec![auth.clone()], long_header].concat(),
            call.clone().into_bytes(),
            431,
            Some(-32600),
        ),
        (
            "a 9 KiB request target",
            format!("{path}?q={}", "a".repeat(9 * 1024)),
            vec![auth.clone()],
            call.clone().into_bytes(),
            414,
            Some(-32600),
        ),
        (
            "two Authorization headers",
            path.clone(),
            vec![auth.clone(), auth.clone()],
            call.clone().into_bytes(),
            403,
            Some(-32001),
        ),
        (
            "two different Content-Length headers",
            path.clone(),
            vec![
                auth.clone(),
                len(call.as_bytes()),
                "content-length: 3".into(),
            ],
            call.clone().into_bytes(),
            400,
            Some(-32600),
        ),
        (
            "CR in a header value",
            path.clone(),
            vec![auth.clone(), "x-a: a\rb".into()],
            call.clone().into_bytes(),
            400,
            None,
        ),
        (
            "NUL in a header value",
            path.clone(),
            vec![auth.clone(), "x-a: a\0b".into()],
            call.clone().into_bytes(),
            400,
            None,
        ),
        (
            "a percent-encoded dot segment",
            format!("{path}/%2e%2e/admin"),
            vec![auth.clone()],
            call.clone().into_bytes(),
            400,
            Some(-32600),
        ),
        (
            "a dot-dot sub-path",
            format!("{path}/a/../../b"),
            vec![auth.clone()],
            call.clone().into_bytes(),
            400,
            Some(-32600),
        ),
        (
            "a '#' after a dot-dot segment",
            format!("{path}/..#x"),
            vec![auth.clone()],
            call.clone().into_bytes(),
            400,
            Some(-32600),
        ),
        (
            "an encoded dot-dot address",
            "/c/%2e%2e/".to_string(),
            vec![auth.clone()],
            call.clone().into_bytes(),
            404,
            Some(-32004),
        ),
        (
            "a double slash before the address",
            format!("/{path}"),
            vec![auth.clone()],
            call.clone().into_bytes(),
            404,
            Some(-32004),
        ),
    ];
    for (what, target, headers, body, status, code) in cases {
        let mut headers = headers;
        if !headers
            .iter()
            .any(|h| h.starts_with("content-length") || h.starts_with("transfer-encoding"))
        {
            headers.push(len(&body));
        }
        let got = raw(&p, "POST", &target, &headers, &body).await;
        assert!(!got.is_empty(), "{what}: no answer");
        assert_eq!(answer(&got), (status, code), "{what}: {got:.300}");
    }
    assert!(
        up.seen().is_empty(),
        "a hostile request reached the upstream: {:?}",
        up.seen()
    );

    // The framing shapes request smuggling is made of are refused before
    // hyper parses them (`raw_head`), although RFC 9112 would let a server
    // resolve them: two equal lengths, and Transfer-Encoding with a length
    // (followed here by a second request smuggled after the chunked body).
    // Each gets one 400 with a JSON-RPC body, the connection is closed, and
    // nothing reaches the upstream.
    let chunked = format!("{:x}\r\n{call}\r\n0\r\n\r\n", call.len());
    let smuggled = "POST /admin HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
    let framed_twice: [(&str, Vec<String>, Vec<u8>); 3] = [
        (
            "two equal Content-Length headers",
            vec![len(call.as_bytes()), len(call.as_bytes())],
            call.clone().into_bytes(),
        ),
        (
            "Transfer-Encoding then Content-Length, a request smuggled behind",
            vec![
                "Transfer-Encoding: chunked".into(),
                "Content-Length: 4".into(),
            ],
            format!("{chunked}{smuggled}").into_bytes(),
        ),
        (
            "Content-Length then Transfer-Encoding",
            vec![
                "content-length: 4".into(),
                "transfer-encoding: chunked".into(),
            ],
            chunked.clone().into_bytes(),
        ),
    ];
    for (what, framing, body) in framed_twice {
        // Keep-alive (no `connection: close`): the refusal itself must
        // close the connection.
        let mut req = format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}\r\n{json}\r\n");
        for h in framing {
            req.push_str(&h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(&body);
        let got = tokio::time::timeout(Duration::from_secs(10), raw_request(p.addr, &bytes))
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection was kept open"));
        assert_eq!(answer(&got), (400, Some(-32600)), "{what}: {got}");
        assert!(got.contains("frames the body twice"), "{what}: {got}");
        assert_eq!(got.matches("HTTP/1.1").count(), 1, "{what}: {got}");
    }
    assert!(up.seen().is_empty(), "{:?}", up.seen());
    assert_refusals(&p, "framing", 4);

    // One length, the usual way, on the same proxy: served, and what
    // reaches the upstream is framed by tessera with one length.
    let got = raw(
        &p,
        "POST",
        &path,
        &[auth.clone(), json.clone(), len(call.as_bytes())],
        call.as_bytes(),
    )
    .await;
    assert_eq!(answer(&got).0, 200, "{got}");
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers.get_all("content-length").iter().count(), 1);
    assert_eq!(seen[0].body, call.as_bytes());
}

#[tokio::test]
async fn slow_heads_and_slow_bodies_get_408_and_idle_connections_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.limits.header_timeout = Duration::from_millis(300);
        c.limits.body_timeout = Duration::from_millis(300);
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("a stalled connection was kept open")
            .unwrap();
        String::from_utf8(out).unwrap()
    };

    // Half a head, then nothing: 408 with a JSON-RPC body, then closed.
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n").as_bytes())
        .await
        .unwrap();
    let got = read_all(s).await;
    assert_eq!(answer(&got), (408, Some(-32600)), "{got}");
    assert!(
        got.contains("request head did not arrive within 300 ms"),
        "{got}"
    );

    // A connection that sends nothing, or nothing more after an answer, is
    // closed without a word: there is no request to answer.
    let s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    assert_eq!(read_all(s).await, "");
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let call = tools_call(1, "t");
    s.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{call}",
            a.token,
            call.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let got = read_all(s).await;
    assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{got}");
    assert_eq!(answer(&got).0, 200, "{got}");

    // A whole head, a body that stops short: 408 with a JSON-RPC body.
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\ncontent-length: 100\r\n\r\n{{\"jsonrpc\"",
            a.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("no answer to a stalled body")
        .unwrap();
    let got = String::from_utf8_lossy(&out);
    assert_eq!(answer(&got), (408, Some(-32600)), "{got}");
    // The one whole request reached the upstream; neither stalled one did.
    assert_eq!(up.seen().len(), 1);
    assert_refusals(&p, "request_timeout", 2);
}

#[tokio::test]
async fn a_caller_over_its_in_flight_limit_gets_429_until_one_ends() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.limits.caller.max_in_flight = 2;
    })
    .await;
    let a = p.agent("gh", &up.url("/hang"), "agent").await;
    // Two requests the upstream never answers stay in flight.
    let hung: Vec<_> = (0..2)
        .map(|i| {
            let (url, token) = (a.url.clone(), a.token.clone());
            tokio::spawn(async move {
                client()
                    .post(url)
                    .bearer_auth(token)
                    .body(tools_call(i, "t"))
                    .send()
                    .await
            })
        })
        .collect();
    let caller = || {
        p.state
            .snapshot
            .load()
            .callers
            .values()
            .next()
            .unwrap()
            .clone()
    };
    within(Duration::from_secs(5), || async {
        caller().usage.in_flight() == 2
    })
    .await;
    let r = send_call(&a, 3).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v["id"],
        serde_json::Value::Null,
        "refused before the body was read"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many requests"),
        "{v}"
    );
    assert_eq!(
        up.seen().len(),
        2,
        "the refused request reached the upstream"
    );
    // One caller gone: its slot is free again.
    hung[0].abort();
    within(Duration::from_secs(5), || async {
        caller().usage.in_flight() == 1
    })
    .await;
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(4, "t"));
    let _third = tokio::spawn(r.send());
    within(Duration::from_secs(5), || async { up.seen().len() == 3 }).await;
}

#[tokio::test]
async fn a_caller_over_its_rate_gets_429_with_retry_after() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.limits.caller.rate = 0.5;
        c.limits.caller.burst = 3;
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let other = p.agent("gh", &up.url("/mcp"), "other").await;
    for i in 0..3 {
        let (s, _) = post_json(&a, tools_call(i, "t")).await;
        assert_eq!(s, 200);
    }
    let r = send_call(&a, 9).await;
    assert_eq!(r.status(), 429);
    // 0.5 per second: the next token in 2 s.
    assert_eq!(r.headers()["retry-after"], "2");
    assert_eq!(up.seen().len(), 3);
    // Another caller has a bucket of its own.
    let (s, _) = post_json(&other, tools_call(1, "t")).await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn failed_authentication_is_throttled_but_the_real_caller_gets_through() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let wrong = || {
        client()
            .post(&a.url)
            .bearer_auth("tsr_not-the-token")
            .body(tools_call(1, "t"))
            .send()
    };
    // Ten free failures, the eleventh starts a back-off: 403 so far.
    for _ in 0..11 {
        assert_eq!(wrong().await.unwrap().status(), 403);
    }
    // Inside the back-off: 429 with Retry-After, no challenge.
    let r = wrong().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    assert!(r.headers().get("www-authenticate").is_none());
    // The real caller, on the same address from the same source, is served.
    let (s, _) = post_json(&a, tools_call(2, "t")).await;
    assert_eq!(s, 200);
    assert_eq!(up.seen().len(), 1);
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let metrics = crate::admin_api::metrics_text(&api, &token).await;
    for line in [
        "tessera_refusals_total{reason=\"unauthenticated\"} 11",
        "tessera_refusals_total{reason=\"auth_throttled\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line} in\n{metrics}"
        );
    }
}

/// A GET or DELETE body is never inspected, and an upstream that answers a
/// GET without reading its body (Python's `http.server`) reads it as the
/// next request on the kept-alive connection: a whole request smuggled past
/// the policies, carrying the stored credential. Such a body is refused
/// before it is read, and the upstream sees no request at all.
#[tokio::test]
async fn get_and_delete_bodies_are_refused_and_nothing_is_smuggled() {
    let ok = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    let up = HeadOnlyUpstream::start(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ok}",
            ok.len()
        )
        .into_bytes(),
    )
    .await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let auth = format!("authorization: Bearer {}", a.token);
    // Two whole requests: a method tessera never forwards, and a tool call
    // no policy would see.
    let denied = tools_call(2, "delete_repo");
    let smuggled = format!(
        "PUT /admin/wipe HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n\
         POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{denied}",
        denied.len()
    );
    let chunked = format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len());
    for method in ["GET", "DELETE"] {
        for (framing, body) in [
            (format!("content-length: {}", smuggled.len()), &smuggled),
            ("transfer-encoding: chunked".to_string(), &chunked),
        ] {
            let headers = [auth.clone(), framing.clone()];
            let got = raw(&p, method, &path, &headers, body.as_bytes()).await;
            assert_eq!(
                answer(&got),
                (400, Some(-32600)),
                "{method}, {framing}: {got}"
            );
            assert!(got.contains("may not carry a body"), "{got}");
            assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{got}");
        }
    }
    assert!(
        up.request_lines().is_empty(),
        "the upstream saw {:?}",
        up.request_lines()
    );
    assert_refusals(&p, "invalid", 4);

    // Without a body (or with an empty one) both are forwarded, and so is a
    // POST; each reaches the upstream as the one request it is.
    let call = tools_call(3, "t");
    for (method, headers, body) in [
        ("GET", vec![auth.clone()], ""),
        ("GET", vec![auth.clone(), "content-length: 0".into()], ""),
        ("DELETE", vec![auth.clone()], ""),
        (
            "POST",
            vec![
                auth.clone(),
                "content-type: application/json".into(),
                format!("content-length: {}", call.len()),
            ],
            call.as_str(),
        ),
    ] {
        let got = raw(&p, method, &path, &headers, body.as_bytes()).await;
        assert_eq!(answer(&got).0, 200, "{method}: {got}");
    }
    assert_eq!(
        up.request_lines(),
        [
            "GET /mcp HTTP/1.1",
            "GET /mcp HTTP/1.1",
            "DELETE /mcp HTTP/1.1",
            "POST /mcp HTTP/1.1"
        ]
    );
}
