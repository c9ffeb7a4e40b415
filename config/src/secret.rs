//! The access tokens' short life in the supervisor and the spawner.
//!
//! Both tokens (SnowLuma's HTTP token and, when set, its WebSocket server's
//! own events token) go the same way. The spawner is forked before a token
//! is read, so it never holds one; it overwrites the environment variables'
//! bytes in place at its start. The supervisor then reads each token (from
//! `SNOWLUMA_MCP_TOKEN` or `--token-file`, `SNOWLUMA_MCP_EVENTS_TOKEN` or
//! `--events-token-file`) into buffers that are wiped when dropped, overwrites the
//! variable's bytes in its own environment block (so `/proc/<pid>/environ`
//! no longer shows them), hands the token to the network executor in one
//! frame built in a wiped buffer, and wipes its last copy as soon as the
//! frame is written (`workers.rs`). After that no process but the network
//! executor holds the token; if that executor stops, it cannot be given the
//! token again, and the session ends (see ARCHITECTURE.md).

use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use zeroize::{Zeroize, Zeroizing};

use crate::ConfigError;

pub const TOKEN_VAR: &str = "SNOWLUMA_MCP_TOKEN";
/// The event WebSocket's own token (optional; without it the event
/// WebSocket is sent [`TOKEN_VAR`]'s).
pub const EVENTS_TOKEN_VAR: &str = "SNOWLUMA_MCP_EVENTS_TOKEN";
/// No real access token is longer; a longer one is refused so that its
/// frame to the executor fits the pre-sized (never reallocated) buffer.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Where a token comes from: its variable and the flag naming its file.
#[derive(Debug, Clone, Copy)]
pub struct TokenSource {
    pub var: &'static str,
    pub flag: &'static str,
}

/// `SNOWLUMA_MCP_TOKEN` / `--token-file`.
pub const HTTP_TOKEN: TokenSource = TokenSource { var: TOKEN_VAR, flag: "--token-file" };
/// `SNOWLUMA_MCP_EVENTS_TOKEN` / `--events-token-file`.
pub const EVENTS_TOKEN: TokenSource = TokenSource { var: EVENTS_TOKEN_VAR, flag: "--events-token-file" };

/// Read a small file into one buffer that is never reallocated (a grown
/// buffer would leave a copy behind in freed memory) and is wiped on drop.
fn read_secret_file(path: &Path) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > MAX_TOKEN_BYTES as u64 * 4 {
        return Err(std::io::Error::other(format!("the file is larger than {} bytes", MAX_TOKEN_BYTES * 4)));
    }
    // One byte more than the size, to see the end of the file in one read.
    let mut buf = Zeroizing::new(vec![0u8; len as usize + 1]);
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if filled == buf.len() {
        return Err(std::io::Error::other("the file grew while it was read"));
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The token from `--token-file` (when given) or `SNOWLUMA_MCP_TOKEN`,
/// trimmed; `None` when neither holds one. Never shows the value.
pub fn read_token(token_file: Option<&Path>) -> Result<Option<Zeroizing<String>>, ConfigError> {
    read_token_from(HTTP_TOKEN, token_file)
}

/// A token from its file (when given) or its variable (`source`), trimmed
/// and checked as [`read_token`] does.
pub fn read_token_from(
    source: TokenSource,
    token_file: Option<&Path>,
) -> Result<Option<Zeroizing<String>>, ConfigError> {
    let bad = |problem: String| ConfigError { var: source.var, flag: source.flag, problem };
    let raw: Zeroizing<Vec<u8>> = match token_file {
        Some(path) => read_secret_file(path).map_err(|e| bad(format!("cannot be read from the given file: {e}")))?,
        None => match std::env::var_os(source.var) {
            Some(v) => Zeroizing::new(v.into_vec()),
            None => return Ok(None),
        },
    };
    let text = std::str::from_utf8(&raw).map_err(|_| bad("is not valid UTF-8 (value not shown)".into()))?;
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    if t.len() > MAX_TOKEN_BYTES {
        return Err(bad(format!("is longer than {MAX_TOKEN_BYTES} bytes (value not shown)")));
    }
    if t.chars().any(|c| c.is_control() || c == ' ') {
        return Err(bad("contains spaces or control characters (value not shown)".into()));
    }
    let mut out = Zeroizing::new(String::with_capacity(t.len()));
    out.push_str(t);
    Ok(Some(out))
}

unsafe extern "C" {
    /// The C library's environment array (POSIX).
    static mut environ: *mut *mut std::ffi::c_char;
}

/// Overwrite the value of `name` in this process's environment block with
/// zero bytes, in place: the kernel shows that block as
/// `/proc/<pid>/environ`. The variable stays present with an empty value.
/// Must be called while the process is single-threaded (nothing else may
/// read or change the environment meanwhile).
pub fn scrub_env(name: &str) {
    let prefix = format!("{name}=");
    // SAFETY: the process is single-threaded (documented precondition), so
    // nothing changes `environ` while we walk it. It is a NULL-terminated
    // array of pointers to NUL-terminated strings owned by the C library or
    // the initial stack; we only overwrite bytes before each string's NUL.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let entry = *p;
            let bytes = std::ffi::CStr::from_ptr(entry).to_bytes();
            if bytes.starts_with(prefix.as_bytes()) {
                let value = entry.add(prefix.len());
                for i in 0..bytes.len() - prefix.len() {
                    std::ptr::write_volatile(value.add(i), 0);
                }
            }
            p = p.add(1);
        }
    }
}

/// Wipe a string's bytes (its whole capacity) and leave it empty.
pub fn wipe(s: &mut String) {
    s.zeroize();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn token_files_are_trimmed_and_checked_without_showing_the_value() {
        let dir = std::env::temp_dir().join(format!("snowluma-secret-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(&f, " abc-123\n").unwrap();
        assert_eq!(read_token(Some(&f)).unwrap().unwrap().as_str(), "abc-123");
        std::fs::write(&f, "\n\n").unwrap();
        assert!(read_token(Some(&f)).unwrap().is_none());
        std::fs::write(&f, "se cret").unwrap();
        let e = read_token(Some(&f)).unwrap_err().to_string();
        assert!(e.contains("spaces") && !e.contains("cret"), "{e}");
        std::fs::write(&f, "x".repeat(MAX_TOKEN_BYTES + 1)).unwrap();
        assert!(read_token(Some(&f)).unwrap_err().to_string().contains("longer than"));
        let e = read_token(Some(&dir.join("missing"))).unwrap_err().to_string();
        assert!(e.contains("cannot be read"), "{e}");
        let e = read_token_from(EVENTS_TOKEN, Some(&dir.join("missing"))).unwrap_err().to_string();
        assert!(e.starts_with("SNOWLUMA_MCP_EVENTS_TOKEN (--events-token-file) cannot be read"), "{e}");
        std::fs::write(&f, "ws-token\n").unwrap();
        assert_eq!(read_token_from(EVENTS_TOKEN, Some(&f)).unwrap().unwrap().as_str(), "ws-token");
        std::fs::remove_dir_all(&dir).ok();
    }
}
