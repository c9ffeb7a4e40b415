//! Descriptors: the fixed numbers every process finds its grants on, and
//! hygiene (close every descriptor except the ones a role keeps).
//!
//! The numbers a worker receives are defined once, in its role's table
//! ([`crate::role`]), and re-exported here; the spawner's executable
//! descriptor is the sandbox's own.
//!
//! The supervisor already marks everything above the IPC socket
//! close-on-exec; [`close_all_except`] is the worker's own check, done before
//! any library can open something, so a descriptor leaked by a future change
//! of the spawn code cannot reach a confined worker.

use std::os::fd::RawFd;

pub use crate::role::{
    FILES_DOWNLOAD_DIR_FD, FILES_FD_CHANNEL, FILES_UPLOAD_ROOT_FD, NETWORK_FD_CHANNEL, TASKS_DIR_FD, WORKER_IPC_FD,
};

/// The descriptor on which the spawner holds its own executable: the only
/// program it (or anything it starts) may execute, with
/// `execveat(SPAWNER_EXE_FD, "", …, AT_EMPTY_PATH)`.
pub const SPAWNER_EXE_FD: i32 = 200;

/// Close every descriptor not in `keep` (which must include 0, 1, 2 and the
/// IPC socket). Uses `close_range(2)` over the gaps.
pub fn close_all_except(keep: &[RawFd]) -> Result<(), nix::Error> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|f| *f >= 0).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first: u32 = 0;
    for k in keep {
        let k = k as u32;
        if k > first {
            close_range(first, k - 1)?;
        }
        first = k + 1;
    }
    close_range(first, u32::MAX)
}

fn close_range(first: u32, last: u32) -> Result<(), nix::Error> {
    // SAFETY: close_range closes descriptors by number; no memory is touched.
    // We run before any thread or library holds a descriptor in that range
    // (the process is single-threaded and has only its inherited fds).
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_close_range, first, last, 0u32) };
    if r < 0 { Err(nix::Error::last()) } else { Ok(()) }
}
