//! The answer to a request head that does not arrive in time: 408.
//!
//! hyper's header-read timeout ends a connection whose head is not complete
//! within `--header-timeout-ms`, but sends nothing: the client cannot tell
//! a slow request from a network fault. [`Watched`] sits between hyper and
//! the socket and follows each exchange just enough to know whether a head
//! is under way: bytes read since tessera last wrote, and no blank line
//! (the head's end) among them yet. When hyper drops the connection in that
//! state, the socket gets a 408 with a JSON-RPC body before it closes.
//!
//! An idle keep-alive connection (nothing read since the last answer) is
//! closed silently, as before, and so is one whose client has closed its
//! side. A head that is complete is never answered here: its request is
//! hyper's and the handler's to answer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::metrics::{Metrics, Outcome};

/// What a timed-out head is answered with, built once per server.
pub struct HeadTimeout {
    response: Bytes,
    metrics: Arc<Metrics>,
}

impl HeadTimeout {
    pub fn new(timeout: std::time::Duration, metrics: Arc<Metrics>) -> Arc<HeadTimeout> {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": -32600,
                "message": format!(
                    "request timeout: the request head did not arrive within {} ms",
                    timeout.as_millis()
                ),
            },
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        Arc::new(HeadTimeout {
            response: Bytes::from(response),
            metrics,
        })
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
}

/// A socket whose unfinished head is answered 408 when hyper gives up.
pub struct Watched {
    io: TcpStream,
    head: Head,
    on_timeout: Arc<HeadTimeout>,
}

impl Watched {
    pub fn new(io: TcpStream, on_timeout: Arc<HeadTimeout>) -> Watched {
        Watched {
            io,
            head: Head::Awaited,
            on_timeout,
        }
    }
}

/// The state after `read` arrives in state `head`.
fn advance(head: Head, read: &[u8]) -> Head {
    let tail = match head {
        Head::Done => return Head::Done,
        _ if read.is_empty() => return Head::Done,
        Head::Awaited => [0; 3],
        Head::Partial { tail } => tail,
    };
    // The blank line may straddle the previous read: look at its last
    // three bytes followed by the first three of this one.
    let mut seam = [0u8; 6];
    seam[..3].copy_from_slice(&tail);
    let n = read.len().min(3);
    seam[3..3 + n].copy_from_slice(&read[..n]);
    if memchr::memmem::find(&seam[..3 + n], b"\r\n\r\n").is_some()
        || memchr::memmem::find(read, b"\r\n\r\n").is_some()
    {
        return Head::Done;
    }
    // The last three bytes read so far.
    let mut next = [0u8; 3];
    let keep = 3 - n;
    next[..keep].copy_from_slice(&tail[n..]);
    next[keep..].copy_from_slice(&read[read.len() - n..]);
    Head::Partial { tail: next }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            if self.head != Head::Done {
                self.head = advance(self.head, &buf.filled()[before..]);
            }
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
        self.head = Head::Awaited;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.head = Head::Awaited;
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
        if !matches!(self.head, Head::Partial { .. }) {
            return;
        }
        // A few hundred bytes into an idle socket's send buffer: written at
        // once or not at all (the client may be gone), never waited for.
        let _ = self.io.try_write(&self.on_timeout.response);
        self.on_timeout
            .metrics
            .request(Outcome::Refused, 408, Some("request_timeout"));
        tracing::info!(
            target: "tessera::access",
            verdict = "refused",
            reason = "request_timeout",
            status = 408,
            "the request head did not arrive in time"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> Head {
        chunks.iter().fold(Head::Awaited, |h, c| advance(h, c))
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
}
