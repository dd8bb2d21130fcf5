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

use crate::metrics::{Metrics, Outcome};

/// The two answers, built once per server.
pub struct HeadAnswers {
    timeout: Bytes,
    framing: Bytes,
    metrics: Arc<Metrics>,
}

/// A complete response that closes the connection, with a JSON-RPC body.
fn closing_response(status: &str, message: &str) -> Bytes {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32600, "message": message},
    })
    .to_string();
    Bytes::from(format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ))
}

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
            metrics,
        })
    }

    /// Writes `response` if the socket takes it at once, and counts it.
    fn send(&self, io: &TcpStream, status: u16, reason: &'static str, what: &str) {
        // A few hundred bytes into a socket's send buffer: written at once
        // or not at all (the client may be gone), never waited for.
        let response = if status == 408 {
            &self.timeout
        } else {
            &self.framing
        };
        let _ = io.try_write(response);
        self.metrics.request(Outcome::Refused, status, Some(reason));
        tracing::info!(
            target: "tessera::access",
            verdict = "refused",
            reason,
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
    /// Part of a head read; `tail` holds its last bytes, for a blank line
    /// split across reads.
    Partial { tail: [u8; 3] },
    /// The head's end was read, or the client closed its side: nothing to
    /// answer here until tessera writes again.
    Done,
    /// The head was refused and the connection is ending.
    Refused,
}

/// The longest header name checked, with its colon.
const NAME: usize = b"transfer-encoding:".len();

/// The framing headers among one head's lines.
#[derive(Clone, Copy, Default, Debug)]
struct Framing {
    /// The start of the line under way, while it may still be one of the
    /// two names.
    line: [u8; NAME],
    kept: u8,
    keeping: bool,
    content_length: u8,
    transfer_encoding: u8,
}

impl Framing {
    /// Follows the head's bytes; the request line is never a header, so
    /// keeping starts at the first line break.
    fn scan(&mut self, mut bytes: &[u8]) {
        loop {
            let end = memchr::memchr(b'\n', bytes);
            if self.keeping {
                let line = &bytes[..end.unwrap_or(bytes.len())];
                let kept = usize::from(self.kept);
                let take = (NAME - kept).min(line.len());
                self.line[kept..kept + take].copy_from_slice(&line[..take]);
                self.kept += take as u8;
                if usize::from(self.kept) == NAME || end.is_some() {
                    self.classify();
                }
            }
            let Some(end) = end else { return };
            bytes = &bytes[end + 1..];
            self.kept = 0;
            // Most lines are ruled out by their first byte.
            self.keeping = bytes
                .first()
                .is_none_or(|b| matches!(b | 0x20, b'c' | b't'));
        }
    }

    fn classify(&mut self) {
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

    fn twice(&self) -> bool {
        self.content_length > 1 || (self.content_length > 0 && self.transfer_encoding > 0)
    }
}

/// A socket whose head is answered here when hyper cannot answer it.
pub struct Watched {
    io: TcpStream,
    head: Head,
    framing: Framing,
    answers: Arc<HeadAnswers>,
}

impl Watched {
    pub fn new(io: TcpStream, answers: Arc<HeadAnswers>) -> Watched {
        Watched {
            io,
            head: Head::Awaited,
            framing: Framing::default(),
            answers,
        }
    }
}

/// The state after `read` arrives in state `head` (not `Done` or
/// `Refused`), and how many of its bytes belong to the head.
fn advance(head: Head, read: &[u8]) -> (Head, usize) {
    let tail = match head {
        Head::Done | Head::Refused => return (head, 0),
        _ if read.is_empty() => return (Head::Done, 0),
        Head::Partial { tail } => tail,
        _ => [0; 3],
    };
    // The blank line may straddle the previous read: look at its last
    // three bytes followed by the first three of this one.
    let mut seam = [0u8; 6];
    seam[..3].copy_from_slice(&tail);
    let n = read.len().min(3);
    seam[3..3 + n].copy_from_slice(&read[..n]);
    if let Some(at) = memchr::memmem::find(&seam[..3 + n], b"\r\n\r\n") {
        return (Head::Done, at + 1);
    }
    if let Some(at) = memchr::memmem::find(read, b"\r\n\r\n") {
        return (Head::Done, at + 4);
    }
    // The last three bytes read so far.
    let mut next = [0u8; 3];
    let keep = 3 - n;
    next[..keep].copy_from_slice(&tail[n..]);
    next[keep..].copy_from_slice(&read[read.len() - n..]);
    (Head::Partial { tail: next }, read.len())
}

impl Watched {
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
        if this.head == Head::Awaited {
            this.framing = Framing::default();
        }
        let (head, len) = advance(this.head, read);
        this.framing.scan(&read[..len]);
        this.head = head;
        if head == Head::Done && !read.is_empty() && this.framing.twice() {
            // hyper never sees this head's end: to it the connection
            // closed (with a partial head, which it does not answer).
            buf.set_filled(before);
            this.head = Head::Refused;
            this.answers.send(
                &this.io,
                400,
                "framing",
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
        if matches!(self.head, Head::Partial { .. }) {
            self.answers.send(
                &self.io,
                408,
                "request_timeout",
                "the request head did not arrive in time",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> Head {
        chunks.iter().fold(Head::Awaited, |h, c| advance(h, c).0)
    }

    #[test]
    fn a_head_is_done_at_its_blank_line_however_it_is_split() {
        let head = b"POST /c/x HTTP/1.1\r\nHost: a\r\n\r\n{}";
        assert_eq!(run(&[head]), Head::Done);
        for cut in 1..head.len() {
            assert_eq!(run(&[&head[..cut], &head[cut..]]), Head::Done, "{cut}");
        }
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert_eq!(run(&bytes), Head::Done);
    }

    #[test]
    fn a_head_without_its_blank_line_is_partial() {
        assert!(matches!(
            run(&[b"POST /c/x HTTP/1.1\r\n", b"Host: a\r\n"]),
            Head::Partial { .. }
        ));
        assert!(matches!(run(&[b"P"]), Head::Partial { .. }));
        // A lone CRLF pair split oddly is not a blank line.
        assert!(matches!(
            run(&[b"GET / HTTP/1.1\r", b"\nX: y\r\n"]),
            Head::Partial { .. }
        ));
    }

    #[test]
    fn a_closed_side_or_nothing_read_is_not_a_head() {
        assert_eq!(run(&[]), Head::Awaited);
        assert_eq!(run(&[b"POST / HT", b""]), Head::Done);
    }

    /// Counts the framing headers of `head` fed in `chunks` of `size`.
    fn framing(head: &[u8], size: usize) -> Framing {
        let mut f = Framing::default();
        let mut state = Head::Awaited;
        for chunk in head.chunks(size) {
            let (next, len) = advance(state, chunk);
            f.scan(&chunk[..len]);
            state = next;
        }
        f
    }

    #[test]
    fn framing_headers_are_counted_however_the_head_is_split() {
        let cases: [(&[u8], u8, u8, bool); 7] = [
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}", 1, 0, false),
            (b"POST / HTTP/1.1\r\ncontent-length: 2\r\nCONTENT-LENGTH: 2\r\n\r\n", 2, 0, true),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", 1, 1, true),
            (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", 0, 1, false),
            // Names that merely start alike, values that look like names,
            // and a body after the blank line are not counted.
            (b"POST / HTTP/1.1\r\nContent-Lengthy: 1\r\nX: content-length: 2\r\nContent-Length: 3\r\n\r\ncontent-length: 9\r\n", 1, 0, false),
            (b"POST / HTTP/1.1\r\nContent-Type: a\r\nTE: trailers\r\ncontent-length: 0\r\n\r\n", 1, 0, false),
            // The request line is not a header.
            (b"content-length: / HTTP/1.1\r\ncontent-length: 1\r\n\r\n", 1, 0, false),
        ];
        for (head, cl, te, twice) in cases {
            for size in 1..=head.len() {
                let f = framing(head, size);
                let what = format!("{} in chunks of {size}", String::from_utf8_lossy(head));
                assert_eq!((f.content_length, f.transfer_encoding), (cl, te), "{what}");
                assert_eq!(f.twice(), twice, "{what}");
            }
        }
    }
}
