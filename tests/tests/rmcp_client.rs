#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One legacy and one modern session driven by rmcp's own client.

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use serde_json::json;
use snowluma_e2e::{SAFETY, bin_path};

fn command() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(bin_path());
    c.env_clear().env("SNOWLUMA_MCP_LOG", "warn");
    c
}

async fn session(mode: ClientLifecycleMode) {
    // Spawned here, its pipes handed to rmcp as an (AsyncRead, AsyncWrite)
    // transport (rmcp's child-process transport would need another nix).
    let mut child = command()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
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
