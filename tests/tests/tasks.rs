#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Persistent background transfers (the tasks extension) through the binary
//! and the fake SnowLuma, in raw JSON: no SDK client implements the
//! extension yet.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::{Fault, sha256};

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
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-tasks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("uploads")).unwrap();
    Env { fake: Fake::start(Some("t")), dir }
}

impl Env {
    fn task_dir(&self) -> PathBuf {
        self.dir.join("tasks")
    }

    fn spawn_with(&self, token: &str, task_dir: &Path) -> Mcp {
        let url = self.fake.fake.url();
        let sd = self.dir.join("downloads").display().to_string();
        let ur = self.dir.join("uploads").display().to_string();
        let td = task_dir.display().to_string();
        Mcp::spawn(&[
            ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
            ("SNOWLUMA_MCP_TOKEN", token),
            ("SNOWLUMA_MCP_MODE", "write"),
            ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
            ("SNOWLUMA_MCP_UPLOAD_ROOT", ur.as_str()),
            ("SNOWLUMA_MCP_TASK_DIR", td.as_str()),
        ])
    }

    fn spawn(&self) -> Mcp {
        self.spawn_with("t", &self.task_dir())
    }

    /// A session started as serve-http's launcher starts a tree for an
    /// access token (`principal`: `<token id> <peer>`), or a plain stdio
    /// session (`None`), once it holds the task directory's lease (the
    /// previous session, killed, may not have let go of it yet).
    fn spawn_leased(&self, principal: Option<&str>) -> Mcp {
        wait_until("a new session gets the lease", || {
            let url = self.fake.fake.url();
            let sd = self.dir.join("downloads").display().to_string();
            let td = self.task_dir().display().to_string();
            let mut env = vec![
                ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
                ("SNOWLUMA_MCP_TOKEN", "t"),
                ("SNOWLUMA_MCP_MODE", "write"),
                ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
                ("SNOWLUMA_MCP_TASK_DIR", td.as_str()),
            ];
            if let Some(p) = principal {
                env.push(("SNOWLUMA_MCP_INTERNAL_HTTP_PRINCIPAL", p));
            }
            let mut s = Mcp::spawn(&env);
            let r = call_task_tool(&mut s, "list_tasks", json!({}));
            if r["result"]["isError"] == false { Ok(s) } else { Err(r.to_string()) }
        })
    }
}

fn tasks_meta() -> Value {
    modern_meta_with(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
}

fn with_meta(mut params: Value) -> Value {
    params["_meta"] = tasks_meta();
    params
}

/// `tools/call` as a modern client declaring the extension: the raw response.
fn call_task_tool(s: &mut Mcp, tool: &str, args: Value) -> Value {
    s.request("tools/call", with_meta(json!({"name": tool, "arguments": args})))
}

fn start(s: &mut Mcp, args: Value) -> String {
    let r = call_task_tool(s, "invoke_action_background", args);
    let res = r.get("result").unwrap_or_else(|| panic!("{r}"));
    assert_eq!(res["resultType"], "task", "{res}");
    assert_eq!(res["status"], "working");
    assert_eq!(res["pollIntervalMs"], 1000);
    assert!(res.get("ttlMs").is_some_and(Value::is_null), "{res}");
    res["taskId"].as_str().unwrap().to_owned()
}

fn get(s: &mut Mcp, id: &str) -> Value {
    s.ok("tasks/get", with_meta(json!({"taskId": id})))
}

fn wait_final(s: &mut Mcp, id: &str) -> Value {
    wait_until("the task finishes", || {
        let t = get(s, id);
        (t["status"] != "working").then_some(t)
    })
}

fn download_args(file: &str) -> Value {
    json!({"action": "download_file_stream", "params": {"file": file, "chunk_size": 1000}})
}

fn actions_sent(e: &Env, action: &str) -> usize {
    e.fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some(action)).count()
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    k.sort();
    k
}

#[test]
fn a_background_download_and_upload_complete_with_the_synchronous_shape() {
    let e = env("shape");
    e.fake.fake.add_file("pic.png", vec![7u8; 5000]);
    let mut s = e.spawn();
    let sync = s.call_modern("invoke_action", download_args("pic.png"), json!({}));
    assert!(!is_error(&sync), "{sync}");
    let id = start(&mut s, download_args("pic.png"));
    let done = wait_final(&mut s, &id);
    assert_eq!(done["status"], "completed", "{done}");
    let result = &done["result"];
    assert_eq!(keys(&result["structuredContent"]), keys(&sync["structuredContent"]));
    assert_eq!(keys(&result["structuredContent"]["result"]), keys(&sync["structuredContent"]["result"]));
    assert_eq!(result["structuredContent"]["result"]["sha256"], sha256::digest_hex(&[7u8; 5000]));
    assert_eq!(result["isError"], false);

    let path = e.dir.join("uploads").join("up.bin");
    std::fs::write(&path, vec![1u8; 3000]).unwrap();
    let id =
        start(&mut s, json!({"action": "upload_file_stream", "execution": {"input_file": path.display().to_string()}}));
    let done = wait_final(&mut s, &id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["result"]["file_size"], 3000);

    // Files are private; records validated; the token is in no file.
    for f in std::fs::read_dir(e.task_dir()).unwrap().flatten() {
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!std::fs::read_to_string(f.path()).unwrap().contains("\"t\""));
    }
    assert_eq!(std::fs::metadata(e.task_dir()).unwrap().permissions().mode() & 0o777, 0o700);

    // Ordinary actions are refused as tasks; unknown tasks are -32602.
    let r = call_task_tool(&mut s, "invoke_action_background", json!({"action": "get_status"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r["result"]).contains("not a stream action"));
    let r = s.request("tasks/get", with_meta(json!({"taskId": "0123456789abcdef0123456789abcdef"})));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // tasks/update: background transfers request no input.
    let r = s.request("tasks/update", with_meta(json!({"taskId": id, "inputResponses": {"x": {}}})));
    assert!(r.get("result").is_some(), "{r}");
}

/// A task id that is not a string (or none) is invalid params, `-32602`,
/// like any malformed request params, not "method not found".
#[test]
fn a_task_id_that_is_not_a_string_is_invalid_params() {
    let e = env("badid");
    let mut s = e.spawn();
    for (method, params) in [
        ("tasks/get", json!({"taskId": 5})),
        ("tasks/get", json!({"taskId": null})),
        ("tasks/get", json!({})),
        ("tasks/cancel", json!({"taskId": 5})),
        ("tasks/cancel", json!({"taskId": {"id": "x"}})),
        ("tasks/update", json!({"taskId": [1], "inputResponses": {}})),
    ] {
        let r = s.request(method, with_meta(params.clone()));
        assert_eq!(r["error"]["code"], -32602, "{method} {params}: {r}");
    }
    // Methods the extension does not have stay unknown.
    for method in ["tasks/list", "tasks/result"] {
        let r = s.request(method, with_meta(json!({"taskId": 5})));
        assert_eq!(r["error"]["code"], -32601, "{method}: {r}");
    }
    // The session goes on.
    assert_eq!(call_task_tool(&mut s, "list_tasks", json!({}))["result"]["isError"], false);
}

#[test]
fn legacy_and_undeclared_clients_see_no_task_tools() {
    let e = env("legacy");
    let mut s = e.spawn();
    let modern = s.ok("tools/list", json!({"_meta": modern_meta()}));
    let names = |l: &Value| -> Vec<String> {
        l["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
    };
    assert!(!names(&modern).contains(&"invoke_action_background".to_owned()));
    let declared = s.ok("tools/list", json!({"_meta": tasks_meta()}));
    assert!(names(&declared).contains(&"invoke_action_background".to_owned()));
    assert!(names(&declared).contains(&"list_tasks".to_owned()));
    let d = s.ok("server/discover", json!({"_meta": modern_meta()}));
    assert!(d["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object(), "{d}");
    let r = s.request("tasks/get", json!({"taskId": "0123456789abcdef0123456789abcdef", "_meta": modern_meta()}));
    assert_eq!(r["error"]["code"], -32021, "{r}");
    let r = s.request(
        "tools/call",
        json!({"name": "invoke_action_background", "arguments": download_args("x"), "_meta": modern_meta()}),
    );
    assert_eq!(r["error"]["code"], -32021, "{r}");
    drop(s);

    let mut s = e.spawn();
    s.initialize("2025-11-25");
    let legacy = s.ok("tools/list", json!({}));
    assert!(!names(&legacy).iter().any(|n| n == "invoke_action_background" || n == "list_tasks"));
    for m in ["tasks/get", "tasks/list", "tasks/result"] {
        let r = s.request(m, json!({"taskId": "0123456789abcdef0123456789abcdef"}));
        assert!(r.get("error").is_some(), "{m}: {r}");
    }
}

#[test]
fn cancel_both_outcomes_and_the_fifth_task_is_refused() {
    let e = env("cancel");
    e.fake.fake.add_file("f.bin", vec![3u8; 100]);
    let mut s = e.spawn();
    // Lost race: the task already completed; cancel changes nothing.
    let id = start(&mut s, download_args("f.bin"));
    let done = wait_final(&mut s, &id);
    assert_eq!(done["status"], "completed");
    s.ok("tasks/cancel", with_meta(json!({"taskId": id})));
    assert_eq!(get(&mut s, &id)["status"], "completed");

    e.fake.fake.set_fault("download_file_stream", Fault::Hang);
    let ids: Vec<String> = (0..4).map(|_| start(&mut s, download_args("f.bin"))).collect();
    let r = call_task_tool(&mut s, "invoke_action_background", download_args("f.bin"));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r["result"]).contains("个后台任务在运行（上限）"), "{r}");
    for id in &ids {
        s.ok("tasks/cancel", with_meta(json!({"taskId": id})));
    }
    for id in &ids {
        let t = wait_final(&mut s, id);
        assert_eq!(t["status"], "cancelled", "{t}");
    }
    // A place is free again.
    e.fake.fake.clear_fault("download_file_stream");
    let id = start(&mut s, download_args("f.bin"));
    assert_eq!(wait_final(&mut s, &id)["status"], "completed");
}

#[test]
fn a_transfer_survives_its_client_and_a_crash_is_never_replayed() {
    let e = env("crash");
    e.fake.fake.add_file("slow.bin", vec![5u8; 64]);
    e.fake.fake.set_fault("download_file_stream", Fault::Delay(std::time::Duration::from_millis(1500)));
    // The client goes away; the server finishes the transfer, then exits.
    let mut s = e.spawn();
    let id = start(&mut s, download_args("slow.bin"));
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server ends after its transfer");
    assert!(status.success(), "{status:?}");
    let mut s = e.spawn();
    let t = get(&mut s, &id);
    assert_eq!(t["status"], "completed", "{t}");
    drop(s);

    // kill -9 of the whole tree mid-transfer: the task reads failed with an
    // unknown outcome after a restart, and nothing is sent again.
    e.fake.fake.set_fault("download_file_stream", Fault::Hang);
    e.fake.fake.clear_requests();
    let mut s = e.spawn();
    let id = start(&mut s, download_args("slow.bin"));
    wait_until("the download reaches SnowLuma", || (actions_sent(&e, "download_file_stream") == 1).then_some(()));
    let pids = s.worker_pids();
    let _ = s.child.kill();
    for p in pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = s.child.wait();
    drop(s);
    e.fake.fake.clear_fault("download_file_stream");
    let mut s = wait_until("a restarted server gets the lease", || {
        let mut s = e.spawn();
        let r = call_task_tool(&mut s, "list_tasks", json!({}));
        (r["result"]["isError"] == false).then_some(s)
    });
    let t = get(&mut s, &id);
    assert_eq!(t["status"], "failed", "{t}");
    assert!(t["statusMessage"].as_str().unwrap().contains("unknown remote outcome"), "{t}");
    assert!(t["error"]["message"].as_str().unwrap().contains("unknown remote outcome"));
    assert_eq!(actions_sent(&e, "download_file_stream"), 1, "never replayed");
}

#[test]
fn a_second_runtime_on_the_directory_is_refused_task_tools_only_until_the_first_has_gone() {
    let e = env("lease");
    let mut a = e.spawn();
    let r = call_task_tool(&mut a, "list_tasks", json!({}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let mut b = e.spawn();
    let r = call_task_tool(&mut b, "list_tasks", json!({}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r["result"]).contains("lease"), "{r}");
    let r = call_task_tool(&mut b, "invoke_action_background", download_args("x"));
    assert!(text(&r["result"]).contains("lease"), "{r}");
    assert!(!is_error(&b.call_modern("list_categories", json!({}), json!({}))));
    // Once the first runtime has gone, the second takes the lease over at
    // its next task call (no restart needed).
    drop(a);
    wait_until("the second runtime takes the lease over", || {
        let r = call_task_tool(&mut b, "list_tasks", json!({}));
        if r["result"]["isError"] == false { Ok(()) } else { Err(r.to_string()) }
    });
}

#[test]
fn another_configuration_is_refused() {
    let e = env("scope");
    let mut s = e.spawn();
    assert_eq!(call_task_tool(&mut s, "list_tasks", json!({}))["result"]["isError"], false);
    drop(s);
    let mut s = wait_until("the lease is free", || {
        let mut s = e.spawn_with("another-token", &e.task_dir());
        let r = call_task_tool(&mut s, "list_tasks", json!({}));
        (!text(&r["result"]).contains("lease")).then_some((s, r))
    });
    assert!(text(&s.1["result"]).contains("new private directory"), "{}", s.1);
    assert!(!is_error(&s.0.call_modern("list_categories", json!({}), json!({}))));
}

/// Start a server once (it writes the scope), then stop it.
fn prepared(e: &Env) {
    let mut s = e.spawn();
    assert_eq!(call_task_tool(&mut s, "list_tasks", json!({}))["result"]["isError"], false);
}

fn first_error_after_restart(e: &Env) -> String {
    wait_until("the store reports the record", || {
        let mut s = e.spawn();
        let r = call_task_tool(&mut s, "list_tasks", json!({}));
        let t = text(&r["result"]);
        (!t.contains("lease")).then_some(t)
    })
}

#[test]
fn corrupt_and_oversized_records_are_errors() {
    let e = env("corrupt");
    prepared(&e);
    let rec = e.task_dir().join("0123456789abcdef0123456789abcdef.json");
    std::fs::write(&rec, b"{\"version\":").unwrap();
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = first_error_after_restart(&e);
    assert!(t.contains("corrupt"), "{t}");
    assert_eq!(std::fs::read(&rec).unwrap(), b"{\"version\":", "never rewritten");

    std::fs::File::options().write(true).open(&rec).unwrap().set_len(16 * 1024 * 1024 + 1).unwrap();
    let t = first_error_after_restart(&e);
    assert!(t.contains("exceeds the limit"), "{t}");
}

/// A FIFO planted under a record's name (`<32 hex>.json`) is reported as
/// corruption at once, like a directory or a symlink: it does not hang the
/// task store's open (no writer would ever come), so every task call is
/// answered, every other tool works, and the session still ends when its
/// client goes.
#[test]
fn a_fifo_under_a_records_name_is_corruption_not_a_hang() {
    let e = env("fifo");
    prepared(&e);
    let id = "0123456789abcdef0123456789abcdef";
    let fifo = e.task_dir().join(format!("{id}.json"));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let t = first_error_after_restart(&e);
    assert!(t.contains("corrupt") && t.contains("FIFO"), "{t}");
    let mut s = e.spawn();
    let r = call_task_tool(&mut s, "list_tasks", json!({}));
    assert!(text(&r["result"]).contains("FIFO"), "{r}");
    let r = s.request("tasks/get", with_meta(json!({"taskId": id})));
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("corrupt"), "{r}");
    let r = call_task_tool(&mut s, "invoke_action_background", download_args("x"));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(!is_error(&s.call_modern("list_categories", json!({}), json!({}))));
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the session ends at stdin's end");
    assert!(status.success(), "{status:?}");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "never removed or replaced");
}

#[test]
fn list_tasks_pages_through_120_tasks() {
    let e = env("list");
    prepared(&e);
    for i in 0..120 {
        let id = format!("{i:032x}");
        let at = format!("2026-01-01T00:{:02}:{:02}.000Z", i / 60, i % 60);
        let rec = json!({"version": 1, "taskId": id, "status": "completed", "createdAt": at, "lastUpdatedAt": at,
            "action": "download_file_stream", "result": {"content": [], "isError": false}});
        let p = e.task_dir().join(format!("{id}.json"));
        std::fs::write(&p, rec.to_string()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut s = wait_until("the lease is free", || {
        let mut s = e.spawn();
        let r = call_task_tool(&mut s, "list_tasks", json!({"limit": 1}));
        (r["result"]["isError"] == false).then_some(s)
    });
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let r = call_task_tool(&mut s, "list_tasks", json!({"cursor": cursor}));
        let page = &r["result"]["structuredContent"]["result"];
        pages += 1;
        for t in page["tasks"].as_array().unwrap() {
            assert!(t.get("result").is_none(), "metadata only: {t}");
            seen.push(t["taskId"].as_str().unwrap().to_owned());
        }
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 120);
    let expect: Vec<String> = (0..120).map(|i| format!("{i:032x}")).collect();
    assert_eq!(seen, expect);
    let r = call_task_tool(&mut s, "list_tasks", json!({"limit": 101}));
    assert_eq!(r["result"]["isError"], true);
}

#[test]
fn a_running_task_shows_its_progress_and_is_audited() {
    let e = env("progress");
    let ab = snowluma_fake::base64::encode(b"abcd");
    let frame = |data_type: &str, extra: Value| {
        let mut d = json!({"type": "stream", "data_type": data_type});
        d.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"status": "ok", "retcode": 0, "stream": "stream-action", "message": "", "wording": "", "data": d})
    };
    e.fake.fake.set_fault(
        "download_file_stream",
        Fault::StreamThenHang(vec![
            frame("file_info", json!({"file_name": "x.bin", "file_size": 400, "chunk_size": 4})),
            frame("file_chunk", json!({"index": 0, "data": ab, "size": 4, "progress": 50, "base64_size": ab.len()})),
            frame("file_chunk", json!({"index": 1, "data": ab, "size": 4, "progress": 50, "base64_size": ab.len()})),
        ]),
    );
    let log = e.dir.join("audit.log").display().to_string();
    let url = e.fake.fake.url();
    let sd = e.dir.join("downloads").display().to_string();
    let td = e.task_dir().display().to_string();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_TASK_DIR", td.as_str()),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.as_str()),
    ]);
    let id = start(&mut s, download_args("x.bin"));
    let t = wait_until("progress is visible", || {
        let t = get(&mut s, &id);
        t["statusMessage"].as_str().is_some_and(|m| m.contains("8 of 400")).then_some(t)
    });
    assert_eq!(t["status"], "working");
    let audit = std::fs::read_to_string(&log).unwrap();
    assert!(audit.contains("\"intent\""), "intent before the transfer: {audit}");
    s.ok("tasks/cancel", with_meta(json!({"taskId": id})));
    assert_eq!(wait_final(&mut s, &id)["status"], "cancelled");
    wait_until("the result is audited", || std::fs::read_to_string(&log).unwrap().contains("\"result\"").then_some(()));
}

#[test]
fn a_refused_call_creates_no_task() {
    let e = env("refused");
    let mut s = e.spawn_with("t", &e.task_dir());
    // Unknown action, bad execution options: refused at once, no record.
    let r = call_task_tool(&mut s, "invoke_action_background", json!({"action": "no_such_action"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let r =
        call_task_tool(&mut s, "invoke_action_background", json!({"action": "download_file_stream", "execution": 5}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    // An upload only as the automatic upload.
    let r = call_task_tool(
        &mut s,
        "invoke_action_background",
        json!({"action": "upload_file_stream", "params": {"stream_id": "s", "chunk_data": "", "chunk_index": 0}}),
    );
    assert!(text(&r["result"]).contains("execution.input_file"), "{r}");
    let page = call_task_tool(&mut s, "list_tasks", json!({}));
    assert_eq!(page["result"]["structuredContent"]["result"]["tasks"], json!([]), "{page}");
}

#[test]
fn a_task_directory_outside_write_mode_is_a_warning_and_unused() {
    let e = env("readmode");
    let url = e.fake.fake.url();
    let td = e.task_dir().display().to_string();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_TASK_DIR", td.as_str()),
    ]);
    let list = s.ok("tools/list", json!({"_meta": tasks_meta()}));
    assert!(!list.to_string().contains("invoke_action_background"));
    s.wait_stderr("persistent tasks need write mode");
    assert!(!e.task_dir().exists(), "the directory is not created in read mode");
    assert!(s.worker_pid("tasks").is_none());
}

#[test]
fn a_background_upload_survives_its_client() {
    let e = env("upload-disconnect");
    let path = e.dir.join("uploads").join("big.bin");
    std::fs::write(&path, vec![9u8; 4096]).unwrap();
    e.fake.fake.set_fault("upload_file_stream", Fault::Delay(std::time::Duration::from_millis(300)));
    let mut s = e.spawn();
    let id =
        start(&mut s, json!({"action": "upload_file_stream", "execution": {"input_file": path.display().to_string()}}));
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server ends after its upload");
    assert!(status.success(), "{status:?}");
    let mut s = e.spawn();
    let t = get(&mut s, &id);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["result"]["structuredContent"]["result"]["file_size"], 4096, "{t}");
    assert_eq!(t["result"]["structuredContent"]["diagnostics"]["outcome"], "success", "{t}");
}

#[test]
fn a_restarted_task_store_worker_does_not_fail_running_transfers() {
    let e = env("worker-restart");
    e.fake.fake.add_file("slow.bin", vec![4u8; 64]);
    e.fake.fake.set_fault("download_file_stream", Fault::Delay(std::time::Duration::from_millis(1500)));
    let mut s = e.spawn();
    let id = start(&mut s, download_args("slow.bin"));
    let old = s.wait_worker("tasks");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until("a new task-store worker", || s.worker_pid("tasks").filter(|p| *p != old));
    let t = wait_final(&mut s, &id);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(actions_sent(&e, "download_file_stream"), 1);
}

/// The ids `list_tasks` lists (one page).
fn listed(s: &mut Mcp) -> Vec<String> {
    let r = call_task_tool(s, "list_tasks", json!({}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let tasks = r["result"]["structuredContent"]["result"]["tasks"].as_array().unwrap().clone();
    assert!(tasks.iter().all(|t| t.get("owner").is_none()), "the owner is not shown: {r}");
    tasks.iter().map(|t| t["taskId"].as_str().unwrap().to_owned()).collect()
}

/// `tasks/get`, `tasks/cancel` and `tasks/update` of a task this session
/// may not see: each the unknown-task error, nothing of the task in it.
fn unknown_everywhere(s: &mut Mcp, id: &str) {
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let r = s.request(method, with_meta(json!({"taskId": id, "inputResponses": {}})));
        assert_eq!(r["error"]["code"], -32602, "{method}: {r}");
        assert_eq!(r["error"]["message"], "unknown task", "{method}: {r}");
    }
}

/// Tasks belong to the principal whose session created them. A stdio
/// session's belong to no access token: a restart of the same
/// configuration reads them, as before. A session serve-http starts for an
/// access token (the launcher names the token's id in the session's
/// environment) sees only that token's tasks, and no other session sees
/// those: not listed, unknown to get, cancel and update (their results hold
/// file paths and account data).
#[test]
fn tasks_are_visible_only_to_the_principal_that_created_them() {
    let e = env("owner");
    e.fake.fake.add_file("f.bin", vec![1u8; 100]);
    let mut s = e.spawn_leased(None);
    let plain = start(&mut s, download_args("f.bin"));
    assert_eq!(wait_final(&mut s, &plain)["status"], "completed");
    drop(s);

    let mut s = e.spawn_leased(Some("alice 127.0.0.1:50312"));
    assert_eq!(listed(&mut s), Vec::<String>::new(), "alice sees no stdio task");
    unknown_everywhere(&mut s, &plain);
    let alices = start(&mut s, download_args("f.bin"));
    let done = wait_final(&mut s, &alices);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(listed(&mut s), vec![alices.clone()]);
    drop(s);

    // A restart of the stdio configuration still reads its own result.
    let mut s = e.spawn_leased(None);
    assert_eq!(listed(&mut s), vec![plain.clone()]);
    let t = get(&mut s, &plain);
    assert_eq!(t["status"], "completed", "{t}");
    assert!(t["result"]["structuredContent"]["result"]["file_path"].is_string(), "{t}");
    unknown_everywhere(&mut s, &alices);
    drop(s);

    // Another token's session sees neither; alice's next session hers.
    let mut s = e.spawn_leased(Some("bob 127.0.0.1:50313"));
    assert_eq!(listed(&mut s), Vec::<String>::new());
    unknown_everywhere(&mut s, &plain);
    unknown_everywhere(&mut s, &alices);
    drop(s);
    let mut s = e.spawn_leased(Some("alice 127.0.0.2:40000"));
    assert_eq!(listed(&mut s), vec![alices.clone()]);
    assert_eq!(get(&mut s, &alices)["status"], "completed");
    unknown_everywhere(&mut s, &plain);
    // The record says whose it is, the token's id only.
    let record = std::fs::read_to_string(e.task_dir().join(format!("{alices}.json"))).unwrap();
    assert!(record.contains("\"owner\":\"http:alice\""), "{record}");
    let record = std::fs::read_to_string(e.task_dir().join(format!("{plain}.json"))).unwrap();
    assert!(!record.contains("\"owner\""), "{record}");
}
