//! tools/list filtering: the model sees only the tools the policies let
//! this caller call, on JSON and on SSE answers; other answers pass
//! untouched; an answer too large to filter is refused, not passed on.

use crate::support::*;

const LIST: &str = r#"{"jsonrpc":"2.0","id":"l1","method":"tools/list","params":{}}"#;

async fn list(a: &Agent, body: &str) -> reqwest::Response {
    client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("accept-encoding", "gzip, br")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

fn names(result: &serde_json::Value) -> Vec<&str> {
    result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn json_answer_lists_only_allowed_tools() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let r = list(&a, LIST).await;
    assert_eq!(r.status(), 200);
    let len: usize = r.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = r.bytes().await.unwrap();
    assert_eq!(len, body.len());
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["id"], "l1");
    assert_eq!(names(&v["result"]), ["search", "read_file"]);
    // The rest of the result is kept.
    assert_eq!(v["result"]["nextCursor"], "c2");
    assert_eq!(v["result"]["tools"][0]["inputSchema"]["type"], "object");
    // The answer is read (to be filtered and redacted): asked for plain.
    assert_eq!(up.seen()[0].headers["accept-encoding"], "identity");

    // A batch: the tools/list answer inside the array is filtered too.
    let batch = format!(r#"[{LIST},{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}]"#);
    let v: serde_json::Value = list(&a, &batch).await.json().await.unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    for answer in v.as_array().unwrap() {
        assert_eq!(names(&answer["result"]), ["search", "read_file"]);
    }

    // Every answer is scanned for the secret, so every one is asked for
    // plain, whatever the caller accepts (what still comes coded is
    // decoded: redaction::coded_answers_are_decoded_then_redacted).
    let call = tools_call(3, "search");
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("accept-encoding", "gzip")
        .body(call)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        up.seen().last().unwrap().headers["accept-encoding"],
        "identity"
    );
}

#[tokio::test]
async fn the_builtin_policy_lists_every_tool() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let v: serde_json::Value = list(&a, LIST).await.json().await.unwrap();
    assert_eq!(names(&v["result"]), TOOLS);
}

#[tokio::test]
async fn sse_answer_is_filtered_event_by_event() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/sse-tools"), "agent").await;

    let r = list(&a, LIST).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .flat_map(|e| e.split("\r\n\r\n"))
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(events.len(), 3, "{text:?}");
    // The comment and the notification pass byte for byte.
    assert_eq!(events[0], ": keep-alive");
    assert!(
        events[1].starts_with("event: message\r\ndata: {"),
        "{text:?}"
    );
    assert!(events[1].contains("notifications/progress"));
    // The answer keeps its id line and becomes one data line, filtered.
    let lines: Vec<&str> = events[2].lines().collect();
    assert_eq!(lines[0], "id: 7", "{text:?}");
    assert_eq!(lines.len(), 2, "{text:?}");
    let v: serde_json::Value =
        serde_json::from_str(lines[1].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["id"], "l1");
    assert_eq!(names(&v["result"]), ["search", "read_file"]);
}

#[tokio::test]
async fn an_answer_too_large_to_filter_is_refused() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(
        Proxy::dir(),
        |c| c.tools_list_max_bytes = 64,
        policies_with(&["tool-deny-list"]),
    )
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let r = list(&a, LIST).await;
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("--tools-list-max-bytes"), "{msg}");
    assert!(!msg.contains("delete_repo"), "{msg}");

    // Over SSE the stream breaks off before the unfiltered list (here
    // before the first event that big, so hyper may not even have sent
    // the head yet).
    let a = p.agent("gh2", &up.url("/sse-tools"), "agent2").await;
    let sent = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(LIST)
        .send()
        .await;
    let mut got = Vec::new();
    let mut failed = sent.is_err();
    if let Ok(r) = sent {
        assert_eq!(r.status(), 200);
        let mut body = r.bytes_stream();
        use futures_util::StreamExt;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => got.extend_from_slice(&c),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
    }
    assert!(failed, "the stream ended cleanly");
    assert!(!String::from_utf8_lossy(&got).contains("delete_repo"));
}

/// An SSE answer to `method` at `a`'s connection (on `/sse-raw`) made of
/// exactly `events`; the bytes the caller got before the stream ended,
/// and whether it ended cleanly.
async fn sse_raw(a: &Agent, method: http::Method, events: &str) -> (Vec<u8>, bool) {
    sse_raw_bytes(a, method, events.as_bytes()).await
}

async fn sse_raw_bytes(a: &Agent, method: http::Method, events: &[u8]) -> (Vec<u8>, bool) {
    use base64::Engine;
    let q = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(events);
    let mut req = client()
        .request(method.clone(), format!("{}?events={q}", a.url))
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream");
    if method == http::Method::POST {
        req = req.body(r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#);
    }
    // The stream may end before its head went out (hyper sends the head
    // with the first frame): nothing at all arrived then.
    let Ok(mut r) = req.send().await else {
        return (Vec::new(), false);
    };
    assert_eq!(r.status(), 200);
    let mut got = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// The SDKs route a result by its id, whatever stream carries it: a
/// `tools/list` result on a ping's SSE answer or on the GET stream is read
/// as the list. Every SSE answer is filtered, wherever the list travels.
#[tokio::test]
async fn a_tools_list_result_is_filtered_on_whatever_stream_carries_it() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/sse-raw"), "agent").await;
    let list = tools_result(&"l1".into()).to_string();
    // Also spelled with an escape in the member's name.
    let escaped = list.replacen("\"tools\"", "\"tool\\u0073\"", 1);
    for method in [http::Method::POST, http::Method::GET] {
        for result in [&list, &escaped] {
            let events = format!("id: 1\ndata:\n\nevent: message\ndata: {result}\n\n");
            let (got, clean) = sse_raw(&a, method.clone(), &events).await;
            assert!(clean);
            let text = String::from_utf8(got).unwrap();
            assert!(!text.contains("delete_repo"), "{method}: {text}");
            let data = text
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("{text}"));
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["id"], "l1");
            assert_eq!(names(&v["result"]), ["search", "read_file"], "{method}");
        }
    }
}

/// An SSE event tessera cannot read to filter is never passed on: the
/// stream ends before it (the client dispatches no unfinished event).
/// Events that cannot hold a list pass as they came.
#[tokio::test]
async fn an_sse_event_that_cannot_be_filtered_ends_the_stream() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/sse-raw"), "agent").await;
    let list = tools_result(&"l1".into()).to_string();
    let first = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n";
    let last = "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"after\":1}}\n\n";
    let bad_utf8 = {
        let mut b = format!("data: {list}").into_bytes();
        let at = b.windows(4).position(|w| w == b"name").unwrap();
        b.insert(at, 0xff);
        b.extend_from_slice(b"\n\n");
        b
    };
    let surrogate = format!(
        "data: {}\n\n",
        list.replacen(
            "\"inputSchema\"",
            "\"description\":\"\\ud800\",\"inputSchema\"",
            1
        )
    );
    let deep = format!(
        "data: {}\n\n",
        list.replacen(
            "\"inputSchema\"",
            &format!(
                "\"x\":{}1{},\"inputSchema\"",
                "[".repeat(200),
                "]".repeat(200)
            ),
            1
        )
    );
    let bom = format!("\u{feff}data: {list}\n\n");
    let not_json = "data: tools: search, delete_repo\n\n".to_string();
    let cases: [(&str, Vec<u8>); 5] = [
        ("bad UTF-8", bad_utf8),
        ("a lone surrogate", surrogate.into_bytes()),
        ("nesting too deep", deep.into_bytes()),
        ("a byte-order mark", bom.into_bytes()),
        ("data that is not JSON", not_json.into_bytes()),
    ];
    for (what, bad) in cases {
        let mut events = first.as_bytes().to_vec();
        events.extend_from_slice(&bad);
        events.extend_from_slice(last.as_bytes());
        let (got, clean) = sse_raw_bytes(&a, http::Method::POST, &events).await;
        assert!(!clean, "{what}: the stream went on");
        // What arrived (if anything) is the first event: never the one
        // that could not be read, nor any after it.
        assert!(
            first.as_bytes().starts_with(&got),
            "{what}: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // Events that name no tools pass untouched, escapes and all.
    let fine = format!("{first}: comment\n\ndata: {{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{{\"text\":\"a\\nb \\u00e9\"}}}}\n\n{last}");
    let (got, clean) = sse_raw(&a, http::Method::POST, &fine).await;
    assert!(clean);
    assert_eq!(String::from_utf8(got).unwrap(), fine);
}

/// The answer a caller gets when the upstream answers its POST of `sent`
/// with exactly `body` (Content-Type `ctype`), in one frame or one byte
/// per frame: the bytes if the answer arrived whole, `Err` with what
/// arrived if it was cut.
async fn json_raw(
    a: &Agent,
    sent: &str,
    body: &[u8],
    ctype: &str,
    split: bool,
) -> Result<Vec<u8>, Vec<u8>> {
    json_raw_at(a, 200, sent, body, ctype, split).await
}

/// [`json_raw`] with the upstream's status `status` (the caller gets it).
async fn json_raw_at(
    a: &Agent,
    status: u16,
    sent: &str,
    body: &[u8],
    ctype: &str,
    split: bool,
) -> Result<Vec<u8>, Vec<u8>> {
    use base64::Engine;
    let q = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body);
    let url = format!(
        "{}?body={q}&ctype={}&split={}&status={status}",
        a.url,
        url::form_urlencoded::byte_serialize(ctype.as_bytes()).collect::<String>(),
        u8::from(split)
    );
    let Ok(mut r) = client()
        .post(url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(sent.to_string())
        .send()
        .await
    else {
        return Err(Vec::new());
    };
    assert_eq!(r.status(), status);
    let mut got = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return Ok(got),
            Err(_) => return Err(got),
        }
    }
}

/// The SDKs route a response by its id, whatever HTTP answer carries it:
/// an upstream that answers a ping's POST with a JSON batch holding the
/// response to a `tools/list` in flight on another POST would deliver a
/// list no filter read (found by the attack review). A POST's JSON answer
/// that holds a response to an id the POST did not send is cut before its
/// end, in every spelling; the caller never gets a whole document to
/// dispatch.
#[tokio::test]
async fn a_json_answer_holding_another_requests_response_is_cut() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(
        Proxy::dir(),
        |c| c.tools_list_max_bytes = 1024,
        policies_with(&["tool-deny-list"]),
    )
    .await;
    let a = p.agent("gh", &up.url("/json-raw"), "agent").await;
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    let pong = r#"{"jsonrpc":"2.0","id":9,"result":{}}"#;
    let list = tools_result(&"l1".into()).to_string();
    let hostile: Vec<(&str, String, &str)> = vec![
        (
            "a batch with the other request's list",
            format!("[{pong},{list}]"),
            "application/json",
        ),
        ("the list alone", list.clone(), "application/json"),
        (
            "the id as Go reads it",
            list.replacen("\"id\"", "\"ID\"", 1),
            "application/json",
        ),
        (
            "the id twice, ours first",
            list.replacen("\"id\":\"l1\"", "\"id\":9,\"id\":\"l1\"", 1),
            "application/json",
        ),
        (
            "the id twice, ours last",
            list.replacen("\"id\":\"l1\"", "\"id\":\"l1\",\"Id\":9", 1),
            "application/json",
        ),
        (
            "`tools` escaped",
            format!(
                "[{pong},{}]",
                list.replacen("\"tools\"", "\"tool\\u0073\"", 1)
            ),
            "application/json",
        ),
        (
            "`TOOLS` as Go reads it",
            list.replacen("\"tools\"", "\"TOOLS\"", 1),
            "application/json",
        ),
        (
            "a letter of `tools` escaped",
            list.replacen("\"tools\"", "\"t\\u006Fols\"", 1),
            "application/json",
        ),
        (
            "in UTF-16 (Python's json.loads reads it)",
            list.encode_utf16()
                .flat_map(u16::to_le_bytes)
                .map(char::from)
                .collect(),
            "application/json",
        ),
        (
            "its first letter escaped",
            list.replacen("\"tools\"", "\"\\u0054ools\"", 1),
            "application/json",
        ),
        (
            "not JSON tessera can read (a lone surrogate)",
            format!(
                "[{pong},{}]",
                list.replacen("\"nextCursor\":\"c2\"", "\"nextCursor\":\"\\ud800\"", 1)
            ),
            "application/json",
        ),
        (
            "SSE under a type a client reads as SSE",
            format!("event: message\ndata: {list}\n\n"),
            "application/json, text/event-stream",
        ),
        (
            "larger than tessera keeps",
            format!(
                "[{pong},{list},{}]",
                format!("{pong},").repeat(40).trim_end_matches(',')
            ),
            "application/json",
        ),
    ];
    // Not only at 200: the Python SDK (2.x) reads a 3xx answer's JSON.
    for (what, body, ctype) in &hostile {
        for (split, status) in [
            (false, 200),
            (true, 200),
            (false, 300),
            (true, 307),
            (false, 202),
        ] {
            let got = json_raw_at(&a, status, ping, body.as_bytes(), ctype, split).await;
            let Err(got) = got else {
                panic!("{what} (split {split}): passed whole: {got:?}");
            };
            assert!(
                got.len() < body.len(),
                "{what} (split {split}): all of it arrived"
            );
            assert!(
                !body.as_bytes().starts_with(b"[") || !got.ends_with(b"]"),
                "{what}"
            );
        }
    }
    // Nothing hostile is lost from view: each cut answer is logged.
    // Answers to the POST's own requests pass whole, even when they spell
    // `tools`, re-escape the id, or answer with a null id; answers that
    // cannot list tools pass unread, whatever their size.
    let fine: Vec<(&str, String)> = vec![
        ("a ping's answer", pong.to_string()),
        (
            "a result naming tools",
            r#"{"jsonrpc":"2.0","id":9,"result":{"tools":"x"}}"#.into(),
        ),
        (
            "the id re-escaped",
            r#"{"jsonrpc":"2.0","id":9,"result":{"text":"tool \u00e9"}}"#.into(),
        ),
        (
            "an error with a null id",
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no tool"}}"#.into(),
        ),
        (
            "a large answer that cannot list tools",
            format!(
                r#"{{"jsonrpc":"2.0","id":8,"result":{{"text":"{}"}}}}"#,
                "a".repeat(3_000)
            ),
        ),
        // Escapes that spell no letter of `tools` (a file's text) stream
        // as they came, past the size tessera would keep.
        (
            "a large answer full of escapes",
            format!(
                r#"{{"jsonrpc":"2.0","id":8,"result":{{"text":"{}"}}}}"#,
                "line\\n\\u00e9\\\"".repeat(150)
            ),
        ),
    ];
    for (what, body) in &fine {
        for split in [false, true] {
            let got = json_raw(&a, ping, body.as_bytes(), "application/json", split).await;
            assert_eq!(
                got.as_deref(),
                Ok(body.as_bytes()),
                "{what} (split {split})"
            );
        }
    }
    // A string id sent escaped and echoed plain is the same id.
    let sent = r#"{"jsonrpc":"2.0","id":"p\u0031","method":"ping"}"#;
    let body = r#"{"jsonrpc":"2.0","id":"p1","result":{"tools":[]}}"#;
    let got = json_raw(&a, sent, body.as_bytes(), "application/json", true).await;
    assert_eq!(got.as_deref(), Ok(body.as_bytes()));
    // A batch's answer may answer each of its requests.
    let sent = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":"two","method":"ping"}]"#;
    let body = r#"[{"jsonrpc":"2.0","id":"two","result":{"tools":[]}},{"jsonrpc":"2.0","id":1,"result":{}}]"#;
    let got = json_raw(&a, sent, body.as_bytes(), "application/json", false).await;
    assert_eq!(got.as_deref(), Ok(body.as_bytes()));
}

/// A `tools/list` answer is filtered whatever its success or redirect
/// status (the Python SDK reads a 3xx's JSON); a `202` passes unread only
/// with no body or a body of a type no client reads as messages; one of a
/// type tessera cannot read (Go trims `\u{a0}` off it) is refused. An
/// upstream's `Location` never reaches the caller: every SDK follows one
/// by itself, past tessera (found by the attack review).
#[tokio::test]
async fn a_list_is_filtered_at_any_status_a_client_reads() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/json-raw"), "agent").await;
    let list = tools_result(&"l1".into()).to_string();
    for status in [200, 203, 300, 307] {
        let got = json_raw_at(&a, status, LIST, list.as_bytes(), "application/json", false)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
        assert_eq!(names(&v["result"]), ["search", "read_file"], "{status}");
    }
    // A 202 with the legacy transport's plain "Accepted", or nothing.
    for (body, ctype) in [("Accepted", "text/plain"), ("", "application/json")] {
        let got = json_raw_at(&a, 202, LIST, body.as_bytes(), ctype, false).await;
        assert_eq!(got.as_deref(), Ok(body.as_bytes()), "{ctype}");
    }
    // A 202 holding the list under a type tessera cannot read, or under
    // JSON: refused (502), never passed on.
    for ctype in [
        "\u{a0}application/json",
        "application/json\u{a0}",
        "text/plain; x=\"\u{e9}\"",
    ] {
        let url = format!(
            "{}?body={}&ctype={}&status=202",
            a.url,
            {
                use base64::Engine;
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&list)
            },
            url::form_urlencoded::byte_serialize(ctype.as_bytes()).collect::<String>()
        );
        let r = client()
            .post(url)
            .bearer_auth(&a.token)
            .body(LIST)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502, "{ctype:?}");
        assert!(!r.text().await.unwrap().contains("delete_repo"));
    }
    // A redirect's Location, even on the upstream's own origin, is dropped.
    let location = up.url("/json-raw/elsewhere");
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!(
            "{}?status=307&location={}",
            a.url,
            url::form_urlencoded::byte_serialize(location.as_bytes()).collect::<String>()
        ))
        .bearer_auth(&a.token)
        .body(r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 307);
    assert!(r.headers().get("location").is_none(), "{:?}", r.headers());
}
