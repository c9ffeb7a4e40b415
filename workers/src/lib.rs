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
    // The file-transfer worker's descriptors are claimed before the runtime
    // exists: a role descriptor the supervisor did not place (no upload
    // root) is a free number that the runtime's epoll or eventfd would take,
    // and claiming that would close the runtime's descriptor twice.
    let files = (role == Role::Files).then(files::FilesWorker::from_inherited);
    let tasks = (role == Role::Tasks).then(tasks::TasksWorker::from_inherited);
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
    // SAFETY: the supervisor placed exactly one socket on WORKER_IPC_FD before
    // exec and nothing in this process has touched that descriptor yet, so we
    // take sole ownership of it here.
    let fd = unsafe { OwnedFd::from_raw_fd(WORKER_IPC_FD) };
    let result = rt.block_on(async move {
        match role {
            Role::Catalog => serve::serve(fd, role, catalog::CatalogWorker::new()).await,
            Role::Network => serve::serve(fd, role, network::NetworkWorker::from_inherited()).await,
            Role::Files => match files {
                Some(files) => serve::serve(fd, role, files).await,
                None => Err(serve::ServeError::RoleNotBuilt(role)),
            },
            Role::Tasks => match tasks {
                Some(tasks) => serve::serve(fd, role, tasks).await,
                None => Err(serve::ServeError::RoleNotBuilt(role)),
            },
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
