//! How the executor reports a failed exchange: a read that failed simply
//! failed, a write that may have reached SnowLuma has an unknown outcome;
//! error texts never name the endpoint.

use snowluma_proto::{Diagnostics, FailureKind, Outcome, ToolReply};

use super::MAX_BODY_BYTES;

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

pub(crate) fn reqwest_failure(e: &reqwest::Error, write: bool, stage: &str) -> ToolReply {
    let detail = format!("{stage}: {}", strip_url(e));
    if e.is_timeout() {
        transport_failure(FailureKind::Timeout, format!("SnowLuma did not answer in time ({detail})"), write, true)
    } else if e.is_connect() {
        transport_failure(FailureKind::Transport, format!("cannot connect to SnowLuma ({detail})"), write, false)
    } else {
        transport_failure(FailureKind::Transport, format!("connection to SnowLuma failed ({detail})"), write, true)
    }
}

pub(super) fn direct_failure(f: crate::http1::Failure, write: bool) -> ToolReply {
    use crate::http1::Failure;
    match f {
        Failure::Connect(e) => transport_failure(
            FailureKind::Transport,
            format!("cannot connect to SnowLuma (request: {e})"),
            write,
            false,
        ),
        Failure::NotSent(e) => transport_failure(
            FailureKind::Transport,
            format!("connection to SnowLuma failed before the request was sent ({e})"),
            write,
            false,
        ),
        Failure::Exchange { stage, detail } => transport_failure(
            FailureKind::Transport,
            format!("connection to SnowLuma failed ({stage}: {detail})"),
            write,
            true,
        ),
        Failure::TooLarge => transport_failure(
            FailureKind::InvalidResponse,
            format!("SnowLuma's response exceeds {MAX_BODY_BYTES} bytes"),
            write,
            true,
        ),
    }
}

fn strip_url(e: &reqwest::Error) -> String {
    // reqwest's Display names the URL; the endpoint is not for the client.
    let mut s = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut first = true;
    while let Some(err) = cur {
        let text = if first {
            let mut t = err.to_string();
            if let Some(i) = t.find(" for url (") {
                t.truncate(i);
            }
            t
        } else {
            err.to_string()
        };
        if !s.contains(&text) {
            if !s.is_empty() {
                s.push_str(": ");
            }
            s.push_str(&text);
        }
        first = false;
        cur = err.source();
    }
    s
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
    };
    ToolReply::error(d)
}
