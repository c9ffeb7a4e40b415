//! Input completion for `query_action_with_input` / `invoke_action_with_input`:
//! what is missing, the one-field form that asks for it, the validation of
//! the answer, and the continuations that carry a modern client's call
//! across its input round.
//!
//! A continuation (`requestState`) is sealed with an HMAC key drawn at
//! process start and never written anywhere (rmcp's `RequestStateCodec`),
//! so a restart invalidates every one of them. It names the tool and a
//! digest of the call's original arguments, so it cannot be used with
//! another call, and carries a one-time id that the supervisor keeps in
//! [`Continuations`] until it is redeemed: the id is removed (under a lock)
//! *before* anything executes, so a replayed or concurrent second answer
//! finds it gone and executes nothing. At most [`MAX_PENDING`] are
//! outstanding; each expires after [`TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitationSchema, InputRequest, InputRequests, InputRequiredResult,
};
use rmcp::model::{RequestStateCodec, SealOptions};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use snowluma_catalog::Action;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::trace::hex;

/// How long a continuation may be answered.
pub const TTL: Duration = Duration::from_secs(600);
/// Most continuations (and legacy prompts) outstanding at once.
pub const MAX_PENDING: usize = 256;
/// The key of the one input request (and its answer).
pub const INPUT_KEY: &str = "params";
/// The one form field.
pub const FORM_FIELD: &str = "params_json";
/// Moves the continuation clock forward (tests of expiry). It can only
/// shorten a continuation's life, never extend it.
pub const CLOCK_OFFSET_VAR: &str = "SNOWLUMA_MCP_INPUT_CLOCK_OFFSET_MS";
/// Associated data of every sealed state (the call's identity is inside,
/// compared after opening, so a mismatch can be told from tampering).
const SEAL_AD: &[u8] = b"snowluma-mcp/input-completion/v1";

/// The fields of `action`'s top-level `required` that `params` lacks.
pub fn missing(action: &Action, params: &Value) -> Vec<String> {
    action.required.iter().filter(|f| params.get(**f).is_none()).map(|f| (*f).to_owned()).collect()
}

/// SHA-256 of the canonical JSON (sorted keys) of a call's arguments.
pub fn args_digest(tool: &str, args: &Value) -> String {
    let mut h = Sha256::new();
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(canonical(args).as_bytes());
    hex(&h.finalize())
}

use snowluma_proto::text::canonical_json as canonical;

/// The message of the form: the action and what is missing.
pub fn form_message(action: &Action, missing: &[String]) -> String {
    format!(
        "{} needs {}. Answer {FORM_FIELD} with a JSON object of {}, e.g. {{\"{}\": …}}.",
        action.name,
        missing.join(", "),
        if missing.len() == 1 { "that field" } else { "those fields (or some of them)" },
        missing[0]
    )
}

/// The form itself: exactly one string field.
pub fn form(action: &Action, missing: &[String]) -> ElicitRequestParams {
    let schema = ElicitationSchema::builder()
        .required_string_with(FORM_FIELD, |s| {
            s.description(format!("A JSON object with {} (as the action's schema requires)", missing.join(", ")))
        })
        .build_unchecked();
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: form_message(action, missing),
        requested_schema: schema,
    }
}

/// A validated answer: the fields it supplied.
pub type Answer = Map<String, Value>;

fn invalid(msg: String) -> ToolReply {
    ToolReply::error(Diagnostics::failed(FailureKind::InvalidArguments, msg).with_next_step(
        "Nothing was executed. Call the tool again and answer with a JSON object of the missing fields only.",
    ))
}

/// What the user answered, checked: accepted, `params_json` a JSON object
/// whose keys are among `missing` (none already provided, none extra), each
/// valid against the field's catalog schema. Decline and cancel are
/// refusals of their own (`Err` with kind `cancelled`).
pub fn check_answer(
    action: &Action,
    provided: &Value,
    missing: &[String],
    action_taken: &str,
    content: Option<&Value>,
) -> Result<Answer, (ToolReply, &'static str)> {
    match action_taken {
        "accept" => {}
        "decline" => {
            return Err((
                ToolReply::error(
                    Diagnostics::failed(FailureKind::Cancelled, "用户拒绝（declined）提供缺少的参数；未执行任何操作。")
                        .with_next_step("Ask the user, or call the tool again with complete params."),
                ),
                "input_declined",
            ));
        }
        _ => {
            return Err((
                ToolReply::error(Diagnostics::failed(FailureKind::Cancelled, "输入请求已取消；未执行任何操作。")),
                "input_cancelled",
            ));
        }
    }
    let text = content
        .and_then(|c| c.get(FORM_FIELD))
        .and_then(Value::as_str)
        .ok_or_else(|| (invalid(format!("回答中没有 {FORM_FIELD} 字符串。")), "input_invalid"))?;
    let parsed: Value = serde_json::from_str(text)
        .map_err(|e| (invalid(format!("{FORM_FIELD} 不是有效的 JSON：{e}")), "input_invalid"))?;
    let Value::Object(fields) = parsed else {
        return Err((invalid(format!("{FORM_FIELD} 必须是 JSON 对象。")), "input_invalid"));
    };
    let props = action.doc().get("inputSchema").and_then(|s| s.get("properties"));
    for (k, v) in &fields {
        if provided.get(k).is_some() {
            return Err((invalid(format!("回答不能修改调用中已提供的 {k}。")), "input_invalid"));
        }
        if !missing.iter().any(|m| m == k) {
            return Err((
                invalid(format!("回答包含未被询问的字段: {}", snowluma_catalog::json_echo(k))),
                "input_invalid",
            ));
        }
        if let Some(schema) = props.and_then(|p| p.get(k)) {
            let errors = snowluma_catalog::schema::validate(schema, v);
            if let Some(first) = errors.first() {
                return Err((invalid(format!("{k} 不符合其 schema：{first}")), "input_invalid"));
            }
        }
        // The catalog's schema for a OneBot message has no type (it is a
        // description only); its parameter type says what it is.
        if param_type(action, k) == Some("message")
            && let Err(why) = onebot_message(v)
        {
            return Err((invalid(format!("{k} {why}")), "input_invalid"));
        }
    }
    Ok(fields)
}

/// The catalog's type of `action`'s parameter `name` (`"message"`, `"uint"`, …).
fn param_type<'a>(action: &'a Action, name: &str) -> Option<&'a str> {
    action
        .doc()
        .get("params")?
        .as_array()?
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
        .get("type")?
        .as_str()
}

/// A OneBot message as SnowLuma takes one: a string (CQ codes allowed), an
/// array of segments, or one segment, each segment an object with a
/// non-empty string `type` and, if present, an object `data`. The error
/// completes "<field> …".
fn onebot_message(v: &Value) -> Result<(), String> {
    const SHAPE: &str = "必须是 OneBot message：字符串、消息段数组或单个消息段 \
        （{\"type\": \"text\", \"data\": {\"text\": \"…\"}}）";
    let segment = |s: &Value| {
        s.as_object().is_some_and(|o| {
            o.get("type").and_then(Value::as_str).is_some_and(|t| !t.is_empty())
                && o.get("data").is_none_or(Value::is_object)
        })
    };
    let ok = match v {
        Value::String(_) => true,
        Value::Array(items) => !items.is_empty() && items.iter().all(segment),
        Value::Object(_) => segment(v),
        _ => false,
    };
    if ok { Ok(()) } else { Err(SHAPE.to_owned()) }
}

/// What a sealed continuation carries (signed, not encrypted: the client
/// sees its own answers).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// One-time id, kept in [`Continuations`] until redeemed.
    pub id: String,
    pub tool: String,
    pub digest: String,
    /// Fields still missing when the state was issued.
    pub missing: Vec<String>,
    /// Fields answered in earlier rounds of this call.
    pub answered: Answer,
    /// This round asks for the confirmation of the call
    /// (`SNOWLUMA_MCP_CONFIRM_ACTIONS`, `confirm.rs`), not for params.
    #[serde(default)]
    pub confirm: bool,
}

/// Why a continuation is refused (JSON-RPC -32602).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error(
        "requestState is invalid: tampered, malformed, or issued by an earlier run of this server; nothing was executed"
    )]
    Tampered,
    #[error("requestState has expired (continuations last 10 minutes); nothing was executed")]
    Expired,
    #[error("requestState was already used (each continuation executes at most once); nothing was executed")]
    Reused,
    #[error("requestState belongs to another call (the tool or its arguments differ); nothing was executed")]
    Foreign,
}

/// The outstanding continuations of this process.
pub struct Continuations {
    codec: RequestStateCodec,
    /// One-time id → when it expires.
    pending: Mutex<HashMap<String, Instant>>,
    clock_offset: Duration,
}

/// A refusal to open another prompt.
pub fn too_many() -> ToolReply {
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::Execution,
            format!("等待回答的输入请求过多（最多 {MAX_PENDING} 个）；未执行任何操作。"),
        )
        .with_next_step("Answer or abandon earlier input requests, or call the original tool with complete params."),
    )
}

impl Continuations {
    /// A fresh key (never written anywhere); `clock_offset` moves expiry
    /// checks forward.
    pub fn new(clock_offset: Duration) -> Result<Continuations, String> {
        let codec =
            RequestStateCodec::try_new(crate::trace::random_bytes::<32>().to_vec()).map_err(|e| e.to_string())?;
        Ok(Continuations { codec, pending: Mutex::new(HashMap::new()), clock_offset })
    }

    /// `SNOWLUMA_MCP_INPUT_CLOCK_OFFSET_MS` (tests only), else none.
    pub fn clock_offset_from_env() -> Duration {
        std::env::var(CLOCK_OFFSET_VAR)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or_default()
    }

    fn now(&self) -> Instant {
        Instant::now() + self.clock_offset
    }

    /// Take a slot for a prompt: its one-time id, or `None` when
    /// [`MAX_PENDING`] are outstanding.
    pub fn reserve(&self) -> Option<String> {
        let mut p = self.pending.lock().ok()?;
        let now = self.now();
        p.retain(|_, expires| *expires > now);
        if p.len() >= MAX_PENDING {
            return None;
        }
        let id = hex(&crate::trace::random_bytes::<16>());
        p.insert(id.clone(), Instant::now() + TTL);
        Some(id)
    }

    /// Give a slot back (a legacy prompt that finished).
    pub fn release(&self, id: &str) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(id);
        }
    }

    /// Seal a continuation for `state` (whose id came from [`Continuations::reserve`]).
    pub fn seal(&self, state: &State) -> Result<String, String> {
        self.codec
            .seal_json_with(state, &SealOptions::new().associated_data(SEAL_AD).ttl(TTL))
            .map_err(|e| e.to_string())
    }

    /// Open a continuation and check that it belongs to the call `(tool, digest)`.
    fn open(&self, sealed: &str, tool: &str, digest: &str) -> Result<State, StateError> {
        let state: State = self.codec.open_json_with(sealed, SEAL_AD).map_err(|e| match e {
            rmcp::model::RequestStateError::Expired => StateError::Expired,
            _ => StateError::Tampered,
        })?;
        if state.tool != tool || state.digest != digest {
            return Err(StateError::Foreign);
        }
        Ok(state)
    }

    /// Whether a one-time id found in the map is still valid.
    fn live(&self, expires: Option<Instant>) -> Result<(), StateError> {
        match expires {
            None => Err(StateError::Reused),
            Some(expires) if expires <= self.now() => Err(StateError::Expired),
            Some(_) => Ok(()),
        }
    }

    /// Open and consume a continuation for the call `(tool, digest)`. The
    /// one-time id is removed before this returns, so nothing can redeem it
    /// again, whatever happens next.
    pub fn redeem(&self, sealed: &str, tool: &str, digest: &str) -> Result<State, StateError> {
        let state = self.open(sealed, tool, digest)?;
        let mut p = self.pending.lock().map_err(|_| StateError::Tampered)?;
        self.live(p.remove(&state.id)).map(|()| state)
    }

    /// Whether a continuation for the call `(tool, digest)` asks for a
    /// confirmation, whether or not it is still pending. `None`: it cannot
    /// be opened (the codec's own expiry, checked before the contents are
    /// read, among other reasons).
    pub fn is_confirmation(&self, sealed: &str, tool: &str, digest: &str) -> Option<bool> {
        self.open(sealed, tool, digest).ok().map(|s| s.confirm)
    }

    /// Peek at a continuation without consuming it (a retry that carries no
    /// answer is asked again with the same state).
    pub fn check(&self, sealed: &str, tool: &str, digest: &str) -> Result<State, StateError> {
        let state = self.open(sealed, tool, digest)?;
        let p = self.pending.lock().map_err(|_| StateError::Tampered)?;
        self.live(p.get(&state.id).copied()).map(|()| state)
    }
}

/// The modern `input_required` result asking for `missing`.
pub fn input_required(action: &Action, missing: &[String], sealed: String) -> InputRequiredResult {
    let mut requests = InputRequests::new();
    requests.insert(INPUT_KEY.to_owned(), InputRequest::Elicitation(ElicitRequest::new(form(action, missing))));
    InputRequiredResult::new(Some(requests), Some(sealed))
}

/// The tool error for a client that cannot answer a form.
pub fn no_form_support(tool: &str, missing: &[String]) -> ToolReply {
    let original = tool.trim_end_matches("_with_input");
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::InvalidArguments,
            format!(
                "params 缺少 {}，而此客户端不支持输入表单（form elicitation）；未执行任何操作。",
                missing.join(", ")
            ),
        )
        .with_next_step(format!("Call {original} with complete params (including {}).", missing.join(", "))),
    )
}

/// The arguments of the call with `answer` merged into its params.
pub fn merged_args(args: &Value, answer: &Answer) -> Value {
    let mut out = args.clone();
    if let Some(obj) = out.as_object_mut() {
        let params = obj.entry("params").or_insert_with(|| json!({}));
        if params.is_null() {
            *params = json!({});
        }
        if let Some(p) = params.as_object_mut() {
            for (k, v) in answer {
                p.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use snowluma_catalog::Catalog;

    fn send_group_msg() -> &'static Action {
        Catalog::bundled().get("send_group_msg").unwrap()
    }

    #[test]
    fn only_top_level_required_fields_are_missing() {
        let a = send_group_msg();
        assert_eq!(missing(a, &json!({"group_id": 1})), vec!["message".to_owned()]);
        assert!(missing(a, &json!({"group_id": 1, "message": "x"})).is_empty());
    }

    #[test]
    fn answers_are_checked_field_by_field() {
        let a = send_group_msg();
        let provided = json!({"group_id": 1});
        let m = vec!["message".to_owned()];
        let ok =
            check_answer(a, &provided, &m, "accept", Some(&json!({"params_json": "{\"message\":\"hi\"}"}))).unwrap();
        assert_eq!(ok.get("message"), Some(&json!("hi")));
        for (answer, reason) in [
            ("{\"message\":", "不是有效的 JSON"),
            ("[1]", "JSON 对象"),
            ("{\"message\":\"hi\",\"x\":1}", "未被询问的字段"),
            ("{\"group_id\":2}", "已提供的 group_id"),
        ] {
            let (r, why) = check_answer(a, &provided, &m, "accept", Some(&json!({"params_json": answer}))).unwrap_err();
            assert_eq!(why, "input_invalid");
            assert!(
                r.diagnostics.message.as_deref().unwrap().contains(reason),
                "{answer}: {:?}",
                r.diagnostics.message
            );
        }
        // message has no typed schema: its catalog type decides.
        for answer in [
            "{\"message\":[{\"type\":\"text\",\"data\":{\"text\":\"hi\"}}]}",
            "{\"message\":{\"type\":\"face\",\"data\":{\"id\":\"1\"}}}",
            "{\"message\":\"[CQ:face,id=1]\"}",
        ] {
            check_answer(a, &provided, &m, "accept", Some(&json!({"params_json": answer}))).unwrap();
        }
        for answer in [
            "{\"message\":12345}",
            "{\"message\":null}",
            "{\"message\":true}",
            "{\"message\":[]}",
            "{\"message\":[1]}",
            "{\"message\":[\"hi\"]}",
            "{\"message\":{\"text\":\"hi\"}}",
            "{\"message\":{\"type\":\"\",\"data\":{}}}",
            "{\"message\":{\"type\":\"text\",\"data\":\"hi\"}}",
        ] {
            let (r, why) = check_answer(a, &provided, &m, "accept", Some(&json!({"params_json": answer}))).unwrap_err();
            assert_eq!(why, "input_invalid");
            assert!(r.diagnostics.message.as_deref().unwrap().contains("OneBot message"), "{answer}");
        }
        let (r, why) = check_answer(a, &provided, &m, "decline", None).unwrap_err();
        assert_eq!((r.diagnostics.kind, why), (Some(FailureKind::Cancelled), "input_declined"));
        let (_, why) = check_answer(a, &provided, &m, "cancel", None).unwrap_err();
        assert_eq!(why, "input_cancelled");
    }

    #[test]
    fn a_continuation_opens_once_for_its_own_call() {
        let c = Continuations::new(Duration::ZERO).unwrap();
        let id = c.reserve().unwrap();
        let state = State {
            id,
            tool: "t".into(),
            digest: "d".into(),
            missing: vec!["m".into()],
            answered: Map::new(),
            confirm: false,
        };
        let sealed = c.seal(&state).unwrap();
        assert_eq!(c.redeem(&sealed, "t", "other").unwrap_err(), StateError::Foreign);
        assert!(c.check(&sealed, "t", "d").is_ok());
        assert_eq!(c.redeem(&sealed, "t", "d").unwrap().missing, vec!["m".to_owned()]);
        assert_eq!(c.redeem(&sealed, "t", "d").unwrap_err(), StateError::Reused);
        // One character in the middle changed (never the last one, whose
        // low bits may be base64 padding, and always to a different one).
        let mut chars: Vec<char> = sealed.chars().collect();
        let mid = chars.len() / 2;
        chars[mid] = if chars[mid] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        assert_ne!(tampered, sealed);
        assert_eq!(c.redeem(&tampered, "t", "d").unwrap_err(), StateError::Tampered);
        // Another process (another key) cannot open it.
        let other = Continuations::new(Duration::ZERO).unwrap();
        assert_eq!(other.redeem(&sealed, "t", "d").unwrap_err(), StateError::Tampered);
    }

    #[test]
    fn continuations_expire_and_are_bounded() {
        let c = Continuations::new(TTL + Duration::from_secs(1)).unwrap();
        let id = c.reserve().unwrap();
        let state =
            State { id, tool: "t".into(), digest: "d".into(), missing: vec![], answered: Map::new(), confirm: false };
        let sealed = c.seal(&state).unwrap();
        assert_eq!(c.redeem(&sealed, "t", "d").unwrap_err(), StateError::Expired);
        // Expired here (not by the codec), its contents stay readable.
        assert_eq!(c.is_confirmation(&sealed, "t", "d"), Some(false));
        let id = c.reserve().unwrap();
        let state =
            State { id, tool: "t".into(), digest: "d".into(), missing: vec![], answered: Map::new(), confirm: true };
        let sealed = c.seal(&state).unwrap();
        assert_eq!(c.check(&sealed, "t", "d").unwrap_err(), StateError::Expired);
        assert_eq!(c.is_confirmation(&sealed, "t", "d"), Some(true));
        assert_eq!(c.is_confirmation(&sealed, "t", "other"), None);
        let c = Continuations::new(Duration::ZERO).unwrap();
        for _ in 0..MAX_PENDING {
            assert!(c.reserve().is_some());
        }
        assert!(c.reserve().is_none());
    }

    #[test]
    fn digests_ignore_key_order_but_not_values() {
        let a = args_digest("t", &json!({"action": "x", "params": {"a": 1, "b": 2}}));
        assert_eq!(a, args_digest("t", &json!({"params": {"b": 2, "a": 1}, "action": "x"})));
        assert_ne!(a, args_digest("t", &json!({"action": "x", "params": {"a": 1, "b": 3}})));
        assert_ne!(a, args_digest("u", &json!({"action": "x", "params": {"a": 1, "b": 2}})));
    }
}
