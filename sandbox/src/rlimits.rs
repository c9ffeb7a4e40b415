//! Resource limits and privileges set at startup: no core dumps (a core
//! would hold the token or file contents) and no capabilities (a worker
//! started by root keeps none: bounding, effective, permitted, inheritable
//! and ambient sets are emptied).

use nix::libc;
use nix::sys::resource::{Resource, setrlimit};

pub fn apply() -> Result<(), nix::Error> {
    setrlimit(Resource::RLIMIT_CORE, 0, 0)
}

/// Drop every capability. Without `CAP_SETPCAP` the bounding set cannot
/// shrink (an unprivileged worker has nothing to drop anyway), so those
/// errors are ignored; capset must succeed or find nothing to drop.
pub fn drop_capabilities() -> Result<(), nix::Error> {
    for cap in 0..64 {
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes no pointers.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: header and data are valid, properly laid out (v3: two data
    // elements) and live across the call; capset only reads them.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    if r == 0 {
        return Ok(());
    }
    let err = nix::Error::last();
    // capset may itself be filtered (systemd's ~@privileged answers EPERM);
    // that is fine when there is nothing to drop.
    let mut now = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    let mut header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    // SAFETY: as above; capget writes two data elements into `now`.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut Header, now.as_mut_ptr()) };
    if r == 0 && now.iter().all(|d| d.effective == 0 && d.permitted == 0 && d.inheritable == 0) {
        Ok(())
    } else {
        Err(err)
    }
}
