//! `snowluma-mcp`: the supervisor (MCP on stdio) or, with the hidden worker
//! argument, one of its confined worker processes.

mod audit;
mod background;
mod completion;
mod completion_flow;
mod config;
mod doctor;
mod endpoint;
mod events;
mod execution;
mod gates;
mod http;
mod logsink;
mod policy;
mod preview;
mod progress;
mod replies;
mod resources;
mod runtime;
mod secret;
mod server;
mod spawner;
mod state;
mod stdio;
mod tasks;
mod tools;
mod trace;
mod transfers;
mod transport;
mod workers;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rmcp::ServiceExt;
use snowluma_proto::{NetworkConfig, Role, WORKER_ARG, WorkerConfig};
use snowluma_sandbox::probe::PROBE_ARG;
use snowluma_sandbox::{ALLOW_UNCONFINED_VAR, ConfineError, SpawnerGrants, Support, WorkerGrants};

use crate::config::{Cli, Config};
use crate::server::{SnowlumaServer, Workers};
use crate::workers::{Attach, ChannelDir, SpawnSpec, WorkerSlot};

/// Diagnostics on stderr. `filter` is SNOWLUMA_MCP_LOG (validated at
/// startup), optionally prefixed with [`config::LOG_PAYLOADS_PREFIX`] on a
/// worker's command line. Without payload logging, every target but our own
/// is capped at INFO whatever the filter says: rmcp's and the HTTP stack's
/// debug and trace lines carry message texts, file paths and whatever
/// SnowLuma answered (a reflected token included).
///
/// Lines go through [`logsink`], which never waits for a reader (an
/// unread stderr pipe once stopped the server). Call it while the process
/// is single-threaded and unconfined; `may_poll`: the process's seccomp
/// filter allows `poll` (see [`logsink::prepare`]).
pub(crate) fn init_tracing(filter: &str, may_poll: bool) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (payloads, filter) = match filter.strip_prefix(config::LOG_PAYLOADS_PREFIX) {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let cap = tracing_subscriber::filter::filter_fn(move |m| {
        payloads || m.target().starts_with("snowluma") || *m.level() <= tracing::Level::INFO
    });
    logsink::prepare(may_poll);
    let fmt = tracing_subscriber::fmt::layer().with_writer(logsink::Stderr).with_ansi(false).with_target(false);
    let _ = tracing_subscriber::registry().with(filter).with(fmt.with_filter(cap)).try_init();
}

/// Shown on stderr when a person starts the server in a terminal, where it
/// would otherwise wait silently for MCP messages.
const TERMINAL_HINT: &str = "\
snowluma-mcp is an MCP server for stdio: an MCP client (Claude Code, Claude Desktop, Cursor,
VS Code, Cline, ...) starts it and speaks MCP on its stdin and stdout. It is now waiting for
MCP messages from this terminal; press Ctrl-D to end.
  Add it to a client, e.g.: claude mcp add snowluma -- /usr/local/bin/snowluma-mcp
  (configurations for each client are in the README; `snowluma-mcp --help` lists the settings)
  Check this host's sandbox: snowluma-mcp doctor
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(WORKER_ARG) {
        // Worker mode: still single-threaded here, as confinement requires.
        let Some(role) = args.get(2).and_then(|r| Role::parse(r)) else {
            eprintln_nb!("snowluma-mcp: unknown worker role");
            return ExitCode::from(2);
        };
        // The workers' seccomp filters allow no poll.
        init_tracing(args.get(3).map(String::as_str).unwrap_or("info"), false);
        return snowluma_workers::worker_main(role, args.get(4..).unwrap_or_default());
    }
    if args.get(1).map(String::as_str) == Some(http::FRONT_ARG) {
        // The HTTP front of `serve-http` (started by its launcher only).
        // The front's seccomp filter allows no poll.
        init_tracing(args.get(2).map(String::as_str).unwrap_or("info"), false);
        let unconfined_ok = args.get(3).map(String::as_str) == Some(snowluma_sandbox::UNCONFINED_OK_ARG);
        return http::front::main(unconfined_ok);
    }
    if args.get(1).map(String::as_str) == Some(PROBE_ARG) {
        // Escape probe (doctor and tests only): confine as a role, try one
        // forbidden operation, report.
        return snowluma_sandbox::probe::probe_main(args.get(2..).unwrap_or_default());
    }
    let cli = Cli::parse();
    if let Some(config::Command::Doctor { json }) = &cli.command {
        return doctor::run(*json);
    }
    if let Some(config::Command::Audit { action }) = &cli.command {
        return audit_command(action, cli.audit_key.as_deref());
    }
    if let Some(config::Command::ServeHttp(opts)) = &cli.command {
        return http::launcher::run(&cli, opts);
    }
    let config = match Config::resolve(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln_nb!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config.worker_log_filter(), true);
    if config.log_payloads {
        tracing::warn!(
            "SNOWLUMA_MCP_LOG_PAYLOADS=1: diagnostics at debug and trace may contain message texts, file paths and tokens"
        );
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        logsink::write_line(TERMINAL_HINT.as_bytes());
    }
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    let policy = match policy::Policy::from_config(
        snowluma_catalog::Catalog::bundled(),
        config.allow_actions.as_deref(),
        config.deny_actions.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln_nb!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    // Who this session serves: the serve-http launcher names the HTTP
    // principal (read once, then scrubbed); otherwise the socket's peer.
    let principal = http::take_session_principal().or_else(|| stdin_peer().map(audit::Principal::Local));
    // Whose tasks this session's are: a serve-http session's access token
    // (its id); a stdio session's are no one's in particular, so that its
    // results survive a restart of the same configuration.
    let task_owner = match &principal {
        Some(audit::Principal::Http { token_id, .. }) => Some(snowluma_proto::task::owner_of_http_token(token_id)),
        _ => None,
    };
    // The audit log is opened before anything can execute; a log that
    // cannot be written stops startup (fail closed).
    let audit = match &config.audit_log {
        None => None,
        Some(path) => {
            let key = match &config.audit_key {
                Some(k) => audit::KeySource::File(k.clone()),
                None => audit::KeySource::BesideLog,
            };
            match audit::AuditLog::open(path, &key, principal.clone(), config.mode.as_str()) {
                Ok(log) => Some(log),
                Err(e) if e.is_integrity() => {
                    eprintln_nb!("snowluma-mcp: refusing to start: audit log {}: {e}", path.display());
                    return ExitCode::from(2);
                }
                Err(e) if e.is_key() && config.audit_key.is_some() => {
                    eprintln_nb!("snowluma-mcp: configuration error: SNOWLUMA_MCP_AUDIT_KEY (--audit-key): {e}");
                    return ExitCode::from(2);
                }
                Err(e) => {
                    eprintln_nb!(
                        "snowluma-mcp: configuration error: SNOWLUMA_MCP_AUDIT_LOG (--audit-log) cannot be used: {e}"
                    );
                    return ExitCode::from(2);
                }
            }
        }
    };
    // Confinement, before the runtime exists (Landlock restricts the calling
    // thread and its future children only).
    let support = Support::detect();
    let degraded_ok = match snowluma_sandbox::gate(
        config.mode.as_str(),
        config.mode.executes(),
        support,
        snowluma_sandbox::opt_out_from_env(),
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln_nb!("snowluma-mcp: {e}");
            return ExitCode::from(2);
        }
    };
    let grants = WorkerGrants { network_ports: config.network_ports(), allow_unconfined: degraded_ok };
    // File transfers (write mode): the directories are opened here, before
    // confinement, and handed to the file-transfer worker as descriptors.
    let transfer_dirs = if config.mode == config::Mode::Write && config.endpoint.is_some() {
        match open_transfer_dirs(&config) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln_nb!("snowluma-mcp: configuration error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    // The task directory (write mode with transfers only): created 0700 and
    // opened here; only the task-store worker works in it, through the
    // descriptor.
    let task_dir = match (&config.task_dir, &transfer_dirs) {
        (None, _) => None,
        (Some(_), None) => {
            tracing::warn!(
                "SNOWLUMA_MCP_TASK_DIR is set, but persistent tasks need write mode; the directory is not used"
            );
            None
        }
        (Some(dir), Some(_)) => match open_task_dir(dir) {
            Ok(fd) => Some(Arc::new(fd)),
            Err(e) => {
                eprintln_nb!("snowluma-mcp: configuration error: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let write_dirs: Vec<std::os::fd::BorrowedFd<'_>> = transfer_dirs
        .iter()
        .map(|d| std::os::fd::AsFd::as_fd(&*d.download_fd))
        .chain(task_dir.iter().map(|fd| std::os::fd::AsFd::as_fd(&**fd)))
        .collect();
    // Name resolution needs /etc and sockets, which the confined supervisor
    // and executor lack: resolve the endpoint's host now.
    let resolved = resolve_endpoint(config.endpoint.as_deref().and_then(|e| config::http_endpoint(e).ok()));
    let events_resolved = resolve_endpoint(config.events_url.as_deref().and_then(|e| config::events_endpoint(e).ok()));
    let read_dirs: Vec<std::os::fd::BorrowedFd<'_>> = transfer_dirs
        .iter()
        .filter_map(|d| d.upload_root.as_ref().map(|(_, _, fd)| std::os::fd::AsFd::as_fd(&**fd)))
        .collect();
    // The spawner: forked now, while single-threaded and unconfined, it
    // takes the workers' union domain (exec of this binary only, TCP to the
    // endpoint's ports, reads beneath the upload root, writes beneath the
    // download directory, no capability), so that the supervisor below can
    // give up all of it.
    let spawner_grants =
        SpawnerGrants { tcp_ports: grants.network_ports.clone(), read_dirs, write_dirs, allow_unconfined: degraded_ok };
    let (spawner_sock, spawner_pid) = match spawner::fork(&spawner_grants) {
        Ok(s) => s,
        Err(e) => {
            eprintln_nb!("snowluma-mcp: cannot start the spawner: {e}");
            return ExitCode::FAILURE;
        }
    };
    drop(spawner_grants);
    // The access token, read only now that the spawner exists (it never
    // holds it), then scrubbed from this process's environment block.
    let token = match secret::read_token(cli.token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln_nb!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    secret::scrub_env(secret::TOKEN_VAR);
    // The event WebSocket's own token, when SnowLuma's WebSocket server has
    // one of its own: read, checked and handed over the same way.
    let events_token = match secret::read_token_from(secret::EVENTS_TOKEN, cli.events_token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    secret::scrub_env(secret::EVENTS_TOKEN_VAR);
    let events_token = match events_token {
        Some(_) if config.events_url.is_none() => {
            tracing::warn!(
                "SNOWLUMA_MCP_EVENTS_TOKEN (--events-token-file) is set but SNOWLUMA_MCP_EVENTS_URL is not: it is not used"
            );
            None
        }
        t => t,
    };
    // The task directory's scope: a digest of the effective mode, endpoint
    // and token, computed now, before the token is handed over and wiped.
    // The task-store worker salts it again and stores only that.
    let task_scope = task_dir.as_ref().map(|_| task_scope_digest(&config, token.as_deref().map(String::as_str)));
    // The supervisor's own confinement, its seccomp allow-list last: its
    // runtime and everything after run under it (the spawner, forked
    // earlier, is not bound by it).
    let supervisor_report = match snowluma_sandbox::confine_supervisor(degraded_ok) {
        Ok(r) => Some(r),
        Err(ConfineError::LandlockWeak(status, _)) => {
            eprintln_nb!(
                "snowluma-mcp: the supervisor's Landlock domain is {status}; set {ALLOW_UNCONFINED_VAR}=1 to run anyway"
            );
            return ExitCode::from(2);
        }
        Err(ConfineError::SeccompNotInstalled(e)) if !degraded_ok => {
            eprintln_nb!("snowluma-mcp: the supervisor cannot install its seccomp filter: {e}");
            return ExitCode::from(2);
        }
        Err(e) if degraded_ok => {
            tracing::warn!(error = %e, "the supervisor could not confine itself; continuing ({ALLOW_UNCONFINED_VAR})");
            None
        }
        Err(e) => {
            eprintln_nb!("snowluma-mcp: the supervisor cannot confine itself: {e}");
            return ExitCode::from(2);
        }
    };
    let roles: Vec<Role> = match (config.endpoint.is_some() && config.mode.executes(), &transfer_dirs) {
        (true, Some(_)) if task_dir.is_some() => vec![Role::Catalog, Role::Network, Role::Files, Role::Tasks],
        (true, Some(_)) => vec![Role::Catalog, Role::Network, Role::Files],
        (true, None) => vec![Role::Catalog, Role::Network],
        _ => vec![Role::Catalog],
    };
    runtime::record_confinement(snowluma_sandbox::runtime_summary(
        support,
        supervisor_report.as_ref(),
        degraded_ok,
        &roles,
    ));
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    let tasks = task_dir.zip(task_scope).map(|(fd, digest)| (fd, digest, task_owner));
    let relayed = matches!(principal, Some(audit::Principal::Http { .. }));
    let started = Started {
        config,
        policy,
        audit,
        grants,
        transfer_dirs,
        tasks,
        token,
        events_token,
        resolved,
        events_resolved,
        relayed,
    };
    match rt.block_on(run(started, (spawner_sock, spawner_pid))) {
        Ok(Ended::Finished) => ExitCode::SUCCESS,
        Ok(Ended::StdoutGone) | Ok(Ended::Broken) => ExitCode::FAILURE,
        Err(e) => {
            tracing::error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// `snowluma-mcp audit ...`: reports on stderr, nothing on stdout.
/// `configured_key` is --audit-key / SNOWLUMA_MCP_AUDIT_KEY.
fn audit_command(action: &config::AuditCommand, configured_key: Option<&str>) -> ExitCode {
    use config::AuditCommand;
    let key_file = |log: &std::path::Path, key: &Option<std::path::PathBuf>| {
        key.clone()
            .or_else(|| configured_key.filter(|k| !k.trim().is_empty()).map(std::path::PathBuf::from))
            .unwrap_or_else(|| audit::key_path(log))
    };
    match action {
        AuditCommand::Verify { path, key } => {
            let key = audit::read_key(&key_file(path, key)).map_err(|e| match e {
                audit::AuditError::KeyUnreadable { path, source } => {
                    format!("no readable key at {}: {source}", path.display())
                }
                other => other.to_string(),
            });
            match audit::verify(path, key) {
                Ok(report) => {
                    eprintln_nb!("audit log OK: {report}");
                    ExitCode::SUCCESS
                }
                Err(e @ audit::VerifyError::Line { .. }) => {
                    eprintln_nb!("audit log BROKEN at {e}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln_nb!("audit log BROKEN: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        AuditCommand::Reanchor { path, key } => {
            let key = match audit::read_key(&key_file(path, key)) {
                Ok(k) => k,
                Err(e) => {
                    eprintln_nb!("audit log not re-anchored: the key is needed to check the records' MACs: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match audit::reanchor(path, &key) {
                Ok(r) => {
                    match &r.anchor {
                        Some(a) => eprintln_nb!(
                            "audit log re-anchored: {} records, chain intact, MACs valid; {} now anchors record {} ({})",
                            r.records,
                            r.head.display(),
                            a.seq,
                            a.hash
                        ),
                        None => {
                            eprintln_nb!(
                                "audit log re-anchored: the log is empty; {} holds no anchor",
                                r.head.display()
                            )
                        }
                    }
                    if r.torn > 0 {
                        eprintln_nb!(
                            "note: the log ends with an incomplete line ({} bytes); the server drops it at its next start and records that",
                            r.torn
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln_nb!("audit log not re-anchored: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        AuditCommand::Keygen { path } => match audit::keygen(path) {
            Ok(()) => {
                eprintln_nb!("audit key written to {} (mode 0600)", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln_nb!("audit key not written: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{var} ({flag}) {problem}")]
struct DirError {
    var: &'static str,
    flag: &'static str,
    problem: String,
}

fn open_dir(path: &std::path::Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)?;
    Ok(f.into())
}

/// The endpoint host's addresses, resolved here once: the confined network
/// executor can neither read `/etc` nor send DNS queries. An IP literal (or
/// a failure, reported by the executor on first use) gives an empty list.
/// The endpoint's addresses when its host is a name (an IP literal needs
/// none). Resolved once, here, before confinement: the confined executor
/// can read no `/etc` and send no UDP. A later change of the name's address
/// is not seen until the server restarts.
fn resolve_endpoint(endpoint: Option<endpoint::Endpoint>) -> Vec<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let Some(e) = endpoint else {
        return Vec::new();
    };
    if e.is_ip_literal() {
        return Vec::new();
    }
    match (e.host.as_str(), e.port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(err) => {
            tracing::warn!(error = %err, "the endpoint's host name cannot be resolved now; calls will fail until restart");
            Vec::new()
        }
    }
}

/// The transfer directories, opened before confinement.
struct TransferDirs {
    download_dir: std::path::PathBuf,
    download_fd: Arc<std::os::fd::OwnedFd>,
    upload_root: Option<(std::path::PathBuf, std::path::PathBuf, Arc<std::os::fd::OwnedFd>)>,
}

fn open_transfer_dirs(config: &Config) -> Result<TransferDirs, DirError> {
    let (download_dir, fd) = open_download_dir(config)?;
    let upload_root = match &config.upload_root {
        Some(root) => {
            let (canonical, ufd) = open_upload_root(root)?;
            Some((root.clone(), canonical, Arc::new(ufd)))
        }
        None => None,
    };
    Ok(TransferDirs { download_dir, download_fd: Arc::new(fd), upload_root })
}

/// Create (0700) and open the download directory.
/// The download directory, opened once; the file-transfer worker then works
/// only through the descriptor.
///
/// * Configured (`SNOWLUMA_MCP_STREAM_DIR`): created with its missing
///   parents, each 0700, as the Node server's `mkdir -p` does.
/// * Default ([`config::default_stream_dir`]): `$XDG_RUNTIME_DIR/snowluma-mcp`
///   or `$TMPDIR/snowluma-mcp-<uid>`, then `downloads`, each created 0700 and
///   opened without following a symlink, beneath a base opened first.
///
/// Either way the directory must be owned by this user and writable by
/// nobody else: in a shared `$TMPDIR` another user could otherwise create it
/// first (and fill the quota, or point it elsewhere).
fn open_download_dir(config: &Config) -> Result<(std::path::PathBuf, std::os::fd::OwnedFd), DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_STREAM_DIR", flag: "--stream-dir", problem };
    let (path, fd) = match &config.stream_dir {
        Some(dir) => {
            // `mkdir -p`: what exists is kept (and checked below), what is
            // missing is created 0700, by us.
            match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
                Ok(()) => {}
                Err(e) => return Err(bad(format!("cannot be created: {e}"))),
            }
            let canonical = std::fs::canonicalize(dir).map_err(|e| bad(format!("cannot be resolved: {e}")))?;
            let fd = open_dir(&canonical).map_err(|e| bad(format!("cannot be opened as a directory: {e}")))?;
            (canonical, fd)
        }
        None => {
            let (base, top) = config::default_stream_base();
            let base = std::fs::canonicalize(&base)
                .map_err(|e| bad(format!("(default) cannot use {}: {e}", base.display())))?;
            let base_fd = open_dir(&base).map_err(|e| bad(format!("(default) cannot open {}: {e}", base.display())))?;
            let top_fd = private_subdir(&base_fd, &top, true)
                .map_err(|p| bad(format!("(default) {}: {p}", base.join(&top).display())))?;
            let dir = base.join(&top).join(config::DOWNLOADS_SUBDIR);
            let fd = private_subdir(&top_fd, config::DOWNLOADS_SUBDIR, false)
                .map_err(|p| bad(format!("(default) {}: {p}", dir.display())))?;
            (dir, fd)
        }
    };
    check_owned(&fd, false).map_err(|p| bad(format!("{}: {p}", path.display())))?;
    Ok((path, fd))
}

/// Create (0700) or open `name` beneath `parent` without following a
/// symlink, and check it is ours ([`check_owned`]; `private`: nobody else
/// may even enter it).
fn private_subdir(parent: &std::os::fd::OwnedFd, name: &str, private: bool) -> Result<std::os::fd::OwnedFd, String> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, mkdirat};
    match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(format!("cannot be created: {e}")),
    }
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => {
            "is not a directory (a symbolic link or a file is in its place): remove it, or set SNOWLUMA_MCP_STREAM_DIR"
                .to_owned()
        }
        e => format!("cannot be opened: {e}"),
    })?;
    check_owned(&fd, private)?;
    Ok(fd)
}

/// The directory must belong to this process's user and be writable by
/// nobody else (with `private`, not even readable or searchable).
fn check_owned(fd: &std::os::fd::OwnedFd, private: bool) -> Result<(), String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("cannot be examined: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me {
        return Err(format!(
            "belongs to uid {}, not to this server's user (uid {me}); another user may have created it: remove it, or set SNOWLUMA_MCP_STREAM_DIR",
            st.st_uid
        ));
    }
    let forbidden = if private { 0o077 } else { 0o022 };
    if st.st_mode & forbidden != 0 {
        return Err(format!(
            "has mode {:o}, which lets other users {}; chmod it to 700",
            st.st_mode & 0o777,
            if private { "in" } else { "write into it" }
        ));
    }
    Ok(())
}

/// Create (0700, the last component only) and open the task directory; it
/// must be ours and private.
fn open_task_dir(dir: &std::path::Path) -> Result<std::os::fd::OwnedFd, DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_TASK_DIR", flag: "--task-dir", problem };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(bad(format!("cannot be created: {e}"))),
    }
    let fd = open_dir(dir).map_err(|e| bad(format!("cannot be opened as a directory: {e}")))?;
    check_owned(&fd, true).map_err(|p| bad(p.replace("SNOWLUMA_MCP_STREAM_DIR", "SNOWLUMA_MCP_TASK_DIR")))?;
    Ok(fd)
}

/// The digest binding a task directory to this configuration: the effective
/// mode, endpoint and token (never stored; the worker salts it again).
fn task_scope_digest(config: &Config, token: Option<&str>) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"snowluma-mcp task directory scope\0");
    for part in [config.mode.as_str(), config.endpoint.as_deref().unwrap_or(""), token.unwrap_or("")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// Resolve and open the upload root, which must be an existing directory.
fn open_upload_root(root: &std::path::Path) -> Result<(std::path::PathBuf, std::os::fd::OwnedFd), DirError> {
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_UPLOAD_ROOT", flag: "--upload-root", problem };
    let canonical = std::fs::canonicalize(root).map_err(|e| bad(format!("cannot be resolved: {e}")))?;
    let fd = open_dir(&canonical).map_err(|e| bad(format!("must be an existing directory: {e}")))?;
    Ok((canonical, fd))
}

/// The connecting peer when stdin is a unix socket (systemd `Accept=yes`).
fn stdin_peer() -> Option<audit::Peer> {
    use std::os::fd::BorrowedFd;
    // SAFETY: descriptor 0 is open for the life of the process; the borrow
    // is used only for this getsockopt call.
    let fd = unsafe { BorrowedFd::borrow_raw(0) };
    let cred = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    Some(audit::Peer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
}

/// Everything startup prepared for the session.
struct Started {
    config: Config,
    policy: policy::Policy,
    audit: Option<audit::AuditLog>,
    grants: WorkerGrants,
    transfer_dirs: Option<TransferDirs>,
    /// The task directory's descriptor, the configuration's scope digest
    /// and the principal this session's tasks belong to.
    tasks: Option<(Arc<std::os::fd::OwnedFd>, [u8; 32], Option<String>)>,
    /// Moved into the network executor's configuration, then wiped.
    token: Option<zeroize::Zeroizing<String>>,
    /// The event WebSocket's own token: likewise.
    events_token: Option<zeroize::Zeroizing<String>>,
    resolved: Vec<std::net::SocketAddr>,
    /// The events host's addresses (empty without events or for an IP literal).
    events_resolved: Vec<std::net::SocketAddr>,
    /// A session the serve-http launcher started (behind its front).
    relayed: bool,
}

async fn run(
    started: Started,
    (spawner_sock, spawner_pid): (std::os::fd::OwnedFd, nix::unistd::Pid),
) -> Result<Ended, Box<dyn std::error::Error>> {
    let Started {
        config,
        policy,
        audit,
        grants,
        transfer_dirs,
        tasks,
        mut token,
        mut events_token,
        resolved,
        events_resolved,
        relayed,
    } = started;
    let spawner = spawner::SpawnerClient::start(spawner_sock, spawner_pid)?;
    let spawner_gone = spawner.gone();
    let fatal = tokio_util::sync::CancellationToken::new();
    let spec = Arc::new(SpawnSpec { spawner, log_filter: config.worker_log_filter(), grants, fatal: fatal.clone() });
    let catalog = WorkerSlot::start(
        Role::Catalog,
        WorkerConfig::Catalog { denied: policy.denied() },
        spec.clone(),
        Attach::default(),
    );
    let network = match (&config.endpoint, config.mode.executes()) {
        (Some(endpoint), true) => Some(WorkerSlot::start(
            Role::Network,
            WorkerConfig::Network(NetworkConfig {
                endpoint: endpoint.clone(),
                resolved: resolved.clone(),
                // Moved, not copied: the buffer is wiped once handed over.
                token: token.as_mut().map(|t| std::mem::take(&mut **t)),
                timeout_ms: config.timeout_ms,
                max_stream_bytes: config.max_stream_bytes,
                events: config.events_url.clone().map(|url| snowluma_proto::EventsTarget {
                    url,
                    resolved: events_resolved.clone(),
                    // Moved, not copied, as the token above.
                    token: events_token.as_mut().map(|t| std::mem::take(&mut **t)),
                }),
            }),
            spec.clone(),
            Attach { fds: Vec::new(), channel: Some((snowluma_proto::NETWORK_FD_CHANNEL, ChannelDir::ToWorker)) },
        )),
        _ => None,
    };
    // File transfers (write mode): the directories are opened here and handed
    // to the file-transfer worker as descriptors; it never sees a path.
    let mut paths = transfers::TransferPaths::default();
    let files = if let (Some(dirs), Some(_)) = (transfer_dirs, &network) {
        paths.download_dir = Some(dirs.download_dir);
        let mut fds = vec![(snowluma_proto::FILES_DOWNLOAD_DIR_FD, dirs.download_fd)];
        // Compared with absolute symlink targets only; never opened.
        let mut upload_root_paths = Vec::new();
        if let Some((configured, canonical, fd)) = dirs.upload_root {
            upload_root_paths =
                [&canonical, &configured].iter().filter_map(|p| p.to_str()).map(str::to_owned).collect();
            paths.upload_root = Some((configured, canonical));
            fds.push((snowluma_proto::FILES_UPLOAD_ROOT_FD, fd));
        }
        Some(WorkerSlot::start(
            Role::Files,
            WorkerConfig::Files(snowluma_proto::FilesConfig {
                upload_enabled: config.upload_root.is_some(),
                max_file_bytes: config.max_stream_bytes,
                upload_root_paths,
            }),
            spec.clone(),
            Attach { fds, channel: Some((snowluma_proto::FILES_FD_CHANNEL, ChannelDir::FromWorker)) },
        ))
    } else {
        None
    };
    let task_owner = tasks.as_ref().and_then(|(_, _, owner)| owner.clone());
    let task_slot = match (tasks, &files) {
        (Some((fd, config_digest, owner)), Some(_)) => Some(WorkerSlot::start(
            Role::Tasks,
            WorkerConfig::Tasks { config_digest, owner },
            spec.clone(),
            Attach { fds: vec![(snowluma_proto::TASKS_DIR_FD, fd)], channel: None },
        )),
        _ => None,
    };
    let transfer_service = match (&files, &network) {
        (Some(f), Some(n)) => Some(transfers::TransferService::new(
            f.clone(),
            n.clone(),
            paths,
            config.max_stream_bytes,
            std::time::Duration::from_millis(config.timeout_ms),
        )),
        _ => None,
    };
    let config = Arc::new(config);
    let cat = snowluma_catalog::Catalog::bundled();
    tracing::info!(
        version = server::SERVER_VERSION,
        actions = cat.actions.len(),
        categories = cat.categories.len(),
        mode = config.mode.as_str(),
        "snowluma-mcp ready"
    );
    let slots: Vec<Arc<WorkerSlot>> =
        std::iter::once(catalog.clone()).chain(network.clone()).chain(files.clone()).chain(task_slot.clone()).collect();
    let continuations = completion::Continuations::new(completion::Continuations::clock_offset_from_env())?;
    // Live event resources: only with an events URL and a network executor.
    let hub = match (&network, &config.events_url) {
        (Some(n), Some(_)) => {
            Some(events::EventHub::new(n.clone(), std::time::Duration::from_millis(config.timeout_ms)))
        }
        _ => None,
    };
    let task_service = task_slot.clone().map(|slot| tasks::TaskService::new(slot, task_owner));
    if let Some(t) = task_service.clone() {
        // The restart pass, at once: unfinished records of an earlier run
        // become failed (unknown remote outcome). Errors are reported to
        // every task call.
        tokio::spawn(async move {
            if let Err(e) = t.recover().await {
                tracing::warn!(error = %e, "the task store cannot be used");
            }
        });
    }
    // A damaged panel is a packaging error, said at startup; its resource
    // read fails with the same message (nothing serves an empty panel).
    if let Err(e) = preview::panel() {
        tracing::error!(error = %e, "the message preview panel cannot be served");
    }
    let server = SnowlumaServer::new(
        config,
        Workers { catalog, network },
        policy,
        audit,
        server::Services {
            transfers: transfer_service,
            continuations,
            tasks: task_service.clone(),
            events: hub.clone(),
        },
    );
    let info = serde_json::to_value(server::implementation())?;
    let transport = transport::LineTransport::stdio(info, server.audit_enabled()).relayed(relayed);
    let stdout = transport.stdout_state();
    let result = match server.serve(transport).await {
        Ok(running) => {
            // The spawner dying leaves a server that cannot start or restart
            // a worker: end the session (the calls in flight fail with an
            // error and are answered) so that the client or systemd starts a
            // whole, confined tree again.
            let session = running.cancellation_token();
            let watch_slots = slots.clone();
            let died = spawner_gone.clone();
            let lost = fatal.clone();
            let watcher = tokio::spawn(async move {
                tokio::select! {
                    _ = died.cancelled() => tracing::error!(
                        "the spawner process died; ending the session so that a whole server is started again"
                    ),
                    // Already logged by the worker's slot.
                    _ = lost.cancelled() => {}
                }
                for s in &watch_slots {
                    s.shutdown();
                }
                session.cancel();
            });
            let r = running.waiting().await;
            // Background transfers outlive the session that started them:
            // their results go to the task store, read in a later session.
            if let Some(t) = &task_service
                && !spawner_gone.is_cancelled()
                && !fatal.is_cancelled()
            {
                t.wait_idle().await;
            }
            watcher.abort();
            match r {
                Ok(_) if spawner_gone.is_cancelled() || fatal.is_cancelled() => Ok(Ended::Broken),
                Ok(_) => Ok(Ended::Finished),
                Err(e) => Err(e.into()),
            }
        }
        // stdin ended before the session started (a client that only probed
        // the command, or went away): an ordinary end, not a failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("stdin ended before the session started");
            Ok(Ended::Finished)
        }
        Err(e) => Err(e.into()),
    };
    // The MCP connection is over: its event resources go with it (the
    // WebSocket is closed before the executor is stopped).
    if let Some(hub) = &hub {
        hub.release_all();
        tokio::task::yield_now().await;
    }
    for s in &slots {
        s.shutdown();
    }
    // The transport logged the failure when it happened.
    if stdout.gone() { Ok(Ended::StdoutGone) } else { result }
}

/// How a session ended without an error of its own.
enum Ended {
    /// stdin reached its end (the client finished).
    Finished,
    /// stdout failed: the client is gone; already logged.
    StdoutGone,
    /// The spawner died, or a worker that cannot be replaced stopped;
    /// already logged.
    Broken,
}
