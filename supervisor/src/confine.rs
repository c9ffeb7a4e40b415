//! The supervisor's own confinement, the startup gate for weak kernels, and
//! the grants each worker receives on its command line.
//!
//! The supervisor confines itself after the configuration is parsed and the
//! audit log is open, before its runtime starts (so before any thread):
//! `RLIMIT_CORE` 0, not dumpable, no new privileges, and a Landlock domain
//! that lets it read files but write none except `/dev/null` (workers'
//! stdin/stdout), execute only its own binary (and the ELF interpreter the
//! kernel loads with it), make no TCP connection or bind, and signal no
//! process outside its domain. Workers are created after that, so they start
//! inside the supervisor's domain and nest their own: the supervisor may
//! still signal (stop) them, they may not signal it or each other.
//!
//! `SNOWLUMA_MCP_ALLOW_UNCONFINED=1` is the operator's explicit opt-out for
//! kernels that cannot enforce all of this: without it, read and write
//! modes refuse to start there; docs mode starts with a warning.

use std::os::fd::BorrowedFd;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;

use serde_json::{Value, json};
use snowluma_proto::Role;
use snowluma_workers::confine::landlock::{self as ll, Enforcement, FsRule, Grant, LandlockReport};
use snowluma_workers::confine::{Grants, policy};

use crate::config::{Config, Mode};

pub const ALLOW_UNCONFINED_VAR: &str = "SNOWLUMA_MCP_ALLOW_UNCONFINED";

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("opening {what}: {source}")]
    Open { what: &'static str, source: std::io::Error },
    #[error(transparent)]
    Landlock(#[from] ll::LandlockError),
    #[error("prctl/setrlimit: {0}")]
    Sys(#[from] nix::Error),
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// What this kernel can enforce.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Support {
    pub landlock_abi: i32,
    pub seccomp: bool,
}

impl Support {
    pub fn detect() -> Support {
        // PR_GET_SECCOMP answers (0, or 2 when a filter such as systemd's
        // SystemCallFilter= is already installed) wherever seccomp exists;
        // /proc/sys may be hidden (systemd ProcSubset=pid), so it is not read.
        // SAFETY: PR_GET_SECCOMP takes no pointers and only reports state.
        let seccomp = unsafe { nix::libc::prctl(nix::libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
        Support { landlock_abi: ll::kernel_abi(), seccomp }
    }
    pub fn full(&self) -> bool {
        ll::predicted(self.landlock_abi) == Enforcement::FullyEnforced && self.seccomp
    }
}

/// `SNOWLUMA_MCP_ALLOW_UNCONFINED`: only `1` or `true` opt out.
pub fn opt_out_from_env() -> bool {
    std::env::var(ALLOW_UNCONFINED_VAR).map(|v| v == "1" || v.eq_ignore_ascii_case("true")).unwrap_or(false)
}

/// The startup gate. `Ok(true)`: workers may start degraded (argv
/// `unconfined-ok`); `Ok(false)`: full confinement required; `Err`: refuse.
pub fn gate(mode: Mode, support: Support, opt_out: bool) -> Result<bool, String> {
    if support.full() {
        return Ok(opt_out);
    }
    let what = format!(
        "this kernel cannot fully enforce confinement (Landlock ABI {} of {} needed, seccomp {})",
        support.landlock_abi,
        ll::PINNED_ABI_NUMBER,
        if support.seccomp { "available" } else { "unavailable" }
    );
    if opt_out {
        tracing::warn!("{what}; running anyway because {ALLOW_UNCONFINED_VAR}=1");
        return Ok(true);
    }
    match mode {
        Mode::Docs => {
            tracing::warn!("{what}; docs mode starts anyway (it executes nothing)");
            Ok(true)
        }
        Mode::Read | Mode::Write => Err(format!(
            "{what}; {} mode refuses to start. Set {ALLOW_UNCONFINED_VAR}=1 to run with weaker confinement",
            mode.as_str()
        )),
    }
}

/// What each worker role is granted on its command line.
#[derive(Debug, Clone, Default)]
pub struct WorkerGrants {
    /// The endpoint's (and events URL's) TCP ports: the network executor's only destinations.
    pub network_ports: Vec<u16>,
    pub allow_unconfined: bool,
}

impl WorkerGrants {
    pub fn from_config(config: &Config, allow_unconfined: bool) -> WorkerGrants {
        // Validated at startup; the events port only when events are configured.
        let http = config.endpoint.as_deref().and_then(|e| crate::config::http_endpoint(e).ok());
        let events = config.events_url.as_deref().and_then(|e| crate::config::events_endpoint(e).ok());
        let mut ports: Vec<u16> = [http, events].into_iter().flatten().map(|e| e.port).collect();
        ports.sort_unstable();
        ports.dedup();
        WorkerGrants { network_ports: ports, allow_unconfined }
    }

    /// Extra argv elements for a worker of `role` (after the log filter).
    pub fn args(&self, role: Role) -> Vec<String> {
        let g = Grants {
            tcp_ports: if role == Role::Network { self.network_ports.clone() } else { Vec::new() },
            allow_unconfined: self.allow_unconfined,
            ..Grants::default()
        };
        g.to_args()
    }
}

/// The supervisor's own confinement report.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SupervisorReport {
    pub landlock: LandlockReport,
    pub seccomp: bool,
    pub no_new_privs: bool,
    pub dumpable: bool,
    pub rlimit_core_zero: bool,
    /// Every capability set is empty after confinement.
    pub capabilities: &'static str,
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

fn open(path: &str, what: &'static str) -> Result<OwnedFd, ConfineError> {
    std::fs::File::open(path).map(OwnedFd::from).map_err(|source| ConfineError::Open { what, source })
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
/// Workers are exec'ed from the spawner, so they start inside its Landlock
/// domain and seccomp filters and can never have a right it lacks (both
/// only nest). Its domain is therefore the union of its workers' needs and
/// nothing more:
///
/// * files: execute this binary (placed at [`policy::SPAWNER_EXE_FD`], the
///   only descriptor `execveat` accepts) and its ELF interpreter; read the
///   libraries mapped now (what the exec loads) and `/etc/ld.so.cache`;
///   read and write `/dev/null` (the workers' stdin and stdout); read
///   beneath `read_dirs` (the upload root) and write beneath `write_dirs`
///   (the download directory). Nothing else: not `/etc/shadow`, not `/proc`.
/// * network: TCP connect to `tcp_ports` (the endpoint's); no bind.
/// * no capabilities (bounding, permitted, effective, inheritable and
///   ambient sets emptied), no new privileges, not dumpable, no core dumps.
/// * seccomp: [`policy::SPAWNER_DENY`] kills, [`policy::SPAWNER_REFUSED`]
///   is answered `EACCES` (exec of anything else, memfd, non-TCP sockets).
///
/// `allow_unconfined`: a missing seccomp is reported instead of an error.
pub fn confine_spawner(
    tcp_ports: &[u16],
    read_dirs: &[BorrowedFd<'_>],
    write_dirs: &[BorrowedFd<'_>],
    allow_unconfined: bool,
) -> Result<SupervisorReport, ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)?;
    nix::sys::prctl::set_dumpable(false)?;
    nix::sys::prctl::set_no_new_privs()?;
    snowluma_workers::confine::rlimits::drop_capabilities()?;
    let exe_file = std::fs::File::open("/proc/self/exe")
        .map_err(|source| ConfineError::Open { what: "/proc/self/exe", source })?;
    let interp = elf_interpreter(&exe_file);
    place_exe(&exe_file)?;
    drop(exe_file);
    // SAFETY: place_exe just installed this descriptor; it stays open for
    // the life of the spawner (it is never closed by number).
    let exe = unsafe { BorrowedFd::borrow_raw(policy::SPAWNER_EXE_FD) };
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
    for fd in read_dirs {
        fs.push(FsRule { fd: *fd, access: ll::read_dir_access() });
    }
    for fd in write_dirs {
        fs.push(FsRule { fd: *fd, access: ll::write_dir_access() });
    }
    let landlock = ll::restrict(&Grant { fs, connect_tcp: tcp_ports.to_vec() })?;
    let seccomp = match snowluma_workers::confine::seccomp::apply_spawner() {
        Ok(_) => true,
        Err(_) if allow_unconfined => false,
        Err(e) => return Err(ConfineError::Seccomp(e.to_string())),
    };
    Ok(SupervisorReport {
        landlock,
        seccomp,
        no_new_privs: true,
        dumpable: false,
        rlimit_core_zero: true,
        capabilities: "none",
    })
}

/// Put the executable at [`policy::SPAWNER_EXE_FD`] (close-on-exec), which
/// must be free.
fn place_exe(exe: &std::fs::File) -> Result<(), ConfineError> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFD on a number only reports whether it is open.
    if unsafe { nix::libc::fcntl(policy::SPAWNER_EXE_FD, nix::libc::F_GETFD) } >= 0 {
        return Err(ConfineError::Open {
            what: "the executable's descriptor",
            source: std::io::Error::other(format!("descriptor {} is already in use", policy::SPAWNER_EXE_FD)),
        });
    }
    // SAFETY: dup3 onto a number checked free just above, in this
    // single-threaded process; the new descriptor is owned by the spawner.
    if unsafe { nix::libc::dup3(exe.as_raw_fd(), policy::SPAWNER_EXE_FD, nix::libc::O_CLOEXEC) } < 0 {
        return Err(ConfineError::Open {
            what: "the executable's descriptor",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Confine the supervisor proper, after the spawner was forked: it starts
/// no process (the spawner does), so it keeps no capability and its domain
/// grants no exec, no TCP and
/// no writes — only reading files (nothing it needs is written by path: the
/// audit log and its key were opened before this).
pub fn confine_supervisor() -> Result<SupervisorReport, ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)?;
    nix::sys::prctl::set_dumpable(false)?;
    nix::sys::prctl::set_no_new_privs()?;
    snowluma_workers::confine::rlimits::drop_capabilities()?;
    let root = open("/", "/")?;
    let fs = vec![FsRule { fd: root.as_fd(), access: ll::read_dir_access() }];
    let landlock = ll::restrict(&Grant { fs, connect_tcp: Vec::new() })?;
    Ok(SupervisorReport {
        landlock,
        seccomp: false,
        no_new_privs: true,
        dumpable: false,
        rlimit_core_zero: true,
        capabilities: "none",
    })
}

static SUMMARY: OnceLock<Value> = OnceLock::new();

/// Record what is enforced, for `get_runtime_info`. Workers that start
/// confine themselves with the same pinned policy on the same kernel and
/// refuse to start if they cannot reach full enforcement without the
/// opt-out, so each running worker's state follows from the kernel's support.
pub fn record(support: Support, supervisor: Option<&SupervisorReport>, degraded_ok: bool, roles: &[Role]) {
    let role_entry = |r: Role| {
        json!({
            "landlock": {
                "abi": support.landlock_abi,
                "pinned_abi": ll::PINNED_ABI_NUMBER,
                "status": ll::predicted(support.landlock_abi).as_str(),
            },
            "seccomp": support.seccomp,
            "seccomp_allowed_syscalls": policy::allowed_count(r),
            "no_new_privs": true,
            "dumpable": false,
        })
    };
    let mut workers = serde_json::Map::new();
    for r in roles {
        workers.insert(r.as_str().into(), role_entry(*r));
    }
    let sup = match supervisor {
        Some(s) => json!({
            "landlock": {"abi": s.landlock.kernel_abi, "pinned_abi": ll::PINNED_ABI_NUMBER, "status": s.landlock.status.as_str()},
            "seccomp": s.seccomp,
            "no_new_privs": s.no_new_privs,
            "dumpable": s.dumpable,
        }),
        None => json!({"landlock": {"abi": support.landlock_abi, "status": "not_enforced"}, "seccomp": false}),
    };
    let _ = SUMMARY.set(json!({
        "fully_enforced": support.full() && supervisor.is_some_and(|s| s.landlock.status == Enforcement::FullyEnforced),
        "unconfined_allowed": degraded_ok,
        "supervisor": sup,
        "workers": Value::Object(workers),
    }));
}

/// The `confinement` object of `get_runtime_info`.
pub fn summary() -> Value {
    SUMMARY.get().cloned().unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_kernels_refuse_read_and_write_without_opt_out() {
        let weak = Support { landlock_abi: 3, seccomp: true };
        assert!(gate(Mode::Read, weak, false).is_err());
        assert!(gate(Mode::Write, weak, false).is_err());
        assert_eq!(gate(Mode::Docs, weak, false), Ok(true));
        assert_eq!(gate(Mode::Write, weak, true), Ok(true));
        let full = Support { landlock_abi: 7, seccomp: true };
        assert_eq!(gate(Mode::Write, full, false), Ok(false));
        let no_seccomp = Support { landlock_abi: 7, seccomp: false };
        assert!(gate(Mode::Read, no_seccomp, false).is_err());
    }
}
