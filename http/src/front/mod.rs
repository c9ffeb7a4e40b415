//! The HTTP front of `serve-http`: accepts connections (TLS when
//! configured), checks `Host`, `Origin`, the bearer token and the limits,
//! and relays JSON-RPC between Streamable HTTP and each session tree's
//! stdio socket. It holds no SnowLuma token and opens no file: its
//! listener, its control socket and the sessions' sockets are given to it.
//!
//! This module is the front's entry: it takes its descriptors, receives its
//! setup, confines itself, and builds the state every request shares
//! ([`Shared`]). The rest, in the order a request meets it:
//!
//! * [`accept`]: the listener, the accept loop, TLS, one connection.
//! * [`auth`]: the head's framing rules, `Host`, `Origin` and the token.
//! * [`requests`]: the method and era of a request, and relaying it to its
//!   tree and its answer back.
//! * [`limits`]: the per-token request count and the request body budgets.
//! * [`sessions`]: the session trees' lifecycle (session places, spawn,
//!   end), the control loop with the launcher and the idle reaper.
//! * [`sse`]: event streams.
//! * [`responses`]: the HTTP answers the others build.

// An early HTTP answer travels as the `Err` of the checks; it is built once
// per refused request, so boxing it would buy nothing.
#![allow(clippy::result_large_err)]

mod accept;
mod auth;
mod limits;
mod requests;
mod responses;
mod sessions;
mod sse;

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::door::Door;
use super::relay::Tree;
use limits::Usage;
use sessions::SpawnWaiter;
use snowluma_proto::front::{FrontEnd as Channel, FrontSetup, ToFront, TokenDigest};

pub use accept::tls_acceptor;
pub use limits::{REQUEST_BUDGET, TOKEN_REQUEST_SHARE};

/// The listener and the control socket, as the launcher places them.
pub const LISTENER_FD: i32 = 3;
pub const CONTROL_FD: i32 = 4;
/// The protocol versions of the session-based (legacy) era.
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// The front's whole life; `allow_unconfined` lets it serve on a kernel
/// that cannot fully confine it (the operator's opt-out).
pub fn main(allow_unconfined: bool) -> ExitCode {
    // Name, descriptors, capabilities, no new privileges: before anything
    // else runs in this process.
    if let Err(e) = snowluma_sandbox::prepare_http_front() {
        snowluma_logsink::eprintln_nb!("snowluma-mcp: the HTTP front cannot prepare its confinement: {e}");
        return ExitCode::from(2);
    }
    // SAFETY: the launcher placed the control socket on fd 4 and the
    // listener on fd 3 for this process alone; each is taken once.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // SAFETY: as above.
    let listener = unsafe { OwnedFd::from_raw_fd(LISTENER_FD) };
    let setup = match snowluma_proto::front::recv_blocking::<ToFront>(&control) {
        Ok((ToFront::Setup(s), _)) => *s,
        Ok(_) | Err(_) => {
            snowluma_logsink::eprintln_nb!("snowluma-mcp: the HTTP front received no setup");
            return ExitCode::from(2);
        }
    };
    let tls = match &setup.tls {
        None => None,
        Some((cert, key)) => match tls_acceptor(cert, key) {
            Ok(a) => Some(a),
            Err(e) => {
                snowluma_logsink::eprintln_nb!("snowluma-mcp: the HTTP front: TLS: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            snowluma_logsink::eprintln_nb!("snowluma-mcp: the HTTP front cannot start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The runtime exists (its epoll and eventfd were made before the filter
    // forbids making them) and no thread was started: confine now.
    match snowluma_sandbox::confine_http_front(allow_unconfined) {
        Ok(report) => tracing::debug!(seccomp = report.seccomp, "the HTTP front is confined"),
        Err(e) => {
            snowluma_logsink::eprintln_nb!("snowluma-mcp: the HTTP front cannot confine itself: {e}");
            return ExitCode::from(2);
        }
    }
    match rt.block_on(serve(setup, tls, listener, control)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "the HTTP front stopped");
            ExitCode::FAILURE
        }
    }
}

/// The state every connection and request of the front shares.
struct Shared {
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    max_sessions: u32,
    max_requests: u32,
    idle: Duration,
    max_body: usize,
    tokens: Mutex<Vec<TokenDigest>>,
    /// Legacy sessions by `Mcp-Session-Id`.
    sessions: Mutex<HashMap<String, Arc<Tree>>>,
    /// Modern trees by (token id, client host); held across a spawn so that
    /// concurrent first requests start one tree.
    modern: tokio::sync::Mutex<HashMap<(String, String), Arc<Tree>>>,
    /// Every live tree (legacy and modern).
    trees: Mutex<Vec<Arc<Tree>>>,
    usage: Mutex<HashMap<String, Usage>>,
    control: Channel,
    spawns: Mutex<HashMap<u64, SpawnWaiter>>,
    next_req: AtomicU64,
    shutdown: CancellationToken,
    /// KiB of request bodies ([`REQUEST_BUDGET`]).
    request_budget: Arc<Semaphore>,
    /// KiB of lines read from the sessions and not yet taken by their
    /// clients (`relay::RESPONSE_BUDGET_KIB`).
    response_budget: Arc<Semaphore>,
    /// The connections (see `door.rs`).
    door: Door,
}

/// Serve until the launcher goes: the state, the control loop and the
/// reaper, then the accept loop.
async fn serve(
    setup: FrontSetup,
    tls: Option<tokio_rustls::TlsAcceptor>,
    listener: OwnedFd,
    control: OwnedFd,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = accept::Listener::new(listener, setup.unix)?;
    let shared = Arc::new(Shared {
        allowed_hosts: setup.allowed_hosts,
        allowed_origins: setup.allowed_origins,
        max_sessions: setup.max_sessions_per_token,
        max_requests: setup.max_requests_per_token,
        idle: Duration::from_secs(setup.idle_timeout_secs),
        max_body: setup.max_body_bytes,
        tokens: Mutex::new(setup.tokens),
        sessions: Mutex::new(HashMap::new()),
        modern: tokio::sync::Mutex::new(HashMap::new()),
        trees: Mutex::new(Vec::new()),
        usage: Mutex::new(HashMap::new()),
        control: Channel::new(control)?,
        spawns: Mutex::new(HashMap::new()),
        next_req: AtomicU64::new(1),
        shutdown: CancellationToken::new(),
        request_budget: Arc::new(Semaphore::new(REQUEST_BUDGET / 1024)),
        response_budget: Arc::new(Semaphore::new(super::relay::RESPONSE_BUDGET_KIB)),
        door: Door::default(),
    });
    tokio::spawn(sessions::control_loop(shared.clone()));
    tokio::spawn(sessions::reaper(shared.clone()));
    accept::accept_loop(shared, listener, tls).await;
    Ok(())
}
