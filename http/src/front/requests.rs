//! One request past the door: its path, `Host`, `Origin` and token, then
//! its method (POST, GET, DELETE); a POST's era (a legacy session, or the
//! modern transport whose headers mirror the body), its tree, and the
//! relay of its message and of the answer (JSON or an event stream).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::Value;

use super::accept::Conn;
use super::auth::{authenticate, header_list, header_str, host_ok, origin_ok, strict_head};
use super::limits::{BodyCharge, acquire_request, read_body};
use super::responses::{Body, empty, json_message, rpc_error, too_many, unauthorized};
use super::sessions::{end_tree, spawn_tree};
use super::sse::sse;
use super::{LEGACY_VERSIONS, Shared};
use crate::message::{self, ClientMessage, Named, Refusal};
use crate::relay::{ClientRequest, Kind, Tree};
use snowluma_proto::front::TokenDigest;

/// (hyper itself refuses what it cannot frame: an invalid or conflicting
/// `Content-Length`, a final coding other than chunked, malformed chunks;
/// and it closes the connection after a request with both
/// `Transfer-Encoding` and `Content-Length`, as RFC 9112 §6.3 requires.)
pub(super) async fn handle(shared: Arc<Shared>, conn: Arc<Conn>, req: Request<Incoming>) -> Response<Body> {
    match strict_head(&req) {
        Ok(()) => checked(shared, conn, req).await,
        Err(r) => r,
    }
}

async fn checked(shared: Arc<Shared>, conn: Arc<Conn>, req: Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/mcp" {
        return empty(StatusCode::NOT_FOUND);
    }
    if !host_ok(&shared, req.headers()) || !origin_ok(&shared, req.headers()) {
        return rpc_error(StatusCode::FORBIDDEN, Value::Null, -32000, "Forbidden");
    }
    let Some(token) = authenticate(&shared, req.headers()) else {
        return unauthorized();
    };
    conn.authenticated.store(true, Ordering::Release);
    match *req.method() {
        Method::POST => post(shared, conn, token, req).await,
        Method::GET => get(shared, token.id, req.headers()),
        Method::DELETE => delete(shared, token.id, req.headers()).await,
        _ => {
            let mut r = empty(StatusCode::METHOD_NOT_ALLOWED);
            r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

fn legacy_session(shared: &Shared, token_id: &str, h: &HeaderMap) -> Result<Arc<Tree>, Response<Body>> {
    let sid = header_str(h, "mcp-session-id").unwrap_or_default();
    let tree = shared.sessions.lock().ok().and_then(|s| s.get(sid).cloned());
    match tree {
        // A session id is not a credential: another token's session is
        // unknown to this one.
        Some(t) if t.token_id == token_id && !t.ended.is_cancelled() => Ok(t),
        _ => Err(rpc_error(StatusCode::NOT_FOUND, Value::Null, -32001, "Session not found")),
    }
}

pub(super) fn get(shared: Arc<Shared>, token_id: String, h: &HeaderMap) -> Response<Body> {
    if h.get("mcp-session-id").is_none() {
        return empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    let tree = match legacy_session(&shared, &token_id, h) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !header_list(h, header::ACCEPT).contains("text/event-stream") {
        return empty(StatusCode::NOT_ACCEPTABLE);
    }
    let Some(guard) = acquire_request(&shared, &token_id) else {
        return too_many("Too many concurrent requests for this token");
    };
    match tree.open_get_stream() {
        Some(rx) => sse(None, rx, guard),
        None => rpc_error(StatusCode::CONFLICT, Value::Null, -32000, "A stream is already open for this session"),
    }
}

async fn delete(shared: Arc<Shared>, token_id: String, h: &HeaderMap) -> Response<Body> {
    // Without a session id this is a modern client's probe: no sessions.
    if h.get("mcp-session-id").is_none() {
        return empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    match legacy_session(&shared, &token_id, h) {
        Ok(t) => {
            end_tree(&shared, &t).await;
            empty(StatusCode::OK)
        }
        Err(r) => r,
    }
}

/// `Mcp-Name` may be `=?base64?…?=`.
fn decode_header_value(v: &str) -> Option<String> {
    match v.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(b64) => {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(v.to_owned()),
    }
}

/// The 2026-07-28 transport's header rules (SEP-2243): the headers mirror
/// the body, or the request is refused with `HeaderMismatch`.
fn check_modern_headers(h: &HeaderMap, msg: &ClientMessage) -> Result<(), String> {
    match (header_str(h, "mcp-protocol-version"), msg.version.as_deref()) {
        (None, _) => return Err("the MCP-Protocol-Version header is missing".into()),
        (Some(hv), Some(bv)) if hv != bv => {
            return Err("the MCP-Protocol-Version header does not match the request's protocolVersion".into());
        }
        _ => {}
    }
    let method = msg.method.as_deref().unwrap_or_default();
    match header_str(h, "mcp-method") {
        None => return Err("the Mcp-Method header is missing".into()),
        Some(m) if m != method => return Err("the Mcp-Method header does not match the request's method".into()),
        _ => {}
    }
    let name = match method {
        "tools/call" | "prompts/get" => &msg.name,
        "resources/read" => &msg.uri,
        _ => return Ok(()),
    };
    match (header_str(h, "mcp-name").map(decode_header_value), name) {
        (None, Named::Text(_) | Named::TooLong) => Err("the Mcp-Name header is missing".into()),
        (Some(None), _) => Err("the Mcp-Name header is malformed".into()),
        (Some(Some(_)), Named::TooLong) => Err("the Mcp-Name header does not match the request".into()),
        (Some(Some(hv)), Named::Text(bv)) if hv != *bv => Err("the Mcp-Name header does not match the request".into()),
        _ => Ok(()),
    }
}

/// A POST being answered: who sent it, its head, and what answer it takes.
struct Post {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    token: TokenDigest,
    headers: HeaderMap,
    /// The client takes an event stream.
    wants_sse: bool,
}

async fn post(shared: Arc<Shared>, conn: Arc<Conn>, token: TokenDigest, req: Request<Incoming>) -> Response<Body> {
    let headers = req.headers().clone();
    let wants_sse = match negotiate(&headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let relayed = match read_message(&shared, &token.id, req).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let post = Post { shared, conn, token, headers, wants_sse };
    if post.headers.contains_key("mcp-session-id") {
        return post.in_legacy_session(relayed).await;
    }
    // A message of the modern era: its header or its `_meta` names a
    // revision the legacy era does not have.
    let modern_signal = relayed.msg.version_key
        || header_str(&post.headers, "mcp-protocol-version").is_some_and(|v| !LEGACY_VERSIONS.contains(&v));
    let is_request = relayed.msg.is_request();
    // `initialize` opens a legacy session; sent the modern way it is a
    // method that revision removed, answered by a tree (-32601, 404).
    if relayed.msg.method.as_deref() == Some("initialize") && is_request && !modern_signal {
        return post.open_legacy_session(relayed).await;
    }
    if !modern_signal {
        let id = id_of(&relayed.msg);
        return rpc_error(StatusCode::BAD_REQUEST, id, -32600, "Bad Request: Mcp-Session-Id header is required");
    }
    if !is_request {
        return post.modern_notification(relayed).await;
    }
    post.modern_request(relayed).await
}

/// `Accept` and `Content-Type`: whether the client takes an event stream,
/// or the refusal (406, 415).
fn negotiate(headers: &HeaderMap) -> Result<bool, Response<Body>> {
    let accept = header_list(headers, header::ACCEPT).to_ascii_lowercase();
    let any = accept.is_empty() || accept.contains("*/*");
    let wants_sse = any || accept.contains("text/event-stream");
    if !(any || wants_sse || accept.contains("application/json")) {
        return Err(rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            Value::Null,
            -32000,
            "Not Acceptable: accept application/json and text/event-stream",
        ));
    }
    let json_body = header_str(headers, "content-type")
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Err(rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Value::Null,
            -32000,
            "Unsupported Media Type: application/json",
        ));
    }
    Ok(wants_sse)
}

/// Read the body and its envelope (400 for what is not one JSON-RPC
/// message); the body becomes one line.
async fn read_message(shared: &Arc<Shared>, token_id: &str, req: Request<Incoming>) -> Result<Relayed, Response<Body>> {
    let (mut body, charge) = read_body(shared, token_id, req).await?;
    // Only the envelope is read; the body goes on as the client sent it.
    let msg = match message::client(&body) {
        Ok(m) => m,
        Err(Refusal::Parse) => return Err(rpc_error(StatusCode::BAD_REQUEST, Value::Null, -32700, "Parse error")),
        Err(Refusal::Invalid(why)) => {
            return Err(rpc_error(StatusCode::BAD_REQUEST, Value::Null, -32600, &format!("Invalid Request: {why}")));
        }
    };
    message::one_line(&mut body);
    Ok(Relayed { body, msg, charge })
}

/// The message's id as the client wrote it (`null` without one).
fn id_of(msg: &ClientMessage) -> Value {
    msg.id.as_ref().map(|i| i.value.clone()).unwrap_or(Value::Null)
}

impl Post {
    /// A message in an open legacy session (`Mcp-Session-Id`).
    async fn in_legacy_session(&self, relayed: Relayed) -> Response<Body> {
        let tree = match legacy_session(&self.shared, &self.token.id, &self.headers) {
            Ok(t) => t,
            Err(r) => return r,
        };
        let legacy_version = match header_str(&self.headers, "mcp-protocol-version") {
            None => true,
            Some(v) => LEGACY_VERSIONS.contains(&v),
        };
        if !legacy_version {
            let id = id_of(&relayed.msg);
            return rpc_error(StatusCode::BAD_REQUEST, id, -32600, "Unsupported MCP-Protocol-Version");
        }
        self.relay(&tree, relayed, Era::Legacy, None).await
    }

    /// A legacy `initialize`: a new tree and session id.
    async fn open_legacy_session(&self, relayed: Relayed) -> Response<Body> {
        let tree = match spawn_tree(&self.shared, &self.token, &self.conn.peer).await {
            Ok(t) => t,
            Err(r) => return r,
        };
        let sid = snowluma_proto::bytes::hex(&snowluma_proto::bytes::random_bytes::<16>());
        if let Ok(mut s) = self.shared.sessions.lock() {
            s.insert(sid.clone(), tree.clone());
        }
        tracing::info!(session = tree.session, token_id = %self.token.id, "serve-http: legacy session opened");
        self.relay(&tree, relayed, Era::Legacy, Some(sid)).await
    }

    /// A modern notification (a `notifications/cancelled` naming one of
    /// this client's requests) goes to the client's tree, if it has one;
    /// there is nothing else to do with it (no sessions, no responses to
    /// server requests in this era).
    async fn modern_notification(&self, relayed: Relayed) -> Response<Body> {
        let key = (self.token.id.clone(), self.conn.host.clone());
        let tree = self.shared.modern.lock().await.get(&key).cloned();
        if let Some(tree) = tree
            && !tree.ended.is_cancelled()
        {
            let Relayed { body, msg, charge } = relayed;
            tree.forward(body, cancels(&msg), charge).await;
        }
        empty(StatusCode::ACCEPTED)
    }

    /// A modern request: its headers must mirror its body; it goes to the
    /// tree of its token and client host.
    async fn modern_request(&self, relayed: Relayed) -> Response<Body> {
        if let Err(why) = check_modern_headers(&self.headers, &relayed.msg) {
            let id = id_of(&relayed.msg);
            return rpc_error(StatusCode::BAD_REQUEST, id, -32020, &format!("Header mismatch: {why}"));
        }
        let tree = match self.modern_tree().await {
            Ok(t) => t,
            Err(r) => return r,
        };
        // A request without the `_meta` every modern request carries is
        // rejected by the session (-32602), and over HTTP with a 400.
        let meta_complete = relayed.msg.version.is_some() && relayed.msg.capabilities_object;
        self.relay(&tree, relayed, Era::Modern { meta_complete }, None).await
    }

    /// The modern era has no sessions: its state lives in explicit handles
    /// (event resource URIs, requestState) that a client may use from any of
    /// its connections, and an HTTP/1.1 client needs several connections for
    /// concurrent requests (a subscriptions/listen stream and its calls).
    /// So the modern requests of one token from one client host share one
    /// tree; other tokens and other hosts never do.
    async fn modern_tree(&self) -> Result<Arc<Tree>, Response<Body>> {
        let mut modern = self.shared.modern.lock().await;
        let key = (self.token.id.clone(), self.conn.host.clone());
        match modern.get(&key) {
            Some(t) if !t.ended.is_cancelled() => Ok(t.clone()),
            _ => {
                let t = spawn_tree(&self.shared, &self.token, &self.conn.host).await?;
                modern.insert(key, t.clone());
                Ok(t)
            }
        }
    }

    /// Relay the message to `tree` and its answer back: JSON, or an event
    /// stream (`session_id`: the new legacy session's, as a header).
    async fn relay(&self, tree: &Arc<Tree>, relayed: Relayed, era: Era, session_id: Option<String>) -> Response<Body> {
        let (shared, token_id, wants_sse) = (&self.shared, self.token.id.as_str(), self.wants_sse);
        let modern = matches!(era, Era::Modern { .. });
        let Relayed { body, msg, charge } = relayed;
        let (Some(client_id), true) = (msg.id.clone(), msg.is_request()) else {
            return if tree.forward(body, cancels(&msg), charge).await {
                empty(StatusCode::ACCEPTED)
            } else {
                rpc_error(StatusCode::SERVICE_UNAVAILABLE, Value::Null, -32603, "The session has ended")
            };
        };
        let id = client_id.value.clone();
        let Some(mut guard) = acquire_request(shared, token_id) else {
            return too_many("Too many concurrent requests for this token");
        };
        let req = ClientRequest { body, id: client_id, progress: msg.progress, sse: wants_sse };
        let Some(sent) = tree.request(req, charge).await else {
            guard.done = true;
            return rpc_error(StatusCode::SERVICE_UNAVAILABLE, id, -32603, "The session has ended");
        };
        guard.relay = Some((tree.clone(), sent.internal, modern));
        let mut rx = sent.rx;
        let mut response = loop {
            match rx.recv().await {
                // Cancelled by the client (no answer comes): an empty stream.
                None if !tree.ended.is_cancelled() && wants_sse => {
                    guard.done = true;
                    break sse(None, rx, guard);
                }
                None => {
                    guard.done = true;
                    break rpc_error(StatusCode::SERVICE_UNAVAILABLE, id, -32603, "The session ended before answering");
                }
                Some(m) if m.kind == Kind::Response => {
                    guard.done = true;
                    let status = match era {
                        Era::Modern { meta_complete } => modern_status(m.error_code, meta_complete),
                        Era::Legacy => StatusCode::OK,
                    };
                    break json_message(status, m);
                }
                Some(m) if wants_sse => break sse(Some(m), rx, guard),
                // A client that takes only JSON gets the response alone.
                Some(_) => continue,
            }
        };
        if let Some(sid) = session_id
            && let Ok(v) = HeaderValue::from_str(&sid)
        {
            response.headers_mut().insert("mcp-session-id", v);
        }
        response
    }
}

/// A client message on its way to a tree: its body (one line), what the
/// front read of it, and its place in the budgets.
struct Relayed {
    body: Vec<u8>,
    msg: ClientMessage,
    charge: BodyCharge,
}

/// The id a `notifications/cancelled` names, to be translated.
pub(super) fn cancels(msg: &ClientMessage) -> Option<message::Id> {
    (msg.method.as_deref() == Some("notifications/cancelled")).then(|| msg.request_id.clone()).flatten()
}

/// The era a relayed request belongs to, as far as its HTTP answer goes.
#[derive(Clone, Copy)]
enum Era {
    Legacy,
    /// `meta_complete`: the request's `_meta` has the keys every modern
    /// request must carry.
    Modern {
        meta_complete: bool,
    },
}

/// HTTP status of a modern error answer (the transport's mapping): an
/// invalid-params error is a 400 only when it is about the request's
/// missing `_meta` (other invalid params, such as an unknown resource,
/// are answers like any other).
fn modern_status(error_code: Option<i64>, meta_complete: bool) -> StatusCode {
    match error_code {
        Some(-32601) => StatusCode::NOT_FOUND,
        Some(-32022..=-32020) => StatusCode::BAD_REQUEST,
        Some(-32602) if !meta_complete => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn modern_headers_mirror_the_body() {
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_action",
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        let msg = message::client(&serde_json::to_vec(&msg).unwrap()).unwrap();
        let ok = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "get_action")];
        assert!(check_modern_headers(&headers(&ok), &msg).is_ok());
        let b64 = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?Z2V0X2FjdGlvbg==?="),
        ];
        assert!(check_modern_headers(&headers(&b64), &msg).is_ok());
        for bad in [
            &[("mcp-method", "tools/call"), ("mcp-name", "get_action")][..],
            &[("mcp-protocol-version", "2025-11-25"), ("mcp-method", "tools/call"), ("mcp-name", "get_action")],
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-name", "get_action")],
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list"), ("mcp-name", "get_action")],
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call")],
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "other")],
            &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "=?base64?!!?=")],
        ] {
            assert!(check_modern_headers(&headers(bad), &msg).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn modern_errors_map_to_their_http_status() {
        assert_eq!(modern_status(Some(-32601), true), StatusCode::NOT_FOUND);
        assert_eq!(modern_status(Some(-32022), true), StatusCode::BAD_REQUEST);
        assert_eq!(modern_status(Some(-32020), true), StatusCode::BAD_REQUEST);
        assert_eq!(modern_status(Some(-32602), true), StatusCode::OK);
        assert_eq!(modern_status(Some(-32602), false), StatusCode::BAD_REQUEST);
        assert_eq!(modern_status(None, false), StatusCode::OK);
    }
}
