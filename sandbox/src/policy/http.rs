//! The HTTP front's profile (`snowluma-mcp serve-http`): the process that
//! parses every HTTP request from the network, so it may accept
//! connections on the listener it was given and pass bytes between them and
//! the session sockets the launcher hands it, and nothing more.

use nix::libc;

use super::{Allow, Cmp, any, only};

/// On top of [`super::BASE`]. Measured with strace (`-f -c` on the front)
/// over `tests/tests/http.rs` (both eras, TLS, a Unix listener): accepting,
/// descriptor passing on the control socket, a Unix client's credentials;
/// its current-thread runtime was built before the filter and starts no
/// thread, so no clone, no epoll_create, no eventfd.
pub const HTTP_FRONT: &[Allow] = &[
    // Connections on the inherited listener (fd 3); tokio asks for
    // SOCK_CLOEXEC | SOCK_NONBLOCK.
    any("accept4", libc::SYS_accept4),
    // The control socket (fd 4): JSON packets, session sockets as SCM_RIGHTS.
    any("recvmsg", libc::SYS_recvmsg),
    any("sendmsg", libc::SYS_sendmsg),
    // SO_PEERCRED of a Unix-socket client (named in the audit log).
    only("getsockopt", libc::SYS_getsockopt, &[&[Cmp::Eq(1, libc::SOL_SOCKET as u64)]]),
    // The refusals below must pass this filter to reach their errno.
    any("openat", libc::SYS_openat),
    any("newfstatat", libc::SYS_newfstatat),
    any("socket", libc::SYS_socket),
    any("connect", libc::SYS_connect),
];

/// Answered `EACCES` instead of allowed: opening files and making sockets
/// or connections (a stray library call fails instead of killing the front;
/// Landlock forbids every file and every TCP connect and bind anyway).
/// Everything else not listed (exec, fork, bind, listen, signals to others,
/// ptrace) kills the front.
pub const HTTP_FRONT_REFUSED: &[(i32, &[Allow])] = &[(
    libc::EACCES,
    &[
        any("openat", libc::SYS_openat),
        any("newfstatat", libc::SYS_newfstatat),
        any("socket", libc::SYS_socket),
        any("connect", libc::SYS_connect),
    ],
)];

/// The front's descriptors beyond 0–2: 3 = the listener, 4 = the control
/// socket to the launcher.
pub const KEPT_FDS: &[i32] = &[3, 4];
