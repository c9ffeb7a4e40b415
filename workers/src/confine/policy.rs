//! The least-privilege policy of every worker role, as data.
//!
//! One table per role says which descriptors the worker keeps, what its
//! Landlock ruleset grants and which system calls its seccomp filter allows
//! (with argument conditions where the kernel can check them). Everything not
//! listed is forbidden: a call outside the allow-list kills the worker
//! (`SIGSYS`), which the supervisor reports and restarts.
//!
//! The allow-lists were derived by running the real worker roles under a
//! logging filter through the whole end-to-end suite and keeping what they
//! used (see ARCHITECTURE.md, "Confinement"). Edit them the same way: run the
//! suite with `SECCOMP_RET_LOG` as the mismatch action, read the kernel log,
//! add only what a legitimate path needs.

use nix::libc;
use snowluma_proto::Role;

/// One argument comparison: `(arg index, operator, value)`.
#[derive(Debug, Clone, Copy)]
pub enum Cmp {
    /// `arg == value`
    Eq(u8, u64),
    /// `arg != value`
    Ne(u8, u64),
    /// `arg & mask == value`
    Masked(u8, u64, u64),
}

/// An allowed system call: unconditionally (`when` empty) or when any one of
/// the condition sets holds (each set is an AND of comparisons).
#[derive(Debug, Clone, Copy)]
pub struct Allow {
    pub name: &'static str,
    pub nr: i64,
    pub when: &'static [&'static [Cmp]],
}

const fn any(name: &'static str, nr: i64) -> Allow {
    Allow { name, nr, when: &[] }
}

const fn only(name: &'static str, nr: i64, when: &'static [&'static [Cmp]]) -> Allow {
    Allow { name, nr, when }
}

/// The low 4 bits of `socket(2)`'s type are the socket type; the rest are
/// `SOCK_CLOEXEC`/`SOCK_NONBLOCK`.
const SOCK_TYPE_MASK: u64 = 0xf;

/// What every worker needs once serving: its current-thread tokio runtime
/// (created before the filter, so no epoll_create, eventfd or socketpair
/// here), memory management, its IPC socket, stderr diagnostics, and an
/// orderly exit or abort. No open, no socket, no exec, no signals to others.
///
/// Measured with strace over the end-to-end suite (catalog: brk, epoll_ctl,
/// epoll_wait, fcntl, getpid, ioctl, mmap, munmap, recvfrom, sendto), plus
/// the exit and abort paths and the memory calls the allocator may make.
pub const BASE: &[Allow] = &[
    any("read", libc::SYS_read),
    any("write", libc::SYS_write),
    any("writev", libc::SYS_writev),
    any("recvfrom", libc::SYS_recvfrom),
    any("sendto", libc::SYS_sendto),
    any("close", libc::SYS_close),
    // Shutting down a socket's sending half (proto::sockio, tokio's halves).
    any("shutdown", libc::SYS_shutdown),
    only(
        "fcntl",
        libc::SYS_fcntl,
        &[
            &[Cmp::Eq(1, libc::F_GETFD as u64)],
            &[Cmp::Eq(1, libc::F_SETFD as u64)],
            &[Cmp::Eq(1, libc::F_GETFL as u64)],
            &[Cmp::Eq(1, libc::F_SETFL as u64)],
            // The IPC socket's sending half is a duplicate (proto::sockio).
            &[Cmp::Eq(1, libc::F_DUPFD_CLOEXEC as u64)],
        ],
    ),
    // std sets O_NONBLOCK with FIONBIO.
    only("ioctl", libc::SYS_ioctl, &[&[Cmp::Eq(1, libc::FIONBIO)]]),
    any("epoll_ctl", libc::SYS_epoll_ctl),
    any("epoll_wait", libc::SYS_epoll_wait),
    any("epoll_pwait", libc::SYS_epoll_pwait),
    any("epoll_pwait2", libc::SYS_epoll_pwait2),
    any("futex", libc::SYS_futex),
    any("mmap", libc::SYS_mmap),
    any("munmap", libc::SYS_munmap),
    any("mremap", libc::SYS_mremap),
    any("mprotect", libc::SYS_mprotect),
    any("madvise", libc::SYS_madvise),
    any("brk", libc::SYS_brk),
    any("rt_sigaction", libc::SYS_rt_sigaction),
    any("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    any("rt_sigreturn", libc::SYS_rt_sigreturn),
    any("sigaltstack", libc::SYS_sigaltstack),
    any("getrandom", libc::SYS_getrandom),
    any("getpid", libc::SYS_getpid),
    any("exit", libc::SYS_exit),
    any("exit_group", libc::SYS_exit_group),
    // abort(): glibc's raise(SIGABRT) asks gettid, then tgkill to this
    // process only (arg 0 is filled in with our own pid when the filter is
    // built; see seccomp.rs).
    any("gettid", libc::SYS_gettid),
    only("tgkill", libc::SYS_tgkill, &[&[Cmp::Eq(0, SELF_PID)]]),
];

/// Placeholder replaced by the worker's own pid when the filter is built.
pub const SELF_PID: u64 = u64::MAX;

/// The catalog worker: nothing beyond the base.
pub const CATALOG: &[Allow] = &[];

/// The network executor: TCP stream sockets (Landlock limits the ports), the
/// socket options hyper and rustls use, threads (tokio's blocking pool), and
/// I/O on regular files it receives over SCM_RIGHTS from the file-transfer
/// worker (it opens no file itself).
pub const NETWORK: &[Allow] = &[
    // Only AF_INET/AF_INET6 stream sockets: every other kind is refused
    // with EACCES by NETWORK_REFUSED (so a resolver that tries UDP or a unix
    // socket for a hostname fails cleanly instead of killing the worker).
    any("socket", libc::SYS_socket),
    any("connect", libc::SYS_connect),
    // SO_ERROR after a non-blocking connect.
    only("getsockopt", libc::SYS_getsockopt, &[&[Cmp::Eq(1, libc::SOL_SOCKET as u64)]]),
    // SO_KEEPALIVE; TCP_NODELAY, TCP_KEEP*, TCP_USER_TIMEOUT.
    only(
        "setsockopt",
        libc::SYS_setsockopt,
        &[&[Cmp::Eq(1, libc::SOL_SOCKET as u64)], &[Cmp::Eq(1, libc::IPPROTO_TCP as u64)]],
    ),
    any("getsockname", libc::SYS_getsockname),
    any("getpeername", libc::SYS_getpeername),
    // std's blocking connect with a timeout waits in poll.
    any("poll", libc::SYS_poll),
    any("ppoll", libc::SYS_ppoll),
    any("readv", libc::SYS_readv),
    // The descriptor channel (SCM_RIGHTS) and I/O on received regular files.
    any("recvmsg", libc::SYS_recvmsg),
    any("sendmsg", libc::SYS_sendmsg),
    any("fstat", libc::SYS_fstat),
    any("statx", libc::SYS_statx),
    any("lseek", libc::SYS_lseek),
    any("pread64", libc::SYS_pread64),
    any("pwrite64", libc::SYS_pwrite64),
    any("fsync", libc::SYS_fsync),
    any("fdatasync", libc::SYS_fdatasync),
    any("ftruncate", libc::SYS_ftruncate),
    // Threads only: clone must carry CLONE_THREAD (no fork); clone3 is
    // answered ENOSYS by a second filter so glibc falls back to clone.
    only("clone", libc::SYS_clone, &[&[Cmp::Masked(0, libc::CLONE_THREAD as u64, libc::CLONE_THREAD as u64)]]),
    any("clone3", libc::SYS_clone3),
    any("set_robust_list", libc::SYS_set_robust_list),
    any("rseq", libc::SYS_rseq),
    any("sched_yield", libc::SYS_sched_yield),
    any("sched_getaffinity", libc::SYS_sched_getaffinity),
    any("clock_nanosleep", libc::SYS_clock_nanosleep),
    any("nanosleep", libc::SYS_nanosleep),
    // The resolver (hostname endpoints) asks for the host name.
    any("uname", libc::SYS_uname),
    // std names its threads (PR_SET_NAME) and nothing else.
    only("prctl", libc::SYS_prctl, &[&[Cmp::Eq(0, libc::PR_SET_NAME as u64)]]),
];

/// The file-transfer worker: opens files beneath the two directory
/// descriptors it was given (Landlock confines which), lists, creates,
/// renames and removes within the download directory, and passes open
/// descriptors over its SCM_RIGHTS socket. No sockets, no threads, no exec.
pub const FILES: &[Allow] = &[
    any("recvmsg", libc::SYS_recvmsg),
    any("sendmsg", libc::SYS_sendmsg),
    any("readv", libc::SYS_readv),
    any("fstat", libc::SYS_fstat),
    any("statx", libc::SYS_statx),
    any("lseek", libc::SYS_lseek),
    any("openat", libc::SYS_openat),
    any("openat2", libc::SYS_openat2),
    any("newfstatat", libc::SYS_newfstatat),
    any("getdents64", libc::SYS_getdents64),
    any("mkdirat", libc::SYS_mkdirat),
    any("unlinkat", libc::SYS_unlinkat),
    // std::fs uses the path forms; Landlock decides which paths.
    any("unlink", libc::SYS_unlink),
    any("mkdir", libc::SYS_mkdir),
    any("rmdir", libc::SYS_rmdir),
    any("rename", libc::SYS_rename),
    any("renameat", libc::SYS_renameat),
    any("renameat2", libc::SYS_renameat2),
    any("pread64", libc::SYS_pread64),
    any("pwrite64", libc::SYS_pwrite64),
    any("fsync", libc::SYS_fsync),
    any("fdatasync", libc::SYS_fdatasync),
    any("ftruncate", libc::SYS_ftruncate),
    any("fallocate", libc::SYS_fallocate),
    any("fchmod", libc::SYS_fchmod),
    // Each `.part` file is locked while it is being written, so that a sweep
    // of stale partial downloads skips live ones (files.rs).
    any("flock", libc::SYS_flock),
];

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
    // failed write (a full disk) and dropping a torn one (audit.rs; the log
    // was opened before Landlock, which checks truncation at open).
    any("ftruncate", libc::SYS_ftruncate),
    // Audit appends overwrite the head file's slots in place (audit.rs).
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
    // Reaping the spawner, its only child, when it dies (spawner.rs).
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

/// The spawner cannot use an allow-list: every worker is exec'ed from it
/// and stays bound by its filter from the first instruction (filters stack
/// and survive exec), so its filter is a deny-list of calls that neither it
/// nor any worker ever needs; each worker then installs its own allow-list.
pub const SPAWNER_DENY: &[Allow] = &[
    any("ptrace", libc::SYS_ptrace),
    any("process_vm_readv", libc::SYS_process_vm_readv),
    any("process_vm_writev", libc::SYS_process_vm_writev),
    any("mount", libc::SYS_mount),
    any("umount2", libc::SYS_umount2),
    any("pivot_root", libc::SYS_pivot_root),
    any("chroot", libc::SYS_chroot),
    any("setns", libc::SYS_setns),
    any("unshare", libc::SYS_unshare),
    any("bpf", libc::SYS_bpf),
    any("perf_event_open", libc::SYS_perf_event_open),
    any("kexec_load", libc::SYS_kexec_load),
    any("init_module", libc::SYS_init_module),
    any("finit_module", libc::SYS_finit_module),
    any("delete_module", libc::SYS_delete_module),
    any("keyctl", libc::SYS_keyctl),
    any("add_key", libc::SYS_add_key),
    any("request_key", libc::SYS_request_key),
    any("userfaultfd", libc::SYS_userfaultfd),
    any("io_uring_setup", libc::SYS_io_uring_setup),
    any("open_by_handle_at", libc::SYS_open_by_handle_at),
    any("name_to_handle_at", libc::SYS_name_to_handle_at),
    any("swapon", libc::SYS_swapon),
    any("swapoff", libc::SYS_swapoff),
    any("reboot", libc::SYS_reboot),
    any("setuid", libc::SYS_setuid),
    any("setgid", libc::SYS_setgid),
];

/// The task store is not built yet; until it is, it gets the base only.
pub const TASKS: &[Allow] = &[];

/// Extra allowances of a role, on top of [`BASE`].
pub fn extra(role: Role) -> &'static [Allow] {
    match role {
        Role::Catalog => CATALOG,
        Role::Network => NETWORK,
        Role::Files => FILES,
        Role::Tasks => TASKS,
    }
}

/// System calls answered with an error instead of allowed or killed, each
/// list with its errno: `ENOSYS` so that libc falls back to an older call
/// the allow-list can check (clone3's flags sit in memory, where seccomp
/// cannot read them); `EACCES` for calls that are refused but that library
/// code may try on a normal path (a resolver's UDP socket).
pub fn refused(role: Role) -> &'static [(i32, &'static [Allow])] {
    match role {
        Role::Network => &[(libc::ENOSYS, NETWORK_ENOSYS), (libc::EACCES, NETWORK_REFUSED)],
        _ => &[],
    }
}

const NETWORK_ENOSYS: &[Allow] = &[any("clone3", libc::SYS_clone3)];

const fn sock_type(t: u64) -> &'static [Cmp] {
    match t {
        0 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 0)],
        2 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 2)],
        3 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 3)],
        4 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 4)],
        5 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 5)],
        6 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 6)],
        7 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 7)],
        8 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 8)],
        9 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 9)],
        10 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 10)],
        11 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 11)],
        12 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 12)],
        13 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 13)],
        14 => &[Cmp::Masked(1, SOCK_TYPE_MASK, 14)],
        _ => &[Cmp::Masked(1, SOCK_TYPE_MASK, 15)],
    }
}

/// Calls the network executor may not make but that a name resolver makes
/// on its normal path (a hostname endpoint): opening and stat-ing files (`/etc/hosts`,
/// `/etc/resolv.conf`, which Landlock would refuse anyway) and sockets of
/// any domain but AF_INET/AF_INET6 or any type but SOCK_STREAM. Refusing
/// them with EACCES turns a hostname into a clean connection error.
const NETWORK_REFUSED: &[Allow] = &[
    any("openat", libc::SYS_openat),
    any("newfstatat", libc::SYS_newfstatat),
    only(
        "socket",
        libc::SYS_socket,
        &[
            &[Cmp::Ne(0, libc::AF_INET as u64), Cmp::Ne(0, libc::AF_INET6 as u64)],
            sock_type(0),
            sock_type(2),
            sock_type(3),
            sock_type(4),
            sock_type(5),
            sock_type(6),
            sock_type(7),
            sock_type(8),
            sock_type(9),
            sock_type(10),
            sock_type(11),
            sock_type(12),
            sock_type(13),
            sock_type(14),
            sock_type(15),
        ],
    ),
];

/// Descriptors a role keeps open past startup (beyond stdin, stdout, stderr
/// and the IPC socket on 3). Everything else is closed.
pub fn kept_fds(role: Role) -> &'static [i32] {
    match role {
        Role::Catalog | Role::Tasks => &[],
        // fd 4: the SOCK_SEQPACKET descriptor channel (SCM_RIGHTS), when present.
        Role::Network => &[NETWORK_FD_CHANNEL],
        // 4: upload root (read-only), 5: download directory (read-write),
        // 6: the SOCK_SEQPACKET descriptor channel.
        Role::Files => &[FILES_UPLOAD_ROOT_FD, FILES_DOWNLOAD_DIR_FD, FILES_FD_CHANNEL],
    }
}

pub const NETWORK_FD_CHANNEL: i32 = 4;
pub const FILES_UPLOAD_ROOT_FD: i32 = 4;
pub const FILES_DOWNLOAD_DIR_FD: i32 = 5;
pub const FILES_FD_CHANNEL: i32 = 6;

/// Number of distinct system calls a role may make (for docs and `doctor`).
pub fn allowed_count(role: Role) -> usize {
    let mut names: Vec<&str> = BASE.iter().chain(extra(role)).map(|a| a.name).collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}
