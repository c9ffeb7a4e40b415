//! The directories the server works in, opened (and created) before
//! confinement and handed to the workers as descriptors: the download
//! directory, the upload root and the task directory. Each must belong to
//! this user and be writable by nobody else.

use std::sync::Arc;

use snowluma_config::{self as config, Config};

#[derive(Debug, thiserror::Error)]
#[error("{var} ({flag}) {problem}")]
pub(crate) struct DirError {
    var: &'static str,
    flag: &'static str,
    problem: String,
}

fn open_dir(path: &std::path::Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)?;
    Ok(f.into())
}

/// The transfer directories, opened before confinement.
pub(crate) struct TransferDirs {
    pub(crate) download_dir: std::path::PathBuf,
    pub(crate) download_fd: Arc<std::os::fd::OwnedFd>,
    pub(crate) upload_root: Option<(std::path::PathBuf, std::path::PathBuf, Arc<std::os::fd::OwnedFd>)>,
}

pub(crate) fn open_transfer_dirs(config: &Config) -> Result<TransferDirs, DirError> {
    let (download_dir, fd) = open_download_dir(config)?;
    let upload_root = match &config.upload_root {
        Some(root) => {
            let (canonical, ufd) = open_upload_root(root)?;
            Some((root.clone(), canonical, Arc::new(ufd)))
        }
        None => None,
    };
    Ok(TransferDirs { download_dir, download_fd: Arc::new(fd), upload_root })
}

/// Create (0700) and open the download directory.
/// The download directory, opened once; the file-transfer worker then works
/// only through the descriptor.
///
/// * Configured (`SNOWLUMA_MCP_STREAM_DIR`): created with its missing
///   parents, each 0700, as the Node server's `mkdir -p` does.
/// * Default ([`config::default_stream_dir`]): `$XDG_RUNTIME_DIR/snowluma-mcp`
///   or `$TMPDIR/snowluma-mcp-<uid>`, then `downloads`, each created 0700 and
///   opened without following a symlink, beneath a base opened first.
///
/// Either way the directory must be owned by this user and writable by
/// nobody else: in a shared `$TMPDIR` another user could otherwise create it
/// first (and fill the quota, or point it elsewhere).
fn open_download_dir(config: &Config) -> Result<(std::path::PathBuf, std::os::fd::OwnedFd), DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_STREAM_DIR", flag: "--stream-dir", problem };
    let (path, fd) = match &config.stream_dir {
        Some(dir) => {
            // `mkdir -p`: what exists is kept (and checked below), what is
            // missing is created 0700, by us.
            match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
                Ok(()) => {}
                Err(e) => return Err(bad(format!("cannot be created: {e}"))),
            }
            let canonical = std::fs::canonicalize(dir).map_err(|e| bad(format!("cannot be resolved: {e}")))?;
            let fd = open_dir(&canonical).map_err(|e| bad(format!("cannot be opened as a directory: {e}")))?;
            (canonical, fd)
        }
        None => {
            let (base, top) = config::default_stream_base();
            let base = std::fs::canonicalize(&base)
                .map_err(|e| bad(format!("(default) cannot use {}: {e}", base.display())))?;
            let base_fd = open_dir(&base).map_err(|e| bad(format!("(default) cannot open {}: {e}", base.display())))?;
            let top_fd = private_subdir(&base_fd, &top, true)
                .map_err(|p| bad(format!("(default) {}: {p}", base.join(&top).display())))?;
            let dir = base.join(&top).join(config::DOWNLOADS_SUBDIR);
            let fd = private_subdir(&top_fd, config::DOWNLOADS_SUBDIR, false)
                .map_err(|p| bad(format!("(default) {}: {p}", dir.display())))?;
            (dir, fd)
        }
    };
    check_owned(&fd, false).map_err(|p| bad(format!("{}: {p}", path.display())))?;
    Ok((path, fd))
}

/// Create (0700) or open `name` beneath `parent` without following a
/// symlink, and check it is ours ([`check_owned`]; `private`: nobody else
/// may even enter it).
fn private_subdir(parent: &std::os::fd::OwnedFd, name: &str, private: bool) -> Result<std::os::fd::OwnedFd, String> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, mkdirat};
    match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(format!("cannot be created: {e}")),
    }
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => {
            "is not a directory (a symbolic link or a file is in its place): remove it, or set SNOWLUMA_MCP_STREAM_DIR"
                .to_owned()
        }
        e => format!("cannot be opened: {e}"),
    })?;
    check_owned(&fd, private)?;
    Ok(fd)
}

/// The directory must belong to this process's user and be writable by
/// nobody else (with `private`, not even readable or searchable).
fn check_owned(fd: &std::os::fd::OwnedFd, private: bool) -> Result<(), String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("cannot be examined: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me {
        return Err(format!(
            "belongs to uid {}, not to this server's user (uid {me}); another user may have created it: remove it, or set SNOWLUMA_MCP_STREAM_DIR",
            st.st_uid
        ));
    }
    let forbidden = if private { 0o077 } else { 0o022 };
    if st.st_mode & forbidden != 0 {
        return Err(format!(
            "has mode {:o}, which lets other users {}; chmod it to 700",
            st.st_mode & 0o777,
            if private { "in" } else { "write into it" }
        ));
    }
    Ok(())
}

/// Create (0700, the last component only) and open the task directory; it
/// must be ours and private.
pub(crate) fn open_task_dir(dir: &std::path::Path) -> Result<std::os::fd::OwnedFd, DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_TASK_DIR", flag: "--task-dir", problem };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(bad(format!("cannot be created: {e}"))),
    }
    let fd = open_dir(dir).map_err(|e| bad(format!("cannot be opened as a directory: {e}")))?;
    check_owned(&fd, true).map_err(|p| bad(p.replace("SNOWLUMA_MCP_STREAM_DIR", "SNOWLUMA_MCP_TASK_DIR")))?;
    Ok(fd)
}

/// Resolve and open the upload root, which must be an existing directory.
fn open_upload_root(root: &std::path::Path) -> Result<(std::path::PathBuf, std::os::fd::OwnedFd), DirError> {
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_UPLOAD_ROOT", flag: "--upload-root", problem };
    let canonical = std::fs::canonicalize(root).map_err(|e| bad(format!("cannot be resolved: {e}")))?;
    let fd = open_dir(&canonical).map_err(|e| bad(format!("must be an existing directory: {e}")))?;
    Ok((canonical, fd))
}
