//! Worker lifecycle and the supervisor side of IPC, generic over roles.
//!
//! Each [`WorkerSlot`] owns one role: it spawns the worker (our own binary,
//! executed by the spawner through the descriptor it opened at startup, with an empty
//! environment and only the IPC socket on descriptor 3), performs the
//! handshake and configuration, routes replies and progress by request id,
//! and restarts the worker with backoff when it dies. Calls in flight when a
//! worker dies fail with [`CallError::WorkerDied`]; nothing is replayed.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use snowluma_proto::fdpass::FdReceiver;
use snowluma_proto::outbox::Outbox;
use snowluma_proto::sockio::{SockReader, SockWriter};
use snowluma_proto::{
    BUILD_ID, EventMsg, FrameError, FromWorker, Hello, Progress, Reply, Request, Role, ToWorker, WORKER_IPC_FD,
    WorkerConfig, read_buffered_frame, read_frame, write_frame,
};
pub use snowluma_sandbox::role::ChannelDir;
use snowluma_sandbox::role::Slot;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error, Clone)]
pub enum CallError {
    #[error("{0} 工作进程在处理本次调用时退出；本次调用不会重试。")]
    WorkerDied(&'static str),
    #[error("{0} 工作进程当前不可用（正在重启或未能启动）。")]
    Unavailable(&'static str),
    #[error("调用已取消。")]
    Cancelled,
    #[error("请求（{bytes} 字节）超过本服务器进程间 {limit} 字节的上限，未发送。")]
    TooLarge { bytes: usize, limit: usize },
}

/// How long a call waits for a restarting worker before giving up.
const AVAILABILITY_WAIT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(50);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A worker that lived this long resets the backoff.
pub(crate) const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// Where a request's reply goes.
enum Completion {
    /// To the call awaiting it ([`Sent::reply`]).
    Awaited(oneshot::Sender<Result<Reply, CallError>>),
    /// Into a function, run where the reply is read ([`Sent::then`]).
    Then(Then),
}

/// A function a reply is handed to ([`Sent::then`]).
type Then = Box<dyn FnOnce(Result<Reply, CallError>) + Send>;

impl Completion {
    fn complete(self, result: Result<Reply, CallError>) {
        match self {
            Completion::Awaited(tx) => {
                let _ = tx.send(result);
            }
            Completion::Then(then) => then(result),
        }
    }
}

struct Pending {
    reply: Completion,
    progress: Option<mpsc::UnboundedSender<Progress>>,
    /// Where an event connection's reports go ([`WorkerSlot::call_with_events`]).
    events: Option<mpsc::UnboundedSender<EventMsg>>,
}

struct Conn {
    /// Frames to the worker, written by the call that sends them when
    /// nothing is ahead ([`Outbox`]).
    outbox: Arc<Outbox>,
    /// Our end of the descriptor channel, when we send descriptors to the worker.
    fd_out: Option<OwnedFd>,
    /// Descriptors the worker sent us, by tag.
    fd_in: Option<FdReceiver>,
    pending: Mutex<HashMap<u64, Pending>>,
}

pub struct WorkerSlot {
    role: Role,
    live: watch::Receiver<Option<Arc<Conn>>>,
    next_id: AtomicU64,
    stop: CancellationToken,
}

/// Extra descriptors a role's worker gets in every incarnation.
#[derive(Default)]
pub struct Attach {
    /// Descriptors placed at fixed numbers (e.g. pre-opened directories).
    pub fds: Vec<(i32, Arc<OwnedFd>)>,
    /// A fresh descriptor channel at this number, and which way it carries descriptors.
    pub channel: Option<(i32, ChannelDir)>,
}

impl Attach {
    /// The attachments of `role`, from its table (`snowluma_sandbox::role`):
    /// each directory the caller opened, at its slot's number, and the
    /// role's descriptor channel if it has one. A slot the role's table
    /// does not have is not attached.
    pub fn for_role(role: Role, dirs: Vec<(Slot, Arc<OwnedFd>)>) -> Attach {
        let spec = snowluma_sandbox::role::spec(role);
        let fds = dirs
            .into_iter()
            .filter_map(|(slot, fd)| match spec.fd(slot) {
                Some(f) => Some((f.fd, fd)),
                None => {
                    tracing::error!(worker = role.as_str(), ?slot, "the role has no such descriptor; not attached");
                    None
                }
            })
            .collect();
        Attach { fds, channel: spec.channel() }
    }
}

pub struct SpawnSpec {
    /// Workers are started by the spawner (see the `snowluma-spawner` crate).
    pub spawner: Arc<snowluma_spawner::SpawnerClient>,
    pub log_filter: String,
    /// Per-role confinement grants, appended to the worker's argv
    /// (`ports=…`, `unconfined-ok`; see `snowluma_sandbox::Grants`).
    pub grants: snowluma_sandbox::WorkerGrants,
    /// Cancelled when a worker stops that cannot be replaced (the network
    /// executor after the token was handed to it): the session ends.
    pub fatal: CancellationToken,
}

impl WorkerSlot {
    /// Start supervising `role`; the first worker is spawned immediately.
    pub fn start(role: Role, config: WorkerConfig, spec: Arc<SpawnSpec>, attach: Attach) -> Arc<WorkerSlot> {
        let (live_tx, live_rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let slot = Arc::new(WorkerSlot { role, live: live_rx, next_id: AtomicU64::new(1), stop: stop.clone() });
        tokio::spawn(supervise(role, config, spec, Arc::new(attach), live_tx, stop));
        slot
    }

    /// Send a descriptor to the worker on its channel, tagged.
    pub async fn send_fd(
        &self,
        tag: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        cancel: &CancellationToken,
    ) -> Result<(), CallError> {
        let conn = self.conn(cancel).await?;
        let out = conn.fd_out.as_ref().ok_or(CallError::Unavailable(self.role.as_str()))?;
        snowluma_proto::fdpass::send_blocking(std::os::fd::AsFd::as_fd(out), tag, fd)
            .map_err(|_| CallError::WorkerDied(self.role.as_str()))
    }

    /// Take the descriptor the worker sent with `tag`.
    pub async fn claim_fd(&self, tag: u64, cancel: &CancellationToken) -> Result<OwnedFd, CallError> {
        let conn = self.conn(cancel).await?;
        let rx = conn.fd_in.as_ref().ok_or(CallError::Unavailable(self.role.as_str()))?;
        rx.claim(tag, Duration::from_secs(10)).await.map_err(|_| CallError::WorkerDied(self.role.as_str()))
    }

    /// Give up on the descriptor tagged `tag` from the worker: dropped now if
    /// it has arrived, on arrival otherwise.
    pub fn forget_fd(&self, tag: u64) {
        if let Some(c) = self.live.borrow().clone()
            && let Some(rx) = &c.fd_in
        {
            rx.discard(tag);
        }
    }

    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// The live worker's connection, if one is live now.
    fn live_conn(&self) -> Option<Arc<Conn>> {
        self.live.borrow().clone()
    }

    async fn conn(&self, cancel: &CancellationToken) -> Result<Arc<Conn>, CallError> {
        // The usual case, a live worker, needs no wait and no timer.
        if let Some(c) = self.live_conn() {
            return Ok(c);
        }
        let mut rx = self.live.clone();
        let wait = async {
            loop {
                if let Some(c) = rx.borrow_and_update().clone() {
                    return Ok(c);
                }
                if rx.changed().await.is_err() {
                    return Err(CallError::Unavailable(self.role.as_str()));
                }
            }
        };
        tokio::select! {
            r = wait => r,
            _ = cancel.cancelled() => Err(CallError::Cancelled),
            _ = tokio::time::sleep(AVAILABILITY_WAIT) => Err(CallError::Unavailable(self.role.as_str())),
        }
    }

    /// Send one request and wait for its reply. Cancelling `cancel` sends a
    /// cancel message to the worker and returns [`CallError::Cancelled`].
    pub async fn call(
        &self,
        request: Request,
        cancel: &CancellationToken,
        progress: Option<mpsc::UnboundedSender<Progress>>,
    ) -> Result<Reply, CallError> {
        self.call_inner(request, cancel, progress, None).await
    }

    /// [`Self::call`] for a request that reports [`FromWorker::Event`]s
    /// before its reply (an event connection): they go to `events`.
    pub async fn call_with_events(
        &self,
        request: Request,
        cancel: &CancellationToken,
        events: mpsc::UnboundedSender<EventMsg>,
    ) -> Result<Reply, CallError> {
        self.call_inner(request, cancel, None, Some(events)).await
    }

    async fn call_inner(
        &self,
        request: Request,
        cancel: &CancellationToken,
        progress: Option<mpsc::UnboundedSender<Progress>>,
        events: Option<mpsc::UnboundedSender<EventMsg>>,
    ) -> Result<Reply, CallError> {
        // A live worker needs no wait (the wait's state, timer included,
        // stays out of every call's future).
        let conn = match self.live_conn() {
            Some(c) => c,
            None => Box::pin(self.conn(cancel)).await?,
        };
        self.send_on(conn, request, progress, events)?.reply(cancel).await
    }

    /// Send `request` now, in the caller's turn, to a live worker: the
    /// reply is then awaited with [`Sent::reply`]. `Err(NotSent::NotLive)`
    /// gives the request back when no worker is live (the caller then uses
    /// [`Self::call`], which waits for one).
    pub fn send(&self, request: Request) -> Result<Sent, NotSent> {
        let Some(conn) = self.live_conn() else { return Err(NotSent::NotLive(Box::new(request))) };
        self.send_on(conn, request, None, None).map_err(NotSent::Failed)
    }

    fn send_on(
        &self,
        conn: Arc<Conn>,
        request: Request,
        progress: Option<mpsc::UnboundedSender<Progress>>,
        events: Option<mpsc::UnboundedSender<EventMsg>>,
    ) -> Result<Sent, CallError> {
        let name = self.role.as_str();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // A request that cannot be framed fails on its own: nothing is sent.
        let frame = snowluma_proto::frame::encode(&ToWorker::Request { id, request }).map_err(|e| {
            let err = match e {
                FrameError::TooLarge(bytes) => CallError::TooLarge { bytes, limit: snowluma_proto::MAX_FRAME_BYTES },
                _ => CallError::Unavailable(name),
            };
            tracing::warn!(worker = name, error = %err, "a request could not be sent; it fails on its own");
            err
        })?;
        let (tx, rx) = oneshot::channel();
        let alone = {
            let mut p = conn.pending.lock().map_err(|_| CallError::Unavailable(name))?;
            p.insert(id, Pending { reply: Completion::Awaited(tx), progress, events });
            p.len() == 1
        };
        tracing::debug!(worker = name, id, "request dispatched");
        // The only call in flight is written at once; with others in
        // flight, the requests ready together go out in one write.
        let sent = if alone { conn.outbox.send_now(frame) } else { conn.outbox.send(frame) };
        if sent.is_err() {
            if let Ok(mut p) = conn.pending.lock() {
                p.remove(&id);
            }
            return Err(CallError::WorkerDied(name));
        }
        Ok(Sent { conn, id, rx, name })
    }
}

/// A request whose reply goes to a function ([`Sent::then`]), while it is
/// in flight.
#[derive(Clone)]
pub struct Waiting {
    conn: Arc<Conn>,
    id: u64,
}

impl Waiting {
    /// Cancel the request, as [`Sent::reply`] does when its token fires:
    /// the worker is told, and the function gets [`CallError::Cancelled`]
    /// (here, now). False when the reply came first (the function has had
    /// it).
    pub fn cancel(&self) -> bool {
        let Some(p) = self.conn.pending.lock().ok().and_then(|mut p| p.remove(&self.id)) else { return false };
        if let Ok(frame) = snowluma_proto::frame::encode(&ToWorker::Cancel { id: self.id }) {
            let _ = self.conn.outbox.send_now(frame);
        }
        p.reply.complete(Err(CallError::Cancelled));
        true
    }
}

/// Why [`WorkerSlot::send`] sent nothing.
pub enum NotSent {
    /// No worker is live now: the request, for [`WorkerSlot::call`].
    NotLive(Box<Request>),
    /// The request failed on its own (as [`WorkerSlot::call`] fails it).
    Failed(CallError),
}

/// A request sent to a worker, its reply not yet received.
pub struct Sent {
    conn: Arc<Conn>,
    id: u64,
    rx: oneshot::Receiver<Result<Reply, CallError>>,
    name: &'static str,
}

impl Sent {
    /// Wait for the reply. Cancelling `cancel` sends a cancel message to
    /// the worker and returns [`CallError::Cancelled`].
    pub async fn reply(self, cancel: &CancellationToken) -> Result<Reply, CallError> {
        let Sent { conn, id, rx, name } = self;
        tokio::select! {
            r = rx => r.unwrap_or(Err(CallError::WorkerDied(name))),
            _ = cancel.cancelled() => {
                if let Ok(mut p) = conn.pending.lock() {
                    p.remove(&id);
                }
                if let Ok(frame) = snowluma_proto::frame::encode(&ToWorker::Cancel { id }) {
                    let _ = conn.outbox.send_now(frame);
                }
                Err(CallError::Cancelled)
            }
        }
    }
}

impl Sent {
    /// Hand the reply to `then` instead of awaiting it: `then` runs where
    /// the worker's messages are read, in the turn that reads the reply
    /// (or with the worker's death), so no task waits for it; the request
    /// is then [`Waiting`] ([`Waiting::cancel`] cancels it). `None` when the
    /// reply was here already and `then` has run now.
    pub fn then(self, then: impl FnOnce(Result<Reply, CallError>) + Send + 'static) -> Option<Waiting> {
        let Sent { conn, id, mut rx, name } = self;
        let mut then: Option<Then> = Some(Box::new(then));
        if let Ok(mut p) = conn.pending.lock()
            && let Some(entry) = p.get_mut(&id)
            && let Some(f) = then.take()
        {
            // The channel's sender is dropped here; nothing awaits it.
            entry.reply = Completion::Then(f);
        }
        match then {
            None => Some(Waiting { conn, id }),
            Some(then) => {
                then(rx.try_recv().unwrap_or(Err(CallError::WorkerDied(name))));
                None
            }
        }
    }
}

type IpcReader = tokio::io::BufReader<SockReader>;

/// Does this configuration carry an access token (the network executor's:
/// the HTTP token, the event WebSocket's own)?
fn holds_secret(config: &WorkerConfig) -> bool {
    matches!(config, WorkerConfig::Network(n)
        if n.token.is_some() || n.events.as_ref().is_some_and(|e| e.token.is_some()))
}

/// Wipe the access tokens from a configuration, if it holds any.
fn wipe_secret(config: &mut WorkerConfig) {
    if let WorkerConfig::Network(n) = config {
        if let Some(mut t) = n.token.take() {
            snowluma_config::secret::wipe(&mut t);
        }
        if let Some(mut t) = n.events.as_mut().and_then(|e| e.token.take()) {
            snowluma_config::secret::wipe(&mut t);
        }
    }
}

/// Write the `Configure` frame. A configuration with the token is encoded
/// into one pre-sized buffer (never reallocated, so no copy is left in
/// freed memory) that is wiped after the write, and the token is then wiped
/// from `config` too: it is handed over exactly once.
async fn send_configure(wr: &mut SockWriter, config: &mut WorkerConfig) -> Result<(), String> {
    use zeroize::Zeroizing;
    if !holds_secret(config) {
        return write_frame(wr, &ToWorker::Configure(config.clone())).await.map_err(|e| e.to_string());
    }
    let mut msg = ToWorker::Configure(config.clone());
    wipe_secret(config);
    let body = postcard::to_extend(&msg, Vec::with_capacity(64 * 1024)).map(Zeroizing::new);
    if let ToWorker::Configure(c) = &mut msg {
        wipe_secret(c);
    }
    let body = body.map_err(|e| e.to_string())?;
    let len = u32::try_from(body.len()).map_err(|_| "configuration too large".to_owned())?;
    let mut frame = Zeroizing::new(Vec::with_capacity(4 + body.len()));
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    drop(body);
    tokio::io::AsyncWriteExt::write_all(wr, &frame).await.map_err(|e| e.to_string())?;
    tokio::io::AsyncWriteExt::flush(wr).await.map_err(|e| e.to_string())
}

async fn handshake(
    rd: &mut IpcReader,
    wr: &mut SockWriter,
    role: Role,
    config: &mut WorkerConfig,
    secret_sent: &mut bool,
) -> Result<u32, String> {
    write_frame(wr, &ToWorker::Hello(Hello { build: BUILD_ID.to_owned(), role })).await.map_err(|e| e.to_string())?;
    let pid = match read_frame::<_, FromWorker>(rd).await.map_err(|e| e.to_string())? {
        FromWorker::Ready { build, pid } if build == BUILD_ID => pid,
        FromWorker::Ready { build, .. } => return Err(format!("worker of another build ({build})")),
        FromWorker::Refused { reason } => return Err(format!("worker refused: {reason}")),
        other => return Err(format!("unexpected handshake reply {other:?}")),
    };
    *secret_sent |= holds_secret(config);
    send_configure(wr, config).await?;
    match read_frame::<_, FromWorker>(rd).await.map_err(|e| e.to_string())? {
        FromWorker::Configured => Ok(pid),
        FromWorker::Refused { reason } => Err(format!("worker refused its configuration: {reason}")),
        other => Err(format!("unexpected configuration reply {other:?}")),
    }
}

async fn supervise(
    role: Role,
    mut config: WorkerConfig,
    spec: Arc<SpawnSpec>,
    attach: Arc<Attach>,
    live: watch::Sender<Option<Arc<Conn>>>,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF_MIN;
    let name = role.as_str();
    let mut secret_sent = false;
    loop {
        let started = Instant::now();
        match run_once(role, &mut config, &spec, &attach, &live, &stop, &mut secret_sent).await {
            Ok(()) if stop.is_cancelled() => return,
            Ok(()) => {}
            Err(e) => tracing::warn!(worker = name, error = %e, "worker failed to start"),
        }
        if secret_sent {
            // The token was handed to this worker and wiped everywhere
            // else: a new incarnation could not be given it.
            tracing::error!(
                worker = name,
                "the network executor stopped after the access token was handed to it; no other process holds \
                 the token, so it cannot be restarted: ending the session"
            );
            spec.fatal.cancel();
            return;
        }
        if started.elapsed() >= HEALTHY_AFTER {
            backoff = BACKOFF_MIN;
        }
        tracing::info!(worker = name, backoff_ms = backoff.as_millis() as u64, "restarting worker after backoff");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// A started worker: its process, our end of its IPC socket, and our end
/// of its descriptor channel when its role has one.
struct Incarnation {
    child: snowluma_spawner::SpawnedChild,
    ipc: OwnedFd,
    channel: Option<OwnedFd>,
}

/// Run one worker incarnation until it dies (or we are stopped): spawn,
/// handshake, then pump messages until the connection or the process ends.
async fn run_once(
    role: Role,
    config: &mut WorkerConfig,
    spec: &SpawnSpec,
    attach: &Attach,
    live: &watch::Sender<Option<Arc<Conn>>>,
    stop: &CancellationToken,
    secret_sent: &mut bool,
) -> Result<(), String> {
    let name = role.as_str();
    let Incarnation { mut child, ipc, channel } = spawn_worker(role, spec, attach).await?;
    let spawner = spec.spawner.clone();
    let (rd, mut wr) = snowluma_proto::sockio::split_one(ipc).map_err(|e| format!("IPC socket: {e}"))?;
    // One recv per message: the length prefix and the body come from the buffer.
    let mut rd: IpcReader = tokio::io::BufReader::with_capacity(64 * 1024, rd);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut rd, &mut wr, role, config, secret_sent));
    let pid = match handshake.await {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => {
            spawner.kill(child.pid);
            return Err(e);
        }
        Err(_) => {
            spawner.kill(child.pid);
            return Err("handshake timed out".into());
        }
    };
    tracing::debug!(worker = name, pid, "worker ready");
    let (fd_out, fd_in) = match (attach.channel, channel) {
        (Some((_, ChannelDir::ToWorker)), Some(ch)) => (Some(ch), None),
        (Some((_, ChannelDir::FromWorker)), Some(ch)) => {
            (None, Some(FdReceiver::spawn(ch).map_err(|e| format!("fd channel: {e}"))?))
        }
        _ => (None, None),
    };
    let conn = Arc::new(Conn { outbox: Arc::new(Outbox::new(wr)), pending: Mutex::new(HashMap::new()), fd_out, fd_in });
    live.send_replace(Some(conn.clone()));
    let (status, writer) = pump(name, &conn, rd, &mut child, &spawner, stop).await;
    live.send_replace(None);
    writer.abort();
    fail_in_flight(name, &conn);
    if !stop.is_cancelled() {
        report_exit(name, pid, status);
    }
    Ok(())
}

/// Start the worker through the spawner: its IPC socket at
/// [`WORKER_IPC_FD`], the attached descriptors, a fresh descriptor channel.
async fn spawn_worker(role: Role, spec: &SpawnSpec, attach: &Attach) -> Result<Incarnation, String> {
    let mut extra: Vec<(i32, OwnedFd)> = Vec::new();
    for (target, fd) in &attach.fds {
        extra.push((*target, fd.try_clone().map_err(|e| format!("dup: {e}"))?));
    }
    let mut channel = None;
    if let Some((target, _)) = attach.channel {
        let (ours, theirs) = snowluma_proto::fdpass::pair().map_err(|e| format!("fd channel: {e}"))?;
        extra.push((target, theirs));
        channel = Some(ours);
    }
    let (ipc, child_end) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| format!("socketpair: {e}"))?;
    extra.insert(0, (WORKER_IPC_FD, child_end));
    let child = spec
        .spawner
        .spawn(role, &spec.log_filter, spec.grants.args(role), extra)
        .await
        .map_err(|e| format!("spawn: {e}"))?;
    Ok(Incarnation { child, ipc, channel })
}

/// Write queued messages and route what the worker sends until the
/// connection breaks, the process exits or we are stopped. Returns the exit
/// status (when known) and the writer, for the caller to stop.
async fn pump(
    name: &'static str,
    conn: &Arc<Conn>,
    mut rd: IpcReader,
    child: &mut snowluma_spawner::SpawnedChild,
    spawner: &snowluma_spawner::SpawnerClient,
    stop: &CancellationToken,
) -> (Option<snowluma_spawner::ExitInfo>, tokio::task::JoinHandle<()>) {
    // A socket that cannot be written is a broken connection: the worker
    // is restarted.
    let (broken_tx, broken_rx) = oneshot::channel::<std::io::Error>();
    let outbox = conn.outbox.clone();
    let writer = tokio::spawn(async move {
        let _ = broken_tx.send(outbox.flush().await);
    });
    // The replies are read by a task of their own: each message wakes it
    // alone, not this task's other waits.
    let mut reader = tokio::spawn({
        let conn = conn.clone();
        async move { read_loop(name, &conn, &mut rd).await }
    });
    let child_pid = child.pid;
    let status = tokio::select! {
        _ = &mut reader => {
            // The socket is gone: the worker died or broke protocol.
            spawner.kill(child_pid);
            (&mut child.exit).await.ok()
        }
        Ok(e) = broken_rx => {
            tracing::warn!(worker = name, error = %e, "the IPC connection broke; restarting the worker");
            spawner.kill(child_pid);
            (&mut child.exit).await.ok()
        }
        s = &mut child.exit => s.ok(),
        _ = stop.cancelled() => {
            spawner.kill(child_pid);
            None
        }
    };
    reader.abort();
    (status, writer)
}

/// Route replies, progress and events to their calls, until the socket
/// closes or the worker breaks protocol.
async fn read_loop(name: &'static str, conn: &Conn, rd: &mut IpcReader) {
    loop {
        match read_buffered_frame::<_, FromWorker>(rd).await {
            Ok(FromWorker::Reply { id, reply }) => {
                let p = conn.pending.lock().ok().and_then(|mut p| p.remove(&id));
                if let Some(p) = p {
                    p.reply.complete(Ok(reply));
                }
            }
            Ok(FromWorker::Progress { id, progress }) => {
                if let Ok(p) = conn.pending.lock()
                    && let Some(tx) = p.get(&id).and_then(|p| p.progress.as_ref())
                {
                    let _ = tx.send(progress);
                }
            }
            Ok(FromWorker::Event { id, event }) => {
                if let Ok(p) = conn.pending.lock()
                    && let Some(tx) = p.get(&id).and_then(|p| p.events.as_ref())
                {
                    let _ = tx.send(event);
                }
            }
            Ok(other) => {
                tracing::warn!(worker = name, message = ?other, "unexpected message from worker; dropping the connection");
                return;
            }
            Err(FrameError::Closed) => return,
            Err(e) => {
                tracing::warn!(worker = name, error = %e, "IPC error; dropping the connection");
                return;
            }
        }
    }
}

/// Fail every call still in flight: its worker stopped.
fn fail_in_flight(name: &'static str, conn: &Conn) {
    let drained: Vec<Pending> =
        conn.pending.lock().map(|mut p| p.drain().map(|(_, v)| v).collect()).unwrap_or_default();
    if !drained.is_empty() {
        tracing::warn!(
            worker = name,
            calls = drained.len(),
            "failing calls that were in flight when the worker stopped"
        );
    }
    for p in drained {
        p.reply.complete(Err(CallError::WorkerDied(name)));
    }
}

/// Log how an incarnation ended.
fn report_exit(name: &'static str, pid: u32, status: Option<snowluma_spawner::ExitInfo>) {
    match status {
        Some(s) if s.signal == Some(nix::libc::SIGSYS) => tracing::error!(
            worker = name,
            pid,
            status = %s,
            "worker killed by SIGSYS: it made a system call its seccomp policy forbids"
        ),
        Some(s) => tracing::warn!(worker = name, pid, status = %s, "worker exited"),
        None => tracing::warn!(worker = name, pid, "worker connection lost"),
    }
}
