//! Test harness: spawns the built `snowluma-mcp` binary and speaks
//! newline-delimited JSON-RPC with it over stdio.
//!
//! Every wait has a generous safety deadline ([`SAFETY`]) so that a broken
//! build fails a test instead of hanging CI; no test asserts on how long
//! anything takes. Polling goes through [`wait_until`]; reads from the
//! server through [`Mcp::recv`]; child processes through [`wait_exit`] and
//! [`BoundedOutput`]; helper threads through [`join`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

pub mod procfs;
pub use procfs::{alive, children, cmdline, descendants, memory_contains, pss_kib, status_field};

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const SAFETY: Duration = Duration::from_secs(60);
pub const MODERN: &str = "2026-07-28";

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// What a [`wait_until`] condition gives back: `Option<T>` (ready or not),
/// or `Result<T, E>` whose error describes the state while not ready (shown
/// if the wait times out).
pub trait Ready<T> {
    fn ready(self) -> Result<T, String>;
}

impl<T> Ready<T> for Option<T> {
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: std::fmt::Debug> Ready<T> for Result<T, E> {
    fn ready(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// Poll `check` until it is ready and return its value; panic naming `what`
/// (and the last state `check` reported) once [`SAFETY`] has passed.
pub fn wait_until<T, R: Ready<T>>(what: &str, mut check: impl FnMut() -> R) -> T {
    let deadline = Instant::now() + SAFETY;
    loop {
        let last = match check().ready() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            if last.is_empty() {
                panic!("timed out after {SAFETY:?} waiting until {what}");
            }
            panic!("timed out after {SAFETY:?} waiting until {what}; last: {last}");
        }
        std::thread::sleep(POLL);
    }
}

/// Text shown as itself (not quoted) when a wait times out.
pub struct Tail(pub String);

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\n{}", self.0)
    }
}

/// Wait for `child` to exit (`what` names the wait); at the deadline it is
/// killed and the test fails.
pub fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    /// Kills the child if the wait fails.
    struct Guard<'a>(&'a mut Child);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let guard = Guard(child);
    wait_until(what, || guard.0.try_wait().expect("try_wait"))
}

/// [`Command::output`] with the safety deadline.
pub trait BoundedOutput {
    /// Like `output`: stdin is `/dev/null`, stdout and stderr are collected.
    /// A child still running at the deadline is killed and the test fails.
    fn bounded_output(&mut self) -> std::io::Result<Output>;
}

impl BoundedOutput for Command {
    fn bounded_output(&mut self) -> std::io::Result<Output> {
        fn collect<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        }
        let mut child = self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let out = collect(child.stdout.take());
        let err = collect(child.stderr.take());
        let status = wait_exit(&mut child, "the command exits");
        Ok(Output {
            status,
            stdout: join(out, "the command's stdout closes"),
            stderr: join(err, "the command's stderr closes"),
        })
    }
}

/// Join a helper thread, failing the test if it has not finished by the
/// deadline (a thread blocked in a read whose writer never closes).
pub fn join<T>(handle: std::thread::JoinHandle<T>, what: &str) -> T {
    wait_until(what, || handle.is_finished().then_some(()));
    handle.join().unwrap_or_else(|_| panic!("the thread for {what} panicked"))
}

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
    pub fn spawn_command(cmd: Command) -> Mcp {
        let mut s = Mcp::spawn_command_unread_stderr(cmd);
        s.read_stderr();
        s
    }

    /// [`Mcp::spawn_command`], but nobody reads the server's stderr pipe
    /// until [`Mcp::read_stderr`] (an MCP host may never read it): once its
    /// buffer (64 KiB) is full, a blocking write to it waits forever.
    pub fn spawn_command_unread_stderr(mut cmd: Command) -> Mcp {
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
        let stdin = child.stdin.take();
        Mcp { child, stdin, lines: rx, backlog: VecDeque::new(), stderr: stderr_buf, next_id: 1 }
    }

    /// Start reading the server's stderr into [`Mcp::stderr`] (at once for
    /// [`Mcp::spawn_command`]); a no-op once reading.
    pub fn read_stderr(&mut self) {
        let Some(stderr) = self.child.stderr.take() else { return };
        let sb = self.stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sb.lock().unwrap().push_str(&line);
                sb.lock().unwrap().push('\n');
            }
        });
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until stderr contains `needle` (the stderr reader runs on its
    /// own thread, so a line may arrive after the response that follows it);
    /// the test fails, showing stderr, if it never does.
    pub fn wait_stderr(&self, needle: &str) {
        wait_until(&format!("stderr contains {needle:?}"), || {
            let text = self.stderr_text();
            if text.contains(needle) { Ok(()) } else { Err(Tail(text)) }
        })
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
        self.recv_before(Instant::now() + SAFETY)
    }

    /// Next line from stdout, which must arrive before `deadline` (for
    /// loops of reads bounded as a whole).
    pub fn recv_before(&mut self, deadline: Instant) -> Value {
        let line = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
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
        let deadline = Instant::now() + SAFETY;
        loop {
            let m = self.recv_before(deadline);
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

    /// Send a request without waiting for its response; returns its id
    /// (collect the response later with [`Mcp::wait_for`]).
    pub fn send_request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id());
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            msg["params"] = params;
        }
        self.send(&msg);
        id
    }

    /// Wait for a request the server sends to the client (a message with
    /// `method` and an `id`, e.g. `elicitation/create`), keeping everything
    /// else in the backlog.
    pub fn wait_server_request(&mut self, method: &str) -> Value {
        let is_it = |m: &Value| m.get("method").and_then(Value::as_str) == Some(method) && m.get("id").is_some();
        if let Some(pos) = self.backlog.iter().position(is_it) {
            return self.backlog.remove(pos).unwrap();
        }
        let deadline = Instant::now() + SAFETY;
        loop {
            let m = self.recv_before(deadline);
            if is_it(&m) {
                return m;
            }
            self.backlog.push_back(m);
        }
    }

    /// Wait for a notification with `method` for which `pred` holds,
    /// keeping everything else in the backlog.
    pub fn wait_notification(&mut self, method: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let is_it =
            |m: &Value| m.get("method").and_then(Value::as_str) == Some(method) && m.get("id").is_none() && pred(m);
        if let Some(pos) = self.backlog.iter().position(is_it) {
            return self.backlog.remove(pos).unwrap();
        }
        let deadline = Instant::now() + SAFETY;
        loop {
            let m = self.recv_before(deadline);
            if is_it(&m) {
                return m;
            }
            self.backlog.push_back(m);
        }
    }

    /// The notifications with `method` received so far that are still in
    /// the backlog (reading whatever has arrived first).
    pub fn notifications_in_backlog(&mut self, method: &str) -> Vec<Value> {
        while let Ok(line) = self.lines.try_recv() {
            if let Ok(v) = serde_json::from_str(&line) {
                self.backlog.push_back(v);
            }
        }
        self.backlog
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some(method) && m.get("id").is_none())
            .cloned()
            .collect()
    }

    /// The requests with `method` the server has sent so far that are still
    /// in the backlog (not taken by [`Mcp::wait_server_request`]).
    pub fn server_requests_in_backlog(&self, method: &str) -> Vec<Value> {
        self.backlog
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some(method) && m.get("id").is_some())
            .cloned()
            .collect()
    }

    /// Answer a request the server sent to the client.
    pub fn respond(&mut self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
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
        wait_until(&format!("a {role} worker appears"), || self.worker_pid(role))
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

/// The per-request `_meta` of a modern client declaring `capabilities`
/// (e.g. `{"elicitation": {}}`).
pub fn modern_meta_with(capabilities: Value) -> Value {
    let mut meta = modern_meta();
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    meta
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
/// What a write-mode interoperability run (`who`, `sessions` sessions, of
/// which `completed` finished an input round) must have done to SnowLuma
/// and the download directory `dir`: each write, download and slow call
/// exactly once per session, the completed write with its merged params, the
/// cancelled call's connection closed, and exactly the downloaded files,
/// complete.
pub fn assert_interop_write_run(fake: &Fake, who: &str, sessions: usize, completed: usize, dir: &std::path::Path) {
    let n = sessions;
    let actions: Vec<String> = fake.fake.requests().into_iter().filter_map(|r| r.action).collect();
    let count = |name: &str| actions.iter().filter(|a| *a == name).count();
    // The completed write: group_id from the call, message from the answer.
    let merged = json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}});
    let sends: Vec<Value> = fake
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.action.as_deref() == Some("send_group_msg"))
        .map(|r| r.json().unwrap_or(Value::Null))
        .collect();
    assert_eq!(
        sends.iter().filter(|b| **b == merged).count(),
        completed,
        "{who}: the completed write went out exactly once per session, with the merged params: {sends:?}"
    );
    assert_eq!(
        count("send_group_msg"),
        n + completed,
        "{who}: each write went out exactly once per session: {actions:?}"
    );
    assert_eq!(count("download_file_stream"), n, "{who}: one download per session: {actions:?}");
    assert_eq!(count("get_group_list"), n, "{who}: the slow call went out once per session: {actions:?}");
    // The cancelled call's request was abandoned: its connection closed.
    let closed = fake.rt.block_on(fake.fake.wait_closed_while_pending("get_group_list", Duration::from_secs(30)));
    assert!(closed, "{who}: cancelling the slow call closes its connection to SnowLuma");
    let files: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(files.len(), n, "{who}: exactly the downloaded files, no partial file: {files:?}");
    let expect: Vec<u8> = (0..snowluma_fake::INTEROP_FILE_BYTES).map(|i| (i % 251) as u8).collect();
    for f in &files {
        let bytes = std::fs::read(dir.join(f)).unwrap();
        assert!(bytes == expect, "{who}: the downloaded file is complete and exact");
    }
}

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

    /// Start a fake event WebSocket (on this fake's runtime) whose bootstrap
    /// frames carry `self_id`.
    pub fn start_events(&self, token: Option<&str>, self_id: i64) -> snowluma_fake::FakeEvents {
        self.rt.block_on(snowluma_fake::FakeEvents::start(token.map(str::to_owned), self_id)).unwrap()
    }
}

/// CPU time (user + system) of a process and all its live descendants
/// (the spawner and the workers), in seconds.
pub fn process_tree_cpu_secs(pid: u32) -> f64 {
    process_tree_cpu_by_name(pid).iter().map(|(_, s)| s).sum()
}

/// CPU seconds (user + system) of every process in the tree rooted at
/// `pid`, by process name, summed per name ([`procfs::cpu_secs`]).
pub fn process_tree_cpu_by_name(pid: u32) -> Vec<(String, f64)> {
    let mut by_name: Vec<(String, f64)> = Vec::new();
    let pid = pid as i32;
    for p in std::iter::once(pid).chain(descendants(pid)) {
        let (Some(name), Some(secs)) = (procfs::name(p), procfs::cpu_secs(p)) else { continue };
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => *s += secs,
            None => by_name.push((name, secs)),
        }
    }
    by_name
}

impl Fake {
    /// The fake the Node transcripts were recorded against
    /// (`tests/golden/node/`; [`snowluma_fake::FakeSnowLuma::golden_preset`]).
    pub fn start_golden(token: Option<&str>) -> Fake {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let fake = rt.block_on(snowluma_fake::FakeSnowLuma::golden(token)).unwrap();
        Fake { fake, rt }
    }

    /// Arm the transcripts' one-shot fault `mode` for `action`.
    pub fn arm_golden_fault(&self, action: &str, mode: &str) {
        self.fake.arm_fault_named(action, mode).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Clear every armed fault.
    pub fn reset_golden_faults(&self) {
        self.fake.reset_faults();
    }
}
