//! Forwarding a worker's progress to `notifications/progress`.
//!
//! At most one notification per 250 ms; values strictly increase; the last
//! pending value is flushed before a successful response; nothing is sent
//! after cancellation or completion, and nothing at all without a progress
//! token (the caller then never creates a forwarder).

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;
use snowluma_proto::Progress;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const MIN_INTERVAL: Duration = Duration::from_millis(250);

pub struct Forwarder {
    tx: Option<mpsc::UnboundedSender<Progress>>,
    finish: Option<oneshot::Sender<bool>>,
    task: JoinHandle<bool>,
}

impl Forwarder {
    pub fn start(peer: Peer<RoleServer>, token: ProgressToken, cancel: CancellationToken) -> Forwarder {
        let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
        let (finish_tx, finish_rx) = oneshot::channel::<bool>();
        let task = tokio::spawn(async move {
            let mut last: Option<f64> = None;
            let mut pending: Option<Progress> = None;
            let mut next_at = tokio::time::Instant::now();
            let mut delivered = true;
            let send = |p: Progress, peer: Peer<RoleServer>, token: ProgressToken| async move {
                let mut n = ProgressNotificationParam::new(token, p.progress);
                if let Some(t) = p.total {
                    n = n.with_total(t);
                }
                peer.notify_progress(n).await.is_ok()
            };
            loop {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some(p) => {
                            let floor = pending.as_ref().map(|q| q.progress).or(last);
                            if floor.is_none_or(|f| p.progress > f) {
                                pending = Some(p);
                            }
                        }
                        None => break,
                    },
                    _ = tokio::time::sleep_until(next_at), if pending.is_some() => {
                        if let Some(p) = pending.take() {
                            last = Some(p.progress);
                            delivered &= send(p, peer.clone(), token.clone()).await;
                            next_at = tokio::time::Instant::now() + MIN_INTERVAL;
                        }
                    }
                    _ = cancel.cancelled() => return delivered,
                }
            }
            // The call finished: flush the last value only on success.
            if finish_rx.await.unwrap_or(false)
                && let Some(p) = pending.take()
                && !cancel.is_cancelled()
            {
                delivered &= send(p, peer, token).await;
            }
            delivered
        });
        Forwarder { tx: Some(tx), finish: Some(finish_tx), task }
    }

    /// The sender to give the worker call.
    pub fn sender(&self) -> Option<mpsc::UnboundedSender<Progress>> {
        self.tx.clone()
    }

    /// Wait until every notification for this call has been written.
    /// Returns false when a notification could not be delivered.
    pub async fn finish(mut self, success: bool) -> bool {
        self.tx.take();
        if let Some(f) = self.finish.take() {
            let _ = f.send(success);
        }
        self.task.await.unwrap_or(false)
    }
}
