//! Worker processes of snowluma-mcp.
//!
//! The supervisor re-executes its own binary with a hidden role argument;
//! `main` hands control to [`worker_main`] before any async runtime exists,
//! so each role can confine itself while the process is still single
//! threaded ([`confine`]). Then a current-thread runtime serves requests from
//! the IPC socket on descriptor [`WORKER_IPC_FD`] ([`serve`]) until the
//! supervisor closes it.

pub mod catalog;
pub mod confine;
pub mod files;
pub mod network;
pub mod serve;
pub mod transfer;

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use snowluma_proto::{Role, WORKER_IPC_FD};

/// Entry point of a worker process. Must run before any other thread exists.
pub fn worker_main(role: Role) -> ExitCode {
    // Confinement first: nothing below may need what it takes away.
    if let Err(e) = confine::confine_self(role) {
        tracing::error!(role = role.as_str(), error = %e, "worker refuses to start: confinement failed");
        return ExitCode::from(3);
    }
    // SAFETY: the supervisor placed exactly one socket on WORKER_IPC_FD before
    // exec and nothing in this process has touched that descriptor yet, so we
    // take sole ownership of it here.
    let fd = unsafe { OwnedFd::from_raw_fd(WORKER_IPC_FD) };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "worker cannot start its runtime");
            return ExitCode::from(4);
        }
    };
    let result = rt.block_on(async move {
        match role {
            Role::Catalog => serve::serve(fd, role, catalog::CatalogWorker::new()).await,
            Role::Network => serve::serve(fd, role, network::NetworkWorker::from_inherited()).await,
            Role::Files => serve::serve(fd, role, files::FilesWorker::from_inherited()).await,
            Role::Tasks => Err(serve::ServeError::RoleNotBuilt(role)),
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
