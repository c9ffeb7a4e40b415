//! The task-store worker's profile: files beneath the task directory's
//! descriptor only (Landlock decides which), no network, no exec.

use nix::libc;

use super::{Allow, any};

/// The task store: reads, writes, links, renames and removes records
/// beneath its directory descriptor, syncs them, and holds the directory's
/// lease (`flock`, std's `File::try_lock`).
pub const TASKS: &[Allow] = &[
    any("fstat", libc::SYS_fstat),
    any("statx", libc::SYS_statx),
    any("newfstatat", libc::SYS_newfstatat),
    any("lseek", libc::SYS_lseek),
    any("openat", libc::SYS_openat),
    any("getdents64", libc::SYS_getdents64),
    any("linkat", libc::SYS_linkat),
    any("unlinkat", libc::SYS_unlinkat),
    // std::fs's path form (doctor's control probe); Landlock decides which paths.
    any("unlink", libc::SYS_unlink),
    any("renameat", libc::SYS_renameat),
    any("renameat2", libc::SYS_renameat2),
    any("fsync", libc::SYS_fsync),
    any("fdatasync", libc::SYS_fdatasync),
    any("flock", libc::SYS_flock),
    // Records and the directory must belong to this user.
    any("geteuid", libc::SYS_geteuid),
];
