#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What must never stop a session: a stderr nobody reads (diagnostics are
//! dropped and counted, never waited for).

use serde_json::{Value, json};
use snowluma_e2e::*;

/// `n` calls of `tool`, pipelined in batches of 50; every one is answered
/// without an error.
fn calls_all_answered(s: &mut Mcp, n: usize, tool: &str, args: &Value) {
    for batch in 0..n / 50 {
        let ids: Vec<Value> =
            (0..50).map(|_| s.send_request("tools/call", json!({"name": tool, "arguments": args}))).collect();
        for id in &ids {
            let r = s.wait_for(id);
            assert_eq!(r["result"]["isError"], false, "call {} of batch {batch}: {r}", id);
        }
    }
}

/// 3 000 documentation calls with a stderr pipe nobody reads, each of which
/// logs: all answered (a blocking log write used to stop the server after
/// ~337 calls, for good). Once the pipe is read again, one line says how many
/// lines were dropped.
#[test]
fn an_unread_stderr_never_stops_docs_mode() {
    let mut s = Mcp::spawn_command_unread_stderr(Mcp::command(&[("SNOWLUMA_MCP_LOG", "debug")], &[]));
    s.initialize("2025-11-25");
    calls_all_answered(&mut s, 3000, "list_categories", &json!({}));
    s.read_stderr();
    // The next line logged after the pipe drains reports the count first.
    wait_until("a line reports the dropped log lines", || {
        let r = s.call("list_categories", json!({}));
        assert!(!is_error(&r));
        let text = s.stderr_text();
        text.lines().any(|l| l.contains("log lines dropped: stderr was full")).then_some(())
    });
}

/// The same in read mode against SnowLuma: the supervisor, the spawner and
/// the network executor all share the unread pipe.
#[test]
fn an_unread_stderr_never_stops_read_mode() {
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let env = [("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "read"), ("SNOWLUMA_MCP_LOG", "debug")];
    let mut s = Mcp::spawn_command_unread_stderr(Mcp::command(&env, &[]));
    s.initialize("2025-11-25");
    calls_all_answered(&mut s, 3000, "query_action", &json!({"action": "get_status"}));
    s.read_stderr();
    wait_until("a line reports the dropped log lines", || {
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert!(!is_error(&r));
        s.stderr_text().lines().any(|l| l.contains("log lines dropped: stderr was full")).then_some(())
    });
}
