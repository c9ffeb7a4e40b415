//! Escape probes: a confined process tries one forbidden operation and says
//! whether it got through.
//!
//! Used by `snowluma-mcp doctor` and the confinement tests, never by a
//! serving process: probe mode is a separate hidden command line
//! ([`PROBE_ARG`] `<role> <probe> [k=v…]`) that no MCP client can reach.
//! The probe process ([`probe_main`]) confines itself through the role's
//! own entry point ([`crate::confine_supervisor`],
//! [`crate::confine_spawner`], [`crate::prepare_worker`] and
//! [`crate::confine_worker`]), prints its confinement report as one JSON
//! line, then one JSON line with the outcome, and exits 0 if the operation
//! was blocked, 1 if it escaped. A seccomp kill (`SIGSYS`) before the second
//! line also means blocked.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use snowluma_proto::Role;

use crate::fds::{FILES_UPLOAD_ROOT_FD, SPAWNER_EXE_FD};
use crate::profile::spawner::{SpawnerGrants, confine_spawner};
use crate::profile::supervisor::confine_supervisor;
use crate::profile::worker::{Grants, confine_worker, prepare_worker};

/// The HTTP front's name in probe mode and in `doctor`.
pub const HTTP_FRONT_ROLE: &str = "http-front";

/// Hidden first argument of probe mode.
pub const PROBE_ARG: &str = "__snowluma-probe";

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
    /// Open a file named `name=` beneath descriptor 4 (the upload root) for reading (a positive
    /// control for the file-transfer worker's upload root).
    ReadGranted,
    /// Open `/etc/shadow` for reading (root reads it without any capability).
    ReadEtcShadow,
    /// A UDP datagram to `127.0.0.1:port=` (`socket` + `sendto`).
    UdpSend,
    /// Connect to the unix socket at `path=` (a pathname socket).
    UnixConnect,
    /// Run `/bin/sh` through the ELF interpreter at `path=`: `execve` of the
    /// interpreter, then `execveat` of it by absolute path beside the
    /// spawner's executable descriptor.
    ExecLoader,
    /// `memfd_create`, write a tiny program into it, `execveat` it.
    MemfdExec,
    /// A raw `AF_PACKET` socket (needs `CAP_NET_RAW`).
    PacketSocket,
    /// `prctl(PR_SET_DUMPABLE, 1)`: become traceable and core-dumpable again.
    SetDumpable,
}

impl Probe {
    pub const ALL: [Probe; 15] = [
        Probe::ReadEtcPasswd,
        Probe::WriteOutside,
        Probe::Connect,
        Probe::NewSocket,
        Probe::ExecShell,
        Probe::Signal,
        Probe::Ptrace,
        Probe::ReadGranted,
        Probe::ReadEtcShadow,
        Probe::UdpSend,
        Probe::UnixConnect,
        Probe::ExecLoader,
        Probe::MemfdExec,
        Probe::PacketSocket,
        Probe::SetDumpable,
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
            Probe::ReadEtcShadow => "read-etc-shadow",
            Probe::UdpSend => "udp-send",
            Probe::UnixConnect => "unix-connect",
            Probe::ExecLoader => "exec-loader",
            Probe::MemfdExec => "memfd-exec",
            Probe::PacketSocket => "packet-socket",
            Probe::SetDumpable => "set-dumpable",
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

/// A program of 132 bytes that exits with [`EXEC_MARKER`]: a static ELF
/// with one loadable segment, written into a memfd by [`Probe::MemfdExec`].
pub fn exit_marker_elf() -> Option<Vec<u8>> {
    let (machine, code): (u16, Vec<u8>) = if cfg!(target_arch = "x86_64") {
        // mov edi, 97; mov eax, 60 (exit); syscall
        (0x3e, vec![0xbf, 97, 0, 0, 0, 0xb8, 60, 0, 0, 0, 0x0f, 0x05])
    } else if cfg!(target_arch = "aarch64") {
        // mov x0, #97; mov x8, #93 (exit); svc #0
        (0xb7, [0xd280_0c20u32, 0xd280_0ba8, 0xd400_0001].iter().flat_map(|i| i.to_le_bytes()).collect())
    } else {
        return None;
    };
    let base: u64 = 0x40_0000;
    let size = (64 + 56 + code.len()) as u64;
    let mut e = Vec::with_capacity(size as usize);
    e.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&machine.to_le_bytes());
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&(base + 120).to_le_bytes()); // entry: the code
    e.extend_from_slice(&64u64.to_le_bytes()); // program headers
    e.extend_from_slice(&0u64.to_le_bytes()); // no sections
    e.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 0, 0] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R + X
    for v in [0, base, base, size, size, 0x1000] {
        e.extend_from_slice(&v.to_le_bytes());
    }
    e.extend_from_slice(&code);
    Some(e)
}

fn os_err<T>() -> Result<T, String> {
    Err(std::io::Error::last_os_error().to_string())
}

/// `execveat(fd, path, argv, [], flags)`; returns only on failure.
fn execveat(fd: i32, path: &std::ffi::CStr, argv: &[&std::ffi::CStr], flags: i32) -> Result<(), String> {
    use nix::libc;
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: path, argv and envp are NUL-terminated and outlive the call;
    // on success the call never returns.
    unsafe { libc::syscall(libc::SYS_execveat, fd, path.as_ptr(), ptrs.as_ptr(), envp.as_ptr(), flags) };
    os_err()
}

fn socket(domain: i32, ty: i32, proto: i32) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) takes no pointers; the descriptor is owned at once.
    let fd = unsafe { nix::libc::socket(domain, ty | nix::libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return os_err();
    }
    // SAFETY: fd was just returned by socket() and is owned here.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn extra_probe(probe: Probe, args: &ProbeArgs) -> Result<(), String> {
    use nix::libc;
    use std::os::fd::AsRawFd;
    match probe {
        Probe::ReadEtcShadow => std::fs::File::open("/etc/shadow").map(drop).map_err(|e| e.to_string()),
        Probe::UdpSend => {
            let s = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
            s.send_to(b"probe", (Ipv4Addr::LOCALHOST, args.port.unwrap_or(9))).map(drop).map_err(|e| e.to_string())
        }
        Probe::UnixConnect => {
            let s = socket(libc::AF_UNIX, libc::SOCK_STREAM, 0)?;
            let path = args.path.clone().unwrap_or_else(|| "/run/systemd/private".into());
            let addr = nix::sys::socket::UnixAddr::new(path.as_str()).map_err(|e| e.to_string())?;
            nix::sys::socket::connect(s.as_raw_fd(), &addr).map_err(|e| e.to_string())
        }
        Probe::ExecLoader => {
            let interp = args.path.clone().unwrap_or_else(|| "/lib64/ld-linux-x86-64.so.2".into());
            let interp = std::ffi::CString::new(interp).map_err(|_| "bad path".to_owned())?;
            let argv = [interp.as_c_str(), c"/bin/sh", c"-c", c"exit 97"];
            let first = execveat(libc::AT_FDCWD, &interp, &argv, 0);
            // An absolute path with AT_EMPTY_PATH beside the one descriptor
            // the spawner may execute: the path wins over the descriptor.
            let second = execveat(SPAWNER_EXE_FD, &interp, &argv, libc::AT_EMPTY_PATH);
            Err(format!("{}; {}", first.err().unwrap_or_default(), second.err().unwrap_or_default()))
        }
        Probe::MemfdExec => {
            let elf = exit_marker_elf().ok_or("no test program for this architecture")?;
            // SAFETY: the name is a valid C string; the descriptor is owned below.
            let fd = unsafe { libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return os_err();
            }
            // SAFETY: fd was just returned by memfd_create and is owned here.
            let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            std::io::Write::write_all(&mut &file, &elf).map_err(|e| e.to_string())?;
            execveat(file.as_raw_fd(), c"", &[c"probe"], libc::AT_EMPTY_PATH)
        }
        Probe::PacketSocket => {
            socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from((libc::ETH_P_ALL as u16).to_be())).map(drop)
        }
        Probe::SetDumpable => nix::sys::prctl::set_dumpable(true).map_err(|e| e.to_string()),
        _ => Err("not an extra probe".into()),
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
                    let fd =
                        unsafe { libc::openat(FILES_UPLOAD_ROOT_FD, c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
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
        other => extra_probe(other, args),
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

/// Probe mode (`PROBE_ARG <role|supervisor|spawner> <probe> [k=v…]`):
/// confine as that process does in service, with the grants in the
/// arguments, print the report, try `probe`, print the outcome. Exit 0 when
/// blocked, [`ESCAPED_EXIT`] when it got through, 2 on bad arguments, 3 when
/// confinement failed.
pub fn probe_main(args: &[String]) -> ExitCode {
    let (Some(role), Some(probe)) = (args.first(), args.get(1).and_then(|p| Probe::parse(p))) else {
        eprintln!("snowluma-mcp: usage: {PROBE_ARG} <role> <probe> [k=v…]");
        return ExitCode::from(2);
    };
    let rest = args.get(2..).unwrap_or_default();
    let (pargs, grant_args) = ProbeArgs::split(rest);
    let report = match role.as_str() {
        // The same entry points, in the same order, as in service.
        "supervisor" => confine_supervisor(false).map(|r| serde_json::to_value(r).unwrap_or_default()),
        // serve-http's front: prepared and confined as in service (no
        // runtime exists here, which it would have built in between).
        HTTP_FRONT_ROLE => crate::profile::http::prepare_http_front()
            .and_then(|()| crate::profile::http::confine_http_front(false))
            .map(|r| serde_json::to_value(r).unwrap_or_default()),
        "spawner" => {
            let tcp_ports = match Grants::from_args(Role::Catalog, &grant_args) {
                Ok(g) => g.tcp_ports,
                Err(e) => {
                    eprintln!("snowluma-mcp: {e}");
                    return ExitCode::from(2);
                }
            };
            confine_spawner(&SpawnerGrants { tcp_ports, ..SpawnerGrants::default() })
                .map(|r| serde_json::to_value(r).unwrap_or_default())
        }
        other => match Role::parse(other) {
            Some(r) => Grants::from_args(r, &grant_args)
                .and_then(|g| prepare_worker(r).map(|()| g))
                .and_then(|g| confine_worker(r, &g))
                .map(|r| serde_json::to_value(r).unwrap_or_default()),
            None => {
                eprintln!("snowluma-mcp: unknown role {other}");
                return ExitCode::from(2);
            }
        },
    };
    match report {
        Ok(report) => {
            emit(&json!({"report": report}));
            let outcome = run(probe, &pargs);
            emit(&json!({"outcome": outcome}));
            if outcome.escaped { ExitCode::from(ESCAPED_EXIT) } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            emit(&json!({"error": e.to_string()}));
            ExitCode::from(3)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The probes must be able to escape where nothing confines them, or a
    /// blocked probe proves nothing: these run in the (unconfined) test
    /// process.
    #[test]
    fn unconfined_the_network_probes_get_through() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let args = ProbeArgs { port: Some(udp.local_addr().unwrap().port()), ..ProbeArgs::default() };
        assert!(run(Probe::UdpSend, &args).escaped);
        let dir = std::env::temp_dir().join(format!("snowluma-probe-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let args = ProbeArgs { path: Some(path.display().to_string()), ..ProbeArgs::default() };
        assert!(run(Probe::UnixConnect, &args).escaped);
        std::fs::remove_dir_all(&dir).ok();
        // Only root (CAP_NET_RAW) may open a packet socket.
        let root = nix::unistd::geteuid().is_root();
        assert_eq!(run(Probe::PacketSocket, &ProbeArgs::default()).escaped, root);
        // The test process is dumpable already; setting it again succeeds.
        assert!(run(Probe::SetDumpable, &ProbeArgs::default()).escaped);
    }

    #[test]
    fn the_memfd_test_program_really_runs() {
        let Some(elf) = exit_marker_elf() else { return };
        let dir = std::env::temp_dir().join(format!("snowluma-probe-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("exit97");
        std::fs::write(&path, &elf).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let status = std::process::Command::new(&path).status().unwrap();
        assert_eq!(status.code(), Some(EXEC_MARKER));
        std::fs::remove_dir_all(&dir).ok();
    }
}
