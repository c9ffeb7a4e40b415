//! The session's budget and its end: every request handed to rmcp is
//! tracked until it is answered or cancelled; while too many (or too large)
//! are in flight no further message is read; at stdin's end the session
//! ends only once every accepted call is answered.

use std::collections::{HashMap, HashSet};

use rmcp::RoleServer;
use rmcp::service::RxJsonRpcMessage;

use super::LineTransport;
use super::envelope::Peek;

/// Most requests in flight at once per session; the next is read only once
/// one is answered.
pub const MAX_IN_FLIGHT: usize = 256;
/// Most bytes of requests in flight at once per session (the request text;
/// the parsed form takes a few times that).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;

#[derive(Default)]
pub(super) struct State {
    lifecycle_started: bool,
    /// Ids (as JSON text) of in-flight modern requests.
    modern: HashSet<String>,
    /// Ids (as JSON text) of every request handed to rmcp and not yet
    /// answered (or cancelled by the client): at stdin's end the session
    /// waits for these, so that no accepted call loses its reply. The value
    /// is the request's size in bytes.
    accepted: HashMap<String, usize>,
    /// Sum of the sizes in `accepted`.
    accepted_bytes: usize,
}

/// What [`State::admit`] decided about a message.
pub(super) enum Admission {
    /// A notification or response before the session started: rmcp would
    /// end the session, so it is dropped.
    Early,
    /// Handed to rmcp. `cancelled`: it withdrew a request in flight.
    Pass { cancelled: bool },
}

impl State {
    fn unaccept(&mut self, key: &str) {
        if let Some(n) = self.accepted.remove(key) {
            self.accepted_bytes -= n;
        }
    }

    /// Whether the calls in flight already use the session's budget: then
    /// no further message is read until some are answered (the client's
    /// writes wait), which bounds the memory pipelined calls can take.
    fn over_budget(&self) -> bool {
        self.accepted.len() >= MAX_IN_FLIGHT || self.accepted_bytes >= MAX_IN_FLIGHT_BYTES
    }

    /// Account for a message about to be handed to rmcp; `len` is its size.
    pub(super) fn admit(&mut self, peek: &Peek, len: usize) -> Admission {
        let is_request = peek.is_request();
        if !self.lifecycle_started {
            if !is_request {
                return Admission::Early;
            }
            if peek.starts_lifecycle() {
                self.lifecycle_started = true;
            }
        }
        // A `subscriptions/listen` stream stays open until the client
        // cancels it or the session ends: it is neither a call in flight
        // for the budget nor one the end of stdin waits for (rmcp ends it
        // when the session ends).
        let listen = peek.method.as_deref() == Some("subscriptions/listen");
        if is_request && listen {
            if let Some(id) = &peek.id
                && peek.is_modern()
            {
                self.modern.insert(id.to_string());
            }
        } else if is_request {
            if let Some(id) = &peek.id {
                let key = id.to_string();
                self.accepted_bytes += len;
                if let Some(old) = self.accepted.insert(key, len) {
                    // A duplicate id: the older entry is replaced.
                    self.accepted_bytes -= old;
                }
                if peek.is_modern() {
                    self.modern.insert(id.to_string());
                }
            }
        } else if let Some(rid) = peek.cancelled_request() {
            // A cancelled request gets no reply: nothing to wait for.
            self.modern.remove(&rid.to_string());
            self.unaccept(&rid.to_string());
            return Admission::Pass { cancelled: true };
        }
        Admission::Pass { cancelled: false }
    }

    /// The request with this id (as JSON text) is answered; whether it was
    /// a modern one.
    pub(super) fn answered(&mut self, key: &str) -> bool {
        self.unaccept(key);
        self.modern.remove(key)
    }
}

impl LineTransport {
    /// Wait until the calls in flight are within the session's budget
    /// ([`MAX_IN_FLIGHT`], [`MAX_IN_FLIGHT_BYTES`]). Cancel-safe.
    pub(super) async fn wait_for_budget(&self) {
        let mut logged = false;
        loop {
            let answered = self.out.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if !self.state.lock().map(|s| s.over_budget()).unwrap_or(false) || self.out.is_gone() {
                return;
            }
            if !logged {
                tracing::debug!("calls in flight at the session's limit; reading stdin again once one is answered");
                logged = true;
            }
            tokio::select! {
                () = answered => {}
                () = self.out.gone_notify.notified() => {
                    // Leave the permit for `receive`, which ends the session.
                    self.out.gone_notify.notify_one();
                    return;
                }
            }
        }
    }

    /// stdin has ended. Every request already handed to rmcp is still
    /// answered: the session ends (this returns `None`) only once none is
    /// outstanding, each within its own timeout, or when stdout is gone. A
    /// SIGTERM still ends the process at once.
    pub(super) async fn drain_at_eof(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Register before checking, so an answer in between is not missed.
            let answered = self.out.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            let outstanding = self.state.lock().map(|s| s.accepted.len()).unwrap_or(0);
            if outstanding == 0 || self.out.is_gone() {
                return None;
            }
            if !self.eof_logged {
                tracing::info!(calls = outstanding, "stdin ended; finishing the calls in flight");
                self.eof_logged = true;
            }
            tokio::select! {
                () = answered => {}
                () = self.out.gone_notify.notified() => return None,
            }
        }
    }
}
