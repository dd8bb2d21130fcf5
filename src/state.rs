//! The data plane's shared state: the settings, the snapshot, the
//! authorizer, the upstream client, the audit queue and the counters every
//! request reads. Started once by `serve`; the admin API reads it too.
//! (The Host and Origin check on it is the data plane's: `proxy::origin`.)

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use crate::audit::Audit;
use crate::authz::cedar::{CedarAuthorizer, Policies};
use crate::config::ServeConfig;
use crate::crypto::keyring::MasterKey;
use crate::snapshot::{refresh_loop, Refresh, SharedSnapshot, Snapshot};
use crate::store::{Store, StoreError};
use crate::upstream::pool::UpstreamClient;

/// Everything the handler shares across requests.
pub struct State {
    pub config: ServeConfig,
    pub snapshot: SharedSnapshot,
    pub authorizer: Arc<CedarAuthorizer>,
    pub client: UpstreamClient,
    /// The audit trail's queue.
    pub audit: Audit,
    /// The external authorizer, when `--authorizer-url` is set.
    pub external: Option<crate::authz::external::ExternalAuthorizer>,
    /// The store: used on the request path only for calls held for
    /// approval and for OAuth token refreshes.
    pub store: Store,
    /// The master key, to seal refreshed OAuth tokens.
    key: Arc<MasterKey>,
    /// Counters for `/metrics`.
    pub metrics: Arc<crate::telemetry::metrics::Metrics>,
    /// Failed authentication by source and by address.
    pub auth_throttle: crate::limits::AuthThrottle,
    /// The memory of request bodies being read (`--max-body-memory`).
    pub body_memory: crate::limits::capacity::BodyMemory,
    /// The data plane's connection caps (see `crate::limits::capacity`).
    pub connections: Arc<crate::limits::capacity::Connections>,
    /// Notified once at shutdown: open event streams end cleanly.
    pub draining: Arc<tokio::sync::Notify>,
    /// The public URL's host, lowercase, for the Host check.
    pub(crate) public_host: String,
    /// The store's policy epoch (`tessera policy reload`).
    policy_epoch: tokio::sync::watch::Receiver<i64>,
    /// Held calls waiting for a decision, and the approval webhook.
    pub approvals: crate::authz::approvals::Hub,
    /// Tool pinning's queue of answers to record and the digests seen
    /// held (`crate::authz::pins`).
    pub pins: Arc<crate::authz::pins::PinBook>,
    /// Predictions for calls an `@ask("learn")` permit holds.
    pub prediction: Arc<crate::authz::predict::Predictor>,
    /// The process's log filter, when it can change while running (set
    /// once by `serve`; `PUT /v1/log-level`).
    pub log_filter: std::sync::OnceLock<Arc<crate::telemetry::log::LogFilter>>,
}

impl State {
    /// Load the first snapshot and start the task that keeps it fresh.
    pub async fn start(
        config: ServeConfig,
        store: Store,
        key: MasterKey,
        policies: Policies,
    ) -> Result<(Arc<State>, JoinHandle<()>), StoreError> {
        let key = Arc::new(key);
        let snap = Snapshot::load(&store, &key, policies.schema()).await?;
        let snap_revision = snap.revision;
        let authorizer = Arc::new(CedarAuthorizer::new(policies));
        let metrics: Arc<crate::telemetry::metrics::Metrics> = Arc::default();
        let (audit, _writer) = Audit::start(
            store.audit_sink()?,
            config.audit_queue,
            config.db_timeout,
            metrics.clone(),
        );
        let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(snap));
        let wake = Arc::new(tokio::sync::Notify::new());
        if let Some(url) = store.postgres_url() {
            tokio::spawn(crate::snapshot::pg_notify::listen(
                url.clone(),
                wake.clone(),
            ));
        }
        let (policy_epoch, epoch_rx) =
            tokio::sync::watch::channel(store.revision().await?.policies);
        let (swapped, changes) = tokio::sync::watch::channel(snap_revision);
        let refresher = tokio::spawn(refresh_loop(
            store.clone(),
            key.clone(),
            authorizer.clone(),
            shared.clone(),
            Refresh {
                interval: config.refresh_interval,
                wake,
                policy_epoch,
                db_timeout: config.db_timeout,
                swapped,
            },
        ));
        let public_host = config
            .public_url
            .host_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let client = crate::upstream::client_with_roots(
            config.connect_timeout,
            config.idle_timeout,
            config.egress,
            (*config.upstream_roots).clone(),
        );
        let approvals =
            crate::authz::approvals::Hub::start(changes, config.approval_webhook.clone(), &client);
        let prediction = Arc::new(crate::authz::predict::Predictor::new(
            config.predict.clone(),
            store.clone(),
            config.connect_timeout,
            (*config.upstream_roots).clone(),
        ));
        let pins = crate::authz::pins::PinBook::start(
            config.pin_tools,
            store.clone(),
            metrics.clone(),
            config.db_timeout,
        );
        let state = State {
            pins,
            prediction,
            client,
            approvals,
            authorizer,
            audit,
            external: config.authorizer.clone().map(|a| {
                crate::authz::external::ExternalAuthorizer::new(
                    a,
                    config.connect_timeout,
                    (*config.upstream_roots).clone(),
                )
            }),
            store,
            key,
            metrics,
            auth_throttle: crate::limits::AuthThrottle::default(),
            body_memory: crate::limits::capacity::BodyMemory::new(config.max_body_memory),
            connections: crate::limits::capacity::Connections::new(
                config.max_connections,
                config.max_connections_per_source,
            ),
            draining: Arc::default(),
            snapshot: shared,
            public_host,
            policy_epoch: epoch_rx,
            log_filter: std::sync::OnceLock::new(),
            config,
        };
        Ok((Arc::new(state), refresher))
    }

    /// Yields each time `tessera policy reload` asks every serving process
    /// to read its policy folder again.
    pub fn policy_reloads(&self) -> impl futures_util::Stream<Item = ()> + Unpin + Send {
        let mut rx = self.policy_epoch.clone();
        rx.mark_unchanged();
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok().map(|()| ((), rx))
        }))
    }

    /// The master key ring, for admin actions that seal a secret.
    pub fn master_key(&self) -> &MasterKey {
        &self.key
    }

    /// What an OAuth token refresh needs.
    pub fn oauth_context(&self) -> crate::credentials::oauth::OAuthContext<'_> {
        crate::credentials::oauth::OAuthContext {
            client: &self.client,
            store: &self.store,
            key: &self.key,
            margin: self.config.token_margin,
            timeout: self.config.token_timeout,
            db_timeout: self.config.db_timeout,
            metrics: &self.metrics,
        }
    }
}
