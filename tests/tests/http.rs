#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `snowluma-mcp serve-http`: both eras over Streamable HTTP through the real
//! binary (launcher, front, one stdio tree per session), its access control,
//! limits, isolation and what happens when a client disappears.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use snowluma_e2e::*;

const ALICE: &str = "alice-token-0123456789abcdef0123456789";
const ALICE2: &str = "alice-two-token-0123456789abcdef01234";
const BOB: &str = "bob-token-0123456789abcdef0123456789ab";

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snowluma-http-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("tokens");
    write_private(&p, &format!("# ids and tokens\nalice:{ALICE}\n\nalice2:{ALICE2}\nbob:{BOB}\n"));
    p
}

/// A running `serve-http` (the launcher), its stderr collected.
struct Server {
    child: Child,
    stderr: Arc<Mutex<String>>,
    addr: String,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    scheme: &'static str,
}

fn command(env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new(bin_path());
    cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

impl Server {
    fn start(dir: &Path, env: &[(&str, &str)], extra: &[&str]) -> Server {
        Server::start_with(dir, env, extra, None)
    }

    fn start_with(dir: &Path, env: &[(&str, &str)], extra: &[&str], tls: Option<reqwest::Certificate>) -> Server {
        let tokens = token_file(dir);
        let mut args = vec!["serve-http", "--listen", "127.0.0.1:0", "--http-token-file", tokens.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut child =
            command(env, &args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sb = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sb.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let addr = wait_until("serve-http says where it listens", || {
            let text = stderr.lock().unwrap().clone();
            text.split("listening on ").nth(1).map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        });
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut json = reqwest::header::HeaderMap::new();
        json.insert("content-type", reqwest::header::HeaderValue::from_static("application/json"));
        let mut builder = reqwest::Client::builder().no_proxy().default_headers(json);
        let scheme = if let Some(cert) = tls {
            builder = builder.tls_certs_only([cert]);
            "https"
        } else {
            "http"
        };
        let client = builder.build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Server { child, stderr, addr, rt, client, scheme }
    }

    /// A client with its own connection pool (JSON bodies).
    fn client_for_another_connection(&self) -> reqwest::Client {
        let mut json = reqwest::header::HeaderMap::new();
        json.insert("content-type", reqwest::header::HeaderValue::from_static("application/json"));
        reqwest::Client::builder().no_proxy().default_headers(json).build().unwrap()
    }

    fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn url(&self) -> String {
        format!("{}://{}/mcp", self.scheme, self.addr)
    }

    /// POST one message; (status, headers, JSON messages: the body, or
    /// every SSE event's data).
    fn post(&self, token: Option<&str>, session: Option<&str>, headers: &[(&str, &str)], body: &Value) -> Reply {
        self.post_raw(token, session, headers, serde_json::to_vec(body).unwrap())
    }

    fn post_raw(&self, token: Option<&str>, session: Option<&str>, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let mut req = self
            .client
            .post(self.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.rt.block_on(async {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let text = resp.text().await.unwrap();
            Reply::new(status, headers, text)
        })
    }

    fn delete(&self, token: &str, session: &str) -> u16 {
        self.rt.block_on(async {
            let resp = self
                .client
                .delete(self.url())
                .header("authorization", format!("Bearer {token}"))
                .header("mcp-session-id", session)
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        })
    }

    /// A legacy session: initialize + initialized; returns its id.
    fn initialize(&self, token: &str) -> String {
        self.initialize_with(token, json!({}))
    }

    fn initialize_with(&self, token: &str, capabilities: Value) -> String {
        let r = self.post(
            Some(token),
            None,
            &[],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "e2e", "version": "1"}}}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.last()["result"]["protocolVersion"], "2025-11-25");
        let sid = r.headers.get("mcp-session-id").expect("a session id").to_str().unwrap().to_owned();
        assert_eq!(sid.len(), 32, "128 random bits in hex");
        let n = self.post(
            Some(token),
            Some(&sid),
            &[("mcp-protocol-version", "2025-11-25")],
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        assert_eq!(n.status, 202);
        sid
    }

    fn call(&self, token: &str, sid: &str, id: i64, tool: &str, args: Value) -> Reply {
        self.post(
            Some(token),
            Some(sid),
            &[("mcp-protocol-version", "2025-11-25")],
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}),
        )
    }

    fn modern(&self, token: &str, id: i64, method: &str, name: Option<&str>, mut params: Value) -> Reply {
        params["_meta"] = modern_meta();
        let mut headers = vec![("mcp-protocol-version", MODERN), ("mcp-method", method)];
        if let Some(n) = name {
            headers.push(("mcp-name", n));
        }
        self.post(Some(token), None, &headers, &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The session trees: the launcher's children but the front.
    fn session_pids(&self) -> Vec<i32> {
        children(self.child.id() as i32)
            .into_iter()
            .filter(|p| !cmdline(*p).contains("__snowluma-http-front"))
            .collect()
    }

    fn front_pid(&self) -> i32 {
        children(self.child.id() as i32).into_iter().find(|p| cmdline(*p).contains("__snowluma-http-front")).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let _ = wait_exit(&mut self.child, "serve-http stops on SIGTERM");
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    messages: Vec<Value>,
}

impl Reply {
    fn new(status: u16, headers: reqwest::header::HeaderMap, text: String) -> Reply {
        let sse = headers.get("content-type").is_some_and(|c| c.to_str().unwrap().starts_with("text/event-stream"));
        let messages = if sse {
            text.split("\n\n")
                .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
                .map(|d| serde_json::from_str(d).unwrap())
                .collect()
        } else if text.is_empty() {
            Vec::new()
        } else {
            vec![serde_json::from_str(&text).unwrap_or(Value::String(text))]
        };
        Reply { status, headers, messages }
    }

    fn last(&self) -> &Value {
        self.messages.last().expect("a message")
    }
}

#[test]
fn a_legacy_session_lists_and_calls_tools_then_ends_with_delete() {
    let dir = temp_dir("legacy");
    let s = Server::start(&dir, &[], &[]);
    assert!(s.session_pids().is_empty(), "nothing runs before a session");
    let sid = s.initialize(ALICE);
    let list = s.post(
        Some(ALICE),
        Some(&sid),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": "list", "method": "tools/list"}),
    );
    assert_eq!(list.status, 200);
    assert_eq!(list.last()["id"], "list", "the client's id comes back");
    let tools = list.last()["result"]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == "search_actions"));
    let r = s.call(ALICE, &sid, 7, "get_action", json!({"name": "send_group_msg"}));
    assert_eq!(r.last()["id"], 7);
    assert!(!is_error(&r.last()["result"]), "{:?}", r);
    assert_eq!(s.session_pids().len(), 1, "one tree for the session");
    // Version header of another era: refused.
    let bad = s.post(
        Some(ALICE),
        Some(&sid),
        &[("mcp-protocol-version", "1999-01-01")],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list"}),
    );
    assert_eq!(bad.status, 400);
    // GET opens the standalone stream (headers only are awaited here).
    let get_status = s.rt.block_on(async {
        let resp = s
            .client
            .get(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.headers().get("content-type").unwrap().to_str().unwrap().to_owned())
    });
    assert_eq!(get_status, (200, "text/event-stream".to_owned()));
    let tree = s.session_pids()[0];
    assert_eq!(s.delete(ALICE, &sid), 200);
    let after = s.call(ALICE, &sid, 9, "list_categories", json!({}));
    assert_eq!(after.status, 404, "a deleted session is gone");
    wait_until("the deleted session's tree is reaped", || (!alive(tree)).then_some(()));
    wait_until("the launcher logs the end", || s.stderr_text().contains("serve-http: session ended").then_some(()));
}

#[test]
fn a_modern_client_discovers_and_calls_with_mirrored_headers() {
    let dir = temp_dir("modern");
    let s = Server::start(&dir, &[], &[]);
    let d = s.modern(ALICE, 1, "server/discover", None, json!({}));
    assert_eq!(d.status, 200, "{d:?}");
    assert!(d.last()["result"]["supportedVersions"].as_array().unwrap().contains(&json!(MODERN)));
    assert!(d.headers.get("mcp-session-id").is_none(), "no sessions in the modern era");
    // Requests of one token from one host share a tree, whatever the
    // connection; another token gets its own.
    let other_connection = s.client_for_another_connection();
    let mut params = json!({});
    params["_meta"] = modern_meta();
    let status = s.rt.block_on(async {
        other_connection
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/list")
            .header("accept", "application/json")
            .body(
                serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": params}))
                    .unwrap(),
            )
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(status, 200);
    assert_eq!(s.session_pids().len(), 1, "one modern tree for alice on this host");
    assert_eq!(s.modern(BOB, 1, "server/discover", None, json!({})).status, 200);
    assert_eq!(s.session_pids().len(), 2, "bob's own tree");
    let r = s.modern(
        ALICE,
        2,
        "tools/call",
        Some("get_action"),
        json!({"name": "get_action", "arguments": {"name": "send_group_msg"}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.last()["id"], 2);
    assert_eq!(r.last()["result"]["resultType"], "complete");
    // Header and body disagree: HeaderMismatch, and nothing reaches a tree.
    let m = s.modern(
        ALICE,
        3,
        "tools/call",
        Some("search_actions"),
        json!({"name": "get_action", "arguments": {"name": "x"}}),
    );
    assert_eq!(m.status, 400);
    assert_eq!(m.last()["error"]["code"], -32020);
    let mut params = json!({"name": "get_action", "arguments": {"name": "x"}});
    params["_meta"] = modern_meta();
    let missing = s.post(
        Some(ALICE),
        None,
        &[("mcp-protocol-version", MODERN)],
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params}),
    );
    assert_eq!(missing.status, 400);
    assert_eq!(missing.last()["error"]["code"], -32020, "Mcp-Method is required");
    // A base64-encoded Mcp-Name is decoded before the comparison.
    let enc = s.modern(
        ALICE,
        5,
        "tools/call",
        Some("=?base64?Z2V0X2FjdGlvbg==?="),
        json!({"name": "get_action", "arguments": {"name": "send_group_msg"}}),
    );
    assert_eq!(enc.status, 200, "{enc:?}");
    let unknown = s.modern(ALICE, 6, "no/such_method", None, json!({}));
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.last()["error"]["code"], -32601);
    // `initialize` sent the modern way is a removed method, not a new
    // legacy session: 404, and no tree is started for it.
    let init = s.modern(ALICE, 7, "initialize", None, json!({}));
    assert_eq!(init.status, 404, "{init:?}");
    assert_eq!(init.last()["error"]["code"], -32601);
    assert!(init.headers.get("mcp-session-id").is_none());
    assert_eq!(s.session_pids().len(), 2, "no tree for a modern initialize");
    // A modern request without its _meta: invalid params, over HTTP a 400.
    let bare = s.post(
        Some(ALICE),
        None,
        &[("mcp-protocol-version", MODERN), ("mcp-method", "server/discover")],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "server/discover", "params": {}}),
    );
    assert_eq!(bare.status, 400, "{bare:?}");
    assert_eq!(bare.last()["error"]["code"], -32602);
    assert_eq!(bare.last()["id"], 8);
    // A modern notification (the SDKs send notifications/cancelled this
    // way) needs no session: accepted.
    let note = s.post(
        Some(ALICE),
        None,
        &[("mcp-protocol-version", MODERN), ("mcp-method", "notifications/cancelled")],
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}),
    );
    assert_eq!(note.status, 202, "{note:?}");
}

#[test]
fn missing_wrong_and_stale_tokens_get_401_and_start_nothing() {
    let dir = temp_dir("tokens");
    let s = Server::start(&dir, &[], &[]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
    for token in [None, Some("wrong-token-0123456789abcdef0123456789"), Some(&ALICE[..ALICE.len() - 1]), Some("")] {
        let r = s.post(token, None, &[], &init);
        assert_eq!(r.status, 401, "{token:?}");
        assert_eq!(r.headers.get("www-authenticate").unwrap(), "Bearer realm=\"snowluma-mcp\"");
        assert_eq!(r.last()["error"]["message"], "Unauthorized", "a fixed body");
    }
    // Basic instead of Bearer.
    let basic = s.rt.block_on(async {
        s.client
            .post(s.url())
            .header("authorization", format!("Basic {ALICE}"))
            .body("{}")
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(basic.as_u16(), 401);
    assert!(s.session_pids().is_empty(), "no tree for anyone without a token");
    // Stale: bob's token removed from the file and SIGHUP sent.
    let sid = s.initialize(BOB);
    let tree = s.session_pids()[0];
    write_private(&dir.join("tokens"), &format!("alice:{ALICE}\n"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.child.id() as i32), nix::sys::signal::SIGHUP).unwrap();
    wait_until("the reloaded token set refuses bob", || {
        let r = s.call(BOB, &sid, 2, "list_categories", json!({}));
        (r.status == 401).then_some(())
    });
    wait_until("the revoked token's session tree is reaped", || (!alive(tree)).then_some(()));
    // A broken file on SIGHUP keeps the old set.
    write_private(&dir.join("tokens"), "garbage\n");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.child.id() as i32), nix::sys::signal::SIGHUP).unwrap();
    wait_until("the failed reload is logged", || {
        s.stderr_text().contains("the token file was not reloaded").then_some(())
    });
    let again = s.initialize(ALICE);
    assert!(!again.is_empty());
    assert!(!s.stderr_text().contains(ALICE) && !s.stderr_text().contains(BOB), "tokens are never logged");
}

/// A token revoked (SIGHUP) while a legacy `initialize` with it is in flight:
/// whatever the timing, no tree of that token outlives the revocation.
#[test]
fn a_token_revoked_while_its_session_starts_leaves_no_tree() {
    let dir = temp_dir("revoke-race");
    let s = Server::start(&dir, &[], &[]);
    let file = dir.join("tokens");
    let launcher = nix::unistd::Pid::from_raw(s.child.id() as i32);
    // Every SIGHUP is answered by one log line, reload or not.
    let reload = |text: &str| {
        let before = s.stderr_text().matches("access tokens re-read").count();
        write_private(&file, text);
        nix::sys::signal::kill(launcher, nix::sys::signal::SIGHUP).unwrap();
        wait_until("the token file is re-read", || {
            (s.stderr_text().matches("access tokens re-read").count() > before).then_some(())
        });
    };
    let offsets_us = [0u64, 200, 500, 1_000, 2_000, 3_000, 5_000, 8_000, 12_000, 20_000, 40_000, 80_000];
    let mut statuses = Vec::new();
    for round in 0..36 {
        let token = format!("revoked-{round:02}-token-0123456789abcdef0123456789");
        reload(&format!("alice:{ALICE}\nrev{round}:{token}\n"));
        let offset = std::time::Duration::from_micros(offsets_us[round % offsets_us.len()]);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
        let request = s
            .client
            .post(s.url())
            .header("authorization", format!("Bearer {token}"))
            .header("accept", "application/json, text/event-stream")
            .body(serde_json::to_vec(&init).unwrap());
        let status = s.rt.block_on(async {
            let sent = tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) });
            tokio::time::sleep(offset).await;
            reload(&format!("alice:{ALICE}\n"));
            sent.await.unwrap()
        });
        statuses.push(status.map_err(|e| e.to_string()));
    }
    // Every tree a revoked token started (the launcher names each one's pid
    // and token) is gone: ended by the front, killed after the short grace.
    let started: Vec<i32> = s
        .stderr_text()
        .lines()
        .filter(|l| l.contains("session started") && l.contains("token_id=rev"))
        .filter_map(|l| l.split("pid=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(!started.is_empty(), "some rounds started a tree: {statuses:?}");
    wait_until("no tree of a revoked token is alive", || {
        let alive: Vec<i32> = started.iter().copied().filter(|p| alive(*p)).collect();
        if alive.is_empty() { Ok(()) } else { Err(alive) }
    });
    // The front still serves the token that stayed.
    let sid = s.initialize(ALICE);
    assert_eq!(s.call(ALICE, &sid, 2, "list_categories", json!({})).status, 200);
}

#[test]
fn a_forbidden_origin_or_host_gets_403() {
    let dir = temp_dir("origin");
    let s = Server::start(&dir, &[], &["--allowed-origin", "https://agent.example"]);
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": modern_meta()}});
    let h = [("mcp-protocol-version", MODERN), ("mcp-method", "server/discover")];
    let evil = s.post(Some(ALICE), None, &[h[0], h[1], ("origin", "http://evil.example")], &list);
    assert_eq!(evil.status, 403);
    let null = s.post(Some(ALICE), None, &[h[0], h[1], ("origin", "null")], &list);
    assert_eq!(null.status, 403);
    let good = s.post(Some(ALICE), None, &[h[0], h[1], ("origin", "https://agent.example")], &list);
    assert_eq!(good.status, 200);
    let none = s.post(Some(ALICE), None, &h, &list);
    assert_eq!(none.status, 200, "non-browser clients send no Origin");
    // DNS rebinding: a foreign Host name.
    let port = s.port();
    let status = s.rt.block_on(async {
        s.client
            .post(s.url())
            .header("host", format!("rebind.example:{port}"))
            .header("authorization", format!("Bearer {ALICE}"))
            .body("{}")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(status, 403);
    let ok = s.rt.block_on(async {
        s.client
            .post(s.url())
            .header("host", format!("localhost:{port}"))
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "server/discover")
            .header("accept", "application/json")
            .body(serde_json::to_vec(&list).unwrap())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(ok, 200);
}

#[test]
fn two_sessions_cannot_see_or_end_each_other() {
    let dir = temp_dir("isolation");
    let s = Server::start(&dir, &[], &[]);
    let a = s.initialize(ALICE);
    let b = s.initialize(BOB);
    let a2 = s.initialize(ALICE);
    assert_ne!(a, a2);
    let trees = s.session_pids();
    assert_eq!(trees.len(), 3, "one tree per session");
    // Each tree is its own process group with its own workers.
    for t in &trees {
        let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(*t))).unwrap().as_raw();
        assert_eq!(pgid, *t, "a session leads its own process group");
        for d in descendants(*t) {
            assert!(!trees.contains(&d));
        }
    }
    // A session id is not a credential: bob cannot use alice's.
    assert_eq!(s.call(BOB, &a, 2, "list_categories", json!({})).status, 404);
    assert_eq!(s.delete(BOB, &a), 404);
    // The same ids in two sessions at once do not cross.
    let ra = s.call(ALICE, &a, 5, "get_action", json!({"name": "send_group_msg"}));
    let rb = s.call(BOB, &b, 5, "get_action", json!({"name": "get_group_list"}));
    assert!(ra.last()["result"]["structuredContent"].to_string().contains("send_group_msg"));
    assert!(rb.last()["result"]["structuredContent"].to_string().contains("get_group_list"));
    // Ending one leaves the others serving.
    assert_eq!(s.delete(ALICE, &a), 200);
    assert_eq!(s.call(ALICE, &a2, 6, "list_categories", json!({})).status, 200);
    assert_eq!(s.call(BOB, &b, 6, "list_categories", json!({})).status, 200);
}

#[test]
fn the_session_and_request_limits_per_token_hold() {
    let dir = temp_dir("limits");
    let s = Server::start(&dir, &[], &["--max-sessions-per-token", "2"]);
    let a = s.initialize(ALICE);
    let b = s.initialize(ALICE);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
    // Both sessions busy (each with its GET stream open): no place, 429.
    let streams = s.rt.block_on(async {
        let mut streams = Vec::new();
        for sid in [&a, &b] {
            let r = s
                .client
                .get(s.url())
                .header("authorization", format!("Bearer {ALICE}"))
                .header("mcp-session-id", sid)
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            streams.push(r);
        }
        streams
    });
    let third = s.post(Some(ALICE), None, &[], &init);
    assert_eq!(third.status, 429, "{third:?}");
    assert_eq!(s.session_pids().len(), 2);
    // Another token has its own allowance.
    let _c = s.initialize(BOB);
    assert_eq!(s.session_pids().len(), 3);
    // Once the sessions are quiet, a new one takes the place of the least
    // recently used (a client that left without DELETE must not hold its
    // place until it expires): `a` is ended (404), `b` still serves.
    drop(streams);
    let d = wait_until("the closed streams make the sessions quiet, and a new one takes a place", || {
        let r = s.post(Some(ALICE), None, &[], &init);
        assert!(r.status == 200 || r.status == 429, "{r:?}");
        (r.status == 200).then(|| r.headers.get("mcp-session-id").unwrap().to_str().unwrap().to_owned())
    });
    let n = s.post(
        Some(ALICE),
        Some(&d),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(n.status, 202);
    assert_eq!(s.call(ALICE, &a, 3, "list_categories", json!({})).status, 404, "the least recently used session ended");
    assert_eq!(s.call(ALICE, &b, 4, "list_categories", json!({})).status, 200);
    assert_eq!(s.call(ALICE, &d, 5, "list_categories", json!({})).status, 200);
    wait_until("alice is back to two trees (and bob's one)", || (s.session_pids().len() == 3).then_some(()));
    assert_eq!(s.delete(ALICE, &d), 200);
    // Requests (open streams included) are limited per token too.
    drop(s);
    let s = Server::start(&dir, &[], &["--max-requests-per-token", "1"]);
    let sid = s.initialize(ALICE);
    let (get, second) = s.rt.block_on(async {
        let get = s
            .client
            .get(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        let second = s
            .client
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
            .send()
            .await
            .unwrap();
        (get, second.status().as_u16())
    });
    assert_eq!(get.status().as_u16(), 200);
    assert_eq!(second, 429, "the open stream holds the token's only request");
    drop(get);
    wait_until("the closed stream frees the place", || {
        (s.call(ALICE, &sid, 3, "list_categories", json!({})).status == 200).then_some(())
    });
    // A body that is not JSON, and a client that takes neither JSON nor SSE.
    let form = s.rt.block_on(async {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("content-type", "text/plain")
            .body("{}")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(form, 415);
    let html = s.rt.block_on(async {
        s.client
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "text/html")
            .body(r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(html, 406);
    // A body over the limit is refused before it is read.
    let mut conn = std::net::TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        9 * 1024 * 1024
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut status = String::new();
    BufReader::new(conn).read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
}

/// A raw HTTP/1.1 request: `head` (request line and header lines, each
/// without its CRLF) with the `Host` header added, then the first
/// `body_prefix` bytes of its body.
fn raw_request(addr: &str, head: &[&str], body_prefix: &[u8]) -> std::net::TcpStream {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let mut text = format!("{}\r\nHost: {addr}\r\n", head[0]);
    for h in &head[1..] {
        text.push_str(h);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    conn.write_all(text.as_bytes()).unwrap();
    conn.write_all(body_prefix).unwrap();
    conn
}

/// The status and body of the response on `conn` (read until its
/// `Content-Length`).
fn raw_response(conn: &std::net::TcpStream) -> (u16, String) {
    use std::io::Read;
    conn.set_read_timeout(Some(SAFETY)).unwrap();
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The responses on `conn`, until it is closed (a reset counts as closed);
/// interim (1xx) responses are skipped. At most `limit` responses are read.
fn read_responses(r: &mut BufReader<&std::net::TcpStream>, limit: usize) -> Vec<(u16, String)> {
    use std::io::Read;
    let mut out = Vec::new();
    let gone =
        |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe);
    while out.len() < limit {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if gone(&e) => break,
            Err(e) => panic!("reading a response after {out:?}: {e}"),
        }
        let status: u16 =
            line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
        let (mut len, mut chunked) = (0usize, false);
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h.trim().is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
            if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = true;
            }
        }
        if (100..200).contains(&status) {
            continue;
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                r.read_line(&mut size).unwrap();
                let n = usize::from_str_radix(size.trim(), 16).unwrap();
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            body.resize(len, 0);
            r.read_exact(&mut body).unwrap();
        }
        out.push((status, String::from_utf8_lossy(&body).into_owned()));
    }
    out
}

/// What the front must do with one framing variant.
#[derive(Debug)]
enum Framing {
    /// Answer each of the variant's requests (these statuses), then the
    /// sentinel request that follows them on the connection.
    Served(&'static [u16]),
    /// Answer its first request with this status and close the connection
    /// (nothing after it is read as a request).
    Closed(u16),
    /// Refuse a head over 64 KiB: 431 (or a reset while it is still being
    /// sent) and the connection closed.
    TooLarge,
}

/// Strict HTTP/1.1 parsing (RFC 9112 §2.2, §3.2, §6.1, §6.3, §7.1), over raw
/// TCP: each variant is sent as it is (those that are refused followed by a
/// request where a reader that framed them differently would find one: an
/// unauthenticated DELETE, whose 401 would show it was read), then a
/// sentinel request that closes the connection. Ambiguous framing is
/// refused and closes the connection; forms a recipient may accept (bare LF
/// line ends, RFC 9112 §2.2; whitespace before a chunk size's end, which
/// hyper reads as the size) are read one way only, the body being exactly
/// `{}` (a 400 for no message, not a parse error) and the sentinel answered
/// next; the 64 KiB header limit is exact.
#[test]
fn http1_framing_is_strict_and_nothing_is_smuggled() {
    let dir = temp_dir("framing");
    let s = Server::start(&dir, &[], &["--allowed-origin", "https://agent.example"]);
    let host = s.addr.clone();
    let auth = format!("Authorization: Bearer {ALICE}");
    let smuggled = format!("DELETE /mcp HTTP/1.1\r\nHost: {host}\r\nMcp-Session-Id: x\r\n\r\n");
    let sentinel = format!("GET /end HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    // A request with `extra` header lines and `body` (raw: the framing is the variant's).
    let post = |extra: &[&str], body: &str| {
        let mut head = format!("POST /mcp HTTP/1.1\r\nHost: {host}\r\n{auth}\r\nContent-Type: application/json\r\n");
        for h in extra {
            head.push_str(h);
            head.push_str("\r\n");
        }
        format!("{head}\r\n{body}")
    };
    let cl = |body: &str| format!("Content-Length: {}", body.len());
    let te = "Transfer-Encoding: chunked";
    // `{}` in one chunk: a body the front reads, then refuses as no message (400).
    let chunked_body = "2\r\n{}\r\n0\r\n\r\n";
    let head_of = |extra: &[String]| {
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\n{auth}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        );
        for h in extra {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head + "\r\n"
    };
    let padded = |total: usize| {
        let base = head_of(&["X-Pad: ".to_owned()]).len();
        head_of(&[format!("X-Pad: {}", "p".repeat(total - base))])
    };
    let exactly = padded(64 * 1024);
    assert_eq!(exactly.len(), 64 * 1024);
    let over = padded(64 * 1024 + 1);
    let many: Vec<String> = (0..60).map(|i| format!("X-Pad-{i:02}: {}", "q".repeat(1600))).collect();
    let variants: Vec<(&str, String, Framing)> = vec![
        ("Content-Length", post(&[&cl("{}")], "{}"), Framing::Served(&[400])),
        ("two requests pipelined", post(&[&cl("{}")], "{}") + &post(&[&cl("{}")], "{}"), Framing::Served(&[400, 400])),
        ("leading empty line", format!("\r\n{}", post(&[&cl("{}")], "{}")), Framing::Served(&[400])),
        ("Expect: 100-continue", post(&[&cl("{}"), "Expect: 100-continue"], "{}"), Framing::Served(&[400])),
        ("Content-Length twice, same", post(&[&cl("{}"), &cl("{}")], "{}"), Framing::Served(&[400])),
        (
            "Content-Length twice, different",
            post(&[&cl("{}"), "Content-Length: 3"], "{}") + &smuggled,
            Framing::Closed(400),
        ),
        ("Content-Length +2", post(&["Content-Length: +2"], "{}") + &smuggled, Framing::Closed(400)),
        ("Content-Length 0x2", post(&["Content-Length: 0x2"], "{}") + &smuggled, Framing::Closed(400)),
        (
            "Content-Length then chunked",
            post(&["Content-Length: 40", te], &format!("0\r\n\r\n{smuggled}")),
            Framing::Closed(400),
        ),
        (
            "chunked then Content-Length",
            post(&[te, "Content-Length: 40"], &format!("0\r\n\r\n{smuggled}")),
            Framing::Closed(400),
        ),
        ("chunked", post(&[te], chunked_body), Framing::Served(&[400])),
        ("chunked, upper case", post(&["Transfer-Encoding: CHUNKED"], chunked_body), Framing::Served(&[400])),
        (
            "chunked, chunked",
            post(&["Transfer-Encoding: chunked, chunked"], chunked_body) + &smuggled,
            Framing::Closed(400),
        ),
        ("chunked on two lines", post(&[te, te], chunked_body) + &smuggled, Framing::Closed(400)),
        ("gzip, chunked", post(&["Transfer-Encoding: gzip, chunked"], chunked_body) + &smuggled, Framing::Closed(400)),
        ("identity", post(&["Transfer-Encoding: identity", &cl("{}")], "{}") + &smuggled, Framing::Closed(400)),
        ("xchunked", post(&["Transfer-Encoding: xchunked", &cl("{}")], "{}") + &smuggled, Framing::Closed(400)),
        (
            "chunked over HTTP/1.0",
            post(&[te], chunked_body).replacen("HTTP/1.1", "HTTP/1.0", 1) + &smuggled,
            Framing::Closed(400),
        ),
        ("chunk size then spaces", post(&[te], "2  \r\n{}\r\n0\r\n\r\n"), Framing::Served(&[400])),
        ("chunk size then a tab", post(&[te], "2\t\r\n{}\r\n0\r\n\r\n"), Framing::Served(&[400])),
        ("chunk extension", post(&[te], "2;x=y\r\n{}\r\n0\r\n\r\n"), Framing::Served(&[400])),
        ("chunk size with a bare LF", post(&[te], &format!("2\n{{}}\r\n0\r\n\r\n{smuggled}")), Framing::Closed(400)),
        ("chunk size 2 0", post(&[te], &format!("2 0\r\n{{}}\r\n0\r\n\r\n{smuggled}")), Framing::Closed(400)),
        (
            "chunk longer than its size",
            post(&[te], &format!("2\r\n{{}}xx\r\n0\r\n\r\n{smuggled}")),
            Framing::Closed(400),
        ),
        ("chunk size overflow", post(&[te], &format!("fffffffffffffffff\r\n{smuggled}")), Framing::Closed(400)),
        ("chunked trailer", post(&[te], "2\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n"), Framing::Served(&[400])),
        ("bare LF line ends", post(&[&cl("{}")], "{}").replace("\r\n", "\n"), Framing::Served(&[400])),
        ("CRLF and LF mixed", post(&[&cl("{}")], "{}").replacen("\r\n", "\n", 2), Framing::Served(&[400])),
        ("bare CR in a value", post(&[&cl("{}"), "X-A: a\rb"], "{}") + &smuggled, Framing::Closed(400)),
        ("obsolete line folding", post(&[&cl("{}"), "X-Folded: a", " b"], "{}") + &smuggled, Framing::Closed(400)),
        ("space before the colon", post(&["Content-Length : 2"], "{}") + &smuggled, Framing::Closed(400)),
        ("NUL in a value", post(&[&cl("{}"), "X-A: a\0b"], "{}") + &smuggled, Framing::Closed(400)),
        ("no Host", post(&[&cl("{}")], "{}").replacen(&format!("Host: {host}\r\n"), "", 1), Framing::Closed(400)),
        ("empty Host", post(&[&cl("{}")], "{}").replacen(&format!("Host: {host}"), "Host:", 1), Framing::Closed(400)),
        ("Host good then evil", post(&[&cl("{}"), "Host: evil.example"], "{}"), Framing::Closed(400)),
        (
            "Host evil then good",
            post(&[&cl("{}")], "{}").replacen("Host: ", "Host: evil.example\r\nHost: ", 1),
            Framing::Closed(400),
        ),
        (
            "Origin twice",
            post(&[&cl("{}"), "Origin: https://agent.example", "Origin: https://evil.example"], "{}"),
            Framing::Closed(403),
        ),
        ("Authorization twice", post(&[&cl("{}"), "Authorization: Bearer nobody"], "{}"), Framing::Closed(400)),
        (
            "Mcp-Session-Id twice",
            post(&[&cl("{}"), "Mcp-Session-Id: a", "Mcp-Session-Id: b"], "{}"),
            Framing::Closed(400),
        ),
        (
            "absolute-form target",
            post(&[&cl("{}")], "{}").replacen("POST /mcp", &format!("POST http://{host}/mcp"), 1),
            Framing::Served(&[400]),
        ),
        (
            "absolute-form, another host",
            post(&[&cl("{}")], "{}").replacen("POST /mcp", "POST http://evil.example/mcp", 1),
            Framing::Closed(400),
        ),
        ("Upgrade: h2c", post(&[&cl("{}"), "Connection: Upgrade", "Upgrade: h2c"], "{}"), Framing::Served(&[400])),
        ("headers of exactly 64 KiB", exactly.clone() + "{}", Framing::Served(&[400])),
        ("headers of 64 KiB and a byte", over + "{}", Framing::TooLarge),
        ("one header of 114 KB", head_of(&[format!("X-Big: {}", "b".repeat(114_000))]) + "{}", Framing::TooLarge),
        ("a 96 KB block of headers", head_of(&many) + "{}", Framing::TooLarge),
    ];
    let mut failures = Vec::new();
    for (name, bytes, want) in &variants {
        let conn = std::net::TcpStream::connect(&s.addr).unwrap();
        conn.set_read_timeout(Some(SAFETY)).unwrap();
        let mut writer = &conn;
        let _ = writer.write_all(bytes.as_bytes());
        let mut r = BufReader::new(&conn);
        let mut got = read_responses(&mut r, 1);
        // The sentinel, then whatever else the connection carries.
        let sent = writer.write_all(sentinel.as_bytes()).is_ok();
        got.extend(read_responses(&mut r, 8));
        let statuses: Vec<u16> = got.iter().map(|(st, _)| *st).collect();
        let ok = match want {
            _ if statuses.contains(&401) => false,
            // (Each 400 of a served variant is the body `{}` read whole.)
            Framing::Served(each) => {
                statuses == [each.to_vec(), vec![404]].concat()
                    && got.iter().filter(|(st, _)| *st == 400).all(|(_, b)| b.contains("Invalid Request"))
            }
            Framing::Closed(status) => statuses == [*status],
            Framing::TooLarge => statuses.is_empty() || statuses == [431],
        };
        if !ok {
            failures.push(format!("{name}: want {want:?}, got {got:?} (sentinel sent: {sent})"));
        }
    }
    assert!(failures.is_empty(), "{} of {} variants:\n{}", failures.len(), variants.len(), failures.join("\n"));
    // The refusals say why, for the two Host and two Origin cases.
    let conn = std::net::TcpStream::connect(&s.addr).unwrap();
    (&conn).write_all(post(&[&cl("{}"), "Host: evil.example"], "{}").as_bytes()).unwrap();
    let got = read_responses(&mut BufReader::new(&conn), 2);
    assert!(got[0].1.contains("more than one Host"), "{got:?}");
}

/// The front's peak RSS stays under what README's Limits table states for
/// it, under the largest request load the limits allow: every token's 32
/// requests at once, each an 8 MiB body. Request bodies count against one
/// budget (64 MiB, at most half of it for one token): beyond a token's
/// share the answer is 429, beyond the budget 503, each with a body that
/// says so.
#[test]
fn the_fronts_memory_stays_under_its_stated_limit() {
    /// README, Limits: "the HTTP front's memory".
    const FRONT_PEAK_MIB: u64 = 400;
    const MIB: usize = 1024 * 1024;
    let dir = temp_dir("memory");
    let s = Server::start(&dir, &[], &[]);
    let modern_head = |token: &str, len: usize| {
        [
            "POST /mcp HTTP/1.1".to_owned(),
            format!("Authorization: Bearer {token}"),
            "Content-Type: application/json".to_owned(),
            "Accept: application/json, text/event-stream".to_owned(),
            format!("MCP-Protocol-Version: {MODERN}"),
            "Mcp-Method: tools/call".to_owned(),
            "Mcp-Name: get_action".to_owned(),
            format!("Content-Length: {len}"),
        ]
    };
    let raw = |token: &str, len: usize, prefix: &[u8]| {
        let head = modern_head(token, len);
        raw_request(&s.addr, &head.iter().map(String::as_str).collect::<Vec<_>>(), prefix)
    };
    // Bodies that are still arriving hold their share: four of alice's
    // fill her 32 MiB, four of bob's the rest of the budget.
    let mut trickling = Vec::new();
    for _ in 0..4 {
        trickling.push(raw(ALICE, 8 * MIB, b"{"));
    }
    // A probe: 1 MiB of a body that is not a message (400 once read).
    let probe: Vec<u8> = [&b"{}"[..], &vec![b' '; MIB - 2]].concat();
    let (status, body) = wait_until("alice's share is held", || {
        let r = raw_response(&raw(ALICE, MIB, &probe));
        if r.0 == 429 { Ok(r) } else { Err(r) }
    });
    assert_eq!(status, 429);
    assert!(body.contains("request data") && body.contains("this token"), "{body}");
    for _ in 0..4 {
        trickling.push(raw(BOB, 8 * MIB, b"{"));
    }
    let (status, body) = wait_until("the whole budget is held", || {
        let r = raw_response(&raw(ALICE2, MIB, &probe));
        if r.0 == 503 { Ok(r) } else { Err(r) }
    });
    assert!(body.contains("too much request data") && body.contains("retry"), "{status} {body}");
    drop(trickling);
    wait_until("the budget is free again", || {
        let small = raw(ALICE2, 2, b"{}");
        (raw_response(&small).0 == 400).then_some(())
    });
    // The largest load: 3 tokens x 32 requests of 8 MiB at once.
    let mut params = json!({"name": "get_action", "arguments": {"name": "get_status", "pad": ""}});
    params["_meta"] = modern_meta();
    let mut msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let skeleton = serde_json::to_vec(&msg).unwrap().len();
    msg["params"]["arguments"]["pad"] = json!("x".repeat(8 * MIB - skeleton));
    // One copy for every request (a static slice is sent without copying).
    let body: &'static [u8] = Box::leak(serde_json::to_vec(&msg).unwrap().into_boxed_slice());
    assert_eq!(body.len(), 8 * MIB);
    let statuses = s.rt.block_on(async {
        let mut all = Vec::new();
        for token in [ALICE, ALICE2, BOB] {
            for _ in 0..32 {
                let req = s
                    .client
                    .post(s.url())
                    .header("authorization", format!("Bearer {token}"))
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", MODERN)
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", "get_action")
                    .body(body);
                all.push(tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) }));
            }
        }
        let mut statuses = Vec::new();
        for a in all {
            statuses.push(a.await.unwrap().unwrap());
        }
        statuses
    });
    let count = |c: u16| statuses.iter().filter(|s| **s == c).count();
    assert!(statuses.iter().all(|c| [200, 429, 503].contains(c)), "{statuses:?}");
    assert!(count(200) > 0, "{statuses:?}");
    let peak_kib: u64 = status_field(s.front_pid(), "VmHWM").trim_end_matches(" kB").parse().unwrap();
    assert!(
        peak_kib < FRONT_PEAK_MIB * 1024,
        "the front peaked at {} MiB ({} answered, {} 429, {} 503)",
        peak_kib / 1024,
        count(200),
        count(429),
        count(503)
    );
}

#[test]
fn idle_sessions_expire() {
    let dir = temp_dir("idle");
    let s = Server::start(&dir, &[], &["--idle-timeout", "1"]);
    let sid = s.initialize(ALICE);
    let tree = s.session_pids()[0];
    wait_until("the idle session's tree is reaped", || (!alive(tree)).then_some(()));
    assert_eq!(s.call(ALICE, &sid, 2, "list_categories", json!({})).status, 404);
}

fn refused(env: &[(&str, &str)], args: &[&str]) -> String {
    let out = command(env, args).stdin(Stdio::null()).bounded_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn unsafe_configurations_are_refused_with_one_line() {
    let dir = temp_dir("refuse");
    let tokens = token_file(&dir);
    let t = tokens.to_str().unwrap();
    let e = refused(&[], &["serve-http", "--listen", "0.0.0.0:0", "--http-token-file", t]);
    assert!(e.contains("non-loopback") && e.contains("--allow-remote"), "{e}");
    let e = refused(&[], &["serve-http", "--listen", "0.0.0.0:0", "--http-token-file", t, "--allow-remote"]);
    assert!(e.contains("TLS"), "{e}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = refused(&[], &["serve-http", "--listen", "127.0.0.1:0", "--http-token-file", t]);
    assert!(e.contains("chmod") && !e.contains(ALICE), "{e}");
    let empty = dir.join("empty");
    write_private(&empty, "# nothing\n");
    let e = refused(&[], &["serve-http", "--listen", "127.0.0.1:0", "--http-token-file", empty.to_str().unwrap()]);
    assert!(e.contains("no token"), "{e}");
    let short = dir.join("short");
    write_private(&short, "alice:short\n");
    let e = refused(&[], &["serve-http", "--listen", "127.0.0.1:0", "--http-token-file", short.to_str().unwrap()]);
    assert!(e.contains("line 1") && !e.contains("short\n"), "{e}");
}

/// A write in flight when its client disappears: the tree is reaped and the
/// audit log has the write's result with outcome unknown, naming the
/// principal on every record.
#[test]
fn a_client_that_disappears_mid_write_has_its_tree_reaped_and_the_write_audited_unknown() {
    let dir = temp_dir("disappear");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    fake.fake.set_fault("send_group_msg", snowluma_fake::Fault::Hang);
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    let s = Server::start(&dir, &env, &["--idle-timeout", "1"]);
    // A raw modern request on its own connection, then the connection drops:
    // that cancels the call; the tree, idle then, expires.
    let mut params = json!({"name": "invoke_action", "arguments": {"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}});
    params["_meta"] = modern_meta();
    let body =
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})).unwrap();
    let mut conn = std::net::TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\nMcp-Method: tools/call\r\nMcp-Name: invoke_action\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&body).unwrap();
    wait_until("SnowLuma received the write", || {
        fake.fake.requests().iter().any(|r| r.action.as_deref() == Some("send_group_msg")).then_some(())
    });
    let tree = s.session_pids();
    assert_eq!(tree.len(), 1);
    let mut pids = descendants(tree[0]);
    pids.push(tree[0]);
    assert!(pids.len() >= 3, "supervisor, spawner and workers: {pids:?}");
    drop(conn);
    wait_until("the tree of the vanished client is reaped", || {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
    let records: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let result = records
        .iter()
        .find(|r| r["phase"] == "result")
        .unwrap_or_else(|| panic!("a result record: {records:?}\n{}", s.stderr_text()));
    assert_eq!(result["outcome"], "unknown", "{result}");
    for r in &records {
        assert_eq!(r["principal"]["via"], "http", "{r}");
        assert_eq!(r["principal"]["token_id"], "alice", "{r}");
        assert_eq!(r["principal"]["peer"], "127.0.0.1", "modern: the client host; {r}");
        assert!(r.get("peer").is_none(), "not the launcher's credentials");
    }
    assert!(!std::fs::read_to_string(&log).unwrap().contains(ALICE));
    // The session could not see the principal variable once started.
    assert!(s.front_pid() > 0);
}

/// A test CA and a certificate for localhost and 127.0.0.1 signed by it
/// (openssl): (certificate, key with mode 600, CA).
fn test_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (cert, key, ca) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    let ext = dir.join("ext");
    std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").current_dir(dir).args(args).stdin(Stdio::null()).bounded_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[&["req", "-x509", "-days", "2", "-subj", "/CN=e2e test CA", "-keyout", "ca.key", "-out", "ca.pem"][..], &ec]
            .concat(),
    );
    openssl(&[&["req", "-subj", "/CN=localhost", "-keyout", "key.pem", "-out", "leaf.csr"][..], &ec].concat());
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext",
        "-out",
        "cert.pem",
    ]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert, key, ca)
}

#[test]
fn tls_serves_with_the_configured_certificate() {
    let dir = temp_dir("tls");
    let (cert, key, ca) = test_certificate(&dir);
    let root = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
    let s = Server::start_with(
        &dir,
        &[],
        &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
        Some(root),
    );
    let d = s.modern(ALICE, 1, "server/discover", None, json!({}));
    assert_eq!(d.status, 200, "{d:?}");
    let sid = s.initialize(ALICE);
    assert_eq!(s.call(ALICE, &sid, 2, "list_categories", json!({})).status, 200);
    // Plain HTTP on the TLS port gets nothing.
    let plain = s.rt.block_on(async {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("http://{}/mcp", s.addr))
            .body("{}")
            .send()
            .await
    });
    assert!(plain.is_err() || plain.unwrap().status().as_u16() != 200);
}

/// A TCP connection to `dst` from the loopback address `src` (any address of
/// 127.0.0.0/8 is this host's, so several client hosts can be played);
/// blocking.
fn connect_from(
    rt: &tokio::runtime::Runtime,
    src: std::net::Ipv4Addr,
    dst: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    let stream = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(std::net::SocketAddr::new(src.into(), 0))?;
        sock.connect(dst).await
    })?;
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// How many client connections the front holds (its sockets but the
/// listener, the control socket and the sessions').
fn front_connections(front: i32, sessions: usize) -> usize {
    let sockets = std::fs::read_dir(format!("/proc/{front}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
        .count();
    sockets.saturating_sub(2 + sessions)
}

/// Clients without a token hold every place the front has, with idle
/// connections (over TLS: some stuck in the handshake, some idle after it)
/// and opening new ones as fast as the front closes them: token holders
/// still get through, every time, and the front says so in a bounded number
/// of lines.
fn token_holders_get_through_a_flood_of_idle_connections(tls: bool) {
    let started = std::time::Instant::now();
    let dir = temp_dir(if tls { "door-tls" } else { "door" });
    let (s, roots) = if tls {
        let (cert, key, ca) = test_certificate(&dir);
        let pem = std::fs::read(&ca).unwrap();
        let args = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
        (Server::start_with(&dir, &[], &args, Some(reqwest::Certificate::from_pem(&pem).unwrap())), Some(pem))
    } else {
        (Server::start(&dir, &[], &[]), None)
    };
    let front = s.front_pid();
    let dst: std::net::SocketAddr = s.addr.parse().unwrap();
    let tls_config = roots.as_ref().map(|pem| {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
            roots.add(c.unwrap()).unwrap();
        }
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    });
    // The flood: twelve client hosts other than 127.0.0.1 (each may hold 128
    // connections without a token), holding the last
    // 1000 connections they opened (more than the front's 512 places).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood = {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let mut held = std::collections::VecDeque::new();
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let src = std::net::Ipv4Addr::new(127, 0, 0, 2 + (n % 12) as u8);
                n += 1;
                let Ok(mut sock) = connect_from(&rt, src, dst) else { continue };
                match (&tls_config, n % 3) {
                    // A TLS handshake completed, then nothing.
                    (Some(config), 0) => {
                        let mut c =
                            rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
                        sock.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
                        while c.is_handshaking() {
                            if c.complete_io(&mut sock).is_err() {
                                break;
                            }
                        }
                    }
                    // Half a request line (plain), or half a TLS hello.
                    (_, 1) => {
                        let _ = sock.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127");
                    }
                    // Nothing at all.
                    _ => {}
                }
                held.push_back(sock);
                if held.len() > 1000 {
                    held.pop_front();
                }
                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        })
    };
    wait_until("the idle connections take every place the front has", || {
        let n = front_connections(front, 0);
        if n >= 512 { Ok(()) } else { Err(n) }
    });
    // Token holders, each request on a new connection.
    let mut builder = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0);
    if let Some(pem) = &roots {
        builder = builder.tls_certs_only([reqwest::Certificate::from_pem(pem).unwrap()]);
    }
    let client = builder.build().unwrap();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": modern_meta()}});
    let statuses: Vec<Result<u16, String>> = (0..30)
        .map(|_| {
            s.rt.block_on(async {
                client
                    .post(s.url())
                    .header("authorization", format!("Bearer {ALICE}"))
                    .header("content-type", "application/json")
                    .header("accept", "application/json")
                    .header("mcp-protocol-version", MODERN)
                    .header("mcp-method", "server/discover")
                    .body(serde_json::to_vec(&list).unwrap())
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .map_err(|e| format!("{e:?}"))
            })
        })
        .collect();
    // The flood still holds the front after them. One sample can catch the
    // instant between an idle connection's eviction and the flood's next
    // one (a run saw 498), so the best of a few samples over ~50 ms (the
    // flood opens one connection per 300 µs) is what is asserted.
    let still_full = (0..10)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            front_connections(front, 1)
        })
        .max()
        .unwrap_or(0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    join(flood, "the flood stops");
    assert!(statuses.iter().all(|r| r == &Ok(200)), "{statuses:?}");
    assert!(still_full >= 500, "the flood still held the front: {still_full}");
    // One warning line per 10 s at most, however many connections came.
    let elapsed = started.elapsed().as_secs() as usize;
    let warnings = s.stderr_text().matches("too many connections").count();
    let opened = opened.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("the flood opened {opened} connections; {warnings} warning lines in {elapsed} s");
    assert!(
        warnings >= 1 && warnings <= elapsed / 10 + 2,
        "{warnings} warnings in {elapsed} s for {opened} connections"
    );
}

#[test]
fn token_holders_get_through_a_flood_of_idle_connections_over_http() {
    token_holders_get_through_a_flood_of_idle_connections(false);
}

#[test]
fn token_holders_get_through_a_flood_of_idle_connections_over_tls() {
    token_holders_get_through_a_flood_of_idle_connections(true);
}

/// The front as it runs: confined (seccomp, no new privileges, no
/// capabilities), with an empty environment, and a Unix-socket listener
/// whose clients are named by their credentials.
#[test]
fn the_front_is_confined_and_serves_a_unix_socket() {
    let dir = temp_dir("unix");
    let tokens = token_file(&dir);
    let sock = dir.join("mcp.sock");
    // A socket left behind by a server that is gone is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let mut child = command(
        &[("SNOWLUMA_MCP_TOKEN", "snowluma-secret-token-value")],
        &["serve-http", "--listen", sock.to_str().unwrap(), "--http-token-file", tokens.to_str().unwrap()],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // A failed assertion must not leave the server running.
    struct StopOnPanic(i32);
    impl Drop for StopOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::SIGTERM);
            }
        }
    }
    let _stop = StopOnPanic(child.id() as i32);
    wait_until("the socket exists", || sock.exists().then_some(()));
    let launcher = child.id() as i32;
    let front = wait_until("the front runs", || {
        children(launcher).into_iter().find(|p| cmdline(*p).contains("__snowluma-http-front"))
    });
    let body = serde_json::to_vec(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": modern_meta()}}),
    )
    .unwrap();
    let mut conn = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nAccept: application/json\r\nMCP-Protocol-Version: {MODERN}\r\nMcp-Method: server/discover\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&body).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut conn, &mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // It has served a request, so it has confined itself (it does so
    // before it accepts; right after its exec it is not confined yet).
    let status = std::fs::read_to_string(format!("/proc/{front}/status")).unwrap();
    for want in ["Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000"] {
        assert!(status.contains(want), "{want}: {status}");
    }
    let environ = std::fs::read(format!("/proc/{front}/environ")).unwrap_or_default();
    assert!(environ.is_empty(), "the front starts with an empty environment");
    assert!(text.contains("supportedVersions"), "{text}");
    // Neither the SnowLuma token nor an access token nobody presented is in
    // the front's memory (it got digests); the session tree's supervisor
    // scrubbed its copy of the SnowLuma token, as in stdio mode.
    assert_eq!(memory_contains(front, b"snowluma-secret-token-value"), Some(false));
    assert_eq!(memory_contains(front, ALICE2.as_bytes()), Some(false));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher), nix::sys::signal::SIGTERM).unwrap();
    let st = wait_exit(&mut child, "serve-http stops on SIGTERM");
    assert!(st.success(), "{st:?}");
    assert!(!sock.exists(), "the socket is removed at exit");
    assert!(!alive(front));
}

/// The Unix socket gets its permission bits from `--socket-mode` (default
/// 660), not from the umask serve-http was started with.
#[test]
fn the_unix_socket_has_the_configured_mode_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = temp_dir("sockmode");
    let tokens = token_file(&dir);
    let sock = dir.join("mcp.sock");
    for (umask, extra, want) in
        [(0o000, None, 0o660), (0o077, None, 0o660), (0o000, Some("600"), 0o600), (0o022, Some("0666"), 0o666)]
    {
        let mut args =
            vec!["serve-http", "--listen", sock.to_str().unwrap(), "--http-token-file", tokens.to_str().unwrap()];
        if let Some(mode) = extra {
            args.extend(["--socket-mode", mode]);
        }
        let mut cmd = command(&[], &args);
        // SAFETY: only umask (async-signal-safe) runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(umask));
                Ok(())
            });
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        wait_until("serve-http says where it listens", || rx.try_recv().ok());
        let mode = std::fs::symlink_metadata(&sock).unwrap().permissions().mode() & 0o7777;
        nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
        let st = wait_exit(&mut child, "serve-http stops on SIGTERM");
        assert_eq!(mode, want, "umask {umask:o}, --socket-mode {extra:?}: {mode:o}");
        assert!(st.success(), "{st:?}");
        assert!(!sock.exists(), "the socket is removed at exit");
    }
    let t = tokens.to_str().unwrap();
    for bad in ["8", "1777", "rw-rw----"] {
        let e = refused(
            &[],
            &["serve-http", "--listen", sock.to_str().unwrap(), "--http-token-file", t, "--socket-mode", bad],
        );
        assert!(e.contains("--socket-mode"), "{e}");
        assert!(!sock.exists(), "nothing is created for a refused mode");
    }
}

/// Legacy server requests travel on the SSE stream of the call that needs
/// them, and the client's answer (a POST of a response) reaches the session.
#[test]
fn a_legacy_elicitation_round_trips_over_the_call_stream() {
    let dir = temp_dir("elicit");
    let fake = Fake::start(Some("t0k"));
    let url = fake.fake.url();
    let env = [("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "write"), ("SNOWLUMA_MCP_TOKEN", "t0k")];
    let s = Server::start(&dir, &env, &[]);
    let sid = s.initialize_with(ALICE, json!({"elicitation": {"form": {}}}));
    let call = json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call", "params": {
        "name": "invoke_action_with_input",
        "arguments": {"action": "send_group_msg", "params": {"group_id": 20001}}}});
    let final_msg = s.rt.block_on(async {
        let mut resp = s
            .client
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "application/json, text/event-stream")
            .body(serde_json::to_vec(&call).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers().get("content-type").unwrap(), "text/event-stream");
        let mut buf = String::new();
        let mut answered = false;
        loop {
            let chunk = resp.chunk().await.unwrap().expect("the stream ends after the response");
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
                let msg: Value = serde_json::from_str(data).unwrap();
                if msg["method"] == "elicitation/create" {
                    assert!(!answered);
                    answered = true;
                    let answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {
                        "action": "accept", "content": {"params_json": "{\"message\":\"Hello\"}"}}});
                    let r = s
                        .client
                        .post(s.url())
                        .header("authorization", format!("Bearer {ALICE}"))
                        .header("mcp-session-id", &sid)
                        .header("mcp-protocol-version", "2025-11-25")
                        .body(serde_json::to_vec(&answer).unwrap())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 202);
                } else if msg.get("result").is_some() || msg.get("error").is_some() {
                    assert!(answered, "the answer came first");
                    return msg;
                }
            }
        }
    });
    assert_eq!(final_msg["id"], "call-1", "the client's id");
    assert!(!is_error(&final_msg["result"]), "{final_msg}");
    let sent: Vec<Value> = fake
        .fake
        .requests()
        .iter()
        .filter(|r| r.action.as_deref() == Some("send_group_msg"))
        .filter_map(|r| r.json())
        .collect();
    assert_eq!(sent, [json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}})]);
}

/// Concurrent legacy calls that each need input: every `elicitation/create`
/// travels on the stream of the call that asked, also while a JSON-only
/// request is the newest in flight (which must never get another call's
/// server request: its client cannot read one), and every call completes
/// with the answers given on its own stream.
#[test]
fn concurrent_legacy_elicitations_each_reach_the_call_that_asked() {
    const CALLS: usize = 8;
    let dir = temp_dir("elicit-many");
    let fake = Fake::start(Some("t0k"));
    fake.fake.set_fault("get_status", snowluma_fake::Fault::Hang);
    let url = fake.fake.url();
    let env = [("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "read"), ("SNOWLUMA_MCP_TOKEN", "t0k")];
    let s = Server::start(&dir, &env, &[]);
    let sid = s.initialize_with(ALICE, json!({"elicitation": {"form": {}}}));
    let post = {
        let (client, url, sid) = (s.client.clone(), s.url(), sid.clone());
        move |body: &Value, accept: &str| {
            client
                .post(&url)
                .header("authorization", format!("Bearer {ALICE}"))
                .header("mcp-session-id", &sid)
                .header("mcp-protocol-version", "2025-11-25")
                .header("accept", accept)
                .body(serde_json::to_vec(body).unwrap())
                .send()
        }
    };
    let answer = |id: &Value, fields: Value| json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept", "content": {"params_json": fields.to_string()}}});
    let results = s.rt.block_on(async {
        let (asked_tx, mut asked_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let (go_tx, go_rx) = tokio::sync::watch::channel(false);
        let mut calls = Vec::new();
        for i in 0..CALLS {
            let (post, asked_tx, mut go) = (post.clone(), asked_tx.clone(), go_rx.clone());
            calls.push(tokio::spawn(async move {
                let call = json!({"jsonrpc": "2.0", "id": format!("call-{i}"), "method": "tools/call", "params": {
                    "name": "query_action_with_input", "arguments": {"action": "get_group_member_info", "params": {}}}});
                let mut resp = post(&call, "application/json, text/event-stream").await.unwrap();
                assert_eq!(resp.headers().get("content-type").unwrap(), "text/event-stream");
                let mut buf = String::new();
                let mut asked = 0;
                // Bounded: two input requests, then the response ends the stream.
                loop {
                    let msg = next_sse(&mut resp, &mut buf).await;
                    if msg["method"] == "elicitation/create" {
                        asked += 1;
                        let fields = if asked == 1 {
                            // Answer only part of it once a JSON-only request
                            // is the newest in flight: the call asks again.
                            asked_tx.send(i).unwrap();
                            go.wait_for(|g| *g).await.unwrap();
                            json!({"group_id": 1000 + i})
                        } else {
                            json!({"user_id": 2000 + i})
                        };
                        let r = post(&answer(&msg["id"], fields), "application/json, text/event-stream").await.unwrap();
                        assert_eq!(r.status().as_u16(), 202);
                    } else if msg.get("result").is_some() || msg.get("error").is_some() {
                        return (i, asked, msg);
                    }
                }
            }));
        }
        let deadline = tokio::time::Instant::now() + SAFETY;
        for _ in 0..CALLS {
            tokio::time::timeout_at(deadline, asked_rx.recv())
                .await
                .expect("every call gets its first input request on its own stream");
        }
        // A JSON-only request that stays in flight (SnowLuma never answers).
        let hang = json!({"jsonrpc": "2.0", "id": "json-only", "method": "tools/call", "params": {
            "name": "query_action", "arguments": {"action": "get_status", "params": {}}}});
        let json_only = tokio::spawn(post(&hang, "application/json"));
        while !fake.fake.requests().iter().any(|r| r.action.as_deref() == Some("get_status")) {
            assert!(tokio::time::Instant::now() < deadline, "SnowLuma received the JSON-only request");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        go_tx.send(true).unwrap();
        let mut results = Vec::new();
        for c in calls {
            results.push(tokio::time::timeout_at(deadline, c).await.expect("every call completes").unwrap());
        }
        json_only.abort();
        results
    });
    for (i, asked, msg) in &results {
        assert_eq!(*asked, 2, "call {i}: both input requests on its stream");
        assert_eq!(msg["id"], format!("call-{i}"));
        assert!(!is_error(&msg["result"]), "{msg}");
    }
    // Each call was executed once, with the two answers given on its stream.
    let mut sent: Vec<(i64, i64)> = fake
        .fake
        .requests()
        .iter()
        .filter(|r| r.action.as_deref() == Some("get_group_member_info"))
        .filter_map(|r| r.json())
        .map(|j| (j["params"]["group_id"].as_i64().unwrap(), j["params"]["user_id"].as_i64().unwrap()))
        .collect();
    sent.sort();
    let want: Vec<(i64, i64)> = (0..CALLS as i64).map(|i| (1000 + i, 2000 + i)).collect();
    assert_eq!(sent, want);
}

/// A legacy client that disappears mid-write: its session is not tied to a
/// connection, so it ends when it has been idle for `--idle-timeout` (no
/// request and no stream open); the write is cancelled and audited unknown.
#[test]
fn a_legacy_client_that_vanishes_mid_write_is_expired_and_the_write_audited_unknown() {
    let dir = temp_dir("vanish-legacy");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    fake.fake.set_fault("send_group_msg", snowluma_fake::Fault::Hang);
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    let s = Server::start(&dir, &env, &["--idle-timeout", "1"]);
    let sid = s.initialize(BOB);
    let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "invoke_action", "arguments": {"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}}}))
    .unwrap();
    let mut conn = std::net::TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {BOB}\r\nMcp-Session-Id: {sid}\r\nMCP-Protocol-Version: 2025-11-25\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&body).unwrap();
    wait_until("SnowLuma received the write", || {
        fake.fake.requests().iter().any(|r| r.action.as_deref() == Some("send_group_msg")).then_some(())
    });
    let tree = s.session_pids()[0];
    let mut pids = descendants(tree);
    pids.push(tree);
    drop(conn);
    wait_until("the abandoned session's tree is reaped", || {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
    let records: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let result = records.iter().find(|r| r["phase"] == "result").expect("a result record");
    assert_eq!(result["outcome"], "unknown", "{result}");
    assert!(records.iter().all(|r| r["principal"]["token_id"] == "bob"), "{records:?}");
    assert_eq!(s.call(BOB, &sid, 3, "list_categories", json!({})).status, 404, "the session is gone");
}

/// The next SSE message on a streaming response (comments skipped).
async fn next_sse(resp: &mut reqwest::Response, buf: &mut String) -> Value {
    loop {
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                return serde_json::from_str(data).unwrap();
            }
        }
        let chunk = resp.chunk().await.unwrap().expect("the stream is open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// Event resources over HTTP: legacy updates on the GET stream, modern
/// updates on a `subscriptions/listen` stream opened on another connection
/// (tagged with the client's own listen id), and no session sees another's
/// resources.
#[test]
fn event_updates_reach_the_right_stream_and_no_other_session() {
    const SELF_ID: i64 = 10001;
    let dir = temp_dir("events");
    let fake = Fake::start(Some("ev-token"));
    let ev = fake.start_events(Some("ev-token"), SELF_ID);
    let (url, ws) = (fake.fake.url(), ev.url());
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_TOKEN", "ev-token"),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
    ];
    let s = Server::start(&dir, &env, &[]);
    // Legacy: subscribe, resources/subscribe, the GET stream gets the update.
    let sid = s.initialize(ALICE);
    let r = s.call(ALICE, &sid, 2, "subscribe_events", json!({"self_id": SELF_ID}));
    let uri = structured(&r.last()["result"])["result"]["uri"].as_str().unwrap().to_owned();
    let sub = s.post(
        Some(ALICE),
        Some(&sid),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "resources/subscribe", "params": {"uri": uri}}),
    );
    assert_eq!(sub.status, 200, "{sub:?}");
    // Bob's session cannot read alice's resource.
    let bob = s.initialize(BOB);
    let other = s.post(
        Some(BOB),
        Some(&bob),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": uri}}),
    );
    assert!(other.last().get("error").is_some(), "{other:?}");
    let update = s.rt.block_on(async {
        let mut get = s
            .client
            .get(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(get.status().as_u16(), 200);
        ev.send(&snowluma_fake::events::group_message(SELF_ID, 20001, 30001, "one"));
        let mut buf = String::new();
        next_sse(&mut get, &mut buf).await
    });
    assert_eq!(update["method"], "notifications/resources/updated", "{update}");
    assert_eq!(update["params"]["uri"], uri.as_str());

    // Modern: subscribe on one connection, listen on another.
    let r = s.modern(
        BOB,
        1,
        "tools/call",
        Some("subscribe_events"),
        json!({"name": "subscribe_events", "arguments": {"self_id": SELF_ID}}),
    );
    let muri = structured(&r.last()["result"])["result"]["uri"].as_str().unwrap().to_owned();
    let listener = s.client_for_another_connection();
    let (ack, n) = s.rt.block_on(async {
        let mut params = json!({"notifications": {"resourceSubscriptions": [muri]}});
        params["_meta"] = modern_meta();
        let mut listen = listener
            .post(s.url())
            .header("authorization", format!("Bearer {BOB}"))
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "subscriptions/listen")
            .header("accept", "application/json, text/event-stream")
            .body(
                serde_json::to_vec(
                    &json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params}),
                )
                .unwrap(),
            )
            .send()
            .await
            .unwrap();
        let mut buf = String::new();
        let ack = next_sse(&mut listen, &mut buf).await;
        ev.send(&snowluma_fake::events::private_message(SELF_ID, 30001, "hello"));
        let n = next_sse(&mut listen, &mut buf).await;
        (ack, n)
    });
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1", "the client's id: {ack}");
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], muri.as_str());
    assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1", "{n}");
}

/// A download with progress over HTTP, in both eras: the progress
/// notifications stream on the call's response, in order, before it.
#[test]
fn transfers_stream_progress_on_the_call_response() {
    let dir = temp_dir("transfer");
    let downloads = dir.join("downloads");
    let fake = Fake::start(Some("t"));
    let data: Vec<u8> = (0..200_000usize).map(|i| (i * 31 % 251) as u8).collect();
    fake.fake.add_file("p.bin", data.clone());
    fake.fake.set_fault("download_file_stream", snowluma_fake::Fault::StreamSplit(2048));
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", downloads.to_str().unwrap()),
    ];
    let s = Server::start(&dir, &env, &[]);
    let args = json!({"action": "download_file_stream", "params": {"file": "p.bin", "chunk_size": 1000}});
    let check = |r: &Reply, token: &Value| {
        assert_eq!(r.status, 200);
        assert_eq!(r.headers.get("content-type").unwrap(), "text/event-stream", "{r:?}");
        let progress: Vec<f64> = r
            .messages
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .inspect(|m| assert_eq!(&m["params"]["progressToken"], token))
            .map(|m| m["params"]["progress"].as_f64().unwrap())
            .collect();
        assert!(!progress.is_empty(), "{r:?}");
        assert!(progress.windows(2).all(|w| w[1] > w[0]), "{progress:?}");
        assert_eq!(*progress.last().unwrap(), data.len() as f64);
        assert!(is_response_ok(r.last()), "{:?}", r.last());
    };
    let sid = s.initialize(ALICE);
    let legacy = s.post(
        Some(ALICE),
        Some(&sid),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "invoke_action", "arguments": args, "_meta": {"progressToken": "dl-1"}}}),
    );
    check(&legacy, &json!("dl-1"));
    let mut meta = modern_meta();
    meta["progressToken"] = json!(7);
    let modern = s.post(
        Some(ALICE),
        None,
        &[("mcp-protocol-version", MODERN), ("mcp-method", "tools/call"), ("mcp-name", "invoke_action")],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "invoke_action", "arguments": args, "_meta": meta}}),
    );
    check(&modern, &json!(7));
}

fn is_response_ok(m: &Value) -> bool {
    m.get("result").is_some_and(|r| !is_error(r))
}

/// A legacy client's `notifications/cancelled` names its own request id:
/// the right call is cancelled (a write: outcome unknown) and its response
/// stream ends without an answer.
#[test]
fn a_legacy_cancellation_reaches_the_right_call() {
    let dir = temp_dir("cancel");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t"));
    fake.fake.set_fault("send_group_msg", snowluma_fake::Fault::Hang);
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_AUDIT_LOG", log.to_str().unwrap()),
    ];
    let s = Server::start(&dir, &env, &[]);
    let sid = s.initialize(ALICE);
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "invoke_action", "arguments": {"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}}});
    let text = s.rt.block_on(async {
        let pending = s
            .client
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("accept", "application/json, text/event-stream")
            .body(serde_json::to_vec(&call).unwrap())
            .send();
        let cancel = async {
            while !fake.fake.requests().iter().any(|r| r.action.as_deref() == Some("send_group_msg")) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let r = s
                .client
                .post(s.url())
                .header("authorization", format!("Bearer {ALICE}"))
                .header("mcp-session-id", &sid)
                .body(
                    r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"user"}}"#,
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 202);
        };
        let (resp, ()) = tokio::join!(pending, cancel);
        let resp = resp.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.headers().get("content-type").unwrap(), "text/event-stream");
        resp.text().await.unwrap()
    });
    assert_eq!(text, "", "no answer for a cancelled call");
    wait_until("the write's result is audited", || {
        let t = std::fs::read_to_string(&log).unwrap();
        t.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["phase"] == "result")
    });
    let t = std::fs::read_to_string(&log).unwrap();
    let result: Value =
        t.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["phase"] == "result").unwrap();
    assert_eq!(result["outcome"], "unknown");
    // The session goes on.
    assert_eq!(s.call(ALICE, &sid, 6, "list_categories", json!({})).status, 200);
}

/// Modern input completion over HTTP: the `input_required` result's
/// `requestState` is redeemed from another connection of the same client;
/// another token's tree cannot redeem it.
#[test]
fn a_modern_input_round_survives_a_new_connection_but_not_another_token() {
    let dir = temp_dir("mrtr");
    let fake = Fake::start(Some("t0k"));
    let url = fake.fake.url();
    // The sessions' options may follow `serve-http` (here: mode and endpoint).
    let s = Server::start(&dir, &[("SNOWLUMA_MCP_TOKEN", "t0k")], &["--mode", "write", "--endpoint", url.as_str()]);
    let caps = json!({"elicitation": {"form": {}}});
    let args = json!({"action": "send_group_msg", "params": {"group_id": 20001}});
    let params = |extra: Value| {
        let mut p =
            json!({"name": "invoke_action_with_input", "arguments": args, "_meta": modern_meta_with(caps.clone())});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p[k] = v;
            }
        }
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": p})
    };
    let h = [("mcp-protocol-version", MODERN), ("mcp-method", "tools/call"), ("mcp-name", "invoke_action_with_input")];
    let first = s.post(Some(ALICE), None, &h, &params(json!({})));
    let r = &first.last()["result"];
    assert_eq!(r["resultType"], "input_required", "{first:?}");
    let state = r["requestState"].as_str().unwrap().to_owned();
    let retry = params(json!({"requestState": state,
        "inputResponses": {"params": {"action": "accept", "content": {"params_json": "{\"message\":\"Hello\"}"}}}}));
    // Bob's tree knows nothing of it.
    let stolen = s.post(Some(BOB), None, &h, &retry);
    assert!(stolen.last().get("error").is_some() || is_error(&stolen.last()["result"]), "{stolen:?}");
    assert!(fake.fake.requests().is_empty(), "nothing executed for bob");
    // Alice, on a fresh connection.
    let other = s.client_for_another_connection();
    let done: Value = s.rt.block_on(async {
        let mut req =
            other.post(s.url()).header("authorization", format!("Bearer {ALICE}")).header("accept", "application/json");
        for (k, v) in h {
            req = req.header(k, v);
        }
        let text = req.body(serde_json::to_vec(&retry).unwrap()).send().await.unwrap().text().await.unwrap();
        serde_json::from_str(&text).unwrap()
    });
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert!(!is_error(&done["result"]), "{done}");
    let sent: Vec<Value> = fake.fake.requests().iter().filter_map(|r| r.json()).collect();
    assert_eq!(sent, [json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}})]);
}

// ---------------------------------------------------------------------------
// Persistent background transfers (the tasks extension) over serve-http.

/// A write-mode server with stream, upload and task directories in `dir`.
struct TaskServer {
    s: Server,
    fake: Fake,
    dir: PathBuf,
}

fn task_server(name: &str, extra: &[&str]) -> TaskServer {
    let dir = temp_dir(name);
    std::fs::create_dir_all(dir.join("uploads")).unwrap();
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let (sd, ur, td) = (dir.join("downloads"), dir.join("uploads"), dir.join("tasks"));
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.to_str().unwrap()),
        ("SNOWLUMA_MCP_UPLOAD_ROOT", ur.to_str().unwrap()),
        ("SNOWLUMA_MCP_TASK_DIR", td.to_str().unwrap()),
    ];
    let s = Server::start(&dir, &env, extra);
    TaskServer { s, fake, dir }
}

fn tasks_meta() -> Value {
    modern_meta_with(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
}

fn task_download(file: &str) -> Value {
    json!({"action": "download_file_stream", "params": {"file": file, "chunk_size": 1000}})
}

impl TaskServer {
    /// A modern request declaring the tasks extension, on `client` (its own
    /// connection pool) or the server's client; the single JSON message.
    fn tasks_on(&self, client: Option<&reqwest::Client>, token: &str, method: &str, params: Value) -> Value {
        let mut params = params;
        params["_meta"] = tasks_meta();
        let name = params.get("name").and_then(Value::as_str).map(str::to_owned);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let client = client.unwrap_or(&self.s.client);
        self.s.rt.block_on(async {
            let mut req = client
                .post(self.s.url())
                .header("authorization", format!("Bearer {token}"))
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", MODERN)
                .header("mcp-method", method);
            if let Some(n) = &name {
                req = req.header("mcp-name", n);
            }
            let resp = req.body(serde_json::to_vec(&body).unwrap()).send().await.unwrap();
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let reply = Reply::new(status, headers, resp.text().await.unwrap());
            reply.messages.iter().rev().find(|m| m.get("id").is_some()).cloned().unwrap_or_else(|| panic!("{reply:?}"))
        })
    }

    fn tasks(&self, token: &str, method: &str, params: Value) -> Value {
        self.tasks_on(None, token, method, params)
    }

    fn tool(&self, token: &str, tool: &str, args: Value) -> Value {
        self.tasks(token, "tools/call", json!({"name": tool, "arguments": args}))
    }

    /// `invoke_action_background`: the task handle's id.
    fn start_task(&self, client: Option<&reqwest::Client>, token: &str, args: Value) -> String {
        let r =
            self.tasks_on(client, token, "tools/call", json!({"name": "invoke_action_background", "arguments": args}));
        let res = r.get("result").unwrap_or_else(|| panic!("{r}"));
        assert_eq!(res["resultType"], "task", "{res}");
        assert_eq!(res["status"], "working", "{res}");
        assert_eq!(res["pollIntervalMs"], 1000);
        assert!(res.get("ttlMs").is_some_and(Value::is_null), "{res}");
        res["taskId"].as_str().unwrap().to_owned()
    }

    fn actions_sent(&self, action: &str) -> usize {
        self.fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some(action)).count()
    }
}

impl Drop for TaskServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sorted_keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    k.sort();
    k
}

fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

/// A modern client that declares the extension starts a background download
/// and polls `tasks/get` (one HTTP request each, every other one on a new
/// connection) until it completes: the result has the synchronous shape,
/// `list_tasks` lists it, SnowLuma saw the action once, and one tree served
/// every request.
#[test]
fn a_background_download_over_http_is_polled_to_completion_across_connections() {
    let t = task_server("tasks-poll", &[]);
    let data = vec![7u8; 5000];
    t.fake.fake.add_file("pic.png", data.clone());
    // Only a request declaring the extension sees the task tools.
    let plain = t.s.modern(ALICE, 1, "tools/list", None, json!({}));
    assert!(!tool_names(plain.last()).contains(&"invoke_action_background".to_owned()));
    let declared = t.tasks(ALICE, "tools/list", json!({}));
    assert!(tool_names(&declared).contains(&"invoke_action_background".to_owned()), "{declared}");
    assert!(tool_names(&declared).contains(&"list_tasks".to_owned()));

    let sync = t.tool(ALICE, "invoke_action", task_download("pic.png"));
    assert!(!is_error(&sync["result"]), "{sync}");
    t.fake.fake.clear_requests();
    t.fake.fake.set_fault("download_file_stream", snowluma_fake::Fault::Delay(std::time::Duration::from_millis(500)));

    let id = t.start_task(None, ALICE, task_download("pic.png"));
    let mut polls = 0u32;
    let done = wait_until("the task completes", || {
        polls += 1;
        let fresh = polls.is_multiple_of(2).then(|| t.s.client_for_another_connection());
        let r = t.tasks_on(fresh.as_ref(), ALICE, "tasks/get", json!({"taskId": id}));
        let task = r.get("result").unwrap_or_else(|| panic!("{r}")).clone();
        assert_eq!(task["taskId"], id.as_str());
        (task["status"] != "working").then_some(task)
    });
    assert_eq!(done["status"], "completed", "{done}");
    let result = &done["result"];
    let sync = &sync["result"];
    assert_eq!(sorted_keys(result), sorted_keys(sync), "{result}");
    assert_eq!(sorted_keys(&result["structuredContent"]), sorted_keys(&sync["structuredContent"]));
    assert_eq!(sorted_keys(&result["structuredContent"]["result"]), sorted_keys(&sync["structuredContent"]["result"]));
    assert_eq!(result["structuredContent"]["result"]["sha256"], snowluma_fake::sha256::digest_hex(&data));
    assert_eq!(result["isError"], false);
    assert_eq!(t.actions_sent("download_file_stream"), 1, "exactly one request for the action");

    let page = t.tool(ALICE, "list_tasks", json!({}));
    assert_eq!(page["result"]["isError"], false, "{page}");
    let tasks = page["result"]["structuredContent"]["result"]["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 1, "{page}");
    assert_eq!(tasks[0]["taskId"], id.as_str());
    assert_eq!(tasks[0]["status"], "completed");
    assert!(tasks[0].get("result").is_none(), "metadata only: {page}");
    // Every request, whatever its connection, reached alice's one tree.
    assert_eq!(t.s.session_pids().len(), 1);
}

/// A task outlives the connection that started it: the client goes away
/// while SnowLuma is still answering, and a new connection of the same
/// token later reads the completed task. With a short idle timeout the tree
/// itself expires mid-transfer: it finishes the transfer before it exits,
/// and the next request's new tree reads the result from the directory.
#[test]
fn a_background_transfer_outlives_its_connection_and_its_tree() {
    let t = task_server("tasks-gone", &["--idle-timeout", "1"]);
    t.fake.fake.add_file("slow.bin", vec![5u8; 64]);
    // SnowLuma answers after 12 s: the tree expires (1 s idle) meanwhile, and
    // the transfer goes on past the 10 s grace a revoked token's tree gets:
    // a tree that was let go is left to finish its background transfers.
    t.fake.fake.set_fault("download_file_stream", snowluma_fake::Fault::Delay(std::time::Duration::from_secs(12)));
    let first = t.s.client_for_another_connection();
    let id = t.start_task(Some(&first), ALICE, task_download("slow.bin"));
    wait_until("the download reaches SnowLuma", || (t.actions_sent("download_file_stream") == 1).then_some(()));
    let tree = t.s.session_pids();
    assert_eq!(tree.len(), 1);
    let mut pids = descendants(tree[0]);
    pids.push(tree[0]);
    // The client goes away (its connection closes) while the transfer runs.
    drop(first);
    // Nothing in flight for a client, no stream: the tree expires after a
    // second, its stdin is closed, and it waits for its transfer.
    wait_until("the idle tree is let go", || t.s.stderr_text().contains("an idle session expired").then_some(()));
    // The client comes back on a new connection at once: a new tree, the
    // same directory. While the old tree finishes, it holds the lease and
    // the new tree's task calls name it; then the new tree takes the lease
    // over and reads the result the old one saved.
    let task = wait_until("the new tree reads the finished task", || {
        let later = t.s.client_for_another_connection();
        let r = t.tasks_on(Some(&later), ALICE, "tasks/get", json!({"taskId": id}));
        if let Some(e) = r.get("error") {
            assert!(e["message"].as_str().unwrap().contains("lease"), "{r}");
            return Err(r.to_string());
        }
        let task = r["result"].clone();
        assert_ne!(task["status"], "working", "the old tree released the lease after its transfer: {task}");
        Ok(task)
    });
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["structuredContent"]["diagnostics"]["outcome"], "success", "{task}");
    assert_eq!(task["result"]["structuredContent"]["result"]["sha256"], snowluma_fake::sha256::digest_hex(&[5u8; 64]));
    assert_eq!(t.actions_sent("download_file_stream"), 1, "nothing sent again");
    wait_until("the old tree has exited", || {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
    let trees = t.s.session_pids();
    assert_eq!(trees.len(), 1);
    assert_ne!(trees[0], tree[0], "a new tree read it");
    assert!(!t.s.stderr_text().contains("its process group was killed"), "the old tree ended by itself");
}

/// A revoked token's tree is killed 10 s after the revocation, background
/// transfers included. The next tree to take the lease (another token's)
/// fails the unfinished record with an unknown remote outcome, without
/// seeing it (it is alice's); once alice's token is back, her new tree
/// reads the task as failed, and nothing was sent again.
#[test]
fn a_revoked_tokens_tree_is_killed_with_its_transfer_which_reads_unknown() {
    let t = task_server("tasks-revoked", &[]);
    t.fake.fake.set_fault("download_file_stream", snowluma_fake::Fault::Hang);
    let id = t.start_task(None, ALICE, task_download("never.bin"));
    wait_until("the download reaches SnowLuma", || (t.actions_sent("download_file_stream") == 1).then_some(()));
    let sighup =
        || nix::sys::signal::kill(nix::unistd::Pid::from_raw(t.s.child.id() as i32), nix::sys::signal::SIGHUP).unwrap();
    write_private(&t.dir.join("tokens"), &format!("bob:{BOB}\n"));
    sighup();
    wait_until("the revoked token's tree is killed", || {
        t.s.stderr_text().contains("its process group was killed").then_some(())
    });
    let r = wait_until("bob's tree gets the lease", || {
        let r = t.tasks(BOB, "tasks/get", json!({"taskId": id}));
        if r["error"]["message"].as_str().is_some_and(|m| m.contains("lease")) { Err(r.to_string()) } else { Ok(r) }
    });
    assert_eq!(r["error"]["code"], -32602, "alice's task is unknown to bob: {r}");
    // Alice's token back, bob's gone (his tree ends and lets go of the lease).
    write_private(&t.dir.join("tokens"), &format!("alice:{ALICE}\n"));
    sighup();
    let r = wait_until("alice's new tree gets the lease", || {
        let r = t.tasks(ALICE, "tasks/get", json!({"taskId": id}));
        if r.get("error").is_some() { Err(r.to_string()) } else { Ok(r) }
    });
    let task = &r["result"];
    assert_eq!(task["status"], "failed", "{task}");
    assert!(task["error"]["message"].as_str().unwrap().contains("unknown remote outcome"), "{task}");
    assert_eq!(t.actions_sent("download_file_stream"), 1, "never replayed");
}

/// The tasks extension binds a task to the authorization that created it:
/// once alice's tree has idled out (freeing the lease), bob's tree lists
/// none of her tasks and knows none of their ids (`tasks/get`, `cancel`
/// and `update` are "unknown task", her result and its file path stay
/// hers); bob's own task is his; and alice's next tree reads her result
/// and does not see bob's.
#[test]
fn another_tokens_tree_neither_lists_nor_reads_a_task() {
    let t = task_server("tasks-owner", &["--idle-timeout", "1"]);
    t.fake.fake.add_file("f.bin", vec![3u8; 100]);
    let completed = |token: &str, id: &str| {
        wait_until("the task completes", || {
            let r = t.tasks(token, "tasks/get", json!({"taskId": id}));
            (r["result"]["status"] == "completed").then(|| r["result"].clone())
        })
    };
    // A page of `token`'s tasks, once its tree holds the lease.
    let listed = |token: &str| -> Vec<String> {
        let r = wait_until("the tree gets the lease", || {
            let r = t.tool(token, "list_tasks", json!({}));
            if r["result"]["isError"] == false { Ok(r) } else { Err(r.to_string()) }
        });
        let tasks = r["result"]["structuredContent"]["result"]["tasks"].as_array().unwrap().clone();
        tasks.iter().map(|x| x["taskId"].as_str().unwrap().to_owned()).collect()
    };
    let unknown = |token: &str, id: &str| {
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let r = t.tasks(token, method, json!({"taskId": id, "inputResponses": {}}));
            assert_eq!(r["error"]["code"], -32602, "{method}: {r}");
            assert_eq!(r["error"]["message"], "unknown task", "{method}: {r}");
        }
    };
    let alices = t.start_task(None, ALICE, task_download("f.bin"));
    let done = completed(ALICE, &alices);
    assert!(done["result"]["structuredContent"]["result"]["file_path"].is_string(), "{done}");

    assert_eq!(listed(BOB), Vec::<String>::new(), "bob lists none of alice's tasks");
    unknown(BOB, &alices);
    let bobs = t.start_task(None, BOB, task_download("f.bin"));
    completed(BOB, &bobs);
    assert_eq!(listed(BOB), vec![bobs.clone()]);
    // Another token of the same person is another principal too.
    assert_eq!(listed(ALICE2), Vec::<String>::new());
    unknown(ALICE2, &alices);

    assert_eq!(listed(ALICE), vec![alices.clone()]);
    let again = completed(ALICE, &alices);
    assert_eq!(again["result"], done["result"]);
    unknown(ALICE, &bobs);
    assert_eq!(t.actions_sent("download_file_stream"), 2);
}

/// Every tree in write mode runs its own task store on the same directory,
/// and the directory has one exclusive lease. The tree that holds it serves
/// the task tools; in every other tree (another token, or a legacy session)
/// `list_tasks` and `invoke_action_background` are tool errors naming the
/// lease, `tasks/get` is an internal error naming it, nothing is created,
/// and every other tool works. A legacy tree cannot use tasks at all, yet
/// holds the lease if it started first (see the next test).
#[test]
fn the_task_directory_lease_serves_one_tree_at_a_time() {
    let t = task_server("tasks-lease", &[]);
    t.fake.fake.add_file("f.bin", vec![3u8; 100]);
    // Alice's modern tree is first: it holds the lease.
    let id = t.start_task(None, ALICE, task_download("f.bin"));
    wait_until("alice's task completes", || {
        let r = t.tasks(ALICE, "tasks/get", json!({"taskId": id}));
        (r["result"]["status"] == "completed").then_some(())
    });
    let refused_tool = |r: &Value| {
        assert_eq!(r["result"]["isError"], true, "{r}");
        let msg = text(&r["result"]);
        assert!(msg.contains("lease is held by another snowluma-mcp runtime"), "{r}");
    };
    // Bob's tree: the task tools are listed but refused, naming the lease.
    assert!(tool_names(&t.tasks(BOB, "tools/list", json!({}))).contains(&"invoke_action_background".to_owned()));
    refused_tool(&t.tool(BOB, "list_tasks", json!({})));
    refused_tool(&t.tool(BOB, "invoke_action_background", task_download("f.bin")));
    let r = t.tasks(BOB, "tasks/get", json!({"taskId": id}));
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("lease"), "{r}");
    for method in ["tasks/cancel", "tasks/update"] {
        let r = t.tasks(BOB, method, json!({"taskId": id, "inputResponses": {}}));
        assert_eq!(r["error"]["code"], -32603, "{method}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("lease"), "{method}: {r}");
    }
    let other = t.tool(BOB, "list_categories", json!({}));
    assert!(!is_error(&other["result"]), "{other}");
    assert_eq!(t.actions_sent("download_file_stream"), 1, "nothing ran for bob");
    // Alice's tree is unaffected.
    let page = t.tool(ALICE, "list_tasks", json!({}));
    assert_eq!(page["result"]["structuredContent"]["result"]["tasks"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(t.s.session_pids().len(), 2);

    // A legacy session in write mode: no task tools and no task methods.
    let sid = t.s.initialize(BOB);
    let list = t.s.post(
        Some(BOB),
        Some(&sid),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    let names = tool_names(list.last());
    assert!(!names.iter().any(|n| n == "invoke_action_background" || n == "list_tasks"), "{names:?}");
    let r = t.s.post(
        Some(BOB),
        Some(&sid),
        &[("mcp-protocol-version", "2025-11-25")],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": id}}),
    );
    assert!(r.last().get("error").is_some(), "{r:?}");

    assert_eq!(t.s.delete(BOB, &sid), 200);
}

/// A legacy session that starts first holds the task directory's lease
/// although it cannot use tasks: a modern client's task calls are refused
/// while it lives, and succeed once it has ended.
#[test]
fn a_legacy_session_started_first_holds_the_task_lease_until_it_ends() {
    let t = task_server("tasks-lease-legacy", &[]);
    t.fake.fake.add_file("f.bin", vec![3u8; 100]);
    let sid = t.s.initialize(BOB);
    let legacy = t.s.session_pids();
    assert_eq!(legacy.len(), 1);
    wait_until("the legacy tree's task store holds the lease", || lease_held(&t.dir).then_some(()));
    let r = t.tool(ALICE, "list_tasks", json!({}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r["result"]).contains("lease"), "{r}");
    // The legacy session ends; its tree exits and releases the lease.
    let mut pids = descendants(legacy[0]);
    pids.push(legacy[0]);
    assert_eq!(t.s.delete(BOB, &sid), 200);
    wait_until("the legacy tree exits", || {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() { Ok(()) } else { Err(left) }
    });
    // Alice's running tree takes the lease over at its next task call.
    let r = t.tool(ALICE, "list_tasks", json!({}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let id = t.start_task(None, ALICE, task_download("f.bin"));
    let done = wait_until("the task completes", || {
        let r = t.tasks(ALICE, "tasks/get", json!({"taskId": id}));
        (r["result"]["status"] != "working").then(|| r["result"].clone())
    });
    assert_eq!(done["status"], "completed", "{done}");
}

/// Whether someone holds the flock on the task directory's lease file
/// (`/proc/locks` names its inode).
fn lease_held(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir.join("tasks").join("lease")) else { return false };
    let suffix = format!(":{}", meta.ino());
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.contains("FLOCK") && l.split_whitespace().any(|f| f.ends_with(&suffix)))
}

// ---------------------------------------------------------------------------
// Idempotent writes and the confirmation of actions over serve-http.

/// A legacy session: a keyed `invoke_action` of a listed action asks on the
/// call's own stream; the accepted call runs once, its retry with the same
/// key replays without asking, nothing else reaches the fake.
#[test]
fn a_legacy_confirmation_and_a_keyed_replay_over_http() {
    let dir = temp_dir("confirm-legacy");
    let fake = Fake::start(Some("t0k"));
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_TOKEN", "t0k"),
        ("SNOWLUMA_MCP_CONFIRM_ACTIONS", "destructive"),
    ];
    let s = Server::start(&dir, &env, &[]);
    let sid = s.initialize_with(ALICE, json!({"elicitation": {"form": {}}}));
    let args = json!({"action": "set_group_kick", "params": {"group_id": 20001, "user_id": 30001},
        "execution": {"idempotency_key": "kick-http-1"}});
    let call = json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call", "params": {
        "name": "invoke_action", "arguments": args}});
    let final_msg = s.rt.block_on(async {
        let mut resp = s
            .client
            .post(s.url())
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "application/json, text/event-stream")
            .body(serde_json::to_vec(&call).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers().get("content-type").unwrap(), "text/event-stream");
        let mut buf = String::new();
        let mut asked = 0;
        loop {
            let chunk = resp.chunk().await.unwrap().expect("the stream ends after the response");
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
                let msg: Value = serde_json::from_str(data).unwrap();
                if msg["method"] == "elicitation/create" {
                    asked += 1;
                    assert!(msg["params"]["message"].as_str().unwrap().contains("set_group_kick"), "{msg}");
                    let answer = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {
                        "action": "accept", "content": {"confirm": true}}});
                    let r = s
                        .client
                        .post(s.url())
                        .header("authorization", format!("Bearer {ALICE}"))
                        .header("mcp-session-id", &sid)
                        .header("mcp-protocol-version", "2025-11-25")
                        .body(serde_json::to_vec(&answer).unwrap())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 202);
                } else if msg.get("result").is_some() || msg.get("error").is_some() {
                    assert_eq!(asked, 1, "asked once, before the response");
                    return msg;
                }
            }
        }
    });
    assert!(!is_error(&final_msg["result"]), "{final_msg}");
    let again = s.call(ALICE, &sid, 2, "invoke_action", args.clone());
    let r = &again.last()["result"];
    assert_eq!(structured(r)["diagnostics"]["replayed"], true, "{again:?}");
    assert_eq!(structured(r)["result"], structured(&final_msg["result"])["result"]);
    let kicks = fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("set_group_kick")).count();
    assert_eq!(kicks, 1, "executed once");
}

/// Modern requests: the confirmation is an `input_required` round (its
/// state valid on another connection, useless to another token), and keyed
/// retries of one token's requests replay from its tree.
#[test]
fn a_modern_confirmation_and_keyed_replays_over_http() {
    let dir = temp_dir("confirm-modern");
    let fake = Fake::start(Some("t0k"));
    let url = fake.fake.url();
    let env = [("SNOWLUMA_MCP_TOKEN", "t0k"), ("SNOWLUMA_MCP_CONFIRM_ACTIONS", "set_group_kick")];
    let s = Server::start(&dir, &env, &["--mode", "write", "--endpoint", url.as_str()]);
    let caps = json!({"elicitation": {"form": {}}});
    let kick = json!({"action": "set_group_kick", "params": {"group_id": 20001, "user_id": 30001}});
    let params = |args: &Value, extra: Value| {
        let mut p = json!({"name": "invoke_action", "arguments": args, "_meta": modern_meta_with(caps.clone())});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p[k] = v;
            }
        }
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": p})
    };
    let h = [("mcp-protocol-version", MODERN), ("mcp-method", "tools/call"), ("mcp-name", "invoke_action")];
    let first = s.post(Some(ALICE), None, &h, &params(&kick, json!({})));
    let r = &first.last()["result"];
    assert_eq!(r["resultType"], "input_required", "{first:?}");
    assert!(r["inputRequests"]["confirm"].is_object(), "{first:?}");
    let state = r["requestState"].as_str().unwrap().to_owned();
    let retry = params(
        &kick,
        json!({"requestState": state, "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": true}}}}),
    );
    let stolen = s.post(Some(BOB), None, &h, &retry);
    assert!(stolen.last().get("error").is_some() || is_error(&stolen.last()["result"]), "{stolen:?}");
    assert!(fake.fake.requests().is_empty(), "nothing executed for bob");
    let other = s.client_for_another_connection();
    let done: Value = s.rt.block_on(async {
        let mut req =
            other.post(s.url()).header("authorization", format!("Bearer {ALICE}")).header("accept", "application/json");
        for (k, v) in h {
            req = req.header(k, v);
        }
        let text = req.body(serde_json::to_vec(&retry).unwrap()).send().await.unwrap().text().await.unwrap();
        serde_json::from_str(&text).unwrap()
    });
    assert!(!is_error(&done["result"]), "{done}");
    assert_eq!(fake.fake.requests().len(), 1);
    // Keyed sends: the first runs, its retries replay.
    let send = json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "hi"},
        "execution": {"idempotency_key": "http-send-1"}});
    let mut results = Vec::new();
    for _ in 0..3 {
        let r = s.post(Some(ALICE), None, &h, &params(&send, json!({})));
        results.push(r.last()["result"].clone());
    }
    assert!(structured(&results[0])["diagnostics"].get("replayed").is_none(), "{results:?}");
    assert!(results[1..].iter().all(|r| structured(r)["diagnostics"]["replayed"] == true), "{results:?}");
    let sends = fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    assert_eq!(sends, 1);
}

/// The result object of a `tools/call` answer (the last message of a reply).
fn tool_result(r: &Reply) -> Value {
    r.last()["result"].clone()
}

/// Target scope and send pacing over `serve-http`, both eras: refusals are
/// the stdio server's (nothing reaches the fake); the pacing window is the
/// session tree's: a legacy session's second send to a group is refused,
/// while another legacy session of the same token has its own window (what
/// the README states), and a token's modern requests share one tree.
#[test]
fn scope_and_pacing_hold_over_http_with_a_window_per_principal() {
    let dir = temp_dir("safety");
    let fake = Fake::start(Some("t"));
    let url = fake.fake.url();
    let env = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_TOKEN", "t"),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_ALLOW_GROUPS", "20001"),
        ("SNOWLUMA_MCP_SEND_INTERVAL_MS", "86400000"),
        ("SNOWLUMA_MCP_SEND_BURST", "0"),
    ];
    let s = Server::start(&dir, &env, &[]);
    let send = |g: u64| json!({"action": "send_group_msg", "params": {"group_id": g, "message": "x"}});
    let kind = |r: &Reply| tool_result(r)["structuredContent"]["diagnostics"]["kind"].clone();
    let sends = || fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    let a = s.initialize(ALICE);
    assert_eq!(kind(&s.call(ALICE, &a, 2, "invoke_action", send(20002))), "out_of_scope");
    assert_eq!(sends(), 0, "nothing out of scope reached SnowLuma");
    assert_eq!(tool_result(&s.call(ALICE, &a, 3, "invoke_action", send(20001)))["isError"], false);
    let r = s.call(ALICE, &a, 4, "invoke_action", send(20001));
    assert_eq!(kind(&r), "rate_limited");
    assert!(tool_result(&r)["structuredContent"]["diagnostics"]["retry_after_ms"].as_u64().unwrap() > 0);
    assert_eq!(sends(), 1);
    // Another legacy session of the same token: its own tree, but the
    // token's window.
    let b = s.initialize(ALICE);
    assert_eq!(kind(&s.call(ALICE, &b, 2, "invoke_action", send(20001))), "rate_limited");
    assert_eq!(sends(), 1);
    // Modern: the token's requests share one tree, and that tree the
    // token's window too.
    let call = |token: &str, id: i64, args: Value| {
        s.modern(token, id, "tools/call", Some("invoke_action"), json!({"name": "invoke_action", "arguments": args}))
    };
    assert_eq!(kind(&call(ALICE, 5, send(20002))), "out_of_scope");
    assert_eq!(kind(&call(ALICE, 6, send(20001))), "rate_limited");
    assert_eq!(sends(), 1);
    // Another token: another principal, another window.
    let c = s.initialize(BOB);
    assert_eq!(tool_result(&s.call(BOB, &c, 2, "invoke_action", send(20001)))["isError"], false);
    assert_eq!(kind(&s.call(BOB, &c, 3, "invoke_action", send(20001))), "rate_limited");
    assert_eq!(kind(&call(BOB, 7, send(20001))), "rate_limited", "the token's modern tree shares its window");
    assert_eq!(sends(), 2);
    let info = s.modern(
        ALICE,
        8,
        "tools/call",
        Some("get_runtime_info"),
        json!({"name": "get_runtime_info", "arguments": {}}),
    );
    let info = &tool_result(&info)["structuredContent"]["result"];
    assert_eq!(info["scope"]["groups"]["count"], 1);
    assert!(info["pacing"]["window"].as_str().unwrap().contains("per HTTP principal"));
}
