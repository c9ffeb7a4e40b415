//! The audit key: reading, creating and the sub-keys derived from it, and
//! every MAC made under them (records, head anchors, params digests).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use snowluma_proto::text::canonical_json as canonical;

use super::record::MAC_TAG;
use super::{AuditError, sibling, unhex32};
use crate::trace::hex;

/// Sub-keys: records and head anchors are MAC'd under keys derived from the
/// audit key with these labels, never under the key that digests params
/// (whose input is canonical JSON, which no label is).
const RECORD_KEY_LABEL: &[u8] = b"snowluma-mcp audit record mac v2";
const HEAD_KEY_LABEL: &[u8] = b"snowluma-mcp audit head v1";

/// Where the server takes the audit key from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// `<log>.key`, created (0600) if missing.
    BesideLog,
    /// `SNOWLUMA_MCP_AUDIT_KEY`: must exist, never created.
    File(PathBuf),
}

/// The audit key and the sub-keys derived from it.
#[derive(Clone)]
pub struct Key {
    raw: [u8; 32],
    record: [u8; 32],
    head: [u8; 32],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    // proven: HMAC-SHA256 accepts keys of any length, so new_from_slice cannot fail.
    #[allow(clippy::expect_used)]
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac
}

fn hmac_bytes(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let out = hmac(key, parts).finalize().into_bytes();
    let mut a = [0u8; 32];
    // HMAC-SHA256 output is 32 bytes.
    a.copy_from_slice(&out);
    a
}

impl Key {
    pub(super) fn from_raw(raw: [u8; 32]) -> Key {
        Key { raw, record: hmac_bytes(&raw, &[RECORD_KEY_LABEL]), head: hmac_bytes(&raw, &[HEAD_KEY_LABEL]) }
    }

    pub(super) fn record_mac(&self, body: &[u8]) -> String {
        hex(&hmac_bytes(&self.record, &[body]))
    }

    pub(super) fn record_mac_ok(&self, body: &[u8], tag: &[u8; 32]) -> bool {
        hmac(&self.record, &[body]).verify_slice(tag).is_ok()
    }

    fn head_parts(seq: u64, hash: &str) -> String {
        format!("{seq}\n{hash}")
    }

    pub(super) fn head_mac(&self, seq: u64, hash: &str) -> String {
        hex(&hmac_bytes(&self.head, &[Key::head_parts(seq, hash).as_bytes()]))
    }

    /// A digest of `params` (canonical JSON) under the audit key itself.
    pub(super) fn params_digest(&self, params: &Value) -> String {
        format!("{MAC_TAG}{}", hex(&hmac_bytes(&self.raw, &[canonical(params).as_bytes()])))
    }

    pub(super) fn head_mac_ok(&self, seq: u64, hash: &str, tag: &[u8; 32]) -> bool {
        hmac(&self.head, &[Key::head_parts(seq, hash).as_bytes()]).verify_slice(tag).is_ok()
    }
}

/// `<log>.key`, the default key file.
pub fn key_path(log: &Path) -> PathBuf {
    sibling(log, ".key")
}

fn parse_key(path: &Path, text: &str) -> Result<Key, AuditError> {
    let raw =
        unhex32(text.trim().to_ascii_lowercase().as_bytes()).ok_or_else(|| AuditError::BadKey { path: path.into() })?;
    Ok(Key::from_raw(raw))
}

/// Read an existing key file.
pub fn read_key(path: &Path) -> Result<Key, AuditError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| AuditError::KeyUnreadable { path: path.to_owned(), source })?;
    parse_key(path, &text)
}

/// Make a new key file (0600); an existing file is never overwritten.
pub fn keygen(path: &Path) -> Result<(), AuditError> {
    let raw: [u8; 32] = crate::trace::random_bytes();
    let mut f = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(AuditError::KeyExists { path: path.to_owned() });
        }
        Err(e) => return Err(e.into()),
    };
    f.write_all(format!("{}\n", hex(&raw)).as_bytes())?;
    f.sync_all()?;
    Ok(())
}

pub(super) fn load_or_create_key(path: &Path) -> Result<Key, AuditError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key(path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            keygen(path)?;
            read_key(path)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditLog;
    use crate::audit::head::head_path;
    use crate::audit::test_support::Dir;
    use crate::audit::verify::HeadCheck;
    use crate::audit::verify::{MacCheck, verify};

    #[test]
    fn fresh_start_and_explicit_keys() {
        let dir = Dir::new("keys");
        let path = dir.0.join("audit.log");
        // An empty log without head: fresh; with a blank head: fresh.
        std::fs::write(&path, "").unwrap();
        assert_eq!(verify(&path, Err("none".into())).unwrap().head, HeadCheck::Fresh);
        let k = dir.0.join("k");
        let err = AuditLog::open(&path, &KeySource::File(k.clone()), None, "write").err().unwrap();
        assert!(err.is_key() && err.to_string().contains("keygen"), "{err}");
        assert!(!k.exists() && !head_path(&path).exists());
        keygen(&k).unwrap();
        assert!(matches!(keygen(&k), Err(AuditError::KeyExists { .. })));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&k).unwrap().permissions().mode() & 0o777, 0o600);
        AuditLog::open(&path, &KeySource::File(k.clone()), None, "write").unwrap();
        assert!(!key_path(&path).exists(), "no key beside the log");
        assert_eq!(std::fs::metadata(head_path(&path)).unwrap().permissions().mode() & 0o777, 0o600);
        let r = verify(&path, read_key(&k).map_err(|e| e.to_string())).unwrap();
        assert_eq!((r.records, r.macs), (1, MacCheck::Checked));
        let r = verify(&path, Err("no key".into())).unwrap();
        assert!(r.to_string().contains("MACs NOT checked (no key)"), "{r}");
        std::fs::write(&k, "nothex\n").unwrap();
        assert!(matches!(read_key(&k), Err(AuditError::BadKey { .. })));
    }
}
