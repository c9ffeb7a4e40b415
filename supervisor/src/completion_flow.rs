//! The `*_with_input` tools' flow: every gate the call would meet, then the
//! missing required params asked for (a modern `input_required` result, or
//! legacy `elicitation/create` inside the call), then the call itself. The
//! forms, answers and sealed continuations are `completion.rs`.
//!
//! The same machinery asks for the confirmation of an action the operator
//! listed in `SNOWLUMA_MCP_CONFIRM_ACTIONS` (`confirm.rs`), for
//! `invoke_action` and, once its params are complete, for
//! `invoke_action_with_input`: one more round whose sealed state (marked
//! `confirm`) is bound to the tool and its exact arguments.

use rmcp::model::ProtocolVersion;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::Value;
use snowluma_catalog::Action;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::completion::{self, StateError};
use crate::confirm::{self, Decision};
use crate::execution::{Admission, ProgressSink};
use crate::gates::Entry;
use crate::replies::{call_error_reply, is_modern};
use crate::state::ServerState;
use crate::tools::ToolSpec;
use crate::trace::CallTrace;
use crate::workers::CallError;

/// What a `*_with_input` call answers: a result, or a request for input.
pub(crate) enum Completion {
    Done(ToolReply),
    Ask(rmcp::model::InputRequiredResult),
}

/// Whether this (modern) request's own client capabilities declare form
/// elicitation (`elicitation: {}` or with `form`): input requests are only
/// ever put in a result for a capability the request declared.
fn modern_form(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.meta
        .get("io.modelcontextprotocol/clientCapabilities")
        .and_then(|c| c.get("elicitation"))
        .and_then(Value::as_object)
        .is_some_and(|e| e.is_empty() || e.contains_key("form"))
}

/// Whether a legacy session's client declared form elicitation (and speaks
/// a revision that has it).
fn legacy_form(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.peer.peer_info().is_some_and(|i| i.protocol_version != ProtocolVersion::V_2025_03_26)
        && ctx.peer.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Form)
}

/// Whether this request's client can answer a form (modern: the request
/// declares it; legacy: the session's client did).
pub(crate) fn can_answer_form(ctx: &RequestContext<RoleServer>) -> bool {
    if is_modern(ctx) { modern_form(ctx) } else { legacy_form(ctx) }
}

/// The audit reason of a refused continuation.
fn state_reason(e: &StateError) -> &'static str {
    match e {
        StateError::Tampered => "input_tampered",
        StateError::Expired => "input_expired",
        StateError::Reused => "input_reused",
        StateError::Foreign => "input_foreign",
    }
}

/// The modern `input_required` result asking to confirm `admission`.
fn confirm_required(admission: &Admission, sealed: String) -> rmcp::model::InputRequiredResult {
    use rmcp::model::{ElicitRequest, InputRequest, InputRequests, InputRequiredResult};
    let form = confirm::form(admission.action, &admission.given, &admission.params.to_value());
    let mut requests = InputRequests::new();
    requests.insert(confirm::INPUT_KEY.to_owned(), InputRequest::Elicitation(ElicitRequest::new(form)));
    InputRequiredResult::new(Some(requests), Some(sealed))
}

/// A refused continuation, as the JSON-RPC error the protocol asks for.
pub(crate) fn state_error(e: StateError) -> McpError {
    McpError::invalid_params(e.to_string(), None)
}

/// [`state_error`] for a confirmation's state: an expired or used one names
/// `SNOWLUMA_MCP_CONFIRM_ACTIONS` (same code, -32602).
fn confirm_state_error(action: &Action, e: StateError) -> McpError {
    match confirm::stale_state(action, &e) {
        Some(message) => McpError::invalid_params(message, None),
        None => state_error(e),
    }
}

impl ServerState {
    /// `*_with_input`: admitted like the original tool, then ask for missing
    /// required params (see `completion.rs`), then run the admitted call.
    pub(crate) async fn with_input(
        &self,
        spec: ToolSpec,
        args: Value,
        (responses, state): (Option<rmcp::model::InputResponses>, Option<String>),
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<Completion, McpError> {
        // Every gate the call would meet, before anyone is asked anything;
        // a refusal is the original tool's (a policy refusal audited).
        let admission = match self.admitted(spec, Entry::WithInput, args.clone().into(), trace).await {
            Ok(a) => a,
            Err(refusal) => return Ok(Completion::Done(refusal)),
        };
        let (action, params) = (admission.action, admission.params.to_value());
        let digest = completion::args_digest(spec.name, &args);
        // A confirmation round: the params were complete when it was asked.
        if let Some(sealed) = &state {
            match self.continuations.check(sealed, spec.name, &digest) {
                Ok(st) if st.confirm => {
                    let admission =
                        admission.answered(&self.gate_context(), completion::merged_args(&args, &st.answered));
                    return self
                        .confirm_then_run(spec, admission, digest, st.answered, (responses, state), ctx, trace)
                        .await;
                }
                // An expired or used confirmation names the setting; a state
                // the codec's expiry keeps closed does when the action is
                // one to confirm.
                Err(e @ (StateError::Expired | StateError::Reused))
                    if self.continuations.is_confirmation(sealed, spec.name, &digest).unwrap_or(admission.confirm) =>
                {
                    if responses.as_ref().is_some_and(|r| r.contains_key(confirm::INPUT_KEY)) {
                        self.audit_refusal(spec, &admission.given, action, trace, state_reason(&e), "continuation")
                            .await;
                    }
                    return Err(confirm_state_error(action, e));
                }
                Ok(_) | Err(_) => {}
            }
        }
        if let Some(sealed) = state {
            let response = responses.as_ref().and_then(|r| r.get(completion::INPUT_KEY));
            let Some(response) = response else {
                // A retry without the answer: ask again with the same state.
                let st = self.continuations.check(&sealed, spec.name, &digest).map_err(state_error)?;
                return Ok(Completion::Ask(completion::input_required(action, &st.missing, sealed)));
            };
            let st = match self.continuations.redeem(&sealed, spec.name, &digest) {
                Ok(st) => st,
                Err(e) => {
                    let reason = state_reason(&e);
                    self.audit_refusal(spec, &admission.given, action, trace, reason, "continuation").await;
                    return Err(state_error(e));
                }
            };
            let taken = response.get("action").and_then(Value::as_str).unwrap_or("cancel");
            let mut provided = params.clone();
            if let Some(p) = provided.as_object_mut() {
                p.extend(st.answered.clone());
            }
            let answer = match completion::check_answer(action, &provided, &st.missing, taken, response.get("content"))
            {
                Ok(a) => a,
                Err((reply, reason)) => {
                    self.audit_refusal(spec, &admission.given, action, trace, reason, "continuation").await;
                    return Ok(Completion::Done(reply));
                }
            };
            let mut answered = st.answered;
            answered.extend(answer);
            let remaining: Vec<String> = st.missing.into_iter().filter(|m| !answered.contains_key(m)).collect();
            if !remaining.is_empty() {
                // Asked again only if this request, too, declares form elicitation.
                if !modern_form(ctx) {
                    return Ok(Completion::Done(completion::no_form_support(spec.name, &remaining)));
                }
                return Ok(self.ask_modern(spec, action, digest, remaining, answered));
            }
            let admission = admission.answered(&self.gate_context(), completion::merged_args(&args, &answered));
            let admission = match self.ready(spec, admission, trace).await {
                Ok(a) => a,
                Err(refusal) => return Ok(Completion::Done(refusal)),
            };
            return self.confirm_then_run(spec, admission, digest, answered, (None, None), ctx, trace).await;
        }
        self.first_round(spec, args, admission, digest, ctx, trace).await
    }

    /// The call's first round (no `requestState`): run it if its params are
    /// complete, else ask for the missing ones (modern: `input_required`;
    /// legacy: `elicitation/create` within the call).
    async fn first_round(
        &self,
        spec: ToolSpec,
        args: Value,
        admission: Admission,
        digest: String,
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<Completion, McpError> {
        let (action, params) = (admission.action, admission.params.to_value());
        let mut missing = completion::missing(action, &params);
        if admission.input_file.is_some() {
            // The server sets these itself for an automatic upload.
            missing.retain(|m| !crate::transfers::MCP_OWNED_UPLOAD_FIELDS.contains(&m.as_str()));
        }
        if missing.is_empty() {
            let admission = match self.ready(spec, admission, trace).await {
                Ok(a) => a,
                Err(refusal) => return Ok(Completion::Done(refusal)),
            };
            return self
                .confirm_then_run(spec, admission, digest, serde_json::Map::new(), (None, None), ctx, trace)
                .await;
        }
        if is_modern(ctx) {
            if !modern_form(ctx) {
                return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
            }
            return Ok(self.ask_modern(spec, action, digest, missing, serde_json::Map::new()));
        }
        if !legacy_form(ctx) {
            return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
        }
        let (admission, answered) = match self.ask_legacy(spec, args, admission, missing, ctx, trace).await {
            Ok(done) => done,
            Err(reply) => return Ok(Completion::Done(reply)),
        };
        self.confirm_then_run(spec, admission, digest, answered, (None, None), ctx, trace).await
    }

    /// `invoke_action`: admitted, then run at once, or, for an action the
    /// operator wants confirmed, after the human's confirmation.
    pub(crate) async fn invoke(
        &self,
        spec: ToolSpec,
        args: crate::gates::Args,
        input: (Option<rmcp::model::InputResponses>, Option<String>),
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<Completion, McpError> {
        let admission = match self.admitted(spec, Entry::Call, args.clone(), trace).await {
            Ok(a) => a,
            Err(refusal) => return Ok(Completion::Done(refusal)),
        };
        if !admission.confirm {
            // Only a confirmation issues continuations to this tool.
            if input.1.is_some() {
                return Err(state_error(StateError::Foreign));
            }
            return Ok(Completion::Done(self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
        let digest = completion::args_digest(spec.name, &args.into_value());
        self.confirm_then_run(spec, admission, digest, serde_json::Map::new(), input, ctx, trace).await
    }

    /// Run a call whose params are complete: at once, or after the human
    /// confirmed it (`SNOWLUMA_MCP_CONFIRM_ACTIONS`). A keyed call whose key
    /// already has an outcome is answered with it, unasked. `answered`: the
    /// fields earlier rounds of a `_with_input` call supplied (kept in the
    /// confirmation's state).
    #[allow(clippy::too_many_arguments)]
    async fn confirm_then_run(
        &self,
        spec: ToolSpec,
        mut admission: Admission,
        digest: String,
        answered: serde_json::Map<String, Value>,
        (responses, state): (Option<rmcp::model::InputResponses>, Option<String>),
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<Completion, McpError> {
        if !admission.confirm {
            return Ok(Completion::Done(self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
        let (action, given) = (admission.action, admission.given.clone());
        // A replay executes nothing: it needs no confirmation.
        if let Some(key) = &admission.idempotency_key {
            let key = self.keys.call_key(key, action, &admission.params.to_value());
            match self.keys.peek(&key).await {
                Ok(None) => {}
                Ok(Some(_)) | Err(_) => {
                    // The claim gives the replay (or the refusal) its audit record.
                    admission.confirm = false;
                    return Ok(Completion::Done(
                        self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await,
                    ));
                }
            }
        }
        let decision = if let Some(sealed) = state {
            let response = responses.as_ref().and_then(|r| r.get(confirm::INPUT_KEY));
            let Some(response) = response else {
                // A retry without the answer: ask again with the same state.
                let st = self
                    .continuations
                    .check(&sealed, spec.name, &digest)
                    .map_err(|e| confirm_state_error(action, e))?;
                if !st.confirm {
                    return Err(state_error(StateError::Foreign));
                }
                return Ok(Completion::Ask(confirm_required(&admission, sealed)));
            };
            let st = match self.continuations.redeem(&sealed, spec.name, &digest) {
                Ok(st) if st.confirm => st,
                Ok(_) => return Err(state_error(StateError::Foreign)),
                Err(e) => {
                    self.audit_refusal(spec, &given, action, trace, state_reason(&e), "continuation").await;
                    return Err(confirm_state_error(action, e));
                }
            };
            drop(st);
            let taken = response.get("action").and_then(Value::as_str).unwrap_or("cancel");
            confirm::decide(taken, response.get("content"))
        } else if is_modern(ctx) {
            if !modern_form(ctx) {
                self.audit_refusal(spec, &given, action, trace, "confirmation_unavailable", "action").await;
                return Ok(Completion::Done(confirm::no_form_support(action)));
            }
            let Some(id) = self.continuations.reserve() else {
                return Ok(Completion::Done(completion::too_many()));
            };
            let st = completion::State {
                id: id.clone(),
                tool: spec.name.to_owned(),
                digest,
                missing: Vec::new(),
                answered,
                confirm: true,
            };
            return Ok(match self.continuations.seal(&st) {
                Ok(sealed) => Completion::Ask(confirm_required(&admission, sealed)),
                Err(e) => {
                    self.continuations.release(&id);
                    Completion::Done(ToolReply::fail(
                        FailureKind::Execution,
                        format!("cannot seal the continuation: {e}"),
                    ))
                }
            });
        } else {
            if !legacy_form(ctx) {
                self.audit_refusal(spec, &given, action, trace, "confirmation_unavailable", "action").await;
                return Ok(Completion::Done(confirm::no_form_support(action)));
            }
            match self.ask_confirm_legacy(&admission, ctx).await {
                Ok(d) => d,
                Err(reply) => return Ok(Completion::Done(reply)),
            }
        };
        let op_id = self.audit_confirmation(spec, &given, action, trace, decision).await;
        if decision != Decision::Accepted {
            return Ok(Completion::Done(confirm::refusal(action, decision, "")));
        }
        admission.confirm = false;
        admission.op_id = Some(op_id);
        Ok(Completion::Done(self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await))
    }

    /// A legacy client: one `elicitation/create` within the call, answered
    /// within [`completion::TTL`]. `Err`: the refusal (nothing executed).
    async fn ask_confirm_legacy(
        &self,
        admission: &Admission,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Decision, ToolReply> {
        let Some(slot) = self.continuations.reserve() else {
            return Err(completion::too_many());
        };
        let form = confirm::form(admission.action, &admission.given, &admission.params.to_value());
        let ask = tokio::time::timeout(completion::TTL, ctx.peer.create_elicitation(form));
        let result = tokio::select! {
            r = ask => r,
            _ = ctx.ct.cancelled() => {
                self.continuations.release(&slot);
                return Err(call_error_reply(CallError::Cancelled, false));
            }
        };
        self.continuations.release(&slot);
        Ok(match result {
            Ok(Ok(r)) => {
                let taken = match r.action {
                    rmcp::model::ElicitationAction::Accept => "accept",
                    rmcp::model::ElicitationAction::Decline => "decline",
                    _ => "cancel",
                };
                confirm::decide(taken, r.content.as_ref())
            }
            // Failed (the client answered with an error): not confirmed.
            Ok(Err(_)) => Decision::Cancelled,
            Err(_) => Decision::TimedOut,
        })
    }

    /// A modern `input_required` result for `missing`, or the refusal when
    /// too many are outstanding.
    fn ask_modern(
        &self,
        spec: ToolSpec,
        action: &snowluma_catalog::Action,
        digest: String,
        missing: Vec<String>,
        answered: serde_json::Map<String, Value>,
    ) -> Completion {
        let Some(id) = self.continuations.reserve() else {
            return Completion::Done(completion::too_many());
        };
        let state =
            completion::State { id: id.clone(), tool: spec.name.to_owned(), digest, missing, answered, confirm: false };
        match self.continuations.seal(&state) {
            Ok(sealed) => Completion::Ask(completion::input_required(action, &state.missing, sealed)),
            Err(e) => {
                self.continuations.release(&id);
                Completion::Done(ToolReply::fail(FailureKind::Execution, format!("cannot seal the continuation: {e}")))
            }
        }
    }

    /// A legacy client: `elicitation/create` inside this call, until every
    /// missing field is answered (each answer checked), then the call.
    async fn ask_legacy(
        &self,
        spec: ToolSpec,
        args: Value,
        admission: Admission,
        mut missing: Vec<String>,
        ctx: &RequestContext<RoleServer>,
        trace: &CallTrace,
    ) -> Result<(Admission, serde_json::Map<String, Value>), ToolReply> {
        let Some(slot) = self.continuations.reserve() else {
            return Err(completion::too_many());
        };
        let (action, params) = (admission.action, admission.params.to_value());
        let mut answered = serde_json::Map::new();
        while !missing.is_empty() {
            let ask = ctx.peer.create_elicitation(completion::form(action, &missing));
            let result = tokio::select! {
                r = ask => r,
                _ = ctx.ct.cancelled() => {
                    self.continuations.release(&slot);
                    return Err(call_error_reply(CallError::Cancelled, false));
                }
            };
            let (taken, content) = match result {
                Ok(r) => {
                    let taken = match r.action {
                        rmcp::model::ElicitationAction::Accept => "accept",
                        rmcp::model::ElicitationAction::Decline => "decline",
                        _ => "cancel",
                    };
                    (taken, r.content)
                }
                Err(e) => {
                    self.continuations.release(&slot);
                    return Err(ToolReply::error(
                        Diagnostics::failed(FailureKind::Cancelled, format!("输入请求失败：{e}；未执行任何操作。"))
                            .with_next_step("Call the original tool with complete params."),
                    ));
                }
            };
            let mut provided = params.clone();
            if let Some(p) = provided.as_object_mut() {
                p.extend(answered.clone());
            }
            match completion::check_answer(action, &provided, &missing, taken, content.as_ref()) {
                Ok(a) => answered.extend(a),
                Err((reply, reason)) => {
                    self.continuations.release(&slot);
                    self.audit_refusal(spec, &admission.given, action, trace, reason, "continuation").await;
                    return Err(reply);
                }
            }
            missing.retain(|m| !answered.contains_key(m));
        }
        self.continuations.release(&slot);
        let admission = admission.answered(&self.gate_context(), completion::merged_args(&args, &answered));
        let admission = self.ready(spec, admission, trace).await?;
        Ok((admission, answered))
    }
}
