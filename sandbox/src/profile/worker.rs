//! A worker's confinement, run at the start of `worker_main` while the
//! process is still single-threaded (Landlock and seccomp restrict the
//! calling thread and its future children only).
//!
//! Order: [`prepare_worker`] (process name → close every descriptor but the
//! kept ones ([`crate::role`]) → `RLIMIT_CORE` 0, no capabilities
//! ([`crate::rlimits`]) → no new privileges, not dumpable), then the
//! worker builds its current-thread runtime, then [`confine_worker`] (check
//! single-threaded → Landlock ([`crate::landlock`]) → seccomp
//! ([`crate::seccomp`])). What each role keeps and may do is data in its
//! table, [`crate::role`], and [`crate::policy`]; what was enforced comes back as a [`WorkerReport`].

use std::os::fd::RawFd;

use serde::Serialize;
use snowluma_proto::Role;

use super::ConfineError;
use crate::landlock::{self, Enforcement, LandlockReport};
use crate::role::{self, DirAccess, FdKind};
use crate::{policy, seccomp};

/// The argv element that lets a worker start when confinement cannot be
/// fully enforced (the supervisor passes it only with
/// `SNOWLUMA_MCP_ALLOW_UNCONFINED=1`, or in docs mode on a weak kernel).
pub const UNCONFINED_OK_ARG: &str = "unconfined-ok";
/// The argv prefix carrying the TCP ports the network executor may connect to.
pub const PORTS_ARG_PREFIX: &str = "ports=";

/// What the supervisor grants a worker beyond its role's fixed policy. It
/// reaches the worker before its runtime starts: ports on argv, directory
/// descriptors at fixed numbers ([`role::RoleSpec::fds`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// TCP ports the network executor may connect to (Landlock `ConnectTcp`).
    pub tcp_ports: Vec<u16>,
    /// Directories readable beneath (descriptors held by this process).
    pub read_dir_fds: Vec<RawFd>,
    /// Directories readable and writable beneath.
    pub write_dir_fds: Vec<RawFd>,
    /// Start even if Landlock or seccomp cannot be fully enforced.
    pub allow_unconfined: bool,
}

impl Grants {
    /// Parse the worker's extra argv elements (after the log filter).
    /// Unknown elements are refused, so a typo cannot silently widen nothing
    /// or narrow nothing.
    pub fn from_args(role: Role, args: &[String]) -> Result<Grants, ConfineError> {
        let mut g = Grants::default();
        for a in args {
            if let Some(list) = a.strip_prefix(PORTS_ARG_PREFIX) {
                for p in list.split(',').filter(|p| !p.is_empty()) {
                    let port = p.parse::<u16>().map_err(|_| ConfineError::BadArg(a.clone()))?;
                    g.tcp_ports.push(port);
                }
            } else if a == UNCONFINED_OK_ARG {
                g.allow_unconfined = true;
            } else {
                return Err(ConfineError::BadArg(a.clone()));
            }
        }
        // The role's directory descriptors, as its table grants them.
        for f in role::spec(role).fds {
            let FdKind::Dir(access) = f.kind else { continue };
            // SAFETY: the descriptor is only fstat'ed here (a number the
            // supervisor did not place is simply not a directory), while
            // this single-threaded process holds its inherited descriptors.
            if landlock::is_dir(unsafe { landlock::borrow(f.fd) }) {
                match access {
                    DirAccess::Read => g.read_dir_fds.push(f.fd),
                    DirAccess::ReadWrite => g.write_dir_fds.push(f.fd),
                }
            }
        }
        Ok(g)
    }

    /// The argv elements that carry these grants (the inverse of [`Grants::from_args`]).
    pub fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.tcp_ports.is_empty() {
            let ports: Vec<String> = self.tcp_ports.iter().map(u16::to_string).collect();
            v.push(format!("{PORTS_ARG_PREFIX}{}", ports.join(",")));
        }
        if self.allow_unconfined {
            v.push(UNCONFINED_OK_ARG.to_owned());
        }
        v
    }
}

/// What the supervisor grants its workers, role by role: the argv elements
/// it appends to each worker's command line ([`Grants::to_args`]).
#[derive(Debug, Clone, Default)]
pub struct WorkerGrants {
    /// The endpoint's (and events URL's) TCP ports: the network executor's only destinations.
    pub network_ports: Vec<u16>,
    pub allow_unconfined: bool,
}

impl WorkerGrants {
    /// Extra argv elements for a worker of `role` (after the log filter).
    pub fn args(&self, role: Role) -> Vec<String> {
        let g = Grants {
            tcp_ports: if role::spec(role).connect_tcp { self.network_ports.clone() } else { Vec::new() },
            allow_unconfined: self.allow_unconfined,
            ..Grants::default()
        };
        g.to_args()
    }
}

/// What was enforced on a worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    pub role: &'static str,
    pub landlock: LandlockReport,
    pub seccomp: bool,
    /// Instructions in the installed BPF programs (0 without seccomp).
    pub seccomp_instructions: usize,
    /// Distinct system calls the role may make.
    pub seccomp_allowed_syscalls: usize,
    pub no_new_privs: bool,
    pub dumpable: bool,
    pub rlimit_core_zero: bool,
}

impl WorkerReport {
    pub fn fully_confined(&self) -> bool {
        self.landlock.status == Enforcement::FullyEnforced && self.seccomp && self.no_new_privs && !self.dumpable
    }
}

/// Threads of this process, from /proc/self/status (None if unreadable).
pub fn thread_count() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok())
}

/// First step, at the very start of a worker: name the process, close every
/// descriptor but the kept ones, no core dumps, no new privileges, not
/// dumpable. The caller may then build its current-thread runtime (no
/// thread; its epoll, eventfd and signal socketpair are created here, while
/// `socketpair` is still allowed) and finally call [`confine_worker`].
pub fn prepare_worker(role: Role) -> Result<(), ConfineError> {
    super::prepare(&format!("snowluma-{}", role.as_str()), &role::spec(role).kept_fds())
}

/// Confine the calling worker process according to its role's policy and
/// `grants`: Landlock, then seccomp. The process must be single-threaded
/// and [`prepare_worker`]ed.
pub fn confine_worker(role: Role, grants: &Grants) -> Result<WorkerReport, ConfineError> {
    super::harden_single_threaded()?;
    let mut grant = landlock::Grant { connect_tcp: Vec::new(), fs: Vec::new() };
    let spec = role::spec(role);
    if spec.connect_tcp {
        grant.connect_tcp = grants.tcp_ports.clone();
    }
    // Only the role's table's directories (Grants::from_args found them).
    let has = |fd: &RawFd| spec.fds.iter().any(|f| f.fd == *fd && matches!(f.kind, FdKind::Dir(_)));
    for fd in grants.read_dir_fds.iter().filter(|fd| has(fd)) {
        // SAFETY: the descriptor was checked open (a directory) by
        // Grants::from_args, is kept by close_all_except, and is held open
        // by the worker's claim (crate::role::claim) past confinement.
        grant.fs.push(landlock::FsRule { fd: unsafe { landlock::borrow(*fd) }, access: landlock::read_dir_access() });
    }
    for fd in grants.write_dir_fds.iter().filter(|fd| has(fd)) {
        // SAFETY: as above.
        grant.fs.push(landlock::FsRule { fd: unsafe { landlock::borrow(*fd) }, access: landlock::write_dir_access() });
    }
    let ll = landlock::restrict(&grant)?;
    if ll.status != Enforcement::FullyEnforced && !grants.allow_unconfined {
        return Err(ConfineError::LandlockWeak(ll.status.as_str(), ll.kernel_abi));
    }

    let (seccomp_on, instructions) = match seccomp::apply(role) {
        Ok(n) => (true, n),
        Err(e) if grants.allow_unconfined => {
            tracing::warn!(role = role.as_str(), error = %e, "seccomp not enforced (SNOWLUMA_MCP_ALLOW_UNCONFINED)");
            (false, 0)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(WorkerReport {
        role: role.as_str(),
        landlock: ll,
        seccomp: seccomp_on,
        seccomp_instructions: instructions,
        seccomp_allowed_syscalls: policy::allowed_count(role),
        no_new_privs: true,
        dumpable: false,
        rlimit_core_zero: true,
    })
}
