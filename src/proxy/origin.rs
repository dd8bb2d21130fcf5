//! Origin and Host (DNS rebinding): a request whose `Host` is not tessera's
//! or whose `Origin` is foreign is refused before anything else is read.

use std::net::IpAddr;

use http::{header, HeaderMap, Uri};

use crate::proxy::error::ProxyError;
use crate::state::State;

impl State {
    /// DNS-rebinding defence: the `Host` must be the public URL's host or
    /// a loopback name, and an `Origin` (absent is fine: non-browser
    /// clients send none) must be tessera's own (`http(s)://` + that
    /// `Host`: same-origin) or in the allow-list. A rebound page has the
    /// attacker's name in both, so it fails the `Host` check; any other
    /// page has a foreign `Origin`.
    pub fn check_origin_and_host(&self, h: &HeaderMap, uri: &Uri) -> Result<(), ProxyError> {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| uri.authority().map(|a| a.as_str()));
        if let Some(origin) = h.get(header::ORIGIN) {
            let ok = origin.to_str().is_ok_and(|o| {
                let o = o.trim_end_matches('/');
                host.is_some_and(|host| same_origin(o, host))
                    || self
                        .config
                        .allowed_origins
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(o))
            });
            if !ok {
                return Err(ProxyError::ForbiddenOrigin);
            }
        }
        if self.is_own_host(host_name(host.ok_or(ProxyError::ForbiddenHost)?)) {
            Ok(())
        } else {
            Err(ProxyError::ForbiddenHost)
        }
    }

    /// Whether a host name (no port) names tessera: its public host or a
    /// loopback name.
    pub fn is_own_host(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case(&self.public_host) || is_loopback_name(name)
    }
}

/// `origin` is `http://HOST` or `https://HOST` for this request's `Host`.
fn same_origin(origin: &str, host: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        let (s, rest) = (origin.get(..scheme.len()), origin.get(scheme.len()..));
        s.is_some_and(|s| s.eq_ignore_ascii_case(scheme))
            && rest.is_some_and(|h| h.eq_ignore_ascii_case(host))
    })
}

/// The host part of a `Host` value (`[::1]:80` → `[::1]`, `a:1` → `a`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        host.find(']').map_or(host, |i| &host[..=i])
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    }
}

/// `localhost`, `*.localhost`, 127.0.0.0/8 and `[::1]`.
fn is_loopback_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    let ip = lower.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("a.example:80"), "a.example");
        assert_eq!(host_name("[::1]:7470"), "[::1]");
        assert_eq!(host_name("localhost"), "localhost");
        for ok in [
            "localhost",
            "LOCALHOST",
            "x.localhost",
            "127.0.0.1",
            "127.9.9.9",
            "[::1]",
        ] {
            assert!(is_loopback_name(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "[::2]",
            "localhost.evil",
        ] {
            assert!(!is_loopback_name(bad), "{bad}");
        }
    }

    #[test]
    fn same_origin_is_the_scheme_and_the_host_exactly() {
        for (origin, host) in [
            ("http://localhost:7470", "localhost:7470"),
            ("HTTP://LocalHost:7470", "localhost:7470"),
            ("https://127.0.0.1:7470", "127.0.0.1:7470"),
        ] {
            assert!(same_origin(origin, host), "{origin} {host}");
        }
        for (origin, host) in [
            ("http://localhost:3000", "localhost:7470"),
            ("http://localhost", "localhost:7470"),
            ("http://localhost:7470.evil", "localhost:7470"),
            ("ftp://localhost:7470", "localhost:7470"),
            ("localhost:7470", "localhost:7470"),
            ("null", "localhost:7470"),
            ("", ""),
        ] {
            assert!(!same_origin(origin, host), "{origin} {host}");
        }
    }
}
