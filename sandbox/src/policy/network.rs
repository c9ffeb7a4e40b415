//! The network executor's profile: the only process that opens network
//! connections (TCP to the endpoint's ports, which Landlock enforces).

use nix::libc;

use super::{Allow, Cmp, NOT_A_TCP_STREAM, any, only};

/// The network executor: TCP stream sockets (Landlock limits the ports), the
/// socket options hyper and rustls use, threads (tokio's blocking pool), and
/// I/O on regular files it receives over SCM_RIGHTS from the file-transfer
/// worker (it opens no file itself). The event WebSocket
/// (`workers/src/network/events.rs`) needs nothing more: a TCP stream
/// socket, `connect`, `TCP_NODELAY`, reads and writes through the reactor,
/// and `getrandom` (base list) for the handshake key and frame masks;
/// `tests/tests/events.rs` runs it under this filter.
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

pub(super) const NETWORK_ENOSYS: &[Allow] = &[any("clone3", libc::SYS_clone3)];

/// Calls the network executor may not make but that a name resolver makes
/// on its normal path (a hostname endpoint): opening and stat-ing files (`/etc/hosts`,
/// `/etc/resolv.conf`, which Landlock would refuse anyway) and sockets of
/// any domain but AF_INET/AF_INET6 or any type but SOCK_STREAM. Refusing
/// them with EACCES turns a hostname into a clean connection error.
pub(super) const NETWORK_REFUSED: &[Allow] = &[
    any("openat", libc::SYS_openat),
    any("newfstatat", libc::SYS_newfstatat),
    only("socket", libc::SYS_socket, NOT_A_TCP_STREAM),
];

/// Its refusals, each list with its errno (see [`super::refused`]).
pub const REFUSED: &[(i32, &[Allow])] = &[(libc::ENOSYS, NETWORK_ENOSYS), (libc::EACCES, NETWORK_REFUSED)];
