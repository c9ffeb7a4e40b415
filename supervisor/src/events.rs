//! Live event resources (`snowluma://onebot/events/<id>`): the supervisor
//! owns them, their buffers and their subscriptions; the network executor
//! owns the one WebSocket they share (`workers/src/network/events.rs`).
//!
//! * The first `subscribe_events` opens the connection (a long
//!   [`Request::Events`] to the executor); every further resource shares it;
//!   at most [`MAX_RESOURCES`] exist at once. Releasing the last one cancels
//!   that request, which closes the socket.
//! * Each resource keeps the events received after it was created that pass
//!   its filter: at most [`MAX_EVENTS`] and [`MAX_BYTES`], oldest evicted
//!   first; eviction shows in `oldest_cursor`, `gap` and `dropped_events`.
//!   Reads do not consume. Cursors name their resource.
//! * The connection is never reopened: when it ends (server close, account
//!   mismatch, malformed event, executor stopped) every resource shows why
//!   in its `status`, and a new connection needs the old resources released.
//! * Updates go to modern `subscriptions/listen` streams and legacy
//!   `resources/subscribe` peers as `notifications/resources/updated`
//!   (coalesced while one is pending); one that cannot be delivered sets
//!   `notification_failed`.
//!
//! Nothing here ever sends a OneBot action: the only request is
//! [`Request::Events`], which sends nothing on the socket but control frames.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::service::{Peer, SubscriptionSink};
use serde_json::{Map, Value, json};
use snowluma_proto::{EventMsg, FailureKind, Reply, Request, ToolReply};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::workers::{CallError, WorkerSlot};

pub const URI_PREFIX: &str = "snowluma://onebot/events/";
/// Most event resources per runtime.
pub const MAX_RESOURCES: usize = 16;
/// Most events one resource keeps.
pub const MAX_EVENTS: usize = 256;
/// Most bytes of event data one resource keeps.
pub const MAX_BYTES: usize = 1024 * 1024;
/// Most ids in one `group_ids` or `user_ids` filter.
pub const MAX_IDS: usize = 100;
const TYPES: [&str; 3] = ["message", "notice", "request"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventsError {
    #[error("{0}")]
    InvalidArguments(String),
    #[error("同时最多存在 {MAX_RESOURCES} 个事件资源；请先用 unsubscribe_events 释放一个。")]
    TooMany,
    #[error("事件连接属于账号 {0}；为其他账号订阅前，请先用 unsubscribe_events 释放所有现有事件资源。")]
    OtherAccount(i64),
    #[error("事件连接已结束（{0}），不会自动重连：请先用 unsubscribe_events 释放所有现有事件资源，再重新订阅。")]
    Ended(String),
    #[error("没有这个事件资源。")]
    NotFound,
    #[error("{0}")]
    BadCursor(&'static str),
    /// A filter names a group or user outside the operator's scope.
    #[error("{0}")]
    OutOfScope(String),
}

/// Which events a resource keeps (AND of every part given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// message (with message_sent), notice, request.
    types: [bool; 3],
    group_ids: Option<Vec<i64>>,
    user_ids: Option<Vec<i64>>,
}

/// `subscribe_events` arguments, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub self_id: i64,
    pub filter: Filter,
}

fn positive(v: &Value) -> Option<i64> {
    v.as_i64().filter(|n| *n > 0)
}

fn id_list(args: &Map<String, Value>, key: &str) -> Result<Option<Vec<i64>>, EventsError> {
    let Some(v) = args.get(key) else { return Ok(None) };
    let bad = |why: &str| EventsError::InvalidArguments(format!("{key} {why}"));
    let arr = v.as_array().ok_or_else(|| bad("必须是正整数数组。"))?;
    if arr.is_empty() {
        return Err(bad("不能为空（省略它即接受所有 id）。"));
    }
    if arr.len() > MAX_IDS {
        return Err(bad(&format!("最多 {MAX_IDS} 个 id。")));
    }
    let mut ids = Vec::with_capacity(arr.len());
    for x in arr {
        let n = positive(x).ok_or_else(|| bad("只能包含正整数。"))?;
        if ids.contains(&n) {
            return Err(bad("不能包含重复的 id。"));
        }
        ids.push(n);
    }
    ids.sort_unstable();
    Ok(Some(ids))
}

impl Subscription {
    pub fn parse(args: &Value) -> Result<Subscription, EventsError> {
        let bad = |m: &str| EventsError::InvalidArguments(m.to_owned());
        let obj = args.as_object().ok_or_else(|| bad("参数必须是 JSON 对象。"))?;
        if let Some(k) = obj.keys().find(|k| !["self_id", "types", "group_ids", "user_ids"].contains(&k.as_str())) {
            return Err(EventsError::InvalidArguments(format!("未知参数: {}", snowluma_catalog::json_echo(k))));
        }
        let self_id = obj
            .get("self_id")
            .ok_or_else(|| bad("缺少 self_id：已登录的机器人账号（见 get_login_info）。"))
            .and_then(|v| positive(v).ok_or_else(|| bad("self_id 必须是正整数。")))?;
        let types = match obj.get("types") {
            None => [true; 3],
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| bad("types 必须是数组。"))?;
                if arr.is_empty() {
                    return Err(bad("types 不能为空（省略它即三类都要）。"));
                }
                let mut t = [false; 3];
                for x in arr {
                    let i = x
                        .as_str()
                        .and_then(|s| TYPES.iter().position(|k| *k == s))
                        .ok_or_else(|| bad("types 只能包含 \"message\"、\"notice\" 与 \"request\"。"))?;
                    if t[i] {
                        return Err(bad("types 不能包含重复的值。"));
                    }
                    t[i] = true;
                }
                t
            }
        };
        let filter = Filter { types, group_ids: id_list(obj, "group_ids")?, user_ids: id_list(obj, "user_ids")? };
        Ok(Subscription { self_id, filter })
    }
}

/// What the filters read of an event, looked up once per event (each
/// lookup hashes its key; 16 resources read 3 keys each).
pub struct Keys {
    /// Index into [`TYPES`]; `None` for any other `post_type`.
    kind: Option<usize>,
    group_id: Option<i64>,
    user_id: Option<i64>,
}

impl Keys {
    pub fn of(ev: &Map<String, Value>) -> Keys {
        Keys {
            kind: match ev.get("post_type").and_then(Value::as_str) {
                Some("message" | "message_sent") => Some(0),
                Some("notice") => Some(1),
                Some("request") => Some(2),
                _ => None,
            },
            group_id: ev.get("group_id").and_then(Value::as_i64),
            user_id: ev.get("user_id").and_then(Value::as_i64),
        }
    }
}

impl Filter {
    pub fn matches(&self, keys: &Keys) -> bool {
        let Some(kind) = keys.kind else { return false };
        if !self.types[kind] {
            return false;
        }
        let has = |list: &Option<Vec<i64>>, id: Option<i64>| match list {
            None => true,
            Some(ids) => id.is_some_and(|id| ids.binary_search(&id).is_ok()),
        };
        has(&self.group_ids, keys.group_id) && has(&self.user_ids, keys.user_id)
    }

    fn to_json(&self) -> Value {
        let types: Vec<&str> = TYPES.iter().zip(self.types).filter(|(_, on)| *on).map(|(t, _)| *t).collect();
        json!({"types": types, "group_ids": self.group_ids, "user_ids": self.user_ids})
    }
}

/// The shared connection's state, as every resource shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Connecting,
    Connected,
    Stopped(String),
}

struct Conn {
    self_id: i64,
    /// Cancelling closes the socket (the executor's request is withdrawn).
    cancel: CancellationToken,
    status: watch::Sender<Status>,
    generation: u64,
}

struct Entry {
    seq: u64,
    /// The event's JSON text, checked to be one object.
    text: Arc<str>,
}

struct Resource {
    uri: String,
    self_id: i64,
    filter: Filter,
    buf: VecDeque<Entry>,
    bytes: usize,
    /// The last sequence number given (0: none yet).
    last_seq: u64,
    dropped: u64,
    notification_failed: bool,
    /// Legacy `resources/subscribe` peers.
    legacy: Vec<Peer<RoleServer>>,
    /// An update notification is queued and not yet sent.
    notify_pending: bool,
}

#[derive(Default)]
struct State {
    conn: Option<Conn>,
    resources: BTreeMap<String, Resource>,
    listeners: HashMap<u64, SubscriptionSink>,
    next_listener: u64,
    generation: u64,
    /// The operator's target scope: events outside it enter no buffer.
    scope: Arc<crate::scope::Scope>,
}

pub struct EventHub {
    network: Arc<WorkerSlot>,
    state: Arc<Mutex<State>>,
    /// How long `subscribe_events` waits for a new connection's handshake.
    connect_wait: Duration,
}

/// Where an update notification goes.
enum Target {
    Legacy(Peer<RoleServer>),
    Modern(u64, SubscriptionSink),
}

impl EventHub {
    pub fn new(network: Arc<WorkerSlot>, connect_wait: Duration, scope: Arc<crate::scope::Scope>) -> Arc<EventHub> {
        let state = Arc::new(Mutex::new(State { scope, ..State::default() }));
        Arc::new(EventHub { network, state, connect_wait })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated
        // in a way that matters more than losing events; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `subscribe_events`: a new resource (opening the connection if there
    /// is none); answers the result object.
    pub async fn subscribe(&self, args: &Value) -> Result<Value, EventsError> {
        let sub = Subscription::parse(args)?;
        let scope = self.lock().scope.clone();
        scope
            .check_subscription(sub.filter.group_ids.as_deref(), sub.filter.user_ids.as_deref())
            .map_err(|e| EventsError::OutOfScope(format!("subscribe_events 被拒绝：{e}；未创建事件资源。")))?;
        let (uri, mut status_rx) = {
            let mut st = self.lock();
            if st.resources.len() >= MAX_RESOURCES {
                return Err(EventsError::TooMany);
            }
            if let Some(c) = &st.conn {
                if c.self_id != sub.self_id {
                    return Err(EventsError::OtherAccount(c.self_id));
                }
                if let Status::Stopped(reason) = &*c.status.borrow() {
                    return Err(EventsError::Ended(reason.clone()));
                }
            } else {
                st.generation += 1;
                let generation = st.generation;
                let (status, _) = watch::channel(Status::Connecting);
                let cancel = CancellationToken::new();
                st.conn = Some(Conn { self_id: sub.self_id, cancel: cancel.clone(), status, generation });
                tokio::spawn(run_connection(self.network.clone(), self.state.clone(), sub.self_id, cancel, generation));
            }
            let id = crate::trace::hex(&crate::trace::random_bytes::<12>());
            let uri = format!("{URI_PREFIX}{id}");
            st.resources.insert(
                id,
                Resource {
                    uri: uri.clone(),
                    self_id: sub.self_id,
                    filter: sub.filter.clone(),
                    buf: VecDeque::new(),
                    bytes: 0,
                    last_seq: 0,
                    dropped: 0,
                    notification_failed: false,
                    legacy: Vec::new(),
                    notify_pending: false,
                },
            );
            let rx = st.conn.as_ref().map(|c| c.status.subscribe());
            (uri, rx)
        };
        // Wait (bounded) for a new connection's outcome, so the result says
        // whether it opened.
        if let Some(rx) = status_rx.as_mut() {
            let _ = tokio::time::timeout(self.connect_wait, rx.wait_for(|s| *s != Status::Connecting)).await;
        }
        let status = status_rx.map(|rx| rx.borrow().clone()).unwrap_or(Status::Stopped("released".into()));
        Ok(json!({
            "uri": uri,
            "self_id": sub.self_id,
            "filter": sub.filter.to_json(),
            "status": status_json(&status),
        }))
    }

    /// Release one resource (`unsubscribe_events`, legacy
    /// `resources/unsubscribe`); the last one closes the connection.
    pub fn release(&self, uri: &str) -> Result<(), EventsError> {
        let id = parse_uri(uri)?.0;
        let mut st = self.lock();
        st.resources.remove(id).ok_or(EventsError::NotFound)?;
        if st.resources.is_empty()
            && let Some(c) = st.conn.take()
        {
            c.cancel.cancel();
        }
        Ok(())
    }

    /// Release everything (the MCP connection ended).
    pub fn release_all(&self) {
        let mut st = self.lock();
        st.resources.clear();
        st.listeners.clear();
        if let Some(c) = st.conn.take() {
            c.cancel.cancel();
        }
    }

    /// The live resources: (uri, self_id).
    pub fn list(&self) -> Vec<(String, i64)> {
        self.lock().resources.values().map(|r| (r.uri.clone(), r.self_id)).collect()
    }

    /// Whether `uri` is an event resource URI (live or not).
    pub fn is_event_uri(uri: &str) -> bool {
        uri.starts_with(URI_PREFIX)
    }

    /// `resources/read` of `uri` (with an optional `?after=<cursor>`): the
    /// result object's JSON text.
    pub fn read(&self, uri: &str) -> Result<String, EventsError> {
        let (id, after) = parse_uri(uri)?;
        let st = self.lock();
        let r = st.resources.get(id).ok_or(EventsError::NotFound)?;
        let after = match after {
            None => None,
            Some(c) => {
                let (cid, seq) =
                    c.rsplit_once('-').ok_or(EventsError::BadCursor("the cursor is not one of this server's"))?;
                if cid != id {
                    return Err(EventsError::BadCursor("the cursor belongs to another event resource"));
                }
                let seq: u64 =
                    seq.parse().map_err(|_| EventsError::BadCursor("the cursor is not one of this server's"))?;
                if seq > r.last_seq {
                    return Err(EventsError::BadCursor("the cursor is newer than this resource's last event"));
                }
                Some(seq)
            }
        };
        let status = st.conn.as_ref().map(|c| c.status.borrow().clone()).unwrap_or(Status::Stopped("released".into()));
        let oldest = r.buf.front().map(|e| e.seq);
        let from = after.unwrap_or(0);
        let gap = match after {
            None => r.dropped > 0,
            // Events after the cursor were evicted before this read.
            Some(seq) => match oldest {
                Some(o) => seq + 1 < o,
                None => seq < r.last_seq,
            },
        };
        let cursor = |seq: u64| format!("{id}-{seq}");
        let mut events = String::from("[");
        let mut next = from;
        for e in r.buf.iter().filter(|e| e.seq > from) {
            if events.len() > 1 {
                events.push(',');
            }
            events.push_str("{\"cursor\":");
            events.push_str(&Value::from(cursor(e.seq)).to_string());
            events.push_str(",\"event\":");
            events.push_str(&e.text);
            events.push('}');
            next = e.seq;
        }
        events.push(']');
        if after.is_none() {
            next = r.last_seq;
        }
        let head = json!({
            "uri": r.uri,
            "status": status_json(&status),
            "next_cursor": cursor(next),
            "oldest_cursor": oldest.map(cursor),
            "dropped_events": r.dropped,
            "gap": gap,
            "notification_failed": r.notification_failed,
        })
        .to_string();
        // `head` is an object: splice the events array in as its first member.
        Ok(format!("{{\"events\":{events},{}", &head[1..]))
    }

    /// Legacy `resources/subscribe`: `peer` gets updates for `uri`.
    pub fn legacy_subscribe(&self, uri: &str, peer: Peer<RoleServer>) -> Result<(), EventsError> {
        let (id, after) = parse_uri(uri)?;
        if after.is_some() {
            return Err(EventsError::BadCursor("subscribe to the canonical URI, without ?after"));
        }
        let mut st = self.lock();
        let r = st.resources.get_mut(id).ok_or(EventsError::NotFound)?;
        r.legacy.push(peer);
        Ok(())
    }

    /// A modern `subscriptions/listen` stream; returns its key for [`Self::unlisten`].
    pub fn listen(&self, sink: SubscriptionSink) -> u64 {
        let mut st = self.lock();
        st.next_listener += 1;
        let key = st.next_listener;
        st.listeners.insert(key, sink);
        key
    }

    pub fn unlisten(&self, key: u64) {
        self.lock().listeners.remove(&key);
    }
}

fn status_json(s: &Status) -> Value {
    match s {
        Status::Connecting => json!({"state": "connecting", "reason": null}),
        Status::Connected => json!({"state": "connected", "reason": null}),
        Status::Stopped(r) => json!({"state": "stopped", "reason": r}),
    }
}

/// `snowluma://onebot/events/<id>[?after=<cursor>]` → (id, cursor).
fn parse_uri(uri: &str) -> Result<(&str, Option<&str>), EventsError> {
    let rest = uri.strip_prefix(URI_PREFIX).ok_or(EventsError::NotFound)?;
    let (id, query) = match rest.split_once('?') {
        Some((id, q)) => (id, Some(q)),
        None => (rest, None),
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(EventsError::NotFound);
    }
    let after = match query {
        None => None,
        Some(q) => Some(q.strip_prefix("after=").ok_or(EventsError::BadCursor("the only query is ?after=<cursor>"))?),
    };
    Ok((id, after))
}

/// Drive one connection: events into the resources, its end into the status.
async fn run_connection(
    network: Arc<WorkerSlot>,
    state: Arc<Mutex<State>>,
    self_id: i64,
    cancel: CancellationToken,
    generation: u64,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let call = network.call_with_events(Request::Events { self_id }, &cancel, tx);
    let mut call = std::pin::pin!(call);
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    let result = loop {
        tokio::select! {
            r = &mut call => break r,
            Some(m) = rx.recv() => handle(&state, m, self_id, generation, &cancel),
        }
    };
    // Events sent before the reply are in the channel already.
    while let Ok(m) = rx.try_recv() {
        handle(&state, m, self_id, generation, &cancel);
    }
    let reason = match result {
        Ok(Reply::EventsClosed { reason }) => reason,
        Ok(_) => "the network executor answered unexpectedly".to_owned(),
        Err(CallError::Cancelled) => "released".to_owned(),
        Err(CallError::WorkerDied(_)) => {
            "the network executor stopped; the event connection is closed and is not reopened".to_owned()
        }
        Err(e) => e.to_string(),
    };
    let st = lock();
    if let Some(c) = st.conn.as_ref().filter(|c| c.generation == generation)
        && !matches!(*c.status.borrow(), Status::Stopped(_))
    {
        tracing::info!(generation, "event connection ended");
        c.status.send_replace(Status::Stopped(reason));
    }
}

fn handle(state: &Arc<Mutex<State>>, m: EventMsg, self_id: i64, generation: u64, cancel: &CancellationToken) {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let Some(conn) = st.conn.as_ref().filter(|c| c.generation == generation) else { return };
    let text = match m {
        EventMsg::Connected => {
            conn.status.send_replace(Status::Connected);
            return;
        }
        EventMsg::Event(t) => t.0,
    };
    // Read again here: the executor's word is not trusted.
    let Some(ev) = event_members(&text) else {
        conn.status.send_replace(Status::Stopped("malformed event: not a JSON object".into()));
        cancel.cancel();
        return;
    };
    if ev.get("self_id").and_then(Value::as_i64) != Some(self_id) {
        conn.status
            .send_replace(Status::Stopped("account mismatch: an event's self_id is not the subscribed account".into()));
        cancel.cancel();
        return;
    }
    // Outside the operator's scope: no buffer keeps it.
    if !st.scope.event_in_scope(&ev) {
        return;
    }
    let text: Arc<str> = Arc::from(text);
    let mut targets: Vec<(String, Vec<Target>)> = Vec::new();
    let State { resources, listeners, scope, .. } = &mut *st;
    let mut kept = false;
    let keys = Keys::of(&ev);
    for (id, r) in resources.iter_mut() {
        if !r.filter.matches(&keys) {
            continue;
        }
        kept = true;
        r.last_seq += 1;
        r.bytes += text.len();
        r.buf.push_back(Entry { seq: r.last_seq, text: text.clone() });
        while r.buf.len() > MAX_EVENTS || r.bytes > MAX_BYTES {
            let Some(old) = r.buf.pop_front() else { break };
            r.bytes -= old.text.len();
            r.dropped += 1;
        }
        if r.notify_pending {
            continue;
        }
        let mut to: Vec<Target> = r.legacy.iter().cloned().map(Target::Legacy).collect();
        for (key, sink) in listeners.iter() {
            if sink.accepted().resource_subscriptions.as_ref().is_some_and(|u| u.contains(&r.uri)) {
                to.push(Target::Modern(*key, sink.clone()));
            }
        }
        if !to.is_empty() {
            r.notify_pending = true;
            targets.push((id.clone(), to));
        }
    }
    if kept {
        // A message a buffer kept is in scope: it may be quoted or read.
        scope.learn_event(&ev);
    }
    drop(st);
    if !targets.is_empty() {
        tokio::spawn(notify(state.clone(), targets));
    }
}

/// The members of an event that the checks, the scope and the filters
/// read (`handle`, `Keys::of`, `Scope::event_in_scope` and `learn_event`).
const EVENT_MEMBERS: [&str; 5] = ["self_id", "post_type", "group_id", "user_id", "message_id"];

/// An event's [`EVENT_MEMBERS`], as the object they are in holds them once
/// it is parsed (`json::members`: the same judgement of the text, without
/// building the rest of it); `None` when the text is not a JSON object.
fn event_members(text: &str) -> Option<Map<String, Value>> {
    let picked = snowluma_proto::json::members(text, EVENT_MEMBERS).ok()??;
    Some(EVENT_MEMBERS.iter().zip(picked).filter_map(|(name, v)| Some(((*name).to_owned(), v?))).collect())
}

/// Send the update notifications of one event; record failures.
async fn notify(state: Arc<Mutex<State>>, targets: Vec<(String, Vec<Target>)>) {
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    {
        let mut st = lock();
        for (id, _) in &targets {
            if let Some(r) = st.resources.get_mut(id) {
                r.notify_pending = false;
            }
        }
    }
    for (id, to) in targets {
        let uri = format!("{URI_PREFIX}{id}");
        let mut failed = false;
        for t in to {
            match t {
                Target::Legacy(peer) => {
                    let p = rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone());
                    failed |= peer.notify_resource_updated(p).await.is_err();
                }
                Target::Modern(key, sink) => match sink.notify_resource_updated(uri.clone()).await {
                    Ok(()) => {}
                    // The stream ended (the client closed it): not a failure.
                    Err(rmcp::service::SubscriptionSendError::SubscriptionClosed) => {
                        lock().listeners.remove(&key);
                    }
                    Err(_) => failed = true,
                },
            }
        }
        if failed {
            tracing::warn!("an event update notification could not be delivered");
            if let Some(r) = lock().resources.get_mut(&id) {
                r.notification_failed = true;
            }
        }
    }
}

/// The two event tools.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// `subscribe_events`.
    Subscribe,
    /// `unsubscribe_events`.
    Release,
}

/// `subscribe_events` / `unsubscribe_events` on `hub`.
pub(crate) async fn tool_call(hub: &EventHub, op: Op, args: Value) -> ToolReply {
    let result = match op {
        Op::Subscribe => hub.subscribe(&args).await,
        Op::Release => {
            match args.as_object().filter(|o| o.len() == 1).and_then(|o| o.get("uri")).and_then(Value::as_str) {
                Some(uri) => hub.release(uri).map(|()| json!({"released": uri})),
                None => Err(EventsError::InvalidArguments("expected exactly {\"uri\": <string>}".into())),
            }
        }
    };
    match result {
        Ok(v) => ToolReply::ok(&v),
        Err(e @ (EventsError::InvalidArguments(_) | EventsError::NotFound | EventsError::BadCursor(_))) => {
            ToolReply::fail(FailureKind::InvalidArguments, e.to_string())
        }
        Err(e @ EventsError::OutOfScope(_)) => ToolReply::error(
            snowluma_proto::Diagnostics::failed(FailureKind::OutOfScope, e.to_string()).with_next_step(
                "Name only groups and users in scope (see get_runtime_info's scope), or ask the operator to \
                 change SNOWLUMA_MCP_ALLOW_GROUPS / SNOWLUMA_MCP_ALLOW_USERS.",
            ),
        ),
        Err(e) => ToolReply::fail(FailureKind::Execution, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event's members as `handle` reads them are those of the whole
    /// event parsed, and the text is refused where parsing it refuses it
    /// (how the text is read is `json::members`' own test's).
    #[test]
    fn an_event_s_members_are_the_parsed_event_s() {
        let texts = [
            r#"{"time":1,"self_id":10001,"post_type":"message","message_type":"group","sub_type":"normal","message_id":-5,"group_id":20001,"user_id":30001,"message":[{"type":"text","data":{"text":"hi"}}],"raw_message":"hi","font":0,"sender":{"user_id":30001,"nickname":"n"}}"#,
            r#"{"self_id":1,"post_type":"notice","group_id":"20001","user_id":1.5}"#,
            r#"{"self_id":1,"self_id":2,"group_id":1,"group_id":null}"#,
            r#"{"self_id":1,"post_type":"message","message_id":9223372036854775808}"#,
            r#"{"self_id":1,"x":{"group_id":5}}"#,
            r#"{"self_id":1,"n":1e400}"#,
            r#"[{"self_id":1}]"#,
            r#"{"self_id":1}x"#,
            "",
        ];
        for text in texts {
            let full: Option<Map<String, Value>> = serde_json::from_str(text).ok();
            let expected = full.map(|m| {
                m.into_iter().filter(|(k, _)| EVENT_MEMBERS.contains(&k.as_str())).collect::<Map<String, Value>>()
            });
            assert_eq!(event_members(text), expected, "{text}");
        }
    }

    /// What the filters read of the event `v`.
    fn ev(v: Value) -> Keys {
        Keys::of(v.as_object().unwrap())
    }

    #[test]
    fn arguments_are_checked() {
        let s = Subscription::parse(&json!({"self_id": 1})).unwrap();
        assert_eq!(s.filter.types, [true; 3]);
        for bad in [
            json!({}),
            json!({"self_id": 0}),
            json!({"self_id": 1, "types": []}),
            json!({"self_id": 1, "types": ["meta_event"]}),
            json!({"self_id": 1, "types": ["message", "message"]}),
            json!({"self_id": 1, "group_ids": [1, 1]}),
            json!({"self_id": 1, "group_ids": [-1]}),
            json!({"self_id": 1, "user_ids": (1..=101).collect::<Vec<_>>()}),
            json!({"self_id": 1, "extra": 1}),
        ] {
            assert!(Subscription::parse(&bad).is_err(), "{bad}");
        }
        assert!(Subscription::parse(&json!({"self_id": 1, "user_ids": (1..=100).collect::<Vec<_>>()})).is_ok());
    }

    #[test]
    fn filters_combine_with_and() {
        let f = Subscription::parse(&json!({"self_id": 1, "types": ["message"], "group_ids": [5], "user_ids": [7]}))
            .unwrap()
            .filter;
        assert!(f.matches(&ev(json!({"post_type": "message", "group_id": 5, "user_id": 7}))));
        assert!(f.matches(&ev(json!({"post_type": "message_sent", "group_id": 5, "user_id": 7}))));
        assert!(!f.matches(&ev(json!({"post_type": "message", "user_id": 7}))));
        assert!(!f.matches(&ev(json!({"post_type": "message", "group_id": 5, "user_id": 8}))));
        assert!(!f.matches(&ev(json!({"post_type": "notice", "group_id": 5, "user_id": 7}))));
        let all = Subscription::parse(&json!({"self_id": 1})).unwrap().filter;
        assert!(all.matches(&ev(json!({"post_type": "request"}))));
        assert!(!all.matches(&ev(json!({"post_type": "meta_event"}))));
    }

    #[test]
    fn uris_and_cursors_parse() {
        assert_eq!(parse_uri("snowluma://onebot/events/ab12").unwrap(), ("ab12", None));
        assert_eq!(parse_uri("snowluma://onebot/events/ab12?after=ab12-3").unwrap(), ("ab12", Some("ab12-3")));
        assert!(parse_uri("snowluma://onebot/events/").is_err());
        assert!(parse_uri("snowluma://onebot/events/zz").is_err());
        assert!(parse_uri("snowluma://onebot/events/ab?x=1").is_err());
    }
}
