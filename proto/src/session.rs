//! What passes between `serve-http`'s processes and the session trees it
//! starts, outside the MCP messages themselves: the hidden argument that
//! runs the front, the marker line a relayed session writes before a server
//! request, the variable that names a session's HTTP principal, and the
//! shared send-pacing state a session of one HTTP token is handed.

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

/// Set by the launcher for a session it starts: the number of the
/// descriptor (always [`PACING_FD`]) holding its token's shared send-pacing
/// state, one memfd per HTTP token id handed to every session tree of that
/// token. Honoured only together with [`PRINCIPAL_VAR`]; read once at
/// startup and scrubbed.
pub const PACING_FD_VAR: &str = "SNOWLUMA_MCP_INTERNAL_PACING_FD";

/// Where the launcher places the pacing state in a session tree (below
/// 1024, so that the spawner's close loop drops its inherited copy).
pub const PACING_FD: i32 = 9;

/// Per-target entries in the shared pacing state.
pub const PACING_SLOTS: usize = 1024;

/// The shared pacing state's fixed size: a 32-byte header (magic, the
/// bucket's thousandths of a send, its last refill in `CLOCK_MONOTONIC`
/// ms, a reserved word) and [`PACING_SLOTS`] entries of 24 bytes (target
/// kind, target id, last send in ms); every word a little-endian `u64`. The
/// supervisor's `pacing.rs` reads and writes it; the launcher only creates
/// it at this size.
pub const PACING_STATE_SIZE: usize = 32 + 24 * PACING_SLOTS;
