//! The HTTP client: one `reqwest` client with a keep-alive pool (and, for
//! plain-HTTP endpoints, the hyper hot path of [`crate::http1`]), the
//! request every call sends, and ordinary (non-stream) calls with their
//! timeout, body cap and classification.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_proto::{ExecRequest, FailureKind, JsonText, NetworkConfig, ToolReply};
use tokio::sync::Semaphore;

use super::MAX_BODY_BYTES;
use super::envelope::{MAX_RESPONSE_DEPTH, classify_body, nesting_depth};
use super::errors::{cancelled, direct_failure, reqwest_failure, transport_failure};
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
    })
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

/// An ordinary call: the params text goes into the body unparsed; the
/// response body is classified and passed on unchanged.
pub(super) async fn call(net: &Net, req: &ExecRequest, ctx: &Ctx) -> ToolReply {
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
        let resp = request_with_body(net, req, body_text(&req.action, &req.params.0))
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

    #[test]
    fn request_bodies_are_built_from_the_params_text() {
        assert_eq!(body_text("get_status", " {} "), r#"{"action":"get_status","params":{}}"#);
        assert_eq!(body_text("a\"b", r#"{"x":[1]}"#), r#"{"action":"a\"b","params":{"x":[1]}}"#);
        assert!(
            is_json_object(r#" {"a":1} "#) && !is_json_object("[]") && !is_json_object("{") && !is_json_object("{} {}")
        );
    }
}
