//! Reactor-driven socket halves that only ask to be woken for input.
//!
//! A tokio `UnixStream` registers its descriptor for readable *and*
//! writable readiness. On a Unix stream socket the kernel then wakes the
//! writer every time the peer consumes data (each freed buffer signals
//! write space), so every IPC message costs its sender a second, useless
//! sleep/wake cycle once the receiver reads it. On a virtualised host a
//! wake-up is the most expensive thing a call does.
//!
//! [`split`] therefore drives the two directions separately:
//! * [`SockReader`] registers one descriptor for readable readiness only;
//! * [`SockWriter`] sends on a second descriptor of the same socket without
//!   any registration, and registers it for writable readiness only while a
//!   send would block (a full socket buffer), removing it once data moves.
//!
//! Both halves speak `AsyncRead`/`AsyncWrite`, so the framing code does not
//! change. Closing both descriptors closes the socket.
//!
//! The skipped wake-up is not without effect on the scheduler. With it, the
//! sender's vCPU is busy just when the receiver passes the call on, so the
//! next process woken tends to stay on the receiver's CPU instead of waking
//! the idle one. `bench-latency`'s floors have that wake-up. A build that
//! restored it was measured and not kept: it was faster only while the
//! bench's paths took turns call by call, and cost CPU (PERFORMANCE.md,
//! "Latency and throughput", the fifteenth sitting).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// The receiving half: readable readiness only.
pub struct SockReader {
    fd: AsyncFd<OwnedFd>,
    /// Known to be a stream socket (our own IPC socketpairs), where a short
    /// read means the queue is empty; a host's stdio socket may be another
    /// kind, so it is asked again until it says so.
    stream: bool,
}

/// The sending half: no standing registration.
pub struct SockWriter {
    /// Writable-readiness registration of `fd`, present only while a send
    /// would block. Declared before `fd` so that it is dropped (and
    /// deregistered) before the descriptor closes.
    waiter: Option<AsyncFd<Raw>>,
    fd: OwnedFd,
}

/// A borrowed raw descriptor for the temporary registration: `SockWriter`
/// owns the descriptor and outlives the registration, which never closes it.
struct Raw(RawFd);

impl AsRawFd for Raw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    Ok(())
}

/// Drive a connected stream socket through two descriptors of it (`read`
/// and `write` must refer to the same socket, e.g. one a `dup` of the other).
/// Must be called inside a tokio runtime with I/O enabled.
pub fn split(read: OwnedFd, write: OwnedFd) -> io::Result<(SockReader, SockWriter)> {
    set_nonblocking(&read)?;
    set_nonblocking(&write)?;
    // SAFETY: `read` is an OwnedFd moved into the AsyncFd, so the descriptor
    // stays open and unchanged for the AsyncFd's whole life.
    let fd = unsafe { AsyncFd::register_with_interest(read, Interest::READABLE) }.map_err(|e| e.into_parts().1)?;
    Ok((SockReader { fd, stream: true }, SockWriter { waiter: None, fd: write }))
}

/// [`split`] for a socket this process shares with others (stdio): the
/// descriptors' flags are left as they are (every call here passes
/// `MSG_DONTWAIT`, so `O_NONBLOCK` is never needed), so a peer or sibling
/// using the same open file description in blocking mode is unaffected.
pub fn split_stdio(read: OwnedFd, write: OwnedFd) -> io::Result<(SockReader, SockWriter)> {
    Ok((SockReader::stdio(read)?, SockWriter::stdio(write)))
}

impl SockReader {
    /// A receiving half on a socket whose flags must not change (see
    /// [`split_stdio`]). Must be called inside a tokio runtime with I/O enabled.
    pub fn stdio(fd: OwnedFd) -> io::Result<SockReader> {
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so the descriptor
        // stays open and unchanged for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)?;
        Ok(SockReader { fd, stream: false })
    }
}

impl SockWriter {
    /// A sending half on a socket whose flags must not change (see
    /// [`split_stdio`]).
    pub fn stdio(fd: OwnedFd) -> SockWriter {
        SockWriter { waiter: None, fd }
    }
}

/// [`split`] on one descriptor, duplicating it for the sending half.
pub fn split_one(fd: OwnedFd) -> io::Result<(SockReader, SockWriter)> {
    let write = fd.try_clone()?;
    split(fd, write)
}

fn last_error<T>(rc: isize, ok: impl FnOnce(usize) -> T) -> io::Result<T> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(ok(rc as usize)) }
}

impl AsyncRead for SockReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let wanted = unfilled.len();
            let res = guard.try_io(|inner| {
                // SAFETY: recv writes at most `unfilled.len()` bytes into the
                // initialized slice we hold exclusively; the descriptor is
                // owned by the AsyncFd and open.
                let rc = unsafe {
                    nix::libc::recv(
                        inner.as_raw_fd(),
                        unfilled.as_mut_ptr().cast(),
                        unfilled.len(),
                        nix::libc::MSG_DONTWAIT,
                    )
                };
                last_error(rc, |n| n)
            });
            match res {
                Ok(Ok(n)) => {
                    // A short read of a stream socket took everything queued:
                    // wait for the next readiness instead of asking again
                    // (one `recv` fewer per message; data that arrives later
                    // raises readiness anew, as tokio's own streams assume).
                    if self.stream && n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Readiness was stale (cleared by try_io): wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

impl SockWriter {
    fn send(&self, data: &[u8]) -> io::Result<usize> {
        // SAFETY: send reads at most `data.len()` bytes from the slice; the
        // descriptor is owned by `self` and open. MSG_NOSIGNAL: a closed
        // peer is an error, not a SIGPIPE.
        let rc = unsafe {
            nix::libc::send(
                self.fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                nix::libc::MSG_DONTWAIT | nix::libc::MSG_NOSIGNAL,
            )
        };
        last_error(rc, |n| n)
    }
}

impl SockWriter {
    /// One non-blocking send of as much of `data` as the socket takes now
    /// (`WouldBlock` when it takes nothing), without any registration: for
    /// a sender that queues what is left ([`crate::outbox`]).
    pub fn send_some(&self, data: &[u8]) -> io::Result<usize> {
        loop {
            match self.send(data) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

impl AsyncWrite for SockWriter {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            match self.send(data) {
                Ok(n) => {
                    // Data moved: stop listening for write space.
                    self.waiter = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.waiter.is_none() {
                        // Registration reports current readiness, so space
                        // freed since the failed send is not missed.
                        let raw = Raw(self.fd.as_raw_fd());
                        // SAFETY: `self.fd` owns the descriptor and is dropped
                        // after `waiter` (field order), and is never replaced,
                        // so it stays open and the same for the registration's
                        // whole life.
                        let waiter = unsafe { AsyncFd::register_with_interest(raw, Interest::WRITABLE) }
                            .map_err(|e| e.into_parts().1)?;
                        self.waiter = Some(waiter);
                    }
                    let Some(waiter) = self.waiter.as_ref() else { continue };
                    let mut guard = ready!(waiter.poll_write_ready(cx))?;
                    guard.clear_ready();
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown(2) on a descriptor we own; no memory involved.
        let rc = unsafe { nix::libc::shutdown(self.fd.as_raw_fd(), nix::libc::SHUT_WR) };
        Poll::Ready(last_error(rc as isize, |_| ()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected Unix stream socketpair, for the tests of what runs on one.
    pub(crate) fn pair() -> (OwnedFd, OwnedFd) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).unwrap()
    }

    #[tokio::test]
    async fn round_trip_and_eof() {
        let (a, b) = pair();
        let (mut ar, mut aw) = split_one(a).unwrap();
        let (mut br, mut bw) = split_one(b).unwrap();
        aw.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        br.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        bw.write_all(b"back").await.unwrap();
        let mut buf = [0u8; 4];
        ar.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
        drop((ar, aw));
        let mut rest = Vec::new();
        br.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// A write larger than the socket buffer blocks until the peer reads,
    /// then completes; nothing is lost or reordered.
    #[tokio::test]
    async fn large_write_waits_for_space() {
        let (a, b) = pair();
        let (_ar, mut aw) = split_one(a).unwrap();
        let (mut br, _bw) = split_one(b).unwrap();
        let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            aw.write_all(&data).await.unwrap();
            aw
        });
        let mut got = vec![0u8; expect.len()];
        br.read_exact(&mut got).await.unwrap();
        assert!(got == expect);
        let aw = writer.await.unwrap();
        assert!(aw.waiter.is_none(), "the write-space registration is dropped once data moves");
    }

    fn nonblocking(fd: &OwnedFd) -> bool {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).unwrap()).contains(OFlag::O_NONBLOCK)
    }

    /// The stdio halves never make a shared socket non-blocking, and still
    /// move data both ways without blocking the runtime.
    #[tokio::test]
    async fn stdio_halves_leave_flags_untouched() {
        let (a, b) = pair();
        let (c, d) = pair();
        let (mut r, mut w) = split_stdio(a.try_clone().unwrap(), c.try_clone().unwrap()).unwrap();
        assert!(!nonblocking(&a) && !nonblocking(&c), "stdio sockets stay blocking");
        let (_br, mut bw) = split_one(b).unwrap();
        let (mut dr, _dw) = split_one(d).unwrap();
        bw.write_all(b"in").await.unwrap();
        let mut buf = [0u8; 2];
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"in");
        let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
        let expect = big.clone();
        let writer = tokio::spawn(async move { w.write_all(&big).await.unwrap() });
        let mut got = vec![0u8; expect.len()];
        dr.read_exact(&mut got).await.unwrap();
        assert!(got == expect);
        writer.await.unwrap();
    }

    /// After a short read (which clears readiness rather than asking the
    /// socket again), data written later still wakes the reader.
    #[tokio::test]
    async fn data_after_a_short_read_is_still_seen() {
        let (a, b) = pair();
        let (_ar, mut aw) = split_one(a).unwrap();
        let (mut br, _bw) = split_one(b).unwrap();
        for round in 0..50u8 {
            aw.write_all(&[round; 3]).await.unwrap();
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), br.read(&mut buf))
                .await
                .expect("the reader is woken by data that came after its short read")
                .unwrap();
            assert_eq!(&buf[..n], &[round; 3]);
        }
    }

    #[tokio::test]
    async fn closed_peer_is_an_error_not_a_signal() {
        let (a, b) = pair();
        let (_ar, mut aw) = split_one(a).unwrap();
        drop(b);
        let err = aw.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
