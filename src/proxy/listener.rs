//! The data-plane listener: the accept loop, the connection caps and graceful
//! shutdown. `run` takes a bound listener so tests run it on port 0.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::state::State;

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
    let head_answers = crate::proxy::raw_head::HeadAnswers::new(
        state.config.limits.header_timeout,
        state.metrics.clone(),
    );
    // The connection caps (see `crate::limits::capacity`): idle connections make
    // room for new ones; busy ones are never cut.
    let connections = state.connections.clone();
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
                Err(crate::limits::capacity::OverSource) => {
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
                    resp.map(|b| crate::limits::capacity::WhileBusy::new(b, busy)),
                )
            }
        });
        let io = crate::proxy::raw_head::Watched::new(
            stream,
            head_answers.clone(),
            place.slot().clone(),
        );
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
