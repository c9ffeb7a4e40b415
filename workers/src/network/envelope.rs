//! Classifying SnowLuma's answers: a OneBot envelope's outcome (`success`,
//! `failed`, `unknown`) from its `status`, `retcode` and wording, read from
//! a response body without building it as a `Value`; and the nesting depth
//! a response may have.

use std::borrow::Cow;

use serde_json::Value;
use serde_json::value::RawValue;
use snowluma_proto::{Diagnostics, FailureKind, JsonText};

/// SnowLuma's wording is copied into `diagnostics.message` up to this many
/// characters (the whole envelope, wording included, stays in the result).
pub const MAX_WORDING_CHARS: usize = 1024;
/// Deepest nesting of a response accepted: what the supervisor's JSON parser
/// (serde_json's default limit) can represent. Deeper is an invalid response,
/// never a success with a null result.
pub const MAX_RESPONSE_DEPTH: usize = 128;

/// Whether JSON text nests deeper than [`MAX_RESPONSE_DEPTH`].
pub(super) fn too_deep(json: &[u8]) -> bool {
    // Text with no more brackets than the limit cannot nest deeper than it:
    // one quick count (strings included) settles the usual response
    // without the exact pass.
    let brackets = json.iter().map(|&b| usize::from(b == b'[' || b == b'{')).sum::<usize>();
    brackets > MAX_RESPONSE_DEPTH && nesting_depth(json) > MAX_RESPONSE_DEPTH
}

/// The deepest nesting of arrays and objects in JSON text (valid JSON:
/// brackets inside strings are skipped). One pass, no allocation.
pub(super) fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// SnowLuma's human-readable reason in an envelope or frame, if any.
pub(super) fn wording(env: &Value) -> Option<String> {
    first_wording(["wording", "message", "msg"].map(|k| env.get(k).and_then(Value::as_str)))
}

/// The first non-empty of `wording`, `message`, `msg` (in that order).
fn first_wording(candidates: [Option<&str>; 3]) -> Option<String> {
    candidates.into_iter().flatten().find(|s| !s.is_empty()).map(str::to_owned)
}

/// Classify a OneBot envelope.
pub fn classify(env: &Value) -> Diagnostics {
    classify_fields(env.get("status").and_then(Value::as_str), env.get("retcode").and_then(Value::as_i64), wording(env))
}

/// The envelope fields that decide an outcome, read without building the
/// whole response as a `Value` (the response text itself is passed on
/// unchanged). Every other field is skipped, though still checked as JSON.
#[derive(serde::Deserialize)]
struct EnvelopeFields<'a> {
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
    #[serde(borrow, default)]
    retcode: Option<&'a RawValue>,
    #[serde(borrow, default)]
    wording: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    msg: Option<&'a RawValue>,
}

/// A member's text as the string it holds, if it is one (borrowed when it
/// has no escapes).
fn as_str(raw: Option<&RawValue>) -> Option<Cow<'_, str>> {
    let text = raw?.get();
    if !text.starts_with('"') {
        return None;
    }
    match serde_json::from_str::<&str>(text) {
        Ok(s) => Some(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
    }
}

/// What the supervisor needs of a response body besides its text: the
/// outcome, and the `retcode` its audit record keeps.
#[derive(Debug, PartialEq)]
pub(super) struct Envelope {
    pub diagnostics: Diagnostics,
    /// The `retcode` member as JSON text (`None` when absent or `null`).
    pub retcode: Option<Box<JsonText>>,
}

/// Classify a response body that must be a JSON object; `None` when it is
/// not one (the caller reports why). Same answers as [`classify`].
pub(super) fn classify_body(body: &[u8]) -> Option<Envelope> {
    // A derived struct would also accept an array (fields by position).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let f: EnvelopeFields<'_> = match serde_json::from_slice(body) {
        Ok(f) => f,
        // Not an object, or an object this shortcut cannot read (e.g. a
        // duplicate key): the general path decides.
        Err(_) => {
            let v: Value = serde_json::from_slice(body).ok()?;
            return v.is_object().then(|| Envelope {
                diagnostics: classify(&v),
                retcode: v.get("retcode").filter(|r| !r.is_null()).map(|r| Box::new(JsonText::from_value(r))),
            });
        }
    };
    let status = as_str(f.status);
    let (retcode_i64, retcode) = match f.retcode.map(RawValue::get) {
        None => (None, None),
        // The usual retcode, a plain integer, is its own JSON text.
        Some(text) => match plain_integer(text) {
            Some(n) => (Some(n), Some(JsonText(text.to_owned()))),
            None => {
                let v: Option<Value> = serde_json::from_str(text).ok();
                (v.as_ref().and_then(Value::as_i64), v.as_ref().map(JsonText::from_value))
            }
        },
    };
    // The wording is only read for an outcome that is not a success.
    let wording = if status.as_deref() == Some("ok") && retcode_i64 == Some(0) {
        None
    } else {
        let words = [f.wording, f.message, f.msg].map(as_str);
        first_wording([0, 1, 2].map(|i| words[i].as_deref()))
    };
    let diagnostics = classify_fields(status.as_deref(), retcode_i64, wording);
    Some(Envelope { diagnostics, retcode: retcode.map(Box::new) })
}

/// The value of JSON number text that a parsed `Value` writes back as the
/// same text and reads as an `i64`: an optional minus, then digits without
/// a leading zero (`-0` is written back as `0`, so it is not one).
fn plain_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = match digits.as_bytes() {
        [b'0'] => digits.len() == text.len(),
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if plain { text.parse().ok() } else { None }
}

fn classify_fields(status: Option<&str>, retcode: Option<i64>, wording: Option<String>) -> Diagnostics {
    match (status, retcode) {
        (Some("ok"), Some(0)) => Diagnostics::success(),
        (Some("async"), _) | (_, Some(1)) => Diagnostics::unknown(
            FailureKind::AsyncAcknowledged,
            "SnowLuma accepted the action asynchronously; its outcome is not confirmed",
        )
        .with_next_step("Check the action's effect before repeating it."),
        (Some("failed"), _) | (_, Some(_)) if retcode != Some(0) || status == Some("failed") => {
            let rc = retcode.map(|r| r.to_string()).unwrap_or_else(|| "none".into());
            let msg = match &wording {
                Some(w) if w.chars().count() > MAX_WORDING_CHARS => {
                    let head: String = w.chars().take(MAX_WORDING_CHARS).collect();
                    format!(
                        "SnowLuma reported a failure (retcode {rc}): {head}… (wording cut; the whole envelope is the result)"
                    )
                }
                Some(w) => format!("SnowLuma reported a failure (retcode {rc}): {w}"),
                None => format!("SnowLuma reported a failure (retcode {rc})"),
            };
            let next = match retcode {
                Some(1400) => "Check the params against get_action's inputSchema.",
                Some(1401) | Some(1403) => "SNOWLUMA_MCP_TOKEN must match SnowLuma's access token.",
                Some(1404) => "The connected SnowLuma does not offer this action; the catalog is a bundled snapshot.",
                Some(1413) => "The request body is too large; send big files with upload_file_stream.",
                _ => "Read the wording; fix the cause before trying again.",
            };
            Diagnostics::failed(FailureKind::BusinessFailure, msg).with_next_step(next)
        }
        _ => {
            Diagnostics::unknown(FailureKind::Unconfirmed, "the response does not confirm success (no status/retcode)")
                .with_next_step("Check the action's effect before repeating it.")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use snowluma_proto::Outcome;

    use super::*;

    #[test]
    fn nesting_depth_skips_strings() {
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":"[[[{{"}]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a":"\"[[["}"#), 1);
        assert_eq!(nesting_depth(b"1"), 0);
        let at = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!too_deep(at(MAX_RESPONSE_DEPTH).as_bytes()) && too_deep(at(MAX_RESPONSE_DEPTH + 1).as_bytes()));
        let wide = format!("[{}]", vec!["[]"; 1000].join(","));
        assert!(!too_deep(wide.as_bytes()), "many brackets, shallow");
        let quoted = format!(r#"{{"a":"{}"}}"#, "[".repeat(1000));
        assert!(!too_deep(quoted.as_bytes()), "brackets in a string");
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(nesting_depth(deep.as_bytes()), 100_000);
    }

    #[test]
    fn long_wording_is_cut_in_the_message() {
        let w = "x".repeat(9 * 1024 * 1024);
        let d = classify_fields(Some("failed"), Some(100), Some(w));
        assert!(d.message.unwrap().len() < MAX_WORDING_CHARS + 200);
    }

    #[test]
    fn classifies_envelopes() {
        assert_eq!(classify(&json!({"status":"ok","retcode":0,"data":null})).outcome, Outcome::Success);
        // The shortcut on response bodies agrees with the Value path.
        for body in [
            r#"{"status":"ok","retcode":0,"data":{"online":true}}"#,
            r#"{"status":"failed","retcode":1400,"data":null,"wording":"group_id: is required"}"#,
            r#"{"status":"failed","retcode":1404,"message":"","msg":"no such action"}"#,
            r#"{"status":"async","retcode":1}"#,
            r#"{"data":{}}"#,
            r#"{"status":"ok","retcode":100}"#,
            r#"{"status":"ok","retcode":"0"}"#,
            r#"{"status":"ok","status":"failed","retcode":0}"#,
            // Retcodes of every form: each read, and kept, as a parsed
            // `Value` reads and writes it.
            r#"{"status":"failed","retcode":-0}"#,
            r#"{"status":"failed","retcode":-17}"#,
            r#"{"status":"failed","retcode":0.0}"#,
            r#"{"status":"failed","retcode":1e2}"#,
            r#"{"status":"failed","retcode":1400.5}"#,
            r#"{"status":"failed","retcode":-9223372036854775808}"#,
            r#"{"status":"failed","retcode":9223372036854775807}"#,
            r#"{"status":"failed","retcode":9223372036854775808}"#,
            r#"{"status":"failed","retcode":18446744073709551616}"#,
            r#"{"status":"failed","retcode":-9223372036854775809}"#,
            r#"{"status":"failed","retcode": 12 }"#,
            r#"{"status":"failed","retcode":[1]}"#,
            r#"{"status":"failed","retcode":true}"#,
        ] {
            let v: Value = serde_json::from_str(body).unwrap();
            let env = classify_body(body.as_bytes()).unwrap();
            assert_eq!(env.diagnostics, classify(&v), "{body}");
            // The text the parsed value is sent as, byte for byte.
            let retcode = env.retcode.map(|t| t.0);
            let sent = v.get("retcode").filter(|r| !r.is_null()).map(|r| JsonText::from_value(r).0);
            assert_eq!(retcode, sent, "{body}");
        }
        let dup = classify_body(br#"{"retcode":1,"retcode":"2","status":"ok"}"#).unwrap();
        assert_eq!(dup.retcode.map(|t| t.0).as_deref(), Some(r#""2""#), "the last member, as the parsed result has it");
        assert_eq!(classify_body(br#"{"retcode":null}"#).unwrap().retcode, None);
        for not_object in [&b"[1,2]"[..], b"\"ok\"", b"{\"status\":", b"", b"{} x"] {
            assert_eq!(classify_body(not_object), None);
        }
        let d = classify(&json!({"status":"failed","retcode":1400,"data":null,"wording":"group_id: is required"}));
        assert_eq!((d.outcome, d.kind), (Outcome::Failed, Some(FailureKind::BusinessFailure)));
        assert!(d.message.unwrap().contains("group_id"));
        assert_eq!(classify(&json!({"status":"async","retcode":1})).outcome, Outcome::Unknown);
        assert_eq!(classify(&json!({"data":{}})).outcome, Outcome::Unknown);
        assert_eq!(classify(&json!({"status":"ok","retcode":100})).outcome, Outcome::Failed);
    }
}
