//! `serve-http`'s own options, validated by the launcher: where to listen,
//! the access token file, TLS, the accepted `Host` and `Origin` names.
//! Every problem is one line.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::Digest;

use snowluma_proto::front::TokenDigest;

#[derive(Debug, Clone)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Shortest accepted access token.
pub const MIN_TOKEN_CHARS: usize = 32;
/// Largest token file, certificate or key file read.
const MAX_FILE: u64 = 64 * 1024;

pub fn parse_listen(raw: &str) -> Result<Listen, String> {
    if raw.starts_with('/') {
        return Ok(Listen::Unix(PathBuf::from(raw)));
    }
    raw.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
        format!("--listen {raw:?} is neither HOST:PORT (an IP address and port) nor an absolute Unix socket path")
    })
}

/// `--socket-mode`: permission bits in octal (`660`, `0600`), nothing else.
pub fn parse_socket_mode(raw: &str) -> Result<u32, String> {
    let digits = raw.strip_prefix("0o").unwrap_or(raw);
    let mode = (!digits.is_empty() && digits.len() <= 4 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        .then(|| u32::from_str_radix(digits, 8).ok())
        .flatten()
        .filter(|m| *m <= 0o777);
    mode.ok_or_else(|| format!("--socket-mode {raw:?} is not permission bits in octal (such as 660 or 600)"))
}

/// Refuse a non-loopback TCP address unless it has TLS and `--allow-remote`.
pub fn check_exposure(listen: &Listen, tls: bool, allow_remote: bool) -> Result<(), String> {
    match listen {
        Listen::Tcp(addr) if !addr.ip().is_loopback() && (!tls || !allow_remote) => Err(format!(
            "refusing to listen on {addr}: a non-loopback address needs TLS (--tls-cert, --tls-key) and --allow-remote"
        )),
        _ => Ok(()),
    }
}

/// Read a small file that must be private to this user (no group or other
/// permission bits).
pub fn read_private(path: &Path, what: &str) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{what} {}: cannot be opened: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("{what} {}: cannot be examined: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{what} {}: is not a regular file", path.display()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {}: has mode {:o}, which lets other users read it; chmod it to 600",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    if meta.len() > MAX_FILE {
        return Err(format!("{what} {}: is larger than {MAX_FILE} bytes", path.display()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE), &mut text)
        .map_err(|e| format!("{what} {}: cannot be read as UTF-8 text: {e}", path.display()))?;
    Ok(text)
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Parse the token file: `ID:TOKEN` per line, blank lines and `#` comments
/// ignored. Only digests leave this function.
pub fn parse_tokens(text: &str) -> Result<Vec<TokenDigest>, String> {
    let mut out: Vec<TokenDigest> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}", n + 1);
        let (id, token) = line.split_once(':').ok_or_else(|| bad("is not ID:TOKEN"))?;
        if !valid_id(id) {
            return Err(bad("the ID must be 1 to 64 characters of A-Z a-z 0-9 _ . -"));
        }
        if token.chars().count() < MIN_TOKEN_CHARS || token.chars().any(char::is_whitespace) {
            return Err(bad(&format!("the token must be at least {MIN_TOKEN_CHARS} characters without whitespace")));
        }
        if out.iter().any(|t| t.id == id) {
            return Err(bad("the ID is used twice"));
        }
        out.push(TokenDigest { id: id.to_owned(), sha256: sha2::Sha256::digest(token.as_bytes()).into() });
    }
    if out.is_empty() {
        return Err("holds no token (ID:TOKEN lines)".into());
    }
    Ok(out)
}

pub fn load_tokens(path: &Path) -> Result<Vec<TokenDigest>, String> {
    let mut text = read_private(path, "--http-token-file")?;
    let parsed = parse_tokens(&text).map_err(|e| format!("--http-token-file {}: {e}", path.display()));
    snowluma_config::secret::wipe(&mut text);
    parsed
}

/// The default `Host` values: loopback names with the actual port (a Unix
/// socket: `localhost`).
pub fn default_hosts(listen: &Listen, port: Option<u16>) -> Vec<String> {
    match (listen, port) {
        (Listen::Tcp(addr), Some(port)) => {
            let mut v: Vec<String> =
                ["localhost", "127.0.0.1", "[::1]"].iter().map(|h| format!("{h}:{port}")).collect();
            if !addr.ip().is_loopback() {
                v.push(match addr {
                    SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
                    SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
                });
            }
            v
        }
        _ => vec!["localhost".into()],
    }
}

pub fn default_origins(port: Option<u16>) -> Vec<String> {
    let mut v = Vec::new();
    for scheme in ["http", "https"] {
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            match port {
                Some(p) => v.push(format!("{scheme}://{host}:{p}")),
                None => v.push(format!("{scheme}://{host}")),
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lines() {
        let t = parse_tokens("# c\n\nalice:0123456789abcdef0123456789abcdef\n").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].id, "alice");
        assert!(parse_tokens("").is_err());
        assert!(parse_tokens("alice:short").is_err());
        assert!(parse_tokens("al ice:0123456789abcdef0123456789abcdef").is_err());
        assert!(parse_tokens("x:0123456789abcdef 0123456789abcdef00").is_err());
        assert!(parse_tokens("a:0123456789abcdef0123456789abcdef\na:0123456789abcdef0123456789abcdef").is_err());
    }

    #[test]
    fn exposure() {
        let l = parse_listen("0.0.0.0:80").unwrap();
        assert!(check_exposure(&l, false, true).is_err());
        assert!(check_exposure(&l, true, false).is_err());
        assert!(check_exposure(&l, true, true).is_ok());
        assert!(check_exposure(&parse_listen("127.0.0.1:0").unwrap(), false, false).is_ok());
        assert!(check_exposure(&parse_listen("/run/x.sock").unwrap(), false, false).is_ok());
        assert!(parse_listen("localhost:80").is_err());
    }

    #[test]
    fn socket_modes() {
        assert_eq!(parse_socket_mode("660"), Ok(0o660));
        assert_eq!(parse_socket_mode("0600"), Ok(0o600));
        assert_eq!(parse_socket_mode("0o666"), Ok(0o666));
        for bad in ["", "8", "1777", "4755", "rw", "-1", "0o", "66 0"] {
            assert!(parse_socket_mode(bad).is_err(), "{bad}");
        }
    }
}
