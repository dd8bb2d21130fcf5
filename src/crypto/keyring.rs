//! Sealing of upstream secrets at rest, and the types that keep secrets out
//! of logs.
//!
//! Secrets are sealed with AES-256-GCM under a master key. The associated
//! data binds a sealed blob to the row it belongs to, so a blob copied onto
//! another credential's row fails to open. Each blob records the id of the
//! key that sealed it, so a ring of keys (the current one sealing, older
//! ones still opening) lets `tessera key rotate` re-seal everything while
//! `serve` keeps serving. The ring comes from `TESSERA_MASTER_KEY` (or the
//! file `TESSERA_MASTER_KEY_FILE` names, read by the CLI) or from
//! `master.key` in the data dir, created with mode 0600 on first use.

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rand::RngCore;
pub use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

const NONCE_LEN: usize = 12;
const KEY_FILE: &str = "master.key";
/// A sealed blob: this tag, the sealing key's id, the nonce, the
/// ciphertext and tag. (Blobs from before key ids are nonce ‖ ciphertext.)
const TAG: &[u8; 3] = b"tk2";
const ID_LEN: usize = 4;

/// Why a key could not be had or a blob could not be opened. Never carries
/// key or plaintext material.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("a master key must be the base64 encoding of exactly 32 bytes (TESSERA_MASTER_KEY holds one, or several separated by commas, the current first)")]
    BadKey,
    #[error("reading or writing the key file {path}: {source}")]
    KeyFile {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "a sealed secret could not be opened (wrong master key, or the row was tampered with)"
    )]
    Open,
}

/// One key of the ring.
struct Key {
    id: [u8; ID_LEN],
    cipher: Aes256Gcm,
    /// A key for MACs, derived from this one (never the sealing key
    /// itself: one key, one use).
    mac: [u8; 32],
}

/// The short id of a key: the first bytes of its SHA-256, shown in hex.
pub type KeyId = [u8; ID_LEN];

/// The master key ring: the current key seals, every key in it opens.
/// Loaded from `TESSERA_MASTER_KEY` (one base64 key, or several separated
/// by commas, the current first) or from `master.key` in the data dir (one
/// key per line, the current first). A ring from the key file can be
/// re-read while serving, so a rotation reaches running processes. Its
/// Debug output never shows a key.
pub struct MasterKey {
    keys: arc_swap::ArcSwap<Vec<Key>>,
    file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

fn parse_keys(text: &str) -> Result<Vec<Key>, SealError> {
    let keys: Vec<Key> = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|v| {
            let bytes = STANDARD.decode(v).map_err(|_| SealError::BadKey)?;
            let key: [u8; 32] = bytes.try_into().map_err(|_| SealError::BadKey)?;
            Ok(Key {
                id: key_id(&key),
                cipher: Aes256Gcm::new(&key.into()),
                mac: mac_key(&key),
            })
        })
        .collect::<Result<_, _>>()?;
    if keys.is_empty() {
        return Err(SealError::BadKey);
    }
    Ok(keys)
}

fn key_id(key: &[u8; 32]) -> KeyId {
    let d = Sha256::digest(key);
    [d[0], d[1], d[2], d[3]]
}

fn mac_key(key: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tessera mac key v1\0");
    h.update(key);
    h.finalize().into()
}

/// A key id in hex, as `key status` shows it.
pub fn key_id_hex(id: &KeyId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random key, base64.
pub fn new_key_base64() -> String {
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    STANDARD.encode(key)
}

impl MasterKey {
    /// The ring from `env_value` when given (the value of
    /// `TESSERA_MASTER_KEY`), else from the data dir's key file, creating
    /// it with a new key when absent.
    pub fn load(env_value: Option<&str>, data_dir: &Path) -> Result<Self, SealError> {
        Self::open_ring(env_value, data_dir, true)
    }

    /// As [`MasterKey::load`], but never creates a key file: for a data dir
    /// whose database already holds sealed secrets, where a new key would
    /// open none of them.
    pub fn load_existing(env_value: Option<&str>, data_dir: &Path) -> Result<Self, SealError> {
        Self::open_ring(env_value, data_dir, false)
    }

    fn open_ring(
        env_value: Option<&str>,
        data_dir: &Path,
        create: bool,
    ) -> Result<Self, SealError> {
        if let Some(v) = env_value {
            return Ok(MasterKey {
                keys: arc_swap::ArcSwap::from_pointee(parse_keys(v)?),
                file: None,
            });
        }
        let path = data_dir.join(KEY_FILE);
        let err = |source| SealError::KeyFile {
            path: path.display().to_string(),
            source,
        };
        if create {
            // Another process may win the race to create it; the file on
            // disk is the one truth.
            write_private(&path, new_key_base64().as_bytes()).map_err(err)?;
        }
        let text = std::fs::read_to_string(&path).map_err(err)?;
        Ok(MasterKey {
            keys: arc_swap::ArcSwap::from_pointee(parse_keys(&text)?),
            file: Some(path),
        })
    }

    /// Re-read the key file (a ring from the environment stays as it is).
    /// A file that cannot be read or parsed keeps the ring in force.
    pub fn reload(&self) -> Result<(), SealError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|source| SealError::KeyFile {
            path: path.display().to_string(),
            source,
        })?;
        self.keys.store(std::sync::Arc::new(parse_keys(&text)?));
        Ok(())
    }

    /// The key file behind the ring, if it came from one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The ids of the ring's keys, the current first.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys.load().iter().map(|k| k.id).collect()
    }

    /// Seal `plaintext` for the row named by `aad` with the current key.
    pub fn seal(&self, aad: &str, plaintext: &SecretString) -> Vec<u8> {
        let keys = self.keys.load();
        let key = &keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let payload = Payload {
            msg: plaintext.expose_secret().as_bytes(),
            aad: aad.as_bytes(),
        };
        let ct = key
            .cipher
            .encrypt(Nonce::from_slice(&nonce), payload)
            .expect("AES-GCM encryption of an in-memory buffer cannot fail");
        let mut out = Vec::with_capacity(TAG.len() + ID_LEN + NONCE_LEN + ct.len());
        out.extend_from_slice(TAG);
        out.extend_from_slice(&key.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    /// A MAC of `parts` (each length-prefixed, so no two lists of parts
    /// share a message) under the current key, truncated to 128 bits.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 16] {
        mac_with(&self.keys.load()[0].mac, parts)
    }

    /// Whether `tag` is the MAC of `parts` under any key of the ring (a
    /// tag made before a rotation stays good while its key is in the
    /// ring). Compared in constant time.
    pub fn mac_matches(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.keys
            .load()
            .iter()
            .any(|k| bool::from(mac_with(&k.mac, parts).ct_eq(tag)))
    }

    /// Open a blob sealed for the row named by `aad`, with whichever key of
    /// the ring sealed it.
    pub fn open(&self, aad: &str, sealed: &[u8]) -> Result<SecretString, SealError> {
        let keys = self.keys.load();
        let attempt = |cipher: &Aes256Gcm, blob: &[u8]| -> Option<Vec<u8>> {
            if blob.len() < NONCE_LEN {
                return None;
            }
            let (nonce, ct) = blob.split_at(NONCE_LEN);
            let payload = Payload {
                msg: ct,
                aad: aad.as_bytes(),
            };
            cipher.decrypt(Nonce::from_slice(nonce), payload).ok()
        };
        let pt = match sealed_key_id(sealed) {
            Some(id) => keys
                .iter()
                .filter(|k| k.id == id)
                .find_map(|k| attempt(&k.cipher, &sealed[TAG.len() + ID_LEN..])),
            None => None,
        }
        // A blob from before key ids: whichever key opens it.
        .or_else(|| keys.iter().find_map(|k| attempt(&k.cipher, sealed)))
        .ok_or(SealError::Open)?;
        let s = String::from_utf8(pt).map_err(|_| SealError::Open)?;
        Ok(SecretString::from(s))
    }
}

fn mac_with(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 16] {
    use hmac::{Hmac, Mac};
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    let full = m.finalize().into_bytes();
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&full[..16]);
    tag
}

/// The id of the key that sealed a blob (None: sealed before key ids).
pub fn sealed_key_id(sealed: &[u8]) -> Option<KeyId> {
    let rest = sealed.strip_prefix(TAG.as_slice())?;
    rest.get(..ID_LEN)?.try_into().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(keys: &[u8]) -> MasterKey {
        let env: Vec<String> = keys.iter().map(|b| STANDARD.encode([*b; 32])).collect();
        MasterKey::load(Some(&env.join(",")), Path::new("/nonexistent")).unwrap()
    }

    fn key() -> MasterKey {
        ring(&[7])
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
        for bad in ["c2hvcnQ=", "!!", "", " , "] {
            assert!(
                matches!(
                    MasterKey::load(Some(bad), Path::new("/x")),
                    Err(SealError::BadKey)
                ),
                "{bad:?}"
            );
        }
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
    fn a_ring_opens_what_any_of_its_keys_sealed() {
        let s = SecretString::from("v".to_string());
        let old = ring(&[1]).seal("a", &s);
        let new = ring(&[2, 1]);
        // The current key seals; the old one still opens.
        assert_eq!(new.open("a", &old).unwrap().expose_secret(), "v");
        let resealed = new.seal("a", &s);
        assert_eq!(sealed_key_id(&resealed), Some(new.ids()[0]));
        assert_eq!(sealed_key_id(&old), Some(ring(&[1]).ids()[0]));
        assert!(matches!(
            ring(&[1]).open("a", &resealed),
            Err(SealError::Open)
        ));
        // A blob from before key ids (nonce ‖ ciphertext) still opens.
        let legacy = old[TAG.len() + ID_LEN..].to_vec();
        assert_eq!(sealed_key_id(&legacy), None);
        assert_eq!(new.open("a", &legacy).unwrap().expose_secret(), "v");
    }

    #[test]
    fn a_ring_from_the_key_file_can_be_reread() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            MasterKey::load_existing(None, dir.path()),
            Err(SealError::KeyFile { .. })
        ));
        let k = MasterKey::load(None, dir.path()).unwrap();
        let first = k.ids();
        let text = std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap();
        std::fs::write(
            dir.path().join(KEY_FILE),
            format!("{}\n{text}", new_key_base64()),
        )
        .unwrap();
        k.reload().unwrap();
        assert_eq!(k.ids().len(), 2);
        assert_eq!(k.ids()[1], first[0]);
    }

    #[test]
    fn debug_redacts() {
        assert_eq!(format!("{:?}", key()), "MasterKey(<redacted>)");
        let t = crate::crypto::tokens::new_caller_token();
        assert!(!format!("{t:?}").contains(&t.expose_secret()[4..]));
    }
}
