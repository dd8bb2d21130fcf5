//! The ops listener (`--ops-listen`): `/livez`, `/readyz` and `/metrics`
//! for probes and scrapers, always on, with no admin token, and answering
//! `/livez` and `/metrics` from memory while the database fails.

use std::time::Duration;

use crate::db_faults::Fault;
use crate::support::*;

/// GET `url`: status, `Content-Type` and body.
async fn get(url: String) -> (u16, String, String) {
    let r = tokio::time::timeout(Duration::from_secs(5), client().get(&url).send())
        .await
        .unwrap_or_else(|_| panic!("{url} did not answer within 5 s"))
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

/// `serve` with no admin token at all: the admin listener stays closed,
/// the ops listener answers every probe without a token.
#[tokio::test]
async fn the_ops_listener_answers_without_any_admin_token() {
    let dir = Proxy::dir();
    let ops = format!("127.0.0.1:{}", Served::free_port());
    let admin = format!("127.0.0.1:{}", Served::free_port());
    let args = [
        "--ops-listen",
        ops.as_str(),
        "--admin-listen",
        admin.as_str(),
        "--db-pool-size",
        "3",
    ];
    let mut s = Served::start(dir.path(), Served::free_port(), &args, &[]).await;
    assert!(s.log.contains("admin listener off"), "{}", s.log);
    assert!(
        s.log.contains(&format!("ops_listen={ops}")),
        "the ops listener's address is not logged: {}",
        s.log
    );
    assert!(client()
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .is_err());

    let (status, _, body) = get(format!("http://{ops}/livez")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, body) = get(format!("http://{ops}/readyz")).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true, "{v}");
    assert_eq!(v["database"], "ok", "{v}");
    let (status, ct, text) = get(format!("http://{ops}/metrics")).await;
    assert_eq!(status, 200, "{text}");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    for line in [
        "# TYPE tessera_requests_total counter",
        "tessera_audit_write_failing 0",
        "tessera_open_streams 0",
        // --db-pool-size, and the pool's own counts.
        "tessera_db_pool_max_connections 3",
        "# TYPE tessera_db_pool_connections gauge",
        "# TYPE tessera_db_pool_idle_connections gauge",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let open: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("tessera_db_pool_connections "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&open), "{open} connections open");
    let (status, _, _) = get(format!("http://{ops}/v1/callers")).await;
    assert_eq!(status, 404, "the ops listener serves no admin API");
    // `tessera probe`, the image's healthcheck (it has no curl).
    for check in ["livez", "readyz"] {
        let o = cli(dir.path(), &["probe", check, "--ops-listen", &ops]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    s.signal("TERM");
    s.read_to_end().await;

    // `off` turns it off (the setting as an environment variable).
    let mut s = Served::start(
        dir.path(),
        Served::free_port(),
        &[],
        &[("TESSERA_OPS_LISTEN", "off")],
    )
    .await;
    assert!(s.log.contains("ops listener off"), "{}", s.log);
    assert!(!s.log.contains("ops_listen="), "{}", s.log);
    s.signal("TERM");
    s.read_to_end().await;
}

/// While the database fails, `/livez` and `/metrics` answer from memory,
/// `/readyz` is 503 naming the database; healed, `/readyz` is 200 again.
#[tokio::test]
async fn during_a_database_outage_livez_and_metrics_answer_and_readyz_names_the_database() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let mut fault = Fault::new(dir.path()).await;
    let url = fault.url();
    let p = Proxy::start_on(
        dir,
        url,
        |c| c.db_timeout = Duration::from_millis(300),
        tessera::authz::cedar::Policies::builtin(),
    )
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ops = format!("http://{}", p.ops);
    let (status, _, body) = get(format!("{ops}/readyz")).await;
    assert_eq!(status, 200, "{body}");

    fault.fail().await;
    // A call served from the snapshot queues its audit record; the writer
    // cannot write it.
    let (s, v) = post_json(&a, tools_call(1, "search")).await;
    assert_eq!(s, 200, "{v}");
    let readyz = || get(format!("{ops}/readyz"));
    let readyz = &readyz;
    within(Duration::from_secs(20), || async move {
        readyz().await.0 == 503
    })
    .await;
    let (status, _, body) = readyz().await;
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], false, "{v}");
    let database = v["database"].as_str().unwrap();
    assert!(
        database != "ok" && database.contains("database"),
        "the failing check is not named: {v}"
    );
    assert_eq!(v["master_key"], "ok", "{v}");
    assert!(v["policies"].as_str().unwrap().starts_with("ok"), "{v}");
    let o = cli(
        p.dir.path(),
        &["probe", "readyz", "--ops-listen", &p.ops.to_string()],
    );
    assert!(!o.status.success(), "probe said ready");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("503") && err.contains("database"), "{err}");

    let (status, _, body) = get(format!("{ops}/livez")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    // From memory: answered well within the database's timeout, while
    // every query would wait for it.
    let asked = std::time::Instant::now();
    let (status, _, text) = get(format!("{ops}/metrics")).await;
    assert!(
        asked.elapsed() < Duration::from_millis(300),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(status, 200, "{text}");
    assert!(
        text.lines().any(|l| l == "tessera_audit_write_failing 1"),
        "{text}"
    );

    fault.heal().await;
    within(Duration::from_secs(20), || async move {
        readyz().await.0 == 200
    })
    .await;
}

/// `tessera log-level` changes a running serve's filter through
/// `PUT /v1/log-level`: a debug line (the snapshot reload an admin change
/// causes) appears once the level is debug and is gone again at info. A
/// filter that does not parse is a 400 saying what to give; every attempt
/// is in the admin audit; an approver token may not change the level.
#[tokio::test]
async fn the_log_level_changes_while_serving() {
    let dir = Proxy::dir();
    let d = dir.path();
    let token = last_line(&cli(d, &["admin-token", "add", "ops"]));
    let approver = last_line(&cli(
        d,
        &["admin-token", "add", "pager", "--role", "approver"],
    ));
    let up = Upstream::start().await;
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let admin = format!("127.0.0.1:{}", Served::free_port());
    let mut s = Served::start(
        d,
        port,
        &["--admin-listen", admin.as_str()],
        &[("RUST_LOG", "info")],
    )
    .await;
    s.wait_for("admin API serving").await;
    let reloads = |log: &str| log.matches("snapshot reloaded").count();
    // Served once the snapshot holds it, its access line written after.
    let served = |a: Agent, caller: &'static str| async move {
        let a = &a;
        within(Duration::from_secs(10), || async move {
            send_call(a, 1).await.status() == 200
        })
        .await;
        caller
    };
    let set = |level: &str| {
        tessera(d)
            .args(["log-level", level])
            .env("TESSERA_ADMIN_LISTEN", &admin)
            .env("TESSERA_ADMIN_TOKEN", &token)
            .output()
            .unwrap()
    };

    // At info: admin changes reload the snapshot without a debug line.
    let caller = served(
        register(d, &public, "gh", &up.url("/mcp"), "agent-1"),
        "agent-1",
    )
    .await;
    s.wait_for(&format!("caller={caller}")).await;
    assert_eq!(reloads(&s.log), 0, "{}", s.log);

    let o = set("debug");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "log filter in force: debug"
    );
    // The change is in the log too, naming who made it.
    s.wait_for("log level changed").await;
    assert!(s.log.contains("by=ops level=debug"), "{}", s.log);
    assert!(cli(d, &["caller", "add", "agent-x"]).status.success());
    s.wait_for("snapshot reloaded").await;
    let at_debug = reloads(&s.log);

    // Directives work too; back at info the reloads are silent again.
    let o = set("info,tessera::access=info");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let caller = served(
        register(d, &public, "gh2", &up.url("/mcp"), "agent-2"),
        "agent-2",
    )
    .await;
    s.wait_for(&format!("caller={caller}")).await;
    assert_eq!(reloads(&s.log), at_debug, "{}", s.log);

    // A filter that does not parse: 400, what to give, nothing changed.
    let put = |token: &str, body: serde_json::Value| {
        client()
            .put(format!("http://{admin}/v1/log-level"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    let r = put(&token, serde_json::json!({"level": "tessera=loud"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("tessera=loud") && error.contains("give a level"),
        "{error}"
    );
    let o = set("tessera=loud");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("400"));
    let r = client()
        .get(format!("http://{admin}/v1/log-level"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["level"], "info,tessera::access=info");
    // An approver may not.
    let r = put(&approver, serde_json::json!({"level": "trace"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Each change, and each refusal, is in the admin audit under the token.
    let r = client()
        .get(format!("http://{admin}/v1/admin-audit"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let rows: serde_json::Value = r.json().await.unwrap();
    let mut set_rows: Vec<(String, String, bool)> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "log-level.set")
        .map(|r| {
            (
                r["actor"].as_str().unwrap().to_string(),
                r["target"].as_str().unwrap().to_string(),
                r["outcome"] == "ok",
            )
        })
        .collect();
    set_rows.sort();
    let row = |t: &str, ok| ("ops".to_string(), t.to_string(), ok);
    assert_eq!(
        set_rows,
        vec![
            row("debug", true),
            row("info,tessera::access=info", true),
            row("tessera=loud", false),
            row("tessera=loud", false),
        ]
    );
    s.signal("TERM");
    s.read_to_end().await;
}

/// `tessera_upstream_responses` counts each exchange by credential and
/// outcome: an answer by its status class, no answer by why. Nothing else
/// becomes a label (no address, no caller, no tool).
#[tokio::test]
async fn upstream_outcomes_are_counted_per_credential() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let ok = p.agent("gh", &up.url("/mcp"), "agent").await;
    let refused = p.agent("tracker", &up.url("/deny"), "agent2").await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}/mcp", closed.local_addr().unwrap());
    drop(closed);
    let down = p.agent("db", &gone, "agent3").await;
    for (a, n) in [(&ok, 2), (&refused, 1), (&down, 1)] {
        for i in 0..n {
            let _ = send_call(a, i).await.bytes().await;
        }
    }
    let (status, _, text) = get(format!("http://{}/metrics", p.ops)).await;
    assert_eq!(status, 200);
    for line in [
        "# TYPE tessera_upstream_responses_total counter",
        r#"tessera_upstream_responses_total{credential="gh",outcome="2xx"} 2"#,
        r#"tessera_upstream_responses_total{credential="tracker",outcome="4xx"} 1"#,
        r#"tessera_upstream_responses_total{credential="db",outcome="unreachable"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tessera_upstream_responses_total{"))
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
}
