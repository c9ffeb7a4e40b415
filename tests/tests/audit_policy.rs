#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The audit log and the operator's action policy, through the binary.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use snowluma_e2e::*;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snowluma-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn verify(path: &Path) -> (bool, String) {
    let out = std::process::Command::new(bin_path())
        .args(["audit", "verify"])
        .arg(path)
        .env_clear()
        .bounded_output()
        .unwrap();
    assert!(out.stdout.is_empty(), "nothing on stdout");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

#[test]
fn writes_are_audited_intent_then_result_with_params_digested() {
    let dir = temp_dir("audit");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]);
    s.initialize("2025-11-25");
    let secret_text = "hello-private-message-text";
    let r = s.call(
        "invoke_action",
        json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": secret_text}}),
    );
    assert!(!is_error(&r), "{r}");
    let tp = r["_meta"]["traceparent"].as_str().unwrap().to_owned();

    let recs = records(&log);
    let phases: Vec<&str> = recs.iter().map(|r| r["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["open", "intent", "result"]);
    let (intent, result) = (&recs[1], &recs[2]);
    assert_eq!(intent["op_id"], result["op_id"]);
    assert_eq!(intent["action"], "send_group_msg");
    assert_eq!(intent["tool"], "invoke_action");
    assert_eq!(intent["traceparent"], tp);
    assert!(intent["params_digest"].as_str().unwrap().starts_with("hmac-sha256:"));
    assert_eq!(result["outcome"], "success");
    assert_eq!(result["retcode"], 0);
    assert!(result["duration_ms"].is_number());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(secret_text), "params are never stored in clear");
    assert!(!text.contains("20001"), "not even ids");
    let key = std::fs::metadata(format!("{}.key", log.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(verify(&log), (true, "audit log OK: 3 records, chain intact\n".to_owned()));

    // A business failure is recorded with its retcode.
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"message": "x"}}));
    assert_eq!(diag(&r)["outcome"], "failed");
    let recs = records(&log);
    assert_eq!(recs.last().unwrap()["retcode"], 1400);
    assert!(verify(&log).0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_detects_edits_deletions_reordering_and_truncation() {
    let dir = temp_dir("tamper");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]);
    s.initialize("2025-11-25");
    for _ in 0..3 {
        s.call("query_action", json!({"action": "get_status"}));
    }
    drop(s);
    let original = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<String> = original.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 7);
    assert!(verify(&log).0);
    let write = |ls: Vec<String>, tail: &str| std::fs::write(&log, format!("{}{tail}", ls.join("\n"))).unwrap();

    let mut edited = lines.clone();
    edited[2] = edited[2].replace("\"phase\":\"result\"", "\"phase\":\"resulx\"");
    write(edited, "\n");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 4"), "edit: {msg}");

    let mut deleted = lines.clone();
    deleted.remove(3);
    write(deleted, "\n");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 4"), "delete: {msg}");

    let mut first_deleted = lines.clone();
    first_deleted.remove(0);
    write(first_deleted, "\n");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 1"), "delete first: {msg}");

    let mut reordered = lines.clone();
    reordered.swap(4, 5);
    write(reordered, "\n");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 5"), "reorder: {msg}");

    let mut truncated = lines.clone();
    truncated[6].truncate(20);
    write(truncated, "");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 7") && msg.contains("truncated"), "truncate: {msg}");

    std::fs::write(&log, &original).unwrap();
    assert!(verify(&log).0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_audit_log_refuses_the_action_and_sends_nothing() {
    let dir = temp_dir("failclosed");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]);
    s.initialize("2025-11-25");
    // Break the log's tail (a torn write): the next intent cannot be chained.
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(b"{\"torn").unwrap();
    drop(f);
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "x"}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "audit_failed");
    assert!(
        fake.fake.requests().iter().all(|q| q.action.as_deref() != Some("send_group_msg")),
        "nothing executed unaudited"
    );

    // A log that cannot be opened stops startup.
    let out = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_AUDIT_LOG", dir.join("missing-dir/audit.jsonl"))
        .bounded_output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SNOWLUMA_MCP_AUDIT_LOG"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_peer_credentials_are_recorded() {
    use std::os::unix::net::UnixStream;
    let dir = temp_dir("peer");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let mut child = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_ENDPOINT", fake.fake.url())
        .env("SNOWLUMA_MCP_TOKEN", "t")
        .env("SNOWLUMA_MCP_MODE", "write")
        .env("SNOWLUMA_MCP_AUDIT_LOG", &log)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs_out)))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut w = ours.try_clone().unwrap();
    // Every read below has the safety deadline.
    ours.set_read_timeout(Some(SAFETY)).unwrap();
    let mut r = BufReader::new(ours);
    let mut line = String::new();
    for msg in [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sock","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"invoke_action","arguments":{"action":"send_group_msg","params":{"group_id":20001,"message":"x"}}}}),
    ] {
        w.write_all(format!("{msg}\n").as_bytes()).unwrap();
        if msg.get("id").is_some() {
            line.clear();
            r.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            assert!(v.get("result").is_some(), "{v}");
        }
    }
    let recs = records(&log);
    let me = (own_uid(), std::process::id() as i64);
    for rec in &recs {
        assert_eq!((rec["peer"]["uid"].as_u64().unwrap() as u32, rec["peer"]["pid"].as_i64().unwrap()), me, "{rec}");
    }
    assert_eq!(recs.len(), 3);
    drop(w);
    drop(r);
    let _ = wait_exit(&mut child, "the server exits");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn default_deny_allow_and_deny_lists() {
    let dir = temp_dir("policy");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_DENY_ACTIONS", "send_group_msg, nc_get_rkey"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]);
    s.initialize("2025-11-25");
    for action in [
        "get_cookies",
        "get_credentials",
        ".send_packet",
        "bot_exit",
        "send_group_msg",
        "send_group_msg_async",
        "get_rkey",
    ] {
        let r = s.call("invoke_action", json!({"action": action, "params": {"group_id": 20001, "message": "x"}}));
        assert!(is_error(&r), "{action} should be refused");
        assert_eq!(diag(&r)["kind"], "policy_denied", "{action}");
    }
    assert!(fake.fake.requests().is_empty(), "nothing denied reached SnowLuma");
    let refused: Vec<Value> = records(&log).into_iter().filter(|r| r["phase"] == "refused").collect();
    assert_eq!(refused.len(), 7, "each refusal is audited");
    assert_eq!(refused[2]["canonical"], "send_packet");

    // Denied actions stay visible, flagged.
    let r = s.call("get_action", json!({"name": "get_cookies"}));
    assert_eq!(structured(&r)["result"]["denied_by_policy"], true);
    let r = s.call("search_actions", json!({"query": "send_group_msg"}));
    let hit = structured(&r)["result"]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "send_group_msg")
        .cloned()
        .unwrap();
    assert_eq!(hit["denied_by_policy"], true);
    let r = s.call("get_action", json!({"name": "get_status"}));
    assert!(structured(&r)["result"].get("denied_by_policy").is_none());

    // Allowed actions still run.
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r));
    let info = s.call("get_runtime_info", json!({}));
    let policy = &structured(&info)["result"]["policy"];
    assert_eq!(policy["deny"], json!(["get_rkey", "send_group_msg"]));
    assert!(policy["denied_actions"].as_array().unwrap().contains(&json!("get_cookies")));
    assert_eq!(structured(&info)["result"]["audit_log"], true);

    // An allow list admits only its actions, including a default-denied one.
    let mut a = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_ALLOW_ACTIONS", "get_cookies,get_status"),
    ]);
    a.initialize("2025-11-25");
    fake.fake.set_response("get_cookies", json!({"status": "ok", "retcode": 0, "data": {"cookies": "x"}}));
    let r = a.call("invoke_action", json!({"action": "get_cookies", "params": {"domain": "qun.qq.com"}}));
    assert!(!is_error(&r), "{r}\n{}", a.stderr_text());
    let r = a.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "x"}}));
    assert_eq!(diag(&r)["kind"], "policy_denied");

    // A name that is not in the catalog is a startup error naming the variable.
    let out = std::process::Command::new(bin_path())
        .env_clear()
        .env("SNOWLUMA_MCP_DENY_ACTIONS", "no_such_action")
        .bounded_output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SNOWLUMA_MCP_DENY_ACTIONS") && err.contains("no_such_action"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // Our own /proc entry is owned by our uid.
    std::fs::metadata("/proc/self").unwrap().uid()
}
