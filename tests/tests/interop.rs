#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Interoperability: the real MCP clients people use drive the built binary,
//! each spawning it exactly as it does in production (the TypeScript SDKs
//! and the Inspector through Node's child_process, i.e. socketpairs; the
//! Python SDK through pipes). The clients live in `tests/interop/` and are
//! installed, pinned, by `tests/interop/setup.sh` (the README's test command
//! runs it). Missing clients fail these tests with the command to run; they
//! are never skipped.
//!
//! Each client script runs its own checks (listing tools first, so that
//! the SDKs' output validation is on, and validating every result against
//! the advertised `outputSchema` with a real JSON Schema validator) and
//! exits non-zero on any failure; here each runs in docs, read and write
//! mode, and the fake SnowLuma's log is checked afterwards: each write went
//! out exactly once, the cancelled call's connection was closed, the
//! download left exactly one complete file. The TypeScript SDK v2 and the
//! Python SDK (both of its sessions) also complete a missing parameter
//! through elicitation in write mode (`invoke_action_with_input` with
//! `{"action":"send_group_msg","params":{"group_id":20001}}`, their handlers
//! answering `{"message":"Hello"}`): the fake must see that write exactly
//! once per session, with the merged params.
//!
//! Live event resources: in read mode the TypeScript SDK v1 and v2 clients
//! and the Python SDK (both sessions) also get `SNOWLUMA_MCP_EVENTS_URL`,
//! the fake's event WebSocket, which injects a group message every 200 ms
//! once connected (`FakeEvents::interop_preset`). v2 and Python's modern
//! session: `subscribe_events`, `subscriptions/listen` with the URI, an
//! update, reads with cursors, closing the stream, `unsubscribe_events`;
//! v1 and Python's legacy session: `resources/subscribe`, an update, reads,
//! `resources/unsubscribe`. The fake must see one WebSocket opened and
//! closed per session, nothing sent on it, and no HTTP action but the
//! scenario's own `get_status`.
//!
//! Message preview: every client calls `preview_message` in every mode
//! (`can_send` only in write mode) and sees no `_meta.ui` and no `ui://`
//! resource; then the TypeScript SDK v1 and v2 and the Python SDK (both
//! eras) run one more session whose client declares the MCP Apps extension
//! (`io.modelcontextprotocol/ui` with `text/html;profile=mcp-app`): the tool
//! links the panel and the panel's resource is listed and read. None of it
//! reaches SnowLuma (the fake's logs above count only the scenario's own
//! actions). The Inspector's CLI calls `preview_message` in both eras
//! (the text `[CQ:at,qq=all] <b>hi</b>` must come back as one literal text
//! segment of the invoke_action arguments, `can_send` false) and with an
//! empty text (a tool error), and probes the panel with `--app-info`
//! (no app without `--advertise-apps`, the `ui://` resource with it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use snowluma_e2e::{BoundedOutput, Fake, assert_interop_write_run, bin_path};

#[derive(Debug, Clone, Copy)]
enum Client {
    TsV1,
    TsV2,
    Inspector,
    Python,
}

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("interop")
}

fn venv_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/interop/venv/bin/python")
}

const SETUP_HINT: &str = "the interoperability clients are not installed: run `tests/interop/setup.sh` \
     (`./scripts/test` runs it; it needs node >= 20, npm and python3 with venv)";

fn command(client: Client) -> Command {
    let dir = interop_dir();
    match client {
        Client::Python => {
            let py = venv_python();
            assert!(py.exists(), "{SETUP_HINT} (missing {})", py.display());
            let mut c = Command::new(py);
            c.arg(dir.join("python/client.py"));
            c
        }
        _ => {
            assert!(dir.join("node_modules").is_dir(), "{SETUP_HINT} (missing tests/interop/node_modules)");
            let script = match client {
                Client::TsV1 => "node/v1.mjs",
                Client::TsV2 => "node/v2.mjs",
                _ => "node/inspector.mjs",
            };
            let mut c = Command::new("node");
            c.arg(dir.join(script));
            c
        }
    }
}

/// Where the client's server finds the fake's event WebSocket, and the account.
struct EventsEnv {
    url: String,
    self_id: i64,
}

/// Run one client in one mode; panics with its transcript on failure.
fn run(client: Client, mode: &str, endpoint: Option<&str>, stream_dir: Option<&Path>) -> String {
    run_with(client, mode, endpoint, stream_dir, None)
}

fn run_with(
    client: Client,
    mode: &str,
    endpoint: Option<&str>,
    stream_dir: Option<&Path>,
    events: Option<&EventsEnv>,
) -> String {
    run_env(client, mode, endpoint, stream_dir, events, &[])
}

/// [`run_with`] with more variables for the client (`INTEROP_*`).
fn run_env(
    client: Client,
    mode: &str,
    endpoint: Option<&str>,
    stream_dir: Option<&Path>,
    events: Option<&EventsEnv>,
    extra: &[(&str, &str)],
) -> String {
    let mut cmd = command(client);
    cmd.envs(extra.iter().copied());
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env("SNOWLUMA_MCP_BIN", bin_path())
        .env("INTEROP_MODE", mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(e) = endpoint {
        cmd.env("INTEROP_ENDPOINT", e);
    }
    if let Some(d) = stream_dir {
        cmd.env("INTEROP_STREAM_DIR", d);
    }
    if let Some(ev) = events {
        cmd.env("INTEROP_EVENTS_URL", &ev.url).env("INTEROP_SELF_ID", ev.self_id.to_string());
    }
    let out =
        cmd.bounded_output().unwrap_or_else(|e| panic!("{client:?}: cannot start the client ({e}); {SETUP_HINT}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stdout.contains("\nFAIL") && !stdout.starts_with("FAIL"),
        "{client:?} in {mode} mode failed ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
    assert!(stdout.lines().filter(|l| l.starts_with("ok ")).count() > 0, "{client:?} {mode}: no check ran:\n{stdout}");
    // The server's stderr reaches the client's: no process of the tree may
    // have aborted or panicked, even after the session ended.
    for bad in ["fatal runtime error", "panicked"] {
        assert!(!stderr.contains(bad), "{client:?} {mode}: the server's stderr has {bad:?}:\n{stderr}");
    }
    stdout
}

/// How many server sessions a client ran: its check lines are labelled
/// `ok [<session>] ...` when it ran several (the Python client runs a legacy
/// and a modern one), unlabelled when it ran one.
fn sessions(out: &str) -> usize {
    let labels: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ok [").and_then(|r| r.split_once(']')).map(|(label, _)| label))
        .collect();
    labels.len().max(1)
}

/// Whether the client's write run completes input through elicitation
/// (common.mjs `inputCompletion`, client.py `c_invoke_with_input`). The TS
/// SDK v1 client does not run that step; the Inspector's CLI cannot answer
/// server requests and runs no write mode here.
fn completes_input(client: Client) -> bool {
    matches!(client, Client::TsV2 | Client::Python)
}

fn docs(client: Client) {
    run(client, "docs", None, None);
}

/// Whether the client's read run exercises live event resources (the
/// Inspector's CLI cannot receive notifications and runs without them).
fn uses_events(client: Client) -> bool {
    matches!(client, Client::TsV1 | Client::TsV2 | Client::Python)
}

fn read(client: Client) {
    let fake = Fake::start(None);
    fake.fake.interop_preset();
    let ev = uses_events(client).then(|| {
        let ev = fake.start_events(None, snowluma_fake::events::INTEROP_SELF_ID);
        ev.interop_preset();
        ev
    });
    let env = ev.as_ref().map(|e| EventsEnv { url: e.url(), self_id: e.self_id() });
    let out = run_with(client, "read", Some(&fake.fake.url()), None, env.as_ref());
    let actions: Vec<String> = fake.fake.requests().into_iter().filter_map(|r| r.action).collect();
    if let Some(ev) = &ev {
        let n = sessions(&out);
        // One WebSocket per session, opened by subscribe_events and closed
        // by the release (or at the latest by the session's end).
        assert_eq!(ev.accepted(), n, "{client:?}: one event WebSocket per session");
        snowluma_e2e::wait_until(&format!("{client:?}: every event WebSocket is closed"), || {
            (ev.open() == 0 && ev.closed() == n).then_some(())
        });
        assert!(ev.auto_sent() > 0, "{client:?}: the fake injected events");
        assert_eq!(ev.received(), Vec::<String>::new(), "{client:?}: the client sent data on the event socket");
        // No event operation executed an action: the only HTTP actions are
        // the scenario's own get_status calls, one per session.
        assert_eq!(
            actions,
            vec!["get_status".to_owned(); n],
            "{client:?}: only the scenario's actions reached SnowLuma"
        );
    }
    // The Inspector's CLI run lists tools (read mode's schemas, --strict),
    // reads resources and previews a message; it executes nothing.
    if matches!(client, Client::Inspector) {
        assert_eq!(actions, Vec::<String>::new(), "{client:?}: nothing reached SnowLuma");
    } else {
        assert!(actions.iter().any(|a| a == "get_status"), "{client:?}: get_status reached SnowLuma");
    }
    for refused in ["get_cookies", "send_group_msg"] {
        assert!(!actions.iter().any(|a| a == refused), "{client:?}: {refused} must be refused before SnowLuma");
    }
}

fn write(client: Client) {
    let fake = Fake::start(None);
    fake.fake.interop_preset();
    let dir = std::env::temp_dir().join(format!("snowluma-interop-{client:?}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The clients that answer forms also confirm set_group_kick
    // (SNOWLUMA_MCP_CONFIRM_ACTIONS) and retry it with its idempotency key.
    let confirm: &[(&str, &str)] =
        if completes_input(client) { &[("INTEROP_CONFIRM_ACTIONS", "set_group_kick")] } else { &[] };
    let out = run_env(client, "write", Some(&fake.fake.url()), Some(&dir), None, confirm);
    let n = sessions(&out);
    let completed = if completes_input(client) { n } else { 0 };
    assert_interop_write_run(&fake, &format!("{client:?}"), n, completed, &dir);
    let kicks = fake.fake.requests().into_iter().filter(|r| r.action.as_deref() == Some("set_group_kick")).count();
    assert_eq!(kicks, completed, "{client:?}: each confirmed, keyed kick went out exactly once per session");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn typescript_sdk_v1_docs() {
    docs(Client::TsV1);
}
#[test]
fn typescript_sdk_v1_read() {
    read(Client::TsV1);
}
#[test]
fn typescript_sdk_v1_write() {
    write(Client::TsV1);
}

#[test]
fn typescript_sdk_v2_docs() {
    docs(Client::TsV2);
}
#[test]
fn typescript_sdk_v2_read() {
    read(Client::TsV2);
}
#[test]
fn typescript_sdk_v2_write() {
    write(Client::TsV2);
}

#[test]
fn python_sdk_docs() {
    docs(Client::Python);
}
#[test]
fn python_sdk_read() {
    read(Client::Python);
}
#[test]
fn python_sdk_write() {
    write(Client::Python);
}

#[test]
fn inspector_cli_docs() {
    docs(Client::Inspector);
}
#[test]
fn inspector_cli_read() {
    read(Client::Inspector);
}
