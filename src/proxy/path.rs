//! The sub-path rules: what part of a path after a connection's address
//! tessera refuses (each rule its own refusal reason) and how it
//! normalizes the rest. Shared by the route and by endpoints a 2024-11-05
//! server announces (`crate::proxy::legacy_sse`); it needs nothing else of
//! the proxy.

use std::borrow::Cow;

use crate::telemetry::metrics::Reason;

/// Why a sub-path was refused: each rule is its own refusal reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRule {
    Backslash,
    EncodedSeparator,
    DoubleEncoding,
    BadEscape,
    Parameter,
    DotSegment,
    EmptySegment,
}

impl PathRule {
    /// The refusal reason (access log, metrics) and the rule's name in
    /// the answer.
    pub fn reason(self) -> Reason {
        match self {
            PathRule::Backslash => Reason::PathBackslash,
            PathRule::EncodedSeparator => Reason::PathEncodedSeparator,
            PathRule::DoubleEncoding => Reason::PathDoubleEncoding,
            PathRule::BadEscape => Reason::PathBadEscape,
            PathRule::Parameter => Reason::PathParameter,
            PathRule::DotSegment => Reason::PathDotSegment,
            PathRule::EmptySegment => Reason::PathEmptySegment,
        }
    }

    pub(crate) fn text(self) -> &'static str {
        match self {
            PathRule::Backslash => "the path may not contain a backslash",
            PathRule::EncodedSeparator => {
                "the path may not contain an encoded '/' or '\\' (%2F, %5C)"
            }
            PathRule::DoubleEncoding => {
                "the path may not be encoded twice (%25 followed by two hex digits)"
            }
            PathRule::BadEscape => "the path has a '%' that is not followed by two hex digits",
            PathRule::Parameter => "the path may not contain ';' (or %3B) parameters",
            PathRule::DotSegment => "the path may not contain '.' or '..' segments, encoded or not",
            PathRule::EmptySegment => "the path may not contain an empty segment ('//')",
        }
    }
}

/// Refuse a sub-path any server could read otherwise than tessera does,
/// and normalize the rest (RFC 3986 §6.2.2): escapes of unreserved
/// characters (`%61` → `a`) are decoded, other escapes kept with
/// upper-case hex. The result is unambiguous: its segments are the
/// segments every server sees, and decoding it once more changes nothing
/// a server could act on.
///
/// Refused, by rule (the rule's name is the refusal's reason):
/// - `path_backslash`: a `\` (a separator on Windows servers and to some
///   normalizers);
/// - `path_encoded_separator`: `%2F` or `%5C`, any case (decoded into a
///   separator by some servers, not by others);
/// - `path_double_encoding`: `%25` followed by two hex digits (`%252e`: a
///   server that decodes twice reads `.`); a lone `%25` is a percent sign
///   and passes;
/// - `path_bad_escape`: a `%` not followed by two hex digits (servers
///   disagree on it, and normalizing around it could build an escape that
///   was not there: `%%32e` would become `%2e`);
/// - `path_parameter`: a `;` or `%3B` (a matrix parameter, cut out of the
///   segment by Tomcat and Spring: `..;/` climbs there, `a;b` is `a`);
/// - `path_dot_segment`: a `.` or `..` segment, each dot plain or `%2E`;
/// - `path_empty_segment`: `//` (merged into one `/` by nginx and others,
///   so a rule on `/admin` would miss `//admin`); a trailing `/` passes.
pub fn normalize_sub_path(sub_path: &str) -> Result<Cow<'_, str>, PathRule> {
    if !check(sub_path)? {
        return Ok(Cow::Borrowed(sub_path));
    }
    let b = sub_path.as_bytes();
    let mut out = String::with_capacity(sub_path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            // `check` saw two hex digits after every '%'.
            let c = hex(b[i + 1]).unwrap_or(0) << 4 | hex(b[i + 2]).unwrap_or(0);
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(c));
            } else {
                out.push('%');
                out.push(char::from(b[i + 1].to_ascii_uppercase()));
                out.push(char::from(b[i + 2].to_ascii_uppercase()));
            }
            i += 3;
        } else {
            // Only ASCII reaches a path (http's parser refuses the rest);
            // a char boundary is kept either way.
            let len = sub_path[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&sub_path[i..i + len]);
            i += len;
        }
    }
    // Decoding can assemble a form that was not there: `%25%32%65`
    // becomes `%252e`. What is forwarded is held to the same rules.
    check(&out)?;
    Ok(Cow::Owned(out))
}

/// The rules of [`normalize_sub_path`]; whether the path holds an escape.
fn check(sub_path: &str) -> Result<bool, PathRule> {
    let b = sub_path.as_bytes();
    let mut escaped = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => return Err(PathRule::Backslash),
            b';' => return Err(PathRule::Parameter),
            b'%' => {
                let (Some(h), Some(l)) = (
                    b.get(i + 1).and_then(|c| hex(*c)),
                    b.get(i + 2).and_then(|c| hex(*c)),
                ) else {
                    return Err(PathRule::BadEscape);
                };
                match h << 4 | l {
                    b'/' | b'\\' => return Err(PathRule::EncodedSeparator),
                    b';' => return Err(PathRule::Parameter),
                    b'%' if b.get(i + 3).and_then(|c| hex(*c)).is_some()
                        && b.get(i + 4).and_then(|c| hex(*c)).is_some() =>
                    {
                        return Err(PathRule::DoubleEncoding)
                    }
                    _ => {}
                }
                escaped = true;
                i += 3;
            }
            _ => i += 1,
        }
    }
    // Segments after the leading '/'; only the last may be empty.
    let mut segments = sub_path.split('/').skip(1).peekable();
    while let Some(seg) = segments.next() {
        if is_dot_segment(seg) {
            return Err(PathRule::DotSegment);
        }
        if seg.is_empty() && segments.peek().is_some() {
            return Err(PathRule::EmptySegment);
        }
    }
    Ok(escaped)
}

fn hex(c: u8) -> Option<u8> {
    char::from(c).to_digit(16).map(|d| d as u8)
}

/// `.` or `..`, each dot plain or percent-encoded (`%2e`, `%2E`).
pub fn is_dot_segment(seg: &str) -> bool {
    let mut rest = seg.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        match rest {
            [b'.', tail @ ..] => rest = tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => rest = tail,
            _ => return false,
        }
        dots += 1;
    }
    dots == 1 || dots == 2
}
