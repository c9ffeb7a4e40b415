//! The MCP face of the supervisor: an rmcp `ServerHandler` that lists tools
//! and resources per mode, applies the gates, and routes each call to the
//! worker that may serve it.
//!
//! Gates live here, in the trusted process, and use the catalog compiled
//! into this binary, never an answer from a worker: a compromised catalog
//! worker must not be able to turn a write into a "read-only" action.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, Implementation, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use snowluma_catalog::{Catalog, FileTransfer};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, FileAction, JsonText, Request, ToolReply, TraceContext};
use tokio_util::sync::CancellationToken;

use crate::audit::{ActionRecord, ActionRef, AuditLog};
use crate::completion::{self, StateError};
use crate::config::Config;
use crate::events::{EventHub, EventsError};
use crate::gates;
use crate::policy::Policy;
use crate::replies::{call_error_reply, is_modern, render, tool_reply};
use crate::resources::events_error;
use crate::tools::{self, Handler, ToolSpec};
use crate::trace::{CallTrace, hex};
use crate::transfers::TransferService;
use crate::workers::{CallError, WorkerSlot};

/// Five minutes, the spec's lifetime for list and catalog results.
pub(crate) const CACHE_TTL_MS: u64 = 5 * 60 * 1000;

pub const SERVER_NAME: &str = "snowluma-mcp";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn implementation() -> Implementation {
    Implementation::new(SERVER_NAME, SERVER_VERSION)
}

pub struct Workers {
    pub catalog: Arc<WorkerSlot>,
    pub network: Option<Arc<WorkerSlot>>,
}

pub struct SnowlumaServer {
    pub(crate) config: Arc<Config>,
    pub(crate) workers: Workers,
    pub(crate) catalog: &'static Catalog,
    pub(crate) policy: Policy,
    pub(crate) audit: Option<AuditLog>,
    /// File transfers (write mode with a download directory).
    pub(crate) transfers: Option<Arc<TransferService>>,
    /// Outstanding input-completion continuations (`completion.rs`).
    pub(crate) continuations: completion::Continuations,
    /// Live event resources, when `SNOWLUMA_MCP_EVENTS_URL` is configured
    /// (read and write modes).
    pub(crate) events: Option<Arc<EventHub>>,
    /// Persistent background transfers (write mode with a task directory).
    pub(crate) tasks: Option<Arc<crate::tasks::TaskService>>,
    /// This server, for transfers that outlive their request.
    pub(crate) me: std::sync::OnceLock<std::sync::Weak<SnowlumaServer>>,
}

/// What a `*_with_input` call answers: a result, or a request for input.
enum Completion {
    Done(ToolReply),
    Ask(rmcp::model::InputRequiredResult),
}

/// Whether this (modern) request's own client capabilities declare form
/// elicitation (`elicitation: {}` or with `form`): input requests are only
/// ever put in a result for a capability the request declared.
fn modern_form(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.meta
        .get("io.modelcontextprotocol/clientCapabilities")
        .and_then(|c| c.get("elicitation"))
        .and_then(Value::as_object)
        .is_some_and(|e| e.is_empty() || e.contains_key("form"))
}

/// A refused continuation, as the JSON-RPC error the protocol asks for.
fn state_error(e: StateError) -> McpError {
    McpError::invalid_params(e.to_string(), None)
}

/// Where a call's progress notifications go.
pub(crate) enum ProgressSink {
    /// Nowhere: the client sent no progress token, or nobody listens.
    None,
    /// To the client, as `notifications/progress` for its token.
    Client(rmcp::service::Peer<RoleServer>, rmcp::model::ProgressToken),
    /// To a background task's record (what `tasks/get` shows).
    Task(tokio::sync::mpsc::UnboundedSender<snowluma_proto::Progress>),
}

impl ProgressSink {
    /// The client's sink when this request carries a progress token.
    pub(crate) fn client(ctx: &RequestContext<RoleServer>) -> ProgressSink {
        match ctx.meta.get_progress_token() {
            Some(token) => ProgressSink::Client(ctx.peer.clone(), token),
            None => ProgressSink::None,
        }
    }
}

/// The services a server may have beside its workers.
pub struct Services {
    /// File transfers (write mode with a download directory).
    pub transfers: Option<Arc<TransferService>>,
    /// Input-completion continuations (always).
    pub continuations: completion::Continuations,
    /// Persistent background transfers (write mode with a task directory).
    pub tasks: Option<Arc<crate::tasks::TaskService>>,
    /// Live event resources (with an events URL).
    pub events: Option<Arc<EventHub>>,
}

impl SnowlumaServer {
    pub fn new(
        config: Arc<Config>,
        workers: Workers,
        policy: Policy,
        audit: Option<AuditLog>,
        services: Services,
    ) -> Arc<SnowlumaServer> {
        let Services { transfers, continuations, tasks, events } = services;
        let server = Arc::new(SnowlumaServer {
            config,
            workers,
            catalog: Catalog::bundled(),
            policy,
            audit,
            transfers,
            continuations,
            events,
            tasks,
            me: std::sync::OnceLock::new(),
        });
        let _ = server.me.set(Arc::downgrade(&server));
        server
    }

    /// `invoke_action_background`: the gates of `invoke_action`, stream
    /// actions only, a place among the running transfers, the record written,
    /// then the transfer in its own task.
    async fn background(
        &self,
        spec: ToolSpec,
        args: Value,
        trace: &CallTrace,
    ) -> Result<rmcp::model::CreateTaskResult, ToolReply> {
        let Some(tasks) = &self.tasks else {
            return Err(ToolReply::fail(
                FailureKind::Execution,
                "未配置持久任务（需 SNOWLUMA_MCP_TASK_DIR）。".to_owned(),
            ));
        };
        // Every gate (mode, endpoint, catalog, params, policy) is checked
        // again by exec_call; this one only decides whether a task fits.
        let mut parsed = gates::arguments(args.clone());
        let action = gates::catalog_action(self.catalog, &parsed.action)?;
        gates::execution(&mut parsed, action)?;
        if !action.stream {
            return Err(ToolReply::error(
                Diagnostics::failed(
                    FailureKind::InvalidArguments,
                    format!(
                        "{} 不是 Stream Action（not a stream action）；后台任务只运行目录中的 Stream Action。",
                        action.name
                    ),
                )
                .with_next_step("Use invoke_action for ordinary actions."),
            ));
        }
        // A call that a gate or the policy refuses gets that refusal at once
        // (through exec_call, which also audits a policy refusal), not a task.
        if self.gated(spec, &args).is_none() {
            return Err(self.exec_call(spec, args, trace, &CancellationToken::new(), ProgressSink::None).await);
        }
        if action.transfer == Some(FileTransfer::Upload) && parsed.input_file().is_none() {
            return Err(ToolReply::error(
                Diagnostics::failed(
                    FailureKind::InvalidArguments,
                    "后台上传需要 execution.input_file（自动分块上传）；单个分块请用 invoke_action。".to_owned(),
                )
                .with_next_step("Pass execution.input_file with a file inside the upload root."),
            ));
        }
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return Err(ToolReply::fail(FailureKind::Execution, "服务器正在关闭。".to_owned()));
        };
        let Some(running) = tasks.reserve() else {
            return Err(ToolReply::error(
                Diagnostics::failed(
                    FailureKind::Execution,
                    format!("已有 {} 个后台任务在运行（上限）；本次未启动任何任务。", crate::tasks::MAX_RUNNING),
                )
                .with_next_step("Wait for a running task to finish (poll tasks/get), then start this one."),
            ));
        };
        let record = match tasks.create(&running.id, &action.name).await {
            Ok(r) => r,
            Err(e) => {
                return Err(ToolReply::error(
                    Diagnostics::failed(FailureKind::Execution, format!("无法写入任务记录，未启动任何任务：{e}"))
                        .with_next_step("Use invoke_action, or fix the task directory (SNOWLUMA_MCP_TASK_DIR)."),
                ));
            }
        };
        let handle = rmcp::model::Task::new(
            record.task_id.clone(),
            rmcp::model::TaskStatus::Working,
            record.created_at.clone(),
            record.last_updated_at.clone(),
        );
        let mut handle = handle;
        handle.status_message = record.status_message.clone();
        handle.ttl_ms = None;
        handle.poll_interval_ms = Some(crate::tasks::POLL_INTERVAL_MS);
        let trace = trace.clone();
        let service = tasks.clone();
        let (progress_tx, mut progress_rx) = tokio::sync::mpsc::unbounded_channel();
        let watcher = tasks.clone();
        let watched = running.id.clone();
        tokio::spawn(async move {
            while let Some(p) = progress_rx.recv().await {
                watcher.note_progress(&watched, p);
            }
        });
        tokio::spawn(async move {
            let running = running;
            let reply = me.exec_call(spec, args, &trace, &running.cancel, ProgressSink::Task(progress_tx)).await;
            let cancelled = running.cancel.is_cancelled() && reply.diagnostics.kind == Some(FailureKind::Cancelled);
            let mut record = record;
            if cancelled {
                record.status = snowluma_proto::task::TaskStatus::Cancelled;
                record.status_message = Some(format!(
                    "cancelled; {}",
                    reply.diagnostics.message.clone().unwrap_or_else(|| "the transfer stopped".into())
                ));
            } else {
                let failed_business = reply.diagnostics.outcome != snowluma_proto::Outcome::Success;
                record.status = snowluma_proto::task::TaskStatus::Completed;
                record.status_message = Some(if failed_business {
                    "completed; the result reports a failure or an unknown outcome: see its diagnostics".into()
                } else {
                    "completed".into()
                });
                let rendered = render(reply, &trace);
                record.result = serde_json::to_value(&rendered).ok();
            }
            if let Err(e) = service.finish(record).await {
                tracing::error!(error = %e, "a finished background task could not be saved");
            }
            drop(running);
            drop(me);
        });
        Ok(rmcp::model::CreateTaskResult::new(handle))
    }

    /// `subscribe_events` / `unsubscribe_events`.
    async fn events_call(&self, hub: &EventHub, handler: Handler, args: Value) -> ToolReply {
        let result = match handler {
            Handler::SubscribeEvents => hub.subscribe(&args).await,
            _ => match args.as_object().filter(|o| o.len() == 1).and_then(|o| o.get("uri")).and_then(Value::as_str) {
                Some(uri) => hub.release(uri).map(|()| json!({"released": uri})),
                None => Err(EventsError::InvalidArguments("expected exactly {\"uri\": <string>}".into())),
            },
        };
        match result {
            Ok(v) => ToolReply::ok(&v),
            Err(e @ (EventsError::InvalidArguments(_) | EventsError::NotFound | EventsError::BadCursor(_))) => {
                ToolReply::fail(FailureKind::InvalidArguments, e.to_string())
            }
            Err(e) => ToolReply::fail(FailureKind::Execution, e.to_string()),
        }
    }

    /// This server's file transfers, when it has any.
    pub(crate) fn transfers(&self) -> Option<&TransferService> {
        self.transfers.as_deref()
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether live event resources are served (configured, and a mode that executes).
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    pub fn audit_enabled(&self) -> bool {
        self.audit.is_some()
    }

    /// A documentation tool: its arguments go to the catalog worker as the
    /// client's text (never parsed here).
    async fn doc_call(&self, tool: &str, args: gates::Args, cancel: &CancellationToken) -> ToolReply {
        let args = match args {
            gates::Args::Raw(raw) => JsonText(raw.get().to_owned()),
            gates::Args::Value(v) => JsonText::from_value(&v),
        };
        let req = Request::CatalogTool { tool: tool.to_owned(), args };
        tool_reply("the catalog worker", self.workers.catalog.call(req, cancel, None).await, false)
    }

    /// `query_action` / `invoke_action`: the gates of `gates.rs` in order,
    /// the audit records, then the request (or transfer). Progress goes to
    /// `progress`: the client, a background task's record, or nowhere.
    async fn exec_call(
        &self,
        spec: ToolSpec,
        args: impl Into<gates::Args>,
        trace: &CallTrace,
        cancel: &CancellationToken,
        progress: ProgressSink,
    ) -> ToolReply {
        match self.execute(spec, args.into(), trace, cancel, progress).await {
            Ok(reply) | Err(reply) => reply,
        }
    }

    async fn execute(
        &self,
        spec: ToolSpec,
        args: gates::Args,
        trace: &CallTrace,
        cancel: &CancellationToken,
        progress: ProgressSink,
    ) -> Result<ToolReply, ToolReply> {
        let tool = spec.name;
        // The mode first (re-checked on every call), as Node.
        if !spec.modes.contains(self.config.mode) {
            return Err(gates::mode_refusal(spec.modes));
        }
        let mut args = gates::exec_arguments(args);
        let network = gates::endpoint(self.workers.network.as_ref())?;
        let action = gates::catalog_action(self.catalog, &args.action)?;
        gates::read_only(spec.handler.read_only_tool(), action, &args.action)?;
        gates::execution(&mut args, action)?;
        let params = gates::params(args.params.take());
        // File transfers: which one, and whether this server can do it.
        let transfer = crate::transfers::plan(self.transfers.as_deref(), action, &params, args.input_file())?;
        // What the audit records say about this action (only when auditing).
        let audit = self.audit.as_ref().map(|log| {
            let about = ActionRef {
                op_id: hex(&crate::trace::random_bytes::<16>()),
                tool: tool.to_owned(),
                action: args.action.clone(),
                canonical: action.name.clone(),
                read_only: action.read_only,
                mode: self.config.mode.as_str(),
                traceparent: trace.traceparent.clone(),
            };
            (log, about)
        });
        // The operator's action policy. Refusals are audited too.
        if let Err(refusal) = gates::policy(&self.policy, action) {
            if let Some((log, about)) = &audit {
                let rec = ActionRecord::Refused { action: about.clone(), reason: "policy_denied" };
                if let Err(e) = log.record(rec).await {
                    tracing::error!(error = %e, "cannot write an audit record for a refused action");
                }
            }
            return Err(refusal);
        }
        // Nothing leaves without its intent record once auditing is on.
        if let Some((log, about)) = &audit {
            let rec =
                ActionRecord::Intent { action: about.clone(), params_digest: log.params_digest(&params.to_value()) };
            if let Err(e) = log.record(rec).await {
                tracing::error!(error = %e, "audit intent not written; action refused");
                return Err(ToolReply::error(
                    Diagnostics::failed(FailureKind::AuditFailed, format!("无法写入审计日志，action 未执行：{e}"))
                        .with_next_step(
                            "The operator must repair SNOWLUMA_MCP_AUDIT_LOG (see `snowluma-mcp audit verify`).",
                        ),
                ));
            }
        }
        let started = Instant::now();
        let exec = ExecRequest {
            action: args.action.clone(),
            params: params.json_text(),
            stream: action.stream,
            write: !action.read_only,
            trace: TraceContext { traceparent: trace.traceparent.clone(), tracestate: trace.tracestate.clone() },
            transfer: None,
            progress: !matches!(progress, ProgressSink::None) && action.stream,
            file_action: action.transfer.map(|t| match t {
                FileTransfer::Upload => FileAction::Upload,
                FileTransfer::Download => FileAction::Download,
            }),
        };
        let (forwarder, progress_tx) = match progress {
            ProgressSink::Client(peer, token) if action.stream => {
                let f = crate::progress::Forwarder::start(peer, token, cancel.clone());
                let tx = f.sender();
                (Some(f), tx)
            }
            ProgressSink::Task(tx) => (None, Some(tx)),
            ProgressSink::Client(..) | ProgressSink::None => (None, None),
        };
        let mut reply = match (transfer, &self.transfers) {
            (Some(plan), Some(service)) => service.clone().run(plan, exec, cancel.clone(), progress_tx).await,
            _ => tool_reply(
                "the network executor",
                network.call(Request::Execute(exec), cancel, progress_tx).await,
                !action.read_only,
            ),
        };
        if let Some(f) = forwarder {
            let success = !reply.is_error && !cancel.is_cancelled();
            if !f.finish(success).await && !reply.is_error {
                tracing::warn!(tool, "progress notifications could not be delivered");
                let note = "some progress notifications could not be delivered";
                reply.diagnostics.message = Some(match reply.diagnostics.message.take() {
                    Some(m) => format!("{m}; {note}"),
                    None => note.to_owned(),
                });
            }
        }
        if let Some((log, about)) = audit {
            let retcode =
                reply.result.as_ref().and_then(|t| t.parse().ok()).and_then(|v: Value| v.get("retcode").cloned());
            let rec = ActionRecord::Result {
                action: about,
                outcome: reply.diagnostics.outcome.as_str(),
                kind: reply.diagnostics.kind.map(|k| k.as_str()),
                is_error: reply.is_error,
                retcode: retcode.unwrap_or(Value::Null),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            };
            if let Err(e) = log.record(rec).await {
                // The action already ran; its intent is on record. Say so loudly.
                tracing::error!(error = %e, "audit result record not written (the intent record stands)");
            }
        }
        Ok(reply)
    }

    /// `*_with_input`: ask for missing required params (see `completion.rs`),
    /// then run the call through [`Self::exec_call`] like the original tool.
    async fn with_input(
        &self,
        spec: ToolSpec,
        args: Value,
        (responses, state): (Option<rmcp::model::InputResponses>, Option<String>),
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<Completion, McpError> {
        // Every gate the call would meet, before anyone is asked anything;
        // a call that fails one goes through exec_call, which refuses it
        // exactly as the original tool does (and audits a policy refusal).
        let Some((action, params, automatic_upload)) = self.gated(spec, &args) else {
            return Ok(Completion::Done(self.exec_call(spec, args, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        };
        let digest = completion::args_digest(spec.name, &args);
        if let Some(sealed) = state {
            let response = responses.as_ref().and_then(|r| r.get(completion::INPUT_KEY));
            let Some(response) = response else {
                // A retry without the answer: ask again with the same state.
                let st = self.continuations.check(&sealed, spec.name, &digest).map_err(state_error)?;
                return Ok(Completion::Ask(completion::input_required(action, &st.missing, sealed)));
            };
            let st = match self.continuations.redeem(&sealed, spec.name, &digest) {
                Ok(st) => st,
                Err(e) => {
                    let reason = match e {
                        StateError::Tampered => "input_tampered",
                        StateError::Expired => "input_expired",
                        StateError::Reused => "input_reused",
                        StateError::Foreign => "input_foreign",
                    };
                    self.audit_refusal(spec, &args, action, trace, reason).await;
                    return Err(state_error(e));
                }
            };
            let taken = response.get("action").and_then(Value::as_str).unwrap_or("cancel");
            let mut provided = params.clone();
            if let Some(p) = provided.as_object_mut() {
                p.extend(st.answered.clone());
            }
            let answer = match completion::check_answer(action, &provided, &st.missing, taken, response.get("content"))
            {
                Ok(a) => a,
                Err((reply, reason)) => {
                    self.audit_refusal(spec, &args, action, trace, reason).await;
                    return Ok(Completion::Done(reply));
                }
            };
            let mut answered = st.answered;
            answered.extend(answer);
            let remaining: Vec<String> = st.missing.into_iter().filter(|m| !answered.contains_key(m)).collect();
            if !remaining.is_empty() {
                // Asked again only if this request, too, declares form elicitation.
                if !modern_form(ctx) {
                    return Ok(Completion::Done(completion::no_form_support(spec.name, &remaining)));
                }
                return Ok(self.ask_modern(spec, action, digest, remaining, answered));
            }
            let merged = completion::merged_args(&args, &answered);
            return Ok(Completion::Done(self.exec_call(spec, merged, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
        let mut missing = completion::missing(action, &params);
        if automatic_upload {
            // The server sets these itself for an automatic upload.
            missing.retain(|m| !crate::transfers::MCP_OWNED_UPLOAD_FIELDS.contains(&m.as_str()));
        }
        if missing.is_empty() {
            return Ok(Completion::Done(self.exec_call(spec, args, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
        if is_modern(ctx) {
            if !modern_form(ctx) {
                return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
            }
            return Ok(self.ask_modern(spec, action, digest, missing, serde_json::Map::new()));
        }
        let legacy_form = ctx.peer.peer_info().is_some_and(|i| i.protocol_version != ProtocolVersion::V_2025_03_26)
            && ctx.peer.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Form);
        if !legacy_form {
            return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
        }
        Ok(Completion::Done(self.ask_legacy(spec, args, action, params, missing, ctx, trace).await))
    }

    /// The gates up to the operator's policy, without side effects: the
    /// action and its params when the call would pass them all.
    /// The third value: the call is an automatic upload (`execution.input_file`).
    fn gated(&self, spec: ToolSpec, args: &Value) -> Option<(&'static snowluma_catalog::Action, Value, bool)> {
        if !spec.modes.contains(self.config.mode) {
            return None;
        }
        let mut parsed = gates::arguments(args.clone());
        gates::endpoint(self.workers.network.as_ref()).ok()?;
        let action = gates::catalog_action(self.catalog, &parsed.action).ok()?;
        gates::read_only(spec.handler.read_only_tool(), action, &parsed.action).ok()?;
        gates::execution(&mut parsed, action).ok()?;
        let automatic_upload = parsed.input_file().is_some();
        let params = gates::params(parsed.params).to_value();
        gates::policy(&self.policy, action).ok()?;
        Some((action, params, automatic_upload))
    }

    /// A modern `input_required` result for `missing`, or the refusal when
    /// too many are outstanding.
    fn ask_modern(
        &self,
        spec: ToolSpec,
        action: &snowluma_catalog::Action,
        digest: String,
        missing: Vec<String>,
        answered: serde_json::Map<String, Value>,
    ) -> Completion {
        let Some(id) = self.continuations.reserve() else {
            return Completion::Done(completion::too_many());
        };
        let state = completion::State { id: id.clone(), tool: spec.name.to_owned(), digest, missing, answered };
        match self.continuations.seal(&state) {
            Ok(sealed) => Completion::Ask(completion::input_required(action, &state.missing, sealed)),
            Err(e) => {
                self.continuations.release(&id);
                Completion::Done(ToolReply::fail(FailureKind::Execution, format!("cannot seal the continuation: {e}")))
            }
        }
    }

    /// A legacy client: `elicitation/create` inside this call, until every
    /// missing field is answered (each answer checked), then the call.
    #[allow(clippy::too_many_arguments)]
    async fn ask_legacy(
        &self,
        spec: ToolSpec,
        args: Value,
        action: &'static snowluma_catalog::Action,
        params: Value,
        mut missing: Vec<String>,
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> ToolReply {
        let Some(slot) = self.continuations.reserve() else {
            return completion::too_many();
        };
        let mut answered = serde_json::Map::new();
        while !missing.is_empty() {
            let ask = ctx.peer.create_elicitation(completion::form(action, &missing));
            let result = tokio::select! {
                r = ask => r,
                _ = ctx.ct.cancelled() => {
                    self.continuations.release(&slot);
                    return call_error_reply(CallError::Cancelled, false);
                }
            };
            let (taken, content) = match result {
                Ok(r) => {
                    let taken = match r.action {
                        rmcp::model::ElicitationAction::Accept => "accept",
                        rmcp::model::ElicitationAction::Decline => "decline",
                        _ => "cancel",
                    };
                    (taken, r.content)
                }
                Err(e) => {
                    self.continuations.release(&slot);
                    return ToolReply::error(
                        Diagnostics::failed(FailureKind::Cancelled, format!("输入请求失败：{e}；未执行任何操作。"))
                            .with_next_step("Call the original tool with complete params."),
                    );
                }
            };
            let mut provided = params.clone();
            if let Some(p) = provided.as_object_mut() {
                p.extend(answered.clone());
            }
            match completion::check_answer(action, &provided, &missing, taken, content.as_ref()) {
                Ok(a) => answered.extend(a),
                Err((reply, reason)) => {
                    self.continuations.release(&slot);
                    self.audit_refusal(spec, &args, action, trace, reason).await;
                    return reply;
                }
            }
            missing.retain(|m| !answered.contains_key(m));
        }
        self.continuations.release(&slot);
        let merged = completion::merged_args(&args, &answered);
        self.exec_call(spec, merged, trace, &ctx.ct, ProgressSink::client(ctx)).await
    }

    /// A `refused` audit record for a continuation that executes nothing.
    async fn audit_refusal(
        &self,
        spec: ToolSpec,
        args: &Value,
        action: &snowluma_catalog::Action,
        trace: &CallTrace,
        reason: &'static str,
    ) {
        let Some(log) = &self.audit else { return };
        let about = ActionRef {
            op_id: hex(&crate::trace::random_bytes::<16>()),
            tool: spec.name.to_owned(),
            action: args.get("action").and_then(Value::as_str).unwrap_or_default().to_owned(),
            canonical: action.name.clone(),
            read_only: action.read_only,
            mode: self.config.mode.as_str(),
            traceparent: trace.traceparent.clone(),
        };
        if let Err(e) = log.record(ActionRecord::Refused { action: about, reason }).await {
            tracing::error!(error = %e, "cannot write an audit record for a refused continuation");
        }
    }

    async fn list_tasks(&self, args: Value) -> ToolReply {
        let Some(tasks) = &self.tasks else {
            return ToolReply::fail(FailureKind::Execution, "persistent tasks are not configured".to_owned());
        };
        let cursor = match args.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(_) => return ToolReply::fail(FailureKind::InvalidArguments, "cursor 必须是字符串。".to_owned()),
        };
        let limit = match args.get("limit") {
            None | Some(Value::Null) => 50,
            Some(v) => match v.as_u64() {
                Some(n @ 1..=100) => n as u32,
                _ => {
                    return ToolReply::fail(
                        FailureKind::InvalidArguments,
                        "limit 必须是 1 到 100 之间的整数。".to_owned(),
                    );
                }
            },
        };
        if let Some(extra) = args.as_object().and_then(|o| o.keys().find(|k| *k != "cursor" && *k != "limit")) {
            return ToolReply::fail(
                FailureKind::InvalidArguments,
                format!("未知参数: {}", snowluma_catalog::json_echo(extra)),
            );
        }
        match tasks.list(cursor, limit).await {
            Ok(page) => ToolReply::ok(&page),
            Err(e) => ToolReply::fail(FailureKind::Execution, e.to_string()),
        }
    }

    /// `preview_message`: a draft and whether this server would send it.
    /// Contacts nothing (no worker, no network, no audit record).
    fn preview(&self, args: &Value) -> ToolReply {
        let draft = match crate::preview::parse(args) {
            Ok(d) => d,
            Err(reply) => return reply,
        };
        let blocked = crate::preview::send_blocked_by(
            self.config.mode,
            self.workers.network.is_some(),
            &self.policy,
            self.catalog,
            draft.action(),
        );
        ToolReply::ok(&crate::preview::result(&draft, blocked))
    }

    async fn runtime_info(&self, args: Value, cancel: &CancellationToken, trace: &CallTrace) -> ToolReply {
        crate::runtime::runtime_info(self, args, cancel, trace).await
    }

    fn tasks_for(&self, ctx: &RequestContext<RoleServer>) -> Result<&crate::tasks::TaskService, McpError> {
        match &self.tasks {
            None => Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                "persistent tasks are not configured on this server",
                None,
            )),
            Some(_) if !crate::tasks::declared(ctx) => Err(crate::tasks::not_declared()),
            Some(t) => Ok(t),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn catalog(&self) -> &'static Catalog {
        self.catalog
    }

    /// Run a read-only action for the runtime overview, through the same
    /// gates as `query_action`.
    pub async fn query(&self, action: &str, trace: &CallTrace, cancel: &CancellationToken) -> ToolReply {
        self.exec_call(tools::QUERY_ACTION, json!({"action": action, "params": {}}), trace, cancel, ProgressSink::None)
            .await
    }
}

impl ServerHandler for SnowlumaServer {
    fn get_info(&self) -> ServerConfig {
        // Resource subscriptions (modern listen, legacy subscribe) exist
        // only for live event resources; tasks only with a task directory.
        let mut caps = ServerCapabilities::builder().enable_tools().enable_resources();
        if self.events.is_some() {
            caps = caps.enable_resources_subscribe();
        }
        if self.tasks.is_some() {
            caps = caps.enable_tasks();
        }
        let caps = caps.build();
        ServerConfig::new(caps)
            .with_server_info(implementation())
            .with_instructions(
                "Documentation and execution of SnowLuma's OneBot v11 actions. Find actions with search_actions / list_actions, read the full contract with get_action, then run read-only actions with query_action (read/write mode) or any action with invoke_action (write mode). Results carry structuredContent {result, diagnostics}; check diagnostics.outcome, status and retcode. Nothing is retried automatically.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&[
            ProtocolVersion::V_2025_03_26,
            ProtocolVersion::V_2025_06_18,
            ProtocolVersion::V_2025_11_25,
            ProtocolVersion::V_2026_07_28,
        ])
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut listed = tools::listed(self.config.mode, self.events.is_some(), crate::preview::ui_declared(&ctx));
        if self.tasks.is_some() && crate::tasks::declared(&ctx) {
            listed.extend(tools::TASK_TOOLS.iter().copied().map(tools::definition));
        }
        let mut res = ListToolsResult::with_all_items(listed);
        if is_modern(&ctx) {
            res = res.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Private);
        }
        Ok(res)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = Instant::now();
        let trace = CallTrace::from_meta(&ctx.meta);
        let Some(spec) = tools::find(&request.name).filter(|t| self.events.is_some() || !t.handler.needs_events())
        else {
            return Err(McpError::invalid_params(
                format!("未知工具: {}", snowluma_catalog::plain_echo(&request.name)),
                Some(
                    json!({"tools": tools::listed(self.config.mode, self.events.is_some(), false).iter().map(|t| t.name.clone()).collect::<Vec<_>>()}),
                ),
            ));
        };
        // Only the _with_input tools issue continuations; any other tool
        // refuses one rather than run as if it were not there.
        let completes = matches!(spec.handler, Handler::QueryWithInput | Handler::InvokeWithInput);
        if !completes && request.request_state.is_some() {
            return Err(state_error(StateError::Foreign));
        }
        // The arguments as the client's text when the transport kept them
        // so (its fast parse); only the tools that read them all parse them.
        let raw = ctx.extensions.get::<crate::transport::RawArguments>().map(|r| r.0.clone());
        let text_args = match raw {
            Some(r) => gates::Args::Raw(r),
            None => gates::Args::Value(Value::Object(request.arguments.take().unwrap_or_default())),
        };
        let forwards = matches!(spec.handler, Handler::Doc | Handler::Query | Handler::Invoke);
        let args = if forwards { Value::Null } else { text_args.clone().into_value() };
        let task_tool = matches!(spec.handler, Handler::Background | Handler::ListTasks);
        if task_tool && (self.tasks.is_none() || !crate::tasks::declared(&ctx)) {
            if self.tasks.is_none() {
                return Err(McpError::invalid_params(format!("未知工具: {}（未配置持久任务）", spec.name), None));
            }
            return Err(crate::tasks::not_declared());
        }
        if spec.handler == Handler::Background && spec.modes.contains(self.config.mode) {
            let reply = match self.background(spec, args, &trace).await {
                Ok(task) => {
                    tracing::info!(
                        tool = spec.name,
                        traceparent = %trace.traceparent,
                        outcome = "task",
                        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
                        "tool call"
                    );
                    return Ok(CallToolResponse::Task(task));
                }
                Err(reply) => reply,
            };
            return Ok(render(reply, &trace).into());
        }
        let reply = if !spec.modes.contains(self.config.mode) {
            gates::mode_refusal(spec.modes)
        } else {
            match spec.handler {
                Handler::Doc => self.doc_call(spec.name, text_args, &ctx.ct).await,
                Handler::Query | Handler::Invoke => {
                    self.exec_call(spec, text_args, &trace, &ctx.ct, ProgressSink::client(&ctx)).await
                }
                Handler::QueryWithInput | Handler::InvokeWithInput => {
                    let input = (request.input_responses, request.request_state);
                    match self.with_input(spec, args, input, &ctx, &trace).await? {
                        Completion::Done(reply) => reply,
                        Completion::Ask(result) => {
                            tracing::info!(
                                tool = spec.name,
                                traceparent = %trace.traceparent,
                                outcome = "input_required",
                                duration_ms = started.elapsed().as_secs_f64() * 1000.0,
                                "tool call"
                            );
                            return Ok(result.into());
                        }
                    }
                }
                Handler::RuntimeInfo => self.runtime_info(args, &ctx.ct, &trace).await,
                Handler::SubscribeEvents | Handler::UnsubscribeEvents => match &self.events {
                    Some(hub) => self.events_call(hub, spec.handler, args).await,
                    None => {
                        ToolReply::fail(FailureKind::NotConfigured, "未配置实时事件（需 SNOWLUMA_MCP_EVENTS_URL）。")
                    }
                },
                Handler::Background => ToolReply::fail(
                    FailureKind::Execution,
                    "后台任务需要写模式（SNOWLUMA_MCP_MODE=write）。".to_owned(),
                ),
                Handler::ListTasks => self.list_tasks(args).await,
                Handler::Preview => self.preview(&args),
            }
        };
        // One diagnostic line per call: never arguments, contents, tokens or paths.
        if let Some(d) = trace.diagnostic() {
            tracing::info!(tool = spec.name, traceparent = %trace.traceparent, "{d}");
        }
        tracing::info!(
            tool = spec.name,
            traceparent = %trace.traceparent,
            outcome = reply.diagnostics.outcome.as_str(),
            failure = reply.diagnostics.kind.map(|k| k.as_str()).unwrap_or("none"),
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "tool call"
        );
        Ok(render(reply, &trace).into())
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let tasks = self.tasks_for(&ctx)?;
        let mut record = tasks.get(&request.task_id).await.map_err(|e| e.to_mcp())?;
        if record.status == snowluma_proto::task::TaskStatus::Working
            && let Some(m) = tasks.progress_message(&record.task_id)
        {
            record.status_message = Some(m);
        }
        tasks.detailed(record)
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let tasks = self.tasks_for(&ctx)?;
        tasks.cancel(&request.task_id).await.map(|_| ()).map_err(|e| e.to_mcp())
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let tasks = self.tasks_for(&ctx)?;
        // Background transfers never request input: there is no outstanding
        // input request to answer, so every response is ignored (the spec's
        // rule for unknown keys); an unknown task is an error.
        tasks.get(&request.task_id).await.map(|_| ()).map_err(|e| e.to_mcp())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.resource_list(request, ctx).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.resource_templates(request, ctx).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.resource_read(request, ctx).await
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        // rmcp intersects this with the request and the advertised
        // capabilities (resource subscriptions only when events are
        // configured). Of the resources, only this session's live event
        // resources are accepted: a URI it cannot read (unknown, released,
        // another session's, or no event resource at all) is left out of
        // the acknowledgement, so the client is never told it will hear of
        // it. A resource created later needs a new listen.
        let hub = self.events.as_ref()?;
        let mut accepted = requested.clone();
        if let Some(uris) = &requested.resource_subscriptions {
            let live: std::collections::HashSet<String> = hub.list().into_iter().map(|(uri, _)| uri).collect();
            accepted.resource_subscriptions = Some(uris.iter().filter(|u| live.contains(*u)).cloned().collect());
        }
        Some(accepted)
    }

    async fn listen(&self, ctx: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let Some(hub) = &self.events else {
            ctx.cancelled().await;
            return Ok(());
        };
        // The stream only delivers updates; ending it releases nothing.
        let key = hub.listen(ctx.sink().clone());
        ctx.cancelled().await;
        hub.unlisten(key);
        Ok(())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let Some(hub) = &self.events else {
            return Err(McpError::invalid_params("resource subscriptions are only offered for event resources", None));
        };
        hub.legacy_subscribe(&request.uri, ctx.peer.clone()).map_err(|e| events_error(e, &request.uri))
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let Some(hub) = &self.events else {
            return Err(McpError::invalid_params("resource subscriptions are only offered for event resources", None));
        };
        hub.release(&request.uri).map_err(|e| events_error(e, &request.uri))
    }
}
