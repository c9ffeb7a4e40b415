//! The HTTP front of `serve-http`: accepts connections (TLS when
//! configured), checks `Host`, `Origin`, the bearer token and the limits,
//! and relays JSON-RPC between Streamable HTTP and each session tree's
//! stdio socket. It holds no SnowLuma token and opens no file: its
//! listener, its control socket and the sessions' sockets are given to it.

// An early HTTP answer travels as the `Err` of the checks; it is built once
// per refused request, so boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming, SizeHint};
use serde_json::{Value, json};
use sha2::Digest;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use super::door::{self, Door};
use super::message::{self, ClientMessage, Named, Refusal};
use super::relay::{ClientRequest, Kind, Outgoing, Tree};
use snowluma_proto::front::{FrontEnd as Channel, FrontSetup, ToFront, ToLauncher, TokenDigest};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The listener and the control socket, as the launcher places them.
pub const LISTENER_FD: i32 = 3;
pub const CONTROL_FD: i32 = 4;
/// The protocol versions of the session-based (legacy) era.
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];
const KEEPALIVE: Duration = Duration::from_secs(15);
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the headers (hyper) and then the body may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The request bodies the front holds at once (being read, or waiting to be
/// written to their session), all tokens together; beyond it, 503.
pub const REQUEST_BUDGET: usize = 64 * 1024 * 1024;
/// The same for one token; beyond it, 429.
pub const TOKEN_REQUEST_SHARE: usize = REQUEST_BUDGET / 2;

/// The TLS configuration from PEM texts (ring provider, TLS 1.2 and 1.3).
pub fn tls_acceptor(cert: &str, key: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the certificate file".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("the key is not a PEM private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not fit: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

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

#[derive(Default)]
struct Usage {
    sessions: u32,
    requests: u32,
    /// KiB of request bodies held (see [`BodyCharge`]).
    body_kib: usize,
}

/// Who waits for the launcher's answer to a spawn: the session number and
/// its socket, or `None` if it failed; and the token the tree is for.
type SpawnWaiter = (oneshot::Sender<Option<(u64, OwnedFd)>>, TokenDigest);

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

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

async fn serve(
    setup: FrontSetup,
    tls: Option<tokio_rustls::TlsAcceptor>,
    listener: OwnedFd,
    control: OwnedFd,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = if setup.unix {
        let l = std::os::unix::net::UnixListener::from(listener);
        l.set_nonblocking(true)?;
        Listener::Unix(tokio::net::UnixListener::from_std(l)?)
    } else {
        let l = std::net::TcpListener::from(listener);
        l.set_nonblocking(true)?;
        Listener::Tcp(tokio::net::TcpListener::from_std(l)?)
    };
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
    tokio::spawn(control_loop(shared.clone()));
    tokio::spawn(reaper(shared.clone()));
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => return Ok(()),
            a = accept(&listener) => a,
        };
        let (io, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "serve-http: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admitted = shared.door.admit(&peer.group);
        shared.door.report();
        let Some(admitted) = admitted else {
            // Every place is held by connections with a valid token.
            drop(io);
            continue;
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let door::Admitted { id, authenticated, close } = admitted;
            let serve = async {
                match (io, tls) {
                    (Accepted::Tcp(s), Some(tls)) => match tls.accept(s).await {
                        Ok(s) => connection(shared.clone(), s, peer, authenticated.clone()).await,
                        Err(_) => tracing::debug!("serve-http: TLS handshake failed"),
                    },
                    (Accepted::Tcp(s), None) => connection(shared.clone(), s, peer, authenticated.clone()).await,
                    (Accepted::Unix(s), _) => connection(shared.clone(), s, peer, authenticated.clone()).await,
                }
            };
            // A connection without a valid token yet (TLS handshake
            // included) is closed soon, and sooner when its place is needed.
            let pending_expires = async {
                tokio::time::sleep(door::PENDING_LIFETIME).await;
                if authenticated.load(Ordering::Acquire) {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = serve => {}
                () = close.cancelled() => {}
                () = pending_expires => {}
            }
            shared.door.left(id);
        });
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Who is at the other end of a connection.
struct Peer {
    /// The full peer address (`ip:port`, or a Unix client's credentials).
    peer: String,
    /// The client host (`ip`, or `unix:uid=N`): modern requests of one
    /// token from one host share a tree.
    host: String,
    /// What the connection counts against at the door (`door::peer_of`).
    group: String,
}

/// A connection and its peer.
async fn accept(l: &Listener) -> std::io::Result<(Accepted, Peer)> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, a)| {
            (Accepted::Tcp(s), Peer { peer: a.to_string(), host: a.ip().to_string(), group: door::peer_of(&a) })
        }),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| {
            let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials).ok();
            let peer = cred.map(|c| format!("unix:uid={},pid={}", c.uid(), c.pid())).unwrap_or_else(|| "unix".into());
            let host = cred.map(|c| format!("unix:uid={}", c.uid())).unwrap_or_else(|| "unix".into());
            (Accepted::Unix(s), Peer { peer, group: host.clone(), host })
        }),
    }
}

/// One client connection.
struct Conn {
    /// The full peer address (`ip:port`, or a Unix client's credentials).
    peer: String,
    /// The client host (`ip`, or `unix:uid=N`): modern requests of one
    /// token from one host share a tree.
    host: String,
    /// Set once one of its requests presents a valid token (see `door.rs`).
    authenticated: Arc<std::sync::atomic::AtomicBool>,
}

async fn connection<IO>(shared: Arc<Shared>, io: IO, peer: Peer, authenticated: Arc<std::sync::atomic::AtomicBool>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Conn { peer: peer.peer, host: peer.host, authenticated });
    let svc_shared = shared.clone();
    let svc_conn = conn.clone();
    let svc = hyper::service::service_fn(move |req| {
        let shared = svc_shared.clone();
        let conn = svc_conn.clone();
        async move { Ok::<_, Infallible>(handle(shared, conn, req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // max_buf_size bounds hyper's read buffer, which a read can overshoot
    // (a 114 KB header got through); max_header_size is the exact limit on
    // the request line and headers together.
    builder
        .max_buf_size(64 * 1024)
        .max_header_size(64 * 1024)
        .max_headers(64)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    // A request whose connection closes is dropped with it: its guard
    // cancels it (modern) or leaves it to finish (legacy).
    // A client that takes no data for a minute loses the connection, and
    // what was queued for it (see `stall.rs`).
    let io = super::stall::Stalled::new(io, super::stall::WRITE_STALL);
    let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc).await;
}

// ---------------------------------------------------------------------------
// Responses

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed_unsync());
    *r.status_mut() = status;
    if !content_type.is_empty() {
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    r
}

fn rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    full(status, "application/json", serde_json::to_vec(&body).unwrap_or_default())
}

fn empty(status: StatusCode) -> Response<Body> {
    full(status, "", Bytes::new())
}

fn unauthorized() -> Response<Body> {
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

fn json_message(status: StatusCode, msg: Outgoing) -> Response<Body> {
    let left = msg.len() as u64;
    let mut r = Response::new(Pieces { pieces: msg.pieces.into(), left }.boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Held while a request's HTTP response lives: releases its place in the
/// token's request count, and tells the tree when the client went away.
struct Guard {
    shared: Arc<Shared>,
    token_id: String,
    relay: Option<(Arc<Tree>, u64, bool)>,
    done: bool,
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

struct SseState {
    first: Option<Outgoing>,
    rx: UnboundedReceiver<Outgoing>,
    guard: Guard,
    /// The frames of the message being sent: each message is its event
    /// prefix, its pieces (as the session wrote them) and the blank line.
    queue: VecDeque<Bytes>,
}

fn sse(first: Option<Outgoing>, rx: UnboundedReceiver<Outgoing>, guard: Guard) -> Response<Body> {
    let start = SseState { first, rx, guard, queue: VecDeque::new() };
    let stream = futures::stream::unfold(start, |mut st| async move {
        // Bounded: each turn yields a frame, or queues one message's frames.
        loop {
            if let Some(b) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Frame::data(b)), st));
            }
            if st.guard.done {
                return None;
            }
            let next = match st.first.take() {
                Some(m) => Some(m),
                None => tokio::select! {
                    m = st.rx.recv() => m,
                    _ = tokio::time::sleep(KEEPALIVE) => {
                        return Some((Ok(Frame::data(Bytes::from_static(b": keepalive\n\n"))), st));
                    }
                },
            };
            match next {
                // The tree ended without answering: nothing to cancel.
                None => {
                    st.guard.done = true;
                    drop(st);
                    return None;
                }
                Some(msg) => {
                    if msg.kind != Kind::Other {
                        st.guard.done = true;
                    }
                    st.queue.push_back(Bytes::from_static(b"event: message\ndata: "));
                    st.queue.extend(msg.pieces);
                    st.queue.push_back(Bytes::from_static(b"\n\n"));
                }
            }
        }
    });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

// ---------------------------------------------------------------------------
// Checks

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A list header's value over all its lines (`Accept` may be split).
fn header_list(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ")
}

fn host_ok(shared: &Shared, h: &HeaderMap) -> bool {
    header_str(h, "host").is_some_and(|host| shared.allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(host.trim())))
}

fn origin_ok(shared: &Shared, h: &HeaderMap) -> bool {
    match h.get(header::ORIGIN) {
        None => true,
        Some(v) => v.to_str().is_ok_and(|o| {
            let o = o.trim().trim_end_matches('/');
            shared.allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(o))
        }),
    }
}

/// Constant-time equality of two digests.
fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= std::hint::black_box(a[i] ^ b[i]);
    }
    std::hint::black_box(diff) == 0
}

/// The token the request presents (its id and digest), comparing its digest
/// with every configured one (no early exit).
fn authenticate(shared: &Shared, h: &HeaderMap) -> Option<TokenDigest> {
    let value = header_str(h, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let digest: [u8; 32] = sha2::Sha256::digest(token.trim().as_bytes()).into();
    let tokens = shared.tokens.lock().ok()?;
    let mut found = None;
    for t in tokens.iter() {
        if digest_eq(&t.sha256, &digest) {
            found = Some(t.clone());
        }
    }
    found
}

/// Whether `token` (id and digest) is still in the configured set.
fn still_valid(shared: &Shared, token: &TokenDigest) -> bool {
    shared.tokens.lock().is_ok_and(|t| t.iter().any(|x| x.id == token.id && digest_eq(&x.sha256, &token.sha256)))
}

fn acquire_request(shared: &Arc<Shared>, token_id: &str) -> Option<Guard> {
    let mut usage = shared.usage.lock().ok()?;
    let u = usage.entry(token_id.to_owned()).or_default();
    if u.requests >= shared.max_requests {
        return None;
    }
    u.requests += 1;
    Some(Guard { shared: shared.clone(), token_id: token_id.to_owned(), relay: None, done: false })
}

fn too_many(what: &str) -> Response<Body> {
    let mut r = rpc_error(StatusCode::TOO_MANY_REQUESTS, Value::Null, -32000, what);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

// ---------------------------------------------------------------------------
// Trees

/// Take one of the token's session places. At the limit, the token's
/// least recently used *quiet* tree (nothing in flight, no stream open) is
/// ended to make room: many clients never send DELETE when they exit, and
/// their sessions would otherwise hold every place until they expire. Its
/// client, if it comes back, gets 404 and starts a new session, as the
/// transport prescribes. Only when every tree of the token is busy is the
/// answer 429.
async fn take_place(shared: &Arc<Shared>, token_id: &str) -> Result<(), Response<Body>> {
    if try_take_place(shared, token_id)? {
        return Ok(());
    }
    let quietest = shared.trees.lock().ok().and_then(|t| {
        t.iter()
            .filter(|x| x.token_id == token_id && !x.ended.is_cancelled())
            .filter_map(|x| x.quiet_since().map(|since| (since, x.clone())))
            .min_by_key(|(since, _)| *since)
            .map(|(_, x)| x)
    });
    if let Some(tree) = quietest {
        tracing::info!(
            session = tree.session,
            token_id,
            "serve-http: session limit reached; ending the least recently used quiet session"
        );
        end_tree(shared, &tree).await;
        if try_take_place(shared, token_id)? {
            return Ok(());
        }
    }
    Err(too_many("Too many sessions for this token"))
}

/// One of the token's places, if one is free.
fn try_take_place(shared: &Shared, token_id: &str) -> Result<bool, Response<Body>> {
    let mut usage = shared.usage.lock().map_err(|_| empty(StatusCode::INTERNAL_SERVER_ERROR))?;
    let u = usage.entry(token_id.to_owned()).or_default();
    if u.sessions >= shared.max_sessions {
        return Ok(false);
    }
    u.sessions += 1;
    Ok(true)
}

async fn spawn_tree(shared: &Arc<Shared>, token: &TokenDigest, peer: &str) -> Result<Arc<Tree>, Response<Body>> {
    let token_id = token.id.as_str();
    take_place(shared, token_id).await?;
    let release = || {
        if let Ok(mut u) = shared.usage.lock()
            && let Some(u) = u.get_mut(token_id)
        {
            u.sessions = u.sessions.saturating_sub(1);
        }
    };
    let req = shared.next_req.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    if let Ok(mut s) = shared.spawns.lock() {
        s.insert(req, (tx, token.clone()));
    }
    let msg = ToLauncher::Spawn { req, token_id: token_id.to_owned(), peer: peer.to_owned() };
    let got = match shared.control.send(&msg, None).await {
        Ok(()) => tokio::time::timeout(SPAWN_TIMEOUT, rx).await.ok().and_then(Result::ok).flatten(),
        Err(_) => None,
    };
    let Some((session, fd)) = got else {
        if let Ok(mut s) = shared.spawns.lock() {
            s.remove(&req);
        }
        release();
        return Err(rpc_error(StatusCode::SERVICE_UNAVAILABLE, Value::Null, -32603, "Cannot start a session"));
    };
    let stream = std::os::unix::net::UnixStream::from(fd);
    let stream =
        stream.set_nonblocking(true).and_then(|()| tokio::net::UnixStream::from_std(stream)).map_err(|_| {
            release();
            rpc_error(StatusCode::SERVICE_UNAVAILABLE, Value::Null, -32603, "Cannot start a session")
        })?;
    let tree = Tree::start(session, token_id.to_owned(), token.sha256, stream, shared.response_budget.clone());
    if let Ok(mut t) = shared.trees.lock() {
        t.push(tree.clone());
    }
    // A revocation (SIGHUP) may have come while the launcher started this
    // tree: its handler changes the token set first and then ends the trees
    // it finds, and this tree is registered before the set is read here, so
    // either that handler ended it or this check sees the new set.
    if !still_valid(shared, token) {
        tracing::info!(session = tree.session, token_id, "serve-http: the token was revoked while its session started");
        end_tree_as(shared, &tree, true).await;
        return Err(unauthorized());
    }
    Ok(tree)
}

/// Let a tree go (once): cancel its calls, close its stdin, tell the
/// launcher, release its place.
async fn end_tree(shared: &Arc<Shared>, tree: &Arc<Tree>) {
    end_tree_as(shared, tree, false).await;
}

/// [`end_tree`]; `revoked`: its token was revoked, so the launcher kills
/// what is left of it after a short grace, background transfers included.
async fn end_tree_as(shared: &Arc<Shared>, tree: &Arc<Tree>, revoked: bool) {
    let was_live = shared
        .trees
        .lock()
        .map(|mut t| {
            let before = t.len();
            t.retain(|x| !Arc::ptr_eq(x, tree));
            t.len() != before
        })
        .unwrap_or(false);
    if let Ok(mut s) = shared.sessions.lock() {
        s.retain(|_, x| !Arc::ptr_eq(x, tree));
    }
    // (The modern map is not touched here: a spawn may hold it while it
    // waits for the launcher, whose answer this task may be delivering. An
    // ended tree in it is replaced by the next request.)
    tree.end().await;
    if was_live {
        if let Ok(mut u) = shared.usage.lock()
            && let Some(u) = u.get_mut(&tree.token_id)
        {
            u.sessions = u.sessions.saturating_sub(1);
        }
        let _ = shared.control.send(&ToLauncher::End { session: tree.session, revoked }, None).await;
    }
}

async fn control_loop(shared: Arc<Shared>) {
    loop {
        match shared.control.recv().await {
            Ok((ToFront::Spawned { req, session }, Some(fd))) => {
                let waiter = shared.spawns.lock().ok().and_then(|mut s| s.remove(&req));
                // A tree nobody waits for any more (the spawn timed out) is
                // let go at once; killed soon if its token was revoked since.
                let orphan = match waiter {
                    Some((w, token)) => match w.send(Some((session, fd))) {
                        Ok(()) => None,
                        Err(_) => Some(!still_valid(&shared, &token)),
                    },
                    None => Some(false),
                };
                if let Some(revoked) = orphan {
                    let _ = shared.control.send(&ToLauncher::End { session, revoked }, None).await;
                }
            }
            Ok((ToFront::SpawnFailed { req }, _)) | Ok((ToFront::Spawned { req, .. }, None)) => {
                if let Some((w, _)) = shared.spawns.lock().ok().and_then(|mut s| s.remove(&req)) {
                    let _ = w.send(None);
                }
            }
            Ok((ToFront::Tokens(new), _)) => {
                // The new set first, then the trees (see `spawn_tree`): a
                // tree of a token no longer in the set (removed, or its
                // value changed) ends, and is killed after a short grace.
                if let Ok(mut t) = shared.tokens.lock() {
                    *t = new;
                }
                let ending: Vec<Arc<Tree>> = shared
                    .trees
                    .lock()
                    .map(|t| t.iter().cloned().collect::<Vec<_>>())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|x| !still_valid(&shared, &TokenDigest { id: x.token_id.clone(), sha256: x.token_sha256 }))
                    .collect();
                for t in ending {
                    end_tree_as(&shared, &t, true).await;
                }
            }
            Ok((ToFront::Exited { session }, _)) => {
                let tree = shared.trees.lock().ok().and_then(|t| t.iter().find(|x| x.session == session).cloned());
                if let Some(t) = tree {
                    end_tree(&shared, &t).await;
                }
            }
            Ok((ToFront::Setup(_), _)) => {}
            Err(e) => {
                tracing::error!(error = %e, "serve-http: the launcher is gone; the front stops");
                shared.shutdown.cancel();
                return;
            }
        }
    }
}

/// End trees that have been idle too long or whose server ended.
async fn reaper(shared: Arc<Shared>) {
    let every = shared.idle.min(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        // What the door did in a flood is reported after it too.
        shared.door.report();
        let due: Vec<Arc<Tree>> = shared
            .trees
            .lock()
            .map(|t| t.iter().filter(|x| x.ended.is_cancelled() || x.idle_for(shared.idle)).cloned().collect())
            .unwrap_or_default();
        for t in due {
            if !t.ended.is_cancelled() {
                tracing::info!(session = t.session, "serve-http: an idle session expired");
            }
            end_tree(&shared, &t).await;
        }
        // Forget ended modern trees (not while a spawn holds the map).
        if let Ok(mut modern) = shared.modern.try_lock() {
            modern.retain(|_, t| !t.ended.is_cancelled());
        }
    }
}

// ---------------------------------------------------------------------------
// Requests

/// Header fields a request may carry at most once: which of two lines a
/// reader takes would decide who the request is from or what it is.
const SINGLE: [&str; 7] = [
    "authorization",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
];

/// A refusal of a request's head; the connection is closed after it, since
/// what follows on it cannot be trusted to be framed as we read it.
fn refuse_head(status: StatusCode, why: &str) -> Response<Body> {
    let mut r = rpc_error(status, Value::Null, -32000, why);
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// What RFC 9112 requires and hyper leaves to its server: exactly one valid
/// `Host` (§3.2; with an absolute-form target, the same authority), and
/// `Transfer-Encoding` only as one `chunked` (§6.1: chunked applied twice,
/// or another coding, is not a body we can frame). `Origin` and the fields
/// that name the principal or the request appear at most once.
fn strict_head(req: &Request<Incoming>) -> Result<(), Response<Body>> {
    let h = req.headers();
    let mut hosts = h.get_all(header::HOST).iter();
    let host = match (hosts.next().map(HeaderValue::to_str), hosts.next()) {
        (Some(Ok(host)), None) if !host.trim().is_empty() => host.trim(),
        (None, _) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: the Host header is missing")),
        (_, Some(_)) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: more than one Host header")),
        (Some(_), None) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: an invalid Host header")),
    };
    if let Some(authority) = req.uri().authority()
        && !authority.as_str().eq_ignore_ascii_case(host)
    {
        return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: the request target names another host"));
    }
    if h.get_all(header::ORIGIN).iter().nth(1).is_some() {
        return Err(refuse_head(StatusCode::FORBIDDEN, "Forbidden: more than one Origin header"));
    }
    if let Some(name) = SINGLE.iter().find(|n| h.get_all(**n).iter().nth(1).is_some()) {
        return Err(refuse_head(StatusCode::BAD_REQUEST, &format!("Bad Request: more than one {name} header")));
    }
    let mut codings = h.get_all(header::TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(te), None) if te.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("chunked")) => Ok(()),
        _ => Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: Transfer-Encoding other than one chunked coding")),
    }
}

/// (hyper itself refuses what it cannot frame: an invalid or conflicting
/// `Content-Length`, a final coding other than chunked, malformed chunks;
/// and it closes the connection after a request with both
/// `Transfer-Encoding` and `Content-Length`, as RFC 9112 §6.3 requires.)
async fn handle(shared: Arc<Shared>, conn: Arc<Conn>, req: Request<Incoming>) -> Response<Body> {
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

fn get(shared: Arc<Shared>, token_id: String, h: &HeaderMap) -> Response<Body> {
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

/// A request body's place in the front's budgets: all tokens'
/// ([`REQUEST_BUDGET`]) and its token's ([`TOKEN_REQUEST_SHARE`]). Held
/// until the body is written to its session (or dropped).
struct BodyCharge {
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
async fn read_body(
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

async fn post(shared: Arc<Shared>, conn: Arc<Conn>, token: TokenDigest, req: Request<Incoming>) -> Response<Body> {
    let token_id = token.id.clone();
    let headers = req.headers().clone();
    let accept = header_list(&headers, header::ACCEPT).to_ascii_lowercase();
    let any = accept.is_empty() || accept.contains("*/*");
    let wants_sse = any || accept.contains("text/event-stream");
    if !(any || wants_sse || accept.contains("application/json")) {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            Value::Null,
            -32000,
            "Not Acceptable: accept application/json and text/event-stream",
        );
    }
    let json_body = header_str(&headers, "content-type")
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Value::Null,
            -32000,
            "Unsupported Media Type: application/json",
        );
    }
    let (mut body, charge) = match read_body(&shared, &token_id, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    // Only the envelope is read; the body goes on as the client sent it.
    let msg = match message::client(&body) {
        Ok(m) => m,
        Err(Refusal::Parse) => return rpc_error(StatusCode::BAD_REQUEST, Value::Null, -32700, "Parse error"),
        Err(Refusal::Invalid(why)) => {
            return rpc_error(StatusCode::BAD_REQUEST, Value::Null, -32600, &format!("Invalid Request: {why}"));
        }
    };
    message::one_line(&mut body);
    let id: Value = msg.id.as_ref().map(|i| i.value.clone()).unwrap_or(Value::Null);
    let is_request = msg.is_request();
    let legacy_versions_ok = |h: &HeaderMap| match header_str(h, "mcp-protocol-version") {
        None => true,
        Some(v) => LEGACY_VERSIONS.contains(&v),
    };
    let relayed = Relayed { body, msg, charge };
    if headers.contains_key("mcp-session-id") {
        let tree = match legacy_session(&shared, &token_id, &headers) {
            Ok(t) => t,
            Err(r) => return r,
        };
        if !legacy_versions_ok(&headers) {
            return rpc_error(StatusCode::BAD_REQUEST, id, -32600, "Unsupported MCP-Protocol-Version");
        }
        return relay(&shared, &tree, relayed, &token_id, Era::Legacy, wants_sse, None).await;
    }
    // A message of the modern era: its header or its `_meta` names a
    // revision the legacy era does not have.
    let modern_signal = relayed.msg.version_key
        || header_str(&headers, "mcp-protocol-version").is_some_and(|v| !LEGACY_VERSIONS.contains(&v));
    // `initialize` opens a legacy session; sent the modern way it is a
    // method that revision removed, answered by a tree (-32601, 404).
    if relayed.msg.method.as_deref() == Some("initialize") && is_request && !modern_signal {
        let tree = match spawn_tree(&shared, &token, &conn.peer).await {
            Ok(t) => t,
            Err(r) => return r,
        };
        let sid = snowluma_proto::bytes::hex(&snowluma_proto::bytes::random_bytes::<16>());
        if let Ok(mut s) = shared.sessions.lock() {
            s.insert(sid.clone(), tree.clone());
        }
        tracing::info!(session = tree.session, token_id = %token_id, "serve-http: legacy session opened");
        return relay(&shared, &tree, relayed, &token_id, Era::Legacy, wants_sse, Some(sid)).await;
    }
    if !modern_signal {
        return rpc_error(StatusCode::BAD_REQUEST, id, -32600, "Bad Request: Mcp-Session-Id header is required");
    }
    if !is_request {
        // A modern notification (a `notifications/cancelled` naming one of
        // this client's requests) goes to the client's tree, if it has one;
        // there is nothing else to do with it (no sessions, no responses to
        // server requests in this era).
        let tree = shared.modern.lock().await.get(&(token_id.clone(), conn.host.clone())).cloned();
        if let Some(tree) = tree
            && !tree.ended.is_cancelled()
        {
            let Relayed { body, msg, charge } = relayed;
            tree.forward(body, cancels(&msg), charge).await;
        }
        return empty(StatusCode::ACCEPTED);
    }
    if let Err(why) = check_modern_headers(&headers, &relayed.msg) {
        return rpc_error(StatusCode::BAD_REQUEST, id, -32020, &format!("Header mismatch: {why}"));
    }
    // The modern era has no sessions: its state lives in explicit handles
    // (event resource URIs, requestState) that a client may use from any of
    // its connections, and an HTTP/1.1 client needs several connections for
    // concurrent requests (a subscriptions/listen stream and its calls).
    // So the modern requests of one token from one client host share one
    // tree; other tokens and other hosts never do.
    let tree = {
        let mut modern = shared.modern.lock().await;
        let key = (token_id.clone(), conn.host.clone());
        match modern.get(&key) {
            Some(t) if !t.ended.is_cancelled() => t.clone(),
            _ => match spawn_tree(&shared, &token, &conn.host).await {
                Ok(t) => {
                    modern.insert(key, t.clone());
                    t
                }
                Err(r) => return r,
            },
        }
    };
    // A request without the `_meta` every modern request carries is
    // rejected by the session (-32602), and over HTTP with a 400.
    let meta_complete = relayed.msg.version.is_some() && relayed.msg.capabilities_object;
    let era = Era::Modern { meta_complete };
    relay(&shared, &tree, relayed, &token_id, era, wants_sse, None).await
}

/// A client message on its way to a tree: its body (one line), what the
/// front read of it, and its place in the budgets.
struct Relayed {
    body: Vec<u8>,
    msg: ClientMessage,
    charge: BodyCharge,
}

/// The id a `notifications/cancelled` names, to be translated.
fn cancels(msg: &ClientMessage) -> Option<message::Id> {
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

async fn relay(
    shared: &Arc<Shared>,
    tree: &Arc<Tree>,
    relayed: Relayed,
    token_id: &str,
    era: Era,
    wants_sse: bool,
    session_id: Option<String>,
) -> Response<Body> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

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
    fn digests_compare_whole() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(digest_eq(&a, &b));
        b[31] ^= 1;
        assert!(!digest_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!digest_eq(&a, &b));
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
