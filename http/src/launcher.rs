//! The `serve-http` launcher: the role systemd plays for the socket unit.
//! It binds the listener, starts the confined HTTP front, and on the front's
//! request starts one ordinary stdio server per session with a socketpair
//! as its stdin and stdout, passing the other end back (SCM_RIGHTS). It
//! reaps every child and kills a session's process group when the session
//! does not end within the grace period after the front let it go.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use super::control::{Channel, FrontSetup, ToFront, ToLauncher};
use super::options::{self, Listen};
use snowluma_config::{Cli, Config, ServeHttpArgs};

/// How long a session may take to end after its socket closed before its
/// process group is killed, when its token was revoked or serve-http stops.
const GRACE: Duration = Duration::from_secs(10);
/// The same for every other end (DELETE, idle expiry, a closed connection,
/// eviction). The front has cancelled the session's calls and closed its
/// stdin, so the session exits as soon as its background transfers (which
/// outlive their client by design) are done; every read and call has its
/// own timeout. This limit only reaps a session that somehow does not.
const ENDED_LIMIT: Duration = Duration::from_secs(3600);
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
    let listen = match options::parse_listen(&opts.listen) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let tls_files = opts.tls_cert.as_ref().zip(opts.tls_key.as_ref());
    if let Err(e) = options::check_exposure(&listen, tls_files.is_some(), opts.allow_remote) {
        return fail(e);
    }
    if opts.max_sessions_per_token == 0 || opts.max_requests_per_token == 0 || opts.idle_timeout == 0 {
        return fail("--max-sessions-per-token, --max-requests-per-token and --idle-timeout must be at least 1");
    }
    // The front confines itself like every other process; a kernel that
    // cannot enforce that needs the operator's explicit opt-out.
    let unconfined_ok = match snowluma_sandbox::gate(
        "serve-http",
        true,
        snowluma_sandbox::Support::detect(),
        snowluma_sandbox::opt_out_from_env(),
    ) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let socket_mode = match options::parse_socket_mode(&opts.socket_mode) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let tokens = match options::load_tokens(&opts.http_token_file) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let tls = match tls_files {
        None => None,
        Some((cert, key)) => {
            let cert = match std::fs::read_to_string(cert) {
                Ok(c) if c.len() < 64 * 1024 => c,
                Ok(_) => return fail(format!("--tls-cert {}: larger than 64 KiB", cert.display())),
                Err(e) => return fail(format!("--tls-cert {}: cannot be read: {e}", cert.display())),
            };
            let key = match options::read_private(key, "--tls-key") {
                Ok(k) => k,
                Err(e) => return fail(e),
            };
            if let Err(e) = super::front::tls_acceptor(&cert, &key) {
                return fail(format!("--tls-cert/--tls-key: {e}"));
            }
            Some((cert, key))
        }
    };
    let listener = match &listen {
        Listen::Tcp(addr) => match std::net::TcpListener::bind(addr) {
            Ok(l) => Listener::Tcp(l),
            Err(e) => return fail(format!("cannot listen on {addr}: {e}")),
        },
        Listen::Unix(path) => match bind_unix(path, socket_mode) {
            Ok(l) => Listener::Unix(l, path.clone()),
            Err(e) => return fail(format!("cannot listen on {}: {e}", path.display())),
        },
    };
    let (shown, port) = match &listener {
        Listener::Tcp(l) => match l.local_addr() {
            Ok(a) => (a.to_string(), Some(a.port())),
            Err(e) => return fail(format!("cannot read the listening address: {e}")),
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
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let session_args = session_args(cli);
    let code = rt.block_on(async {
        // The handlers exist before anyone is told where we listen, so a
        // SIGTERM sent from then on stops serve-http cleanly.
        let (Ok(hup), Ok(term), Ok(int)) =
            (signal(SignalKind::hangup()), signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            return fail("cannot install signal handlers");
        };
        let (front, control) = match start_front(&listener, &filter, unconfined_ok, setup) {
            Ok(f) => f,
            Err(e) => return fail(format!("cannot start the HTTP front: {e}")),
        };
        tracing::info!(listen = %shown, "serve-http: listening on {shown}");
        serve(front, control, Signals { hup, term, int }, session_args, opts.http_token_file.clone()).await
    });
    if let Listener::Unix(_, path) = &listener {
        let _ = std::fs::remove_file(path);
    }
    code
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

/// Move `fd` to a number above the ones the child's layout uses.
fn high_dup(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
        .map(|raw| {
            // SAFETY: fcntl just returned this new descriptor; we own it.
            unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) }
        })
        .map_err(std::io::Error::from)
}

/// Start the front: this binary, empty environment, the listener on fd 3
/// and its control socket on fd 4; then send its setup.
fn start_front(
    listener: &Listener,
    filter: &str,
    unconfined_ok: bool,
    setup: FrontSetup,
) -> Result<(tokio::process::Child, Channel), Box<dyn std::error::Error>> {
    let (ours, theirs) = snowluma_proto::fdpass::pair()?;
    let lfd = high_dup(listener.fd())?;
    let cfd = high_dup(std::os::fd::AsFd::as_fd(&theirs))?;
    let (l_raw, c_raw) = (lfd.as_raw_fd(), cfd.as_raw_fd());
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("snowluma-mcp")
        .arg(super::FRONT_ARG)
        .arg(filter)
        .args(unconfined_ok.then_some(snowluma_sandbox::UNCONFINED_OK_ARG))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    // SAFETY: only dup2 (async-signal-safe) runs between fork and exec; the
    // sources are open descriptors above 9, the targets are 3 and 4.
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in [(l_raw, 3), (c_raw, 4)] {
                if nix::libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    drop((lfd, cfd, theirs));
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
    mut front: tokio::process::Child,
    control: Channel,
    signals: Signals,
    session_args: Vec<OsString>,
    token_file: std::path::PathBuf,
) -> ExitCode {
    let Signals { mut hup, mut term, mut int } = signals;
    let control = std::rc::Rc::new(control);
    let (exited_tx, mut exited_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut sessions: HashMap<u64, Session> = HashMap::new();
    let mut next_session: u64 = 1;
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let code = loop {
                tokio::select! {
                    msg = control.recv::<ToLauncher>() => match msg {
                        Ok((ToLauncher::Spawn { req, token_id, peer }, _)) => {
                            let n = next_session;
                            next_session += 1;
                            match spawn_session(&session_args, &token_id, &peer) {
                                Ok((mut child, theirs)) => {
                                    let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
                                        let _ = control.send(&ToFront::SpawnFailed { req }, None).await;
                                        continue;
                                    };
                                    tracing::info!(session = n, pid, token_id = %token_id, peer = %peer, "serve-http: session started");
                                    sessions.insert(n, Session { pid: Pid::from_raw(pid) });
                                    let tx = exited_tx.clone();
                                    tokio::task::spawn_local(async move {
                                        let _ = child.wait().await;
                                        let _ = tx.send(n);
                                    });
                                    if control.send(&ToFront::Spawned { req, session: n }, Some(theirs.as_raw_fd())).await.is_err() {
                                        break ExitCode::FAILURE;
                                    }
                                }
                                Err(e) => {
                                    tracing::error!(error = %e, "serve-http: cannot start a session");
                                    let _ = control.send(&ToFront::SpawnFailed { req }, None).await;
                                }
                            }
                        }
                        Ok((ToLauncher::End { session, revoked }, _)) => {
                            if let Some(s) = sessions.get(&session) {
                                let pid = s.pid;
                                let limit = if revoked { GRACE } else { ENDED_LIMIT };
                                tokio::task::spawn_local(async move {
                                    tokio::time::sleep(limit).await;
                                    // The group outlives its leader only if a
                                    // member survives; ESRCH is the normal case.
                                    if killpg(pid, Signal::SIGKILL).is_ok() {
                                        tracing::warn!(pid = pid.as_raw(), "serve-http: a session did not end in time; its process group was killed");
                                    }
                                });
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "serve-http: the HTTP front is gone; stopping");
                            break ExitCode::FAILURE;
                        }
                    },
                    Some(n) = exited_rx.recv() => {
                        if let Some(s) = sessions.remove(&n) {
                            // Any straggler of the tree goes with it.
                            let _ = killpg(s.pid, Signal::SIGKILL);
                            tracing::info!(session = n, "serve-http: session ended");
                            let _ = control.send(&ToFront::Exited { session: n }, None).await;
                        }
                    }
                    _ = hup.recv() => match options::load_tokens(&token_file) {
                        Ok(tokens) => {
                            tracing::info!(tokens = tokens.len(), "serve-http: access tokens re-read (SIGHUP)");
                            if control.send(&ToFront::Tokens(tokens), None).await.is_err() {
                                break ExitCode::FAILURE;
                            }
                        }
                        Err(e) => tracing::error!("serve-http: SIGHUP: the token file was not reloaded, the old tokens stay: {e}"),
                    },
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
            let _ = front.start_kill();
            for s in sessions.values() {
                let _ = killpg(s.pid, Signal::SIGTERM);
            }
            let deadline = tokio::time::Instant::now() + GRACE;
            while !sessions.is_empty() {
                tokio::select! {
                    Some(n) = exited_rx.recv() => { sessions.remove(&n); }
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            for s in sessions.values() {
                let _ = killpg(s.pid, Signal::SIGKILL);
            }
            let _ = front.wait().await;
            code
        })
        .await
}

/// One session tree: this binary as the ordinary stdio server, in its own
/// process group, with one end of a socketpair as stdin and stdout.
fn spawn_session(
    args: &[OsString],
    token_id: &str,
    peer: &str,
) -> std::io::Result<(tokio::process::Child, std::os::unix::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let out = ours.try_clone()?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("snowluma-mcp")
        .args(args)
        .env(super::PRINCIPAL_VAR, format!("{token_id} {peer}"))
        .stdin(std::process::Stdio::from(OwnedFd::from(ours)))
        .stdout(std::process::Stdio::from(OwnedFd::from(out)))
        .process_group(0);
    let child = tokio::process::Command::from(cmd).spawn()?;
    Ok((child, theirs))
}
