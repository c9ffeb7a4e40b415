//! One session tree as the front sees it: the socket to its stdio server,
//! the requests in flight (client ids rewritten to ids unique in the
//! session), and where each message the server writes goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

/// Largest line read from a session (a tool result within the IPC limit).
const MAX_LINE: usize = 64 * 1024 * 1024;
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// Server requests announced by the session's marker and not yet seen.
const MAX_RELATED: usize = 256;

struct Pending {
    client_id: Value,
    tx: UnboundedSender<Value>,
    progress: Option<Value>,
    /// The HTTP response (stream or JSON wait) is still there.
    open: bool,
    /// The client takes an SSE stream: server requests may go there.
    sse: bool,
}

struct State {
    next: u64,
    pending: BTreeMap<u64, Pending>,
    get_stream: Option<UnboundedSender<Value>>,
    last_active: Instant,
    /// Server request (its id as JSON text) → the request it was made in.
    related: HashMap<String, u64>,
}

impl State {
    /// The last activity, if nothing is in flight for a waiting client and
    /// no GET stream is open; `None` while busy.
    fn quiet_since(&self) -> Option<Instant> {
        let busy = self.pending.values().any(|p| p.open) || self.get_stream.as_ref().is_some_and(|g| !g.is_closed());
        (!busy).then_some(self.last_active)
    }
}

pub struct Tree {
    pub session: u64,
    pub token_id: String,
    /// The digest of the token that started it: a tree ends when its token
    /// is removed or changed.
    pub token_sha256: [u8; 32],
    writer: tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    state: Mutex<State>,
    /// Fired once the tree is let go (DELETE, idle, connection end, a
    /// revoked token, the session's own end).
    pub ended: CancellationToken,
}

/// What a client message became on its way in.
pub struct Sent {
    pub internal: u64,
    pub rx: UnboundedReceiver<Value>,
}

impl Tree {
    pub fn start(session: u64, token_id: String, token_sha256: [u8; 32], stream: tokio::net::UnixStream) -> Arc<Tree> {
        let (read, write) = stream.into_split();
        let tree = Arc::new(Tree {
            session,
            token_id,
            token_sha256,
            writer: tokio::sync::Mutex::new(Some(write)),
            state: Mutex::new(State {
                next: 1,
                pending: BTreeMap::new(),
                get_stream: None,
                last_active: Instant::now(),
                related: HashMap::new(),
            }),
            ended: CancellationToken::new(),
        });
        let reader = tree.clone();
        tokio::spawn(async move {
            reader.read_loop(read).await;
            // The server is gone: every waiting response ends without an answer.
            if let Ok(mut st) = reader.state.lock() {
                st.pending.clear();
                st.get_stream = None;
            }
            reader.ended.cancel();
        });
        tree
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        self.state.lock().ok().map(|mut st| f(&mut st))
    }

    pub fn touch(&self) {
        self.with(|st| st.last_active = Instant::now());
    }

    /// When the tree became quiet (nothing in flight with a client
    /// waiting, no GET stream), or `None` while it is busy.
    pub fn quiet_since(&self) -> Option<Instant> {
        self.with(|st| st.quiet_since()).flatten()
    }

    /// Idle: nothing in flight with a client waiting, no GET stream, and no
    /// activity for `limit`.
    pub fn idle_for(&self, limit: std::time::Duration) -> bool {
        self.with(|st| st.quiet_since().is_some_and(|since| since.elapsed() >= limit)).unwrap_or(true)
    }

    async fn write(&self, msg: &Value) -> bool {
        let Ok(mut line) = serde_json::to_vec(msg) else { return false };
        line.push(b'\n');
        let mut w = self.writer.lock().await;
        match w.as_mut() {
            Some(w) => w.write_all(&line).await.is_ok(),
            None => false,
        }
    }

    /// Relay a client request: its id becomes a fresh internal one. The
    /// receiver gets every message for it, the response last. `sse`: its
    /// client takes an SSE stream (server requests may go there).
    pub async fn request(&self, mut msg: Value, sse: bool) -> Option<Sent> {
        let client_id = msg.get("id").cloned()?;
        let progress = msg.pointer("/params/_meta/progressToken").cloned();
        let (tx, rx) = unbounded_channel();
        let internal = self.with(|st| {
            let n = st.next;
            st.next += 1;
            st.pending.insert(n, Pending { client_id, tx, progress, open: true, sse });
            st.last_active = Instant::now();
            n
        })?;
        msg["id"] = json!(internal);
        if self.write(&msg).await {
            Some(Sent { internal, rx })
        } else {
            self.with(|st| st.pending.remove(&internal));
            None
        }
    }

    /// Relay a client notification or response (`notifications/cancelled`
    /// is translated to the internal id; an unknown id is dropped).
    pub async fn forward(&self, mut msg: Value) -> bool {
        self.touch();
        if msg.get("method").and_then(Value::as_str) == Some("notifications/cancelled") {
            let Some(client) = msg.pointer("/params/requestId").cloned() else { return true };
            let found = self.with(|st| st.pending.iter().rev().find(|(_, p)| p.client_id == client).map(|(k, _)| *k));
            let Some(internal) = found.flatten() else { return true };
            msg["params"]["requestId"] = json!(internal);
            let written = self.write(&msg).await;
            // The server answers a cancelled request with nothing: its HTTP
            // response ends here, without one.
            self.with(|st| st.pending.remove(&internal));
            return written;
        }
        self.write(&msg).await
    }

    /// The HTTP side of request `internal` went away. A modern request is
    /// cancelled by that (the transport's rule); a legacy one runs on.
    pub fn detach(self: &Arc<Self>, internal: u64, cancel: bool) {
        let present = self.with(|st| {
            st.last_active = Instant::now();
            match st.pending.get_mut(&internal) {
                Some(p) => {
                    p.open = false;
                    true
                }
                None => false,
            }
        });
        if cancel && present == Some(true) {
            // The entry stays until the cancellation is written, so that an
            // `end` racing with this still cancels the call.
            let tree = self.clone();
            tokio::spawn(async move {
                tree.write(&cancelled(internal, "the HTTP response stream was closed")).await;
                tree.with(|st| st.pending.remove(&internal));
            });
        }
    }

    /// Open the legacy standalone stream; `None` if one is already open.
    pub fn open_get_stream(&self) -> Option<UnboundedReceiver<Value>> {
        self.with(|st| {
            if st.get_stream.as_ref().is_some_and(|g| !g.is_closed()) {
                return None;
            }
            let (tx, rx) = unbounded_channel();
            st.get_stream = Some(tx);
            st.last_active = Instant::now();
            Some(rx)
        })
        .flatten()
    }

    /// Let the tree go: cancel what is still in flight (writes are then
    /// audited with outcome `unknown`), and close the server's stdin so that
    /// it finishes and exits.
    pub async fn end(&self) {
        if self.ended.is_cancelled() && self.writer.lock().await.is_none() {
            return;
        }
        let inflight: Vec<u64> = self.with(|st| st.pending.keys().copied().collect()).unwrap_or_default();
        for id in inflight {
            self.write(&cancelled(id, "the HTTP session ended")).await;
        }
        if let Some(mut w) = self.writer.lock().await.take() {
            let _ = w.shutdown().await;
        }
        self.with(|st| {
            st.pending.clear();
            st.get_stream = None;
        });
        self.ended.cancel();
    }

    async fn read_loop(self: &Arc<Self>, read: OwnedReadHalf) {
        let mut reader = BufReader::new(read);
        let mut line = Vec::new();
        loop {
            line.clear();
            let mut limited = (&mut reader).take(MAX_LINE as u64 + 1);
            match limited.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) if line.len() > MAX_LINE => {
                    tracing::error!(session = self.session, "serve-http: a session wrote an oversized line; ending it");
                    return;
                }
                Ok(_) => {}
            }
            let Ok(msg) = serde_json::from_slice::<Value>(&line) else { continue };
            self.route(msg);
        }
    }

    /// Deliver one message from the server.
    fn route(self: &Arc<Self>, mut msg: Value) {
        if msg.get("method").and_then(Value::as_str) == Some(super::RELATED_METHOD) {
            let server_id = msg.pointer("/params/id").map(Value::to_string);
            let related = msg.pointer("/params/relatedRequestId").and_then(Value::as_u64);
            if let (Some(server_id), Some(related)) = (server_id, related) {
                self.with(|st| {
                    if st.related.len() < MAX_RELATED {
                        st.related.insert(server_id, related);
                    }
                });
            }
            return;
        }
        let mut undeliverable = None;
        let _ = self.with(|st| {
            st.last_active = Instant::now();
            let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
            let id = msg.get("id").and_then(Value::as_u64);
            match (method.as_deref(), id) {
                // A response to one of ours.
                (None, Some(internal)) => {
                    if let Some(p) = st.pending.remove(&internal) {
                        msg["id"] = p.client_id.clone();
                        if let Some(sub) =
                            msg.pointer_mut(&format!("/result/_meta/{}", SUBSCRIPTION_ID.replace('/', "~1")))
                            && sub.as_u64() == Some(internal)
                        {
                            *sub = p.client_id.clone();
                        }
                        let _ = p.tx.send(msg);
                    }
                }
                (None, None) => {}
                // A server request (legacy: elicitation) goes on the stream
                // of the request it was made in (the session's marker named
                // it), else on the GET stream; never on another request's
                // response, whose client did not ask for it (and may not
                // even read a stream).
                (Some(_), _) if msg.get("id").is_some() => {
                    let server_id = msg.get("id").cloned().unwrap_or(Value::Null);
                    let related = st.related.remove(&server_id.to_string());
                    let target = related
                        .and_then(|k| st.pending.get(&k))
                        .filter(|p| p.open && p.sse && !p.tx.is_closed())
                        .map(|p| p.tx.clone());
                    let rest = match target {
                        Some(tx) => tx.send(msg).map_err(|e| e.0),
                        None => Err(msg),
                    };
                    let rest = match (rest, &st.get_stream) {
                        (Err(msg), Some(g)) => g.send(msg).map_err(|e| e.0),
                        (rest, _) => rest,
                    };
                    if rest.is_err() {
                        undeliverable = Some(server_id);
                    }
                }
                (Some(m), _) => {
                    // Request-related notifications go to their request.
                    let related: Option<u64> = if m == "notifications/progress" {
                        let token = msg.pointer("/params/progressToken").cloned();
                        st.pending.iter().find(|(_, p)| p.progress.is_some() && p.progress == token).map(|(k, _)| *k)
                    } else if let Some(sub) = msg
                        .pointer(&format!("/params/_meta/{}", SUBSCRIPTION_ID.replace('/', "~1")))
                        .and_then(Value::as_u64)
                    {
                        Some(sub)
                    } else if m == "notifications/cancelled" {
                        msg.pointer("/params/requestId").and_then(Value::as_u64)
                    } else {
                        None
                    };
                    match related.and_then(|k| st.pending.get(&k).map(|p| (k, p.client_id.clone(), p.tx.clone()))) {
                        Some((k, client_id, tx)) => {
                            let ptr = format!("/params/_meta/{}", SUBSCRIPTION_ID.replace('/', "~1"));
                            if let Some(sub) = msg.pointer_mut(&ptr)
                                && sub.as_u64() == Some(k)
                            {
                                *sub = client_id.clone();
                            }
                            if m == "notifications/cancelled" {
                                msg["params"]["requestId"] = client_id;
                                st.pending.remove(&k);
                            }
                            let _ = tx.send(msg);
                        }
                        None if related.is_none() => {
                            if let Some(g) = &st.get_stream {
                                let _ = g.send(msg);
                            }
                        }
                        // For a request no longer in flight: dropped.
                        None => {}
                    }
                }
            }
        });
        // No stream of this client can carry the server's request: answer it
        // in the client's place, so that the call that made it goes on (a
        // legacy input request then fails, and nothing is executed).
        if let Some(id) = undeliverable {
            let tree = self.clone();
            tokio::spawn(async move {
                tree.write(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
                    "message": "the HTTP client has no open stream for this request"}}))
                    .await;
            });
        }
    }
}

use tokio::io::AsyncReadExt as _;

fn cancelled(internal: u64, reason: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": internal, "reason": reason}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    async fn line(r: &mut BufReader<tokio::net::unix::OwnedReadHalf>) -> Value {
        let mut buf = String::new();
        r.read_line(&mut buf).await.unwrap();
        serde_json::from_str(&buf).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn ids_are_rewritten_both_ways_and_messages_find_their_request() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let tree = Tree::start(1, "t".into(), [0; 32], ours);
        let (r, mut w) = theirs.into_split();
        let mut r = BufReader::new(r);
        // Two requests with the same client id cannot collide.
        let mut a = tree
            .request(
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"_meta": {"progressToken": "p"}}}),
                true,
            )
            .await
            .unwrap();
        let mut b = tree.request(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}), false).await.unwrap();
        let (la, lb) = (line(&mut r).await, line(&mut r).await);
        assert_ne!(la["id"], lb["id"]);
        assert_eq!(la["id"], json!(a.internal));
        // Progress goes to the request carrying the token; responses to their own.
        let out = [
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p", "progress": 1}}),
            json!({"jsonrpc": "2.0", "id": b.internal, "result": {"tools": []}}),
            json!({"jsonrpc": "2.0", "id": a.internal, "result": {}}),
        ];
        for m in out {
            w.write_all(format!("{m}\n").as_bytes()).await.unwrap();
        }
        assert_eq!(a.rx.recv().await.unwrap()["method"], "notifications/progress");
        let ra = a.rx.recv().await.unwrap();
        assert_eq!(ra["id"], 1, "the client's id");
        assert_eq!(b.rx.recv().await.unwrap()["result"], json!({"tools": []}));
        assert!(a.rx.recv().await.is_none(), "the response ends the stream");
        // A client cancellation names its own id and reaches the internal one.
        let c = tree.request(json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call"}), true).await.unwrap();
        let _ = line(&mut r).await;
        assert!(
            tree.forward(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "c"}}))
                .await
        );
        let cancel = line(&mut r).await;
        assert_eq!(cancel["params"]["requestId"], json!(c.internal));
        // A listen stream's notifications carry the client's id back.
        let mut l = tree
            .request(json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen"}), true)
            .await
            .unwrap();
        let _ = line(&mut r).await;
        let n = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
            "params": {"uri": "x", "_meta": {SUBSCRIPTION_ID: l.internal}}});
        w.write_all(format!("{n}\n").as_bytes()).await.unwrap();
        let got = l.rx.recv().await.unwrap();
        assert_eq!(got["params"]["_meta"][SUBSCRIPTION_ID], "listen-1");
        // Ending the tree cancels what is in flight and closes the socket.
        tree.end().await;
        let cancel = line(&mut r).await;
        assert_eq!(cancel["params"]["requestId"], json!(l.internal));
        let mut rest = String::new();
        assert_eq!(r.read_line(&mut rest).await.unwrap(), 0, "stdin closed");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_request_goes_to_the_request_it_was_made_in() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let tree = Tree::start(1, "t".into(), [0; 32], ours);
        let (r, mut w) = theirs.into_split();
        let mut r = BufReader::new(r);
        let mut asking =
            tree.request(json!({"jsonrpc": "2.0", "id": "ask", "method": "tools/call"}), true).await.unwrap();
        let mut json_only =
            tree.request(json!({"jsonrpc": "2.0", "id": "other", "method": "tools/call"}), false).await.unwrap();
        let mut newest =
            tree.request(json!({"jsonrpc": "2.0", "id": "new", "method": "tools/list"}), true).await.unwrap();
        for _ in 0..3 {
            let _ = line(&mut r).await;
        }
        let marker = json!({"jsonrpc": "2.0", "method": super::super::RELATED_METHOD,
            "params": {"id": 0, "relatedRequestId": asking.internal}});
        let ask = json!({"jsonrpc": "2.0", "id": 0, "method": "elicitation/create", "params": {"message": "m"}});
        w.write_all(format!("{marker}\n{ask}\n").as_bytes()).await.unwrap();
        assert_eq!(asking.rx.recv().await.unwrap(), ask, "unchanged, on the asking call's stream");
        // Without a marker, and no GET stream: answered in the client's place.
        let stray = json!({"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "params": {"message": "m"}});
        w.write_all(format!("{stray}\n").as_bytes()).await.unwrap();
        let answer = line(&mut r).await;
        assert_eq!(answer["id"], 1);
        assert_eq!(answer["error"]["code"], -32603);
        // With a GET stream open, that is where it goes.
        let mut get = tree.open_get_stream().unwrap();
        let stray = json!({"jsonrpc": "2.0", "id": 2, "method": "elicitation/create", "params": {"message": "m"}});
        w.write_all(format!("{stray}\n").as_bytes()).await.unwrap();
        assert_eq!(get.recv().await.unwrap()["id"], 2);
        // Nothing reached the other requests.
        assert!(json_only.rx.try_recv().is_err() && newest.rx.try_recv().is_err());
    }
}
