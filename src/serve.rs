//! The `serve` process, assembled in one place: the shared state (which
//! starts the snapshot refresh and the audit writer), the policy reload,
//! memory release, the ops and admin listeners, the data plane, and the
//! drain at shutdown. `tessera serve` calls [`run`], and so does the integration
//! suite: the tests exercise the wiring that ships.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::authz::cedar::Policies;
use crate::config::ServeConfig;
use crate::crypto::keyring::MasterKey;
use crate::state::State;
use crate::store::{Store, StoreError};

/// Everything `serve` runs with, validated and opened.
pub struct Process {
    pub config: ServeConfig,
    pub store: Store,
    pub key: MasterKey,
    pub policies: Policies,
    /// The policy folder to watch (`None`: the built-in set, nothing to
    /// reload).
    pub policy_dir: Option<PathBuf>,
    /// How often the policy folder is checked for changes.
    pub policy_check: Duration,
    /// The admin API's address; it opens only when an admin token exists.
    /// `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// The ops listener (`/livez`, `/readyz`, `/metrics`), bound by the
    /// caller as the data plane's is; it serves whether or not an admin
    /// token exists. `None`: turned off.
    pub ops_listener: Option<TcpListener>,
    /// How long requests in flight (and the audit trail) get at shutdown.
    pub shutdown_grace: Duration,
    /// Returns free memory to the system after a wave of streams closes
    /// (the binary's `malloc_trim`; the library has no unsafe code).
    pub release_free_memory: Option<fn()>,
    /// The log filter, to change while serving (`PUT /v1/log-level`);
    /// `None` where the process's subscriber is not tessera's own.
    pub log_filter: Option<Arc<crate::telemetry::log::LogFilter>>,
    /// Where traces go (`--otlp-endpoint`); off when it names nothing.
    pub traces: crate::telemetry::trace::TraceSettings,
}

/// Why `serve` could not start or did not end cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Trace(#[from] crate::telemetry::trace::TraceError),
    // The OS error is in the message, not the error's source: the binary
    // prints the chain, which would say it twice.
    #[error("binding {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("installing the SIGHUP handler: {0}")]
    Signal(std::io::Error),
    #[error("the audit trail could not be written within {ms} ms ({queued} records still queued): the database did not take them")]
    AuditUnwritten { ms: u128, queued: usize },
}

/// Serve on `listener` until `shutdown` resolves, then drain. `started`
/// is given the shared state once the first snapshot is loaded and every
/// task runs, before the first connection is accepted.
pub async fn run(
    p: Process,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    started: impl FnOnce(&Arc<State>),
) -> Result<(), ServeError> {
    tracing::info!(policies = %p.policies.origin, count = p.policies.len(), "policies loaded");
    let (state, _refresher) = State::start(p.config, p.store, p.key, p.policies).await?;
    let traces = crate::telemetry::trace::start(
        &p.traces,
        crate::upstream::otlp::Exporting::new(
            state.config.connect_timeout,
            (*state.config.upstream_roots).clone(),
        ),
    )?;
    if let Some(url) = traces.as_ref().and(p.traces.traces_url()) {
        tracing::info!(otlp = %crate::wire::query::shown_str(&url), "exporting traces");
    }
    reload_policies_on_change(&state, p.policy_dir, p.policy_check)?;
    if let Some(f) = p.log_filter {
        let _ = state.log_filter.set(f);
    }
    if let Some(release) = p.release_free_memory {
        tokio::spawn(crate::telemetry::memory::release_after_waves(
            state.metrics.clone(),
            Duration::from_secs(1),
            release,
        ));
    }
    let (stop_admin, admin_stopped) = tokio::sync::watch::channel(());
    // The ops listener first: probes and scrapes answer whatever the
    // admin listener does (it may stay closed for want of a token).
    match p.ops_listener {
        Some(l) => serve_ops(&state, l, admin_stopped.clone()),
        None => tracing::info!("ops listener off (--ops-listen off)"),
    }
    if let Some(addr) = p.admin_listen {
        serve_admin(&state, addr, admin_stopped).await?;
    }
    let cfg = &state.config;
    let t = state.prediction.thresholds();
    tracing::info!(
        listen = %listener.local_addr().map_or_else(|_| cfg.listen.to_string(), |a| a.to_string()),
        public_url = %cfg.public_url,
        max_connections = cfg.max_connections,
        max_connections_per_source = cfg.max_connections_per_source,
        predict_allow_above = t.allow,
        predict_deny_below = t.deny,
        predictor = if state.prediction.external() { "--predictor-url" } else { "built-in" },
        pin_tools = cfg.pin_tools.name(),
        "tessera serving"
    );
    // Costs that allow a call a person more likely denies than approves
    // are the operator's to choose, but seldom meant (found by a new user
    // who swapped the two costs).
    if t.allow < 0.5 {
        tracing::warn!(
            allow_above = t.allow,
            "approvals that learn allow calls a person would more likely deny than approve: --cost-wrong-allow is low for --cost-wrong-deny and --cost-ask"
        );
    }
    // What admin commands print connection URLs on when not told: this
    // process's public URL (the bound port when it listens on port 0).
    let served = match (cfg.public_url.port(), listener.local_addr()) {
        (Some(0), Ok(a)) => crate::config::default_public_url(a),
        _ => cfg.public_url.clone(),
    };
    if let Err(e) = state.store.record_served_url(served.as_str()).await {
        tracing::warn!(error = %e, "recording the public URL for admin commands failed");
    }
    started(&state);
    crate::proxy::listener::run(listener, state.clone(), shutdown, p.shutdown_grace).await;
    drop(stop_admin);
    // Every decision made is on disk before the process ends; a database
    // that does not take them within the grace period is an error exit.
    if !state.audit.flush(p.shutdown_grace).await {
        return Err(ServeError::AuditUnwritten {
            ms: p.shutdown_grace.as_millis(),
            queued: state.audit.queued(),
        });
    }
    if let Some(t) = traces {
        t.shutdown(p.shutdown_grace).await;
    }
    Ok(())
}

/// Bind the data plane's address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Bind {
            addr: addr.to_string(),
            error,
        })
}

/// Resolves at the first SIGTERM or Ctrl-C; a second one while draining
/// exits the process at once.
pub async fn until_signal() {
    shutdown_signal().await;
    tokio::spawn(async {
        shutdown_signal().await;
        tracing::warn!("second signal: exiting without waiting for requests in flight");
        std::process::exit(1);
    });
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

/// Bind the ops listener's address (`--ops-listen`).
pub async fn bind_ops(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Bind {
            addr: format!("the ops listener {addr} (--ops-listen; off turns it off)"),
            error,
        })
}

/// Health, readiness and metrics on their own listener, until `stop`
/// (after the data plane has drained, so `/livez` answers while it does).
fn serve_ops(
    state: &Arc<State>,
    listener: TcpListener,
    mut stop: tokio::sync::watch::Receiver<()>,
) {
    if let Ok(a) = listener.local_addr() {
        tracing::info!(ops_listen = %a, "ops listener serving /livez /readyz /metrics");
    }
    let app = crate::admin::ops::router(state.clone());
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.changed().await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the ops listener failed");
        }
    });
}

/// The admin API, when at least one admin token exists.
async fn serve_admin(
    state: &Arc<State>,
    addr: SocketAddr,
    mut stop: tokio::sync::watch::Receiver<()>,
) -> Result<(), ServeError> {
    let tokens = state.store.admin_tokens().await?;
    if tokens.iter().all(|t| t.revoked_at.is_some()) {
        tracing::info!(
            "admin listener off: no admin token (tessera admin-token add NAME, then restart)"
        );
        return Ok(());
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|error| ServeError::Bind {
            addr: format!("the admin listener {addr}"),
            error,
        })?;
    if let Ok(a) = listener.local_addr() {
        tracing::info!(admin_listen = %a, "admin API serving");
        state.approvals.console_at(a);
    }
    let app = crate::admin::api::router(state.clone());
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.changed().await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the admin listener failed");
        }
    });
    Ok(())
}

/// Reload the policy folder when its files change, on SIGHUP, and when
/// `tessera policy reload` asks. With the built-in set there is nothing to
/// reload, but SIGHUP is still caught so it does not end the process.
fn reload_policies_on_change(
    state: &State,
    dir: Option<PathBuf>,
    check: Duration,
) -> Result<(), ServeError> {
    #[cfg(unix)]
    let hup = {
        let sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(ServeError::Signal)?;
        Box::pin(futures_util::stream::unfold(sig, |mut s| async move {
            s.recv().await.map(|()| ((), s))
        }))
    };
    #[cfg(not(unix))]
    let hup = futures_util::stream::pending::<()>();
    // `tessera policy reload`, from any host, pokes like SIGHUP.
    let hup = futures_util::stream::select(hup, state.policy_reloads());
    match dir {
        Some(dir) => {
            tokio::spawn(crate::authz::cedar::watch_dir(
                state.authorizer.clone(),
                dir,
                check.max(Duration::from_millis(1)),
                hup,
            ));
        }
        None => {
            tokio::spawn(async move {
                use futures_util::StreamExt;
                let mut hup = hup;
                while hup.next().await.is_some() {
                    tracing::info!(
                        "asked to reload: the built-in policies are in force; nothing to reload"
                    );
                }
            });
        }
    }
    Ok(())
}
