//! Canonical forms of what a caller sends, so that what tessera decides on
//! is what every upstream reads.
//!
//! - **Folded names.** Go's `encoding/json` (the decode of Go MCP servers)
//!   matches an object's member to a struct field ignoring letter case,
//!   under Unicode simple case folding (`ſ` reads as `s`, the Kelvin sign
//!   `K` as `k`), and lets the last of several matches win. tessera reads
//!   names exactly and forwards the original bytes, so a message holding
//!   `name` and `Name` would be decided on one and run on the other.
//!   [`distinct_members`] and [`check`] find such objects; the caller
//!   refuses them (see `jsonrpc::peek`).
//! - **Canonical JSON.** Policies read a tool's arguments as text
//!   (`context.arguments`); [`canonical`] gives them the text of what the
//!   upstream decodes: escapes undone (`\/etc` and `\u002fetc` are both
//!   `/etc`), members sorted, no insignificant whitespace, and numbers as
//!   the caller wrote them (never through `f64`, which would make
//!   `1000000000000000000001` and `1e21` one number).
//!
//! Both walk JSON text already accepted by serde_json (a `RawValue`), but
//! stand alone: anything that is not JSON is [`CanonicalError::Syntax`].

use std::borrow::Cow;
use std::ops::Range;

/// How deep objects and arrays may nest in a walked value; deeper is
/// refused (the walk recurses, and no MCP argument nests this deep).
pub const MAX_DEPTH: usize = 128;

/// Why a value has no single reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("an object holds two members whose names are equal ignoring letter case (or the same name twice); a Go upstream would read either")]
    AmbiguousMembers,
    #[error(
        "a string holds an unpaired UTF-16 surrogate escape, which upstreams decode differently"
    )]
    LoneSurrogate,
    #[error("the value nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the value is not valid JSON")]
    Syntax,
}

type Result<T> = std::result::Result<T, CanonicalError>;

// ---- folding -------------------------------------------------------------

/// One character folded for comparing names.
///
/// Go's `encoding/json` folds a name rune by rune to the smallest rune of
/// its `unicode.SimpleFold` orbit (`ſ`, `s`, `S` → `S`; `K`, `k`, `K` →
/// `K`; and since Go 1.21 `ı` → `I`, `İ` → `i`). Rust's standard library
/// has no simple case folding, and no crate we already depend on does;
/// `caseless` and `unicase` fold *fully* (`ß` → `ss`), which joins names
/// Go keeps apart and would still need these special cases. Lower case of
/// the upper case puts each orbit on one character: `ſ` → `S` → `s`,
/// `K` → `K` → `k`, `ς` → `Σ` → `σ`, `ϑ` → `Θ` → `θ`, `ı` → `I` → `i`.
/// Where the upper case is several characters (`ß` → `SS`, `ᾈ` → `ἈΙ`)
/// the character's own lower case is taken, and where the lower case is
/// several (only `İ` → `i̇`) its first, `i`, as Go's simple mapping does.
/// This may join a few characters simple folding keeps apart; joining
/// more only refuses more, never lets an ambiguous message through.
pub fn fold_char(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    let mut up = c.to_uppercase();
    let u = match (up.next(), up.next()) {
        (Some(u), None) => u,
        _ => c,
    };
    u.to_lowercase().next().unwrap_or(u)
}

/// `s` folded (see [`fold_char`]): lower case, Unicode-aware.
pub fn fold(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| !b.is_ascii_uppercase() && b.is_ascii()) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(fold_char).collect())
}

/// Whether `a` and `b` are equal once folded.
pub fn fold_eq(a: &str, b: &str) -> bool {
    // Most names compared differ in their first letter: two ASCII first
    // characters that differ in more than case fold to different ones
    // (a character that folds to an ASCII letter, `ſ` or `K`, is not
    // ASCII itself), so the rest need not be read.
    if let (Some(x), Some(y)) = (a.as_bytes().first(), b.as_bytes().first()) {
        if x.is_ascii() && y.is_ascii() && !x.eq_ignore_ascii_case(y) {
            return false;
        }
    }
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    a.chars().map(fold_char).eq(b.chars().map(fold_char))
}

/// Whether `name` differs from `known` but folds to it (`METHOD`,
/// `paramſ`): a name Go would read as `known` and tessera would not.
pub fn folds_to(name: &str, known: &str) -> bool {
    name != known && fold_eq(name, known)
}

/// Whether `s` folded starts with `prefix` (already folded).
pub fn fold_starts_with(s: &str, prefix: &str) -> bool {
    let mut it = s.chars().map(fold_char);
    prefix.chars().all(|p| it.next() == Some(p))
}

/// Refuse an object whose member names are not distinct once folded
/// (exact duplicates included). Few members are compared pairwise, with
/// no allocation; many are folded and sorted, so a huge object costs
/// `n log n`, not `n²`.
pub fn distinct_members<S: AsRef<str>>(names: &[S]) -> Result<()> {
    const PAIRWISE: usize = 8;
    if names.len() < 2 {
        return Ok(());
    }
    if names.len() <= PAIRWISE {
        for i in 1..names.len() {
            for j in 0..i {
                if fold_eq(names[i].as_ref(), names[j].as_ref()) {
                    return Err(CanonicalError::AmbiguousMembers);
                }
            }
        }
        return Ok(());
    }
    let mut folded: Vec<Cow<str>> = names.iter().map(|n| fold(n.as_ref())).collect();
    folded.sort_unstable();
    if folded.windows(2).any(|w| w[0] == w[1]) {
        return Err(CanonicalError::AmbiguousMembers);
    }
    Ok(())
}

/// The bytes that end a run of plain string bytes: the closing quote, an
/// escape, or a control character (an error).
const STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = c < 0x20 || c == b'"' as usize || c == b'\\' as usize;
        c += 1;
    }
    t
};

// ---- the walk ------------------------------------------------------------

/// Check a JSON value at every depth: no object with members equal once
/// folded, no unpaired surrogate escape, no deeper nesting than
/// [`MAX_DEPTH`]. Allocates only for names holding escapes and for
/// objects of more than a few members.
pub fn check(json: &str) -> Result<()> {
    let mut r = Reader::new(json);
    r.ws();
    r.value(None, 0)?;
    r.end()
}

/// The canonical text of a JSON value: what [`check`] refuses is refused;
/// members sorted by name (by UTF-16 code units, as RFC 8785); no
/// whitespace between tokens; strings decoded and written with the fewest
/// escapes (`"`, `\` and control characters only, as RFC 8785); numbers
/// as written (RFC 8785 would rewrite them through `f64`).
pub fn canonical(json: &str) -> Result<String> {
    let mut out = String::with_capacity(json.len());
    let mut r = Reader::new(json);
    r.ws();
    r.value(Some(&mut out), 0)?;
    r.end()?;
    Ok(out)
}

/// A cursor over JSON text, with one stack of member names shared by
/// every object being read (each object uses the top of it and pops what
/// it pushed), so a walk allocates it once.
struct Reader<'a> {
    s: &'a str,
    i: usize,
    /// Names of the members of the objects being read, with where each
    /// member's canonical value is in the output (writing only).
    names: Vec<(Cow<'a, str>, Range<usize>)>,
}

impl<'a> Reader<'a> {
    fn new(s: &'a str) -> Self {
        Reader {
            s,
            i: 0,
            names: Vec::new(),
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.s.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn expect(&mut self, b: u8) -> Result<()> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(CanonicalError::Syntax)
        }
    }

    fn end(&mut self) -> Result<()> {
        self.ws();
        if self.i == self.s.len() {
            Ok(())
        } else {
            Err(CanonicalError::Syntax)
        }
    }

    /// One value (leading whitespace already skipped), written to `out`
    /// in canonical form when there is one.
    fn value(&mut self, mut out: Option<&mut String>, depth: usize) -> Result<()> {
        match self.peek().ok_or(CanonicalError::Syntax)? {
            b'{' => self.object(out, depth + 1),
            b'[' => self.array(out, depth + 1),
            b'"' => {
                let s = self.string()?;
                if let Some(out) = out.as_deref_mut() {
                    write_string(&s, out);
                }
                Ok(())
            }
            b't' => self.literal("true", out),
            b'f' => self.literal("false", out),
            b'n' => self.literal("null", out),
            b'-' | b'0'..=b'9' => {
                let n = self.number()?;
                if let Some(out) = out {
                    out.push_str(n);
                }
                Ok(())
            }
            _ => Err(CanonicalError::Syntax),
        }
    }

    fn literal(&mut self, word: &str, out: Option<&mut String>) -> Result<()> {
        if !self.s[self.i..].starts_with(word) {
            return Err(CanonicalError::Syntax);
        }
        self.i += word.len();
        if let Some(out) = out {
            out.push_str(word);
        }
        Ok(())
    }

    fn array(&mut self, mut out: Option<&mut String>, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(CanonicalError::TooDeep);
        }
        self.expect(b'[')?;
        if let Some(out) = out.as_deref_mut() {
            out.push('[');
        }
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                self.value(out.as_deref_mut(), depth)?;
                self.ws();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        if let Some(out) = out.as_deref_mut() {
                            out.push(',');
                        }
                    }
                    Some(b']') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(CanonicalError::Syntax),
                }
            }
        }
        if let Some(out) = out {
            out.push(']');
        }
        Ok(())
    }

    fn object(&mut self, mut out: Option<&mut String>, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(CanonicalError::TooDeep);
        }
        self.expect(b'{')?;
        let base = self.names.len();
        // Members are written in the order read, then reordered.
        let start = out.as_deref().map_or(0, String::len);
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(CanonicalError::Syntax);
                }
                let name = self.string()?;
                self.ws();
                self.expect(b':')?;
                self.ws();
                let from = out.as_deref().map_or(0, String::len);
                // A member's value pushes (and pops) its own members' names
                // above this object's: the name goes on after it.
                self.value(out.as_deref_mut(), depth)?;
                let to = out.as_deref().map_or(0, String::len);
                self.names.push((name, from..to));
                self.ws();
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(CanonicalError::Syntax),
                }
            }
        }
        if let Err(e) = distinct(&self.names[base..]) {
            self.names.truncate(base);
            return Err(e);
        }
        if let Some(out) = out {
            let members = &mut self.names[base..];
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            let written = out.split_off(start);
            out.push('{');
            for (k, (name, range)) in members.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                out.push_str(&written[range.start - start..range.end - start]);
            }
            out.push('}');
        }
        self.names.truncate(base);
        Ok(())
    }

    /// A string (at its opening quote), decoded; borrowed when it holds no
    /// escape.
    fn string(&mut self) -> Result<Cow<'a, str>> {
        self.expect(b'"')?;
        let b = self.bytes();
        let start = self.i;
        // The common case: no escape before the closing quote. Plain bytes
        // are skipped by a table (the arguments' strings are most of a
        // call's bytes).
        loop {
            while b.get(self.i).is_some_and(|&c| !STRING_STOP[usize::from(c)]) {
                self.i += 1;
            }
            match b.get(self.i) {
                None => return Err(CanonicalError::Syntax),
                Some(b'"') => {
                    let s = &self.s[start..self.i];
                    self.i += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(&c) if c < 0x20 => return Err(CanonicalError::Syntax),
                Some(_) => self.i += 1,
            }
        }
        let mut owned = String::from(&self.s[start..self.i]);
        loop {
            match b.get(self.i) {
                None => return Err(CanonicalError::Syntax),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Cow::Owned(owned));
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = match b.get(self.i).ok_or(CanonicalError::Syntax)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            self.i += 1;
                            let c = self.unicode_escape()?;
                            owned.push(c);
                            continue;
                        }
                        _ => return Err(CanonicalError::Syntax),
                    };
                    self.i += 1;
                    owned.push(c);
                }
                Some(&c) if c < 0x20 => return Err(CanonicalError::Syntax),
                Some(_) => {
                    // Copy up to the next quote or backslash at once (the
                    // text is UTF-8, and both are ASCII).
                    let from = self.i;
                    while b.get(self.i).is_some_and(|&c| !STRING_STOP[usize::from(c)]) {
                        self.i += 1;
                    }
                    owned.push_str(&self.s[from..self.i]);
                }
            }
        }
    }

    /// The character of a `\uXXXX` escape (the `\u` consumed), with the
    /// low half of a surrogate pair; an unpaired half is refused.
    fn unicode_escape(&mut self) -> Result<char> {
        let hi = self.hex4()?;
        match hi {
            0xD800..=0xDBFF => {
                if self.bytes().get(self.i..self.i + 2) != Some(b"\\u") {
                    return Err(CanonicalError::LoneSurrogate);
                }
                self.i += 2;
                let lo = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(CanonicalError::LoneSurrogate);
                }
                let c = 0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                char::from_u32(c).ok_or(CanonicalError::Syntax)
            }
            0xDC00..=0xDFFF => Err(CanonicalError::LoneSurrogate),
            _ => char::from_u32(u32::from(hi)).ok_or(CanonicalError::Syntax),
        }
    }

    fn hex4(&mut self) -> Result<u16> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .ok_or(CanonicalError::Syntax)?;
        if !digits.bytes().all(|d| d.is_ascii_hexdigit()) {
            return Err(CanonicalError::Syntax);
        }
        self.i += 4;
        u16::from_str_radix(digits, 16).map_err(|_| CanonicalError::Syntax)
    }

    /// A number, as written: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Result<&'a str> {
        let b = self.bytes();
        let start = self.i;
        let digits = |i: &mut usize| {
            let from = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > from
        };
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return Err(CanonicalError::Syntax),
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return Err(CanonicalError::Syntax);
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !digits(&mut i) {
                return Err(CanonicalError::Syntax);
            }
        }
        self.i = i;
        Ok(&self.s[start..i])
    }
}

fn distinct(members: &[(Cow<'_, str>, Range<usize>)]) -> Result<()> {
    struct Name<'n, 'a>(&'n (Cow<'a, str>, Range<usize>));
    impl AsRef<str> for Name<'_, '_> {
        fn as_ref(&self) -> &str {
            &self.0 .0
        }
    }
    if members.len() <= 8 {
        // Pairwise, without collecting.
        for i in 1..members.len() {
            for j in 0..i {
                if fold_eq(&members[i].0, &members[j].0) {
                    return Err(CanonicalError::AmbiguousMembers);
                }
            }
        }
        return Ok(());
    }
    let names: Vec<Name> = members.iter().map(Name).collect();
    distinct_members(&names)
}

/// `s` as a JSON string with the fewest escapes (RFC 8785 §3.2.2.2).
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut from = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[from..i]);
        if esc.is_empty() {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push_str(esc);
        }
        from = i + c.len_utf8();
    }
    out.push_str(&s[from..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_joins_what_go_joins() {
        // ASCII case, the long s, the Kelvin sign, dotless and dotted i.
        for (a, b) in [
            ("Name", "name"),
            ("paramſ", "params"),
            ("\u{212a}ey", "key"),
            ("ıd", "id"),
            ("İd", "id"),
            ("ς", "Σ"),
            ("ϑ", "θ"),
            ("ẞ", "ß"),
            ("ᾈ", "ᾀ"),
            ("\u{2126}", "ω"),
        ] {
            assert!(fold_eq(a, b), "{a} ~ {b}");
            assert_eq!(fold(a), fold(b), "{a} ~ {b}");
        }
        for (a, b) in [("name", "names"), ("ß", "ss"), ("a", "ä"), ("", "x")] {
            assert!(!fold_eq(a, b), "{a} !~ {b}");
        }
        assert!(folds_to("METHOD", "method"));
        assert!(!folds_to("method", "method"));
        assert!(fold_starts_with("NOTIFICATIONS/x", "notifications/"));
        assert!(!fold_starts_with("notif", "notifications/"));
        assert_eq!(fold("Delete_Repo"), "delete_repo");
        assert!(matches!(fold("plain_name"), Cow::Borrowed(_)));
    }

    #[test]
    fn fold_eq_reads_past_a_first_letter_only_it_could_fold() {
        // The first-letter shortcut decides only between two ASCII letters.
        assert!(fold_eq("Path", "path"));
        assert!(!fold_eq("path", "bath"));
        assert!(!fold_eq("path", ""));
        assert!(fold_eq("", ""));
        // A non-ASCII first letter that folds to an ASCII one.
        assert!(fold_eq("\u{17f}ession", "session"));
        assert!(fold_eq("session", "\u{17f}ession"));
        assert!(fold_eq("\u{212a}ey", "key"));
        assert!(!fold_eq("\u{17f}ession", "version"));
    }

    #[test]
    fn distinct_members_pairwise_and_sorted() {
        assert!(distinct_members(&["a", "b", "c"]).is_ok());
        assert!(distinct_members(&["a", "b", "A"]).is_err());
        assert!(distinct_members(&["a", "a"]).is_err());
        let many: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
        assert!(distinct_members(&many).is_ok());
        let mut dup = many.clone();
        dup.push("K\u{212a}".replace('K', "k").replace("k\u{212a}", "K5"));
        assert!(distinct_members(&dup).is_err(), "K5 folds to k5");
    }

    #[test]
    fn check_refuses_folded_duplicates_at_every_depth() {
        assert_eq!(
            check(r#"{"path":"a","Path":"b"}"#),
            Err(CanonicalError::AmbiguousMembers)
        );
        assert_eq!(
            check(r#"{"a":{"x":1,"x":2}}"#),
            Err(CanonicalError::AmbiguousMembers)
        );
        assert_eq!(
            check(r#"[1,{"s":1,"\u017f":2}]"#),
            Err(CanonicalError::AmbiguousMembers)
        );
        // Siblings may share names: they are different objects.
        assert_eq!(check(r#"[{"x":1},{"x":2}]"#), Ok(()));
        assert_eq!(check(r#"{"a":{"x":1},"b":{"x":2}}"#), Ok(()));
        let big = format!(
            "{{{}}}",
            (0..50)
                .map(|i| format!("\"k{i}\":{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(check(&big), Ok(()));
        let big_dup = big.replacen("\"k7\"", "\"K49\"", 1);
        assert_eq!(check(&big_dup), Err(CanonicalError::AmbiguousMembers));
    }

    #[test]
    fn check_refuses_lone_surrogates_depth_and_garbage() {
        assert_eq!(check(r#""\ud800""#), Err(CanonicalError::LoneSurrogate));
        assert_eq!(check(r#""\udc00x""#), Err(CanonicalError::LoneSurrogate));
        assert_eq!(
            check(r#""\ud800\u0041""#),
            Err(CanonicalError::LoneSurrogate)
        );
        assert_eq!(check(r#""\ud83d\ude00""#), Ok(()));
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(check(&deep), Err(CanonicalError::TooDeep));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert_eq!(check(&ok), Ok(()));
        for bad in [
            "",
            "{",
            "[1,]",
            "01",
            "1.",
            "-",
            "tru",
            "\"\u{1}\"",
            "{\"a\" 1}",
            "1 2",
        ] {
            assert_eq!(check(bad), Err(CanonicalError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn canonical_decodes_sorts_and_keeps_numbers() {
        let c = |s: &str| canonical(s).unwrap();
        assert_eq!(
            c(r#"{"path":"\/etc\/passwd"}"#),
            r#"{"path":"/etc/passwd"}"#
        );
        assert_eq!(
            c(r#"{"path":"\u002fetc/passwd"}"#),
            r#"{"path":"/etc/passwd"}"#
        );
        assert_eq!(
            c(r#" { "b" : 1 , "a" : [ 2 , { "d":null, "c":true } ] } "#),
            r#"{"a":[2,{"c":true,"d":null}],"b":1}"#
        );
        assert_eq!(
            c(r#"{"amount":1000000000000000000001,"f":1.50,"e":-1E+2}"#),
            r#"{"amount":1000000000000000000001,"e":-1E+2,"f":1.50}"#
        );
        // The fewest escapes: quote, backslash and controls only.
        assert_eq!(
            c(r#""a\"b\\c\n\u0001\u00e9\u2028/""#),
            "\"a\\\"b\\\\c\\n\\u0001é\u{2028}/\""
        );
        assert_eq!(c(r#""\ud83d\ude00""#), "\"😀\"");
        // Escaped names sort by what they decode to.
        assert_eq!(c(r#"{"\u0062":1,"a":2}"#), r#"{"a":2,"b":1}"#);
        // By UTF-16 code units (RFC 8785): U+1F600 (D83D DE00) before
        // U+FF21, where code points would sort the other way.
        assert_eq!(c("{\"Ａ\":2,\"😀\":1}"), "{\"😀\":1,\"Ａ\":2}");
        assert_eq!(c("[]"), "[]");
        assert_eq!(c("{}"), "{}");
        assert_eq!(
            canonical(r#"{"a":1,"A":2}"#),
            Err(CanonicalError::AmbiguousMembers)
        );
        // Canonical text is a fixed point.
        let once = c(r#"{"z":{"y":"\u0041","x":[1, 2]},"a":"\t"}"#);
        assert_eq!(c(&once), once);
    }
}
