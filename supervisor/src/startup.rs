//! The supervisor's start-up, in the order confinement requires: the
//! configuration and the audit log first; then, while the process is still
//! single-threaded and unconfined, the directories, the endpoint's
//! addresses and the spawner; then the tokens (read only once the spawner
//! exists, so that it never holds them); then the supervisor's own
//! confinement; and only then the runtime, the workers and the MCP session.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;

use snowluma_config::{Cli, Config, Mode, secret};
use snowluma_logsink::{eprintln_nb, init_tracing};
use snowluma_proto::Role;
use snowluma_sandbox::{ALLOW_UNCONFINED_VAR, ConfineError, SpawnerGrants, Support, WorkerGrants};

use crate::audit;
use crate::dirs::{TransferDirs, open_task_dir, open_transfer_dirs};
use crate::policy::Policy;
use crate::session::{Ended, Spawner, Started, Token};

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

/// Start-up stopped; the reason is on stderr already.
struct Stop(ExitCode);

fn config_error(e: impl std::fmt::Display) -> Stop {
    eprintln_nb!("snowluma-mcp: configuration error: {e}");
    Stop(ExitCode::from(2))
}

fn refuse(e: impl std::fmt::Display) -> Stop {
    eprintln_nb!("snowluma-mcp: {e}");
    Stop(ExitCode::from(2))
}

/// The stdio server: the process an MCP client (or systemd, or a
/// `serve-http` launcher) starts.
pub fn serve_stdio(cli: &Cli) -> ExitCode {
    let (started, spawner) = match start(cli) {
        Ok(s) => s,
        Err(Stop(code)) => return code,
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(crate::session::run(started, spawner)) {
        Ok(Ended::Finished) => ExitCode::SUCCESS,
        Ok(Ended::StdoutGone) | Ok(Ended::Broken) => ExitCode::FAILURE,
        Err(e) => {
            tracing::error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// Everything before the runtime: configuration, audit log, directories,
/// spawner, tokens, confinement.
fn start(cli: &Cli) -> Result<(Started, Spawner), Stop> {
    let config = Config::resolve(cli).map_err(config_error)?;
    init_tracing(&config.worker_log_filter(), true);
    announce(&config);
    let policy = Policy::from_config(
        snowluma_catalog::Catalog::bundled(),
        config.allow_actions.as_deref(),
        config.deny_actions.as_deref(),
    )
    .map_err(config_error)?
    .with_confirm(
        crate::confirm::ConfirmList::from_config(
            snowluma_catalog::Catalog::bundled(),
            config.confirm_actions.as_deref(),
        )
        .map_err(config_error)?,
    );
    // Who this session serves: the serve-http launcher names the HTTP
    // principal (read once, then scrubbed); otherwise the socket's peer.
    let principal = take_session_principal().or_else(|| stdin_peer().map(audit::Principal::Local));
    // Whose tasks this session's are: a serve-http session's access token
    // (its id); a stdio session's are no one's in particular, so that its
    // results survive a restart of the same configuration.
    let task_owner = match &principal {
        Some(audit::Principal::Http { token_id, .. }) => Some(snowluma_proto::task::owner_of_http_token(token_id)),
        _ => None,
    };
    let relayed = matches!(principal, Some(audit::Principal::Http { .. }));
    // The principal's shared pacing state: its number now (scrubbed), the
    // descriptor itself once the spawner is forked.
    let pacing_fd = take_pacing_var(relayed);
    let audit = open_audit(&config, principal)?;
    // Confinement, before the runtime exists (Landlock restricts the calling
    // thread and its future children only).
    let support = Support::detect();
    let degraded_ok = snowluma_sandbox::gate(
        config.mode.as_str(),
        config.mode.executes(),
        support,
        snowluma_sandbox::opt_out_from_env(),
    )
    .map_err(refuse)?;
    let grants = WorkerGrants { network_ports: config.network_ports(), allow_unconfined: degraded_ok };
    let (transfer_dirs, task_dir) = open_dirs(&config)?;
    // Name resolution needs /etc and sockets, which the confined supervisor
    // and executor lack: resolve the endpoint's host now.
    let resolved = resolve_endpoint(config.endpoint.as_ref());
    let events_resolved = resolve_endpoint(config.events_url.as_ref());
    let spawner = fork_spawner(&grants, transfer_dirs.as_ref(), task_dir.as_deref())?;
    let pacing = pacing_fd.and_then(open_pacing_window);
    let (token, events_token) = read_tokens(cli, &config)?;
    // The task directory's scope: a digest of the effective mode, endpoint
    // and token, computed now, before the token is handed over and wiped.
    // The task-store worker salts it again and stores only that.
    let task_scope = task_dir.as_ref().map(|_| task_scope_digest(&config, token.as_deref().map(String::as_str)));
    let supervisor_report = confine_self(degraded_ok)?;
    let roles: Vec<Role> = match (config.endpoint.is_some() && config.mode.executes(), &transfer_dirs) {
        (true, Some(_)) if task_dir.is_some() => vec![Role::Catalog, Role::Network, Role::Files, Role::Tasks],
        (true, Some(_)) => vec![Role::Catalog, Role::Network, Role::Files],
        (true, None) => vec![Role::Catalog, Role::Network],
        _ => vec![Role::Catalog],
    };
    crate::runtime::record_confinement(snowluma_sandbox::runtime_summary(
        support,
        supervisor_report.as_ref(),
        degraded_ok,
        &roles,
    ));
    let tasks = task_dir.zip(task_scope).map(|(fd, digest)| (fd, digest, task_owner));
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
        pacing,
    };
    Ok((started, spawner))
}

/// The warnings and hints start-up owes the operator.
fn announce(config: &Config) {
    if config.log_payloads {
        tracing::warn!(
            "SNOWLUMA_MCP_LOG_PAYLOADS=1: diagnostics at debug and trace may contain message texts, file paths and tokens"
        );
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        snowluma_logsink::write_line(TERMINAL_HINT.as_bytes());
    }
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
}

/// The audit log is opened before anything can execute; a log that cannot
/// be written stops start-up (fail closed).
fn open_audit(config: &Config, principal: Option<audit::Principal>) -> Result<Option<audit::AuditLog>, Stop> {
    let Some(path) = &config.audit_log else {
        return Ok(None);
    };
    let key = match &config.audit_key {
        Some(k) => audit::KeySource::File(k.clone()),
        None => audit::KeySource::BesideLog,
    };
    match audit::AuditLog::open(path, &key, principal, config.mode.as_str()) {
        Ok(log) => Ok(Some(log)),
        Err(e) if e.is_integrity() => Err(refuse(format!("refusing to start: audit log {}: {e}", path.display()))),
        Err(e) if e.is_key() && config.audit_key.is_some() => {
            Err(config_error(format!("SNOWLUMA_MCP_AUDIT_KEY (--audit-key): {e}")))
        }
        Err(e) => Err(config_error(format!("SNOWLUMA_MCP_AUDIT_LOG (--audit-log) cannot be used: {e}"))),
    }
}

/// File transfers (write mode): the directories are opened here, before
/// confinement, and handed to the file-transfer worker as descriptors. The
/// task directory (write mode with transfers only): created 0700 and opened
/// here; only the task-store worker works in it, through the descriptor.
fn open_dirs(config: &Config) -> Result<(Option<TransferDirs>, Option<Arc<OwnedFd>>), Stop> {
    let transfer_dirs = if config.mode == Mode::Write && config.endpoint.is_some() {
        Some(open_transfer_dirs(config).map_err(config_error)?)
    } else {
        None
    };
    let task_dir = match (&config.task_dir, &transfer_dirs) {
        (None, _) => None,
        (Some(_), None) => {
            tracing::warn!(
                "SNOWLUMA_MCP_TASK_DIR is set, but persistent tasks need write mode; the directory is not used"
            );
            None
        }
        (Some(dir), Some(_)) => Some(Arc::new(open_task_dir(dir).map_err(config_error)?)),
    };
    Ok((transfer_dirs, task_dir))
}

/// The spawner: forked now, while single-threaded and unconfined, it takes
/// the workers' union domain (exec of this binary only, TCP to the
/// endpoint's ports, reads beneath the upload root, writes beneath the
/// download directory, no capability), so that the supervisor can give up
/// all of it.
fn fork_spawner(
    grants: &WorkerGrants,
    transfer_dirs: Option<&TransferDirs>,
    task_dir: Option<&OwnedFd>,
) -> Result<Spawner, Stop> {
    let write_dirs: Vec<BorrowedFd<'_>> =
        transfer_dirs.iter().map(|d| d.download_fd.as_fd()).chain(task_dir.map(|fd| fd.as_fd())).collect();
    let read_dirs: Vec<BorrowedFd<'_>> =
        transfer_dirs.iter().filter_map(|d| d.upload_root.as_ref().map(|(_, _, fd)| fd.as_fd())).collect();
    let spawner_grants = SpawnerGrants {
        tcp_ports: grants.network_ports.clone(),
        read_dirs,
        write_dirs,
        allow_unconfined: grants.allow_unconfined,
    };
    snowluma_spawner::fork(&spawner_grants).map_err(|e| {
        eprintln_nb!("snowluma-mcp: cannot start the spawner: {e}");
        Stop(ExitCode::FAILURE)
    })
}

/// The access token, read only now that the spawner exists (it never holds
/// it), then scrubbed from this process's environment block; and the event
/// WebSocket's own token, when SnowLuma's WebSocket server has one of its
/// own: read, checked and handed over the same way.
fn read_tokens(cli: &Cli, config: &Config) -> Result<(Token, Token), Stop> {
    let token = secret::read_token(cli.token_file.as_deref()).map_err(config_error)?;
    secret::scrub_env(secret::TOKEN_VAR);
    let events_token =
        secret::read_token_from(secret::EVENTS_TOKEN, cli.events_token_file.as_deref()).map_err(config_error)?;
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
    Ok((token, events_token))
}

/// The supervisor's own confinement, its seccomp allow-list last: its
/// runtime and everything after run under it (the spawner, forked earlier,
/// is not bound by it).
fn confine_self(degraded_ok: bool) -> Result<Option<snowluma_sandbox::SupervisorReport>, Stop> {
    match snowluma_sandbox::confine_supervisor(degraded_ok) {
        Ok(r) => Ok(Some(r)),
        Err(ConfineError::LandlockWeak(status, _)) => Err(refuse(format!(
            "the supervisor's Landlock domain is {status}; set {ALLOW_UNCONFINED_VAR}=1 to run anyway"
        ))),
        Err(ConfineError::SeccompNotInstalled(e)) if !degraded_ok => {
            Err(refuse(format!("the supervisor cannot install its seccomp filter: {e}")))
        }
        Err(e) if degraded_ok => {
            tracing::warn!(error = %e, "the supervisor could not confine itself; continuing ({ALLOW_UNCONFINED_VAR})");
            Ok(None)
        }
        Err(e) => Err(refuse(format!("the supervisor cannot confine itself: {e}"))),
    }
}

/// The endpoint's addresses when its host is a name (an IP literal needs
/// none). Resolved once, here, before confinement: the confined executor
/// can read no `/etc` and send no UDP. A later change of the name's address
/// is not seen until the server restarts; a failure (reported by the
/// executor on first use) gives an empty list.
fn resolve_endpoint(endpoint: Option<&snowluma_config::endpoint::Endpoint>) -> Vec<std::net::SocketAddr> {
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

/// The digest binding a task directory to this configuration: the effective
/// mode, endpoint and token (never stored; the worker salts it again).
fn task_scope_digest(config: &Config, token: Option<&str>) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"snowluma-mcp task directory scope\0");
    let endpoint = config.endpoint.as_ref().map(|e| e.raw.as_str()).unwrap_or("");
    for part in [config.mode.as_str(), endpoint, token.unwrap_or("")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// The HTTP principal the serve-http launcher named for this session, if
/// any (the variable is scrubbed from the environment block either way).
fn take_session_principal() -> Option<audit::Principal> {
    use snowluma_proto::session::PRINCIPAL_VAR;
    let raw = std::env::var(PRINCIPAL_VAR).ok()?;
    secret::scrub_env(PRINCIPAL_VAR);
    let (token_id, peer) = raw.split_once(' ')?;
    if token_id.is_empty() {
        return None;
    }
    Some(audit::Principal::Http { token_id: token_id.to_owned(), peer: peer.to_owned() })
}

/// The number of the descriptor the serve-http launcher placed with this
/// session's principal's pacing state, if it named one (the variable is
/// scrubbed either way). Without a principal (a server someone else
/// started, e.g. from a shell) it is ignored: the window stays this
/// runtime's.
fn take_pacing_var(relayed: bool) -> Option<std::os::fd::RawFd> {
    use snowluma_proto::session::{PACING_FD, PACING_FD_VAR};
    let raw = std::env::var_os(PACING_FD_VAR)?;
    secret::scrub_env(PACING_FD_VAR);
    if !relayed {
        tracing::warn!(
            "{PACING_FD_VAR} is set outside a serve-http session; ignored, the pacing window is per runtime"
        );
        return None;
    }
    if raw.to_str().and_then(|s| s.parse().ok()) != Some(PACING_FD) {
        tracing::warn!(
            "{PACING_FD_VAR} does not name the pacing descriptor; ignored, the pacing window is per runtime"
        );
        return None;
    }
    Some(PACING_FD)
}

/// The shared pacing window from the launcher's descriptor, reopened
/// (close-on-exec, an open file description of our own for `flock`); the
/// inherited descriptor is closed. Called after the spawner is forked (its
/// close loop drops the copy it inherited) and before confinement (the
/// reopening goes through `/proc/self/fd`). Unfit: a warning, and the
/// window is this runtime's.
fn open_pacing_window(fd: std::os::fd::RawFd) -> Option<crate::pacing::SharedWindow> {
    use std::os::fd::{AsFd, FromRawFd};
    // SAFETY: F_GETFD only asks whether `fd` is open; it touches nothing.
    if unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } < 0 {
        tracing::warn!("the serve-http pacing descriptor is not open; the pacing window is per runtime");
        return None;
    }
    // SAFETY: the descriptor is open, was placed for this process by the
    // launcher (a principal is set) and nothing else in it uses or owns it;
    // it is closed when this function returns.
    let inherited = unsafe { OwnedFd::from_raw_fd(fd) };
    match crate::pacing::SharedWindow::open(inherited.as_fd()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "the serve-http pacing descriptor is not usable; the pacing window is per runtime");
            None
        }
    }
}

/// The connecting peer when stdin is a unix socket (systemd `Accept=yes`).
fn stdin_peer() -> Option<audit::Peer> {
    // SAFETY: descriptor 0 is open for the life of the process; the borrow
    // is used only for this getsockopt call.
    let fd = unsafe { BorrowedFd::borrow_raw(0) };
    let cred = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    Some(audit::Peer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() })
}
