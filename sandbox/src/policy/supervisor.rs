//! The supervisor's profile: the MCP endpoint, which parses every client
//! message, so it may read files and nothing more (see
//! [`crate::confine_supervisor`]).

use nix::libc;

use super::{Allow, Cmp, any, only};

/// The supervisor proper (not a worker: it is the MCP endpoint). It starts
/// no process (the spawner does), so no fork, exec or kill; it opens no file
/// by path and no socket after startup (`openat`, `socket` and `connect`
/// are answered `EACCES` by [`SUPERVISOR_REFUSED`], so a stray library call
/// fails instead of ending the session). Measured with strace over the
/// end-to-end suite: its current-thread runtime (built after the filter),
/// the blocking pool's threads (audit appends, a non-pipe stdin), the
/// per-worker IPC socketpairs and descriptor passing, and audit log appends
/// (flock, lseek, pread, fdatasync; ftruncate and pwrite, below).
pub const SUPERVISOR: &[Allow] = &[
    any("readv", libc::SYS_readv),
    any("recvmsg", libc::SYS_recvmsg),
    any("sendmsg", libc::SYS_sendmsg),
    only("socketpair", libc::SYS_socketpair, &[&[Cmp::Eq(0, libc::AF_UNIX as u64)]]),
    only("fcntl", libc::SYS_fcntl, &[&[Cmp::Eq(1, libc::F_DUPFD_CLOEXEC as u64)]]),
    any("epoll_create1", libc::SYS_epoll_create1),
    any("eventfd2", libc::SYS_eventfd2),
    any("fstat", libc::SYS_fstat),
    any("newfstatat", libc::SYS_newfstatat),
    any("statx", libc::SYS_statx),
    any("lseek", libc::SYS_lseek),
    any("pread64", libc::SYS_pread64),
    any("flock", libc::SYS_flock),
    any("fsync", libc::SYS_fsync),
    any("fdatasync", libc::SYS_fdatasync),
    // Audit appends cut the log back to its last complete line: undoing a
    // failed write (a full disk) and dropping a torn one (audit/append.rs; the log
    // was opened before Landlock, which checks truncation at open).
    any("ftruncate", libc::SYS_ftruncate),
    // Audit appends overwrite the head file's slots in place (audit/head.rs).
    any("pwrite64", libc::SYS_pwrite64),
    only("clone", libc::SYS_clone, &[&[Cmp::Masked(0, libc::CLONE_THREAD as u64, libc::CLONE_THREAD as u64)]]),
    any("clone3", libc::SYS_clone3),
    any("set_robust_list", libc::SYS_set_robust_list),
    any("rseq", libc::SYS_rseq),
    any("sched_yield", libc::SYS_sched_yield),
    any("sched_getaffinity", libc::SYS_sched_getaffinity),
    any("clock_nanosleep", libc::SYS_clock_nanosleep),
    any("nanosleep", libc::SYS_nanosleep),
    // The blocking stdout writer (a file, tty, or a pipe stderr shares)
    // waits for space in poll when the host handed it a non-blocking
    // descriptor (supervisor/src/stdio.rs).
    any("poll", libc::SYS_poll),
    any("ppoll", libc::SYS_ppoll),
    // How much of stdout the client has not read yet (SIOCOUTQ on a
    // socket, FIONREAD on a pipe): the transport lets a progress
    // notification be read before the reply that follows it.
    only("ioctl", libc::SYS_ioctl, &[&[Cmp::Eq(1, libc::TIOCOUTQ)], &[Cmp::Eq(1, libc::FIONREAD)]]),
    // Reaping the spawner, its only child, when it dies (spawner/src/lib.rs).
    any("wait4", libc::SYS_wait4),
    any("uname", libc::SYS_uname),
    only("prctl", libc::SYS_prctl, &[&[Cmp::Eq(0, libc::PR_SET_NAME as u64)]]),
    any("openat", libc::SYS_openat),
    any("socket", libc::SYS_socket),
    any("connect", libc::SYS_connect),
];

/// Answered with an error instead of allowed: `clone3` (`ENOSYS`, so glibc
/// falls back to `clone`, whose flags the filter can see); opening files and
/// new sockets (`EACCES`).
pub const SUPERVISOR_REFUSED: &[(i32, &[Allow])] = &[
    (libc::ENOSYS, &[any("clone3", libc::SYS_clone3)]),
    (
        libc::EACCES,
        &[any("openat", libc::SYS_openat), any("socket", libc::SYS_socket), any("connect", libc::SYS_connect)],
    ),
];
