//! The first day with the CLI and the admin API: where the store is, the
//! URL printed, objects' lifecycle (update, remove, rotate, restore), a
//! closed pipe, errors as JSON and never echoing a pasted secret.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};

use crate::admin_api::{admin_api, admin_token};
use crate::support::*;

/// The binary with no store named at all: no data dir, no database, in
/// `cwd`.
fn bare(cwd: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    for v in [
        "TESSERA_DATA_DIR",
        "TESSERA_DATABASE_URL",
        "TESSERA_DATABASE_URL_FILE",
        "TESSERA_CONFIG",
        "TESSERA_LISTEN",
        "TESSERA_PUBLIC_URL",
        "TESSERA_MASTER_KEY",
    ] {
        c.env_remove(v);
    }
    c.current_dir(cwd);
    c
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn an_admin_command_does_not_create_the_implicit_store() {
    let cwd = tempfile::tempdir().unwrap();
    let o = bare(cwd.path())
        .args(["caller", "add", "a"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    let looked = cwd.path().join("tessera-data");
    assert!(err.contains(&looked.display().to_string()), "{err}");
    assert!(
        err.contains("--data-dir") && err.contains("tessera init"),
        "{err}"
    );
    assert!(!looked.exists(), "the refused command created {looked:?}");

    // `init` creates it; then the same command works there.
    let o = bare(cwd.path()).arg("init").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(looked.join("tessera.db").exists() && looked.join("master.key").exists());
    // The database is its owner's alone, even in a folder open to others.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let open = cwd.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let o = bare(cwd.path())
            .arg("--data-dir")
            .arg(&open)
            .args(["caller", "add", "x"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        // (Its -wal and -shm files, while they exist, take its mode:
        // SQLite creates them so.)
        let mode = std::fs::metadata(open.join("tessera.db"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "tessera.db is {mode:o}");
    }
    let o = bare(cwd.path())
        .args(["caller", "add", "a"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // A data dir named explicitly is created on first use, as before.
    let named = cwd.path().join("named");
    let o = bare(cwd.path())
        .args(["caller", "list", "--data-dir"])
        .arg(&named)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(named.exists());
    // And so is one named in the environment or a settings file.
    let settings = cwd.path().join("s.toml");
    std::fs::write(&settings, "data-dir = \"from-file\"\n").unwrap();
    let o = bare(cwd.path())
        .args(["caller", "list", "--config"])
        .arg(&settings)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(cwd.path().join("from-file").exists());
}

#[test]
fn connection_urls_come_from_the_settings_serve_reads() {
    let dir = Proxy::dir();
    let d = dir.path();
    register(d, "http://127.0.0.1:1", "gh", "http://127.0.0.1:1/mcp", "a");
    let add = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = tessera(d);
        c.env_remove("TESSERA_PUBLIC_URL")
            .env_remove("TESSERA_LISTEN");
        c.envs(env.iter().copied());
        let o = c
            .args(extra)
            .args(["connection", "add", "--caller", "a", "--credential", "gh"])
            .output()
            .unwrap();
        last_line(&o)
    };
    assert!(add(&[], &[]).starts_with("http://127.0.0.1:7470/c/"));
    let settings = d.join("serve.toml");
    std::fs::write(&settings, "listen = \"localhost:7999\"\n").unwrap();
    let file = settings.to_str().unwrap();
    assert!(add(&["--config", file], &[]).starts_with("http://127.0.0.1:7999/c/"));
    assert!(add(&[], &[("TESSERA_CONFIG", file)]).starts_with("http://127.0.0.1:7999/c/"));
    // The environment wins over the file, as for serve.
    let env = [("TESSERA_LISTEN", "0.0.0.0:8123")];
    assert!(add(&["--config", file], &env).starts_with("http://127.0.0.1:8123/c/"));
    std::fs::write(&settings, "public-url = \"https://mcp.example.com\"\n").unwrap();
    assert!(add(&["--config", file], &[]).starts_with("https://mcp.example.com/c/"));

    // `serve --listen localhost:PORT` is what `config check` shows.
    let o = tessera(d)
        .args(["config", "check", "--listen", "localhost:7999"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("127.0.0.1:7999"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// With no address given, `connection add` prints the URL the running
/// `serve` answers on, whatever flags it was started with.
#[tokio::test]
async fn connection_urls_default_to_what_serve_answers_on() {
    let p = Proxy::start(Proxy::dir()).await;
    register(
        p.dir.path(),
        "http://127.0.0.1:1",
        "gh",
        "http://127.0.0.1:1/mcp",
        "a",
    );
    let o = tessera(p.dir.path())
        .env_remove("TESSERA_PUBLIC_URL")
        .env_remove("TESSERA_LISTEN")
        .args(["connection", "add", "--caller", "a", "--credential", "gh"])
        .output()
        .unwrap();
    let url = last_line(&o);
    assert!(
        url.starts_with(&format!("{}/c/", p.base())),
        "{url} is not on {}",
        p.base()
    );
    // Given explicitly, the address wins.
    let o = tessera(p.dir.path())
        .env_remove("TESSERA_PUBLIC_URL")
        .args(["connection", "list", "--listen", "localhost:7999"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("http://127.0.0.1:7999/c/"));
}

#[tokio::test]
async fn a_caller_is_rotated_updated_revoked_and_restored() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let status = |token: String| {
        let url = a.url.clone();
        async move {
            client()
                .post(url)
                .bearer_auth(token)
                .body(tools_call(1, "t"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(a.token.clone()).await, 200);

    // A new token: printed as the last line; the old one stops.
    let new = last_line(&p.cli(&["caller", "rotate-token", "agent"]));
    assert!(new.starts_with("tsr_") && new != a.token);
    within(Duration::from_secs(1), || {
        let s = status(a.token.clone());
        async move { s.await == 403 }
    })
    .await;
    assert_eq!(status(new.clone()).await, 200);

    // Groups replaced.
    let o = p.cli(&[
        "caller", "update", "agent", "--group", "ops", "--group", "dev",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = p.cli(&["--json", "caller", "list"]);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["groups"], json!(["dev", "ops"]));

    // Revoked: its connections are not live, and the name is not reusable
    // by `add`, whose message says how to restore it.
    assert!(p.cli(&["caller", "revoke", "agent"]).status.success());
    let o = p.cli(&["--json", "connection", "list", "--public-url", &p.base()]);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["state"], "caller-revoked");
    assert_eq!(list[0]["url"], a.url);
    let o = p.cli(&["caller", "add", "agent"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("caller restore agent"),
        "{}",
        stderr(&o)
    );
    let o = p.cli(&["caller", "rotate-token", "agent"]);
    assert!(stderr(&o).contains("is revoked"), "{}", stderr(&o));

    // Restored under a new token; the rotated one stays dead.
    let o = p.cli(&["caller", "restore", "agent"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 of its connections serve it again"));
    let restored = last_line(&o);
    assert!(restored.starts_with("tsr_") && restored != new);
    within(Duration::from_secs(1), || {
        let s = status(restored.clone());
        async move { s.await == 200 }
    })
    .await;
    assert_eq!(status(new).await, 403);
    let o = p.cli(&["caller", "restore", "agent"]);
    assert!(stderr(&o).contains("is not revoked"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_credential_is_updated_and_removed() {
    let up = Upstream::start().await;
    let other = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let call = || {
        client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .body(tools_call(1, "t"))
            .send()
    };
    assert_eq!(call().await.unwrap().status(), 200);
    assert_eq!(up.seen().len(), 1);

    // A new upstream URL: the next requests go there.
    let o = p.cli(&[
        "credential",
        "update",
        "gh",
        "--upstream",
        &other.url("/mcp"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    within(Duration::from_secs(1), || async {
        call().await.unwrap().status() == 200 && !other.seen().is_empty()
    })
    .await;
    // Scheme options only where they apply.
    let o = p.cli(&["credential", "update", "gh", "--header-name", "X-Key"]);
    assert!(stderr(&o).contains("does not apply to a credential of scheme bearer"));

    // Removal: refused while a live connection uses it, then cascaded.
    let o = p.cli(&["credential", "remove", "gh"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("1 live connection"), "{}", stderr(&o));
    assert_eq!(call().await.unwrap().status(), 200);
    let o = p.cli(&["credential", "remove", "gh", "--cascade"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("with its 1 connection(s)"));
    within(Duration::from_secs(1), || async {
        call().await.unwrap().status() == 404
    })
    .await;
    let o = p.cli(&["--json", "connection", "list"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        json!([])
    );
    // The name is free again.
    let b = p.agent("gh", &up.url("/mcp"), "agent2").await;
    assert!(b.url.contains("/c/"));
}

#[tokio::test]
async fn the_admin_api_has_the_same_lifecycle() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let api = admin_api(&p).await;
    let t = admin_token(&p, "ops");
    let req = |m: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = client().request(m, format!("{api}{path}")).bearer_auth(&t);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let resp = r.send().await.unwrap();
            let s = resp.status().as_u16();
            (s, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    use reqwest::Method as M;
    let (s, v) = req(M::POST, "/v1/callers/agent/token", None).await;
    assert_eq!(s, 200, "{v}");
    let token = v["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("tsr_") && token != a.token);
    let (s, _) = req(
        M::PATCH,
        "/v1/callers/agent",
        Some(json!({"groups": ["ops"]})),
    )
    .await;
    assert_eq!(s, 204);
    let (_, v) = req(M::GET, "/v1/connections", None).await;
    assert_eq!(v[0]["url"], a.url);
    assert_eq!(v[0]["state"], "live");
    let (s, v) = req(M::POST, "/v1/callers/agent/restore", None).await;
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("not revoked"), "{v}");
    let (s, v) = req(M::DELETE, "/v1/credentials/gh", None).await;
    assert_eq!(s, 409, "{v}");
    let patch = json!({"username": "bot"});
    let (s, v) = req(M::PATCH, "/v1/credentials/gh", Some(patch)).await;
    assert_eq!(s, 422, "{v}");
    let patch = json!({"upstream": up.url("/mcp2")});
    assert_eq!(
        req(M::PATCH, "/v1/credentials/gh", Some(patch)).await.0,
        204
    );
    let (_, v) = req(M::GET, "/v1/credentials", None).await;
    assert_eq!(v[0]["upstream"], up.url("/mcp2"));
    let (s, _) = req(M::DELETE, "/v1/credentials/gh?cascade=true", None).await;
    assert_eq!(s, 204);
    let (_, v) = req(M::GET, "/v1/credentials", None).await;
    assert_eq!(v, json!([]));
    // Each change is in the admin audit under the token's name.
    let (_, v) = req(M::GET, "/v1/admin-audit", None).await;
    let actions: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["actor"] == "ops")
        .filter_map(|r| r["action"].as_str())
        .collect();
    for want in [
        "caller.rotate-token",
        "caller.update",
        "caller.restore",
        "credential.update",
        "credential.remove",
    ] {
        assert!(actions.contains(&want), "{want} missing from {actions:?}");
    }
}

#[test]
fn a_closed_pipe_ends_a_listing_quietly() {
    let dir = Proxy::dir();
    let d = dir.path();
    for i in 0..3 {
        assert!(cli(d, &["caller", "add", &format!("c{i}")])
            .status
            .success());
    }
    for args in [&["caller", "list"][..], &["audit"], &["config", "check"]] {
        let mut child = tessera(d)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before anything is written.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(o.status.code().is_some(), "{args:?}: killed by a signal");
    }
}

#[test]
fn errors_are_json_with_json_and_never_echo_a_pasted_secret() {
    let dir = Proxy::dir();
    let d = dir.path();
    for args in [
        &["--json", "caller", "revoke", "nobody"][..],
        &["--json", "credential", "add"],
        &["--json", "connection", "frobnicate"],
    ] {
        let o = cli(d, args);
        assert!(!o.status.success());
        let err = stderr(&o);
        let v: Value = serde_json::from_str(err.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e}): {err}"));
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }

    // config check's report as one JSON object, invalid settings included.
    let o = cli(d, &["--json", "config", "check", "--max-body-bytes", "0"]);
    assert!(!o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(
        v["errors"][0]
            .as_str()
            .unwrap()
            .contains("--max-body-bytes"),
        "{v}"
    );
    let listen = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "listen");
    assert_eq!(listen.unwrap()["source"], "default");

    // A refused value says where it came from when not from the flag.
    let o = tessera(d)
        .env("TESSERA_ALLOW_PRIVATE_UPSTREAMS", "maybe")
        .args(["credential", "add", "x", "--upstream", "https://a.example"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("from the environment variable TESSERA_ALLOW_PRIVATE_UPSTREAMS"),
        "{err}"
    );
    let file = d.join("bad.toml");
    std::fs::write(&file, "max-body-bytes = \"lots\"\n").unwrap();
    let o = cli(d, &["--config", file.to_str().unwrap(), "config", "check"]);
    assert!(
        stderr(&o).contains("from the settings file (max-body-bytes)"),
        "{}",
        stderr(&o)
    );
    // Yes and 1 are true, as in most tools' environment variables.
    for yes in ["1", "yes", "on", "true"] {
        let o = tessera(d)
            .env("TESSERA_ALLOW_PRIVATE_UPSTREAMS", yes)
            .args(["--json", "config", "check"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{yes}: {}", stderr(&o));
    }

    let pasted = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
    for flag in ["--secret-env", "--client-secret-env"] {
        let mut args = vec![
            "credential",
            "add",
            "gh",
            "--upstream",
            "http://127.0.0.1:1/mcp",
        ];
        if flag == "--client-secret-env" {
            args.extend(["--scheme", "oauth2", "--token-url", "http://127.0.0.1:1/t"]);
            args.extend(["--client-id", "c"]);
        }
        args.extend([flag, pasted]);
        let o = cli(d, &args);
        assert!(!o.status.success());
        let all = format!("{}{}", stderr(&o), String::from_utf8_lossy(&o.stdout));
        assert!(
            !all.contains(pasted),
            "{flag}: the pasted secret was echoed: {all}"
        );
        assert!(all.contains("name of an environment variable"), "{all}");
    }
    // A short one too, and one shaped like a lower-case variable name.
    for (flag, value) in [
        ("--secret-env", "hunter2pass"),
        ("--secret-stdin", "hunter2pass"),
    ] {
        let o = cli(
            d,
            &[
                "credential",
                "add",
                "gh",
                "--upstream",
                "https://a.example",
                flag,
                value,
            ],
        );
        assert!(!o.status.success());
        assert!(!stderr(&o).contains(value), "{flag}: {}", stderr(&o));
    }
    // A secret in an upstream URL's query is refused, and not echoed.
    let o = cli(
        d,
        &[
            "credential",
            "add",
            "q",
            "--upstream",
            "https://a.example/mcp?api_key=hunter2pass",
            "--secret-env",
            "TEST_SECRET",
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("names a credential") && !err.contains("hunter2pass"),
        "{err}"
    );
    // Pasted where no value belongs: the parser's complaint hides it.
    for json in [false, true] {
        let mut args = vec!["credential", "add", "gh", "--upstream", "https://a.example"];
        args.extend(["--secret-stdin", pasted]);
        if json {
            args.insert(0, "--json");
        }
        let o = cli(d, &args);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(!err.contains(pasted) && err.contains("not shown"), "{err}");
    }
}

#[tokio::test]
async fn policy_explain_takes_the_connection_url_and_warns_on_an_unknown_method() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let o = p.cli(&[
        "policy",
        "explain",
        "--caller",
        "agent",
        "--connection",
        &a.url,
        "--method",
        "tools/call",
        "--tool",
        "t",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("allow"));
    assert!(!stderr(&o).contains("warning"));
    let o = p.cli(&[
        "policy",
        "explain",
        "--caller",
        "agent",
        "--connection",
        &a.url,
        "--method",
        "tool/call",
    ]);
    assert!(
        stderr(&o).contains("\"tool/call\" is no MCP method"),
        "{}",
        stderr(&o)
    );
}
