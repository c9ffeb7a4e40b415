//! The frames one process sends on one IPC socket, from any of its tasks.
//!
//! A sender with nothing ahead of it writes its frame itself, at once
//! ([`Outbox::send_now`]): no hand-over to a writer task, which would cost
//! the call a wake-up and a turn of the runtime before the peer hears of
//! it. Everything else is queued, in order, and written by the outbox's
//! flusher ([`Outbox::flush`], a task of the owner's) in one write per
//! batch: frames sent while others are in flight ([`Outbox::send`]), the
//! rest of a frame the socket had no room for, and everything behind them.
//! Order is kept: a frame is written directly only when nothing is queued
//! and the flusher is not writing.
//!
//! The first failed write breaks the outbox: every later send fails, and
//! the flusher returns the error (the owner then treats the connection as
//! lost).

use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

// The most one flusher write takes; the rest waits for the next (a bound
// on one write, not on the queue: a sender never waits).
use crate::frame::BATCH_BYTES;
use crate::sockio::SockWriter;

/// Frames to one socket from many tasks.
pub struct Outbox {
    state: Mutex<State>,
    /// Wakes the flusher: something is queued, or the outbox broke.
    wake: Notify,
}

struct State {
    /// The socket, except while the flusher is writing to it.
    writer: Option<SockWriter>,
    /// Bytes waiting for the flusher, whole frames but for a first one
    /// part of which was written directly.
    queue: Vec<u8>,
    /// Set at the first failed write; the error's kind is kept for the
    /// flusher to report.
    broken: Option<io::ErrorKind>,
}

/// The outbox broke (a write failed): nothing more can be sent.
#[derive(Debug, thiserror::Error)]
#[error("the IPC socket is broken")]
pub struct Broken;

impl Outbox {
    pub fn new(writer: SockWriter) -> Outbox {
        Outbox {
            state: Mutex::new(State { writer: Some(writer), queue: Vec::new(), broken: None }),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state whole (a push, a take,
        // a flag): a panic elsewhere cannot have torn it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send one encoded frame, written at once when nothing is ahead of
    /// it: what the socket takes now is sent, the rest queued for the
    /// flusher. For a frame that has no company (the only call in flight):
    /// with others in flight, [`Self::send`] lets the frames that are
    /// ready together go out in one write.
    pub fn send_now(&self, frame: Vec<u8>) -> Result<(), Broken> {
        let mut st = self.lock();
        if st.broken.is_some() {
            return Err(Broken);
        }
        if !st.queue.is_empty() {
            st.queue.extend_from_slice(&frame);
            return Ok(());
        }
        let Some(writer) = &st.writer else {
            // The flusher is writing: behind what it writes.
            st.queue = frame;
            return Ok(());
        };
        match writer.send_some(&frame) {
            Ok(n) if n == frame.len() => {
                drop(st);
                let len = frame.len();
                drop(frame);
                crate::alloc::after_large(len);
                return Ok(());
            }
            Ok(n) => st.queue.extend_from_slice(&frame[n..]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => st.queue = frame,
            Err(e) => {
                st.broken = Some(e.kind());
                drop(st);
                self.wake.notify_one();
                return Err(Broken);
            }
        }
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// Queue one encoded frame for the flusher, which writes every frame
    /// queued by then in one write.
    pub fn send(&self, frame: Vec<u8>) -> Result<(), Broken> {
        let mut st = self.lock();
        if st.broken.is_some() {
            return Err(Broken);
        }
        if st.queue.is_empty() {
            st.queue = frame;
        } else {
            st.queue.extend_from_slice(&frame);
        }
        drop(st);
        self.wake.notify_one();
        Ok(())
    }

    /// Write what is queued, as it is queued, until a write fails: the
    /// owner runs this as a task for the outbox's life. Returns the error
    /// that broke the outbox.
    pub async fn flush(&self) -> io::Error {
        loop {
            self.wake.notified().await;
            loop {
                let (mut writer, batch) = {
                    let mut st = self.lock();
                    if let Some(kind) = st.broken {
                        return kind.into();
                    }
                    if st.queue.is_empty() {
                        break;
                    }
                    let Some(writer) = st.writer.take() else {
                        // Only this task takes the writer, and it puts it
                        // back before it comes here again.
                        break;
                    };
                    let batch = if st.queue.len() <= BATCH_BYTES {
                        std::mem::take(&mut st.queue)
                    } else {
                        let rest = st.queue.split_off(BATCH_BYTES);
                        std::mem::replace(&mut st.queue, rest)
                    };
                    (writer, batch)
                };
                let written = writer.write_all(&batch).await;
                crate::alloc::after_large(batch.len());
                let mut st = self.lock();
                st.writer = Some(writer);
                if let Err(e) = written {
                    st.broken = Some(e.kind());
                    return e;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::sockio::split_one;
    use crate::sockio::tests::pair;

    /// The outbox's flusher, as its owner runs it.
    fn flusher(outbox: &Arc<Outbox>) -> tokio::task::JoinHandle<io::Error> {
        let o = outbox.clone();
        tokio::spawn(async move { o.flush().await })
    }

    /// A frame with nothing ahead of it is written by its sender, before
    /// any task runs; queued frames follow it in order, written by the
    /// flusher.
    #[tokio::test]
    async fn a_lone_frame_is_written_at_once_and_order_is_kept() {
        let (a, b) = pair();
        let (_ar, aw) = split_one(a).unwrap();
        let (mut br, _bw) = split_one(b).unwrap();
        let outbox = Arc::new(Outbox::new(aw));
        outbox.send_now(b"first".to_vec()).unwrap();
        let mut buf = [0u8; 5];
        br.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"first", "written without the flusher");
        outbox.send(b"-2".to_vec()).unwrap();
        outbox.send_now(b"-3".to_vec()).unwrap();
        outbox.send(b"-4".to_vec()).unwrap();
        let flusher = flusher(&outbox);
        let mut buf = [0u8; 6];
        br.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"-2-3-4", "a send_now behind queued frames waits its turn");
        flusher.abort();
    }

    /// Frames larger than the socket buffer, sent directly and queued
    /// while the flusher writes, all arrive whole and in order.
    #[tokio::test]
    async fn a_full_socket_queues_the_rest_in_order() {
        let (a, b) = pair();
        let (_ar, aw) = split_one(a).unwrap();
        let (mut br, _bw) = split_one(b).unwrap();
        let outbox = Arc::new(Outbox::new(aw));
        let flusher = flusher(&outbox);
        let frames: Vec<Vec<u8>> = (0..40u32).map(|i| vec![i as u8; 100_000 + i as usize]).collect();
        let expect: Vec<u8> = frames.concat();
        let sender = tokio::spawn({
            let o = outbox.clone();
            async move {
                for (i, f) in frames.into_iter().enumerate() {
                    if i % 2 == 0 {
                        o.send_now(f).unwrap()
                    } else {
                        o.send(f).unwrap()
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        let mut got = vec![0u8; expect.len()];
        br.read_exact(&mut got).await.unwrap();
        assert!(got == expect, "every byte, in order");
        sender.await.unwrap();
        flusher.abort();
    }

    /// A closed peer breaks the outbox: the send that finds it fails, so
    /// does every later one, and the flusher returns the error.
    #[tokio::test]
    async fn a_closed_peer_breaks_it() {
        let (a, b) = pair();
        let (_ar, aw) = split_one(a).unwrap();
        drop(b);
        let outbox = Outbox::new(aw);
        assert!(outbox.send_now(b"x".to_vec()).is_err());
        assert!(outbox.send(b"y".to_vec()).is_err());
        assert_eq!(outbox.flush().await.kind(), io::ErrorKind::BrokenPipe);
    }
}
