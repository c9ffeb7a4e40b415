#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Worker lifecycle: a killed worker fails the call in flight explicitly and
//! is restarted; workers get an empty environment and no secrets.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use snowluma_e2e::*;

#[test]
fn killing_the_catalog_worker_fails_the_call_in_flight_and_the_next_succeeds() {
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_LOG", "info,snowluma_mcp=debug")]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let dispatched_before = s.stderr_text().matches("request dispatched").count();
    let pid = Pid::from_raw(s.wait_worker("catalog"));

    // Freeze the worker so the next call is certainly in flight, then kill it.
    kill(pid, Signal::SIGSTOP).unwrap();
    let id = json!(s.next_id());
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "list_categories", "arguments": {}}}));
    // Wait until the supervisor has handed the call to the (frozen) worker,
    // so it is certainly in flight there; then kill the worker.
    wait_until("the call is dispatched", || {
        (s.stderr_text().matches("request dispatched").count() > dispatched_before).then_some(())
    });
    kill(pid, Signal::SIGKILL).unwrap();
    let r = s.wait_for(&id);
    let r = &r["result"];
    assert!(is_error(r), "{r}");
    assert_eq!(structured(r)["diagnostics"]["kind"], "worker_unavailable");
    assert!(text(r).contains("不会重试"), "{}", text(r));

    // The supervisor restarted the worker; the next call succeeds.
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r), "{r}");
    let new_pid = s.wait_worker("catalog");
    assert_ne!(new_pid, pid.as_raw());
}

#[test]
fn workers_get_an_empty_environment_and_no_token() {
    let secret = "tok-e2e-secret-value";
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/"), ("SNOWLUMA_MCP_TOKEN", secret)]);
    s.initialize("2025-11-25");
    // One call through each worker, so both have finished starting up.
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "transport", "{r}");
    let catalog = s.wait_worker("catalog");
    let network = s.wait_worker("network");
    for pid in [catalog, network] {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(env.is_empty(), "worker {pid} has an environment");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.starts_with("Name:\tsnowluma-"), "workers name themselves: {status}");
        assert!(status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{status}");
        // Only stdin, stdout, stderr and the IPC socket are open.
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut numbers: Vec<i32> = fds.iter().filter_map(|f| f.parse().ok()).collect();
        numbers.sort();
        assert!(numbers.starts_with(&[0, 1, 2, 3]), "{numbers:?}");
    }
}
