//! The upstream client: pooled HTTP/1.1 and HTTP/2 connections per
//! upstream origin and credential.
//!
//! Per credential, not only per origin: a connection that the upstream and
//! tessera ever read differently (a body the upstream did not read, an
//! answer framed one way and meant another) would otherwise hand one
//! caller's bytes to the next request on it, whoever's credential that
//! carries. Keyed by credential, such a desync stays inside the requests of
//! the one credential that caused it. The key is the caller's choice of
//! name ([`UpstreamClient::send`]); the token endpoint of an OAuth
//! credential gets a key of its own, since it receives client secrets.
//!
//! HTTP/1.1 (every plain `http://` upstream, and TLS ones that do not
//! offer h2) is spoken by [`crate::upstream::h1`] from the request's own task: a
//! request takes an idle connection, writes, reads the answer, and the
//! response body puts the connection back when it ends. No task, channel or
//! lock sits between the caller's request and the upstream socket.
//! HTTP/2, negotiated by TLS ALPN, goes through hyper's client connection,
//! one shared connection per origin and credential.
//!
//! Redirects are never followed: nothing here reads a `Location`. A request
//! is never retried once it may have reached the upstream (a tool call must
//! not run twice); an idle connection is checked without waiting before it
//! is used, so one the upstream has closed is replaced, not written to.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{header, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::upstream::egress::{Egress, Resolver};
use crate::upstream::h1;

type H2 = http2::SendRequest<Full<Bytes>>;
use crate::wire::BoxError;
/// An upstream HTTP/1.1 connection. The TLS state is boxed: it is large, and
/// a plain connection (an idle stream to a sidecar's upstream) should not
/// carry its size.
enum Io {
    Plain(TcpStream),
    Tls(Box<TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>>),
}

impl Io {
    fn new(io: MaybeHttpsStream<TokioIo<TcpStream>>) -> Io {
        match io {
            MaybeHttpsStream::Http(tcp) => Io::Plain(tcp.into_inner()),
            tls => Io::Tls(Box::new(TokioIo::new(tls))),
        }
    }
}

/// Delegate an I/O method to whichever stream this is.
macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self.get_mut() {
            Io::Plain($s) => {
                let $s = Pin::new($s);
                $call
            }
            Io::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $call
            }
        }
    };
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}
/// Why a request did not get a response from the upstream.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, DNS, TLS, connect timeout).
    #[error("connecting to the upstream failed: {0}")]
    Connect(BoxError),
    /// The connection broke or the upstream spoke invalid HTTP.
    #[error("the upstream HTTP exchange failed: {0}")]
    Http(BoxError),
}

/// A whole answer to one of tessera's own calls.
pub struct Exchanged {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// The status and the body's length only: a token endpoint's answer holds
/// tokens, and a `{:?}` must not print them.
impl std::fmt::Debug for Exchanged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchanged")
            .field("status", &self.status)
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Why one of tessera's own calls got no whole answer.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Send(#[from] SendError),
    /// The body broke off, or ran past the call's limit.
    #[error("the answer is unreadable or larger than {0} bytes")]
    Body(usize),
}

/// The TLS failure somewhere in a connect error's causes (an untrusted or
/// expired certificate, a name mismatch, a failed handshake), if that is
/// what it was.
pub fn tls_failure<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        // An io::Error's source() skips the error it wraps: descend into it.
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// Where connections go: scheme and authority.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    https: bool,
    authority: Authority,
}

/// Hashed as `Authority` compares, without case, but in one write: its
/// own `Hash` feeds the hasher a byte at a time, which cost about 1,000
/// instructions per lookup, two lookups per request (callgrind).
impl std::hash::Hash for Origin {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.https.hash(h);
        let mut lower = [0u8; 64];
        for chunk in self.authority.as_str().as_bytes().chunks(lower.len()) {
            let lower = &mut lower[..chunk.len()];
            lower.copy_from_slice(chunk);
            lower.make_ascii_lowercase();
            h.write(lower);
        }
    }
}

/// A pool's key: the origin, and the name of whose connections these are
/// (a credential's, say). Short names are kept inline: building the key
/// costs no allocation per request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    origin: Origin,
    credential: compact_str::CompactString,
}

/// The name in one write, as the origin (a `str`'s own `Hash` adds a
/// second write for its terminator).
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.origin.hash(h);
        h.write(self.credential.as_bytes());
    }
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

/// An origin's connections for one credential: idle HTTP/1.1 ones (most
/// recent last) and at most one shared HTTP/2 one.
#[derive(Default)]
struct Slot {
    idle: Vec<(Io, Instant)>,
    h2: Option<(H2, Instant)>,
}

struct Inner {
    connector: HttpsConnector<HttpConnector<Resolver>>,
    egress: Egress,
    idle_timeout: Duration,
    /// foldhash: keys are an admin's credentials and their origins.
    slots: Mutex<foldhash::HashMap<Key, Slot>>,
}

/// The pooled client to upstreams, built once at start and shared.
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("egress", &self.inner.egress)
            .finish_non_exhaustive()
    }
}

enum Pooled {
    H1(Io),
    H2(H2),
}

impl UpstreamClient {
    /// A client over `connector`. Idle connections are closed after
    /// `idle_timeout` by a task that lives as long as the client (so this
    /// must be called inside a Tokio runtime).
    pub fn new(
        connector: HttpsConnector<HttpConnector<Resolver>>,
        idle_timeout: Duration,
        egress: Egress,
    ) -> Self {
        let inner = Arc::new(Inner {
            connector,
            egress,
            idle_timeout,
            slots: Mutex::new(foldhash::HashMap::default()),
        });
        tokio::spawn(sweep(Arc::downgrade(&inner), idle_timeout));
        UpstreamClient { inner }
    }

    /// A whole exchange, for tessera's own calls (the token endpoint, the
    /// login's discovery and registration, the external authorizer): send
    /// `req` as [`UpstreamClient::send`] does, then read the answer's body,
    /// at most `max` bytes of it. Forwarding streams instead, on `send`.
    pub async fn exchange(
        &self,
        req: Request<Bytes>,
        pool_key: &str,
        max: usize,
    ) -> Result<Exchanged, ExchangeError> {
        use http_body_util::BodyExt;
        let (parts, body) = self.send(req, pool_key).await?.into_parts();
        let body = http_body_util::Limited::new(body, max)
            .collect()
            .await
            .map_err(|_| ExchangeError::Body(max))?
            .to_bytes();
        Ok(Exchanged {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Send `req` (absolute URI, `Host` already set) and return the
    /// response head; the body streams from the connection. `pool_key`
    /// names whose request this is (the credential it carries): it goes
    /// only on connections that carried requests of the same key.
    pub async fn send(
        &self,
        req: Request<Bytes>,
        pool_key: &str,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let key = Key {
            origin: Origin::of(req.uri())?,
            credential: pool_key.into(),
        };
        let pooled = match self.inner.checkout(&key) {
            Some(p) => p,
            // Boxed: the connect path is rare, and its futures would
            // otherwise make every request's future (and every open stream)
            // larger.
            None => Box::pin(self.inner.connect(&key, req.uri().clone())).await?,
        };
        match pooled {
            Pooled::H1(io) => {
                let resp = h1::exchange(io, &req)
                    .await
                    .map_err(|e| SendError::Http(e.into()))?;
                let pool = Arc::downgrade(&self.inner);
                Ok(resp.map(|body| {
                    let mut body = UpstreamBody(Kind::H1 {
                        body,
                        back: Some((key, pool)),
                    });
                    body.give_back_if_done();
                    body
                }))
            }
            Pooled::H2(mut tx) => {
                // HTTP/2 carries the authority in the URI; `Host` would
                // duplicate it.
                let mut req = req.map(Full::new);
                req.headers_mut().remove(header::HOST);
                let resp = tx
                    .send_request(req)
                    .await
                    .map_err(|e| SendError::Http(e.into()))?;
                Ok(resp.map(|b| UpstreamBody(Kind::H2(b))))
            }
        }
    }

    /// Idle HTTP/1.1 connections and live HTTP/2 ones, across origins and
    /// credentials.
    pub fn idle_connections(&self) -> usize {
        let slots = self.inner.slots();
        slots
            .values()
            .map(|s| s.idle.len() + usize::from(s.h2.is_some()))
            .sum()
    }
}

impl Inner {
    fn slots(&self) -> std::sync::MutexGuard<'_, foldhash::HashMap<Key, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pooled connection ready for a request, if any. Closed and expired
    /// ones are dropped on the way.
    fn checkout(&self, key: &Key) -> Option<Pooled> {
        let mut slots = self.slots();
        let slot = slots.get_mut(key)?;
        let now = Instant::now();
        if let Some((tx, used)) = &mut slot.h2 {
            if tx.is_ready() {
                *used = now;
                return Some(Pooled::H2(tx.clone()));
            }
            slot.h2 = None;
        }
        while let Some((mut io, since)) = slot.idle.pop() {
            if now.duration_since(since) < self.idle_timeout && h1::idle_and_open(&mut io) {
                return Some(Pooled::H1(io));
            }
        }
        None
    }

    async fn connect(&self, key: &Key, uri: Uri) -> Result<Pooled, SendError> {
        let origin = &key.origin;
        // The scheme and an IP-literal host here; a name's addresses in
        // the connector's resolver, as they are connected to.
        self.egress
            .check_connect(origin.https, origin.authority.host())
            .map_err(|e| SendError::Connect(e.into()))?;
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(SendError::Connect)?;
        let io = connector.call(uri).await.map_err(SendError::Connect)?;
        if !io.connected().is_negotiated_h2() {
            return Ok(Pooled::H1(Io::new(io)));
        }
        let (tx, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(|e| SendError::Connect(e.into()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        self.slots().entry(key.clone()).or_default().h2 = Some((tx.clone(), Instant::now()));
        Ok(Pooled::H2(tx))
    }

    fn put(&self, key: Key, io: Io) {
        self.slots()
            .entry(key)
            .or_default()
            .idle
            .push((io, Instant::now()));
    }
}

/// Close idle connections that are older than the idle timeout or that the
/// upstream closed, until the client is dropped.
async fn sweep(pool: Weak<Inner>, idle_timeout: Duration) {
    let mut tick = tokio::time::interval(idle_timeout / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        pool.slots().retain(|_, slot| {
            slot.idle.retain_mut(|(io, since)| {
                now.duration_since(*since) < idle_timeout && h1::idle_and_open(io)
            });
            if slot.h2.as_ref().is_some_and(|(tx, used)| {
                tx.is_closed() || now.duration_since(*used) >= idle_timeout
            }) {
                slot.h2 = None;
            }
            !slot.idle.is_empty() || slot.h2.is_some()
        });
    }
}

/// An upstream response body, streamed frame by frame. On HTTP/1.1 it puts
/// its connection back in the pool when it ends; dropped before the end,
/// the connection closes with it (it cannot carry another request).
pub struct UpstreamBody(Kind);

enum Kind {
    H1 {
        body: h1::Body<Io>,
        back: Option<(Key, Weak<Inner>)>,
    },
    H2(Incoming),
}

impl UpstreamBody {
    fn give_back_if_done(&mut self) {
        let Kind::H1 { body, back } = &mut self.0 else {
            return;
        };
        let Some(io) = body.take_reusable() else {
            return;
        };
        if let Some((key, pool)) = back.take() {
            if let Some(pool) = pool.upgrade() {
                pool.put(key, io);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = match &mut self.0 {
            Kind::H1 { body, .. } => {
                ready!(Pin::new(body).poll_frame(cx)).map(|f| f.map_err(BoxError::from))
            }
            Kind::H2(body) => {
                return Pin::new(body)
                    .poll_frame(cx)
                    .map(|f| f.map(|f| f.map_err(BoxError::from)))
            }
        };
        self.give_back_if_done();
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::H1 { body, .. } => body.is_end_stream(),
            Kind::H2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::H1 { body, .. } => body.size_hint(),
            Kind::H2(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn origins_are_keyed_without_case_as_they_compare() {
        let origin = |u: &str| Origin::of(&u.parse::<Uri>().unwrap()).unwrap();
        let long = format!("https://{}.example.com:8443/mcp", "a".repeat(70));
        let mut slots = HashMap::new();
        slots.insert(origin("https://Upstream.Example.com:8443/mcp"), 1);
        slots.insert(origin(&long), 2);
        slots.insert(origin("http://upstream.example.com:8443/mcp"), 3);
        assert_eq!(
            slots.get(&origin("https://upstream.EXAMPLE.com:8443/x")),
            Some(&1)
        );
        assert_eq!(
            slots.get(&origin(&long.to_uppercase().replace("HTTPS", "https"))),
            Some(&2)
        );
        assert_eq!(
            slots.get(&origin("http://UPSTREAM.example.com:8443/")),
            Some(&3)
        );
        assert_eq!(
            slots.get(&origin("https://upstream.example.com:443/")),
            None
        );
    }

    #[test]
    fn one_origin_has_a_pool_per_credential() {
        let key = |u: &str, credential: &str| Key {
            origin: Origin::of(&u.parse::<Uri>().unwrap()).unwrap(),
            credential: credential.into(),
        };
        let mut slots = HashMap::new();
        slots.insert(key("https://up.example/mcp", "gh"), 1);
        slots.insert(key("https://up.example/mcp", "gh-admin"), 2);
        slots.insert(key("https://up.example/mcp", "oauth:gh"), 3);
        assert_eq!(slots.len(), 3);
        assert_eq!(slots.get(&key("https://UP.example/x", "gh")), Some(&1));
        assert_eq!(slots.get(&key("https://up.example/", "gh-admin")), Some(&2));
        assert_eq!(slots.get(&key("https://up.example/", "GH")), None);
        assert_eq!(slots.get(&key("https://up.example/", "")), None);
    }
}
