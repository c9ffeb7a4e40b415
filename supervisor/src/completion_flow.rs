//! The `*_with_input` tools' flow: every gate the call would meet, then the
//! missing required params asked for (a modern `input_required` result, or
//! legacy `elicitation/create` inside the call), then the call itself. The
//! forms, answers and sealed continuations are `completion.rs`.

use rmcp::model::ProtocolVersion;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::Value;
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};

use crate::completion::{self, StateError};
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

/// A refused continuation, as the JSON-RPC error the protocol asks for.
pub(crate) fn state_error(e: StateError) -> McpError {
    McpError::invalid_params(e.to_string(), None)
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
                    let reason = match e {
                        StateError::Tampered => "input_tampered",
                        StateError::Expired => "input_expired",
                        StateError::Reused => "input_reused",
                        StateError::Foreign => "input_foreign",
                    };
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
            return Ok(Completion::Done(self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
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
            return Ok(Completion::Done(self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await));
        }
        if is_modern(ctx) {
            if !modern_form(ctx) {
                return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
            }
            return Ok(self.ask_modern(spec, action, digest, missing, serde_json::Map::new()));
        }
        let legacy_form = ctx.peer.peer_info().is_some_and(|i| i.protocol_version != ProtocolVersion::V_2025_03_26)
            && ctx.peer.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Form);
        if !legacy_form {
            return Ok(Completion::Done(completion::no_form_support(spec.name, &missing)));
        }
        Ok(Completion::Done(self.ask_legacy(spec, args, admission, missing, ctx, trace).await))
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
        let state = completion::State { id: id.clone(), tool: spec.name.to_owned(), digest, missing, answered };
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
    ) -> ToolReply {
        let Some(slot) = self.continuations.reserve() else {
            return completion::too_many();
        };
        let (action, params) = (admission.action, admission.params.to_value());
        let mut answered = serde_json::Map::new();
        while !missing.is_empty() {
            let ask = ctx.peer.create_elicitation(completion::form(action, &missing));
            let result = tokio::select! {
                r = ask => r,
                _ = ctx.ct.cancelled() => {
                    self.continuations.release(&slot);
                    return call_error_reply(CallError::Cancelled, false);
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
                    return ToolReply::error(
                        Diagnostics::failed(FailureKind::Cancelled, format!("输入请求失败：{e}；未执行任何操作。"))
                            .with_next_step("Call the original tool with complete params."),
                    );
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
                    return reply;
                }
            }
            missing.retain(|m| !answered.contains_key(m));
        }
        self.continuations.release(&slot);
        let admission = admission.answered(&self.gate_context(), completion::merged_args(&args, &answered));
        match self.ready(spec, admission, trace).await {
            Ok(admission) => self.run(spec, admission, trace, &ctx.ct, ProgressSink::client(ctx)).await,
            Err(refusal) => refusal,
        }
    }
}
