//! `snowluma-mcp audit reanchor`: a fresh head for a log that verifies.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::head::{Anchor, HEAD_LEN, head_path, whole_head};
use super::key::Key;
use super::verify::{VerifyError, check_chain, split_lines};
use super::{AuditError, sync_parent};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::key::{KeySource, key_path, read_key};
    use crate::audit::record::GENESIS_PREV;
    use crate::audit::sha256_tag;
    use crate::audit::test_support::{Dir, key_of, lines_of, write_lines, written};
    use crate::audit::verify::{HeadCheck, verify};
    use crate::audit::{AuditError, AuditLog};

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
}
