//! Messages between the supervisor and its workers.
//!
//! Every connection starts with a handshake: the supervisor sends
//! [`ToWorker::Hello`] naming the role it expects and its [`BUILD_ID`]; the
//! worker answers [`FromWorker::Ready`] or, when the build differs (a binary
//! replaced on disk under a running supervisor), [`FromWorker::Refused`] and
//! exits. After that, requests carry a supervisor-chosen `id` so that many can
//! be in flight at once; [`ToWorker::Cancel`] withdraws one. A worker answers
//! each request exactly once with [`FromWorker::Reply`] (none after a cancel
//! has been acted on), and may send [`FromWorker::Progress`] before it.
//!
//! Variants are only ever appended; the build id check makes mixed builds
//! refuse each other instead of misreading frames.

use serde::{Deserialize, Serialize};

use crate::outcome::ToolReply;

/// Bumped whenever a message's meaning changes.
pub const IPC_VERSION: u32 = 1;

/// Identity of this build's IPC vocabulary: crate version, IPC version and a
/// digest of the message definitions (computed by `build.rs`).
pub const BUILD_ID: &str = concat!(env!("CARGO_PKG_VERSION"), "/ipc1/", env!("SNOWLUMA_PROTO_DIGEST"));

/// The descriptor on which a worker finds its IPC socket.
pub const WORKER_IPC_FD: i32 = 3;

/// The hidden first argument that turns the binary into a worker.
pub const WORKER_ARG: &str = "__snowluma-worker";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Read-only documentation: catalog tools and catalog resources.
    Catalog,
    /// The only process that talks to SnowLuma and holds the token.
    Network,
    /// Opens files under the upload root and the download directory.
    Files,
    /// Holds the lease on the task directory.
    Tasks,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Catalog, Role::Network, Role::Files, Role::Tasks];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Catalog => "catalog",
            Role::Network => "network",
            Role::Files => "files",
            Role::Tasks => "tasks",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// JSON carried as text: postcard cannot encode `serde_json::Value`.
/// The receiver parses it as untrusted input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonText(pub String);

impl JsonText {
    /// Compact JSON text of `v`, never longer than the text it was parsed
    /// from: floats are written in the shorter of plain and exponent form
    /// (`1e15`, not serde_json's `1000000000000000.0`), so a client's input
    /// cannot grow past the frame limit on its way to a worker.
    pub fn from_value(v: &serde_json::Value) -> JsonText {
        let mut out = Vec::new();
        let mut ser = serde_json::Serializer::with_formatter(&mut out, ShortFloats);
        // Serializing a Value into a Vec cannot fail (no I/O, string keys).
        if serde::Serialize::serialize(v, &mut ser).is_err() {
            return JsonText(v.to_string());
        }
        // serde_json writes valid UTF-8.
        JsonText(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
    pub fn parse(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
    pub fn null() -> JsonText {
        JsonText("null".to_owned())
    }
}

/// serde_json's compact formatter, except that a float is written in the
/// shorter of ryu's plain form and its exponent form.
struct ShortFloats;

impl serde_json::ser::Formatter for ShortFloats {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, value: f64) -> std::io::Result<()> {
        let mut buf = ryu_like(value);
        if let Some(short) = exponent_form(&buf)
            && short.len() < buf.len()
        {
            buf = short;
        }
        w.write_all(buf.as_bytes())
    }
}

/// What serde_json writes for a finite f64 (non-finite values never occur
/// in a parsed `Value`).
fn ryu_like(value: f64) -> String {
    serde_json::Number::from_f64(value).map(|n| n.to_string()).unwrap_or_else(|| "null".to_owned())
}

/// `1000000000000000.0` → `1e15`, `0.00001` → `1e-5`, `123.5` → `1.235e2`:
/// the same value (the digits are unchanged), as an exponent.
fn exponent_form(plain: &str) -> Option<String> {
    if plain.contains(['e', 'E']) {
        return None;
    }
    let (sign, body) = match plain.strip_prefix('-') {
        Some(b) => ("-", b),
        None => ("", plain),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let digits: String = format!("{int}{frac}");
    let lead = digits.find(|c| c != '0')?;
    let significant = digits[lead..].trim_end_matches('0');
    // Position of the decimal point relative to the first significant digit.
    let exp = int.len() as i64 - lead as i64 - 1;
    let mantissa = match significant.len() {
        1 => significant.to_owned(),
        _ => format!("{}.{}", &significant[..1], &significant[1..]),
    };
    Some(format!("{sign}{mantissa}e{exp}"))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub build: String,
    pub role: Role,
}

/// Role-specific settings sent right after the handshake; secrets travel
/// only this way (never in the environment or on a command line), and only
/// to the role that needs them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerConfig {
    Files(FilesConfig),
    /// `denied`: canonical names the operator's policy refuses, flagged in
    /// documentation results (the gate itself is the supervisor's).
    Catalog {
        denied: Vec<String>,
    },
    Network(NetworkConfig),
    /// The task-store worker: the digest of the effective mode, endpoint
    /// and token (computed by the supervisor at startup; never the token),
    /// and the principal this session's tasks belong to
    /// ([`crate::task::owner_of_http_token`]; `None` for a stdio session):
    /// the worker shows a session only its own principal's records.
    Tasks {
        config_digest: [u8; 32],
        owner: Option<String>,
    },
}

/// The file-transfer worker's settings; its directories arrive as
/// descriptors, at the numbers its role's table gives them
/// (`snowluma_sandbox::role::FILES`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FilesConfig {
    pub upload_enabled: bool,
    pub max_file_bytes: u64,
    /// The upload root's canonical path, then its path as configured: an
    /// absolute symlink target beneath either stays beneath the root (the
    /// worker opens nothing by these paths; it compares them).
    pub upload_root_paths: Vec<String>,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct NetworkConfig {
    pub endpoint: String,
    /// The endpoint host's addresses, resolved by the supervisor at startup
    /// (the confined executor cannot read `/etc` or send DNS queries).
    pub resolved: Vec<std::net::SocketAddr>,
    pub token: Option<String>,
    pub timeout_ms: u64,
    /// `SNOWLUMA_MCP_MAX_STREAM_BYTES`: the largest file a download may
    /// declare or deliver (the download quota is twice this).
    pub max_stream_bytes: u64,
    /// SnowLuma's event WebSocket (`SNOWLUMA_MCP_EVENTS_URL`), only when
    /// configured; it uses its own token when one is set, else `token`.
    pub events: Option<EventsTarget>,
}

/// Where the event WebSocket is: the URL exactly as configured and its
/// host's addresses, resolved by the supervisor at startup, and its own
/// access token (`SNOWLUMA_MCP_EVENTS_TOKEN`; SnowLuma generates separate
/// tokens for its HTTP and WebSocket servers), if one is set.
#[derive(Clone, Serialize, Deserialize)]
pub struct EventsTarget {
    pub url: String,
    pub resolved: Vec<std::net::SocketAddr>,
    pub token: Option<String>,
}

impl std::fmt::Debug for EventsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URL or the token.
        f.debug_struct("EventsTarget").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for NetworkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the endpoint or the token.
        f.debug_struct("NetworkConfig").field("timeout_ms", &self.timeout_ms).finish_non_exhaustive()
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    Hello(Hello),
    Configure(WorkerConfig),
    Request { id: u64, request: Request },
    Cancel { id: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    Ready {
        build: String,
        pid: u32,
    },
    Refused {
        reason: String,
    },
    Configured,
    Reply {
        id: u64,
        reply: Reply,
    },
    Progress {
        id: u64,
        progress: Progress,
    },
    /// Something on the event connection opened by [`Request::Events`]
    /// with this id; the request's reply says why the connection ended.
    Event {
        id: u64,
        event: EventMsg,
    },
}

/// What the network executor reports on an event connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum EventMsg {
    /// The WebSocket handshake succeeded.
    Connected,
    /// One OneBot event (not a meta event), as received: a JSON object whose
    /// `self_id` is the connection's account. The receiver parses it again
    /// as untrusted input.
    Event(JsonText),
}

/// W3C trace context of one tool call, already validated by the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// A documentation tool (`list_actions`, `get_action`, ...) with its raw
    /// arguments; the catalog worker validates them.
    CatalogTool {
        tool: String,
        args: JsonText,
    },
    /// Read a `snowluma://onebot/actions...` resource.
    CatalogResource {
        uri: String,
    },
    /// Execute one OneBot action (network executor). The supervisor has
    /// already applied every gate.
    Execute(ExecRequest),
    /// File-transfer worker operations. A reply that hands over a file
    /// sends its descriptor on the fd channel tagged `fd_tag` first.
    Files(FilesRequest),
    /// Open SnowLuma's event WebSocket (network executor) and report each
    /// event as [`FromWorker::Event`] until the connection ends (answered by
    /// [`Reply::EventsClosed`]) or the request is cancelled (the socket is
    /// closed). Every event must belong to `self_id`; nothing is ever sent
    /// on the socket but the protocol's own control frames.
    Events {
        self_id: i64,
    },
    Tasks(TasksRequest),
}

/// Requests to the task-store worker. Records cross as JSON text and are
/// validated by the receiver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TasksRequest {
    /// Write a new record (refused if the id exists).
    Create {
        record: JsonText,
    },
    /// Replace a record.
    Update {
        record: JsonText,
    },
    Get {
        task_id: String,
    },
    /// Metadata only, ordered by creation.
    List {
        cursor: Option<String>,
        limit: u32,
    },
    /// The restart pass: fail every unfinished record ("unknown remote
    /// outcome"). Sent once per supervisor, before any other request.
    Recover,
    /// Idempotency keys ([`crate::keys`]): the live record of `key_id` at
    /// `now_ms`, if any (`Record`, else `NotFound`).
    KeyGet {
        key_id: String,
        now_ms: u64,
    },
    /// Claim a key: write `record` (pending) unless a live record of its
    /// id exists, which is answered instead (`Record`); an expired one is
    /// replaced. `Written` when claimed.
    KeyBegin {
        record: JsonText,
        now_ms: u64,
    },
    /// Replace this principal's pending record of the same key with its
    /// outcome (`done`).
    KeyFinish {
        record: JsonText,
    },
    /// Remove every expired key record (`Swept`).
    KeySweep {
        now_ms: u64,
    },
}

/// Replies of the task-store worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TasksReply {
    Written,
    Recovered {
        failed: u64,
    },
    Record(JsonText),
    Page {
        tasks: JsonText,
        next_cursor: Option<String>,
    },
    NotFound,
    /// Expired key records removed.
    Swept {
        removed: u64,
    },
    /// The store cannot serve (lease held elsewhere, another configuration,
    /// corruption, permissions, a failed write): the reason, for the client.
    Refused {
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The action name exactly as the caller wrote it (an alias stays an alias).
    pub action: String,
    pub params: JsonText,
    pub stream: bool,
    /// Whether the action may change state remotely; decides how a lost
    /// reply is reported (a write's outcome becomes unknown).
    pub write: bool,
    pub trace: TraceContext,
    /// A file transfer; its descriptor arrives on the fd channel tagged
    /// with the transfer's `fd_tag` before this request.
    pub transfer: Option<Transfer>,
    /// Send [`FromWorker::Progress`] while streaming.
    pub progress: bool,
    /// The action moves a file the server handles itself (a catalog
    /// property; an alias or `_async` form has its canonical action's).
    pub file_action: Option<FileAction>,
}

/// Which kind of file-moving action a request is (see [`ExecRequest::file_action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileAction {
    Upload,
    Download,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Transfer {
    /// Write the downloaded bytes into the received (empty) file.
    Download { fd_tag: u64, limit_bytes: u64 },
    /// Upload the received file in chunks (`upload_file_stream`).
    Upload { fd_tag: u64, size: u64, filename: String, chunk_bytes: u64 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FilesRequest {
    /// Open an upload's input file: `rel_path` is relative to the upload
    /// root, lexically normalized (no `..`, `.` or empty components);
    /// symlinks on it are followed while they stay beneath the root.
    OpenUpload { rel_path: String, fd_tag: u64 },
    /// Create an empty private `.part` file in the download directory.
    CreateDownload { fd_tag: u64 },
    /// Give a finished `.part` file its final name.
    CommitDownload { token: String, file_name: String, size: u64 },
    /// Remove an unfinished `.part` file.
    AbortDownload { token: String },
    /// Bytes currently used by regular files in the download directory
    /// (our own `.part` files excepted: in-flight ones are reserved
    /// separately, stale ones are swept).
    DownloadUsage,
    /// Remove `.part` files of our naming scheme that no process is writing
    /// (left by a killed session). Once per session, before its first download.
    SweepStaleParts,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FilesReply {
    Opened { size: u64, name: String },
    Created { token: String },
    Committed { file_name: String },
    Aborted,
    Usage { bytes: u64 },
    Swept { removed: u64 },
    Refused { reason: String },
    UploadRefused(UploadRefusal),
}

/// Why the file-transfer worker did not open an upload's input file
/// ([`FilesReply::UploadRefused`]); the supervisor turns each into the Node
/// server's text. Paths are relative
/// to the upload root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UploadRefusal {
    /// Automatic upload is not enabled in this worker.
    NotEnabled,
    /// Resolving failed at `rel_path` (the path resolved so far) with
    /// `errno`; `syscall` is the call Node names in its message (`lstat`,
    /// `stat`, `readlink`).
    Lookup { errno: i32, syscall: String, rel_path: String },
    /// It resolves to the upload root itself or to a place outside it.
    Outside,
    /// Opening the resolved file failed with `errno`.
    Open { errno: i32, rel_path: String },
    /// A directory, FIFO, socket or device.
    NotRegular,
    /// A regular file with more than one hard link (one could name a file
    /// outside the root).
    HardLinks,
    /// Larger than the per-file cap.
    TooLarge { limit: u64 },
    /// `openat2` fails with ENOSYS (an old kernel, or a seccomp filter
    /// around the server, such as systemd's `RestrictSUIDSGID=`).
    NoOpenat2,
    /// Anything else (e.g. the descriptor could not be passed on).
    Failed(String),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Tool(ToolReply),
    Resource(ResourceReply),
    Files(FilesReply),
    /// The worker could not serve the request at all.
    Error(WorkerError),
    /// The event connection of a [`Request::Events`] ended; `reason` says
    /// why (no URL, token or event content in it).
    EventsClosed {
        reason: String,
    },
    Tasks(TasksReply),
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceReply {
    pub uri: String,
    pub mime_type: String,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum WorkerError {
    #[error("resource not found: {0}")]
    ResourceNotFound(String),
    #[error("request not supported by this worker")]
    Unsupported,
    #[error("{0}")]
    Internal(String),
    /// The worker's reply does not fit in one frame; the request's work may
    /// have been done (an executed write's outcome is then unknown).
    #[error("the worker's reply ({bytes} bytes) exceeds the {limit}-byte IPC limit")]
    ReplyTooLarge { bytes: usize, limit: usize },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

#[cfg(test)]
mod json_text_tests {
    use super::*;
    use serde_json::{Value, json};

    /// Floats round-trip exactly and never come out longer than the usual
    /// way of writing them; everything else is serde_json's compact form.
    #[test]
    fn short_floats_round_trip() {
        for text in [
            "1e15",
            "1E+15",
            "-1e15",
            "1e16",
            "1e300",
            "5e-324",
            "0.1",
            "123.5",
            "1.5",
            "-0.00001",
            "1e21",
            "0.0",
            "1.7976931348623157e308",
            "100.25",
            "12345678.9",
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            let out = JsonText::from_value(&v).0;
            let back: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(back.as_f64(), v.as_f64(), "{text} -> {out}");
            assert!(out.len() <= serde_json::to_string(&v).unwrap().len(), "{text} -> {out}");
        }
        assert_eq!(JsonText::from_value(&json!(1e15)).0, "1e15");
        assert_eq!(JsonText::from_value(&json!(1.5)).0, "1.5");
        let v = json!({"a": [1, -2, 18446744073709551615u64, "x\u{85}", null, true, 0.5]});
        assert_eq!(JsonText::from_value(&v).0, serde_json::to_string(&v).unwrap());
    }

    /// 1.5 million copies of `1e15` stay about as long as the client sent them.
    #[test]
    fn a_float_array_does_not_grow() {
        let input = format!("[{}]", vec!["1e15"; 1000].join(","));
        let v: Value = serde_json::from_str(&input).unwrap();
        assert_eq!(JsonText::from_value(&v).0, input);
    }
}
