//! The gates every execution passes, in order, as pure functions: each
//! takes only what it checks and returns either what the next step needs
//! or the refusal the client gets. `server.rs` strings them together
//! (`exec_call`); nothing here touches a worker, the audit log or the
//! network, so each gate is unit-tested on its own.
//!
//! Order: arguments → mode → endpoint → catalog → read-only (query) →
//! params → transfer plan (`transfers.rs`) → operator policy → audit
//! intent → send.

use serde_json::{Value, json};
use snowluma_catalog::{Action, Catalog};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::config::Mode;
use crate::policy::Policy;

/// The arguments of `query_action` / `invoke_action`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    pub action: String,
    #[serde(default)]
    pub params: Option<Value>,
    #[serde(default)]
    pub execution: Option<ExecutionArgs>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionArgs {
    #[serde(default)]
    pub input_file: Option<String>,
}

impl ExecArgs {
    /// `execution.input_file`, when given.
    pub fn input_file(&self) -> Option<&str> {
        self.execution.as_ref().and_then(|e| e.input_file.as_deref())
    }
}

/// The tool's arguments, parsed.
pub fn arguments(tool: &str, args: Value) -> Result<ExecArgs, ToolReply> {
    serde_json::from_value(args).map_err(|e| {
        ToolReply::error(
            Diagnostics::failed(FailureKind::InvalidArguments, format!("invalid arguments for {tool}: {e}"))
                .with_next_step("Pass {\"action\": \"<name>\", \"params\": {...}}."),
        )
    })
}

/// A SnowLuma endpoint must be configured.
pub fn endpoint<T>(network: Option<&T>) -> Result<&T, ToolReply> {
    network.ok_or_else(|| {
        ToolReply::error(
            Diagnostics::failed(FailureKind::NotConfigured, "no SnowLuma endpoint is configured")
                .with_next_step("Set SNOWLUMA_MCP_ENDPOINT (and SNOWLUMA_MCP_MODE) in the server's environment."),
        )
    })
}

/// The action must be in the bundled catalog (aliases and `_async` forms
/// resolve to their canonical action).
pub fn catalog_action(catalog: &'static Catalog, name: &str) -> Result<&'static Action, ToolReply> {
    crate::policy::resolve(catalog, name).ok_or_else(|| {
        ToolReply::error(
            Diagnostics::failed(FailureKind::UnknownAction, format!("unknown action {}", snowluma_catalog::echo(name)))
                .with_next_step("Find the action with search_actions or list_actions, then read it with get_action."),
        )
    })
}

/// `query_action` runs read-only actions only (`read_only_tool`: the tool
/// is `query_action`).
pub fn read_only(read_only_tool: bool, action: &Action) -> Result<(), ToolReply> {
    if read_only_tool && !action.read_only {
        return Err(ToolReply::error(
            Diagnostics::failed(
                FailureKind::ModeForbidden,
                format!("{} changes state; query_action runs read-only actions only", action.name),
            )
            .with_next_step("Use invoke_action, which requires SNOWLUMA_MCP_MODE=write."),
        ));
    }
    Ok(())
}

/// `params` is a JSON object (absent or `null`: `{}`).
pub fn params(params: Option<Value>) -> Result<Value, ToolReply> {
    match params {
        None | Some(Value::Null) => Ok(json!({})),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(_) => Err(ToolReply::error(
            Diagnostics::failed(FailureKind::InvalidArguments, "params must be a JSON object")
                .with_next_step("See get_action for the action's inputSchema."),
        )),
    }
}

/// The operator's action policy (`SNOWLUMA_MCP_ALLOW_ACTIONS` /
/// `SNOWLUMA_MCP_DENY_ACTIONS` and the default-deny set).
pub fn policy(policy: &Policy, action: &Action) -> Result<(), ToolReply> {
    if policy.permits(action) {
        return Ok(());
    }
    Err(ToolReply::error(
        Diagnostics::failed(
            FailureKind::PolicyDenied,
            format!("{} is refused by this server's action policy: {}", action.name, policy.reason(action)),
        )
        .with_next_step(
            "Use another action, or ask the operator to change SNOWLUMA_MCP_ALLOW_ACTIONS / SNOWLUMA_MCP_DENY_ACTIONS.",
        ),
    ))
}

/// The refusal of a tool the current mode does not offer.
pub fn mode_refusal(tool: &str, need: &str, mode: Mode) -> ToolReply {
    ToolReply::error(
        Diagnostics::failed(FailureKind::ModeForbidden, format!("{tool} is not available in {} mode", mode.as_str()))
            .with_next_step(format!("The operator must set SNOWLUMA_MCP_MODE to {need} (with SNOWLUMA_MCP_ENDPOINT).")),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn kind(r: &ToolReply) -> Option<FailureKind> {
        assert!(r.is_error);
        r.diagnostics.kind
    }

    fn catalog() -> &'static Catalog {
        Catalog::bundled()
    }

    #[test]
    fn arguments_are_strict() {
        let a = arguments("query_action", json!({"action": "get_status"})).unwrap();
        assert_eq!(a.action, "get_status");
        assert!(a.params.is_none() && a.input_file().is_none());
        let a = arguments("invoke_action", json!({"action": "x", "execution": {"input_file": "f"}})).unwrap();
        assert_eq!(a.input_file(), Some("f"));
        for bad in [json!({}), json!({"action": 1}), json!({"action": "x", "extra": true}), json!([])] {
            let r = arguments("query_action", bad).unwrap_err();
            assert_eq!(kind(&r), Some(FailureKind::InvalidArguments));
            assert!(r.diagnostics.message.as_deref().unwrap_or("").contains("query_action"));
        }
    }

    #[test]
    fn endpoint_must_be_configured() {
        assert_eq!(*endpoint(Some(&7)).unwrap(), 7);
        assert_eq!(kind(&endpoint::<u8>(None).unwrap_err()), Some(FailureKind::NotConfigured));
    }

    #[test]
    fn catalog_resolves_aliases_and_refuses_the_unknown() {
        assert_eq!(catalog_action(catalog(), "get_status").unwrap().name, "get_status");
        assert_eq!(catalog_action(catalog(), "send_group_msg_async").unwrap().name, "send_group_msg");
        let r = catalog_action(catalog(), "rm_rf").unwrap_err();
        assert_eq!(kind(&r), Some(FailureKind::UnknownAction));
    }

    #[test]
    fn query_runs_read_only_actions_only() {
        let read = catalog_action(catalog(), "get_status").unwrap();
        let write = catalog_action(catalog(), "send_group_msg").unwrap();
        assert!(read_only(true, read).is_ok());
        assert!(read_only(false, write).is_ok());
        assert_eq!(kind(&read_only(true, write).unwrap_err()), Some(FailureKind::ModeForbidden));
    }

    #[test]
    fn params_must_be_an_object() {
        assert_eq!(params(None).unwrap(), json!({}));
        assert_eq!(params(Some(Value::Null)).unwrap(), json!({}));
        assert_eq!(params(Some(json!({"a": 1}))).unwrap(), json!({"a": 1}));
        for bad in [json!([]), json!("x"), json!(1), json!(true)] {
            assert_eq!(kind(&params(Some(bad)).unwrap_err()), Some(FailureKind::InvalidArguments));
        }
    }

    #[test]
    fn the_operator_policy_is_applied_with_its_reason() {
        let p = Policy::from_config(catalog(), None, Some("send_group_msg")).unwrap();
        let denied = catalog_action(catalog(), "send_group_msg").unwrap();
        let allowed = catalog_action(catalog(), "get_status").unwrap();
        assert!(policy(&p, allowed).is_ok());
        let r = policy(&p, denied).unwrap_err();
        assert_eq!(kind(&r), Some(FailureKind::PolicyDenied));
        assert!(r.diagnostics.message.as_deref().unwrap_or("").contains("send_group_msg"));
    }

    #[test]
    fn mode_refusals_name_what_is_needed() {
        let r = mode_refusal("invoke_action", "write", Mode::Read);
        assert_eq!(kind(&r), Some(FailureKind::ModeForbidden));
        assert_eq!(r.diagnostics.message.as_deref(), Some("invoke_action is not available in read mode"));
    }
}
