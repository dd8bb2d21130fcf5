//! The benchmark's upstream: a small, fast MCP-ish server on a
//! current-thread runtime, so that it costs the same in every arm.
//!
//! - `POST <any path>`: checks `Authorization: Bearer $BENCH_UPSTREAM_SECRET`
//!   (401 otherwise, so a proxy that fails to inject shows up as errors),
//!   reads the body and answers a small JSON-RPC `tools/call` result, with
//!   a `Set-Cookie` and a `WWW-Authenticate` header for the proxies to filter.
//! - `GET <path>?every_ms=N`: an SSE stream that sends a priming event and
//!   then, every N ms, an event whose data is the send time in Unix
//!   nanoseconds (the client subtracts it from its receive time). Without
//!   `every_ms` the stream stays open and idle after the priming event.
//!
//! Usage: `bench-upstream ADDR` (e.g. `127.0.0.1:18081`); prints
//! `listening ADDR` once bound.
//!
//! With `BENCH_UPSTREAM_TLS_CA=FILE` it serves TLS for `localhost` with a
//! certificate made at start (written to FILE as PEM, for the proxy to
//! trust) and offers HTTP/2 by ALPN, with no cap on concurrent streams:
//! then every stream a proxy forwards shares one upstream connection, and
//! a soak can hold more streams than the proxy has file descriptors for
//! two sockets each.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

const RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"issue #42 updated: label 'bug' added"}],"isError":false}}"#;

fn main() {
    let addr = std::env::args().nth(1).expect("usage: bench-upstream ADDR");
    let secret = std::env::var("BENCH_UPSTREAM_SECRET").expect("BENCH_UPSTREAM_SECRET is not set");
    let expected: &'static [u8] =
        Box::leak(format!("Bearer {secret}").into_bytes().into_boxed_slice());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(&addr).await.expect("bind");
        if let Ok(ca) = std::env::var("BENCH_UPSTREAM_TLS_CA") {
            let acceptor = tls_acceptor(&ca);
            println!("listening {}", listener.local_addr().unwrap());
            return serve_tls(listener, acceptor, expected).await;
        }
        println!("listening {}", listener.local_addr().unwrap());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(req, expected));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

/// A self-signed certificate for `localhost`, its PEM written to `ca`.
fn tls_acceptor(ca: &str) -> tokio_rustls::TlsAcceptor {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    std::fs::write(ca, made.cert.pem()).expect("writing the certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .expect("TLS config");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls))
}

async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    expected: &'static [u8],
) {
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder.http2().max_concurrent_streams(None);
    let builder = std::sync::Arc::new(builder);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, builder) = (acceptor.clone(), builder.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let svc = service_fn(move |req| answer(req, expected));
            let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    expected: &'static [u8],
) -> Result<Response<Body>, Infallible> {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == expected);
    if !authorized {
        let mut r = Response::new(Empty::new().boxed());
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(r);
    }
    if req.method() == Method::GET {
        let every = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("every_ms="))
            .and_then(|v| v.parse::<u64>().ok());
        return Ok(sse(every));
    }
    let _ = req.into_body().collect().await;
    let mut r = Response::new(Full::new(Bytes::from_static(RESULT)).boxed());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("upstream_session=abc; HttpOnly"),
    );
    h.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer resource_metadata=\"http://upstream.invalid/.well-known/oauth-protected-resource\""),
    );
    Ok(r)
}

fn sse(every: Option<u64>) -> Response<Body> {
    let priming = futures_util::stream::once(async {
        Ok(Frame::data(Bytes::from_static(b"id: 0\ndata: \n\n")))
    });
    let ticks = futures_util::stream::unfold(every, |every| async move {
        match every {
            // Idle: never yield, keep the stream open.
            None => std::future::pending().await,
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                let ev = Bytes::from(format!("data: {now}\n\n"));
                Some((Ok(Frame::data(ev)), every))
            }
        }
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(
        futures_util::StreamExt::chain(priming, ticks),
    )));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
