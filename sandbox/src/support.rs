//! What this kernel can enforce, the startup gate for weak kernels, and the
//! `confinement` object of `get_runtime_info`.
//!
//! `SNOWLUMA_MCP_ALLOW_UNCONFINED=1` is the operator's explicit opt-out for
//! kernels that cannot enforce all of the confinement: without it, read and
//! write modes refuse to start there; docs mode starts with a warning.

use serde_json::{Value, json};
use snowluma_proto::Role;

use crate::landlock::{self as ll, Enforcement};
use crate::policy;
use crate::profile::SupervisorReport;

pub const ALLOW_UNCONFINED_VAR: &str = "SNOWLUMA_MCP_ALLOW_UNCONFINED";

/// What this kernel can enforce.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Support {
    pub landlock_abi: i32,
    pub seccomp: bool,
}

impl Support {
    pub fn detect() -> Support {
        // PR_GET_SECCOMP answers (0, or 2 when a filter such as systemd's
        // SystemCallFilter= is already installed) wherever seccomp exists;
        // /proc/sys may be hidden (systemd ProcSubset=pid), so it is not read.
        // SAFETY: PR_GET_SECCOMP takes no pointers and only reports state.
        let seccomp = unsafe { nix::libc::prctl(nix::libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
        Support { landlock_abi: ll::kernel_abi(), seccomp }
    }
    pub fn full(&self) -> bool {
        ll::predicted(self.landlock_abi) == Enforcement::FullyEnforced && self.seccomp
    }
}

/// `SNOWLUMA_MCP_ALLOW_UNCONFINED`: only `1` or `true` opt out.
pub fn opt_out_from_env() -> bool {
    std::env::var(ALLOW_UNCONFINED_VAR).map(|v| v == "1" || v.eq_ignore_ascii_case("true")).unwrap_or(false)
}

/// The startup gate for a server in `mode` (its name), which `executes`
/// actions (read and write modes) or not (docs mode). `Ok(true)`: processes
/// may start degraded (workers get argv `unconfined-ok`); `Ok(false)`: full
/// confinement required; `Err`: refuse.
pub fn gate(mode: &str, executes: bool, support: Support, opt_out: bool) -> Result<bool, String> {
    if support.full() {
        return Ok(opt_out);
    }
    let what = format!(
        "this kernel cannot fully enforce confinement (Landlock ABI {} of {} needed, seccomp {})",
        support.landlock_abi,
        ll::PINNED_ABI_NUMBER,
        if support.seccomp { "available" } else { "unavailable" }
    );
    if opt_out {
        tracing::warn!("{what}; running anyway because {ALLOW_UNCONFINED_VAR}=1");
        return Ok(true);
    }
    if executes {
        Err(format!(
            "{what}; {mode} mode refuses to start. Set {ALLOW_UNCONFINED_VAR}=1 to run with weaker confinement"
        ))
    } else {
        tracing::warn!("{what}; {mode} mode starts anyway (it executes nothing)");
        Ok(true)
    }
}

/// The `confinement` object of `get_runtime_info`: what is enforced on the
/// supervisor and on each running worker role. Workers that start confine
/// themselves with the same pinned policy on the same kernel and refuse to
/// start if they cannot reach full enforcement without the opt-out, so each
/// running worker's state follows from the kernel's support.
pub fn runtime_summary(
    support: Support,
    supervisor: Option<&SupervisorReport>,
    degraded_ok: bool,
    roles: &[Role],
) -> Value {
    let role_entry = |r: Role| {
        json!({
            "landlock": {
                "abi": support.landlock_abi,
                "pinned_abi": ll::PINNED_ABI_NUMBER,
                "status": ll::predicted(support.landlock_abi).as_str(),
            },
            "seccomp": support.seccomp,
            "seccomp_allowed_syscalls": policy::allowed_count(r),
            "no_new_privs": true,
            "dumpable": false,
        })
    };
    let mut workers = serde_json::Map::new();
    for r in roles {
        workers.insert(r.as_str().into(), role_entry(*r));
    }
    let sup = match supervisor {
        Some(s) => json!({
            "landlock": {"abi": s.landlock.kernel_abi, "pinned_abi": ll::PINNED_ABI_NUMBER, "status": s.landlock.status.as_str()},
            "seccomp": s.seccomp,
            "no_new_privs": s.no_new_privs,
            "dumpable": s.dumpable,
        }),
        None => json!({"landlock": {"abi": support.landlock_abi, "status": "not_enforced"}, "seccomp": false}),
    };
    json!({
        "fully_enforced": support.full() && supervisor.is_some_and(|s| s.landlock.status == Enforcement::FullyEnforced),
        "unconfined_allowed": degraded_ok,
        "supervisor": sup,
        "workers": Value::Object(workers),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_kernels_refuse_read_and_write_without_opt_out() {
        let weak = Support { landlock_abi: 3, seccomp: true };
        assert!(gate("read", true, weak, false).is_err());
        assert!(gate("write", true, weak, false).is_err());
        assert_eq!(gate("docs", false, weak, false), Ok(true));
        assert_eq!(gate("write", true, weak, true), Ok(true));
        let full = Support { landlock_abi: 7, seccomp: true };
        assert_eq!(gate("write", true, full, false), Ok(false));
        let no_seccomp = Support { landlock_abi: 7, seccomp: false };
        assert!(gate("read", true, no_seccomp, false).is_err());
    }
}
