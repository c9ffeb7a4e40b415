//! The spawner's protocol: the supervisor asks the spawner (a process forked
//! from it before either confines itself) to start and stop workers.
//!
//! A `SOCK_SEQPACKET` pair ([`crate::fdpass::pair`]), one message per
//! packet, each packet one frame as on the worker sockets ([`crate::frame`]:
//! a `u32` length, then `postcard`). The supervisor sends
//! [`ToSpawner::Spawn`] with the worker's descriptors attached (SCM_RIGHTS,
//! in the order of [`SpawnRequest::targets`]) and [`ToSpawner::Kill`]; the
//! spawner answers [`FromSpawner::Spawned`] / [`FromSpawner::SpawnFailed`]
//! and reports every exit with [`FromSpawner::Exited`]. Descriptors travel
//! through the workspace's one SCM_RIGHTS codec ([`crate::fdpass`]).

use std::os::fd::{BorrowedFd, OwnedFd};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Role;
use crate::fdpass;
use crate::frame::{self, FrameError};

/// Most descriptors one spawn carries (IPC socket, two directories, a channel).
pub const MAX_SPAWN_FDS: usize = fdpass::MAX_PACKET_FDS;
/// Largest packet of the protocol.
pub const MAX_PACKET_BYTES: usize = 8 * 1024;

/// Start a worker of `role` with the attached descriptors at `targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The supervisor's number for this request, echoed in the answer.
    pub req: u64,
    pub role: Role,
    pub log_filter: String,
    /// The worker's grants on its command line (`snowluma_sandbox::Grants`).
    pub grant_args: Vec<String>,
    /// Where each attached descriptor goes in the worker, in order.
    pub targets: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToSpawner {
    Spawn(SpawnRequest),
    Kill { pid: i32 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromSpawner {
    Spawned { req: u64, pid: i32 },
    SpawnFailed { req: u64, error: String },
    Exited { pid: i32, code: Option<i32>, signal: Option<i32> },
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnProtoError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("a packet is not one whole frame")]
    Malformed,
}

/// Send `msg` as one packet with `fds` attached.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<(), SpawnProtoError> {
    let frame = frame::encode(msg)?;
    if frame.len() > MAX_PACKET_BYTES {
        return Err(FrameError::TooLarge(frame.len()).into());
    }
    fdpass::send_packet(sock, &frame, fds, false)?;
    Ok(())
}

/// Receive one message and its descriptors; `None` when the peer closed.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> Result<Option<(T, Vec<OwnedFd>)>, SpawnProtoError> {
    let mut buf = vec![0u8; MAX_PACKET_BYTES];
    let p = fdpass::recv_packet(sock, &mut buf, MAX_SPAWN_FDS, false)?;
    if p.len == 0 && p.fds.is_empty() {
        return Ok(None);
    }
    if p.truncated || p.fd_lost {
        return Err(SpawnProtoError::Malformed);
    }
    let (len, body) = buf[..p.len].split_at_checked(4).ok_or(SpawnProtoError::Malformed)?;
    let mut prefix = [0u8; 4];
    prefix.copy_from_slice(len);
    if u32::from_le_bytes(prefix) as usize != body.len() {
        return Err(SpawnProtoError::Malformed);
    }
    let msg = postcard::from_bytes(body).map_err(FrameError::from)?;
    Ok(Some((msg, p.fds)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_descriptors_round_trip() {
        let (a, b) = fdpass::pair().unwrap();
        let msg = ToSpawner::Spawn(SpawnRequest {
            req: 3,
            role: Role::Files,
            log_filter: "warn".into(),
            grant_args: vec!["unconfined-ok".into()],
            targets: vec![3, 5],
        });
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        send(a.as_fd(), &msg, &[f.as_fd(), f.as_fd()]).unwrap();
        let (back, fds) = recv::<ToSpawner>(b.as_fd()).unwrap().unwrap();
        assert_eq!(back, msg);
        assert_eq!(fds.len(), 2);
        send(b.as_fd(), &FromSpawner::Exited { pid: 9, code: None, signal: Some(9) }, &[]).unwrap();
        let (back, fds) = recv::<FromSpawner>(a.as_fd()).unwrap().unwrap();
        assert_eq!(back, FromSpawner::Exited { pid: 9, code: None, signal: Some(9) });
        assert!(fds.is_empty());
        drop(a);
        assert!(recv::<FromSpawner>(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_packet_that_is_not_one_frame_is_refused() {
        let (a, b) = fdpass::pair().unwrap();
        fdpass::send_packet(a.as_fd(), &[9, 0, 0, 0, 1], &[], false).unwrap();
        assert!(matches!(recv::<FromSpawner>(b.as_fd()), Err(SpawnProtoError::Malformed)));
    }
}
