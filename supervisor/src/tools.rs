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

use snowluma_config::Mode;

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
    "列出所有 OneBot action（可按 category 过滤）。返回轻量索引（名称/分类/摘要/别名/是否只读/是否为 Stream Action）。",
    compact_list_schema,
);

pub const GET_ACTION: ToolSpec = doc(
    doc_tools::GET_ACTION,
    "获取某个 OneBot action 的完整文档：摘要、参数表、跨字段约束、返回、是否只读，以及可直接用于构造调用的参数 JSON Schema（inputSchema）。",
    any_object,
);

pub const SEARCH_ACTIONS: ToolSpec = doc(
    doc_tools::SEARCH_ACTIONS,
    "按关键字模糊搜索 action（匹配名称 / 摘要 / 别名）。返回轻量索引。",
    compact_list_schema,
);

pub const LIST_CATEGORIES: ToolSpec =
    doc(doc_tools::LIST_CATEGORIES, "列出所有分类及其 action 数量。", categories_schema);

pub const QUERY_ACTION: ToolSpec = ToolSpec {
    name: "query_action",
    description: "调用一个【只读】OneBot action（如 get_*/can_*）并返回完整响应。仅接受只读 action；写操作请用 invoke_action。",
    modes: Modes::READ_WRITE,
    input_schema: exec_input,
    result_schema: query_result_schema,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::Query,
};

pub const INVOKE_ACTION: ToolSpec = ToolSpec {
    name: "invoke_action",
    description: "调用一个 OneBot action（可产生副作用）。Stream 下载会写入 MCP 主机受控目录并只返回文件元数据；upload_file_stream 可用 execution.input_file 自动分块上传。仅在写模式可用。",
    modes: Modes::WRITE,
    input_schema: invoke_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::Invoke,
};

pub const GET_RUNTIME_INFO: ToolSpec = ToolSpec {
    name: crate::runtime::RuntimeInfoArgs::TOOL,
    description: "查看本服务器的有效配置，不联系 SnowLuma：模式、内置目录的版本与 action 数、执行限制以及 MCP 主机上的路径（不含端点地址与令牌）。check_connection=true 时（读/写模式）另外用只读通道查询 get_login_info、get_status 与 get_version_info。Describes this server's effective configuration without contacting SnowLuma.",
    modes: Modes::ALL,
    input_schema: crate::runtime::RuntimeInfoArgs::input_schema,
    result_schema: any_object,
    hints: CATALOG_READ,
    handler: Handler::RuntimeInfo,
};

pub const QUERY_ACTION_WITH_INPUT: ToolSpec = ToolSpec {
    name: "query_action_with_input",
    description: "同 query_action；若 params 缺少该 action 必需的字段，先通过输入表单（客户端需支持 form elicitation）向用户询问缺少的字段，不做任何猜测。参数齐全时直接执行。Like query_action, but first asks the user for missing required params.",
    modes: Modes::READ_WRITE,
    input_schema: exec_input,
    result_schema: query_result_schema,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::QueryWithInput,
};

pub const INVOKE_ACTION_WITH_INPUT: ToolSpec = ToolSpec {
    name: "invoke_action_with_input",
    description: "同 invoke_action（仅在写模式可用）；若 params 缺少该 action 必需的字段，先通过输入表单（客户端需支持 form elicitation）向用户询问，已提供的字段不会被回答改写。参数齐全时直接执行。Like invoke_action, but first asks the user for missing required params.",
    modes: Modes::WRITE,
    input_schema: invoke_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::InvokeWithInput,
};

pub const SUBSCRIBE_EVENTS: ToolSpec = ToolSpec {
    name: "subscribe_events",
    description: "为已登录账号 self_id（见 get_login_info）创建实时事件资源：此后收到的、符合 types（message 含 message_sent、notice、request；默认全部）、group_ids 与 user_ids（条件取交集；群过滤会排除没有 group_id 的事件）的事件被缓存（最多 256 条 / 1 MiB，超出时丢弃最旧的）。返回 snowluma://onebot/events/<id>：用 resources/read 读取（?after=<next_cursor> 取更新的条目），用 subscriptions/listen 或 resources/subscribe 接收更新通知，用 unsubscribe_events 释放。不发送任何 QQ 消息，也不执行任何 action。Creates a live event resource; sends nothing to QQ.",
    modes: Modes::READ_WRITE,
    input_schema: subscribe_events_input,
    result_schema: subscribe_events_result,
    hints: Hints { read_only: true, destructive: false, open_world: true },
    handler: Handler::SubscribeEvents,
};

pub const UNSUBSCRIBE_EVENTS: ToolSpec = ToolSpec {
    name: "unsubscribe_events",
    description: "释放 subscribe_events 创建的实时事件资源（丢弃其缓存）；释放最后一个时关闭事件连接。Releases a live event resource.",
    modes: Modes::READ_WRITE,
    input_schema: unsubscribe_events_input,
    result_schema: any_object,
    hints: Hints { read_only: true, destructive: false, open_world: false },
    handler: Handler::UnsubscribeEvents,
};

pub const PREVIEW_MESSAGE: ToolSpec = ToolSpec {
    name: "preview_message",
    description: "构造一条文本消息（群聊或私聊，可引用回复一条消息）的草稿，不发送、不联系 SnowLuma，所有模式可用。返回可读草稿、can_send（写模式、已配置端点且策略允许发送 action 时为 true）以及发送它所需的 invoke_action 参数；文本保持字面（不解析 CQ 码）。支持 MCP Apps 的主机会在带发送按钮的面板中显示它。Builds a message draft without sending anything.",
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
    description: "同 invoke_action（仅在写模式可用），但只接受目录中的 Stream Action（下载、通用流、带 execution.input_file 的 upload_file_stream），作为持久后台任务运行：先写入任务记录再开始，立即返回任务句柄；用 tasks/get 轮询状态与保存的结果。不会自动重试或重放。Runs a stream action as a persistent background task.",
    modes: Modes::WRITE,
    input_schema: exec_input,
    result_schema: invoke_result_schema,
    hints: Hints { read_only: false, destructive: true, open_world: true },
    handler: Handler::Background,
};

/// `list_tasks`: metadata of persisted tasks, no result bodies.
pub const LIST_TASKS: ToolSpec = ToolSpec {
    name: "list_tasks",
    description: "列出持久化的后台任务（只有元数据，不含结果），最早创建的在前。可选 cursor（取自 nextCursor）与 limit 1–100（默认 50）。Lists persisted background tasks.",
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
            "cursor": {"type": "string", "description": "上一页结果的 nextCursor。nextCursor of the previous page."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50, "description": "每页任务数（1–100，默认 50）。Tasks per page."}
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
/// `gates::ExecArgs`; `params` is checked against the action's own schema
/// by SnowLuma, not here).
fn exec_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "description": "action 名（接受别名）。先用 get_action 查它的参数 inputSchema。"},
            "params": {"type": "object", "description": "该 action 的参数对象", "additionalProperties": true},
            "execution": {
                "type": "object",
                "description": "MCP 主机侧执行选项（不会发送为 OneBot params）。自动上传本地文件时使用。",
                "properties": {
                    "input_file": {"type": "string", "description": "MCP 主机上的文件路径。仅用于 upload_file_stream，且必须位于 SNOWLUMA_MCP_UPLOAD_ROOT。"}
                },
                "additionalProperties": false
            }
        },
        "required": ["action"],
        "additionalProperties": false
    })
}

/// The input of `invoke_action` and `invoke_action_with_input`:
/// [`exec_input`] and `execution.idempotency_key` (`idempotency.rs`).
fn invoke_input() -> Value {
    let mut schema = exec_input();
    if let Some(props) = schema.pointer_mut("/properties/execution/properties").and_then(Value::as_object_mut) {
        props.insert(
            "idempotency_key".into(),
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": crate::idempotency::MAX_KEY_LEN,
                "pattern": "^[ -~]+$",
                "description": "幂等键（1–128 个可打印 ASCII 字符）：24 小时内以同一键、同一 action 与 params 再次调用时，返回首次调用记录的结果（diagnostics.replayed: true），不再联系 SnowLuma；同一键配不同参数是错误。结果未知（unknown）后用同一键重试是安全的。An idempotency key: a retry with the same key, action and params within 24 h returns the first call's recorded outcome without executing again."
            }),
        );
    }
    schema
}

fn id_filter(what: &str) -> Value {
    json!({
        "type": "array",
        "items": {"type": "integer", "minimum": 1},
        "minItems": 1,
        "maxItems": crate::events::MAX_IDS,
        "uniqueItems": true,
        "description": format!("只保留 {what} 属于这些值的事件（最多 100 个不同的正整数）。Keep only events whose {what} is one of these.")
    })
}

fn subscribe_events_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "self_id": {"type": "integer", "minimum": 1, "description": "已登录的机器人账号（get_login_info 返回的 user_id）；每个事件都必须属于它。The logged-in account."},
            "types": {
                "type": "array",
                "items": {"type": "string", "enum": ["message", "notice", "request"]},
                "minItems": 1,
                "uniqueItems": true,
                "description": "要保留的事件类别（message 含 message_sent）；省略时三类都要。Event categories to keep."
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
            "uri": {"type": "string", "description": "subscribe_events 返回的资源 URI。The URI subscribe_events returned."}
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
    // Built once per tool, then cloned: its schemas are shared (`Arc`), so
    // a listing builds no JSON (a tools/list built them all, ~150 µs).
    static BUILT: [std::sync::OnceLock<Tool>; TOOLS.len() + TASK_TOOLS.len()] =
        [const { std::sync::OnceLock::new() }; TOOLS.len() + TASK_TOOLS.len()];
    match TOOLS.iter().chain(TASK_TOOLS.iter()).position(|t| t.name == spec.name) {
        Some(i) => BUILT[i].get_or_init(|| build(spec)).clone(),
        None => build(spec),
    }
}

fn build(spec: ToolSpec) -> Tool {
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
    }
}
