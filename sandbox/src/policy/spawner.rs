//! The spawner's profile: the union of its workers' needs, which it starts
//! by executing this binary (see [`crate::confine_spawner`]).

use nix::libc;

use super::{Allow, Cmp, NOT_A_TCP_STREAM, any, only, sock_type};
use crate::fds::SPAWNER_EXE_FD;

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

/// What the spawner (and, since filters survive exec, every worker) is
/// refused with `EACCES` instead of killed, so that an attempt is an error
/// a probe can report:
///
/// * `execve` of anything, and `execveat` unless it is the spawner's own
///   executable descriptor with `AT_EMPTY_PATH` (an absolute path would
///   ignore the descriptor; Landlock then grants execution of nothing but
///   this binary and its ELF interpreter, and no file the interpreter could
///   run: reading is limited to the binary and its libraries);
/// * `memfd_create` (an anonymous executable file Landlock cannot see);
/// * `socket` of any kind but a TCP stream (`AF_INET`/`AF_INET6`,
///   `SOCK_STREAM`, protocol 0 or `IPPROTO_TCP`: the network executor's;
///   Landlock limits its ports): no UDP, no unix socket to connect to a
///   path, no raw or packet socket;
/// * `socketpair` unless a unix stream or seqpacket pair (the workers' IPC
///   and their runtimes' wake-up pairs; a datagram pair could `sendto` a
///   path);
/// * `prctl` but the options in [`PRCTL_REFUSED`]'s comment: above all
///   `PR_SET_DUMPABLE` 1, which would make the spawner (or a worker not
///   yet under its own allow-list) traceable and core-dumpable again,
///   although it confined itself non-dumpable.
pub const SPAWNER_REFUSED: &[Allow] = &[
    any("execve", libc::SYS_execve),
    only(
        "execveat",
        libc::SYS_execveat,
        &[&[Cmp::Ne(0, SPAWNER_EXE_FD as u64)], &[Cmp::Ne(4, libc::AT_EMPTY_PATH as u64)]],
    ),
    any("memfd_create", libc::SYS_memfd_create),
    only("socket", libc::SYS_socket, NOT_A_TCP_STREAM),
    only(
        "socketpair",
        libc::SYS_socketpair,
        &[
            &[Cmp::Ne(0, libc::AF_UNIX as u64)],
            sock_type(0),
            sock_type(2),
            sock_type(3),
            sock_type(4),
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
    only("prctl", libc::SYS_prctl, PRCTL_REFUSED),
];

/// When a `prctl(2)` call is refused: any option but the five the spawner
/// and its workers use before each worker's own allow-list takes over
/// (measured with `strace -f -e trace=prctl` over a write-mode session with
/// every worker, and over `doctor`), and two of those with any but the
/// argument they are used with:
///
/// * `PR_SET_NAME`: workers name themselves and their threads (`prepare`,
///   std's thread names);
/// * `PR_SET_DUMPABLE` with 0 only: every process sets itself non-dumpable
///   (`harden`); 1 would undo it;
/// * `PR_SET_NO_NEW_PRIVS`: `harden`, and Landlock's and seccompiler's own
///   calls (the flag is already set and cannot be cleared);
/// * `PR_CAPBSET_DROP`: `drop_capabilities` (dropping only shrinks the set);
/// * `PR_CAP_AMBIENT` with `PR_CAP_AMBIENT_CLEAR_ALL` only (raising an
///   ambient capability is refused).
///
/// `PR_SET_PDEATHSIG` is set by the spawner before its filter exists.
pub const PRCTL_REFUSED: &[&[Cmp]] = &[
    &[
        Cmp::Ne(0, libc::PR_SET_NAME as u64),
        Cmp::Ne(0, libc::PR_SET_DUMPABLE as u64),
        Cmp::Ne(0, libc::PR_SET_NO_NEW_PRIVS as u64),
        Cmp::Ne(0, libc::PR_CAPBSET_DROP as u64),
        Cmp::Ne(0, libc::PR_CAP_AMBIENT as u64),
    ],
    &[Cmp::Eq(0, libc::PR_SET_DUMPABLE as u64), Cmp::Ne(1, 0)],
    &[Cmp::Eq(0, libc::PR_CAP_AMBIENT as u64), Cmp::Ne(1, libc::PR_CAP_AMBIENT_CLEAR_ALL as u64)],
];
