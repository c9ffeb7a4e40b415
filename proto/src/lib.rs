//! Shared vocabulary of the snowluma-mcp processes.
//!
//! * [`architecture`]: ARCHITECTURE.md's Numbers table, read back for the tests.
//! * [`bytes`]: hex and kernel randomness, one copy for every process.
//! * [`eager`]: a task started in its caller's turn (its first step runs at once).
//! * [`fdpass`]: descriptor passing (the one SCM_RIGHTS codec).
//! * [`front`]: the `serve-http` launcher ↔ HTTP front control messages.
//! * [`json`]: reading JSON text without building it (`present`).
//! * [`frame`]: length-prefixed `postcard` frames on the supervisor/worker socket.
//! * [`msg`]: the typed messages that travel in those frames, and the handshake.
//! * [`outcome`]: the result/diagnostic envelope every tool returns.
//! * [`outbox`]: frames to one socket from many tasks, written by their sender when nothing is queued.
//! * [`sockio`]: the socket halves the frames travel on (woken for input only).
//! * [`spawn`]: the spawner's protocol (start and stop workers), on [`fdpass`]'s codec.
//!
//! JSON values never travel as `serde_json::Value` (postcard is not
//! self-describing); they travel as [`msg::JsonText`], validated JSON text.

pub mod alloc;
pub mod architecture;
pub mod bytes;
pub mod eager;
pub mod fdpass;
pub mod frame;
pub mod front;
pub mod json;
pub mod keys;
pub mod msg;
pub mod outbox;
pub mod outcome;
pub mod rt;
pub mod session;
pub mod sockio;
pub mod spawn;
pub mod task;
pub mod text;
pub mod texts;

pub use frame::{FrameError, MAX_FRAME_BYTES, read_buffered_frame, read_frame, write_frame};
pub use msg::*;
pub use outcome::{Diagnostics, FailureKind, Outcome, ToolReply};
