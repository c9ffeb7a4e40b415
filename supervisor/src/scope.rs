//! The target scope (`SNOWLUMA_MCP_ALLOW_GROUPS` / `SNOWLUMA_MCP_ALLOW_USERS`):
//! which groups and users a call may name, applied by `gates::admit` after
//! the operator's action policy, to reads and writes alike, and to event
//! subscriptions and the events that enter their buffers.
//!
//! The targets of an action are what the catalog marks
//! (`snowluma_catalog::safety::targets`: upstream's `role`s, then the
//! table of unmarked ones) and the segments of its `message` params (`at`,
//! `contact`, `reply`, `node`, `forward`; in segment arrays, single segments
//! and CQ-code strings). A value this module cannot read as one id is
//! refused rather than guessed at. Message ids name no chat, so a message
//! id (a `message_id` param, a `reply` or a `node`'s `id`) passes only when
//! this runtime learned it from the scope itself: an in-scope send's result,
//! an in-scope history read, an event a buffer kept. With no list set
//! nothing here runs and nothing is parsed.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Mutex;

use serde_json::{Map, Value, json};
use snowluma_catalog::Action;
use snowluma_catalog::safety::{self, TargetKind};
use snowluma_config::safety::ScopeConfig;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::args::Params;

/// Most message ids remembered as in scope (the oldest are forgotten).
pub const MAX_KNOWN_MESSAGES: usize = 10_000;
/// Deepest nesting of forward nodes read (SnowLuma's limit is 3).
const MAX_NODE_DEPTH: usize = 8;

/// The message ids learned in scope, oldest first.
#[derive(Default)]
struct Known {
    order: VecDeque<i64>,
    set: HashSet<i64>,
}

/// The operator's target scope and what this runtime learned inside it.
#[derive(Default)]
pub struct Scope {
    groups: Option<BTreeSet<u64>>,
    users: Option<BTreeSet<u64>>,
    show_ids: bool,
    known: Mutex<Known>,
}

/// Why a call is out of scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutOfScope {
    #[error("群 {0} 不在本服务器的目标范围内（SNOWLUMA_MCP_ALLOW_GROUPS）")]
    Group(u64),
    #[error("用户 {0} 不在本服务器的目标范围内（SNOWLUMA_MCP_ALLOW_USERS）")]
    User(u64),
    #[error("消息 {0} 不是本服务器在目标范围内见过的消息（发送结果、历史消息或事件），无法确认其所在会话")]
    Message(i64),
    #[error("{0} 的值无法读作一个号码，无法确认其目标在范围内")]
    Unreadable(String),
    #[error("{0} 的结果或作用跨越多个会话（或其目标无法读出），设置目标范围时不可用")]
    Spanning(String),
    #[error("合并转发引用（forward 消息段）的内容无法确认在目标范围内")]
    Forward,
}

impl OutOfScope {
    /// The tool error: kind `out_of_scope`, the id named, nothing sent.
    pub fn reply(&self, action: &str) -> ToolReply {
        ToolReply::error(
            Diagnostics::failed(FailureKind::OutOfScope, format!("{action} 被拒绝：{self}；未发送任何请求。"))
                .with_next_step(
                    "Use a group or user in scope (see get_runtime_info's scope), or ask the operator to change \
                     SNOWLUMA_MCP_ALLOW_GROUPS / SNOWLUMA_MCP_ALLOW_USERS.",
                ),
        )
    }
}

/// A group or user number: a positive integer, or its canonical decimal
/// text; `0`, `null` and absence name nothing (`Ok(None)`).
fn target_id(v: &Value) -> Result<Option<u64>, ()> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64() {
            Some(0) => Ok(None),
            Some(n) => Ok(Some(n)),
            None => Err(()),
        },
        Value::String(s) if s == "0" => Ok(None),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0') => {
            s.parse().map(Some).map_err(|_| ())
        }
        _ => Err(()),
    }
}

/// A message id: a signed integer or its canonical decimal text.
fn message_id(v: &Value) -> Result<Option<i64>, ()> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_i64().map(Some).ok_or(()),
        Value::String(s) => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            let canonical = !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0'));
            if canonical { s.parse().map(Some).map_err(|_| ()) } else { Err(()) }
        }
        _ => Err(()),
    }
}

/// A reference found in a call's params.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ref {
    Group(u64),
    User(u64),
    Message(i64),
    Unreadable(String),
    Forward,
}

fn push_target(out: &mut Vec<Ref>, kind: TargetKind, what: &str, v: &Value) {
    if let (TargetKind::Group | TargetKind::User, Value::Array(items)) = (kind, v) {
        for item in items {
            push_target(out, kind, what, item);
        }
        return;
    }
    let r = match kind {
        TargetKind::Group => target_id(v).map(|id| id.map(Ref::Group)),
        TargetKind::User => target_id(v).map(|id| id.map(Ref::User)),
        TargetKind::Message => message_id(v).map(|id| id.map(Ref::Message)),
    };
    match r {
        Ok(Some(r)) => out.push(r),
        Ok(None) => {}
        Err(()) => out.push(Ref::Unreadable(what.to_owned())),
    }
}

/// The references of a message value: a segment array, one segment, or a
/// string (a JSON segment array in text, or CQ codes).
fn message_refs(out: &mut Vec<Ref>, v: &Value, depth: usize) {
    if depth > MAX_NODE_DEPTH {
        out.push(Ref::Unreadable("node".into()));
        return;
    }
    match v {
        Value::Array(items) => items.iter().for_each(|s| segment_refs(out, s, depth)),
        Value::Object(_) => segment_refs(out, v, depth),
        Value::String(s) => {
            let t = s.trim_start();
            let json = (t.starts_with('[') || t.starts_with('{'))
                .then(|| serde_json::from_str::<Value>(t).ok())
                .flatten()
                .filter(|p| p.is_array() || p.is_object());
            if let Some(parsed) = json {
                message_refs(out, &parsed, depth + 1);
            }
            cq_refs(out, s);
        }
        _ => {}
    }
}

/// One segment's references.
fn segment_refs(out: &mut Vec<Ref>, seg: &Value, depth: usize) {
    let Some(ty) = seg.get("type").and_then(Value::as_str) else { return };
    let data = seg.get("data").cloned().unwrap_or(Value::Null);
    let field = |k: &str| data.get(k).cloned().unwrap_or(Value::Null);
    match ty {
        "at" => {
            let qq = field("qq");
            if qq.as_str() != Some("all") {
                push_target(out, TargetKind::User, "at.qq", &qq);
            }
        }
        "reply" => push_target(out, TargetKind::Message, "reply.id", &field("id")),
        "contact" => {
            let kind = if field("type").as_str() == Some("group") { TargetKind::Group } else { TargetKind::User };
            push_target(out, kind, "contact.id", &field("id"));
        }
        "node" => {
            push_target(out, TargetKind::Message, "node.id", &field("id"));
            message_refs(out, &field("content"), depth + 1);
        }
        "forward" => out.push(Ref::Forward),
        _ => {}
    }
}

/// CQ codes in a string message: `[CQ:type,key=value,...]`, with CQ's
/// escapes in values.
fn cq_refs(out: &mut Vec<Ref>, s: &str) {
    let mut rest = s;
    while let Some(start) = rest.find("[CQ:") {
        let after = &rest[start + 4..];
        let Some(end) = after.find(']') else { break };
        let code = &after[..end];
        rest = &after[end + 1..];
        let mut parts = code.split(',');
        let ty = parts.next().unwrap_or("").trim();
        let mut data = Map::new();
        for kv in parts {
            if let Some((k, v)) = kv.split_once('=') {
                let v = v.replace("&#44;", ",").replace("&#91;", "[").replace("&#93;", "]").replace("&amp;", "&");
                data.insert(k.trim().to_owned(), Value::String(v));
            }
        }
        segment_refs(out, &json!({"type": ty, "data": data}), 0);
    }
}

impl Scope {
    pub fn from_config(c: &ScopeConfig) -> Scope {
        Scope { groups: c.groups.clone(), users: c.users.clone(), show_ids: c.show_ids, known: Mutex::default() }
    }

    /// Whether any list is set.
    pub fn active(&self) -> bool {
        self.groups.is_some() || self.users.is_some()
    }

    fn group_ok(&self, id: u64) -> bool {
        self.groups.as_ref().is_none_or(|g| g.contains(&id))
    }

    fn user_ok(&self, id: u64) -> bool {
        self.users.as_ref().is_none_or(|u| u.contains(&id))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn message_ok(&self, id: i64) -> bool {
        self.known().set.contains(&id)
    }

    /// Remember message ids as in scope.
    pub fn learn(&self, ids: impl IntoIterator<Item = i64>) {
        let mut k = self.known();
        for id in ids {
            if k.set.insert(id) {
                k.order.push_back(id);
            }
            while k.order.len() > MAX_KNOWN_MESSAGES {
                if let Some(old) = k.order.pop_front() {
                    k.set.remove(&old);
                }
            }
        }
    }

    /// Every reference in a call's params (only when a list is set).
    fn refs(action: &Action, params: &Params) -> Vec<Ref> {
        let mut out = Vec::new();
        let (targets, messages) = safety::targets(action);
        for (name, kind) in targets {
            if kind == TargetKind::Message && safety::message_cursor(action) {
                continue;
            }
            if let Some(v) = params.get(name) {
                push_target(&mut out, kind, name, &v);
            }
        }
        for name in messages {
            if let Some(v) = params.get(name) {
                message_refs(&mut out, &v, 0);
            }
        }
        out
    }

    /// The scope gate: every group, user and message the call names is in
    /// scope, and the action does not span every chat.
    pub fn check(&self, action: &Action, params: &Params) -> Result<(), OutOfScope> {
        if !self.active() {
            return Ok(());
        }
        let refs = Scope::refs(action, params);
        let narrowed = refs.iter().any(|r| matches!(r, Ref::Group(_) | Ref::User(_)));
        if safety::spans(action) && !narrowed {
            return Err(OutOfScope::Spanning(action.name.to_owned()));
        }
        for r in refs {
            match r {
                Ref::Group(id) if !self.group_ok(id) => return Err(OutOfScope::Group(id)),
                Ref::User(id) if !self.user_ok(id) => return Err(OutOfScope::User(id)),
                Ref::Message(id) if !self.message_ok(id) => return Err(OutOfScope::Message(id)),
                Ref::Unreadable(what) => return Err(OutOfScope::Unreadable(what)),
                Ref::Forward => return Err(OutOfScope::Forward),
                _ => {}
            }
        }
        Ok(())
    }

    /// After an admitted call succeeded: the message ids its result names
    /// are in scope (a send's `message_id`, a history read's messages).
    pub fn learn_from_result(&self, action: &Action, reply: &ToolReply) {
        if !self.active() || reply.is_error {
            return;
        }
        let learns = safety::sends(action) || safety::message_cursor(action);
        if !learns {
            return;
        }
        let Some(v) = reply.result.as_ref().and_then(|t| t.parse().ok()) else { return };
        let data = &v["data"];
        let mut ids: Vec<i64> = data.get("message_id").and_then(Value::as_i64).into_iter().collect();
        if let Some(msgs) = data.get("messages").and_then(Value::as_array) {
            ids.extend(msgs.iter().filter_map(|m| m.get("message_id").and_then(Value::as_i64)));
        }
        self.learn(ids);
    }

    /// Whether an event may enter a buffer: a group event by its group, an
    /// event without a group by its user; one naming neither passes.
    pub fn event_in_scope(&self, ev: &Map<String, Value>) -> bool {
        if !self.active() {
            return true;
        }
        let id = |k: &str| ev.get(k).map(target_id);
        match (id("group_id"), id("user_id")) {
            (Some(Err(())), _) => false,
            (Some(Ok(Some(g))), _) => self.group_ok(g),
            (_, Some(Err(()))) => false,
            (_, Some(Ok(Some(u)))) => self.user_ok(u),
            _ => true,
        }
    }

    /// An event a buffer kept: its message id is in scope.
    pub fn learn_event(&self, ev: &Map<String, Value>) {
        if self.active() && matches!(ev.get("post_type").and_then(Value::as_str), Some("message" | "message_sent")) {
            self.learn(ev.get("message_id").and_then(Value::as_i64));
        }
    }

    /// A subscription's filters must name only ids in scope.
    pub fn check_subscription(&self, groups: Option<&[i64]>, users: Option<&[i64]>) -> Result<(), OutOfScope> {
        for g in groups.into_iter().flatten() {
            let g = u64::try_from(*g).unwrap_or(0);
            if !self.group_ok(g) {
                return Err(OutOfScope::Group(g));
            }
        }
        for u in users.into_iter().flatten() {
            let u = u64::try_from(*u).unwrap_or(0);
            if !self.user_ok(u) {
                return Err(OutOfScope::User(u));
            }
        }
        Ok(())
    }

    /// What `get_runtime_info` shows: whether each list is set and its
    /// size (the ids only with `SNOWLUMA_MCP_SHOW_SCOPE_IDS=1`).
    pub fn to_json(&self) -> Value {
        let list = |l: &Option<BTreeSet<u64>>, var: &str| match l {
            None => json!({"restricted": false, "setting": var}),
            Some(ids) => {
                let mut m = json!({"restricted": true, "count": ids.len(), "setting": var});
                if self.show_ids {
                    m["ids"] = json!(ids);
                }
                m
            }
        };
        json!({
            "active": self.active(),
            "groups": list(&self.groups, "SNOWLUMA_MCP_ALLOW_GROUPS"),
            "users": list(&self.users, "SNOWLUMA_MCP_ALLOW_USERS"),
            "ids_shown": self.show_ids,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use snowluma_catalog::Catalog;

    fn action(n: &str) -> &'static Action {
        crate::policy::resolve(Catalog::bundled(), n).unwrap()
    }

    fn scope(groups: Option<&[u64]>, users: Option<&[u64]>) -> Scope {
        Scope::from_config(&ScopeConfig {
            groups: groups.map(|g| g.iter().copied().collect()),
            users: users.map(|u| u.iter().copied().collect()),
            show_ids: false,
        })
    }

    fn check(s: &Scope, a: &str, p: Value) -> Result<(), OutOfScope> {
        s.check(action(a), &Params::Value(p))
    }

    #[test]
    fn no_list_restricts_nothing() {
        let s = Scope::default();
        assert!(!s.active());
        assert_eq!(check(&s, "send_group_msg", json!({"group_id": 1, "message": "[CQ:reply,id=5]"})), Ok(()));
        assert_eq!(check(&s, "get_recent_contact", json!({})), Ok(()));
        assert_eq!(check(&s, "get_msg", json!({"message_id": "x"})), Ok(()));
    }

    #[test]
    fn marked_targets_are_checked_for_reads_and_writes() {
        let s = scope(Some(&[20001]), Some(&[30001]));
        assert_eq!(check(&s, "send_group_msg", json!({"group_id": 20001, "message": "hi"})), Ok(()));
        assert_eq!(check(&s, "send_group_msg", json!({"group_id": "20001", "message": "hi"})), Ok(()));
        assert_eq!(check(&s, "send_group_msg", json!({"group_id": 20002})), Err(OutOfScope::Group(20002)));
        assert_eq!(check(&s, "get_group_info", json!({"group_id": 20002})), Err(OutOfScope::Group(20002)));
        assert_eq!(check(&s, "get_stranger_info", json!({"user_id": 30002})), Err(OutOfScope::User(30002)));
        assert_eq!(
            check(&s, "set_group_ban", json!({"group_id": 20001, "user_id": 30002})),
            Err(OutOfScope::User(30002)),
            "a member is a user"
        );
        assert_eq!(check(&s, "send_like", json!({"user_id": 30001})), Ok(()));
        // send_msg: every id present, whichever of the pair SnowLuma uses.
        let pm = json!({"message_type": "private", "user_id": 30001, "group_id": 20002, "message": "x"});
        assert_eq!(check(&s, "send_msg", pm), Err(OutOfScope::Group(20002)));
        // Unmarked targets from the catalog's table.
        let kick = json!({"group_id": 20001, "user_id": [30001, 30002]});
        assert_eq!(check(&s, "set_group_kick_members", kick), Err(OutOfScope::User(30002)));
        assert_eq!(check(&s, "send_forward_msg", json!({"group_id": 20002})), Err(OutOfScope::Group(20002)));
        assert_eq!(
            check(&s, "send_private_msg", json!({"user_id": 30001, "group_id": 20002})),
            Err(OutOfScope::Group(20002))
        );
        // Values that cannot be read as one id are refused, not guessed.
        for odd in [json!(1.5), json!("020001"), json!(" 20001"), json!(true), json!(-1)] {
            assert!(matches!(check(&s, "get_group_info", json!({"group_id": odd})), Err(OutOfScope::Unreadable(_))));
        }
        // 0 and null name nothing.
        assert_eq!(check(&s, "send_private_msg", json!({"user_id": 30001, "group_id": 0})), Ok(()));
    }

    #[test]
    fn segments_are_checked() {
        let s = scope(Some(&[20001]), Some(&[30001]));
        let send = |m: Value| check(&s, "send_group_msg", json!({"group_id": 20001, "message": m}));
        assert_eq!(send(json!([{"type": "at", "data": {"qq": "30001"}}])), Ok(()));
        assert_eq!(send(json!([{"type": "at", "data": {"qq": "all"}}])), Ok(()));
        assert_eq!(send(json!([{"type": "at", "data": {"qq": 30002}}])), Err(OutOfScope::User(30002)));
        assert_eq!(send(json!({"type": "at", "data": {"qq": "30002"}})), Err(OutOfScope::User(30002)));
        assert_eq!(send(json!("hi [CQ:at,qq=30002] there")), Err(OutOfScope::User(30002)));
        assert_eq!(send(json!(r#"[{"type":"at","data":{"qq":"30002"}}]"#)), Err(OutOfScope::User(30002)));
        assert_eq!(send(json!("[CQ:reply,id=-5]x")), Err(OutOfScope::Message(-5)));
        assert_eq!(
            send(json!([{"type": "contact", "data": {"type": "group", "id": "20002"}}])),
            Err(OutOfScope::Group(20002))
        );
        assert_eq!(send(json!([{"type": "forward", "data": {"id": "abc"}}])), Err(OutOfScope::Forward));
        let nested = json!([{"type": "node", "data": {"user_id": 1, "content": [{"type": "at", "data": {"qq": 9}}]}}]);
        assert_eq!(
            check(&s, "send_group_forward_msg", json!({"group_id": 20001, "messages": nested})),
            Err(OutOfScope::User(9))
        );
        // A message learned in scope may be replied to and read.
        s.learn([-5]);
        assert_eq!(
            send(json!([{"type": "reply", "data": {"id": "-5"}}, {"type": "text", "data": {"text": "x"}}])),
            Ok(())
        );
        assert_eq!(check(&s, "get_msg", json!({"message_id": -5})), Ok(()));
        assert_eq!(check(&s, "delete_msg", json!({"message_id": -6})), Err(OutOfScope::Message(-6)));
        // A history cursor is a position in the named (in-scope) chat.
        assert_eq!(check(&s, "get_group_msg_history", json!({"group_id": 20001, "message_id": 77})), Ok(()));
    }

    #[test]
    fn spanning_actions_need_a_narrowing_target() {
        let s = scope(Some(&[20001]), None);
        assert_eq!(check(&s, "get_recent_contact", json!({})), Err(OutOfScope::Spanning("get_recent_contact".into())));
        assert_eq!(check(&s, "get_group_system_msg", json!({"group_id": 20001})), Ok(()));
        assert_eq!(check(&s, "get_group_system_msg", json!({"group_id": 20002})), Err(OutOfScope::Group(20002)));
        assert_eq!(check(&s, "get_group_list", json!({})), Ok(()), "a directory list is allowed");
        assert!(matches!(check(&s, ".send_packet", json!({"cmd": "x"})), Err(OutOfScope::Spanning(_))));
        let r = OutOfScope::Group(20002).reply("get_group_info");
        assert_eq!(r.diagnostics.kind, Some(FailureKind::OutOfScope));
        assert!(r.diagnostics.message.unwrap().contains("20002"));
    }

    #[test]
    fn results_and_events_teach_message_ids_and_events_are_filtered() {
        let s = scope(Some(&[20001]), Some(&[30001]));
        let reply = ToolReply::ok(&json!({"status": "ok", "retcode": 0, "data": {"message_id": -9}}));
        s.learn_from_result(action("send_group_msg"), &reply);
        let hist = ToolReply::ok(&json!({"data": {"messages": [{"message_id": 11}, {"message_id": 12}]}}));
        s.learn_from_result(action("get_group_msg_history"), &hist);
        assert!(s.message_ok(-9) && s.message_ok(11) && s.message_ok(12));
        let ev = |v: Value| v.as_object().unwrap().clone();
        assert!(s.event_in_scope(&ev(json!({"post_type": "message", "group_id": 20001, "user_id": 99}))));
        assert!(!s.event_in_scope(&ev(json!({"post_type": "message", "group_id": 20002, "user_id": 30001}))));
        assert!(s.event_in_scope(&ev(json!({"post_type": "message", "user_id": 30001}))));
        assert!(!s.event_in_scope(&ev(json!({"post_type": "request", "user_id": 30002}))));
        assert!(s.event_in_scope(&ev(json!({"post_type": "notice", "notice_type": "client_status"}))));
        s.learn_event(&ev(json!({"post_type": "message", "group_id": 20001, "message_id": 42})));
        assert!(s.message_ok(42));
        assert_eq!(s.check_subscription(Some(&[20001]), Some(&[30001])), Ok(()));
        assert_eq!(s.check_subscription(Some(&[20001, 20002]), None), Err(OutOfScope::Group(20002)));
        assert_eq!(s.check_subscription(None, Some(&[30002])), Err(OutOfScope::User(30002)));
        let shown = s.to_json();
        assert_eq!(shown["groups"], json!({"restricted": true, "count": 1, "setting": "SNOWLUMA_MCP_ALLOW_GROUPS"}));
        s.learn(0..(MAX_KNOWN_MESSAGES as i64 + 5));
        assert!(!s.message_ok(-9), "the oldest are forgotten");
    }
}
