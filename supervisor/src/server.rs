//! The MCP face of the supervisor: the server, its constructor and the rmcp
//! `ServerHandler` that lists tools per mode and dispatches each request to
//! the server's state (`state.rs`): the execution path is `execution.rs`,
//! the `_with_input` flow `completion_flow.rs`, background tasks
//! `background.rs`, resources `resources.rs`.
//!
//! The gates run in the trusted process and use the catalog compiled into
//! this binary, never an answer from a worker: a compromised catalog worker
//! must not be able to turn a write into a "read-only" action.

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
use snowluma_proto::{FailureKind, ToolReply};

use crate::completion::StateError;
use crate::completion_flow::{Completion, state_error};
use crate::execution::ProgressSink;
use crate::gates;
use crate::replies::{CACHE_TTL_MS, is_modern, render};
use crate::resources::events_error;
use crate::state::ServerState;
pub use crate::state::{SERVER_NAME, SERVER_VERSION, Services, Workers};
use crate::tools::{self, Handler, ToolSpec};
use crate::trace::CallTrace;

pub fn implementation() -> Implementation {
    Implementation::new(SERVER_NAME, SERVER_VERSION)
}

/// The MCP server: its state (`state.rs`), shared with the background
/// tasks that outlive a request.
pub struct SnowlumaServer {
    state: Arc<ServerState>,
}

impl SnowlumaServer {
    pub fn new(state: ServerState) -> Arc<SnowlumaServer> {
        Arc::new(SnowlumaServer { state: Arc::new(state) })
    }

    pub fn audit_enabled(&self) -> bool {
        self.state.audit_enabled()
    }

    /// Query tools' calls answered from the transport, on this server's
    /// state (`transport::Direct`).
    pub(crate) fn direct_calls(&self) -> Arc<crate::transport::Direct> {
        crate::transport::Direct::new(self.state.clone())
    }

    /// `subscribe_events` / `unsubscribe_events`; a scope refusal is
    /// audited like the execution tools' (`out_of_scope`).
    async fn events_call(&self, spec: tools::ToolSpec, args: Value, trace: &CallTrace) -> ToolReply {
        let Some(hub) = &self.state.events else {
            return ToolReply::fail(FailureKind::NotConfigured, "未配置实时事件（需 SNOWLUMA_MCP_EVENTS_URL）。");
        };
        let op = match spec.handler {
            Handler::SubscribeEvents => crate::events::Op::Subscribe,
            _ => crate::events::Op::Release,
        };
        let reply = crate::events::tool_call(hub, op, args).await;
        if reply.diagnostics.kind == Some(FailureKind::OutOfScope) {
            self.state.audit_tool_refusal(spec, trace, "out_of_scope").await;
        }
        reply
    }
}

impl ServerHandler for SnowlumaServer {
    fn get_info(&self) -> ServerConfig {
        // Resource subscriptions (modern listen, legacy subscribe) exist
        // only for live event resources; tasks only with a task directory.
        let mut caps = ServerCapabilities::builder().enable_tools().enable_resources();
        if self.state.events.is_some() {
            caps = caps.enable_resources_subscribe();
        }
        if self.state.tasks.is_some() {
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
        let mut listed =
            tools::listed(self.state.config.mode, self.state.events.is_some(), crate::preview::ui_declared(&ctx));
        if self.state.tasks.is_some() && crate::tasks::declared(&ctx) {
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
        let Some(spec) =
            tools::find(&request.name).filter(|t| self.state.events.is_some() || !t.handler.needs_events())
        else {
            return Err(McpError::invalid_params(
                format!("未知工具: {}", snowluma_catalog::plain_echo(&request.name)),
                Some(
                    json!({"tools": tools::listed(self.state.config.mode, self.state.events.is_some(), false).iter().map(|t| t.name.clone()).collect::<Vec<_>>()}),
                ),
            ));
        };
        // Only the _with_input tools issue continuations (and invoke_action,
        // for a confirmation: `completion_flow::invoke`); any other tool
        // refuses one rather than run as if it were not there.
        let completes = matches!(spec.handler, Handler::QueryWithInput | Handler::InvokeWithInput | Handler::Invoke);
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
        if task_tool && (self.state.tasks.is_none() || !crate::tasks::declared(&ctx)) {
            if self.state.tasks.is_none() {
                return Err(McpError::invalid_params(format!("未知工具: {}（未配置持久任务）", spec.name), None));
            }
            return Err(crate::tasks::not_declared());
        }
        if spec.handler == Handler::Background && spec.modes.contains(self.state.config.mode) {
            let reply = match self.state.background(spec, args, &trace).await {
                Ok(task) => {
                    log_answered(spec, &trace, "task", started);
                    return Ok(CallToolResponse::Task(task));
                }
                Err(reply) => reply,
            };
            return Ok(render(reply, &trace).into());
        }
        // The execution tools' mode is the first of their gates
        // (`gates::admit`); every other tool's is checked here.
        let reply = match spec.handler {
            Handler::Query => self.state.exec_call(spec, text_args, &trace, &ctx.ct, ProgressSink::client(&ctx)).await,
            Handler::Invoke => {
                let input = (request.input_responses, request.request_state);
                match self.state.invoke(spec, text_args, input, &ctx, &trace).await? {
                    Completion::Done(reply) => reply,
                    Completion::Ask(result) => {
                        log_answered(spec, &trace, "input_required", started);
                        return Ok(result.into());
                    }
                }
            }
            Handler::QueryWithInput | Handler::InvokeWithInput => {
                let input = (request.input_responses, request.request_state);
                match self.state.with_input(spec, args, input, &ctx, &trace).await? {
                    Completion::Done(reply) => reply,
                    Completion::Ask(result) => {
                        log_answered(spec, &trace, "input_required", started);
                        return Ok(result.into());
                    }
                }
            }
            _ if !spec.modes.contains(self.state.config.mode) => gates::mode_refusal(spec.modes),
            Handler::Doc => self.state.doc_call(spec.name, text_args, &ctx.ct).await,
            Handler::RuntimeInfo => crate::runtime::runtime_info(&self.state, args, &ctx.ct, &trace).await,
            Handler::SubscribeEvents | Handler::UnsubscribeEvents => self.events_call(spec, args, &trace).await,
            Handler::Background => {
                ToolReply::fail(FailureKind::Execution, "后台任务需要写模式（SNOWLUMA_MCP_MODE=write）。".to_owned())
            }
            Handler::ListTasks => self.state.list_tasks(args).await,
            Handler::Preview => {
                crate::preview::tool_call(&self.state, &args, crate::completion_flow::can_answer_form(&ctx))
            }
        };
        crate::calllog::finished(spec, &trace, &reply, started, ctx.ct.is_cancelled());
        Ok(render(reply, &trace).into())
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        let tasks = self.state.tasks_for(&ctx)?;
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
        let tasks = self.state.tasks_for(&ctx)?;
        tasks.cancel(&request.task_id).await.map(|_| ()).map_err(|e| e.to_mcp())
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let tasks = self.state.tasks_for(&ctx)?;
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
        self.state.resource_list(request, ctx).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.state.resource_templates(request, ctx).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.state.resource_read(request, ctx).await
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
        let hub = self.state.events.as_ref()?;
        let mut accepted = requested.clone();
        if let Some(uris) = &requested.resource_subscriptions {
            let live: std::collections::HashSet<String> = hub.list().into_iter().map(|(uri, _)| uri).collect();
            accepted.resource_subscriptions = Some(uris.iter().filter(|u| live.contains(*u)).cloned().collect());
        }
        Some(accepted)
    }

    async fn listen(&self, ctx: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        let Some(hub) = &self.state.events else {
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
        let Some(hub) = &self.state.events else {
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
        let Some(hub) = &self.state.events else {
            return Err(McpError::invalid_params("resource subscriptions are only offered for event resources", None));
        };
        hub.release(&request.uri).map_err(|e| events_error(e, &request.uri))
    }
}

/// The log line of a call answered by a task or an input request.
fn log_answered(spec: ToolSpec, trace: &CallTrace, outcome: &'static str, started: Instant) {
    tracing::info!(
        tool = spec.name,
        traceparent = %trace.traceparent,
        outcome,
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "tool call"
    );
}
