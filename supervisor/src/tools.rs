//! The MCP tools this server offers, as one table: each [`ToolSpec`] holds a
//! tool's name, the modes in which it is listed and callable, its input and
//! output schemas, its annotations and its handler. Nothing is looked up by
//! name outside the table, so a new tool cannot borrow another's schema.
//!
//! The documentation tools' names and input schemas come from the catalog's
//! [`DocTool`]s, which parse their arguments with the same types
//! (`snowluma_catalog::args`); so does `get_runtime_info`'s.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use snowluma_catalog::args::ToolArgs;
use snowluma_catalog::tools::{self as doc_tools, DocTool};
use snowluma_proto::Diagnostics;

use crate::config::Mode;

/// Who answers a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// The catalog worker.
    Doc,
    /// `query_action`: read-only catalog actions, through the network executor.
    Query,
    /// `invoke_action`: any catalog action, through the network executor.
    Invoke,
    /// `query_action_with_input`: `query_action`, asking for missing
    /// required params first (`completion.rs`).
    QueryWithInput,
    /// `invoke_action_with_input`: `invoke_action`, likewise.
    InvokeWithInput,
    /// `get_runtime_info`: the supervisor, from its configuration.
    RuntimeInfo,
    /// `subscribe_events`: a live event resource (`events.rs`); listed only
    /// when `SNOWLUMA_MCP_EVENTS_URL` is configured.
    SubscribeEvents,
    /// `unsubscribe_events`: release one; likewise.
    UnsubscribeEvents,
    /// `invoke_action_background`: a stream action as a persistent task (`tasks.rs`).
    Background,
    /// `list_tasks`: task metadata from the task store.
    ListTasks,
    /// `preview_message`: a draft built by the supervisor; contacts nothing.
    Preview,
}

/// The modes in which a tool is listed and callable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    docs: bool,
    read: bool,
    write: bool,
}

impl Modes {
    pub const ALL: Modes = Modes { docs: true, read: true, write: true };
    pub const READ_WRITE: Modes = Modes { docs: false, read: true, write: true };
    pub const WRITE: Modes = Modes { docs: false, read: false, write: true };

    pub fn contains(self, mode: Mode) -> bool {
        match mode {
            Mode::Docs => self.docs,
            Mode::Read => self.read,
            Mode::Write => self.write,
        }
    }

    /// The modes an operator may set for such a tool, as a refusal names them.
    pub fn need(self) -> &'static str {
        if self.read { "read or write" } else { "write" }
    }
}

/// A tool's annotations (MCP's behaviour hints).
#[derive(Debug, Clone, Copy)]
pub struct Hints {
    read_only: bool,
    destructive: bool,
    open_world: bool,
}

/// Reads only the bundled catalog.
const CATALOG_READ: Hints = Hints { read_only: true, destructive: false, open_world: false };

/// One tool: everything the server lists and routes for it.
#[derive(Debug, Clone, Copy)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub modes: Modes,
    /// The tool's `inputSchema`.
    pub input_schema: fn() -> Value,
    /// The schema of `structuredContent.result` on success (see [`output_schema`]).
    pub result_schema: fn() -> Value,
    pub hints: Hints,
    pub handler: Handler,
}

/// A documentation tool: its name and input schema are the catalog's.
const fn doc(tool: DocTool, description: &'static str, result_schema: fn() -> Value) -> ToolSpec {
    ToolSpec {
        name: tool.name,
        description,
        modes: Modes::ALL,
        input_schema: tool.input_schema,
        result_schema,
        hints: CATALOG_READ,
        handler: Handler::Doc,
    }
}

pub const LIST_ACTIONS: ToolSpec = doc(
    doc_tools::LIST_ACTIONS,
    "List the bundled SnowLuma OneBot v11 actions in catalog order, optionally filtered by category, read_only and stream, with optional pagination. Reads only the bundled catalog.",
    compact_list_schema,
);

pub const GET_ACTION: ToolSpec = doc(
    doc_tools::GET_ACTION,
    "Get one action's complete contract by name or alias: parameters, inputSchema, returnsSchema (the successful OneBot data), examples and notes.",
    any_object,
);

pub const SEARCH_ACTIONS: ToolSpec = doc(
    doc_tools::SEARCH_ACTIONS,
    "Search actions by name, alias or summary. Default: case-insensitive substring in catalog order. match=\"keywords\": space-separated terms combined with AND, common Chinese/English synonyms (e.g. 群 禁言), exact names and aliases first.",
    compact_list_schema,
);

pub const LIST_CATEGORIES: ToolSpec =
    doc(doc_tools::LIST_CATEGORIES, "List the action categories with their action counts.", categories_schema);

pub const QUERY_ACTION: ToolSpec = ToolSpec {
    name: "query_action",
    description: "Execute a read-only OneBot action against the configured SnowLuma server and return its envelope {status, retcode, data} unchanged. Refuses actions that change state; use invoke_action in write mode for those.",
    modes: Modes::READ_WRITE,
    input_schema: exec_input,
    result_schema: query_result_schema,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::Query,
};

pub const INVOKE_ACTION: ToolSpec = ToolSpec {
    name: "invoke_action",
    description: "Execute any catalog OneBot action (including writes and Stream API actions) against the configured SnowLuma server. Write mode only. Never retried automatically: check diagnostics.outcome, status and retcode.",
    modes: Modes::WRITE,
    input_schema: exec_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::Invoke,
};

pub const GET_RUNTIME_INFO: ToolSpec = ToolSpec {
    name: crate::runtime::RuntimeInfoArgs::TOOL,
    description: "Describe this server's effective configuration without contacting SnowLuma: mode, catalog version, limits and paths on the MCP host. With check_connection=true (read/write modes) it also queries get_login_info, get_status and get_version_info.",
    modes: Modes::ALL,
    input_schema: crate::runtime::RuntimeInfoArgs::input_schema,
    result_schema: any_object,
    hints: CATALOG_READ,
    handler: Handler::RuntimeInfo,
};

pub const QUERY_ACTION_WITH_INPUT: ToolSpec = ToolSpec {
    name: "query_action_with_input",
    description: "Like query_action, but when params lacks a field the action requires, first asks the user for the missing fields through an input form (clients with form elicitation); nothing is guessed. With complete params it runs at once.",
    modes: Modes::READ_WRITE,
    input_schema: exec_input,
    result_schema: query_result_schema,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::QueryWithInput,
};

pub const INVOKE_ACTION_WITH_INPUT: ToolSpec = ToolSpec {
    name: "invoke_action_with_input",
    description: "Like invoke_action (write mode), but when params lacks a field the action requires, first asks the user for the missing fields through an input form (clients with form elicitation); provided fields cannot be changed by the answer. With complete params it runs at once.",
    modes: Modes::WRITE,
    input_schema: exec_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::InvokeWithInput,
};

pub const SUBSCRIBE_EVENTS: ToolSpec = ToolSpec {
    name: "subscribe_events",
    description: "Create a live event resource for the logged-in account self_id (see get_login_info): events received from now on that match types (message incl. message_sent, notice, request; default all), group_ids and user_ids (AND; a group filter excludes events without group_id) are buffered (256 events / 1 MiB, oldest evicted). Returns its snowluma://onebot/events/<id> URI: read it with resources/read (?after=<next_cursor> for newer entries), get updates with subscriptions/listen or resources/subscribe, release it with unsubscribe_events. Sends nothing to QQ and runs no action.",
    modes: Modes::READ_WRITE,
    input_schema: subscribe_events_input,
    result_schema: subscribe_events_result,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::SubscribeEvents,
};

pub const UNSUBSCRIBE_EVENTS: ToolSpec = ToolSpec {
    name: "unsubscribe_events",
    description: "Release a live event resource created by subscribe_events (its buffer is discarded). Releasing the last one closes the event connection.",
    modes: Modes::READ_WRITE,
    input_schema: unsubscribe_events_input,
    result_schema: any_object,
    hints: Hints { read_only: true, destructive: false, open_world: false },
    handler: Handler::UnsubscribeEvents,
};

pub const PREVIEW_MESSAGE: ToolSpec = ToolSpec {
    name: "preview_message",
    description: "Build a draft of a text message (group or private, optionally quoting a message) without sending anything or contacting SnowLuma, in every mode. Returns a readable draft, can_send (write mode, an endpoint and the send action allowed by policy) and the exact invoke_action arguments that would send it; the text stays literal (CQ codes are not interpreted). Hosts with MCP Apps show it in a panel with a send button.",
    modes: Modes::ALL,
    input_schema: crate::preview::input_schema,
    result_schema: crate::preview::result_schema,
    hints: Hints { read_only: true, destructive: false, open_world: false },
    handler: Handler::Preview,
};

/// Every tool, in the order tools/list gives them.
pub const TOOLS: [ToolSpec; 12] = [
    LIST_ACTIONS,
    GET_ACTION,
    SEARCH_ACTIONS,
    LIST_CATEGORIES,
    QUERY_ACTION,
    INVOKE_ACTION,
    GET_RUNTIME_INFO,
    QUERY_ACTION_WITH_INPUT,
    INVOKE_ACTION_WITH_INPUT,
    PREVIEW_MESSAGE,
    SUBSCRIBE_EVENTS,
    UNSUBSCRIBE_EVENTS,
];

/// `invoke_action_background`: listed only to 2026-07-28 requests that
/// declare the tasks extension, on a server with a usable task directory.
pub const INVOKE_ACTION_BACKGROUND: ToolSpec = ToolSpec {
    name: "invoke_action_background",
    description: "Like invoke_action (write mode), but only for catalog stream actions (downloads, generic streams, upload_file_stream with execution.input_file), run as a persistent background task: the task record is written before work starts and the call returns a task handle at once. Poll tasks/get for the state and the saved result. Never retried or replayed.",
    modes: Modes::WRITE,
    input_schema: exec_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::Background,
};

/// `list_tasks`: metadata of persisted tasks, no result bodies.
pub const LIST_TASKS: ToolSpec = ToolSpec {
    name: "list_tasks",
    description: "List persisted background tasks (metadata only, no results), oldest first. Optional cursor (from nextCursor) and limit 1-100 (default 50).",
    modes: Modes::WRITE,
    input_schema: list_tasks_input,
    result_schema: list_tasks_schema,
    hints: Hints { read_only: true, destructive: false, open_world: false },
    handler: Handler::ListTasks,
};

/// The task tools, listed apart from [`TOOLS`]: only for requests that
/// declare the tasks extension.
pub const TASK_TOOLS: [ToolSpec; 2] = [INVOKE_ACTION_BACKGROUND, LIST_TASKS];

fn list_tasks_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "cursor": {"type": "string", "description": "nextCursor of the previous page."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}
        },
        "additionalProperties": false
    })
}

fn list_tasks_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "tasks": {"type": "array", "items": {"type": "object"}},
            "nextCursor": nullable(json!({"type": "string"}))
        },
        "required": ["tasks"]
    })
}

impl Handler {
    /// The tool runs read-only actions only (`query_action` and its form variant).
    pub fn read_only_tool(self) -> bool {
        matches!(self, Handler::Query | Handler::QueryWithInput)
    }

    /// The tool exists only when event resources are configured.
    pub fn needs_events(self) -> bool {
        matches!(self, Handler::SubscribeEvents | Handler::UnsubscribeEvents)
    }
}

pub fn find(name: &str) -> Option<ToolSpec> {
    TOOLS.iter().chain(TASK_TOOLS.iter()).copied().find(|t| t.name == name)
}

fn obj(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn any_object() -> Value {
    json!({"type": "object"})
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

fn categories_schema() -> Value {
    json!({"type": "array", "items": {"type": "object", "properties": {"category": {"type": "string"}, "count": {"type": "integer"}}}})
}

fn query_result_schema() -> Value {
    json!({"type": "object", "additionalProperties": true, "description": "The OneBot envelope as SnowLuma returned it."})
}

fn invoke_result_schema() -> Value {
    json!({"type": "object", "additionalProperties": true, "description": "The OneBot envelope, or for stream actions the frame collection / saved-file metadata."})
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

/// The input of `query_action` and `invoke_action` (parsed by
/// `server::ExecArgs`; `params` is checked against the action's own schema
/// by SnowLuma, not here).
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

fn id_filter(what: &str) -> Value {
    json!({
        "type": "array",
        "items": {"type": "integer", "minimum": 1},
        "minItems": 1,
        "maxItems": crate::events::MAX_IDS,
        "uniqueItems": true,
        "description": format!("Keep only events whose {what} is one of these (at most 100 distinct positive ids).")
    })
}

fn subscribe_events_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "self_id": {"type": "integer", "minimum": 1, "description": "The logged-in account (get_login_info's user_id); every event must belong to it."},
            "types": {
                "type": "array",
                "items": {"type": "string", "enum": ["message", "notice", "request"]},
                "minItems": 1,
                "uniqueItems": true,
                "description": "Event categories to keep (message includes message_sent); omitted: all three."
            },
            "group_ids": id_filter("group_id"),
            "user_ids": id_filter("user_id")
        },
        "required": ["self_id"],
        "additionalProperties": false
    })
}

fn subscribe_events_result() -> Value {
    json!({
        "type": "object",
        "properties": {
            "uri": {"type": "string", "description": "The canonical snowluma://onebot/events/<id> URI."},
            "self_id": {"type": "integer"},
            "filter": {"type": "object"},
            "status": {"type": "object"}
        },
        "required": ["uri"]
    })
}

fn unsubscribe_events_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "uri": {"type": "string", "description": "The URI subscribe_events returned."}
        },
        "required": ["uri"],
        "additionalProperties": false
    })
}

fn annotations(h: Hints) -> ToolAnnotations {
    ToolAnnotations::from_raw(
        None,
        Some(h.read_only),
        if h.read_only { None } else { Some(h.destructive) },
        None,
        Some(h.open_world),
    )
}

/// The MCP definition of `spec`.
pub fn definition(spec: ToolSpec) -> Tool {
    Tool::new(spec.name, spec.description, obj((spec.input_schema)()))
        .with_raw_output_schema(output_schema((spec.result_schema)()))
        .with_annotations(annotations(spec.hints))
}

/// The definition of `spec` for a client that declared the MCP Apps
/// extension: `preview_message` links its panel.
pub fn definition_with_ui(spec: ToolSpec) -> Tool {
    let mut tool = definition(spec);
    if spec.handler == Handler::Preview {
        tool.meta = Some(crate::preview::tool_meta());
    }
    tool
}

/// The tools listed in `mode`, in their fixed order; the event tools only
/// when `events` (event resources are configured); UI metadata only when
/// `ui` (the request's client declared the MCP Apps extension).
pub fn listed(mode: Mode, events: bool, ui: bool) -> Vec<Tool> {
    TOOLS
        .iter()
        .copied()
        .filter(|t| t.modes.contains(mode) && (events || !t.handler.needs_events()))
        .map(if ui { definition_with_ui } else { definition })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const MODES: [(Mode, &str); 3] = [
        (Mode::Docs, include_str!("../testdata/tools-list-docs.json")),
        (Mode::Read, include_str!("../testdata/tools-list-read.json")),
        (Mode::Write, include_str!("../testdata/tools-list-write.json")),
    ];

    /// Rewrite the golden files from the table (run with `--ignored` after
    /// adding a tool; the diff must show only the new tool appended).
    #[test]
    #[ignore]
    fn write_golden_tool_lists() {
        for (mode, name) in [(Mode::Docs, "docs"), (Mode::Read, "read"), (Mode::Write, "write")] {
            let text = serde_json::to_string_pretty(&listed(mode, false, false)).unwrap() + "\n";
            let path = format!("{}/testdata/tools-list-{name}.json", env!("CARGO_MANIFEST_DIR"));
            std::fs::write(path, text).unwrap();
        }
        let text = serde_json::to_string_pretty(&listed(Mode::Write, false, true)).unwrap() + "\n";
        std::fs::write(format!("{}/testdata/tools-list-write-ui.json", env!("CARGO_MANIFEST_DIR")), text).unwrap();
    }

    /// tools/list is byte for byte what the golden files say (captured from
    /// the code before the tools became one table; new tools are appended).
    #[test]
    fn tool_lists_are_unchanged() {
        for (mode, expected) in MODES {
            let got = serde_json::to_string_pretty(&listed(mode, false, false)).unwrap() + "\n";
            assert_eq!(got, expected, "tools/list in {} mode", mode.as_str());
        }
        let got = serde_json::to_string_pretty(&listed(Mode::Write, false, true)).unwrap() + "\n";
        assert_eq!(got, include_str!("../testdata/tools-list-write-ui.json"), "tools/list for a UI client");
    }

    /// A client that declared the MCP Apps extension gets the same tools;
    /// only preview_message differs, by its `_meta.ui.resourceUri`.
    #[test]
    fn only_preview_message_carries_ui_metadata() {
        for (mode, _) in MODES {
            let plain = listed(mode, true, false);
            let ui = listed(mode, true, true);
            assert_eq!(plain.len(), ui.len());
            for (p, u) in plain.iter().zip(&ui) {
                assert!(p.meta.is_none(), "{}", p.name);
                if p.name == PREVIEW_MESSAGE.name {
                    let meta = serde_json::to_value(&u.meta).unwrap();
                    assert_eq!(meta, json!({"ui": {"resourceUri": crate::preview::UI_URI}}));
                    let mut stripped = u.clone();
                    stripped.meta = None;
                    assert_eq!(serde_json::to_value(&stripped).unwrap(), serde_json::to_value(p).unwrap());
                } else {
                    assert_eq!(serde_json::to_value(u).unwrap(), serde_json::to_value(p).unwrap());
                }
            }
        }
    }

    /// With event resources configured, read and write modes list exactly
    /// the golden tools followed by the two event tools; docs mode is unchanged.
    #[test]
    fn event_tools_are_appended_only_when_configured() {
        for (mode, expected) in MODES {
            let golden: Value = serde_json::from_str(expected).unwrap();
            let mut want = golden.as_array().unwrap().clone();
            if mode != Mode::Docs {
                want.push(serde_json::to_value(definition(SUBSCRIBE_EVENTS)).unwrap());
                want.push(serde_json::to_value(definition(UNSUBSCRIBE_EVENTS)).unwrap());
            }
            assert_eq!(
                serde_json::to_value(listed(mode, true, false)).unwrap(),
                Value::Array(want),
                "{}",
                mode.as_str()
            );
        }
    }

    /// Every advertised tool has an entry of its own: names and descriptions
    /// are unique, each listed tool is exactly its entry's definition, and
    /// every entry is listed in some mode.
    #[test]
    fn every_advertised_tool_has_its_own_entry() {
        let names: HashSet<_> = TOOLS.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TOOLS.len(), "duplicate tool names");
        let descriptions: HashSet<_> = TOOLS.iter().map(|t| t.description).collect();
        assert_eq!(descriptions.len(), TOOLS.len(), "two tools share a description");
        let mut advertised = HashSet::new();
        for (mode, _) in MODES {
            for tool in listed(mode, true, false) {
                let entries: Vec<_> = TOOLS.iter().filter(|t| t.name == tool.name).collect();
                assert_eq!(entries.len(), 1, "{}", tool.name);
                assert!(entries[0].modes.contains(mode));
                let own = serde_json::to_value(definition(*entries[0])).unwrap();
                assert_eq!(serde_json::to_value(&tool).unwrap(), own, "{}", tool.name);
                assert_eq!(find(&tool.name).map(|t| t.name), Some(entries[0].name));
                advertised.insert(tool.name.to_string());
            }
        }
        assert_eq!(advertised.len(), TOOLS.len(), "a tool listed in no mode");
        assert!(find("no_such_tool").is_none());
    }

    /// The documentation tools are exactly the catalog's, each answered by
    /// the catalog worker with the schema of the type that parses it.
    #[test]
    fn documentation_tools_are_the_catalogs() {
        let docs: Vec<_> = TOOLS.iter().filter(|t| t.handler == Handler::Doc).collect();
        assert_eq!(docs.len(), doc_tools::DOC_TOOLS.len());
        for (spec, tool) in docs.iter().zip(doc_tools::DOC_TOOLS) {
            assert_eq!(spec.name, tool.name);
            assert_eq!((spec.input_schema)(), (tool.input_schema)(), "{}", spec.name);
        }
        for t in TOOLS.iter().filter(|t| t.handler != Handler::Doc) {
            assert!(doc_tools::DOC_TOOLS.iter().all(|d| d.name != t.name), "{}", t.name);
        }
    }

    #[test]
    fn modes_match_the_handlers() {
        for t in TOOLS.iter().chain(TASK_TOOLS.iter()) {
            let expected = match t.handler {
                Handler::Doc | Handler::RuntimeInfo | Handler::Preview => Modes::ALL,
                Handler::Query | Handler::QueryWithInput | Handler::SubscribeEvents | Handler::UnsubscribeEvents => {
                    Modes::READ_WRITE
                }
                Handler::Invoke | Handler::InvokeWithInput | Handler::Background | Handler::ListTasks => Modes::WRITE,
            };
            assert_eq!(t.modes, expected, "{}", t.name);
        }
        assert_eq!(QUERY_ACTION.modes.need(), "read or write");
        assert_eq!(INVOKE_ACTION.modes.need(), "write");
    }
}
