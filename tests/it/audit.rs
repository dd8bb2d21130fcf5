//! The audit trail: a row per authorization decision with the verdict and
//! the policies behind it, nothing secret in it, nothing lost when the
//! queue is full.

use tessera::crypto::tokens::sha256_hex;

use crate::support::*;

async fn call(a: &Agent, body: String) -> u16 {
    client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn every_decision_is_audited_and_nothing_secret() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let conn = a.url.rsplit('/').next().unwrap().to_string();
    let args = r#"{"repo":"octo/x","token_in_args":"not a tessera secret"}"#;
    let body = |id: u32, tool: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        )
    };
    assert_eq!(call(&a, body(1, "update_issue")).await, 200);
    assert_eq!(call(&a, body(2, "delete_repo")).await, 200);
    let get = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    // Refused before any decision: in the access log, not the audit trail.
    let wrong = client()
        .post(&a.url)
        .bearer_auth("tsr_wrong")
        .body(body(3, "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);

    let r = audit_rows(&p).await;
    assert_eq!(r.len(), 3, "{r:#?}");
    let digest = sha256_hex(args.as_bytes());
    let allowed = &r[0];
    assert_eq!(
        (
            allowed.caller.as_str(),
            allowed.connection.as_str(),
            allowed.http_method.as_str()
        ),
        ("agent", conn.as_str(), "POST")
    );
    assert_eq!(allowed.rpc_method.as_deref(), Some("tools/call"));
    assert_eq!(allowed.tool.as_deref(), Some("update_issue"));
    assert_eq!((allowed.verdict.as_str(), allowed.status), ("allow", 200));
    assert_eq!(allowed.reason.as_deref(), Some("own-connections"));
    assert_eq!(allowed.arguments_sha256.as_deref(), Some(digest.as_str()));
    assert_eq!(
        allowed.arguments, None,
        "arguments are kept only when asked"
    );
    let denied = &r[1];
    assert_eq!(denied.tool.as_deref(), Some("delete_repo"));
    assert_eq!((denied.verdict.as_str(), denied.status), ("deny", 200));
    assert_eq!(denied.reason.as_deref(), Some("no-destructive-tools"));
    let stream = &r[2];
    assert_eq!(
        (stream.http_method.as_str(), stream.rpc_method.as_deref()),
        ("GET", None)
    );
    assert_eq!(stream.verdict, "allow");
    assert!(r.iter().all(|x| x.at > 0 && x.duration_us >= 0));
    assert_eq!(
        up.seen().len(),
        2,
        "the denied call did not reach the upstream"
    );

    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    assert_no_plaintext(p.dir.path(), &[SECRET, &a.token]);
}

#[tokio::test]
async fn arguments_are_kept_when_asked() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| c.audit_arguments = true).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"q":[1,2]}}}"#;
    assert_eq!(call(&a, body.to_string()).await, 200);
    let r = audit_rows(&p).await;
    assert_eq!(r[0].arguments.as_deref(), Some(r#"{"q":[1,2]}"#));
}

#[tokio::test]
async fn a_full_queue_makes_requests_wait_and_loses_nothing() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| c.audit_queue = 1).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let calls = (0..60).map(|i| call(&a, tools_call(i, "t")));
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 200));
    let r = audit_rows(&p).await;
    assert_eq!(r.len(), 60, "audit records were lost");
    let mut ids: Vec<_> = r.iter().map(|x| x.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 60);
}

#[tokio::test]
async fn the_cli_lists_and_filters_the_trail() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let b = p.agent("gh", &up.url("/mcp"), "other").await;
    assert_eq!(call(&a, tools_call(1, "tool_a")).await, 200);
    assert_eq!(call(&b, tools_call(2, "tool_b")).await, 200);
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    let d = p.dir.path();
    let o = cli(
        d,
        &["audit", "--caller", "agent", "--json", "--since", "1h"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["tool"], "tool_a");
    let o = cli(d, &["audit"]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("tool_a") && out.contains("tool_b"), "{out}");
    let o = cli(d, &["audit", "--since", "yesterday"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("30s, 15m, 1h, 7d"));
}

#[tokio::test]
async fn audit_follow_prints_records_as_they_are_written() {
    use tokio::io::AsyncBufReadExt;

    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    assert_eq!(call(&a, tools_call(1, "before_follow")).await, 200);
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    let mut child = tessera_async(p.dir.path())
        .args(["audit", "--json", "--follow"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_tool = async || {
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
            .await
            .expect("no audit line within 10 s")
            .unwrap()
            .expect("audit --follow ended");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["tool"].as_str().unwrap().to_string()
    };
    assert_eq!(next_tool().await, "before_follow");
    // A record written after it started is printed too.
    assert_eq!(call(&a, tools_call(2, "after_follow")).await, 200);
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    assert_eq!(next_tool().await, "after_follow");
}

/// A record with values that differ per `i`, for store-level tests.
fn record(i: i64) -> tessera::store::model::AuditRecord {
    tessera::store::model::AuditRecord {
        id: 0,
        at: 1_796_300_000_000 + i,
        caller: format!("agent-{i}"),
        connection: "c".repeat(32),
        http_method: "POST".into(),
        rpc_method: Some("tools/call".into()),
        tool: (i % 2 == 0).then(|| format!("tool-{i}")),
        verdict: if i % 3 == 0 { "deny" } else { "allow" }.into(),
        reason: Some(format!("policy-{i}")),
        arguments_sha256: None,
        arguments: (i % 5 == 0).then(|| format!("{{\"n\":{i}}}")),
        status: 200 + (i % 7) as u16,
        duration_us: i,
        request_id: (i % 4 != 0).then(|| format!("{i:032x}")),
    }
}

/// An admin command (another process, its own connections) changes the
/// store while the server's audit writer writes batch after batch: each
/// change waits its turn for the write lock instead of failing with
/// "database is locked". A SQLite transaction that reads before it writes
/// cannot take the lock once the writer has committed past what it read,
/// so admin transactions take the lock up front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_wait_for_a_busy_audit_writer() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    let dir = Proxy::dir();
    let server = dir.store().await;
    let admin = dir.store().await;
    let done = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let done = done.clone();
        async move {
            // A commit every millisecond or two, like the server's writer
            // under steady load. (Neither side writes back to back:
            // SQLite's lock has no queue, and a writer that never lets go
            // starves the other past its busy timeout, fix or no fix.)
            let mut batch: Vec<_> = (0..100).map(record).collect();
            let sink = server.audit_sink().unwrap();
            let mut batches = 0;
            while !done.load(Relaxed) {
                sink.write(&mut batch).await.unwrap();
                batches += 1;
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            batches
        }
    });
    let changes = async {
        for i in 0..40u8 {
            let name = format!("caller-{i}");
            admin.add_caller(&name, &[i; 32], &[]).await?;
            admin.revoke_caller(&name).await?;
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        Ok::<_, tessera::store::StoreError>(())
    }
    .await;
    done.store(true, Relaxed);
    let batches = writer.await.unwrap();
    changes.expect("every admin change lands while the writer writes");
    assert!(batches > 1, "the writer wrote {batches} batches meanwhile");
}

/// Batches are written as power-of-two chunks in one transaction: every
/// size from 1 to past two full chunks lands whole, in order, each record
/// with its own values. Pages of them come back as asked.
#[tokio::test]
async fn batches_of_every_size_land_whole_and_in_order() {
    let dir = Proxy::dir();
    let store = dir.store().await;
    let sink = store.audit_sink().unwrap();
    let mut next = 0;
    let mut sizes: Vec<i64> = (1..=33).collect();
    sizes.extend([
        63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 511, 512, 513, 700,
    ]);
    for n in sizes {
        let mut batch: Vec<_> = (next..next + n).map(record).collect();
        sink.write(&mut batch).await.unwrap();
        next += n;
    }
    let rows = store
        .audit(&tessera::store::model::AuditQuery {
            limit: 100_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows.len() as i64, next);
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    for (i, row) in rows.into_iter().enumerate() {
        assert_eq!(
            tessera::store::model::AuditRecord { id: 0, ..row },
            record(i as i64)
        );
    }

    // Pages: the newest (oldest first), those after an id, and the newest
    // since a time.
    let page = |q: tessera::store::model::AuditQuery| {
        let store = store.clone();
        async move {
            let rows = store.audit(&q).await.unwrap();
            rows.iter().map(|r| r.at - record(0).at).collect::<Vec<_>>()
        }
    };
    let q = |limit| tessera::store::model::AuditQuery {
        limit,
        ..Default::default()
    };
    let last = next - 1;
    assert_eq!(page(q(3)).await, [last - 2, last - 1, last]);
    let after = tessera::store::model::AuditQuery {
        after_id: Some(ids[99]),
        ..q(3)
    };
    assert_eq!(page(after).await, [100, 101, 102]);
    let before = tessera::store::model::AuditQuery {
        before_id: Some(ids[100]),
        ..q(3)
    };
    assert_eq!(page(before).await, [97, 98, 99]);
    let since = tessera::store::model::AuditQuery {
        since: Some(record(last - 1).at),
        ..q(5)
    };
    assert_eq!(page(since).await, [last - 1, last]);
    let mine = tessera::store::model::AuditQuery {
        caller: Some("agent-7".into()),
        ..q(5)
    };
    assert_eq!(page(mine).await, [7]);
}
