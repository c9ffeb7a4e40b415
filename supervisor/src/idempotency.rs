//! Idempotent writes: `execution.idempotency_key` on `invoke_action`.
//!
//! A key (1–128 printable ASCII characters) binds one call: the canonical
//! action and the exact params (a digest of their canonical JSON). The
//! first call with a key runs; every later call with the same key, action
//! and params within [`KEY_TTL_MS`] (24 h) gets the first call's recorded
//! reply again, marked `diagnostics.replayed: true`, without contacting
//! SnowLuma; the same key with another action or params is a tool error
//! (`idempotency_conflict`). Nothing is ever executed twice:
//!
//! * **Concurrency**: the calls of one key are serialized by a per-key lock
//!   held from the lookup until the outcome is recorded. A second call with
//!   the key in flight waits for the first (its own cancellation still
//!   applies) and then gets its recorded reply; if the first ended without
//!   executing (a refusal before the send), the second runs instead.
//! * **Unknown outcomes**: a call whose outcome is unknown (cancelled,
//!   worker lost, timed out after sending) is recorded as such and replayed
//!   as unknown. A call abandoned after its send (its request dropped) is
//!   recorded as unknown too: in memory by the claim's `Drop`, on disk by
//!   the `pending` record written before the send, which a later run reads
//!   as unknown.
//! * **Persistence**: with `SNOWLUMA_MCP_TASK_DIR` the records are the
//!   task-store worker's (`workers/src/tasks/keys.rs`: same directory, same
//!   atomic writes, the principal's own keys only); otherwise they live in
//!   this runtime's memory (at most [`MAX_MEMORY_KEYS`] keys and about
//!   [`MAX_MEMORY_BYTES`] of replies; a new key beyond that is refused,
//!   never evicted early). Neither keeps the key or the params: only
//!   digests, the canonical action and the reply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use snowluma_catalog::Action;
use snowluma_proto::keys::{KEY_RECORD_VERSION, KEY_TTL_MS, KeyRecord, KeyState};
use snowluma_proto::{Diagnostics, FailureKind, JsonText, TasksReply, TasksRequest, ToolReply};
use tokio_util::sync::CancellationToken;

use crate::tasks::{TaskError, TaskService};
use crate::trace::hex;

/// The longest key.
pub const MAX_KEY_LEN: usize = 128;
/// Most keys one runtime keeps in memory (without a task directory).
pub const MAX_MEMORY_KEYS: usize = 10_000;
/// About the most reply bytes one runtime keeps in memory.
pub const MAX_MEMORY_BYTES: usize = 64 * 1024 * 1024;
/// Moves the keys' clock forward (tests of expiry); it can only shorten a
/// key's life.
pub const CLOCK_OFFSET_VAR: &str = "SNOWLUMA_MCP_IDEMPOTENCY_CLOCK_OFFSET_MS";

/// Whether `key` is a valid idempotency key: 1–128 printable ASCII.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// One call's key: which key (a digest of the principal and the key) and
/// the call it is bound to (a digest of the canonical action and params).
#[derive(Debug, Clone)]
pub struct CallKey {
    id: String,
    digest: String,
    action: String,
}

impl CallKey {
    pub fn new(owner: Option<&str>, key: &str, action: &Action, params: &Value) -> CallKey {
        let mut h = Sha256::new();
        h.update(b"snowluma-mcp/idempotency-key/v1\0");
        h.update(owner.unwrap_or("").as_bytes());
        h.update([0]);
        h.update(key.as_bytes());
        let id = hex(&h.finalize());
        let call = json!({"action": action.name, "params": params});
        let digest = hex(&Sha256::digest(snowluma_proto::text::canonical_json(&call).as_bytes()));
        CallKey { id, digest, action: action.name.to_owned() }
    }
}

/// What a keyed call gets: the recorded reply, or the right to run.
pub enum Claim {
    Replay(ToolReply),
    Run(Running),
}

/// One runtime's keys.
pub struct Keys {
    backend: Backend,
    owner: Option<String>,
    /// The per-key locks of calls in flight (removed when the last holder
    /// lets go).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    clock_offset_ms: u64,
}

enum Backend {
    Memory(Mutex<Memory>),
    Store(Arc<TaskService>),
}

#[derive(Default)]
struct Memory {
    entries: HashMap<String, Entry>,
    bytes: usize,
}

struct Entry {
    digest: String,
    action: String,
    created_ms: u64,
    /// `None`: abandoned after its send (unknown outcome).
    reply: Option<ToolReply>,
    bytes: usize,
}

impl Memory {
    fn prune(&mut self, now_ms: u64) {
        let mut freed = 0;
        self.entries.retain(|_, e| {
            let live = e.created_ms.saturating_add(KEY_TTL_MS) > now_ms;
            if !live {
                freed += e.bytes;
            }
            live
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }

    fn insert(&mut self, id: String, entry: Entry) {
        self.bytes += entry.bytes;
        if let Some(old) = self.entries.insert(id, entry) {
            self.bytes = self.bytes.saturating_sub(old.bytes);
        }
    }
}

fn reply_bytes(r: &ToolReply) -> usize {
    r.result.as_ref().map_or(0, |t| t.0.len()) + r.diagnostics.message.as_ref().map_or(0, String::len) + 256
}

/// What was found under a key.
enum Found {
    Fresh,
    Replay(ToolReply),
}

fn now_ms(offset: u64) -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (since.as_millis() as u64).saturating_add(offset)
}

/// A recorded reply, marked as replayed.
fn replayed(mut reply: ToolReply) -> ToolReply {
    reply.diagnostics.replayed = true;
    reply
}

/// The replay of a call whose outcome was never recorded.
fn unknown_replay() -> ToolReply {
    let mut d = Diagnostics::unknown(
        FailureKind::Execution,
        "此 idempotency_key 的首次调用已发出但结果未记录（服务器在执行中停止或调用被放弃）；结果未知，未再次执行。\
         The first call with this key was sent but its outcome was never recorded; it was not executed again.",
    )
    .with_next_step(
        "Check the action's effect in QQ before doing anything else; to run it anew use a new idempotency_key.",
    );
    d.replayed = true;
    ToolReply::error(d)
}

fn conflict(action: &str) -> ToolReply {
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::IdempotencyConflict,
            format!(
                "execution.idempotency_key 已用于另一个调用（{action}，action 或 params 不同）；未执行任何操作。\
                 The key was used for a call with other arguments."
            ),
        )
        .with_next_step("Use a new idempotency_key for a different call (keys are kept 24 hours)."),
    )
}

fn unavailable(why: impl std::fmt::Display) -> ToolReply {
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::IdempotencyUnavailable,
            format!("无法保存 execution.idempotency_key：{why}；未执行任何操作。"),
        )
        .with_next_step(
            "Nothing was executed. Call again later, or without idempotency_key if a duplicate is acceptable.",
        ),
    )
}

impl Keys {
    /// Keys kept in this runtime's memory.
    pub fn in_memory(owner: Option<String>, clock_offset_ms: u64) -> Keys {
        Keys::with(Backend::Memory(Mutex::new(Memory::default())), owner, clock_offset_ms)
    }

    /// Keys kept by the task-store worker.
    pub fn persistent(store: Arc<TaskService>, owner: Option<String>, clock_offset_ms: u64) -> Keys {
        Keys::with(Backend::Store(store), owner, clock_offset_ms)
    }

    fn with(backend: Backend, owner: Option<String>, clock_offset_ms: u64) -> Keys {
        Keys { backend, owner, locks: Mutex::new(HashMap::new()), clock_offset_ms }
    }

    /// `SNOWLUMA_MCP_IDEMPOTENCY_CLOCK_OFFSET_MS` (tests only), else 0.
    pub fn clock_offset_from_env() -> u64 {
        std::env::var(CLOCK_OFFSET_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    pub fn persisted(&self) -> bool {
        matches!(self.backend, Backend::Store(_))
    }

    /// For `get_runtime_info`.
    pub fn to_json(&self) -> Value {
        json!({
            "ttl_hours": KEY_TTL_MS / 3_600_000,
            "persistent": self.persisted(),
            "max_key_length": MAX_KEY_LEN,
            "concurrent_calls": "wait for the first call's outcome",
        })
    }

    /// The call key of `key` for this runtime's principal.
    pub fn call_key(&self, key: &str, action: &Action, params: &Value) -> CallKey {
        CallKey::new(self.owner.as_deref(), key, action, params)
    }

    fn now(&self) -> u64 {
        now_ms(self.clock_offset_ms)
    }

    /// Remove expired records (once, at startup, with a task directory).
    pub async fn sweep(&self) {
        if let Backend::Store(store) = &self.backend {
            match store.keys(TasksRequest::KeySweep { now_ms: self.now() }).await {
                Ok(TasksReply::Swept { removed }) if removed > 0 => {
                    tracing::info!(removed, "expired idempotency keys removed");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "expired idempotency keys could not be removed"),
            }
        }
    }

    /// What the key holds now, without claiming it (before a confirmation:
    /// a replay needs none). A key in flight in this runtime counts as
    /// fresh here; [`Keys::claim`] then waits for it.
    pub async fn peek(&self, key: &CallKey) -> Result<Option<ToolReply>, ToolReply> {
        if self.locks.lock().is_ok_and(|l| l.contains_key(&key.id)) {
            return Ok(None);
        }
        match self.lookup(key).await? {
            Found::Fresh => Ok(None),
            Found::Replay(r) => Ok(Some(r)),
        }
    }

    async fn lookup(&self, key: &CallKey) -> Result<Found, ToolReply> {
        let now = self.now();
        match &self.backend {
            Backend::Memory(m) => {
                let mut m = m.lock().map_err(|_| unavailable("the key table is unavailable"))?;
                m.prune(now);
                let Some(e) = m.entries.get(&key.id) else { return Ok(Found::Fresh) };
                if e.digest != key.digest {
                    return Err(conflict(&e.action));
                }
                Ok(Found::Replay(e.reply.clone().map_or_else(unknown_replay, replayed)))
            }
            Backend::Store(store) => {
                match store.keys(TasksRequest::KeyGet { key_id: key.id.clone(), now_ms: now }).await {
                    Ok(TasksReply::Record(text)) => found(key, &text),
                    Err(TaskError::NotFound) => Ok(Found::Fresh),
                    Ok(_) => Err(unavailable("the task-store worker answered unexpectedly")),
                    Err(e) => Err(unavailable(e)),
                }
            }
        }
    }

    /// Claim `key` for a call: its recorded reply, or the right to run it
    /// (held until the outcome is recorded). Waits while another call of
    /// the same key is in flight here.
    pub async fn claim(self: &Arc<Self>, key: CallKey, cancel: &CancellationToken) -> Result<Claim, ToolReply> {
        let lock = {
            let mut locks = self.locks.lock().map_err(|_| unavailable("the key table is unavailable"))?;
            locks.entry(key.id.clone()).or_default().clone()
        };
        let mut held = Held { keys: self.clone(), id: key.id.clone(), lock: Some(lock.clone()), guard: None };
        let guard = tokio::select! {
            g = lock.lock_owned() => g,
            _ = cancel.cancelled() => {
                return Err(ToolReply::error(
                    Diagnostics::failed(FailureKind::Cancelled, "调用在等待同一 idempotency_key 的首次调用时被取消；未执行任何操作。")
                ));
            }
        };
        held.guard = Some(guard);
        match self.lookup(&key).await? {
            Found::Replay(r) => Ok(Claim::Replay(r)),
            Found::Fresh => Ok(Claim::Run(Running { held, key, created_ms: None, finished: false })),
        }
    }
}

fn found(key: &CallKey, text: &JsonText) -> Result<Found, ToolReply> {
    let rec: KeyRecord = serde_json::from_str(&text.0).map_err(|e| unavailable(format!("a key record: {e}")))?;
    if rec.args_digest != key.digest {
        return Err(conflict(&rec.action));
    }
    Ok(Found::Replay(match (rec.state, rec.reply) {
        (KeyState::Done, Some(r)) => replayed(r),
        _ => unknown_replay(),
    }))
}

/// A per-key lock held; the map entry goes when its last holder lets go.
struct Held {
    keys: Arc<Keys>,
    id: String,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.guard.take();
        let Some(lock) = self.lock.take() else { return };
        if let Ok(mut locks) = self.keys.locks.lock() {
            // Ours and the map's: nobody else waits for it.
            if Arc::strong_count(&lock) == 2 {
                locks.remove(&self.id);
            }
        }
    }
}

/// The right to run a keyed call: [`Running::begin`] before the send,
/// [`Running::finish`] with the outcome.
pub struct Running {
    held: Held,
    key: CallKey,
    /// Set once the call is recorded as sent (pending).
    created_ms: Option<u64>,
    finished: bool,
}

impl Running {
    /// This call's key record in the task directory.
    fn record(&self, owner: Option<String>, created_ms: u64, state: KeyState, reply: Option<ToolReply>) -> KeyRecord {
        KeyRecord {
            version: KEY_RECORD_VERSION,
            key_id: self.key.id.clone(),
            owner,
            args_digest: self.key.digest.clone(),
            action: self.key.action.clone(),
            created_ms,
            state,
            reply,
        }
    }

    /// Record the call as sent (durably, with a task directory) before it
    /// is sent. `Err`: nothing may be sent (the reply says why, or is the
    /// reply of a claim made elsewhere meanwhile).
    pub async fn begin(&mut self) -> Result<(), ToolReply> {
        let keys = self.held.keys.clone();
        let now = keys.now();
        match &keys.backend {
            Backend::Memory(m) => {
                let mut m = m.lock().map_err(|_| unavailable("the key table is unavailable"))?;
                m.prune(now);
                if m.entries.len() >= MAX_MEMORY_KEYS || m.bytes >= MAX_MEMORY_BYTES {
                    return Err(unavailable(format!(
                        "本运行时已保存 {} 个键（内存上限 {MAX_MEMORY_KEYS} 个或 {} MiB，键保存 24 小时；设置 SNOWLUMA_MCP_TASK_DIR 可持久保存）",
                        m.entries.len(),
                        MAX_MEMORY_BYTES >> 20
                    )));
                }
            }
            Backend::Store(store) => {
                let rec = self.record(keys.owner.clone(), now, KeyState::Pending, None);
                let text = serde_json::to_value(&rec).map(|v| JsonText::from_value(&v)).map_err(unavailable)?;
                match store.keys(TasksRequest::KeyBegin { record: text, now_ms: now }).await {
                    Ok(TasksReply::Written) => {}
                    Ok(TasksReply::Record(text)) => {
                        self.finished = true;
                        return Err(match found(&self.key, &text) {
                            Ok(Found::Replay(r)) => r,
                            Ok(Found::Fresh) => unknown_replay(),
                            Err(r) => r,
                        });
                    }
                    Ok(_) => return Err(unavailable("the task-store worker answered unexpectedly")),
                    Err(e) => return Err(unavailable(e)),
                }
            }
        }
        self.created_ms = Some(now);
        Ok(())
    }

    /// Record the call's outcome (what every later call with the key gets).
    pub async fn finish(mut self, reply: &ToolReply) {
        self.finished = true;
        let Some(created_ms) = self.created_ms else { return };
        let keys = self.held.keys.clone();
        match &keys.backend {
            Backend::Memory(m) => {
                if let Ok(mut m) = m.lock() {
                    let entry = Entry {
                        digest: self.key.digest.clone(),
                        action: self.key.action.clone(),
                        created_ms,
                        reply: Some(reply.clone()),
                        bytes: reply_bytes(reply),
                    };
                    m.insert(self.key.id.clone(), entry);
                }
            }
            Backend::Store(store) => {
                let rec = self.record(keys.owner.clone(), created_ms, KeyState::Done, Some(reply.clone()));
                let written = match serde_json::to_value(&rec) {
                    Ok(v) => store.keys(TasksRequest::KeyFinish { record: JsonText::from_value(&v) }).await.map(|_| ()),
                    Err(e) => Err(TaskError::Store(e.to_string())),
                };
                if let Err(e) = written {
                    // The pending record stands: later calls get "unknown".
                    tracing::error!(error = %e, "the outcome of a keyed call was not recorded; its key replays as unknown");
                }
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Abandoned after its send, before its outcome: unknown from now on
        // (on disk the pending record already says so).
        if self.finished || self.created_ms.is_none() {
            return;
        }
        if let Backend::Memory(m) = &self.held.keys.backend
            && let Ok(mut m) = m.lock()
        {
            let entry = Entry {
                digest: self.key.digest.clone(),
                action: self.key.action.clone(),
                created_ms: self.created_ms.unwrap_or_default(),
                reply: None,
                bytes: 256,
            };
            m.insert(self.key.id.clone(), entry);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use snowluma_catalog::Catalog;

    fn action(name: &str) -> &'static Action {
        Catalog::bundled().get(name).unwrap()
    }

    #[test]
    fn keys_are_printable_ascii_of_1_to_128() {
        assert!(valid_key("a") && valid_key(&"k".repeat(128)) && valid_key("retry #2 ~ok"));
        for bad in ["", &"k".repeat(129), "tab\t", "é", "nl\n", "\u{7f}"] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_key_binds_principal_action_and_params() {
        let send = action("send_group_msg");
        let p = json!({"group_id": 1, "message": "hi"});
        let a = CallKey::new(None, "k", send, &p);
        let same = CallKey::new(None, "k", send, &json!({"message": "hi", "group_id": 1}));
        assert_eq!((a.id.as_str(), a.digest.as_str()), (same.id.as_str(), same.digest.as_str()));
        assert_ne!(a.digest, CallKey::new(None, "k", send, &json!({"group_id": 2, "message": "hi"})).digest);
        assert_ne!(a.digest, CallKey::new(None, "k", action("send_private_msg"), &p).digest);
        assert_ne!(a.id, CallKey::new(Some("http:t"), "k", send, &p).id);
        assert_ne!(a.id, CallKey::new(None, "k2", send, &p).id);
    }

    /// 50 concurrent claims of one key: exactly one runs; every other gets
    /// its recorded reply, marked replayed; another call is a conflict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_claims_run_once() {
        let keys = Arc::new(Keys::in_memory(None, 0));
        let send = action("send_group_msg");
        let p = json!({"group_id": 1, "message": "hi"});
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut calls = Vec::new();
        for _ in 0..50 {
            let (keys, runs, key) = (keys.clone(), runs.clone(), keys.call_key("k", send, &p));
            calls.push(tokio::spawn(async move {
                match keys.claim(key, &CancellationToken::new()).await {
                    Ok(Claim::Run(mut r)) => {
                        r.begin().await.unwrap();
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        let reply = ToolReply::ok(&json!({"status": "ok", "retcode": 0}));
                        r.finish(&reply).await;
                        reply
                    }
                    Ok(Claim::Replay(r)) => r,
                    Err(r) => r,
                }
            }));
        }
        let mut replays = 0;
        for c in calls {
            let r = c.await.unwrap();
            assert!(!r.is_error);
            replays += usize::from(r.diagnostics.replayed);
        }
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(replays, 49);
        let other = keys.call_key("k", send, &json!({"group_id": 2, "message": "hi"}));
        let Err(r) = keys.claim(other, &CancellationToken::new()).await else { panic!("a conflict") };
        assert_eq!(r.diagnostics.kind, Some(FailureKind::IdempotencyConflict));
        assert!(keys.locks.lock().unwrap().is_empty(), "no lock left behind");
    }

    /// A claim given up before its send leaves the key free; one given up
    /// after it replays as unknown; keys expire after 24 hours.
    #[tokio::test]
    async fn abandoned_claims_and_expiry() {
        let keys = Arc::new(Keys::in_memory(None, 0));
        let send = action("send_group_msg");
        let key = keys.call_key("k", send, &json!({}));
        let Ok(Claim::Run(r)) = keys.claim(key.clone(), &CancellationToken::new()).await else { panic!() };
        drop(r);
        let Ok(Claim::Run(mut r)) = keys.claim(key.clone(), &CancellationToken::new()).await else { panic!() };
        r.begin().await.unwrap();
        drop(r);
        let Ok(Claim::Replay(u)) = keys.claim(key.clone(), &CancellationToken::new()).await else { panic!() };
        assert_eq!((u.diagnostics.outcome, u.diagnostics.replayed), (snowluma_proto::Outcome::Unknown, true));
        assert!(keys.peek(&key).await.unwrap().is_some());
        let later = Arc::new(Keys {
            backend: std::mem::replace(
                &mut Arc::into_inner(keys).unwrap().backend,
                Backend::Memory(Mutex::new(Memory::default())),
            ),
            owner: None,
            locks: Mutex::new(HashMap::new()),
            clock_offset_ms: KEY_TTL_MS,
        });
        assert!(later.peek(&key).await.unwrap().is_none(), "expired after 24 h");
    }
}
