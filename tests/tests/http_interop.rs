#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]
//! Interoperability over Streamable HTTP: the built binary runs as
//! `snowluma-mcp serve-http` on a loopback port with a bearer token file,
//! and the official MCP conformance suite and the real MCP clients (the
//! TypeScript SDK v1 and v2, the Python SDK) connect to it exactly as hosts
//! built on them do, with `Authorization: Bearer <token>`.
//!
//! * Conformance: `tests/interop/conformance.sh URL TOKEN_FILE` runs every
//!   server scenario of the pinned `@modelcontextprotocol/conformance` that
//!   applies to snowluma-mcp (the table in tests/interop/conformance.mjs and
//!   the README), at each protocol revision, and fails on any failed check.
//! * Clients: the same scripts as tests/tests/interop.rs, with
//!   `--http URL` and the token file in `SNOWLUMA_TEST_HTTP_TOKEN_FILE`
//!   (never the token on a command line), against a server started in the
//!   same mode with the same fake SnowLuma and stream directory; the fake's
//!   log is checked as there (each write exactly once per session, the
//!   cancelled call's connection closed, the downloaded file complete), and
//!   the server's own log now that the harness holds it (the cancelled call
//!   logged as cancelled; no panic anywhere in the process tree).
//! * The MCP Inspector's CLI (tests/interop/node/inspector.mjs with
//!   `--http`): the same checks as over stdio (tools/list in both eras and
//!   `--strict`, tools/call, resources/read, preview_message, the MCP Apps
//!   probe) in docs and read mode, the bearer header from a private
//!   `--config` session file (not the command line, not the test proxy).
//!   The Inspector does not end its sessions (no DELETE), so these servers
//!   allow 32 trees per token.
//! * A Unix socket (`--listen /abs/path.sock`): the Python client in docs
//!   mode through httpx2's Unix socket transport.
//! * TLS (`--tls-cert`, `--tls-key`, a self-signed certificate made with
//!   `openssl req`): the three SDK clients and the Inspector in docs mode
//!   and three conformance scenarios over https.
//! * The door: requests without the token, or with a wrong one, get 401; a
//!   token file other users can read is refused at start.
//!
//! The clients are installed, pinned, by tests/interop/setup.sh (the
//! README's test command runs it); missing clients fail these tests with
//! the command to run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::json;
use snowluma_e2e::{BoundedOutput, Fake, Tail, assert_interop_write_run, bin_path, wait_exit, wait_until};

#[derive(Debug, Clone, Copy)]
enum Client {
    TsV1,
    TsV2,
    Python,
    Inspector,
}

const SETUP_HINT: &str = "the interoperability clients are not installed: run `tests/interop/setup.sh` \
     (`./scripts/test` runs it; it needs node >= 20, npm and python3 with venv)";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("interop")
}

/// A fresh private directory for one test's files (token file, stream dir).
fn private_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snowluma-http-interop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// A random token: 32 bytes from the kernel, hex (64 characters).
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write a serve-http token file (`ID:TOKEN`, a comment) with `mode`.
fn write_token_file(dir: &Path, token: &str, mode: u32) -> PathBuf {
    let path = dir.join("http-tokens");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&path).unwrap();
    writeln!(f, "# snowluma-mcp serve-http tokens for the interop tests").unwrap();
    writeln!(f, "interop:{token}").unwrap();
    drop(f);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A loopback port nothing listens on right now (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The environment of a serve-http run (what the stdio server would get).
#[derive(Default)]
struct ServerEnv {
    mode: &'static str,
    endpoint: Option<String>,
    stream_dir: Option<PathBuf>,
    events_url: Option<String>,
    /// SNOWLUMA_MCP_CONFIRM_ACTIONS.
    confirm_actions: Option<&'static str>,
    /// Serve https with a fresh self-signed certificate for 127.0.0.1
    /// (`--tls-cert`, `--tls-key`); the clients trust it as their CA.
    tls: bool,
}

/// A running `snowluma-mcp serve-http`; stopped (SIGTERM, then SIGKILL at
/// the deadline) on drop.
struct HttpServer {
    child: Child,
    port: u16,
    /// With `--listen /abs/path.sock`: the socket (`port` is then 0).
    socket: Option<PathBuf>,
    stderr: Arc<Mutex<String>>,
    token: String,
    token_file: PathBuf,
    /// With `tls`: the certificate, which the clients take as their CA.
    ca_file: Option<PathBuf>,
    dir: PathBuf,
}

impl HttpServer {
    fn start(name: &str, env: ServerEnv) -> HttpServer {
        let dir = private_dir(name);
        let token = random_token();
        let token_file = write_token_file(&dir, &token, 0o600);
        let ca_file = env.tls.then(|| self_signed_certificate(&dir));
        // The port is free when picked; should something else take it before
        // the server binds, the server exits and the next port is tried.
        for _ in 0..3 {
            let port = free_port();
            let mut cmd = serve_http_command(&env, &token_file, &format!("127.0.0.1:{port}"));
            let (mut child, stderr) = spawn_logged(&mut cmd);
            let up = wait_until("serve-http accepts connections or exits", || {
                if let Some(status) = child.try_wait().unwrap() {
                    return Ok(Some(status));
                }
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(_) => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            });
            match up {
                None => return HttpServer { child, port, socket: None, stderr, token, token_file, ca_file, dir },
                Some(status) => {
                    let log = stderr.lock().unwrap().clone();
                    let _ = child.wait();
                    assert!(
                        log.to_ascii_lowercase().contains("in use"),
                        "serve-http exited ({status}) before accepting connections:\n{log}"
                    );
                }
            }
        }
        panic!("serve-http found no free loopback port in 3 tries");
    }

    /// The same on a Unix socket in the test's private directory.
    fn start_unix(name: &str, env: ServerEnv) -> HttpServer {
        let dir = private_dir(name);
        let token = random_token();
        let token_file = write_token_file(&dir, &token, 0o600);
        let socket = dir.join("mcp.sock");
        let mut cmd = serve_http_command(&env, &token_file, socket.to_str().unwrap());
        let (mut child, stderr) = spawn_logged(&mut cmd);
        wait_until("serve-http accepts connections on its Unix socket", || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("serve-http exited ({status}) before accepting connections:\n{}", stderr.lock().unwrap());
            }
            std::os::unix::net::UnixStream::connect(&socket).map(drop)
        });
        HttpServer { child, port: 0, socket: Some(socket), stderr, token, token_file, ca_file: None, dir }
    }

    fn url(&self) -> String {
        match &self.socket {
            Some(_) => "http://localhost/mcp".to_owned(),
            None if self.ca_file.is_some() => format!("https://127.0.0.1:{}/mcp", self.port),
            None => format!("http://127.0.0.1:{}/mcp", self.port),
        }
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until the server's stderr contains `needle`.
    fn wait_stderr(&self, needle: &str, what: &str) {
        wait_until(what, || {
            let text = self.stderr_text();
            if text.contains(needle) { Ok(()) } else { Err(Tail(text)) }
        })
    }

    fn assert_no_crash(&self, what: &str) {
        let log = self.stderr_text();
        for bad in ["fatal runtime error", "panicked"] {
            assert!(!log.contains(bad), "{what}: the server's stderr has {bad:?}:\n{log}");
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if !std::thread::panicking() {
                wait_exit(&mut self.child, "serve-http exits on SIGTERM");
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `snowluma-mcp serve-http --listen LISTEN --http-token-file FILE` with
/// exactly the mode's environment (nothing inherited but PATH). Send
/// pacing is off: each client sends to one group in both eras, through one
/// token whose trees share a pacing window (pacing is tested in `http.rs`).
fn serve_http_command(env: &ServerEnv, token_file: &Path, listen: &str) -> Command {
    let mut cmd = Command::new(bin_path());
    cmd.arg("serve-http")
        .arg("--listen")
        .arg(listen)
        .arg("--http-token-file")
        .arg(token_file)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SNOWLUMA_MCP_MODE", env.mode)
        .env("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0")
        .env("SNOWLUMA_MCP_SEND_BURST", "0");
    if let Some(e) = &env.endpoint {
        cmd.env("SNOWLUMA_MCP_ENDPOINT", e);
    }
    if let Some(d) = &env.stream_dir {
        cmd.env("SNOWLUMA_MCP_STREAM_DIR", d);
    }
    if let Some(a) = env.confirm_actions {
        cmd.env("SNOWLUMA_MCP_CONFIRM_ACTIONS", a);
    }
    if let Some(u) = &env.events_url {
        cmd.env("SNOWLUMA_MCP_EVENTS_URL", u);
    }
    if env.tls {
        let dir = token_file.parent().unwrap();
        cmd.arg("--tls-cert").arg(dir.join("cert.pem")).arg("--tls-key").arg(dir.join("key.pem"));
    }
    cmd
}

/// A self-signed P-256 certificate for 127.0.0.1 and localhost (openssl
/// req), `cert.pem` and `key.pem` (0600) in `dir`; returns the certificate.
fn self_signed_certificate(dir: &Path) -> PathBuf {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .bounded_output()
        .unwrap_or_else(|e| panic!("the TLS tests need the openssl command (Debian: apt-get install openssl): {e}"));
    assert!(out.status.success(), "openssl req failed:\n{}", String::from_utf8_lossy(&out.stderr));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    cert
}

/// Spawn with stdin closed, stdout discarded into the log too, and stderr
/// collected line by line into a shared buffer.
fn spawn_logged(cmd: &mut Command) -> (Child, Arc<Mutex<String>>) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn snowluma-mcp serve-http");
    let log = Arc::new(Mutex::new(String::new()));
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
    ] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
    }
    (child, log)
}

// ----------------------------------------------------------- conformance --

#[test]
fn official_conformance_suite() {
    let dir = interop_dir();
    assert!(
        dir.join("node_modules/@modelcontextprotocol/conformance/package.json").is_file(),
        "{SETUP_HINT} (missing the conformance suite in tests/interop/node_modules)"
    );
    let server = HttpServer::start("conformance", ServerEnv { mode: "docs", ..ServerEnv::default() });
    let out = Command::new(dir.join("conformance.sh"))
        .arg(server.url())
        .arg(&server.token_file)
        .current_dir(repo_root())
        .bounded_output()
        .unwrap_or_else(|e| panic!("cannot run tests/interop/conformance.sh ({e}); {SETUP_HINT}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the conformance suite failed ({}):\n{stdout}\n--- stderr ---\n{stderr}\n--- server ---\n{}",
        out.status,
        server.stderr_text()
    );
    assert!(stdout.contains("scenario runs passed, 0 failed"), "no summary line:\n{stdout}");
    assert!(!stdout.contains(&server.token) && !stderr.contains(&server.token), "the token was printed");
    println!("{stdout}");
    server.assert_no_crash("conformance");
}

// --------------------------------------------------------------- clients --

fn client_command(client: Client) -> Command {
    let dir = interop_dir();
    match client {
        Client::Python => {
            let py = repo_root().join("target/interop/venv/bin/python");
            assert!(py.exists(), "{SETUP_HINT} (missing {})", py.display());
            let mut c = Command::new(py);
            c.arg(dir.join("python/client.py"));
            c
        }
        Client::TsV1 | Client::TsV2 | Client::Inspector => {
            assert!(dir.join("node_modules").is_dir(), "{SETUP_HINT} (missing tests/interop/node_modules)");
            let mut c = Command::new("node");
            c.arg(dir.join(match client {
                Client::TsV1 => "node/v1.mjs",
                Client::TsV2 => "node/v2.mjs",
                _ => "node/inspector.mjs",
            }));
            c
        }
    }
}

/// What the client is told (the server got the same through its environment).
struct Run<'a> {
    mode: &'a str,
    endpoint: Option<&'a str>,
    stream_dir: Option<&'a Path>,
    events: Option<(String, i64)>,
    /// INTEROP_CONFIRM_ACTIONS (the server got SNOWLUMA_MCP_CONFIRM_ACTIONS).
    confirm: Option<&'a str>,
}

/// Run one client over HTTP against `server`; panics with its transcript
/// and the server's log on failure. Returns its stdout.
fn run_client(client: Client, server: &HttpServer, run: &Run<'_>) -> String {
    let mut cmd = client_command(client);
    if let Some(socket) = &server.socket {
        cmd.arg("--http-unix-socket").arg(socket);
    }
    if let Some(ca) = &server.ca_file {
        // Node reads its extra CAs at start; the Python client takes its own.
        cmd.env("NODE_EXTRA_CA_CERTS", ca).env("SNOWLUMA_TEST_HTTP_CA_FILE", ca);
    }
    cmd.arg("--http")
        .arg(server.url())
        .current_dir(repo_root())
        .env_remove("SNOWLUMA_MCP_BIN")
        .env("SNOWLUMA_TEST_HTTP_TOKEN_FILE", &server.token_file)
        .env("INTEROP_MODE", run.mode);
    if let Some(e) = run.endpoint {
        cmd.env("INTEROP_ENDPOINT", e);
    }
    if let Some(d) = run.stream_dir {
        cmd.env("INTEROP_STREAM_DIR", d);
    }
    if let Some((url, self_id)) = &run.events {
        cmd.env("INTEROP_EVENTS_URL", url).env("INTEROP_SELF_ID", self_id.to_string());
    }
    if let Some(a) = run.confirm {
        cmd.env("INTEROP_CONFIRM_ACTIONS", a);
    }
    let out =
        cmd.bounded_output().unwrap_or_else(|e| panic!("{client:?}: cannot start the client ({e}); {SETUP_HINT}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stdout.contains("\nFAIL") && !stdout.starts_with("FAIL"),
        "{client:?} over HTTP in {} mode failed ({}):\n{stdout}\n--- client stderr ---\n{stderr}\n--- server ---\n{}",
        run.mode,
        out.status,
        server.stderr_text()
    );
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() > 0,
        "{client:?} {}: no check ran:\n{stdout}",
        run.mode
    );
    assert!(!stdout.contains(&server.token) && !stderr.contains(&server.token), "{client:?}: the token was printed");
    assert!(!server.stderr_text().contains(&server.token), "{client:?}: the server logged the token");
    server.assert_no_crash(&format!("{client:?} {}", run.mode));
    stdout
}

/// How many sessions a client ran (`ok [<session>] ...` labels; see interop.rs).
fn sessions(out: &str) -> usize {
    let labels: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ok [").and_then(|r| r.split_once(']')).map(|(label, _)| label))
        .collect();
    labels.len().max(1)
}

/// Whether the client's write run completes input through elicitation
/// (v2 and Python; v1 does not run that step).
fn completes_input(client: Client) -> bool {
    matches!(client, Client::TsV2 | Client::Python)
}

fn docs(client: Client) {
    let server = HttpServer::start(&format!("{client:?}-docs"), ServerEnv { mode: "docs", ..ServerEnv::default() });
    run_client(client, &server, &Run { mode: "docs", endpoint: None, stream_dir: None, events: None, confirm: None });
}

fn read(client: Client) {
    let fake = Fake::start(None);
    fake.fake.interop_preset();
    let ev = fake.start_events(None, snowluma_fake::events::INTEROP_SELF_ID);
    ev.interop_preset();
    let server = HttpServer::start(
        &format!("{client:?}-read"),
        ServerEnv { mode: "read", endpoint: Some(fake.fake.url()), events_url: Some(ev.url()), ..ServerEnv::default() },
    );
    let endpoint = fake.fake.url();
    let out = run_client(
        client,
        &server,
        &Run {
            mode: "read",
            endpoint: Some(&endpoint),
            stream_dir: None,
            events: Some((ev.url(), ev.self_id())),
            confirm: None,
        },
    );
    let n = sessions(&out);
    let actions: Vec<String> = fake.fake.requests().into_iter().filter_map(|r| r.action).collect();
    // One WebSocket per session, opened by subscribe_events and closed by
    // the release (or at the latest when the session ends).
    assert_eq!(ev.accepted(), n, "{client:?}: one event WebSocket per session");
    wait_until(&format!("{client:?}: every event WebSocket is closed"), || {
        (ev.open() == 0 && ev.closed() == n).then_some(())
    });
    assert!(ev.auto_sent() > 0, "{client:?}: the fake injected events");
    assert_eq!(ev.received(), Vec::<String>::new(), "{client:?}: the client sent data on the event socket");
    assert_eq!(actions, vec!["get_status".to_owned(); n], "{client:?}: only the scenario's actions reached SnowLuma");
}

fn write(client: Client) {
    let fake = Fake::start(None);
    fake.fake.interop_preset();
    let stream_dir = private_dir(&format!("{client:?}-stream"));
    // The clients that answer forms also confirm a keyed set_group_kick.
    let confirm = completes_input(client).then_some("set_group_kick");
    let server = HttpServer::start(
        &format!("{client:?}-write"),
        ServerEnv {
            mode: "write",
            endpoint: Some(fake.fake.url()),
            stream_dir: Some(stream_dir.clone()),
            confirm_actions: confirm,
            ..ServerEnv::default()
        },
    );
    let endpoint = fake.fake.url();
    let out = run_client(
        client,
        &server,
        &Run { mode: "write", endpoint: Some(&endpoint), stream_dir: Some(&stream_dir), events: None, confirm },
    );
    let n = sessions(&out);
    let completed = if completes_input(client) { n } else { 0 };
    assert_interop_write_run(&fake, &format!("{client:?}"), n, completed, &stream_dir);
    let kicks = fake.fake.requests().into_iter().filter(|r| r.action.as_deref() == Some("set_group_kick")).count();
    assert_eq!(kicks, completed, "{client:?}: each confirmed, keyed kick went out exactly once per session");
    // Over HTTP the server's log is the harness's (over stdio the Python
    // client checks this line itself).
    server.wait_stderr("failure=\"cancelled\"", &format!("{client:?}: the server logs the cancelled query_action"));
    drop(server);
    let _ = std::fs::remove_dir_all(&stream_dir);
}

#[test]
fn typescript_sdk_v1_http_docs() {
    docs(Client::TsV1);
}
#[test]
fn typescript_sdk_v1_http_read() {
    read(Client::TsV1);
}
#[test]
fn typescript_sdk_v1_http_write() {
    write(Client::TsV1);
}

#[test]
fn typescript_sdk_v2_http_docs() {
    docs(Client::TsV2);
}
#[test]
fn typescript_sdk_v2_http_read() {
    read(Client::TsV2);
}
#[test]
fn typescript_sdk_v2_http_write() {
    write(Client::TsV2);
}

/// The MCP Inspector's CLI (`--config` session file with the bearer
/// header; tests/interop/node/inspector.mjs) against serve-http in docs mode.
#[test]
fn inspector_cli_http_docs() {
    docs(Client::Inspector);
}

/// The same in read mode against the fake SnowLuma: the run lists read
/// mode's tools and reads the catalog; it executes nothing, so no request
/// reaches SnowLuma (the Inspector's CLI cannot receive notifications, so
/// the server gets no event WebSocket).
#[test]
fn inspector_cli_http_read() {
    let fake = Fake::start(None);
    fake.fake.interop_preset();
    let endpoint = fake.fake.url();
    let server = HttpServer::start(
        "Inspector-read",
        ServerEnv { mode: "read", endpoint: Some(endpoint.clone()), ..ServerEnv::default() },
    );
    run_client(
        Client::Inspector,
        &server,
        &Run { mode: "read", endpoint: Some(&endpoint), stream_dir: None, events: None, confirm: None },
    );
    let actions: Vec<String> = fake.fake.requests().into_iter().filter_map(|r| r.action).collect();
    assert_eq!(actions, Vec::<String>::new(), "Inspector: nothing reached SnowLuma");
}

#[test]
fn python_sdk_http_docs() {
    docs(Client::Python);
}
#[test]
fn python_sdk_http_read() {
    read(Client::Python);
}
#[test]
fn python_sdk_http_write() {
    write(Client::Python);
}

/// `serve-http --listen /abs/path.sock`: the Python SDK (httpx2's Unix
/// socket transport) in docs mode.
#[test]
fn python_sdk_http_docs_over_a_unix_socket() {
    let server = HttpServer::start_unix("unix-docs", ServerEnv { mode: "docs", ..ServerEnv::default() });
    run_client(
        Client::Python,
        &server,
        &Run { mode: "docs", endpoint: None, stream_dir: None, events: None, confirm: None },
    );
}

/// TLS (`--tls-cert`, `--tls-key`): the three SDK clients and the
/// Inspector's CLI in docs mode over https, trusting the test certificate,
/// and the conformance suite's DNS-rebinding and listing scenarios through
/// the proxy over https.
#[test]
fn sdk_clients_and_conformance_over_tls() {
    let server = HttpServer::start("tls", ServerEnv { mode: "docs", tls: true, ..ServerEnv::default() });
    for client in [Client::TsV1, Client::TsV2, Client::Python, Client::Inspector] {
        run_client(
            client,
            &server,
            &Run { mode: "docs", endpoint: None, stream_dir: None, events: None, confirm: None },
        );
    }
    let out = Command::new(interop_dir().join("conformance.sh"))
        .arg(server.url())
        .arg(&server.token_file)
        .args(["--scenario", "dns-rebinding-protection", "--scenario", "tools-list", "--scenario", "server-initialize"])
        .env("NODE_EXTRA_CA_CERTS", server.ca_file.as_ref().unwrap())
        .current_dir(repo_root())
        .bounded_output()
        .unwrap_or_else(|e| panic!("cannot run tests/interop/conformance.sh ({e}); {SETUP_HINT}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the conformance scenarios over TLS failed ({}):\n{stdout}\n--- stderr ---\n{}\n--- server ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        server.stderr_text()
    );
    server.assert_no_crash("tls");
}

// --------------------------------------------------------------- the door --

/// The status code of a raw HTTP/1.1 `initialize` POST to /mcp with
/// `authorization` (a whole header value) if any.
fn post_initialize(port: u16, authorization: Option<&str>) -> u16 {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}
    })
    .to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(a) = authorization {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(snowluma_e2e::SAFETY)).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut status = String::new();
    BufReader::new(s).read_line(&mut status).unwrap();
    let code = status.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    code.unwrap_or_else(|| panic!("not an HTTP status line: {status:?}"))
}

#[test]
fn requests_without_the_token_are_refused() {
    let server = HttpServer::start("door", ServerEnv { mode: "docs", ..ServerEnv::default() });
    assert_eq!(post_initialize(server.port, None), 401, "no Authorization header");
    let wrong = random_token();
    assert_eq!(post_initialize(server.port, Some(&format!("Bearer {wrong}"))), 401, "a wrong token");
    assert_eq!(post_initialize(server.port, Some(&format!("Basic {}", server.token))), 401, "not a bearer token");
    let ok = post_initialize(server.port, Some(&format!("Bearer {}", server.token)));
    assert!((200..300).contains(&ok), "the right token: HTTP {ok}");
    assert!(!server.stderr_text().contains(&wrong), "the server logged a presented token");
    server.assert_no_crash("door");
}

#[test]
fn a_token_file_others_can_read_is_refused() {
    let dir = private_dir("loose-token-file");
    let token_file = write_token_file(&dir, &random_token(), 0o644);
    let env = ServerEnv { mode: "docs", ..ServerEnv::default() };
    let mut cmd = serve_http_command(&env, &token_file, &format!("127.0.0.1:{}", free_port()));
    let (mut child, log) = spawn_logged(&mut cmd);
    let status = wait_exit(&mut child, "serve-http refuses a group/world-readable token file");
    assert!(!status.success(), "serve-http started with a 0644 token file:\n{}", log.lock().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
