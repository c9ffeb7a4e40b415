//! W3C trace context for tool calls.
//!
//! A valid caller `traceparent` keeps its trace id and gets a new span id
//! per call; anything else starts an independent trace. `tracestate` is kept
//! (validated: at most 512 characters and 32 members) to be forwarded, never
//! logged. `baggage` is ignored entirely.

use rmcp::model::MetaObject as Meta;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceInput {
    Absent,
    Valid,
    Invalid,
}

#[derive(Debug, Clone)]
pub struct CallTrace {
    pub traceparent: String,
    pub tracestate: Option<String>,
    pub input: TraceInput,
    pub tracestate_rejected: bool,
}

pub(crate) use snowluma_proto::bytes::{hex, push_hex, random_bytes, random_ids};

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Parse a version-00 traceparent; returns (trace id, flags).
fn parse_traceparent(tp: &str) -> Option<(&str, &str)> {
    let mut parts = tp.split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version != "00" {
        return None;
    }
    if !is_lower_hex(trace, 32) || !is_lower_hex(span, 16) || !is_lower_hex(flags, 2) {
        return None;
    }
    if trace.bytes().all(|b| b == b'0') || span.bytes().all(|b| b == b'0') {
        return None;
    }
    Some((trace, flags))
}

fn valid_tracestate(ts: &str) -> bool {
    if ts.len() > 512 || ts.chars().any(|c| !(' '..='~').contains(&c)) {
        return false;
    }
    let members: Vec<&str> = ts.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    if members.len() > 32 {
        return false;
    }
    members.iter().all(|m| match m.split_once('=') {
        Some((k, v)) => !k.is_empty() && !v.is_empty() && !v.contains('=') && !k.contains(' '),
        None => false,
    })
}

impl CallTrace {
    pub fn from_meta(meta: &Meta) -> CallTrace {
        let tp = meta.get("traceparent").and_then(|v| v.as_str());
        // Both ids from the pool: bytes 0..8 the span, 8..24 a new trace
        // (neither may be all zeros).
        let mut random = random_ids::<24>();
        while random[..8].iter().all(|b| *b == 0) || random[8..].iter().all(|b| *b == 0) {
            random = random_ids::<24>();
        }
        // `00-<trace>-<span>-<flags>`, written once.
        let mut traceparent = String::with_capacity(55);
        traceparent.push_str("00-");
        let parsed = tp.map(parse_traceparent);
        let flags = match parsed {
            Some(Some((trace, flags))) => {
                traceparent.push_str(trace);
                flags
            }
            Some(None) | None => {
                push_hex(&mut traceparent, &random[8..]);
                "01"
            }
        };
        traceparent.push('-');
        push_hex(&mut traceparent, &random[..8]);
        traceparent.push('-');
        traceparent.push_str(flags);
        let input = match parsed {
            Some(Some(_)) => TraceInput::Valid,
            Some(None) => TraceInput::Invalid,
            None => TraceInput::Absent,
        };
        let raw_state = meta.get("tracestate");
        let (tracestate, rejected) = match (input == TraceInput::Valid, raw_state) {
            (_, None) => (None, false),
            (true, Some(v)) => match v.as_str() {
                Some(s) if valid_tracestate(s) => (Some(s.to_owned()), false),
                _ => (None, true),
            },
            // A tracestate without a valid parent cannot be forwarded.
            (false, Some(_)) => (None, true),
        };
        CallTrace { traceparent, tracestate, input, tracestate_rejected: rejected }
    }

    /// The fixed diagnostic for unusable trace metadata, if any.
    pub fn diagnostic(&self) -> Option<&'static str> {
        match (self.input == TraceInput::Invalid, self.tracestate_rejected) {
            (true, _) => Some("invalid traceparent ignored; started a new trace"),
            (false, true) => Some("invalid tracestate ignored"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: serde_json::Value) -> Meta {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keeps_trace_id_and_makes_new_span() {
        let t = CallTrace::from_meta(&meta(
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=1,b=2"}),
        ));
        assert!(t.traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(!t.traceparent.contains("00f067aa0ba902b7"));
        assert_eq!(t.tracestate.as_deref(), Some("a=1,b=2"));
        assert!(t.diagnostic().is_none());
    }

    /// The caller's flags are kept with its trace id; a new trace is
    /// sampled (`01`); every id is well formed and each call has its own span.
    #[test]
    fn traceparents_are_well_formed() {
        let kept = CallTrace::from_meta(&meta(
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}),
        ));
        assert!(
            kept.traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && kept.traceparent.ends_with("-00")
        );
        let fresh = CallTrace::from_meta(&meta(json!({})));
        let other = CallTrace::from_meta(&meta(json!({"traceparent": 5})));
        for t in [&kept, &fresh, &other] {
            assert_eq!(t.traceparent.len(), 55, "{}", t.traceparent);
            assert!(parse_traceparent(&t.traceparent).is_some(), "{}", t.traceparent);
        }
        assert!(fresh.traceparent.ends_with("-01") && fresh.input == TraceInput::Absent);
        assert_eq!(other.input, TraceInput::Absent, "a traceparent that is not a string is none");
        assert_ne!(fresh.traceparent[36..52], other.traceparent[36..52], "a span of its own");
    }

    #[test]
    fn invalid_inputs_start_a_new_trace() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            let t = CallTrace::from_meta(&meta(json!({"traceparent": bad})));
            assert_eq!(t.input, TraceInput::Invalid, "{bad}");
            assert!(parse_traceparent(&t.traceparent).is_some());
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        let t = CallTrace::from_meta(&meta(
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": many.join(",")}),
        ));
        assert!(t.tracestate.is_none() && t.tracestate_rejected);
        let t = CallTrace::from_meta(&meta(
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=".repeat(300)}),
        ));
        assert!(t.tracestate.is_none());
    }
}
