//! Ask: an `@ask` policy holds a call for a person. The call is answered
//! with a result the model can read naming the approval; a person grants or
//! denies it with the CLI; a retry of the same call (same arguments, in any
//! spacing or key order) then runs once; another call needs its own
//! approval; a denial stands. Nothing held reaches the upstream.

use crate::support::*;
use tessera::authz::approvals::{self, Call, Held, Settled};
use tessera::store::model::CallKey;

fn call(id: u32, tool: &str, args: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    )
}

/// The approval id a held call's text names.
fn approval_in(v: &serde_json::Value) -> String {
    assert_eq!(v["result"]["isError"], true, "{v}");
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    let at = text.find("approval ap_").expect(text) + "approval ".len();
    text[at..at + 15].to_string()
}

fn ok(o: std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[tokio::test]
async fn ask_then_grant_then_the_same_call_runs_once() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    // Held: a result the model reads, naming the approval; not forwarded.
    let (s, v) = post_json(&a, call(1, "write_file", r#"{"path":"a.txt","text":"hi"}"#)).await;
    assert_eq!(s, 200);
    assert_eq!(v["id"], 1);
    let id = approval_in(&v);
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("\"write_file\"") && text.contains("pending"),
        "{text}"
    );
    // Asked again before anyone decided: the same pending approval.
    let (_, v) = post_json(&a, call(2, "write_file", r#"{"path":"a.txt","text":"hi"}"#)).await;
    assert_eq!(approval_in(&v), id);
    assert!(up.seen().is_empty(), "a held call reached the upstream");

    let list = ok(p.cli(&["approval", "list"]));
    let row = list.lines().find(|l| l.starts_with(&id)).expect(&list);
    assert!(
        row.contains("pending") && row.contains("agent") && row.contains("write_file"),
        "{row}"
    );
    assert!(row.contains("ask-for-writes"), "{row}");
    assert_eq!(list.lines().count(), 2, "one pending approval: {list}");

    // Granted: the same arguments, in other spacing and key order, run.
    ok(p.cli(&["approval", "grant", &id, "--ttl", "10m"]));
    let (s, v) = post_json(
        &a,
        call(3, "write_file", r#"{ "text": "hi", "path": "a.txt" }"#),
    )
    .await;
    assert_eq!(
        (s, &v["result"]["echo"]),
        (200, &serde_json::json!("tools/call")),
        "{v}"
    );
    assert_eq!(up.seen().len(), 1);

    // Once: the grant is used up, and the call is held anew.
    let (_, v) = post_json(&a, call(4, "write_file", r#"{"path":"a.txt","text":"hi"}"#)).await;
    let again = approval_in(&v);
    assert_ne!(again, id);
    // Other arguments are another call, with their own approval.
    let (_, v) = post_json(&a, call(5, "write_file", r#"{"path":"b.txt","text":"hi"}"#)).await;
    let other = approval_in(&v);
    assert_ne!(other, again);
    assert_eq!(up.seen().len(), 1);

    // Calls no @ask policy names are not held.
    let (s, v) = post_json(&a, call(6, "search", "{}")).await;
    assert_eq!(
        (s, &v["result"]["echo"]),
        (200, &serde_json::json!("tools/call"))
    );

    // A batch with a held call is refused whole, naming the approval.
    let batch = format!(
        "[{},{}]",
        call(7, "search", "{}"),
        call(8, "write_file", "{}")
    );
    let (s, v) = post_json(&a, batch).await;
    assert_eq!(s, 403, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("approval ap_"), "{msg}");
    assert_eq!(up.seen().len(), 2);

    // The audit trail tells the story: ask, ask, allow by the grant, …
    let rows = audit_rows(&p).await;
    let verdicts: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.verdict.as_str(), r.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(verdicts[0].0, "ask");
    assert!(
        verdicts[0].1.contains(&format!("approval {id} pending")),
        "{verdicts:?}"
    );
    assert_eq!(verdicts[2].0, "allow");
    assert!(
        verdicts[2].1.contains(&format!("approval {id} granted")),
        "{verdicts:?}"
    );
    assert_eq!(rows[2].status, 200);
    assert_eq!(verdicts[3].0, "ask");
}

#[tokio::test]
async fn a_denial_stands_and_stays_listed() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    let (_, v) = post_json(&a, call(1, "write_file", r#"{"path":"/etc/passwd"}"#)).await;
    let id = approval_in(&v);
    ok(p.cli(&["approval", "deny", &id]));
    // The same call again: refused as denied, not asked again.
    let (s, v) = post_json(&a, call(2, "write_file", r#"{"path":"/etc/passwd"}"#)).await;
    assert_eq!(s, 200);
    assert_eq!(approval_in(&v), id);
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("denied"), "{text}");
    // Something else is a new, visible request.
    let (_, v) = post_json(&a, call(3, "write_file", r#"{"path":"/etc/shadow"}"#)).await;
    let next = approval_in(&v);
    assert_ne!(next, id);
    assert!(up.seen().is_empty());

    let pending = ok(p.cli(&["approval", "list"]));
    assert!(
        pending.contains(&next) && !pending.contains(&id),
        "{pending}"
    );
    let all = ok(p.cli(&["approval", "list", "--all", "--json"]));
    let denied: serde_json::Value = all
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["id"] == id.as_str())
        .expect(&all);
    assert_eq!(denied["status"], "denied");
    assert_eq!(denied["tool"], "write_file");
    // The approver sees the call's arguments whatever --audit-arguments
    // says (that governs the audit trail), and who decided; the store
    // keeps them only sealed.
    assert_eq!(denied["arguments"], r#"{"path":"/etc/passwd"}"#, "{denied}");
    assert_eq!(denied["decided_by"], "cli", "{denied}");
    assert_no_plaintext(p.dir.path(), &["/etc/passwd", "/etc/shadow"]);

    // Deciding twice, or an unknown id, is a clear error.
    let o = p.cli(&["approval", "deny", &id]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("already denied"));
    let o = p.cli(&["approval", "grant", "ap_nosuchthing"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no approval named"));
}

#[tokio::test]
async fn a_grant_ends_at_its_ttl_and_after_its_uses() {
    let p = Proxy::start(Proxy::dir()).await;
    let store = p.store();
    let held = |args: &str| Held {
        key: CallKey {
            caller: "agent".into(),
            connection: "c1".into(),
            rpc_method: "tools/call".into(),
            tool: "write_file".into(),
            arguments_sha256: approvals::call_digest(&Call {
                sub_path: "",
                query: None,
                params: Some(args),
                session: &[],
            }),
        },
        legacy_sha256: None,
        reason: Some("ask-for-writes".into()),
        shown: Default::default(),
        credential: None,
        shape: None,
    };
    let first = approvals::settle(store, &[held("{}")], 0).await.unwrap();
    let Settled::Pending(id) = &first[0] else {
        panic!("{first:?}")
    };
    // Granted twice, but already expired: the call is held anew.
    let now = tessera::telemetry::time::now_ms();
    store.grant_approval(id, now, now - 1, 2).await.unwrap();
    let s = approvals::settle(store, &[held("{}")], 0).await.unwrap();
    assert!(matches!(&s[0], Settled::Pending(n) if n != id), "{s:?}");

    // A live grant for two uses: two runs, then held.
    let Settled::Pending(id) = &s[0] else {
        unreachable!()
    };
    store
        .grant_approval(id, now, now + 60_000, 2)
        .await
        .unwrap();
    for _ in 0..2 {
        let s = approvals::settle(store, &[held("{}")], 0).await.unwrap();
        assert_eq!(s, [Settled::Granted(id.clone())]);
    }
    let s = approvals::settle(store, &[held("{}")], 0).await.unwrap();
    assert!(matches!(&s[0], Settled::Pending(_)), "{s:?}");

    // A batch with one granted and one held call spends nothing.
    let Settled::Pending(a) = &s[0] else {
        unreachable!()
    };
    store.grant_approval(a, now, now + 60_000, 1).await.unwrap();
    let s = approvals::settle(store, &[held("{}"), held("{\"a\":1}")], 0)
        .await
        .unwrap();
    assert!(matches!(&s[0], Settled::Granted(_)) && matches!(&s[1], Settled::Pending(_)));
    let s = approvals::settle(store, &[held("{}")], 0).await.unwrap();
    assert_eq!(
        s,
        [Settled::Granted(a.clone())],
        "the grant was spent by a refused batch"
    );
}

/// POST `body` as the agent to its address with `sub_path` and `query`
/// appended and `session` as `Mcp-Session-Id`: status, headers, answer.
async fn post_call(
    a: &Agent,
    sub_path: &str,
    query: &str,
    session: Option<&str>,
    body: String,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut r = client()
        .post(format!("{}{sub_path}{query}", a.url))
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    (status, headers, v)
}

fn ran(v: &serde_json::Value) -> bool {
    v["result"]["echo"] == "tools/call"
}

/// Issue 23 §2: a grant is bound to the whole call as it reaches the
/// upstream. A grant (for many uses, so that a wrongly matching variant
/// would find uses left) for `write_file {"path":"notes.txt"}` in session
/// A, at the bare address, does not run the call at another sub-path,
/// with a query, with an extra `params` member, in another session or in
/// none: each is held as a call of its own. The exact call runs, with a
/// new `progressToken` too (it cannot change what runs).
#[tokio::test]
async fn a_grant_runs_only_the_call_a_person_approved() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let exact = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"notes.txt"}}}"#;
    // Two sessions of this caller, as tessera shows them.
    let (sess_a, sess_b) = (p.bound_session(&a, "sess-A"), p.bound_session(&a, "sess-B"));
    let (sess_a, sess_b) = (sess_a.as_str(), sess_b.as_str());

    let (s, _, v) = post_call(&a, "", "", Some(sess_a), exact.into()).await;
    assert_eq!(s, 200);
    let id = approval_in(&v);
    ok(p.cli(&["approval", "grant", &id, "--uses", "10"]));

    let extra = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"notes.txt"},"overwrite":true}}"#;
    let variants: [(&str, &str, Option<&str>, &str); 5] = [
        ("/admin/delete", "", Some(sess_a), exact),
        ("", "?mode=append", Some(sess_a), exact),
        ("", "", Some(sess_a), extra),
        ("", "", Some(sess_b), exact),
        ("", "", None, exact),
    ];
    let mut held = vec![id.clone()];
    for (sub, query, session, body) in variants {
        let (s, _, v) = post_call(&a, sub, query, session, body.into()).await;
        assert_eq!(s, 200, "{sub}{query} {session:?}: {v}");
        assert!(!ran(&v), "{sub}{query} {session:?} ran on the grant: {v}");
        let other = approval_in(&v);
        assert!(
            !held.contains(&other),
            "{sub}{query} {session:?} is not a call of its own"
        );
        held.push(other);
    }
    assert!(up.seen().is_empty(), "a variant reached the upstream");

    // The approver sees what each one is.
    let rows = p.store().approvals(false, 100).await.unwrap();
    let shown = |sub: &str, q: Option<&str>| {
        rows.iter()
            .any(|r| r.shown.sub_path.as_deref() == Some(sub) && r.shown.query.as_deref() == q)
    };
    assert!(shown("/admin/delete", None) && shown("", Some("mode=append")));
    let sessions: std::collections::HashSet<_> =
        rows.iter().map(|r| r.shown.session.clone()).collect();
    assert_eq!(sessions.len(), 3, "sess-A, sess-B and none: {sessions:?}");
    let list = ok(p.cli(&["approval", "list"]));
    assert!(
        list.contains("/admin/delete") && list.contains("?mode=append"),
        "{list}"
    );
    assert!(!list.contains(sess_a), "a session id is listed: {list}");

    // The exact call runs, in other spacing and with a progress token.
    let again = r#"{ "jsonrpc":"2.0", "id":2, "method":"tools/call",
        "params":{ "arguments":{ "path":"notes.txt" }, "name":"write_file",
                   "_meta":{ "progressToken": 99 } } }"#;
    let (s, _, v) = post_call(&a, "", "", Some(sess_a), again.into()).await;
    assert!(s == 200 && ran(&v), "{v}");
    assert_eq!(up.seen().len(), 1);
}

/// Issue 23 §2: the key keeps numbers as written. Through `f64`,
/// 1000000000000000000000 and 1000000000000000000001 were one number, and
/// a grant for one ran the other.
#[tokio::test]
async fn a_grant_for_one_big_number_does_not_run_another() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let pay = |amount: &str| call(1, "write_cheque", &format!(r#"{{"amount":{amount}}}"#));

    let (_, v) = post_json(&a, pay("1000000000000000000000")).await;
    let id = approval_in(&v);
    ok(p.cli(&["approval", "grant", &id, "--uses", "10"]));
    for other in ["1000000000000000000001", "999999999999999999999.9999"] {
        let (_, v) = post_json(&a, pay(other)).await;
        assert!(!ran(&v), "{other} ran on the grant for 10^21: {v}");
        assert_ne!(approval_in(&v), id);
    }
    assert!(up.seen().is_empty());
    let (_, v) = post_json(&a, pay("1000000000000000000000")).await;
    assert!(ran(&v), "{v}");
}

/// The connection id of an agent's address.
fn connection_of(a: &Agent) -> String {
    a.url.rsplit("/c/").next().unwrap().to_string()
}

/// Issue 23 §2: approvals recorded before calls were bound whole (their
/// key the arguments' digest, no `v2:`) survive the change. A pending one
/// is adopted by its call's next try: same id, rebound to the whole call
/// (what the approver sees is filled in), so a grant then runs that call.
/// A grant given then is not used (it was given for any sub-path, query
/// and session); a denial given then stands.
#[tokio::test]
async fn approvals_recorded_under_the_old_key_are_adopted() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let conn = connection_of(&a);
    let s1 = p.bound_session(&a, "s1");
    let old_row = |id: &str, args: &str, status: &str, grant: &str| {
        format!(
            "INSERT INTO approvals (id, created_at, caller, connection, rpc_method, tool, \
             arguments_sha256, reason, status, decided_at, expires_at, uses_left) \
             VALUES ('{id}', 1, 'agent', '{conn}', 'tools/call', 'write_file', '{}', \
             'ask-for-writes', '{status}', {grant})",
            approvals::arguments_digest(Some(args)),
        )
    };
    let far = tessera::telemetry::time::now_ms() + 3_600_000;
    raw_sql(
        p.dir.path(),
        &old_row(
            "ap_oldpending01",
            r#"{"path":"a.txt"}"#,
            "pending",
            "NULL, NULL, NULL",
        ),
    )
    .await;
    raw_sql(
        p.dir.path(),
        &old_row(
            "ap_oldgranted01",
            r#"{"path":"b.txt"}"#,
            "granted",
            &format!("1, {far}, 5"),
        ),
    )
    .await;
    raw_sql(
        p.dir.path(),
        &old_row(
            "ap_olddenied001",
            r#"{"path":"c.txt"}"#,
            "denied",
            "1, NULL, NULL",
        ),
    )
    .await;

    // The pending one: adopted, same id, now showing the whole call.
    let (_, _, v) = post_call(
        &a,
        "/x",
        "",
        Some(s1.as_str()),
        call(1, "write_file", r#"{ "path": "a.txt" }"#),
    )
    .await;
    assert_eq!(approval_in(&v), "ap_oldpending01", "{v}");
    let rows = p.store().approvals(true, 10).await.unwrap();
    let row = rows.iter().find(|r| r.id == "ap_oldpending01").unwrap();
    assert!(row.key.arguments_sha256.starts_with("v2:"), "{row:?}");
    assert_eq!(row.shown.sub_path.as_deref(), Some("/x"));
    // Adopted by that call only: the same arguments elsewhere wait apart.
    let (_, _, v) = post_call(
        &a,
        "",
        "",
        None,
        call(2, "write_file", r#"{"path":"a.txt"}"#),
    )
    .await;
    assert_ne!(approval_in(&v), "ap_oldpending01");
    ok(p.cli(&["approval", "grant", "ap_oldpending01"]));
    let (_, _, v) = post_call(
        &a,
        "/x",
        "",
        Some(s1.as_str()),
        call(3, "write_file", r#"{"path":"a.txt"}"#),
    )
    .await;
    assert!(ran(&v), "{v}");

    // The old grant runs nothing; the old denial stands.
    let (_, v) = post_json(&a, call(4, "write_file", r#"{"path":"b.txt"}"#)).await;
    assert!(!ran(&v), "{v}");
    assert_ne!(approval_in(&v), "ap_oldgranted01");
    let (_, v) = post_json(&a, call(5, "write_file", r#"{"path":"c.txt"}"#)).await;
    assert_eq!(approval_in(&v), "ap_olddenied001");
    assert!(v["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("denied"));
    assert_eq!(up.seen().len(), 1);
}

/// Issue 23 §2: `--max-pending-approvals`. One caller's distinct held
/// calls beyond the cap are refused (429, Retry-After, a JSON-RPC error)
/// and recorded nowhere, never reaching the upstream; a retry of a call
/// already pending is not refused; another caller is not affected; a
/// decision makes room.
#[tokio::test]
async fn pending_approvals_are_capped_per_caller() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(
        Proxy::dir(),
        |c| c.max_pending_approvals = 3,
        policies_with(&["ask-for-writes"]),
    )
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let b = p.agent("gh", &up.url("/mcp"), "other").await;
    let write = |n: u32| call(n, "write_file", &format!(r#"{{"path":"{n}.txt"}}"#));

    let mut ids = Vec::new();
    for n in 1..=3 {
        let (s, v) = post_json(&a, write(n)).await;
        assert_eq!(s, 200);
        ids.push(approval_in(&v));
    }
    let (s, h, v) = post_json_headers(&a, write(4)).await;
    assert_eq!(s, 429, "{v}");
    assert_eq!(h["retry-after"], "60");
    assert_eq!(v["id"], 4);
    assert_eq!(v["error"]["code"], -32029, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waiting for a person's approval"),
        "{v}"
    );
    // A batch that would add two: refused whole, nothing recorded.
    let (s, v) = post_json(&a, format!("[{},{}]", write(5), write(6))).await;
    assert_eq!(s, 429, "{v}");
    assert_eq!(
        p.store()
            .pending_approvals_of("agent", tessera::telemetry::time::now_ms())
            .await
            .unwrap(),
        3
    );

    // A call already pending is answered with its approval.
    let (s, v) = post_json(&a, write(2)).await;
    assert_eq!((s, approval_in(&v)), (200, ids[1].clone()));
    // Another caller has its own count.
    let (s, v) = post_json(&b, write(4)).await;
    assert_eq!(s, 200);
    approval_in(&v);
    assert!(up.seen().is_empty());

    // A person's decision makes room.
    ok(p.cli(&["approval", "deny", &ids[0]]));
    let (s, v) = post_json(&a, write(4)).await;
    assert_eq!(s, 200, "{v}");
    approval_in(&v);
}

/// A tool name is an agent's words: in `approval list` and `audit` it is
/// shown printable, so an escape sequence or a line break in it cannot
/// colour the approver's table or forge a row (found by the new-user
/// review).
#[tokio::test]
async fn an_agents_tool_name_cannot_forge_the_approvers_listing() {
    let up = Upstream::start().await;
    let ask = r#"@id("ask-all") @ask
permit (principal, action == Action::"tools/call", resource);"#;
    let policies = tessera::authz::cedar::Policies::from_texts(
        "test",
        None,
        vec![
            (
                "default.cedar".to_string(),
                std::fs::read_to_string(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/default.cedar"),
                )
                .unwrap(),
            ),
            ("ask.cedar".to_string(), ask.to_string()),
        ],
    )
    .unwrap();
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let tool = "write_\u{1b}[31mEVIL\u{1b}[0m\nap_fake00000000  pending  x\u{2028}y";
    let body = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":tool,"arguments":{}}})
    .to_string();
    let (s, v) = post_json(&a, body).await;
    assert_eq!(s, 200, "{v}");
    approval_in(&v);
    // The audit queue flushed, so `tessera audit` reads the row.
    assert!(!audit_rows(&p).await.is_empty());
    for args in [&["approval", "list"][..], &["audit"]] {
        let out = ok(p.cli(args));
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{2028}'),
            "{args:?}: {out}"
        );
        assert!(out.contains("write_\\u{1b}[31mEVIL"), "{args:?}: {out}");
        assert!(
            !out.lines().any(|l| l.starts_with("ap_fake")),
            "{args:?}: {out}"
        );
    }
}
