//! The task-store worker's profile (not built yet).

use super::Allow;

/// The task store is not built yet; until it is, it gets the base only.
pub const TASKS: &[Allow] = &[];

/// Descriptors it keeps beyond 0–3: none.
pub const KEPT_FDS: &[i32] = &[];
