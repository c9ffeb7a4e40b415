//! Send pacing (`SNOWLUMA_MCP_SEND_INTERVAL_MS`, `SEND_BURST`,
//! `SEND_REFILL_MS`): a minimum interval between two sends to one target
//! and a global token bucket over all sends, for the actions the catalog
//! marks as sending (`snowluma_catalog::safety::SENDS`). A call over a
//! limit is refused at once (`rate_limited`, with `retry_after_ms`): never
//! queued, never retried. Both checks and the taking of the slot happen
//! under one lock, so concurrent calls cannot pass together what one could
//! not. The window is this runtime's (one server process tree).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{Value, json};
use snowluma_catalog::Action;
use snowluma_catalog::safety::{self, TargetKind};
use snowluma_config::safety::PacingConfig;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::args::Params;

/// Targets whose last send is remembered before old ones are pruned.
const PRUNE_AT: usize = 4096;

/// What one send goes to, for the per-target interval.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Group(u64),
    User(u64),
    /// A send without a group or user (a qzone post): one target per action.
    Action(String),
}

struct State {
    /// The last admitted send to each target (ms on this pacer's clock).
    last: HashMap<Target, u64>,
    /// The bucket's sends, in thousandths (so refills are exact).
    milli_tokens: u64,
    /// When the bucket was last brought up to date.
    updated: u64,
}

/// This runtime's pacing state.
pub struct Pacer {
    config: PacingConfig,
    start: Instant,
    state: Mutex<State>,
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
        (None, None) => Target::Action(action.name.clone()),
    }
}

impl Pacer {
    pub fn new(config: PacingConfig) -> Pacer {
        let milli_tokens = config.burst.saturating_mul(1000);
        Pacer {
            config,
            start: Instant::now(),
            state: Mutex::new(State { last: HashMap::new(), milli_tokens, updated: 0 }),
        }
    }

    /// Milliseconds on this pacer's clock.
    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a send to `target` at `now` passes; with `take`, the slot is
    /// taken (the target's interval starts, one send leaves the bucket).
    /// Refused: nothing is taken.
    pub fn admit(&self, target: &Target, now: u64, take: bool) -> Result<(), Limited> {
        let c = self.config;
        let mut st = self.lock();
        let mut wait: Option<Limited> = None;
        if let Some(last) = st.last.get(target).filter(|_| c.interval_ms > 0) {
            let since = now.saturating_sub(*last);
            if since < c.interval_ms {
                wait = Some(Limited { retry_after_ms: c.interval_ms - since, per_target: true });
            }
        }
        if c.bucket() {
            let cap = c.burst.saturating_mul(1000);
            let elapsed = now.saturating_sub(st.updated);
            // Thousandths of a send regained: elapsed / refill_ms sends.
            let regained = elapsed.saturating_mul(1000) / c.refill_ms;
            st.milli_tokens = st.milli_tokens.saturating_add(regained).min(cap);
            // Keep the remainder of a partly regained send.
            st.updated = if st.milli_tokens == cap { now } else { st.updated + regained * c.refill_ms / 1000 };
            if st.milli_tokens < 1000 {
                let missing = 1000 - st.milli_tokens;
                let ms = (missing * c.refill_ms).div_ceil(1000).saturating_sub(now.saturating_sub(st.updated)).max(1);
                if wait.is_none_or(|w| ms > w.retry_after_ms) {
                    wait = Some(Limited { retry_after_ms: ms, per_target: false });
                }
            }
        }
        if let Some(w) = wait {
            return Err(w);
        }
        if take {
            if c.bucket() {
                st.milli_tokens -= 1000;
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
            "window": "per runtime (one server process tree; under serve-http one per session tree)",
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
}
