//! The one response body type the data plane returns: either a streamed
//! upstream body passed through frame by frame, or a small buffer tessera
//! wrote itself.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// A response body: boxed so upstream streams and tessera's own answers
/// share one type.
pub type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body from a buffer tessera produced.
pub fn full(b: Bytes) -> ProxyBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

/// A response body counted as it passes: its bytes go to the `bytes out`
/// counter frame by frame, and an event stream counts as open (and the
/// caller's request as in flight) until the body is dropped (finished, or
/// the caller gone).
pub struct Metered<B> {
    inner: B,
    metrics: std::sync::Arc<crate::telemetry::metrics::Metrics>,
    _stream: Option<crate::telemetry::metrics::StreamGuard>,
    /// An event stream ends cleanly when this fires (shutdown: see
    /// [`crate::proxy::listener::run`]), rather than being cut at the grace period.
    drain: Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
    /// The caller's in-flight slot, released when the body is dropped.
    _admitted: crate::limits::Admitted,
}

impl<B> Metered<B> {
    pub fn new(
        inner: B,
        metrics: &std::sync::Arc<crate::telemetry::metrics::Metrics>,
        event_stream: bool,
        admitted: crate::limits::Admitted,
        drain: &std::sync::Arc<tokio::sync::Notify>,
    ) -> Self {
        Metered {
            inner,
            _admitted: admitted,
            // Created now, so a drain signalled before the first poll
            // still ends the stream.
            drain: event_stream.then(|| Box::pin(drain.clone().notified_owned())),
            _stream: event_stream.then(|| metrics.stream_opened()),
            metrics: metrics.clone(),
        }
    }
}

impl<B> http_body::Body for Metered<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        use std::future::Future;
        if let Some(d) = &mut self.drain {
            if d.as_mut().poll(cx).is_ready() {
                // The end of the body: the chunked terminator, so the
                // client sees a finished stream and reconnects.
                self.drain = None;
                return std::task::Poll::Ready(None);
            }
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(f))) = &polled {
            if let Some(d) = f.data_ref() {
                self.metrics.bytes_out(d.len());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
