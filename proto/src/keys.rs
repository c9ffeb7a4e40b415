//! Idempotency records (`execution.idempotency_key`): the shape the
//! task-store worker persists beside the task records and the supervisor
//! reads, shared by both.
//!
//! A record is written `pending` (durably, before the action is sent) and
//! replaced by `done` with the reply once the call has finished. A record
//! still `pending` when it is read by a later run means the server stopped
//! while the call was in flight: its outcome is unknown, and it is replayed
//! as unknown, never executed again.

use serde::{Deserialize, Serialize};

use crate::outcome::ToolReply;

/// The version of [`KeyRecord`] this build writes and reads.
pub const KEY_RECORD_VERSION: u32 = 1;
/// How long a key is kept: 24 hours.
pub const KEY_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// Where a keyed call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// Written before the action was sent; no outcome recorded (yet).
    Pending,
    /// The call finished; `reply` is its outcome.
    Done,
}

/// One persisted idempotency key. Neither the key itself nor the params are
/// stored: `key_id` is a digest of the principal and the key, `args_digest`
/// a digest of the canonical action and params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub version: u32,
    pub key_id: String,
    /// The principal the key belongs to (as [`crate::task::TaskRecord::owner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub args_digest: String,
    /// The canonical action (shown in a conflict; not secret).
    pub action: String,
    /// Milliseconds since the Unix epoch (the supervisor's clock).
    pub created_ms: u64,
    pub state: KeyState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<ToolReply>,
}

/// Key ids: 64 lowercase hex digits (a SHA-256).
pub fn is_key_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl KeyRecord {
    /// Whether the key has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.created_ms.saturating_add(KEY_TTL_MS) <= now_ms
    }
}
