//! The replies every part of the supervisor builds: a worker's answer (or
//! what went wrong on the way) as a tool reply, a finished call rendered for
//! the client, and the protocol-version test the result shapes depend on.

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject, ProtocolVersion};
use rmcp::service::RequestContext;
use serde_json::{Map, Value};
use snowluma_proto::{Diagnostics, FailureKind, Reply, ToolReply, WorkerError};

use crate::trace::CallTrace;
use crate::workers::CallError;

/// Five minutes, the spec's lifetime for list and catalog results.
pub(crate) const CACHE_TTL_MS: u64 = 5 * 60 * 1000;

/// Whether the request speaks the modern (2026-07-28 and later) protocol.
pub(crate) fn is_modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// The tool reply of a worker call that answers with a tool result: the
/// worker's own reply, or an error reply for what went wrong on the way.
pub(crate) fn tool_reply(worker: &str, r: Result<Reply, CallError>, write: bool) -> ToolReply {
    match r {
        Ok(Reply::Tool(t)) => t,
        Ok(Reply::Error(WorkerError::ReplyTooLarge { bytes, limit })) => {
            let message = format!("结果（{bytes} 字节）超过本服务器进程间 {limit} 字节的上限，无法传回。");
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
            replayed: false,
            retry_after_ms: None,
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
/// `traceparent` in `_meta`. The result is parsed once and moved into the
/// structured content (`json!` would copy it value by value).
pub fn render(reply: ToolReply, trace: &CallTrace) -> CallToolResult {
    let result = match &reply.result {
        Some(t) => t.parse().unwrap_or(Value::Null),
        None => Value::Null,
    };
    let text = if reply.is_error {
        reply.diagnostics.message.clone().unwrap_or_else(|| "tool call failed".to_owned())
    } else {
        pretty(&result, reply.result.as_ref().map_or(0, |t| t.0.len()))
    };
    let mut structured = Map::with_capacity(2);
    structured.insert("result".to_owned(), result);
    structured.insert("diagnostics".to_owned(), reply.diagnostics.to_json());
    let mut out = if reply.is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    out.structured_content = Some(Value::Object(structured));
    let mut meta = MetaObject::new();
    meta.insert("traceparent".into(), Value::String(trace.traceparent.clone()));
    out.meta = Some(meta);
    out
}

/// `value` as serde_json's pretty text (what `to_string_pretty` writes),
/// into a buffer sized once for a compact text of `compact_len` bytes:
/// indentation makes it longer, by how much depends on the nesting.
pub(crate) fn pretty(value: &Value, compact_len: usize) -> String {
    let mut buf = Vec::with_capacity(compact_len + compact_len / 2 + 16);
    if serde_json::to_writer_pretty(&mut buf, value).is_err() {
        return String::new();
    }
    // serde_json writes valid UTF-8; a failure would be its bug, shown as
    // replacement characters rather than a lost answer.
    String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// What kind of reply a worker sent, for an "answered unexpectedly" error.
fn reply_kind(r: &Reply) -> &'static str {
    match r {
        Reply::Tool(_) => "tool",
        Reply::Resource(_) => "resource",
        Reply::Error(_) => "error",
        Reply::Files(_) => "files",
        Reply::EventsClosed { .. } => "events closed",
        Reply::Tasks(_) => "tasks",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What `render` wrote before it moved the result: `json!` copies and
    /// `to_string_pretty`, kept as the reference its output must match.
    fn reference(reply: ToolReply, trace: &CallTrace) -> CallToolResult {
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

    /// Rendering moves the parsed result instead of copying it, and writes
    /// the pretty text into a presized buffer: the bytes on the wire are
    /// the same as before, for nested, escaped, empty, large and failed
    /// results.
    #[test]
    fn render_writes_what_the_copying_construction_wrote() {
        let trace = samples::trace();
        let replies = samples::replies();
        for (n, reply) in replies.into_iter().enumerate() {
            let ours = serde_json::to_string(&render(reply.clone(), &trace)).unwrap();
            let theirs = serde_json::to_string(&reference(reply, &trace)).unwrap();
            assert_eq!(ours, theirs, "reply {n}");
        }
    }
}

/// Sample results and a trace, for the tests of every rendering of a reply.
#[cfg(test)]
pub(crate) mod samples {
    use serde_json::{Value, json};
    use snowluma_proto::{Diagnostics, FailureKind, JsonText, ToolReply};

    use crate::trace::{CallTrace, TraceInput};

    /// A call's trace, with a fixed traceparent.
    pub(crate) fn trace() -> CallTrace {
        CallTrace {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: None,
            input: TraceInput::Absent,
            tracestate_rejected: false,
        }
    }

    /// Results nested, escaped, empty, large, unparsable, with a repeated
    /// key and absent; business failures; errors with and without a
    /// message; every diagnostic field.
    pub(crate) fn replies() -> Vec<ToolReply> {
        let deep = (0..40).fold(json!("core"), |v, i| json!({ format!("k{i}"): [v, i, null] }));
        let wide: Vec<Value> =
            (0..2000).map(|i| json!({"user_id": i, "nickname": "名字\n\"q\"", "x": 1.5e300, "y": -0.0})).collect();
        let mut every = Diagnostics::failed(FailureKind::RateLimited, "慢一点 \"quoted\"\n")
            .with_next_step("wait")
            .with_retry_after_ms(1500);
        every.replayed = true;
        vec![
            ToolReply::ok(&json!({"status": "ok", "retcode": 0, "data": {"online": true, "good": true}})),
            ToolReply::ok(&json!({"status": "failed", "retcode": 1400, "data": null, "wording": "x\u{7f}\u{1}"})),
            ToolReply::ok(&json!({})),
            ToolReply::ok(&json!([])),
            ToolReply::ok(&Value::Null),
            ToolReply::ok(&json!("a \u{1} control and \\ a backslash")),
            ToolReply::ok(&deep),
            ToolReply::ok(&Value::Array(wide)),
            ToolReply { result: Some(JsonText("not json".into())), ..ToolReply::ok(&Value::Null) },
            ToolReply {
                result: Some(JsonText(r#"{"a":1,"a":2,"big":123456789012345678901234567890}"#.into())),
                ..ToolReply::ok(&Value::Null)
            },
            ToolReply { result: None, ..ToolReply::ok(&Value::Null) },
            ToolReply::fail(FailureKind::Transport, "SnowLuma is unreachable"),
            ToolReply::error(Diagnostics::failed(FailureKind::Transport, "x").with_next_step("retry later")),
            ToolReply::error(every.clone()),
            ToolReply { diagnostics: every, ..ToolReply::ok(&json!({"a": "b"})) },
            ToolReply {
                diagnostics: Diagnostics { message: None, ..Diagnostics::success() },
                ..ToolReply::error(Diagnostics::success())
            },
        ]
    }
}
