//! What passes between `serve-http`'s processes and the session trees it
//! starts, outside the MCP messages themselves: the hidden argument that
//! runs the front, the marker line a relayed session writes before a server
//! request, and the variable that names a session's HTTP principal.

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
