//! Event streams: a request's messages (or a legacy session's GET stream)
//! as `text/event-stream`, with keepalive comments while nothing comes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc::UnboundedReceiver;

use super::limits::Guard;
use super::responses::Body;
use crate::relay::{Kind, Outgoing};

/// A comment goes on a stream that has carried nothing for this long.
const KEEPALIVE: Duration = Duration::from_secs(15);

struct SseState {
    first: Option<Outgoing>,
    rx: UnboundedReceiver<Outgoing>,
    guard: Guard,
    /// The frames of the message being sent: each message is its event
    /// prefix, its pieces (as the session wrote them) and the blank line.
    queue: VecDeque<Bytes>,
}

pub(super) fn sse(first: Option<Outgoing>, rx: UnboundedReceiver<Outgoing>, guard: Guard) -> Response<Body> {
    let start = SseState { first, rx, guard, queue: VecDeque::new() };
    let stream = futures::stream::unfold(start, |mut st| async move {
        // Bounded: each turn yields a frame, or queues one message's frames.
        loop {
            if let Some(b) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Frame::data(b)), st));
            }
            if st.guard.done {
                return None;
            }
            let next = match st.first.take() {
                Some(m) => Some(m),
                None => tokio::select! {
                    m = st.rx.recv() => m,
                    _ = tokio::time::sleep(KEEPALIVE) => {
                        return Some((Ok(Frame::data(Bytes::from_static(b": keepalive\n\n"))), st));
                    }
                },
            };
            match next {
                // The tree ended without answering: nothing to cancel.
                None => {
                    st.guard.done = true;
                    drop(st);
                    return None;
                }
                Some(msg) => {
                    if msg.kind != Kind::Other {
                        st.guard.done = true;
                    }
                    st.queue.push_back(Bytes::from_static(b"event: message\ndata: "));
                    st.queue.extend(msg.pieces);
                    st.queue.push_back(Bytes::from_static(b"\n\n"));
                }
            }
        }
    });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
