//! `preview_message` and its MCP Apps panel.
//!
//! The tool only builds a draft: it contacts nothing, in every mode. Its
//! result names the exact `invoke_action` arguments that would send the
//! message (the text as one literal text segment, so that anything that
//! looks like a CQ code stays text) and whether this server would send them
//! (`can_send`: write mode, an endpoint, and the operator's policy).
//!
//! Clients that declare the MCP Apps extension (`io.modelcontextprotocol/ui`
//! with [`UI_MIME`]) also get `_meta.ui.resourceUri` on the tool and the
//! panel's `ui://` resource in `resources/list`; no other client sees
//! either. The panel is one self-contained HTML file built from `ui/preview/`
//! and compiled in ([`PANEL`]); [`panel`] checks the digest the build wrote
//! into it, so a damaged asset is a visible error, never an empty panel.

use rmcp::RoleServer;
use rmcp::model::MetaObject;
use rmcp::service::RequestContext;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use snowluma_catalog::Catalog;
use snowluma_proto::{FailureKind, ToolReply};

use crate::policy::Policy;
use snowluma_config::Mode;

/// The MCP Apps extension's identifier.
pub const UI_EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The only UI MIME type this server offers.
pub const UI_MIME: &str = "text/html;profile=mcp-app";
/// The panel's resource.
pub const UI_URI: &str = "ui://snowluma-mcp/preview-message.html";

/// The longest `text` a draft may hold, in Unicode characters. QQ splits or
/// refuses far shorter messages in practice; the cap keeps the text at most
/// 40 KB of UTF-8 while leaving room for any real chat message. The answer
/// carries it six times (draft, `text`, send arguments, each in
/// `structuredContent` and in the text block's JSON), so it stays under
/// 400 KB: 392 KB when every character is a control character (JSON's
/// six-byte `\u00XX`, seven once escaped again), the measured worst case
/// the README states (`tests/tests/preview.rs` holds it to that).
pub const MAX_TEXT_CHARS: usize = 10_000;
/// JavaScript's largest safe integer, 2^53 − 1: ids above it lose precision
/// in the clients (and the panel) that read them as doubles.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// What an acknowledgement means, shown with every draft and in the panel.
pub const NOTICE: &str = "Nothing was sent. Sending runs invoke_action with the arguments below (write mode; the server's gates and policy apply) and is never retried. An acknowledgement (status ok, a message_id) is not proof of delivery or of rendering in QQ: check the outcome before creating a new draft.";

/// The panel, as `ui/preview/build.mjs` wrote it (`scripts/check-ui-asset`
/// fails CI when it is not what the sources build). A missing file fails
/// the build here.
pub const PANEL: &str = include_str!("../assets/preview-panel.html");

/// The last line of the asset: `<!-- snowluma-mcp preview panel sha256=<hex> -->`,
/// the digest of every byte before it.
const SEAL_PREFIX: &str = "<!-- snowluma-mcp preview panel sha256=";
const SEAL_SUFFIX: &str = " -->\n";

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AssetError {
    #[error(
        "the preview panel asset has no build seal (it was not written by ui/preview/build.mjs); this is a packaging error: rebuild it with `npm --prefix ui/preview run build`"
    )]
    Unsealed,
    #[error(
        "the preview panel asset is corrupt: its content does not match the digest its build recorded; this is a packaging error: rebuild it with `npm --prefix ui/preview run build`"
    )]
    DigestMismatch,
    #[error(
        "the preview panel asset has no Content-Security-Policy; this is a packaging error: rebuild it with `npm --prefix ui/preview run build`"
    )]
    NoPolicy,
}

/// Check an asset's seal and policy.
pub fn check_asset(text: &str) -> Result<&str, AssetError> {
    let body_end = text.rfind(SEAL_PREFIX).ok_or(AssetError::Unsealed)?;
    let (body, seal) = text.split_at(body_end);
    let hex = seal.strip_prefix(SEAL_PREFIX).and_then(|s| s.strip_suffix(SEAL_SUFFIX)).ok_or(AssetError::Unsealed)?;
    let digest = Sha256::digest(body.as_bytes());
    if snowluma_proto::bytes::hex(&digest) != hex {
        return Err(AssetError::DigestMismatch);
    }
    if !body.contains("<meta http-equiv=\"Content-Security-Policy\"") {
        return Err(AssetError::NoPolicy);
    }
    Ok(text)
}

/// The compiled-in panel, checked once per process (it cannot change): the
/// startup check and every read share the result.
pub fn panel() -> Result<&'static str, AssetError> {
    static CHECKED: std::sync::OnceLock<Result<&'static str, AssetError>> = std::sync::OnceLock::new();
    CHECKED.get_or_init(|| check_asset(PANEL)).clone()
}

/// The resource contents' `_meta.ui`: no domain of any kind may be reached
/// (the document's own policy says the same), no device permission.
pub fn resource_meta() -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert(
        "ui".into(),
        json!({
            "csp": {"connectDomains": [], "resourceDomains": [], "frameDomains": [], "baseUriDomains": []},
            "permissions": {},
            "prefersBorder": true
        }),
    );
    meta
}

/// The tool's `_meta` for a UI-capable client.
pub fn tool_meta() -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert("ui".into(), json!({"resourceUri": UI_URI}));
    meta
}

/// Whether this request's client declared the Apps extension with our MIME
/// type: per request for 2026-07-28, from `initialize` for older revisions.
pub fn ui_declared(ctx: &RequestContext<RoleServer>) -> bool {
    if crate::replies::is_modern(ctx) {
        return ctx
            .meta
            .get("io.modelcontextprotocol/clientCapabilities")
            .and_then(|c| c.get("extensions"))
            .and_then(|e| e.get(UI_EXTENSION))
            .is_some_and(accepts_mime);
    }
    ctx.peer
        .peer_info()
        .and_then(|i| i.capabilities.extensions.as_ref().and_then(|e| e.get(UI_EXTENSION)).cloned())
        .is_some_and(|settings| accepts_mime(&Value::Object(settings)))
}

fn accepts_mime(settings: &Value) -> bool {
    settings.get("mimeTypes").and_then(Value::as_array).is_some_and(|m| m.iter().any(|t| t.as_str() == Some(UI_MIME)))
}

/// A draft's parsed arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub group: bool,
    pub target_id: u64,
    pub text: String,
    pub reply_to: Option<i32>,
}

fn invalid(message: impl Into<String>) -> ToolReply {
    ToolReply::error(
        snowluma_proto::Diagnostics::failed(FailureKind::InvalidArguments, message).with_next_step(
            "Pass {\"message_type\": \"group\"|\"private\", \"target_id\": <positive id>, \"text\": \"...\"} and optionally \"reply_to\": <message id>.",
        ),
    )
}

/// Parse and check `preview_message`'s arguments.
pub fn parse(args: &Value) -> Result<Draft, ToolReply> {
    let Some(obj) = args.as_object() else {
        return Err(invalid("参数必须是 JSON 对象（object）。"));
    };
    if let Some(extra) = obj.keys().find(|k| !["message_type", "target_id", "text", "reply_to"].contains(&k.as_str())) {
        return Err(invalid(format!("未知参数: {}", snowluma_catalog::json_echo(extra))));
    }
    let group = match obj.get("message_type") {
        Some(Value::String(t)) if t == "group" => true,
        Some(Value::String(t)) if t == "private" => false,
        None => return Err(invalid("缺少 message_type（\"group\" 或 \"private\"）。")),
        Some(_) => return Err(invalid("message_type 必须是 \"group\" 或 \"private\"。")),
    };
    let target_id = match obj.get("target_id") {
        None => return Err(invalid("缺少 target_id。")),
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=MAX_SAFE_INTEGER).contains(n))
            .ok_or_else(|| invalid(format!("target_id 必须是 1 到 {MAX_SAFE_INTEGER} 之间的整数（群号或 QQ 号）。")))?,
    };
    let text = match obj.get("text") {
        None => return Err(invalid("缺少 text。")),
        Some(Value::String(s)) => s,
        Some(_) => return Err(invalid("text 必须是字符串。")),
    };
    if !text.chars().any(visible) {
        return Err(invalid("text 没有可发送的内容（为空，或只有空白或不可见字符）。"));
    }
    let chars = text.chars().count();
    if chars > MAX_TEXT_CHARS {
        return Err(invalid(format!("text 有 {chars} 个字符；草稿最多 {MAX_TEXT_CHARS} 个字符（请拆分消息）。")));
    }
    let reply_to = match obj.get("reply_to") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .filter(|n| *n != 0)
                .ok_or_else(|| invalid("reply_to 必须是非零的 32 位有符号 message_id（来自消息事件或发送结果）。"))?,
        ),
    };
    Ok(Draft { group, target_id, text: text.clone(), reply_to })
}

/// Whether `c` shows anything by itself. Not: whitespace; control and
/// format characters (NUL, zero-width space U+200B, the byte order mark
/// U+FEFF, direction marks such as U+200F and the bidirectional controls,
/// tag characters); combining marks, which have nothing to combine with in
/// a text made only of them; separators and surrogates; and the few letters
/// and symbols that render as blank (the Hangul fillers, the blank Braille
/// pattern). A text of only such characters would send a message that
/// looks empty, so it is refused like whitespace-only text.
fn visible(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    if c.is_whitespace() || matches!(c, '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' | '\u{2800}') {
        return false;
    }
    match get_general_category(c) {
        G::Control
        | G::Format
        | G::Surrogate
        | G::SpaceSeparator
        | G::LineSeparator
        | G::ParagraphSeparator
        | G::NonspacingMark
        | G::SpacingMark
        | G::EnclosingMark => false,
        // Unassigned tag and variation-selector space is ignorable too.
        G::Unassigned => !('\u{E0000}'..='\u{E0FFF}').contains(&c),
        _ => true,
    }
}

impl Draft {
    /// The send action.
    pub fn action(&self) -> &'static str {
        if self.group { "send_group_msg" } else { "send_private_msg" }
    }

    /// The exact `invoke_action` arguments that send this draft.
    pub fn invoke_arguments(&self) -> Value {
        let mut segments = Vec::new();
        if let Some(id) = self.reply_to {
            segments.push(json!({"type": "reply", "data": {"id": id.to_string()}}));
        }
        segments.push(json!({"type": "text", "data": {"text": self.text}}));
        let mut params = Map::new();
        params.insert((if self.group { "group_id" } else { "user_id" }).into(), json!(self.target_id));
        params.insert("message".into(), Value::Array(segments));
        json!({"action": self.action(), "params": params})
    }

    /// The readable draft.
    pub fn readable(&self) -> String {
        let to = if self.group { format!("group {}", self.target_id) } else { format!("user {}", self.target_id) };
        let reply = match self.reply_to {
            Some(id) => format!("In reply to message {id}\n"),
            None => String::new(),
        };
        format!("Draft (not sent) to {to}\n{reply}---\n{}", self.text)
    }
}

/// Why this server would not send the draft, if it would not.
pub fn send_blocked_by(mode: Mode, endpoint: bool, policy: &Policy, catalog: &Catalog, action: &str) -> Option<String> {
    if mode != Mode::Write {
        return Some(format!("sending needs write mode; this server runs in {} mode", mode.as_str()));
    }
    if !endpoint {
        return Some("no SnowLuma endpoint is configured".to_owned());
    }
    match crate::policy::resolve(catalog, action) {
        Some(a) if policy.permits(a) => None,
        Some(a) => Some(format!("{} is refused by this server's action policy: {}", a.name, policy.reason(a))),
        None => Some(format!("{action} is not in the bundled catalog")),
    }
}

/// Why a send this server would otherwise make cannot be confirmed: the
/// send action is in `SNOWLUMA_MCP_CONFIRM_ACTIONS` and this client
/// (`form`: whether it can answer a form) could not be asked.
pub fn confirmation_blocks(policy: &Policy, catalog: &Catalog, action: &str, form: bool) -> Option<String> {
    let a = crate::policy::resolve(catalog, action)?;
    (policy.confirm().requires(a) && !form).then(|| {
        format!(
            "{} needs a human's confirmation ({}) and this client does not support form elicitation",
            a.name,
            crate::confirm::VAR
        )
    })
}

/// Whether sending asks the human first (`SNOWLUMA_MCP_CONFIRM_ACTIONS`).
pub fn needs_confirmation(policy: &Policy, catalog: &Catalog, action: &str) -> bool {
    crate::policy::resolve(catalog, action).is_some_and(|a| policy.confirm().requires(a))
}

/// Why the operator's target scope would refuse the draft's send, if it
/// would: the same check `invoke_action` makes on the same arguments.
pub fn scope_blocked(scope: &crate::scope::Scope, catalog: &Catalog, draft: &Draft) -> Option<String> {
    let action = crate::policy::resolve(catalog, draft.action())?;
    let params = draft.invoke_arguments().get("params").cloned().unwrap_or_else(|| json!({}));
    scope
        .check(action, &crate::args::Params::Value(params))
        .err()
        .map(|e| format!("the target is outside this server's scope (out_of_scope): {e}"))
}

/// The tool's result.
pub fn result(draft: &Draft, blocked: Option<String>) -> Value {
    json!({
        "draft": draft.readable(),
        "message_type": if draft.group { "group" } else { "private" },
        "target_id": draft.target_id,
        "text": draft.text,
        "reply_to": draft.reply_to,
        "can_send": blocked.is_none(),
        "send_blocked_by": blocked,
        "invoke_action": draft.invoke_arguments(),
        "notice": NOTICE,
    })
}

pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message_type": {"type": "string", "enum": ["group", "private"], "description": "group：QQ 群；private：私聊。group: a QQ group; private: a one-to-one chat."},
            "target_id": {"type": "integer", "minimum": 1, "maximum": MAX_SAFE_INTEGER, "description": "群号（group）或 QQ 号（private）。The group or user number."},
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "description": "消息文本，按字面发送（不解析 CQ 码），最多 10000 个字符。The message text, sent literally."},
            "reply_to": {"type": "integer", "minimum": i32::MIN, "maximum": i32::MAX, "description": "可选：引用回复这条消息（来自事件或发送结果的非零 32 位有符号 message_id）。Optional: the message to quote."}
        },
        "required": ["message_type", "target_id", "text"],
        "additionalProperties": false
    })
}

pub fn result_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "draft": {"type": "string", "description": "The draft as readable text."},
            "message_type": {"type": "string", "enum": ["group", "private"]},
            "target_id": {"type": "integer"},
            "text": {"type": "string"},
            "reply_to": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "can_send": {"type": "boolean", "description": "Whether this server would send it: write mode, an endpoint, and the send action allowed by policy."},
            "send_blocked_by": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Why can_send is false."},
            "needs_confirmation": {"type": "boolean", "description": "Sending asks the human to confirm first (SNOWLUMA_MCP_CONFIRM_ACTIONS); present only then."},
            "invoke_action": {
                "type": "object",
                "description": "The exact invoke_action arguments that send this draft.",
                "properties": {"action": {"type": "string"}, "params": {"type": "object"}},
                "required": ["action", "params"]
            },
            "notice": {"type": "string"}
        },
        "required": ["draft", "message_type", "target_id", "text", "reply_to", "can_send", "send_blocked_by", "invoke_action", "notice"]
    })
}

/// `preview_message`: a draft and whether this server would send it.
/// Contacts nothing (no worker, no network, no audit record).
/// `form`: whether the requesting client can answer a confirmation form.
pub(crate) fn tool_call(state: &crate::state::ServerState, args: &Value, form: bool) -> ToolReply {
    let draft = match parse(args) {
        Ok(d) => d,
        Err(reply) => return reply,
    };
    let blocked = send_blocked_by(
        state.config.mode,
        state.workers.network.is_some(),
        &state.policy,
        state.catalog,
        draft.action(),
    )
    .or_else(|| scope_blocked(&state.scope, state.catalog, &draft))
    .or_else(|| confirmation_blocks(&state.policy, state.catalog, draft.action(), form));
    let mut out = result(&draft, blocked);
    if needs_confirmation(&state.policy, state.catalog, draft.action())
        && let Some(o) = out.as_object_mut()
    {
        o.insert("needs_confirmation".into(), json!(true));
    }
    ToolReply::ok(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(args: Value) -> Draft {
        parse(&args).unwrap()
    }

    fn err(args: Value) -> String {
        let reply = parse(&args).unwrap_err();
        assert!(reply.is_error);
        assert_eq!(reply.diagnostics.kind, Some(FailureKind::InvalidArguments));
        reply.diagnostics.message.unwrap()
    }

    #[test]
    fn the_compiled_asset_is_sealed_and_has_a_policy() {
        let text = panel().unwrap();
        assert!(text.starts_with("<!doctype html>"));
        assert!(text.contains("connect-src 'none'"));
        assert!(!text.contains("<script src"), "no external script");
    }

    #[test]
    fn a_damaged_asset_is_refused() {
        assert_eq!(check_asset(""), Err(AssetError::Unsealed));
        assert_eq!(check_asset("<!doctype html>"), Err(AssetError::Unsealed));
        let tampered = PANEL.replacen("acknowledgement", "acknowledgment", 1);
        assert_ne!(tampered, PANEL);
        assert_eq!(check_asset(&tampered), Err(AssetError::DigestMismatch));
        let cut = &PANEL[PANEL.len() / 2..];
        assert!(check_asset(cut).is_err());
        let body = "<!doctype html><p>no policy</p>\n";
        let sealed = format!("{body}{SEAL_PREFIX}{}{SEAL_SUFFIX}", snowluma_proto::bytes::hex(&Sha256::digest(body)));
        assert_eq!(check_asset(&sealed), Err(AssetError::NoPolicy));
    }

    #[test]
    fn a_group_reply_draft() {
        let d = ok(json!({"message_type": "group", "target_id": 20001, "text": "Hello", "reply_to": -123456}));
        assert_eq!(
            d.invoke_arguments(),
            json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": [
                {"type": "reply", "data": {"id": "-123456"}},
                {"type": "text", "data": {"text": "Hello"}}
            ]}})
        );
        assert!(d.readable().contains("group 20001") && d.readable().contains("-123456"));
    }

    #[test]
    fn a_private_draft_keeps_cq_codes_literal() {
        let text = "[CQ:at,qq=all] <img src=x onerror=alert(1)> \u{202e}abc";
        let d = ok(json!({"message_type": "private", "target_id": 9007199254740991_u64, "text": text}));
        assert_eq!(
            d.invoke_arguments(),
            json!({"action": "send_private_msg", "params": {"user_id": 9007199254740991_u64, "message": [
                {"type": "text", "data": {"text": text}}
            ]}})
        );
    }

    #[test]
    fn arguments_are_checked() {
        let base = json!({"message_type": "group", "target_id": 1, "text": "x"});
        ok(base.clone());
        let with = |k: &str, v: Value| {
            let mut a = base.clone();
            a[k] = v;
            a
        };
        assert!(err(json!([])).contains("object"));
        assert!(err(with("message_type", json!("channel"))).contains("message_type"));
        assert!(err(json!({"target_id": 1, "text": "x"})).contains("缺少 message_type"));
        for bad in [json!(0), json!(-1), json!(1.5), json!("20001"), json!(9007199254740992_u64)] {
            assert!(err(with("target_id", bad)).contains("target_id"));
        }
        for bad in [json!(""), json!("  \n"), json!(5)] {
            assert!(err(with("text", bad)).contains("text"));
        }
        // Only invisible characters: refused like whitespace.
        for bad in [
            "\u{200B}",
            "\u{FEFF}",
            "\u{200F}",
            "\0",
            "\u{301}",
            "\u{200B}\u{FEFF} \u{200F}\0\u{301}\u{2066}\u{E0041}\u{3164}",
        ] {
            assert!(err(with("text", json!(bad))).contains("不可见字符"), "{bad:?}");
        }
        // Anything visible among them makes a message (even one mark on it).
        for good in ["\u{200B}x", "e\u{301}", "\u{FEFF}字", "😀", "\u{200F}שלום", "·"] {
            ok(with("text", json!(good)));
        }
        ok(with("text", json!("字".repeat(MAX_TEXT_CHARS))));
        assert!(err(with("text", json!("a".repeat(MAX_TEXT_CHARS + 1)))).contains("10001 个字符"));
        for bad in [json!(0), json!(2147483648_i64), json!(-2147483649_i64), json!("5"), json!(1.0)] {
            assert!(err(with("reply_to", bad)).contains("reply_to"));
        }
        assert_eq!(ok(with("reply_to", json!(i32::MIN))).reply_to, Some(i32::MIN));
        assert_eq!(ok(with("reply_to", Value::Null)).reply_to, None);
        assert!(err(with("extra", json!(1))).contains("未知参数: \"extra\""));
    }

    #[test]
    fn can_send_needs_write_mode_an_endpoint_and_the_policy() {
        let catalog = Catalog::bundled();
        let open = Policy::from_config(catalog, None, None).unwrap();
        assert_eq!(send_blocked_by(Mode::Write, true, &open, catalog, "send_group_msg"), None);
        assert!(send_blocked_by(Mode::Read, true, &open, catalog, "send_group_msg").unwrap().contains("read mode"));
        assert!(send_blocked_by(Mode::Docs, false, &open, catalog, "send_group_msg").unwrap().contains("docs mode"));
        assert!(send_blocked_by(Mode::Write, false, &open, catalog, "send_group_msg").unwrap().contains("endpoint"));
        let deny = Policy::from_config(catalog, None, Some("send_private_msg")).unwrap();
        assert_eq!(send_blocked_by(Mode::Write, true, &deny, catalog, "send_group_msg"), None);
        assert!(send_blocked_by(Mode::Write, true, &deny, catalog, "send_private_msg").unwrap().contains("policy"));
        let d = ok(json!({"message_type": "private", "target_id": 5, "text": "hi"}));
        let r = result(&d, Some("why".into()));
        assert_eq!((r["can_send"].clone(), r["send_blocked_by"].clone()), (json!(false), json!("why")));
        assert_eq!(result(&d, None)["can_send"], json!(true));
    }

    #[test]
    fn can_send_accounts_for_the_target_scope() {
        let catalog = Catalog::bundled();
        let scope = crate::scope::Scope::from_config(&snowluma_config::safety::ScopeConfig {
            groups: Some([20001].into()),
            users: None,
            show_ids: false,
        });
        let draft = |t: u64, reply: Option<i32>| {
            ok(json!({"message_type": "group", "target_id": t, "text": "hi", "reply_to": reply}))
        };
        assert_eq!(scope_blocked(&scope, catalog, &draft(20001, None)), None);
        let why = scope_blocked(&scope, catalog, &draft(20002, None)).unwrap();
        assert!(why.contains("out_of_scope") && why.contains("20002"), "{why}");
        assert!(scope_blocked(&scope, catalog, &draft(20001, Some(-7))).unwrap().contains("-7"));
        scope.learn([-7]);
        assert_eq!(scope_blocked(&scope, catalog, &draft(20001, Some(-7))), None);
        let private = ok(json!({"message_type": "private", "target_id": 5, "text": "hi"}));
        assert_eq!(scope_blocked(&scope, catalog, &private), None, "no user list: users unrestricted");
    }
}
