//! Downloads: the stale-part sweep, the directory quota, the `.part` file
//! created, streamed into by the network executor, then committed or
//! removed.

use std::sync::Arc;

use serde_json::{Value, json};
use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, FilesReply, FilesRequest, Progress, Request, ToolReply, Transfer,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{FdTag, TransferService, files_call, relay_fd};
use crate::replies::{call_error_reply, tool_reply};
use crate::workers::WorkerSlot;

/// A download's share of the directory quota, released when dropped.
struct Reservation {
    service: Arc<TransferService>,
    bytes: u64,
}

impl Reservation {
    /// The download announced its size: keep only that much reserved and
    /// let waiting downloads have the rest.
    fn shrink_to(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            return;
        }
        if let Ok(mut r) = self.service.reserved.lock() {
            *r = r.saturating_sub(self.bytes - bytes);
        }
        self.bytes = bytes;
        self.service.quota_freed.notify_waiters();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Ok(mut r) = self.service.reserved.lock() {
            *r = r.saturating_sub(self.bytes);
        }
        self.service.quota_freed.notify_waiters();
    }
}

/// Reserve room for a download of unknown size: what is left of the quota,
/// at most the per-file cap. While every byte is reserved by downloads
/// that have not announced their size yet (they announce it in their
/// first frame, and then keep only that), wait for room, up to the request
/// timeout; `None` if the quota stays used up.
async fn reserve(
    service: &Arc<TransferService>,
    used: u64,
    cancel: &CancellationToken,
) -> Result<Option<Reservation>, ToolReply> {
    let max = service.max_file_bytes;
    let quota = max.saturating_mul(2);
    let deadline = tokio::time::Instant::now() + service.quota_wait;
    loop {
        let freed = service.quota_freed.notified();
        let mut freed = std::pin::pin!(freed);
        freed.as_mut().enable();
        {
            let Ok(mut reserved) = service.reserved.lock() else {
                return Err(ToolReply::fail(FailureKind::Execution, "quota accounting is unavailable"));
            };
            let limit = quota.saturating_sub(used).saturating_sub(*reserved).min(max);
            if limit > 0 {
                *reserved += limit;
                return Ok(Some(Reservation { service: service.clone(), bytes: limit }));
            }
            if *reserved == 0 {
                // Nothing in flight will free anything: the files are there.
                return Ok(None);
            }
        }
        tokio::select! {
            () = freed => {}
            () = tokio::time::sleep_until(deadline) => return Ok(None),
            () = cancel.cancelled() => return Err(call_error_reply(crate::workers::CallError::Cancelled, false)),
        }
    }
}
/// Run a download: sweep once, reserve quota, create the `.part` file, hand
/// it to the network executor, then commit or remove it.
pub(super) async fn run(
    service: &Arc<TransferService>,
    mut exec: ExecRequest,
    cancel: &CancellationToken,
    progress: Option<mpsc::UnboundedSender<Progress>>,
) -> ToolReply {
    let (files, network) = (&service.files, &service.network);
    sweep_once(service).await;
    let mut reservation = match reserve_room(service, cancel).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let limit = reservation.bytes;
    let (token, tag) = match create_part(files, FdTag::new(files)).await {
        Ok(created) => created,
        Err(r) => return r,
    };
    if cancel.is_cancelled() {
        abort(files, token).await;
        return call_error_reply(crate::workers::CallError::Cancelled, false);
    }
    let ntag = match relay_fd(network, tag, cancel).await {
        Ok(t) => t,
        Err(r) => {
            abort(files, token).await;
            return r;
        }
    };
    exec.transfer = Some(Transfer::Download { fd_tag: ntag, limit_bytes: limit });
    let result = stream(network, exec, cancel, &mut reservation, progress).await;
    let reply = tool_reply("the network executor", result, false);
    if reply.is_error {
        abort(files, token).await;
        return reply;
    }
    commit(service, token, reply).await
}

/// Partial files left by a killed session go before the first download
/// measures the directory (live ones are locked and stay).
async fn sweep_once(service: &TransferService) {
    let files = &service.files;
    service
        .swept
        .get_or_init(|| async {
            match files_call(files, FilesRequest::SweepStaleParts, &CancellationToken::new()).await {
                Ok(FilesReply::Swept { .. }) => {}
                Ok(FilesReply::Refused { reason }) => {
                    tracing::warn!(reason, "stale partial downloads not swept")
                }
                _ => tracing::warn!("stale partial downloads not swept"),
            }
        })
        .await;
}

/// Measure the download directory and reserve this download's share of
/// the quota; the tool error when it stays used up.
async fn reserve_room(service: &Arc<TransferService>, cancel: &CancellationToken) -> Result<Reservation, ToolReply> {
    let quota = service.max_file_bytes.saturating_mul(2);
    let used = match files_call(&service.files, FilesRequest::DownloadUsage, cancel).await {
        Ok(FilesReply::Usage { bytes }) => bytes,
        Ok(FilesReply::Refused { reason }) => return Err(ToolReply::fail(FailureKind::Execution, reason)),
        Ok(_) => return Err(ToolReply::fail(FailureKind::Execution, "unexpected answer to a usage query")),
        Err(r) => return Err(r),
    };
    match reserve(service, used, cancel).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(ToolReply::error(
            Diagnostics::failed(
                FailureKind::Execution,
                format!("the download directory quota ({quota} bytes, twice SNOWLUMA_MCP_MAX_STREAM_BYTES) is used up"),
            )
            .with_next_step("Move or delete earlier downloads from the download directory."),
        )),
        Err(r) => Err(r),
    }
}

/// Have the files worker create the `.part` file; its token, and the tag of
/// the descriptor it sends.
async fn create_part(files: &Arc<WorkerSlot>, tag: FdTag) -> Result<(String, FdTag), ToolReply> {
    // Creating the `.part` file is not cancellable: a cancel while it
    // was being created used to leave it behind with nobody knowing
    // its token. It is quick; a cancel is honoured right after.
    let cleanup = CancellationToken::new();
    match files_call(files, FilesRequest::CreateDownload { fd_tag: tag.tag }, &cleanup).await {
        Ok(FilesReply::Created { token }) => Ok((token, tag)),
        Ok(FilesReply::Refused { reason }) => Err(ToolReply::fail(FailureKind::Execution, reason)),
        Ok(_) => Err(ToolReply::fail(FailureKind::Execution, "unexpected answer to a download create")),
        Err(r) => {
            // The worker may have created the `.part` file and died
            // before its answer (with the token) reached us: nobody
            // could abort it by token. Once the descriptor it may
            // have sent is dropped, nothing holds the file's lock, so
            // its successor's sweep removes it (live downloads are
            // locked and stay).
            drop(tag);
            if let Ok(FilesReply::Swept { removed }) =
                files_call(files, FilesRequest::SweepStaleParts, &CancellationToken::new()).await
                && removed > 0
            {
                tracing::info!(removed, "removed a partial download whose creation was not confirmed");
            }
            Err(r)
        }
    }
}

/// Remove the `.part` file. Cleanup runs even when the call itself was
/// cancelled.
async fn abort(files: &WorkerSlot, token: String) {
    let _ = files_call(files, FilesRequest::AbortDownload { token }, &CancellationToken::new()).await;
}

/// Run the download in the network executor. The executor reports the
/// announced size in its first progress report (always sent for
/// downloads): the reservation shrinks to it. Reports are passed on to the
/// client when it asked for them.
async fn stream(
    network: &WorkerSlot,
    exec: ExecRequest,
    cancel: &CancellationToken,
    reservation: &mut Reservation,
    progress: Option<mpsc::UnboundedSender<Progress>>,
) -> Result<snowluma_proto::Reply, crate::workers::CallError> {
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<Progress>();
    let call = network.call(Request::Execute(exec), cancel, Some(seen_tx));
    let mut call = std::pin::pin!(call);
    let mut announced = false;
    let result = loop {
        tokio::select! {
            r = &mut call => break r,
            Some(p) = seen_rx.recv() => {
                if !announced {
                    announced = true;
                    if let Some(total) = p.total {
                        reservation.shrink_to(total as u64);
                    }
                }
                if let Some(tx) = &progress {
                    let _ = tx.send(p);
                }
            }
        }
    };
    // Reports that arrived with the reply still go out before it.
    while let Ok(p) = seen_rx.try_recv() {
        if let Some(tx) = &progress {
            let _ = tx.send(p);
        }
    }
    drop(progress);
    result
}

/// Commit the downloaded `.part` file under its name and answer with where
/// it is; remove it when that cannot be done.
async fn commit(service: &TransferService, token: String, reply: ToolReply) -> ToolReply {
    let files = &service.files;
    let result = reply.result.as_ref().and_then(|t| t.parse().ok()).unwrap_or(Value::Null);
    let (Some(name), Some(size)) =
        (result.get("file_name").and_then(Value::as_str), result.get("file_size").and_then(Value::as_u64))
    else {
        abort(files, token).await;
        return ToolReply::fail(FailureKind::Execution, "the network executor's download report is incomplete");
    };
    let commit = FilesRequest::CommitDownload { token: token.clone(), file_name: name.to_owned(), size };
    match files_call(files, commit, &CancellationToken::new()).await {
        Ok(FilesReply::Committed { file_name }) => {
            let dir = service.paths.download_dir.clone().unwrap_or_default();
            let out = json!({
                "file_path": dir.join(file_name).display().to_string(),
                "file_size": size,
                "sha256": result.get("sha256").cloned().unwrap_or(Value::Null),
                "frame_count": result.get("frame_count").cloned().unwrap_or(Value::Null),
                "terminal": result.get("terminal").cloned().unwrap_or(Value::Null),
            });
            ToolReply::with_diagnostics(&out, reply.diagnostics)
        }
        Ok(FilesReply::Refused { reason }) => {
            ToolReply::fail(FailureKind::Execution, format!("the download could not be saved: {reason}"))
        }
        Ok(_) => ToolReply::fail(FailureKind::Execution, "unexpected answer to a download commit"),
        Err(r) => {
            abort(files, token).await;
            r
        }
    }
}
