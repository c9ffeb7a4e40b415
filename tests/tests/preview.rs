#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `preview_message` through the built binary: the same draft in every mode
//! and era, `can_send` from mode, endpoint and policy, argument checks, no
//! request to SnowLuma, and the MCP Apps panel (`_meta.ui` on the tool, the
//! `ui://` resource, its cache hints) only for clients that declare the
//! `io.modelcontextprotocol/ui` extension with `text/html;profile=mcp-app`.
//! The panel itself runs in a browser in `preview_panel.rs`.

use serde_json::{Value, json};
use snowluma_e2e::*;

const UI_URI: &str = "ui://snowluma-mcp/preview-message.html";
const UI_MIME: &str = "text/html;profile=mcp-app";
const ASSET: &str = include_str!("../../supervisor/assets/preview-panel.html");

fn ui_caps() -> Value {
    json!({"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": [UI_MIME]}}})
}

fn group_draft() -> Value {
    json!({"message_type": "group", "target_id": 20001, "text": "Hello [CQ:at,qq=all]", "reply_to": -123456})
}

fn preview_tool(list: &Value) -> Value {
    list["tools"].as_array().unwrap().iter().find(|t| t["name"] == "preview_message").cloned().unwrap()
}

fn ui_resources(list: &Value) -> Vec<Value> {
    list["resources"].as_array().unwrap().iter().filter(|r| r["uri"] == UI_URI).cloned().collect()
}

#[test]
fn the_same_draft_in_every_mode_and_nothing_is_sent() {
    let fake = Fake::start(None);
    let url = fake.fake.url();
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, bool, &str); 4] = [
        (&[], false, "sending needs write mode; this server runs in docs mode"),
        (&[("SNOWLUMA_MCP_MODE", "read"), ("SNOWLUMA_MCP_ENDPOINT", &url)], false, "read mode"),
        (&[("SNOWLUMA_MCP_MODE", "write"), ("SNOWLUMA_MCP_ENDPOINT", &url)], true, ""),
        (
            &[
                ("SNOWLUMA_MCP_MODE", "write"),
                ("SNOWLUMA_MCP_ENDPOINT", &url),
                ("SNOWLUMA_MCP_DENY_ACTIONS", "send_group_msg"),
            ],
            false,
            "send_group_msg is refused by this server's action policy",
        ),
    ];
    let mut drafts = Vec::new();
    for (env, can_send, reason) in cases {
        let mut s = Mcp::spawn(env);
        s.initialize("2025-11-25");
        let r = s.call("preview_message", group_draft());
        assert!(!is_error(&r), "{r}");
        let sc = structured(&r);
        assert_eq!(sc["diagnostics"]["outcome"], "success");
        let result = &sc["result"];
        assert_eq!(result["can_send"], can_send, "{env:?}: {result}");
        if can_send {
            assert_eq!(result["send_blocked_by"], Value::Null);
        } else {
            assert!(result["send_blocked_by"].as_str().unwrap().contains(reason), "{env:?}: {result}");
        }
        assert_eq!(
            result["invoke_action"],
            json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": [
                {"type": "reply", "data": {"id": "-123456"}},
                {"type": "text", "data": {"text": "Hello [CQ:at,qq=all]"}}
            ]}})
        );
        assert!(result["draft"].as_str().unwrap().contains("group 20001"));
        assert!(result["notice"].as_str().unwrap().contains("not proof of delivery"));
        // The text block is the result's JSON, like every other tool.
        assert_eq!(serde_json::from_str::<Value>(&text(&r)).unwrap(), *result);
        // Without the UI extension: no _meta.ui, no ui:// resource.
        let list = s.ok("tools/list", Value::Null);
        assert!(preview_tool(&list).get("_meta").is_none(), "{env:?}");
        assert!(ui_resources(&s.ok("resources/list", Value::Null)).is_empty());
        let mut r = result.clone();
        r.as_object_mut().unwrap().retain(|k, _| !["can_send", "send_blocked_by"].contains(&k.as_str()));
        drafts.push(r);
        // The same in the modern era.
        let m = s.call_modern("preview_message", group_draft(), json!({}));
        assert_eq!(structured(&m)["result"], *result);
    }
    assert!(drafts.windows(2).all(|w| w[0] == w[1]), "every mode builds the same draft");
    // A private draft under the same policy is allowed.
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_ENDPOINT", &url),
        ("SNOWLUMA_MCP_DENY_ACTIONS", "send_group_msg"),
    ]);
    s.initialize("2025-11-25");
    let r = s.call("preview_message", json!({"message_type": "private", "target_id": 30001, "text": "hi"}));
    assert_eq!(structured(&r)["result"]["can_send"], true);
    assert_eq!(
        structured(&r)["result"]["invoke_action"]["params"],
        json!({"user_id": 30001, "message": [{"type": "text", "data": {"text": "hi"}}]})
    );
    assert_eq!(fake.fake.requests(), vec![], "preview_message contacted SnowLuma");
}

#[test]
fn arguments_are_checked() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    let long = "a".repeat(10_001);
    let bad = [
        (json!({"target_id": 1, "text": "x"}), "缺少 message_type"),
        (json!({"message_type": "guild", "target_id": 1, "text": "x"}), "message_type 必须是"),
        (json!({"message_type": "group", "target_id": 0, "text": "x"}), "target_id 必须是"),
        (json!({"message_type": "group", "target_id": 9_007_199_254_740_992_u64, "text": "x"}), "target_id 必须是"),
        (json!({"message_type": "group", "target_id": "1", "text": "x"}), "target_id 必须是"),
        (json!({"message_type": "group", "target_id": 1, "text": ""}), "text 没有可发送的内容"),
        (json!({"message_type": "group", "target_id": 1, "text": "\u{200B}"}), "不可见字符"),
        (json!({"message_type": "group", "target_id": 1, "text": "\u{FEFF}"}), "不可见字符"),
        (json!({"message_type": "group", "target_id": 1, "text": "\u{200F}"}), "不可见字符"),
        (json!({"message_type": "group", "target_id": 1, "text": "\0"}), "不可见字符"),
        (json!({"message_type": "group", "target_id": 1, "text": "\u{301}"}), "不可见字符"),
        (
            json!({"message_type": "group", "target_id": 1, "text": "\u{200B} \u{FEFF}\n\u{200F}\0\u{301}"}),
            "不可见字符",
        ),
        (json!({"message_type": "group", "target_id": 1, "text": long}), "10001 个字符"),
        (json!({"message_type": "group", "target_id": 1, "text": "x", "reply_to": 0}), "reply_to 必须是"),
        (
            json!({"message_type": "group", "target_id": 1, "text": "x", "reply_to": 2_147_483_648_i64}),
            "reply_to 必须是",
        ),
        (json!({"message_type": "group", "target_id": 1, "text": "x", "send": true}), "未知参数: \"send\""),
    ];
    for (args, want) in bad {
        let r = s.call("preview_message", args.clone());
        assert!(is_error(&r), "{args}: {r}");
        let d = &structured(&r)["diagnostics"];
        assert_eq!(d["kind"], "invalid_arguments", "{args}");
        assert!(d["message"].as_str().unwrap().contains(want), "{args}: {d}");
    }
    let ok = s.call("preview_message", json!({"message_type": "group", "target_id": 1, "text": "字".repeat(10_000)}));
    assert!(!is_error(&ok));
}

/// README ("Message preview"): the answer to a draft of the longest text
/// stays under 400 KB. The text appears six times (the draft, `text` and
/// the send arguments, in `structuredContent` and again in the text block,
/// JSON inside a JSON string), so the worst case is a character that JSON
/// escapes longest: a control character (`\u0001`, six bytes, seven once
/// escaped again), about 392 KB; 4-byte characters make about 242 KB.
#[test]
fn the_longest_drafts_answer_stays_under_the_documented_bound() {
    const DOCUMENTED_BOUND: usize = 400_000;
    let readme = include_str!("../../README.md");
    let section = &readme[readme.find("### Message preview").unwrap()..];
    let section = section[..section.find("\n## ").unwrap()].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(section.contains("the answer, which carries the text six times"), "the README explains the answer's size");
    assert!(section.contains("stays under 400 KB"), "the README states the bound this test holds");
    let mut legacy = Mcp::spawn(&[]);
    legacy.initialize("2025-11-25");
    let mut modern = Mcp::spawn(&[]);
    let mut worst = 0;
    for c in ['\u{1}', '\0', '\u{1f}', '"', '\\', '\n', '\u{1F600}', '\u{2028}', '\u{301}', 'a'] {
        // A visible first character, then 9 999 of the costly one.
        let text: String = std::iter::once('x').chain(std::iter::repeat_n(c, 9_999)).collect();
        let args = json!({"message_type": "group", "target_id": 9_007_199_254_740_991_u64, "text": text, "reply_to": i32::MIN});
        for (era, s, meta) in [("legacy", &mut legacy, json!({})), ("modern", &mut modern, modern_meta_with(ui_caps()))]
        {
            let r = s.request("tools/call", json!({"name": "preview_message", "arguments": args, "_meta": meta}));
            assert!(!is_error(&r["result"]), "{era} {c:?}: {r}");
            assert_eq!(structured(&r["result"])["result"]["text"], text.as_str());
            let bytes = serde_json::to_string(&r).unwrap().len();
            assert!(bytes <= DOCUMENTED_BOUND, "{era} {c:?}: {bytes} bytes");
            worst = worst.max(bytes);
        }
    }
    // The documented figure is the measured worst case, not a loose guess.
    assert!(worst > 380_000, "the worst case shrank to {worst} bytes: update the README");
}

#[test]
fn legacy_clients_get_the_panel_only_when_they_declare_it() {
    // Declared with our MIME type: tool metadata, the resource, its contents.
    let mut s = Mcp::spawn(&[]);
    s.initialize_with("2025-11-25", ui_caps());
    let list = s.ok("tools/list", Value::Null);
    assert_eq!(preview_tool(&list)["_meta"], json!({"ui": {"resourceUri": UI_URI}}));
    let with_ui: Vec<_> = list["tools"].as_array().unwrap().iter().filter(|t| t.get("_meta").is_some()).collect();
    assert_eq!(with_ui.len(), 1, "only preview_message links a UI");
    let res = ui_resources(&s.ok("resources/list", Value::Null));
    assert_eq!(res.len(), 1);
    assert_eq!(res[0]["mimeType"], UI_MIME);
    let read = s.ok("resources/read", json!({"uri": UI_URI}));
    assert!(read.get("ttlMs").is_none(), "no cache hints for legacy: {}", read["ttlMs"]);
    let c = &read["contents"][0];
    assert_eq!(c["mimeType"], UI_MIME);
    assert_eq!(c["text"], ASSET);
    assert_eq!(
        c["_meta"]["ui"]["csp"],
        json!({"connectDomains": [], "resourceDomains": [], "frameDomains": [], "baseUriDomains": []})
    );
    // The same call result as for anyone else.
    let r = s.call("preview_message", group_draft());
    assert!(!is_error(&r));

    // Not declared, or declared without our MIME type: neither.
    for caps in [
        json!({}),
        json!({"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html"]}}}),
        json!({"extensions": {"io.modelcontextprotocol/ui": {}}}),
    ] {
        let mut s = Mcp::spawn(&[]);
        s.initialize_with("2025-11-25", caps.clone());
        assert!(preview_tool(&s.ok("tools/list", Value::Null)).get("_meta").is_none(), "{caps}");
        assert!(ui_resources(&s.ok("resources/list", Value::Null)).is_empty(), "{caps}");
        let r = s.request("resources/read", json!({"uri": UI_URI}));
        assert_eq!(r["error"]["code"], -32002, "{caps}: {r}");
    }
}

#[test]
fn modern_requests_declare_it_per_request() {
    let mut s = Mcp::spawn(&[]);
    let ui = modern_meta_with(ui_caps());
    let list = s.ok("tools/list", json!({"_meta": ui}));
    assert_eq!(preview_tool(&list)["_meta"], json!({"ui": {"resourceUri": UI_URI}}));
    let res = s.ok("resources/list", json!({"_meta": ui}));
    assert_eq!(ui_resources(&res).len(), 1);
    let read = s.ok("resources/read", json!({"uri": UI_URI, "_meta": ui}));
    // The spec's hint for bundled static UI: five minutes, public.
    assert_eq!((read["ttlMs"].clone(), read["cacheScope"].clone()), (json!(300_000), json!("public")));
    assert_eq!(read["contents"][0]["text"], ASSET);
    // The next request of the same connection without the extension sees none of it.
    let plain = modern_meta();
    assert!(preview_tool(&s.ok("tools/list", json!({"_meta": plain}))).get("_meta").is_none());
    assert!(ui_resources(&s.ok("resources/list", json!({"_meta": plain}))).is_empty());
    let r = s.request("resources/read", json!({"uri": UI_URI, "_meta": plain}));
    assert_eq!(r["error"]["code"], -32602, "modern resource-not-found: {r}");
    // The tool result is the same with or without it.
    let a = s.call_modern("preview_message", group_draft(), json!({}));
    let b = s.call_modern(
        "preview_message",
        group_draft(),
        json!({"io.modelcontextprotocol/clientCapabilities": ui_caps()}),
    );
    assert_eq!(structured(&a), structured(&b));
}
