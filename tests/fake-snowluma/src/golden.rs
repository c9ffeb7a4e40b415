//! The "golden" preset: the fake SnowLuma the Node server's transcripts
//! (`shared/reference/upstream/node-transcripts.jsonl`, sessions 4–13) were
//! recorded against, so that a replay can require Node's recorded answers.
//!
//! Its answers, as far as the transcripts show them:
//!
//! * `get_group_list`, `get_friend_list`, `get_login_info` answer fixed data;
//!   `set_group_name` and `set_group_kick` answer ok with `data: null`;
//!   `send_private_msg` without `message` fails with retcode 1400; the other
//!   built-ins are the plain fake's, anything else is retcode 1404.
//! * `test_download_stream {delay_ms}`: ten `data_chunk` frames, then the
//!   `data_complete` terminal, `delay_ms` apart.
//! * `download_file*_stream` of `fake://N`: N bytes, byte i being
//!   `(31 * i + 7) % 256`, named `fake-N.bin`, in chunks of `chunk_size`
//!   (65536 by default). Any other file, and every `upload_file_stream`
//!   request, is answered with one JSON body without the `\r\n\r\n` frame
//!   delimiter (which is why Node fails them: `EOF after frame 0:
//!   unterminated frame`).
//! * One-shot faults ([`GoldenFault`], armed per action by the transcripts'
//!   names with [`FakeSnowLuma::arm_fault`] or `POST /__fault {"action",
//!   "mode"}`, all cleared by [`FakeSnowLuma::reset_faults`] or `POST
//!   /__reset`). A download fault answers a 3-chunk file of 3 × `chunk_size`
//!   bytes, spoilt as the fault's name says.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::actions::{Frames, Params, u64_param};
use crate::stream::{FRAME_END, file_frames, frame_failed, frame_ok};

/// The golden fake's one-shot faults, by the transcripts' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoldenFault {
    /// HTTP 200 with a body that is not JSON.
    NonJson,
    /// HTTP 500 with a body that is not JSON.
    Http500,
    /// HTTP 200 with a JSON array.
    ArrayBody,
    /// The head announces the whole body; half of it comes, then the close.
    Truncated,
    /// The connection closes with no answer at all.
    Reset,
    /// No answer until the client hangs up.
    Hang,
    /// A 100 000-deep answer (an object around 100 000 nested arrays).
    Deep,
    /// A download without its `file_complete` terminal.
    NoTerminal,
    /// A second `file_complete` after the first.
    DoubleTerminal,
    /// A fourth chunk beyond the declared size.
    TooManyBytes,
    /// Frame 2 is `this is not json`.
    GarbageFrame,
    /// Frame 2 is a failure frame ("disk full").
    ErrorFrame,
    /// The first frame is a chunk.
    NoFileInfo,
    /// Chunk 1 is not base64.
    BadBase64,
    /// Chunk 1 carries index 2.
    IndexGap,
    /// Chunk 1 claims one byte more than it carries.
    SizeMismatch,
    /// The connection breaks off after two frames.
    ResetMid,
    /// Frame 1 is larger than 24 MiB.
    GiantFrame,
}

impl GoldenFault {
    pub const ALL: [GoldenFault; 18] = [
        GoldenFault::NonJson,
        GoldenFault::Http500,
        GoldenFault::ArrayBody,
        GoldenFault::Truncated,
        GoldenFault::Reset,
        GoldenFault::Hang,
        GoldenFault::Deep,
        GoldenFault::NoTerminal,
        GoldenFault::DoubleTerminal,
        GoldenFault::TooManyBytes,
        GoldenFault::GarbageFrame,
        GoldenFault::ErrorFrame,
        GoldenFault::NoFileInfo,
        GoldenFault::BadBase64,
        GoldenFault::IndexGap,
        GoldenFault::SizeMismatch,
        GoldenFault::ResetMid,
        GoldenFault::GiantFrame,
    ];

    /// The transcripts' name (`setup.fault.mode`).
    pub fn name(self) -> &'static str {
        match self {
            GoldenFault::NonJson => "non_json",
            GoldenFault::Http500 => "http500",
            GoldenFault::ArrayBody => "array_body",
            GoldenFault::Truncated => "truncated",
            GoldenFault::Reset => "reset",
            GoldenFault::Hang => "hang",
            GoldenFault::Deep => "deep",
            GoldenFault::NoTerminal => "no_terminal",
            GoldenFault::DoubleTerminal => "double_terminal",
            GoldenFault::TooManyBytes => "too_many_bytes",
            GoldenFault::GarbageFrame => "garbage_frame",
            GoldenFault::ErrorFrame => "error_frame",
            GoldenFault::NoFileInfo => "no_file_info",
            GoldenFault::BadBase64 => "bad_base64",
            GoldenFault::IndexGap => "index_gap",
            GoldenFault::SizeMismatch => "size_mismatch",
            GoldenFault::ResetMid => "reset_mid",
            GoldenFault::GiantFrame => "giant_frame",
        }
    }
}

/// A fault name the golden fake does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFault(pub String);

impl std::fmt::Display for UnknownFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown golden fault {:?}", self.0)
    }
}

impl std::error::Error for UnknownFault {}

impl std::str::FromStr for GoldenFault {
    type Err = UnknownFault;

    fn from_str(name: &str) -> Result<GoldenFault, UnknownFault> {
        GoldenFault::ALL.into_iter().find(|f| f.name() == name).ok_or_else(|| UnknownFault(name.to_owned()))
    }
}

/// Default download chunk size (SnowLuma's).
const DEFAULT_CHUNK: u64 = 64 * 1024;
/// SnowLuma's largest chunk size.
const MAX_CHUNK: u64 = 16 * 1024 * 1024;
/// The golden fake's largest `fake://N` (and fault) file.
const MAX_FAKE_FILE: u64 = 64 * 1024 * 1024;

/// Byte `i` of every `fake://N` file.
pub fn fake_byte(i: usize) -> u8 {
    ((31 * i + 7) % 256) as u8
}

/// The bytes of `fake://n`.
pub fn fake_file(n: usize) -> Vec<u8> {
    (0..n).map(fake_byte).collect()
}

/// `N` of `fake://N`.
fn fake_size(params: &Params) -> Option<u64> {
    let file = params.get("file").and_then(Value::as_str)?;
    let n: u64 = file.strip_prefix("fake://")?.parse().ok()?;
    (n <= MAX_FAKE_FILE).then_some(n)
}

fn chunk_size(params: &Params) -> u64 {
    u64_param(params, "chunk_size").ok().flatten().filter(|c| *c > 0).unwrap_or(DEFAULT_CHUNK).min(MAX_CHUNK)
}

/// How the golden fake answers a call it answers its own way.
pub(crate) enum GoldenReply {
    /// Frames, each followed by the delimiter, `Duration` apart.
    Paced(Frames, Duration),
    /// One JSON body (Content-Length) without a frame delimiter.
    Undelimited(Value),
}

/// The golden fake's own answer to a Stream action, if it has one.
pub(crate) fn stream_reply(
    action: &str,
    params: &Params,
    upload_answer: impl FnOnce() -> Value,
) -> Option<GoldenReply> {
    match action {
        "test_download_stream" => {
            let delay = u64_param(params, "delay_ms").ok().flatten().unwrap_or(0);
            let frames = crate::stream::test_download(params);
            Some(GoldenReply::Paced(Box::new(frames.into_iter()), Duration::from_millis(delay)))
        }
        "download_file_stream" | "download_file_image_stream" | "download_file_record_stream" => {
            Some(match fake_size(params) {
                Some(n) => {
                    let bytes = Arc::new(fake_file(usize::try_from(n).unwrap_or(0)));
                    GoldenReply::Paced(file_frames(bytes, format!("fake-{n}.bin"), chunk_size(params)), Duration::ZERO)
                }
                None => {
                    let file = params.get("file").and_then(Value::as_str).unwrap_or_default();
                    GoldenReply::Undelimited(frame_failed(100, &format!("file not found: {file}")))
                }
            })
        }
        "upload_file_stream" => Some(GoldenReply::Undelimited(upload_answer())),
        _ => None,
    }
}

/// An ordinary-call fault's answer: status and raw body.
pub(crate) fn raw_answer(fault: GoldenFault) -> Option<(u16, Vec<u8>)> {
    match fault {
        GoldenFault::NonJson => Some((200, b"this is not json".to_vec())),
        GoldenFault::Http500 => Some((500, b"Internal Server Error".to_vec())),
        GoldenFault::ArrayBody => Some((200, b"[1,2,3]".to_vec())),
        GoldenFault::Deep => {
            let mut body = br#"{"status":"ok","retcode":0,"data":"#.to_vec();
            body.extend(std::iter::repeat_n(b'[', 100_000));
            body.extend(std::iter::repeat_n(b']', 100_000));
            body.push(b'}');
            Some((200, body))
        }
        _ => None,
    }
}

/// A spoilt download's frames as raw pieces (each with its delimiter), and
/// whether the connection breaks off after them.
pub(crate) fn fault_frames(fault: GoldenFault, params: &Params) -> Option<(Vec<Vec<u8>>, bool)> {
    let chunk = usize::try_from(chunk_size(params)).unwrap_or(65536);
    let name = match fake_size(params) {
        Some(n) => format!("fake-{n}.bin"),
        None => "fake.bin".to_owned(),
    };
    let bytes = fake_file(3 * chunk);
    let total = bytes.len();
    let info = frame_ok(json!({
        "type": "stream", "data_type": "file_info", "file_name": name, "file_size": total, "chunk_size": chunk
    }));
    let chunk_frame = |index: usize, data: String, size: usize| {
        frame_ok(json!({
            "type": "stream", "data_type": "file_chunk", "index": index, "data": data, "size": size,
            "progress": ((index + 1) * chunk * 100 / total).min(100), "base64_size": data.len()
        }))
    };
    let good = |index: usize| {
        let part = &bytes[index * chunk..(index + 1) * chunk];
        chunk_frame(index, crate::base64::encode(part), part.len())
    };
    let complete = frame_ok(json!({
        "type": "response", "data_type": "file_complete", "file_name": name, "total_chunks": 3,
        "total_bytes": total, "message": "Download completed"
    }));
    let spoilt: Vec<Value> = match fault {
        GoldenFault::NoTerminal => vec![info, good(0), good(1), good(2)],
        GoldenFault::DoubleTerminal => vec![info, good(0), good(1), good(2), complete.clone(), complete],
        GoldenFault::TooManyBytes => {
            let extra = chunk_frame(3, crate::base64::encode(&bytes[..chunk]), chunk);
            vec![info, good(0), good(1), good(2), extra, complete]
        }
        GoldenFault::ErrorFrame => vec![info, good(0), frame_failed(100, "disk full")],
        GoldenFault::NoFileInfo => vec![good(0), info, good(1), good(2), complete],
        GoldenFault::BadBase64 => vec![info, good(0), chunk_frame(1, "%%%%not-base64%%%%".into(), chunk), complete],
        GoldenFault::IndexGap => vec![info, good(0), good(2), complete],
        GoldenFault::SizeMismatch => {
            let part = &bytes[chunk..2 * chunk];
            vec![info, good(0), chunk_frame(1, crate::base64::encode(part), part.len() + 1), good(2), complete]
        }
        GoldenFault::ResetMid => vec![info, good(0)],
        GoldenFault::GarbageFrame | GoldenFault::GiantFrame => vec![info, good(0)],
        _ => return None,
    };
    let mut pieces: Vec<Vec<u8>> = spoilt.iter().map(framed).collect();
    match fault {
        GoldenFault::GarbageFrame => {
            pieces.push([&b"this is not json"[..], FRAME_END].concat());
            pieces.push(framed(&good(1)));
        }
        GoldenFault::GiantFrame => {
            // Frame 1: a chunk of 25 MiB of base64 (over the 24 MiB wire limit).
            pieces.truncate(1);
            let giant = chunk_frame(0, "A".repeat(25 * 1024 * 1024), 0);
            pieces.push(framed(&giant));
        }
        _ => {}
    }
    Some((pieces, fault == GoldenFault::ResetMid))
}

fn framed(frame: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(frame).unwrap_or_default();
    bytes.extend_from_slice(FRAME_END);
    bytes
}

/// What the golden preset answers of the ordinary actions.
pub(crate) fn preset_responses() -> Vec<(&'static str, Value)> {
    let ok = crate::actions::ok;
    vec![
        (
            "get_group_list",
            ok(json!([{"group_id": 20001, "group_name": "g1", "member_count": 3, "max_member_count": 200}])),
        ),
        ("get_login_info", ok(json!({"user_id": 10001, "nickname": "fake-bot"}))),
        ("get_friend_list", ok(json!([{"user_id": 30001, "nickname": "f1", "remark": ""}]))),
        ("set_group_name", ok(Value::Null)),
        ("set_group_kick", ok(Value::Null)),
    ]
}
