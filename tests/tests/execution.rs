#![allow(clippy::unwrap_used, clippy::expect_used)]
//! query_action / invoke_action against the fake SnowLuma: gates, outcomes,
//! transport errors, timeouts, cancellation, tracing and runtime info.

use std::time::Duration;

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

fn session(fake: &Fake, mode: &str, extra: &[(&str, &str)]) -> Mcp {
    let url = fake.fake.url();
    let mut env =
        vec![("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", mode), ("SNOWLUMA_MCP_TOKEN", "t0k")];
    env.extend_from_slice(extra);
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    s
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

#[test]
fn query_runs_read_only_actions_and_passes_the_envelope_through() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "read", &[]);
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["result"], json!({"status": "ok", "retcode": 0, "data": {"online": true, "good": true}}));
    assert_eq!(diag(&r)["outcome"], "success");
    let req = fake.fake.requests().into_iter().find(|q| q.action.as_deref() == Some("get_status")).unwrap();
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/");
    assert_eq!(req.header("authorization"), Some("Bearer t0k"));
    assert_eq!(req.json().unwrap(), json!({"action": "get_status", "params": {}}));

    // An alias is accepted and forwarded as the caller wrote it.
    fake.fake.set_response("nc_get_rkey", json!({"status": "ok", "retcode": 0, "data": []}));
    let r = s.call("query_action", json!({"action": "nc_get_rkey"}));
    assert!(!is_error(&r), "{r}");
    assert!(fake.fake.requests().iter().any(|q| q.action.as_deref() == Some("nc_get_rkey")));
}

#[test]
fn gates_in_every_mode() {
    let fake = Fake::start(Some("t0k"));
    // read mode: writes refused by query_action, invoke_action refused.
    let mut s = session(&fake, "read", &[]);
    let r = s.call("query_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "hi"}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "mode_forbidden");
    let r =
        s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "hi"}}));
    assert_eq!(diag(&r)["kind"], "mode_forbidden");
    let r = s.call("query_action", json!({"action": "no_such_action"}));
    assert_eq!(diag(&r)["kind"], "unknown_action");
    assert!(diag(&r)["next_step"].as_str().unwrap().contains("search_actions"));
    // As Node: params that are not an object are sent as {}; a missing
    // action is the unknown action "".
    let r = s.call("query_action", json!({"action": "get_status", "params": [1]}));
    assert!(!is_error(&r), "{r}");
    let sent = fake.fake.requests().into_iter().rfind(|q| q.action.as_deref() == Some("get_status")).unwrap();
    assert_eq!(sent.json().unwrap()["params"], json!({}));
    let r = s.call("query_action", json!({"params": {}}));
    assert_eq!(diag(&r)["kind"], "unknown_action");
    assert_eq!(text(&r), "未知 action: \"\"。用 list_actions / search_actions 查可用项。");
    assert!(fake.fake.requests().iter().all(|q| q.action.as_deref() != Some("send_group_msg")), "nothing was sent");

    // write mode: the write goes out once.
    let mut w = session(&fake, "write", &[]);
    let r =
        w.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "hi"}}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["result"]["data"]["message_id"], -123456);
    let sent = fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    assert_eq!(sent, 1);

    // docs mode: nothing executes, even with an endpoint.
    let mut d = session(&fake, "docs", &[]);
    let r = d.call("query_action", json!({"action": "get_status"}));
    assert_eq!(diag(&r)["kind"], "mode_forbidden");
}

#[test]
fn business_failures_are_data_not_errors() {
    let fake = Fake::start(Some("t0k"));
    let mut w = session(&fake, "write", &[]);
    let r = w.call("invoke_action", json!({"action": "send_group_msg", "params": {"message": "hi"}}));
    assert!(!is_error(&r), "business failure must not set isError: {r}");
    assert_eq!(structured(&r)["result"]["retcode"], 1400);
    assert_eq!(diag(&r)["outcome"], "failed");
    assert_eq!(diag(&r)["kind"], "business_failure");
    assert!(diag(&r)["message"].as_str().unwrap().contains("group_id"));

    fake.fake.set_response("get_login_info", json!({"status": "async", "retcode": 1, "data": null}));
    let r = w.call("query_action", json!({"action": "get_login_info"}));
    assert_eq!(diag(&r)["outcome"], "unknown");

    // Wrong token: SnowLuma's 401 envelope comes back as data.
    let mut bad = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", fake.fake.url().as_str()), ("SNOWLUMA_MCP_TOKEN", "wrong")]);
    bad.initialize("2025-11-25");
    let r = bad.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r));
    assert_eq!(structured(&r)["result"]["retcode"], 1401);
    assert!(diag(&r)["next_step"].as_str().unwrap().contains("SNOWLUMA_MCP_TOKEN"));
}

#[test]
fn transport_errors_and_bad_responses_are_tool_errors() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "write", &[]);
    for (fault, kind) in [
        (Fault::MalformedJson, "invalid_response"),
        (Fault::NonObject, "invalid_response"),
        (Fault::DisconnectMidBody, "transport"),
    ] {
        fake.fake.set_fault("get_status", fault.clone());
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert!(is_error(&r), "{fault:?}: {r}");
        assert_eq!(diag(&r)["kind"], kind, "{fault:?}");
        assert_eq!(diag(&r)["outcome"], "failed", "a read simply failed");
        assert!(structured(&r)["result"].is_null());
        assert!(r["_meta"]["traceparent"].is_string(), "tool errors carry the traceparent too");
    }
    // HTTP 500 with a JSON envelope: passed through as a business failure.
    fake.fake.set_fault("get_status", Fault::Http500);
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r));
    assert_eq!(diag(&r)["outcome"], "failed");
    fake.fake.clear_fault("get_status");

    // A write whose reply is lost: outcome unknown, never retried.
    fake.fake.set_fault("send_group_msg", Fault::DisconnectMidBody);
    let before = fake.fake.requests().len();
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "x"}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["outcome"], "unknown");
    let sends = fake.fake.requests()[before..].iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    assert_eq!(sends, 1, "no automatic retry");

    // Nothing listening: cannot connect.
    let mut dead = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/"), ("SNOWLUMA_MCP_MODE", "write")]);
    dead.initialize("2025-11-25");
    let r = dead.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "transport");
    assert_eq!(diag(&r)["outcome"], "failed", "nothing was sent");
    assert!(!text(&r).contains("127.0.0.1"), "the endpoint is not shown: {}", text(&r));
}

/// The executor keeps connections alive between calls; when SnowLuma has
/// closed one in the meantime, the next call still goes through, exactly
/// once, on a new connection. (A close that races with the next request is
/// a different case: that request may have been read, so a write's outcome
/// is then unknown and it is not resent.)
#[test]
fn a_connection_closed_by_snowluma_between_calls_is_replaced() {
    let fake = Fake::start(Some("t0k"));
    // Five sends to one group in a row: send pacing (tests/tests/safety.rs) off.
    let no_pacing = [("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0"), ("SNOWLUMA_MCP_SEND_BURST", "0")];
    let mut s = session(&fake, "write", &no_pacing);
    let sends =
        |fake: &Fake| fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    fake.fake.set_fault("get_status", Fault::CloseAfterResponse);
    for round in 1..=5 {
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert_eq!(diag(&r)["outcome"], "success", "round {round}: {r}");
        // Wait until SnowLuma has really closed that connection.
        wait_until("SnowLuma closed the connection", || (fake.fake.closed_by_server().len() >= round).then_some(()));
        let r =
            s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "x"}}));
        assert!(!is_error(&r), "round {round}: {r}");
        assert_eq!(diag(&r)["outcome"], "success", "round {round}");
        assert_eq!(sends(&fake), round, "each write reaches SnowLuma exactly once");
    }
}

#[test]
fn timeouts_make_write_outcomes_unknown() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "write", &[("SNOWLUMA_MCP_TIMEOUT_MS", "300")]);
    fake.fake.set_fault("set_group_ban", Fault::Hang);
    let r =
        s.call("invoke_action", json!({"action": "set_group_ban", "params": {"group_id": 20001, "user_id": 30001}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "timeout");
    assert_eq!(diag(&r)["outcome"], "unknown");
    fake.fake.set_fault("get_status", Fault::Hang);
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert_eq!(diag(&r)["kind"], "timeout");
    assert_eq!(diag(&r)["outcome"], "failed");
}

/// A legacy session's `query_action` (answered from the transport, its
/// reply handed over where it is read): a cancel mid-exchange closes the
/// connection to SnowLuma, the call gets no answer and its log line says
/// it was cancelled; the next call is answered and logged as usual.
#[test]
fn cancellation_aborts_the_http_exchange() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "write", &[]);
    s.read_stderr();
    fake.fake.set_fault("get_status", Fault::Hang);
    let id = json!(s.next_id());
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "query_action", "arguments": {"action": "get_status"}}}));
    // Wait until the fake holds the request, then cancel.
    wait_until("the fake holds the request", || {
        fake.fake.requests().iter().any(|q| q.action.as_deref() == Some("get_status")).then_some(())
    });
    s.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
    let closed = fake.rt.block_on(fake.fake.wait_closed_while_pending("get_status", SAFETY));
    assert!(closed, "the fake never saw the connection close");
    // No response for a cancelled request; the server keeps serving.
    fake.fake.clear_fault("get_status");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r));
    assert!(s.backlog.iter().all(|m| m.get("id") != Some(&id)), "a cancelled request gets no response");
    s.wait_stderr(r#"tool call tool="query_action""#);
    s.wait_stderr(r#"outcome="success" failure="none""#);
    let log = s.stderr_text();
    let cancelled = log.lines().filter(|l| l.contains(r#"failure="cancelled""#)).count();
    assert_eq!(cancelled, 1, "the cancelled call is logged once, as cancelled:\n{log}");
}

#[test]
fn traceparent_round_trip_and_header_forwarding() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "read", &[]);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = s.ok(
        "tools/call",
        json!({"name": "query_action", "arguments": {"action": "get_status"}, "_meta": {"traceparent": parent, "tracestate": "vendor=abc", "baggage": "user=alice"}}),
    );
    let tp = r["_meta"]["traceparent"].as_str().unwrap().to_owned();
    assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp != parent, "{tp}");
    let req = fake.fake.requests().into_iter().rev().find(|q| q.action.as_deref() == Some("get_status")).unwrap();
    assert_eq!(req.header("traceparent"), Some(tp.as_str()));
    assert_eq!(req.header("tracestate"), Some("vendor=abc"));
    assert!(req.header("baggage").is_none(), "baggage is never forwarded");
    assert!(!String::from_utf8_lossy(&req.body).contains("traceparent"), "never in OneBot params");
    // The call's diagnostic line names its traceparent.
    s.wait_stderr(&tp);
    assert!(
        !s.stderr_text().contains("vendor=abc") && !s.stderr_text().contains("alice"),
        "tracestate and baggage are not logged"
    );

    // Invalid metadata: a new independent trace, a fixed diagnostic, no rejection.
    let r = s.ok(
        "tools/call",
        json!({"name": "query_action", "arguments": {"action": "get_status"}, "_meta": {"traceparent": "bogus"}}),
    );
    assert!(!is_error(&r));
    let tp2 = r["_meta"]["traceparent"].as_str().unwrap();
    assert_eq!(tp2.len(), 55);
    s.wait_stderr("invalid traceparent ignored");

    // Modern era too.
    let r = s.call_modern("query_action", json!({"action": "get_status"}), json!({"traceparent": parent}));
    assert!(r["_meta"]["traceparent"].as_str().unwrap().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
}

#[test]
fn concurrent_calls_keep_independent_trace_headers() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "read", &[]);
    fake.fake.set_fault("get_status", Fault::Delay(Duration::from_millis(50)));
    let traces: Vec<String> = (0..6).map(|i| format!("00-{:032x}-00f067aa0ba902b7-01", i + 1)).collect();
    let mut ids = Vec::new();
    for t in &traces {
        let id = json!(s.next_id());
        s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "query_action", "arguments": {"action": "get_status"}, "_meta": {"traceparent": t}}}));
        ids.push(id);
    }
    let mut returned = Vec::new();
    for (id, t) in ids.iter().zip(&traces) {
        let r = s.wait_for(id);
        let tp = r["result"]["_meta"]["traceparent"].as_str().unwrap().to_owned();
        assert_eq!(&tp[3..35], &t[3..35], "each call keeps its own trace id");
        returned.push(tp);
    }
    let seen: Vec<String> =
        fake.fake.requests().iter().filter_map(|q| q.header("traceparent").map(str::to_owned)).collect();
    for tp in &returned {
        assert!(seen.contains(tp), "header for {tp} not forwarded");
    }
}

#[test]
fn generic_streams_return_a_frame_collection() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "write", &[]);
    fake.fake.set_fault("test_download_stream", Fault::StreamSplit(7));
    let r = s.call("invoke_action", json!({"action": "test_download_stream"}));
    assert!(!is_error(&r), "{r}");
    let res = &structured(&r)["result"];
    assert_eq!(res["frame_count"], 11);
    assert_eq!(res["frames"].as_array().unwrap().len(), 10);
    assert_eq!(res["terminal"]["data"]["data_type"], "data_complete");
    let r = s.call("invoke_action", json!({"action": "test_download_stream", "params": {"error": true}}));
    assert!(is_error(&r));
    assert_eq!(
        text(&r),
        "调用失败 (test_download_stream): action test_download_stream stream frame 10: terminal error: This is a test error"
    );
    // Streams need write mode.
    let mut ro = session(&fake, "read", &[]);
    let r = ro.call("query_action", json!({"action": "test_download_stream"}));
    assert_eq!(diag(&r)["kind"], "mode_forbidden");
}

#[test]
fn runtime_info_in_each_mode() {
    let mut d = Mcp::spawn(&[]);
    d.initialize("2025-11-25");
    let r = d.call("get_runtime_info", json!({}));
    let info = structured(&r)["result"].clone();
    assert_eq!(info["mode"], "docs");
    assert_eq!(info["execution_enabled"], false);
    assert!(info["transport"].is_null());
    assert_eq!(info["catalog"]["action_count"], 193);
    assert_eq!(info["catalog"]["server_support"], "unknown");
    assert_eq!(info["connection_checked"], false);
    let r = d.call("get_runtime_info", json!({"check_connection": true}));
    assert!(is_error(&r));

    let fake = Fake::start(Some("t0k"));
    let mut w = session(&fake, "write", &[]);
    let r = w.call("get_runtime_info", json!({}));
    let info = structured(&r)["result"].clone();
    assert_eq!((info["mode"].clone(), info["write_enabled"].clone()), (json!("write"), json!(true)));
    assert_eq!(info["transport"]["request_timeout_ms"], 30000);
    assert_eq!(info["transport"]["max_concurrent_streams"], 4);
    let whole = r.to_string();
    assert!(
        !whole.contains("t0k") && !whole.contains(&fake.fake.addr().port().to_string()),
        "no endpoint or token: {whole}"
    );
    assert!(fake.fake.requests().is_empty(), "the overview contacts nothing");

    fake.fake.set_fault("get_version_info", Fault::Http500);
    let r = w.call("get_runtime_info", json!({"check_connection": true}));
    let info = structured(&r)["result"].clone();
    assert_eq!(info["connection_checked"], true);
    assert_eq!(info["checks"]["get_status"]["diagnostics"]["outcome"], "success");
    assert_eq!(info["checks"]["get_version_info"]["diagnostics"]["outcome"], "failed");
    assert_eq!(structured(&r)["diagnostics"]["outcome"], "failed", "partial failure is visible");
}

/// A query tool's call is answered from the transport (without rmcp's
/// dispatch) in a session that began with `initialize` at a legacy version;
/// a progress token sends the same call through rmcp. Both answers are the
/// same, byte for byte in their order (the per-call span id aside), for
/// results, refusals and errors.
#[test]
fn direct_calls_answer_as_rmcp_does() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_LOG", "debug")]);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cases = [
        (json!({"action": "get_status"}), json!(null)),
        (json!({"action": "get_status"}), json!({"traceparent": parent})),
        (json!({"action": "get_group_info", "params": {"group_id": 20001}}), json!(null)),
        (json!({"action": "no_such_action"}), json!(null)),
        (json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "hi"}}), json!(null)),
        (json!({}), json!(null)),
        (json!({"action": "get_status", "params": "not an object"}), json!(null)),
    ];
    // Each call has a new span id, and a new trace id without a parent.
    let span_free = |mut r: Value, parent: &Value| {
        let tp = r["_meta"]["traceparent"].as_str().map(|t| t[..t.len().min(36)].to_owned());
        if let Some(tp) = tp {
            r["_meta"]["traceparent"] = json!(if parent.is_null() { "00-" } else { &tp });
        }
        serde_json::to_string(&r).unwrap()
    };
    let mut direct_lines = 0;
    for (args, meta) in cases {
        let mut params = json!({"name": "query_action", "arguments": args});
        if !meta.is_null() {
            params["_meta"] = meta.clone();
        }
        let direct = s.request("tools/call", params.clone());
        direct_lines += 1;
        let mut through_rmcp = meta.clone();
        if through_rmcp.is_null() {
            through_rmcp = json!({});
        }
        through_rmcp["progressToken"] = json!(format!("p{direct_lines}"));
        params["_meta"] = through_rmcp;
        let rmcp = s.request("tools/call", params);
        let parent = &meta["traceparent"];
        assert_eq!(span_free(direct["result"].clone(), parent), span_free(rmcp["result"].clone(), parent), "{args}");
        assert!(direct.get("error").is_none() && rmcp.get("error").is_none(), "{direct} {rmcp}");
        // Lines arrive in order: once the direct call's line is read, one of
        // an earlier call taken wrongly would have been counted too.
        assert_eq!(taken_at_least(&s, direct_lines), direct_lines, "only calls without a progress token are taken");
    }
    let last = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&last));
    assert_eq!(taken_at_least(&s, direct_lines + 1), direct_lines + 1, "the last call through rmcp was not taken");
}

/// How many calls stderr says were answered directly, once at least `n`.
fn taken_at_least(s: &Mcp, n: usize) -> usize {
    wait_until("direct calls logged", || {
        let count = s.stderr_text().matches("tool call answered directly").count();
        (count >= n).then_some(count)
    })
}

/// A request whose id is written as a float (`7.0`, `8e0`) is answered
/// under rmcp's reading of that id, through rmcp and as a direct call, and
/// counts as answered: the session still ends at stdin's end (it used to
/// wait for such a request forever).
#[test]
fn requests_with_float_ids_are_answered_and_the_session_ends() {
    let fake = Fake::start(Some("t0k"));
    let mut s = session(&fake, "read", &[]);
    s.send_raw(r#"{"jsonrpc":"2.0","id":7.0,"method":"tools/list"}"#);
    s.send_raw(
        r#"{"jsonrpc":"2.0","id":8e0,"method":"tools/call","params":{"name":"query_action","arguments":{"action":"get_status"}}}"#,
    );
    let listed = s.wait_for(&json!(7));
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    let called = s.wait_for(&json!(8));
    assert_eq!(diag(&called["result"])["outcome"], "success", "{called}");
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server exits at stdin's end");
    assert!(status.success(), "{status:?}");
}
