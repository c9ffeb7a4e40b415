#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Idempotent writes (`execution.idempotency_key`) and the opt-in
//! confirmation of actions (`SNOWLUMA_MCP_CONFIRM_ACTIONS`) through the
//! built binary over stdio, in raw JSON-RPC, both eras; the fake SnowLuma
//! shows what was executed and the audit log what was decided.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

struct Env {
    fake: Fake,
    dir: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn env(name: &str) -> Env {
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-safe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Env { fake: Fake::start(Some("t")), dir }
}

impl Env {
    fn log(&self) -> PathBuf {
        self.dir.join("audit.jsonl")
    }

    fn task_dir(&self) -> PathBuf {
        self.dir.join("tasks")
    }

    /// A write-mode session auditing to [`Env::log`], with `extra` variables
    /// (given after the defaults, so they win). Send pacing is off: these
    /// tests send to one group in quick succession on purpose
    /// (`replays_pass_the_pacing` turns it on; `safety.rs` tests pacing).
    fn spawn(&self, extra: &[(&str, &str)]) -> Mcp {
        let url = self.fake.fake.url();
        let log = self.log().display().to_string();
        let sd = self.dir.join("downloads").display().to_string();
        let mut vars = vec![
            ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
            ("SNOWLUMA_MCP_TOKEN", "t"),
            ("SNOWLUMA_MCP_MODE", "write"),
            ("SNOWLUMA_MCP_AUDIT_LOG", log.as_str()),
            ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
            ("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0"),
            ("SNOWLUMA_MCP_SEND_BURST", "0"),
        ];
        vars.extend_from_slice(extra);
        Mcp::spawn(&vars)
    }

    /// [`Env::spawn`] keeping keys in [`Env::task_dir`].
    fn spawn_persistent(&self, extra: &[(&str, &str)]) -> Mcp {
        let td = self.task_dir().display().to_string();
        let mut vars = vec![("SNOWLUMA_MCP_TASK_DIR", td.as_str())];
        vars.extend_from_slice(extra);
        self.spawn(&vars)
    }

    /// How many requests for `action` reached the fake.
    fn sent(&self, action: &str) -> usize {
        self.fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some(action)).count()
    }

    fn records(&self) -> Vec<Value> {
        records(&self.log())
    }
}

fn records(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(t) => t.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The `(phase, canonical action)` of every execution record.
fn phases(recs: &[Value]) -> Vec<(String, String)> {
    recs.iter()
        .filter(|r| r.get("canonical").is_some())
        .map(|r| (r["phase"].as_str().unwrap().to_owned(), r["canonical"].as_str().unwrap().to_owned()))
        .collect()
}

/// `snowluma-mcp audit verify LOG` accepts the log (the new record kinds included).
fn verify(log: &Path) {
    let out = std::process::Command::new(bin_path()).arg("audit").arg("verify").arg(log).env_clear().bounded_output();
    let out = out.unwrap();
    assert!(out.status.success(), "audit verify: {}", String::from_utf8_lossy(&out.stderr));
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

/// End a session the way a client does, and wait for it to exit (so that
/// its task-directory lease is free for the next one).
fn finish(mut s: Mcp) {
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the session exits");
    assert!(status.success(), "{status:?}");
}

fn send(key: &str, group: i64) -> Value {
    json!({
        "action": "send_group_msg",
        "params": {"group_id": group, "message": "hello"},
        "execution": {"idempotency_key": key}
    })
}

fn kick() -> Value {
    json!({"action": "set_group_kick", "params": {"group_id": 20001, "user_id": 30001}})
}

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

/// The first call runs; the same key, action and params again is answered
/// from the record (marked replayed, nothing sent); other params are a
/// conflict; the key's shape and the tools it is for are checked. Both eras.
#[test]
fn a_key_runs_once_and_replays_its_outcome() {
    let e = env("replay");
    let mut s = e.spawn(&[]);
    s.initialize("2025-11-25");
    let first = s.call("invoke_action", send("k-1", 20001));
    assert!(!is_error(&first), "{first}");
    assert_eq!(diag(&first)["outcome"], "success");
    assert!(diag(&first).get("replayed").is_none(), "{first}");
    for _ in 0..3 {
        let again = s.call("invoke_action", send("k-1", 20001));
        assert_eq!(diag(&again)["replayed"], true, "{again}");
        assert_eq!(structured(&again)["result"], structured(&first)["result"], "the recorded result");
        assert_eq!(diag(&again)["outcome"], "success");
    }
    // The modern era shares the runtime's keys; aliases name the same action.
    let modern = s.call_modern("invoke_action", send("k-1", 20001), json!({}));
    assert_eq!(diag(&modern)["replayed"], true, "{modern}");
    assert_eq!(e.sent("send_group_msg"), 1, "exactly one call reached SnowLuma");

    let other = s.call("invoke_action", send("k-1", 20002));
    assert!(is_error(&other), "{other}");
    assert_eq!(diag(&other)["kind"], "idempotency_conflict", "{other}");
    assert!(diag(&other)["message"].as_str().unwrap().contains("send_group_msg"));
    assert_eq!(e.sent("send_group_msg"), 1, "a conflict sends nothing");

    for bad in [json!(""), json!("x".repeat(129)), json!("tab\there"), json!("é"), json!(7)] {
        let mut args = send("x", 20001);
        args["execution"]["idempotency_key"] = bad.clone();
        let r = s.call("invoke_action", args);
        assert_eq!(diag(&r)["kind"], "invalid_arguments", "{bad}: {r}");
    }
    let q = s.call("query_action", json!({"action": "get_status", "execution": {"idempotency_key": "q"}}));
    assert_eq!(diag(&q)["kind"], "invalid_arguments", "{q}");
    assert!(text(&q).contains("invoke_action"), "{q}");
    // Without a key nothing changes: every call runs.
    for _ in 0..2 {
        let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
        assert!(!is_error(&r) && diag(&r).get("replayed").is_none(), "{r}");
    }
    assert_eq!(e.sent("send_group_msg"), 3);
    let recs = e.records();
    let p = phases(&recs);
    let replayed = p.iter().filter(|(ph, _)| ph == "replayed").count();
    assert_eq!(replayed, 4, "every replay is audited: {p:?}");
    let conflict = recs.iter().find(|r| r["phase"] == "refused" && r["reason"] == "idempotency_conflict");
    assert!(conflict.is_some(), "the conflict is audited: {p:?}");
    assert_eq!(p.iter().filter(|(ph, _)| ph == "intent").count(), 3, "one intent per execution: {p:?}");
    assert!(
        !std::fs::read_to_string(e.log()).unwrap().contains("k-1"),
        "the key itself is not written to the audit log"
    );
    finish(s);
    verify(&e.log());
}

/// With send pacing on, a key's replays are not sends: of 50 concurrent
/// calls with one key one is sent and 49 replay (none is refused as
/// rate-limited); another key to the same group then is refused.
#[test]
fn replays_pass_the_pacing() {
    let e = env("paced");
    e.fake.fake.set_fault("send_group_msg", Fault::Delay(Duration::from_millis(300)));
    let mut s = e.spawn(&[("SNOWLUMA_MCP_SEND_INTERVAL_MS", "86400000")]);
    s.initialize("2025-11-25");
    let ids: Vec<Value> = (0..50)
        .map(|_| s.send_request("tools/call", json!({"name": "invoke_action", "arguments": send("paced", 20001)})))
        .collect();
    let replies: Vec<Value> = ids.iter().map(|id| s.wait_for(id)["result"].clone()).collect();
    assert_eq!(e.sent("send_group_msg"), 1, "exactly one of 50 reached SnowLuma");
    assert!(replies.iter().all(|r| !is_error(r)), "{replies:?}");
    assert_eq!(replies.iter().filter(|r| diag(r)["replayed"] == true).count(), 49);
    let other = s.call("invoke_action", send("paced-2", 20001));
    assert_eq!(diag(&other)["kind"], "rate_limited", "{other}");
    assert_eq!(e.sent("send_group_msg"), 1);
    finish(s);
}

/// 50 concurrent calls with one key: exactly one reaches the fake; the
/// others wait for it and get its outcome, marked replayed.
#[test]
fn fifty_concurrent_calls_with_one_key_send_once() {
    let e = env("burst");
    e.fake.fake.set_fault("send_group_msg", Fault::Delay(Duration::from_millis(300)));
    let mut s = e.spawn(&[]);
    s.initialize("2025-11-25");
    let ids: Vec<Value> = (0..50)
        .map(|_| s.send_request("tools/call", json!({"name": "invoke_action", "arguments": send("burst", 20001)})))
        .collect();
    let replies: Vec<Value> = ids.iter().map(|id| s.wait_for(id)["result"].clone()).collect();
    assert_eq!(e.sent("send_group_msg"), 1, "exactly one of 50 reached SnowLuma");
    let replayed = replies.iter().filter(|r| diag(r)["replayed"] == true).count();
    assert_eq!(replayed, 49);
    for r in &replies {
        assert!(!is_error(r), "{r}");
        assert_eq!(structured(r)["result"], structured(&replies[0])["result"]);
    }
    // The same with modern requests (each with its own _meta), another key.
    let ids: Vec<Value> = (0..50)
        .map(|_| {
            s.send_request(
                "tools/call",
                json!({"name": "invoke_action", "arguments": send("burst-2", 20001), "_meta": modern_meta()}),
            )
        })
        .collect();
    let replies: Vec<Value> = ids.iter().map(|id| s.wait_for(id)["result"].clone()).collect();
    assert_eq!(e.sent("send_group_msg"), 2, "exactly one more of 50 reached SnowLuma");
    assert_eq!(replies.iter().filter(|r| diag(r)["replayed"] == true).count(), 49);
}

/// While another runtime holds the task directory's lease, a keyed call is
/// refused (nothing sent, audited); a call without a key runs.
#[test]
fn a_key_that_cannot_be_kept_is_refused() {
    let e = env("leased");
    let mut a = e.spawn_persistent(&[]);
    a.initialize("2025-11-25");
    let r = a.call("invoke_action", send("l-1", 20001));
    assert!(!is_error(&r), "{r}");
    let mut b = e.spawn_persistent(&[]);
    b.initialize("2025-11-25");
    let r = b.call("invoke_action", send("l-2", 20001));
    assert_eq!(diag(&r)["kind"], "idempotency_unavailable", "{r}");
    assert!(text(&r).contains("lease"), "{r}");
    assert_eq!(e.sent("send_group_msg"), 1, "nothing sent");
    let refused = e.records().into_iter().find(|r| r["phase"] == "refused").unwrap();
    assert_eq!(refused["reason"], "idempotency_unavailable");
    let r = b.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
    assert!(!is_error(&r), "{r}");
    finish(b);
    finish(a);
}

/// An unknown outcome is replayed as unknown: nothing is executed twice.
#[test]
fn an_unknown_outcome_is_replayed_as_unknown() {
    let e = env("unknown");
    e.fake.fake.set_fault("send_group_msg", Fault::Hang);
    let mut s = e.spawn(&[("SNOWLUMA_MCP_TIMEOUT_MS", "300")]);
    s.initialize("2025-11-25");
    let first = s.call("invoke_action", send("u", 20001));
    assert_eq!(diag(&first)["outcome"], "unknown", "{first}");
    e.fake.fake.clear_fault("send_group_msg");
    let again = s.call("invoke_action", send("u", 20001));
    assert_eq!((diag(&again)["outcome"].clone(), diag(&again)["replayed"].clone()), (json!("unknown"), json!(true)));
    assert_eq!(e.sent("send_group_msg"), 1, "not sent again");
}

/// With a task directory keys survive a restart (a finished call replays its
/// outcome; one in flight when the server was killed replays as unknown),
/// live 24 hours, and are kept as private records beside the tasks.
#[test]
fn keys_survive_a_restart_with_a_task_directory() {
    let e = env("restart");
    let mut s = e.spawn_persistent(&[]);
    s.initialize("2025-11-25");
    let first = s.call("invoke_action", send("r-1", 20001));
    assert!(!is_error(&first), "{first}\n{}", s.stderr_text());
    let info = s.call("get_runtime_info", json!({}));
    assert_eq!(structured(&info)["result"]["idempotency"]["persistent"], true, "{info}");
    finish(s);
    let keys: Vec<_> = std::fs::read_dir(e.task_dir())
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("key-"))
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let body = std::fs::read_to_string(e.task_dir().join(&keys[0])).unwrap();
    assert!(!body.contains("r-1") && !body.contains("hello"), "neither the key nor the params are stored: {body}");

    let mut s = e.spawn_persistent(&[]);
    s.initialize("2025-11-25");
    let again = s.call("invoke_action", send("r-1", 20001));
    assert_eq!(diag(&again)["replayed"], true, "{again}\n{}", s.stderr_text());
    assert_eq!(structured(&again)["result"], structured(&first)["result"]);
    let other = s.call("invoke_action", send("r-1", 20009));
    assert_eq!(diag(&other)["kind"], "idempotency_conflict", "{other}");
    assert_eq!(e.sent("send_group_msg"), 1);
    // Killed while a keyed call is in flight: the next run says unknown.
    e.fake.fake.set_fault("send_group_msg", Fault::Hang);
    let id = s.send_request("tools/call", json!({"name": "invoke_action", "arguments": send("r-2", 20001)}));
    wait_until("the call reaches the fake", || (e.sent("send_group_msg") == 2).then_some(()));
    let _ = id;
    for pid in s.worker_pids() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = s.child.kill();
    let _ = s.child.wait();
    drop(s);
    e.fake.fake.clear_fault("send_group_msg");
    let (s, r) = wait_until("a new session gets the lease", || {
        let mut s = e.spawn_persistent(&[]);
        s.initialize("2025-11-25");
        let r = s.call("invoke_action", send("r-2", 20001));
        if diag(&r)["kind"] == "idempotency_unavailable" { Err(r.to_string()) } else { Ok((s, r)) }
    });
    assert_eq!((diag(&r)["outcome"].clone(), diag(&r)["replayed"].clone()), (json!("unknown"), json!(true)), "{r}");
    assert_eq!(e.sent("send_group_msg"), 2, "the call in flight was not executed again");
    finish(s);
    // 24 hours later the keys are gone: the call runs again.
    let day = (24 * 3600 * 1000 + 1000).to_string();
    let mut s = e.spawn_persistent(&[("SNOWLUMA_MCP_IDEMPOTENCY_CLOCK_OFFSET_MS", day.as_str())]);
    s.initialize("2025-11-25");
    let later = s.call("invoke_action", send("r-1", 20001));
    assert!(!is_error(&later) && diag(&later).get("replayed").is_none(), "{later}\n{}", s.stderr_text());
    assert_eq!(e.sent("send_group_msg"), 3);
    finish(s);
}

/// Without `SNOWLUMA_MCP_CONFIRM_ACTIONS` nothing is confirmed (existing
/// configurations are unchanged); the runtime overview shows the list.
#[test]
fn unset_confirmation_changes_nothing() {
    let e = env("unset");
    let mut s = e.spawn(&[]);
    s.initialize("2025-11-25");
    let r = s.call("invoke_action", kick());
    assert!(!is_error(&r), "{r}");
    assert_eq!(e.sent("set_group_kick"), 1);
    let info = s.call("get_runtime_info", json!({}));
    assert_eq!(structured(&info)["result"]["confirmation"]["enabled"], false, "{info}");
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive,send_like")]);
    s.initialize("2025-11-25");
    let info = s.call("get_runtime_info", json!({}));
    let c = &structured(&info)["result"]["confirmation"];
    assert_eq!((c["enabled"].clone(), c["presets"].clone()), (json!(true), json!(["destructive"])), "{info}");
    let actions: Vec<&str> = c["actions"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for a in
        ["set_group_kick", "set_group_ban", "set_group_whole_ban", "set_group_leave", "delete_friend", "delete_msg"]
    {
        assert!(actions.contains(&a), "{a}: {actions:?}");
    }
    assert!(actions.contains(&"send_like"));
    // An unknown name refuses startup, naming the variable.
    let out = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_CONFIRM_ACTIONS", "no_such_action")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"));
}

/// A legacy client with form elicitation: asked within the call; accept
/// runs once (the confirmation recorded before the intent, same op_id),
/// decline and cancel run nothing; without form elicitation nothing runs.
#[test]
fn legacy_clients_confirm_through_elicitation() {
    let e = env("legacy");
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive")]);
    s.initialize_with("2025-11-25", elicitation());
    for (answer, ran) in [
        (json!({"action": "accept", "content": {"confirm": true}}), true),
        (json!({"action": "decline"}), false),
        (json!({"action": "accept", "content": {"confirm": false}}), false),
        (json!({"action": "cancel"}), false),
    ] {
        let before = e.sent("set_group_kick");
        let id = s.send_request("tools/call", json!({"name": "invoke_action", "arguments": kick()}));
        let ask = s.wait_server_request("elicitation/create");
        let p = &ask["params"];
        assert_eq!(p["mode"], "form", "{ask}");
        let m = p["message"].as_str().unwrap();
        assert!(m.contains("set_group_kick") && m.contains("20001") && m.contains("30001"), "{m}");
        assert!(m.contains(r#"{"group_id":20001,"user_id":30001}"#), "the exact params: {m}");
        assert_eq!(p["requestedSchema"]["properties"]["confirm"]["type"], "boolean", "{ask}");
        assert_eq!(e.sent("set_group_kick"), before, "nothing runs before the answer");
        s.respond(&ask["id"], answer.clone());
        let r = s.wait_for(&id)["result"].clone();
        assert_eq!(e.sent("set_group_kick"), before + usize::from(ran), "{answer}: {r}");
        if ran {
            assert!(!is_error(&r), "{r}");
        } else {
            assert_eq!(diag(&r)["kind"], "not_confirmed", "{r}");
            assert!(text(&r).contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "{r}");
        }
    }
    let recs = e.records();
    let confirmations: Vec<&str> =
        recs.iter().filter(|r| r["phase"] == "confirmation").map(|r| r["decision"].as_str().unwrap()).collect();
    assert_eq!(confirmations, ["accepted", "declined", "declined", "cancelled"]);
    let accepted = recs.iter().position(|r| r["phase"] == "confirmation").unwrap();
    assert_eq!(recs[accepted + 1]["phase"], "intent", "the confirmation comes right before the intent");
    assert_eq!(recs[accepted + 1]["op_id"], recs[accepted]["op_id"]);
    assert_eq!(recs.iter().filter(|r| r["phase"] == "intent").count(), 1);

    // Without form elicitation: refused, audited, nothing sent.
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "set_group_kick")]);
    s.initialize("2025-11-25");
    let r = s.call("invoke_action", kick());
    assert_eq!(diag(&r)["kind"], "not_confirmed", "{r}");
    assert!(text(&r).contains("SNOWLUMA_MCP_CONFIRM_ACTIONS") && text(&r).contains("form elicitation"), "{r}");
    assert_eq!(e.sent("set_group_kick"), 1);
    let refused = e.records().into_iter().rev().find(|r| r["phase"] == "refused").unwrap();
    assert_eq!(refused["reason"], "confirmation_unavailable");
    // Actions not listed run at once.
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
    assert!(!is_error(&r), "{r}");
    finish(s);
    verify(&e.log());
}

fn modern_call(s: &mut Mcp, args: &Value, caps: &Value) -> Value {
    s.request(
        "tools/call",
        json!({"name": "invoke_action", "arguments": args, "_meta": modern_meta_with(caps.clone())}),
    )
}

fn modern_answer(s: &mut Mcp, args: &Value, state: &str, answer: Value) -> Value {
    s.request(
        "tools/call",
        json!({
            "name": "invoke_action", "arguments": args, "_meta": modern_meta_with(elicitation()),
            "inputResponses": {"confirm": answer}, "requestState": state
        }),
    )
}

/// The `requestState` of an `input_required` confirmation.
fn confirmation_state(msg: &Value) -> String {
    let r = &msg["result"];
    assert_eq!(r["resultType"], "input_required", "{msg}");
    let req = &r["inputRequests"]["confirm"];
    assert_eq!(req["method"], "elicitation/create", "{msg}");
    assert!(req["params"]["message"].as_str().unwrap().contains("set_group_kick"), "{msg}");
    r["requestState"].as_str().unwrap().to_owned()
}

/// A modern client: `input_required` with a sealed, one-shot, expiring
/// state bound to the exact arguments; accept runs once, decline runs
/// nothing; a client that declares no form elicitation is refused.
#[test]
fn modern_clients_confirm_through_input_required() {
    let e = env("modern");
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive")]);
    let st = confirmation_state(&modern_call(&mut s, &kick(), &elicitation()));
    assert_eq!(e.sent("set_group_kick"), 0);
    // Bound to the exact params.
    let mut other = kick();
    other["params"]["user_id"] = json!(30002);
    let r = modern_answer(&mut s, &other, &st, json!({"action": "accept", "content": {"confirm": true}}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // A retry without the answer is asked again with the same state.
    let again = s.request(
        "tools/call",
        json!({"name": "invoke_action", "arguments": kick(), "_meta": modern_meta_with(elicitation()), "requestState": st}),
    );
    assert_eq!(confirmation_state(&again), st);
    let done = modern_answer(&mut s, &kick(), &st, json!({"action": "accept", "content": {"confirm": true}}));
    assert!(!is_error(&done["result"]), "{done}");
    assert_eq!(e.sent("set_group_kick"), 1);
    let reused = modern_answer(&mut s, &kick(), &st, json!({"action": "accept", "content": {"confirm": true}}));
    let m = reused["error"]["message"].as_str().unwrap();
    assert!(m.contains("already used") && m.contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "names the setting: {reused}");
    assert_eq!(reused["error"]["code"], -32602, "{reused}");
    let st = confirmation_state(&modern_call(&mut s, &kick(), &elicitation()));
    let declined = modern_answer(&mut s, &kick(), &st, json!({"action": "decline"}));
    assert_eq!(diag(&declined["result"])["kind"], "not_confirmed", "{declined}");
    let none = modern_call(&mut s, &kick(), &json!({}));
    assert_eq!(diag(&none["result"])["kind"], "not_confirmed", "{none}");
    assert_eq!(e.sent("set_group_kick"), 1, "only the accepted one ran");
    let decisions: Vec<String> = e
        .records()
        .iter()
        .filter(|r| r["phase"] == "confirmation")
        .map(|r| r["decision"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(decisions, ["accepted", "declined"]);
    // Expired (the continuation clock moved past its 10 minutes).
    let mut s =
        e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive"), ("SNOWLUMA_MCP_INPUT_CLOCK_OFFSET_MS", "601000")]);
    let st = confirmation_state(&modern_call(&mut s, &kick(), &elicitation()));
    let expired = modern_answer(&mut s, &kick(), &st, json!({"action": "accept", "content": {"confirm": true}}));
    let m = expired["error"]["message"].as_str().unwrap();
    assert!(m.contains("expired") && m.contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "names the setting: {expired}");
    assert!(m.contains("set_group_kick") && m.contains("未执行任何操作"), "{expired}");
    assert_eq!(expired["error"]["code"], -32602, "{expired}");
    let refused = e.records().into_iter().rev().find(|r| r["phase"] == "refused").unwrap();
    assert_eq!(refused["reason"], "input_expired", "{refused}");
    // An expired input-completion state (an action not to confirm) keeps
    // input completion's text.
    let args = json!({"action": "send_group_msg", "params": {"group_id": 20001}});
    let call = |extra: Value| {
        let mut p =
            json!({"name": "invoke_action_with_input", "arguments": args, "_meta": modern_meta_with(elicitation())});
        p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        p
    };
    let first = s.request("tools/call", call(json!({})));
    let st = first["result"]["requestState"].as_str().unwrap().to_owned();
    let answer = json!({"action": "accept", "content": {"params_json": "{\"message\": \"hi\"}"}});
    let input = s.request("tools/call", call(json!({"requestState": st, "inputResponses": {"params": answer}})));
    let m = input["error"]["message"].as_str().unwrap();
    assert!(m.contains("expired") && !m.contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "{input}");
    assert_eq!(input["error"]["code"], -32602, "{input}");
    assert_eq!((e.sent("set_group_kick"), e.sent("send_group_msg")), (1, 0));
}

/// invoke_action_with_input: missing params first, then the confirmation;
/// a keyed confirmed call replays without asking again.
#[test]
fn confirmation_after_input_and_replays_without_asking() {
    let e = env("with-input");
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive")]);
    s.initialize_with("2025-11-25", elicitation());
    let args =
        json!({"action": "set_group_kick", "params": {"group_id": 20001}, "execution": {"idempotency_key": "kick-1"}});
    let id = s.send_request("tools/call", json!({"name": "invoke_action_with_input", "arguments": args}));
    let ask = s.wait_server_request("elicitation/create");
    assert!(ask["params"]["requestedSchema"]["properties"].get("params_json").is_some(), "{ask}");
    s.respond(&ask["id"], json!({"action": "accept", "content": {"params_json": "{\"user_id\": 30001}"}}));
    let ask = s.wait_server_request("elicitation/create");
    assert!(ask["params"]["message"].as_str().unwrap().contains("30001"), "the merged params: {ask}");
    s.respond(&ask["id"], json!({"action": "accept", "content": {"confirm": true}}));
    let r = s.wait_for(&id)["result"].clone();
    assert!(!is_error(&r), "{r}");
    assert_eq!(e.sent("set_group_kick"), 1);
    let keyed = json!({"action": "set_group_kick", "params": {"group_id": 20001, "user_id": 30001}, "execution": {"idempotency_key": "kick-1"}});
    let again = s.call("invoke_action", keyed);
    assert_eq!(diag(&again)["replayed"], true, "a replay asks nothing: {again}");
    assert!(s.server_requests_in_backlog("elicitation/create").is_empty());
    assert_eq!(e.sent("set_group_kick"), 1);
}

/// A modern invoke_action_with_input: a params round, then a confirmation
/// round (its state carries the answers), then one execution.
#[test]
fn modern_input_then_confirmation() {
    let e = env("modern-input");
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive")]);
    let args = json!({"action": "set_group_kick", "params": {"group_id": 20001}});
    let call = |extra: Value| {
        let mut p =
            json!({"name": "invoke_action_with_input", "arguments": args, "_meta": modern_meta_with(elicitation())});
        if let Value::Object(m) = extra {
            p.as_object_mut().unwrap().extend(m);
        }
        p
    };
    let first = s.request("tools/call", call(json!({})));
    let r = &first["result"];
    assert_eq!(r["resultType"], "input_required", "{first}");
    assert!(r["inputRequests"]["params"].is_object(), "params first: {first}");
    let st = r["requestState"].as_str().unwrap().to_owned();
    let answer = json!({"action": "accept", "content": {"params_json": "{\"user_id\": 30001}"}});
    let second = s.request("tools/call", call(json!({"requestState": st, "inputResponses": {"params": answer}})));
    let st = confirmation_state(&second);
    assert!(
        second["result"]["inputRequests"]["confirm"]["params"]["message"].as_str().unwrap().contains("30001"),
        "the merged params are confirmed: {second}"
    );
    assert_eq!(e.sent("set_group_kick"), 0);
    let yes = json!({"action": "accept", "content": {"confirm": true}});
    let done = s.request("tools/call", call(json!({"requestState": st, "inputResponses": {"confirm": yes}})));
    assert!(!is_error(&done["result"]), "{done}");
    let bodies: Vec<Value> = e
        .fake
        .fake
        .requests()
        .into_iter()
        .filter(|q| q.action.as_deref() == Some("set_group_kick"))
        .map(|q| q.json().unwrap())
        .collect();
    assert_eq!(bodies, [json!({"action": "set_group_kick", "params": {"group_id": 20001, "user_id": 30001}})]);
    let again = s.request("tools/call", call(json!({"requestState": st, "inputResponses": {"confirm": yes}})));
    assert_eq!(again["error"]["code"], -32602, "one-shot: {again}");
    let m = again["error"]["message"].as_str().unwrap();
    assert!(m.contains("already used") && m.contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "names the setting: {again}");
    assert_eq!(e.sent("set_group_kick"), 1);
}

/// preview_message: a send that needs confirmation is blocked for a client
/// that cannot answer a form and flagged for one that can.
#[test]
fn preview_accounts_for_confirmation() {
    let e = env("preview");
    let args = json!({"message_type": "group", "target_id": 20001, "text": "hi"});
    let mut s = e.spawn(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "send_group_msg")]);
    s.initialize("2025-11-25");
    let r = structured(&s.call("preview_message", args.clone()))["result"].clone();
    assert_eq!(r["can_send"], false, "{r}");
    assert!(r["send_blocked_by"].as_str().unwrap().contains("SNOWLUMA_MCP_CONFIRM_ACTIONS"), "{r}");
    let r = structured(&s.call_modern("preview_message", args.clone(), json!({})))["result"].clone();
    assert_eq!(r["can_send"], false, "{r}");
    let m = s.ok(
        "tools/call",
        json!({"name": "preview_message", "arguments": args, "_meta": modern_meta_with(elicitation())}),
    );
    let r = &structured(&m)["result"];
    assert_eq!((r["can_send"].clone(), r["needs_confirmation"].clone()), (json!(true), json!(true)), "{r}");
    let mut s = e.spawn(&[]);
    s.initialize("2025-11-25");
    let r =
        structured(&s.call("preview_message", json!({"message_type": "group", "target_id": 1, "text": "x"})))["result"]
            .clone();
    assert_eq!(r["can_send"], true);
    assert!(r.get("needs_confirmation").is_none(), "{r}");
    assert!(e.fake.fake.requests().is_empty());
}

/// A background task cannot ask: a listed stream action is refused there.
#[test]
fn background_tasks_refuse_actions_that_need_confirmation() {
    let e = env("background");
    std::fs::create_dir_all(e.dir.join("uploads")).unwrap();
    let mut s = e.spawn_persistent(&[("SNOWLUMA_MCP_CONFIRM_ACTIONS", "download_file_stream")]);
    let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let r = s.request(
        "tools/call",
        json!({
            "name": "invoke_action_background",
            "arguments": {"action": "download_file_stream", "params": {"file": "x"}},
            "_meta": modern_meta_with(caps)
        }),
    );
    assert_eq!(diag(&r["result"])["kind"], "not_confirmed", "{r}");
    assert!(e.fake.fake.requests().is_empty());
    let refused = e.records().into_iter().find(|r| r["phase"] == "refused").unwrap();
    assert_eq!(refused["reason"], "confirmation_unavailable");
}
