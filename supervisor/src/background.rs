//! `invoke_action_background` and the task tools: a call admitted by the
//! gates (`gates::admit`, stream actions only) runs in its own task, its
//! record kept by the task store; `list_tasks`, and the task service a
//! `tasks/*` request may use.

use std::sync::Arc;

use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::Value;
use snowluma_catalog::FileTransfer;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::execution::ProgressSink;
use crate::gates;
use crate::replies::render;
use crate::state::ServerState;
use crate::tools::ToolSpec;
use crate::trace::CallTrace;

impl ServerState {
    /// `invoke_action_background`: the gates of `invoke_action` (stream
    /// actions only), a place among the running transfers, the record
    /// written, then the admitted call in its own task.
    pub(crate) async fn background(
        self: &Arc<Self>,
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
        // A call a gate or the policy refuses gets that refusal at once
        // (a policy refusal audited), not a task.
        let admission = self.admitted(spec, gates::Entry::Background, args.into(), trace).await?;
        let action = admission.action;
        if action.transfer == Some(FileTransfer::Upload) && admission.input_file.is_none() {
            return Err(ToolReply::error(
                Diagnostics::failed(
                    FailureKind::InvalidArguments,
                    "后台上传需要 execution.input_file（自动分块上传）；单个分块请用 invoke_action。".to_owned(),
                )
                .with_next_step("Pass execution.input_file with a file inside the upload root."),
            ));
        }
        // The task outlives this request: it holds the server's state.
        let me = self.clone();
        let Some(running) = tasks.reserve() else {
            return Err(ToolReply::error(
                Diagnostics::failed(
                    FailureKind::Execution,
                    format!("已有 {} 个后台任务在运行（上限）；本次未启动任何任务。", crate::tasks::MAX_RUNNING),
                )
                .with_next_step("Wait for a running task to finish (poll tasks/get), then start this one."),
            ));
        };
        let record = match tasks.create(&running.id, action.name).await {
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
            let reply = me.run(spec, admission, &trace, &running.cancel, ProgressSink::Task(progress_tx)).await;
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

    /// `list_tasks`: one page of this session's task records.
    pub(crate) async fn list_tasks(&self, args: Value) -> ToolReply {
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

    /// The task service for a `tasks/*` request: configured, and declared
    /// by the request.
    pub(crate) fn tasks_for(&self, ctx: &RequestContext<RoleServer>) -> Result<&crate::tasks::TaskService, McpError> {
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
