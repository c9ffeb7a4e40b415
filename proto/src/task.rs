//! Task records (the tasks extension, SEP-2663): the shape the task-store
//! worker persists and the supervisor reads, shared by both.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bytes::{hex, random_bytes};

/// The message a task that was running when the server stopped ends with.
pub const UNKNOWN_OUTCOME: &str = "unknown remote outcome: the server stopped while this task was running; \
     it was not replayed and the remote side may or may not have completed it";

/// A task's state (SEP-2663).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// One persisted task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TaskRecord {
    pub version: u32,
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
    /// The catalog action the task runs.
    pub action: String,
    /// The principal the task belongs to ([`owner_of_http_token`]); absent
    /// for tasks of stdio sessions. Only that principal sees the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The last progress reported (bytes or frames), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<serde_json::Value>,
    /// The saved tool result of a completed task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The JSON-RPC error object of a failed task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<serde_json::Value>,
}

pub const RECORD_VERSION: u32 = 1;

/// The owner of a task created in a `serve-http` session: the id of the
/// access token (never the token) that authorized it. The prefix keeps it
/// apart from any other kind of principal a later release may record.
pub fn owner_of_http_token(token_id: &str) -> String {
    format!("http:{token_id}")
}

/// Task ids: 32 lowercase hex digits.
pub fn is_task_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new random task id.
pub fn new_task_id() -> String {
    hex(&random_bytes::<16>())
}

/// The current time in RFC 3339 (UTC, milliseconds).
pub fn now_rfc3339() -> String {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    rfc3339(since.as_secs(), since.subsec_millis())
}

pub fn rfc3339(secs: u64, millis: u32) -> String {
    format!("{}.{millis:03}Z", crate::text::utc_datetime(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_764_561_600, 5), "2025-12-01T04:00:00.005Z");
        assert_eq!(rfc3339(951_782_400, 999), "2000-02-29T00:00:00.999Z");
    }

    #[test]
    fn ids() {
        assert!(is_task_id(&new_task_id()));
        assert!(!is_task_id("../etc"));
    }
}
