//! JSON-RPC envelope checks on one input line: a cheap look at the fields
//! the transport needs (method, id, `_meta` version, a cancel's request id),
//! then the typed parse, each failure mapped to the answer it deserves
//! (`-32700`, `-32600`, `-32602`) or to a silent drop.

use std::borrow::Cow;

use rmcp::RoleServer;
use rmcp::model::JsonRpcMessage;
use rmcp::service::RxJsonRpcMessage;
use serde_json::Value;

pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"];
const MODERN_FROM: &str = "2026-07-28";

/// MCP request methods this server knows; a request for one of them that
/// rmcp could not type is a params error, not an unknown method.
const KNOWN_METHODS: [&str; 16] = [
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "prompts/list",
    "completion/complete",
    // The tasks extension's methods (a `taskId` that is not a string is
    // invalid params; whether tasks are offered is decided after parsing).
    "tasks/get",
    "tasks/cancel",
    "tasks/update",
];

/// Request methods the 2026-07-28 revision removed: a modern request for
/// one is answered "method not found" (-32601), whatever its params, as the
/// revision requires (over HTTP that is a 404).
const REMOVED_IN_MODERN: [&str; 5] =
    ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// What to do with a line that is not a usable message.
pub(super) enum Reject {
    /// Answer with this JSON-RPC error.
    Error { id: Value, code: i64, message: String },
    /// Drop it without a word (a notification or response).
    Drop,
    /// Drop it, with a debug line saying why.
    DropLogged(&'static str),
}

/// The few envelope fields the transport itself needs.
#[derive(serde::Deserialize)]
pub(super) struct Peek<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) id: Option<Value>,
    #[serde(borrow, default)]
    pub(super) method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<PeekParams<'a>>,
}

#[derive(serde::Deserialize)]
struct PeekParams<'a> {
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<PeekMeta<'a>>,
    #[serde(rename = "requestId", default)]
    request_id: Option<Value>,
}

#[derive(serde::Deserialize)]
struct PeekMeta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow, default)]
    version: Option<Cow<'a, str>>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", default)]
    capabilities: Option<Value>,
}

impl Peek<'_> {
    /// A request (a method and an id), not a notification or response.
    pub(super) fn is_request(&self) -> bool {
        self.method.is_some() && self.id.is_some()
    }

    /// rmcp's rule for choosing the lifecycle: an `initialize`, or any other
    /// request (not ping or discover) with complete modern `_meta` naming a
    /// supported version.
    pub(super) fn starts_lifecycle(&self) -> bool {
        match self.method.as_deref() {
            Some("initialize") => true,
            Some("ping") | Some("server/discover") | None => false,
            Some(_) => {
                let meta = self.params.as_ref().and_then(|p| p.meta.as_ref());
                meta.is_some_and(|m| {
                    m.version.as_deref().is_some_and(|v| SUPPORTED_VERSIONS.contains(&v))
                        && m.capabilities.as_ref().is_some_and(Value::is_object)
                })
            }
        }
    }

    /// A request of the modern (2026-07-28) era, by its `_meta` version.
    pub(super) fn is_modern(&self) -> bool {
        let version = self.params.as_ref().and_then(|p| p.meta.as_ref()).and_then(|m| m.version.as_deref());
        version.is_some_and(|v| v >= MODERN_FROM)
    }

    /// The request a `notifications/cancelled` withdraws.
    pub(super) fn cancelled_request(&self) -> Option<&Value> {
        if self.method.as_deref() != Some("notifications/cancelled") {
            return None;
        }
        self.params.as_ref().and_then(|p| p.request_id.as_ref())
    }
}

/// The envelope of a non-empty (trimmed) line: a JSON object with
/// `"jsonrpc": "2.0"` whose envelope fields have the right types.
pub(super) fn peek(line: &[u8]) -> Result<Peek<'_>, Reject> {
    let peek: Peek = match line.first() {
        Some(b'{') => match serde_json::from_slice(line) {
            Ok(p) => p,
            Err(e) => {
                // Valid JSON whose envelope fields have the wrong
                // types (e.g. params a string) is a bad request, not a
                // parse error.
                return Err(match serde_json::from_slice::<Value>(line) {
                    Ok(v) => {
                        let id = v.get("id").cloned().unwrap_or(Value::Null);
                        let code = if v.get("method").is_some_and(Value::is_string) { -32602 } else { -32600 };
                        Reject::Error { id, code, message: format!("Invalid Request: {e}") }
                    }
                    Err(e) => Reject::Error { id: Value::Null, code: -32700, message: format!("Parse error: {e}") },
                });
            }
        },
        _ => {
            let (code, message) = match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                Ok(_) => (-32600, "Invalid Request: expected a JSON-RPC object (batches are not supported)".to_owned()),
                Err(e) => (-32700, format!("Parse error: {e}")),
            };
            return Err(Reject::Error { id: Value::Null, code, message });
        }
    };
    if peek.jsonrpc.as_deref() != Some("2.0") {
        return Err(match (peek.is_request(), peek.id) {
            (true, Some(id)) => {
                Reject::Error { id, code: -32600, message: "Invalid Request: jsonrpc must be \"2.0\"".into() }
            }
            _ => Reject::Drop,
        });
    }
    Ok(peek)
}

/// The typed message of a line whose envelope [`peek`] accepted: the fast
/// `tools/call` parse, else rmcp's generic one.
pub(super) fn parse(line: &[u8], peek: &Peek) -> Result<RxJsonRpcMessage<RoleServer>, Reject> {
    if let (Some(method), Some(id)) = (peek.method.as_deref(), &peek.id)
        && peek.is_modern()
        && REMOVED_IN_MODERN.contains(&method)
    {
        return Err(Reject::Error {
            id: id.clone(),
            code: -32601,
            message: format!("Method not found: {method} (not part of protocol revision {MODERN_FROM})"),
        });
    }
    let fast = match (peek.method.as_deref(), &peek.id) {
        (Some("tools/call"), Some(_)) => super::fast::parse_call_tool(line),
        _ => None,
    };
    let parsed = match fast {
        Some(m) => Ok(m),
        None => serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line),
    };
    let msg = match parsed {
        Ok(m) => m,
        Err(e) => {
            return Err(match (peek.method.is_some(), &peek.id) {
                (true, Some(id)) => {
                    Reject::Error { id: id.clone(), code: -32602, message: format!("Invalid params: {e}") }
                }
                _ => Reject::DropLogged("dropping an unusable notification or response"),
            });
        }
    };
    // rmcp turns a known method with unusable params into a custom
    // request (answered "method not found"); it is invalid params.
    if let JsonRpcMessage::Request(r) = &msg
        && let rmcp::model::ClientRequest::CustomRequest(c) = &r.request
        && KNOWN_METHODS.contains(&c.method.as_str())
    {
        let id = peek.id.clone().unwrap_or(Value::Null);
        return Err(Reject::Error { id, code: -32602, message: format!("Invalid params for {}", c.method) });
    }
    Ok(msg)
}
