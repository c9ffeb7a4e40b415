//! Benchmark (not a test): per-call latency of `query_action get_status`
//! through the binary against the fake SnowLuma on loopback, next to a
//! direct HTTP call to the same fake in the same run.
//!
//! `cargo run --release -p snowluma-e2e --bin bench-latency [-- N]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use snowluma_e2e::{Fake, Mcp};

fn direct_call(conn: &mut BufReader<TcpStream>, host: &str) {
    let body = br#"{"action":"get_status","params":{}}"#;
    let head = format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let s = conn.get_mut();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        conn.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf).unwrap();
    assert!(buf.starts_with(b"{"));
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let host = fake.fake.addr().to_string();

    // Direct HTTP, sequential, one keep-alive connection.
    let mut conn = BufReader::new(TcpStream::connect(&host).unwrap());
    conn.get_ref().set_nodelay(true).unwrap();
    for _ in 0..200 {
        direct_call(&mut conn, &host);
    }
    let mut direct: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            direct_call(&mut conn, &host);
            t.elapsed()
        })
        .collect();
    direct.sort();

    // Through the binary, sequential.
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_LOG", "warn"),
    ]);
    s.initialize("2025-11-25");
    let call = |s: &mut Mcp| {
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert_eq!(r["structuredContent"]["diagnostics"]["outcome"], "success");
    };
    for _ in 0..200 {
        call(&mut s);
    }
    let mut mcp: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            call(&mut s);
            t.elapsed()
        })
        .collect();
    mcp.sort();

    // Throughput with 8 concurrent callers: 8 requests kept in flight on the
    // one stdio session, against 8 direct keep-alive connections.
    let total = n * 2;
    let t = Instant::now();
    let mut next = 0usize;
    let mut inflight = std::collections::VecDeque::new();
    while next < total || !inflight.is_empty() {
        while inflight.len() < 8 && next < total {
            let id = json!(s.next_id());
            s.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"query_action","arguments":{"action":"get_status"}}}));
            inflight.push_back(id);
            next += 1;
        }
        let id = inflight.pop_front().unwrap();
        let r = s.wait_for(&id);
        assert!(r["result"]["isError"] == false);
    }
    let mcp_tput = total as f64 / t.elapsed().as_secs_f64();
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

    println!("query_action get_status, {n} sequential calls, loopback fake SnowLuma");
    println!();
    println!("| path | p50 µs | p99 µs | throughput, 8 concurrent (calls/s) |");
    println!("|---|---|---|---|");
    println!("| direct HTTP | {} | {} | {:.0} |", us(pct(&direct, 0.5)), us(pct(&direct, 0.99)), direct_tput);
    println!("| through snowluma-mcp | {} | {} | {:.0} |", us(pct(&mcp, 0.5)), us(pct(&mcp, 0.99)), mcp_tput);
    println!();
    println!("added at p50: {} µs", us(pct(&mcp, 0.5).saturating_sub(pct(&direct, 0.5))));
}
