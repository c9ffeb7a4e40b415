//! The writer: opening the log with its head, and appending records.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use super::head::{Anchor, head_path, whole_head, write_head};
use super::key::{Key, KeySource, key_path, load_or_create_key, read_key};
use super::record::{GENESIS_PREV, Principal, RECORD_VERSION, now_rfc3339, seal};
use super::tail::{check_tail, last_newline, sha256_from};
use super::{AuditError, sync_parent};

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
        self.inner.key.params_digest(params)
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::audit::sha256_tag;
    use crate::audit::test_support::{Dir, intent, key_of, lines_of, written};
    use crate::audit::verify::{VerifyError, verify};

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
}
