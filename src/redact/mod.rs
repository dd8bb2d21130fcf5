//! Filter (body and headers): no byte tessera passes to a caller reveals
//! the secret it injected, in any form a client could decode.
//!
//! # The model
//! An upstream may reflect the request (a debug tool, an error page that
//! dumps it, a compromised server), in whatever encoding it likes. tessera
//! replaces, in every response header and body byte, every run of text
//! that is a piece of the secret at least [`threshold`] bytes long (half
//! the secret; the whole of a short one) in any of these forms:
//! - the secret itself, in any letter case, and the texts JSON and URL
//!   encoders make of it (`\/`, `\u003c`, `%2F`);
//! - the base64 (standard or URL-safe, at each of the three alignments
//!   inside longer base64 text, so padding and the text around it do not
//!   matter) and hex, in either case, of each of those, and for basic auth
//!   of the header's own base64;
//! - any of those behind up to [`scan::LEVELS`] layers of escapes: JSON
//!   and JavaScript string escapes, percent-encoding, HTML character
//!   references, mixed at will (see [`unescape`]).
//!
//! A piece split across frames, events or escapes is found: the body is
//! scanned as one stream, and a header section as the run of its names and
//! values in order, so a secret split across two values or two fields, or
//! carried in a field's name, is found too (a field whose name holds one
//! is dropped). The replacement keeps each run's length (so
//! `Content-Length` holds and nothing is buffered): `[redacted-by-tessera]`
//! cut or padded with `*`, or all `*` where the secret itself could make
//! the marker part of a piece.
//!
//! Content codings are undone before this runs (`crate::wire::decode`): what is
//! scanned is what the caller reads. What this cannot see: a secret
//! encrypted, or cut into pieces each shorter than the threshold, by an
//! upstream that means to leak it (which holds the credential anyway); nor
//! base64 or hex of the secret with its letter case changed first (another
//! string: matching every case variant under base64 would take a form per
//! variant).
//!
//! # Streaming
//! A frame with no piece and no tail that could begin one passes through
//! untouched (no copy); otherwise only the bytes a later frame could still
//! make part of a piece are held back. A `\n`, never in a secret, ends any
//! piece, so an SSE event is never held past its end.

#[doc(hidden)]
pub mod leaks;
mod matcher;
pub(crate) mod scan;
pub(crate) mod unescape;

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame};

use crate::crypto::keyring::{ExposeSecret, SecretString};
use matcher::Matcher;
use scan::Scan;

/// What replaces a piece of a secret, cut to `[redacted-by-te]` or padded
/// with `*` to the piece's length.
pub const MARKER: &[u8] = b"[redacted-by-tessera]";

/// How long a replaced secret (a refreshed OAuth token, a rotated
/// credential) is still redacted: an upstream may echo a request made
/// with it, or keep it in a log it shows later.
pub const RETIRED_GRACE: Duration = Duration::from_secs(3600);
/// The most replaced secrets kept per credential.
const MAX_RETIRED: usize = 4;

/// The shortest piece of a `len`-byte secret that is redacted: half of it,
/// and never less than 8 bytes (the whole of a shorter secret), so short
/// runs of ordinary text are not taken for pieces.
pub fn threshold(len: usize) -> usize {
    (len / 2).max(len.min(8)).max(1)
}

/// A secret, the exact text a scheme sends it in (basic auth's base64 of
/// `user:secret`), and when it was replaced (None: in force).
#[derive(Clone)]
struct Kept {
    secret: SecretString,
    sent: Option<SecretString>,
    retired: Option<Instant>,
}

/// The forms of one credential's secrets, ready to scan for.
pub struct Redactor {
    matcher: Matcher,
    /// `None`: the marker text; `Some(b)`: this byte, because the marker
    /// could itself be read as part of a piece.
    filler: Option<u8>,
    kept: Vec<Kept>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Redactor({} secrets, {:?})",
            self.kept.len(),
            self.matcher
        )
    }
}

impl Redactor {
    /// A redactor for `secrets` (empty ones ignored).
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a SecretString>) -> Redactor {
        Self::build(
            secrets
                .into_iter()
                .map(|s| Kept {
                    secret: s.clone(),
                    sent: None,
                    retired: None,
                })
                .collect(),
        )
    }

    /// A redactor for `secret` sent as `sent` (basic auth's base64 of
    /// `user:secret`): the encodings of that text are forms too.
    pub fn sent_as(secret: &SecretString, sent: SecretString) -> Redactor {
        Self::build(vec![Kept {
            secret: secret.clone(),
            sent: Some(sent),
            retired: None,
        }])
    }

    /// `self` and `extra` together (an OAuth token with the refresh token
    /// and client secret it was had with).
    pub fn with<'a>(&self, extra: impl IntoIterator<Item = &'a SecretString>) -> Redactor {
        let mut kept = self.kept.clone();
        for s in extra {
            if !kept.iter().any(|k| same(&k.secret, s)) {
                kept.push(Kept {
                    secret: s.clone(),
                    sent: None,
                    retired: None,
                });
            }
        }
        Self::build(kept)
    }

    /// `self` with `secret` also sent as `sent` (an OAuth client's basic
    /// authentication at the token endpoint).
    pub fn with_sent(&self, (secret, sent): (SecretString, SecretString)) -> Redactor {
        let mut kept: Vec<Kept> = self
            .kept
            .iter()
            .filter(|k| !same(&k.secret, &secret))
            .cloned()
            .collect();
        kept.push(Kept {
            secret,
            sent: Some(sent),
            retired: None,
        });
        Self::build(kept)
    }

    /// `next`, with this redactor's secrets that `next` lacks kept as
    /// replaced ones for [`RETIRED_GRACE`] (the newest [`MAX_RETIRED`]):
    /// for a credential whose secret was just replaced.
    pub fn succeeded_by(&self, next: &Redactor) -> Redactor {
        let now = Instant::now();
        let mut retired: Vec<Kept> = self
            .kept
            .iter()
            .filter(|k| !next.kept.iter().any(|n| same(&n.secret, &k.secret)))
            .filter_map(|k| {
                let at = k.retired.unwrap_or(now);
                (now.duration_since(at) < RETIRED_GRACE).then(|| Kept {
                    retired: Some(at),
                    ..k.clone()
                })
            })
            .collect();
        let mut kept = next.kept.clone();
        retired.sort_by_key(|k| std::cmp::Reverse(k.retired));
        kept.extend(retired.into_iter().take(MAX_RETIRED));
        Self::build(kept)
    }

    /// Whether this redactor holds `secret`, in force or replaced.
    pub fn covers(&self, secret: &SecretString) -> bool {
        self.kept.iter().any(|k| same(&k.secret, secret))
    }

    /// Whether it holds the same secrets, in force, as `other`.
    pub fn same_secrets(&self, other: &Redactor) -> bool {
        let live = |r: &Redactor| r.kept.iter().filter(|k| k.retired.is_none()).count();
        live(self) == live(other)
            && other.kept.iter().filter(|k| k.retired.is_none()).all(|k| {
                self.kept
                    .iter()
                    .any(|m| m.retired.is_none() && same(&m.secret, &k.secret))
            })
    }

    fn build(kept: Vec<Kept>) -> Redactor {
        let mut forms: Vec<(Vec<u8>, u32)> = Vec::new();
        for k in &kept {
            let s = k.secret.expose_secret().as_bytes();
            if s.is_empty() {
                continue;
            }
            let t = threshold(s.len()) as u32;
            // The serializers' texts are forms of their own too: a
            // secret written as JSON or a URL component and then escaped
            // four more times is one form under four levels.
            for v in serialized(s) {
                block_forms(&v, t, &mut forms);
                forms.push((v, t));
            }
            if let Some(sent) = &k.sent {
                let sent = sent.expose_secret().as_bytes();
                forms.push((sent.to_vec(), t));
                block_forms(sent, t, &mut forms);
            }
        }
        forms.sort();
        forms.dedup();
        let matcher = Matcher::new(forms.iter().map(|(f, t)| (f.as_slice(), *t)));
        let filler = filler(&forms, &matcher);
        Redactor {
            matcher,
            filler,
            kept,
        }
    }

    /// Whether `b` holds a piece of a secret.
    pub fn found_in(&self, b: &[u8]) -> bool {
        !self.ranges(b).is_empty()
    }

    /// The merged raw ranges of `b` to redact.
    fn ranges(&self, b: &[u8]) -> Vec<(u64, u64)> {
        let mut scan = Scan::new(&self.matcher);
        scan.push(&self.matcher, b);
        scan.finish(&self.matcher);
        let mut out = Vec::new();
        scan.take_decided(&mut out);
        out
    }

    /// Redact `b` in place.
    pub fn replace(&self, b: &mut [u8]) {
        for (s, e) in self.ranges(b) {
            self.mark(&mut b[s as usize..e as usize]);
        }
    }

    /// `s` with every piece redacted (for text tessera writes itself: a log
    /// line, an error message, that holds something an upstream said).
    pub fn text<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let ranges = self.ranges(s.as_bytes());
        if ranges.is_empty() {
            return Cow::Borrowed(s);
        }
        let mut b = s.as_bytes().to_vec();
        for (s, e) in ranges {
            self.mark(&mut b[s as usize..e as usize]);
        }
        // A piece may end inside a multi-byte character: what is left of it
        // becomes U+FFFD.
        Cow::Owned(String::from_utf8_lossy(&b).into_owned())
    }

    /// Write the marker over `b`.
    fn mark(&self, b: &mut [u8]) {
        if let Some(f) = self.filler {
            b.fill(f);
            return;
        }
        let n = b.len();
        match n {
            0 => {}
            1 => b[0] = b'*',
            _ if n < MARKER.len() => {
                b[0] = b'[';
                b[1..n - 1].copy_from_slice(&MARKER[1..n - 1]);
                b[n - 1] = b']';
            }
            _ => {
                b[..MARKER.len()].copy_from_slice(MARKER);
                b[MARKER.len()..].fill(b'*');
            }
        }
    }

    /// Redact header fields in place. The names in order are scanned as
    /// one text, and the values in order as another, so a secret split
    /// across the values of one field or of several is found. A field
    /// whose name holds a piece is dropped; a value keeps its length, its
    /// piece replaced.
    pub fn headers(&self, h: &mut HeaderMap) {
        if h.is_empty() {
            return;
        }
        let mut names = Vec::with_capacity(256);
        let mut values = Vec::with_capacity(512);
        // Each field's end in `names` and in `values`.
        let mut ends = Vec::with_capacity(h.len());
        for (name, value) in h.iter() {
            names.extend_from_slice(name.as_str().as_bytes());
            values.extend_from_slice(value.as_bytes());
            ends.push((names.len(), values.len()));
        }
        let in_names = self.ranges(&names);
        let in_values = self.ranges(&values);
        if in_names.is_empty() && in_values.is_empty() {
            return;
        }
        let hit = |ranges: &[(u64, u64)], a: usize, b: usize| {
            ranges
                .iter()
                .any(|&(s, e)| (s as usize) < b && (e as usize) > a)
        };
        let old = std::mem::take(h);
        let (mut name_at, mut value_at) = (0, 0);
        let mut last: Option<HeaderName> = None;
        for ((name, value), &(name_end, value_end)) in old.into_iter().zip(&ends) {
            let name = match name {
                Some(n) => {
                    last = Some(n.clone());
                    n
                }
                None => last.clone().expect("a value follows its name"),
            };
            let (n, v) = (name_at, value_at);
            (name_at, value_at) = (name_end, value_end);
            if hit(&in_names, n, name_end) {
                continue;
            }
            if !hit(&in_values, v, value_end) {
                h.append(name, value);
                continue;
            }
            let mut b = value.as_bytes().to_vec();
            for &(s, e) in &in_values {
                let (s, e) = ((s as usize).max(v), (e as usize).min(value_end));
                if s < e {
                    self.mark(&mut b[s - v..e - v]);
                }
            }
            let mut value =
                HeaderValue::from_bytes(&b).expect("the marker is a valid header value");
            value.set_sensitive(true);
            h.append(name, value);
        }
    }

    /// Wrap a body so its bytes are redacted as they stream.
    pub fn body<B>(self: Arc<Self>, inner: B) -> Redacted<B> {
        Redacted {
            inner,
            scan: Scan::new(&self.matcher),
            redactor: self,
            held: BytesMut::new(),
            ranges: Vec::new(),
            trailers: None,
            done: false,
        }
    }
}

fn same(a: &SecretString, b: &SecretString) -> bool {
    a.expose_secret() == b.expose_secret()
}

/// The texts JSON and URL encoders make of a secret (the secret itself
/// among them), as they stand and before a block encoding.
fn serialized(s: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![s.to_vec()];
    let text = String::from_utf8_lossy(s);
    // serde_json's string, PHP's `\/`, Go's HTML-safe escapes.
    let json = serde_json::to_string(&text).expect("a string serializes");
    let json = json[1..json.len() - 1].to_string();
    out.push(json.replace('/', "\\/").into_bytes());
    out.push(
        json.replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
            .into_bytes(),
    );
    out.push(json.into_bytes());
    // encodeURIComponent, either hex case.
    for upper in [true, false] {
        let mut p = Vec::with_capacity(s.len() * 3);
        for &b in s {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                p.push(b);
            } else {
                let hex = if upper {
                    format!("%{b:02X}")
                } else {
                    format!("%{b:02x}")
                };
                p.extend_from_slice(hex.as_bytes());
            }
        }
        out.push(p);
    }
    out.sort();
    out.dedup();
    out
}

/// Base64 of `v` at each alignment (the letters that depend on `v`'s bytes
/// alone) and its hex, as forms with threshold `t`.
fn block_forms(v: &[u8], t: u32, forms: &mut Vec<(Vec<u8>, u32)>) {
    for align in 0..3usize {
        let mut buf = vec![0u8; align];
        buf.extend_from_slice(v);
        let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&buf);
        // Letter i holds bits [6i, 6i + 6) of the buffer; keep those
        // inside v's bits, [8 align, 8 (align + len)).
        let bits = (8 * align, 8 * (align + v.len()));
        let first = bits.0.div_ceil(6);
        let last = bits.1 / 6; // exclusive
        if last > first {
            forms.push((enc.as_bytes()[first..last].to_vec(), t));
        }
    }
    let mut hex = Vec::with_capacity(v.len() * 2);
    for b in v {
        hex.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    forms.push((hex, t));
}

/// The byte to fill with instead of the marker, if the marker's brackets
/// or `*` occur in a form (a piece could then run into or through it) or
/// the marker holds a piece itself.
fn filler(forms: &[(Vec<u8>, u32)], m: &Matcher) -> Option<u8> {
    let used = |c: u8| {
        forms
            .iter()
            .any(|(f, _)| f.iter().any(|&b| matcher::normal(b) == matcher::normal(c)))
    };
    let mut marker = MARKER.to_vec();
    marker.extend_from_slice(&[b'*'; 8]);
    let mut scan = Scan::new(m);
    scan.push(m, &marker);
    scan.finish(m);
    let mut found = Vec::new();
    scan.take_decided(&mut found);
    if !used(b'[') && !used(b']') && !used(b'*') && found.is_empty() {
        return None;
    }
    Some(
        b"*#~^|!$@"
            .iter()
            .copied()
            .find(|&c| !used(c))
            .unwrap_or(b'*'),
    )
}

/// A body redacted as it streams.
pub struct Redacted<B> {
    inner: B,
    redactor: Arc<Redactor>,
    scan: Scan,
    /// Bytes not yet passed on; the first is at scan offset
    /// `scan.position() - held.len()`.
    held: BytesMut,
    /// Decided ranges (scan offsets) not yet written into `held`.
    ranges: Vec<(u64, u64)>,
    /// Trailers that arrived while bytes were held: sent after them
    /// (boxed: rare, and an open stream should not carry their size).
    trailers: Option<Box<Frame<Bytes>>>,
    done: bool,
}

impl<B> Redacted<B> {
    /// Mark the decided ranges in `held` and split off what may go.
    fn decided(&mut self, limit: u64) -> Option<Bytes> {
        let base = self.scan.position() - self.held.len() as u64;
        for &(s, e) in &self.ranges {
            debug_assert!(s >= base, "a range starts before the held bytes");
            let (s, e) = (s.max(base), e);
            if s < e {
                self.redactor
                    .mark(&mut self.held[(s - base) as usize..(e - base) as usize]);
            }
        }
        self.ranges.clear();
        let ready = (limit - base) as usize;
        (ready > 0).then(|| self.held.split_to(ready).freeze())
    }
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
        loop {
            if this.done {
                if !this.held.is_empty() {
                    let m = &this.redactor.matcher;
                    this.scan.finish(m);
                    let limit = this.scan.take_decided(&mut this.ranges);
                    debug_assert_eq!(limit, this.scan.position());
                    if let Some(b) = this.decided(this.scan.position()) {
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
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
                Err(frame) => {
                    let frame = match frame.into_trailers() {
                        Ok(mut t) => {
                            this.redactor.headers(&mut t);
                            Frame::trailers(t)
                        }
                        Err(other) => other,
                    };
                    this.trailers = Some(Box::new(frame));
                    this.done = true;
                    continue;
                }
            };
            if data.is_empty() {
                continue;
            }
            let m = &this.redactor.matcher;
            let start = this.scan.position();
            this.scan.push(m, &data);
            let limit = this.scan.take_decided(&mut this.ranges);
            // The common case: nothing held, nothing found, nothing to
            // hold: the frame as it is, or its decided part.
            if this.held.is_empty() && this.ranges.is_empty() {
                debug_assert!(limit >= start, "the decided point went back");
                let ready = limit.saturating_sub(start) as usize;
                if ready < data.len() {
                    this.held.extend_from_slice(&data[ready..]);
                }
                if ready > 0 {
                    return Poll::Ready(Some(Ok(Frame::data(data.slice(..ready)))));
                }
                continue;
            }
            this.held.extend_from_slice(&data);
            if let Some(b) = this.decided(limit) {
                return Poll::Ready(Some(Ok(Frame::data(b))));
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
        // Nothing held and nothing more to come: so a body's last frame is
        // known as the last as it is handed out (hyper ends the answer, and
        // a check waiting for more frames need not keep it).
        (self.done || self.inner.is_end_stream()) && self.held.is_empty() && self.trailers.is_none()
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use http_body_util::{BodyExt, StreamBody};

    const SECRET: &str = "s3cr3t-Zq8mX1vP/k";

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_string())
    }

    fn redactor() -> Arc<Redactor> {
        Arc::new(Redactor::sent_as(
            &secret(SECRET),
            secret(&STANDARD.encode(format!("bot:{SECRET}"))),
        ))
    }

    fn redacted(r: &Redactor, text: &[u8]) -> Vec<u8> {
        let mut b = text.to_vec();
        r.replace(&mut b);
        b
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn thresholds() {
        assert_eq!(threshold(4), 4);
        assert_eq!(threshold(8), 8);
        assert_eq!(threshold(12), 8);
        assert_eq!(threshold(17), 8);
        assert_eq!(threshold(40), 20);
        assert_eq!(threshold(1200), 600);
    }

    #[test]
    fn replaces_in_place_keeping_length() {
        let r = Redactor::new([&secret("s3cr3t-Zq8mX1vP")]);
        assert_eq!(
            redacted(&r, b"a s3cr3t-Zq8mX1vP b s3cr3t-Zq8mX1vP."),
            b"a [redacted-by-t] b [redacted-by-t]."
        );
        let long = Redactor::new([&secret(&"xy".repeat(13))]);
        assert_eq!(
            redacted(&long, "xy".repeat(13).as_bytes()),
            b"[redacted-by-tessera]*****"
        );
    }

    #[test]
    fn every_encoding_a_client_can_decode_is_redacted() {
        let r = redactor();
        let s = SECRET.as_bytes();
        let json_all: String = SECRET
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let json_upper: String = SECRET
            .chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect();
        let pct: String = s.iter().map(|b| format!("%{b:02x}")).collect();
        let pct_nested: String = s.iter().map(|b| format!("%25{b:02X}")).collect();
        let html: String = s.iter().map(|b| format!("&#{b};")).collect();
        let html_bare: String = s.iter().map(|b| format!("&#{b}")).collect();
        // `%` then its two hex digits each percent-encoded: the `%` is
        // plain at the first level and an escape at the second.
        let pct_split: String = s
            .iter()
            .map(|b| {
                let hex = format!("{b:02X}");
                let h = hex.as_bytes();
                format!("%%{:02X}%{:02X}", h[0], h[1])
            })
            .collect();
        let hex: String = s.iter().map(|b| format!("{b:02X}")).collect();
        // `\u0073` percent-encoded, the hex digits of each `%XX` but the
        // backslash's as JSON escapes: a first level reads `%5c` as `\`
        // before a `%`, which must stay a backslash to the second level
        // (found by the fuzz target `redact`).
        let json_pct_json: String = json_all
            .bytes()
            .map(|b| match b {
                b'\\' => "%5c".to_string(),
                b => format!("%{b:02x}")
                    .bytes()
                    .skip(1)
                    .fold("%".to_string(), |t, d| t + &format!("\\u{d:04x}")),
            })
            .collect();
        let header = format!("Bearer {SECRET}");
        let mut forms: Vec<(String, String)> = vec![
            ("plain".into(), SECRET.into()),
            ("upper".into(), SECRET.to_uppercase()),
            ("php".into(), SECRET.replace('/', "\\/")),
            ("json all".into(), json_all.clone()),
            ("json upper hex".into(), json_upper),
            ("json of json".into(), json_all.replace('\\', "\\\\")),
            ("json of percent of json".into(), json_pct_json),
            ("percent".into(), pct),
            ("percent of percent".into(), pct_nested),
            ("percent, digits percent-encoded".into(), pct_split),
            ("percent in prose".into(), format!("50% {SECRET} 100%")),
            ("html".into(), html),
            ("html without semicolons".into(), html_bare),
            ("hex".into(), hex.clone()),
            ("hex lower".into(), hex.to_lowercase()),
            ("truncated".into(), SECRET[..SECRET.len() - 1].into()),
            ("first half".into(), SECRET[..SECRET.len() / 2].into()),
            ("second half".into(), SECRET[SECRET.len() / 2..].into()),
        ];
        for text in [SECRET.to_string(), header.clone(), format!("bot:{SECRET}")] {
            for pad in 0..3 {
                let mut b = vec![b'~'; pad];
                b.extend_from_slice(text.as_bytes());
                b.extend_from_slice(b"~~~~");
                let std = STANDARD.encode(&b);
                forms.push((format!("base64 {pad} {text}"), std.clone()));
                forms.push((format!("base64 %3D {pad}"), std.replace('=', "%3D")));
                forms.push((format!("base64 url {pad}"), URL_SAFE_NO_PAD.encode(&b)));
                forms.push((format!("base64 php {pad}"), std.replace('/', "\\/")));
            }
        }
        // The basic header's own base64, base64-encoded again.
        let basic = STANDARD.encode(format!("bot:{SECRET}"));
        forms.push((
            "base64 of basic".into(),
            STANDARD.encode(format!("Basic {basic}")),
        ));
        for (name, form) in forms {
            for wrap in ["{\"echo\":\"X\"}", "data: X\n\n", "X"] {
                let text = wrap.replace('X', &form);
                let out = redacted(&r, text.as_bytes());
                assert!(out != text.as_bytes(), "{name}: {text} passed as it was");
                // What is left of the form is shorter than the threshold.
                let left: Vec<u8> = out
                    .iter()
                    .zip(text.as_bytes())
                    .filter(|(a, b)| a == b)
                    .map(|(a, _)| *a)
                    .collect();
                assert!(
                    !contains(&left, form.as_bytes()),
                    "{name}: {}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
    }

    /// A secret of many characters a URL or JSON encoder writes as
    /// escapes, serialized so, then escaped three more times (found by the
    /// fuzz target `redact`).
    #[test]
    fn a_serialized_secret_under_three_escapes_is_redacted() {
        use crate::redact::leaks::{encode_chain, leak, Encoding as E};
        let secret = "2w/.....+++++++......F......kwN/2TQhUB5KZ9Duh.W..y.H...k2w/NTQhu";
        let r = Redactor::new([&SecretString::from(secret)]);
        for pre in [E::PercentComponentUpper, E::JsonGo, E::JsonPhp] {
            for escapes in [
                [E::HtmlDecimal, E::HtmlDecimal, E::JsonGo],
                [
                    E::JsonUnicodeLower,
                    E::JsonUnicodeLower,
                    E::JsonUnicodeLower,
                ],
                [E::PercentAllUpper, E::JsonUnicodeSome, E::HtmlHex],
            ] {
                let mut chain = vec![pre];
                chain.extend(escapes);
                let form = encode_chain(&chain, secret.as_bytes(), 1);
                let out = redacted(&r, &form);
                let t = threshold(secret.len());
                assert_eq!(leak(&out, secret.as_bytes(), t), None, "{chain:?}");
            }
        }
        // Escapers that escape some characters and not others: one `%2F`
        // reaches the third level as `/`, the next as `%2F` (found by the
        // fuzz target; a fourth level reads the mix).
        let secret = "/////////7AAAAAAA//////////////////////////////////DkrdEA8ADkr1Y";
        let r = Redactor::new([&SecretString::from(secret)]);
        let chain = [
            E::PercentComponentUpper,
            E::SwapCase,
            E::JsonUnicodeSome,
            E::JsonUnicodeSome,
            E::PercentComponentLower,
        ];
        for seed in 0..20 {
            let out = redacted(&r, &encode_chain(&chain, secret.as_bytes(), seed));
            let t = threshold(secret.len());
            assert_eq!(leak(&out, secret.as_bytes(), t), None, "seed {seed}");
        }
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        let r = redactor();
        for text in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok \u00e9 50% &amp; done"}]}}"#[..],
            b"data: {\"a\":\"s3cr\"}\n\n",
            b"Zq8mX1v",
        ] {
            assert_eq!(redacted(&r, text), text, "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn the_marker_gives_way_to_a_secret_that_could_run_into_it() {
        let r = Redactor::new([&secret("abc[redacted-by-tessera]xyz")]);
        let out = redacted(&r, b"abc[redacted-by-tessera]xyz");
        assert!(
            out.iter().all(|&b| b == b'*' || b == b'#'),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }

    async fn through(r: Arc<Redactor>, chunks: Vec<Vec<u8>>) -> Vec<u8> {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c))));
        let body = r.body(StreamBody::new(futures_util::stream::iter(frames)));
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn split_at_every_byte_is_caught() {
        let r = redactor();
        let text = format!(
            "data: {{\"auth\":\"Bearer {SECRET}\",\"b\":\"{}\",\"e\":\"{}\"}}\n\n",
            STANDARD.encode(format!("bot:{SECRET}")),
            SECRET.replace('/', "\\/").replace('k', "\\u006b"),
        )
        .into_bytes();
        let want = redacted(&r, &text);
        assert!(!contains(&want, SECRET.as_bytes()));
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let chunks = vec![text[..i].to_vec(), text[i..j].to_vec(), text[j..].to_vec()];
                assert_eq!(through(r.clone(), chunks).await, want, "split at {i}, {j}");
            }
        }
        // One byte per frame.
        let bytes = text.iter().map(|b| vec![*b]).collect();
        assert_eq!(through(r, bytes).await, want);
    }

    #[tokio::test]
    async fn an_event_is_not_held_past_its_end() {
        let r = redactor();
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
        let mut body = r.body(StreamBody::new(tokio_stream_from(rx)));
        let event = format!("data: {{\"x\":\"{}\"}}\n\n", &SECRET[..6]);
        tx.send(Ok(Frame::data(Bytes::from(event.clone()))))
            .await
            .unwrap();
        let got = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(got, event.as_bytes());
        // A tail that could begin a piece waits for the next frame.
        tx.send(Ok(Frame::data(Bytes::from_static(b"data: s3cr3t"))))
            .await
            .unwrap();
        let got = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(got, "data: ".as_bytes());
        tx.send(Ok(Frame::data(Bytes::from(format!(
            "{}\n\n",
            &SECRET[6..]
        )))))
        .await
        .unwrap();
        drop(tx);
        let rest = body.collect().await.unwrap().to_bytes();
        assert!(rest.starts_with(b"[redacted-by-tes"), "{rest:?}");
    }

    fn tokio_stream_from<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test]
    async fn trailers_follow_the_held_bytes() {
        let mut t = HeaderMap::new();
        t.insert("x-echo", HeaderValue::from_str(SECRET).unwrap());
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"x s3c"))),
            Ok(Frame::trailers(t)),
        ];
        let mut body = redactor().body(StreamBody::new(futures_util::stream::iter(frames)));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "x ");
        let held = body.frame().await.unwrap().unwrap();
        assert_eq!(held.into_data().unwrap(), "s3c");
        let trailers = body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert!(trailers["x-echo"].as_bytes().starts_with(b"[redacted"));
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
    fn header_values_names_and_splits_are_redacted() {
        let r = redactor();
        let mut h = HeaderMap::new();
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        h.insert("x-echo", v(&format!("Bearer {SECRET}")));
        h.insert("x-other", v("fine"));
        let (a, b) = SECRET.split_at(8);
        h.append("x-split", v(a));
        h.append("x-split", v(b));
        h.insert("x-first", v(&SECRET[..5]));
        h.insert("x-second", v(&SECRET[5..]));
        let name = format!("x-{}", SECRET.replace('/', "-")).to_lowercase();
        h.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), v("1"));
        r.headers(&mut h);
        assert_eq!(h["x-echo"], "Bearer [redacted-by-tes]");
        assert_eq!(h["x-other"], "fine");
        assert!(!h.contains_key(name.as_str()));
        let mut all = Vec::new();
        for (k, v) in &h {
            all.extend_from_slice(k.as_str().as_bytes());
            all.extend_from_slice(v.as_bytes());
        }
        for piece in [a, b, &SECRET[..5], &SECRET[5..]] {
            assert!(!contains(&all, piece.as_bytes()), "{piece}");
        }
        assert_eq!(h.get_all("x-split").iter().count(), 2);
        assert!(h["x-echo"].is_sensitive());
        // Three pieces, each under the threshold, across three fields.
        let mut h = HeaderMap::new();
        for (i, piece) in [&SECRET[..6], &SECRET[6..12], &SECRET[12..]]
            .iter()
            .enumerate()
        {
            h.insert(
                HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                v(piece),
            );
        }
        r.headers(&mut h);
        let joined: Vec<u8> = h.values().flat_map(|v| v.as_bytes().to_vec()).collect();
        assert!(!contains(&joined, &SECRET.as_bytes()[..6]), "{joined:?}");
    }

    #[test]
    fn replaced_secrets_stay_redacted_for_a_while() {
        let old = Redactor::new([&secret("old-token-0123456789abcdef")]);
        let new = Redactor::new([&secret("new-token-fedcba9876543210")]);
        let both = old.succeeded_by(&new);
        assert!(both.covers(&secret("old-token-0123456789abcdef")));
        assert!(both.found_in(b"old-token-0123456789abcdef"));
        assert!(both.found_in(b"new-token-fedcba9876543210"));
        assert!(both.same_secrets(&new));
        // A third secret: the first is still kept, the second retired too.
        let third = Redactor::new([&secret("third-token-aaaabbbbccccdddd")]);
        let all = both.succeeded_by(&third);
        assert!(all.found_in(b"old-token-0123456789abcdef"));
        assert!(all.found_in(b"new-token-fedcba9876543210"));
        // Unchanged secrets are not retired twice.
        let again = all.succeeded_by(&third);
        assert_eq!(again.kept.len(), 3);
    }

    #[test]
    fn a_long_token_builds_small_and_is_found() {
        let token: String = (0..1200u32)
            .map(|i| {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                    [(i.wrapping_mul(2654435761) >> 9) as usize % 64] as char
            })
            .collect();
        let r = Redactor::new([&secret(&token)]);
        let text = format!("{{\"t\":\"{}\"}}", &token[100..800]);
        assert!(r.found_in(text.as_bytes()));
        assert!(!r.found_in(&token.as_bytes()[..500]));
    }
}

#[cfg(test)]
mod size {
    /// An open stream carries a `Redacted` body: its escape levels live on
    /// the heap only while an escape is in play, so an idle stream stays
    /// small (the idle-stream memory target is nginx's, per stream).
    #[test]
    fn an_idle_stream_carries_little() {
        let scan = std::mem::size_of::<super::scan::Scan>();
        assert!(scan <= 96, "{scan}");
    }
}
