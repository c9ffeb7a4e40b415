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

fn phases(path: &Path) -> Vec<String> {
    records(path).iter().map(|r| r["phase"].as_str().unwrap().to_owned()).collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

fn write_lines(path: &Path, ls: &[String]) {
    std::fs::write(path, ls.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

fn sibling(log: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", log.display()))
}

/// `snowluma-mcp audit ARGS...` with exactly `env`: (success, stderr).
fn audit_cmd(args: &[&str], path: &Path, extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(bin_path())
        .arg("audit")
        .args(args)
        .arg(path)
        .args(extra)
        .env_clear()
        .envs(env.iter().copied())
        .bounded_output()
        .unwrap();
    assert!(out.stdout.is_empty(), "nothing on stdout");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn verify(path: &Path) -> (bool, String) {
    audit_cmd(&["verify"], path, &[], &[])
}

fn verify_with(path: &Path, extra: &[&str]) -> (bool, String) {
    audit_cmd(&["verify"], path, extra, &[])
}

fn sha256_tag(line: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(line.as_bytes());
    format!("sha256:{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

/// The environment of a write-mode session auditing to `log`.
fn write_env<'a>(url: &'a str, log: &'a Path) -> Vec<(&'a str, &'a str)> {
    vec![
        ("SNOWLUMA_MCP_ENDPOINT", url),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ]
}

/// A write-mode session that has run `actions` audited actions, then ended.
fn audited_session(url: &str, log: &Path, actions: usize) {
    let mut s = Mcp::spawn(&write_env(url, log));
    s.initialize("2025-11-25");
    for _ in 0..actions {
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert!(!is_error(&r), "{r}\n{}", s.stderr_text());
    }
}

/// Start the server with `env` and no client (stdin at its end): startup
/// must be refused. Returns its stderr.
fn refused_start(env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(bin_path()).env_clear().envs(env.iter().copied()).bounded_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "startup should be refused: {err}");
    assert!(out.stdout.is_empty());
    err
}

fn send_group_msg(s: &mut Mcp) -> Value {
    s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "x"}}))
}

#[test]
fn writes_are_audited_intent_then_result_with_params_digested() {
    let dir = temp_dir("audit");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&write_env(&url, &log));
    s.initialize("2025-11-25");
    let secret_text = "hello-private-message-text";
    let r = s.call(
        "invoke_action",
        json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": secret_text}}),
    );
    assert!(!is_error(&r), "{r}");
    let tp = r["_meta"]["traceparent"].as_str().unwrap().to_owned();

    let recs = records(&log);
    assert_eq!(phases(&log), ["open", "intent", "result"]);
    let (intent, result) = (&recs[1], &recs[2]);
    assert_eq!(intent["op_id"], result["op_id"]);
    assert_eq!(intent["action"], "send_group_msg");
    assert_eq!(intent["tool"], "invoke_action");
    assert_eq!(intent["traceparent"], tp);
    assert!(intent["params_digest"].as_str().unwrap().starts_with("hmac-sha256:"));
    assert_eq!(result["outcome"], "success");
    assert_eq!(result["retcode"], 0);
    assert!(result["duration_ms"].is_number());
    // Every record is version 2 and ends with its MAC.
    for (rec, line) in recs.iter().zip(lines(&log)) {
        assert_eq!(rec["v"], 2);
        assert!(line.ends_with("\"}") && line.contains(",\"mac\":\"hmac-sha256:"), "{line}");
        assert!(line.rsplit_once(",\"mac\":").unwrap().1.len() == 1 + 12 + 64 + 2, "the mac is the last member");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(secret_text), "params are never stored in clear");
    assert!(!text.contains("20001"), "not even ids");
    use std::os::unix::fs::PermissionsExt;
    for f in [sibling(&log, ".key"), sibling(&log, ".head"), log.clone()] {
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600, "{}", f.display());
    }
    assert_eq!(verify(&log), (true, "audit log OK: 3 records, chain intact, MACs valid, head matches\n".to_owned()));

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
    audited_session(&fake.fake.url(), &log, 3);
    let original = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<String> = original.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 7);
    assert!(verify(&log).0);
    let write = |ls: Vec<String>, tail: &str| std::fs::write(&log, format!("{}{tail}", ls.join("\n"))).unwrap();

    let mut edited = lines.clone();
    edited[2] = edited[2].replace("\"phase\":\"result\"", "\"phase\":\"resulx\"");
    write(edited, "\n");
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 3") && msg.contains("MAC does not match"), "edit: {msg}");
    // Without the key the edit still breaks the chain, one line later.
    let (ok, msg) = verify_with(&log, &["--key", dir.join("no-such-key").to_str().unwrap()]);
    assert!(!ok && msg.contains("line 4"), "edit, no key: {msg}");

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
fn removed_records_are_reported_and_refuse_startup() {
    let dir = temp_dir("removed");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    audited_session(&url, &log, 2);
    let all = lines(&log);
    assert_eq!(phases(&log), ["open", "intent", "result", "intent", "result"]);
    for (case, keep) in [("the last record", 4), ("the last intent and result", 3), ("every record", 0)] {
        write_lines(&log, &all[..keep]);
        let before = std::fs::read(&log).unwrap();
        let (ok, msg) = verify(&log);
        assert!(!ok && msg.starts_with("audit log BROKEN") && msg.contains("removed"), "{case}: {msg}");
        let err = refused_start(&write_env(&url, &log));
        assert!(
            err.contains("refusing to start")
                && err.contains("records were removed")
                && err.contains("snowluma-mcp audit verify"),
            "{case}: {err}"
        );
        assert_eq!(std::fs::read(&log).unwrap(), before, "{case}: nothing appended to the shortened log");
    }
    // The last record changed (and re-chained, but without the key).
    let mut changed = all[..4].to_vec();
    changed.push(all[4].replace("\"outcome\":\"success\"", "\"outcome\":\"failed\""));
    write_lines(&log, &changed);
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 5") && msg.contains("MAC"), "changed: {msg}");
    let err = refused_start(&write_env(&url, &log));
    assert!(err.contains("record 4") && err.contains("was changed"), "changed: {err}");

    write_lines(&log, &all);
    assert!(verify(&log).0);
    audited_session(&url, &log, 1);
    assert_eq!(verify(&log).1, "audit log OK: 8 records, chain intact, MACs valid, head matches\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn forged_records_are_reported_and_refuse_startup() {
    let dir = temp_dir("forged");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    audited_session(&url, &log, 1);
    let all = lines(&log);
    let prev = sha256_tag(all.last().unwrap());
    let body = format!(
        r#"{{"v":2,"seq":3,"ts":"2030-01-01T00:00:00.000000Z","prev":"{prev}","phase":"intent","action":"bot_exit""#
    );
    for (case, forged) in [
        ("a wrong MAC", format!(r#"{body},"mac":"hmac-sha256:{}"}}"#, "ab".repeat(32))),
        ("no MAC", format!("{body}}}")),
        ("a version-1 record", format!("{}}}", body.replace("\"v\":2", "\"v\":1"))),
    ] {
        let mut with = all.clone();
        with.push(forged);
        write_lines(&log, &with);
        let (ok, msg) = verify(&log);
        assert!(!ok && msg.contains("line 4"), "{case}: {msg}");
        let err = refused_start(&write_env(&url, &log));
        assert!(err.contains("refusing to start") && err.contains("snowluma-mcp audit verify"), "{case}: {err}");
    }
    // Without the key, a well-formed forgery after the head cannot be told
    // apart from a record whose head update failed: verify says so plainly.
    let mut with = all.clone();
    with.push(format!(r#"{body},"mac":"hmac-sha256:{}"}}"#, "ab".repeat(32)));
    write_lines(&log, &with);
    let (ok, msg) = verify_with(&log, &["--key", dir.join("no-such-key").to_str().unwrap()]);
    assert!(ok && msg.contains("MACs NOT checked") && msg.contains("1 later records"), "{msg}");
    assert!(!msg.contains("MACs valid"), "{msg}");

    write_lines(&log, &all);
    assert_eq!(verify(&log).1, "audit log OK: 3 records, chain intact, MACs valid, head matches\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_torn_tail_is_recovered_with_a_record() {
    let dir = temp_dir("torn");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    audited_session(&url, &log, 1);
    // A write interrupted by a crash: part of a line, no newline.
    let partial = b"{\"v\":2,\"seq\":3,\"ts\":\"2030";
    std::fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(partial).unwrap();
    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("line 4") && msg.contains("incomplete"), "{msg}");

    // At startup: dropped, and recorded.
    let mut s = Mcp::spawn(&write_env(&url, &log));
    s.initialize("2025-11-25");
    s.wait_stderr("incomplete line");
    let recs = records(&log);
    assert_eq!(phases(&log), ["open", "intent", "result", "recovered", "open"]);
    assert_eq!(recs[3]["dropped_bytes"], partial.len());
    assert_eq!(recs[3]["dropped_sha256"], sha256_tag(std::str::from_utf8(partial).unwrap()));
    assert!(verify(&log).0);

    // During a session (the confined supervisor truncates its log): the
    // next action is recorded after a `recovered` record and runs.
    std::fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(b"{\"torn").unwrap();
    let r = send_group_msg(&mut s);
    assert!(!is_error(&r), "{r}\n{}", s.stderr_text());
    assert_eq!(phases(&log)[5..], ["recovered", "intent", "result"]);
    assert_eq!(records(&log)[5]["dropped_bytes"], 6);
    assert_eq!(verify(&log).1, "audit log OK: 8 records, chain intact, MACs valid, head matches\n");
    assert!(!s.stderr_text().contains("SIGSYS"), "{}", s.stderr_text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_removed_during_a_session_refuse_the_action_and_send_nothing() {
    let dir = temp_dir("failclosed");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&write_env(&url, &log));
    s.initialize("2025-11-25");
    // Remove the only record (the `open` one): the next intent must not be
    // chained onto the shortened log.
    std::fs::write(&log, "").unwrap();
    let r = send_group_msg(&mut s);
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "audit_failed");
    assert!(text(&r).contains("records were removed"), "{r}");
    assert!(
        fake.fake.requests().iter().all(|q| q.action.as_deref() != Some("send_group_msg")),
        "nothing executed unaudited"
    );
    assert_eq!(std::fs::read(&log).unwrap(), b"", "nothing appended");

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
fn a_failed_write_is_undone_and_the_action_refused() {
    use std::os::unix::process::CommandExt;
    let dir = temp_dir("fullness");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    audited_session(&url, &log, 1);
    let size = std::fs::metadata(&log).unwrap().len();
    let open_line = lines(&log)[0].len() as u64 + 1;
    // Room for the next session's `open` record and a few bytes more: its
    // first intent is written partly, then fails (EFBIG, as a full disk
    // fails with ENOSPC).
    let limit = size + open_line + 16;
    let mut cmd = Mcp::command(&write_env(&url, &log), &[]);
    // SAFETY: only async-signal-safe calls (setrlimit, signal) between fork
    // and exec, on this child's own limits and signal dispositions.
    unsafe {
        cmd.pre_exec(move || {
            let lim = nix::libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if nix::libc::setrlimit(nix::libc::RLIMIT_FSIZE, &lim) != 0
                || nix::libc::signal(nix::libc::SIGXFSZ, nix::libc::SIG_IGN) == nix::libc::SIG_ERR
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut s = Mcp::spawn_command(cmd);
    s.initialize("2025-11-25");
    let after_open = std::fs::metadata(&log).unwrap().len();
    assert!(after_open > size && after_open <= limit, "the open record fits");
    let r = send_group_msg(&mut s);
    assert!(is_error(&r), "{r}");
    assert_eq!(diag(&r)["kind"], "audit_failed");
    assert!(fake.fake.requests().iter().all(|q| q.action.as_deref() != Some("send_group_msg")));
    // The partial line was cut off again: the log is whole.
    assert_eq!(std::fs::metadata(&log).unwrap().len(), after_open);
    assert_eq!(verify(&log).1, "audit log OK: 4 records, chain intact, MACs valid, head matches\n");
    assert!(!s.stderr_text().contains("SIGSYS"), "{}", s.stderr_text());
    drop(s);
    // With room again, the next session continues the chain.
    audited_session(&url, &log, 1);
    assert_eq!(phases(&log)[3..], ["open", "open", "intent", "result"]);
    assert!(verify(&log).0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_explicit_key_is_read_never_created() {
    let dir = temp_dir("keyfile");
    let log = dir.join("audit.jsonl");
    let keys = dir.join("keys");
    std::fs::create_dir(&keys).unwrap();
    let key = keys.join("audit.key");
    let key_s = key.to_str().unwrap();
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let mut env = write_env(&url, &log);
    env.push(("SNOWLUMA_MCP_AUDIT_KEY", key_s));

    let err = refused_start(&env);
    assert!(err.contains("SNOWLUMA_MCP_AUDIT_KEY") && err.contains("snowluma-mcp audit keygen"), "{err}");
    assert!(!key.exists() && !log.exists(), "neither the key nor the log was created");

    let (ok, msg) = audit_cmd(&["keygen"], &key, &[], &[]);
    assert!(ok, "{msg}");
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!((meta.permissions().mode() & 0o777, meta.len()), (0o600, 65));
    let (ok, msg) = audit_cmd(&["keygen"], &key, &[], &[]);
    assert!(!ok && msg.contains("already exists"), "{msg}");

    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    assert!(!is_error(&send_group_msg(&mut s)));
    drop(s);
    assert!(!sibling(&log, ".key").exists(), "no key beside the log");
    // verify: the key from --key, from SNOWLUMA_MCP_AUDIT_KEY, or none.
    let (ok, msg) = verify_with(&log, &["--key", key_s]);
    assert!(ok && msg == "audit log OK: 3 records, chain intact, MACs valid, head matches\n", "{msg}");
    let (ok, msg) = audit_cmd(&["verify"], &log, &[], &[("SNOWLUMA_MCP_AUDIT_KEY", key_s)]);
    assert!(ok && msg.contains("MACs valid"), "{msg}");
    let (ok, msg) = verify(&log);
    assert!(ok && msg.contains("MACs NOT checked") && msg.contains(".key"), "{msg}");
    // Another key: every MAC fails.
    let other = keys.join("other.key");
    assert!(audit_cmd(&["keygen"], &other, &[], &[]).0);
    let (ok, msg) = verify_with(&log, &["--key", other.to_str().unwrap()]);
    assert!(!ok && msg.contains("line 1") && msg.contains("MAC"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_head_refuses_startup_until_reanchored() {
    let dir = temp_dir("reanchor");
    let log = dir.join("audit.jsonl");
    let head = sibling(&log, ".head");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    audited_session(&url, &log, 1);
    std::fs::remove_file(&head).unwrap();

    let (ok, msg) = verify(&log);
    assert!(!ok && msg.contains("is missing") && msg.contains("snowluma-mcp audit reanchor"), "{msg}");
    let err = refused_start(&write_env(&url, &log));
    assert!(err.contains("head file") && err.contains("snowluma-mcp audit reanchor"), "{err}");
    assert!(!head.exists(), "the server never creates the head of a non-empty log");

    // A forged record is not anchored.
    let mut forged = lines(&log);
    let good = forged.clone();
    let last = forged.last().unwrap().clone();
    forged.push(last.replace("\"seq\":2", "\"seq\":3"));
    write_lines(&log, &forged);
    let (ok, msg) = audit_cmd(&["reanchor"], &log, &[], &[]);
    assert!(!ok && msg.contains("not re-anchored") && msg.contains("line 4"), "{msg}");
    assert!(!head.exists());

    write_lines(&log, &good);
    let (ok, msg) = audit_cmd(&["reanchor"], &log, &[], &[]);
    assert!(ok && msg.contains("re-anchored: 3 records") && msg.contains("anchors record 2"), "{msg}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&head).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(verify(&log).1, "audit log OK: 3 records, chain intact, MACs valid, head matches\n");
    audited_session(&url, &log, 1);
    assert_eq!(verify(&log).1, "audit log OK: 6 records, chain intact, MACs valid, head matches\n");
    // Without the key there is nothing to re-anchor with.
    let (ok, msg) = audit_cmd(&["reanchor"], &log, &["--key", dir.join("nope").to_str().unwrap()], &[]);
    assert!(!ok && msg.contains("key"), "{msg}");
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
    for action in ["get_cookies", "get_credentials", ".send_packet", "bot_exit", "send_group_msg", "get_rkey"] {
        let r = s.call("invoke_action", json!({"action": action, "params": {"group_id": 20001, "message": "x"}}));
        assert!(is_error(&r), "{action} should be refused");
        assert_eq!(diag(&r)["kind"], "policy_denied", "{action}");
    }
    assert!(fake.fake.requests().is_empty(), "nothing denied reached SnowLuma");
    let refused: Vec<Value> = records(&log).into_iter().filter(|r| r["phase"] == "refused").collect();
    assert_eq!(refused.len(), 6, "each refusal is audited");
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
