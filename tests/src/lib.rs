//! Test harness: spawns the built `snowluma-mcp` binary and speaks
//! newline-delimited JSON-RPC with it over stdio.
//!
//! Reads use a generous safety deadline so that a broken build fails a test
//! instead of hanging CI; no test asserts on how long anything takes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

pub const SAFETY: Duration = Duration::from_secs(60);
pub const MODERN: &str = "2026-07-28";

/// Path of the built binary (target/<profile>/snowluma-mcp next to this test's deps dir).
pub fn bin_path() -> PathBuf {
    if let Ok(p) = std::env::var("SNOWLUMA_MCP_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("target dir");
    }
    let bin = dir.join("snowluma-mcp");
    assert!(bin.exists(), "{} not built: run `cargo build --workspace --bins` first", bin.display());
    bin
}

pub struct Mcp {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Notifications and responses received while waiting for another id.
    pub backlog: VecDeque<Value>,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
    next_id: i64,
}

impl Mcp {
    /// Spawn with exactly these environment variables (nothing inherited but PATH).
    pub fn spawn(env: &[(&str, &str)]) -> Mcp {
        Mcp::spawn_args(env, &[])
    }

    pub fn spawn_args(env: &[(&str, &str)], args: &[&str]) -> Mcp {
        Mcp::spawn_command(Mcp::command(env, args))
    }

    /// The command `spawn_args` runs, for a test that adjusts it further.
    pub fn command(env: &[(&str, &str)], args: &[&str]) -> Command {
        let mut cmd = Command::new(bin_path());
        cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Spawn `cmd` with piped stdio and speak MCP with it.
    pub fn spawn_command(mut cmd: Command) -> Mcp {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn snowluma-mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr_buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sb = stderr_buf.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sb.lock().unwrap().push_str(&line);
                sb.lock().unwrap().push('\n');
            }
        });
        let stdin = child.stdin.take();
        Mcp { child, stdin, lines: rx, backlog: VecDeque::new(), stderr: stderr_buf, next_id: 1 }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until stderr contains `needle` (the stderr reader runs on its
    /// own thread, so a line may arrive after the response that follows it).
    pub fn wait_stderr(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + SAFETY;
        loop {
            if self.stderr_text().contains(needle) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, v: &Value) {
        self.send_raw(&v.to_string());
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Next line from stdout; every line must be JSON (stdout is the protocol).
    pub fn recv(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(SAFETY)
            .unwrap_or_else(|_| panic!("no message from server; stderr:\n{}", self.stderr_text()));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line}"))
    }

    pub fn next_id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// Wait for the response to `id`, keeping everything else in the backlog.
    pub fn wait_for(&mut self, id: &Value) -> Value {
        if let Some(pos) = self.backlog.iter().position(|m| m.get("id") == Some(id) && m.get("method").is_none()) {
            return self.backlog.remove(pos).unwrap();
        }
        loop {
            let m = self.recv();
            if m.get("id") == Some(id) && m.get("method").is_none() {
                return m;
            }
            self.backlog.push_back(m);
        }
    }

    /// Send a request and return the whole response message.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id());
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            msg["params"] = params;
        }
        self.send(&msg);
        self.wait_for(&id)
    }

    /// A request's `result`, panicking on a JSON-RPC error.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params);
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if !params.is_null() {
            msg["params"] = params;
        }
        self.send(&msg);
    }

    /// Legacy handshake with the given revision.
    pub fn initialize(&mut self, version: &str) -> Value {
        self.initialize_with(version, json!({}))
    }

    pub fn initialize_with(&mut self, version: &str, capabilities: Value) -> Value {
        let r = self.ok(
            "initialize",
            json!({"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "e2e", "version": "1"}}),
        );
        self.notify("notifications/initialized", Value::Null);
        r
    }

    /// Call a tool in a legacy session; returns the CallToolResult.
    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        self.ok("tools/call", json!({"name": tool, "arguments": args}))
    }

    /// Call a tool as a modern client (per-request `_meta`).
    pub fn call_modern(&mut self, tool: &str, args: Value, extra_meta: Value) -> Value {
        let mut meta = modern_meta();
        if let (Value::Object(m), Value::Object(x)) = (&mut meta, extra_meta) {
            m.extend(x);
        }
        self.ok("tools/call", json!({"name": tool, "arguments": args, "_meta": meta}))
    }

    /// Pids of the supervisor's descendants (the spawner and the workers it started).
    pub fn worker_pids(&self) -> Vec<i32> {
        fn children(pid: i32) -> Vec<i32> {
            let mut out = Vec::new();
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                for t in tasks.flatten() {
                    if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                        out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
                    }
                }
            }
            out
        }
        let mut out = Vec::new();
        let mut queue = children(self.child.id() as i32);
        while let Some(p) = queue.pop() {
            queue.extend(children(p));
            out.push(p);
        }
        out.sort();
        out.dedup();
        out
    }

    /// Pid of the worker with the given role (from its command line).
    pub fn worker_pid(&self, role: &str) -> Option<i32> {
        self.worker_pids().into_iter().find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|a| a == role.as_bytes()))
                .unwrap_or(false)
        })
    }

    /// Wait until a worker of `role` is running (workers start asynchronously).
    pub fn wait_worker(&mut self, role: &str) -> i32 {
        // A documentation call is answered only once the catalog worker is
        // up; for other roles poll /proc (bounded by the safety deadline).
        let deadline = std::time::Instant::now() + SAFETY;
        loop {
            if let Some(p) = self.worker_pid(role) {
                return p;
            }
            assert!(std::time::Instant::now() < deadline, "no {role} worker appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The per-request `_meta` of a modern client.
pub fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "1"}
    })
}

/// `structuredContent` of a CallToolResult.
pub fn structured(r: &Value) -> &Value {
    r.get("structuredContent").unwrap_or_else(|| panic!("no structuredContent: {r}"))
}

pub fn is_error(r: &Value) -> bool {
    r.get("isError").and_then(Value::as_bool).unwrap_or(false)
}

pub fn text(r: &Value) -> String {
    r["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}
/// Run a fake SnowLuma on its own runtime thread for the life of the handle.
pub struct Fake {
    pub fake: snowluma_fake::FakeSnowLuma,
    pub rt: tokio::runtime::Runtime,
}

impl Fake {
    pub fn start(token: Option<&str>) -> Fake {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let fake = rt
            .block_on(snowluma_fake::FakeSnowLuma::start(snowluma_fake::FakeOptions {
                token: token.map(str::to_owned),
            }))
            .unwrap();
        Fake { fake, rt }
    }
}

/// CPU time (user + system) of a process and all its live descendants
/// (the spawner and the workers), in seconds.
pub fn process_tree_cpu_secs(pid: u32) -> f64 {
    process_tree_cpu_by_name(pid).iter().map(|(_, s)| s).sum()
}

/// CPU seconds (user + system) of every process in the tree rooted at
/// `pid`, by process name, summed per name.
pub fn process_tree_cpu_by_name(pid: u32) -> Vec<(String, f64)> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    let mut queue = vec![pid.to_string()];
    while let Some(p) = queue.pop() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let name = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(n, _)| n.to_owned());
            let rest: Vec<&str> =
                stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
            let ticks = rest.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
                + rest.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            let name = name.unwrap_or_default();
            match by_name.iter_mut().find(|(n, _)| *n == name) {
                Some((_, s)) => *s += ticks / 100.0,
                None => by_name.push((name, ticks / 100.0)),
            }
        }
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(children) = std::fs::read_to_string(t.path().join("children")) {
                    queue.extend(children.split_whitespace().map(str::to_owned));
                }
            }
        }
    }
    by_name
}
