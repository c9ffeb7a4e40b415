//! The MCP face of the supervisor: the server, its constructor and the rmcp
//! `ServerHandler` that lists tools per mode and dispatches each request (the
//! execution path is `execution.rs`, resources `resources.rs`).
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
use snowluma_catalog::Catalog;
use snowluma_proto::{FailureKind, ToolReply};
use tokio_util::sync::CancellationToken;

use crate::audit::AuditLog;
use crate::completion::{self, StateError};
use crate::completion_flow::{Completion, state_error};
use crate::events::{EventHub, EventsError};
use crate::execution::ProgressSink;
use crate::gates;
use crate::policy::Policy;
use crate::replies::{is_modern, render};
use crate::resources::events_error;
use crate::tools::{self, Handler, ToolSpec};
use crate::trace::CallTrace;
use crate::transfers::TransferService;
use crate::workers::WorkerSlot;
use snowluma_config::Config;

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
                    log_answered(spec, &trace, "task", started);
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
                            log_answered(spec, &trace, "input_required", started);
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
        log_call(spec, &trace, &reply, started);
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

/// The log lines of a finished call: never arguments, contents, tokens or paths.
fn log_call(spec: ToolSpec, trace: &CallTrace, reply: &ToolReply, started: Instant) {
    // One diagnostic line per call.
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
}
