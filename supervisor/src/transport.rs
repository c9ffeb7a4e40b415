//! Our stdio transport: newline-delimited JSON-RPC with the robustness that
//! rmcp's own stdio transport lacks.
//!
//! * A line that is not JSON gets a `-32700` parse error; a JSON value that
//!   is not a JSON-RPC message gets `-32600`; a known method with unusable
//!   params gets `-32602`; a line over [`MAX_LINE_BYTES`] gets `-32600`
//!   with the request id when it can be recovered. The server keeps serving.
//! * Until the MCP lifecycle has started (an `initialize`, or a modern
//!   request with complete `_meta` naming a supported version), notifications
//!   and stray responses are dropped: rmcp would otherwise end the session.
//! * Responses to modern (2026-07-28) requests carry
//!   `_meta["io.modelcontextprotocol/serverInfo"]`.
//!
//! Nothing but protocol messages is ever written to stdout.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::RoleServer;
use rmcp::model::JsonRpcMessage;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::stdio::Output;

/// Largest accepted input line (one JSON-RPC message).
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Bytes of an over-long line kept to recover its id.
const ID_SCAN_BYTES: usize = 64 * 1024;

/// Most requests in flight at once per session; the next is read only once
/// one is answered.
pub const MAX_IN_FLIGHT: usize = 256;
/// Most bytes of requests in flight at once per session (the request text;
/// the parsed form takes a few times that).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;

/// Longest wait for the client to read a progress notification before the
/// reply that follows it is written.
const READ_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

pub const SUPPORTED_VERSIONS: [&str; 4] = ["2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"];
const MODERN_FROM: &str = "2026-07-28";

/// MCP request methods this server knows; a request for one of them that
/// rmcp could not type is a params error, not an unknown method.
const KNOWN_METHODS: [&str; 13] = [
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
];

#[derive(Default)]
struct State {
    lifecycle_started: bool,
    /// Ids (as JSON text) of in-flight modern requests.
    modern: HashSet<String>,
    /// Ids (as JSON text) of every request handed to rmcp and not yet
    /// answered (or cancelled by the client): at stdin's end the session
    /// waits for these, so that no accepted call loses its reply. The value
    /// is the request's size in bytes.
    accepted: HashMap<String, usize>,
    /// Sum of the sizes in `accepted`.
    accepted_bytes: usize,
}

impl State {
    fn unaccept(&mut self, key: &str) {
        if let Some(n) = self.accepted.remove(key) {
            self.accepted_bytes -= n;
        }
    }

    /// Whether the calls in flight already use the session's budget: then
    /// no further message is read until some are answered (the client's
    /// writes wait), which bounds the memory pipelined calls can take.
    fn over_budget(&self) -> bool {
        self.accepted.len() >= MAX_IN_FLIGHT || self.accepted_bytes >= MAX_IN_FLIGHT_BYTES
    }
}

/// The sending side, shared by rmcp's sends and our own error replies.
struct Out {
    w: tokio::sync::Mutex<Output>,
    /// Set at the first failed write: the reader of stdout is gone.
    gone: AtomicBool,
    /// Wakes `receive` so that the session ends once stdout is gone.
    gone_notify: tokio::sync::Notify,
    /// Signalled each time an accepted request is answered or cancelled.
    answered: tokio::sync::Notify,
    /// How much of stdout the client has not read (sockets and pipes).
    unread: Option<crate::stdio::Unread>,
    /// The last message written was a progress notification.
    after_progress: AtomicBool,
}

impl Out {
    /// Write one message (a complete line). A failed write means stdout's
    /// reader is gone (or stdout is unusable): nothing more can be
    /// delivered, so the first failure is logged once and ends the session;
    /// later messages are discarded without another line.
    /// Wait (at most [`READ_WAIT`]) until the client has read everything
    /// written so far. Used between a progress notification and the reply
    /// that follows it: the TypeScript SDK handles notifications in a
    /// microtask but responses at once, so when both arrive in one read it
    /// meets the notification after the reply and reports an unknown
    /// progress token (the final update, which the spec sends just before
    /// a successful result, is then lost).
    async fn wait_read(&self) {
        let Some(unread) = &self.unread else { return };
        let deadline = tokio::time::Instant::now() + READ_WAIT;
        while unread.bytes().is_some_and(|n| n > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    async fn send_line(&self, line: Vec<u8>) {
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        let res = self.w.lock().await.write_all(line).await;
        if let Err(e) = res
            && !self.gone.swap(true, Ordering::AcqRel)
        {
            if crate::stdio::is_gone(&e) {
                tracing::error!(error = %e, "stdout was closed by the client; ending the session");
            } else {
                tracing::error!(error = %e, "cannot write to stdout; ending the session");
            }
            self.gone_notify.notify_one();
        }
    }
}

type Writer = Arc<Out>;

/// A handle on whether stdout failed, kept across the session.
pub struct StdoutState(Arc<Out>);

impl StdoutState {
    pub fn gone(&self) -> bool {
        self.0.gone.load(Ordering::Acquire)
    }
}

pub struct LineTransport {
    reader: BufReader<Box<dyn AsyncRead + Send + Sync + Unpin>>,
    /// The line being assembled. Kept here, not in the future, because rmcp
    /// polls `receive` inside `select!` and may drop it between reads: the
    /// read must be cancel-safe.
    line: Vec<u8>,
    /// Set once the current line exceeded the limit: the prefix kept for id recovery.
    overflow: Option<Vec<u8>>,
    /// Whether the end of stdin with calls in flight was logged (rmcp may
    /// drop and re-poll `receive` while they finish).
    eof_logged: bool,
    out: Writer,
    state: Arc<Mutex<State>>,
    server_info: Arc<Value>,
}

enum Line {
    Eof,
    Full(Vec<u8>),
    TooLong(Vec<u8>),
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("stdout: {0}")]
    Io(#[from] std::io::Error),
    #[error("serialize: {0}")]
    Json(#[from] serde_json::Error),
}

impl LineTransport {
    pub fn new(
        input: Box<dyn AsyncRead + Send + Sync + Unpin>,
        output: Output,
        unread: Option<crate::stdio::Unread>,
        server_info: Value,
    ) -> LineTransport {
        LineTransport {
            reader: BufReader::with_capacity(64 * 1024, input),
            line: Vec::new(),
            overflow: None,
            eof_logged: false,
            out: Arc::new(Out {
                w: tokio::sync::Mutex::new(output),
                gone: AtomicBool::new(false),
                gone_notify: tokio::sync::Notify::new(),
                answered: tokio::sync::Notify::new(),
                unread,
                after_progress: AtomicBool::new(false),
            }),
            state: Arc::default(),
            server_info: Arc::new(server_info),
        }
    }

    /// stdin/stdout, each direction driven according to what the host gave
    /// us (see [`crate::stdio`]).
    pub fn stdio(server_info: Value) -> LineTransport {
        let io = crate::stdio::open();
        tracing::debug!(stdin = io.in_kind.as_str(), stdout = io.out_kind.as_str(), "stdio");
        LineTransport::new(io.input, io.output, io.unread, server_info)
    }

    /// Set once stdout has failed: the session ended because the client is
    /// gone, not because it finished.
    pub fn stdout_state(&self) -> StdoutState {
        StdoutState(self.out.clone())
    }

    /// Cancel-safe: the only await is `fill_buf`, and bytes are moved into
    /// `self.line` in the same poll in which they are consumed.
    async fn read_line(&mut self) -> std::io::Result<Line> {
        loop {
            let avail = self.reader.fill_buf().await?;
            if avail.is_empty() {
                let line = std::mem::take(&mut self.line);
                return Ok(match self.overflow.take() {
                    Some(prefix) => Line::TooLong(prefix),
                    None if line.is_empty() => Line::Eof,
                    None => Line::Full(line),
                });
            }
            let (chunk, consumed, done) = match avail.iter().position(|b| *b == b'\n') {
                Some(i) => (&avail[..i], i + 1, true),
                None => (avail, avail.len(), false),
            };
            if self.overflow.is_none() {
                self.line.extend_from_slice(chunk);
                if self.line.len() > MAX_LINE_BYTES {
                    self.line.truncate(ID_SCAN_BYTES);
                    self.overflow = Some(std::mem::take(&mut self.line));
                }
            }
            self.reader.consume(consumed);
            if done {
                let line = std::mem::take(&mut self.line);
                return Ok(match self.overflow.take() {
                    Some(prefix) => Line::TooLong(prefix),
                    None => Line::Full(line),
                });
            }
        }
    }

    /// Wait until the calls in flight are within the session's budget
    /// ([`MAX_IN_FLIGHT`], [`MAX_IN_FLIGHT_BYTES`]). Cancel-safe.
    async fn wait_for_budget(&self) {
        let mut logged = false;
        loop {
            let answered = self.out.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if !self.state.lock().map(|s| s.over_budget()).unwrap_or(false) || self.out.gone.load(Ordering::Acquire) {
                return;
            }
            if !logged {
                tracing::debug!("calls in flight at the session's limit; reading stdin again once one is answered");
                logged = true;
            }
            tokio::select! {
                () = answered => {}
                () = self.out.gone_notify.notified() => {
                    // Leave the permit for `receive`, which ends the session.
                    self.out.gone_notify.notify_one();
                    return;
                }
            }
        }
    }

    /// stdin has ended. Every request already handed to rmcp is still
    /// answered: the session ends (this returns `None`) only once none is
    /// outstanding, each within its own timeout, or when stdout is gone. A
    /// SIGTERM still ends the process at once.
    async fn drain_at_eof(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Register before checking, so an answer in between is not missed.
            let answered = self.out.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            let outstanding = self.state.lock().map(|s| s.accepted.len()).unwrap_or(0);
            if outstanding == 0 || self.out.gone.load(Ordering::Acquire) {
                return None;
            }
            if !self.eof_logged {
                tracing::info!(calls = outstanding, "stdin ended; finishing the calls in flight");
                self.eof_logged = true;
            }
            tokio::select! {
                () = answered => {}
                () = self.out.gone_notify.notified() => return None,
            }
        }
    }

    /// Queue an error response. Written by its own task so that a dropped
    /// `receive` future can never leave half a message on stdout.
    fn reply_error(&self, id: Value, code: i64, message: String) {
        let v = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let out = self.out.clone();
        tokio::spawn(async move {
            match serde_json::to_vec(&v) {
                Ok(mut line) => {
                    line.push(b'\n');
                    out.send_line(line).await;
                }
                Err(e) => tracing::warn!(error = %e, "cannot serialize an error response"),
            }
        });
    }
}

/// Best-effort id recovery from the start of an over-long message: the
/// first `"id"` key that appears before `"params"`.
fn recover_id(prefix: &[u8]) -> Value {
    let text = String::from_utf8_lossy(prefix);
    let head = match text.find("\"params\"") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let Some(pos) = head.find("\"id\"") else { return Value::Null };
    let rest = head[pos + 4..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else { return Value::Null };
    let rest = rest.trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        if let Some(end) = s.find('"') {
            return json!(&s[..end]);
        }
        return Value::Null;
    }
    let num: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    num.parse::<i64>().map(|n| json!(n)).unwrap_or(Value::Null)
}

/// The few envelope fields the transport itself needs.
#[derive(serde::Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
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
    /// rmcp's rule for choosing the lifecycle: an `initialize`, or any other
    /// request (not ping or discover) with complete modern `_meta` naming a
    /// supported version.
    fn starts_lifecycle(&self) -> bool {
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
}

const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A completed `tools/call` result of text blocks (what this server
/// produces), written straight from borrowed fields. rmcp's own
/// serialization of a result goes through intermediate `Value`s; this
/// writes the same JSON, field for field and in the same order, with
/// `serverInfo` appended to `_meta` for modern requests. `None` for any
/// other response, which takes the general path.
fn fast_tool_response(
    r: &rmcp::model::JsonRpcResponse<rmcp::model::ServerResult>,
    server_info: Option<&Value>,
) -> Option<Vec<u8>> {
    use rmcp::model::{ContentBlock, ServerResult};
    use serde::ser::{SerializeMap, Serializer};

    struct Text<'a>(&'a str);
    impl serde::Serialize for Text<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(Some(2))?;
            m.serialize_entry("type", "text")?;
            m.serialize_entry("text", self.0)?;
            m.end()
        }
    }
    struct Meta<'a>(Option<&'a serde_json::Map<String, Value>>, Option<&'a Value>);
    impl serde::Serialize for Meta<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            for (k, v) in self.0.into_iter().flatten() {
                if self.1.is_none() || k != SERVER_INFO_KEY {
                    m.serialize_entry(k, v)?;
                }
            }
            if let Some(info) = self.1 {
                m.serialize_entry(SERVER_INFO_KEY, info)?;
            }
            m.end()
        }
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        result_type: Option<&'a rmcp::model::ResultType>,
        content: Vec<Text<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        structured_content: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Serialize)]
    struct Response<'a> {
        jsonrpc: &'static str,
        id: &'a rmcp::model::RequestId,
        result: Body<'a>,
    }

    let ServerResult::CallToolResult(res) = &r.result else { return None };
    let mut content = Vec::with_capacity(res.content.len());
    for block in &res.content {
        match block {
            ContentBlock::Text(t) if t.meta.is_none() && t.annotations.is_none() => content.push(Text(&t.text)),
            _ => return None,
        }
    }
    let meta = match (&res.meta, server_info) {
        (None, None) => None,
        (m, info) => Some(Meta(m.as_ref().map(|m| &m.0), info)),
    };
    let out = Response {
        jsonrpc: "2.0",
        id: &r.id,
        result: Body {
            result_type: res.result_type.as_ref(),
            content,
            structured_content: res.structured_content.as_ref(),
            is_error: res.is_error,
            meta,
        },
    };
    serde_json::to_vec(&out).ok()
}

/// `tools/call`, the hot path, parsed straight into its rmcp type. rmcp's
/// generic message type is an untagged enum that tries each request kind in
/// turn (buffering the message and building an error for every miss); this
/// builds the same value directly: `params._meta` moves into the request's
/// extensions, exactly as rmcp's own parse leaves it. `None` (malformed
/// params) falls back to the generic parse and its error reporting.
fn parse_call_tool(line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
    #[derive(serde::Deserialize)]
    struct Call {
        id: rmcp::model::RequestId,
        params: rmcp::model::CallToolRequestParams,
    }
    let Call { id, mut params } = serde_json::from_slice(line).ok()?;
    let meta = params.meta.take();
    let mut request = rmcp::model::CallToolRequest::new(params);
    if let Some(meta) = meta {
        request.extensions.insert(meta);
    }
    Some(JsonRpcMessage::Request(rmcp::model::JsonRpcRequest::new(
        id,
        rmcp::model::ClientRequest::CallToolRequest(request),
    )))
}

fn id_key(id: &rmcp::model::RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

impl Transport<RoleServer> for LineTransport {
    type Error = TransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let state = self.state.clone();
        let server_info = self.server_info.clone();
        async move {
            let id = match &item {
                JsonRpcMessage::Response(r) => Some(id_key(&r.id)),
                JsonRpcMessage::Error(e) => e.id.as_ref().map(id_key),
                _ => None,
            };
            let modern = match id {
                Some(key) => state
                    .lock()
                    .map(|mut s| {
                        s.unaccept(&key);
                        s.modern.remove(&key)
                    })
                    .unwrap_or(false),
                None => false,
            };
            let fast = match &item {
                JsonRpcMessage::Response(r) => fast_tool_response(r, modern.then_some(&*server_info)),
                _ => None,
            };
            let mut line = if let Some(line) = fast {
                line
            } else if modern {
                // Only modern results need rewriting: add serverInfo to `_meta`.
                let mut v = serde_json::to_value(&item)?;
                if let Some(Value::Object(result)) = v.get_mut("result")
                    && let Value::Object(m) = result.entry("_meta").or_insert_with(|| json!({}))
                {
                    m.insert(SERVER_INFO_KEY.into(), Value::clone(&server_info));
                }
                serde_json::to_vec(&v)?
            } else {
                serde_json::to_vec(&item)?
            };
            line.push(b'\n');
            let is_reply = matches!(item, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_));
            let is_progress = matches!(
                &item,
                JsonRpcMessage::Notification(n) if matches!(n.notification, rmcp::model::ServerNotification::ProgressNotification(_))
            );
            if is_reply && out.after_progress.swap(false, Ordering::AcqRel) {
                out.wait_read().await;
            }
            // A write failure is handled (logged once, session ended) by
            // `send_line`; telling rmcp as well would only log it again.
            out.send_line(line).await;
            if is_progress {
                out.after_progress.store(true, Ordering::Release);
            }
            out.answered.notify_one();
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if self.out.gone.load(Ordering::Acquire) {
                return None;
            }
            self.wait_for_budget().await;
            let out = self.out.clone();
            // `read_line` is cancel-safe, so losing this race loses no input.
            let read = tokio::select! {
                () = out.gone_notify.notified() => return None,
                r = self.read_line() => r,
            };
            let line = match read {
                Ok(Line::Eof) => return self.drain_at_eof().await,
                Ok(Line::Full(bytes)) => bytes,
                Ok(Line::TooLong(prefix)) => {
                    tracing::warn!(limit = MAX_LINE_BYTES, "input message over the size limit rejected");
                    self.reply_error(
                        recover_id(&prefix),
                        -32600,
                        format!("message exceeds the {MAX_LINE_BYTES}-byte limit"),
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stdin read failed; ending the session");
                    return None;
                }
            };
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            // A cheap look at the envelope (method, id, `_meta` version) ...
            let peek: Peek = match trimmed.first() {
                Some(b'{') => match serde_json::from_slice(trimmed) {
                    Ok(p) => p,
                    Err(e) => {
                        // Valid JSON whose envelope fields have the wrong
                        // types (e.g. params a string) is a bad request, not a
                        // parse error.
                        match serde_json::from_slice::<Value>(trimmed) {
                            Ok(v) => {
                                let id = v.get("id").cloned().unwrap_or(Value::Null);
                                let code = if v.get("method").is_some_and(Value::is_string) { -32602 } else { -32600 };
                                self.reply_error(id, code, format!("Invalid Request: {e}"));
                            }
                            Err(e) => self.reply_error(Value::Null, -32700, format!("Parse error: {e}")),
                        }
                        continue;
                    }
                },
                _ => {
                    let (code, msg) = match serde_json::from_slice::<serde::de::IgnoredAny>(trimmed) {
                        Ok(_) => (
                            -32600,
                            "Invalid Request: expected a JSON-RPC object (batches are not supported)".to_owned(),
                        ),
                        Err(e) => (-32700, format!("Parse error: {e}")),
                    };
                    self.reply_error(Value::Null, code, msg);
                    continue;
                }
            };
            let is_request = peek.method.is_some() && peek.id.is_some();
            if peek.jsonrpc.as_deref() != Some("2.0") {
                if let (true, Some(id)) = (is_request, peek.id) {
                    self.reply_error(id, -32600, "Invalid Request: jsonrpc must be \"2.0\"".into());
                }
                continue;
            }
            // ... then the typed parse, straight from the bytes.
            let fast = match (peek.method.as_deref(), &peek.id) {
                (Some("tools/call"), Some(_)) => parse_call_tool(trimmed),
                _ => None,
            };
            let parsed = match fast {
                Some(m) => Ok(m),
                None => serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(trimmed),
            };
            let msg: RxJsonRpcMessage<RoleServer> = match parsed {
                Ok(m) => m,
                Err(e) => {
                    match (peek.method.is_some(), peek.id) {
                        (true, Some(id)) => self.reply_error(id, -32602, format!("Invalid params: {e}")),
                        _ => tracing::debug!("dropping an unusable notification or response"),
                    }
                    continue;
                }
            };
            // rmcp turns a known method with unusable params into a custom
            // request (answered "method not found"); it is invalid params.
            if let JsonRpcMessage::Request(r) = &msg
                && let rmcp::model::ClientRequest::CustomRequest(c) = &r.request
                && KNOWN_METHODS.contains(&c.method.as_str())
            {
                let id = peek.id.clone().unwrap_or(Value::Null);
                self.reply_error(id, -32602, format!("Invalid params for {}", c.method));
                continue;
            }
            let version = peek.params.as_ref().and_then(|p| p.meta.as_ref()).and_then(|m| m.version.as_deref());
            if let Ok(mut st) = self.state.lock() {
                if !st.lifecycle_started {
                    if !is_request {
                        tracing::debug!("dropping a notification or response that arrived before the session started");
                        continue;
                    }
                    if peek.starts_lifecycle() {
                        st.lifecycle_started = true;
                    }
                }
                if is_request {
                    if let Some(id) = &peek.id {
                        let key = id.to_string();
                        st.accepted_bytes += trimmed.len();
                        if let Some(old) = st.accepted.insert(key, trimmed.len()) {
                            // A duplicate id: the older entry is replaced.
                            st.accepted_bytes -= old;
                        }
                        if version.is_some_and(|v| v >= MODERN_FROM) {
                            st.modern.insert(id.to_string());
                        }
                    }
                } else if peek.method.as_deref() == Some("notifications/cancelled")
                    && let Some(rid) = peek.params.as_ref().and_then(|p| p.request_id.as_ref())
                {
                    // A cancelled request gets no reply: nothing to wait for.
                    st.modern.remove(&rid.to_string());
                    st.unaccept(&rid.to_string());
                    self.out.answered.notify_one();
                }
            }
            return Some(msg);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.out.w.lock().await.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast `tools/call` parse yields exactly what rmcp's generic parse
    /// does: same request, same params, same `_meta` in the extensions.
    #[test]
    fn fast_tools_call_parse_matches_rmcp() {
        use rmcp::model::{ClientRequest, RequestMetaObject};
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"query_action","arguments":{"action":"get_status"}}}"#,
            r#"{"jsonrpc":"2.0","id":"a-b","method":"tools/call","params":{"name":"x","arguments":{"n":1.5,"big":18446744073709551615,"s":"\u00e9"},"_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","progressToken":7,"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"y","requestState":"abc","_meta":{}}}"#,
        ] {
            let fast = parse_call_tool(line.as_bytes()).expect("fast parse");
            let slow: RxJsonRpcMessage<RoleServer> = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&slow).unwrap(), "{line}");
            let parts = |m: &RxJsonRpcMessage<RoleServer>| match m {
                JsonRpcMessage::Request(r) => match &r.request {
                    ClientRequest::CallToolRequest(c) => {
                        (r.id.clone(), c.params.clone(), c.extensions.get::<RequestMetaObject>().cloned())
                    }
                    _ => panic!("not a tools/call"),
                },
                _ => panic!("not a request"),
            };
            assert_eq!(parts(&fast), parts(&slow), "{line}");
        }
        // Params that are not a tools/call shape are left to the generic parse.
        assert!(parse_call_tool(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#).is_none());
        assert!(
            parse_call_tool(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#).is_none()
        );
    }

    /// The direct writer of tool results produces exactly rmcp's JSON
    /// (legacy), and rmcp's JSON with serverInfo added to `_meta` (modern).
    #[test]
    fn fast_tool_response_matches_rmcp() {
        use rmcp::model::{CallToolResult, ContentBlock, JsonRpcResponse, MetaObject, ServerResult};
        let info = json!({"name": "snowluma-mcp", "version": "1"});
        let mut with_meta = CallToolResult::success(vec![ContentBlock::text("{\n  \"a\": \"é\\n\"\n}")]);
        with_meta.structured_content =
            Some(json!({"result": {"a": 1, "b": [null, -5, 1.5]}, "diagnostics": {"outcome": "success"}}));
        let mut m = MetaObject::new();
        m.insert("traceparent".into(), json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        with_meta.meta = Some(m);
        let mut error = CallToolResult::error(vec![ContentBlock::text("boom")]);
        error.structured_content =
            Some(json!({"result": null, "diagnostics": {"outcome": "failed", "kind": "transport"}}));
        let mut legacy = CallToolResult::success(vec![]);
        legacy.result_type = None;
        for (n, result) in [with_meta, error, legacy].into_iter().enumerate() {
            let resp = JsonRpcResponse {
                jsonrpc: rmcp::model::JsonRpcVersion2_0,
                id: rmcp::model::NumberOrString::Number(n as i64),
                result: ServerResult::CallToolResult(result),
            };
            let fast = fast_tool_response(&resp, None).expect("text-only result");
            let rmcp_bytes = serde_json::to_vec(&JsonRpcMessage::<
                rmcp::model::ServerRequest,
                _,
                rmcp::model::ServerNotification,
            >::Response(resp.clone()))
            .unwrap();
            assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(rmcp_bytes.clone()).unwrap(), "case {n}");
            let modern = fast_tool_response(&resp, Some(&info)).unwrap();
            let mut expect: Value = serde_json::from_slice(&rmcp_bytes).unwrap();
            if let Value::Object(m) =
                expect["result"].as_object_mut().unwrap().entry("_meta").or_insert_with(|| json!({}))
            {
                m.insert(SERVER_INFO_KEY.into(), info.clone());
            }
            assert_eq!(String::from_utf8(modern).unwrap(), serde_json::to_string(&expect).unwrap(), "modern case {n}");
        }
        // Anything but text blocks is left to rmcp.
        let resp = JsonRpcResponse {
            jsonrpc: rmcp::model::JsonRpcVersion2_0,
            id: rmcp::model::NumberOrString::Number(9),
            result: ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::image(
                "AAAA",
                "image/png",
            )])),
        };
        assert!(fast_tool_response(&resp, None).is_none());
    }

    #[test]
    fn recovers_ids() {
        assert_eq!(recover_id(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"x":"#), json!(42));
        assert_eq!(recover_id(br#"{"id": "abc", "method":"x"}"#), json!("abc"));
        assert_eq!(recover_id(br#"{"method":"x","params":{"id":5"#), Value::Null);
    }
}
