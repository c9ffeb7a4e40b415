//! Diagnostics on stderr that never wait for a reader.
//!
//! An MCP host may never read our stderr; a pipe holds 64 KiB, and a
//! blocking write to a full one waits forever — in the supervisor that
//! stopped the protocol. Every process (supervisor, spawner, workers,
//! `serve-http`'s launcher and front) therefore writes each diagnostic line
//! with one non-blocking attempt: a line that does not fit is dropped and
//! counted, and the next line that fits is preceded by one line saying how
//! many were dropped.
//!
//! `O_NONBLOCK` belongs to the open file description, which the host (and
//! whatever else it started) may share, so it is never set on the
//! description we were given. Instead [`prepare`] (once per process, before
//! confinement) decides how descriptor 2 is written:
//!
//! * a socket (journald): `send(MSG_DONTWAIT)`, flags untouched;
//! * a description already non-blocking (ours, inherited: the spawner, the
//!   workers and `serve-http`'s sessions share their parent's): plain writes;
//! * a pipe or terminal: reopened through `/proc/self/fd/2`, which makes a
//!   new open file description of the same pipe or terminal, set
//!   non-blocking and put on descriptor 2 (`dup2`), so only this process and
//!   its children write through it;
//! * a regular file or `/dev/null`: plain writes (they never wait for a reader);
//! * a pipe or terminal that cannot be reopened (no `/proc`): `poll` for
//!   room first where the process's seccomp filter allows it (the supervisor,
//!   the spawner, the launcher), which another writer to the same pipe can
//!   still race; plain writes elsewhere.
//!
//! A line longer than the pipe's atomic size (4 KiB) can be cut by a full
//! pipe; the rest is dropped and the dropped-lines report starts on a new line.
//!
//! Lines a thread writes inside [`together`] go out at its end in as few
//! writes as whole lines within the atomic size allow (the supervisor's
//! closing lines of calls answered in one stdout write: one stderr write,
//! not one per call).

use std::cell::RefCell;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Mutex, OnceLock};

const STDERR: RawFd = 2;

/// What one write to a pipe never interleaves with another's (`PIPE_BUF`).
const ATOMIC: usize = 4096;

/// Most bytes gathered by [`together`] before they are written.
const GATHER_MAX: usize = 16 * ATOMIC;

/// A thread's [`together`]: whether one is running, and its lines (the
/// buffer is kept between calls, so gathering allocates once per thread).
struct Gather {
    active: bool,
    lines: Vec<u8>,
}

thread_local! {
    static GATHERED: RefCell<Gather> = const { RefCell::new(Gather { active: false, lines: Vec::new() }) };
}

/// How descriptor 2 is written (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    NonBlocking,
    Socket,
    Direct,
    Polled,
}

struct Sink {
    /// Descriptor 2 (another one in unit tests).
    fd: RawFd,
    mode: Mode,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Lines dropped since the last report.
    dropped: u64,
    /// The last write was cut short: the next one starts a new line.
    torn: bool,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Decide how descriptor 2 is written, once per process (later calls keep
/// the first decision). Must run while the process is single-threaded and
/// not yet confined (it may open `/proc/self/fd/2`). `may_poll`: the
/// process's seccomp filter allows `poll` (for the fallback).
pub fn prepare(may_poll: bool) -> Mode {
    SINK.get_or_init(|| Sink::new(STDERR, choose(may_poll))).mode
}

fn choose(may_poll: bool) -> Mode {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use nix::sys::stat::{SFlag, fstat};
    // SAFETY: descriptor 2 is never closed by this program; the borrow is
    // used only for the calls below.
    let fd = unsafe { BorrowedFd::borrow_raw(STDERR) };
    let Ok(st) = fstat(fd) else { return Mode::Direct };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFSOCK {
        return Mode::Socket;
    }
    let flags = fcntl(fd, FcntlArg::F_GETFL).map(OFlag::from_bits_truncate).unwrap_or(OFlag::empty());
    if flags.contains(OFlag::O_NONBLOCK) {
        return Mode::NonBlocking;
    }
    let tty = kind == SFlag::S_IFCHR && nix::unistd::isatty(fd).unwrap_or(false);
    if kind != SFlag::S_IFIFO && !tty {
        return Mode::Direct;
    }
    match reopen_nonblocking() {
        Ok(()) => Mode::NonBlocking,
        Err(_) if may_poll => Mode::Polled,
        Err(_) => Mode::Direct,
    }
}

/// A new open file description of whatever descriptor 2 is, non-blocking,
/// put on descriptor 2.
fn reopen_nonblocking() -> nix::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode as Perm;
    use std::os::fd::AsRawFd;
    let fresh = open(
        "/proc/self/fd/2",
        OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Perm::empty(),
    )?;
    // SAFETY: dup2 onto descriptor 2, which this process owns; `fresh` is
    // a descriptor we just opened and close (drop) right after. dup2 leaves
    // descriptor 2 inheritable, as it was.
    let r = unsafe { nix::libc::dup2(fresh.as_raw_fd(), STDERR) };
    if r < 0 {
        return Err(nix::Error::last());
    }
    Ok(())
}

/// Write one diagnostic line (ending in `\n`) without waiting; before
/// [`prepare`], or if it was never called, as [`Mode::Direct`].
pub fn write_line(line: &[u8]) {
    let gathered = GATHERED.try_with(|g| {
        let mut g = g.borrow_mut();
        if !g.active {
            return false;
        }
        if g.lines.len() + line.len() > GATHER_MAX {
            sink().emit_lines(&g.lines);
            g.lines.clear();
        }
        g.lines.extend_from_slice(line);
        true
    });
    if gathered != Ok(true) {
        sink().emit(line);
    }
}

fn sink() -> &'static Sink {
    SINK.get_or_init(|| Sink::new(STDERR, Mode::Direct))
}

/// Run `f`; the diagnostic lines this thread writes meanwhile are written
/// at its end (or as it unwinds), in their order, together: one write for
/// as many whole lines as fit in 4 KiB, so that a pipe never mixes them
/// with another process's lines. Inside another `together`, the outer one
/// writes them.
pub fn together<R>(f: impl FnOnce() -> R) -> R {
    together_into(sink(), f)
}

fn together_into<R>(sink: &Sink, f: impl FnOnce() -> R) -> R {
    /// Writes the gathered lines when `f` returns or unwinds.
    struct Gathering<'a>(&'a Sink);
    impl Drop for Gathering<'_> {
        fn drop(&mut self) {
            let _ = GATHERED.try_with(|g| {
                let mut g = g.borrow_mut();
                g.active = false;
                // Emitting logs nothing, so the borrow is not re-entered.
                self.0.emit_lines(&g.lines);
                g.lines.clear();
                // What a burst grew beyond the usual batch is given back.
                g.lines.shrink_to(4 * ATOMIC);
            });
        }
    }
    let outer = GATHERED.try_with(|g| !std::mem::replace(&mut g.borrow_mut().active, true));
    if outer != Ok(true) {
        return f();
    }
    let _gathering = Gathering(sink);
    f()
}

/// `buf` cut at line ends into pieces of at most [`ATOMIC`] bytes (a longer
/// line is a piece of its own).
fn pieces(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = if rest.len() <= ATOMIC {
            rest.len()
        } else {
            match rest[..ATOMIC].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                // One line longer than ATOMIC: up to its end.
                None => rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1),
            }
        };
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// How many lines `bytes` holds or begins (a last line without its `\n`
/// counts).
fn lines_in(bytes: &[u8]) -> u64 {
    let ends = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    ends + u64::from(!bytes.is_empty() && !bytes.ends_with(b"\n"))
}

impl Sink {
    fn new(fd: RawFd, mode: Mode) -> Sink {
        Sink { fd, mode, state: Mutex::new(State::default()) }
    }

    /// Write lines gathered by [`together`], whole lines at a time.
    fn emit_lines(&self, buf: &[u8]) {
        for piece in pieces(buf) {
            self.emit(piece);
        }
    }

    /// Write one piece (a line, or whole lines within [`ATOMIC`]) in one
    /// attempt; what does not fit is dropped and counted.
    fn emit(&self, piece: &[u8]) {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.dropped > 0 || st.torn {
            let report = format!(
                "{}snowluma-mcp: {} log lines dropped: stderr was full\n",
                if st.torn { "\n" } else { "" },
                st.dropped
            );
            let done = self.write(report.as_bytes());
            if done < report.len() {
                st.dropped += lines_in(piece);
                st.torn |= done > 0;
                return;
            }
            *st = State::default();
        }
        let done = self.write(piece);
        if done < piece.len() {
            st.dropped += lines_in(&piece[done..]);
            st.torn = done > 0 && piece[done - 1] != b'\n';
        }
    }

    /// Write as much of `buf` as fits now (all of it for [`Mode::Direct`]);
    /// how many bytes were written.
    fn write(&self, buf: &[u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            if self.mode == Mode::Polled && !self.room() {
                break;
            }
            match self.write_once(&buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => {}
                // EAGAIN: full. Anything else (EPIPE: nobody reads; EBADF:
                // no stderr): the line is lost all the same.
                Err(_) => break,
            }
        }
        done
    }

    fn write_once(&self, buf: &[u8]) -> nix::Result<usize> {
        // SAFETY: the sink's descriptor (2) is never closed by this
        // program; the borrow lives for this one call.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        match self.mode {
            Mode::Socket => {
                use nix::sys::socket::{MsgFlags, send};
                send(self.fd, buf, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL)
            }
            Mode::NonBlocking | Mode::Direct | Mode::Polled => nix::unistd::write(fd, buf),
        }
    }

    /// Whether the descriptor has room now ([`Mode::Polled`]).
    fn room(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        // SAFETY: as in `write_once`.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
            && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLOUT))
    }
}

/// tracing's writer: each event arrives as one `write` of a whole line.
#[derive(Debug, Clone, Copy)]
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Stderr;
    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

impl std::io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_line(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Marks a log filter whose process may log payloads (`;` cannot occur in
/// a valid filter).
pub const LOG_PAYLOADS_PREFIX: &str = "payloads;";

/// Diagnostics on stderr, for every process role. `filter` is
/// SNOWLUMA_MCP_LOG (validated at startup), optionally prefixed with
/// [`LOG_PAYLOADS_PREFIX`] on a worker's command line. Without payload
/// logging, every target but our own is capped at INFO whatever the filter
/// says: rmcp's and the HTTP stack's debug and trace lines carry message
/// texts, file paths and whatever SnowLuma answered (a reflected token
/// included).
///
/// Lines go through this module's sink, which never waits for a reader (an
/// unread stderr pipe once stopped the server). Call it while the process
/// is single-threaded and unconfined; `may_poll`: the process's seccomp
/// filter allows `poll` (see [`prepare`]).
pub fn init_tracing(filter: &str, may_poll: bool) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (payloads, filter) = match filter.strip_prefix(LOG_PAYLOADS_PREFIX) {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let cap = tracing_subscriber::filter::filter_fn(move |m| {
        payloads || m.target().starts_with("snowluma") || *m.level() <= tracing::Level::INFO
    });
    prepare(may_poll);
    let fmt = tracing_subscriber::fmt::layer().with_writer(Stderr).with_ansi(false).with_target(false);
    let _ = tracing_subscriber::registry().with(filter).with(fmt.with_filter(cap)).try_init();
}

/// `eprintln!` for processes whose stderr may be non-blocking: the line is
/// written like a diagnostic (never waited for; std's `eprintln!` would
/// panic on a full non-blocking stderr).
#[macro_export]
macro_rules! eprintln_nb {
    ($($arg:tt)*) => {
        $crate::write_line(format!("{}\n", format_args!($($arg)*)).as_bytes())
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn read_all(r: &std::os::fd::OwnedFd) -> String {
        let mut buf = vec![0u8; 1 << 20];
        let n = nix::unistd::read(r, &mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    /// The 99-`x` lines in `text`, and the lines its reports say were
    /// dropped (any other line fails the test).
    fn tally(text: &str) -> (u64, u64) {
        let (mut lines, mut reported) = (0, 0);
        for l in text.lines() {
            if l.len() == 99 && l.bytes().all(|b| b == b'x') {
                lines += 1;
            } else {
                let n = l
                    .strip_prefix("snowluma-mcp: ")
                    .and_then(|l| l.strip_suffix(" log lines dropped: stderr was full"));
                reported += n.and_then(|n| n.parse::<u64>().ok()).unwrap_or_else(|| panic!("{l:?}"));
            }
        }
        (lines, reported)
    }

    /// A full pipe drops whole lines and counts them; once it is read, the
    /// next line is preceded by the count. (A sink over a pipe of its own,
    /// not this test process's stderr.)
    #[test]
    fn a_full_pipe_drops_and_counts() {
        for mode in [Mode::NonBlocking, Mode::Polled] {
            let (r, w) = nix::unistd::pipe().unwrap();
            if mode == Mode::NonBlocking {
                nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
            }
            let sink = Sink::new(w.as_raw_fd(), mode);
            let line: Vec<u8> = [b'x'; 99].into_iter().chain(*b"\n").collect();
            for _ in 0..2000 {
                sink.emit(&line);
            }
            let dropped = sink.state.lock().unwrap().dropped;
            assert!(dropped > 0, "{mode:?}: 200 000 bytes do not fit a pipe");
            // Whole lines only: each a line written or a report of the
            // lines dropped before it (a report fits where a line did not).
            let text = read_all(&r);
            let (lines, reported) = tally(&text);
            assert!(text.ends_with('\n'));
            assert_eq!(lines + reported + dropped, 2000, "{mode:?}: every line written or counted");
            sink.emit(b"next\n");
            assert_eq!(read_all(&r), format!("snowluma-mcp: {dropped} log lines dropped: stderr was full\nnext\n"));
            sink.emit(b"again\n");
            assert_eq!(read_all(&r), "again\n", "{mode:?}: reported once");
        }
    }

    /// Lines written inside `together` (nested ones included) go out at
    /// its end as one write, in order; nothing before. (A datagram socket:
    /// one `send` is one message.)
    #[test]
    fn lines_written_together_are_one_write() {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        let sink = Sink::new(ours.as_raw_fd(), Mode::Socket);
        let mut buf = [0u8; 8192];
        let n = together_into(&sink, || {
            write_line(b"one\n");
            together(|| write_line(b"two\n"));
            write_line(b"three\n");
            assert!(theirs.recv(&mut buf).is_err(), "written before the end");
            3
        });
        assert_eq!(n, 3);
        let got = theirs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"one\ntwo\nthree\n");
        assert!(theirs.recv(&mut buf).is_err(), "more than one write");
        // Afterwards lines go one by one again (to the process's sink).
        assert!(GATHERED.with(|g| !g.borrow().active && g.borrow().lines.is_empty()));
    }

    /// A `together` that panics still writes what it gathered.
    #[test]
    fn lines_gathered_before_a_panic_are_written() {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let sink = Sink::new(ours.as_raw_fd(), Mode::Socket);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            together_into(&sink, || {
                write_line(b"before\n");
                panic!("in the middle");
            })
        }));
        assert!(r.is_err());
        let mut buf = [0u8; 64];
        let got = theirs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"before\n");
        assert!(GATHERED.with(|g| !g.borrow().active && g.borrow().lines.is_empty()));
    }

    /// Gathered lines are cut at line ends into pieces a pipe writes whole.
    #[test]
    fn pieces_are_whole_lines_within_the_atomic_size() {
        let mut buf = Vec::new();
        for n in 0..64 {
            buf.extend(std::iter::repeat_n(b'a' + (n % 26) as u8, 199));
            buf.push(b'\n');
        }
        buf.extend(std::iter::repeat_n(b'L', 5000));
        buf.push(b'\n');
        buf.extend(b"last, unended");
        let pieces: Vec<&[u8]> = pieces(&buf).collect();
        assert_eq!(pieces.concat(), buf);
        for (i, p) in pieces.iter().enumerate() {
            let last = i == pieces.len() - 1;
            assert!(last || p.ends_with(b"\n"), "piece {i} ends inside a line");
            assert!(p.len() <= ATOMIC || lines_in(p) == 1, "piece {i}: {} bytes", p.len());
        }
        assert_eq!(pieces.iter().filter(|p| p.len() > ATOMIC).count(), 1, "the long line alone");
        assert_eq!(pieces.iter().map(|p| lines_in(p)).sum::<u64>(), 66);
    }

    /// Lines written together into a full pipe: every line written or
    /// counted, whole lines only.
    #[test]
    fn lines_together_into_a_full_pipe_are_written_or_counted() {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
        let sink = Sink::new(w.as_raw_fd(), Mode::NonBlocking);
        let line: Vec<u8> = [b'x'; 99].into_iter().chain(*b"\n").collect();
        sink.emit_lines(&line.repeat(2000));
        let dropped = sink.state.lock().unwrap().dropped;
        let text = read_all(&r);
        assert!(dropped > 0 && text.ends_with('\n'));
        let (lines, reported) = tally(&text);
        assert_eq!(lines + reported + dropped, 2000, "every line written or counted");
        sink.emit(b"next\n");
        assert_eq!(read_all(&r), format!("snowluma-mcp: {dropped} log lines dropped: stderr was full\nnext\n"));
    }

    /// A line cut short by a full pipe: the report starts on a new line.
    #[test]
    fn a_cut_line_is_ended_before_the_report() {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).unwrap();
        let sink = Sink::new(w.as_raw_fd(), Mode::NonBlocking);
        let long = vec![b'y'; 200_000];
        sink.emit(&long);
        let first = read_all(&r);
        assert!(!first.is_empty() && first.len() < long.len());
        sink.emit(b"next\n");
        assert_eq!(read_all(&r), "\nsnowluma-mcp: 1 log lines dropped: stderr was full\nnext\n");
    }
}
