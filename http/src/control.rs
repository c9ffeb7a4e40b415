//! The control channel between the `serve-http` launcher and its HTTP
//! front: a `SOCK_SEQPACKET` pair, one JSON message per packet, at most one
//! descriptor attached (a session's socket, launcher → front).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Largest control message (the TLS certificate chain and key travel in one).
pub const MAX_MESSAGE: usize = 192 * 1024;

/// An access token as the front knows it: its id and the SHA-256 of its
/// value (the front never holds the token itself).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenDigest {
    pub id: String,
    pub sha256: [u8; 32],
}

/// Everything the front needs, sent once before it serves.
#[derive(Serialize, Deserialize)]
pub struct FrontSetup {
    pub tokens: Vec<TokenDigest>,
    /// PEM certificate chain and key; `None` serves plain HTTP.
    pub tls: Option<(String, String)>,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub max_sessions_per_token: u32,
    pub max_requests_per_token: u32,
    pub idle_timeout_secs: u64,
    pub max_body_bytes: usize,
    /// The listener is a Unix socket (peers are named `unix`).
    pub unix: bool,
}

#[derive(Serialize, Deserialize)]
pub enum ToFront {
    Setup(Box<FrontSetup>),
    /// The token file was re-read (SIGHUP): the complete new set.
    Tokens(Vec<TokenDigest>),
    /// A session tree started; its socket is attached.
    Spawned {
        req: u64,
        session: u64,
    },
    SpawnFailed {
        req: u64,
    },
    /// A session's processes are gone (reaped).
    Exited {
        session: u64,
    },
}

#[derive(Serialize, Deserialize)]
pub enum ToLauncher {
    /// Start a session tree for this principal.
    Spawn { req: u64, token_id: String, peer: String },
    /// The front closed the session's socket: reap it, and kill its process
    /// group if it has not exited in time: soon when its token was revoked
    /// (`revoked`), otherwise only after the long limit (it may be finishing
    /// background transfers, which outlive their client by design).
    End { session: u64, revoked: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("control channel closed")]
    Closed,
    #[error("malformed control message")]
    Malformed,
}

fn send_raw(raw: RawFd, bytes: &[u8], fd: Option<RawFd>, flags: MsgFlags) -> nix::Result<usize> {
    let iov = [IoSlice::new(bytes)];
    match fd {
        Some(fd) => {
            let fds = [fd];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(raw, &iov, &cmsg, flags | MsgFlags::MSG_NOSIGNAL, None)
        }
        None => sendmsg::<()>(raw, &iov, &[], flags | MsgFlags::MSG_NOSIGNAL, None),
    }
}

fn recv_raw(raw: RawFd, buf: &mut [u8], flags: MsgFlags) -> nix::Result<(usize, Option<OwnedFd>, bool)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(raw, &mut iov, Some(&mut space), flags | MsgFlags::MSG_CMSG_CLOEXEC)?;
    let truncated = msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    let mut got = None;
    if !msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: the kernel just installed this descriptor for
                    // us; nothing else owns it (extra ones are closed here).
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    if got.is_none() {
                        got = Some(owned);
                    }
                }
            }
        }
    }
    Ok((msg.bytes, got, truncated))
}

fn decode<T: for<'de> Deserialize<'de>>(n: usize, buf: &[u8], truncated: bool) -> Result<T, ControlError> {
    if n == 0 {
        return Err(ControlError::Closed);
    }
    if truncated {
        return Err(ControlError::Malformed);
    }
    serde_json::from_slice(buf.get(..n).ok_or(ControlError::Malformed)?).map_err(|_| ControlError::Malformed)
}

/// Blocking send (before a runtime exists).
pub fn send_blocking<T: Serialize>(fd: &OwnedFd, msg: &T, attach: Option<RawFd>) -> Result<(), ControlError> {
    let bytes = serde_json::to_vec(msg).map_err(|_| ControlError::Malformed)?;
    send_raw(fd.as_raw_fd(), &bytes, attach, MsgFlags::empty()).map_err(std::io::Error::from)?;
    Ok(())
}

/// Blocking receive (before a runtime exists).
pub fn recv_blocking<T: for<'de> Deserialize<'de>>(fd: &OwnedFd) -> Result<(T, Option<OwnedFd>), ControlError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, got, truncated) = recv_raw(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(std::io::Error::from)?;
    Ok((decode(n, &buf, truncated)?, got))
}

/// One end of the channel on a tokio runtime (the socket is made
/// non-blocking; it is ours alone).
pub struct Channel {
    fd: AsyncFd<OwnedFd>,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> std::io::Result<Channel> {
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so the
        // descriptor stays open and unchanged for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Channel { fd })
    }

    pub async fn send<T: Serialize>(&self, msg: &T, attach: Option<RawFd>) -> Result<(), ControlError> {
        let bytes = serde_json::to_vec(msg).map_err(|_| ControlError::Malformed)?;
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                send_raw(fd.get_ref().as_raw_fd(), &bytes, attach, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
            }) {
                Ok(r) => {
                    r?;
                    return Ok(());
                }
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn recv<T: for<'de> Deserialize<'de>>(&self) -> Result<(T, Option<OwnedFd>), ControlError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                recv_raw(fd.get_ref().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
            }) {
                Ok(r) => {
                    let (n, got, truncated) = r?;
                    return Ok((decode(n, &buf, truncated)?, got));
                }
                Err(_would_block) => continue,
            }
        }
    }
}
