//! The HTTP client: one `reqwest` client with a keep-alive pool (and, for
//! plain-HTTP endpoints, the hot path of [`crate::http1`]), the
//! request every call sends, and ordinary (non-stream) calls with their
//! timeout, body cap and classification.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_proto::{ExecRequest, FailureKind, JsonText, NetworkConfig, ToolReply};
use tokio::sync::Semaphore;

use super::MAX_BODY_BYTES;
use super::envelope::{MAX_RESPONSE_DEPTH, classify_body, too_deep};
use super::errors::{
    ABORTED_BY_TIMEOUT, ExecFailure, FETCH_FAILED, MAX_CALL_STACK, TERMINATED, cancelled, request_failed,
    reqwest_request_failure,
};
use super::json_syntax;
use super::streams::MAX_ACTIVE_STREAMS;
use crate::serve::Ctx;

/// Ordinary calls with a connection to SnowLuma at once; further calls wait
/// (cancellably) for one to finish. Bounds the executor's sockets well below
/// the descriptor limit however many calls the client pipelines.
pub const MAX_ACTIVE_CALLS: usize = 64;

pub(crate) struct Net {
    pub(crate) client: reqwest::Client,
    /// The ordinary-call hot path for plain-HTTP endpoints ([`crate::http1`]).
    direct: Option<crate::http1::Direct>,
    endpoint: reqwest::Url,
    pub(super) token: Option<String>,
    /// The event WebSocket, when configured.
    pub(super) events: Option<snowluma_proto::EventsTarget>,
    pub(crate) timeout: Duration,
    pub(super) streams: Arc<Semaphore>,
    calls: Semaphore,
    /// `SNOWLUMA_MCP_MAX_STREAM_BYTES`.
    pub(crate) max_stream_bytes: u64,
    /// Bytes of the download quota held by the downloads running now (what
    /// each announced, or its whole reservation before it did).
    pub(crate) downloads_reserved: AtomicU64,
}

pub(super) fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

pub(super) fn build(cfg: NetworkConfig) -> Result<Net, String> {
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
        events: cfg.events,
        timeout: Duration::from_millis(cfg.timeout_ms),
        streams: Arc::new(Semaphore::new(MAX_ACTIVE_STREAMS)),
        calls: Semaphore::new(MAX_ACTIVE_CALLS),
        max_stream_bytes: cfg.max_stream_bytes,
        downloads_reserved: AtomicU64::new(0),
    })
}

pub(crate) fn request(net: &Net, req: &ExecRequest, params: Value) -> reqwest::RequestBuilder {
    request_with_body(net, req, json!({"action": req.action, "params": params}).to_string())
}

/// `{"action": ..., "params": ...}` from params text already checked to be
/// one JSON object, without parsing it into a `Value` and printing it again.
fn body_text(action: &str, params: &str) -> String {
    let params = params.trim();
    let mut out = Vec::with_capacity(action.len() + params.len() + 24);
    out.extend_from_slice(br#"{"action":"#);
    // A string's JSON text (what `Value::from(action).to_string()` writes);
    // writing a `&str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut out, action);
    out.extend_from_slice(br#","params":"#);
    out.extend_from_slice(params.as_bytes());
    out.push(b'}');
    // Both parts are UTF-8 text.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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

/// An ordinary call: the params text goes into the body unparsed; the
/// response body is classified and passed on unchanged.
pub(super) async fn call(net: &Net, req: &ExecRequest, ctx: &Ctx) -> ToolReply {
    // Ordinary calls: checked, not parsed; the text goes into the body as is.
    if !is_json_object(&req.params.0) {
        return ToolReply::fail(FailureKind::InvalidArguments, "params must be a JSON object");
    }
    // A free turn is taken at once (the usual case: no wait, so nothing to
    // cancel). Permits a call releases go to the calls waiting first, so
    // taking a free one never passes a waiting call.
    let shutting_down = || ToolReply::fail(FailureKind::Execution, "the executor is shutting down");
    let _turn = match net.calls.try_acquire() {
        Ok(p) => p,
        Err(tokio::sync::TryAcquireError::Closed) => return shutting_down(),
        // Nothing has been sent while waiting for a turn: a cancel here is clean.
        Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
            p = net.calls.acquire() => match p {
                Ok(p) => p,
                Err(_) => return shutting_down(),
            },
            _ = ctx.cancel.cancelled() => return cancelled(false),
        },
    };
    // One timeout covers the whole exchange, as Node's `AbortSignal.timeout`
    // does; it is worded by whether the response head had arrived.
    let head = AtomicBool::new(false);
    let exchange = tokio::time::timeout(net.timeout, exchange(net, req, &head));
    let (status, body) = tokio::select! {
        r = exchange => match r {
            Ok(Ok(x)) => x,
            Ok(Err(f)) => return f.reply(req),
            Err(_) if head.load(Ordering::Relaxed) => {
                return ExecFailure::transport(FailureKind::Timeout, true, ABORTED_BY_TIMEOUT).reply(req);
            }
            Err(_) => return request_failed(&req.action, FailureKind::Timeout, true, ABORTED_BY_TIMEOUT).reply(req),
        },
        _ = ctx.cancel.cancelled() => return cancelled(req.write),
    };
    match answer(status, body) {
        Ok(reply) => reply,
        Err(f) => f.reply(req),
    }
}

/// The status and body of an ordinary call (by the hot path for plain HTTP,
/// else by reqwest); `head` is set once the response head has arrived.
async fn exchange(net: &Net, req: &ExecRequest, head: &AtomicBool) -> Result<(u16, Vec<u8>), ExecFailure> {
    let body = body_text(&req.action, &req.params.0);
    if let Some(direct) = &net.direct {
        return direct.post(body, &req.trace, MAX_BODY_BYTES, head).await.map_err(|f| direct_failure(&req.action, f));
    }
    let resp = request_with_body(net, req, body).send().await.map_err(|e| {
        let failure = reqwest_request_failure(&req.action, &e);
        tracing::debug!(error = %e.without_url(), "ordinary call failed");
        failure
    })?;
    let status = resp.status().as_u16();
    head.store(true, Ordering::Relaxed);
    let body = read_capped(resp, MAX_BODY_BYTES).await.map_err(|e| match e {
        BodyError::Http(e) => {
            tracing::debug!(error = %e.without_url(), "reading a response failed");
            ExecFailure::transport(FailureKind::Transport, true, TERMINATED)
        }
        BodyError::TooLarge => too_large(status),
    })?;
    Ok((status, body))
}

fn direct_failure(action: &str, f: crate::http1::Failure) -> ExecFailure {
    use crate::http1::Failure;
    // Node's texts say only "fetch failed"; what failed goes to the log.
    tracing::debug!(failure = %f, "ordinary call failed");
    match f {
        Failure::Connect(_) | Failure::NotSent(_) => {
            request_failed(action, FailureKind::Transport, false, FETCH_FAILED)
        }
        // After the head, undici's body error; before it, fetch's.
        Failure::Exchange { stage: "reading the response", .. } => {
            ExecFailure::transport(FailureKind::Transport, true, TERMINATED)
        }
        Failure::Exchange { .. } => request_failed(action, FailureKind::Transport, true, FETCH_FAILED),
        Failure::TooLarge(status) => too_large(status),
    }
}

/// A body larger than a reply between our processes can carry (Node has no
/// such limit; the wording follows its own).
fn too_large(status: u16) -> ExecFailure {
    ExecFailure::invalid(format!("OneBot returned a response larger than {MAX_BODY_BYTES} bytes (HTTP {status})"))
}

/// What an ordinary call's answer is, as Node's client judges it: any JSON
/// object, whatever the HTTP status, is the result, passed on unchanged.
fn answer(status: u16, body: Vec<u8>) -> Result<ToolReply, ExecFailure> {
    // `res.text()`: invalid UTF-8 becomes U+FFFD, a leading BOM goes. The
    // text is checked once, here; everything after reads it as text.
    let mut text = String::from_utf8(body).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    if text.starts_with('\u{feff}') {
        text.drain(..3);
    }
    let non_json = || ExecFailure::invalid(format!("OneBot returned non-JSON (HTTP {status})"));
    let unexpected = || ExecFailure::invalid(format!("OneBot returned an unexpected response (HTTP {status})"));
    // V8 parses any depth; JSON.stringify of the result then overflows
    // Node's stack. We cannot represent more than MAX_RESPONSE_DEPTH levels.
    let call_stack = || ExecFailure::invalid(MAX_CALL_STACK);
    let Some(envelope) = classify_body(text.as_bytes()) else {
        // `text ? JSON.parse(text) : null`: an empty body is null.
        if text.is_empty() {
            return Err(unexpected());
        }
        return Err(match json_syntax::check(&text) {
            Err(_) => non_json(),
            Ok(shape) if !shape.top_is_object => unexpected(),
            Ok(shape) if shape.depth > MAX_RESPONSE_DEPTH => call_stack(),
            // An object serde_json refuses though V8 takes it (a number
            // beyond f64, an unpaired surrogate escape).
            Ok(_) => non_json(),
        });
    };
    if too_deep(text.as_bytes()) {
        return Err(call_stack());
    }
    Ok(ToolReply {
        result: Some(JsonText(text)),
        diagnostics: envelope.diagnostics,
        is_error: false,
        retcode: envelope.retcode,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Node's judgement of an ordinary answer: any JSON object, whatever
    /// the status, passes unchanged; everything else is worded as Node does.
    #[test]
    fn answers_are_judged_as_node_judges_them() {
        let text = |r: Result<ToolReply, ExecFailure>| match r {
            Ok(reply) => reply.result.map(|t| t.0).unwrap_or_default(),
            Err(f) => f.detail,
        };
        let env = r#"{"status":"failed","retcode":1401,"data":null,"wording":"unauthorized"}"#;
        assert_eq!(text(answer(401, env.into())), env);
        assert_eq!(text(answer(200, b"\xef\xbb\xbf{\"a\":1}".to_vec())), r#"{"a":1}"#);
        assert_eq!(text(answer(200, b"oops".to_vec())), "OneBot returned non-JSON (HTTP 200)");
        assert_eq!(text(answer(500, b"  ".to_vec())), "OneBot returned non-JSON (HTTP 500)");
        for body in ["", "null", "[1,2]", "3", "\"x\""] {
            assert_eq!(text(answer(200, body.into())), "OneBot returned an unexpected response (HTTP 200)", "{body}");
        }
        let deep = format!(r#"{{"status":"ok","retcode":0,"data":{}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(text(answer(200, deep.into_bytes())), "Maximum call stack size exceeded");
        let deep_array = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        assert_eq!(text(answer(200, deep_array.into_bytes())), "OneBot returned an unexpected response (HTTP 200)");
        // The reply carries the envelope's retcode, as the result has it.
        assert_eq!(answer(401, env.into()).unwrap().retcode, Some(Box::new(JsonText("1401".into()))));
        assert_eq!(answer(200, b"{\"a\":1}".to_vec()).unwrap().retcode, None);
        // Invalid UTF-8 inside a string is replaced, as res.text() does.
        let r = answer(200, b"{\"a\":\"\xff\"}".to_vec()).unwrap();
        assert_eq!(r.result.unwrap().0, "{\"a\":\"\u{fffd}\"}");
    }

    #[test]
    fn request_bodies_are_built_from_the_params_text() {
        assert_eq!(body_text("get_status", " {} "), r#"{"action":"get_status","params":{}}"#);
        assert_eq!(body_text("a\"b", r#"{"x":[1]}"#), r#"{"action":"a\"b","params":{"x":[1]}}"#);
        assert!(
            is_json_object(r#" {"a":1} "#) && !is_json_object("[]") && !is_json_object("{") && !is_json_object("{} {}")
        );
    }
}
