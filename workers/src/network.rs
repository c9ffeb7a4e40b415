//! The network executor: the only process that talks to SnowLuma.
//! (Filled in by the executor work.)

use snowluma_proto::{Reply, Request, WorkerConfig, WorkerError};

use crate::serve::{Ctx, RoleHandler};

#[derive(Default)]
pub struct NetworkWorker {}

impl RoleHandler for NetworkWorker {
    fn configure(&self, _config: WorkerConfig) -> Result<(), String> {
        Ok(())
    }

    async fn handle(&self, _request: Request, _ctx: Ctx) -> Reply {
        Reply::Error(WorkerError::Unsupported)
    }
}
