//! Direct calls: a query tool's `tools/call` (`query_action` and its kind)
//! answered from the transport, straight from its line, without rmcp.
//!
//! rmcp would parse the line into its message types, hand the request to a
//! spawned task of its own with a request context, and its answer back
//! through its loop to our `send`; each step builds and moves large values
//! (PERFORMANCE.md, "Latency and throughput"). A call taken here is read once from
//! its line (borrowed: the id, the tool's name, the arguments' text, the
//! `_meta` when there is one), runs the same gates and execution as rmcp's
//! handler (`ServerState::begin`, then `Begun::finish`: every gate, the
//! audit records, the executor; the gates and the request itself in the
//! turn that read the line), and its answer is written as rmcp writes a legacy
//! session's `tools/call` response, byte for byte ([`answer_line`], tested
//! against rmcp's own rendering), by the same writer as rmcp's answers.
//! A call whose request went to the network executor alone (the usual
//! `query_action`) has no task: its reply is handed to its end where the
//! executor's messages are read (`Sent::then`), which writes the answer
//! then; any other call (a refusal, audit, a key, a transfer, an executor
//! starting) is finished by a task of its own (`Begun::finish`).
//! Only a call rmcp would answer in exactly that way is taken; anything
//! else (including any line this reading refuses) goes on to rmcp:
//! - the session began with `initialize`, whose answer negotiated a
//!   version before 2026-07-28 (so rmcp checks nothing per request and
//!   strips the result to the legacy shape);
//! - the request's `_meta` has no protocol version, client capabilities or
//!   progress token, in any form (a modern request; progress needs rmcp's
//!   peer);
//! - the tool is a query tool, its name is written without escapes, the
//!   call carries no continuation (`inputResponses`, `requestState`), and
//!   its arguments are an object.
//!
//! Cancellation works as under rmcp: a `notifications/cancelled` for a
//! direct call cancels its token, or its request (`Waiting::cancel`: the
//! executor is told, as `Sent::reply` tells it), and a call that ends
//! cancelled gets no answer, its log line written at once (rmcp drops a
//! cancelled request's response).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::model::{RequestId, RequestMetaObject};
use serde_json::Value;
use serde_json::value::RawValue;
use snowluma_proto::json::Transcoded;
use snowluma_proto::{Diagnostics, ToolReply};
use tokio_util::sync::CancellationToken;

use super::envelope::{self, Peek, Reject};
use crate::calllog::Closing;
use crate::execution::Begun;
use crate::gates::{Args, exec_arguments};
use crate::state::ServerState;
use crate::tools::{self, Handler, ToolSpec};
use crate::trace::CallTrace;
use crate::workers::{CallError, Waiting};

/// The server's state, for the calls taken here, and their tokens.
pub(crate) struct Direct {
    state: Arc<ServerState>,
    /// Calls in flight, by request id (as JSON text), each with its number
    /// (a reused id replaces the entry, as in rmcp's own table).
    calls: Mutex<HashMap<String, (u64, Running)>>,
    next: AtomicU64,
}

/// How a call in flight is cancelled.
enum Running {
    /// Run by a task of its own: its token.
    Task(CancellationToken),
    /// Its request is with the network executor, its reply handed to its
    /// end where it is read ([`crate::workers::Sent::then`]).
    Sent(Waiting),
}

/// What a call taken here needs from the transport to be answered
/// (cloned only for a call that is taken).
pub(super) struct Answer<'a> {
    pub(super) out: &'a Arc<super::Out>,
    pub(super) session: &'a Arc<Mutex<super::State>>,
}

/// A `tools/call` line as a direct call reads it, borrowed from the line.
/// A line of any other shape (a name with escapes, a duplicate member) is
/// declined: rmcp's parse then answers it.
#[derive(serde::Deserialize)]
struct CallLine<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: RequestId,
    #[serde(borrow)]
    method: &'a str,
    #[serde(borrow)]
    params: CallParams<'a>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallParams<'a> {
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<&'a RawValue>,
    #[serde(borrow)]
    name: &'a str,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input_responses: Option<&'a RawValue>,
    #[serde(borrow, default)]
    request_state: Option<&'a RawValue>,
}

/// The `_meta` keys that make a call rmcp's (in any form: the general
/// path judges them): a protocol version or client capabilities (a modern
/// request), a progress token (progress needs rmcp's peer).
const RMCP_META_KEYS: [&str; 3] =
    ["io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities", "progressToken"];

/// A direct call as read from its line.
pub(super) struct Read<'a> {
    id: RequestId,
    spec: ToolSpec,
    arguments: &'a RawValue,
    meta: RequestMetaObject,
}

impl Read<'_> {
    /// Its envelope, as the session's accounting sees it.
    pub(super) fn peek(&self) -> Peek<'static> {
        Peek::call(match &self.id {
            RequestId::Number(n) => Value::from(*n),
            RequestId::String(s) => Value::from(&**s),
        })
    }
}

/// Read `line` as a direct call: a JSON-RPC 2.0 `tools/call` request of a
/// query tool, its arguments an object, no continuation, and no `_meta`
/// that makes it rmcp's. `None` for any other line (it takes the general
/// path, whose answer to it is rmcp's).
pub(super) fn read(line: &[u8]) -> Option<Read<'_>> {
    let CallLine { jsonrpc, id, method, params: p } = serde_json::from_slice::<CallLine>(line).ok()?;
    if jsonrpc != "2.0" || method != "tools/call" || p.input_responses.is_some() || p.request_state.is_some() {
        return None;
    }
    let spec = tools::find(p.name).filter(|t| t.handler == Handler::Query)?;
    // rmcp's arguments are an object (or absent, or null: declined).
    let arguments = p.arguments.filter(|a| a.get().starts_with('{'))?;
    let meta = match p.meta {
        None => RequestMetaObject::default(),
        Some(m) => serde_json::from_str::<RequestMetaObject>(m.get()).ok()?,
    };
    if RMCP_META_KEYS.iter().any(|k| meta.contains_key(*k)) {
        return None;
    }
    Some(Read { id, spec, arguments, meta })
}

/// A call taken, with what its answer needs.
struct Call {
    spec: ToolSpec,
    trace: CallTrace,
    id: RequestId,
    /// The id as JSON text: the key of the session's and our tables.
    key: String,
    started: Instant,
}

impl Direct {
    pub(crate) fn new(state: Arc<ServerState>) -> Arc<Direct> {
        Arc::new(Direct { state, calls: Mutex::new(HashMap::new()), next: AtomicU64::new(0) })
    }

    /// The client cancelled the request `key`: a direct call's token, or
    /// its request, whose reply goes to no one then ([`Waiting::cancel`]).
    pub(super) fn cancel(&self, key: &str) {
        let sent = match self.calls.lock() {
            Ok(calls) => match calls.get(key) {
                Some((_, Running::Task(ct))) => {
                    ct.cancel();
                    None
                }
                Some((_, Running::Sent(waiting))) => Some(waiting.clone()),
                None => None,
            },
            Err(_) => None,
        };
        // Out of the lock: the call's end takes it.
        if let Some(waiting) = sent {
            waiting.cancel();
        }
    }

    /// Start the direct call `read` from a `len`-byte line whose envelope
    /// is `peek` ([`Read::peek`]): it is accounted for in the session's
    /// budget and running. `audit`: the audit log digests `params` (so they
    /// count as parsed). `Some`: refused unparsed (too large), as the
    /// general path refuses it. A session whose state is unusable drops
    /// the line, as the general path does.
    pub(super) fn start(
        self: &Arc<Self>,
        len: usize,
        read: Read<'_>,
        peek: &Peek<'_>,
        audit: bool,
        answer: Answer<'_>,
    ) -> Option<Reject> {
        let Read { id, spec, arguments, meta } = read;
        // The arguments, read once: for the call's memory cost, then for
        // the gates.
        let raw: Arc<RawValue> = Arc::from(arguments.to_owned());
        let args = exec_arguments(Args::Raw(raw.clone()));
        let all = envelope::values(arguments.get().as_bytes());
        let cost = envelope::exec_cost(len, all, args.params.as_ref().and_then(|p| p.text()), audit);
        if cost > envelope::MAX_MESSAGE_COST {
            return Some(envelope::too_large(peek, cost));
        }
        // Kept out of rmcp's own request lines, so shown here, to
        // SNOWLUMA_MCP_LOG_PAYLOADS=1 only.
        tracing::debug!(target: "payloads", tool = spec.name, arguments = raw.get(), "tools/call arguments");
        let key = super::id_key(&id);
        match answer.session.lock() {
            Ok(mut st) => st.admit_call(key.clone(), cost),
            Err(_) => return None,
        }
        let call = Call { spec, trace: CallTrace::from_meta(&meta), key, id, started: Instant::now() };
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(tool = spec.name, "tool call answered directly");
        // The gates and the request to the network executor now, in this
        // turn.
        let begun = self.state.begin(spec, args, &call.trace);
        let (out, session) = (answer.out.clone(), answer.session.clone());
        match begun {
            // Its reply is handed to the call's end where it is read: no
            // task waits for it.
            Begun::Sent { sent, action } => {
                let key = call.key.clone();
                let this = self.clone();
                let waiting = sent.then(move |result| {
                    let cancelled = matches!(result, Err(CallError::Cancelled));
                    let reply = crate::execution::sent_reply(&this.state, action, result);
                    if let Some((key, line, closing)) = this.ended(call, n, reply, cancelled) {
                        // Written now when stdout is free (the usual case);
                        // the log lines after it.
                        snowluma_proto::eager::spawn_eager(async move {
                            super::deliver_answer(&out, &session, &key, line).await;
                            closing.hold();
                        });
                    }
                });
                // In the table before the reply can come: it is read in a
                // later turn (unless it had come already and the call ended).
                if let Some(waiting) = waiting {
                    self.enter(&key, n, Running::Sent(waiting));
                }
            }
            // Anything else (a refusal, audit, a key, a transfer, a worker
            // starting) runs as a task.
            begun => {
                let ct = CancellationToken::new();
                self.enter(&call.key, n, Running::Task(ct.clone()));
                tokio::spawn(self.clone().run(call, begun, ct, n, out, session));
            }
        }
        None
    }

    /// Enter the call `n` in the table under `key` (a reused id replaces
    /// the entry, as in rmcp's own table).
    fn enter(&self, key: &str, n: u64, running: Running) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.insert(key.to_owned(), (n, running));
        }
    }

    /// Run a call taken and write its answer (none once it was cancelled).
    async fn run(
        self: Arc<Self>,
        call: Call,
        begun: Begun,
        ct: CancellationToken,
        n: u64,
        out: Arc<super::Out>,
        session: Arc<Mutex<super::State>>,
    ) {
        let reply = begun.finish(&self.state, call.spec, &call.trace, &ct).await;
        if let Some((key, line, closing)) = self.ended(call, n, reply, ct.is_cancelled()) {
            super::deliver_answer(&out, &session, &key, line).await;
            closing.hold();
        }
    }

    /// The end of the call `n`: out of the table, and its answer line with
    /// its key and its log lines, to be held once the answer is written
    /// (none once it was cancelled: its log lines are written at once).
    fn ended(&self, call: Call, n: u64, reply: ToolReply, cancelled: bool) -> Option<(String, Vec<u8>, Closing)> {
        let Call { spec, trace, id, key, started } = call;
        if let Ok(mut calls) = self.calls.lock()
            && calls.get(&key).is_some_and(|(m, _)| *m == n)
        {
            calls.remove(&key);
        }
        let took = started.elapsed();
        if cancelled {
            Closing::new(spec, trace, &reply.diagnostics, took).write_now();
            return None;
        }
        let line = answer_line(&id, &reply, &trace);
        Some((key, line, Closing::new(spec, trace, &reply.diagnostics, took)))
    }
}

/// A finished call's answer as rmcp writes the `tools/call` response of a
/// legacy session (`replies::render`, the legacy strip, the response
/// envelope; `fast::fast_tool_response`'s bytes), without the newline:
/// `{"jsonrpc","id","result":{"content":[text],"structuredContent":
/// {"result","diagnostics"},"isError","_meta":{"traceparent"}}}`. The
/// result is parsed once.
pub(super) fn answer_line(id: &RequestId, reply: &ToolReply, trace: &CallTrace) -> Vec<u8> {
    // A successful result whose text a round trip writes back as it is
    // (the usual OneBot envelope) is written in one pass over it.
    if !reply.is_error
        && let Some(text) = &reply.result
        && let Some(canonical) = snowluma_proto::json::canonical(&text.0)
        && let Some(line) = canonical_answer_line(id, &canonical, &reply.diagnostics, trace)
    {
        return line;
    }
    #[derive(serde::Serialize)]
    struct Response<'a> {
        jsonrpc: &'static str,
        id: &'a RequestId,
        result: Body<'a>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        content: [Text<'a>; 1],
        structured_content: Structured<'a>,
        is_error: bool,
        #[serde(rename = "_meta")]
        meta: Meta<'a>,
    }
    #[derive(serde::Serialize)]
    struct Text<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        text: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Structured<'a> {
        result: Result<'a>,
        diagnostics: DiagnosticsJson<'a>,
    }
    /// The result in the structured content: its text written again
    /// (compact) as it is read, or the value it was parsed into.
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum Result<'a> {
        Text(Transcoded<'a>),
        Value(&'a Value),
    }
    #[derive(serde::Serialize)]
    struct Meta<'a> {
        traceparent: &'a str,
    }

    // A successful result's text is written twice as it is read (pretty
    // for the text block, compact in the structured content) instead of
    // being built as a value; text that would not read back the same that
    // way (a repeated key) or does not parse takes the value path.
    let transcoded = match (&reply.result, reply.is_error) {
        (Some(t), false) => pretty_transcoded(&t.0).map(|pretty| (pretty, Transcoded(&t.0))),
        _ => None,
    };
    let parsed;
    let (text, result) = match transcoded {
        Some((pretty, compact)) => (pretty, Result::Text(compact)),
        None => {
            let text_len = reply.result.as_ref().map_or(0, |t| t.0.len());
            parsed = match &reply.result {
                Some(t) => t.parse().unwrap_or(Value::Null),
                None => Value::Null,
            };
            let text = if reply.is_error {
                reply.diagnostics.message.clone().unwrap_or_else(|| "tool call failed".to_owned())
            } else {
                crate::replies::pretty(&parsed, text_len)
            };
            (text, Result::Value(&parsed))
        }
    };
    let out = Response {
        jsonrpc: "2.0",
        id,
        result: Body {
            content: [Text { kind: "text", text: &text }],
            structured_content: Structured { result, diagnostics: DiagnosticsJson(&reply.diagnostics) },
            is_error: reply.is_error,
            meta: Meta { traceparent: &trace.traceparent },
        },
    };
    // One buffer sized once: the text escaped (its newlines and quotes
    // grow it), the structured result (about the text's size, unindented)
    // and the envelope around them.
    let mut buf = Vec::with_capacity(text.len() * 5 / 2 + 512);
    if serde_json::to_writer(&mut buf, &out).is_err() {
        // Serializing borrowed strings and a parsed value into a Vec cannot
        // fail; were it to, the client still gets an answer.
        buf.clear();
        buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        buf.extend_from_slice(serde_json::to_string(id).unwrap_or_default().as_bytes());
        buf.extend_from_slice(br#","error":{"code":-32603,"message":"the answer could not be encoded"}}"#);
    }
    buf
}

/// [`answer_line`] for a successful result in canonical form
/// ([`snowluma_proto::json::canonical`]): the same bytes, the envelope
/// written around the two writings of the result. `None` if a part could
/// not be written (never, into a `Vec`): the caller then takes the general
/// path.
fn canonical_answer_line(
    id: &RequestId,
    result: &snowluma_proto::json::Canonical,
    diagnostics: &Diagnostics,
    trace: &CallTrace,
) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(result.pretty_escaped.len() + result.compact.len() + 256);
    buf.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut buf, id).ok()?;
    buf.extend_from_slice(br#","result":{"content":[{"type":"text","text":""#);
    buf.extend_from_slice(&result.pretty_escaped);
    buf.extend_from_slice(br#""}],"structuredContent":{"result":"#);
    buf.extend_from_slice(&result.compact);
    buf.extend_from_slice(br#","diagnostics":"#);
    serde_json::to_writer(&mut buf, &DiagnosticsJson(diagnostics)).ok()?;
    buf.extend_from_slice(br#"},"isError":false,"_meta":{"traceparent":"#);
    serde_json::to_writer(&mut buf, trace.traceparent.as_str()).ok()?;
    buf.extend_from_slice(b"}}}");
    Some(buf)
}

/// JSON text as serde_json's pretty printer writes the value it parses to,
/// written as it is read ([`Transcoded`]); `None` when that cannot be done.
fn pretty_transcoded(text: &str) -> Option<String> {
    let mut buf = Vec::with_capacity(text.len() + text.len() / 2 + 16);
    serde_json::to_writer_pretty(&mut buf, &Transcoded(text)).ok()?;
    String::from_utf8(buf).ok()
}

/// [`Diagnostics::to_json`]'s object, written without building it.
struct DiagnosticsJson<'a>(&'a Diagnostics);

impl serde::Serialize for DiagnosticsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let d = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("outcome", d.outcome.as_str())?;
        if let Some(k) = d.kind {
            m.serialize_entry("kind", k.as_str())?;
        }
        if let Some(msg) = &d.message {
            m.serialize_entry("message", msg)?;
        }
        if let Some(step) = &d.next_step {
            m.serialize_entry("next_step", step)?;
        }
        if d.replayed {
            m.serialize_entry("replayed", &true)?;
        }
        if let Some(ms) = d.retry_after_ms {
            m.serialize_entry("retry_after_ms", &ms)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::RoleServer;
    use rmcp::model::{JsonRpcMessage, ServerResult};
    use rmcp::service::TxJsonRpcMessage;
    use serde_json::json;

    use super::*;

    /// What rmcp writes for a legacy session's `tools/call` answer: the
    /// rendered result, stripped as rmcp's handler strips it for a legacy
    /// peer, in a response, through the writer's encoding.
    fn rmcps(id: &RequestId, reply: ToolReply, trace: &CallTrace) -> Vec<u8> {
        let mut result = ServerResult::CallToolResult(crate::replies::render(reply, trace));
        result.strip_result_type_for_legacy_peer();
        result.strip_non_object_output_for_legacy_peer();
        let item: TxJsonRpcMessage<RoleServer> = JsonRpcMessage::response(result, id.clone());
        super::super::writer::encode(&item, false, &json!({"name": "x"})).unwrap()
    }

    /// `reply`'s answer line is rmcp's, byte for byte, for each of `ids`.
    fn assert_answered_as_rmcp(ids: &[RequestId], reply: &ToolReply, trace: &CallTrace, what: &str) {
        for id in ids {
            let ours = String::from_utf8(answer_line(id, reply, trace)).unwrap();
            let theirs = String::from_utf8(rmcps(id, reply.clone(), trace)).unwrap();
            assert_eq!(ours, theirs, "{what}, id {id:?}");
        }
    }

    /// A direct call's answer is rmcp's, byte for byte: results nested,
    /// escaped, empty, large, unparsable and absent; business failures;
    /// errors with and without a message; every diagnostic field; numeric
    /// and string ids.
    #[test]
    fn answer_lines_are_rmcps() {
        let trace = crate::replies::samples::trace();
        let replies = crate::replies::samples::replies();
        let ids = [RequestId::Number(7), RequestId::Number(-1), RequestId::String("a \"quoted\" é id".into())];
        for (n, reply) in replies.into_iter().enumerate() {
            assert_answered_as_rmcp(&ids, &reply, &trace, &format!("reply {n}"));
        }
    }

    /// A successful result in canonical form takes the one-pass writing
    /// ([`canonical_answer_line`]), and its answer is still rmcp's, byte for
    /// byte: envelopes flat and nested, other top-level values, whitespace
    /// to drop, every diagnostic a success can carry.
    #[test]
    fn canonical_results_are_answered_as_rmcp_answers_them() {
        let trace = crate::replies::samples::trace();
        let ids = [RequestId::Number(7), RequestId::String("a \"quoted\" é id".into())];
        for text in [
            r#"{"status":"ok","retcode":0,"data":{"online":true,"good":true}}"#,
            r#"{"status":"ok","retcode":0,"data":[{"user_id":10001,"nickname":"é ✓ 😀"},{"user_id":-2}],"wording":""}"#,
            " { \"status\" : \"ok\" ,\n \"data\" : [ ] , \"x\": { } } ",
            "[1,2,3]",
            "null",
        ] {
            assert!(snowluma_proto::json::canonical(text).is_some(), "{text}");
            let mut reply = ToolReply {
                result: Some(snowluma_proto::JsonText(text.to_owned())),
                ..ToolReply::ok(&serde_json::Value::Null)
            };
            for replayed in [false, true] {
                reply.diagnostics.replayed = replayed;
                reply.diagnostics.retry_after_ms = replayed.then_some(1500);
                assert_answered_as_rmcp(&ids, &reply, &trace, text);
            }
        }
    }

    /// The lines taken here are read as rmcp reads them; every line that is
    /// not a plain call of a query tool is declined (and so answered by
    /// rmcp, whatever it makes of it).
    #[test]
    fn call_lines_are_read_as_rmcp_reads_them() {
        let taken =
            |line: &str| read(line.as_bytes()).map(|r| (r.id.clone(), r.spec.name, r.arguments.get().to_owned()));
        let call = |id: &str, params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#)
        };
        assert_eq!(
            taken(&call(
                "1e2",
                r#"{"name":"query_action","arguments":{"action":"get_status"},"_meta":{"traceparent":"x"}}"#
            )),
            Some((RequestId::Number(100), "query_action", r#"{"action":"get_status"}"#.to_owned()))
        );
        assert_eq!(
            taken(&call(r#""a\"b""#, r#"{"name":"query_action","arguments":{},"_meta":null}"#)).map(|t| t.0),
            Some(RequestId::String("a\"b".into()))
        );
        for line in [
            // Ids rmcp refuses, names with escapes, duplicate members,
            // missing or odd params.
            call("1.5", r#"{"name":"query_action","arguments":{}}"#),
            call("true", r#"{"name":"query_action","arguments":{}}"#),
            call("9223372036854775808", r#"{"name":"query_action","arguments":{}}"#),
            call("1", r#"{"name":"query\u005faction","arguments":{}}"#),
            call("1", r#"{"name":"query_action","name":"query_action","arguments":{}}"#),
            call("1", r#"{"arguments":{}}"#),
            call("1", r#""query_action""#),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#.to_owned(),
            // Not a query tool, not JSON-RPC 2.0, not tools/call, no id.
            call("1", r#"{"name":"invoke_action","arguments":{}}"#),
            call("1", r#"{"name":"get_action","arguments":{}}"#),
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"query_action","arguments":{}}}"#
                .to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"query_action","arguments":{}}}"#
                .to_owned(),
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"query_action","arguments":{}}}"#.to_owned(),
            // Arguments that are not an object; continuations.
            call("1", r#"{"name":"query_action"}"#),
            call("1", r#"{"name":"query_action","arguments":null}"#),
            call("1", r#"{"name":"query_action","arguments":[]}"#),
            call("1", r#"{"name":"query_action","arguments":{},"inputResponses":{}}"#),
            call("1", r#"{"name":"query_action","arguments":{},"requestState":"s"}"#),
            // `_meta` that makes it rmcp's, in any form, or is no object.
            call("1", r#"{"name":"query_action","arguments":{},"_meta":{"progressToken":1}}"#),
            call("1", r#"{"name":"query_action","arguments":{},"_meta":{"progressToken":true}}"#),
            call(
                "1",
                r#"{"name":"query_action","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}"#,
            ),
            call(
                "1",
                r#"{"name":"query_action","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":7}}"#,
            ),
            call(
                "1",
                r#"{"name":"query_action","arguments":{},"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#,
            ),
            call("1", r#"{"name":"query_action","arguments":{},"_meta":5}"#),
        ] {
            assert!(taken(&line).is_none(), "{line}");
        }
    }
}
