//! Master key rotation: every secret re-sealed under a new key while the
//! data plane keeps serving; `key status` shows which key ids are in use;
//! a wrong or missing key stops `serve` from starting instead of serving
//! without credentials.

use crate::support::*;

fn run(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = crate::support::tessera(dir);
    c.args(args)
        .env("TEST_SECRET", SECRET)
        .env_remove("TESSERA_MASTER_KEY")
        .env_remove("TESSERA_MASTER_KEY_NEW")
        .env_remove("TESSERA_MASTER_KEY_FILE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// `key status` rows: (id, ring, current, sealed).
fn status(dir: &std::path::Path, env: &[(&str, &str)]) -> Vec<(String, String, bool, usize)> {
    ok(&run(dir, &["key", "status"], env))
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let current = f.len() == 4 && f[2] == "yes";
            (
                f[0].to_string(),
                f[1].to_string(),
                current,
                f[f.len() - 1].parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn rotation_while_serving() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let d = p.dir.path();
    let before = status(d, &[]);
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(before[0].2 && before[0].3 == 1, "{before:?}");

    let out = ok(&run(d, &["key", "rotate"], &[]));
    assert!(out.contains("re-sealed 1 secret under key"), "{out}");
    let after = status(d, &[]);
    assert_eq!(after.len(), 2, "{after:?}");
    let (new, old) = (&after[0], &after[1]);
    assert!(
        new.2 && new.3 == 1,
        "the new key seals everything: {after:?}"
    );
    assert_eq!(
        (old.0.as_str(), old.2, old.3),
        (before[0].0.as_str(), false, 0)
    );

    // The data plane picked the re-sealed secret up and goes on serving.
    p.synced().await;
    let (s, _) = post_json(&a, tools_call(1, "x")).await;
    assert_eq!(s, 200);
    assert_eq!(
        up.seen().last().unwrap().headers["authorization"],
        format!("Bearer {SECRET}")
    );
    // A process started now reads the new key file.
    let Proxy { dir, .. } = p;
    let p = Proxy::start(dir).await;
    let id = a.url.rsplit('/').next().unwrap();
    let a2 = Agent {
        token: a.token.clone(),
        url: format!("{}/c/{id}", p.base()),
    };
    assert_eq!(post_json(&a2, tools_call(2, "x")).await.0, 200);
    assert_no_plaintext(p.dir.path(), &[SECRET]);
}

#[tokio::test]
async fn a_wrong_or_missing_key_stops_serve() {
    let dir = Proxy::dir();
    let d = dir.path();
    add_unreachable_credential(d, &[]);
    let serve = |env: &[(&str, &str)]| {
        let o = run(d, &["serve", "--listen", "127.0.0.1:0"], env);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let wrong = serve(&[("TESSERA_MASTER_KEY", &tessera_key())]);
    assert!(
        wrong.contains("credential \"gh\" does not open with the master key"),
        "{wrong}"
    );
    std::fs::rename(d.join("master.key"), d.join("master.key.bak")).unwrap();
    let missing = serve(&[]);
    assert!(missing.contains("no master key was found"), "{missing}");
    assert!(!d.join("master.key").exists(), "a new key was made up");
}

#[tokio::test]
async fn rotation_with_keys_from_the_environment() {
    let dir = Proxy::dir();
    let d = dir.path();
    let (old, new) = (tessera_key(), tessera_key());
    let env_old = [("TESSERA_MASTER_KEY", old.as_str())];
    add_unreachable_credential(d, &env_old);
    // Without a new key there is nothing to rotate to.
    let o = run(d, &["key", "rotate"], &env_old);
    assert!(String::from_utf8_lossy(&o.stderr).contains("TESSERA_MASTER_KEY_NEW"));
    ok(&run(
        d,
        &["key", "rotate"],
        &[
            ("TESSERA_MASTER_KEY", &old),
            ("TESSERA_MASTER_KEY_NEW", &new),
        ],
    ));
    let both = format!("{new},{old}");
    let s = status(d, &[("TESSERA_MASTER_KEY", &both)]);
    assert!(s[0].2 && s[0].3 == 1 && s[1].3 == 0, "{s:?}");
    // Only the old key: the secret no longer opens.
    let s = status(d, &env_old);
    assert_eq!(
        s.iter().find(|r| r.1 == "MISSING").map(|r| r.3),
        Some(1),
        "{s:?}"
    );
    assert!(!d.join("master.key").exists());
}

/// A credential "gh" whose upstream is never called.
fn add_unreachable_credential(d: &std::path::Path, env: &[(&str, &str)]) {
    let args = [
        "credential",
        "add",
        "gh",
        "--upstream",
        "http://127.0.0.1:9/mcp",
    ];
    let secret = ["--secret-env", "TEST_SECRET"];
    ok(&run(d, &[&args[..], &secret[..]].concat(), env));
}

/// A random master key, base64.
fn tessera_key() -> String {
    tessera::crypto::keyring::new_key_base64()
}

#[tokio::test]
async fn a_key_file_outside_the_data_dir_as_a_container_secret() {
    let dir = Proxy::dir();
    let d = dir.path();
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("master_key");
    std::fs::write(&file, format!("{}\n", tessera_key())).unwrap();
    let env = [("TESSERA_MASTER_KEY_FILE", file.to_str().unwrap())];
    add_unreachable_credential(d, &env);
    assert!(!d.join("master.key").exists(), "a key was made up");
    let s = status(d, &env);
    assert!(s.len() == 1 && s[0].2 && s[0].3 == 1, "{s:?}");
    // Another key in the file: the secret does not open, serve refuses.
    std::fs::write(&file, tessera_key()).unwrap();
    let o = run(d, &["serve", "--listen", "127.0.0.1:0"], &env);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not open with the master key"));
    // A file that is not there is named.
    let gone = [("TESSERA_MASTER_KEY_FILE", "/nonexistent/master_key")];
    let o = run(d, &["serve", "--listen", "127.0.0.1:0"], &gone);
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("reading TESSERA_MASTER_KEY_FILE /nonexistent/master_key"));
}

/// `key rotate` shows its progress on a terminal (a pty from script(1)),
/// and prints none of it when stderr is a pipe (scripts, CI logs).
#[test]
fn rotation_shows_progress_on_a_terminal_only() {
    let dir = Proxy::dir();
    let d = dir.path();
    register(
        d,
        "http://127.0.0.1:7470",
        "one",
        "http://127.0.0.1:9/mcp",
        "agent-1",
    );
    register(
        d,
        "http://127.0.0.1:7470",
        "two",
        "http://127.0.0.1:9/mcp",
        "agent-2",
    );
    let bin = env!("CARGO_BIN_EXE_tessera");
    let mut c = std::process::Command::new("script");
    c.args(["-qec", &format!("'{bin}' key rotate"), "/dev/null"])
        .env("TESSERA_DATA_DIR", d)
        .env_remove("TESSERA_MASTER_KEY")
        .env_remove("TESSERA_MASTER_KEY_NEW")
        .env_remove("TESSERA_MASTER_KEY_FILE");
    match database_url(d) {
        Some(url) => c.env("TESSERA_DATABASE_URL", url),
        None => c.env_remove("TESSERA_DATABASE_URL"),
    };
    let o = c.output().unwrap();
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    assert!(tty.contains("re-sealing secrets: 1/2"), "{tty:?}");
    assert!(tty.contains("re-sealing secrets: 2/2"), "{tty:?}");
    assert!(tty.contains("re-sealed 2 secrets under key"), "{tty:?}");

    let piped = run(d, &["key", "rotate"], &[]);
    assert!(ok(&piped).contains("re-sealed 2 secrets"));
    assert!(
        piped.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
}
