//! Sealing of upstream secrets at rest, and the types that keep secrets out
//! of logs.
//!
//! Secrets are sealed with AES-256-GCM under a master key. The associated
//! data binds a sealed blob to the row it belongs to, so a blob copied onto
//! another credential's row fails to open. The key comes from
//! `TESSERA_MASTER_KEY` (base64 of 32 bytes) or from `master.key` in the
//! data dir, created with mode 0600 on first use.

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use rand::RngCore;
pub use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

const NONCE_LEN: usize = 12;
const KEY_FILE: &str = "master.key";

/// Why a key could not be had or a blob could not be opened. Never carries
/// key or plaintext material.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("TESSERA_MASTER_KEY must be the base64 encoding of exactly 32 bytes")]
    BadKey,
    #[error("reading or creating the key file {path}: {source}")]
    KeyFile {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "a sealed secret could not be opened (wrong master key, or the row was tampered with)"
    )]
    Open,
}

/// The master key. Its Debug output never shows the key.
pub struct MasterKey(Aes256Gcm);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    /// The key from `env_value` when given (the value of
    /// `TESSERA_MASTER_KEY`), else from the data dir's key file, creating it.
    pub fn load(env_value: Option<&str>, data_dir: &Path) -> Result<Self, SealError> {
        match env_value {
            Some(v) => Self::from_base64(v.trim()),
            None => Self::from_key_file(&data_dir.join(KEY_FILE)),
        }
    }

    fn from_base64(v: &str) -> Result<Self, SealError> {
        let bytes = STANDARD.decode(v).map_err(|_| SealError::BadKey)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| SealError::BadKey)?;
        Ok(Self(Aes256Gcm::new(&key.into())))
    }

    fn from_key_file(path: &Path) -> Result<Self, SealError> {
        let err = |source| SealError::KeyFile {
            path: path.display().to_string(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_base64(text.trim()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                rand::rngs::OsRng.fill_bytes(&mut key);
                write_private(path, STANDARD.encode(key).as_bytes()).map_err(err)?;
                // Another process may have won the race to create it; the
                // file on disk is the one truth.
                Self::from_base64(std::fs::read_to_string(path).map_err(err)?.trim())
            }
            Err(e) => Err(err(e)),
        }
    }

    /// Seal `plaintext` for the row named by `aad`: nonce ‖ ciphertext+tag.
    pub fn seal(&self, aad: &str, plaintext: &SecretString) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let payload = Payload {
            msg: plaintext.expose_secret().as_bytes(),
            aad: aad.as_bytes(),
        };
        let ct = self
            .0
            .encrypt(Nonce::from_slice(&nonce), payload)
            .expect("AES-GCM encryption of an in-memory buffer cannot fail");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        out
    }

    /// Open a blob sealed for the row named by `aad`.
    pub fn open(&self, aad: &str, sealed: &[u8]) -> Result<SecretString, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        let pt = self
            .0
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| SealError::Open)?;
        let s = String::from_utf8(pt).map_err(|_| SealError::Open)?;
        Ok(SecretString::from(s))
    }
}

/// Create `path` with mode 0600 (owner only) and write `bytes`; fails if it
/// already exists, so a key is never overwritten.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(mut f) => f.write_all(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Prefix of every caller token, so a leaked one is recognisable by scanners.
pub const CALLER_TOKEN_PREFIX: &str = "tsr_";

/// A new caller token: the prefix and 256 random bits.
pub fn new_caller_token() -> SecretString {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    SecretString::from(format!(
        "{CALLER_TOKEN_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(b)
    ))
}

/// A new connection id: 192 random bits, URL-safe.
pub fn new_connection_id() -> String {
    let mut b = [0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

/// The SHA-256 digest under which a caller token is stored and looked up.
/// A token has 256 bits of entropy, so a fast hash is the right tool: a
/// password hash per request would buy nothing and cost milliseconds.
pub fn token_digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MasterKey {
        MasterKey::from_base64(&STANDARD.encode([7u8; 32])).unwrap()
    }

    #[test]
    fn seal_round_trips_and_is_bound_to_its_row() {
        let k = key();
        let s = SecretString::from("ghp_supersecret".to_string());
        let blob = k.seal("credential:1", &s);
        assert!(!blob.windows(6).any(|w| w == b"ghp_su"));
        assert_eq!(
            k.open("credential:1", &blob).unwrap().expose_secret(),
            "ghp_supersecret"
        );
        assert!(matches!(
            k.open("credential:2", &blob),
            Err(SealError::Open)
        ));
    }

    #[test]
    fn bad_env_key_is_refused() {
        assert!(matches!(
            MasterKey::from_base64("c2hvcnQ="),
            Err(SealError::BadKey)
        ));
        assert!(matches!(
            MasterKey::from_base64("!!"),
            Err(SealError::BadKey)
        ));
    }

    #[test]
    fn key_file_is_created_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = MasterKey::load(None, dir.path()).unwrap();
        let blob = a.seal("x", &SecretString::from("v".to_string()));
        let b = MasterKey::load(None, dir.path()).unwrap();
        assert_eq!(b.open("x", &blob).unwrap().expose_secret(), "v");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn debug_redacts() {
        assert_eq!(format!("{:?}", key()), "MasterKey(<redacted>)");
        let t = new_caller_token();
        assert!(!format!("{t:?}").contains(&t.expose_secret()[4..]));
    }
}
