//! The benchmark's SSE client.
//!
//! - `bench-sse delay URL TOKEN EVENTS`: opens one stream to `URL?every_ms=…`
//!   (the caller adds the query), reads EVENTS timed events and prints
//!   `p50_us p90_us p99_us` of (receive time − the upstream's send time).
//! - `bench-sse hold URL TOKEN STREAMS`: opens STREAMS idle streams (each
//!   its own TCP connection), waits for every priming event, prints
//!   `open STREAMS`, and holds them until stdin reaches EOF.
//!
//! Both processes run on one machine, so the wall clock is shared.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: bench-sse delay|hold URL TOKEN N");
        std::process::exit(2);
    }
    let (mode, url, token, n) = (
        &args[1],
        &args[2],
        &args[3],
        args[4].parse::<usize>().expect("N"),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match mode.as_str() {
            "delay" => delay(url, token, n).await,
            "hold" => hold(url, token, n).await,
            _ => panic!("unknown mode {mode}"),
        }
    });
}

async fn open(uri: &Uri, token: &str) -> Result<(Sender, Incoming), String> {
    let authority = uri.authority().ok_or("URL has no host")?.clone();
    let tcp = TcpStream::connect(authority.as_str())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = Request::get(uri.clone())
        .header(header::HOST, authority.as_str())
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::ACCEPT, "text/event-stream")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let resp = tx
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("stream refused: {}", resp.status()));
    }
    Ok((tx, resp.into_body()))
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-sse: {msg}");
    std::process::exit(1)
}

/// Read frames until one holds a complete event; return its data line.
async fn next_event(body: &mut Incoming, buf: &mut Vec<u8>) -> Option<Bytes> {
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..end + 2).collect();
            let data = ev
                .split(|b| *b == b'\n')
                .find_map(|l| l.strip_prefix(b"data: ").or(l.strip_prefix(b"data:")))
                .unwrap_or_default();
            return Some(Bytes::copy_from_slice(data));
        }
        let frame = body.frame().await?.expect("stream broke");
        if let Ok(d) = frame.into_data() {
            buf.extend_from_slice(&d);
        }
    }
}

async fn delay(url: &str, token: &str, events: usize) {
    let uri: Uri = url.parse().expect("URL");
    let (_tx, mut body) = open(&uri, token).await.unwrap_or_else(|e| fail(&e));
    let mut buf = Vec::new();
    let mut delays = Vec::with_capacity(events);
    while delays.len() < events {
        let data = next_event(&mut body, &mut buf)
            .await
            .expect("stream ended early");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let Ok(sent) = std::str::from_utf8(&data).unwrap_or("").parse::<u128>() else {
            continue; // the priming event
        };
        delays.push((now.saturating_sub(sent)) as f64 / 1000.0);
    }
    delays.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize];
    println!("{:.1} {:.1} {:.1}", q(0.5), q(0.9), q(0.99));
}

async fn hold(url: &str, token: &str, streams: usize) {
    let uri: Uri = url.parse().expect("URL");
    let mut held = Vec::with_capacity(streams);
    // Open in waves so the proxy's accept queue never overflows.
    for chunk in (0..streams).collect::<Vec<_>>().chunks(500) {
        let mut wave = tokio::task::JoinSet::new();
        for _ in chunk {
            let (uri, token) = (uri.clone(), token.to_string());
            wave.spawn(async move {
                let (tx, mut body) = open(&uri, &token).await?;
                let mut buf = Vec::new();
                next_event(&mut body, &mut buf)
                    .await
                    .ok_or("no priming event")?;
                Ok::<_, String>((tx, body))
            });
        }
        while let Some(r) = wave.join_next().await {
            match r {
                Ok(Ok(stream)) => held.push(stream),
                Ok(Err(e)) => fail(&format!("stream {} of {streams}: {e}", held.len() + 1)),
                Err(e) => fail(&e.to_string()),
            }
        }
    }
    println!("open {}", held.len());
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    drop(held);
}
