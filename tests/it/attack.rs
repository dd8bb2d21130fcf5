//! White-box attacks on the credential-never-reaches-the-caller promise.
//! Each test here failed on the code it was written against.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// An upstream on raw TCP: for each request, reads the head and body and
/// answers `answer(authorization value)` bytes as they are, then closes.
pub struct Scripted {
    pub addr: SocketAddr,
}

impl Scripted {
    pub async fn start<F>(answer: F) -> Scripted
    where
        F: Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let Some(auth) = read_request(&mut s).await else {
                        return;
                    };
                    let _ = s.write_all(&answer(&auth)).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Scripted { addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// Read one request; the value of its `authorization` field.
async fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf[got..]))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        got += n;
        let text = String::from_utf8_lossy(&buf[..got]).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let head = &text[..head_end];
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got >= head_end + 4 + len {
                let auth = head
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: "))
                    .unwrap_or("")
                    .to_string();
                return Some(auth);
            }
        }
        if got == buf.len() {
            return None;
        }
    }
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

pub fn gunzip(b: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).ok()?;
    Some(out)
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Status, headers (as `name: value` lines) and body a caller gets.
pub async fn call(a: &Agent) -> (u16, String, Vec<u8>) {
    let r = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream")
        .body(tools_call(1, "search"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let mut head = String::new();
    for (k, v) in r.headers() {
        head.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
    }
    let body = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
    (status, head, body)
}

/// An upstream that gzips its answer (which echoes the request's
/// `Authorization`) and names `Content-Encoding` in its `Connection`
/// field: tessera drops the hop-by-hop fields before it reads the codings,
/// so the coded body passes the redactor unread and the caller gunzips it.
#[tokio::test]
async fn a_coding_named_in_connection_is_not_passed_on_unread() {
    let up = Scripted::start(|auth| {
        // Ordinary, compressible JSON: deflate codes it with Huffman codes,
        // so no plain run of the secret is left in the coded bytes.
        let body = gzip(
            serde_json::json!({"jsonrpc":"2.0","id":1,"result":{"echo": auth, "pad": "ab".repeat(200)}})
                .to_string()
                .as_bytes(),
        );
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
             connection: content-encoding\r\ncontent-encoding: gzip\r\n\
             content-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out
    })
    .await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p.agent("gh", &up.url(), "bot").await;
    let (status, head, body) = call(&a).await;
    assert!(!contains(head.as_bytes(), SECRET.as_bytes()));
    assert!(!contains(&body, SECRET.as_bytes()));
    // What a caller gets must not decode to the secret either: either the
    // answer was decoded (and redacted) or refused.
    let decoded = gunzip(&body).unwrap_or_default();
    assert!(
        !contains(&decoded, SECRET.as_bytes()),
        "status {status}, headers:\n{head}\nthe caller gunzipped: {}",
        String::from_utf8_lossy(&decoded)
    );
}
