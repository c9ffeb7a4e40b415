//! Stream Actions, read as the Node server's client reads them: the request
//! with a connection timeout, the HTTP status, then the body frame by frame
//! (each read under the idle timeout), every frame numbered from 0 over all
//! frames received. A download or an automatic upload goes on in
//! [`super::transfer`]; anything else is a generic stream: a bounded
//! collection of frames ending in a `data.type: "response"` terminal.
//!
//! Failures are worded as Node words them (`action X stream frame 5: frame
//! received after terminal`, …); see [`super::errors`].

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, ToolReply, Transfer};
use tokio::time::Instant;

use super::client::{Net, request};
use super::envelope::{MAX_RESPONSE_DEPTH, classify};
use super::errors::{ExecFailure, FETCH_FAILED, MAX_CALL_STACK, Report, TERMINATED, cancelled};
use super::frames::{FrameSplitter, MAX_FRAME_BYTES, frame_failure, is_reset_ack, js_string};
use super::json_syntax;
use crate::serve::Ctx;

/// Generic streams: frames and summed frame text kept in the result.
pub const MAX_GENERIC_FRAMES: usize = 256;
pub const MAX_GENERIC_TEXT: usize = 256 * 1024;
/// Stream actions active at once.
pub const MAX_ACTIVE_STREAMS: usize = 4;

/// The message of `AbortSignal.timeout`'s abort, which Node's client quotes
/// as the reason when the reset after a failed upload runs out of time.
const ABORTED_BY_TIMEOUT: &str = "The operation was aborted due to timeout";

/// A stream action: a download or upload with its descriptor from the
/// supervisor, or a generic stream.
pub(super) async fn execute(
    net: &Net,
    fds: Option<&snowluma_proto::fdpass::FdReceiver>,
    req: ExecRequest,
    ctx: &Ctx,
) -> ToolReply {
    let tag = req.transfer.as_ref().map(|t| match t {
        Transfer::Download { fd_tag, .. } | Transfer::Upload { fd_tag, .. } => *fd_tag,
    });
    // A transfer refused before its descriptor is claimed must not leave
    // the descriptor (sent ahead of this request) in the table.
    let forget = || {
        if let (Some(tag), Some(rx)) = (tag, fds) {
            rx.discard(tag);
        }
    };
    let params = match req.params.parse() {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            forget();
            return ToolReply::fail(FailureKind::InvalidArguments, "params must be a JSON object");
        }
    };
    let Ok(_permit) = net.streams.clone().try_acquire_owned() else {
        forget();
        let a = &req.action;
        return ExecFailure {
            detail: format!("action {a} stream admission: active Stream Action limit reached ({MAX_ACTIVE_STREAMS})"),
            report: Report::Execution {
                next_step: Some("Wait for a running Stream Action to finish, then call again."),
            },
        }
        .reply(&req);
    };
    let transfer_fd = match tag {
        None => None,
        Some(tag) => {
            let claimed = match fds {
                Some(rx) => rx.claim(tag, Duration::from_secs(10)).await.map_err(|e| e.to_string()),
                None => Err("no descriptor channel".to_owned()),
            };
            match claimed {
                Ok(fd) => Some(std::fs::File::from(fd)),
                Err(e) => {
                    let a = &req.action;
                    return ExecFailure::execution(format!(
                        "action {a} stream prepare transfer: the transfer file did not arrive: {e}"
                    ))
                    .reply(&req);
                }
            }
        }
    };
    match (req.transfer.clone(), transfer_fd) {
        (Some(Transfer::Download { limit_bytes, .. }), Some(file)) => {
            tokio::select! {
                r = super::transfer::download(net, &req, params, file, limit_bytes, ctx) => r,
                _ = ctx.cancel.cancelled() => cancelled(req.write),
            }
        }
        (Some(Transfer::Upload { size, filename, chunk_bytes, .. }), Some(file)) => {
            super::transfer::upload(net, &req, params, file, size, filename, chunk_bytes, ctx).await
        }
        _ if req.file_action == Some(snowluma_proto::FileAction::Download) => {
            let a = &req.action;
            ExecFailure::execution(format!("action {a} stream prepare transfer: no download file was provided"))
                .reply(&req)
        }
        _ => tokio::select! {
            r = generic_stream(net, &req, params, ctx) => r,
            _ = ctx.cancel.cancelled() => cancelled(req.write),
        },
    }
}

/// Bounds of one stream exchange besides the idle timeout.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bounds {
    /// The whole exchange must be over by then (generic streams: a server
    /// trickling a byte at a time would otherwise hold one open for ever
    /// under the idle timeout). Checked after each read, so a stalled read
    /// is the idle timeout's to report.
    pub(crate) finish_by: Option<Instant>,
    /// An abort at this instant, worded as Node words its abort signal's
    /// timeout (the reset after a failed upload has 5 s of its own).
    pub(crate) abort_at: Option<Instant>,
}

impl Bounds {
    /// A generic stream's: finished within the request timeout.
    pub(crate) fn generic(net: &Net) -> Bounds {
        Bounds { finish_by: Some(Instant::now() + net.timeout), abort_at: None }
    }
}

/// Wait for `fut`, unless `abort_at` passes first.
async fn until<T>(abort_at: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match abort_at {
        None => Some(fut.await),
        Some(at) => tokio::time::timeout_at(at, fut).await.ok(),
    }
}

/// Send a Stream Action's request and check the response head, as Node
/// does: no head within the timeout is a connection timeout, a status
/// outside 2xx is refused.
pub(crate) async fn open(
    net: &Net,
    req: &ExecRequest,
    params: &Value,
    bounds: Bounds,
) -> Result<reqwest::Response, ExecFailure> {
    let a = &req.action;
    let ms = net.timeout.as_millis();
    let connection_timeout = || {
        ExecFailure::transport(
            FailureKind::Timeout,
            true,
            format!("action {a} stream connection: connection timeout after {ms}ms"),
        )
    };
    let send = tokio::time::timeout(net.timeout, request(net, req, params.clone()).send());
    let resp = match until(bounds.abort_at, send).await {
        None => {
            return Err(ExecFailure::transport(
                FailureKind::Timeout,
                true,
                format!("action {a} stream connection: cancelled: {ABORTED_BY_TIMEOUT}"),
            ));
        }
        Some(Err(_)) => return Err(connection_timeout()),
        // reqwest's own connect timeout is the same setting.
        Some(Ok(Err(e))) if e.is_timeout() => return Err(connection_timeout()),
        Some(Ok(Err(e))) => {
            return Err(ExecFailure::transport(
                FailureKind::Transport,
                !e.is_connect(),
                format!("action {a} stream connection: {FETCH_FAILED}"),
            ));
        }
        Some(Ok(Ok(r))) => r,
    };
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(ExecFailure::invalid(format!("action {a} stream HTTP: unexpected status {status}")));
    }
    // The statuses whose response has no body at all (fetch's `res.body` is null).
    if matches!(status, 204 | 205) {
        return Err(ExecFailure::invalid(format!("action {a} stream body: response body is unavailable")));
    }
    Ok(resp)
}

/// One frame of a stream body: its number (0-based over every frame
/// received), the envelope, and its size on the wire.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) index: u64,
    pub(crate) value: Value,
    pub(crate) raw_len: usize,
}

/// What [`FrameCursor::pop`] found.
#[derive(Debug)]
pub(crate) enum Pop {
    Frame(Frame),
    /// No whole frame yet: feed more bytes (or the end).
    NeedMore,
    /// The body ended well: nothing but whitespace after the last separator.
    End,
}

/// The pure part of reading a stream body: bytes in, numbered frames out,
/// checked as Node's client checks them.
pub(crate) struct FrameCursor<'a> {
    action: &'a str,
    splitter: FrameSplitter,
    ready: VecDeque<Vec<u8>>,
    next: u64,
    ended: bool,
}

impl<'a> FrameCursor<'a> {
    pub(crate) fn new(action: &'a str) -> FrameCursor<'a> {
        FrameCursor { action, splitter: FrameSplitter::default(), ready: VecDeque::new(), next: 0, ended: false }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.ready.extend(self.splitter.push(bytes));
    }

    /// The body has ended.
    pub(crate) fn end(&mut self) {
        self.ended = true;
    }

    /// Frames received so far (Node's `frameIndex`).
    pub(crate) fn count(&self) -> u64 {
        self.next
    }

    pub(crate) fn pop(&mut self) -> Result<Pop, ExecFailure> {
        let a = self.action;
        if let Some(raw) = self.ready.pop_front() {
            let index = self.next;
            self.next += 1;
            return parse_frame(a, index, &raw).map(Pop::Frame);
        }
        // What is left after the last separator may not grow without bound.
        if self.splitter.pending() > MAX_FRAME_BYTES {
            return Err(wire_limit(a, self.next));
        }
        if !self.ended {
            return Ok(Pop::NeedMore);
        }
        let rest = std::mem::take(&mut self.splitter).finish();
        let Ok(rest) = String::from_utf8(rest) else {
            return Err(not_utf8(a));
        };
        if !rest.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}').is_empty() {
            let n = self.next;
            return Err(ExecFailure::invalid(format!("action {a} stream EOF after frame {n}: unterminated frame")));
        }
        Ok(Pop::End)
    }
}

/// Reads a stream body frame by frame, as Node's client does.
pub(crate) struct FrameReader<'a> {
    net: &'a Net,
    action: &'a str,
    resp: reqwest::Response,
    cursor: FrameCursor<'a>,
    bounds: Bounds,
}

impl<'a> FrameReader<'a> {
    pub(crate) fn new(net: &'a Net, action: &'a str, resp: reqwest::Response, bounds: Bounds) -> FrameReader<'a> {
        FrameReader { net, action, resp, cursor: FrameCursor::new(action), bounds }
    }

    /// Frames received so far (Node's `frameIndex`).
    pub(crate) fn count(&self) -> u64 {
        self.cursor.count()
    }

    /// The next frame, or `None` at the end of a well-terminated body.
    pub(crate) async fn next(&mut self) -> Result<Option<Frame>, ExecFailure> {
        let a = self.action;
        loop {
            match self.cursor.pop()? {
                Pop::Frame(f) => return Ok(Some(f)),
                Pop::End => return Ok(None),
                Pop::NeedMore => {}
            }
            let n = self.cursor.count();
            let ms = self.net.timeout.as_millis();
            let read = tokio::time::timeout(self.net.timeout, self.resp.chunk());
            match until(self.bounds.abort_at, read).await {
                None => {
                    return Err(ExecFailure::transport(
                        FailureKind::Timeout,
                        true,
                        format!("action {a} stream read frame {n}: cancelled: {ABORTED_BY_TIMEOUT}"),
                    ));
                }
                Some(Err(_)) => {
                    return Err(ExecFailure::transport(
                        FailureKind::Timeout,
                        true,
                        format!("action {a} stream read frame {n}: idle timeout after {ms}ms"),
                    ));
                }
                // The body broke off. Node then fails to cancel the errored
                // body too, and says so.
                Some(Ok(Err(_))) => {
                    return Err(ExecFailure::transport(
                        FailureKind::Transport,
                        true,
                        format!(
                            "action {a} stream body: {TERMINATED}; cleanup failed (cancel response body: {TERMINATED})"
                        ),
                    ));
                }
                Some(Ok(Ok(None))) => {
                    self.cursor.end();
                    continue;
                }
                Some(Ok(Ok(Some(bytes)))) => self.cursor.feed(&bytes),
            }
            if let Some(by) = self.bounds.finish_by
                && Instant::now() > by
            {
                return Err(ExecFailure::transport(
                    FailureKind::Timeout,
                    true,
                    format!(
                        "action {a} stream read frame {n}: the stream did not finish within {ms}ms (SNOWLUMA_MCP_TIMEOUT_MS bounds a whole generic stream)"
                    ),
                ));
            }
        }
    }
}

fn wire_limit(a: &str, index: u64) -> ExecFailure {
    ExecFailure::invalid(format!("action {a} stream frame {index}: wire frame exceeds limit ({MAX_FRAME_BYTES} bytes)"))
}

/// What Node's fatal UTF-8 decoder says.
fn not_utf8(a: &str) -> ExecFailure {
    ExecFailure::invalid(format!("action {a} stream body: The encoded data was not valid for encoding utf-8"))
}

/// One frame's bytes as Node checks them: size, emptiness, UTF-8, JSON, an object.
fn parse_frame(a: &str, index: u64, raw: &[u8]) -> Result<Frame, ExecFailure> {
    if raw.len() > MAX_FRAME_BYTES {
        return Err(wire_limit(a, index));
    }
    if raw.is_empty() {
        return Err(ExecFailure::invalid(format!("action {a} stream frame {index}: empty frame")));
    }
    let text = std::str::from_utf8(raw).map_err(|_| not_utf8(a))?;
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(serde) => {
            return Err(match json_syntax::check(text) {
                Err(v8) => ExecFailure::invalid(format!("action {a} stream frame {index}: invalid JSON: {v8}")),
                // V8 takes it; we cannot represent it.
                Ok(shape) if shape.depth > MAX_RESPONSE_DEPTH => ExecFailure::invalid(format!(
                    "action {a} stream frame {index}: frame handling failed: {MAX_CALL_STACK}"
                )),
                Ok(_) => ExecFailure::invalid(format!("action {a} stream frame {index}: invalid JSON: {serde}")),
            });
        }
    };
    if !value.is_object() {
        return Err(ExecFailure::invalid(format!("action {a} stream frame {index}: expected an object envelope")));
    }
    Ok(Frame { index, value, raw_len: raw.len() })
}

/// What SnowLuma's failed frame asks of the caller of a generic stream.
const GENERIC_REFUSED: &str = "Read the error; fix the cause before starting the stream again.";

/// The frames of a generic stream, its terminal last.
#[derive(Debug)]
pub(crate) struct Generic {
    pub(crate) frames: Vec<Value>,
}

impl Generic {
    /// The last frame received: the `response` terminal, or an upload's
    /// single acknowledgement.
    pub(crate) fn terminal(&self) -> &Value {
        self.frames.last().unwrap_or(&Value::Null)
    }

    /// Node's result: `{frame_count, frames (all but the terminal), terminal}`.
    pub(crate) fn into_result(mut self) -> Value {
        let frame_count = self.frames.len();
        let terminal = self.frames.pop().unwrap_or(Value::Null);
        json!({"frame_count": frame_count, "frames": self.frames, "terminal": terminal})
    }
}

/// A generic Stream Action exchange (also every request of an upload), as
/// Node's client checks it. `on_frame` runs after each accepted frame.
pub(crate) async fn generic_exchange(
    net: &Net,
    req: &ExecRequest,
    params: &Value,
    bounds: Bounds,
    mut on_frame: impl FnMut(u64),
) -> Result<Generic, ExecFailure> {
    let resp = open(net, req, params, bounds).await?;
    let upload = req.file_action == Some(snowluma_proto::FileAction::Upload);
    let mut rules = GenericRules::new(&req.action, upload, params);
    let mut reader = FrameReader::new(net, &req.action, resp, bounds);
    while let Some(frame) = reader.next().await? {
        let i = frame.index;
        rules.accept(frame)?;
        on_frame(i + 1);
    }
    rules.finish(reader.count())
}

/// A generic stream's frames as Node's client checks them, one by one.
struct GenericRules<'a> {
    action: &'a str,
    /// An `upload_file_stream` request: one acknowledgement frame is whole.
    upload: bool,
    /// A manual `upload_file_stream` reset: its failed ack is the answer.
    resetting: bool,
    frames: Vec<Value>,
    terminal_at: Option<u64>,
    text_total: usize,
}

impl<'a> GenericRules<'a> {
    fn new(action: &'a str, upload: bool, params: &Value) -> GenericRules<'a> {
        let resetting = upload && params.get("reset") == Some(&Value::Bool(true));
        GenericRules { action, upload, resetting, frames: Vec::new(), terminal_at: None, text_total: 0 }
    }

    fn accept(&mut self, frame: Frame) -> Result<(), ExecFailure> {
        let (a, i) = (self.action, frame.index);
        let Frame { value: frame, raw_len, .. } = frame;
        if let Some(why) = frame_failure(&frame)
            && !(self.resetting && is_reset_ack(&frame))
        {
            return Err(ExecFailure::refused(
                format!("action {a} stream frame {i}: terminal error: {why}"),
                Some(GENERIC_REFUSED),
            ));
        }
        let data = frame.get("data").filter(|d| d.is_object());
        let data_type = data.and_then(|d| d.get("data_type")).and_then(Value::as_str);
        if let Some(t @ ("file_chunk" | "file_complete")) = data_type {
            return Err(ExecFailure::invalid(format!("action {a} stream frame {i}: {t} received without file_info")));
        }
        if self.frames.len() >= MAX_GENERIC_FRAMES {
            return Err(ExecFailure::invalid(format!(
                "action {a} stream frame {i}: generic frame summary exceeds limit ({MAX_GENERIC_FRAMES})"
            )));
        }
        if let Some(t) = self.terminal_at {
            return Err(ExecFailure::invalid(format!(
                "action {a} stream frame {i}: frame received after response terminal at frame {t}"
            )));
        }
        self.text_total += raw_len;
        if self.text_total > MAX_GENERIC_TEXT {
            return Err(ExecFailure::invalid(format!(
                "action {a} stream frame {i}: generic summary text exceeds limit ({MAX_GENERIC_TEXT} bytes)"
            )));
        }
        if data.and_then(|d| d.get("type")).and_then(Value::as_str) == Some("response") {
            self.terminal_at = Some(i);
        }
        self.frames.push(frame);
        Ok(())
    }

    /// The body ended after `count` frames.
    fn finish(self, count: u64) -> Result<Generic, ExecFailure> {
        let a = self.action;
        if self.frames.is_empty() {
            return Err(ExecFailure::invalid(format!("action {a} stream EOF: no frames received")));
        }
        // A single upload acknowledgement (one frame, type "stream") is complete.
        if self.terminal_at.is_none() && !(self.upload && self.frames.len() == 1) {
            return Err(ExecFailure::invalid(format!(
                "action {a} stream EOF after frame {count}: missing response terminal"
            )));
        }
        Ok(Generic { frames: self.frames })
    }
}

async fn generic_stream(net: &Net, req: &ExecRequest, params: Value, ctx: &Ctx) -> ToolReply {
    let progress = |accepted: u64| {
        if req.progress {
            ctx.progress(snowluma_proto::Progress { progress: accepted as f64, total: None, message: None });
        }
    };
    match generic_exchange(net, req, &params, Bounds::generic(net), progress).await {
        Ok(generic) => {
            let resetting = req.file_action == Some(snowluma_proto::FileAction::Upload)
                && params.get("reset") == Some(&Value::Bool(true));
            let diag = if resetting { Diagnostics::success() } else { classify(generic.terminal()) };
            ToolReply::with_diagnostics(&generic.into_result(), diag)
        }
        Err(f) => f.reply(req),
    }
}

/// `JSON.stringify` of a frame, as Node quotes one in its texts.
pub(crate) fn stringify(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| js_string(Some(v)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A body through the frame cursor and the generic rules, as the
    /// executor reads one: the result, or Node's message.
    fn generic(action: &str, upload: bool, params: Value, body: &[u8]) -> Result<Value, String> {
        let mut cursor = FrameCursor::new(action);
        let mut rules = GenericRules::new(action, upload, &params);
        cursor.feed(body);
        cursor.end();
        loop {
            match cursor.pop().map_err(|f| f.detail)? {
                Pop::Frame(f) => rules.accept(f).map_err(|f| f.detail)?,
                Pop::NeedMore => unreachable!("the whole body was fed"),
                Pop::End => return rules.finish(cursor.count()).map(Generic::into_result).map_err(|f| f.detail),
            }
        }
    }

    fn body(frames: &[Value]) -> Vec<u8> {
        frames.iter().flat_map(|f| [f.to_string().into_bytes(), b"\r\n\r\n".to_vec()].concat()).collect()
    }

    fn chunk(i: u64) -> Value {
        json!({"status": "ok", "retcode": 0, "data": {"type": "stream", "data_type": "data_chunk", "data": format!("Index-> {i}")}})
    }

    fn done() -> Value {
        json!({"status": "ok", "retcode": 0, "data": {"type": "response", "data_type": "data_complete"}})
    }

    const T: &str = "test_download_stream";

    #[test]
    fn generic_streams_are_checked_as_node_checks_them() {
        let r = generic(T, false, json!({}), &body(&[chunk(1), chunk(2), done()])).unwrap();
        assert_eq!((r["frame_count"].clone(), r["frames"].as_array().map(Vec::len)), (json!(3), Some(2)));
        assert_eq!(r["terminal"], done());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (body(&[chunk(1), done(), chunk(2)]), "frame 2: frame received after response terminal at frame 1"),
            (body(&[chunk(1), chunk(2)]), "EOF after frame 2: missing response terminal"),
            (Vec::new(), "EOF: no frames received"),
            (
                body(&[
                    chunk(1),
                    json!({"status": "failed", "retcode": 100, "data": {"type": "error"}, "wording": "This is a test error"}),
                ]),
                "frame 1: terminal error: This is a test error",
            ),
            (
                body(&[json!({"status": "ok", "retcode": 0, "data": {"type": "stream", "data_type": "file_chunk"}})]),
                "frame 0: file_chunk received without file_info",
            ),
            (body(&(0..257).map(chunk).collect::<Vec<_>>()), "frame 256: generic frame summary exceeds limit (256)"),
            (
                body(&[json!({"status": "ok", "retcode": 0, "data": "x".repeat(256 * 1024)})]),
                "frame 0: generic summary text exceeds limit (262144 bytes)",
            ),
            (b"{\"status\":\"ok\"}".to_vec(), "EOF after frame 0: unterminated frame"),
            ([body(&[chunk(1)]), b"\r\n\r\n".to_vec()].concat(), "frame 1: empty frame"),
            (
                [body(&[chunk(1)]), b"  \r\n\r\n".to_vec()].concat(),
                "frame 1: invalid JSON: Unexpected end of JSON input",
            ),
            (b"[]\r\n\r\n".to_vec(), "frame 0: expected an object envelope"),
        ];
        for (b, expected) in cases {
            assert_eq!(generic(T, false, json!({}), &b), Err(format!("action {T} stream {expected}")), "{expected}");
        }
    }

    #[test]
    fn upload_acknowledgements_and_resets() {
        const U: &str = "upload_file_stream";
        let ack = json!({"status": "ok", "retcode": 0, "data": {"type": "stream", "status": "chunk_received"}});
        let r = generic(U, true, json!({}), &body(std::slice::from_ref(&ack))).unwrap();
        assert_eq!((r["frame_count"].clone(), r["terminal"].clone()), (json!(1), ack.clone()));
        assert_eq!(
            generic(U, true, json!({}), &body(&[ack.clone(), ack])),
            Err("action upload_file_stream stream EOF after frame 2: missing response terminal".into())
        );
        let reset =
            json!({"status": "failed", "retcode": 100, "data": {"type": "error"}, "wording": "Stream reset completed"});
        assert!(
            generic(U, true, json!({"stream_id": "s", "reset": true}), &body(std::slice::from_ref(&reset))).is_ok()
        );
        assert_eq!(
            generic(U, true, json!({"stream_id": "s"}), &body(&[reset])),
            Err("action upload_file_stream stream frame 0: terminal error: Stream reset completed".into())
        );
    }
}
