//! The download frame validator: a pure state machine over SnowLuma's
//! `download_file_*_stream` frames, checking them in the order, and wording
//! each refusal as, the Node server's client does. It does no I/O: the
//! caller feeds it each numbered frame (the executor's frame reader splits
//! and parses the body), writes the chunk bytes it hands back, and reports
//! its faults.
//!
//! Frame 0 must be `file_info` (a safe non-negative `file_size` within the
//! per-file limit and the download quota, a positive `chunk_size` if any);
//! every `file_chunk` must carry the next index and canonical base64 whose
//! decoded length matches `size`; running totals stay within the declared
//! size and the limit; nothing may follow the `file_complete` terminal,
//! whose totals are checked once the body has ended. The SHA-256 is computed
//! over the chunks as they are accepted.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::network::{frame_failure, js_string, safe_int};

/// Most file chunks a download may have (as SnowLuma's own limit).
pub const MAX_FILE_CHUNKS: u64 = 200_000;

/// What a download may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `SNOWLUMA_MCP_MAX_STREAM_BYTES`: the largest file.
    pub max: u64,
    /// What the supervisor reserved for this download: what was left of the
    /// quota (twice `max`), at most `max`.
    pub room: u64,
    /// Held by the other downloads running when this one started.
    pub reserved: u64,
}

#[cfg(test)]
impl Limits {
    /// A download alone, with the whole per-file limit.
    pub fn alone(max: u64) -> Limits {
        Limits { max, room: max, reserved: 0 }
    }
}

/// Why a download is refused: Node's words after `action X stream frame N: `
/// (or `… EOF after frame N: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadFault {
    /// SnowLuma reported a failure (its wording, or the retcode).
    #[error("terminal error: {0}")]
    TerminalError(String),
    #[error("first successful frame must be file_info")]
    FirstNotInfo,
    #[error("file_info must be the first and only header")]
    InfoNotFirst,
    #[error("invalid file_size")]
    InvalidFileSize,
    #[error("file_size exceeds limit ({0} bytes)")]
    FileSizeLimit(u64),
    #[error("invalid chunk_size")]
    InvalidChunkSize,
    #[error("declared file chunks exceed limit ({0})")]
    DeclaredChunksLimit(u64),
    #[error(
        "frame handling failed: download directory quota {quota} bytes exceeded: existing={existing}, reserved={reserved}, requested reserve={requested}"
    )]
    Quota { quota: u64, existing: u64, reserved: u64, requested: u64 },
    #[error("frame received after terminal")]
    AfterTerminal,
    #[error("file chunks exceed limit ({0})")]
    ChunksLimit(u64),
    #[error("file_chunk.data must be base64 text")]
    ChunkNotText,
    #[error("expected chunk index {expected}, got {got}")]
    ChunkIndex { expected: u64, got: String },
    #[error("file_chunk.data is not valid canonical base64")]
    NotBase64,
    #[error("file_chunk.size does not match decoded base64 bytes")]
    ChunkSize,
    #[error("downloaded bytes exceed declared file_size ({0} bytes)")]
    OverDeclared(u64),
    #[error("downloaded bytes exceed limit ({0} bytes)")]
    OverLimit(u64),
    #[error("unexpected file frame {0}")]
    UnexpectedFileFrame(String),
    // At the end of the body.
    #[error("no frames received")]
    NoFrames,
    #[error("missing file_complete terminal")]
    NoComplete,
    #[error("expected {declared} bytes, received {received}")]
    Size { declared: u64, received: u64 },
    #[error("terminal total_bytes is missing or invalid")]
    TotalBytesInvalid,
    #[error("terminal total_bytes mismatch")]
    TotalBytes,
    #[error("terminal total_chunks mismatch")]
    TotalChunks,
}

/// Where a fault was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// In this frame (0-based over all frames).
    Frame(u64),
    /// At the end of the body, after this many frames.
    Eof(u64),
}

impl DownloadFault {
    /// Node's whole message: `action {action} stream frame N: …`.
    pub fn located(&self, action: &str, at: Found) -> String {
        match (self, at) {
            (DownloadFault::NoFrames, _) => format!("action {action} stream EOF: no frames received"),
            (_, Found::Frame(n)) => format!("action {action} stream frame {n}: {self}"),
            (_, Found::Eof(n)) => format!("action {action} stream EOF after frame {n}: {self}"),
        }
    }
}

/// What an accepted frame asks of the caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// `file_info`: `size` is the declared size (0: not declared).
    Info { size: u64 },
    /// `file_chunk`: append `data`; `received` bytes so far of `declared`
    /// (0: not declared).
    Chunk { data: Vec<u8>, received: u64, declared: u64 },
    /// `file_complete`: the download is whole; only the end may follow.
    Complete,
}

/// A whole, validated download.
#[derive(Debug, PartialEq)]
pub struct Downloaded {
    /// `file_info`'s `file_name` (`download.bin` when it has none).
    pub file_name: String,
    pub file_size: u64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    /// Frames received: `file_info`, the chunks and `file_complete`.
    pub frame_count: u64,
    /// The `file_complete` frame as SnowLuma sent it.
    pub terminal: Value,
}

#[derive(Debug)]
pub struct DownloadValidator {
    limits: Limits,
    max_chunks: u64,
    /// The file's name once `file_info` arrived.
    file_name: Option<String>,
    /// The declared size, when positive (0 means unknown).
    declared: Option<u64>,
    chunks: u64,
    bytes: u64,
    hasher: Sha256,
    terminal: Option<Value>,
}

fn data_type(data: Option<&Value>) -> Option<&Value> {
    data.and_then(|d| d.get("data_type"))
}

impl DownloadValidator {
    pub fn new(limits: Limits) -> DownloadValidator {
        DownloadValidator::with_max_chunks(limits, MAX_FILE_CHUNKS)
    }

    fn with_max_chunks(limits: Limits, max_chunks: u64) -> DownloadValidator {
        DownloadValidator {
            limits,
            max_chunks,
            file_name: None,
            declared: None,
            chunks: 0,
            bytes: 0,
            hasher: Sha256::new(),
            terminal: None,
        }
    }

    /// Frame `index` of the body. After a fault the download is over: the
    /// validator must not be fed again.
    pub fn frame(&mut self, index: u64, f: &Value) -> Result<Step, DownloadFault> {
        if let Some(why) = frame_failure(f) {
            return Err(DownloadFault::TerminalError(why));
        }
        let data = f.get("data").filter(|d| d.is_object());
        let kind = data_type(data).and_then(Value::as_str);
        if index == 0 && kind != Some("file_info") {
            return Err(DownloadFault::FirstNotInfo);
        }
        if kind == Some("file_info") {
            return self.info(index, data);
        }
        if self.file_name.is_none() {
            // Unreachable: frame 0 is file_info or refused.
            return Err(DownloadFault::FirstNotInfo);
        }
        if self.terminal.is_some() {
            return Err(DownloadFault::AfterTerminal);
        }
        match (kind, data.and_then(|d| d.get("type")).and_then(Value::as_str)) {
            (Some("file_chunk"), _) => self.chunk(data),
            (Some("file_complete"), Some("response")) => {
                self.terminal = Some(f.clone());
                Ok(Step::Complete)
            }
            _ => {
                // `String(dataType ?? data?.type ?? 'unknown')`
                let named =
                    [data_type(data), data.and_then(|d| d.get("type"))].into_iter().flatten().find(|v| !v.is_null());
                Err(DownloadFault::UnexpectedFileFrame(match named {
                    Some(v) => js_string(Some(v)),
                    None => "unknown".to_owned(),
                }))
            }
        }
    }

    fn info(&mut self, index: u64, data: Option<&Value>) -> Result<Step, DownloadFault> {
        if index != 0 || self.file_name.is_some() {
            return Err(DownloadFault::InfoNotFirst);
        }
        let field = |k: &str| data.and_then(|d| d.get(k));
        let size =
            safe_int(field("file_size")).and_then(|s| u64::try_from(s).ok()).ok_or(DownloadFault::InvalidFileSize)?;
        let Limits { max, room, reserved } = self.limits;
        if size > max {
            return Err(DownloadFault::FileSizeLimit(max));
        }
        if let Some(chunk) = field("chunk_size") {
            let chunk = safe_int(Some(chunk))
                .and_then(|c| u64::try_from(c).ok())
                .filter(|c| *c > 0)
                .ok_or(DownloadFault::InvalidChunkSize)?;
            if size.div_ceil(chunk) > self.max_chunks {
                return Err(DownloadFault::DeclaredChunksLimit(self.max_chunks));
            }
        }
        // A size of 0 is unknown: the whole per-file limit is reserved.
        let declared = (size > 0).then_some(size);
        let requested = declared.unwrap_or(max);
        if requested > room {
            let quota = max.saturating_mul(2);
            let existing = quota.saturating_sub(room).saturating_sub(reserved);
            return Err(DownloadFault::Quota { quota, existing, reserved, requested });
        }
        self.declared = declared;
        self.file_name = Some(field("file_name").and_then(Value::as_str).unwrap_or("download.bin").to_owned());
        Ok(Step::Info { size })
    }

    fn chunk(&mut self, data: Option<&Value>) -> Result<Step, DownloadFault> {
        let field = |k: &str| data.and_then(|d| d.get(k));
        if self.chunks >= self.max_chunks {
            return Err(DownloadFault::ChunksLimit(self.max_chunks));
        }
        let text = field("data").and_then(Value::as_str).ok_or(DownloadFault::ChunkNotText)?;
        let index = field("index");
        if safe_int(index).and_then(|i| u64::try_from(i).ok()) != Some(self.chunks) {
            return Err(DownloadFault::ChunkIndex { expected: self.chunks, got: js_string(index) });
        }
        let bytes = STANDARD.decode(text).map_err(|_| DownloadFault::NotBase64)?;
        if let Some(size) = field("size")
            && safe_int(Some(size)).and_then(|s| u64::try_from(s).ok()) != Some(bytes.len() as u64)
        {
            return Err(DownloadFault::ChunkSize);
        }
        let total = self.bytes + bytes.len() as u64;
        if let Some(declared) = self.declared
            && total > declared
        {
            return Err(DownloadFault::OverDeclared(declared));
        }
        if total > self.limits.max {
            return Err(DownloadFault::OverLimit(self.limits.max));
        }
        self.hasher.update(&bytes);
        self.bytes = total;
        self.chunks += 1;
        Ok(Step::Chunk { data: bytes, received: total, declared: self.declared.unwrap_or(0) })
    }

    /// The body has ended after `count` frames: the download, if it is whole.
    pub fn finish(self, count: u64) -> Result<Downloaded, DownloadFault> {
        let Some(file_name) = self.file_name else {
            return Err(DownloadFault::NoFrames);
        };
        let Some(terminal) = self.terminal else {
            return Err(DownloadFault::NoComplete);
        };
        if let Some(declared) = self.declared
            && declared != self.bytes
        {
            return Err(DownloadFault::Size { declared, received: self.bytes });
        }
        let data = terminal.get("data");
        let total = safe_int(data.and_then(|d| d.get("total_bytes")))
            .and_then(|t| u64::try_from(t).ok())
            .ok_or(DownloadFault::TotalBytesInvalid)?;
        if total != self.bytes {
            return Err(DownloadFault::TotalBytes);
        }
        if let Some(n) = data.and_then(|d| d.get("total_chunks"))
            && n.as_f64() != Some(self.chunks as f64)
        {
            return Err(DownloadFault::TotalChunks);
        }
        Ok(Downloaded {
            file_name,
            file_size: self.bytes,
            sha256: super::hex(&self.hasher.finalize()),
            frame_count: count,
            terminal,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Every fault the fake SnowLuma can inject (`snowluma_fake::Fault`), as
    //! the validator sees it: the bytes of the body, cut as the fault cuts
    //! them, through the same frame cursor as the executor's reader, ending
    //! in Node's own words.

    use serde_json::json;

    use super::*;
    use crate::network::{FrameCursor, MAX_FRAME_BYTES, Pop};

    const A: &str = "download_file_stream";

    /// What reading a body ends in: the download, or Node's message.
    #[derive(Debug, PartialEq)]
    enum End {
        Whole(Box<Downloaded>),
        Failed(String),
    }

    /// Feed `pieces` (the body as the reads return it) as the executor's
    /// frame reader does, collecting the steps and the written bytes; the
    /// frame count at the end.
    fn run_with(v: &mut DownloadValidator, pieces: &[&[u8]]) -> Result<(Vec<Step>, Vec<u8>, u64), String> {
        let mut steps = Vec::new();
        let mut written = Vec::new();
        let mut cursor = FrameCursor::new(A);
        let mut pieces = pieces.iter();
        loop {
            match cursor.pop().map_err(|f| f.detail)? {
                Pop::Frame(frame) => {
                    let step =
                        v.frame(frame.index, &frame.value).map_err(|f| f.located(A, Found::Frame(frame.index)))?;
                    if let Step::Chunk { data, .. } = &step {
                        written.extend_from_slice(data);
                    }
                    steps.push(step);
                }
                Pop::NeedMore => match pieces.next() {
                    Some(p) => cursor.feed(p),
                    None => cursor.end(),
                },
                Pop::End => return Ok((steps, written, cursor.count())),
            }
        }
    }

    fn run(limits: Limits, pieces: &[&[u8]]) -> End {
        let mut v = DownloadValidator::new(limits);
        match run_with(&mut v, pieces) {
            Err(m) => End::Failed(m),
            Ok((_, _, count)) => match v.finish(count) {
                Ok(d) => End::Whole(Box::new(d)),
                Err(f) => End::Failed(f.located(A, Found::Eof(count))),
            },
        }
    }

    fn body(frames: &[Value]) -> Vec<u8> {
        frames.iter().flat_map(|f| [f.to_string().into_bytes(), b"\r\n\r\n".to_vec()].concat()).collect()
    }

    fn ok(data: Value) -> Value {
        json!({"status": "ok", "retcode": 0, "stream": "stream-action", "message": "", "wording": "", "data": data})
    }

    fn info(size: u64, chunk: u64) -> Value {
        ok(
            json!({"type": "stream", "data_type": "file_info", "file_name": "x.bin", "file_size": size, "chunk_size": chunk}),
        )
    }

    fn chunk(index: u64, bytes: &[u8]) -> Value {
        chunk_as(index, &STANDARD.encode(bytes), bytes.len() as u64)
    }

    fn chunk_as(index: u64, data: &str, size: u64) -> Value {
        ok(
            json!({"type": "stream", "data_type": "file_chunk", "index": index, "data": data, "size": size, "progress": 50, "base64_size": data.len()}),
        )
    }

    fn complete(bytes: u64, chunks: u64) -> Value {
        ok(
            json!({"type": "response", "data_type": "file_complete", "file_name": "x.bin", "total_chunks": chunks, "total_bytes": bytes, "message": "Download completed"}),
        )
    }

    /// What the fake sends for a file (as `download_file_stream` does).
    fn download_of(bytes: &[u8], chunk_size: usize) -> Vec<Value> {
        let mut frames = vec![info(bytes.len() as u64, chunk_size as u64)];
        frames.extend(bytes.chunks(chunk_size).enumerate().map(|(i, c)| chunk(i as u64, c)));
        frames.push(complete(bytes.len() as u64, bytes.len().div_ceil(chunk_size) as u64));
        frames
    }

    fn file() -> Vec<u8> {
        (0..5000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn sha(bytes: &[u8]) -> String {
        super::super::hex(&Sha256::digest(bytes))
    }

    fn failed(limits: Limits, pieces: &[&[u8]]) -> String {
        match run(limits, pieces) {
            End::Failed(m) => m,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    fn fault(max: u64, frames: &[Value]) -> String {
        failed(Limits::alone(max), &[&body(frames)])
    }

    /// No fault (and `Delay`, `CloseAfterResponse`: the same bytes, later or
    /// followed by a closed connection): the file, its hash and the steps
    /// that drive the writes and progress.
    #[test]
    fn a_whole_download_and_the_timing_faults() {
        let data = file();
        let frames = download_of(&data, 1024);
        let mut v = DownloadValidator::new(Limits::alone(1 << 20));
        let (steps, written, count) = run_with(&mut v, &[&body(&frames)]).unwrap();
        assert_eq!(written, data);
        assert_eq!(steps[0], Step::Info { size: 5000 });
        assert!(matches!(steps[1], Step::Chunk { received: 1024, declared: 5000, .. }));
        assert!(matches!(steps[5], Step::Chunk { received: 5000, declared: 5000, .. }));
        assert_eq!(steps[6], Step::Complete);
        let d = v.finish(count).unwrap();
        assert_eq!((d.file_name.as_str(), d.file_size, d.frame_count), ("x.bin", 5000, 7));
        assert_eq!(d.sha256, sha(&data));
        assert_eq!(d.terminal, frames[6]);
        // An empty file: info and complete only.
        let End::Whole(d) = run(Limits::alone(10), &[&body(&[info(0, 1024), complete(0, 0)])]) else { panic!() };
        assert_eq!((d.file_size, d.frame_count), (0, 2));
    }

    /// `StreamSplit(n)` and `Trickle` (one byte per write): wherever the body
    /// is cut, the result is the same; a final frame without its separator
    /// is Node's unterminated frame, trailing whitespace is not.
    #[test]
    fn stream_split_and_trickle() {
        let data = file();
        let b = body(&download_of(&data, 700));
        for n in [1, 2, 3, 4, 5, 7, 64, 2048, b.len()] {
            let pieces: Vec<&[u8]> = b.chunks(n).collect();
            let End::Whole(d) = run(Limits::alone(1 << 20), &pieces) else { panic!("split {n}") };
            assert_eq!(d.sha256, sha(&data), "split {n}");
        }
        assert_eq!(
            failed(Limits::alone(1 << 20), &[&b[..b.len() - 4]]),
            "action download_file_stream stream EOF after frame 9: unterminated frame"
        );
        let mut spaced = b.clone();
        spaced.extend_from_slice(b" \r\n");
        assert!(matches!(run(Limits::alone(1 << 20), &[&spaced]), End::Whole(_)));
    }

    /// `Hang`: no byte before the body ends (in service the idle timeout
    /// ends it first); `StreamThenHang`: some frames, then nothing. Neither
    /// is a download.
    #[test]
    fn hang_and_stream_then_hang() {
        assert_eq!(failed(Limits::alone(100), &[]), "action download_file_stream stream EOF: no frames received");
        let mut v = DownloadValidator::new(Limits::alone(1000));
        let frames = [info(400, 4), chunk(0, b"abcd"), chunk(1, b"abcd")];
        let (steps, written, count) = run_with(&mut v, &[&body(&frames)]).unwrap();
        assert_eq!((steps.len(), written.len(), count), (3, 8, 3));
        assert_eq!(v.finish(count), Err(DownloadFault::NoComplete));
    }

    /// `DisconnectMidBody`: half the body, or any other cut before the
    /// terminal frame is whole, is never accepted.
    #[test]
    fn disconnect_mid_body() {
        let data = file();
        let b = body(&download_of(&data, 1000));
        let terminal_end = b.len() - 4;
        for cut in 0..terminal_end {
            match run(Limits::alone(1 << 20), &[&b[..cut]]) {
                End::Failed(m)
                    if m.contains("unterminated frame")
                        || m.contains("missing file_complete terminal")
                        || m.ends_with("no frames received") => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    /// `MalformedJson`, `RawBody` (bytes that are not a JSON frame: cut,
    /// invalid UTF-8, nested deeper than we can represent), each as Node
    /// words it.
    #[test]
    fn malformed_json_and_raw_bodies() {
        let l = Limits::alone(100);
        assert_eq!(
            failed(l, &[b"{\"status\":\r\n\r\n"]),
            "action download_file_stream stream frame 0: invalid JSON: Unexpected end of JSON input"
        );
        assert_eq!(
            failed(l, &[br#"{"status":"#]),
            "action download_file_stream stream EOF after frame 0: unterminated frame"
        );
        assert_eq!(
            failed(l, &[b"\xff\xfe{}\r\n\r\n"]),
            "action download_file_stream stream body: The encoded data was not valid for encoding utf-8"
        );
        let deep = format!("{{\"a\":{}{}}}\r\n\r\n", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            failed(l, &[deep.as_bytes()]),
            "action download_file_stream stream frame 0: frame handling failed: Maximum call stack size exceeded"
        );
        // Frames after a good start are still checked one by one.
        let mut b = body(&[info(4, 4)]);
        b.extend_from_slice(b"this is not json\r\n\r\n");
        assert_eq!(
            failed(l, &[&b]),
            "action download_file_stream stream frame 1: invalid JSON: Unexpected token 'h', \"this is not json\" is not valid JSON"
        );
        let mut b = body(&[info(4, 4)]);
        b.extend_from_slice(b"\r\n\r\n");
        assert_eq!(failed(l, &[&b]), "action download_file_stream stream frame 1: empty frame");
    }

    /// `Http500`'s failed envelope, were it read, is SnowLuma's failure.
    #[test]
    fn a_failed_envelope() {
        let failed = json!({"status": "failed", "retcode": 1200, "data": null, "message": "internal server error", "wording": "internal server error"});
        assert_eq!(
            fault(100, &[failed]),
            "action download_file_stream stream frame 0: terminal error: internal server error"
        );
    }

    /// `OversizeBody`: a frame over the wire limit stops the reader before
    /// the validator sees it; a large ordinary envelope within it is not a
    /// download.
    #[test]
    fn oversize_body() {
        let big = vec![b'x'; MAX_FRAME_BYTES + 1];
        assert_eq!(
            failed(Limits::alone(u64::MAX), &[&big]),
            "action download_file_stream stream frame 0: wire frame exceeds limit (25165824 bytes)"
        );
        let mut b = body(&[info(4, 4)]);
        b.extend_from_slice(&big);
        assert_eq!(
            failed(Limits::alone(u64::MAX), &[&b]),
            "action download_file_stream stream frame 1: wire frame exceeds limit (25165824 bytes)"
        );
        let envelope = ok(Value::String("x".repeat(64 * 1024)));
        assert_eq!(
            fault(u64::MAX, &[envelope]),
            "action download_file_stream stream frame 0: first successful frame must be file_info"
        );
    }

    /// `NonObject`: `[1,2]` (and any JSON that is not an envelope).
    #[test]
    fn non_object() {
        assert_eq!(
            failed(Limits::alone(100), &[b"[1,2]\r\n\r\n"]),
            "action download_file_stream stream frame 0: expected an object envelope"
        );
        assert_eq!(
            fault(100, &[json!("not an object frame")]),
            "action download_file_stream stream frame 0: expected an object envelope"
        );
    }

    /// `StreamFrames`: every malformed stream, each refused for its own
    /// reason, in Node's words, at Node's frame.
    #[test]
    fn stream_frames() {
        let ab = b"abcd";
        let cases: Vec<(&str, Vec<Value>, &str)> = vec![
            (
                "no file_info first",
                vec![chunk(0, ab), complete(4, 1)],
                "frame 0: first successful frame must be file_info",
            ),
            ("second file_info", vec![info(4, 4), info(4, 4)], "frame 1: file_info must be the first and only header"),
            (
                "non-canonical base64",
                vec![info(4, 4), chunk_as(0, "YWJjZA=", 4)],
                "frame 1: file_chunk.data is not valid canonical base64",
            ),
            (
                "trailing bits",
                vec![info(1, 1), chunk_as(0, "YR==", 1)],
                "frame 1: file_chunk.data is not valid canonical base64",
            ),
            ("index gap", vec![info(8, 4), chunk(1, ab)], "frame 1: expected chunk index 0, got 1"),
            ("repeated index", vec![info(8, 4), chunk(0, ab), chunk(0, ab)], "frame 2: expected chunk index 1, got 0"),
            (
                "size mismatch",
                vec![info(4, 4), chunk_as(0, &STANDARD.encode(ab), 3)],
                "frame 1: file_chunk.size does not match decoded base64 bytes",
            ),
            (
                "chunk without data",
                vec![info(4, 4), ok(json!({"type": "stream", "data_type": "file_chunk", "index": 0}))],
                "frame 1: file_chunk.data must be base64 text",
            ),
            (
                "chunk without index",
                vec![info(4, 4), ok(json!({"type": "stream", "data_type": "file_chunk", "data": "YWJjZA=="}))],
                "frame 1: expected chunk index 0, got undefined",
            ),
            (
                "more than declared",
                vec![info(4, 4), chunk(0, ab), chunk(1, ab)],
                "frame 2: downloaded bytes exceed declared file_size (4 bytes)",
            ),
            (
                "short of declared",
                vec![info(8, 4), chunk(0, ab), complete(4, 1)],
                "EOF after frame 3: expected 8 bytes, received 4",
            ),
            (
                "terminal totals",
                vec![info(4, 4), chunk(0, ab), complete(5, 1)],
                "EOF after frame 3: terminal total_bytes mismatch",
            ),
            (
                "terminal without totals",
                vec![info(4, 4), chunk(0, ab), ok(json!({"type": "response", "data_type": "file_complete"}))],
                "EOF after frame 3: terminal total_bytes is missing or invalid",
            ),
            (
                "terminal chunk count",
                vec![info(4, 4), chunk(0, ab), complete(4, 2)],
                "EOF after frame 3: terminal total_chunks mismatch",
            ),
            ("missing terminal", vec![info(4, 4), chunk(0, ab)], "EOF after frame 2: missing file_complete terminal"),
            (
                "frame after terminal",
                vec![info(4, 4), chunk(0, ab), complete(4, 1), chunk(1, ab)],
                "frame 3: frame received after terminal",
            ),
            (
                "huge declared size",
                vec![info(1 << 50, 4), chunk(0, ab)],
                "frame 0: file_size exceeds limit (1000 bytes)",
            ),
            (
                "no declared size",
                vec![ok(json!({"type": "stream", "data_type": "file_info", "file_name": "x"}))],
                "frame 0: invalid file_size",
            ),
            ("zero chunk size", vec![info(4, 0)], "frame 0: invalid chunk_size"),
            (
                "error frame",
                vec![
                    info(4, 4),
                    json!({"status":"failed","retcode":100,"data":{"type":"error","data_type":"error"},"message":"boom","wording":"boom"}),
                ],
                "frame 1: terminal error: boom",
            ),
            (
                "error type in an ok frame",
                vec![info(4, 4), ok(json!({"type": "error", "data_type": "file_chunk"}))],
                "frame 1: terminal error: retcode=0",
            ),
            (
                "unknown frame",
                vec![info(4, 4), ok(json!({"data_type": "file_middle"}))],
                "frame 1: unexpected file frame file_middle",
            ),
            (
                "a complete that is not a response",
                vec![info(4, 4), chunk(0, ab), ok(json!({"type": "stream", "data_type": "file_complete"}))],
                "frame 2: unexpected file frame file_complete",
            ),
        ];
        for (name, frames, expected) in cases {
            let got = fault(1000, &frames);
            assert_eq!(got, format!("action download_file_stream stream {expected}"), "{name}");
        }
        // Undeclared sizes are bounded by the limit alone.
        assert_eq!(
            fault(6, &[info(0, 4), chunk(0, ab), chunk(1, ab)]),
            "action download_file_stream stream frame 2: downloaded bytes exceed limit (6 bytes)"
        );
    }

    /// The quota: a declared size (or, undeclared, the whole per-file limit)
    /// beyond what the supervisor could reserve, with Node's accounting.
    #[test]
    fn the_download_quota_in_nodes_words() {
        let limits = Limits { max: 1_048_576, room: 2_097_152 - 2_072_800, reserved: 0 };
        assert_eq!(
            fault_with(limits, &[info(1_000_000, 65536)]),
            "action download_file_stream stream frame 0: frame handling failed: download directory quota 2097152 bytes exceeded: existing=2072800, reserved=0, requested reserve=1000000"
        );
        let limits = Limits { max: 1000, room: 600, reserved: 300 };
        assert_eq!(
            fault_with(limits, &[info(0, 4)]),
            "action download_file_stream stream frame 0: frame handling failed: download directory quota 2000 bytes exceeded: existing=1100, reserved=300, requested reserve=1000"
        );
        assert!(
            matches!(run(limits, &[&body(&[info(600, 4), complete(0, 0)])]), End::Failed(m) if m.contains("expected 600 bytes"))
        );
    }

    fn fault_with(limits: Limits, frames: &[Value]) -> String {
        failed(limits, &[&body(frames)])
    }

    #[test]
    fn chunk_counts_are_bounded() {
        let mut v = DownloadValidator::with_max_chunks(Limits::alone(1000), 2);
        assert_eq!(v.frame(0, &info(12, 4)), Err(DownloadFault::DeclaredChunksLimit(2)));
        let mut v = DownloadValidator::with_max_chunks(Limits::alone(1000), 2);
        let frames = [info(0, 1), chunk(0, b"a"), chunk(1, b"b"), chunk(2, b"c")];
        let results: Vec<_> = frames.iter().enumerate().map(|(i, f)| v.frame(i as u64, f).map(|_| ())).collect();
        assert_eq!(results[..3], [Ok(()), Ok(()), Ok(())]);
        assert_eq!(results[3], Err(DownloadFault::ChunksLimit(2)));
        assert_eq!(DownloadFault::ChunksLimit(MAX_FILE_CHUNKS).to_string(), "file chunks exceed limit (200000)");
    }
}
