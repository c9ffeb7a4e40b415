//! SnowLuma's event WebSocket (`SNOWLUMA_MCP_EVENTS_URL`).
//!
//! One [`Request::Events`](snowluma_proto::Request::Events) opens one
//! connection with the access token (the events token when one is set,
//! else the HTTP token) as `Authorization: Bearer`, reports
//! [`EventMsg::Connected`] after the handshake and then every OneBot event
//! (meta events are consumed here) until the connection ends. Nothing is
//! ever sent on the socket but the WebSocket protocol's own control frames
//! (pong, close): no event operation can execute an action.
//!
//! The connection stops, with a reason the supervisor shows in every event
//! resource's status, on: a frame over [`MAX_EVENT_FRAME_BYTES`], a binary
//! message, a text message that is not a JSON object, an event whose `self_id` is not the account
//! subscribed to, the server closing or failing. It is never reopened here.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use snowluma_proto::{EventMsg, JsonText, Reply};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::client::{Net, tls_config};
use crate::serve::Ctx;

/// Largest incoming WebSocket frame or message accepted.
pub const MAX_EVENT_FRAME_BYTES: usize = 256 * 1024;

/// Longest piece of the server's close reason copied into a status.
const MAX_REASON_CHARS: usize = 120;

fn closed(reason: impl Into<String>) -> Reply {
    Reply::EventsClosed { reason: reason.into() }
}

/// Serve one event connection until it ends or `ctx` is cancelled.
pub(super) async fn run(net: &Net, self_id: i64, ctx: &Ctx) -> Reply {
    let Some(target) = &net.events else {
        return closed("event resources are not configured (SNOWLUMA_MCP_EVENTS_URL)");
    };
    let mut request = match target.url.as_str().into_client_request() {
        Ok(r) => r,
        Err(_) => return closed("the events URL is not a valid WebSocket URL"),
    };
    // SnowLuma's WebSocket server has its own token when one is configured
    // (SNOWLUMA_MCP_EVENTS_TOKEN); otherwise the HTTP token is sent.
    if let Some(token) = target.token.as_ref().or(net.token.as_ref()) {
        match http::HeaderValue::from_str(&format!("Bearer {token}")) {
            Ok(mut v) => {
                v.set_sensitive(true);
                request.headers_mut().insert(http::header::AUTHORIZATION, v);
            }
            Err(_) => return closed("the access token cannot be sent in an HTTP header"),
        }
    }
    let uri = request.uri().clone();
    let Some(host) = uri.host().map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned()) else {
        return closed("the events URL has no host");
    };
    let tls = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addrs: Vec<std::net::SocketAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![std::net::SocketAddr::new(ip, port)],
        Err(_) => target.resolved.clone(),
    };
    if addrs.is_empty() {
        return closed("the events host could not be resolved at startup; restart the server to try again");
    }
    let connect = async {
        let mut last = None;
        for a in &addrs {
            match tokio::net::TcpStream::connect(a).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.map(|e| e.kind()).unwrap_or(std::io::ErrorKind::NotFound))
    };
    let tcp = tokio::select! {
        _ = ctx.cancel.cancelled() => return closed("released"),
        r = tokio::time::timeout(net.timeout, connect) => match r {
            Ok(Ok(s)) => s,
            Ok(Err(kind)) => return closed(format!("cannot connect to the events endpoint: {kind}")),
            Err(_) => return closed("connecting to the events endpoint timed out"),
        },
    };
    let _ = tcp.set_nodelay(true);
    if tls {
        let config = match tls_config() {
            Ok(c) => Arc::new(c),
            Err(e) => return closed(e),
        };
        let Ok(name) = rustls::pki_types::ServerName::try_from(host) else {
            return closed("the events host is not a valid TLS server name");
        };
        let connector = tokio_rustls::TlsConnector::from(config);
        let stream = tokio::select! {
            _ = ctx.cancel.cancelled() => return closed("released"),
            r = tokio::time::timeout(net.timeout, connector.connect(name, tcp)) => match r {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return closed(format!("TLS with the events endpoint failed: {}", e.kind())),
                Err(_) => return closed("the TLS handshake with the events endpoint timed out"),
            },
        };
        session(stream, request, self_id, net.timeout, ctx).await
    } else {
        session(tcp, request, self_id, net.timeout, ctx).await
    }
}

async fn session<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    request: http::Request<()>,
    self_id: i64,
    timeout: Duration,
    ctx: &Ctx,
) -> Reply {
    let config = WebSocketConfig::default()
        .max_frame_size(Some(MAX_EVENT_FRAME_BYTES))
        .max_message_size(Some(MAX_EVENT_FRAME_BYTES));
    let handshake = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
    let mut ws = tokio::select! {
        _ = ctx.cancel.cancelled() => return closed("released"),
        r = tokio::time::timeout(timeout, handshake) => match r {
            Ok(Ok((ws, _response))) => ws,
            Ok(Err(WsError::Http(resp))) => {
                return closed(format!("the events endpoint refused the WebSocket handshake (HTTP {})", resp.status().as_u16()));
            }
            Ok(Err(e)) => return closed(format!("the WebSocket handshake failed: {}", error_text(&e))),
            Err(_) => return closed("the WebSocket handshake timed out"),
        },
    };
    if !ctx.event(EventMsg::Connected) {
        return closed("released");
    }
    tracing::info!("event connection open");
    let end = loop {
        let msg = tokio::select! {
            _ = ctx.cancel.cancelled() => {
                // Released by the supervisor: close politely, briefly.
                let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                break "released".to_owned();
            }
            m = ws.next() => m,
        };
        let text = match msg {
            None => break "the events endpoint closed the connection".to_owned(),
            Some(Err(e)) => break format!("the event connection failed: {}", error_text(&e)),
            Some(Ok(Message::Text(t))) => t.as_str().to_owned(),
            // OneBot sends events as text frames; a binary message is not
            // one, whatever its bytes.
            Some(Ok(Message::Binary(_))) => {
                break stop(&mut ws, "malformed event: a binary frame (events are text frames)").await;
            }
            Some(Ok(Message::Close(frame))) => {
                break match frame {
                    Some(f) => format!(
                        "the events endpoint closed the connection (code {}: {})",
                        u16::from(f.code),
                        f.reason.as_str().chars().take(MAX_REASON_CHARS).collect::<String>()
                    ),
                    None => "the events endpoint closed the connection".to_owned(),
                };
            }
            Some(Ok(_)) => continue,
        };
        match check(&text, self_id) {
            Ok(Kind::Meta) => continue,
            Ok(Kind::Event) => {
                if !ctx.event(EventMsg::Event(JsonText(text))) {
                    break "released".to_owned();
                }
            }
            Err(why) => break stop(&mut ws, why).await,
        }
    };
    tracing::info!("event connection closed");
    closed(end)
}

/// Close the connection ourselves because of what the server sent.
async fn stop<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut tokio_tungstenite::WebSocketStream<S>, why: &str) -> String {
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    why.to_owned()
}

fn error_text(e: &WsError) -> String {
    match e {
        WsError::Capacity(_) => {
            format!("a frame over the 256 KiB limit ({MAX_EVENT_FRAME_BYTES} bytes); frames that large are refused")
        }
        WsError::Io(io) => io.kind().to_string(),
        WsError::Protocol(p) => format!("protocol error ({p})"),
        WsError::ConnectionClosed | WsError::AlreadyClosed => "the connection closed".to_owned(),
        _ => "a WebSocket error".to_owned(),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Meta,
    Event,
}

/// Classify one message: a JSON object of the account `self_id`, meta or not.
/// Judged as parsing it into a `serde_json::Value` would judge it, without
/// building more of it than these two members (`json::members`): building
/// the whole tree of every event took most of the executor's time per event.
fn check(text: &str, self_id: i64) -> Result<Kind, &'static str> {
    let [id, post_type] = snowluma_proto::json::members(text, ["self_id", "post_type"])
        .map_err(|_| "malformed event: not JSON")?
        .ok_or("malformed event: not a JSON object")?;
    match id.as_ref().and_then(Value::as_i64) {
        Some(id) if id == self_id => {}
        Some(_) => return Err("account mismatch: an event's self_id is not the subscribed account"),
        None => return Err("malformed event: no numeric self_id"),
    }
    match post_type.as_ref().and_then(Value::as_str) {
        Some("meta_event") => Ok(Kind::Meta),
        Some(_) => Ok(Kind::Event),
        None => Err("malformed event: no post_type"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How events were checked before: the message parsed into a `Value`.
    fn check_by_value(text: &str, self_id: i64) -> Result<Kind, &'static str> {
        let v: Value = serde_json::from_str(text).map_err(|_| "malformed event: not JSON")?;
        let obj = v.as_object().ok_or("malformed event: not a JSON object")?;
        match obj.get("self_id").and_then(Value::as_i64) {
            Some(id) if id == self_id => {}
            Some(_) => return Err("account mismatch: an event's self_id is not the subscribed account"),
            None => return Err("malformed event: no numeric self_id"),
        }
        match obj.get("post_type").and_then(Value::as_str) {
            Some("meta_event") => Ok(Kind::Meta),
            Some(_) => Ok(Kind::Event),
            None => Err("malformed event: no post_type"),
        }
    }

    /// Every message gets the verdict a parsed `Value` gave it: repeated
    /// names (the last counts), escaped names, every kind of `self_id`
    /// (integers at and past i64's ends, floats, strings) and of
    /// `post_type`, and text that is not JSON or not an object. How the
    /// text itself is read (numbers, strings, nesting, trailing text) is
    /// `json::members`' own test's.
    #[test]
    fn events_are_judged_as_a_parsed_value_judges_them() {
        let corpus = [
            r#"{"self_id":1,"post_type":"message"}"#,
            r#"{"self_id":1,"post_type":"meta_event"}"#,
            r#"{"post_type":"meta_event","self_id":1}"#,
            r#"{"self_id":2,"post_type":"message"}"#,
            r#"{"self_id":1,"self_id":2,"post_type":"message"}"#,
            r#"{"self_id":2,"self_id":1,"post_type":"message"}"#,
            r#"{"self_id":1,"self_id":"1","post_type":"message"}"#,
            r#"{"self_id":1,"post_type":"meta_event","post_type":"notice"}"#,
            r#"{"self_id":1,"post_type":"notice","post_type":"meta_event"}"#,
            r#"{"self_id":1,"post_type":"notice","post_type":null}"#,
            r#"{"self\u005fid":1,"post_type":"message"}"#,
            r#"{"self_id":1,"post_type":"meta\u005fevent"}"#,
            r#"{"self_id":"1","post_type":"message"}"#,
            r#"{"self_id":1.0,"post_type":"message"}"#,
            r#"{"self_id":-1,"post_type":"message"}"#,
            r#"{"self_id":9223372036854775807,"post_type":"message"}"#,
            r#"{"self_id":9223372036854775808,"post_type":"message"}"#,
            r#"{"self_id":-9223372036854775808,"post_type":"message"}"#,
            r#"{"self_id":null,"post_type":"message"}"#,
            r#"{"self_id":[1],"post_type":"message"}"#,
            r#"{"self_id":{"a":1},"post_type":"message"}"#,
            r#"{"self_id":1,"post_type":1}"#,
            r#"{"self_id":1,"post_type":["meta_event"]}"#,
            r#"{"self_id":1,"post_type":""}"#,
            r#"{"self_id":1}"#,
            r#"{"post_type":"notice"}"#,
            r#"{"x":{"self_id":1,"post_type":"message"}}"#,
            r#"{"self_id":1,"post_type":"message","n":1e400}"#,
            r#"{"self_id":1,"post_type":"message"} x"#,
            "[1]",
            "\"s\"",
            "",
            "nope",
        ];
        for text in corpus {
            for id in [1, 2, -1] {
                assert_eq!(check(text, id), check_by_value(text, id), "{text} (self_id {id})");
            }
        }
    }

    #[test]
    fn events_are_checked() {
        assert_eq!(check(r#"{"self_id":1,"post_type":"message"}"#, 1), Ok(Kind::Event));
        assert_eq!(check(r#"{"self_id":1,"post_type":"meta_event"}"#, 1), Ok(Kind::Meta));
        assert!(check(r#"{"self_id":2,"post_type":"message"}"#, 1).unwrap_err().starts_with("account mismatch"));
        assert!(check("[1]", 1).is_err());
        assert!(check("nope", 1).is_err());
        assert!(check(r#"{"post_type":"notice"}"#, 1).is_err());
        assert!(check(r#"{"self_id":1}"#, 1).is_err());
    }
}
