//! The request's shape, before anything is read or looked up: a target
//! and head within the limits, no body on GET or DELETE, no credential in
//! the query.

use http::header;

use crate::proxy::error::ProxyError;

/// Refuse a request whose target or headers are over the limits. hyper
/// already refused what cannot be parsed (CR, LF or NUL in a value, a bad
/// request line).
pub(crate) fn check_shape(
    parts: &http::request::Parts,
    limits: &crate::config::RequestLimits,
) -> Result<(), ProxyError> {
    let target = parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
    if target > limits.max_uri_bytes {
        return Err(ProxyError::UriTooLong(limits.max_uri_bytes));
    }
    let h = &parts.headers;
    let bytes: usize = h.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
    if h.len() > limits.max_headers || bytes > limits.max_header_bytes {
        return Err(ProxyError::HeadersTooLarge(
            limits.max_headers,
            limits.max_header_bytes,
        ));
    }
    // Framing needs no check here: a head with two lengths, or a length
    // and Transfer-Encoding, was refused before hyper parsed it
    // (`raw_head`), and tessera frames what it forwards with its own
    // Content-Length (tests/it/hostile.rs).
    //
    // A GET or DELETE body is never inspected (only a POST's is), and many
    // servers answer a GET without reading its body: on a kept-alive
    // upstream connection the unread body is then parsed as the next
    // request, unauthorized and carrying the stored credential. MCP gives
    // neither method a body, so one is refused before it is read.
    if matches!(parts.method, http::Method::GET | http::Method::DELETE) {
        let length = h
            .get(header::CONTENT_LENGTH)
            .map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()));
        let empty = matches!(length, None | Some(Some(0)));
        if !empty || h.contains_key(header::TRANSFER_ENCODING) {
            return Err(ProxyError::InvalidRequest(
                "a GET or DELETE request may not carry a body",
            ));
        }
    }
    Ok(())
}

/// Refuse (400, `query_credential`) a query with a parameter named like a
/// credential (`?access_token=…`). Refused rather than dropped: dropping
/// would silently change the request the caller sent, and refusing tells
/// the caller why (its token belongs in `Authorization`, the upstream's is
/// tessera's to inject). Names are percent-decoded (`%74oken`) and `+` is
/// a space, as a form parser reads them.
pub fn refuse_credential_query(query: Option<&str>) -> Result<(), ProxyError> {
    match query {
        Some(q) if crate::wire::query::names_credential(q) => Err(ProxyError::QueryCredential),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_query_parameters_are_refused() {
        for q in [
            "access_token=x",
            "a=1&TOKEN=x",
            "api-key=x",
            "apikey",
            "Key=1",
            "secret=",
            "password=p",
            "client_secret=c",
            "auth=1",
            "%74oken=x",
            "a=1;token=x",
        ] {
            assert!(
                matches!(
                    refuse_credential_query(Some(q)),
                    Err(ProxyError::QueryCredential)
                ),
                "{q}"
            );
        }
        for q in [
            None,
            Some(""),
            Some("a=token&b=secret"),
            Some("max_tokens=5&page_token=x&keyword=k&author=a&sessionId=s"),
        ] {
            assert!(refuse_credential_query(q).is_ok(), "{q:?}");
        }
    }
}
