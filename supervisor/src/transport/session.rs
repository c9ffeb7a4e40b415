//! The session's budget and its end: every request handed to rmcp is
//! tracked until it is answered or cancelled; while too many (or too large)
//! are in flight, further requests wait in the transport (parked, as text)
//! — but stdin is always read, so that the client's answers to our own
//! requests, cancellations and pings are handled whatever the budget. At
//! stdin's end the session ends once every accepted call is answered; a call
//! waiting for the client's answer is cancelled instead (nobody can answer).

use std::collections::{HashMap, HashSet, VecDeque};

use rmcp::RoleServer;
use rmcp::model::{ErrorCode, ErrorData, JsonRpcMessage, ProtocolVersion, RequestId, ServerResult};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::Value;

use super::Input;
use super::envelope::Peek;

/// Most requests in flight at once per session; further ones wait (parked)
/// until one is answered.
pub const MAX_IN_FLIGHT: usize = 256;
/// Most memory that requests in flight may take at once per session, as
/// estimated before each is parsed (`envelope::parse`: forwarded text at
/// its copies, parsed JSON at `VALUE_BYTES` a value).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// Most requests waiting for a place among those in flight, and their
/// text's size; a request beyond either is answered with an error at once.
pub const MAX_PARKED: usize = 256;
pub const MAX_PARKED_BYTES: usize = 32 * 1024 * 1024;
/// The JSON-RPC error of a request beyond [`MAX_PARKED`].
pub const BUSY: i64 = -32000;

/// The key (JSON text) a request id is accounted under: the id as rmcp
/// reads it (an integer written as a float, `1.0` or `1e2`, is that
/// integer), so that the answer, which carries rmcp's id, finds it
/// ([`super::id_key`]); an id rmcp cannot read, as written.
pub(super) fn key(id: &Value) -> String {
    match <RequestId as serde::Deserialize>::deserialize(id) {
        Ok(rid) => super::id_key(&rid),
        Err(_) => id.to_string(),
    }
}

/// A request read while the budget was used, kept as its text.
pub(super) struct Parked {
    /// Its id, as JSON text.
    key: String,
    pub(super) line: Vec<u8>,
}

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
    /// Requests read while over budget, oldest first.
    parked: VecDeque<Parked>,
    /// Sum of the parked requests' sizes.
    parked_bytes: usize,
    /// Requests this server sent to the client and the client has not
    /// answered, by id (as JSON text). At stdin's end each gets an error
    /// answer, which cancels the call waiting for it.
    asked: HashMap<String, RequestId>,
    /// stdin has ended.
    pub(super) eof: bool,
    /// Whether any answer has been written yet.
    answered_any: bool,
    /// The session began with `initialize`, and its answer (the first one
    /// written) negotiated a version of the legacy shape: direct calls may
    /// be taken ([`super::direct`]).
    legacy: bool,
}

/// What to do with a request that arrives while the budget is used.
pub(super) enum Wait {
    /// Handed to rmcp now (a ping, or there is room).
    Now,
    /// Kept until a place frees up.
    Parked,
    /// No room to keep it: answer it with [`BUSY`].
    Refused,
}

/// What [`State::admit`] decided about a message.
pub(super) enum Admission {
    /// A notification or response before the session started: rmcp would
    /// end the session, so it is dropped.
    Early,
    /// Handed to rmcp. `cancelled`: it withdrew a request in flight.
    Pass { cancelled: bool },
    /// A cancellation of a request still parked: that request is dropped
    /// (it never reached rmcp), and so is the cancellation.
    Withdrawn,
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

    /// Where a message just read goes. Only requests wait, never a ping
    /// (answered at once) nor responses and notifications (the client's
    /// answers and cancellations); once requests wait, later ones queue
    /// behind them, in order.
    pub(super) fn place(&mut self, peek: &Peek, line: &[u8]) -> Wait {
        let waits = peek.is_request() && peek.method.as_deref() != Some("ping");
        if !waits || (self.parked.is_empty() && !self.over_budget()) {
            return Wait::Now;
        }
        if self.parked.len() >= MAX_PARKED || self.parked_bytes + line.len() > MAX_PARKED_BYTES {
            return Wait::Refused;
        }
        let key = peek.id.as_ref().map(key).unwrap_or_default();
        self.parked_bytes += line.len();
        self.parked.push_back(Parked { key, line: line.to_vec() });
        Wait::Parked
    }

    /// The oldest parked request, once there is room for it.
    pub(super) fn unpark(&mut self) -> Option<Parked> {
        if self.over_budget() {
            return None;
        }
        let p = self.parked.pop_front()?;
        self.parked_bytes -= p.line.len();
        Some(p)
    }

    pub(super) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// This server sent the client a request.
    pub(super) fn asking(&mut self, id: &RequestId) {
        self.asked.insert(super::id_key(id), id.clone());
    }

    /// One request of ours the client can no longer answer (stdin ended).
    fn unanswerable(&mut self) -> Option<RequestId> {
        let key = self.asked.keys().next()?.clone();
        self.asked.remove(&key)
    }

    /// Account for a message about to be handed to rmcp; `len` is its cost
    /// (the memory it takes while in flight).
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
                self.modern.insert(key(id));
            }
        } else if is_request {
            if let Some(id) = &peek.id {
                let key = key(id);
                self.accepted_bytes += len;
                if peek.is_modern() {
                    self.modern.insert(key.clone());
                }
                if let Some(old) = self.accepted.insert(key, len) {
                    // A duplicate id: the older entry is replaced.
                    self.accepted_bytes -= old;
                }
            }
        } else if let Some(rid) = peek.cancelled_request() {
            // A cancelled request gets no reply: nothing to wait for. One
            // still parked never reaches rmcp.
            let key = key(rid);
            self.modern.remove(&key);
            self.unaccept(&key);
            if let Some(i) = self.parked.iter().position(|p| p.key == key) {
                let p = self.parked.remove(i);
                self.parked_bytes -= p.map(|p| p.line.len()).unwrap_or(0);
                return Admission::Withdrawn;
            }
            return Admission::Pass { cancelled: true };
        } else if peek.method.is_none()
            && let Some(id) = &peek.id
        {
            // The client's answer to one of our requests.
            self.asked.remove(&key(id));
        }
        Admission::Pass { cancelled: false }
    }

    /// [`Self::admit`] for a direct call (`direct.rs`): a request of a
    /// legacy session (so begun, and not modern), under `key`, its id's
    /// key as [`key`] makes it.
    pub(super) fn admit_call(&mut self, key: String, len: usize) {
        self.accepted_bytes += len;
        if let Some(old) = self.accepted.insert(key, len) {
            // A duplicate id: the older entry is replaced.
            self.accepted_bytes -= old;
        }
    }

    /// An answer of ours is about to be written: the first one, when it is
    /// `initialize`'s, decides whether the session is a legacy one.
    pub(super) fn responded(&mut self, item: &TxJsonRpcMessage<RoleServer>) {
        if self.answered_any {
            return;
        }
        let JsonRpcMessage::Response(r) = item else { return };
        self.answered_any = true;
        if let ServerResult::InitializeResult(init) = &r.result {
            self.legacy = init.protocol_version < ProtocolVersion::V_2026_07_28;
        }
    }

    /// Whether direct calls may be taken ([`State::responded`]).
    pub(super) fn legacy_session(&self) -> bool {
        self.legacy
    }

    /// How many of the client's requests are in flight (accepted, not yet
    /// answered or cancelled).
    pub(super) fn in_flight(&self) -> usize {
        self.accepted.len()
    }

    /// The request with this id (as JSON text) is answered; whether it was
    /// a modern one.
    pub(super) fn answered(&mut self, key: &str) -> bool {
        self.unaccept(key);
        self.modern.remove(key)
    }
}

impl Input {
    /// stdin has ended. Requests still parked are handed to rmcp as places
    /// free up, and every request accepted is still answered: the session
    /// ends (this returns `None`) only once none is outstanding, each within
    /// its own timeout, or when stdout is gone. Our own requests to the
    /// client (an `elicitation/create`) can no longer be answered: each gets
    /// an error answer, which ends the call waiting for it. A SIGTERM still
    /// ends the process at once.
    pub(super) async fn drain_at_eof(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Register before checking, so an answer in between is not missed.
            let answered = self.out.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if self.out.is_gone() {
                return None;
            }
            let (unanswerable, parked, outstanding) = match self.state.lock() {
                Ok(mut s) => {
                    s.eof = true;
                    (s.unanswerable(), s.unpark(), s.accepted.len() + s.parked.len())
                }
                Err(_) => (None, None, 0),
            };
            if let Some(id) = unanswerable {
                tracing::debug!(
                    "stdin ended; a request to the client gets no answer: cancelling the call waiting for it"
                );
                return Some(JsonRpcMessage::error(
                    ErrorData::new(ErrorCode(BUSY as i32), "stdin ended: the client can no longer answer", None),
                    Some(id),
                ));
            }
            if let Some(p) = parked
                && let Some(msg) = self.handle_line(&p.line)
            {
                return Some(msg);
            }
            if outstanding == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A request is accounted under its id as rmcp reads it, so that its
    /// answer (which carries rmcp's id) and a cancellation naming it in
    /// another form both find it: an id written `1.0` once left the
    /// session waiting for it forever at stdin's end.
    #[test]
    fn ids_are_keyed_as_rmcp_reads_them() {
        let peek = |line: &'static str| match super::super::envelope::peek(line.as_bytes()) {
            Ok(p) => p,
            Err(_) => panic!("a valid envelope: {line}"),
        };
        let mut st = State { lifecycle_started: true, ..State::default() };
        for line in [
            r#"{"jsonrpc":"2.0","id":1.0,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":2e0,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":"\u0061","method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        ] {
            assert!(matches!(st.admit(&peek(line), 10), Admission::Pass { cancelled: false }));
        }
        assert_eq!(st.in_flight(), 4);
        for id in [RequestId::Number(1), RequestId::Number(2), RequestId::String("a".into())] {
            st.answered(&super::super::id_key(&id));
        }
        assert_eq!(st.in_flight(), 1, "answered under rmcp's form of their ids");
        let cancel = peek(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3.0}}"#);
        assert!(matches!(st.admit(&cancel, 0), Admission::Pass { cancelled: true }));
        assert_eq!((st.in_flight(), st.accepted_bytes), (0, 0), "cancelled under another form of its id");
        assert_eq!(key(&serde_json::json!(1.5)), "1.5", "an id rmcp cannot read stays as written");
    }
}
