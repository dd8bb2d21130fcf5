//! Response bodies an upstream compressed anyway, decoded as they stream.
//!
//! tessera asks upstreams for `Accept-Encoding: identity`, because it can
//! only redact the injected secret from bytes it can read. A content coding
//! that still arrives is undone here ([`codings`] reads the header,
//! [`decode_body`] wraps the body), so the caller gets the body uncoded
//! (the caller of this module drops `Content-Encoding` and
//! `Content-Length`); a coding tessera cannot undo is refused
//! ([`DecodeError::Unsupported`]), never passed on unread.
//!
//! # Why push-style decoders, not `async-compression`
//! Each coding is undone by a push-style decoder (bytes in, bytes out, no
//! reader or task between): `flate2`'s `Decompress` (gzip, whose header and
//! trailer are parsed here, and deflate), `brotli-decompressor`'s
//! `BrotliDecompressStream`, and `zstd`'s `stream::raw::Decoder`. That
//! gives the two controls an `AsyncRead` adapter does not:
//! - latency: everything an input frame makes decodable is returned before
//!   the next input frame is awaited (a compressed SSE stream flushes per
//!   event, and the event must not wait for the next one);
//! - memory: each decoder writes into a buffer of at most [`MAX_FRAME`]
//!   bytes and keeps the rest of its input for the next poll, so a
//!   decompression bomb never needs more than one such buffer per layer,
//!   whatever its ratio. The decoders' own state is bounded too: deflate's
//!   32 KiB window, brotli's standard window (at most 16 MiB; the large
//!   window extension is refused) and zstd's window capped at 8 MiB
//!   (RFC 9659's limit for the `zstd` content coding).
//!
//! A corrupt stream, bytes after its end (other than further gzip members)
//! or a body that ends inside it is a body error ([`DecodeError::Corrupt`]):
//! undecoded bytes never reach the caller. A body with no bytes at all
//! decodes to nothing (some servers label empty bodies with a coding).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use brotli_decompressor::{BrotliDecompressStream, BrotliResult, BrotliState, StandardAlloc};
use bytes::{Buf, Bytes};
use flate2::{Crc, Decompress, FlushDecompress, Status};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use zstd::stream::raw::{DParameter, Decoder as ZstdDecoder, Operation};

use crate::wire::BoxError;

/// The most content codings a response may stack.
pub const MAX_CODINGS: usize = 3;

/// The largest data frame a decoded body returns, and the most decoded
/// bytes one layer holds at a time.
pub const MAX_FRAME: usize = 64 * 1024;

/// The first data frame's largest size (see `Decoded::scratch`).
const FIRST_FRAME: usize = 8 * 1024;

/// zstd's largest window: 8 MiB (RFC 9659, section 3).
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// A content coding tessera can undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` or `x-gzip` (RFC 1952), one or more members.
    Gzip,
    /// `deflate`: zlib (RFC 1950), or the raw deflate some servers send.
    Deflate,
    /// `br` (RFC 7932).
    Br,
    /// `zstd` (RFC 8878).
    Zstd,
}

impl Coding {
    /// The coding's token, as a `Content-Encoding` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }
}

/// Why a coded body cannot be passed on. The messages name the coding,
/// never bytes of the body.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A content coding tessera cannot undo (its token, cut to 40
    /// printable ASCII characters).
    #[error("unsupported content coding `{0}`")]
    Unsupported(String),
    /// More than [`MAX_CODINGS`] codings stacked.
    #[error("more than {} content codings", MAX_CODINGS)]
    TooMany,
    /// The coded body is not a valid stream of its coding: corrupt, with
    /// bytes after its end, or cut short.
    #[error("undecodable response body: {0}")]
    Corrupt(&'static str),
}

/// The codings of a response, in the order they must be undone (the
/// reverse of the order `Content-Encoding` lists them in). Every
/// `Content-Encoding` field counts, each a comma list; tokens are matched
/// case-insensitively and `identity` is skipped. No coding: an empty list.
pub fn codings(headers: &HeaderMap) -> Result<Vec<Coding>, DecodeError> {
    let mut out = Vec::new();
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        for token in value.as_bytes().split(|b| *b == b',') {
            let token = token.trim_ascii();
            let is = |name: &str| token.eq_ignore_ascii_case(name.as_bytes());
            let coding = if token.is_empty() || is("identity") {
                continue;
            } else if is("gzip") || is("x-gzip") {
                Coding::Gzip
            } else if is("deflate") {
                Coding::Deflate
            } else if is("br") {
                Coding::Br
            } else if is("zstd") {
                Coding::Zstd
            } else {
                return Err(DecodeError::Unsupported(printable(token)));
            };
            if out.len() == MAX_CODINGS {
                return Err(DecodeError::TooMany);
            }
            out.push(coding);
        }
    }
    out.reverse();
    Ok(out)
}

/// A header token fit for a log line: at most 40 characters, anything but
/// printable ASCII shown as `?`.
fn printable(token: &[u8]) -> String {
    token
        .iter()
        .take(40)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

/// Wrap `body` so it streams decoded: `codings` as [`codings`] returns
/// them (the first is undone first). No codings: the body passes as it is.
pub fn decode_body<B>(codings: Vec<Coding>, body: B) -> Decoded<B> {
    Decoded {
        inner: body,
        layers: codings.into_iter().map(Layer::new).collect(),
        input: Bytes::new(),
        scratch: Vec::new(),
        trailers: None,
        body_done: false,
        finished: false,
    }
}

/// A body decoded as it streams (see [`decode_body`]).
pub struct Decoded<B> {
    inner: B,
    /// In the order they are undone: layer 0 reads the body, each next
    /// layer reads the one before, the last one's output is returned.
    layers: Vec<Layer>,
    /// Body bytes layer 0 has not taken yet.
    input: Bytes,
    /// The last layer's output: [`FIRST_FRAME`] long at first, doubled
    /// up to [`MAX_FRAME`] each time it fills (small bodies and SSE events
    /// keep a small buffer).
    scratch: Vec<u8>,
    /// Trailers of the body, sent after the decoded data.
    trailers: Option<HeaderMap>,
    /// The body has ended (or sent its trailers).
    body_done: bool,
    /// Nothing more will be returned.
    finished: bool,
}

impl<B> Decoded<B> {
    /// Everything the input so far makes decodable, up to `MAX_FRAME`
    /// bytes, into the scratch buffer; 0 when the layers need more input.
    fn produce(&mut self) -> Result<usize, DecodeError> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; FIRST_FRAME];
        }
        let last = self.layers.len() - 1;
        let n = produce(&mut self.layers, &mut self.input, last, &mut self.scratch)?;
        if n == self.scratch.len() && n < MAX_FRAME {
            // Full: there is more; the next frames may be larger.
            self.scratch.resize(2 * n, 0);
        }
        Ok(n)
    }

    /// The body has ended: every layer must have reached the end of its
    /// stream, with nothing left unread.
    fn check_end(&self) -> Result<(), DecodeError> {
        if !self.input.is_empty() || self.layers.iter().any(|l| l.start < l.end) {
            return Err(DecodeError::Corrupt("a decoder stopped taking input"));
        }
        self.layers.iter().try_for_each(Layer::check_end)
    }

    /// Stop, and free the decoders' memory.
    fn finish(&mut self) {
        self.finished = true;
        self.layers = Vec::new();
        self.scratch = Vec::new();
        self.input = Bytes::new();
    }
}

/// Fill `out` from layer `i`, pulling input through the layers before it,
/// until `out` is full or no layer can go on without more body bytes.
fn produce(
    layers: &mut [Layer],
    input: &mut Bytes,
    i: usize,
    out: &mut [u8],
) -> Result<usize, DecodeError> {
    let (before, rest) = layers.split_at_mut(i);
    let layer = &mut rest[0];
    let mut wrote = 0;
    while wrote < out.len() {
        let (r, w) = match before.last_mut() {
            None => {
                let (r, w) = layer.step(input, &mut out[wrote..])?;
                input.advance(r);
                (r, w)
            }
            Some(prev) => {
                if prev.start == prev.end {
                    // Refill this layer's input from the one before.
                    let mut buf = std::mem::take(&mut prev.out);
                    if buf.is_empty() {
                        buf = vec![0; MAX_FRAME];
                    }
                    let n = produce(before, input, i - 1, &mut buf);
                    let prev = before.last_mut().expect("checked above");
                    prev.out = buf;
                    (prev.start, prev.end) = (0, n?);
                }
                let prev = before.last_mut().expect("checked above");
                let (r, w) = layer.step(&prev.out[prev.start..prev.end], &mut out[wrote..])?;
                prev.start += r;
                (r, w)
            }
        };
        wrote += w;
        if r == 0 && w == 0 {
            break;
        }
    }
    Ok(wrote)
}

/// One coding being undone.
struct Layer {
    decoder: Decoder,
    /// Whether any coded byte has reached this layer (a layer that got
    /// none may end: an empty body).
    seen: bool,
    /// This layer's output waiting for the next layer: `out[start..end]`
    /// (unused by the last layer).
    out: Vec<u8>,
    start: usize,
    end: usize,
}

enum Decoder {
    Gzip(Box<Gzip>),
    Deflate(Box<Deflate>),
    Br {
        state: Box<BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>>,
        ended: bool,
    },
    Zstd {
        /// Made on the first coded byte (creating it may fail).
        decoder: Option<ZstdDecoder<'static>>,
        /// The last frame is complete and flushed.
        ended: bool,
        /// The frame follows a complete one and has made nothing yet.
        after: bool,
    },
}

impl Layer {
    fn new(coding: Coding) -> Layer {
        let decoder = match coding {
            Coding::Gzip => Decoder::Gzip(Box::new(Gzip::new())),
            Coding::Deflate => Decoder::Deflate(Box::new(Deflate {
                first: None,
                inflate: None,
                ended: false,
            })),
            // `new_strict`: the large-window extension (windows up to
            // 1 GiB) is not part of the `br` content coding.
            Coding::Br => Decoder::Br {
                state: Box::new(BrotliState::new_strict(
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                )),
                ended: false,
            },
            Coding::Zstd => Decoder::Zstd {
                decoder: None,
                ended: false,
                after: false,
            },
        };
        Layer {
            decoder,
            seen: false,
            out: Vec::new(),
            start: 0,
            end: 0,
        }
    }

    /// Decode some of `input` into `out` (not empty): the bytes read and
    /// written. (0, 0) means no progress without more input.
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize), DecodeError> {
        self.seen |= !input.is_empty();
        match &mut self.decoder {
            Decoder::Gzip(g) => g.step(input, out),
            Decoder::Deflate(d) => d.step(input, out),
            Decoder::Br { state, ended } => {
                if *ended {
                    return match input.is_empty() {
                        true => Ok((0, 0)),
                        false => Err(DecodeError::Corrupt("br: data after the end of the stream")),
                    };
                }
                let (mut avail_in, mut read) = (input.len(), 0);
                let (mut avail_out, mut wrote, mut total) = (out.len(), 0, 0);
                let result = BrotliDecompressStream(
                    &mut avail_in,
                    &mut read,
                    input,
                    &mut avail_out,
                    &mut wrote,
                    out,
                    &mut total,
                    state,
                );
                match result {
                    BrotliResult::ResultFailure => Err(DecodeError::Corrupt("br: invalid data")),
                    BrotliResult::ResultSuccess => {
                        *ended = true;
                        Ok((read, wrote))
                    }
                    BrotliResult::NeedsMoreInput | BrotliResult::NeedsMoreOutput => {
                        Ok((read, wrote))
                    }
                }
            }
            Decoder::Zstd {
                decoder,
                ended,
                after,
            } => {
                if input.is_empty() && (*ended || decoder.is_none()) {
                    return Ok((0, 0));
                }
                let d = match decoder {
                    Some(d) => d,
                    None => decoder.insert(new_zstd()?),
                };
                if *ended {
                    // Another frame follows: start it afresh.
                    d.reinit()
                        .map_err(|_| DecodeError::Corrupt("zstd: cannot start the next frame"))?;
                    *after = true;
                }
                let s = d.run_on_buffers(input, out).map_err(|_| {
                    DecodeError::Corrupt(match after {
                        true => "zstd: invalid data after the end of a frame",
                        false => "zstd: invalid data",
                    })
                })?;
                if s.bytes_read > 0 || s.bytes_written > 0 {
                    // 0: the frame is complete and all of it written.
                    *ended = s.remaining == 0;
                }
                *after &= s.bytes_written == 0;
                Ok((s.bytes_read, s.bytes_written))
            }
        }
    }

    /// Whether the stream may end here.
    fn check_end(&self) -> Result<(), DecodeError> {
        let complete = match &self.decoder {
            Decoder::Gzip(g) => matches!(g.phase, GzPhase::End),
            Decoder::Deflate(d) => d.ended,
            Decoder::Br { ended, .. } | Decoder::Zstd { ended, .. } => *ended,
        };
        if complete || !self.seen {
            return Ok(());
        }
        Err(DecodeError::Corrupt(match &self.decoder {
            Decoder::Gzip(_) => "gzip: the body ended inside the stream",
            Decoder::Deflate(_) => "deflate: the body ended inside the stream",
            Decoder::Br { .. } => "br: the body ended inside the stream",
            Decoder::Zstd { .. } => "zstd: the body ended inside the stream",
        }))
    }
}

fn new_zstd() -> Result<ZstdDecoder<'static>, DecodeError> {
    let mut d =
        ZstdDecoder::new().map_err(|_| DecodeError::Corrupt("zstd: cannot start the decoder"))?;
    d.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
        .map_err(|_| DecodeError::Corrupt("zstd: cannot start the decoder"))?;
    Ok(d)
}

/// One call of a deflate decoder: bytes read, bytes written, whether the
/// deflate stream ended.
fn inflate(
    d: &mut Decompress,
    input: &[u8],
    out: &mut [u8],
    corrupt: &'static str,
) -> Result<(usize, usize, bool), DecodeError> {
    let (in0, out0) = (d.total_in(), d.total_out());
    let status = d
        .decompress(input, out, FlushDecompress::None)
        .map_err(|_| DecodeError::Corrupt(corrupt))?;
    let read = (d.total_in() - in0) as usize;
    let wrote = (d.total_out() - out0) as usize;
    Ok((read, wrote, status == Status::StreamEnd))
}

/// HTTP `deflate`: zlib, or raw deflate, told apart by the first two bytes.
struct Deflate {
    /// The first byte, while the second has not come.
    first: Option<u8>,
    inflate: Option<Decompress>,
    ended: bool,
}

impl Deflate {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize), DecodeError> {
        if self.ended {
            return match input.is_empty() {
                true => Ok((0, 0)),
                false => Err(DecodeError::Corrupt(
                    "deflate: data after the end of the stream",
                )),
            };
        }
        let d = match &mut self.inflate {
            Some(d) => d,
            None => {
                let (b0, b1) = match (self.first, input) {
                    (_, []) => return Ok((0, 0)),
                    (None, [b]) => {
                        self.first = Some(*b);
                        return Ok((1, 0));
                    }
                    (None, [b0, b1, ..]) => (*b0, *b1),
                    (Some(b0), [b1, ..]) => (b0, *b1),
                };
                // A zlib header: method 8 and a check of the two bytes.
                let zlib = b0 & 0x0f == 8 && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0;
                let d = self.inflate.insert(Decompress::new(zlib));
                if let Some(b0) = self.first.take() {
                    // One byte holds no complete symbol (a zlib header, or
                    // a block header and at most 5 bits): it is only taken
                    // in.
                    let (r, w, _) = inflate(d, &[b0], out, "deflate: invalid data")?;
                    if (r, w) != (1, 0) {
                        return Err(DecodeError::Corrupt("deflate: invalid data"));
                    }
                }
                d
            }
        };
        let (r, w, end) = inflate(d, input, out, "deflate: invalid data")?;
        self.ended = end;
        Ok((r, w))
    }
}

/// gzip: members of a header, raw deflate data and a CRC-32/length trailer.
struct Gzip {
    phase: GzPhase,
    /// Made for the first member's data, reset for each next one (making
    /// and resetting its 43 KB of state are a large part of a small
    /// body's cost).
    inflate: Option<Decompress>,
    /// CRC-32 and length of the member's output.
    crc: Crc,
    /// CRC-32 of the header, for its optional CRC-16.
    header_crc: Crc,
}

enum GzPhase {
    /// Reading a member's header.
    Header(GzHeader),
    /// Inflating a member's data.
    Data,
    /// Reading a member's 8-byte trailer.
    Trailer { buf: [u8; 8], n: usize },
    /// A member has ended: the stream may end, or another member follow.
    End,
}

/// A member's header, read a piece at a time.
struct GzHeader {
    stage: HeaderStage,
    /// The fixed part; then the 2-byte lengths and CRC.
    buf: [u8; 10],
    n: usize,
    flags: u8,
    /// Bytes of the extra field still to skip.
    skip: usize,
    /// Another member ended before this one (bad magic is then data after
    /// the end).
    after_member: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum HeaderStage {
    Fixed,
    ExtraLen,
    Extra,
    Name,
    Comment,
    Crc16,
    Done,
}

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;

impl Gzip {
    fn new() -> Gzip {
        Gzip {
            phase: GzPhase::Header(GzHeader::new(false)),
            inflate: None,
            crc: Crc::new(),
            header_crc: Crc::new(),
        }
    }

    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize), DecodeError> {
        let mut read = 0;
        loop {
            let rest = &input[read..];
            match &mut self.phase {
                GzPhase::End => {
                    if rest.is_empty() {
                        return Ok((read, 0));
                    }
                    self.phase = GzPhase::Header(GzHeader::new(true));
                    self.header_crc.reset();
                }
                GzPhase::Header(h) => {
                    if rest.is_empty() {
                        return Ok((read, 0));
                    }
                    read += h.feed(rest, &mut self.header_crc)?;
                    if h.stage == HeaderStage::Done {
                        self.phase = GzPhase::Data;
                        if let Some(d) = &mut self.inflate {
                            d.reset(false);
                        }
                        self.crc.reset();
                    }
                }
                GzPhase::Data => {
                    let d = self.inflate.get_or_insert_with(|| Decompress::new(false));
                    let (r, w, end) = inflate(d, rest, out, "gzip: invalid data")?;
                    self.crc.update(&out[..w]);
                    if end {
                        self.phase = GzPhase::Trailer { buf: [0; 8], n: 0 };
                    }
                    return Ok((read + r, w));
                }
                GzPhase::Trailer { buf, n } => {
                    if rest.is_empty() {
                        return Ok((read, 0));
                    }
                    let k = (8 - *n).min(rest.len());
                    buf[*n..*n + k].copy_from_slice(&rest[..k]);
                    *n += k;
                    read += k;
                    if *n == 8 {
                        let crc = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                        let len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
                        if crc != self.crc.sum() {
                            return Err(DecodeError::Corrupt("gzip: CRC-32 mismatch"));
                        }
                        if len != self.crc.amount() {
                            return Err(DecodeError::Corrupt("gzip: length mismatch"));
                        }
                        self.phase = GzPhase::End;
                    }
                }
            }
        }
    }
}

impl GzHeader {
    fn new(after_member: bool) -> GzHeader {
        GzHeader {
            stage: HeaderStage::Fixed,
            buf: [0; 10],
            n: 0,
            flags: 0,
            skip: 0,
            after_member,
        }
    }

    /// The stage after `stage`, skipping fields the flags leave out.
    fn next(&self, stage: HeaderStage) -> HeaderStage {
        use HeaderStage::*;
        let f = self.flags;
        let order = [
            (ExtraLen, FEXTRA),
            (Name, FNAME),
            (Comment, FCOMMENT),
            (Crc16, FHCRC),
        ];
        let from = match stage {
            Fixed => 0,
            ExtraLen | Extra => 1,
            Name => 2,
            Comment => 3,
            Crc16 | Done => 4,
        };
        order[from..]
            .iter()
            .find(|(_, flag)| f & flag != 0)
            .map_or(Done, |(s, _)| *s)
    }

    /// Take header bytes from `input`: how many were taken.
    fn feed(&mut self, input: &[u8], crc: &mut Crc) -> Result<usize, DecodeError> {
        let mut read = 0;
        while read < input.len() {
            let rest = &input[read..];
            let stage = self.stage;
            let used = match stage {
                HeaderStage::Done => break,
                HeaderStage::Fixed => {
                    let k = self.fill(10, rest);
                    let magic = [0x1f, 0x8b];
                    if self.buf[..self.n.min(2)] != magic[..self.n.min(2)] {
                        return Err(DecodeError::Corrupt(match self.after_member {
                            true => "gzip: data after the end of the stream",
                            false => "gzip: not a gzip stream",
                        }));
                    }
                    if self.n == 10 {
                        if self.buf[2] != 8 {
                            return Err(DecodeError::Corrupt("gzip: unknown compression method"));
                        }
                        self.flags = self.buf[3];
                        if self.flags & 0xe0 != 0 {
                            return Err(DecodeError::Corrupt("gzip: reserved header flags set"));
                        }
                        self.n = 0;
                        self.stage = self.next(stage);
                    }
                    k
                }
                HeaderStage::ExtraLen => {
                    let k = self.fill(2, rest);
                    if self.n == 2 {
                        self.n = 0;
                        self.skip = usize::from(u16::from_le_bytes([self.buf[0], self.buf[1]]));
                        self.stage = HeaderStage::Extra;
                    }
                    k
                }
                HeaderStage::Extra => {
                    let k = self.skip.min(rest.len());
                    self.skip -= k;
                    if self.skip == 0 {
                        self.stage = self.next(stage);
                    }
                    k
                }
                HeaderStage::Name | HeaderStage::Comment => match memchr::memchr(0, rest) {
                    Some(i) => {
                        self.stage = self.next(stage);
                        i + 1
                    }
                    None => rest.len(),
                },
                HeaderStage::Crc16 => {
                    let k = self.fill(2, rest);
                    if self.n == 2 {
                        // The low 16 bits of the CRC-32 of the header
                        // bytes before it.
                        let v = u16::from_le_bytes([self.buf[0], self.buf[1]]);
                        if u32::from(v) != crc.sum() & 0xffff {
                            return Err(DecodeError::Corrupt("gzip: header CRC mismatch"));
                        }
                        self.stage = HeaderStage::Done;
                    }
                    k
                }
            };
            if stage != HeaderStage::Crc16 {
                crc.update(&rest[..used]);
            }
            read += used;
        }
        Ok(read)
    }

    /// Copy from `rest` until `buf` holds `want` bytes: how many were taken.
    fn fill(&mut self, want: usize, rest: &[u8]) -> usize {
        let k = (want - self.n).min(rest.len());
        self.buf[self.n..self.n + k].copy_from_slice(&rest[..k]);
        self.n += k;
        k
    }
}

impl<B> Body for Decoded<B>
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
        if this.finished {
            return Poll::Ready(None);
        }
        if this.layers.is_empty() {
            // No coding: the body as it is.
            let f = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            if f.is_none() {
                this.finished = true;
            }
            return Poll::Ready(f.map(|f| f.map_err(Into::into)));
        }
        loop {
            // First everything the bytes so far make decodable.
            match this.produce() {
                Ok(0) => {}
                Ok(n) => {
                    let data = Bytes::copy_from_slice(&this.scratch[..n]);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Err(e) => {
                    this.finish();
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
            if this.body_done {
                let end = this.check_end();
                let trailers = this.trailers.take();
                this.finish();
                return Poll::Ready(match end {
                    Err(e) => Some(Err(e.into())),
                    Ok(()) => trailers.map(|t| Ok(Frame::trailers(t))),
                });
            }
            if !this.input.is_empty() {
                // Unreachable with these decoders: they take all input
                // while they have room to write.
                this.finish();
                return Poll::Ready(Some(Err(DecodeError::Corrupt(
                    "a decoder stopped taking input",
                )
                .into())));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => this.body_done = true,
                Some(Err(e)) => {
                    this.finish();
                    return Poll::Ready(Some(Err(e.into())));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.input = data,
                    Err(frame) => {
                        this.trailers = frame.into_trailers().ok();
                        this.body_done = true;
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || (self.layers.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // Unknown until decoded (a pass-through body keeps its own).
        if self.layers.is_empty() && !self.finished {
            return self.inner.size_hint();
        }
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::io::Write;

    use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
    use flate2::{Compression, GzBuilder};
    use futures_util::FutureExt;
    use http::HeaderValue;
    use http_body_util::{BodyExt, StreamBody};

    /// A response that reflects the injected credential: the marker.
    const MARKER: &[u8] = b"ghp_REFLECTEDsecret0123";

    fn text() -> Vec<u8> {
        let mut t = b"data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"headers\":{\"authorization\":\"Bearer "
            .to_vec();
        t.extend_from_slice(MARKER);
        t.extend_from_slice(
            b"\"},\"content\":[{\"type\":\"text\",\"text\":\"ok ok ok ok\"}]}}\n\n",
        );
        t
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = ZlibEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = DeflateEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn br(data: &[u8]) -> Vec<u8> {
        let mut e = brotli::CompressorWriter::new(Vec::new(), 4096, 5, 22);
        e.write_all(data).unwrap();
        e.into_inner()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::stream::encode_all(data, 3).unwrap()
    }

    /// A name, codings (in undo order), a coded body and its text.
    type Case = (&'static str, Vec<Coding>, Vec<u8>, Vec<u8>);

    /// Every coding, two gzip members and a stack of two.
    fn cases() -> Vec<Case> {
        let t = text();
        let mut two = gzip(&t);
        two.extend(gzip(b"second member\n"));
        let mut t2 = t.clone();
        t2.extend_from_slice(b"second member\n");
        vec![
            ("gzip", vec![Coding::Gzip], gzip(&t), t.clone()),
            ("gzip, 2 members", vec![Coding::Gzip], two, t2),
            ("deflate (zlib)", vec![Coding::Deflate], zlib(&t), t.clone()),
            (
                "deflate (raw)",
                vec![Coding::Deflate],
                raw_deflate(&t),
                t.clone(),
            ),
            ("br", vec![Coding::Br], br(&t), t.clone()),
            ("zstd", vec![Coding::Zstd], zstd(&t), t.clone()),
            // `Content-Encoding: gzip, br`: br undone first.
            (
                "gzip, br",
                vec![Coding::Br, Coding::Gzip],
                br(&gzip(&t)),
                t.clone(),
            ),
        ]
    }

    fn frames_body(
        frames: Vec<Vec<u8>>,
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Unpin>
    {
        StreamBody::new(futures_util::stream::iter(
            frames.into_iter().map(|f| Ok(Frame::data(Bytes::from(f)))),
        ))
    }

    /// Decode `frames` (always ready): the output and its frames' sizes.
    fn run(codings: Vec<Coding>, frames: Vec<Vec<u8>>) -> Result<(Vec<u8>, Vec<usize>), BoxError> {
        let mut body = decode_body(codings, frames_body(frames));
        let (mut out, mut sizes) = (Vec::new(), Vec::new());
        while let Some(f) = body.frame().now_or_never().expect("an always-ready body") {
            let d = f?.into_data().expect("data only");
            sizes.push(d.len());
            out.extend_from_slice(&d);
        }
        assert!(body.is_end_stream());
        Ok((out, sizes))
    }

    fn corrupt(e: BoxError) -> &'static str {
        match e.downcast_ref::<DecodeError>() {
            Some(DecodeError::Corrupt(why)) => why,
            _ => panic!("not a decode error: {e}"),
        }
    }

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("content-encoding", HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn codings_are_listed_in_undo_order() {
        use Coding::*;
        assert_eq!(codings(&HeaderMap::new()).unwrap(), []);
        assert_eq!(codings(&headers(&[b"identity", b" , "])).unwrap(), []);
        assert_eq!(codings(&headers(&[b"GZip"])).unwrap(), [Gzip]);
        assert_eq!(codings(&headers(&[b"x-gzip"])).unwrap(), [Gzip]);
        // Repeated fields and comma lists, in order; undone from the last.
        assert_eq!(
            codings(&headers(&[b"deflate ,identity,, BR", b"\tzstd"])).unwrap(),
            [Zstd, Br, Deflate]
        );
        assert_eq!(codings(&headers(&[b"gzip, br"])).unwrap(), [Br, Gzip]);
    }

    #[test]
    fn unknown_and_too_many_codings_are_refused() {
        match codings(&headers(&[b"gzip", b"compress"])) {
            Err(DecodeError::Unsupported(t)) => assert_eq!(t, "compress"),
            r => panic!("{r:?}"),
        }
        let long = [b"x\xfe\xff".as_slice(), &[b'a'; 60]].concat();
        match codings(&headers(&[&long])) {
            Err(DecodeError::Unsupported(t)) => {
                assert_eq!(t, format!("x??{}", "a".repeat(37)));
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            codings(&headers(&[b"gzip, br", b"zstd, gzip"])),
            Err(DecodeError::TooMany)
        ));
        assert_eq!(
            codings(&headers(&[b"gzip, identity, br, gzip"]))
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn every_coding_round_trips() {
        for (name, c, coded, want) in cases() {
            assert!(!coded.windows(MARKER.len()).any(|w| w == MARKER), "{name}");
            let (out, _) = run(c, vec![coded]).unwrap();
            assert_eq!(out, want, "{name}");
            assert!(out.windows(MARKER.len()).any(|w| w == MARKER), "{name}");
        }
        // The same through the header: x-gzip, and a stack of two.
        let c = codings(&headers(&[b"x-gzip"])).unwrap();
        assert_eq!(run(c, vec![gzip(&text())]).unwrap().0, text());
        let c = codings(&headers(&[b"gzip", b"br"])).unwrap();
        assert_eq!(run(c, vec![br(&gzip(&text()))]).unwrap().0, text());
    }

    #[test]
    fn no_coding_passes_the_body_as_it_is() {
        let (out, sizes) = run(vec![], vec![b"ab".to_vec(), b"c".to_vec()]).unwrap();
        assert_eq!(
            (out.as_slice(), sizes.as_slice()),
            (b"abc".as_slice(), [2, 1].as_slice())
        );
    }

    #[test]
    fn split_at_every_byte_decodes_the_same() {
        for (name, c, coded, want) in cases() {
            for i in 0..=coded.len() {
                let frames = vec![coded[..i].to_vec(), coded[i..].to_vec()];
                let (out, _) = run(c.clone(), frames).unwrap_or_else(|e| panic!("{name} {i}: {e}"));
                assert_eq!(out, want, "{name}, split at {i}");
            }
            let bytes = coded.iter().map(|b| vec![*b]).collect();
            assert_eq!(run(c, bytes).unwrap().0, want, "{name}, a byte per frame");
        }
    }

    #[test]
    fn a_body_cut_short_is_an_error() {
        for (name, c, coded, _) in cases() {
            // Where the first of two gzip members ends, the body may end.
            let boundary = match name {
                "gzip, 2 members" => gzip(&text()).len(),
                _ => 0,
            };
            for k in (1..coded.len()).filter(|k| *k != boundary) {
                let e = run(c.clone(), vec![coded[..k].to_vec()]).unwrap_err();
                assert!(corrupt(e).contains(": "), "{name}, cut at {k}");
            }
            // No bytes at all: an empty body labelled with a coding.
            assert_eq!(run(c, vec![]).unwrap().0, b"", "{name}");
        }
        let e = run(vec![Coding::Gzip], vec![gzip(b"abc")[..12].to_vec()]).unwrap_err();
        assert_eq!(corrupt(e), "gzip: the body ended inside the stream");
    }

    #[test]
    fn data_after_the_end_is_an_error() {
        for (name, c, mut coded, _) in cases() {
            coded.extend_from_slice(b"<html>");
            let e = run(c.clone(), vec![coded.clone()]).unwrap_err();
            assert!(corrupt(e).contains("after the end"), "{name}");
            // Also when the extra bytes come in a frame of their own.
            let n = coded.len() - 6;
            let e = run(c, vec![coded[..n].to_vec(), coded[n..].to_vec()]).unwrap_err();
            assert!(corrupt(e).contains("after the end"), "{name}");
        }
        // Half a second gzip magic, then the end: cut short.
        let mut g = gzip(b"abc");
        g.push(0x1f);
        let e = run(vec![Coding::Gzip], vec![g]).unwrap_err();
        assert_eq!(corrupt(e), "gzip: the body ended inside the stream");
    }

    #[test]
    fn corrupt_gzip_is_an_error() {
        let g = gzip(&text());
        let n = g.len();
        let flip = |at: usize| {
            let mut g = g.clone();
            g[at] ^= 0x01;
            g
        };
        let why = |g: Vec<u8>| corrupt(run(vec![Coding::Gzip], vec![g]).unwrap_err());
        assert_eq!(why(flip(n - 8)), "gzip: CRC-32 mismatch");
        assert_eq!(why(flip(n - 4)), "gzip: length mismatch");
        assert_eq!(why(flip(0)), "gzip: not a gzip stream");
        assert_eq!(why(flip(2)), "gzip: unknown compression method");
        // The deflate data: invalid, or decodes to other bytes (the CRC).
        for at in 10..n - 8 {
            assert!(why(flip(at)).starts_with("gzip: "), "flipped at {at}");
        }
        // zlib's Adler-32 is checked too.
        let mut z = zlib(&text());
        let last = z.len() - 1;
        z[last] ^= 1;
        assert!(run(vec![Coding::Deflate], vec![z]).is_err());
    }

    #[test]
    fn gzip_header_fields_are_skipped_and_checked() {
        let mut e = GzBuilder::new()
            .extra(&b"extra field"[..])
            .filename("reflected.json")
            .comment("a comment")
            .write(Vec::new(), Compression::fast());
        e.write_all(&text()).unwrap();
        let g = e.finish().unwrap();
        // Add a header CRC (FHCRC): flate2 does not write one.
        let header_len = 10 + 2 + 11 + 15 + 10;
        let mut header = g[..header_len].to_vec();
        header[3] |= FHCRC;
        let crc = crc32(&header);
        let mut with_crc = header.clone();
        with_crc.extend_from_slice(&(crc as u16).to_le_bytes());
        with_crc.extend_from_slice(&g[header_len..]);
        for coded in [g, with_crc.clone()] {
            for i in 0..=coded.len() {
                let frames = vec![coded[..i].to_vec(), coded[i..].to_vec()];
                assert_eq!(
                    run(vec![Coding::Gzip], frames).unwrap().0,
                    text(),
                    "split at {i}"
                );
            }
        }
        with_crc[header_len] ^= 1;
        let e = run(vec![Coding::Gzip], vec![with_crc]).unwrap_err();
        assert_eq!(corrupt(e), "gzip: header CRC mismatch");
    }

    fn crc32(b: &[u8]) -> u32 {
        let mut c = Crc::new();
        c.update(b);
        c.sum()
    }

    /// A streaming encoder of each coding, flushed per SSE event.
    enum Encoder {
        Gzip(GzEncoder<Vec<u8>>),
        Zlib(ZlibEncoder<Vec<u8>>),
        Br(Box<brotli::CompressorWriter<Vec<u8>>>),
        Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    }

    impl Encoder {
        fn all() -> Vec<(Coding, Encoder)> {
            let level = Compression::default();
            vec![
                (
                    Coding::Gzip,
                    Encoder::Gzip(GzEncoder::new(Vec::new(), level)),
                ),
                (
                    Coding::Deflate,
                    Encoder::Zlib(ZlibEncoder::new(Vec::new(), level)),
                ),
                (
                    Coding::Br,
                    Encoder::Br(Box::new(brotli::CompressorWriter::new(
                        Vec::new(),
                        4096,
                        5,
                        22,
                    ))),
                ),
                (
                    Coding::Zstd,
                    Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap()),
                ),
            ]
        }

        /// The coded bytes of one event, flushed (deflate: a sync flush)
        /// so all of it can be decoded.
        fn event(&mut self, event: &[u8]) -> Vec<u8> {
            let w: &mut dyn Write = match self {
                Encoder::Gzip(e) => e,
                Encoder::Zlib(e) => e,
                Encoder::Br(e) => &mut **e,
                Encoder::Zstd(e) => e,
            };
            w.write_all(event).unwrap();
            w.flush().unwrap();
            std::mem::take(match self {
                Encoder::Gzip(e) => e.get_mut(),
                Encoder::Zlib(e) => e.get_mut(),
                Encoder::Br(e) => e.get_mut(),
                Encoder::Zstd(e) => e.get_mut(),
            })
        }

        /// The coded end of the stream.
        fn end(self) -> Vec<u8> {
            match self {
                Encoder::Gzip(e) => e.finish().unwrap(),
                Encoder::Zlib(e) => e.finish().unwrap(),
                Encoder::Br(e) => e.into_inner(),
                Encoder::Zstd(e) => e.finish().unwrap(),
            }
        }
    }

    /// A compressed SSE stream flushed per event: each event is returned
    /// before the next input frame exists.
    #[test]
    fn each_flushed_event_arrives_before_the_next_frame() {
        for (coding, mut encoder) in Encoder::all() {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            let mut body = decode_body(vec![coding], StreamBody::new(stream));
            let send = |b: Vec<u8>| {
                tx.send(Ok::<_, Infallible>(Frame::data(Bytes::from(b))))
                    .unwrap()
            };
            for i in 0..5 {
                let event = format!("id: {i}\nevent: message\ndata: {{\"seq\":{i}}}\n\n");
                send(encoder.event(event.as_bytes()));
                // All of it now: the next frame is not sent yet (pending
                // means the body went on to wait for it).
                let mut got = Vec::new();
                while let Some(f) = body.frame().now_or_never() {
                    let f = f.expect("the stream goes on").unwrap();
                    got.extend_from_slice(&f.into_data().unwrap());
                }
                assert_eq!(got, event.as_bytes(), "{coding:?}, event {i}");
                assert!(!body.is_end_stream());
            }
            send(encoder.end());
            drop(tx);
            let rest = body.frame().now_or_never().expect("ended");
            assert!(rest.is_none(), "{coding:?}: nothing after the last event");
            assert!(body.is_end_stream());
        }
    }

    #[test]
    fn a_bomb_streams_in_bounded_frames() {
        // 48 MiB of zeros in one gzip member, about 1,000:1, fed in 8 KiB
        // frames. Encoding it all would dominate the test's time, so a
        // streaming encoder makes one sync-flushed MiB in steady state
        // (the same bytes each time once its window is all zeros) and the
        // member repeats it.
        const MIB: usize = 1 << 20;
        const TOTAL: usize = 48 * MIB;
        let zeros = vec![0u8; MIB];
        let mut e = DeflateEncoder::new(Vec::new(), Compression::default());
        let next = |e: &mut DeflateEncoder<Vec<u8>>| {
            e.write_all(&zeros).unwrap();
            e.flush().unwrap();
            std::mem::take(e.get_mut())
        };
        let (first, steady) = (next(&mut e), next(&mut e));
        assert_eq!(next(&mut e), steady, "steady state");
        e.write_all(&zeros).unwrap();
        let last = e.finish().unwrap();
        let mut bomb = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
        bomb.extend_from_slice(&first);
        for _ in 0..TOTAL / MIB - 2 {
            bomb.extend_from_slice(&steady);
        }
        bomb.extend_from_slice(&last);
        let (mut crc, mut one) = (Crc::new(), Crc::new());
        one.update(&zeros);
        for _ in 0..TOTAL / MIB {
            crc.combine(&one);
        }
        bomb.extend_from_slice(&crc.sum().to_le_bytes());
        bomb.extend_from_slice(&(TOTAL as u32).to_le_bytes());
        assert!(bomb.len() < TOTAL / 1000, "{}", bomb.len());

        let frames: Vec<_> = bomb.chunks(8 << 10).map(<[u8]>::to_vec).collect();
        let input_frames = frames.len();
        let mut body = decode_body(vec![Coding::Gzip], frames_body(frames));
        let (mut total, mut frames, mut full) = (0, 0, 0);
        while let Some(f) = body.frame().now_or_never().unwrap() {
            let n = f.unwrap().into_data().unwrap().len();
            assert!(n <= MAX_FRAME, "a frame of {n} bytes");
            total += n;
            frames += 1;
            full += usize::from(n == MAX_FRAME);
        }
        assert_eq!(total, TOTAL);
        // Short frames only where an input frame ran out, and while the
        // buffer grows (8, 16, 32 KiB).
        assert!(frames - full <= input_frames + 4, "{full} of {frames}");
    }

    #[test]
    fn oversized_windows_are_refused() {
        // zstd: a 16 MiB window, over RFC 9659's 8 MiB.
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        e.set_parameter(zstd::stream::raw::CParameter::WindowLog(24))
            .unwrap();
        e.write_all(&text()).unwrap();
        let z = e.finish().unwrap();
        assert_eq!(zstd::stream::decode_all(&z[..]).unwrap(), text());
        let e = run(vec![Coding::Zstd], vec![z]).unwrap_err();
        assert_eq!(corrupt(e), "zstd: invalid data");

        // br: the large-window extension (here 64 MiB).
        let params = brotli::enc::BrotliEncoderParams {
            large_window: true,
            lgwin: 26,
            ..Default::default()
        };
        let mut w = brotli::CompressorWriter::with_params(Vec::new(), 4096, &params);
        w.write_all(&text()).unwrap();
        let b = w.into_inner();
        let mut lenient = Vec::new();
        brotli_decompressor::BrotliDecompress(&mut &b[..], &mut lenient).unwrap();
        assert_eq!(lenient, text(), "a lenient decoder takes it");
        let e = run(vec![Coding::Br], vec![b]).unwrap_err();
        assert_eq!(corrupt(e), "br: invalid data");
    }

    #[test]
    fn trailers_follow_the_decoded_data() {
        let g = gzip(&text());
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(Bytes::from(g[..20].to_vec()))),
            Ok(Frame::data(Bytes::from(g[20..].to_vec()))),
            Ok(Frame::trailers(t.clone())),
        ];
        let mut body = decode_body(
            vec![Coding::Gzip],
            StreamBody::new(futures_util::stream::iter(frames)),
        );
        let mut data = Vec::new();
        let trailers = loop {
            let f = body.frame().now_or_never().unwrap().unwrap().unwrap();
            match f.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => break f.into_trailers().unwrap(),
            }
        };
        assert_eq!((data, trailers), (text(), t));
        assert!(body.is_end_stream());
        assert!(body.frame().now_or_never().unwrap().is_none());

        // Trailers after a stream cut short: the error instead.
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(Bytes::from(g[..20].to_vec()))),
            Ok(Frame::trailers(HeaderMap::new())),
        ];
        let mut body = decode_body(
            vec![Coding::Gzip],
            StreamBody::new(futures_util::stream::iter(frames)),
        );
        let mut last = None;
        while let Some(f) = body.frame().now_or_never().unwrap() {
            last = Some(f);
        }
        assert!(last.unwrap().is_err());
    }

    #[test]
    fn the_upstream_error_passes_through() {
        let frames = vec![
            Ok(Frame::data(Bytes::from(gzip(&text())[..20].to_vec()))),
            Err(std::io::Error::other("upstream reset")),
        ];
        let mut body = decode_body(
            vec![Coding::Gzip],
            StreamBody::new(futures_util::stream::iter(frames)),
        );
        let e = loop {
            match body.frame().now_or_never().unwrap().unwrap() {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(e.to_string(), "upstream reset");
        assert!(body.is_end_stream());
    }

    #[test]
    fn a_decoded_body_boxes_as_a_proxy_body() {
        let body = decode_body(
            vec![Coding::Gzip],
            http_body_util::Full::new(Bytes::from(gzip(&text()))),
        );
        let boxed: crate::proxy::response::body::ProxyBody = body.boxed();
        let out = boxed.collect().now_or_never().unwrap().unwrap();
        assert_eq!(out.to_bytes(), text());
    }
}
