//! Opt-in confirmation of actions (`SNOWLUMA_MCP_CONFIRM_ACTIONS`): the
//! operator's list (names, aliases, presets), the one-field form that asks
//! the human, and the reading of the answer. The asking itself is the
//! `_with_input` machinery (`completion.rs` continuations and
//! `completion_flow.rs`): a modern client gets `input_required` with a
//! sealed one-shot `requestState` bound to the tool, the action and the
//! exact params; a legacy client an `elicitation/create` within the call.
//!
//! The form shows the action, the target ids the params name and the exact
//! params; it never resolves a name (that would be an extra SnowLuma call).

use std::collections::BTreeSet;

use rmcp::model::{ElicitRequestParams, ElicitationSchema};
use serde_json::{Value, json};
use snowluma_catalog::{Action, Catalog};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::completion::StateError;
use crate::names::PolicyError;

/// The variable (named in every refusal).
pub const VAR: &str = "SNOWLUMA_MCP_CONFIRM_ACTIONS";
/// The key of the confirmation's input request (and its answer).
pub const INPUT_KEY: &str = "confirm";
/// The one form field: a boolean that must be `true`.
pub const FORM_FIELD: &str = "confirm";

/// `destructive`: what removes people, messages, files or the account from
/// a group or a friendship, silences a group or changes who administers it.
pub const DESTRUCTIVE: &[&str] = &[
    "set_group_kick",
    "set_group_kick_members",
    "set_group_ban",
    "set_group_anonymous_ban",
    "set_group_whole_ban",
    "set_group_leave",
    "delete_friend",
    "delete_msg",
    "set_group_admin",
    "delete_group_file",
    "delete_group_folder",
    "delete_group_file_folder",
];

/// The presets an operator may name in the list.
pub const PRESETS: &[(&str, &[&str])] = &[("destructive", DESTRUCTIVE)];

/// The actions `invoke_action` confirms first (canonical names).
#[derive(Debug, Clone, Default)]
pub struct ConfirmList {
    actions: BTreeSet<String>,
    presets: Vec<&'static str>,
}

impl ConfirmList {
    /// The list as configured: names, aliases (an `_async` form too, as in
    /// the action policy) and presets, comma- or space-separated. Unset or
    /// empty: nothing is confirmed.
    pub fn from_config(catalog: &Catalog, raw: Option<&str>) -> Result<ConfirmList, PolicyError> {
        let mut list = ConfirmList::default();
        let Some(raw) = raw else { return Ok(list) };
        for item in raw.split([',', ' ', '\n']).map(str::trim).filter(|s| !s.is_empty()) {
            if let Some((name, members)) = PRESETS.iter().find(|(n, _)| *n == item) {
                if !list.presets.contains(name) {
                    list.presets.push(name);
                }
                list.actions.extend(members.iter().map(|m| (*m).to_owned()));
                continue;
            }
            match crate::names::resolve_listed(catalog, item) {
                Some(a) => {
                    list.actions.insert(a.name.to_owned());
                }
                None => return Err(PolicyError { var: VAR, name: item.to_owned() }),
            }
        }
        Ok(list)
    }

    /// Whether `invoke_action` must ask before running `action`.
    pub fn requires(&self, action: &Action) -> bool {
        self.actions.contains(action.name)
    }

    /// For `get_runtime_info`.
    pub fn to_json(&self) -> Value {
        json!({
            "enabled": !self.actions.is_empty(),
            "presets": self.presets,
            "actions": self.actions.iter().collect::<Vec<_>>(),
        })
    }
}

/// The ids the params name as targets, for the form (display only).
fn targets(params: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (key, label) in [("group_id", "群"), ("user_id", "用户"), ("message_id", "消息")] {
        match params.get(key) {
            Some(Value::Array(ids)) => {
                let ids: Vec<String> = ids.iter().map(Value::to_string).collect();
                out.push(format!("{label} {}", ids.join(", ")));
            }
            Some(v @ (Value::Number(_) | Value::String(_))) => out.push(format!("{label} {v}")),
            _ => {}
        }
    }
    out
}

/// The form's message: the action, its targets and the exact params.
pub fn form_message(action: &Action, given: &str, params: &Value) -> String {
    let name = if given == action.name { action.name.to_owned() } else { format!("{} ({given})", action.name) };
    let summary = action.summary.unwrap_or(action.summary_en);
    let targets = targets(params);
    let target = if targets.is_empty() { "（参数中未指明）".to_owned() } else { targets.join("；") };
    format!(
        "确认执行 {name}（{summary}）？目标：{target}（仅显示 ID，不查询名称）。参数（原样）：{params}\n\
         Confirm running {} on SnowLuma with exactly these params. Set {FORM_FIELD} to true and accept to run it once; \
         decline to run nothing. (Required by the operator's {VAR}.)",
        action.name,
        params = snowluma_proto::text::canonical_json(params),
    )
}

/// The form: one required boolean.
pub fn form(action: &Action, given: &str, params: &Value) -> ElicitRequestParams {
    let schema = ElicitationSchema::builder()
        .required_bool_with(FORM_FIELD, |b| b.description(format!("true: run {} once, as shown", action.name)))
        .build_unchecked();
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: form_message(action, given, params),
        requested_schema: schema,
    }
}

/// How the human answered (the audit record's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Accepted,
    Declined,
    Cancelled,
    /// Not answered in time (a legacy client's `elicitation/create`).
    TimedOut,
    /// The confirmation could not be asked.
    Unavailable,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accepted => "accepted",
            Decision::Declined => "declined",
            Decision::Cancelled => "cancelled",
            Decision::TimedOut => "timed_out",
            Decision::Unavailable => "unavailable",
        }
    }
}

/// An answer: accepted only with `confirm: true`; an accept without it
/// counts as declined.
pub fn decide(action_taken: &str, content: Option<&Value>) -> Decision {
    match action_taken {
        "accept" if content.and_then(|c| c.get(FORM_FIELD)) == Some(&Value::Bool(true)) => Decision::Accepted,
        "accept" | "decline" => Decision::Declined,
        _ => Decision::Cancelled,
    }
}

/// The tool error for a confirmation not given (`why` says how).
pub fn refusal(action: &Action, decision: Decision, why: &str) -> ToolReply {
    let lead = match decision {
        Decision::Declined => "用户拒绝了确认（declined）",
        Decision::Cancelled => "确认请求已取消（cancelled）",
        Decision::TimedOut => "确认请求在 10 分钟内未得到回答（timed out）",
        Decision::Unavailable | Decision::Accepted => "无法取得确认",
    };
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::NotConfirmed,
            format!("{} 需要人工确认（{VAR}）：{lead}{why}；未执行任何操作。", action.name),
        )
        .with_next_step(format!(
            "Nothing was executed. Ask the user, then call again from a client that supports form elicitation; \
             or the operator removes {} from {VAR}.",
            action.name
        )),
    )
}

/// The JSON-RPC message (-32602) for a confirmation's `requestState` that
/// has expired or was already used: names the setting that asked for it.
/// `None`: another refusal of a state, answered as input completion's.
pub fn stale_state(action: &Action, e: &StateError) -> Option<String> {
    let (lead, then) = match e {
        StateError::Expired => ("确认请求已过期（10 分钟内未回答）", "Call again to be asked again."),
        StateError::Reused => ("此确认已用过（每个确认至多执行一次）", "Call again for a new confirmation."),
        StateError::Tampered | StateError::Foreign => return None,
    };
    Some(format!("{} 需要人工确认（{VAR}）：{lead}；未执行任何操作。{e}. {then}", action.name))
}

/// The refusal for a client that cannot answer a form.
pub fn no_form_support(action: &Action) -> ToolReply {
    refusal(action, Decision::Unavailable, "，此客户端不支持输入表单（form elicitation）")
}

/// The refusal for a background task (tasks never ask for input).
pub fn not_in_background(action: &Action) -> ToolReply {
    refusal(action, Decision::Unavailable, "，后台任务无法询问；请用 invoke_action")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// An expired or used confirmation names the setting; other refusals
    /// of a state are input completion's.
    #[test]
    fn stale_confirmation_states_name_the_setting() {
        let kick = Catalog::bundled().get("set_group_kick").unwrap();
        for (e, text) in [(StateError::Expired, "expired"), (StateError::Reused, "already used")] {
            let m = stale_state(kick, &e).unwrap();
            assert!(m.starts_with("set_group_kick 需要人工确认（SNOWLUMA_MCP_CONFIRM_ACTIONS）"), "{m}");
            assert!(m.contains(text) && m.contains("未执行任何操作"), "{m}");
        }
        assert_eq!(stale_state(kick, &StateError::Tampered), None);
        assert_eq!(stale_state(kick, &StateError::Foreign), None);
    }

    #[test]
    fn the_list_resolves_names_aliases_and_presets() {
        let c = Catalog::bundled();
        for name in DESTRUCTIVE {
            assert!(c.get(name).is_some(), "{name} is in the catalog");
        }
        let l = ConfirmList::from_config(c, None).unwrap();
        assert!(!l.requires(c.get("set_group_kick").unwrap()));
        let l = ConfirmList::from_config(c, Some("destructive, send_group_msg_async")).unwrap();
        assert!(l.requires(c.get("set_group_kick").unwrap()));
        assert!(l.requires(c.get("send_group_msg").unwrap()));
        assert!(!l.requires(c.get("get_status").unwrap()));
        assert_eq!(l.to_json()["presets"], json!(["destructive"]));
        let e = ConfirmList::from_config(c, Some("destructiv")).unwrap_err();
        assert_eq!((e.var, e.name.as_str()), (VAR, "destructiv"));
    }

    #[test]
    fn only_an_explicit_true_confirms() {
        assert_eq!(decide("accept", Some(&json!({"confirm": true}))), Decision::Accepted);
        for c in [None, Some(json!({})), Some(json!({"confirm": false})), Some(json!({"confirm": "true"}))] {
            assert_eq!(decide("accept", c.as_ref()), Decision::Declined);
        }
        assert_eq!(decide("decline", Some(&json!({"confirm": true}))), Decision::Declined);
        assert_eq!(decide("cancel", None), Decision::Cancelled);
        assert_eq!(decide("weird", None), Decision::Cancelled);
    }

    #[test]
    fn the_form_shows_action_targets_and_exact_params() {
        let a = Catalog::bundled().get("set_group_kick").unwrap();
        let params = json!({"user_id": 30001, "group_id": 20001});
        let m = form_message(a, "set_group_kick", &params);
        assert!(m.contains("set_group_kick") && m.contains("群 20001") && m.contains("用户 30001"), "{m}");
        assert!(m.contains(r#"{"group_id":20001,"user_id":30001}"#), "{m}");
        assert!(m.contains(VAR));
        let r = refusal(a, Decision::Declined, "");
        assert_eq!(r.diagnostics.kind, Some(FailureKind::NotConfirmed));
        assert!(r.diagnostics.message.unwrap().contains(VAR));
    }
}
