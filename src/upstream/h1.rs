//! One HTTP/1.1 exchange with an upstream, driven from the request's own
//! task: write the request, read the response head, stream the body.
//!
//! Why not hyper's client connection: it runs every connection as a task of
//! its own and talks to it through a channel, so each request crosses two
//! task hand-offs and each open stream costs a second task, the channel and
//! 16 KiB of connection buffers. A forwarder sends one request at a time on
//! a connection and already holds the whole request body, so the exchange
//! is short enough to write plainly. BENCHMARKS.md has the before and after.
//!
//! What it accepts from the upstream follows RFC 9112: a response head of at
//! most [`MAX_HEAD`] bytes and [`MAX_HEADERS`] fields, interim 1xx answers
//! skipped, the body framed by `Transfer-Encoding: chunked` (no other
//! transfer coding), by one agreed `Content-Length`, or by the connection's
//! end. Anything else is an [`Error::Invalid`], and a connection is only
//! reused after a complete, cleanly framed response that did not ask to
//! close and, when the request had a body, was a 2xx.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The largest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields accepted in a response head.
pub const MAX_HEADERS: usize = 128;
/// The longest chunk-size line (with extensions) or trailer section.
const MAX_CHUNK_LINE: usize = 4 * 1024;
const MAX_TRAILERS: usize = 16 * 1024;
/// Bodies up to this size are copied behind the head and sent in one write.
const COALESCE: usize = 16 * 1024;
/// The most read at once from the upstream.
const READ_CHUNK: usize = 16 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the upstream connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("the upstream closed the connection before its answer was complete")]
    Closed,
    #[error("the upstream's answer is not valid HTTP/1.1: {0}")]
    Invalid(&'static str),
}

/// Serialize `req` for an origin server: the origin-form target, the
/// headers as given (the caller set `Host`), and a `Content-Length` for the
/// body. Header values cannot hold CR, LF or NUL (`http` refuses them), so
/// nothing here can split the request.
pub fn encode_request(req: &Request<Bytes>) -> Vec<u8> {
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let body = req.body();
    let fields: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let inline = if body.len() <= COALESCE {
        body.len()
    } else {
        0
    };
    let mut out =
        Vec::with_capacity(req.method().as_str().len() + target.len() + fields + 48 + inline);
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // A bodiless GET or DELETE says nothing; anything else states its length.
    if !body.is_empty() || !matches!(*req.method(), Method::GET | Method::DELETE) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body[..inline]);
    out
}

/// Send `req` on `io` and read the response head. The body streams from
/// `io` as the returned [`Body`] is polled.
pub async fn exchange<T>(mut io: T, req: &Request<Bytes>) -> Result<Response<Body<T>>, Error>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let wire = encode_request(req);
    io.write_all(&wire).await?;
    if req.body().len() > COALESCE {
        io.write_all(req.body()).await?;
    }
    io.flush().await?;

    let mut buf = BytesMut::new();
    loop {
        if let Some(head) = parse_head(&mut buf, req.method() == Method::HEAD)? {
            // An answer that is not a success may come before the upstream
            // read the request's body: servers commonly refuse (400, 401,
            // 404, 413, …) on the head alone. The bytes of the body left
            // unread would then be parsed as the start of the next request
            // on this connection, which may carry another caller's request
            // (a body crafted as a whole request is request smuggling).
            // Nothing says whether they were read, so such a connection is
            // never reused. A 2xx is taken to mean the body was consumed.
            let unread_body = !req.body().is_empty() && !head.status.is_success();
            let reusable = head.keep_alive && !unread_body;
            let mut body = Body {
                io: Some(io),
                buf,
                state: head.framing,
                reusable,
            };
            if body.state == State::Length(0) {
                body.finish();
            }
            let mut parts = Response::new(()).into_parts().0;
            parts.status = head.status;
            parts.headers = head.headers;
            return Ok(Response::from_parts(parts, body));
        }
        if buf.len() >= MAX_HEAD {
            return Err(Error::Invalid("the response head is larger than 64 KiB"));
        }
        buf.reserve(4096);
        if io.read_buf(&mut buf).await? == 0 {
            return Err(Error::Closed);
        }
    }
}

struct Head {
    status: StatusCode,
    headers: HeaderMap,
    framing: State,
    keep_alive: bool,
}

/// Parse one final response head from the front of `buf`, skipping interim
/// 1xx answers. `None`: more bytes are needed.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, Error> {
    loop {
        // Uninitialized: zeroing 128 fields per answer shows in profiles.
        let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut r = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut r,
            buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Error::Invalid("more than 128 header fields"))
            }
            Err(_) => return Err(Error::Invalid("the response head does not parse")),
        };
        let code = r.code.unwrap_or_default();
        let status = StatusCode::from_u16(code)
            .map_err(|_| Error::Invalid("the status code is out of range"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            // tessera never asks for an upgrade (Upgrade is hop-by-hop).
            return Err(Error::Invalid("an unrequested protocol switch"));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let mut keep_alive = r.version == Some(1);
        let mut length: Option<u64> = None;
        let mut chunked = false;
        // Framing is judged on the raw fields; the values are then taken
        // from the head's own bytes, not copied one allocation each.
        // (httparse has already refused a name or value byte that `http`
        // would refuse.)
        let base = buf.as_ptr() as usize;
        let span = |b: &[u8]| {
            let at = b.as_ptr() as usize - base;
            (at as u32, (at + b.len()) as u32)
        };
        let mut kept = [((0, 0), (0, 0)); MAX_HEADERS];
        let mut n = 0;
        for f in r.headers.iter() {
            let name = f.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                for n in f.value.split(|&b| b == b',') {
                    let n = parse_length(n)?;
                    if length.is_some_and(|l| l != n) {
                        return Err(Error::Invalid("conflicting Content-Length values"));
                    }
                    length = Some(n);
                }
                // The body's size hint carries the length on.
                continue;
            }
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                // tessera never sends TE, so the only transfer coding an
                // upstream may apply is chunked, once. Any other (`gzip,
                // chunked`, `gzip`, a second field) is refused: read as
                // framing only, its bytes would reach the caller still
                // coded, and a coded echo of the stored secret would pass
                // the redactor unseen.
                if chunked || !f.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(Error::Invalid("a transfer coding other than chunked"));
                }
                chunked = true;
                continue;
            }
            if name.eq_ignore_ascii_case(b"connection") && has_token(f.value, b"close") {
                keep_alive = false;
            }
            kept[n] = (span(name), span(f.value));
            n += 1;
        }
        let head = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(n);
        for &((name_at, name_end), (value_at, value_end)) in &kept[..n] {
            let name = HeaderName::from_bytes(&head[name_at as usize..name_end as usize])
                .map_err(|_| Error::Invalid("a header name is not valid"))?;
            let value =
                HeaderValue::from_maybe_shared(head.slice(value_at as usize..value_end as usize))
                    .map_err(|_| Error::Invalid("a header value is not valid"))?;
            headers.append(name, value);
        }
        let framing = if head_request
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            State::Length(0)
        } else {
            match (chunked, length) {
                (true, l) => {
                    // Both framings at once is a smuggling shape: read it
                    // as chunked, then never reuse the connection.
                    keep_alive &= l.is_none();
                    State::Chunk(Chunk::Size)
                }
                (false, None) => State::Eof,
                (false, Some(n)) => State::Length(n),
            }
        };
        if framing == State::Eof {
            keep_alive = false;
        }
        return Ok(Some(Head {
            status,
            headers,
            framing,
            keep_alive,
        }));
    }
}

fn parse_length(digits: &[u8]) -> Result<u64, Error> {
    let digits = digits.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(Error::Invalid("Content-Length is not a number"));
    }
    Ok(digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

fn has_token(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Where the body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes are left.
    Length(u64),
    /// Chunked transfer coding.
    Chunk(Chunk),
    /// Everything until the upstream closes.
    Eof,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers(usize),
}

/// A response body read straight from the upstream connection, frame by
/// frame, as the caller's side asks for it. No buffer is held while the
/// upstream is quiet (an idle SSE stream keeps only the connection).
pub struct Body<T> {
    io: Option<T>,
    /// Bytes read but not yet returned.
    buf: BytesMut,
    state: State,
    reusable: bool,
}

impl<T: AsyncRead + Unpin> Body<T> {
    /// The connection, if the response ended cleanly and the connection can
    /// carry another request.
    pub fn take_reusable(&mut self) -> Option<T> {
        if self.state == State::Done && self.reusable && self.buf.is_empty() {
            self.io.take()
        } else {
            None
        }
    }

    /// Read more from the upstream into `buf`. `Ok(0)`: the upstream closed.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        if self.buf.is_empty() {
            // Drop what the head or earlier frames left allocated.
            self.buf = BytesMut::new();
        }
        // Read on the stack and keep only what arrived: an idle stream holds
        // no read buffer.
        let mut stack = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut rb = ReadBuf::uninit(&mut stack);
        ready!(Pin::new(io).poll_read(cx, &mut rb))?;
        self.buf.extend_from_slice(rb.filled());
        Poll::Ready(Ok(rb.filled().len()))
    }

    /// Hand out up to `n` buffered bytes.
    fn take(&mut self, n: u64) -> Bytes {
        let k = (self.buf.len() as u64).min(n) as usize;
        let out = self.buf.split_to(k).freeze();
        if self.buf.is_empty() {
            // Let the frame own the allocation alone.
            self.buf = BytesMut::new();
        }
        out
    }

    fn finish(&mut self) {
        self.state = State::Done;
        if !self.reusable {
            self.io = None;
        }
    }
}

impl<T: AsyncRead + Unpin> http_body::Body for Body<T> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = ready!(self.poll_next(cx));
        if let Some(Err(_)) = frame {
            // A broken body ends the exchange and the connection.
            self.io = None;
            self.state = State::Done;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done | State::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl<T: AsyncRead + Unpin> Body<T> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self;
        loop {
            // What the state needs buffered before it can go on; 0: nothing.
            let need = match this.state {
                State::Done => return Poll::Ready(None),
                State::Length(0) => {
                    this.finish();
                    continue;
                }
                State::Length(n) | State::Chunk(Chunk::Data(n)) if !this.buf.is_empty() => {
                    let data = this.take(n);
                    let left = n - data.len() as u64;
                    match this.state {
                        // Done at once: the connection goes back with the
                        // last frame, not one poll later.
                        State::Length(_) if left == 0 => this.finish(),
                        State::Length(_) => this.state = State::Length(left),
                        _ if left == 0 => this.state = State::Chunk(Chunk::DataEnd),
                        _ => this.state = State::Chunk(Chunk::Data(left)),
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::Eof if !this.buf.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(this.take(u64::MAX)))))
                }
                State::Length(_) | State::Chunk(Chunk::Data(_)) | State::Eof => 1,
                State::Chunk(Chunk::Size) => match httparse::parse_chunk_size(&this.buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        this.buf.advance(used);
                        this.state = State::Chunk(if size == 0 {
                            Chunk::Trailers(0)
                        } else {
                            Chunk::Data(size)
                        });
                        continue;
                    }
                    Ok(httparse::Status::Partial) if this.buf.len() < MAX_CHUNK_LINE => {
                        this.buf.len() + 1
                    }
                    _ => {
                        return Poll::Ready(Some(Err(Error::Invalid("a chunk size is not valid"))))
                    }
                },
                State::Chunk(Chunk::DataEnd) => {
                    if this.buf.len() >= 2 {
                        if &this.buf[..2] != b"\r\n" {
                            return Poll::Ready(Some(Err(Error::Invalid(
                                "a chunk is longer than its size",
                            ))));
                        }
                        this.buf.advance(2);
                        this.state = State::Chunk(Chunk::Size);
                        continue;
                    }
                    2
                }
                State::Chunk(Chunk::Trailers(seen)) => {
                    // Trailer fields are not passed on; skip to the empty line.
                    match this.buf.windows(2).position(|w| w == b"\r\n") {
                        Some(0) => {
                            this.buf.advance(2);
                            this.finish();
                            continue;
                        }
                        Some(i) if seen + i + 2 <= MAX_TRAILERS => {
                            this.buf.advance(i + 2);
                            this.state = State::Chunk(Chunk::Trailers(seen + i + 2));
                            continue;
                        }
                        None if seen + this.buf.len() < MAX_TRAILERS => this.buf.len() + 1,
                        _ => {
                            return Poll::Ready(Some(Err(Error::Invalid(
                                "the trailer section is too large",
                            ))))
                        }
                    }
                }
            };
            debug_assert!(this.buf.len() < need);
            match ready!(this.poll_fill(cx)) {
                Ok(0) if this.state == State::Eof => {
                    this.reusable = false;
                    this.finish();
                }
                Ok(0) => return Poll::Ready(Some(Err(Error::Closed))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(Error::Io(e)))),
            }
        }
    }
}

/// Whether an idle connection is still usable: nothing to read and not
/// closed. Never waits.
pub fn idle_and_open<T: AsyncRead + Unpin>(io: &mut T) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    let mut rb = ReadBuf::uninit(&mut byte);
    // Pending: open and quiet. Ready: closed, broken, or unsolicited bytes
    // that would be mistaken for the next answer.
    Pin::new(io).poll_read(&mut cx, &mut rb).is_pending()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;
    use http_body::Body as _;
    use http_body_util::BodyExt;
    use tokio::io::{duplex, DuplexStream};

    fn post(body: &'static str) -> Request<Bytes> {
        let mut r = Request::new(Bytes::from_static(body.as_bytes()));
        *r.method_mut() = Method::POST;
        *r.uri_mut() = "/mcp?a=1".parse().unwrap();
        r.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("up:1"));
        r.headers_mut()
            .insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer s"));
        r
    }

    /// Run one exchange against `answer` (written after the request has been
    /// read in full) and return the request as the upstream saw it, the
    /// response, and the upstream's end of the pipe.
    async fn against(
        req: Request<Bytes>,
        answer: &'static [u8],
    ) -> (
        Vec<u8>,
        Result<Response<Body<DuplexStream>>, Error>,
        DuplexStream,
    ) {
        against_then(req, answer, false).await
    }

    /// [`against`], the upstream closing after its answer when `close`.
    async fn against_then(
        req: Request<Bytes>,
        answer: &'static [u8],
        close: bool,
    ) -> (
        Vec<u8>,
        Result<Response<Body<DuplexStream>>, Error>,
        DuplexStream,
    ) {
        let (ours, mut theirs) = duplex(1 << 20);
        let expect = encode_request(&req).len()
            + if req.body().len() > COALESCE {
                req.body().len()
            } else {
                0
            };
        let upstream = async move {
            let mut seen = vec![0; expect];
            theirs.read_exact(&mut seen).await.unwrap();
            theirs.write_all(answer).await.unwrap();
            if close {
                theirs.shutdown().await.unwrap();
            }
            (seen, theirs)
        };
        let (r, (seen, theirs)) = tokio::join!(exchange(ours, &req), upstream);
        (seen, r, theirs)
    }

    #[test]
    fn encodes_origin_form_with_length() {
        let wire = encode_request(&post("{}"));
        assert_eq!(
            String::from_utf8(wire).unwrap(),
            "POST /mcp?a=1 HTTP/1.1\r\nhost: up:1\r\nauthorization: Bearer s\r\n\
             content-length: 2\r\n\r\n{}"
        );
        let mut get = post("");
        *get.method_mut() = Method::GET;
        let wire = String::from_utf8(encode_request(&get)).unwrap();
        assert!(!wire.contains("content-length"), "{wire}");
    }

    #[tokio::test]
    async fn a_large_body_follows_the_head() {
        let big: &'static str = Box::leak("x".repeat(COALESCE + 1).into_boxed_str());
        let (seen, r, _up) =
            against(post(big), b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        assert!(seen.ends_with(big.as_bytes()));
        assert_eq!(r.unwrap().status(), 200);
    }

    #[tokio::test]
    async fn content_length_body_then_reusable() {
        let (_, r, _up) = against(
            post("{}"),
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
        )
        .await;
        let mut body = r.unwrap().into_body();
        assert_eq!(body.size_hint().exact(), Some(5));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
        assert!(body.frame().await.is_none());
        assert!(body.take_reusable().is_some());
    }

    /// A head that arrives a few bytes at a time, after an interim answer,
    /// comes out with every field's name and value as sent (values are
    /// slices of the head's buffer, so each must be the right slice).
    #[tokio::test]
    async fn fields_survive_a_head_read_in_pieces() {
        let (ours, mut theirs) = duplex(7);
        let req = post("{}");
        let upstream = async move {
            let mut seen = vec![0; encode_request(&req).len()];
            theirs.read_exact(&mut seen).await.unwrap();
            theirs
                .write_all(
                    b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n\
                      HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                      Set-Cookie: a=1\r\nX-Trace:  spaced\tvalue \xe2\x9c\x93 \r\n\
                      content-length: 5\r\nSet-Cookie: b=2\r\nX-Empty:\r\n\r\nhello",
                )
                .await
                .unwrap();
            theirs
        };
        let req = post("{}");
        let (r, _up) = tokio::join!(exchange(ours, &req), upstream);
        let r = r.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers();
        assert_eq!(h.len(), 5, "{h:?}");
        assert_eq!(h["content-type"], "application/json");
        let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(h["x-trace"].as_bytes(), b"spaced\tvalue \xe2\x9c\x93");
        assert_eq!(h["x-empty"], "");
        assert!(!h.contains_key("link"), "the interim answer's field");
        let mut body = r.into_body();
        assert_eq!(body.size_hint().exact(), Some(5));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "hello");
    }

    #[tokio::test]
    async fn chunked_with_extensions_and_trailers() {
        let (_, r, _up) = against(
            post("{}"),
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n",
        )
        .await;
        let r = r.unwrap();
        assert!(!r.headers().contains_key(header::TRANSFER_ENCODING));
        let mut body = r.into_body();
        let all = (&mut body).collect().await.unwrap().to_bytes();
        assert_eq!(all, "hello!");
        assert!(body.take_reusable().is_some());
    }

    #[tokio::test]
    async fn close_delimited_body_is_not_reused() {
        let (_, r, _up) =
            against_then(post("{}"), b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true).await;
        let mut body = r.unwrap().into_body();
        let all = (&mut body).collect().await.unwrap().to_bytes();
        assert_eq!(all, "until the end");
        assert!(body.take_reusable().is_none());
    }

    /// Whether the connection may carry another request after `req` was
    /// answered with `answer` and its body read to the end.
    async fn reused(req: Request<Bytes>, answer: &'static [u8]) -> bool {
        let (_, r, _up) = against(req, answer).await;
        let mut body = r.unwrap().into_body();
        while body.frame().await.is_some() {}
        body.take_reusable().is_some()
    }

    /// Each answer to a POST is refused as invalid HTTP.
    async fn assert_invalid(answers: &[&'static [u8]]) {
        for &answer in answers {
            let (_, r, _up) = against(post("{}"), answer).await;
            assert!(matches!(r, Err(Error::Invalid(_))), "{answer:?}");
        }
    }

    #[tokio::test]
    async fn connection_close_and_http10_are_not_reused() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        ] {
            assert!(!reused(post("{}"), answer).await, "{answer:?}");
        }
    }

    #[tokio::test]
    async fn invalid_answers_are_errors() {
        assert_invalid(&[
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
        ])
        .await;
        let (_, r, _up) = against_then(post("{}"), b"HTTP/1.1 200 OK\r\n", true).await;
        assert!(matches!(r, Err(Error::Closed)));
    }

    /// tessera sends no TE: a transfer coding besides one chunked would
    /// hand the caller coded bytes the redactor cannot read.
    #[tokio::test]
    async fn transfer_codings_other_than_chunked_are_errors() {
        assert_invalid(&[
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nbytes",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nbytes",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n",
        ])
        .await;
        // The one coding allowed, in any case and with spaces around it.
        let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  Chunked \r\n\r\n0\r\n\r\n";
        assert!(reused(post("{}"), answer).await);
    }

    /// An upstream may refuse a request on its head and leave the body
    /// unread in the connection, where it would be read as the next
    /// request: after an error answer to a request with a body, the
    /// connection is not reused; with no body, or after a 2xx, it is.
    #[tokio::test]
    async fn an_error_answer_to_a_request_with_a_body_is_not_reused() {
        let mut get = post("");
        *get.method_mut() = Method::GET;
        for (req, answer, reuse) in [
            (
                post("{}"),
                &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno"[..],
                false,
            ),
            (
                post("{}"),
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            (
                post("{}"),
                b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            (
                post("{}"),
                b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                false,
            ),
            (
                post("{}"),
                b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
                true,
            ),
            (
                post(""),
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                true,
            ),
            (
                get,
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
                true,
            ),
        ] {
            let what = format!("{} {:?}", req.method(), String::from_utf8_lossy(answer));
            assert_eq!(reused(req, answer).await, reuse, "{what}");
        }
    }

    #[tokio::test]
    async fn broken_bodies_are_errors() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        ] {
            let (_, r, _up) = against_then(post("{}"), answer, true).await;
            let mut body = r.unwrap().into_body();
            let mut failed = false;
            while let Some(f) = body.frame().await {
                failed |= f.is_err();
            }
            assert!(failed, "{answer:?}");
            assert!(body.take_reusable().is_none());
        }
    }

    #[tokio::test]
    async fn an_idle_connection_is_checked_without_waiting() {
        let (mut ours, mut theirs) = duplex(64);
        assert!(idle_and_open(&mut ours));
        theirs.write_all(b"x").await.unwrap();
        assert!(!idle_and_open(&mut ours), "unsolicited bytes");
        let (mut ours, theirs) = duplex(64);
        drop(theirs);
        assert!(!idle_and_open(&mut ours), "closed");
    }

    #[tokio::test]
    async fn a_quiet_stream_holds_no_buffer() {
        let (_, r, mut up) = against(
            post("{}"),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await;
        let mut body = r.unwrap().into_body();
        up.write_all(b"9\r\ndata: 1\n\n\r\n").await.unwrap();
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "data: 1\n\n");
        // Nothing more has arrived: the body waits with an empty buffer.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        assert_eq!(body.buf.capacity(), 0);
    }
}
