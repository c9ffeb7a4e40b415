#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Automatic upload's input file (`execution.input_file` of
//! `upload_file_stream`), resolved as the Node server resolves it and
//! confined by the kernel while it is opened: `..` and symlinks are
//! followed while the resolved file stays inside SNOWLUMA_MCP_UPLOAD_ROOT,
//! a relative path is taken relative to the root; what resolves outside
//! (or to the root itself), directories, FIFOs, devices, hard links and
//! files over the cap are refused with Node's texts; and a symlink swapped
//! while uploads run never gets a file from outside the root uploaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::{base64, sha256};

const PREFIX: &str = "调用失败 (upload_file_stream): action upload_file_stream stream ";
const OUTSIDE: &str = "resolve input: resolved path is outside the configured upload root";
const NOT_REGULAR: &str = "open input: input_file is not a regular file";

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

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-uploads-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("uploads")).unwrap();
    std::fs::create_dir_all(dir.join("outside")).unwrap();
    // Canonical, so that expected paths compare as the server shows them.
    std::fs::canonicalize(&dir).unwrap()
}

fn root(dir: &Path) -> PathBuf {
    dir.join("uploads")
}

/// A write-mode server with `upload_root` (when given) as
/// SNOWLUMA_MCP_UPLOAD_ROOT and a 1 MiB per-file cap.
fn start(dir: PathBuf, upload_root: Option<&Path>) -> Env {
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let sd = dir.join("downloads").display().to_string();
    let ur = upload_root.map(|p| p.display().to_string());
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_MAX_STREAM_BYTES", "1048576"),
    ];
    if let Some(ur) = &ur {
        env.push(("SNOWLUMA_MCP_UPLOAD_ROOT", ur.as_str()));
    }
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    Env { fake, dir, s }
}

fn upload(s: &mut Mcp, input: &str) -> Value {
    s.call("invoke_action", json!({"action": "upload_file_stream", "execution": {"input_file": input}}))
}

fn upload_with(s: &mut Mcp, input: &str, params: Value) -> Value {
    s.call(
        "invoke_action",
        json!({"action": "upload_file_stream", "params": params, "execution": {"input_file": input}}),
    )
}

fn kind(r: &Value) -> Value {
    structured(r)["diagnostics"]["kind"].clone()
}

/// The refusal's text after Node's prefix (which it must start with).
fn refusal(r: &Value) -> String {
    assert!(is_error(r), "refused: {r}");
    let t = text(r);
    t.strip_prefix(PREFIX).unwrap_or_else(|| panic!("Node's prefix: {t}")).to_owned()
}

/// What the fake saw of the uploads since it was last cleared: the decoded
/// chunks and the file names of the first chunks.
fn chunks_seen(fake: &Fake) -> (Vec<Vec<u8>>, Vec<String>) {
    let mut chunks = Vec::new();
    let mut names = Vec::new();
    for q in fake.fake.requests().iter().filter_map(|q| q.json()) {
        if let Some(data) = q["params"]["chunk_data"].as_str() {
            chunks.push(base64::decode(data).unwrap());
            if q["params"]["chunk_index"] == 0 {
                names.push(q["params"]["filename"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    (chunks, names)
}

#[test]
fn inside_the_root_dot_dot_relative_paths_and_symlinks_are_accepted() {
    let dir = scratch("inside");
    let r = root(&dir);
    let small = b"hello from inside".to_vec();
    std::fs::write(r.join("small.txt"), &small).unwrap();
    std::fs::create_dir_all(r.join("sub/deep")).unwrap();
    std::fs::write(r.join("sub/deep/inner.txt"), &small).unwrap();
    std::os::unix::fs::symlink(r.join("small.txt"), r.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("small.txt", r.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("sub/deep", r.join("dir-link")).unwrap();
    std::os::unix::fs::symlink("../../small.txt", r.join("sub/deep/up-link")).unwrap();
    let mut e = start(dir.clone(), Some(&r));
    let rs = r.display().to_string();
    // (input as given, the file name Node sends: the resolved file's)
    let cases = [
        (format!("{rs}/small.txt"), "small.txt"),
        (format!("{rs}/sub/../small.txt"), "small.txt"),
        (format!("{rs}/nowhere/../small.txt"), "small.txt"),
        (format!("{rs}//./sub/deep/inner.txt"), "inner.txt"),
        ("small.txt".to_owned(), "small.txt"),
        ("./sub/../sub/deep/inner.txt".to_owned(), "inner.txt"),
        (format!("{rs}/abs-link"), "small.txt"),
        (format!("{rs}/rel-link"), "small.txt"),
        (format!("{rs}/dir-link/inner.txt"), "inner.txt"),
        (format!("{rs}/sub/deep/up-link"), "small.txt"),
    ];
    for (input, name) in &cases {
        e.fake.fake.clear_requests();
        let res = upload(&mut e.s, input);
        assert!(!is_error(&res), "{input} is inside the root: {res}");
        let out = &structured(&res)["result"];
        assert_eq!(out["sha256"], sha256::digest_hex(&small), "{input}");
        assert_eq!(out["file_size"], small.len(), "{input}");
        let (chunks, names) = chunks_seen(&e.fake);
        assert_eq!(chunks, vec![small.clone()], "{input}");
        assert_eq!(names, vec![name.to_string()], "{input}: named after the resolved file");
    }

    // A root configured through a symlink: both its paths name it.
    drop(e);
    let dir = scratch("inside-link");
    let r = root(&dir);
    std::fs::write(r.join("small.txt"), &small).unwrap();
    let configured = dir.join("root-link");
    std::os::unix::fs::symlink(&r, &configured).unwrap();
    let mut e = start(dir.clone(), Some(&configured));
    for input in [configured.join("small.txt"), r.join("small.txt")] {
        let res = upload(&mut e.s, &input.display().to_string());
        assert!(!is_error(&res), "{}: {res}", input.display());
    }
    // Node's message shows the resolved (canonical) path.
    let res = upload(&mut e.s, &configured.join("missing.txt").display().to_string());
    assert_eq!(
        refusal(&res),
        format!("resolve input: ENOENT: no such file or directory, lstat '{}'", r.join("missing.txt").display())
    );
}

#[test]
fn outside_the_root_and_what_is_not_a_small_regular_file_are_refused_with_nodes_texts() {
    let dir = scratch("refused");
    let r = root(&dir);
    let outside = dir.join("outside/other.txt");
    std::fs::write(&outside, b"secret outside").unwrap();
    std::fs::write(r.join("note.txt"), b"hello").unwrap();
    std::fs::create_dir_all(r.join("dir2")).unwrap();
    std::fs::write(r.join("big.bin"), vec![7u8; 1024 * 1024 + 512 * 1024]).unwrap();
    std::os::unix::fs::symlink(&outside, r.join("abs-out")).unwrap();
    std::os::unix::fs::symlink("../outside/other.txt", r.join("rel-out")).unwrap();
    std::os::unix::fs::symlink(dir.join("outside"), r.join("dir-out")).unwrap();
    std::os::unix::fs::symlink("/dev/null", r.join("null-link")).unwrap();
    std::os::unix::fs::symlink(".", r.join("self")).unwrap();
    std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
    std::fs::create_dir_all(r.join("sub/deep")).unwrap();
    std::os::unix::fs::symlink("sub/deep", r.join("dir-link")).unwrap();
    nix::unistd::mkfifo(&r.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    std::fs::hard_link(&outside, r.join("hard.txt")).unwrap();
    std::fs::write(r.join("twice.txt"), b"two names").unwrap();
    std::fs::hard_link(r.join("twice.txt"), r.join("twice-too.txt")).unwrap();
    let mut e = start(dir.clone(), Some(&r));
    let rs = r.display().to_string();
    let cases: Vec<(String, String)> = vec![
        (outside.display().to_string(), OUTSIDE.into()),
        ("/etc/passwd".into(), OUTSIDE.into()),
        ("../outside/other.txt".into(), OUTSIDE.into()),
        (format!("{rs}/../outside/other.txt"), OUTSIDE.into()),
        (format!("{rs}/abs-out"), OUTSIDE.into()),
        (format!("{rs}/rel-out"), OUTSIDE.into()),
        (format!("{rs}/dir-out/other.txt"), OUTSIDE.into()),
        (format!("{rs}/null-link"), OUTSIDE.into()),
        (rs.clone(), OUTSIDE.into()),
        (format!("{rs}/"), OUTSIDE.into()),
        (format!("{rs}/dir2/.."), OUTSIDE.into()),
        (format!("{rs}/self"), OUTSIDE.into()),
        (".".into(), OUTSIDE.into()),
        (format!("{rs}x/note.txt"), OUTSIDE.into()),
        (format!("{rs}/dir2"), NOT_REGULAR.into()),
        (format!("{rs}/fifo"), NOT_REGULAR.into()),
        (format!("{rs}/hard.txt"), "open input: input_file has more than one hard link".into()),
        (format!("{rs}/twice.txt"), "open input: input_file has more than one hard link".into()),
        (format!("{rs}/big.bin"), "open input: input_file exceeds limit (1048576 bytes)".into()),
        (
            format!("{rs}/missing.txt"),
            format!("resolve input: ENOENT: no such file or directory, lstat '{rs}/missing.txt'"),
        ),
        ("nope/x.txt".into(), format!("resolve input: ENOENT: no such file or directory, lstat '{rs}/nope'")),
        (format!("{rs}/note.txt/x"), format!("resolve input: ENOTDIR: not a directory, lstat '{rs}/note.txt/x'")),
        (format!("{rs}/loop"), format!("resolve input: ELOOP: too many symbolic links encountered, stat '{rs}/loop'")),
        // `..` is removed as text first, as Node's path.resolve does, not
        // after the symlink before it (`dir-link/..` is the root, not `sub`).
        (
            format!("{rs}/dir-link/../deep/x.txt"),
            format!("resolve input: ENOENT: no such file or directory, lstat '{rs}/deep'"),
        ),
    ];
    for (input, expect) in &cases {
        let res = upload(&mut e.s, input);
        assert_eq!(&refusal(&res), expect, "{input}");
        assert_eq!(kind(&res), "invalid_arguments", "{input}");
    }
    // MCP-owned params: named in Node's order, before the path is looked at.
    let res = upload_with(&mut e.s, &format!("{rs}/note.txt"), json!({"chunk_index": 0, "reset": true}));
    assert_eq!(refusal(&res), "prepare upload: params conflict with MCP-owned transfer fields: chunk_index, reset");
    let all = json!({"verify_only": false, "reset": false, "is_complete": null, "expected_sha256": "", "file_size": 1,
                     "total_chunks": 1, "chunk_index": 0, "chunk_data": "", "stream_id": "s"});
    let res = upload_with(&mut e.s, "/etc/passwd", all);
    assert_eq!(
        refusal(&res),
        "prepare upload: params conflict with MCP-owned transfer fields: stream_id, chunk_data, chunk_index, \
         total_chunks, file_size, expected_sha256, is_complete, reset, verify_only"
    );
    assert_eq!(kind(&res), "invalid_arguments");
    assert!(e.fake.fake.requests().is_empty(), "nothing was uploaded: {:?}", e.fake.fake.requests());

    // Without an upload root: Node's text, kind not_configured.
    drop(e);
    let dir = scratch("noroot");
    let mut e = start(dir.clone(), None);
    let res = upload(&mut e.s, &root(&dir).join("note.txt").display().to_string());
    assert_eq!(refusal(&res), "resolve input: SNOWLUMA_MCP_UPLOAD_ROOT is not configured");
    assert_eq!(kind(&res), "not_configured");
    // The root is checked before the params, as Node does.
    let res = upload_with(&mut e.s, "x", json!({"stream_id": "s"}));
    assert_eq!(refusal(&res), "resolve input: SNOWLUMA_MCP_UPLOAD_ROOT is not configured");
    assert!(e.fake.fake.requests().is_empty());
}

/// Replace `at` atomically (rename) by a fresh symlink to `target`.
fn point(at: &Path, target: &Path) {
    let tmp = at.with_extension("tmp-link");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, at).unwrap();
}

/// Replace `at` atomically by a fresh regular file holding `bytes`.
fn place(at: &Path, bytes: &[u8]) {
    let tmp = at.with_extension("tmp-file");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, at).unwrap();
}

#[test]
fn a_symlink_swapped_while_uploads_run_never_uploads_a_file_from_outside() {
    let dir = scratch("swap");
    let r = root(&dir);
    let inside: Vec<u8> = b"INSIDE ".repeat(100);
    let secret: Vec<u8> = b"SECRET! ".repeat(100);
    std::fs::write(r.join("inside.txt"), &inside).unwrap();
    let outside = dir.join("outside/secret.txt");
    std::fs::write(&outside, &secret).unwrap();
    // `link` alternates between a symlink to the file inside and one to the
    // file outside; `file` between a regular file inside and a symlink to
    // the file outside.
    let (link, file) = (r.join("link"), r.join("file"));
    point(&link, &r.join("inside.txt"));
    place(&file, &inside);
    let mut e = start(dir.clone(), Some(&r));
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, link, file, inside_path, inside, outside) =
            (stop.clone(), link.clone(), file.clone(), r.join("inside.txt"), inside.clone(), outside.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if n.is_multiple_of(2) {
                    point(&link, &outside);
                    point(&file, &outside);
                } else {
                    point(&link, &inside_path);
                    place(&file, &inside);
                }
                n += 1;
                std::thread::yield_now();
            }
            n
        })
    };
    let (mut uploaded, mut refused) = (0, 0);
    // At least 80 uploads, and on until both outcomes were seen (a busy
    // machine may give the swapping thread few turns), at most 1 000.
    for i in 0..1_000 {
        if i >= 80 && uploaded > 0 && refused > 0 {
            break;
        }
        let target = if i % 2 == 0 { &link } else { &file };
        let res = upload(&mut e.s, &target.display().to_string());
        if is_error(&res) {
            refused += 1;
        } else {
            uploaded += 1;
            assert_eq!(structured(&res)["result"]["sha256"], sha256::digest_hex(&inside), "{res}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = join(swapper, "the swapping thread");
    let (chunks, _) = chunks_seen(&e.fake);
    assert!(chunks.iter().all(|c| *c == inside), "only the file inside the root was ever uploaded");
    assert!(!chunks.contains(&secret), "the file outside the root was uploaded");
    assert_eq!(chunks.len(), uploaded, "one chunk per successful upload");
    assert!(
        uploaded > 0 && refused > 0,
        "both outcomes while swapping ({swaps} swaps): {uploaded} uploaded, {refused} refused"
    );
}
