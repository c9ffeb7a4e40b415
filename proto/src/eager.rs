//! Starting a task at once, in the caller's turn.
//!
//! `tokio::spawn` only queues a task: it first runs once the caller's task
//! has yielded, after a turn of the scheduler. For a call whose first step
//! is to write a request (the supervisor's direct call, a worker's
//! request), that puts the scheduler between reading the input and writing
//! the request: the peer hears of the call later, and the process stays
//! awake longer before it sleeps. [`spawn_eager`] polls the future once
//! where it is called, so its first step runs now, and spawns it only if
//! it has more to do.
//!
//! That first poll is given a waker that does nothing. A future must work
//! when polled with another waker than the last (`Future::poll`: only the
//! most recent poll's waker is to be woken), and the task's first poll,
//! which always comes, registers the task's own: anything that became
//! ready in between (data, a message, a timer) is found then.

use std::future::Future;
use std::task::{Context, Waker};

/// Run `fut` up to its first wait now, then as a task of its own (spawned
/// only if it did not finish). Must be called within a tokio runtime.
/// Whether it goes on as a task (false: it finished in its first step).
pub fn spawn_eager<F>(fut: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    // Boxed once: the task holds the box, so the future (large, for a
    // call's whole path) is not moved again.
    let mut fut = Box::pin(fut);
    let mut cx = Context::from_waker(Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(fut);
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The future's first step runs before `spawn_eager` returns; what it
    /// waits for after that still wakes it (a message sent before the task
    /// first ran, and one after), and a future that finishes at once is
    /// not spawned.
    #[tokio::test]
    async fn the_first_step_runs_at_once_and_the_rest_as_a_task() {
        let steps = Arc::new(AtomicUsize::new(0));
        let (tx1, rx1) = tokio::sync::oneshot::channel::<()>();
        let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<usize>();
        let s = steps.clone();
        let goes_on = spawn_eager(async move {
            s.fetch_add(1, Ordering::SeqCst);
            rx1.await.unwrap();
            s.fetch_add(1, Ordering::SeqCst);
            rx2.await.unwrap();
            let _ = done_tx.send(s.fetch_add(1, Ordering::SeqCst) + 1);
        });
        assert_eq!(steps.load(Ordering::SeqCst), 1, "the first step ran in the caller's turn");
        assert!(goes_on, "it waits: a task of its own");
        tx1.send(()).unwrap();
        tokio::task::yield_now().await;
        tx2.send(()).unwrap();
        assert_eq!(done_rx.await.unwrap(), 3);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let goes_on = spawn_eager(async move {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(!goes_on);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "finished without a task");
    }
}
