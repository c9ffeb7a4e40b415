#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Diagnostics keep the promise at every level: at `SNOWLUMA_MCP_LOG=trace`
//! no message text, token or users' file path reaches stderr unless the
//! operator sets `SNOWLUMA_MCP_LOG_PAYLOADS=1` (with a warning); an invalid
//! filter is a startup error.

use serde_json::json;
use snowluma_e2e::*;

const TEXT: &str = "message-text-that-must-not-be-logged";
const TOKEN: &str = "t0ken-that-must-not-be-logged";

/// A trace-level session that sends a message and gets the token reflected
/// back by SnowLuma; returns its stderr.
fn trace_session(payloads: bool) -> String {
    let fake = Fake::start(Some(TOKEN));
    fake.fake.set_response("send_private_msg", json!({"status": "ok", "retcode": 0, "data": {"echo": TOKEN}}));
    let url = fake.fake.url();
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_TOKEN", TOKEN),
        ("SNOWLUMA_MCP_LOG", "trace"),
    ];
    if payloads {
        env.push(("SNOWLUMA_MCP_LOG_PAYLOADS", "1"));
    }
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    let r = s.call("invoke_action", json!({"action": "send_private_msg", "params": {"user_id": 1, "message": TEXT}}));
    assert!(!is_error(&r), "{r}");
    s.close_stdin();
    wait_exit(&mut s.child, "the server exits");
    // Workers log until they see the supervisor go.
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.stderr_text()
}

#[test]
fn trace_level_logs_no_payloads() {
    let stderr = trace_session(false);
    assert!(stderr.contains("TRACE") || stderr.contains("DEBUG"), "our own debug lines are there");
    assert!(!stderr.contains(TEXT), "a message text reached stderr");
    assert!(!stderr.contains(TOKEN), "a token reached stderr");
}

#[test]
fn payload_logging_is_explicit_and_warned() {
    let stderr = trace_session(true);
    assert!(stderr.contains("SNOWLUMA_MCP_LOG_PAYLOADS=1"), "a warning says so");
    assert!(stderr.contains(TEXT), "with the opt-in, library debug lines show payloads");
}

#[test]
fn an_invalid_log_filter_is_a_startup_error() {
    for (var, value) in [("SNOWLUMA_MCP_LOG", "info,=[bad"), ("SNOWLUMA_MCP_LOG_PAYLOADS", "yes")] {
        let out = std::process::Command::new(bin_path())
            .env_clear()
            .env(var, value)
            .stdin(std::process::Stdio::null())
            .bounded_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(var));
    }
}
