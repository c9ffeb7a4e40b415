//! One entry point per process profile, each running that process's whole
//! confinement sequence (rlimits, capabilities, no new privileges, not
//! dumpable, Landlock, seccomp):
//!
//! * [`supervisor::confine_supervisor`], from the supervisor's `main`;
//! * [`spawner::confine_spawner`], in the spawner right after its fork;
//! * [`http::prepare_http_front`] then [`http::confine_http_front`], from the
//!   HTTP front of `serve-http`;
//! * [`worker::prepare_worker`] then [`worker::confine_worker`], from each
//!   worker's `worker_main`.
//!
//! The escape probes ([`crate::probe`]) confine themselves through the same
//! functions, so `doctor` tests exactly what runs in service.

pub mod http;
pub mod spawner;
pub mod supervisor;
pub mod worker;

use std::os::fd::{OwnedFd, RawFd};

use crate::landlock::{LandlockError, LandlockReport, PINNED_ABI_NUMBER};
use crate::seccomp::SeccompError;
use crate::{fds, rlimits};

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("prctl({what}) failed: {source}")]
    Prctl { what: &'static str, source: nix::Error },
    #[error("unexpected worker argument {0:?}")]
    BadArg(String),
    #[error("closing inherited descriptors: {0}")]
    Fds(nix::Error),
    #[error("setting RLIMIT_CORE: {0}")]
    Rlimit(nix::Error),
    #[error("the process has {0} threads; confinement needs exactly one")]
    Threads(usize),
    #[error(transparent)]
    Landlock(#[from] LandlockError),
    #[error(
        "Landlock is {0} on this kernel (ABI {1}, need {need}); set SNOWLUMA_MCP_ALLOW_UNCONFINED=1 to run anyway",
        need = PINNED_ABI_NUMBER
    )]
    LandlockWeak(&'static str, i32),
    /// A worker's filter could not be installed.
    #[error("{0}; set SNOWLUMA_MCP_ALLOW_UNCONFINED=1 to run anyway")]
    Seccomp(#[from] SeccompError),
    /// The supervisor's or the spawner's filter could not be installed.
    #[error("seccomp: {0}")]
    SeccompNotInstalled(SeccompError),
    #[error("opening {what}: {source}")]
    Open { what: &'static str, source: std::io::Error },
    #[error("prctl/setrlimit: {0}")]
    Sys(#[from] nix::Error),
}

/// What was enforced on the supervisor or the spawner.
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

/// The common end of the supervisor's and the spawner's sequence: refuse a
/// weak Landlock domain unless the operator opted out, install the seccomp
/// filters (`install`; a failure is logged and reported with the opt-out,
/// an error without it), and the report.
fn finish(
    who: &str,
    landlock: LandlockReport,
    install: impl FnOnce() -> Result<usize, SeccompError>,
    allow_unconfined: bool,
) -> Result<SupervisorReport, ConfineError> {
    if landlock.status != crate::landlock::Enforcement::FullyEnforced && !allow_unconfined {
        return Err(ConfineError::LandlockWeak(landlock.status.as_str(), landlock.kernel_abi));
    }
    let seccomp = match install() {
        Ok(_) => true,
        Err(e) if allow_unconfined => {
            tracing::warn!(error = %e, "the {who}'s seccomp filter is not installed; continuing ({})", crate::support::ALLOW_UNCONFINED_VAR);
            false
        }
        Err(e) => return Err(ConfineError::SeccompNotInstalled(e)),
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

/// The first step of a re-executed process (a worker, the HTTP front), at
/// its very start: name it for ps/top/journal, close every descriptor but
/// `keep`, no core dumps, no capabilities, then [`harden`].
fn prepare(name: &str, keep: &[RawFd]) -> Result<(), ConfineError> {
    if let Ok(c) = std::ffi::CString::new(name) {
        let _ = nix::sys::prctl::set_name(&c);
    }
    fds::close_all_except(keep).map_err(ConfineError::Fds)?;
    rlimits::drop_capabilities().map_err(|source| ConfineError::Prctl { what: "capset", source })?;
    harden()
}

/// No core dumps, no new privileges, not dumpable; then the process must be
/// single-threaded (`check_threads`), as Landlock and seccomp restrict only
/// the calling thread. Idempotent: [`prepare`] and every confinement entry
/// run it, so that no caller can skip it.
fn harden() -> Result<(), ConfineError> {
    rlimits::apply().map_err(ConfineError::Rlimit)?;
    nix::sys::prctl::set_no_new_privs()
        .map_err(|source| ConfineError::Prctl { what: "PR_SET_NO_NEW_PRIVS", source })?;
    nix::sys::prctl::set_dumpable(false).map_err(|source| ConfineError::Prctl { what: "PR_SET_DUMPABLE", source })
}

/// [`harden`], then refuse to confine a process with more than one thread.
fn harden_single_threaded() -> Result<(), ConfineError> {
    harden()?;
    match worker::thread_count() {
        // A profile-training build has one more thread: the profile writer's.
        Some(n) if n != 1 + usize::from(cfg!(snowluma_pgo_training)) => Err(ConfineError::Threads(n)),
        _ => Ok(()),
    }
}

fn open(path: &str, what: &'static str) -> Result<OwnedFd, ConfineError> {
    std::fs::File::open(path).map(OwnedFd::from).map_err(|source| ConfineError::Open { what, source })
}
