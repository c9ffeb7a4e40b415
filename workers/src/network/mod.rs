//! The network executor: the only process that opens connections to
//! SnowLuma and the only one that holds the endpoint and token (received
//! over IPC after the handshake, never from the environment).
//!
//! One `reqwest` client with a keep-alive pool POSTs `{action, params}` to
//! the endpoint exactly as configured. Every request carries the call's
//! `traceparent` (and validated `tracestate`) as HTTP headers, never in the
//! OneBot params. Nothing is retried. Cancellation drops the exchange,
//! including a body still being read, which closes the connection.
//!
//! Parts: [`client`] (the HTTP client and ordinary calls), [`envelope`]
//! (classifying SnowLuma's answers), [`frames`] (stream framing),
//! [`streams`] (stream actions), [`transfer`] (file transfers: downloads
//! into and uploads from descriptors), [`errors`] (how failures are
//! reported).

mod client;
mod envelope;
mod errors;
mod events;
mod frames;
mod json_syntax;
mod streams;
mod transfer;

use std::os::fd::OwnedFd;
use std::sync::{Mutex, OnceLock};

use snowluma_proto::{ExecRequest, Reply, Request, ToolReply, WorkerConfig, WorkerError};

pub(crate) use client::Net;
pub(crate) use errors::{ExecFailure, Report, cancelled};
#[cfg(test)]
pub(crate) use frames::MAX_FRAME_BYTES;
pub(crate) use frames::{frame_failure, js_string, safe_int};
pub(crate) use streams::{Bounds, FrameReader, generic_exchange, open, stringify};
#[cfg(test)]
pub(crate) use streams::{FrameCursor, Pop};

use crate::serve::{Ctx, RoleHandler};

/// Largest ordinary response body accepted. The body travels unchanged as
/// the reply's result, so it must fit in one IPC frame with the rest of the
/// reply (diagnostics, whose echoed wording is capped at
/// [`envelope::MAX_WORDING_CHARS`]): a larger body is refused here with a clear error
/// instead of producing a reply that cannot be sent.
pub const MAX_BODY_BYTES: usize = snowluma_proto::MAX_FRAME_BYTES - 1024 * 1024;

#[derive(Default)]
pub struct NetworkWorker {
    net: OnceLock<Net>,
    /// The descriptor channel, claimed at startup (before the runtime
    /// existed) and read once configured.
    channel: Mutex<Option<OwnedFd>>,
    /// File descriptors handed over by the supervisor for transfers.
    fds: OnceLock<snowluma_proto::fdpass::FdReceiver>,
}

impl NetworkWorker {
    /// Takes its descriptor channel from the worker's claim (`worker_main`).
    pub fn from_claimed(claimed: &mut snowluma_sandbox::role::Claimed) -> NetworkWorker {
        let channel = claimed.take(snowluma_sandbox::role::Slot::FdChannel);
        NetworkWorker { net: OnceLock::new(), channel: Mutex::new(channel), fds: OnceLock::new() }
    }
}

impl RoleHandler for NetworkWorker {
    fn configure(&self, config: WorkerConfig) -> Result<(), String> {
        match config {
            WorkerConfig::Network(cfg) => {
                let net = client::build(cfg)?;
                let channel = self.channel.lock().ok().and_then(|mut c| c.take());
                if let Some(fd) = channel {
                    let rx = snowluma_proto::fdpass::FdReceiver::spawn(fd).map_err(|e| format!("fd channel: {e}"))?;
                    let _ = self.fds.set(rx);
                }
                self.net.set(net).map_err(|_| "already configured".to_owned())
            }
            _ => Err("network executor needs a network configuration".into()),
        }
    }

    async fn handle(&self, request: Request, ctx: Ctx) -> Reply {
        let Some(net) = self.net.get() else {
            return Reply::Error(WorkerError::Internal("not configured".into()));
        };
        match request {
            Request::Execute(req) => Reply::Tool(execute(net, self.fds.get(), req, &ctx).await),
            // Boxed: an ordinary call's future (every call's) does not carry
            // the event connection's state.
            Request::Events { self_id } => Box::pin(events::run(net, self_id, &ctx)).await,
            _ => Reply::Error(WorkerError::Unsupported),
        }
    }
}

async fn execute(
    net: &Net,
    fds: Option<&snowluma_proto::fdpass::FdReceiver>,
    req: ExecRequest,
    ctx: &Ctx,
) -> ToolReply {
    if req.stream {
        // Boxed, like the event connection: not in an ordinary call's future.
        return Box::pin(streams::execute(net, fds, req, ctx)).await;
    }
    client::call(net, &req, ctx).await
}

#[cfg(test)]
mod numbers {
    use snowluma_proto::architecture::{check, size};

    /// ARCHITECTURE.md's figures for the network executor are the code's.
    #[test]
    fn the_architecture_numbers_of_the_network_executor_are_the_code_s() {
        check(
            include_str!("../../../ARCHITECTURE.md"),
            &[
                ("ordinary response body", size(super::MAX_BODY_BYTES as u64)),
                ("response nesting", super::envelope::MAX_RESPONSE_DEPTH.to_string()),
                ("SnowLuma's wording kept", super::envelope::MAX_WORDING_CHARS.to_string()),
                ("calls to SnowLuma at once", super::client::MAX_ACTIVE_CALLS.to_string()),
                ("streams at once", super::streams::MAX_ACTIVE_STREAMS.to_string()),
                ("stream frame", size(super::frames::MAX_FRAME_BYTES as u64)),
                ("event frame", size(super::events::MAX_EVENT_FRAME_BYTES as u64)),
                ("task record", size(crate::tasks::store::MAX_RECORD_BYTES)),
            ],
        );
    }
}
