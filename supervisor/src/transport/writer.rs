//! The outbound side: every message written to stdout, by rmcp's sends and
//! by the transport's own error replies. One complete line per write; the
//! first failed write ends the session; a reply that follows a progress
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
    /// The last message written was a progress notification.
    after_progress: AtomicBool,
}

impl Out {
    pub(super) fn new(output: Output, unread: Option<crate::stdio::Unread>) -> Out {
        Out {
            w: tokio::sync::Mutex::new(output),
            gone: AtomicBool::new(false),
            gone_notify: tokio::sync::Notify::new(),
            answered: tokio::sync::Notify::new(),
            unread,
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

    /// Write one message (a complete line). A failed write means stdout's
    /// reader is gone (or stdout is unusable): nothing more can be
    /// delivered, so the first failure is logged once and ends the session;
    /// later messages are discarded without another line.
    async fn send_line(&self, line: Vec<u8>) {
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        let len = line.len();
        let res = self.w.lock().await.write_all(line).await;
        snowluma_proto::alloc::after_large(len);
        if let Err(e) = res
            && !self.gone.swap(true, Ordering::AcqRel)
        {
            if crate::stdio::is_gone(&e) {
                tracing::error!(error = %e, "stdout was closed by the client; ending the session");
            } else {
                tracing::error!(error = %e, "cannot write to stdout; ending the session");
            }
            self.gone_notify.notify_one();
        }
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
    ) {
        line.push(b'\n');
        if let Some(mut marker) = marker {
            marker.push(b'\n');
            marker.append(&mut line);
            line = marker;
        }
        let is_reply = matches!(item, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_));
        let is_progress = matches!(
            item,
            JsonRpcMessage::Notification(n) if matches!(n.notification, rmcp::model::ServerNotification::ProgressNotification(_))
        );
        if is_reply && self.after_progress.swap(false, Ordering::AcqRel) {
            self.wait_read().await;
        }
        // A write failure is handled (logged once, session ended) by
        // `send_line`; telling rmcp as well would only log it again.
        self.send_line(line).await;
        if is_progress {
            self.after_progress.store(true, Ordering::Release);
        }
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
                    out.send_line(line).await;
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

/// A handle on whether stdout failed, kept across the session.
pub struct StdoutState(pub(super) Arc<Out>);

impl StdoutState {
    pub fn gone(&self) -> bool {
        self.0.is_gone()
    }
}
