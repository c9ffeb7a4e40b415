//! Direct calls: a query tool's `tools/call` (`query_action` and its kind)
//! answered from the transport, without rmcp's dispatch.
//!
//! rmcp hands every request to a spawned task of its own with a request
//! context (a child cancellation token, the peer, the extensions moved into
//! a fresh map), and its answer back through a channel to its loop, which
//! then calls our `send`: a sixth to a fifth of the supervisor's CPU per
//! call (README, "Latency and throughput"). A call taken here runs the same
//! `ServerState::exec_call` (every gate, the audit record, the executor),
//! renders with the same `replies::render`, applies what rmcp's handler
//! applies to a legacy peer's result, and is written by the same path as
//! rmcp's answers ([`super::deliver`]). Only a call rmcp would answer in
//! exactly that way is taken; anything else goes to rmcp:
//! - the session began with `initialize`, whose answer negotiated a
//!   version before 2026-07-28 (so rmcp checks nothing per request and
//!   strips the result to the legacy shape);
//! - the request's `_meta` names no protocol version and no progress token
//!   (progress needs rmcp's peer);
//! - the tool is a query tool, the call carries no continuation
//!   (`inputResponses`, `requestState`), and the transport kept its
//!   arguments as text.
//!
//! Cancellation works as under rmcp: a `notifications/cancelled` for a
//! direct call cancels its token, and a call that ends cancelled gets no
//! answer, its log line written at once (rmcp drops a cancelled request's
//! response).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::RoleServer;
use rmcp::model::{ClientRequest, GetMeta, JsonRpcMessage, ServerResult};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use tokio_util::sync::CancellationToken;

use super::fast::RawArguments;
use crate::execution::ProgressSink;
use crate::state::ServerState;
use crate::tools::{self, Handler};
use crate::trace::CallTrace;

/// The server's state, for the calls taken here, and their tokens.
pub(crate) struct Direct {
    state: Arc<ServerState>,
    /// Calls in flight, by request id (as JSON text), each with its number
    /// (a reused id replaces the entry, as in rmcp's own table).
    calls: Mutex<HashMap<String, (u64, CancellationToken)>>,
    next: AtomicU64,
}

/// What a call taken here needs from the transport to be answered
/// (cloned only for a call that is taken).
pub(super) struct Answer<'a> {
    pub(super) out: &'a Arc<super::Out>,
    pub(super) session: &'a Arc<Mutex<super::State>>,
    pub(super) server_info: &'a Arc<serde_json::Value>,
}

impl Direct {
    pub(crate) fn new(state: Arc<ServerState>) -> Arc<Direct> {
        Arc::new(Direct { state, calls: Mutex::new(HashMap::new()), next: AtomicU64::new(0) })
    }

    /// The client cancelled the request `key`: a direct call's token.
    pub(super) fn cancel(&self, key: &str) {
        if let Ok(calls) = self.calls.lock()
            && let Some((_, ct)) = calls.get(key)
        {
            ct.cancel();
        }
    }

    /// Take `msg` when it is a call answered here (it is then running);
    /// give it back otherwise, for rmcp.
    pub(super) fn take(
        self: &Arc<Self>,
        msg: RxJsonRpcMessage<RoleServer>,
        answer: Answer<'_>,
    ) -> Option<RxJsonRpcMessage<RoleServer>> {
        let JsonRpcMessage::Request(r) = &msg else { return Some(msg) };
        let ClientRequest::CallToolRequest(c) = &r.request else { return Some(msg) };
        let p = &c.params;
        let Some(spec) = tools::find(&p.name).filter(|t| t.handler == Handler::Query) else { return Some(msg) };
        if p.input_responses.is_some() || p.request_state.is_some() {
            return Some(msg);
        }
        // rmcp keeps a request's `_meta` in its extensions.
        let meta = r.request.get_meta();
        if meta.protocol_version().is_some() || meta.get_progress_token().is_some() {
            return Some(msg);
        }
        let Some(raw) = c.extensions.get::<RawArguments>().map(|r| r.0.clone()) else { return Some(msg) };
        let started = Instant::now();
        let trace = CallTrace::from_meta(meta);
        let id = r.id.clone();
        let key = super::id_key(&id);
        let ct = CancellationToken::new();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut calls) = self.calls.lock() {
            calls.insert(key.clone(), (n, ct.clone()));
        }
        tracing::debug!(tool = spec.name, "tool call answered directly");
        let direct = self.clone();
        let (out, session, server_info) = (answer.out.clone(), answer.session.clone(), answer.server_info.clone());
        tokio::spawn(async move {
            let reply =
                direct.state.exec_call(spec, crate::gates::Args::Raw(raw), &trace, &ct, ProgressSink::None).await;
            if let Ok(mut calls) = direct.calls.lock()
                && calls.get(&key).is_some_and(|(m, _)| *m == n)
            {
                calls.remove(&key);
            }
            crate::calllog::finished(spec, &trace, &reply, started, &ct);
            if ct.is_cancelled() {
                return;
            }
            let mut result = ServerResult::CallToolResult(crate::replies::render(reply, &trace));
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
            let item: TxJsonRpcMessage<RoleServer> = JsonRpcMessage::response(result, id);
            if let Err(e) = super::deliver(out, session, server_info, None, item).await {
                tracing::warn!(error = %e, "a direct call's answer could not be encoded");
            }
        });
        None
    }
}
