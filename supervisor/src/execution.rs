//! The execution path of `query_action`, `invoke_action` and their
//! background form: the gates of `gates.rs` in order, the audit records, then
//! the request to the network executor (or a file transfer), with progress
//! sent where the call asked for it.

use std::time::Instant;

use rmcp::RoleServer;
use serde_json::Value;
use snowluma_catalog::FileTransfer;
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, FileAction, JsonText, Request, ToolReply, TraceContext};
use tokio_util::sync::CancellationToken;

use crate::audit::{ActionRecord, ActionRef, AuditLog};
use crate::gates;
use crate::replies::{render, tool_reply};
use crate::server::SnowlumaServer;
use crate::tools::ToolSpec;
use crate::trace::{CallTrace, hex};

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
    pub(crate) fn client(ctx: &rmcp::service::RequestContext<RoleServer>) -> ProgressSink {
        match ctx.meta.get_progress_token() {
            Some(token) => ProgressSink::Client(ctx.peer.clone(), token),
            None => ProgressSink::None,
        }
    }
}

impl SnowlumaServer {
    /// `invoke_action_background`: the gates of `invoke_action`, stream
    /// actions only, a place among the running transfers, the record written,
    /// then the transfer in its own task.
    pub(crate) async fn background(
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
        let handle = task_handle(&record);
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
            let record = settled(record, reply, cancelled, &trace);
            if let Err(e) = service.finish(record).await {
                tracing::error!(error = %e, "a finished background task could not be saved");
            }
            drop(running);
            drop(me);
        });
        Ok(rmcp::model::CreateTaskResult::new(handle))
    }

    /// A documentation tool: its arguments go to the catalog worker as the
    /// client's text (never parsed here).
    pub(crate) async fn doc_call(&self, tool: &str, args: gates::Args, cancel: &CancellationToken) -> ToolReply {
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
    pub(crate) async fn exec_call(
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
            finish_progress(f, &mut reply, cancel, tool).await;
        }
        if let Some((log, about)) = audit {
            record_result(log, about, &reply, started).await;
        }
        Ok(reply)
    }

    /// The gates up to the operator's policy, without side effects: the
    /// action and its params when the call would pass them all.
    /// The third value: the call is an automatic upload (`execution.input_file`).
    pub(crate) fn gated(
        &self,
        spec: ToolSpec,
        args: &Value,
    ) -> Option<(&'static snowluma_catalog::Action, Value, bool)> {
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

    /// A `refused` audit record for a continuation that executes nothing.
    pub(crate) async fn audit_refusal(
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
}

/// The client's handle for a task just created.
fn task_handle(record: &snowluma_proto::task::TaskRecord) -> rmcp::model::Task {
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
    handle
}

/// A background task's record once its transfer has stopped: cancelled, or
/// completed with the rendered result.
fn settled(
    mut record: snowluma_proto::task::TaskRecord,
    reply: ToolReply,
    cancelled: bool,
    trace: &CallTrace,
) -> snowluma_proto::task::TaskRecord {
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
        let rendered = render(reply, trace);
        record.result = serde_json::to_value(&rendered).ok();
    }
    record
}

/// End a call's progress forwarding; a successful reply whose progress
/// notifications did not all arrive says so in its message.
async fn finish_progress(f: crate::progress::Forwarder, reply: &mut ToolReply, cancel: &CancellationToken, tool: &str) {
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

/// The `result` audit record of an action that ran.
async fn record_result(log: &AuditLog, about: ActionRef, reply: &ToolReply, started: Instant) {
    // The retcode as the reply's builder read it: the result is not parsed here.
    let rec = ActionRecord::Result {
        action: about,
        outcome: reply.diagnostics.outcome.as_str(),
        kind: reply.diagnostics.kind.map(|k| k.as_str()),
        is_error: reply.is_error,
        retcode: reply.retcode_value(),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
    };
    if let Err(e) = log.record(rec).await {
        // The action already ran; its intent is on record. Say so loudly.
        tracing::error!(error = %e, "audit result record not written (the intent record stands)");
    }
}
