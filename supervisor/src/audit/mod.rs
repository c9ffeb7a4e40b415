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

mod append;
pub mod cli;
mod head;
mod key;
mod reanchor;
mod record;
mod tail;
#[cfg(test)]
mod test_support;
mod verify;

use std::fs::File;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::trace::hex;

pub use append::AuditLog;
pub use key::{KeySource, key_path, keygen, read_key};
pub use reanchor::reanchor;
pub use record::{ActionRecord, ActionRef, Peer, Principal, ToolRef};
pub use verify::{VerifyError, verify};

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

fn sibling(log: &Path, suffix: &str) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
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

/// fsync the directory holding `path`, so that a file just created there
/// survives a crash.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}
