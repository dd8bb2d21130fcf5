//! Request ids (issue 28): every answer of the data plane carries one in
//! `X-Request-Id` (tessera's, whatever the upstream sent), the access line
//! and every audit row of the request name the same one, a refusal's body
//! names it, and `tessera audit --request-id` finds the request's rows. A
//! caller's valid `traceparent` sets it; a malformed one is ignored.

use crate::support::*;

/// The spec's example `traceparent`, and its trace id.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn is_request_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The answer's one `X-Request-Id`, asserted to be a request id.
fn request_id_of(h: &reqwest::header::HeaderMap) -> String {
    let all: Vec<_> = h.get_all("x-request-id").iter().collect();
    assert_eq!(all.len(), 1, "one X-Request-Id: {all:?}");
    let id = all[0].to_str().unwrap().to_string();
    assert!(is_request_id(&id), "{id}");
    id
}

/// `tessera audit --json --request-id ID`, run as the real CLI: its rows.
fn audit_cli(p: &Proxy, id: &str) -> Vec<serde_json::Value> {
    let o = p.cli(&["audit", "--json", "--request-id", id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A forwarded call: the id in its header is in its access line, in its
/// audit row, and `tessera audit --request-id` returns that row alone.
#[tokio::test]
async fn a_forwarded_call_is_found_by_its_id_in_the_log_and_the_trail() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (s, h, v) = post_json_headers(&a, tools_call(1, "update_issue")).await;
    assert_eq!(s, 200, "{v}");
    let id = request_id_of(&h);
    // Another request, whose rows the lookup must leave out.
    let (s, h2, _) = post_json_headers(&a, tools_call(2, "update_issue")).await;
    assert_eq!(s, 200);
    assert_ne!(request_id_of(&h2), id, "a fresh id per request");

    let lines = log_lines_with(&format!("request_id={id}"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("verdict=forwarded") && lines[0].contains("tool=update_issue"),
        "{}",
        lines[0]
    );

    let rows = audit_rows(&p).await;
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r.request_id.as_deref() == Some(id.as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "{rows:#?}");
    assert!(rows.iter().all(|r| r.request_id.is_some()), "{rows:#?}");

    let found = audit_cli(&p, &id);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["request_id"], id.as_str());
    assert_eq!(found[0]["id"], mine[0].id);
    assert_eq!(found[0]["tool"], "update_issue");
    assert!(audit_cli(&p, &"0".repeat(32)).is_empty());
}

/// A caller's valid `traceparent` makes the request id its trace id, in
/// the header, the access line and the trail.
#[tokio::test]
async fn a_callers_traceparent_sets_the_id() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("traceparent", TRACEPARENT)
        .body(tools_call(1, "update_issue"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(request_id_of(r.headers()), TRACE_ID);
    assert!(!log_lines_with(&format!("request_id={TRACE_ID}")).is_empty());
    audit_rows(&p).await;
    let found = audit_cli(&p, TRACE_ID);
    assert_eq!(found.len(), 1, "{found:?}");
}

/// A `traceparent` that is malformed, in uppercase, or sent twice is
/// ignored: the request is served, under a fresh id.
#[tokio::test]
async fn a_malformed_traceparent_is_ignored() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let upper = TRACEPARENT.to_uppercase();
    let cases: [(&str, Vec<&str>); 4] = [
        (
            "malformed",
            vec!["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"],
        ),
        ("uppercase", vec![upper.as_str()]),
        (
            "all-zero trace id",
            vec!["00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
        ),
        ("sent twice", vec![TRACEPARENT, TRACEPARENT]),
    ];
    for (what, values) in cases {
        let mut req = client().post(&a.url).bearer_auth(&a.token);
        for v in values {
            req = req.header("traceparent", v);
        }
        let r = req
            .body(tools_call(1, "update_issue"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{what}");
        let id = request_id_of(r.headers());
        assert_ne!(id, TRACE_ID, "{what}");
        assert_ne!(id, TRACE_ID.to_uppercase(), "{what}");
    }
    assert_eq!(up.seen().len(), 4, "every request was served");
}

/// Refusals name the id their header names: a JSON-RPC error in
/// `error.data.request_id`, a refused tool call in its result's `_meta`
/// (never in the text the model reads); and the refused batch's rows are
/// found by it.
#[tokio::test]
async fn a_refusal_names_its_id_in_its_body() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    // A batch with a forbidden call: a 403 JSON-RPC error.
    let batch = format!(
        "[{},{}]",
        tools_call(1, "update_issue"),
        tools_call(2, "delete_repo")
    );
    let (s, h, v) = post_json_headers(&a, batch).await;
    assert_eq!(s, 403, "{v}");
    let id = request_id_of(&h);
    assert_eq!(v["error"]["data"]["request_id"], id.as_str(), "{v}");
    let lines = log_lines_with(&format!("request_id={id}"));
    assert!(
        lines.len() == 1 && lines[0].contains("verdict=refused"),
        "{lines:?}"
    );
    audit_rows(&p).await;
    let found = audit_cli(&p, &id);
    let tools: Vec<_> = found.iter().map(|r| r["tool"].clone()).collect();
    assert_eq!(tools, ["update_issue", "delete_repo"], "{found:?}");

    // A lone forbidden call: a tool result whose `_meta` names the id.
    let (s, h, v) = post_json_headers(&a, tools_call(3, "delete_repo")).await;
    assert_eq!(s, 200, "{v}");
    let id = request_id_of(&h);
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(v["result"]["_meta"]["io.tessera/request_id"], id.as_str());
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(!text.contains(&id), "{text}");

    // Refused before authentication: the header and the body still.
    let r = client()
        .post(&a.url)
        .bearer_auth("tsr_wrong")
        .body(tools_call(4, "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let id = request_id_of(r.headers());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["data"]["request_id"], id.as_str(), "{v}");
    assert!(up.seen().is_empty());
}

/// A head refused on its raw bytes, before hyper parses it (its body
/// framed twice), carries a minted id in its header and its body, and
/// its access line names it.
#[tokio::test]
async fn a_raw_head_refusal_names_an_id() {
    let p = Proxy::start(Proxy::dir()).await;
    let req = "POST /c/x HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\n\
               content-length: 3\r\n\r\n{}";
    let got = raw_request(p.addr, req.as_bytes()).await;
    let (head, body) = got.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 400"), "{got}");
    let ids: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("x-request-id: "))
        .collect();
    assert_eq!(ids.len(), 1, "{head}");
    assert!(is_request_id(ids[0]), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["data"]["request_id"], ids[0], "{v}");
    let lines = log_lines_with(&format!("request_id={}", ids[0]));
    assert_eq!(lines.len(), 1, "{lines:?}");
}

/// An upstream's own `X-Request-Id` (two of them, here) does not reach the
/// caller: the answer carries tessera's alone.
#[tokio::test]
async fn an_upstreams_request_id_is_replaced() {
    let body = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: upstream-1\r\n\
         X-Request-Id: upstream-2\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let up = HeadOnlyUpstream::start(answer.into_bytes()).await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (s, h, v) = post_json_headers(&a, tools_call(1, "update_issue")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["content"], serde_json::json!([]));
    let id = request_id_of(&h);
    assert!(!id.starts_with("upstream"));
    assert_eq!(up.request_lines().len(), 1);
    assert_eq!(
        audit_rows(&p).await[0].request_id.as_deref(),
        Some(id.as_str())
    );
}
