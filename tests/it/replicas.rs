//! Several `tessera serve` processes over one Postgres store: what one
//! replica or the CLI changes reaches every replica within a second, by
//! NOTIFY and not by polling; a replica that dies takes only its own
//! streams along; two replicas whose OAuth token expires together make one
//! token request, and a replica killed mid-refresh releases the lock at
//! once. (Postgres leg only: see tests/postgres.rs.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::oauth::{AuthServer, Mode, CLIENT_ID, FIRST_REFRESH};
use crate::support::*;

/// The same connection reached through the replica on `port`.
fn via(a: &Agent, port: u16) -> Agent {
    let mut url = url::Url::parse(&a.url).unwrap();
    url.set_port(Some(port)).unwrap();
    Agent {
        token: a.token.clone(),
        url: url.to_string(),
    }
}

/// Flags for a replica that effectively never polls: a change can only
/// reach it in time by notification.
const NO_POLLING: [&str; 2] = ["--refresh-ms", "60000"];

/// One scalar from the data dir's database.
async fn scalar(dir: &std::path::Path, sql: &str) -> i64 {
    let pool = sqlx::PgPool::connect(&database_url(dir).unwrap())
        .await
        .unwrap();
    let v = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
    pool.close().await;
    v
}

#[tokio::test]
async fn changes_reach_every_replica_within_a_second_by_notification() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let a = register(
        d,
        &format!("http://127.0.0.1:{pa}"),
        "gh",
        &up.url("/mcp"),
        "agent",
    );
    let b = via(&a, pb);
    let pol = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::copy(root.join("default.cedar"), pol.path().join("default.cedar")).unwrap();
    let mut args = NO_POLLING.to_vec();
    // Nor do the replicas look at their policy folder by themselves.
    args.extend([
        "--policies",
        pol.path().to_str().unwrap(),
        "--policy-check-ms",
        "3600000",
    ]);
    let mut ra = Served::start(d, pa, &args, &[]).await;
    let mut rb = Served::start(d, pb, &args, &[]).await;
    let allowed = Arc::new(AtomicUsize::new(0));
    let call = |agent: &Agent, body: String| {
        let agent = Agent {
            token: agent.token.clone(),
            url: agent.url.clone(),
        };
        let allowed = allowed.clone();
        async move {
            let (status, _) = post_json(&agent, body).await;
            if status == 200 {
                allowed.fetch_add(1, Ordering::Relaxed);
            }
            status
        }
    };
    for r in [&a, &b] {
        assert_eq!(call(r, tools_call(1, "search")).await, 200);
    }

    // A secret replaced through the CLI: each replica sends the new one.
    let o = tessera(d)
        .args(["credential", "set-secret", "gh", "--secret-env", "NEW"])
        .env("NEW", "second-secret-Wq2pL7")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for r in [&a, &b] {
        within(Duration::from_secs(1), || {
            let (call, up) = (call(r, tools_call(2, "search")), &up);
            async move {
                assert_eq!(call.await, 200);
                let last = up.seen().last().unwrap().headers.clone();
                last["authorization"] == "Bearer second-secret-Wq2pL7"
            }
        })
        .await;
    }

    // `tessera policy reload` makes each replica read its folder again.
    std::fs::write(
        pol.path().join("no-list.cedar"),
        "@id(\"no-list\")\nforbid (principal, action == Action::\"tools/list\", resource);\n",
    )
    .unwrap();
    let list = || r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#.to_string();
    assert_eq!(
        call(&b, list()).await,
        200,
        "the edit alone changes nothing"
    );
    last_line(&tessera(d).args(["policy", "reload"]).output().unwrap());
    for r in [&a, &b] {
        within(Duration::from_secs(1), || {
            let call = call(r, list());
            async move { call.await == 403 }
        })
        .await;
    }

    // A lost notification connection: each replica reconnects and reloads,
    // so a change made meanwhile is not missed.
    let cut = scalar(
        d,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'tessera-listen' AND datname = current_database()",
    )
    .await;
    assert_eq!(cut, 2, "one listening connection per replica");
    let o = tessera(d)
        .args(["caller", "revoke", "agent"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for r in [&a, &b] {
        within(Duration::from_secs(1), || {
            let call = call(r, tools_call(4, "search"));
            async move { call.await == 403 }
        })
        .await;
    }
    for r in [&mut ra, &mut rb] {
        r.wait_for("the change notification connection").await;
    }

    // Every allowed request of both replicas is in the one audit trail once
    // they have stopped (a stop flushes the audit queue).
    for r in [&mut ra, &mut rb] {
        r.signal("TERM");
        assert!(r.child.wait().await.unwrap().success());
    }
    let rows = scalar(d, "SELECT count(*) FROM audit WHERE verdict = 'allow'").await;
    assert_eq!(rows, allowed.load(Ordering::Relaxed) as i64);
}

#[tokio::test]
async fn a_replica_killed_mid_stream_leaves_the_other_serving() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let public = format!("http://127.0.0.1:{pa}");
    let streaming = register(d, &public, "events", &up.url("/sse"), "agent");
    let other = register(d, &public, "gh", &up.url("/mcp"), "agent-2");
    let mut ra = Served::start(d, pa, &[], &[]).await;
    let _rb = Served::start(d, pb, &[], &[]).await;

    let mut stream = client()
        .post(&streaming.url)
        .bearer_auth(&streaming.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(tools_call(1, "watch"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let tx = up.sse_sender().await;
    tx.send("data: one\n\n".into()).await.unwrap();
    let first = stream.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: one\n\n");

    ra.child.kill().await.unwrap();
    // The stream through the dead replica ends; its upstream side closes.
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
        .await
        .expect("the stream through a killed replica did not end");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(5), tx.closed())
        .await
        .expect("the upstream stream stayed open");

    // The other replica serves new requests, for either connection.
    assert_eq!(
        post_json(&via(&other, pb), tools_call(2, "search")).await.0,
        200
    );
    let again = client()
        .post(via(&streaming, pb).url)
        .bearer_auth(&streaming.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(tools_call(3, "watch"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}

#[tokio::test]
async fn replicas_whose_token_expires_together_make_one_refresh() {
    // The first token is fresh for 2 s (it expires in 62 s; tessera
    // refreshes 60 s ahead). The refresh token rotates on use, so a second
    // refresh with the spent one would fail with invalid_grant.
    let auth = AuthServer::start(62, true).await;
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let o = tessera(d)
        .args([
            "credential",
            "add",
            "saas",
            "--upstream",
            &format!("{}/mcp", auth.base),
            "--scheme",
            "oauth2",
            "--token-url",
            &format!("{}/token", auth.base),
            "--client-id",
            CLIENT_ID,
            "--refresh-token-env",
            "REFRESH",
        ])
        .env("REFRESH", FIRST_REFRESH)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = last_line(&cli(d, &["caller", "add", "agent"]));
    let url = last_line(&cli(
        d,
        &[
            "connection",
            "add",
            "--caller",
            "agent",
            "--credential",
            "saas",
            "--public-url",
            &format!("http://127.0.0.1:{pa}"),
        ],
    ));
    let a = Agent { token, url };
    let b = via(&a, pb);
    let _ra = Served::start(d, pa, &[], &[]).await;
    let _rb = Served::start(d, pb, &[], &[]).await;

    let issued = std::time::Instant::now();
    let (s, v) = post_json(&a, tools_call(1, "t")).await;
    assert_eq!((s, &v["result"]["token"]), (200, &serde_json::json!(1)));
    // The other replica takes up the stored token: no request of its own.
    let (s, v) = post_json(&b, tools_call(2, "t")).await;
    assert_eq!((s, &v["result"]["token"]), (200, &serde_json::json!(1)));
    assert_eq!(auth.token_requests(), 1);

    // Both find the token due at once.
    auth.set(|s| s.expires_in = 3600);
    tokio::time::sleep(Duration::from_millis(2100).saturating_sub(issued.elapsed())).await;
    let calls = (0..8).map(|i| {
        let agent = if i % 2 == 0 { &a } else { &b };
        post_json(agent, tools_call(10 + i, "t"))
    });
    for (s, v) in futures_util::future::join_all(calls).await {
        assert_eq!(
            (s, &v["result"]["token"]),
            (200, &serde_json::json!(2)),
            "{v}"
        );
    }
    assert_eq!(auth.token_requests(), 2, "one refresh for both replicas");
}

/// A replica killed while it holds a credential's refresh lock (its token
/// request unanswered) releases the lock as its own connection closes:
/// another replica's refresh goes on at once, not after the token timeout.
#[tokio::test]
async fn a_replica_killed_mid_refresh_releases_the_lock_at_once() {
    let auth = AuthServer::start(3600, false).await;
    auth.set(|s| s.mode = Some(Mode::Gated));
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let o = tessera(d)
        .args([
            "credential",
            "add",
            "saas",
            "--upstream",
            &format!("{}/mcp", auth.base),
            "--scheme",
            "oauth2",
            "--token-url",
            &format!("{}/token", auth.base),
            "--client-id",
            CLIENT_ID,
            "--refresh-token-env",
            "REFRESH",
        ])
        .env("REFRESH", FIRST_REFRESH)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = last_line(&cli(d, &["caller", "add", "agent"]));
    let url = last_line(&cli(
        d,
        &[
            "connection",
            "add",
            "--caller",
            "agent",
            "--credential",
            "saas",
            "--public-url",
            &format!("http://127.0.0.1:{pa}"),
        ],
    ));
    let a = Agent { token, url };
    let b = via(&a, pb);
    // Long enough that only a released lock lets B ask in time.
    let slow = ["--token-timeout-ms", "30000"];
    let mut ra = Served::start(d, pa, &slow, &[]).await;
    let _rb = Served::start(d, pb, &slow, &[]).await;

    // A takes the lock and asks; the token endpoint holds its answer.
    let on_a = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(tools_call(1, "t"))
        .send();
    let on_a = tokio::spawn(on_a);
    within(Duration::from_secs(5), || async {
        auth.token_requests() == 1
    })
    .await;
    // B waits behind A's lock: no token request of its own. (Nothing to
    // await here but the absence of an event.)
    let on_b = tokio::spawn(async move { post_json(&b, tools_call(2, "t")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(auth.token_requests(), 1, "B asked while A held the lock");

    // A dies; its connection closes and the lock with it: B, finding
    // nothing stored, asks for itself at once.
    ra.child.kill().await.unwrap();
    // A's caller loses the connection, not a token.
    assert!(on_a.await.unwrap().is_err());
    within(Duration::from_secs(2), || async {
        auth.token_requests() == 2
    })
    .await;
    auth.open_gate();
    let (s, v) = on_b.await.unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(auth.token_requests(), 2);
}

#[tokio::test]
async fn the_database_password_never_reaches_the_log() {
    let dir = Proxy::dir();
    let d = dir.path();
    // The test server trusts every connection, so any password connects.
    let mut url = url::Url::parse(&database_url(d).unwrap()).unwrap();
    url.set_password(Some("db-password-Xr4tQ9")).unwrap();
    let port = Served::free_port();
    let mut served = Served::start(
        d,
        port,
        &[],
        &[
            ("TESSERA_DATABASE_URL", url.as_str()),
            ("RUST_LOG", "debug"),
        ],
    )
    .await;
    served.wait_for("listening for changes").await;
    let o = tessera(d)
        .env("TESSERA_DATABASE_URL", url.as_str())
        .args([
            "--database-url",
            "postgres://nobody:db-password-Xr4tQ9@127.0.0.1:1/x",
        ])
        .args(["caller", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("postgres://nobody:***@127.0.0.1:1/x"), "{err}");
    assert!(!err.contains("db-password-Xr4tQ9"), "{err}");
    served.signal("TERM");
    served.read_to_end().await;
    assert!(served.log.contains(":***@"), "{}", served.log);
    assert!(!served.log.contains("db-password-Xr4tQ9"));
}

/// A session opened through one replica goes on through another: its id
/// is bound to the caller by a MAC under the shared master key ring, not
/// by anything one replica remembers; another caller is refused on both.
#[tokio::test]
async fn a_session_opened_through_one_replica_goes_on_through_another() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let public = format!("http://127.0.0.1:{pa}");
    let a = register(d, &public, "gh", &up.url("/mcp"), "agent");
    let other = register(d, &public, "gh", &up.url("/mcp"), "agent-2");
    let _ra = Served::start(d, pa, &[], &[]).await;
    let _rb = Served::start(d, pb, &[], &[]).await;

    let session = a.session().await;
    let send = |agent: Agent| {
        client()
            .post(agent.url)
            .bearer_auth(agent.token)
            .header("mcp-session-id", &session)
            .body(tools_call(2, "search"))
            .send()
    };
    let r = send(via(&a, pb)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["mcp-session-id"], session.as_str());
    for port in [pa, pb] {
        let r = send(via(&other, port)).await.unwrap();
        assert_eq!(r.status(), 404, "another caller's session through {port}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].headers["mcp-session-id"], "sess-1");
}

/// Tool pinning across replicas: what one replica sees changed in a
/// tools/list answer is held by the other within a second (by
/// notification: neither polls), before that one lists it itself; an
/// acceptance through the CLI reaches both.
#[tokio::test]
async fn a_tool_change_one_replica_sees_is_held_by_every_replica() {
    use crate::pinning::{call, list_of, listed, refusal, Tools, POISONED, READ, SEARCH};
    let up = Tools::start(&list_of(&[SEARCH, READ])).await;
    let dir = Proxy::dir();
    let d = dir.path();
    let (pa, pb) = (Served::free_port(), Served::free_port());
    let a = register(
        d,
        &format!("http://127.0.0.1:{pa}"),
        "gh",
        &up.url("/mcp"),
        "agent",
    );
    let b = via(&a, pb);
    let _ra = Served::start(d, pa, &NO_POLLING, &[]).await;
    let _rb = Served::start(d, pb, &NO_POLLING, &[]).await;

    // Replica A's first list pins; B serves the pins within a second.
    assert_eq!(listed(&a).await, ["search", "read_file"]);
    within(Duration::from_secs(1), || async {
        scalar(d, "SELECT count(*) FROM tool_pins WHERE status = 'pinned'").await == 2
    })
    .await;
    assert_eq!(
        call(&b, "search").await["result"]["content"][0]["text"],
        "ran"
    );

    // A sees the change; B refuses the call without having listed it.
    up.set(&list_of(&[POISONED, READ]));
    assert_eq!(listed(&a).await, ["read_file"]);
    // (Calls that B answered before the change reached it ran.)
    within(Duration::from_secs(1), || async {
        call(&b, "search").await["result"]["isError"] == true
    })
    .await;
    let ran = up.calls().len();
    let text = refusal(&call(&b, "search").await);
    assert!(text.contains("definition changed"), "{text}");
    assert_eq!(up.calls().len(), ran);

    // Accepted once, served by both.
    let o = tessera(d)
        .args(["tool", "accept", "--credential", "gh", "search"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for r in [&a, &b] {
        within(Duration::from_secs(1), || async {
            listed(r).await.len() == 2
        })
        .await;
    }
    assert_eq!(
        call(&b, "search").await["result"]["content"][0]["text"],
        "ran"
    );
}
