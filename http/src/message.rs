//! JSON-RPC messages as the HTTP front handles them. The front routes and
//! rewrites messages; it never needs their contents. So only the envelope is
//! read (the id, the method and the few `params`/`_meta`/`result` keys that
//! routing and the header checks look at), in place, borrowing the text;
//! everything else is skipped while it is validated, and a message is
//! relayed as its own bytes with the ids spliced in. Expanding a client's
//! 8 MiB body into a `serde_json::Value` tree cost hundreds of MiB.
//!
//! What a parse keeps is bounded whatever the message: ids and progress
//! tokens up to [`MAX_ID_BYTES`] of JSON text, method names up to
//! [`MAX_METHOD_BYTES`], a `name` or `uri` up to [`MAX_NAME_BYTES`].

use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
// An optional field whose presence counts even when it is `null`.
use snowluma_proto::json::present;

/// Longest id or progress token kept (its JSON text).
pub const MAX_ID_BYTES: usize = 1024;
/// Longest method name.
const MAX_METHOD_BYTES: usize = 1024;
/// Longest `name`/`uri` kept for the comparison with `Mcp-Name`; a longer
/// one cannot equal a header, which is at most 64 KiB with all the others.
const MAX_NAME_BYTES: usize = 64 * 1024;

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(borrow, default, rename = "_meta", deserialize_with = "present")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requestId", deserialize_with = "present")]
    request_id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "progressToken", deserialize_with = "present")]
    progress_token: Option<&'a RawValue>,
    /// The session's marker: the server request it is about.
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "relatedRequestId", deserialize_with = "present")]
    related: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "progressToken", deserialize_with = "present")]
    progress_token: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion", deserialize_with = "present")]
    protocol_version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities", deserialize_with = "present")]
    client_capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/subscriptionId", deserialize_with = "present")]
    subscription_id: Option<&'a RawValue>,
}

/// `result` or `error`: only their `_meta` and `code` matter here.
#[derive(Deserialize, Default)]
struct Outcome<'a> {
    #[serde(borrow, default, rename = "_meta", deserialize_with = "present")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    code: Option<&'a RawValue>,
}

/// An object member parsed as `T`; anything but an object is `T::default()`
/// (as if it had none of the keys), a malformed one (a repeated key) `Err`.
fn object<'a, T: Deserialize<'a> + Default>(raw: Option<&'a RawValue>) -> Result<T, serde_json::Error> {
    match raw {
        Some(r) if r.get().starts_with('{') => serde_json::from_str(r.get()),
        _ => Ok(T::default()),
    }
}

/// Where `raw` sits in `base` (it was parsed from it).
fn span(base: &str, raw: &RawValue) -> Option<Range<usize>> {
    let start = (raw.get().as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(raw.get().len())?;
    (end <= base.len()).then_some(start..end)
}

/// A JSON string's value, if `raw` is a string of at most `limit` bytes of text.
fn text(raw: &RawValue, limit: usize) -> Option<String> {
    (raw.get().len() <= limit && raw.get().starts_with('"')).then(|| serde_json::from_str(raw.get()).ok()).flatten()
}

/// An id (of a request, or the one a cancellation names) as the front keeps
/// it: where it is in the message, its JSON text, and its value (to compare).
#[derive(Debug, Clone)]
pub struct Id {
    pub span: Range<usize>,
    pub raw: Bytes,
    pub value: Value,
}

fn id(base: &str, raw: &RawValue) -> Result<Id, Refusal> {
    if raw.get().len() > MAX_ID_BYTES {
        return Err(Refusal::Invalid("an id is longer than 1024 bytes"));
    }
    let span = span(base, raw).ok_or(Refusal::Invalid("malformed message"))?;
    let value = serde_json::from_str(raw.get()).map_err(|_| Refusal::Invalid("malformed message"))?;
    Ok(Id { span, raw: Bytes::copy_from_slice(raw.get().as_bytes()), value })
}

/// Why a client message is refused: not JSON (`-32700`), or not a usable
/// JSON-RPC message (`-32600`).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Parse,
    Invalid(&'static str),
}

/// `params.name` or `params.uri`, for the comparison with `Mcp-Name`.
#[derive(Debug, PartialEq, Eq)]
pub enum Named {
    /// Not there, or not a string.
    Absent,
    Text(String),
    /// A string too long to equal any header.
    TooLong,
}

fn named(raw: Option<&RawValue>) -> Named {
    match raw {
        Some(r) if r.get().starts_with('"') => match text(r, MAX_NAME_BYTES) {
            Some(t) => Named::Text(t),
            None if r.get().len() > MAX_NAME_BYTES => Named::TooLong,
            None => Named::Absent,
        },
        _ => Named::Absent,
    }
}

/// What the front needs of a client's message.
#[derive(Debug)]
pub struct ClientMessage {
    pub method: Option<String>,
    /// The id, when the message has one (`null` included).
    pub id: Option<Id>,
    /// `_meta` has the protocol version key (whatever its value).
    pub version_key: bool,
    /// ... and its value, when it is a string.
    pub version: Option<String>,
    /// `_meta` has the client's capabilities as an object.
    pub capabilities_object: bool,
    pub progress: Option<Value>,
    pub name: Named,
    pub uri: Named,
    /// `params.requestId` (what a `notifications/cancelled` names).
    pub request_id: Option<Id>,
}

impl ClientMessage {
    pub fn is_request(&self) -> bool {
        self.method.is_some() && self.id.is_some()
    }
}

/// Read a client message's envelope from its body.
pub fn client(body: &[u8]) -> Result<ClientMessage, Refusal> {
    let src = std::str::from_utf8(body).map_err(|_| Refusal::Parse)?;
    let bad = || Refusal::Invalid("one JSON-RPC 2.0 message per POST");
    let env: Envelope<'_> = serde_json::from_str(src).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad(),
        _ => Refusal::Parse,
    })?;
    // (A derived struct also takes an array, by position.)
    if !src.trim_start().starts_with('{') {
        return Err(bad());
    }
    if env.jsonrpc.and_then(|r| text(r, 16)).as_deref() != Some("2.0") {
        return Err(bad());
    }
    let method = match env.method {
        None => None,
        Some(r) => match text(r, MAX_METHOD_BYTES) {
            Some(m) => Some(m),
            None => return Err(Refusal::Invalid("the method must be a string of at most 1024 bytes")),
        },
    };
    let params: Params<'_> = object(env.params).map_err(|_| Refusal::Invalid("malformed params"))?;
    let meta: Meta<'_> = object(params.meta).map_err(|_| Refusal::Invalid("malformed _meta"))?;
    let progress = match meta.progress_token {
        Some(r) if r.get().len() > MAX_ID_BYTES => {
            return Err(Refusal::Invalid("a progressToken is longer than 1024 bytes"));
        }
        Some(r) => serde_json::from_str(r.get()).ok(),
        None => None,
    };
    Ok(ClientMessage {
        method,
        id: env.id.map(|r| id(src, r)).transpose()?,
        version_key: meta.protocol_version.is_some(),
        version: meta.protocol_version.and_then(|r| text(r, MAX_METHOD_BYTES)),
        capabilities_object: meta.client_capabilities.is_some_and(|r| r.get().starts_with('{')),
        progress,
        name: named(params.name),
        uri: named(params.uri),
        request_id: params.request_id.map(|r| id(src, r)).transpose()?,
    })
}

/// Blank out the line breaks of a JSON text that parsed: outside strings
/// they are only whitespace, and inside strings they cannot occur (they are
/// escaped), so the text is then one line with the same meaning.
pub fn one_line(body: &mut [u8]) {
    for b in body.iter_mut() {
        if matches!(*b, b'\n' | b'\r') {
            *b = b' ';
        }
    }
}

/// A JSON number, as its text.
fn number(raw: &RawValue) -> Option<u64> {
    raw.get().parse().ok()
}

/// What the front needs of a message its session wrote.
#[derive(Debug, Default)]
pub struct ServerMessage {
    pub method: Option<String>,
    /// The id of a response (ours: a number) or of a server request.
    pub id: Option<Id>,
    /// A response's `error.code`.
    pub error_code: Option<i64>,
    /// A progress notification's token.
    pub progress: Option<Value>,
    /// `_meta`'s subscription id (of a notification, or of a response).
    pub subscription: Option<(Range<usize>, u64)>,
    /// A cancellation's `requestId`, when it is one of ours.
    pub request_id: Option<(Range<usize>, u64)>,
    /// The session's marker ([`super::RELATED_METHOD`]): the server request
    /// (its id's JSON text) and the request it was made for.
    pub related: Option<(Bytes, u64)>,
}

/// Read the envelope of a line the session wrote; `None` if it is not a
/// JSON-RPC object (the session never writes one).
pub fn server(line: &[u8]) -> Option<ServerMessage> {
    let src = std::str::from_utf8(line).ok()?;
    if !src.trim_start().starts_with('{') {
        return None;
    }
    let env: Envelope<'_> = serde_json::from_str(src.trim_end()).ok()?;
    let method = env.method.and_then(text_of);
    let params: Params<'_> = object(env.params).ok()?;
    let meta: Meta<'_> = object(params.meta).ok()?;
    let outcome: Outcome<'_> = object(env.result.or(env.error)).ok()?;
    let result_meta: Meta<'_> = object(outcome.meta).ok()?;
    let numbered = |r: Option<&RawValue>| r.and_then(|r| Some((span(src, r)?, number(r)?)));
    let related = match (method.as_deref(), params.id, params.related) {
        (Some(super::RELATED_METHOD), Some(i), Some(r)) if i.get().len() <= MAX_ID_BYTES => {
            Some((Bytes::copy_from_slice(i.get().as_bytes()), number(r)?))
        }
        _ => None,
    };
    Some(ServerMessage {
        error_code: env.error.and(outcome.code).and_then(|c| c.get().parse().ok()),
        id: env.id.and_then(|r| id(src, r).ok()),
        progress: params
            .progress_token
            .filter(|r| r.get().len() <= MAX_ID_BYTES)
            .and_then(|r| serde_json::from_str(r.get()).ok()),
        subscription: numbered(meta.subscription_id).or_else(|| numbered(result_meta.subscription_id)),
        request_id: numbered(params.request_id),
        related,
        method,
    })
}

fn text_of(raw: &RawValue) -> Option<String> {
    text(raw, MAX_METHOD_BYTES)
}

/// `line` with each of `edits` (a place in it, and what goes there) applied,
/// as pieces that share the line's buffer: nothing large is copied.
pub fn splice(line: &Bytes, mut edits: Vec<(Range<usize>, Bytes)>) -> Vec<Bytes> {
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(edits.len() * 2 + 1);
    let mut at = 0;
    for (r, with) in edits {
        // Edits never overlap (distinct members); one that would is skipped.
        if r.start < at || r.end > line.len() {
            continue;
        }
        if r.start > at {
            out.push(line.slice(at..r.start));
        }
        out.push(with);
        at = r.end;
    }
    if at < line.len() {
        out.push(line.slice(at..));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn a_client_message_is_read_in_place() {
        let body = br#"{"jsonrpc":"2.0","id":"call-1","method":"tools/call","params":{"name":"get_action","arguments":{"big":[1,2,3]},"_meta":{"progressToken":7,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let m = client(body).unwrap();
        assert!(m.is_request());
        assert_eq!(m.method.as_deref(), Some("tools/call"));
        let id = m.id.unwrap();
        assert_eq!(&body[id.span.clone()], br#""call-1""#);
        assert_eq!(id.value, json!("call-1"));
        assert_eq!(m.progress, Some(json!(7)));
        assert_eq!(m.version.as_deref(), Some("2026-07-28"));
        assert!(m.version_key && m.capabilities_object);
        assert_eq!(m.name, Named::Text("get_action".into()));
        assert_eq!(m.uri, Named::Absent);
    }

    #[test]
    fn refusals_are_parse_or_invalid() {
        assert_eq!(client(b"{").unwrap_err(), Refusal::Parse);
        assert_eq!(client(b"{} x").unwrap_err(), Refusal::Parse);
        assert_eq!(client(b"\xff").unwrap_err(), Refusal::Parse);
        for bad in [
            &br#"[1]"#[..],
            br#"["2.0", 1, "tools/list"]"#,
            br#"{"id":1,"method":"x"}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"name":"a","name":"b"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"progressToken":1,"progressToken":2}}}"#,
        ] {
            assert!(matches!(client(bad), Err(Refusal::Invalid(_))), "{}", String::from_utf8_lossy(bad));
        }
        let long_id = format!(r#"{{"jsonrpc":"2.0","id":"{}","method":"x"}}"#, "a".repeat(2000));
        assert!(matches!(client(long_id.as_bytes()), Err(Refusal::Invalid(_))));
        // Whatever else the params hold, only the envelope is kept.
        let escaped = br#"{"jsonrpc":"2\u002e0","id":null,"method":"tools/list","params":[1]}"#;
        let m = client(escaped).unwrap();
        assert!(m.is_request() && m.id.unwrap().value.is_null() && !m.version_key);
    }

    #[test]
    fn a_long_name_cannot_match() {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{}"}}}}"#, "n".repeat(70_000));
        assert_eq!(client(body.as_bytes()).unwrap().name, Named::TooLong);
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#;
        assert_eq!(client(body).unwrap().name, Named::Absent);
    }

    #[test]
    fn line_breaks_become_spaces() {
        let mut body = b"{\r\n \"jsonrpc\": \"2.0\",\n \"method\": \"a\\nb\"\n}".to_vec();
        let before: Value = serde_json::from_slice(&body).unwrap();
        one_line(&mut body);
        assert!(!body.contains(&b'\n') && !body.contains(&b'\r'));
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), before);
    }

    #[test]
    fn server_messages_are_routed_and_spliced() {
        let line = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":12,"result":{"content":[{"type":"text","text":"x"}],"_meta":{"io.modelcontextprotocol/subscriptionId":12}}}"#,
        );
        let m = server(&line).unwrap();
        assert!(m.method.is_none());
        let id = m.id.unwrap();
        assert_eq!(id.value, json!(12));
        let (sub, n) = m.subscription.unwrap();
        assert_eq!(n, 12);
        let out = splice(&line, vec![(sub, Bytes::from_static(b"\"l-1\"")), (id.span, Bytes::from_static(b"\"c\""))]);
        let joined: Vec<u8> = out.concat();
        let v: Value = serde_json::from_slice(&joined).unwrap();
        assert_eq!(v["id"], "c");
        assert_eq!(v["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "l-1");
        assert_eq!(v["result"]["content"][0]["text"], "x");

        let err = server(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"m"}}"#).unwrap();
        assert_eq!(err.error_code, Some(-32601));
        let progress = server(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}"#,
        )
        .unwrap();
        assert_eq!(progress.progress, Some(json!("p")));
        let cancelled =
            server(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,"reason":"r"}}"#)
                .unwrap();
        assert_eq!(cancelled.request_id.map(|(_, n)| n), Some(9));
        let marker = format!(
            r#"{{"jsonrpc":"2.0","method":"{}","params":{{"id":0,"relatedRequestId":5}}}}"#,
            super::super::RELATED_METHOD
        );
        let related = server(marker.as_bytes()).unwrap().related.unwrap();
        assert_eq!((&related.0[..], related.1), (&b"0"[..], 5));
        assert!(server(b"[1]").is_none());
    }
}
