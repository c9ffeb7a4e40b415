//! Reading stdin one line (one JSON-RPC message) at a time, cancel-safely,
//! with a size limit; and recovering the id of a line over the limit.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Largest accepted input line (one JSON-RPC message).
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Bytes of an over-long line kept to recover its id.
const ID_SCAN_BYTES: usize = 64 * 1024;

pub(super) enum Line {
    Eof,
    Full(Vec<u8>),
    TooLong(Vec<u8>),
}

pub(super) struct LineReader {
    reader: BufReader<Box<dyn AsyncRead + Send + Sync + Unpin>>,
    /// The line being assembled. Kept here, not in the future, because rmcp
    /// polls `receive` inside `select!` and may drop it between reads: the
    /// read must be cancel-safe.
    line: Vec<u8>,
    /// Set once the current line exceeded the limit: the prefix kept for id recovery.
    overflow: Option<Vec<u8>>,
}

impl LineReader {
    pub(super) fn new(input: Box<dyn AsyncRead + Send + Sync + Unpin>) -> LineReader {
        LineReader { reader: BufReader::with_capacity(64 * 1024, input), line: Vec::new(), overflow: None }
    }

    /// Cancel-safe: the only await is `fill_buf`, and bytes are moved into
    /// `self.line` in the same poll in which they are consumed.
    pub(super) async fn read_line(&mut self) -> std::io::Result<Line> {
        loop {
            let avail = self.reader.fill_buf().await?;
            if avail.is_empty() {
                let line = std::mem::take(&mut self.line);
                return Ok(match self.overflow.take() {
                    Some(prefix) => Line::TooLong(prefix),
                    None if line.is_empty() => Line::Eof,
                    None => Line::Full(line),
                });
            }
            let (chunk, consumed, done) = match avail.iter().position(|b| *b == b'\n') {
                Some(i) => (&avail[..i], i + 1, true),
                None => (avail, avail.len(), false),
            };
            if self.overflow.is_none() {
                self.line.extend_from_slice(chunk);
                if self.line.len() > MAX_LINE_BYTES {
                    self.line.truncate(ID_SCAN_BYTES);
                    self.overflow = Some(std::mem::take(&mut self.line));
                }
            }
            self.reader.consume(consumed);
            if done {
                let line = std::mem::take(&mut self.line);
                return Ok(match self.overflow.take() {
                    Some(prefix) => Line::TooLong(prefix),
                    None => Line::Full(line),
                });
            }
        }
    }
}

/// Best-effort id recovery from the start of an over-long message: the
/// first `"id"` key that appears before `"params"`.
pub(super) fn recover_id(prefix: &[u8]) -> Value {
    let text = String::from_utf8_lossy(prefix);
    let head = match text.find("\"params\"") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let Some(pos) = head.find("\"id\"") else { return Value::Null };
    let rest = head[pos + 4..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else { return Value::Null };
    let rest = rest.trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        if let Some(end) = s.find('"') {
            return json!(&s[..end]);
        }
        return Value::Null;
    }
    let num: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    num.parse::<i64>().map(|n| json!(n)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_ids() {
        assert_eq!(recover_id(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"x":"#), json!(42));
        assert_eq!(recover_id(br#"{"id": "abc", "method":"x"}"#), json!("abc"));
        assert_eq!(recover_id(br#"{"method":"x","params":{"id":5"#), Value::Null);
    }
}
