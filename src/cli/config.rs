//! `tessera config check`: the effective settings and where each came from.

use clap::{CommandFactory, Subcommand};

use super::*;

#[derive(Subcommand)]
pub(crate) enum ConfigCmd {
    /// Print the effective settings (flag > env > --config file > default)
    /// with where each came from, secrets redacted, and validate them as
    /// `serve` does at start; exits non-zero naming an invalid setting.
    Check(Box<ServeArgs>),
}

/// `tessera config check`: print every setting `serve` would use, where it
/// came from, secrets redacted; then validate as `serve` does at start.
pub(crate) fn config_check(
    cli: &Cli,
    a: &ServeArgs,
    root: &clap::ArgMatches,
    from_file: &[String],
) -> bool {
    let check = root
        .subcommand_matches("config")
        .and_then(|c| c.subcommand_matches("check"))
        .expect("config check was parsed");
    let source = |m: &clap::ArgMatches, id: &str, key: &str| match m.value_source(id) {
        Some(clap::parser::ValueSource::CommandLine) => "flag",
        Some(clap::parser::ValueSource::EnvVariable) => "env",
        Some(clap::parser::ValueSource::DefaultValue) if from_file.iter().any(|k| k == key) => {
            "file"
        }
        Some(_) => "default",
        None => "unset",
    };
    let mut rows = Vec::new();
    let mut push = |m: &clap::ArgMatches, cmd: &clap::Command| {
        for (key, id) in settings(cmd) {
            let values: Vec<String> = m
                .get_raw(&id)
                .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let shown = values
                .iter()
                .map(|v| redact_setting(&key, v))
                .collect::<Vec<_>>()
                .join(",");
            rows.push((key.clone(), shown, source(m, &id, &key)));
        }
    };
    let cmd = Cli::command();
    push(root, &cmd);
    if let Some(serve) = cmd.find_subcommand("serve") {
        push(check, serve);
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (key, value, source) in &rows {
        println!("{key:<width$}  {value:<40}  ({source})");
    }
    let mut ok = true;
    let mut fail = |e: String| {
        eprintln!("tessera: invalid configuration: {e}");
        ok = false;
    };
    if let Some(url) = &cli.database_url {
        if let Err(e) = url.parse::<tessera::store::DatabaseUrl>() {
            fail(format!("--database-url: {e}"));
        }
    }
    if let Err(e) = tessera::config::parse_serve(raw_serve(a)) {
        fail(e.to_string());
    }
    if let Err(e) = load_policies(a.policies.as_deref()) {
        fail(format!("--policies: {e:#}"));
    }
    if ok {
        println!("configuration valid");
    }
    ok
}

/// A setting's value as `config check` shows it: a database password or
/// URL credentials become `***`.
pub(crate) fn redact_setting(key: &str, value: &str) -> String {
    if key == "database-url" {
        return match value.parse::<tessera::store::DatabaseUrl>() {
            Ok(u) => u.to_string(),
            Err(_) => "(unreadable; not shown)".to_string(),
        };
    }
    // A webhook URL's path and query are often its secret (Slack's are).
    if key == "approval-webhook" {
        return match url::Url::parse(value) {
            Ok(u) => format!("{}://{}/***", u.scheme(), u.host_str().unwrap_or_default()),
            Err(_) => "(unreadable; not shown)".to_string(),
        };
    }
    match url::Url::parse(value) {
        Ok(mut u) if u.password().is_some() || !u.username().is_empty() => {
            let _ = u.set_username("***");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => value.to_string(),
    }
}
