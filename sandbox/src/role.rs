//! One table per worker role: the descriptors it is given (numbers, what
//! each is, which way a channel carries descriptors, when the supervisor
//! places it), the Landlock grants those imply, its seccomp lists, and the
//! preconditions of its start.
//!
//! Every consumer reads this table instead of repeating numbers:
//!
//! * the supervisor builds each worker's attachments from [`RoleSpec::fds`]
//!   (`supervisor/src/workers.rs`, `Attach::for_role`);
//! * [`crate::prepare_worker`] keeps exactly [`RoleSpec::kept_fds`] and
//!   closes the rest; [`crate::Grants::from_args`] grants Landlock access
//!   beneath each [`FdKind::Dir`]; [`crate::seccomp`] installs
//!   [`RoleSpec::seccomp`] and [`RoleSpec::refused`];
//! * the worker claims its descriptors with [`claim`] first thing, before
//!   any runtime or thread exists (`workers/src/lib.rs`);
//! * `snowluma-mcp doctor` places the directory descriptors of its probes
//!   from the table (`supervisor/src/doctor.rs`).
//!
//! Preconditions, common to every role: the process is single-threaded when
//! it claims and confines itself; a descriptor the supervisor did not place
//! is not claimed (its number is free, and would otherwise be taken by the
//! runtime's epoll or eventfd); a directory descriptor is granted only if it
//! is an open directory ([`crate::landlock::is_dir`]). Per descriptor,
//! [`Placed`] says when the supervisor places it.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use snowluma_proto::Role;

use crate::policy::{self, Allow};

pub use snowluma_proto::WORKER_IPC_FD;

/// The file-transfer worker's upload root (read-only).
pub const FILES_UPLOAD_ROOT_FD: RawFd = 4;
/// The file-transfer worker's download directory (read-write).
pub const FILES_DOWNLOAD_DIR_FD: RawFd = 5;
/// The file-transfer worker's descriptor channel (it sends descriptors).
pub const FILES_FD_CHANNEL: RawFd = 6;
/// The network executor's descriptor channel (it receives descriptors).
pub const NETWORK_FD_CHANNEL: RawFd = 4;
/// The task-store worker's task directory (read-write).
pub const TASKS_DIR_FD: RawFd = 4;

/// Every target number is below this, so that a spawner can move the
/// sources above it first and place them with `dup2` without clobbering one.
pub const FIRST_FREE_FD: RawFd = 10;

/// What a role descriptor is for (the name its consumers look it up by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    UploadRoot,
    DownloadDir,
    TaskDir,
    FdChannel,
}

/// Which way a descriptor channel (`SOCK_SEQPACKET`, SCM_RIGHTS) carries descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelDir {
    /// The supervisor sends, the worker receives.
    ToWorker,
    /// The worker sends, the supervisor receives.
    FromWorker,
}

/// The Landlock access a directory descriptor grants beneath it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirAccess {
    /// [`crate::landlock::read_dir_access`].
    Read,
    /// [`crate::landlock::write_dir_access`].
    ReadWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdKind {
    /// A pre-opened directory, granted `access` beneath it.
    Dir(DirAccess),
    /// A fresh descriptor channel for every incarnation.
    Channel(ChannelDir),
}

/// When the supervisor places a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// In every incarnation of the role.
    Always,
    /// Only when the configuration enables what it serves (uploads).
    WhenConfigured,
}

/// One descriptor of a role.
#[derive(Debug, Clone, Copy)]
pub struct FdSpec {
    pub fd: RawFd,
    pub slot: Slot,
    pub kind: FdKind,
    pub placed: Placed,
}

/// Everything about one worker role's start and confinement.
#[derive(Debug, Clone, Copy)]
pub struct RoleSpec {
    pub role: Role,
    /// Descriptors beyond 0–2 and [`WORKER_IPC_FD`]; everything else is closed.
    pub fds: &'static [FdSpec],
    /// Landlock: TCP connect to the ports on its command line (`ports=`).
    pub connect_tcp: bool,
    /// Its seccomp allow-list on top of [`policy::BASE`].
    pub seccomp: &'static [Allow],
    /// System calls answered with an errno instead (see [`policy::refused`]).
    pub refused: &'static [(i32, &'static [Allow])],
}

pub const CATALOG: RoleSpec =
    RoleSpec { role: Role::Catalog, fds: &[], connect_tcp: false, seccomp: policy::CATALOG, refused: &[] };

pub const NETWORK: RoleSpec = RoleSpec {
    role: Role::Network,
    fds: &[FdSpec {
        fd: NETWORK_FD_CHANNEL,
        slot: Slot::FdChannel,
        kind: FdKind::Channel(ChannelDir::ToWorker),
        placed: Placed::Always,
    }],
    connect_tcp: true,
    seccomp: policy::NETWORK,
    refused: policy::network::REFUSED,
};

pub const FILES: RoleSpec = RoleSpec {
    role: Role::Files,
    fds: &[
        FdSpec {
            fd: FILES_UPLOAD_ROOT_FD,
            slot: Slot::UploadRoot,
            kind: FdKind::Dir(DirAccess::Read),
            placed: Placed::WhenConfigured,
        },
        FdSpec {
            fd: FILES_DOWNLOAD_DIR_FD,
            slot: Slot::DownloadDir,
            kind: FdKind::Dir(DirAccess::ReadWrite),
            placed: Placed::Always,
        },
        FdSpec {
            fd: FILES_FD_CHANNEL,
            slot: Slot::FdChannel,
            kind: FdKind::Channel(ChannelDir::FromWorker),
            placed: Placed::Always,
        },
    ],
    connect_tcp: false,
    seccomp: policy::FILES,
    refused: &[],
};

pub const TASKS: RoleSpec = RoleSpec {
    role: Role::Tasks,
    fds: &[FdSpec {
        fd: TASKS_DIR_FD,
        slot: Slot::TaskDir,
        kind: FdKind::Dir(DirAccess::ReadWrite),
        placed: Placed::Always,
    }],
    connect_tcp: false,
    seccomp: policy::TASKS,
    refused: &[],
};

/// The table of `role`.
pub const fn spec(role: Role) -> &'static RoleSpec {
    match role {
        Role::Catalog => &CATALOG,
        Role::Network => &NETWORK,
        Role::Files => &FILES,
        Role::Tasks => &TASKS,
    }
}

impl RoleSpec {
    /// The descriptor in `slot`, if the role has one.
    pub fn fd(&self, slot: Slot) -> Option<&'static FdSpec> {
        self.fds.iter().find(|f| f.slot == slot)
    }

    /// Its descriptor channel: number and direction.
    pub fn channel(&self) -> Option<(RawFd, ChannelDir)> {
        self.fds.iter().find_map(|f| match f.kind {
            FdKind::Channel(dir) => Some((f.fd, dir)),
            FdKind::Dir(_) => None,
        })
    }

    /// Descriptors kept open past startup: 0–2, the IPC socket, and [`Self::fds`].
    pub fn kept_fds(&self) -> Vec<RawFd> {
        [0, 1, 2, WORKER_IPC_FD].into_iter().chain(self.fds.iter().map(|f| f.fd)).collect()
    }
}

/// A worker's descriptors, owned from the start ([`claim`]).
#[derive(Debug, Default)]
pub struct Claimed {
    fds: Vec<(Slot, OwnedFd)>,
}

impl Claimed {
    /// Take the descriptor in `slot` (once); `None` if it was not placed.
    pub fn take(&mut self, slot: Slot) -> Option<OwnedFd> {
        let i = self.fds.iter().position(|(s, _)| *s == slot)?;
        Some(self.fds.swap_remove(i).1)
    }
}

/// Take ownership of every descriptor of `role` that is open. Call exactly
/// once, first thing in the worker (after [`crate::prepare_worker`] closed
/// everything else, before any runtime, thread or library can open a
/// descriptor): a number the supervisor did not place is then still free,
/// and is not claimed.
pub fn claim(role: Role) -> Claimed {
    let mut claimed = Claimed::default();
    for f in spec(role).fds {
        // SAFETY: F_GETFD only queries the descriptor table.
        let open = unsafe { nix::libc::fcntl(f.fd, nix::libc::F_GETFD) } >= 0;
        if open {
            // SAFETY: the spawner placed this descriptor before exec; this
            // single-threaded process has opened nothing since
            // prepare_worker closed every other one, and `claim` runs once,
            // so nothing else owns it.
            claimed.fds.push((f.slot, unsafe { OwnedFd::from_raw_fd(f.fd) }));
        }
    }
    claimed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::fds::SPAWNER_EXE_FD;

    fn allows(list: &[Allow], name: &str) -> bool {
        list.iter().any(|a| a.name == name)
    }

    /// The table agrees with the policies: what a role is given is what its
    /// seccomp list can use, and nothing more.
    #[test]
    fn the_table_agrees_with_the_policies() {
        for role in Role::ALL {
            let s = spec(role);
            assert_eq!(s.role, role);
            let (list, refused): (&[Allow], usize) = match role {
                Role::Catalog => (policy::CATALOG, 0),
                Role::Network => (policy::NETWORK, 2),
                Role::Files => (policy::FILES, 0),
                Role::Tasks => (policy::TASKS, 0),
            };
            let names = |l: &[Allow]| l.iter().map(|a| (a.name, a.nr)).collect::<Vec<_>>();
            assert_eq!(names(s.seccomp), names(list), "{role:?}: its policy file's seccomp list");
            assert_eq!(s.refused.len(), refused, "{role:?}: refusals");
            let kept = s.kept_fds();
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), kept.len(), "{role:?}: two descriptors share a number");
            for f in s.fds {
                assert!(f.fd > WORKER_IPC_FD && f.fd < FIRST_FREE_FD, "{role:?}: fd {} out of range", f.fd);
                assert_ne!(f.fd, SPAWNER_EXE_FD);
            }
            let channel = s.channel().is_some();
            assert_eq!(channel, allows(s.seccomp, "recvmsg") && allows(s.seccomp, "sendmsg"), "{role:?}: SCM_RIGHTS");
            let dirs = s.fds.iter().any(|f| matches!(f.kind, FdKind::Dir(_)));
            assert_eq!(dirs, allows(s.seccomp, "openat"), "{role:?}: directories and openat");
            let writes = s.fds.iter().any(|f| f.kind == FdKind::Dir(DirAccess::ReadWrite));
            assert_eq!(writes, allows(s.seccomp, "unlinkat"), "{role:?}: writable directory and unlinkat");
            assert_eq!(s.connect_tcp, allows(s.seccomp, "connect"), "{role:?}: TCP and connect");
            assert_eq!(s.connect_tcp, allows(s.seccomp, "socket"), "{role:?}: TCP and socket");
            assert!(s.fds.iter().filter(|f| matches!(f.kind, FdKind::Channel(_))).count() <= 1);
        }
    }
}
