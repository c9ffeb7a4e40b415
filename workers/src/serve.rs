//! The worker side of the IPC protocol, common to every role: handshake,
//! configuration, concurrent requests with per-request cancellation, and
//! exit when the supervisor goes away.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use snowluma_proto::{
    BUILD_ID, FrameError, FromWorker, Progress, Reply, Request, Role, ToWorker, WorkerConfig, read_frame, write_frame,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("IPC: {0}")]
    Frame(#[from] FrameError),
    #[error("IPC socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(String),
}

/// What a request handler gets besides the request.
#[derive(Clone)]
pub struct Ctx {
    pub cancel: CancellationToken,
    id: u64,
    out: mpsc::UnboundedSender<FromWorker>,
}

impl Ctx {
    /// Report progress for this request; dropped silently if the
    /// supervisor is gone (the reply path reports that).
    pub fn progress(&self, progress: Progress) {
        let _ = self.out.send(FromWorker::Progress { id: self.id, progress });
    }

    /// Report something on this request's event connection; false once the
    /// supervisor is gone.
    pub fn event(&self, event: snowluma_proto::EventMsg) -> bool {
        self.out.send(FromWorker::Event { id: self.id, event }).is_ok()
    }
}

/// A role's request handler.
pub trait RoleHandler: Send + Sync + 'static {
    /// Accept the role's configuration (sent once, right after the handshake).
    fn configure(&self, config: WorkerConfig) -> Result<(), String>;
    /// Serve one request. Must return promptly once `ctx.cancel` fires.
    fn handle(&self, request: Request, ctx: Ctx) -> impl Future<Output = Reply> + Send;
}

/// Encode one outgoing message. A reply too large for a frame is replaced by
/// an error reply for the same request (the connection keeps working); an
/// oversized progress report is dropped.
fn frame_or_substitute(msg: FromWorker) -> Option<Vec<u8>> {
    match snowluma_proto::frame::encode(&msg) {
        Ok(frame) => Some(frame),
        Err(FrameError::TooLarge(bytes)) => {
            let FromWorker::Reply { id, .. } = msg else {
                tracing::warn!(bytes, "an oversized IPC message was dropped");
                return None;
            };
            tracing::warn!(bytes, "a reply exceeds the IPC frame limit; answering with an error instead");
            let reply = Reply::Error(snowluma_proto::WorkerError::ReplyTooLarge {
                bytes,
                limit: snowluma_proto::MAX_FRAME_BYTES,
            });
            snowluma_proto::frame::encode(&FromWorker::Reply { id, reply }).ok()
        }
        Err(e) => {
            tracing::warn!(error = %e, "an IPC message could not be encoded and was dropped");
            None
        }
    }
}

/// A message about a request (its reply, progress or an event of it): the
/// first one written ends the worker's start-up.
fn serves_a_request(msg: &FromWorker) -> bool {
    matches!(msg, FromWorker::Reply { .. } | FromWorker::Progress { .. } | FromWorker::Event { .. })
}

/// Whether an IPC error only means that the supervisor has gone away (the
/// ordinary end of every session): no error to report.
fn supervisor_gone(e: &FrameError) -> bool {
    match e {
        FrameError::Closed => true,
        FrameError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// Serve the IPC connection until the supervisor closes it. The supervisor
/// going away at any point, even mid-handshake, is an ordinary end.
pub async fn serve<H: RoleHandler>(fd: OwnedFd, role: Role, handler: H) -> Result<(), ServeError> {
    match serve_inner(fd, role, handler).await {
        Err(ServeError::Frame(e)) if supervisor_gone(&e) => Ok(()),
        other => other,
    }
}

async fn serve_inner<H: RoleHandler>(fd: OwnedFd, role: Role, handler: H) -> Result<(), ServeError> {
    let (rd, mut wr) = snowluma_proto::sockio::split_one(fd)?;
    // One recv per message: the length prefix and the body come from the buffer.
    let mut rd = tokio::io::BufReader::with_capacity(64 * 1024, rd);

    // Handshake.
    match read_frame::<_, ToWorker>(&mut rd).await? {
        ToWorker::Hello(h) if h.build == BUILD_ID && h.role == role => {
            write_frame(&mut wr, &FromWorker::Ready { build: BUILD_ID.to_owned(), pid: std::process::id() }).await?;
        }
        ToWorker::Hello(h) => {
            let reason = format!(
                "build or role mismatch: supervisor {} / {:?}, worker {} / {:?}",
                h.build, h.role, BUILD_ID, role
            );
            write_frame(&mut wr, &FromWorker::Refused { reason: reason.clone() }).await?;
            return Err(ServeError::Handshake(reason));
        }
        other => return Err(ServeError::Handshake(format!("expected Hello, got {other:?}"))),
    }

    let handler = Arc::new(handler);
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<FromWorker>();
    let writer = tokio::spawn(async move {
        while let Some(first) = out_rx.recv().await {
            // Start-up is over once a request has been served (not at
            // `Configured`, which comes in the middle of the cold start).
            let mut answered = serves_a_request(&first);
            let (batch, largest) = snowluma_proto::frame::batch(
                first,
                || {
                    let next = out_rx.try_recv().ok();
                    answered |= next.as_ref().is_some_and(serves_a_request);
                    next
                },
                frame_or_substitute,
            );
            if batch.is_empty() {
                continue;
            }
            let written = tokio::io::AsyncWriteExt::write_all(&mut wr, &batch).await;
            drop(batch);
            // After a large reply, not after a batch of many small ones.
            snowluma_proto::alloc::after_large(largest);
            if answered {
                snowluma_proto::alloc::after_start();
            }
            if let Err(e) = written {
                // The socket itself is broken: the supervisor sees it close,
                // restarts this worker and logs it.
                tracing::debug!(error = %e, "IPC write failed; closing the connection");
                break;
            }
        }
    });
    let inflight: Arc<Mutex<HashMap<u64, CancellationToken>>> = Arc::default();

    let result = loop {
        let msg = match read_frame::<_, ToWorker>(&mut rd).await {
            Ok(m) => m,
            Err(FrameError::Closed) => break Ok(()),
            Err(e) => break Err(ServeError::Frame(e)),
        };
        match msg {
            ToWorker::Configure(cfg) => {
                let reply = match handler.configure(cfg) {
                    Ok(()) => FromWorker::Configured,
                    Err(reason) => FromWorker::Refused { reason },
                };
                let _ = out_tx.send(reply);
            }
            ToWorker::Request { id, request } => {
                let cancel = CancellationToken::new();
                if let Ok(mut map) = inflight.lock() {
                    map.insert(id, cancel.clone());
                }
                let ctx = Ctx { cancel, id, out: out_tx.clone() };
                let handler = handler.clone();
                let inflight = inflight.clone();
                let out = out_tx.clone();
                tokio::spawn(async move {
                    let reply = handler.handle(request, ctx).await;
                    if let Ok(mut map) = inflight.lock() {
                        map.remove(&id);
                    }
                    let _ = out.send(FromWorker::Reply { id, reply });
                });
            }
            ToWorker::Cancel { id } => {
                if let Ok(map) = inflight.lock()
                    && let Some(t) = map.get(&id)
                {
                    t.cancel();
                }
            }
            ToWorker::Hello(_) => break Err(ServeError::Handshake("second Hello".into())),
        }
    };
    // The supervisor is gone (or spoke nonsense): stop everything in flight.
    if let Ok(map) = inflight.lock() {
        for t in map.values() {
            t.cancel();
        }
    }
    drop(out_tx);
    writer.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's start-up ends with its first message about a request,
    /// never with the handshake's or configuration's.
    #[test]
    fn start_up_ends_with_the_first_message_about_a_request() {
        let progress = snowluma_proto::Progress { progress: 1.0, total: None, message: None };
        for msg in [
            FromWorker::Reply { id: 1, reply: Reply::Tool(snowluma_proto::ToolReply::ok(&serde_json::json!({}))) },
            FromWorker::Progress { id: 1, progress },
            FromWorker::Event { id: 1, event: snowluma_proto::EventMsg::Connected },
        ] {
            assert!(serves_a_request(&msg), "{msg:?}");
        }
        for msg in [FromWorker::Configured, FromWorker::Ready { build: BUILD_ID.to_owned(), pid: 1 }] {
            assert!(!serves_a_request(&msg), "{msg:?}");
        }
    }

    /// An oversized reply becomes an error reply for the same request, which
    /// fits; small messages pass unchanged.
    #[tokio::test]
    async fn oversized_reply_is_replaced() {
        let big = snowluma_proto::ToolReply::ok(&serde_json::json!("x".repeat(snowluma_proto::MAX_FRAME_BYTES + 10)));
        let frame = frame_or_substitute(FromWorker::Reply { id: 9, reply: Reply::Tool(big) }).unwrap();
        let back: FromWorker = read_frame(&mut &frame[..]).await.unwrap();
        match back {
            FromWorker::Reply {
                id: 9,
                reply: Reply::Error(snowluma_proto::WorkerError::ReplyTooLarge { bytes, .. }),
            } => {
                assert!(bytes > snowluma_proto::MAX_FRAME_BYTES)
            }
            other => panic!("{other:?}"),
        }
        let small = FromWorker::Progress { id: 1, progress: Progress { progress: 1.0, total: None, message: None } };
        assert!(frame_or_substitute(small).is_some());
    }
}
