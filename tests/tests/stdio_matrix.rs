#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The binary answers on stdout, completely, however a host wires its
//! stdio: each of stdin and stdout a pipe (Python hosts), a socketpair
//! (Node/Electron hosts: Claude Desktop, Claude Code, Cursor, VS Code), one
//! shared socket (systemd `Accept=yes`), a regular file or `/dev/null`.
//!
//! Every combination gets `initialize`, the catalog resource (a reply of
//! several hundred KiB, larger than any socket or pipe buffer) and a burst
//! of 200 pipelined requests, written before any reply is read, then EOF.
//! Every reply must arrive on stdout, once, complete; nothing on stdin.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::thread;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use serde_json::{Value, json};
use snowluma_e2e::{bin_path, join, wait_exit};

const BURST: i64 = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Pipe,
    Socketpair,
    File,
    DevNull,
}

const ENDS: [End; 4] = [End::Pipe, End::Socketpair, End::File, End::DevNull];

/// The whole session as the client writes it: initialize, initialized,
/// the catalog resource, then the burst.
fn requests() -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |v: Value| {
        out.extend_from_slice(serde_json::to_string(&v).unwrap().as_bytes());
        out.push(b'\n');
    };
    push(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "matrix", "version": "1"}}}));
    push(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    push(
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "snowluma://onebot/actions"}}),
    );
    for i in 0..BURST {
        let id = 3 + i;
        let call = if i % 2 == 0 {
            json!({"name": "get_action", "arguments": {"name": "get_status"}})
        } else {
            json!({"name": "list_categories", "arguments": {}})
        };
        push(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": call}));
    }
    out
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).unwrap()
}

/// Check a complete stdout transcript: every id once, each reply whole.
fn check(label: &str, out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("{label}: stdout is not UTF-8: {e}"));
    assert!(text.ends_with('\n'), "{label}: the last reply is cut short");
    let mut ids = BTreeSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{label}: a reply is not JSON ({e})"));
        assert!(v.get("error").is_none(), "{label}: error reply {v}");
        let id = v["id"].as_i64().unwrap_or_else(|| panic!("{label}: reply without id: {v}"));
        assert!(ids.insert(id), "{label}: reply {id} arrived twice");
        if id == 2 {
            let catalog = v["result"]["contents"][0]["text"].as_str().unwrap();
            let parsed: Value = serde_json::from_str(catalog).unwrap();
            assert_eq!(parsed["actions"].as_array().map(Vec::len), Some(193), "{label}: catalog incomplete");
        }
    }
    let expected: BTreeSet<i64> = (1..=2 + BURST).collect();
    assert_eq!(ids, expected, "{label}: missing replies");
}

/// Run one combination; returns what arrived on stdout (None when stdout
/// is /dev/null) and what came back on stdin's side.
fn run(stdin: End, stdout: End) -> (Option<Vec<u8>>, Vec<u8>) {
    let label = format!("stdin {stdin:?} x stdout {stdout:?}");
    let input = requests();
    let dir = std::env::temp_dir().join(format!("snowluma-matrix-{}-{stdin:?}-{stdout:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // stdin: the child's end, and ours to write (pipe/socketpair) or nothing.
    let (child_in, our_in): (Stdio, Option<OwnedFd>) = match stdin {
        End::Pipe => {
            let (r, w) = pipe();
            (Stdio::from(r), Some(w))
        }
        End::Socketpair => {
            let (a, b) = pair();
            (Stdio::from(a), Some(b))
        }
        End::File => {
            let path = dir.join("stdin");
            std::fs::write(&path, &input).unwrap();
            (Stdio::from(File::open(&path).unwrap()), None)
        }
        End::DevNull => (Stdio::null(), None),
    };
    let out_path = dir.join("stdout");
    let (child_out, our_out): (Stdio, Option<OwnedFd>) = match stdout {
        End::Pipe => {
            let (r, w) = pipe();
            (Stdio::from(w), Some(r))
        }
        End::Socketpair => {
            let (a, b) = pair();
            (Stdio::from(a), Some(b))
        }
        End::File => (Stdio::from(File::create(&out_path).unwrap()), None),
        End::DevNull => (Stdio::null(), None),
    };
    let mut child = Command::new(bin_path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(child_in)
        .stdout(child_out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Everything is written before any reply is read. On a socketpair the
    // writer then half-closes (EOF for the server) and collects anything the
    // server sends back into stdin's socket, which must be nothing.
    let is_socket = stdin == End::Socketpair;
    let writer = our_in.map(|fd| {
        let input = input.clone();
        thread::spawn(move || {
            let mut f = File::from(fd);
            f.write_all(&input).unwrap();
            let mut back = Vec::new();
            if is_socket {
                nix::sys::socket::shutdown(f.as_raw_fd(), nix::sys::socket::Shutdown::Write).unwrap();
                f.read_to_end(&mut back).unwrap();
            }
            back
        })
    });
    let reader = our_out.map(|fd| {
        thread::spawn(move || {
            let mut out = Vec::new();
            File::from(fd).read_to_end(&mut out).unwrap();
            out
        })
    });
    let status = wait_exit(&mut child, &format!("{label}: the server exits after stdin's EOF"));
    assert!(status.success(), "{label}: exit status {status}");
    let back = writer.map(|w| join(w, &format!("{label}: stdin's writer finishes"))).unwrap_or_default();
    let out = match (stdout, reader) {
        (_, Some(r)) => Some(join(r, &format!("{label}: stdout closes"))),
        (End::File, None) => {
            let mut f = File::open(&out_path).unwrap();
            f.rewind().unwrap();
            let mut v = Vec::new();
            f.read_to_end(&mut v).unwrap();
            Some(v)
        }
        _ => None,
    };
    let _ = std::fs::remove_dir_all(&dir);
    (out, back)
}

#[test]
fn every_stdin_stdout_combination_gets_every_reply_on_stdout() {
    for stdin in ENDS {
        for stdout in ENDS {
            let label = format!("stdin {stdin:?} x stdout {stdout:?}");
            let (out, back) = run(stdin, stdout);
            assert!(back.is_empty(), "{label}: the server wrote into stdin's socket");
            match (stdin, out) {
                // No input: no session, no output.
                (End::DevNull, Some(out)) => assert!(out.is_empty(), "{label}: output without input"),
                (_, Some(out)) => check(&label, &out),
                (_, None) => {}
            }
        }
    }
}

/// systemd `Accept=yes`: one connected socket as both stdin and stdout.
#[test]
fn one_shared_socket_carries_both_directions() {
    let (ours, theirs) = pair();
    let theirs_out = theirs.try_clone().unwrap();
    let mut child = Command::new(bin_path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::from(theirs_out))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let write_end = ours.try_clone().unwrap();
    let writer = thread::spawn(move || {
        let mut f = File::from(write_end);
        f.write_all(&requests()).unwrap();
        // Half-close: EOF for the server's reads, replies still flow back.
        nix::sys::socket::shutdown(f.as_raw_fd(), nix::sys::socket::Shutdown::Write).unwrap();
    });
    let reader = thread::spawn(move || {
        let mut out = Vec::new();
        File::from(ours).read_to_end(&mut out).unwrap();
        out
    });
    let out = join(reader, "shared socket: the replies end");
    join(writer, "shared socket: the requests are written");
    let status = wait_exit(&mut child, "shared socket: the server exits after stdin's EOF");
    assert!(status.success(), "shared socket: exit status {status}");
    check("shared socket", &out);
}

/// `2>&1`: stdout and stderr are one pipe. The replies are written by the
/// blocking writer (the pipe stays blocking for the log writer) and still
/// all arrive, whole, between the diagnostic lines.
#[test]
fn stdout_and_stderr_on_one_pipe() {
    let (r, w) = pipe();
    let (in_r, in_w) = pipe();
    let mut child = Command::new(bin_path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // Only the startup line naming the writer: log lines written while a
        // reply is being written could land inside it (the host chose `2>&1`),
        // as the session's "stdin ended; finishing the calls in flight" did
        // when stdin's end was read while the catalog's reply was written.
        .env("SNOWLUMA_MCP_LOG", "warn,snowluma_mcp::transport=debug,snowluma_mcp::transport::session=warn")
        .stdin(Stdio::from(in_r))
        .stdout(Stdio::from(w.try_clone().unwrap()))
        .stderr(Stdio::from(w))
        .spawn()
        .unwrap();
    let writer = thread::spawn(move || File::from(in_w).write_all(&requests()).unwrap());
    let reader = thread::spawn(move || {
        let mut out = Vec::new();
        File::from(r).read_to_end(&mut out).unwrap();
        out
    });
    let out = join(reader, "2>&1: the output ends");
    join(writer, "2>&1: the requests are written");
    let status = wait_exit(&mut child, "2>&1: the server exits after stdin's EOF");
    assert!(status.success(), "2>&1: exit status {status}");
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("stdout=\"blocking\""), "the shared pipe is written by the blocking writer");
    let replies: String = text.lines().filter(|l| l.starts_with('{')).map(|l| format!("{l}\n")).collect();
    check("2>&1", replies.as_bytes());
}

/// Started with standard descriptors closed (a careless host, a shell's
/// `exec >&-`), the binary opens `/dev/null` on them first, as std's
/// runtime does (the binary has its own C `main`): `--version` prints and
/// succeeds with stdout closed, and with stdin and stderr closed a docs
/// session sees EOF and ends cleanly, so nothing it opened later took
/// number 0 or 2.
#[test]
fn closed_standard_descriptors_are_opened_on_dev_null() {
    use std::os::unix::process::CommandExt;
    let closed = |fds: &'static [i32], args: &[&str]| {
        let mut cmd = Command::new(bin_path());
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).args(args);
        // SAFETY: between fork and exec only close(2), which is
        // async-signal-safe, runs in the child.
        unsafe {
            cmd.pre_exec(move || {
                for fd in fds {
                    nix::libc::close(*fd);
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        wait_exit(&mut child, "the binary with closed standard descriptors exits")
    };
    let st = closed(&[1], &["--version"]);
    assert!(st.success(), "--version with stdout closed: {st}");
    let st = closed(&[0, 2], &[]);
    assert!(st.success(), "a docs session with stdin and stderr closed: {st}");
    let st = closed(&[0, 1, 2], &[]);
    assert!(st.success(), "a docs session with all three closed: {st}");
}
