//! The file-transfer worker: the only process that opens files under the
//! upload root (read) and the download directory (read-write).
//!
//! It holds no paths: the supervisor hands it the two directories as
//! descriptors ([`FILES_UPLOAD_ROOT_FD`], [`FILES_DOWNLOAD_DIR_FD`]), and every
//! open is relative to them with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so `..`, absolute paths and
//! symlinks anywhere on the path are refused by the kernel, and a file
//! swapped for a symlink between any check and the open cannot be followed
//! (there is no separate check: the descriptor is opened once and `fstat`ed).
//! Opened files travel to the supervisor as descriptors on the fd channel;
//! their bytes never pass through this worker or the supervisor.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use snowluma_proto::fdpass;
use snowluma_proto::{
    FILES_DOWNLOAD_DIR_FD, FILES_FD_CHANNEL, FILES_UPLOAD_ROOT_FD, FilesConfig, FilesReply, FilesRequest, Reply,
    Request, WorkerConfig, WorkerError,
};

use crate::serve::{Ctx, RoleHandler};

pub struct FilesWorker {
    config: OnceLock<FilesConfig>,
    upload_root: Option<OwnedFd>,
    download_dir: Option<OwnedFd>,
    channel: Option<OwnedFd>,
}

/// Take ownership of an inherited descriptor if it is open.
fn inherited(fd: i32) -> Option<OwnedFd> {
    // SAFETY: F_GETFD only queries the descriptor table.
    let open = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } >= 0;
    // SAFETY: the supervisor placed this descriptor for us before exec and
    // nothing else in this process owns it.
    open.then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

impl FilesWorker {
    /// Claims the inherited descriptors. Call once, at startup.
    pub fn from_inherited() -> FilesWorker {
        FilesWorker {
            config: OnceLock::new(),
            upload_root: inherited(FILES_UPLOAD_ROOT_FD),
            download_dir: inherited(FILES_DOWNLOAD_DIR_FD),
            channel: inherited(FILES_FD_CHANNEL),
        }
    }
}

/// `openat2` beneath `dir`, refusing symlinks and escapes.
fn open_beneath(dir: BorrowedFd<'_>, rel: &str, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let path = CString::new(rel).map_err(|_| std::io::Error::from_raw_os_error(nix::libc::EINVAL))?;
    // SAFETY: open_how is three plain integers; all-zero is a valid value.
    let mut how: nix::libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | nix::libc::O_CLOEXEC | nix::libc::O_NOFOLLOW) as u64;
    how.mode = u64::from(mode);
    how.resolve = nix::libc::RESOLVE_BENEATH | nix::libc::RESOLVE_NO_SYMLINKS | nix::libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads `path` (NUL-terminated, alive for the call) and
    // `how` (a correctly sized open_how); it returns a new descriptor we own.
    let fd = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const nix::libc::open_how,
            std::mem::size_of::<nix::libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A relative path that cannot name anything outside its directory.
fn check_rel(rel: &str) -> Result<(), String> {
    if rel.is_empty() || rel.starts_with('/') {
        return Err("the path must be relative to the upload root".into());
    }
    if rel.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err("the path must not contain '..' or empty components".into());
    }
    if rel.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    Ok(())
}

fn io_reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(nix::libc::ELOOP) => "a symbolic link is on the path (symlinks are refused)".into(),
        Some(nix::libc::EXDEV) => "the path leaves the upload root".into(),
        Some(nix::libc::ENOENT) => "no such file".into(),
        Some(nix::libc::EACCES) | Some(nix::libc::EPERM) => "permission denied".into(),
        _ => format!("cannot open: {e}"),
    }
}

/// Characters allowed in saved file names; anything else becomes `_`.
/// `flock(LOCK_EX | LOCK_NB)`: fails with EWOULDBLOCK when another open
/// file description holds the lock.
fn lock_exclusive(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: flock takes a descriptor we borrow for the call and no memory.
    let rc = unsafe { nix::libc::flock(fd.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Our download tokens: 32 lowercase hex digits.
fn is_token(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The `.part` file of a download token.
fn part_name(token: &str) -> String {
    format!("{token}.part")
}

/// Whether a directory entry is one of our `.part` files.
fn is_part_name(name: &str) -> bool {
    name.strip_suffix(".part").is_some_and(is_token)
}

/// Our `.part` files in the download directory.
fn part_files(dir: BorrowedFd<'_>) -> nix::Result<Vec<String>> {
    let mut d = nix::dir::Dir::openat(
        dir,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(d.iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok().filter(|n| is_part_name(n)).map(str::to_owned))
        .collect())
}

pub fn sanitize_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let mut s: String =
        base.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    s = s.trim_start_matches('.').to_owned();
    s.truncate(180);
    if s.is_empty() { "download".into() } else { s }
}

impl FilesWorker {
    fn send_fd(&self, tag: u64, fd: BorrowedFd<'_>) -> Result<(), String> {
        let ch = self.channel.as_ref().ok_or("no descriptor channel")?;
        fdpass::send_blocking(ch.as_fd(), tag, fd).map_err(|e| format!("cannot pass the descriptor: {e}"))
    }

    fn open_upload(&self, rel: &str, tag: u64) -> FilesReply {
        let refused = |reason: String| FilesReply::Refused { reason };
        let (Some(root), Some(cfg)) = (&self.upload_root, self.config.get()) else {
            return refused("automatic upload is not enabled (SNOWLUMA_MCP_UPLOAD_ROOT is not set)".into());
        };
        if !cfg.upload_enabled {
            return refused("automatic upload is not enabled".into());
        }
        if let Err(r) = check_rel(rel) {
            return refused(r);
        }
        // O_NONBLOCK: opening a FIFO must not hang; cleared below.
        // Look before opening: an O_PATH descriptor opens nothing (no device
        // or FIFO is touched), so its type and link count are checked first.
        let probe = match open_beneath(root.as_fd(), rel, nix::libc::O_PATH, 0) {
            Ok(fd) => fd,
            Err(e) => return refused(io_reason(&e)),
        };
        let before = match nix::sys::stat::fstat(&probe) {
            Ok(st) => st,
            Err(e) => return refused(format!("cannot stat: {e}")),
        };
        if (before.st_mode & nix::libc::S_IFMT) != nix::libc::S_IFREG {
            return refused("not a regular file".into());
        }
        // A hard link inside the root can name a file that lives outside it
        // (path checks cannot see that), so only singly-linked files go.
        if before.st_nlink > 1 {
            return refused(
                "the file has more than one hard link; copy it into the upload root instead (a hard link could name a file outside it)".into(),
            );
        }
        let fd = match open_beneath(root.as_fd(), rel, nix::libc::O_RDONLY | nix::libc::O_NONBLOCK, 0) {
            Ok(fd) => fd,
            Err(e) => return refused(io_reason(&e)),
        };
        let file = std::fs::File::from(fd);
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => return refused(format!("cannot stat: {e}")),
        };
        // The same file as the one looked at (not swapped in between).
        use std::os::unix::fs::MetadataExt;
        if meta.dev() != before.st_dev as u64 || meta.ino() != before.st_ino as u64 || meta.nlink() > 1 {
            return refused("the file changed while it was being opened".into());
        }
        if !meta.file_type().is_file() {
            return refused("not a regular file".into());
        }
        if meta.len() > cfg.max_file_bytes {
            return refused(format!(
                "the file is larger than SNOWLUMA_MCP_MAX_STREAM_BYTES ({} bytes)",
                cfg.max_file_bytes
            ));
        }
        if let Ok(fl) = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL) {
            let fl = nix::fcntl::OFlag::from_bits_truncate(fl) - nix::fcntl::OFlag::O_NONBLOCK;
            let _ = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(fl));
        }
        if let Err(r) = self.send_fd(tag, file.as_fd()) {
            return refused(r);
        }
        let name = rel.rsplit('/').next().unwrap_or(rel).to_owned();
        FilesReply::Opened { size: meta.len(), name }
    }

    fn create_download(&self, tag: u64) -> FilesReply {
        let Some(dir) = &self.download_dir else {
            return FilesReply::Refused { reason: "no download directory".into() };
        };
        let token = snowluma_proto::bytes::hex(&snowluma_proto::bytes::random_bytes::<16>());
        let part = part_name(&token);
        let flags = nix::libc::O_RDWR | nix::libc::O_CREAT | nix::libc::O_EXCL;
        let fd = match open_beneath(dir.as_fd(), &part, flags, 0o600) {
            Ok(fd) => fd,
            Err(e) => return FilesReply::Refused { reason: format!("cannot create a download file: {e}") },
        };
        // The lock lives on the open file description, which every copy of
        // this descriptor shares: it is held while anyone (the executor)
        // still has the file open, and a sweep skips locked `.part` files.
        if let Err(e) = lock_exclusive(fd.as_fd()) {
            let _ = nix::unistd::unlinkat(dir, part.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            return FilesReply::Refused { reason: format!("cannot lock the download file: {e}") };
        }
        if let Err(r) = self.send_fd(tag, fd.as_fd()) {
            let _ = nix::unistd::unlinkat(dir, part.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            return FilesReply::Refused { reason: r };
        }
        FilesReply::Created { token }
    }

    /// The `.part` file of a token, which must be one this worker (or a
    /// predecessor: the name depends on the token alone) handed out.
    fn take_part(&self, token: &str) -> Option<String> {
        is_token(token).then(|| part_name(token))
    }

    fn commit(&self, token: &str, name: &str, size: u64) -> FilesReply {
        let (Some(dir), Some(part)) = (&self.download_dir, self.take_part(token)) else {
            return FilesReply::Refused { reason: "unknown download".into() };
        };
        let unlink = || {
            let _ = nix::unistd::unlinkat(dir, part.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        };
        let actual = nix::sys::stat::fstatat(dir, part.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
        match actual {
            Ok(st) if (st.st_mode & nix::libc::S_IFMT) == nix::libc::S_IFREG && st.st_size as u64 == size => {}
            Ok(_) => {
                unlink();
                return FilesReply::Refused { reason: "the saved file does not have the expected size".into() };
            }
            Err(e) => return FilesReply::Refused { reason: format!("the partial file is gone: {e}") },
        }
        let final_name = format!("{token}-{}", sanitize_name(name));
        let renamed = nix::fcntl::renameat2(
            dir,
            part.as_str(),
            dir,
            final_name.as_str(),
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        );
        match renamed {
            Ok(()) => {
                let _ = nix::unistd::fsync(dir);
                FilesReply::Committed { file_name: final_name }
            }
            Err(e) => {
                unlink();
                FilesReply::Refused { reason: format!("cannot commit the download: {e}") }
            }
        }
    }

    fn abort(&self, token: &str) -> FilesReply {
        if let (Some(dir), Some(part)) = (&self.download_dir, self.take_part(token)) {
            let _ = nix::unistd::unlinkat(dir, part.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        FilesReply::Aborted
    }

    /// Remove our `.part` files that nobody holds open (their lock is free):
    /// left by a session that was killed. Files of live downloads, of this
    /// session or another one sharing the directory, stay.
    fn sweep(&self) -> FilesReply {
        let Some(dir) = &self.download_dir else {
            return FilesReply::Swept { removed: 0 };
        };
        let names = match part_files(dir.as_fd()) {
            Ok(n) => n,
            Err(e) => return FilesReply::Refused { reason: format!("cannot read the download directory: {e}") },
        };
        let mut removed = 0;
        for name in names {
            let Ok(fd) = open_beneath(dir.as_fd(), &name, nix::libc::O_RDONLY | nix::libc::O_NONBLOCK, 0) else {
                continue;
            };
            if lock_exclusive(fd.as_fd()).is_ok()
                && nix::unistd::unlinkat(dir, name.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir).is_ok()
            {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, "removed partial downloads left by an earlier session");
        }
        FilesReply::Swept { removed }
    }

    fn usage(&self) -> FilesReply {
        let Some(dir) = &self.download_dir else {
            return FilesReply::Usage { bytes: 0 };
        };
        let mut total = 0u64;
        // A fresh open of "." beneath the directory (not a dup: the seccomp
        // policy allows openat, not F_DUPFD).
        let listing = nix::dir::Dir::openat(
            dir,
            ".",
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        );
        match listing {
            Ok(mut d) => {
                for entry in d.iter().flatten() {
                    let name = entry.file_name();
                    if name.to_bytes() == b"." || name.to_bytes() == b".." {
                        continue;
                    }
                    if name.to_str().is_ok_and(is_part_name) {
                        continue;
                    }
                    if let Ok(st) = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                        && (st.st_mode & nix::libc::S_IFMT) == nix::libc::S_IFREG
                    {
                        total = total.saturating_add(st.st_size as u64);
                    }
                }
                FilesReply::Usage { bytes: total }
            }
            Err(e) => FilesReply::Refused { reason: format!("cannot read the download directory: {e}") },
        }
    }
}

impl RoleHandler for FilesWorker {
    fn configure(&self, config: WorkerConfig) -> Result<(), String> {
        match config {
            WorkerConfig::Files(cfg) => {
                if cfg.upload_enabled && self.upload_root.is_none() {
                    return Err("upload enabled but no upload root descriptor".into());
                }
                if self.download_dir.is_none() || self.channel.is_none() {
                    return Err("missing the download directory or the descriptor channel".into());
                }
                self.config.set(cfg).map_err(|_| "already configured".to_owned())
            }
            _ => Err("file-transfer worker needs a files configuration".into()),
        }
    }

    async fn handle(&self, request: Request, _ctx: Ctx) -> Reply {
        let Request::Files(req) = request else {
            return Reply::Error(WorkerError::Unsupported);
        };
        Reply::Files(match req {
            FilesRequest::OpenUpload { rel_path, fd_tag } => self.open_upload(&rel_path, fd_tag),
            FilesRequest::CreateDownload { fd_tag } => self.create_download(fd_tag),
            FilesRequest::CommitDownload { token, file_name, size } => self.commit(&token, &file_name, size),
            FilesRequest::AbortDownload { token } => self.abort(&token),
            FilesRequest::DownloadUsage => self.usage(),
            FilesRequest::SweepStaleParts => self.sweep(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert_eq!(sanitize_name("../../etc/passwd"), "passwd");
        assert_eq!(sanitize_name("a b/c:d.png"), "c_d.png");
        assert_eq!(sanitize_name("..."), "download");
        assert_eq!(sanitize_name("图片.jpg"), "__.jpg");
        assert!(check_rel("a/../b").is_err());
        assert!(check_rel("/etc").is_err());
        assert!(check_rel("a//b").is_err());
        assert!(check_rel("dir/file.txt").is_ok());
    }

    #[test]
    fn openat2_refuses_escapes_and_symlinks() {
        let root = std::env::temp_dir().join(format!("files-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("in")).unwrap();
        std::fs::write(root.join("in/ok.txt"), b"x").unwrap();
        std::fs::write(root.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("in/link")).unwrap();
        let dir: OwnedFd = std::fs::File::open(root.join("in")).unwrap().into();
        assert!(open_beneath(dir.as_fd(), "ok.txt", nix::libc::O_RDONLY, 0).is_ok());
        let e = open_beneath(dir.as_fd(), "link", nix::libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ELOOP));
        let e = open_beneath(dir.as_fd(), "../secret", nix::libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EXDEV));
        let _ = std::fs::remove_dir_all(&root);
    }
}
