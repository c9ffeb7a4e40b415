//! Idempotency key records beside the task records: `key-<id>.json`, one
//! per key, written with the store's atomic write (temporary file, `fsync`,
//! `linkat` for a new key so that two claims of one key cannot both
//! succeed, `rename` to replace, `fsync` of the directory) and validated
//! when read, like a task record. The supervisor serializes the calls of
//! one key; the store's rules hold even if it did not.

use std::os::fd::AsFd;

use snowluma_proto::keys::{KEY_RECORD_VERSION, KeyRecord, KeyState, is_key_id};

use super::store::{MAX_RECORD_BYTES, StoreError, TaskStore, nix_io};

const PREFIX: &str = "key-";
const SUFFIX: &str = ".json";

fn file_name(id: &str) -> String {
    format!("{PREFIX}{id}{SUFFIX}")
}

/// The key id of a directory entry named like a key record.
pub fn key_id_of(name: &str) -> Option<&str> {
    name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX).filter(|id| is_key_id(id))
}

fn corrupt(reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt { what: "an idempotency key record", reason: reason.into() }
}

impl TaskStore {
    /// Read and validate one key record (any owner's).
    pub fn key_read(&self, id: &str) -> Result<KeyRecord, StoreError> {
        if !is_key_id(id) {
            return Err(StoreError::BadId);
        }
        let bytes = self.read_file(&file_name(id), "an idempotency key record")?;
        let record: KeyRecord = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if record.version != KEY_RECORD_VERSION || record.key_id != id {
            return Err(corrupt("version or id does not match"));
        }
        Ok(record)
    }

    fn key_write(&self, record: &KeyRecord, create: bool) -> Result<(), StoreError> {
        if !is_key_id(&record.key_id) {
            return Err(StoreError::BadId);
        }
        let bytes = serde_json::to_vec(record).map_err(|e| corrupt(e.to_string()))?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge { bytes: bytes.len() as u64 });
        }
        self.write_atomic(&file_name(&record.key_id), &bytes, create)
    }

    /// `owner`'s live record of `id` at `now_ms`; an expired one, or
    /// another principal's, is absent.
    pub fn key_get(&self, id: &str, owner: Option<&str>, now_ms: u64) -> Result<KeyRecord, StoreError> {
        let r = self.key_read(id)?;
        if r.owner.as_deref() != owner || r.expired(now_ms) {
            return Err(StoreError::NotFound);
        }
        Ok(r)
    }

    /// Claim `record`'s key (a pending record of `owner`): `Ok(None)` when
    /// written, `Ok(Some(live))` when a live record of the key exists.
    pub fn key_begin(
        &self,
        record: &KeyRecord,
        owner: Option<&str>,
        now_ms: u64,
    ) -> Result<Option<KeyRecord>, StoreError> {
        if record.state != KeyState::Pending || record.reply.is_some() || record.owner.as_deref() != owner {
            return Err(corrupt("a claim must be a pending record of this session's principal"));
        }
        match self.key_read(&record.key_id) {
            // Key ids are digests of the principal and the key: another
            // principal's record under this id cannot be (it is corruption).
            Ok(old) if old.owner.as_deref() != owner => Err(corrupt("it names another principal")),
            Ok(old) if !old.expired(now_ms) => Ok(Some(old)),
            Ok(_) => self.key_write(record, false).map(|()| None),
            Err(StoreError::NotFound) => match self.key_write(record, true) {
                Ok(()) => Ok(None),
                // Claimed in between: that claim stands.
                Err(StoreError::Exists) => self.key_read(&record.key_id).map(Some),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Record the outcome of `owner`'s pending key (same key, same call).
    pub fn key_finish(&self, record: &KeyRecord, owner: Option<&str>) -> Result<(), StoreError> {
        if record.state != KeyState::Done || record.reply.is_none() || record.owner.as_deref() != owner {
            return Err(corrupt("an outcome must be a done record of this session's principal"));
        }
        let old = self.key_read(&record.key_id)?;
        if old.owner.as_deref() != owner
            || old.state != KeyState::Pending
            || old.created_ms != record.created_ms
            || old.args_digest != record.args_digest
        {
            return Err(StoreError::Exists);
        }
        self.key_write(record, false)
    }

    /// Remove every expired key record (any principal's); how many.
    pub fn key_sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let (_, keys) = self.scan()?;
        let mut removed = 0;
        for id in keys {
            if self.key_read(&id)?.expired(now_ms) {
                nix::unistd::unlinkat(
                    self.dir.as_fd(),
                    file_name(&id).as_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                )
                .map_err(nix_io("remove expired key record"))?;
                removed += 1;
            }
        }
        if removed > 0 {
            nix::unistd::fsync(self.dir.as_fd()).map_err(nix_io("sync directory"))?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snowluma_proto::bytes::{hex, random_bytes};
    use snowluma_proto::keys::KEY_TTL_MS;
    use snowluma_proto::{FailureKind, ToolReply};
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    fn tempdir() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("slm-keys-{}", hex(&random_bytes::<6>())));
        std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
        p
    }

    fn pending(id: &str, owner: Option<&str>, at: u64) -> KeyRecord {
        KeyRecord {
            version: KEY_RECORD_VERSION,
            key_id: id.into(),
            owner: owner.map(str::to_owned),
            args_digest: "d".into(),
            action: "send_group_msg".into(),
            created_ms: at,
            state: KeyState::Pending,
            reply: None,
        }
    }

    #[test]
    fn a_key_is_claimed_once_finished_once_and_expires() {
        let p = tempdir();
        let store = TaskStore::open(TaskStore::open_dir(&p).unwrap(), &[1; 32]).unwrap();
        let id = hex(&random_bytes::<32>());
        let rec = pending(&id, None, 1000);
        assert!(store.key_begin(&rec, None, 1000).unwrap().is_none(), "claimed");
        let again = store.key_begin(&rec, None, 1001).unwrap().expect("the first claim stands");
        assert_eq!(again.state, KeyState::Pending);
        assert!(matches!(store.key_get(&id, Some("http:x"), 1001), Err(StoreError::NotFound)));
        let mut done = rec.clone();
        done.state = KeyState::Done;
        done.reply = Some(ToolReply::fail(FailureKind::Execution, "x"));
        store.key_finish(&done, None).unwrap();
        assert!(matches!(store.key_finish(&done, None), Err(StoreError::Exists)), "finished once");
        let got = store.key_get(&id, None, 1002).unwrap();
        assert_eq!(got.state, KeyState::Done);
        let mode = std::fs::metadata(p.join(file_name(&id))).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Task listing ignores key records; a restart keeps them.
        assert!(store.record_ids().unwrap().is_empty());
        drop(store);
        let store = TaskStore::open(TaskStore::open_dir(&p).unwrap(), &[1; 32]).unwrap();
        assert_eq!(store.key_get(&id, None, 1003).unwrap().state, KeyState::Done);
        // 24 hours later the key is gone, and may be claimed anew.
        let later = 1000 + KEY_TTL_MS;
        assert!(matches!(store.key_get(&id, None, later), Err(StoreError::NotFound)));
        assert_eq!(store.key_sweep(later - 1).unwrap(), 0);
        assert!(store.key_begin(&pending(&id, None, later), None, later).unwrap().is_none());
        assert_eq!(store.key_sweep(later + KEY_TTL_MS).unwrap(), 1);
        assert!(matches!(store.key_read(&id), Err(StoreError::NotFound)));
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn corrupt_key_records_are_errors() {
        let p = tempdir();
        let store = TaskStore::open(TaskStore::open_dir(&p).unwrap(), &[1; 32]).unwrap();
        let id = hex(&random_bytes::<32>());
        let path = p.join(file_name(&id));
        std::fs::write(&path, b"{").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(store.key_get(&id, None, 0), Err(StoreError::Corrupt { .. })));
        assert!(matches!(store.key_begin(&pending(&id, None, 0), None, 0), Err(StoreError::Corrupt { .. })));
        assert_eq!(std::fs::read(&path).unwrap(), b"{", "never overwritten");
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }
}
