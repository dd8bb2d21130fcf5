//! Route: the HTTP method and the address, decided from the request line
//! alone, before anything is loaded.
//!
//! The sub-path (what follows the address) is forwarded to the upstream,
//! whose server may read it differently from tessera: decode `%2F` into a
//! separator, treat `\` as one, decode twice, resolve `..` after decoding,
//! or cut `;parameters` out of segments (Tomcat, Spring, IIS, nginx in
//! front of something else). Any of those would let the path a policy
//! decided on differ from the path the upstream serves. So the sub-path is
//! refused (400, naming the rule) whenever it holds one of these forms,
//! and what is left is normalized into the one form both sides read alike
//! (see [`normalize_sub_path`]), which is what policies see as
//! `context.path` and what is forwarded.
//!
//! Two sub-paths are not forwarded as such: `/c/<id>/mcp` and
//! `/c/<id>/sse` are aliases of the address `/c/<id>` itself
//! ([`TRANSPORT_ALIASES`]). Clients that guess the transport from the
//! URL's last segment (Inspector: `/mcp` is Streamable HTTP, `/sse` the
//! 2024-11-05 HTTP+SSE transport, anything else is refused unless
//! `--transport` is given) can be given an address they recognize; both
//! reach the credential's upstream URL, which names the server's MCP
//! endpoint whatever its path. And `/c/<id>/~sse/<tag>/...` is the POST
//! endpoint a 2024-11-05 server announced, rewritten under the address
//! (`crate::proxy::legacy_sse`).

use std::borrow::Cow;

use http::Method;

use crate::proxy::error::ProxyError;
pub use crate::proxy::path::{is_dot_segment, normalize_sub_path};

/// Where a request is going: a connection id and the sub-path after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Route<'a> {
    pub connection_id: &'a str,
    /// Everything after `/c/<id>`, starting with `/` or empty, normalized
    /// ([`normalize_sub_path`]): what is forwarded and what policies see.
    pub sub_path: Cow<'a, str>,
}

/// The methods forwarded: POST for every revision; GET (server stream) and
/// DELETE (session end) for 2025-03-26 to 2025-11-25.
pub fn method_allowed(m: &Method) -> bool {
    *m == Method::POST || *m == Method::GET || *m == Method::DELETE
}

/// Sub-paths that name the connection's address itself, for clients that
/// pick the transport by the URL's last segment: routed as the bare
/// address (forwarded to the upstream URL, seen by policies as `""`).
pub const TRANSPORT_ALIASES: [&str; 2] = ["/mcp", "/sse"];

/// Route a request. The method is checked first, so a wrong method is
/// refused with 405 whatever the path; the path must be `/c/<id>[/...]`.
pub fn route<'a>(method: &Method, path: &'a str) -> Result<Route<'a>, ProxyError> {
    if !method_allowed(method) {
        return Err(ProxyError::MethodNotAllowed);
    }
    let rest = path.strip_prefix("/c/").ok_or(ProxyError::NotFound)?;
    let (id, sub_path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ProxyError::NotFound);
    }
    let sub_path = normalize_sub_path(sub_path).map_err(ProxyError::SubPath)?;
    Ok(Route {
        connection_id: id,
        sub_path: if TRANSPORT_ALIASES.contains(&&*sub_path) {
            Cow::Borrowed("")
        } else {
            sub_path
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::path::PathRule;

    #[test]
    fn routes_address_and_sub_path() {
        let r = route(&Method::POST, "/c/abc_-9").unwrap();
        assert_eq!(
            r,
            Route {
                connection_id: "abc_-9",
                sub_path: "".into()
            }
        );
        let r = route(&Method::GET, "/c/abc/mcp/x").unwrap();
        assert_eq!(
            r,
            Route {
                connection_id: "abc",
                sub_path: "/mcp/x".into()
            }
        );
    }

    #[test]
    fn transport_aliases_are_the_address_itself() {
        for p in ["/c/abc/mcp", "/c/abc/sse", "/c/abc/%6dcp", "/c/abc"] {
            assert_eq!(route(&Method::POST, p).unwrap().sub_path, "", "{p}");
        }
        for (p, sub) in [
            ("/c/abc/mcp/", "/mcp/"),
            ("/c/abc/mcp/x", "/mcp/x"),
            ("/c/abc/MCP", "/MCP"),
            ("/c/abc/sse2", "/sse2"),
        ] {
            assert_eq!(route(&Method::GET, p).unwrap().sub_path, sub, "{p}");
        }
    }

    #[test]
    fn refuses_other_methods_first() {
        for m in [
            Method::PUT,
            Method::PATCH,
            Method::OPTIONS,
            Method::HEAD,
            Method::TRACE,
        ] {
            assert!(matches!(
                route(&m, "/c/abc"),
                Err(ProxyError::MethodNotAllowed)
            ));
            assert!(matches!(
                route(&m, "/nowhere"),
                Err(ProxyError::MethodNotAllowed)
            ));
        }
    }

    #[test]
    fn refuses_other_paths() {
        for p in ["/", "/c/", "/c", "/x/abc", "/c/%2e%2e", "/c/a.b"] {
            assert!(
                matches!(route(&Method::POST, p), Err(ProxyError::NotFound)),
                "{p}"
            );
        }
    }

    #[test]
    fn refuses_each_hostile_sub_path_by_its_rule() {
        use PathRule::*;
        for (p, rule) in [
            ("/a\\b", Backslash),
            ("/..%2fadmin", EncodedSeparator),
            ("/a%2Fb", EncodedSeparator),
            ("/a%5cb", EncodedSeparator),
            ("/a%5C", EncodedSeparator),
            ("/%2e%2e%2fx", EncodedSeparator),
            ("/%252e%252e/x", DoubleEncoding),
            ("/a%252Fb", DoubleEncoding),
            ("/%25%32%65", DoubleEncoding),
            ("/%", BadEscape),
            ("/%%32e", BadEscape),
            ("/a%g1", BadEscape),
            ("/a%2", BadEscape),
            ("/..;/admin", Parameter),
            ("/a;b", Parameter),
            ("/a%3bb", Parameter),
            ("/..", DotSegment),
            ("/.", DotSegment),
            ("/a/../b", DotSegment),
            ("/%2e%2e", DotSegment),
            ("/.%2E/x", DotSegment),
            ("/%2e", DotSegment),
            ("/a//b", EmptySegment),
            ("//a", EmptySegment),
        ] {
            assert_eq!(normalize_sub_path(p), Err(rule), "{p}");
            assert!(
                matches!(route(&Method::POST, &format!("/c/abc{p}")), Err(ProxyError::SubPath(r)) if r == rule),
                "{p}"
            );
        }
    }

    #[test]
    fn normalizes_what_it_passes() {
        for (p, n) in [
            ("", ""),
            ("/", "/"),
            ("/mcp/x/", "/mcp/x/"),
            ("/%61dmin", "/admin"),
            ("/a%2eb", "/a.b"),
            ("/%2e%2e%2e", "/..."),
            ("/my%20file", "/my%20file"),
            ("/%c3%a9", "/%C3%A9"),
            ("/%25", "/%25"),
            ("/%25zz", "/%25zz"),
            ("/a.b/...", "/a.b/..."),
        ] {
            assert_eq!(normalize_sub_path(p).unwrap(), n, "{p}");
        }
    }
}
