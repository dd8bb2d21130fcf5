//! Filter (body and headers): the secret tessera injected never comes back.
//!
//! An upstream may echo request headers (debug endpoints, error pages,
//! reflected headers). Every occurrence of the injected secret, and of its
//! encodings (the raw value; for basic, base64 of `user:secret`), is
//! replaced in response headers and body bytes by a marker of the same
//! length, so `Content-Length` stays right and nothing needs buffering.
//!
//! The body is matched as it streams: a frame with no occurrence and no
//! tail that could start one passes through untouched (no copy); otherwise
//! only the bytes that could still begin an occurrence (fewer than the
//! longest pattern) are held back until the next frame decides them, so an
//! occurrence split across SSE events or frames at any byte is caught.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame};
use memchr::memmem::Finder;

/// What replaces a secret: this text, cut or padded with `*` to the
/// secret's length.
pub const MARKER: &[u8] = b"[redacted-by-tessera]";

/// The byte patterns of one credential's secret.
pub struct Redactor {
    /// Each pattern and its same-length marker.
    patterns: Vec<(Finder<'static>, Vec<u8>)>,
    /// The longest pattern's length.
    longest: usize,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} patterns)", self.patterns.len())
    }
}

impl Redactor {
    /// A redactor for these encodings of a secret (empty ones ignored,
    /// duplicates dropped).
    pub fn new<'a>(encodings: impl IntoIterator<Item = &'a [u8]>) -> Redactor {
        let mut patterns: Vec<(Finder<'static>, Vec<u8>)> = Vec::new();
        for p in encodings.into_iter().filter(|p| !p.is_empty()) {
            if patterns.iter().any(|(f, _)| f.needle() == p) {
                continue;
            }
            let marker = MARKER
                .iter()
                .copied()
                .chain(std::iter::repeat(b'*'))
                .take(p.len())
                .collect();
            patterns.push((Finder::new(p).into_owned(), marker));
        }
        // Longest first: a pattern inside another (the secret inside
        // `user:secret` is not, but be safe) is replaced by the longer.
        patterns.sort_by_key(|(f, _)| std::cmp::Reverse(f.needle().len()));
        let longest = patterns
            .iter()
            .map(|(f, _)| f.needle().len())
            .max()
            .unwrap_or(0);
        Redactor { patterns, longest }
    }

    /// Whether `b` holds a pattern.
    pub fn found_in(&self, b: &[u8]) -> bool {
        self.patterns.iter().any(|(f, _)| f.find(b).is_some())
    }

    /// Replace every occurrence in place.
    pub fn replace(&self, b: &mut [u8]) {
        for (f, marker) in &self.patterns {
            let mut at = 0;
            while let Some(i) = f.find(&b[at..]) {
                let start = at + i;
                b[start..start + marker.len()].copy_from_slice(marker);
                at = start + marker.len();
            }
        }
    }

    /// How many bytes at the end of `b` could be the start of a pattern
    /// (a proper prefix of one), and so must wait for more bytes.
    pub fn pending_tail(&self, b: &[u8]) -> usize {
        let mut keep = 0;
        for (f, _) in &self.patterns {
            let p = f.needle();
            let window = (p.len() - 1).min(b.len());
            let tail = &b[b.len() - window..];
            // Candidate starts: where the pattern's first byte appears.
            for i in memchr::memchr_iter(p[0], tail) {
                let k = tail.len() - i;
                if k > keep && p.starts_with(&tail[i..]) {
                    keep = k;
                    break; // the earliest start is the longest prefix
                }
            }
        }
        keep
    }

    /// Replace occurrences in header values (a value keeps its length).
    pub fn headers(&self, h: &mut HeaderMap) {
        for v in h.values_mut() {
            if self.found_in(v.as_bytes()) {
                let mut b = v.as_bytes().to_vec();
                self.replace(&mut b);
                *v = HeaderValue::from_bytes(&b).expect("the marker is a valid header value");
            }
        }
    }

    /// Wrap a body so its bytes are redacted as they stream.
    pub fn body<B>(self: Arc<Self>, inner: B) -> Redacted<B> {
        Redacted {
            inner,
            redactor: self,
            held: BytesMut::new(),
            trailers: None,
            done: false,
        }
    }

    fn longest(&self) -> usize {
        self.longest
    }
}

/// A body redacted as it streams.
pub struct Redacted<B> {
    inner: B,
    redactor: Arc<Redactor>,
    /// Bytes that could begin an occurrence, waiting for the next frame.
    held: BytesMut,
    /// Trailers that arrived while bytes were held: sent after them
    /// (boxed: rare, and an open stream should not carry their size).
    trailers: Option<Box<Frame<Bytes>>>,
    done: bool,
}

impl<B> Body for Redacted<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let r = &this.redactor;
        loop {
            if this.done {
                if !this.held.is_empty() {
                    // The end: what was held cannot start anything now.
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(*t)));
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    this.done = true;
                    continue;
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(f)) => f,
            };
            let data = match frame.into_data() {
                Ok(d) => d,
                Err(trailers) => {
                    this.trailers = Some(Box::new(trailers));
                    this.done = true;
                    continue;
                }
            };
            // The common case: nothing held, nothing found, no tail that
            // could start a pattern: pass the frame as it is.
            if this.held.is_empty() && !r.found_in(&data) && r.pending_tail(&data) == 0 {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            this.held.extend_from_slice(&data);
            r.replace(&mut this.held);
            let keep = r.pending_tail(&this.held).min(r.longest());
            let ready = this.held.len() - keep;
            if ready > 0 {
                return Poll::Ready(Some(Ok(Frame::data(this.held.split_to(ready).freeze()))));
            }
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // Same-length replacement: the upstream's length still holds.
        let mut h = self.inner.size_hint();
        let held = self.held.len() as u64;
        h.set_lower(h.lower() + held);
        if let Some(u) = h.upper() {
            h.set_upper(u + held);
        }
        h
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_empty() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    const SECRET: &[u8] = b"s3cr3t-Zq8mX1vP";

    fn redactor() -> Arc<Redactor> {
        Arc::new(Redactor::new([SECRET, b"dXNlcjpzM2NyM3Q=".as_slice()]))
    }

    #[test]
    fn replaces_in_place_keeping_length() {
        let r = redactor();
        let mut b = b"a s3cr3t-Zq8mX1vP b s3cr3t-Zq8mX1vP".to_vec();
        r.replace(&mut b);
        assert_eq!(&b, b"a [redacted-by-te b [redacted-by-te");
        let long = Redactor::new([b"x".repeat(25).as_slice()]);
        let mut b = b"x".repeat(25);
        long.replace(&mut b);
        assert_eq!(&b, b"[redacted-by-tessera]****");
    }

    #[test]
    fn pending_tail_is_the_longest_prefix_at_the_end() {
        let r = redactor();
        assert_eq!(r.pending_tail(b"hello"), 0);
        assert_eq!(r.pending_tail(b"hello s3c"), 3);
        assert_eq!(r.pending_tail(b"hello s"), 1);
        assert_eq!(r.pending_tail(b"s3cr3t-Zq8mX1v"), 14);
        assert_eq!(r.pending_tail(b"dXNlcjpz"), 8);
        // A whole occurrence is not a pending prefix.
        assert_eq!(r.pending_tail(b"s3cr3t-Zq8mX1vP"), 0);
    }

    async fn through(chunks: Vec<Vec<u8>>) -> Vec<u8> {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c))));
        let body = redactor().body(StreamBody::new(futures_util::stream::iter(frames)));
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn split_at_every_byte_is_caught() {
        let text =
            b"data: {\"auth\":\"Bearer s3cr3t-Zq8mX1vP\",\"b\":\"dXNlcjpzM2NyM3Q=\"}\n\n".to_vec();
        let mut want = text.clone();
        redactor().replace(&mut want);
        assert!(!want.windows(SECRET.len()).any(|w| w == SECRET));
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let chunks = vec![text[..i].to_vec(), text[i..j].to_vec(), text[j..].to_vec()];
                assert_eq!(through(chunks).await, want, "split at {i}, {j}");
            }
        }
        // One byte per frame.
        let bytes = text.iter().map(|b| vec![*b]).collect();
        assert_eq!(through(bytes).await, want);
    }

    #[tokio::test]
    async fn trailers_follow_the_held_bytes() {
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"x s3c"))),
            Ok(Frame::trailers(HeaderMap::new())),
        ];
        let mut body = redactor().body(StreamBody::new(futures_util::stream::iter(frames)));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "x ");
        let held = body.frame().await.unwrap().unwrap();
        assert_eq!(held.into_data().unwrap(), "s3c");
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn frames_without_a_secret_pass_untouched() {
        let r = redactor();
        let data = Bytes::from_static(b"{\"result\":{}}");
        let frames = vec![Ok::<_, std::convert::Infallible>(Frame::data(data.clone()))];
        let mut body = r.body(StreamBody::new(futures_util::stream::iter(frames)));
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        // The same buffer, not a copy.
        assert_eq!(f.as_ptr(), data.as_ptr());
    }

    #[test]
    fn header_values_are_redacted() {
        let r = redactor();
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer s3cr3t-Zq8mX1vP"));
        h.insert("x-other", HeaderValue::from_static("fine"));
        r.headers(&mut h);
        assert_eq!(h["x-echo"], "Bearer [redacted-by-te");
        assert_eq!(h["x-other"], "fine");
    }
}
