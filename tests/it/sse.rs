//! Streaming: an SSE event reaches the caller while the upstream holds the
//! stream open, and a caller that goes away cancels the upstream request.

use std::time::Duration;

use bytes::Bytes;

use crate::support::*;

#[tokio::test]
async fn sse_events_stream_through_as_sent_and_disconnect_cancels() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/sse"), "agent").await;
    let mut r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("set-cookie").is_none());
    let tx = up.sse_sender().await;
    for i in 0..3 {
        let ev = format!("id: {i}\ndata: {{\"n\":{i}}}\n\n");
        let sent = std::time::Instant::now();
        tx.send(Bytes::from(ev.clone())).await.unwrap();
        // The stream stays open upstream: a buffering proxy would never
        // deliver this chunk, so the timeout would fire.
        let got = tokio::time::timeout(Duration::from_secs(5), r.chunk())
            .await
            .expect("event not delivered")
            .unwrap()
            .unwrap();
        assert_eq!(got, ev.as_bytes());
        eprintln!(
            "event {i} delivered {:?} after the upstream sent it",
            sent.elapsed()
        );
    }
    // The caller goes away: the upstream side must be dropped.
    drop(r);
    tokio::time::timeout(Duration::from_secs(5), tx.closed())
        .await
        .expect("upstream request not cancelled");
}
