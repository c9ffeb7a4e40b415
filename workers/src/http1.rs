//! The hot path for plain-HTTP endpoints: an ordinary (non-stream) call is
//! one HTTP/1.1 exchange on hyper's client connection, from a small
//! keep-alive pool of our own.
//!
//! reqwest stays for TLS endpoints, streams and transfers. For the common
//! ordinary call it adds, per request, a retry layer, a redirect layer that
//! re-parses the URL of every response, and pool bookkeeping; together they
//! cost the executor more CPU than the exchange itself.
//!
//! Semantics are reqwest's: the same headers, one request timeout covering
//! connect, send and the whole body, no redirects, and nothing retried
//! once it may have been sent. The one resend is of a request that hyper
//! hands back unsent because the pooled connection had already closed.
//! Dropping an exchange (cancellation, timeout) aborts its connection, so
//! SnowLuma sees the connection close.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

use snowluma_proto::TraceContext;

/// Idle connections kept per executor.
const MAX_IDLE: usize = 16;
/// An idle connection is reused only this long. Node's HTTP server (and so
/// a typical SnowLuma) closes idle keep-alive connections after 5 s; a
/// request sent just as the server closes may or may not have been read,
/// and a write's outcome would then be unknown. Not reusing connections
/// near that age keeps requests out of that window.
const IDLE_REUSE: Duration = Duration::from_secs(4);

pub(crate) struct Direct {
    addrs: Vec<SocketAddr>,
    /// Origin-form target (path and query of the endpoint).
    target: http::Uri,
    host: HeaderValue,
    auth: Option<HeaderValue>,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

/// One connection: its request handle and the task that drives it. Dropping
/// a `Conn` aborts the task, which closes the socket.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
    idle_since: Instant,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

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
        let target = target.parse::<http::Uri>().ok()?;
        // The Host header as reqwest writes it: the port only when explicit.
        let host = match endpoint.port() {
            Some(p) => format!("{host_str}:{p}"),
            None => host_str.to_owned(),
        };
        let host = HeaderValue::from_str(&host).ok()?;
        let auth = match token {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).ok()?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Some(Direct { addrs, target, host, auth, connect_timeout, idle: Mutex::new(Vec::new()) })
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        let mut last = String::from("no address");
        for addr in &self.addrs {
            let stream = match tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    last = e.to_string();
                    continue;
                }
                Err(_) => {
                    last = "connect timed out".into();
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| Failure::Connect(e.to_string()))?;
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            return Ok(Conn { sender, task, idle_since: Instant::now() });
        }
        Err(Failure::Connect(last))
    }

    /// An idle pooled connection that is still open and ready, if any.
    async fn checkout(&self) -> Option<Conn> {
        loop {
            let mut c = self.idle.lock().ok()?.pop()?;
            if c.sender.is_closed() || c.idle_since.elapsed() >= IDLE_REUSE {
                continue;
            }
            // Nothing is in flight on an idle connection, so this only waits
            // for its task to finish the previous exchange; an error means
            // the connection closed meanwhile (and nothing was sent).
            if c.sender.ready().await.is_ok() {
                return Some(c);
            }
        }
    }

    fn checkin(&self, mut c: Conn) {
        if c.sender.is_closed() {
            return;
        }
        c.idle_since = Instant::now();
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(c);
        }
    }

    fn build(&self, body: &Bytes, trace: &TraceContext) -> Result<http::Request<Full<Bytes>>, Failure> {
        let mut b = http::Request::post(self.target.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header("traceparent", trace.traceparent.as_str());
        if let Some(ts) = &trace.tracestate {
            b = b.header("tracestate", ts.as_str());
        }
        if let Some(a) = &self.auth {
            b = b.header(AUTHORIZATION, a.clone());
        }
        // A request that cannot be built was never sent.
        b.body(Full::new(body.clone())).map_err(|e| Failure::NotSent(e.to_string()))
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
        let body = Bytes::from(body);
        let (mut conn, reused) = match self.checkout().await {
            Some(c) => (c, true),
            None => (self.connect().await?, false),
        };
        let resp = match conn.sender.try_send_request(self.build(&body, trace)?).await {
            Ok(r) => r,
            Err(mut e) => {
                let unsent = e.take_message().is_some();
                if !unsent {
                    return Err(Failure::Exchange { stage: "request", detail: e.into_error().to_string() });
                }
                if !reused {
                    return Err(Failure::NotSent(e.into_error().to_string()));
                }
                // The pooled connection closed before the request was
                // written: it never left, so it goes once on a new one.
                drop(conn);
                conn = self.connect().await?;
                conn.sender
                    .send_request(self.build(&body, trace)?)
                    .await
                    .map_err(|e| Failure::Exchange { stage: "request", detail: e.to_string() })?
            }
        };
        let status = resp.status().as_u16();
        head.store(true, Ordering::Relaxed);
        let mut incoming = resp.into_body();
        let mut out = Vec::new();
        while let Some(frame) = incoming.frame().await {
            let frame =
                frame.map_err(|e| Failure::Exchange { stage: "reading the response", detail: e.to_string() })?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > cap {
                    return Err(Failure::TooLarge(status));
                }
                out.extend_from_slice(&data);
            }
        }
        self.checkin(conn);
        Ok((status, out))
    }
}
