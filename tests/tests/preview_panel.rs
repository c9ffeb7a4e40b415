#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The message preview panel in a real browser: `ui/preview/test/panel.test.mjs`
//! (Node's test runner, playwright-core driving Debian's Chromium) renders
//! the panel the binary serves inside a test host page built on the
//! official AppBridge, with drafts and tools/call going through real
//! snowluma-mcp sessions against the fake SnowLuma started here. See that
//! file for the scenarios: hostile text stays literal and nothing is
//! fetched (even requests that script inside the panel makes are refused by
//! its policy; a control shows the network log sees a fetch), disabled states (read mode, a host without server tools), one
//! click and a double click each send once, error and unknown outcomes are
//! shown and not retried; a screenshot goes to
//! `target/test-artifacts/preview-panel.png`.
//!
//! Afterwards the fake's log must show exactly the two sends of the two
//! clicking scenarios that reached the write-mode session, each carrying the
//! draft's literal text segment, and nothing else.
//!
//! `ui/preview/setup.sh` (run by `./scripts/test`) installs the pinned Node
//! packages and Chromium; missing ones fail this test with the command to
//! run, it is never skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use snowluma_e2e::{BoundedOutput, Fake, bin_path};

fn ui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/preview")
}

const SETUP_HINT: &str = "the preview panel's browser test is not set up: run `ui/preview/setup.sh` \
     (`./scripts/test` runs it; it needs node >= 20, npm and Debian's chromium)";

#[test]
fn the_panel_in_headless_chromium() {
    let dir = ui_dir();
    assert!(dir.join("node_modules/playwright-core").is_dir(), "{SETUP_HINT} (missing ui/preview/node_modules)");
    assert!(Path::new("/usr/bin/chromium").exists(), "{SETUP_HINT} (missing /usr/bin/chromium)");
    let fake = Fake::start(None);
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    let out = Command::new("node")
        .args(["--test", "--test-reporter=spec", "test/panel.test.mjs"])
        .current_dir(&dir)
        .env("SNOWLUMA_MCP_BIN", bin_path())
        .env("PREVIEW_ENDPOINT", fake.fake.url())
        .env("PREVIEW_ARTIFACTS", &artifacts)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .bounded_output()
        .unwrap_or_else(|e| panic!("cannot start node ({e}); {SETUP_HINT}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the browser test failed ({}):\n{stdout}\n--- stderr ---\n{stderr}", out.status);
    assert!(stdout.contains("pass 8") && stdout.contains("fail 0"), "not every scenario ran:\n{stdout}");
    for bad in ["fatal runtime error", "panicked"] {
        assert!(!stderr.contains(bad), "the server's stderr has {bad:?}:\n{stderr}");
    }
    assert!(artifacts.join("preview-panel.png").is_file(), "no screenshot");

    let sends: Vec<Value> = fake.fake.requests().into_iter().filter_map(|r| r.json()).collect();
    assert_eq!(sends.len(), 2, "one send per clicking scenario: {sends:?}");
    for body in &sends {
        assert_eq!(body["action"], "send_group_msg", "{body}");
        let params = &body["params"];
        assert_eq!(params["group_id"], 20001);
        let message = params["message"].as_array().unwrap();
        assert_eq!(message[0], json!({"type": "reply", "data": {"id": "-123456"}}));
        assert_eq!(message[1]["type"], "text");
        let text = message[1]["data"]["text"].as_str().unwrap();
        assert_eq!(text.chars().count(), 10_000);
        assert!(text.starts_with("<img src=x onerror=") && text.contains("[CQ:at,qq=all]"), "sent literally");
    }
}
