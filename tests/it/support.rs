//! Builders for the integration tests: a recording upstream that can stream
//! SSE on the test's schedule, a tessera data plane on an ephemeral port
//! with a temporary data dir, and the CLI run as a separate process.
//!
//! The suite runs twice: as the `it` test binary on SQLite (a file in each
//! test's data dir) and as the `postgres` test binary (tests/postgres.rs)
//! on Postgres, where each data dir gets a database of its own, created on
//! the server named by `TESSERA_TEST_POSTGRES` and dropped with the dir.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// The stored secret every test credential uses; it must never reach a
/// caller, a log or the data dir in clear.
pub const SECRET: &str = "upstream-secret-Zq8mX1vP";

/// What reached the upstream.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub path: String,
    /// The request target exactly as sent (origin form for HTTP/1.1).
    pub target: String,
    /// The connection it arrived on (tessera's side of it).
    pub peer: SocketAddr,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// An in-process MCP-ish upstream. Paths:
/// - `/mcp`: answers a JSON-RPC result echoing the method, with
///   `Set-Cookie`, `WWW-Authenticate` and `Mcp-Session-Id` headers;
/// - `/deny`: 401 with a `WWW-Authenticate` challenge;
/// - `/hang`: never answers;
/// - `/slow`: answers a JSON result after 300 ms (a request in flight);
/// - `/redirect`: a 302 to another origin;
/// - `/redirect-home`: a 302 to a relative `/c/…` (which the caller would
///   resolve against tessera);
/// - `/redirect-leak`: a 307 to another origin carrying the request's
///   `Authorization` value in its query;
/// - `/sse`: an event stream fed by the test through `sse_sender()`;
/// - `/close`: a normal answer, then the connection is closed;
/// - `/reject`: 400 with a JSON-RPC error (an upstream refusing a request,
///   as one may before it has read the body);
/// - `/sse-tools`: a `tools/list` answered over SSE (a comment, a progress
///   notification, then the result split over two `data:` lines), sent in
///   7-byte pieces so events straddle frames.
///
/// - `/echo`: reflects the request's headers, in a JSON body and the
///   `Authorization` value in an `X-Echo` header;
/// - `/echo-sse`: an SSE stream of events carrying the `Authorization` (or
///   `X-Api-Key`) value, the n-th event split into two frames at its n-th
///   byte.
///
/// Anywhere else a `tools/list` is answered with [`TOOLS`] and a cursor.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    sse: Arc<Mutex<Option<mpsc::Sender<Bytes>>>>,
    sse_opened: Arc<Notify>,
    /// Signalled each time a connection to the upstream ends.
    conn_closed: Arc<Notify>,
}

type UpBody = BoxBody<Bytes, Infallible>;

/// The tools the upstream lists.
pub const TOOLS: [&str; 4] = ["search", "delete_repo", "drop_table", "read_file"];

pub fn tools_result(id: &serde_json::Value) -> serde_json::Value {
    let tools: Vec<_> = TOOLS
        .iter()
        .map(|n| serde_json::json!({"name": n, "inputSchema": {"type": "object"}}))
        .collect();
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools, "nextCursor": "c2"}})
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sse = Arc::new(Mutex::new(None));
        let sse_opened = Arc::new(Notify::new());
        let conn_closed = Arc::new(Notify::new());
        let (s, q, o, c) = (
            seen.clone(),
            sse.clone(),
            sse_opened.clone(),
            conn_closed.clone(),
        );
        tokio::spawn(async move {
            loop {
                let (stream, peer) = listener.accept().await.unwrap();
                let (s, q, o, c) = (s.clone(), q.clone(), o.clone(), c.clone());
                tokio::spawn(async move {
                    let svc =
                        service_fn(move |req| answer(req, peer, s.clone(), q.clone(), o.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    c.notify_waiters();
                });
            }
        });
        Upstream {
            addr,
            seen,
            sse,
            sse_opened,
            conn_closed,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// A future that resolves when a connection to the upstream next ends.
    /// Create it before the action that should close one.
    pub fn connection_closed(&self) -> impl std::future::Future<Output = ()> + '_ {
        let n = self.conn_closed.notified();
        async move {
            tokio::time::timeout(Duration::from_secs(5), n)
                .await
                .expect("no upstream connection closed within 5 s")
        }
    }

    /// Wait until an SSE stream is open and return its sender. Dropping the
    /// sender ends the stream; `sender.closed()` resolves when the proxy
    /// dropped the upstream side.
    pub async fn sse_sender(&self) -> mpsc::Sender<Bytes> {
        loop {
            let notified = self.sse_opened.notified();
            if let Some(tx) = self.sse.lock().unwrap().take() {
                return tx;
            }
            tokio::time::timeout(Duration::from_secs(5), notified)
                .await
                .expect("no SSE stream opened");
        }
    }
}

async fn answer(
    req: Request<Incoming>,
    peer: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    sse: Arc<Mutex<Option<mpsc::Sender<Bytes>>>>,
    opened: Arc<Notify>,
) -> Result<Response<UpBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        method: parts.method.clone(),
        path: path.clone(),
        target: parts.uri.to_string(),
        peer,
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let full = |b: String| Full::new(Bytes::from(b)).boxed();
    let resp = match parts.uri.path() {
        "/deny" => Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header(
                "www-authenticate",
                "Bearer resource_metadata=\"http://evil.example/meta\"",
            )
            .body(full("nope".into())),
        "/hang" => std::future::pending().await,
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Response::builder()
                .header("content-type", "application/json")
                .body(full(
                    r#"{"jsonrpc":"2.0","id":1,"result":{"slow":true}}"#.into(),
                ))
        }
        "/close" => Response::builder()
            .header("connection", "close")
            .header("content-type", "application/json")
            .body(full("{}".into())),
        "/reject" => Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header("content-type", "application/json")
            .body(full(
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"rejected"}}"#
                    .into(),
            )),
        "/redirect-home" => Response::builder()
            .status(StatusCode::FOUND)
            .header("location", "/c/someone-elses-connection")
            .body(full(String::new())),
        "/redirect-leak" => {
            let auth = parts.headers.get("authorization").cloned();
            let auth = auth.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("");
            Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(
                    "location",
                    format!("https://elsewhere.example/?auth={auth}"),
                )
                .body(full(String::new()))
        }
        "/redirect" => Response::builder()
            .status(StatusCode::FOUND)
            .header("location", "http://elsewhere.example/steal")
            .body(full(String::new())),
        "/sse-tools" => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let result = tools_result(&v["id"]).to_string();
            let (head, tail) = result.split_at(result.find("\"result\"").unwrap());
            let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
            let text = format!(
                ": keep-alive\n\nevent: message\r\ndata: {progress}\r\n\r\nid: 7\ndata: {head}\ndata: {tail}\n\n"
            );
            let pieces: Vec<Result<Frame<Bytes>, Infallible>> = text
                .as_bytes()
                .chunks(7)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                    pieces,
                ))))
        }
        // An SSE answer (to any method) of exactly the bytes the query's
        // `events` holds (base64url), in one frame.
        "/sse-raw" => {
            use base64::Engine;
            let q = parts.uri.query().unwrap_or("");
            let events = q.strip_prefix("events=").unwrap_or("");
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(events)
                .unwrap_or_default();
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Full::new(Bytes::from(bytes)).boxed())
        }
        // An answer of exactly the bytes the query's `body` holds
        // (base64url), with the Content-Type `ctype` (JSON if none; its
        // UTF-8 bytes as they are), one byte per frame when `split=1`,
        // the status `status` (200 if none) and a `location` if given.
        "/json-raw" => {
            use base64::Engine;
            let q: std::collections::HashMap<String, String> =
                url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
                    .into_owned()
                    .collect();
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(q.get("body").map(String::as_str).unwrap_or(""))
                .unwrap_or_default();
            let ctype = q
                .get("ctype")
                .cloned()
                .unwrap_or_else(|| "application/json".into());
            let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                if q.get("split").map(String::as_str) == Some("1") {
                    bytes
                        .chunks(1)
                        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                        .collect()
                } else {
                    vec![Ok(Frame::data(Bytes::from(bytes)))]
                };
            let status: u16 = q.get("status").and_then(|s| s.parse().ok()).unwrap_or(200);
            let mut b = Response::builder().status(status).header(
                "content-type",
                http::HeaderValue::from_bytes(ctype.as_bytes()).unwrap(),
            );
            if let Some(l) = q.get("location") {
                b = b.header("location", l.as_str());
            }
            b.body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
        }
        // A form that cannot be sent where asked (not a header name, say).
        "/reflect" => reflect(&parts, &body).or_else(|_| {
            Response::builder()
                .status(StatusCode::UNPROCESSABLE_ENTITY)
                .body(full("unsendable".into()))
        }),
        "/echo" => {
            let headers: serde_json::Map<String, serde_json::Value> = parts
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            let auth = parts.headers.get("authorization").cloned();
            let mut b = Response::builder().header("content-type", "application/json");
            if let Some(a) = auth {
                b = b.header("x-echo", a);
            }
            b.body(full(serde_json::json!({ "headers": headers }).to_string()))
        }
        "/echo-sse" => {
            let auth = parts
                .headers
                .get("authorization")
                .or_else(|| parts.headers.get("x-api-key"))
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            let event = format!("data: {{\"auth\":\"{auth}\"}}\n\n").into_bytes();
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..=event.len())
                .flat_map(|i| [event[..i].to_vec(), event[i..].to_vec()])
                .map(|b| Ok(Frame::data(Bytes::from(b))))
                .collect();
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                    frames,
                ))))
        }
        // `/stream`: the same, reached as a sub-path (`/c/<id>/sse` is the
        // connection's address itself).
        "/sse" | "/stream" => {
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            *sse.lock().unwrap() = Some(tx);
            opened.notify_waiters();
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .header("set-cookie", "upstream_session=1")
                .body(BodyExt::boxed(StreamBody::new(stream)))
        }
        _ => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let one = |v: &serde_json::Value| {
                if v["method"] == "tools/list" {
                    tools_result(&v["id"])
                } else {
                    serde_json::json!({
                        "jsonrpc": "2.0", "id": v["id"],
                        "result": { "echo": v["method"], "path": path },
                    })
                }
            };
            // A batch gets an array of answers.
            let reply = match &v {
                serde_json::Value::Array(batch) => batch.iter().map(one).collect(),
                v => one(v),
            };
            Response::builder()
                .header("content-type", "application/json")
                .header("set-cookie", "upstream_session=1")
                .header("www-authenticate", "Bearer realm=\"upstream\"")
                .header("mcp-session-id", "sess-1")
                .body(full(reply.to_string()))
        }
    };
    Ok(resp.unwrap())
}

/// `/reflect`: the injected credential reflected in a form the query
/// chooses, as a hostile or careless upstream could:
/// - `enc=I,J,…`: the encodings of `tessera::redact::leaks::Encoding::ALL` applied
///   in turn (none: as it came);
/// - `whole=1`: the whole header value (`Bearer …`), else the secret alone;
/// - `at=json|sse|header|name|split`: in a JSON-RPC result's text, in an
///   SSE event sent one byte per frame, in a response header's value, as
///   a header's name, or cut in three across two values of one header and
///   a third field;
/// - `coding=gzip|deflate|br|zstd|…`: the body compressed so, whatever the
///   request accepted (any other token is sent as is, uncompressed);
/// - a `tools/list` request is answered with a tool whose description is
///   the form.
///
/// A form that cannot be sent where asked (a header name with a `%` in it)
/// gets 422.
fn reflect(parts: &http::request::Parts, body: &[u8]) -> http::Result<Response<UpBody>> {
    use tessera::redact::leaks::{encode_chain, Encoding};
    let q: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let arg = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let sent = parts
        .headers
        .get("authorization")
        .or_else(|| parts.headers.get("x-api-key"))
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let secret: &[u8] = match (arg("whole"), sent.iter().position(|&b| b == b' ')) {
        ("1", _) | (_, None) => &sent,
        (_, Some(sp)) => &sent[sp + 1..],
    };
    let chain: Vec<Encoding> = arg("enc")
        .split(',')
        .filter_map(|i| i.parse::<usize>().ok())
        .map(|i| Encoding::ALL[i])
        .collect();
    let form = String::from_utf8_lossy(&encode_chain(&chain, secret, 7)).into_owned();
    let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = if request["method"] == "tools/list" {
        let tool = serde_json::json!({"name": "search", "description": form, "inputSchema": {"type": "object"}});
        serde_json::json!({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": [tool]}})
    } else {
        serde_json::json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": form}]}})
    }
    .to_string();
    let mut b = Response::builder();
    let mut body = text.clone().into_bytes();
    match arg("at") {
        "sse" => {
            b = b.header("content-type", "text/event-stream");
            body = format!("id: 1\ndata: {text}\n\n").into_bytes();
        }
        "header" => {
            b = b
                .header("content-type", "application/json")
                .header("x-reflect", form.as_str());
        }
        "name" => {
            b = b
                .header("content-type", "application/json")
                .header(format!("x-{}", form.to_ascii_lowercase()), "1");
        }
        "split" => {
            let n = form.len() / 3;
            b = b
                .header("content-type", "application/json")
                .header("x-split", &form[..n])
                .header("x-split", &form[n..2 * n])
                .header("x-rest", &form[2 * n..]);
        }
        _ => b = b.header("content-type", "application/json"),
    }
    let coding = arg("coding");
    if !coding.is_empty() {
        body = compress(coding, &body);
        b = b.header("content-encoding", coding);
    }
    // One byte per frame: every split of a form between frames.
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = body
        .chunks(1)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    b.body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
        frames,
    ))))
}

/// `body` in a content coding (an unknown one leaves it as it is).
pub fn compress(coding: &str, body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(body).unwrap();
            e.finish().unwrap()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(body).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
            e.write_all(body).unwrap();
            drop(e);
            out
        }
        "zstd" => zstd::encode_all(body, 3).unwrap(),
        _ => body.to_vec(),
    }
}

/// An upstream on raw TCP (no hyper) that reads requests as Python's stdlib
/// `http.server` does on a kept-alive connection: each request's head, never
/// its body, so whatever a body leaves on the connection is read as the
/// next request. Every request is answered with the same bytes and the
/// connection kept open. It records every request line it reads.
pub struct HeadOnlyUpstream {
    pub addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl HeadOnlyUpstream {
    /// Answer every request with `answer` (a whole response).
    pub async fn start(answer: Vec<u8>) -> HeadOnlyUpstream {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (seen, answer) = (lines.clone(), Bytes::from(answer));
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (seen, answer) = (seen.clone(), answer.clone());
                tokio::spawn(async move {
                    let (rd, mut wr) = s.into_split();
                    let mut rd = tokio::io::BufReader::new(rd);
                    let mut line = Vec::new();
                    loop {
                        // The request line, then header lines up to an
                        // empty one; a line cut short by the close is not
                        // a request.
                        line.clear();
                        let n = rd.read_until(b'\n', &mut line).await.unwrap_or(0);
                        if n == 0 || !line.ends_with(b"\n") {
                            return;
                        }
                        let text = String::from_utf8_lossy(&line).trim_end().to_string();
                        seen.lock().unwrap().push(text);
                        loop {
                            line.clear();
                            let n = rd.read_until(b'\n', &mut line).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            if line == b"\r\n" || line == b"\n" {
                                break;
                            }
                        }
                        if wr.write_all(&answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HeadOnlyUpstream { addr, lines }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request line read so far, in order.
    pub fn request_lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// Whether this test binary runs the suite on Postgres.
pub fn on_postgres() -> bool {
    env!("CARGO_CRATE_NAME") == "postgres"
}

/// The Postgres server the `postgres` leg creates its databases on.
pub fn postgres_server() -> String {
    std::env::var("TESSERA_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// Run `f` to completion on a runtime of its own in another thread: for
/// the database chores of sync helpers and `Drop`, which may be called on a
/// test's runtime thread.
fn on_the_side<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
    .unwrap()
}

/// The database each data dir uses on the Postgres leg, by data dir path.
static DATABASES: std::sync::LazyLock<
    Mutex<std::collections::HashMap<std::path::PathBuf, String>>,
> = std::sync::LazyLock::new(Default::default);

/// The `TESSERA_DATABASE_URL` of a data dir (None: SQLite in the dir).
pub fn database_url(dir: &std::path::Path) -> Option<String> {
    DATABASES.lock().unwrap().get(dir).cloned()
}

/// A temporary data dir and, on the Postgres leg, a fresh database that is
/// dropped with it.
pub struct DataDir {
    dir: tempfile::TempDir,
    database: Option<String>,
}

impl DataDir {
    /// A store on this dir's database, opened as another process would.
    pub async fn store(&self) -> tessera::store::Store {
        let url = database_url(self.path()).map(|u| u.parse().unwrap());
        tessera::store::Store::open(self.path(), url.as_ref())
            .await
            .unwrap()
    }

    pub fn new() -> DataDir {
        let dir = tempfile::tempdir().unwrap();
        let database = on_postgres().then(|| {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("tessera_test_{}_{n}", std::process::id());
            let server = postgres_server();
            let create = format!("CREATE DATABASE {name}");
            let s = server.clone();
            on_the_side(async move { admin_sql(&s, &create).await })
                .unwrap_or_else(|e| panic!("the Postgres leg needs the server at {server} (set TESSERA_TEST_POSTGRES): {e}"));
            let mut url = url::Url::parse(&server).unwrap();
            url.set_path(&name);
            DATABASES
                .lock()
                .unwrap()
                .insert(dir.path().to_path_buf(), url.to_string());
            name
        });
        DataDir { dir, database }
    }

    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if let Some(name) = self.database.take() {
            DATABASES.lock().unwrap().remove(self.dir.path());
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            let server = postgres_server();
            if let Err(e) = on_the_side(async move { admin_sql(&server, &drop).await }) {
                eprintln!("dropping the test database {name}: {e}");
            }
        }
    }
}

/// One statement on the Postgres server's admin database.
async fn admin_sql(server: &str, sql: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(server).await?;
    sqlx::query(sql).execute(&mut c).await?;
    c.close().await
}

/// Run `sql` on a data dir's database (SQLite file or Postgres), as a
/// test reaching behind tessera's back.
pub async fn raw_sql(dir: &std::path::Path, sql: &str) {
    sqlx::any::install_default_drivers();
    let url = database_url(dir)
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("tessera.db").display()));
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::query(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

/// The tessera binary, set up for a data dir (and its database). The
/// suite's upstreams run on loopback, so internal upstreams are allowed
/// (`tests/it/egress.rs` checks the refusals with the variable removed).
pub fn tessera(dir: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.env("TESSERA_DATA_DIR", dir);
    c.env("TESSERA_ALLOW_PRIVATE_UPSTREAMS", "true");
    // Many serve processes run at once: none may hold the default ops
    // port (a test that reads the ops listener names its own).
    c.env("TESSERA_OPS_LISTEN", "127.0.0.1:0");
    match database_url(dir) {
        Some(url) => c.env("TESSERA_DATABASE_URL", url),
        None => c.env_remove("TESSERA_DATABASE_URL"),
    };
    c
}

/// [`tessera`] as a tokio process: for a CLI that talks to servers running
/// on the test's own runtime.
pub fn tessera_async(dir: &std::path::Path) -> tokio::process::Command {
    tessera(dir).into()
}

/// A tessera data plane on 127.0.0.1:0 over a temporary data dir, with
/// its ops listener on another ephemeral port.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The ops listener (`/livez`, `/readyz`, `/metrics`).
    pub ops: SocketAddr,
    pub dir: DataDir,
    pub state: std::sync::Arc<tessera::state::State>,
    store: tessera::store::Store,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

/// Run the tessera CLI against a data dir.
pub fn cli(dir: &std::path::Path, args: &[&str]) -> Output {
    tessera(dir)
        .args(args)
        .env("TEST_SECRET", SECRET)
        .env_remove("TESSERA_MASTER_KEY")
        .output()
        .unwrap()
}

/// The last line of a command's stdout, asserting it succeeded.
pub fn last_line(o: &Output) -> String {
    assert!(
        o.status.success(),
        "command failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_string()
}

/// A registered caller and the connection URL it was given.
pub struct Agent {
    pub token: String,
    pub url: String,
}

impl Proxy {
    /// The `Mcp-Session-Id` tessera shows `a`'s caller for the upstream's
    /// session `upstream` (as if the upstream had answered with it): for
    /// tests that need several distinct sessions of one caller.
    pub fn bound_session(&self, a: &Agent, upstream: &str) -> String {
        let connection = a
            .url
            .rsplit("/c/")
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap();
        let snap = self.state.snapshot.load();
        let caller_id = snap.connections[connection].caller_id;
        let caller = snap.callers.values().find(|c| c.id == caller_id).unwrap();
        let mut h = http::HeaderMap::new();
        h.insert("mcp-session-id", upstream.parse().unwrap());
        let owner = tessera::proxy::session::Owner {
            caller_id,
            caller: &caller.name,
            connection,
        };
        tessera::proxy::session::for_caller(self.state.master_key(), owner, &mut h);
        h["mcp-session-id"].to_str().unwrap().to_string()
    }
}

impl Agent {
    /// A session opened through tessera: the `Mcp-Session-Id` the
    /// upstream answered (`sess-1` by [`Upstream`]'s default route) as
    /// tessera binds it to this caller and connection.
    pub async fn session(&self) -> String {
        let r = client()
            .post(&self.url)
            .bearer_auth(&self.token)
            .body(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        assert!(id.starts_with("sess-1."), "{id}");
        id
    }
}

impl Proxy {
    /// A data dir with nothing in it yet, not serving.
    pub fn dir() -> DataDir {
        DataDir::new()
    }

    pub async fn start(dir: DataDir) -> Proxy {
        Self::start_with(dir, |_| {}).await
    }

    pub async fn start_with(
        dir: DataDir,
        tweak: impl FnOnce(&mut tessera::config::ServeConfig),
    ) -> Proxy {
        Self::start_with_policies(dir, tweak, tessera::authz::cedar::Policies::builtin()).await
    }

    pub async fn start_with_policies(
        dir: DataDir,
        tweak: impl FnOnce(&mut tessera::config::ServeConfig),
        policies: tessera::authz::cedar::Policies,
    ) -> Proxy {
        let url = database_url(dir.path());
        Self::start_on(dir, url, tweak, policies).await
    }

    /// Serve `dir` with the store at `url` (None: SQLite in the dir): for
    /// a test that puts something between tessera and its database.
    pub async fn start_on(
        dir: DataDir,
        url: Option<String>,
        tweak: impl FnOnce(&mut tessera::config::ServeConfig),
        policies: tessera::authz::cedar::Policies,
    ) -> Proxy {
        Self::start_on_pool(dir, url, None, tweak, policies).await
    }

    /// Serve `dir` with a data plane whose store pool has at most `pool`
    /// connections (`serve --db-pool-size`).
    pub async fn start_with_pool(
        dir: DataDir,
        pool: u32,
        tweak: impl FnOnce(&mut tessera::config::ServeConfig),
        policies: tessera::authz::cedar::Policies,
    ) -> Proxy {
        let url = database_url(dir.path());
        Self::start_on_pool(dir, url, Some(pool), tweak, policies).await
    }

    async fn start_on_pool(
        dir: DataDir,
        url: Option<String>,
        pool: Option<u32>,
        tweak: impl FnOnce(&mut tessera::config::ServeConfig),
        policies: tessera::authz::cedar::Policies,
    ) -> Proxy {
        // Every data plane logs into the suite's capture, checked for the
        // canary secret by `assert_logs_lack`.
        logs();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let ops_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        ops_listener.set_nonblocking(true).unwrap();
        let ops = ops_listener.local_addr().unwrap();
        let mut cfg = tessera::config::ServeConfig::for_listen(addr);
        cfg.refresh_interval = Duration::from_millis(100);
        // The suite's upstreams run on loopback.
        cfg.egress.allow_private = true;
        tweak(&mut cfg);
        let url: Option<tessera::store::DatabaseUrl> = url.map(|u| u.parse().unwrap());
        let store = tessera::store::Store::open(dir.path(), url.as_ref())
            .await
            .unwrap();
        // The data plane runs on a thread and runtime of its own, with its
        // own store, as `tessera serve` runs in a process of its own: a
        // test blocked on a CLI command (`cli` waits for the process) does
        // not freeze it, whatever it holds at that moment (the audit
        // writer's transaction, say).
        let (started, ready) = tokio::sync::oneshot::channel();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = tessera::store::Store::open_with_pool(&path, url.as_ref(), pool)
                    .await
                    .unwrap();
                let key = tessera::crypto::keyring::MasterKey::load(None, &path).unwrap();
                // The process `tessera serve` runs, less what needs a
                // process of its own (signals, the admin listener, which
                // tests start beside it, and malloc_trim).
                let process = tessera::serve::Process {
                    config: cfg,
                    store,
                    key,
                    policies,
                    policy_dir: None,
                    policy_check: Duration::from_secs(1),
                    admin_listen: None,
                    ops_listener: Some(TcpListener::from_std(ops_listener).unwrap()),
                    shutdown_grace: Duration::from_secs(1),
                    release_free_memory: None,
                    log_filter: None,
                    traces: Default::default(),
                };
                let listener = TcpListener::from_std(listener).unwrap();
                let shutdown = async move {
                    let _ = rx.await;
                };
                let started = |state: &std::sync::Arc<tessera::state::State>| {
                    let _ = started.send(state.clone());
                };
                // A test may end while the audit trail is still written.
                let _ = tessera::serve::run(process, listener, shutdown, started).await;
            });
        });
        let state = ready.await.expect("the data plane started");
        Proxy {
            addr,
            ops,
            dir,
            state,
            store,
            _shutdown: tx,
        }
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        cli(self.dir.path(), args)
    }

    /// Wait until the data plane serves what the store holds now: the
    /// event the refresh task produces when it swaps in a new snapshot.
    pub async fn synced(&self) -> std::time::Duration {
        self.synced_within(Duration::from_secs(1)).await
    }

    /// [`Proxy::synced`], waiting up to `bound`.
    pub async fn synced_within(&self, bound: Duration) -> std::time::Duration {
        let want = self.store.revision().await.unwrap().data;
        let state = self.state.clone();
        within(bound, || {
            let state = state.clone();
            async move { state.snapshot.load().revision >= want }
        })
        .await
    }

    /// Register as [`register`] does, then wait until it is served.
    pub async fn agent(&self, cred: &str, upstream_url: &str, name: &str) -> Agent {
        let a = register(self.dir.path(), &self.base(), cred, upstream_url, name);
        self.synced().await;
        a
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn store(&self) -> &tessera::store::Store {
        &self.store
    }
}

/// Register a bearer credential `cred` for `upstream_url`, a caller `name`
/// and a connection between them in `dir`; the URL is built on `public`.
pub fn register(
    dir: &std::path::Path,
    public: &str,
    cred: &str,
    upstream_url: &str,
    name: &str,
) -> Agent {
    let o = cli(
        dir,
        &[
            "credential",
            "add",
            cred,
            "--upstream",
            upstream_url,
            "--secret-env",
            "TEST_SECRET",
        ],
    );
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("already exists"), "{err}");
    }
    let token = last_line(&cli(dir, &["caller", "add", name]));
    let url = last_line(&cli(
        dir,
        &[
            "connection",
            "add",
            "--caller",
            name,
            "--credential",
            cred,
            "--public-url",
            public,
        ],
    ));
    Agent { token, url }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Send `a` a `tools/call` of tool `t` with id `id`; the raw response.
pub async fn send_call(a: &Agent, id: u32) -> reqwest::Response {
    client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .body(tools_call(id, "t"))
        .send()
        .await
        .unwrap()
}

/// A `tools/call` body.
pub fn tools_call(id: u32, tool: &str) -> String {
    serde_json::json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":{}}}).to_string()
}

/// Poll `f` until it returns true, for at most `limit`; the elapsed time.
pub async fn within<F, Fut>(limit: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `tessera serve` run as its own process on a free port, its stderr read
/// as the test asks.
pub struct Served {
    pub child: tokio::process::Child,
    stderr: tokio::process::ChildStderr,
    pub log: String,
}

impl Served {
    /// Start `serve` on `dir` with `args` added, `env` set, and wait for
    /// the line that says it is serving.
    pub async fn start(
        dir: &std::path::Path,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Served {
        let mut child = tessera_async(dir)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut s = Served {
            child,
            stderr,
            log: String::new(),
        };
        s.wait_for("tessera serving").await;
        s
    }

    /// A free port to serve on (and to build connection URLs with first).
    pub fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    /// Read the log until it holds `needle`.
    pub async fn wait_for(&mut self, needle: &str) {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while !self.log.contains(needle) {
            let n = tokio::time::timeout(Duration::from_secs(10), self.stderr.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} in: {}", self.log))
                .unwrap();
            assert!(n > 0, "serve exited: {}", self.log);
            self.log.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }

    /// Send a signal (`TERM`, `HUP`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().unwrap().to_string();
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Read the log to its end (the process has been told to stop).
    pub async fn read_to_end(&mut self) {
        use tokio::io::AsyncReadExt;
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), self.stderr.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        self.log.push_str(&String::from_utf8_lossy(&rest));
    }
}

/// Assert that neither the data dir's files nor (on Postgres) its database
/// hold any of `needles` in clear.
pub fn assert_no_plaintext(dir: &std::path::Path, needles: &[&str]) {
    assert_no_plaintext_in_files(dir, needles);
    if let Some(url) = database_url(dir) {
        let needles: Vec<String> = needles.iter().map(|n| n.to_string()).collect();
        on_the_side(async move { assert_no_plaintext_in_postgres(&url, &needles).await });
    }
}

/// Every row of every table, as text (byte columns as hex), holds none of
/// `needles` in clear or hex-encoded.
async fn assert_no_plaintext_in_postgres(url: &str, needles: &[String]) {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(tables.iter().any(|t| t == "credentials"), "{tables:?}");
    for t in tables {
        let rows: Vec<String> = sqlx::query_scalar(&format!("SELECT t::text FROM {t} t"))
            .fetch_all(&mut c)
            .await
            .unwrap();
        for row in rows {
            for n in needles {
                let hex: String = n.bytes().map(|b| format!("{b:02x}")).collect();
                assert!(
                    !row.contains(n.as_str()) && !row.contains(&hex),
                    "table {t} holds a secret in clear"
                );
            }
        }
    }
}

/// Walk the data dir and assert no file holds any of `needles` in clear.
fn assert_no_plaintext_in_files(dir: &std::path::Path, needles: &[&str]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_no_plaintext_in_files(&path, needles);
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for n in needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == n.as_bytes()),
                "{} holds a secret in clear",
                path.display()
            );
        }
    }
}

/// The shipped default policy plus the named files of `policies/examples/`
/// (without `.cedar`), loaded the way `serve --policies` does.
pub fn policies_with(examples: &[&str]) -> tessera::authz::cedar::Policies {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::copy(root.join("default.cedar"), dir.path().join("default.cedar")).unwrap();
    for n in examples {
        let f = format!("{n}.cedar");
        std::fs::copy(root.join("examples").join(&f), dir.path().join(&f)).unwrap();
    }
    tessera::authz::cedar::Policies::load_dir(dir.path()).unwrap()
}

/// Every audit record written so far, oldest first (the queue flushed).
pub async fn audit_rows(p: &Proxy) -> Vec<tessera::store::model::AuditRecord> {
    assert!(
        p.state
            .audit
            .flush(std::time::Duration::from_secs(10))
            .await
    );
    p.store()
        .audit(&tessera::store::model::AuditQuery {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// POST a JSON-RPC body as the agent; the status and the JSON answer.
pub async fn post_json(a: &Agent, body: String) -> (u16, serde_json::Value) {
    let (status, _, v) = post_json_headers(a, body).await;
    (status, v)
}

/// [`post_json`], with the answer's headers.
pub async fn post_json_headers(
    a: &Agent,
    body: String,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    // Nothing a caller receives may hold the canary secret.
    let mut seen: Vec<u8> = Vec::new();
    for (k, v) in r.headers() {
        seen.extend_from_slice(k.as_str().as_bytes());
        seen.extend_from_slice(v.as_bytes());
    }
    let headers = r.headers().clone();
    let body = r.bytes().await.unwrap();
    seen.extend_from_slice(&body);
    assert!(
        !seen.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
        "the canary secret reached a caller"
    );
    (status, headers, serde_json::from_slice(&body).unwrap())
}

/// Every log line the in-process data planes wrote (all tests share one
/// subscriber), so tests can assert that no secret was ever logged.
static LOGS: std::sync::OnceLock<Arc<Mutex<Vec<u8>>>> = std::sync::OnceLock::new();

struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug,hyper=info,h2=info,rustls=info")
            .event_format(tessera::telemetry::log::Logfmt)
            .with_writer(move || LogSink(sink.clone()))
            .try_init();
        buf
    })
}

/// Every line logged so far, by any test's data plane, that holds
/// `needle`.
pub fn log_lines_with(needle: &str) -> Vec<String> {
    let logs = logs().lock().unwrap();
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// No line logged so far, by any test's data plane, holds one of these
/// (the suite's canary secret always among them).
pub fn assert_logs_lack(needles: &[&str]) {
    let logs = logs().lock().unwrap();
    assert!(!logs.is_empty(), "no log captured");
    for n in needles.iter().chain(&[SECRET]) {
        assert!(
            !logs.windows(n.len()).any(|w| w == n.as_bytes()),
            "a secret reached the log"
        );
    }
}

/// Send bytes as they are and read the whole answer (until tessera closes
/// the connection).
pub async fn raw_request(addr: SocketAddr, req: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    // Written beside the read: tessera may answer (413, say) and close
    // before a large request is all sent, which ends the write early.
    let req = req.to_vec();
    // The write half is kept (returned) rather than dropped when done:
    // dropping it would half-close the connection under the request.
    let writing = tokio::spawn(async move {
        let _ = wr.write_all(&req).await;
        wr
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    // Until tessera closes; a reset after its answer keeps what came.
    while let Ok(n) = rd.read(&mut buf).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    writing.abort();
    String::from_utf8_lossy(&out).into_owned()
}

/// What a [`TlsUpstream`] records of a request: version, target and
/// `Authorization`.
pub type TlsSeen = (http::Version, String, Option<http::HeaderValue>);

/// An HTTPS upstream on 127.0.0.1 with a self-signed certificate for
/// `localhost`, offering `alpn`: it answers "ok" and records each request's
/// version, target and `Authorization`.
pub struct TlsUpstream {
    pub port: u16,
    pub cert: rustls::pki_types::CertificateDer<'static>,
    /// TCP connections accepted.
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
    pub seen: Arc<Mutex<Vec<TlsSeen>>>,
}

impl TlsUpstream {
    /// Its self-signed certificate as a PEM file in `dir` (`ca.pem`), as
    /// `--upstream-ca-file` reads one.
    pub fn ca_pem(&self, dir: &std::path::Path) -> std::path::PathBuf {
        use base64::Engine;
        let path = dir.join("ca.pem");
        let b64 = base64::engine::general_purpose::STANDARD.encode(self.cert.as_ref());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        std::fs::write(
            &path,
            format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                lines.join("\n")
            ),
        )
        .unwrap();
        path
    }

    pub async fn start(alpn: &[&[u8]]) -> TlsUpstream {
        use std::sync::atomic::Ordering;
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = made.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
        let mut tls = rustls::ServerConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (acc, s) = (accepted.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                acc.fetch_add(1, Ordering::SeqCst);
                let (acceptor, s) = (acceptor.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req: Request<Incoming>| {
                        s.lock().unwrap().push((
                            req.version(),
                            req.uri().to_string(),
                            req.headers().get("authorization").cloned(),
                        ));
                        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok")))) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TlsUpstream {
            port,
            cert,
            accepted,
            seen,
        }
    }
}
