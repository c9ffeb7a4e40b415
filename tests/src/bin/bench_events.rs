//! Benchmark (not a test): events per second from the fake SnowLuma's event
//! WebSocket through the network executor and the supervisor's filters into
//! 16 event resources, each with one legacy `resources/subscribe` listener,
//! and the CPU the supervisor and the network executor spend per event.
//!
//! `cargo run -p snowluma-e2e --bin bench-events [-- N]` (N events, default
//! 20000; add `--release` after building the release `snowluma-mcp`). The
//! events are group messages that pass every resource's filter (types,
//! group and user filters in several combinations), so each event is
//! filtered and buffered 16 times; update notifications are coalesced while
//! one is pending, so their count is reported, not assumed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Instant;

use serde_json::json;
use snowluma_e2e::*;
use snowluma_fake::events::group_message;

const SELF_ID: i64 = 10001;

/// CPU seconds (user + system) of one process (0 once it is gone).
fn cpu_secs(pid: i32) -> f64 {
    procfs::cpu_secs(pid).unwrap_or(0.0)
}

/// Whether `uri` has received its `n`th event: its cursor `<id>-<n>` is
/// accepted only then (a cursor newer than the last event is refused),
/// which costs the server almost nothing to check.
fn reached(s: &mut Mcp, uri: &str, n: u64) -> bool {
    let id = uri.rsplit('/').next().unwrap();
    let r = s.request("resources/read", json!({"uri": format!("{uri}?after={id}-{n}")}));
    r.get("result").is_some()
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let fake = Fake::start(Some("t"));
    let ev = fake.start_events(Some("t"), SELF_ID);
    let url = fake.fake.url();
    let ws = ev.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
        ("SNOWLUMA_MCP_LOG", "warn"),
    ]);
    s.initialize("2025-11-25");
    let filters = [
        json!({"self_id": SELF_ID}),
        json!({"self_id": SELF_ID, "types": ["message"]}),
        json!({"self_id": SELF_ID, "group_ids": [20001]}),
        json!({"self_id": SELF_ID, "user_ids": [30001]}),
        json!({"self_id": SELF_ID, "types": ["message", "notice"], "group_ids": [20001, 20002], "user_ids": [30001]}),
        json!({"self_id": SELF_ID, "group_ids": (20001..20101).collect::<Vec<i64>>()}),
        json!({"self_id": SELF_ID, "user_ids": (30001..30101).collect::<Vec<i64>>()}),
        json!({"self_id": SELF_ID, "types": ["message"], "group_ids": [20001]}),
    ];
    let mut uris = Vec::new();
    for i in 0..16 {
        let r = s.call("subscribe_events", filters[i % filters.len()].clone());
        let uri = structured(&r)["result"]["uri"].as_str().unwrap().to_owned();
        s.ok("resources/subscribe", json!({"uri": uri}));
        uris.push(uri);
    }
    assert_eq!(ev.accepted(), 1, "one socket");
    let supervisor = s.child.id() as i32;
    let executor = s.worker_pid("network").expect("network executor");
    let (sup0, exe0) = (cpu_secs(supervisor), cpu_secs(executor));
    let started = Instant::now();
    for i in 0..n {
        ev.send(&group_message(SELF_ID, 20001, 30001, &format!("event {i}")));
    }
    for uri in &uris {
        wait_until("every event reached every resource", || reached(&mut s, uri, n).then_some(()));
    }
    let secs = started.elapsed().as_secs_f64();
    let (sup1, exe1) = (cpu_secs(supervisor), cpu_secs(executor));
    let notified = s.notifications_in_backlog("notifications/resources/updated").len();
    let per_event_us = |a: f64, b: f64| (b - a) / n as f64 * 1e6;
    println!(
        "| events | resources | events/s | supervisor CPU µs/event | executor CPU µs/event | update notifications |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {n} | 16 | {:.0} | {:.1} | {:.1} | {notified} |",
        n as f64 / secs,
        per_event_us(sup0, sup1),
        per_event_us(exe0, exe1)
    );
}
