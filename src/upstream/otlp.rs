//! The OTLP exporter's HTTP client (`crate::telemetry::trace`): tessera's
//! pooled client on tessera's runtime. The SDK's exporter runs on a thread
//! of its own with no runtime; it awaits the spawned task's handle, which
//! any executor can poll.

use std::time::Duration;

use bytes::Bytes;

use crate::upstream::UpstreamClient;

/// Posts the exporter's requests.
#[derive(Debug, Clone)]
pub struct Exporting {
    client: UpstreamClient,
    runtime: tokio::runtime::Handle,
}

/// The longest an export may take; the SDK's own timeout is the
/// exporter's, and the HTTP client is to enforce it (opentelemetry-http).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A collector's answer is a small protobuf (partial success at most).
const EXPORT_ANSWER_MAX: usize = 64 * 1024;

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Exporting {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let mut request = request;
        if let Some(a) = request.uri().authority() {
            let host = http::HeaderValue::from_str(a.as_str())?;
            request.headers_mut().insert(http::header::HOST, host);
        }
        let sent = self.runtime.spawn(async move {
            tokio::time::timeout(
                EXPORT_TIMEOUT,
                client.exchange(request, "otlp", EXPORT_ANSWER_MAX),
            )
            .await
        });
        let answer = sent
            .await?
            .map_err(|_| format!("no answer within {} s", EXPORT_TIMEOUT.as_secs()))??;
        let mut resp = http::Response::new(answer.body);
        *resp.status_mut() = answer.status;
        *resp.headers_mut() = answer.headers;
        Ok(resp)
    }
}

impl Exporting {
    /// A client for a collector reached with `roots`. Must be called inside
    /// the Tokio runtime that will carry the exports.
    pub fn new(connect_timeout: Duration, roots: rustls::RootCertStore) -> Exporting {
        Exporting {
            client: crate::upstream::client_with_roots(
                connect_timeout,
                Duration::from_secs(90),
                // The collector is the operator's choice, usually beside
                // tessera: the upstream egress rule is not for it.
                crate::upstream::egress::Egress {
                    allow_private: true,
                },
                roots,
            ),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}
