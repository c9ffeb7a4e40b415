//! The operator's action policy: `SNOWLUMA_MCP_ALLOW_ACTIONS`,
//! `SNOWLUMA_MCP_DENY_ACTIONS`, and a default-deny set of actions that leak
//! credentials or control the host.
//!
//! Calls name an action exactly (name or alias, as Node: an `_async` form is
//! an unknown action). The operator's lists resolve names and aliases to
//! canonical catalog names and also accept an `_async` form (configurations
//! written for earlier releases keep working), so an alias cannot slip past
//! a deny. A deny always wins; with an allow list,
//! only listed actions run (listing a default-denied action allows it);
//! without one, everything but the default-deny set runs.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use snowluma_catalog::{Action, Catalog};

/// Actions refused unless the operator explicitly allows them, and why.
pub const DEFAULT_DENY: [(&str, &str); 10] = [
    ("get_cookies", "returns the account's web cookies"),
    ("get_credentials", "returns web cookies and a CSRF token"),
    ("get_csrf_token", "returns a token derived from the account's skey"),
    ("get_clientkey", "returns a key for QQ web login"),
    ("request_decrypt_key", "returns the key of a local message database"),
    ("send_packet", "sends raw protocol packets"),
    ("bot_exit", "stops the SnowLuma process"),
    ("set_restart", "asks SnowLuma to restart"),
    ("clean_cache", "cache wipe on the SnowLuma host"),
    ("clean_stream_temp_file", "deletes SnowLuma's stream temp directories"),
];

#[derive(Debug, Clone)]
pub struct Policy {
    allow: Option<BTreeSet<String>>,
    deny: BTreeSet<String>,
    /// Every catalog action that the policy refuses, canonical names.
    denied: BTreeSet<String>,
    /// What `invoke_action` confirms first (`SNOWLUMA_MCP_CONFIRM_ACTIONS`).
    confirm: crate::confirm::ConfirmList,
}

use crate::names::resolve_listed;
pub use crate::names::{PolicyError, resolve};

fn parse_list(
    catalog: &Catalog,
    var: &'static str,
    raw: Option<&str>,
) -> Result<Option<BTreeSet<String>>, PolicyError> {
    let Some(raw) = raw.map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let mut out = BTreeSet::new();
    for item in raw.split([',', ' ', '\n']).map(str::trim).filter(|s| !s.is_empty()) {
        match resolve_listed(catalog, item) {
            Some(a) => {
                out.insert(a.name.to_owned());
            }
            None => return Err(PolicyError { var, name: item.to_owned() }),
        }
    }
    Ok(Some(out))
}

impl Policy {
    pub fn from_config(catalog: &Catalog, allow: Option<&str>, deny: Option<&str>) -> Result<Policy, PolicyError> {
        let allow = parse_list(catalog, "SNOWLUMA_MCP_ALLOW_ACTIONS", allow)?;
        let deny = parse_list(catalog, "SNOWLUMA_MCP_DENY_ACTIONS", deny)?.unwrap_or_default();
        let mut p = Policy { allow, deny, denied: BTreeSet::new(), confirm: Default::default() };
        p.denied = catalog.actions.iter().filter(|a| !p.permits_name(a.name)).map(|a| a.name.to_owned()).collect();
        Ok(p)
    }

    /// This policy with the operator's confirmation list.
    pub fn with_confirm(mut self, confirm: crate::confirm::ConfirmList) -> Policy {
        self.confirm = confirm;
        self
    }

    /// The actions `invoke_action` confirms first.
    pub fn confirm(&self) -> &crate::confirm::ConfirmList {
        &self.confirm
    }

    fn permits_name(&self, canonical: &str) -> bool {
        if self.deny.contains(canonical) {
            return false;
        }
        match &self.allow {
            Some(allow) => allow.contains(canonical),
            None => !DEFAULT_DENY.iter().any(|(n, _)| *n == canonical),
        }
    }

    /// Whether the canonical action may run.
    pub fn permits(&self, action: &Action) -> bool {
        !self.denied.contains(action.name)
    }

    /// Why an action is refused (for the error message).
    pub fn reason(&self, action: &Action) -> String {
        if self.deny.contains(action.name) {
            "它列在 SNOWLUMA_MCP_DENY_ACTIONS 中".into()
        } else if self.allow.is_some() {
            "它不在 SNOWLUMA_MCP_ALLOW_ACTIONS 中".into()
        } else {
            let why = DEFAULT_DENY.iter().find(|(n, _)| *n == action.name).map(|(_, w)| *w).unwrap_or("");
            format!("默认拒绝（{why}）；运维可用 SNOWLUMA_MCP_ALLOW_ACTIONS 放行")
        }
    }

    pub fn denied(&self) -> Vec<String> {
        self.denied.iter().cloned().collect()
    }

    /// The effective policy, for `get_runtime_info`.
    pub fn to_json(&self) -> Value {
        json!({
            "allow": self.allow.as_ref().map(|a| a.iter().collect::<Vec<_>>()),
            "deny": self.deny.iter().collect::<Vec<_>>(),
            "default_deny": DEFAULT_DENY.iter().map(|(n, why)| json!({"action": n, "reason": why})).collect::<Vec<_>>(),
            "denied_actions": self.denied.iter().collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_deny_and_overrides() {
        let c = Catalog::bundled();
        let p = Policy::from_config(c, None, None).unwrap();
        assert!(!p.permits(c.get("get_cookies").unwrap()));
        assert!(!p.permits(c.get(".send_packet").unwrap()), "alias resolves to the denied action");
        assert!(p.permits(c.get("get_status").unwrap()));

        let p = Policy::from_config(c, Some("get_cookies, get_status"), Some("nc_get_rkey")).unwrap();
        assert!(p.permits(c.get("get_cookies").unwrap()), "explicitly allowed");
        assert!(!p.permits(c.get("send_group_msg").unwrap()), "not in the allow list");
        assert!(!p.permits(c.get("get_rkey").unwrap()));

        let p = Policy::from_config(c, Some("get_status"), Some("get_status_async")).unwrap();
        assert!(!p.permits(c.get("get_status").unwrap()), "deny wins, _async normalized");
        assert!(Policy::from_config(c, None, Some("no_such")).is_err());
        assert!(resolve(c, "send_group_msg_async").is_none(), "calls name actions exactly, as Node");
        assert_eq!(resolve_listed(c, "send_group_msg_async").unwrap().name, "send_group_msg");
    }
}
