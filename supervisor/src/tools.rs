//! The MCP tools this server offers: names, schemas, annotations and the
//! modes in which each is listed and callable.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use snowluma_proto::Diagnostics;

use crate::config::Mode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// Answered by the catalog worker.
    Doc,
    /// `query_action`: read-only catalog actions, read and write modes.
    Query,
    /// `invoke_action`: any catalog action, write mode only.
    Invoke,
    /// `get_runtime_info`: answered by the supervisor from its configuration.
    RuntimeInfo,
}

#[derive(Debug, Clone, Copy)]
pub struct ToolSpec {
    pub name: &'static str,
    pub kind: ToolKind,
}

pub const TOOLS: &[ToolSpec] = &[
    ToolSpec { name: "list_actions", kind: ToolKind::Doc },
    ToolSpec { name: "get_action", kind: ToolKind::Doc },
    ToolSpec { name: "search_actions", kind: ToolKind::Doc },
    ToolSpec { name: "list_categories", kind: ToolKind::Doc },
    ToolSpec { name: "query_action", kind: ToolKind::Query },
    ToolSpec { name: "invoke_action", kind: ToolKind::Invoke },
    ToolSpec { name: "get_runtime_info", kind: ToolKind::RuntimeInfo },
];

pub fn find(name: &str) -> Option<ToolSpec> {
    TOOLS.iter().copied().find(|t| t.name == name)
}

/// Whether `kind` is listed and callable in `mode`.
pub fn enabled(kind: ToolKind, mode: Mode) -> bool {
    match kind {
        ToolKind::Doc | ToolKind::RuntimeInfo => true,
        ToolKind::Query => matches!(mode, Mode::Read | Mode::Write),
        ToolKind::Invoke => mode == Mode::Write,
    }
}

fn obj(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn filters() -> Value {
    json!({
        "category": {"type": "string", "description": "Only actions of this category (exact name as list_categories gives it, e.g. 群管理)."},
        "read_only": {"type": "boolean", "description": "Only actions that change nothing (true) or only actions that do (false)."},
        "stream": {"type": "boolean", "description": "Only Stream API actions (true) or only ordinary ones (false)."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200, "description": "Page size (1-200). With limit or offset the result adds total and next_offset."},
        "offset": {"type": "integer", "minimum": 0, "description": "Index of the first match to return."}
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}

fn compact_list_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "total": {"type": "integer"},
            "next_offset": nullable(json!({"type": "integer"})),
            "actions": {"type": "array", "items": {"type": "object"}}
        },
        "required": ["count", "actions"]
    })
}

/// `schema` or `null`. Written as `anyOf` rather than a type array, which
/// some clients' schema converters do not accept.
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// The tool's `structuredContent`: `result` is the tool's own schema, or
/// `null` when the call is a tool error (`isError`), so that clients which
/// validate every result against the advertised schema (the TypeScript SDK
/// v1 does, errors included) accept error results too.
fn output_schema(result: Value) -> Arc<JsonObject> {
    let result = nullable(result);
    obj(json!({
        "type": "object",
        "properties": {
            "result": result,
            "diagnostics": Diagnostics::json_schema()
        },
        "required": ["result", "diagnostics"]
    }))
}

fn exec_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "description": "OneBot action name or alias from the catalog (see list_actions / get_action)."},
            "params": {"type": "object", "additionalProperties": true, "description": "The action's parameters, as get_action's inputSchema describes them."},
            "execution": {
                "type": "object",
                "additionalProperties": false,
                "description": "Options handled by this MCP server, never sent to SnowLuma.",
                "properties": {
                    "input_file": {"type": "string", "description": "For upload_file_stream: a file on the MCP host, inside SNOWLUMA_MCP_UPLOAD_ROOT, uploaded automatically in chunks."}
                }
            }
        },
        "required": ["action"],
        "additionalProperties": false
    })
}

fn annotations(read_only: bool, destructive: bool, open_world: bool) -> ToolAnnotations {
    ToolAnnotations::from_raw(
        None,
        Some(read_only),
        if read_only { None } else { Some(destructive) },
        None,
        Some(open_world),
    )
}

/// The MCP definition of `spec`.
pub fn definition(spec: ToolSpec) -> Tool {
    let (description, input, result, ann) = match spec.name {
        "list_actions" => (
            "List the bundled SnowLuma OneBot v11 actions in catalog order, optionally filtered by category, read_only and stream, with optional pagination. Reads only the bundled catalog.",
            merge(json!({}), filters()),
            compact_list_schema(),
            annotations(true, false, false),
        ),
        "get_action" => (
            "Get one action's complete contract by name or alias: parameters, inputSchema, returnsSchema (the successful OneBot data), examples and notes.",
            json!({"name": {"type": "string", "description": "Action name or alias, e.g. get_status or nc_get_rkey."}}),
            json!({"type": "object"}),
            annotations(true, false, false),
        ),
        "search_actions" => (
            "Search actions by name, alias or summary. Default: case-insensitive substring in catalog order. match=\"keywords\": space-separated terms combined with AND, common Chinese/English synonyms (e.g. 群 禁言), exact names and aliases first.",
            merge(
                json!({
                    "query": {"type": "string", "description": "Text to look for; an empty query matches everything."},
                    "match": {"type": "string", "enum": ["substring", "keywords"], "description": "Matching mode (default substring)."}
                }),
                filters(),
            ),
            compact_list_schema(),
            annotations(true, false, false),
        ),
        "list_categories" => (
            "List the action categories with their action counts.",
            json!({}),
            json!({"type": "array", "items": {"type": "object", "properties": {"category": {"type": "string"}, "count": {"type": "integer"}}}}),
            annotations(true, false, false),
        ),
        "query_action" => (
            "Execute a read-only OneBot action against the configured SnowLuma server and return its envelope {status, retcode, data} unchanged. Refuses actions that change state; use invoke_action in write mode for those.",
            json!(null),
            json!({"type": "object", "additionalProperties": true, "description": "The OneBot envelope as SnowLuma returned it."}),
            annotations(true, false, true),
        ),
        "invoke_action" => (
            "Execute any catalog OneBot action (including writes and Stream API actions) against the configured SnowLuma server. Write mode only. Never retried automatically: check diagnostics.outcome, status and retcode.",
            json!(null),
            json!({"type": "object", "additionalProperties": true, "description": "The OneBot envelope, or for stream actions the frame collection / saved-file metadata."}),
            annotations(false, true, true),
        ),
        _ => (
            "Describe this server's effective configuration without contacting SnowLuma: mode, catalog version, limits and paths on the MCP host. With check_connection=true (read/write modes) it also queries get_login_info, get_status and get_version_info.",
            json!({"check_connection": {"type": "boolean", "description": "Also query the server (read/write modes only)."}}),
            json!({"type": "object"}),
            annotations(true, false, false),
        ),
    };
    let input_schema = if input.is_null() {
        exec_input()
    } else {
        let required = match spec.name {
            "get_action" => json!(["name"]),
            "search_actions" => json!(["query"]),
            _ => json!([]),
        };
        let mut s = json!({"type": "object", "properties": input, "additionalProperties": false});
        if required.as_array().is_some_and(|r| !r.is_empty()) {
            s["required"] = required;
        }
        s
    };
    Tool::new(spec.name, description, obj(input_schema))
        .with_raw_output_schema(output_schema(result))
        .with_annotations(ann)
}

/// The tools listed in `mode`, in their fixed order.
pub fn listed(mode: Mode) -> Vec<Tool> {
    TOOLS.iter().copied().filter(|t| enabled(t.kind, mode)).map(definition).collect()
}
