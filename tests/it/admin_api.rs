//! The admin HTTP API: admin tokens, the JSON endpoints (sharing the CLI's
//! service layer and messages), the admin audit trail, health, readiness,
//! metrics and the OpenAPI document. The API runs over real sockets: the
//! same router `serve` mounts on `--admin-listen`, next to an in-process
//! data plane, and once as a real `tessera serve` process.

use crate::support::*;
use serde_json::{json, Value};

/// The admin router served on 127.0.0.1:0 beside `p`'s data plane.
pub(crate) async fn admin_api(p: &Proxy) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = tessera::admin::api::router(p.state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

pub(crate) fn admin_token(p: &Proxy, name: &str) -> String {
    let o = p.cli(&["admin-token", "add", name]);
    let token = last_line(&o);
    assert!(token.starts_with("tsa_"), "{token}");
    token
}

/// The `/metrics` text of the admin API at `api`.
pub(crate) async fn metrics_text(api: &str, token: &str) -> String {
    client()
        .get(format!("{api}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A request to the admin API with `token`; the status and JSON body.
async fn call(
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = client().request(method, url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn the_api_manages_what_the_cli_does_and_records_who_acted() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "ops-bot");
    let t = Some(token.as_str());
    use reqwest::Method as M;

    // No token, a wrong one: 401 with a JSON error, and nothing is done.
    let (s, v) = call(M::GET, format!("{api}/v1/callers"), None, None).await;
    assert_eq!(s, 401);
    assert!(
        v["error"].as_str().unwrap().contains("admin-token add"),
        "{v}"
    );
    let wrong = Some("tsa_not-a-real-token");
    let (s, _) = call(
        M::POST,
        format!("{api}/v1/callers"),
        wrong,
        Some(json!({"name": "x"})),
    )
    .await;
    assert_eq!(s, 401);
    assert!(p.store().callers().await.unwrap().is_empty());

    // A credential: the secret goes in the body and never comes back.
    let (s, v) = call(
        M::POST,
        format!("{api}/v1/credentials"),
        t,
        Some(json!({"name": "gh", "upstream": up.url("/echo"), "secret": SECRET})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["scheme"], "bearer");
    let (s, list) = call(M::GET, format!("{api}/v1/credentials"), t, None).await;
    assert_eq!(s, 200);
    assert_eq!(list[0]["name"], "gh");
    assert!(!v.to_string().contains(SECRET) && !list.to_string().contains(SECRET));

    // The CLI's validation and messages, with a status to act on.
    let (s, v) = call(
        M::POST,
        format!("{api}/v1/credentials"),
        t,
        Some(json!({"name": "bad name", "upstream": up.url("/echo"), "secret": "x"})),
    )
    .await;
    assert_eq!(s, 422);
    let cli = p.cli(&["caller", "add", "bad name"]);
    let cli_err = String::from_utf8_lossy(&cli.stderr);
    let msg = v["error"].as_str().unwrap();
    assert!(
        cli_err.contains(msg),
        "API said {msg:?}, CLI said {cli_err:?}"
    );
    let (s, v) = call(
        M::POST,
        format!("{api}/v1/credentials"),
        t,
        Some(json!({"name": "gh", "upstream": up.url("/echo"), "secret": "x"})),
    )
    .await;
    assert_eq!(s, 409, "{v}");

    // A caller (its token once) and a connection; the agent then works.
    let (s, caller) = call(
        M::POST,
        format!("{api}/v1/callers"),
        t,
        Some(json!({"name": "agent", "groups": ["ops", "ops"]})),
    )
    .await;
    assert_eq!(s, 201, "{caller}");
    assert_eq!(caller["groups"], json!(["ops"]));
    let caller_token = caller["token"].as_str().unwrap().to_string();
    let (s, listed) = call(M::GET, format!("{api}/v1/callers"), t, None).await;
    assert_eq!(s, 200);
    assert!(!listed.to_string().contains(&caller_token), "{listed}");
    let (s, conn) = call(
        M::POST,
        format!("{api}/v1/connections"),
        t,
        Some(json!({"caller": "agent", "credential": "gh"})),
    )
    .await;
    assert_eq!(s, 201, "{conn}");
    let url = conn["url"].as_str().unwrap().to_string();
    assert!(url.ends_with(conn["id"].as_str().unwrap()), "{conn}");
    p.synced().await;
    let agent = Agent {
        token: caller_token,
        url,
    };
    let (s, h, _) = post_json_headers(&agent, tools_call(1, "search")).await;
    assert_eq!(s, 200);
    let request_id = h["x-request-id"].to_str().unwrap().to_string();
    let seen = up.seen();
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Bearer {SECRET}").as_str()
    );

    // The decision is in the audit trail, paged by id.
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    let (s, page) = call(M::GET, format!("{api}/v1/audit?caller=agent"), t, None).await;
    assert_eq!(s, 200, "{page}");
    let records = page["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{page}");
    assert_eq!(records[0]["verdict"], "allow");
    let next = page["next_after_id"].as_i64().unwrap();
    let (_, after) = call(M::GET, format!("{api}/v1/audit?after_id={next}"), t, None).await;
    assert_eq!(after["records"], json!([]));
    let (_, first) = call(
        M::GET,
        format!("{api}/v1/audit?after_id=0&limit=1"),
        t,
        None,
    )
    .await;
    assert_eq!(first["records"][0]["id"], records[0]["id"]);
    // And found by its request id (the answer's X-Request-Id).
    let by_id = |id: String| call(M::GET, format!("{api}/v1/audit?request_id={id}"), t, None);
    let (s, found) = by_id(request_id.clone()).await;
    assert_eq!(s, 200, "{found}");
    assert_eq!(found["records"][0]["id"], records[0]["id"], "{found}");
    assert_eq!(found["records"][0]["request_id"], request_id.as_str());
    let (_, none) = by_id("0".repeat(32)).await;
    assert_eq!(none["records"], json!([]));

    // Revoking through the API stops the agent.
    let (s, _) = call(M::DELETE, format!("{api}/v1/callers/agent"), t, None).await;
    assert_eq!(s, 204);
    let (s, v) = call(M::DELETE, format!("{api}/v1/callers/agent"), t, None).await;
    assert_eq!(s, 409, "{v}");
    let (s, v) = call(M::DELETE, format!("{api}/v1/callers/nobody"), t, None).await;
    assert_eq!(s, 404, "{v}");
    p.synced().await;
    let (s, _) = post_json(&agent, tools_call(2, "search")).await;
    assert_eq!(s, 403);

    // Every action, by whom: the token's name for the API, `cli` for the
    // command line; failures too.
    let (s, actions) = call(M::GET, format!("{api}/v1/admin-audit"), t, None).await;
    assert_eq!(s, 200);
    let actions: Vec<(String, String, String, bool)> = actions
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|a| {
            (
                a["actor"].as_str().unwrap().to_string(),
                a["action"].as_str().unwrap().to_string(),
                a["target"].as_str().unwrap().to_string(),
                a["outcome"] == "ok",
            )
        })
        .collect();
    let want = [
        ("cli", "admin-token.add", "ops-bot", true),
        ("ops-bot", "credential.add", "gh", true),
        ("ops-bot", "credential.add", "bad name", false),
        ("cli", "caller.add", "bad name", false),
        ("ops-bot", "credential.add", "gh", false),
        ("ops-bot", "caller.add", "agent", true),
        ("ops-bot", "connection.add", "agent on gh", true),
        ("ops-bot", "caller.revoke", "agent", true),
        ("ops-bot", "caller.revoke", "agent", false),
        ("ops-bot", "caller.revoke", "nobody", false),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), *d))
        .collect();
    assert_eq!(actions, want);

    // A revoked admin token is refused at once.
    last_line(&p.cli(&["admin-token", "revoke", "ops-bot"]));
    let (s, _) = call(M::GET, format!("{api}/v1/callers"), t, None).await;
    assert_eq!(s, 401);

    assert_no_plaintext(p.dir.path(), &[SECRET, &token, &agent.token]);
    assert_logs_lack(&[SECRET, &token]);
}

#[tokio::test]
async fn a_held_call_is_granted_through_the_api_and_then_runs() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "approver");
    let t = Some(token.as_str());
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    use reqwest::Method as M;

    let write = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "write_file", "arguments": {"path": "a.txt"}}})
    .to_string();
    let (_, v) = post_json(&a, write.clone()).await;
    assert_eq!(v["result"]["isError"], true, "{v}");

    let (s, pending) = call(M::GET, format!("{api}/v1/approvals"), t, None).await;
    assert_eq!(s, 200);
    let pending = pending.as_array().unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["tool"], "write_file");
    assert_eq!(pending[0]["caller"], "agent");
    assert_eq!(pending[0]["status"], "pending");
    let id = pending[0]["id"].as_str().unwrap();

    let (s, v) = call(
        M::POST,
        format!("{api}/v1/approvals/{id}/grant"),
        t,
        Some(json!({"ttl": "soon"})),
    )
    .await;
    assert_eq!(s, 422);
    assert!(v["error"].as_str().unwrap().contains("30s, 10m"), "{v}");
    let (s, _) = call(M::POST, format!("{api}/v1/approvals/{id}/grant"), t, None).await;
    assert_eq!(s, 204);
    let (s, v) = call(M::POST, format!("{api}/v1/approvals/{id}/grant"), t, None).await;
    assert_eq!(s, 409, "{v}");
    assert!(up.seen().is_empty());

    let (s, v) = post_json(&a, write).await;
    assert_eq!(s, 200);
    assert!(v["result"].get("isError").is_none(), "{v}");
    assert_eq!(up.seen().len(), 1);
    let (_, pending) = call(M::GET, format!("{api}/v1/approvals"), t, None).await;
    assert_eq!(pending, json!([]));
    let (_, all) = call(M::GET, format!("{api}/v1/approvals?all=true"), t, None).await;
    // Its one use is spent: the state says so (granted -> used).
    assert_eq!(all[0]["status"], "used");
    assert_eq!(all[0]["decided_by"], "approver", "{all}");
}

#[tokio::test]
async fn policies_are_checked_and_reloaded_through_the_api() {
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "ops");
    let t = Some(token.as_str());
    use reqwest::Method as M;

    let (s, v) = call(M::GET, format!("{api}/v1/policies"), t, None).await;
    assert_eq!(s, 200);
    assert_eq!(v["origin"], "built-in");
    let good = std::fs::read_to_string("policies/examples/read-only.cedar").unwrap();
    let (s, v) = call(
        M::POST,
        format!("{api}/v1/policies/check"),
        t,
        Some(json!({"files": {"read-only.cedar": good}})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["count"].as_u64().unwrap() >= 1);
    let (s, v) = call(
        M::POST,
        format!("{api}/v1/policies/check"),
        t,
        Some(json!({"files": {"bad.cedar": "permit(principal, action == Action::\"nope\", resource);"}})),
    )
    .await;
    assert_eq!(s, 422);
    assert!(v["error"].as_str().unwrap().contains("bad.cedar"), "{v}");

    let before = p.store().revision().await.unwrap().policies;
    let (s, _) = call(M::POST, format!("{api}/v1/policies/reload"), t, None).await;
    assert_eq!(s, 202);
    assert_eq!(p.store().revision().await.unwrap().policies, before + 1);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "prometheus");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    use reqwest::Method as M;

    let (s, v) = call(M::GET, format!("{api}/healthz"), None, None).await;
    assert_eq!((s, v), (200, json!({"status": "ok"})));
    let (s, v) = call(M::GET, format!("{api}/readyz"), None, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["ready"], true);
    assert_eq!(v["database"], "ok");
    assert_eq!(v["master_key"], "ok");
    assert!(v["policies"].as_str().unwrap().starts_with("ok"), "{v}");

    // Metrics need a token: they name credentials.
    let (s, _) = call(M::GET, format!("{api}/metrics"), None, None).await;
    assert_eq!(s, 401);

    // One forwarded call, one wrong token, one open SSE stream.
    let (s, _) = post_json(&a, tools_call(1, "search")).await;
    assert_eq!(s, 200);
    let wrong = client()
        .post(&a.url)
        .bearer_auth("tsr_wrong")
        .header("content-type", "application/json")
        .body(tools_call(2, "search"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);
    // Both decisions' records written (one batch, or two).
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    let metrics = || async {
        let r = client()
            .get(format!("{api}/metrics"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"));
        r.text().await.unwrap()
    };
    let text = metrics().await;
    let has = |text: &str, line: &str| text.lines().any(|l| l == line);
    for line in [
        "tessera_requests_total{outcome=\"forwarded\",status=\"200\"} 1",
        "tessera_requests_total{outcome=\"refused\",status=\"403\"} 1",
        "tessera_refusals_total{reason=\"unauthenticated\"} 1",
        "tessera_upstream_latency_seconds_count 1",
        // Both requests, forwarded and refused, end to end.
        "tessera_request_duration_seconds_count 2",
        "tessera_open_streams 0",
    ] {
        assert!(has(&text, line), "missing {line:?} in\n{text}");
    }
    let bytes_in = text
        .lines()
        .find_map(|l| l.strip_prefix("tessera_bytes_total{direction=\"in\"} "))
        .unwrap();
    assert_eq!(bytes_in, tools_call(1, "search").len().to_string());
    // A data-plane connection held open: one request answered on it, so
    // it has certainly been accepted, and kept alive.
    let mut held = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        held.write_all(b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(held.read(&mut b).await.unwrap(), 1, "{head:?}");
            head.push(b[0]);
        }
    }
    let text = metrics().await;
    let gauge = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    };
    assert!(gauge("tessera_connections_open") >= 1);
    let c = &p.state.config;
    assert_eq!(gauge("tessera_connections_max"), c.max_connections as u64);
    assert_eq!(
        gauge("tessera_body_memory_max_bytes"),
        c.max_body_memory as u64
    );
    assert_eq!(
        gauge("tessera_body_memory_bytes"),
        0,
        "no body is being read"
    );
    drop(held);
    let batches: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tessera_audit_batch_duration_seconds_count "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(batches >= 1, "the audit batches are timed:\n{text}");
    // No connection id, token or argument ever becomes a label.
    let id = a.url.rsplit('/').next().unwrap();
    assert!(!text.contains(id) && !text.contains(&a.token));
}

#[tokio::test]
async fn an_event_stream_is_counted_open_until_it_ends() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "prometheus");
    let a = p.agent("gh", &up.url("/sse"), "agent").await;
    let open_streams = || async {
        let text = metrics_text(&api, &token).await;
        text.lines()
            .find_map(|l| l.strip_prefix("tessera_open_streams "))
            .unwrap()
            .to_string()
    };
    let resp = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let tx = up.sse_sender().await;
    assert_eq!(open_streams().await, "1");
    drop(tx);
    // The upstream ends the stream; the client reads it to its end.
    let _ = resp.bytes().await;
    within(std::time::Duration::from_secs(2), || async {
        open_streams().await == "0"
    })
    .await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_the_api_serves() {
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let (s, doc) = call(
        reqwest::Method::GET,
        format!("{api}/openapi.json"),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/credentials",
        "/v1/credentials/{name}",
        "/v1/credentials/{name}/secret",
        "/v1/callers",
        "/v1/callers/{name}",
        "/v1/callers/{name}/token",
        "/v1/callers/{name}/restore",
        "/v1/connections",
        "/v1/connections/{id}",
        "/v1/approvals",
        "/v1/approvals/{id}/grant",
        "/v1/approvals/{id}/deny",
        "/v1/audit",
        "/v1/admin-audit",
        "/v1/policies",
        "/v1/policies/check",
        "/v1/policies/reload",
        "/v1/log-level",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        assert!(paths.contains_key(p), "{p} missing from the document");
    }
    // Each operation declares a parameter once (OpenAPI forbids the same
    // name and place twice), with its pattern.
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let mut seen = std::collections::HashSet::new();
            for p in &params {
                let key = (p["name"].to_string(), p["in"].to_string());
                assert!(seen.insert(key), "{method} {path}: {} twice", p["name"]);
                if p["in"] == "path" {
                    assert!(p["schema"]["pattern"].is_string(), "{method} {path}: {p}");
                }
            }
        }
    }
    // Every documented operation is routed: without a token each answers
    // 401 (or 200 for the open health checks), never 404 or 405.
    for (path, ops) in paths {
        let url = format!("{api}{}", path.replace("{name}", "x").replace("{id}", "x"));
        for method in ops.as_object().unwrap().keys() {
            let m: reqwest::Method = method.to_uppercase().parse().unwrap();
            let s = client().request(m, &url).send().await.unwrap().status();
            let open = path == "/healthz" || path == "/readyz";
            assert_eq!(s.as_u16(), if open { 200 } else { 401 }, "{method} {path}");
        }
    }
    // And a path that is not documented is a JSON 404.
    let (s, v) = call(
        reqwest::Method::GET,
        format!("{api}/v1/nothing"),
        None,
        None,
    )
    .await;
    assert_eq!(s, 404);
    assert!(v["error"].as_str().unwrap().contains("openapi.json"));
}

/// `serve` opens the admin listener only once an admin token exists.
#[tokio::test]
async fn serve_opens_the_admin_listener_only_with_an_admin_token() {
    let dir = Proxy::dir();
    let admin_port = Served::free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    let args = ["--admin-listen", admin.as_str()];
    let json_log = ["--admin-listen", admin.as_str(), "--log-format", "json"];
    let mut s = Served::start(dir.path(), Served::free_port(), &json_log, &[]).await;
    // --log-format json: every line one JSON object.
    let lines: Vec<Value> = s
        .log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["msg"].as_str().unwrap().starts_with("admin listener off")),
        "{}",
        s.log
    );
    assert!(client()
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .is_err());
    s.signal("TERM");
    s.read_to_end().await;

    let token = last_line(&cli(dir.path(), &["admin-token", "add", "ops"]));
    let s = Served::start(dir.path(), Served::free_port(), &args, &[]).await;
    assert!(s.log.contains("admin API serving"), "{}", s.log);
    let r = client()
        .get(format!("http://{admin}/v1/callers"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!([]));
    let listed = cli(dir.path(), &["admin-token", "list", "--json"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(
        listed.contains("\"ops\"") && !listed.contains(&token),
        "{listed}"
    );
}

/// Every admin action leaves its admin-audit row, naming who acted: each
/// one done through the command line (the login in `oauth::login_…`), and
/// each the API offers done through the API. Failures are recorded too: a
/// grant of an unknown approval changed nothing and still has its row.
#[tokio::test]
async fn every_admin_action_leaves_its_row() {
    use reqwest::Method as M;
    use tessera::admin::service::Action;
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "ops");
    let t = Some(token.as_str());
    let url = up.url("/echo");
    let ran = |args: &[&str]| {
        let o = p.cli(args);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };

    // The command line.
    let secret = ["--secret-env", "TEST_SECRET"];
    assert!(
        ran(&[
            &["credential", "add", "gh", "--upstream", &url][..],
            &secret
        ]
        .concat())
        .0
    );
    assert!(ran(&[&["credential", "set-secret", "gh"][..], &secret].concat()).0);
    assert!(ran(&["caller", "add", "a"]).0);
    let conn = last_line(&p.cli(&["connection", "add", "--caller", "a", "--credential", "gh"]));
    assert!(ran(&["connection", "revoke", &conn]).0);
    assert!(ran(&["caller", "rotate-token", "a"]).0);
    assert!(ran(&["caller", "update", "a", "--group", "g"]).0);
    assert!(ran(&["caller", "revoke", "a"]).0);
    assert!(ran(&["caller", "restore", "a"]).0);
    assert!(ran(&["credential", "update", "gh", "--upstream", &url]).0);
    assert!(
        ran(&[
            "credential",
            "add",
            "gone",
            "--upstream",
            &url,
            "--secret-env",
            "TEST_SECRET"
        ])
        .0
    );
    assert!(ran(&["credential", "remove", "gone"]).0);
    assert!(ran(&["admin-token", "add", "other"]).0);
    assert!(ran(&["admin-token", "revoke", "other"]).0);
    assert!(!ran(&["approval", "grant", "no-such-approval"]).0);
    assert!(!ran(&["approval", "deny", "no-such-approval"]).0);
    assert!(!ran(&["approval", "revoke", "no-such-approval"]).0);
    assert!(ran(&["key", "rotate"]).0);
    assert!(ran(&["policy", "reload"]).0);
    assert!(ran(&["approval", "forget", "--all"]).0);
    // No tool listed yet: refused, and recorded so.
    assert!(!ran(&["tool", "accept", "--credential", "gh", "search"]).0);
    assert!(!ran(&["tool", "reject", "--credential", "gh", "--all"]).0);

    // The API.
    let body = |v: serde_json::Value| Some(v);
    for (m, path, b) in [
        (
            M::POST,
            "/v1/credentials".to_string(),
            body(json!({"name": "api-gh", "upstream": url, "secret": SECRET})),
        ),
        (
            M::PUT,
            "/v1/credentials/api-gh/secret".to_string(),
            body(json!({"secret": SECRET})),
        ),
        (
            M::POST,
            "/v1/callers".to_string(),
            body(json!({"name": "b"})),
        ),
        (
            M::POST,
            "/v1/connections".to_string(),
            body(json!({"caller": "b", "credential": "api-gh"})),
        ),
        (
            M::DELETE,
            "/v1/connections/no-such-connection".to_string(),
            None,
        ),
        (M::POST, "/v1/callers/b/token".to_string(), None),
        (
            M::PATCH,
            "/v1/callers/b".to_string(),
            body(json!({"groups": ["g"]})),
        ),
        (M::DELETE, "/v1/callers/b".to_string(), None),
        (M::POST, "/v1/callers/b/restore".to_string(), None),
        (
            M::PATCH,
            "/v1/credentials/api-gh".to_string(),
            body(json!({"upstream": url})),
        ),
        (
            M::DELETE,
            "/v1/credentials/api-gh?cascade=true".to_string(),
            None,
        ),
        (
            M::POST,
            "/v1/approvals/no-such-approval/grant".to_string(),
            body(json!({})),
        ),
        (
            M::POST,
            "/v1/approvals/no-such-approval/deny".to_string(),
            None,
        ),
        (
            M::POST,
            "/v1/approvals/no-such-approval/revoke".to_string(),
            None,
        ),
        (M::POST, "/v1/policies/reload".to_string(), None),
        // This in-process data plane's log filter is the suite's, not one
        // it may change: refused (409), and recorded.
        (
            M::PUT,
            "/v1/log-level".to_string(),
            body(json!({"level": "debug"})),
        ),
        (
            M::POST,
            "/v1/approval-evidence/forget".to_string(),
            body(json!({"tool": "run_tests"})),
        ),
        (
            M::POST,
            "/v1/credentials/api-gh/tools/accept".to_string(),
            body(json!({"all": true})),
        ),
        (
            M::POST,
            "/v1/credentials/api-gh/tools/reject".to_string(),
            body(json!({"tool": "search"})),
        ),
    ] {
        let (s, v) = call(m.clone(), format!("{api}{path}"), t, b).await;
        assert!(s != 401 && s != 405, "{m} {path}: {s} {v}");
    }

    let rows = p.store().admin_audit(None, 100).await.unwrap();
    let has = |actor: &str, action: Action| {
        rows.iter()
            .any(|r| r.actor == actor && r.action == action.as_str())
    };
    let missing: Vec<_> = Action::ALL
        .iter()
        // `tessera log-level` acts through the API, as its token
        // (ops::the_log_level_changes_while_serving).
        .filter(|a| !matches!(a, Action::CredentialLogin | Action::LogLevel) && !has("cli", **a))
        .collect();
    assert!(missing.is_empty(), "no CLI row for {missing:?}: {rows:?}");
    let by_api = [
        Action::CredentialAdd,
        Action::CredentialSetSecret,
        Action::CallerAdd,
        Action::CallerRevoke,
        Action::CallerRotateToken,
        Action::CallerUpdate,
        Action::CallerRestore,
        Action::CredentialUpdate,
        Action::CredentialRemove,
        Action::ConnectionAdd,
        Action::ConnectionRevoke,
        Action::ApprovalGrant,
        Action::ApprovalDeny,
        Action::PolicyReload,
        Action::LogLevel,
        Action::ToolAccept,
        Action::ToolReject,
    ];
    let missing: Vec<_> = by_api.iter().filter(|a| !has("ops", **a)).collect();
    assert!(missing.is_empty(), "no API row for {missing:?}: {rows:?}");
    // A failure is recorded with what went wrong.
    assert!(rows
        .iter()
        .any(|r| r.actor == "cli" && r.action == "approval.grant" && r.outcome != "ok"));
}
