#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Both protocol eras, the tool lists per mode, cache hints, and bad input,
//! all through the built binary's stdio.

use serde_json::{Value, json};
use snowluma_e2e::*;

const DOCS_TOOLS: [&str; 6] =
    ["list_actions", "get_action", "search_actions", "list_categories", "get_runtime_info", "preview_message"];

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn legacy_initialize_in_each_revision() {
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let mut s = Mcp::spawn(&[]);
        let init = s.initialize(version);
        assert_eq!(init["protocolVersion"], version);
        assert_eq!(init["serverInfo"]["name"], "snowluma-mcp");
        assert_eq!(init["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
        let list = s.ok("tools/list", Value::Null);
        assert!(list.get("resultType").is_none(), "legacy replies carry no resultType");
        assert!(list.get("ttlMs").is_none() && list.get("cacheScope").is_none(), "no cache hints for legacy: {list}");
        let r = s.call("list_categories", json!({}));
        assert!(r.get("resultType").is_none());
        assert_eq!(structured(&r)["result"].as_array().unwrap().len(), 12);
    }
}

#[test]
fn unsupported_legacy_revision_negotiates_a_supported_one() {
    let mut s = Mcp::spawn(&[]);
    let init = s.initialize("2024-11-05");
    assert_eq!(init["protocolVersion"], "2025-11-25");
}

#[test]
fn modern_discover_and_per_request_meta() {
    let mut s = Mcp::spawn(&[]);
    let d = s.ok("server/discover", json!({"_meta": modern_meta()}));
    assert!(d["supportedVersions"].as_array().unwrap().contains(&json!(MODERN)));
    assert_eq!(d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "snowluma-mcp");
    assert_eq!(d["resultType"], "complete");

    let list = s.ok("tools/list", json!({"_meta": modern_meta()}));
    assert_eq!(list["resultType"], "complete");
    assert_eq!(list["ttlMs"], 300_000);
    assert_eq!(list["cacheScope"], "private");
    assert_eq!(list["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "snowluma-mcp");
    assert_eq!(tool_names(&list), DOCS_TOOLS);

    let r = s.call_modern("get_action", json!({"name": "get_status"}), json!({}));
    assert_eq!(r["resultType"], "complete");
    assert!(r.get("ttlMs").is_none() && r.get("cacheScope").is_none(), "tool calls never get cache hints: {r}");
    assert_eq!(structured(&r)["result"]["name"], "get_status");
    assert_eq!(r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "snowluma-mcp");
    assert!(r["_meta"]["traceparent"].as_str().unwrap().starts_with("00-"));
}

#[test]
fn modern_errors_unsupported_version_and_missing_meta() {
    let mut s = Mcp::spawn(&[]);
    let mut meta = modern_meta();
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2027-01-01");
    let r = s.request("tools/list", json!({"_meta": meta}));
    assert_eq!(r["error"]["code"], -32022, "{r}");
    assert!(r["error"]["data"]["supported"].as_array().unwrap().contains(&json!(MODERN)));
    // The unsupported request executed nothing and the server still serves.
    let r = s.request("tools/call", json!({"name": "list_categories", "arguments": {}}));
    assert_eq!(r["error"]["code"], -32602, "a request without _meta before any lifecycle: {r}");
    let list = s.ok("tools/list", json!({"_meta": modern_meta()}));
    assert_eq!(tool_names(&list), DOCS_TOOLS);
}

#[test]
fn modern_requests_for_removed_methods_are_method_not_found() {
    // 2026-07-28 removed these methods: whatever the params, the answer is
    // -32601 (not a params error), and the server keeps serving.
    let mut s = Mcp::spawn(&[]);
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"] {
        let r = s.request(method, json!({"_meta": modern_meta()}));
        assert_eq!(r["error"]["code"], -32601, "{method}: {r}");
    }
    let r = s.request("resources/read", json!({"uri": "snowluma://nowhere", "_meta": modern_meta()}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["error"]["data"]["uri"], "snowluma://nowhere", "the URI comes back exactly as requested: {r}");
    let list = s.ok("tools/list", json!({"_meta": modern_meta()}));
    assert_eq!(tool_names(&list), DOCS_TOOLS);
}

#[test]
fn tool_lists_per_mode() {
    let ep = ("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/");
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, Vec<&str>); 4] = [
        (&[], DOCS_TOOLS.to_vec()),
        (
            &[ep],
            [&DOCS_TOOLS[..4], &["query_action", "get_runtime_info", "query_action_with_input", "preview_message"]]
                .concat(),
        ),
        (
            &[ep, ("SNOWLUMA_MCP_MODE", "write")],
            [
                &DOCS_TOOLS[..4],
                &[
                    "query_action",
                    "invoke_action",
                    "get_runtime_info",
                    "query_action_with_input",
                    "invoke_action_with_input",
                    "preview_message",
                ],
            ]
            .concat(),
        ),
        (&[ep, ("SNOWLUMA_MCP_MODE", "docs")], DOCS_TOOLS.to_vec()),
    ];
    for (env, expect) in cases {
        let mut s = Mcp::spawn(env);
        s.initialize("2025-11-25");
        let list = s.ok("tools/list", Value::Null);
        assert_eq!(tool_names(&list), expect, "env {env:?}");
        for t in list["tools"].as_array().unwrap() {
            assert_eq!(t["outputSchema"]["type"], "object", "{}", t["name"]);
            assert!(t["outputSchema"]["properties"]["diagnostics"].is_object());
        }
    }
}

#[test]
fn a_notification_before_the_first_request_does_not_kill_the_server() {
    let mut s = Mcp::spawn(&[]);
    s.notify("notifications/cancelled", json!({"requestId": 99}));
    s.notify("notifications/initialized", Value::Null);
    s.send_raw(r#"{"jsonrpc":"2.0","id":77,"result":{}}"#);
    let d = s.ok("server/discover", json!({"_meta": modern_meta()}));
    assert_eq!(d["resultType"], "complete");
    s.notify("notifications/initialized", Value::Null);
    let init = s.initialize("2025-06-18");
    assert_eq!(init["protocolVersion"], "2025-06-18");
}

#[test]
fn bad_input_is_answered_and_the_server_keeps_serving() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");

    // Malformed JSON line.
    s.send_raw("{this is not json");
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(r["id"].is_null());

    // A JSON value that is not a JSON-RPC object.
    s.send_raw("[1,2,3]");
    assert_eq!(s.recv()["error"]["code"], -32600);

    // A line over the size limit: rejected with its id.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":4242,"method":"tools/call","params":{{"name":"get_action","arguments":{{"name":"{}"}}}}}}"#,
        "x".repeat(9 * 1024 * 1024)
    );
    s.send_raw(&big);
    let r = s.wait_for(&json!(4242));
    assert_eq!(r["error"]["code"], -32600, "{}", &r.to_string()[..200.min(r.to_string().len())]);

    // Valid JSON, wrong envelope types: invalid params with the id, not a parse error.
    s.send_raw(r#"{"jsonrpc":"2.0","id":88,"method":"tools/call","params":"oops"}"#);
    let r = s.wait_for(&json!(88));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    s.send_raw(r#"{"jsonrpc":"2.0","id":89,"method":"tools/call","params":{"name":5}}"#);
    assert_eq!(s.wait_for(&json!(89))["error"]["code"], -32602);

    // Unknown method.
    let r = s.request("no/such/method", json!({}));
    assert_eq!(r["error"]["code"], -32601);

    // Unknown tool: a protocol error naming the problem.
    let r = s.request("tools/call", json!({"name": "no_such_tool", "arguments": {}}));
    assert_eq!(r["error"]["code"], -32602);
    assert!(r["error"]["message"].as_str().unwrap().contains("no_such_tool"));

    // Wrong argument types, as Node: a wrong-typed name is "" (not found);
    // the spec's added arguments are checked; unknown ones are ignored.
    let r = s.call("get_action", json!({"name": 12}));
    assert!(is_error(&r));
    assert!(structured(&r)["result"].is_null());
    assert_eq!(structured(&r)["diagnostics"]["kind"], "unknown_action");
    let r = s.call("list_actions", json!({"limit": "ten"}));
    assert!(is_error(&r));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "invalid_arguments");
    let r = s.call("list_actions", json!({"unknown_field": true}));
    assert!(!is_error(&r));

    // Tools of other modes are refused (gate re-checked, not only hidden).
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
    assert!(is_error(&r));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "mode_forbidden");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "mode_forbidden");

    // Still serving.
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r));
}

#[test]
fn exits_cleanly_when_stdin_closes() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    let worker = s.wait_worker("catalog");
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server exits");
    assert!(status.success(), "{status:?}");
    // The worker goes away with its supervisor (its socket closes).
    wait_until("the catalog worker goes away with the supervisor", || {
        let alive = std::path::Path::new(&format!("/proc/{worker}")).exists()
            && std::fs::read_to_string(format!("/proc/{worker}/stat")).map(|s| !s.contains(") Z")).unwrap_or(false);
        (!alive).then_some(())
    });
}

#[test]
fn configuration_errors_are_one_clear_line() {
    let out = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_TIMEOUT_MS", "soon")
        .bounded_output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SNOWLUMA_MCP_TIMEOUT_MS") && err.contains("soon"), "{err}");
    let out = std::process::Command::new(bin_path()).arg("--version").env_clear().bounded_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// An endpoint port out of range is a configuration error naming the port,
/// not a resolution warning; no error ever shows the endpoint's query
/// string (where an access_token may be).
#[test]
fn endpoint_errors_are_exact_and_never_show_a_query() {
    let run = |endpoint: &str| {
        let out = std::process::Command::new(bin_path())
            .env_clear()
            .env("SNOWLUMA_MCP_ENDPOINT", endpoint)
            .stdin(std::process::Stdio::null())
            .bounded_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{endpoint}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("http://127.0.0.1:99999/");
    assert!(err.contains("SNOWLUMA_MCP_ENDPOINT") && err.contains("port"), "{err}");
    let err = run("http://127.0.0.1:0/?access_token=s3cret");
    assert!(err.contains("port") && !err.contains("s3cret"), "{err}");
    let err = run("ftp://127.0.0.1/?access_token=s3cret#x");
    assert!(!err.contains("s3cret"), "{err}");
    let out = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_EVENTS_URL", "ws://127.0.0.1:3001/?access_token=s3cret")
        .stdin(std::process::Stdio::null())
        .bounded_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("query") && !err.contains("s3cret"), "{err}");
}

/// Started by a person in a terminal, the server says on stderr what it is
/// and how to use it, then keeps serving: MCP typed into the terminal is
/// answered on stdout.
#[test]
fn terminal_stdin_gets_a_hint_and_is_still_served() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut child = Command::new(bin_path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::from(pty.slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tty", "version": "1"}}});
    master.write_all(format!("{init}\n").as_bytes()).unwrap();
    let stdout = child.stdout.take().unwrap();
    let first_line = std::thread::spawn(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    });
    let line = join(first_line, "the reply to initialize");
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["result"]["serverInfo"]["name"], "snowluma-mcp");
    // Ctrl-D ends the session.
    master.write_all(&[4]).unwrap();
    let mut child_stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut stderr = String::new();
        child_stderr.read_to_string(&mut stderr).unwrap();
        stderr
    });
    let stderr = join(stderr, "the server's stderr closes");
    assert!(wait_exit(&mut child, "the server exits").success());
    assert!(stderr.contains("MCP server for stdio"), "{stderr}");
    assert!(stderr.contains("claude mcp add snowluma"), "{stderr}");
    assert!(stderr.contains("snowluma-mcp doctor"), "{stderr}");
}

/// Piped (as every client spawns it), the server prints no hint.
#[test]
fn no_hint_when_a_client_spawns_it() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    // The hint would come before this line.
    s.wait_stderr("snowluma-mcp ready");
    assert!(!s.stderr_text().contains("MCP server for stdio"));
}

/// `--help` says what the program is and lists every variable, including
/// those without a flag.
#[test]
fn help_lists_every_variable() {
    let out = std::process::Command::new(bin_path()).arg("--help").bounded_output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("stdio server"), "{help}");
    for var in [
        "SNOWLUMA_MCP_ENDPOINT",
        "SNOWLUMA_MCP_MODE",
        "SNOWLUMA_MCP_TOKEN",
        "SNOWLUMA_MCP_EVENTS_TOKEN",
        "SNOWLUMA_MCP_TIMEOUT_MS",
        "SNOWLUMA_MCP_STREAM_DIR",
        "SNOWLUMA_MCP_UPLOAD_ROOT",
        "SNOWLUMA_MCP_MAX_STREAM_BYTES",
        "SNOWLUMA_MCP_EVENTS_URL",
        "SNOWLUMA_MCP_TASK_DIR",
        "SNOWLUMA_MCP_AUDIT_LOG",
        "SNOWLUMA_MCP_AUDIT_KEY",
        "SNOWLUMA_MCP_ALLOW_ACTIONS",
        "SNOWLUMA_MCP_DENY_ACTIONS",
        "SNOWLUMA_MCP_ALLOW_UNCONFINED",
        "SNOWLUMA_MCP_LOG",
        "SNOWLUMA_MCP_LOG_PAYLOADS",
    ] {
        assert!(help.contains(var), "--help does not mention {var}");
    }
}
