//! `snowluma-mcp`: the supervisor (MCP on stdio) or, with the hidden worker
//! argument, one of its confined worker processes.

mod audit;
mod config;
mod policy;
mod progress;
mod runtime;
mod server;
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

use crate::config::{Cli, Config};
use crate::server::{SnowlumaServer, Workers};
use crate::workers::{Attach, ChannelDir, SelfExe, SpawnSpec, WorkerSlot};

fn init_tracing(filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(WORKER_ARG) {
        // Worker mode: still single-threaded here, as confinement requires.
        let Some(role) = args.get(2).and_then(|r| Role::parse(r)) else {
            eprintln!("snowluma-mcp: unknown worker role");
            return ExitCode::from(2);
        };
        init_tracing(args.get(3).map(String::as_str).unwrap_or("info"));
        return snowluma_workers::worker_main(role);
    }
    let cli = Cli::parse();
    if let Some(config::Command::Audit { action: config::AuditCommand::Verify { path } }) = &cli.command {
        return match audit::verify(path) {
            Ok(n) => {
                eprintln!("audit log OK: {n} records, chain intact");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("audit log BROKEN at {e}");
                ExitCode::FAILURE
            }
        };
    }
    let env_token = std::env::var("SNOWLUMA_MCP_TOKEN").ok();
    let config = match Config::resolve(&cli, env_token) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config.log);
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
            eprintln!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    // The audit log is opened before anything can execute; a log that
    // cannot be written stops startup (fail closed).
    let audit = match &config.audit_log {
        None => None,
        Some(path) => match audit::AuditLog::open(path, stdin_peer(), config.mode.as_str()) {
            Ok(log) => Some(log),
            Err(e) => {
                eprintln!(
                    "snowluma-mcp: configuration error: SNOWLUMA_MCP_AUDIT_LOG (--audit-log) cannot be used: {e}"
                );
                return ExitCode::from(2);
            }
        },
    };
    if config.events_url.is_some() {
        tracing::warn!("SNOWLUMA_MCP_EVENTS_URL is set, but event resources are not part of this build; ignoring it");
    }
    if config.task_dir.is_some() {
        tracing::warn!("SNOWLUMA_MCP_TASK_DIR is set, but persistent tasks are not part of this build; ignoring it");
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(config, policy, audit)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
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

/// Create (0700) and open the download directory.
fn open_download_dir(config: &Config) -> Result<(std::path::PathBuf, std::os::fd::OwnedFd), DirError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = config.stream_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("snowluma-mcp").join("downloads"));
    let bad = |problem: String| DirError { var: "SNOWLUMA_MCP_STREAM_DIR", flag: "--stream-dir", problem };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| bad(format!("cannot be created: {e}")))?;
    let canonical = std::fs::canonicalize(&dir).map_err(|e| bad(format!("cannot be resolved: {e}")))?;
    let fd = open_dir(&canonical).map_err(|e| bad(format!("cannot be opened as a directory: {e}")))?;
    Ok((canonical, fd))
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

async fn run(
    config: Config,
    policy: policy::Policy,
    audit: Option<audit::AuditLog>,
) -> Result<(), Box<dyn std::error::Error>> {
    let exe = Arc::new(SelfExe::open()?);
    let spec = Arc::new(SpawnSpec { exe, log_filter: config.log.clone() });
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
                token: config.token.clone(),
                timeout_ms: config.timeout_ms,
            }),
            spec.clone(),
            Attach { fds: Vec::new(), channel: Some((snowluma_proto::NETWORK_FD_CHANNEL, ChannelDir::ToWorker)) },
        )),
        _ => None,
    };
    // File transfers (write mode): the directories are opened here and handed
    // to the file-transfer worker as descriptors; it never sees a path.
    let mut paths = server::TransferPaths::default();
    let files = if config.mode == config::Mode::Write && network.is_some() {
        let (download_dir, download_fd) = open_download_dir(&config)?;
        paths.download_dir = Some(download_dir);
        let mut fds = vec![(snowluma_proto::FILES_DOWNLOAD_DIR_FD, Arc::new(download_fd))];
        if let Some(root) = &config.upload_root {
            let (canonical, fd) = open_upload_root(root)?;
            paths.upload_root = Some((root.clone(), canonical));
            fds.push((snowluma_proto::FILES_UPLOAD_ROOT_FD, Arc::new(fd)));
        }
        Some(WorkerSlot::start(
            Role::Files,
            WorkerConfig::Files(snowluma_proto::FilesConfig {
                upload_enabled: config.upload_root.is_some(),
                max_file_bytes: config.max_stream_bytes,
            }),
            spec.clone(),
            Attach { fds, channel: Some((snowluma_proto::FILES_FD_CHANNEL, ChannelDir::FromWorker)) },
        ))
    } else {
        None
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
        std::iter::once(catalog.clone()).chain(network.clone()).chain(files.clone()).collect();
    let server = SnowlumaServer::new(config, Workers { catalog, network, files }, policy, audit, paths);
    let info = serde_json::to_value(server::implementation())?;
    let transport = transport::LineTransport::stdio(info);
    let result = match server.serve(transport).await {
        Ok(running) => running.waiting().await.map(|_| ()).map_err(|e| e.into()),
        Err(e) => Err(e.into()),
    };
    for s in &slots {
        s.shutdown();
    }
    result
}
