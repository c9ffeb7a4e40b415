#![allow(clippy::unwrap_used, clippy::expect_used)]
//! File transfers through the binary: downloads into the stream directory,
//! automatic upload from the upload root, limits, escapes, cancellation and
//! progress, against the fake SnowLuma.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::{Fault, base64, sha256};

struct Env {
    fake: Fake,
    dir: PathBuf,
    s: Mcp,
}

fn stream_dir(dir: &Path) -> PathBuf {
    dir.join("downloads")
}

fn upload_root(dir: &Path) -> PathBuf {
    dir.join("uploads")
}

fn setup(name: &str, extra: &[(&str, &str)]) -> Env {
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-xfer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(upload_root(&dir)).unwrap();
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let sd = stream_dir(&dir).display().to_string();
    let ur = upload_root(&dir).display().to_string();
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_UPLOAD_ROOT", ur.as_str()),
    ];
    env.extend_from_slice(extra);
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    Env { fake, dir, s }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn downloads_are_validated_hashed_and_committed_atomically() {
    let mut e = setup("dl", &[]);
    let data = bytes(300_000);
    e.fake.fake.add_file("pic.png", data.clone());
    for split in [None, Some(1usize), Some(7), Some(4096)] {
        match split {
            Some(n) => e.fake.fake.set_fault("download_file_stream", Fault::StreamSplit(n)),
            None => e.fake.fake.clear_fault("download_file_stream"),
        }
        let small = split == Some(1);
        if small {
            e.fake.fake.add_file("small.bin", bytes(3000));
        }
        let file = if small { "small.bin" } else { "pic.png" };
        let r = e.s.call(
            "invoke_action",
            json!({"action": "download_file_stream", "params": {"file": file, "chunk_size": 1000}}),
        );
        assert!(!is_error(&r), "{split:?}: {r}");
        let res = &structured(&r)["result"];
        let path = PathBuf::from(res["file_path"].as_str().unwrap());
        assert!(path.starts_with(std::fs::canonicalize(stream_dir(&e.dir)).unwrap()));
        let saved = std::fs::read(&path).unwrap();
        let expect = if small { bytes(3000) } else { data.clone() };
        assert_eq!(saved, expect);
        assert_eq!(res["sha256"], sha256::digest_hex(&expect));
        assert_eq!(res["file_size"], expect.len());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!text(&r).contains(&base64::encode(&expect[..30])), "file bytes never appear in results");
    }
    assert!(files_in(&stream_dir(&e.dir)).iter().all(|f| !f.ends_with(".part")));
    // The other two download actions work the same way.
    for action in ["download_file_image_stream", "download_file_record_stream"] {
        let r = e.s.call("invoke_action", json!({"action": action, "params": {"file": "pic.png"}}));
        assert!(!is_error(&r), "{action}: {r}");
    }
}

fn info(size: u64) -> Value {
    json!({"status":"ok","retcode":0,"stream":"stream-action","message":"","wording":"",
           "data":{"type":"stream","data_type":"file_info","file_name":"x.bin","file_size":size,"chunk_size":4}})
}
fn chunk(index: u64, data: &str, size: u64) -> Value {
    json!({"status":"ok","retcode":0,"stream":"stream-action","message":"","wording":"",
           "data":{"type":"stream","data_type":"file_chunk","index":index,"data":data,"size":size,"progress":50,"base64_size":data.len()}})
}
fn complete(bytes: u64, chunks: u64) -> Value {
    json!({"status":"ok","retcode":0,"stream":"stream-action","message":"","wording":"",
           "data":{"type":"response","data_type":"file_complete","file_name":"x.bin","total_chunks":chunks,"total_bytes":bytes,"message":"Download completed"}})
}

#[test]
fn every_malformed_download_is_refused_and_leaves_no_file() {
    let mut e = setup("bad", &[]);
    let ab = base64::encode(b"abcd");
    let cases: Vec<(&str, Vec<Value>)> = vec![
        ("no file_info first", vec![chunk(0, &ab, 4), complete(4, 1)]),
        ("non-canonical base64", vec![info(4), chunk(0, "YWJjZA=", 4), complete(4, 1)]),
        ("trailing bits", vec![info(1), chunk(0, "YR==", 1), complete(1, 1)]),
        ("index gap", vec![info(8), chunk(1, &ab, 4), complete(4, 1)]),
        ("size mismatch", vec![info(4), chunk(0, &ab, 3), complete(4, 1)]),
        ("more than declared", vec![info(4), chunk(0, &ab, 4), chunk(1, &ab, 4), complete(8, 2)]),
        ("short of declared", vec![info(8), chunk(0, &ab, 4), complete(4, 1)]),
        ("terminal totals", vec![info(4), chunk(0, &ab, 4), complete(5, 1)]),
        ("terminal chunk count", vec![info(4), chunk(0, &ab, 4), complete(4, 2)]),
        ("missing terminal", vec![info(4), chunk(0, &ab, 4)]),
        ("frame after terminal", vec![info(4), chunk(0, &ab, 4), complete(4, 1), chunk(1, &ab, 4)]),
        ("huge declared size", vec![info(1 << 50), chunk(0, &ab, 4)]),
        (
            "error frame",
            vec![
                info(4),
                json!({"status":"failed","retcode":100,"data":{"type":"error","data_type":"error"},"message":"boom","wording":"boom"}),
            ],
        ),
        ("not json", vec![info(4), json!("not an object frame")]),
    ];
    for (name, frames) in cases {
        e.fake.fake.set_fault("download_file_stream", Fault::StreamFrames(frames));
        let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "x.bin"}}));
        assert!(is_error(&r), "{name}: {r}");
        assert!(structured(&r)["result"].is_null(), "{name}");
        assert!(files_in(&stream_dir(&e.dir)).is_empty(), "{name}: left {:?}", files_in(&stream_dir(&e.dir)));
    }
    // Transport failures mid-body too.
    e.fake.fake.add_file("x.bin", bytes(5000));
    e.fake.fake.set_fault("download_file_stream", Fault::DisconnectMidBody);
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "x.bin"}}));
    assert!(is_error(&r));
    assert!(files_in(&stream_dir(&e.dir)).is_empty());
}

#[test]
fn per_file_cap_and_directory_quota() {
    let mut e = setup("quota", &[("SNOWLUMA_MCP_MAX_STREAM_BYTES", "1000")]);
    e.fake.fake.add_file("big", bytes(1001));
    e.fake.fake.add_file("ok", bytes(900));
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "big"}}));
    assert!(is_error(&r));
    assert_eq!(
        text(&r),
        "调用失败 (download_file_stream): action download_file_stream stream frame 0: file_size exceeds limit (1000 bytes)"
    );
    for _ in 0..2 {
        let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "ok"}}));
        assert!(!is_error(&r), "{r}");
    }
    // 1800 of the 2000-byte quota used: only 200 bytes remain for the next file.
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "ok"}}));
    assert!(is_error(&r));
    assert_eq!(
        text(&r),
        "调用失败 (download_file_stream): action download_file_stream stream frame 0: frame handling failed: download directory quota 2000 bytes exceeded: existing=1800, reserved=0, requested reserve=900"
    );
    assert_eq!(files_in(&stream_dir(&e.dir)).len(), 2, "nothing partial left");
    std::fs::write(stream_dir(&e.dir).join("filler"), bytes(200)).unwrap();
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "ok"}}));
    assert!(text(&r).contains("quota"), "{}", text(&r));
}

#[test]
fn at_most_four_streams_at_once() {
    let mut e = setup("conc", &[]);
    e.fake.fake.set_fault("test_download_stream", Fault::Hang);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = json!(e.s.next_id());
        e.s.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"invoke_action","arguments":{"action":"test_download_stream"}}}));
        ids.push(id);
    }
    wait_until("four streams reach the fake", || (e.fake.fake.requests().len() >= 4).then_some(()));
    let r = e.s.call("invoke_action", json!({"action": "test_download_stream"}));
    assert!(is_error(&r));
    assert_eq!(
        text(&r),
        "调用失败 (test_download_stream): action test_download_stream stream admission: active Stream Action limit reached (4)"
    );
    for id in &ids {
        e.s.notify("notifications/cancelled", json!({"requestId": id}));
    }
    e.fake.fake.clear_fault("test_download_stream");
    // Cancelled streams free their places.
    wait_until("the stream places are freed", || {
        let r = e.s.call("invoke_action", json!({"action": "test_download_stream"}));
        (!is_error(&r)).then_some(())
    });
}

#[test]
fn cancelling_a_download_leaves_no_file() {
    let mut e = setup("cancel", &[]);
    let ab = base64::encode(b"abcd");
    e.fake
        .fake
        .set_fault("download_file_stream", Fault::StreamThenHang(vec![info(400), chunk(0, &ab, 4), chunk(1, &ab, 4)]));
    let id = json!(e.s.next_id());
    e.s.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"invoke_action","arguments":{"action":"download_file_stream","params":{"file":"x"}}}}));
    // Wait until the partial file holds the first bytes, then cancel.
    wait_until("the download starts", || {
        let part = files_in(&stream_dir(&e.dir)).into_iter().find(|f| f.ends_with(".part"))?;
        std::fs::metadata(stream_dir(&e.dir).join(part)).is_ok_and(|m| m.len() >= 8).then_some(())
    });
    e.s.notify("notifications/cancelled", json!({"requestId": id}));
    assert!(e.fake.rt.block_on(e.fake.fake.wait_closed_while_pending("download_file_stream", SAFETY)));
    wait_until("no partial file is left", || {
        let left = files_in(&stream_dir(&e.dir));
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
    // Still serving, and no response for the cancelled request.
    assert!(!is_error(&e.s.call("list_categories", json!({}))));
    assert!(e.s.backlog.iter().all(|m| m.get("id") != Some(&id)));
}

#[test]
fn automatic_upload_chunks_acks_and_completes() {
    let mut e = setup("up", &[]);
    let data = bytes(600 * 1024);
    let path = upload_root(&e.dir).join("hello.bin");
    std::fs::write(&path, &data).unwrap();
    let r = e.s.call("invoke_action", json!({"action": "upload_file_stream", "params": {"file_retention": 0}, "execution": {"input_file": path.display().to_string()}}));
    assert!(!is_error(&r), "{r}");
    let res = &structured(&r)["result"];
    assert_eq!(res["chunk_count"], 2);
    assert_eq!(res["file_size"], data.len());
    assert_eq!(res["sha256"], sha256::digest_hex(&data));
    let stream_id = res["stream_id"].as_str().unwrap();
    assert_eq!(e.fake.fake.uploaded(stream_id).unwrap(), data);
    assert!(res["file_path"].as_str().unwrap().starts_with("/fake/upload/"));
    let reqs: Vec<Value> = e.fake.fake.requests().iter().filter_map(|q| q.json()).collect();
    assert_eq!(reqs.len(), 3, "two chunks and a completion");
    assert_eq!(reqs[0]["params"]["filename"], "hello.bin");
    assert_eq!(reqs[0]["params"]["file_retention"], 0);
    assert_eq!(reqs[2]["params"]["is_complete"], true);

    // An empty file is one empty chunk.
    let empty = upload_root(&e.dir).join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let r = e.s.call(
        "invoke_action",
        json!({"action": "upload_file_stream", "execution": {"input_file": empty.display().to_string()}}),
    );
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["result"]["file_size"], 0);
    assert_eq!(structured(&r)["result"]["chunk_count"], 1);

    // MCP-owned fields are refused.
    let r = e.s.call("invoke_action", json!({"action": "upload_file_stream", "params": {"stream_id": "mine"}, "execution": {"input_file": path.display().to_string()}}));
    assert!(is_error(&r));
    assert!(text(&r).contains("stream_id"));
    // input_file belongs to upload_file_stream only.
    let r = e.s.call(
        "invoke_action",
        json!({"action": "send_group_msg", "params": {}, "execution": {"input_file": path.display().to_string()}}),
    );
    assert!(is_error(&r));
}

#[test]
fn escape_attempts_are_refused() {
    let mut e = setup("escape", &[]);
    let root = upload_root(&e.dir);
    let outside = e.dir.join("secret.txt");
    std::fs::write(&outside, b"secret").unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(e.dir.as_path(), root.join("dirlink")).unwrap();
    nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A file swapped for a symlink after the client chose it.
    let swapped = root.join("swapped.txt");
    std::fs::write(&swapped, b"fine").unwrap();
    std::fs::remove_file(&swapped).unwrap();
    std::os::unix::fs::symlink(&outside, &swapped).unwrap();
    // A hard link inside the root to a file outside it (same filesystem).
    std::fs::hard_link(&outside, root.join("hard.txt")).unwrap();
    // A character device (opening one could have effects of its own).
    std::os::unix::fs::symlink("/dev/null", root.join("null-link")).unwrap();
    let attempts = [
        root.join("hard.txt").display().to_string(),
        root.join("null-link").display().to_string(),
        root.join("link.txt").display().to_string(),
        root.join("dirlink/secret.txt").display().to_string(),
        format!("{}/../secret.txt", root.display()),
        outside.display().to_string(),
        "/etc/passwd".to_owned(),
        root.join("sub").display().to_string(),
        root.join("fifo").display().to_string(),
        swapped.display().to_string(),
        // Relative paths resolve against the upload root.
        "../secret.txt".to_owned(),
        "sub/../../secret.txt".to_owned(),
        root.display().to_string(),
        root.join("missing.txt").display().to_string(),
    ];
    for a in attempts {
        let r = e.s.call("invoke_action", json!({"action": "upload_file_stream", "execution": {"input_file": a}}));
        assert!(is_error(&r), "{a} must be refused: {r}");
        assert_eq!(diag(&r)["kind"], "invalid_arguments", "{a}");
        // Node's wording (tests/tests/uploads.rs checks each text).
        let t = text(&r);
        assert!(t.starts_with("调用失败 (upload_file_stream): action upload_file_stream stream "), "{a}: {t}");
    }
    assert!(e.fake.fake.requests().is_empty(), "nothing was uploaded");
    let r = e.s.call(
        "invoke_action",
        json!({"action": "upload_file_stream", "execution": {"input_file": root.join("hard.txt").display().to_string()}}),
    );
    assert!(text(&r).contains("hard link"), "the refusal says why: {}", text(&r));
}

#[test]
fn a_failed_or_cancelled_upload_resets_the_remote_stream() {
    let mut e = setup("reset", &[]);
    let path = upload_root(&e.dir).join("a.bin");
    std::fs::write(&path, bytes(10)).unwrap();
    e.fake.fake.set_fault("upload_file_stream", Fault::Http500);
    let r = e.s.call(
        "invoke_action",
        json!({"action": "upload_file_stream", "execution": {"input_file": path.display().to_string()}}),
    );
    assert!(is_error(&r));
    let resets = |e: &Env| {
        e.fake.fake.requests().iter().filter_map(|q| q.json()).filter(|j| j["params"]["reset"] == true).count()
    };
    assert_eq!(resets(&e), 1, "a reset follows the failure");
    // Node's words: the stage, the failure, and the reset that failed too.
    assert_eq!(
        text(&r),
        "调用失败 (upload_file_stream): action upload_file_stream stream send chunk 0: action upload_file_stream stream HTTP: unexpected status 500; remote reset failed: action upload_file_stream stream HTTP: unexpected status 500"
    );

    // Cancelled: the chunk hangs; cancelling sends the reset.
    e.fake.fake.clear_requests();
    e.fake.fake.set_fault("upload_file_stream", Fault::Hang);
    let id = json!(e.s.next_id());
    e.s.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"invoke_action","arguments":{"action":"upload_file_stream","execution":{"input_file": path.display().to_string()}}}}));
    wait_until("the upload reaches the fake", || (!e.fake.fake.requests().is_empty()).then_some(()));
    e.s.notify("notifications/cancelled", json!({"requestId": id}));
    wait_until("a reset follows the cancellation", || (resets(&e) > 0).then_some(()));
}

fn progress_for<'a>(msgs: impl Iterator<Item = &'a Value>, token: &str) -> Vec<(f64, Option<f64>)> {
    msgs.filter(|m| m["method"] == "notifications/progress" && m["params"]["progressToken"] == token)
        .map(|m| (m["params"]["progress"].as_f64().unwrap(), m["params"]["total"].as_f64()))
        .collect()
}

#[test]
fn progress_notifications_follow_the_rules() {
    let mut e = setup("progress", &[]);
    let data = bytes(200_000);
    e.fake.fake.add_file("p.bin", data.clone());
    e.fake.fake.set_fault("download_file_stream", Fault::StreamSplit(2048));
    let r = e.s.ok("tools/call", json!({"name": "invoke_action", "arguments": {"action": "download_file_stream", "params": {"file": "p.bin", "chunk_size": 1000}}, "_meta": {"progressToken": "dl-1"}}));
    assert!(!is_error(&r), "{r}");
    let seen = progress_for(e.s.backlog.iter(), "dl-1");
    assert!(!seen.is_empty());
    assert!(seen.windows(2).all(|w| w[1].0 > w[0].0), "strictly increasing: {seen:?}");
    assert_eq!(seen.last().unwrap().0, data.len() as f64, "the final value is flushed before the response");
    assert!(seen.iter().all(|(_, t)| *t == Some(data.len() as f64)));
    assert!(diag(&r).get("message").is_none(), "every notification was delivered: {r}");

    // Without a token: none.
    e.s.backlog.clear();
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "p.bin"}}));
    assert!(!is_error(&r));
    assert!(e.s.backlog.iter().all(|m| m["method"] != "notifications/progress"));

    // Upload: bytes acknowledged; generic streams: frames.
    let path = upload_root(&e.dir).join("u.bin");
    std::fs::write(&path, bytes(700 * 1024)).unwrap();
    e.s.backlog.clear();
    let r = e.s.ok("tools/call", json!({"name": "invoke_action", "arguments": {"action": "upload_file_stream", "execution": {"input_file": path.display().to_string()}}, "_meta": {"progressToken": 7}}));
    assert!(!is_error(&r), "{r}");
    let seen: Vec<f64> =
        e.s.backlog
            .iter()
            .filter(|m| m["method"] == "notifications/progress" && m["params"]["progressToken"] == 7)
            .map(|m| m["params"]["progress"].as_f64().unwrap())
            .collect();
    assert_eq!(seen.last().copied(), Some((700 * 1024) as f64));
    e.s.backlog.clear();
    let r = e.s.ok("tools/call", json!({"name": "invoke_action", "arguments": {"action": "test_download_stream"}, "_meta": {"progressToken": "g"}}));
    assert!(!is_error(&r));
    let seen = progress_for(e.s.backlog.iter(), "g");
    assert_eq!(seen.last().map(|s| s.0), Some(11.0), "ten frames and the terminal: {seen:?}");
    assert!(seen.iter().all(|(_, t)| t.is_none()), "no total without a known size");
}
