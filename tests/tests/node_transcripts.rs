#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Drop-in fidelity: every call the Node server (`@snowluma/mcp` 1.12.1)
//! answered in `tests/golden/node/node-transcripts.jsonl` is replayed
//! against the built binary, in its session, with the same environment and
//! the same faults on the fake SnowLuma, and must answer as Node did after
//! removing only the documented additions:
//!
//! * `structuredContent`, `_meta` and `outputSchema` (every result);
//! * the spec's new tools and properties in `tools/list`, and capabilities
//!   beyond Node's `{tools, resources}`;
//! * the catalog overlay's fields in `get_action` and the catalog resource
//!   (`catalog/src/def.rs`'s `OVERLAY_FIELDS` where upstream lacks them),
//!   `summary_en` in list entries, `denied_by_policy` flags;
//! * the bundled catalog's `version` (ours reports the SnowLuma release of
//!   the catalog, Node its own package version: README, "Differences").
//!
//! A line that answers differently on purpose is listed in [`DIFFERENCES`]
//! with its reason and what we answer instead (each row is in the README's
//! table), and that answer is asserted too: nothing is skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use snowluma_e2e::{Fake, Mcp};

const TRANSCRIPTS: &str = include_str!("../golden/node/node-transcripts.jsonl");
const UPSTREAM: &str = include_str!("../../catalog/upstream/catalog.json");
/// Node's package version, which it reports where we report the catalog's.
const NODE_VERSION: &str = "1.12.1";
const TOKEN: &str = "T";
const WRONG_TOKEN: &str = "wrong";

/// How a deliberately different line is checked instead.
enum Ours {
    /// A JSON-RPC error with this code and message.
    RpcError(i64, &'static str),
    /// A JSON-RPC error with this code (an SDK's own validation message).
    RpcErrorCode(i64),
    /// A successful result (an addition Node does not have).
    Success,
    /// The server refuses its configuration at startup with this on stderr.
    StartupRefused(&'static str),
}

/// The lines that answer differently on purpose: (session, request method,
/// a fragment of the request's params that identifies the line, our answer,
/// why). Each is a row of the README's "Differences from the Node server".
const DIFFERENCES: &[(u64, &str, &str, Ours, &str)] = &[
    (
        1,
        "resources/read",
        "snowluma://onebot/actions/get_status",
        Ours::Success,
        "addition: one resource per action (template snowluma://onebot/actions/{name})",
    ),
    (1, "resources/templates/list", "", Ours::Success, "addition: the per-action resource template"),
    (
        1,
        "tools/call",
        "list_tools",
        Ours::RpcError(-32602, "未知工具: list_tools"),
        "protocol rule: an unknown tool is a JSON-RPC error (-32602), in Node's words",
    ),
    (9, "tools/call", "get_runtime_info", Ours::Success, "addition: get_runtime_info is one of the spec's new tools"),
    (
        1,
        "tools/call",
        "{\"arguments\":{}}",
        Ours::RpcErrorCode(-32602),
        "protocol rule: rmcp answers malformed request params with -32602 and its own message (Node's SDK: -32603 with zod's issue list)",
    ),
    (1, "tools/call", "\"arguments\":\"x\"", Ours::RpcErrorCode(-32602), "protocol rule: as above"),
    (1, "resources/read", "{}", Ours::RpcErrorCode(-32602), "protocol rule: as above"),
    (
        7,
        "tools/call",
        "get_login_info",
        Ours::StartupRefused("SNOWLUMA_MCP_ENDPOINT (--endpoint) must start with http:// or https://"),
        "a malformed SNOWLUMA_MCP_ENDPOINT is refused at startup (Node starts and fails every call)",
    ),
];

fn difference(
    session: u64,
    method: &str,
    params: &Value,
) -> Option<&'static (u64, &'static str, &'static str, Ours, &'static str)> {
    let p = params.to_string();
    DIFFERENCES.iter().find(|(s, m, frag, _, _)| *s == session && *m == method && (frag.is_empty() || p.contains(frag)))
}

/// The upstream entry of every action, by name.
fn upstream_entries() -> BTreeMap<String, Map<String, Value>> {
    let up: Value = serde_json::from_str(UPSTREAM).unwrap();
    up["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a.as_object().unwrap().clone()))
        .collect()
}

/// The catalog overlay's fields (and our flags) removed from an action
/// entry: what remains is the entry as upstream has it.
fn strip_action(entry: &mut Map<String, Value>, upstream: &BTreeMap<String, Map<String, Value>>) {
    entry.remove("denied_by_policy");
    entry.remove("summary_en");
    let Some(up) = entry.get("name").and_then(Value::as_str).and_then(|n| upstream.get(n)) else {
        return;
    };
    let extra: Vec<String> = entry.keys().filter(|k| !up.contains_key(*k)).cloned().collect();
    for k in extra {
        entry.shift_remove(&k);
    }
}

/// Our answer to a documentation call with the additions removed.
fn strip_doc_result(v: &mut Value, upstream: &BTreeMap<String, Map<String, Value>>) {
    match v {
        Value::Object(m) if m.contains_key("actions") => {
            // A list entry: Node's compact fields, then our additions.
            for a in m.get_mut("actions").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Value::Object(e) = a {
                    e.remove("summary_en");
                    e.remove("denied_by_policy");
                }
            }
        }
        Value::Object(m) if m.contains_key("inputSchema") => strip_action(m, upstream),
        _ => {}
    }
}

/// Our catalog version, as the resource reports it.
fn our_version() -> String {
    let c: Value = serde_json::from_str(include_str!("../../catalog/generated/catalog.json")).unwrap();
    c["version"].as_str().unwrap().to_owned()
}

struct Workspace {
    _dir: tempdir::TempDir,
    root: PathBuf,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct TempDir(pub std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `<TMP>` as Node's run had it: upload-root (note.txt, a 1.5 MiB big.bin,
/// dir2/), outside/other.txt, tmp/.
fn workspace() -> Workspace {
    let root = std::env::temp_dir().join(format!("node-transcripts-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(root.join("upload-root/dir2")).unwrap();
    std::fs::create_dir_all(root.join("outside")).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::write(root.join("upload-root/note.txt"), "hello from node").unwrap();
    std::fs::write(root.join("upload-root/big.bin"), vec![7u8; 1536 * 1024]).unwrap();
    std::fs::write(root.join("outside/other.txt"), "outside").unwrap();
    for d in ["", "upload-root", "outside", "tmp"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    Workspace { _dir: tempdir::TempDir(root.clone()), root }
}

fn rand_suffix() -> u64 {
    let mut b = [0u8; 8];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    u64::from_le_bytes(b)
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Put the run's values in for the transcript's placeholders.
fn fill(s: &str, fake: Option<&str>, tmp: &Path, closed: u16) -> String {
    let mut s = s.replace("<TMP>", &tmp.display().to_string());
    if let Some(url) = fake {
        s = s.replace("http://FAKE/", url);
    }
    s.replace("<CLOSED_PORT>", &closed.to_string()).replace("<WRONG_TOKEN>", WRONG_TOKEN).replace("<TOKEN>", TOKEN)
}

fn fill_value(v: &Value, fake: Option<&str>, tmp: &Path, closed: u16) -> Value {
    serde_json::from_str(&fill(&v.to_string(), fake, tmp, closed)).unwrap()
}

/// Our text with the run's values put back as the transcript's placeholders.
fn normalise(text: &str, fake: Option<&str>, tmp: &Path) -> String {
    let mut s = text.replace(&tmp.display().to_string(), "<TMP>");
    if let Some(url) = fake {
        s = s.replace(url.trim_end_matches('/'), "http://FAKE");
    }
    uuid_placeholders(&s)
}

/// Every lower-case hyphenated UUID replaced by `<UUID>`.
fn uuid_placeholders(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let is_uuid = |w: &[u8]| {
        w.len() == 36
            && w.iter().enumerate().all(|(k, c)| {
                if [8, 13, 18, 23].contains(&k) { *c == b'-' } else { c.is_ascii_hexdigit() && !c.is_ascii_uppercase() }
            })
    };
    while i < b.len() {
        if i + 36 <= b.len() && is_uuid(&b[i..i + 36]) {
            out.push_str("<UUID>");
            i += 36;
        } else {
            let ch = s[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

struct Line {
    index: usize,
    session: u64,
    mode: String,
    env: Map<String, Value>,
    request: Value,
    response: Value,
    fault: Option<(String, String)>,
    note: String,
}

fn lines() -> Vec<Line> {
    TRANSCRIPTS
        .lines()
        .enumerate()
        .map(|(index, l)| {
            let v: Value = serde_json::from_str(l).unwrap();
            Line {
                index,
                session: v["session"].as_u64().unwrap(),
                mode: v["mode"].as_str().unwrap().to_owned(),
                env: v["env"].as_object().cloned().unwrap_or_default(),
                request: v["request"].clone(),
                response: v["response"].clone(),
                fault: v["setup"]["fault"]
                    .as_object()
                    .map(|f| (f["action"].as_str().unwrap().to_owned(), f["mode"].as_str().unwrap().to_owned())),
                note: v["note"].as_str().unwrap_or("").to_owned(),
            }
        })
        .collect()
}

/// What went wrong in one line.
fn mismatch(l: &Line, what: &str, want: &str, got: &str) -> String {
    format!(
        "line {} (session {}, {} mode, {} {}): {what}\n  Node: {want}\n  ours: {got}",
        l.index, l.session, l.mode, l.request["method"], l.request["params"],
    )
}

struct Run {
    upstream: BTreeMap<String, Map<String, Value>>,
    version: String,
    failures: Vec<String>,
    checked: usize,
}

impl Run {
    fn check(&mut self, l: &Line, ours: &Value, fake: Option<&str>, tmp: &Path) {
        self.checked += 1;
        let method = l.request["method"].as_str().unwrap();
        let params = &l.request["params"];
        if let Some((_, _, _, expect, why)) = difference(l.session, method, params) {
            let ok = match expect {
                Ours::RpcError(code, msg) => {
                    ours["error"]["code"] == json!(code) && ours["error"]["message"] == json!(msg)
                }
                Ours::RpcErrorCode(code) => ours["error"]["code"] == json!(code),
                Ours::Success => ours.get("result").is_some() && ours["result"]["isError"] != json!(true),
                Ours::StartupRefused(_) => false,
            };
            if !ok {
                self.failures.push(mismatch(
                    l,
                    &format!("documented difference ({why})"),
                    "see DIFFERENCES",
                    &ours.to_string(),
                ));
            }
            return;
        }
        if let Some(err) = l.response.get("error") {
            if ours.get("error") != Some(err) {
                self.failures.push(mismatch(l, "JSON-RPC error", &err.to_string(), &ours.to_string()));
            }
            return;
        }
        let Some(got) = ours.get("result") else {
            self.failures.push(mismatch(l, "a result", &l.response.to_string(), &ours.to_string()));
            return;
        };
        let want = &l.response["result"];
        match method {
            "initialize" => self.initialize(l, want, got),
            "tools/list" => self.tools_list(l, want, got),
            "resources/list" => self.resources_list(l, want, got),
            "resources/read" => self.resource_read(l, want, got),
            "tools/call" => self.tool_call(l, want, got, fake, tmp),
            _ => {
                if want != got {
                    self.failures.push(mismatch(l, "result", &want.to_string(), &got.to_string()));
                }
            }
        }
    }

    fn initialize(&mut self, l: &Line, want: &Value, got: &Value) {
        if want["protocolVersion"] != got["protocolVersion"] || want["serverInfo"]["name"] != got["serverInfo"]["name"]
        {
            self.failures.push(mismatch(l, "protocol version and server name", &want.to_string(), &got.to_string()));
        }
        for k in want["capabilities"].as_object().unwrap().keys() {
            if got["capabilities"].get(k).is_none() {
                self.failures.push(mismatch(l, &format!("capability {k}"), &want.to_string(), &got.to_string()));
            }
        }
    }

    /// Node's tools, each with its description, annotations and input
    /// properties; our added tools and properties are additions (also
    /// within a property: `execution.idempotency_key`).
    fn tools_list(&mut self, l: &Line, want: &Value, got: &Value) {
        let ours: BTreeMap<&str, &Value> =
            got["tools"].as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap(), t)).collect();
        for t in want["tools"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let Some(o) = ours.get(name) else {
                self.failures.push(mismatch(l, &format!("tool {name} listed"), &t.to_string(), "absent"));
                continue;
            };
            for k in ["description", "annotations"] {
                if t[k] != o[k] {
                    self.failures.push(mismatch(l, &format!("{name}.{k}"), &t[k].to_string(), &o[k].to_string()));
                }
            }
            let (ws, os) = (&t["inputSchema"], &o["inputSchema"]);
            for k in ["type", "required", "additionalProperties"] {
                if ws.get(k) != os.get(k) {
                    self.failures.push(mismatch(
                        l,
                        &format!("{name}.inputSchema.{k}"),
                        &ws.to_string(),
                        &os.to_string(),
                    ));
                }
            }
            for (p, s) in ws["properties"].as_object().unwrap() {
                if !os["properties"].get(p).is_some_and(|o| extends(s, o)) {
                    self.failures.push(mismatch(
                        l,
                        &format!("{name}.inputSchema.properties.{p}"),
                        &s.to_string(),
                        &os["properties"][p].to_string(),
                    ));
                }
            }
        }
        let node: Vec<&str> = want["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        let ours_order: Vec<&str> = got["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .filter(|n| node.contains(n))
            .collect();
        if node != ours_order {
            self.failures.push(mismatch(l, "tool order", &format!("{node:?}"), &format!("{ours_order:?}")));
        }
    }

    fn resources_list(&mut self, l: &Line, want: &Value, got: &Value) {
        let mut w = want["resources"][0].clone();
        w["description"] = json!(w["description"].as_str().unwrap().replace(NODE_VERSION, &self.version));
        let o = &got["resources"][0];
        for k in ["uri", "name", "mimeType", "description"] {
            if w[k] != o[k] {
                self.failures.push(mismatch(l, &format!("resource {k}"), &w[k].to_string(), &o[k].to_string()));
            }
        }
    }

    fn resource_read(&mut self, l: &Line, want: &Value, got: &Value) {
        let (w, o) = (&want["contents"][0], &got["contents"][0]);
        for k in ["uri", "mimeType"] {
            if w[k] != o[k] {
                self.failures.push(mismatch(l, &format!("contents[0].{k}"), &w[k].to_string(), &o[k].to_string()));
            }
        }
        let mut doc: Value = serde_json::from_str(o["text"].as_str().unwrap()).unwrap();
        for a in doc["actions"].as_array_mut().unwrap() {
            strip_action(a.as_object_mut().unwrap(), &self.upstream);
        }
        let mut text = serde_json::to_string_pretty(&doc).unwrap();
        text = text.replacen(
            &format!("\"version\": \"{}\"", self.version),
            &format!("\"version\": \"{NODE_VERSION}\""),
            1,
        );
        let node = w["text"].as_str().unwrap();
        if text != node {
            self.failures.push(mismatch(
                l,
                "catalog resource text (additions removed)",
                &node[..200],
                &text[..200.min(text.len())],
            ));
        }
    }

    fn tool_call(&mut self, l: &Line, want: &Value, got: &Value, fake: Option<&str>, tmp: &Path) {
        let want_err = want["isError"] == json!(true);
        let got_err = got["isError"] == json!(true);
        let node_text = want["content"][0]["text"].as_str().unwrap();
        let raw = got["content"][0]["text"].as_str().unwrap_or("");
        let mut ours = normalise(raw, fake, tmp);
        if !got_err && let Ok(mut v) = serde_json::from_str::<Value>(raw) {
            strip_doc_result(&mut v, &self.upstream);
            ours = normalise(&serde_json::to_string_pretty(&v).unwrap(), fake, tmp);
        }
        if want_err != got_err || ours != node_text {
            // Show where they part.
            let common = node_text.chars().zip(ours.chars()).take_while(|(a, b)| a == b).count();
            let from = common.saturating_sub(120);
            let cut = |s: &str| s.chars().skip(from).take(400).collect::<String>();
            self.failures.push(mismatch(
                l,
                &format!("tool result (isError {want_err} / {got_err}; they part at character {common})"),
                &cut(node_text),
                &cut(&ours),
            ));
        }
    }
}

/// The environment of a session, the fake's URL and token put in.
fn session_env(l: &Line, fake: Option<&str>, tmp: &Path, closed: u16) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        l.env.iter().map(|(k, v)| (k.clone(), fill(v.as_str().unwrap_or_default(), fake, tmp, closed))).collect();
    // The Node server has no send pacing: its answers are replayed with ours
    // off (Node's behaviour back, as the README's differences table says).
    env.push(("SNOWLUMA_MCP_SEND_INTERVAL_MS".into(), "0".into()));
    env.push(("SNOWLUMA_MCP_SEND_BURST".into(), "0".into()));
    env.push(("TMPDIR".into(), tmp.join("tmp").display().to_string()));
    env.push(("LANG".into(), "C.UTF-8".into()));
    env.push(("HOME".into(), tmp.display().to_string()));
    env
}

fn needs_fake(session: &[&Line]) -> bool {
    session.iter().any(|l| l.env.values().any(|v| v.as_str().is_some_and(|s| s.contains("http://FAKE/"))))
}

#[test]
fn every_node_transcript_line_answers_as_node() {
    let all = lines();
    let mut sessions: BTreeMap<u64, Vec<&Line>> = BTreeMap::new();
    for l in &all {
        sessions.entry(l.session).or_default().push(l);
    }
    let mut run = Run { upstream: upstream_entries(), version: our_version(), failures: Vec::new(), checked: 0 };
    for (session, lines) in &sessions {
        let ws = workspace();
        let closed = closed_port();
        let fake = needs_fake(lines).then(|| Fake::start_golden(Some(TOKEN)));
        let url = fake.as_ref().map(|f| f.fake.url());
        let env = session_env(lines[0], url.as_deref(), &ws.root, closed);
        let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut cmd = Mcp::command(&env_refs, &[]);
        cmd.current_dir(ws.root.join("upload-root"));
        let mut mcp = Mcp::spawn_command(cmd);
        if let Some((_, _, _, Ours::StartupRefused(text), _)) =
            difference(*session, "tools/call", &lines[0].request["params"])
        {
            let status = snowluma_e2e::wait_exit(&mut mcp.child, "a server refusing its configuration");
            assert!(!status.success(), "session {session}: the server exits with an error");
            mcp.wait_stderr(text);
            run.checked += lines.len();
            continue;
        }
        let init = lines.iter().find(|l| l.request["method"] == "initialize");
        let init_params = init.map(|l| l.request["params"].clone()).unwrap_or_else(|| {
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "golden-transcripts", "version": "1"}})
        });
        let init_reply = mcp.request("initialize", init_params);
        if let Some(l) = init {
            run.check(l, &init_reply, url.as_deref(), &ws.root);
        } else if init_reply.get("result").is_none() {
            run.failures.push(format!("session {session}: initialize failed: {init_reply}"));
            continue;
        }
        mcp.notify("notifications/initialized", Value::Null);
        // The 5th of 5 concurrent stream calls: four run while it is sent.
        for l in lines.iter().filter(|l| l.request["method"] != "initialize") {
            if let (Some(f), Some((action, mode))) = (&fake, &l.fault) {
                f.arm_golden_fault(action, mode);
            }
            let params = fill_value(&l.request["params"], url.as_deref(), &ws.root, closed);
            let method = l.request["method"].as_str().unwrap();
            let reply = if l.note.starts_with("the 5th of 5 concurrent") {
                let f = fake.as_ref().expect("a fake for stream calls");
                let streams =
                    || f.fake.requests().iter().filter(|q| q.action.as_deref() == Some("test_download_stream")).count();
                let before = streams();
                let ids: Vec<Value> = (0..4)
                    .map(|_| {
                        let id = json!(mcp.next_id());
                        mcp.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"name": "invoke_action", "arguments": {"action": "test_download_stream", "params": {"delay_ms": 300}}}}));
                        id
                    })
                    .collect();
                // The four are running (SnowLuma has them) before the fifth is sent.
                snowluma_e2e::wait_until("four streams running", || (streams() >= before + 4).then_some(()));
                let r = mcp.request(method, params);
                for id in ids {
                    mcp.wait_for(&id);
                }
                r
            } else {
                mcp.request(method, params)
            };
            run.check(l, &reply, url.as_deref(), &ws.root);
            if let (Some(f), Some(_)) = (&fake, &l.fault) {
                f.reset_golden_faults();
            }
        }
    }
    assert_eq!(run.checked, all.len(), "every transcript line was replayed");
    assert!(
        run.failures.is_empty(),
        "{} of {} transcript lines answer differently from Node:\n\n{}",
        run.failures.len(),
        all.len(),
        run.failures.join("\n\n")
    );
}

/// Every documented difference names a real transcript line (a stale row
/// would hide nothing but would mislead the README's reader).
#[test]
fn every_documented_difference_names_a_line() {
    let all = lines();
    for (session, method, frag, _, why) in DIFFERENCES {
        assert!(
            all.iter().any(|l| l.session == *session
                && l.request["method"] == *method
                && (frag.is_empty() || l.request["params"].to_string().contains(frag))),
            "no transcript line for the difference {why:?}"
        );
    }
}

/// Whether our schema `ours` is Node's `node` with properties added: every
/// member equal, except `properties`, whose Node members must be extended
/// alike and which may have more.
fn extends(node: &Value, ours: &Value) -> bool {
    let (Some(n), Some(o)) = (node.as_object(), ours.as_object()) else { return node == ours };
    o.keys().all(|k| n.contains_key(k))
        && n.iter().all(|(k, v)| match (k.as_str(), o.get(k)) {
            ("properties", Some(op)) => v
                .as_object()
                .is_some_and(|np| np.iter().all(|(name, schema)| op.get(name).is_some_and(|os| extends(schema, os)))),
            (_, Some(ov)) => v == ov,
            (_, None) => false,
        })
}
