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
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) id: Option<Value>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
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
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow, default, deserialize_with = "opt_cow")]
    version: Option<Cow<'a, str>>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", default)]
    capabilities: Option<Value>,
}

/// An optional string borrowed from the line when it has no escapes
/// (serde's own `Option<Cow<str>>` always copies): `null` is `None`, any
/// other non-string the same "expected a string" error as serde's.
fn opt_cow<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    struct Str;
    impl<'de> serde::de::Visitor<'de> for Str {
        type Value = Cow<'de, str>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_owned()))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v))
        }
    }
    struct Opt;
    impl<'de> serde::de::Visitor<'de> for Opt {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(Str).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

impl Peek<'static> {
    /// The envelope of a `tools/call` request read whole elsewhere (a
    /// direct call's, `direct.rs`): `id`, and no `_meta` the transport
    /// looks at (such a call names no protocol version).
    pub(super) fn call(id: Value) -> Peek<'static> {
        Peek {
            jsonrpc: Some(Cow::Borrowed("2.0")),
            id: Some(id),
            method: Some(Cow::Borrowed("tools/call")),
            params: None,
        }
    }
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

/// Memory one parsed JSON value takes, roughly: a serde_json `Value` and its
/// share of the container around it (an array of zeros: 80 bytes per value
/// for two bytes of text).
pub const VALUE_BYTES: usize = std::mem::size_of::<Value>() + 16;
/// Copies of a forwarded text alive while its call is in flight: the
/// arguments kept by the transport, the IPC request, its frame.
const FORWARDED_COPIES: usize = 3;
/// The most memory one message may take while in flight, estimated before
/// it is parsed ([`cost_of_text`], [`call_cost`]); a request over it is
/// refused unparsed (`-32600`).
pub const MAX_MESSAGE_COST: usize = 32 * 1024 * 1024;

/// How many JSON values `text` holds, counted from its structure (`[`,
/// `{`, `,` and `:` outside strings): what a parse would build.
pub(super) fn values(text: &[u8]) -> usize {
    let (mut n, mut in_string, mut escaped) = (1, false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Memory of a message parsed whole into values (rmcp's generic parse also
/// buffers it once more on the way, hence two).
fn cost_of_text(text: &[u8]) -> usize {
    text.len() + 2 * VALUE_BYTES * values(text)
}

/// What a `tools/call` parsed by the fast path costs while in flight, and
/// what its parse costs wherever it happens (a message whose parse would
/// exceed [`MAX_MESSAGE_COST`] in any process is refused). Its arguments
/// stay text here: a documentation tool forwards them unread (the catalog
/// worker parses them), and `query_action` / `invoke_action` forward
/// `params` unread (parsing only the rest, and `params` too when the audit
/// log digests them); every other tool parses them (and input completion
/// keeps a copy).
fn call_cost(msg: &RxJsonRpcMessage<RoleServer>, len: usize, audit: bool) -> (usize, usize) {
    use crate::gates::{Args, exec_arguments};
    use crate::tools::Handler;
    let JsonRpcMessage::Request(r) = msg else { return (len, len) };
    let rmcp::model::ClientRequest::CallToolRequest(c) = &r.request else { return (len, len) };
    let Some(raw) = c.extensions.get::<super::RawArguments>() else { return (len, len) };
    let all = values(raw.0.get().as_bytes());
    match crate::tools::find(&c.params.name).map(|t| t.handler) {
        None => (len, len),
        Some(Handler::Doc) => (FORWARDED_COPIES * len, 2 * VALUE_BYTES * all),
        Some(Handler::Query | Handler::Invoke) => {
            let params = exec_arguments(Args::Raw(raw.0.clone())).params;
            let cost = exec_cost(len, all, params.as_ref().and_then(|p| p.text()), audit);
            (cost, cost)
        }
        Some(_) => {
            let cost = len + 2 * VALUE_BYTES * all;
            (cost, cost)
        }
    }
}

/// What a `query_action` / `invoke_action` call of a `len`-byte line
/// costs while in flight (its parse costs the same): the line's forwarded
/// copies, and the values of its arguments (`values`, counted by
/// [`values`]) that are parsed here, `params` (its text) only when the
/// audit log digests them.
pub(super) fn exec_cost(len: usize, values_in_arguments: usize, params: Option<&str>, audit: bool) -> usize {
    let inside = params.map(|t| values(t.as_bytes())).unwrap_or(0);
    let parsed = if audit { values_in_arguments } else { values_in_arguments.saturating_sub(inside) };
    FORWARDED_COPIES * len + 2 * VALUE_BYTES * parsed
}

pub(super) fn too_large(peek: &Peek, cost: usize) -> Reject {
    match (peek.is_request(), &peek.id) {
        (true, Some(id)) => Reject::Error {
            id: id.clone(),
            code: -32600,
            message: format!(
                "request too large to parse: about {} MiB once parsed, at most {} MiB per message (large data fits in query_action or invoke_action params, which are forwarded unparsed)",
                cost >> 20,
                MAX_MESSAGE_COST >> 20
            ),
        },
        _ => Reject::DropLogged("dropping a notification or response too large to parse"),
    }
}

/// The typed message of a line whose envelope [`peek`] accepted, and the
/// memory it takes while in flight (what the session's budget counts):
/// the fast `tools/call` parse, else rmcp's generic one. A message whose
/// estimate exceeds [`MAX_MESSAGE_COST`] is refused before it is parsed
/// (or, a fast-parsed call, before it is handed on). `audit`: the audit log
/// digests `params`.
pub(super) fn parse(line: &[u8], peek: &Peek, audit: bool) -> Result<(RxJsonRpcMessage<RoleServer>, usize), Reject> {
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
    let (parsed, cost) = match fast {
        Some(m) => {
            let (cost, parse) = call_cost(&m, line.len(), audit);
            if cost.max(parse) > MAX_MESSAGE_COST {
                return Err(too_large(peek, cost.max(parse)));
            }
            (Ok(m), cost)
        }
        None => {
            let cost = cost_of_text(line);
            if cost > MAX_MESSAGE_COST {
                return Err(too_large(peek, cost));
            }
            (serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line), cost)
        }
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
    Ok((msg, cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `Peek` was before its strings were borrowed: serde's own
    /// `Option<Cow<str>>`, whose errors the borrowing one must repeat.
    #[derive(serde::Deserialize)]
    struct Owned<'a> {
        #[serde(borrow, default)]
        #[allow(dead_code)]
        jsonrpc: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        #[allow(dead_code)]
        method: Option<Cow<'a, str>>,
    }

    /// The envelope's strings are borrowed from the line unless escaped,
    /// read the same either way, and any other type is refused with the
    /// same error and code as before (`-32602` once the method is a string,
    /// else `-32600`).
    #[test]
    fn peek_borrows_plain_strings_and_keeps_its_errors() {
        let p = match peek(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#) {
            Ok(p) => p,
            Err(_) => panic!("a plain request"),
        };
        assert!(matches!(p.method, Some(Cow::Borrowed("tools/call"))));
        assert!(matches!(p.jsonrpc, Some(Cow::Borrowed("2.0"))));
        let p = match peek(br#"{"jsonrpc":"2.0","id":1,"method":"tools\/call"}"#) {
            Ok(p) => p,
            Err(_) => panic!("an escaped method"),
        };
        assert_eq!(p.method.as_deref(), Some("tools/call"), "escapes are decoded");
        let p = match peek(br#"{"jsonrpc":"2.0","id":1,"method":null}"#) {
            Ok(p) => p,
            Err(_) => panic!("a null method is an absent one"),
        };
        assert!(p.method.is_none() && !p.is_request());
        let version = |line: &[u8]| match peek(line) {
            Ok(p) => p.params.and_then(|p| p.meta).and_then(|m| m.version).map(|v| v.into_owned()),
            Err(_) => panic!("a request with _meta"),
        };
        let meta = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        assert_eq!(version(meta).as_deref(), Some("2026-07-28"));
        // A string method makes it a request with bad params (-32602).
        for (line, want) in [
            (&br#"{"jsonrpc":"2.0","id":1,"method":5}"#[..], -32600),
            (br#"{"jsonrpc":2,"id":1,"method":"ping"}"#, -32602),
            (br#"{"jsonrpc":"2.0","id":1,"method":["ping"]}"#, -32600),
            (br#"{"jsonrpc":"2.0","id":1,"method":{"a":1}}"#, -32600),
            (br#"{"jsonrpc":true,"id":1}"#, -32600),
        ] {
            let theirs = match serde_json::from_slice::<Owned>(line) {
                Ok(_) => panic!("serde refuses {}", String::from_utf8_lossy(line)),
                Err(e) => format!("Invalid Request: {e}"),
            };
            match peek(line) {
                Err(Reject::Error { code, message, .. }) => {
                    assert_eq!((code, message), (want, theirs), "{}", String::from_utf8_lossy(line))
                }
                _ => panic!("refused: {}", String::from_utf8_lossy(line)),
            }
        }
        let bad_version = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":7}}}"#;
        match peek(bad_version) {
            Err(Reject::Error { code: -32602, message, .. }) => {
                assert!(message.contains("invalid type: integer `7`, expected a string"), "{message}")
            }
            _ => panic!("a version that is not a string is invalid params"),
        }
    }

    #[test]
    fn values_are_counted_outside_strings() {
        assert_eq!(values(b"0"), 1);
        assert_eq!(values(b"[0,0,0]"), 4);
        assert_eq!(values(br#"{"a":[1,{"b":null}]}"#), 7);
        assert_eq!(values(br#"["[,{:\"]"]"#), 2, "brackets and an escaped quote inside a string");
    }

    /// A request whose parse would take more than the limit is refused
    /// before it is parsed; forwarded params are counted as text.
    #[test]
    fn costs_refuse_large_trees_not_forwarded_text() {
        let zeros = |n: usize| std::iter::repeat_n("0", n).collect::<Vec<_>>().join(",");
        let call = |tool: &str, args: String| {
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
            )
        };
        let cost = |line: &str, audit: bool| {
            let line = line.as_bytes();
            let peek = peek(line).unwrap_or_else(|_| panic!("envelope"));
            match parse(line, &peek, audit) {
                Ok((_, cost)) => Ok(cost),
                Err(Reject::Error { code, message, .. }) => Err((code, message)),
                Err(_) => panic!("dropped"),
            }
        };
        let forwarded =
            call("query_action", format!(r#"{{"action":"get_status","params":{{"a":[{}]}}}}"#, zeros(1_000_000)));
        let c = cost(&forwarded, false).unwrap();
        assert!(c >= forwarded.len() && c < 4 * forwarded.len(), "params are forwarded text: {c}");
        let (code, message) = cost(&forwarded, true).unwrap_err();
        assert_eq!(code, -32600, "the audit digest parses params: {message}");
        let outside = call("query_action", format!(r#"{{"action":"get_status","junk":[{}]}}"#, zeros(1_000_000)));
        assert!(cost(&outside, false).is_err(), "other arguments are parsed");
        let doc = call("list_categories", format!(r#"{{"junk":[{}]}}"#, zeros(1_000_000)));
        assert!(cost(&doc, false).is_err(), "documentation arguments are parsed by the catalog worker");
        let doc = call("list_categories", format!(r#"{{"junk":"{}"}}"#, "x".repeat(1_000_000)));
        let c = cost(&doc, false).unwrap();
        assert!(c >= doc.len() && c < 4 * doc.len(), "and forwarded here as text: {c}");
        let prompt = call("query_action_with_input", format!(r#"{{"params":{{"a":[{}]}}}}"#, zeros(1_000_000)));
        assert!(cost(&prompt, false).is_err(), "input completion parses them");
        let read = format!(
            r#"{{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{{"uri":"x","junk":[{}]}}}}"#,
            zeros(1_000_000)
        );
        let (code, message) = cost(&read, false).unwrap_err();
        assert_eq!(code, -32600);
        assert!(message.contains("too large to parse"), "{message}");
        let small = call("query_action_with_input", format!(r#"{{"params":{{"a":[{}]}}}}"#, zeros(1000)));
        assert!(cost(&small, false).is_ok());
    }
}
