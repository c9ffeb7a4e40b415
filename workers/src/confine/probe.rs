//! Escape probes: a confined process tries one forbidden operation and says
//! whether it got through.
//!
//! Used by `snowluma-mcp doctor` and the confinement tests, never by a
//! serving worker: probe mode is a separate hidden command line
//! (`__snowluma-probe <role> <probe> [k=v…]`) that no MCP client can reach.
//! The probe process prints its confinement [`super::Report`] as one JSON
//! line, then one JSON line with the outcome, and exits 0 if the operation
//! was blocked, 1 if it escaped. A seccomp kill (`SIGSYS`) before the second
//! line also means blocked.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

use serde::Serialize;

/// Exit code of a probe whose operation escaped confinement.
pub const ESCAPED_EXIT: u8 = 1;
/// Exit code of `/bin/sh -c "exit 97"`, i.e. an exec that worked.
pub const EXEC_MARKER: i32 = 97;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Open `/etc/passwd` for reading.
    ReadEtcPasswd,
    /// Create a file at `path=` (outside every granted root).
    WriteOutside,
    /// TCP connect to `127.0.0.1:port=`.
    Connect,
    /// `socket(AF_UNIX)`: a new socket of any kind.
    NewSocket,
    /// execve `/bin/sh`.
    ExecShell,
    /// `kill(pid=, SIGCONT)` on a process outside this one's domain.
    Signal,
    /// `ptrace(PTRACE_SEIZE, pid=)`.
    Ptrace,
    /// Open a file named `name=` beneath descriptor 4 for reading (a positive
    /// control for the file-transfer worker's upload root).
    ReadGranted,
}

impl Probe {
    pub const ALL: [Probe; 8] = [
        Probe::ReadEtcPasswd,
        Probe::WriteOutside,
        Probe::Connect,
        Probe::NewSocket,
        Probe::ExecShell,
        Probe::Signal,
        Probe::Ptrace,
        Probe::ReadGranted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Probe::ReadEtcPasswd => "read-etc-passwd",
            Probe::WriteOutside => "write-outside",
            Probe::Connect => "connect",
            Probe::NewSocket => "new-socket",
            Probe::ExecShell => "exec-shell",
            Probe::Signal => "signal",
            Probe::Ptrace => "ptrace",
            Probe::ReadGranted => "read-granted",
        }
    }

    pub fn parse(s: &str) -> Option<Probe> {
        Probe::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Parameters of a probe (`key=value` argv elements).
#[derive(Debug, Default, Clone)]
pub struct ProbeArgs {
    pub path: Option<String>,
    pub port: Option<u16>,
    pub pid: Option<i32>,
    pub name: Option<String>,
}

impl ProbeArgs {
    /// Split `args` into probe parameters and the rest (grants).
    pub fn split(args: &[String]) -> (ProbeArgs, Vec<String>) {
        let mut p = ProbeArgs::default();
        let mut rest = Vec::new();
        for a in args {
            if let Some(v) = a.strip_prefix("path=") {
                p.path = Some(v.to_owned());
            } else if let Some(v) = a.strip_prefix("port=") {
                p.port = v.parse().ok();
            } else if let Some(v) = a.strip_prefix("pid=") {
                p.pid = v.parse().ok();
            } else if let Some(v) = a.strip_prefix("name=") {
                p.name = Some(v.to_owned());
            } else {
                rest.push(a.clone());
            }
        }
        (p, rest)
    }
}

#[derive(Debug, Serialize)]
pub struct Outcome {
    pub probe: &'static str,
    /// `true` when the operation succeeded.
    pub escaped: bool,
    /// The error that stopped it, when it was stopped by an error.
    pub error: Option<String>,
}

fn result<T>(probe: Probe, r: Result<T, String>) -> Outcome {
    match r {
        Ok(_) => Outcome { probe: probe.as_str(), escaped: true, error: None },
        Err(e) => Outcome { probe: probe.as_str(), escaped: false, error: Some(e) },
    }
}

/// Try the operation. A seccomp kill never returns.
pub fn run(probe: Probe, args: &ProbeArgs) -> Outcome {
    use nix::libc;
    let r: Result<(), String> = match probe {
        Probe::ReadEtcPasswd => std::fs::File::open("/etc/passwd").map(drop).map_err(|e| e.to_string()),
        Probe::WriteOutside => {
            let path = args.path.clone().unwrap_or_else(|| format!("/tmp/snowluma-probe-{}", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(_) => {
                    let _ = std::fs::remove_file(&path);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        }
        Probe::Connect => {
            let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, args.port.unwrap_or(9));
            TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5)).map(drop).map_err(|e| e.to_string())
        }
        Probe::NewSocket => {
            // SAFETY: socket(2) takes no pointers; the descriptor, if any, is closed at once.
            let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                Err(std::io::Error::last_os_error().to_string())
            } else {
                // SAFETY: fd was just returned by socket() and is owned here.
                unsafe { libc::close(fd) };
                Ok(())
            }
        }
        Probe::ExecShell => {
            let argv = [c"/bin/sh".as_ptr(), c"-c".as_ptr(), c"exit 97".as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null::<libc::c_char>()];
            // SAFETY: argv and envp are NUL-terminated arrays of valid C
            // strings that outlive the call; on success the call never returns.
            unsafe { libc::execve(c"/bin/sh".as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            Err(std::io::Error::last_os_error().to_string())
        }
        Probe::Signal => match args.pid {
            None => Err("no pid= given".into()),
            Some(pid) => nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT)
                .map_err(|e| e.to_string()),
        },
        Probe::Ptrace => match args.pid {
            None => Err("no pid= given".into()),
            Some(pid) => {
                // SAFETY: PTRACE_SEIZE takes no pointers (addr and data 0).
                let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize) };
                if r < 0 {
                    Err(std::io::Error::last_os_error().to_string())
                } else {
                    // SAFETY: as above; detach what we seized.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0usize, 0usize) };
                    Ok(())
                }
            }
        },
        Probe::ReadGranted => {
            let name = args.name.clone().unwrap_or_else(|| "probe.txt".into());
            match std::ffi::CString::new(name) {
                Err(_) => Err("bad name".into()),
                Ok(c) => {
                    // SAFETY: c is a valid C string; the descriptor is closed at once.
                    let fd = unsafe { libc::openat(4, c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                    if fd < 0 {
                        Err(std::io::Error::last_os_error().to_string())
                    } else {
                        // SAFETY: fd was just returned by openat and is owned here.
                        unsafe { libc::close(fd) };
                        Ok(())
                    }
                }
            }
        }
    };
    result(probe, r)
}

/// Print a JSON line on stdout (probe mode only: its stdout is the doctor's pipe).
pub fn emit<T: Serialize>(v: &T) {
    let mut out = std::io::stdout().lock();
    if let Ok(s) = serde_json::to_string(v) {
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    }
}
