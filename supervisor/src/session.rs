//! One MCP session, inside the supervisor's runtime: the workers are
//! started (through the spawner), the services built on them, and the rmcp
//! server served over stdio until the client goes, the spawner dies or a
//! worker that cannot be replaced stops.

use std::sync::Arc;

use rmcp::ServiceExt;
use snowluma_config::Config;
use snowluma_proto::{NetworkConfig, Role, WorkerConfig};
use snowluma_sandbox::role::Slot;
use snowluma_spawner::SpawnerClient;
use tokio_util::sync::CancellationToken;

use crate::server::{self, SnowlumaServer, Workers};

use crate::workers::{Attach, SpawnSpec, WorkerSlot};
use crate::{completion, events, tasks, transfers};

/// The session's worker slots, by role.
struct Slots {
    catalog: Arc<WorkerSlot>,
    network: Option<Arc<WorkerSlot>>,
    files: Option<Arc<WorkerSlot>>,
    tasks: Option<Arc<WorkerSlot>>,
}

impl Slots {
    fn all(&self) -> Vec<Arc<WorkerSlot>> {
        std::iter::once(self.catalog.clone())
            .chain(self.network.clone())
            .chain(self.files.clone())
            .chain(self.tasks.clone())
            .collect()
    }
}

pub(crate) async fn run(started: Started, (sock, pid): Spawner) -> Result<Ended, Box<dyn std::error::Error>> {
    let spawner = SpawnerClient::start(sock, pid)?;
    let spawner_gone = spawner.gone();
    let fatal = CancellationToken::new();
    let Started {
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
    } = started;
    let spec = Arc::new(SpawnSpec { spawner, log_filter: config.worker_log_filter(), grants, fatal: fatal.clone() });
    let catalog = WorkerSlot::start(
        Role::Catalog,
        WorkerConfig::Catalog { denied: policy.denied() },
        spec.clone(),
        Attach::for_role(Role::Catalog, Vec::new()),
    );
    let network = start_network(&config, &spec, NetworkSecrets { token, events_token, resolved, events_resolved });
    // File transfers (write mode): the directories are opened at start-up
    // and handed to the file-transfer worker as descriptors; it never sees
    // a path.
    let (files, paths) = match (transfer_dirs, &network) {
        (Some(dirs), Some(_)) => {
            let (slot, paths) = start_files(&config, &spec, dirs);
            (Some(slot), paths)
        }
        _ => (None, transfers::TransferPaths::default()),
    };
    let task_owner = tasks.as_ref().and_then(|(_, _, owner)| owner.clone());
    let task_slot = match (tasks, &files) {
        (Some((fd, config_digest, owner)), Some(_)) => Some(WorkerSlot::start(
            Role::Tasks,
            WorkerConfig::Tasks { config_digest, owner },
            spec.clone(),
            Attach::for_role(Role::Tasks, vec![(Slot::TaskDir, fd)]),
        )),
        _ => None,
    };
    let slots = Slots { catalog, network, files, tasks: task_slot };
    let (server, hub, task_service) = build_server(config, policy, audit, &slots, paths, task_owner, pacing)?;
    let info = serde_json::to_value(server::implementation())?;
    let transport = crate::transport::LineTransport::stdio(info, server.audit_enabled())
        .relayed(relayed)
        .direct_calls(server.direct_calls());
    let stdout = transport.stdout_state();
    let ends = Ends { spawner_gone, fatal, slots: slots.all(), tasks: task_service };
    let result = serve(server, transport, &ends).await;
    // The MCP connection is over: its event resources go with it (the
    // WebSocket is closed before the executor is stopped).
    if let Some(hub) = &hub {
        hub.release_all();
        tokio::task::yield_now().await;
    }
    for s in &ends.slots {
        s.shutdown();
    }
    // The transport logged the failure when it happened.
    if stdout.gone() { Ok(Ended::StdoutGone) } else { result }
}

/// What the network executor is given, moved (never copied) into its
/// configuration.
struct NetworkSecrets {
    token: Option<zeroize::Zeroizing<String>>,
    events_token: Option<zeroize::Zeroizing<String>>,
    resolved: Vec<std::net::SocketAddr>,
    events_resolved: Vec<std::net::SocketAddr>,
}

/// The network executor, when the mode executes and an endpoint is set.
fn start_network(config: &Config, spec: &Arc<SpawnSpec>, mut secrets: NetworkSecrets) -> Option<Arc<WorkerSlot>> {
    let endpoint = config.endpoint.as_ref().filter(|_| config.mode.executes())?;
    let network = NetworkConfig {
        endpoint: endpoint.raw.clone(),
        resolved: std::mem::take(&mut secrets.resolved),
        // Moved, not copied: the buffer is wiped once handed over.
        token: secrets.token.as_mut().map(|t| std::mem::take(&mut **t)),
        timeout_ms: config.timeout_ms,
        max_stream_bytes: config.max_stream_bytes,
        events: config.events_url.as_ref().map(|url| snowluma_proto::EventsTarget {
            url: url.raw.clone(),
            resolved: std::mem::take(&mut secrets.events_resolved),
            // Moved, not copied, as the token above.
            token: secrets.events_token.as_mut().map(|t| std::mem::take(&mut **t)),
        }),
    };
    Some(WorkerSlot::start(
        Role::Network,
        WorkerConfig::Network(network),
        spec.clone(),
        Attach::for_role(Role::Network, Vec::new()),
    ))
}

/// The file-transfer worker, with the directories' descriptors.
fn start_files(
    config: &Config,
    spec: &Arc<SpawnSpec>,
    dirs: crate::dirs::TransferDirs,
) -> (Arc<WorkerSlot>, transfers::TransferPaths) {
    let mut paths = transfers::TransferPaths { download_dir: Some(dirs.download_dir), ..Default::default() };
    let mut fds = vec![(Slot::DownloadDir, dirs.download_fd)];
    // Compared with absolute symlink targets only; never opened.
    let mut upload_root_paths = Vec::new();
    if let Some((configured, canonical, fd)) = dirs.upload_root {
        upload_root_paths = [&canonical, &configured].iter().filter_map(|p| p.to_str()).map(str::to_owned).collect();
        paths.upload_root = Some((configured, canonical));
        fds.push((Slot::UploadRoot, fd));
    }
    let slot = WorkerSlot::start(
        Role::Files,
        WorkerConfig::Files(snowluma_proto::FilesConfig {
            upload_enabled: config.upload_root.is_some(),
            max_file_bytes: config.max_stream_bytes,
            upload_root_paths,
        }),
        spec.clone(),
        Attach::for_role(Role::Files, fds),
    );
    (slot, paths)
}

type Built = (Arc<SnowlumaServer>, Option<Arc<events::EventHub>>, Option<Arc<tasks::TaskService>>);

/// The services on top of the workers, and the rmcp server holding them.
fn build_server(
    config: Config,
    policy: crate::policy::Policy,
    audit: Option<crate::audit::AuditLog>,
    slots: &Slots,
    paths: transfers::TransferPaths,
    task_owner: Option<String>,
    pacing: Option<crate::pacing::SharedWindow>,
) -> Result<Built, Box<dyn std::error::Error>> {
    let timeout = std::time::Duration::from_millis(config.timeout_ms);
    let transfer_service = match (&slots.files, &slots.network) {
        (Some(f), Some(n)) => {
            Some(transfers::TransferService::new(f.clone(), n.clone(), paths, config.max_stream_bytes, timeout))
        }
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
    let continuations = completion::Continuations::new(completion::Continuations::clock_offset_from_env())?;
    // Live event resources: only with an events URL and a network executor.
    let scope = Arc::new(crate::scope::Scope::from_config(&config.scope));
    let hub = match (&slots.network, &config.events_url) {
        (Some(n), Some(_)) => Some(events::EventHub::new(n.clone(), timeout, scope.clone())),
        _ => None,
    };
    let key_owner = task_owner.clone();
    let task_service = slots.tasks.clone().map(|slot| tasks::TaskService::new(slot, task_owner));
    // Idempotency keys: the task store's with a task directory, else this
    // runtime's memory.
    let key_clock = crate::idempotency::Keys::clock_offset_from_env();
    let keys = Arc::new(match task_service.clone() {
        Some(t) => crate::idempotency::Keys::persistent(t, key_owner, key_clock),
        None => crate::idempotency::Keys::in_memory(key_owner, key_clock),
    });
    if let Some(t) = task_service.clone() {
        // The restart pass, at once: unfinished records of an earlier run
        // become failed (unknown remote outcome). Errors are reported to
        // every task call.
        tokio::spawn(async move {
            if let Err(e) = t.recover().await {
                tracing::warn!(error = %e, "the task store cannot be used");
            }
        });
        let k = keys.clone();
        tokio::spawn(async move { k.sweep().await });
    }
    // A damaged panel is a packaging error: `doctor` says so, and its
    // resource read fails with the message (nothing serves an empty panel).
    // Not checked here: digesting the 600 KB asset would cost every start.
    let server = SnowlumaServer::new(crate::state::ServerState::new(
        config,
        Workers { catalog: slots.catalog.clone(), network: slots.network.clone() },
        policy,
        audit,
        server::Services {
            transfers: transfer_service,
            continuations,
            tasks: task_service.clone(),
            events: hub.clone(),
            keys,
            scope,
            pacing,
        },
    ));
    Ok((server, hub, task_service))
}

/// What ends a session besides its client.
struct Ends {
    spawner_gone: CancellationToken,
    /// A worker that cannot be replaced stopped.
    fatal: CancellationToken,
    slots: Vec<Arc<WorkerSlot>>,
    tasks: Option<Arc<tasks::TaskService>>,
}

impl Ends {
    fn broken(&self) -> bool {
        self.spawner_gone.is_cancelled() || self.fatal.is_cancelled()
    }
}

async fn serve(
    server: Arc<SnowlumaServer>,
    transport: crate::transport::LineTransport,
    ends: &Ends,
) -> Result<Ended, Box<dyn std::error::Error>> {
    // The calls' closing lines, written a moment after they finish; the
    // task ends with this function, whichever way it returns.
    struct Flusher(tokio::task::JoinHandle<()>);
    impl Drop for Flusher {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let flusher = Flusher(tokio::spawn(crate::calllog::flusher()));
    let running = match server.serve(transport).await {
        Ok(running) => running,
        // stdin ended before the session started (a client that only probed
        // the command, or went away): an ordinary end, not a failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("stdin ended before the session started");
            return Ok(Ended::Finished);
        }
        Err(e) => return Err(e.into()),
    };
    // The spawner dying leaves a server that cannot start or restart a
    // worker: end the session (the calls in flight fail with an error and
    // are answered) so that the client or systemd starts a whole, confined
    // tree again.
    let session = running.cancellation_token();
    let watch_slots = ends.slots.clone();
    let died = ends.spawner_gone.clone();
    let lost = ends.fatal.clone();
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
    drop(flusher);
    crate::calllog::write_held();
    // Background transfers outlive the session that started them: their
    // results go to the task store, read in a later session.
    if let Some(t) = &ends.tasks
        && !ends.broken()
    {
        t.wait_idle().await;
    }
    watcher.abort();
    match r {
        Ok(_) if ends.broken() => Ok(Ended::Broken),
        Ok(_) => Ok(Ended::Finished),
        Err(e) => Err(e.into()),
    }
}

/// The spawner's socket and process.
pub(crate) type Spawner = (std::os::fd::OwnedFd, nix::unistd::Pid);

/// A token, wiped when dropped.
pub(crate) type Token = Option<zeroize::Zeroizing<String>>;

/// Everything start-up prepared for the session.
pub(crate) struct Started {
    pub(crate) config: Config,
    pub(crate) policy: crate::policy::Policy,
    pub(crate) audit: Option<crate::audit::AuditLog>,
    pub(crate) grants: snowluma_sandbox::WorkerGrants,
    pub(crate) transfer_dirs: Option<crate::dirs::TransferDirs>,
    /// The task directory's descriptor, the configuration's scope digest
    /// and the principal this session's tasks belong to.
    pub(crate) tasks: Option<(Arc<std::os::fd::OwnedFd>, [u8; 32], Option<String>)>,
    /// Moved into the network executor's configuration, then wiped.
    pub(crate) token: Token,
    /// The event WebSocket's own token: likewise.
    pub(crate) events_token: Token,
    pub(crate) resolved: Vec<std::net::SocketAddr>,
    /// The events host's addresses (empty without events or for an IP literal).
    pub(crate) events_resolved: Vec<std::net::SocketAddr>,
    /// A session the serve-http launcher started (behind its front).
    pub(crate) relayed: bool,
    /// The HTTP principal's shared pacing window, when the launcher handed one.
    pub(crate) pacing: Option<crate::pacing::SharedWindow>,
}

/// How a session ended without an error of its own.
pub(crate) enum Ended {
    /// stdin reached its end (the client finished).
    Finished,
    /// stdout failed: the client is gone; already logged.
    StdoutGone,
    /// The spawner died, or a worker that cannot be replaced stopped;
    /// already logged.
    Broken,
}
