#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile input from the client and from SnowLuma: no message can wedge a
//! channel between the processes, every bad reply is an error for its own
//! call, and every later call is still answered.

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

fn session(fake: &Fake, mode: &str) -> Mcp {
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", mode)]);
    s.initialize("2025-11-25");
    s
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

/// After whatever came before, the executor and the catalog still answer.
fn still_serving(s: &mut Mcp, fake: &Fake) {
    fake.fake.clear_fault("get_status");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "the executor still answers: {r}");
    assert_eq!(diag(&r)["outcome"], "success");
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r), "the catalog still answers: {r}");
}

/// A 20 MiB body (more than a reply between processes can carry) is refused
/// by the executor with a clear error, not sent as an oversized reply that
/// used to stop the executor's channel for the rest of the session.
#[test]
fn an_oversized_response_is_an_error_for_its_call_only() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "read");
    fake.fake.set_fault("get_status", Fault::OversizeBody(20 * 1024 * 1024));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(is_error(&r), "{}", text(&r));
    assert_eq!(diag(&r)["kind"], "invalid_response");
    assert_eq!(diag(&r)["outcome"], "failed", "a read that did not come back failed");
    assert_eq!(
        text(&r),
        format!("调用失败 (get_status): OneBot returned a response larger than {} bytes (HTTP 200)", 15 * 1024 * 1024)
    );
    still_serving(&mut s, &fake);
}

/// A failed envelope with a 9 MiB wording: the envelope is the result, the
/// wording in the diagnostics message is cut.
#[test]
fn a_huge_wording_is_cut_in_the_message() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "read");
    let wording = "w".repeat(9 * 1024 * 1024);
    fake.fake.set_response("get_status", json!({"status": "failed", "retcode": 100, "data": null, "wording": wording}));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "a business failure is not a tool error");
    assert_eq!(diag(&r)["outcome"], "failed");
    assert!(diag(&r)["message"].as_str().unwrap().len() < 2048);
    assert_eq!(structured(&r)["result"]["wording"].as_str().map(str::len), Some(wording.len()));
    fake.fake.set_response("get_status", json!({"status": "ok", "retcode": 0, "data": {}}));
    still_serving(&mut s, &fake);
}

/// An unknown action name of 2.9 million characters whose escapes are
/// several times longer: the error echoes only its beginning.
#[test]
fn a_huge_unknown_name_is_echoed_short() {
    let mut s = Mcp::spawn(&[]);
    s.initialize("2025-11-25");
    let name = "\u{85}".repeat(2_900_000);
    let r = s.call("get_action", json!({"name": name}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "unknown_action");
    assert!(text(&r).len() < 1024, "{}", text(&r).len());
    assert!(text(&r).contains("共 2900000 个字符"), "{}", text(&r));
    // A wrong-typed huge value is clipped the same way.
    let r = s.call("list_actions", json!({"category": 1, "limit": "x".repeat(3_000_000)}));
    assert!(is_error(&r));
    assert!(text(&r).len() < 1024, "{}", text(&r).len());
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r), "the catalog worker still answers");
}

/// Params of 1.5 million `1e15`s: re-serialised the usual way they would be
/// 3.8 times longer than sent and over the frame limit; they arrive at
/// SnowLuma as sent.
#[test]
fn client_numbers_are_not_rewritten_longer() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "read");
    let xs = vec!["1e15"; 1_500_000].join(",");
    let id = s.next_id();
    s.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"query_action","arguments":{{"action":"get_status","params":{{"x":[{xs}]}}}}}}}}"#
    ));
    let r = s.wait_for(&json!(id));
    assert!(!is_error(&r["result"]), "{}", r.to_string().chars().take(400).collect::<String>());
    let req = fake.fake.requests().into_iter().find(|q| q.action.as_deref() == Some("get_status")).unwrap();
    assert!(req.body.len() < xs.len() + 100, "sent as the client wrote it: {} bytes", req.body.len());
    let body = req.json().unwrap();
    assert_eq!(body["params"]["x"].as_array().map(Vec::len), Some(1_500_000));
    assert_eq!(body["params"]["x"][0].as_f64(), Some(1e15));
    still_serving(&mut s, &fake);
}

/// A 200 response nested 100 000 deep cannot be represented: an error
/// (`invalid_response`, failed for a read, unknown for a write), never a
/// success with a null result.
#[test]
fn a_response_too_deep_to_represent_is_invalid() {
    let fake = Fake::start(None);
    let mut s = session(&fake, "write");
    let deep = format!(r#"{{"status":"ok","retcode":0,"data":{}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
    fake.fake.set_fault("get_status", Fault::RawBody(deep.clone().into_bytes()));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(is_error(&r), "{}", text(&r));
    assert_eq!(diag(&r)["kind"], "invalid_response");
    assert_eq!(diag(&r)["outcome"], "failed");
    fake.fake.set_fault("send_group_msg", Fault::RawBody(deep.into_bytes()));
    let r = s.call("invoke_action", json!({"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}}));
    assert!(is_error(&r));
    assert_eq!(diag(&r)["kind"], "invalid_response");
    assert_eq!(diag(&r)["outcome"], "unknown", "a write that may have run");
    still_serving(&mut s, &fake);
}
