//! `snowluma-mcp serve-http`: MCP over Streamable HTTP, in three kinds of
//! process (see ARCHITECTURE.md "Remote access"):
//!
//! * the **launcher** (`launcher.rs`, the process the operator starts): it
//!   validates the configuration, reads the access token file and the TLS
//!   files, binds the listener, starts the front, and then only starts,
//!   reaps and kills session trees on the front's request. It never parses
//!   HTTP.
//! * the **HTTP front** (`front.rs`, `relay.rs`): this binary re-executed
//!   with an empty environment and [`FRONT_ARG`], confined (no files, no
//!   new connections, no exec). It accepts connections, terminates TLS,
//!   checks the token, `Host`, `Origin` and limits, and relays JSON-RPC
//!   between HTTP and each session's stdio socket.
//! * one **session tree** per legacy MCP session or modern connection: the
//!   ordinary stdio server (supervisor, spawner, workers) with a socket as
//!   stdin and stdout, exactly like a systemd `Accept=yes` connection.

pub mod control;
mod door;
pub mod front;
pub mod launcher;
mod message;
pub mod options;
mod relay;
mod stall;

use crate::audit::Principal;

/// The hidden first argument that runs the HTTP front.
pub const FRONT_ARG: &str = "__snowluma-http-front";

/// A line a session tree writes just before a server request it makes
/// within a client's request (`params`: the server request's `id` and the
/// client request's, `relatedRequestId`), so that the front sends the server
/// request on that request's stream (rmcp knows the association but it
/// never reaches the wire). Written only by sessions the launcher started;
/// the front consumes it.
pub const RELATED_METHOD: &str = "notifications/io.snowluma-mcp/related";

/// Set by the launcher for a session it starts: `<token id> <peer>`. Read
/// once at startup and scrubbed; only the audit log uses it.
pub const PRINCIPAL_VAR: &str = "SNOWLUMA_MCP_INTERNAL_HTTP_PRINCIPAL";

/// The HTTP principal the launcher named for this session, if any (the
/// variable is scrubbed from the environment block either way).
pub fn take_session_principal() -> Option<Principal> {
    let raw = std::env::var(PRINCIPAL_VAR).ok()?;
    crate::secret::scrub_env(PRINCIPAL_VAR);
    let (token_id, peer) = raw.split_once(' ')?;
    if token_id.is_empty() {
        return None;
    }
    Some(Principal::Http { token_id: token_id.to_owned(), peer: peer.to_owned() })
}
