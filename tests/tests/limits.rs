#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bounded work per request and per session: a keyword query has at most
//! 32 terms; at most 256 requests (and 64 MiB of their memory) are in
//! flight per session, the next ones wait for a place (stdin is still
//! read); at most 64 ordinary calls hold a connection to SnowLuma, the
//! others wait.

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

/// 256 calls in flight (against a SnowLuma that never answers) use the
/// session's budget: 44 documentation calls after them wait for a place,
/// in order, while a ping is still read and answered at once; each
/// cancellation lets the next waiting call start.
#[test]
fn requests_in_flight_are_capped_per_session() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "600000")]);
    let hanging: Vec<i64> =
        (0..256).map(|_| send_call(&mut s, "query_action", json!({"action": "get_status"}))).collect();
    let waiting: Vec<i64> = (0..44).map(|_| send_call(&mut s, "list_categories", json!({}))).collect();
    let ping = s.request("ping", json!({}));
    assert_eq!(ping["result"], json!({}), "the ping is answered although the budget is used: {ping}");
    let answered = |s: &mut Mcp| {
        s.notifications_in_backlog("none");
        s.backlog.iter().filter(|m| m["id"].as_i64().is_some_and(|id| waiting.contains(&id))).count()
    };
    assert_eq!(answered(&mut s), 0, "the documentation calls wait: 256 calls are in flight");
    // One place frees: the waiting calls take it one after another, in the
    // order they came (each answer frees the place for the next).
    s.notify("notifications/cancelled", json!({"requestId": hanging[0], "reason": "test"}));
    let mut order = Vec::new();
    let deadline = std::time::Instant::now() + SAFETY;
    while order.len() < waiting.len() {
        let m = s.recv_before(deadline);
        if let Some(id) = m["id"].as_i64().filter(|id| waiting.contains(id)) {
            assert!(!is_error(&m["result"]), "{m}");
            order.push(id);
        }
    }
    assert_eq!(order, waiting, "one place, in order");
    for id in &hanging[1..] {
        s.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
    }
    fake.fake.clear_fault("get_status");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "the session goes on: {r}");
}

/// With 256 calls in flight and 256 more waiting for a place, a further
/// request is refused at once (-32000) instead of held; the waiting ones
/// still run, and are answered before the session ends at stdin's end.
#[test]
fn requests_beyond_the_waiting_ones_are_refused() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "600000")]);
    let hanging: Vec<i64> =
        (0..256).map(|_| send_call(&mut s, "query_action", json!({"action": "get_status"}))).collect();
    let waiting: Vec<i64> = (0..256).map(|_| send_call(&mut s, "list_categories", json!({}))).collect();
    let extra = send_call(&mut s, "list_categories", json!({}));
    let r = s.wait_for(&json!(extra));
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("busy"), "{r}");
    for id in &hanging {
        s.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
    }
    s.close_stdin();
    for id in &waiting {
        let r = s.wait_for(&json!(id));
        assert!(!is_error(&r["result"]), "{r}");
    }
    let status = wait_exit(&mut s.child, "the server exits once the waiting calls are answered");
    assert!(status.success(), "{status:?}");
}

/// Peak resident memory of a process (VmHWM), in MiB.
fn peak_mib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

/// 60 pipelined calls of 7.9 MiB each (474 MiB) stay within a bounded
/// footprint in the supervisor and the executor: well under the packaged
/// unit's MemoryMax=1G for the whole tree. What the budget of calls in
/// flight and of those waiting cannot hold is refused ("busy"), not held.
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
    let mut answered = 0;
    for id in &ids {
        let r = s.wait_for(&json!(id));
        if r["error"]["code"] != -32000 {
            assert_eq!(r["result"]["isError"], false, "call {id}: {r}");
            answered += 1;
        }
    }
    assert!(answered >= 1 && s.call("list_categories", json!({}))["isError"] != true);
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

/// The largest request line allowed (8 MiB): a `tools/call` of `tool` whose
/// `arguments` are `{<open>[0,0,…]<close>}`, the array of zeros filling the
/// rest, the costliest shape to parse (one JSON value per two bytes).
fn zeros_call(id: i64, tool: &str, open: &str, close: &str) -> String {
    let head = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{{open}["#
    );
    let tail = format!("]{close}}}}}}}");
    let n = (8 * 1024 * 1024 - head.len() - tail.len()) / 2;
    let mut line = String::with_capacity(8 * 1024 * 1024);
    line.push_str(&head);
    line.push('0');
    for _ in 1..n {
        line.push_str(",0");
    }
    line.push_str(&tail);
    assert!(line.len() <= 8 * 1024 * 1024, "{}", line.len());
    line
}

/// The supervisor's stated worst case (README, Limits: "memory worst case").
const SUPERVISOR_WORST_MIB: u64 = 256;
/// The README's figure for the catalog worker and the network executor
/// under the same requests.
const WORKER_WORST_MIB: u64 = 128;

/// The largest requests the limits allow: 8 MiB `query_action` calls whose
/// params are an array of zeros (the costliest JSON to parse), more than the
/// calls in flight and those waiting can hold; documentation calls with an
/// 8 MiB argument; input-completion calls just under the per-message limit;
/// then calls and other requests far over it. Every one
/// is answered (a result, "busy" or "too large"), and the supervisor's peak
/// stays under its stated worst case (eight of the query_action calls alone
/// took it to 1.5 GiB when every request was parsed whole).
#[test]
fn the_largest_requests_stay_within_the_stated_memory() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "read", &[]);
    let (catalog, executor) = (s.wait_worker("catalog"), s.wait_worker("network"));
    let mut tally = std::collections::BTreeMap::new();
    let mut batch = |s: &mut Mcp, lines: Vec<(i64, String)>| {
        for (_, l) in &lines {
            s.send_raw(l);
        }
        let mut kinds = Vec::new();
        for (id, _) in &lines {
            let r = s.wait_for(&json!(id));
            let kind = match (&r["result"]["isError"], r["error"]["code"].as_i64()) {
                (Value::Bool(false), _) => "answered",
                (_, Some(-32000)) => "busy",
                (_, Some(-32600)) if r["error"]["message"].as_str().unwrap().contains("too large to parse") => {
                    "too large"
                }
                _ => panic!("call {id}: {r}"),
            };
            kinds.push(kind);
            *tally.entry(kind).or_insert(0) += 1;
        }
        kinds
    };
    let forwarded = batch(
        &mut s,
        (1000..1012)
            .map(|id| (id, zeros_call(id, "query_action", r#""action":"get_status","params":{"a":"#, "}")))
            .collect(),
    );
    assert!(forwarded.iter().all(|k| *k != "too large") && forwarded[0] == "answered", "{forwarded:?}");
    let text = "x".repeat(8 * 1024 * 1024 - 200);
    let docs = batch(
        &mut s,
        (2000..2008)
            .map(|id| {
                let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"list_categories","arguments":{{"junk":"{text}"}}}}}}"#);
                (id, line)
            })
            .collect(),
    );
    assert!(docs.iter().all(|k| *k != "too large") && docs[0] == "answered", "{docs:?}");
    let under = std::iter::repeat_n("0", 80_000).collect::<Vec<_>>().join(",");
    let prompts = batch(
        &mut s,
        (3000..3008)
            .map(|id| {
                let args = format!(r#"{{"action":"get_status","params":{{"a":[{under}]}}}}"#);
                (id, format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"query_action_with_input","arguments":{args}}}}}"#))
            })
            .collect(),
    );
    assert!(prompts.iter().all(|k| *k == "answered"), "under the per-message limit: {prompts:?}");
    let mut over: Vec<(i64, String)> = (4000..4004)
        .map(|id| (id, zeros_call(id, "query_action_with_input", r#""action":"get_status","params":{"a":"#, "}")))
        .collect();
    over.push((4004, zeros_call(4004, "query_action", r#""action":"get_status","junk":"#, "")));
    over.push((4006, zeros_call(4006, "list_categories", r#""junk":"#, "")));
    over.push((
        4005,
        format!(
            r#"{{"jsonrpc":"2.0","id":4005,"method":"resources/read","params":{{"uri":"snowluma://onebot/actions","x":[{}0]}}}}"#,
            "0,".repeat(4_000_000)
        ),
    ));
    let over = batch(&mut s, over);
    assert!(over.iter().all(|k| *k == "too large"), "{over:?}");
    let peak = peak_mib(s.child.id() as i32);
    eprintln!(
        "peak RSS: supervisor {peak} MiB, catalog worker {} MiB, network executor {} MiB; calls {tally:?}",
        peak_mib(catalog),
        peak_mib(executor)
    );
    assert!(peak < SUPERVISOR_WORST_MIB, "supervisor peak {peak} MiB, stated worst case {SUPERVISOR_WORST_MIB} MiB");
    for (who, pid) in [("catalog worker", catalog), ("network executor", executor)] {
        let peak = peak_mib(pid);
        assert!(peak < WORKER_WORST_MIB, "{who} peak {peak} MiB, stated worst case {WORKER_WORST_MIB} MiB");
    }
}
