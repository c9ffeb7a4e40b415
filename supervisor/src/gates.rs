//! The gates every execution passes, in order, as pure functions: each
//! takes only what it checks and returns either what the next step needs
//! or the refusal the client gets. [`admit`] runs them all, once, for every
//! entry (`query_action` / `invoke_action`, the `_with_input` flow and
//! background tasks) and returns the [`Admission`] the call then runs on;
//! nothing here touches a worker, the audit log or the network, so each
//! gate is unit-tested on its own.
//!
//! Order ([`Step`]): mode → arguments → endpoint → catalog → read-only
//! (query) → execution → stream (background only) → params → transfer plan
//! (`transfers/`) → operator policy → target scope (`scope.rs`) → send
//! pacing (`pacing.rs`) → *(confirmation goes here)* → audit intent → send
//! (`execution.rs`).

use serde_json::{Value, json};
use snowluma_catalog::{Action, Catalog};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::pacing::Pacer;
use crate::policy::Policy;
use crate::scope::Scope;
use crate::tools::{Handler, Modes, ToolSpec};
use crate::transfers::{Plan, TransferService};
use snowluma_config::Mode;

pub use crate::args::{Args, ExecArgs, Params, arguments, exec_arguments};

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
/// only. An empty object is accepted. Ours beside it: `idempotency_key`,
/// 1–128 printable ASCII (see `idempotency.rs`).
pub fn execution(args: &mut ExecArgs, action: &Action) -> Result<(), ToolReply> {
    let invalid = |m: String| {
        refusal(
            FailureKind::InvalidArguments,
            m,
            "See the tool's inputSchema: execution takes only input_file and idempotency_key.",
        )
    };
    let Some(execution) = args.execution.take() else {
        return Ok(());
    };
    let Value::Object(mut m) = execution else {
        return Err(invalid("execution 必须是对象。".into()));
    };
    let unknown: Vec<String> = m
        .keys()
        .filter(|k| *k != "input_file" && *k != "idempotency_key")
        .map(|k| snowluma_catalog::plain_echo(k))
        .collect();
    if !unknown.is_empty() {
        return Err(invalid(format!("未知 MCP execution 选项: {}", unknown.join(", "))));
    }
    if let Some(key) = m.remove("idempotency_key") {
        match key {
            Value::String(k) if crate::idempotency::valid_key(&k) => args.idempotency_key = Some(k),
            _ => return Err(invalid("execution.idempotency_key 必须是 1–128 个可打印 ASCII 字符的字符串。".into())),
        }
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
pub fn params(params: Option<Params>) -> Params {
    match params {
        Some(p) if p.is_object() => p,
        _ => Params::Value(json!({})),
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

/// The gates, in the order [`admit`] runs them (Node's). A refusal names
/// the step that refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The tool is offered in this mode ([`mode_refusal`]).
    Mode,
    /// A SnowLuma endpoint is configured ([`endpoint`]).
    Endpoint,
    /// The action is in the catalog ([`catalog_action`]).
    Catalog,
    /// `query_action` runs read-only actions only ([`read_only`]).
    ReadOnly,
    /// `execution` is well-formed ([`execution`]).
    Execution,
    /// A background task runs stream actions only ([`stream`]).
    Stream,
    /// The file transfer, if any, can be done (`transfers::plan`).
    Transfer,
    /// The operator's action policy ([`policy`]); its refusals are audited.
    Policy,
    /// The target scope (`scope.rs`: SNOWLUMA_MCP_ALLOW_GROUPS /
    /// ALLOW_USERS, read from the admitted params); audited.
    Scope,
    /// Send pacing (`pacing.rs`), checked here (for a keyed call, after
    /// its key's lookup) and charged when the call is sent (`execution.rs`
    /// `run`); audited.
    Pacing,
    /// `SNOWLUMA_MCP_CONFIRM_ACTIONS` ([`confirm`]): marks the admission for
    /// a confirmation (asked by the call's flow, `completion_flow.rs`);
    /// refuses a background task, which cannot ask. Audited.
    Confirm,
}

/// Which entry a call came in by. The gates are the same for all, in the
/// same order; a background task also needs a stream action, and a call
/// that may still run later (after input, or in a task) keeps a failed
/// transfer plan until then unless a later gate refuses it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `query_action` / `invoke_action` (and the runtime overview's queries).
    Call,
    /// `*_with_input`: admitted before anyone is asked for anything.
    WithInput,
    /// `invoke_action_background`: admitted before the task is created.
    Background,
}

/// What the gates see of the server.
pub struct Context<'a, N> {
    pub mode: Mode,
    pub network: Option<&'a N>,
    pub catalog: &'static Catalog,
    pub policy: &'a Policy,
    pub transfers: Option<&'a TransferService>,
    /// The operator's target scope ([`Step::Scope`]).
    pub scope: &'a Scope,
    /// This runtime's send pacing ([`Step::Pacing`]).
    pub pacer: &'a Pacer,
}

/// A call every gate let through (the current mode offers the tool and the
/// operator's policy permits the action): what the rest of the call runs on.
#[derive(Debug)]
pub struct Admission<N> {
    /// The network executor ([`Step::Endpoint`]).
    pub network: N,
    /// The catalog's action ([`Step::Catalog`]).
    pub action: &'static Action,
    /// The action as the caller wrote it (an alias stays an alias).
    pub given: String,
    /// `params` as sent ([`params`]).
    pub params: Params,
    /// `execution.input_file`, when given ([`Step::Execution`]).
    pub input_file: Option<String>,
    /// `execution.idempotency_key`, when given ([`Step::Execution`]).
    pub idempotency_key: Option<String>,
    /// The transfer plan ([`Step::Transfer`]); a failed plan of an entry
    /// that runs later is its refusal, given when the call runs (no later
    /// gate refused it).
    pub transfer: Result<Option<Plan>, ToolReply>,
    /// The human must confirm before it runs ([`Step::Confirm`]).
    pub confirm: bool,
    /// The audit `op_id` of an accepted confirmation, which the intent and
    /// result records then share.
    pub op_id: Option<String>,
}

impl<N> Admission<N> {
    /// This admission once the `_with_input` answers are merged into the
    /// arguments (`merged`: the call's arguments with the answers in
    /// `params`): only `params` and the transfer plan depend on them; every
    /// other gate's verdict stands.
    pub fn answered(mut self, cx: &Context<'_, N>, merged: Value) -> Admission<N> {
        self.params = params(arguments(merged).params);
        self.transfer = crate::transfers::plan(cx.transfers, self.action, &self.params, self.input_file.as_deref());
        self
    }

    /// A `_with_input` call about to run on its final params: the target
    /// scope and the pacing checked again (the answers may have named a
    /// target); the pacing slot is taken when it is sent.
    pub fn ready(self, cx: &Context<'_, N>) -> Result<Admission<N>, Refused> {
        let audited = || Some(Box::new((self.given.clone(), self.action)));
        if let Err(e) = cx.scope.check(self.action, &self.params) {
            return Err(Refused { step: Step::Scope, reply: e.reply(self.action.name), audited: audited() });
        }
        if self.idempotency_key.is_none()
            && let Err(l) = cx.pacer.gate(self.action, &self.params, false)
        {
            return Err(Refused { step: Step::Pacing, reply: l.reply(self.action.name), audited: audited() });
        }
        Ok(self)
    }
}

/// A call a gate refused.
#[derive(Debug)]
pub struct Refused {
    pub step: Step,
    pub reply: ToolReply,
    /// For a refusal the audit log records (the policy's): the action as
    /// the caller wrote it, and the catalog's (boxed: refusals are passed
    /// by value and this one is rare).
    pub audited: Option<Box<(String, &'static Action)>>,
}

impl Refused {
    fn at(step: Step) -> impl FnOnce(ToolReply) -> Refused {
        move |reply| Refused { step, reply, audited: None }
    }

    /// The `reason` of the `refused` audit record, for a refusal that has one.
    pub fn audit_reason(&self) -> Option<&'static str> {
        match self.step {
            Step::Policy => Some("policy_denied"),
            Step::Confirm => Some("confirmation_unavailable"),
            Step::Scope => Some("out_of_scope"),
            Step::Pacing => Some("rate_limited"),
            _ => None,
        }
    }
}

/// Whether the operator wants `action` confirmed first
/// (`SNOWLUMA_MCP_CONFIRM_ACTIONS`); a background task, which cannot ask,
/// is refused.
pub fn confirm(list: &crate::confirm::ConfirmList, action: &Action, entry: Entry) -> Result<bool, ToolReply> {
    if !list.requires(action) {
        return Ok(false);
    }
    if entry == Entry::Background {
        return Err(crate::confirm::not_in_background(action));
    }
    Ok(true)
}

/// A background task runs stream actions only.
pub fn stream(action: &Action) -> Result<(), ToolReply> {
    if action.stream {
        return Ok(());
    }
    Err(ToolReply::error(
        Diagnostics::failed(
            FailureKind::InvalidArguments,
            format!(
                "{} 不是 Stream Action（not a stream action）；后台任务只运行目录中的 Stream Action。",
                action.name
            ),
        )
        .with_next_step("Use invoke_action for ordinary actions."),
    ))
}

/// Every gate, once, in Node's order (see [`Step`]): the admission the call
/// runs on, or the first refusal.
pub fn admit<N: Clone>(cx: &Context<'_, N>, spec: ToolSpec, entry: Entry, args: Args) -> Result<Admission<N>, Refused> {
    admit_args(cx, spec, entry, exec_arguments(args))
}

/// [`admit`] for arguments already read ([`exec_arguments`]): the
/// transport reads a direct call's arguments once, for its memory cost and
/// for the gates.
pub fn admit_args<N: Clone>(
    cx: &Context<'_, N>,
    spec: ToolSpec,
    entry: Entry,
    mut args: ExecArgs,
) -> Result<Admission<N>, Refused> {
    // The mode first (re-checked on every call), as Node.
    if !spec.modes.contains(cx.mode) {
        return Err(Refused::at(Step::Mode)(mode_refusal(spec.modes)));
    }
    let network = endpoint(cx.network).map_err(Refused::at(Step::Endpoint))?.clone();
    let action = catalog_action(cx.catalog, &args.action).map_err(Refused::at(Step::Catalog))?;
    read_only(spec.handler.read_only_tool(), action, &args.action).map_err(Refused::at(Step::ReadOnly))?;
    execution(&mut args, action).map_err(Refused::at(Step::Execution))?;
    if args.idempotency_key.is_some() && !matches!(spec.handler, Handler::Invoke | Handler::InvokeWithInput) {
        return Err(Refused::at(Step::Execution)(refusal(
            FailureKind::InvalidArguments,
            "execution.idempotency_key 仅可用于 invoke_action / invoke_action_with_input。".into(),
            "Call invoke_action with the key, or leave it out.",
        )));
    }
    if entry == Entry::Background {
        stream(action).map_err(Refused::at(Step::Stream))?;
    }
    let params = params(args.params.take());
    let transfer = crate::transfers::plan(cx.transfers, action, &params, args.input_file());
    let transfer = match transfer {
        Err(reply) if entry == Entry::Call => return Err(Refused::at(Step::Transfer)(reply)),
        t => t,
    };
    if let Err(reply) = policy(cx.policy, action) {
        // A failed plan comes first in the order: it is the refusal.
        return Err(match transfer {
            Err(plan) => Refused::at(Step::Transfer)(plan),
            Ok(_) => Refused { step: Step::Policy, reply, audited: Some(Box::new((args.action, action))) },
        });
    }
    // Target scope, then pacing, then confirmation; a failed plan still
    // comes first. Pacing is only checked here: the slot is taken where
    // the call is certain to be sent (`execution.rs` `run`), so that the
    // rounds of a confirmation or of input completion and replayed keys
    // never count as sends.
    let later = |step, reply, transfer: Result<Option<Plan>, ToolReply>, given: String| match transfer {
        Err(plan) => Refused::at(Step::Transfer)(plan),
        Ok(_) => Refused { step, reply, audited: Some(Box::new((given, action))) },
    };
    if let Err(e) = cx.scope.check(action, &params) {
        return Err(later(Step::Scope, e.reply(action.name), transfer, args.action));
    }
    // A keyed call may be a replay, which sends nothing: its pacing is
    // checked once its key has been looked up (`execution.rs` `run`).
    if args.idempotency_key.is_none()
        && let Err(l) = cx.pacer.gate(action, &params, false)
    {
        return Err(later(Step::Pacing, l.reply(action.name), transfer, args.action));
    }
    let confirm = match confirm(cx.policy.confirm(), action, entry) {
        Ok(c) => c,
        Err(reply) => return Err(later(Step::Confirm, reply, transfer, args.action)),
    };
    Ok(Admission {
        network,
        action,
        given: args.action,
        params,
        input_file: args.input_file,
        idempotency_key: args.idempotency_key,
        transfer,
        confirm,
        op_id: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::value::RawValue;
    use std::sync::Arc;

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
        let of = |v: Option<Value>| params(v.map(Params::Value)).to_value();
        assert_eq!(of(None), json!({}));
        assert_eq!(of(Some(Value::Null)), json!({}));
        assert_eq!(of(Some(json!({"a": 1}))), json!({"a": 1}));
        for odd in [json!([]), json!("x"), json!(42), json!(true)] {
            assert_eq!(of(Some(odd)), json!({}));
        }
    }

    /// Arguments read from their text agree with arguments read as a value;
    /// `params` is forwarded as the very text the client sent.
    #[test]
    fn arguments_from_text_read_like_values() {
        let raw = |t: &str| Args::Raw(Arc::from(RawValue::from_string(t.to_owned()).unwrap()));
        for text in [
            r#"{"action":"get_status","params":{"b": [1, 2.50],"a":"x"},"execution":{"input_file":"f"},"junk":[0,0]}"#,
            r#"{"action":5,"params":[1]}"#,
            r#"{"params":null}"#,
            r#"{"action":"x","execution":null}"#,
            r#"{"execution":[]}"#,
            r#"{"action":"a","action":"b","params":{"p":1},"params":{"p":2}}"#,
            r#"{}"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            let (a, b) = (exec_arguments(raw(text)), arguments(value));
            assert_eq!(a.action, b.action, "{text}");
            assert_eq!(a.execution, b.execution, "{text}");
            let (pa, pb) = (params(a.params), params(b.params));
            assert_eq!(pa.to_value(), pb.to_value(), "{text}");
            assert_eq!(pa.get("a"), pb.get("a"), "{text}");
            assert_eq!(pa.get("p"), pb.get("p"), "{text}");
            assert_eq!((pa.has("a"), pa.has("zz")), (pb.has("a"), false), "{text}");
        }
        let p = params(exec_arguments(raw(r#"{"params":{"b": [1, 2.50],"a":"x","a":"y"}}"#)).params);
        assert_eq!(p.json_text().0, r#"{"b": [1, 2.50],"a":"x","a":"y"}"#, "the client's text");
        assert_eq!(p.get("a"), Some(json!("y")), "the last member, as a parsed object keeps");
        assert_eq!(p.get("c"), None);
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

    /// `admit` runs the gates once, in Node's order, for every entry: the
    /// first refusal names its step; only the policy's is audited; a failed
    /// transfer plan refuses a direct call at once, and a later-running one
    /// only when the policy refuses too.
    #[test]
    fn admit_runs_every_gate_once_in_order() {
        use crate::tools::{INVOKE_ACTION, INVOKE_ACTION_BACKGROUND, INVOKE_ACTION_WITH_INPUT, QUERY_ACTION};
        let open = Policy::from_config(catalog(), None, None).unwrap();
        let deny = Policy::from_config(catalog(), None, Some("upload_file_stream,get_status")).unwrap();
        let (scope, pacer) = (Scope::default(), Pacer::new(snowluma_config::safety::PacingConfig::default()));
        let cx = |mode, network, policy| Context {
            mode,
            network,
            catalog: catalog(),
            policy,
            transfers: None,
            scope: &scope,
            pacer: &pacer,
        };
        let write = cx(Mode::Write, Some(&1u8), &open);
        let step = |cx: &Context<'_, u8>, spec, entry, args: Value| {
            admit(cx, spec, entry, args.into())
                .map(|a| a.action.name.to_owned())
                .map_err(|r| (r.step, r.audit_reason()))
        };
        assert_eq!(
            step(&cx(Mode::Read, Some(&1), &open), INVOKE_ACTION, Entry::Call, json!({})),
            Err((Step::Mode, None))
        );
        assert_eq!(
            step(&cx(Mode::Write, None, &open), INVOKE_ACTION, Entry::Call, json!({})),
            Err((Step::Endpoint, None))
        );
        assert_eq!(step(&write, INVOKE_ACTION, Entry::Call, json!({"action": 1})), Err((Step::Catalog, None)));
        let send = json!({"action": "send_group_sign"});
        assert_eq!(step(&write, QUERY_ACTION, Entry::Call, send.clone()), Err((Step::ReadOnly, None)));
        assert_eq!(
            step(&write, INVOKE_ACTION, Entry::Call, json!({"action": "get_status", "execution": 1})),
            Err((Step::Execution, None))
        );
        assert_eq!(step(&write, INVOKE_ACTION_BACKGROUND, Entry::Background, send.clone()), Err((Step::Stream, None)));
        assert_eq!(step(&write, INVOKE_ACTION, Entry::Call, send).unwrap(), "set_group_sign", "an alias resolves");
        let denied = cx(Mode::Write, Some(&1), &deny);
        let status = json!({"action": "get_status", "params": [1]});
        assert_eq!(
            step(&denied, INVOKE_ACTION, Entry::Call, status.clone()),
            Err((Step::Policy, Some("policy_denied")))
        );
        let r = admit(&denied, INVOKE_ACTION_WITH_INPUT, Entry::WithInput, status.into()).unwrap_err();
        assert_eq!(r.audited.map(|b| (b.0, b.1.name.to_owned())), Some(("get_status".into(), "get_status".into())));
        // An automatic upload this server cannot do (no upload root).
        let upload = json!({"action": "upload_file_stream", "execution": {"input_file": "f"}});
        assert_eq!(step(&write, INVOKE_ACTION, Entry::Call, upload.clone()), Err((Step::Transfer, None)));
        for (spec, entry) in
            [(INVOKE_ACTION_WITH_INPUT, Entry::WithInput), (INVOKE_ACTION_BACKGROUND, Entry::Background)]
        {
            let a = admit(&write, spec, entry, upload.clone().into()).unwrap();
            assert_eq!(a.input_file.as_deref(), Some("f"));
            assert_eq!(kind(&a.transfer.unwrap_err()), Some(FailureKind::NotConfigured));
            assert_eq!(step(&denied, spec, entry, upload.clone()), Err((Step::Transfer, None)), "the plan comes first");
        }
        // execution.idempotency_key: invoke tools only, 1–128 printable ASCII.
        let keyed = |key: Value| json!({"action": "get_status", "execution": {"idempotency_key": key}});
        assert_eq!(
            admit(&write, INVOKE_ACTION, Entry::Call, keyed(json!("k")).into()).unwrap().idempotency_key.as_deref(),
            Some("k")
        );
        assert!(admit(&write, INVOKE_ACTION_WITH_INPUT, Entry::WithInput, keyed(json!("k")).into()).is_ok());
        for (spec, entry, key) in [
            (QUERY_ACTION, Entry::Call, json!("k")),
            (INVOKE_ACTION_BACKGROUND, Entry::Background, json!("k")),
            (INVOKE_ACTION, Entry::Call, json!("")),
            (INVOKE_ACTION, Entry::Call, json!(1)),
        ] {
            let r = admit(&write, spec, entry, keyed(key).into()).unwrap_err();
            assert_eq!(r.step, Step::Execution, "before the stream check");
        }
        // SNOWLUMA_MCP_CONFIRM_ACTIONS: after the policy; a background task is refused (audited).
        let listed = crate::confirm::ConfirmList::from_config(catalog(), Some("set_group_kick,upload_file_stream"));
        let confirming = Policy::from_config(catalog(), None, None).unwrap().with_confirm(listed.unwrap());
        let cc = cx(Mode::Write, Some(&1), &confirming);
        let kick = json!({"action": "set_group_kick", "params": {}});
        assert!(admit(&cc, INVOKE_ACTION, Entry::Call, kick.clone().into()).unwrap().confirm);
        assert!(!admit(&cc, INVOKE_ACTION, Entry::Call, json!({"action": "get_status"}).into()).unwrap().confirm);
        assert!(!admit(&write, INVOKE_ACTION, Entry::Call, kick.into()).unwrap().confirm, "unset: no confirmation");
        let bg = json!({"action": "upload_file_stream"});
        let r = admit(&cc, INVOKE_ACTION_BACKGROUND, Entry::Background, bg.into()).unwrap_err();
        assert_eq!((r.step, r.audit_reason()), (Step::Confirm, Some("confirmation_unavailable")));
        assert_eq!(kind(&r.reply), Some(FailureKind::NotConfirmed));
        // Answers change the params (and so the plan), nothing else.
        let a = admit(
            &write,
            INVOKE_ACTION_WITH_INPUT,
            Entry::WithInput,
            json!({"action": "get_status", "params": null}).into(),
        )
        .unwrap();
        let a = a.answered(&write, json!({"action": "get_status", "params": {"x": 1}}));
        assert_eq!((a.given.as_str(), a.params.to_value()), ("get_status", json!({"x": 1})));
        assert!(matches!(a.transfer, Ok(None)));
    }

    /// Target scope, then pacing, after the policy; both refusals audited;
    /// admission only checks the pacing (the slot is taken when the call is
    /// sent, `execution.rs`), so admitting twice takes nothing.
    #[test]
    fn scope_and_pacing_follow_the_policy() {
        use crate::tools::{INVOKE_ACTION, INVOKE_ACTION_WITH_INPUT};
        use snowluma_config::safety::{PacingConfig, ScopeConfig};
        let open = Policy::from_config(catalog(), None, None).unwrap();
        let deny = Policy::from_config(catalog(), None, Some("send_group_msg")).unwrap();
        let scope = Scope::from_config(&ScopeConfig { groups: Some([20001].into()), users: None, show_ids: false });
        let pacer = Pacer::new(PacingConfig { interval_ms: 86_400_000, burst: 0, refill_ms: 0 });
        let cx = |policy| Context {
            mode: Mode::Write,
            network: Some(&1u8),
            catalog: catalog(),
            policy,
            transfers: None,
            scope: &scope,
            pacer: &pacer,
        };
        let send = |g: u64| json!({"action": "send_group_msg", "params": {"group_id": g, "message": "x"}});
        let step = |cx: &Context<'_, u8>, spec, entry, args: Value| {
            admit(cx, spec, entry, args.into()).map(|_| ()).map_err(|r| (r.step, r.audit_reason()))
        };
        let (allowed, denied) = (cx(&open), cx(&deny));
        assert_eq!(step(&denied, INVOKE_ACTION, Entry::Call, send(20002)), Err((Step::Policy, Some("policy_denied"))));
        assert_eq!(step(&allowed, INVOKE_ACTION, Entry::Call, send(20002)), Err((Step::Scope, Some("out_of_scope"))));
        let a = admit(&allowed, INVOKE_ACTION_WITH_INPUT, Entry::WithInput, send(20001).into()).unwrap();
        assert_eq!(step(&allowed, INVOKE_ACTION, Entry::Call, send(20001)), Ok(()), "admission takes nothing");
        assert_eq!(step(&allowed, INVOKE_ACTION, Entry::Call, send(20001)), Ok(()), "admission takes nothing");
        // The send takes the slot; the next admission is refused, and so
        // is a ready `_with_input` call to the same target.
        pacer.gate(a.action, &a.params, true).unwrap();
        assert_eq!(step(&allowed, INVOKE_ACTION, Entry::Call, send(20001)), Err((Step::Pacing, Some("rate_limited"))));
        // A keyed call may be a replay: its pacing waits for its key's lookup.
        let mut keyed = send(20001);
        keyed["execution"] = json!({"idempotency_key": "k-1"});
        assert_eq!(step(&allowed, INVOKE_ACTION, Entry::Call, keyed), Ok(()));
        let r = a.ready(&allowed).unwrap_err();
        assert_eq!((r.step, r.reply.diagnostics.kind), (Step::Pacing, Some(FailureKind::RateLimited)));
        assert!(r.reply.diagnostics.retry_after_ms.is_some_and(|ms| ms > 0));
        // Answers that name an out-of-scope target are refused when ready.
        let a = admit(&allowed, INVOKE_ACTION_WITH_INPUT, Entry::WithInput, json!({"action": "send_group_msg"}).into())
            .unwrap();
        let a = a.answered(&allowed, send(20002));
        assert_eq!(a.ready(&allowed).unwrap_err().step, Step::Scope);
    }
}
