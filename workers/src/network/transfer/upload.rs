//! An automatic upload: the input file in `upload_file_stream` chunks, the
//! completion SnowLuma must confirm, and a best-effort reset on failure,
//! each request an exchange of its own checked as a generic stream, every
//! failure worded as Node's client words it: `action X stream {stage}:
//! {detail}`, then `; remote reset failed: …` when the reset failed too.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use snowluma_proto::{ExecRequest, ToolReply};
use tokio::time::Instant;

use super::{hex, progress, uv_error};
use crate::network::{Bounds, ExecFailure, Net, generic_exchange, js_string, stringify};
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

/// A failure at an upload stage, before the stage is named.
struct Staged {
    stage: String,
    failure: ExecFailure,
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
        r = inner => r.map_err(Some),
        _ = ctx.cancel.cancelled() => Err(None),
    };
    let reply = match outcome {
        Ok(reply) => return reply,
        Err(failure) => failure,
    };
    // Best effort, with its own short timeout, whatever went wrong.
    let reset_failure = if contacted.load(Ordering::Relaxed) {
        let reset = json!({"stream_id": stream_id, "reset": true});
        let bounds = Bounds { finish_by: None, abort_at: Some(Instant::now() + RESET_TIMEOUT) };
        match generic_exchange(net, req, &reset, bounds, |_| {}).await {
            Ok(_) => String::new(),
            Err(f) => format!("; remote reset failed: {}", f.detail),
        }
    } else {
        String::new()
    };
    match reply {
        Some(Staged { stage, failure }) => {
            let a = &req.action;
            failure.map_detail(|d| format!("action {a} stream {stage}: {d}{reset_failure}")).reply(req)
        }
        None => {
            let mut r = crate::network::cancelled(true);
            if let Some(m) = r.diagnostics.message.as_mut() {
                m.push_str(&reset_failure);
            }
            r
        }
    }
}

/// Read exactly `buf.len()` bytes at `offset`, or as many as there are:
/// how many were read.
fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
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
) -> Result<ToolReply, Staged> {
    let at = |stage: &str| {
        let stage = stage.to_owned();
        move |failure: ExecFailure| Staged { stage, failure }
    };
    let fail = |m: String| ExecFailure::execution(m);
    let before = file.metadata().map_err(|e| at("open input")(fail(uv_error(&e, "fstat"))))?;
    if before.len() != size {
        return Err(at("open input")(fail("input_file changed before the upload started".into())));
    }
    let total_chunks = size.div_ceil(chunk_bytes).max(1);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; usize::try_from(chunk_bytes.min(size.max(1))).unwrap_or(512 * 1024)];
    let mut read = 0u64;
    for index in 0..total_chunks {
        let stage = format!("read chunk {index}");
        let wanted = usize::try_from((size - read.min(size)).min(chunk_bytes))
            .map_err(|_| at(&stage)(fail("chunk too large".into())))?;
        let chunk = &mut buf[..wanted];
        let filled = read_full_at(file, chunk, read).map_err(|e| at(&stage)(fail(uv_error(&e, "read"))))?;
        if filled != wanted {
            return Err(at(&stage)(fail(format!(
                "input_file changed while reading (expected {wanted} bytes, read {filled})"
            ))));
        }
        hasher.update(&*chunk);
        read += filled as u64;
        let stage = format!("send chunk {index}");
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
        let ack = generic_exchange(net, req, &body, Bounds::generic(net), |_| {}).await.map_err(at(&stage))?;
        let terminal = ack.terminal();
        let data = terminal.get("data").filter(|d| d.is_object());
        let field = |k: &str| data.and_then(|d| d.get(k)).and_then(Value::as_str);
        if field("type") != Some("stream") || field("status") != Some("chunk_received") {
            return Err(at(&stage)(ExecFailure::invalid(format!(
                "unexpected chunk acknowledgement: {}",
                stringify(terminal)
            ))));
        }
        progress(ctx, req.progress, read, (size > 0).then_some(size));
    }
    let stage = "verify input";
    let after = file.metadata().map_err(|e| at(stage)(fail(uv_error(&e, "fstat"))))?;
    if after.len() != before.len() || mtime(&after) != mtime(&before) {
        return Err(at(stage)(fail("input_file changed during upload".into())));
    }
    if read != size {
        return Err(at(stage)(fail(format!("input_file size mismatch (expected {size}, read {read})"))));
    }
    let sha = hex(&hasher.finalize());
    complete(net, req, base, stream_id, total_chunks, size, &sha, filename).await
}

/// The upload's completion request, and the server's confirmation of size,
/// hash and `file_path` checked.
#[allow(clippy::too_many_arguments)]
async fn complete(
    net: &Net,
    req: &ExecRequest,
    base: &Map<String, Value>,
    stream_id: &str,
    total_chunks: u64,
    size: u64,
    sha: &str,
    filename: &str,
) -> Result<ToolReply, Staged> {
    let stage = "complete upload";
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
    let completed = generic_exchange(net, req, &body, Bounds::generic(net), |_| {})
        .await
        .map_err(|failure| Staged { stage: stage.to_owned(), failure })?;
    let terminal = completed.terminal().clone();
    let data = terminal.get("data").filter(|d| d.is_object());
    let field = |k: &str| data.and_then(|d| d.get(k));
    let unconfirmed = |m: String| Staged { stage: stage.to_owned(), failure: ExecFailure::invalid(m) };
    if field("type").and_then(Value::as_str) != Some("response")
        || field("status").and_then(Value::as_str) != Some("file_complete")
    {
        return Err(unconfirmed(format!("unexpected completion acknowledgement: {}", stringify(&terminal))));
    }
    if field("file_size").and_then(Value::as_f64) != Some(size as f64) {
        return Err(unconfirmed(format!(
            "remote file_size mismatch (expected {size}, got {})",
            js_string(field("file_size"))
        )));
    }
    if field("sha256").and_then(Value::as_str) != Some(sha) {
        return Err(unconfirmed(format!(
            "remote sha256 mismatch (expected {sha}, got {})",
            js_string(field("sha256"))
        )));
    }
    let Some(file_path) = field("file_path").and_then(Value::as_str).filter(|p| !p.is_empty()) else {
        return Err(unconfirmed("completion acknowledgement has no file_path".into()));
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
