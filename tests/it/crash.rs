//! kill -9 on a real `tessera serve` in the middle of admin writes (the
//! admin API adding callers) and of heavy audit traffic (tool calls from
//! many tasks): every admin write that was answered is in the database,
//! every change there has its admin-audit record and no record lacks its
//! change, the audit rows that were committed are whole, the SQLite file
//! passes its integrity check, and the next start serves from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;

const ADMIN_WORKERS: usize = 4;
const CALL_WORKERS: usize = 16;

async fn names(dir: &std::path::Path, sql: &str) -> std::collections::BTreeSet<String> {
    sqlx::any::install_default_drivers();
    let url = database_url(dir)
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("tessera.db").display()));
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let rows: Vec<String> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
    pool.close().await;
    rows.into_iter().collect()
}

#[tokio::test]
async fn kill_9_during_admin_writes_and_audit_traffic_loses_no_committed_row() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let admin = format!("127.0.0.1:{}", Served::free_port());
    let public = format!("http://127.0.0.1:{port}");
    let agent = Arc::new(register(
        dir.path(),
        &public,
        "gh",
        &up.url("/mcp"),
        "agent",
    ));
    let token = last_line(&cli(dir.path(), &["admin-token", "add", "ops"]));
    let args = ["--admin-listen", admin.as_str()];
    // No per-caller limits: the load is the point. No access log either:
    // nothing reads the process's stderr once it serves.
    let unlimited = [
        ("TESSERA_CALLER_RATE", "0"),
        ("TESSERA_CALLER_MAX_IN_FLIGHT", "0"),
        ("RUST_LOG", "info,tessera::access=warn"),
    ];
    let mut served = Served::start(dir.path(), port, &args, &unlimited).await;

    // Admin writers: each caller added is kept once its 201 is read.
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for w in 0..ADMIN_WORKERS {
        let (acked, admin, token) = (acked.clone(), admin.clone(), token.clone());
        workers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("c{w}-{i}");
                let r = client()
                    .post(format!("http://{admin}/v1/callers"))
                    .bearer_auth(&token)
                    .json(&serde_json::json!({ "name": name }))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => acked.lock().unwrap().push(name),
                    Ok(r) => panic!("adding {name}: {}", r.status()),
                    Err(_) => return,
                }
            }
        }));
    }
    // Callers: tool calls as fast as they are answered.
    let answered = Arc::new(AtomicU64::new(0));
    for w in 0..CALL_WORKERS {
        let (answered, agent) = (answered.clone(), agent.clone());
        workers.push(tokio::spawn(async move {
            for i in 0.. {
                let r = client()
                    .post(&agent.url)
                    .bearer_auth(&agent.token)
                    .body(tools_call(i, &format!("w{w}")))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => panic!("a call got {}", r.status()),
                    Err(_) => return,
                }
            }
        }));
    }
    within(Duration::from_secs(60), || async {
        acked.lock().unwrap().len() >= 40 && answered.load(Ordering::Relaxed) >= 2_000
    })
    .await;

    served.child.start_kill().unwrap();
    let status = served.child.wait().await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    for w in workers {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a worker did not notice the process had gone")
            .unwrap();
    }
    let acked: Vec<String> = acked.lock().unwrap().clone();
    let answered = answered.load(Ordering::Relaxed);

    if database_url(dir.path()).is_none() {
        let check = names(dir.path(), "PRAGMA integrity_check").await;
        assert_eq!(check.into_iter().collect::<Vec<_>>(), ["ok"]);
    }
    // Every answered admin write is there, and changes and their records
    // match one for one: nothing half-written.
    let callers = names(dir.path(), "SELECT name FROM callers WHERE name LIKE 'c%'").await;
    let recorded = names(
        dir.path(),
        "SELECT target FROM admin_audit \
         WHERE action = 'caller.add' AND outcome = 'ok' AND target LIKE 'c%'",
    )
    .await;
    let missing: Vec<&String> = acked.iter().filter(|n| !callers.contains(*n)).collect();
    assert!(missing.is_empty(), "answered but lost: {missing:?}");
    let unmatched: Vec<&String> = callers.symmetric_difference(&recorded).collect();
    assert!(
        unmatched.is_empty(),
        "a change without its record or the reverse: {unmatched:?}"
    );
    // The audit rows committed are whole; those still queued at the kill
    // are the ones lost (SIGTERM writes them).
    let rows = names(
        dir.path(),
        "SELECT tool || ' ' || verdict || ' ' || CAST(status AS TEXT) FROM audit",
    )
    .await;
    assert!(!rows.is_empty());
    assert!(
        rows.iter()
            .all(|r| r.starts_with('w') && r.ends_with(" allow 200")),
        "{rows:?}"
    );
    let written = names(dir.path(), "SELECT CAST(COUNT(*) AS TEXT) FROM audit").await;
    let written: u64 = written.first().unwrap().parse().unwrap();
    eprintln!(
        "killed after {} admin writes answered ({} committed) and {answered} calls answered \
         ({written} audit rows committed)",
        acked.len(),
        callers.len()
    );

    // The next start reads it all and serves.
    let _served = Served::start(dir.path(), port, &args, &unlimited).await;
    let r = send_call(&agent, 1).await;
    assert_eq!(r.status(), 200);
    let r = client()
        .post(format!("http://{admin}/v1/callers"))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "name": "after" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}
