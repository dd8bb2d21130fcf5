//! Health, readiness and metrics, for the machines that watch tessera: the
//! ops listener (`--ops-listen`, `127.0.0.1:7472` by default), which is
//! always on, needs no admin token and opens whether or not one exists.
//!
//! - `/livez`: 200 while the process runs; it touches nothing shared.
//! - `/readyz`: the database answers (one read, bounded by
//!   [`READY_DB_TIMEOUT`]) and the audit writer's last write went through,
//!   the policies are loaded, the master key seals and opens; 503 naming
//!   the failing check otherwise.
//! - `/metrics`: the Prometheus text of [`crate::telemetry::metrics`], read
//!   from memory: no database query, so it answers during a database
//!   outage, when `tessera_audit_write_failing` matters most.
//!
//! The admin listener keeps its own `/healthz`, `/readyz` and `/metrics`
//! (the last behind an admin token) for compatibility; they call the same
//! functions as this listener.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State as AxState;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use crate::crypto::keyring::{ExposeSecret, SecretString};
use crate::state::State;

/// How long readiness waits for the database's answer.
pub const READY_DB_TIMEOUT: Duration = Duration::from_secs(2);

/// The `Content-Type` of the Prometheus text exposition.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The ops listener's routes. Nothing here reads a token or a request
/// body.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/livez", axum::routing::get(livez))
        .route("/readyz", axum::routing::get(readyz))
        .route("/metrics", axum::routing::get(metrics))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "the ops listener serves /livez, /readyz and /metrics\n",
            )
        })
        .with_state(state)
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(AxState(s): AxState<Arc<State>>) -> (StatusCode, Json<Ready>) {
    let r = readiness(&s).await;
    (r.status(), Json(r))
}

async fn metrics(AxState(s): AxState<Arc<State>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        metrics_text(&s),
    )
}

/// The `/metrics` text, from memory only (the pool's gauges are the
/// pool's own counts, not a query).
pub fn metrics_text(s: &State) -> String {
    let pool = s.store.pool_stats();
    s.metrics.render_with_pool(
        &crate::telemetry::metrics::Gauges {
            audit_queue_depth: s.audit.queued(),
            audit_failing: s.audit.failing(),
            connections_open: s.connections.open(),
            connections_max: s.config.max_connections,
            body_memory_bytes: s.body_memory.used(),
            body_memory_max_bytes: s.config.max_body_memory,
        },
        Some(crate::telemetry::metrics::PoolGauges {
            open: pool.open,
            idle: pool.idle,
            max: pool.max,
        }),
    )
}

/// Readiness: each check, and whether all pass.
#[derive(Debug, Serialize, ToSchema)]
pub struct Ready {
    pub ready: bool,
    /// `ok`, or why the database cannot be read or written.
    pub database: String,
    /// `ok (N policies from ORIGIN)`.
    pub policies: String,
    /// `ok`, or why the master key cannot seal and open.
    pub master_key: String,
}

impl Ready {
    /// 200 when ready, else 503.
    pub fn status(&self) -> StatusCode {
        if self.ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// Ready to serve: the database answers a read within
/// [`READY_DB_TIMEOUT`] and takes the audit trail (a database that reads
/// but refuses writes, such as a SQLite file another process holds
/// locked, fills the audit queue and then refuses every request), the
/// policies are loaded, and the master key seals and opens.
pub async fn readiness(s: &State) -> Ready {
    let database = match tokio::time::timeout(READY_DB_TIMEOUT, s.store.revision()).await {
        Ok(Ok(_)) if s.audit.failing() => {
            "the audit writer's last write to the database failed".to_string()
        }
        Ok(Ok(_)) => "ok".to_string(),
        Ok(Err(e)) => format!("the database failed: {e}"),
        Err(_) => format!(
            "the database did not answer within {} s",
            READY_DB_TIMEOUT.as_secs()
        ),
    };
    let p = s.authorizer.policies();
    let policies_ok = !p.is_empty();
    let policies = if policies_ok {
        format!("ok ({} from {})", p.len(), p.origin)
    } else {
        "no policies loaded".to_string()
    };
    let probe = SecretString::from("readyz".to_string());
    let key = s.master_key();
    let sealed = key.seal("tessera:readyz", &probe);
    let master_key = match key.open("tessera:readyz", &sealed) {
        Ok(v) if v.expose_secret() == "readyz" => "ok".to_string(),
        _ => "the master key does not open what it seals".to_string(),
    };
    Ready {
        ready: database == "ok" && policies_ok && master_key == "ok",
        database,
        policies,
        master_key,
    }
}
