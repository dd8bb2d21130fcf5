//! The settings file (`--config tessera.toml`): precedence flag > env >
//! file > default, `tessera config check` showing each value's source with
//! secrets redacted, invalid settings named with a non-zero exit, and
//! `serve` running with what the file says.

use crate::support::*;

fn write(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("tessera.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The `(value, source)` `config check` printed for `key`.
fn row(out: &str, key: &str) -> (String, String) {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no {key} in\n{out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let source = fields
        .last()
        .unwrap()
        .trim_matches(|c| c == '(' || c == ')');
    let value = if fields.len() == 3 { fields[1] } else { "" };
    (value.to_string(), source.to_string())
}

#[test]
fn config_check_shows_each_value_and_where_it_came_from() {
    let dir = Proxy::dir();
    let file = write(
        dir.path(),
        "listen = \"127.0.0.1:9999\"\n\
         max_body_bytes = 1024\n\
         allow_range = true\n\
         refresh-ms = 700\n\
         upstream-timeout-ms = 800\n\
         allowed-origin = [\"http://a.example\", \"http://b.example\"]\n\
         authorizer-url = \"http://user:hunter2@authz.example/check\"\n",
    );
    let out = tessera(dir.path())
        .args([
            "--config",
            &file,
            "config",
            "check",
            "--upstream-timeout-ms",
            "900",
        ])
        .env("TESSERA_REFRESH_MS", "600")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // flag > env > file > default
    assert_eq!(
        row(&text, "upstream-timeout-ms"),
        ("900".into(), "flag".into())
    );
    assert_eq!(row(&text, "refresh-ms"), ("600".into(), "env".into()));
    assert_eq!(row(&text, "max-body-bytes"), ("1024".into(), "file".into()));
    assert_eq!(row(&text, "allow-range"), ("true".into(), "file".into()));
    assert_eq!(
        row(&text, "listen"),
        ("127.0.0.1:9999".into(), "file".into())
    );
    assert_eq!(
        row(&text, "allowed-origin"),
        ("http://a.example,http://b.example".into(), "file".into())
    );
    assert_eq!(
        row(&text, "connect-timeout-ms"),
        ("5000".into(), "default".into())
    );
    // Credentials in a URL are never printed.
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        row(&text, "authorizer-url").0.contains("***@authz.example"),
        "{text}"
    );
    assert!(text.ends_with("configuration valid\n"), "{text}");
}

#[test]
fn invalid_settings_are_named_and_exit_non_zero() {
    let dir = Proxy::dir();
    let check = |text: &str| {
        let file = write(dir.path(), text);
        let out = tessera(dir.path())
            .args(["--config", &file, "config", "check"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check("max-body-bytes = 0\n");
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--max-body-bytes must be greater than zero"),
        "{err}"
    );
    let (code, err) = check("public-url = \"ftp://x\"\n");
    assert_eq!(code, Some(1));
    assert!(err.contains("--public-url"), "{err}");
    let (code, err) = check("lisen = \"127.0.0.1:1\"\n");
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown setting \"lisen\""), "{err}");
    let (code, err) = check("listen = \"nope\"\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("'--listen <LISTEN>'") && err.contains("from the settings file (listen)"),
        "{err}"
    );
    // A master key is never taken from a file, and never echoed.
    let (code, err) = check("master_key = \"c2VjcmV0LWtleS1tYXRlcmlhbA==\"\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("TESSERA_MASTER_KEY") && !err.contains("c2Vj"),
        "{err}"
    );
    let (code, err) = check("listen = [\n");
    assert_eq!(code, Some(2));
    assert!(err.contains("tessera.toml"), "{err}");
}

#[tokio::test]
async fn serve_runs_with_the_settings_file() {
    let dir = Proxy::dir();
    let admin = format!("127.0.0.1:{}", Served::free_port());
    let file = write(
        dir.path(),
        &format!("admin-listen = \"{admin}\"\nlog-format = \"json\"\n"),
    );
    last_line(&cli(dir.path(), &["admin-token", "add", "ops"]));
    let s = Served::start(dir.path(), Served::free_port(), &["--config", &file], &[]).await;
    // The file's log format and admin listener are in force.
    let first: serde_json::Value = serde_json::from_str(s.log.lines().next().unwrap()).unwrap();
    assert_eq!(first["level"], "INFO", "{}", s.log);
    let r = client()
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
