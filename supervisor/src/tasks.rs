//! Persistent background transfers (the tasks extension, SEP-2663).
//!
//! The records live in the task-store worker (`workers/src/tasks`), the only
//! process that can open the task directory; this side decides who may use
//! tasks, keeps the running transfers' cancellation tokens (at most
//! [`MAX_RUNNING`]) and turns records into protocol results. A transfer runs
//! in its own tokio task, independent of the request that started it, and
//! the session waits for running transfers before it ends, so a client that
//! disconnects finds the result in the store later. Nothing is replayed: a
//! restart fails unfinished records (the worker does that when it opens the
//! store).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{ErrorCode, GetTaskResult};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use snowluma_proto::task::{RECORD_VERSION, TaskRecord, TaskStatus, is_task_id, new_task_id, now_rfc3339};
use snowluma_proto::{JsonText, Reply, Request, TasksReply, TasksRequest};
use tokio_util::sync::CancellationToken;

use crate::workers::WorkerSlot;

/// The extension's identifier in client capabilities.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// At most this many background transfers run at once.
pub const MAX_RUNNING: usize = 4;
/// The polling interval task handles advertise.
pub const POLL_INTERVAL_MS: u64 = 1000;
/// `-32021`: the request lacks a capability the method needs.
pub const MISSING_CAPABILITY: i32 = -32021;

/// Whether this request may use tasks: a 2026-07-28 request whose own client
/// capabilities declare the extension.
pub fn declared(ctx: &RequestContext<RoleServer>) -> bool {
    crate::replies::is_modern(ctx)
        && ctx
            .meta
            .get("io.modelcontextprotocol/clientCapabilities")
            .and_then(|c| c.get("extensions"))
            .and_then(|e| e.get(EXTENSION))
            .is_some_and(Value::is_object)
}

/// The refusal for a request that did not declare the extension.
pub fn not_declared() -> McpError {
    McpError::new(
        ErrorCode(MISSING_CAPABILITY),
        "tasks need a 2026-07-28 request that declares the io.modelcontextprotocol/tasks extension",
        Some(json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}})),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("unknown task")]
    NotFound,
    #[error("{0}")]
    Store(String),
    #[error("the task store is unavailable: {0}")]
    Worker(String),
}

impl TaskError {
    pub fn to_mcp(&self) -> McpError {
        match self {
            TaskError::NotFound => McpError::invalid_params("unknown task", None),
            e => McpError::internal_error(e.to_string(), None),
        }
    }
}

pub struct TaskService {
    store: Arc<WorkerSlot>,
    /// The principal this session's tasks belong to (the task-store worker
    /// shows the session only that principal's records).
    owner: Option<String>,
    running: Mutex<HashMap<String, CancellationToken>>,
    /// The last progress of each running transfer (memory only).
    progress: Mutex<HashMap<String, snowluma_proto::Progress>>,
    idle: tokio::sync::watch::Sender<usize>,
    /// The restart pass ran (once per supervisor; a restarted task-store
    /// worker does not fail the transfers still running).
    recovered: tokio::sync::OnceCell<()>,
}

/// A reserved place among the running transfers; released on drop.
pub struct Running {
    service: Arc<TaskService>,
    pub id: String,
    pub cancel: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut p) = self.service.progress.lock() {
            p.remove(&self.id);
        }
        if let Ok(mut r) = self.service.running.lock() {
            r.remove(&self.id);
            self.service.idle.send_replace(r.len());
        }
    }
}

impl TaskService {
    pub fn new(store: Arc<WorkerSlot>, owner: Option<String>) -> Arc<TaskService> {
        Arc::new(TaskService {
            store,
            owner,
            running: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            idle: tokio::sync::watch::channel(0).0,
            recovered: tokio::sync::OnceCell::new(),
        })
    }

    /// Reserve a place for a new transfer, or `None` when [`MAX_RUNNING`] run.
    pub fn reserve(self: &Arc<Self>) -> Option<Running> {
        let mut r = self.running.lock().ok()?;
        if r.len() >= MAX_RUNNING {
            return None;
        }
        let id = new_task_id();
        let cancel = CancellationToken::new();
        r.insert(id.clone(), cancel.clone());
        self.idle.send_replace(r.len());
        Some(Running { service: self.clone(), id, cancel })
    }

    /// Record a running transfer's latest progress.
    pub fn note_progress(&self, id: &str, progress: snowluma_proto::Progress) {
        let running = self.running.lock().is_ok_and(|r| r.contains_key(id));
        if running && let Ok(mut p) = self.progress.lock() {
            p.insert(id.to_owned(), progress);
        }
    }

    /// A running transfer's progress as a status message.
    pub fn progress_message(&self, id: &str) -> Option<String> {
        let p = self.progress.lock().ok()?.get(id).cloned()?;
        // Bytes for file transfers, frames for generic streams.
        Some(match p.total {
            Some(t) => format!("running: {} of {} transferred", p.progress, t),
            None => format!("running: {} transferred", p.progress),
        })
    }

    /// Wait until no transfer runs (the end of a session).
    pub async fn wait_idle(&self) {
        let mut rx = self.idle.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Run the restart pass if it has not run yet (at startup, and before
    /// any other request if that one failed).
    pub async fn recover(&self) -> Result<(), TaskError> {
        self.recovered
            .get_or_try_init(|| async {
                match self.raw_call(TasksRequest::Recover).await? {
                    TasksReply::Recovered { .. } => Ok(()),
                    _ => Err(TaskError::Worker("the task-store worker answered unexpectedly".into())),
                }
            })
            .await
            .map(|_| ())
    }

    async fn call(&self, req: TasksRequest) -> Result<TasksReply, TaskError> {
        self.recover().await?;
        self.raw_call(req).await
    }

    /// An idempotency-key request (`idempotency.rs`), after the restart pass.
    pub async fn keys(&self, req: TasksRequest) -> Result<TasksReply, TaskError> {
        self.call(req).await
    }

    async fn raw_call(&self, req: TasksRequest) -> Result<TasksReply, TaskError> {
        // Store calls are never cancelled halfway: a record write finishes.
        let never = CancellationToken::new();
        match self.store.call(Request::Tasks(req), &never, None).await {
            Ok(Reply::Tasks(TasksReply::Refused { reason })) => Err(TaskError::Store(reason)),
            Ok(Reply::Tasks(TasksReply::NotFound)) => Err(TaskError::NotFound),
            Ok(Reply::Tasks(r)) => Ok(r),
            Ok(_) => Err(TaskError::Worker("the task-store worker answered unexpectedly".into())),
            Err(e) => Err(TaskError::Worker(e.to_string())),
        }
    }

    async fn write(&self, record: &TaskRecord, create: bool) -> Result<(), TaskError> {
        let value = serde_json::to_value(record).map_err(|e| TaskError::Store(e.to_string()))?;
        let record = JsonText::from_value(&value);
        let req = if create { TasksRequest::Create { record } } else { TasksRequest::Update { record } };
        self.call(req).await.map(|_| ())
    }

    /// Durably create the record of a new task (before any work starts).
    pub async fn create(&self, id: &str, action: &str) -> Result<TaskRecord, TaskError> {
        let now = now_rfc3339();
        let record = TaskRecord {
            version: RECORD_VERSION,
            task_id: id.to_owned(),
            status: TaskStatus::Working,
            status_message: Some("the transfer is running".into()),
            created_at: now.clone(),
            last_updated_at: now,
            action: action.to_owned(),
            owner: self.owner.clone(),
            progress: None,
            result: None,
            error: None,
        };
        self.write(&record, true).await?;
        Ok(record)
    }

    /// Save a finished task's final state.
    pub async fn finish(&self, mut record: TaskRecord) -> Result<(), TaskError> {
        record.last_updated_at = now_rfc3339();
        self.write(&record, false).await
    }

    pub async fn get(&self, id: &str) -> Result<TaskRecord, TaskError> {
        if !is_task_id(id) {
            return Err(TaskError::NotFound);
        }
        match self.call(TasksRequest::Get { task_id: id.to_owned() }).await? {
            TasksReply::Record(text) => {
                let v = text.parse().map_err(|e| TaskError::Store(e.to_string()))?;
                serde_json::from_value(v).map_err(|e| TaskError::Store(e.to_string()))
            }
            _ => Err(TaskError::Worker("the task-store worker answered unexpectedly".into())),
        }
    }

    /// One page of metadata: `{tasks, nextCursor}`.
    pub async fn list(&self, cursor: Option<String>, limit: u32) -> Result<Value, TaskError> {
        match self.call(TasksRequest::List { cursor, limit }).await? {
            TasksReply::Page { tasks, next_cursor } => {
                let tasks = tasks.parse().map_err(|e| TaskError::Store(e.to_string()))?;
                let tasks: Vec<Value> = match tasks {
                    Value::Array(items) => items.into_iter().map(|t| self.handle_json(t)).collect(),
                    _ => Vec::new(),
                };
                Ok(json!({"tasks": tasks, "nextCursor": next_cursor}))
            }
            _ => Err(TaskError::Worker("the task-store worker answered unexpectedly".into())),
        }
    }

    /// Request cooperative cancellation. `Ok(true)` if the task was running.
    pub async fn cancel(&self, id: &str) -> Result<bool, TaskError> {
        let token = self.running.lock().ok().and_then(|r| r.get(id).cloned());
        match token {
            Some(t) => {
                t.cancel();
                Ok(true)
            }
            None => self.get(id).await.map(|_| false),
        }
    }

    /// A record's metadata as the protocol's `Task` (no result or error).
    fn handle_json(&self, mut record: Value) -> Value {
        if let Some(o) = record.as_object_mut() {
            o.remove("version");
            o.remove("owner");
            o.remove("result");
            o.remove("error");
            o.insert("ttlMs".into(), Value::Null);
            o.insert("pollIntervalMs".into(), json!(POLL_INTERVAL_MS));
        }
        record
    }

    /// `tasks/get`'s result for a record.
    pub fn detailed(&self, record: TaskRecord) -> Result<GetTaskResult, McpError> {
        let mut v = json!({
            "resultType": "complete",
            "taskId": record.task_id,
            "status": record.status,
            "createdAt": record.created_at,
            "lastUpdatedAt": record.last_updated_at,
            "ttlMs": null,
            "pollIntervalMs": POLL_INTERVAL_MS,
        });
        if let Some(o) = v.as_object_mut() {
            if let Some(m) = record.status_message {
                o.insert("statusMessage".into(), json!(m));
            }
            match record.status {
                TaskStatus::Completed => {
                    o.insert("result".into(), record.result.unwrap_or_else(|| json!({})));
                }
                TaskStatus::Failed => {
                    let e = record.error.unwrap_or_else(|| json!({"code": -32603, "message": "the task failed"}));
                    o.insert("error".into(), e);
                }
                _ => {}
            }
        }
        serde_json::from_value(v).map_err(|e| McpError::internal_error(format!("task record: {e}"), None))
    }
}
