//! Our stdio transport: newline-delimited JSON-RPC with the robustness that
//! rmcp's own stdio transport lacks.
//!
//! * A line that is not JSON gets a `-32700` parse error; a JSON value that
//!   is not a JSON-RPC message gets `-32600`; a known method with unusable
//!   params gets `-32602`; a line over [`MAX_LINE_BYTES`] gets `-32600`
//!   with the request id when it can be recovered. The server keeps serving.
//! * Until the MCP lifecycle has started (an `initialize`, or a modern
//!   request with complete `_meta` naming a supported version), notifications
//!   and stray responses are dropped: rmcp would otherwise end the session.
//! * Responses to modern (2026-07-28) requests carry
//!   `_meta["io.modelcontextprotocol/serverInfo"]`.
//!
//! Nothing but protocol messages is ever written to stdout.
//!
//! Parts: [`line`] reads stdin line by line; [`envelope`] checks each
//! line's JSON-RPC envelope and parses it; [`fast`] holds the hot path's
//! shortcuts around rmcp's generic types; [`session`] keeps the budget of
//! calls in flight and the session's end; [`writer`] writes to stdout. This
//! file ties them into rmcp's `Transport`.

mod direct;
mod envelope;
mod fast;
mod line;
mod session;
mod writer;

use std::sync::{Arc, Mutex};

use rmcp::RoleServer;
use rmcp::model::JsonRpcMessage;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use crate::stdio::Output;
pub(crate) use direct::Direct;
use envelope::Reject;
pub use fast::RawArguments;
pub use line::MAX_LINE_BYTES;
use line::{Line, LineReader, recover_id};
use session::{Admission, State, Wait};
use writer::Company;
use writer::Out;
pub use writer::StdoutState;

pub struct LineTransport {
    /// The reading side and where it hands rmcp its messages, until the
    /// first `receive` starts it as a task of its own ([`Input::run`]).
    input: Option<(Input, mpsc::Sender<RxJsonRpcMessage<RoleServer>>)>,
    /// The messages that are rmcp's, from the reading task (none once it
    /// ended: the session ends).
    inbox: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    /// The reading task, stopped with the transport.
    reading: Option<tokio::task::AbortHandle>,
    out: Arc<Out>,
    state: Arc<Mutex<State>>,
    server_info: Arc<Value>,
    /// Behind serve-http's front: a server request made within a client's
    /// request is preceded by the marker naming that request
    /// ([`snowluma_proto::session::RELATED_METHOD`]).
    relayed: bool,
}

/// The reading side of the transport: stdin, line by line. A direct call
/// is answered from here ([`direct`]); everything else is rmcp's, handed
/// over one message at a time. Reading stdin in a task of its own means
/// that a direct call wakes this task alone, not rmcp's loop and its
/// other waits.
struct Input {
    reader: LineReader,
    /// Whether the end of stdin with calls in flight was logged.
    eof_logged: bool,
    out: Arc<Out>,
    state: Arc<Mutex<State>>,
    /// The audit log digests every execution's params (so they are parsed).
    audit: bool,
    /// Query tools' calls answered without rmcp's dispatch ([`direct`]).
    direct: Option<Arc<Direct>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("stdout: {0}")]
    Io(#[from] std::io::Error),
    #[error("serialize: {0}")]
    Json(#[from] serde_json::Error),
}

impl LineTransport {
    pub fn new(
        input: Box<dyn AsyncRead + Send + Sync + Unpin>,
        output: Output,
        unread: Option<crate::stdio::Unread>,
        server_info: Value,
        audit: bool,
    ) -> LineTransport {
        let out = Arc::new(Out::new(output, unread));
        let state: Arc<Mutex<State>> = Arc::default();
        // One message at a time, as rmcp takes them: stdin is not read
        // ahead of rmcp by more than that.
        let (to_rmcp, inbox) = mpsc::channel(1);
        let input = Input {
            reader: LineReader::new(input),
            eof_logged: false,
            out: out.clone(),
            state: state.clone(),
            audit,
            direct: None,
        };
        LineTransport {
            input: Some((input, to_rmcp)),
            inbox,
            reading: None,
            out,
            state,
            server_info: Arc::new(server_info),
            relayed: false,
        }
    }

    /// Answer query tools' calls from the transport ([`direct`]).
    pub fn direct_calls(mut self, direct: Arc<Direct>) -> LineTransport {
        if let Some((input, _)) = &mut self.input {
            input.direct = Some(direct);
        }
        self
    }

    /// This session runs behind serve-http's front (the launcher named its
    /// principal): mark server requests with the request they belong to.
    pub fn relayed(mut self, relayed: bool) -> LineTransport {
        self.relayed = relayed;
        self
    }

    /// stdin/stdout, each direction driven according to what the host gave
    /// us (see [`crate::stdio`]).
    pub fn stdio(server_info: Value, audit: bool) -> LineTransport {
        let io = crate::stdio::open();
        tracing::debug!(stdin = io.in_kind.as_str(), stdout = io.out_kind.as_str(), "stdio");
        LineTransport::new(io.input, io.output, io.unread, server_info, audit)
    }

    /// Set once stdout has failed: the session ended because the client is
    /// gone, not because it finished.
    pub fn stdout_state(&self) -> StdoutState {
        StdoutState(self.out.clone())
    }
}

impl Drop for LineTransport {
    fn drop(&mut self) {
        if let Some(task) = &self.reading {
            task.abort();
        }
    }
}

impl Input {
    /// Read stdin until the session ends, handing rmcp its messages; the
    /// session ends (rmcp's `receive` gets none) when this returns: at
    /// stdin's end once every call is answered, when stdout is gone, when
    /// stdin fails, or when rmcp stops taking messages.
    async fn run(mut self, to_rmcp: mpsc::Sender<RxJsonRpcMessage<RoleServer>>) {
        let out = self.out.clone();
        // One wait for stdout's end, for the whole session.
        let gone = out.gone_notify.notified();
        let mut gone = std::pin::pin!(gone);
        loop {
            let next = tokio::select! {
                biased;
                () = &mut gone => return,
                m = self.next() => m,
            };
            let Some(msg) = next else { return };
            if to_rmcp.send(msg).await.is_err() {
                return;
            }
        }
    }

    /// Whether the request `line` (whose envelope is `peek`) goes on now:
    /// one that finds the session's budget used waits, as text, or is
    /// refused at once when too many wait (everything else — a ping, the
    /// client's answers, cancellations — goes on at once). `None`: the
    /// session's state is unusable, and the session ends.
    fn placed(&self, peek: &envelope::Peek<'_>, line: &[u8]) -> Option<bool> {
        match self.state.lock().ok()?.place(peek, line) {
            Wait::Now => Some(true),
            Wait::Parked => {
                tracing::debug!("calls in flight at the session's limit; a request waits for a place");
                Some(false)
            }
            Wait::Refused => {
                tracing::warn!("calls in flight and waiting at the session's limits; a request refused");
                self.out.reply_error(
                    peek.id.clone().unwrap_or(Value::Null),
                    session::BUSY,
                    format!(
                        "server busy: {} requests in flight and {} waiting for a place; send it again once one is answered",
                        session::MAX_IN_FLIGHT,
                        session::MAX_PARKED
                    ),
                );
                Some(false)
            }
        }
    }

    /// One (trimmed, non-empty) input line: its envelope checked, parsed and
    /// accounted for; `None` when it was answered with an error or dropped.
    fn handle_line(&self, trimmed: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
        // A parked line was placed in the session's budget already.
        if let Some(read) = self.direct_call(trimmed) {
            let peek = read.peek();
            self.start_direct(trimmed.len(), read, &peek);
            return None;
        }
        self.handle_peeked(trimmed, envelope::peek(trimmed))
    }

    /// `line` as a query tool's call in a legacy session, read once, whole,
    /// to be answered here ([`direct`]); `None` for any other line.
    fn direct_call<'l>(&self, line: &'l [u8]) -> Option<direct::Read<'l>> {
        self.direct.as_ref()?;
        if !self.state.lock().is_ok_and(|s| s.legacy_session()) {
            return None;
        }
        direct::read(line)
    }

    /// [`Self::handle_line`] for a line whose envelope was already looked
    /// at (`peeked`, what [`envelope::peek`] said of `trimmed`): the look
    /// scans the whole line, so it is taken once.
    fn handle_peeked(
        &self,
        trimmed: &[u8],
        peeked: Result<envelope::Peek<'_>, Reject>,
    ) -> Option<RxJsonRpcMessage<RoleServer>> {
        // The look at the envelope (method, id, `_meta` version), then
        // the typed parse, straight from the bytes.
        let parsed = peeked.and_then(|peek| envelope::parse(trimmed, &peek, self.audit).map(|m| (peek, m)));
        let (peek, (msg, cost)) = match parsed {
            Ok(x) => x,
            Err(reject) => {
                self.reject(reject);
                return None;
            }
        };
        if let JsonRpcMessage::Request(r) = &msg
            && let rmcp::model::ClientRequest::CallToolRequest(c) = &r.request
            && let Some(raw) = c.extensions.get::<RawArguments>()
        {
            // Kept out of rmcp's own request lines, so shown here, to
            // SNOWLUMA_MCP_LOG_PAYLOADS=1 only (the target is not ours, so
            // capped at info otherwise).
            tracing::debug!(target: "payloads", tool = %c.params.name, arguments = raw.0.get(), "tools/call arguments");
        }
        let mut st = self.state.lock().ok()?;
        match st.admit(&peek, cost) {
            Admission::Early => {
                tracing::debug!("dropping a notification or response that arrived before the session started");
                None
            }
            Admission::Withdrawn => None,
            Admission::Pass { cancelled } => {
                if cancelled {
                    self.out.answered.notify_one();
                }
                drop(st);
                if cancelled
                    && let Some(direct) = &self.direct
                    && let Some(rid) = peek.cancelled_request()
                {
                    direct.cancel(&session::key(rid));
                }
                Some(msg)
            }
        }
    }

    /// Start a direct call, read from its `len`-byte line; a refusal is
    /// answered as the general path answers it.
    fn start_direct(&self, len: usize, read: direct::Read<'_>, peek: &envelope::Peek<'_>) {
        let Some(direct) = &self.direct else { return };
        let answer = direct::Answer { out: &self.out, session: &self.state };
        if let Some(reject) = direct.start(len, read, peek, self.audit, answer) {
            self.reject(reject);
        }
    }

    /// The next message that is rmcp's; `None` once the session ends.
    /// Direct calls are started here as their lines are read.
    async fn next(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if self.out.is_gone() {
                return None;
            }
            let (eof, parked, waiting) = match self.state.lock() {
                Ok(s) if s.eof => (true, None, false),
                Ok(mut s) => (false, s.unpark(), s.has_parked()),
                Err(_) => return None,
            };
            if eof {
                // Called again after each message the drain hands on.
                return self.drain_at_eof().await;
            }
            if let Some(p) = parked {
                match self.handle_line(&p.line) {
                    Some(msg) => return Some(msg),
                    None => continue,
                }
            }
            // `read_line` is cancel-safe, so losing this race loses no input.
            // With requests parked, an answer (a place freed) wakes us too.
            let read = if waiting {
                let out = self.out.clone();
                tokio::select! {
                    () = out.answered.notified() => continue,
                    r = self.reader.read_line() => r,
                }
            } else {
                self.reader.read_line().await
            };
            let line = match read {
                Ok(Line::Eof) => return self.drain_at_eof().await,
                Ok(Line::Full(bytes)) => bytes,
                Ok(Line::TooLong(prefix)) => {
                    tracing::warn!(limit = MAX_LINE_BYTES, "input message over the size limit rejected");
                    self.out.reply_error(
                        recover_id(&prefix),
                        -32600,
                        format!("message exceeds the {MAX_LINE_BYTES}-byte limit"),
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stdin read failed; ending the session");
                    return None;
                }
            };
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            // A query tool's call in a legacy session is read once, whole,
            // and answered here ([`direct`]); its envelope is what that
            // reading says.
            if let Some(read) = self.direct_call(trimmed) {
                let peek = read.peek();
                if self.placed(&peek, trimmed)? {
                    self.start_direct(trimmed.len(), read, &peek);
                }
                continue;
            }
            // A request that finds the budget used waits here, as text;
            // everything else (a ping, the client's answers, cancellations)
            // goes on at once.
            let peeked = envelope::peek(trimmed);
            if let Ok(peek) = &peeked
                && !self.placed(peek, trimmed)?
            {
                continue;
            }
            if let Some(msg) = self.handle_peeked(trimmed, peeked) {
                return Some(msg);
            }
        }
    }

    /// A line refused before it was parsed: its error answer, or nothing.
    fn reject(&self, reject: Reject) {
        match reject {
            Reject::Error { id, code, message } => self.out.reply_error(id, code, message),
            Reject::Drop => {}
            Reject::DropLogged(why) => tracing::debug!("{why}"),
        }
    }
}

/// Write the answer `line` of the request whose id (as JSON text) is `key`,
/// built by the transport itself (a direct call's): the session's
/// accounting, then the write, as [`deliver`] does for rmcp's answers.
async fn deliver_answer(out: &Out, state: &Mutex<State>, key: &str, line: Vec<u8>) {
    let company = state
        .lock()
        .map(|mut s| {
            s.answered(key);
            if s.in_flight() > 0 { Company::Expected } else { Company::Alone }
        })
        .unwrap_or(Company::Alone);
    out.deliver_answer(line, company).await;
    // Start-up is over once a first tool answer is out.
    snowluma_proto::alloc::after_start();
}

fn id_key(id: &rmcp::model::RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

/// The marker line for a server request made within a client's request
/// (rmcp records that request in the message's extensions, which never
/// reach the wire): `{"method": RELATED_METHOD, "params": {"id", "relatedRequestId"}}`.
fn related_marker(item: &TxJsonRpcMessage<RoleServer>) -> Option<Vec<u8>> {
    use rmcp::model::GetExtensions;
    let JsonRpcMessage::Request(r) = item else { return None };
    let origin = r.request.extensions().get::<rmcp::service::OriginatingRequestId>()?;
    let marker = serde_json::json!({"jsonrpc": "2.0", "method": snowluma_proto::session::RELATED_METHOD,
        "params": {"id": r.id, "relatedRequestId": origin.0}});
    serde_json::to_vec(&marker).ok()
}

/// Write one message of ours (an answer, a notification, a request to the
/// client), with the session's accounting: rmcp's through
/// [`Transport::send`], direct calls' answers from [`direct`].
async fn deliver(
    out: Arc<Out>,
    state: Arc<Mutex<State>>,
    server_info: Arc<Value>,
    marker: Option<Vec<u8>>,
    item: TxJsonRpcMessage<RoleServer>,
) -> Result<(), TransportError> {
    let id = match &item {
        JsonRpcMessage::Response(r) => Some(id_key(&r.id)),
        JsonRpcMessage::Error(e) => e.id.as_ref().map(id_key),
        JsonRpcMessage::Request(r) => {
            // Ours to the client (elicitation): remembered until it
            // is answered, so that stdin's end can cancel its call.
            if let Ok(mut s) = state.lock() {
                s.asking(&r.id);
            }
            out.answered.notify_one();
            None
        }
        _ => None,
    };
    let (modern, company) = match id {
        Some(key) => state
            .lock()
            .map(|mut s| {
                s.responded(&item);
                let modern = s.answered(&key);
                (modern, if s.in_flight() > 0 { Company::Expected } else { Company::Alone })
            })
            .unwrap_or((false, Company::Alone)),
        None => (false, Company::Alone),
    };
    let line = writer::encode(&item, modern, &server_info)?;
    out.deliver(&item, marker, line, company).await;
    // Start-up is over once a first tool answer is out: drop its
    // code's mappings (once), off the path of that answer.
    if let JsonRpcMessage::Response(r) = &item
        && matches!(r.result, rmcp::model::ServerResult::CallToolResult(_))
    {
        snowluma_proto::alloc::after_start();
    }
    Ok(())
}

impl Transport<RoleServer> for LineTransport {
    type Error = TransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let state = self.state.clone();
        let server_info = self.server_info.clone();
        let marker = if self.relayed { related_marker(&item) } else { None };
        deliver(out, state, server_info, marker, item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        if let Some((input, to_rmcp)) = self.input.take() {
            self.reading = Some(tokio::spawn(input.run(to_rmcp)).abort_handle());
        }
        self.inbox.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.out.write_pending().await;
        self.out.w.lock().await.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod numbers {
    use snowluma_proto::architecture::{check, size};

    /// ARCHITECTURE.md's figures for the stdio transport are the code's.
    #[test]
    fn the_architecture_numbers_of_the_transport_are_the_code_s() {
        check(
            include_str!("../../../ARCHITECTURE.md"),
            &[
                ("stdio line", size(super::line::MAX_LINE_BYTES as u64)),
                ("calls in flight", super::session::MAX_IN_FLIGHT.to_string()),
                ("memory of calls in flight", size(super::session::MAX_IN_FLIGHT_BYTES as u64)),
                ("requests waiting", super::session::MAX_PARKED.to_string()),
                ("memory of requests waiting", size(super::session::MAX_PARKED_BYTES as u64)),
                ("memory cost of one message", size(super::envelope::MAX_MESSAGE_COST as u64)),
            ],
        );
    }
}
