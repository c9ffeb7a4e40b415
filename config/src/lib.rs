//! Configuration: `SNOWLUMA_MCP_*` variables and the matching flags, validated
//! at startup. Every problem is one line naming the variable (and flag) and
//! the offending value; the token's value is never printed.

pub mod endpoint;
pub mod safety;
pub mod secret;

use std::path::PathBuf;

use clap::Parser;

use crate::endpoint::{Endpoint, EndpointError, Scheme};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Docs,
    Read,
    Write,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Docs => "docs",
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
    pub fn executes(self) -> bool {
        self != Mode::Docs
    }
}

/// snowluma-mcp: a security-hardened MCP server for SnowLuma's OneBot v11 actions.
///
/// This is a stdio server: an MCP client (Claude Code, Claude Desktop,
/// Cursor, VS Code, Cline, ...) launches it and speaks MCP on its stdin and
/// stdout; run by hand in a terminal it just waits for a client's messages.
/// Configure it in the client with this binary's absolute path as the
/// command and the SNOWLUMA_MCP_* variables below as its environment.
///
/// Without SNOWLUMA_MCP_ENDPOINT it serves the bundled action documentation
/// only (docs mode). The token is read from SNOWLUMA_MCP_TOKEN or from
/// --token-file (the event WebSocket's own, if any, from
/// SNOWLUMA_MCP_EVENTS_TOKEN or --events-token-file); there is deliberately
/// no --token flag, because command lines are visible to every user of the
/// host.
#[derive(Debug, Parser)]
#[command(name = "snowluma-mcp", version, about, long_about, after_help = ENV_ONLY_HELP)]
pub struct Cli {
    /// docs, read or write (default: read with an endpoint, docs without).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_MODE", hide_env_values = true)]
    pub mode: Option<String>,
    /// OneBot HTTP endpoint, e.g. http://127.0.0.1:3000/ (POSTed to exactly as given). A host
    /// name (not an IP literal) is resolved once, at startup before confinement; if its address
    /// changes later, restart the server.
    #[arg(global = true, long, env = "SNOWLUMA_MCP_ENDPOINT", hide_env_values = true)]
    pub endpoint: Option<String>,
    /// Read the access token from this file instead of SNOWLUMA_MCP_TOKEN.
    #[arg(global = true, long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Request timeout in milliseconds (also stream connect and idle timeout).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_TIMEOUT_MS", hide_env_values = true)]
    pub timeout_ms: Option<String>,
    /// Directory on this host for downloaded stream files.
    #[arg(global = true, long, env = "SNOWLUMA_MCP_STREAM_DIR", hide_env_values = true)]
    pub stream_dir: Option<String>,
    /// Directory on this host from which automatic uploads may read.
    #[arg(global = true, long, env = "SNOWLUMA_MCP_UPLOAD_ROOT", hide_env_values = true)]
    pub upload_root: Option<String>,
    /// Per-file limit for uploads and downloads, in bytes (1 to 4 GiB).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_MAX_STREAM_BYTES", hide_env_values = true)]
    pub max_stream_bytes: Option<String>,
    /// OneBot WebSocket event endpoint (ws:// or wss://).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_EVENTS_URL", hide_env_values = true)]
    pub events_url: Option<String>,
    /// Read the event WebSocket's own access token from this file instead of
    /// SNOWLUMA_MCP_EVENTS_TOKEN (without either, the event WebSocket gets SNOWLUMA_MCP_TOKEN's).
    #[arg(global = true, long, value_name = "PATH")]
    pub events_token_file: Option<PathBuf>,
    /// Private directory for persistent background tasks (absolute path).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_TASK_DIR", hide_env_values = true)]
    pub task_dir: Option<String>,
    /// Tamper-evident audit log of executed and refused actions (absolute path): hash-chained,
    /// MAC'd JSON lines, with <LOG>.head anchoring its end. Check it with `snowluma-mcp audit
    /// verify LOG`.
    #[arg(global = true, long, env = "SNOWLUMA_MCP_AUDIT_LOG", hide_env_values = true, value_name = "LOG")]
    pub audit_log: Option<String>,
    /// The audit log's HMAC key file (absolute path; 64 hex characters). Read at startup and never
    /// created: make it with `snowluma-mcp audit keygen FILE`. Default: <LOG>.key beside the log,
    /// created 0600 on first use. Keep it outside the log's directory (e.g. systemd
    /// LoadCredential=) so that whoever can write the log cannot forge records or its head.
    #[arg(global = true, long, env = "SNOWLUMA_MCP_AUDIT_KEY", hide_env_values = true, value_name = "FILE")]
    pub audit_key: Option<String>,
    /// Only these actions may run (comma-separated names or aliases).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_ALLOW_ACTIONS", hide_env_values = true)]
    pub allow_actions: Option<String>,
    /// These actions never run (comma-separated names or aliases; wins over allow).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_DENY_ACTIONS", hide_env_values = true)]
    pub deny_actions: Option<String>,
    /// invoke_action asks the human to confirm these actions first (comma-separated names, aliases
    /// or the preset `destructive`; unset: no confirmation).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_CONFIRM_ACTIONS", hide_env_values = true)]
    pub confirm_actions: Option<String>,
    /// Only these groups may be named by a call (comma-separated group numbers, or none).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_ALLOW_GROUPS", hide_env_values = true)]
    pub allow_groups: Option<String>,
    /// Only these users may be named by a call (comma-separated QQ numbers, or none).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_ALLOW_USERS", hide_env_values = true)]
    pub allow_users: Option<String>,
    /// Minimum milliseconds between two sends to the same target (default 3000; 0 = off).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_SEND_INTERVAL_MS", hide_env_values = true)]
    pub send_interval_ms: Option<String>,
    /// Sends that may go at once over all targets (global bucket; default 5; 0 = off).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_SEND_BURST", hide_env_values = true)]
    pub send_burst: Option<String>,
    /// Milliseconds the global bucket takes to regain one send (default 3000; 0 = off).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_SEND_REFILL_MS", hide_env_values = true)]
    pub send_refill_ms: Option<String>,
    /// Diagnostics filter for stderr (e.g. info, debug, snowluma_mcp=trace).
    #[arg(global = true, long, env = "SNOWLUMA_MCP_LOG", hide_env_values = true, default_value = "info,rmcp=warn")]
    pub log: String,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Variables without a flag, listed after the options.
const ENV_ONLY_HELP: &str = "Environment variables without a flag:
  SNOWLUMA_MCP_TOKEN             SnowLuma access token, sent as Authorization: Bearer (or use --token-file)
  SNOWLUMA_MCP_EVENTS_TOKEN      the event WebSocket's own access token, when SnowLuma's WebSocket
                                 server has another one than its HTTP server (or use
                                 --events-token-file); default: SNOWLUMA_MCP_TOKEN's
  SNOWLUMA_MCP_ALLOW_UNCONFINED  1 lets read and write modes start on a kernel that cannot fully
                                 enforce the sandbox (Landlock ABI >= 6 and seccomp)
  SNOWLUMA_MCP_SHOW_SCOPE_IDS    1 lets get_runtime_info list the ids of SNOWLUMA_MCP_ALLOW_GROUPS /
                                 ALLOW_USERS (otherwise it shows only how many there are)
  SNOWLUMA_MCP_LOG_PAYLOADS      1 lets debug/trace diagnostics of libraries (rmcp, HTTP) show
                                 message texts, paths and tokens; otherwise they are capped at info

Check this host's confinement with `snowluma-mcp doctor`.";

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Show what confinement this kernel enforces per role and run escape
    /// probes; exits non-zero if any forbidden operation succeeds.
    Doctor {
        /// Machine-readable output (one JSON document).
        #[arg(long)]
        json: bool,
    },
    /// Audit log tools.
    Audit {
        #[command(subcommand)]
        action: AuditCommand,
    },
    /// Serve MCP over Streamable HTTP (both eras) on a loopback address or a Unix socket, with
    /// bearer tokens.
    ///
    /// Each legacy MCP session, and the modern requests of one token from one client host, get
    /// their own confined server tree, configured by the SNOWLUMA_MCP_* variables and options
    /// as the stdio server is. See the README, "Remote access (serve-http)".
    ServeHttp(ServeHttpArgs),
}

/// `snowluma-mcp serve-http`: see README "Remote access (serve-http)".
#[derive(Debug, clap::Args)]
pub struct ServeHttpArgs {
    /// HOST:PORT (loopback unless --allow-remote with TLS) or an absolute Unix socket path.
    #[arg(long, value_name = "HOST:PORT|PATH")]
    pub listen: String,
    /// Access tokens, one `ID:TOKEN` per line (mode 0600 or stricter); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub http_token_file: PathBuf,
    /// TLS certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow a non-loopback TCP address (TLS required).
    #[arg(long)]
    pub allow_remote: bool,
    /// An accepted Origin (scheme://host[:port]); repeatable. A request without Origin is accepted.
    #[arg(long, value_name = "ORIGIN")]
    pub allowed_origin: Vec<String>,
    /// An accepted Host header (host[:port]); repeatable.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub allowed_host: Vec<String>,
    /// Concurrent server trees per token (legacy sessions; modern: one per client host).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_sessions_per_token: u32,
    /// Concurrent requests (including open streams) per token.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_requests_per_token: u32,
    /// Seconds after which a session without requests or open streams ends.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub idle_timeout: u64,
    /// Permission bits of the Unix socket (--listen PATH), in octal; the umask does not apply.
    #[arg(long, value_name = "OCTAL", default_value = "660")]
    pub socket_mode: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Check an audit log: hash chain, record MACs and head file; exits non-zero if anything is wrong.
    ///
    /// Names the first bad line, or what was removed from the end. The head file is <LOG>.head.
    /// Without a readable key the chain and the head's shape are checked but not the MACs, and
    /// the output says so.
    Verify {
        #[arg(value_name = "LOG")]
        path: PathBuf,
        /// The key file (default: --audit-key / SNOWLUMA_MCP_AUDIT_KEY, else <LOG>.key).
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Write a fresh head file anchoring the log's last record, after checking chain and MACs.
    ///
    /// For a log whose head is missing or damaged, or that was written by a release without head
    /// files, once you have checked that the log is as expected. The key is required.
    Reanchor {
        #[arg(value_name = "LOG")]
        path: PathBuf,
        /// The key file (default: --audit-key / SNOWLUMA_MCP_AUDIT_KEY, else <LOG>.key).
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Make a new audit key file (0600; an existing file is never overwritten).
    ///
    /// For example for systemd's LoadCredential= together with SNOWLUMA_MCP_AUDIT_KEY.
    Keygen {
        #[arg(value_name = "FILE")]
        path: PathBuf,
    },
}

#[derive(Clone)]
pub struct Config {
    pub mode: Mode,
    /// SNOWLUMA_MCP_ENDPOINT, parsed once (every later use reads this).
    pub endpoint: Option<Endpoint>,
    pub timeout_ms: u64,
    pub stream_dir: Option<PathBuf>,
    pub upload_root: Option<PathBuf>,
    pub max_stream_bytes: u64,
    /// SNOWLUMA_MCP_EVENTS_URL, parsed once.
    pub events_url: Option<Endpoint>,
    pub task_dir: Option<PathBuf>,
    pub audit_log: Option<PathBuf>,
    /// SNOWLUMA_MCP_AUDIT_KEY: the audit key's file; `None` is `<log>.key`.
    pub audit_key: Option<PathBuf>,
    pub allow_actions: Option<String>,
    pub deny_actions: Option<String>,
    /// SNOWLUMA_MCP_CONFIRM_ACTIONS as given (resolved by the supervisor).
    pub confirm_actions: Option<String>,
    /// SNOWLUMA_MCP_ALLOW_GROUPS / ALLOW_USERS (`safety.rs`).
    pub scope: safety::ScopeConfig,
    /// SNOWLUMA_MCP_SEND_* (`safety.rs`).
    pub pacing: safety::PacingConfig,
    pub log: String,
    /// SNOWLUMA_MCP_LOG_PAYLOADS=1: library debug/trace lines are not capped.
    pub log_payloads: bool,
    /// The download directory's path (the configured one, or the default,
    /// computed at startup: the confined supervisor may not ask its uid).
    pub stream_dir_path: PathBuf,
    /// Non-fatal notes for stderr (e.g. a mode ignored for lack of endpoint).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("mode", &self.mode)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_stream_bytes", &self.max_stream_bytes)
            .finish_non_exhaustive()
    }
}

pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 2_147_483_647;
pub const MAX_STREAM_BYTES: u64 = 4 * 1024 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("{var} ({flag}) {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub flag: &'static str,
    pub problem: String,
}

fn bad(var: &'static str, flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError { var, flag, problem: problem.into() }
}

fn nonempty(v: &Option<String>) -> Option<String> {
    v.as_ref().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

fn positive_int(var: &'static str, flag: &'static str, raw: &str, max: u64) -> Result<u64, ConfigError> {
    let ok = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) && !raw.starts_with('0');
    let n = if ok { raw.parse::<u64>().ok() } else { None };
    match n {
        Some(n) if n <= max => Ok(n),
        _ => Err(bad(var, flag, format!("must be a whole number from 1 to {max}; got {raw:?}"))),
    }
}

/// Where the default download directory lives: a base directory and the
/// server's own directory beneath it, `downloads` below that. A user's
/// `$XDG_RUNTIME_DIR` when it is set and absolute (private by design),
/// otherwise a directory named for the uid in `$TMPDIR` (or `/tmp`).
pub fn default_stream_base() -> (PathBuf, String) {
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        return (x, "snowluma-mcp".to_owned());
    }
    (std::env::temp_dir(), format!("snowluma-mcp-{}", nix::unistd::geteuid().as_raw()))
}

/// The last component of the default download directory.
pub const DOWNLOADS_SUBDIR: &str = "downloads";

/// The default download directory's path (see [`default_stream_base`]).
pub fn default_stream_dir() -> PathBuf {
    let (base, top) = default_stream_base();
    base.join(top).join(DOWNLOADS_SUBDIR)
}

/// The HTTP endpoint, parsed (see [`crate::endpoint`]).
pub fn http_endpoint(raw: &str) -> Result<Endpoint, EndpointError> {
    Endpoint::parse(raw, &[Scheme::Http, Scheme::Https], "http:// or https://")
}

/// The events URL, parsed: no query or fragment either.
pub fn events_endpoint(raw: &str) -> Result<Endpoint, EndpointError> {
    let e = Endpoint::parse(raw, &[Scheme::Ws, Scheme::Wss], "ws:// or wss://")?;
    if e.has_query {
        return Err(EndpointError::Query);
    }
    Ok(e)
}

impl Config {
    /// Resolve and validate. The access token is not part of the
    /// configuration: it is read later, after the spawner is forked
    /// (`secret::read_token`).
    pub fn resolve(cli: &Cli) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let endpoint = match nonempty(&cli.endpoint) {
            // Shown without credentials, query or fragment (an access_token
            // may be there).
            Some(e) => Some(http_endpoint(&e).map_err(|p| {
                bad("SNOWLUMA_MCP_ENDPOINT", "--endpoint", format!("{p}; got {}", crate::endpoint::shown_raw(&e)))
            })?),
            None => None,
        };
        let mode = resolve_mode(cli, endpoint.is_some(), &mut warnings)?;
        let timeout_ms = match nonempty(&cli.timeout_ms) {
            None => DEFAULT_TIMEOUT_MS,
            Some(raw) => positive_int("SNOWLUMA_MCP_TIMEOUT_MS", "--timeout-ms", &raw, MAX_TIMEOUT_MS)?,
        };
        let max_stream_bytes = match nonempty(&cli.max_stream_bytes) {
            None => MAX_STREAM_BYTES,
            Some(raw) => positive_int("SNOWLUMA_MCP_MAX_STREAM_BYTES", "--max-stream-bytes", &raw, MAX_STREAM_BYTES)?,
        };
        let stream_dir = absolute("SNOWLUMA_MCP_STREAM_DIR", "--stream-dir", &cli.stream_dir)?;
        let upload_root = absolute("SNOWLUMA_MCP_UPLOAD_ROOT", "--upload-root", &cli.upload_root)?;
        let task_dir = absolute("SNOWLUMA_MCP_TASK_DIR", "--task-dir", &cli.task_dir)?;
        let audit_log = absolute("SNOWLUMA_MCP_AUDIT_LOG", "--audit-log", &cli.audit_log)?;
        let audit_key = absolute("SNOWLUMA_MCP_AUDIT_KEY", "--audit-key", &cli.audit_key)?;
        if audit_key.is_some() && audit_log.is_none() {
            warnings.push(
                "SNOWLUMA_MCP_AUDIT_KEY is set but SNOWLUMA_MCP_AUDIT_LOG is not: no audit log is written".into(),
            );
        }
        let events_url = match nonempty(&cli.events_url) {
            Some(u) => Some(events_endpoint(&u).map_err(|p| {
                bad("SNOWLUMA_MCP_EVENTS_URL", "--events-url", format!("{p}; got {}", crate::endpoint::shown_raw(&u)))
            })?),
            None => None,
        };
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&cli.log) {
            return Err(bad("SNOWLUMA_MCP_LOG", "--log", format!("is not a valid filter ({e}); got {:?}", cli.log)));
        }
        let log_payloads = log_payloads()?;
        let (scope, pacing) = safety::resolve(safety::Raw {
            allow_groups: &cli.allow_groups,
            allow_users: &cli.allow_users,
            send_interval_ms: &cli.send_interval_ms,
            send_burst: &cli.send_burst,
            send_refill_ms: &cli.send_refill_ms,
        })?;
        let stream_dir_path = stream_dir.clone().unwrap_or_else(default_stream_dir);
        Ok(Config {
            mode,
            endpoint,
            timeout_ms,
            stream_dir,
            upload_root,
            max_stream_bytes,
            events_url,
            task_dir,
            audit_log,
            audit_key,
            allow_actions: nonempty(&cli.allow_actions),
            deny_actions: nonempty(&cli.deny_actions),
            confirm_actions: nonempty(&cli.confirm_actions),
            scope,
            pacing,
            log: cli.log.clone(),
            log_payloads,
            stream_dir_path,
            warnings,
        })
    }

    /// The log filter as processes take it (this one and the workers, on
    /// their command line): SNOWLUMA_MCP_LOG, marked when payloads may be
    /// logged.
    pub fn worker_log_filter(&self) -> String {
        if self.log_payloads { format!("{LOG_PAYLOADS_PREFIX}{}", self.log) } else { self.log.clone() }
    }

    /// The TCP ports the network executor (and so the spawner) may connect
    /// to: the endpoint's and, when events are configured, the events URL's.
    pub fn network_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = [&self.endpoint, &self.events_url].into_iter().flatten().map(|e| e.port).collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

/// SNOWLUMA_MCP_MODE; without an endpoint only documentation is served
/// (an explicit read or write mode is then ignored, with a warning).
fn resolve_mode(cli: &Cli, has_endpoint: bool, warnings: &mut Vec<String>) -> Result<Mode, ConfigError> {
    let explicit = match nonempty(&cli.mode) {
        None => None,
        Some(m) => Some(match m.to_ascii_lowercase().as_str() {
            "docs" => Mode::Docs,
            "read" => Mode::Read,
            "write" => Mode::Write,
            _ => {
                return Err(bad("SNOWLUMA_MCP_MODE", "--mode", format!("must be one of docs, read, write; got {m:?}")));
            }
        }),
    };
    Ok(match (has_endpoint, explicit) {
        (false, Some(m @ (Mode::Read | Mode::Write))) => {
            warnings.push(format!(
                "SNOWLUMA_MCP_MODE={} ignored: no SNOWLUMA_MCP_ENDPOINT set, serving documentation only",
                m.as_str()
            ));
            Mode::Docs
        }
        (false, _) => Mode::Docs,
        (true, Some(m)) => m,
        (true, None) => Mode::Read,
    })
}

/// A path setting, which must be absolute when set.
fn absolute(var: &'static str, flag: &'static str, v: &Option<String>) -> Result<Option<PathBuf>, ConfigError> {
    match nonempty(v) {
        None => Ok(None),
        Some(p) => {
            let pb = PathBuf::from(&p);
            if pb.is_absolute() {
                Ok(Some(pb))
            } else {
                Err(bad(var, flag, format!("must be an absolute path; got {p:?}")))
            }
        }
    }
}

/// SNOWLUMA_MCP_LOG_PAYLOADS (no flag): 1, or 0 / unset.
fn log_payloads() -> Result<bool, ConfigError> {
    match std::env::var("SNOWLUMA_MCP_LOG_PAYLOADS").ok().as_deref() {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(bad(
            "SNOWLUMA_MCP_LOG_PAYLOADS",
            "(no flag)",
            format!("must be 1 (or 0, or unset); got {:?}", crate::endpoint::shown_raw(other)),
        )),
    }
}

pub use snowluma_logsink::LOG_PAYLOADS_PREFIX;

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut v = vec!["snowluma-mcp"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap()
    }

    #[test]
    fn mode_resolution() {
        let c = Config::resolve(&cli(&[])).unwrap();
        assert_eq!(c.mode, Mode::Docs);
        let c = Config::resolve(&cli(&["--mode", "WRITE"])).unwrap();
        assert_eq!(c.mode, Mode::Docs);
        assert_eq!(c.warnings.len(), 1);
        let c = Config::resolve(&cli(&["--endpoint", "http://127.0.0.1:3000/"])).unwrap();
        assert_eq!(c.mode, Mode::Read);
        let c = Config::resolve(&cli(&["--endpoint", "http://h/", "--mode", "docs"])).unwrap();
        assert_eq!(c.mode, Mode::Docs);
    }

    #[test]
    fn the_audit_key_is_an_absolute_path_and_needs_a_log() {
        let e = Config::resolve(&cli(&["--audit-key", "audit.key"])).unwrap_err().to_string();
        assert!(e.starts_with("SNOWLUMA_MCP_AUDIT_KEY (--audit-key) must be an absolute path"), "{e}");
        let c = Config::resolve(&cli(&["--audit-key", "/k"])).unwrap();
        assert!(c.warnings.iter().any(|w| w.contains("SNOWLUMA_MCP_AUDIT_KEY")), "{:?}", c.warnings);
        let c = Config::resolve(&cli(&["--audit-key", "/k", "--audit-log", "/l"])).unwrap();
        assert_eq!(c.audit_key, Some(PathBuf::from("/k")));
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = Config::resolve(&cli(&["--timeout-ms", "0"])).unwrap_err().to_string();
        assert!(e.starts_with("SNOWLUMA_MCP_TIMEOUT_MS"), "{e}");
        let e = Config::resolve(&cli(&["--mode", "banana"])).unwrap_err().to_string();
        assert!(e.contains("SNOWLUMA_MCP_MODE") && e.contains("banana"), "{e}");
        let e = Config::resolve(&cli(&["--endpoint", "http://u:secret@h/"])).unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        let e = Config::resolve(&cli(&["--events-url", "ws://h/e?x=1"])).unwrap_err().to_string();
        assert!(e.contains("SNOWLUMA_MCP_EVENTS_URL"), "{e}");
        let e = Config::resolve(&cli(&["--max-stream-bytes", "4294967297"])).unwrap_err().to_string();
        assert!(e.contains("SNOWLUMA_MCP_MAX_STREAM_BYTES"), "{e}");
    }
}
