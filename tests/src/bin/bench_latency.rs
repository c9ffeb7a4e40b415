//! Benchmark (not a test): per-call latency of `query_action get_status`
//! through the binary against the fake SnowLuma on loopback, next to a
//! direct HTTP call to the same fake and to a relay floor (the same request
//! through two do-nothing processes chained like the server's) in the same
//! run, with the CPU each process uses per call (the sequential calls and
//! the calls kept 8 in flight, apart). Two more floors on the same chain:
//! the reactor floor (its processes on tokio) and the work floor (those
//! doing only the work the server's answer needs, [`work`]).
//!
//! `cargo run --release -p snowluma-e2e --bin bench-latency [-- N]`; prefix
//! `taskset -c 0` to run everything on one CPU. `BENCH_TOOL` (`ping`,
//! `get_runtime_info`, `list_categories`) or `BENCH_LINE` (a request line,
//! `{id}` replaced) measure other requests (the work floor then does not
//! run: it does `query_action get_status`'s work); `BENCH_NO_RELAY=1` skips
//! the floors; `SNOWLUMA_MCP_LOG`, when set, is passed on to the server (its
//! default level otherwise); `BENCH_STDERR=pipe` gives the server a stderr
//! pipe that is read (`/dev/null` otherwise); `BENCH_GAP_US=G` sleeps `G` µs
//! before each timed call of every path, so that each starts on a quiet
//! machine after an idle spell, as an agent's calls do (back to back
//! otherwise); `BENCH_BLOCK=B` times each path's calls in runs of `B` (the
//! paths take turns call by call otherwise; `B` must divide `N`);
//! `BENCH_SHUFFLE=1` draws the paths' order afresh for each turn (direct,
//! relay, reactor, work, ours otherwise); `BENCH_QUIET_FLOORS=1` gives the
//! reactor and work floors the server's socket halves, woken for input only
//! (see [`socket_halves`]); `BENCH_DECILES=1` prints each path's deciles too (the spread behind the
//! medians); `BENCH_SEQUENTIAL_ONLY=1` leaves out the calls kept 8 in flight
//! (`scripts/code-per-call` counts the sequential calls' code with it). The floors' stages are named `relay-a`/`relay-b`,
//! `reactor-a`/`reactor-b` and `work-a`/`work-b`, each one's CPU shown apart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use serde_json::json;
use snowluma_e2e::Fake;

#[path = "bench_latency/work.rs"]
mod work;

/// The body of the `get_status` request every path sends.
const BODY: &[u8] = br#"{"action":"get_status","params":{}}"#;

/// The head of that request.
fn head(host: &str) -> String {
    format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    )
}

/// The value of a `Content-Length` header line, if it is one.
fn content_length(line: &str) -> Option<usize> {
    line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
}

fn direct_call(conn: &mut BufReader<TcpStream>, host: &str) -> Vec<u8> {
    let s = conn.get_mut();
    s.write_all(head(host).as_bytes()).unwrap();
    s.write_all(BODY).unwrap();
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        len = content_length(&line).unwrap_or(len);
    }
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf).unwrap();
    assert!(buf.starts_with(b"{"));
    buf
}

/// The relay floor: a do-nothing process chain of the same shape as the
/// server's, over the same kinds of descriptor (client → stdio pipes →
/// process A → Unix stream socketpair → process B → HTTP), with blocking
/// I/O and no parsing. The client sends it the server's own request line,
/// which A hands to B as it is. Its cost over a direct call is what any
/// two-process design pays on this host for the extra wake-ups and copies;
/// what snowluma-mcp adds beyond it is its own work.
fn relay(args: &[String]) {
    // Each stage under a name of its own, so that its CPU is shown apart.
    let name = match args.first().map(String::as_str) {
        Some("--relay-chain") => c"relay-a",
        Some("--relay-http") => c"relay-b",
        Some("--relay-reactor-chain") => c"reactor-a",
        Some("--relay-reactor-http") => c"reactor-b",
        Some("--relay-work-chain") => c"work-a",
        Some("--relay-work-http") => c"work-b",
        _ => panic!("unknown relay mode"),
    };
    nix::sys::prctl::set_name(name).unwrap();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    match args {
        [mode, host] if mode == "--relay-http" => {
            let mut conn = BufReader::new(TcpStream::connect(host).unwrap());
            conn.get_ref().set_nodelay(true).unwrap();
            while input.read_until(b'\n', &mut line).unwrap() > 0 {
                let mut body = direct_call(&mut conn, host);
                body.push(b'\n');
                out.write_all(&body).unwrap();
                out.flush().unwrap();
                line.clear();
            }
        }
        [mode, host] if mode == "--relay-chain" => {
            let (mut next, socket) = spawn_stage("--relay-http", host);
            let mut to_next = socket.try_clone().unwrap();
            let mut from_next = BufReader::new(socket);
            let mut reply = Vec::new();
            while input.read_until(b'\n', &mut line).unwrap() > 0 {
                to_next.write_all(&line).unwrap();
                reply.clear();
                from_next.read_until(b'\n', &mut reply).unwrap();
                out.write_all(&reply).unwrap();
                out.flush().unwrap();
                line.clear();
            }
            to_next.shutdown(std::net::Shutdown::Write).unwrap();
            let _ = next.wait();
        }
        [mode, host] if mode.starts_with("--relay-reactor") => reactor_relay(mode == "--relay-reactor-chain", host),
        [mode, host] if mode.starts_with("--relay-work") => work::relay(mode == "--relay-work-chain", host),
        _ => panic!("unknown relay mode"),
    }
}

/// The reactor floor: the same do-nothing chain, but each process drives
/// its descriptors as an rmcp server must, from a single-threaded tokio
/// runtime (non-blocking I/O, `epoll_wait` before each read), still with no
/// parsing beyond finding the end of a line or of an HTTP response. What
/// snowluma-mcp adds beyond this floor is its own work, not the runtime's.
fn reactor_relay(first_stage: bool, host: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut line = Vec::new();
        if first_stage {
            let FirstStage { mut input, mut out, mut next, mut from_next, mut to_next } =
                FirstStage::start("--relay-reactor-http", host);
            let mut reply = Vec::new();
            while input.read_until(b'\n', &mut line).await.unwrap() > 0 {
                to_next.write_all(&line).await.unwrap();
                reply.clear();
                from_next.read_until(b'\n', &mut reply).await.unwrap();
                out.write_all(&reply).await.unwrap();
                line.clear();
            }
            // Both halves closed, so that the second stage sees the end.
            drop((from_next, to_next));
            let _ = next.wait();
        } else {
            let SecondStage { mut input, mut out, mut conn } = SecondStage::start(host).await;
            let request = [head(host).as_bytes(), BODY].concat();
            let mut header = String::new();
            while input.read_until(b'\n', &mut line).await.unwrap() > 0 {
                conn.get_mut().write_all(&request).await.unwrap();
                let len = read_head(&mut conn, &mut header).await;
                let mut reply = vec![0u8; len + 1];
                conn.read_exact(&mut reply[..len]).await.unwrap();
                reply[len] = b'\n';
                out.write_all(&reply).await.unwrap();
                line.clear();
            }
        }
    });
}

/// A tokio floor's first stage: the client's pipes (ours, so safe to make
/// non-blocking) and the socket to its second stage, started in `mode`.
struct FirstStage {
    input: tokio::io::BufReader<tokio::net::unix::pipe::Receiver>,
    out: tokio::net::unix::pipe::Sender,
    next: std::process::Child,
    from_next: tokio::io::BufReader<StageReader>,
    to_next: StageWriter,
}

impl FirstStage {
    /// Inside the stage's runtime.
    fn start(mode: &str, host: &str) -> FirstStage {
        use tokio::net::unix::pipe;
        let stdin =
            pipe::Receiver::from_file(std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned().unwrap()))
                .unwrap();
        let out = pipe::Sender::from_file(std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().unwrap()))
            .unwrap();
        let (next, socket) = spawn_stage(mode, host);
        let (from_next, to_next) = socket_halves(socket);
        FirstStage {
            input: tokio::io::BufReader::new(stdin),
            out,
            next,
            from_next: tokio::io::BufReader::new(from_next),
            to_next,
        }
    }
}

/// A tokio floor's second stage: the socket from the first (its
/// descriptors 0 and 1) and a keep-alive connection to the fake.
struct SecondStage {
    input: tokio::io::BufReader<StageReader>,
    out: StageWriter,
    conn: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl SecondStage {
    async fn start(host: &str) -> SecondStage {
        let socket = std::os::unix::net::UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned().unwrap());
        let (input, out) = socket_halves(socket);
        let conn = tokio::net::TcpStream::connect(host).await.unwrap();
        conn.set_nodelay(true).unwrap();
        SecondStage { input: tokio::io::BufReader::new(input), out, conn: tokio::io::BufReader::new(conn) }
    }
}

/// The receiving half of the socket between a tokio floor's stages.
type StageReader = Box<dyn tokio::io::AsyncRead + Unpin>;
/// Its sending half.
type StageWriter = Box<dyn tokio::io::AsyncWrite + Unpin>;

/// The halves of the socket between a tokio floor's stages (inside the
/// stage's runtime): a tokio `UnixStream`'s, registered for input and
/// write space, so that a stage is woken when its peer reads what it sent,
/// as any process reading and writing a Unix stream socket is; or, with
/// BENCH_QUIET_FLOORS set, the server's own (`snowluma_proto::sockio`),
/// registered for input only.
fn socket_halves(socket: std::os::unix::net::UnixStream) -> (StageReader, StageWriter) {
    if std::env::var_os("BENCH_QUIET_FLOORS").is_some() {
        let (read, write) = snowluma_proto::sockio::split_one(socket.into()).unwrap();
        return (Box::new(read), Box::new(write));
    }
    socket.set_nonblocking(true).unwrap();
    let (read, write) = tokio::net::UnixStream::from_std(socket).unwrap().into_split();
    (Box::new(read), Box::new(write))
}

/// Read a response head from `conn` (into `header`, a line at a time); the
/// body's length.
async fn read_head(conn: &mut tokio::io::BufReader<tokio::net::TcpStream>, header: &mut String) -> usize {
    use tokio::io::AsyncBufReadExt;
    let mut len = 0usize;
    loop {
        header.clear();
        conn.read_line(header).await.unwrap();
        if header == "\r\n" {
            return len;
        }
        len = content_length(header).unwrap_or(len);
    }
}

/// A relay chain (this benchmark again, as its first stage) and the pipes
/// to it.
struct Relay {
    child: std::process::Child,
    to: Option<std::process::ChildStdin>,
    from: BufReader<std::process::ChildStdout>,
    line: Vec<u8>,
}

impl Relay {
    fn start(mode: &str, host: &str) -> Relay {
        let mut child = spawn_self(&[mode, host]);
        let to = child.stdin.take();
        let from = BufReader::new(child.stdout.take().unwrap());
        Relay { child, to, from, line: Vec::new() }
    }

    /// One round trip of `request` (a line).
    fn call(&mut self, request: &[u8]) {
        self.to.as_mut().unwrap().write_all(request).unwrap();
        self.line.clear();
        self.from.read_until(b'\n', &mut self.line).unwrap();
        assert!(self.line.starts_with(b"{"));
    }

    /// The CPU its processes have used so far, by name.
    fn cpu(&self) -> Vec<(String, f64)> {
        snowluma_e2e::process_tree_cpu_by_name(self.child.id())
    }

    /// End the chain; the CPU its processes used, by name.
    fn finish(mut self) -> Vec<(String, f64)> {
        let cpu = self.cpu();
        drop(self.to.take());
        let _ = self.child.wait();
        cpu
    }
}

/// This benchmark again, as one relay stage, on piped stdin/stdout.
fn spawn_self(args: &[&str]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// This benchmark again, as the second relay stage, with one end of a Unix
/// stream socketpair as its descriptors 0 and 1 (as the server's network
/// executor has its IPC socket); the other end is returned.
fn spawn_stage(mode: &str, host: &str) -> (std::process::Child, std::os::unix::net::UnixStream) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let out = theirs.try_clone().unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([mode, host])
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(out)))
        .spawn()
        .unwrap();
    (child, ours)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a.starts_with("--relay")) {
        return relay(&args);
    }
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let host = fake.fake.addr().to_string();

    // Direct HTTP: one keep-alive connection. The sequential phase below
    // alternates a direct call, a relay-floor call and a call through the
    // binary, so all three see the same machine noise (this VM is noisy).
    let mut conn = BufReader::new(TcpStream::connect(&host).unwrap());
    conn.get_ref().set_nodelay(true).unwrap();
    for _ in 0..200 {
        direct_call(&mut conn, &host);
    }

    let mut relay = Relay::start("--relay-chain", &host);
    let mut reactor = Relay::start("--relay-reactor-chain", &host);
    // The work floor does the work of `query_action get_status` only.
    let with_relay = std::env::var_os("BENCH_NO_RELAY").is_none();
    let with_work = with_relay
        && std::env::var_os("BENCH_LINE").is_none()
        && !std::env::var("BENCH_TOOL").is_ok_and(|t| t != "query_action");
    let mut work = with_work.then(|| Relay::start("--relay-work-chain", &host));

    // Through the binary: a lean client that reads the child's stdout on
    // this thread, so the numbers measure the server, not a test harness.
    let mut server = std::process::Command::new(snowluma_e2e::bin_path());
    server.env_clear().env("SNOWLUMA_MCP_ENDPOINT", &url).env("SNOWLUMA_MCP_TOKEN", "t");
    // The default log level unless told: every call writes its diagnostic
    // line, as in production (to /dev/null here, like a client that
    // discards stderr; with BENCH_STDERR=pipe, to a pipe this process
    // reads on a thread of its own, like a host that keeps the log).
    if let Some(level) = std::env::var_os("SNOWLUMA_MCP_LOG") {
        server.env("SNOWLUMA_MCP_LOG", level);
    }
    let read_stderr = std::env::var("BENCH_STDERR").is_ok_and(|v| v == "pipe");
    let mut child = server
        .stderr(if read_stderr { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(mut err) = child.stderr.take() {
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    }
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let send = |stdin: &mut std::process::ChildStdin, v: &serde_json::Value| {
        let mut b = serde_json::to_vec(v).unwrap();
        b.push(b'\n');
        stdin.write_all(&b).unwrap();
    };
    send(
        &mut stdin,
        &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}),
    );
    stdout.read_line(&mut line).unwrap();
    send(&mut stdin, &json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    let call_line = |id: u64| {
        let tool = std::env::var("BENCH_TOOL").unwrap_or_else(|_| "query_action".into());
        let mut b = if let Ok(t) = std::env::var("BENCH_LINE") {
            t.replace("{id}", &id.to_string()).into_bytes()
        } else if tool == "ping" {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#).into_bytes()
        } else if tool == "query_action" {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"query_action","arguments":{{"action":"get_status"}}}}}}"#).into_bytes()
        } else {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
            )
            .into_bytes()
        };
        b.push(b'\n');
        b
    };
    let mut id = 0u64;
    let mut one =
        |stdin: &mut std::process::ChildStdin, stdout: &mut BufReader<std::process::ChildStdout>, line: &mut String| {
            id += 1;
            stdin.write_all(&call_line(id)).unwrap();
            line.clear();
            stdout.read_line(line).unwrap();
            assert!(
                line.contains("\"outcome\":\"success\"")
                    || line.contains("\"result\":{}")
                    || std::env::var("BENCH_LINE").is_ok(),
                "{line}"
            );
        };
    for i in 0..200 {
        one(&mut stdin, &mut stdout, &mut line);
        relay.call(&call_line(0));
        reactor.call(&call_line(0));
        if let Some(work) = &mut work {
            work.call(&call_line(i + 1));
            // The work floor's answer is ours, byte for byte, but for the
            // trace id.
            assert_eq!(without_trace_id(&work.line), without_trace_id(line.as_bytes()), "the work floor's answer");
        }
    }
    // The CPU per call is counted from here: start-up and the warm-up are
    // left out, for the floors and for us alike.
    let warm = (
        relay.cpu(),
        reactor.cpu(),
        snowluma_e2e::process_tree_cpu_by_name(child.id()),
        work.as_ref().map(Relay::cpu).unwrap_or_default(),
    );
    let mut direct: Vec<Duration> = Vec::with_capacity(n);
    let mut mcp: Vec<Duration> = Vec::with_capacity(n);
    let mut floor: Vec<Duration> = Vec::with_capacity(n);
    let mut reactor_floor: Vec<Duration> = Vec::with_capacity(n);
    let mut work_floor: Vec<Duration> = Vec::with_capacity(n);
    // Back to back, what a process leaves to do after its answer (the
    // server's diagnostic line) runs during the next path's call; with a
    // gap, no call pays for another's, and each starts with caches the idle
    // spell has cooled.
    let gap = Duration::from_micros(
        std::env::var("BENCH_GAP_US").map_or(0, |g| g.parse().expect("BENCH_GAP_US: a whole number of µs")),
    );
    // One timed call of a path, after the idle spell BENCH_GAP_US asks for.
    let timed = |into: &mut Vec<Duration>, call: &mut dyn FnMut()| {
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        let t = Instant::now();
        call();
        into.push(t.elapsed());
    };
    // Each path's calls come in runs of `block` (1 unless BENCH_BLOCK says
    // otherwise): with 1 the paths take turns call by call; with more, each
    // path's calls follow its own, so the fake and the scheduler are left
    // as that path left them rather than as the path before it did. The
    // paths take their turns in a fixed order (direct, relay, reactor, work,
    // ours) unless BENCH_SHUFFLE is set: then each round draws its order, so
    // that every path follows every other equally often.
    let block: usize =
        std::env::var("BENCH_BLOCK").map_or(1, |b| b.parse().expect("BENCH_BLOCK: a whole number of calls"));
    assert!(block > 0 && n.is_multiple_of(block), "BENCH_BLOCK must divide the number of calls");
    let shuffle = std::env::var_os("BENCH_SHUFFLE").is_some();
    let mut order = [Path::Direct, Path::Relay, Path::Reactor, Path::Work, Path::Ours];
    let mut draw = Xorshift(0x2545_f491_4f6c_dd1d);
    for _ in 0..n / block {
        if shuffle {
            for i in (1..order.len()).rev() {
                order.swap(i, (draw.next() % (i as u64 + 1)) as usize);
            }
        }
        for path in order {
            for _ in 0..block {
                match path {
                    Path::Direct => timed(&mut direct, &mut || drop(direct_call(&mut conn, &host))),
                    Path::Relay if with_relay => timed(&mut floor, &mut || relay.call(&call_line(0))),
                    Path::Reactor if with_relay => timed(&mut reactor_floor, &mut || reactor.call(&call_line(0))),
                    Path::Work => {
                        if let Some(work) = &mut work {
                            timed(&mut work_floor, &mut || work.call(&call_line(0)));
                        }
                    }
                    Path::Ours => timed(&mut mcp, &mut || one(&mut stdin, &mut stdout, &mut line)),
                    Path::Relay | Path::Reactor => {}
                }
            }
        }
    }
    direct.sort();
    mcp.sort();
    floor.sort();
    reactor_floor.sort();
    work_floor.sort();
    let relay_cpu = since(&relay.finish(), &warm.0);
    let reactor_cpu = since(&reactor.finish(), &warm.1);
    let work_cpu = work.map(|w| since(&w.finish(), &warm.3)).unwrap_or_default();
    // Our CPU over the same calls as the floors' (the sequential round):
    // the calls with 8 in flight share wake-ups and warm caches, so they
    // are counted apart.
    let after_sequential = snowluma_e2e::process_tree_cpu_by_name(child.id());
    let sequential_cpu = since(&after_sequential, &warm.2);

    // Throughput with 8 concurrent callers: 8 requests kept in flight on the
    // one stdio session, against 8 direct keep-alive connections (none with
    // BENCH_SEQUENTIAL_ONLY: its throughputs print as 0).
    let total = if std::env::var_os("BENCH_SEQUENTIAL_ONLY").is_some() { 0 } else { n * 2 };
    let t = Instant::now();
    let mut sent = 0usize;
    let mut done = 0usize;
    let mut next_id = 1_000_000u64;
    while done < total {
        while sent - done < 8 && sent < total {
            next_id += 1;
            stdin.write_all(&call_line(next_id)).unwrap();
            sent += 1;
        }
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert!(
            line.contains("\"outcome\":\"success\"")
                || line.contains("\"result\":{}")
                || std::env::var("BENCH_LINE").is_ok(),
            "{line}"
        );
        done += 1;
    }
    let mcp_tput = total as f64 / t.elapsed().as_secs_f64();
    let in_flight_cpu = since(&snowluma_e2e::process_tree_cpu_by_name(child.id()), &after_sequential);
    drop(stdin);
    let _ = child.wait();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let host = host.clone();
            scope.spawn(move || {
                let mut c = BufReader::new(TcpStream::connect(&host).unwrap());
                c.get_ref().set_nodelay(true).unwrap();
                for _ in 0..total / 8 {
                    direct_call(&mut c, &host);
                }
            });
        }
    });
    let direct_tput = total as f64 / t.elapsed().as_secs_f64();

    let spacing = if gap.is_zero() { "back to back".to_string() } else { format!("{} µs apart", gap.as_micros()) };
    let turns = match (block, shuffle) {
        (1, false) => "the paths in turn call by call".to_string(),
        (1, true) => "the paths in turn call by call, shuffled".to_string(),
        (b, false) => format!("the paths in turns of {b} calls"),
        (b, true) => format!("the paths in turns of {b} calls, shuffled"),
    };
    let quiet_floors = if std::env::var_os("BENCH_QUIET_FLOORS").is_some() { ", quiet floors" } else { "" };
    println!(
        "query_action get_status, {n} sequential calls ({spacing}; {turns}{quiet_floors}), loopback fake SnowLuma"
    );
    println!();
    println!("| path | p50 µs | p99 µs | throughput, 8 concurrent (calls/s) |");
    println!("|---|---|---|---|");
    println!("| direct HTTP | {} | {} | {:.0} |", us(pct(&direct, 0.5)), us(pct(&direct, 0.99)), direct_tput);
    if floor.is_empty() {
        floor.push(Duration::ZERO);
        reactor_floor.push(Duration::ZERO);
    }
    println!("| relay floor (two do-nothing processes) | {} | {} | |", us(pct(&floor, 0.5)), us(pct(&floor, 0.99)));
    println!(
        "| reactor floor (the same on tokio, non-blocking) | {} | {} | |",
        us(pct(&reactor_floor, 0.5)),
        us(pct(&reactor_floor, 0.99))
    );
    if !work_floor.is_empty() {
        println!(
            "| work floor (the same, doing only the work our answer needs) | {} | {} | |",
            us(pct(&work_floor, 0.5)),
            us(pct(&work_floor, 0.99))
        );
    }
    println!("| through snowluma-mcp | {} | {} | {:.0} |", us(pct(&mcp, 0.5)), us(pct(&mcp, 0.99)), mcp_tput);
    if std::env::var_os("BENCH_DECILES").is_some() {
        for (name, v) in
            [("direct", &direct), ("relay", &floor), ("reactor", &reactor_floor), ("work", &work_floor), ("ours", &mcp)]
        {
            if v.is_empty() {
                continue;
            }
            let d: Vec<String> = (1..10).map(|i| us(pct(v, i as f64 / 10.0))).collect();
            println!("deciles {name}: {}", d.join(" "));
        }
    }
    println!();
    println!("added at p50: {} µs", us(pct(&mcp, 0.5).saturating_sub(pct(&direct, 0.5))));
    println!("relay floor at p50: {} µs over direct", us(pct(&floor, 0.5).saturating_sub(pct(&direct, 0.5))));
    println!("added over the relay floor at p50: {} µs", us(pct(&mcp, 0.5).saturating_sub(pct(&floor, 0.5))));
    println!("reactor floor at p50: {} µs over direct", us(pct(&reactor_floor, 0.5).saturating_sub(pct(&direct, 0.5))));
    println!("added over the reactor floor at p50: {} µs", us(pct(&mcp, 0.5).saturating_sub(pct(&reactor_floor, 0.5))));
    if !work_floor.is_empty() {
        println!("work floor at p50: {} µs over direct", us(pct(&work_floor, 0.5).saturating_sub(pct(&direct, 0.5))));
        println!("added over the work floor at p50: {} µs", us(pct(&mcp, 0.5).saturating_sub(pct(&work_floor, 0.5))));
    }
    let tree = |cpu: &[(String, f64)]| cpu.iter().map(|(_, s)| s).sum::<f64>();
    println!("CPU per sequential call, snowluma-mcp process tree: {:.1} µs", tree(&sequential_cpu) * 1e6 / n as f64);
    // A floor's CPU per call, its two processes' together and each apart.
    let floor_cpu = |label: &str, cpu: &[(String, f64)]| {
        let per_call = |secs: f64| secs * 1e6 / n as f64;
        let stages: Vec<String> = cpu.iter().map(|(name, secs)| format!("{name} {:.1}", per_call(*secs))).collect();
        println!("  {label}: {:.1} µs ({})", per_call(tree(cpu)), stages.join(", "));
    };
    if with_relay {
        floor_cpu("relay floor", &relay_cpu);
        floor_cpu("reactor floor", &reactor_cpu);
        if with_work {
            floor_cpu("work floor", &work_cpu);
        }
    }
    for (name, secs) in &sequential_cpu {
        println!("  {name}: {:.1} µs", secs * 1e6 / n as f64);
    }
    if total == 0 {
        return;
    }
    println!(
        "CPU per call with 8 in flight, snowluma-mcp process tree: {:.1} µs",
        tree(&in_flight_cpu) * 1e6 / total as f64
    );
    for (name, secs) in &in_flight_cpu {
        println!("  {name}: {:.1} µs", secs * 1e6 / total as f64);
    }
}

/// The paths of the sequential phase, in their turns.
#[derive(Clone, Copy)]
enum Path {
    Direct,
    Relay,
    Reactor,
    Work,
    Ours,
}

/// A xorshift generator: the shuffled order of the paths, and the work
/// floor's trace ids.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// An answer line with its trace id (`"traceparent":"00-…-01"`) blanked.
fn without_trace_id(line: &[u8]) -> Vec<u8> {
    const KEY: &[u8] = br#""traceparent":"00-"#;
    let mut out = line.to_vec();
    if let Some(at) = line.windows(KEY.len()).position(|w| w == KEY) {
        let start = at + KEY.len();
        let end = start + line[start..].iter().position(|b| *b == b'"').unwrap_or(0);
        out.splice(start..end, std::iter::empty());
    }
    out
}

/// The CPU used between two readings, by name (a process that was not
/// there before counts from zero).
fn since(now: &[(String, f64)], before: &[(String, f64)]) -> Vec<(String, f64)> {
    now.iter()
        .map(|(name, secs)| {
            let was = before.iter().find(|(n, _)| n == name).map_or(0.0, |(_, s)| *s);
            (name.clone(), secs - was)
        })
        .collect()
}
