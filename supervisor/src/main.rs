//! `snowluma-mcp`: the supervisor (MCP on stdio) or, with the hidden worker
//! argument, one of its confined worker processes.

mod config;
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
        return snowluma_workers::worker_main(role);
    }
    let cli = Cli::parse();
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
    // Fail closed: an operator who asked for an audit log must never get
    // unaudited writes from a build that cannot write one.
    if config.audit_log.is_some() {
        eprintln!(
            "snowluma-mcp: configuration error: SNOWLUMA_MCP_AUDIT_LOG (--audit-log) is set, but this build has no audit log; refusing to start rather than execute writes unaudited"
        );
        return ExitCode::from(2);
    }
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
    match rt.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let exe = Arc::new(SelfExe::open()?);
    let spec = Arc::new(SpawnSpec { exe, log_filter: config.log.clone() });
    let catalog = WorkerSlot::start(Role::Catalog, WorkerConfig::Catalog, spec.clone());
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
    let server = SnowlumaServer::new(config, Workers { catalog, network });
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
