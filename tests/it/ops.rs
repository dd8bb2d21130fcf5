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
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let (status, _, _) = get(format!("http://{ops}/v1/callers")).await;
    assert_eq!(status, 404, "the ops listener serves no admin API");
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
