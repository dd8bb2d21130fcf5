//! The data-plane server: shared state, the accept loop, and graceful
//! shutdown. `run` takes a bound listener so tests run it on port 0.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{header, HeaderMap, Uri};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::audit::Audit;
use crate::config::ServeConfig;
use crate::error::ProxyError;
use crate::forward::UpstreamClient;
use crate::policy::{CedarAuthorizer, Policies};
use crate::secrets::MasterKey;
use crate::snapshot::{refresh_loop, Refresh, SharedSnapshot, Snapshot};
use crate::store::{Store, StoreError};

/// Everything the handler shares across requests.
pub struct State {
    pub config: ServeConfig,
    pub snapshot: SharedSnapshot,
    pub authorizer: Arc<CedarAuthorizer>,
    pub client: UpstreamClient,
    /// The audit trail's queue.
    pub audit: Audit,
    /// The external authorizer, when `--authorizer-url` is set.
    pub external: Option<crate::ext_authz::ExternalAuthorizer>,
    /// The store: used on the request path only for calls held for
    /// approval and for OAuth token refreshes.
    pub store: Store,
    /// The master key, to seal refreshed OAuth tokens.
    key: Arc<MasterKey>,
    /// Counters for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Failed authentication by source and by address.
    pub auth_throttle: crate::limits::AuthThrottle,
    /// The memory of request bodies being read (`--max-body-memory`).
    pub body_memory: crate::capacity::BodyMemory,
    /// Notified once at shutdown: open event streams end cleanly.
    pub draining: Arc<tokio::sync::Notify>,
    /// The public URL's host, lowercase, for the Host check.
    public_host: String,
    /// The store's policy epoch (`tessera policy reload`).
    policy_epoch: tokio::sync::watch::Receiver<i64>,
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
        let authorizer = Arc::new(CedarAuthorizer::new(policies));
        let (audit, _writer) = Audit::start(store.clone(), config.audit_queue, config.db_timeout);
        let shared: SharedSnapshot = Arc::new(ArcSwap::from_pointee(snap));
        let wake = Arc::new(tokio::sync::Notify::new());
        if let Some(url) = store.postgres_url() {
            tokio::spawn(crate::changes::listen(url.clone(), wake.clone()));
        }
        let (policy_epoch, epoch_rx) =
            tokio::sync::watch::channel(store.revision().await?.policies);
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
            },
        ));
        let public_host = config
            .public_url
            .host_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let state = State {
            client: crate::forward::client_with_roots(
                config.connect_timeout,
                config.idle_timeout,
                config.egress,
                (*config.upstream_roots).clone(),
            ),
            authorizer,
            audit,
            external: config
                .authorizer
                .clone()
                .map(|a| crate::ext_authz::ExternalAuthorizer::new(a, config.connect_timeout)),
            store,
            key,
            metrics: Arc::default(),
            auth_throttle: crate::limits::AuthThrottle::default(),
            body_memory: crate::capacity::BodyMemory::new(config.max_body_memory),
            draining: Arc::default(),
            snapshot: shared,
            public_host,
            policy_epoch: epoch_rx,
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
    pub fn oauth_context(&self) -> crate::oauth::OAuthContext<'_> {
        crate::oauth::OAuthContext {
            client: &self.client,
            store: &self.store,
            key: &self.key,
            margin: self.config.token_margin,
            timeout: self.config.token_timeout,
            db_timeout: self.config.db_timeout,
            metrics: &self.metrics,
        }
    }

    /// DNS-rebinding defence: the `Host` must be the public URL's host or
    /// a loopback name, and an `Origin` (absent is fine: non-browser
    /// clients send none) must be tessera's own (`http(s)://` + that
    /// `Host`: same-origin) or in the allow-list. A rebound page has the
    /// attacker's name in both, so it fails the `Host` check; any other
    /// page has a foreign `Origin`.
    pub fn check_origin_and_host(&self, h: &HeaderMap, uri: &Uri) -> Result<(), ProxyError> {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| uri.authority().map(|a| a.as_str()));
        if let Some(origin) = h.get(header::ORIGIN) {
            let ok = origin.to_str().is_ok_and(|o| {
                let o = o.trim_end_matches('/');
                host.is_some_and(|host| same_origin(o, host))
                    || self
                        .config
                        .allowed_origins
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(o))
            });
            if !ok {
                return Err(ProxyError::ForbiddenOrigin);
            }
        }
        if self.is_own_host(host_name(host.ok_or(ProxyError::ForbiddenHost)?)) {
            Ok(())
        } else {
            Err(ProxyError::ForbiddenHost)
        }
    }

    /// Whether a host name (no port) names tessera: its public host or a
    /// loopback name.
    pub fn is_own_host(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case(&self.public_host) || is_loopback_name(name)
    }
}

/// `origin` is `http://HOST` or `https://HOST` for this request's `Host`.
fn same_origin(origin: &str, host: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        let (s, rest) = (origin.get(..scheme.len()), origin.get(scheme.len()..));
        s.is_some_and(|s| s.eq_ignore_ascii_case(scheme))
            && rest.is_some_and(|h| h.eq_ignore_ascii_case(host))
    })
}

/// The host part of a `Host` value (`[::1]:80` → `[::1]`, `a:1` → `a`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        host.find(']').map_or(host, |i| &host[..=i])
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    }
}

/// `localhost`, `*.localhost`, 127.0.0.0/8 and `[::1]`.
fn is_loopback_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    let ip = lower.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Serve the data plane on `listener` until `shutdown` resolves, then stop
/// accepting, end open event streams cleanly (a client reconnects, to
/// another replica if there is one), and give requests in flight `grace`
/// to finish; what is left then is cut.
pub async fn run(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // HTTP/1.1 only: MCP clients reach a plain-HTTP listener with HTTP/1.1
    // (HTTP/2 comes by TLS ALPN, which a loopback sidecar does not serve).
    // hyper-util's auto-detecting builder would read the first bytes apart,
    // which costs every connection an extra 8 KiB read buffer.
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The slow-headers defence: a head not complete in time closes the
    // connection, and `raw_head::Watched` answers it 408. The header count is checked
    // against --max-headers in the handler, which answers 431 with a
    // JSON-RPC body; hyper's own cap (a bare 431) sits above it.
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(state.config.limits.header_timeout)
        .max_headers(state.config.limits.max_headers.saturating_mul(2).max(100));
    let head_answers = crate::raw_head::HeadAnswers::new(
        state.config.limits.header_timeout,
        state.metrics.clone(),
    );
    // The connection caps (see `crate::capacity`): idle connections make
    // room for new ones; busy ones are never cut.
    let connections = crate::capacity::Connections::new(
        state.config.max_connections,
        state.config.max_connections_per_source,
    );
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving
                    // the open connections and try again shortly.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Over its source's cap with none of the source's connections idle:
        // answered 503 and closed. At the total cap with none idle, this
        // waits for a connection to end, accepting nothing meanwhile.
        let place = tokio::select! {
            admitted = connections.admit(peer.ip()) => match admitted {
                Ok(place) => place,
                Err(crate::capacity::OverSource) => {
                    head_answers.refuse(&stream);
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let slot = place.slot().clone();
        let svc = service_fn(move |req| {
            // The connection is busy (never evicted) from the head's
            // arrival until the response body is dropped.
            let busy = slot.busy();
            // Boxed per request: hyper keeps the slot for the service's
            // future allocated for the connection's whole life, so an
            // unboxed handler would cost every idle open stream its size.
            let handled = Box::pin(crate::proxy::handle(state.clone(), req, peer.ip()));
            async move {
                let resp = handled.await;
                Ok::<_, std::convert::Infallible>(
                    resp.map(|b| crate::capacity::WhileBusy::new(b, busy)),
                )
            }
        });
        let io = crate::raw_head::Watched::new(stream, head_answers.clone(), place.slot().clone());
        let conn = builder.serve_connection(TokioIo::new(io), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
                () = place.evicted() => {
                    tracing::debug!("an idle connection closed to make room for another");
                }
            }
            drop(place);
        });
    }
    drop(listener);
    state.draining.notify_waiters();
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("grace period over; closing the remaining connections");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("a.example:80"), "a.example");
        assert_eq!(host_name("[::1]:7470"), "[::1]");
        assert_eq!(host_name("localhost"), "localhost");
        for ok in [
            "localhost",
            "LOCALHOST",
            "x.localhost",
            "127.0.0.1",
            "127.9.9.9",
            "[::1]",
        ] {
            assert!(is_loopback_name(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "[::2]",
            "localhost.evil",
        ] {
            assert!(!is_loopback_name(bad), "{bad}");
        }
    }

    #[test]
    fn same_origin_is_the_scheme_and_the_host_exactly() {
        for (origin, host) in [
            ("http://localhost:7470", "localhost:7470"),
            ("HTTP://LocalHost:7470", "localhost:7470"),
            ("https://127.0.0.1:7470", "127.0.0.1:7470"),
        ] {
            assert!(same_origin(origin, host), "{origin} {host}");
        }
        for (origin, host) in [
            ("http://localhost:3000", "localhost:7470"),
            ("http://localhost", "localhost:7470"),
            ("http://localhost:7470.evil", "localhost:7470"),
            ("ftp://localhost:7470", "localhost:7470"),
            ("localhost:7470", "localhost:7470"),
            ("null", "localhost:7470"),
            ("", ""),
        ] {
            assert!(!same_origin(origin, host), "{origin} {host}");
        }
    }
}
