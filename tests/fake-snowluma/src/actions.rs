//! Request routing and the ordinary (non-Stream) actions.
//!
//! Imitates SnowLuma's `http-server-adapter.ts` (upstream notes §3.2): the
//! action comes from `POST /<action>` or, on the base path, from the body's
//! `action`; params are `body.params` when that is an object, else the whole
//! body; `echo` is copied back; unknown actions are HTTP 200 with retcode 1404.

use serde_json::{Map, Value, json};

use crate::http::{Head, parse_urlencoded, percent_decode};
use crate::{State, stream};

/// Action parameters (a JSON object).
pub(crate) type Params = Map<String, Value>;

/// The frames of a Stream action, produced lazily (downloads can be large).
pub(crate) type Frames = Box<dyn Iterator<Item = Value> + Send>;

/// A request that names an action.
#[derive(Debug)]
pub(crate) struct Call {
    pub action: String,
    pub params: Params,
    pub echo: Option<Value>,
}

/// What a request turned out to be, before any action runs.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// `GET /`: the health check.
    Health,
    Call(Call),
    /// Rejected before dispatch (bad JSON, missing action, wrong method...).
    Reject {
        status: u16,
        envelope: Value,
    },
}

/// The answer to a [`Call`].
pub(crate) enum Reply {
    /// An ordinary envelope, framed by Content-Length.
    Json { status: u16, body: Value },
    /// A Stream action: chunked body of `JSON\r\n\r\n` frames.
    Stream(Frames),
}

/// `{status:'ok', retcode:0, data}`.
pub(crate) fn ok(data: Value) -> Value {
    json!({"status": "ok", "retcode": 0, "data": data})
}

/// `{status:'failed', retcode, data:null, wording}`.
pub(crate) fn failed(retcode: i64, wording: &str) -> Value {
    json!({"status": "failed", "retcode": retcode, "data": null, "wording": wording})
}

/// Adds `echo` to an envelope (if the request had one and the envelope has none).
pub(crate) fn with_echo(mut envelope: Value, echo: Option<&Value>) -> Value {
    if let (Some(echo), Value::Object(map)) = (echo, &mut envelope) {
        map.entry("echo").or_insert_with(|| echo.clone());
    }
    envelope
}

fn reject(status: u16, retcode: i64, wording: &str) -> Parsed {
    Parsed::Reject { status, envelope: failed(retcode, wording) }
}

/// SnowLuma's `isAuthorized`: `Authorization: Bearer <token>` or `?access_token=<token>`.
pub(crate) fn authorized(token: Option<&str>, head: &Head) -> bool {
    let Some(token) = token else {
        return true;
    };
    let bearer_ok = head.header("authorization").is_some_and(|value| {
        value
            .split_once(' ')
            .is_some_and(|(scheme, rest)| scheme.eq_ignore_ascii_case("bearer") && rest.trim() == token)
    });
    bearer_ok || parse_urlencoded(&head.query).iter().any(|(k, v)| k == "access_token" && v == token)
}

/// The action named by the path, if the path is not the base `/`.
fn action_from_path(path: &str) -> Option<String> {
    let action = percent_decode(path, false);
    let action = action.trim_matches('/');
    (!action.is_empty()).then(|| action.to_string())
}

/// Form fields become params; values are JSON-parsed when possible (`group_id=1` → 1).
fn params_from_pairs(pairs: Vec<(String, String)>) -> Params {
    pairs
        .into_iter()
        .filter(|(k, _)| k != "access_token")
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(Value::String(v));
            (k, value)
        })
        .collect()
}

/// Works out the action, params and echo of a request.
pub(crate) fn parse_call(head: &Head, body: &[u8]) -> Parsed {
    let path_action = action_from_path(&head.path);
    match head.method.as_str() {
        "GET" => match path_action {
            None => Parsed::Health,
            Some(action) => {
                Parsed::Call(Call { action, params: params_from_pairs(parse_urlencoded(&head.query)), echo: None })
            }
        },
        "POST" => parse_post(head, body, path_action),
        _ => reject(405, 1400, "method not allowed"),
    }
}

fn parse_post(head: &Head, body: &[u8], path_action: Option<String>) -> Parsed {
    let content_type = head.header("content-type").map(str::to_ascii_lowercase);
    let value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        match content_type.as_deref() {
            Some(ct) if ct.contains("json") => match serde_json::from_slice(body) {
                Ok(value) => value,
                Err(_) => return reject(400, 1400, "bad request: invalid json"),
            },
            Some(ct) if ct.starts_with("application/x-www-form-urlencoded") => {
                Value::Object(params_from_pairs(parse_urlencoded(&String::from_utf8_lossy(body))))
            }
            // No content type: try JSON, then a form body.
            None => match serde_json::from_slice(body) {
                Ok(value) => value,
                Err(_) if !matches!(body.first(), Some(b'{' | b'[')) && body.contains(&b'=') => {
                    Value::Object(params_from_pairs(parse_urlencoded(&String::from_utf8_lossy(body))))
                }
                Err(_) => return reject(400, 1400, "bad request: invalid json"),
            },
            Some(_) => return reject(400, 1400, "bad request: unsupported content-type"),
        }
    };
    let Value::Object(mut object) = value else {
        return match path_action {
            Some(_) => reject(400, 1400, "bad request: params must be an object"),
            None => reject(400, 1400, "bad request: missing action"),
        };
    };
    let echo = object.get("echo").filter(|e| !e.is_null()).cloned();
    let body_action = object.get("action").and_then(Value::as_str).filter(|a| !a.is_empty());
    let Some(action) = path_action.or_else(|| body_action.map(str::to_string)) else {
        return reject(400, 1400, "bad request: missing action");
    };
    let params = match object.remove("params") {
        Some(Value::Object(params)) => params,
        // Not an object: SnowLuma takes the whole body as the params.
        Some(other) => {
            object.insert("params".to_string(), other);
            object
        }
        None => object,
    };
    Parsed::Call(Call { action, params, echo })
}

/// Runs an action. Configured responses (`set_response`) win over built-ins.
pub(crate) fn dispatch(state: &mut State, call: Call) -> Reply {
    let Call { action, params, echo } = call;
    if let Some(envelope) = state.responses.get(&action) {
        return Reply::Json { status: 200, body: with_echo(envelope.clone(), echo.as_ref()) };
    }
    let frames: Frames = match action.as_str() {
        "test_download_stream" => Box::new(stream::test_download(&params).into_iter()),
        "download_file_stream" | "download_file_image_stream" | "download_file_record_stream" => {
            stream::download(&state.files, &params)
        }
        "upload_file_stream" => {
            let State { uploads, uploaded, .. } = state;
            Box::new(std::iter::once(stream::upload(uploads, uploaded, &params)))
        }
        _ => {
            let envelope = builtin(state, &action, &params);
            return Reply::Json { status: 200, body: with_echo(envelope, echo.as_ref()) };
        }
    };
    // Every Stream frame, the terminal included, carries the request's echo.
    Reply::Stream(Box::new(frames.map(move |frame| with_echo(frame, echo.as_ref()))))
}

/// The ordinary built-in actions; anything else is `unknown action` (1404).
fn builtin(state: &mut State, action: &str, params: &Params) -> Value {
    let result = match action {
        "get_status" => Ok(json!({"online": true, "good": true})),
        "get_login_info" => Ok(json!({"user_id": 10001, "nickname": "fake-bot"})),
        "get_version_info" => Ok(json!({
            "app_name": "SnowLuma",
            "app_version": "1.14.15",
            "protocol_version": "v11"
        })),
        "send_group_msg" => send_msg(params, Some("group")),
        "send_private_msg" => send_msg(params, Some("private")),
        "send_msg" => send_msg(params, None),
        "delete_msg" | "set_group_ban" => Ok(Value::Null),
        "get_group_list" => Ok(json!([])),
        // Not a Stream action: wipes the upload temp state, answers `{message, removed}`.
        "clean_stream_temp_file" => {
            let removed = state.uploads.len() + state.uploaded.len();
            state.uploads.clear();
            state.uploaded.clear();
            Ok(json!({"message": "success", "removed": removed}))
        }
        _ => return failed(1404, "unknown action"),
    };
    match result {
        Ok(data) => ok(data),
        // Parameter validation failures are retcode 1400 with "<field>: <problem>".
        Err(wording) => failed(1400, &wording),
    }
}

/// `send_group_msg` / `send_private_msg` / `send_msg`: validate and pretend to send.
fn send_msg(params: &Params, kind: Option<&str>) -> Result<Value, String> {
    let kind = match kind {
        Some(kind) => kind.to_string(),
        None => match str_param(params, "message_type")? {
            Some(kind) => kind,
            None if present(params, "group_id") => "group".to_string(),
            None => "private".to_string(),
        },
    };
    match kind.as_str() {
        "group" => require_int(params, "group_id")?,
        "private" => require_int(params, "user_id")?,
        _ => return Err(field_error("message_type", "expected 'private' or 'group'")),
    };
    if !present(params, "message") {
        return Err(field_error("message", "is required"));
    }
    Ok(json!({"message_id": -123456}))
}

// ---- parameter helpers (wording follows SnowLuma's "<field>: <problem>") ----

pub(crate) fn field_error(field: &str, problem: &str) -> String {
    format!("{field}: {problem}")
}

fn present(params: &Params, key: &str) -> bool {
    params.get(key).is_some_and(|v| !v.is_null())
}

/// An integer param; numeric strings count (OneBot clients often send ids as strings).
pub(crate) fn int_param(params: &Params, key: &str) -> Result<Option<i64>, String> {
    let parsed = match params.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(_) => None,
    };
    parsed.map(Some).ok_or_else(|| field_error(key, "expected an integer"))
}

fn require_int(params: &Params, key: &str) -> Result<i64, String> {
    int_param(params, key)?.ok_or_else(|| field_error(key, "is required"))
}

/// A non-negative integer param.
pub(crate) fn u64_param(params: &Params, key: &str) -> Result<Option<u64>, String> {
    match int_param(params, key)? {
        None => Ok(None),
        Some(n) => u64::try_from(n).map(Some).map_err(|_| field_error(key, "expected a non-negative integer")),
    }
}

/// A boolean param (`true`/`false`, `"true"`/`"false"`, 1/0).
pub(crate) fn bool_param(params: &Params, key: &str) -> Result<Option<bool>, String> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s == "true" || s == "1" => Ok(Some(true)),
        Some(Value::String(s)) if s == "false" || s == "0" => Ok(Some(false)),
        Some(Value::Number(n)) if n.as_u64() == Some(1) => Ok(Some(true)),
        Some(Value::Number(n)) if n.as_u64() == Some(0) => Ok(Some(false)),
        Some(_) => Err(field_error(key, "expected a boolean")),
    }
}

/// A string param.
pub(crate) fn str_param(params: &Params, key: &str) -> Result<Option<String>, String> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error(key, "expected a string")),
    }
}
