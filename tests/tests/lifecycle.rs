#![allow(clippy::unwrap_used, clippy::expect_used)]
//! How a session ends: stdin's end drains the calls already accepted; the
//! spawner dying ends the session with an error answer for each call in
//! flight and a non-zero exit; a normal end is quiet and exits 0.

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

fn call_request(s: &mut Mcp, tool: &str, args: Value) -> Value {
    let id = json!(s.next_id());
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}));
    id
}

fn server_exit(s: &mut Mcp) -> std::process::ExitStatus {
    wait_exit(&mut s.child, "the server exits")
}

/// Lines of stderr above INFO (WARN, ERROR) and any abort.
fn noisy_lines(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| {
            l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("fatal runtime error") || l.contains("panicked")
        })
        .map(str::to_owned)
        .collect()
}

/// A call still running when stdin ends (longer than rmcp's own 5 s drain)
/// is finished and answered before the server exits.
#[test]
fn stdin_eof_finishes_accepted_calls() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Delay(Duration::from_secs(6)));
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "30000")]);
    let id = call_request(&mut s, "query_action", json!({"action": "get_status"}));
    s.close_stdin();
    let r = s.wait_for(&id);
    let result = &r["result"];
    assert_eq!(result["isError"], false, "{r}");
    assert_eq!(result["structuredContent"]["diagnostics"]["outcome"], "success");
    assert!(server_exit(&mut s).success());
    assert_eq!(fake.fake.closed_while_pending(), Vec::<String>::new(), "the call was not abandoned");
}

/// After stdin's end, a SIGTERM still ends the server at once, calls in
/// flight or not.
#[test]
fn sigterm_after_eof_ends_at_once() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[("SNOWLUMA_MCP_TIMEOUT_MS", "600000")]);
    call_request(&mut s, "query_action", json!({"action": "get_status"}));
    s.close_stdin();
    s.wait_stderr("finishing the calls in flight");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = server_exit(&mut s);
    assert!(!st.success());
}

/// The spawner dying is noticed at once: the call in flight is answered
/// with an error, one line is logged, and the server exits non-zero so that
/// the client (or systemd) starts a whole, confined server again.
#[test]
fn spawner_death_ends_the_session() {
    let fake = Fake::start(None);
    fake.fake.set_fault("get_status", Fault::Hang);
    let mut s = session(&fake, "read", &[]);
    s.wait_worker("network");
    let id = call_request(&mut s, "query_action", json!({"action": "get_status"}));
    wait_until("the fake holds the request", || {
        fake.fake.requests().iter().any(|r| r.action.as_deref() == Some("get_status")).then_some(())
    });
    let supervisor = s.child.id();
    let spawner = s
        .worker_pids()
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|st| st.split_whitespace().nth(3) == Some(&supervisor.to_string()))
        })
        .expect("the spawner is the supervisor's child");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(spawner), nix::sys::signal::Signal::SIGKILL).unwrap();
    let r = s.wait_for(&id);
    assert_eq!(r["result"]["isError"], true, "the call in flight is answered with an error: {r}");
    let st = server_exit(&mut s);
    assert!(!st.success(), "exit status {st}");
    // stderr is read on its own thread: the line may arrive after the exit.
    s.wait_stderr("the spawner process died");
    let stderr = s.stderr_text();
    assert_eq!(stderr.matches("the spawner process died").count(), 1, "{stderr}");
    // Reaped: no zombie spawner left behind by a supervisor that kept running.
    assert!(
        std::fs::read_to_string(format!("/proc/{spawner}/stat")).map(|st| !st.contains(") Z")).unwrap_or(true),
        "the spawner is reaped"
    );
}

/// A normal end of session in every mode, with and without calls, and EOF
/// before `initialize`, logs nothing above INFO and exits 0.
#[test]
fn normal_shutdown_is_quiet() {
    let fake = Fake::start(None);
    for mode in ["docs", "read", "write"] {
        for with_call in [false, true] {
            let mut s = session(&fake, mode, &[]);
            if with_call {
                s.call("list_categories", json!({}));
            }
            s.close_stdin();
            let st = server_exit(&mut s);
            assert!(st.success(), "{mode}: exit status {st}");
            // The workers report their end after the supervisor exits: wait for them.
            std::thread::sleep(Duration::from_millis(300));
            let noise = noisy_lines(&s.stderr_text());
            assert!(noise.is_empty(), "{mode} (call: {with_call}): {noise:?}");
        }
    }
    let mut s = Mcp::spawn(&[]);
    s.close_stdin();
    assert!(server_exit(&mut s).success(), "EOF before initialize is an ordinary end");
    assert!(noisy_lines(&s.stderr_text()).is_empty());
}
