//! The spawner: a small process forked from the supervisor before either
//! confines itself, which starts, stops and reaps the workers.
//!
//! Landlock domains only nest, so a process can never give a child a right
//! it lacks itself. Workers therefore start from the spawner, whose domain
//! is the union of the workers' needs (exec of this binary, TCP connect to
//! the endpoint's ports, write beneath the download directory), while the
//! supervisor — the process that parses every client message — confines
//! itself to no network, no file writes and no exec at all.
//!
//! Protocol: [`snowluma_proto::spawn`] (typed messages framed like every
//! other proto message, descriptors through proto's SCM_RIGHTS codec). Each
//! worker is started by [`snowluma_sandbox::exec::spawn`], the one fork+exec
//! path, through [`SPAWNER_EXE_FD`]. When the supervisor goes away, the
//! spawner kills its workers and exits.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use snowluma_proto::spawn::{FromSpawner, SpawnProtoError, SpawnRequest, ToSpawner};
use snowluma_proto::{Role, WORKER_ARG};
use snowluma_sandbox::exec::{self, Exe, ExecSpec};
use snowluma_sandbox::fds::SPAWNER_EXE_FD;
use snowluma_sandbox::{ConfineError, SpawnerGrants};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum SpawnerError {
    #[error("spawner i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("spawner: {0}")]
    Sys(#[from] nix::Error),
    #[error("spawner protocol: {0}")]
    Protocol(String),
    #[error("the spawner is gone")]
    Gone,
}

impl From<SpawnProtoError> for SpawnerError {
    fn from(e: SpawnProtoError) -> SpawnerError {
        match e {
            SpawnProtoError::Io(e) => SpawnerError::Io(e),
            other => SpawnerError::Protocol(other.to_string()),
        }
    }
}

fn send(fd: BorrowedFd<'_>, msg: &impl serde::Serialize, fds: &[BorrowedFd<'_>]) -> Result<(), SpawnerError> {
    Ok(snowluma_proto::spawn::send(fd, msg, fds)?)
}

/// One message and its descriptors; `None` at end of stream.
fn recv<T: serde::de::DeserializeOwned>(fd: BorrowedFd<'_>) -> Result<Option<(T, Vec<OwnedFd>)>, SpawnerError> {
    Ok(snowluma_proto::spawn::recv(fd)?)
}

// ---------------------------------------------------------------- the spawner process

/// Fork the spawner. Must be called while the process is single-threaded
/// (before the runtime). The child confines itself before it serves
/// ([`snowluma_sandbox::confine_spawner`] with `grants`: the workers' union
/// domain, its own executable placed at [`SPAWNER_EXE_FD`]). Returns the
/// supervisor's end.
pub fn fork(grants: &SpawnerGrants<'_>) -> Result<(OwnedFd, nix::unistd::Pid), SpawnerError> {
    let (ours, theirs) = snowluma_proto::fdpass::pair()?;
    // SAFETY: the process is single-threaded here (no runtime yet), so the
    // child may run arbitrary code; it never returns into the caller.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(theirs);
            Ok((ours, child))
        }
        nix::unistd::ForkResult::Child => {
            drop(ours);
            let code = match child_main(theirs, grants) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "spawner stopped");
                    1
                }
            };
            std::process::exit(code);
        }
    }
}

/// A worker the spawner started and has not reaped yet.
struct Child {
    pid: nix::unistd::Pid,
}

impl Child {
    fn kill(&self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
    }
    /// `Some((code, signal))` once it has exited (and is reaped).
    fn try_wait(&self) -> Option<(Option<i32>, Option<i32>)> {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => Some((Some(code), None)),
            Ok(WaitStatus::Signaled(_, sig, _)) => Some((None, Some(sig as i32))),
            Ok(_) => None,
            // Already reaped or never ours: report it gone.
            Err(_) => Some((None, None)),
        }
    }
    fn wait(&self) {
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// The spawner's confinement: with `allow_unconfined`, whatever could be
/// enforced is accepted; without it, anything less than full enforcement
/// stops the spawner.
fn confine(grants: &SpawnerGrants<'_>) -> Result<(), String> {
    match snowluma_sandbox::confine_spawner(grants) {
        Ok(_) => Ok(()),
        Err(_) if grants.allow_unconfined => Ok(()),
        Err(ConfineError::LandlockWeak(status, _)) => Err(format!("the spawner's Landlock domain is {status}")),
        Err(e) => Err(format!("the spawner cannot confine itself: {e}")),
    }
}

fn child_main(sock: OwnedFd, grants: &SpawnerGrants<'_>) -> Result<(), SpawnerError> {
    // Forked before the tokens were read: their only copies here are in the
    // environment block inherited from the supervisor.
    snowluma_config::secret::scrub_env(snowluma_config::secret::TOKEN_VAR);
    snowluma_config::secret::scrub_env(snowluma_config::secret::EVENTS_TOKEN_VAR);
    let _ = nix::sys::prctl::set_name(c"snowluma-spawner");
    // The client's stdin and stdout are the supervisor's alone.
    let devnull = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    for target in [0, 1] {
        // SAFETY: dup2 onto the standard descriptors of this fresh child;
        // nothing else in it holds them.
        if unsafe { nix::libc::dup2(devnull.as_raw_fd(), target) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    drop(devnull);
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    // Confine first (the grants are descriptors, e.g. the download
    // directory), then keep only stderr, the socket and the executable.
    confine(grants).map_err(SpawnerError::Protocol)?;
    // The workers' own check (`close_range` over the gaps), which every
    // worker already needs the kernel to have.
    snowluma_sandbox::fds::close_all_except(&[0, 1, 2, sock.as_raw_fd(), SPAWNER_EXE_FD])?;

    let mut children: HashMap<i32, Child> = HashMap::new();
    loop {
        let mut pfd = [nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLIN)];
        let ready = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(100u16)).unwrap_or(0);
        if ready > 0 {
            match recv::<ToSpawner>(sock.as_fd()) {
                Ok(Some((ToSpawner::Spawn(SpawnRequest { req, role, log_filter, grant_args, targets }), fds))) => {
                    let reply = match spawn(role, &log_filter, &grant_args, &targets, &fds) {
                        Ok(child) => {
                            let pid = child.pid.as_raw();
                            children.insert(pid, child);
                            FromSpawner::Spawned { req, pid }
                        }
                        Err(e) => FromSpawner::SpawnFailed { req, error: e.to_string() },
                    };
                    drop(fds);
                    if !deliver(sock.as_fd(), &reply)? {
                        reap_all(&mut children);
                        return Ok(());
                    }
                    snowluma_proto::alloc::after_start_uncut();
                }
                Ok(Some((ToSpawner::Kill { pid }, _))) => {
                    if let Some(c) = children.get(&pid) {
                        c.kill();
                    }
                }
                Ok(None) | Err(_) => {
                    // The supervisor is gone: so are its workers.
                    reap_all(&mut children);
                    return Ok(());
                }
            }
        }
        let mut exited = Vec::new();
        for (pid, c) in children.iter() {
            if let Some(status) = c.try_wait() {
                exited.push((*pid, status));
            }
        }
        for (pid, (code, signal)) in exited {
            children.remove(&pid);
            if !deliver(sock.as_fd(), &FromSpawner::Exited { pid, code, signal })? {
                reap_all(&mut children);
                return Ok(());
            }
        }
    }
}

/// Send a message to the supervisor: `Ok(false)` when it has gone away (the
/// end of every session, not an error worth a log line).
fn deliver(sock: BorrowedFd<'_>, msg: &FromSpawner) -> Result<bool, SpawnerError> {
    match send(sock, msg, &[]) {
        Ok(()) => Ok(true),
        Err(SpawnerError::Io(e))
            if matches!(e.raw_os_error(), Some(nix::libc::EPIPE | nix::libc::ECONNRESET | nix::libc::ENOTCONN)) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Stop and reap every worker (the supervisor is gone, so are they).
fn reap_all(children: &mut HashMap<i32, Child>) {
    for c in children.values() {
        c.kill();
        c.wait();
    }
}

fn cstring(s: &str) -> Result<std::ffi::CString, SpawnerError> {
    std::ffi::CString::new(s).map_err(|_| SpawnerError::Protocol("a worker argument contains NUL".into()))
}

/// Start a worker: this binary, executed through [`SPAWNER_EXE_FD`]
/// (`execveat` with `AT_EMPTY_PATH`, the only exec the spawner's filter
/// allows) with an empty environment and its descriptors placed.
fn spawn(
    role: Role,
    log_filter: &str,
    grant_args: &[String],
    targets: &[i32],
    fds: &[OwnedFd],
) -> Result<Child, SpawnerError> {
    if targets.len() != fds.len() {
        return Err(SpawnerError::Protocol("descriptor count mismatch".into()));
    }
    let placed: Vec<(i32, BorrowedFd<'_>)> = targets.iter().copied().zip(fds.iter().map(|f| f.as_fd())).collect();
    let mut args = vec![cstring("snowluma-mcp")?, cstring(WORKER_ARG)?, cstring(role.as_str())?, cstring(log_filter)?];
    for a in grant_args {
        args.push(cstring(a)?);
    }
    let spec = ExecSpec {
        exe: Exe::Fd(SPAWNER_EXE_FD),
        argv: &args,
        envp: &[],
        fds: &placed,
        new_process_group: false,
        default_signals: false,
    };
    match exec::spawn(&spec) {
        Ok(pid) => Ok(Child { pid }),
        Err(e) => Err(SpawnerError::Io(std::io::Error::new(e.kind(), format!("executing the worker: {e}")))),
    }
}

// ---------------------------------------------------------------- the supervisor's client

/// Reap the spawner, whose socket just closed: it exits right after (or is
/// already a zombie). Polls briefly rather than blocking the runtime; a
/// spawner that closed its socket but lingers is left to the kernel, which
/// reaps it when the supervisor exits, as it is about to.
async fn reap(pid: nix::unistd::Pid) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    for _ in 0..50 {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            _ => return,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit status {c}"),
            (None, Some(s)) => write!(f, "signal {s}"),
            _ => write!(f, "unknown status"),
        }
    }
}

#[derive(Default)]
struct ClientState {
    next_req: u64,
    spawns: HashMap<u64, oneshot::Sender<Result<i32, String>>>,
    exits: HashMap<i32, oneshot::Sender<ExitInfo>>,
    early_exits: HashMap<i32, ExitInfo>,
    gone: bool,
}

/// The supervisor's handle on the spawner.
pub struct SpawnerClient {
    sock: Arc<AsyncFd<OwnedFd>>,
    state: Arc<Mutex<ClientState>>,
    /// Cancelled the moment the spawner's socket closes (it died): no
    /// worker can be started or restarted any more.
    gone: tokio_util::sync::CancellationToken,
}

/// A worker started by the spawner.
pub struct SpawnedChild {
    pub pid: i32,
    pub exit: oneshot::Receiver<ExitInfo>,
}

impl SpawnerClient {
    /// Start the reader on the current runtime. `pid` is the spawner's, to
    /// reap it when it dies.
    pub fn start(sock: OwnedFd, pid: nix::unistd::Pid) -> Result<Arc<SpawnerClient>, SpawnerError> {
        let flags = nix::fcntl::fcntl(&sock, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&sock, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: the OwnedFd moves into the AsyncFd and stays open and
        // unchanged for its whole life.
        let afd = unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE | Interest::WRITABLE) }
            .map_err(|e| e.into_parts().1)?;
        let gone = tokio_util::sync::CancellationToken::new();
        let client = Arc::new(SpawnerClient { sock: Arc::new(afd), state: Arc::default(), gone: gone.clone() });
        let (sock, state) = (client.sock.clone(), client.state.clone());
        tokio::spawn(async move {
            loop {
                let msg = sock.async_io(Interest::READABLE, |fd| {
                    recv::<FromSpawner>(fd.as_fd()).map_err(|e| match e {
                        SpawnerError::Io(e) if e.kind() == std::io::ErrorKind::WouldBlock => e,
                        other => std::io::Error::other(other.to_string()),
                    })
                });
                let Ok(Some((msg, _fds))) = msg.await else {
                    if let Ok(mut s) = state.lock() {
                        s.gone = true;
                        s.spawns.clear();
                        s.exits.clear();
                    }
                    reap(pid).await;
                    gone.cancel();
                    return;
                };
                let Ok(mut s) = state.lock() else { return };
                match msg {
                    FromSpawner::Spawned { req, pid } => {
                        if let Some(tx) = s.spawns.remove(&req) {
                            let _ = tx.send(Ok(pid));
                        }
                    }
                    FromSpawner::SpawnFailed { req, error } => {
                        if let Some(tx) = s.spawns.remove(&req) {
                            let _ = tx.send(Err(error));
                        }
                    }
                    FromSpawner::Exited { pid, code, signal } => {
                        let info = ExitInfo { code, signal };
                        match s.exits.remove(&pid) {
                            Some(tx) => {
                                let _ = tx.send(info);
                            }
                            None => {
                                s.early_exits.insert(pid, info);
                            }
                        }
                    }
                }
            }
        });
        Ok(client)
    }

    fn send(&self, msg: &ToSpawner, fds: &[BorrowedFd<'_>]) -> Result<(), SpawnerError> {
        // One small packet; the socket's buffer never fills in practice, and
        // a would-block is reported rather than waited for.
        send(self.sock.get_ref().as_fd(), msg, fds)
    }

    /// Start a worker with `fds` placed at their target numbers.
    pub async fn spawn(
        &self,
        role: Role,
        log_filter: &str,
        grant_args: Vec<String>,
        fds: Vec<(i32, OwnedFd)>,
    ) -> Result<SpawnedChild, SpawnerError> {
        let (tx, rx) = oneshot::channel();
        let req = {
            let mut s = self.state.lock().map_err(|_| SpawnerError::Gone)?;
            if s.gone {
                return Err(SpawnerError::Gone);
            }
            s.next_req += 1;
            let req = s.next_req;
            s.spawns.insert(req, tx);
            req
        };
        let targets: Vec<i32> = fds.iter().map(|(t, _)| *t).collect();
        let attached: Vec<BorrowedFd<'_>> = fds.iter().map(|(_, f)| f.as_fd()).collect();
        let msg = ToSpawner::Spawn(SpawnRequest { req, role, log_filter: log_filter.to_owned(), grant_args, targets });
        self.send(&msg, &attached)?;
        drop(attached);
        drop(fds);
        let pid = rx.await.map_err(|_| SpawnerError::Gone)?.map_err(SpawnerError::Protocol)?;
        let (etx, erx) = oneshot::channel();
        {
            let mut s = self.state.lock().map_err(|_| SpawnerError::Gone)?;
            match s.early_exits.remove(&pid) {
                Some(info) => {
                    let _ = etx.send(info);
                }
                None => {
                    s.exits.insert(pid, etx);
                }
            }
        }
        Ok(SpawnedChild { pid, exit: erx })
    }

    /// Cancelled when the spawner has died (see [`SpawnerClient::gone`]).
    pub fn gone(&self) -> tokio_util::sync::CancellationToken {
        self.gone.clone()
    }

    pub fn kill(&self, pid: i32) {
        let _ = self.send(&ToSpawner::Kill { pid }, &[]);
    }
}
