//! The console's read-only views in a real browser (tests/ui/views.mjs):
//! the decision trail paged and filtered (initialize and notifications
//! hidden by default), the approvals page reloading itself, and the
//! credentials, callers and connections, with nothing secret on any page.

use serde_json::Value;

use crate::admin_api::{admin_api, admin_token};
use crate::support::*;

#[tokio::test]
async fn the_console_shows_decisions_credentials_callers_and_connections() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let api = admin_api(&p).await;
    let token = admin_token(&p, "alice");
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let post = |body: String| {
        client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    assert_eq!(post(init.to_string()).await.unwrap().status(), 200);
    // More calls than one page of decisions holds.
    for i in 0..55 {
        assert_eq!(post(tools_call(i, "lookup")).await.unwrap().status(), 200);
    }
    assert_eq!(audit_rows(&p).await.len(), 56);

    let setup = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/setup.sh"))
        .status()
        .unwrap();
    assert!(setup.success(), "tests/ui/setup.sh failed");
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(if on_postgres() {
        "target/ui-artifacts/postgres"
    } else {
        "target/ui-artifacts"
    });
    std::fs::create_dir_all(&artifacts).unwrap();
    let out = tokio::process::Command::new("node")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/views.mjs"))
        .args([&api, &token, artifacts.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let text = |k: &str| seen[k].as_str().unwrap_or_default().to_string();

    assert_eq!(seen["refresh"], "15", "the approvals page reloads itself");
    // By default: tool calls, no initialize; a page of 50.
    let quiet = text("quiet");
    assert!(
        quiet.contains("lookup") && !quiet.contains("initialize"),
        "{quiet}"
    );
    assert_eq!(quiet.lines().filter(|l| l.contains("lookup")).count(), 50);
    // With everything: the filter is kept in the URL, and an older page
    // exists (56 records).
    assert!(text("allUrl").contains("all=1"), "{}", text("allUrl"));
    assert_eq!(seen["older"], 1);
    // The newest page shows the 50 newest: all tool calls here.
    assert_eq!(
        text("all").lines().filter(|l| l.contains("lookup")).count(),
        50
    );

    let creds = text("Credentials");
    assert!(
        creds.contains("gh") && creds.contains(&up.url("/mcp")),
        "{creds}"
    );
    assert!(text("Callers").contains("agent"));
    let conns = text("Connections");
    assert!(conns.contains(&a.url) && conns.contains("live"), "{conns}");
    for k in ["quiet", "all", "Credentials", "Callers", "Connections"] {
        assert!(
            !text(k).contains(SECRET) && !text(k).contains(&a.token),
            "{k}"
        );
    }
    assert_eq!(seen["scripts"], 0, "the pages run no script");
    for png in ["decisions", "credentials", "callers", "connections"] {
        let b = std::fs::read(artifacts.join(format!("{png}.png"))).unwrap();
        assert!(b.starts_with(b"\x89PNG") && b.len() > 5_000, "{png}.png");
    }
}
