//! The supervisor's confinement: the process that parses every client
//! message keeps no network, no file writes and no exec.
//!
//! The supervisor confines itself after the configuration is parsed, the
//! audit log is open and the spawner is forked, before its runtime starts
//! (so before any thread). Workers start from the spawner, not from it.

use std::os::fd::AsFd;

use super::{ConfineError, SupervisorReport, open};
use crate::landlock::{self as ll, FsRule, Grant};
use crate::{rlimits, seccomp};

/// Confine the supervisor proper, after the spawner was forked: it starts
/// no process (the spawner does), so it keeps no capability and its domain
/// grants no exec, no TCP and no writes — only reading files (nothing it
/// needs is written by path: the audit log and its key were opened before
/// this).
///
/// Order: `RLIMIT_CORE` 0, not dumpable, no new privileges, every
/// capability dropped, the Landlock domain, then the seccomp allow-list
/// ([`crate::policy::SUPERVISOR`]; its runtime and everything after run
/// under it, the spawner forked earlier is not bound by it).
///
/// Without `allow_unconfined`, a Landlock domain that is not fully enforced
/// is refused ([`ConfineError::LandlockWeak`], before any seccomp filter)
/// and a filter that cannot be installed is an error
/// ([`ConfineError::SeccompNotInstalled`]); with it, a missing filter is
/// logged and reported (`seccomp: false`).
pub fn confine_supervisor(allow_unconfined: bool) -> Result<SupervisorReport, ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)?;
    nix::sys::prctl::set_dumpable(false)?;
    nix::sys::prctl::set_no_new_privs()?;
    rlimits::drop_capabilities()?;
    let root = open("/", "/")?;
    let fs = vec![FsRule { fd: root.as_fd(), access: ll::read_dir_access() }];
    let landlock = ll::restrict(&Grant { fs, connect_tcp: Vec::new() })?;
    drop(root);
    super::finish("supervisor", landlock, seccomp::apply_supervisor, allow_unconfined)
}
