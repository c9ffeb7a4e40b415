//! seccomp-bpf: compile a process's lists ([`crate::policy`]) (the rules
//! with `seccompiler`, laid out by [`crate::bpf`]) and install them on the
//! (single) calling thread; threads created later inherit them.
//!
//! Mismatch kills the whole process (`SECCOMP_RET_KILL_PROCESS`, seen by the
//! supervisor as death by `SIGSYS`). A second, smaller filter answers a few
//! calls with an errno (see [`crate::policy::refused`]); when filters stack the
//! kernel takes the most restrictive verdict, so an errno beats the first
//! filter's allow.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
use snowluma_proto::Role;

use crate::policy::{self, Allow, Cmp};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("this architecture has no seccomp policy")]
    UnsupportedArch,
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
    #[error("laying out the seccomp filter: {0}")]
    Layout(#[from] crate::bpf::BpfError),
}

/// `seccomp_data.arch` of this build's architecture (`AUDIT_ARCH_*`).
fn audit_arch() -> Result<u32, SeccompError> {
    if cfg!(target_arch = "x86_64") {
        Ok(0xC000_003E)
    } else if cfg!(target_arch = "aarch64") {
        Ok(0xC000_00B7)
    } else {
        Err(SeccompError::UnsupportedArch)
    }
}

/// One program: the calls in `rules` get `matched` (when their conditions
/// hold), every other call `mismatch`.
fn program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    Ok(crate::bpf::program(rules, mismatch, matched, audit_arch()?)?)
}

fn condition(c: Cmp, self_pid: u64) -> Result<SeccompCondition, SeccompError> {
    let fill = |v: u64| if v == policy::SELF_PID { self_pid } else { v };
    Ok(match c {
        Cmp::Eq(arg, v) => SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, fill(v))?,
        Cmp::Ne(arg, v) => SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::Ne, fill(v))?,
        Cmp::Masked(arg, mask, v) => {
            SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), v)?
        }
    })
}

fn rules(allows: &[&Allow], self_pid: u64) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in allows {
        let mut rs = Vec::new();
        for set in a.when {
            let conds = set.iter().map(|c| condition(*c, self_pid)).collect::<Result<Vec<_>, _>>()?;
            rs.push(SeccompRule::new(conds)?);
        }
        // An unconditional entry must stay unconditional even if another
        // entry for the same call has conditions: empty rules = always.
        match map.get_mut(&a.nr) {
            Some(existing) if existing.is_empty() || rs.is_empty() => existing.clear(),
            Some(existing) => existing.extend(rs),
            None => {
                map.insert(a.nr, rs);
            }
        }
    }
    Ok(map)
}

/// The compiled filters of a role: the allow-list, then one per errno list.
pub fn compile(role: Role, mismatch: SeccompAction) -> Result<Vec<BpfProgram>, SeccompError> {
    compile_lists(policy::extra(role), policy::refused(role), mismatch)
}

/// What one program is made of: the listed calls' rules, the action of
/// every other call, and the listed calls' action.
type Spec = (BTreeMap<i64, Vec<SeccompRule>>, SeccompAction, SeccompAction);

/// Compile [`policy::BASE`] plus `extra`, with `refused` calls answered by
/// their errno.
pub fn compile_lists(
    extra: &[Allow],
    refused: &[(i32, &[Allow])],
    mismatch: SeccompAction,
) -> Result<Vec<BpfProgram>, SeccompError> {
    programs(specs_of_lists(extra, refused, mismatch)?)
}

fn programs(specs: Vec<Spec>) -> Result<Vec<BpfProgram>, SeccompError> {
    specs.into_iter().map(|(rules, mismatch, matched)| program(rules, mismatch, matched)).collect()
}

fn specs_of_lists(
    extra: &[Allow],
    refused: &[(i32, &[Allow])],
    mismatch: SeccompAction,
) -> Result<Vec<Spec>, SeccompError> {
    let self_pid = u64::from(std::process::id());
    // Calls refused with an errno must pass the allow-list filter (a kill
    // there would win); the errno filter then answers them.
    let passed: Vec<Allow> =
        refused.iter().flat_map(|(_, list)| list.iter()).map(|a| Allow { name: a.name, nr: a.nr, when: &[] }).collect();
    let allows: Vec<&Allow> = policy::BASE.iter().chain(extra).chain(passed.iter()).collect();
    let mut out = vec![(rules(&allows, self_pid)?, mismatch, SeccompAction::Allow)];
    for (errno, list) in refused {
        let list: Vec<&Allow> = list.iter().collect();
        out.push((rules(&list, self_pid)?, SeccompAction::Allow, SeccompAction::Errno(*errno as u32)));
    }
    Ok(out)
}

/// Install the role's filters on the calling thread. No new privileges must
/// already be set (it is, by [`crate::confine_worker`]).
pub fn apply(role: Role) -> Result<usize, SeccompError> {
    install(compile(role, SeccompAction::KillProcess)?)
}

/// The supervisor's filter (see [`policy::SUPERVISOR`]).
pub fn apply_supervisor() -> Result<usize, SeccompError> {
    install(compile_lists(policy::SUPERVISOR, policy::SUPERVISOR_REFUSED, SeccompAction::KillProcess)?)
}

/// The HTTP front's filters (see [`policy::HTTP_FRONT`]).
pub fn apply_http_front() -> Result<usize, SeccompError> {
    install(compile_lists(policy::HTTP_FRONT, policy::HTTP_FRONT_REFUSED, SeccompAction::KillProcess)?)
}

/// The spawner's filters: the deny-list ([`policy::SPAWNER_DENY`], those
/// calls kill) and the refusals ([`policy::SPAWNER_REFUSED`], answered
/// `EACCES`); everything else is left to the workers' own allow-lists.
pub fn apply_spawner() -> Result<usize, SeccompError> {
    install(compile_spawner()?)
}

/// The spawner's two programs (the deny-list first, as [`install`] expects
/// the one that may not call prctl last).
pub fn compile_spawner() -> Result<Vec<BpfProgram>, SeccompError> {
    programs(spawner_specs()?)
}

fn spawner_specs() -> Result<Vec<Spec>, SeccompError> {
    let pid = u64::from(std::process::id());
    let deny: Vec<&Allow> = policy::SPAWNER_DENY.iter().collect();
    let refused: Vec<&Allow> = policy::SPAWNER_REFUSED.iter().collect();
    Ok(vec![
        (rules(&deny, pid)?, SeccompAction::Allow, SeccompAction::KillProcess),
        (rules(&refused, pid)?, SeccompAction::Allow, SeccompAction::Errno(nix::libc::EACCES as u32)),
    ])
}

fn install(programs: Vec<BpfProgram>) -> Result<usize, SeccompError> {
    let instructions = programs.iter().map(Vec::len).sum();
    if cfg!(snowluma_pgo_training) {
        // A profile-training build (`scripts/pgo-profile`, never shipped)
        // installs no filter, so that its processes can write their profiles.
        return Ok(instructions);
    }
    // The allow-list goes last: seccompiler's apply_filter calls
    // prctl(PR_SET_NO_NEW_PRIVS), which the allow-list does not permit.
    for p in programs.iter().rev() {
        seccompiler::apply_filter(p)?;
    }
    Ok(instructions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::interp;

    /// Every program this module builds, as its spec, by name.
    fn every_spec() -> Vec<(String, Spec)> {
        let mut all = Vec::new();
        let mut add = |name: String, specs: Vec<Spec>| all.extend(specs.into_iter().map(|s| (name.clone(), s)));
        for role in Role::ALL {
            add(
                format!("{role:?}"),
                specs_of_lists(policy::extra(role), policy::refused(role), SeccompAction::KillProcess).unwrap(),
            );
        }
        add(
            "supervisor".into(),
            specs_of_lists(policy::SUPERVISOR, policy::SUPERVISOR_REFUSED, SeccompAction::KillProcess).unwrap(),
        );
        add(
            "front".into(),
            specs_of_lists(policy::HTTP_FRONT, policy::HTTP_FRONT_REFUSED, SeccompAction::KillProcess).unwrap(),
        );
        add("spawner".into(), spawner_specs().unwrap());
        all
    }

    /// Argument values around every constant a rule compares with.
    fn probes(rules: &BTreeMap<i64, Vec<SeccompRule>>, pid: u64) -> Vec<u64> {
        let mut v: Vec<u64> = vec![0, 1, 2, u64::MAX, u64::from(u32::MAX), 1 << 32, pid, pid + 1];
        let text = format!("{rules:?}");
        // The constants, from the rules' own Debug text (value: N, mask N).
        for word in text.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty()) {
            if let Ok(n) = word.parse::<u64>() {
                v.extend([n, n.wrapping_add(1), n.wrapping_sub(1), !n, n | 1, n & !1, n << 1, n | (1 << 32)]);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The binary-search layout decides exactly as seccompiler's own
    /// program: every call number (and numbers no architecture uses, the
    /// x32 bit, -1), every argument value around every constant of the
    /// rules in any argument, pairs of them, and other architectures.
    #[test]
    fn the_layout_decides_as_seccompiler_does() {
        let arch = if cfg!(target_arch = "x86_64") {
            seccompiler::TargetArch::x86_64
        } else {
            seccompiler::TargetArch::aarch64
        };
        let native = audit_arch().unwrap();
        let pid = u64::from(std::process::id());
        let mut checked = 0u64;
        for (name, (rules, mismatch, matched)) in every_spec() {
            let ours = program(rules.clone(), mismatch.clone(), matched.clone()).unwrap();
            let theirs: BpfProgram = seccompiler::SeccompFilter::new(rules.clone(), mismatch, matched, arch)
                .and_then(BpfProgram::try_from)
                .unwrap();
            let values = probes(&rules, pid);
            let mut numbers: Vec<u32> = (0..1100).collect();
            numbers.extend([0x4000_0000, 0x4000_0001, 0x4000_0000 | 59, u32::MAX, u32::MAX - 1, 1 << 31]);
            for &nr in &numbers {
                let mut cases: Vec<[u64; 6]> = vec![[0; 6]];
                if rules.get(&i64::from(nr)).is_some_and(|r| !r.is_empty()) {
                    for &a in &values {
                        for i in 0..6 {
                            let mut args = [0u64; 6];
                            args[i] = a;
                            cases.push(args);
                        }
                        cases.push([a; 6]);
                        for &b in values.iter().step_by(3) {
                            cases.push([a, b, a, b, a, b]);
                            cases.push([b, a, b, a, b, a]);
                        }
                    }
                }
                for args in cases {
                    for arch_word in [native, 0x4000_0003, 0] {
                        let d = interp::data(nr, arch_word, args);
                        assert_eq!(
                            interp::run(&ours, &d),
                            interp::run(&theirs, &d),
                            "{name}: nr {nr}, arch {arch_word:#x}, args {args:?}"
                        );
                        checked += 1;
                    }
                }
            }
            assert!(
                ours.len() <= theirs.len() + 8,
                "{name}: {} instructions against seccompiler's {}",
                ours.len(),
                theirs.len()
            );
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    fn every_role_compiles() {
        for role in Role::ALL {
            let p = compile(role, SeccompAction::KillProcess).unwrap();
            assert!(!p.is_empty());
        }
    }

    #[test]
    fn no_role_may_exec_or_trace() {
        for role in Role::ALL {
            for a in policy::BASE.iter().chain(policy::extra(role)) {
                assert!(
                    ![
                        nix::libc::SYS_execve,
                        nix::libc::SYS_execveat,
                        nix::libc::SYS_ptrace,
                        nix::libc::SYS_kill,
                        nix::libc::SYS_process_vm_readv,
                        nix::libc::SYS_process_vm_writev,
                        nix::libc::SYS_io_uring_setup,
                        nix::libc::SYS_io_uring_enter,
                        nix::libc::SYS_socketpair,
                        nix::libc::SYS_bind,
                        nix::libc::SYS_listen,
                    ]
                    .contains(&a.nr),
                    "{} allows {}",
                    role.as_str(),
                    a.name
                );
            }
        }
    }

    #[test]
    fn the_http_front_may_accept_but_not_exec_connect_open_or_listen_anew() {
        let p = compile_lists(policy::HTTP_FRONT, policy::HTTP_FRONT_REFUSED, SeccompAction::KillProcess).unwrap();
        assert_eq!(p.len(), 2, "the allow-list and the EACCES list");
        let allowed: Vec<i64> = policy::BASE.iter().chain(policy::HTTP_FRONT).map(|a| a.nr).collect();
        assert!(allowed.contains(&nix::libc::SYS_accept4));
        for forbidden in [
            nix::libc::SYS_execve,
            nix::libc::SYS_execveat,
            nix::libc::SYS_ptrace,
            nix::libc::SYS_kill,
            nix::libc::SYS_bind,
            nix::libc::SYS_listen,
            nix::libc::SYS_socketpair,
            nix::libc::SYS_clone,
            nix::libc::SYS_clone3,
            nix::libc::SYS_memfd_create,
        ] {
            assert!(!allowed.contains(&forbidden), "the front allows {forbidden}");
        }
        // socket, connect and openat pass the allow-list only to be refused.
        let refused: Vec<i64> = policy::HTTP_FRONT_REFUSED.iter().flat_map(|(_, l)| l.iter()).map(|a| a.nr).collect();
        for nr in [nix::libc::SYS_socket, nix::libc::SYS_connect, nix::libc::SYS_openat] {
            assert!(refused.contains(&nr));
        }
    }

    #[test]
    fn only_the_network_executor_opens_sockets_and_only_the_file_workers_open_paths() {
        for role in Role::ALL {
            let names: Vec<&str> = policy::BASE.iter().chain(policy::extra(role)).map(|a| a.name).collect();
            assert_eq!(names.contains(&"socket"), role == Role::Network, "{}", role.as_str());
            assert_eq!(names.contains(&"connect"), role == Role::Network, "{}", role.as_str());
            assert_eq!(names.contains(&"openat"), matches!(role, Role::Files | Role::Tasks), "{}", role.as_str());
        }
    }
}
