//! Filter: the headers and status of the upstream's answer on the way back
//! to the caller. Anything that would let the caller act as the upstream's
//! client (a challenge that starts OAuth, a cookie) is dropped, and an
//! upstream 401/403 becomes tessera's own 502.

use http::{header, HeaderMap, HeaderName, StatusCode};

use crate::wire::headers::remove_hop_by_hop_and;

/// Response headers never passed to the caller.
/// - `WWW-Authenticate`, `Proxy-Authenticate`: a relayed challenge makes an
///   MCP client start OAuth discovery against a URL the upstream chose.
/// - `Set-Cookie`: a session with the upstream belongs to tessera, not to
///   the caller.
/// - `Alt-Svc`: would steer the caller to the upstream's own endpoints.
/// - `Link`, `Refresh`: URLs the caller's client may fetch or follow
///   (`rel=preload`, a timed redirect), chosen by the upstream; pointing
///   into tessera (another connection's address, the admin listener) or
///   anywhere else. An MCP exchange needs neither, so neither is judged:
///   both are dropped whole.
const DROPPED_RESPONSE_HEADERS: [HeaderName; 6] = [
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::SET_COOKIE,
    header::ALT_SVC,
    header::LINK,
    header::REFRESH,
];

/// Filter response headers in place.
pub fn filter_response_headers(h: &mut HeaderMap) {
    remove_hop_by_hop_and(h, |n| {
        DROPPED_RESPONSE_HEADERS.contains(n) || n.as_str() == "set-cookie2"
    });
}

/// Drop a `Location`, and keep a `Content-Location` only when it is an
/// absolute http(s) URL on the upstream's own origin (scheme, host and
/// port of the credential's URL) that does not point into tessera
/// (`is_ours`, see [`host_is_tessera`]), rewriting nothing.
///
/// Why so narrow: a relative one is resolved by the caller against
/// tessera's URL, not the upstream's; one into tessera would point an
/// agent at another connection's address or the admin listener; one to
/// any other host sends the agent (and, with a careless client, its
/// tessera token and the request body) where neither the admin nor the
/// agent chose. And every MCP SDK follows a `Location` by itself, method
/// and body kept: even one on the upstream's own origin would send the
/// request, and take its answer, past tessera's filters, pinning and
/// audit (found by the attack review). A `Content-Location` is only a
/// name for the answer; no client goes there. tessera never follows
/// either.
pub fn keep_locations_within_upstream(
    h: &mut HeaderMap,
    upstream: &url::Url,
    is_ours: impl Fn(&url::Host<&str>) -> bool,
) {
    h.remove(header::LOCATION);
    for name in [header::CONTENT_LOCATION] {
        let keep = match h.get(&name) {
            None => continue,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| url::Url::parse(s).ok())
                .is_some_and(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.origin() == upstream.origin()
                        && u.host().is_some_and(|host| !is_ours(&host))
                }),
        };
        if !keep {
            h.remove(&name);
        }
    }
}

/// Whether a URL's host (as the `url` crate parsed it: `127.1`,
/// `2130706433` and `0x7f.1` are already 127.0.0.1) reaches tessera:
/// `own_name` (its public host, a loopback name) with any trailing dot
/// removed (`localhost.`); the address it listens on; any loopback or
/// unspecified address (`0.0.0.0`, `[::]`), also IPv4-mapped
/// (`[::ffff:127.0.0.1]`), since a client on tessera's host reaches
/// tessera through them whenever it listens on loopback or on all
/// addresses.
pub fn host_is_tessera(
    host: &url::Host<&str>,
    own_name: impl Fn(&str) -> bool,
    listen: std::net::IpAddr,
) -> bool {
    use std::net::IpAddr;
    let ip = match host {
        url::Host::Domain(d) => {
            let d = d.strip_suffix('.').unwrap_or(d);
            return own_name(d) || d.parse::<IpAddr>().is_ok_and(|ip| is_ours_ip(ip, listen));
        }
        url::Host::Ipv4(ip) => IpAddr::V4(*ip),
        url::Host::Ipv6(ip) => IpAddr::V6(*ip),
    };
    is_ours_ip(ip, listen) || own_name(&ip.to_string()) || own_name(&format!("[{ip}]"))
}

fn is_ours_ip(ip: std::net::IpAddr, listen: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip.is_unspecified() || ip == listen.to_canonical()
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
    fn link_and_refresh_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::LINK,
            HeaderValue::from_static("<http://127.0.0.1:7471/>; rel=preload"),
        );
        h.insert(
            header::REFRESH,
            HeaderValue::from_static("0; url=http://localhost./c/x"),
        );
        filter_response_headers(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn locations_stay_within_the_upstream_and_out_of_tessera() {
        let listen: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        let own = |n: &str| n.eq_ignore_ascii_case("tessera.internal") || n == "localhost";
        let kept = |upstream: &str, loc: &str| {
            let upstream = url::Url::parse(upstream).unwrap();
            let mut h = HeaderMap::new();
            h.insert(header::LOCATION, loc.parse().unwrap());
            h.insert(header::CONTENT_LOCATION, loc.parse().unwrap());
            keep_locations_within_upstream(&mut h, &upstream, |host| {
                host_is_tessera(host, own, listen)
            });
            // A Location never stays: a client would follow it past tessera.
            assert!(!h.contains_key(header::LOCATION));
            h.contains_key(header::CONTENT_LOCATION)
        };
        let up = "https://mcp.example.com/mcp";
        assert!(kept(up, "https://mcp.example.com/v2/mcp"));
        assert!(kept(up, "https://MCP.example.com:443/x"));
        for loc in [
            // Elsewhere.
            "https://elsewhere.example/next",
            "http://mcp.example.com/x",
            "https://mcp.example.com:8443/x",
            // Relative: resolved against tessera.
            "/c/another-connection",
            "../admin",
            "//mcp.example.com/x",
            // Into tessera, in every spelling.
            "http://localhost:7470/c/x",
            "http://localhost.:7470/c/x",
            "https://tessera.internal/c/x",
            "https://TESSERA.internal./c/x",
            "http://127.0.0.1:7471/v1/credentials",
            "http://127.1:7471/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0.0.0.0:7470/",
            "http://[::1]:7470/",
            "http://[::ffff:127.0.0.1]:7470/",
            "http://[::]:7470/",
            "http://10.0.0.5:7470/",
            "javascript:alert(1)",
            "not a url",
        ] {
            assert!(!kept(up, loc), "{loc}");
        }
        // An upstream on a tessera address (the same host, loopback) gets
        // no Location at all: tessera's own addresses are never passed.
        for up in ["http://127.0.0.1:9000/mcp", "http://10.0.0.5:9000/mcp"] {
            assert!(!kept(up, &format!("{}x", &up[..up.len() - 3])), "{up}");
        }
        for loc in [
            "http://127.1:9000/x",
            "http://[::ffff:127.0.0.1]:9000/x",
            "http://0x7f000001:9000/x",
        ] {
            assert!(!kept("http://127.0.0.1:9000/mcp", loc), "{loc}");
        }
    }
}
