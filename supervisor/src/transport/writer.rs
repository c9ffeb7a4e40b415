//! The outbound side: every message written to stdout, by rmcp's sends and
//! by the transport's own error replies. Messages are whole lines, written
//! in the order they were sent; the lines that become ready together (calls
//! answered in the same turn of the runtime) go out in one write. The first
//! failed write ends the session; a reply that follows a progress
//! notification waits (briefly) until the client has read the notification.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::RoleServer;
use rmcp::model::JsonRpcMessage;
use rmcp::service::TxJsonRpcMessage;
use serde_json::{Value, json};

use super::TransportError;
use super::fast::{SERVER_INFO_KEY, fast_tool_response};
use crate::stdio::Output;

/// Longest wait for the client to read a progress notification before the
/// reply that follows it is written.
const READ_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// The sending side, shared by rmcp's sends and our own error replies.
pub(super) struct Out {
    pub(super) w: tokio::sync::Mutex<Output>,
    /// Set at the first failed write: the reader of stdout is gone.
    pub(super) gone: AtomicBool,
    /// Wakes `receive` so that the session ends once stdout is gone.
    pub(super) gone_notify: tokio::sync::Notify,
    /// Signalled each time an accepted request is answered or cancelled.
    pub(super) answered: tokio::sync::Notify,
    /// How much of stdout the client has not read (sockets and pipes).
    unread: Option<crate::stdio::Unread>,
    /// Lines sent but not written yet, in the order they were sent; taken
    /// whole by the next sender to hold `w`.
    pending: std::sync::Mutex<Vec<Line>>,
    /// The last message written was a progress notification (changed only
    /// by the holder of `w`).
    after_progress: AtomicBool,
}

/// What a line is, for the one ordering rule a write must keep.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    /// A progress notification: a reply written after it waits until the
    /// client has read it.
    Progress,
    /// A response or an error response from rmcp.
    Reply,
    /// Anything else; leaves the progress rule as it was.
    Other,
}

impl Kind {
    /// Whether the last message written is a progress notification once a
    /// line of this kind is written after `after_progress`.
    fn after(self, after_progress: bool) -> bool {
        match self {
            Kind::Progress => true,
            Kind::Reply => false,
            Kind::Other => after_progress,
        }
    }
}

/// Whether other answers may be ready to share a line's write: only then
/// does a sender let the runtime run them before it writes (one more turn
/// of the reactor, which a lone call would pay for nothing).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Company {
    /// No other call is in flight.
    Alone,
    /// Other calls are in flight; their answers may be ready now.
    Expected,
}

/// One complete message, newline included.
struct Line {
    bytes: Vec<u8>,
    kind: Kind,
}

impl Out {
    pub(super) fn new(output: Output, unread: Option<crate::stdio::Unread>) -> Out {
        Out {
            w: tokio::sync::Mutex::new(output),
            gone: AtomicBool::new(false),
            gone_notify: tokio::sync::Notify::new(),
            answered: tokio::sync::Notify::new(),
            unread,
            pending: std::sync::Mutex::new(Vec::new()),
            after_progress: AtomicBool::new(false),
        }
    }

    pub(super) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Wait (at most [`READ_WAIT`]) until the client has read everything
    /// written so far. Used between a progress notification and the reply
    /// that follows it: the TypeScript SDK handles notifications in a
    /// microtask but responses at once, so when both arrive in one read it
    /// meets the notification after the reply and reports an unknown
    /// progress token (the final update, which the spec sends just before
    /// a successful result, is then lost).
    async fn wait_read(&self) {
        let Some(unread) = &self.unread else { return };
        let deadline = tokio::time::Instant::now() + READ_WAIT;
        while unread.bytes().is_some_and(|n| n > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Write one message (a complete line); returns once it is written (or
    /// cannot be). The line joins the pending ones; with company expected
    /// the runtime first runs the other tasks that are ready (whose answers
    /// may join it); whoever then holds `w` first writes every pending line
    /// at once; a sender that
    /// finds nothing pending had its line written by an earlier holder,
    /// which released `w` only after writing it.
    ///
    /// A failed write means stdout's reader is gone (or stdout is unusable):
    /// nothing more can be delivered, so the first failure is logged once
    /// and ends the session; later messages are discarded without another
    /// line.
    async fn send_line(&self, bytes: Vec<u8>, kind: Kind, company: Company) {
        if self.is_gone() {
            return;
        }
        lock(&self.pending).push(Line { bytes, kind });
        if company == Company::Expected {
            tokio::task::yield_now().await;
        }
        self.write_pending().await;
    }

    /// Write every pending line, in one write but where the progress rule
    /// splits it. Also the session's last act ([`super::LineTransport`]'s
    /// `close`): a send whose future was dropped after its line was queued
    /// still has that line written.
    pub(super) async fn write_pending(&self) {
        let mut w = self.w.lock().await;
        let mut lines = std::mem::take(&mut *lock(&self.pending));
        if lines.is_empty() {
            return;
        }
        let mut after_progress = self.after_progress.load(Ordering::Acquire);
        // One line that the progress rule does not hold back (a lone
        // call's answer): written as it is, without a batch to copy it into.
        if let [line] = &lines[..]
            && !(line.kind == Kind::Reply && after_progress)
        {
            after_progress = line.kind.after(after_progress);
            let Some(line) = lines.pop() else { return };
            // The emptied list is kept for the next line (no allocation
            // per line).
            {
                let mut pending = lock(&self.pending);
                if pending.capacity() == 0 {
                    *pending = lines;
                }
            }
            if self.write(&mut w, line.bytes).await {
                self.after_progress.store(after_progress, Ordering::Release);
            }
            return;
        }
        let mut batch = Vec::with_capacity(lines.iter().map(|l| l.bytes.len()).sum());
        for line in lines {
            if line.kind == Kind::Reply && after_progress {
                // The client reads the notification before the reply.
                if !batch.is_empty() && !self.write(&mut w, std::mem::take(&mut batch)).await {
                    return;
                }
                self.wait_read().await;
            }
            after_progress = line.kind.after(after_progress);
            batch.extend_from_slice(&line.bytes);
        }
        if self.write(&mut w, batch).await {
            self.after_progress.store(after_progress, Ordering::Release);
        }
    }

    /// One write of whole lines; false (and the session ended) if it failed
    /// or stdout was already gone.
    async fn write(&self, w: &mut Output, batch: Vec<u8>) -> bool {
        if self.is_gone() {
            return false;
        }
        let len = batch.len();
        let res = w.write_all(batch).await;
        snowluma_proto::alloc::after_large(len);
        let Err(e) = res else { return true };
        if !self.gone.swap(true, Ordering::AcqRel) {
            if crate::stdio::is_gone(&e) {
                tracing::error!(error = %e, "stdout was closed by the client; ending the session");
            } else {
                tracing::error!(error = %e, "cannot write to stdout; ending the session");
            }
            self.gone_notify.notify_one();
        }
        false
    }

    /// Write one of rmcp's messages, already encoded as `line` (without its
    /// newline), after `marker` (a line of its own, in the same write). A
    /// reply that follows a progress notification first lets the client
    /// read the notification.
    pub(super) async fn deliver(
        &self,
        item: &TxJsonRpcMessage<RoleServer>,
        marker: Option<Vec<u8>>,
        mut line: Vec<u8>,
        company: Company,
    ) {
        line.push(b'\n');
        if let Some(mut marker) = marker {
            marker.push(b'\n');
            marker.append(&mut line);
            line = marker;
        }
        let kind = match item {
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => Kind::Reply,
            JsonRpcMessage::Notification(n)
                if matches!(n.notification, rmcp::model::ServerNotification::ProgressNotification(_)) =>
            {
                Kind::Progress
            }
            _ => Kind::Other,
        };
        // A write failure is handled (logged once, session ended) by
        // `send_line`; telling rmcp as well would only log it again.
        self.send_line(line, kind, company).await;
        self.answered.notify_one();
    }

    /// Write the answer to a request, already encoded as `line` (without
    /// its newline): [`Self::deliver`] for a response built by the
    /// transport itself (a direct call's, `direct.rs`).
    pub(super) async fn deliver_answer(&self, mut line: Vec<u8>, company: Company) {
        line.push(b'\n');
        self.send_line(line, Kind::Reply, company).await;
        self.answered.notify_one();
    }

    /// Queue an error response. Written by its own task so that a dropped
    /// `receive` future can never leave half a message on stdout.
    pub(super) fn reply_error(self: &Arc<Self>, id: Value, code: i64, message: String) {
        let v = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let out = self.clone();
        tokio::spawn(async move {
            match serde_json::to_vec(&v) {
                Ok(mut line) => {
                    line.push(b'\n');
                    out.send_line(line, Kind::Other, Company::Alone).await;
                }
                Err(e) => tracing::warn!(error = %e, "cannot serialize an error response"),
            }
        });
    }
}

/// One of rmcp's messages as a line of JSON (without the newline); for a
/// response to a modern request, with `serverInfo` added to `_meta`.
pub(super) fn encode(
    item: &TxJsonRpcMessage<RoleServer>,
    modern: bool,
    server_info: &Value,
) -> Result<Vec<u8>, TransportError> {
    let fast = match item {
        JsonRpcMessage::Response(r) => fast_tool_response(r, modern.then_some(server_info)),
        _ => None,
    };
    Ok(if let Some(line) = fast {
        line
    } else if modern {
        // Only modern results need rewriting: add serverInfo to `_meta`.
        let mut v = serde_json::to_value(item)?;
        if let Some(Value::Object(result)) = v.get_mut("result")
            && let Value::Object(m) = result.entry("_meta").or_insert_with(|| json!({}))
        {
            m.insert(SERVER_INFO_KEY.into(), Value::clone(server_info));
        }
        serde_json::to_vec(&v)?
    } else {
        serde_json::to_vec(item)?
    })
}

/// The pending lines, even if a sender panicked while holding them (a
/// `Vec` push or take leaves no broken state).
fn lock(m: &std::sync::Mutex<Vec<Line>>) -> std::sync::MutexGuard<'_, Vec<Line>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle on whether stdout failed, kept across the session.
pub struct StdoutState(pub(super) Arc<Out>);

impl StdoutState {
    pub fn gone(&self) -> bool {
        self.0.is_gone()
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    use super::*;

    /// A stdout that records each write it is given, or fails every one.
    #[derive(Clone, Default)]
    struct Record {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        attempts: Arc<Mutex<usize>>,
        fail: bool,
    }

    impl Record {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.writes.lock().unwrap().clone()
        }
        fn attempts(&self) -> usize {
            *self.attempts.lock().unwrap()
        }
        fn out(&self) -> Arc<Out> {
            Arc::new(Out::new(Output::Async(Box::new(self.clone())), None))
        }
    }

    impl tokio::io::AsyncWrite for Record {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            *self.attempts.lock().unwrap() += 1;
            if self.fail {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            self.writes.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn line(n: usize) -> Vec<u8> {
        format!("{{\"n\":{n}}}\n").into_bytes()
    }

    async fn send_together(out: &Arc<Out>, lines: Vec<(Vec<u8>, Kind)>) {
        futures::future::join_all(lines.into_iter().map(|(l, kind)| out.send_line(l, kind, Company::Expected))).await;
    }

    #[tokio::test]
    async fn lines_sent_together_go_out_in_one_write_in_their_order() {
        let r = Record::default();
        let out = r.out();
        send_together(&out, (0..8).map(|n| (line(n), Kind::Reply)).collect()).await;
        assert_eq!(r.writes(), vec![(0..8).flat_map(line).collect::<Vec<u8>>()]);
    }

    #[tokio::test]
    async fn answers_from_separate_tasks_are_written_whole_and_in_the_order_sent() {
        let r = Record::default();
        let out = r.out();
        let tasks: Vec<_> = (0..8)
            .map(|n| {
                let out = out.clone();
                tokio::spawn(async move { out.send_line(line(n), Kind::Reply, Company::Expected).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let writes = r.writes();
        assert!(writes.len() <= 8, "{} writes for 8 lines", writes.len());
        assert!(writes.iter().all(|w| w.ends_with(b"\n")), "a write ended inside a line");
        assert_eq!(writes.concat(), (0..8).flat_map(line).collect::<Vec<u8>>());
    }

    #[tokio::test]
    async fn a_line_sent_alone_does_not_wait_for_company() {
        let r = Record::default();
        let out = r.out();
        let sends = (0..3).map(|n| out.send_line(line(n), Kind::Reply, Company::Alone));
        futures::future::join_all(sends).await;
        assert_eq!(r.writes(), vec![line(0), line(1), line(2)]);
    }

    #[tokio::test]
    async fn a_send_returns_once_its_line_is_written() {
        let r = Record::default();
        let out = r.out();
        out.send_line(line(0), Kind::Reply, Company::Alone).await;
        assert_eq!(r.writes(), vec![line(0)]);
        out.send_line(line(1), Kind::Other, Company::Alone).await;
        assert_eq!(r.writes(), vec![line(0), line(1)]);
    }

    #[tokio::test]
    async fn a_reply_after_a_progress_notification_is_not_in_the_notification_s_write() {
        let r = Record::default();
        let out = r.out();
        let (p, a, o, b) = (line(0), line(1), line(2), line(3));
        send_together(
            &out,
            vec![
                (p.clone(), Kind::Progress),
                (a.clone(), Kind::Reply),
                (o.clone(), Kind::Other),
                (b.clone(), Kind::Reply),
            ],
        )
        .await;
        // The progress rule splits the batch before the first reply only.
        assert_eq!(r.writes(), vec![p, [a, o, b].concat()]);
        assert!(!out.after_progress.load(Ordering::Acquire));

        // A progress notification last in a write is remembered for the next.
        send_together(&out, vec![(line(4), Kind::Other), (line(5), Kind::Progress)]).await;
        assert!(out.after_progress.load(Ordering::Acquire));
        out.send_line(line(6), Kind::Reply, Company::Alone).await;
        assert!(!out.after_progress.load(Ordering::Acquire));
        assert_eq!(r.writes().concat(), (0..7).flat_map(line).collect::<Vec<u8>>());
    }

    #[tokio::test]
    async fn a_line_whose_send_was_dropped_is_still_written_at_the_end() {
        let r = Record::default();
        let out = r.out();
        // Dropped at its yield: the line is queued but not written.
        let mut send = Box::pin(out.send_line(line(0), Kind::Reply, Company::Expected));
        assert!(futures::poll!(send.as_mut()).is_pending());
        drop(send);
        assert!(r.writes().is_empty());
        out.write_pending().await;
        assert_eq!(r.writes(), vec![line(0)]);
    }

    #[tokio::test]
    async fn a_failed_write_ends_the_session_and_nothing_more_is_tried() {
        let r = Record { fail: true, ..Record::default() };
        let out = r.out();
        send_together(&out, (0..3).map(|n| (line(n), Kind::Reply)).collect()).await;
        assert!(out.is_gone());
        assert_eq!(r.attempts(), 1, "the three lines were one write");
        out.send_line(line(3), Kind::Reply, Company::Alone).await;
        assert_eq!(r.attempts(), 1, "a write was tried after stdout was gone");
    }
}
