//! `tessera serve`: its settings, the log, and [`tessera::serve::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tessera::config::RawServe;

use super::*;

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// The settings the data plane is validated from (`tessera::config`).
    #[command(flatten)]
    pub(crate) settings: RawServe,
    /// The admin API, health and metrics listener. It opens only when at
    /// least one admin token exists (tessera admin-token add NAME).
    #[arg(long, env = "TESSERA_ADMIN_LISTEN", default_value = tessera::config::DEFAULT_ADMIN_LISTEN, value_parser = tessera::config::parse_listen)]
    pub(crate) admin_listen: SocketAddr,
    /// Health, readiness and metrics for probes and scrapers (/livez,
    /// /readyz, /metrics; no token): IP:PORT, localhost:PORT, or off.
    /// Always open, admin token or not.
    #[arg(long, env = "TESSERA_OPS_LISTEN", default_value = tessera::config::DEFAULT_OPS_LISTEN, value_parser = tessera::config::parse_optional_listen)]
    pub(crate) ops_listen: tessera::config::OptionalListen,
    /// On SIGTERM (or Ctrl-C): how long requests in flight may take to
    /// finish, after event streams were ended and new connections refused.
    /// A second signal exits at once.
    #[arg(long, env = "TESSERA_SHUTDOWN_GRACE_MS", default_value_t = tessera::config::DEFAULT_SHUTDOWN_GRACE_MS)]
    pub(crate) shutdown_grace_ms: u64,
    /// The policy folder (default: ./policies when present, else the
    /// built-in policy: a caller may use its own connections).
    #[arg(long, env = "TESSERA_POLICIES")]
    pub(crate) policies: Option<PathBuf>,
    /// How often the policy folder is checked for changes (SIGHUP reloads
    /// at once).
    #[arg(long, env = "TESSERA_POLICY_CHECK_MS", default_value_t = tessera::config::DEFAULT_POLICY_CHECK_MS)]
    pub(crate) policy_check_ms: u64,
    /// Runtime worker threads (default: one per CPU core). A sidecar
    /// pinned to one core runs best with 1.
    #[arg(long, env = "TESSERA_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) worker_threads: Option<u16>,
    /// The most database connections serve's pool opens (default: 8 on
    /// Postgres, 4 on SQLite). They serve the audit writer, approvals,
    /// OAuth refreshes and snapshot reloads.
    #[arg(long, env = "TESSERA_DB_POOL_SIZE", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) db_pool_size: Option<u32>,
    /// Export traces (OpenTelemetry, OTLP over HTTP/protobuf) to this
    /// collector base URL; `/v1/traces` is appended. Off when unset.
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, when set, is used as it is.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub(crate) otlp_endpoint: Option<String>,
    /// The log's lines: logfmt text, or one JSON object each.
    #[arg(long, env = "TESSERA_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub(crate) log_format: String,
}

pub(crate) async fn serve(at: &Place, a: ServeArgs) -> Result<()> {
    use tessera::telemetry::log;
    // Every line goes through a thread of its own (tracing-appender,
    // lossless: a full channel makes the logging thread wait rather than
    // drop a line), so no worker thread of the runtime writes to stderr.
    // The buffer in front batches access lines (64 KiB or 1 s); warnings
    // and errors are handed on at once.
    let (stderr, writer_guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("tessera-log")
        .finish(std::io::stderr());
    let buffered = log::Buffered::with_flush_thread(Box::new(stderr));
    let initial = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| log::Filter::parse(&v).ok())
        .unwrap_or_else(|| log::Filter::parse("info").expect("info is a filter"));
    let format = match a.log_format.as_str() {
        "json" => log::Format::Json,
        _ => log::Format::Logfmt,
    };
    let filter = std::sync::Arc::new(log::init(initial, format, buffered.clone()));
    // Whatever ends serving, the buffered lines are written out first,
    // then the writer's thread writes everything handed to it (dropping
    // the guard waits for it).
    let served = serve_logged(at, a, &buffered, filter).await;
    buffered.flush();
    drop(writer_guard);
    served
}

pub(crate) async fn serve_logged(
    at: &Place,
    a: ServeArgs,
    log: &tessera::telemetry::log::Buffered,
    log_filter: std::sync::Arc<tessera::telemetry::log::LogFilter>,
) -> Result<()> {
    // Validate everything before binding a port.
    let config = tessera::config::parse_serve(raw_serve(&a))?;
    let policies = load_policies(a.policies.as_deref()).context("not serving")?;
    let store = at.store_with_pool(a.db_pool_size).await?;
    let key = existing_master_key(&at.data_dir, &store)
        .await
        .context("not serving")?;
    let listener = tessera::serve::bind(config.listen).await?;
    let ops_listener = match a.ops_listen.0 {
        Some(addr) => Some(tessera::serve::bind_ops(addr).await?),
        None => None,
    };
    let process = tessera::serve::Process {
        config,
        store,
        key,
        policies,
        policy_dir: policy_dir(a.policies.as_deref()),
        policy_check: Duration::from_millis(a.policy_check_ms),
        admin_listen: Some(a.admin_listen),
        ops_listener,
        shutdown_grace: Duration::from_millis(a.shutdown_grace_ms),
        release_free_memory: crate::release_free_memory(),
        log_filter: Some(log_filter),
        traces: tessera::telemetry::trace::TraceSettings {
            endpoint: a.otlp_endpoint.clone(),
        },
    };
    // Start-up lines are shown at once, not a second later.
    let started = |_: &_| log.flush();
    tessera::serve::run(process, listener, tessera::serve::until_signal(), started).await?;
    Ok(())
}

/// The serve settings as given, with what `serve` reads of the process.
pub(crate) fn raw_serve(a: &ServeArgs) -> RawServe {
    RawServe {
        open_files: tessera::limits::capacity::open_files_limit(),
        ..a.settings.clone()
    }
}
