//! File transfers, orchestrated by the supervisor without touching bytes.
//!
//! The file-transfer worker creates or opens the file and passes its
//! descriptor here; the supervisor forwards the descriptor to the network
//! executor, which streams the bytes from or into it. The supervisor keeps
//! the bookkeeping: the download quota, committing or removing the `.part`
//! file, and the result the client sees.
//!
//! [`TransferService`] owns all of it (the workers it talks to, the paths,
//! the quota reservations, the one-time sweep), and [`TransferService::run`]
//! borrows nothing from the request that started it: a transfer's future is
//! `'static` and can outlive that request (a background task).
//! Which actions are transfers is the catalog's
//! [`snowluma_catalog::FileTransfer`] property.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_catalog::{Action, FileTransfer};
use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, FilesReply, FilesRequest, Progress, Reply, Request, ToolReply, Transfer,
    UploadRefusal,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::server::{call_error_reply, tool_reply};
use crate::workers::WorkerSlot;

/// Paths on the MCP host for transfers, resolved at startup.
#[derive(Debug, Clone, Default)]
pub struct TransferPaths {
    /// The upload root as configured and as canonicalized.
    pub upload_root: Option<(PathBuf, PathBuf)>,
    pub download_dir: Option<PathBuf>,
}

/// File transfers of one server: the file-transfer worker, the network
/// executor, the paths and the download quota's state.
pub struct TransferService {
    files: Arc<WorkerSlot>,
    network: Arc<WorkerSlot>,
    paths: TransferPaths,
    /// Per-file cap; the directory quota is twice this.
    max_file_bytes: u64,
    /// How long a download waits for room in the quota.
    quota_wait: Duration,
    /// Bytes reserved by downloads in flight (quota accounting).
    reserved: std::sync::Mutex<u64>,
    /// Signalled when a download's reservation shrinks or ends.
    quota_freed: tokio::sync::Notify,
    /// Set once stale `.part` files were swept (before the first download).
    swept: tokio::sync::OnceCell<()>,
}

impl TransferService {
    pub fn new(
        files: Arc<WorkerSlot>,
        network: Arc<WorkerSlot>,
        paths: TransferPaths,
        max_file_bytes: u64,
        quota_wait: Duration,
    ) -> Arc<TransferService> {
        Arc::new(TransferService {
            files,
            network,
            paths,
            max_file_bytes,
            quota_wait,
            reserved: std::sync::Mutex::new(0),
            quota_freed: tokio::sync::Notify::new(),
            swept: tokio::sync::OnceCell::new(),
        })
    }

    pub fn paths(&self) -> &TransferPaths {
        &self.paths
    }
}

/// Upload chunk size: 512 KiB of file bytes (about 683 KiB of base64 per request).
pub const UPLOAD_CHUNK_BYTES: u64 = 512 * 1024;
/// Params that automatic upload sets itself.
pub const MCP_OWNED_UPLOAD_FIELDS: [&str; 9] = [
    "stream_id",
    "chunk_data",
    "chunk_index",
    "total_chunks",
    "file_size",
    "expected_sha256",
    "is_complete",
    "reset",
    "verify_only",
];

#[derive(Debug)]
pub enum Plan {
    Download,
    Upload { rel: String, filename: Option<String> },
}

fn bad_args(msg: impl Into<String>, next: &str) -> ToolReply {
    ToolReply::error(Diagnostics::failed(FailureKind::InvalidArguments, msg).with_next_step(next))
}

fn not_configured(msg: impl Into<String>, next: &str) -> ToolReply {
    ToolReply::error(Diagnostics::failed(FailureKind::NotConfigured, msg).with_next_step(next))
}

/// A failure of the automatic upload as the Node server words it:
/// `调用失败 (<action>): action <action> stream <stage>: <detail>`.
fn upload_failure(kind: FailureKind, action: &str, stage: &str, detail: &str, next: &str) -> ToolReply {
    let text = snowluma_proto::texts::call_failed(action, &format!("action {action} stream {stage}: {detail}"));
    ToolReply::error(Diagnostics::failed(kind, text).with_next_step(next))
}

const INSIDE_THE_ROOT: &str =
    "Give a regular file inside SNOWLUMA_MCP_UPLOAD_ROOT (symbolic links are followed while they stay inside it).";

/// Node's message for a failed file-system call: libuv's code and text,
/// the call and the path (`ENOENT: no such file or directory, lstat '/r/x'`).
fn fs_error(errno: i32, syscall: &str, path: &Path) -> String {
    let (code, text) = match errno {
        nix::libc::ENOENT => ("ENOENT", "no such file or directory"),
        nix::libc::ENOTDIR => ("ENOTDIR", "not a directory"),
        nix::libc::EACCES => ("EACCES", "permission denied"),
        nix::libc::EPERM => ("EPERM", "operation not permitted"),
        nix::libc::ELOOP => ("ELOOP", "too many symbolic links encountered"),
        nix::libc::ENAMETOOLONG => ("ENAMETOOLONG", "name too long"),
        nix::libc::EISDIR => ("EISDIR", "illegal operation on a directory"),
        nix::libc::EMFILE => ("EMFILE", "too many open files"),
        nix::libc::ENFILE => ("ENFILE", "file table overflow"),
        nix::libc::EIO => ("EIO", "i/o error"),
        nix::libc::ENOMEM => ("ENOMEM", "not enough memory"),
        nix::libc::EXDEV => ("EXDEV", "cross-device link not permitted"),
        nix::libc::EAGAIN => ("EAGAIN", "resource temporarily unavailable"),
        nix::libc::EINVAL => ("EINVAL", "invalid argument"),
        other => {
            let e = nix::errno::Errno::from_raw(other);
            return format!("{e:?}: {}, {syscall} '{}'", e.desc().to_lowercase(), path.display());
        }
    };
    format!("{code}: {text}, {syscall} '{}'", path.display())
}

/// The tool error for an input file the file-transfer worker did not open.
fn upload_refused(action: &str, root: &Path, refusal: UploadRefusal) -> ToolReply {
    let at = |rel: &str| root.join(rel);
    match refusal {
        UploadRefusal::NotEnabled => not_configured_upload(action),
        UploadRefusal::Lookup { errno, syscall, rel_path } => upload_failure(
            FailureKind::InvalidArguments,
            action,
            "resolve input",
            &fs_error(errno, &syscall, &at(&rel_path)),
            INSIDE_THE_ROOT,
        ),
        UploadRefusal::Outside => outside_root(action),
        UploadRefusal::Open { errno, rel_path } => upload_failure(
            FailureKind::InvalidArguments,
            action,
            "open input",
            &fs_error(errno, "open", &at(&rel_path)),
            INSIDE_THE_ROOT,
        ),
        UploadRefusal::NotRegular => upload_failure(
            FailureKind::InvalidArguments,
            action,
            "open input",
            "input_file is not a regular file",
            "Give a regular file, not a directory, FIFO, socket or device.",
        ),
        UploadRefusal::HardLinks => upload_failure(
            FailureKind::InvalidArguments,
            action,
            "open input",
            "input_file has more than one hard link",
            "Copy the file into the upload root instead: a hard link inside it could name a file that lives outside it.",
        ),
        UploadRefusal::TooLarge { limit } => upload_failure(
            FailureKind::InvalidArguments,
            action,
            "open input",
            &format!("input_file exceeds limit ({limit} bytes)"),
            "Upload a smaller file, or raise SNOWLUMA_MCP_MAX_STREAM_BYTES.",
        ),
        UploadRefusal::NoOpenat2 => upload_failure(
            FailureKind::NotConfigured,
            action,
            "open input",
            "this kernel provides no openat2 (Linux 5.6 or later is needed, and a seccomp filter around the server, such as systemd's RestrictSUIDSGID=, must not refuse it)",
            "The operator must run the server where openat2 is available (`snowluma-mcp doctor` reports it).",
        ),
        UploadRefusal::Failed(reason) => {
            upload_failure(FailureKind::Execution, action, "open input", &reason, "Call the tool again.")
        }
    }
}

fn not_configured_upload(action: &str) -> ToolReply {
    upload_failure(
        FailureKind::NotConfigured,
        action,
        "resolve input",
        "SNOWLUMA_MCP_UPLOAD_ROOT is not configured",
        "The operator must set SNOWLUMA_MCP_UPLOAD_ROOT (and SNOWLUMA_MCP_MODE=write).",
    )
}

fn outside_root(action: &str) -> ToolReply {
    upload_failure(
        FailureKind::InvalidArguments,
        action,
        "resolve input",
        "resolved path is outside the configured upload root",
        INSIDE_THE_ROOT,
    )
}

/// Node's message for a path with a NUL byte (its `realpath` refuses it).
fn nul_in_path(input: &str) -> String {
    let shown = input.replace('\\', "\\\\").replace('\'', "\\'").replace('\0', "\\x00");
    format!("The argument 'path' must be a string, Uint8Array, or URL without null bytes. Received '{shown}'")
}

/// The path of `input` relative to the upload root, lexically as Node's
/// `path.resolve` has it (`..` and `.` removed as text; a relative path is
/// taken relative to the root), when it lies beneath the root; `None` for
/// the root itself or anything outside it. The file-transfer worker then
/// follows symlinks beneath the root, and the kernel confines the open.
pub fn relative_to_root(input: &str, configured: &Path, canonical: &Path) -> Option<String> {
    snowluma_workers::upload_path::relative_to_root(input, &[canonical, configured])
}

/// Decide whether this call is a file transfer, and refuse what cannot be
/// done (`service`: this server's transfers, when it has any). The
/// automatic upload's checks come in the Node server's order: the upload
/// root, the MCP-owned params, then the path.
pub fn plan(
    service: Option<&TransferService>,
    action: &Action,
    params: &crate::gates::Params,
    input_file: Option<&str>,
) -> Result<Option<Plan>, ToolReply> {
    if let Some(input) = input_file {
        if action.transfer != Some(FileTransfer::Upload) {
            return Err(bad_args(
                "execution.input_file 仅可用于 upload_file_stream。",
                "Remove execution.input_file, or use it with upload_file_stream.",
            ));
        }
        // upload_file_stream has no alias: its canonical name is the name
        // the caller wrote, which Node's texts show.
        let name = action.name.as_str();
        let Some((configured, canonical)) = service.and_then(|s| s.paths.upload_root.as_ref()) else {
            return Err(not_configured_upload(name));
        };
        let owned: Vec<&str> = MCP_OWNED_UPLOAD_FIELDS.iter().copied().filter(|f| params.has(f)).collect();
        if !owned.is_empty() {
            return Err(upload_failure(
                FailureKind::InvalidArguments,
                name,
                "prepare upload",
                &format!("params conflict with MCP-owned transfer fields: {}", owned.join(", ")),
                "Remove them; only filename and file_retention may be given.",
            ));
        }
        if input.contains('\0') {
            return Err(upload_failure(
                FailureKind::InvalidArguments,
                name,
                "resolve input",
                &nul_in_path(input),
                INSIDE_THE_ROOT,
            ));
        }
        let Some(rel) = relative_to_root(input, configured, canonical) else {
            return Err(outside_root(name));
        };
        let filename = params.get("filename").and_then(|f| f.as_str().map(str::to_owned));
        return Ok(Some(Plan::Upload { rel, filename }));
    }
    if action.transfer == Some(FileTransfer::Download) {
        if service.is_none() {
            return Err(not_configured(
                "file downloads need write mode and a download directory",
                "The operator must set SNOWLUMA_MCP_MODE=write.",
            ));
        }
        return Ok(Some(Plan::Download));
    }
    Ok(None)
}

fn random_tag() -> u64 {
    u64::from_le_bytes(crate::trace::random_bytes::<8>())
}

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

async fn files_call(
    files: &WorkerSlot,
    req: FilesRequest,
    cancel: &CancellationToken,
) -> Result<FilesReply, ToolReply> {
    match files.call(Request::Files(req), cancel, None).await {
        Ok(Reply::Files(r)) => Ok(r),
        Ok(_) => Err(ToolReply::fail(FailureKind::Execution, "the file-transfer worker answered unexpectedly")),
        Err(e) => Err(call_error_reply(e, false)),
    }
}

/// The tag of a descriptor the file-transfer worker sends us: until it is
/// claimed, dropping this (a cancel, a refusal, an error) tells the
/// descriptor table to drop the descriptor, whenever it arrives.
struct FdTag {
    files: Arc<WorkerSlot>,
    tag: u64,
    claimed: bool,
}

impl FdTag {
    fn new(files: &Arc<WorkerSlot>) -> FdTag {
        FdTag { files: files.clone(), tag: random_tag(), claimed: false }
    }
}

impl Drop for FdTag {
    fn drop(&mut self) {
        if !self.claimed {
            self.files.forget_fd(self.tag);
        }
    }
}

/// Hand the file the files worker sent (tag) to the network executor; returns the new tag.
async fn relay_fd(network: &WorkerSlot, mut tag: FdTag, cancel: &CancellationToken) -> Result<u64, ToolReply> {
    let fd = tag.files.claim_fd(tag.tag, cancel).await.map_err(|e| call_error_reply(e, false))?;
    tag.claimed = true;
    let ntag = random_tag();
    network.send_fd(ntag, fd.as_fd(), cancel).await.map_err(|e| call_error_reply(e, false))?;
    Ok(ntag)
}

impl TransferService {
    /// Run a planned transfer to its end. Everything it needs is owned (the
    /// service by `Arc`), so the future may outlive the request that
    /// started it.
    pub async fn run(
        self: Arc<Self>,
        plan: Plan,
        exec: ExecRequest,
        cancel: CancellationToken,
        progress: Option<mpsc::UnboundedSender<Progress>>,
    ) -> ToolReply {
        run(&self, plan, exec, &cancel, progress).await
    }
}

async fn run(
    service: &Arc<TransferService>,
    plan: Plan,
    mut exec: ExecRequest,
    cancel: &CancellationToken,
    progress: Option<mpsc::UnboundedSender<Progress>>,
) -> ToolReply {
    let (files, network) = (&service.files, &service.network);
    match plan {
        Plan::Upload { rel, filename } => {
            let tag = FdTag::new(files);
            let (size, name) =
                match files_call(files, FilesRequest::OpenUpload { rel_path: rel, fd_tag: tag.tag }, cancel).await {
                    Ok(FilesReply::Opened { size, name }) => (size, name),
                    Ok(FilesReply::UploadRefused(refusal)) => {
                        let root =
                            service.paths.upload_root.as_ref().map(|(_, c)| c.as_path()).unwrap_or(Path::new("/"));
                        return upload_refused(&exec.action, root, refusal);
                    }
                    Ok(FilesReply::Refused { reason }) => {
                        return upload_refused(&exec.action, Path::new("/"), UploadRefusal::Failed(reason));
                    }
                    Ok(_) => return ToolReply::fail(FailureKind::Execution, "unexpected answer to an upload open"),
                    Err(r) => return r,
                };
            let ntag = match relay_fd(network, tag, cancel).await {
                Ok(t) => t,
                Err(r) => return r,
            };
            exec.transfer = Some(Transfer::Upload {
                fd_tag: ntag,
                size,
                filename: filename.unwrap_or(name),
                chunk_bytes: UPLOAD_CHUNK_BYTES,
            });
            tool_reply("the network executor", network.call(Request::Execute(exec), cancel, progress).await, true)
        }
        Plan::Download => {
            // Partial files left by a killed session go before the first
            // download measures the directory (live ones are locked and stay).
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
            let quota = service.max_file_bytes.saturating_mul(2);
            let used = match files_call(files, FilesRequest::DownloadUsage, cancel).await {
                Ok(FilesReply::Usage { bytes }) => bytes,
                Ok(FilesReply::Refused { reason }) => return ToolReply::fail(FailureKind::Execution, reason),
                Ok(_) => return ToolReply::fail(FailureKind::Execution, "unexpected answer to a usage query"),
                Err(r) => return r,
            };
            let mut reservation = match reserve(service, used, cancel).await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    return ToolReply::error(
                        Diagnostics::failed(
                            FailureKind::Execution,
                            format!("the download directory quota ({quota} bytes, twice SNOWLUMA_MCP_MAX_STREAM_BYTES) is used up"),
                        )
                        .with_next_step("Move or delete earlier downloads from the download directory."),
                    );
                }
                Err(r) => return r,
            };
            let limit = reservation.bytes;
            let tag = FdTag::new(files);
            // Creating the `.part` file is not cancellable: a cancel while it
            // was being created used to leave it behind with nobody knowing
            // its token. It is quick; a cancel is honoured right after.
            let cleanup = CancellationToken::new();
            let token = match files_call(files, FilesRequest::CreateDownload { fd_tag: tag.tag }, &cleanup).await {
                Ok(FilesReply::Created { token }) => token,
                Ok(FilesReply::Refused { reason }) => return ToolReply::fail(FailureKind::Execution, reason),
                Ok(_) => return ToolReply::fail(FailureKind::Execution, "unexpected answer to a download create"),
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
                    return r;
                }
            };
            // Cleanup runs even when the call itself was cancelled.
            let abort = |token: String| async move {
                let _ = files_call(files, FilesRequest::AbortDownload { token }, &CancellationToken::new()).await;
            };
            if cancel.is_cancelled() {
                abort(token).await;
                return call_error_reply(crate::workers::CallError::Cancelled, false);
            }
            let ntag = match relay_fd(network, tag, cancel).await {
                Ok(t) => t,
                Err(r) => {
                    abort(token).await;
                    return r;
                }
            };
            exec.transfer = Some(Transfer::Download { fd_tag: ntag, limit_bytes: limit });
            // The executor reports the announced size in its first progress
            // report (always sent for downloads): the reservation shrinks to
            // it. Reports are passed on to the client when it asked for them.
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
            let reply = tool_reply("the network executor", result, false);
            if reply.is_error {
                abort(token).await;
                return reply;
            }
            let result = reply.result.as_ref().and_then(|t| t.parse().ok()).unwrap_or(Value::Null);
            let (Some(name), Some(size)) =
                (result.get("file_name").and_then(Value::as_str), result.get("file_size").and_then(Value::as_u64))
            else {
                abort(token).await;
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
                    abort(token).await;
                    r
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer borrows nothing from the request that starts it.
    #[allow(dead_code)]
    fn runs_detached(service: Arc<TransferService>, plan: Plan, exec: ExecRequest) {
        fn detached<F: std::future::Future + Send + 'static>(_: F) {}
        detached(service.run(plan, exec, CancellationToken::new(), None));
    }

    #[test]
    fn input_paths_stay_inside_the_root() {
        let root = Path::new("/srv/up");
        let canon = Path::new("/data/up");
        assert_eq!(relative_to_root("/srv/up/a/b.txt", root, canon).unwrap(), "a/b.txt");
        assert_eq!(relative_to_root("/data/up/./c", root, canon).unwrap(), "c");
        assert_eq!(relative_to_root("/data/up/sub/../c", root, canon).unwrap(), "c");
        assert_eq!(relative_to_root("up/a", root, canon).unwrap(), "up/a");
        assert!(relative_to_root("/srv/up/../etc/passwd", root, canon).is_none());
        assert!(relative_to_root("/etc/passwd", root, canon).is_none());
        assert!(relative_to_root("../x", root, canon).is_none());
        assert!(relative_to_root("/srv/up", root, canon).is_none());
        assert!(relative_to_root("/srv/upper/x", root, canon).is_none());
    }

    #[test]
    fn refusals_are_worded_as_node_words_them() {
        let root = Path::new("/r");
        let text = |r: UploadRefusal| upload_refused("upload_file_stream", root, r).diagnostics.message.unwrap();
        let lookup =
            UploadRefusal::Lookup { errno: nix::libc::ENOENT, syscall: "lstat".into(), rel_path: "missing.txt".into() };
        assert_eq!(
            text(lookup),
            "调用失败 (upload_file_stream): action upload_file_stream stream resolve input: ENOENT: no such file or directory, lstat '/r/missing.txt'"
        );
        assert_eq!(
            text(UploadRefusal::TooLarge { limit: 1048576 }),
            "调用失败 (upload_file_stream): action upload_file_stream stream open input: input_file exceeds limit (1048576 bytes)"
        );
        assert!(nul_in_path("a\0b").ends_with("Received 'a\\x00b'"), "{}", nul_in_path("a\0b"));
    }
}
