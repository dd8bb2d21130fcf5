//! A POST to an endpoint a 2024-11-05 server announced on its stream
//! (`crate::proxy::legacy_sse` rewrote it under the connection's address
//! with a tag): the upstream URI the tag vouches for, or an unknown
//! address.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::Uri;
use url::Url;

use crate::crypto::keyring::MasterKey;
use crate::proxy::error::ProxyError;
use crate::proxy::legacy_sse::{message, PREFIX, TAG_LEN};

/// For a request to an announced endpoint (`PREFIX` in `sub_path`): the
/// upstream URI its tag vouches for. `Ok(None)`: not such a request.
/// A tag that is not this caller's on this connection for this path and
/// query is an unknown address (404), and so is another method than POST
/// (the transport POSTs there only).
pub fn upstream_uri(
    key: &MasterKey,
    owner: crate::proxy::session::Owner<'_>,
    method: &http::Method,
    upstream: &Url,
    sub_path: &str,
    query: Option<&str>,
) -> Result<Option<Uri>, ProxyError> {
    let Some(rest) = sub_path.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    if *method != http::Method::POST {
        return Err(ProxyError::NotFound);
    }
    let (tag, path) = match rest.get(..TAG_LEN) {
        Some(tag) if rest[TAG_LEN..].starts_with('/') => (tag, &rest[TAG_LEN..]),
        _ => return Err(ProxyError::NotFound),
    };
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| ProxyError::NotFound)?;
    let origin = upstream.origin().ascii_serialization();
    let query = query.filter(|q| !q.is_empty());
    let id = owner.caller_id.to_be_bytes();
    let parts = message(
        &id,
        owner.caller,
        owner.connection,
        &origin,
        path,
        query.unwrap_or(""),
    );
    if !key.mac_matches(&parts, &tag) {
        return Err(ProxyError::NotFound);
    }
    let mut s = String::with_capacity(origin.len() + path.len() + query.map_or(0, str::len) + 1);
    s.push_str(&origin);
    s.push_str(path);
    if let Some(q) = query {
        s.push('?');
        s.push_str(q);
    }
    s.parse()
        .map(Some)
        .map_err(|_| ProxyError::InvalidRequest("the request path is not a valid URI"))
}
