//! The resources: the action catalog and its per-action template (served by
//! the catalog worker), the preview panel (MCP Apps), and the live event
//! resources, with the cache hints of modern requests.

use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use snowluma_catalog::{ACTION_URI_TEMPLATE, CATALOG_URI};
use snowluma_proto::{Reply, Request, WorkerError};

use crate::events::{EventHub, EventsError};
use crate::replies::CACHE_TTL_MS;
use crate::replies::is_modern;
use crate::state::ServerState;

/// The bodies of the `ServerHandler` resource requests.
impl ServerState {
    pub(crate) async fn resource_list(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        // Node's name, description and MIME type (`resource.*` in node-texts.tsv).
        let res = Resource::new(CATALOG_URI, "SnowLuma OneBot action catalog")
            .with_description(format!(
                "SnowLuma v{} 的 {} 个 OneBot action 完整目录（文档 + JSON Schema）。",
                self.catalog.version,
                self.catalog.actions.len()
            ))
            .with_mime_type("application/json");
        let mut all = vec![res];
        if crate::preview::ui_declared(&ctx) {
            all.push(
                Resource::new(crate::preview::UI_URI, "preview-message-panel")
                    .with_description("preview_message 的消息预览面板（MCP Apps）：显示草稿，仅在用户点击时通过 invoke_action 发送。The message preview panel of preview_message.")
                    .with_mime_type(crate::preview::UI_MIME),
            );
        }
        if let Some(hub) = &self.events {
            for (uri, self_id) in hub.list() {
                all.push(
                    Resource::new(uri.clone(), uri.trim_start_matches("snowluma://onebot/"))
                        .with_description(format!(
                            "账号 {self_id} 自 subscribe_events 起收到的实时 OneBot 事件（用 ?after=<cursor> 读取更新的条目）。Live OneBot events of account {self_id}."
                        ))
                        .with_mime_type("application/json"),
                );
            }
        }
        let mut out = ListResourcesResult::with_all_items(all);
        if is_modern(&ctx) {
            // Zero while events are enabled: live resources come and go.
            let ttl = if self.events.is_some() { 0 } else { CACHE_TTL_MS };
            out = out.with_ttl_ms(ttl).with_cache_scope(CacheScope::Private);
        }
        Ok(out)
    }

    pub(crate) async fn resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let t = ResourceTemplate::new(ACTION_URI_TEMPLATE, "onebot-action")
            .with_description(
                "单个 action 的完整文档（按名称或别名）。One action's complete contract, by name or alias.",
            )
            .with_mime_type("application/json");
        let mut out = ListResourceTemplatesResult::with_all_items(vec![t]);
        if is_modern(&ctx) {
            out = out.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Public);
        }
        Ok(out)
    }

    pub(crate) async fn resource_read(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri;
        if uri == crate::preview::UI_URI && crate::preview::ui_declared(&ctx) {
            return match crate::preview::panel() {
                Ok(text) => {
                    let contents = ResourceContents::TextResourceContents {
                        uri,
                        mime_type: Some(crate::preview::UI_MIME.into()),
                        text: text.to_owned(),
                        meta: Some(crate::preview::resource_meta()),
                    };
                    let mut out = ReadResourceResult::new(vec![contents]);
                    if is_modern(&ctx) {
                        out = out.with_ttl_ms(CACHE_TTL_MS).with_cache_scope(CacheScope::Public);
                    }
                    Ok(out.into())
                }
                Err(e) => {
                    tracing::error!(error = %e, "the preview panel cannot be served");
                    Err(McpError::internal_error(e.to_string(), Some(json!({"uri": crate::preview::UI_URI}))))
                }
            };
        }
        if let Some(hub) = self.events.as_ref().filter(|_| EventHub::is_event_uri(&uri)) {
            return match hub.read(&uri) {
                Ok(text) => {
                    let contents = ResourceContents::TextResourceContents {
                        uri,
                        mime_type: Some("application/json".into()),
                        text,
                        meta: None,
                    };
                    let mut out = ReadResourceResult::new(vec![contents]);
                    if is_modern(&ctx) {
                        out = out.with_ttl_ms(0).with_cache_scope(CacheScope::Private);
                    }
                    Ok(out.into())
                }
                Err(e) => Err(events_error(e, &uri)),
            };
        }
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
                let shown = snowluma_catalog::plain_echo(&uri);
                Err(McpError::resource_not_found(format!("unknown resource: {shown}"), uri_data(&uri)))
            }
            Ok(_) => Err(McpError::internal_error("catalog worker answered unexpectedly", None)),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }
}

/// The `data` of a resource-not-found error: the URI exactly as requested
/// (the protocol's SHOULD), unless it is too long to echo back whole.
fn uri_data(uri: &str) -> Option<Value> {
    const MAX_ECHOED_URI_CHARS: usize = 2048;
    (uri.chars().count() <= MAX_ECHOED_URI_CHARS).then(|| json!({ "uri": uri }))
}

/// An event resource error as the JSON-RPC error of a resource request.
pub(crate) fn events_error(e: EventsError, uri: &str) -> McpError {
    let shown = snowluma_catalog::echo(uri);
    match e {
        EventsError::NotFound => McpError::resource_not_found(
            format!("unknown resource: {}", snowluma_catalog::plain_echo(uri)),
            uri_data(uri),
        ),
        other => McpError::invalid_params(other.to_string(), Some(json!({"uri": shown}))),
    }
}
