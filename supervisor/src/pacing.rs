//! Send pacing (`SNOWLUMA_MCP_SEND_INTERVAL_MS`, `SEND_BURST`,
//! `SEND_REFILL_MS`): a minimum interval between two sends to one target
//! and a global token bucket over all sends, for the actions the catalog
//! marks as sending (`snowluma_catalog::safety::SENDS`). A call over a
//! limit is refused at once (`rate_limited`, with `retry_after_ms`): never
//! queued, never retried. Both checks and the taking of the slot happen
//! under one lock, so concurrent calls cannot pass together what one could
//! not.
//!
//! The window is this runtime's (one server process tree), or, in a
//! `serve-http` session, its HTTP principal's: the launcher hands every
//! session tree of one token the same memfd ([`SharedWindow`], layout in
//! `snowluma_proto::session::PACING_STATE_SIZE`), and each decision is made
//! under `flock` on it with the same logic as in memory. Its per-target
//! table has [`PACING_SLOTS`] entries; an entry older than the interval is
//! free, and when none is free a send to a new target is refused as
//! `rate_limited` (conservatively, until the oldest entry expires). The
//! clock is `CLOCK_MONOTONIC` in milliseconds, the same in every tree.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Mutex;

use serde_json::{Value, json};
use snowluma_catalog::Action;
use snowluma_catalog::safety::{self, TargetKind};
use snowluma_config::safety::PacingConfig;
use snowluma_proto::session::{PACING_SLOTS, PACING_STATE_SIZE};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::args::Params;

/// Targets whose last send is remembered before old ones are pruned.
const PRUNE_AT: usize = 4096;

/// The shared state's first word: its layout's name and version.
const MAGIC: u64 = u64::from_le_bytes(*b"SLMPACE1");
const HEADER: usize = 32;
const ENTRY: usize = 24;
const _: () = assert!(HEADER + ENTRY * PACING_SLOTS == PACING_STATE_SIZE);

/// What one send goes to, for the per-target interval.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Group(u64),
    User(u64),
    /// A send without a group or user (a qzone post): one target per action.
    Action(String),
}

impl Target {
    /// The target as the shared table stores it: kind (1 group, 2 user,
    /// 3 action; 0 is a free entry) and id (an action's by FNV-1a of its
    /// name: a collision only makes two actions share an interval).
    fn key(&self) -> (u64, u64) {
        match self {
            Target::Group(g) => (1, *g),
            Target::User(u) => (2, *u),
            Target::Action(name) => {
                let h = name
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
                (3, h)
            }
        }
    }
}

/// The global bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    /// The bucket's sends, in thousandths (so refills are exact).
    milli_tokens: u64,
    /// When the bucket was last brought up to date (ms).
    updated: u64,
}

struct State {
    /// The last admitted send to each target (ms).
    last: HashMap<Target, u64>,
    bucket: Bucket,
}

/// Milliseconds of `CLOCK_MONOTONIC`: system-wide, so every session tree
/// of a principal reads the same clock.
pub fn monotonic_ms() -> u64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let ms = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(ms)
}

/// Why an inherited pacing descriptor is not used.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error("not a regular file or memfd")]
    NotRegular,
    #[error("{0} bytes, not the expected {PACING_STATE_SIZE}")]
    WrongSize(u64),
    #[error("its contents are not a pacing state")]
    BadMagic,
    #[error("it cannot be reopened or read: {0}")]
    Io(#[from] std::io::Error),
}

/// A pacing window shared with other processes: a fixed-size state file
/// (the launcher's memfd for one HTTP token), reopened here so that this
/// process's `flock` is its own (a lock belongs to an open file
/// description, which the launcher's descriptor shares with every tree).
pub struct SharedWindow {
    file: File,
    /// `flock` does not exclude this process's own threads.
    local: Mutex<()>,
}

impl SharedWindow {
    /// Reopen and check `fd`: a regular file (a memfd is one) of exactly
    /// [`PACING_STATE_SIZE`] bytes, zeroed or holding a pacing state. The
    /// new descriptor is close-on-exec; `fd` is left to the caller. Needs
    /// `/proc/self/fd` (before confinement).
    pub fn open(fd: BorrowedFd<'_>) -> Result<SharedWindow, SharedError> {
        let file =
            std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let meta = file.metadata()?;
        let given = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
        if !meta.file_type().is_file() || meta.ino() != given.st_ino || meta.dev() != given.st_dev {
            return Err(SharedError::NotRegular);
        }
        if meta.len() != PACING_STATE_SIZE as u64 {
            return Err(SharedError::WrongSize(meta.len()));
        }
        let mut magic = [0u8; 8];
        file.read_exact_at(&mut magic, 0)?;
        if !matches!(u64::from_le_bytes(magic), 0 | MAGIC) {
            return Err(SharedError::BadMagic);
        }
        Ok(SharedWindow { file, local: Mutex::new(()) })
    }

    /// One decision under the lock: read the state, decide, write it back.
    fn admit(&self, c: PacingConfig, target: &Target, now: u64, take: bool) -> std::io::Result<Result<(), Limited>> {
        let _local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        self.file.lock()?;
        let result = self.admit_locked(c, target, now, take);
        let unlocked = self.file.unlock();
        let result = result?;
        unlocked?;
        Ok(result)
    }

    fn admit_locked(
        &self,
        c: PacingConfig,
        target: &Target,
        now: u64,
        take: bool,
    ) -> std::io::Result<Result<(), Limited>> {
        let mut buf = vec![0u8; PACING_STATE_SIZE];
        self.file.read_exact_at(&mut buf, 0)?;
        let mut layout = Layout::decode(&buf, c);
        let before = layout.bucket;
        let decided = layout.admit(c, target, now, take);
        if (take && decided.is_ok()) || layout.fresh {
            layout.encode(&mut buf);
            self.file.write_all_at(&buf, 0)?;
        } else if layout.bucket != before {
            // The bucket brought up to date (as the in-memory state keeps it).
            layout.encode(&mut buf[..HEADER]);
            self.file.write_all_at(&buf[..HEADER], 0)?;
        }
        Ok(decided)
    }
}

/// The shared state, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    bucket: Bucket,
    /// (kind, id, last send ms); kind 0 is a free entry.
    entries: Vec<(u64, u64, u64)>,
    /// Zeroed (or damaged) contents were started afresh.
    fresh: bool,
}

fn word(buf: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(b) = buf.get(at..at + 8) {
        w.copy_from_slice(b);
    }
    u64::from_le_bytes(w)
}

fn put(buf: &mut [u8], at: usize, v: u64) {
    if let Some(b) = buf.get_mut(at..at + 8) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

impl Layout {
    /// Contents without the magic (zeroed: a principal's first send) start
    /// as a new window: a full bucket, no target.
    fn decode(buf: &[u8], c: PacingConfig) -> Layout {
        if word(buf, 0) != MAGIC {
            let bucket = Bucket { milli_tokens: c.burst.saturating_mul(1000), updated: 0 };
            return Layout { bucket, entries: vec![(0, 0, 0); PACING_SLOTS], fresh: true };
        }
        let bucket = Bucket { milli_tokens: word(buf, 8), updated: word(buf, 16) };
        let entries = (0..PACING_SLOTS)
            .map(|i| {
                let at = HEADER + i * ENTRY;
                (word(buf, at), word(buf, at + 8), word(buf, at + 16))
            })
            .collect();
        Layout { bucket, entries, fresh: false }
    }

    /// Write the header, and the entries as far as `buf` reaches.
    fn encode(&self, buf: &mut [u8]) {
        put(buf, 0, MAGIC);
        put(buf, 8, self.bucket.milli_tokens);
        put(buf, 16, self.bucket.updated);
        put(buf, 24, 0);
        for (i, (kind, id, last)) in self.entries.iter().enumerate() {
            let at = HEADER + i * ENTRY;
            if at + ENTRY > buf.len() {
                break;
            }
            put(buf, at, *kind);
            put(buf, at + 8, *id);
            put(buf, at + 16, *last);
        }
    }

    fn admit(&mut self, c: PacingConfig, target: &Target, now: u64, take: bool) -> Result<(), Limited> {
        let (kind, id) = target.key();
        let live = |last: u64| c.interval_ms > 0 && now.saturating_sub(last) < c.interval_ms;
        let found = self.entries.iter().position(|e| e.0 == kind && e.1 == id);
        let last = found.map(|i| self.entries[i].2).filter(|l| live(*l));
        decide(c, &mut self.bucket, last, now)?;
        if c.interval_ms == 0 {
            if take && c.bucket() {
                self.bucket.milli_tokens -= 1000;
            }
            return Ok(());
        }
        let slot = found.or_else(|| self.entries.iter().position(|e| e.0 == 0 || !live(e.2)));
        let Some(slot) = slot else {
            // The table is full of live targets: refused, conservatively,
            // until the oldest entry expires.
            let oldest = self.entries.iter().map(|e| e.2).min().unwrap_or(now);
            let retry = c.interval_ms.saturating_sub(now.saturating_sub(oldest)).max(1);
            return Err(Limited { retry_after_ms: retry, per_target: true });
        };
        if take {
            if c.bucket() {
                self.bucket.milli_tokens -= 1000;
            }
            self.entries[slot] = (kind, id, now);
        }
        Ok(())
    }
}

/// The decision both windows make: the target's interval (its last send,
/// if still within it), then the bucket, brought up to date at `now`.
/// Refused: the longer wait; nothing is taken either way.
fn decide(c: PacingConfig, b: &mut Bucket, last: Option<u64>, now: u64) -> Result<(), Limited> {
    let mut wait: Option<Limited> = None;
    if let Some(last) = last.filter(|_| c.interval_ms > 0) {
        let since = now.saturating_sub(last);
        if since < c.interval_ms {
            wait = Some(Limited { retry_after_ms: c.interval_ms - since, per_target: true });
        }
    }
    if c.bucket() {
        let cap = c.burst.saturating_mul(1000);
        let elapsed = now.saturating_sub(b.updated);
        // Thousandths of a send regained: elapsed / refill_ms sends.
        let regained = elapsed.saturating_mul(1000) / c.refill_ms;
        b.milli_tokens = b.milli_tokens.saturating_add(regained).min(cap);
        // Keep the remainder of a partly regained send.
        b.updated = if b.milli_tokens == cap { now } else { b.updated + regained * c.refill_ms / 1000 };
        if b.milli_tokens < 1000 {
            let missing = 1000 - b.milli_tokens;
            let ms = (missing * c.refill_ms).div_ceil(1000).saturating_sub(now.saturating_sub(b.updated)).max(1);
            if wait.is_none_or(|w| ms > w.retry_after_ms) {
                wait = Some(Limited { retry_after_ms: ms, per_target: false });
            }
        }
    }
    match wait {
        Some(w) => Err(w),
        None => Ok(()),
    }
}

enum Window {
    Memory(Mutex<State>),
    Shared(SharedWindow),
}

/// This runtime's (or its HTTP principal's) pacing state.
pub struct Pacer {
    config: PacingConfig,
    window: Window,
}

/// A refused send: how long until it may pass (ms, at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub retry_after_ms: u64,
    /// Whether the per-target interval refused it (else the global bucket).
    pub per_target: bool,
}

impl Limited {
    /// The tool error: kind `rate_limited`, `retry_after_ms` in the diagnostics.
    pub fn reply(&self, action: &str) -> ToolReply {
        let which = if self.per_target {
            "同一目标的发送间隔（SNOWLUMA_MCP_SEND_INTERVAL_MS）"
        } else {
            "全局发送速率（SNOWLUMA_MCP_SEND_BURST / SNOWLUMA_MCP_SEND_REFILL_MS）"
        };
        ToolReply::error(
            Diagnostics::failed(
                FailureKind::RateLimited,
                format!(
                    "{action} 被拒绝：超过本服务器的{which}，请至少 {} ms 后再试；未发送任何请求，也不会自动重试。",
                    self.retry_after_ms
                ),
            )
            .with_next_step("Wait retry_after_ms, then call again if the send is still wanted; nothing was queued.")
            .with_retry_after_ms(u32::try_from(self.retry_after_ms).unwrap_or(u32::MAX)),
        )
    }
}

/// The first group or user number in a params value, if it is one.
fn id(v: Option<Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().filter(|n| *n > 0),
        Value::String(s) => s.parse().ok().filter(|n| *n > 0),
        _ => None,
    }
}

/// The target a send goes to: `send_msg` by its `message_type`, otherwise
/// the first marked group, else the first marked user, else the action.
pub fn target(action: &Action, params: &Params) -> Target {
    let (targets, _) = safety::targets(action);
    let first =
        |kind: TargetKind| targets.iter().filter(|(_, k)| *k == kind).find_map(|(name, _)| id(params.get(name)));
    let message_type = params.get("message_type");
    let (group, user) = match message_type.as_ref().and_then(Value::as_str) {
        Some("private") => (None, first(TargetKind::User)),
        Some("group") => (first(TargetKind::Group), None),
        _ => (first(TargetKind::Group), first(TargetKind::User)),
    };
    match (group, user) {
        (Some(g), _) => Target::Group(g),
        (None, Some(u)) => Target::User(u),
        (None, None) => Target::Action(action.name.to_owned()),
    }
}

impl Pacer {
    /// A window of this runtime's own.
    pub fn new(config: PacingConfig) -> Pacer {
        let bucket = Bucket { milli_tokens: config.burst.saturating_mul(1000), updated: 0 };
        Pacer { config, window: Window::Memory(Mutex::new(State { last: HashMap::new(), bucket })) }
    }

    /// A window shared with the other processes holding `shared`.
    pub fn shared(config: PacingConfig, shared: SharedWindow) -> Pacer {
        Pacer { config, window: Window::Shared(shared) }
    }

    /// Milliseconds on the pacer's clock (`CLOCK_MONOTONIC`).
    pub fn now(&self) -> u64 {
        monotonic_ms()
    }

    /// Whether a send to `target` at `now` passes; with `take`, the slot is
    /// taken (the target's interval starts, one send leaves the bucket).
    /// Refused: nothing is taken. A shared state that cannot be read or
    /// written refuses (for a second; fail closed).
    pub fn admit(&self, target: &Target, now: u64, take: bool) -> Result<(), Limited> {
        let c = self.config;
        let st = match &self.window {
            Window::Memory(st) => st,
            Window::Shared(shared) => {
                return shared.admit(c, target, now, take).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the shared pacing state cannot be used; the send is refused");
                    Err(Limited { retry_after_ms: 1000, per_target: false })
                });
            }
        };
        let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
        let last = st.last.get(target).copied();
        decide(c, &mut st.bucket, last, now)?;
        if take {
            if c.bucket() {
                st.bucket.milli_tokens -= 1000;
            }
            if c.interval_ms > 0 {
                if st.last.len() >= PRUNE_AT {
                    st.last.retain(|_, t| now.saturating_sub(*t) < c.interval_ms);
                }
                st.last.insert(target.clone(), now);
            }
        }
        Ok(())
    }

    /// The pacing gate for one call: actions that do not send pass.
    pub fn gate(&self, action: &Action, params: &Params, take: bool) -> Result<(), Limited> {
        if !safety::sends(action) || (self.config.interval_ms == 0 && !self.config.bucket()) {
            return Ok(());
        }
        self.admit(&target(action, params), self.now(), take)
    }

    /// What `get_runtime_info` shows.
    pub fn to_json(&self) -> Value {
        let c = self.config;
        json!({
            "paced_actions": safety::SENDS,
            "per_target_interval_ms": c.interval_ms,
            "burst": c.burst,
            "refill_ms": c.refill_ms,
            "global_bucket": c.bucket(),
            "window": match self.window {
                Window::Shared(_) => "per HTTP principal (token), across its session trees",
                Window::Memory(_) => "per runtime (one server process tree)",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use snowluma_catalog::Catalog;

    fn pacer(interval_ms: u64, burst: u64, refill_ms: u64) -> Pacer {
        Pacer::new(PacingConfig { interval_ms, burst, refill_ms })
    }

    #[test]
    fn the_per_target_interval_holds_on_a_controlled_clock() {
        let p = pacer(3000, 0, 0);
        let g = Target::Group(20001);
        assert_eq!(p.admit(&g, 10_000, true), Ok(()));
        assert_eq!(p.admit(&g, 10_001, true), Err(Limited { retry_after_ms: 2999, per_target: true }));
        assert_eq!(p.admit(&Target::Group(20002), 10_001, true), Ok(()), "another target");
        assert_eq!(p.admit(&g, 12_999, true).unwrap_err().retry_after_ms, 1);
        assert_eq!(p.admit(&g, 13_000, true), Ok(()));
        // A refused call takes nothing; a check without take neither.
        assert_eq!(p.admit(&Target::User(1), 0, false), Ok(()));
        assert_eq!(p.admit(&Target::User(1), 0, true), Ok(()));
    }

    #[test]
    fn the_global_bucket_allows_a_burst_then_refills() {
        let p = pacer(0, 5, 3000);
        for i in 0..5 {
            assert_eq!(p.admit(&Target::Group(i), 0, true), Ok(()), "{i}");
        }
        assert_eq!(p.admit(&Target::Group(9), 0, true), Err(Limited { retry_after_ms: 3000, per_target: false }));
        assert_eq!(p.admit(&Target::Group(9), 1000, true).unwrap_err().retry_after_ms, 2000);
        assert_eq!(p.admit(&Target::Group(9), 3000, true), Ok(()));
        assert!(p.admit(&Target::Group(9), 3000, true).is_err());
        // Long idle refills to the burst, no more.
        for i in 0..5 {
            assert_eq!(p.admit(&Target::Group(i), 1_000_000, true), Ok(()), "{i}");
        }
        assert!(p.admit(&Target::Group(7), 1_000_000, true).is_err());
    }

    #[test]
    fn both_limits_refuse_with_the_longer_wait() {
        let p = pacer(10_000, 1, 3000);
        let g = Target::Group(1);
        assert_eq!(p.admit(&g, 0, true), Ok(()));
        assert_eq!(p.admit(&g, 0, true), Err(Limited { retry_after_ms: 10_000, per_target: true }));
        assert_eq!(p.admit(&Target::Group(2), 0, true), Err(Limited { retry_after_ms: 3000, per_target: false }));
    }

    #[test]
    fn zero_disables_and_only_sends_are_paced() {
        let p = pacer(0, 0, 0);
        for _ in 0..100 {
            assert_eq!(p.admit(&Target::Group(1), 0, true), Ok(()));
        }
        let c = Catalog::bundled();
        let a = |n: &str| crate::policy::resolve(c, n).unwrap();
        let strict = pacer(1_000_000, 0, 0);
        let read = Params::Value(json!({"group_id": 1}));
        for _ in 0..3 {
            assert_eq!(strict.gate(a("get_group_info"), &read, true), Ok(()));
        }
        assert_eq!(strict.gate(a("send_group_msg"), &read, true), Ok(()));
        assert!(strict.gate(a("send_group_msg"), &read, true).is_err());
        assert!(strict.gate(a("group_poke"), &read, true).is_err(), "the same group");
    }

    #[test]
    fn targets_follow_the_catalog() {
        let c = Catalog::bundled();
        let a = |n: &str| crate::policy::resolve(c, n).unwrap();
        let t = |n: &str, p: Value| target(a(n), &Params::Value(p));
        assert_eq!(t("send_group_msg", json!({"group_id": 5})), Target::Group(5));
        assert_eq!(t("send_private_msg", json!({"user_id": "7"})), Target::User(7));
        assert_eq!(t("send_msg", json!({"message_type": "private", "group_id": 5, "user_id": 7})), Target::User(7));
        assert_eq!(t("send_msg", json!({"group_id": 5, "user_id": 7})), Target::Group(5));
        assert_eq!(t("send_qzone_msg", json!({})), Target::Action("send_qzone_msg".into()));
        let r = Limited { retry_after_ms: 1234, per_target: true }.reply("send_group_msg");
        assert_eq!((r.diagnostics.kind, r.diagnostics.retry_after_ms), (Some(FailureKind::RateLimited), Some(1234)));
        assert_eq!(r.diagnostics.to_json()["retry_after_ms"], json!(1234));
    }

    fn memfd(size: usize) -> std::os::fd::OwnedFd {
        let fd = nix::sys::memfd::memfd_create(c"pacing-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, i64::try_from(size).unwrap()).unwrap();
        fd
    }

    fn shared(fd: &std::os::fd::OwnedFd, interval_ms: u64, burst: u64, refill_ms: u64) -> Pacer {
        use std::os::fd::AsFd;
        Pacer::shared(PacingConfig { interval_ms, burst, refill_ms }, SharedWindow::open(fd.as_fd()).unwrap())
    }

    #[test]
    fn two_pacers_on_one_state_are_one_window() {
        let fd = memfd(PACING_STATE_SIZE);
        let (a, b) = (shared(&fd, 3000, 3, 1000), shared(&fd, 3000, 3, 1000));
        let g = Target::Group(20001);
        assert_eq!(a.admit(&g, 10_000, true), Ok(()));
        assert_eq!(b.admit(&g, 10_001, true), Err(Limited { retry_after_ms: 2999, per_target: true }));
        assert_eq!(b.admit(&Target::User(7), 10_001, false), Ok(()), "a check takes nothing");
        assert_eq!(b.admit(&Target::User(7), 10_001, true), Ok(()));
        assert_eq!(a.admit(&Target::Action("send_qzone_msg".into()), 10_001, true), Ok(()));
        // The bucket (3) is spent across both.
        assert!(!a.admit(&Target::Group(5), 10_001, true).unwrap_err().per_target);
        assert_eq!(b.admit(&g, 13_000, true), Ok(()), "a refill and the interval over");
        assert!(a.admit(&g, 13_000, true).is_err());
        // The same decisions as one in-memory window.
        let m = pacer(3000, 3, 1000);
        for (t, now) in [(g.clone(), 10_000), (g.clone(), 10_001), (Target::User(7), 10_001)] {
            let _ = m.admit(&t, now, true);
        }
        assert_eq!(m.admit(&Target::Action("send_qzone_msg".into()), 10_001, true), Ok(()));
        assert!(m.admit(&Target::Group(5), 10_001, true).is_err());
        assert!(!a.to_json()["window"].as_str().unwrap().contains("runtime"));
        assert!(m.to_json()["window"].as_str().unwrap().contains("per runtime"));
    }

    #[test]
    fn a_full_table_refuses_new_targets_until_an_entry_expires() {
        let fd = memfd(PACING_STATE_SIZE);
        let p = shared(&fd, 1000, 0, 0);
        for i in 0..PACING_SLOTS as u64 {
            assert_eq!(p.admit(&Target::Group(i + 1), 5000 + i / 2, true), Ok(()), "{i}");
        }
        let r = p.admit(&Target::Group(999_999), 5100, true).unwrap_err();
        assert_eq!(r, Limited { retry_after_ms: 900, per_target: true });
        assert_eq!(p.admit(&Target::Group(999_999), 6000, true), Ok(()), "the oldest entry expired");
    }

    #[test]
    fn the_layout_round_trips() {
        let c = PacingConfig { interval_ms: 1, burst: 2, refill_ms: 3 };
        let mut l = Layout::decode(&[0u8; PACING_STATE_SIZE], c);
        assert!(l.fresh);
        assert_eq!(l.bucket, Bucket { milli_tokens: 2000, updated: 0 });
        l.bucket = Bucket { milli_tokens: 1234, updated: u64::MAX - 1 };
        l.entries[0] = (1, 20001, 77);
        l.entries[PACING_SLOTS - 1] = (3, u64::MAX, 88);
        let mut buf = vec![0u8; PACING_STATE_SIZE];
        l.encode(&mut buf);
        assert_eq!(&buf[..8], b"SLMPACE1");
        let back = Layout::decode(&buf, c);
        assert_eq!((back.bucket, &back.entries, back.fresh), (l.bucket, &l.entries, false));
    }

    #[test]
    fn an_unfit_descriptor_is_refused() {
        use std::os::fd::AsFd;
        assert!(matches!(SharedWindow::open(memfd(100).as_fd()), Err(SharedError::WrongSize(100))));
        let fd = memfd(PACING_STATE_SIZE);
        nix::sys::uio::pwrite(&fd, b"garbage!", 0).unwrap();
        assert!(matches!(SharedWindow::open(fd.as_fd()), Err(SharedError::BadMagic)));
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert!(matches!(SharedWindow::open(r.as_fd()), Err(SharedError::NotRegular)));
    }
}
