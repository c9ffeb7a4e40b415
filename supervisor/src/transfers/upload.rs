//! The automatic upload: the input file opened beneath the upload root and
//! streamed by the network executor, and every refusal in Node's words.

use std::path::Path;
use std::sync::Arc;

use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, FilesReply, FilesRequest, Progress, Request, ToolReply, Transfer,
    UploadRefusal,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{FdTag, TransferService, UPLOAD_CHUNK_BYTES, files_call, relay_fd};
use crate::replies::tool_reply;

/// A failure of the automatic upload as the Node server words it:
/// `调用失败 (<action>): action <action> stream <stage>: <detail>`.
pub(super) fn upload_failure(kind: FailureKind, action: &str, stage: &str, detail: &str, next: &str) -> ToolReply {
    let text = snowluma_proto::texts::call_failed(action, &format!("action {action} stream {stage}: {detail}"));
    ToolReply::error(Diagnostics::failed(kind, text).with_next_step(next))
}

pub(super) const INSIDE_THE_ROOT: &str =
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

pub(super) fn not_configured_upload(action: &str) -> ToolReply {
    upload_failure(
        FailureKind::NotConfigured,
        action,
        "resolve input",
        "SNOWLUMA_MCP_UPLOAD_ROOT is not configured",
        "The operator must set SNOWLUMA_MCP_UPLOAD_ROOT (and SNOWLUMA_MCP_MODE=write).",
    )
}

pub(super) fn outside_root(action: &str) -> ToolReply {
    upload_failure(
        FailureKind::InvalidArguments,
        action,
        "resolve input",
        "resolved path is outside the configured upload root",
        INSIDE_THE_ROOT,
    )
}

/// Node's message for a path with a NUL byte (its `realpath` refuses it).
pub(super) fn nul_in_path(input: &str) -> String {
    let shown = input.replace('\\', "\\\\").replace('\'', "\\'").replace('\0', "\\x00");
    format!("The argument 'path' must be a string, Uint8Array, or URL without null bytes. Received '{shown}'")
}

/// Open the input file beneath the upload root, hand it to the network
/// executor and run the upload.
pub(super) async fn run(
    service: &Arc<TransferService>,
    rel: String,
    filename: Option<String>,
    mut exec: ExecRequest,
    cancel: &CancellationToken,
    progress: Option<mpsc::UnboundedSender<Progress>>,
) -> ToolReply {
    let (files, network) = (&service.files, &service.network);
    let tag = FdTag::new(files);
    let (size, name) =
        match files_call(files, FilesRequest::OpenUpload { rel_path: rel, fd_tag: tag.tag }, cancel).await {
            Ok(FilesReply::Opened { size, name }) => (size, name),
            Ok(FilesReply::UploadRefused(refusal)) => {
                let root = service.paths.upload_root.as_ref().map(|(_, c)| c.as_path()).unwrap_or(Path::new("/"));
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

#[cfg(test)]
mod tests {
    use super::*;

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
