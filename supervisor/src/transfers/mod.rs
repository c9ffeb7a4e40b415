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

mod download;
mod upload;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use snowluma_catalog::{Action, FileTransfer};
use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, FilesReply, FilesRequest, Progress, Reply, Request, ToolReply,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::upload::{INSIDE_THE_ROOT, not_configured_upload, nul_in_path, outside_root, upload_failure};
use crate::replies::call_error_reply;
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
/// The path of `input` relative to the upload root, lexically as Node's
/// `path.resolve` has it (`..` and `.` removed as text; a relative path is
/// taken relative to the root), when it lies beneath the root; `None` for
/// the root itself or anything outside it. The file-transfer worker then
/// follows symlinks beneath the root, and the kernel confines the open.
pub fn relative_to_root(input: &str, configured: &Path, canonical: &Path) -> Option<String> {
    snowluma_workers::upload_path::relative_to_root(input, &[canonical, configured])
}

/// What [`plan`] reads of a call's `params` (the gates' `Params`, which
/// keeps them as the client's text).
pub trait PlanParams {
    /// Whether `params` has member `key`.
    fn has(&self, key: &str) -> bool;
    /// Member `key` of `params`, if any.
    fn get(&self, key: &str) -> Option<serde_json::Value>;
}

/// Decide whether this call is a file transfer, and refuse what cannot be
/// done (`service`: this server's transfers, when it has any). The
/// automatic upload's checks come in the Node server's order: the upload
/// root, the MCP-owned params, then the path.
pub fn plan(
    service: Option<&TransferService>,
    action: &Action,
    params: &impl PlanParams,
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
        let name = action.name;
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
        match plan {
            Plan::Upload { rel, filename } => upload::run(&self, rel, filename, exec, &cancel, progress).await,
            Plan::Download => download::run(&self, exec, &cancel, progress).await,
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
}
