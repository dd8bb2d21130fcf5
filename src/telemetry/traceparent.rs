//! W3C Trace Context: the caller's `traceparent`, read strictly, and the
//! request id that follows from it.
//!
//! A header that does not parse is ignored, never refused: trace context
//! is the caller's hint, and a request is not worse for a broken one.
//! Strict means the W3C rules (lowercase hex, version `ff` invalid, all-zero
//! ids invalid, version 00 exactly 55 bytes, a later version at least 55
//! with a `-` after the flags) and one header only: two `traceparent`
//! fields are ambiguous, and the recommendation is to discard both.
//!
//! Hand-written rather than the `opentelemetry` propagator because it runs
//! on every request whether tracing is on or not (the request id), and the
//! propagator would need a `Context` and a header-map adapter per request.

use http::HeaderMap;

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// The caller's `traceparent`, if exactly one field is present and it
    /// parses.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut fields = headers.get_all(TRACEPARENT).iter();
        let value = fields.next()?;
        if fields.next().is_some() {
            return None;
        }
        Self::parse(value.as_bytes())
    }

    /// Parse one `traceparent` value (no surrounding whitespace, as the
    /// HTTP layer has trimmed it).
    pub fn parse(v: &[u8]) -> Option<Self> {
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(v[0], v[1])?;
        match version {
            0xff => return None,
            0x00 if v.len() != 55 => return None,
            // A later version may append fields after a `-`.
            _ if v.len() > 55 && v[55] != b'-' => return None,
            _ => {}
        }
        let mut trace_id = [0u8; 16];
        hex_into(&v[3..35], &mut trace_id)?;
        let mut parent_id = [0u8; 8];
        hex_into(&v[36..52], &mut parent_id)?;
        let flags = hex_byte(v[53], v[54])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }
}

/// The W3C request headers (named once: a `&str` lookup parses the name
/// on every request).
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
pub const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// The response header that names the request's id, on every answer of
/// the data plane.
pub const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// A request's id: 32 lowercase hex digits, the W3C trace id's form, so
/// that a trace, an access line and an audit row join on one value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestId([u8; 32]);

impl RequestId {
    /// The caller's trace id, or a fresh random one.
    pub fn for_request(parent: Option<&TraceParent>) -> Self {
        let id = match parent {
            Some(p) => p.trace_id,
            None => Self::random_trace_id(),
        };
        Self::from_trace_id(id)
    }

    /// A random, non-zero trace id. From `fastrand` (wyrand, seeded per
    /// thread from the process's random hash keys), not `rand`'s ChaCha:
    /// the id joins records and is no secret (a caller picks its own
    /// through `traceparent`), and ChaCha's block and thread-local handle
    /// were half the request id's cost per request (bench/instructions.sh).
    /// With traces on, the OpenTelemetry SDK draws the id instead.
    pub fn random_trace_id() -> [u8; 16] {
        loop {
            let id = fastrand::u128(..).to_le_bytes();
            if id != [0; 16] {
                return id;
            }
        }
    }

    pub fn from_trace_id(id: [u8; 16]) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in id.iter().enumerate() {
            out[2 * i] = HEX[(b >> 4) as usize];
            out[2 * i + 1] = HEX[(b & 0xf) as usize];
        }
        Self(out)
    }

    /// The trace id these hex digits spell.
    pub fn trace_id(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        hex_into(&self.0, &mut id).expect("a request id is hex by construction");
        id
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("a request id is ASCII by construction")
    }

    /// The id as a header value (its 32 bytes copied; no formatting).
    pub fn header_value(&self) -> http::HeaderValue {
        http::HeaderValue::from_bytes(&self.0).expect("a request id is hex by construction")
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lowercase hex digit (uppercase is invalid in `traceparent`).
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    Some(nibble(hi)? << 4 | nibble(lo)?)
}

fn hex_into(hex: &[u8], out: &mut [u8]) -> Option<()> {
    debug_assert_eq!(hex.len(), out.len() * 2);
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = hex_byte(pair[0], pair[1])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_parses() {
        let p = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(
            RequestId::from_trace_id(p.trace_id).as_str(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            p.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(p.flags, 1);
    }

    #[test]
    fn every_malformed_form_is_ignored() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // Version ff.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Version 00 with a tail.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            // A later version whose tail does not start with a dash.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            // All-zero ids.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Wrong separators, non-hex, a sign.
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
        ];
        for b in bad {
            assert_eq!(TraceParent::parse(b.as_bytes()), None, "{b}");
        }
        // A later version with a dash-separated tail is read.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future";
        assert!(TraceParent::parse(later.as_bytes()).is_some());
    }

    #[test]
    fn two_fields_are_ambiguous_and_ignored() {
        let mut h = HeaderMap::new();
        h.append("traceparent", GOOD.parse().unwrap());
        assert!(TraceParent::from_headers(&h).is_some());
        h.append("traceparent", GOOD.parse().unwrap());
        assert_eq!(TraceParent::from_headers(&h), None);
    }

    #[test]
    fn a_minted_id_is_32_hex_digits_and_round_trips() {
        let id = RequestId::for_request(None);
        assert_eq!(id.as_str().len(), 32);
        assert!(id.as_str().bytes().all(|c| nibble(c).is_some()));
        assert_eq!(RequestId::from_trace_id(id.trace_id()), id);
        assert_ne!(RequestId::for_request(None), id);
    }
}
