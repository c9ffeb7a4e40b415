//! Confinement of every snowluma-mcp process, in one place.
//!
//! Each process confines itself through one entry point, which runs its
//! whole sequence (rlimits, capabilities, no new privileges, not dumpable,
//! Landlock, seccomp) while the process is still single-threaded (Landlock
//! and seccomp restrict the calling thread and its future children only):
//!
//! * the supervisor: [`confine_supervisor`];
//! * the spawner: [`confine_spawner`] with its [`SpawnerGrants`];
//! * the HTTP front of `serve-http`: [`prepare_http_front`], then
//!   [`confine_http_front`];
//! * each worker: [`prepare_worker`], then (once its current-thread runtime
//!   exists) [`confine_worker`] with the [`Grants`] on its command line.
//!
//! The pieces: [`landlock`], [`seccomp`], [`exec`] (the one fork+exec path
//! of the spawner and serve-http's launcher), [`fds`] (the fixed descriptor
//! numbers and closing the rest), [`role`] (one table per worker role:
//! descriptors, channel direction, Landlock grants, seccomp lists), [`rlimits`] (no core dumps, no
//! capabilities), [`policy`] (every process's seccomp lists and kept
//! descriptors as data, one file per profile), [`profile`] (the entry
//! points), [`support`] (what the kernel can enforce, the startup gate for
//! weak kernels, the `confinement` object of `get_runtime_info`) and
//! [`probe`] (escape probes, run by `snowluma-mcp doctor` through the same
//! entry points). The least-privilege matrix is written out in
//! ARCHITECTURE.md ("Confinement").

mod bpf;
pub mod exec;
pub mod fds;
pub mod landlock;
pub mod policy;
pub mod probe;
pub mod profile;
pub mod rlimits;
pub mod role;
pub mod seccomp;
pub mod support;

pub use crate::landlock::{Enforcement, LandlockReport};
pub use crate::profile::ConfineError;
pub use crate::profile::SupervisorReport;
pub use crate::profile::http::{confine_http_front, prepare_http_front};
pub use crate::profile::spawner::{SpawnerGrants, confine_spawner, own_interpreter};
pub use crate::profile::supervisor::confine_supervisor;
pub use crate::profile::worker::{
    Grants, PORTS_ARG_PREFIX, UNCONFINED_OK_ARG, WorkerGrants, WorkerReport, confine_worker, prepare_worker,
};
pub use crate::support::{ALLOW_UNCONFINED_VAR, Support, gate, opt_out_from_env, runtime_summary};
