//! A download: the request, the frames through the validator into the
//! file, the fsync, and the reply.

use std::io::Write;

use serde_json::{Value, json};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, ToolReply};

use super::validate::{DownloadFault, DownloadValidator, Step};
use super::{invalid, progress};
use crate::network::{Net, for_each_frame, request, reqwest_failure, transport_failure};
use crate::serve::Ctx;

/// The tool error for a refused download.
fn refusal(req: &ExecRequest, fault: DownloadFault) -> ToolReply {
    match fault {
        DownloadFault::Refused(_) => ToolReply::error(
            Diagnostics::failed(FailureKind::BusinessFailure, fault.to_string())
                .with_next_step("Check the file or file_id (see get_action download_file_stream)."),
        ),
        DownloadFault::DeclaredTooLarge { .. } | DownloadFault::OverLimit(_) => {
            ToolReply::error(Diagnostics::failed(FailureKind::Execution, fault.to_string()))
        }
        _ => invalid(req, fault.to_string()),
    }
}

pub(crate) async fn download(
    net: &Net,
    req: &ExecRequest,
    params: Value,
    mut file: std::fs::File,
    limit: u64,
    ctx: &Ctx,
) -> ToolReply {
    let send = tokio::time::timeout(net.timeout, request(net, req, params).send()).await;
    let mut resp = match send {
        Err(_) => {
            return transport_failure(
                FailureKind::Timeout,
                "SnowLuma did not start the download in time".into(),
                req.write,
                true,
            );
        }
        Ok(Err(e)) => return reqwest_failure(&e, req.write, "download request"),
        Ok(Ok(r)) => r,
    };
    if let Err(fault) = DownloadValidator::status(resp.status().as_u16()) {
        return refusal(req, fault);
    }
    let mut validator = DownloadValidator::new(limit);
    let mut frame = |raw: Vec<u8>| -> Result<(), ToolReply> {
        match validator.frame(&raw).map_err(|f| refusal(req, f))? {
            Step::Info { size } => progress(ctx, true, 0, (size > 0).then_some(size)),
            Step::Chunk { data, received, declared } => {
                file.write_all(&data).map_err(|e| {
                    ToolReply::fail(FailureKind::Execution, format!("cannot write the download file: {e}"))
                })?;
                progress(ctx, req.progress, received, (declared > 0).then_some(declared));
            }
            Step::Complete => {}
        }
        Ok(())
    };
    if let Err(r) = for_each_frame(net, req, &mut resp, "download", &mut frame).await {
        return r;
    }
    let done = match validator.finish() {
        Ok(d) => d,
        Err(fault) => return refusal(req, fault),
    };
    if let Err(e) = file.sync_all() {
        return ToolReply::fail(FailureKind::Execution, format!("cannot flush the download file: {e}"));
    }
    let result = json!({
        "file_name": done.file_name,
        "file_size": done.file_size,
        "sha256": done.sha256,
        "frame_count": done.frame_count,
        "terminal": done.terminal,
    });
    ToolReply::ok(&result)
}
