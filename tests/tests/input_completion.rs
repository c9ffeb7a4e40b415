#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Input completion (`query_action_with_input`, `invoke_action_with_input`)
//! through the built binary, as raw JSON-RPC: the modern `input_required`
//! round with its signed `requestState`, the legacy `elicitation/create`
//! request, every way an answer or a state is refused, the limits, and the
//! audit records; the fake SnowLuma shows what was executed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::Fault;

const QUERY: &str = "query_action_with_input";
const INVOKE: &str = "invoke_action_with_input";
/// The tools of each mode before input completion, in their listed order.
const DOCS_TOOLS: [&str; 6] =
    ["list_actions", "get_action", "search_actions", "list_categories", "get_runtime_info", "preview_message"];

/// The spec's example: `message` is missing.
fn send_args() -> Value {
    json!({"action": "send_group_msg", "params": {"group_id": 20001}})
}

/// The request the fake must see for [`send_args`] answered with "Hello".
fn merged_send() -> Value {
    json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}})
}

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

fn env_of<'a>(url: &'a str, mode: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    // These tests send to one group many times: send pacing (tests/tests/safety.rs) off.
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url),
        ("SNOWLUMA_MCP_MODE", mode),
        ("SNOWLUMA_MCP_TOKEN", "t0k"),
        ("SNOWLUMA_MCP_SEND_INTERVAL_MS", "0"),
        ("SNOWLUMA_MCP_SEND_BURST", "0"),
    ];
    env.extend_from_slice(extra);
    env
}

/// A server in `mode` for a modern client (no lifecycle: every request carries its `_meta`).
fn modern(fake: &Fake, mode: &str, extra: &[(&str, &str)]) -> Mcp {
    let url = fake.fake.url();
    Mcp::spawn(&env_of(&url, mode, extra))
}

/// A server in `mode` after a legacy `initialize` with `version` and `capabilities`.
fn legacy(fake: &Fake, mode: &str, version: &str, capabilities: Value) -> Mcp {
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&env_of(&url, mode, &[]));
    let init = s.initialize_with(version, capabilities);
    assert_eq!(init["protocolVersion"], version);
    s
}

fn call_params(tool: &str, args: &Value, caps: &Value) -> Value {
    json!({"name": tool, "arguments": args, "_meta": modern_meta_with(caps.clone())})
}

fn retry_params(tool: &str, args: &Value, caps: &Value, state: &str, response: Value) -> Value {
    let mut p = call_params(tool, args, caps);
    p["inputResponses"] = json!({"params": response});
    p["requestState"] = json!(state);
    p
}

/// A modern tools/call; returns the whole response message.
fn modern_call(s: &mut Mcp, tool: &str, args: &Value, caps: &Value) -> Value {
    s.request("tools/call", call_params(tool, args, caps))
}

/// A modern retry answering the `params` input request; the whole response message.
fn modern_retry(s: &mut Mcp, tool: &str, args: &Value, caps: &Value, state: &str, response: Value) -> Value {
    s.request("tools/call", retry_params(tool, args, caps, state, response))
}

fn accept(params_json: &str) -> Value {
    json!({"action": "accept", "content": {"params_json": params_json}})
}

/// The `result` of a response message, failing on a JSON-RPC error.
fn result(msg: &Value) -> &Value {
    msg.get("result").unwrap_or_else(|| panic!("expected a result, got {msg}"))
}

fn diag(r: &Value) -> &Value {
    &structured(r)["diagnostics"]
}

fn diag_str<'a>(r: &'a Value, key: &str) -> &'a str {
    diag(r)[key].as_str().unwrap_or_else(|| panic!("diagnostics.{key} is not a string: {r}"))
}

/// An `input_required` result: (the elicitation's params, the request state).
fn input_required(msg: &Value) -> (Value, String) {
    let r = result(msg);
    assert_eq!(r["resultType"], "input_required", "expected input_required: {msg}");
    let requests = r["inputRequests"].as_object().unwrap_or_else(|| panic!("no inputRequests: {msg}"));
    assert_eq!(requests.keys().collect::<Vec<_>>(), ["params"], "exactly one input request, keyed params: {msg}");
    assert_eq!(requests["params"]["method"], "elicitation/create", "{msg}");
    let state = r["requestState"].as_str().unwrap_or_else(|| panic!("no requestState: {msg}")).to_owned();
    assert!(!state.is_empty(), "empty requestState");
    (requests["params"]["params"].clone(), state)
}

/// The form: mode form, a message naming the action and each missing
/// field, and exactly one required string field `params_json`.
fn check_form(params: &Value, action: &str, missing: &[&str]) {
    assert_eq!(params["mode"], "form", "{params}");
    let message = params["message"].as_str().unwrap_or_else(|| panic!("no message: {params}"));
    assert!(message.contains(action), "the message names the action {action}: {message:?}");
    for field in missing {
        assert!(message.contains(field), "the message names the missing field {field}: {message:?}");
    }
    let schema = &params["requestedSchema"];
    assert_eq!(schema["type"], "object", "{schema}");
    let props = schema["properties"].as_object().unwrap_or_else(|| panic!("no properties: {schema}"));
    assert_eq!(props.keys().collect::<Vec<_>>(), ["params_json"], "exactly one field: {schema}");
    assert_eq!(props["params_json"]["type"], "string", "{schema}");
    assert_eq!(schema["required"], json!(["params_json"]), "{schema}");
}

/// A JSON-RPC error -32602 whose message contains `needle` (case-insensitive).
fn invalid_params(msg: &Value, needle: &str) {
    assert!(msg.get("result").is_none(), "expected a JSON-RPC error ({needle}), got a result: {msg}");
    assert_eq!(msg["error"]["code"], -32602, "{msg}");
    let text = msg["error"]["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(text.contains(needle), "the error message should contain {needle:?}: {msg}");
}

/// A tool error (isError) of `kind`.
fn tool_error<'a>(msg: &'a Value, kind: &str) -> &'a Value {
    let r = result(msg);
    assert!(r.get("resultType").is_none_or(|t| t == "complete"), "expected a complete result: {msg}");
    assert!(is_error(r), "expected isError: {msg}");
    assert!(structured(r)["result"].is_null(), "{msg}");
    assert_eq!(diag(r)["kind"], kind, "{msg}");
    r
}

/// A completed, successful execution of send_group_msg.
fn sent_ok(msg: &Value) {
    let r = result(msg);
    assert!(r.get("resultType").is_none_or(|t| t == "complete"), "expected a complete result: {msg}");
    assert!(!is_error(r), "{msg}");
    assert_eq!(diag(r)["outcome"], "success", "{msg}");
    assert_eq!(structured(r)["result"]["data"]["message_id"], -123456, "{msg}");
}

/// The bodies of the requests naming `action` the fake received.
fn bodies(fake: &Fake, action: &str) -> Vec<Value> {
    fake.fake
        .requests()
        .into_iter()
        .filter(|q| q.action.as_deref() == Some(action))
        .map(|q| q.json().unwrap())
        .collect()
}

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

/// `next_step` names `tool` itself (not only as the prefix of its `_with_input` form).
fn names_original_tool(next_step: &str, tool: &str) -> bool {
    next_step.replace(&format!("{tool}_with_input"), "").contains(tool)
}

#[test]
fn the_new_tools_are_listed_after_the_existing_ones() {
    let fake = Fake::start(Some("t0k"));
    let read = [&DOCS_TOOLS[..4], &["query_action", "get_runtime_info", QUERY, "preview_message"]].concat();
    let write =
        [&DOCS_TOOLS[..4], &["query_action", "invoke_action", "get_runtime_info", QUERY, INVOKE, "preview_message"]]
            .concat();
    for (mode, expect) in [("docs", DOCS_TOOLS.to_vec()), ("read", read), ("write", write)] {
        let mut s = legacy(&fake, mode, "2025-11-25", json!({}));
        assert_eq!(tool_names(&s.ok("tools/list", Value::Null)), expect, "legacy, {mode} mode");
        let mut m = modern(&fake, mode, &[]);
        let list = m.ok("tools/list", json!({"_meta": modern_meta_with(elicitation())}));
        assert_eq!(tool_names(&list), expect, "modern, {mode} mode");
        // The same argument schema as the original tools.
        for (new, old) in [(QUERY, "query_action"), (INVOKE, "invoke_action")] {
            let tools = list["tools"].as_array().unwrap();
            let find = |n: &str| tools.iter().find(|t| t["name"] == n).cloned();
            if let (Some(new_t), Some(old_t)) = (find(new), find(old)) {
                let keys = |s: &Value| s["properties"].as_object().map(|p| p.keys().cloned().collect::<Vec<_>>());
                assert_eq!(keys(&new_t["inputSchema"]), keys(&old_t["inputSchema"]), "{new} takes {old}'s arguments");
                assert_eq!(
                    new_t["inputSchema"]["required"], old_t["inputSchema"]["required"],
                    "{new}: {old}'s required"
                );
                assert_eq!(keys(&new_t["outputSchema"]), keys(&old_t["outputSchema"]), "{new}: {old}'s result shape");
            }
        }
    }
    assert!(fake.fake.requests().is_empty(), "listing contacts nothing");
}

#[test]
fn modern_flow_asks_for_the_missing_field_and_executes_once() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let first = modern_call(&mut s, INVOKE, &send_args(), &caps);
    let (form, state) = input_required(&first);
    check_form(&form, "send_group_msg", &["message"]);
    assert!(fake.fake.requests().is_empty(), "nothing is sent before the answer");
    assert!(s.server_requests_in_backlog("elicitation/create").is_empty(), "a modern client gets no server request");

    let done = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    sent_ok(&done);
    assert_eq!(result(&done)["resultType"], "complete", "{done}");
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()], "exactly one request, with the merged params");
    assert_eq!(fake.fake.requests().len(), 1, "and nothing else");
}

#[test]
fn a_partial_answer_is_asked_again_for_the_rest() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    // Form support declared explicitly.
    let caps = json!({"elicitation": {"form": {}}});
    let args = json!({"action": "send_group_msg"});
    let (form, state) = input_required(&modern_call(&mut s, INVOKE, &args, &caps));
    check_form(&form, "send_group_msg", &["group_id", "message"]);

    let again = modern_retry(&mut s, INVOKE, &args, &caps, &state, accept(r#"{"message":"Hello"}"#));
    let (form2, state2) = input_required(&again);
    check_form(&form2, "send_group_msg", &["group_id"]);
    assert!(fake.fake.requests().is_empty(), "nothing is sent while a field is missing");

    let done = modern_retry(&mut s, INVOKE, &args, &caps, &state2, accept(r#"{"group_id":20001}"#));
    sent_ok(&done);
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()]);
}

#[test]
fn a_tampered_state_is_rejected_and_the_genuine_one_still_works() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));

    let mut flipped = state.clone().into_bytes();
    let mut i = flipped.len() / 2;
    if !flipped[i].is_ascii_alphanumeric() {
        i += 1;
    }
    flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let truncated = state[..state.len() - 1].to_owned();
    let appended = format!("{state}A");
    for bad in [flipped.as_str(), truncated.as_str(), appended.as_str(), "garbage", "rs1.AAAA.AAAA"] {
        assert_ne!(bad, state);
        let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, bad, accept(r#"{"message":"Hello"}"#));
        invalid_params(&r, "tampered");
    }
    assert!(bodies(&fake, "send_group_msg").is_empty(), "a tampered state executes nothing");

    let done = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    sent_ok(&done);
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()]);
}

#[test]
fn a_state_from_an_earlier_server_process_is_rejected() {
    let fake = Fake::start(Some("t0k"));
    let caps = elicitation();
    let state = {
        let mut first = modern(&fake, "write", &[]);
        input_required(&modern_call(&mut first, INVOKE, &send_args(), &caps)).1
    }; // the first server is killed here
    let mut second = modern(&fake, "write", &[]);
    let r = modern_retry(&mut second, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    invalid_params(&r, "tampered");
    assert!(bodies(&fake, "send_group_msg").is_empty(), "a restart invalidates pending prompts");
}

#[test]
fn a_replayed_answer_is_refused() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let retry = retry_params(INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    sent_ok(&s.request("tools/call", retry.clone()));
    let again = s.request("tools/call", retry);
    invalid_params(&again, "already used");
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()], "executed exactly once");
}

#[test]
fn two_concurrent_answers_execute_once() {
    let fake = Fake::start(Some("t0k"));
    // A slow SnowLuma: the first answer is still executing when the second arrives.
    fake.fake.set_fault("send_group_msg", Fault::Delay(Duration::from_millis(300)));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let retry = retry_params(INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    let a = s.send_request("tools/call", retry.clone());
    let b = s.send_request("tools/call", retry);
    let answers = [s.wait_for(&a), s.wait_for(&b)];
    let (ok, refused): (Vec<&Value>, Vec<&Value>) = answers.iter().partition(|m| m.get("result").is_some());
    assert_eq!((ok.len(), refused.len()), (1, 1), "exactly one executes: {answers:?}");
    sent_ok(ok[0]);
    invalid_params(refused[0], "already used");
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()], "executed exactly once");
}

#[test]
fn a_state_for_another_call_is_refused() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let answer = || accept(r#"{"message":"Hello"}"#);

    // Other arguments.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let other = json!({"action": "send_group_msg", "params": {"group_id": 20002}});
    invalid_params(&modern_retry(&mut s, INVOKE, &other, &caps, &state, answer()), "another call");
    let with_execution = json!({"action": "send_group_msg", "params": {"group_id": 20001}, "execution": {}});
    invalid_params(&modern_retry(&mut s, INVOKE, &with_execution, &caps, &state, answer()), "another call");

    // Another tool, same arguments: a read action asked through query_action_with_input.
    let args = json!({"action": "get_group_info"});
    let (form, state) = input_required(&modern_call(&mut s, QUERY, &args, &caps));
    check_form(&form, "get_group_info", &["group_id"]);
    let r = modern_retry(&mut s, INVOKE, &args, &caps, &state, accept(r#"{"group_id":20001}"#));
    invalid_params(&r, "another call");

    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
}

/// The contract's "same state with a different tool name" applied to an
/// original tool: `query_action` given a continuation of
/// `query_action_with_input` (same arguments) must not run as if it were
/// a fresh call.
#[test]
fn a_state_sent_to_an_original_tool_is_refused() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let args = json!({"action": "get_group_info"});
    let (_, state) = input_required(&modern_call(&mut s, QUERY, &args, &caps));
    let r = modern_retry(&mut s, "query_action", &args, &caps, &state, accept(r#"{"group_id":20001}"#));
    invalid_params(&r, "another call");
    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
}

#[test]
fn an_expired_state_is_refused() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[("SNOWLUMA_MCP_INPUT_CLOCK_OFFSET_MS", "660000")]);
    let caps = elicitation();
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    invalid_params(&r, "expired");
    assert!(fake.fake.requests().is_empty(), "an expired state executes nothing");
}

#[test]
fn at_most_256_prompts_are_pending() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let ids: Vec<Value> =
        (0..256).map(|_| s.send_request("tools/call", call_params(INVOKE, &send_args(), &caps))).collect();
    for id in &ids {
        input_required(&s.wait_for(id));
    }
    let r = modern_call(&mut s, INVOKE, &send_args(), &caps);
    let r = tool_error(&r, "execution");
    assert!(diag_str(r, "message").contains("256"), "the message names the limit: {r}");
    assert!(fake.fake.requests().is_empty(), "nothing executed");
    // Complete arguments need no prompt and still execute.
    let full = json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}});
    sent_ok(&modern_call(&mut s, INVOKE, &full, &caps));
}

/// One legacy elicitation round: start the call, take the server's
/// `elicitation/create`, check it, answer it; returns the call's id.
fn legacy_round(s: &mut Mcp, args: &Value, missing: &[&str], answer: Value) -> Value {
    let id = s.send_request("tools/call", json!({"name": INVOKE, "arguments": args}));
    let req = s.wait_server_request("elicitation/create");
    check_form(&req["params"], "send_group_msg", missing);
    assert!(s.backlog.iter().all(|m| m.get("id") != Some(&id)), "the call waits for the answer");
    s.respond(&req["id"], answer);
    id
}

#[test]
fn legacy_clients_with_elicitation_answer_decline_and_cancel() {
    for (version, caps) in [("2025-11-25", json!({"elicitation": {"form": {}}})), ("2025-06-18", elicitation())] {
        let fake = Fake::start(Some("t0k"));
        let mut s = legacy(&fake, "write", version, caps);

        // Accept.
        let id = legacy_round(&mut s, &send_args(), &["message"], accept(r#"{"message":"Hello"}"#));
        sent_ok(&s.wait_for(&id));
        assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()], "{version}: executed once, merged");

        // Decline.
        let id = legacy_round(&mut s, &send_args(), &["message"], json!({"action": "decline"}));
        let msg = s.wait_for(&id);
        let r = tool_error(&msg, "cancelled");
        assert!(diag_str(r, "message").contains("declined"), "{version}: {r}");

        // Cancel.
        let id = legacy_round(&mut s, &send_args(), &["message"], json!({"action": "cancel"}));
        tool_error(&s.wait_for(&id), "cancelled");
        assert_eq!(bodies(&fake, "send_group_msg").len(), 1, "{version}: decline and cancel execute nothing");

        // A partial answer: a second elicitation/create for the rest.
        let args = json!({"action": "send_group_msg"});
        let id = legacy_round(&mut s, &args, &["group_id", "message"], accept(r#"{"group_id":20001}"#));
        let req = s.wait_server_request("elicitation/create");
        check_form(&req["params"], "send_group_msg", &["message"]);
        assert_eq!(bodies(&fake, "send_group_msg").len(), 1, "{version}: nothing sent while a field is missing");
        s.respond(&req["id"], accept(r#"{"message":"Hello"}"#));
        sent_ok(&s.wait_for(&id));

        // An invalid answer.
        let id = legacy_round(&mut s, &send_args(), &["message"], accept(r#"{"message":"x","group_id":1}"#));
        tool_error(&s.wait_for(&id), "invalid_arguments");

        assert_eq!(bodies(&fake, "send_group_msg"), [merged_send(), merged_send()], "{version}");
        assert!(s.server_requests_in_backlog("elicitation/create").is_empty(), "{version}: no stray request");
    }
}

#[test]
fn invalid_answers_execute_nothing() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let message_given = json!({"action": "send_group_msg", "params": {"message": "Hello"}});
    let cases: [(&str, &Value, &str); 10] = [
        ("invalid JSON", &send_args(), r#"{"message":"#),
        ("not JSON at all", &send_args(), "Hello"),
        ("an array", &send_args(), r#"["Hello"]"#),
        ("a string", &send_args(), r#""Hello""#),
        ("an extra field", &send_args(), r#"{"message":"Hello","auto_escape":true}"#),
        ("overwriting a provided field", &send_args(), r#"{"message":"Hello","group_id":20002}"#),
        ("overwriting the action", &send_args(), r#"{"message":"Hello","action":"delete_msg"}"#),
        ("a wrong type", &message_given, r#"{"group_id":"20001"}"#),
        ("a value out of range", &message_given, r#"{"group_id":0}"#),
        ("null for a required field", &message_given, r#"{"group_id":null}"#),
    ];
    for (what, args, answer) in cases {
        let (_, state) = input_required(&modern_call(&mut s, INVOKE, args, &caps));
        let r = modern_retry(&mut s, INVOKE, args, &caps, &state, accept(answer));
        assert!(r.get("result").is_some(), "{what}: a tool error, not a JSON-RPC error: {r}");
        tool_error(&r, "invalid_arguments");
    }
    // An accept without content is no answer either.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, json!({"action": "accept"}));
    tool_error(&r, "invalid_arguments");
    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
}

/// `message` has no typed schema in the catalog (only a description), so
/// the answer is checked against its catalog type: a OneBot message is a
/// string, an array of segments or one segment. A number, null, a boolean,
/// an empty array or a malformed segment is an invalid answer and sends
/// nothing; the three real shapes are sent as answered.
#[test]
fn a_message_answer_must_be_a_onebot_message() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    for answer in [
        r#"{"message":12345}"#,
        r#"{"message":null}"#,
        r#"{"message":false}"#,
        r#"{"message":[]}"#,
        r#"{"message":[12345]}"#,
        r#"{"message":{"text":"Hello"}}"#,
        r#"{"message":{"type":"text","data":"Hello"}}"#,
    ] {
        let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
        let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(answer));
        let d = diag(tool_error(&r, "invalid_arguments"));
        assert!(d["message"].as_str().unwrap().contains("OneBot message"), "{answer}: {r}");
    }
    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
    let segments = json!([{"type": "text", "data": {"text": "Hello"}}]);
    let one = json!({"type": "face", "data": {"id": "1"}});
    for message in [json!("Hello"), segments, one] {
        let answer = json!({"message": message}).to_string();
        let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
        sent_ok(&modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(&answer)));
        let sent = bodies(&fake, "send_group_msg");
        assert_eq!(sent.last().unwrap()["params"]["message"], message, "{sent:?}");
    }
}

#[test]
fn modern_decline_and_cancel_execute_nothing() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, json!({"action": "decline"}));
    let r = tool_error(&r, "cancelled");
    assert!(diag_str(r, "message").contains("declined"), "{r}");
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, json!({"action": "cancel"}));
    tool_error(&r, "cancelled");
    assert!(fake.fake.requests().is_empty(), "nothing executed");
}

#[test]
fn clients_without_form_elicitation_get_a_tool_error() {
    let fake = Fake::start(Some("t0k"));
    let check = |r: &Value, original: &str| {
        let r = tool_error(r, "invalid_arguments");
        let next = diag_str(r, "next_step");
        assert!(names_original_tool(next, original), "next_step names {original}: {next:?}");
    };

    // Modern, no elicitation in this request's capabilities (another request's declaration does not count).
    let mut m = modern(&fake, "write", &[]);
    let _ = m.ok("tools/list", json!({"_meta": modern_meta_with(elicitation())}));
    check(&modern_call(&mut m, INVOKE, &send_args(), &json!({})), "invoke_action");
    check(&modern_call(&mut m, QUERY, &json!({"action": "get_group_info"}), &json!({})), "query_action");

    // Legacy without elicitation, and 2025-03-26 even when it declares it.
    for (version, caps) in [("2025-11-25", json!({})), ("2025-06-18", json!({})), ("2025-03-26", elicitation())] {
        let mut s = legacy(&fake, "write", version, caps);
        check(&s.request("tools/call", json!({"name": INVOKE, "arguments": send_args()})), "invoke_action");
        let query = json!({"name": QUERY, "arguments": {"action": "get_group_info"}});
        check(&s.request("tools/call", query), "query_action");
        assert!(s.server_requests_in_backlog("elicitation/create").is_empty(), "{version}: no elicitation request");
    }
    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
}

/// From the specification ("Clients must advertise form elicitation
/// support"), beyond the brief's contract: URL-only elicitation is not form support.
#[test]
fn url_only_elicitation_is_not_form_support() {
    let fake = Fake::start(Some("t0k"));
    let mut m = modern(&fake, "write", &[]);
    let r = modern_call(&mut m, INVOKE, &send_args(), &json!({"elicitation": {"url": {}}}));
    tool_error(&r, "invalid_arguments");
    let mut s = legacy(&fake, "write", "2025-11-25", json!({"elicitation": {"url": {}}}));
    let r = s.request("tools/call", json!({"name": INVOKE, "arguments": send_args()}));
    tool_error(&r, "invalid_arguments");
    assert!(s.server_requests_in_backlog("elicitation/create").is_empty());
    assert!(fake.fake.requests().is_empty());
}

#[test]
fn complete_arguments_bypass_the_input_round() {
    let fake = Fake::start(Some("t0k"));
    let full = json!({"action": "send_group_msg", "params": {"group_id": 20001, "message": "Hello"}});
    let mut m = modern(&fake, "write", &[]);
    // With and without elicitation support: no input request at all.
    for caps in [elicitation(), json!({})] {
        let r = modern_call(&mut m, INVOKE, &full, &caps);
        sent_ok(&r);
        assert!(result(&r).get("inputRequests").is_none() && result(&r).get("requestState").is_none(), "{r}");
    }
    let mut s = legacy(&fake, "write", "2025-11-25", elicitation());
    sent_ok(&s.request("tools/call", json!({"name": INVOKE, "arguments": full})));
    assert!(s.server_requests_in_backlog("elicitation/create").is_empty(), "no elicitation request");
    // A read with nothing missing (no required fields at all).
    let r = modern_call(&mut m, QUERY, &json!({"action": "get_status"}), &elicitation());
    let r = result(&r);
    assert!(!is_error(r) && r["resultType"] == "complete", "{r}");
    assert_eq!(structured(r)["result"]["status"], "ok");
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send(), merged_send(), merged_send()]);
    assert_eq!(bodies(&fake, "get_status").len(), 1);
}

#[test]
fn the_gates_of_the_original_tools_apply_before_any_question() {
    let fake = Fake::start(Some("t0k"));
    let caps = elicitation();
    // Each case: the original tool's answer decides the kind; the _with_input
    // tool gives the same tool error without asking anything.
    let same_gate = |s: &mut Mcp, tool: &str, original: &str, args: Value| {
        let before = s.request("tools/call", call_params(original, &args, &caps));
        let before = result(&before);
        assert!(is_error(before), "{original} {args} is refused: {before}");
        let kind = diag(before)["kind"].as_str().unwrap().to_owned();
        let r = modern_call(s, tool, &args, &caps);
        tool_error(&r, &kind);
        kind
    };

    let mut w = modern(&fake, "write", &[]);
    // query_action_with_input refuses a write action (read-only gate).
    same_gate(&mut w, QUERY, "query_action", send_args());
    same_gate(&mut w, QUERY, "query_action", json!({"action": "send_group_msg"}));
    // The operator policy and the catalog.
    assert_eq!(same_gate(&mut w, QUERY, "query_action", json!({"action": "get_cookies"})), "policy_denied");
    assert_eq!(same_gate(&mut w, INVOKE, "invoke_action", json!({"action": "no_such_action"})), "unknown_action");
    same_gate(&mut w, INVOKE, "invoke_action", json!({"action": "send_group_msg", "execution": [1]}));

    // Read mode: invoke_action_with_input is refused like invoke_action; a write through query too.
    let mut r = modern(&fake, "read", &[]);
    assert_eq!(same_gate(&mut r, QUERY, "query_action", send_args()), "mode_forbidden");
    let inv = r.request("tools/call", call_params("invoke_action", &send_args(), &caps));
    let mine = modern_call(&mut r, INVOKE, &send_args(), &caps);
    match inv.get("result") {
        Some(res) => {
            assert!(is_error(res));
            tool_error(&mine, diag(res)["kind"].as_str().unwrap());
        }
        None => assert_eq!(mine["error"]["code"], inv["error"]["code"], "{mine} vs {inv}"),
    }
    assert!(fake.fake.requests().is_empty(), "nothing executed: {:?}", fake.fake.requests());
}

#[test]
fn an_alias_is_completed_and_forwarded_as_written() {
    let fake = Fake::start(Some("t0k"));
    let mut s = modern(&fake, "write", &[]);
    let caps = elicitation();
    let args = json!({"action": "send_group_sign"});
    let (form, state) = input_required(&modern_call(&mut s, INVOKE, &args, &caps));
    // The message may name the action by its canonical name.
    check_form(&form, "set_group_sign", &["group_id"]);
    let r = modern_retry(&mut s, INVOKE, &args, &caps, &state, accept(r#"{"group_id":20001}"#));
    assert!(result(&r).get("structuredContent").is_some(), "{r}");
    assert_eq!(bodies(&fake, "send_group_sign"), [json!({"action": "send_group_sign", "params": {"group_id": 20001}})]);
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snowluma-e2e-input-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn phases(path: &Path) -> Vec<String> {
    records(path).iter().map(|r| r["phase"].as_str().unwrap().to_owned()).collect()
}

/// Wait until the log holds `n` records (a record may be written just after the response).
fn wait_records(log: &Path, n: usize) -> Vec<Value> {
    wait_until(&format!("the audit log holds {n} records"), || {
        let recs = records(log);
        if recs.len() >= n { Ok(recs) } else { Err(phases(log)) }
    })
}

#[test]
fn audit_intent_only_on_execution_and_refusals_for_failed_continuations() {
    let dir = temp_dir("audit");
    let log = dir.join("audit.jsonl");
    let fake = Fake::start(Some("t0k"));
    let log_s = log.to_str().unwrap().to_owned();
    let mut s = modern(&fake, "write", &[("SNOWLUMA_MCP_AUDIT_LOG", log_s.as_str())]);
    let caps = elicitation();

    // Asking records nothing.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    assert!(!phases(&log).iter().any(|p| p != "open"), "no record for a question: {:?}", phases(&log));
    let base = phases(&log).len();

    // Answered: intent then result, once.
    let retry = retry_params(INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    sent_ok(&s.request("tools/call", retry.clone()));
    let recs = wait_records(&log, base + 2);
    assert_eq!(phases(&log)[base..], ["intent", "result"]);
    assert_eq!(recs[base]["tool"], INVOKE);
    assert_eq!(recs[base]["action"], "send_group_msg");
    assert_eq!(recs[base + 1]["outcome"], "success");

    // Each refused continuation: one `refused` record with an input_* reason, no intent.
    let mut expected = base + 2;
    let mut refused = |what: &str| {
        expected += 1;
        let recs = wait_records(&log, expected);
        assert_eq!(recs.len(), expected, "{what}: exactly one record: {:?}", phases(&log));
        let rec = &recs[expected - 1];
        assert_eq!(rec["phase"], "refused", "{what}: {rec}");
        assert_eq!(rec["action"], "send_group_msg", "{what}: {rec}");
        assert_eq!(rec["tool"], INVOKE, "{what}: {rec}");
        let reason = rec["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("input_"), "{what}: reason {reason:?}");
    };
    // Already used.
    let r = s.request("tools/call", retry);
    invalid_params(&r, "already used");
    refused("already used");
    // Declined.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, json!({"action": "decline"}));
    tool_error(&r, "cancelled");
    refused("declined");
    // Cancelled.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, json!({"action": "cancel"}));
    tool_error(&r, "cancelled");
    refused("cancelled");
    // Invalid answer.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut s, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"x","group_id":2}"#));
    tool_error(&r, "invalid_arguments");
    refused("invalid answer");
    // Another call.
    let (_, state) = input_required(&modern_call(&mut s, INVOKE, &send_args(), &caps));
    let other = json!({"action": "send_group_msg", "params": {"group_id": 20002}});
    let r = modern_retry(&mut s, INVOKE, &other, &caps, &state, accept(r#"{"message":"Hello"}"#));
    invalid_params(&r, "another call");
    refused("another call");

    assert_eq!(phases(&log).iter().filter(|p| *p == "intent").count(), 1, "one execution, one intent");
    assert_eq!(bodies(&fake, "send_group_msg"), [merged_send()]);
    drop(s);
    let out = std::process::Command::new(bin_path()).arg("audit").arg("verify").arg(&log).env_clear().bounded_output();
    let out = out.unwrap();
    assert!(out.status.success(), "the log verifies: {}", String::from_utf8_lossy(&out.stderr));

    // Expired (its own server: the clock offset applies to the whole process).
    let log2 = dir.join("audit2.jsonl");
    let log2_s = log2.to_str().unwrap().to_owned();
    let mut e = modern(
        &fake,
        "write",
        &[("SNOWLUMA_MCP_AUDIT_LOG", log2_s.as_str()), ("SNOWLUMA_MCP_INPUT_CLOCK_OFFSET_MS", "660000")],
    );
    let (_, state) = input_required(&modern_call(&mut e, INVOKE, &send_args(), &caps));
    let r = modern_retry(&mut e, INVOKE, &send_args(), &caps, &state, accept(r#"{"message":"Hello"}"#));
    invalid_params(&r, "expired");
    let recs = wait_until("the expired continuation is recorded", || {
        let recs = records(&log2);
        if recs.iter().any(|r| r["phase"] == "refused") { Ok(recs) } else { Err(phases(&log2)) }
    });
    let rec = recs.iter().find(|r| r["phase"] == "refused").unwrap();
    assert!(rec["reason"].as_str().unwrap_or_default().starts_with("input_"), "{rec}");
    assert!(!recs.iter().any(|r| r["phase"] == "intent"), "{:?}", phases(&log2));
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}
