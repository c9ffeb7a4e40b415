#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Transfers leave nothing behind, whatever happens to them: no descriptor
//! in any process after cancels and refusals, no `.part` file after a cancel
//! at any instant or a killed file-transfer worker, and stale `.part` files
//! of a killed session are swept (and never counted against the quota);
//! concurrent downloads reserve only what they announce.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

struct Env {
    fake: Fake,
    dir: PathBuf,
    s: Mcp,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn downloads(dir: &Path) -> PathBuf {
    dir.join("downloads")
}

fn uploads(dir: &Path) -> PathBuf {
    dir.join("uploads")
}

fn setup(name: &str, prepare: impl FnOnce(&Path)) -> Env {
    setup_with(name, prepare, &[])
}

fn setup_with(name: &str, prepare: impl FnOnce(&Path), extra: &[(&str, &str)]) -> Env {
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-clean-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(uploads(&dir)).unwrap();
    std::fs::create_dir_all(downloads(&dir)).unwrap();
    prepare(&dir);
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let sd = downloads(&dir).display().to_string();
    let ur = uploads(&dir).display().to_string();
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_UPLOAD_ROOT", ur.as_str()),
    ];
    env.extend_from_slice(extra);
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    Env { fake, dir, s }
}

/// Descriptors of files (not sockets, pipes or epoll instances, whose
/// number varies with the executor's keep-alive pool): what a transfer
/// passes between the processes.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.is_absolute())).count())
        .unwrap_or(0)
}

/// File descriptor counts of the supervisor, the executor and the file-transfer worker.
fn counts(e: &Env) -> [usize; 3] {
    let sup = e.s.child.id() as i32;
    let net = e.s.worker_pid("network").unwrap();
    let files = e.s.worker_pid("files").unwrap();
    [fd_count(sup), fd_count(net), fd_count(files)]
}

/// Wait until the counts are back at (or below) `baseline` (work still
/// settling may hold a descriptor for a moment); fail with the last counts
/// otherwise.
fn settle_at(e: &Env, baseline: [usize; 3]) {
    wait_until("the descriptor counts are back at the baseline", || {
        let now = counts(e);
        // At most: the baseline itself may catch a descriptor of the
        // warm-up call on its way to being closed.
        if now.iter().zip(baseline).all(|(n, b)| *n <= b) {
            Ok(())
        } else {
            Err(format!("descriptors (supervisor, executor, files): {now:?}, baseline {baseline:?}"))
        }
    });
}

fn parts(dir: &Path) -> Vec<String> {
    std::fs::read_dir(downloads(dir))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect()
}

fn call_id(s: &mut Mcp, args: Value) -> i64 {
    let id = s.next_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "invoke_action", "arguments": args}}));
    id
}

fn cancel(s: &mut Mcp, id: i64) {
    s.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
}

/// 1000 uploads each cancelled right after it was sent, then 200 uploads
/// refused by the stream limit: every process is back at its descriptor
/// count (one cancelled upload used to leave its descriptor in the
/// supervisor; each refused one, in the executor).
#[test]
fn cancels_and_refusals_leak_no_descriptor() {
    let mut e = setup("fds", |dir| std::fs::write(uploads(dir).join("u.bin"), vec![7u8; 10_000]).unwrap());
    let input = uploads(&e.dir).join("u.bin").display().to_string();
    let upload = json!({"action": "upload_file_stream", "execution": {"input_file": input}});
    // Warm up every path (the executor's connection pool, the descriptor tables).
    let r = e.s.call("invoke_action", upload.clone());
    assert!(!is_error(&r), "{r}");
    e.s.wait_worker("files");
    let baseline = counts(&e);
    for _ in 0..1000 {
        let id = call_id(&mut e.s, upload.clone());
        cancel(&mut e.s, id);
    }
    let r = e.s.call("list_categories", json!({}));
    assert!(!is_error(&r));
    settle_at(&e, baseline);

    // Four generic streams that never finish take every stream slot.
    e.fake.fake.set_fault("test_download_stream", Fault::StreamThenHang(vec![]));
    let hanging: Vec<i64> = (0..4).map(|_| call_id(&mut e.s, json!({"action": "test_download_stream"}))).collect();
    wait_until("four streams reach the fake", || {
        let n = e.fake.fake.requests().iter().filter(|r| r.action.as_deref() == Some("test_download_stream")).count();
        (n >= 4).then_some(())
    });
    let busy = counts(&e);
    for _ in 0..200 {
        let r = e.s.call("invoke_action", upload.clone());
        assert!(is_error(&r));
        assert_eq!(
            text(&r),
            "调用失败 (upload_file_stream): action upload_file_stream stream admission: active Stream Action limit reached (4)"
        );
    }
    settle_at(&e, busy);
    for id in hanging {
        cancel(&mut e.s, id);
    }
    settle_at(&e, baseline);
}

/// A download cancelled at any instant after it starts leaves no `.part`
/// file (a cancel 0.1–2 ms in used to leave one in about one try in ten).
#[test]
fn a_cancel_at_any_instant_leaves_no_partial_file() {
    let mut e = setup("cancel", |_| {});
    e.fake.fake.add_file("f.bin", vec![1u8; 200_000]);
    let dl = json!({"action": "download_file_stream", "params": {"file": "f.bin", "chunk_size": 4096}});
    for i in 0..300u64 {
        let id = call_id(&mut e.s, dl.clone());
        // 0 to 2.9 ms, spread over the tries.
        std::thread::sleep(Duration::from_micros((i * 97) % 3000));
        cancel(&mut e.s, id);
    }
    let r = e.s.call("list_categories", json!({}));
    assert!(!is_error(&r));
    wait_until("no partial file is left", || {
        let left = parts(&e.dir);
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
}

/// The file-transfer worker is killed while a download runs; its successor
/// can still remove the `.part` file its predecessor created.
#[test]
fn a_restarted_files_worker_aborts_its_predecessors_partial_file() {
    let mut e = setup("restart", |_| {});
    e.fake.fake.set_fault(
        "download_file_stream",
        Fault::StreamThenHang(vec![json!({"status": "ok", "retcode": 0, "data": {"type": "stream", "data_type": "file_info", "file_name": "x.bin", "file_size": 1000, "total_chunks": 1}})]),
    );
    let id = call_id(&mut e.s, json!({"action": "download_file_stream", "params": {"file": "x.bin"}}));
    wait_until("a partial file appears", || (!parts(&e.dir).is_empty()).then_some(()));
    let old = e.s.worker_pid("files").unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until("the files worker is restarted", || e.s.worker_pid("files").filter(|p| *p != old));
    cancel(&mut e.s, id);
    let r = e.s.call("list_categories", json!({}));
    assert!(!is_error(&r));
    wait_until("no partial file is left", || {
        let left = parts(&e.dir);
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
}

/// `.part` files of our naming scheme left by a killed session are removed
/// before the first download and never count against the quota; a locked
/// one (a live download of another session) and other files stay.
#[test]
fn stale_partial_files_are_swept_and_not_counted() {
    let stale = "abababab-abab-4bab-abab-abababababab.part".to_owned();
    let live = "cdcdcdcd-cdcd-4dcd-8dcd-cdcdcdcdcdcd.part".to_owned();
    let held: std::sync::Arc<std::sync::Mutex<Option<std::fs::File>>> = Default::default();
    let keep = held.clone();
    // A 1 MiB per-file cap: the quota is 2 MiB.
    let mut e = setup_with(
        "sweep",
        |dir| {
            // A stale part as large as the whole quota.
            let f = std::fs::File::create(downloads(dir).join(&stale)).unwrap();
            f.set_len(2 * 1024 * 1024).unwrap();
            std::fs::write(downloads(dir).join("notes.part"), b"not ours").unwrap();
            let f = std::fs::File::create(downloads(dir).join(&live)).unwrap();
            // SAFETY (test): flock on a descriptor we own.
            assert_eq!(unsafe { nix::libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), nix::libc::LOCK_EX) }, 0);
            *keep.lock().unwrap() = Some(f);
        },
        &[("SNOWLUMA_MCP_MAX_STREAM_BYTES", "1048576")],
    );
    e.fake.fake.add_file("f.bin", vec![3u8; 1000]);
    let r = e.s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "f.bin"}}));
    assert!(!is_error(&r), "the stale part neither blocks the quota nor stays: {r}");
    let left = parts(&e.dir);
    assert!(!left.contains(&stale), "{left:?}");
    assert!(left.contains(&live), "a locked (live) part stays: {left:?}");
    assert!(left.contains(&"notes.part".to_owned()), "files not of our scheme stay: {left:?}");
    drop(held);
}

/// Four downloads at once under the default quota (twice the per-file
/// cap): each keeps reserved only the size it announces, so all four run.
/// (Each used to reserve the whole per-file cap, so the third and fourth
/// were refused.)
#[test]
fn four_concurrent_downloads_fit_the_quota() {
    let mut e = setup_with("four", |_| {}, &[("SNOWLUMA_MCP_MAX_STREAM_BYTES", "1048576")]);
    e.fake.fake.add_file("f.bin", vec![5u8; 300_000]);
    // The downloads start together: each waits before its first frame.
    e.fake.fake.set_fault("download_file_stream", Fault::Delay(Duration::from_millis(300)));
    let dl = json!({"action": "download_file_stream", "params": {"file": "f.bin"}});
    let ids: Vec<i64> = (0..4).map(|_| call_id(&mut e.s, dl.clone())).collect();
    for id in ids {
        let r = e.s.wait_for(&json!(id));
        let result = &r["result"];
        assert_eq!(result["isError"], false, "download {id}: {r}");
        assert_eq!(result["structuredContent"]["result"]["file_size"], 300_000);
    }
    let saved = std::fs::read_dir(downloads(&e.dir)).unwrap().count();
    assert_eq!(saved, 4);
}

/// The executor runs out of descriptors just as an upload's file arrives:
/// that upload fails with a clear error, and the descriptor channel (which
/// one such message used to close for good) carries the next one.
#[test]
fn the_descriptor_channel_survives_running_out_of_descriptors() {
    let mut e = setup("emfile", |dir| std::fs::write(uploads(dir).join("u.bin"), vec![7u8; 1000]).unwrap());
    let input = uploads(&e.dir).join("u.bin").display().to_string();
    let upload = json!({"action": "upload_file_stream", "execution": {"input_file": input}});
    let r = e.s.call("invoke_action", upload.clone());
    assert!(!is_error(&r), "{r}");
    let net = e.s.worker_pid("network").unwrap();
    // The lowest free descriptor number: a limit there makes the next one fail.
    let used: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{net}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    let lowest_free = (0..).find(|n| !used.contains(n)).unwrap();
    let set = |soft: u64| {
        let mut old = nix::libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY (test): prlimit on a descendant with valid pointers.
        let rc = unsafe { nix::libc::prlimit(net, nix::libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
        let new = nix::libc::rlimit { rlim_cur: soft, rlim_max: old.rlim_max };
        // SAFETY (test): as above.
        let rc = unsafe { nix::libc::prlimit(net, nix::libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
        old.rlim_cur
    };
    let before = set(lowest_free);
    let r = e.s.call("invoke_action", upload.clone());
    assert!(is_error(&r), "the upload whose file could not be received fails: {r}");
    assert!(text(&r).contains("could not be received"), "a clear error, at once: {}", text(&r));
    set(before);
    let r = e.s.call("invoke_action", upload);
    assert!(!is_error(&r), "the channel still carries descriptors: {r}");
}
