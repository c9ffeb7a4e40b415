//! The spawner's confinement, run in its child right after the fork from
//! the (still single-threaded, unconfined) supervisor.
//!
//! Workers are exec'ed from the spawner, so they start inside its Landlock
//! domain and seccomp filters and can never have a right it lacks (both
//! only nest). Its domain is therefore the union of its workers' needs and
//! nothing more; see [`confine_spawner`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{ConfineError, SupervisorReport, open};
use crate::fds::SPAWNER_EXE_FD;
use crate::landlock::{self as ll, FsRule, Grant};
use crate::{rlimits, seccomp};

/// What the spawner is granted: its workers' union.
#[derive(Debug, Clone, Default)]
pub struct SpawnerGrants<'a> {
    /// TCP ports it (and the network executor) may connect to: the endpoint's.
    pub tcp_ports: Vec<u16>,
    /// Directories readable beneath (the upload root).
    pub read_dirs: Vec<BorrowedFd<'a>>,
    /// Directories readable and writable beneath (the download directory).
    pub write_dirs: Vec<BorrowedFd<'a>>,
    /// Start even if Landlock or seccomp cannot be fully enforced.
    pub allow_unconfined: bool,
}

/// This binary's ELF interpreter, if it has one (for `doctor`'s probes).
pub fn own_interpreter() -> Option<String> {
    std::fs::File::open("/proc/self/exe").ok().as_ref().and_then(elf_interpreter)
}

/// The ELF interpreter (`PT_INTERP`) of the binary behind `exe`, if any.
fn elf_interpreter(exe: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut h = [0u8; 64];
    exe.read_exact_at(&mut h, 0).ok()?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None; // only 64-bit little-endian is handled
    }
    let phoff = u64::from_le_bytes(h[0x20..0x28].try_into().ok()?);
    let phentsize = u64::from(u16::from_le_bytes(h[0x36..0x38].try_into().ok()?));
    let phnum = u64::from(u16::from_le_bytes(h[0x38..0x3a].try_into().ok()?));
    for i in 0..phnum.min(256) {
        let mut ph = [0u8; 56];
        exe.read_exact_at(&mut ph, phoff + i * phentsize).ok()?;
        if u32::from_le_bytes(ph[0..4].try_into().ok()?) == 3 {
            let off = u64::from_le_bytes(ph[8..16].try_into().ok()?);
            let size = u64::from_le_bytes(ph[32..40].try_into().ok()?).min(4096);
            let mut buf = vec![0u8; usize::try_from(size).ok()?];
            exe.read_exact_at(&mut buf, off).ok()?;
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            return String::from_utf8(buf[..end].to_vec()).ok();
        }
    }
    None
}

/// Every file mapped into this process (the binary, its ELF interpreter and
/// its shared libraries): exactly what executing this binary again loads.
fn mapped_files() -> Vec<String> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return Vec::new() };
    let mut files: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .map(str::to_owned)
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Confine the (single-threaded) spawner, in its child right after the fork.
///
/// * files: execute this binary (placed at [`SPAWNER_EXE_FD`], the only
///   descriptor `execveat` accepts) and its ELF interpreter; read the
///   libraries mapped now (what the exec loads) and `/etc/ld.so.cache`;
///   read and write `/dev/null` (the workers' stdin and stdout); read
///   beneath `read_dirs` (the upload root) and write beneath `write_dirs`
///   (the download directory). Nothing else: not `/etc/shadow`, not `/proc`.
/// * network: TCP connect to `tcp_ports` (the endpoint's); no bind.
/// * no capabilities (bounding, permitted, effective, inheritable and
///   ambient sets emptied), no new privileges, not dumpable, no core dumps.
/// * seccomp: [`crate::policy::SPAWNER_DENY`] kills,
///   [`crate::policy::SPAWNER_REFUSED`] is answered `EACCES` (exec of
///   anything else, memfd, non-TCP sockets).
///
/// Without `allow_unconfined`, a Landlock domain that is not fully enforced
/// is refused ([`ConfineError::LandlockWeak`]) and a missing seccomp is an
/// error; with it, both are reported instead.
pub fn confine_spawner(grants: &SpawnerGrants<'_>) -> Result<SupervisorReport, ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)?;
    nix::sys::prctl::set_dumpable(false)?;
    nix::sys::prctl::set_no_new_privs()?;
    rlimits::drop_capabilities()?;
    let exe_file = std::fs::File::open("/proc/self/exe")
        .map_err(|source| ConfineError::Open { what: "/proc/self/exe", source })?;
    let interp = elf_interpreter(&exe_file);
    place_exe(&exe_file)?;
    drop(exe_file);
    // SAFETY: place_exe just installed this descriptor; it stays open for
    // the life of the spawner (it is never closed by number).
    let exe = unsafe { BorrowedFd::borrow_raw(SPAWNER_EXE_FD) };
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|source| ConfineError::Open { what: "/dev/null", source })?;
    let interp_fd = match &interp {
        Some(p) => Some(open(p, "the ELF interpreter")?),
        None => None,
    };
    // The libraries, opened now (a file that cannot be opened is skipped:
    // the exec then fails loudly rather than the spawner widening its grant).
    let libs: Vec<OwnedFd> = mapped_files()
        .into_iter()
        .chain(std::iter::once("/etc/ld.so.cache".to_owned()))
        .filter_map(|p| std::fs::File::open(p).ok())
        .filter(|f| f.metadata().map(|m| m.is_file()).unwrap_or(false))
        .map(OwnedFd::from)
        .collect();
    let mut fs = vec![
        FsRule { fd: exe, access: landlock::AccessFs::Execute | landlock::AccessFs::ReadFile },
        FsRule { fd: devnull.as_fd(), access: landlock::AccessFs::ReadFile | landlock::AccessFs::WriteFile },
    ];
    if let Some(fd) = &interp_fd {
        fs.push(FsRule { fd: fd.as_fd(), access: landlock::AccessFs::Execute | landlock::AccessFs::ReadFile });
    }
    for fd in &libs {
        fs.push(FsRule { fd: fd.as_fd(), access: landlock::AccessFs::ReadFile.into() });
    }
    for fd in &grants.read_dirs {
        fs.push(FsRule { fd: *fd, access: ll::read_dir_access() });
    }
    for fd in &grants.write_dirs {
        fs.push(FsRule { fd: *fd, access: ll::write_dir_access() });
    }
    let landlock = ll::restrict(&Grant { fs, connect_tcp: grants.tcp_ports.clone() })?;
    super::finish("spawner", landlock, seccomp::apply_spawner, grants.allow_unconfined)
}

/// Put the executable at [`SPAWNER_EXE_FD`] (close-on-exec), which must be
/// free.
fn place_exe(exe: &std::fs::File) -> Result<(), ConfineError> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFD on a number only reports whether it is open.
    if unsafe { nix::libc::fcntl(SPAWNER_EXE_FD, nix::libc::F_GETFD) } >= 0 {
        return Err(ConfineError::Open {
            what: "the executable's descriptor",
            source: std::io::Error::other(format!("descriptor {SPAWNER_EXE_FD} is already in use")),
        });
    }
    // SAFETY: dup3 onto a number checked free just above, in this
    // single-threaded process; the new descriptor is owned by the spawner.
    if unsafe { nix::libc::dup3(exe.as_raw_fd(), SPAWNER_EXE_FD, nix::libc::O_CLOEXEC) } < 0 {
        return Err(ConfineError::Open {
            what: "the executable's descriptor",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
