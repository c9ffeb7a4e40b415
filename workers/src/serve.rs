//! The worker side of the IPC protocol, common to every role: handshake,
//! configuration, concurrent requests with per-request cancellation, and
//! exit when the supervisor goes away.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use snowluma_proto::outbox::Outbox;
use snowluma_proto::{
    BUILD_ID, FrameError, FromWorker, Progress, Reply, Request, Role, ToWorker, WorkerConfig, read_buffered_frame,
    read_frame, write_frame,
};
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
    out: Arc<Outbox>,
}

impl Ctx {
    /// Report progress for this request; dropped silently if the
    /// supervisor is gone (the reply path reports that).
    pub fn progress(&self, progress: Progress) {
        if let Some(frame) = frame_or_substitute(FromWorker::Progress { id: self.id, progress }) {
            let _ = self.out.send(frame);
        }
        // A message about a request ends the worker's start-up.
        snowluma_proto::alloc::after_start();
    }

    /// Report something on this request's event connection; false once the
    /// supervisor is gone.
    pub fn event(&self, event: snowluma_proto::EventMsg) -> bool {
        let sent = match frame_or_substitute(FromWorker::Event { id: self.id, event }) {
            Some(frame) => self.out.send(frame).is_ok(),
            // Not encodable (logged): dropped, the connection goes on.
            None => true,
        };
        // A message about a request ends the worker's start-up.
        snowluma_proto::alloc::after_start();
        sent
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
    // Frames to the supervisor: a reply with no company is written by its
    // request's task at once; the rest by the flusher, batched.
    let outbox = Arc::new(Outbox::new(wr));
    let flusher = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            // The socket itself is broken: the supervisor sees it close,
            // restarts this worker and logs it.
            let e = outbox.flush().await;
            tracing::debug!(error = %e, "IPC write failed; closing the connection");
        }
    });
    let inflight: Arc<Mutex<HashMap<u64, CancellationToken>>> = Arc::default();

    let result = loop {
        let msg = match read_buffered_frame::<_, ToWorker>(&mut rd).await {
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
                if let Some(frame) = frame_or_substitute(reply) {
                    let _ = outbox.send_now(frame);
                }
            }
            ToWorker::Request { id, request } => {
                let cancel = CancellationToken::new();
                let ctx = Ctx { cancel: cancel.clone(), id, out: outbox.clone() };
                let handler = handler.clone();
                let calls = inflight.clone();
                let out = outbox.clone();
                // Started in this turn: an ordinary call's HTTP request is
                // written before the next frame is read, and before the
                // call is entered in the table (no `Cancel` is read before
                // this turn ends; a call over in its first step never is).
                let goes_on = snowluma_proto::eager::spawn_eager(async move {
                    let reply = handler.handle(request, ctx).await;
                    // The only request in flight answers at once; with
                    // others in flight, the replies ready together go out
                    // in one write.
                    let alone = calls.lock().map(|map| map.keys().all(|k| *k == id));
                    if let Some(frame) = frame_or_substitute(FromWorker::Reply { id, reply }) {
                        let _ = if alone.unwrap_or(false) { out.send_now(frame) } else { out.send(frame) };
                    }
                    // Out of the table once its reply is on its way (nothing
                    // is read in between).
                    if let Ok(mut map) = calls.lock() {
                        map.remove(&id);
                    }
                    // Start-up is over once a request has been served (not
                    // at `Configured`, which comes in the middle of the
                    // cold start).
                    snowluma_proto::alloc::after_start();
                });
                if goes_on && let Ok(mut map) = inflight.lock() {
                    map.insert(id, cancel);
                }
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
    flusher.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

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
