//! The HTTP front's confinement (`snowluma-mcp serve-http`): it parses
//! every request from the network, so it keeps no file access at all, no
//! new connections or listeners, no exec and no signals to others. Its
//! listener and control socket are inherited; session sockets arrive over
//! the control socket.

use super::{ConfineError, SupervisorReport};
use crate::landlock::{self as ll, Grant};
use crate::{policy, seccomp};

/// First step, at the start of the front: name, close every descriptor but
/// 0–2 and [`policy::http::KEPT_FDS`], no core dumps, no capabilities, no
/// new privileges, not dumpable. The front then reads its setup and builds
/// its current-thread runtime, and calls [`confine_http_front`].
pub fn prepare_http_front() -> Result<(), ConfineError> {
    let mut keep = vec![0, 1, 2];
    keep.extend_from_slice(policy::http::KEPT_FDS);
    super::prepare("snowluma-http", &keep)
}

/// Landlock with no filesystem right, no TCP bind or connect, and scoped
/// signals and abstract sockets; then the seccomp allow-list
/// ([`policy::HTTP_FRONT`], mismatch kills). The process must be
/// single-threaded.
pub fn confine_http_front(allow_unconfined: bool) -> Result<SupervisorReport, ConfineError> {
    super::harden_single_threaded()?;
    let landlock = ll::restrict(&Grant { fs: Vec::new(), connect_tcp: Vec::new() })?;
    super::finish("HTTP front", landlock, seccomp::apply_http_front, allow_unconfined)
}
