//! The layout of a seccomp program: a binary search over system call
//! numbers instead of seccompiler's one comparison per listed call.
//!
//! seccompiler tests the call number against every listed call in turn, so
//! an unlisted call walks ~2 instructions per listed one (~160 in the
//! supervisor's list). The kernel runs each program once per call number
//! when it is installed (to find the calls it can allow without running it
//! again), so that walk was most of the cost of installing a filter, in
//! every process at start-up: the supervisor's list took 190-280 µs to
//! install, a program of the same length whose walk is short 70-100 µs.
//! Here a call's number is found in ~log2(n) comparisons (and the
//! supervisor's list installs in 62-104 µs).
//!
//! What a listed call's conditions compile to is seccompiler's own code
//! (`BpfProgram::from(SeccompRule)`), laid out as seccompiler lays it out
//! after its number test: each rule, then the match action; the mismatch
//! action after the last rule. The tests run both programs on every call
//! number and on argument values around every constant of every rule and
//! find the same action.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompRule, sock_filter};

/// `BPF_LD | BPF_W | BPF_ABS`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`.
const BPF_JMP_JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const BPF_JMP_JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const BPF_JMP_JGE_K: u16 = 0x35;
/// `BPF_RET | BPF_K`.
const BPF_RET_K: u16 = 0x06;
/// `seccomp_data` offsets.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
/// The kernel's limit on a program's length.
const MAX_LEN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("a seccomp program needs different match and mismatch actions")]
    SameActions,
    #[error("a seccomp program of {0} instructions is longer than the kernel allows")]
    TooLong(usize),
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// What a range of call numbers gets.
enum Leaf {
    Matched,
    Mismatched,
    /// One listed call with conditions: its rules, in order.
    Rules(Vec<SeccompRule>),
}

/// Call numbers from `start` up to the next range's start.
struct Range {
    start: u32,
    leaf: Leaf,
}

/// The program: architecture check (another architecture's calls kill the
/// process, as seccompiler's do), then the search over `rules` (a listed
/// call without rules always matches).
pub fn program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
    audit_arch: u32,
) -> Result<BpfProgram, BpfError> {
    if mismatch == matched {
        return Err(BpfError::SameActions);
    }
    let (on_match, on_mismatch) = (u32::from(matched), u32::from(mismatch));
    // Ranges alternate between listed calls and the gaps between them; the
    // last one is always a gap (up to 2^32 - 1), until a listed call ends it.
    let mut ranges: Vec<Range> = vec![Range { start: 0, leaf: Leaf::Mismatched }];
    for (nr, rs) in rules {
        // The loaded number is the 32-bit `nr` as unsigned; a listed
        // number outside that range could never be matched.
        let Ok(nr) = u32::try_from(nr) else { continue };
        let leaf = if rs.is_empty() { Leaf::Matched } else { Leaf::Rules(rs) };
        if ranges.last().is_some_and(|gap| gap.start == nr) {
            // No gap before this call: it replaces the empty one, and an
            // unconditional call joins the unconditional range before it.
            ranges.pop();
            let joins =
                matches!(leaf, Leaf::Matched) && matches!(ranges.last(), Some(Range { leaf: Leaf::Matched, .. }));
            if !joins {
                ranges.push(Range { start: nr, leaf });
            }
        } else {
            ranges.push(Range { start: nr, leaf });
        }
        if let Some(next) = nr.checked_add(1) {
            ranges.push(Range { start: next, leaf: Leaf::Mismatched });
        }
    }

    let mut out = vec![
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        jump(BPF_JMP_JEQ_K, audit_arch, 1, 0),
        stmt(BPF_RET_K, nix::libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR_OFFSET),
    ];
    out.extend(search(ranges, on_match, on_mismatch));
    if out.len() > MAX_LEN {
        return Err(BpfError::TooLong(out.len()));
    }
    Ok(out)
}

/// The search over `ranges` (sorted, non-empty), the number in the
/// accumulator and known to be at least the first range's start.
fn search(mut ranges: Vec<Range>, on_match: u32, on_mismatch: u32) -> Vec<sock_filter> {
    if ranges.len() == 1 {
        let Some(only) = ranges.pop() else { return Vec::new() };
        return leaf(only.leaf, on_match, on_mismatch);
    }
    let upper = ranges.split_off(ranges.len() / 2);
    let pivot = upper[0].start;
    let below = search(ranges, on_match, on_mismatch);
    let above = search(upper, on_match, on_mismatch);
    let mut out = Vec::with_capacity(below.len() + above.len() + 2);
    match u8::try_from(below.len()) {
        // n >= pivot: jump over the lower half.
        Ok(skip) => out.push(jump(BPF_JMP_JGE_K, pivot, skip, 0)),
        // Too far for a conditional jump: through an unconditional one.
        Err(_) => {
            out.push(jump(BPF_JMP_JGE_K, pivot, 0, 1));
            out.push(stmt(BPF_JMP_JA, u32::try_from(below.len()).unwrap_or(u32::MAX)));
        }
    }
    out.extend(below);
    out.extend(above);
    out
}

fn leaf(leaf: Leaf, on_match: u32, on_mismatch: u32) -> Vec<sock_filter> {
    match leaf {
        Leaf::Matched => vec![stmt(BPF_RET_K, on_match)],
        Leaf::Mismatched => vec![stmt(BPF_RET_K, on_mismatch)],
        Leaf::Rules(rules) => {
            // As seccompiler lays out a call's rules: each falls through to
            // the next when one of its conditions fails.
            let mut out = Vec::new();
            for rule in rules {
                out.extend(BpfProgram::from(rule));
                out.push(stmt(BPF_RET_K, on_match));
            }
            out.push(stmt(BPF_RET_K, on_mismatch));
            out
        }
    }
}

#[cfg(test)]
pub(crate) mod interp {
    //! A classic-BPF interpreter for the instructions seccomp programs
    //! (seccompiler's and ours) use, to compare them.
    use seccompiler::sock_filter;

    /// `seccomp_data` for `nr` with `args`, on `arch`.
    pub fn data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_le_bytes());
        d[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        d
    }

    /// The action `prog` returns for `data`; panics on anything outside
    /// the subset (a bad jump, an unknown opcode, running off the end).
    pub fn run(prog: &[sock_filter], data: &[u8; 64]) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &prog[pc];
            pc += 1;
            let jmp = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
            match i.code {
                0x20 => {
                    let o = i.k as usize;
                    acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                }
                0x54 => acc &= i.k,
                0x05 => pc += i.k as usize,
                0x15 => pc += jmp(acc == i.k),
                0x25 => pc += jmp(acc > i.k),
                0x35 => pc += jmp(acc >= i.k),
                0x45 => pc += jmp(acc & i.k != 0),
                0x06 => return i.k,
                other => panic!("opcode {other:#x} at {}", pc - 1),
            }
        }
    }
}
