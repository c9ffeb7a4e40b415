//! The download frame validator: a pure state machine over SnowLuma's
//! `download_file_*_stream` frames. It does no I/O: the caller feeds it the
//! HTTP status and each frame ([`crate::network::FrameSplitter`] splits the
//! body), writes the chunk bytes it hands back, and reports its faults.
//!
//! The first frame must be `file_info`; every `file_chunk` must carry the
//! next index and canonical base64 whose decoded length matches `size`;
//! running totals stay within the declared size and the limit; the terminal
//! `file_complete` must match the bytes and chunks received, and nothing may
//! follow it. The SHA-256 is computed over the chunks as they are accepted.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::network::frame_failure;

/// Most file chunks a download may have (as SnowLuma's own limit).
pub const MAX_FILE_CHUNKS: u64 = 200_000;

/// Why a download is refused. The texts are the tool error's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadFault {
    #[error("SnowLuma answered the download with HTTP {0}")]
    HttpStatus(u16),
    #[error("a download frame is not JSON")]
    NotJson,
    #[error("SnowLuma sent a frame after file_complete")]
    AfterComplete,
    /// SnowLuma reported a failure (its wording, or the retcode).
    #[error("download failed: {0}")]
    Refused(String),
    #[error("the first download frame is not file_info")]
    FirstNotInfo,
    #[error("a second file_info frame")]
    SecondInfo,
    #[error(
        "the file's declared size ({size} bytes) exceeds the allowed {limit} bytes (per-file limit or download quota)"
    )]
    DeclaredTooLarge { size: u64, limit: u64 },
    #[error("the download would need more than {0} chunks")]
    TooManyChunksDeclared(u64),
    #[error("chunk index out of order (expected {0})")]
    ChunkOutOfOrder(u64),
    #[error("a chunk without data")]
    ChunkWithoutData,
    #[error("a chunk is not canonical base64")]
    NotBase64,
    #[error("a chunk's size does not match its data")]
    ChunkSizeMismatch,
    #[error("the download exceeds the allowed {0} bytes")]
    OverLimit(u64),
    #[error("SnowLuma sent more bytes than the declared file size")]
    OverDeclared,
    #[error("more than {0} chunks")]
    TooManyChunks(u64),
    #[error("file_complete does not match the bytes received")]
    CompleteBytes,
    #[error("file_complete does not match the chunks received")]
    CompleteChunks,
    #[error("the file is shorter than its declared size")]
    Short,
    #[error("unexpected download frame {0:?}")]
    Unexpected(String),
    #[error("the download ended before file_complete")]
    Unfinished,
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
    /// Most bytes the file may have (per-file cap or what is left of the quota).
    limit: u64,
    max_chunks: u64,
    /// The file's name and declared size, once `file_info` arrived.
    info: Option<(String, u64)>,
    chunks: u64,
    bytes: u64,
    hasher: Sha256,
    terminal: Option<Value>,
}

impl DownloadValidator {
    pub fn new(limit: u64) -> DownloadValidator {
        DownloadValidator::with_max_chunks(limit, MAX_FILE_CHUNKS)
    }

    fn with_max_chunks(limit: u64, max_chunks: u64) -> DownloadValidator {
        DownloadValidator { limit, max_chunks, info: None, chunks: 0, bytes: 0, hasher: Sha256::new(), terminal: None }
    }

    /// The response's HTTP status, before any frame.
    pub fn status(status: u16) -> Result<(), DownloadFault> {
        if (200..300).contains(&status) { Ok(()) } else { Err(DownloadFault::HttpStatus(status)) }
    }

    /// One frame of the body. After a fault the download is over: the
    /// validator must not be fed again.
    pub fn frame(&mut self, raw: &[u8]) -> Result<Step, DownloadFault> {
        let f: Value = serde_json::from_slice(raw).map_err(|_| DownloadFault::NotJson)?;
        if self.terminal.is_some() {
            return Err(DownloadFault::AfterComplete);
        }
        if let Some(why) = frame_failure(&f) {
            return Err(DownloadFault::Refused(why));
        }
        let data = f.get("data").cloned().unwrap_or(Value::Null);
        let kind = data.get("data_type").and_then(Value::as_str).unwrap_or("");
        if self.info.is_none() && kind != "file_info" {
            return Err(DownloadFault::FirstNotInfo);
        }
        match kind {
            "file_info" => {
                if self.info.is_some() {
                    return Err(DownloadFault::SecondInfo);
                }
                let size = data.get("file_size").and_then(Value::as_u64).unwrap_or(0);
                let chunk = data.get("chunk_size").and_then(Value::as_u64).unwrap_or(0);
                if size > self.limit {
                    return Err(DownloadFault::DeclaredTooLarge { size, limit: self.limit });
                }
                if size > 0 && chunk > 0 && size.div_ceil(chunk) > self.max_chunks {
                    return Err(DownloadFault::TooManyChunksDeclared(self.max_chunks));
                }
                let name = data.get("file_name").and_then(Value::as_str).unwrap_or("download").to_owned();
                self.info = Some((name, size));
                Ok(Step::Info { size })
            }
            "file_chunk" => {
                let declared = self.declared();
                if data.get("index").and_then(Value::as_u64) != Some(self.chunks) {
                    return Err(DownloadFault::ChunkOutOfOrder(self.chunks));
                }
                let text = data.get("data").and_then(Value::as_str).ok_or(DownloadFault::ChunkWithoutData)?;
                let bytes = STANDARD.decode(text).map_err(|_| DownloadFault::NotBase64)?;
                if let Some(size) = data.get("size").and_then(Value::as_u64)
                    && size != bytes.len() as u64
                {
                    return Err(DownloadFault::ChunkSizeMismatch);
                }
                let total = self.bytes + bytes.len() as u64;
                if total > self.limit {
                    return Err(DownloadFault::OverLimit(self.limit));
                }
                if declared > 0 && total > declared {
                    return Err(DownloadFault::OverDeclared);
                }
                if self.chunks + 1 > self.max_chunks {
                    return Err(DownloadFault::TooManyChunks(self.max_chunks));
                }
                self.hasher.update(&bytes);
                self.bytes = total;
                self.chunks += 1;
                Ok(Step::Chunk { data: bytes, received: total, declared })
            }
            "file_complete" => {
                let declared = self.declared();
                if data.get("total_bytes").and_then(Value::as_u64) != Some(self.bytes) {
                    return Err(DownloadFault::CompleteBytes);
                }
                if let Some(n) = data.get("total_chunks").and_then(Value::as_u64)
                    && n != self.chunks
                {
                    return Err(DownloadFault::CompleteChunks);
                }
                if declared > 0 && self.bytes != declared {
                    return Err(DownloadFault::Short);
                }
                self.terminal = Some(f);
                Ok(Step::Complete)
            }
            other => Err(DownloadFault::Unexpected(other.to_owned())),
        }
    }

    fn declared(&self) -> u64 {
        self.info.as_ref().map(|i| i.1).unwrap_or(0)
    }

    /// The body has ended: the download, if it is whole.
    pub fn finish(self) -> Result<Downloaded, DownloadFault> {
        let (Some(terminal), Some((file_name, _))) = (self.terminal, self.info) else {
            return Err(DownloadFault::Unfinished);
        };
        Ok(Downloaded {
            file_name,
            file_size: self.bytes,
            sha256: super::hex(&self.hasher.finalize()),
            frame_count: self.chunks + 2,
            terminal,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Every fault the fake SnowLuma can inject (`snowluma_fake::Fault`), as
    //! the validator sees it: the bytes of the body, cut as the fault cuts
    //! them, through the same frame splitter as the executor's reader.

    use serde_json::json;

    use super::*;
    use crate::network::{FrameSplitter, MAX_FRAME_BYTES};

    /// What reading a body ends in: the download, a fault, or a frame too
    /// large for the splitter.
    #[derive(Debug, PartialEq)]
    enum End {
        Whole(Box<Downloaded>),
        Fault(DownloadFault),
        Oversize(String),
    }

    /// Feed `pieces` (the body as the reads return it) as the executor's
    /// frame reader does, collecting the steps and the written bytes.
    fn run_with(v: &mut DownloadValidator, pieces: &[&[u8]]) -> Result<(Vec<Step>, Vec<u8>), End> {
        let mut steps = Vec::new();
        let mut written = Vec::new();
        let mut handle = |raw: Vec<u8>, steps: &mut Vec<Step>| -> Result<(), End> {
            let step = v.frame(&raw).map_err(End::Fault)?;
            if let Step::Chunk { data, .. } = &step {
                written.extend_from_slice(data);
            }
            steps.push(step);
            Ok(())
        };
        let mut splitter = FrameSplitter::default();
        for piece in pieces {
            for raw in splitter.push(piece, MAX_FRAME_BYTES).map_err(End::Oversize)? {
                handle(raw, &mut steps)?;
            }
        }
        if let Some(rest) = splitter.finish() {
            handle(rest, &mut steps)?;
        }
        Ok((steps, written))
    }

    fn run(limit: u64, pieces: &[&[u8]]) -> End {
        let mut v = DownloadValidator::new(limit);
        match run_with(&mut v, pieces) {
            Err(end) => end,
            Ok(_) => match v.finish() {
                Ok(d) => End::Whole(Box::new(d)),
                Err(f) => End::Fault(f),
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

    fn fault(limit: u64, frames: &[Value]) -> DownloadFault {
        match run(limit, &[&body(frames)]) {
            End::Fault(f) => f,
            other => panic!("expected a fault, got {other:?}"),
        }
    }

    /// No fault (and `Delay`, `CloseAfterResponse`: the same bytes, later or
    /// followed by a closed connection): the file, its hash and the steps
    /// that drive the writes and progress.
    #[test]
    fn a_whole_download_and_the_timing_faults() {
        let data = file();
        let frames = download_of(&data, 1024);
        let mut v = DownloadValidator::new(1 << 20);
        let (steps, written) = run_with(&mut v, &[&body(&frames)]).unwrap();
        assert_eq!(written, data);
        assert_eq!(steps[0], Step::Info { size: 5000 });
        assert!(matches!(steps[1], Step::Chunk { received: 1024, declared: 5000, .. }));
        assert!(matches!(steps[5], Step::Chunk { received: 5000, declared: 5000, .. }));
        assert_eq!(steps[6], Step::Complete);
        let d = v.finish().unwrap();
        assert_eq!((d.file_name.as_str(), d.file_size, d.frame_count), ("x.bin", 5000, 7));
        assert_eq!(d.sha256, sha(&data));
        assert_eq!(d.terminal, frames[6]);
        // An empty file: info and complete only.
        let End::Whole(d) = run(10, &[&body(&[info(0, 1024), complete(0, 0)])]) else { panic!() };
        assert_eq!((d.file_size, d.frame_count), (0, 2));
    }

    /// `StreamSplit(n)` and `Trickle` (one byte per write): wherever the body
    /// is cut, the result is the same; a final frame without its separator
    /// still counts.
    #[test]
    fn stream_split_and_trickle() {
        let data = file();
        let b = body(&download_of(&data, 700));
        for n in [1, 2, 3, 4, 5, 7, 64, 2048, b.len()] {
            let pieces: Vec<&[u8]> = b.chunks(n).collect();
            let End::Whole(d) = run(1 << 20, &pieces) else { panic!("split {n}") };
            assert_eq!(d.sha256, sha(&data), "split {n}");
        }
        let End::Whole(_) = run(1 << 20, &[&b[..b.len() - 4]]) else { panic!("no final separator") };
    }

    /// `Hang`: no byte before the body ends (in service the idle timeout
    /// ends it first); `StreamThenHang`: some frames, then nothing. Neither
    /// is a download, and nothing before the end is a fault.
    #[test]
    fn hang_and_stream_then_hang() {
        assert_eq!(run(100, &[]), End::Fault(DownloadFault::Unfinished));
        let mut v = DownloadValidator::new(1000);
        let frames = [info(400, 4), chunk(0, b"abcd"), chunk(1, b"abcd")];
        let (steps, written) = run_with(&mut v, &[&body(&frames)]).unwrap();
        assert_eq!((steps.len(), written.len()), (3, 8));
        assert_eq!(v.finish(), Err(DownloadFault::Unfinished));
    }

    /// `DisconnectMidBody`: half the body, or any other cut before the
    /// terminal frame is whole, is never accepted.
    #[test]
    fn disconnect_mid_body() {
        let data = file();
        let b = body(&download_of(&data, 1000));
        let terminal_end = b.len() - 4;
        for cut in 0..terminal_end {
            match run(1 << 20, &[&b[..cut]]) {
                End::Fault(DownloadFault::NotJson | DownloadFault::Unfinished) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        assert_eq!(run(1 << 20, &[&b[..b.len() / 2]]), End::Fault(DownloadFault::NotJson));
    }

    /// `MalformedJson`, `RawBody` (bytes that are not a JSON frame: cut,
    /// invalid UTF-8, nested deeper than the parser allows).
    #[test]
    fn malformed_json_and_raw_bodies() {
        assert_eq!(run(100, &[br#"{"status":"#]), End::Fault(DownloadFault::NotJson));
        assert_eq!(run(100, &[b"\xff\xfe{}"]), End::Fault(DownloadFault::NotJson));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(run(100, &[deep.as_bytes()]), End::Fault(DownloadFault::NotJson));
        // Valid JSON after a good start is still checked frame by frame.
        let mut b = body(&[info(4, 4)]);
        b.extend_from_slice(b"not json\r\n\r\n");
        assert_eq!(run(100, &[&b]), End::Fault(DownloadFault::NotJson));
    }

    /// `Http500`: refused on the status; its failed envelope, were it read,
    /// is SnowLuma's failure.
    #[test]
    fn http_500() {
        assert_eq!(DownloadValidator::status(500), Err(DownloadFault::HttpStatus(500)));
        assert_eq!(DownloadFault::HttpStatus(500).to_string(), "SnowLuma answered the download with HTTP 500");
        assert_eq!(DownloadValidator::status(200), Ok(()));
        assert_eq!(DownloadValidator::status(204), Ok(()));
        assert_eq!(DownloadValidator::status(302), Err(DownloadFault::HttpStatus(302)));
        let failed = json!({"status": "failed", "retcode": 1200, "data": null, "message": "internal server error", "wording": "internal server error"});
        assert_eq!(fault(100, &[failed]), DownloadFault::Refused("internal server error".into()));
    }

    /// `OversizeBody`: a frame over the frame limit stops the splitter
    /// before the validator sees it; a large ordinary envelope within it
    /// is not a download.
    #[test]
    fn oversize_body() {
        let big = vec![b'x'; MAX_FRAME_BYTES + 1];
        assert_eq!(run(u64::MAX, &[&big]), End::Oversize(format!("a stream frame exceeds {MAX_FRAME_BYTES} bytes")));
        let envelope = ok(Value::String("x".repeat(64 * 1024)));
        assert_eq!(fault(u64::MAX, &[envelope]), DownloadFault::FirstNotInfo);
    }

    /// `NonObject`: `[1,2]` (and any JSON that is not an envelope) names no
    /// success, so it is SnowLuma's failure without wording.
    #[test]
    fn non_object() {
        assert_eq!(run(100, &[b"[1,2]"]), End::Fault(DownloadFault::Refused("retcode none".into())));
        assert_eq!(fault(100, &[json!("not an object frame")]), DownloadFault::Refused("retcode none".into()));
    }

    /// `StreamFrames`: every malformed stream, each refused for its own
    /// reason.
    #[test]
    fn stream_frames() {
        let ab = b"abcd";
        let cases: Vec<(&str, Vec<Value>, DownloadFault)> = vec![
            ("no file_info first", vec![chunk(0, ab), complete(4, 1)], DownloadFault::FirstNotInfo),
            ("second file_info", vec![info(4, 4), info(4, 4)], DownloadFault::SecondInfo),
            ("non-canonical base64", vec![info(4, 4), chunk_as(0, "YWJjZA=", 4)], DownloadFault::NotBase64),
            ("trailing bits", vec![info(1, 1), chunk_as(0, "YR==", 1)], DownloadFault::NotBase64),
            ("index gap", vec![info(8, 4), chunk(1, ab)], DownloadFault::ChunkOutOfOrder(0)),
            ("repeated index", vec![info(8, 4), chunk(0, ab), chunk(0, ab)], DownloadFault::ChunkOutOfOrder(1)),
            ("size mismatch", vec![info(4, 4), chunk_as(0, &STANDARD.encode(ab), 3)], DownloadFault::ChunkSizeMismatch),
            (
                "chunk without data",
                vec![info(4, 4), ok(json!({"type": "stream", "data_type": "file_chunk", "index": 0}))],
                DownloadFault::ChunkWithoutData,
            ),
            ("more than declared", vec![info(4, 4), chunk(0, ab), chunk(1, ab)], DownloadFault::OverDeclared),
            ("short of declared", vec![info(8, 4), chunk(0, ab), complete(4, 1)], DownloadFault::Short),
            ("terminal totals", vec![info(4, 4), chunk(0, ab), complete(5, 1)], DownloadFault::CompleteBytes),
            ("terminal chunk count", vec![info(4, 4), chunk(0, ab), complete(4, 2)], DownloadFault::CompleteChunks),
            ("missing terminal", vec![info(4, 4), chunk(0, ab)], DownloadFault::Unfinished),
            (
                "frame after terminal",
                vec![info(4, 4), chunk(0, ab), complete(4, 1), chunk(1, ab)],
                DownloadFault::AfterComplete,
            ),
            (
                "huge declared size",
                vec![info(1 << 50, 4), chunk(0, ab)],
                DownloadFault::DeclaredTooLarge { size: 1 << 50, limit: 1000 },
            ),
            (
                "error frame",
                vec![
                    info(4, 4),
                    json!({"status":"failed","retcode":100,"data":{"type":"error","data_type":"error"},"message":"boom","wording":"boom"}),
                ],
                DownloadFault::Refused("boom".into()),
            ),
            (
                "error type in an ok frame",
                vec![info(4, 4), ok(json!({"type": "error", "data_type": "file_chunk"}))],
                DownloadFault::Refused("retcode 0".into()),
            ),
            (
                "unknown frame",
                vec![info(4, 4), ok(json!({"data_type": "file_middle"}))],
                DownloadFault::Unexpected("file_middle".into()),
            ),
        ];
        for (name, frames, expected) in cases {
            let got = match run(1000, &[&body(&frames)]) {
                End::Fault(f) => f,
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(got, expected, "{name}");
        }
        // Undeclared sizes are bounded by the limit alone.
        assert_eq!(fault(6, &[info(0, 4), chunk(0, ab), chunk(1, ab)]), DownloadFault::OverLimit(6),);
    }

    #[test]
    fn chunk_counts_are_bounded() {
        let mut v = DownloadValidator::with_max_chunks(1000, 2);
        assert_eq!(v.frame(info(12, 4).to_string().as_bytes()), Err(DownloadFault::TooManyChunksDeclared(2)));
        let mut v = DownloadValidator::with_max_chunks(1000, 2);
        let frames = [info(0, 0), chunk(0, b"a"), chunk(1, b"b"), chunk(2, b"c")];
        let results: Vec<_> = frames.iter().map(|f| v.frame(f.to_string().as_bytes()).map(|_| ())).collect();
        assert_eq!(results[..3], [Ok(()), Ok(()), Ok(())]);
        assert_eq!(results[3], Err(DownloadFault::TooManyChunks(2)));
        assert_eq!(DownloadFault::TooManyChunks(MAX_FILE_CHUNKS).to_string(), "more than 200000 chunks");
    }
}
