//! Broken and hostile upstreams, scripted over raw TCP: each fault gets its
//! documented answer (502, 504, or a body that fails rather than ends
//! short), and once the caller has its answer or is gone, no task and no
//! upstream connection is left behind.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::support::*;

/// An upstream that runs `script` on each connection, then waits for tessera
/// to close it and signals `closed`.
struct Faulty {
    addr: SocketAddr,
    closed: Arc<Notify>,
}

impl Faulty {
    async fn start<F, Fut>(script: F) -> Faulty
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<TcpStream>> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = Arc::new(Notify::new());
        let (script, done) = (Arc::new(script), closed.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (script, done) = (script.clone(), done.clone());
                tokio::spawn(async move {
                    if let Some(mut s) = script(s).await {
                        // Until tessera closes its side.
                        let mut buf = [0u8; 1024];
                        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                    }
                    done.notify_one();
                });
            }
        });
        Faulty { addr, closed }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// Read the request head and body tessera sent (small: one tools/call).
async fn read_request(s: &mut TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).await.unwrap();
        assert!(n > 0, "tessera closed before sending its request");
        got += n;
        let text = String::from_utf8_lossy(&buf[..got]);
        if let Some(head_end) = text.find("\r\n\r\n") {
            let len: usize = text[..head_end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got >= head_end + 4 + len {
                return;
            }
        }
    }
}

/// The runtime's live tasks (the in-process proxy's included).
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

async fn back_to(baseline: usize, what: &str) {
    let t = tokio::time::timeout(
        Duration::from_secs(5),
        within(Duration::from_secs(5), || async { tasks() <= baseline }),
    )
    .await;
    assert!(
        t.is_ok() && tasks() <= baseline,
        "{what}: {} tasks, baseline {baseline}",
        tasks()
    );
}

#[tokio::test]
async fn broken_upstreams_get_documented_answers_and_leave_nothing_behind() {
    let reset = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"partial\":")
            .await
            .unwrap();
        // An abortive close: RST, mid-body.
        s.set_zero_linger().unwrap();
        drop(s);
        None
    })
    .await;
    let stall = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"partial\":")
            .await
            .unwrap();
        Some(s)
    })
    .await;
    let garbage = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.unwrap();
        Some(s)
    })
    .await;
    let bad_length = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12abc\r\n\r\n{}")
            .await
            .unwrap();
        Some(s)
    })
    .await;
    let huge = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 10000000000\r\n\r\n")
            .await
            .unwrap();
        let zeros = vec![0u8; 64 * 1024];
        // 10 GB, for as long as tessera reads.
        while s.write_all(&zeros).await.is_ok() {}
        None
    })
    .await;
    let endless = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let event = b"f\r\ndata: {\"n\":1}\n\n\r\n";
        while s.write_all(event).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    })
    .await;

    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.upstream_timeout = Duration::from_millis(500);
        c.limits.caller.rate = 0.0;
    })
    .await;
    let agent = |name: &'static str, url: String| {
        let p = &p;
        async move { p.agent(name, &url, name).await }
    };
    let reset_a = agent("reset", reset.url()).await;
    let stall_a = agent("stall", stall.url()).await;
    let garbage_a = agent("garbage", garbage.url()).await;
    let bad_length_a = agent("badlength", bad_length.url()).await;
    let huge_a = agent("huge", huge.url()).await;
    let endless_a = agent("endless", endless.url()).await;
    let baseline = tasks();

    // Reset mid-body: the caller's exchange is aborted (before or after
    // the head, as the reset races it); it never looks complete.
    let r = client()
        .post(&reset_a.url)
        .bearer_auth(&reset_a.token)
        .body(tools_call(1, "t"))
        .send()
        .await;
    let complete = match r {
        Err(_) => false,
        Ok(r) => r.bytes().await.is_ok(),
    };
    assert!(
        !complete,
        "a truncated answer reached the caller as complete"
    );
    back_to(baseline, "reset").await;

    // Stalled mid-body: passed on as stalled (an idle stream looks the
    // same); when the caller gives up, the upstream connection is closed.
    let closed = stall.closed.notified();
    let r = send_call(&stall_a, 2).await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    use futures_util::StreamExt;
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"{\"partial\":");
    drop(body);
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the stalled upstream connection stayed open after the caller left");
    back_to(baseline, "stall").await;

    // Not HTTP, or a malformed length: 502 naming the credential.
    for (a, name) in [(&garbage_a, "garbage"), (&bad_length_a, "badlength")] {
        let (s, v) = post_json(a, tools_call(3, "t")).await;
        assert_eq!(s, 502, "{name}: {v}");
        assert_eq!(v["error"]["code"], -32010);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(name) && msg.contains("broke the HTTP exchange"),
            "{msg}"
        );
    }
    back_to(baseline, "garbage").await;

    // 10 GB: streamed, never buffered; the caller leaves after 8 MiB and
    // the upstream connection closes.
    let closed = huge.closed.notified();
    let r = send_call(&huge_a, 4).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "10000000000");
    let mut body = r.bytes_stream();
    let mut got = 0usize;
    while got < 8 << 20 {
        got += body.next().await.unwrap().unwrap().len();
    }
    drop(body);
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the 10 GB upstream kept sending after the caller left");
    back_to(baseline, "huge").await;

    // An endless event stream to a caller that has gone.
    let closed = endless.closed.notified();
    let r = send_call(&endless_a, 5).await;
    let mut body = r.bytes_stream();
    for _ in 0..3 {
        body.next().await.unwrap().unwrap();
    }
    drop(body);
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the endless stream's upstream connection stayed open");
    back_to(baseline, "endless").await;

    // Nothing idle is kept from any of them: none ended cleanly.
    assert_eq!(p.state.client.idle_connections(), 0);
}

/// tessera sends no `TE`, so `chunked` is the one transfer coding an
/// upstream may use: a body de-chunked but still gzip-coded would pass the
/// redactor unread. Such an answer is a 502, and its connection is closed.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_a_502() {
    let gzip = Faulty::start(|mut s| async move {
        read_request(&mut s).await;
        s.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
              transfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        Some(s)
    })
    .await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gzipped", &gzip.url(), "agent").await;
    let closed = gzip.closed.notified();
    let (s, v) = post_json(&a, tools_call(1, "t")).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["code"], -32010);
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the upstream connection stayed open");
    assert_eq!(p.state.client.idle_connections(), 0);
}

#[tokio::test]
async fn an_untrusted_upstream_certificate_is_a_502_naming_the_host_until_its_ca_is_configured() {
    let up = TlsUpstream::start(&[b"http/1.1"]).await;
    let url = format!("https://localhost:{}/mcp", up.port);

    // The built-in roots do not know the upstream's self-signed CA.
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("private", &url, "agent").await;
    let (s, v) = post_json(&a, tools_call(1, "t")).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["code"], -32010);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("TLS to localhost")
            && msg.contains("certificate")
            && msg.contains("--upstream-ca-file"),
        "{msg}"
    );
    assert_eq!(up.seen.lock().unwrap().len(), 0);

    // --upstream-ca-file with the CA's PEM: trusted.
    let dir = tempfile::tempdir().unwrap();
    let pem_path = up.ca_pem(dir.path());
    let settings = |file: &str| {
        let mut raw = tessera::config::RawServe::defaults("127.0.0.1:0".parse().unwrap());
        raw.upstream_ca_file = Some(file.to_string());
        tessera::config::parse_serve(raw)
    };
    let roots = settings(pem_path.to_str().unwrap()).unwrap().upstream_roots;
    let p = Proxy::start_with(Proxy::dir(), |c| c.upstream_roots = roots).await;
    let a = p.agent("private", &url, "agent").await;
    let r = send_call(&a, 2).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ok");
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].2.as_ref().unwrap(), &format!("Bearer {SECRET}"));

    // A file that holds no certificate is refused at start, naming it.
    std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
    let junk = dir.path().join("junk.pem");
    let e = settings(junk.to_str().unwrap()).unwrap_err().to_string();
    assert!(
        e.starts_with("--upstream-ca-file") && e.contains("junk.pem"),
        "{e}"
    );
}
