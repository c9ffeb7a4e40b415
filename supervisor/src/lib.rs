//! The supervisor: the process that speaks MCP on stdio and routes each
//! call to its confined workers (see ARCHITECTURE.md). `main.rs` chooses
//! the process role; this crate is the supervisor's, and `doctor` (which
//! drives the other roles' escape probes) and the `audit` command run from
//! it too.

mod args;
mod audit;
mod background;
mod calllog;
mod completion;
mod completion_flow;
mod confirm;
mod dirs;
pub mod doctor;
mod events;
mod execution;
mod gates;
mod idempotency;
mod names;
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

#[cfg(test)]
mod numbers {
    use snowluma_proto::architecture::{check, duration};

    /// ARCHITECTURE.md's figures for the supervisor are the code's (the
    /// transport's are checked in `transport/mod.rs`).
    #[test]
    fn the_architecture_numbers_of_the_supervisor_are_the_code_s() {
        check(
            include_str!("../../ARCHITECTURE.md"),
            &[
                ("worker restart backoff, first", duration(crate::workers::BACKOFF_MIN)),
                ("worker restart backoff, longest", duration(crate::workers::BACKOFF_MAX)),
                ("worker healthy after", duration(crate::workers::HEALTHY_AFTER)),
                ("continuations pending", crate::completion::MAX_PENDING.to_string()),
                ("continuation lifetime", duration(crate::completion::TTL)),
                ("event resources", crate::events::MAX_RESOURCES.to_string()),
                ("events kept per resource", crate::events::MAX_EVENTS.to_string()),
                ("event bytes kept per resource", snowluma_proto::architecture::size(crate::events::MAX_BYTES as u64)),
                ("background tasks running", crate::tasks::MAX_RUNNING.to_string()),
            ],
        );
    }
}
