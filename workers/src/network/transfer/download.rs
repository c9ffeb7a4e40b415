//! A download: the request, the frames through the validator into the
//! file, the fsync, and the reply.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use snowluma_proto::{ExecRequest, ToolReply};

use super::validate::{DownloadFault, DownloadValidator, Found, Limits, Step};
use super::{progress, uv_error};
use crate::network::{Bounds, ExecFailure, FrameReader, Net, Report, open};
use crate::serve::Ctx;

const REFUSED: &str = "Check the file or file_id (see get_action download_file_stream).";
const QUOTA: &str = "Move or delete earlier downloads from the download directory.";

/// The failure for a refused download, worded and located as Node's.
fn refusal(req: &ExecRequest, fault: &DownloadFault, at: Found) -> ExecFailure {
    let detail = fault.located(&req.action, at);
    match fault {
        DownloadFault::TerminalError(_) => ExecFailure::refused(detail, Some(REFUSED)),
        DownloadFault::FileSizeLimit(_) | DownloadFault::OverLimit(_) => ExecFailure::execution(detail),
        DownloadFault::Quota { .. } => ExecFailure { detail, report: Report::Execution { next_step: Some(QUOTA) } },
        _ => ExecFailure::invalid(detail),
    }
}

/// This download's share of the quota among the running downloads
/// ([`Net::downloads_reserved`]): its reservation until it announces a
/// size, then that size.
struct Share<'a> {
    total: &'a AtomicU64,
    bytes: u64,
}

impl<'a> Share<'a> {
    /// Joins the running downloads; what the others held before.
    fn join(total: &'a AtomicU64, bytes: u64) -> (Share<'a>, u64) {
        let before = total.fetch_add(bytes, Ordering::Relaxed);
        (Share { total, bytes }, before)
    }

    fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.total.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
            self.bytes = bytes;
        }
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

pub(crate) async fn download(
    net: &Net,
    req: &ExecRequest,
    params: Value,
    file: std::fs::File,
    room: u64,
    ctx: &Ctx,
) -> ToolReply {
    match run(net, req, &params, file, room, ctx).await {
        Ok(reply) => reply,
        Err(f) => f.reply(req),
    }
}

async fn run(
    net: &Net,
    req: &ExecRequest,
    params: &Value,
    mut file: std::fs::File,
    room: u64,
    ctx: &Ctx,
) -> Result<ToolReply, ExecFailure> {
    let (mut share, reserved) = Share::join(&net.downloads_reserved, room);
    let limits = Limits { max: net.max_stream_bytes, room, reserved };
    let resp = open(net, req, params, Bounds::default()).await?;
    let mut validator = DownloadValidator::new(limits);
    let mut reader = FrameReader::new(net, &req.action, resp, Bounds::default());
    while let Some(frame) = reader.next().await? {
        let at = Found::Frame(frame.index);
        match validator.frame(frame.index, &frame.value).map_err(|f| refusal(req, &f, at))? {
            Step::Info { size } => {
                if size > 0 {
                    share.shrink_to(size);
                }
                progress(ctx, true, 0, (size > 0).then_some(size));
            }
            Step::Chunk { data, received, declared } => {
                file.write_all(&data).map_err(|e| {
                    let a = &req.action;
                    let n = frame.index;
                    ExecFailure::execution(format!(
                        "action {a} stream frame {n}: frame handling failed: {}",
                        uv_error(&e, "write")
                    ))
                })?;
                progress(ctx, req.progress, received, (declared > 0).then_some(declared));
            }
            Step::Complete => {}
        }
    }
    let count = reader.count();
    let done = validator.finish(count).map_err(|f| refusal(req, &f, Found::Eof(count)))?;
    file.sync_all().map_err(|e| {
        let a = &req.action;
        ExecFailure::execution(format!("action {a} stream body: {}", uv_error(&e, "fsync")))
    })?;
    let result = json!({
        "file_name": done.file_name,
        "file_size": done.file_size,
        "sha256": done.sha256,
        "frame_count": done.frame_count,
        "terminal": done.terminal,
    });
    Ok(ToolReply::ok(&result))
}
