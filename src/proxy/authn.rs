//! Authenticate: the caller's bearer token, checked against the snapshot by
//! its SHA-256 digest; then the check that the address belongs to it.

use std::sync::Arc;

use http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::crypto::tokens::token_digest;
use crate::model::{Caller, Connection};
use crate::proxy::error::ProxyError;
use crate::snapshot::Snapshot;

/// The token of an `Authorization: Bearer <token>` header. Anything else
/// (absent, another scheme, two Authorization headers) is no token.
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let v = v.as_bytes();
    if v.len() < 7 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let t = v[7..].trim_ascii();
    (!t.is_empty()).then_some(t)
}

/// The caller a request's token belongs to; else no token
/// ([`ProxyError::Unauthorized`]) or an unknown one
/// ([`ProxyError::UnknownToken`]), both 403.
pub fn authenticate(snap: &Snapshot, headers: &HeaderMap) -> Result<Arc<Caller>, ProxyError> {
    let token = bearer_token(headers).ok_or(ProxyError::Unauthorized)?;
    let digest = token_digest(token);
    let caller = snap.callers.get(&digest).ok_or(ProxyError::UnknownToken)?;
    Ok(caller.clone())
}

/// The connection at `id` if it is this caller's. Someone else's address
/// answers exactly like an unknown one (404), so a valid token cannot be
/// used to probe which addresses exist.
pub fn connection_for<'s>(
    snap: &'s Snapshot,
    caller: &Caller,
    id: &str,
) -> Result<&'s Connection, ProxyError> {
    let conn = snap.connections.get(id).ok_or(ProxyError::NotFound)?;
    let owner = conn.caller_id.to_le_bytes();
    if bool::from(owner.ct_eq(&caller.id.to_le_bytes())) {
        Ok(conn)
    } else {
        Err(ProxyError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(v: &[&str]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for v in v {
            m.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn parses_bearer_only() {
        assert_eq!(bearer_token(&h(&["Bearer abc"])), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&h(&["bearer  abc "])), Some(&b"abc"[..]));
        assert_eq!(bearer_token(&h(&["Basic abc"])), None);
        assert_eq!(bearer_token(&h(&["Bearer "])), None);
        assert_eq!(bearer_token(&h(&[])), None);
        assert_eq!(bearer_token(&h(&["Bearer a", "Bearer b"])), None);
    }
}
