//! The fake's event WebSocket, imitating SnowLuma's forward WebSocket server
//! (`shared/reference/snowluma-upstream-notes.md` §3.5):
//!
//! * optional token: `Authorization: Bearer <token>`; a bad or missing token
//!   is accepted at the HTTP level, then closed with code 1008 `invalid
//!   access token`;
//! * on connect, the bootstrap meta frames lifecycle `connect`, lifecycle
//!   `enable` and a `heartbeat`;
//! * tests inject events ([`FakeEvents::send`]), raw frames
//!   ([`FakeEvents::send_text`], [`FakeEvents::send_binary`]) and server-side
//!   closes ([`FakeEvents::close_all`]), and count connections.
//!
//! Every text or binary message a client sends is recorded
//! ([`FakeEvents::received`]): an event client must never send one.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

enum Cmd {
    Text(String),
    Binary(Vec<u8>),
    Close,
}

#[derive(Default)]
struct EvState {
    /// Senders of the open, authenticated connections.
    open: Vec<(u64, mpsc::UnboundedSender<Cmd>)>,
    next: u64,
    accepted: usize,
    rejected: usize,
    closed: usize,
    received: Vec<String>,
    authorization: Vec<Option<String>>,
    /// [`FakeEvents::interop_preset`]: inject events by itself on every
    /// connection, one per interval after the bootstrap frames, at most this many.
    auto: Option<(std::time::Duration, usize)>,
    /// Events the automatic injection sent, over all connections.
    auto_sent: usize,
}

struct EvShared {
    token: Option<String>,
    self_id: i64,
    state: Mutex<EvState>,
}

impl EvShared {
    fn lock(&self) -> MutexGuard<'_, EvState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running fake event WebSocket on 127.0.0.1.
#[derive(Clone)]
pub struct FakeEvents {
    shared: Arc<EvShared>,
    addr: SocketAddr,
    _accept: Arc<crate::AcceptLoop>,
}

impl FakeEvents {
    /// Bind an ephemeral port; events carry `self_id` in their bootstrap frames.
    pub async fn start(token: Option<String>, self_id: i64) -> std::io::Result<FakeEvents> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(EvShared { token, self_id, state: Mutex::default() });
        let task = tokio::spawn(accept_loop(shared.clone(), listener));
        Ok(FakeEvents { shared, addr, _accept: Arc::new(crate::AcceptLoop(task)) })
    }

    /// `ws://127.0.0.1:<port>/event`, the value for `SNOWLUMA_MCP_EVENTS_URL`.
    pub fn url(&self) -> String {
        format!("ws://{}/event", self.addr)
    }

    /// Connections that completed the WebSocket handshake with a good token.
    pub fn accepted(&self) -> usize {
        self.shared.lock().accepted
    }

    /// Connections closed with 1008 for a bad token.
    pub fn rejected(&self) -> usize {
        self.shared.lock().rejected
    }

    /// Authenticated connections open now.
    pub fn open(&self) -> usize {
        self.shared.lock().open.len()
    }

    /// Authenticated connections that have ended.
    pub fn closed(&self) -> usize {
        self.shared.lock().closed
    }

    /// Data messages clients sent (an event client sends none).
    pub fn received(&self) -> Vec<String> {
        self.shared.lock().received.clone()
    }

    /// The `Authorization` header of every handshake, in order.
    pub fn authorization(&self) -> Vec<Option<String>> {
        self.shared.lock().authorization.clone()
    }

    fn broadcast(&self, make: impl Fn() -> Cmd) -> usize {
        let st = self.shared.lock();
        st.open.iter().filter(|(_, tx)| tx.send(make()).is_ok()).count()
    }

    /// Send `event` as a text frame to every open connection; how many got it.
    pub fn send(&self, event: &Value) -> usize {
        let text = event.to_string();
        self.broadcast(|| Cmd::Text(text.clone()))
    }

    pub fn send_text(&self, text: &str) -> usize {
        self.broadcast(|| Cmd::Text(text.to_owned()))
    }

    pub fn send_binary(&self, bytes: &[u8]) -> usize {
        self.broadcast(|| Cmd::Binary(bytes.to_vec()))
    }

    /// Close every open connection from the server side (code 1000).
    pub fn close_all(&self) -> usize {
        self.broadcast(|| Cmd::Close)
    }

    pub fn self_id(&self) -> i64 {
        self.shared.self_id
    }

    /// The set-up the interoperability clients (`tests/interop/`) expect of
    /// the event WebSocket: every authenticated connection, once its
    /// bootstrap frames are sent (SnowLuma's lifecycle `enable`), gets a
    /// group message of `self_id` ([`interop_event`]) every
    /// [`INTEROP_EVENT_INTERVAL`], at most [`INTEROP_EVENT_COUNT`], with no
    /// test driving it: the clients run as separate processes.
    pub fn interop_preset(&self) {
        self.shared.lock().auto = Some((INTEROP_EVENT_INTERVAL, INTEROP_EVENT_COUNT));
    }

    /// Events the automatic injection of [`FakeEvents::interop_preset`] sent.
    pub fn auto_sent(&self) -> usize {
        self.shared.lock().auto_sent
    }
}

/// The account of the fake's `get_login_info`, which the interop events carry.
pub const INTEROP_SELF_ID: i64 = 10001;
/// The interval of [`FakeEvents::interop_preset`]'s events.
pub const INTEROP_EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);
/// At most this many per connection (below a resource's 256-event limit).
pub const INTEROP_EVENT_COUNT: usize = 200;
/// The group and user of [`FakeEvents::interop_preset`]'s events.
pub const INTEROP_GROUP_ID: i64 = 20001;
pub const INTEROP_USER_ID: i64 = 30001;

/// The `n`th event of [`FakeEvents::interop_preset`]: a group message whose
/// text is `interop event <n>`.
pub fn interop_event(self_id: i64, n: usize) -> Value {
    group_message(self_id, INTEROP_GROUP_ID, INTEROP_USER_ID, &format!("interop event {n}"))
}

/// A group message event of `self_id`.
pub fn group_message(self_id: i64, group_id: i64, user_id: i64, text: &str) -> Value {
    json!({
        "time": 1_700_000_000, "self_id": self_id, "post_type": "message", "message_type": "group",
        "sub_type": "normal", "message_id": 1, "group_id": group_id, "user_id": user_id,
        "message": [{"type": "text", "data": {"text": text}}], "raw_message": text, "font": 0,
        "sender": {"user_id": user_id, "nickname": "n"}
    })
}

/// A private message event of `self_id`.
pub fn private_message(self_id: i64, user_id: i64, text: &str) -> Value {
    json!({
        "time": 1_700_000_000, "self_id": self_id, "post_type": "message", "message_type": "private",
        "sub_type": "friend", "message_id": 2, "user_id": user_id,
        "message": [{"type": "text", "data": {"text": text}}], "raw_message": text, "font": 0,
        "sender": {"user_id": user_id, "nickname": "n"}
    })
}

fn meta(self_id: i64, kind: &str, sub: Option<&str>) -> String {
    let mut v = json!({"time": 1_700_000_000, "self_id": self_id, "post_type": "meta_event", "meta_event_type": kind,
        "status": {"online": true, "good": true}});
    match sub {
        Some(s) => v["sub_type"] = json!(s),
        None => v["interval"] = json!(30000),
    }
    v.to_string()
}

async fn accept_loop(shared: Arc<EvShared>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        tokio::spawn(serve(shared.clone(), stream));
    }
}

// The handshake callback's error type is tungstenite's, not ours.
#[allow(clippy::result_large_err)]
async fn serve(shared: Arc<EvShared>, stream: tokio::net::TcpStream) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tx = Some(tx);
    let mut registered: Option<u64> = None;
    // The connection is registered before the handshake's response is
    // sent, so anything a test injects once the client is connected reaches it.
    let callback = |req: &Request, resp: Response| {
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let good = match &shared.token {
            None => true,
            Some(t) => auth.as_deref() == Some(format!("Bearer {t}").as_str()),
        };
        let mut st = shared.lock();
        st.authorization.push(auth);
        if good && let Some(tx) = tx.take() {
            st.accepted += 1;
            st.next += 1;
            let id = st.next;
            st.open.push((id, tx));
            registered = Some(id);
        }
        Ok(resp)
    };
    let ws = tokio_tungstenite::accept_hdr_async(stream, callback).await;
    let Ok(mut ws) = ws else {
        if let Some(id) = registered {
            let mut st = shared.lock();
            st.open.retain(|(i, _)| *i != id);
            st.closed += 1;
        }
        return;
    };
    let Some(id) = registered else {
        shared.lock().rejected += 1;
        let frame = CloseFrame { code: CloseCode::Policy, reason: "invalid access token".into() };
        let _ = ws.close(Some(frame)).await;
        return;
    };
    let sid = shared.self_id;
    for m in
        [meta(sid, "lifecycle", Some("connect")), meta(sid, "lifecycle", Some("enable")), meta(sid, "heartbeat", None)]
    {
        if ws.send(Message::Text(m.into())).await.is_err() {
            break;
        }
    }
    let auto = shared.lock().auto;
    let (interval, limit) = auto.unwrap_or((std::time::Duration::from_secs(3600), 0));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let mut auto_sent = 0usize;
    loop {
        tokio::select! {
            _ = ticker.tick(), if auto_sent < limit => {
                auto_sent += 1;
                let text = interop_event(sid, auto_sent).to_string();
                if ws.send(Message::Text(text.into())).await.is_err() {
                    break;
                }
                shared.lock().auto_sent += 1;
            }
            cmd = rx.recv() => {
                let r = match cmd {
                    Some(Cmd::Text(t)) => ws.send(Message::Text(t.into())).await,
                    Some(Cmd::Binary(b)) => ws.send(Message::Binary(b.into())).await,
                    Some(Cmd::Close) | None => {
                        let frame = CloseFrame { code: CloseCode::Normal, reason: "server closing".into() };
                        let _ = ws.close(Some(frame)).await;
                        // Wait (briefly) for the client's close reply.
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                            while let Some(Ok(_)) = ws.next().await {}
                        }).await;
                        break;
                    }
                };
                if r.is_err() {
                    break;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(t))) => shared.lock().received.push(t.as_str().to_owned()),
                Some(Ok(Message::Binary(b))) => shared.lock().received.push(String::from_utf8_lossy(&b).into_owned()),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let mut st = shared.lock();
    st.open.retain(|(i, _)| *i != id);
    st.closed += 1;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    async fn connect(
        ev: &FakeEvents,
        token: Option<&str>,
    ) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
        let mut req = ev.url().into_client_request().unwrap();
        if let Some(t) = token {
            req.headers_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        tokio_tungstenite::client_async(req, tokio::net::TcpStream::connect(ev.addr).await.unwrap()).await.unwrap().0
    }

    async fn next_json<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        ws: &mut tokio_tungstenite::WebSocketStream<S>,
    ) -> Value {
        match ws.next().await.unwrap().unwrap() {
            Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// Bootstrap frames in SnowLuma's order, then injected events; a
    /// server-side close is seen by the client and counted.
    #[tokio::test]
    async fn bootstrap_then_events_then_close() {
        let ev = FakeEvents::start(Some("t".into()), 7).await.unwrap();
        let mut ws = connect(&ev, Some("t")).await;
        let kinds: Vec<(Value, Value)> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                let m = next_json(&mut ws).await;
                assert_eq!(m["self_id"], 7);
                v.push((m["meta_event_type"].clone(), m["sub_type"].clone()));
            }
            v
        };
        assert_eq!(
            kinds,
            vec![
                (json!("lifecycle"), json!("connect")),
                (json!("lifecycle"), json!("enable")),
                (json!("heartbeat"), Value::Null)
            ]
        );
        assert_eq!(ev.accepted(), 1);
        assert_eq!(ev.send(&group_message(7, 1, 2, "hi")), 1);
        assert_eq!(next_json(&mut ws).await["raw_message"], "hi");
        assert_eq!(ev.close_all(), 1);
        match ws.next().await {
            Some(Ok(Message::Close(Some(f)))) => assert_eq!(f.code, CloseCode::Normal),
            other => panic!("{other:?}"),
        }
        drop(ws);
        for _ in 0..500 {
            if ev.closed() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!((ev.open(), ev.closed()), (0, 1));
    }

    /// The interop preset: after the bootstrap frames, numbered group
    /// messages of the account arrive by themselves, one per interval.
    #[tokio::test]
    async fn interop_preset_injects_events_after_bootstrap() {
        let ev = FakeEvents::start(None, INTEROP_SELF_ID).await.unwrap();
        ev.interop_preset();
        let mut ws = connect(&ev, None).await;
        for _ in 0..3 {
            assert_eq!(next_json(&mut ws).await["post_type"], "meta_event");
        }
        for n in 1..=2 {
            let m = next_json(&mut ws).await;
            assert_eq!(m, interop_event(INTEROP_SELF_ID, n));
            assert_eq!(m["raw_message"], format!("interop event {n}"));
        }
        assert!(ev.auto_sent() >= 2);
        assert_eq!(ev.received(), Vec::<String>::new());
    }

    /// A wrong or missing token: accepted at the HTTP level, then closed
    /// with 1008 `invalid access token`, like SnowLuma.
    #[tokio::test]
    async fn bad_token_is_closed_with_1008() {
        let ev = FakeEvents::start(Some("t".into()), 7).await.unwrap();
        for token in [Some("wrong"), None] {
            let mut ws = connect(&ev, token).await;
            match ws.next().await {
                Some(Ok(Message::Close(Some(f)))) => {
                    assert_eq!(f.code, CloseCode::Policy);
                    assert_eq!(f.reason.as_str(), "invalid access token");
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((ev.accepted(), ev.rejected()), (0, 2));
    }
}
