//! One session tree as the front sees it: the socket to its stdio server,
//! the requests in flight (client ids rewritten to ids unique in the
//! session), and where each message the server writes goes.
//!
//! Messages cross as their bytes (see `message.rs`): a client's body goes to
//! the session with only its id spliced, and a line the session writes goes
//! to the client as slices of that line around the ids put back. The lines
//! read from all sessions, until their clients have taken them, count
//! against one budget ([`RESPONSE_BUDGET_KIB`]); a session whose next line
//! does not fit waits (its writes to stdout wait).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::message::{self, Id, ServerMessage};

/// Largest line read from a session (a tool result within the IPC limit).
pub const MAX_LINE: usize = 64 * 1024 * 1024;
/// How much reading one line may hold at once: its buffer doubles as it
/// grows (up to [`MAX_LINE`]), so the old and the new one together are at
/// most one and a half times that.
const LINE_RESERVE_KIB: u32 = (MAX_LINE / 1024 / 2 * 3) as u32;
/// The budget of every line read from the sessions and not yet taken by its
/// client: two lines of the largest size can be read at once.
pub const RESPONSE_BUDGET_KIB: usize = 2 * LINE_RESERVE_KIB as usize;
/// Each session's read buffer (outside the budget).
pub const READ_BUFFER: usize = 64 * 1024;
/// Server requests announced by the session's marker and not yet seen.
const MAX_RELATED: usize = 256;

/// A message for a client: its JSON text in pieces (slices of the line the
/// session wrote, and the ids put back), and what it is.
pub struct Outgoing {
    pub pieces: Vec<Bytes>,
    pub kind: Kind,
    /// A response's `error.code`.
    pub error_code: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The response (or error) that ends its request.
    Response,
    /// The server cancelled the request (it ends, without a response).
    Cancelled,
    Other,
}

impl Outgoing {
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }
}

/// A client's request on its way to the session.
pub struct ClientRequest {
    /// Its body, one line (see `message::one_line`).
    pub body: Vec<u8>,
    pub id: Id,
    pub progress: Option<Value>,
    /// The client takes an SSE stream: server requests may go there.
    pub sse: bool,
}

struct Pending {
    client: Id,
    tx: UnboundedSender<Outgoing>,
    progress: Option<Value>,
    /// The HTTP response (stream or JSON wait) is still there.
    open: bool,
    sse: bool,
}

struct State {
    next: u64,
    pending: BTreeMap<u64, Pending>,
    get_stream: Option<UnboundedSender<Outgoing>>,
    last_active: Instant,
    /// Server request (its id's JSON text) → the request it was made in.
    related: HashMap<Bytes, u64>,
}

impl State {
    /// The last activity, if nothing is in flight for a waiting client and
    /// no GET stream is open; `None` while busy.
    fn quiet_since(&self) -> Option<Instant> {
        let busy = self.pending.values().any(|p| p.open) || self.get_stream.as_ref().is_some_and(|g| !g.is_closed());
        (!busy).then_some(self.last_active)
    }

    fn to_get_stream(&self, out: Outgoing) -> Result<(), Outgoing> {
        match &self.get_stream {
            Some(g) => g.send(out).map_err(|e| e.0),
            None => Err(out),
        }
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

/// What a client request became on its way in.
pub struct Sent {
    pub internal: u64,
    pub rx: UnboundedReceiver<Outgoing>,
}

/// A line read from a session, holding its share of the budget until the
/// last piece of it is dropped (written to the client, or discarded).
struct Charged {
    line: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.line
    }
}

enum LineError {
    Io,
    TooLong,
}

/// The next line (its newline included), `None` at the end of the stream.
/// The buffer doubles as it grows but never beyond [`MAX_LINE`].
async fn read_line(reader: &mut BufReader<OwnedReadHalf>) -> Result<Option<Vec<u8>>, LineError> {
    let mut line: Vec<u8> = Vec::new();
    // Bounded: each turn consumes input, and the line is cut at MAX_LINE.
    loop {
        let buf = reader.fill_buf().await.map_err(|_| LineError::Io)?;
        if buf.is_empty() {
            return Ok(None);
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE {
            return Err(LineError::TooLong);
        }
        if line.capacity() - line.len() < take {
            let want = (line.capacity() * 2).max(line.len() + take).clamp(4096, MAX_LINE);
            line.reserve_exact(want - line.len());
        }
        line.extend_from_slice(buf.get(..take).unwrap_or_default());
        reader.consume(take);
        if done {
            return Ok(Some(line));
        }
    }
}

fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1)
}

impl Tree {
    pub fn start(
        session: u64,
        token_id: String,
        token_sha256: [u8; 32],
        stream: tokio::net::UnixStream,
        budget: Arc<Semaphore>,
    ) -> Arc<Tree> {
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
            reader.read_loop(read, budget).await;
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

    /// Write one line made of `parts` (a newline follows). Done by a task of
    /// its own, so that a caller dropped halfway (its client went away)
    /// never leaves half a message on the session's stdin; `hold` (the
    /// body's budget) is released once the line is written.
    async fn write_parts<H: Send + 'static>(
        self: &Arc<Self>,
        data: Vec<u8>,
        splice: Option<(std::ops::Range<usize>, String)>,
        hold: H,
    ) -> bool {
        let tree = self.clone();
        let task = tokio::spawn(async move {
            let _hold = hold;
            let mut w = tree.writer.lock().await;
            let Some(w) = w.as_mut() else { return false };
            let (head, middle, tail) = match &splice {
                Some((r, with)) => {
                    (data.get(..r.start).unwrap_or_default(), with.as_bytes(), data.get(r.end..).unwrap_or_default())
                }
                None => (&data[..], &b""[..], &b""[..]),
            };
            for part in [head, middle, tail, b"\n"] {
                if w.write_all(part).await.is_err() {
                    return false;
                }
            }
            true
        });
        task.await.unwrap_or(false)
    }

    async fn write(self: &Arc<Self>, msg: &Value) -> bool {
        let Ok(line) = serde_json::to_vec(msg) else { return false };
        self.write_parts(line, None, ()).await
    }

    /// Relay a client request: its id becomes a fresh internal one. The
    /// receiver gets every message for it, the response last. `hold` is
    /// released once the body is written.
    pub async fn request<H: Send + 'static>(self: &Arc<Self>, req: ClientRequest, hold: H) -> Option<Sent> {
        let (tx, rx) = unbounded_channel();
        let ClientRequest { body, id, progress, sse } = req;
        let span = id.span.clone();
        let internal = self.with(|st| {
            let n = st.next;
            st.next += 1;
            st.pending.insert(n, Pending { client: id, tx, progress, open: true, sse });
            st.last_active = Instant::now();
            n
        })?;
        if self.write_parts(body, Some((span, internal.to_string())), hold).await {
            Some(Sent { internal, rx })
        } else {
            self.with(|st| st.pending.remove(&internal));
            None
        }
    }

    /// Relay a client notification or response (`notifications/cancelled`
    /// is translated to the internal id; an unknown id is dropped).
    pub async fn forward<H: Send + 'static>(self: &Arc<Self>, body: Vec<u8>, cancels: Option<Id>, hold: H) -> bool {
        self.touch();
        let Some(client) = cancels else {
            return self.write_parts(body, None, hold).await;
        };
        let found =
            self.with(|st| st.pending.iter().rev().find(|(_, p)| p.client.value == client.value).map(|(k, _)| *k));
        let Some(internal) = found.flatten() else { return true };
        let written = self.write_parts(body, Some((client.span, internal.to_string())), hold).await;
        // The server answers a cancelled request with nothing: its HTTP
        // response ends here, without one.
        self.with(|st| st.pending.remove(&internal));
        written
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
    pub fn open_get_stream(&self) -> Option<UnboundedReceiver<Outgoing>> {
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
    pub async fn end(self: &Arc<Self>) {
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

    async fn read_loop(self: &Arc<Self>, read: OwnedReadHalf, budget: Arc<Semaphore>) {
        let mut reader = BufReader::with_capacity(READ_BUFFER, read);
        // Bounded by the session: it ends when the session closes stdout.
        loop {
            // Wait for the next line to begin before taking its budget.
            match reader.fill_buf().await {
                Ok([]) | Err(_) => return,
                Ok(_) => {}
            }
            let Ok(mut permit) = budget.clone().acquire_many_owned(LINE_RESERVE_KIB).await else { return };
            let mut line = match read_line(&mut reader).await {
                Ok(Some(line)) => line,
                Ok(None) | Err(LineError::Io) => return,
                Err(LineError::TooLong) => {
                    tracing::error!(session = self.session, "serve-http: a session wrote an oversized line; ending it");
                    return;
                }
            };
            if line.capacity() - line.len() > 4096 {
                line.shrink_to_fit();
            }
            // Keep what the line holds, give the rest of the reserve back.
            drop(permit.split((LINE_RESERVE_KIB - kib(line.capacity()).min(LINE_RESERVE_KIB)) as usize));
            self.route(Bytes::from_owner(Charged { line, _permit: permit }));
        }
    }

    /// Deliver one message from the server.
    fn route(self: &Arc<Self>, line: Bytes) {
        let Some(mut m) = message::server(&line) else { return };
        if let Some((server_id, internal)) = m.related.take() {
            self.with(|st| {
                if st.related.len() < MAX_RELATED {
                    st.related.insert(server_id, internal);
                }
            });
            return;
        }
        let undeliverable = self.with(|st| st.deliver(&line, &m)).flatten();
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

/// A message for a client: `line` (read as `m`) with `edits` spliced in.
fn outgoing(line: &Bytes, m: &ServerMessage, kind: Kind, edits: Vec<(Range<usize>, Bytes)>) -> Outgoing {
    Outgoing { pieces: message::splice(line, edits), kind, error_code: m.error_code }
}

/// Where the lines a session writes go (see [`Tree::route`]).
impl State {
    /// Deliver `line` (read as `m`, not a marker); the id of a server
    /// request that no stream of its client can carry.
    fn deliver(&mut self, line: &Bytes, m: &ServerMessage) -> Option<Value> {
        self.last_active = Instant::now();
        match (m.method.as_deref(), &m.id) {
            // A response to one of ours.
            (None, Some(id)) => {
                self.response(line, m, id);
                None
            }
            (None, None) => None,
            (Some(_), Some(id)) => self.server_request(line, m, id),
            (Some(method), None) => {
                self.notification(line, m, method);
                None
            }
        }
    }

    /// A response ends its request: its id (and its subscription id, if it
    /// names the request) put back.
    fn response(&mut self, line: &Bytes, m: &ServerMessage, id: &Id) {
        if let Some(p) = id.value.as_u64().and_then(|n| self.pending.remove(&n).map(|p| (n, p))) {
            let (internal, p) = p;
            let mut edits = vec![(id.span.clone(), p.client.raw.clone())];
            if let Some((span, sub)) = &m.subscription
                && *sub == internal
            {
                edits.push((span.clone(), p.client.raw.clone()));
            }
            let _ = p.tx.send(outgoing(line, m, Kind::Response, edits));
        }
    }

    /// A server request (legacy: elicitation) goes on the stream of the
    /// request it was made in (the session's marker named it), else on the
    /// GET stream; never on another request's response, which its client
    /// did not ask for. Its id if neither can take it.
    fn server_request(&mut self, line: &Bytes, m: &ServerMessage, id: &Id) -> Option<Value> {
        let related = self.related.remove(&id.raw);
        let target = related
            .and_then(|k| self.pending.get(&k))
            .filter(|p| p.open && p.sse && !p.tx.is_closed())
            .map(|p| p.tx.clone());
        let msg = outgoing(line, m, Kind::Other, Vec::new());
        let rest = match target {
            Some(tx) => tx.send(msg).map_err(|e| e.0),
            None => Err(msg),
        };
        match rest.map_err(|msg| self.to_get_stream(msg)) {
            Ok(()) | Err(Ok(())) => None,
            Err(Err(_)) => Some(id.value.clone()),
        }
    }

    /// Request-related notifications go to their request; others to the GET
    /// stream. A cancellation ends its request.
    fn notification(&mut self, line: &Bytes, m: &ServerMessage, method: &str) {
        let related: Option<u64> = if method == "notifications/progress" {
            m.progress.as_ref().and_then(|token| {
                self.pending.iter().find(|(_, p)| p.progress.as_ref() == Some(token)).map(|(k, _)| *k)
            })
        } else if let Some((_, sub)) = &m.subscription {
            Some(*sub)
        } else if method == "notifications/cancelled" {
            m.request_id.as_ref().map(|(_, n)| *n)
        } else {
            None
        };
        let is_cancel = method == "notifications/cancelled";
        match related.and_then(|k| self.pending.get(&k).map(|p| (k, p.client.raw.clone(), p.tx.clone()))) {
            Some((k, client, tx)) => {
                let mut edits = Vec::new();
                if let Some((span, sub)) = &m.subscription
                    && *sub == k
                {
                    edits.push((span.clone(), client.clone()));
                }
                if is_cancel && let Some((span, _)) = &m.request_id {
                    edits.push((span.clone(), client));
                    self.pending.remove(&k);
                }
                let kind = if is_cancel { Kind::Cancelled } else { Kind::Other };
                let _ = tx.send(outgoing(line, m, kind, edits));
            }
            None if related.is_none() => {
                let _ = self.to_get_stream(outgoing(line, m, Kind::Other, Vec::new()));
            }
            // For a request no longer in flight: dropped.
            None => {}
        }
    }
}

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

    fn client_request(v: Value, sse: bool) -> ClientRequest {
        let body = serde_json::to_vec(&v).unwrap();
        let m = message::client(&body).unwrap();
        ClientRequest { id: m.id.unwrap(), progress: m.progress, sse, body }
    }

    fn note(v: Value) -> (Vec<u8>, Option<Id>) {
        let body = serde_json::to_vec(&v).unwrap();
        let m = message::client(&body).unwrap();
        (body, m.request_id)
    }

    fn json_of(o: &Outgoing) -> Value {
        serde_json::from_slice(&o.pieces.concat()).unwrap()
    }

    fn budget() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(RESPONSE_BUDGET_KIB))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn ids_are_rewritten_both_ways_and_messages_find_their_request() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let budget = budget();
        let tree = Tree::start(1, "t".into(), [0; 32], ours, budget.clone());
        let (r, mut w) = theirs.into_split();
        let mut r = BufReader::new(r);
        // Two requests with the same client id cannot collide.
        let mut a = tree
            .request(
                client_request(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"_meta": {"progressToken": "p"}}}),
                    true,
                ),
                (),
            )
            .await
            .unwrap();
        let mut b = tree
            .request(client_request(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}), false), ())
            .await
            .unwrap();
        let (la, lb) = (line(&mut r).await, line(&mut r).await);
        assert_ne!(la["id"], lb["id"]);
        assert_eq!(la["id"], json!(a.internal));
        assert_eq!(la["params"]["_meta"]["progressToken"], "p", "the rest of the body as the client sent it");
        // Progress goes to the request carrying the token; responses to their own.
        let out = [
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p", "progress": 1}}),
            json!({"jsonrpc": "2.0", "id": b.internal, "result": {"tools": []}}),
            json!({"jsonrpc": "2.0", "id": a.internal, "result": {}}),
        ];
        for m in out {
            w.write_all(format!("{m}\n").as_bytes()).await.unwrap();
        }
        assert_eq!(json_of(&a.rx.recv().await.unwrap())["method"], "notifications/progress");
        let ra = a.rx.recv().await.unwrap();
        assert_eq!(ra.kind, Kind::Response);
        assert_eq!(json_of(&ra)["id"], 1, "the client's id");
        drop(ra);
        assert_eq!(json_of(&b.rx.recv().await.unwrap())["result"], json!({"tools": []}));
        assert!(a.rx.recv().await.is_none(), "the response ends the stream");
        // A client cancellation names its own id and reaches the internal one.
        let c = tree
            .request(client_request(json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call"}), true), ())
            .await
            .unwrap();
        let _ = line(&mut r).await;
        let (body, cancels) =
            note(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "c"}}));
        assert!(tree.forward(body, cancels, ()).await);
        let cancel = line(&mut r).await;
        assert_eq!(cancel["params"]["requestId"], json!(c.internal));
        // A listen stream's notifications carry the client's id back.
        let mut l = tree
            .request(
                client_request(json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen"}), true),
                (),
            )
            .await
            .unwrap();
        let _ = line(&mut r).await;
        let n = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
            "params": {"uri": "x", "_meta": {"io.modelcontextprotocol/subscriptionId": l.internal}}});
        w.write_all(format!("{n}\n").as_bytes()).await.unwrap();
        let got = json_of(&l.rx.recv().await.unwrap());
        assert_eq!(got["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1");
        // What the clients have not taken counts against the budget; what
        // they have dropped does not.
        assert_eq!(budget.available_permits(), RESPONSE_BUDGET_KIB);
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
        let tree = Tree::start(1, "t".into(), [0; 32], ours, budget());
        let (r, mut w) = theirs.into_split();
        let mut r = BufReader::new(r);
        let mut asking = tree
            .request(client_request(json!({"jsonrpc": "2.0", "id": "ask", "method": "tools/call"}), true), ())
            .await
            .unwrap();
        let mut json_only = tree
            .request(client_request(json!({"jsonrpc": "2.0", "id": "other", "method": "tools/call"}), false), ())
            .await
            .unwrap();
        let mut newest = tree
            .request(client_request(json!({"jsonrpc": "2.0", "id": "new", "method": "tools/list"}), true), ())
            .await
            .unwrap();
        for _ in 0..3 {
            let _ = line(&mut r).await;
        }
        let marker = json!({"jsonrpc": "2.0", "method": super::super::RELATED_METHOD,
            "params": {"id": 0, "relatedRequestId": asking.internal}});
        let ask = json!({"jsonrpc": "2.0", "id": 0, "method": "elicitation/create", "params": {"message": "m"}});
        w.write_all(format!("{marker}\n{ask}\n").as_bytes()).await.unwrap();
        let got = asking.rx.recv().await.unwrap();
        assert_eq!(json_of(&got), ask, "unchanged, on the asking call's stream");
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
        assert_eq!(json_of(&get.recv().await.unwrap())["id"], 2);
        // Nothing reached the other requests.
        assert!(json_only.rx.try_recv().is_err() && newest.rx.try_recv().is_err());
    }
}
