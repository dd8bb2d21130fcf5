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

/// A raw HTTP/1.1 answer: status 200, `head` lines (each `name: value`),
/// `body` framed by Content-Length.
fn answer(head: &[&[u8]], body: &[u8]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
    for h in head {
        out.extend_from_slice(h);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

/// A caller of `up` under the deny-list policy (`delete_repo` and
/// `drop_table` may not be called, so they must not be listed).
async fn denied_lister(up: &Scripted) -> (Proxy, Agent) {
    let p =
        Proxy::start_with_policies(Proxy::dir(), |_| {}, policies_with(&["tool-deny-list"])).await;
    let a = p.agent("gh", &up.url(), "agent").await;
    (p, a)
}

/// What a caller got for `method` (a POST of `body`): status, the
/// Content-Type it was told, and the body.
async fn ask(a: &Agent, method: http::Method, body: &str) -> (u16, String, Vec<u8>) {
    let mut req = client()
        .request(method.clone(), &a.url)
        .bearer_auth(&a.token)
        .header("accept", "application/json, text/event-stream");
    if method == http::Method::POST {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let Ok(mut r) = req.send().await else {
        return (0, String::new(), Vec::new());
    };
    let status = r.status().as_u16();
    let ctype = r
        .headers()
        .get("content-type")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut got = Vec::new();
    while let Ok(Some(c)) = r.chunk().await {
        got.extend_from_slice(&c);
    }
    (status, ctype, got)
}

const LIST: &str = r#"{"jsonrpc":"2.0","id":"l1","method":"tools/list","params":{}}"#;

/// The Python `mcp` client reads an SSE answer with `httpx`'s
/// `aiter_text()`, which decodes the bytes in the charset the
/// Content-Type names (`httpx2/_sse.py`, `Response.encoding`). tessera
/// reads events as UTF-8: a `tools/list` answer spelled in UTF-16 holds
/// no `tools` bytes and no backslash, so it passed unparsed, and the
/// client decoded the whole, unfiltered list.
#[tokio::test]
async fn an_sse_answer_in_another_charset_is_not_passed_on_unfiltered() {
    let list = tools_result(&"l1".into()).to_string();
    let event = format!("event: message\ndata: {list}\n\n");
    let utf16: Vec<u8> = event.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let up = Scripted::start(move |_| {
        answer(
            &[b"content-type: text/event-stream; charset=utf-16le"],
            &utf16,
        )
    })
    .await;
    let (_p, a) = denied_lister(&up).await;
    let (status, ctype, body) = ask(&a, http::Method::POST, LIST).await;
    // Decode as a client that honours the charset would.
    let charset = ctype
        .to_ascii_lowercase()
        .split(';')
        .find_map(|p| p.trim().strip_prefix("charset=").map(str::to_string));
    let text = match charset.as_deref() {
        Some("utf-16le") | Some("utf-16") => {
            let units: Vec<u16> = body
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16_lossy(&units)
        }
        _ => String::from_utf8_lossy(&body).into_owned(),
    };
    assert!(
        !text.contains("delete_repo"),
        "status {status}, content-type {ctype:?}, the client decoded: {text}"
    );
}

/// The TypeScript SDK reads any 2xx answer to its GET stream as SSE, and
/// never looks at its Content-Type (`_startOrAuthSse` hands the body to
/// `_handleSseStream`); it routes each result by its id. tessera filtered
/// only answers labelled `text/event-stream`, so a GET answer labelled
/// otherwise carried an unfiltered `tools/list` result to the client.
/// So did a POST answer whose type a client reads as SSE but tessera did
/// not (JavaScript's `trim()` drops a leading no-break space, a byte
/// 0xA0 in a header).
#[tokio::test]
async fn a_stream_labelled_otherwise_is_still_filtered() {
    let list = tools_result(&"l1".into()).to_string();
    let event = format!("data: {list}\n\n");
    for (method, ctype) in [
        (
            http::Method::GET,
            &b"content-type: application/octet-stream"[..],
        ),
        (http::Method::GET, b"content-type: application/json"),
        (http::Method::GET, b"x-no-content-type: 1"),
        (http::Method::POST, b"content-type: \xa0text/event-stream"),
    ] {
        let (ev, ct) = (event.clone(), ctype.to_vec());
        let up = Scripted::start(move |_| answer(&[&ct], ev.as_bytes())).await;
        let (_p, a) = denied_lister(&up).await;
        let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
        let (status, got, body) = ask(&a, method.clone(), ping).await;
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("delete_repo"),
            "{method} answered {status} {got:?}: {text}"
        );
    }
}

/// Go's `encoding/json` (the decode of Go MCP clients that use it, such
/// as mark3labs/mcp-go) matches member names ignoring case and folds `ſ`
/// to `s`; the last match wins. tessera looked for `result`, `tools` and
/// `name` spelled exactly, so `Result`/`Tools`/`toolſ` lists passed
/// unfiltered, and a tool listed as `{"name":"search","Name":"delete_repo"}`
/// was kept for `search` and read as `delete_repo`.
#[tokio::test]
async fn a_list_spelled_in_other_letter_case_is_filtered() {
    let list = tools_result(&"l1".into()).to_string();
    let variants = [
        list.replacen("\"tools\"", "\"Tools\"", 1),
        list.replacen("\"result\"", "\"RESULT\"", 1),
        list.replacen("\"tools\"", "\"tool\u{17f}\"", 1),
        list.replacen(
            "{\"name\":\"delete_repo\"",
            "{\"name\":\"search\",\"Name\":\"delete_repo\"",
            1,
        ),
    ];
    for v in variants {
        for sse in [true, false] {
            let (ct, body): (&[u8], String) = if sse {
                (b"content-type: text/event-stream", format!("data: {v}\n\n"))
            } else {
                (b"content-type: application/json", v.clone())
            };
            let up = Scripted::start(move |_| answer(&[ct], body.as_bytes())).await;
            let (_p, a) = denied_lister(&up).await;
            let (status, _, body) = ask(&a, http::Method::POST, LIST).await;
            let text = String::from_utf8_lossy(&body);
            assert!(!text.contains("delete_repo"), "sse {sse}, {status}: {text}");
        }
    }
}
