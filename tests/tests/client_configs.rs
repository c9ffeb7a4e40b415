#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The client configurations we publish work: every snippet in the README's
//! "Using it from an MCP client" section and every direct configuration in
//! `packaging/clients/` names the installed binary's path, sets only
//! variables the server knows, and, run as the client would run it (that
//! command and that environment, with the endpoint pointed at the fake),
//! starts a session in the configured mode.

use std::path::Path;

use serde_json::Value;
use snowluma_e2e::*;

const KNOWN: [&str; 16] = [
    "SNOWLUMA_MCP_ENDPOINT",
    "SNOWLUMA_MCP_MODE",
    "SNOWLUMA_MCP_TOKEN",
    "SNOWLUMA_MCP_TIMEOUT_MS",
    "SNOWLUMA_MCP_STREAM_DIR",
    "SNOWLUMA_MCP_UPLOAD_ROOT",
    "SNOWLUMA_MCP_MAX_STREAM_BYTES",
    "SNOWLUMA_MCP_EVENTS_URL",
    "SNOWLUMA_MCP_TASK_DIR",
    "SNOWLUMA_MCP_AUDIT_LOG",
    "SNOWLUMA_MCP_AUDIT_KEY",
    "SNOWLUMA_MCP_ALLOW_ACTIONS",
    "SNOWLUMA_MCP_DENY_ACTIONS",
    "SNOWLUMA_MCP_ALLOW_UNCONFINED",
    "SNOWLUMA_MCP_LOG",
    "SNOWLUMA_MCP_LOG_PAYLOADS",
];

fn repo_file(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)).unwrap()
}

/// The fenced blocks of `lang` in the README section `heading`.
fn blocks(text: &str, heading: &str, lang: &str) -> Vec<String> {
    let start = text.find(heading).unwrap_or_else(|| panic!("README has no {heading}"));
    let rest = &text[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut s = section;
    while let Some(i) = s.find(&fence) {
        let body = &s[i + fence.len()..];
        let end = body.find("```").unwrap();
        out.push(body[..end].to_owned());
        s = &body[end + 3..];
    }
    out
}

/// (command, environment) of the `snowluma` entry of a client's JSON file.
fn entry(config: &Value) -> (String, Vec<(String, String)>) {
    let servers = config.get("mcpServers").or_else(|| config.get("servers")).expect("mcpServers or servers");
    let e = &servers["snowluma"];
    if let Some(t) = e.get("type") {
        assert_eq!(t, "stdio");
    }
    if let Some(args) = e.get("args") {
        assert_eq!(args, &Value::Array(vec![]), "no arguments: the configuration is the environment");
    }
    let env = e["env"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect::<Vec<_>>());
    (e["command"].as_str().unwrap().to_owned(), env.unwrap_or_default())
}

/// Start the built binary with a published environment (endpoint moved to
/// the fake, token placeholders filled in: the fake takes any) and check the
/// session comes up in the configured mode.
fn runs(label: &str, env: &[(String, String)], fake_url: &str) {
    for (k, _) in env {
        assert!(KNOWN.contains(&k.as_str()), "{label}: unknown variable {k}");
    }
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| match k.as_str() {
            "SNOWLUMA_MCP_ENDPOINT" => (k.clone(), fake_url.to_owned()),
            // A placeholder (`<...>`) or a client-side reference
            // (`${input:...}`, `${SNOWLUMA_MCP_TOKEN}`) the user or the
            // client fills in.
            "SNOWLUMA_MCP_TOKEN" => {
                assert!(v.starts_with('<') || v.starts_with("${"), "{label}: no real token in a published snippet");
                (k.clone(), "test-token".to_owned())
            }
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut s = Mcp::spawn(&pairs);
    s.initialize("2025-11-25");
    let list = s.ok("tools/list", Value::Null);
    let names: Vec<&str> = list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mode = env.iter().find(|(k, _)| k == "SNOWLUMA_MCP_MODE").map(|(_, v)| v.as_str()).unwrap_or("docs");
    assert_eq!(names.contains(&"query_action"), mode != "docs", "{label}: tools {names:?} for mode {mode}");
    let info = s.call("get_runtime_info", serde_json::json!({}));
    assert_eq!(structured(&info)["result"]["mode"], mode, "{label}");
}

#[test]
fn readme_snippets_name_the_installed_binary_and_start_a_session() {
    let fake = Fake::start(None);
    let readme = repo_file("README.md");
    let heading = "## Using it from an MCP client";
    let json = blocks(&readme, heading, "json");
    assert!(json.len() >= 3, "Claude Desktop/Cursor, VS Code and Cline snippets");
    for (i, text) in json.iter().enumerate() {
        let config: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("README snippet {i}: {e}"));
        let (command, env) = entry(&config);
        assert_eq!(command, "/usr/local/bin/snowluma-mcp", "README snippet {i}");
        runs(&format!("README snippet {i}"), &env, &fake.fake.url());
    }
    // Claude Code's command line: `--env K=V` pairs, then `-- <command>`.
    let sh = blocks(&readme, heading, "sh");
    let line = sh.iter().find(|b| b.starts_with("claude mcp add")).expect("a claude mcp add line");
    let (opts, command) = line.trim().split_once(" -- ").unwrap();
    assert_eq!(command, "/usr/local/bin/snowluma-mcp");
    let words: Vec<&str> = opts.split_whitespace().collect();
    assert!(words.windows(2).any(|w| w == ["--transport", "stdio"]));
    let env: Vec<(String, String)> = words
        .windows(2)
        .filter(|w| w[0] == "--env")
        .map(|w| {
            let (k, v) = w[1].split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert!(!env.is_empty());
    runs("claude mcp add", &env, &fake.fake.url());
}

#[test]
fn packaged_direct_configurations_start_a_session() {
    let fake = Fake::start(None);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/clients");
    let mut n = 0;
    for f in std::fs::read_dir(dir).unwrap() {
        let path = f.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.contains(".direct.") {
            continue;
        }
        let config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (command, env) = entry(&config);
        assert_eq!(command, "/usr/bin/snowluma-mcp", "{name}: the .deb's path");
        // `${SNOWLUMA_MCP_TOKEN}` is expanded by Claude Code; any value works here.
        runs(&name, &env, &fake.fake.url());
        n += 1;
    }
    assert!(n >= 3, "Claude Code, Cursor and Cline direct configurations");
}
