//! An automatic upload: the input file in `upload_file_stream` chunks, the
//! completion SnowLuma must confirm, and a best-effort reset on failure.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, ToolReply};

use super::{hex, invalid, progress};
use crate::network::{FrameSplitter, MAX_FRAME_BYTES, Net, frame_failure, request, reqwest_failure, transport_failure};
use crate::serve::Ctx;

/// Timeout of the best-effort reset after a failed upload.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(5);

fn uuid_like() -> String {
    let mut b = snowluma_proto::bytes::random_bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// One upload request: exactly one frame back.
async fn post_single(net: &Net, req: &ExecRequest, params: Value, timeout: Duration) -> Result<Value, ToolReply> {
    let send = async {
        let resp = request(net, req, params).send().await.map_err(|e| reqwest_failure(&e, true, "upload request"))?;
        if !resp.status().is_success() {
            return Err(invalid(
                req,
                format!("SnowLuma answered an upload request with HTTP {}", resp.status().as_u16()),
            ));
        }
        let body = resp.bytes().await.map_err(|e| reqwest_failure(&e, true, "reading an upload answer"))?;
        let mut s = FrameSplitter::default();
        let mut frames = s.push(&body, MAX_FRAME_BYTES).map_err(|m| invalid(req, m))?;
        frames.extend(s.finish());
        let first = frames.into_iter().next().ok_or_else(|| invalid(req, "an empty upload answer"))?;
        serde_json::from_slice::<Value>(&first).map_err(|_| invalid(req, "an upload answer is not JSON"))
    };
    match tokio::time::timeout(timeout, send).await {
        Ok(r) => r,
        Err(_) => Err(transport_failure(
            FailureKind::Timeout,
            "SnowLuma did not answer an upload request in time".into(),
            true,
            true,
        )),
    }
}

fn with_fields(base: &Map<String, Value>, fields: Value) -> Value {
    let mut m = base.clone();
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    Value::Object(m)
}

fn mtime(meta: &std::fs::Metadata) -> Option<SystemTime> {
    meta.modified().ok()
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn upload(
    net: &Net,
    req: &ExecRequest,
    params: Value,
    file: std::fs::File,
    size: u64,
    filename: String,
    chunk_bytes: u64,
    ctx: &Ctx,
) -> ToolReply {
    let base = match params {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let stream_id = uuid_like();
    let contacted = AtomicBool::new(false);
    let inner = upload_inner(net, req, &base, &file, size, &filename, chunk_bytes.max(1), &stream_id, &contacted, ctx);
    let outcome = tokio::select! {
        r = inner => r,
        _ = ctx.cancel.cancelled() => Err(crate::network::cancelled(true)),
    };
    match outcome {
        Ok(reply) => reply,
        Err(mut failure) if contacted.load(Ordering::Relaxed) => {
            // Best effort, with its own short timeout, whatever went wrong.
            let reset = post_single(net, req, json!({"stream_id": stream_id, "reset": true}), RESET_TIMEOUT).await;
            let note = match reset {
                Ok(frame)
                    if frame_failure(&frame).is_some_and(|w| w.contains("reset"))
                        || frame_failure(&frame).is_none() =>
                {
                    "the remote upload stream was reset".to_owned()
                }
                Ok(frame) => {
                    format!("resetting the remote upload stream failed: {}", frame_failure(&frame).unwrap_or_default())
                }
                Err(r) => {
                    format!("resetting the remote upload stream failed: {}", r.diagnostics.message.unwrap_or_default())
                }
            };
            if let Some(m) = failure.diagnostics.message.as_mut() {
                m.push_str(&format!(" ({note})"));
            }
            failure
        }
        Err(failure) => failure,
    }
}

#[allow(clippy::too_many_arguments)]
async fn upload_inner(
    net: &Net,
    req: &ExecRequest,
    base: &Map<String, Value>,
    file: &std::fs::File,
    size: u64,
    filename: &str,
    chunk_bytes: u64,
    stream_id: &str,
    contacted: &AtomicBool,
    ctx: &Ctx,
) -> Result<ToolReply, ToolReply> {
    let fail = |m: String| ToolReply::fail(FailureKind::Execution, m);
    let before = file.metadata().map_err(|e| fail(format!("cannot stat the input file: {e}")))?;
    if before.len() != size {
        return Err(fail("the input file changed before the upload started".into()));
    }
    let total_chunks = size.div_ceil(chunk_bytes).max(1);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; usize::try_from(chunk_bytes.min(size.max(1))).unwrap_or(512 * 1024)];
    let mut sent = 0u64;
    for index in 0..total_chunks {
        let len = usize::try_from((size - sent).min(chunk_bytes)).map_err(|_| fail("chunk too large".into()))?;
        let chunk = &mut buf[..len];
        file.read_exact_at(chunk, sent).map_err(|e| fail(format!("cannot read the input file: {e}")))?;
        hasher.update(&*chunk);
        let body = with_fields(
            base,
            json!({
                "stream_id": stream_id,
                "chunk_data": STANDARD.encode(&*chunk),
                "chunk_index": index,
                "total_chunks": total_chunks,
                "file_size": size,
                "filename": filename,
            }),
        );
        contacted.store(true, Ordering::Relaxed);
        let frame = post_single(net, req, body, net.timeout).await?;
        if let Some(why) = frame_failure(&frame) {
            return Err(ToolReply::error(Diagnostics::failed(
                FailureKind::BusinessFailure,
                format!("SnowLuma refused chunk {index}: {why}"),
            )));
        }
        if frame.pointer("/data/status").and_then(Value::as_str) != Some("chunk_received") {
            return Err(invalid(req, format!("chunk {index} was not acknowledged")));
        }
        sent += len as u64;
        progress(ctx, req.progress, sent, (size > 0).then_some(size));
    }
    let after = file.metadata().map_err(|e| fail(format!("cannot stat the input file: {e}")))?;
    if after.len() != before.len() || mtime(&after) != mtime(&before) {
        return Err(fail("the input file changed while it was being uploaded".into()));
    }
    let sha = hex(&hasher.finalize());
    let body = with_fields(
        base,
        json!({
            "stream_id": stream_id,
            "total_chunks": total_chunks,
            "file_size": size,
            "expected_sha256": sha,
            "is_complete": true,
            "filename": filename,
        }),
    );
    let terminal = post_single(net, req, body, net.timeout).await?;
    if let Some(why) = frame_failure(&terminal) {
        return Err(ToolReply::error(Diagnostics::failed(
            FailureKind::BusinessFailure,
            format!("SnowLuma refused to complete the upload: {why}"),
        )));
    }
    let data = terminal.get("data").cloned().unwrap_or(Value::Null);
    let confirmed = data.get("status").and_then(Value::as_str) == Some("file_complete")
        && data.get("file_size").and_then(Value::as_u64) == Some(size)
        && data.get("sha256").and_then(Value::as_str).map(str::to_ascii_lowercase) == Some(sha.clone());
    let Some(file_path) = data.get("file_path").and_then(Value::as_str).filter(|_| confirmed) else {
        return Err(invalid(req, "SnowLuma did not confirm the completed file (status, size, sha256 and file_path)"));
    };
    Ok(ToolReply::ok(&json!({
        "file_path": file_path,
        "file_size": size,
        "sha256": sha,
        "chunk_count": total_chunks,
        "stream_id": stream_id,
        "terminal": terminal,
    })))
}
