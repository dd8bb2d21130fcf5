//! Filter (body): the JSON answer to a POST answers that POST's requests,
//! and no others.
//!
//! The SDKs route a response by its JSON-RPC id, whichever HTTP answer
//! carries it. An upstream that answered a `ping` POST with a JSON batch
//! holding the id of a `tools/list` the client has in flight on another
//! POST would deliver that list past the `tools/list` filter and tool
//! pinning ([`super::tool_list`]), which read the JSON answers of POSTs
//! that ask for a list, and every SSE event (found by the attack review).
//!
//! So the answer to a POST that asks for no list is checked (one of a
//! type no client reads as messages, none or one naming neither JSON nor
//! an event stream, streams unchecked: a file's bytes), without
//! being buffered before it streams:
//! - it passes frame by frame, unread but for a scan for what a `tools`
//!   member is spelled with (`tool` in any letter case, an escape of one
//!   of its letters, or bytes of a UTF-16 or UTF-32 text:
//!   [`could_spell_tools`]);
//! - from the frame where such a spelling appears, the rest is held back
//!   until the answer ends, and then the whole answer (the frames already
//!   passed are kept, small ones copied, large ones as reference-counted
//!   slices, at most
//!   `--tools-list-max-bytes`) is read: every member of a message that a
//!   client could read as its `id` (`ID` too, as Go reads it) must be one
//!   this POST sent, or `null`;
//! - an answer that fails is cut before its held frames: a client parses
//!   a JSON answer only once it has all of it, so it dispatches nothing.
//!
//! Answers that cannot hold a list (most `tools/call` results) cost a scan
//! of their bytes and nothing else.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use compact_str::CompactString;
use http_body::{Body, Frame};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::tool_list::{tool_ends_at, ListError};
use crate::authz::canonical::fold_eq;
use crate::model::Upstream;
use crate::wire::BoxError;

/// The ids a POST's requests carried, as sent (raw JSON text; one inline).
pub type SentIds = SmallVec<[CompactString; 1]>;

/// The ids of `messages`' requests (notifications and responses carry
/// none a client waits on).
pub fn sent_ids<'a>(ids: impl Iterator<Item = Option<&'a RawValue>>) -> SentIds {
    ids.flatten()
        .map(|id| CompactString::from(id.get()))
        .collect()
}

enum Mode {
    /// Frames pass as they come; they are kept (cheap clones) in case a
    /// later one can spell `tools`.
    Passing,
    /// Past the size kept: frames pass, and a spelling of `tools` ends the
    /// answer (it could no longer be read whole).
    Unkept,
    /// A spelling of `tools` was seen: frames are held until the end.
    Holding,
    /// Checked (or failed): what is left is handed out.
    Done,
}

/// A JSON answer to a POST, checked as the module says.
pub struct OwnAnswers<B> {
    inner: B,
    sent: SentIds,
    upstream: Arc<Upstream>,
    max: usize,
    mode: Mode,
    /// Every frame's bytes so far (while they fit in `max`).
    frames: SmallVec<[Bytes; 2]>,
    /// Small frames' bytes, copied (after `frames`).
    small: BytesMut,
    /// How many of the bytes kept were passed on.
    passed: usize,
    kept: usize,
    /// The last bytes of the previous frame: a spelling cut between two.
    tail: SmallVec<[u8; SEAM]>,
    /// A trailers frame that came while frames were held.
    trailers: Option<Frame<Bytes>>,
}

impl<B> OwnAnswers<B> {
    pub fn new(inner: B, sent: SentIds, upstream: Arc<Upstream>, max: usize) -> Self {
        OwnAnswers {
            inner,
            sent,
            upstream,
            max,
            mode: Mode::Passing,
            frames: SmallVec::new(),
            small: BytesMut::new(),
            passed: 0,
            kept: 0,
            tail: SmallVec::new(),
            trailers: None,
        }
    }

    /// Whether `data` (after the previous frame) could spell a `tools`
    /// member; remembers its last bytes for the next frame.
    fn could_list(&mut self, data: &[u8]) -> bool {
        let mut seam: SmallVec<[u8; 10]> = SmallVec::from_slice(&self.tail);
        seam.extend_from_slice(&data[..data.len().min(SEAM)]);
        // Without a previous frame the seam is a part of `data`.
        let found = (!self.tail.is_empty() && could_spell_tools(&seam)) || could_spell_tools(data);
        if data.len() >= SEAM {
            self.tail.clear();
            self.tail.extend_from_slice(&data[data.len() - SEAM..]);
        } else {
            self.tail = seam[seam.len().saturating_sub(SEAM)..].into();
        }
        found
    }

    /// Keep `data`; false when the answer is now larger than `max`. A
    /// small frame is copied, a large one kept as a reference-counted
    /// slice: kept one by one, one-byte frames would make `max` bytes cost
    /// a hundred times that in bookkeeping (found by the attack review).
    fn keep(&mut self, data: &Bytes) -> bool {
        self.kept += data.len();
        if self.kept > self.max {
            self.frames = SmallVec::new();
            self.small = BytesMut::new();
            return false;
        }
        // The first frame is kept as it is (most answers are one frame).
        if data.len() < SMALL_FRAME && !(self.frames.is_empty() && self.small.is_empty()) {
            self.small.extend_from_slice(data);
        } else {
            if !self.small.is_empty() {
                self.frames.push(self.small.split().freeze());
            }
            self.frames.push(data.clone());
        }
        true
    }

    /// The whole answer read: the held frames as one, or why not.
    fn check(&mut self) -> Result<Bytes, ListError> {
        let whole = match (&self.frames[..], self.small.is_empty()) {
            ([one], true) => one.clone(),
            ([], _) => self.small.split().freeze(),
            (frames, _) => {
                let mut b = BytesMut::with_capacity(self.kept);
                frames.iter().for_each(|f| b.extend_from_slice(f));
                b.extend_from_slice(&self.small);
                b.freeze()
            }
        };
        let answered = answered_ids(&whole).ok_or(ListError::Unreadable)?;
        let sent: Vec<Option<String>> = self.sent.iter().map(|s| canonical(s)).collect();
        if answered
            .iter()
            .any(|id| id != "null" && !sent.iter().any(|s| s.as_deref() == Some(id.as_str())))
        {
            return Err(ListError::Foreign);
        }
        Ok(whole.slice(self.passed..))
    }

    fn refuse(&mut self, e: ListError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        tracing::warn!(
            credential = %self.upstream.credential,
            error = %e,
            "an upstream's JSON answer was cut before its end"
        );
        self.mode = Mode::Done;
        self.frames = SmallVec::new();
        self.small = BytesMut::new();
        Poll::Ready(Some(Err(e.into())))
    }
}

/// What a spelling of `tools` can be cut by: `\u006c` less its last byte.
const SEAM: usize = 5;

/// A frame shorter than this is copied when kept, not held on to: a slice
/// of the connection's read buffer holds on to all of it (chunk lines of
/// up to 4 KiB around 1 KiB of data cost 5x; found by the attack review).
const SMALL_FRAME: usize = 64 * 1024;

/// Whether `b` could hold (part of) a member named `tools` as a client
/// reads it: `tool` in any letter case (Go folds case; no other character
/// folds to `t`, `o` or `l`), or one of those letters escaped
/// (`tool\u0073` needs no escape of them, and holds `tool`). Other escapes
/// (`\n`, `\"`, `\u00e9`) cannot spell it, so an answer full of them
/// streams as it came.
fn could_spell_tools(b: &[u8]) -> bool {
    // Two passes. A NUL, 0xFE or 0xFF is in no UTF-8 JSON text: the
    // answer is UTF-16 or UTF-32 (a byte-order mark, or an ASCII letter's
    // zero byte), which Python's `json.loads` reads and this scan would
    // not. Then what ends a spelling of `tool` or starts an escape.
    memchr::memchr3(0, 0xfe, 0xff, b).is_some()
        || memchr::memchr3_iter(b'l', b'L', b'\\', b).any(|i| {
            if b[i] != b'\\' {
                return tool_ends_at(b, i);
            }
            let Some(e) = b.get(i + 1..i + 6) else {
                return false;
            };
            e[0] == b'u'
                && e[1] == b'0'
                && e[2] == b'0'
                && matches!(
                    (e[3], e[4].to_ascii_lowercase()),
                    (b'5' | b'7', b'4') | (b'4' | b'6', b'f' | b'c')
                )
        })
}

/// `id` (raw JSON) written again as serde writes it (`"\u0061"` is `"a"`),
/// so that a re-encoded echo of a request's id is still that id.
fn canonical(id: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(id)
        .ok()
        .map(|v| v.to_string())
}

/// Every value a client could read as a message's `id` in a JSON answer
/// (one message or a batch; duplicates and folded names included), each
/// written canonically; `None` if it is not JSON.
fn answered_ids(json: &[u8]) -> Option<Vec<String>> {
    struct Top<'a>(&'a mut Vec<String>);
    struct Msg<'a>(&'a mut Vec<String>);

    impl<'de> DeserializeSeed<'de> for Top<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message or batch")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
            while s.next_element_seed(Msg(self.0))?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<(), A::Error> {
            Msg(self.0).visit_map(m)
        }
        // Anything else is no message: nothing a client routes.
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Msg<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Msg<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
            while let Some(key) = m.next_key::<String>()? {
                if fold_eq(&key, "id") {
                    self.0
                        .push(m.next_value::<serde_json::Value>()?.to_string());
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<(), A::Error> {
            IgnoredAny.visit_seq(s).map(|_| ())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }

    let mut ids = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(json);
    Top(&mut ids).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(ids)
}

impl<B> Body for OwnAnswers<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Mode::Done = this.mode {
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) => f,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    if let Mode::Holding = this.mode {
                        return this.release();
                    }
                    this.mode = Mode::Done;
                    this.frames = SmallVec::new();
                    return Poll::Ready(None);
                }
            };
            let data = match frame.into_data() {
                Ok(d) => d,
                Err(trailers) => {
                    if let Mode::Holding = this.mode {
                        this.trailers = Some(trailers);
                        return this.release();
                    }
                    return Poll::Ready(Some(Ok(trailers)));
                }
            };
            let listed = this.could_list(&data);
            match this.mode {
                // The answer's last frame: nothing after it can make it a
                // list, so it is not kept (most answers are one frame).
                Mode::Passing if !listed && this.inner.is_end_stream() => {
                    this.mode = Mode::Done;
                    this.frames = SmallVec::new();
                    this.small = BytesMut::new();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Mode::Passing if !listed => {
                    if !this.keep(&data) {
                        this.mode = Mode::Unkept;
                    }
                    this.passed = this.kept;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Mode::Unkept if !listed => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Mode::Unkept => return this.refuse(ListError::TooLarge(this.max)),
                Mode::Passing | Mode::Holding => {
                    this.mode = Mode::Holding;
                    if !this.keep(&data) {
                        return this.refuse(ListError::TooLarge(this.max));
                    }
                }
                Mode::Done => unreachable!("handled above"),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.mode {
            Mode::Passing | Mode::Unkept => self.inner.is_end_stream(),
            Mode::Holding => false,
            Mode::Done => self.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.mode {
            // The same bytes as the upstream's (or none, when cut).
            Mode::Passing | Mode::Unkept => self.inner.size_hint(),
            _ => http_body::SizeHint::default(),
        }
    }
}

impl<B> OwnAnswers<B> {
    /// The answer ended while frames were held: check it whole, then hand
    /// out the held frames as one (and the trailers after), or cut it.
    fn release(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.check() {
            Ok(held) => {
                self.mode = Mode::Done;
                self.frames = SmallVec::new();
                self.small = BytesMut::new();
                Poll::Ready(Some(Ok(Frame::data(held))))
            }
            Err(e) => self.refuse(e),
        }
    }
}
