//! Just enough HTTP/1.1 for the fake, written on a plain [`TcpStream`].
//!
//! Supported: keep-alive (HTTP/1.1 default, `Connection: close` honoured,
//! HTTP/1.0 closes unless it asks for keep-alive), request bodies framed by
//! `Content-Length` or `Transfer-Encoding: chunked`, `Expect: 100-continue`,
//! query strings, and responses framed by `Content-Length` or chunked (the
//! latter is how SnowLuma sends Stream actions).
//!
//! The connection keeps its own read buffer so that, while a request is held
//! back by a fault, the server can keep reading the socket to notice the client
//! hanging up (see [`Conn::wait_for_close`]).

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

/// Largest request head (request line plus headers) accepted.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request body accepted: SnowLuma's cap after PR #464 (64 MiB, then 413 / retcode 1413).
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Longest line inside a chunked request body (chunk-size lines and trailers).
const MAX_LINE_BYTES: usize = 8 * 1024;

/// A parsed request line plus headers.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub method: String,
    /// Path part of the target, as sent (not percent-decoded).
    pub path: String,
    /// Query string without the `?`; empty when there was none.
    pub query: String,
    pub http10: bool,
    /// Header names lower-cased, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// First value of header `name` (which must be given in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether the connection stays open after the response.
    pub fn keep_alive(&self) -> bool {
        let has_token = |token: &str| {
            self.headers
                .iter()
                .filter(|(n, _)| n == "connection")
                .flat_map(|(_, v)| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if self.http10 { has_token("keep-alive") } else { !has_token("close") }
    }

    fn is_chunked(&self) -> bool {
        self.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    fn expects_continue(&self) -> bool {
        !self.http10 && self.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    }
}

/// Why a request could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer went away (EOF or socket error): nothing to answer.
    Gone,
    /// Not valid HTTP: answer 400 and close.
    Malformed(&'static str),
    /// The body exceeds [`MAX_BODY_BYTES`]: answer 413 and close.
    TooLarge,
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Gone
    }
}

/// One accepted connection.
pub(crate) struct Conn {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Self {
        // Small writes (split Stream frames) should leave at once, not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        Self { rd, wr, buf: Vec::new() }
    }

    /// Reads more bytes into the buffer; `Ok(0)` means EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(16 * 1024);
        self.rd.read_buf(&mut self.buf).await
    }

    /// Reads the next request head. [`ReadError::Gone`] on a clean close between requests.
    pub async fn read_head(&mut self) -> Result<Head, ReadError> {
        loop {
            // RFC 9112 §2.2: ignore empty lines before a request line.
            while self.buf.starts_with(b"\r\n") {
                self.buf.drain(..2);
            }
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let rest = self.buf.split_off(end + 4);
                let raw = std::mem::replace(&mut self.buf, rest);
                return parse_head(&raw[..end]);
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed("request head too large"));
            }
            if self.fill().await? == 0 {
                return Err(ReadError::Gone);
            }
        }
    }

    /// Reads the body that `head` announces (none if it announces none).
    pub async fn read_body(&mut self, head: &Head) -> Result<Vec<u8>, ReadError> {
        if head.is_chunked() {
            self.send_continue(head).await?;
            return self.read_chunked_body().await;
        }
        let Some(length) = head.header("content-length") else {
            return Ok(Vec::new());
        };
        let length: usize = length.trim().parse().map_err(|_| ReadError::Malformed("invalid content-length"))?;
        if length > MAX_BODY_BYTES {
            return Err(ReadError::TooLarge);
        }
        if length > 0 {
            self.send_continue(head).await?;
        }
        self.take(length).await
    }

    async fn send_continue(&mut self, head: &Head) -> io::Result<()> {
        if head.expects_continue() && self.buf.is_empty() {
            self.wr.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        Ok(())
    }

    /// Takes exactly `n` bytes from the connection.
    async fn take(&mut self, n: usize) -> Result<Vec<u8>, ReadError> {
        while self.buf.len() < n {
            if self.fill().await? == 0 {
                return Err(ReadError::Gone);
            }
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Reads one CRLF-terminated line (without the CRLF).
    async fn read_line(&mut self) -> Result<String, ReadError> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.take(end + 2).await?;
                return String::from_utf8(line[..end].to_vec()).map_err(|_| ReadError::Malformed("invalid chunk line"));
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(ReadError::Malformed("chunk line too long"));
            }
            if self.fill().await? == 0 {
                return Err(ReadError::Gone);
            }
        }
    }

    /// RFC 9112 §7.1: `size[;ext] CRLF data CRLF` ... `0 CRLF [trailers] CRLF`.
    async fn read_chunked_body(&mut self) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line().await?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| ReadError::Malformed("invalid chunk size"))?;
            if size == 0 {
                // Trailer fields (ignored) up to the empty line.
                while !self.read_line().await?.is_empty() {}
                return Ok(body);
            }
            if body.len().saturating_add(size) > MAX_BODY_BYTES {
                return Err(ReadError::TooLarge);
            }
            body.extend_from_slice(&self.take(size).await?);
            if !self.read_line().await?.is_empty() {
                return Err(ReadError::Malformed("chunk data not followed by CRLF"));
            }
        }
    }

    /// Waits until `deadline` (forever when `None`) while watching the socket.
    /// Returns `true` if the client closed the connection first. Bytes that
    /// arrive meanwhile (a pipelined request) are kept for later.
    pub async fn wait_for_close(&mut self, deadline: Option<Instant>) -> bool {
        loop {
            let read = match deadline {
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline) => return false,
                    read = self.fill() => read,
                },
                None => self.fill().await,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return true;
            }
        }
    }

    /// Writes a complete response framed by `Content-Length`. With `split`, the
    /// body goes out in pieces of that many bytes, one write each.
    pub async fn write_response(
        &mut self,
        status: u16,
        content_type: Option<&str>,
        body: &[u8],
        keep_alive: bool,
        split: Option<usize>,
    ) -> io::Result<()> {
        let head = response_head(status, content_type, Some(body.len()), keep_alive);
        match split {
            None => {
                let mut out = head.into_bytes();
                out.extend_from_slice(body);
                self.wr.write_all(&out).await?;
            }
            Some(n) => {
                self.wr.write_all(head.as_bytes()).await?;
                for piece in body.chunks(n.max(1)) {
                    self.wr.write_all(piece).await?;
                    self.wr.flush().await?;
                    tokio::task::yield_now().await;
                }
            }
        }
        self.wr.flush().await
    }

    /// Announces `Content-Length: body.len()` but sends only `body[..sent]`, then closes.
    pub async fn write_truncated(
        &mut self,
        status: u16,
        content_type: Option<&str>,
        body: &[u8],
        sent: usize,
    ) -> io::Result<()> {
        let mut out = response_head(status, content_type, Some(body.len()), true).into_bytes();
        out.extend_from_slice(&body[..sent.min(body.len())]);
        self.wr.write_all(&out).await?;
        self.wr.flush().await?;
        self.wr.shutdown().await
    }

    /// Starts a chunked response: status 200 and, like SnowLuma's Stream actions, no Content-Type.
    pub async fn start_chunked(&mut self, keep_alive: bool) -> io::Result<()> {
        let head = response_head(200, None, None, keep_alive);
        self.wr.write_all(head.as_bytes()).await
    }

    /// Sends one HTTP chunk (empty data is skipped: a zero-size chunk would end the body).
    pub async fn write_chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        self.wr.write_all(&out).await?;
        self.wr.flush().await
    }

    /// Ends a chunked response.
    pub async fn finish_chunked(&mut self) -> io::Result<()> {
        self.wr.write_all(b"0\r\n\r\n").await?;
        self.wr.flush().await
    }

    /// Closes after a final response: shuts our side, then drains what the client
    /// still sends for a moment, so the kernel does not answer unread input with
    /// a reset that could destroy the response before the client reads it.
    pub async fn close_gracefully(mut self) {
        if self.wr.shutdown().await.is_err() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut sink = [0u8; 16 * 1024];
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, self.rd.read(&mut sink)).await {
            if n == 0 {
                break;
            }
        }
    }
}

fn response_head(status: u16, content_type: Option<&str>, content_length: Option<usize>, keep_alive: bool) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    match content_length {
        Some(length) => head.push_str(&format!("Content-Length: {length}\r\n")),
        None => head.push_str("Transfer-Encoding: chunked\r\n"),
    }
    head.push_str(if keep_alive { "Connection: keep-alive\r\n" } else { "Connection: close\r\n" });
    head.push_str("\r\n");
    head
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

fn parse_head(raw: &[u8]) -> Result<Head, ReadError> {
    let text = std::str::from_utf8(raw).map_err(|_| ReadError::Malformed("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("invalid request line"));
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(ReadError::Malformed("unsupported HTTP version")),
    };
    // Absolute-form targets (`http://host/path`) are reduced to their path.
    let target = match target.strip_prefix("http://").or_else(|| target.strip_prefix("https://")) {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed("invalid header line"));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok(Head {
        method: method.to_string(),
        path: if path.is_empty() { "/".to_string() } else { path.to_string() },
        query: query.to_string(),
        http10,
        headers,
    })
}

/// Position of the first occurrence of `needle` in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Percent-decodes a URL component (`+` as space when `plus_is_space`).
/// Invalid escapes are kept literally.
pub(crate) fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |c: u8| char::from(c).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push((hi * 16 + lo) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits `a=1&b=2` into decoded pairs.
pub(crate) fn parse_urlencoded(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}
