//! One caller cannot exhaust tessera (issue 23 §5): a flood of idle,
//! half-sent request heads leaves a legitimate caller served, under a real
//! descriptor limit, and request bodies over the memory budget of all
//! requests are refused 503 without reaching the upstream.
//!
//! Two sources on one machine: Linux routes all of 127.0.0.0/8 to the
//! loopback interface, so a client socket bound to 127.0.0.2 before it
//! connects is another source than one from 127.0.0.1.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::support::*;

/// `tessera serve` under a soft limit of `files` open descriptors (as
/// `ulimit -n` sets it), its log drained in the background.
async fn serve_limited(
    dir: &std::path::Path,
    port: u16,
    files: u32,
    args: &[&str],
) -> tokio::process::Child {
    let std_cmd = tessera(dir);
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
        .arg(std_cmd.get_program())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        // The access log off: nothing is to wait on a full pipe.
        .env("RUST_LOG", "info,tessera::access=warn")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in std_cmd.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (ready, serving) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut log, mut buf, mut ready) = (String::new(), [0u8; 4096], Some(ready));
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            log.push_str(&String::from_utf8_lossy(&buf[..n]));
            if log.contains("tessera serving") {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
        }
        // Ended before serving: the test fails on the dropped sender.
        drop(ready);
        if !log.contains("tessera serving") {
            eprintln!("serve exited: {log}");
        }
    });
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("serve did not start within 10 s")
        .expect("serve exited before serving");
    child
}

/// Opens `n` connections from `source` that each send half a request head
/// and then nothing. Each reports on `closed` (with what it was answered)
/// when tessera closes it; the sockets stay open otherwise.
async fn half_sent_heads(
    to: SocketAddr,
    source: Ipv4Addr,
    n: usize,
    closed: &mpsc::UnboundedSender<String>,
) {
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        let mut s = socket.connect(to).await.unwrap();
        // Written at once; it may meet a connection already closed.
        let _ = s
            .write_all(format!("POST /c/flood HTTP/1.1\r\nhost: {to}\r\n").as_bytes())
            .await;
        let closed = closed.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            let _ = closed.send(String::from_utf8_lossy(&got).into_owned());
        });
    }
}

/// Waits until `n` more flood connections were closed; what they got.
async fn closures(rx: &mut mpsc::UnboundedReceiver<String>, n: usize) -> Vec<String> {
    let mut got = Vec::with_capacity(n);
    tokio::time::timeout(Duration::from_secs(20), async {
        while got.len() < n {
            got.push(rx.recv().await.unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {n} flood connections were closed", got.len()));
    got
}

/// A `tools/call` from 127.0.0.1 on a new connection, answered in time.
async fn legitimate_call(a: &Agent, id: u32) {
    let call = tokio::time::timeout(Duration::from_secs(5), send_call(a, id));
    let r = call
        .await
        .expect("the legitimate caller was not served within 5 s");
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["id"], id, "{v}");
    assert!(v.get("result").is_some(), "{v}");
}

#[tokio::test]
async fn a_flood_of_half_sent_heads_leaves_a_legitimate_caller_served() {
    let up = Upstream::start().await;
    let dir = Proxy::dir();
    let port = Served::free_port();
    let a = register(
        dir.path(),
        &format!("http://127.0.0.1:{port}"),
        "gh",
        &up.url("/mcp"),
        "agent",
    );
    // 256 descriptors, as a small container gives: the default is then
    // 96 connections in all (on loopback the per-source default is the
    // total: every local caller is 127.0.0.1); 48 per source is set here.
    // Heads are given a minute, so nothing the flood holds is freed by the
    // header timeout meanwhile.
    let _served = serve_limited(
        dir.path(),
        port,
        256,
        &[
            "--header-timeout-ms",
            "60000",
            "--max-connections-per-source",
            "48",
        ],
    )
    .await;
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let (tx, mut rx) = mpsc::unbounded_channel();

    // 300 half-sent heads from 127.0.0.2: it keeps its 48 newest; its older
    // ones make room, answered 503 (or closed silently if their bytes had
    // not arrived yet). Without a cap, the flood takes every descriptor and
    // the legitimate caller waits for one in the kernel's accept queue.
    half_sent_heads(to, Ipv4Addr::new(127, 0, 0, 2), 300, &tx).await;
    legitimate_call(&a, 1).await;
    let got = closures(&mut rx, 300 - 48).await;
    let answered = got.iter().filter(|g| !g.is_empty()).collect::<Vec<_>>();
    assert!(!answered.is_empty());
    for g in answered {
        assert!(g.starts_with("HTTP/1.1 503 "), "{g}");
        assert!(g.contains("\r\nretry-after: 1\r\n"), "{g}");
        assert!(g.contains("\"code\":-32015"), "{g}");
    }

    // The same from the legitimate caller's own address (a loopback
    // sidecar, where every caller is 127.0.0.1): its idle connections make
    // room for the one that sends a request.
    half_sent_heads(to, Ipv4Addr::LOCALHOST, 200, &tx).await;
    closures(&mut rx, 200 - 48).await;
    legitimate_call(&a, 2).await;

    // From eight sources, 30 each: none is over its own cap, the total is
    // (96): the oldest idle connections of any source make room.
    for last in 3..=10 {
        half_sent_heads(to, Ipv4Addr::new(127, 0, 0, last), 30, &tx).await;
    }
    legitimate_call(&a, 3).await;
    // At most 96 connections are open: all but 96 of the 740 were closed.
    let so_far = (300 - 48) + (200 - 48);
    closures(&mut rx, 740 - 96 - so_far).await;
    // Every legitimate call reached the upstream; no flood request did.
    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.path == "/mcp"));
}

/// Assert `/metrics` counts `n` refusals for `reason`.
fn assert_refusals(p: &Proxy, reason: &str, n: u64) {
    let metrics = p
        .state
        .metrics
        .render(&tessera::telemetry::metrics::Gauges {
            audit_queue_depth: 0,
            audit_failing: false,
            ..Default::default()
        });
    let line = format!("tessera_refusals_total{{reason=\"{reason}\"}} {n}\n");
    assert!(metrics.contains(&line), "{metrics}");
}

const KIB: usize = 1024;
/// The size of each large body: 300 KiB.
const LARGE: usize = 300 * KIB;

/// A `tools/call` with id `id`, padded to exactly `size` bytes.
fn padded_call(id: u32, size: usize) -> String {
    let head = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"t\",\"arguments\":{{\"pad\":\""
    );
    let tail = "\"}}}";
    let pad = "x".repeat(size - head.len() - tail.len());
    format!("{head}{pad}{tail}")
}

/// A connection that sent `head` and `body` (and may send more).
async fn open_request(p: &Proxy, head: &str, body: &[u8]) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    s
}

/// Everything tessera sends until it closes (a reset after its answer
/// keeps what came), within 10 s.
async fn answer_of(mut s: tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let read = async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no answer within 10 s");
    String::from_utf8_lossy(&out).into_owned()
}

fn assert_body_memory_refusal(got: &str) {
    assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
    assert!(got.contains("\r\nretry-after: 1\r\n"), "{got}");
    let body = got.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], -32014, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--max-body-memory"), "{message}");
}

#[tokio::test]
async fn bodies_over_the_memory_budget_get_503_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.max_body_bytes = 320 * KIB;
        c.max_body_memory = 1024 * KIB;
    })
    .await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let head = |extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\
             authorization: Bearer {}\r\ncontent-type: application/json\r\n{extra}\r\n",
            a.token
        )
    };
    let used = |n: usize| {
        let memory = &p.state;
        move || {
            let ok = memory.body_memory.used() == n;
            async move { ok }
        }
    };

    // Three 300 KiB bodies, each half-sent: 900 KiB of the 1 MiB held.
    let bodies: Vec<String> = (1..=3).map(|id| padded_call(id, LARGE)).collect();
    let mut held = Vec::new();
    for b in &bodies {
        let h = head(&format!("content-length: {LARGE}\r\n"));
        held.push(open_request(&p, &h, &b.as_bytes()[..LARGE / 2]).await);
    }
    within(Duration::from_secs(5), used(3 * LARGE)).await;

    // A fourth is refused on its declared length, before its body is read.
    let h = head(&format!("content-length: {LARGE}\r\n"));
    let got = answer_of(open_request(&p, &h, b"").await).await;
    assert_body_memory_refusal(&got);

    // A chunked body is refused when it grows past what is left (124 KiB).
    let chunked = head("transfer-encoding: chunked\r\n");
    let chunk = |n: usize| format!("{n:x}\r\n{}\r\n", "x".repeat(n));
    let mut s = open_request(&p, &chunked, chunk(100 * KIB).as_bytes()).await;
    within(Duration::from_secs(5), used(3 * LARGE + 100 * KIB)).await;
    s.write_all(chunk(30 * KIB).as_bytes()).await.unwrap();
    assert_body_memory_refusal(&answer_of(s).await);
    within(Duration::from_secs(5), used(3 * LARGE)).await;

    // A small call fits in what is left, and is served meanwhile.
    let r = send_call(&a, 10).await;
    assert_eq!(r.status(), 200);

    // One held body completes: it is forwarded, and its memory given back.
    let mut first = held.remove(0);
    first
        .write_all(&bodies[0].as_bytes()[LARGE / 2..])
        .await
        .unwrap();
    let got = answer_of(first).await;
    assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    within(Duration::from_secs(5), used(2 * LARGE)).await;
    // Now a large body fits again.
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(padded_call(11, LARGE))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The upstream saw the small call and the two large bodies that fit,
    // whole; neither refused body, nor the two still held.
    let ids: Vec<serde_json::Value> = up
        .seen()
        .iter()
        .map(|s| serde_json::from_slice::<serde_json::Value>(&s.body).unwrap()["id"].clone())
        .collect();
    assert_eq!(ids, [10, 1, 11]);
    assert_eq!(up.seen()[1].body, bodies[0].as_bytes());
    assert_refusals(&p, "body_memory", 2);
    drop(held);
    within(Duration::from_secs(5), used(0)).await;
}

#[tokio::test]
async fn a_source_whose_connections_are_all_busy_gets_503_at_its_cap() {
    let up = Upstream::start().await;
    let p = Proxy::start_with(Proxy::dir(), |c| {
        c.max_connections_per_source = 2;
    })
    .await;
    let hung = p.agent("gh", &up.url("/hang"), "agent").await;
    let other = p.agent("gh2", &up.url("/mcp"), "other").await;
    let path = hung.url.strip_prefix(&p.base()).unwrap().to_string();
    let from = |last: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, last], 0)))
            .unwrap();
        socket.connect(p.addr).await.unwrap()
    };
    // Two requests from 127.0.0.2 that the upstream never answers: both
    // of its connections are busy.
    let call = tools_call(1, "t");
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\n\
         content-length: {}\r\n\r\n{call}",
        hung.token,
        call.len()
    );
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = from(2).await;
        s.write_all(request.as_bytes()).await.unwrap();
        busy.push(s);
    }
    within(Duration::from_secs(5), || async { up.seen().len() == 2 }).await;

    // A third from 127.0.0.2 is answered 503 and closed, before it sends
    // anything; a busy connection is never cut to make room.
    let got = answer_of(from(2).await).await;
    assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
    assert!(got.contains("\r\nretry-after: 1\r\n"), "{got}");
    assert!(got.contains("\"code\":-32015"), "{got}");
    assert!(got.contains("--max-connections-per-source"), "{got}");
    // Another source is served meanwhile.
    let r = send_call(&other, 2).await;
    assert_eq!(r.status(), 200);
    assert_eq!(up.seen().len(), 3);
    assert_refusals(&p, "source_connections", 1);
    drop(busy);
}

/// A body sent one byte per chunk reaches the upstream whole, with every
/// byte in order (the body is joined as it comes: frames after the first
/// are copied into one buffer, not kept one by one).
#[tokio::test]
async fn a_body_sent_one_byte_per_chunk_reaches_the_upstream_whole() {
    let up = Upstream::start().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let path = a.url.strip_prefix(&p.base()).unwrap().to_string();
    let call = padded_call(9, 3000);
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\
         authorization: Bearer {}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n",
        a.token
    );
    let mut s = open_request(&p, &head, b"").await;
    for b in call.as_bytes() {
        // One write per chunk, so that most arrive as frames of their own.
        s.write_all(format!("1\r\n{}\r\n", *b as char).as_bytes())
            .await
            .unwrap();
        s.flush().await.unwrap();
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let got = answer_of(s).await;
    assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, call.as_bytes());
}
