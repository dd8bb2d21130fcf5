//! The upstream client: pooled HTTP/1.1 and HTTP/2 connections per
//! upstream origin, on hyper's connection API directly.
//!
//! Why not hyper-util's legacy `Client`: per request it races a lazy
//! connect against the pool checkout and spawns a task that waits to put
//! the connection back, and per connection it keeps futures a forwarder
//! does not need. Here a request takes an idle HTTP/1.1 connection (or
//! shares the origin's HTTP/2 one), and the response body puts the
//! connection back when it ends: no task, no channel, no lock held across
//! an await. BENCHMARKS.md has the before and after.
//!
//! HTTP/2 is used when TLS negotiates it by ALPN; plain `http://` upstreams
//! speak HTTP/1.1. Redirects are never followed: nothing here reads a
//! `Location`. A request is retried on a fresh connection only when hyper
//! hands it back unsent (the pooled connection had closed), never after it
//! may have reached the upstream: a tool call must not run twice.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery};
use http::{header, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;

type H1 = http1::SendRequest<Full<Bytes>>;
type H2 = http2::SendRequest<Full<Bytes>>;

/// Why a request did not get a response from the upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, DNS, TLS, connect timeout).
    #[error("connecting to the upstream failed: {0}")]
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The connection broke or the upstream spoke invalid HTTP.
    #[error("the upstream HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
}

/// Where connections go: scheme and authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    https: bool,
    authority: Authority,
}

impl Origin {
    fn of(uri: &Uri) -> Result<Origin, SendError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(SendError::Connect("the upstream URL is not http(s)".into())),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| SendError::Connect("the upstream URL has no host".into()))?;
        Ok(Origin { https, authority })
    }
}

/// An origin's connections: idle HTTP/1.1 ones (most recent last) and at
/// most one shared HTTP/2 one.
#[derive(Default)]
struct Slot {
    idle: Vec<(H1, Instant)>,
    h2: Option<(H2, Instant)>,
}

struct Inner {
    connector: HttpsConnector<HttpConnector>,
    idle_timeout: Duration,
    slots: Mutex<HashMap<Origin, Slot>>,
}

/// The pooled client to upstreams, built once at start and shared.
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

enum Pooled {
    H1(H1),
    H2(H2),
}

impl UpstreamClient {
    /// A client over `connector`. Idle connections are closed after
    /// `idle_timeout` by a task that lives as long as the client (so this
    /// must be called inside a Tokio runtime).
    pub fn new(connector: HttpsConnector<HttpConnector>, idle_timeout: Duration) -> Self {
        let inner = Arc::new(Inner {
            connector,
            idle_timeout,
            slots: Mutex::new(HashMap::new()),
        });
        tokio::spawn(sweep(Arc::downgrade(&inner), idle_timeout));
        UpstreamClient { inner }
    }

    /// Send `req` (absolute URI, `Host` already set) and return the
    /// response head; the body streams from the connection.
    pub async fn send(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let origin = Origin::of(req.uri())?;
        if let Some(pooled) = self.inner.checkout(&origin) {
            match pooled {
                Pooled::H2(mut tx) => return send_h2(&mut tx, req).await,
                Pooled::H1(mut tx) => match tx.try_send_request(h1_form(req)).await {
                    Ok(resp) => return Ok(self.inner.body_returns(resp, tx, origin)),
                    // Handed back unsent: the connection had closed. Retry
                    // once on a new one.
                    Err(mut e) => match e.take_message() {
                        Some(unsent) => req = with_origin(unsent, &origin),
                        None => return Err(SendError::Http(e.into_error())),
                    },
                },
            }
        }
        // Boxed: the connect path is rare, and its futures would otherwise
        // make every request's future (and every open stream) larger.
        let connect = Box::pin(self.inner.connect(&origin, req.uri().clone()));
        match connect.await? {
            Pooled::H2(mut tx) => send_h2(&mut tx, req).await,
            Pooled::H1(mut tx) => {
                let resp = tx
                    .send_request(h1_form(req))
                    .await
                    .map_err(SendError::Http)?;
                Ok(self.inner.body_returns(resp, tx, origin))
            }
        }
    }

    /// Idle HTTP/1.1 connections and live HTTP/2 ones, across origins.
    pub fn idle_connections(&self) -> usize {
        let slots = self.inner.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .map(|s| s.idle.len() + usize::from(s.h2.is_some()))
            .sum()
    }
}

async fn send_h2(
    tx: &mut H2,
    mut req: Request<Full<Bytes>>,
) -> Result<Response<UpstreamBody>, SendError> {
    // HTTP/2 carries the authority in the URI; `Host` would duplicate it.
    req.headers_mut().remove(header::HOST);
    let resp = tx.send_request(req).await?;
    Ok(resp.map(|inner| UpstreamBody { inner, back: None }))
}

/// HTTP/1.1 to an origin server takes the origin form (`/path?query`).
fn h1_form(mut req: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let pq = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(pq);
    req
}

/// Restore the absolute URI of a request turned into origin form.
fn with_origin(mut req: Request<Full<Bytes>>, o: &Origin) -> Request<Full<Bytes>> {
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(if o.https {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.authority = Some(o.authority.clone());
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    req
}

impl Inner {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<Origin, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pooled connection ready for a request, if any. Closed and expired
    /// ones are dropped on the way.
    fn checkout(&self, origin: &Origin) -> Option<Pooled> {
        let mut slots = self.slots();
        let slot = slots.get_mut(origin)?;
        let now = Instant::now();
        if let Some((tx, used)) = &mut slot.h2 {
            if tx.is_ready() {
                *used = now;
                return Some(Pooled::H2(tx.clone()));
            }
            slot.h2 = None;
        }
        while let Some((tx, since)) = slot.idle.pop() {
            if tx.is_ready() && now.duration_since(since) < self.idle_timeout {
                return Some(Pooled::H1(tx));
            }
            // Closed, expired, or (rarely) not yet idle after its last
            // response: let it go rather than wait for it.
        }
        None
    }

    async fn connect(&self, origin: &Origin, uri: Uri) -> Result<Pooled, SendError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(SendError::Connect)?;
        let io = connector.call(uri).await.map_err(SendError::Connect)?;
        if io.connected().is_negotiated_h2() {
            let (tx, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                }
            });
            self.slots().entry(origin.clone()).or_default().h2 = Some((tx.clone(), Instant::now()));
            Ok(Pooled::H2(tx))
        } else {
            let (tx, conn) = http1::Builder::new().handshake(io).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
                }
            });
            Ok(Pooled::H1(tx))
        }
    }

    /// The response with a body that puts `tx` back when it ends.
    fn body_returns(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        tx: H1,
        origin: Origin,
    ) -> Response<UpstreamBody> {
        let back = GiveBack {
            tx,
            origin,
            pool: Arc::downgrade(self),
        };
        let (parts, inner) = resp.into_parts();
        let mut body = UpstreamBody {
            inner,
            back: Some(back),
        };
        body.give_back_if_done();
        Response::from_parts(parts, body)
    }

    fn put(&self, origin: Origin, tx: H1) {
        if !tx.is_closed() {
            self.slots()
                .entry(origin)
                .or_default()
                .idle
                .push((tx, Instant::now()));
        }
    }
}

/// Close idle connections older than the idle timeout, until the client is
/// dropped.
async fn sweep(pool: Weak<Inner>, idle_timeout: Duration) {
    let mut tick = tokio::time::interval(idle_timeout / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        pool.slots().retain(|_, slot| {
            slot.idle
                .retain(|(tx, since)| !tx.is_closed() && now.duration_since(*since) < idle_timeout);
            if slot.h2.as_ref().is_some_and(|(tx, used)| {
                tx.is_closed() || now.duration_since(*used) >= idle_timeout
            }) {
                slot.h2 = None;
            }
            !slot.idle.is_empty() || slot.h2.is_some()
        });
    }
}

struct GiveBack {
    tx: H1,
    origin: Origin,
    pool: Weak<Inner>,
}

/// An upstream response body, streamed frame by frame. On HTTP/1.1 it puts
/// its connection back in the pool when it ends; dropped before the end,
/// the connection closes with it (it cannot carry another request).
pub struct UpstreamBody {
    inner: Incoming,
    back: Option<GiveBack>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some(b) = self.back.take() {
            if let Some(pool) = b.pool.upgrade() {
                pool.put(b.origin, b.tx);
            }
        }
    }

    fn give_back_if_done(&mut self) {
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            None => self.give_back(),
            Some(Ok(_)) => self.give_back_if_done(),
            // A broken body means a broken connection: never reuse it.
            Some(Err(_)) => self.back = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
