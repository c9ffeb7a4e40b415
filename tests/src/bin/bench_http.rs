//! Benchmark (not a test): what one `serve-http` session costs. The release
//! binary's `serve-http` (loopback, read mode against the fake SnowLuma)
//! gets SESSIONS legacy sessions, one after another, each opened with
//! `initialize` + `notifications/initialized` and one documentation call,
//! then left idle. It prints the time from the `initialize` POST to its
//! answer (the start-up of one confined session tree behind the front),
//! the PSS of the launcher, of the front and of one session tree, and the
//! number of session trees a 1 GiB host holds at that size.
//!
//! `cargo run --release -p snowluma-e2e --bin bench-http [-- SESSIONS]`
//! (default 100).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snowluma_e2e::Fake;

const TOKEN: &str = "bench-token-0123456789abcdef0123456789";

fn pss_of(pids: &[i32]) -> u64 {
    pids.iter().filter_map(|p| snowluma_e2e::pss_kib(*p)).map(|(_, pss, _, _)| pss).sum()
}

fn mib(kib: f64) -> String {
    format!("{:.2}", kib / 1024.0)
}

fn main() {
    let sessions: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let dir = std::env::temp_dir().join(format!("bench-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("bench:{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let max = (sessions + 8).to_string();
    let mut launcher = Command::new(snowluma_e2e::bin_path())
        .args(["serve-http", "--listen", "127.0.0.1:0", "--http-token-file", tokens.to_str().unwrap()])
        .args(["--max-sessions-per-token", &max, "--max-requests-per-token", &max])
        .env_clear()
        .env("SNOWLUMA_MCP_ENDPOINT", &url)
        .env("SNOWLUMA_MCP_TOKEN", "t")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(launcher.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve-http ended before listening");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stderr (one line per session) so that the launcher never blocks on it.
    std::thread::spawn(move || for _ in stderr.lines() {});
    let endpoint = format!("http://{addr}/mcp");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = |session: Option<&str>, body: Value| {
        let mut req = client
            .post(&endpoint)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(serde_json::to_vec(&body).unwrap());
        if let Some(s) = session {
            req = req.header("mcp-session-id", s).header("mcp-protocol-version", "2025-11-25");
        }
        rt.block_on(async {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let sid = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
            let text = resp.text().await.unwrap();
            (status, sid, text)
        })
    };
    let launcher_pid = launcher.id() as i32;
    // The front is the launcher's first child; it is there before any session.
    let front =
        snowluma_e2e::wait_until("the front is started", || snowluma_e2e::children(launcher_pid).first().copied());
    std::thread::sleep(Duration::from_millis(200));
    let front_before = pss_of(&[front]);
    let mut starts = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let t = Instant::now();
        let (status, sid, text) = post(
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}),
        );
        starts.push(t.elapsed());
        assert_eq!(status, 200, "{text}");
        let sid = sid.expect("a session id");
        let (status, _, _) = post(Some(&sid), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert_eq!(status, 202);
        let (status, _, text) = post(
            Some(&sid),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_categories", "arguments": {}}}),
        );
        assert_eq!(status, 200, "{text}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let trees: Vec<Vec<i32>> = snowluma_e2e::children(launcher_pid)
        .into_iter()
        .filter(|p| *p != front)
        .map(|p| std::iter::once(p).chain(snowluma_e2e::descendants(p)).collect())
        .collect();
    assert_eq!(trees.len(), sessions, "one session tree per session");
    let mut per_tree: Vec<u64> = trees.iter().map(|t| pss_of(t)).collect();
    per_tree.sort();
    let launcher_pss = pss_of(&[launcher_pid]);
    let front_pss = pss_of(&[front]);
    let all: u64 = per_tree.iter().sum::<u64>() + launcher_pss + front_pss;
    starts.sort();
    let at = |p: f64| starts[((starts.len() as f64 - 1.0) * p).round() as usize];
    let median_tree = per_tree[per_tree.len() / 2] as f64;
    let fixed = (launcher_pss + front_pss) as f64;
    println!("serve-http, {sessions} legacy sessions (read mode, loopback fake), all idle at the end");
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| session start-up (`initialize` POST to its answer), median (p10–p90) | {:.2} ms ({:.2}–{:.2}) |",
        at(0.5).as_secs_f64() * 1e3,
        at(0.1).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3
    );
    println!(
        "| PSS of one session tree (supervisor, spawner, catalog and network workers), median (min–max) | {} MiB ({}–{}) |",
        mib(median_tree),
        mib(per_tree[0] as f64),
        mib(per_tree[per_tree.len() - 1] as f64)
    );
    println!("| PSS of the front, no session | {} MiB |", mib(front_before as f64));
    println!("| PSS of the front, {sessions} idle sessions | {} MiB |", mib(front_pss as f64));
    println!("| PSS of the launcher, {sessions} idle sessions | {} MiB |", mib(launcher_pss as f64));
    println!("| PSS of everything, {sessions} idle sessions | {} MiB |", mib(all as f64));
    println!(
        "| session trees in 1 GiB (launcher and front included) | {:.0} |",
        ((1024.0 * 1024.0) - fixed) / median_tree
    );
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher_pid), nix::sys::signal::Signal::SIGTERM);
    let _ = launcher.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
