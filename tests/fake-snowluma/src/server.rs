//! The accept loop and the per-connection request cycle:
//! read → record → authorize → route → apply the action's fault → answer.

use std::io;
use std::sync::Arc;

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Duration, Instant};

use crate::actions::{self, Call, Frames, Parsed, Reply, failed, ok, with_echo};
use crate::golden::{self, GoldenReply};
use crate::http::{Conn, Head, ReadError};
use crate::stream::{self, FRAME_END};
use crate::{Fault, GoldenFault, RecordedRequest, Shared, State};

/// What to do with the connection after a request.
enum After {
    KeepAlive,
    /// Close politely (our response is complete).
    Close,
    /// Just drop the socket (peer gone, or a fault wants an abrupt end).
    Drop,
    /// Drop the socket after a complete response, then record the close.
    DropAfterResponse(String),
}

pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                tokio::spawn(serve_connection(shared.clone(), stream));
            }
            // E.g. out of file descriptors: back off briefly instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: TcpStream) {
    let mut conn = Conn::new(stream);
    loop {
        match serve_request(&shared, &mut conn).await {
            After::KeepAlive => {}
            After::Close => return conn.close_gracefully().await,
            After::Drop => return,
            After::DropAfterResponse(action) => {
                drop(conn);
                shared.lock().server_closed.push(action);
                return;
            }
        }
    }
}

fn json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

const JSON: Option<&str> = Some("application/json; charset=utf-8");

async fn write_json(conn: &mut Conn, status: u16, body: &Value, keep_alive: bool) -> After {
    write_bytes(conn, status, &json_bytes(body), keep_alive, None).await
}

async fn write_bytes(conn: &mut Conn, status: u16, body: &[u8], keep_alive: bool, split: Option<usize>) -> After {
    match conn.write_response(status, JSON, body, keep_alive, split).await {
        Ok(()) if keep_alive => After::KeepAlive,
        Ok(()) => After::Close,
        Err(_) => After::Drop,
    }
}

fn record(shared: &Shared, head: &Head, body: &[u8], action: Option<String>) {
    shared.lock().requests.push(RecordedRequest {
        method: head.method.clone(),
        path: head.path.clone(),
        query: head.query.clone(),
        headers: head.headers.clone(),
        body: body.to_vec(),
        action,
    });
}

async fn serve_request(shared: &Shared, conn: &mut Conn) -> After {
    let head = match conn.read_head().await {
        Ok(head) => head,
        Err(ReadError::Gone) => return After::Drop,
        Err(ReadError::Malformed(why)) => {
            return write_json(conn, 400, &failed(1400, &format!("bad request: {why}")), false).await;
        }
        Err(ReadError::TooLarge) => {
            return write_json(conn, 400, &failed(1400, "bad request: request head too large"), false).await;
        }
    };
    let body = match conn.read_body(&head).await {
        Ok(body) => body,
        Err(ReadError::Gone) => return After::Drop,
        Err(ReadError::TooLarge) => {
            // SnowLuma ≥ PR #464: 413 with retcode 1413 instead of dropping the socket.
            record(shared, &head, &[], None);
            return write_json(conn, 413, &failed(1413, "request entity too large"), false).await;
        }
        Err(ReadError::Malformed(why)) => {
            record(shared, &head, &[], None);
            return write_json(conn, 400, &failed(1400, &format!("bad request: {why}")), false).await;
        }
    };
    let keep_alive = head.keep_alive();
    if head.method == "POST" && shared.lock().golden && matches!(head.path.as_str(), "/__fault" | "/__reset") {
        return golden_control(shared, conn, &head, &body, keep_alive).await;
    }
    let parsed = actions::parse_call(&head, &body);
    let action = match &parsed {
        Parsed::Call(call) => Some(call.action.clone()),
        _ => None,
    };
    record(shared, &head, &body, action);

    if !actions::authorized(shared.token.as_deref(), &head) {
        return write_json(conn, 401, &failed(1401, "unauthorized"), keep_alive).await;
    }
    let call = match parsed {
        Parsed::Health => {
            return write_json(conn, 200, &ok(serde_json::json!({"online": true})), keep_alive).await;
        }
        Parsed::Reject { status, envelope } => return write_json(conn, status, &envelope, keep_alive).await,
        Parsed::Call(call) => call,
    };

    let golden_fault = {
        let mut state = shared.lock();
        if state.golden { state.golden_faults.remove(&call.action) } else { None }
    };
    if let Some(fault) = golden_fault {
        return serve_golden_fault(shared, conn, call, fault, keep_alive).await;
    }
    let fault = shared.lock().faults.get(&call.action).cloned();
    let mut split = None;
    let mut pace = None;
    match fault {
        None => {}
        Some(Fault::Delay(delay)) => {
            // Answer normally once the delay is over, unless the client gives up first.
            let deadline = Instant::now() + delay;
            if conn.wait_for_close(Some(deadline)).await {
                shared.record_closed(&call.action);
                return After::Drop;
            }
        }
        Some(Fault::Hang) => {
            // Never answer; only the client hanging up ends this.
            conn.wait_for_close(None).await;
            shared.record_closed(&call.action);
            return After::Drop;
        }
        Some(Fault::MalformedJson) => return write_bytes(conn, 200, b"{\"status\":", keep_alive, None).await,
        Some(Fault::Http500) => {
            let envelope = with_echo(failed(1200, "internal server error"), call.echo.as_ref());
            return write_json(conn, 500, &envelope, keep_alive).await;
        }
        Some(Fault::OversizeBody(size)) => {
            let envelope = with_echo(ok(Value::String("x".repeat(size))), call.echo.as_ref());
            return write_json(conn, 200, &envelope, keep_alive).await;
        }
        Some(Fault::NonObject) => return write_bytes(conn, 200, b"[1,2]", keep_alive, None).await,
        Some(Fault::RawBody(bytes)) => return write_bytes(conn, 200, &bytes, keep_alive, None).await,
        Some(Fault::CloseAfterResponse) => {
            let action = call.action.clone();
            let reply = actions::dispatch(&mut shared.lock(), call);
            if let Reply::Json { status, body } = reply {
                let _ = write_bytes(conn, status, &json_bytes(&body), keep_alive, None).await;
            }
            return After::DropAfterResponse(action);
        }
        Some(Fault::DisconnectMidBody) => {
            let reply = actions::dispatch(&mut shared.lock(), call);
            disconnect_mid_body(conn, reply).await;
            return After::Drop;
        }
        Some(Fault::StreamSplit(piece)) => split = Some(piece.max(1)),
        Some(Fault::Trickle(every)) => {
            split = Some(1);
            pace = Some(every);
        }
        Some(Fault::StreamThenHang(frames)) => {
            if conn.start_chunked(keep_alive).await.is_ok() {
                for frame in frames {
                    let mut bytes = json_bytes(&frame);
                    bytes.extend_from_slice(FRAME_END);
                    if conn.write_chunk(&bytes).await.is_err() {
                        break;
                    }
                }
            }
            conn.wait_for_close(None).await;
            shared.record_closed(&call.action);
            return After::Drop;
        }
        Some(Fault::StreamFrames(frames)) => {
            let frames: Frames = Box::new(frames.into_iter());
            return match write_stream(conn, frames, keep_alive, None, None).await {
                Ok(()) if keep_alive => After::KeepAlive,
                Ok(()) => After::Close,
                Err(_) => After::Drop,
            };
        }
    }

    let action = call.action.clone();
    let golden_reply = {
        let mut state = shared.lock();
        let State { golden, responses, uploads, uploaded, .. } = &mut *state;
        if *golden && !responses.contains_key(&call.action) && split.is_none() {
            golden::stream_reply(&call.action, &call.params, || stream::upload(uploads, uploaded, &call.params))
        } else {
            None
        }
    };
    match golden_reply {
        Some(GoldenReply::Undelimited(body)) => {
            let body = with_echo(body, call.echo.as_ref());
            return write_bytes(conn, 200, &json_bytes(&body), keep_alive, None).await;
        }
        Some(GoldenReply::Paced(frames, every)) => {
            let echo = call.echo.clone();
            let frames: Frames = Box::new(frames.map(move |f| with_echo(f, echo.as_ref())));
            return match write_paced(conn, frames, keep_alive, every).await {
                Ok(()) if keep_alive => After::KeepAlive,
                Ok(()) => After::Close,
                Err(_) => {
                    shared.record_closed(&action);
                    After::Drop
                }
            };
        }
        None => {}
    }
    let reply = actions::dispatch(&mut shared.lock(), call);
    match reply {
        Reply::Json { status, body } => write_bytes(conn, status, &json_bytes(&body), keep_alive, split).await,
        Reply::Stream(frames) => match write_stream(conn, frames, keep_alive, split, pace).await {
            Ok(()) if keep_alive => After::KeepAlive,
            Ok(()) => After::Close,
            Err(_) => {
                // The client went away while the stream was still being sent.
                shared.record_closed(&action);
                After::Drop
            }
        },
    }
}

/// Writes a Stream body: one HTTP chunk per frame, or with `split` pieces of
/// exactly that many bytes regardless of frame boundaries, waiting `pace`
/// after each piece.
async fn write_stream(
    conn: &mut Conn,
    frames: Frames,
    keep_alive: bool,
    split: Option<usize>,
    pace: Option<std::time::Duration>,
) -> io::Result<()> {
    let rest_a_while = || async move {
        match pace {
            Some(d) => tokio::time::sleep(d).await,
            None => tokio::task::yield_now().await,
        }
    };
    conn.start_chunked(keep_alive).await?;
    let mut pending: Vec<u8> = Vec::new();
    for frame in frames {
        let mut bytes = json_bytes(&frame);
        bytes.extend_from_slice(FRAME_END);
        let Some(piece) = split else {
            conn.write_chunk(&bytes).await?;
            continue;
        };
        let mut rest: &[u8] = &bytes;
        if !pending.is_empty() {
            let take = (piece - pending.len()).min(rest.len());
            pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if pending.len() < piece {
                continue;
            }
            conn.write_chunk(&pending).await?;
            pending.clear();
            rest_a_while().await;
        }
        for part in rest.chunks(piece) {
            if part.len() < piece {
                pending.extend_from_slice(part);
            } else {
                conn.write_chunk(part).await?;
                rest_a_while().await;
            }
        }
    }
    conn.write_chunk(&pending).await?;
    conn.finish_chunked().await
}

/// Writes Stream frames, one HTTP chunk each, waiting `every` between two.
async fn write_paced(conn: &mut Conn, frames: Frames, keep_alive: bool, every: Duration) -> io::Result<()> {
    conn.start_chunked(keep_alive).await?;
    for (i, frame) in frames.enumerate() {
        if i > 0 && !every.is_zero() {
            tokio::time::sleep(every).await;
        }
        let mut bytes = json_bytes(&frame);
        bytes.extend_from_slice(FRAME_END);
        conn.write_chunk(&bytes).await?;
    }
    conn.finish_chunked().await
}

/// `POST /__fault {"action", "mode"}` arms a golden fault; `POST /__reset`
/// disarms them all. Neither is recorded as a request.
async fn golden_control(shared: &Shared, conn: &mut Conn, head: &Head, body: &[u8], keep_alive: bool) -> After {
    if head.path == "/__reset" {
        shared.lock().golden_faults.clear();
        return write_json(conn, 200, &ok(Value::Null), keep_alive).await;
    }
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let action = request.get("action").and_then(Value::as_str);
    let mode = request.get("mode").and_then(Value::as_str).map(str::parse::<GoldenFault>);
    match (action, mode) {
        (Some(action), Some(Ok(fault))) => {
            shared.lock().golden_faults.insert(action.to_owned(), fault);
            write_json(conn, 200, &ok(Value::Null), keep_alive).await
        }
        (_, Some(Err(e))) => write_json(conn, 400, &failed(1400, &e.to_string()), keep_alive).await,
        _ => write_json(conn, 400, &failed(1400, "__fault needs action and mode"), keep_alive).await,
    }
}

/// One armed golden fault, answering `call`.
async fn serve_golden_fault(
    shared: &Shared,
    conn: &mut Conn,
    call: Call,
    fault: GoldenFault,
    keep_alive: bool,
) -> After {
    if let Some((status, body)) = golden::raw_answer(fault) {
        return write_bytes(conn, status, &body, keep_alive, None).await;
    }
    match fault {
        GoldenFault::Hang => {
            conn.wait_for_close(None).await;
            shared.record_closed(&call.action);
            return After::Drop;
        }
        // Read, never answered: the connection just closes.
        GoldenFault::Reset => return After::Drop,
        GoldenFault::Truncated => {
            let body = match actions::dispatch(&mut shared.lock(), call) {
                Reply::Json { body, .. } => json_bytes(&body),
                Reply::Stream(_) => json_bytes(&ok(Value::Null)),
            };
            let _ = conn.write_truncated(200, JSON, &body, body.len() / 2).await;
            return After::Drop;
        }
        _ => {}
    }
    let Some((pieces, break_off)) = golden::fault_frames(fault, &call.params) else {
        return After::Drop;
    };
    let written = async {
        conn.start_chunked(keep_alive).await?;
        for piece in &pieces {
            conn.write_chunk(piece).await?;
        }
        if break_off {
            return Ok(false);
        }
        conn.finish_chunked().await.map(|()| true)
    }
    .await;
    match written {
        Ok(true) if keep_alive => After::KeepAlive,
        Ok(true) => After::Close,
        Ok(false) => After::Drop,
        Err(_) => {
            shared.record_closed(&call.action);
            After::Drop
        }
    }
}

/// Sends the response head and about half of the body, then closes.
async fn disconnect_mid_body(conn: &mut Conn, reply: Reply) {
    match reply {
        Reply::Json { status, body } => {
            let bytes = json_bytes(&body);
            let _ = conn.write_truncated(status, JSON, &bytes, bytes.len() / 2).await;
        }
        Reply::Stream(frames) => {
            // Chunked: a well-formed chunk holding half the frames' bytes, no final chunk.
            let mut bytes = Vec::new();
            for frame in frames {
                bytes.extend_from_slice(&json_bytes(&frame));
                bytes.extend_from_slice(FRAME_END);
            }
            if conn.start_chunked(true).await.is_ok() {
                let _ = conn.write_chunk(&bytes[..bytes.len() / 2]).await;
            }
        }
    }
}
