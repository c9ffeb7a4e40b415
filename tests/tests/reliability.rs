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

/// A legacy read-mode session whose client declared elicitation.
fn eliciting_session(fake: &Fake) -> Mcp {
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "read")]);
    s.initialize_with("2025-11-25", json!({"elicitation": {"form": {}}}));
    s
}

/// A `query_action_with_input` call missing its required `group_id`: the
/// server asks the client with `elicitation/create`; returns the call's id.
fn prompting_call(s: &mut Mcp) -> Value {
    s.send_request("tools/call", json!({"name": "query_action_with_input", "arguments": {"action": "get_group_info"}}))
}

/// 256 prompts that the client leaves unanswered fill the calls in flight;
/// a ping, the client's answer to one prompt, a cancellation and later calls
/// are still read and handled (the session used to stop reading stdin for
/// good).
#[test]
fn unanswered_prompts_do_not_wedge_the_session() {
    let fake = Fake::start(None);
    let mut s = eliciting_session(&fake);
    let calls: Vec<Value> = (0..256).map(|_| prompting_call(&mut s)).collect();
    let asks: Vec<Value> = (0..256).map(|_| s.wait_server_request("elicitation/create")).collect();
    // A ping is answered at once.
    let ping = s.request("ping", json!({}));
    assert_eq!(ping["result"], json!({}), "{ping}");
    // A later call waits for a place; the answer to one prompt completes
    // its call, and then the later call runs.
    let later = s.send_request("tools/call", json!({"name": "query_action", "arguments": {"action": "get_status"}}));
    s.respond(&asks[0]["id"], json!({"action": "accept", "content": {"params_json": r#"{"group_id":20001}"#}}));
    let done = s.wait_for(&calls[0]);
    assert_eq!(done["result"]["isError"], false, "{done}");
    let r = s.wait_for(&later);
    assert_eq!(r["result"]["isError"], false, "{r}");
    let sent =
        |fake: &Fake, action: &str| fake.fake.requests().iter().filter(|r| r.action.as_deref() == Some(action)).count();
    assert_eq!((sent(&fake, "get_group_info"), sent(&fake, "get_status")), (1, 1));
    // A cancellation withdraws another prompt: with its place in flight
    // free again (and the answered one's), two new prompts are both asked
    // (without it, the second would wait for a place).
    s.notify("notifications/cancelled", json!({"requestId": calls[1], "reason": "test"}));
    for _ in 0..2 {
        prompting_call(&mut s);
    }
    for _ in 0..2 {
        s.wait_server_request("elicitation/create");
    }
}

/// stdin ending while a call waits for the client's answer: the call is
/// cancelled (nobody can answer any more) and the process and its workers
/// exit; they used to wait for the prompt's 10 minutes.
#[test]
fn stdin_ending_during_a_prompt_ends_the_process() {
    let fake = Fake::start(None);
    let mut s = eliciting_session(&fake);
    let workers = s.worker_pids();
    assert!(!workers.is_empty());
    let call = prompting_call(&mut s);
    s.wait_server_request("elicitation/create");
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server exits after stdin ends");
    assert!(status.success(), "{status:?}");
    let r = s.wait_for(&call);
    assert_eq!(r["result"]["structuredContent"]["diagnostics"]["kind"], "cancelled", "{r}");
    wait_until("the workers are gone", || workers.iter().all(|p| !alive(*p)).then_some(()));
    assert!(fake.fake.requests().is_empty(), "nothing executed");
}
