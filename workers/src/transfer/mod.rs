//! File transfers in the network executor: downloads written into a file
//! the file-transfer worker created, and automatic uploads read from a file
//! it opened. Both files arrive as descriptors; this process has no paths.
//!
//! Downloads ([`download`]): the frames are checked by a pure state machine
//! ([`validate`]): the first frame must be `file_info`; every `file_chunk`
//! must carry the next index and canonical base64 whose decoded length
//! matches `size`; running totals stay within the declared size and the
//! limit; the terminal `file_complete` must match the bytes and chunks
//! received. The SHA-256 is computed as bytes are accepted; the file is
//! fsynced before the success reply, and the supervisor then has it
//! committed (renamed).
//!
//! Uploads ([`upload`]): `upload_file_stream` chunks of `chunk_bytes`, each
//! acknowledged (`chunk_received`), then a completion with the expected
//! SHA-256 that the server must confirm (`file_complete`, size, hash,
//! `file_path`). The file's size and mtime are re-checked after reading. Any
//! failure after the first request, including cancellation, sends a
//! best-effort `reset` with its own short timeout.

mod download;
mod upload;
pub mod validate;

use snowluma_proto::{ExecRequest, FailureKind, Progress, ToolReply};

pub(crate) use download::download;
pub(crate) use upload::upload;

use crate::network::transport_failure;
use crate::serve::Ctx;

use snowluma_proto::bytes::hex;

fn invalid(req: &ExecRequest, msg: impl Into<String>) -> ToolReply {
    transport_failure(FailureKind::InvalidResponse, msg.into(), req.write, true)
}

fn progress(ctx: &Ctx, enabled: bool, done: u64, total: Option<u64>) {
    if enabled {
        ctx.progress(Progress { progress: done as f64, total: total.map(|t| t as f64), message: None });
    }
}
