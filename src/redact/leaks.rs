//! Test and fuzz support, not API: the attacker's side of the redactor.
//!
//! tessera must never let an injected secret reach a caller in any form a
//! client could decode. This module checks that claim without trusting the
//! redactor's own code (it shares nothing with [`crate::redact`]):
//! - [`encode`] and [`encode_chain`] turn a secret into the forms an
//!   upstream could reflect it in ([`Encoding`]: JSON escapes, percent
//!   encoding, HTML character references, base64 at every alignment, hex,
//!   case changes, truncation), so a test or fuzz target can make an
//!   upstream echo it;
//! - [`leak`] is the oracle: it decodes an output every way a client could,
//!   up to [`MAX_DEPTH`] decodings deep, and reports the first decoding
//!   that shows a large fragment of the secret.
//!
//! Everything here is written to be obviously correct rather than fast:
//! plain loops over bytes, every candidate text kept whole. The oracle's
//! work is bounded ([`Budget`]); past the bound it answers that it could
//! not finish ([`BUDGET_EXCEEDED`]) rather than "no leak".

use std::collections::HashSet;
use std::fmt::Write as _;
use std::ops::Range;
use std::rc::Rc;

/// One form an upstream could reflect a secret in. Each is applied to the
/// whole input by [`encode`].
///
/// Input that is not UTF-8 is read, for the encodings that work on
/// characters (the JSON ones, HTML references, truncation), as UTF-8 where
/// it is valid and each byte of an invalid sequence as the Latin-1
/// character of that value; such input does not survive those encodings
/// byte for byte, as it would not in a real upstream either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Every character as a JSON `\uxxxx` escape, lower-case hex
    /// (surrogate pairs above U+FFFF).
    JsonUnicodeLower,
    /// Every character as a JSON `\uXXXX` escape, upper-case hex.
    JsonUnicodeUpper,
    /// Some characters as `\uxxxx` (lower-case hex), chosen per position
    /// from the seed; the others as `serde_json` writes them.
    JsonUnicodeSome,
    /// PHP's `json_encode`: `/` as `\/`, the rest as `serde_json` writes it.
    JsonPhp,
    /// Go's `encoding/json`: `<`, `>`, `&`, U+2028 and U+2029 as `\u`
    /// escapes, the rest as `serde_json` writes it.
    JsonGo,
    /// The inside of a JSON string as `serde_json::to_string` writes it
    /// (without the quotes).
    JsonString,
    /// Every byte as `%XX`, upper-case hex.
    PercentAllUpper,
    /// Every byte as `%xx`, lower-case hex.
    PercentAllLower,
    /// JavaScript's `encodeURIComponent`: every byte but `A-Za-z0-9` and
    /// `-_.!~*'()` as `%XX`, upper-case hex.
    PercentComponentUpper,
    /// As [`Encoding::PercentComponentUpper`], lower-case hex.
    PercentComponentLower,
    /// Every character as an HTML decimal reference `&#DD;`.
    HtmlDecimal,
    /// Every character as an HTML hex reference `&#xhh;`.
    HtmlHex,
    /// Standard base64 (`+/`), padded with `=`.
    Base64Std,
    /// Standard base64, without padding.
    Base64StdNoPad,
    /// Standard base64, each `=` of the padding written `%3D`.
    Base64StdPadPercent,
    /// URL-safe base64 (`-_`), padded with `=`.
    Base64Url,
    /// URL-safe base64, without padding.
    Base64UrlNoPad,
    /// URL-safe base64, each `=` of the padding written `%3D`.
    Base64UrlPadPercent,
    /// The input placed at a byte offset ≡ 0 (mod 3) among random bytes
    /// (from the seed) and the whole standard-base64 encoded: the input's
    /// base64 inside longer base64 text, at the first of its three
    /// alignments.
    Base64Embedded0,
    /// As [`Encoding::Base64Embedded0`], at a byte offset ≡ 1 (mod 3).
    Base64Embedded1,
    /// As [`Encoding::Base64Embedded0`], at a byte offset ≡ 2 (mod 3).
    Base64Embedded2,
    /// Every byte as two lower-case hex digits.
    HexLower,
    /// Every byte as two upper-case hex digits.
    HexUpper,
    /// ASCII letters upper-cased.
    Upper,
    /// ASCII letters lower-cased.
    Lower,
    /// ASCII letters' case swapped.
    SwapCase,
    /// The last character dropped.
    DropLast,
    /// The first character dropped.
    DropFirst,
}

impl Encoding {
    /// Every encoding, in declaration order.
    pub const ALL: [Encoding; 28] = [
        Encoding::JsonUnicodeLower,
        Encoding::JsonUnicodeUpper,
        Encoding::JsonUnicodeSome,
        Encoding::JsonPhp,
        Encoding::JsonGo,
        Encoding::JsonString,
        Encoding::PercentAllUpper,
        Encoding::PercentAllLower,
        Encoding::PercentComponentUpper,
        Encoding::PercentComponentLower,
        Encoding::HtmlDecimal,
        Encoding::HtmlHex,
        Encoding::Base64Std,
        Encoding::Base64StdNoPad,
        Encoding::Base64StdPadPercent,
        Encoding::Base64Url,
        Encoding::Base64UrlNoPad,
        Encoding::Base64UrlPadPercent,
        Encoding::Base64Embedded0,
        Encoding::Base64Embedded1,
        Encoding::Base64Embedded2,
        Encoding::HexLower,
        Encoding::HexUpper,
        Encoding::Upper,
        Encoding::Lower,
        Encoding::SwapCase,
        Encoding::DropLast,
        Encoding::DropFirst,
    ];

    /// The encoding a fuzz byte picks: `ALL[b % ALL.len()]`.
    pub fn from_byte(b: u8) -> Encoding {
        Encoding::ALL[usize::from(b) % Encoding::ALL.len()]
    }
}

/// `input` in the form `e`. `seed` picks whatever the encoding leaves to
/// chance (which characters [`Encoding::JsonUnicodeSome`] escapes, the
/// bytes around an embedded input); the same seed gives the same output.
pub fn encode(e: Encoding, input: &[u8], seed: u64) -> Vec<u8> {
    use Encoding::*;
    match e {
        JsonUnicodeLower => json_unicode(input, |_| true, false),
        JsonUnicodeUpper => json_unicode(input, |_| true, true),
        JsonUnicodeSome => json_unicode(
            input,
            |i| splitmix64(seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F)) & 1 == 1,
            false,
        ),
        JsonPhp => {
            let mut out = Vec::new();
            for &b in &json_string(&latin1_fallback(input)) {
                match b {
                    b'/' => out.extend_from_slice(b"\\/"),
                    b => out.push(b),
                }
            }
            out
        }
        JsonGo => {
            // serde_json writes `<`, `>`, `&` and U+2028/9 as themselves,
            // never inside an escape, so each occurrence is a character.
            let s = json_string(&latin1_fallback(input));
            let mut out = Vec::new();
            let mut i = 0;
            while i < s.len() {
                let (esc, used): (&[u8], usize) = match s[i..] {
                    [b'<', ..] => (b"\\u003c", 1),
                    [b'>', ..] => (b"\\u003e", 1),
                    [b'&', ..] => (b"\\u0026", 1),
                    [0xE2, 0x80, 0xA8, ..] => (b"\\u2028", 3),
                    [0xE2, 0x80, 0xA9, ..] => (b"\\u2029", 3),
                    _ => (&s[i..=i], 1),
                };
                out.extend_from_slice(esc);
                i += used;
            }
            out
        }
        JsonString => json_string(&latin1_fallback(input)),
        PercentAllUpper => percent(input, |_| true, true),
        PercentAllLower => percent(input, |_| true, false),
        PercentComponentUpper => percent(input, |b| !uri_component_safe(b), true),
        PercentComponentLower => percent(input, |b| !uri_component_safe(b), false),
        HtmlDecimal => html(input, |c| format!("&#{};", u32::from(c))),
        HtmlHex => html(input, |c| format!("&#x{:x};", u32::from(c))),
        Base64Std => base64_text(input, &base64::engine::general_purpose::STANDARD, false),
        Base64StdNoPad => base64_text(
            input,
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            false,
        ),
        Base64StdPadPercent => base64_text(input, &base64::engine::general_purpose::STANDARD, true),
        Base64Url => base64_text(input, &base64::engine::general_purpose::URL_SAFE, false),
        Base64UrlNoPad => base64_text(
            input,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            false,
        ),
        Base64UrlPadPercent => base64_text(input, &base64::engine::general_purpose::URL_SAFE, true),
        Base64Embedded0 => base64_embedded(input, 0, seed),
        Base64Embedded1 => base64_embedded(input, 1, seed),
        Base64Embedded2 => base64_embedded(input, 2, seed),
        HexLower => input
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect(),
        HexUpper => input
            .iter()
            .flat_map(|b| format!("{b:02X}").into_bytes())
            .collect(),
        Upper => input.to_ascii_uppercase(),
        Lower => input.to_ascii_lowercase(),
        SwapCase => input
            .iter()
            .map(|&b| {
                if b.is_ascii_uppercase() {
                    b.to_ascii_lowercase()
                } else {
                    b.to_ascii_uppercase()
                }
            })
            .collect(),
        DropLast => {
            let n = units(input).last().map_or(0, |&(_, len)| len);
            input[..input.len() - n].to_vec()
        }
        DropFirst => {
            let n = units(input).first().map_or(0, |&(_, len)| len);
            input[n..].to_vec()
        }
    }
}

/// `input` through each encoding of `chain` in turn: the first is applied
/// to `input`, the second to what the first gave, and so on. Each step
/// gets its own seed derived from `seed` and its position.
pub fn encode_chain(chain: &[Encoding], input: &[u8], seed: u64) -> Vec<u8> {
    let mut text = input.to_vec();
    for (i, &e) in chain.iter().enumerate() {
        text = encode(e, &text, splitmix64(seed.wrapping_add(i as u64)));
    }
    text
}

/// A 64-bit mix (SplitMix64's finaliser): the module's only randomness.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The characters of `input`, each with the number of bytes it took: UTF-8
/// where valid, each byte of an invalid sequence as the Latin-1 character
/// of that value.
fn units(input: &[u8]) -> Vec<(char, usize)> {
    let mut out = Vec::new();
    for chunk in input.utf8_chunks() {
        out.extend(chunk.valid().chars().map(|c| (c, c.len_utf8())));
        out.extend(chunk.invalid().iter().map(|&b| (char::from(b), 1)));
    }
    out
}

/// `input` as a string, read as [`units`] does.
fn latin1_fallback(input: &[u8]) -> String {
    units(input).into_iter().map(|(c, _)| c).collect()
}

/// The inside of the JSON string serde_json writes for `s`.
fn json_string(s: &str) -> Vec<u8> {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .as_bytes()
        .to_vec()
}

/// Each character as `\uXXXX` where `escape(position)` says so, as
/// serde_json writes it otherwise.
fn json_unicode(input: &[u8], escape: impl Fn(usize) -> bool, upper: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (c, _)) in units(input).into_iter().enumerate() {
        if escape(i) {
            let mut utf16 = [0u16; 2];
            for unit in c.encode_utf16(&mut utf16) {
                let s = if upper {
                    format!("\\u{unit:04X}")
                } else {
                    format!("\\u{unit:04x}")
                };
                out.extend_from_slice(s.as_bytes());
            }
        } else {
            out.extend(json_string(c.encode_utf8(&mut [0; 4])));
        }
    }
    out
}

/// What `encodeURIComponent` leaves as it is.
fn uri_component_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b)
}

/// Each byte `escape` picks as `%XX`.
fn percent(input: &[u8], escape: impl Fn(u8) -> bool, upper: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in input {
        if escape(b) {
            let s = if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            };
            out.extend_from_slice(s.as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Each character as the reference `reference` writes.
fn html(input: &[u8], reference: impl Fn(char) -> String) -> Vec<u8> {
    units(input)
        .into_iter()
        .flat_map(|(c, _)| reference(c).into_bytes())
        .collect()
}

fn base64_text(input: &[u8], engine: &impl base64::Engine, pad_as_percent: bool) -> Vec<u8> {
    let text = engine.encode(input);
    if pad_as_percent {
        text.replace('=', "%3D").into_bytes()
    } else {
        text.into_bytes()
    }
}

/// `input` at a byte offset ≡ `alignment` (mod 3), with 3 to 9 more
/// random bytes before it and 1 to 8 after, all as standard base64.
fn base64_embedded(input: &[u8], alignment: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut next = || {
        state = splitmix64(state);
        state
    };
    let before = alignment + 3 * (1 + (next() % 3) as usize);
    let after = 1 + (next() % 8) as usize;
    let mut bytes: Vec<u8> = (0..before).map(|_| next() as u8).collect();
    bytes.extend_from_slice(input);
    bytes.extend((0..after).map(|_| next() as u8));
    base64_text(&bytes, &base64::engine::general_purpose::STANDARD, false)
}

/// How many decodings deep [`leak`] looks: a chain of up to this many
/// decoders, each applied to what the one before gave.
pub const MAX_DEPTH: usize = 4;

/// How much work [`leak_within`] may do before it gives up. A candidate
/// text is the output or one of its distinct decodings at least
/// `min_fragment` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The most candidate texts examined.
    pub texts: usize,
    /// The most bytes examined, over all candidate texts.
    pub bytes: usize,
}

impl Budget {
    /// What [`leak`] allows: 20,000 texts, 64 MiB. Enough for a few hundred
    /// KiB of base64 of random bytes (about 300 KiB is checked in full, in
    /// about a second in a debug build); a MiB of it exceeds the texts.
    pub const DEFAULT: Budget = Budget {
        texts: 20_000,
        bytes: 64 << 20,
    };
}

impl Default for Budget {
    fn default() -> Self {
        Budget::DEFAULT
    }
}

/// How the answer of [`leak`] begins when the budget ran out before a
/// piece of the secret was found.
pub const BUDGET_EXCEEDED: &str = "oracle budget exceeded";

/// Whether any decoding of `output` shows a piece of `secret`: `Some` with
/// a description of the first found (the chain of decodings, where the
/// fragment lies in the secret and in the decoded text, and the fragment),
/// `None` if none does. Never panics.
///
/// A piece is a run of at least `min_fragment` bytes (taken as 1 if 0) of
/// `secret`, compared ignoring ASCII case, except in a text decoded from
/// base64 or hex (and what decodes from it): there a byte's case is its
/// value like any other, since base64 of the secret's upper-case copy is
/// not an encoding of the secret but of a different string (changing case
/// before encoding is outside the model, see `crate::redact`). A `secret` shorter than
/// `min_fragment` has no such pieces: `None`.
///
/// The decodings are chains of up to [`MAX_DEPTH`] of these, each applied
/// to the text the previous one gave (depth 0 is `output` itself):
/// - JSON unescape: `\uXXXX` (either hex case; a surrogate pair as one
///   character), `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, wherever a
///   backslash appears, in a JSON string or not; invalid escapes (a lone
///   surrogate among them) stay as they are;
/// - percent-decode: `%XX`, either hex case; invalid ones stay;
/// - HTML references: `&#DD;` and `&#xHH;` (or `&#XHH;`), with or without
///   the `;`, and the named `&lt;`, `&gt;`, `&amp;`, `&quot;`, `&apos;`;
/// - base64: every maximal run of at least 4 characters of the standard
///   alphabet (`A-Za-z0-9+/`), and separately of the URL-safe one
///   (`A-Za-z0-9-_`), decoded from each of its first 4 characters (a final
///   group of 2 or 3 characters gives 1 or 2 bytes; of 1, nothing); each
///   run and start is a text of its own. Padding (`=`, or `%3D`) is not in
///   either alphabet, so it ends a run;
/// - hex: every maximal run of at least 2 hex digits, decoded in pairs from
///   its first and from its second digit, each a text of its own.
///
/// All of these give at most as many bytes as they read, so a text shorter
/// than `min_fragment` can neither show a piece nor decode to one: such
/// texts are dropped, and with them every short base64 or hex run. A
/// decoding that changes nothing and a text already seen are dropped too.
///
/// The search is breadth first and stops at the first piece found. If it
/// spends [`Budget::DEFAULT`] without finding one, it answers
/// `Some("oracle budget exceeded: …")` (see [`BUDGET_EXCEEDED`]): an output
/// too large or too encoded to check counts as a failure, never as a pass.
/// Base64 of random bytes is the costly case: a standard-alphabet text is
/// also cut at every `+` and `/` into URL-safe runs, each a few candidate
/// texts, so about 300 KiB of it fits the budget and a MiB does not (it
/// gives up within about a second in a debug build). Use [`leak_within`]
/// for more.
pub fn leak(output: &[u8], secret: &[u8], min_fragment: usize) -> Option<String> {
    leak_within(output, secret, min_fragment, Budget::DEFAULT)
}

/// [`leak`] with another budget.
pub fn leak_within(
    output: &[u8],
    secret: &[u8],
    min_fragment: usize,
    budget: Budget,
) -> Option<String> {
    let min = min_fragment.max(1);
    if secret.len() < min {
        return None;
    }
    let mut search = Search {
        pieces: Pieces::new(secret, min),
        nodes: Vec::new(),
        seen: [HashSet::new(), HashSet::new()],
        bytes: 0,
        budget,
    };
    search.run(output).err()
}

/// A decoder of escapes: the whole text, with those it found decoded.
type Decoder = fn(&[u8]) -> Vec<u8>;

/// One decoding step, as the description of a chain names it.
#[derive(Clone, Copy, Debug)]
enum Step {
    Output,
    Json,
    Percent,
    Html,
    Base64 {
        url: bool,
        run: (usize, usize),
        start: usize,
    },
    Hex {
        run: (usize, usize),
        start: usize,
    },
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Step::Output => write!(f, "output"),
            Step::Json => write!(f, "json-unescape"),
            Step::Percent => write!(f, "percent-decode"),
            Step::Html => write!(f, "html-decode"),
            Step::Base64 { url, run, start } => write!(
                f,
                "base64-{}(run {}..{} from +{start})",
                if url { "url" } else { "std" },
                run.0,
                run.1
            ),
            Step::Hex { run, start } => {
                write!(f, "hex(run {}..{} from +{start})", run.0, run.1)
            }
        }
    }
}

/// A candidate text: the output or a decoding of another candidate.
struct Node {
    text: Rc<[u8]>,
    parent: Option<usize>,
    step: Step,
    depth: usize,
    /// Below a base64 or hex decoding: compared with case.
    exact: bool,
}

/// The breadth-first walk over decodings. Its methods' `Err` is the
/// verdict that stops the walk: a leak, or the budget spent.
struct Search<'s> {
    pieces: Pieces<'s>,
    nodes: Vec<Node>,
    /// The texts queued, by whether they are compared exactly.
    seen: [HashSet<Rc<[u8]>>; 2],
    bytes: usize,
    budget: Budget,
}

impl Search<'_> {
    fn run(&mut self, output: &[u8]) -> Result<(), String> {
        self.offer(None, Step::Output, output.to_vec())?;
        let mut i = 0;
        while i < self.nodes.len() {
            if self.nodes[i].depth < MAX_DEPTH {
                let text = Rc::clone(&self.nodes[i].text);
                self.expand(i, &text)?;
            }
            i += 1;
        }
        Ok(())
    }

    /// Every decoding of `text` (node `parent`) offered as a candidate.
    fn expand(&mut self, parent: usize, text: &[u8]) -> Result<(), String> {
        let min = self.pieces.min;
        // Each with the byte every escape it decodes starts with.
        let escapes: [(Step, u8, Decoder); 3] = [
            (Step::Json, b'\\', json_unescape),
            (Step::Percent, b'%', percent_decode),
            (Step::Html, b'&', html_decode),
        ];
        for (step, start, decode) in escapes {
            if !text.contains(&start) {
                continue;
            }
            let decoded = decode(text);
            if decoded != text {
                self.offer(Some(parent), step, decoded)?;
            }
        }
        let std_runs = runs(text, &BASE64_STD);
        for url in [false, true] {
            for run in runs(text, base64_table(url)) {
                if run.len() < 4 || run.len() * 3 / 4 < min {
                    continue;
                }
                // A URL-safe run that is also a standard one is all
                // letters and digits: it decodes the same either way.
                let same = |i: usize| std_runs[i] == run;
                if url
                    && std_runs
                        .binary_search_by_key(&run.start, |r| r.start)
                        .is_ok_and(same)
                {
                    continue;
                }
                for start in 0..4 {
                    let decoded = base64_decode(&text[run.start + start..run.end], url);
                    let step = Step::Base64 {
                        url,
                        run: (run.start, run.end),
                        start,
                    };
                    self.offer(Some(parent), step, decoded)?;
                }
            }
        }
        for run in runs(text, &HEX) {
            if run.len() < 2 || run.len() / 2 < min {
                continue;
            }
            for start in 0..2 {
                let decoded = hex_decode(&text[run.start + start..run.end]);
                let step = Step::Hex {
                    run: (run.start, run.end),
                    start,
                };
                self.offer(Some(parent), step, decoded)?;
            }
        }
        Ok(())
    }

    /// `text`, the decoding `step` of node `parent`, checked and queued,
    /// unless too short or already seen.
    fn offer(&mut self, parent: Option<usize>, step: Step, text: Vec<u8>) -> Result<(), String> {
        let exact = parent.is_some_and(|p| self.nodes[p].exact)
            || matches!(step, Step::Base64 { .. } | Step::Hex { .. });
        let seen = &self.seen[usize::from(exact)];
        if text.len() < self.pieces.min || seen.contains(text.as_slice()) {
            return Ok(());
        }
        self.bytes = self.bytes.saturating_add(text.len());
        if self.nodes.len() >= self.budget.texts || self.bytes > self.budget.bytes {
            return Err(format!(
                "{BUDGET_EXCEEDED}: {} candidate texts, {} bytes examined ({:?}) without finding \
                 the secret; the output is too large or too encoded to check",
                self.nodes.len(),
                self.bytes,
                self.budget,
            ));
        }
        let depth = parent.map_or(0, |p| self.nodes[p].depth + 1);
        let text: Rc<[u8]> = Rc::from(text);
        self.seen[usize::from(exact)].insert(Rc::clone(&text));
        self.nodes.push(Node {
            text,
            parent,
            step,
            depth,
            exact,
        });
        let last = self.nodes.len() - 1;
        match self.pieces.find(&self.nodes[last].text, exact) {
            Some(hit) => Err(self.describe(last, hit)),
            None => Ok(()),
        }
    }

    fn describe(&self, node: usize, hit: Hit) -> String {
        let mut chain = Vec::new();
        let mut at = Some(node);
        while let Some(i) = at {
            chain.push(self.nodes[i].step.to_string());
            at = self.nodes[i].parent;
        }
        chain.reverse();
        let text = &self.nodes[node].text;
        let mut out = format!(
            "secret[{}..{}] ({} of {} bytes, {}) at byte {} of ",
            hit.in_secret,
            hit.in_secret + hit.len,
            hit.len,
            self.pieces.secret.len(),
            if self.nodes[node].exact {
                "with case"
            } else {
                "ASCII case ignored"
            },
            hit.in_text,
        );
        out.push_str(&chain.join(" -> "));
        let _ = write!(
            out,
            ": \"{}\"",
            text[hit.in_text..hit.in_text + hit.len].escape_ascii()
        );
        out
    }
}

/// Where a piece of the secret was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hit {
    in_text: usize,
    in_secret: usize,
    len: usize,
}

/// The pieces of a secret: its windows of `min` bytes, by first byte,
/// all ASCII lower-cased. Any longer piece contains one of them.
struct Pieces<'s> {
    secret: &'s [u8],
    lower: Vec<u8>,
    min: usize,
    by_first: Vec<Vec<usize>>,
}

impl<'s> Pieces<'s> {
    /// `min` must be in `1..=secret.len()`.
    fn new(secret: &'s [u8], min: usize) -> Self {
        let lower = secret.to_ascii_lowercase();
        let mut by_first = vec![Vec::new(); 256];
        for s in 0..=secret.len() - min {
            by_first[usize::from(lower[s])].push(s);
        }
        Pieces {
            secret,
            lower,
            min,
            by_first,
        }
    }

    /// The leftmost piece in `text`, extended as far right as it goes;
    /// ignoring ASCII case unless `exact`.
    fn find(&self, text: &[u8], exact: bool) -> Option<Hit> {
        let min = self.min;
        if text.len() < min {
            return None;
        }
        let (text, secret) = if exact {
            (text.to_vec(), self.secret)
        } else {
            (text.to_ascii_lowercase(), &self.lower[..])
        };
        for t in 0..=text.len() - min {
            for &s in &self.by_first[usize::from(text[t].to_ascii_lowercase())] {
                if text[t..t + min] == secret[s..s + min] {
                    let mut len = min;
                    while t + len < text.len()
                        && s + len < secret.len()
                        && text[t + len] == secret[s + len]
                    {
                        len += 1;
                    }
                    return Some(Hit {
                        in_text: t,
                        in_secret: s,
                        len,
                    });
                }
            }
        }
        None
    }
}

/// The maximal runs of bytes that are digits in `table`.
fn runs(text: &[u8], table: &[u8; 256]) -> Vec<Range<usize>> {
    let is_digit = |i: usize| table[usize::from(text[i])] != NO;
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if is_digit(i) {
            let start = i;
            while i < text.len() && is_digit(i) {
                i += 1;
            }
            out.push(start..i);
        } else {
            i += 1;
        }
    }
    out
}

/// Not a digit, in the tables below.
const NO: u8 = 0xFF;

/// For each byte, its value as a digit of `digits` (the first occurrence),
/// or [`NO`].
const fn digits(digits: &[u8]) -> [u8; 256] {
    let mut table = [NO; 256];
    let mut i = digits.len();
    while i > 0 {
        i -= 1;
        table[digits[i] as usize] = i as u8;
    }
    table
}

const BASE64_STD: [u8; 256] =
    digits(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/");
const BASE64_URL: [u8; 256] =
    digits(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_");
/// Upper-case hex digits, as the second half of the list, come out 16
/// too high: [`hex_value`] corrects that.
const HEX: [u8; 256] = digits(b"0123456789abcdef0123456789ABCDEF");

fn hex_value(b: u8) -> Option<u8> {
    match HEX[usize::from(b)] {
        NO => None,
        v => Some(v % 16),
    }
}

/// The four hex digits at `text[at..]` as a number.
fn hex4(text: &[u8], at: usize) -> Option<u32> {
    let digits = text.get(at..at.checked_add(4)?)?;
    digits
        .iter()
        .try_fold(0u32, |n, &d| Some(n * 16 + u32::from(hex_value(d)?)))
}

fn push_char(out: &mut Vec<u8>, c: char) {
    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
}

/// JSON's backslash escapes decoded wherever they appear.
fn json_unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'\\' {
            let simple = match text.get(i + 1) {
                Some(b'"') => Some(b'"'),
                Some(b'\\') => Some(b'\\'),
                Some(b'/') => Some(b'/'),
                Some(b'b') => Some(0x08),
                Some(b'f') => Some(0x0C),
                Some(b'n') => Some(b'\n'),
                Some(b'r') => Some(b'\r'),
                Some(b't') => Some(b'\t'),
                _ => None,
            };
            if let Some(b) = simple {
                out.push(b);
                i += 2;
                continue;
            }
            if text.get(i + 1) == Some(&b'u') {
                if let Some(unit) = hex4(text, i + 2) {
                    if (0xD800..0xDC00).contains(&unit) {
                        let low = match text.get(i + 6..i + 8) {
                            Some(b"\\u") => hex4(text, i + 8),
                            _ => None,
                        };
                        if let Some(low @ 0xDC00..=0xDFFF) = low {
                            let c = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                            if let Some(c) = char::from_u32(c) {
                                push_char(&mut out, c);
                                i += 12;
                                continue;
                            }
                        }
                    } else if let Some(c) = char::from_u32(unit) {
                        push_char(&mut out, c);
                        i += 6;
                        continue;
                    }
                }
            }
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// `%XX` decoded wherever it appears.
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%' {
            if let (Some(hi), Some(lo)) = (
                text.get(i + 1).copied().and_then(hex_value),
                text.get(i + 2).copied().and_then(hex_value),
            ) {
                out.push(hi * 16 + lo);
                i += 3;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// HTML's numeric references (`;` optional) and the five XML named ones
/// decoded wherever they appear.
fn html_decode(text: &[u8]) -> Vec<u8> {
    const NAMED: [(&[u8], char); 5] = [
        (b"&lt;", '<'),
        (b"&gt;", '>'),
        (b"&amp;", '&'),
        (b"&quot;", '"'),
        (b"&apos;", '\''),
    ];
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    'text: while i < text.len() {
        if text[i] == b'&' {
            for (name, c) in NAMED {
                if text[i..].starts_with(name) {
                    push_char(&mut out, c);
                    i += name.len();
                    continue 'text;
                }
            }
            if let Some((c, used)) = numeric_reference(&text[i..]) {
                push_char(&mut out, c);
                i += used;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// The character of the numeric reference at the start of `text` (which
/// starts with `&`), and how many bytes it takes.
fn numeric_reference(text: &[u8]) -> Option<(char, usize)> {
    let mut i = 2;
    if text.get(1) != Some(&b'#') {
        return None;
    }
    let radix = match text.get(2) {
        Some(b'x' | b'X') => {
            i += 1;
            16
        }
        _ => 10,
    };
    let digits_start = i;
    let mut value: u32 = 0;
    while let Some(d) = text.get(i).and_then(|&b| char::from(b).to_digit(radix)) {
        // Saturates well above U+10FFFF, which no character reaches.
        value = value
            .saturating_mul(radix)
            .saturating_add(d)
            .min(0x0100_0000);
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    if text.get(i) == Some(&b';') {
        i += 1;
    }
    Some((char::from_u32(value)?, i))
}

fn base64_table(url: bool) -> &'static [u8; 256] {
    if url {
        &BASE64_URL
    } else {
        &BASE64_STD
    }
}

/// `text` (all of the alphabet) decoded in groups of 4; a final group of 2
/// or 3 gives the 1 or 2 bytes it holds, of 1 nothing.
fn base64_decode(text: &[u8], url: bool) -> Vec<u8> {
    let table = base64_table(url);
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    // The last `held` characters read, 6 bits each.
    let (mut bits, mut held) = (0u32, 0);
    for &c in text {
        bits = bits << 6 | u32::from(table[usize::from(c)] % 64);
        held += 1;
        if held == 4 {
            out.extend_from_slice(&[(bits >> 16) as u8, (bits >> 8) as u8, bits as u8]);
            (bits, held) = (0, 0);
        }
    }
    match held {
        2 => out.push((bits >> 4) as u8),
        3 => out.extend_from_slice(&[(bits >> 10) as u8, (bits >> 2) as u8]),
        _ => {}
    }
    out
}

/// `text` (all hex digits) decoded in pairs; an odd last digit dropped.
fn hex_decode(text: &[u8]) -> Vec<u8> {
    text.chunks_exact(2)
        .map(|p| hex_value(p[0]).unwrap_or(0) * 16 + hex_value(p[1]).unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;
    use Encoding::*;

    const MARKER: &[u8] = b"[redacted-by-tessera]";

    /// A token of `len` characters from `[A-Za-z0-9_-]`.
    fn token(len: usize, seed: u64) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
        (0..len as u64)
            .map(|i| ALPHABET[(splitmix64(seed.wrapping_mul(1000) + i) % 64) as usize])
            .collect()
    }

    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        (0..len as u64)
            .map(|i| splitmix64(seed ^ i.wrapping_mul(0x9E37)) as u8)
            .collect()
    }

    fn secrets() -> Vec<Vec<u8>> {
        vec![
            token(16, 1),
            token(27, 2),
            token(40, 3),
            token(64, 4),
            b"ab/cd+ef=gh/ij+kl=mn/op+qr=st/uv+wx==".to_vec(),
            b"a<b>c&d<e>f&g<h>i&j<k>l&m<n>o&p".to_vec(),
        ]
    }

    /// Where an upstream could put the encoded secret.
    fn contexts(encoded: &[u8]) -> [Vec<u8>; 3] {
        let wrap = |before: &[u8], after: &[u8]| [before, encoded, after].concat();
        [
            encoded.to_vec(),
            wrap(br#"{"echo":""#, br#""}"#),
            wrap(br#"data: {"x":""#, b"\"}\n\n"),
        ]
    }

    /// The marker the redactor writes for a secret of `len` bytes.
    fn marker(len: usize) -> Vec<u8> {
        let mut m: Vec<u8> = MARKER.iter().copied().take(len).collect();
        m.resize(len, b'*');
        m
    }

    fn is_truncation(e: Encoding) -> bool {
        matches!(e, DropLast | DropFirst)
    }

    /// Whether the chain's output is an encoding of the secret that a
    /// client can read back. A case change after a case-sensitive form
    /// (base64; JSON's `\u`, which has no `\U`) destroys what a client
    /// needs, unless a case-blind form (hex, percent-encoding of every
    /// byte, HTML references) came in between. A case change before base64
    /// or hex encodes another string than the secret: the oracle compares
    /// what those decode to with case, so it does not count either.
    fn readable(chain: &[Encoding]) -> bool {
        let (mut sensitive, mut cased) = (false, false);
        for &e in chain {
            match e {
                Upper | Lower | SwapCase if sensitive => return false,
                Upper | Lower | SwapCase => cased = true,
                HexLower | HexUpper if cased => return false,
                HexLower | HexUpper | PercentAllUpper | PercentAllLower | HtmlDecimal | HtmlHex => {
                    sensitive = false
                }
                Base64Std | Base64StdNoPad | Base64StdPadPercent | Base64Url | Base64UrlNoPad
                | Base64UrlPadPercent | Base64Embedded0 | Base64Embedded1 | Base64Embedded2
                    if cased =>
                {
                    return false
                }
                Base64Std | Base64StdNoPad | Base64StdPadPercent | Base64Url | Base64UrlNoPad
                | Base64UrlPadPercent | Base64Embedded0 | Base64Embedded1 | Base64Embedded2
                | JsonUnicodeLower | JsonUnicodeUpper | JsonUnicodeSome | JsonGo => {
                    sensitive = true
                }
                _ => {}
            }
        }
        true
    }

    /// Every readable chain without truncation is found in every context,
    /// at half the secret's length. How many chains that was.
    fn assert_found(chains: &[Vec<Encoding>]) -> usize {
        let checked: Vec<&Vec<Encoding>> = chains
            .iter()
            .filter(|c| !c.iter().any(|&e| is_truncation(e)) && readable(c))
            .collect();
        let mut missed = Vec::new();
        for (n, secret) in secrets().iter().enumerate() {
            for chain in &checked {
                let encoded = encode_chain(chain, secret, n as u64);
                for text in contexts(&encoded) {
                    match leak(&text, secret, secret.len() / 2) {
                        Some(d) if d.starts_with(BUDGET_EXCEEDED) => {
                            missed.push(format!("{chain:?} {}: {d}", text.escape_ascii()))
                        }
                        Some(_) => {}
                        None => missed.push(format!("{chain:?}: {}", text.escape_ascii())),
                    }
                }
            }
        }
        let (count, missed) = (missed.len(), missed.join("\n"));
        assert!(count == 0, "{count} missed:\n{missed}");
        checked.len()
    }

    fn singles() -> Vec<Vec<Encoding>> {
        Encoding::ALL.iter().map(|&e| vec![e]).collect()
    }

    fn pairs() -> Vec<Vec<Encoding>> {
        let all = Encoding::ALL;
        all.iter()
            .flat_map(|&a| all.iter().map(move |&b| vec![a, b]))
            .collect()
    }

    fn sampled_triples(count: u64) -> Vec<Vec<Encoding>> {
        (0..count)
            .map(|i| {
                let r = splitmix64(0x07e5_5e7a + i);
                vec![
                    Encoding::from_byte(r as u8),
                    Encoding::from_byte((r >> 8) as u8),
                    Encoding::from_byte((r >> 16) as u8),
                ]
            })
            .collect()
    }

    #[test]
    fn from_byte_covers_every_encoding() {
        for (i, &e) in Encoding::ALL.iter().enumerate() {
            assert_eq!(Encoding::from_byte(i as u8), e);
        }
        assert_eq!(Encoding::from_byte(255), Encoding::ALL[255 % 28]);
    }

    #[test]
    fn encoders_write_the_documented_forms() {
        let e = |e, s: &[u8]| String::from_utf8(encode(e, s, 7)).unwrap();
        assert_eq!(e(JsonUnicodeLower, b"a/<"), r"\u0061\u002f\u003c");
        assert_eq!(e(JsonUnicodeUpper, b"j/"), r"\u006A\u002F");
        assert_eq!(e(JsonUnicodeUpper, "🔑".as_bytes()), r"\uD83D\uDD11");
        let some = e(JsonUnicodeSome, b"abcdefghijklmnop");
        assert!(
            some.contains(r"\u00") && some.len() > 16 && some.len() < 16 * 6,
            "{some}"
        );
        assert_eq!(e(JsonPhp, b"a/b\"c"), r#"a\/b\"c"#);
        assert_eq!(
            e(JsonGo, "<a&b>\u{2028}".as_bytes()),
            r"\u003ca\u0026b\u003e\u2028"
        );
        assert_eq!(e(JsonString, b"a\"b\\c\n"), r#"a\"b\\c\n"#);
        assert_eq!(e(PercentAllUpper, b"a/"), "%61%2F");
        assert_eq!(e(PercentAllLower, b"a/"), "%61%2f");
        assert_eq!(e(PercentComponentUpper, b"a b/c~"), "a%20b%2Fc~");
        assert_eq!(e(PercentComponentLower, b"a/"), "a%2f");
        assert_eq!(e(HtmlDecimal, "a<é".as_bytes()), "&#97;&#60;&#233;");
        assert_eq!(e(HtmlHex, b"a<"), "&#x61;&#x3c;");
        assert_eq!(e(Base64Std, b"\xfb\xff"), "+/8=");
        assert_eq!(e(Base64StdNoPad, b"\xfb\xff"), "+/8");
        assert_eq!(e(Base64StdPadPercent, b"a"), "YQ%3D%3D");
        assert_eq!(e(Base64Url, b"\xfb\xff"), "-_8=");
        assert_eq!(e(Base64UrlNoPad, b"\xfb\xff"), "-_8");
        assert_eq!(e(Base64UrlPadPercent, b"\xfb\xff"), "-_8%3D");
        assert_eq!(e(HexLower, b"\xab\x01"), "ab01");
        assert_eq!(e(HexUpper, b"\xab\x01"), "AB01");
        assert_eq!(e(Upper, b"aB-c"), "AB-C");
        assert_eq!(e(Lower, b"aB-c"), "ab-c");
        assert_eq!(e(SwapCase, b"aB-c"), "Ab-C");
        assert_eq!(e(DropLast, "abé".as_bytes()), "ab");
        assert_eq!(e(DropFirst, "éab".as_bytes()), "ab");
        assert_eq!(e(DropFirst, b""), "");
        // The embedded secret sits at the alignment asked for, among
        // random bytes on both sides.
        let secret = b"0123456789abcdef";
        for (k, e) in [Base64Embedded0, Base64Embedded1, Base64Embedded2]
            .into_iter()
            .enumerate()
        {
            for seed in 0..20 {
                let text = encode(e, secret, seed);
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&text)
                    .unwrap();
                let at = bytes.windows(16).position(|w| w == secret).unwrap();
                assert_eq!(at % 3, k);
                assert!(at >= 3 && at + 16 < bytes.len());
            }
        }
        // The first encoding of a chain is applied first.
        assert_eq!(encode_chain(&[HexLower, Base64Std], b"ab", 0), b"NjE2Mg==");
        // Non-UTF-8 input is read as Latin-1 where invalid.
        assert_eq!(e(JsonUnicodeLower, b"a\xff"), r"\u0061\u00ff");
    }

    #[test]
    fn every_single_encoding_is_found() {
        // All but the two truncations.
        assert_eq!(assert_found(&singles()), 26);
    }

    #[test]
    fn every_pair_of_encodings_is_found() {
        // 26 × 26 without truncation, but for 39 with a case change after
        // base64 or `\u` and 33 with one before base64 or hex.
        assert_eq!(assert_found(&pairs()), 604);
    }

    #[test]
    fn sampled_triples_are_found() {
        let found = assert_found(&sampled_triples(400));
        assert!(found > 220, "{found}");
    }

    #[test]
    fn what_base64_and_hex_decode_to_is_compared_with_case() {
        let secret = b"________aaaaaaaaaaaa";
        // Base64 of the secret's tail is a leak; of its upper-case copy,
        // another string (found by the fuzz target `redact`).
        assert!(leak(b"YWFhYWFhYWFhYWE", secret, 10).is_some());
        assert_eq!(leak(b"QUFBQUFBQUFBQUF", secret, 10), None);
        assert!(leak(b"6161616161616161616161", secret, 10).is_some());
        assert_eq!(leak(b"4141414141414141414141", secret, 10), None);
        // The output itself is still read ignoring case.
        assert!(leak(b"AAAAAAAAAAA", secret, 10).is_some());
        // And a text reached both ways is read the stricter way.
        assert!(leak(b"AAAAAAAAAAA QUFBQUFBQUFBQUF", secret, 10).is_some());
    }

    #[test]
    fn chains_the_oracle_cannot_read_are_few() {
        // The chains `readable` excuses are only those with a case change
        // after base64 or `\u`, or before base64 or hex; make sure that
        // stays a small minority.
        let pairs = pairs();
        let unreadable = pairs.iter().filter(|c| !readable(c)).count();
        assert!(unreadable < pairs.len() / 10, "{unreadable}");
    }

    /// How many bytes of the secret a chain with one truncation may lose:
    /// one character, or a whole base64 group (3 bytes) when the first
    /// character of the secret's own base64 is dropped.
    fn truncation_loss(chain: &[Encoding]) -> usize {
        let base64 = [
            Base64Std,
            Base64StdNoPad,
            Base64StdPadPercent,
            Base64Url,
            Base64UrlNoPad,
            Base64UrlPadPercent,
        ];
        match chain {
            [.., before, DropFirst] if base64.contains(before) => 3,
            _ => 1,
        }
    }

    #[test]
    fn truncation_is_found_a_character_short() {
        let chains: Vec<Vec<Encoding>> = singles()
            .into_iter()
            .chain(pairs())
            .filter(|c| c.iter().filter(|&&e| is_truncation(e)).count() == 1 && readable(c))
            .collect();
        assert!(chains.len() > 90, "{}", chains.len());
        let mut missed = Vec::new();
        for (n, secret) in secrets().iter().enumerate() {
            for chain in &chains {
                let encoded = encode_chain(chain, secret, n as u64);
                let min = secret.len() - truncation_loss(chain);
                for text in contexts(&encoded) {
                    match leak(&text, secret, min) {
                        Some(d) if !d.starts_with(BUDGET_EXCEEDED) => {}
                        other => missed.push(format!("{chain:?} at {min}: {other:?}")),
                    }
                }
            }
            // And the truncation is real: the whole secret is not there.
            for e in [DropLast, DropFirst] {
                let text = encode(e, secret, 0);
                assert_eq!(leak(&text, secret, secret.len()), None);
                assert!(leak(&text, secret, secret.len() - 1).is_some());
            }
        }
        assert!(
            missed.is_empty(),
            "{} missed:\n{}",
            missed.len(),
            missed.join("\n")
        );
    }

    #[test]
    fn non_ascii_secrets_through_surrogate_pairs() {
        let secret = "pässwörd-🔑-token-🗝-0123456789".as_bytes();
        for e in [
            JsonUnicodeLower,
            JsonUnicodeUpper,
            JsonUnicodeSome,
            JsonString,
            JsonGo,
            HtmlDecimal,
            HtmlHex,
        ] {
            let text = encode(e, secret, 3);
            let found = leak(&text, secret, secret.len()).unwrap_or_default();
            let whole = format!("({0} of {0} bytes", secret.len());
            assert!(found.contains(&whole), "{e:?}: {found}");
        }
        // A lone surrogate is not a character: left alone, not a panic.
        assert_eq!(json_unescape(br"\ud83dx\udd11"), br"\ud83dx\udd11");
    }

    #[test]
    fn the_description_names_the_chain() {
        let secret = token(32, 9);
        let text = encode_chain(&[Base64Url, JsonUnicodeUpper, PercentAllLower], &secret, 1);
        let d = leak(&text, &secret, 16).unwrap();
        assert!(
            d.starts_with("secret[0..32] (32 of 32 bytes")
                && d.contains(" of output -> percent-decode -> json-unescape -> base64-std(run 0..43 from +0): \""),
            "{d}"
        );
        let plain = [b"xx".as_slice(), &secret].concat();
        let d = leak(&plain, &secret, 16).unwrap();
        assert!(d.contains("at byte 2 of output: \""), "{d}");
    }

    #[test]
    fn ordinary_json_is_not_a_leak() {
        let text = br#"{"jsonrpc":"2.0","result":{"content":[]}}"#;
        for seed in 0..200 {
            let secret = token(16 + (seed as usize % 49), seed);
            assert_eq!(leak(text, &secret, 12), None);
        }
        // Nor is a tool listing of ordinary words.
        let text = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"search_issues","description":"Searches the issues of a repository by keyword","inputSchema":{"type":"object"}}]}}"#;
        for seed in 0..50 {
            assert_eq!(leak(text, &token(32, seed), 16), None);
        }
    }

    #[test]
    fn random_base64_and_hex_are_not_a_leak() {
        let blob = random_bytes(12 << 10, 11);
        for (k, text) in [
            base64_text(&blob, &base64::engine::general_purpose::STANDARD, false),
            base64_text(&blob, &base64::engine::general_purpose::URL_SAFE, false),
            encode(HexLower, &blob, 0),
            encode_chain(&[Base64Std, JsonUnicodeSome, Base64Url], &blob[..4096], 0),
        ]
        .iter()
        .enumerate()
        {
            for seed in 0..2 {
                let secret = token(24 + 8 * seed as usize, 100 + seed);
                let half = secret.len() / 2;
                assert_eq!(leak(text, &secret, half), None, "text {k}");
            }
        }
    }

    #[test]
    fn the_marker_in_place_of_the_secret_is_not_a_leak() {
        let mut alarms = Vec::new();
        for (n, secret) in secrets().iter().enumerate() {
            let marker = marker(secret.len());
            // The marker where the encoded secret was, and the marker
            // encoded as the secret would have been.
            let mut texts: Vec<Vec<u8>> = contexts(&marker).into();
            for chain in singles().into_iter().chain(pairs()) {
                texts.extend(contexts(&encode_chain(&chain, &marker, n as u64)));
            }
            for text in texts {
                if let Some(d) = leak(&text, secret, secret.len() / 2) {
                    alarms.push(format!("{}: {d}", text.escape_ascii()));
                }
            }
        }
        assert!(alarms.is_empty(), "{}", alarms.join("\n"));
        assert_eq!(marker(8), b"[redacte");
        assert_eq!(marker(24), b"[redacted-by-tessera]***");
    }

    #[test]
    fn budget_covers_256_kib_of_base64_and_refuses_a_mib() {
        // Decided: a MiB of base64 of random bytes is beyond what the
        // default budget checks, and the oracle says so (never `None`),
        // quickly even in a debug build; a quarter of it is checked in full.
        let base64 = |len: usize| {
            let blob = random_bytes(len / 4 * 3, len as u64);
            base64_text(&blob, &base64::engine::general_purpose::STANDARD, false)
        };
        let secret = token(32, 13);
        let started = std::time::Instant::now();
        assert_eq!(leak(&base64(256 << 10), &secret, 16), None);
        let verdict = leak(&base64(1 << 20), &secret, 16).unwrap_or_default();
        let took = started.elapsed();
        assert!(verdict.starts_with(BUDGET_EXCEEDED), "{verdict}");
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
        // A smaller budget gives up sooner; the secret found within budget
        // is still a leak, not a budget answer.
        let small = Budget {
            texts: 2,
            bytes: 1 << 20,
        };
        let text = encode(Base64Std, &secret, 0);
        let found = leak_within(&text, &secret, 16, small).unwrap_or_default();
        assert!(found.starts_with("secret[0..32]"), "{found}");
        let mixed = [base64(1 << 10), b"!".to_vec(), text].concat();
        let verdict = leak_within(&mixed, &secret, 16, small).unwrap_or_default();
        assert!(verdict.starts_with(BUDGET_EXCEEDED), "{verdict}");
    }

    #[test]
    fn degenerate_arguments() {
        assert_eq!(leak(b"", b"", 0), None);
        assert_eq!(leak(b"abc", b"", 0), None);
        assert_eq!(leak(b"abc", b"ab", 3), None);
        assert!(leak(b"xaby", b"AB", 0).is_some());
        assert!(leak(b"xaby", b"b", 0).is_some());
        assert_eq!(leak(b"", b"secret", 3), None);
    }

    /// Text made of the pieces the decoders react to.
    fn hostile(len: usize, seed: u64) -> Vec<u8> {
        const PIECES: [&[u8]; 24] = [
            b"\\",
            b"\\u",
            b"\\ud83d",
            b"\\udd11",
            b"\\u00",
            b"%",
            b"%3D",
            b"%2",
            b"&#",
            b"&#x",
            b"&#X",
            b";",
            b"&amp",
            b"&lt;",
            b"=",
            b"A",
            b"f",
            b"9",
            b"+",
            b"/",
            b"-",
            b"_",
            b"99999999999",
            b"\xff",
        ];
        let mut out = Vec::new();
        let mut i = 0;
        while out.len() < len {
            out.extend_from_slice(PIECES[(splitmix64(seed ^ i) % 24) as usize]);
            i += 1;
        }
        out
    }

    #[test]
    fn never_panics_on_hostile_text() {
        for seed in 0..300 {
            let text = hostile(1 + (seed as usize * 7) % 600, seed);
            let secret = hostile(4 + seed as usize % 20, seed + 1);
            let _ = leak(&text, &secret, 1 + seed as usize % 6);
            let random = random_bytes(seed as usize * 3, seed);
            let _ = leak(&random, &random_bytes(8, seed + 1), 2);
            for e in Encoding::ALL {
                let _ = encode(e, &random, seed);
            }
        }
    }

    #[test]
    fn decoders_never_lengthen_a_text() {
        // What lets the oracle drop texts shorter than the fragment.
        for seed in 0..300 {
            let text = hostile(1 + seed as usize % 400, seed);
            for decoded in [
                json_unescape(&text),
                percent_decode(&text),
                html_decode(&text),
                base64_decode(
                    &text
                        .iter()
                        .copied()
                        .filter(|&c| BASE64_STD[usize::from(c)] != NO)
                        .collect::<Vec<_>>(),
                    false,
                ),
            ] {
                assert!(decoded.len() <= text.len());
            }
        }
        assert_eq!(
            html_decode(b"&#97&#x62;&#X63&#0000100;&#1114112;&amp;"),
            b"abcd&#1114112;&"
        );
        assert_eq!(percent_decode(b"%61%6A%zz%4"), b"aj%zz%4");
        assert_eq!(json_unescape(br#"\u0061\\u0062\/\q\"#), br#"a\u0062/\q\"#);
        assert_eq!(base64_decode(b"YWJjZA", false), b"abcd");
        assert_eq!(hex_decode(b"6162f"), b"ab");
    }

    #[test]
    fn piece_search_agrees_with_a_naive_one() {
        for seed in 0..2000u64 {
            let pick = |len: usize, s: u64| -> Vec<u8> {
                (0..len as u64)
                    .map(|i| b"abAB"[(splitmix64(s ^ (i << 20)) % 4) as usize])
                    .collect()
            };
            let text = pick((seed % 13) as usize, seed);
            let secret = pick(1 + (seed % 7) as usize, seed + 99);
            let min = 1 + (seed % 4) as usize;
            if secret.len() < min {
                continue;
            }
            let naive = secret
                .windows(min)
                .any(|w| text.windows(min).any(|t| t.eq_ignore_ascii_case(w)));
            let hit = Pieces::new(&secret, min).find(&text, false);
            assert_eq!(hit.is_some(), naive, "{text:?} {secret:?} {min}");
            if let Some(h) = hit {
                assert!(h.len >= min);
                assert!(text[h.in_text..h.in_text + h.len]
                    .eq_ignore_ascii_case(&secret[h.in_secret..h.in_secret + h.len]));
            }
        }
    }
}
