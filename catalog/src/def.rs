//! The two sources of the catalog (see `catalog/AUTHORING.md`):
//!
//! * `catalog/upstream/catalog.json`: SnowLuma's own catalog, byte for byte
//!   as upstream publishes it, never edited. Every field of every action is
//!   served exactly as it stands there.
//! * `catalog/overlay/<category>/<name>.json` ([`OverlayDef`]): what we
//!   author beside it — English texts in added fields, `returnsSchema`
//!   where upstream has none, `examples` for every action, the support
//!   level. An overlay never replaces an upstream field.

use serde::Deserialize;
use serde_json::{Map, Value};

/// One action's overlay.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayDef {
    /// The upstream action this overlay belongs to.
    pub name: String,
    pub support: Support,
    /// One English line, at most 120 characters, no trailing period.
    pub summary_en: String,
    /// English, 1–4 sentences.
    pub description_en: String,
    /// An English description of every upstream parameter, by name.
    pub params_en: Map<String, Value>,
    /// The upstream invariants as English prose.
    pub invariants_en: Vec<String>,
    /// English prose describing the successful `data`.
    pub returns_en: String,
    /// The schema of the successful OneBot `data`, only where upstream has
    /// no `returnsSchema` (upstream's wins, so ours would be dead data).
    #[serde(rename = "returnsSchema", default)]
    pub returns_schema: Option<Value>,
    pub examples: Vec<ExampleDef>,
}

impl OverlayDef {
    /// The empty overlay a draft catalog (`gen-catalog --draft`) gives an
    /// action nobody has authored yet.
    pub fn draft(name: &str) -> OverlayDef {
        OverlayDef {
            name: name.to_owned(),
            support: Support::Supported,
            summary_en: String::new(),
            description_en: String::new(),
            params_en: Map::new(),
            invariants_en: Vec::new(),
            returns_en: String::new(),
            returns_schema: None,
            examples: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    Supported,
    Unsupported,
    Placeholder,
}

impl Support {
    pub fn as_str(self) -> &'static str {
        match self {
            Support::Supported => "supported",
            Support::Unsupported => "unsupported",
            Support::Placeholder => "placeholder",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleDef {
    pub summary: String,
    pub params: Map<String, Value>,
    #[serde(default)]
    pub notes: Option<String>,
}

/// The fields an overlay adds to an upstream action, in the order they are
/// appended after upstream's own fields. Everything else in a generated
/// action is upstream's.
pub const OVERLAY_FIELDS: [&str; 8] = [
    "returnsSchema",
    "support",
    "summary_en",
    "description_en",
    "params_en",
    "invariants_en",
    "returns_en",
    "examples",
];
