//! How the executor reports a failed execution: in the Node server's words
//! (`调用失败 ({action}): {detail}`, the detail being its HTTP client's
//! message, `shared/reference/upstream/node-texts.tsv`), classified for our
//! diagnostics: a read that failed simply failed, a write that may have
//! reached SnowLuma has an unknown outcome. Error texts never name the
//! endpoint.

use snowluma_proto::texts::call_failed;
use snowluma_proto::{Diagnostics, ExecRequest, FailureKind, Outcome, ToolReply};

/// How a failed exchange is reported: a read that failed simply failed; a
/// write whose request may have reached SnowLuma has an unknown outcome.
pub(crate) fn transport_failure(kind: FailureKind, msg: String, write: bool, maybe_sent: bool) -> ToolReply {
    let d = if write && maybe_sent {
        Diagnostics::unknown(kind, msg).with_next_step(
            "The request may have reached SnowLuma: check whether the action took effect before sending it again.",
        )
    } else {
        Diagnostics::failed(kind, msg).with_next_step(match kind {
            FailureKind::Timeout => {
                "Check that SnowLuma is running and responsive; raise SNOWLUMA_MCP_TIMEOUT_MS if it is slow."
            }
            _ => "Check that SnowLuma is running and that SNOWLUMA_MCP_ENDPOINT points at its HTTP server.",
        })
    };
    ToolReply::error(d)
}

/// How an [`ExecFailure`] is classified in the diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// The exchange failed (see [`transport_failure`]).
    Transport { kind: FailureKind, maybe_sent: bool },
    /// SnowLuma reported the failure in a frame.
    Refused { next_step: Option<&'static str> },
    /// Refused here: a limit, the file, the executor itself.
    Execution { next_step: Option<&'static str> },
}

/// A failure once an execution has started. `detail` is the Node client's
/// message for it (`action get_msg request: fetch failed`, `terminated`, …);
/// the tool error's text is [`call_failed`] of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub(crate) struct ExecFailure {
    pub(crate) detail: String,
    pub(crate) report: Report,
}

impl ExecFailure {
    pub(crate) fn transport(kind: FailureKind, maybe_sent: bool, detail: impl Into<String>) -> ExecFailure {
        ExecFailure { detail: detail.into(), report: Report::Transport { kind, maybe_sent } }
    }

    /// SnowLuma's answer is not what the protocol allows.
    pub(crate) fn invalid(detail: impl Into<String>) -> ExecFailure {
        ExecFailure::transport(FailureKind::InvalidResponse, true, detail)
    }

    pub(crate) fn refused(detail: impl Into<String>, next_step: Option<&'static str>) -> ExecFailure {
        ExecFailure { detail: detail.into(), report: Report::Refused { next_step } }
    }

    pub(crate) fn execution(detail: impl Into<String>) -> ExecFailure {
        ExecFailure { detail: detail.into(), report: Report::Execution { next_step: None } }
    }

    /// The same failure, its detail rewritten (a stage prefix, a suffix).
    pub(crate) fn map_detail(self, f: impl FnOnce(String) -> String) -> ExecFailure {
        ExecFailure { detail: f(self.detail), report: self.report }
    }

    /// The tool error: Node's text, our classification.
    pub(crate) fn reply(&self, req: &ExecRequest) -> ToolReply {
        let msg = call_failed(&req.action, &self.detail);
        match self.report {
            Report::Transport { kind, maybe_sent } => transport_failure(kind, msg, req.write, maybe_sent),
            Report::Refused { next_step } => {
                let d = Diagnostics::failed(FailureKind::BusinessFailure, msg);
                ToolReply::error(match next_step {
                    Some(n) => d.with_next_step(n),
                    None => d,
                })
            }
            Report::Execution { next_step } => {
                let d = Diagnostics::failed(FailureKind::Execution, msg);
                ToolReply::error(match next_step {
                    Some(n) => d.with_next_step(n),
                    None => d,
                })
            }
        }
    }
}

/// What Node's fetch says when a request fails before any answer (refused,
/// reset, no route): undici words every such failure this way.
pub(crate) const FETCH_FAILED: &str = "fetch failed";
/// The message of `AbortSignal.timeout`'s abort (Node's ordinary calls).
pub(crate) const ABORTED_BY_TIMEOUT: &str = "The operation was aborted due to timeout";
/// What undici says when a response body breaks off (reset, closed early).
pub(crate) const TERMINATED: &str = "terminated";

/// V8's RangeError for data nested too deep to handle (Node's answer to a
/// 100 000-deep response).
pub(crate) const MAX_CALL_STACK: &str = "Maximum call stack size exceeded";

/// An ordinary call's request that failed before the response head:
/// `action {action} request: {fetch's message}`.
pub(crate) fn request_failed(action: &str, kind: FailureKind, maybe_sent: bool, error: &str) -> ExecFailure {
    ExecFailure::transport(kind, maybe_sent, format!("action {action} request: {error}"))
}

/// A `reqwest` failure before the response head of an ordinary call.
pub(crate) fn reqwest_request_failure(action: &str, e: &reqwest::Error) -> ExecFailure {
    // A connection that never opened sent nothing.
    let maybe_sent = !e.is_connect();
    if e.is_timeout() {
        request_failed(action, FailureKind::Timeout, maybe_sent, ABORTED_BY_TIMEOUT)
    } else {
        request_failed(action, FailureKind::Transport, maybe_sent, FETCH_FAILED)
    }
}

pub(crate) fn cancelled(write: bool) -> ToolReply {
    let d = Diagnostics {
        outcome: if write { Outcome::Unknown } else { Outcome::Failed },
        kind: Some(FailureKind::Cancelled),
        message: Some(if write {
            "cancelled; the action may already have reached SnowLuma, so its outcome is unknown".into()
        } else {
            "cancelled".into()
        }),
        next_step: None,
        replayed: false,
        retry_after_ms: None,
    };
    ToolReply::error(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(action: &str, write: bool) -> ExecRequest {
        ExecRequest {
            action: action.into(),
            params: snowluma_proto::JsonText("{}".into()),
            stream: false,
            write,
            trace: snowluma_proto::TraceContext { traceparent: String::new(), tracestate: None },
            transfer: None,
            progress: false,
            file_action: None,
        }
    }

    #[test]
    fn the_text_is_nodes_and_the_diagnostics_ours() {
        let f = request_failed("get_msg", FailureKind::Transport, false, FETCH_FAILED);
        let r = f.reply(&req("get_msg", false));
        assert!(r.is_error);
        assert_eq!(r.diagnostics.message.as_deref(), Some("调用失败 (get_msg): action get_msg request: fetch failed"));
        assert_eq!((r.diagnostics.outcome, r.diagnostics.kind), (Outcome::Failed, Some(FailureKind::Transport)));
        // A write that may have been sent: unknown.
        let r = ExecFailure::invalid("terminated").reply(&req("send_msg", true));
        assert_eq!(r.diagnostics.outcome, Outcome::Unknown);
        assert_eq!(r.diagnostics.message.as_deref(), Some("调用失败 (send_msg): terminated"));
        let r = ExecFailure::refused("x", Some("n")).reply(&req("a", true));
        assert_eq!(
            (r.diagnostics.outcome, r.diagnostics.kind, r.diagnostics.next_step.as_deref()),
            (Outcome::Failed, Some(FailureKind::BusinessFailure), Some("n"))
        );
    }
}
