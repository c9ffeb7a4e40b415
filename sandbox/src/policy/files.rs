//! The file-transfer worker's profile: files beneath the two directory
//! descriptors it was given, and its descriptor channel; no network.

use nix::libc;

use super::{Allow, any};

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
    // An upload's input path is resolved as Node's realpath resolves it: a
    // symlink on it is read from its own O_PATH descriptor (files.rs), and
    // what it names is then opened beneath the root with openat2.
    any("readlinkat", libc::SYS_readlinkat),
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
