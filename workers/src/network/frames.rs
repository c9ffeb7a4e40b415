//! SnowLuma's stream framing: a body of `\r\n\r\n`-terminated JSON frames,
//! split as bytes arrive; whether a frame reports a failure; and the few
//! JavaScript conversions Node's texts quote frame fields through.

use serde_json::Value;

/// Largest single stream frame on the wire (Node's `MAX_WIRE_FRAME_BYTES`:
/// a 16 MiB decoded chunk in base64 plus its envelope).
pub const MAX_FRAME_BYTES: usize = 24 * 1024 * 1024;

/// Splits a byte stream into `\r\n\r\n`-terminated frames.
#[derive(Default)]
pub struct FrameSplitter {
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a separator (minus 3, so that a
    /// separator split across two pushes is still found): each byte is
    /// scanned once, not once per push.
    scanned: usize,
}

impl FrameSplitter {
    /// Feed bytes; returns the frames they complete, empty ones included
    /// (two separators in a row), without their separators.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut search_from = self.scanned.max(start);
        while let Some(pos) = find(&self.buf[search_from..], b"\r\n\r\n").map(|p| p + search_from) {
            out.push(self.buf[start..pos].to_vec());
            start = pos + 4;
            search_from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len().saturating_sub(3);
        out
    }

    /// Bytes received after the last separator (a frame still arriving).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Whatever is left at the end of the body: bytes after the last
    /// separator, which Node calls an unterminated frame unless they are
    /// only whitespace.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

fn find(hay: &[u8], needle: &[u8; 4]) -> Option<usize> {
    // Look for the separator's last byte with a fast byte scan, then check.
    let mut i = 3;
    while i < hay.len() {
        match hay[i..].iter().position(|b| *b == needle[3]) {
            None => return None,
            Some(off) => {
                let end = i + off;
                if hay[end - 3..=end] == needle[..] {
                    return Some(end - 3);
                }
                i = end + 1;
            }
        }
    }
    None
}

/// JavaScript's truthiness of a JSON value.
pub(crate) fn js_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// JavaScript's `String(value)` of a JSON value, `undefined` when absent.
pub(crate) fn js_string(v: Option<&Value>) -> String {
    match v {
        None => "undefined".to_owned(),
        Some(Value::Null) => "null".to_owned(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
            _ => n.to_string(),
        },
        Some(Value::String(s)) => s.clone(),
        // `Array.prototype.join`: null and undefined become empty.
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| if i.is_null() { String::new() } else { js_string(Some(i)) })
            .collect::<Vec<_>>()
            .join(","),
        Some(Value::Object(_)) => "[object Object]".to_owned(),
    }
}

/// A JSON number that is a JavaScript safe integer (`Number.isSafeInteger`).
pub(crate) fn safe_int(v: Option<&Value>) -> Option<i64> {
    const MAX_SAFE: i64 = (1 << 53) - 1;
    let n = v?.as_number()?;
    let i = match n.as_i64() {
        Some(i) => i,
        None => {
            let f = n.as_f64()?;
            if f.fract() != 0.0 || f.abs() > MAX_SAFE as f64 {
                return None;
            }
            f as i64
        }
    };
    (-MAX_SAFE..=MAX_SAFE).contains(&i).then_some(i)
}

/// Whether a frame reports a failure, as Node's client decides it
/// (`status !== 'ok' || retcode !== 0 || data.type === 'error'`), and if so
/// the reason it quotes: `wording || message || "retcode=" + retcode`.
pub(crate) fn frame_failure(frame: &Value) -> Option<String> {
    let ok = frame.get("status").and_then(Value::as_str) == Some("ok")
        && frame.get("retcode").and_then(Value::as_f64) == Some(0.0)
        && frame.get("data").filter(|d| d.is_object()).and_then(|d| d.get("type")).and_then(Value::as_str)
            != Some("error");
    if ok {
        return None;
    }
    let why = ["wording", "message"].iter().filter_map(|k| frame.get(*k)).find(|v| js_truthy(v));
    Some(match why {
        Some(v) => js_string(Some(v)),
        None => format!("retcode={}", js_string(frame.get("retcode"))),
    })
}

/// Whether a frame is the acknowledgement of a manual `upload_file_stream`
/// reset (SnowLuma fails a reset with "Stream reset completed"): Node's
/// `/stream reset completed/i` on `wording ?? message ?? ''`.
pub(crate) fn is_reset_ack(frame: &Value) -> bool {
    let said = ["wording", "message"].iter().filter_map(|k| frame.get(*k)).find(|v| !v.is_null());
    js_string(Some(said.unwrap_or(&Value::String(String::new()))))
        .to_ascii_lowercase()
        .contains("stream reset completed")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn splits_frames_at_any_boundary() {
        let body = b"{\"a\":1}\r\n\r\n{\"b\":2}\r\n\r\n{\"c\":3}\r\n\r\n";
        for cut in 1..body.len() {
            let mut s = FrameSplitter::default();
            let mut got = s.push(&body[..cut]);
            got.extend(s.push(&body[cut..]));
            assert!(s.finish().is_empty());
            assert_eq!(got, [&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"], "cut {cut}");
        }
        let mut s = FrameSplitter::default();
        assert_eq!(s.push(b"\r\n\r\n{}\r\n\r\n{"), [&b""[..], b"{}"]);
        assert_eq!(s.pending(), 1);
        assert_eq!(s.finish(), b"{");
    }

    #[test]
    fn failures_and_js_conversions_are_nodes() {
        let ok = json!({"status": "ok", "retcode": 0, "data": {"type": "stream"}});
        assert_eq!(frame_failure(&ok), None);
        assert_eq!(frame_failure(&json!({"status": "ok", "retcode": 0.0})), None);
        let failed = json!({"status": "failed", "retcode": 100, "data": {"type": "error"}, "message": "", "wording": "disk full"});
        assert_eq!(frame_failure(&failed).as_deref(), Some("disk full"));
        assert_eq!(frame_failure(&json!({"status": "ok", "retcode": 7, "message": "m"})).as_deref(), Some("m"));
        assert_eq!(frame_failure(&json!({"status": "ok"})).as_deref(), Some("retcode=undefined"));
        assert_eq!(frame_failure(&json!({"status": "ok", "retcode": "0"})).as_deref(), Some("retcode=0"));
        assert_eq!(
            frame_failure(&json!({"status": "ok", "retcode": 0, "data": {"type": "error"}})).as_deref(),
            Some("retcode=0")
        );
        assert!(is_reset_ack(&json!({"wording": "Stream reset completed"})));
        assert!(is_reset_ack(&json!({"wording": null, "message": "stream RESET completed"})));
        assert!(!is_reset_ack(&json!({"wording": "", "message": "Stream reset completed"})));
        assert_eq!(js_string(Some(&json!([1, null, "a"]))), "1,,a");
        assert_eq!(js_string(Some(&json!(2.0))), "2");
        assert_eq!(js_string(Some(&json!({}))), "[object Object]");
        assert_eq!(safe_int(Some(&json!(3.0))), Some(3));
        assert_eq!(safe_int(Some(&json!(3.5))), None);
        assert_eq!(safe_int(Some(&json!(9007199254740992u64))), None);
        assert_eq!(safe_int(Some(&json!("3"))), None);
    }
}
