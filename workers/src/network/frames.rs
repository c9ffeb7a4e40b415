//! SnowLuma's stream framing: a body of `\r\n\r\n`-terminated JSON frames,
//! split as bytes arrive, and whether a frame reports a failure.

use serde_json::Value;

use super::envelope::wording;

/// Largest single stream frame.
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
    /// Feed bytes; returns complete frames, or an error when one exceeds `max`.
    pub fn push(&mut self, bytes: &[u8], max: usize) -> Result<Vec<Vec<u8>>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut search_from = self.scanned;
        while let Some(pos) = find(&self.buf[search_from..], b"\r\n\r\n").map(|p| p + search_from) {
            let frame = &self.buf[start..pos];
            if !frame.iter().all(u8::is_ascii_whitespace) {
                out.push(frame.to_vec());
            }
            start = pos + 4;
            search_from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len().saturating_sub(3);
        if self.buf.len() > max {
            return Err(format!("a stream frame exceeds {max} bytes"));
        }
        Ok(out)
    }

    /// Whatever is left at the end of the body (a final frame without separator).
    pub fn finish(self) -> Option<Vec<u8>> {
        if self.buf.iter().all(u8::is_ascii_whitespace) { None } else { Some(self.buf) }
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

pub(crate) fn frame_failure(frame: &Value) -> Option<String> {
    let status = frame.get("status").and_then(Value::as_str);
    let retcode = frame.get("retcode").and_then(Value::as_i64);
    let is_error = frame.pointer("/data/type").and_then(Value::as_str) == Some("error");
    if status == Some("ok") && retcode == Some(0) && !is_error {
        return None;
    }
    let why = wording(frame)
        .unwrap_or_else(|| format!("retcode {}", retcode.map(|r| r.to_string()).unwrap_or_else(|| "none".into())));
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_frames_at_any_boundary() {
        let body = b"{\"a\":1}\r\n\r\n{\"b\":2}\r\n\r\n{\"c\":3}\r\n\r\n";
        for cut in 1..body.len() {
            let mut s = FrameSplitter::default();
            let mut got = s.push(&body[..cut], 100).unwrap();
            got.extend(s.push(&body[cut..], 100).unwrap());
            assert!(s.finish().is_none());
            assert_eq!(got.len(), 3, "cut {cut}");
        }
        let mut s = FrameSplitter::default();
        assert!(s.push(&[b'x'; 200], 100).is_err());
    }
}
