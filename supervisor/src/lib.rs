//! The supervisor: the process that speaks MCP on stdio and routes each
//! call to its confined workers (see ARCHITECTURE.md). `main.rs` chooses
//! the process role; this crate is the supervisor's, and `doctor` (which
//! drives the other roles' escape probes) and the `audit` command run from
//! it too.

mod audit;
mod background;
mod completion;
mod completion_flow;
mod dirs;
pub mod doctor;
mod events;
mod execution;
mod gates;
mod pacing;
mod policy;
mod preview;
mod progress;
mod replies;
mod resources;
mod runtime;
mod scope;
mod server;
mod session;
mod startup;
mod state;
mod stdio;
mod tasks;
mod tools;
mod trace;
mod transfers;
mod transport;
mod workers;

pub use audit::cli::run as audit_command;
pub use startup::serve_stdio;
