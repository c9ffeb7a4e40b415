//! The gates every execution passes, in order, as pure functions: each
//! takes only what it checks and returns either what the next step needs
//! or the refusal the client gets. `server.rs` strings them together
//! (`exec_call`); nothing here touches a worker, the audit log or the
//! network, so each gate is unit-tested on its own.
//!
//! Order: arguments → mode → endpoint → catalog → read-only (query) →
//! params → transfer plan (`transfers/`) → operator policy → audit
//! intent → send.

use serde_json::{Value, json};
use snowluma_catalog::{Action, Catalog};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::config::Mode;
use crate::policy::Policy;
use crate::tools::Modes;

/// The arguments of `query_action` / `invoke_action`, read as Node reads
/// them: a non-string `action` is `""` (an unknown action), unknown
/// arguments are ignored, and `execution` is checked only once the action
/// is known ([`execution`]), in Node's order.
#[derive(Debug)]
pub struct ExecArgs {
    /// The action as the caller wrote it (an alias stays an alias).
    pub action: String,
    pub params: Option<Value>,
    /// `execution` as given (`Some(Null)` when it was `null`).
    execution: Option<Value>,
    /// `execution.input_file`, once [`execution`] accepted it.
    input_file: Option<String>,
}

impl ExecArgs {
    /// `execution.input_file`, when given (after [`execution`]).
    pub fn input_file(&self) -> Option<&str> {
        self.input_file.as_deref()
    }
}

/// The tool's arguments (anything but an object counts as `{}`, as in Node).
pub fn arguments(args: Value) -> ExecArgs {
    let mut m = match args {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let action = match m.remove("action") {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    ExecArgs { action, params: m.remove("params"), execution: m.remove("execution"), input_file: None }
}

fn refusal(kind: FailureKind, message: String, next_step: &str) -> ToolReply {
    ToolReply::error(Diagnostics::failed(kind, message).with_next_step(next_step))
}

/// A SnowLuma endpoint must be configured (`err.gate.no_client`).
pub fn endpoint<T>(network: Option<&T>) -> Result<&T, ToolReply> {
    network.ok_or_else(|| {
        refusal(
            FailureKind::NotConfigured,
            "未配置 OneBot 端点（SNOWLUMA_MCP_ENDPOINT），无法执行。".into(),
            "Set SNOWLUMA_MCP_ENDPOINT (and SNOWLUMA_MCP_MODE) in the server's environment.",
        )
    })
}

/// The action must be in the bundled catalog, by name or alias, exactly
/// (`err.exec.unknown_action`).
pub fn catalog_action(catalog: &'static Catalog, name: &str) -> Result<&'static Action, ToolReply> {
    crate::policy::resolve(catalog, name).ok_or_else(|| {
        refusal(
            FailureKind::UnknownAction,
            format!("未知 action: {}。用 list_actions / search_actions 查可用项。", snowluma_catalog::json_echo(name)),
            "Find the action with search_actions or list_actions, then read it with get_action.",
        )
    })
}

/// `query_action` runs read-only actions only (`read_only_tool`: the tool
/// is `query_action`); `given` is the action as the caller wrote it
/// (`err.exec.write_via_query`).
pub fn read_only(read_only_tool: bool, action: &Action, given: &str) -> Result<(), ToolReply> {
    if read_only_tool && !action.read_only {
        return Err(refusal(
            FailureKind::ModeForbidden,
            format!(
                "{} 是写操作，不能用 query_action；请用 invoke_action（需 SNOWLUMA_MCP_MODE=write）。",
                snowluma_catalog::plain_echo(given)
            ),
            "Use invoke_action, which requires SNOWLUMA_MCP_MODE=write.",
        ));
    }
    Ok(())
}

/// `execution`, as Node checks it once the action is known: an object whose
/// only key is `input_file`, a non-blank string, for `upload_file_stream`
/// only. An empty object is accepted.
pub fn execution(args: &mut ExecArgs, action: &Action) -> Result<(), ToolReply> {
    let invalid = |m: String| {
        refusal(FailureKind::InvalidArguments, m, "See the tool's inputSchema: execution takes only input_file.")
    };
    let Some(execution) = args.execution.take() else {
        return Ok(());
    };
    let Value::Object(mut m) = execution else {
        return Err(invalid("execution 必须是对象。".into()));
    };
    let unknown: Vec<String> =
        m.keys().filter(|k| *k != "input_file").map(|k| snowluma_catalog::plain_echo(k)).collect();
    if !unknown.is_empty() {
        return Err(invalid(format!("未知 MCP execution 选项: {}", unknown.join(", "))));
    }
    let Some(file) = m.remove("input_file") else {
        return Ok(());
    };
    let file = match file {
        Value::String(s) if !s.trim().is_empty() => s,
        _ => return Err(invalid("execution.input_file 必须是非空字符串。".into())),
    };
    if action.name != "upload_file_stream" {
        return Err(invalid("execution.input_file 仅可用于 upload_file_stream。".into()));
    }
    args.input_file = Some(file);
    Ok(())
}

/// `params` as Node sends it: the given object, anything else `{}`.
pub fn params(params: Option<Value>) -> Value {
    match params {
        Some(v @ Value::Object(_)) => v,
        _ => json!({}),
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
            format!("{} 被本服务器的 action 策略拒绝：{}。", action.name, policy.reason(action)),
        )
        .with_next_step(
            "Use another action, or ask the operator to change SNOWLUMA_MCP_ALLOW_ACTIONS / SNOWLUMA_MCP_DENY_ACTIONS.",
        ),
    ))
}

/// The refusal of a tool the current mode does not offer, in Node's words:
/// a write tool outside write mode (`err.gate.write`), an execution tool in
/// docs mode (`err.gate.read`).
pub fn mode_refusal(need: Modes) -> ToolReply {
    let (message, next) = if need.contains(Mode::Read) {
        (
            "执行未启用：需配置 SNOWLUMA_MCP_ENDPOINT。",
            "The operator must set SNOWLUMA_MCP_ENDPOINT (read or write mode).",
        )
    } else {
        (
            "写操作未启用：需设置 SNOWLUMA_MCP_MODE=write。",
            "The operator must set SNOWLUMA_MCP_MODE=write (with SNOWLUMA_MCP_ENDPOINT).",
        )
    };
    ToolReply::error(Diagnostics::failed(FailureKind::ModeForbidden, message).with_next_step(next))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn kind(r: &ToolReply) -> Option<FailureKind> {
        assert!(r.is_error);
        r.diagnostics.kind
    }

    fn text(r: &ToolReply) -> &str {
        r.diagnostics.message.as_deref().unwrap_or("")
    }

    fn catalog() -> &'static Catalog {
        Catalog::bundled()
    }

    #[test]
    fn arguments_are_read_as_node_reads_them() {
        let a = arguments(json!({"action": "get_status", "extra": true}));
        assert_eq!(a.action, "get_status");
        assert!(a.params.is_none() && a.input_file().is_none());
        for odd in [json!({}), json!({"action": 1}), json!([]), json!("x")] {
            assert_eq!(arguments(odd).action, "");
        }
    }

    #[test]
    fn endpoint_must_be_configured() {
        assert_eq!(*endpoint(Some(&7)).unwrap(), 7);
        let r = endpoint::<u8>(None).unwrap_err();
        assert_eq!(kind(&r), Some(FailureKind::NotConfigured));
        assert_eq!(text(&r), "未配置 OneBot 端点（SNOWLUMA_MCP_ENDPOINT），无法执行。");
    }

    #[test]
    fn catalog_resolves_aliases_exactly_and_refuses_the_unknown() {
        assert_eq!(catalog_action(catalog(), "get_status").unwrap().name, "get_status");
        assert_eq!(catalog_action(catalog(), "get_ptt_text").unwrap().name, "fetch_ptt_text");
        for unknown in ["send_group_msg_async", "Get_Status", "get_status "] {
            let r = catalog_action(catalog(), unknown).unwrap_err();
            assert_eq!(kind(&r), Some(FailureKind::UnknownAction));
            assert_eq!(text(&r), format!("未知 action: {unknown:?}。用 list_actions / search_actions 查可用项。"));
        }
    }

    #[test]
    fn query_runs_read_only_actions_only() {
        let read = catalog_action(catalog(), "get_status").unwrap();
        let write = catalog_action(catalog(), "send_group_sign").unwrap();
        assert!(read_only(true, read, "get_status").is_ok());
        assert!(read_only(false, write, "send_group_sign").is_ok());
        let r = read_only(true, write, "send_group_sign").unwrap_err();
        assert_eq!(kind(&r), Some(FailureKind::ModeForbidden));
        assert_eq!(
            text(&r),
            "send_group_sign 是写操作，不能用 query_action；请用 invoke_action（需 SNOWLUMA_MCP_MODE=write）。"
        );
    }

    #[test]
    fn execution_is_checked_in_nodes_order() {
        let upload = catalog_action(catalog(), "upload_file_stream").unwrap();
        let other = catalog_action(catalog(), "get_status").unwrap();
        let check = |given: Value, action| {
            let mut a = arguments(json!({"action": "x", "execution": given}));
            execution(&mut a, action).map(|()| a.input_file().map(str::to_owned))
        };
        for (e, want) in [
            (json!(null), "execution 必须是对象。"),
            (json!([1]), "execution 必须是对象。"),
            (json!({"b": 1, "input_file": "x", "a": 2}), "未知 MCP execution 选项: b, a"),
            (json!({"input_file": 5}), "execution.input_file 必须是非空字符串。"),
            (json!({"input_file": "  "}), "execution.input_file 必须是非空字符串。"),
        ] {
            assert_eq!(text(&check(e, upload).unwrap_err()), want);
        }
        assert_eq!(
            text(&check(json!({"input_file": "/f"}), other).unwrap_err()),
            "execution.input_file 仅可用于 upload_file_stream。"
        );
        assert_eq!(check(json!({}), other).unwrap(), None);
        assert_eq!(check(json!({"input_file": "f"}), upload).unwrap().as_deref(), Some("f"));
    }

    #[test]
    fn params_are_an_object_or_empty() {
        assert_eq!(params(None), json!({}));
        assert_eq!(params(Some(Value::Null)), json!({}));
        assert_eq!(params(Some(json!({"a": 1}))), json!({"a": 1}));
        for odd in [json!([]), json!("x"), json!(42), json!(true)] {
            assert_eq!(params(Some(odd)), json!({}));
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
        assert!(text(&r).contains("send_group_msg"));
    }

    #[test]
    fn mode_refusals_are_nodes() {
        let r = mode_refusal(Modes::WRITE);
        assert_eq!(kind(&r), Some(FailureKind::ModeForbidden));
        assert_eq!(text(&r), "写操作未启用：需设置 SNOWLUMA_MCP_MODE=write。");
        assert_eq!(text(&mode_refusal(Modes::READ_WRITE)), "执行未启用：需配置 SNOWLUMA_MCP_ENDPOINT。");
    }
}
