//! The approvals console (`/ui` on the admin listener), end to end in a
//! real browser: a real MCP client (rmcp) calls a tool through tessera, a
//! policy holds it for a person, headless Chromium (Debian's, driven by
//! playwright-core: tests/ui/console.mjs) signs in, sees the held call,
//! keeps a screenshot, and grants it with one click; the client's retry
//! then runs. Also: what the page refuses (cross-site posts, a wrong CSRF
//! token) and that hostile tool names are shown as text.

use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::Value;

use crate::admin_api::{admin_api, admin_token};
use crate::support::*;

/// The built-in policy plus one that holds every call of `sum`, or of any
/// tool whose name starts with `<`, for a person.
fn hold_sum() -> tessera::authz::cedar::Policies {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let default = std::fs::read_to_string(root.join("default.cedar")).unwrap();
    let ask = r#"@id("ask-sum") @ask
permit (principal, action == Action::"tools/call", resource)
when { resource.owner == principal && context has tool && (context.tool == "sum" || context.tool like "<*") };"#;
    tessera::authz::cedar::Policies::from_texts(
        "test",
        None,
        vec![
            ("default.cedar".into(), default),
            ("ask-sum.cedar".into(), ask.into()),
        ],
    )
    .unwrap()
}

#[tokio::test]
async fn a_person_grants_a_held_call_in_a_real_browser() {
    let (addr, _) = crate::rmcp_peers::rmcp_server().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, hold_sum()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "alice");
    let a = p
        .agent("adder", &format!("http://{addr}/mcp"), "agent")
        .await;

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url.clone()).auth_header(a.token.clone()),
    );
    let client = ClientConfig::default().serve(transport).await.unwrap();
    let args = serde_json::json!({"a": 40, "b": 2})
        .as_object()
        .unwrap()
        .clone();
    let call = || CallToolRequestParams::new("sum").with_arguments(args.clone());
    let held = client.call_tool(call()).await.unwrap();
    assert_eq!(held.is_error, Some(true));
    let text = serde_json::to_value(&held.content).unwrap().to_string();
    assert!(text.contains("pending"), "{text}");

    // The browser: sign in, see the call, screenshot, grant.
    let (seen, _, shot) = browser("console.mjs", &[&api, &token, "sum"], "console").await;
    assert_eq!(seen["signIn"], format!("{api}/ui/login"));
    let row = seen["rowText"].as_str().unwrap();
    assert!(
        row.contains("agent") && row.contains("sum") && row.contains(r#"{"a":40,"b":2}"#),
        "{row}"
    );
    assert_eq!(seen["scripts"], 0, "the page runs no script");
    let cookie = &seen["cookies"][0];
    assert_eq!(cookie["name"], "tessera_ui");
    assert_eq!(cookie["httpOnly"], true);
    assert_eq!(cookie["sameSite"], "Strict");
    assert_eq!(cookie["path"], "/ui");
    assert_ne!(
        cookie["value"].as_str().unwrap(),
        token,
        "the cookie is not the token"
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "screenshot"
    );

    // The retried call runs, and the grant is recorded under alice's name.
    let r = client.call_tool(call()).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(serde_json::to_value(&r.content)
        .unwrap()
        .to_string()
        .contains("42"));
    let _ = client.cancel().await;
    let actions = p.store().admin_audit(None, 10).await.unwrap();
    assert_eq!(
        (
            actions[0].actor.as_str(),
            actions[0].action.as_str(),
            actions[0].outcome.as_str()
        ),
        ("alice", "approval.grant", "ok")
    );
}

/// Run `tests/ui/<script>` with `args` and a screenshot path in headless
/// Chromium (installed first when missing): the JSON line it printed last,
/// its whole output, and the screenshot (`target/ui-artifacts/<shot>.png`,
/// `-postgres` on the Postgres leg).
async fn browser(script: &str, args: &[&str], shot: &str) -> (Value, String, std::path::PathBuf) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let setup = std::process::Command::new("bash")
        .arg(root.join("tests/ui/setup.sh"))
        .status()
        .unwrap();
    assert!(setup.success(), "tests/ui/setup.sh failed");
    let artifacts = root.join("target/ui-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let leg = if on_postgres() { "-postgres" } else { "" };
    let shot = artifacts.join(format!("{shot}{leg}.png"));
    let _ = std::fs::remove_file(&shot);
    let out = tokio::process::Command::new("node")
        .arg(root.join("tests/ui").join(script))
        .args(args)
        .arg(&shot)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the browser run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (seen, stdout, shot)
}

/// Sign in over plain HTTP; the session cookie and the page's CSRF token.
pub(crate) async fn sign_in(api: &str, token: &str) -> (String, String) {
    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = c
        .post(format!("{api}/ui/login"))
        .header("origin", api)
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_string();
    let page = c
        .get(format!("{api}/ui"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    let at = html.find("name=csrf value=\"").unwrap() + "name=csrf value=\"".len();
    let csrf = html[at..].split('"').next().unwrap().to_string();
    (cookie, csrf)
}

#[tokio::test]
async fn the_console_refuses_forged_forms_and_shows_hostile_names_as_text() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, hold_sum()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "alice");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let evil = "<img src=x onerror=alert(1)>";
    let (_, v) = post_json(&a, tools_call(1, evil)).await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    let id = p.store().approvals(false, 10).await.unwrap()[0].id.clone();

    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Not signed in: sent to the form. A wrong token: 401, no cookie.
    let r = c.get(format!("{api}/ui")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/login");
    let r = c
        .post(format!("{api}/ui/login"))
        .header("origin", &api)
        .form(&[("token", "tsa_wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());

    let (cookie, csrf) = sign_in(&api, &token).await;
    let html = page_text(&c, format!("{api}/ui"), &cookie).await;
    assert!(
        html.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{html}"
    );
    assert!(
        !html.contains(evil),
        "a hostile name reached the page as markup"
    );

    // A form from another site, or with the wrong CSRF token: refused, and
    // the approval stays pending.
    let grant = format!("{api}/ui/approvals/{id}/grant");
    for (origin, token) in [
        ("http://evil.example", csrf.as_str()),
        (api.as_str(), "not-the-token"),
    ] {
        let r = c
            .post(&grant)
            .header("cookie", &cookie)
            .header("origin", origin)
            .form(&[("csrf", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "origin {origin}");
    }
    let still = p.store().approvals(false, 10).await.unwrap();
    assert_eq!(still.len(), 1);
    let r = c
        .post(format!("{api}/ui/approvals/{id}/deny"))
        .header("cookie", &cookie)
        .header("origin", &api)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(p.store().approvals(false, 10).await.unwrap().is_empty());

    // Revoking the admin token ends its sessions at once.
    last_line(&p.cli(&["admin-token", "revoke", "alice"]));
    let r = c
        .get(format!("{api}/ui"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
}

/// A console page's HTML, signed in with `cookie`.
async fn page_text(c: &reqwest::Client, url: String, cookie: &str) -> String {
    let r = c.get(url).header("cookie", cookie).send().await.unwrap();
    r.text().await.unwrap()
}

/// The ids of the approvals a console page lists, and its next page's
/// address.
fn listed(html: &str) -> (Vec<String>, Option<String>) {
    let ids = html
        .split("data-approval=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().to_string())
        .collect();
    let next = html
        .split("<a id=next href=\"")
        .nth(1)
        .map(|s| s.split('"').next().unwrap().replace("&amp;", "&"));
    (ids, next)
}

/// Issue 23 §2: every pending approval can be reached, on the console and
/// through the API, however many there are: the console showed the
/// newest 200 and no more. 250 are paged through (100 a page, several
/// asked in the same millisecond), each seen once, newest first.
#[tokio::test]
async fn the_console_pages_through_every_pending_approval() {
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "alice");
    let store = p.store();
    for i in 0..250 {
        store
            .add_approval(&tessera::store::model::NewApproval {
                id: tessera::authz::approvals::new_id(),
                created_at: 1_700_000_000_000 + i / 3,
                key: tessera::store::model::CallKey {
                    caller: "agent".into(),
                    connection: "c1".into(),
                    rpc_method: "tools/call".into(),
                    tool: format!("write_{i}"),
                    arguments_sha256: String::new(),
                },
                expires_at: i64::MAX,
                sealed_call: None,
                reason: None,
                shown: Default::default(),
                credential: None,
                shape: None,
            })
            .await
            .unwrap();
    }
    let want: Vec<String> = store
        .approvals(false, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(want.len(), 250);

    let (cookie, _) = sign_in(&api, &token).await;
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut seen = Vec::new();
    let mut next = Some("/ui".to_string());
    let mut pages = 0;
    while let Some(path) = next {
        let html = page_text(&c, format!("{api}{path}"), &cookie).await;
        let (ids, n) = listed(&html);
        assert!(ids.len() <= 100, "a page of {}", ids.len());
        seen.extend(ids);
        next = n;
        pages += 1;
        assert!(pages <= 3, "more pages than needed");
    }
    assert_eq!(
        seen, want,
        "the console's pages are not every pending approval once"
    );

    // The API pages alike.
    let mut seen = Vec::new();
    let mut url = format!("{api}/v1/approvals?limit=100");
    loop {
        let page: Vec<Value> = client()
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        url = format!(
            "{api}/v1/approvals?limit=100&before={}",
            last["id"].as_str().unwrap()
        );
        seen.extend(page.iter().map(|a| a["id"].as_str().unwrap().to_string()));
    }
    assert_eq!(seen, want);
}

/// Issue 25: an approver token (`admin-token add NAME --role approver`)
/// uses the console: the held call with its approval id, expiry and
/// arguments (opened from the sealed copy, without --audit-arguments), the
/// decision trail, a grant with one click; the credential, caller and
/// connection pages are refused. Headless Chromium (tests/ui/approver.mjs),
/// with a screenshot kept.
#[tokio::test]
async fn an_approver_decides_in_the_console_and_nothing_else() {
    let up = Upstream::start().await;
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["ask-for-writes"])).await;
    let api = admin_api(&p).await;
    let approver = last_line(&p.cli(&["admin-token", "add", "rita", "--role", "approver"]));
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let held = serde_json::json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "write_file", "arguments": {"path": "views-Jw3.txt"}}})
    .to_string();
    let (_, v) = post_json(&a, held.clone()).await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    audit_rows(&p).await;

    let (seen, stdout, shot) = browser(
        "approver.mjs",
        &[&api, &approver, "write_file"],
        "console-approver",
    )
    .await;
    let row = seen["rowText"].as_str().unwrap();
    assert!(
        row.contains("views-Jw3.txt") && row.contains("ap_"),
        "{row}"
    );
    assert!(
        seen["expires"].as_str().unwrap().starts_with("20"),
        "{seen}"
    );
    assert_eq!(seen["refresh"], "15");
    assert_eq!(seen["scripts"], 0, "the page runs no script");
    let nav = seen["nav"].as_str().unwrap();
    assert!(
        nav.contains("Decisions") && !nav.contains("Credentials"),
        "{nav}"
    );
    assert_eq!(seen["credentialsStatus"], 403);
    assert_eq!(seen["decisionsStatus"], 200);
    assert!(seen["decisions"].as_str().unwrap().contains("write_file"));
    assert!(!stdout.contains(SECRET) && !stdout.contains(&a.token));
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 5_000,
        "screenshot"
    );

    // The approver's grant runs the call, recorded under rita's name.
    let (_, v) = post_json(&a, held).await;
    assert_eq!(v["result"]["echo"], "tools/call", "{v}");
    let actions = p.store().admin_audit(None, 10).await.unwrap();
    assert_eq!(
        (actions[0].actor.as_str(), actions[0].action.as_str()),
        ("rita", "approval.grant")
    );
}
