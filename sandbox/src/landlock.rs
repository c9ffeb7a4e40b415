//! Landlock: filesystem, TCP-port and scope restrictions.
//!
//! The handled rights are pinned to [`ABI`] (6: filesystem incl. `Refer`,
//! `Truncate` and `IoctlDev`, TCP bind/connect, signal and abstract-socket
//! scoping), tested on this ABI, so a newer kernel does not change what a
//! role may do. Everything handled and not granted by a rule is denied.
//! Compatibility is best effort: an older kernel enforces what it can and
//! the status says so ([`Enforcement`]); the caller decides whether that is
//! acceptable (read and write modes refuse anything but full enforcement
//! unless the operator opts out).

use std::os::fd::{AsFd, BorrowedFd, RawFd};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, LandlockStatus, NetPort, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::Serialize;

/// The Landlock ABI whose rights we handle.
pub const PINNED_ABI: ABI = ABI::V6;
pub const PINNED_ABI_NUMBER: i32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::FullyEnforced => "fully_enforced",
            Enforcement::PartiallyEnforced => "partially_enforced",
            Enforcement::NotEnforced => "not_enforced",
        }
    }
}

/// What Landlock enforced on this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LandlockReport {
    /// The kernel's Landlock ABI (0: Landlock unavailable).
    pub kernel_abi: i32,
    pub status: Enforcement,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
}

/// The kernel's Landlock ABI version, or 0 when Landlock is unavailable.
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // reads no memory and only returns the ABI version or an error.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 { 0 } else { i32::try_from(v).unwrap_or(i32::MAX) }
}

/// Read-only rights for a data directory (no `Execute`).
pub fn read_dir_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir
}

/// Read-write rights for a data directory: create, write, truncate, rename
/// within, remove; no `Execute`, no special files, no symlinks, no ioctl.
pub fn write_dir_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile
        | AccessFs::ReadDir
        | AccessFs::WriteFile
        | AccessFs::Truncate
        | AccessFs::MakeReg
        | AccessFs::MakeDir
        | AccessFs::RemoveFile
        | AccessFs::RemoveDir
        | AccessFs::Refer
}

/// A filesystem rule: rights beneath the directory (or on the file) `fd`.
#[derive(Debug, Clone, Copy)]
pub struct FsRule<'a> {
    pub fd: BorrowedFd<'a>,
    pub access: BitFlags<AccessFs>,
}

/// Everything one Landlock domain grants; what is not here is denied.
#[derive(Debug, Default)]
pub struct Grant<'a> {
    pub fs: Vec<FsRule<'a>>,
    pub connect_tcp: Vec<u16>,
}

/// Build and enforce a ruleset handling every filesystem and TCP right and
/// both scopes of [`PINNED_ABI`], granting exactly `grant`.
pub fn restrict(grant: &Grant<'_>) -> Result<LandlockReport, LandlockError> {
    if cfg!(snowluma_pgo_training) {
        // A profile-training build (`scripts/pgo-profile`, never shipped)
        // enforces no ruleset, so that its processes can write their profiles.
        let _ = grant;
        return Ok(LandlockReport { kernel_abi: kernel_abi(), status: Enforcement::FullyEnforced });
    }
    let mut created = Ruleset::default()
        .handle_access(AccessFs::from_all(PINNED_ABI))?
        .handle_access(AccessNet::from_all(PINNED_ABI))?
        .scope(Scope::from_all(PINNED_ABI))?
        .create()?;
    for r in &grant.fs {
        created = created.add_rule(PathBeneath::new(r.fd, r.access))?;
    }
    for port in &grant.connect_tcp {
        created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
    }
    let status = created.restrict_self()?;
    let kernel_abi = match status.landlock {
        LandlockStatus::Available { kernel_abi: Some(v), .. } => v,
        LandlockStatus::Available { effective_abi, .. } => abi_number(effective_abi),
        _ => 0,
    };
    let status = match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::FullyEnforced,
        RulesetStatus::PartiallyEnforced => Enforcement::PartiallyEnforced,
        RulesetStatus::NotEnforced => Enforcement::NotEnforced,
    };
    Ok(LandlockReport { kernel_abi, status })
}

fn abi_number(abi: ABI) -> i32 {
    [ABI::V1, ABI::V2, ABI::V3, ABI::V4, ABI::V5, ABI::V6, ABI::V7]
        .iter()
        .position(|a| *a == abi)
        .map(|i| i as i32 + 1)
        .unwrap_or(0)
}

/// What a kernel with `kernel_abi` enforces of our pinned rulesets.
pub fn predicted(kernel_abi: i32) -> Enforcement {
    if kernel_abi >= PINNED_ABI_NUMBER {
        Enforcement::FullyEnforced
    } else if kernel_abi > 0 {
        Enforcement::PartiallyEnforced
    } else {
        Enforcement::NotEnforced
    }
}

/// Borrow a descriptor number the process was started with.
///
/// # Safety
/// `fd` must be open for as long as the borrow is used.
pub unsafe fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: forwarded to the caller's contract.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// A descriptor is a real open directory (fstat), so a rule on it means what it says.
pub fn is_dir(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd.as_fd()).map(|s| s.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR).unwrap_or(false)
}
