//! The catalog worker's profile: it answers documentation tools from the
//! compiled-in catalog and needs nothing beyond [`super::BASE`].

use super::Allow;

/// The catalog worker: nothing beyond the base.
pub const CATALOG: &[Allow] = &[];
