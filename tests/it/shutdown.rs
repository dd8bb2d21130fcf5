//! SIGTERM on a real `tessera serve`: new connections are refused, event
//! streams end cleanly, requests in flight finish, the audit trail is
//! flushed, and the process exits 0; a second signal exits at once.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn sigterm_ends_streams_finishes_requests_and_flushes_the_audit() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let streaming = register(dir.path(), &public, "sse", &up.url("/sse"), "watcher");
    let slow = register(dir.path(), &public, "slow", &up.url("/slow"), "worker");
    let mut served = Served::start(dir.path(), port, &[], &[]).await;

    // An event stream, open.
    let stream = client()
        .post(&streaming.url)
        .bearer_auth(&streaming.token)
        .body(tools_call(1, "watch"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let tx = up.sse_sender().await;
    tx.send("data: {\"first\":1}\n\n".into()).await.unwrap();
    // A request in flight upstream.
    let in_flight = tokio::spawn(
        client()
            .post(&slow.url)
            .bearer_auth(&slow.token)
            .body(tools_call(2, "work"))
            .send(),
    );
    within(Duration::from_secs(5), || async {
        up.seen().iter().any(|s| s.path == "/slow")
    })
    .await;

    served.signal("TERM");
    // The stream ends as a finished body (the chunked terminator), not a
    // cut connection, though the upstream never ended it.
    let body = tokio::time::timeout(Duration::from_secs(5), stream.bytes())
        .await
        .expect("the stream was not ended at shutdown")
        .expect("the stream was cut, not ended");
    assert_eq!(&body[..], b"data: {\"first\":1}\n\n");
    // The request in flight completes.
    let r = in_flight.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("slow"));
    // The process ends by itself, with 0, and nothing new is accepted.
    let status = tokio::time::timeout(Duration::from_secs(10), served.child.wait())
        .await
        .expect("serve did not exit")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(client().post(&slow.url).send().await.is_err());
    served.read_to_end().await;
    assert!(served.log.contains("shutting down"), "{}", served.log);
    drop(tx);
    // Both decisions reached the database before the exit.
    let audit = cli(dir.path(), &["--json", "audit"]);
    let rows = String::from_utf8(audit.stdout).unwrap();
    assert_eq!(rows.lines().count(), 2, "{rows}");
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let public = format!("http://127.0.0.1:{port}");
    let a = register(dir.path(), &public, "hang", &up.url("/hang"), "agent");
    let mut served = Served::start(dir.path(), port, &["--shutdown-grace-ms", "600000"], &[]).await;
    let _stuck = tokio::spawn(
        client()
            .post(&a.url)
            .bearer_auth(&a.token)
            .body(tools_call(1, "t"))
            .send(),
    );
    within(Duration::from_secs(5), || async { !up.seen().is_empty() }).await;
    served.signal("TERM");
    served.wait_for("shutting down").await;
    served.signal("TERM");
    // Not the ten-minute grace: the second signal ends it now.
    let status = tokio::time::timeout(Duration::from_secs(10), served.child.wait())
        .await
        .expect("a second SIGTERM did not end serve")
        .unwrap();
    assert_eq!(status.code(), Some(1));
}
