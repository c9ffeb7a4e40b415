//! The network executor: the only process that opens connections to
//! SnowLuma and the only one that holds the endpoint and token (received
//! over IPC after the handshake, never from the environment).
//!
//! One `reqwest` client with a keep-alive pool POSTs `{action, params}` to
//! the endpoint exactly as configured. Every request carries the call's
//! `traceparent` (and validated `tracestate`) as HTTP headers, never in the
//! OneBot params. Nothing is retried. Cancellation drops the exchange,
//! including a body still being read, which closes the connection.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use std::os::fd::FromRawFd;

use snowluma_proto::{
    Diagnostics, ExecRequest, FailureKind, JsonText, NetworkConfig, Outcome, Reply, Request, ToolReply, Transfer,
    WorkerConfig, WorkerError,
};
use tokio::sync::Semaphore;

use crate::serve::{Ctx, RoleHandler};

/// Largest ordinary response body accepted. The body travels unchanged as
/// the reply's result, so it must fit in one IPC frame with the rest of the
/// reply (diagnostics, whose echoed wording is capped at
/// [`MAX_WORDING_CHARS`]): a larger body is refused here with a clear error
/// instead of producing a reply that cannot be sent.
pub const MAX_BODY_BYTES: usize = snowluma_proto::MAX_FRAME_BYTES - 1024 * 1024;
/// SnowLuma's wording is copied into `diagnostics.message` up to this many
/// characters (the whole envelope, wording included, stays in the result).
pub const MAX_WORDING_CHARS: usize = 1024;
/// Deepest nesting of a response accepted: what the supervisor's JSON parser
/// (serde_json's default limit) can represent. Deeper is an invalid response,
/// never a success with a null result.
pub const MAX_RESPONSE_DEPTH: usize = 128;
/// Largest single stream frame.
pub const MAX_FRAME_BYTES: usize = 24 * 1024 * 1024;
/// Generic streams: frames and summed frame text kept in the result.
pub const MAX_GENERIC_FRAMES: usize = 256;
pub const MAX_GENERIC_TEXT: usize = 256 * 1024;
/// Stream actions active at once.
pub const MAX_ACTIVE_STREAMS: usize = 4;
/// Ordinary calls with a connection to SnowLuma at once; further calls wait
/// (cancellably) for one to finish. Bounds the executor's sockets well below
/// the descriptor limit however many calls the client pipelines.
pub const MAX_ACTIVE_CALLS: usize = 64;

pub(crate) struct Net {
    pub(crate) client: reqwest::Client,
    /// The ordinary-call hot path for plain-HTTP endpoints ([`crate::http1`]).
    direct: Option<crate::http1::Direct>,
    endpoint: reqwest::Url,
    token: Option<String>,
    pub(crate) timeout: Duration,
    streams: Arc<Semaphore>,
    calls: Semaphore,
}

#[derive(Default)]
pub struct NetworkWorker {
    net: OnceLock<Net>,
    /// File descriptors handed over by the supervisor for transfers.
    fds: OnceLock<snowluma_proto::fdpass::FdReceiver>,
}

impl NetworkWorker {
    /// Claims the inherited descriptor channel, if any. Call once, at startup.
    pub fn from_inherited() -> NetworkWorker {
        NetworkWorker { net: OnceLock::new(), fds: OnceLock::new() }
    }
}

fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn build(cfg: NetworkConfig) -> Result<Net, String> {
    let endpoint = reqwest::Url::parse(&cfg.endpoint).map_err(|_| "the endpoint is not a valid URL".to_owned())?;
    let mut builder = reqwest::Client::builder();
    if let Some(host) = endpoint.host_str()
        && host.parse::<std::net::IpAddr>().is_err()
        && !cfg.resolved.is_empty()
    {
        builder = builder.resolve_to_addrs(host, &cfg.resolved);
    }
    let client = builder
        .tls_backend_preconfigured(tls_config()?)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        // Nothing is ever retried. Zero attempts also spares reqwest's retry
        // layer from cloning every request up front in case it retries.
        .retry(reqwest::retry::never().max_retries_per_request(0))
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(16)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_millis(cfg.timeout_ms))
        .build()
        .map_err(|e| format!("HTTP client setup: {}", e.without_url()))?;
    let direct = crate::http1::Direct::new(
        &endpoint,
        &cfg.resolved,
        cfg.token.as_deref(),
        Duration::from_millis(cfg.timeout_ms),
    );
    Ok(Net {
        client,
        direct,
        endpoint,
        token: cfg.token,
        timeout: Duration::from_millis(cfg.timeout_ms),
        streams: Arc::new(Semaphore::new(MAX_ACTIVE_STREAMS)),
        calls: Semaphore::new(MAX_ACTIVE_CALLS),
    })
}

impl RoleHandler for NetworkWorker {
    fn configure(&self, config: WorkerConfig) -> Result<(), String> {
        match config {
            WorkerConfig::Network(cfg) => {
                let net = build(cfg)?;
                // SAFETY: F_GETFD only queries the descriptor table.
                let open = unsafe { nix::libc::fcntl(snowluma_proto::NETWORK_FD_CHANNEL, nix::libc::F_GETFD) } >= 0;
                if open {
                    // SAFETY: the supervisor placed the fd channel here before exec;
                    // configure runs once, so nothing else takes ownership of it.
                    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(snowluma_proto::NETWORK_FD_CHANNEL) };
                    let rx = snowluma_proto::fdpass::FdReceiver::spawn(fd).map_err(|e| format!("fd channel: {e}"))?;
                    let _ = self.fds.set(rx);
                }
                self.net.set(net).map_err(|_| "already configured".to_owned())
            }
            _ => Err("network executor needs a network configuration".into()),
        }
    }

    async fn handle(&self, request: Request, ctx: Ctx) -> Reply {
        let Some(net) = self.net.get() else {
            return Reply::Error(WorkerError::Internal("not configured".into()));
        };
        match request {
            Request::Execute(req) => Reply::Tool(execute(net, self.fds.get(), req, &ctx).await),
            _ => Reply::Error(WorkerError::Unsupported),
        }
    }
}

/// How a failed exchange is reported: a read that failed simply failed; a
/// write whose request may have reached SnowLuma has an unknown outcome.
pub(crate) fn transport_failure(kind: FailureKind, msg: String, write: bool, maybe_sent: bool) -> ToolReply {
    let d = if write && maybe_sent {
        Diagnostics::unknown(kind, msg).with_next_step(
            "The request may have reached SnowLuma: check whether the action took effect before sending it again.",
        )
    } else {
        Diagnostics::failed(kind, msg).with_next_step(match kind {
            FailureKind::Timeout => {
                "Check that SnowLuma is running and responsive; raise SNOWLUMA_MCP_TIMEOUT_MS if it is slow."
            }
            _ => "Check that SnowLuma is running and that SNOWLUMA_MCP_ENDPOINT points at its HTTP server.",
        })
    };
    ToolReply::error(d)
}

pub(crate) fn reqwest_failure(e: &reqwest::Error, write: bool, stage: &str) -> ToolReply {
    let detail = format!("{stage}: {}", strip_url(e));
    if e.is_timeout() {
        transport_failure(FailureKind::Timeout, format!("SnowLuma did not answer in time ({detail})"), write, true)
    } else if e.is_connect() {
        transport_failure(FailureKind::Transport, format!("cannot connect to SnowLuma ({detail})"), write, false)
    } else {
        transport_failure(FailureKind::Transport, format!("connection to SnowLuma failed ({detail})"), write, true)
    }
}

fn direct_failure(f: crate::http1::Failure, write: bool) -> ToolReply {
    use crate::http1::Failure;
    match f {
        Failure::Connect(e) => transport_failure(
            FailureKind::Transport,
            format!("cannot connect to SnowLuma (request: {e})"),
            write,
            false,
        ),
        Failure::NotSent(e) => transport_failure(
            FailureKind::Transport,
            format!("connection to SnowLuma failed before the request was sent ({e})"),
            write,
            false,
        ),
        Failure::Exchange { stage, detail } => transport_failure(
            FailureKind::Transport,
            format!("connection to SnowLuma failed ({stage}: {detail})"),
            write,
            true,
        ),
        Failure::TooLarge => transport_failure(
            FailureKind::InvalidResponse,
            format!("SnowLuma's response exceeds {MAX_BODY_BYTES} bytes"),
            write,
            true,
        ),
    }
}

fn strip_url(e: &reqwest::Error) -> String {
    // reqwest's Display names the URL; the endpoint is not for the client.
    let mut s = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut first = true;
    while let Some(err) = cur {
        let text = if first {
            let mut t = err.to_string();
            if let Some(i) = t.find(" for url (") {
                t.truncate(i);
            }
            t
        } else {
            err.to_string()
        };
        if !s.contains(&text) {
            if !s.is_empty() {
                s.push_str(": ");
            }
            s.push_str(&text);
        }
        first = false;
        cur = err.source();
    }
    s
}

/// The deepest nesting of arrays and objects in JSON text (valid JSON:
/// brackets inside strings are skipped). One pass, no allocation.
fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// SnowLuma's human-readable reason in an envelope or frame, if any.
fn wording(env: &Value) -> Option<String> {
    first_wording(["wording", "message", "msg"].map(|k| env.get(k).and_then(Value::as_str)))
}

/// The first non-empty of `wording`, `message`, `msg` (in that order).
fn first_wording(candidates: [Option<&str>; 3]) -> Option<String> {
    candidates.into_iter().flatten().find(|s| !s.is_empty()).map(str::to_owned)
}

/// Classify a OneBot envelope.
pub fn classify(env: &Value) -> Diagnostics {
    classify_fields(env.get("status").and_then(Value::as_str), env.get("retcode").and_then(Value::as_i64), wording(env))
}

/// The envelope fields that decide an outcome, read without building the
/// whole response as a `Value` (the response text itself is passed on
/// unchanged). Every other field is skipped, though still checked as JSON.
#[derive(serde::Deserialize)]
struct EnvelopeFields {
    #[serde(default)]
    status: Option<Value>,
    #[serde(default)]
    retcode: Option<Value>,
    #[serde(default)]
    wording: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    msg: Option<Value>,
}

/// Classify a response body that must be a JSON object; `None` when it is
/// not one (the caller reports why). Same answers as [`classify`].
fn classify_body(body: &[u8]) -> Option<Diagnostics> {
    // A derived struct would also accept an array (fields by position).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let f: EnvelopeFields = match serde_json::from_slice(body) {
        Ok(f) => f,
        // Not an object, or an object this shortcut cannot read (e.g. a
        // duplicate key): the general path decides.
        Err(_) => {
            let v: Value = serde_json::from_slice(body).ok()?;
            return v.is_object().then(|| classify(&v));
        }
    };
    let wording = first_wording([&f.wording, &f.message, &f.msg].map(|v| v.as_ref().and_then(Value::as_str)));
    Some(classify_fields(
        f.status.as_ref().and_then(Value::as_str),
        f.retcode.as_ref().and_then(Value::as_i64),
        wording,
    ))
}

fn classify_fields(status: Option<&str>, retcode: Option<i64>, wording: Option<String>) -> Diagnostics {
    match (status, retcode) {
        (Some("ok"), Some(0)) => Diagnostics::success(),
        (Some("async"), _) | (_, Some(1)) => Diagnostics::unknown(
            FailureKind::AsyncAcknowledged,
            "SnowLuma accepted the action asynchronously; its outcome is not confirmed",
        )
        .with_next_step("Check the action's effect before repeating it."),
        (Some("failed"), _) | (_, Some(_)) if retcode != Some(0) || status == Some("failed") => {
            let rc = retcode.map(|r| r.to_string()).unwrap_or_else(|| "none".into());
            let msg = match &wording {
                Some(w) if w.chars().count() > MAX_WORDING_CHARS => {
                    let head: String = w.chars().take(MAX_WORDING_CHARS).collect();
                    format!(
                        "SnowLuma reported a failure (retcode {rc}): {head}… (wording cut; the whole envelope is the result)"
                    )
                }
                Some(w) => format!("SnowLuma reported a failure (retcode {rc}): {w}"),
                None => format!("SnowLuma reported a failure (retcode {rc})"),
            };
            let next = match retcode {
                Some(1400) => "Check the params against get_action's inputSchema.",
                Some(1401) | Some(1403) => "SNOWLUMA_MCP_TOKEN must match SnowLuma's access token.",
                Some(1404) => "The connected SnowLuma does not offer this action; the catalog is a bundled snapshot.",
                Some(1413) => "The request body is too large; send big files with upload_file_stream.",
                _ => "Read the wording; fix the cause before trying again.",
            };
            Diagnostics::failed(FailureKind::BusinessFailure, msg).with_next_step(next)
        }
        _ => {
            Diagnostics::unknown(FailureKind::Unconfirmed, "the response does not confirm success (no status/retcode)")
                .with_next_step("Check the action's effect before repeating it.")
        }
    }
}

pub(crate) fn request(net: &Net, req: &ExecRequest, params: Value) -> reqwest::RequestBuilder {
    request_with_body(net, req, json!({"action": req.action, "params": params}).to_string())
}

/// `{"action": ..., "params": ...}` from params text already checked to be
/// one JSON object, without parsing it into a `Value` and printing it again.
fn body_text(action: &str, params: &str) -> String {
    let action = Value::from(action).to_string();
    [r#"{"action":"#, &action, r#","params":"#, params.trim(), "}"].concat()
}

/// Whether `text` is exactly one JSON object.
fn is_json_object(text: &str) -> bool {
    text.trim_start().starts_with('{') && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

fn request_with_body(net: &Net, req: &ExecRequest, body: String) -> reqwest::RequestBuilder {
    let mut rb = net
        .client
        .post(net.endpoint.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(reqwest::header::ACCEPT, "application/json")
        .header("traceparent", req.trace.traceparent.as_str())
        .body(body);
    if let Some(ts) = &req.trace.tracestate {
        rb = rb.header("tracestate", ts.as_str());
    }
    if let Some(t) = &net.token {
        rb = rb.bearer_auth(t);
    }
    rb
}

async fn execute(
    net: &Net,
    fds: Option<&snowluma_proto::fdpass::FdReceiver>,
    req: ExecRequest,
    ctx: &Ctx,
) -> ToolReply {
    if req.stream {
        let tag = req.transfer.as_ref().map(|t| match t {
            Transfer::Download { fd_tag, .. } | Transfer::Upload { fd_tag, .. } => *fd_tag,
        });
        // A transfer refused before its descriptor is claimed must not leave
        // the descriptor (sent ahead of this request) in the table.
        let forget = || {
            if let (Some(tag), Some(rx)) = (tag, fds) {
                rx.discard(tag);
            }
        };
        let params = match req.params.parse() {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                forget();
                return ToolReply::fail(FailureKind::InvalidArguments, "params must be a JSON object");
            }
        };
        let Ok(_permit) = net.streams.clone().try_acquire_owned() else {
            forget();
            return ToolReply::fail(
                FailureKind::Execution,
                format!("active stream limit reached ({MAX_ACTIVE_STREAMS}); wait for one to finish"),
            );
        };
        let transfer_fd = match tag {
            None => None,
            Some(tag) => {
                let claimed = match fds {
                    Some(rx) => rx.claim(tag, Duration::from_secs(10)).await.map_err(|e| e.to_string()),
                    None => Err("no descriptor channel".to_owned()),
                };
                match claimed {
                    Ok(fd) => Some(std::fs::File::from(fd)),
                    Err(e) => {
                        return ToolReply::fail(
                            FailureKind::Execution,
                            format!("the transfer file did not arrive: {e}"),
                        );
                    }
                }
            }
        };
        return match (req.transfer.clone(), transfer_fd) {
            (Some(Transfer::Download { limit_bytes, .. }), Some(file)) => {
                tokio::select! {
                    r = crate::transfer::download(net, &req, params, file, limit_bytes, ctx) => r,
                    _ = ctx.cancel.cancelled() => cancelled(req.write),
                }
            }
            (Some(Transfer::Upload { size, filename, chunk_bytes, .. }), Some(file)) => {
                crate::transfer::upload(net, &req, params, file, size, filename, chunk_bytes, ctx).await
            }
            _ if snowluma_proto::FILE_DOWNLOAD_ACTIONS.contains(&req.action.as_str()) => {
                ToolReply::fail(FailureKind::Execution, "file downloads need a download file from the supervisor")
            }
            _ => tokio::select! {
                r = generic_stream(net, &req, params, ctx) => r,
                _ = ctx.cancel.cancelled() => cancelled(req.write),
            },
        };
    }
    // Ordinary calls: checked, not parsed; the text goes into the body as is.
    if !is_json_object(&req.params.0) {
        return ToolReply::fail(FailureKind::InvalidArguments, "params must be a JSON object");
    }
    // Nothing has been sent while waiting for a turn: a cancel here is clean.
    let _turn = tokio::select! {
        p = net.calls.acquire() => match p {
            Ok(p) => p,
            Err(_) => return ToolReply::fail(FailureKind::Execution, "the executor is shutting down"),
        },
        _ = ctx.cancel.cancelled() => return cancelled(false),
    };
    let exchange = async {
        if let Some(direct) = &net.direct {
            let body = body_text(&req.action, &req.params.0);
            return match tokio::time::timeout(net.timeout, direct.post(body, &req.trace, MAX_BODY_BYTES)).await {
                Ok(Ok(x)) => Ok(x),
                Ok(Err(f)) => Err(direct_failure(f, req.write)),
                Err(_) => Err(transport_failure(
                    FailureKind::Timeout,
                    "SnowLuma did not answer in time (request: operation timed out)".into(),
                    req.write,
                    true,
                )),
            };
        }
        let resp = request_with_body(net, &req, body_text(&req.action, &req.params.0))
            .timeout(net.timeout)
            .send()
            .await
            .map_err(|e| reqwest_failure(&e, req.write, "request"))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp, MAX_BODY_BYTES).await.map_err(|e| match e {
            BodyError::Http(e) => reqwest_failure(&e, req.write, "reading the response"),
            BodyError::TooLarge => transport_failure(
                FailureKind::InvalidResponse,
                format!("SnowLuma's response exceeds {MAX_BODY_BYTES} bytes"),
                req.write,
                true,
            ),
        })?;
        Ok::<_, ToolReply>((status, body))
    };
    let (status, body) = tokio::select! {
        r = exchange => match r {
            Ok(x) => x,
            Err(reply) => return reply,
        },
        _ = ctx.cancel.cancelled() => return cancelled(req.write),
    };
    let Some(diag) = classify_body(&body) else {
        let msg = if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
            format!("SnowLuma returned an unexpected response (HTTP {status})")
        } else {
            format!("SnowLuma returned non-JSON (HTTP {status})")
        };
        return transport_failure(FailureKind::InvalidResponse, msg, req.write, true);
    };
    if nesting_depth(&body) > MAX_RESPONSE_DEPTH {
        return transport_failure(
            FailureKind::InvalidResponse,
            format!("SnowLuma's response nests deeper than {MAX_RESPONSE_DEPTH} levels, which cannot be represented"),
            req.write,
            true,
        );
    }
    // Valid JSON is valid UTF-8, so this never copies.
    let text = String::from_utf8(body).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    ToolReply { result: Some(JsonText(text)), diagnostics: diag, is_error: false }
}

pub(crate) fn cancelled(write: bool) -> ToolReply {
    let d = Diagnostics {
        outcome: if write { Outcome::Unknown } else { Outcome::Failed },
        kind: Some(FailureKind::Cancelled),
        message: Some(if write {
            "cancelled; the action may already have reached SnowLuma, so its outcome is unknown".into()
        } else {
            "cancelled".into()
        }),
        next_step: None,
    };
    ToolReply::error(d)
}

enum BodyError {
    Http(reqwest::Error),
    TooLarge,
}

async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Http)? {
        if out.len() + chunk.len() > cap {
            return Err(BodyError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Splits a byte stream into `\r\n\r\n`-terminated frames.
#[derive(Default)]
pub struct FrameSplitter {
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a separator (minus 3, so that a
    /// separator split across two pushes is still found): each byte is
    /// scanned once, not once per push.
    scanned: usize,
}

impl FrameSplitter {
    /// Feed bytes; returns complete frames, or an error when one exceeds `max`.
    pub fn push(&mut self, bytes: &[u8], max: usize) -> Result<Vec<Vec<u8>>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut search_from = self.scanned;
        while let Some(pos) = find(&self.buf[search_from..], b"\r\n\r\n").map(|p| p + search_from) {
            let frame = &self.buf[start..pos];
            if !frame.iter().all(u8::is_ascii_whitespace) {
                out.push(frame.to_vec());
            }
            start = pos + 4;
            search_from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len().saturating_sub(3);
        if self.buf.len() > max {
            return Err(format!("a stream frame exceeds {max} bytes"));
        }
        Ok(out)
    }

    /// Whatever is left at the end of the body (a final frame without separator).
    pub fn finish(self) -> Option<Vec<u8>> {
        if self.buf.iter().all(u8::is_ascii_whitespace) { None } else { Some(self.buf) }
    }
}

/// Read a stream body frame by frame, with the per-read idle timeout, and
/// hand each complete frame (including a final one without separator) to
/// `handle`. `what` names the stream in timeout messages.
pub(crate) async fn for_each_frame(
    net: &Net,
    req: &ExecRequest,
    resp: &mut reqwest::Response,
    what: &str,
    mut handle: impl FnMut(Vec<u8>) -> Result<(), ToolReply>,
) -> Result<(), ToolReply> {
    let mut splitter = FrameSplitter::default();
    loop {
        let chunk = match tokio::time::timeout(net.timeout, resp.chunk()).await {
            Err(_) => {
                return Err(transport_failure(
                    FailureKind::Timeout,
                    format!("the {what} was idle for too long"),
                    req.write,
                    true,
                ));
            }
            Ok(Err(e)) => return Err(reqwest_failure(&e, req.write, &format!("reading the {what}"))),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        let ready = splitter
            .push(&chunk, MAX_FRAME_BYTES)
            .map_err(|m| transport_failure(FailureKind::InvalidResponse, m, req.write, true))?;
        for raw in ready {
            handle(raw)?;
        }
    }
    match splitter.finish() {
        Some(rest) => handle(rest),
        None => Ok(()),
    }
}

fn find(hay: &[u8], needle: &[u8; 4]) -> Option<usize> {
    // Look for the separator's last byte with a fast byte scan, then check.
    let mut i = 3;
    while i < hay.len() {
        match hay[i..].iter().position(|b| *b == needle[3]) {
            None => return None,
            Some(off) => {
                let end = i + off;
                if hay[end - 3..=end] == needle[..] {
                    return Some(end - 3);
                }
                i = end + 1;
            }
        }
    }
    None
}

pub(crate) fn frame_failure(frame: &Value) -> Option<String> {
    let status = frame.get("status").and_then(Value::as_str);
    let retcode = frame.get("retcode").and_then(Value::as_i64);
    let is_error = frame.pointer("/data/type").and_then(Value::as_str) == Some("error");
    if status == Some("ok") && retcode == Some(0) && !is_error {
        return None;
    }
    let why = wording(frame)
        .unwrap_or_else(|| format!("retcode {}", retcode.map(|r| r.to_string()).unwrap_or_else(|| "none".into())));
    Some(why)
}

/// A generic stream (a bounded collection of frames, unlike file transfers)
/// must finish within the request timeout as a whole, not only between
/// reads: a server trickling a byte at a time would otherwise hold it open
/// for ever under the idle timeout.
async fn generic_stream(net: &Net, req: &ExecRequest, params: Value, ctx: &Ctx) -> ToolReply {
    match tokio::time::timeout(net.timeout, generic_stream_inner(net, req, params, ctx)).await {
        Ok(reply) => reply,
        Err(_) => transport_failure(
            FailureKind::Timeout,
            format!(
                "the stream did not finish within {} ms (SNOWLUMA_MCP_TIMEOUT_MS bounds a whole generic stream)",
                net.timeout.as_millis()
            ),
            req.write,
            true,
        ),
    }
}

async fn generic_stream_inner(net: &Net, req: &ExecRequest, params: Value, ctx: &Ctx) -> ToolReply {
    let send = tokio::time::timeout(net.timeout, request(net, req, params.clone()).send()).await;
    let mut resp = match send {
        Err(_) => {
            return transport_failure(
                FailureKind::Timeout,
                "SnowLuma did not start the stream in time".into(),
                req.write,
                true,
            );
        }
        Ok(Err(e)) => return reqwest_failure(&e, req.write, "stream request"),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        return transport_failure(
            FailureKind::InvalidResponse,
            format!("SnowLuma answered the stream with HTTP {}", status.as_u16()),
            req.write,
            true,
        );
    }
    let upload = req.action == "upload_file_stream";
    let is_reset = upload && params.get("reset").and_then(Value::as_bool) == Some(true);
    let mut frames: Vec<Value> = Vec::new();
    let mut terminal: Option<Value> = None;
    let mut text_total = 0usize;
    let mut accepted = 0u64;
    let mut handle = |raw: Vec<u8>, frames: &mut Vec<Value>, terminal: &mut Option<Value>| -> Result<(), ToolReply> {
        let invalid = |m: String| transport_failure(FailureKind::InvalidResponse, m, req.write, true);
        if terminal.is_some() {
            return Err(invalid("SnowLuma sent a frame after the terminal frame".into()));
        }
        text_total += raw.len();
        if text_total > MAX_GENERIC_TEXT {
            return Err(invalid(format!("the stream's frames exceed {MAX_GENERIC_TEXT} bytes of text")));
        }
        let frame: Value = serde_json::from_slice(&raw)
            .map_err(|_| invalid("SnowLuma sent a stream frame that is not JSON".into()))?;
        if !frame.is_object() {
            return Err(invalid("SnowLuma sent a stream frame that is not an object".into()));
        }
        if let Some(why) = frame_failure(&frame) {
            if is_reset && why.contains("Stream reset completed") {
                *terminal = Some(frame);
                return Ok(());
            }
            return Err(ToolReply::error(
                Diagnostics::failed(FailureKind::BusinessFailure, format!("stream ended with an error: {why}"))
                    .with_next_step("Read the error; fix the cause before starting the stream again."),
            ));
        }
        if frame.pointer("/data/type").and_then(Value::as_str) == Some("response") {
            *terminal = Some(frame);
        } else {
            if frames.len() >= MAX_GENERIC_FRAMES {
                return Err(invalid(format!("the stream sent more than {MAX_GENERIC_FRAMES} frames")));
            }
            frames.push(frame);
        }
        Ok(())
    };
    let read = for_each_frame(net, req, &mut resp, "stream", |raw| {
        handle(raw, &mut frames, &mut terminal)?;
        accepted += 1;
        if req.progress {
            ctx.progress(snowluma_proto::Progress { progress: accepted as f64, total: None, message: None });
        }
        Ok(())
    })
    .await;
    if let Err(reply) = read {
        return reply;
    }
    // A single upload acknowledgement (one frame, type "stream") is complete.
    if terminal.is_none() && upload && frames.len() == 1 {
        terminal = frames.pop();
    }
    let Some(terminal) = terminal else {
        return transport_failure(
            FailureKind::InvalidResponse,
            "the stream ended without a terminal frame".into(),
            req.write,
            true,
        );
    };
    let result = json!({"frame_count": frames.len() + 1, "frames": frames, "terminal": terminal});
    let diag = if is_reset { Diagnostics::success() } else { classify(&terminal) };
    ToolReply::with_diagnostics(&result, diag)
}

#[cfg(test)]
mod tests {
    #[test]
    fn nesting_depth_skips_strings() {
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":"[[[{{"}]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a":"\"[[["}"#), 1);
        assert_eq!(nesting_depth(b"1"), 0);
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(nesting_depth(deep.as_bytes()), 100_000);
    }

    #[test]
    fn long_wording_is_cut_in_the_message() {
        let w = "x".repeat(9 * 1024 * 1024);
        let d = classify_fields(Some("failed"), Some(100), Some(w));
        assert!(d.message.unwrap().len() < MAX_WORDING_CHARS + 200);
    }

    use super::*;

    #[test]
    fn splits_frames_at_any_boundary() {
        let body = b"{\"a\":1}\r\n\r\n{\"b\":2}\r\n\r\n{\"c\":3}\r\n\r\n";
        for cut in 1..body.len() {
            let mut s = FrameSplitter::default();
            let mut got = s.push(&body[..cut], 100).unwrap();
            got.extend(s.push(&body[cut..], 100).unwrap());
            assert!(s.finish().is_none());
            assert_eq!(got.len(), 3, "cut {cut}");
        }
        let mut s = FrameSplitter::default();
        assert!(s.push(&[b'x'; 200], 100).is_err());
    }

    #[test]
    fn classifies_envelopes() {
        assert_eq!(classify(&json!({"status":"ok","retcode":0,"data":null})).outcome, Outcome::Success);
        // The shortcut on response bodies agrees with the Value path.
        for body in [
            r#"{"status":"ok","retcode":0,"data":{"online":true}}"#,
            r#"{"status":"failed","retcode":1400,"data":null,"wording":"group_id: is required"}"#,
            r#"{"status":"failed","retcode":1404,"message":"","msg":"no such action"}"#,
            r#"{"status":"async","retcode":1}"#,
            r#"{"data":{}}"#,
            r#"{"status":"ok","retcode":100}"#,
            r#"{"status":"ok","retcode":"0"}"#,
            r#"{"status":"ok","status":"failed","retcode":0}"#,
        ] {
            let v: Value = serde_json::from_str(body).unwrap();
            assert_eq!(classify_body(body.as_bytes()), Some(classify(&v)), "{body}");
        }
        for not_object in [&b"[1,2]"[..], b"\"ok\"", b"{\"status\":", b"", b"{} x"] {
            assert_eq!(classify_body(not_object), None);
        }
        assert_eq!(body_text("get_status", " {} "), r#"{"action":"get_status","params":{}}"#);
        assert_eq!(body_text("a\"b", r#"{"x":[1]}"#), r#"{"action":"a\"b","params":{"x":[1]}}"#);
        assert!(
            is_json_object(r#" {"a":1} "#) && !is_json_object("[]") && !is_json_object("{") && !is_json_object("{} {}")
        );
        let d = classify(&json!({"status":"failed","retcode":1400,"data":null,"wording":"group_id: is required"}));
        assert_eq!((d.outcome, d.kind), (Outcome::Failed, Some(FailureKind::BusinessFailure)));
        assert!(d.message.unwrap().contains("group_id"));
        assert_eq!(classify(&json!({"status":"async","retcode":1})).outcome, Outcome::Unknown);
        assert_eq!(classify(&json!({"data":{}})).outcome, Outcome::Unknown);
        assert_eq!(classify(&json!({"status":"ok","retcode":100})).outcome, Outcome::Failed);
    }
}
