//! The operator's safety settings for a live QQ account: the target scope
//! (`SNOWLUMA_MCP_ALLOW_GROUPS` / `ALLOW_USERS`, `SNOWLUMA_MCP_SHOW_SCOPE_IDS`)
//! and the send pacing (`SNOWLUMA_MCP_SEND_INTERVAL_MS`, `SEND_BURST`,
//! `SEND_REFILL_MS`). Parsed here, applied by the supervisor's gates.

use std::collections::BTreeSet;

use crate::{ConfigError, bad, nonempty};

/// Most ids in one allow list.
pub const MAX_SCOPE_IDS: usize = 10_000;
/// Largest group or user number (2^53 − 1, what JavaScript clients read exactly).
pub const MAX_ID: u64 = (1 << 53) - 1;

/// The default minimum interval between two sends to one target (ms): the
/// 3 s per-target interval of Amadeus-QQ-MCP.
pub const DEFAULT_SEND_INTERVAL_MS: u64 = 3_000;
/// The default size of the global send bucket (sends in a burst).
pub const DEFAULT_SEND_BURST: u64 = 5;
/// The default time the global bucket takes to regain one send (ms): at
/// most 20 sends a minute over all targets, sustained.
pub const DEFAULT_SEND_REFILL_MS: u64 = 3_000;
/// Largest pacing value (ms, or sends): a day's milliseconds is far below.
pub const MAX_PACING: u64 = 2_147_483_647;

/// Which groups and users calls may name. `None`: no restriction (unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeConfig {
    pub groups: Option<BTreeSet<u64>>,
    pub users: Option<BTreeSet<u64>>,
    /// `SNOWLUMA_MCP_SHOW_SCOPE_IDS=1`: `get_runtime_info` lists the ids
    /// (otherwise only how many there are).
    pub show_ids: bool,
}

impl ScopeConfig {
    /// Whether any restriction applies.
    pub fn active(&self) -> bool {
        self.groups.is_some() || self.users.is_some()
    }
}

/// Send pacing; `0` disables a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingConfig {
    /// Minimum time between two sends to the same target (ms).
    pub interval_ms: u64,
    /// The global token bucket's size (sends that may go at once).
    pub burst: u64,
    /// The time the bucket takes to regain one send (ms).
    pub refill_ms: u64,
}

impl Default for PacingConfig {
    fn default() -> PacingConfig {
        PacingConfig {
            interval_ms: DEFAULT_SEND_INTERVAL_MS,
            burst: DEFAULT_SEND_BURST,
            refill_ms: DEFAULT_SEND_REFILL_MS,
        }
    }
}

impl PacingConfig {
    /// Whether the global bucket applies (`0` for either value disables it).
    pub fn bucket(&self) -> bool {
        self.burst > 0 && self.refill_ms > 0
    }
}

/// An allow list: comma-separated positive ids, or `none` (nothing allowed).
fn id_list(var: &'static str, flag: &'static str, raw: &Option<String>) -> Result<Option<BTreeSet<u64>>, ConfigError> {
    let Some(raw) = nonempty(raw) else { return Ok(None) };
    if raw.eq_ignore_ascii_case("none") {
        return Ok(Some(BTreeSet::new()));
    }
    let mut ids = BTreeSet::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ok = part.bytes().all(|b| b.is_ascii_digit()) && !part.starts_with('0');
        match part.parse::<u64>() {
            Ok(n) if ok && n <= MAX_ID => {
                ids.insert(n);
            }
            _ => {
                let shown: String = part.chars().take(32).collect();
                return Err(bad(
                    var,
                    flag,
                    format!("must be comma-separated numbers from 1 to {MAX_ID}, or none; got {shown:?}"),
                ));
            }
        }
    }
    if ids.is_empty() {
        return Err(bad(var, flag, "names no id (to allow none, write none)"));
    }
    if ids.len() > MAX_SCOPE_IDS {
        return Err(bad(var, flag, format!("holds more than {MAX_SCOPE_IDS} ids")));
    }
    Ok(Some(ids))
}

/// A pacing value: a whole number from 0 to [`MAX_PACING`] (unset: `default`).
fn pacing_value(var: &'static str, flag: &'static str, raw: &Option<String>, default: u64) -> Result<u64, ConfigError> {
    let Some(raw) = nonempty(raw) else { return Ok(default) };
    let ok = raw.bytes().all(|b| b.is_ascii_digit()) && (raw == "0" || !raw.starts_with('0'));
    match raw.parse::<u64>() {
        Ok(n) if ok && n <= MAX_PACING => Ok(n),
        _ => Err(bad(var, flag, format!("must be a whole number from 0 (off) to {MAX_PACING}; got {raw:?}"))),
    }
}

/// The raw settings, as the command line and environment give them.
pub struct Raw<'a> {
    pub allow_groups: &'a Option<String>,
    pub allow_users: &'a Option<String>,
    pub send_interval_ms: &'a Option<String>,
    pub send_burst: &'a Option<String>,
    pub send_refill_ms: &'a Option<String>,
}

/// Resolve the scope and the pacing.
pub fn resolve(raw: Raw<'_>) -> Result<(ScopeConfig, PacingConfig), ConfigError> {
    let show_ids = match std::env::var("SNOWLUMA_MCP_SHOW_SCOPE_IDS").ok().as_deref() {
        None | Some("") | Some("0") => false,
        Some("1") => true,
        Some(_) => return Err(bad("SNOWLUMA_MCP_SHOW_SCOPE_IDS", "(no flag)", "must be 1 (or 0, or unset)")),
    };
    let scope = ScopeConfig {
        groups: id_list("SNOWLUMA_MCP_ALLOW_GROUPS", "--allow-groups", raw.allow_groups)?,
        users: id_list("SNOWLUMA_MCP_ALLOW_USERS", "--allow-users", raw.allow_users)?,
        show_ids,
    };
    let d = PacingConfig::default();
    let pacing = PacingConfig {
        interval_ms: pacing_value(
            "SNOWLUMA_MCP_SEND_INTERVAL_MS",
            "--send-interval-ms",
            raw.send_interval_ms,
            d.interval_ms,
        )?,
        burst: pacing_value("SNOWLUMA_MCP_SEND_BURST", "--send-burst", raw.send_burst, d.burst)?,
        refill_ms: pacing_value("SNOWLUMA_MCP_SEND_REFILL_MS", "--send-refill-ms", raw.send_refill_ms, d.refill_ms)?,
    };
    Ok((scope, pacing))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn allow_lists_parse_strictly() {
        let l = |v: &str| id_list("V", "--v", &s(v));
        assert_eq!(l("20001, 20002,,20001").unwrap(), Some([20001, 20002].into()));
        assert_eq!(l("none").unwrap(), Some(BTreeSet::new()));
        assert_eq!(id_list("V", "--v", &None).unwrap(), None);
        assert_eq!(l("  ").unwrap(), None, "blank is unset");
        for bad in ["0", "012", "-1", "1.5", "abc", "9007199254740992", ",", "1 2"] {
            let e = l(bad).unwrap_err().to_string();
            assert!(e.starts_with("V (--v)"), "{bad}: {e}");
        }
    }

    #[test]
    fn pacing_values_take_zero_as_off() {
        let p = |v: &str| pacing_value("V", "--v", &s(v), 7);
        assert_eq!(p("0").unwrap(), 0);
        assert_eq!(p("86400000").unwrap(), 86_400_000);
        assert_eq!(pacing_value("V", "--v", &None, 7).unwrap(), 7);
        for bad in ["-1", "01", "1e3", "x", "2147483648"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(PacingConfig::default().bucket());
        assert!(!PacingConfig { burst: 0, ..PacingConfig::default() }.bucket());
        assert!(!PacingConfig { refill_ms: 0, ..PacingConfig::default() }.bucket());
    }
}
