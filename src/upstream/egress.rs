//! Where tessera may connect on a caller's behalf (SSRF defence).
//!
//! A credential-holding proxy that can be pointed at any URL is a way into
//! the network it runs in: an upstream URL naming a metadata service, a
//! database port or the proxy's own admin listener would get tessera's
//! requests (and its stored credential) there. So, unless the operator opts
//! in with `--allow-private-upstreams` (a sidecar whose upstream runs on
//! the same host needs it):
//!
//! - an upstream (or OAuth token endpoint) must be `https://`;
//! - its host must not be, or resolve to, a loopback, private, link-local,
//!   shared (CGNAT) or unspecified address, nor an IPv6 form of one.
//!
//! Checked twice: when a credential is registered ([`check_registration`],
//! which resolves the name), and at every new upstream connection, on the
//! very addresses the connection is made to ([`Resolver`] filters DNS
//! answers; [`check_connect`] covers IP literals, which hyper does not
//! resolve). A name whose DNS answer changes to an internal address after
//! registration is still refused.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use tower_service::Service;

/// Whether private (internal) upstreams and plain `http://` are allowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Egress {
    pub allow_private: bool,
}

/// Why tessera will not connect somewhere.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EgressError {
    #[error("{host} is a private or local address ({ip}); tessera refuses internal upstreams unless started with --allow-private-upstreams (TESSERA_ALLOW_PRIVATE_UPSTREAMS=true)")]
    Private { host: String, ip: IpAddr },
    #[error("{host} resolves to a private or local address ({ip}); tessera refuses internal upstreams unless started with --allow-private-upstreams (TESSERA_ALLOW_PRIVATE_UPSTREAMS=true)")]
    ResolvesPrivate { host: String, ip: IpAddr },
    #[error("plain http:// to {host}: use https://, or allow internal upstreams with --allow-private-upstreams (TESSERA_ALLOW_PRIVATE_UPSTREAMS=true) for a sidecar's local upstream")]
    PlainHttp { host: String },
    #[error("{host} cannot be resolved: {why}")]
    Unresolved { host: String, why: String },
}

/// An address tessera does not connect to unless allowed: loopback
/// (127/8, ::1), private (10/8, 172.16/12, 192.168/16, fc00::/7),
/// link-local (169.254/16 with the cloud metadata address, fe80::/10),
/// shared 100.64/10, unspecified and "this network" (0/8, ::), broadcast,
/// and IPv4 written as IPv6 (::ffff:a.b.c.d, and NAT64 64:ff9b::/96).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal_v4(v4);
            }
            let s = v6.segments();
            let v4 = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                Ipv4Addr::new(a, b, c, d)
            };
            // IPv4 inside IPv6, in each form a host may route: NAT64
            // (64:ff9b::/96), IPv4-compatible (::a.b.c.d, deprecated but
            // still accepted by some stacks), 6to4 (2002:AABB:CCDD::/48);
            // Teredo (2001::/32) and the local-use NAT64 prefix
            // (64:ff9b:1::/48) are refused whole (found by the attack
            // review).
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
                return is_internal_v4(v4(s[6], s[7]));
            }
            if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
                return is_internal_v4(v4(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return is_internal_v4(v4(s[1], s[2]));
            }
            if (s[0] == 0x2001 && s[1] == 0) || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
                return true;
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || (s[0] & 0xfe00) == 0xfc00 // fc00::/7, unique local
                || (s[0] & 0xffc0) == 0xfe80 // fe80::/10, link-local
                || (s[0] & 0xffc0) == 0xfec0 // fec0::/10, old site-local
        }
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || a == 0
        || (a == 100 && (b & 0xc0) == 64) // 100.64.0.0/10, shared (CGNAT)
}

impl Egress {
    /// The checks that need no DNS: the scheme, and a host that is an IP
    /// literal. `https` tells whether the URL is `https://`.
    pub fn check_connect(&self, https: bool, host: &str) -> Result<(), EgressError> {
        if self.allow_private {
            return Ok(());
        }
        if !https {
            return Err(EgressError::PlainHttp {
                host: host.to_string(),
            });
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) if is_internal(ip) => Err(EgressError::Private {
                host: host.to_string(),
                ip,
            }),
            _ => Ok(()),
        }
    }

    /// The first internal address among `addrs`, as an error.
    fn check_addrs(&self, host: &str, addrs: &[SocketAddr]) -> Result<(), EgressError> {
        if self.allow_private {
            return Ok(());
        }
        match addrs.iter().find(|a| is_internal(a.ip())) {
            Some(a) => Err(EgressError::ResolvesPrivate {
                host: host.to_string(),
                ip: a.ip(),
            }),
            None => Ok(()),
        }
    }

    /// At registration: [`Egress::check_connect`], then resolve the name
    /// and refuse it if any of its addresses is internal.
    pub async fn check_registration(&self, url: &url::Url) -> Result<(), EgressError> {
        let host = url.host_str().unwrap_or_default();
        self.check_connect(url.scheme() == "https", host)?;
        if self.allow_private || host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Ok(());
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| EgressError::Unresolved {
                host: host.to_string(),
                why: e.to_string(),
            })?
            .collect();
        self.check_addrs(host, &addrs)
    }
}

/// The DNS resolver of upstream connections: the system's (getaddrinfo),
/// with an answer that holds any internal address refused (unless allowed).
/// All of them, not just the internal ones: a name that answers with both
/// is someone steering tessera, not a server to be half-trusted.
#[derive(Clone)]
pub struct Resolver {
    inner: GaiResolver,
    egress: Egress,
}

impl Resolver {
    pub fn new(egress: Egress) -> Resolver {
        Resolver {
            inner: GaiResolver::new(),
            egress,
        }
    }
}

type Resolving = Pin<
    Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, crate::wire::BoxError>> + Send>,
>;

impl Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = crate::wire::BoxError;
    type Future = Resolving;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let egress = self.egress;
        let host = name.as_str().to_string();
        let lookup = self.inner.call(name);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = lookup.await?.collect();
            egress.check_addrs(&host, &addrs)?;
            Ok(addrs.into_iter())
        })
    }
}

/// The egress refusal somewhere in an error's chain of causes, if any.
pub fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a EgressError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<EgressError>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "::127.0.0.1",
            "::a9fe:a9fe",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::",
            "2001:0:4136:e378::1",
            "64:ff9b:1::808:808",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "100.63.255.255",
            "100.128.0.0",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "::8.8.8.8",
            "2002:808:808::1",
            "2001:4860::8888",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn scheme_and_literals_without_dns() {
        let strict = Egress::default();
        assert!(strict.check_connect(true, "api.example").is_ok());
        assert!(strict.check_connect(true, "1.1.1.1").is_ok());
        assert!(matches!(
            strict.check_connect(false, "api.example"),
            Err(EgressError::PlainHttp { .. })
        ));
        for host in ["127.0.0.1", "[::1]", "169.254.169.254", "[::ffff:10.0.0.1]"] {
            assert!(
                matches!(
                    strict.check_connect(true, host),
                    Err(EgressError::Private { .. })
                ),
                "{host}"
            );
        }
        let open = Egress {
            allow_private: true,
        };
        assert!(open.check_connect(false, "127.0.0.1").is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_inside_is_refused_at_registration_and_connect() {
        let strict = Egress::default();
        let url = url::Url::parse("https://localhost:9/mcp").unwrap();
        let e = strict.check_registration(&url).await.unwrap_err();
        assert!(matches!(e, EgressError::ResolvesPrivate { .. }), "{e}");
        assert!(e.to_string().contains("--allow-private-upstreams"), "{e}");
        // The connector's resolver refuses the same answer.
        let mut r = Resolver::new(strict);
        let name: Name = "localhost".parse().unwrap();
        let err = r.call(name).await.unwrap_err();
        assert!(refusal_in(&*err).is_some(), "{err}");
        let open = Egress {
            allow_private: true,
        };
        assert!(open.check_registration(&url).await.is_ok());
        let mut r = Resolver::new(open);
        let addrs: Vec<_> = r
            .call("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
    }
}
