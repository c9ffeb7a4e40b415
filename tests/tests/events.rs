#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Live event resources against the fake's event WebSocket: subscribe,
//! filters, cursors, eviction, limits, legacy and modern update
//! notifications, failures surfaced in status, and the connection's life
//! (one shared socket, closed by the last release and by stdin's end).
//! No event operation may execute an action: the fake's HTTP log stays empty.

use serde_json::{Value, json};
use snowluma_e2e::*;
use snowluma_fake::FakeEvents;
use snowluma_fake::events::{group_message, private_message};

const SELF_ID: i64 = 10001;
const TOKEN: &str = "events-token";

struct Setup {
    fake: Fake,
    ev: FakeEvents,
}

fn setup() -> Setup {
    let fake = Fake::start(Some(TOKEN));
    let ev = fake.start_events(Some(TOKEN), SELF_ID);
    Setup { fake, ev }
}

fn spawn(st: &Setup, extra: &[(&str, &str)]) -> Mcp {
    let url = st.fake.fake.url();
    let ws = st.ev.url();
    let mut env = vec![
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_TOKEN", TOKEN),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
    ];
    env.extend_from_slice(extra);
    Mcp::spawn(&env)
}

fn legacy(st: &Setup) -> Mcp {
    let mut s = spawn(st, &[]);
    s.initialize("2025-11-25");
    s
}

/// `subscribe_events` → its result object (panics on a tool error).
fn subscribe(s: &mut Mcp, args: Value) -> Value {
    let r = s.call("subscribe_events", args);
    assert!(!is_error(&r), "{r}");
    structured(&r)["result"].clone()
}

fn subscribe_uri(s: &mut Mcp, args: Value) -> String {
    let r = subscribe(s, args);
    assert_eq!(r["status"]["state"], "connected", "{r}");
    r["uri"].as_str().unwrap().to_owned()
}

fn read(s: &mut Mcp, uri: &str) -> Value {
    let r = s.ok("resources/read", json!({"uri": uri}));
    serde_json::from_str(r["contents"][0]["text"].as_str().unwrap()).unwrap()
}

fn read_modern(s: &mut Mcp, uri: &str) -> Value {
    let r = s.ok("resources/read", json!({"uri": uri, "_meta": modern_meta()}));
    serde_json::from_str(r["contents"][0]["text"].as_str().unwrap()).unwrap()
}

fn events_of(v: &Value) -> Vec<Value> {
    v["events"].as_array().unwrap().iter().map(|e| e["event"].clone()).collect()
}

/// Wait until the resource holds `n` events (bounded).
fn wait_events(s: &mut Mcp, uri: &str, n: usize) -> Value {
    wait_until(&format!("{uri} holds {n} events"), || {
        let v = read(s, uri);
        if v["events"].as_array().map(Vec::len) == Some(n) { Ok(v) } else { Err(v.to_string()) }
    })
}

fn wait_state(s: &mut Mcp, uri: &str, state: &str) -> Value {
    wait_until(&format!("{uri} is {state}"), || {
        let v = read(s, uri);
        if v["status"]["state"] == state { Ok(v) } else { Err(v["status"].to_string()) }
    })
}

fn no_actions(st: &Setup) {
    assert_eq!(st.fake.fake.requests(), Vec::new(), "an event operation reached SnowLuma's HTTP API");
    assert_eq!(st.ev.received(), Vec::<String>::new(), "the client sent data on the event socket");
}

fn tool_names(s: &mut Mcp) -> Vec<String> {
    let r = s.ok("tools/list", json!({}));
    r["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

/// A legacy client: listing connects nothing; subscribe opens the socket
/// with the bearer token; resources/subscribe gets updates; reads with
/// cursors; resources/unsubscribe releases the resource and closes the socket.
#[test]
fn legacy_subscribe_read_notify_unsubscribe() {
    let st = setup();
    let mut s = legacy(&st);
    let init_caps = s.ok("tools/list", json!({}));
    assert!(tool_names(&mut s).contains(&"subscribe_events".to_owned()), "{init_caps}");
    let listed = s.ok("resources/list", json!({}));
    assert_eq!(listed["resources"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(st.ev.accepted(), 0, "listing connected");

    let uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    assert!(uri.starts_with("snowluma://onebot/events/"), "{uri}");
    assert_eq!(st.ev.accepted(), 1);
    assert_eq!(st.ev.authorization(), vec![Some(format!("Bearer {TOKEN}"))]);
    let listed = s.ok("resources/list", json!({}));
    assert!(listed["resources"].as_array().unwrap().iter().any(|r| r["uri"] == uri.as_str()), "{listed}");

    // Bootstrap meta frames were consumed, not buffered.
    let v = read(&mut s, &uri);
    assert_eq!(v["events"], json!([]), "{v}");
    assert_eq!(v["gap"], false);
    assert_eq!(v["dropped_events"], 0);
    assert_eq!(v["notification_failed"], false);
    assert_eq!(v["oldest_cursor"], Value::Null);
    let start = v["next_cursor"].as_str().unwrap().to_owned();

    s.ok("resources/subscribe", json!({"uri": uri}));
    st.ev.send(&group_message(SELF_ID, 20001, 30001, "one"));
    s.wait_notification("notifications/resources/updated", |m| m["params"]["uri"] == uri.as_str());
    let v = wait_events(&mut s, &uri, 1);
    assert_eq!(events_of(&v)[0]["raw_message"], "one");
    let first = v["next_cursor"].as_str().unwrap().to_owned();
    assert_eq!(v["oldest_cursor"], first.as_str());

    st.ev.send(&group_message(SELF_ID, 20001, 30001, "two"));
    let v = wait_events(&mut s, &uri, 2);
    assert_eq!(events_of(&v).len(), 2, "reads do not consume");
    let after = read(&mut s, &format!("{uri}?after={first}"));
    assert_eq!(events_of(&after).len(), 1, "{after}");
    assert_eq!(events_of(&after)[0]["raw_message"], "two");
    assert_eq!(after["gap"], false);
    let all = read(&mut s, &format!("{uri}?after={start}"));
    assert_eq!(events_of(&all).len(), 2);
    // The newest cursor: nothing newer, and the cursor stays.
    let last = after["next_cursor"].as_str().unwrap().to_owned();
    let none = read(&mut s, &format!("{uri}?after={last}"));
    assert_eq!(none["events"], json!([]));
    assert_eq!(none["next_cursor"], last.as_str());

    // A second resource shares the socket; its cursors are its own.
    let other = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    assert_eq!(st.ev.accepted(), 1, "one socket for every resource");
    let e = s.request("resources/read", json!({"uri": format!("{other}?after={first}")}));
    assert!(e["error"]["message"].as_str().unwrap().contains("another event resource"), "{e}");
    let e = s.request("resources/read", json!({"uri": format!("{uri}?after=zz")}));
    assert!(e.get("error").is_some(), "{e}");

    s.ok("resources/unsubscribe", json!({"uri": uri}));
    let e = s.request("resources/read", json!({"uri": uri}));
    assert!(e.get("error").is_some(), "released: {e}");
    assert_eq!(st.ev.open(), 1, "the other resource keeps the socket");
    let r = s.call("unsubscribe_events", json!({"uri": other}));
    assert!(!is_error(&r), "{r}");
    wait_until("the last release closes the socket", || (st.ev.open() == 0 && st.ev.closed() == 1).then_some(()));
    let listed = s.ok("resources/list", json!({}));
    assert_eq!(listed["resources"].as_array().unwrap().len(), 1, "{listed}");
    no_actions(&st);
}

/// A modern client: listen with resourceSubscriptions gets tagged updates;
/// cancelling the stream keeps the buffer; cache hints are zero/private.
#[test]
fn modern_listen_notify_cancel() {
    let st = setup();
    let mut s = spawn(&st, &[]);
    let r = s.call_modern("subscribe_events", json!({"self_id": SELF_ID, "types": ["message"]}), json!({}));
    assert!(!is_error(&r), "{r}");
    let uri = structured(&r)["result"]["uri"].as_str().unwrap().to_owned();
    let listen = s.send_request(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [uri]}, "_meta": modern_meta()}),
    );
    let ack = s.wait_notification("notifications/subscriptions/acknowledged", |_| true);
    assert_eq!(ack["params"]["notifications"]["resourceSubscriptions"], json!([uri]), "{ack}");
    st.ev.send(&private_message(SELF_ID, 30001, "hello"));
    let n = s.wait_notification("notifications/resources/updated", |m| m["params"]["uri"] == uri.as_str());
    assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], listen, "{n}");

    let r = s.ok("resources/read", json!({"uri": uri, "_meta": modern_meta()}));
    assert_eq!(r["ttlMs"], 0, "{r}");
    assert_eq!(r["cacheScope"], "private", "{r}");
    let list = s.ok("resources/list", json!({"_meta": modern_meta()}));
    assert_eq!(list["ttlMs"], 0, "{list}");

    // Closing the stream does not release the buffer.
    s.notify("notifications/cancelled", json!({"requestId": listen}));
    st.ev.send(&private_message(SELF_ID, 30001, "again"));
    let v = wait_until("both events are buffered", || {
        let v = read_modern(&mut s, &uri);
        if v["events"].as_array().map(Vec::len) == Some(2) { Ok(v) } else { Err(v.to_string()) }
    });
    assert_eq!(v["status"]["state"], "connected");
    assert_eq!(st.ev.open(), 1);
    let r = s.call_modern("unsubscribe_events", json!({"uri": uri}), json!({}));
    assert!(!is_error(&r), "{r}");
    wait_until("the socket closes", || (st.ev.open() == 0).then_some(()));
    no_actions(&st);
}

/// `subscriptions/listen` acknowledges only the URIs this session can read:
/// its live event resources. An unknown or released event URI, the
/// catalog's resources and a foreign URI are left out of the
/// acknowledgement (and get no updates); a listen naming none of its
/// resources is acknowledged without any.
#[test]
fn listen_acknowledges_only_the_sessions_live_resources() {
    let st = setup();
    let mut s = spawn(&st, &[]);
    let sub = |s: &mut Mcp| {
        let r = s.call_modern("subscribe_events", json!({"self_id": SELF_ID}), json!({}));
        assert!(!is_error(&r), "{r}");
        structured(&r)["result"]["uri"].as_str().unwrap().to_owned()
    };
    let live = sub(&mut s);
    let released = sub(&mut s);
    let r = s.call_modern("unsubscribe_events", json!({"uri": released}), json!({}));
    assert!(!is_error(&r), "{r}");
    let requested = json!([
        "snowluma://onebot/events/ffffffffffffffffffffffffffffffff",
        released,
        live,
        "snowluma://onebot/actions",
        "snowluma://onebot/actions/send_group_msg",
        "file:///etc/passwd",
    ]);
    let listen = s.send_request(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": requested}, "_meta": modern_meta()}),
    );
    let ack = s.wait_notification("notifications/subscriptions/acknowledged", |_| true);
    assert_eq!(ack["params"]["notifications"]["resourceSubscriptions"], json!([live]), "{ack}");
    st.ev.send(&private_message(SELF_ID, 30001, "hello"));
    let n = s.wait_notification("notifications/resources/updated", |m| m["params"]["uri"] == live.as_str());
    assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], listen, "{n}");
    s.notify("notifications/cancelled", json!({"requestId": listen}));

    // Nothing this session can read: acknowledged with no resource at all.
    let other = s.send_request(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [released, "snowluma://onebot/actions"]}, "_meta": modern_meta()}),
    );
    let ack = s.wait_notification("notifications/subscriptions/acknowledged", |m| {
        m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == other
    });
    let acked = &ack["params"]["notifications"]["resourceSubscriptions"];
    assert!(acked.is_null() || *acked == json!([]), "{ack}");
    s.notify("notifications/cancelled", json!({"requestId": other}));
    no_actions(&st);
}

/// Type, group and user filters (AND), message_sent as message, and
/// argument checks.
#[test]
fn filters() {
    let st = setup();
    let mut s = legacy(&st);
    let all = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    let notices = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "types": ["notice"]}));
    let messages = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "types": ["message"]}));
    let group = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "group_ids": [20001]}));
    let both = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "group_ids": [20001], "user_ids": [30001]}));
    let user = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "user_ids": [30002]}));
    assert_eq!(st.ev.accepted(), 1);
    let mut sent = group_message(SELF_ID, 20001, 30001, "mine");
    sent["post_type"] = json!("message_sent");
    for e in [
        group_message(SELF_ID, 20001, 30001, "g1u1"),
        group_message(SELF_ID, 20001, 30002, "g1u2"),
        group_message(SELF_ID, 20002, 30001, "g2u1"),
        private_message(SELF_ID, 30002, "pu2"),
        json!({"time": 1, "self_id": SELF_ID, "post_type": "notice", "notice_type": "group_increase", "group_id": 20001, "user_id": 30001}),
        json!({"time": 1, "self_id": SELF_ID, "post_type": "request", "request_type": "friend", "user_id": 30002}),
        sent,
    ] {
        st.ev.send(&e);
    }
    wait_events(&mut s, &all, 7);
    let kinds = |s: &mut Mcp, uri: &str| -> Vec<String> {
        events_of(&read(s, uri))
            .iter()
            .map(|e| {
                e["raw_message"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| e["post_type"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    assert_eq!(kinds(&mut s, &notices), ["notice"]);
    assert_eq!(kinds(&mut s, &messages), ["g1u1", "g1u2", "g2u1", "pu2", "mine"]);
    assert_eq!(kinds(&mut s, &group), ["g1u1", "g1u2", "notice", "mine"]);
    assert_eq!(kinds(&mut s, &both), ["g1u1", "notice", "mine"]);
    assert_eq!(kinds(&mut s, &user), ["g1u2", "pu2", "request"]);

    for bad in [
        json!({}),
        json!({"self_id": SELF_ID, "types": ["meta_event"]}),
        json!({"self_id": SELF_ID, "group_ids": [1, 1]}),
        json!({"self_id": SELF_ID, "user_ids": (1..=101).collect::<Vec<i64>>()}),
        json!({"self_id": SELF_ID, "group_ids": [0]}),
    ] {
        let r = s.call("subscribe_events", bad.clone());
        assert!(is_error(&r), "{bad}: {r}");
    }
    // Another account while the connection is open.
    let r = s.call("subscribe_events", json!({"self_id": SELF_ID + 1}));
    assert!(is_error(&r) && text(&r).contains("unsubscribe_events"), "{r}");
    no_actions(&st);
}

/// At most 256 events and 1 MiB per resource, oldest first, visible as
/// dropped_events / gap / oldest_cursor; at most 16 resources.
#[test]
fn eviction_and_limits() {
    let st = setup();
    let mut s = legacy(&st);
    let uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "types": ["message"]}));
    let start = read(&mut s, &uri)["next_cursor"].as_str().unwrap().to_owned();
    for i in 0..300 {
        st.ev.send(&private_message(SELF_ID, 30001, &format!("m{i}")));
    }
    let v = wait_until("300 events were received", || {
        let v = read(&mut s, &uri);
        if v["dropped_events"] == 44 { Ok(v) } else { Err(v["dropped_events"].to_string()) }
    });
    let evs = events_of(&v);
    assert_eq!(evs.len(), 256);
    assert_eq!(evs[0]["raw_message"], "m44");
    assert_eq!(evs[255]["raw_message"], "m299");
    assert_eq!(v["gap"], true);
    assert_eq!(v["oldest_cursor"], v["events"][0]["cursor"]);
    let from_start = read(&mut s, &format!("{uri}?after={start}"));
    assert_eq!(from_start["gap"], true, "events after the cursor were evicted");
    let oldest = v["events"][0]["cursor"].as_str().unwrap().to_owned();
    let from_oldest = read(&mut s, &format!("{uri}?after={oldest}"));
    assert_eq!(from_oldest["gap"], false);
    assert_eq!(events_of(&from_oldest).len(), 255);

    // 1 MiB: 200 KiB events, at most five fit.
    let big_uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "types": ["notice"]}));
    let pad = "x".repeat(200 * 1024);
    for i in 0..8 {
        st.ev.send(&json!({"self_id": SELF_ID, "post_type": "notice", "notice_type": "test", "n": i, "pad": pad}));
    }
    let v = wait_until("8 big events were received", || {
        let v = read(&mut s, &big_uri);
        let n = v["events"].as_array().map(Vec::len).unwrap_or(0) as u64 + v["dropped_events"].as_u64().unwrap_or(0);
        if n == 8 { Ok(v) } else { Err(n) }
    });
    let evs = events_of(&v);
    assert!(evs.len() <= 5 && !evs.is_empty(), "{}", evs.len());
    let text_len: usize = evs.iter().map(|e| e.to_string().len()).sum();
    assert!(text_len <= 1024 * 1024, "{text_len}");
    assert_eq!(evs.last().unwrap()["n"], 7);
    assert_eq!(v["gap"], true);

    // 16 resources at most (2 exist).
    for _ in 0..14 {
        subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    }
    let r = s.call("subscribe_events", json!({"self_id": SELF_ID}));
    assert!(is_error(&r) && text(&r).contains("16"), "{r}");
    assert_eq!(st.ev.accepted(), 1, "sixteen resources, one socket");
    no_actions(&st);
}

/// An account mismatch stops the connection for every resource; a new
/// connection needs the old resources released; then it works again.
#[test]
fn mismatch_stops_and_release_allows_a_new_connection() {
    let st = setup();
    let mut s = legacy(&st);
    let a = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    let b = subscribe_uri(&mut s, json!({"self_id": SELF_ID, "types": ["notice"]}));
    st.ev.send(&group_message(SELF_ID + 1, 20001, 30001, "not ours"));
    let v = wait_state(&mut s, &a, "stopped");
    assert!(v["status"]["reason"].as_str().unwrap().contains("account mismatch"), "{v}");
    assert_eq!(v["events"], json!([]), "the foreign event is not kept");
    let v = read(&mut s, &b);
    assert_eq!(v["status"]["state"], "stopped");
    wait_until("the socket is closed", || (st.ev.open() == 0).then_some(()));
    let r = s.call("subscribe_events", json!({"self_id": SELF_ID}));
    assert!(is_error(&r) && text(&r).contains("unsubscribe_events"), "{r}");
    for u in [&a, &b] {
        assert!(!is_error(&s.call("unsubscribe_events", json!({"uri": u}))));
    }
    let c = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    assert_eq!(st.ev.accepted(), 2, "a new connection after the release");
    st.ev.send(&group_message(SELF_ID, 1, 2, "fresh"));
    wait_events(&mut s, &c, 1);
    no_actions(&st);
}

/// Garbage, a binary frame, oversize frames and a server-side close each end the
/// connection, visibly, without reconnecting.
#[test]
fn malformed_oversize_and_server_close_are_surfaced() {
    let st = setup();
    let mut s = legacy(&st);
    for (what, inject, needle) in [
        ("garbage", 0, "malformed"),
        ("non-object", 1, "malformed"),
        ("oversize", 2, "256"),
        ("server close", 3, "closed"),
        ("binary frame", 4, "binary frame"),
    ] {
        let uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
        match inject {
            0 => st.ev.send_text("{not json"),
            1 => st.ev.send_text("[1,2,3]"),
            2 => st.ev.send_text(&format!(
                "{{\"self_id\":{SELF_ID},\"post_type\":\"notice\",\"pad\":\"{}\"}}",
                "y".repeat(300 * 1024)
            )),
            // A valid event's JSON, but in a binary frame: not an event.
            4 => st.ev.send_binary(group_message(SELF_ID, 20001, 30001, "binary").to_string().as_bytes()),
            _ => st.ev.close_all(),
        };
        let v = wait_state(&mut s, &uri, "stopped");
        assert!(v["status"]["reason"].as_str().unwrap().contains(needle), "{what}: {v}");
        assert_eq!(v["events"], json!([]), "{what}: nothing buffered");
        wait_until("the socket is closed", || (st.ev.open() == 0).then_some(()));
        assert!(!is_error(&s.call("unsubscribe_events", json!({"uri": uri}))));
    }
    assert_eq!(st.ev.accepted(), 5, "no silent reconnect");
    no_actions(&st);
}

/// A bad token: SnowLuma closes with 1008, shown in the status.
#[test]
fn bad_token_is_surfaced() {
    let fake = Fake::start(None);
    let ev = fake.start_events(Some("other"), SELF_ID);
    let st = Setup { fake, ev };
    let mut s = legacy(&st);
    let r = subscribe(&mut s, json!({"self_id": SELF_ID}));
    let uri = r["uri"].as_str().unwrap().to_owned();
    let v = wait_state(&mut s, &uri, "stopped");
    assert!(v["status"]["reason"].as_str().unwrap().contains("1008"), "{v}");
    assert_eq!(st.ev.rejected(), 1);
}

/// stdin's end releases everything and closes the socket, even with a
/// modern listen stream still open (it is not a call the end waits for).
#[test]
fn stdin_eof_closes_the_socket() {
    let st = setup();
    let mut s = spawn(&st, &[]);
    let r = s.call_modern("subscribe_events", json!({"self_id": SELF_ID}), json!({}));
    let uri = structured(&r)["result"]["uri"].as_str().unwrap().to_owned();
    s.send_request(
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": [uri]}, "_meta": modern_meta()}),
    );
    s.wait_notification("notifications/subscriptions/acknowledged", |_| true);
    assert_eq!(st.ev.open(), 1);
    s.close_stdin();
    let status = wait_exit(&mut s.child, "the server exits at stdin's end");
    assert!(status.success(), "{status}");
    wait_until("the socket is closed", || (st.ev.open() == 0 && st.ev.closed() == 1).then_some(()));
    no_actions(&st);
}

/// Without SNOWLUMA_MCP_EVENTS_URL nothing changes: no event tools.
#[test]
fn no_event_tools_without_configuration() {
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_MODE", "read")]);
    s.initialize("2025-11-25");
    let names = tool_names(&mut s);
    assert!(!names.iter().any(|n| n.contains("events")), "{names:?}");
    let r = s.request("tools/call", json!({"name": "subscribe_events", "arguments": {"self_id": 1}}));
    assert!(r.get("error").is_some(), "{r}");
}

/// A network executor that stops (here without a token, so it can be
/// restarted) ends the connection visibly; nothing reconnects by itself.
#[test]
fn executor_restart_ends_the_connection_visibly() {
    let fake = Fake::start(None);
    let ev = fake.start_events(None, SELF_ID);
    let url = fake.fake.url();
    let ws = ev.url();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
    ]);
    s.initialize("2025-11-25");
    let uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    let pid = s.wait_worker("network");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let v = wait_state(&mut s, &uri, "stopped");
    assert!(v["status"]["reason"].as_str().unwrap().contains("network executor stopped"), "{v}");
    wait_until("the socket is closed", || (ev.open() == 0).then_some(()));
    assert_eq!(ev.accepted(), 1, "no silent reconnect");
    let r = s.call("subscribe_events", json!({"self_id": SELF_ID}));
    assert!(is_error(&r) && text(&r).contains("unsubscribe_events"), "{r}");
}

/// SnowLuma generates separate tokens for its HTTP and WebSocket servers:
/// with only SNOWLUMA_MCP_TOKEN the event WebSocket refuses the
/// subscription; SNOWLUMA_MCP_EVENTS_TOKEN (or --events-token-file) is sent
/// to the WebSocket instead, while HTTP calls keep SNOWLUMA_MCP_TOKEN.
#[test]
fn a_separate_events_token() {
    const HTTP: &str = "http-side-token";
    const WS: &str = "ws-side-token";
    let fake = Fake::start(Some(HTTP));
    let ev = fake.start_events(Some(WS), SELF_ID);
    let st = Setup { fake, ev };
    let url = st.fake.fake.url();
    let ws = st.ev.url();
    let base = [
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "read"),
        ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
    ];
    let http_ok = |s: &mut Mcp| {
        let r = s.call("query_action", json!({"action": "get_status"}));
        assert_eq!(structured(&r)["diagnostics"]["outcome"], "success", "HTTP keeps SNOWLUMA_MCP_TOKEN: {r}");
    };

    // Only the HTTP token: sent to the WebSocket too, which refuses it.
    let mut env = base.to_vec();
    env.push(("SNOWLUMA_MCP_TOKEN", HTTP));
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    let r = subscribe(&mut s, json!({"self_id": SELF_ID}));
    let uri = r["uri"].as_str().unwrap().to_owned();
    let v = wait_state(&mut s, &uri, "stopped");
    assert!(v["status"]["reason"].as_str().unwrap().contains("1008"), "{v}");
    assert_eq!(st.ev.rejected(), 1);
    assert_eq!(st.ev.authorization(), vec![Some(format!("Bearer {HTTP}"))]);
    http_ok(&mut s);
    drop(s);

    // With the events token, from the environment: the subscription works.
    env.push(("SNOWLUMA_MCP_EVENTS_TOKEN", WS));
    let mut s = Mcp::spawn(&env);
    s.initialize("2025-11-25");
    let uri = subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    assert_eq!(st.ev.authorization().last(), Some(&Some(format!("Bearer {WS}"))));
    st.ev.send(&group_message(SELF_ID, 20001, 30001, "with its own token"));
    let v = wait_events(&mut s, &uri, 1);
    assert_eq!(events_of(&v)[0]["raw_message"], "with its own token");
    http_ok(&mut s);
    drop(s);

    // From a file (--events-token-file), the same.
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-events-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ws-token");
    std::fs::write(&file, format!("{WS}\n")).unwrap();
    let mut env = base.to_vec();
    env.push(("SNOWLUMA_MCP_TOKEN", HTTP));
    let mut s = Mcp::spawn_args(&env, &["--events-token-file", file.to_str().unwrap()]);
    s.initialize("2025-11-25");
    subscribe_uri(&mut s, json!({"self_id": SELF_ID}));
    assert_eq!(st.ev.authorization().last(), Some(&Some(format!("Bearer {WS}"))));
    http_ok(&mut s);
    assert!(!s.stderr_text().contains(WS) && !s.stderr_text().contains(HTTP), "a token was logged");
    drop(s);
    assert_eq!(st.ev.accepted(), 2);
    assert_eq!(st.ev.received(), Vec::<String>::new(), "the client sent data on the event socket");
    let _ = std::fs::remove_dir_all(&dir);
}
