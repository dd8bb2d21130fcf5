//! Route: the HTTP method and the address, decided from the request line
//! alone, before anything is loaded.

use http::Method;

use crate::error::ProxyError;

/// Where a request is going: a connection id and the sub-path after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Route<'a> {
    pub connection_id: &'a str,
    /// Everything after `/c/<id>`, starting with `/` or empty.
    pub sub_path: &'a str,
}

/// The methods forwarded: POST for every revision; GET (server stream) and
/// DELETE (session end) for 2025-03-26 to 2025-11-25.
pub fn method_allowed(m: &Method) -> bool {
    *m == Method::POST || *m == Method::GET || *m == Method::DELETE
}

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
    Ok(Route {
        connection_id: id,
        sub_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_address_and_sub_path() {
        let r = route(&Method::POST, "/c/abc_-9").unwrap();
        assert_eq!(
            r,
            Route {
                connection_id: "abc_-9",
                sub_path: ""
            }
        );
        let r = route(&Method::GET, "/c/abc/mcp/x").unwrap();
        assert_eq!(
            r,
            Route {
                connection_id: "abc",
                sub_path: "/mcp/x"
            }
        );
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
}
