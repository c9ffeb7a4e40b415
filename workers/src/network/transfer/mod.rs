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
//!
//! Every failure is worded as the Node server's client words it.

mod download;
mod upload;
pub mod validate;

use snowluma_proto::Progress;

pub(crate) use download::download;
pub(crate) use upload::upload;

use crate::serve::Ctx;

use snowluma_proto::bytes::hex;

fn progress(ctx: &Ctx, enabled: bool, done: u64, total: Option<u64>) {
    if enabled {
        ctx.progress(Progress { progress: done as f64, total: total.map(|t| t as f64), message: None });
    }
}

/// A file error as Node's `fs` words it: `ENOSPC: no space left on device,
/// write` (libuv's code and description, then the system call).
fn uv_error(e: &std::io::Error, syscall: &str) -> String {
    use nix::libc;
    let named = match e.raw_os_error() {
        Some(libc::ENOSPC) => Some(("ENOSPC", "no space left on device")),
        Some(libc::EIO) => Some(("EIO", "i/o error")),
        Some(libc::EBADF) => Some(("EBADF", "bad file descriptor")),
        Some(libc::EDQUOT) => Some(("EDQUOT", "disk quota exceeded")),
        Some(libc::EFBIG) => Some(("EFBIG", "file too large")),
        Some(libc::EACCES) => Some(("EACCES", "permission denied")),
        Some(libc::EPERM) => Some(("EPERM", "operation not permitted")),
        Some(libc::EROFS) => Some(("EROFS", "read-only file system")),
        Some(libc::EISDIR) => Some(("EISDIR", "illegal operation on a directory")),
        Some(libc::EINTR) => Some(("EINTR", "interrupted system call")),
        Some(libc::EAGAIN) => Some(("EAGAIN", "resource temporarily unavailable")),
        Some(libc::EINVAL) => Some(("EINVAL", "invalid argument")),
        _ => None,
    };
    match named {
        Some((code, what)) => format!("{code}: {what}, {syscall}"),
        None => format!("{e}, {syscall}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_errors_are_worded_as_nodes_fs() {
        let e = std::io::Error::from_raw_os_error(nix::libc::ENOSPC);
        assert_eq!(super::uv_error(&e, "write"), "ENOSPC: no space left on device, write");
    }
}
