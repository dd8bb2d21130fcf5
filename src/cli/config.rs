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
    // Settings left unset whose value serve derives (from --listen, the
    // open-file limit, the body size) show that value.
    let mut thresholds = None;
    if let Ok(c) = tessera::config::parse_serve(raw_serve(a)) {
        thresholds = c.predict.costs.thresholds().ok();
        let derived = [
            ("listen", c.listen.to_string()),
            ("public-url", c.public_url.to_string()),
            ("max-connections", c.max_connections.to_string()),
            (
                "max-connections-per-source",
                c.max_connections_per_source.to_string(),
            ),
            ("max-body-memory", c.max_body_memory.to_string()),
        ];
        for (key, value) in derived {
            if let Some(row) = rows.iter_mut().find(|r| r.0 == key) {
                if row.2 == "unset" {
                    (row.1, row.2) = (value, "derived");
                } else if row.1 != value {
                    row.1 = format!("{} (= {value})", row.1);
                }
            }
        }
    }
    let mut errors = Vec::new();
    if let Some(url) = &cli.database_url {
        if let Err(e) = url.parse::<tessera::store::DatabaseUrl>() {
            errors.push(format!("--database-url: {e}"));
        }
    }
    if let Err(e) = tessera::config::parse_serve(raw_serve(a)) {
        errors.push(e.to_string());
    }
    let traces = tessera::telemetry::trace::TraceSettings {
        endpoint: a.otlp_endpoint.clone(),
    };
    match traces.validate() {
        Err(e) => errors.push(e.to_string()),
        // Where spans go, which OTEL_EXPORTER_OTLP_TRACES_ENDPOINT may set.
        Ok(Some(url)) => rows.push((
            "traces-url".into(),
            tessera::wire::query::shown_str(&url),
            "derived",
        )),
        Ok(None) => {}
    }
    if let Err(e) = load_policies(a.policies.as_deref()) {
        errors.push(format!("--policies: {e:#}"));
    }
    if cli.json {
        let settings: Vec<_> = rows
            .iter()
            .map(|(key, value, source)| serde_json::json!({"key": key, "value": value, "source": source}))
            .collect();
        let valid = errors.is_empty();
        out!(
            "{}",
            serde_json::json!({"settings": settings, "valid": valid, "errors": errors,
                "prediction_thresholds": thresholds})
        );
        return valid;
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (key, value, source) in &rows {
        out!("{key:<width$}  {value:<40}  ({source})");
    }
    // What the three costs mean for approvals that learn (@ask("learn")).
    if let Some(t) = thresholds {
        out!(
            "{:<width$}  {:<40}  (derived from the costs)",
            "prediction",
            format!(
                "allow above p = {}, deny below p = {}",
                tessera::authz::predict::model::prob(t.allow),
                tessera::authz::predict::model::prob(t.deny)
            )
        );
    }
    for e in &errors {
        eprintln!("tessera: invalid configuration: {e}");
    }
    if errors.is_empty() {
        out!("configuration valid");
    }
    errors.is_empty()
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
    tessera::wire::query::shown_str(value)
}
