//! A client connection whose writes make no progress for a while is closed.
//! What the front has queued for a client that does not read (a response it
//! never takes, an SSE stream it stopped reading) holds part of the budget
//! of the sessions' messages (`relay::RESPONSE_BUDGET_KIB`) until it is
//! written or dropped; without this, such a client could hold it for as
//! long as its connection stays open.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How long a write may wait for the client to take data.
pub const WRITE_STALL: Duration = Duration::from_secs(60);

pub struct Stalled<IO> {
    inner: IO,
    limit: Duration,
    /// Set while a write (or flush) waits; cleared by any progress.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO> Stalled<IO> {
    pub fn new(inner: IO, limit: Duration) -> Stalled<IO> {
        Stalled { inner, limit, deadline: None }
    }

    /// The write is blocked: fail it once it has been for `limit`.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no data for the write-stall limit",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.deadline = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.blocked(cx),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stalled<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stalled<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(r, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_the_client_does_not_take_fails_and_one_it_takes_goes_on() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut w = Stalled::new(ours, Duration::from_millis(100));
        // The peer reads slowly but steadily: every write makes progress.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 256];
            let mut got = 0;
            while got < 8 * 1024 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += theirs.read(&mut buf).await.unwrap();
            }
            theirs
        });
        w.write_all(&[7u8; 8 * 1024]).await.unwrap();
        let theirs = reader.await.unwrap();
        // Now it stops reading: the write that cannot go on fails.
        let err = w.write_all(&[7u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(theirs);
    }
}
