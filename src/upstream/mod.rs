//! Outbound networking: the pooled client ([`pool`]) speaking HTTP/1.1
//! ([`h1`]) or HTTP/2, under the egress rule ([`egress`]).

pub mod egress;
pub mod h1;
pub mod otlp;
pub mod pool;

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;

use egress::{Egress, Resolver};
use pool::UpstreamClient;

/// Build the upstream client. TLS uses rustls with the webpki roots; HTTP/2
/// is negotiated by ALPN. Redirects are never followed, so a credential
/// never travels to another origin. `egress` says whether internal
/// addresses and plain HTTP may be reached (see [`crate::upstream::egress`]). Must be
/// called inside a Tokio runtime.
pub fn client(connect_timeout: Duration, idle_timeout: Duration, egress: Egress) -> UpstreamClient {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    client_with_roots(connect_timeout, idle_timeout, egress, roots)
}

/// [`client`] trusting `roots` instead of the webpki roots.
pub fn client_with_roots(
    connect_timeout: Duration,
    idle_timeout: Duration,
    egress: Egress,
    roots: rustls::RootCertStore,
) -> UpstreamClient {
    let mut http = HttpConnector::new_with_resolver(Resolver::new(egress));
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let tls = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    UpstreamClient::new(https, idle_timeout, egress)
}
