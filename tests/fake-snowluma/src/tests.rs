//! Unit tests, driving the fake over real sockets with a tiny raw HTTP client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::find;
use crate::{FakeOptions, FakeSnowLuma, Fault, GoldenFault, base64, sha256};

// ------------------------------------------------------------------ raw client

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Sizes of the HTTP chunks, for chunked responses.
    chunk_sizes: Vec<usize>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Splits a Stream body on `\r\n\r\n` (the way the MCP client does).
    fn frames(&self) -> Vec<Value> {
        let text = std::str::from_utf8(&self.body).unwrap();
        assert!(text.ends_with("\r\n\r\n"), "stream body must end with a frame separator");
        text.split("\r\n\r\n").filter(|f| !f.is_empty()).map(|f| serde_json::from_str(f).unwrap()).collect()
    }
}

struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client { stream: TcpStream::connect(addr).await.unwrap(), buf: Vec::new() }
    }

    async fn fill(&mut self) -> usize {
        let mut tmp = [0u8; 8192];
        let n = self.stream.read(&mut tmp).await.unwrap_or(0);
        self.buf.extend_from_slice(&tmp[..n]);
        n
    }

    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill().await == 0 {
                return None;
            }
        }
        let rest = self.buf.split_off(n);
        Some(std::mem::replace(&mut self.buf, rest))
    }

    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.take(end + 2).await?;
                return Some(String::from_utf8(line[..end].to_vec()).unwrap());
            }
            if self.fill().await == 0 {
                return None;
            }
        }
    }

    async fn send(&mut self, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (name, value) in headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.stream.write_all(&bytes).await.unwrap();
    }

    /// Reads one response; `None` if the connection ends before it is complete.
    async fn read_response(&mut self) -> Option<Resp> {
        let status_line = self.line().await?;
        let status = status_line.split(' ').nth(1)?.parse().ok()?;
        let mut headers = Vec::new();
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            let (n, v) = line.split_once(':')?;
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Resp { status, headers, body: Vec::new(), chunk_sizes: Vec::new() };
        if resp.header("transfer-encoding") == Some("chunked") {
            loop {
                let size = usize::from_str_radix(&self.line().await?, 16).ok()?;
                if size == 0 {
                    assert_eq!(self.line().await?, "");
                    break;
                }
                resp.body.extend_from_slice(&self.take(size).await?);
                resp.chunk_sizes.push(size);
                assert_eq!(self.line().await?, "");
            }
        } else {
            let length: usize = resp.header("content-length")?.parse().ok()?;
            resp.body = self.take(length).await?;
        }
        Some(resp)
    }

    async fn request(&mut self, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        self.send(method, target, headers, body).await;
        self.read_response().await.expect("complete response")
    }

    /// Everything until the server closes.
    async fn read_to_end(&mut self) -> Vec<u8> {
        let mut all = std::mem::take(&mut self.buf);
        let _ = self.stream.read_to_end(&mut all).await;
        all
    }
}

async fn start() -> FakeSnowLuma {
    FakeSnowLuma::start(FakeOptions::default()).await.unwrap()
}

/// `POST /` with `{action, params}` on a fresh connection.
async fn call(fake: &FakeSnowLuma, action: &str, params: Value) -> Resp {
    let body = json!({"action": action, "params": params}).to_string();
    Client::connect(fake.addr())
        .await
        .request("POST", "/", &[("Content-Type", "application/json")], body.as_bytes())
        .await
}

// ------------------------------------------------------------------ base64 / sha256

#[test]
fn base64_rfc4648_vectors() {
    let vectors = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ];
    for (plain, encoded) in vectors {
        assert_eq!(base64::encode(plain.as_bytes()), encoded);
        assert_eq!(base64::decode(encoded).unwrap(), plain.as_bytes());
    }
    let all: Vec<u8> = (0..=255).collect();
    for len in 0..all.len() {
        assert_eq!(base64::decode(&base64::encode(&all[..len])).unwrap(), &all[..len]);
    }
    assert_eq!(base64::encode(&[0xfb, 0xff]), "+/8=");
}

#[test]
fn base64_rejects_non_canonical() {
    for bad in ["Zg", "Zg=", "Z===", "Zh==", "Zm9=", "Zm9v!", "=Zg=", "Zg==Zg==", "Zm 9v", "Zm9v\n"] {
        assert_eq!(base64::decode(bad), None, "{bad:?} should be rejected");
    }
}

#[test]
fn sha256_vectors() {
    let vectors: [(&[u8], &str); 4] = [
        (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (
            b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        ),
        (
            b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
        ),
    ];
    for (input, hex) in vectors {
        assert_eq!(sha256::digest_hex(input), hex);
    }
    assert_eq!(
        sha256::digest_hex(&vec![b'a'; 1_000_000]),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
}

#[test]
fn sha256_incremental_matches_one_shot() {
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    for len in [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300] {
        let one_shot = sha256::digest(&data[..len]);
        for step in [1, 3, 63, 64, 100] {
            let mut hasher = sha256::Sha256::new();
            for piece in data[..len].chunks(step) {
                hasher.update(piece);
            }
            assert_eq!(hasher.finalize(), one_shot, "len {len} step {step}");
        }
    }
}

// ------------------------------------------------------------------ envelope, routing, auth

#[tokio::test]
async fn health_and_builtin_envelopes() {
    let fake = start().await;
    assert!(fake.url().starts_with("http://127.0.0.1:"));
    assert!(fake.url().ends_with('/'));

    let mut client = Client::connect(fake.addr()).await;
    let health = client.request("GET", "/", &[], b"").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json(), json!({"status": "ok", "retcode": 0, "data": {"online": true}}));

    // Same connection (keep-alive): POST / with {action, params}.
    let body = json!({"action": "get_status", "params": {}}).to_string();
    let status = client.request("POST", "/", &[("Content-Type", "application/json")], body.as_bytes()).await;
    assert_eq!(status.status, 200);
    assert!(status.header("content-type").unwrap().starts_with("application/json"));
    assert_eq!(status.json(), json!({"status": "ok", "retcode": 0, "data": {"online": true, "good": true}}));

    // POST /<action> with the params as body, echo copied back.
    let login = client.request("POST", "/get_login_info", &[], br#"{"echo":"e1"}"#).await;
    assert_eq!(
        login.json(),
        json!({"status": "ok", "retcode": 0, "data": {"user_id": 10001, "nickname": "fake-bot"}, "echo": "e1"})
    );

    let version = call(&fake, "get_version_info", json!({})).await.json();
    assert_eq!(version["data"]["app_name"], "SnowLuma");
    assert_eq!(version["data"]["app_version"], "1.14.15");
    assert_eq!(version["data"]["protocol_version"], "v11");

    for action in ["delete_msg", "set_group_ban"] {
        assert_eq!(call(&fake, action, json!({})).await.json()["data"], Value::Null);
    }
    assert_eq!(call(&fake, "get_group_list", json!({})).await.json()["data"], json!([]));

    // Every request was recorded.
    let requests = fake.requests();
    assert_eq!(requests.len(), 7);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].action, None);
    assert_eq!(requests[1].action.as_deref(), Some("get_status"));
    assert_eq!(requests[1].header("Content-Type"), Some("application/json"));
    assert_eq!(requests[1].json().unwrap()["action"], "get_status");
    assert_eq!(requests[2].path, "/get_login_info");
    fake.clear_requests();
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn send_msg_validation() {
    let fake = start().await;
    let sent = call(&fake, "send_group_msg", json!({"group_id": 1, "message": "hi"})).await.json();
    assert_eq!(sent, json!({"status": "ok", "retcode": 0, "data": {"message_id": -123456}}));
    let sent = call(&fake, "send_private_msg", json!({"user_id": "42", "message": [{"type": "text"}]})).await;
    assert_eq!(sent.json()["data"]["message_id"], -123456);
    let sent = call(&fake, "send_msg", json!({"message_type": "group", "group_id": 5, "message": "x"})).await;
    assert_eq!(sent.json()["retcode"], 0);

    let missing = call(&fake, "send_group_msg", json!({"message": "hi"})).await;
    assert_eq!(missing.status, 200);
    assert_eq!(
        missing.json(),
        json!({"status": "failed", "retcode": 1400, "data": null, "wording": "group_id: is required"})
    );
    let no_message = call(&fake, "send_private_msg", json!({"user_id": 1})).await.json();
    assert_eq!(no_message["wording"], "message: is required");
    let bad_id = call(&fake, "send_group_msg", json!({"group_id": "abc", "message": "m"})).await.json();
    assert_eq!(bad_id["wording"], "group_id: expected an integer");
    let send_msg = call(&fake, "send_msg", json!({"message": "m"})).await.json();
    assert_eq!(send_msg["wording"], "user_id: is required");
}

#[tokio::test]
async fn routing_errors() {
    let fake = start().await;
    let unknown = call(&fake, "no_such_action", json!({})).await;
    assert_eq!(unknown.status, 200);
    assert_eq!(unknown.json(), json!({"status": "failed", "retcode": 1404, "data": null, "wording": "unknown action"}));

    let mut client = Client::connect(fake.addr()).await;
    let bad = client.request("POST", "/", &[("Content-Type", "application/json")], b"{nope").await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json(),
        json!({"status": "failed", "retcode": 1400, "data": null, "wording": "bad request: invalid json"})
    );
    let missing = client.request("POST", "/", &[("Content-Type", "application/json")], b"{\"params\":{}}").await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json()["retcode"], 1400);
    assert_eq!(missing.json()["wording"], "bad request: missing action");
    let put = client.request("PUT", "/", &[], b"").await;
    assert_eq!(put.status, 405);
    assert_eq!(put.json()["retcode"], 1400);

    // params not an object: the whole body is the params.
    let body = br#"{"action":"send_group_msg","group_id":7,"message":"m"}"#;
    let flat = client.request("POST", "/", &[("Content-Type", "application/json")], body).await;
    assert_eq!(flat.json()["data"]["message_id"], -123456);

    // Form bodies and GET /<action>?k=v, values JSON-parsed.
    let form = client
        .request(
            "POST",
            "/send_group_msg",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            b"group_id=7&message=hello+world",
        )
        .await;
    assert_eq!(form.json()["retcode"], 0);
    let get = client.request("GET", "/send_private_msg?user_id=3&message=%22hi%22", &[], b"").await;
    assert_eq!(get.json()["retcode"], 0);
}

#[tokio::test]
async fn set_response_overrides() {
    let fake = start().await;
    let envelope = json!({"status": "ok", "retcode": 0, "data": {"custom": true}});
    fake.set_response("get_custom", envelope.clone());
    assert_eq!(call(&fake, "get_custom", json!({})).await.json(), envelope);
    fake.set_response("get_status", json!({"status": "failed", "retcode": 100, "data": null}));
    assert_eq!(call(&fake, "get_status", json!({})).await.json()["retcode"], 100);
}

#[tokio::test]
async fn auth_token() {
    let fake = FakeSnowLuma::start(FakeOptions { token: Some("s3cret".into()) }).await.unwrap();
    let body = json!({"action": "get_status", "params": {}}).to_string();
    let mut client = Client::connect(fake.addr()).await;

    let denied = client.request("POST", "/", &[], body.as_bytes()).await;
    assert_eq!(denied.status, 401);
    assert_eq!(denied.json(), json!({"status": "failed", "retcode": 1401, "data": null, "wording": "unauthorized"}));
    let wrong = client.request("POST", "/", &[("Authorization", "Bearer nope")], body.as_bytes()).await;
    assert_eq!(wrong.status, 401);
    let health = client.request("GET", "/", &[], b"").await;
    assert_eq!(health.status, 401);

    let bearer = client.request("POST", "/", &[("Authorization", "Bearer s3cret")], body.as_bytes()).await;
    assert_eq!(bearer.status, 200);
    assert_eq!(bearer.json()["data"]["good"], true);
    let query = client.request("POST", "/?access_token=s3cret", &[], body.as_bytes()).await;
    assert_eq!(query.status, 200);
    assert_eq!(query.json()["retcode"], 0);

    let recorded = fake.requests();
    assert_eq!(recorded.len(), 5);
    assert_eq!(recorded[3].header("authorization"), Some("Bearer s3cret"));
    assert_eq!(recorded[4].query, "access_token=s3cret");
    assert_eq!(recorded[4].path, "/");
    assert!(recorded.iter().all(|r| r.headers.iter().all(|(n, _)| *n == n.to_ascii_lowercase())));
}

#[tokio::test]
async fn chunked_request_body_and_connection_close() {
    let fake = start().await;
    let mut client = Client::connect(fake.addr()).await;
    let body = br#"{"action":"get_login_info","params":{}}"#;
    let (a, b) = body.split_at(10);
    let raw = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n{:x};ext=1\r\n{}\r\n0\r\n\r\n",
        a.len(),
        std::str::from_utf8(a).unwrap(),
        b.len(),
        std::str::from_utf8(b).unwrap()
    );
    client.stream.write_all(raw.as_bytes()).await.unwrap();
    let resp = client.read_response().await.unwrap();
    assert_eq!(resp.json()["data"]["user_id"], 10001);
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(client.read_to_end().await.is_empty(), "server closes after Connection: close");
    assert_eq!(fake.requests()[0].body, body);
}

// ------------------------------------------------------------------ faults

#[tokio::test]
async fn fault_delay_answers_late() {
    let fake = start().await;
    fake.set_fault("get_status", Fault::Delay(Duration::from_millis(200)));
    let started = Instant::now();
    let resp = call(&fake, "get_status", json!({})).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(resp.json()["retcode"], 0);
    assert!(fake.closed_while_pending().is_empty());

    fake.clear_fault("get_status");
    let started = Instant::now();
    call(&fake, "get_status", json!({})).await;
    assert!(started.elapsed() < Duration::from_millis(200));
}

#[tokio::test]
async fn fault_delay_records_client_close() {
    let fake = start().await;
    fake.set_fault("get_status", Fault::Delay(Duration::from_secs(30)));
    let mut client = Client::connect(fake.addr()).await;
    client.send("POST", "/get_status", &[], b"{}").await;
    // Wait until the request has arrived, then hang up.
    assert!(!fake.wait_closed_while_pending("get_status", Duration::from_millis(100)).await);
    while fake.requests().is_empty() {
        tokio::task::yield_now().await;
    }
    drop(client);
    assert!(fake.wait_closed_while_pending("get_status", Duration::from_secs(5)).await);
    assert_eq!(fake.closed_while_pending(), vec!["get_status".to_string()]);
}

#[tokio::test]
async fn fault_hang_records_client_close() {
    let fake = start().await;
    fake.set_fault("send_group_msg", Fault::Hang);
    let mut client = Client::connect(fake.addr()).await;
    let body = json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}).to_string();
    client.send("POST", "/", &[], body.as_bytes()).await;
    // No answer arrives.
    let waited = tokio::time::timeout(Duration::from_millis(300), client.fill()).await;
    assert!(waited.is_err(), "a hung action must not answer");
    drop(client);
    assert!(fake.wait_closed_while_pending("send_group_msg", Duration::from_secs(5)).await);
    assert!(!fake.wait_closed_while_pending("get_status", Duration::from_millis(10)).await);
}

#[tokio::test]
async fn fault_disconnect_mid_body() {
    let fake = start().await;
    fake.set_fault("get_login_info", Fault::DisconnectMidBody);
    let mut client = Client::connect(fake.addr()).await;
    client.send("POST", "/get_login_info", &[], b"{}").await;
    let raw = client.read_to_end().await;
    let head_end = find(&raw, b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&raw[..head_end]).unwrap().to_ascii_lowercase();
    let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length: ")).unwrap().parse().unwrap();
    let got = raw.len() - head_end - 4;
    assert!(got > 0 && got < length, "sent {got} of {length}");

    // Stream actions: a chunked head, part of the frames, no final chunk.
    fake.set_fault("test_download_stream", Fault::DisconnectMidBody);
    let mut client = Client::connect(fake.addr()).await;
    client.send("POST", "/test_download_stream", &[], b"{}").await;
    let raw = String::from_utf8_lossy(&client.read_to_end().await).into_owned();
    assert!(raw.to_ascii_lowercase().contains("transfer-encoding: chunked"));
    assert!(raw.contains("Index-> 1"));
    assert!(!raw.contains("Stream transmission complete"));
    assert!(!raw.ends_with("0\r\n\r\n"));
}

#[tokio::test]
async fn fault_bodies() {
    let fake = start().await;
    fake.set_fault("get_status", Fault::MalformedJson);
    let resp = call(&fake, "get_status", json!({})).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"{\"status\":"[..]));

    fake.set_fault("get_status", Fault::Http500);
    let resp = call(&fake, "get_status", json!({})).await;
    assert_eq!(resp.status, 500);
    assert_eq!(resp.json()["retcode"], 1200);
    assert_eq!(resp.json()["status"], "failed");

    fake.set_fault("get_status", Fault::OversizeBody(100_000));
    let resp = call(&fake, "get_status", json!({})).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["retcode"], 0);
    assert_eq!(resp.json()["data"].as_str().unwrap().len(), 100_000);

    fake.set_fault("get_status", Fault::NonObject);
    let resp = call(&fake, "get_status", json!({})).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"[1,2]"[..]));

    // Faults are per action.
    assert_eq!(call(&fake, "get_login_info", json!({})).await.json()["retcode"], 0);
    fake.clear_fault("get_status");
    assert_eq!(call(&fake, "get_status", json!({})).await.json()["data"]["good"], true);
}

// ------------------------------------------------------------------ Stream actions

#[tokio::test]
async fn test_download_stream_frames() {
    let fake = start().await;
    let body = json!({"action": "test_download_stream", "params": {}, "echo": 9}).to_string();
    let resp = Client::connect(fake.addr()).await.request("POST", "/", &[], body.as_bytes()).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert_eq!(resp.header("content-type"), None);
    let frames = resp.frames();
    assert_eq!(frames.len(), 11);
    for (i, frame) in frames[..10].iter().enumerate() {
        assert_eq!(
            *frame,
            json!({
                "status": "ok", "retcode": 0,
                "data": {"type": "stream", "data_type": "data_chunk", "data": format!("Index-> {}", i + 1)},
                "message": "", "wording": "", "stream": "stream-action", "echo": 9
            })
        );
    }
    assert_eq!(
        frames[10],
        json!({
            "status": "ok", "retcode": 0,
            "data": {"type": "response", "data_type": "data_complete", "data": "Stream transmission complete"},
            "message": "", "wording": "", "stream": "stream-action", "echo": 9
        })
    );

    let resp = call(&fake, "test_download_stream", json!({"error": true})).await;
    let frames = resp.frames();
    assert_eq!(frames.len(), 11);
    assert_eq!(
        frames[10],
        json!({
            "status": "failed", "retcode": 100,
            "data": {"type": "error", "data_type": "error"},
            "message": "This is a test error", "wording": "This is a test error", "stream": "stream-action"
        })
    );
}

#[tokio::test]
async fn download_frames_reassemble_with_stream_split() {
    let fake = start().await;
    let content: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    fake.add_file("pic.bin", content.clone());
    fake.set_fault("download_file_stream", Fault::StreamSplit(7));

    let resp = call(&fake, "download_file_stream", json!({"file": "pic.bin", "chunk_size": 4096})).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), None);
    // Pieces of exactly 7 bytes (the last may be shorter), across frame boundaries.
    let (last, full) = resp.chunk_sizes.split_last().unwrap();
    assert!(full.iter().all(|&s| s == 7) && *last <= 7 && full.len() > 100);

    let frames = resp.frames();
    assert_eq!(frames.len(), 1 + 3 + 1);
    assert!(frames.iter().all(|f| f["status"] == "ok" && f["stream"] == "stream-action"));
    assert_eq!(
        frames[0]["data"],
        json!({"type": "stream", "data_type": "file_info", "file_name": "pic.bin", "file_size": 10_000, "chunk_size": 4096})
    );
    let mut assembled = Vec::new();
    for (i, frame) in frames[1..4].iter().enumerate() {
        let data = &frame["data"];
        assert_eq!(data["type"], "stream");
        assert_eq!(data["data_type"], "file_chunk");
        assert_eq!(data["index"], i);
        let b64 = data["data"].as_str().unwrap();
        assert_eq!(data["base64_size"], b64.len());
        let bytes = base64::decode(b64).unwrap();
        assert_eq!(data["size"], bytes.len());
        assembled.extend_from_slice(&bytes);
        assert_eq!(data["progress"], (assembled.len() * 100 / content.len()) as u64);
    }
    assert_eq!(assembled, content);
    assert_eq!(
        frames[4]["data"],
        json!({
            "type": "response", "data_type": "file_complete", "file_name": "pic.bin",
            "total_chunks": 3, "total_bytes": 10_000, "message": "Download completed"
        })
    );

    // Default chunk size, file_id lookup, the image/record variants.
    for action in ["download_file_image_stream", "download_file_record_stream"] {
        let frames = call(&fake, action, json!({"file_id": "pic.bin"})).await.frames();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0]["data"]["chunk_size"], 65536);
        assert_eq!(base64::decode(frames[1]["data"]["data"].as_str().unwrap()).unwrap(), content);
    }

    // Unknown file: a single failure frame.
    let frames = call(&fake, "download_file_stream", json!({"file": "missing.bin"})).await.frames();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0]["status"], "failed");
    assert_eq!(frames[0]["data"], json!({"type": "error", "data_type": "error"}));
    let frames = call(&fake, "download_file_stream", json!({})).await.frames();
    assert_eq!(frames[0]["retcode"], 1400);
}

#[tokio::test]
async fn stream_split_applies_to_plain_responses() {
    let fake = start().await;
    fake.set_fault("get_login_info", Fault::StreamSplit(3));
    let resp = call(&fake, "get_login_info", json!({})).await;
    assert_eq!(resp.json()["data"]["user_id"], 10001);
}

async fn upload(fake: &FakeSnowLuma, params: Value) -> Value {
    let frames = call(fake, "upload_file_stream", params).await.frames();
    assert_eq!(frames.len(), 1, "upload_file_stream answers one frame per POST");
    frames.into_iter().next().unwrap()
}

#[tokio::test]
async fn upload_state_machine() {
    let fake = start().await;
    let content: Vec<u8> = (0..2500u32).map(|i| (i % 256) as u8).collect();
    let sha = sha256::digest_hex(&content);
    let chunks: Vec<&[u8]> = content.chunks(1000).collect();

    for (i, chunk) in chunks.iter().enumerate() {
        let ack = upload(
            &fake,
            json!({
                "stream_id": "up-1", "chunk_data": base64::encode(chunk), "chunk_index": i,
                "total_chunks": 3, "file_size": 2500, "filename": "a.bin"
            }),
        )
        .await;
        assert_eq!(
            ack,
            json!({
                "status": "ok", "retcode": 0,
                "data": {"type": "stream", "stream_id": "up-1", "status": "chunk_received",
                         "received_chunks": i + 1, "total_chunks": 3},
                "message": "", "wording": "", "stream": "stream-action"
            })
        );
    }
    // A repeated chunk is idempotent.
    let dup = upload(
        &fake,
        json!({"stream_id": "up-1", "chunk_data": base64::encode(chunks[0]), "chunk_index": 0, "total_chunks": 3}),
    )
    .await;
    assert_eq!(dup["data"]["received_chunks"], 3);

    let done = upload(
        &fake,
        json!({"stream_id": "up-1", "total_chunks": 3, "file_size": 2500, "expected_sha256": sha,
               "is_complete": true, "filename": "a.bin"}),
    )
    .await;
    assert_eq!(done["status"], "ok");
    assert_eq!(
        done["data"],
        json!({
            "type": "response", "stream_id": "up-1", "status": "file_complete",
            "received_chunks": 3, "total_chunks": 3, "file_path": "/fake/upload/up-1__a.bin",
            "file_size": 2500, "sha256": sha
        })
    );
    assert_eq!(fake.uploaded("up-1").unwrap(), content);
    assert_eq!(fake.uploaded("up-2"), None);
}

#[tokio::test]
async fn upload_errors_and_reset() {
    let fake = start().await;
    // Invalid stream ids.
    for id in ["", "has space", "../x", &"a".repeat(129)] {
        let frame = upload(&fake, json!({"stream_id": id, "total_chunks": 1})).await;
        assert_eq!(frame["retcode"], 1400, "{id:?}");
        assert_eq!(frame["data"]["type"], "error");
    }
    // A new stream needs total_chunks.
    let frame = upload(&fake, json!({"stream_id": "s", "chunk_data": "", "chunk_index": 0})).await;
    assert_eq!(frame["retcode"], 1400);

    // Empty file: one empty chunk, then completion without chunk data.
    let ack = upload(&fake, json!({"stream_id": "empty", "chunk_data": "", "chunk_index": 0, "total_chunks": 1})).await;
    assert_eq!(ack["data"]["status"], "chunk_received");
    let done = upload(&fake, json!({"stream_id": "empty"})).await;
    assert_eq!(done["data"]["status"], "file_complete");
    assert_eq!(done["data"]["sha256"], sha256::digest_hex(b""));
    assert_eq!(done["data"]["file_path"], "/fake/upload/empty__file");
    assert_eq!(fake.uploaded("empty").unwrap(), Vec::<u8>::new());

    // SHA-256 mismatch fails the completion.
    upload(&fake, json!({"stream_id": "bad", "chunk_data": "aGk=", "chunk_index": 0, "total_chunks": 1})).await;
    let frame = upload(
        &fake,
        json!({"stream_id": "bad", "is_complete": true, "expected_sha256": sha256::digest_hex(b"other")}),
    )
    .await;
    assert_eq!(frame["status"], "failed");
    assert_eq!(frame["data"], json!({"type": "error", "data_type": "error"}));
    assert!(frame["wording"].as_str().unwrap().contains("sha256 mismatch"));
    assert_eq!(fake.uploaded("bad"), None);

    // Invalid base64 and out-of-range index.
    let frame =
        upload(&fake, json!({"stream_id": "b64", "chunk_data": "a", "chunk_index": 0, "total_chunks": 2})).await;
    assert_eq!(frame["wording"], "chunk_data: invalid base64");
    let frame = upload(&fake, json!({"stream_id": "b64", "chunk_data": "", "chunk_index": 2})).await;
    assert_eq!(frame["retcode"], 1400);

    // Completing early fails; nothing to do yet answers file_created.
    upload(&fake, json!({"stream_id": "part", "chunk_data": "aGk=", "chunk_index": 0, "total_chunks": 2})).await;
    let idle = upload(&fake, json!({"stream_id": "part"})).await;
    assert_eq!(idle["data"]["status"], "file_created");
    assert_eq!(idle["data"]["received_chunks"], 1);
    let early = upload(&fake, json!({"stream_id": "part", "is_complete": true})).await;
    assert_eq!(early["status"], "failed");

    // Reset: a failure frame with "Stream reset completed", and the stream is gone.
    let reset = upload(&fake, json!({"stream_id": "part", "reset": true})).await;
    assert_eq!(
        reset,
        json!({
            "status": "failed", "retcode": 100, "data": {"type": "error", "data_type": "error"},
            "message": "Stream reset completed", "wording": "Stream reset completed", "stream": "stream-action"
        })
    );
    let gone = upload(&fake, json!({"stream_id": "part", "verify_only": true})).await;
    assert_eq!(gone["status"], "failed");
}

#[tokio::test]
async fn stream_client_hangup_is_recorded() {
    let fake = start().await;
    fake.add_file("big.bin", vec![7u8; 4 * 1024 * 1024]);
    fake.set_fault("download_file_stream", Fault::StreamSplit(1024));
    let mut client = Client::connect(fake.addr()).await;
    client.send("POST", "/download_file_stream", &[], br#"{"file":"big.bin","chunk_size":1024}"#).await;
    assert!(client.fill().await > 0);
    drop(client);
    assert!(fake.wait_closed_while_pending("download_file_stream", Duration::from_secs(10)).await);
}

#[tokio::test]
async fn listener_closes_when_last_handle_drops() {
    let fake = start().await;
    let addr = fake.addr();
    let clone = fake.clone();
    drop(fake);
    assert_eq!(call(&clone, "get_status", json!({})).await.status, 200);
    drop(clone);
    // The accept loop is aborted; give the runtime a moment to drop the listener.
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("listener still accepting after the last handle was dropped");
}

// ------------------------------------------------------------------ golden preset

/// Splits a body on `\r\n\r\n` as Node's client does; what follows the last
/// delimiter comes back apart.
fn split_frames(body: &[u8]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut frames = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, b"\r\n\r\n") {
        frames.push(rest[..at].to_vec());
        rest = &rest[at + 4..];
    }
    (frames, rest.to_vec())
}

fn json_frames(body: &[u8]) -> Vec<Value> {
    let (frames, rest) = split_frames(body);
    assert!(rest.is_empty(), "a delimited stream");
    frames.iter().map(|f| serde_json::from_slice(f).unwrap()).collect()
}

#[tokio::test]
async fn golden_ordinary_answers() {
    let fake = FakeSnowLuma::golden(Some("T")).await.unwrap();
    let auth = [("Authorization", "Bearer T")];
    let post = |action: &str, params: Value| {
        let body = json!({"action": action, "params": params}).to_string();
        let addr = fake.addr();
        async move { Client::connect(addr).await.request("POST", "/", &auth, body.as_bytes()).await }
    };
    assert_eq!(
        post("get_group_list", json!({"no_cache": true})).await.json(),
        json!({"status": "ok", "retcode": 0, "data": [{"group_id": 20001, "group_name": "g1", "member_count": 3, "max_member_count": 200}]})
    );
    assert_eq!(
        post("get_login_info", json!({})).await.json(),
        json!({"status": "ok", "retcode": 0, "data": {"user_id": 10001, "nickname": "fake-bot"}})
    );
    assert_eq!(
        post("get_friend_list", json!({})).await.json(),
        json!({"status": "ok", "retcode": 0, "data": [{"user_id": 30001, "nickname": "f1", "remark": ""}]})
    );
    for action in ["set_group_name", "set_group_kick"] {
        assert_eq!(
            post(action, json!({"group_id": 1})).await.json(),
            json!({"status": "ok", "retcode": 0, "data": null})
        );
    }
    assert_eq!(
        post("send_private_msg", json!({"user_id": 30001})).await.body,
        br#"{"status":"failed","retcode":1400,"data":null,"wording":"message: is required"}"#
    );
    assert_eq!(
        post("get_group_info", json!({"group_id": 20001})).await.body,
        br#"{"status":"failed","retcode":1404,"data":null,"wording":"unknown action"}"#
    );
    let resp =
        Client::connect(fake.addr()).await.request("POST", "/", &[("Authorization", "Bearer wrong")], b"{}").await;
    assert_eq!(resp.status, 401);
    assert_eq!(resp.body, br#"{"status":"failed","retcode":1401,"data":null,"wording":"unauthorized"}"#);
}

#[tokio::test]
async fn golden_downloads_and_undelimited_bodies() {
    let fake = FakeSnowLuma::golden(None).await.unwrap();
    for (n, chunk, frames, sha) in [
        (70000usize, None, 4, "3500f58cfd1bd88e231edf56dca995542a702bd54525804e5a8604c8aa5cb52e"),
        (300, Some(100), 5, "4ebe2a8bd5ece93fb899b68e8a5fe64464b2058a5ddca6c079bc907930aa3003"),
    ] {
        let mut params = json!({"file": format!("fake://{n}")});
        if let Some(c) = chunk {
            params["chunk_size"] = json!(c);
        }
        let got = json_frames(&call(&fake, "download_file_image_stream", params).await.body);
        assert_eq!(got.len(), frames);
        assert_eq!(got[0]["data"]["file_name"], format!("fake-{n}.bin"));
        let bytes: Vec<u8> = got[1..frames - 1]
            .iter()
            .flat_map(|f| base64::decode(f["data"]["data"].as_str().unwrap()).unwrap())
            .collect();
        assert_eq!(sha256::digest_hex(&bytes), sha);
        assert_eq!(
            got[frames - 1],
            json!({"status": "ok", "retcode": 0, "data": {"type": "response", "data_type": "file_complete",
                   "file_name": format!("fake-{n}.bin"), "total_chunks": frames - 2, "total_bytes": n,
                   "message": "Download completed"}, "message": "", "wording": "", "stream": "stream-action"})
        );
    }
    // A file that is not fake://N, and any upload: one JSON body, no delimiter.
    let resp = call(&fake, "download_file_record_stream", json!({"file": "missing.amr"})).await;
    let (frames, rest) = split_frames(&resp.body);
    assert!(frames.is_empty());
    assert_eq!(serde_json::from_slice::<Value>(&rest).unwrap()["status"], "failed");
    let resp = call(
        &fake,
        "upload_file_stream",
        json!({"stream_id": "g1", "chunk_data": "YWJj", "chunk_index": 0, "total_chunks": 1}),
    )
    .await;
    let (frames, rest) = split_frames(&resp.body);
    assert!(frames.is_empty());
    assert_eq!(serde_json::from_slice::<Value>(&rest).unwrap()["data"]["status"], "chunk_received");
    // test_download_stream with frames delay_ms apart.
    let started = Instant::now();
    let got = json_frames(&call(&fake, "test_download_stream", json!({"delay_ms": 20})).await.body);
    assert_eq!(got.len(), 11);
    assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    assert_eq!(got[10]["data"]["data_type"], "data_complete");
}

#[tokio::test]
async fn golden_faults_are_one_shot_and_named_as_in_the_transcripts() {
    let fake = FakeSnowLuma::golden(None).await.unwrap();
    for f in GoldenFault::ALL {
        assert_eq!(f.name().parse::<GoldenFault>(), Ok(f));
    }
    assert!(fake.arm_fault_named("x", "nope").is_err());
    // Armed over HTTP, used once.
    let arm = json!({"action": "get_friend_list", "mode": "non_json"}).to_string();
    assert_eq!(Client::connect(fake.addr()).await.request("POST", "/__fault", &[], arm.as_bytes()).await.status, 200);
    assert_eq!(call(&fake, "get_friend_list", json!({})).await.body, b"this is not json");
    assert_eq!(call(&fake, "get_friend_list", json!({})).await.json()["retcode"], 0);
    fake.arm_fault_named("get_group_list", "http500").unwrap();
    let resp = call(&fake, "get_group_list", json!({})).await;
    assert_eq!(resp.status, 500);
    assert!(serde_json::from_slice::<Value>(&resp.body).is_err());
    fake.arm_fault("get_login_info", GoldenFault::ArrayBody);
    assert!(call(&fake, "get_login_info", json!({})).await.json().is_array());
    fake.arm_fault("get_status", GoldenFault::Deep);
    let body = call(&fake, "get_status", json!({})).await.body;
    assert!(body.len() > 200_000 && body.starts_with(b"{"));
    // Disarmed by a reset.
    fake.arm_fault("get_status", GoldenFault::Deep);
    assert_eq!(Client::connect(fake.addr()).await.request("POST", "/__reset", &[], b"").await.status, 200);
    assert_eq!(call(&fake, "get_status", json!({})).await.json()["retcode"], 0);
    assert!(fake.requests().iter().all(|r| !r.path.starts_with("/__")), "control requests are not recorded");

    // Truncated and reset: no whole answer.
    fake.arm_fault("get_version_info", GoldenFault::Truncated);
    let mut c = Client::connect(fake.addr()).await;
    c.send("POST", "/", &[], br#"{"action":"get_version_info"}"#).await;
    assert!(c.read_response().await.is_none());
    fake.arm_fault("get_msg", GoldenFault::Reset);
    let mut c = Client::connect(fake.addr()).await;
    c.send("POST", "/", &[], br#"{"action":"get_msg"}"#).await;
    assert!(c.read_to_end().await.is_empty());

    // Spoilt downloads: the frame the transcripts' errors name.
    let spoilt = |fault: GoldenFault| {
        let fake = fake.clone();
        async move {
            fake.arm_fault("download_file_image_stream", fault);
            let mut c = Client::connect(fake.addr()).await;
            c.send("POST", "/", &[], br#"{"action":"download_file_image_stream","params":{"file":"fake://1"}}"#).await;
            let resp = c.read_response().await;
            let body = match resp {
                Some(r) => r.body,
                None => c.read_to_end().await,
            };
            split_frames(&body).0
        }
    };
    let data_type = |raw: &[u8]| {
        serde_json::from_slice::<Value>(raw).map(|v| v["data"]["data_type"].clone()).unwrap_or(Value::Null)
    };
    let f = spoilt(GoldenFault::NoTerminal).await;
    assert_eq!(f.len(), 4);
    assert_eq!(data_type(&f[0]), "file_info");
    assert_eq!(serde_json::from_slice::<Value>(&f[0]).unwrap()["data"]["file_size"], 196_608);
    let f = spoilt(GoldenFault::DoubleTerminal).await;
    assert_eq!((f.len(), data_type(&f[4]), data_type(&f[5])), (6, json!("file_complete"), json!("file_complete")));
    assert_eq!(spoilt(GoldenFault::TooManyBytes).await.len(), 6);
    assert_eq!(spoilt(GoldenFault::GarbageFrame).await[2], b"this is not json");
    let f = spoilt(GoldenFault::ErrorFrame).await;
    assert_eq!(serde_json::from_slice::<Value>(&f[2]).unwrap()["wording"], "disk full");
    assert_eq!(data_type(&spoilt(GoldenFault::NoFileInfo).await[0]), "file_chunk");
    let f = spoilt(GoldenFault::IndexGap).await;
    assert_eq!(serde_json::from_slice::<Value>(&f[2]).unwrap()["data"]["index"], 2);
    // Reset mid-body: two frames, then the connection ends without the last chunk.
    fake.arm_fault("download_file_record_stream", GoldenFault::ResetMid);
    let mut c = Client::connect(fake.addr()).await;
    c.send("POST", "/", &[], br#"{"action":"download_file_record_stream","params":{"file":"fake://1"}}"#).await;
    let raw = c.read_to_end().await;
    let count = |needle: &[u8]| raw.windows(needle.len()).filter(|w| *w == needle).count();
    assert_eq!((count(b"\"file_info\""), count(b"\"file_chunk\"")), (1, 1), "two frames");
    assert!(!raw.ends_with(b"\r\n0\r\n\r\n"), "no last chunk");
    let f = spoilt(GoldenFault::GiantFrame).await;
    assert!(f[1].len() > 24 * 1024 * 1024);
}
