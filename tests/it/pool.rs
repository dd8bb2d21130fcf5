//! The upstream connection pool: connections are reused, handed back when
//! a response ends (streams included), replaced when the upstream closes
//! them, closed after the idle timeout or an error answer to a request with
//! a body, and never shared between credentials.

use std::time::Duration;

use bytes::Bytes;

use crate::support::*;

/// The upstream connection (tessera's end) each request arrived on, in order.
fn peers(up: &Upstream) -> Vec<std::net::SocketAddr> {
    up.seen().iter().map(|s| s.peer).collect()
}

async fn call(a: &Agent, url: &str) -> reqwest::Response {
    call_answered(a, url, 200).await
}

/// POST a `tools/call` to `url` as `a`, the answer's status checked.
async fn call_answered(a: &Agent, url: &str, status: u16) -> reqwest::Response {
    let r = client()
        .post(url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), status);
    r
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection_in_origin_form() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    for _ in 0..3 {
        call(&a, &format!("{}/x?q=1", a.url))
            .await
            .bytes()
            .await
            .unwrap();
    }
    let seen = up.seen();
    let peers = peers(&up);
    assert_eq!(peers.len(), 3);
    assert!(
        peers.iter().all(|&p| p == peers[0]),
        "a new upstream connection per request: {peers:?}"
    );
    // HTTP/1.1 to an origin server: the origin form, not an absolute URI.
    assert_eq!(seen[0].target, "/mcp/x?q=1");
    assert_eq!(p.state.client.idle_connections(), 1);
}

#[tokio::test]
async fn a_finished_stream_hands_its_connection_back() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url(""), "agent").await;
    let mut r = call(&a, &format!("{}/stream", a.url)).await;
    let tx = up.sse_sender().await;
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    assert_eq!(r.chunk().await.unwrap().unwrap(), "data: 1\n\n");
    // The upstream ends the stream; the caller reads to the end.
    drop(tx);
    assert!(r.chunk().await.unwrap().is_none());
    call(&a, &format!("{}/other", a.url))
        .await
        .bytes()
        .await
        .unwrap();
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].peer, seen[0].peer,
        "the stream's connection was not reused after the stream ended"
    );
}

#[tokio::test]
async fn an_upstream_that_closes_its_connection_gets_a_new_one() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/close"), "agent").await;
    let closed = up.connection_closed();
    call(&a, &a.url).await.bytes().await.unwrap();
    closed.await;
    // The pooled connection is gone; the next request must not fail on it.
    call(&a, &a.url).await.bytes().await.unwrap();
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0].peer, seen[1].peer);
}

#[tokio::test]
async fn idle_upstream_connections_close_after_the_idle_timeout() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.idle_timeout = Duration::from_millis(200);
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    call(&a, &a.url).await.bytes().await.unwrap();
    assert_eq!(p.state.client.idle_connections(), 1);
    // Nothing else happens: only the idle sweep can close it.
    up.connection_closed().await;
    assert_eq!(p.state.client.idle_connections(), 0);
}

/// An HTTPS upstream offering HTTP/2 by ALPN, with a certificate made for
/// the test: every request shares one connection.
#[tokio::test]
async fn https_upstreams_that_offer_http2_share_one_connection() {
    https_requests_reuse_one_connection(&[b"h2", b"http/1.1"], http::Version::HTTP_2).await;
}

/// An HTTPS upstream that speaks only HTTP/1.1: requests go one after
/// another on one pooled TLS connection.
#[tokio::test]
async fn https_upstreams_on_http1_reuse_one_connection() {
    https_requests_reuse_one_connection(&[b"http/1.1"], http::Version::HTTP_11).await;
}

async fn https_requests_reuse_one_connection(alpn: &[&[u8]], version: http::Version) {
    use std::sync::atomic::Ordering;

    use http_body_util::BodyExt;

    let up = TlsUpstream::start(alpn).await;
    let (port, cert, accepted, seen) = (
        up.port,
        up.cert.clone(),
        up.accepted.clone(),
        up.seen.clone(),
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let c = tessera::upstream::client_with_roots(
        Duration::from_secs(5),
        Duration::from_secs(90),
        tessera::upstream::egress::Egress {
            allow_private: true,
        },
        roots,
    );
    for i in 0..3 {
        let req = http::Request::post(format!("https://localhost:{port}/mcp?n={i}"))
            .header("host", format!("localhost:{port}"))
            .header("authorization", "Bearer stored")
            .body(Bytes::from("{}"))
            .unwrap();
        let resp = c.send(req, "gh").await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (i, (v, uri, auth)) in seen.iter().enumerate() {
        assert_eq!(*v, version);
        let target = format!("/mcp?n={i}");
        if version == http::Version::HTTP_2 {
            assert_eq!(uri, &format!("https://localhost:{port}{target}"));
        } else {
            assert_eq!(uri, &target, "origin form on HTTP/1.1");
        }
        assert_eq!(auth.as_ref().unwrap(), "Bearer stored");
    }
    assert_eq!(c.idle_connections(), 1);
}

/// Two credentials on one upstream origin never share a connection, so bytes
/// one credential's request leaves on a connection cannot reach the
/// upstream in front of the other's; each credential's requests reuse its
/// own.
#[tokio::test]
async fn each_credential_has_its_own_upstream_connections() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let b = p.agent("gh-admin", &up.url("/mcp"), "admin").await;
    for agent in [&a, &b, &a, &b] {
        call(agent, &agent.url).await.bytes().await.unwrap();
    }
    let peers = peers(&up);
    assert_eq!(peers.len(), 4);
    assert_ne!(
        peers[0], peers[1],
        "two credentials shared an upstream connection"
    );
    assert_eq!(peers[2], peers[0], "gh's connection was not reused");
    assert_eq!(peers[3], peers[1], "gh-admin's connection was not reused");
    assert_eq!(p.state.client.idle_connections(), 2);
}

/// An upstream may answer an error before it reads a request's body, which
/// is then read as the connection's next request: after an error answer to
/// a request with a body the connection is closed and the next request gets
/// a new one; after a 2xx it is reused.
#[tokio::test]
async fn a_connection_is_not_reused_after_an_error_answer_to_a_request_with_a_body() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url(""), "agent").await;
    let (mcp, reject) = (format!("{}/mcp", a.url), format!("{}/reject", a.url));
    call(&a, &mcp).await.bytes().await.unwrap();
    call(&a, &mcp).await.bytes().await.unwrap();
    let closed = up.connection_closed();
    let r = call_answered(&a, &reject, 400).await;
    r.bytes().await.unwrap();
    call(&a, &mcp).await.bytes().await.unwrap();
    let peers = peers(&up);
    assert_eq!(peers.len(), 4);
    assert_eq!(peers[1], peers[0], "not reused after a 2xx");
    assert_eq!(peers[2], peers[0], "not reused after a 2xx");
    assert_ne!(
        peers[3], peers[2],
        "reused after an error answer to a request with a body"
    );
    closed.await;
    assert_eq!(p.state.client.idle_connections(), 1);
}
