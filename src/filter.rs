//! Filter: the headers and status of the upstream's answer on the way back
//! to the caller. Anything that would let the caller act as the upstream's
//! client (a challenge that starts OAuth, a cookie) is dropped, and an
//! upstream 401/403 becomes tessera's own 502.

use http::{header, HeaderMap, HeaderName, StatusCode};

use crate::forward::remove_hop_by_hop_and;

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
    remove_hop_by_hop_and(h, |n| {
        DROPPED_RESPONSE_HEADERS.contains(n) || n.as_str() == "set-cookie2"
    });
}

/// Drop a `Location` (or `Content-Location`) that would send the caller
/// back into tessera: a relative one (the caller resolves it against
/// tessera's URL, not the upstream's) and an absolute one whose host
/// `is_ours` (tessera's public host, a loopback name). An upstream could
/// otherwise point an agent at another connection address or the admin
/// listener. Others pass: tessera never follows them itself.
pub fn drop_locations_into_tessera(h: &mut HeaderMap, is_ours: impl Fn(&str) -> bool) {
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let keep = match h.get(&name) {
            None => continue,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| url::Url::parse(s).ok())
                .is_some_and(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host_str().is_some_and(|host| !is_ours(host))
                }),
        };
        if !keep {
            h.remove(&name);
        }
    }
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
        // Every listed name, whatever else the map holds.
        for n in ["proxy-authenticate", "alt-svc", "set-cookie2", "keep-alive"] {
            h.insert(n, v("1"));
        }
        for n in ["proxy-connection", "te", "trailer", "upgrade"] {
            h.insert(n, v("1"));
        }
        filter_response_headers(&mut h);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["content-type", "mcp-session-id"]);
    }

    #[test]
    fn locations_into_tessera_are_dropped() {
        let ours = |h: &str| h == "tessera.internal" || h == "127.0.0.1" || h == "localhost";
        let kept = |loc: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::LOCATION, loc.parse().unwrap());
            drop_locations_into_tessera(&mut h, ours);
            h.contains_key(header::LOCATION)
        };
        assert!(kept("https://elsewhere.example/next"));
        for loc in [
            "/c/another-connection",
            "../admin",
            "//127.0.0.1:7471/v1/credentials",
            "http://localhost:7470/c/x",
            "https://tessera.internal/c/x",
            "javascript:alert(1)",
            "not a url",
        ] {
            assert!(!kept(loc), "{loc}");
        }
    }
}
