#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Kernel confinement (issue 5): escape probes through `snowluma-mcp doctor`,
//! the seccomp and no_new_privs state of running workers, where the token
//! lives, and what happens when a worker makes a forbidden system call.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use snowluma_e2e::*;

#[test]
fn doctor_blocks_every_escape_probe_for_every_role() {
    let out = Command::new(bin_path()).args(["doctor", "--json"]).env_clear().bounded_output().unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert!(out.status.success(), "doctor failed: {doc:#}");
    assert_eq!(doc["ok"], true, "{doc:#}");
    let roles: Vec<&str> = doc["roles"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["supervisor", "spawner", "catalog", "network", "files", "tasks", "http-front"]);
    for r in doc["roles"].as_array().unwrap() {
        let c = &r["confinement"];
        assert_eq!(c["landlock"]["status"], "fully_enforced", "{r:#}");
        assert_eq!(c["no_new_privs"], true, "{r:#}");
        assert_eq!(c["dumpable"], false, "{r:#}");
        assert_eq!(c["seccomp"], true, "{r:#}");
        let probes = r["probes"].as_array().unwrap();
        for p in probes {
            assert_eq!(p["pass"], true, "{}: {p}", r["role"]);
        }
        // Every role was really asked what an attacker tries first.
        let names: Vec<&str> = probes.iter().map(|p| p["probe"].as_str().unwrap()).collect();
        for must in [
            "exec-shell",
            "exec-loader",
            "memfd-exec",
            "signal",
            "ptrace",
            "write-outside",
            "read-etc-passwd",
            "read-etc-shadow",
            "connect",
            "new-socket",
            "udp-send",
            "unix-connect",
            "packet-socket",
            "set-dumpable",
        ] {
            assert!(names.contains(&must), "{} lacks the {must} probe", r["role"]);
        }
    }
    // The compiled-in preview panel passes its packaging check.
    assert_eq!(doc["packaging"]["preview_panel"]["ok"], true, "{doc:#}");
    // The human form says the same thing.
    let out = Command::new(bin_path()).arg("doctor").env_clear().bounded_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("all escape probes were blocked"), "{text}");
    assert!(text.contains("preview panel asset: ok"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
}

#[test]
fn a_probe_that_makes_a_forbidden_syscall_is_killed_by_sigsys() {
    for (role, probe) in [
        ("catalog", "new-socket"),
        ("catalog", "exec-shell"),
        ("network", "exec-shell"),
        ("files", "new-socket"),
        ("tasks", "new-socket"),
        ("tasks", "exec-shell"),
        ("http-front", "exec-shell"),
        ("catalog", "set-dumpable"),
        ("supervisor", "set-dumpable"),
        ("http-front", "set-dumpable"),
    ] {
        let out = Command::new(bin_path())
            .args(["__snowluma-probe", role, probe, "ports=9"])
            .env_clear()
            .bounded_output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(nix::libc::SIGSYS), "{role} {probe}: {:?}", out.status);
    }
}

/// The spawner's filter is a deny-list (its workers are exec'ed under it),
/// yet it refuses every prctl option it and its workers' startup do not
/// use: above all `PR_SET_DUMPABLE` 1, which would undo the non-dumpable
/// state doctor reports. Refused with EACCES, not killed, like its other
/// refusals; the workers it starts still name themselves, drop their
/// capabilities and set themselves non-dumpable under it.
#[test]
fn the_spawner_cannot_make_itself_dumpable_again() {
    let out = Command::new(bin_path())
        .args(["__snowluma-probe", "spawner", "set-dumpable", "ports=9"])
        .env_clear()
        .bounded_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "blocked: {stdout}");
    let outcome: Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v.get("outcome").cloned())
        .unwrap_or_else(|| panic!("no outcome: {stdout}"));
    assert_eq!(outcome["escaped"], false, "{outcome}");
    assert!(outcome["error"].as_str().unwrap().contains("EACCES"), "{outcome}");
    // Under the same filter, a session's workers start and serve.
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str())]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("query_action", json!({"action": "get_status"}))));
    let spawner = spawner_pid(&s);
    for pid in [spawner, s.wait_worker("catalog"), s.wait_worker("network")] {
        assert_eq!(status_field(pid, "Seccomp"), "2");
    }
}

#[test]
fn running_workers_have_no_new_privs_and_a_seccomp_filter_on_every_thread() {
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str())]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
    let supervisor = s.child.id() as i32;
    assert_eq!(status_field(supervisor, "NoNewPrivs"), "1");
    for role in ["catalog", "network"] {
        let pid = s.wait_worker(role);
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
            let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
            assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{role} task {tid}: {status}");
            assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{role} task {tid}: {status}");
        }
        for caps in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
            assert_eq!(status_field(pid, caps).trim_start_matches('0'), "", "{role} keeps {caps}");
        }
    }

    // get_runtime_info reports what is enforced.
    let info = s.call("get_runtime_info", json!({}));
    let c = &structured(&info)["result"]["confinement"];
    assert_eq!(c["fully_enforced"], true, "{c:#}");
    assert_eq!(c["supervisor"]["landlock"]["status"], "fully_enforced", "{c:#}");
    for role in ["catalog", "network"] {
        assert_eq!(c["workers"][role]["seccomp"], true, "{c:#}");
        assert_eq!(c["workers"][role]["landlock"]["status"], "fully_enforced", "{c:#}");
    }
}

/// The spawner is forked from the supervisor; both run with no capability
/// at all (even when started by root), no new privileges and a seccomp
/// filter.
#[test]
fn the_supervisor_and_the_spawner_keep_no_capability() {
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/")]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let supervisor = s.child.id() as i32;
    let spawner = spawner_pid(&s);
    for (name, pid) in [("supervisor", supervisor), ("spawner", spawner)] {
        for caps in ["CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"] {
            assert_eq!(status_field(pid, caps).trim_start_matches('0'), "", "{name} keeps {caps}");
        }
        assert_eq!(status_field(pid, "NoNewPrivs"), "1", "{name}");
        assert_eq!(status_field(pid, "Seccomp"), "2", "{name}");
    }
    // The workers the spawner starts through its descriptor still serve.
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert_eq!(structured(&r)["diagnostics"]["kind"], "transport", "{r}");
}

fn spawner_pid(s: &Mcp) -> i32 {
    let supervisor = s.child.id().to_string();
    s.worker_pids()
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|st| st.split_whitespace().nth(3) == Some(supervisor.as_str()))
        })
        .expect("the spawner is the supervisor's child")
}

/// After the handover the token is in the network executor's memory and
/// nowhere else: not in the supervisor's or the spawner's memory, not in
/// any process's environment or command line, whichever way it was given.
fn the_token_lives_only_in_the_network_executor(via_file: bool) {
    let secret = if via_file { "tok-confinement-file-4242" } else { "tok-confinement-env-4343" };
    let fake = Fake::start(Some(secret));
    let url = fake.fake.url();
    let dir = std::env::temp_dir().join(format!("snowluma-confine-token-{}-{via_file}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{secret}\n")).unwrap();
    let mut s = if via_file {
        Mcp::spawn_args(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str())], &["--token-file", token_file.to_str().unwrap()])
    } else {
        Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_TOKEN", secret)])
    };
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    // The network executor has the token: SnowLuma (the fake) accepts the call.
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["diagnostics"]["outcome"], "success", "{r}");
    let supervisor = s.child.id() as i32;
    let spawner = spawner_pid(&s);
    let catalog = s.wait_worker("catalog");
    let network = s.wait_worker("network");
    for pid in [supervisor, spawner, catalog, network] {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&env).contains(secret), "token in the environment of {pid}");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(secret), "token on the command line of {pid}");
    }
    if !via_file {
        // The variable is still there, its value overwritten in place.
        let env = std::fs::read(format!("/proc/{supervisor}/environ")).unwrap();
        assert!(env.windows(19).any(|w| w == b"SNOWLUMA_MCP_TOKEN="), "the variable was removed, not scrubbed");
    }
    // Readable only because the tests run as root (the processes are not
    // dumpable); the network executor's own copy shows the scan works.
    if let Some(found) = memory_contains(network, secret.as_bytes()) {
        assert!(found, "the memory scan finds nothing at all");
        for (name, pid) in [("supervisor", supervisor), ("spawner", spawner), ("catalog", catalog)] {
            assert_eq!(memory_contains(pid, secret.as_bytes()), Some(false), "the {name} holds the token");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_token_from_a_file_lives_only_in_the_network_executor() {
    the_token_lives_only_in_the_network_executor(true);
}

#[test]
fn the_token_from_the_environment_lives_only_in_the_network_executor() {
    the_token_lives_only_in_the_network_executor(false);
}

/// The event WebSocket's own token (SNOWLUMA_MCP_EVENTS_TOKEN or
/// --events-token-file) goes the HTTP token's way: after the handover it is
/// in the network executor's memory and nowhere else, and in no process's
/// environment or command line.
#[test]
fn the_events_token_lives_only_in_the_network_executor() {
    for via_file in [false, true] {
        let secret = if via_file { "evtok-confinement-file-5151" } else { "evtok-confinement-env-5252" };
        let fake = Fake::start(Some("http-tok-5353"));
        let ev = fake.start_events(Some(secret), 10001);
        let (url, ws) = (fake.fake.url(), ev.url());
        let dir = std::env::temp_dir().join(format!("snowluma-confine-evtoken-{}-{via_file}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("events-token");
        std::fs::write(&token_file, format!("{secret}\n")).unwrap();
        let mut env = vec![
            ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
            ("SNOWLUMA_MCP_TOKEN", "http-tok-5353"),
            ("SNOWLUMA_MCP_EVENTS_URL", ws.as_str()),
        ];
        let mut s = if via_file {
            Mcp::spawn_args(&env, &["--events-token-file", token_file.to_str().unwrap()])
        } else {
            env.push(("SNOWLUMA_MCP_EVENTS_TOKEN", secret));
            Mcp::spawn(&env)
        };
        s.initialize("2025-11-25");
        // The executor has it: the event WebSocket accepts the subscription.
        let r = s.call("subscribe_events", json!({"self_id": 10001}));
        assert_eq!(structured(&r)["result"]["status"]["state"], "connected", "{r}");
        let supervisor = s.child.id() as i32;
        let spawner = spawner_pid(&s);
        let catalog = s.wait_worker("catalog");
        let network = s.wait_worker("network");
        for pid in [supervisor, spawner, catalog, network] {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            assert!(!String::from_utf8_lossy(&environ).contains(secret), "events token in the environment of {pid}");
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
            assert!(!String::from_utf8_lossy(&cmdline).contains(secret), "events token on the command line of {pid}");
        }
        if let Some(found) = memory_contains(network, secret.as_bytes()) {
            assert!(found, "the memory scan finds nothing at all");
            for (name, pid) in [("supervisor", supervisor), ("spawner", spawner), ("catalog", catalog)] {
                assert_eq!(memory_contains(pid, secret.as_bytes()), Some(false), "the {name} holds the events token");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// No process is left that could give a new network executor the token:
/// when the one that holds it stops, the session ends (exit status 1, one
/// clear line). Without a token the executor is simply restarted.
#[test]
fn losing_the_executor_that_holds_the_token_ends_the_session() {
    let fake = Fake::start(Some("tok-lost-executor"));
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_TOKEN", "tok-lost-executor")]);
    s.initialize("2025-11-25");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
    let network = s.wait_worker("network");
    kill(Pid::from_raw(network), Signal::SIGKILL).unwrap();
    let status = wait_exit(&mut s.child, "the session ends");
    assert_eq!(status.code(), Some(1));
    // stderr is read on its own thread: the line may arrive after the exit.
    s.wait_stderr("cannot be restarted: ending the session");
    let stderr = s.stderr_text();
    assert_eq!(stderr.matches("cannot be restarted: ending the session").count(), 1, "{stderr}");

    // Without a token there is nothing to lose: the executor comes back.
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str())]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("query_action", json!({"action": "get_status"}))));
    let network = s.wait_worker("network");
    kill(Pid::from_raw(network), Signal::SIGKILL).unwrap();
    wait_until("the executor is restarted", || s.worker_pid("network").filter(|p| *p != network));
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
}

#[test]
fn a_worker_killed_by_sigsys_is_reported_and_the_supervisor_keeps_serving() {
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_LOG", "info")]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let pid = s.wait_worker("catalog");
    // seccomp's kill action ends the process with SIGSYS; deliver the same
    // signal (the real kill is shown by the probe test above).
    kill(Pid::from_raw(pid), Signal::SIGSYS).unwrap();
    s.wait_stderr("worker killed by SIGSYS");
    let r = s.call("list_categories", json!({}));
    assert!(!is_error(&r), "{r}");
    assert_ne!(s.wait_worker("catalog"), pid);
}

#[test]
fn a_hostname_endpoint_is_resolved_by_the_supervisor() {
    // The executor can neither read /etc nor send UDP: the supervisor
    // resolves the endpoint's host at startup and the executor pins it.
    let fake = Fake::start(Some("t"));
    let url = format!("http://localhost:{}/", fake.fake.addr().port());
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", url.as_str()), ("SNOWLUMA_MCP_TOKEN", "t")]);
    s.initialize("2025-11-25");
    let r = s.call("query_action", json!({"action": "get_status"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(structured(&r)["diagnostics"]["outcome"], "success");
    assert!(!s.stderr_text().contains("SIGSYS"), "{}", s.stderr_text());
}

#[test]
fn the_supervisor_itself_runs_under_no_new_privs_and_its_seccomp_filter() {
    let mut s = Mcp::spawn(&[("SNOWLUMA_MCP_ENDPOINT", "http://127.0.0.1:9/")]);
    s.initialize("2025-11-25");
    assert!(!is_error(&s.call("list_categories", json!({}))));
    let pid = s.child.id() as i32;
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    let info = s.call("get_runtime_info", json!({}));
    let sup = &structured(&info)["result"]["confinement"]["supervisor"];
    assert_eq!(sup["seccomp"], true, "{info}");
    assert_eq!(sup["landlock"]["status"], "fully_enforced", "{info}");
}

/// The task-store worker is confined like every worker, and it alone holds
/// the task directory's lease and records open.
#[test]
fn only_the_task_store_worker_holds_the_task_directory() {
    let fake = Fake::start(None);
    let url = fake.fake.url();
    let dir = std::env::temp_dir().join(format!("snowluma-e2e-conf-tasks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tasks = dir.join("tasks");
    let td = tasks.display().to_string();
    let sd = dir.join("downloads").display().to_string();
    let mut s = Mcp::spawn(&[
        ("SNOWLUMA_MCP_ENDPOINT", url.as_str()),
        ("SNOWLUMA_MCP_MODE", "write"),
        ("SNOWLUMA_MCP_STREAM_DIR", sd.as_str()),
        ("SNOWLUMA_MCP_TASK_DIR", td.as_str()),
    ]);
    s.initialize("2025-11-25");
    let pid = s.wait_worker("tasks");
    wait_until("the lease file exists", || tasks.join("lease").exists().then_some(()));
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
        assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "tasks task {tid}: {status}");
        assert!(status.lines().any(|l| l == "Seccomp:\t2"), "tasks task {tid}: {status}");
    }
    for caps in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, caps).trim_start_matches('0'), "", "tasks keeps {caps}");
    }
    let lease = std::fs::canonicalize(tasks.join("lease")).unwrap();
    let holders: Vec<i32> = std::iter::once(s.child.id() as i32)
        .chain(s.worker_pids())
        .filter(|p| {
            std::fs::read_dir(format!("/proc/{p}/fd"))
                .map(|fds| fds.flatten().any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l == lease)))
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(holders, vec![pid], "only the task-store worker holds the lease");
    let info = s.call("get_runtime_info", json!({}));
    let c = &structured(&info)["result"]["confinement"];
    assert_eq!(c["workers"]["tasks"]["landlock"]["status"], "fully_enforced", "{c:#}");
    assert_eq!(c["workers"]["tasks"]["seccomp"], true, "{c:#}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
