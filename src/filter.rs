//! Filter: the headers and status of the upstream's answer on the way back
//! to the caller. Anything that would let the caller act as the upstream's
//! client (a challenge that starts OAuth, a cookie) is dropped, and an
//! upstream 401/403 becomes tessera's own 502.

use http::{header, HeaderMap, HeaderName, StatusCode};

use crate::forward::remove_hop_by_hop;

/// Response headers never passed to the caller.
/// - `WWW-Authenticate`, `Proxy-Authenticate`: a relayed challenge makes an
///   MCP client start OAuth discovery against a URL the upstream chose.
/// - `Set-Cookie`: a session with the upstream belongs to tessera, not to
///   the caller.
/// - `Alt-Svc`: would steer the caller to the upstream's own endpoints.
const DROPPED_RESPONSE_HEADERS: [HeaderName; 4] = [
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::SET_COOKIE,
    header::ALT_SVC,
];

/// Filter response headers in place.
pub fn filter_response_headers(h: &mut HeaderMap) {
    remove_hop_by_hop(h);
    for name in &DROPPED_RESPONSE_HEADERS {
        h.remove(name);
    }
    h.remove("set-cookie2");
}

/// Whether the upstream refused tessera's credential: such an answer is
/// never relayed as a challenge.
pub fn credential_rejected(status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn drops_challenges_cookies_and_hop_by_hop() {
        let mut h = HeaderMap::new();
        let v = HeaderValue::from_static;
        h.insert(
            header::WWW_AUTHENTICATE,
            v("Bearer resource_metadata=\"http://evil\""),
        );
        h.append(header::SET_COOKIE, v("a=1"));
        h.append(header::SET_COOKIE, v("b=2"));
        h.insert(header::CONNECTION, v("close, x-secret-hop"));
        h.insert("x-secret-hop", v("1"));
        h.insert(header::TRANSFER_ENCODING, v("chunked"));
        h.insert(header::CONTENT_TYPE, v("text/event-stream"));
        h.insert("mcp-session-id", v("s1"));
        filter_response_headers(&mut h);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["content-type", "mcp-session-id"]);
    }
}
