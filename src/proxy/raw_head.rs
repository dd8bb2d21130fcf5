//! The request head as it arrives on the socket, before hyper parses it.
//!
//! Two answers hyper cannot give are given here:
//!
//! - **408 for a head that does not arrive in time.** hyper's header-read
//!   timeout ends a connection whose head is not complete within
//!   `--header-timeout-ms`, but sends nothing: the client cannot tell a
//!   slow request from a network fault. When hyper drops a connection with
//!   a head under way, the socket gets a 408 with a JSON-RPC body first.
//!   An idle keep-alive connection (nothing read since the last answer) is
//!   closed silently, and so is one whose client has closed its side.
//! - **400 for a head that frames its body twice:** `Content-Length` more
//!   than once, or `Content-Length` with `Transfer-Encoding`. RFC 9112
//!   lets a server resolve both (hyper folds equal lengths and lets
//!   `Transfer-Encoding` win), and tessera re-frames what it forwards, so
//!   nothing could be smuggled through; but these are the shapes request
//!   smuggling is made of, and a security proxy refuses them outright. The
//!   read that completes such a head is withheld from hyper, the 400 is
//!   written, and hyper sees the connection end: the request never reaches
//!   the handler, let alone the upstream.
//!
//! Two more are given for [`crate::limits::capacity::Connections`]: a 503 for a
//! connection over `--max-connections-per-source` ([`HeadAnswers::refuse`],
//! before any request is read), and a 503 rather than the 408 for a
//! half-sent head whose connection was evicted to make room for another.
//!
//! [`Watched`] follows each exchange just enough for both: bytes read since
//! tessera last wrote, and no blank line (the head's end) among them yet,
//! plus a count of the two framing headers among the head's lines. A head
//! read after an answer is checked; one pipelined behind another request
//! before that request is answered is left to hyper (RFC 9112 handling, as
//! above), since telling it from the body before it needs the framing this
//! wrapper does not parse.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::telemetry::metrics::{Metrics, Outcome, Reason};
use crate::telemetry::traceparent::RequestId;

/// The answers, built once per server; each gets a fresh request id as it
/// is sent ([`Answer::with_id`]).
pub struct HeadAnswers {
    timeout: Answer,
    framing: Answer,
    over_source: Answer,
    evicted: Answer,
    metrics: Arc<Metrics>,
}

/// A complete response that closes the connection, with a JSON-RPC body,
/// and where its request id goes: the `X-Request-Id` header and
/// `error.data.request_id`, as in the handler's refusals (no request was
/// parsed, so the id is always minted).
struct Answer {
    bytes: Bytes,
    /// The offsets of the id's 32 bytes in the header and in the body.
    at: [usize; 2],
}

/// Stands for the id while an answer is built: no message holds it.
const ID_SLOT: &str = "________________________________";

impl Answer {
    /// This answer with `id` written in (a copy of a few hundred bytes;
    /// these answers are rare).
    fn with_id(&self, id: &RequestId) -> Bytes {
        let mut b = self.bytes.to_vec();
        for at in self.at {
            b[at..at + ID_SLOT.len()].copy_from_slice(id.as_str().as_bytes());
        }
        Bytes::from(b)
    }
}

/// A complete response that closes the connection, with a JSON-RPC body.
fn closing_response(status: &str, message: &str) -> Answer {
    closing_response_with(status, -32600, "", message)
}

/// The same, with a JSON-RPC `code` and `extra` header lines (each ending
/// in CRLF).
fn closing_response_with(status: &str, code: i32, extra: &str, message: &str) -> Answer {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message, "data": {"request_id": ID_SLOT}},
    })
    .to_string();
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}x-request-id: {ID_SLOT}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (head, body) = (text.find(ID_SLOT), text.rfind(ID_SLOT));
    let at = [
        head.expect("the id's header"),
        body.expect("the id in the body"),
    ];
    assert_ne!(at[0], at[1], "the id has two places");
    Answer {
        bytes: Bytes::from(text),
        at,
    }
}

/// The JSON-RPC code of tessera's connection-limit answers.
pub const CONNECTIONS_CODE: i32 = -32015;

impl HeadAnswers {
    pub fn new(timeout: std::time::Duration, metrics: Arc<Metrics>) -> Arc<HeadAnswers> {
        Arc::new(HeadAnswers {
            timeout: closing_response(
                "408 Request Timeout",
                &format!(
                    "request timeout: the request head did not arrive within {} ms",
                    timeout.as_millis()
                ),
            ),
            framing: closing_response(
                "400 Bad Request",
                "bad request: the head frames the body twice (Content-Length more than \
                 once, or with Transfer-Encoding); send one Content-Length, or \
                 Transfer-Encoding: chunked alone",
            ),
            over_source: closing_response_with(
                "503 Service Unavailable",
                CONNECTIONS_CODE,
                "retry-after: 1\r\n",
                "service unavailable: this source has as many connections open as tessera \
                 allows one source (--max-connections-per-source), each with a request in \
                 progress; retry once one ends",
            ),
            evicted: closing_response_with(
                "503 Service Unavailable",
                CONNECTIONS_CODE,
                "retry-after: 1\r\n",
                "service unavailable: tessera is at its connection limit and closed this \
                 connection, whose request head was not complete, to make room for another; \
                 send the whole head at once",
            ),
            metrics,
        })
    }

    /// Answers a connection over `--max-connections-per-source` (it is
    /// then closed, before a request was read).
    pub fn refuse(&self, io: &TcpStream) {
        self.send(
            io,
            &self.over_source,
            503,
            Reason::SourceConnections,
            "a connection over the per-source connection limit",
        );
    }

    /// Writes `response` if the socket takes it at once, and counts it.
    fn send(&self, io: &TcpStream, response: &Answer, status: u16, reason: Reason, what: &str) {
        let request_id = RequestId::for_request(None);
        // A few hundred bytes into a socket's send buffer: written at once
        // or not at all (the client may be gone), never waited for.
        let _ = io.try_write(&response.with_id(&request_id));
        self.metrics.request(Outcome::Refused, status, Some(reason));
        tracing::info!(
            target: "tessera::access",
            request_id = request_id.as_str(),
            verdict = "refused",
            reason = reason.as_str(),
            status,
            "{what}"
        );
    }
}

/// Where the exchange on a connection stands, as far as heads go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Head {
    /// Nothing read since tessera last wrote (or since the connection
    /// opened).
    Awaited,
    /// Part of a head read, followed by `scan`.
    Partial,
    /// The head's end was read, or the client closed its side: nothing to
    /// answer here until tessera writes again.
    Done,
    /// The head was refused and the connection is ending.
    Refused,
}

/// The longest header name checked, with its colon.
const NAME: usize = b"transfer-encoding:".len();

/// Where a scan stands within a head's lines.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
enum At {
    /// Before the request line: empty lines are skipped, as hyper's parser
    /// (httparse) skips them.
    #[default]
    Start,
    /// Inside the request line or a header line.
    Line,
    /// Just after a line's `\n`.
    LineStart,
    /// After a `\r` at a line's start: `\n` next makes the blank line.
    LineStartCr,
}

/// One head's lines as they arrive, read the way hyper reads them (a line
/// ends at `\n`, with or without `\r`; the head ends at an empty line):
/// where the head ends, and how often the two framing headers occur.
#[derive(Clone, Copy, Default, Debug)]
struct Scan {
    at: At,
    /// The start of the header line under way, while it may still be one
    /// of the two names.
    line: [u8; NAME],
    kept: u8,
    keeping: bool,
    content_length: u8,
    transfer_encoding: u8,
}

impl Scan {
    /// Follows `bytes`; `Some(n)` when the head ends with `bytes[..n]`.
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            match self.at {
                At::Start => {
                    if !matches!(bytes[i], b'\r' | b'\n') {
                        self.at = At::Line;
                        continue;
                    }
                    i += 1;
                }
                At::LineStart | At::LineStartCr => {
                    match (self.at, bytes[i]) {
                        (_, b'\n') => {
                            self.at = At::Start;
                            return Some(i + 1);
                        }
                        (At::LineStart, b'\r') => {
                            self.at = At::LineStartCr;
                            i += 1;
                            continue;
                        }
                        // A header line (or, after a lone CR, something
                        // hyper refuses anyway). Most lines are ruled out
                        // by their first byte.
                        (_, first) => {
                            self.kept = 0;
                            self.keeping = matches!(first | 0x20, b'c' | b't');
                            self.at = At::Line;
                        }
                    }
                }
                At::Line => {
                    let rest = &bytes[i..];
                    let end = memchr::memchr(b'\n', rest);
                    if self.keeping {
                        self.keep(&rest[..end.unwrap_or(rest.len())], end.is_some());
                    }
                    match end {
                        None => return None,
                        Some(n) => {
                            i += n + 1;
                            self.at = At::LineStart;
                        }
                    }
                }
            }
        }
        None
    }

    /// Keeps the start of a header line until it can be told apart.
    fn keep(&mut self, part: &[u8], line_ends: bool) {
        let kept = usize::from(self.kept);
        let take = (NAME - kept).min(part.len());
        self.line[kept..kept + take].copy_from_slice(&part[..take]);
        self.kept += take as u8;
        if usize::from(self.kept) < NAME && !line_ends {
            return;
        }
        self.keeping = false;
        let line = &self.line[..usize::from(self.kept)];
        let named =
            |name: &[u8]| line.len() >= name.len() && line[..name.len()].eq_ignore_ascii_case(name);
        if named(b"content-length:") {
            self.content_length = self.content_length.saturating_add(1);
        } else if named(b"transfer-encoding:") {
            self.transfer_encoding = self.transfer_encoding.saturating_add(1);
        }
    }

    /// The head frames its body twice.
    fn twice(&self) -> bool {
        self.content_length > 1 || (self.content_length > 0 && self.transfer_encoding > 0)
    }
}

/// For the fuzz target: feeds `head` to a scan in two parts, split at
/// `split`, and returns where it saw the head end and the counts of
/// `Content-Length` and `Transfer-Encoding` lines.
#[doc(hidden)]
pub fn scan_for_fuzzing(head: &[u8], split: usize) -> (Option<usize>, u8, u8) {
    let mut scan = Scan::default();
    let split = split.min(head.len());
    let end = scan
        .feed(&head[..split])
        .or_else(|| scan.feed(&head[split..]).map(|n| split + n));
    (end, scan.content_length, scan.transfer_encoding)
}

/// A socket whose head is answered here when hyper cannot answer it.
pub struct Watched {
    io: TcpStream,
    head: Head,
    scan: Scan,
    answers: Arc<HeadAnswers>,
    /// Whether the connection was evicted (see [`crate::limits::capacity`]).
    slot: Arc<crate::limits::capacity::Slot>,
}

impl Watched {
    pub fn new(
        io: TcpStream,
        answers: Arc<HeadAnswers>,
        slot: Arc<crate::limits::capacity::Slot>,
    ) -> Watched {
        Watched {
            io,
            head: Head::Awaited,
            scan: Scan::default(),
            answers,
            slot,
        }
    }

    /// tessera wrote: the next bytes read start a new head.
    fn answered(&mut self) {
        if self.head != Head::Refused {
            self.head = Head::Awaited;
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.head == Head::Refused {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if !matches!(r, Poll::Ready(Ok(()))) || this.head == Head::Done {
            return r;
        }
        let read = &buf.filled()[before..];
        if read.is_empty() {
            // The client closed its side: nothing more will arrive.
            this.head = Head::Done;
            return r;
        }
        if this.head == Head::Awaited {
            this.scan = Scan::default();
        }
        if this.scan.feed(read).is_none() {
            this.head = Head::Partial;
            return r;
        }
        this.head = Head::Done;
        if this.scan.twice() {
            // hyper never sees this head's end: to it the connection
            // closed (with a partial head, which it does not answer).
            buf.set_filled(before);
            this.head = Head::Refused;
            this.answers.send(
                &this.io,
                &this.answers.framing,
                400,
                Reason::Framing,
                "the request head framed its body twice",
            );
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.answered();
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.answered();
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.head == Head::Partial && self.slot.evicted() {
            self.answers.send(
                &self.io,
                &self.answers.evicted,
                503,
                Reason::ConnectionEvicted,
                "an idle connection with a half-sent head closed to make room",
            );
        } else if self.head == Head::Partial {
            self.answers.send(
                &self.io,
                &self.answers.timeout,
                408,
                Reason::RequestTimeout,
                "the request head did not arrive in time",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `head` in chunks of `size`: where the head ended (an offset
    /// into `head`), and the scan.
    fn chunked(head: &[u8], size: usize) -> (Option<usize>, Scan) {
        let mut scan = Scan::default();
        let mut at = 0;
        for chunk in head.chunks(size) {
            if let Some(n) = scan.feed(chunk) {
                return (Some(at + n), scan);
            }
            at += chunk.len();
        }
        (None, scan)
    }

    #[test]
    fn a_head_ends_at_its_empty_line_however_it_is_split() {
        let cases: [(&[u8], Option<usize>); 7] = [
            (b"POST /c/x HTTP/1.1\r\nHost: a\r\n\r\n{}", Some(31)),
            // A bare LF ends a line too, as hyper reads it.
            (b"POST /c/x HTTP/1.1\nHost: a\n\n{}", Some(28)),
            (b"POST /c/x HTTP/1.1\r\nHost: a\n\r\n{}", Some(30)),
            // Empty lines before the request line are skipped.
            (b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", Some(22)),
            (b"POST /c/x HTTP/1.1\r\n", None),
            (b"POST /c/x HTTP/1.1\r\nHost: a\r\n", None),
            // A CR that is not followed by LF does not end the line.
            (b"GET / HTTP/1.1\r\nX: a\r\rb\r\n", None),
        ];
        for (head, end) in cases {
            for size in 1..=head.len() {
                let what = format!("{:?} in chunks of {size}", String::from_utf8_lossy(head));
                assert_eq!(chunked(head, size).0, end, "{what}");
            }
        }
    }

    #[test]
    fn framing_headers_are_counted_however_the_head_is_split() {
        let cases: [(&[u8], u8, u8, bool); 9] = [
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}", 1, 0, false),
            (b"POST / HTTP/1.1\r\ncontent-length: 2\r\nCONTENT-LENGTH: 2\r\n\r\n", 2, 0, true),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", 1, 1, true),
            (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", 0, 1, false),
            // Bare LF line ends and empty lines before the request line do
            // not hide a second length.
            (b"POST / HTTP/1.1\ncontent-length: 2\ncontent-length: 2\n\n", 2, 0, true),
            (b"\r\n\r\nPOST / HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n", 2, 0, true),
            // Names that merely start alike, values that look like names,
            // and a body after the empty line are not counted.
            (b"POST / HTTP/1.1\r\nContent-Lengthy: 1\r\nX: content-length: 2\r\nContent-Length: 3\r\n\r\ncontent-length: 9\r\n", 1, 0, false),
            (b"POST / HTTP/1.1\r\nContent-Type: a\r\nTE: trailers\r\ncontent-length: 0\r\n\r\n", 1, 0, false),
            // The request line is not a header.
            (b"content-length: / HTTP/1.1\r\ncontent-length: 1\r\n\r\n", 1, 0, false),
        ];
        for (head, cl, te, twice) in cases {
            for size in 1..=head.len() {
                let (end, scan) = chunked(head, size);
                let what = format!("{:?} in chunks of {size}", String::from_utf8_lossy(head));
                assert!(end.is_some(), "{what}");
                assert_eq!(
                    (scan.content_length, scan.transfer_encoding),
                    (cl, te),
                    "{what}"
                );
                assert_eq!(scan.twice(), twice, "{what}");
            }
        }
    }

    /// Each answer carries its id in the header and in the body, and its
    /// Content-Length still counts the body.
    #[test]
    fn an_answer_names_its_request_id_twice() {
        let id = RequestId::for_request(None);
        let a = closing_response_with("503 Service Unavailable", -32015, "retry-after: 1\r\n", "m");
        let text = String::from_utf8(a.with_id(&id).to_vec()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("\r\nx-request-id: {id}\r\n")),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}\r\n", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["data"]["request_id"], id.as_str());
        assert_eq!(v["error"]["code"], -32015);
        assert!(!text.contains(ID_SLOT));
    }
}
