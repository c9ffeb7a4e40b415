//! `snowluma-mcp`: one binary, one process role per entry, chosen here by
//! argv (see ARCHITECTURE.md, "Process roles"). Hidden first arguments run
//! the roles only this binary starts: a confined worker, `serve-http`'s
//! HTTP front, an escape probe. Otherwise the command line is parsed: the
//! stdio server (no subcommand), `serve-http`'s launcher, `doctor`, `audit`.
//!
//! The C `main` is ours (`no_main`): std's runtime set-up would, in every
//! process of the tree, read and parse `/proc/self/maps` to place the main
//! thread's stack guard (glibc's `pthread_getattr_np`), a fifth of an
//! empty program's start-up on this kind of VM. What else that set-up
//! does is done here: descriptors 0-2 opened on `/dev/null` if closed,
//! `SIGPIPE` ignored, and stdout flushed at the end. A stack overflow then
//! ends the process with `SIGSEGV` instead of std's message first.
#![cfg_attr(not(test), no_main)]

use std::process::ExitCode;

use clap::Parser;
use snowluma_config::{Cli, Command};
use snowluma_logsink::{eprintln_nb, init_tracing};
use snowluma_proto::session::FRONT_ARG;
use snowluma_proto::{Role, WORKER_ARG};
use snowluma_sandbox::probe::PROBE_ARG;

/// The process's entry point (see the module docs).
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: std::ffi::c_int, _argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    // std takes the arguments itself (glibc hands them to its .init_array hook).
    snowluma_proto::rt::start();
    let code = run();
    snowluma_proto::rt::finish(code)
}

#[cfg(test)]
fn main() -> ExitCode {
    run()
}

fn run() -> ExitCode {
    snowluma_proto::alloc::tune();
    #[cfg(snowluma_pgo_training)]
    pgo_training::start_writer();
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(1) {
        Some(WORKER_ARG) => {
            // Still single-threaded here, as confinement requires.
            let Some(role) = arg(2).and_then(Role::parse) else {
                eprintln_nb!("snowluma-mcp: unknown worker role");
                return ExitCode::from(2);
            };
            // The workers' seccomp filters allow no poll.
            init_tracing(arg(3).unwrap_or("info"), false);
            return snowluma_workers::worker_main(role, args.get(4..).unwrap_or_default());
        }
        Some(FRONT_ARG) => {
            // Started by the serve-http launcher only; its filter allows no poll.
            init_tracing(arg(2).unwrap_or("info"), false);
            return snowluma_http::front::main(arg(3) == Some(snowluma_sandbox::UNCONFINED_OK_ARG));
        }
        // Doctor and tests only: confine as a role, try one forbidden
        // operation, report.
        Some(PROBE_ARG) => return snowluma_sandbox::probe::probe_main(args.get(2..).unwrap_or_default()),
        _ => {}
    }
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Doctor { json }) => snowluma_mcp::doctor::run(*json),
        Some(Command::Audit { action }) => snowluma_mcp::audit_command(action, cli.audit_key.as_deref()),
        Some(Command::ServeHttp(opts)) => snowluma_http::launcher::run(&cli, opts),
        None => snowluma_mcp::serve_stdio(&cli),
    }
}

/// A profile-training build (`scripts/pgo-profile`): built with
/// `-Cprofile-generate`, which links LLVM's profile runtime. Workers are
/// killed at the end of a session rather than left to exit, so every
/// process adds its counts to its profile file four times a second. Each
/// process has a file of its own: one killed while writing spoils only its
/// own counts (the script merges the others).
#[cfg(snowluma_pgo_training)]
mod pgo_training {
    use std::ffi::{CStr, CString, c_char, c_int};

    unsafe extern "C" {
        fn __llvm_profile_write_file() -> c_int;
        fn __llvm_profile_reset_counters();
        fn __llvm_profile_get_filename() -> *const c_char;
        fn __llvm_profile_set_filename(name: *const c_char);
    }

    pub(crate) fn start_writer() {
        snowluma_logsink::eprintln_nb!(
            "snowluma-mcp: a profile-training build, with no confinement; never run it for real"
        );
        // SAFETY: the runtime returns its current file name, a NUL-terminated
        // string it keeps alive; it is only read here.
        let current = unsafe { CStr::from_ptr(__llvm_profile_get_filename()) }.to_string_lossy().into_owned();
        let dir = current.rsplit_once('/').map_or(".", |(dir, _)| dir);
        if let Ok(pattern) = CString::new(format!("{dir}/snowluma-%p-%m.profraw")) {
            // SAFETY: a NUL-terminated pattern, leaked so that it outlives
            // every use the runtime may make of it.
            unsafe { __llvm_profile_set_filename(pattern.into_raw()) };
        }
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                // SAFETY: the profile runtime's own entry points, linked by
                // -Cprofile-generate; they take no arguments. The file is
                // merged into (%m), so counts written are reset, not written
                // twice.
                unsafe {
                    __llvm_profile_write_file();
                    __llvm_profile_reset_counters();
                }
            }
        });
    }
}
