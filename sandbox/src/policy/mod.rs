//! The least-privilege policy of every process, as data: one file per
//! process profile.
//!
//! * [`supervisor`]: the MCP endpoint's seccomp allow-list;
//! * [`spawner`]: the deny-list and refusals every worker also starts under;
//! * [`http`]: the HTTP front of `serve-http` (its allow-list on top of [`BASE`]);
//! * [`catalog`], [`network`], [`files`], [`tasks`]: each worker role's
//!   seccomp allow-list on top of [`BASE`] (the role's table,
//!   [`crate::role`], names it with the descriptors the role keeps).
//!
//! Each entry says which system call is allowed (with argument conditions
//! where the kernel can check them) and why. Everything not listed is
//! forbidden: a call outside a worker's allow-list kills the worker
//! (`SIGSYS`), which the supervisor reports and restarts. What each
//! profile's Landlock ruleset grants is in [`crate::profile`].
//!
//! The allow-lists were derived by running the real processes under a
//! logging filter through the whole end-to-end suite and keeping what they
//! used (see ARCHITECTURE.md, "Confinement"). Edit them the same way: run the
//! suite with `SECCOMP_RET_LOG` as the mismatch action, read the kernel log,
//! add only what a legitimate path needs.

pub mod catalog;
pub mod files;
pub mod http;
pub mod network;
pub mod spawner;
pub mod supervisor;
pub mod tasks;

pub use self::catalog::CATALOG;
pub use self::files::FILES;
pub use self::http::{HTTP_FRONT, HTTP_FRONT_REFUSED};
pub use self::network::NETWORK;
pub use self::spawner::{SPAWNER_DENY, SPAWNER_REFUSED};
pub use self::supervisor::{SUPERVISOR, SUPERVISOR_REFUSED};
pub use self::tasks::TASKS;

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

pub(crate) const fn any(name: &'static str, nr: i64) -> Allow {
    Allow { name, nr, when: &[] }
}

pub(crate) const fn only(name: &'static str, nr: i64, when: &'static [&'static [Cmp]]) -> Allow {
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

/// Extra allowances of a role, on top of [`BASE`] (from its [`crate::role::RoleSpec`]).
pub fn extra(role: Role) -> &'static [Allow] {
    crate::role::spec(role).seccomp
}

/// System calls answered with an error instead of allowed or killed, each
/// list with its errno: `ENOSYS` so that libc falls back to an older call
/// the allow-list can check (clone3's flags sit in memory, where seccomp
/// cannot read them); `EACCES` for calls that are refused but that library
/// code may try on a normal path (a resolver's UDP socket).
pub fn refused(role: Role) -> &'static [(i32, &'static [Allow])] {
    crate::role::spec(role).refused
}

/// When a `socket(2)` call does not make a TCP stream: any domain but
/// `AF_INET`/`AF_INET6`, any protocol but 0 or `IPPROTO_TCP`, or any type
/// but `SOCK_STREAM` (the condition sets of a refusal; one set must hold).
pub(crate) const NOT_A_TCP_STREAM: &[&[Cmp]] = &[
    &[Cmp::Ne(0, libc::AF_INET as u64), Cmp::Ne(0, libc::AF_INET6 as u64)],
    &[Cmp::Ne(2, 0), Cmp::Ne(2, libc::IPPROTO_TCP as u64)],
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
];

/// The condition "the type (low bits of argument 1) is `t`".
pub(crate) const fn sock_type(t: u64) -> &'static [Cmp] {
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

/// Number of distinct system calls a role may make (for docs and `doctor`).
pub fn allowed_count(role: Role) -> usize {
    let mut names: Vec<&str> = BASE.iter().chain(extra(role)).map(|a| a.name).collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The least-privilege matrix in ARCHITECTURE.md states each worker
    /// role's number of allowed system calls: it must be the policy's.
    #[test]
    fn the_architecture_matrix_states_each_workers_syscall_count() {
        let doc = include_str!("../../../ARCHITECTURE.md");
        for (row, role) in [
            ("| catalog worker |", Role::Catalog),
            ("| network executor |", Role::Network),
            ("| file-transfer worker |", Role::Files),
            ("| task store |", Role::Tasks),
        ] {
            // The matrix comes after the process table, whose rows start alike.
            let line = doc
                .lines()
                .rfind(|l| l.starts_with(row))
                .unwrap_or_else(|| panic!("ARCHITECTURE.md has no matrix row {row}"));
            let last = line.trim_end().trim_end_matches('|').rsplit('|').next().unwrap().trim();
            let stated: usize = last
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{row}: no syscall count in {last:?}"));
            assert_eq!(stated, allowed_count(role), "ARCHITECTURE.md's matrix states {stated} syscalls for {row}");
        }
    }
}
