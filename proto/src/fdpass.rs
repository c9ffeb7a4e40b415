//! Descriptor passing between processes: a `SOCK_SEQPACKET` socket on which
//! each message is an 8-byte tag plus exactly one descriptor (SCM_RIGHTS).
//!
//! This is how file bytes avoid the supervisor: the file-transfer worker
//! opens a file and sends its descriptor; the supervisor forwards the
//! descriptor (never the bytes) to the network executor, which reads or
//! writes it. Received descriptors wait in a table until claimed by tag.
//!
//! [`send_packet`] and [`recv_packet`] are the one SCM_RIGHTS codec of the
//! project: a packet of bytes with its descriptors. The tagged channel
//! here, the spawner's protocol (`spawn.rs`) and the `serve-http` control
//! channel (`front.rs`) are all built on them.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, sendmsg, socketpair,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
pub enum FdPassError {
    #[error("descriptor channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("descriptor channel closed")]
    Closed,
    #[error("descriptor {0} did not arrive in time")]
    Timeout(u64),
    #[error("malformed descriptor message")]
    Malformed,
    #[error("descriptor {0} was sent but could not be received (the process is out of descriptors)")]
    Lost(u64),
}

/// A descriptor nobody claims is dropped after this long (a backstop; the
/// known paths discard theirs at once).
pub const UNCLAIMED_TTL: Duration = Duration::from_secs(60);

/// A new connected pair (close-on-exec), one end per process.
pub fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).map_err(std::io::Error::from)
}

/// Blocking send of one tagged descriptor.
pub fn send_blocking(channel: BorrowedFd<'_>, tag: u64, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    send_packet(channel, &tag.to_le_bytes(), &[fd], false)?;
    Ok(())
}

/// Most descriptors one packet may carry.
pub const MAX_PACKET_FDS: usize = 8;

/// Send one packet: `bytes` with `fds` attached (SCM_RIGHTS; none if
/// empty), never raising `SIGPIPE`. `dontwait`: fail with `EWOULDBLOCK`
/// rather than wait for buffer space. Returns the bytes sent.
pub fn send_packet(
    channel: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    dontwait: bool,
) -> std::io::Result<usize> {
    let iov = [IoSlice::new(bytes)];
    let flags = if dontwait { MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT } else { MsgFlags::MSG_NOSIGNAL };
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(channel.as_raw_fd(), &iov, cmsgs, flags, None).map_err(std::io::Error::from)
}

/// One packet as [`recv_packet`] received it.
#[derive(Debug)]
pub struct Packet {
    /// How many bytes of the buffer it filled (0: the peer closed).
    pub len: usize,
    /// The descriptors it carried (close-on-exec), owned.
    pub fds: Vec<OwnedFd>,
    /// Its bytes did not fit the buffer (`MSG_TRUNC`): the rest is lost.
    pub truncated: bool,
    /// Descriptors were attached but did not fit (`MSG_CTRUNC`: more than
    /// asked for, or the kernel could not install them, e.g. EMFILE):
    /// `fds` is empty.
    pub fd_lost: bool,
}

/// Receive one packet into `buf`, with at most `max_fds` descriptors (at
/// most [`MAX_PACKET_FDS`]). `dontwait`: fail with `EWOULDBLOCK` rather
/// than wait for one.
pub fn recv_packet(channel: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize, dontwait: bool) -> std::io::Result<Packet> {
    let flags = if dontwait { MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT } else { MsgFlags::MSG_CMSG_CLOEXEC };
    let payload = (max_fds.min(MAX_PACKET_FDS) * std::mem::size_of::<RawFd>()) as nix::libc::c_uint;
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    let space_len = unsafe { nix::libc::CMSG_SPACE(payload) } as usize;
    let mut space = vec![0u8; space_len];
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(channel.as_raw_fd(), &mut iov, Some(&mut space), flags).map_err(std::io::Error::from)?;
    let fd_lost = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
    let mut fds = Vec::new();
    // With MSG_CTRUNC nix refuses to walk the control messages (ENOBUFS);
    // the packet then carries none we can use.
    if !fd_lost {
        for c in msg.cmsgs().map_err(std::io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in our
                    // table for us; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
    }
    Ok(Packet { len: msg.bytes, fds, truncated, fd_lost })
}

/// One message from the channel.
enum Received {
    /// The peer closed the channel.
    Closed,
    Fd(u64, OwnedFd),
    /// The tag arrived but its descriptor did not: the kernel could not
    /// install it (`MSG_CTRUNC`, e.g. EMFILE). The channel stays usable.
    Lost(u64),
}

fn recv_one(channel: BorrowedFd<'_>) -> std::io::Result<Received> {
    let mut buf = [0u8; 8];
    // A message carries one descriptor; extra ones are closed (dropped).
    let packet = recv_packet(channel, &mut buf, 1, false)?;
    match (packet.len, packet.fds.into_iter().next(), packet.fd_lost) {
        (0, None, _) => Ok(Received::Closed),
        (8, Some(fd), _) => Ok(Received::Fd(u64::from_le_bytes(buf), fd)),
        (8, None, true) => Ok(Received::Lost(u64::from_le_bytes(buf))),
        _ => Err(std::io::Error::from(nix::Error::EPROTO)),
    }
}

/// The receiving side: a task reads every message into a table; callers
/// claim descriptors by tag.
#[derive(Clone)]
pub struct FdReceiver {
    table: Arc<Mutex<Table>>,
    notify: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    /// Received, not yet claimed, with their arrival time.
    fds: HashMap<u64, (OwnedFd, Instant)>,
    /// Discarded before they arrived: dropped on arrival.
    discarded: HashMap<u64, Instant>,
    /// Arrived without their descriptor.
    lost: HashMap<u64, Instant>,
    closed: bool,
}

impl Table {
    /// Drop what has waited longer than [`UNCLAIMED_TTL`].
    fn prune(&mut self, now: Instant) {
        let fresh = |t: &Instant| now.duration_since(*t) < UNCLAIMED_TTL;
        self.fds.retain(|_, (_, t)| fresh(t));
        self.discarded.retain(|_, t| fresh(t));
        self.lost.retain(|_, t| fresh(t));
    }

    fn arrived(&mut self, tag: u64, fd: OwnedFd) {
        let now = Instant::now();
        self.prune(now);
        if self.discarded.remove(&tag).is_none() {
            self.fds.insert(tag, (fd, now));
        }
    }
}

impl FdReceiver {
    /// Start reading `channel` on the current runtime.
    pub fn spawn(channel: OwnedFd) -> std::io::Result<FdReceiver> {
        crate::sockio::set_nonblocking(&channel)?;
        // SAFETY: `channel` is an OwnedFd moved into the AsyncFd, so the
        // descriptor stays open and unchanged for the AsyncFd's whole life.
        let afd =
            unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }.map_err(|e| e.into_parts().1)?;
        let rx = FdReceiver { table: Arc::default(), notify: Arc::new(Notify::new()) };
        let task_rx = rx.clone();
        tokio::spawn(async move {
            loop {
                let res = afd.async_io(Interest::READABLE, |fd| recv_one(fd.as_fd())).await;
                match res {
                    Ok(Received::Fd(tag, fd)) => {
                        if let Ok(mut t) = task_rx.table.lock() {
                            t.arrived(tag, fd);
                        }
                        task_rx.notify.notify_waiters();
                    }
                    Ok(Received::Lost(tag)) => {
                        if let Ok(mut t) = task_rx.table.lock() {
                            t.lost.insert(tag, Instant::now());
                        }
                        task_rx.notify.notify_waiters();
                    }
                    // Out of memory for the moment: try again shortly.
                    Err(e) if matches!(e.raw_os_error(), Some(nix::libc::ENOMEM | nix::libc::ENOBUFS)) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok(Received::Closed) | Err(_) => {
                        if let Ok(mut t) = task_rx.table.lock() {
                            t.closed = true;
                        }
                        task_rx.notify.notify_waiters();
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Wait for the descriptor tagged `tag`. On failure (timeout, lost,
    /// closed) the tag is discarded: a descriptor arriving later is dropped.
    pub async fn claim(&self, tag: u64, timeout: Duration) -> Result<OwnedFd, FdPassError> {
        let wait = async {
            loop {
                let notified = self.notify.notified();
                {
                    let mut t = self.table.lock().map_err(|_| FdPassError::Closed)?;
                    if let Some((fd, _)) = t.fds.remove(&tag) {
                        return Ok(fd);
                    }
                    if t.lost.remove(&tag).is_some() {
                        return Err(FdPassError::Lost(tag));
                    }
                    if t.closed {
                        return Err(FdPassError::Closed);
                    }
                }
                notified.await;
            }
        };
        let r = tokio::time::timeout(timeout, wait).await.unwrap_or(Err(FdPassError::Timeout(tag)));
        if r.is_err() {
            self.discard(tag);
        }
        r
    }

    /// Drop a descriptor that will never be claimed: now if it has arrived,
    /// on arrival otherwise.
    pub fn discard(&self, tag: u64) {
        if let Ok(mut t) = self.table.lock() {
            let now = Instant::now();
            t.prune(now);
            if t.fds.remove(&tag).is_none() && t.lost.remove(&tag).is_none() {
                t.discarded.insert(tag, now);
            }
        }
    }

    /// Descriptors received and not yet claimed (for tests and diagnostics).
    pub fn waiting(&self) -> usize {
        self.table.lock().map(|t| t.fds.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[tokio::test]
    async fn passes_tagged_descriptors() {
        let (a, b) = pair().unwrap();
        let rx = FdReceiver::spawn(b).unwrap();
        let path = std::env::temp_dir().join(format!("fdpass-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"hello").unwrap();
        let g = std::fs::File::open(&path).unwrap();
        send_blocking(a.as_fd_ref(), 7, std::os::fd::AsFd::as_fd(&g)).unwrap();
        send_blocking(a.as_fd_ref(), 9, std::os::fd::AsFd::as_fd(&f)).unwrap();
        let got = rx.claim(9, Duration::from_secs(5)).await.unwrap();
        let mut got7 = std::fs::File::from(rx.claim(7, Duration::from_secs(5)).await.unwrap());
        let mut s = String::new();
        got7.rewind().unwrap();
        got7.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        drop(got);
        drop(a);
        assert!(matches!(rx.claim(1, Duration::from_secs(5)).await, Err(FdPassError::Closed)));
        let _ = std::fs::remove_file(path);
    }

    /// A descriptor discarded before it arrives is dropped on arrival; one
    /// discarded after is dropped at once.
    #[tokio::test]
    async fn discarded_descriptors_are_dropped() {
        let (a, b) = pair().unwrap();
        let rx = FdReceiver::spawn(b).unwrap();
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        rx.discard(1);
        send_blocking(a.as_fd_ref(), 1, std::os::fd::AsFd::as_fd(&f)).unwrap();
        send_blocking(a.as_fd_ref(), 2, std::os::fd::AsFd::as_fd(&f)).unwrap();
        // Tag 2 arriving means tag 1, sent before it, was handled.
        let two = rx.claim(2, Duration::from_secs(5)).await.unwrap();
        drop(two);
        assert_eq!(rx.waiting(), 0, "the discarded descriptor was dropped on arrival");
        send_blocking(a.as_fd_ref(), 3, std::os::fd::AsFd::as_fd(&f)).unwrap();
        send_blocking(a.as_fd_ref(), 4, std::os::fd::AsFd::as_fd(&f)).unwrap();
        drop(rx.claim(4, Duration::from_secs(5)).await.unwrap());
        assert_eq!(rx.waiting(), 1);
        rx.discard(3);
        assert_eq!(rx.waiting(), 0);
        // A claim that times out discards its tag.
        assert!(matches!(rx.claim(5, Duration::from_millis(10)).await, Err(FdPassError::Timeout(5))));
        send_blocking(a.as_fd_ref(), 5, std::os::fd::AsFd::as_fd(&f)).unwrap();
        send_blocking(a.as_fd_ref(), 6, std::os::fd::AsFd::as_fd(&f)).unwrap();
        drop(rx.claim(6, Duration::from_secs(5)).await.unwrap());
        assert_eq!(rx.waiting(), 0);
    }

    trait AsFdRef {
        fn as_fd_ref(&self) -> BorrowedFd<'_>;
    }
    impl AsFdRef for OwnedFd {
        fn as_fd_ref(&self) -> BorrowedFd<'_> {
            std::os::fd::AsFd::as_fd(self)
        }
    }
}
