//! Issue 25, the approval loop: explicit approval states and the moves
//! between them, the held call kept whole (sealed) for the approver, pending
//! approvals that expire, the webhook that announces them, a held call that
//! waits for a decision, and the approver role. Real processes and HTTP:
//! the data plane via `serve::run`, the CLI as the real binary, a webhook
//! receiver listening in the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::*;

fn write(id: u32, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "write_file", "arguments": args}})
    .to_string()
}

/// The approval id a held call's text names.
fn approval_in(v: &Value) -> String {
    assert_eq!(v["result"]["isError"], true, "{v}");
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    let at = text.find("approval ap_").expect(text) + "approval ".len();
    text[at..at + 15].to_string()
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

async fn ask_proxy(tweak: impl FnOnce(&mut tessera::config::ServeConfig)) -> Proxy {
    Proxy::start_with_policies(Proxy::dir(), tweak, policies_with(&["ask-for-writes"])).await
}

#[tokio::test]
async fn approval_states_move_only_as_their_table_allows() {
    let up = Upstream::start().await;
    let p = ask_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;

    // pending -> granted -> used.
    let (_, v) = post_json(&a, write(1, json!({"path": "a"}))).await;
    let used = approval_in(&v);
    assert_eq!(show(&p, &used)["status"], "pending");
    ok(p.cli(&["approval", "grant", &used]));
    assert_eq!(show(&p, &used)["status"], "granted");
    let (_, v) = post_json(&a, write(2, json!({"path": "a"}))).await;
    assert!(ran(&v), "{v}");
    let s = show(&p, &used);
    assert_eq!(
        (&s["status"], &s["decided_by"]),
        (&json!("used"), &json!("cli"))
    );
    // A spent grant is history: neither denied nor granted again.
    let e = refused(p.cli(&["approval", "deny", &used]));
    assert!(e.contains(&format!("approval {used} is used")), "{e}");
    let e = refused(p.cli(&["approval", "grant", &used]));
    assert!(e.contains("is used"), "{e}");
    assert_eq!(show(&p, &used)["status"], "used");

    // pending -> denied, and a denial stands: no grant overrides it.
    let (_, v) = post_json(&a, write(3, json!({"path": "b"}))).await;
    let denied = approval_in(&v);
    ok(p.cli(&["approval", "deny", &denied]));
    let e = refused(p.cli(&["approval", "grant", &denied]));
    assert!(e.contains("a denial stands"), "{e}");
    let e = refused(p.cli(&["approval", "revoke", &denied]));
    assert!(e.contains("is denied"), "{e}");
    let (_, v) = post_json(&a, write(4, json!({"path": "b"}))).await;
    assert_eq!(approval_in(&v), denied);
    assert!(!ran(&v));

    // granted -> revoked (deny of a live grant, or revoke): the call is
    // held anew, and the revocation is final.
    let (_, v) = post_json(&a, write(5, json!({"path": "c"}))).await;
    let revoked = approval_in(&v);
    let e = refused(p.cli(&["approval", "revoke", &revoked]));
    assert!(e.contains("nothing was granted"), "{e}");
    ok(p.cli(&["approval", "grant", &revoked, "--uses", "5"]));
    let out = ok(p.cli(&["approval", "deny", &revoked]));
    assert!(out.contains("revoked"), "{out}");
    assert_eq!(show(&p, &revoked)["status"], "revoked");
    let e = refused(p.cli(&["approval", "grant", &revoked]));
    assert!(e.contains("is revoked"), "{e}");
    let (_, v) = post_json(&a, write(6, json!({"path": "c"}))).await;
    assert_ne!(approval_in(&v), revoked);
    assert_eq!(up.seen().len(), 1);

    // The admin API refuses the same moves with 409 and a JSON error.
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    for (id, decision) in [(&denied, "grant"), (&used, "deny"), (&revoked, "revoke")] {
        let r = client()
            .post(format!("{api}/v1/approvals/{id}/{decision}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 409, "{decision} {id}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(id.as_str()), "{v}");
    }
}

#[tokio::test]
async fn the_approver_sees_the_whole_call_kept_sealed() {
    let up = Upstream::start().await;
    // Without --audit-arguments: that setting is the audit trail's.
    let p = ask_proxy(|c| assert!(!c.audit_arguments)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let args = json!({"path": "notes/plan-Kq7.txt", "text": "ship it"});
    let (_, v) = post_json(&a, write(1, args.clone())).await;
    let id = approval_in(&v);

    // CLI list, show and --json; the API; all show the arguments, the id
    // the model quoted, the caller, connection and tool.
    let list = ok(p.cli(&["approval", "list"]));
    let row = list.lines().find(|l| l.starts_with(&id)).expect(&list);
    assert!(
        row.contains("plan-Kq7.txt") && row.contains("write_file"),
        "{row}"
    );
    let s = show(&p, &id);
    assert_eq!(s["arguments"], args.to_string());
    let params: Value = serde_json::from_str(s["params"].as_str().unwrap()).unwrap();
    assert_eq!(params["arguments"], args);
    assert_eq!(
        (&s["caller"], &s["tool"]),
        (&json!("agent"), &json!("write_file"))
    );
    assert!(a.url.ends_with(s["connection"].as_str().unwrap()));
    let text = ok(p.cli(&["approval", "show", &id]));
    assert!(
        text.contains("plan-Kq7.txt") && text.contains("expires"),
        "{text}"
    );
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let v: Value = client()
        .get(format!("{api}/v1/approvals/{id}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["arguments"], args.to_string(), "{v}");

    // At rest the call is sealed like a secret, and key rotation re-seals
    // it: it still opens afterwards, under the new key only.
    assert_no_plaintext(p.dir.path(), &["plan-Kq7", "ship it"]);
    let out = ok(p.cli(&["key", "rotate"]));
    assert!(out.contains("re-sealed 2 secrets"), "{out}");
    let status = ok(p.cli(&["key", "status"]));
    let old = status.lines().nth(2).expect(&status);
    assert!(
        old.trim_end().ends_with(" 0"),
        "the old key still seals: {status}"
    );
    assert_eq!(show(&p, &id)["arguments"], args.to_string());
    assert_no_plaintext(p.dir.path(), &["plan-Kq7", "ship it"]);
}

#[tokio::test]
async fn pending_approvals_expire_and_cannot_then_be_granted() {
    let up = Upstream::start().await;
    // Listed with the default TTL of a day.
    let p = ask_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (_, v) = post_json(&a, write(1, json!({}))).await;
    let s = show(&p, &approval_in(&v));
    assert_eq!(
        s["expires_at"].as_i64().unwrap() - s["created_at"].as_i64().unwrap(),
        86_400_000
    );
    let list = ok(p.cli(&["approval", "list"]));
    assert!(list.lines().next().unwrap().contains("EXPIRES"), "{list}");

    // A TTL so short the approval has expired by the time anyone looks.
    let p = ask_proxy(|c| c.approval_ttl = Duration::from_millis(1)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let (_, v) = post_json(&a, write(1, json!({}))).await;
    let id = approval_in(&v);
    let e = refused(p.cli(&["approval", "grant", &id]));
    assert!(e.contains(&format!("approval {id} is expired")), "{e}");
    assert_eq!(show(&p, &id)["status"], "expired");
    let pending = ok(p.cli(&["approval", "list"]));
    assert!(!pending.contains(&id), "{pending}");
    // The call's next try asks anew, and nothing ran.
    let (_, v) = post_json(&a, write(2, json!({}))).await;
    assert_ne!(approval_in(&v), id);
    assert!(up.seen().is_empty());
    // The settings: flag, env and file each set it; 0 is refused.
    let mut raw = tessera::config::RawServe::defaults("127.0.0.1:1".parse().unwrap());
    raw.approval_ttl = "0s".into();
    assert!(tessera::config::parse_serve(raw).is_err());
}

/// A webhook receiver: each body it gets is sent on the channel; the
/// first `fail` requests are answered 500 (the first one only once
/// `release` fires, when given), the rest 204.
async fn receiver(
    fail: usize,
    release: Option<tokio::sync::oneshot::Receiver<()>>,
) -> (String, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Mutex::new(release));
    let app = axum::Router::new().route(
        "/hook/T0/secret-path",
        axum::routing::post(move |body: String| {
            let (tx, count, release) = (tx.clone(), count.clone(), release.clone());
            async move {
                let n = count.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(serde_json::from_str(&body).unwrap());
                if n == 0 {
                    if let Some(r) = release.lock().await.take() {
                        let _ = r.await;
                    }
                }
                if n < fail {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook/T0/secret-path", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, rx)
}

#[tokio::test]
async fn the_webhook_announces_each_new_pending_approval_and_retries() {
    let up = Upstream::start().await;
    let (release, held) = tokio::sync::oneshot::channel();
    let (hook, mut got) = receiver(1, Some(held)).await;
    let url: url::Url = hook.parse().unwrap();
    let p = ask_proxy(|c| c.approval_webhook = Some(url)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let mut delivered = p.state.approvals.deliveries();

    // The credential's secret in the arguments never reaches the webhook.
    let (s, v) = post_json(&a, write(1, json!({"path": "x", "text": SECRET}))).await;
    // Answered while the receiver still holds the first delivery: the
    // request never waits for the webhook.
    assert_eq!(s, 200);
    let id = approval_in(&v);
    let first = soon(got.recv()).await.unwrap();
    release.send(()).unwrap();
    // Refused with 500, then delivered on a retry.
    let second = soon(got.recv()).await.unwrap();
    assert_eq!(first, second);
    soon(delivered.wait_for(|d| *d == (1, 0))).await.unwrap();

    let n = &second;
    assert!(n["text"].as_str().unwrap().contains(&id), "{n}");
    assert!(n["text"].as_str().unwrap().contains("write_file"), "{n}");
    assert_eq!(
        (&n["id"], &n["caller"], &n["tool"]),
        (&json!(id), &json!("agent"), &json!("write_file"))
    );
    assert!(a.url.ends_with(n["connection"].as_str().unwrap()), "{n}");
    let preview = n["arguments_preview"].as_str().unwrap();
    assert!(preview.contains("\"path\":\"x\""), "{preview}");
    assert!(
        !n.to_string().contains(SECRET),
        "the secret reached the webhook: {n}"
    );
    // Nor the approver's CLI or API: the credential is redacted there too.
    let shown = show(&p, &id);
    assert!(shown["arguments"]
        .as_str()
        .unwrap()
        .contains("\"path\":\"x\""));
    assert!(!shown.to_string().contains(SECRET), "{shown}");
    let listed = ok(p.cli(&["approval", "list", "--json"]));
    assert!(listed.contains(&id) && !listed.contains(SECRET), "{listed}");
    let api = crate::admin_api::admin_api(&p).await;
    let token = crate::admin_api::admin_token(&p, "ops");
    let v = client()
        .get(format!("{api}/v1/approvals/{id}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(v.contains(&id) && !v.contains(SECRET), "{v}");
    assert!(n["expires_at"].as_i64().unwrap() > 0);

    // A retry of the same call is the same approval: not announced again.
    let (_, v) = post_json(&a, write(2, json!({"path": "x", "text": SECRET}))).await;
    assert_eq!(approval_in(&v), id);
    let (_, v) = post_json(&a, write(3, json!({"path": "y"}))).await;
    let next = soon(got.recv()).await.unwrap();
    assert_eq!(next["id"], approval_in(&v).as_str());
    assert_logs_lack(&[SECRET, "secret-path"]);
}

/// An upstream, a webhook receiver that answers 204, a proxy holding
/// writes that posts to it (set up further by `tweak`), and an agent.
async fn with_webhook(
    tweak: impl FnOnce(&mut tessera::config::ServeConfig),
) -> (Upstream, Proxy, Agent, mpsc::UnboundedReceiver<Value>) {
    let up = Upstream::start().await;
    let (hook, got) = receiver(0, None).await;
    let url: url::Url = hook.parse().unwrap();
    let p = ask_proxy(|c| {
        c.approval_webhook = Some(url);
        tweak(c);
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    (up, p, a, got)
}

#[tokio::test]
async fn the_webhook_obeys_the_egress_rule() {
    let (_up, p, a, mut got) = with_webhook(|c| c.egress.allow_private = false).await;
    let mut delivered = p.state.approvals.deliveries();
    let (_, v) = post_json(&a, write(1, json!({}))).await;
    approval_in(&v);
    // Every attempt refused before connecting: given up, nothing received.
    soon(delivered.wait_for(|d| *d == (0, 1))).await.unwrap();
    assert!(got.try_recv().is_err());
}

#[tokio::test]
async fn a_held_call_waits_for_a_decision() {
    let (up, p, a, mut got) = with_webhook(|c| c.approval_wait = Duration::from_secs(30)).await;
    let a = Arc::new(a);

    // Granted while the call waits: it runs and is answered normally.
    let started = std::time::Instant::now();
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { post_json(&a, write(1, json!({"path": "w"}))).await }
    });
    let n = soon(got.recv()).await.unwrap();
    ok(p.cli(&["approval", "grant", n["id"].as_str().unwrap()]));
    let (s, v) = soon(waiting).await.unwrap();
    assert_eq!(s, 200);
    assert!(ran(&v), "{v}");
    assert_eq!(v["id"], 1);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(up.seen().len(), 1);
    assert_eq!(show(&p, n["id"].as_str().unwrap())["status"], "used");

    // Denied while it waits: the denial is the answer.
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { post_json(&a, write(2, json!({"path": "z"}))).await }
    });
    let n = soon(got.recv()).await.unwrap();
    ok(p.cli(&["approval", "deny", n["id"].as_str().unwrap()]));
    let (_, v) = soon(waiting).await.unwrap();
    assert_eq!(approval_in(&v), n["id"].as_str().unwrap());
    assert!(v["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("denied"));
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn without_a_decision_the_wait_ends_pending() {
    let up = Upstream::start().await;
    let p = ask_proxy(|c| c.approval_wait = Duration::from_millis(300)).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let started = std::time::Instant::now();
    let (_, v) = post_json(&a, write(1, json!({}))).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("pending"), "{text}");
}

/// `serve` as its own process: a call waiting for a decision ends cleanly
/// (answered "pending") when the process is told to stop, and the
/// webhook's notice links to the console.
#[tokio::test]
async fn a_waiting_call_ends_cleanly_at_sigterm() {
    let up = Upstream::start().await;
    let (hook, mut got) = receiver(0, None).await;
    let dir = Proxy::dir();
    let d = dir.path();
    let policies = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for (from, to) in [
        (root.join("default.cedar"), "default.cedar"),
        (root.join("examples/ask-for-writes.cedar"), "ask.cedar"),
    ] {
        std::fs::copy(from, policies.path().join(to)).unwrap();
    }
    let port = Served::free_port();
    let admin = format!("127.0.0.1:{}", Served::free_port());
    let a = register(
        d,
        &format!("http://127.0.0.1:{port}"),
        "gh",
        &up.url("/mcp"),
        "agent",
    );
    ok(cli(d, &["admin-token", "add", "ops"]));
    let mut s = Served::start(
        d,
        port,
        &[
            "--policies",
            policies.path().to_str().unwrap(),
            "--admin-listen",
            &admin,
        ],
        &[
            ("TESSERA_APPROVAL_WAIT_MS", "600000"),
            ("TESSERA_APPROVAL_WEBHOOK", &hook),
            ("TESSERA_ALLOW_PRIVATE_UPSTREAMS", "true"),
        ],
    )
    .await;
    let waiting = tokio::spawn(async move { post_json(&a, write(1, json!({}))).await });
    let n = soon(got.recv()).await.unwrap();
    assert_eq!(n["console_url"], format!("http://{admin}/ui"), "{n}");
    s.signal("TERM");
    let (status, v) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting call ended at SIGTERM")
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(approval_in(&v), n["id"].as_str().unwrap());
    let exit = tokio::time::timeout(Duration::from_secs(10), s.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    s.read_to_end().await;
    // It was still waiting when told to stop.
    assert!(
        s.log
            .contains("a held call stopped waiting for a decision: shutting down"),
        "{}",
        s.log
    );
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn an_approver_token_decides_approvals_and_nothing_else() {
    let up = Upstream::start().await;
    let p = ask_proxy(|_| {}).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let api = crate::admin_api::admin_api(&p).await;
    let o = p.cli(&["admin-token", "add", "reviewer", "--role", "approver"]);
    let token = last_line(&o);
    assert!(token.starts_with("tsa_"), "{token}");
    let listed = ok(p.cli(&["admin-token", "list"]));
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("reviewer") && l.contains("approver")),
        "{listed}"
    );
    let e = refused(p.cli(&["admin-token", "add", "x", "--role", "root"]));
    assert!(e.contains("root"), "{e}");

    let (_, v) = post_json(&a, write(1, json!({"path": "r"}))).await;
    let id = approval_in(&v);
    let call = |m: reqwest::Method, path: &str| {
        client()
            .request(m, format!("{api}{path}"))
            .bearer_auth(&token)
            .send()
    };
    use reqwest::Method as M;
    for (m, path) in [
        (M::GET, "/v1/approvals".to_string()),
        (M::GET, format!("/v1/approvals/{id}")),
        (M::GET, "/v1/audit".to_string()),
    ] {
        let r = call(m.clone(), &path).await.unwrap();
        assert_eq!(r.status(), 200, "{m} {path}");
    }
    let r = call(M::POST, &format!("/v1/approvals/{id}/grant"))
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (_, v) = post_json(&a, write(2, json!({"path": "r"}))).await;
    assert!(ran(&v), "{v}");
    assert_eq!(show(&p, &id)["decided_by"], "reviewer");
    for (m, path) in [
        (M::GET, "/v1/credentials"),
        (M::GET, "/v1/callers"),
        (M::POST, "/v1/callers"),
        (M::GET, "/v1/connections"),
        (M::GET, "/v1/admin-audit"),
        (M::GET, "/v1/policies"),
        (M::POST, "/v1/policies/reload"),
        (M::GET, "/metrics"),
    ] {
        let r = call(m.clone(), path).await.unwrap();
        assert_eq!(r.status(), 403, "{m} {path}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains("approver"), "{v}");
    }
    // An admin token still does everything.
    let admin = crate::admin_api::admin_token(&p, "ops");
    let r = client()
        .get(format!("{api}/v1/credentials"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The OpenAPI document says who may call what.
    let doc: Value = client()
        .get(format!("{api}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op = |path: &str, m: &str| doc["paths"][path][m].clone();
    assert!(op("/v1/credentials", "get")["responses"]["403"].is_object());
    assert!(op("/v1/credentials", "get")["description"]
        .as_str()
        .unwrap()
        .ends_with("Roles: admin."));
    assert!(op("/v1/approvals/{id}/grant", "post")["description"]
        .as_str()
        .unwrap()
        .ends_with("Roles: admin, approver."));
    assert!(op("/v1/approvals/{id}", "get").is_object());
    assert!(op("/healthz", "get")["responses"]["403"].is_null());
}

/// The new settings come from a flag, the environment or the settings
/// file like every other; `config check` never shows a webhook's path
/// (often its secret).
#[tokio::test]
async fn the_approval_settings_are_read_like_the_others() {
    let dir = Proxy::dir();
    let file = dir.path().join("t.toml");
    std::fs::write(&file, "approval-ttl = \"2h\"\napproval-wait-ms = 1500\n").unwrap();
    let o = tessera(dir.path())
        .args(["--config", file.to_str().unwrap(), "config", "check"])
        .env(
            "TESSERA_APPROVAL_WEBHOOK",
            "https://hooks.example/T0/sekrit-path",
        )
        .output()
        .unwrap();
    let out = ok(o);
    let line = |k: &str| {
        out.lines()
            .find(|l| l.starts_with(k))
            .unwrap_or_else(|| panic!("no {k}: {out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("approval-ttl"), ["approval-ttl", "2h", "(file)"]);
    assert_eq!(
        line("approval-wait-ms"),
        ["approval-wait-ms", "1500", "(file)"]
    );
    assert_eq!(
        line("approval-webhook"),
        ["approval-webhook", "https://hooks.example/***", "(env)"]
    );
    assert!(!out.contains("sekrit"), "{out}");
    let o = tessera(dir.path())
        .args(["config", "check", "--approval-ttl", "soon"])
        .output()
        .unwrap();
    assert!(refused(o).contains("--approval-ttl \"soon\""));
    let o = tessera(dir.path())
        .args(["config", "check", "--approval-webhook", "ftp://x/sekrit"])
        .output()
        .unwrap();
    let e = refused(o);
    assert!(
        e.contains("--approval-webhook") && !e.contains("sekrit"),
        "{e}"
    );
    // The defaults: a day, no wait, no webhook.
    let out = ok(tessera(dir.path())
        .args(["config", "check"])
        .output()
        .unwrap());
    assert!(
        out.lines()
            .any(|l| l.starts_with("approval-ttl") && l.contains("24h")),
        "{out}"
    );
}

/// Replicas: a call waiting on one replica is granted through another
/// replica's admin API, on the same store. On Postgres the waiting replica
/// polls only once a minute here, so the grant can reach it in time only
/// by the change notification.
#[tokio::test]
async fn a_grant_on_another_replica_reaches_the_waiting_call() {
    let (up, waiter, a, mut got) = with_webhook(|c| {
        c.approval_wait = Duration::from_secs(30);
        if on_postgres() {
            c.refresh_interval = Duration::from_secs(60);
        }
    })
    .await;
    let shared = database_url(waiter.dir.path()).unwrap_or_else(|| {
        format!(
            "sqlite://{}",
            waiter.dir.path().join("tessera.db").display()
        )
    });
    let other = Proxy::dir();
    std::fs::copy(
        waiter.dir.path().join("master.key"),
        other.path().join("master.key"),
    )
    .unwrap();
    let replica = Proxy::start_on(
        other,
        Some(shared),
        |_| {},
        policies_with(&["ask-for-writes"]),
    )
    .await;
    let api = crate::admin_api::admin_api(&replica).await;
    let token = crate::admin_api::admin_token(&waiter, "ops");

    let waiting = tokio::spawn(async move { post_json(&a, write(1, json!({"path": "r"}))).await });
    let n = soon(got.recv()).await.unwrap();
    let id = n["id"].as_str().unwrap();
    let r = client()
        .post(format!("{api}/v1/approvals/{id}/grant"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (s, v) = soon(waiting).await.unwrap();
    assert_eq!(s, 200);
    assert!(ran(&v), "{v}");
    assert_eq!(up.seen().len(), 1);
}

/// Migration 0010 on a store that holds approvals and admin tokens from
/// before: states made explicit (a spent grant reads `used`), pending ones
/// given the default expiry, tokens the admin role, nothing lost.
#[tokio::test]
async fn the_states_migration_keeps_what_was_recorded() {
    let dir = Proxy::dir();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let (folder, url) = match database_url(dir.path()) {
        Some(url) => (root.join("postgres"), url),
        None => (
            root.join("sqlite"),
            format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("tessera.db").display()
            ),
        ),
    };
    // The migrations up to 0009 only, as a tessera of before applied them.
    let before = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&folder).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0010" {
            std::fs::copy(&path, before.path().join(&name)).unwrap();
        }
    }
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::migrate::Migrator::new(before.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    let now = tessera::telemetry::time::now_ms();
    for (id, status, expires, uses) in [
        ("ap_oldpending01", "pending", "NULL", "NULL"),
        ("ap_oldspent0001", "granted", "9999999999999", "0"),
        ("ap_oldlive00001", "granted", "9999999999999", "2"),
        ("ap_olddenied001", "denied", "NULL", "NULL"),
    ] {
        sqlx::query(&format!(
            "INSERT INTO approvals (id, created_at, caller, connection, rpc_method, tool, \
             arguments_sha256, status, expires_at, uses_left) \
             VALUES ('{id}', {now}, 'agent', 'c1', 'tools/call', 'write_file', 'v2:{id}', \
             '{status}', {expires}, {uses})"
        ))
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("INSERT INTO admin_tokens (name, token_sha256, created_at) VALUES ('ops', $1, 1)")
        .bind(vec![7u8; 32])
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    // Any command applies 0010, and reads what it rebuilt (in the same
    // process: on SQLite from connections opened after the migration).
    let all = ok(cli(dir.path(), &["approval", "list", "--all", "--json"]));
    let rows: Vec<Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |id: &str| rows.iter().find(|r| r["id"] == id).expect(&all).clone();
    assert_eq!(of("ap_oldspent0001")["status"], "used");
    assert_eq!(of("ap_oldlive00001")["status"], "granted");
    assert_eq!(of("ap_olddenied001")["status"], "denied");
    let pending = of("ap_oldpending01");
    assert_eq!(pending["status"], "pending");
    assert_eq!(pending["expires_at"].as_i64().unwrap(), now + 86_400_000);
    let tokens = ok(cli(dir.path(), &["admin-token", "list"]));
    assert!(
        tokens
            .lines()
            .any(|l| l.starts_with("ops") && l.contains("admin")),
        "{tokens}"
    );
    // And the moves apply to them: the spent grant is history.
    let e = refused(cli(dir.path(), &["approval", "deny", "ap_oldspent0001"]));
    assert!(e.contains("is used"), "{e}");
}

/// What an agent chose reaches a notice inert and without the credential
/// (no chat markup, no control or direction characters, the secret
/// redacted), one approval is announced once however many requests raced
/// to hold it, the approver's views redact the tool's name too, and a tool
/// name far beyond MCP's is refused before anything (all found by the
/// attack review).
#[tokio::test]
async fn a_notice_is_inert_redacted_and_sent_once() {
    let (up, p, a, mut got) = with_webhook(|_| {}).await;
    let call = |id: u32, tool: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {}}})
        .to_string()
    };
    let tool = format!("write_{SECRET} <!channel> <https://evil.example|approve>\n\u{202e}x");
    let answers =
        futures_util::future::join_all((0..6).map(|i| post_json(&a, call(i, &tool)))).await;
    let ids: std::collections::HashSet<String> =
        answers.iter().map(|(_, v)| approval_in(v)).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let id = ids.into_iter().next().unwrap();
    let n = soon(got.recv()).await.unwrap();
    assert_eq!(n["id"], id.as_str());
    assert!(!n.to_string().contains(SECRET), "{n}");
    let text = n["text"].as_str().unwrap();
    assert!(
        !text.contains('<') && !text.contains('\n') && !text.contains('\u{202e}'),
        "{text}"
    );
    // The next notice is another call's: none more for this approval.
    let (_, v) = post_json(&a, call(9, "write_other")).await;
    let next = soon(got.recv()).await.unwrap();
    assert_eq!(next["id"], approval_in(&v).as_str());
    assert!(!show(&p, &id).to_string().contains(SECRET));

    let (s, v) = post_json(&a, call(10, &"write".repeat(300))).await;
    assert_eq!(s, 400, "{v}");
    assert!(up.seen().is_empty());
}
