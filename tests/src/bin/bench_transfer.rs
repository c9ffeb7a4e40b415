//! Benchmark (not a test): download and upload of a large file through the
//! binary, next to a plain client doing the same chunked HTTP exchanges
//! against the same fake SnowLuma in the same run.
//!
//! `cargo run --release -p snowluma-e2e --bin bench-transfer [-- MiB]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::Write;
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use snowluma_e2e::{Fake, Mcp, process_tree_cpu_secs};

const CHUNK: usize = 512 * 1024;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The plain client: what a careful program without the MCP layer would do.
async fn plain_download(client: &reqwest::Client, url: &str, out: &std::path::Path) -> u64 {
    let mut resp = client
        .post(url)
        .bearer_auth("t")
        .body(json!({"action": "download_file_stream", "params": {"file": "big.bin"}}).to_string())
        .send()
        .await
        .unwrap();
    let mut f = std::fs::File::create(out).unwrap();
    let mut h = Sha256::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut total = 0u64;
    while let Some(c) = resp.chunk().await.unwrap() {
        buf.extend_from_slice(&c);
        while let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let frame: Value = serde_json::from_slice(&buf[..pos]).unwrap();
            buf.drain(..pos + 4);
            if frame["data"]["data_type"] == "file_chunk" {
                let bytes = STANDARD.decode(frame["data"]["data"].as_str().unwrap()).unwrap();
                f.write_all(&bytes).unwrap();
                h.update(&bytes);
                total += bytes.len() as u64;
            }
        }
    }
    f.sync_all().unwrap();
    let _ = hex(&h.finalize());
    total
}

async fn plain_upload(client: &reqwest::Client, url: &str, path: &std::path::Path) {
    let data = std::fs::read(path).unwrap();
    let total = data.len().div_ceil(CHUNK).max(1);
    let mut h = Sha256::new();
    for (i, c) in data.chunks(CHUNK).enumerate() {
        h.update(c);
        let body = json!({"action": "upload_file_stream", "params": {"stream_id": "plain-bench", "chunk_data": STANDARD.encode(c), "chunk_index": i, "total_chunks": total, "file_size": data.len(), "filename": "big.bin"}});
        let text = client.post(url).bearer_auth("t").body(body.to_string()).send().await.unwrap().text().await.unwrap();
        assert!(text.contains("chunk_received"), "{text}");
    }
    let sha = hex(&h.finalize());
    let body = json!({"action": "upload_file_stream", "params": {"stream_id": "plain-bench", "total_chunks": total, "file_size": data.len(), "expected_sha256": sha, "is_complete": true, "filename": "big.bin"}});
    let text = client.post(url).bearer_auth("t").body(body.to_string()).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("file_complete"), "{text}");
}

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let size = mib * 1024 * 1024;
    let dir = std::env::temp_dir().join(format!("snowluma-bench-xfer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("up")).unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
    let input = dir.join("up/big.bin");
    std::fs::write(&input, &data).unwrap();
    let fake = Fake::start(Some("t"));
    fake.fake.add_file("big.bin", data);
    let url = fake.fake.url();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    let t = Instant::now();
    let got = fake.rt.block_on(plain_download(&client, &url, &dir.join("plain.bin")));
    assert_eq!(got as usize, size);
    let plain_dl = t.elapsed().as_secs_f64();
    let t = Instant::now();
    fake.rt.block_on(plain_upload(&client, &url, &input));
    let plain_ul = t.elapsed().as_secs_f64();

    let sd = dir.join("downloads").display().to_string();
    let ur = dir.join("up").display().to_string();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_UPLOAD_ROOT", ur.as_str()),
        ("SNOWLUMA_MCP_LOG", "warn"),
    ]);
    s.initialize("2025-11-25");
    s.call("list_categories", json!({}));
    let pid = s.child.id();
    let cpu0 = process_tree_cpu_secs(pid);
    let t = Instant::now();
    let r = s.call("invoke_action", json!({"action": "download_file_stream", "params": {"file": "big.bin"}}));
    let mcp_dl = t.elapsed().as_secs_f64();
    let cpu1 = process_tree_cpu_secs(pid);
    assert_eq!(r["structuredContent"]["result"]["file_size"], size, "{r}");
    let t = Instant::now();
    let r = s.call(
        "invoke_action",
        json!({"action": "upload_file_stream", "execution": {"input_file": input.display().to_string()}}),
    );
    let mcp_ul = t.elapsed().as_secs_f64();
    let cpu2 = process_tree_cpu_secs(pid);
    assert_eq!(r["structuredContent"]["result"]["file_size"], size, "{r}");

    let mb = size as f64 / 1e6;
    let gib = size as f64 / (1u64 << 30) as f64;
    println!("{mib} MiB file, loopback fake SnowLuma (download chunk 64 KiB, upload chunk 512 KiB)");
    println!();
    println!("| transfer | plain client MB/s | snowluma-mcp MB/s | ratio | snowluma-mcp CPU s/GiB (process tree) |");
    println!("|---|---|---|---|---|");
    println!(
        "| download | {:.1} | {:.1} | {:.0}% | {:.2} |",
        mb / plain_dl,
        mb / mcp_dl,
        100.0 * plain_dl / mcp_dl,
        (cpu1 - cpu0) / gib
    );
    println!(
        "| upload | {:.1} | {:.1} | {:.0}% | {:.2} |",
        mb / plain_ul,
        mb / mcp_ul,
        100.0 * plain_ul / mcp_ul,
        (cpu2 - cpu1) / gib
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
