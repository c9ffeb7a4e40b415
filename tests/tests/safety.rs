#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The operator's safety gates for a live QQ account, through the binary
//! against the fake SnowLuma: the target scope (SNOWLUMA_MCP_ALLOW_GROUPS /
//! ALLOW_USERS) for reads, writes, segments, event subscriptions and event
//! buffers; send pacing (SNOWLUMA_MCP_SEND_*) under 50 concurrent calls;
//! both protocol eras; refusals audited, nothing refused reaching the fake;
//! the policy shown by get_runtime_info and preview_message. No assertion
//! depends on timing: pacing windows are a day long or disabled.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::events::{group_message, private_message};

const DAY_MS: &str = "86400000";
/// Pacing off: the scope tests send several messages to one group.
const NO_PACING: [(&str, &str); 2] = [("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0"), ("SNOWLUMA_MCP_SEND_BURST", "0")];

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snowluma-e2e-safety-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spawn(fake: &Fake, extra: &[(&str, &str)]) -> Mcp {
    let url = fake.fake.url();
    let mut env =
        vec![("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "write"), ("SNOWLUMA_MCP_TOKEN", "t")];
    env.extend_from_slice(extra);
    Mcp::spawn(&env)
}

fn session(fake: &Fake, extra: &[(&str, &str)]) -> Mcp {
    let mut s = spawn(fake, extra);
    s.initialize("2025-11-25");
    s
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

fn refused_records(log: &Path, reason: &str) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["phase"] == "refused" && r["reason"] == reason)
        .collect()
}

fn sent(fake: &Fake, action: &str) -> usize {
    fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some(action)).count()
}

fn group_send(group: u64, message: Value) -> Value {
    json!({"action": "send_group_msg", "params": {"group_id": group, "message": message}})
}

fn assert_out_of_scope(r: &Value, id: &str) {
    assert!(is_error(r), "{r}");
    assert_eq!(diag(r)["kind"], "out_of_scope", "{r}");
    assert_eq!(diag(r)["outcome"], "failed");
    let m = diag(r)["message"].as_str().unwrap();
    assert!(m.contains(id) && m.contains("未发送任何请求"), "{m}");
}

/// Out-of-scope targets, for reads and writes, marked params, unmarked
/// ones, segments and message ids, are refused before anything is sent,
/// each refusal audited; in-scope calls run, and a message id this runtime
/// learned from an in-scope send may be replied to.
#[test]
fn the_scope_refuses_out_of_scope_targets_and_nothing_reaches_snowluma() {
    let dir = temp_dir("scope");
    let log = dir.join("audit.log");
    let fake = Fake::start(Some("t"));
    let mut env = vec![
        ("SNOWLUMA_MCP_ALLOW_GROUPS", "20001"),
        ("SNOWLUMA_MCP_ALLOW_USERS", "30001"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    env.extend_from_slice(&NO_PACING);
    let mut s = session(&fake, &env);
    let refusals: Vec<(&str, Value, &str)> = vec![
        ("invoke_action", group_send(20002, json!("hi")), "20002"),
        (
            "invoke_action",
            json!({"action": "send_msg", "params": {"message_type": "group", "group_id": "20002", "message": "x"}}),
            "20002",
        ),
        ("invoke_action", json!({"action": "send_private_msg", "params": {"user_id": 30002, "message": "x"}}), "30002"),
        ("query_action", json!({"action": "get_group_info", "params": {"group_id": 20003}}), "20003"),
        (
            "query_action",
            json!({"action": "get_group_member_info", "params": {"group_id": 20001, "user_id": 30009}}),
            "30009",
        ),
        (
            "invoke_action",
            json!({"action": "set_group_kick_members", "params": {"group_id": 20001, "user_id": [30001, 30007]}}),
            "30007",
        ),
        ("invoke_action", group_send(20001, json!([{"type": "at", "data": {"qq": "30002"}}])), "30002"),
        ("invoke_action", group_send(20001, json!("look [CQ:at,qq=30004]")), "30004"),
        (
            "invoke_action",
            group_send(
                20001,
                json!([{"type": "reply", "data": {"id": "-77"}}, {"type": "text", "data": {"text": "x"}}]),
            ),
            "-77",
        ),
        ("query_action", json!({"action": "get_msg", "params": {"message_id": -78}}), "-78"),
        ("query_action", json!({"action": "get_recent_contact", "params": {}}), "get_recent_contact"),
        ("query_action", json!({"action": "get_group_info", "params": {"group_id": 1.5}}), "group_id"),
    ];
    let n = refusals.len();
    for (tool, args, id) in refusals {
        let r = s.call(tool, args.clone());
        assert_out_of_scope(&r, id);
    }
    assert!(fake.fake.requests().is_empty(), "nothing out of scope reached SnowLuma: {:?}", fake.fake.requests());
    // The modern era gets the same refusal.
    let r = s.call_modern("invoke_action", group_send(20002, json!("hi")), json!({}));
    assert_out_of_scope(&r, "20002");
    assert!(fake.fake.requests().is_empty());
    assert_eq!(refused_records(&log, "out_of_scope").len(), n + 1, "every refusal is audited with its reason");

    // In scope: reads, writes, a directory list, @all and a learned reply.
    let r = s.call(
        "invoke_action",
        group_send(20001, json!([{"type": "at", "data": {"qq": "all"}}, {"type": "at", "data": {"qq": 30001}}])),
    );
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["result"]["data"]["message_id"], -123456);
    let reply = json!([{"type": "reply", "data": {"id": "-123456"}}, {"type": "text", "data": {"text": "x"}}]);
    let r = s.call("invoke_action", group_send(20001, reply));
    assert!(!is_error(&r), "a message learned from an in-scope send may be quoted: {r}");
    let r = s.call("query_action", json!({"action": "get_group_list"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(sent(&fake, "send_group_msg"), 2);
    assert_eq!(sent(&fake, "get_group_list"), 1);

    // Visible policy: sizes, not ids; preview accounts for the scope.
    let info = structured(&s.call("get_runtime_info", json!({})))["result"].clone();
    assert_eq!(info["scope"]["active"], true);
    assert_eq!(info["scope"]["groups"]["count"], 1);
    assert_eq!(info["scope"]["users"]["count"], 1);
    assert!(info["scope"]["groups"].get("ids").is_none(), "ids are not shown unless asked for");
    assert!(!info.to_string().contains("20001"), "{info}");
    let p = structured(&s.call("preview_message", json!({"message_type": "group", "target_id": 20002, "text": "hi"})))
        ["result"]
        .clone();
    assert_eq!(p["can_send"], false);
    assert!(p["send_blocked_by"].as_str().unwrap().contains("out_of_scope"), "{p}");
    let p = structured(&s.call("preview_message", json!({"message_type": "group", "target_id": 20001, "text": "hi"})))
        ["result"]
        .clone();
    assert_eq!((p["can_send"].clone(), p["send_blocked_by"].clone()), (json!(true), Value::Null));
}

/// Without the lists nothing is restricted (existing configurations), and
/// the operator may ask for the ids in get_runtime_info.
#[test]
fn an_unset_scope_restricts_nothing_and_ids_show_only_when_asked() {
    let fake = Fake::start(Some("t"));
    let mut s = session(&fake, &NO_PACING);
    let r = s.call("invoke_action", group_send(20002, json!("[CQ:reply,id=-5]hi")));
    assert!(!is_error(&r), "{r}");
    let r = s.call("query_action", json!({"action": "get_msg", "params": {"message_id": -5}}));
    assert_ne!(diag(&r)["kind"], "out_of_scope");
    let info = structured(&s.call("get_runtime_info", json!({})))["result"].clone();
    assert_eq!(info["scope"]["active"], false);
    assert_eq!(info["scope"]["groups"]["restricted"], false);
    // Defaults: pacing on, 3 s per target, a bucket of 5 regaining one per 3 s.
    let mut d = session(&fake, &[]);
    let info = structured(&d.call("get_runtime_info", json!({})))["result"].clone();
    assert_eq!(info["pacing"]["per_target_interval_ms"], 3000);
    assert_eq!(info["pacing"]["burst"], 5);
    assert_eq!(info["pacing"]["refill_ms"], 3000);
    assert!(info["pacing"]["paced_actions"].as_array().unwrap().contains(&json!("send_like")));
    let mut shown =
        session(&fake, &[("SNOWLUMA_MCP_ALLOW_GROUPS", "20002,20001"), ("SNOWLUMA_MCP_SHOW_SCOPE_IDS", "1")]);
    let info = structured(&shown.call("get_runtime_info", json!({})))["result"].clone();
    assert_eq!(info["scope"]["groups"]["ids"], json!([20001, 20002]));
    assert_eq!(info["scope"]["users"]["restricted"], false);
}

/// A bad list stops startup with one line naming the variable.
#[test]
fn bad_scope_and_pacing_values_stop_startup() {
    for (var, value) in [
        ("SNOWLUMA_MCP_ALLOW_GROUPS", "20001,abc"),
        ("SNOWLUMA_MCP_ALLOW_USERS", "0"),
        ("SNOWLUMA_MCP_SEND_INTERVAL_MS", "-1"),
        ("SNOWLUMA_MCP_SEND_BURST", "1.5"),
    ] {
        let out = std::process::Command::new(bin_path()).env_clear().env(var, value).bounded_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(var), "{err}");
    }
}

/// 50 concurrent calls (one stdio connection, none waiting for another):
/// exactly the allowed number reach the fake, every other is refused at
/// once with `rate_limited` and a retry time, audited; reads are not paced.
fn burst(fake: &Fake, env: &[(&str, &str)], targets: impl Fn(u64) -> u64, log: &Path) -> (usize, Vec<Value>) {
    let mut s = session(fake, env);
    let ids: Vec<Value> = (0..50)
        .map(|i| {
            let args = group_send(targets(i), json!("hi"));
            s.send_request("tools/call", json!({"name": "invoke_action", "arguments": args}))
        })
        .collect();
    let replies: Vec<Value> = ids.iter().map(|id| s.wait_for(id)["result"].clone()).collect();
    let passed = replies.iter().filter(|r| !is_error(r)).count();
    let limited: Vec<Value> = replies.into_iter().filter(is_error).collect();
    for r in &limited {
        assert_eq!(diag(r)["kind"], "rate_limited", "{r}");
        let ms = diag(r)["retry_after_ms"].as_u64().unwrap();
        assert!(ms > 0 && ms <= 86_400_000, "{ms}");
        assert!(diag(r)["message"].as_str().unwrap().contains("不会自动重试"));
    }
    assert_eq!(refused_records(log, "rate_limited").len(), limited.len(), "each refusal is audited");
    // Reads are never paced.
    for _ in 0..5 {
        assert!(!is_error(&s.call("query_action", json!({"action": "get_status"}))));
    }
    (passed, limited)
}

#[test]
fn the_per_target_interval_holds_under_50_concurrent_calls() {
    let dir = temp_dir("interval");
    let log = dir.join("audit.log");
    let fake = Fake::start(Some("t"));
    let env = [
        ("SNOWLUMA_MCP_SEND_INTERVAL_MS", DAY_MS),
        ("SNOWLUMA_MCP_SEND_BURST", "0"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    // 50 sends to one group: one passes.
    let (passed, limited) = burst(&fake, &env, |_| 20001, &log);
    assert_eq!((passed, limited.len()), (1, 49));
    assert_eq!(sent(&fake, "send_group_msg"), 1, "exactly one reached SnowLuma");
    assert!(diag(&limited[0])["message"].as_str().unwrap().contains("SNOWLUMA_MCP_SEND_INTERVAL_MS"));
}

#[test]
fn the_global_bucket_holds_under_50_concurrent_calls() {
    let dir = temp_dir("bucket");
    let log = dir.join("audit.log");
    let fake = Fake::start(Some("t"));
    let env = [
        ("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0"),
        ("SNOWLUMA_MCP_SEND_BURST", "5"),
        ("SNOWLUMA_MCP_SEND_REFILL_MS", DAY_MS),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    // 50 sends to 50 groups: the bucket's 5 pass.
    let (passed, limited) = burst(&fake, &env, |i| 20001 + i, &log);
    assert_eq!((passed, limited.len()), (5, 45));
    assert_eq!(sent(&fake, "send_group_msg"), 5, "exactly the burst reached SnowLuma");
    assert!(diag(&limited[0])["message"].as_str().unwrap().contains("SNOWLUMA_MCP_SEND_BURST"));
}

/// Pacing in the modern era and for every paced action, not only messages:
/// a poke after a message to the same group waits out the interval; zero
/// disables it.
#[test]
fn pacing_covers_every_send_action_in_both_eras() {
    let fake = Fake::start(Some("t"));
    let mut s = spawn(&fake, &[("SNOWLUMA_MCP_SEND_INTERVAL_MS", DAY_MS), ("SNOWLUMA_MCP_SEND_BURST", "0")]);
    let r = s.call_modern("invoke_action", group_send(20001, json!("hi")), json!({}));
    assert!(!is_error(&r), "{r}");
    let poke = json!({"action": "group_poke", "params": {"group_id": 20001, "user_id": 30001}});
    let r = s.call_modern("invoke_action", poke, json!({}));
    assert_eq!(diag(&r)["kind"], "rate_limited", "{r}");
    let r = s.call_modern("invoke_action", json!({"action": "send_like", "params": {"user_id": 30001}}), json!({}));
    assert_ne!(diag(&r)["kind"], "rate_limited", "another target");
    let r = s.call_modern("invoke_action", json!({"action": "send_like", "params": {"user_id": 30001}}), json!({}));
    assert_eq!(diag(&r)["kind"], "rate_limited");
    assert_eq!(sent(&fake, "group_poke"), 0);
    assert_eq!(sent(&fake, "send_like"), 1);
    let mut off = session(&fake, &NO_PACING);
    for _ in 0..3 {
        assert!(!is_error(&off.call("invoke_action", group_send(20009, json!("hi")))));
    }
}

/// `_with_input`: the answers are checked against the scope, and the
/// pacing slot is taken only when the call runs.
#[test]
fn answers_to_with_input_are_checked_against_the_scope() {
    let fake = Fake::start(Some("t"));
    let mut s = spawn(&fake, &[("SNOWLUMA_MCP_ALLOW_GROUPS", "20001")]);
    s.initialize_with("2025-11-25", json!({"elicitation": {"form": {}}}));
    for (group, ok) in [(20002, false), (20001, true)] {
        let id = s.send_request(
            "tools/call",
            json!({"name": "invoke_action_with_input", "arguments": {"action": "send_group_msg", "params": {"message": "hi"}}}),
        );
        let ask = s.wait_server_request("elicitation/create");
        let answer = json!({"group_id": group}).to_string();
        s.respond(&ask["id"], json!({"action": "accept", "content": {"params_json": answer}}));
        let r = s.wait_for(&id)["result"].clone();
        if ok {
            assert!(!is_error(&r), "{r}");
        } else {
            assert_out_of_scope(&r, "20002");
        }
    }
    assert_eq!(sent(&fake, "send_group_msg"), 1);
}

/// Subscriptions name only in-scope ids, each refusal audited (`refused`,
/// `out_of_scope`, the tool and no ids) in a log `audit verify` accepts;
/// events outside the scope never enter a buffer (a group event by its
/// group, a private one by its user).
#[test]
fn events_outside_the_scope_never_enter_a_buffer() {
    let dir = temp_dir("events");
    let log = dir.join("audit.log");
    let fake = Fake::start(Some("t"));
    let ev = fake.start_events(Some("t"), 10001);
    let url = fake.fake.url();
    let ws = ev.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
        ("SNOWLUMA_MCP_ALLOW_GROUPS", "20001"),
        ("SNOWLUMA_MCP_ALLOW_USERS", "30001"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]);
    s.initialize("2025-11-25");
    for args in [json!({"self_id": 10001, "group_ids": [20001, 20002]}), json!({"self_id": 10001, "user_ids": [30002]})]
    {
        let r = s.call("subscribe_events", args);
        assert!(is_error(&r));
        assert_eq!(diag(&r)["kind"], "out_of_scope", "{r}");
    }
    let refused = refused_records(&log, "out_of_scope");
    assert_eq!(refused.len(), 2, "every refusal is audited with its reason: {refused:?}");
    let open: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().lines().next().unwrap()).unwrap();
    for rec in &refused {
        assert_eq!((&rec["tool"], &rec["mode"]), (&json!("subscribe_events"), &json!("read")), "{rec}");
        assert!(rec.get("action").is_none() && rec.get("canonical").is_none(), "no action: {rec}");
        assert_eq!((rec.get("peer"), rec.get("principal")), (open.get("peer"), open.get("principal")), "{rec}");
        let text = rec.to_string();
        assert!(!text.contains("20002") && !text.contains("30002"), "never the ids: {text}");
    }
    let out = std::process::Command::new(bin_path()).arg("audit").arg("verify").arg(&log).env_clear().bounded_output();
    let out = out.unwrap();
    assert!(out.status.success(), "audit verify: {}", String::from_utf8_lossy(&out.stderr));
    let r = s.call("subscribe_events", json!({"self_id": 10001}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["result"]["status"]["state"], "connected", "{r}");
    let uri = structured(&r)["result"]["uri"].as_str().unwrap().to_owned();
    for e in [
        group_message(10001, 20002, 30001, "out: group"),
        private_message(10001, 30002, "out: user"),
        group_message(10001, 20001, 30005, "in: group"),
        private_message(10001, 30001, "in: user"),
    ] {
        ev.send(&e);
    }
    let read = |s: &mut Mcp| -> Value {
        let r = s.ok("resources/read", json!({"uri": uri}));
        serde_json::from_str(r["contents"][0]["text"].as_str().unwrap()).unwrap()
    };
    let v = wait_until("both in-scope events are buffered", || {
        let v = read(&mut s);
        if v["events"].as_array().map(Vec::len) == Some(2) { Ok(v) } else { Err(v.to_string()) }
    });
    let texts = v.to_string();
    assert!(texts.contains("in: group") && texts.contains("in: user"), "{texts}");
    assert!(!texts.contains("out:"), "{texts}");
    assert!(fake.fake.requests().is_empty());
    // A message a buffer kept is in scope (the in-scope group message is id 1);
    // one never seen is not.
    let r = s.call("query_action", json!({"action": "get_msg", "params": {"message_id": 1}}));
    assert_ne!(diag(&r)["kind"], "out_of_scope", "{r}");
    assert_out_of_scope(&s.call("query_action", json!({"action": "get_msg", "params": {"message_id": 999}})), "999");
}
