//! The record format: the chain's fields, the MAC sealed onto each line,
//! parsing a line back, and the typed records of an execution.

use serde_json::{Map, Value};

use super::key::Key;
use super::{AuditError, AuditLog, unhex32};

pub const GENESIS_PREV: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// The record version this server writes.
pub(super) const RECORD_VERSION: u64 = 2;
pub(super) const MAC_TAG: &str = "hmac-sha256:";
/// How a version-2 line ends: this, 64 hex digits, then `"}`.
const MAC_MEMBER: &[u8] = b",\"mac\":\"hmac-sha256:";
const MAC_SUFFIX_LEN: usize = MAC_MEMBER.len() + 64 + 2;

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// Who the session serves, named on every record: the local peer of a
/// socket-activated connection (`SO_PEERCRED`), or the principal of a
/// `serve-http` session (the access token's id and the client's address,
/// given by the launcher).
#[derive(Debug, Clone)]
pub enum Principal {
    Local(Peer),
    Http { token_id: String, peer: String },
}

/// RFC 3339 UTC timestamp with microseconds, without a date library.
pub fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}Z", snowluma_proto::text::utc_datetime(d.as_secs()), d.subsec_micros())
}

/// One line of the log, parsed.
pub(super) struct Parsed {
    pub(super) seq: u64,
    pub(super) prev: String,
    /// Version 2: the bytes the MAC covers and the MAC. `None`: version 1.
    pub(super) sealed: Option<(Vec<u8>, [u8; 32])>,
}

/// A version-2 line's MAC and the bytes it covers (the line without its
/// final `,"mac":"..."` member, closed with `}`).
fn split_mac(line: &[u8]) -> Option<(Vec<u8>, [u8; 32])> {
    if line.len() < MAC_SUFFIX_LEN + 2 {
        return None;
    }
    let (body, tail) = line.split_at(line.len() - MAC_SUFFIX_LEN);
    if !tail.starts_with(MAC_MEMBER) || !tail.ends_with(b"\"}") {
        return None;
    }
    let tag = unhex32(&tail[MAC_MEMBER.len()..MAC_MEMBER.len() + 64])?;
    let mut covered = body.to_vec();
    covered.push(b'}');
    Some((covered, tag))
}

pub(super) fn parse_line(line: &[u8]) -> Result<Parsed, &'static str> {
    let fields = |v: &Value| -> Result<(u64, String), &'static str> {
        let seq = v.get("seq").and_then(Value::as_u64).ok_or("a record without seq")?;
        let prev = v.get("prev").and_then(Value::as_str).ok_or("a record without prev")?;
        Ok((seq, prev.to_owned()))
    };
    if let Some((covered, tag)) = split_mac(line) {
        let v: Value = serde_json::from_slice(&covered).map_err(|_| "not a JSON record")?;
        let obj = v.as_object().ok_or("not a JSON record")?;
        if obj.get("v").and_then(Value::as_u64) != Some(RECORD_VERSION) {
            return Err("a mac member on a record that is not version 2");
        }
        if obj.contains_key("mac") {
            return Err("more than one mac member");
        }
        let (seq, prev) = fields(&v)?;
        return Ok(Parsed { seq, prev, sealed: Some((covered, tag)) });
    }
    let v: Value = serde_json::from_slice(line).map_err(|_| "not a JSON record")?;
    let obj = v.as_object().ok_or("not a JSON record")?;
    match obj.get("v").and_then(Value::as_u64) {
        Some(1) if !obj.contains_key("mac") => {
            let (seq, prev) = fields(&v)?;
            Ok(Parsed { seq, prev, sealed: None })
        }
        Some(1) => Err("a version-1 record with a mac member"),
        Some(RECORD_VERSION) => Err("a version-2 record that does not end with a well-formed mac member"),
        _ => Err("not a record of a known version"),
    }
}

/// The line of a version-2 record: `body` (a JSON object) with its MAC
/// appended as the last member. Without the newline.
pub(super) fn seal(key: &Key, body: Vec<u8>) -> Result<Vec<u8>, AuditError> {
    let mac = key.record_mac(&body);
    let mut line = body;
    if line.pop() != Some(b'}') {
        return Err(std::io::Error::other("a record did not serialize to a JSON object").into());
    }
    line.extend_from_slice(MAC_MEMBER);
    line.extend_from_slice(mac.as_bytes());
    line.extend_from_slice(b"\"}");
    Ok(line)
}

/// Which action an execution record is about (the fields every `refused`,
/// `intent` and `result` record shares).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionRef {
    pub op_id: String,
    pub tool: String,
    /// The name as the client gave it (an alias or `_async` form included).
    pub action: String,
    pub canonical: String,
    pub read_only: bool,
    pub mode: &'static str,
    pub traceparent: String,
}

/// Which tool a refusal that names no action is about (`subscribe_events`
/// refused by the target scope): the fields of [`ActionRef`] without
/// `action`, `canonical` and `read_only`. The refused ids are never named.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolRef {
    pub op_id: String,
    pub tool: String,
    pub mode: &'static str,
    pub traceparent: String,
}

/// The records of one execution, typed: what the audit log says about an
/// action, field by field (serialized in this order after the chain's own
/// fields; `phase` names the variant).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum ActionRecord {
    /// Refused by the operator's policy; nothing was sent.
    Refused {
        #[serde(flatten)]
        action: ActionRef,
        reason: &'static str,
    },
    /// Refused by the operator's policy, for a tool call that names no
    /// action (`subscribe_events`): a `refused` record with the tool's
    /// fields only. `audit verify` checks the chain and MACs, not which
    /// fields a record has, so logs with and without it verify alike.
    #[serde(rename = "refused")]
    RefusedTool {
        #[serde(flatten)]
        tool: ToolRef,
        reason: &'static str,
    },
    /// The human's answer to a confirmation (`SNOWLUMA_MCP_CONFIRM_ACTIONS`),
    /// written before the intent record (same `op_id`) when accepted.
    Confirmation {
        #[serde(flatten)]
        action: ActionRef,
        /// `accepted`, `declined`, `cancelled` or `timed_out`.
        decision: &'static str,
    },
    /// The recorded outcome of an earlier call with the same idempotency
    /// key, answered again; nothing was sent.
    Replayed {
        #[serde(flatten)]
        action: ActionRef,
        outcome: &'static str,
    },
    /// Written (and fsynced) before the request leaves; params only as a digest.
    Intent {
        #[serde(flatten)]
        action: ActionRef,
        params_digest: String,
    },
    /// After the reply (or failure).
    Result {
        #[serde(flatten)]
        action: ActionRef,
        outcome: &'static str,
        kind: Option<&'static str>,
        is_error: bool,
        retcode: Value,
        duration_ms: f64,
    },
}

impl ActionRecord {
    fn into_map(self) -> Result<Map<String, Value>, AuditError> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(AuditError::Io(std::io::Error::other("an audit record is not an object"))),
            Err(e) => Err(AuditError::Io(std::io::Error::other(e))),
        }
    }
}

impl AuditLog {
    /// Append an execution record (see [`AuditLog::append`]).
    pub async fn record(&self, rec: ActionRecord) -> Result<(), AuditError> {
        self.append(rec.into_map()?).await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use snowluma_proto::text::canonical_json as canonical;

    use super::*;
    use crate::audit::head::{
        Anchor, HEAD_LEN, HEAD_SLOT_1, HeadState, Slot, head_path, head_slots, parse_slot, read_head,
    };
    use crate::audit::key::{KeySource, key_path, read_key};
    use crate::audit::test_support::{Dir, key_of, lines_of, written};
    use crate::audit::verify::{HeadCheck, MacCheck, VerifyError, verify};

    #[test]
    fn timestamps_and_canonical_json() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 27, "{t}");
        assert!(t.ends_with('Z') && t.starts_with("20"));
        assert_eq!(
            canonical(&json!({"b": 1, "a": [true, {"d": null, "c": "x"}]})),
            r#"{"a":[true,{"c":"x","d":null}],"b":1}"#
        );
    }

    #[test]
    fn records_are_sealed_and_the_head_follows() {
        let dir = Dir::new("seal");
        let path = written(&dir, 4);
        let ok = verify(&path, key_of(&path)).unwrap();
        assert_eq!(ok.to_string(), "5 records, chain intact, MACs valid, head matches");
        assert_eq!((ok.records, ok.head, ok.macs), (5, HeadCheck::Matches, MacCheck::Checked));
        let lines = lines_of(&path);
        for (i, l) in lines.iter().enumerate() {
            let v: Value = serde_json::from_str(l).unwrap();
            assert_eq!((v["v"].as_u64(), v["seq"].as_u64()), (Some(2), Some(i as u64)));
            assert!(l.ends_with("\"}") && v["mac"].as_str().unwrap().starts_with("hmac-sha256:"), "{l}");
        }
        let head = std::fs::read(head_path(&path)).unwrap();
        assert_eq!(head.len(), HEAD_LEN);
        let key = read_key(&key_path(&path)).unwrap();
        assert_eq!(read_head(&head, Some(&key)), HeadState::Anchored(Anchor::of(4, lines[4].as_bytes())));
        // Both slots hold the last anchor, and nothing older.
        for (i, slot) in head_slots(&head).into_iter().enumerate() {
            match parse_slot(slot, Some(&key)) {
                Slot::Valid(a) => assert_eq!(a.seq, 4),
                _ => panic!("slot {i}"),
            }
        }
        assert_eq!(head[HEAD_SLOT_1 - 1], b'\n');
        // Another key checks neither records nor the head.
        let other = Key::from_raw([7; 32]);
        assert_eq!(read_head(&head, Some(&other)), HeadState::Invalid);
        assert!(matches!(verify(&path, Ok(other)), Err(VerifyError::Line { line: 1, .. })));
        // Params digests are not record MACs.
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "write").unwrap();
        let d1 = log.params_digest(&json!({"a": 1, "b": 2}));
        assert_eq!(d1, log.params_digest(&json!({"b": 2, "a": 1})));
        assert!(d1.starts_with("hmac-sha256:") && d1.len() == 76);
    }

    /// A refusal that names no action is a `refused` record with the tool's
    /// fields only, in a log that verifies beside the older records.
    #[test]
    fn a_tool_refusal_is_a_refused_record_without_an_action() {
        let dir = Dir::new("tool-refusal");
        let path = written(&dir, 1);
        let log = AuditLog::open(&path, &KeySource::BesideLog, None, "read").unwrap();
        let tool =
            ToolRef { op_id: "op".into(), tool: "subscribe_events".into(), mode: "read", traceparent: "tp".into() };
        log.append_blocking(ActionRecord::RefusedTool { tool, reason: "out_of_scope" }.into_map().unwrap()).unwrap();
        drop(log);
        let ok = verify(&path, key_of(&path)).unwrap();
        assert_eq!((ok.records, ok.head, ok.macs), (4, HeadCheck::Matches, MacCheck::Checked));
        let last: Value = serde_json::from_str(lines_of(&path).last().unwrap()).unwrap();
        assert_eq!(
            (&last["phase"], &last["tool"], &last["reason"], &last["mode"]),
            (&json!("refused"), &json!("subscribe_events"), &json!("out_of_scope"), &json!("read"))
        );
        for absent in ["action", "canonical", "read_only", "params_digest"] {
            assert!(last.get(absent).is_none(), "{absent}: {last}");
        }
    }
}
