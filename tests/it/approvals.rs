//! Ask: an `@ask` policy holds a call for a person. The call is answered
//! with a result the model can read naming the approval; a person grants or
//! denies it with the CLI; a retry of the same call (same arguments, in any
//! spacing or key order) then runs once; another call needs its own
//! approval; a denial stands. Nothing held reaches the upstream.

use crate::support::*;
use tessera::approvals::{self, CallKey, Held, Settled};

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
    assert_eq!(
        denied["arguments"],
        serde_json::Value::Null,
        "arguments kept without --audit-arguments"
    );

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
            arguments_sha256: approvals::arguments_digest(Some(args)),
        },
        arguments: None,
        reason: Some("ask-for-writes".into()),
    };
    let first = approvals::settle(store, &[held("{}")]).await.unwrap();
    let Settled::Pending(id) = &first[0] else {
        panic!("{first:?}")
    };
    // Granted twice, but already expired: the call is held anew.
    let now = approvals::now_ms();
    store.grant_approval(id, now, now - 1, 2).await.unwrap();
    let s = approvals::settle(store, &[held("{}")]).await.unwrap();
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
        let s = approvals::settle(store, &[held("{}")]).await.unwrap();
        assert_eq!(s, [Settled::Granted(id.clone())]);
    }
    let s = approvals::settle(store, &[held("{}")]).await.unwrap();
    assert!(matches!(&s[0], Settled::Pending(_)), "{s:?}");

    // A batch with one granted and one held call spends nothing.
    let Settled::Pending(a) = &s[0] else {
        unreachable!()
    };
    store.grant_approval(a, now, now + 60_000, 1).await.unwrap();
    let s = approvals::settle(store, &[held("{}"), held("[1]")])
        .await
        .unwrap();
    assert!(matches!(&s[0], Settled::Granted(_)) && matches!(&s[1], Settled::Pending(_)));
    let s = approvals::settle(store, &[held("{}")]).await.unwrap();
    assert_eq!(
        s,
        [Settled::Granted(a.clone())],
        "the grant was spent by a refused batch"
    );
}
