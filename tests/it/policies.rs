//! Cedar policies on the data plane and in the CLI: a refused tool call is
//! a result the model can read, other refusals are 403s, a batch is refused
//! whole, and none of them reaches the upstream; groups set by the CLI
//! reach the policies; an invalid policy folder stops `serve` with file,
//! line and reason.

use crate::support::*;

/// A policy folder: the shipped default, the tool deny-list example, and a
/// policy that forbids prompts/get.
fn policy_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::copy(root.join("default.cedar"), dir.path().join("default.cedar")).unwrap();
    std::fs::copy(
        root.join("examples/tool-deny-list.cedar"),
        dir.path().join("tool-deny-list.cedar"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("no-prompts.cedar"),
        "@id(\"no-prompts\")\nforbid (principal, action == Action::\"prompts/get\", resource);\n",
    )
    .unwrap();
    dir
}

#[tokio::test]
async fn policy_refusals_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let policies = tessera::authz::cedar::Policies::load_dir(policy_dir().path()).unwrap();
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let conn8: String = a.url.rsplit('/').next().unwrap().chars().take(8).collect();

    // A forbidden tool: 200, a tool result with isError the model can read.
    let (s, v) = post_json(&a, tools_call(9, "delete_repo")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["id"], 9);
    assert_eq!(v["result"]["isError"], true);
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"delete_repo\""), "{text}");
    assert!(text.contains(&conn8), "{text}");
    assert!(text.contains("no-destructive-tools"), "{text}");

    // Another forbidden method: 403 with a JSON-RPC error naming the policy.
    let prompts = r#"{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"p"}}"#;
    let (s, v) = post_json(&a, prompts.to_string()).await;
    assert_eq!((s, v["error"]["code"].as_i64()), (403, Some(-32003)), "{v}");
    assert_eq!(v["id"], 3);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("prompts/get") && msg.contains("no-prompts"),
        "{msg}"
    );

    // A batch with one forbidden element is refused whole.
    let batch = format!(
        "[{},{}]",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, prompts
    );
    let (s, _) = post_json(&a, batch).await;
    assert_eq!(s, 403);
    // A batch holding a forbidden tool call is refused whole too, as a 403:
    // there is no single call to answer with a tool result.
    let batch = format!(
        "[{},{}]",
        tools_call(1, "ok_tool"),
        tools_call(2, "drop_db")
    );
    let (s, _) = post_json(&a, batch).await;
    assert_eq!(s, 403);

    assert!(
        up.seen().is_empty(),
        "a refused request reached the upstream"
    );

    // What the policies allow still goes through.
    let (s, v) = post_json(&a, tools_call(4, "update_issue")).await;
    assert_eq!(s, 200);
    assert_eq!(v["result"]["echo"], "tools/call");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn groups_from_the_cli_reach_the_policies() {
    let dir = Proxy::dir();
    let d = dir.path();
    let o = cli(
        d,
        &[
            "credential",
            "add",
            "gh",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--secret-env",
            "TEST_SECRET",
        ],
    );
    assert!(o.status.success());
    last_line(&cli(d, &["caller", "add", "r1", "--group", "readers"]));
    last_line(&cli(d, &["caller", "add", "w1"]));
    let list = String::from_utf8(cli(d, &["caller", "list"]).stdout).unwrap();
    assert!(
        list.lines()
            .any(|l| l.starts_with("r1") && l.ends_with("readers")),
        "{list}"
    );
    let conn = |who: &str| {
        last_line(&cli(
            d,
            &["connection", "add", "--caller", who, "--credential", "gh"],
        ))
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
    };
    let (c_r, c_w) = (conn("r1"), conn("w1"));

    let pol = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for f in ["default.cedar", "examples/read-only.cedar"] {
        let name = std::path::Path::new(f).file_name().unwrap();
        std::fs::copy(root.join(f), pol.path().join(name)).unwrap();
    }
    let explain = |who: &str, c: &str, method: &str| {
        let o = cli(
            d,
            &[
                "policy",
                "explain",
                "--policies",
                pol.path().to_str().unwrap(),
                "--caller",
                who,
                "--connection",
                c,
                "--method",
                method,
                "--tool",
                "t",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let out = explain("r1", &c_r, "tools/call");
    assert!(out.contains("decision: deny"), "{out}");
    assert!(out.contains("determined by: readers-read-only"), "{out}");
    let out = explain("w1", &c_w, "tools/call");
    assert!(out.contains("decision: allow"), "{out}");
    assert!(out.contains("determined by: own-connections"), "{out}");
    let out = explain("r1", &c_r, "tools/list");
    assert!(out.contains("decision: allow"), "{out}");
    // Someone else's connection: nothing permits it.
    let out = explain("w1", &c_r, "tools/list");
    assert!(
        out.contains("decision: deny") && out.contains("no policy permits it"),
        "{out}"
    );
    assert!(out.contains("serve answers 404"), "{out}");

    // Group names are checked like caller names.
    let o = cli(d, &["caller", "add", "x", "--group", "a,b"]);
    assert!(!o.status.success());
}

#[tokio::test]
async fn invalid_policies_stop_serve_and_fail_the_check() {
    let dir = Proxy::dir();
    let pol = tempfile::tempdir().unwrap();
    std::fs::write(
        pol.path().join("bad.cedar"),
        "// a typo in the action\n\nforbid (principal, action == Action::\"tools/cal\", resource);\n",
    )
    .unwrap();
    let p = pol.path().to_str().unwrap();
    let o = cli(
        dir.path(),
        &["serve", "--listen", "127.0.0.1:0", "--policies", p],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.cedar:3: "), "{err}");
    assert!(err.contains("tools/cal"), "{err}");

    let o = cli(dir.path(), &["policy", "check", p]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.cedar:3: "));

    let good = policy_dir();
    let o = cli(
        dir.path(),
        &["policy", "check", good.path().to_str().unwrap()],
    );
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{out}");
    for id in ["own-connections", "no-destructive-tools", "no-prompts"] {
        assert!(out.lines().any(|l| l.trim() == id), "{out}");
    }
}

/// Wait for the next reload attempt to be reported.
async fn next_reload(
    rx: &mut tokio::sync::watch::Receiver<tessera::authz::cedar::Reloads>,
) -> tessera::authz::cedar::Reloads {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.changed())
        .await
        .expect("no reload within 10 s")
        .unwrap();
    rx.borrow_and_update().clone()
}

#[tokio::test]
async fn edited_policies_are_reloaded_and_a_broken_edit_keeps_the_last_good_set() {
    let up = Upstream::start().await;
    let pol = policy_dir();
    let policies = tessera::authz::cedar::Policies::load_dir(pol.path()).unwrap();
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let mut rx = p.state.authorizer.reloads();
    tokio::spawn(tessera::authz::cedar::watch_dir(
        p.state.authorizer.clone(),
        pol.path().to_path_buf(),
        std::time::Duration::from_millis(20),
        futures_util::stream::pending(),
    ));
    let list = || r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_string();
    assert_eq!(post_json(&a, list()).await.0, 200);

    // Files appear whole (written aside, then renamed), as an editor or a
    // deployment would place them; the watcher never sees half a file.
    let put = |name: &str, text: &str| {
        let tmp = pol.path().join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, pol.path().join(name)).unwrap();
    };

    // An edit that forbids tools/list takes effect.
    put(
        "no-list.cedar",
        "@id(\"no-list\")\nforbid (principal, action == Action::\"tools/list\", resource);\n",
    );
    let r = next_reload(&mut rx).await;
    assert_eq!((r.generation, r.last_error), (1, None));
    let (s, v) = post_json(&a, list()).await;
    assert_eq!(s, 403);
    assert!(v["error"]["message"].as_str().unwrap().contains("no-list"));

    // A broken edit is reported and changes nothing.
    put(
        "broken.cedar",
        "permit (principal, action, resource) when {",
    );
    let r = next_reload(&mut rx).await;
    assert_eq!(r.generation, 1);
    assert!(
        r.last_error
            .as_deref()
            .unwrap()
            .contains("broken.cedar:1: "),
        "{r:?}"
    );
    assert_eq!(
        post_json(&a, list()).await.0,
        403,
        "the last good set is in force"
    );
    assert_eq!(post_json(&a, tools_call(2, "update_issue")).await.0, 200);

    // Removing the broken file reloads again, with the good edit in force.
    std::fs::remove_file(pol.path().join("broken.cedar")).unwrap();
    let r = next_reload(&mut rx).await;
    assert_eq!((r.generation, r.last_error), (2, None));
    assert_eq!(post_json(&a, list()).await.0, 403);
    assert_eq!(post_json(&a, tools_call(3, "update_issue")).await.0, 200);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_policies_of_a_running_serve() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let d = dir.path();
    let port = Served::free_port();
    let a = register(
        d,
        &format!("http://127.0.0.1:{port}"),
        "gh",
        &up.url("/mcp"),
        "agent",
    );
    let pol = policy_dir();
    // Only the signal can trigger the reload in this test.
    let args = [
        "--policies",
        pol.path().to_str().unwrap(),
        "--policy-check-ms",
        "3600000",
    ];
    let mut served = Served::start(d, port, &args, &[]).await;
    let list = || r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_string();
    assert_eq!(post_json(&a, list()).await.0, 200);
    std::fs::write(
        pol.path().join("no-list.cedar"),
        "@id(\"no-list\")\nforbid (principal, action == Action::\"tools/list\", resource);\n",
    )
    .unwrap();
    served.signal("HUP");
    served.wait_for("policies reloaded").await;
    assert_eq!(post_json(&a, list()).await.0, 403);
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "SIGHUP ended serve"
    );
}
