//! The upstream connection pool: connections are reused, handed back when
//! a response ends (streams included), replaced when the upstream closes
//! them, and closed after the idle timeout.

use std::time::Duration;

use bytes::Bytes;

use crate::support::*;

async fn call(a: &Agent, url: &str) -> reqwest::Response {
    let r = client()
        .post(url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .body(tools_call(1, "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
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
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|s| s.peer == seen[0].peer),
        "a new upstream connection per request: {:?}",
        seen.iter().map(|s| s.peer).collect::<Vec<_>>()
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
    let mut r = call(&a, &format!("{}/sse", a.url)).await;
    let tx = up.sse_sender().await;
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    assert_eq!(r.chunk().await.unwrap().unwrap(), "data: 1\n\n");
    // The upstream ends the stream; the caller reads to the end.
    drop(tx);
    assert!(r.chunk().await.unwrap().is_none());
    call(&a, &format!("{}/mcp", a.url))
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
