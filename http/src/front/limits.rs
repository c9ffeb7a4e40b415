//! The front's limits on what clients hold: each token's concurrent
//! requests ([`Guard`]), and the request bodies being read or waiting for
//! their session, per token and all together ([`BodyCharge`],
//! [`read_body`]). (The session places are in `sessions.rs`.)

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;

use super::Shared;
use super::auth::header_str;
use super::responses::{Body, empty, rpc_error, too_many};
use crate::relay::Tree;

/// How long the body may take to arrive (after the headers).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The request bodies the front holds at once (being read, or waiting to be
/// written to their session), all tokens together; beyond it, 503.
pub const REQUEST_BUDGET: usize = 64 * 1024 * 1024;
/// The same for one token; beyond it, 429.
pub const TOKEN_REQUEST_SHARE: usize = REQUEST_BUDGET / 2;

#[derive(Default)]
pub(super) struct Usage {
    pub(super) sessions: u32,
    requests: u32,
    /// KiB of request bodies held (see [`BodyCharge`]).
    body_kib: usize,
}

/// Held while a request's HTTP response lives: releases its place in the
/// token's request count, and tells the tree when the client went away.
pub(super) struct Guard {
    shared: Arc<Shared>,
    token_id: String,
    pub(super) relay: Option<(Arc<Tree>, u64, bool)>,
    pub(super) done: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some((tree, internal, modern)) = &self.relay {
            if self.done {
                tree.touch();
            } else {
                tree.detach(*internal, *modern);
            }
        }
        if let Ok(mut u) = self.shared.usage.lock()
            && let Some(u) = u.get_mut(&self.token_id)
        {
            u.requests = u.requests.saturating_sub(1);
        }
    }
}

pub(super) fn acquire_request(shared: &Arc<Shared>, token_id: &str) -> Option<Guard> {
    let mut usage = shared.usage.lock().ok()?;
    let u = usage.entry(token_id.to_owned()).or_default();
    if u.requests >= shared.max_requests {
        return None;
    }
    u.requests += 1;
    Some(Guard { shared: shared.clone(), token_id: token_id.to_owned(), relay: None, done: false })
}

/// A request body's place in the front's budgets: all tokens'
/// ([`REQUEST_BUDGET`]) and its token's ([`TOKEN_REQUEST_SHARE`]). Held
/// until the body is written to its session (or dropped).
pub(super) struct BodyCharge {
    shared: Arc<Shared>,
    token_id: String,
    kib: usize,
    permit: Option<OwnedSemaphorePermit>,
}

impl BodyCharge {
    /// Hold `bytes` in all, or answer 429 (the token's share) or 503 (all).
    fn grow_to(&mut self, bytes: usize) -> Result<(), Response<Body>> {
        let want = bytes.div_ceil(1024);
        let Some(more) = want.checked_sub(self.kib).filter(|m| *m > 0) else { return Ok(()) };
        let share = self.shared.usage.lock().map_err(|_| empty(StatusCode::INTERNAL_SERVER_ERROR)).and_then(|mut u| {
            let u = u.entry(self.token_id.clone()).or_default();
            if (u.body_kib + more) * 1024 > TOKEN_REQUEST_SHARE {
                return Err(too_many("Too much request data in flight for this token (32 MiB); retry later"));
            }
            u.body_kib += more;
            Ok(())
        });
        share?;
        let got =
            u32::try_from(more).ok().and_then(|n| self.shared.request_budget.clone().try_acquire_many_owned(n).ok());
        let Some(got) = got else {
            self.release_share(more);
            let mut r = rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                Value::Null,
                -32000,
                "Service Unavailable: the server holds too much request data from all clients (64 MiB); retry later",
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(r);
        };
        match &mut self.permit {
            Some(p) => p.merge(got),
            None => self.permit = Some(got),
        }
        self.kib = want;
        Ok(())
    }

    /// Hold only `bytes` (at least one KiB) from now on.
    fn shrink_to(&mut self, bytes: usize) {
        let want = bytes.div_ceil(1024).max(1);
        let Some(less) = self.kib.checked_sub(want).filter(|l| *l > 0) else { return };
        if let Some(p) = &mut self.permit {
            drop(p.split(less));
        }
        self.release_share(less);
        self.kib = want;
    }

    fn release_share(&self, kib: usize) {
        if let Ok(mut u) = self.shared.usage.lock()
            && let Some(u) = u.get_mut(&self.token_id)
        {
            u.body_kib = u.body_kib.saturating_sub(kib);
        }
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        self.release_share(self.kib);
    }
}

/// Read a request body into one buffer, within the size limit, the time
/// limit and the budgets. With a `Content-Length` the buffer is that size at
/// once; a chunked body grows it (doubling, charged as it grows).
pub(super) async fn read_body(
    shared: &Arc<Shared>,
    token_id: &str,
    req: Request<Incoming>,
) -> Result<(Vec<u8>, BodyCharge), Response<Body>> {
    let too_large = || rpc_error(StatusCode::PAYLOAD_TOO_LARGE, Value::Null, -32600, "Request body too large");
    let declared = header_str(req.headers(), "content-length").and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > shared.max_body as u64) {
        return Err(too_large());
    }
    let mut charge = BodyCharge { shared: shared.clone(), token_id: token_id.to_owned(), kib: 0, permit: None };
    let declared = declared.and_then(|l| usize::try_from(l).ok());
    let mut incoming = req.into_body();
    // A body that trickles in holds a connection; it gets as long as the
    // headers do.
    let deadline = tokio::time::sleep(BODY_TIMEOUT);
    tokio::pin!(deadline);
    let mut refused = declared.map(|len| charge.grow_to(len)).and_then(Result::err);
    let mut body: Vec<u8> = Vec::with_capacity(if refused.is_none() { declared.unwrap_or(0) } else { 0 });
    let mut read = 0usize;
    // Bounded: every frame adds data (the size limit ends it) or ends the body.
    loop {
        let frame = tokio::select! {
            f = incoming.frame() => f,
            () = &mut deadline => return Err(empty(StatusCode::REQUEST_TIMEOUT)),
        };
        let data = match frame {
            None => break,
            Some(Err(_)) => return Err(empty(StatusCode::BAD_REQUEST)),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_trailers) => continue,
            },
        };
        read += data.len();
        if read > shared.max_body {
            return Err(too_large());
        }
        // A body refused for the budget is still read (and dropped as it
        // comes), so that its client gets the answer rather than a broken
        // connection in the middle of its upload.
        if refused.is_some() {
            continue;
        }
        if read > body.capacity() {
            // While the buffer moves, the old and the new one both exist.
            let cap = read.max(body.capacity() * 2).max(64 * 1024).min(shared.max_body);
            if let Err(r) = charge.grow_to(body.capacity() + cap) {
                refused = Some(r);
                body = Vec::new();
                continue;
            }
            body.reserve_exact(cap - body.len());
            charge.shrink_to(body.capacity());
        }
        body.extend_from_slice(&data);
    }
    match refused {
        Some(r) => Err(r),
        None => Ok((body, charge)),
    }
}
