//! The execution path of `query_action`, `invoke_action`, their
//! `_with_input` and background forms: [`gates::admit`], the audit records,
//! then the request to the network executor (or a file transfer), with
//! progress sent where the call asked for it.

use std::sync::Arc;
use std::time::Instant;

use rmcp::RoleServer;
use snowluma_catalog::{Action, FileTransfer};
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, FileAction, JsonText, Request, ToolReply, TraceContext};
use tokio_util::sync::CancellationToken;

use crate::audit::{ActionRecord, ActionRef, AuditLog, ToolRef};
use crate::gates;
use crate::idempotency::Claim;
use crate::replies::tool_reply;
use crate::state::ServerState;
use crate::tools::ToolSpec;
use crate::trace::{CallTrace, hex};
use crate::workers::{NotSent, Sent, WorkerSlot};

/// A call the gates admitted, on this server's network executor.
pub(crate) type Admission = gates::Admission<Arc<WorkerSlot>>;

/// Where a call's progress notifications go.
pub(crate) enum ProgressSink {
    /// Nowhere: the client sent no progress token, or nobody listens.
    None,
    /// To the client, as `notifications/progress` for its token.
    Client(rmcp::service::Peer<RoleServer>, rmcp::model::ProgressToken),
    /// To a background task's record (what `tasks/get` shows).
    Task(tokio::sync::mpsc::UnboundedSender<snowluma_proto::Progress>),
}

impl ProgressSink {
    /// The client's sink when this request carries a progress token.
    pub(crate) fn client(ctx: &rmcp::service::RequestContext<RoleServer>) -> ProgressSink {
        match ctx.meta.get_progress_token() {
            Some(token) => ProgressSink::Client(ctx.peer.clone(), token),
            None => ProgressSink::None,
        }
    }
}

impl ServerState {
    /// Run a read-only action for the runtime overview, through the same
    /// gates as `query_action`.
    pub async fn query(&self, action: &str, trace: &CallTrace, cancel: &CancellationToken) -> ToolReply {
        let args = serde_json::json!({"action": action, "params": {}});
        self.exec_call(crate::tools::QUERY_ACTION, args, trace, cancel, ProgressSink::None).await
    }

    /// A documentation tool: its arguments go to the catalog worker as the
    /// client's text (never parsed here).
    pub(crate) async fn doc_call(&self, tool: &str, args: gates::Args, cancel: &CancellationToken) -> ToolReply {
        let args = match args {
            gates::Args::Raw(raw) => JsonText(raw.get().to_owned()),
            gates::Args::Value(v) => JsonText::from_value(&v),
        };
        let req = Request::CatalogTool { tool: tool.to_owned(), args };
        tool_reply("the catalog worker", self.workers.catalog.call(req, cancel, None).await, false)
    }

    /// `query_action` / `invoke_action`: [`gates::admit`], then the call
    /// run on its admission ([`Self::run`]). Progress goes to `progress`:
    /// the client, a background task's record, or nowhere.
    pub(crate) async fn exec_call(
        &self,
        spec: ToolSpec,
        args: impl Into<gates::Args>,
        trace: &CallTrace,
        cancel: &CancellationToken,
        progress: ProgressSink,
    ) -> ToolReply {
        match self.admitted(spec, gates::Entry::Call, args.into(), trace).await {
            Ok(admission) => self.run(spec, admission, trace, cancel, progress).await,
            Err(refusal) => refusal,
        }
    }

    /// A direct call's first steps, taken in the caller's turn (its line
    /// was just read): the gates, and, for a call with nothing around its
    /// request (no audit log, idempotency key or transfer), the pacing
    /// charged and the request sent to the network executor: the steps of
    /// [`Self::run`] for such a call, without its awaits. What is left is
    /// awaited with [`Begun::finish`], or, for [`Begun::Sent`], handed to a
    /// function with `Sent::then` and [`sent_reply`] (the transport's
    /// direct calls).
    pub(crate) fn begin(&self, spec: ToolSpec, args: gates::ExecArgs, trace: &CallTrace) -> Begun {
        let admission = match gates::admit_args(&self.gate_context(), spec, gates::Entry::Call, args) {
            Ok(a) => a,
            Err(refused) => return Begun::Refused(refused),
        };
        if self.audit.is_some() || admission.idempotency_key.is_some() || !matches!(admission.transfer, Ok(None)) {
            return Begun::Admitted(Box::new(admission));
        }
        let gates::Admission { network, action, given, params, .. } = admission;
        // No audit log: a pacing refusal has no record to write.
        if let Err(limited) = self.pacer.gate(action, &params, true) {
            return Begun::Done(limited.reply(action.name));
        }
        let exec = exec_request(given, action, &params, trace, &ProgressSink::None);
        match network.send(Request::Execute(exec)) {
            Ok(sent) => Begun::Sent { sent, action },
            Err(NotSent::NotLive(request)) => Begun::Waiting { network, request, action },
            Err(NotSent::Failed(e)) => Begun::Done(tool_reply("the network executor", Err(e), !action.read_only)),
        }
    }

    /// What the gates see of this server.
    pub(crate) fn gate_context(&self) -> gates::Context<'_, Arc<WorkerSlot>> {
        gates::Context {
            mode: self.config.mode,
            network: self.workers.network.as_ref(),
            catalog: self.catalog,
            policy: &self.policy,
            transfers: self.transfers.as_deref(),
            scope: &self.scope,
            pacer: &self.pacer,
        }
    }

    /// [`gates::Admission::ready`] for a `_with_input` call about to run:
    /// its refusal (scope, pacing) is audited like the gates'.
    pub(crate) async fn ready(
        &self,
        spec: ToolSpec,
        admission: Admission,
        trace: &CallTrace,
    ) -> Result<Admission, ToolReply> {
        match admission.ready(&self.gate_context()) {
            Ok(admission) => Ok(admission),
            Err(refused) => Err(self.refusal(spec, refused, trace).await),
        }
    }

    /// [`gates::admit`] for this server; a refusal the audit log records
    /// (the operator's policy) is recorded here.
    pub(crate) async fn admitted(
        &self,
        spec: ToolSpec,
        entry: gates::Entry,
        args: gates::Args,
        trace: &CallTrace,
    ) -> Result<Admission, ToolReply> {
        match gates::admit(&self.gate_context(), spec, entry, args) {
            Ok(admission) => Ok(admission),
            Err(refused) => Err(self.refusal(spec, refused, trace).await),
        }
    }

    /// A gate's refusal as the client gets it, audited when it is one the
    /// audit log records (the policy's and the safety gates').
    async fn refusal(&self, spec: ToolSpec, refused: gates::Refused, trace: &CallTrace) -> ToolReply {
        if let (Some(reason), Some(audited)) = (refused.audit_reason(), &refused.audited) {
            let (given, action) = &**audited;
            self.audit_refusal(spec, given, action, trace, reason, "action").await;
        }
        refused.reply
    }

    /// An admitted call: the transfer plan's refusal if it failed, else the
    /// audit intent, the request (or transfer) and the audit result.
    pub(crate) async fn run(
        &self,
        spec: ToolSpec,
        admission: Admission,
        trace: &CallTrace,
        cancel: &CancellationToken,
        progress: ProgressSink,
    ) -> ToolReply {
        let tool = spec.name;
        let gates::Admission { network, action, given, params, transfer, idempotency_key, op_id, .. } = admission;
        let transfer = match transfer {
            Ok(t) => t,
            Err(refusal) => return refusal,
        };
        // A keyed call: the recorded reply of the key, or the right to run
        // it (held until its outcome is recorded; see `idempotency.rs`).
        let mut keyed = None;
        if let Some(key) = &idempotency_key {
            let key = self.keys.call_key(key, action, &params.to_value());
            // Rare paths are boxed: the hot path's future stays small.
            match Box::pin(self.keys.claim(key, cancel)).await {
                Ok(Claim::Run(running)) => keyed = Some(running),
                Ok(Claim::Replay(reply)) => {
                    Box::pin(self.audit_replay(spec, &given, action, trace, &reply, op_id)).await;
                    return reply;
                }
                Err(reply) => {
                    // Refused before anything was sent (a cancelled wait is no refusal).
                    let reason = match reply.diagnostics.kind {
                        Some(FailureKind::IdempotencyConflict) => Some("idempotency_conflict"),
                        Some(FailureKind::IdempotencyUnavailable) => Some("idempotency_unavailable"),
                        _ => None,
                    };
                    if let Some(reason) = reason {
                        Box::pin(self.audit_refusal(spec, &given, action, trace, reason, "key")).await;
                    }
                    return reply;
                }
            }
        }
        // From here on the call will be sent (a replay, a conflict and a
        // confirmation round have all returned above): its send is charged
        // to the pacing now, so that replays and the rounds of a
        // confirmation or of input completion never count as sends.
        if let Err(limited) = self.pacer.gate(action, &params, true) {
            Box::pin(self.audit_refusal(spec, &given, action, trace, "rate_limited", "action")).await;
            return limited.reply(action.name);
        }
        // What the audit records say about this action (only when auditing).
        let audit = self.audit.as_ref().map(|log| (log, self.action_ref_with(spec, &given, action, trace, op_id)));
        // Nothing leaves without its intent record once auditing is on.
        if let Some((log, about)) = &audit
            && let Err(refusal) = Box::pin(write_intent(log, about, &params)).await
        {
            return refusal;
        }
        let started = Instant::now();
        // The key's pending record, before anything is sent.
        if let Some(running) = &mut keyed
            && let Err(reply) = Box::pin(running.begin()).await
        {
            if let Some((log, about)) = audit {
                Box::pin(record_result(log, about, &reply, started)).await;
            }
            return reply;
        }
        let exec = exec_request(given, action, &params, trace, &progress);
        let (forwarder, progress_tx) = match progress {
            ProgressSink::Client(peer, token) if action.stream => {
                let f = crate::progress::Forwarder::start(peer, token, cancel.clone());
                let tx = f.sender();
                (Some(f), tx)
            }
            ProgressSink::Task(tx) => (None, Some(tx)),
            ProgressSink::Client(..) | ProgressSink::None => (None, None),
        };
        let mut reply = match (transfer, &self.transfers) {
            (Some(plan), Some(service)) => Box::pin(service.clone().run(plan, exec, cancel.clone(), progress_tx)).await,
            _ => tool_reply(
                "the network executor",
                network.call(Request::Execute(exec), cancel, progress_tx).await,
                !action.read_only,
            ),
        };
        if let Some(f) = forwarder {
            Box::pin(finish_progress(f, &mut reply, cancel, tool)).await;
        }
        // Message ids an in-scope send or history read names are in scope.
        self.scope.learn_from_result(action, &reply);
        if let Some(running) = keyed {
            Box::pin(running.finish(&reply)).await;
        }
        if let Some((log, about)) = audit {
            Box::pin(record_result(log, about, &reply, started)).await;
        }
        reply
    }

    /// What every audit record of one action says about it.
    fn action_ref(&self, spec: ToolSpec, given: &str, action: &Action, trace: &CallTrace) -> ActionRef {
        self.action_ref_with(spec, given, action, trace, None)
    }

    /// [`Self::action_ref`] with the `op_id` of an earlier record of the same
    /// operation (an accepted confirmation), else a new one.
    pub(crate) fn action_ref_with(
        &self,
        spec: ToolSpec,
        given: &str,
        action: &Action,
        trace: &CallTrace,
        op_id: Option<String>,
    ) -> ActionRef {
        ActionRef {
            op_id: op_id.unwrap_or_else(|| hex(&crate::trace::random_bytes::<16>())),
            tool: spec.name.to_owned(),
            action: given.to_owned(),
            canonical: action.name.to_owned(),
            read_only: action.read_only,
            mode: self.config.mode.as_str(),
            traceparent: trace.traceparent.clone(),
        }
    }

    /// A `refused` audit record: a gate's refusal (policy, scope, pacing;
    /// `what`: "action"), or a
    /// continuation that executes nothing ("continuation"). `given`: the
    /// action as the caller wrote it.
    pub(crate) async fn audit_refusal(
        &self,
        spec: ToolSpec,
        given: &str,
        action: &Action,
        trace: &CallTrace,
        reason: &'static str,
        what: &str,
    ) {
        let Some(log) = &self.audit else { return };
        let about = self.action_ref(spec, given, action, trace);
        if let Err(e) = log.record(ActionRecord::Refused { action: about, reason }).await {
            tracing::error!(error = %e, "cannot write an audit record for a refused {what}");
        }
    }

    /// A `refused` audit record for a tool call that names no action
    /// (`subscribe_events` refused by the target scope): the tool, never
    /// the ids it named.
    pub(crate) async fn audit_tool_refusal(&self, spec: ToolSpec, trace: &CallTrace, reason: &'static str) {
        let Some(log) = &self.audit else { return };
        let tool = ToolRef {
            op_id: hex(&crate::trace::random_bytes::<16>()),
            tool: spec.name.to_owned(),
            mode: self.config.mode.as_str(),
            traceparent: trace.traceparent.clone(),
        };
        if let Err(e) = log.record(ActionRecord::RefusedTool { tool, reason }).await {
            tracing::error!(error = %e, "cannot write an audit record for a refused {}", spec.name);
        }
    }
}

impl ServerState {
    /// A `replayed` audit record: a keyed call answered from its record.
    async fn audit_replay(
        &self,
        spec: ToolSpec,
        given: &str,
        action: &Action,
        trace: &CallTrace,
        reply: &ToolReply,
        op_id: Option<String>,
    ) {
        let Some(log) = &self.audit else { return };
        let about = self.action_ref_with(spec, given, action, trace, op_id);
        let rec = ActionRecord::Replayed { action: about, outcome: reply.diagnostics.outcome.as_str() };
        if let Err(e) = log.record(rec).await {
            tracing::error!(error = %e, "cannot write an audit record for a replayed call");
        }
    }

    /// A `confirmation` audit record (before the intent record); the
    /// operation's `op_id`, which the intent and result records then share.
    pub(crate) async fn audit_confirmation(
        &self,
        spec: ToolSpec,
        given: &str,
        action: &Action,
        trace: &CallTrace,
        decision: crate::confirm::Decision,
    ) -> String {
        let about = self.action_ref(spec, given, action, trace);
        let op_id = about.op_id.clone();
        if let Some(log) = &self.audit {
            let rec = ActionRecord::Confirmation { action: about, decision: decision.as_str() };
            if let Err(e) = log.record(rec).await {
                tracing::error!(error = %e, "cannot write the audit record of a confirmation");
            }
        }
        op_id
    }
}

/// Where a direct call stands after [`ServerState::begin`].
pub(crate) enum Begun {
    /// Its request is with the network executor.
    Sent { sent: Sent, action: &'static Action },
    /// Its request waits for a network executor (one is starting).
    Waiting { network: Arc<WorkerSlot>, request: Box<Request>, action: &'static Action },
    /// Answered already (a pacing refusal, a request that could not go).
    Done(ToolReply),
    /// Refused by a gate (audited, when the audit log records it, by
    /// [`Begun::finish`]).
    Refused(gates::Refused),
    /// Admitted, with an audit record, key or transfer around its request:
    /// run whole by [`ServerState::run`].
    Admitted(Box<Admission>),
}

impl Begun {
    /// The call's reply, once what it started is done: the same reply as
    /// [`ServerState::exec_call`]'s for the same call.
    pub(crate) async fn finish(
        self,
        state: &ServerState,
        spec: ToolSpec,
        trace: &CallTrace,
        cancel: &CancellationToken,
    ) -> ToolReply {
        let (result, action) = match self {
            Begun::Sent { sent, action } => (sent.reply(cancel).await, action),
            Begun::Waiting { network, request, action } => (network.call(*request, cancel, None).await, action),
            Begun::Done(reply) => return reply,
            Begun::Refused(refused) => return Box::pin(state.refusal(spec, refused, trace)).await,
            Begun::Admitted(admission) => {
                return Box::pin(state.run(spec, *admission, trace, cancel, ProgressSink::None)).await;
            }
        };
        sent_reply(state, action, result)
    }
}

/// The reply of a call of `action` whose request went to the network
/// executor alone ([`Begun::Sent`], [`Begun::Waiting`]), from the worker's
/// answer: [`Begun::finish`]'s, and a direct call's that is handed its
/// worker's answer where it is read ([`crate::workers::Sent::then`]).
pub(crate) fn sent_reply(
    state: &ServerState,
    action: &Action,
    result: Result<snowluma_proto::Reply, crate::workers::CallError>,
) -> ToolReply {
    let reply = tool_reply("the network executor", result, !action.read_only);
    // Message ids an in-scope send or history read names are in scope.
    state.scope.learn_from_result(action, &reply);
    reply
}

/// The intent record, before anything is sent: a failed write refuses the
/// action (nothing leaves without it).
async fn write_intent(log: &AuditLog, about: &ActionRef, params: &gates::Params) -> Result<(), ToolReply> {
    let rec = ActionRecord::Intent { action: about.clone(), params_digest: log.params_digest(&params.to_value()) };
    log.record(rec).await.map_err(|e| {
        tracing::error!(error = %e, "audit intent not written; action refused");
        ToolReply::error(
            Diagnostics::failed(FailureKind::AuditFailed, format!("无法写入审计日志，action 未执行：{e}"))
                .with_next_step("The operator must repair SNOWLUMA_MCP_AUDIT_LOG (see `snowluma-mcp audit verify`)."),
        )
    })
}

/// The request the network executor gets for an admitted call.
fn exec_request(
    given: String,
    action: &Action,
    params: &gates::Params,
    trace: &CallTrace,
    progress: &ProgressSink,
) -> ExecRequest {
    ExecRequest {
        action: given,
        params: params.json_text(),
        stream: action.stream,
        write: !action.read_only,
        trace: TraceContext { traceparent: trace.traceparent.clone(), tracestate: trace.tracestate.clone() },
        transfer: None,
        progress: !matches!(progress, ProgressSink::None) && action.stream,
        file_action: action.transfer.map(|t| match t {
            FileTransfer::Upload => FileAction::Upload,
            FileTransfer::Download => FileAction::Download,
        }),
    }
}

/// End a call's progress forwarding; a successful reply whose progress
/// notifications did not all arrive says so in its message.
async fn finish_progress(f: crate::progress::Forwarder, reply: &mut ToolReply, cancel: &CancellationToken, tool: &str) {
    let success = !reply.is_error && !cancel.is_cancelled();
    if !f.finish(success).await && !reply.is_error {
        tracing::warn!(tool, "progress notifications could not be delivered");
        let note = "some progress notifications could not be delivered";
        reply.diagnostics.message = Some(match reply.diagnostics.message.take() {
            Some(m) => format!("{m}; {note}"),
            None => note.to_owned(),
        });
    }
}

/// The `result` audit record of an action that ran.
async fn record_result(log: &AuditLog, about: ActionRef, reply: &ToolReply, started: Instant) {
    // The retcode as the reply's builder read it: the result is not parsed here.
    let rec = ActionRecord::Result {
        action: about,
        outcome: reply.diagnostics.outcome.as_str(),
        kind: reply.diagnostics.kind.map(|k| k.as_str()),
        is_error: reply.is_error,
        retcode: reply.retcode_value(),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
    };
    if let Err(e) = log.record(rec).await {
        // The action already ran; its intent is on record. Say so loudly.
        tracing::error!(error = %e, "audit result record not written (the intent record stands)");
    }
}
