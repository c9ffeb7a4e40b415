//! `snowluma-mcp doctor`: what confinement this kernel enforces, per role,
//! and escape probes that prove it.
//!
//! For every role (supervisor, spawner, catalog, network, files, tasks, and
//! serve-http's HTTP front) the doctor starts
//! this binary in probe mode (`__snowluma-probe <role> <probe> [k=v…]`,
//! `snowluma_sandbox::probe::probe_main`): the child confines itself through
//! the same `snowluma_sandbox` entry point that role runs in service, prints
//! its report, tries one forbidden operation and says whether it got through. A
//! few *controls* (the network executor connecting to its granted port, the
//! file-transfer worker reading its upload root and writing its download
//! directory) must succeed, so a probe cannot pass merely because the test
//! setup is broken. Exit status 1 if any forbidden operation succeeded or a
//! control failed, or the compiled-in preview panel fails its seal check
//! (`preview::panel`, a packaging error), 0 otherwise. Human-readable by default; `--json` prints
//! one JSON document. Doctor is not an MCP session, so stdout is its own.

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use serde_json::{Value, json};
use snowluma_proto::Role;
use snowluma_sandbox::landlock::PINNED_ABI_NUMBER;
use snowluma_sandbox::probe::{EXEC_MARKER, HTTP_FRONT_ROLE, PROBE_ARG, Probe};
use snowluma_sandbox::role::{self, FdKind, Slot};

/// A probe the doctor runs, and what must happen.
struct Case {
    probe: Probe,
    args: Vec<String>,
    /// `true`: a control that must succeed; `false`: must be blocked.
    control: bool,
    label: String,
}

struct Setup {
    dir: PathBuf,
    upload: PathBuf,
    download: PathBuf,
    tasks: PathBuf,
    endpoint: TcpListener,
    other: TcpListener,
    /// A UDP socket the datagram probe aims at.
    udp: std::net::UdpSocket,
    /// A listening pathname unix socket the connect probe aims at.
    unix: std::os::unix::net::UnixListener,
    /// This binary's ELF interpreter, which the spawner may execute.
    interpreter: Option<String>,
    sibling: Option<std::process::Child>,
}

impl Setup {
    fn new() -> std::io::Result<Setup> {
        let dir = std::env::temp_dir().join(format!("snowluma-doctor-{}", std::process::id()));
        let upload = dir.join("upload");
        let download = dir.join("download");
        std::fs::create_dir_all(&upload)?;
        std::fs::create_dir_all(&download)?;
        std::fs::write(upload.join("probe.txt"), b"probe")?;
        let tasks = dir.join("tasks");
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&tasks)?;
        }
        std::fs::write(tasks.join("probe.txt"), b"probe")?;
        let endpoint = TcpListener::bind("127.0.0.1:0")?;
        let other = TcpListener::bind("127.0.0.1:0")?;
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let unix = std::os::unix::net::UnixListener::bind(dir.join("probe.sock"))?;
        let interpreter = snowluma_sandbox::own_interpreter();
        // A sibling process outside every probe's domain, to signal and trace.
        let sibling = Command::new("/bin/sleep")
            .arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        Ok(Setup { dir, upload, download, tasks, endpoint, other, udp, unix, interpreter, sibling })
    }
    fn udp_port(&self) -> u16 {
        self.udp.local_addr().map(|a| a.port()).unwrap_or(0)
    }
    fn unix_path(&self) -> PathBuf {
        self.unix.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf)).unwrap_or_default()
    }
    fn port(l: &TcpListener) -> u16 {
        l.local_addr().map(|a| a.port()).unwrap_or(0)
    }
    fn sibling_pid(&self) -> u32 {
        self.sibling.as_ref().map(|c| c.id()).unwrap_or_else(std::process::id)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(c) = &mut self.sibling {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn forbidden(probe: Probe, args: Vec<String>, label: &str) -> Case {
    Case { probe, args, control: false, label: label.to_owned() }
}

fn cases(role: &str, s: &Setup) -> Vec<Case> {
    let outside = format!("path={}", s.dir.join(format!("outside-{role}")).display());
    // No role reads files it was not granted: the supervisor opens nothing
    // by path after startup, the spawner only its binary and libraries.
    let mut v = vec![
        forbidden(Probe::ReadEtcPasswd, vec![], "read /etc/passwd"),
        forbidden(Probe::ReadEtcShadow, vec![], "read /etc/shadow"),
        forbidden(Probe::WriteOutside, vec![outside], "create a file outside its roots"),
    ];
    v.extend(network_cases(role, s));
    v.push(forbidden(Probe::UdpSend, vec![format!("port={}", s.udp_port())], "send a UDP datagram"));
    v.push(forbidden(
        Probe::UnixConnect,
        vec![format!("path={}", s.unix_path().display())],
        "connect to a pathname unix socket",
    ));
    v.push(forbidden(Probe::PacketSocket, vec![], "open a raw AF_PACKET socket"));
    match role {
        "files" => v.extend(files_cases(s)),
        "tasks" => v.extend(tasks_cases(s)),
        _ => {}
    }
    v.extend(process_cases(s));
    v
}

fn control(probe: Probe, args: Vec<String>, label: &str) -> Case {
    Case { probe, args, control: true, label: label.to_owned() }
}

/// TCP and new sockets, by role.
fn network_cases(role: &str, s: &Setup) -> Vec<Case> {
    let endpoint_port = format!("port={}", Setup::port(&s.endpoint));
    let other_port = format!("port={}", Setup::port(&s.other));
    match role {
        "network" => vec![
            forbidden(Probe::Connect, vec![other_port], "connect to a port other than the endpoint's"),
            control(Probe::Connect, vec![endpoint_port], "connect to the endpoint's port (control)"),
            forbidden(Probe::NewSocket, vec![], "open a unix socket"),
        ],
        // It starts no process, so it needs no network at all.
        "supervisor" => vec![
            forbidden(Probe::Connect, vec![endpoint_port], "connect over TCP (even to the endpoint's port)"),
            forbidden(Probe::NewSocket, vec![], "open a new socket"),
        ],
        // Its domain must contain the network executor's (workers nest
        // inside it), so only the endpoint's port is open to it.
        "spawner" => vec![
            forbidden(Probe::Connect, vec![other_port], "connect to a port other than the endpoint's"),
            forbidden(Probe::NewSocket, vec![], "open a unix socket"),
        ],
        _ => vec![
            forbidden(Probe::Connect, vec![endpoint_port], "connect over TCP"),
            forbidden(Probe::NewSocket, vec![], "open a new socket"),
        ],
    }
}

/// The file-transfer worker: its two directories, read-only and read-write.
fn files_cases(s: &Setup) -> Vec<Case> {
    vec![
        forbidden(
            Probe::WriteOutside,
            vec![format!("path={}", s.upload.join("new").display())],
            "write into the (read-only) upload root",
        ),
        control(Probe::ReadGranted, vec!["name=probe.txt".into()], "read a file in the upload root (control)"),
        control(
            Probe::WriteOutside,
            vec![format!("path={}", s.download.join("new").display())],
            "create a file in the download directory (control)",
        ),
    ]
}

/// The task-store worker: its directory only.
fn tasks_cases(s: &Setup) -> Vec<Case> {
    vec![
        forbidden(
            Probe::WriteOutside,
            vec![format!("path={}", s.download.join("from-tasks").display())],
            "write into the download directory",
        ),
        forbidden(
            Probe::WriteOutside,
            vec![format!("path={}", s.upload.join("from-tasks").display())],
            "write into the upload root",
        ),
        control(Probe::ReadGranted, vec!["name=probe.txt".into()], "read a file in the task directory (control)"),
        control(
            Probe::WriteOutside,
            vec![format!("path={}", s.tasks.join("new").display())],
            "create a file in the task directory (control)",
        ),
    ]
}

/// Executing programs, and reaching other processes.
fn process_cases(s: &Setup) -> Vec<Case> {
    let pid = format!("pid={}", s.sibling_pid());
    let mut v = vec![forbidden(Probe::ExecShell, vec![], "exec /bin/sh")];
    if let Some(interp) = &s.interpreter {
        v.push(forbidden(Probe::ExecLoader, vec![format!("path={interp}")], "run /bin/sh through the ELF interpreter"));
    }
    v.push(forbidden(Probe::MemfdExec, vec![], "execute a program written into a memfd"));
    v.push(forbidden(Probe::Signal, vec![pid.clone()], "signal a sibling process"));
    v.push(forbidden(Probe::Ptrace, vec![pid], "ptrace a sibling process"));
    // Every role confines itself non-dumpable; none may undo that.
    v.push(forbidden(Probe::SetDumpable, vec![], "make itself dumpable again (prctl PR_SET_DUMPABLE 1)"));
    v
}

/// The grants a role's probe process starts with (as in service).
fn grant_args(role: &str, s: &Setup) -> Vec<String> {
    match role {
        "network" | "spawner" => vec![format!("ports={}", Setup::port(&s.endpoint))],
        _ => vec![],
    }
}

struct Run {
    report: Option<Value>,
    outcome: Option<Value>,
    status: std::process::ExitStatus,
    error: Option<String>,
}

fn spawn_probe(exe: &Path, role: &str, case: &Case, s: &Setup) -> std::io::Result<Run> {
    let mut cmd = Command::new(exe);
    cmd.arg(PROBE_ARG)
        .arg(role)
        .arg(case.probe.as_str())
        .args(grant_args(role, s))
        .args(&case.args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // The directories the supervisor hands the role's worker, at the
    // numbers its table gives them; each source is first moved above every
    // target, so that placing one cannot clobber another.
    let mut placed: Vec<(RawFd, OwnedFd)> = Vec::new();
    if let Some(r) = Role::parse(role) {
        for f in role::spec(r).fds {
            if let (FdKind::Dir(_), Some(dir)) = (f.kind, probe_dir(s, f.slot)) {
                let opened = OwnedFd::from(std::fs::File::open(dir)?);
                let raw = nix::fcntl::fcntl(&opened, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(role::FIRST_FREE_FD))?;
                // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor; we own it.
                placed.push((f.fd, unsafe { OwnedFd::from_raw_fd(raw) }));
            }
        }
    }
    let plan: Vec<(RawFd, RawFd)> = placed.iter().map(|(to, from)| (from.as_raw_fd(), *to)).collect();
    if !plan.is_empty() {
        // SAFETY: runs in the forked child before exec; dup2 is
        // async-signal-safe and works on descriptors this process owns
        // (every source is above every target). dup2 onto a different
        // number clears close-on-exec on the copy.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in &plan {
                    if nix::libc::dup2(*from, *to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }
    let out = cmd.output()?;
    drop(placed);
    Ok(parse_run(out))
}

/// The doctor's directory for a worker's directory descriptor.
fn probe_dir(s: &Setup, slot: Slot) -> Option<&Path> {
    match slot {
        Slot::UploadRoot => Some(&s.upload),
        Slot::DownloadDir => Some(&s.download),
        Slot::TaskDir => Some(&s.tasks),
        Slot::FdChannel => None,
    }
}

fn parse_run(out: std::process::Output) -> Run {
    let mut run = Run { report: None, outcome: None, status: out.status, error: None };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        if let Some(r) = v.get("report") {
            run.report = Some(r.clone());
        } else if let Some(o) = v.get("outcome") {
            run.outcome = Some(o.clone());
        } else if let Some(e) = v.get("error") {
            run.error = e.as_str().map(str::to_owned);
        }
    }
    run
}

/// `(escaped, how)` of a finished probe.
fn verdict(probe: Probe, run: &Run) -> (Option<bool>, String) {
    if let Some(sig) = run.status.signal() {
        let how = if sig == nix::libc::SIGSYS {
            "killed by seccomp (SIGSYS)".to_owned()
        } else {
            format!("killed by signal {sig}")
        };
        return (Some(false), how);
    }
    if run.status.code() == Some(EXEC_MARKER) {
        return (Some(true), "/bin/sh ran".into());
    }
    if let Some(e) = &run.error {
        return (None, format!("could not confine: {e}"));
    }
    if probe == Probe::ExecLoader
        && run.outcome.is_none()
        && run.report.is_some()
        && let Some(code) = run.status.code()
    {
        // The interpreter itself may start (it loads this binary), but it
        // could read no other program to run.
        return (Some(false), format!("the interpreter could not run /bin/sh (exit status {code})"));
    }
    match &run.outcome {
        Some(o) => {
            let escaped = o.get("escaped").and_then(Value::as_bool).unwrap_or(false);
            let how = o.get("error").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| "succeeded".into());
            (Some(escaped), how)
        }
        None => (None, format!("no outcome (exit status {})", run.status)),
    }
}

pub fn run(as_json: bool) -> ExitCode {
    let setup = match Setup::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("snowluma-mcp doctor: cannot prepare probes: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("snowluma-mcp doctor: cannot find own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let support = snowluma_sandbox::Support::detect();
    let mut ok = true;
    let mut roles_out = Vec::new();
    for role in ["supervisor", "spawner", "catalog", "network", "files", "tasks", HTTP_FRONT_ROLE] {
        let mut report = Value::Null;
        let mut probes = Vec::new();
        for case in cases(role, &setup) {
            let (escaped, how) = match spawn_probe(&exe, role, &case, &setup) {
                Ok(r) => {
                    if report.is_null()
                        && let Some(rep) = &r.report
                    {
                        report = rep.clone();
                    }
                    verdict(case.probe, &r)
                }
                Err(e) => (None, format!("could not start the probe: {e}")),
            };
            let passed = match escaped {
                Some(e) => e == case.control,
                None => false,
            };
            ok &= passed;
            probes.push(json!({
                "probe": case.probe.as_str(),
                "what": case.label,
                "expect": if case.control { "allowed" } else { "blocked" },
                "result": match escaped { Some(true) => "succeeded", Some(false) => "blocked", None => "error" },
                "detail": how,
                "pass": passed,
            }));
        }
        roles_out.push(json!({"role": role, "confinement": report, "probes": probes}));
    }
    // The compiled-in preview panel (a packaging check, not a probe).
    let panel = match crate::preview::panel() {
        Ok(text) => json!({"ok": true, "bytes": text.len()}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    ok &= panel["ok"] == json!(true);
    let doc = json!({
        "kernel": {
            "landlock_abi": support.landlock_abi,
            "pinned_abi": PINNED_ABI_NUMBER,
            "seccomp": support.seccomp,
            "openat2": snowluma_workers::openat2_available(),
        },
        "roles": roles_out,
        "packaging": {"preview_panel": panel},
        "ok": ok,
    });
    let mut out = std::io::stdout().lock();
    let text = if as_json { format!("{doc:#}\n") } else { human(&doc) };
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn human(doc: &Value) -> String {
    let mut s = String::new();
    let k = &doc["kernel"];
    s.push_str(&format!(
        "kernel: Landlock ABI {} (policies pinned to ABI {}), seccomp {}\n",
        k["landlock_abi"],
        k["pinned_abi"],
        if k["seccomp"].as_bool() == Some(true) { "available" } else { "unavailable" }
    ));
    // Every file transfer opens beneath its directory with openat2; systemd's
    // RestrictSUIDSGID= (for one) makes it fail with ENOSYS.
    s.push_str(if k["openat2"].as_bool() == Some(true) {
        "openat2: available (file transfers open beneath their directories with it)\n"
    } else {
        "openat2: UNAVAILABLE (ENOSYS): file transfers (downloads and automatic uploads) cannot work here\n"
    });
    for r in doc["roles"].as_array().into_iter().flatten() {
        let c = &r["confinement"];
        s.push_str(&format!(
            "\n{}: landlock {} (ABI {}), seccomp {}{}, no_new_privs {}, dumpable {}\n",
            r["role"].as_str().unwrap_or("?"),
            c["landlock"]["status"].as_str().unwrap_or("unknown"),
            c["landlock"]["kernel_abi"],
            if c["seccomp"].as_bool() == Some(true) { "on" } else { "off" },
            c.get("seccomp_allowed_syscalls").map(|n| format!(" ({n} syscalls allowed)")).unwrap_or_default(),
            c["no_new_privs"],
            c["dumpable"],
        ));
        for p in r["probes"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "  [{}] {}: {} ({})\n",
                if p["pass"].as_bool() == Some(true) { " ok " } else { "FAIL" },
                p["what"].as_str().unwrap_or(""),
                p["result"].as_str().unwrap_or(""),
                p["detail"].as_str().unwrap_or(""),
            ));
        }
    }
    let panel = &doc["packaging"]["preview_panel"];
    if panel["ok"].as_bool() == Some(true) {
        s.push_str(&format!("\npreview panel asset: ok ({} bytes)\n", panel["bytes"]));
    } else {
        s.push_str(&format!("\n[FAIL] preview panel asset: {}\n", panel["error"].as_str().unwrap_or("invalid")));
    }
    s.push_str(if doc["ok"].as_bool() == Some(true) {
        "\nall escape probes were blocked\n"
    } else {
        "\nCONFINEMENT OR PACKAGING FAILURE: see FAIL lines above\n"
    });
    s
}
