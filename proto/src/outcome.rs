//! The envelope every completed tool call returns:
//! `{"result": <payload or null>, "diagnostics": {"outcome", "kind"?, "message"?, "next_step"?}}`.
//!
//! These types cross the IPC boundary, so they avoid `skip_serializing_if`
//! (postcard is positional); [`Diagnostics::to_json`] renders the MCP form.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::msg::JsonText;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Success,
    Failed,
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Unknown => "unknown",
        }
    }
}

/// Known causes of failure. Unclassified errors are `Execution`; nothing is
/// guessed from message strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    InvalidArguments,
    UnknownAction,
    ModeForbidden,
    NotConfigured,
    PolicyDenied,
    BusinessFailure,
    AsyncAcknowledged,
    Unconfirmed,
    Transport,
    Timeout,
    Cancelled,
    InvalidResponse,
    WorkerUnavailable,
    AuditFailed,
    Execution,
    /// An `execution.idempotency_key` reused with another action or params.
    IdempotencyConflict,
    /// An `execution.idempotency_key` cannot be kept (store unavailable or full).
    IdempotencyUnavailable,
    /// `SNOWLUMA_MCP_CONFIRM_ACTIONS`: the human did not confirm (declined,
    /// cancelled, timed out, or the client cannot ask).
    NotConfirmed,
    /// A target outside the operator's scope (`SNOWLUMA_MCP_ALLOW_GROUPS` /
    /// `ALLOW_USERS`): nothing was sent.
    OutOfScope,
    /// Over the operator's send pacing: refused at once, never queued
    /// (`Diagnostics::retry_after_ms` says when a retry may pass).
    RateLimited,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::InvalidArguments => "invalid_arguments",
            FailureKind::UnknownAction => "unknown_action",
            FailureKind::ModeForbidden => "mode_forbidden",
            FailureKind::NotConfigured => "not_configured",
            FailureKind::PolicyDenied => "policy_denied",
            FailureKind::BusinessFailure => "business_failure",
            FailureKind::AsyncAcknowledged => "async_acknowledged",
            FailureKind::Unconfirmed => "unconfirmed",
            FailureKind::Transport => "transport",
            FailureKind::Timeout => "timeout",
            FailureKind::Cancelled => "cancelled",
            FailureKind::InvalidResponse => "invalid_response",
            FailureKind::WorkerUnavailable => "worker_unavailable",
            FailureKind::AuditFailed => "audit_failed",
            FailureKind::Execution => "execution",
            FailureKind::IdempotencyConflict => "idempotency_conflict",
            FailureKind::IdempotencyUnavailable => "idempotency_unavailable",
            FailureKind::NotConfirmed => "not_confirmed",
            FailureKind::OutOfScope => "out_of_scope",
            FailureKind::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnostics {
    pub outcome: Outcome,
    pub kind: Option<FailureKind>,
    pub message: Option<String>,
    pub next_step: Option<String>,
    /// The recorded outcome of an earlier call with the same
    /// `execution.idempotency_key`, answered again without contacting
    /// SnowLuma (rendered as `"replayed": true`).
    #[serde(default)]
    pub replayed: bool,
    /// For a `rate_limited` refusal: the least time, in milliseconds, after
    /// which the same call may pass the pacing.
    /// (`u32`: every pacing limit is below 2^31 ms, and the reply stays small.)
    pub retry_after_ms: Option<u32>,
}

impl Diagnostics {
    pub fn success() -> Diagnostics {
        Diagnostics {
            outcome: Outcome::Success,
            kind: None,
            message: None,
            next_step: None,
            replayed: false,
            retry_after_ms: None,
        }
    }

    pub fn failed(kind: FailureKind, message: impl Into<String>) -> Diagnostics {
        Diagnostics {
            outcome: Outcome::Failed,
            kind: Some(kind),
            message: Some(message.into()),
            next_step: None,
            replayed: false,
            retry_after_ms: None,
        }
    }

    pub fn unknown(kind: FailureKind, message: impl Into<String>) -> Diagnostics {
        Diagnostics {
            outcome: Outcome::Unknown,
            kind: Some(kind),
            message: Some(message.into()),
            next_step: None,
            replayed: false,
            retry_after_ms: None,
        }
    }

    pub fn with_next_step(mut self, step: impl Into<String>) -> Diagnostics {
        self.next_step = Some(step.into());
        self
    }

    pub fn with_retry_after_ms(mut self, ms: u32) -> Diagnostics {
        self.retry_after_ms = Some(ms);
        self
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("outcome".into(), json!(self.outcome.as_str()));
        if let Some(k) = self.kind {
            m.insert("kind".into(), json!(k.as_str()));
        }
        if let Some(msg) = &self.message {
            m.insert("message".into(), json!(msg));
        }
        if let Some(s) = &self.next_step {
            m.insert("next_step".into(), json!(s));
        }
        if self.replayed {
            m.insert("replayed".into(), json!(true));
        }
        if let Some(ms) = self.retry_after_ms {
            m.insert("retry_after_ms".into(), json!(ms));
        }
        Value::Object(m)
    }

    /// The JSON Schema of [`Diagnostics::to_json`], for `outputSchema`s
    /// (`retry_after_ms`, present only on `rate_limited` refusals, is left
    /// undeclared so that tools/list stays as it was; the schema allows it).
    pub fn json_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "outcome": {"type": "string", "enum": ["success", "failed", "unknown"]},
                "kind": {"type": "string"},
                "message": {"type": "string"},
                "next_step": {"type": "string"},
                "replayed": {"type": "boolean"}
            },
            "required": ["outcome"]
        })
    }
}

/// A finished tool call as a worker (or the supervisor itself) reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolReply {
    /// The payload; `None` renders as `null` (always so for tool errors).
    pub result: Option<JsonText>,
    pub diagnostics: Diagnostics,
    /// An MCP tool error (`isError: true`): transport failures, refused
    /// calls, invalid arguments. OneBot business failures are *not* errors.
    pub is_error: bool,
    /// The result's top-level `retcode` member as JSON text, when the result
    /// is an object that has one: read by whoever built the result (the
    /// network executor reads it while classifying the envelope), so the
    /// supervisor's audit record never parses the result for it. Boxed: it
    /// is rare and small, and every reply carries the field.
    pub retcode: Option<Box<JsonText>>,
}

impl ToolReply {
    pub fn ok(result: &Value) -> ToolReply {
        ToolReply::with_diagnostics(result, Diagnostics::success())
    }

    pub fn with_diagnostics(result: &Value, diagnostics: Diagnostics) -> ToolReply {
        ToolReply {
            result: Some(JsonText::from_value(result)),
            diagnostics,
            is_error: false,
            retcode: result.get("retcode").map(|r| Box::new(JsonText::from_value(r))),
        }
    }

    pub fn error(diagnostics: Diagnostics) -> ToolReply {
        ToolReply { result: None, diagnostics, is_error: true, retcode: None }
    }

    /// [`ToolReply::retcode`], parsed (`null` when there is none).
    pub fn retcode_value(&self) -> Value {
        self.retcode.as_ref().and_then(|t| t.parse().ok()).unwrap_or(Value::Null)
    }

    /// An error reply of one kind and message.
    pub fn fail(kind: FailureKind, message: impl Into<String>) -> ToolReply {
        ToolReply::error(Diagnostics::failed(kind, message))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A reply built from a value carries the value's `retcode` as it would
    /// read back from the result text; and survives the IPC encoding.
    #[test]
    fn the_retcode_travels_with_the_result() {
        for v in
            [json!({"retcode": 0}), json!({"retcode": "0", "a": 1}), json!({"retcode": 1e15}), json!({"retcode": null})]
        {
            let r = ToolReply::ok(&v);
            let back: Value = r.result.as_ref().unwrap().parse().unwrap();
            assert_eq!(r.retcode_value(), back["retcode"], "{v}");
            let bytes = postcard::to_allocvec(&r).unwrap();
            let decoded: ToolReply = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(decoded.retcode, r.retcode);
        }
        for v in [json!({"a": 1}), json!([1]), json!("retcode")] {
            assert_eq!(ToolReply::ok(&v).retcode, None);
            assert_eq!(ToolReply::ok(&v).retcode_value(), Value::Null);
        }
        assert_eq!(ToolReply::fail(FailureKind::Execution, "x").retcode, None);
    }
}
