//! What a server holds: its configuration, workers, policy, audit log and
//! services. The execution path (`execution.rs`), the `_with_input` flow
//! (`completion_flow.rs`), background tasks (`background.rs`), resources
//! (`resources.rs`) and `get_runtime_info` (`runtime.rs`) work on this;
//! `server.rs` wraps it in the rmcp `ServerHandler` and dispatches to them.

use std::sync::Arc;

use snowluma_catalog::Catalog;

use crate::audit::AuditLog;
use crate::completion;
use crate::events::EventHub;
use crate::pacing::Pacer;
use crate::policy::Policy;
use crate::scope::Scope;
use crate::transfers::TransferService;
use crate::workers::WorkerSlot;
use snowluma_config::Config;

pub const SERVER_NAME: &str = "snowluma-mcp";
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

pub struct Workers {
    pub catalog: Arc<WorkerSlot>,
    pub network: Option<Arc<WorkerSlot>>,
}

/// The services a server may have beside its workers.
pub struct Services {
    /// File transfers (write mode with a download directory).
    pub transfers: Option<Arc<TransferService>>,
    /// Input-completion continuations (always).
    pub continuations: completion::Continuations,
    /// Persistent background transfers (write mode with a task directory).
    pub tasks: Option<Arc<crate::tasks::TaskService>>,
    /// Live event resources (with an events URL).
    pub events: Option<Arc<EventHub>>,
    /// Idempotency keys (always; persistent with a task directory).
    pub keys: Arc<crate::idempotency::Keys>,
    /// The operator's target scope (shared with the event hub).
    pub scope: Arc<Scope>,
    /// The HTTP principal's shared pacing window (a serve-http session the
    /// launcher handed one); otherwise the window is this runtime's.
    pub pacing: Option<crate::pacing::SharedWindow>,
}

pub struct ServerState {
    pub(crate) config: Arc<Config>,
    pub(crate) workers: Workers,
    pub(crate) catalog: &'static Catalog,
    pub(crate) policy: Policy,
    pub(crate) audit: Option<AuditLog>,
    /// File transfers (write mode with a download directory).
    pub(crate) transfers: Option<Arc<TransferService>>,
    /// Outstanding input-completion continuations (`completion.rs`).
    pub(crate) continuations: completion::Continuations,
    /// Live event resources, when `SNOWLUMA_MCP_EVENTS_URL` is configured
    /// (read and write modes).
    pub(crate) events: Option<Arc<EventHub>>,
    /// Persistent background transfers (write mode with a task directory).
    pub(crate) tasks: Option<Arc<crate::tasks::TaskService>>,
    /// `execution.idempotency_key`s (`idempotency.rs`).
    pub(crate) keys: Arc<crate::idempotency::Keys>,
    /// The operator's target scope (`scope.rs`).
    pub(crate) scope: Arc<Scope>,
    /// This runtime's (or its HTTP principal's) send pacing (`pacing.rs`).
    pub(crate) pacer: Pacer,
}

impl ServerState {
    pub fn new(
        config: Arc<Config>,
        workers: Workers,
        policy: Policy,
        audit: Option<AuditLog>,
        services: Services,
    ) -> ServerState {
        let Services { transfers, continuations, tasks, events, keys, scope, pacing } = services;
        let pacer = match pacing {
            Some(shared) => Pacer::shared(config.pacing, shared),
            None => Pacer::new(config.pacing),
        };
        ServerState {
            config,
            workers,
            catalog: Catalog::bundled(),
            policy,
            audit,
            transfers,
            continuations,
            events,
            tasks,
            keys,
            scope,
            pacer,
        }
    }

    /// This server's file transfers, when it has any.
    pub(crate) fn transfers(&self) -> Option<&TransferService> {
        self.transfers.as_deref()
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether live event resources are served (configured, and a mode that executes).
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    pub fn audit_enabled(&self) -> bool {
        self.audit.is_some()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn catalog(&self) -> &'static Catalog {
        self.catalog
    }
}
