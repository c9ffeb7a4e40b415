//! Choosing how to drive descriptors 0 and 1, for every way a host can
//! spawn us.
//!
//! * Node/Electron hosts (Claude Desktop, Claude Code, Cursor, VS Code, the
//!   Inspector) give the child one *socketpair* for stdin and another for
//!   stdout; Python hosts give pipes; systemd `Accept=yes` gives the same
//!   connected socket as both; a shell may give a file, a tty or
//!   `/dev/null`.
//! * Descriptor 0 carries both directions only when descriptors 0 and 1 are
//!   the *same* socket (same device and inode). Otherwise each direction is
//!   driven on its own descriptor, according to its own type.
//! * No flag of a descriptor shared with another writer is changed: sockets
//!   are driven with per-call `MSG_DONTWAIT` and never made non-blocking; a
//!   stdout pipe is made non-blocking (and driven by the reactor) only when
//!   stderr is not the same pipe, because the tracing writer writes stderr
//!   in blocking mode. Everything else is written by a blocking thread,
//!   which also waits in `poll` if the descriptor was non-blocking already.
//! * A write that cannot proceed waits for space; nothing is ever dropped.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

pub type Input = Box<dyn AsyncRead + Send + Sync + Unpin>;

/// How one direction is driven (reported once at startup, for diagnosis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Both directions on one socket (systemd `Accept=yes`).
    SharedSocket,
    Socket,
    Pipe,
    /// A file, tty, `/dev/null` or anything else: a blocking thread.
    Blocking,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SharedSocket => "shared socket",
            Kind::Socket => "socket",
            Kind::Pipe => "pipe",
            Kind::Blocking => "blocking",
        }
    }
}

/// The sending side of stdout.
pub enum Output {
    /// Reactor-driven (a socket or an unshared pipe).
    Async(Box<dyn AsyncWrite + Send + Sync + Unpin>),
    /// Written by the blocking pool, flags untouched.
    Blocking(Arc<OwnedFd>),
    /// Descriptor 1 is closed: every write fails.
    Closed,
}

impl Output {
    /// Write one whole message. Returns only when every byte is written, or
    /// with the error that makes the rest impossible.
    pub async fn write_all(&mut self, data: Vec<u8>) -> io::Result<()> {
        match self {
            Output::Async(w) => {
                w.write_all(&data).await?;
                w.flush().await
            }
            Output::Blocking(fd) => {
                let fd = fd.clone();
                tokio::task::spawn_blocking(move || write_all_blocking(fd.as_fd(), &data))
                    .await
                    .map_err(|e| io::Error::other(format!("stdout writer thread: {e}")))?
            }
            Output::Closed => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    pub async fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Async(w) => w.flush().await,
            Output::Blocking(_) | Output::Closed => Ok(()),
        }
    }
}

/// A duplicate of stdout (a socket or a pipe), to ask how many bytes written
/// to it the client has not read yet.
pub struct Unread {
    fd: OwnedFd,
    socket: bool,
}

impl Unread {
    fn of(fd: &OwnedFd, socket: bool) -> Option<Unread> {
        fd.try_clone().ok().map(|fd| Unread { fd, socket })
    }

    /// Bytes written and not yet read by the client (`SIOCOUTQ` on a Unix
    /// stream socket, `FIONREAD` on a pipe); `None` if the kernel will not say.
    pub fn bytes(&self) -> Option<usize> {
        let request = if self.socket { nix::libc::TIOCOUTQ } else { nix::libc::FIONREAD };
        let mut n: nix::libc::c_int = 0;
        // SAFETY: both requests write one c_int through the pointer, which
        // points at a live local; the descriptor is owned and open.
        let rc = unsafe { nix::libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&self.fd), request, &mut n) };
        (rc == 0).then_some(usize::try_from(n).unwrap_or(0))
    }
}

/// `write(2)` until done; `EINTR` retried, `EAGAIN` (a descriptor someone
/// else made non-blocking) waits in `poll` for space.
fn write_all_blocking(fd: BorrowedFd<'_>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLOUT)];
                match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a failed stdout write means the reader is gone for good (the
/// session cannot continue) rather than a fault of one message.
pub fn is_gone(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected | WriteZero)
}

struct Desc {
    fd: OwnedFd,
    fifo: bool,
    socket: bool,
    dev: u64,
    ino: u64,
}

/// A duplicate of descriptor `n` and what it is; `None` if it is closed.
fn describe(n: i32) -> Option<Desc> {
    // SAFETY: descriptors 0, 1 and 2 are not closed by this program; the
    // borrow only lives for the duplication below.
    let borrowed = unsafe { BorrowedFd::borrow_raw(n) };
    let fd = borrowed.try_clone_to_owned().ok()?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().ok()?;
    let ft = meta.file_type();
    Some(Desc { fifo: ft.is_fifo(), socket: ft.is_socket(), dev: meta.dev(), ino: meta.ino(), fd: file.into() })
}

fn same(a: &Desc, b: &Desc) -> bool {
    a.dev == b.dev && a.ino == b.ino
}

/// The two directions of stdio, each driven according to its own type.
/// Must be called inside the tokio runtime.
pub struct Stdio {
    pub input: Input,
    pub output: Output,
    pub in_kind: Kind,
    pub out_kind: Kind,
    /// For a socket or pipe stdout: how much the client has not read yet.
    pub unread: Option<Unread>,
}

pub fn open() -> Stdio {
    let unread = describe(1).and_then(|d| (d.socket || d.fifo).then(|| Unread::of(&d.fd, d.socket)).flatten());
    let (input, output, in_kind, out_kind) = open_halves();
    Stdio { input, output, in_kind, out_kind, unread }
}

fn open_halves() -> (Input, Output, Kind, Kind) {
    let input = describe(0);
    let output = describe(1);
    // systemd `Accept=yes`: one connected socket as both 0 and 1.
    let shared = matches!((&input, &output), (Some(i), Some(o)) if i.socket && o.socket && same(i, o));
    if shared && let (Some(i), Some(o)) = (&input, &output) {
        let (Ok(i), Ok(o)) = (i.fd.try_clone(), o.fd.try_clone()) else {
            return (Box::new(tokio::io::stdin()), blocking_stdout(), Kind::Blocking, Kind::Blocking);
        };
        return match snowluma_proto::sockio::split_stdio(i, o) {
            Ok((r, w)) => (Box::new(r), Output::Async(Box::new(w)), Kind::SharedSocket, Kind::SharedSocket),
            Err(e) => {
                tracing::warn!(error = %e, "cannot drive the stdio socket from the reactor; using blocking threads");
                (Box::new(tokio::io::stdin()), blocking_stdout(), Kind::Blocking, Kind::Blocking)
            }
        };
    }
    let (reader, in_kind) = open_input(input);
    let (writer, out_kind) = open_output(output);
    (reader, writer, in_kind, out_kind)
}

fn open_input(desc: Option<Desc>) -> (Input, Kind) {
    let fallback = || -> (Input, Kind) { (Box::new(tokio::io::stdin()), Kind::Blocking) };
    let Some(d) = desc else { return fallback() };
    if d.socket {
        match snowluma_proto::sockio::SockReader::stdio(d.fd) {
            Ok(r) => return (Box::new(r), Kind::Socket),
            Err(e) => tracing::warn!(error = %e, "cannot drive the stdin socket from the reactor"),
        }
    } else if d.fifo {
        // The read end of our stdin pipe has no other writer: making it
        // non-blocking affects no one else's writes.
        match tokio::net::unix::pipe::Receiver::from_file(std::fs::File::from(d.fd)) {
            Ok(r) => return (Box::new(r), Kind::Pipe),
            Err(e) => tracing::warn!(error = %e, "cannot drive the stdin pipe from the reactor"),
        }
    }
    fallback()
}

fn open_output(desc: Option<Desc>) -> (Output, Kind) {
    let Some(d) = desc else { return (blocking_stdout(), Kind::Blocking) };
    if d.socket {
        return (Output::Async(Box::new(snowluma_proto::sockio::SockWriter::stdio(d.fd))), Kind::Socket);
    }
    if d.fifo {
        // O_NONBLOCK lives on the open file description, which stderr shares
        // when the host redirected both into one pipe (`2>&1`): then the
        // blocking writer, so that diagnostics are never cut short.
        let stderr_shares = describe(2).is_some_and(|e| same(&d, &e));
        if !stderr_shares {
            match tokio::net::unix::pipe::Sender::from_file(std::fs::File::from(d.fd)) {
                Ok(w) => return (Output::Async(Box::new(w)), Kind::Pipe),
                Err(e) => tracing::warn!(error = %e, "cannot drive the stdout pipe from the reactor"),
            }
        }
        return (blocking_stdout(), Kind::Blocking);
    }
    (Output::Blocking(Arc::new(d.fd)), Kind::Blocking)
}

/// The blocking writer on a duplicate of descriptor 1; if descriptor 1 is
/// closed, an output whose every write fails (the session then ends).
fn blocking_stdout() -> Output {
    match describe(1) {
        Some(d) => Output::Blocking(Arc::new(d.fd)),
        None => Output::Closed,
    }
}
