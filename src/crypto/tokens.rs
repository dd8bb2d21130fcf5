//! Tokens, ids and digests: what tessera hands out and how it looks them up.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use secrecy::SecretString;
use sha2::{Digest, Sha256};

/// Prefix of every caller token, so a leaked one is recognisable by scanners.
pub const CALLER_TOKEN_PREFIX: &str = "tsr_";

/// A new caller token: the prefix and 256 random bits.
pub fn new_caller_token() -> SecretString {
    new_token(CALLER_TOKEN_PREFIX)
}

/// Admin tokens start with this, so one is never mistaken for a caller's
/// (and a secret scanner can tell them apart).
pub const ADMIN_TOKEN_PREFIX: &str = "tsa_";

/// A new admin token: 256 random bits.
pub fn new_admin_token() -> SecretString {
    new_token(ADMIN_TOKEN_PREFIX)
}

fn new_token(prefix: &str) -> SecretString {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    SecretString::from(format!("{prefix}{}", URL_SAFE_NO_PAD.encode(b)))
}

/// A new connection id: 192 random bits, URL-safe, starting with a letter
/// or digit (an id starting with '-' reads as a flag on a command line).
pub fn new_connection_id() -> String {
    loop {
        let mut b = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut b);
        let id = URL_SAFE_NO_PAD.encode(b);
        if id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            return id;
        }
    }
}

/// The SHA-256 digest under which a caller token is stored and looked up.
/// A token has 256 bits of entropy, so a fast hash is the right tool: a
/// password hash per request would buy nothing and cost milliseconds.
pub fn token_digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Hex SHA-256. The audit trail digests tool arguments as sent; approvals
/// key on the canonical form of the whole call
/// ([`crate::authz::approvals::call_digest`]).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ids_never_read_as_flags() {
        for _ in 0..2000 {
            let id = new_connection_id();
            assert!(id.starts_with(|c: char| c.is_ascii_alphanumeric()), "{id}");
            assert_eq!(id.len(), 32);
        }
    }
}
