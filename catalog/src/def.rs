//! The authored definition format (`catalog/defs/<category>/<name>.json`);
//! see `catalog/AUTHORING.md`.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionDef {
    pub name: String,
    pub aliases: Vec<String>,
    pub category: String,
    pub read_only: bool,
    pub stream: bool,
    pub support: Support,
    pub summary: String,
    pub summary_zh: String,
    pub description: String,
    pub params: Vec<ParamDef>,
    pub invariants: Vec<String>,
    pub returns: String,
    pub returns_schema: Value,
    pub examples: Vec<ExampleDef>,
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
pub struct ParamDef {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub required: bool,
    #[serde(default)]
    pub default: Option<Value>,
    #[serde(default)]
    pub values: Option<Vec<Value>>,
    #[serde(default)]
    pub role: Option<String>,
    pub description: String,
    pub schema: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleDef {
    pub summary: String,
    pub params: serde_json::Map<String, Value>,
    #[serde(default)]
    pub notes: Option<String>,
}
