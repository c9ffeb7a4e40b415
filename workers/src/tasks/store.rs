//! The task directory: an exclusive lease, a scope record, and one JSON
//! record per task, each written atomically (temporary file, `fsync`,
//! `rename`, `fsync` of the directory) and validated when read.
//!
//! Every access goes through the directory's descriptor (`openat`,
//! `renameat`), so the store needs no path and Landlock can grant it that
//! one directory. Nothing here is skipped or recreated silently: a corrupt
//! record, a file with the wrong permissions or a failed write is an error
//! for the caller to report.

use std::fs::{File, TryLockError};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use snowluma_proto::bytes::{hex, random_bytes};
use snowluma_proto::task::{RECORD_VERSION, UNKNOWN_OUTCOME, is_task_id, now_rfc3339};
pub use snowluma_proto::task::{TaskRecord, TaskStatus};

/// The largest record the store writes or reads.
pub const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;
/// The lease file; its exclusive lock is held for the store's life.
pub const LEASE_FILE: &str = "lease";
/// The scope record.
pub const SCOPE_FILE: &str = "scope.json";
/// The error code of a task failed by a restart (a JSON-RPC internal error).
const UNKNOWN_OUTCOME_CODE: i64 = -32603;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("task directory: {op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the task directory's lease is held by another snowluma-mcp runtime; \
         task tools are unavailable in this one (stop the other runtime or give this one its own directory)"
    )]
    Leased,
    #[error(
        "the task directory belongs to another configuration (mode, endpoint or token differ); \
         choose a new private directory for this configuration and keep the old one for its history"
    )]
    ScopeMismatch,
    #[error("task directory: {what} has unsafe permissions (directories must be 0700, files 0600, owned by this user)")]
    Permissions { what: &'static str },
    #[error("task directory: {what} is corrupt: {reason}")]
    Corrupt { what: &'static str, reason: String },
    #[error("a task record of {bytes} bytes exceeds the limit of {MAX_RECORD_BYTES} bytes")]
    TooLarge { bytes: u64 },
    #[error("unknown task")]
    NotFound,
    #[error("not a task id")]
    BadId,
    #[error("the task already exists")]
    Exists,
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { op, source }
}

pub(super) fn nix_io(op: &'static str) -> impl FnOnce(nix::Error) -> StoreError {
    move |e| StoreError::Io { op, source: std::io::Error::from(e) }
}

/// The scope record: a salt and the digest of the salt and the
/// configuration's digest (never the token).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scope {
    version: u32,
    salt: String,
    digest: String,
}

fn record_name(id: &str) -> String {
    format!("{id}.json")
}

/// One page of task metadata.
#[derive(Debug)]
pub struct Page {
    pub tasks: Vec<TaskRecord>,
    pub next_cursor: Option<String>,
}

/// An open task directory, holding its lease.
pub struct TaskStore {
    pub(super) dir: OwnedFd,
    _lease: File,
}

impl std::fmt::Debug for TaskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStore").finish_non_exhaustive()
    }
}

/// What a file type is called in a corruption report.
fn kind_name(mode: nix::libc::mode_t) -> &'static str {
    match mode & nix::libc::S_IFMT {
        nix::libc::S_IFREG => "a regular file",
        nix::libc::S_IFDIR => "a directory",
        nix::libc::S_IFLNK => "a symbolic link",
        nix::libc::S_IFIFO => "a FIFO",
        nix::libc::S_IFSOCK => "a socket",
        nix::libc::S_IFCHR | nix::libc::S_IFBLK => "a device",
        _ => "an unknown file type",
    }
}

fn wrong_type(what: &'static str, mode: nix::libc::mode_t) -> StoreError {
    StoreError::Corrupt { what, reason: format!("not the expected file type ({})", kind_name(mode)) }
}

fn check_private(fd: BorrowedFd<'_>, what: &'static str, dir: bool) -> Result<u64, StoreError> {
    let st = nix::sys::stat::fstat(fd).map_err(nix_io("stat"))?;
    let kind = st.st_mode & nix::libc::S_IFMT;
    let want = if dir { nix::libc::S_IFDIR } else { nix::libc::S_IFREG };
    if kind != want {
        return Err(wrong_type(what, st.st_mode));
    }
    if st.st_mode & 0o077 != 0 || st.st_uid != nix::unistd::geteuid().as_raw() {
        return Err(StoreError::Permissions { what });
    }
    Ok(st.st_size as u64)
}

/// Open `name` beneath the directory without following a symbolic link
/// (`ELOOP`), without waiting (`O_NONBLOCK`: a FIFO planted under a
/// record's name would otherwise block the open until a writer came, and
/// with it every task request and the session's end) and without taking a
/// terminal as the controlling one. The caller checks the type on the
/// opened descriptor; on a regular file `O_NONBLOCK` changes nothing.
fn openat(dir: BorrowedFd<'_>, name: &str, flags: OFlag, mode: u32) -> nix::Result<File> {
    let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let fd = nix::fcntl::openat(dir, name, flags, Mode::from_bits_truncate(mode))?;
    Ok(File::from(fd))
}

impl TaskStore {
    /// [`TaskStore::open_or_wait`] without the directory handed back (tests).
    #[cfg(test)]
    pub fn open(dir: OwnedFd, config_digest: &[u8; 32]) -> Result<TaskStore, StoreError> {
        Self::open_or_wait(dir, config_digest).map_err(|(e, _)| e)
    }

    /// Open the store in `dir` (a directory descriptor): take the lease and
    /// check or write the scope. The restart pass is [`TaskStore::fail_unfinished`].
    /// When only the lease is missing (another runtime holds it), the
    /// directory is handed back, so that a later attempt can take the lease
    /// over once that runtime has gone.
    pub fn open_or_wait(dir: OwnedFd, config_digest: &[u8; 32]) -> Result<TaskStore, (StoreError, Option<OwnedFd>)> {
        let lease = (|| {
            check_private(dir.as_fd(), "the directory", true)?;
            let lease =
                openat(dir.as_fd(), LEASE_FILE, OFlag::O_RDWR | OFlag::O_CREAT, 0o600).map_err(nix_io("open lease"))?;
            check_private(lease.as_fd(), "the lease file", false)?;
            Ok(lease)
        })()
        .map_err(|e| (e, None))?;
        match lease.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err((StoreError::Leased, Some(dir))),
            Err(TryLockError::Error(e)) => return Err((StoreError::Io { op: "lock lease", source: e }, None)),
        }
        let store = TaskStore { dir, _lease: lease };
        store.check_scope(config_digest).map_err(|e| (e, None))?;
        Ok(store)
    }

    /// Open a directory by path (tests).
    #[cfg(test)]
    pub fn open_dir(path: &std::path::Path) -> Result<OwnedFd, StoreError> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(nix_io("open directory"))?;
        Ok(fd)
    }

    fn check_scope(&self, config_digest: &[u8; 32]) -> Result<(), StoreError> {
        match self.read_file(SCOPE_FILE, "the scope record") {
            Ok(bytes) => {
                let scope: Scope = serde_json::from_slice(&bytes)
                    .map_err(|e| StoreError::Corrupt { what: "the scope record", reason: e.to_string() })?;
                if scope.version != 1 || scope.salt.len() != 64 || scope.digest.len() != 64 {
                    return Err(StoreError::Corrupt { what: "the scope record", reason: "unexpected contents".into() });
                }
                if scope_digest(&scope.salt, config_digest) != scope.digest {
                    return Err(StoreError::ScopeMismatch);
                }
                Ok(())
            }
            Err(StoreError::NotFound) => {
                // A directory without a scope must hold no records: records
                // without a scope cannot be proven to be this configuration's.
                let (tasks, keys) = self.scan()?;
                if !tasks.is_empty() || !keys.is_empty() {
                    return Err(StoreError::Corrupt {
                        what: "the scope record",
                        reason: "missing beside task records".into(),
                    });
                }
                let salt = hex(&random_bytes::<32>());
                let digest = scope_digest(&salt, config_digest);
                let scope = Scope { version: 1, salt, digest };
                let bytes = serde_json::to_vec(&scope)
                    .map_err(|e| StoreError::Corrupt { what: "the scope record", reason: e.to_string() })?;
                self.write_atomic(SCOPE_FILE, &bytes, false)
            }
            Err(e) => Err(e),
        }
    }

    /// The restart pass: every unfinished record becomes failed with
    /// [`UNKNOWN_OUTCOME`]; returns how many. Run once per server start
    /// (the supervisor asks), never again when only this worker restarts.
    pub fn fail_unfinished(&self) -> Result<usize, StoreError> {
        let mut failed = 0;
        for id in self.record_ids()? {
            let mut record = self.get(&id)?;
            if record.status.is_terminal() {
                continue;
            }
            record.status = TaskStatus::Failed;
            record.status_message = Some(UNKNOWN_OUTCOME.into());
            record.last_updated_at = now_rfc3339();
            record.error = Some(serde_json::json!({"code": UNKNOWN_OUTCOME_CODE, "message": UNKNOWN_OUTCOME}));
            self.put(&record, false)?;
            failed += 1;
        }
        Ok(failed)
    }

    /// The ids of every record in the directory. An entry that is neither a
    /// record, the lease, the scope nor a leftover temporary file is
    /// corruption.
    pub fn record_ids(&self) -> Result<Vec<String>, StoreError> {
        self.scan().map(|(tasks, _)| tasks)
    }

    /// The ids of every task record and every idempotency key record
    /// (`key-<id>.json`, see `keys.rs`), each sorted.
    pub(super) fn scan(&self) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let dir = nix::dir::Dir::openat(
            self.dir.as_fd(),
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(nix_io("list directory"))?;
        let mut ids = Vec::new();
        let mut keys = Vec::new();
        for entry in dir {
            let entry = entry.map_err(nix_io("list directory"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." || name == LEASE_FILE || name == SCOPE_FILE {
                continue;
            }
            if let Some(id) = name.strip_suffix(".json").filter(|id| is_task_id(id)) {
                ids.push(id.to_owned());
            } else if let Some(id) = super::keys::key_id_of(&name) {
                keys.push(id.to_owned());
            } else if name.starts_with('.') && name.ends_with(".tmp") {
                // A write interrupted before its rename: never a record.
                continue;
            } else {
                return Err(StoreError::Corrupt { what: "the directory", reason: "an unexpected entry".into() });
            }
        }
        ids.sort();
        keys.sort();
        Ok((ids, keys))
    }

    /// Read a record: only a regular file (checked by name first, so that
    /// no FIFO, device or socket is even opened, then again on the opened
    /// descriptor, which is what is read). Anything else is corruption.
    pub(super) fn read_file(&self, name: &str, what: &'static str) -> Result<Vec<u8>, StoreError> {
        match nix::sys::stat::fstatat(self.dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG => {}
            Ok(st) => return Err(wrong_type(what, st.st_mode)),
            Err(nix::Error::ENOENT) => return Err(StoreError::NotFound),
            Err(e) => return Err(nix_io("stat record")(e)),
        }
        let mut file = match openat(self.dir.as_fd(), name, OFlag::O_RDONLY, 0) {
            Ok(f) => f,
            Err(nix::Error::ENOENT) => return Err(StoreError::NotFound),
            // Replaced by a symbolic link since the check above.
            Err(nix::Error::ELOOP) => return Err(wrong_type(what, nix::libc::S_IFLNK)),
            Err(e) => return Err(nix_io("open record")(e)),
        };
        let size = check_private(file.as_fd(), what, false)?;
        if size > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge { bytes: size });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut file).take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes).map_err(io("read record"))?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge { bytes: bytes.len() as u64 });
        }
        Ok(bytes)
    }

    /// Read and validate one record.
    pub fn get(&self, id: &str) -> Result<TaskRecord, StoreError> {
        if !is_task_id(id) {
            return Err(StoreError::BadId);
        }
        let bytes = self.read_file(&record_name(id), "a task record")?;
        let record: TaskRecord = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt { what: "a task record", reason: e.to_string() })?;
        if record.version != RECORD_VERSION || record.task_id != id {
            return Err(StoreError::Corrupt { what: "a task record", reason: "version or id does not match".into() });
        }
        Ok(record)
    }

    /// Write a record atomically. `create` refuses to replace an existing one.
    pub fn put(&self, record: &TaskRecord, create: bool) -> Result<(), StoreError> {
        if !is_task_id(&record.task_id) {
            return Err(StoreError::BadId);
        }
        let bytes = serde_json::to_vec(record)
            .map_err(|e| StoreError::Corrupt { what: "a task record", reason: e.to_string() })?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge { bytes: bytes.len() as u64 });
        }
        self.write_atomic(&record_name(&record.task_id), &bytes, create)
    }

    pub(super) fn write_atomic(&self, name: &str, bytes: &[u8], create: bool) -> Result<(), StoreError> {
        let tmp = format!(".{name}.{}.tmp", hex(&random_bytes::<8>()));
        let mut file = openat(self.dir.as_fd(), &tmp, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, 0o600)
            .map_err(nix_io("create temporary record"))?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io("write record")).and_then(|()| {
            if create {
                // linkat refuses an existing name, so two creations of
                // one id cannot both succeed.
                nix::unistd::linkat(self.dir.as_fd(), tmp.as_str(), self.dir.as_fd(), name, AtFlags::empty()).map_err(
                    |e| match e {
                        nix::Error::EEXIST => StoreError::Exists,
                        e => nix_io("link record")(e),
                    },
                )
            } else {
                nix::fcntl::renameat(self.dir.as_fd(), tmp.as_str(), self.dir.as_fd(), name)
                    .map_err(nix_io("rename record"))
            }
        });
        drop(file);
        if create || written.is_err() {
            let _ = nix::unistd::unlinkat(self.dir.as_fd(), tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        written?;
        nix::unistd::fsync(self.dir.as_fd()).map_err(nix_io("sync directory"))
    }

    /// The metadata (no results or errors) of `owner`'s tasks, ordered by
    /// creation, `limit` per page; the cursor is the last id of the
    /// previous page. Every record is read and validated, another owner's
    /// included: a corrupt record is reported, never skipped.
    pub fn list(&self, cursor: Option<&str>, limit: usize, owner: Option<&str>) -> Result<Page, StoreError> {
        let mut all = Vec::new();
        for id in self.record_ids()? {
            let mut r = self.get(&id)?;
            if r.owner.as_deref() != owner {
                continue;
            }
            r.result = None;
            r.error = None;
            all.push(r);
        }
        all.sort_by(|a, b| (&a.created_at, &a.task_id).cmp(&(&b.created_at, &b.task_id)));
        let start = match cursor {
            None => 0,
            Some(c) => {
                let (at, id) = c.split_once('~').ok_or(StoreError::BadId)?;
                all.iter().position(|r| (r.created_at.as_str(), r.task_id.as_str()) > (at, id)).unwrap_or(all.len())
            }
        };
        let end = start.saturating_add(limit).min(all.len());
        let next_cursor = (end < all.len())
            .then(|| all.get(end.wrapping_sub(1)).map(|r| format!("{}~{}", r.created_at, r.task_id)))
            .flatten();
        let tasks = all.drain(start..end).collect();
        Ok(Page { tasks, next_cursor })
    }
}

fn scope_digest(salt: &str, config_digest: &[u8; 32]) -> String {
    let mut h = Sha256::new();
    h.update(b"snowluma-mcp task scope v1\0");
    h.update(salt.as_bytes());
    h.update(config_digest);
    hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use snowluma_proto::task::new_task_id;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    fn tempdir(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("slm-tasks-{tag}-{}", hex(&random_bytes::<6>())));
        std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
        p
    }

    fn record(id: &str, status: TaskStatus, at: &str) -> TaskRecord {
        TaskRecord {
            version: RECORD_VERSION,
            task_id: id.into(),
            status,
            status_message: None,
            created_at: at.into(),
            last_updated_at: at.into(),
            action: "download_file_stream".into(),
            owner: None,
            progress: None,
            result: Some(serde_json::json!({"ok": true})),
            error: None,
        }
    }

    fn open(p: &std::path::Path, digest: u8) -> Result<(TaskStore, usize), StoreError> {
        let store = TaskStore::open(TaskStore::open_dir(p)?, &[digest; 32])?;
        let failed = store.fail_unfinished()?;
        Ok((store, failed))
    }

    #[test]
    fn records_round_trip_and_are_private() {
        let p = tempdir("rt");
        let (store, failed) = open(&p, 1).unwrap();
        assert_eq!(failed, 0);
        let id = new_task_id();
        let r = record(&id, TaskStatus::Completed, &now_rfc3339());
        store.put(&r, true).unwrap();
        assert!(matches!(store.put(&r, true), Err(StoreError::Exists)));
        assert_eq!(store.get(&id).unwrap(), r);
        let mode = std::fs::metadata(p.join(format!("{id}.json"))).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(matches!(store.get(&new_task_id()), Err(StoreError::NotFound)));
        assert!(matches!(store.get("../x"), Err(StoreError::BadId)));
        let scope = std::fs::read_to_string(p.join(SCOPE_FILE)).unwrap();
        assert!(!scope.contains(&hex(&[1u8; 32])), "the configuration digest is salted");
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn lease_is_exclusive() {
        let p = tempdir("lease");
        let (store, _) = open(&p, 1).unwrap();
        let e = open(&p, 1).unwrap_err();
        assert!(matches!(e, StoreError::Leased), "{e}");
        assert!(e.to_string().contains("lease"));
        drop(store);
        open(&p, 1).unwrap();
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn a_leased_directory_is_handed_back_for_a_later_attempt() {
        let p = tempdir("lease-wait");
        let (store, _) = open(&p, 1).unwrap();
        let Err((e, Some(dir))) = TaskStore::open_or_wait(TaskStore::open_dir(&p).unwrap(), &[1; 32]) else {
            panic!("the directory comes back while the lease is held");
        };
        assert!(matches!(e, StoreError::Leased), "{e}");
        drop(store);
        TaskStore::open_or_wait(dir, &[1; 32]).map_err(|(e, _)| e).unwrap();
        // Other failures keep nothing to retry with.
        let Err((e, None)) = TaskStore::open_or_wait(TaskStore::open_dir(&p).unwrap(), &[2; 32]) else {
            panic!("a scope mismatch is final");
        };
        assert!(matches!(e, StoreError::ScopeMismatch), "{e}");
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn another_configuration_is_refused() {
        let p = tempdir("scope");
        drop(open(&p, 1).unwrap());
        let e = open(&p, 2).unwrap_err();
        assert!(matches!(e, StoreError::ScopeMismatch));
        assert!(e.to_string().contains("new private directory"));
        open(&p, 1).unwrap();
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn restart_fails_unfinished_tasks_without_replaying() {
        let p = tempdir("restart");
        let (store, _) = open(&p, 1).unwrap();
        let running = new_task_id();
        let done = new_task_id();
        store.put(&record(&running, TaskStatus::Working, &now_rfc3339()), true).unwrap();
        store.put(&record(&done, TaskStatus::Completed, &now_rfc3339()), true).unwrap();
        drop(store);
        let (store, failed) = open(&p, 1).unwrap();
        assert_eq!(failed, 1);
        let r = store.get(&running).unwrap();
        assert_eq!(r.status, TaskStatus::Failed);
        assert!(r.status_message.unwrap().contains("unknown remote outcome"));
        assert_eq!(store.get(&done).unwrap().status, TaskStatus::Completed);
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn corruption_size_and_permissions_are_errors() {
        let p = tempdir("corrupt");
        let (store, _) = open(&p, 1).unwrap();
        let bad = new_task_id();
        let path = p.join(format!("{bad}.json"));
        std::fs::write(&path, b"{not json").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(store.get(&bad), Err(StoreError::Corrupt { .. })));
        assert!(matches!(store.list(None, 50, None), Err(StoreError::Corrupt { .. })));
        // Not recreated or removed.
        assert_eq!(std::fs::read(&path).unwrap(), b"{not json");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(store.get(&bad), Err(StoreError::Permissions { .. })));

        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_RECORD_BYTES + 1).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(store.get(&bad), Err(StoreError::TooLarge { .. })));

        let mut big = record(&new_task_id(), TaskStatus::Completed, &now_rfc3339());
        big.result = Some(serde_json::Value::String("x".repeat(MAX_RECORD_BYTES as usize)));
        assert!(matches!(store.put(&big, true), Err(StoreError::TooLarge { .. })));
        drop(store);

        // A corrupt record also stops a restart: it is never skipped.
        assert!(matches!(open(&p, 1), Err(StoreError::TooLarge { .. })));
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn a_fifo_a_directory_or_a_symlink_under_a_records_name_is_corruption_at_once() {
        let p = tempdir("types");
        let (store, _) = open(&p, 1).unwrap();
        let fifo = new_task_id();
        nix::unistd::mkfifo(&p.join(format!("{fifo}.json")), Mode::from_bits_truncate(0o600)).unwrap();
        let e = store.get(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(matches!(store.list(None, 50, None), Err(StoreError::Corrupt { .. })));
        std::fs::remove_file(p.join(format!("{fifo}.json"))).unwrap();
        let dir = new_task_id();
        std::fs::DirBuilder::new().mode(0o700).create(p.join(format!("{dir}.json"))).unwrap();
        assert!(store.get(&dir).unwrap_err().to_string().contains("a directory"));
        let link = new_task_id();
        std::os::unix::fs::symlink("/etc/passwd", p.join(format!("{link}.json"))).unwrap();
        assert!(store.get(&link).unwrap_err().to_string().contains("a symbolic link"));
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn an_open_directory_is_refused() {
        let p = tempdir("perm");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(open(&p, 1), Err(StoreError::Permissions { .. })));
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn listing_pages_through_120_tasks_without_bodies() {
        let p = tempdir("list");
        let (store, _) = open(&p, 1).unwrap();
        for i in 0..120u64 {
            let at = snowluma_proto::task::rfc3339(1_764_561_600 + i, 0);
            store.put(&record(&new_task_id(), TaskStatus::Completed, &at), true).unwrap();
        }
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let page = store.list(cursor.as_deref(), 50, None).unwrap();
            pages += 1;
            assert!(page.tasks.iter().all(|t| t.result.is_none() && t.error.is_none()));
            seen.extend(page.tasks.into_iter().map(|t| t.created_at));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 120);
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, seen);
        drop(store);
        std::fs::remove_dir_all(&p).unwrap();
    }
}
