//! The tamper-evident audit log (`SNOWLUMA_MCP_AUDIT_LOG`).
//!
//! JSON lines, written only by the supervisor. Every record carries `seq`
//! (0, 1, 2, ...) and `prev`, the SHA-256 of the previous line's exact
//! bytes. Records of version 2 end with `mac`, an HMAC-SHA256 under the
//! audit key over the record's exact bytes without that member, so a record
//! cannot be edited, forged or re-chained without the key. Version-1 records
//! (older releases, no `mac`) are accepted only before the first version-2
//! record.
//!
//! The head file `<log>.head` anchors the end of the chain: after every
//! append, the last record's seq and hash with an HMAC over them. It has two
//! fixed-size slots on separate pages, each written with one `pwrite` and
//! `fdatasync`ed, slot 0 then slot 1, both with the same anchor: a torn head
//! write leaves the other slot readable (the reader takes the valid slot
//! with the highest seq), and a head at rest holds no older anchor that
//! blanking a slot could bring back. A log that ends before its anchor, or
//! whose anchored record changed, has lost records: startup and every
//! append refuse it. Records after the anchor are accepted when their MACs
//! are valid (the head lags when its update failed after the record was
//! durable). The head is created only by [`AuditLog::open`] (before
//! confinement) for an empty log, or by `snowluma-mcp audit reanchor`.
//!
//! Each append takes an exclusive lock on the log (several supervisors, one
//! per socket connection, may share it), checks the log's end against the
//! head, drops a torn last line (a write interrupted by a crash; recorded as
//! a `recovered` record), writes one line and `fdatasync`s, then updates the
//! head. A write that fails (a full disk) is undone with `ftruncate`, so it
//! leaves no torn line; the caller then refuses the action. Execution
//! records an `intent` before any request leaves and a `result` after.
//! Params are stored only as an HMAC-SHA256 under the same key.
//!
//! The key is `<log>.key` (created 0600 on first use) unless
//! `SNOWLUMA_MCP_AUDIT_KEY` names a file (never created). Undetectable:
//! whoever can rewrite the log and the head and read the key can rewrite
//! history; deleting the log and its head together looks like a fresh log,
//! and putting back earlier copies of both cuts what was written since
//! (only a later copy of the head kept elsewhere shows these two).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::trace::hex;

pub const GENESIS_PREV: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// The record version this server writes.
const RECORD_VERSION: u64 = 2;
const MAC_TAG: &str = "hmac-sha256:";
/// How a version-2 line ends: this, 64 hex digits, then `"}`.
const MAC_MEMBER: &[u8] = b",\"mac\":\"hmac-sha256:";
const MAC_SUFFIX_LEN: usize = MAC_MEMBER.len() + 64 + 2;
/// The head file: two slots of this size, the second on its own page (and
/// so its own disk sectors), at [`HEAD_SLOT_1`].
const HEAD_SLOT: usize = 256;
const HEAD_SLOT_1: usize = 4096;
const HEAD_LEN: usize = HEAD_SLOT_1 + HEAD_SLOT;
/// Longer lines are not records (ours stay far below).
const MAX_LINE: u64 = 1024 * 1024;
/// Reads from the end of the log go back this much at a time.
const CHUNK: u64 = 8192;
/// Sub-keys: records and head anchors are MAC'd under keys derived from the
/// audit key with these labels, never under the key that digests params
/// (whose input is canonical JSON, which no label is).
const RECORD_KEY_LABEL: &[u8] = b"snowluma-mcp audit record mac v2";
const HEAD_KEY_LABEL: &[u8] = b"snowluma-mcp audit head v1";

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("the audit key file {} is invalid (expected 64 hex characters)", path.display())]
    BadKey { path: PathBuf },
    #[error(
        "the audit key file {} cannot be read ({source}); the server never creates this key: make it with `snowluma-mcp audit keygen {}`",
        path.display(),
        path.display()
    )]
    KeyUnreadable { path: PathBuf, source: std::io::Error },
    #[error("audit log is locked or busy: {0}")]
    Lock(String),
    #[error(
        "the audit log has records but its head file (<log>.head) is missing: records at the end may have been removed together with it, or the log was written by a release without head files. Check the log with `snowluma-mcp audit verify LOG`; if it is as expected, anchor it again with `snowluma-mcp audit reanchor LOG`"
    )]
    HeadMissing,
    #[error(
        "the audit log's head file (<log>.head) holds no valid anchor (damaged, emptied, or made with another key), so records removed from the end cannot be ruled out. Check the log with `snowluma-mcp audit verify LOG`; if it is as expected, anchor it again with `snowluma-mcp audit reanchor LOG`"
    )]
    HeadUnanchored,
    #[error(
        "records were removed from the end of the audit log: its head file anchors record {head_seq}, but the log {}. See `snowluma-mcp audit verify LOG`",
        match last { Some(l) => format!("ends at record {l}"), None => "has no records".to_owned() }
    )]
    Removed { head_seq: u64, last: Option<u64> },
    #[error(
        "record {seq} of the audit log does not match the hash its head file anchors: the record was changed. See `snowluma-mcp audit verify LOG`"
    )]
    Changed { seq: u64 },
    #[error("the end of the audit log is damaged: {0}. See `snowluma-mcp audit verify LOG`")]
    Damaged(String),
    #[error("{} already exists; a key is never overwritten (records written with it could no longer be verified)", path.display())]
    KeyExists { path: PathBuf },
}

impl AuditError {
    /// The log or its head shows records removed, changed or forged.
    pub fn is_integrity(&self) -> bool {
        matches!(
            self,
            AuditError::HeadMissing
                | AuditError::HeadUnanchored
                | AuditError::Removed { .. }
                | AuditError::Changed { .. }
                | AuditError::Damaged(_)
        )
    }

    /// The key could not be used.
    pub fn is_key(&self) -> bool {
        matches!(self, AuditError::BadKey { .. } | AuditError::KeyUnreadable { .. })
    }
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// Who the session serves, named on every record: the local peer of a
/// socket-activated connection (`SO_PEERCRED`), or the principal of a
/// `serve-http` session (the access token's id and the client's address,
/// given by the launcher).
#[derive(Debug, Clone)]
pub enum Principal {
    Local(Peer),
    Http { token_id: String, peer: String },
}

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
    fn from_raw(raw: [u8; 32]) -> Key {
        Key { raw, record: hmac_bytes(&raw, &[RECORD_KEY_LABEL]), head: hmac_bytes(&raw, &[HEAD_KEY_LABEL]) }
    }

    fn record_mac(&self, body: &[u8]) -> String {
        hex(&hmac_bytes(&self.record, &[body]))
    }

    fn record_mac_ok(&self, body: &[u8], tag: &[u8; 32]) -> bool {
        hmac(&self.record, &[body]).verify_slice(tag).is_ok()
    }

    fn head_parts(seq: u64, hash: &str) -> String {
        format!("{seq}\n{hash}")
    }

    fn head_mac(&self, seq: u64, hash: &str) -> String {
        hex(&hmac_bytes(&self.head, &[Key::head_parts(seq, hash).as_bytes()]))
    }

    fn head_mac_ok(&self, seq: u64, hash: &str, tag: &[u8; 32]) -> bool {
        hmac(&self.head, &[Key::head_parts(seq, hash).as_bytes()]).verify_slice(tag).is_ok()
    }
}

fn sibling(log: &Path, suffix: &str) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// `<log>.key`, the default key file.
pub fn key_path(log: &Path) -> PathBuf {
    sibling(log, ".key")
}

/// `<log>.head`, the head file.
pub fn head_path(log: &Path) -> PathBuf {
    sibling(log, ".head")
}

fn sha256_tag(line: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(line)))
}

fn unhex32(s: &[u8]) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

fn is_sha256_tag(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| unhex32(h.as_bytes()).is_some())
}

/// RFC 3339 UTC timestamp with microseconds, without a date library.
pub fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}Z", snowluma_proto::text::utc_datetime(d.as_secs()), d.subsec_micros())
}

use snowluma_proto::text::canonical_json as canonical;

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

fn load_or_create_key(path: &Path) -> Result<Key, AuditError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key(path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            keygen(path)?;
            read_key(path)
        }
        Err(e) => Err(e.into()),
    }
}

/// fsync the directory holding `path`, so that a file just created there
/// survives a crash.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

// ---------------------------------------------------------------------------
// Records

/// One line of the log, parsed.
struct Parsed {
    seq: u64,
    prev: String,
    /// Version 2: the bytes the MAC covers and the MAC. `None`: version 1.
    sealed: Option<(Vec<u8>, [u8; 32])>,
}

/// A version-2 line's MAC and the bytes it covers (the line without its
/// final `,"mac":"..."` member, closed with `}`).
fn split_mac(line: &[u8]) -> Option<(Vec<u8>, [u8; 32])> {
    if line.len() < MAC_SUFFIX_LEN + 2 {
        return None;
    }
    let (body, tail) = line.split_at(line.len() - MAC_SUFFIX_LEN);
    if !tail.starts_with(MAC_MEMBER) || !tail.ends_with(b"\"}") {
        return None;
    }
    let tag = unhex32(&tail[MAC_MEMBER.len()..MAC_MEMBER.len() + 64])?;
    let mut covered = body.to_vec();
    covered.push(b'}');
    Some((covered, tag))
}

fn parse_line(line: &[u8]) -> Result<Parsed, &'static str> {
    let fields = |v: &Value| -> Result<(u64, String), &'static str> {
        let seq = v.get("seq").and_then(Value::as_u64).ok_or("a record without seq")?;
        let prev = v.get("prev").and_then(Value::as_str).ok_or("a record without prev")?;
        Ok((seq, prev.to_owned()))
    };
    if let Some((covered, tag)) = split_mac(line) {
        let v: Value = serde_json::from_slice(&covered).map_err(|_| "not a JSON record")?;
        let obj = v.as_object().ok_or("not a JSON record")?;
        if obj.get("v").and_then(Value::as_u64) != Some(RECORD_VERSION) {
            return Err("a mac member on a record that is not version 2");
        }
        if obj.contains_key("mac") {
            return Err("more than one mac member");
        }
        let (seq, prev) = fields(&v)?;
        return Ok(Parsed { seq, prev, sealed: Some((covered, tag)) });
    }
    let v: Value = serde_json::from_slice(line).map_err(|_| "not a JSON record")?;
    let obj = v.as_object().ok_or("not a JSON record")?;
    match obj.get("v").and_then(Value::as_u64) {
        Some(1) if !obj.contains_key("mac") => {
            let (seq, prev) = fields(&v)?;
            Ok(Parsed { seq, prev, sealed: None })
        }
        Some(1) => Err("a version-1 record with a mac member"),
        Some(RECORD_VERSION) => Err("a version-2 record that does not end with a well-formed mac member"),
        _ => Err("not a record of a known version"),
    }
}

/// The line of a version-2 record: `body` (a JSON object) with its MAC
/// appended as the last member. Without the newline.
fn seal(key: &Key, body: Vec<u8>) -> Result<Vec<u8>, AuditError> {
    let mac = key.record_mac(&body);
    let mut line = body;
    if line.pop() != Some(b'}') {
        return Err(std::io::Error::other("a record did not serialize to a JSON object").into());
    }
    line.extend_from_slice(MAC_MEMBER);
    line.extend_from_slice(mac.as_bytes());
    line.extend_from_slice(b"\"}");
    Ok(line)
}

// ---------------------------------------------------------------------------
// The head file

/// The end of the chain as the head file records it: the last record's seq
/// and the SHA-256 of its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub seq: u64,
    pub hash: String,
}

impl Anchor {
    fn of(seq: u64, line: &[u8]) -> Anchor {
        Anchor { seq, hash: sha256_tag(line) }
    }
}

#[derive(Debug, PartialEq)]
enum HeadState {
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

enum Slot {
    Blank,
    Valid(Anchor),
    Invalid,
}

fn parse_slot(slot: &[u8], key: Option<&Key>) -> Slot {
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
fn head_slots(bytes: &[u8]) -> [&[u8]; 2] {
    let at = |from: usize| bytes.get(from..bytes.len().min(from + HEAD_SLOT)).unwrap_or_default();
    [at(0), at(HEAD_SLOT_1)]
}

/// The head file's anchor: the valid slot with the highest seq (MACs
/// checked when `key` is given, otherwise only the shape).
fn read_head(bytes: &[u8], key: Option<&Key>) -> HeadState {
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

fn read_head_file(f: &File) -> std::io::Result<Vec<u8>> {
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
fn write_head(head: &File, key: &Key, a: &Anchor) -> std::io::Result<()> {
    let slot = anchor_slot(key, a);
    for offset in [0, HEAD_SLOT_1] {
        head.write_all_at(&slot, offset as u64)?;
        head.sync_data()?;
    }
    Ok(())
}

/// A whole head file: `anchor` in both slots, or blank ones.
fn whole_head(key: &Key, anchor: Option<&Anchor>) -> Vec<u8> {
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

// ---------------------------------------------------------------------------
// Reading the log from its end

/// Offset of the last `\n` before `len`.
fn last_newline(f: &File, len: u64) -> std::io::Result<Option<u64>> {
    last_newline_above(f, len, 0)
}

/// Offset of the last `\n` in `floor..end`.
fn last_newline_above(f: &File, end: u64, floor: u64) -> std::io::Result<Option<u64>> {
    let mut end = end;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > floor {
        let start = end.saturating_sub(CHUNK).max(floor);
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

/// The line whose newline is at offset `nl`: its start offset and bytes.
fn line_ending_at(f: &File, nl: u64) -> Result<(u64, Vec<u8>), AuditError> {
    let floor = nl.saturating_sub(MAX_LINE + 1);
    let start = match last_newline_above(f, nl, floor)? {
        Some(i) => i + 1,
        None if floor == 0 => 0,
        None => {
            return Err(AuditError::Damaged(format!("a line longer than {MAX_LINE} bytes ends at byte {nl}")));
        }
    };
    let mut line = vec![0u8; (nl - start) as usize];
    f.read_exact_at(&mut line, start)?;
    Ok((start, line))
}

/// The log's end, checked against its head.
struct Tail {
    /// Bytes up to and including the last newline.
    complete_len: u64,
    /// Bytes after it: a torn write.
    torn: u64,
    /// The last complete record.
    last: Option<Anchor>,
}

/// Check the end of the log against the head: the anchored record is still
/// there, unchanged, and every record after it carries a valid MAC and
/// chains. Refuses a log whose end was cut or rewritten.
fn check_tail(log: &File, head: &File, key: &Key) -> Result<Tail, AuditError> {
    let len = log.metadata()?.len();
    let complete_len = last_newline(log, len)?.map_or(0, |i| i + 1);
    let torn = len - complete_len;
    let anchor = match read_head(&read_head_file(head)?, Some(key)) {
        HeadState::Blank if complete_len == 0 => return Ok(Tail { complete_len, torn, last: None }),
        HeadState::Anchored(a) if complete_len == 0 => {
            return Err(AuditError::Removed { head_seq: a.seq, last: None });
        }
        HeadState::Anchored(a) => a,
        HeadState::Blank | HeadState::Invalid => return Err(AuditError::HeadUnanchored),
    };
    let mut nl = complete_len - 1;
    let mut newer: Option<Parsed> = None;
    let mut last: Option<Anchor> = None;
    loop {
        let (start, line) = line_ending_at(log, nl)?;
        let hash = sha256_tag(&line);
        let rec = parse_line(&line).map_err(|why| {
            AuditError::Damaged(match &newer {
                Some(n) => format!("the line before record {} is {why}", n.seq),
                None => format!("the last line is {why}"),
            })
        })?;
        if let Some(n) = &newer
            && (n.prev != hash || rec.seq.checked_add(1) != Some(n.seq))
        {
            return Err(AuditError::Damaged(format!("record {} does not chain onto the line before it", n.seq)));
        }
        if last.is_none() {
            last = Some(Anchor { seq: rec.seq, hash: hash.clone() });
        }
        if rec.seq == anchor.seq {
            if hash != anchor.hash {
                return Err(AuditError::Changed { seq: rec.seq });
            }
            return Ok(Tail { complete_len, torn, last });
        }
        if rec.seq < anchor.seq {
            return Err(AuditError::Removed { head_seq: anchor.seq, last: last.map(|a| a.seq) });
        }
        // After the anchor (the head lags): only authenticated records.
        match &rec.sealed {
            Some((covered, tag)) if key.record_mac_ok(covered, tag) => {}
            Some(_) => {
                return Err(AuditError::Damaged(format!(
                    "record {}, after the head's anchor, has an invalid MAC: it was forged or edited",
                    rec.seq
                )));
            }
            None => {
                return Err(AuditError::Damaged(format!(
                    "record {}, after the head's anchor, has no MAC: it was not written by this server",
                    rec.seq
                )));
            }
        }
        if start == 0 {
            return Err(AuditError::Damaged(format!(
                "the log does not contain record {}, which its head file anchors",
                anchor.seq
            )));
        }
        nl = start - 1;
        newer = Some(rec);
    }
}

/// SHA-256 of the bytes of `f` from `from` to its end.
fn sha256_from(f: &File, from: u64, len: u64) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = from;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        f.read_exact_at(&mut buf[..n], at)?;
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

// ---------------------------------------------------------------------------
// The writer

#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Files {
    log: File,
    head: File,
}

struct Inner {
    files: Mutex<Files>,
    key: Key,
    peer: Option<Principal>,
}

/// Open the head file, creating it (blank, 0600) only for a log without a
/// complete record. Called with the log locked.
fn open_head(log: &File, log_path: &Path, key: &Key) -> Result<File, AuditError> {
    let path = head_path(log_path);
    match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(f) => return Ok(f),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        Err(_) => {}
    }
    if last_newline(log, log.metadata()?.len())?.is_some() {
        return Err(AuditError::HeadMissing);
    }
    let f = match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Ok(OpenOptions::new().read(true).write(true).open(&path)?);
        }
        Err(e) => return Err(e.into()),
    };
    // Written whole now, so that updating a slot never grows the file.
    f.write_all_at(&whole_head(key, None), 0)?;
    f.sync_all()?;
    sync_parent(&path)?;
    Ok(f)
}

impl AuditLog {
    /// Open (creating 0600 if needed) with its head, check the log against
    /// the head (recovering a torn last line) and write an `open` record, so
    /// a log that cannot be written, or lost records, stops startup instead
    /// of the first write.
    pub fn open(path: &Path, key: &KeySource, peer: Option<Principal>, mode: &str) -> Result<AuditLog, AuditError> {
        let key = match key {
            KeySource::BesideLog => load_or_create_key(&key_path(path))?,
            KeySource::File(p) => read_key(p)?,
        };
        let log = OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)?;
        log.lock().map_err(|e| AuditError::Lock(e.to_string()))?;
        let head = open_head(&log, path, &key);
        let _ = log.unlock();
        let head = head?;
        let audit = AuditLog { inner: Arc::new(Inner { files: Mutex::new(Files { log, head }), key, peer }) };
        let mut rec = Map::new();
        rec.insert("phase".into(), json!("open"));
        rec.insert("server".into(), json!({"name": "snowluma-mcp", "version": env!("CARGO_PKG_VERSION")}));
        rec.insert("pid".into(), json!(std::process::id()));
        rec.insert("mode".into(), json!(mode));
        audit.append_blocking(rec)?;
        Ok(audit)
    }

    pub fn params_digest(&self, params: &Value) -> String {
        format!("{MAC_TAG}{}", hex(&hmac_bytes(&self.inner.key.raw, &[canonical(params).as_bytes()])))
    }

    /// Append one record (blocking: lock, check the end against the head,
    /// write, fdatasync, update the head).
    pub fn append_blocking(&self, rec: Map<String, Value>) -> Result<(), AuditError> {
        let guard = self.inner.files.lock().map_err(|_| AuditError::Lock("poisoned".into()))?;
        let files: &Files = &guard;
        files.log.lock().map_err(|e| AuditError::Lock(e.to_string()))?;
        let result = self.append_locked(files, rec);
        let _ = files.log.unlock();
        result
    }

    fn append_locked(&self, files: &Files, rec: Map<String, Value>) -> Result<(), AuditError> {
        let tail = check_tail(&files.log, &files.head, &self.inner.key)?;
        let mut last = tail.last;
        if tail.torn > 0 {
            // A write interrupted by a crash (our own failed writes are undone).
            let len = tail.complete_len + tail.torn;
            let dropped = sha256_from(&files.log, tail.complete_len, len)?;
            files.log.set_len(tail.complete_len)?;
            files.log.sync_data()?;
            tracing::warn!(
                dropped_bytes = tail.torn,
                "the audit log ended with an incomplete line (an interrupted write); it was dropped and a `recovered` record written"
            );
            let mut r = Map::new();
            r.insert("phase".into(), json!("recovered"));
            r.insert("reason".into(), json!("the log ended with an incomplete line, which was dropped"));
            r.insert("dropped_bytes".into(), json!(tail.torn));
            r.insert("dropped_sha256".into(), json!(dropped));
            last = Some(self.write_record(files, last.as_ref(), r)?);
        }
        self.write_record(files, last.as_ref(), rec)?;
        Ok(())
    }

    /// Write one record after `last`; on failure the log is cut back to its
    /// length before the write, so no torn line stays behind.
    fn write_record(
        &self,
        files: &Files,
        last: Option<&Anchor>,
        mut rec: Map<String, Value>,
    ) -> Result<Anchor, AuditError> {
        let (seq, prev) = match last {
            None => (0u64, GENESIS_PREV.to_owned()),
            Some(a) => {
                (a.seq.checked_add(1).ok_or_else(|| AuditError::Damaged("seq overflow".into()))?, a.hash.clone())
            }
        };
        let mut m = Map::new();
        m.insert("v".into(), json!(RECORD_VERSION));
        m.insert("seq".into(), json!(seq));
        m.insert("ts".into(), json!(now_rfc3339()));
        m.insert("prev".into(), json!(prev));
        match &self.inner.peer {
            Some(Principal::Local(p)) => {
                m.insert("peer".into(), json!(p));
            }
            Some(Principal::Http { token_id, peer }) => {
                m.insert("principal".into(), json!({"via": "http", "token_id": token_id, "peer": peer}));
            }
            None => {}
        }
        m.append(&mut rec);
        let body = serde_json::to_vec(&Value::Object(m)).map_err(std::io::Error::other)?;
        let mut line = seal(&self.inner.key, body)?;
        let anchor = Anchor::of(seq, &line);
        line.push(b'\n');
        let before = files.log.metadata()?.len();
        let written = (&files.log).write_all(&line).and_then(|()| files.log.sync_data());
        if let Err(e) = written {
            match files.log.set_len(before).and_then(|()| files.log.sync_data()) {
                Ok(()) => {}
                Err(undo) => tracing::error!(
                    error = %undo,
                    "a failed audit write could not be undone; the incomplete line is dropped (and recorded) at the next append"
                ),
            }
            return Err(e.into());
        }
        if let Err(e) = write_head(&files.head, &self.inner.key, &anchor) {
            tracing::warn!(
                error = %e,
                seq,
                "the audit head file could not be updated; it lags behind the log (records after it are accepted on their MACs)"
            );
        }
        Ok(anchor)
    }

    /// Append from async code without blocking the runtime thread.
    pub async fn append(&self, rec: Map<String, Value>) -> Result<(), AuditError> {
        let log = self.clone();
        match tokio::task::spawn_blocking(move || log.append_blocking(rec)).await {
            Ok(r) => r,
            Err(e) => Err(AuditError::Lock(e.to_string())),
        }
    }
}

// ---------------------------------------------------------------------------
// Verification and re-anchoring (the `audit` subcommands)

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VerifyError {
    /// A record is damaged: the first bad line (1-based).
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    /// The log as a whole (its head, its length).
    #[error("{0}")]
    Log(String),
}

impl VerifyError {
    fn line(line: usize, reason: impl Into<String>) -> VerifyError {
        VerifyError::Line { line, reason: reason.into() }
    }
}

#[derive(Debug, PartialEq)]
pub enum MacCheck {
    Checked,
    /// Why not (the key could not be read).
    NotChecked(String),
}

#[derive(Debug, PartialEq)]
pub enum HeadCheck {
    /// An empty log and no anchor yet.
    Fresh,
    /// The head anchors the last record.
    Matches,
    /// The head anchors an earlier record; `after` records followed it
    /// (their MACs were checked when the key was available).
    Lags { anchored: u64, after: u64 },
}

/// What `verify` found in an intact log.
#[derive(Debug, PartialEq)]
pub struct Report {
    pub records: usize,
    /// Version-1 records (without MAC), all before the first version-2 one.
    pub legacy: usize,
    pub macs: MacCheck,
    pub head: HeadCheck,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.head == HeadCheck::Fresh {
            return write!(f, "{} records (an empty log, no head anchor yet)", self.records);
        }
        write!(f, "{} records, chain intact", self.records)?;
        if self.macs == MacCheck::Checked {
            f.write_str(", MACs valid")?;
        }
        if self.legacy > 0 {
            write!(f, " ({} earlier records predate MACs)", self.legacy)?;
        }
        match &self.head {
            HeadCheck::Matches => f.write_str(", head matches")?,
            HeadCheck::Lags { anchored, after } => write!(
                f,
                ", head matches record {anchored} ({after} later records written after the last head update)"
            )?,
            HeadCheck::Fresh => {}
        }
        if let MacCheck::NotChecked(why) = &self.macs {
            write!(
                f,
                "; MACs NOT checked ({why}): without the key, an edited, forged or re-chained record cannot be detected"
            )?;
        }
        Ok(())
    }
}

struct Chain {
    legacy: usize,
    /// Index of the first version-2 record.
    first_sealed: Option<usize>,
}

/// Check seq, prev and (with a key) the MAC of every line.
fn check_chain(lines: &[&[u8]], key: Option<&Key>) -> Result<Chain, VerifyError> {
    let mut prev = GENESIS_PREV.to_owned();
    let mut chain = Chain { legacy: 0, first_sealed: None };
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let rec = parse_line(line).map_err(|why| VerifyError::line(n, why))?;
        match &rec.sealed {
            None if chain.first_sealed.is_some() => {
                return Err(VerifyError::line(
                    n,
                    "a record without a MAC after records with MACs: it was not written by this server",
                ));
            }
            None => chain.legacy += 1,
            Some((covered, tag)) => {
                chain.first_sealed.get_or_insert(i);
                if let Some(k) = key
                    && !k.record_mac_ok(covered, tag)
                {
                    return Err(VerifyError::line(
                        n,
                        "its MAC does not match: the record was edited or forged (or the key is not this log's)",
                    ));
                }
            }
        }
        if rec.prev != prev {
            return Err(VerifyError::line(
                n,
                if i == 0 {
                    "does not start the chain (earlier lines were removed)"
                } else {
                    "prev does not match the previous line (a line was edited, removed or moved)"
                },
            ));
        }
        if rec.seq != i as u64 {
            return Err(VerifyError::line(n, "seq out of order"));
        }
        prev = sha256_tag(line);
    }
    Ok(chain)
}

/// Complete lines (without their newlines) and the length of a torn tail.
fn split_lines(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let lines = if complete == 0 { Vec::new() } else { bytes[..complete - 1].split(|b| *b == b'\n').collect() };
    (lines, bytes.len() - complete)
}

/// Check the whole log: chain, seq, MACs (when `key` is readable) and the
/// head file. `key` is the key, or why it could not be read.
pub fn verify(path: &Path, key: Result<Key, String>) -> Result<Report, VerifyError> {
    let cannot = |e: std::io::Error| VerifyError::Log(format!("cannot read {}: {e}", path.display()));
    let log = File::open(path).map_err(cannot)?;
    // A shared lock: no server appends (and moves the head) while the log
    // and then its head are read.
    log.lock_shared().map_err(cannot)?;
    let result = verify_locked(path, &log, key);
    let _ = log.unlock();
    result
}

fn verify_locked(path: &Path, log: &File, key: Result<Key, String>) -> Result<Report, VerifyError> {
    let mut bytes = Vec::new();
    let mut reader = log;
    reader.read_to_end(&mut bytes).map_err(|e| VerifyError::Log(format!("cannot read {}: {e}", path.display())))?;
    let (lines, torn) = split_lines(&bytes);
    let chain = check_chain(&lines, key.as_ref().ok())?;
    if torn > 0 {
        return Err(VerifyError::line(
            lines.len() + 1,
            "incomplete last line (the log was truncated, or a write was interrupted; the server drops it at its next append and writes a `recovered` record)",
        ));
    }
    let macs = match &key {
        Ok(_) => MacCheck::Checked,
        Err(why) => MacCheck::NotChecked(why.clone()),
    };
    let n = lines.len();
    let hp = head_path(path);
    let reanchor =
        format!("if the log is as expected, anchor it again with `snowluma-mcp audit reanchor {}`", path.display());
    let state = match std::fs::read(&hp) {
        Ok(b) => Some(read_head(&b, key.as_ref().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(VerifyError::Log(format!("cannot read the head file {}: {e}", hp.display()))),
    };
    let report = |head| Report { records: n, legacy: chain.legacy, macs, head };
    let anchor = match state {
        None | Some(HeadState::Blank) if n == 0 => return Ok(report(HeadCheck::Fresh)),
        None => {
            return Err(VerifyError::Log(format!(
                "{n} records and the chain is intact, but the head file {} is missing: records at the end may have been removed together with it (or the log predates head files); {reanchor}",
                hp.display()
            )));
        }
        Some(HeadState::Blank | HeadState::Invalid) => {
            return Err(VerifyError::Log(format!(
                "{n} records and the chain is intact, but the head file {} holds no valid anchor (damaged, emptied, or made with another key), so removed records cannot be ruled out; {reanchor}",
                hp.display()
            )));
        }
        Some(HeadState::Anchored(a)) => a,
    };
    if n == 0 {
        return Err(VerifyError::Log(format!(
            "the log is empty, but its head file anchors record {}: every record was removed (the log was truncated)",
            anchor.seq
        )));
    }
    let last = (n - 1) as u64;
    if anchor.seq > last {
        return Err(VerifyError::Log(format!(
            "the log ends at record {last}, but its head file anchors record {}: {} records were removed from the end",
            anchor.seq,
            anchor.seq - last
        )));
    }
    let at = anchor.seq as usize;
    if sha256_tag(lines[at]) != anchor.hash {
        return Err(VerifyError::line(
            at + 1,
            "does not match the hash its head file anchors: the record was changed (or the log rewritten)",
        ));
    }
    if let Some(i) = (at + 1..n).find(|i| chain.first_sealed.is_none_or(|f| *i < f)) {
        return Err(VerifyError::line(
            i + 1,
            "a record without a MAC after the head's anchor: it was not written by this server",
        ));
    }
    Ok(report(if anchor.seq == last {
        HeadCheck::Matches
    } else {
        HeadCheck::Lags { anchored: anchor.seq, after: last - anchor.seq }
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum ReanchorError {
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("the log does not verify, so it was not anchored: {0}")]
    Broken(VerifyError),
    #[error(
        "the head file {} was written but could not be given to the log's owner (uid {uid}, gid {gid}): {source}; the server cannot update it until it is (chown it)",
        path.display()
    )]
    Owner { path: PathBuf, uid: u32, gid: u32, source: std::io::Error },
}

/// What `reanchor` did.
#[derive(Debug)]
pub struct Reanchored {
    pub records: usize,
    pub anchor: Option<Anchor>,
    /// A torn last line left in place (the server drops it at its next append).
    pub torn: usize,
    pub head: PathBuf,
}

/// Verify the chain and MACs of the log's complete lines and write a fresh
/// head anchoring its last record (or a blank head for an empty log). For
/// the operator, after checking the log: a missing or damaged head, a log
/// from a release without head files, or records knowingly removed.
pub fn reanchor(path: &Path, key: &Key) -> Result<Reanchored, ReanchorError> {
    let log = OpenOptions::new().read(true).open(path).map_err(AuditError::from)?;
    log.lock().map_err(|e| AuditError::Lock(e.to_string()))?;
    let result = (|| {
        let mut bytes = Vec::new();
        (&log).read_to_end(&mut bytes).map_err(AuditError::from)?;
        let (lines, torn) = split_lines(&bytes);
        check_chain(&lines, Some(key)).map_err(ReanchorError::Broken)?;
        let anchor = lines.last().map(|l| Anchor::of((lines.len() - 1) as u64, l));
        let hp = head_path(path);
        let (head, created) = match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&hp) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                (OpenOptions::new().read(true).write(true).open(&hp).map_err(AuditError::from)?, false)
            }
            Err(e) => return Err(AuditError::from(e).into()),
        };
        // In place, so that running servers (which keep the file open) use it.
        head.write_all_at(&whole_head(key, anchor.as_ref()), 0).map_err(AuditError::from)?;
        head.set_len(HEAD_LEN as u64).map_err(AuditError::from)?;
        head.sync_all().map_err(AuditError::from)?;
        if created {
            sync_parent(&hp).map_err(AuditError::from)?;
            // Run as root for a service's log, the new head must still be
            // the service's to write.
            use std::os::unix::fs::MetadataExt;
            let (log_meta, head_meta) =
                (log.metadata().map_err(AuditError::from)?, head.metadata().map_err(AuditError::from)?);
            let (uid, gid) = (log_meta.uid(), log_meta.gid());
            if (head_meta.uid(), head_meta.gid()) != (uid, gid) {
                std::os::unix::fs::fchown(&head, Some(uid), Some(gid)).map_err(|source| ReanchorError::Owner {
                    path: hp.clone(),
                    uid,
                    gid,
                    source,
                })?;
            }
        }
        Ok(Reanchored { records: lines.len(), anchor, torn, head: hp })
    })();
    let _ = log.unlock();
    result
}

/// Which action an execution record is about (the fields every `refused`,
/// `intent` and `result` record shares).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionRef {
    pub op_id: String,
    pub tool: String,
    /// The name as the client gave it (an alias or `_async` form included).
    pub action: String,
    pub canonical: String,
    pub read_only: bool,
    pub mode: &'static str,
    pub traceparent: String,
}

/// The records of one execution, typed: what the audit log says about an
/// action, field by field (serialized in this order after the chain's own
/// fields; `phase` names the variant).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum ActionRecord {
    /// Refused by the operator's policy; nothing was sent.
    Refused {
        #[serde(flatten)]
        action: ActionRef,
        reason: &'static str,
    },
    /// Written (and fsynced) before the request leaves; params only as a digest.
    Intent {
        #[serde(flatten)]
        action: ActionRef,
        params_digest: String,
    },
    /// After the reply (or failure).
    Result {
        #[serde(flatten)]
        action: ActionRef,
        outcome: &'static str,
        kind: Option<&'static str>,
        is_error: bool,
        retcode: Value,
        duration_ms: f64,
    },
}

impl ActionRecord {
    fn into_map(self) -> Result<Map<String, Value>, AuditError> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(AuditError::Io(std::io::Error::other("an audit record is not an object"))),
            Err(e) => Err(AuditError::Io(std::io::Error::other(e))),
        }
    }
}

impl AuditLog {
    /// Append an execution record (see [`AuditLog::append`]).
    pub async fn record(&self, rec: ActionRecord) -> Result<(), AuditError> {
        self.append(rec.into_map()?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("snowluma-audit-unit-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn intent(n: i64) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("phase".into(), json!("intent"));
        m.insert("n".into(), json!(n));
        m
    }

    fn key_of(path: &Path) -> Result<Key, String> {
        read_key(&key_path(path)).map_err(|e| e.to_string())
    }

    /// A log with `extra` intents after its open record, the log closed.
    fn written(dir: &Dir, extra: i64) -> PathBuf {
        let path = dir.0.join("audit.log");
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        for i in 0..extra {
            log.append_blocking(intent(i)).unwrap();
        }
        path
    }

    fn lines_of(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
    }

    fn write_lines(path: &Path, ls: &[String], tail: &str) {
        let text = if ls.is_empty() { String::new() } else { format!("{}{tail}", ls.join("\n")) };
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn timestamps_and_canonical_json() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 27, "{t}");
        assert!(t.ends_with('Z') && t.starts_with("20"));
        assert_eq!(
            canonical(&json!({"b": 1, "a": [true, {"d": null, "c": "x"}]})),
            r#"{"a":[true,{"c":"x","d":null}],"b":1}"#
        );
    }

    #[test]
    fn records_are_sealed_and_the_head_follows() {
        let dir = Dir::new("seal");
        let path = written(&dir, 4);
        let ok = verify(&path, key_of(&path)).unwrap();
        assert_eq!(ok.to_string(), "5 records, chain intact, MACs valid, head matches");
        assert_eq!((ok.records, ok.head, ok.macs), (5, HeadCheck::Matches, MacCheck::Checked));
        let lines = lines_of(&path);
        for (i, l) in lines.iter().enumerate() {
            let v: Value = serde_json::from_str(l).unwrap();
            assert_eq!((v["v"].as_u64(), v["seq"].as_u64()), (Some(2), Some(i as u64)));
            assert!(l.ends_with("\"}") && v["mac"].as_str().unwrap().starts_with("hmac-sha256:"), "{l}");
        }
        let head = std::fs::read(head_path(&path)).unwrap();
        assert_eq!(head.len(), HEAD_LEN);
        let key = read_key(&key_path(&path)).unwrap();
        assert_eq!(read_head(&head, Some(&key)), HeadState::Anchored(Anchor::of(4, lines[4].as_bytes())));
        // Both slots hold the last anchor, and nothing older.
        for (i, slot) in head_slots(&head).into_iter().enumerate() {
            match parse_slot(slot, Some(&key)) {
                Slot::Valid(a) => assert_eq!(a.seq, 4),
                _ => panic!("slot {i}"),
            }
        }
        assert_eq!(head[HEAD_SLOT_1 - 1], b'\n');
        // Another key checks neither records nor the head.
        let other = Key::from_raw([7; 32]);
        assert_eq!(read_head(&head, Some(&other)), HeadState::Invalid);
        assert!(matches!(verify(&path, Ok(other)), Err(VerifyError::Line { line: 1, .. })));
        // Params digests are not record MACs.
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        let d1 = log.params_digest(&json!({"a": 1, "b": 2}));
        assert_eq!(d1, log.params_digest(&json!({"b": 2, "a": 1})));
        assert!(d1.starts_with("hmac-sha256:") && d1.len() == 76);
    }

    #[test]
    fn chain_tamper_detection() {
        let dir = Dir::new("tamper");
        let path = written(&dir, 4);
        let lines = lines_of(&path);
        let key = || key_of(&path);
        // edit: its own MAC
        let mut edited = lines.clone();
        edited[2] = edited[2].replace("\"n\":1", "\"n\":9");
        write_lines(&path, &edited, "\n");
        assert_eq!(
            verify(&path, key()).unwrap_err(),
            VerifyError::line(
                3,
                "its MAC does not match: the record was edited or forged (or the key is not this log's)"
            )
        );
        // edit without the key: the chain breaks at the next line
        let err = verify(&path, Err("no key".into())).unwrap_err();
        assert!(matches!(err, VerifyError::Line { line: 4, .. }), "{err}");
        // delete
        write_lines(&path, &[lines[0].clone(), lines[1].clone(), lines[3].clone(), lines[4].clone()], "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 3, .. }));
        // reorder
        write_lines(
            &path,
            &[lines[0].clone(), lines[2].clone(), lines[1].clone(), lines[3].clone(), lines[4].clone()],
            "\n",
        );
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 2, .. }));
        // torn
        write_lines(&path, &[lines[0].clone(), lines[1].clone(), lines[2][..10].to_owned()], "");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 3, .. }));
        // restored
        write_lines(&path, &lines, "\n");
        assert!(verify(&path, key()).is_ok());
    }

    #[test]
    fn removed_records_are_caught_by_verify_and_at_open() {
        let dir = Dir::new("removed");
        let path = written(&dir, 4);
        let lines = lines_of(&path);
        let key = || key_of(&path);
        for keep in [4usize, 3, 0] {
            write_lines(&path, &lines[..keep], "\n");
            let err = verify(&path, key()).unwrap_err().to_string();
            assert!(err.contains("removed"), "{keep}: {err}");
            let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
            assert!(
                matches!(err, AuditError::Removed { head_seq: 4, last } if last == keep.checked_sub(1).map(|l| l as u64)),
                "{keep}: {err}"
            );
            assert!(err.is_integrity() && err.to_string().contains("snowluma-mcp audit verify"));
            // Nothing was appended to the shortened log.
            assert_eq!(lines_of(&path).len(), keep);
        }
        // The last record replaced by a forged one with the same seq and a valid chain.
        let mut forged = lines[..4].to_vec();
        let fake = format!(
            r#"{{"v":2,"seq":4,"ts":"x","prev":"{}","phase":"intent","mac":"hmac-sha256:{}"}}"#,
            sha256_tag(lines[3].as_bytes()),
            "0".repeat(64)
        );
        forged.push(fake.clone());
        write_lines(&path, &forged, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 5, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(err, AuditError::Changed { seq: 4 }), "{err}");
        // A forged record appended after the anchor.
        let appended = format!(
            r#"{{"v":2,"seq":5,"ts":"x","prev":"{}","phase":"intent","mac":"hmac-sha256:{}"}}"#,
            sha256_tag(lines[4].as_bytes()),
            "0".repeat(64)
        );
        let mut with = lines.clone();
        with.push(appended);
        write_lines(&path, &with, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 6, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(&err, AuditError::Damaged(w) if w.contains("record 5") && w.contains("invalid MAC")), "{err}");
        // Without MAC at all (a version-1 line after version-2 ones).
        let v1 = format!(r#"{{"v":1,"seq":5,"ts":"x","prev":"{}","phase":"intent"}}"#, sha256_tag(lines[4].as_bytes()));
        with.pop();
        with.push(v1);
        write_lines(&path, &with, "\n");
        assert!(matches!(verify(&path, key()).unwrap_err(), VerifyError::Line { line: 6, .. }));
        let err = AuditLog::open(&path, &KeySource::BesideLog, None, "write").err().unwrap();
        assert!(matches!(&err, AuditError::Damaged(w) if w.contains("no MAC")), "{err}");
        // Restored, it opens again.
        write_lines(&path, &lines, "\n");
        AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        assert!(verify(&path, key()).is_ok());
    }

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

    #[test]
    fn a_torn_tail_is_recovered_and_recorded() {
        let dir = Dir::new("torn");
        let path = written(&dir, 2);
        let before = lines_of(&path);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let partial = b"{\"v\":2,\"seq\":3,\"ts\"";
        f.write_all(partial).unwrap();
        drop(f);
        assert!(matches!(verify(&path, key_of(&path)).unwrap_err(), VerifyError::Line { line: 4, .. }));
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        log.append_blocking(intent(5)).unwrap();
        let after = lines_of(&path);
        assert_eq!(after[..3], before[..]);
        let rec: Value = serde_json::from_str(&after[3]).unwrap();
        assert_eq!(rec["phase"], "recovered");
        assert_eq!(rec["dropped_bytes"], partial.len());
        assert_eq!(rec["dropped_sha256"].as_str().unwrap(), sha256_tag(partial));
        let phases: Vec<String> = after[4..]
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["phase"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(phases, ["open", "intent"]);
        assert_eq!(verify(&path, key_of(&path)).unwrap().records, 6);
    }

    #[test]
    fn a_missing_head_refuses_until_reanchored_and_legacy_logs_upgrade() {
        let dir = Dir::new("reanchor");
        let path = written(&dir, 1);
        std::fs::remove_file(head_path(&path)).unwrap();
        assert!(verify(&path, key_of(&path)).unwrap_err().to_string().contains("is missing"));
        assert!(matches!(AuditLog::open(&path, &KeySource::BesideLog, None, "write"), Err(AuditError::HeadMissing)));
        assert!(!head_path(&path).exists(), "never created for a non-empty log");
        let key = read_key(&key_path(&path)).unwrap();
        let r = reanchor(&path, &key).unwrap();
        assert_eq!((r.records, r.anchor.as_ref().map(|a| a.seq)), (2, Some(1)));
        assert_eq!(verify(&path, Ok(key.clone())).unwrap().head, HeadCheck::Matches);
        AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();

        // A log of version-1 records (an older release): anchored, then extended.
        let legacy = dir.0.join("legacy.log");
        std::fs::copy(key_path(&path), key_path(&legacy)).unwrap();
        let mut text = String::new();
        let mut prev = GENESIS_PREV.to_owned();
        for seq in 0..2 {
            let line = format!(r#"{{"v":1,"seq":{seq},"ts":"x","prev":"{prev}","phase":"open"}}"#);
            prev = sha256_tag(line.as_bytes());
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::write(&legacy, &text).unwrap();
        assert!(matches!(AuditLog::open(&legacy, &KeySource::BesideLog, None, "write"), Err(AuditError::HeadMissing)));
        reanchor(&legacy, &key).unwrap();
        AuditLog::open(&legacy, &KeySource::BesideLog, None, "write").unwrap();
        let r = verify(&legacy, Ok(key.clone())).unwrap();
        assert_eq!(r.to_string(), "3 records, chain intact, MACs valid (2 earlier records predate MACs), head matches");
        assert_eq!((r.records, r.legacy, r.head), (3, 2, HeadCheck::Matches));

        // A broken log is not anchored.
        let mut lines = lines_of(&legacy);
        lines.remove(1);
        write_lines(&legacy, &lines, "\n");
        assert!(matches!(reanchor(&legacy, &key), Err(ReanchorError::Broken(_))));
    }

    #[test]
    fn reanchor_gives_a_new_head_to_the_logs_owner() {
        use std::os::unix::fs::MetadataExt;
        // Only root can give a file away (as `sudo snowluma-mcp audit
        // reanchor` does for the service's log).
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = Dir::new("owner");
        let path = written(&dir, 0);
        std::fs::remove_file(head_path(&path)).unwrap();
        std::os::unix::fs::chown(&path, Some(4321), Some(4322)).unwrap();
        reanchor(&path, &read_key(&key_path(&path)).unwrap()).unwrap();
        let m = std::fs::metadata(head_path(&path)).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (4321, 4322, 0o600));
    }

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
