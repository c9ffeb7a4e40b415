//! The one fork+exec path of every process this binary starts itself: the
//! spawner starting a worker, and serve-http's launcher starting its HTTP
//! front and each session tree.
//!
//! [`spawn`] moves every source descriptor above the fixed numbers
//! ([`crate::role::FIRST_FREE_FD`]), forks, and in the child marks every
//! inherited descriptor above stderr close-on-exec, places the sources at
//! their numbers (which clears close-on-exec on them), optionally starts a
//! new process group and resets signal handling as `std::process::Command`
//! does, and executes the program: by descriptor (`execveat` with
//! `AT_EMPTY_PATH`, the only exec the spawner's filter allows) or by path.
//! Everything the child touches is allocated before the fork, so it makes
//! only async-signal-safe calls. An exec failure comes back as the child's
//! errno over a close-on-exec pipe.
//!
//! [`Child`] waits for such a process on a tokio runtime (through a pidfd),
//! for callers that serve while their children run (the launcher).

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;

use nix::libc;
use nix::unistd::Pid;

use crate::role::FIRST_FREE_FD;

/// The program to execute.
#[derive(Debug, Clone, Copy)]
pub enum Exe<'a> {
    /// An open executable: `execveat(fd, "", …, AT_EMPTY_PATH)`.
    Fd(RawFd),
    /// A path: `execve(path, …)`.
    Path(&'a CStr),
}

/// One process to start.
#[derive(Debug, Clone, Copy)]
pub struct ExecSpec<'a> {
    pub exe: Exe<'a>,
    /// `argv`, `argv[0]` included.
    pub argv: &'a [CString],
    /// The whole environment (`KEY=value`); empty for none.
    pub envp: &'a [CString],
    /// Descriptors placed at these numbers in the child (0 and 1 included
    /// when given; stderr is inherited unless placed). Every other
    /// descriptor above 2 is closed on exec.
    pub fds: &'a [(RawFd, BorrowedFd<'a>)],
    /// Start a new process group (`setpgid(0, 0)`).
    pub new_process_group: bool,
    /// Empty the signal mask and restore `SIGPIPE`'s default action, as
    /// `std::process::Command` does for the programs it starts.
    pub default_signals: bool,
}

/// `KEY=value` for an environment block.
pub fn env_entry(key: &OsStr, value: &OsStr) -> Result<CString, std::io::Error> {
    let mut bytes = key.as_bytes().to_vec();
    bytes.push(b'=');
    bytes.extend_from_slice(value.as_bytes());
    CString::new(bytes).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in the environment"))
}

/// This process's environment, with `key` set to `value` (replacing it).
pub fn inherited_env_with(key: &OsStr, value: &OsStr) -> Result<Vec<CString>, std::io::Error> {
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os().filter(|(k, _)| k != key) {
        env.push(env_entry(&k, &v)?);
    }
    env.push(env_entry(key, value)?);
    Ok(env)
}

/// Start `spec`'s program; its pid once it has executed (an exec failure
/// is the error, the child reaped).
pub fn spawn(spec: &ExecSpec<'_>) -> std::io::Result<Pid> {
    // Every source above every target, so placing one cannot clobber another.
    let mut moved = Vec::with_capacity(spec.fds.len());
    for (_, fd) in spec.fds {
        let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(FIRST_FREE_FD))?;
        // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor we own.
        moved.push(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    let plan: Vec<(RawFd, RawFd)> =
        spec.fds.iter().zip(&moved).map(|((to, _), from)| (from.as_raw_fd(), *to)).collect();
    let argv = null_terminated(spec.argv);
    let envp = null_terminated(spec.envp);
    // Reports an exec failure (errno) to us; closed by a successful exec.
    let (err_rd, err_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the child only makes async-signal-safe calls (close_range,
    // setpgid, sigprocmask, signal, dup2, execve(at), write, _exit) on
    // memory and descriptors prepared above, and never returns; so forking
    // is sound even in a multi-threaded parent.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let errno = child_exec(spec, &plan, &argv, &envp);
            let bytes = errno.to_ne_bytes();
            // SAFETY: writing 4 bytes from a live buffer, then leaving
            // without running any of the parent's exit handlers.
            unsafe {
                libc::write(err_wr.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::_exit(127)
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(err_wr);
            drop(moved);
            let mut buf = [0u8; 4];
            let n = loop {
                match nix::unistd::read(&err_rd, &mut buf) {
                    Err(nix::Error::EINTR) => continue,
                    other => break other.unwrap_or(0),
                }
            };
            if n == buf.len() {
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
            }
            Ok(child)
        }
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// The child's side of [`spawn`]: returns only on failure, with the errno.
fn child_exec(
    spec: &ExecSpec<'_>,
    plan: &[(RawFd, RawFd)],
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> i32 {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: async-signal-safe calls only (see `spawn`); every pointer
    // points into `argv`/`envp`/`spec`, alive until exec or _exit.
    unsafe {
        let _ = libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
        if spec.new_process_group && libc::setpgid(0, 0) < 0 {
            return errno();
        }
        if spec.default_signals {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) < 0 {
                return errno();
            }
            if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
                return errno();
            }
        }
        for (from, to) in plan {
            if libc::dup2(*from, *to) < 0 {
                return errno();
            }
        }
        match spec.exe {
            Exe::Fd(fd) => {
                libc::syscall(libc::SYS_execveat, fd, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH);
            }
            Exe::Path(path) => {
                libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
        }
        errno()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// A process started by [`spawn`], waited for on the current tokio runtime
/// through its pidfd (the methods the launcher used on tokio's own child).
pub struct Child {
    pid: Pid,
    pidfd: tokio::io::unix::AsyncFd<OwnedFd>,
    status: Option<std::process::ExitStatus>,
    kill_on_drop: bool,
}

impl Child {
    /// [`spawn`], then watch the child. Must run on a tokio runtime.
    pub fn spawn(spec: &ExecSpec<'_>) -> std::io::Result<Child> {
        let pid = spawn(spec)?;
        // SAFETY: pidfd_open takes a pid and flags; no memory is touched.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0 as libc::c_uint) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
            return Err(e);
        }
        // SAFETY: pidfd_open returned a new descriptor (close-on-exec) we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
        // SAFETY: the OwnedFd moves into the AsyncFd, so the descriptor
        // stays open and unchanged for the AsyncFd's whole life.
        let pidfd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Child { pid, pidfd, status: None, kill_on_drop: false })
    }

    /// Kill the process when this handle is dropped before it was reaped.
    pub fn kill_on_drop(mut self, kill: bool) -> Child {
        self.kill_on_drop = kill;
        self
    }

    /// Its pid, until it has been reaped.
    pub fn id(&self) -> Option<u32> {
        if self.status.is_some() { None } else { u32::try_from(self.pid.as_raw()).ok() }
    }

    /// Wait for it to exit (cancel-safe; its status once reaped).
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Ok(s);
            }
            let mut ready = self.pidfd.readable().await?;
            let mut raw: libc::c_int = 0;
            // SAFETY: waitpid writes the status into a live local.
            let r = unsafe { libc::waitpid(self.pid.as_raw(), &mut raw, libc::WNOHANG) };
            if r == self.pid.as_raw() {
                self.status = Some(std::process::ExitStatus::from_raw(raw));
            } else if r == 0 {
                ready.clear_ready();
            } else {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }

    /// Send it SIGKILL (through the pidfd: never another process that took its pid).
    pub fn start_kill(&mut self) -> std::io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        pidfd_kill(self.pidfd.get_ref().as_fd())
    }
}

fn pidfd_kill(pidfd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal with no siginfo (null) touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.kill_on_drop && self.status.is_none() {
            let _ = pidfd_kill(self.pidfd.get_ref().as_fd());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn argv(a: &[&str]) -> Vec<CString> {
        a.iter().map(|s| CString::new(*s).unwrap()).collect()
    }

    /// Descriptors land at their numbers, nothing else is inherited, the
    /// environment is exactly the one given.
    #[tokio::test]
    async fn places_descriptors_and_environment() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let sh = argv(&["sh", "-c", "ls /proc/self/fd | sort -n | tr '\\n' ' ' >&5; echo \"[$FOO]\" >&5"]);
        let env = vec![env_entry(OsStr::new("FOO"), OsStr::new("bar")).unwrap()];
        let fds = [(5, w.as_fd())];
        let spec = ExecSpec {
            exe: Exe::Path(c"/bin/sh"),
            argv: &sh,
            envp: &env,
            fds: &fds,
            new_process_group: true,
            default_signals: true,
        };
        let mut child = Child::spawn(&spec).unwrap();
        drop(w);
        assert!(child.wait().await.unwrap().success());
        assert!(child.id().is_none());
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut s).unwrap();
        // 0-2, fd 5, and the one ls opens to list the directory: nothing
        // else of this (test) process reached the child.
        let listed: Vec<&str> = s.split_whitespace().take_while(|w| !w.starts_with('[')).collect();
        assert!(listed.starts_with(&["0", "1", "2"]), "{s}");
        assert!(listed.contains(&"5") && listed.len() <= 5, "{s}");
        assert!(s.contains("[bar]"), "{s}");
    }

    #[test]
    fn an_exec_failure_is_the_error() {
        let a = argv(&["nothing"]);
        let spec = ExecSpec {
            exe: Exe::Path(c"/nonexistent/program"),
            argv: &a,
            envp: &[],
            fds: &[],
            new_process_group: false,
            default_signals: false,
        };
        let e = spawn(&spec).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
