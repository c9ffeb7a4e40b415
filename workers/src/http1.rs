//! The hot path for plain-HTTP endpoints: an ordinary (non-stream) call is
//! one HTTP/1.1 exchange, written and read by the call itself on a
//! connection from a small keep-alive pool of our own.
//!
//! reqwest stays for TLS endpoints, streams and transfers. For the common
//! ordinary call it adds, per request, a retry layer, a redirect layer that
//! re-parses the URL of every response, and pool bookkeeping; hyper's
//! client connection, which this path used next, runs each exchange in a
//! task of its own behind a channel and builds a header map both ways.
//! Together they cost the executor more CPU than the exchange itself. Here
//! the request is one buffer written with one `write`, and the response
//! head is parsed in place by `httparse` (hyper's own parser).
//!
//! Semantics are reqwest's: the same headers in the same order, one request
//! timeout covering connect, send and the whole body (the caller's), no
//! redirects, and nothing retried once it may have been sent. The one
//! resend is of a request not one byte of which was written, because the
//! pooled connection turned out to be closed. Dropping an exchange
//! (cancellation, timeout) closes its connection, so SnowLuma sees the
//! connection close.
//!
//! Responses are read as RFC 9112 says: interim (1xx) heads are skipped,
//! the body is chunked, sized by `content-length`, absent (204, 304) or
//! delimited by the connection's close, and a connection is reused only
//! when the response ended cleanly and keeps it alive.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use snowluma_proto::TraceContext;

/// Idle connections kept per executor.
const MAX_IDLE: usize = 16;
/// An idle connection is reused only this long. Node's HTTP server (and so
/// a typical SnowLuma) closes idle keep-alive connections after 5 s; a
/// request sent just as the server closes may or may not have been read,
/// and a write's outcome would then be unknown. Not reusing connections
/// near that age keeps requests out of that window.
const IDLE_REUSE: Duration = Duration::from_secs(4);
/// Largest response head (status line and headers, interim heads each).
const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one response head (hyper's limit).
const MAX_HEADERS: usize = 100;
/// Longest chunk-size line (with its extensions), and longest trailer section.
const MAX_CHUNK_LINE: usize = 4096;
/// Read granularity: the spare room kept in the buffer before each read.
const READ_ROOM: usize = 8 * 1024;

pub(crate) struct Direct {
    addrs: Vec<SocketAddr>,
    /// The request line and the headers every request carries, in the order
    /// reqwest writes them: `host`, `content-type`, `accept`.
    prefix: Vec<u8>,
    /// `authorization: Bearer …\r\n`, when there is a token.
    auth: Option<Vec<u8>>,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

/// One pooled connection. Dropping it closes the socket.
struct Conn {
    stream: TcpStream,
    idle_since: Instant,
    /// Where responses are read, kept from one exchange to the next (a
    /// response's body is copied out of it).
    buf: Vec<u8>,
}

/// A read buffer grown beyond this by a large response is not kept for
/// the next exchange.
const KEPT_BUFFER: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// No connection could be made: nothing was sent.
    #[error("connect: {0}")]
    Connect(String),
    /// The request was not written (it could not be built, or a new
    /// connection failed first).
    #[error("not sent: {0}")]
    NotSent(String),
    /// The exchange failed after the request may have been sent.
    #[error("{stage}: {detail}")]
    Exchange { stage: &'static str, detail: String },
    /// The body exceeded the cap; the response's HTTP status.
    #[error("the response (HTTP {0}) exceeds the body limit")]
    TooLarge(u16),
}

/// Before the final response head: the request's stage.
fn request_failure(detail: impl Into<String>) -> Failure {
    Failure::Exchange { stage: "request", detail: detail.into() }
}

/// After the final response head: reading its body.
fn body_failure(detail: impl Into<String>) -> Failure {
    Failure::Exchange { stage: "reading the response", detail: detail.into() }
}

/// What `http::HeaderValue::from_str` accepts: visible ASCII, spaces and tabs.
fn header_value_ok(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b' '..0x7f).contains(&b))
}

impl Direct {
    /// A direct client for `endpoint`, or `None` when it is not plain HTTP
    /// or its host has no known address (reqwest handles those).
    pub(crate) fn new(
        endpoint: &reqwest::Url,
        resolved: &[SocketAddr],
        token: Option<&str>,
        connect_timeout: Duration,
    ) -> Option<Direct> {
        if endpoint.scheme() != "http" || !endpoint.username().is_empty() || endpoint.password().is_some() {
            return None;
        }
        let port = endpoint.port_or_known_default()?;
        let host_str = endpoint.host_str()?;
        let addrs = match host_str.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            Ok(ip) => vec![SocketAddr::from((ip, port))],
            Err(_) if !resolved.is_empty() => resolved.to_vec(),
            Err(_) => return None,
        };
        let target = match endpoint.query() {
            Some(q) => format!("{}?{q}", endpoint.path()),
            None => endpoint.path().to_owned(),
        };
        // Origin form, as hyper would accept it for a request line.
        target.parse::<http::uri::PathAndQuery>().ok()?;
        // The Host header as reqwest writes it: the port only when explicit.
        let host = match endpoint.port() {
            Some(p) => format!("{host_str}:{p}"),
            None => host_str.to_owned(),
        };
        if !header_value_ok(&host) {
            return None;
        }
        let prefix = format!(
            "POST {target} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json\r\n"
        )
        .into_bytes();
        let auth = match token {
            Some(t) if header_value_ok(t) => Some(format!("authorization: Bearer {t}\r\n").into_bytes()),
            Some(_) => return None,
            None => None,
        };
        Some(Direct { addrs, prefix, auth, connect_timeout, idle: Mutex::new(Vec::new()) })
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        let mut last = String::from("no address");
        for addr in &self.addrs {
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Conn { stream, idle_since: Instant::now(), buf: Vec::with_capacity(READ_ROOM) });
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "connect timed out".into(),
            }
        }
        Err(Failure::Connect(last))
    }

    /// An idle pooled connection not yet known to be closed, if any.
    fn checkout(&self) -> Option<Conn> {
        loop {
            let c = self.idle.lock().ok()?.pop()?;
            if c.idle_since.elapsed() >= IDLE_REUSE {
                continue;
            }
            // Nothing may arrive on an idle connection: an end of stream,
            // stray bytes or an error all mean it cannot carry a request.
            // (Without a readiness event since the last read, this makes no
            // system call.)
            let mut probe = [0u8; 1];
            match c.stream.try_read(&mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(c),
                _ => continue,
            }
        }
    }

    fn checkin(&self, mut c: Conn) {
        c.idle_since = Instant::now();
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(c);
        }
    }

    /// The whole request: head and body in one buffer.
    fn build(&self, body: &[u8], trace: &TraceContext) -> Result<Vec<u8>, Failure> {
        // A request that cannot be built was never sent.
        if !header_value_ok(&trace.traceparent) {
            return Err(Failure::NotSent("invalid traceparent header value".into()));
        }
        if let Some(ts) = &trace.tracestate
            && !header_value_ok(ts)
        {
            return Err(Failure::NotSent("invalid tracestate header value".into()));
        }
        let mut req = Vec::with_capacity(self.prefix.len() + 160 + body.len());
        req.extend_from_slice(&self.prefix);
        req.extend_from_slice(b"traceparent: ");
        req.extend_from_slice(trace.traceparent.as_bytes());
        req.extend_from_slice(b"\r\n");
        if let Some(ts) = &trace.tracestate {
            req.extend_from_slice(b"tracestate: ");
            req.extend_from_slice(ts.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        if let Some(a) = &self.auth {
            req.extend_from_slice(a);
        }
        req.extend_from_slice(b"content-length: ");
        push_decimal(&mut req, body.len());
        req.extend_from_slice(b"\r\n\r\n");
        req.extend_from_slice(body);
        Ok(req)
    }

    /// POST `body`; the status and the whole response body (at most `cap`
    /// bytes). Callers bound it with the request timeout and cancellation;
    /// `head` is set once the response head has arrived (a timeout after it
    /// happened while the body was read).
    pub(crate) async fn post(
        &self,
        body: String,
        trace: &TraceContext,
        cap: usize,
        head: &AtomicBool,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let req = self.build(body.as_bytes(), trace)?;
        let mut conn = match self.checkout() {
            Some(mut c) => match write_request(&mut c.stream, &req).await {
                Ok(()) => c,
                // The pooled connection was closed and took not one byte:
                // the request never left, so it goes once on a new one.
                Err((0, _)) => {
                    drop(c);
                    self.send_fresh(&req).await?
                }
                Err((_, e)) => return Err(request_failure(e.to_string())),
            },
            None => self.send_fresh(&req).await?,
        };
        let response = read_response(&mut conn.stream, &mut conn.buf, cap, head).await?;
        if response.reusable {
            if conn.buf.capacity() > KEPT_BUFFER {
                conn.buf = Vec::with_capacity(READ_ROOM);
            }
            self.checkin(conn);
        }
        Ok((response.status, response.body))
    }

    /// Send on a new connection.
    async fn send_fresh(&self, req: &[u8]) -> Result<Conn, Failure> {
        let mut c = self.connect().await?;
        match write_request(&mut c.stream, req).await {
            Ok(()) => Ok(c),
            Err((0, e)) => Err(Failure::NotSent(e.to_string())),
            Err((_, e)) => Err(request_failure(e.to_string())),
        }
    }
}

/// `n` in decimal digits (what `{}` writes, without the formatter).
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        // A digit: `rest % 10` is below 10.
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Write all of `req`; on failure, how many bytes had been written.
async fn write_request(stream: &mut TcpStream, req: &[u8]) -> Result<(), (usize, io::Error)> {
    let mut written = 0;
    while written < req.len() {
        match stream.write(&req[written..]).await {
            Ok(0) => return Err((written, io::ErrorKind::WriteZero.into())),
            Ok(n) => written += n,
            Err(e) => return Err((written, e)),
        }
    }
    Ok(())
}

/// A response read whole.
struct Response {
    status: u16,
    body: Vec<u8>,
    /// It ended cleanly on a connection kept alive, with nothing after it.
    reusable: bool,
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    Close,
}

/// What the final response head says.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Its length in the buffer.
    len: usize,
    framing: Framing,
    keep_alive: bool,
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn lists(value: &[u8], token: &str) -> bool {
    value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Parse a response head at the start of `buf`: `Ok(None)` when more bytes
/// are needed, `Ok(Some(Err(len)))` for an interim (1xx) head of `len` bytes.
fn parse_head(buf: &[u8]) -> Result<Option<Result<Head, usize>>, String> {
    // Room for the headers, left uninitialised: httparse fills what it uses.
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err("the response head is too large".into()),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("invalid response head: {e}")),
    };
    if len > MAX_HEAD {
        return Err("the response head is too large".into());
    }
    let status = resp.code.unwrap_or(0);
    if status == 101 {
        return Err("unexpected protocol switch (HTTP 101)".into());
    }
    if (100..200).contains(&status) {
        return Ok(Some(Err(len)));
    }
    let http11 = resp.version == Some(1);
    let mut chunked = None;
    let mut length: Option<u64> = None;
    let mut close = false;
    let mut keep_alive = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The final coding decides: chunked, or read until the close.
            let last = h.value.split(|&b| b == b',').next_back().unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            for v in h.value.split(|&b| b == b',') {
                let v = v.trim_ascii();
                let n = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or("invalid content-length")?;
                if length.is_some_and(|l| l != n) {
                    return Err("conflicting content-length".into());
                }
                length = Some(n);
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= lists(h.value, "close");
            keep_alive |= lists(h.value, "keep-alive");
        }
    }
    let framing = if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    // A message with both framings (RFC 9112 §6.3) is not followed on the
    // same connection.
    let both = chunked.is_some() && length.is_some();
    let keep_alive = framing != Framing::Close && !close && !both && (http11 || keep_alive);
    Ok(Some(Ok(Head { status, len, framing, keep_alive })))
}

/// Read more into `buf`; `false` at the end of the stream.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<bool> {
    if buf.capacity() - buf.len() < READ_ROOM / 2 {
        buf.reserve(READ_ROOM);
    }
    Ok(stream.read_buf(buf).await? > 0)
}

/// Read one response through `buf` (the connection's buffer, emptied
/// first).
async fn read_response(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    cap: usize,
    head_seen: &AtomicBool,
) -> Result<Response, Failure> {
    buf.clear();
    // A head usually arrives whole in the first read: it is parsed at once.
    // After that, it is parsed once its end may be in the buffer, so that a
    // server trickling a large head costs one scan, not one parse per read.
    let (mut scanned, mut ended) = (0usize, false);
    let head = loop {
        let from = scanned.saturating_sub(2);
        let first = scanned == 0 && !buf.is_empty();
        scanned = buf.len();
        ended = ended
            || (!first
                && (buf[from..].windows(2).any(|w| w == b"\n\n") || buf[from..].windows(3).any(|w| w == b"\n\r\n")));
        if first || ended {
            match parse_head(buf).map_err(request_failure)? {
                Some(Ok(head)) => break head,
                Some(Err(interim)) => {
                    buf.drain(..interim);
                    (scanned, ended) = (0, false);
                    continue;
                }
                None => {}
            }
        } else if buf.len() > MAX_HEAD {
            return Err(request_failure("the response head is too large"));
        }
        match fill(stream, buf).await {
            Ok(true) => {}
            Ok(false) => return Err(request_failure("the connection closed before a response")),
            Err(e) => return Err(request_failure(e.to_string())),
        }
    };
    head_seen.store(true, Ordering::Relaxed);
    let status = head.status;
    let read_err = |e: io::Error| body_failure(e.to_string());
    let (body, clean) = match head.framing {
        Framing::Length(n) => {
            if n > cap as u64 {
                return Err(Failure::TooLarge(status));
            }
            // `n` is at most `cap`, a usize.
            let end = head.len + n as usize;
            while buf.len() < end {
                if !fill(stream, buf).await.map_err(read_err)? {
                    return Err(body_failure("the connection closed before the end of the body"));
                }
            }
            let clean = buf.len() == end;
            (buf[head.len..end].to_vec(), clean)
        }
        Framing::Close => {
            buf.drain(..head.len);
            let mut buf = std::mem::take(buf);
            while fill(stream, &mut buf).await.map_err(read_err)? {
                if buf.len() > cap {
                    return Err(Failure::TooLarge(status));
                }
            }
            if buf.len() > cap {
                return Err(Failure::TooLarge(status));
            }
            (buf, false)
        }
        Framing::Chunked => {
            buf.drain(..head.len);
            let mut out = Vec::new();
            let rest = dechunk(stream, std::mem::take(buf), &mut out, cap, status).await?;
            (out, rest == 0)
        }
    };
    Ok(Response { status, body, reusable: head.keep_alive && clean })
}

/// Decode a chunked body whose first bytes are in `buf` into `out`; the
/// number of bytes left over after it.
async fn dechunk(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    out: &mut Vec<u8>,
    cap: usize,
    status: u16,
) -> Result<usize, Failure> {
    let mut pos = 0;
    // Read more after `buf[pos..]`, or fail at the end of the stream.
    macro_rules! more {
        () => {{
            // Drop what is consumed before growing the buffer.
            if pos > 0 && pos >= buf.len() / 2 {
                buf.drain(..pos);
                pos = 0;
            }
            match fill(stream, &mut buf).await {
                Ok(true) => {}
                Ok(false) => return Err(body_failure("the connection closed before the end of the body")),
                Err(e) => return Err(body_failure(e.to_string())),
            }
        }};
    }
    loop {
        let size = loop {
            match httparse::parse_chunk_size(&buf[pos..]) {
                Ok(httparse::Status::Complete((used, size))) => {
                    pos += used;
                    break size;
                }
                Ok(httparse::Status::Partial) if buf.len() - pos > MAX_CHUNK_LINE => {
                    return Err(body_failure("invalid chunk size line"));
                }
                Ok(httparse::Status::Partial) => more!(),
                Err(_) => return Err(body_failure("invalid chunk size line")),
            }
        };
        if size == 0 {
            break;
        }
        if (out.len() as u64).saturating_add(size) > cap as u64 {
            return Err(Failure::TooLarge(status));
        }
        // At most `cap` in all, a usize.
        let mut left = size as usize;
        while left > 0 {
            if pos == buf.len() {
                more!();
            }
            let take = left.min(buf.len() - pos);
            out.extend_from_slice(&buf[pos..pos + take]);
            pos += take;
            left -= take;
        }
        while buf.len() - pos < 2 {
            more!();
        }
        if &buf[pos..pos + 2] != b"\r\n" {
            return Err(body_failure("a chunk does not end with CRLF"));
        }
        pos += 2;
    }
    // The trailer section: header lines, then an empty line.
    loop {
        let rest = &buf[pos..];
        if let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
            pos += end + 2;
            if end == 0 {
                return Ok(buf.len() - pos);
            }
            continue;
        }
        if rest.len() > MAX_CHUNK_LINE {
            return Err(body_failure("the trailer section is too large"));
        }
        more!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::net::TcpListener;

    /// One scripted answer: the bytes, written at once or one at a time,
    /// and whether the server closes the connection after them.
    struct Reply {
        bytes: Vec<u8>,
        trickle: bool,
        close: bool,
    }

    fn reply(bytes: &str) -> Reply {
        Reply { bytes: bytes.as_bytes().to_vec(), trickle: false, close: false }
    }

    /// Every request received, with the number of the connection it came on.
    type Seen = Arc<Mutex<Vec<(usize, Vec<u8>)>>>;

    /// A server answering each request with the next scripted reply, and
    /// recording every request it receives.
    struct Server {
        direct: Direct,
        seen: Seen,
        /// One message each time the server has closed a connection.
        closed: tokio::sync::mpsc::UnboundedReceiver<()>,
    }

    async fn read_request(s: &mut TcpStream) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).ok()?.to_ascii_lowercase();
                let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length: "))?.parse().ok()?;
                while buf.len() < end + 4 + len {
                    if s.read_buf(&mut buf).await.ok()? == 0 {
                        return None;
                    }
                }
                return Some(buf);
            }
            if s.read_buf(&mut buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    async fn server(token: Option<&str>, replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, closed) = tokio::sync::mpsc::unbounded_channel();
        let replies = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
        let log = seen.clone();
        tokio::spawn(async move {
            for n in 0.. {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let (log, replies, closed_tx) = (log.clone(), replies.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    while let Some(req) = read_request(&mut s).await {
                        log.lock().unwrap().push((n, req));
                        let Some(r) = replies.lock().unwrap().pop_front() else { break };
                        if r.trickle {
                            for b in &r.bytes {
                                s.write_all(std::slice::from_ref(b)).await.unwrap();
                                tokio::task::yield_now().await;
                            }
                        } else {
                            s.write_all(&r.bytes).await.unwrap();
                        }
                        if r.close {
                            break;
                        }
                    }
                    drop(s);
                    let _ = closed_tx.send(());
                });
            }
        });
        let url = reqwest::Url::parse(&format!("http://{addr}/onebot?x=1")).unwrap();
        let direct = Direct::new(&url, &[], token, Duration::from_secs(5)).unwrap();
        Server { direct, seen, closed }
    }

    fn trace() -> TraceContext {
        TraceContext { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(), tracestate: None }
    }

    impl Server {
        async fn post(&self, body: &str) -> Result<(u16, Vec<u8>), Failure> {
            self.post_capped(body, 1 << 20).await
        }
        async fn post_capped(&self, body: &str, cap: usize) -> Result<(u16, Vec<u8>), Failure> {
            self.direct.post(body.into(), &trace(), cap, &AtomicBool::new(false)).await
        }
        fn connections(&self) -> Vec<usize> {
            self.seen.lock().unwrap().iter().map(|(n, _)| *n).collect()
        }
        /// Wait for the server to close a connection, then let the runtime
        /// see the close.
        async fn await_close(&mut self) {
            self.closed.recv().await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}";

    #[tokio::test]
    async fn requests_carry_reqwests_headers_and_reuse_the_connection() {
        let s = server(Some("sekrit"), vec![reply(OK), reply(OK)]).await;
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{\"a\":1}".to_vec()));
        let tp = TraceContext { tracestate: Some("k=v".into()), ..trace() };
        let r = s.direct.post("{\"b\":2}".into(), &tp, 1 << 20, &AtomicBool::new(false)).await.unwrap();
        assert_eq!(r.1, b"{\"a\":1}");
        assert_eq!(s.connections(), [0, 0], "the second request reuses the connection");
        let seen = s.seen.lock().unwrap();
        let port = s.direct.addrs[0].port();
        assert_eq!(
            String::from_utf8_lossy(&seen[0].1),
            format!(
                "POST /onebot?x=1 HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
                 accept: application/json\r\ntraceparent: {}\r\nauthorization: Bearer sekrit\r\n\
                 content-length: 2\r\n\r\n{{}}",
                trace().traceparent
            )
        );
        assert!(String::from_utf8_lossy(&seen[1].1).contains(&format!(
            "traceparent: {}\r\ntracestate: k=v\r\nauthorization: Bearer sekrit\r\ncontent-length: 7\r\n\r\n{{\"b\":2}}",
            trace().traceparent
        )));
    }

    #[tokio::test]
    async fn chunked_bodies_are_decoded_from_any_split() {
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                       4;ext=1\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nx-trailer: 1\r\n\r\n";
        let s = server(None, vec![Reply { trickle: true, ..reply(chunked) }, reply(chunked)]).await;
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert_eq!(s.connections(), [0, 0]);
    }

    #[tokio::test]
    async fn interim_heads_are_skipped_and_empty_statuses_have_no_body() {
        let s = server(
            None,
            vec![
                // Byte by byte: each head is found however it is split.
                Reply {
                    trickle: true,
                    ..reply("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nx: y\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}")
                },
                reply("HTTP/1.1 204 No Content\r\n\r\n"),
                reply(OK),
            ],
        )
        .await;
        assert_eq!(s.post("{}").await.unwrap(), (201, b"{}".to_vec()));
        assert_eq!(s.post("{}").await.unwrap(), (204, Vec::new()));
        assert_eq!(s.post("{}").await.unwrap().0, 200);
        assert_eq!(s.connections(), [0, 0, 0]);
    }

    #[tokio::test]
    async fn connections_are_reused_only_when_kept_alive() {
        let mut s = server(
            None,
            vec![
                // HTTP/1.0 without keep-alive, its body ended by the close.
                Reply { close: true, ..reply("HTTP/1.0 200 OK\r\n\r\n{\"c\":1}") },
                reply("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"),
                reply("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\n{}"),
                reply(OK),
                // Bytes after the body: the connection is not clean.
                reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}XX"),
                reply(OK),
            ],
        )
        .await;
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{\"c\":1}".to_vec()));
        s.await_close().await;
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{}".to_vec()));
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{}".to_vec()));
        assert_eq!(s.post("{}").await.unwrap().0, 200);
        assert_eq!(s.post("{}").await.unwrap(), (200, b"{}".to_vec()));
        assert_eq!(s.post("{}").await.unwrap().0, 200);
        assert_eq!(s.connections(), [0, 1, 2, 2, 2, 3]);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_server_closed_is_replaced() {
        // The server announces keep-alive, then closes anyway (its idle
        // timer): the next request goes once, on a new connection.
        let mut s = server(None, vec![Reply { close: true, ..reply(OK) }, reply(OK)]).await;
        assert_eq!(s.post("{}").await.unwrap().0, 200);
        s.await_close().await;
        assert_eq!(s.post("{}").await.unwrap().0, 200);
        assert_eq!(s.connections(), [0, 1]);
    }

    #[tokio::test]
    async fn bodies_over_the_cap_are_refused_with_their_status() {
        let big_chunked = format!(
            "HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n6\r\n{}\r\n6\r\n{}\r\n0\r\n\r\n",
            "x".repeat(6),
            "y".repeat(6)
        );
        let s = server(
            None,
            vec![
                reply("HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n"),
                reply(&big_chunked),
                Reply { close: true, ..reply("HTTP/1.1 203 OK\r\n\r\n01234567890") },
            ],
        )
        .await;
        assert!(matches!(s.post_capped("{}", 10).await, Err(Failure::TooLarge(200))));
        assert!(matches!(s.post_capped("{}", 10).await, Err(Failure::TooLarge(500))));
        assert!(matches!(s.post_capped("{}", 10).await, Err(Failure::TooLarge(203))));
        // The largest chunk size there is, refused before any of it is read.
        let s = server(None, vec![reply("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n")])
            .await;
        assert!(matches!(s.post_capped("{}", 10).await, Err(Failure::TooLarge(200))));
        // Exactly the cap is fine.
        let s = server(None, vec![reply("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789")]).await;
        assert_eq!(s.post_capped("{}", 10).await.unwrap().1, b"0123456789");
    }

    #[tokio::test]
    async fn broken_responses_fail_at_their_stage() {
        let stage = |r: Result<(u16, Vec<u8>), Failure>| match r {
            Err(Failure::Exchange { stage, .. }) => stage,
            other => panic!("{other:?}"),
        };
        for (bytes, want, head) in [
            ("", "request", false),
            ("NOT HTTP\r\n\r\n", "request", false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n", "request", false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\n", "request", false),
            ("HTTP/1.1 101 Switching\r\n\r\n", "request", false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", "reading the response", true),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "reading the response", true),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}XX", "reading the response", true),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n", "reading the response", true),
        ] {
            let s = server(None, vec![Reply { close: true, ..reply(bytes) }]).await;
            let seen_head = AtomicBool::new(false);
            let r = s.direct.post("{}".into(), &trace(), 1 << 20, &seen_head).await;
            assert_eq!(stage(r), want, "{bytes:?}");
            assert_eq!(seen_head.load(Ordering::Relaxed), head, "{bytes:?}");
        }
        // Too large a head.
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let s = server(None, vec![Reply { close: true, ..reply(&huge) }]).await;
        assert_eq!(stage(s.post("{}").await), "request");
    }

    #[tokio::test]
    async fn unsendable_trace_values_are_not_sent() {
        let s = server(None, vec![reply(OK)]).await;
        let bad = TraceContext { traceparent: "00-x\r\nx-injected: 1".into(), tracestate: None };
        let r = s.direct.post("{}".into(), &bad, 1 << 20, &AtomicBool::new(false)).await;
        assert!(matches!(r, Err(Failure::NotSent(_))), "{r:?}");
        let bad = TraceContext { tracestate: Some("a=\nb".into()), ..trace() };
        let r = s.direct.post("{}".into(), &bad, 1 << 20, &AtomicBool::new(false)).await;
        assert!(matches!(r, Err(Failure::NotSent(_))), "{r:?}");
        assert!(s.connections().is_empty());
        // A token that is not a header value leaves the endpoint to reqwest.
        let url = reqwest::Url::parse("http://127.0.0.1:9/").unwrap();
        assert!(Direct::new(&url, &[], Some("a\r\nb"), Duration::from_secs(1)).is_none());
    }

    #[tokio::test]
    async fn nothing_is_connected_when_no_address_answers() {
        // A port nobody listens on: refused, nothing sent.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let d = Direct::new(&url, &[], None, Duration::from_secs(1)).unwrap();
        let r = d.post("{}".into(), &trace(), 10, &AtomicBool::new(false)).await;
        assert!(matches!(r, Err(Failure::Connect(_))), "{r:?}");
    }

    #[test]
    fn lengths_are_written_in_decimal() {
        for n in [0, 7, 10, 99, 100, 12_345, usize::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }
}
