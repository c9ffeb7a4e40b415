//! `snowluma-mcp serve-http`: MCP over Streamable HTTP, in three kinds of
//! process (see ARCHITECTURE.md "Remote access"). This crate holds the
//! first two; it depends on neither the server, the audit log nor the
//! catalog, so the front cannot link them.
//!
//! * the **launcher** (`launcher.rs`, the process the operator starts): it
//!   validates the configuration, reads the access token file and the TLS
//!   files, binds the listener, starts the front, and then only starts,
//!   reaps and kills session trees on the front's request. It never parses
//!   HTTP.
//! * the **HTTP front** (`front/`, `relay.rs`): this binary re-executed
//!   with an empty environment and [`FRONT_ARG`], confined (no files, no
//!   new connections, no exec). It accepts connections, terminates TLS,
//!   checks the token, `Host`, `Origin` and limits, and relays JSON-RPC
//!   between HTTP and each session's stdio socket.
//! * one **session tree** per legacy MCP session or modern connection: the
//!   ordinary stdio server (supervisor, spawner, workers) with a socket as
//!   stdin and stdout, exactly like a systemd `Accept=yes` connection.

mod control;
mod door;
pub mod front;
pub mod launcher;
mod message;
pub mod options;
mod relay;
mod stall;

pub use snowluma_proto::session::{FRONT_ARG, PRINCIPAL_VAR, RELATED_METHOD};

#[cfg(test)]
mod numbers {
    use snowluma_proto::architecture::{check, duration, size};

    /// ARCHITECTURE.md's figures for serve-http are the code's.
    #[test]
    fn the_architecture_numbers_of_serve_http_are_the_code_s() {
        check(
            include_str!("../../ARCHITECTURE.md"),
            &[
                ("front: connections", super::door::MAX_CONNECTIONS.to_string()),
                ("front: connections per client host", super::door::MAX_PER_PEER.to_string()),
                ("front: pending connections per client host", super::door::MAX_PENDING_PER_PEER.to_string()),
                ("front: pending connection lifetime", duration(super::door::PENDING_LIFETIME)),
                ("front: client write stall", duration(super::stall::WRITE_STALL)),
                ("front: request body", size(super::launcher::MAX_BODY as u64)),
                ("front: request bodies in all", size(super::front::REQUEST_BUDGET as u64)),
                ("front: request bodies per token", size(super::front::TOKEN_REQUEST_SHARE as u64)),
                ("front: session lines in all", size(super::relay::RESPONSE_BUDGET_KIB as u64 * 1024)),
                ("launcher: revoked token's tree killed after", duration(super::launcher::GRACE)),
                ("launcher: ended tree killed after", duration(super::launcher::ENDED_LIMIT)),
            ],
        );
    }
}
