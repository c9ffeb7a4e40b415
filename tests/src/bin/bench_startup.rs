//! Benchmark (not a test): cold start of the release binary, from just
//! before its spawn to the answers of `initialize`, `tools/list` and a first
//! documentation call (`get_action send_group_msg`), in docs mode and in
//! read mode (against the fake SnowLuma on loopback), next to a floor in
//! the same run: this benchmark exec'd again as a do-nothing server that
//! answers every line with a fixed line (the cost of exec and one pipe round
//! trip, which no server can go under).
//!
//! `cargo run --release -p snowluma-e2e --bin bench-startup [-- RUNS]`
//! (default 31 runs per path, interleaved so that all see the same noise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use snowluma_e2e::Fake;

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
const FIRST_DOC: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_action","arguments":{"name":"send_group_msg"}}}"#;

/// The floor: read lines, answer each with one fixed line, until EOF.
fn echo() {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    while input.read_until(b'\n', &mut line).unwrap() > 0 {
        if line.windows(4).any(|w| w == b"\"id\"") {
            out.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\n").unwrap();
            out.flush().unwrap();
        }
        line.clear();
    }
}

/// The three answers' times since just before the spawn.
struct Run {
    initialize: Duration,
    tools_list: Duration,
    first_doc: Duration,
}

fn run(mut cmd: Command) -> Run {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    let t = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |stdin: &mut std::process::ChildStdin, text: String| {
        stdin.write_all(text.as_bytes()).unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("\"result\""), "{line}");
        t.elapsed()
    };
    let initialize = ask(&mut stdin, format!("{INITIALIZE}\n"));
    let tools_list = ask(&mut stdin, format!("{INITIALIZED}\n{TOOLS_LIST}\n"));
    let first_doc = ask(&mut stdin, format!("{FIRST_DOC}\n"));
    drop(stdin);
    child.wait().unwrap();
    Run { initialize, tools_list, first_doc }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn summary(runs: &mut [Duration]) -> String {
    runs.sort();
    let at = |p: f64| runs[((runs.len() as f64 - 1.0) * p).round() as usize];
    format!("{} ({}–{})", ms(at(0.5)), ms(at(0.1)), ms(at(0.9)))
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--echo") {
        return echo();
    }
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(31);
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let bin = snowluma_e2e::bin_path();
    let docs = || {
        let mut c = Command::new(&bin);
        c.env_clear();
        c
    };
    let read = || {
        let mut c = Command::new(&bin);
        c.env_clear().env("SNOWLUMA_MCP_ENDPOINT", &url).env("SNOWLUMA_MCP_TOKEN", "t");
        c
    };
    let floor = || {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.env_clear().arg("--echo");
        c
    };
    let paths: [(&str, &dyn Fn() -> Command); 3] =
        [("floor (exec + one pipe round trip)", &floor), ("docs mode", &docs), ("read mode", &read)];
    // Warm the page cache and the fake.
    for (_, cmd) in &paths {
        run(cmd());
    }
    let mut times: Vec<[Vec<Duration>; 3]> = paths.iter().map(|_| [Vec::new(), Vec::new(), Vec::new()]).collect();
    for _ in 0..runs {
        for (i, (_, cmd)) in paths.iter().enumerate() {
            let r = run(cmd());
            times[i][0].push(r.initialize);
            times[i][1].push(r.tools_list);
            times[i][2].push(r.first_doc);
        }
    }
    println!("cold start of {} ({runs} runs per path, interleaved)", bin.display());
    println!();
    println!("ms from spawn, median (p10–p90):");
    println!();
    println!("| path | `initialize` answered | `tools/list` answered | first doc call answered |");
    println!("|---|---|---|---|");
    for (i, (name, _)) in paths.iter().enumerate() {
        let [a, b, c] = &mut times[i];
        println!("| {name} | {} | {} | {} |", summary(a), summary(b), summary(c));
    }
}
