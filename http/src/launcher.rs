//! The `serve-http` launcher: the role systemd plays for the socket unit.
//! It binds the listener, starts the confined HTTP front, and on the front's
//! request starts one ordinary stdio server per session with a socketpair
//! as its stdin and stdout, passing the other end back (SCM_RIGHTS). It
//! reaps every child and kills a session's process group when the session
//! does not end within the grace period after the front let it go. With
//! send pacing on, it keeps one memfd per token id and hands it to every
//! session tree of that token (`snowluma_proto::session::PACING_FD`), so
//! that they pace as one window; it never reads it.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use super::control::{Channel, FrontSetup, ToFront, ToLauncher};
use super::options::{self, Listen};
use snowluma_config::{Cli, Config, ServeHttpArgs};
use snowluma_proto::front::ControlError;

/// How long a session may take to end after its socket closed before its
/// process group is killed, when its token was revoked or serve-http stops.
pub(crate) const GRACE: Duration = Duration::from_secs(10);
/// The same for every other end (DELETE, idle expiry, a closed connection,
/// eviction). The front has cancelled the session's calls and closed its
/// stdin, so the session exits as soon as its background transfers (which
/// outlive their client by design) are done; every read and call has its
/// own timeout. This limit only reaps a session that somehow does not.
pub(crate) const ENDED_LIMIT: Duration = Duration::from_secs(3600);
/// The request body limit: the stdio server's line limit.
pub const MAX_BODY: usize = 8 * 1024 * 1024;

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    snowluma_logsink::eprintln_nb!("snowluma-mcp: serve-http: {msg}");
    ExitCode::from(2)
}

enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener, std::path::PathBuf),
}

impl Listener {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }
}

pub fn run(cli: &Cli, opts: &ServeHttpArgs) -> ExitCode {
    // The sessions' configuration is checked once here, so that a mistake
    // is one line at startup rather than a failure of every session.
    let config = match Config::resolve(cli) {
        Ok(c) => c,
        Err(e) => {
            snowluma_logsink::eprintln_nb!("snowluma-mcp: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = config.worker_log_filter();
    snowluma_logsink::init_tracing(&filter, true);
    let (prepared, setup) = match prepare(opts) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let serving = Serving {
        filter,
        session_args: session_args(cli),
        token_file: opts.http_token_file.clone(),
        paced: config.pacing.interval_ms > 0 || config.pacing.bucket(),
    };
    let code = rt.block_on(start_and_serve(&prepared, setup, serving));
    if let Listener::Unix(_, path) = &prepared.listener {
        let _ = std::fs::remove_file(path);
    }
    code
}

/// Everything checked, read and bound before the front starts.
struct Prepared {
    listener: Listener,
    /// The listening address as logged.
    shown: String,
    /// The front may serve on a kernel that cannot confine it.
    unconfined_ok: bool,
}

/// What the launcher passes on: the log filter (to the front) and the
/// sessions' command line; the token file it re-reads on SIGHUP.
struct Serving {
    filter: String,
    session_args: Vec<OsString>,
    token_file: std::path::PathBuf,
    /// Send pacing is on: each token's sessions share one pacing state.
    paced: bool,
}

/// Check the options, read the token and TLS files, bind the listener, and
/// write the front's setup: each failure is one line and exit status 2.
fn prepare(opts: &ServeHttpArgs) -> Result<(Prepared, FrontSetup), ExitCode> {
    let listen = options::parse_listen(&opts.listen).map_err(fail)?;
    let tls_files = opts.tls_cert.as_ref().zip(opts.tls_key.as_ref());
    options::check_exposure(&listen, tls_files.is_some(), opts.allow_remote).map_err(fail)?;
    if opts.max_sessions_per_token == 0 || opts.max_requests_per_token == 0 || opts.idle_timeout == 0 {
        return Err(fail("--max-sessions-per-token, --max-requests-per-token and --idle-timeout must be at least 1"));
    }
    // The front confines itself like every other process; a kernel that
    // cannot enforce that needs the operator's explicit opt-out.
    let unconfined_ok = snowluma_sandbox::gate(
        "serve-http",
        true,
        snowluma_sandbox::Support::detect(),
        snowluma_sandbox::opt_out_from_env(),
    )
    .map_err(fail)?;
    let socket_mode = options::parse_socket_mode(&opts.socket_mode).map_err(fail)?;
    let tokens = options::load_tokens(&opts.http_token_file).map_err(fail)?;
    let tls = match tls_files {
        None => None,
        Some((cert, key)) => Some(read_tls(cert, key)?),
    };
    let listener = bind(&listen, socket_mode)?;
    let (shown, port) = match &listener {
        Listener::Tcp(l) => match l.local_addr() {
            Ok(a) => (a.to_string(), Some(a.port())),
            Err(e) => return Err(fail(format!("cannot read the listening address: {e}"))),
        },
        Listener::Unix(_, p) => (p.display().to_string(), None),
    };
    let allowed_hosts = if opts.allowed_host.is_empty() {
        options::default_hosts(&listen, port)
    } else {
        opts.allowed_host.iter().map(|h| h.to_ascii_lowercase()).collect()
    };
    let allowed_origins = if opts.allowed_origin.is_empty() {
        options::default_origins(port)
    } else {
        opts.allowed_origin.iter().map(|o| o.trim_end_matches('/').to_ascii_lowercase()).collect()
    };
    let setup = FrontSetup {
        tokens,
        tls,
        allowed_hosts,
        allowed_origins,
        max_sessions_per_token: opts.max_sessions_per_token,
        max_requests_per_token: opts.max_requests_per_token,
        idle_timeout_secs: opts.idle_timeout,
        max_body_bytes: MAX_BODY,
        unix: matches!(listener, Listener::Unix(..)),
    };
    Ok((Prepared { listener, shown, unconfined_ok }, setup))
}

/// The TLS certificate chain and key, read and checked as a pair.
fn read_tls(cert: &std::path::Path, key: &std::path::Path) -> Result<(String, String), ExitCode> {
    let cert = match std::fs::read_to_string(cert) {
        Ok(c) if c.len() < 64 * 1024 => c,
        Ok(_) => return Err(fail(format!("--tls-cert {}: larger than 64 KiB", cert.display()))),
        Err(e) => return Err(fail(format!("--tls-cert {}: cannot be read: {e}", cert.display()))),
    };
    let key = options::read_private(key, "--tls-key").map_err(fail)?;
    if let Err(e) = super::front::tls_acceptor(&cert, &key) {
        return Err(fail(format!("--tls-cert/--tls-key: {e}")));
    }
    Ok((cert, key))
}

fn bind(listen: &Listen, socket_mode: u32) -> Result<Listener, ExitCode> {
    match listen {
        Listen::Tcp(addr) => match std::net::TcpListener::bind(addr) {
            Ok(l) => Ok(Listener::Tcp(l)),
            Err(e) => Err(fail(format!("cannot listen on {addr}: {e}"))),
        },
        Listen::Unix(path) => match bind_unix(path, socket_mode) {
            Ok(l) => Ok(Listener::Unix(l, path.clone())),
            Err(e) => Err(fail(format!("cannot listen on {}: {e}", path.display()))),
        },
    }
}

/// On the runtime: the signal handlers, the front, then serving it.
async fn start_and_serve(prepared: &Prepared, setup: FrontSetup, serving: Serving) -> ExitCode {
    // The handlers exist before anyone is told where we listen, so a
    // SIGTERM sent from then on stops serve-http cleanly.
    let (Ok(hup), Ok(term), Ok(int)) =
        (signal(SignalKind::hangup()), signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return fail("cannot install signal handlers");
    };
    let (front, control) = match start_front(&prepared.listener, &serving.filter, prepared.unconfined_ok, setup) {
        Ok(f) => f,
        Err(e) => return fail(format!("cannot start the HTTP front: {e}")),
    };
    let shown = &prepared.shown;
    tracing::info!(listen = %shown, "serve-http: listening on {shown}");
    serve(front, control, Signals { hup, term, int }, serving).await
}

/// Bind a Unix socket with permission bits `mode`, whatever the umask: it is
/// created owner-only (umask 177 around the bind; the launcher has no other
/// thread yet) and then given `mode`, so it is never more open than asked.
fn bind_unix(path: &std::path::Path, mode: u32) -> std::io::Result<std::os::unix::net::UnixListener> {
    use nix::sys::stat::{Mode, umask};
    use std::os::unix::fs::PermissionsExt;
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = bind_unix_replacing(path);
    umask(old);
    let listener = bound?;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(listener)
}

/// Bind a Unix socket; a socket left behind by a server that is gone (a
/// connection is refused) is replaced, anything else at the path is not.
fn bind_unix_replacing(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::os::unix::net::UnixListener::bind(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
            let refused = matches!(
                std::os::unix::net::UnixStream::connect(path),
                Err(c) if c.kind() == std::io::ErrorKind::ConnectionRefused
            );
            if !(is_socket && refused) {
                return Err(e);
            }
            std::fs::remove_file(path)?;
            std::os::unix::net::UnixListener::bind(path)
        }
        other => other,
    }
}

/// The sessions' command line: the session options given on ours (before
/// or after `serve-http`; the variables reach them through the environment
/// they inherit).
fn session_args(cli: &Cli) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    let mut add = |flag: &str, value: Option<OsString>| {
        if let Some(value) = value {
            v.push(flag.into());
            v.push(value);
        }
    };
    let s = |o: &Option<String>| o.clone().map(OsString::from);
    add("--mode", s(&cli.mode));
    add("--endpoint", s(&cli.endpoint));
    add("--token-file", cli.token_file.clone().map(OsString::from));
    add("--timeout-ms", s(&cli.timeout_ms));
    add("--stream-dir", s(&cli.stream_dir));
    add("--upload-root", s(&cli.upload_root));
    add("--max-stream-bytes", s(&cli.max_stream_bytes));
    add("--events-url", s(&cli.events_url));
    add("--events-token-file", cli.events_token_file.clone().map(OsString::from));
    add("--task-dir", s(&cli.task_dir));
    add("--audit-log", s(&cli.audit_log));
    add("--audit-key", s(&cli.audit_key));
    add("--allow-actions", s(&cli.allow_actions));
    add("--deny-actions", s(&cli.deny_actions));
    add("--confirm-actions", s(&cli.confirm_actions));
    add("--log", Some(cli.log.clone().into()));
    v
}

/// Start the front: this binary, empty environment, the listener on fd 3
/// and its control socket on fd 4; then send its setup.
fn start_front(
    listener: &Listener,
    filter: &str,
    unconfined_ok: bool,
    setup: FrontSetup,
) -> Result<(snowluma_sandbox::exec::Child, Channel), Box<dyn std::error::Error>> {
    use snowluma_sandbox::exec::{Child, Exe, ExecSpec};
    use std::os::fd::AsFd;
    let (ours, theirs) = snowluma_proto::fdpass::pair()?;
    let null_in = std::fs::File::open("/dev/null")?;
    let null_out = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    let mut argv = vec![c"snowluma-mcp".to_owned(), std::ffi::CString::new(super::FRONT_ARG)?];
    argv.push(std::ffi::CString::new(filter)?);
    if unconfined_ok {
        argv.push(std::ffi::CString::new(snowluma_sandbox::UNCONFINED_OK_ARG)?);
    }
    let fds = [(0, null_in.as_fd()), (1, null_out.as_fd()), (3, listener.fd()), (4, theirs.as_fd())];
    let spec = ExecSpec {
        exe: Exe::Path(c"/proc/self/exe"),
        argv: &argv,
        envp: &[],
        fds: &fds,
        new_process_group: false,
        default_signals: true,
    };
    let child = Child::spawn(&spec)?.kill_on_drop(true);
    drop(theirs);
    super::control::send_blocking(&ours, &super::control::ToFront::Setup(Box::new(setup)), None)?;
    Ok((child, Channel::new(ours)?))
}

struct Session {
    pid: Pid,
}

struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

async fn serve(
    mut front: snowluma_sandbox::exec::Child,
    control: Channel,
    signals: Signals,
    serving: Serving,
) -> ExitCode {
    let Signals { mut hup, mut term, mut int } = signals;
    let (exited_tx, mut exited_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut launcher =
        Launcher { control, sessions: HashMap::new(), next_session: 1, exited_tx, serving, pacing: HashMap::new() };
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let code = loop {
                tokio::select! {
                    msg = launcher.control.recv() => match msg {
                        Ok((ToLauncher::Spawn { req, token_id, peer }, _)) => {
                            if launcher.spawn(req, &token_id, &peer).await.is_err() {
                                break ExitCode::FAILURE;
                            }
                        }
                        Ok((ToLauncher::End { session, revoked }, _)) => launcher.end(session, revoked),
                        Err(e) => {
                            tracing::error!(error = %e, "serve-http: the HTTP front is gone; stopping");
                            break ExitCode::FAILURE;
                        }
                    },
                    Some(n) = exited_rx.recv() => launcher.exited(n).await,
                    _ = hup.recv() => {
                        if launcher.reload_tokens().await.is_err() {
                            break ExitCode::FAILURE;
                        }
                    }
                    _ = term.recv() => break ExitCode::SUCCESS,
                    _ = int.recv() => break ExitCode::SUCCESS,
                    status = front.wait() => {
                        tracing::error!(status = ?status.ok(), "serve-http: the HTTP front exited; stopping");
                        break ExitCode::FAILURE;
                    }
                }
            };
            // Shutdown, still inside the LocalSet so that the tasks reaping
            // the sessions keep running.
            launcher.shutdown(&mut front, &mut exited_rx).await;
            code
        })
        .await
}

/// The launcher's state while it serves the front: the live session trees.
struct Launcher {
    control: Channel,
    sessions: HashMap<u64, Session>,
    next_session: u64,
    /// Told a session's number when its leader has exited.
    exited_tx: tokio::sync::mpsc::UnboundedSender<u64>,
    serving: Serving,
    /// Each token id's send-pacing state (a memfd), handed to every session
    /// tree of that token so that they pace as one window.
    pacing: HashMap<String, OwnedFd>,
}

impl Launcher {
    /// `Spawn`: start a session tree and pass its socket to the front (or
    /// tell it the spawn failed). `Err`: the front can no longer be told.
    async fn spawn(&mut self, req: u64, token_id: &str, peer: &str) -> Result<(), ControlError> {
        let n = self.next_session;
        self.next_session += 1;
        if let Err(e) = self.ensure_pacing_state(token_id) {
            // Without it the token's sessions would not share a window: no
            // session rather than a weaker limit.
            tracing::error!(error = %e, "serve-http: cannot create a pacing state; the session is not started");
            let _ = self.control.send(&ToFront::SpawnFailed { req }, None).await;
            return Ok(());
        }
        let pacing = self.pacing.get(token_id).map(|fd| fd.as_fd());
        match spawn_session(&self.serving.session_args, token_id, peer, pacing) {
            Ok((mut child, theirs)) => {
                let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
                    let _ = self.control.send(&ToFront::SpawnFailed { req }, None).await;
                    return Ok(());
                };
                tracing::info!(session = n, pid, token_id = %token_id, peer = %peer, "serve-http: session started");
                self.sessions.insert(n, Session { pid: Pid::from_raw(pid) });
                let tx = self.exited_tx.clone();
                tokio::task::spawn_local(async move {
                    let _ = child.wait().await;
                    let _ = tx.send(n);
                });
                self.control.send(&ToFront::Spawned { req, session: n }, Some(theirs.as_fd())).await
            }
            Err(e) => {
                tracing::error!(error = %e, "serve-http: cannot start a session");
                let _ = self.control.send(&ToFront::SpawnFailed { req }, None).await;
                Ok(())
            }
        }
    }

    /// The token's pacing state, created (zeroed, at its fixed size) on its
    /// first session; none when pacing is off.
    fn ensure_pacing_state(&mut self, token_id: &str) -> std::io::Result<()> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        use snowluma_proto::session::PACING_STATE_SIZE;
        if self.serving.paced && !self.pacing.contains_key(token_id) {
            let fd = memfd_create(c"snowluma-mcp-pacing", MFdFlags::MFD_CLOEXEC)?;
            let size = i64::try_from(PACING_STATE_SIZE).map_err(std::io::Error::other)?;
            nix::unistd::ftruncate(&fd, size)?;
            self.pacing.insert(token_id.to_owned(), fd);
        }
        Ok(())
    }

    /// `End`: kill what is left of the session's process group if it has not
    /// ended within its limit.
    fn end(&self, session: u64, revoked: bool) {
        if let Some(s) = self.sessions.get(&session) {
            let pid = s.pid;
            let limit = if revoked { GRACE } else { ENDED_LIMIT };
            tokio::task::spawn_local(async move {
                tokio::time::sleep(limit).await;
                // The group outlives its leader only if a
                // member survives; ESRCH is the normal case.
                if killpg(pid, Signal::SIGKILL).is_ok() {
                    tracing::warn!(
                        pid = pid.as_raw(),
                        "serve-http: a session did not end in time; its process group was killed"
                    );
                }
            });
        }
    }

    /// A session's leader exited: the tree goes, and the front is told.
    async fn exited(&mut self, n: u64) {
        if let Some(s) = self.sessions.remove(&n) {
            // Any straggler of the tree goes with it.
            let _ = killpg(s.pid, Signal::SIGKILL);
            tracing::info!(session = n, "serve-http: session ended");
            let _ = self.control.send(&ToFront::Exited { session: n }, None).await;
        }
    }

    /// SIGHUP: re-read the token file and send the new set (a file that
    /// does not load leaves the old one). `Err`: the front can no longer be
    /// told.
    async fn reload_tokens(&mut self) -> Result<(), ControlError> {
        match options::load_tokens(&self.serving.token_file) {
            Ok(tokens) => {
                tracing::info!(tokens = tokens.len(), "serve-http: access tokens re-read (SIGHUP)");
                // A removed token's pacing state goes (its trees, revoked,
                // hold their own copies until they end).
                self.pacing.retain(|id, _| tokens.iter().any(|t| t.id == *id));
                self.control.send(&ToFront::Tokens(tokens), None).await
            }
            Err(e) => {
                tracing::error!("serve-http: SIGHUP: the token file was not reloaded, the old tokens stay: {e}");
                Ok(())
            }
        }
    }

    /// Stop the front and the sessions: SIGTERM, then SIGKILL after the
    /// grace period; wait for the front.
    async fn shutdown(
        &mut self,
        front: &mut snowluma_sandbox::exec::Child,
        exited_rx: &mut tokio::sync::mpsc::UnboundedReceiver<u64>,
    ) {
        let _ = front.start_kill();
        for s in self.sessions.values() {
            let _ = killpg(s.pid, Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + GRACE;
        while !self.sessions.is_empty() {
            tokio::select! {
                Some(n) = exited_rx.recv() => { self.sessions.remove(&n); }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        for s in self.sessions.values() {
            let _ = killpg(s.pid, Signal::SIGKILL);
        }
        let _ = front.wait().await;
    }
}

/// One session tree: this binary as the ordinary stdio server, in its own
/// process group, with one end of a socketpair as stdin and stdout.
fn spawn_session(
    args: &[OsString],
    token_id: &str,
    peer: &str,
    pacing: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<(snowluma_sandbox::exec::Child, std::os::unix::net::UnixStream)> {
    use snowluma_sandbox::exec::{Child, Exe, ExecSpec};
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let mut argv = vec![c"snowluma-mcp".to_owned()];
    for a in args {
        argv.push(std::ffi::CString::new(a.as_bytes())?);
    }
    use snowluma_proto::session::{PACING_FD, PACING_FD_VAR};
    use snowluma_sandbox::exec::env_entry;
    let principal = format!("{token_id} {peer}");
    let ours_internal = |k: &std::ffi::OsStr| k == super::PRINCIPAL_VAR || k == PACING_FD_VAR;
    let mut envp = Vec::new();
    for (k, v) in std::env::vars_os().filter(|(k, _)| !ours_internal(k)) {
        envp.push(env_entry(&k, &v)?);
    }
    envp.push(env_entry(super::PRINCIPAL_VAR.as_ref(), principal.as_ref())?);
    let mut fds = vec![(0, ours.as_fd()), (1, ours.as_fd())];
    if let Some(fd) = pacing {
        envp.push(env_entry(PACING_FD_VAR.as_ref(), PACING_FD.to_string().as_ref())?);
        fds.push((PACING_FD, fd));
    }
    let spec = ExecSpec {
        exe: Exe::Path(c"/proc/self/exe"),
        argv: &argv,
        envp: &envp,
        fds: &fds,
        new_process_group: true,
        default_signals: true,
    };
    let child = Child::spawn(&spec)?;
    drop(ours);
    Ok((child, theirs))
}
