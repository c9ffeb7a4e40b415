//! The tamper-evident audit log (`SNOWLUMA_MCP_AUDIT_LOG`).
//!
//! JSON lines, written only by the supervisor. Every record carries `seq`
//! and `prev`, the SHA-256 of the previous line's exact bytes, so editing,
//! deleting, reordering or truncating lines breaks the chain at the first
//! damaged place (`snowluma-mcp audit verify PATH`). A chain cannot detect
//! an edit of the very last line or a rewrite of the whole file: anchor the
//! head elsewhere (e.g. a sealed journal) where that matters.
//!
//! Each append takes an exclusive lock on the file (several supervisors,
//! one per socket connection, may share a log), reads the last line, writes
//! one line with a single `write`, and `fdatasync`s before returning.
//! Execution records an `intent` before any request leaves and a `result`
//! after; if the intent cannot be written, the action is refused. Params
//! are stored as an HMAC-SHA256 under a key kept beside the log
//! (`<log>.key`, 0600), never in clear.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub const GENESIS_PREV: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// The largest record we write; reading back this much finds the last line.
const MAX_RECORD: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("audit key file is invalid (expected 64 hex characters)")]
    BadKey,
    #[error("audit log ends with an incomplete or unreadable line; run `snowluma-mcp audit verify` and repair it")]
    BrokenTail,
    #[error("audit log is locked or busy: {0}")]
    Lock(String),
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    file: Mutex<File>,
    key: [u8; 32],
    peer: Option<Peer>,
}

use crate::trace::hex;

fn sha256_tag(line: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(line)))
}

/// RFC 3339 UTC timestamp with microseconds, without a date library.
pub fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Canonical JSON (object keys sorted), so equal params digest equally.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> =
                keys.iter().map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k]))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

fn key_path(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".key");
    PathBuf::from(p)
}

fn load_or_create_key(path: &Path) -> Result<[u8; 32], AuditError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let t = text.trim();
            if t.len() != 64 {
                return Err(AuditError::BadKey);
            }
            let mut key = [0u8; 32];
            for (i, chunk) in t.as_bytes().chunks(2).enumerate() {
                let s = std::str::from_utf8(chunk).map_err(|_| AuditError::BadKey)?;
                key[i] = u8::from_str_radix(s, 16).map_err(|_| AuditError::BadKey)?;
            }
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key: [u8; 32] = crate::trace::random_bytes();
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
            f.write_all(format!("{}\n", hex(&key)).as_bytes())?;
            f.sync_all()?;
            Ok(key)
        }
        Err(e) => Err(e.into()),
    }
}

/// The last complete line of `f` (without its newline), or `None` when empty.
fn last_line(f: &mut File) -> Result<Option<Vec<u8>>, AuditError> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let start = len.saturating_sub(MAX_RECORD + 1);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.read_to_end(&mut buf)?;
    if buf.last() != Some(&b'\n') {
        return Err(AuditError::BrokenTail);
    }
    buf.pop();
    match buf.iter().rposition(|b| *b == b'\n') {
        Some(i) => Ok(Some(buf[i + 1..].to_vec())),
        None if start == 0 => Ok(Some(buf)),
        None => Err(AuditError::BrokenTail),
    }
}

impl AuditLog {
    /// Open (creating 0600 if needed) and write an `open` record, so a log
    /// that cannot be written stops startup instead of the first write.
    pub fn open(path: &Path, peer: Option<Peer>, mode: &str) -> Result<AuditLog, AuditError> {
        let key = load_or_create_key(&key_path(path))?;
        let file = OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)?;
        let log = AuditLog { inner: Arc::new(Inner { file: Mutex::new(file), key, peer }) };
        let mut rec = Map::new();
        rec.insert("phase".into(), json!("open"));
        rec.insert("server".into(), json!({"name": "snowluma-mcp", "version": env!("CARGO_PKG_VERSION")}));
        rec.insert("pid".into(), json!(std::process::id()));
        rec.insert("mode".into(), json!(mode));
        log.append_blocking(rec)?;
        Ok(log)
    }

    pub fn params_digest(&self, params: &Value) -> String {
        // proven: HMAC-SHA256 accepts keys of any length, so new_from_slice cannot fail.
        #[allow(clippy::expect_used)]
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.inner.key).expect("HMAC takes any key length");
        mac.update(canonical(params).as_bytes());
        format!("hmac-sha256:{}", hex(&mac.finalize().into_bytes()))
    }

    /// Append one record (blocking: lock, read the tail, write, fdatasync).
    pub fn append_blocking(&self, mut rec: Map<String, Value>) -> Result<(), AuditError> {
        let guard = self.inner.file.lock().map_err(|_| AuditError::Lock("poisoned".into()))?;
        let mut f: &File = &guard;
        f.lock().map_err(|e| AuditError::Lock(e.to_string()))?;
        let result = (|| {
            let mut handle = f.try_clone()?;
            let (seq, prev) = match last_line(&mut handle)? {
                None => (0u64, GENESIS_PREV.to_owned()),
                Some(line) => {
                    let v: Value = serde_json::from_slice(&line).map_err(|_| AuditError::BrokenTail)?;
                    let seq = v.get("seq").and_then(Value::as_u64).ok_or(AuditError::BrokenTail)?;
                    (seq + 1, sha256_tag(&line))
                }
            };
            let mut head = Map::new();
            head.insert("v".into(), json!(1));
            head.insert("seq".into(), json!(seq));
            head.insert("ts".into(), json!(now_rfc3339()));
            head.insert("prev".into(), json!(prev));
            if let Some(p) = self.inner.peer {
                head.insert("peer".into(), json!(p));
            }
            head.append(&mut rec);
            let mut line = serde_json::to_vec(&Value::Object(head)).map_err(std::io::Error::other)?;
            line.push(b'\n');
            f.write_all(&line)?;
            f.sync_data()?;
            Ok(())
        })();
        let _ = f.unlock();
        result
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

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {reason}")]
pub struct VerifyError {
    pub line: usize,
    pub reason: String,
}

/// Check the whole chain; returns the number of records.
pub fn verify(path: &Path) -> Result<usize, VerifyError> {
    let bytes = std::fs::read(path).map_err(|e| VerifyError { line: 0, reason: format!("cannot read: {e}") })?;
    if bytes.is_empty() {
        return Ok(0);
    }
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let complete = bytes.last() == Some(&b'\n');
    if complete {
        lines.pop();
    }
    let mut prev = GENESIS_PREV.to_owned();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let bad = |reason: &str| VerifyError { line: n, reason: reason.to_owned() };
        if !complete && n == lines.len() {
            return Err(bad("incomplete last line (the log was truncated)"));
        }
        let v: Value = serde_json::from_slice(line).map_err(|_| bad("not a JSON record"))?;
        if v.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(bad(if i == 0 {
                "does not start the chain (earlier lines were removed)"
            } else {
                "prev does not match the previous line (a line was edited, removed or moved)"
            }));
        }
        if v.get("seq").and_then(Value::as_u64) != Some(i as u64) {
            return Err(bad("seq out of order"));
        }
        prev = sha256_tag(line);
    }
    Ok(lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn chain_round_trip_and_tamper_detection() {
        let dir = std::env::temp_dir().join(format!("snowluma-audit-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let log = AuditLog::open(&path, None, "write").unwrap();
        for i in 0..4 {
            let mut m = Map::new();
            m.insert("phase".into(), json!("intent"));
            m.insert("n".into(), json!(i));
            log.append_blocking(m).unwrap();
        }
        assert_eq!(verify(&path), Ok(5));
        let d1 = log.params_digest(&json!({"a": 1, "b": 2}));
        assert_eq!(d1, log.params_digest(&json!({"b": 2, "a": 1})));
        assert!(!d1.contains('1') || d1.starts_with("hmac-sha256:"));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let write = |ls: &[&str], tail: &str| std::fs::write(&path, format!("{}{tail}", ls.join("\n"))).unwrap();
        // edit
        let edited = lines[2].replace("\"n\":1", "\"n\":9");
        write(&[lines[0], lines[1], &edited, lines[3], lines[4]], "\n");
        assert_eq!(verify(&path).unwrap_err().line, 4);
        // delete
        write(&[lines[0], lines[1], lines[3], lines[4]], "\n");
        assert_eq!(verify(&path).unwrap_err().line, 3);
        // reorder
        write(&[lines[0], lines[2], lines[1], lines[3], lines[4]], "\n");
        assert_eq!(verify(&path).unwrap_err().line, 2);
        // truncate
        write(&[lines[0], lines[1], &lines[2][..10]], "");
        assert_eq!(verify(&path).unwrap_err().line, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
