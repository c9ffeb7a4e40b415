//! The task-store worker: the only process that opens the task directory
//! (descriptor 4, Landlock read-write beneath it and nothing else).
//!
//! It opens the store when configured: the lease, the scope check and the
//! restart pass (unfinished records become failed with an "unknown remote
//! outcome"). If that fails (another runtime holds the lease, the directory
//! belongs to another configuration, a record is corrupt), the worker still
//! serves, answering every request with the reason, so that the supervisor
//! refuses task tools clearly while every other tool keeps working. Only a
//! missing lease is not final: every request tries to take it again, so a
//! runtime that started while another held it (under `serve-http`, another
//! session's tree) gets the task tools once that one has ended.
//!
//! Every record belongs to the principal of the session that created it
//! (`owner`, the serve-http access token's id; none for a stdio session),
//! given in the worker's configuration. A session sees only its own
//! principal's records: another's are unknown (`NotFound`) and not listed,
//! and it can neither create nor replace one in another's name. The
//! restart pass alone spans every owner: whichever session holds the lease
//! fails every unfinished record, since only a runtime that has gone can
//! have left one.

pub mod keys;
pub mod store;

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use snowluma_proto::{JsonText, Reply, Request, TasksReply, TasksRequest, WorkerConfig, WorkerError};
use snowluma_sandbox::role::{Claimed, Slot};

use crate::serve::{Ctx, RoleHandler};
use store::{StoreError, TaskRecord, TaskStore};

pub struct TasksWorker {
    dir: Mutex<Option<OwnedFd>>,
    state: Mutex<Option<State>>,
    /// The principal this session's tasks belong to (set once, at configure).
    owner: OnceLock<Option<String>>,
}

/// The store once configured.
enum State {
    Open(Arc<TaskStore>),
    /// Another runtime holds the lease: tried again at every request.
    Leased {
        dir: OwnedFd,
        config_digest: [u8; 32],
    },
    /// Any other failure is final (its reason is every request's answer).
    Failed(String),
}

impl State {
    fn opening(dir: OwnedFd, config_digest: [u8; 32]) -> State {
        match TaskStore::open_or_wait(dir, &config_digest) {
            Ok(store) => State::Open(Arc::new(store)),
            Err((StoreError::Leased, Some(dir))) => State::Leased { dir, config_digest },
            Err((e, _)) => {
                tracing::warn!(error = %e, "the task store cannot be used");
                State::Failed(e.to_string())
            }
        }
    }
}

impl TasksWorker {
    /// Takes its directory from the worker's claim (`worker_main`).
    pub fn from_claimed(claimed: &mut Claimed) -> TasksWorker {
        TasksWorker { dir: Mutex::new(claimed.take(Slot::TaskDir)), state: Mutex::new(None), owner: OnceLock::new() }
    }

    /// The open store, taking the lease first if another runtime held it
    /// until now; or the reason why task requests are refused.
    fn store(&self) -> Result<Arc<TaskStore>, String> {
        let mut state = self.state.lock().map_err(|_| "the task store is unavailable".to_owned())?;
        if let Some(State::Leased { .. }) = &*state
            && let Some(State::Leased { dir, config_digest }) = state.take()
        {
            let next = State::opening(dir, config_digest);
            if let State::Open(_) = next {
                tracing::info!("the task directory's lease was free again and is now held by this runtime");
            }
            *state = Some(next);
        }
        match &*state {
            Some(State::Open(store)) => Ok(store.clone()),
            Some(State::Leased { .. }) => Err(StoreError::Leased.to_string()),
            Some(State::Failed(reason)) => Err(reason.clone()),
            None => Err("the task store is not configured".into()),
        }
    }

    fn refused(e: &StoreError) -> TasksReply {
        match e {
            StoreError::NotFound => TasksReply::NotFound,
            e => TasksReply::Refused { reason: e.to_string() },
        }
    }

    fn serve(store: &TaskStore, owner: Option<&str>, req: TasksRequest) -> TasksReply {
        // A record to write must name this session's principal.
        let parse = |text: &JsonText| -> Result<TaskRecord, StoreError> {
            let r: TaskRecord = serde_json::from_str(&text.0)
                .map_err(|e| StoreError::Corrupt { what: "the record to write", reason: e.to_string() })?;
            if r.owner.as_deref() != owner {
                return Err(StoreError::Corrupt {
                    what: "the record to write",
                    reason: "it names another principal than this session's".into(),
                });
            }
            Ok(r)
        };
        // Another principal's record is unknown to this session.
        let own = |r: TaskRecord| if r.owner.as_deref() == owner { Ok(r) } else { Err(StoreError::NotFound) };
        let result = match req {
            TasksRequest::Create { record } => {
                parse(&record).and_then(|r| store.put(&r, true)).map(|()| TasksReply::Written)
            }
            TasksRequest::Update { record } => parse(&record)
                .and_then(|r| {
                    // Only an existing record of this principal is
                    // replaced, and never a finished one.
                    let old = own(store.get(&r.task_id)?)?;
                    if old.status.is_terminal() {
                        return Err(StoreError::Exists);
                    }
                    store.put(&r, false)
                })
                .map(|()| TasksReply::Written),
            TasksRequest::Recover => store.fail_unfinished().map(|failed| {
                if failed > 0 {
                    tracing::warn!(
                        failed,
                        "unfinished tasks from an earlier run were marked failed (unknown remote outcome)"
                    );
                }
                TasksReply::Recovered { failed: failed as u64 }
            }),
            TasksRequest::Get { task_id } => store.get(&task_id).and_then(own).and_then(|r| {
                serde_json::to_value(&r)
                    .map(|v| TasksReply::Record(JsonText::from_value(&v)))
                    .map_err(|e| StoreError::Corrupt { what: "a task record", reason: e.to_string() })
            }),
            TasksRequest::KeyGet { key_id, now_ms } => store.key_get(&key_id, owner, now_ms).and_then(key_reply),
            TasksRequest::KeyBegin { record, now_ms } => {
                parse_key(&record).and_then(|r| match store.key_begin(&r, owner, now_ms)? {
                    None => Ok(TasksReply::Written),
                    Some(live) => key_reply(live),
                })
            }
            TasksRequest::KeyFinish { record } => {
                parse_key(&record).and_then(|r| store.key_finish(&r, owner)).map(|()| TasksReply::Written)
            }
            TasksRequest::KeySweep { now_ms } => {
                store.key_sweep(now_ms).map(|removed| TasksReply::Swept { removed: removed as u64 })
            }
            TasksRequest::List { cursor, limit } => {
                store.list(cursor.as_deref(), limit.clamp(1, 100) as usize, owner).and_then(|page| {
                    serde_json::to_value(&page.tasks)
                        .map(|v| TasksReply::Page { tasks: JsonText::from_value(&v), next_cursor: page.next_cursor })
                        .map_err(|e| StoreError::Corrupt { what: "a task record", reason: e.to_string() })
                })
            }
        };
        match result {
            Ok(r) => r,
            Err(StoreError::Exists) => TasksReply::Refused { reason: "the task already exists or has finished".into() },
            Err(e) => Self::refused(&e),
        }
    }
}

/// A key record sent by the supervisor, parsed.
fn parse_key(text: &JsonText) -> Result<snowluma_proto::keys::KeyRecord, StoreError> {
    serde_json::from_str(&text.0)
        .map_err(|e| StoreError::Corrupt { what: "the key record to write", reason: e.to_string() })
}

fn key_reply(r: snowluma_proto::keys::KeyRecord) -> Result<TasksReply, StoreError> {
    serde_json::to_value(&r)
        .map(|v| TasksReply::Record(JsonText::from_value(&v)))
        .map_err(|e| StoreError::Corrupt { what: "an idempotency key record", reason: e.to_string() })
}

impl RoleHandler for TasksWorker {
    fn configure(&self, config: WorkerConfig) -> Result<(), String> {
        let WorkerConfig::Tasks { config_digest, owner } = config else {
            return Err("the task-store worker needs a tasks configuration".into());
        };
        let dir = self
            .dir
            .lock()
            .map_err(|_| "the task directory descriptor is unavailable".to_owned())?
            .take()
            .ok_or_else(|| "no task directory descriptor".to_owned())?;
        let mut state = self.state.lock().map_err(|_| "the task store is unavailable".to_owned())?;
        if state.is_some() {
            return Err("already configured".into());
        }
        if self.owner.set(owner).is_err() {
            return Err("already configured".into());
        }
        let opened = State::opening(dir, config_digest);
        if let State::Leased { .. } = opened {
            tracing::warn!(
                "the task directory's lease is held by another snowluma-mcp runtime; \
                 task tools are refused until it is free"
            );
        }
        *state = Some(opened);
        Ok(())
    }

    async fn handle(&self, request: Request, _ctx: Ctx) -> Reply {
        let Request::Tasks(req) = request else {
            return Reply::Error(WorkerError::Unsupported);
        };
        let owner = self.owner.get().and_then(Option::as_deref);
        Reply::Tasks(match self.store() {
            Ok(store) => Self::serve(&store, owner, req),
            Err(reason) => TasksReply::Refused { reason },
        })
    }
}
