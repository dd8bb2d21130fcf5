//! Traces: OpenTelemetry spans exported over OTLP/HTTP (protobuf), off
//! unless an endpoint is set.
//!
//! One span per data-plane request (a server span, continuing the caller's
//! W3C trace context), with children for authorization, the external
//! authorizer, prediction, a person's approval, the upstream exchange (a
//! client span whose context the upstream receives in `traceparent`) and
//! OAuth refreshes. Spans carry names, verdicts and statuses, never a
//! token, a secret or a tool's arguments.
//!
//! Off, the request path pays one atomic load per span site ([`tracer`]
//! reads a `OnceLock`): no `Context`, no allocation, no clock read.
//!
//! The tracer is process-wide, like the log: a span site deep in the OAuth
//! code needs no handle passed down to it, and the parent of a span is the
//! `Context` the enclosing future carries
//! ([`opentelemetry::context::FutureExt::with_context`]).
//!
//! Export: the SDK's batch processor runs on a thread of its own, without a
//! Tokio runtime; [`start`] takes the HTTP client it posts with (serve
//! gives it `crate::upstream::otlp`'s, tessera's own pooled client on
//! tessera's runtime), so there is no second HTTP stack (reqwest) and no
//! gRPC stack (tonic) in the binary.

use std::sync::OnceLock;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::telemetry::traceparent::{RequestId, TraceParent};

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The process's tracer, when traces are on.
#[inline]
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// Why traces could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(String),
    #[error("{var}={value:?}: tessera exports OTLP over HTTP with protobuf only (http/protobuf)")]
    Protocol { var: &'static str, value: String },
    // Not quoted: a URL that does not parse cannot be shown with its
    // credentials kept back (`wire::query` is a peer this layer may not use).
    #[error("the OTLP traces endpoint is not an http:// or https:// URL with a host (--otlp-endpoint: a collector's base URL such as http://127.0.0.1:4318)")]
    Endpoint,
    #[error("traces were already started in this process")]
    AlreadyStarted,
}

/// Where traces go: `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`),
/// the base URL to which `/v1/traces` is appended, as the OpenTelemetry
/// specification has it. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, when set,
/// is used as it is and wins, as it does everywhere else.
#[derive(Debug, Clone, Default)]
pub struct TraceSettings {
    pub endpoint: Option<String>,
}

impl TraceSettings {
    /// Whether traces are on: an endpoint is set and the SDK is not
    /// disabled (`OTEL_SDK_DISABLED=true`).
    pub fn enabled(&self) -> bool {
        let set = |v: &str| std::env::var(v).is_ok_and(|v| !v.trim().is_empty());
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        !disabled
            && (self
                .endpoint
                .as_deref()
                .is_some_and(|e| !e.trim().is_empty())
                || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> Option<String> {
        if let Ok(v) = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            if !v.trim().is_empty() {
                return Some(v.trim().to_string());
            }
        }
        let base = self.endpoint.as_deref()?.trim();
        (!base.is_empty()).then(|| format!("{}/v1/traces", base.trim_end_matches('/')))
    }
}

impl TraceSettings {
    /// The URL spans go to when traces are on, checked as [`start`] would
    /// (`config check` shows it): an `http` or `https` URL with a host, and
    /// no protocol but HTTP/protobuf asked for.
    pub fn validate(&self) -> Result<Option<String>, TraceError> {
        if !self.enabled() {
            return Ok(None);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(v) = std::env::var(var) {
                if v.trim() != "http/protobuf" && !v.trim().is_empty() {
                    return Err(TraceError::Protocol { var, value: v });
                }
                break;
            }
        }
        let url = self.traces_url().expect("enabled means an endpoint");
        let ok = url::Url::parse(&url)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        if !ok {
            return Err(TraceError::Endpoint);
        }
        Ok(Some(url))
    }
}

/// Traces while they run; [`Tracing::shutdown`] exports what is left.
pub struct Tracing {
    provider: SdkTracerProvider,
}

/// Start traces if `settings` turn them on, exporting with `client`.
pub fn start(
    settings: &TraceSettings,
    client: impl opentelemetry_http::HttpClient + 'static,
) -> Result<Option<Tracing>, TraceError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let Some(url) = settings.validate()? else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(url)
        .build()
        .map_err(|e| TraceError::Exporter(e.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("tessera");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    TRACER
        .set(provider.tracer("tessera"))
        .map_err(|_| TraceError::AlreadyStarted)?;
    Ok(Some(Tracing { provider }))
}

impl Tracing {
    /// Export the spans still queued, within `grace`. The SDK's shutdown
    /// blocks its caller until the exporter's thread is done, and that
    /// thread's requests run on this runtime: so it runs off it.
    pub async fn shutdown(self, grace: Duration) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(grace)).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "exporting the last spans failed"),
            Err(e) => tracing::warn!(error = %e, "exporting the last spans failed"),
        }
    }
}

/// A span in progress, or nothing when traces are off. Ends when dropped.
pub struct Span(Option<Context>);

impl Span {
    /// No span.
    pub const NONE: Span = Span(None);

    /// A child of the span the current future carries.
    #[inline]
    pub fn child(name: &'static str) -> Span {
        Self::child_of_kind(name, SpanKind::Internal)
    }

    /// As [`Span::child`], of a kind (a client span for an outbound call).
    #[inline]
    pub fn child_of_kind(name: &'static str, kind: SpanKind) -> Span {
        match tracer() {
            None => Span(None),
            Some(t) => {
                let parent = Context::current();
                let span = t
                    .span_builder(name)
                    .with_kind(kind)
                    .start_with_context(t, &parent);
                Span(Some(parent.with_span(span)))
            }
        }
    }

    /// Whether a span is being made (traces are on).
    #[inline]
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Run `f` with this span as the current one, so the spans it starts
    /// are this one's children. Not an `async fn`: one would hold `f` twice
    /// in its state (as its argument and as what it awaits), and the
    /// request's future, which is large, would be copied on every move
    /// (measured: +17,700 instructions per request of `memcpy`).
    pub fn run<F: std::future::Future>(
        &self,
        f: F,
    ) -> futures_util::future::Either<F, opentelemetry::context::WithContext<F>> {
        use futures_util::future::Either;
        match &self.0 {
            None => Either::Left(f),
            Some(cx) => Either::Right(f.with_context(cx.clone())),
        }
    }

    /// Set attributes; `attrs` is not called when traces are off.
    #[inline]
    pub fn set(&self, attrs: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attributes(attrs());
        }
    }

    /// Mark the span failed, with a description.
    pub fn error(&self, description: impl FnOnce() -> String) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(description()));
        }
    }

    /// Tell the upstream this span's context (`traceparent`, and the
    /// caller's `tracestate` carried on), replacing what the caller sent.
    pub fn inject(&self, headers: &mut HeaderMap) {
        let Some(cx) = &self.0 else { return };
        let span = cx.span();
        let sc = span.span_context();
        let value = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8()
        );
        headers.insert(
            super::traceparent::TRACEPARENT,
            http::HeaderValue::from_str(&value).expect("hex is a header value"),
        );
        let state = sc.trace_state().header();
        match http::HeaderValue::from_str(&state) {
            Ok(v) if !state.is_empty() => {
                headers.insert(super::traceparent::TRACESTATE, v);
            }
            _ => {
                headers.remove(super::traceparent::TRACESTATE);
            }
        }
    }

    /// End the span now (dropping it does too).
    pub fn end(self) {
        drop(self)
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}

/// A data-plane request's id and, when traces are on, its server span.
///
/// The span continues the caller's `traceparent` (with its `tracestate`)
/// when one parses; otherwise it starts a trace. The request id is the
/// span's trace id, so that a trace, its access line and its audit rows
/// share one value; with traces off it is the caller's trace id or a
/// fresh one.
pub fn start_request(name: &'static str, headers: &HeaderMap) -> (RequestId, Span) {
    let parent = TraceParent::from_headers(headers);
    let Some(t) = tracer() else {
        return (RequestId::for_request(parent.as_ref()), Span(None));
    };
    let parent_cx = match parent {
        None => Context::new(),
        Some(p) => {
            let state = tracestate(headers).unwrap_or_default();
            let sc = SpanContext::new(
                TraceId::from_bytes(p.trace_id),
                SpanId::from_bytes(p.parent_id),
                TraceFlags::new(p.flags & TraceFlags::SAMPLED.to_u8()),
                true,
                state,
            );
            Context::new().with_remote_span_context(sc)
        }
    };
    let span = t
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .start_with_context(t, &parent_cx);
    let trace_id = span.span_context().trace_id().to_bytes();
    let cx = parent_cx.with_span(span);
    (RequestId::from_trace_id(trace_id), Span(Some(cx)))
}

/// The caller's `tracestate`: its fields joined, as HTTP allows a list
/// header to be split; one that does not parse is dropped whole.
fn tracestate(headers: &HeaderMap) -> Option<TraceState> {
    use std::str::FromStr;
    let mut joined = String::new();
    for v in headers.get_all(super::traceparent::TRACESTATE) {
        let v = v.to_str().ok()?;
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(v);
    }
    if joined.is_empty() || joined.len() > 512 {
        return None;
    }
    TraceState::from_str(&joined).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_endpoint_follows_the_specification() {
        // Only the settings' own value is read here; the environment's
        // variables are the process's, and tests share it.
        if std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
            return;
        }
        let s = |e: &str| TraceSettings {
            endpoint: Some(e.into()),
        };
        assert_eq!(
            s("http://127.0.0.1:4318").traces_url().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            s("http://collector:4318/base/").traces_url().as_deref(),
            Some("http://collector:4318/base/v1/traces")
        );
        assert_eq!(TraceSettings::default().traces_url(), None);
        assert_eq!(s("  ").traces_url(), None);
    }

    #[test]
    fn off_there_is_no_span_and_the_id_is_the_callers() {
        // No test starts the tracer in this process.
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let (id, span) = start_request("POST", &h);
        assert_eq!(id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(!span.is_on());
        let mut out = HeaderMap::new();
        span.inject(&mut out);
        assert!(out.is_empty());
    }
}
