//! A fake SnowLuma OneBot v11 HTTP server for tests and benchmarks.
//!
//! It imitates what the snowluma-mcp client sees of a real SnowLuma
//! (`packages/onebot/src/network/http-server-adapter.ts`, see
//! `shared/reference/snowluma-upstream-notes.md` §3.1–3.4):
//!
//! * `POST /` with `{"action", "params", "echo"?}` or `POST /<action>` with the
//!   params as body; `GET /` is a health check answering `{online:true}`.
//! * Optional token: `Authorization: Bearer <token>` or `?access_token=<token>`,
//!   else HTTP 401 / retcode 1401.
//! * Envelopes `{status, retcode, data, echo?, wording?}`; an unknown action is
//!   HTTP 200 with retcode 1404.
//! * Stream actions (`test_download_stream`, `download_file*_stream`,
//!   `upload_file_stream`) answer chunked `JSON\r\n\r\n` frames.
//!
//! Tests can script answers ([`FakeSnowLuma::set_response`]), inject faults per
//! action ([`Fault`]), serve files to the download actions
//! ([`FakeSnowLuma::add_file`]), and inspect what arrived
//! ([`FakeSnowLuma::requests`], [`FakeSnowLuma::uploaded`],
//! [`FakeSnowLuma::closed_while_pending`]).
//!
//! The HTTP layer is a deliberately small HTTP/1.1 implementation on
//! [`tokio::net::TcpListener`], bound to 127.0.0.1 only.

mod actions;
pub mod base64;
pub mod events;
mod golden;
mod http;
mod server;
pub mod sha256;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use events::FakeEvents;
pub use golden::{GoldenFault, UnknownFault, fake_byte, fake_file};

/// The downloadable file of [`FakeSnowLuma::interop_preset`].
pub const INTEROP_FILE: &str = "interop.bin";
/// Its size in bytes.
pub const INTEROP_FILE_BYTES: usize = 256 * 1024;
/// The `wording` of the preset's business failure.
pub const INTEROP_FAILURE_WORDING: &str = "group not found";

/// How to start the fake.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// When set, every request must carry this access token.
    pub token: Option<String>,
}

/// A misbehaviour to inject for one action name (see [`FakeSnowLuma::set_fault`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Wait this long before answering normally. If the client hangs up
    /// meanwhile, the action is logged in [`FakeSnowLuma::closed_while_pending`].
    Delay(Duration),
    /// Never answer; log the action when the client hangs up.
    Hang,
    /// Send the response head announcing the full Content-Length (or a chunked
    /// head for Stream actions), then half of the body, then close.
    DisconnectMidBody,
    /// HTTP 200 with the body `{"status":`.
    MalformedJson,
    /// HTTP 500 with `{status:'failed', retcode:1200, ...}`.
    Http500,
    /// A valid `ok` envelope whose `data` is a string of this many bytes.
    OversizeBody(usize),
    /// HTTP 200 with the body `[1,2]`.
    NonObject,
    /// HTTP 200 with exactly these bytes as the body (for bodies a `Value`
    /// cannot build, e.g. nesting deeper than serde_json's limit).
    RawBody(Vec<u8>),
    /// Answer normally, announcing keep-alive, then close the connection
    /// anyway (a server whose idle keep-alive timer fired); the close is
    /// listed in [`FakeSnowLuma::closed_by_server`].
    CloseAfterResponse,
    /// Write the body in pieces of this many bytes (one write, and for Stream
    /// actions one HTTP chunk, per piece) regardless of frame boundaries.
    StreamSplit(usize),
    /// Stream actions: write the body one byte at a time, waiting this long
    /// after each byte (a server that trickles).
    Trickle(Duration),
    /// Answer a Stream action with exactly these frames (each followed by
    /// `\r\n\r\n`), instead of what the action would send: for testing how a
    /// client handles malformed streams.
    StreamFrames(Vec<serde_json::Value>),
    /// Send these Stream frames, then keep the response open without
    /// finishing it until the client hangs up (recorded like [`Fault::Hang`]).
    StreamThenHang(Vec<serde_json::Value>),
}

/// One request as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path as sent, without the query.
    pub path: String,
    /// Raw query string without `?`; empty when there was none.
    pub query: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunked request bodies are de-chunked).
    pub body: Vec<u8>,
    /// The action the request named, if it named one.
    pub action: Option<String>,
}

impl RecordedRequest {
    /// First value of a header (`name` is matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Mutable server state, behind one mutex (never held across an await).
#[derive(Default)]
pub(crate) struct State {
    pub responses: HashMap<String, Value>,
    pub faults: HashMap<String, Fault>,
    pub files: HashMap<String, Arc<Vec<u8>>>,
    pub requests: Vec<RecordedRequest>,
    pub closed: Vec<String>,
    /// Actions after whose response the server closed the connection itself
    /// ([`Fault::CloseAfterResponse`]), recorded once the socket is closed.
    pub server_closed: Vec<String>,
    pub uploads: HashMap<String, stream::UploadStream>,
    pub uploaded: HashMap<String, Vec<u8>>,
    /// The golden preset is on ([`FakeSnowLuma::golden_preset`]).
    pub golden: bool,
    /// Its armed one-shot faults, by action.
    pub golden_faults: HashMap<String, GoldenFault>,
}

pub(crate) struct Shared {
    pub token: Option<String>,
    state: Mutex<State>,
    closed_notify: Notify,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not wedge the fake: keep using the state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs that the client hung up while `action` was pending, and wakes waiters.
    pub fn record_closed(&self, action: &str) {
        self.lock().closed.push(action.to_string());
        self.closed_notify.notify_waiters();
    }
}

/// Stops the accept loop when the last [`FakeSnowLuma`] clone is dropped.
struct AcceptLoop(JoinHandle<()>);

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A running fake. Clones share the same server; the listener closes when the
/// last clone is dropped (connections already open finish on their own).
#[derive(Clone)]
pub struct FakeSnowLuma {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _accept_loop: Arc<AcceptLoop>,
}

impl std::fmt::Debug for FakeSnowLuma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSnowLuma").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl FakeSnowLuma {
    /// Binds 127.0.0.1 on an ephemeral port and spawns the accept loop on the
    /// current tokio runtime.
    pub async fn start(opts: FakeOptions) -> std::io::Result<FakeSnowLuma> {
        Self::start_on_port(opts, 0).await
    }

    /// Like [`FakeSnowLuma::start`] on a chosen port of 127.0.0.1 (0 = ephemeral).
    pub async fn start_on_port(opts: FakeOptions, port: u16) -> std::io::Result<FakeSnowLuma> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let addr = listener.local_addr()?;
        let shared =
            Arc::new(Shared { token: opts.token, state: Mutex::new(State::default()), closed_notify: Notify::new() });
        let task = tokio::spawn(server::accept_loop(shared.clone(), listener));
        Ok(FakeSnowLuma { shared, addr, _accept_loop: Arc::new(AcceptLoop(task)) })
    }

    /// `http://127.0.0.1:<port>/`, the value for `SNOWLUMA_MCP_ENDPOINT`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `action` with exactly this envelope (HTTP 200, plus the request's
    /// `echo`), taking precedence over the built-in handlers.
    pub fn set_response(&self, action: &str, envelope: Value) {
        self.shared.lock().responses.insert(action.to_string(), envelope);
    }

    /// Injects `fault` for every later request naming `action`.
    pub fn set_fault(&self, action: &str, fault: Fault) {
        self.shared.lock().faults.insert(action.to_string(), fault);
    }

    pub fn clear_fault(&self, action: &str) {
        self.shared.lock().faults.remove(action);
    }

    /// Makes `bytes` downloadable as `file` (or `file_id`) `name` by the
    /// `download_file*_stream` actions.
    pub fn add_file(&self, name: &str, bytes: Vec<u8>) {
        self.shared.lock().files.insert(name.to_string(), Arc::new(bytes));
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Actions whose client hung up before the answer was complete (during a
    /// `Delay`/`Hang` fault, or while a Stream body was being written).
    /// Actions whose connection the server closed after answering
    /// ([`Fault::CloseAfterResponse`]); listed once the socket is closed.
    pub fn closed_by_server(&self) -> Vec<String> {
        self.shared.lock().server_closed.clone()
    }

    pub fn closed_while_pending(&self) -> Vec<String> {
        self.shared.lock().closed.clone()
    }

    /// Waits until `action` appears in [`FakeSnowLuma::closed_while_pending`]
    /// (immediately if it already has); `false` on timeout.
    pub async fn wait_closed_while_pending(&self, action: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let seen = || self.shared.lock().closed.iter().any(|a| a == action);
        loop {
            // Register interest before checking, so a close in between is not missed.
            let notified = self.shared.closed_notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if seen() {
                return true;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return seen(),
            }
        }
    }

    /// The fixed set-up the interoperability clients (`tests/interop/`) are
    /// written against, shared by the Rust harness and `snowluma-fake
    /// --preset interop`:
    ///
    /// * `get_status` answers normally (a read that succeeds);
    /// * `send_group_msg` answers a business failure (`retcode` 100,
    ///   `wording` [`INTEROP_FAILURE_WORDING`]): `outcome: "failed"`;
    /// * [`INTEROP_FILE`] (256 KiB, 4 chunks at the default chunk size) is
    ///   downloadable by `download_file_stream`;
    /// * `get_group_list` never answers ([`Fault::Hang`]): the call a
    ///   client cancels.
    pub fn interop_preset(&self) {
        self.set_response(
            "send_group_msg",
            serde_json::json!({"status": "failed", "retcode": 100, "data": null, "wording": INTEROP_FAILURE_WORDING}),
        );
        self.add_file(INTEROP_FILE, (0..INTEROP_FILE_BYTES).map(|i| (i % 251) as u8).collect());
        self.set_fault("get_group_list", Fault::Hang);
    }

    /// A fake started with the golden preset ([`FakeSnowLuma::golden_preset`]).
    pub async fn golden(token: Option<&str>) -> std::io::Result<FakeSnowLuma> {
        let fake = FakeSnowLuma::start(FakeOptions { token: token.map(str::to_owned) }).await?;
        fake.golden_preset();
        Ok(fake)
    }

    /// The fake the Node server's transcripts were recorded against
    /// (`shared/reference/upstream/node-transcripts.jsonl`, sessions 4–13):
    /// its fixed answers, `fake://N` downloads, undelimited upload and
    /// failed-download bodies, and its one-shot faults ([`GoldenFault`],
    /// armed with [`FakeSnowLuma::arm_fault`] or `POST /__fault {"action",
    /// "mode"}`, cleared with [`FakeSnowLuma::reset_faults`] or `POST
    /// /__reset`). See the `golden` module for the details.
    pub fn golden_preset(&self) {
        for (action, envelope) in golden::preset_responses() {
            self.set_response(action, envelope);
        }
        self.shared.lock().golden = true;
    }

    /// Arms `fault` for the next request naming `action` (golden preset).
    pub fn arm_fault(&self, action: &str, fault: GoldenFault) {
        self.shared.lock().golden_faults.insert(action.to_owned(), fault);
    }

    /// [`FakeSnowLuma::arm_fault`] by the transcripts' name of the fault
    /// (`non_json`, `http500`, …, `giant_frame`).
    pub fn arm_fault_named(&self, action: &str, mode: &str) -> Result<(), UnknownFault> {
        self.arm_fault(action, mode.parse()?);
        Ok(())
    }

    /// Disarms every golden fault not yet used.
    pub fn reset_faults(&self) {
        self.shared.lock().golden_faults.clear();
    }

    /// The reassembled bytes of a completed `upload_file_stream` upload.
    pub fn uploaded(&self, stream_id: &str) -> Option<Vec<u8>> {
        self.shared.lock().uploaded.get(stream_id).cloned()
    }
}
