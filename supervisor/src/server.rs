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
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use snowluma_catalog::{ACTION_URI_TEMPLATE, CATALOG_URI, Catalog};
use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, JsonText, Reply, Request, ToolReply, TraceContext, WorkerError,
};
use tokio_util::sync::CancellationToken;

use crate::audit::AuditLog;
use crate::config::{Config, Mode};
use crate::policy::Policy;
use crate::tools::{self, Handler, ToolSpec};
use crate::trace::{CallTrace, hex};
use crate::workers::{CallError, WorkerSlot};

/// Five minutes, the spec's lifetime for list and catalog results.
const CACHE_TTL_MS: u64 = 5 * 60 * 1000;

pub const SERVER_NAME: &str = "snowluma-mcp";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn implementation() -> Implementation {
    Implementation::new(SERVER_NAME, SERVER_VERSION)
}

pub struct Workers {
    pub catalog: Arc<WorkerSlot>,
    pub network: Option<Arc<WorkerSlot>>,
    /// The file-transfer worker (write mode only).
    pub files: Option<Arc<WorkerSlot>>,
}

/// Paths on the MCP host for transfers, resolved at startup.
#[derive(Debug, Clone, Default)]
pub struct TransferPaths {
    /// The upload root as configured and as canonicalized.
    pub upload_root: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub download_dir: Option<std::path::PathBuf>,
}

pub struct SnowlumaServer {
    config: Arc<Config>,
    workers: Workers,
    catalog: &'static Catalog,
    policy: Policy,
    audit: Option<AuditLog>,
    pub(crate) paths: TransferPaths,
    /// Bytes reserved by downloads in flight (quota accounting).
    pub(crate) reserved: std::sync::Mutex<u64>,
    /// Signalled when a download's reservation shrinks or ends.
    pub(crate) quota_freed: tokio::sync::Notify,
    /// Set once stale `.part` files were swept (before the first download).
    pub(crate) swept: tokio::sync::OnceCell<()>,
}

fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// The tool reply of a worker call that answers with a tool result: the
/// worker's own reply, or an error reply for what went wrong on the way.
pub(crate) fn tool_reply(worker: &str, r: Result<Reply, CallError>, write: bool) -> ToolReply {
    match r {
        Ok(Reply::Tool(t)) => t,
        Ok(Reply::Error(WorkerError::ReplyTooLarge { bytes, limit })) => {
            let message = format!(
                "the result ({bytes} bytes) is larger than the {limit}-byte limit between this server's processes, so it cannot be passed on"
            );
            let d = if write {
                Diagnostics::unknown(FailureKind::InvalidResponse, message)
                    .with_next_step("The action may have run: check its effect before trying again.")
            } else {
                Diagnostics::failed(FailureKind::InvalidResponse, message)
                    .with_next_step("Ask for less data (a smaller page or a narrower query).")
            };
            ToolReply::error(d)
        }
        Ok(other) => {
            ToolReply::fail(FailureKind::Execution, format!("{worker} answered unexpectedly: {}", reply_kind(&other)))
        }
        Err(e) => call_error_reply(e, write),
    }
}

pub(crate) fn call_error_reply(e: CallError, write: bool) -> ToolReply {
    match e {
        // Refused before it was sent: nothing ran.
        CallError::TooLarge { .. } => ToolReply::error(
            Diagnostics::failed(FailureKind::InvalidArguments, e.to_string())
                .with_next_step("Send smaller arguments (split the work into several calls)."),
        ),
        CallError::Cancelled => ToolReply::error(Diagnostics {
            outcome: if write { snowluma_proto::Outcome::Unknown } else { snowluma_proto::Outcome::Failed },
            kind: Some(FailureKind::Cancelled),
            message: Some(e.to_string()),
            next_step: None,
        }),
        CallError::WorkerDied(_) if write => {
            ToolReply::error(Diagnostics::unknown(FailureKind::WorkerUnavailable, e.to_string()).with_next_step(
                "The action may or may not have reached SnowLuma; check its effect before trying again.",
            ))
        }
        CallError::WorkerDied(_) | CallError::Unavailable(_) => ToolReply::error(
            Diagnostics::failed(FailureKind::WorkerUnavailable, e.to_string()).with_next_step("Call the tool again."),
        ),
    }
}

/// Render a finished call: `structuredContent` `{result, diagnostics}`, the
/// result's JSON (or the error message) as the text block, and the call's
/// `traceparent` in `_meta`.
pub fn render(reply: ToolReply, trace: &CallTrace) -> CallToolResult {
    let result = match &reply.result {
        Some(t) => t.parse().unwrap_or(Value::Null),
        None => Value::Null,
    };
    let text = if reply.is_error {
        reply.diagnostics.message.clone().unwrap_or_else(|| "tool call failed".to_owned())
    } else {
        serde_json::to_string_pretty(&result).unwrap_or_default()
    };
    let structured = json!({"result": result, "diagnostics": reply.diagnostics.to_json()});
    let mut out = if reply.is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    out.structured_content = Some(structured);
    let mut meta = MetaObject::new();
    meta.insert("traceparent".into(), json!(trace.traceparent));
    out.meta = Some(meta);
    out
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    action: String,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    execution: Option<ExecutionArgs>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecutionArgs {
    #[serde(default)]
    input_file: Option<String>,
}

impl SnowlumaServer {
    pub fn new(
        config: Arc<Config>,
        workers: Workers,
        policy: Policy,
        audit: Option<AuditLog>,
        paths: TransferPaths,
    ) -> SnowlumaServer {
        SnowlumaServer {
            config,
            workers,
            catalog: Catalog::bundled(),
            policy,
            audit,
            paths,
            reserved: std::sync::Mutex::new(0),
            swept: tokio::sync::OnceCell::new(),
            quota_freed: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn files_worker(&self) -> Option<&Arc<WorkerSlot>> {
        self.workers.files.as_ref()
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn audit_enabled(&self) -> bool {
        self.audit.is_some()
    }

    async fn doc_call(&self, tool: &str, args: Value, cancel: &CancellationToken) -> ToolReply {
        let req = Request::CatalogTool { tool: tool.to_owned(), args: JsonText::from_value(&args) };
        tool_reply("the catalog worker", self.workers.catalog.call(req, cancel, None).await, false)
    }

    async fn exec_call(
        &self,
        spec: ToolSpec,
        args: Value,
        trace: &CallTrace,
        cancel: &CancellationToken,
        progress: Option<(rmcp::service::Peer<RoleServer>, rmcp::model::ProgressToken)>,
    ) -> ToolReply {
        let tool = spec.name;
        let args: ExecArgs = match serde_json::from_value(args) {
            Ok(a) => a,
            Err(e) => {
                return ToolReply::error(
                    Diagnostics::failed(FailureKind::InvalidArguments, format!("invalid arguments for {tool}: {e}"))
                        .with_next_step("Pass {\"action\": \"<name>\", \"params\": {...}}."),
                );
            }
        };
        // Gate 1: the mode, re-checked on every call.
        if !spec.modes.contains(self.config.mode) {
            return mode_refusal(spec, self.config.mode);
        }
        let Some(network) = &self.workers.network else {
            return ToolReply::error(
                Diagnostics::failed(FailureKind::NotConfigured, "no SnowLuma endpoint is configured")
                    .with_next_step("Set SNOWLUMA_MCP_ENDPOINT (and SNOWLUMA_MCP_MODE) in the server's environment."),
            );
        };
        // Gate 2: the action must be in the bundled catalog.
        let Some(action) = crate::policy::resolve(self.catalog, &args.action) else {
            return ToolReply::error(
                Diagnostics::failed(
                    FailureKind::UnknownAction,
                    format!("unknown action {}", snowluma_catalog::echo(&args.action)),
                )
                .with_next_step("Find the action with search_actions or list_actions, then read it with get_action."),
            );
        };
        // Gate 3: query_action runs read-only actions only.
        if spec.handler == Handler::Query && !action.read_only {
            return ToolReply::error(
                Diagnostics::failed(
                    FailureKind::ModeForbidden,
                    format!("{} changes state; query_action runs read-only actions only", action.name),
                )
                .with_next_step("Use invoke_action, which requires SNOWLUMA_MCP_MODE=write."),
            );
        }
        let params = match args.params {
            None | Some(Value::Null) => json!({}),
            Some(v @ Value::Object(_)) => v,
            Some(_) => {
                return ToolReply::error(
                    Diagnostics::failed(FailureKind::InvalidArguments, "params must be a JSON object")
                        .with_next_step("See get_action for the action's inputSchema."),
                );
            }
        };
        // File transfers: which one, and whether this server can do it.
        let input_file = args.execution.as_ref().and_then(|e| e.input_file.clone());
        let transfer = match crate::transfers::plan(self, action, &params, input_file.as_deref()) {
            Ok(t) => t,
            Err(reply) => return reply,
        };
        // The audit operation id (only drawn when auditing is on).
        let op_id = if self.audit.is_some() { hex(&crate::trace::random_bytes::<16>()) } else { String::new() };
        let record = |phase: &str| {
            let mut m = serde_json::Map::new();
            m.insert("phase".into(), json!(phase));
            m.insert("op_id".into(), json!(op_id));
            m.insert("tool".into(), json!(tool));
            m.insert("action".into(), json!(args.action));
            m.insert("canonical".into(), json!(action.name));
            m.insert("read_only".into(), json!(action.read_only));
            m.insert("mode".into(), json!(self.config.mode.as_str()));
            m.insert("traceparent".into(), json!(trace.traceparent));
            m
        };
        // Gate 4: the operator's action policy. Refusals are audited too.
        if !self.policy.permits(action) {
            if let Some(log) = &self.audit {
                let mut rec = record("refused");
                rec.insert("reason".into(), json!("policy_denied"));
                if let Err(e) = log.append(rec).await {
                    tracing::error!(error = %e, "cannot write an audit record for a refused action");
                }
            }
            return ToolReply::error(
                Diagnostics::failed(
                    FailureKind::PolicyDenied,
                    format!("{} is refused by this server's action policy: {}", action.name, self.policy.reason(action)),
                )
                .with_next_step("Use another action, or ask the operator to change SNOWLUMA_MCP_ALLOW_ACTIONS / SNOWLUMA_MCP_DENY_ACTIONS."),
            );
        }
        // Nothing leaves without its intent record once auditing is on.
        if let Some(log) = &self.audit {
            let mut rec = record("intent");
            rec.insert("params_digest".into(), json!(log.params_digest(&params)));
            if let Err(e) = log.append(rec).await {
                tracing::error!(error = %e, "audit intent not written; action refused");
                return ToolReply::error(
                    Diagnostics::failed(
                        FailureKind::AuditFailed,
                        format!("the audit log could not be written, so the action was not executed: {e}"),
                    )
                    .with_next_step(
                        "The operator must repair SNOWLUMA_MCP_AUDIT_LOG (see `snowluma-mcp audit verify`).",
                    ),
                );
            }
        }
        let started = Instant::now();
        let exec = ExecRequest {
            action: args.action.clone(),
            params: JsonText::from_value(&params),
            stream: action.stream,
            write: !action.read_only,
            trace: TraceContext { traceparent: trace.traceparent.clone(), tracestate: trace.tracestate.clone() },
            transfer: None,
            progress: progress.is_some() && action.stream,
        };
        let forwarder = match progress {
            Some((peer, token)) if action.stream => {
                Some(crate::progress::Forwarder::start(peer, token, cancel.clone()))
            }
            _ => None,
        };
        let progress_tx = forwarder.as_ref().and_then(|f| f.sender());
        let mut reply = match transfer {
            Some(t) => crate::transfers::run(self, network, t, exec, cancel, progress_tx).await,
            None => tool_reply(
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
        if let Some(log) = &self.audit {
            let mut rec = record("result");
            rec.insert("outcome".into(), json!(reply.diagnostics.outcome.as_str()));
            rec.insert("kind".into(), json!(reply.diagnostics.kind.map(|k| k.as_str())));
            rec.insert("is_error".into(), json!(reply.is_error));
            let retcode =
                reply.result.as_ref().and_then(|t| t.parse().ok()).and_then(|v: Value| v.get("retcode").cloned());
            rec.insert("retcode".into(), retcode.unwrap_or(Value::Null));
            rec.insert("duration_ms".into(), json!(started.elapsed().as_secs_f64() * 1000.0));
            if let Err(e) = log.append(rec).await {
                // The action already ran; its intent is on record. Say so loudly.
                tracing::error!(error = %e, "audit result record not written (the intent record stands)");
            }
        }
        reply
    }

    async fn runtime_info(&self, args: Value, cancel: &CancellationToken, trace: &CallTrace) -> ToolReply {
        crate::runtime::runtime_info(self, args, cancel, trace).await
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
        self.exec_call(tools::QUERY_ACTION, json!({"action": action, "params": {}}), trace, cancel, None).await
    }
}

fn mode_refusal(spec: ToolSpec, mode: Mode) -> ToolReply {
    let need = spec.modes.need();
    ToolReply::error(
        Diagnostics::failed(
            FailureKind::ModeForbidden,
            format!("{} is not available in {} mode", spec.name, mode.as_str()),
        )
        .with_next_step(format!("The operator must set SNOWLUMA_MCP_MODE to {need} (with SNOWLUMA_MCP_ENDPOINT).")),
    )
}

fn reply_kind(r: &Reply) -> &'static str {
    match r {
        Reply::Tool(_) => "tool",
        Reply::Resource(_) => "resource",
        Reply::Error(_) => "error",
        Reply::Files(_) => "files",
    }
}

impl ServerHandler for SnowlumaServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
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
        let mut res = ListToolsResult::with_all_items(tools::listed(self.config.mode));
        if is_modern(&ctx) {
            res = res.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Private);
        }
        Ok(res)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = Instant::now();
        let trace = CallTrace::from_meta(&ctx.meta);
        let Some(spec) = tools::find(&request.name) else {
            return Err(McpError::invalid_params(
                format!("unknown tool {}", snowluma_catalog::echo(&request.name)),
                Some(
                    json!({"tools": tools::listed(self.config.mode).iter().map(|t| t.name.clone()).collect::<Vec<_>>()}),
                ),
            ));
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let reply = if !spec.modes.contains(self.config.mode) {
            mode_refusal(spec, self.config.mode)
        } else {
            match spec.handler {
                Handler::Doc => self.doc_call(spec.name, args, &ctx.ct).await,
                Handler::Query | Handler::Invoke => {
                    let progress = ctx.meta.get_progress_token().map(|t| (ctx.peer.clone(), t));
                    self.exec_call(spec, args, &trace, &ctx.ct, progress).await
                }
                Handler::RuntimeInfo => self.runtime_info(args, &ctx.ct, &trace).await,
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

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let res = Resource::new(CATALOG_URI, "onebot-actions")
            .with_description("The bundled SnowLuma OneBot v11 action catalog: every action with parameters, result schema and examples.")
            .with_mime_type("application/json");
        let mut out = ListResourcesResult::with_all_items(vec![res]);
        if is_modern(&ctx) {
            out = out.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Private);
        }
        Ok(out)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let t = ResourceTemplate::new(ACTION_URI_TEMPLATE, "onebot-action")
            .with_description("One action's complete contract, by name or alias.")
            .with_mime_type("application/json");
        let mut out = ListResourceTemplatesResult::with_all_items(vec![t]);
        if is_modern(&ctx) {
            out = out.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Public);
        }
        Ok(out)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri;
        let reply = self.workers.catalog.call(Request::CatalogResource { uri: uri.clone() }, &ctx.ct, None).await;
        match reply {
            Ok(Reply::Resource(r)) => {
                let contents = ResourceContents::TextResourceContents {
                    uri: r.uri,
                    mime_type: Some(r.mime_type),
                    text: r.text,
                    meta: None,
                };
                let mut out = ReadResourceResult::new(vec![contents]);
                if is_modern(&ctx) {
                    out = out.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Public);
                }
                Ok(out.into())
            }
            Ok(Reply::Error(WorkerError::ResourceNotFound(_))) => {
                let shown = snowluma_catalog::echo(&uri);
                Err(McpError::resource_not_found(format!("resource not found: {shown}"), Some(json!({"uri": shown}))))
            }
            Ok(_) => Err(McpError::internal_error("catalog worker answered unexpectedly", None)),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }
}
