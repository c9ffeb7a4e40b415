//! The catalog worker: answers the documentation tools and catalog
//! resources from the bundled catalog. It needs no filesystem, no network
//! and no secrets; arguments from the client are parsed here, not in the
//! supervisor.

use snowluma_catalog::Catalog;
use snowluma_catalog::tools::{self, DocError};
use snowluma_proto::{Diagnostics, FailureKind, Reply, Request, ResourceReply, ToolReply, WorkerConfig, WorkerError};

use crate::serve::{Ctx, RoleHandler};

pub struct CatalogWorker {
    catalog: &'static Catalog,
    denied: std::sync::OnceLock<std::collections::BTreeSet<String>>,
}

impl CatalogWorker {
    pub fn new() -> CatalogWorker {
        CatalogWorker { catalog: Catalog::bundled(), denied: std::sync::OnceLock::new() }
    }
}

impl Default for CatalogWorker {
    fn default() -> Self {
        CatalogWorker::new()
    }
}

fn doc_error(e: DocError) -> ToolReply {
    let kind = match e {
        DocError::UnknownAction(_) => FailureKind::UnknownAction,
        _ => FailureKind::InvalidArguments,
    };
    let next = match e {
        DocError::UnknownAction(_) => "Call search_actions or list_actions to find the action's name.",
        _ => "Fix the arguments to match the tool's inputSchema and call again.",
    };
    ToolReply::error(Diagnostics::failed(kind, e.to_string()).with_next_step(next))
}

impl RoleHandler for CatalogWorker {
    fn configure(&self, config: WorkerConfig) -> Result<(), String> {
        match config {
            WorkerConfig::Catalog { denied } => {
                self.denied.set(denied.into_iter().collect()).map_err(|_| "already configured".to_owned())
            }
            other => Err(format!("catalog worker cannot take {other:?}")),
        }
    }

    async fn handle(&self, request: Request, ctx: Ctx) -> Reply {
        // Each request's work is bounded (a keyword query has at most
        // search::MAX_TERMS terms; a substring query is one pass), so a
        // request is checked for cancellation once, before it starts, and
        // yields first so that requests already queued are served in turn.
        tokio::task::yield_now().await;
        if ctx.cancel.is_cancelled() {
            return Reply::Tool(ToolReply::fail(FailureKind::Cancelled, "cancelled"));
        }
        match request {
            Request::CatalogTool { tool, args } => {
                let args = match args.parse() {
                    Ok(v) => v,
                    Err(e) => {
                        return Reply::Tool(ToolReply::fail(
                            FailureKind::InvalidArguments,
                            format!("arguments are not JSON: {e}"),
                        ));
                    }
                };
                let empty = std::collections::BTreeSet::new();
                let denied = self.denied.get().unwrap_or(&empty);
                Reply::Tool(match tools::call(self.catalog, &tool, &args, denied) {
                    Ok(v) => ToolReply::ok(&v),
                    Err(e) => doc_error(e),
                })
            }
            Request::CatalogResource { uri } => match tools::read_resource(self.catalog, &uri) {
                Ok(text) => Reply::Resource(ResourceReply { uri, mime_type: "application/json".into(), text }),
                Err(_) => Reply::Error(WorkerError::ResourceNotFound(snowluma_catalog::echo(&uri))),
            },
            Request::Execute(_) | Request::Files(_) | Request::Events { .. } | Request::Tasks(_) => {
                Reply::Error(WorkerError::Unsupported)
            }
        }
    }
}
