//! `get_runtime_info`: the effective configuration, without contacting
//! SnowLuma unless `check_connection` is requested. Never exposes the
//! endpoint, the token or any header.

use std::sync::OnceLock;

use serde_json::{Value, json};
use snowluma_proto::{Diagnostics, FailureKind, ToolReply};
use tokio_util::sync::CancellationToken;

use crate::state::ServerState;
use crate::trace::CallTrace;
use snowluma_config::Mode;

/// What is enforced, recorded once at startup (see [`record_confinement`]).
static CONFINEMENT: OnceLock<Value> = OnceLock::new();

/// Record the `confinement` object of `get_runtime_info`
/// (`snowluma_sandbox::runtime_summary`), once, at startup.
pub fn record_confinement(summary: Value) {
    let _ = CONFINEMENT.set(summary);
}

/// The `confinement` object of `get_runtime_info`.
fn confinement() -> Value {
    CONFINEMENT.get().cloned().unwrap_or(Value::Null)
}

/// Streams allowed at once (matches the upstream client).
pub const MAX_CONCURRENT_STREAMS: u32 = 4;

snowluma_catalog::tool_args! {
    /// Arguments of `get_runtime_info` (its input schema is generated from
    /// this declaration).
    pub struct RuntimeInfoArgs for "get_runtime_info" {
        /// 另外查询服务器（仅读/写模式）：get_login_info、get_status、get_version_info。Also query the server (read/write modes only).
        #[serde(default)]
        check_connection: bool,
    }
}

pub fn download_dir(server: &ServerState) -> std::path::PathBuf {
    server.config().stream_dir_path.clone()
}

pub async fn runtime_info(
    server: &ServerState,
    args: Value,
    cancel: &CancellationToken,
    trace: &CallTrace,
) -> ToolReply {
    let args: RuntimeInfoArgs = match serde_json::from_value(args) {
        Ok(a) => a,
        Err(e) => {
            return ToolReply::fail(
                FailureKind::InvalidArguments,
                format!("invalid arguments for get_runtime_info: {e}"),
            );
        }
    };
    let cfg = server.config();
    let catalog = server.catalog();
    let executes = cfg.mode.executes();
    if args.check_connection && !executes {
        return ToolReply::error(
            Diagnostics::failed(
                FailureKind::ModeForbidden,
                "check_connection needs read or write mode with a configured endpoint",
            )
            .with_next_step("Call get_runtime_info without check_connection, or configure SNOWLUMA_MCP_ENDPOINT."),
        );
    }
    let transport = if executes {
        json!({
            "request_timeout_ms": cfg.timeout_ms,
            "stream_connect_timeout_ms": cfg.timeout_ms,
            "stream_idle_timeout_ms": cfg.timeout_ms,
            "max_stream_bytes": cfg.max_stream_bytes,
            "download_quota_bytes": cfg.max_stream_bytes.saturating_mul(2),
            "max_concurrent_streams": MAX_CONCURRENT_STREAMS,
            "download_dir": server.transfers().and_then(|t| t.paths().download_dir.clone()).unwrap_or_else(|| download_dir(server)).display().to_string(),
            "upload_root": cfg.upload_root.as_ref().map(|p| p.display().to_string()),
            "upload_enabled": server.transfers().is_some_and(|t| t.paths().upload_root.is_some()),
            "file_transfers_enabled": server.transfers().is_some(),
        })
    } else {
        Value::Null
    };
    let mut out = json!({
        "mode": cfg.mode.as_str(),
        "execution_enabled": executes,
        "write_enabled": cfg.mode == Mode::Write,
        "server": {"name": crate::state::SERVER_NAME, "version": crate::state::SERVER_VERSION},
        "catalog": {"version": catalog.version, "action_count": catalog.actions.len(), "server_support": "unknown"},
        "transport": transport,
        "connection_checked": false,
        "services": {
            "events_configured": cfg.events_url.is_some(),
            "events_available": server.events_enabled(),
            "tasks_configured": cfg.task_dir.is_some(),
            "tasks_available": false,
        },
        "audit_log": server.audit_enabled(),
        "policy": server.policy().to_json(),
        "confirmation": server.policy().confirm().to_json(),
        "idempotency": server.keys.to_json(),
        "scope": server.scope.to_json(),
        "pacing": server.pacer.to_json(),
        "confinement": confinement(),
    });
    if args.check_connection {
        let mut checks = serde_json::Map::new();
        let mut all_ok = true;
        for action in ["get_login_info", "get_status", "get_version_info"] {
            let r = server.query(action, trace, cancel).await;
            all_ok &= r.diagnostics.outcome == snowluma_proto::Outcome::Success;
            let result = r.result.as_ref().and_then(|t| t.parse().ok()).unwrap_or(Value::Null);
            checks.insert(
                action.into(),
                json!({"result": result, "diagnostics": r.diagnostics.to_json(), "is_error": r.is_error}),
            );
        }
        out["connection_checked"] = json!(true);
        out["checks"] = Value::Object(checks);
        let diag = if all_ok {
            Diagnostics::success()
        } else {
            Diagnostics::failed(FailureKind::Execution, "some connection checks failed; see checks")
                .with_next_step("Inspect each entry under checks; check get_status data for the online state.")
        };
        return ToolReply::with_diagnostics(&out, diag);
    }
    ToolReply::ok(&out)
}
