//! Self-confinement of a worker, run before its runtime starts any thread.
//!
//! Today: no new privileges and not dumpable, for every role. The Landlock,
//! seccomp and rlimit layers (one module per mechanism) are added by the
//! confinement work; this is the single place each role's policy is applied.

use snowluma_proto::Role;

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("prctl({what}) failed: {source}")]
    Prctl { what: &'static str, source: nix::Error },
}

pub fn confine_self(role: Role) -> Result<(), ConfineError> {
    // A readable process name for ps/top/journal (the exec path is a /proc fd).
    let name = format!("snowluma-{}", role.as_str());
    if let Ok(c) = std::ffi::CString::new(name) {
        let _ = nix::sys::prctl::set_name(&c);
    }
    nix::sys::prctl::set_no_new_privs()
        .map_err(|source| ConfineError::Prctl { what: "PR_SET_NO_NEW_PRIVS", source })?;
    nix::sys::prctl::set_dumpable(false).map_err(|source| ConfineError::Prctl { what: "PR_SET_DUMPABLE", source })?;
    Ok(())
}
