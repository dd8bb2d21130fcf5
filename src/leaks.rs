//! Test and fuzz support, not API: the attacker's side of the redactor.
//!
//! tessera must never let an injected secret reach a caller in any form a
//! client could decode. This module checks that claim without trusting the
//! redactor's own code (it shares nothing with [`crate::redact`]):
//! [`encode`] and [`encode_chain`] turn a secret into the forms an upstream
//! could reflect it in ([`Encoding`]: JSON escapes, percent encoding, HTML
//! character references, base64 at every alignment, hex, case changes,
//! truncation), so a test or fuzz target can make an upstream echo it.
//!
//! Everything here is written to be obviously correct rather than fast.

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

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;
    use Encoding::*;

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
}
