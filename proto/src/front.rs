//! The control channel between the `serve-http` launcher and its HTTP
//! front: a `SOCK_SEQPACKET` pair ([`crate::fdpass::pair`]), one message per
//! packet, framed like every other IPC message (a `u32` length, then
//! `postcard`; see [`crate::frame`]), with at most one descriptor attached
//! (a session's socket, launcher → front). The descriptors travel through
//! the one SCM_RIGHTS codec, [`crate::fdpass::send_packet`] and
//! [`crate::fdpass::recv_packet`].
//!
//! The launcher sends [`ToFront`] and receives [`ToLauncher`]
//! ([`LauncherEnd`]); the front the other way round ([`FrontEnd`]).

use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::fdpass::{self, Packet};

/// Largest control message, length prefix included (the TLS certificate
/// chain and key travel in one).
pub const MAX_MESSAGE: usize = 192 * 1024;

/// An access token as the front knows it: its id and the SHA-256 of its
/// value (the front never holds the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenDigest {
    pub id: String,
    pub sha256: [u8; 32],
}

/// Everything the front needs, sent once before it serves. (No `Debug`: it
/// holds the TLS private key.)
#[derive(PartialEq, Eq, Serialize, Deserialize)]
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

/// Launcher → front.
#[derive(PartialEq, Eq, Serialize, Deserialize)]
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

/// Front → launcher.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToLauncher {
    /// Start a session tree for this principal.
    Spawn { req: u64, token_id: String, peer: String },
    /// The front closed the session's socket: reap it, and kill its process
    /// group if it has not exited in time: soon when its token was revoked
    /// (`revoked`), otherwise only after the long limit (it may be finishing
    /// background transfers, which outlive their client by design).
    End { session: u64, revoked: bool },
}

/// A message of this channel (one of the two directions).
pub trait ControlMessage: Serialize + DeserializeOwned + sealed::Sealed {}
impl ControlMessage for ToFront {}
impl ControlMessage for ToLauncher {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ToFront {}
    impl Sealed for super::ToLauncher {}
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

/// One message as the packet that carries it.
pub fn encode<T: ControlMessage>(msg: &T) -> Result<Vec<u8>, ControlError> {
    crate::frame::encode(msg).map_err(|_| ControlError::Malformed)
}

/// The message a received packet carries: an empty packet is the peer's
/// close, a cut one (bytes or descriptor) or a bad frame is malformed.
fn decode<T: ControlMessage>(packet: &Packet, buf: &[u8]) -> Result<T, ControlError> {
    if packet.len == 0 {
        return Err(ControlError::Closed);
    }
    if packet.truncated || packet.fd_lost {
        return Err(ControlError::Malformed);
    }
    let frame = buf.get(..packet.len).ok_or(ControlError::Malformed)?;
    crate::frame::decode(frame).map_err(|_| ControlError::Malformed)
}

/// Blocking send (before a runtime exists).
pub fn send_blocking<T: ControlMessage>(
    fd: &OwnedFd,
    msg: &T,
    attach: Option<BorrowedFd<'_>>,
) -> Result<(), ControlError> {
    let bytes = encode(msg)?;
    fdpass::send_packet(fd.as_fd(), &bytes, attach.as_slice(), false)?;
    Ok(())
}

/// Blocking receive (before a runtime exists).
pub fn recv_blocking<T: ControlMessage>(fd: &OwnedFd) -> Result<(T, Option<OwnedFd>), ControlError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let packet = fdpass::recv_packet(fd.as_fd(), &mut buf, 1, false)?;
    Ok((decode(&packet, &buf)?, packet.fds.into_iter().next()))
}

/// One end of the channel on a tokio runtime (the socket is made
/// non-blocking; it is ours alone): sends `Out`, receives `In`.
pub struct Channel<Out, In> {
    fd: AsyncFd<OwnedFd>,
    direction: PhantomData<fn(Out) -> In>,
}

/// The launcher's end.
pub type LauncherEnd = Channel<ToFront, ToLauncher>;
/// The front's end.
pub type FrontEnd = Channel<ToLauncher, ToFront>;

impl<Out: ControlMessage, In: ControlMessage> Channel<Out, In> {
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        crate::sockio::set_nonblocking(&fd)?;
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so the
        // descriptor stays open and unchanged for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Channel { fd, direction: PhantomData })
    }

    pub async fn send(&self, msg: &Out, attach: Option<BorrowedFd<'_>>) -> Result<(), ControlError> {
        let bytes = encode(msg)?;
        self.fd
            .async_io(Interest::WRITABLE, |fd| fdpass::send_packet(fd.as_fd(), &bytes, attach.as_slice(), true))
            .await?;
        Ok(())
    }

    pub async fn recv(&self) -> Result<(In, Option<OwnedFd>), ControlError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let packet =
            self.fd.async_io(Interest::READABLE, |fd| fdpass::recv_packet(fd.as_fd(), &mut buf, 1, true)).await?;
        Ok((decode(&packet, &buf)?, packet.fds.into_iter().next()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::Read;

    fn token(id: &str, b: u8) -> TokenDigest {
        TokenDigest { id: id.into(), sha256: [b; 32] }
    }

    fn setup() -> FrontSetup {
        FrontSetup {
            tokens: vec![token("alice", 1), token("bob", 0xff)],
            tls: Some(("-----BEGIN CERTIFICATE-----\nMII\n".into(), "-----BEGIN PRIVATE KEY-----\n".into())),
            allowed_hosts: vec!["localhost:8080".into(), "127.0.0.1:8080".into()],
            allowed_origins: vec!["http://localhost:8080".into()],
            max_sessions_per_token: 8,
            max_requests_per_token: 32,
            idle_timeout_secs: 1800,
            max_body_bytes: 8 * 1024 * 1024,
            unix: false,
        }
    }

    fn every_to_front() -> Vec<ToFront> {
        vec![
            ToFront::Setup(Box::new(setup())),
            ToFront::Setup(Box::new(FrontSetup { tls: None, unix: true, tokens: Vec::new(), ..setup() })),
            ToFront::Tokens(vec![token("carol", 7)]),
            ToFront::Tokens(Vec::new()),
            ToFront::Spawned { req: 1, session: u64::MAX },
            ToFront::SpawnFailed { req: 42 },
            ToFront::Exited { session: 3 },
        ]
    }

    fn every_to_launcher() -> Vec<ToLauncher> {
        vec![
            ToLauncher::Spawn { req: 9, token_id: "alice".into(), peer: "127.0.0.1:5555".into() },
            ToLauncher::Spawn { req: 10, token_id: "bob".into(), peer: "unix:uid=1000,pid=42".into() },
            ToLauncher::End { session: 5, revoked: true },
            ToLauncher::End { session: 6, revoked: false },
        ]
    }

    #[test]
    fn every_message_round_trips_blocking() {
        let (a, b) = fdpass::pair().unwrap();
        for msg in every_to_front() {
            send_blocking(&a, &msg, None).unwrap();
            let (back, fd) = recv_blocking::<ToFront>(&b).unwrap();
            assert!(back == msg);
            assert!(fd.is_none());
        }
        for msg in every_to_launcher() {
            send_blocking(&b, &msg, None).unwrap();
            let (back, fd) = recv_blocking::<ToLauncher>(&a).unwrap();
            assert_eq!(back, msg);
            assert!(fd.is_none());
        }
        drop(a);
        assert!(matches!(recv_blocking::<ToLauncher>(&b), Err(ControlError::Closed)));
    }

    #[tokio::test]
    async fn channels_carry_messages_and_a_descriptor() {
        let (a, b) = fdpass::pair().unwrap();
        let launcher = LauncherEnd::new(a).unwrap();
        let front = FrontEnd::new(b).unwrap();
        for msg in every_to_front() {
            launcher.send(&msg, None).await.unwrap();
            let (back, fd) = front.recv().await.unwrap();
            assert!(back == msg);
            assert!(fd.is_none());
        }
        for msg in every_to_launcher() {
            front.send(&msg, None).await.unwrap();
            let (back, fd) = launcher.recv().await.unwrap();
            assert_eq!(back, msg);
            assert!(fd.is_none());
        }
        // A session's socket travels with `Spawned`.
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        launcher.send(&ToFront::Spawned { req: 2, session: 7 }, Some(theirs.as_fd())).await.unwrap();
        drop(theirs);
        let (back, fd) = front.recv().await.unwrap();
        assert!(back == ToFront::Spawned { req: 2, session: 7 });
        let mut got = std::os::unix::net::UnixStream::from(fd.expect("the descriptor came along"));
        std::io::Write::write_all(&mut got, b"ping").unwrap();
        drop(got);
        let mut s = String::new();
        ours.read_to_string(&mut s).unwrap();
        assert_eq!(s, "ping");
        drop(launcher);
        assert!(matches!(front.recv().await, Err(ControlError::Closed)));
    }

    /// Not a frame, a frame whose length lies, and trailing bytes are all
    /// malformed; so is a packet larger than [`MAX_MESSAGE`].
    #[test]
    fn bad_packets_are_malformed() {
        let (a, b) = fdpass::pair().unwrap();
        let good = encode(&ToFront::SpawnFailed { req: 1 }).unwrap();
        let mut lying = good.clone();
        lying[0] += 1;
        let mut trailing = good.clone();
        trailing.push(0);
        trailing[0] += 1;
        let json = br#"{"SpawnFailed":{"req":1}}"#.to_vec();
        for bad in [vec![1u8, 2], lying, trailing, json, vec![0u8; MAX_MESSAGE + 1]] {
            fdpass::send_packet(a.as_fd(), &bad, &[], false).unwrap();
            assert!(matches!(recv_blocking::<ToFront>(&b), Err(ControlError::Malformed)));
        }
        fdpass::send_packet(a.as_fd(), &good, &[], false).unwrap();
        assert!(recv_blocking::<ToFront>(&b).unwrap().0 == ToFront::SpawnFailed { req: 1 });
    }
}
