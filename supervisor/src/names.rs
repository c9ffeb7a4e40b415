//! How callers and the operator's settings name actions: a call names one
//! exactly (name or alias, as Node); the operator's lists
//! (`SNOWLUMA_MCP_ALLOW_ACTIONS`, `DENY_ACTIONS`, `CONFIRM_ACTIONS`) also
//! accept an `_async` form. Shared by the policy and the confirmation list.

use snowluma_catalog::{Action, Catalog};

#[derive(Debug, thiserror::Error)]
#[error("{var} names an action that is not in the catalog: {name:?}")]
pub struct PolicyError {
    pub var: &'static str,
    pub name: String,
}

/// Resolve a caller's action name: the exact name or an alias, as Node.
pub fn resolve<'c>(catalog: &'c Catalog, name: &str) -> Option<&'c Action> {
    catalog.get(name)
}

/// Resolve a name in the operator's lists: [`resolve`], else the same with
/// an `_async` suffix removed.
pub(crate) fn resolve_listed<'c>(catalog: &'c Catalog, name: &str) -> Option<&'c Action> {
    resolve(catalog, name).or_else(|| name.strip_suffix("_async").and_then(|base| catalog.get(base)))
}
