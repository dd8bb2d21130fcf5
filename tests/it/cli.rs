//! The command-line contract, changes reaching a running data plane from
//! another process, and secrets absent from the data dir and the logs.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn revocation_from_another_process_takes_effect_within_a_second() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let ok = |a: &Agent| {
        client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .body(tools_call(1, "t"))
            .send()
    };
    assert_eq!(ok(&a).await.unwrap().status(), 200);

    // Revoke the connection from a separate CLI process.
    let o = p.cli(&["connection", "revoke", &a.url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let took = within(Duration::from_secs(1), || async {
        ok(&a).await.unwrap().status() == 404
    })
    .await;
    eprintln!("connection revocation served after {took:?}");

    // Revoke a caller: its token stops authenticating.
    let b = p.agent("gh", &up.url("/mcp"), "b").await;
    assert_eq!(ok(&b).await.unwrap().status(), 200);
    assert!(p.cli(&["caller", "revoke", "b"]).status.success());
    let took = within(Duration::from_secs(1), || async {
        ok(&b).await.unwrap().status() == 403
    })
    .await;
    eprintln!("caller revocation served after {took:?}");
}

#[test]
fn cli_contract_and_errors() {
    let dir = Proxy::dir();
    let d = dir.path();
    let fail = |args: &[&str], needle: &str| {
        let o = cli(d, args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    assert!(cli(
        d,
        &[
            "credential",
            "add",
            "gh",
            "--upstream",
            "http://127.0.0.1:1/mcp",
            "--secret-env",
            "TEST_SECRET"
        ]
    )
    .status
    .success());
    fail(
        &[
            "credential",
            "add",
            "gh",
            "--upstream",
            "http://127.0.0.1:1/mcp",
            "--secret-env",
            "TEST_SECRET",
        ],
        "already exists",
    );
    fail(
        &[
            "credential",
            "add",
            "x",
            "--upstream",
            "not a url",
            "--secret-env",
            "TEST_SECRET",
        ],
        "invalid upstream URL",
    );
    fail(
        &[
            "credential",
            "add",
            "x",
            "--upstream",
            "http://h/",
            "--secret-env",
            "NO_SUCH_VAR_T",
        ],
        "NO_SUCH_VAR_T",
    );
    fail(
        &[
            "credential",
            "add",
            "x",
            "--upstream",
            "http://h/",
            "--scheme",
            "header",
            "--secret-env",
            "TEST_SECRET",
        ],
        "--header-name",
    );
    fail(&["caller", "revoke", "ghost"], "no caller named \"ghost\"");
    fail(
        &[
            "connection",
            "add",
            "--caller",
            "ghost",
            "--credential",
            "gh",
        ],
        "no caller",
    );
    let token = last_line(&cli(d, &["caller", "add", "agent"]));
    assert!(token.starts_with("tsr_") && token.len() > 40);
    fail(&["caller", "add", "agent"], "already exists");
    fail(
        &[
            "connection",
            "add",
            "--caller",
            "agent",
            "--credential",
            "nope",
        ],
        "no credential",
    );
    let url = last_line(&cli(
        d,
        &[
            "connection",
            "add",
            "--caller",
            "agent",
            "--credential",
            "gh",
        ],
    ));
    let id = url.strip_prefix("http://127.0.0.1:7470/c/").expect(&url);
    assert!(id.len() >= 22, "id too short for 128 bits: {id}");

    // Secret via stdin.
    let mut child = tessera(d)
        .args([
            "credential",
            "add",
            "piped",
            "--upstream",
            "https://api.example/mcp",
            "--secret-stdin",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped-secret-9\n")
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());

    // Listings never show a secret or a token.
    for what in ["credential", "caller", "connection"] {
        for json in [false, true] {
            let mut args = vec![what, "list"];
            if json {
                args.push("--json");
            }
            let out = String::from_utf8(cli(d, &args).stdout).unwrap();
            assert!(
                !out.contains(SECRET) && !out.contains("piped-secret-9") && !out.contains(&token),
                "{out}"
            );
            if what == "credential" {
                assert!(out.contains("gh") && out.contains("piped"), "{out}");
            }
        }
    }
    assert_no_plaintext(d, &[SECRET, "piped-secret-9", &token]);
}

/// `tessera serve` as its own process, with debug logs: drive a request,
/// a refusal and an upstream rejection through it, then check that the
/// logs and the data dir hold neither the secret nor the caller token.
#[tokio::test]
async fn serve_binary_logs_no_secret() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let d = dir.path();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let a = register(d, &public, "gh", &up.url("/mcp"), "agent");
    let denied = register(d, &public, "deny", &up.url("/deny"), "agent2");
    let mut served = Served::start(d, port, &[], &[("RUST_LOG", "trace")]).await;
    let c = client();
    assert_eq!(
        c.post(&a.url)
            .bearer_auth(&a.token)
            .body(tools_call(1, "t"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.post(&a.url)
            .bearer_auth("tsr_bad")
            .body(tools_call(2, "t"))
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        c.post(&denied.url)
            .bearer_auth(&denied.token)
            .body(tools_call(3, "t"))
            .send()
            .await
            .unwrap()
            .status(),
        502
    );
    // SIGTERM, then read the rest of the log.
    served.signal("TERM");
    served.read_to_end().await;
    let status = served.child.wait().await.unwrap();
    assert!(
        status.success(),
        "serve did not shut down cleanly: {status:?}"
    );
    let log = served.log;
    assert!(log.contains("tessera::access"), "no access log: {log}");
    assert!(log.contains("credential_rejected"), "{log}");
    for secret in [SECRET, &a.token, &denied.token] {
        assert!(!log.contains(secret), "a secret is in the log");
    }
    assert_no_plaintext(d, &[SECRET, &a.token, &denied.token]);
}

#[tokio::test]
async fn a_database_from_a_newer_tessera_is_refused() {
    let dir = Proxy::dir();
    let d = dir.path();
    let o = cli(d, &["migrate"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let known = std::fs::read_dir(if on_postgres() {
        "migrations/postgres"
    } else {
        "migrations/sqlite"
    })
    .unwrap()
    // The newest version, not the count: versions need not be contiguous
    // (branches take numbers in turn).
    .filter_map(|e| {
        let name = e.unwrap().file_name().into_string().unwrap();
        name.split('_').next()?.parse::<i64>().ok()
    })
    .max()
    .unwrap();
    assert_eq!(last_line(&o), format!("schema at migration {known}"));
    // A newer tessera applied a migration this one does not know.
    let checksum = if on_postgres() {
        "decode('00', 'hex')"
    } else {
        "x'00'"
    };
    raw_sql(
        d,
        &format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99999, 'from the future', TRUE, {checksum}, 0)"
        ),
    )
    .await;
    for args in [
        &["migrate"][..],
        &["serve", "--listen", "127.0.0.1:0"],
        &["caller", "list"],
    ] {
        let o = cli(d, args);
        assert!(!o.status.success(), "{args:?} ran on a newer schema");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!(
                "schema is at migration 99999, newer than this tessera knows (up to {known})"
            )),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn the_database_url_can_come_from_a_file() {
    let dir = Proxy::dir();
    let d = dir.path();
    last_line(&cli(d, &["migrate"]));
    let url =
        database_url(d).unwrap_or_else(|| format!("sqlite://{}", d.join("tessera.db").display()));
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("database_url");
    std::fs::write(&file, format!("{url}\n")).unwrap();
    let o = tessera(d)
        .env_remove("TESSERA_DATABASE_URL")
        .env("TESSERA_DATABASE_URL_FILE", &file)
        .env("TESSERA_DATA_DIR", secrets.path().join("elsewhere"))
        .args(["caller", "add", "from-file"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8(cli(d, &["caller", "list"]).stdout).unwrap();
    assert!(listed.contains("from-file"), "{listed}");
    let o = tessera(d)
        .env_remove("TESSERA_DATABASE_URL")
        .env("TESSERA_DATABASE_URL_FILE", "/nonexistent/database_url")
        .args(["caller", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("reading TESSERA_DATABASE_URL_FILE /nonexistent/database_url"),
        "{err}"
    );
}

/// `--json` on every command gives one JSON value a script can read (no
/// secret in it but a token at creation), and list tables stay aligned
/// whatever the names' lengths.
#[test]
fn every_command_answers_json_and_tables_align() {
    let dir = Proxy::dir();
    let run = |args: &[&str]| {
        let o = cli(dir.path(), args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = run(&a);
        assert!(!out.contains(SECRET), "{out}");
        serde_json::from_str(out.trim_end()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    let long = "a-credential-with-a-rather-long-name";
    let v = json(&[
        "credential",
        "add",
        long,
        "--upstream",
        "http://127.0.0.1:9/mcp",
        "--secret-env",
        "TEST_SECRET",
    ]);
    assert_eq!(v["added"], long);
    json(&[
        "credential",
        "add",
        "gh",
        "--upstream",
        "http://127.0.0.1:9/mcp",
        "--secret-env",
        "TEST_SECRET",
    ]);
    let c = json(&["caller", "add", "agent"]);
    assert!(c["token"].as_str().unwrap().starts_with("tsr_"), "{c}");
    let conn = json(&[
        "connection",
        "add",
        "--caller",
        "agent",
        "--credential",
        long,
    ]);
    let id = conn["id"].as_str().unwrap();
    assert!(
        conn["url"].as_str().unwrap().ends_with(&format!("/c/{id}")),
        "{conn}"
    );
    let t = json(&["admin-token", "add", "ops"]);
    assert!(t["token"].as_str().unwrap().starts_with("tsa_"), "{t}");
    assert!(json(&["migrate"])["schema_version"].as_i64().unwrap() >= 7);
    assert!(json(&["key", "status"]).is_array());
    assert!(json(&["policy", "check"])["count"].as_u64().unwrap() >= 1);
    assert_eq!(json(&["credential", "list"]).as_array().unwrap().len(), 2);
    assert_eq!(json(&["connection", "list"])[0]["id"], id);
    assert_eq!(json(&["admin-token", "list"])[0]["name"], "ops");
    assert_eq!(json(&["connection", "revoke", id])["revoked"], id);
    assert_eq!(json(&["caller", "revoke", "agent"])["revoked"], "agent");

    // The table: every column starts at the same place on every line.
    let table = run(&["credential", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let col = lines[0].find("SCHEME").unwrap();
    for l in &lines[1..] {
        assert_eq!(&l[col..col + 6], "bearer", "{table}");
    }
    assert!(col > long.len(), "{table}");
}
