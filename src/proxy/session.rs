//! Sessions belong to the caller that opened them.
//!
//! Every request reaches the upstream with the same injected credential,
//! so the upstream cannot tell tessera's callers apart: were its
//! `Mcp-Session-Id` handed out as is, a caller who learned another's
//! session id (a log, a shared sandbox, a guess at a sequential id) could
//! read that session's state and end it. So the session id a caller sees
//! is the upstream's bound to that caller and connection:
//!
//! ```text
//! <upstream session id>.<tag>    tag = base64url(HMAC(key, caller, connection, upstream id))[..128 bits]
//! ```
//!
//! A request that presents a session id is forwarded only when the tag is
//! this caller's on this connection, with the upstream's own id restored;
//! any other (another caller's, another connection's, a forged or bare
//! one) is answered 404 as an unknown session, before anything reaches
//! the upstream. The key is derived from the master key ring, which
//! every replica shares, so a session opened through one replica goes on
//! through any other: nothing is stored. A rotation keeps sessions alive
//! while the old key stays in the ring.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{HeaderMap, HeaderValue};

use crate::crypto::keyring::MasterKey;
use crate::proxy::error::ProxyError;

const HEADER: &str = "mcp-session-id";
/// 128 bits in unpadded base64url.
const TAG_LEN: usize = 22;

/// Who a session is bound to: the caller (its id and name: a caller
/// removed and made anew under its name is someone else) and the
/// connection.
#[derive(Clone, Copy)]
pub struct Owner<'a> {
    pub caller_id: i64,
    pub caller: &'a str,
    pub connection: &'a str,
}

impl Owner<'_> {
    /// The MAC's message (each part length-prefixed by `MasterKey::mac`);
    /// `id` holds the caller id's bytes.
    fn message<'b>(&'b self, id: &'b [u8; 8], upstream: &'b [u8]) -> [&'b [u8]; 5] {
        [
            b"mcp-session-id v1",
            id,
            self.caller.as_bytes(),
            self.connection.as_bytes(),
            upstream,
        ]
    }

    fn mac(&self, key: &MasterKey, upstream: &[u8]) -> [u8; 16] {
        key.mac(&self.message(&self.caller_id.to_be_bytes(), upstream))
    }

    fn matches(&self, key: &MasterKey, upstream: &[u8], tag: &[u8]) -> bool {
        key.mac_matches(&self.message(&self.caller_id.to_be_bytes(), upstream), tag)
    }
}

/// Restore the upstream's session id in a request's headers, if the
/// caller presented one that is its own on this connection.
pub fn for_upstream(
    key: &MasterKey,
    owner: Owner<'_>,
    headers: &mut HeaderMap,
) -> Result<(), ProxyError> {
    let mut all = headers.get_all(HEADER).iter();
    let presented = match (all.next(), all.next()) {
        (None, _) => return Ok(()),
        (Some(v), None) => v,
        (Some(_), Some(_)) => {
            return Err(ProxyError::InvalidRequest(
                "Mcp-Session-Id appears more than once",
            ))
        }
    };
    let bytes = presented.as_bytes();
    let split = bytes.len().checked_sub(TAG_LEN + 1);
    let (upstream, tag) = match split {
        Some(at) if bytes[at] == b'.' => (&bytes[..at], &bytes[at + 1..]),
        _ => return Err(ProxyError::SessionUnknown),
    };
    let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else {
        return Err(ProxyError::SessionUnknown);
    };
    if upstream.is_empty() || !owner.matches(key, upstream, &tag) {
        return Err(ProxyError::SessionUnknown);
    }
    // A prefix of a valid header value is one.
    let restored = HeaderValue::from_bytes(upstream).map_err(|_| ProxyError::SessionUnknown)?;
    headers.insert(HEADER, restored);
    Ok(())
}

/// Bind the session id(s) an upstream answered with to this caller and
/// connection.
pub fn for_caller(key: &MasterKey, owner: Owner<'_>, headers: &mut HeaderMap) {
    if !headers.contains_key(HEADER) {
        return;
    }
    let upstream: Vec<HeaderValue> = headers.get_all(HEADER).iter().cloned().collect();
    headers.remove(HEADER);
    for u in upstream {
        let tag = owner.mac(key, u.as_bytes());
        let mut bound = Vec::with_capacity(u.len() + 1 + TAG_LEN);
        bound.extend_from_slice(u.as_bytes());
        bound.push(b'.');
        bound.extend_from_slice(URL_SAFE_NO_PAD.encode(tag).as_bytes());
        // The upstream's value was a valid header value; '.' and base64url
        // keep it one.
        if let Ok(v) = HeaderValue::from_bytes(&bound) {
            headers.append(HEADER, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(b: u8) -> MasterKey {
        use base64::engine::general_purpose::STANDARD;
        let dir = std::env::temp_dir();
        MasterKey::load(Some(&STANDARD.encode([b; 32])), &dir).unwrap()
    }

    fn owner<'a>(caller: &'a str, connection: &'a str) -> Owner<'a> {
        Owner {
            caller_id: 1,
            caller,
            connection,
        }
    }

    fn bound(key: &MasterKey, caller: &str, conn: &str, upstream: &str) -> HeaderValue {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_str(upstream).unwrap());
        for_caller(key, owner(caller, conn), &mut h);
        h[HEADER].clone()
    }

    fn present(key: &MasterKey, caller: &str, conn: &str, v: &[u8]) -> Result<String, ProxyError> {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(v).unwrap());
        for_upstream(key, owner(caller, conn), &mut h)?;
        Ok(h[HEADER].to_str().unwrap().to_string())
    }

    #[test]
    fn a_session_goes_on_only_for_its_caller_and_connection() {
        let k = ring(1);
        let v = bound(&k, "a", "c1", "up-123");
        assert!(v.to_str().unwrap().starts_with("up-123."));
        assert_eq!(present(&k, "a", "c1", v.as_bytes()).unwrap(), "up-123");
        for (caller, conn) in [("b", "c1"), ("a", "c2"), ("", "ac1")] {
            assert!(matches!(
                present(&k, caller, conn, v.as_bytes()),
                Err(ProxyError::SessionUnknown)
            ));
        }
        // A caller made anew under the same name is someone else.
        let mut h = HeaderMap::new();
        h.insert(HEADER, v.clone());
        let reborn = Owner {
            caller_id: 2,
            ..owner("a", "c1")
        };
        assert!(for_upstream(&k, reborn, &mut h).is_err());
        // Another key (another deployment) does not vouch for it.
        assert!(present(&ring(2), "a", "c1", v.as_bytes()).is_err());
    }

    #[test]
    fn bare_forged_and_altered_ids_are_unknown() {
        let k = ring(1);
        let v = bound(&k, "a", "c1", "up-123");
        let s = v.as_bytes();
        let mut flipped = s.to_vec();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        let mut other_id = s.to_vec();
        other_id[0] = b'x';
        for bad in [
            &b"up-123"[..],
            &flipped,
            &other_id,
            &s[..s.len() - 1],
            &s[6..],
            b"",
            b".AAAAAAAAAAAAAAAAAAAAAA",
        ] {
            assert!(
                matches!(present(&k, "a", "c1", bad), Err(ProxyError::SessionUnknown)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn two_session_ids_are_refused_and_none_is_fine() {
        let k = ring(1);
        let v = bound(&k, "a", "c1", "s");
        let mut h = HeaderMap::new();
        h.append(HEADER, v.clone());
        h.append(HEADER, v);
        assert!(matches!(
            for_upstream(&k, owner("a", "c1"), &mut h),
            Err(ProxyError::InvalidRequest(_))
        ));
        let mut none = HeaderMap::new();
        for_upstream(&k, owner("a", "c1"), &mut none).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_session_survives_a_rotation_while_its_key_is_in_the_ring() {
        use base64::engine::general_purpose::STANDARD;
        let old = ring(1);
        let v = bound(&old, "a", "c1", "s");
        let both = format!(
            "{},{}",
            STANDARD.encode([2u8; 32]),
            STANDARD.encode([1u8; 32])
        );
        let rotated = MasterKey::load(Some(&both), &std::env::temp_dir()).unwrap();
        assert_eq!(present(&rotated, "a", "c1", v.as_bytes()).unwrap(), "s");
    }
}
