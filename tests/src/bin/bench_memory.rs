//! Benchmark (not a test): the memory of the whole process tree of the
//! release binary after 200 calls, as PSS (proportional set size: a page
//! shared by k processes counts 1/k in each, so the tree's sum counts every
//! page once), per process and in all, in docs mode (documentation calls
//! only) and read mode (half of them `query_action get_status` against the
//! fake SnowLuma on loopback).
//!
//! `cargo run --release -p snowluma-e2e --bin bench-memory [-- RUNS]`
//! (default 3 runs of each mode).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use snowluma_e2e::Fake;

const NAMES: [&str; 8] = [
    "send_group_msg",
    "get_status",
    "get_group_list",
    "set_group_ban",
    "get_msg",
    "upload_file_stream",
    "get_group_member_info",
    "send_private_msg",
];

/// The i-th call of a run: in read mode every other one executes.
fn call(i: usize, read: bool) -> String {
    let (tool, args) = match i % 4 {
        _ if read && i.is_multiple_of(2) => ("query_action", r#"{"action":"get_status"}"#.to_owned()),
        1 => ("get_action", format!(r#"{{"name":"{}"}}"#, NAMES[i / 4 % NAMES.len()])),
        3 => ("search_actions", r#"{"query":"群 成员","match":"keywords"}"#.to_owned()),
        0 => ("list_actions", r#"{"category":"群管理"}"#.to_owned()),
        _ => ("list_categories", "{}".to_owned()),
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#,
        i + 10
    )
}

/// One run: (process name, PSS, anon, file) per process, in KiB.
fn run(mut cmd: Command, read: bool) -> Vec<(String, u64, u64, u64)> {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |stdin: &mut std::process::ChildStdin, text: &str| {
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("\"result\""), "{line}");
        assert!(!line.contains("\"isError\":true"), "{line}");
    };
    ask(
        &mut stdin,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#,
    );
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").unwrap();
    ask(&mut stdin, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    for i in 0..200 {
        ask(&mut stdin, &call(i, read));
    }
    let pid = child.id() as i32;
    let mut out: Vec<(String, u64, u64, u64)> =
        std::iter::once(pid).chain(snowluma_e2e::descendants(pid)).filter_map(snowluma_e2e::pss_kib).collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.1));
    drop(stdin);
    child.wait().unwrap();
    out
}

fn mib(kib: u64) -> String {
    format!("{:.2}", kib as f64 / 1024.0)
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let bin = snowluma_e2e::bin_path();
    println!("PSS of the process tree after 200 calls, {} ({runs} runs per mode)", bin.display());
    println!();
    println!("| mode | run | whole tree MiB | per process: PSS MiB (anon + file) |");
    println!("|---|---|---|---|");
    for mode in ["docs", "read"] {
        for r in 1..=runs {
            let mut cmd = Command::new(&bin);
            cmd.env_clear();
            if mode == "read" {
                cmd.env("SNOWLUMA_MCP_ENDPOINT", &url).env("SNOWLUMA_MCP_TOKEN", "t");
            }
            let procs = run(cmd, mode == "read");
            let total: u64 = procs.iter().map(|p| p.1).sum();
            let each: Vec<String> = procs
                .iter()
                .map(|(name, pss, anon, file)| format!("{name} {} ({} + {})", mib(*pss), mib(*anon), mib(*file)))
                .collect();
            println!("| {mode} | {r} | {} | {} |", mib(total), each.join(", "));
        }
    }
}
