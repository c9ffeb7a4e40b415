//! The HTTP answers the front builds: plain and JSON-RPC error bodies,
//! 401 and 429 with their headers, a refused head (the connection closes),
//! and a relayed message as a body of the pieces its session wrote.

use std::collections::VecDeque;
use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, SizeHint};
use serde_json::{Value, json};

use crate::relay::Outgoing;

pub(super) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(super) fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed_unsync());
    *r.status_mut() = status;
    if !content_type.is_empty() {
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    r
}

pub(super) fn rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    full(status, "application/json", serde_json::to_vec(&body).unwrap_or_default())
}

pub(super) fn empty(status: StatusCode) -> Response<Body> {
    full(status, "", Bytes::new())
}

pub(super) fn unauthorized() -> Response<Body> {
    let mut r = rpc_error(StatusCode::UNAUTHORIZED, Value::Null, -32001, "Unauthorized");
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"snowluma-mcp\""));
    r
}

/// A body of pieces of known total size (a message relayed as the slices
/// of the line its session wrote): no copy, and a `Content-Length`.
struct Pieces {
    pieces: VecDeque<Bytes>,
    left: u64,
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.pieces.pop_front();
        if let Some(b) = &next {
            self.left = self.left.saturating_sub(b.len() as u64);
        }
        std::task::Poll::Ready(next.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

pub(super) fn json_message(status: StatusCode, msg: Outgoing) -> Response<Body> {
    let left = msg.len() as u64;
    let mut r = Response::new(Pieces { pieces: msg.pieces.into(), left }.boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(super) fn too_many(what: &str) -> Response<Body> {
    let mut r = rpc_error(StatusCode::TOO_MANY_REQUESTS, Value::Null, -32000, what);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// A refusal of a request's head; the connection is closed after it, since
/// what follows on it cannot be trusted to be framed as we read it.
pub(super) fn refuse_head(status: StatusCode, why: &str) -> Response<Body> {
    let mut r = rpc_error(status, Value::Null, -32000, why);
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
