//! The work floor: the reactor floor's two processes doing the least work
//! that gives the client snowluma-mcp's answer, and nothing else. The
//! first stage parses the request line (borrowed, one pass) and its
//! arguments, makes the call's trace id, frames the action, its params and
//! the trace id for the second stage, and renders the answer exactly as the
//! server does for a legacy session (the result parsed once, its pretty
//! text, the structured content, the trace id in `_meta`). The second
//! stage checks that the params are one JSON object, builds the HTTP
//! request the network executor sends (its headers, the trace id, the
//! token), reads the response head for its length, parses the body once
//! for the envelope's `status` and `retcode` (it answers successes only),
//! and frames the body back. The bench checks that its answer is the
//! server's byte for byte, but for the trace id.
//!
//! Left out, as none of it changes the bytes of a successful read: the
//! MCP session (lifecycle, calls in flight, cancellation), the gates
//! (mode, policy, scope, pacing, idempotency, audit), the diagnostic line,
//! every error path, and the generality of a protocol between processes
//! that carries every request. What the server adds beyond this floor is
//! what those cost, not what its answer needs.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// A `tools/call` request line, borrowed from the line.
#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    method: &'a str,
    #[serde(borrow)]
    params: CallParams<'a>,
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: &'a str,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

/// `query_action`'s arguments.
#[derive(Deserialize)]
struct QueryArgs<'a> {
    #[serde(borrow)]
    action: &'a str,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// The two fields of a OneBot envelope that decide the outcome.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    status: Option<&'a str>,
    #[serde(default)]
    retcode: Option<i64>,
}

/// The answer of a successful call, as the server writes it.
#[derive(Serialize)]
struct Answer<'a> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    result: AnswerResult<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AnswerResult<'a> {
    content: [Text<'a>; 1],
    structured_content: Structured<'a>,
    is_error: bool,
    #[serde(rename = "_meta")]
    meta: Meta<'a>,
}

#[derive(Serialize)]
struct Text<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct Structured<'a> {
    result: &'a Value,
    diagnostics: Diagnostics,
}

#[derive(Serialize)]
struct Diagnostics {
    outcome: &'static str,
}

#[derive(Serialize)]
struct Meta<'a> {
    traceparent: &'a str,
}

/// A trace id of the server's shape (`00-<32 hex>-<16 hex>-01`), from a
/// xorshift generator: less work than the server's, which hands out bytes
/// of a pool it fills from the kernel (one system call per 170 calls).
struct TraceIds(super::Xorshift);

impl TraceIds {
    fn next(&mut self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        for (n, word) in [self.0.next(), self.0.next(), self.0.next()].into_iter().enumerate() {
            if n == 2 {
                s.push('-');
            }
            for b in word.to_be_bytes() {
                s.push(HEX[usize::from(b >> 4)] as char);
                s.push(HEX[usize::from(b & 15)] as char);
            }
        }
        s.push_str("-01");
        s
    }
}

/// One frame between the stages: a 4-byte length, then the payload.
async fn read_frame(from: &mut (impl AsyncReadExt + Unpin), buf: &mut Vec<u8>) -> bool {
    let mut len = [0u8; 4];
    if from.read_exact(&mut len).await.is_err() {
        return false;
    }
    buf.resize(u32::from_le_bytes(len) as usize, 0);
    from.read_exact(buf).await.unwrap();
    true
}

fn frame(parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

pub(crate) fn relay(first_stage: bool, host: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        if first_stage {
            let super::FirstStage { mut input, mut out, mut next, mut from_next, mut to_next } =
                super::FirstStage::start("--relay-work-http", host);
            let mut ids = TraceIds(super::Xorshift(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id())));
            let (mut line, mut reply) = (Vec::new(), Vec::new());
            while input.read_until(b'\n', &mut line).await.unwrap() > 0 {
                let call: Call = serde_json::from_slice(line.trim_ascii()).unwrap();
                assert!(call.jsonrpc == "2.0" && call.method == "tools/call" && call.params.name == "query_action");
                let args: QueryArgs = serde_json::from_str(call.params.arguments.get()).unwrap();
                let params = args.params.map_or("{}", RawValue::get);
                let trace = ids.next();
                let request = frame(&[args.action.as_bytes(), b"\0", trace.as_bytes(), b"\0", params.as_bytes()]);
                to_next.write_all(&request).await.unwrap();
                assert!(read_frame(&mut from_next, &mut reply).await);
                let result: Value = serde_json::from_slice(&reply).unwrap();
                let mut text = Vec::with_capacity(reply.len() * 2);
                serde_json::to_writer_pretty(&mut text, &result).unwrap();
                let answer = Answer {
                    jsonrpc: "2.0",
                    id: call.id,
                    result: AnswerResult {
                        content: [Text { kind: "text", text: std::str::from_utf8(&text).unwrap() }],
                        structured_content: Structured {
                            result: &result,
                            diagnostics: Diagnostics { outcome: "success" },
                        },
                        is_error: false,
                        meta: Meta { traceparent: &trace },
                    },
                };
                let mut bytes = Vec::with_capacity(text.len() * 2 + reply.len() + 256);
                serde_json::to_writer(&mut bytes, &answer).unwrap();
                bytes.push(b'\n');
                out.write_all(&bytes).await.unwrap();
                line.clear();
            }
            // Both halves closed, so that the second stage sees the end.
            drop((from_next, to_next));
            let _ = next.wait();
        } else {
            let super::SecondStage { mut input, mut out, mut conn } = super::SecondStage::start(host).await;
            // What the network executor's requests start with.
            let prefix = format!(
                "POST / HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json\r\n"
            );
            let (mut request, mut header) = (Vec::new(), String::new());
            while read_frame(&mut input, &mut request).await {
                let mut parts = request.splitn(3, |b| *b == 0);
                let (action, trace, params) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                let params = std::str::from_utf8(params).unwrap();
                assert!(params.starts_with('{') && serde_json::from_str::<serde::de::IgnoredAny>(params).is_ok());
                let mut body = Vec::with_capacity(action.len() + params.len() + 32);
                body.extend_from_slice(br#"{"action":"#);
                serde_json::to_writer(&mut body, std::str::from_utf8(action).unwrap()).unwrap();
                body.extend_from_slice(br#","params":"#);
                body.extend_from_slice(params.as_bytes());
                body.push(b'}');
                let mut http = Vec::with_capacity(prefix.len() + 160 + body.len());
                http.extend_from_slice(prefix.as_bytes());
                http.extend_from_slice(b"traceparent: ");
                http.extend_from_slice(trace);
                http.extend_from_slice(b"\r\nauthorization: Bearer t\r\ncontent-length: ");
                http.extend_from_slice(body.len().to_string().as_bytes());
                http.extend_from_slice(b"\r\n\r\n");
                http.extend_from_slice(&body);
                conn.get_mut().write_all(&http).await.unwrap();
                let len = super::read_head(&mut conn, &mut header).await;
                let mut reply = vec![0u8; len + 4];
                conn.read_exact(&mut reply[4..]).await.unwrap();
                // The server classifies every answer by its envelope; this
                // floor renders successes only.
                let envelope: Envelope = serde_json::from_slice(&reply[4..]).unwrap();
                assert!(envelope.status == Some("ok") && envelope.retcode == Some(0), "not a success");
                reply[..4].copy_from_slice(&(len as u32).to_le_bytes());
                out.write_all(&reply).await.unwrap();
            }
        }
    });
}
