#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bounded work per request and per session: a keyword query has at most
//! 32 terms; at most 256 requests (and 64 MiB of request text) are in
//! flight per session, the next ones are read as earlier ones finish; at
//! most 64 ordinary calls hold a connection to SnowLuma, the others wait.

use std::time::Duration;

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

fn session(fake: &Fake, mode: &str, extra: &[(&str, &str)]) -> Mcp {
    let url = fake.fake.url();
    let mut env = vec![("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", mode)];
    env.extend_from_slice(extra);
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    s
}

fn send_call(s: &mut Mcp, tool: &str, args: Value) -> i64 {
    let id = s.next_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}));
    id
}

fn count(fake: &Fake, action: &str) -> usize {
    fake.fake.requests().iter().filter(|r| r.action.as_deref() == Some(action)).count()
}

fn wait_count(fake: &Fake, action: &str, n: usize) {
    wait_until(&format!("{n} {action} requests arrive"), || {
        let c = count(fake, action);
        if c >= n { Ok(()) } else { Err(format!("only {c} arrived")) }
    });
}

/// 100 000 keyword terms (a 200 KB line) used to keep the catalog worker,
/// and every documentation tool, busy for minutes: now a clear error at once.
#[test]
fn a_keyword_query_has_at_most_32_terms() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    let query = vec!["a"; 100_000].join(" ");
    let r = s.call("search_actions", json!({"query": query, "match": "keywords"}));
    assert!(is_error(&r));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "invalid_arguments");
    assert!(text(&r).contains("最多 32 个关键词"), "{}", text(&r));
    let r = s.call("search_actions", json!({"query": vec!["group"; 32].join(" "), "match": "keywords"}));
    assert!(!is_error(&r));
}

/// 100 calls against a SnowLuma that never answers: 64 connections are
/// opened, the rest wait their turn; cancelling frees the turns and the
/// session goes on.
#[test]
fn connections_to_snowluma_are_capped() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "600000")]);
    let ids: Vec<i64> = (0..100).map(|_| send_call(&mut s, "query_action", json!({"action": "get_status"}))).collect();
    wait_count(&fake, "get_status", 64);
    // Give the other 36 every chance to connect: they must not.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count(&fake, "get_status"), 64, "at most 64 calls hold a connection");
    fake.fake.clear_fault("get_status");
    for id in &ids {
        s.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
    }
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r), "the session goes on");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "and the executor answers again: {r}");
}

/// 300 pipelined calls that each take their whole timeout: the server
/// accepts 256, reads the next message only once one is answered, and
/// answers everything.
#[test]
fn requests_in_flight_are_capped_per_session() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "1500")]);
    let ids: Vec<i64> = (0..300).map(|_| send_call(&mut s, "query_action", json!({"action": "get_status"}))).collect();
    let ping = s.next_id();
    s.send(&json!({"jsonrpc": "2.0", "id": ping, "method": "ping"}));
    let mut answered_before_ping = 0;
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + SAFETY;
    loop {
        let m = s.recv_before(deadline);
        let Some(id) = m["id"].as_i64() else { continue };
        if id == ping {
            break;
        }
        assert_eq!(m["result"]["structuredContent"]["diagnostics"]["kind"], "timeout");
        seen.insert(id);
        answered_before_ping += 1;
    }
    assert!(answered_before_ping >= 300 - 255, "the ping was read only after calls finished: {answered_before_ping}");
    while seen.len() < ids.len() {
        let m = s.recv_before(deadline);
        if let Some(id) = m["id"].as_i64() {
            seen.insert(id);
        }
    }
}

/// Peak resident memory of a process (VmHWM), in MiB.
fn peak_mib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

/// 60 pipelined calls of 7.9 MiB each (474 MiB) stay within a bounded
/// footprint in the supervisor and the executor: well under the packaged
/// unit's MemoryMax=1G for the whole tree.
#[test]
fn pipelined_large_calls_take_bounded_memory() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "read", &[]);
    let executor = s.wait_worker("network");
    let big = "x".repeat(7_900_000);
    let line = |id: i64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"query_action","arguments":{{"action":"get_status","params":{{"s":"{big}"}}}}}}}}"#
        )
    };
    let n = 60;
    let ids: Vec<i64> = (0..n).map(|_| s.next_id()).collect();
    for id in &ids {
        s.send_raw(&line(*id));
    }
    for id in &ids {
        let r = s.wait_for(&json!(id));
        assert_eq!(r["result"]["isError"], false, "call {id}");
    }
    let sup = peak_mib(s.child.id() as i32);
    let exe = peak_mib(executor);
    eprintln!("peak RSS: supervisor {sup} MiB, executor {exe} MiB");
    // Unbounded, the supervisor alone would hold all 474 MiB of request text.
    assert!(sup < 400, "supervisor peak {sup} MiB");
    assert!(exe < 300, "executor peak {exe} MiB");
}

/// A generic stream trickled a byte every 20 ms never trips the 1 s idle
/// timeout, but must still finish within the request timeout as a whole.
#[test]
fn a_trickling_generic_stream_has_an_overall_deadline() {
    let fake = Fake::start(None);
    fake.fake.set_fault("test_download_stream", Fault::Trickle(Duration::from_millis(20)));
    let mut s = session(&fake, "write", &[("SNOWLUMA_MCP_TIMEOUT_MS", "1000")]);
    let r = s.call("invoke_action", json!({"action": "test_download_stream"}));
    assert!(is_error(&r), "{r}");
    assert_eq!(structured(&r)["diagnostics"]["kind"], "timeout");
    assert!(text(&r).contains("did not finish within"), "{}", text(&r));
}
