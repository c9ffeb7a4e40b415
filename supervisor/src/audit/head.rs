//! The head file `<log>.head`: two slots, each anchoring the chain's end.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::key::Key;
use super::record::MAC_TAG;
use super::{is_sha256_tag, sha256_tag, sibling, unhex32};

/// The head file: two slots of this size, the second on its own page (and
/// so its own disk sectors), at [`HEAD_SLOT_1`].
pub(super) const HEAD_SLOT: usize = 256;
pub(super) const HEAD_SLOT_1: usize = 4096;
pub(super) const HEAD_LEN: usize = HEAD_SLOT_1 + HEAD_SLOT;

/// `<log>.head`, the head file.
pub fn head_path(log: &Path) -> PathBuf {
    sibling(log, ".head")
}

/// The end of the chain as the head file records it: the last record's seq
/// and the SHA-256 of its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub seq: u64,
    pub hash: String,
}

impl Anchor {
    pub(super) fn of(seq: u64, line: &[u8]) -> Anchor {
        Anchor { seq, hash: sha256_tag(line) }
    }
}

#[derive(Debug, PartialEq)]
pub(super) enum HeadState {
    /// No anchor yet (a fresh head, or an empty file).
    Blank,
    Anchored(Anchor),
    /// Neither blank nor a valid anchor in any slot.
    Invalid,
}

fn blank_slot() -> [u8; HEAD_SLOT] {
    let mut s = [b' '; HEAD_SLOT];
    s[HEAD_SLOT - 1] = b'\n';
    s
}

/// One slot: the anchor as one JSON object, padded with spaces, newline-ended.
fn anchor_slot(key: &Key, a: &Anchor) -> [u8; HEAD_SLOT] {
    let text = format!(
        "{{\"head\":1,\"seq\":{},\"hash\":\"{}\",\"mac\":\"{MAC_TAG}{}\"}}",
        a.seq,
        a.hash,
        key.head_mac(a.seq, &a.hash)
    );
    let mut s = blank_slot();
    // At most 204 bytes (20 digits of seq, a 71-byte hash, a 76-byte mac),
    // so it always fits before the newline.
    let n = text.len().min(HEAD_SLOT - 1);
    s[..n].copy_from_slice(&text.as_bytes()[..n]);
    s
}

pub(super) enum Slot {
    Blank,
    Valid(Anchor),
    Invalid,
}

pub(super) fn parse_slot(slot: &[u8], key: Option<&Key>) -> Slot {
    let t = slot.trim_ascii();
    if t.is_empty() {
        return Slot::Blank;
    }
    let parsed = (|| {
        let v: Value = serde_json::from_slice(t).ok()?;
        if v.get("head").and_then(Value::as_u64) != Some(1) {
            return None;
        }
        let seq = v.get("seq").and_then(Value::as_u64)?;
        let hash = v.get("hash").and_then(Value::as_str).filter(|h| is_sha256_tag(h))?;
        let tag = unhex32(v.get("mac").and_then(Value::as_str)?.strip_prefix(MAC_TAG)?.as_bytes())?;
        if let Some(k) = key
            && !k.head_mac_ok(seq, hash, &tag)
        {
            return None;
        }
        Some(Anchor { seq, hash: hash.to_owned() })
    })();
    match parsed {
        Some(a) => Slot::Valid(a),
        None => Slot::Invalid,
    }
}

/// The head file's two slots (short or empty when the file is).
pub(super) fn head_slots(bytes: &[u8]) -> [&[u8]; 2] {
    let at = |from: usize| bytes.get(from..bytes.len().min(from + HEAD_SLOT)).unwrap_or_default();
    [at(0), at(HEAD_SLOT_1)]
}

/// The head file's anchor: the valid slot with the highest seq (MACs
/// checked when `key` is given, otherwise only the shape).
pub(super) fn read_head(bytes: &[u8], key: Option<&Key>) -> HeadState {
    if bytes.len() > HEAD_LEN {
        return HeadState::Invalid;
    }
    let mut best: Option<Anchor> = None;
    let mut all_blank = true;
    for slot in head_slots(bytes) {
        match parse_slot(slot, key) {
            Slot::Blank => {}
            Slot::Valid(a) => {
                all_blank = false;
                if best.as_ref().is_none_or(|b| a.seq > b.seq) {
                    best = Some(a);
                }
            }
            Slot::Invalid => all_blank = false,
        }
    }
    match best {
        Some(a) => HeadState::Anchored(a),
        None if all_blank => HeadState::Blank,
        None => HeadState::Invalid,
    }
}

pub(super) fn read_head_file(f: &File) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; HEAD_LEN + 1];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// Anchor the head at `a`: slot 0, then slot 1, each with one `pwrite` and
/// an `fdatasync`, so that an interrupted update leaves one of them whole.
pub(super) fn write_head(head: &File, key: &Key, a: &Anchor) -> std::io::Result<()> {
    let slot = anchor_slot(key, a);
    for offset in [0, HEAD_SLOT_1] {
        head.write_all_at(&slot, offset as u64)?;
        head.sync_data()?;
    }
    Ok(())
}

/// A whole head file: `anchor` in both slots, or blank ones.
pub(super) fn whole_head(key: &Key, anchor: Option<&Anchor>) -> Vec<u8> {
    let slot = match anchor {
        Some(a) => anchor_slot(key, a),
        None => blank_slot(),
    };
    let mut out = Vec::with_capacity(HEAD_LEN);
    out.extend_from_slice(&slot);
    // Between the slots: spaces, then a newline.
    out.resize(HEAD_SLOT_1 - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(&slot);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::key::{KeySource, key_path, read_key};
    use crate::audit::test_support::{Dir, intent, lines_of, write_lines, written};
    use crate::audit::verify::{HeadCheck, verify};
    use crate::audit::{AuditError, AuditLog};

    #[test]
    fn a_lagging_head_accepts_authenticated_records_after_it() {
        let dir = Dir::new("lag");
        let path = written(&dir, 3);
        let key = read_key(&key_path(&path)).unwrap();
        let lines = lines_of(&path);
        // The head as it was two records ago (its updates failed since).
        let old = whole_head(&key, Some(&Anchor::of(1, lines[1].as_bytes())));
        std::fs::write(head_path(&path), &old).unwrap();
        let r = verify(&path, Ok(key.clone())).unwrap();
        assert_eq!(r.head, HeadCheck::Lags { anchored: 1, after: 2 });
        assert!(r.to_string().contains("2 later records written after the last head update"), "{r}");
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        log.append_blocking(intent(9)).unwrap();
        assert_eq!(verify(&path, Ok(key.clone())).unwrap().head, HeadCheck::Matches);
        // An update interrupted in slot 0: slot 1 still holds the anchor before.
        let lines = lines_of(&path);
        let n = lines.len();
        let mut head = whole_head(&key, Some(&Anchor::of((n - 2) as u64, lines[n - 2].as_bytes())));
        head[20..60].fill(b'#');
        std::fs::write(head_path(&path), &head).unwrap();
        assert_eq!(
            verify(&path, Ok(key.clone())).unwrap().head,
            HeadCheck::Lags { anchored: (n - 2) as u64, after: 1 }
        );
        AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        assert_eq!(verify(&path, Ok(key.clone())).unwrap().head, HeadCheck::Matches);
        // Interrupted in slot 1: slot 0 holds the new anchor.
        let mut head = std::fs::read(head_path(&path)).unwrap();
        head[HEAD_SLOT_1 + 20..HEAD_SLOT_1 + 60].fill(b'#');
        std::fs::write(head_path(&path), &head).unwrap();
        assert_eq!(verify(&path, Ok(key.clone())).unwrap().head, HeadCheck::Matches);
        // A head at rest holds no older anchor: blanking a slot does not let
        // the last record go.
        AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        let mut head = std::fs::read(head_path(&path)).unwrap();
        head[..HEAD_SLOT - 1].fill(b' ');
        std::fs::write(head_path(&path), &head).unwrap();
        let mut lines = lines_of(&path);
        lines.pop();
        write_lines(&path, &lines, "\n");
        assert!(verify(&path, Ok(key.clone())).unwrap_err().to_string().contains("removed"));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(err, AuditError::Removed { .. }), "{err}");
    }
}
