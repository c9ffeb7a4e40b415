//! `snowluma-mcp`: the supervisor (MCP on stdio) or, with the hidden worker
//! argument, one of its confined worker processes.

mod audit;
mod config;
mod confine;
mod doctor;
mod policy;
mod runtime;
mod server;
mod tools;
mod trace;
mod transport;
mod workers;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rmcp::ServiceExt;
use snowluma_proto::{NetworkConfig, Role, WORKER_ARG, WorkerConfig};

use crate::config::{Cli, Config};
use crate::server::{SnowlumaServer, Workers};
use crate::workers::{SelfExe, SpawnSpec, WorkerSlot};

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
        return snowluma_workers::worker_main(role, args.get(4..).unwrap_or_default());
    }
    if args.get(1).map(String::as_str) == Some(doctor::PROBE_ARG) {
        // Escape probe (doctor and tests only): confine as a role, try one
        // forbidden operation, report.
        return doctor::probe_main(args.get(2..).unwrap_or_default());
    }
    let cli = Cli::parse();
    if let Some(config::Command::Doctor { json }) = &cli.command {
        return doctor::run(*json);
    }
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
    // Confinement, before the runtime exists (Landlock restricts the calling
    // thread and its future children only).
    let support = confine::Support::detect();
    let degraded_ok = match confine::gate(config.mode, support, confine::opt_out_from_env()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("snowluma-mcp: {e}");
            return ExitCode::from(2);
        }
    };
    let grants = confine::WorkerGrants::from_config(&config, degraded_ok);
    let supervisor_report = match confine::confine_supervisor(&grants.network_ports) {
        Ok(r) if r.landlock.status == snowluma_workers::confine::Enforcement::FullyEnforced || degraded_ok => Some(r),
        Ok(r) => {
            eprintln!(
                "snowluma-mcp: the supervisor's Landlock domain is {}; set {}=1 to run anyway",
                r.landlock.status.as_str(),
                confine::ALLOW_UNCONFINED_VAR
            );
            return ExitCode::from(2);
        }
        Err(e) if degraded_ok => {
            tracing::warn!(error = %e, "the supervisor could not confine itself; continuing ({})", confine::ALLOW_UNCONFINED_VAR);
            None
        }
        Err(e) => {
            eprintln!("snowluma-mcp: the supervisor cannot confine itself: {e}");
            return ExitCode::from(2);
        }
    };
    let roles: Vec<Role> = if config.endpoint.is_some() && config.mode.executes() {
        vec![Role::Catalog, Role::Network]
    } else {
        vec![Role::Catalog]
    };
    confine::record(support, supervisor_report.as_ref(), degraded_ok, &roles);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(config, policy, audit, grants)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
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
    grants: confine::WorkerGrants,
) -> Result<(), Box<dyn std::error::Error>> {
    let exe = Arc::new(SelfExe::open()?);
    let spec = Arc::new(SpawnSpec { exe, log_filter: config.log.clone(), grants });
    let catalog = WorkerSlot::start(Role::Catalog, WorkerConfig::Catalog { denied: policy.denied() }, spec.clone());
    let network = match (&config.endpoint, config.mode.executes()) {
        (Some(endpoint), true) => Some(WorkerSlot::start(
            Role::Network,
            WorkerConfig::Network(NetworkConfig {
                endpoint: endpoint.clone(),
                token: config.token.clone(),
                timeout_ms: config.timeout_ms,
            }),
            spec.clone(),
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
    let slots: Vec<Arc<WorkerSlot>> = std::iter::once(catalog.clone()).chain(network.clone()).collect();
    let server = SnowlumaServer::new(config, Workers { catalog, network }, policy, audit);
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
