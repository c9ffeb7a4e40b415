#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One legacy and one modern session driven by rmcp's own client.

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use serde_json::json;
use snowluma_e2e::{SAFETY, bin_path};
use tokio::net::unix::pipe;

fn command() -> std::process::Command {
    let mut c = std::process::Command::new(bin_path());
    c.env_clear().env("SNOWLUMA_MCP_LOG", "warn");
    c
}

/// The server spawned by `command` with piped stdio, killed when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawn `c` with piped stdio; its pipes as rmcp's (AsyncRead, AsyncWrite)
/// transport (rmcp's child-process transport would need another nix, and
/// tokio's `process` feature, which the server does without).
fn spawn(mut c: std::process::Command) -> (Server, (pipe::Receiver, pipe::Sender)) {
    let mut child = c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let stdout = pipe::Receiver::from_owned_fd(child.stdout.take().unwrap().into()).unwrap();
    let stdin = pipe::Sender::from_owned_fd(child.stdin.take().unwrap().into()).unwrap();
    (Server(child), (stdout, stdin))
}

async fn session(mode: ClientLifecycleMode) {
    let (_server, transport) = spawn(command());
    let client = ().serve_with_lifecycle(transport, mode).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        ["list_actions", "get_action", "search_actions", "list_categories", "get_runtime_info", "preview_message"]
    );
    let args = json!({"query": "群 禁言", "match": "keywords"});
    let r = client
        .call_tool(CallToolRequestParams::new("search_actions").with_arguments(args.as_object().unwrap().clone()))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false));
    let sc = r.structured_content.unwrap();
    assert!(sc["result"]["count"].as_u64().unwrap() >= 2);
    assert_eq!(sc["diagnostics"]["outcome"], "success");
    let res = client.list_all_resources().await.unwrap();
    assert_eq!(res[0].uri, "snowluma://onebot/actions");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn legacy_session_through_rmcp_client() {
    tokio::time::timeout(SAFETY, session(ClientLifecycleMode::Initialize)).await.expect("the session timed out");
}

#[tokio::test]
async fn modern_session_through_rmcp_client() {
    let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    tokio::time::timeout(SAFETY, session(mode)).await.expect("the session timed out");
}

/// A write session with a target scope and a day-long per-target interval:
/// an out-of-scope send and a second send to the same group are tool errors
/// rmcp's client reads as such (`out_of_scope`; `rate_limited` with
/// `retry_after_ms`), and only the first in-scope send is made.
async fn safety_session(url: &str, mode: ClientLifecycleMode) {
    let mut c = command();
    c.env("SNOWLUMA_MCP_ENDPOINT", url)
        .env("SNOWLUMA_MCP_TOKEN", "t")
        .env("SNOWLUMA_MCP_MODE", "write")
        .env("SNOWLUMA_MCP_ALLOW_GROUPS", "20001")
        .env("SNOWLUMA_MCP_SEND_INTERVAL_MS", "86400000")
        .env("SNOWLUMA_MCP_SEND_BURST", "0");
    let (_server, transport) = spawn(c);
    let client = ().serve_with_lifecycle(transport, mode).await.unwrap();
    let send = |g: u64| {
        let args = json!({"action": "send_group_msg", "params": {"group_id": g, "message": "hi"}});
        CallToolRequestParams::new("invoke_action").with_arguments(args.as_object().unwrap().clone())
    };
    let r = client.call_tool(send(20002)).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(r.structured_content.unwrap()["diagnostics"]["kind"], "out_of_scope");
    let r = client.call_tool(send(20001)).await.unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let r = client.call_tool(send(20001)).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    let d = r.structured_content.unwrap()["diagnostics"].clone();
    assert_eq!(d["kind"], "rate_limited");
    assert!(d["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{d}");
    client.cancel().await.unwrap();
}

#[test]
fn scope_and_pacing_refusals_through_rmcp_client_in_both_eras() {
    let fake = snowluma_e2e::Fake::start(Some("t"));
    let url = fake.fake.url();
    let modes = [
        ClientLifecycleMode::Initialize,
        ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
    ];
    for mode in modes {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { tokio::time::timeout(SAFETY, safety_session(&url, mode)).await.expect("timed out") });
    }
    let sends = fake.fake.requests().iter().filter(|q| q.action.as_deref() == Some("send_group_msg")).count();
    assert_eq!(sends, 2, "one in-scope send per session, nothing refused");
}
