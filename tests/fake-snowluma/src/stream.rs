//! SnowLuma's Stream API, imitated (upstream notes §3.3).
//!
//! On HTTP a Stream action answers 200, chunked, without Content-Type; the
//! body is a sequence of JSON envelopes each followed by `\r\n\r\n`:
//! intermediate frames `{status:'ok', retcode:0, data:<packet>, message:'',
//! wording:'', stream:'stream-action'}` and one terminal frame, which on
//! failure has `data:{type:'error', data_type:'error'}` and the reason in
//! `message`/`wording`. This module builds those frames; the server writes them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::actions::{Frames, Params, bool_param, field_error, str_param, u64_param};
use crate::{base64, sha256};

/// Separator written after every frame.
pub(crate) const FRAME_END: &[u8] = b"\r\n\r\n";

/// Default download chunk size and SnowLuma's clamp.
const DEFAULT_CHUNK_SIZE: u64 = 64 * 1024;
const MAX_CHUNK_SIZE: u64 = 16 * 1024 * 1024;

/// SnowLuma's upload limits.
const MAX_UPLOAD_STREAMS: usize = 64;
const MAX_UPLOAD_CHUNKS: u64 = 200_000;
const MAX_DECODED_CHUNK: usize = 32 * 1024 * 1024;

/// An intermediate frame, or a successful terminal frame.
pub(crate) fn frame_ok(data: Value) -> Value {
    json!({
        "status": "ok",
        "retcode": 0,
        "data": data,
        "message": "",
        "wording": "",
        "stream": "stream-action"
    })
}

/// A failure terminal frame.
pub(crate) fn frame_failed(retcode: i64, wording: &str) -> Value {
    json!({
        "status": "failed",
        "retcode": retcode,
        "data": {"type": "error", "data_type": "error"},
        "message": wording,
        "wording": wording,
        "stream": "stream-action"
    })
}

/// A parameter validation failure (retcode 1400) as a frame.
fn invalid(wording: String) -> Value {
    frame_failed(1400, &wording)
}

// ---------------------------------------------------------------- test_download_stream

/// `test_download_stream {error?: bool}`: ten `data_chunk` frames `Index-> 1..10`,
/// then `data_complete`, or with `error:true` a failure frame "This is a test error".
pub(crate) fn test_download(params: &Params) -> Vec<Value> {
    let error = match bool_param(params, "error") {
        Ok(error) => error.unwrap_or(false),
        Err(wording) => return vec![invalid(wording)],
    };
    let mut frames: Vec<Value> = (1..=10)
        .map(|i| frame_ok(json!({"type": "stream", "data_type": "data_chunk", "data": format!("Index-> {i}")})))
        .collect();
    frames.push(if error {
        frame_failed(100, "This is a test error")
    } else {
        frame_ok(json!({
            "type": "response",
            "data_type": "data_complete",
            "data": "Stream transmission complete"
        }))
    });
    frames
}

// ---------------------------------------------------------------- download_file_*_stream

/// `download_file_stream` (and the image/record variants) `{file?, file_id?, chunk_size?}`.
///
/// SnowLuma reads a file under its stream temp root, a URL or a cached media
/// id; the fake serves the bytes registered with `add_file`, looked up by
/// `file` (exact, then by base name) or `file_id`.
pub(crate) fn download(files: &HashMap<String, Arc<Vec<u8>>>, params: &Params) -> Frames {
    match download_frames(files, params) {
        Ok(frames) => frames,
        Err(frame) => Box::new(std::iter::once(frame)),
    }
}

fn download_frames(files: &HashMap<String, Arc<Vec<u8>>>, params: &Params) -> Result<Frames, Value> {
    let file = str_param(params, "file").map_err(invalid)?;
    let file_id = str_param(params, "file_id").map_err(invalid)?;
    let chunk_size = u64_param(params, "chunk_size").map_err(invalid)?.unwrap_or(DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err(invalid(field_error("chunk_size", "must be at least 1")));
    }
    let chunk_size = usize::try_from(chunk_size.min(MAX_CHUNK_SIZE)).unwrap_or(usize::MAX);
    let Some(requested) = file.or(file_id) else {
        return Err(invalid(field_error("file", "file or file_id is required")));
    };
    let base_name = requested.rsplit(['/', '\\']).next().unwrap_or_default().to_string();
    let Some(bytes) = files.get(&requested).or_else(|| files.get(&base_name)).cloned() else {
        return Err(frame_failed(100, &format!("file not found: {requested}")));
    };
    Ok(file_frames(bytes, base_name, chunk_size as u64))
}

/// The frames of a download of `bytes` named `base_name`, in chunks of
/// `chunk_size` (at least 1) bytes: `file_info`, the chunks, `file_complete`.
pub(crate) fn file_frames(bytes: Arc<Vec<u8>>, base_name: String, chunk_size: u64) -> Frames {
    let chunk_size = usize::try_from(chunk_size.max(1)).unwrap_or(usize::MAX);
    let total = bytes.len();
    let total_chunks = total.div_ceil(chunk_size);
    let info = frame_ok(json!({
        "type": "stream",
        "data_type": "file_info",
        "file_name": base_name,
        "file_size": total,
        "chunk_size": chunk_size
    }));
    let chunks = (0..total_chunks).map(move |index| {
        let start = index * chunk_size;
        let end = (start + chunk_size).min(total);
        let data = base64::encode(&bytes[start..end]);
        let base64_size = data.len();
        frame_ok(json!({
            "type": "stream",
            "data_type": "file_chunk",
            "index": index,
            "data": data,
            "size": end - start,
            "progress": (end as u128 * 100 / total as u128) as u64,
            "base64_size": base64_size
        }))
    });
    let complete = frame_ok(json!({
        "type": "response",
        "data_type": "file_complete",
        "file_name": base_name,
        "total_chunks": total_chunks,
        "total_bytes": total,
        "message": "Download completed"
    }));
    Box::new(std::iter::once(info).chain(chunks).chain(std::iter::once(complete)))
}

// ---------------------------------------------------------------- upload_file_stream

/// An upload in progress.
#[derive(Debug, Default)]
pub(crate) struct UploadStream {
    total_chunks: u64,
    /// Received chunks by index (decoded bytes).
    chunks: BTreeMap<u64, Vec<u8>>,
    file_size: Option<u64>,
    filename: Option<String>,
    expected_sha256: Option<String>,
}

/// SnowLuma's stream id rule: `^[A-Za-z0-9_-]{1,128}$`.
fn valid_stream_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `upload_file_stream`: one POST, one frame (upstream notes §3.3).
///
/// * `reset:true` drops the stream and *fails* with "Stream reset completed".
/// * A new stream needs `total_chunks`.
/// * `chunk_data` + `chunk_index` store a chunk (a repeated index is idempotent)
///   and answer `chunk_received`, unless `is_complete` is set too.
/// * `is_complete:true`, or a POST without chunk data once every chunk is in,
///   reassembles the file, checks `file_size` and `expected_sha256`, and answers
///   `file_complete` with the SHA-256. The bytes go to `uploaded`.
/// * `verify_only`, or nothing to do yet, answers `file_created`.
pub(crate) fn upload(
    uploads: &mut HashMap<String, UploadStream>,
    uploaded: &mut HashMap<String, Vec<u8>>,
    params: &Params,
) -> Value {
    match upload_step(uploads, uploaded, params) {
        Ok(frame) | Err(frame) => frame,
    }
}

fn upload_step(
    uploads: &mut HashMap<String, UploadStream>,
    uploaded: &mut HashMap<String, Vec<u8>>,
    params: &Params,
) -> Result<Value, Value> {
    let stream_id = str_param(params, "stream_id")
        .map_err(invalid)?
        .ok_or_else(|| invalid(field_error("stream_id", "is required")))?;
    if !valid_stream_id(&stream_id) {
        return Err(invalid(field_error("stream_id", "must match ^[A-Za-z0-9_-]{1,128}$")));
    }
    if bool_param(params, "reset").map_err(invalid)?.unwrap_or(false) {
        uploads.remove(&stream_id);
        return Err(frame_failed(100, "Stream reset completed"));
    }
    let chunk_data = str_param(params, "chunk_data").map_err(invalid)?;
    let chunk_index = u64_param(params, "chunk_index").map_err(invalid)?;
    let total_chunks = u64_param(params, "total_chunks").map_err(invalid)?;
    let file_size = u64_param(params, "file_size").map_err(invalid)?;
    let expected_sha256 = str_param(params, "expected_sha256").map_err(invalid)?;
    let filename = str_param(params, "filename").map_err(invalid)?;
    let is_complete = bool_param(params, "is_complete").map_err(invalid)?.unwrap_or(false);
    let verify_only = bool_param(params, "verify_only").map_err(invalid)?.unwrap_or(false);

    match total_chunks {
        Some(0) => return Err(invalid(field_error("total_chunks", "must be at least 1"))),
        Some(n) if n > MAX_UPLOAD_CHUNKS => {
            return Err(invalid(field_error("total_chunks", "must be at most 200000")));
        }
        _ => {}
    }

    if !uploads.contains_key(&stream_id) {
        if verify_only {
            return Err(frame_failed(100, &format!("stream not found: {stream_id}")));
        }
        let Some(total_chunks) = total_chunks else {
            return Err(invalid(field_error("total_chunks", "is required for a new stream")));
        };
        if uploads.len() >= MAX_UPLOAD_STREAMS {
            return Err(frame_failed(100, "too many concurrent upload streams (64)"));
        }
        uploads.insert(stream_id.clone(), UploadStream { total_chunks, ..UploadStream::default() });
    }
    let Some(stream) = uploads.get_mut(&stream_id) else {
        return Err(frame_failed(100, "upload stream vanished"));
    };
    if let Some(total) = total_chunks
        && total != stream.total_chunks
    {
        return Err(invalid(field_error(
            "total_chunks",
            &format!("does not match the stream ({})", stream.total_chunks),
        )));
    }
    if filename.is_some() {
        stream.filename = filename;
    }
    if file_size.is_some() {
        stream.file_size = file_size;
    }
    if expected_sha256.is_some() {
        stream.expected_sha256 = expected_sha256;
    }

    if verify_only {
        return Ok(progress_frame(&stream_id, stream, "file_created"));
    }
    if let Some(data) = chunk_data {
        let index = chunk_index.ok_or_else(|| invalid(field_error("chunk_index", "is required")))?;
        if index >= stream.total_chunks {
            return Err(invalid(field_error(
                "chunk_index",
                &format!("out of range (total_chunks {})", stream.total_chunks),
            )));
        }
        let bytes = base64::decode(&data).ok_or_else(|| invalid(field_error("chunk_data", "invalid base64")))?;
        if bytes.len() > MAX_DECODED_CHUNK {
            return Err(invalid(field_error("chunk_data", "chunk larger than 32 MiB")));
        }
        // A repeated index is idempotent: the first copy stays.
        stream.chunks.entry(index).or_insert(bytes);
        if !is_complete {
            return Ok(progress_frame(&stream_id, stream, "chunk_received"));
        }
    } else if !is_complete && (stream.chunks.len() as u64) < stream.total_chunks {
        return Ok(progress_frame(&stream_id, stream, "file_created"));
    }

    // Completion.
    let received = stream.chunks.len() as u64;
    let total = stream.total_chunks;
    if received < total {
        return Err(frame_failed(100, &format!("upload incomplete: received {received} of {total} chunks")));
    }
    let Some(stream) = uploads.remove(&stream_id) else {
        return Err(frame_failed(100, "upload stream vanished"));
    };
    let bytes = stream.chunks.into_values().collect::<Vec<_>>().concat();
    if let Some(size) = stream.file_size
        && size != bytes.len() as u64
    {
        return Err(frame_failed(100, &format!("file size mismatch: expected {size}, got {}", bytes.len())));
    }
    let sha256 = sha256::digest_hex(&bytes);
    if let Some(expected) = &stream.expected_sha256
        && !expected.eq_ignore_ascii_case(&sha256)
    {
        return Err(frame_failed(100, &format!("sha256 mismatch: expected {expected}, got {sha256}")));
    }
    // SnowLuma writes <tmp>/snowluma-stream/upload/<account>/<stream_id>__<filename>.
    let filename = stream.filename.as_deref().unwrap_or("file").replace(['/', '\\'], "_");
    let file_path = format!("/fake/upload/{stream_id}__{filename}");
    let file_size = bytes.len();
    uploaded.insert(stream_id.clone(), bytes);
    Ok(frame_ok(json!({
        "type": "response",
        "stream_id": stream_id,
        "status": "file_complete",
        "received_chunks": received,
        "total_chunks": total,
        "file_path": file_path,
        "file_size": file_size,
        "sha256": sha256
    })))
}

/// `{type:'stream', stream_id, status, received_chunks, total_chunks}`.
fn progress_frame(stream_id: &str, stream: &UploadStream, status: &str) -> Value {
    frame_ok(json!({
        "type": "stream",
        "stream_id": stream_id,
        "status": status,
        "received_chunks": stream.chunks.len(),
        "total_chunks": stream.total_chunks
    }))
}
