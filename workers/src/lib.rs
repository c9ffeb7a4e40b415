//! Worker processes of snowluma-mcp.
//!
//! The supervisor re-executes its own binary with a hidden role argument;
//! `main` hands control to [`worker_main`] before any async runtime exists,
//! so each role can confine itself while the process is still single
//! threaded (`snowluma_sandbox`). Then a current-thread runtime serves
//! requests from the IPC socket on descriptor [`WORKER_IPC_FD`] (`serve`)
//! until the supervisor closes it.

mod catalog;
mod files;
mod http1;
mod network;
mod serve;
mod tasks;
pub mod upload_path;

pub use files::openat2_available;

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use snowluma_proto::{Role, WORKER_IPC_FD};
use snowluma_sandbox::{Grants, confine_worker, prepare_worker};

/// Entry point of a worker process. Must run before any other thread exists.
/// `grant_args` are the argv elements after the log filter ([`Grants`]).
pub fn worker_main(role: Role, grant_args: &[String]) -> ExitCode {
    // Confinement first: nothing below may need what it takes away. The
    // current-thread runtime is built between the two steps: it starts no
    // thread, and its descriptors (epoll, eventfd, the signal driver's
    // socketpair) then exist before seccomp forbids creating sockets.
    let grants = match Grants::from_args(role, grant_args) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(role = role.as_str(), error = %e, "worker refuses to start");
            return ExitCode::from(3);
        }
    };
    if let Err(e) = prepare_worker(role) {
        tracing::error!(role = role.as_str(), error = %e, "worker refuses to start: confinement failed");
        return ExitCode::from(3);
    }
    // Every descriptor is claimed, through the role's table, before the
    // runtime exists: a role descriptor the supervisor did not place (no
    // upload root) is a free number that the runtime's epoll or eventfd
    // would take, and claiming that later would close the runtime's
    // descriptor twice.
    let mut claimed = snowluma_sandbox::role::claim(role);
    // SAFETY: the spawner placed exactly one socket on WORKER_IPC_FD before
    // exec, prepare_worker kept it, and nothing in this process has touched
    // that descriptor yet, so we take sole ownership of it here.
    let ipc = unsafe { OwnedFd::from_raw_fd(WORKER_IPC_FD) };
    let handler = Handler::new(role, &mut claimed);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "worker cannot start its runtime");
            return ExitCode::from(4);
        }
    };
    match confine_worker(role, &grants) {
        Ok(r) => tracing::debug!(
            role = role.as_str(),
            landlock = r.landlock.status.as_str(),
            landlock_abi = r.landlock.kernel_abi,
            seccomp = r.seccomp,
            "worker confined"
        ),
        Err(e) => {
            tracing::error!(role = role.as_str(), error = %e, "worker refuses to start: confinement failed");
            return ExitCode::from(3);
        }
    }
    let result = rt.block_on(async move {
        match handler {
            Handler::Catalog(h) => serve::serve(ipc, role, h).await,
            Handler::Network(h) => {
                tokio::spawn(timer_anchor());
                serve::serve(ipc, role, h).await
            }
            Handler::Files(h) => serve::serve(ipc, role, h).await,
            Handler::Tasks(h) => serve::serve(ipc, role, h).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(role = role.as_str(), error = %e, "worker stopped");
            ExitCode::from(5)
        }
    }
}

/// A role's handler, built from its claimed descriptors before the runtime.
// One value per process, held for its whole life: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Handler {
    Catalog(catalog::CatalogWorker),
    Network(network::NetworkWorker),
    Files(files::FilesWorker),
    Tasks(tasks::TasksWorker),
}

impl Handler {
    fn new(role: Role, claimed: &mut snowluma_sandbox::role::Claimed) -> Handler {
        match role {
            Role::Catalog => Handler::Catalog(catalog::CatalogWorker::new()),
            Role::Network => Handler::Network(network::NetworkWorker::from_claimed(claimed)),
            Role::Files => Handler::Files(files::FilesWorker::from_claimed(claimed)),
            Role::Tasks => Handler::Tasks(tasks::TasksWorker::from_claimed(claimed)),
        }
    }
}

/// How often [`timer_anchor`] wakes.
const TIMER_ANCHOR: std::time::Duration = std::time::Duration::from_secs(5);

/// A timer that is always pending, due sooner than any call's deadline.
/// Tokio's timer wakes its driver through the eventfd (a `write`, then one
/// more `epoll_wait`) whenever a new timer is due before every pending one,
/// so without it each call's own timeout did that once per call. Costs one
/// wake-up every [`TIMER_ANCHOR`]; calls with a shorter timeout are merely
/// not helped.
async fn timer_anchor() {
    loop {
        tokio::time::sleep(TIMER_ANCHOR).await;
    }
}
