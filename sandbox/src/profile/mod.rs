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

use std::os::fd::OwnedFd;

use crate::landlock::{LandlockError, LandlockReport, PINNED_ABI_NUMBER};
use crate::seccomp::SeccompError;

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

fn open(path: &str, what: &'static str) -> Result<OwnedFd, ConfineError> {
    std::fs::File::open(path).map(OwnedFd::from).map_err(|source| ConfineError::Open { what, source })
}
