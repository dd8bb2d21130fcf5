//! One level of escape decoding, as a client could apply it to what
//! tessera passes on: JSON and JavaScript string escapes (`\uXXXX` with
//! surrogate pairs, `\/`, `\xHH`, …), percent-encoding (`%XX`) and HTML
//! character references (`&#DD;`, `&#xHH;`, the named ones of ASCII
//! punctuation). The escapes of all three kinds are decoded wherever they
//! appear, in or out of a string: the matcher then sees a superset of what
//! any one decoder would produce.
//!
//! It is fed units (a byte and the span of raw bytes it stands for) and
//! emits units; a decoded unit spans every raw byte of its escape, so a
//! match found in decoded text maps back to the raw bytes to replace.

/// One byte of (decoded) text and the raw bytes `[start, end)` it came
/// from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    pub b: u8,
    pub start: u64,
    pub end: u64,
    /// An escape's first byte that this level found begins none, and that
    /// no level above can find to begin one either: what decided it (the
    /// bytes after it) passes up unchanged. A level above takes it as
    /// plain text instead of trying again, so a `%` in prose costs one
    /// level, not three.
    pub dead: bool,
}

/// A byte that may begin an escape.
pub(crate) fn introduces(b: u8) -> bool {
    matches!(b, b'\\' | b'%' | b'&')
}

/// The longest escape held while it is incomplete: `\uD83D\uDE00` is 12,
/// `&#x` and 16 digits and `;` is 20.
const MAX_PENDING: usize = 24;
/// Digits accepted in a numeric character reference.
const MAX_DIGITS: usize = 16;

/// Named character references of ASCII punctuation (HTML5), and the
/// upper-case forms the XML ones also have.
const NAMED: &[(&[u8], u8)] = &[
    (b"amp", b'&'),
    (b"AMP", b'&'),
    (b"lt", b'<'),
    (b"LT", b'<'),
    (b"gt", b'>'),
    (b"GT", b'>'),
    (b"quot", b'"'),
    (b"QUOT", b'"'),
    (b"apos", b'\''),
    (b"excl", b'!'),
    (b"num", b'#'),
    (b"dollar", b'$'),
    (b"percnt", b'%'),
    (b"lpar", b'('),
    (b"rpar", b')'),
    (b"ast", b'*'),
    (b"midast", b'*'),
    (b"plus", b'+'),
    (b"comma", b','),
    (b"period", b'.'),
    (b"sol", b'/'),
    (b"colon", b':'),
    (b"semi", b';'),
    (b"equals", b'='),
    (b"quest", b'?'),
    (b"commat", b'@'),
    (b"lsqb", b'['),
    (b"lbrack", b'['),
    (b"bsol", b'\\'),
    (b"rsqb", b']'),
    (b"rbrack", b']'),
    (b"Hat", b'^'),
    (b"lowbar", b'_'),
    (b"UnderBar", b'_'),
    (b"grave", b'`'),
    (b"DiacriticalGrave", b'`'),
    (b"lcub", b'{'),
    (b"lbrace", b'{'),
    (b"verbar", b'|'),
    (b"vert", b'|'),
    (b"VerticalLine", b'|'),
    (b"rcub", b'}'),
    (b"rbrace", b'}'),
    (b"tilde", b'~'),
];
const LONGEST_NAME: usize = 16;

/// What the bytes at the front of the pending ones are.
#[derive(Debug, PartialEq, Eq)]
enum Parse {
    /// Not known yet: more bytes are needed.
    More,
    /// Not an escape: the first byte stands for itself.
    Literal,
    /// An escape of `len` bytes standing for code point `cp`.
    Char { len: usize, cp: u32 },
    /// An escape of `len` bytes standing for one byte (`%XX`, `\xHH`).
    Byte { len: usize, b: u8 },
}

fn hex(b: u8) -> Option<u32> {
    (b as char).to_digit(16)
}

/// `n` hex digits at `p[at..]`: `Err(true)` if `p` ends first (all so far
/// were digits), `Err(false)` if a byte is not one.
fn hex_at(p: &[u8], at: usize, n: usize) -> Result<u32, bool> {
    let mut v = 0;
    for i in at..at + n {
        match p.get(i) {
            None => return Err(true),
            Some(&b) => v = v * 16 + hex(b).ok_or(false)?,
        }
    }
    Ok(v)
}

/// Parse the front of `p` (`eof`: nothing more will come).
fn parse(p: &[u8], eof: bool) -> Parse {
    let more = |complete: Parse| if eof { complete } else { Parse::More };
    match p[0] {
        b'\\' => {
            let Some(&c) = p.get(1) else {
                return more(Parse::Literal);
            };
            match c {
                // An invalid `\u` or `\x` stays as it is: what follows may
                // complete it once a later level decodes that.
                b'u' => match hex_at(p, 2, 4) {
                    Err(true) => more(Parse::Literal),
                    Err(false) => Parse::Literal,
                    Ok(hi @ 0xD800..=0xDBFF) => {
                        // A high surrogate wants `\uDC00`-`\uDFFF` next.
                        let lone = Parse::Char { len: 6, cp: 0xFFFD };
                        match (p.get(6), p.get(7)) {
                            (None, _) | (Some(b'\\'), None) => return more(lone),
                            (Some(b'\\'), Some(b'u')) => {}
                            _ => return lone,
                        }
                        match hex_at(p, 8, 4) {
                            Err(true) => more(lone),
                            Ok(lo @ 0xDC00..=0xDFFF) => Parse::Char {
                                len: 12,
                                cp: 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00),
                            },
                            _ => lone,
                        }
                    }
                    Ok(0xDC00..=0xDFFF) => Parse::Char { len: 6, cp: 0xFFFD },
                    Ok(cp) => Parse::Char { len: 6, cp },
                },
                b'x' => match hex_at(p, 2, 2) {
                    Err(true) => more(Parse::Literal),
                    Err(false) => Parse::Literal,
                    Ok(v) => Parse::Byte { len: 4, b: v as u8 },
                },
                // A backslash before another kind's introducer stays: `\%5c`
                // is what a JSON escape of `%5c` may leave for a percent
                // decoder (`\u0061` in all), and no serializer writes `\%`
                // or `\&` for its own sake. Read as JavaScript would (the
                // `%` alone), the percent reading would be lost at this
                // level, and a level is a superset of the readings only if
                // it keeps the one that clients use.
                b'%' | b'&' => Parse::Literal,
                _ => {
                    let b = match c {
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'0' => 0,
                        // `\/`, `\\`, `\"`, `\'`, and any other character
                        // escaped for no reason, as JavaScript reads it.
                        other => other,
                    };
                    Parse::Byte { len: 2, b }
                }
            }
        }
        b'%' => match hex_at(p, 1, 2) {
            Err(true) => more(Parse::Literal),
            Err(false) => Parse::Literal,
            Ok(v) => Parse::Byte { len: 3, b: v as u8 },
        },
        b'&' => match p.get(1) {
            None => more(Parse::Literal),
            Some(b'#') => numeric_reference(p, eof),
            Some(_) => named_reference(p, eof),
        },
        _ => Parse::Literal,
    }
}

/// `&#DD;` or `&#xHH;` (the `;` may be missing, as browsers accept).
fn numeric_reference(p: &[u8], eof: bool) -> Parse {
    let Some(&x) = p.get(2) else {
        return if eof { Parse::Literal } else { Parse::More };
    };
    let (radix, first) = if x == b'x' || x == b'X' {
        (16, 3)
    } else {
        (10, 2)
    };
    let mut i = first;
    let mut v: u64 = 0;
    while let Some(&b) = p.get(i) {
        let Some(d) = (b as char).to_digit(radix) else {
            break;
        };
        v = (v * u64::from(radix) + u64::from(d)).min(u64::from(u32::MAX));
        i += 1;
        if i - first > MAX_DIGITS {
            return Parse::Literal;
        }
    }
    if i == p.len() && !eof {
        return Parse::More;
    }
    if i == first {
        return Parse::Literal;
    }
    // Ended by a JSON or percent escape rather than `;`: the digits may go
    // on once a later level decodes that (`&#11\u0035;`), so the reference
    // is left for that level. Ended by `&`, it is a reference without its
    // `;` followed by the next (`&#115&#101`, as browsers read it): no
    // decoding of a reference adds a digit to this one.
    if p.get(i).is_some_and(|&b| b == b'\\' || b == b'%') {
        return Parse::Literal;
    }
    let len = if p.get(i) == Some(&b';') { i + 1 } else { i };
    let cp = match u32::try_from(v).ok().and_then(char::from_u32) {
        Some(c) if v != 0 => c as u32,
        _ => 0xFFFD,
    };
    Parse::Char { len, cp }
}

/// `&name;` of an ASCII punctuation character.
fn named_reference(p: &[u8], eof: bool) -> Parse {
    let name_end = p[1..]
        .iter()
        .position(|b| !b.is_ascii_alphanumeric())
        .map(|i| i + 1);
    match name_end {
        None if p.len() - 1 > LONGEST_NAME => Parse::Literal,
        None => {
            if eof {
                Parse::Literal
            } else {
                Parse::More
            }
        }
        Some(end) if p[end] == b';' => NAMED
            .iter()
            .find(|(n, _)| *n == &p[1..end])
            .map_or(Parse::Literal, |&(_, b)| Parse::Byte { len: end + 1, b }),
        Some(_) => Parse::Literal,
    }
}

/// The decoder of one level.
#[derive(Debug, Default)]
pub(crate) struct Unescape {
    pending: Vec<Unit>,
}

impl Unescape {
    /// Nothing is waiting to be decided.
    pub(crate) fn idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Where the first undecided raw byte is.
    pub(crate) fn pending_start(&self) -> Option<u64> {
        self.pending.first().map(|u| u.start)
    }

    /// Take `u`; append to `out` what is now decided, each with whether it
    /// is the input unit unchanged.
    pub(crate) fn push(&mut self, u: Unit, out: &mut Vec<(Unit, bool)>) {
        if self.pending.is_empty() && (u.dead || !introduces(u.b)) {
            out.push((u, true));
            return;
        }
        self.pending.push(u);
        self.drain(false, out);
    }

    /// The end of the text: decide what waits.
    pub(crate) fn finish(&mut self, out: &mut Vec<(Unit, bool)>) {
        self.drain(true, out);
        debug_assert!(self.pending.is_empty());
    }

    fn drain(&mut self, eof: bool, out: &mut Vec<(Unit, bool)>) {
        let mut bytes = [0u8; MAX_PENDING];
        while !self.pending.is_empty() {
            let n = self.pending.len();
            for (b, u) in bytes.iter_mut().zip(&self.pending) {
                *b = u.b;
            }
            let parsed = parse(&bytes[..n.min(MAX_PENDING)], eof || n >= MAX_PENDING);
            let (len, decoded) = match parsed {
                Parse::More => return,
                Parse::Literal => {
                    // Decided by the bytes after it alone, none of which can
                    // change at a level above (none begins an escape), so it
                    // is decided the same way there.
                    let dead = !eof
                        && n < MAX_PENDING
                        && self.pending[1..].iter().all(|u| !introduces(u.b));
                    out.push((
                        Unit {
                            dead,
                            ..self.pending[0]
                        },
                        true,
                    ));
                    self.pending.remove(0);
                    continue;
                }
                Parse::Byte { len, b } => (len, [b, 0, 0, 0, 1]),
                Parse::Char { len, cp } => {
                    let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
                    let mut buf = [0u8; 5];
                    let n = c.encode_utf8(&mut buf[..4]).len();
                    buf[4] = n as u8;
                    (len, buf)
                }
            };
            let span = Unit {
                b: 0,
                dead: false,
                start: self.pending[0].start,
                end: self.pending[len - 1].end,
            };
            for &b in &decoded[..usize::from(decoded[4])] {
                out.push((Unit { b, ..span }, false));
            }
            self.pending.drain(..len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `s` fed one byte at a time; the text and each unit's span.
    fn decode(s: &[u8]) -> (Vec<u8>, Vec<(u64, u64)>) {
        let mut d = Unescape::default();
        let mut out = vec![];
        for (i, &b) in s.iter().enumerate() {
            let i = i as u64;
            d.push(
                Unit {
                    b,
                    start: i,
                    end: i + 1,
                    dead: false,
                },
                &mut out,
            );
        }
        d.finish(&mut out);
        (
            out.iter().map(|(u, _)| u.b).collect(),
            out.iter().map(|(u, _)| (u.start, u.end)).collect(),
        )
    }

    fn text(s: &[u8]) -> Vec<u8> {
        decode(s).0
    }

    #[test]
    fn json_escapes() {
        assert_eq!(text(br#"\u0073\u0045cr\/t"#), b"sEcr/t");
        assert_eq!(text(br#"\"\\\b\f\n\r\t\'"#), b"\"\\\x08\x0c\n\r\t'");
        assert_eq!(text(br#"\uD83D\uDE00"#), "😀".as_bytes());
        assert_eq!(text(br#"\uD83Dx"#), "\u{FFFD}x".as_bytes());
        assert_eq!(text(br#"\uDE00"#), "\u{FFFD}".as_bytes());
        // An invalid escape stays for a later level to complete.
        assert_eq!(text(br#"\uZZ \x41\x4g"#), br#"\uZZ A\x4g"#);
        assert_eq!(text(br#"\u004"#), br#"\u004"#);
        assert_eq!(text(br#"\u00\u0037"#), br#"\u007"#);
        assert_eq!(text(b"end\\"), b"end\\");
        // Nested: one level decodes one layer.
        assert_eq!(text(br#"\\u0073"#), br#"\u0073"#);
        // A backslash before `%` or `&` stays, and they begin their own
        // escapes: `\%75` is `\u` (found by the fuzz target `redact`).
        assert_eq!(text(br#"\%750061\&#117;"#), br#"\u0061\u"#);
    }

    #[test]
    fn percent_and_html() {
        assert_eq!(text(b"%73%2f%2F%zz%4"), b"s//%zz%4");
        assert_eq!(text(b"&#115;&#x73;&#X53;&#83x"), b"ssSSx");
        // Ended by another escape, a reference waits for a later level.
        assert_eq!(text(b"&#X53%35;"), b"&#X535;");
        // Without `;`, one after another (found by the attack review).
        assert_eq!(text(b"&#X53&#83&#115"), b"SSs");
        assert_eq!(text(br#"&#11\u0035;"#), b"&#115;");
        assert_eq!(text(b"&sol;&amp;&plus;&nope;&amp"), b"/&+&nope;&amp");
        assert_eq!(
            text(b"&#;&#x;&#0;&#99999999999;"),
            "&#;&#x;\u{FFFD}\u{FFFD}".as_bytes()
        );
        assert_eq!(
            text(b"&#0000000000000000000115;"),
            b"&#0000000000000000000115;"
        );
        assert_eq!(
            text("&#x10FFFF;&#xD800;".as_bytes()),
            "\u{10FFFF}\u{FFFD}".as_bytes()
        );
    }

    #[test]
    fn spans_cover_each_escape() {
        let (t, spans) = decode(b"a\\u0073%73b");
        assert_eq!(t, b"assb");
        assert_eq!(spans, [(0, 1), (1, 7), (7, 10), (10, 11)]);
        // A multi-byte character: each of its bytes spans the escape.
        let (t, spans) = decode(br#"\u00e9"#);
        assert_eq!(t, "é".as_bytes());
        assert_eq!(spans, [(0, 6), (0, 6)]);
    }
}
