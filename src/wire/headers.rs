//! The header tables shared by the request and the response side: what is
//! hop-by-hop, what a caller may not send on, what names a credential.

use http::{header, HeaderMap, HeaderName};

/// MCP's own request headers, named once: a lookup by a `&str` parses
/// and checks the name again on every request.
pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded in either
/// direction.
pub const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Request headers of the caller's that never reach the upstream:
/// - `Authorization`, `Proxy-Authorization`: the caller's token is for
///   tessera (the MCP spec forbids token passthrough);
/// - `Cookie`: the caller has no business with the upstream's sessions;
/// - `Host`: set for the upstream;
/// - `Origin`: the caller's origin was checked by tessera; the upstream's
///   client is tessera;
/// - `Content-Length`: recomputed from the forwarded buffer;
/// - `Expect`: tessera has read the whole body before it forwards, so it
///   never waits for a `100 Continue`; an upstream asked for one may answer
///   before it reads the body, and its unread bytes would then be parsed as
///   the connection's next request;
/// - `Accept-Charset`: an upstream that honours it could reflect the secret
///   in UTF-16 or another charset the redactor does not read (found by the
///   attack review); MCP's JSON is UTF-8.
pub const STRIPPED_REQUEST: [HeaderName; 8] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::HOST,
    header::ORIGIN,
    header::CONTENT_LENGTH,
    header::EXPECT,
    header::ACCEPT_CHARSET,
];

/// Request headers in which a caller vouches for itself: who it is, where
/// it came from, what URL or method it "really" asked for. An upstream
/// behind a proxy trusts these (a framework reads `X-Forwarded-For` as the
/// client's address, `X-Original-URL` as the path to route, and
/// `X-HTTP-Method-Override` as the method), so a caller's own would be
/// believed as tessera's word, and would let a call the policies decided
/// as one thing run as another. tessera sets `Forwarded` and
/// `X-Forwarded-For` itself, truthfully, with `--forwarded set`
/// ([`crate::proxy::forward::set_forwarded`]). Every `X-Forwarded-*` goes too
/// ([`is_trust_header`]).
pub const TRUST_HEADERS: [&str; 12] = [
    "forwarded",
    "x-real-ip",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "x-cluster-client-ip",
    "fastly-client-ip",
];

/// A header a caller may not vouch with: [`TRUST_HEADERS`] and every
/// `X-Forwarded-*` (`-For`, `-Host`, `-Proto`, `-User`, `-Port`,
/// `-Prefix`, …).
pub fn is_trust_header(n: &HeaderName) -> bool {
    let n = n.as_str();
    n.starts_with("x-forwarded-") || TRUST_HEADERS.contains(&n)
}

/// Whether a header's name names a credential, so that a caller's own
/// (`X-Api-Key`, `X-Auth-Token`, a `Cookie`, …) never travels next to the
/// stored one: the upstream might prefer it, and a caller's secret is not
/// the upstream's business. The rule (names are lower case here):
/// - exactly `cookie`, `proxy-authorization`, `authorization`;
/// - containing `token`, `secret`, `password`, `passwd`, `credential`,
///   `api-key`, `apikey`, `api_key`, `auth-key`, `session`;
/// - except `mcp-session-id`, the MCP session, which the upstream needs.
///
/// The header the stored credential is injected as is removed too, and
/// then set to the stored value: the injection wins.
pub fn names_a_credential(n: &HeaderName) -> bool {
    let n = n.as_str();
    if n == "mcp-session-id" {
        return false;
    }
    if matches!(n, "cookie" | "proxy-authorization" | "authorization") {
        return true;
    }
    // One pass, each part tried only where its first letter is: `str::
    // contains` once per part and header set up a substring search ten
    // times per header, 26,000 instructions a request in
    // `bench/instructions.sh`, more than the rest of the header work.
    let b = n.as_bytes();
    (0..b.len()).any(|i| {
        let at = |p: &[u8]| b[i..].starts_with(p);
        match b[i] {
            b't' => at(b"token"),
            b's' => at(b"secret") || at(b"session"),
            b'p' => at(b"password") || at(b"passwd"),
            b'c' => at(b"credential"),
            b'a' => at(b"api-key") || at(b"apikey") || at(b"api_key") || at(b"auth-key"),
            _ => false,
        }
    })
}

/// Request headers that ask for part of an answer, stripped unless
/// `--allow-range`: a caller could ask for byte ranges of an answer that
/// reflects the injected secret, each slice too short to hold it whole, and
/// join the slices around the redaction (the redactor sees one answer at a
/// time).
pub const RANGE_REQUEST: [HeaderName; 2] = [header::RANGE, header::IF_RANGE];

/// A header a credential may not be injected as, because tessera strips or
/// sets it itself.
pub fn is_reserved_request_header(h: &HeaderName) -> bool {
    (STRIPPED_REQUEST.contains(h) && *h != header::AUTHORIZATION) || HOP_BY_HOP.contains(h)
}

/// Remove hop-by-hop headers, including those the `Connection` header
/// names, and every header `also` picks.
///
/// One pass over the names present finds them, so a name is hashed only to
/// be removed: a `remove` per listed name hashed all thirteen of them,
/// present or not.
pub fn remove_hop_by_hop_and(h: &mut HeaderMap, also: impl Fn(&HeaderName) -> bool) {
    if h.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
            .collect();
        for n in &named {
            h.remove(n);
        }
    }
    while let Some(n) = h
        .keys()
        .find(|n| HOP_BY_HOP.contains(n) || also(n))
        .cloned()
    {
        h.remove(n);
    }
}
