//! The HTTP front's confinement (`snowluma-mcp serve-http`): it parses
//! every request from the network, so it keeps no file access at all, no
//! new connections or listeners, no exec and no signals to others. Its
//! listener and control socket are inherited; session sockets arrive over
//! the control socket.

use super::{ConfineError, SupervisorReport};
use crate::landlock::{self as ll, Grant};
use crate::{fds, policy, rlimits, seccomp};

/// First step, at the start of the front: name, close every descriptor but
/// 0–2 and [`policy::http::KEPT_FDS`], no core dumps, no capabilities, no
/// new privileges, not dumpable. The front then reads its setup and builds
/// its current-thread runtime, and calls [`confine_http_front`].
pub fn prepare_http_front() -> Result<(), ConfineError> {
    if let Ok(c) = std::ffi::CString::new("snowluma-http") {
        let _ = nix::sys::prctl::set_name(&c);
    }
    let mut keep = vec![0, 1, 2];
    keep.extend_from_slice(policy::http::KEPT_FDS);
    fds::close_all_except(&keep).map_err(ConfineError::Fds)?;
    rlimits::apply().map_err(ConfineError::Rlimit)?;
    rlimits::drop_capabilities().map_err(|source| ConfineError::Prctl { what: "capset", source })?;
    nix::sys::prctl::set_no_new_privs()
        .map_err(|source| ConfineError::Prctl { what: "PR_SET_NO_NEW_PRIVS", source })?;
    nix::sys::prctl::set_dumpable(false).map_err(|source| ConfineError::Prctl { what: "PR_SET_DUMPABLE", source })?;
    Ok(())
}

/// Landlock with no filesystem right, no TCP bind or connect, and scoped
/// signals and abstract sockets; then the seccomp allow-list
/// ([`policy::HTTP_FRONT`], mismatch kills). The process must be
/// single-threaded.
pub fn confine_http_front(allow_unconfined: bool) -> Result<SupervisorReport, ConfineError> {
    rlimits::apply().map_err(ConfineError::Rlimit)?;
    nix::sys::prctl::set_no_new_privs()
        .map_err(|source| ConfineError::Prctl { what: "PR_SET_NO_NEW_PRIVS", source })?;
    nix::sys::prctl::set_dumpable(false).map_err(|source| ConfineError::Prctl { what: "PR_SET_DUMPABLE", source })?;
    if let Some(n) = super::worker::thread_count()
        && n != 1
    {
        return Err(ConfineError::Threads(n));
    }
    let landlock = ll::restrict(&Grant { fs: Vec::new(), connect_tcp: Vec::new() })?;
    super::finish("HTTP front", landlock, seccomp::apply_http_front, allow_unconfined)
}
