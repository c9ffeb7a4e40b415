//! Stream actions: the descriptor a transfer needs, then a file transfer
//! ([`crate::transfer`]) or a generic stream (a bounded collection of
//! frames), read frame by frame with a per-read idle timeout.

use std::time::Duration;

use serde_json::{Value, json};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, ToolReply, Transfer};

use super::client::{Net, request};
use super::envelope::classify;
use super::errors::{cancelled, reqwest_failure, transport_failure};
use super::frames::{FrameSplitter, MAX_FRAME_BYTES, frame_failure};
use crate::serve::Ctx;

/// Generic streams: frames and summed frame text kept in the result.
pub const MAX_GENERIC_FRAMES: usize = 256;
pub const MAX_GENERIC_TEXT: usize = 256 * 1024;
/// Stream actions active at once.
pub const MAX_ACTIVE_STREAMS: usize = 4;

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
        return ToolReply::fail(
            FailureKind::Execution,
            format!("active stream limit reached ({MAX_ACTIVE_STREAMS}); wait for one to finish"),
        );
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
                    return ToolReply::fail(FailureKind::Execution, format!("the transfer file did not arrive: {e}"));
                }
            }
        }
    };
    match (req.transfer.clone(), transfer_fd) {
        (Some(Transfer::Download { limit_bytes, .. }), Some(file)) => {
            tokio::select! {
                r = crate::transfer::download(net, &req, params, file, limit_bytes, ctx) => r,
                _ = ctx.cancel.cancelled() => cancelled(req.write),
            }
        }
        (Some(Transfer::Upload { size, filename, chunk_bytes, .. }), Some(file)) => {
            crate::transfer::upload(net, &req, params, file, size, filename, chunk_bytes, ctx).await
        }
        _ if req.file_action == Some(snowluma_proto::FileAction::Download) => {
            ToolReply::fail(FailureKind::Execution, "file downloads need a download file from the supervisor")
        }
        _ => tokio::select! {
            r = generic_stream(net, &req, params, ctx) => r,
            _ = ctx.cancel.cancelled() => cancelled(req.write),
        },
    }
}

/// Read a stream body frame by frame, with the per-read idle timeout, and
/// hand each complete frame (including a final one without separator) to
/// `handle`. `what` names the stream in timeout messages.
pub(crate) async fn for_each_frame(
    net: &Net,
    req: &ExecRequest,
    resp: &mut reqwest::Response,
    what: &str,
    mut handle: impl FnMut(Vec<u8>) -> Result<(), ToolReply>,
) -> Result<(), ToolReply> {
    let mut splitter = FrameSplitter::default();
    loop {
        let chunk = match tokio::time::timeout(net.timeout, resp.chunk()).await {
            Err(_) => {
                return Err(transport_failure(
                    FailureKind::Timeout,
                    format!("the {what} was idle for too long"),
                    req.write,
                    true,
                ));
            }
            Ok(Err(e)) => return Err(reqwest_failure(&e, req.write, &format!("reading the {what}"))),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        let ready = splitter
            .push(&chunk, MAX_FRAME_BYTES)
            .map_err(|m| transport_failure(FailureKind::InvalidResponse, m, req.write, true))?;
        for raw in ready {
            handle(raw)?;
        }
    }
    match splitter.finish() {
        Some(rest) => handle(rest),
        None => Ok(()),
    }
}

/// A generic stream (a bounded collection of frames, unlike file transfers)
/// must finish within the request timeout as a whole, not only between
/// reads: a server trickling a byte at a time would otherwise hold it open
/// for ever under the idle timeout.
async fn generic_stream(net: &Net, req: &ExecRequest, params: Value, ctx: &Ctx) -> ToolReply {
    match tokio::time::timeout(net.timeout, generic_stream_inner(net, req, params, ctx)).await {
        Ok(reply) => reply,
        Err(_) => transport_failure(
            FailureKind::Timeout,
            format!(
                "the stream did not finish within {} ms (SNOWLUMA_MCP_TIMEOUT_MS bounds a whole generic stream)",
                net.timeout.as_millis()
            ),
            req.write,
            true,
        ),
    }
}

async fn generic_stream_inner(net: &Net, req: &ExecRequest, params: Value, ctx: &Ctx) -> ToolReply {
    let send = tokio::time::timeout(net.timeout, request(net, req, params.clone()).send()).await;
    let mut resp = match send {
        Err(_) => {
            return transport_failure(
                FailureKind::Timeout,
                "SnowLuma did not start the stream in time".into(),
                req.write,
                true,
            );
        }
        Ok(Err(e)) => return reqwest_failure(&e, req.write, "stream request"),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        return transport_failure(
            FailureKind::InvalidResponse,
            format!("SnowLuma answered the stream with HTTP {}", status.as_u16()),
            req.write,
            true,
        );
    }
    let upload = req.file_action == Some(snowluma_proto::FileAction::Upload);
    let is_reset = upload && params.get("reset").and_then(Value::as_bool) == Some(true);
    let mut frames: Vec<Value> = Vec::new();
    let mut terminal: Option<Value> = None;
    let mut text_total = 0usize;
    let mut accepted = 0u64;
    let mut handle = |raw: Vec<u8>, frames: &mut Vec<Value>, terminal: &mut Option<Value>| -> Result<(), ToolReply> {
        let invalid = |m: String| transport_failure(FailureKind::InvalidResponse, m, req.write, true);
        if terminal.is_some() {
            return Err(invalid("SnowLuma sent a frame after the terminal frame".into()));
        }
        text_total += raw.len();
        if text_total > MAX_GENERIC_TEXT {
            return Err(invalid(format!("the stream's frames exceed {MAX_GENERIC_TEXT} bytes of text")));
        }
        let frame: Value = serde_json::from_slice(&raw)
            .map_err(|_| invalid("SnowLuma sent a stream frame that is not JSON".into()))?;
        if !frame.is_object() {
            return Err(invalid("SnowLuma sent a stream frame that is not an object".into()));
        }
        if let Some(why) = frame_failure(&frame) {
            if is_reset && why.contains("Stream reset completed") {
                *terminal = Some(frame);
                return Ok(());
            }
            return Err(ToolReply::error(
                Diagnostics::failed(FailureKind::BusinessFailure, format!("stream ended with an error: {why}"))
                    .with_next_step("Read the error; fix the cause before starting the stream again."),
            ));
        }
        if frame.pointer("/data/type").and_then(Value::as_str) == Some("response") {
            *terminal = Some(frame);
        } else {
            if frames.len() >= MAX_GENERIC_FRAMES {
                return Err(invalid(format!("the stream sent more than {MAX_GENERIC_FRAMES} frames")));
            }
            frames.push(frame);
        }
        Ok(())
    };
    let read = for_each_frame(net, req, &mut resp, "stream", |raw| {
        handle(raw, &mut frames, &mut terminal)?;
        accepted += 1;
        if req.progress {
            ctx.progress(snowluma_proto::Progress { progress: accepted as f64, total: None, message: None });
        }
        Ok(())
    })
    .await;
    if let Err(reply) = read {
        return reply;
    }
    // A single upload acknowledgement (one frame, type "stream") is complete.
    if terminal.is_none() && upload && frames.len() == 1 {
        terminal = frames.pop();
    }
    let Some(terminal) = terminal else {
        return transport_failure(
            FailureKind::InvalidResponse,
            "the stream ended without a terminal frame".into(),
            req.write,
            true,
        );
    };
    let result = json!({"frame_count": frames.len() + 1, "frames": frames, "terminal": terminal});
    let diag = if is_reset { Diagnostics::success() } else { classify(&terminal) };
    ToolReply::with_diagnostics(&result, diag)
}
