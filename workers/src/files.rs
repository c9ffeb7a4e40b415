//! The file-transfer worker: the only process that opens files under the
//! upload root (read) and the download directory (read-write).
//!
//! It opens nothing by path: the supervisor hands it the two directories as
//! descriptors (its role's table, `snowluma_sandbox::role::FILES`), and every
//! open is relative to them with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so `..`, absolute paths and
//! symlinks are refused by the kernel there, and a file swapped for a
//! symlink between any check and the open cannot be followed (there is no
//! separate check: the descriptor is opened once and `fstat`ed).
//!
//! An upload's input file is resolved as the Node server's `realpath`
//! resolves it ([`FilesWorker::open_upload`]): symlinks on its path are
//! followed one at a time, each read from an `O_PATH` descriptor of the link
//! itself, as long as the resolved path stays beneath the root; then the
//! resolved path, which names no symlink and no `..`, is opened with the
//! flags above. Whatever changes meanwhile, only a file beneath the root
//! can be opened.
//! Opened files travel to the supervisor as descriptors on the fd channel;
//! their bytes never pass through this worker or the supervisor.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use snowluma_proto::fdpass;
use snowluma_proto::{FilesConfig, FilesReply, FilesRequest, Reply, Request, UploadRefusal, WorkerConfig, WorkerError};
use snowluma_sandbox::role::{Claimed, Slot};

use crate::serve::{Ctx, RoleHandler};

pub struct FilesWorker {
    config: OnceLock<FilesConfig>,
    upload_root: Option<OwnedFd>,
    download_dir: Option<OwnedFd>,
    channel: Option<OwnedFd>,
}

impl FilesWorker {
    /// Takes its descriptors from the worker's claim (`worker_main`).
    pub fn from_claimed(claimed: &mut Claimed) -> FilesWorker {
        FilesWorker {
            config: OnceLock::new(),
            upload_root: claimed.take(Slot::UploadRoot),
            download_dir: claimed.take(Slot::DownloadDir),
            channel: claimed.take(Slot::FdChannel),
        }
    }
}

/// `openat2` beneath `dir`, refusing symlinks and escapes (`O_CLOEXEC` and
/// `O_NOFOLLOW` are added to `flags`).
fn open_beneath(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: u32) -> std::io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(nix::sys::stat::Mode::from_bits_truncate(mode))
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(dir, rel, how).map_err(std::io::Error::from)
}

/// Whether this kernel (and whatever seccomp filter surrounds this process)
/// provides `openat2`, which every file transfer needs (`doctor` reports it).
pub fn openat2_available() -> bool {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH);
    !matches!(nix::fcntl::openat2(nix::fcntl::AT_FDCWD, ".", how), Err(nix::errno::Errno::ENOSYS))
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

/// Symlinks followed while resolving one upload path at most (the kernel's
/// own limit).
const MAX_UPLOAD_SYMLINKS: u32 = 40;

/// Resolve `path` (components relative to the upload root) as Node's
/// `realpath` does, beneath `root`: each prefix is opened `O_PATH` without
/// following anything (`RESOLVE_NO_SYMLINKS`); a directory is walked into, a
/// symlink is read from its own descriptor and replaced by its target (an
/// absolute one must lie beneath one of `roots`; a relative one is joined to
/// its directory), and the whole path is normalized again, as text, before
/// the walk starts over. Returns the resolved components, which name no
/// symlink, and the file type of the last one at the time it was looked at.
fn resolve_upload(
    root: BorrowedFd<'_>,
    mut path: Vec<OsString>,
    roots: &[&Path],
) -> Result<(Vec<OsString>, nix::libc::mode_t), UploadRefusal> {
    let shown = |parts: &[OsString]| parts.iter().collect::<PathBuf>().to_string_lossy().into_owned();
    let lookup = |errno: i32, syscall: &str, parts: &[OsString]| UploadRefusal::Lookup {
        errno,
        syscall: syscall.to_owned(),
        rel_path: shown(parts),
    };
    let mut links = 0u32;
    let mut i = 0usize;
    loop {
        if path.is_empty() {
            return Err(UploadRefusal::Outside);
        }
        let prefix: PathBuf = path[..=i].iter().collect();
        let fd = match open_beneath(root, &prefix, OFlag::O_PATH, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSYS) => return Err(UploadRefusal::NoOpenat2),
            Err(e) => return Err(lookup(e.raw_os_error().unwrap_or(nix::libc::EIO), "lstat", &path[..=i])),
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| lookup(e as i32, "lstat", &path[..=i]))?;
        let kind = st.st_mode & nix::libc::S_IFMT;
        let last = i + 1 == path.len();
        if kind == nix::libc::S_IFLNK {
            links += 1;
            if links > MAX_UPLOAD_SYMLINKS {
                return Err(lookup(nix::libc::ELOOP, "stat", &path[..=i]));
            }
            // The link's own target: read from this descriptor, so a link
            // swapped meanwhile is either this one or not followed at all.
            let target = nix::fcntl::readlinkat(&fd, "").map_err(|e| lookup(e as i32, "readlink", &path[..=i]))?;
            let target = PathBuf::from(target);
            let mut next = if target.is_absolute() {
                target
            } else {
                // Relative to the link's directory, beneath the canonical root.
                let mut p = roots.first().map(|r| r.to_path_buf()).unwrap_or_default();
                p.extend(&path[..i]);
                p.push(target);
                p
            };
            next.extend(&path[i + 1..]);
            path = crate::upload_path::beneath(&next, roots).ok_or(UploadRefusal::Outside)?;
            i = 0;
            continue;
        }
        if last {
            return Ok((path, kind));
        }
        if kind != nix::libc::S_IFDIR {
            // Node's realpath looks at the next component and fails there.
            return Err(lookup(nix::libc::ENOTDIR, "lstat", &path[..=i + 1]));
        }
        i += 1;
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

/// Our download tokens: a random (version 4) UUID in lowercase, as the
/// Node server names its downloads (`<uuid>-<file name>`).
fn is_token(token: &str) -> bool {
    token.len() == 36
        && token.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// A new download token: 122 random bits as a version 4 UUID.
fn new_token() -> String {
    let mut b = snowluma_proto::bytes::random_bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = snowluma_proto::bytes::hex(&b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
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

    /// Open an upload's input file (`rel`: relative to the root, lexically
    /// normalized by the supervisor): resolved as Node's `realpath` would
    /// ([`resolve_upload`]), opened beneath the root, checked on the open
    /// descriptor, and passed on under `tag`.
    fn open_upload(&self, rel: &str, tag: u64) -> FilesReply {
        let refused = |r: UploadRefusal| FilesReply::UploadRefused(r);
        let (Some(root), Some(cfg)) = (&self.upload_root, self.config.get()) else {
            return refused(UploadRefusal::NotEnabled);
        };
        if !cfg.upload_enabled || cfg.upload_root_paths.is_empty() {
            return refused(UploadRefusal::NotEnabled);
        }
        // The supervisor sends only normalized paths beneath the root.
        if check_rel(rel).is_err() {
            return refused(UploadRefusal::Outside);
        }
        let roots: Vec<&Path> = cfg.upload_root_paths.iter().map(Path::new).collect();
        let start: Vec<OsString> = rel.split('/').map(OsString::from).collect();
        let (resolved, kind) = match resolve_upload(root.as_fd(), start, &roots) {
            Ok(r) => r,
            Err(r) => return refused(r),
        };
        // Nothing but a regular file is ever opened (a FIFO, socket or device
        // is refused on its O_PATH descriptor, untouched); the type is checked
        // again on the opened descriptor, which is what counts.
        if kind != nix::libc::S_IFREG {
            return refused(UploadRefusal::NotRegular);
        }
        let path: PathBuf = resolved.iter().collect();
        let shown = || path.to_string_lossy().into_owned();
        // O_NONBLOCK: a FIFO swapped in meanwhile must not hang the open; cleared below.
        let fd = match open_beneath(root.as_fd(), &path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSYS) => return refused(UploadRefusal::NoOpenat2),
            Err(e) => {
                return refused(UploadRefusal::Open {
                    errno: e.raw_os_error().unwrap_or(nix::libc::EIO),
                    rel_path: shown(),
                });
            }
        };
        let st = match nix::sys::stat::fstat(&fd) {
            Ok(st) => st,
            Err(e) => return refused(UploadRefusal::Open { errno: e as i32, rel_path: shown() }),
        };
        if (st.st_mode & nix::libc::S_IFMT) != nix::libc::S_IFREG {
            return refused(UploadRefusal::NotRegular);
        }
        // A hard link inside the root can name a file that lives outside it
        // (no path resolution can see that), so only singly-linked files go.
        if st.st_nlink > 1 {
            return refused(UploadRefusal::HardLinks);
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > cfg.max_file_bytes {
            return refused(UploadRefusal::TooLarge { limit: cfg.max_file_bytes });
        }
        if let Ok(fl) = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL) {
            let fl = OFlag::from_bits_truncate(fl) - OFlag::O_NONBLOCK;
            let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(fl));
        }
        if let Err(r) = self.send_fd(tag, fd.as_fd()) {
            return refused(UploadRefusal::Failed(r));
        }
        // Node names the upload after the resolved file.
        let name = resolved.last().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        FilesReply::Opened { size, name }
    }

    fn create_download(&self, tag: u64) -> FilesReply {
        let Some(dir) = &self.download_dir else {
            return FilesReply::Refused { reason: "no download directory".into() };
        };
        let token = new_token();
        let part = part_name(&token);
        let flags = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL;
        let fd = match open_beneath(dir.as_fd(), Path::new(&part), flags, 0o600) {
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
            let Ok(fd) = open_beneath(dir.as_fd(), Path::new(&name), OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0) else {
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
        assert!(open_beneath(dir.as_fd(), Path::new("ok.txt"), OFlag::O_RDONLY, 0).is_ok());
        let e = open_beneath(dir.as_fd(), Path::new("link"), OFlag::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ELOOP));
        let e = open_beneath(dir.as_fd(), Path::new("../secret"), OFlag::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EXDEV));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn upload_paths_resolve_like_realpath_beneath_the_root() {
        let base = std::env::temp_dir().join(format!("files-resolve-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub/deep")).unwrap();
        std::fs::write(root.join("small.txt"), b"x").unwrap();
        std::fs::write(root.join("sub/deep/f"), b"y").unwrap();
        std::fs::write(base.join("secret"), b"s").unwrap();
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        link(Path::new("small.txt"), "rel-link");
        link(&root.join("small.txt"), "abs-link");
        link(Path::new("sub/deep"), "dir-link");
        link(Path::new("../secret"), "escape-rel");
        link(&base.join("secret"), "escape-abs");
        link(Path::new("loop"), "loop");
        link(Path::new("."), "self");
        std::os::unix::fs::symlink(Path::new("../../small.txt"), root.join("sub/deep/up")).unwrap();
        let fd: OwnedFd = std::fs::File::open(&root).unwrap().into();
        let roots = [root.as_path()];
        let resolve = |rel: &str| {
            resolve_upload(fd.as_fd(), rel.split('/').map(OsString::from).collect(), &roots)
                .map(|(p, kind)| (p.iter().collect::<PathBuf>().display().to_string(), kind))
        };
        let file = |p: &str| Ok((p.to_owned(), nix::libc::S_IFREG));
        assert_eq!(resolve("small.txt"), file("small.txt"));
        assert_eq!(resolve("rel-link"), file("small.txt"));
        assert_eq!(resolve("abs-link"), file("small.txt"));
        assert_eq!(resolve("dir-link/f"), file("sub/deep/f"));
        assert_eq!(resolve("sub/deep/up"), file("small.txt"));
        assert_eq!(resolve("self/small.txt"), file("small.txt"));
        assert_eq!(resolve("sub").map(|r| r.1), Ok(nix::libc::S_IFDIR));
        assert_eq!(resolve("escape-rel"), Err(UploadRefusal::Outside));
        assert_eq!(resolve("escape-abs"), Err(UploadRefusal::Outside));
        assert_eq!(resolve("self"), Err(UploadRefusal::Outside));
        let lookup = |errno, syscall: &str, rel: &str| {
            Err(UploadRefusal::Lookup { errno, syscall: syscall.into(), rel_path: rel.into() })
        };
        assert_eq!(resolve("missing/x"), lookup(nix::libc::ENOENT, "lstat", "missing"));
        assert_eq!(resolve("small.txt/x"), lookup(nix::libc::ENOTDIR, "lstat", "small.txt/x"));
        assert_eq!(resolve("loop"), lookup(nix::libc::ELOOP, "stat", "loop"));
        let _ = std::fs::remove_dir_all(&base);
    }
}
