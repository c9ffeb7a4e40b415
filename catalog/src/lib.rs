//! The bundled SnowLuma action catalog.
//!
//! * `upstream/catalog.json` is SnowLuma's own catalog, byte for byte, and
//!   `overlay/` what we author beside it ([`def`]);
//! * [`generate`] validates both and renders `generated/catalog.json`:
//!   every upstream field as upstream has it, the overlay's fields added;
//! * [`Catalog::bundled`] is that file, compiled into the binary (nothing is
//!   read from disk at run time);
//! * [`tools`] answers the documentation tools; [`search`] ranks matches.
//!
//! The catalog is a bundled snapshot, not a claim about what the connected
//! server supports.

pub mod args;
pub mod def;
pub mod generate;
pub mod safety;
pub mod schema;
pub mod search;
pub mod tools;
pub mod transfers;

pub use transfers::FileTransfer;

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;

/// The generated catalog, exactly as committed.
pub const CATALOG_JSON: &str = include_str!("../generated/catalog.json");

/// URI of the whole-catalog resource.
pub const CATALOG_URI: &str = "snowluma://onebot/actions";
/// URI template of one action's resource.
pub const ACTION_URI_TEMPLATE: &str = "snowluma://onebot/actions/{name}";

/// A client-supplied string as it may be echoed in an error message: at
/// most [`ECHO_CHARS`] characters, quoted, with the original length when
/// cut. Echoing a whole hostile name (whose escapes can be several times
/// longer than the input) could make a reply too large to deliver.
pub fn echo(s: &str) -> String {
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(ECHO_CHARS).collect();
    if chars.next().is_none() { format!("{head:?}") } else { format!("{head:?}… ({} characters)", s.chars().count()) }
}

/// See [`echo`].
pub const ECHO_CHARS: usize = 64;

/// Most characters of a client-supplied name that Node-worded error texts
/// echo ([`json_echo`], [`plain_echo`]): every real name fits; a hostile
/// megabyte-long one is cut, so that the error stays small.
pub const NAME_ECHO_CHARS: usize = 256;

fn cut(s: &str) -> (String, Option<usize>) {
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(NAME_ECHO_CHARS).collect();
    if chars.next().is_none() { (head, None) } else { (head, Some(s.chars().count())) }
}

/// A name as Node's `JSON.stringify(name)` shows it (`{name_json}`,
/// `{action_json}` in Node's texts), cut after [`NAME_ECHO_CHARS`]
/// characters with the original length.
pub fn json_echo(s: &str) -> String {
    let (head, total) = cut(s);
    let quoted = serde_json::to_string(&head).unwrap_or_else(|_| format!("{head:?}"));
    match total {
        None => quoted,
        Some(n) => format!("{quoted}…（共 {n} 个字符）"),
    }
}

/// A name as Node's texts show it unquoted (`{action}`, `{tool}`), cut
/// likewise.
pub fn plain_echo(s: &str) -> String {
    match cut(s) {
        (head, None) => head,
        (head, Some(n)) => format!("{head}…（共 {n} 个字符）"),
    }
}

/// At most `max` characters of an error message built from client input
/// (serde's messages quote the offending value).
pub fn clip(message: String, max: usize) -> String {
    if message.chars().count() <= max {
        return message;
    }
    let head: String = message.chars().take(max).collect();
    format!("{head}… (message cut)")
}

#[derive(Debug)]
pub struct Action {
    pub name: String,
    pub aliases: Vec<String>,
    pub category: String,
    /// Upstream's (Chinese) one-line summary; 12 upstream actions have none.
    pub summary: Option<String>,
    /// Our English summary (overlay).
    pub summary_en: String,
    pub read_only: bool,
    /// Upstream marks Stream API actions with `"stream": true` (absent: false).
    pub stream: bool,
    /// A file the server moves itself (see [`transfers`]).
    pub transfer: Option<FileTransfer>,
    pub support: String,
    /// Names of the top-level required parameters.
    pub required: Vec<String>,
    /// The complete contract, as `get_action` returns it: the upstream entry
    /// followed by the overlay's fields.
    pub doc: Value,
    /// Lower-cased texts, computed once for search ([`search::SearchText`]).
    pub search_text: search::SearchText,
}

impl Action {
    /// The compact form used by list and search results: Node's entry
    /// (`name, category, summary?, aliases, readOnly, stream`, in that
    /// order), then our English summary.
    pub fn compact(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("name".into(), Value::String(self.name.clone()));
        m.insert("category".into(), Value::String(self.category.clone()));
        if let Some(s) = &self.summary {
            m.insert("summary".into(), Value::String(s.clone()));
        }
        m.insert("aliases".into(), serde_json::json!(self.aliases));
        m.insert("readOnly".into(), Value::Bool(self.read_only));
        m.insert("stream".into(), Value::Bool(self.stream));
        m.insert("summary_en".into(), Value::String(self.summary_en.clone()));
        Value::Object(m)
    }

    pub fn input_schema(&self) -> &Value {
        &self.doc["inputSchema"]
    }
}

#[derive(Debug)]
pub struct Catalog {
    pub version: String,
    pub categories: Vec<(String, usize)>,
    pub actions: Vec<Action>,
    index: HashMap<String, usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog JSON is invalid: {0}")]
    Json(#[from] serde_json::Error),
    #[error("catalog JSON is malformed: {0}")]
    Shape(String),
}

impl Catalog {
    /// The catalog compiled into this binary.
    pub fn bundled() -> &'static Catalog {
        static CATALOG: OnceLock<Catalog> = OnceLock::new();
        CATALOG.get_or_init(|| {
            // proven: generated/catalog.json is produced by gen-catalog from validated
            // definitions, and the `bundled_catalog_parses` test parses this exact text.
            #[allow(clippy::expect_used)]
            Catalog::parse(CATALOG_JSON).expect("bundled catalog is valid (checked by tests)")
        })
    }

    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let doc: Value = serde_json::from_str(text)?;
        let shape = |m: &str| CatalogError::Shape(m.to_owned());
        let version = doc["version"].as_str().ok_or_else(|| shape("version"))?.to_owned();
        let categories = doc["categories"]
            .as_array()
            .ok_or_else(|| shape("categories"))?
            .iter()
            .map(|c| {
                Ok((
                    c["category"].as_str().ok_or_else(|| shape("category"))?.to_owned(),
                    c["count"].as_u64().ok_or_else(|| shape("count"))? as usize,
                ))
            })
            .collect::<Result<Vec<_>, CatalogError>>()?;
        let mut actions = Vec::new();
        let mut index = HashMap::new();
        for a in doc["actions"].as_array().ok_or_else(|| shape("actions"))? {
            let s = |k: &str| -> Result<String, CatalogError> { Ok(a[k].as_str().ok_or_else(|| shape(k))?.to_owned()) };
            let strings = |k: &str| -> Result<Vec<String>, CatalogError> {
                a[k].as_array()
                    .ok_or_else(|| shape(k))?
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| shape(k)))
                    .collect()
            };
            let required = match a["inputSchema"].get("required") {
                Some(Value::Array(r)) => r.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
                _ => Vec::new(),
            };
            let (name, aliases) = (s("name")?, strings("aliases")?);
            let summary = match a.get("summary") {
                None => None,
                Some(v) => Some(v.as_str().ok_or_else(|| shape("summary"))?.to_owned()),
            };
            let summary_en = s("summary_en")?;
            let transfer = transfers::of(&name);
            let action = Action {
                search_text: search::SearchText::new(&name, &aliases, summary.as_deref(), &summary_en),
                name,
                aliases,
                category: s("category")?,
                summary,
                summary_en,
                read_only: a["readOnly"].as_bool().ok_or_else(|| shape("readOnly"))?,
                stream: match a.get("stream") {
                    None => false,
                    Some(v) => v.as_bool().ok_or_else(|| shape("stream"))?,
                },
                transfer,
                support: s("support")?,
                required,
                doc: a.clone(),
            };
            let i = actions.len();
            for n in std::iter::once(&action.name).chain(&action.aliases) {
                if index.insert(n.clone(), i).is_some() {
                    return Err(CatalogError::Shape(format!("duplicate name {n}")));
                }
            }
            actions.push(action);
        }
        Ok(Catalog { version, categories, actions, index })
    }

    /// Look up a canonical name or an alias (exact, case-sensitive: OneBot
    /// action names are).
    pub fn get(&self, name: &str) -> Option<&Action> {
        self.index.get(name).map(|&i| &self.actions[i])
    }

    /// The whole-catalog resource text.
    pub fn resource_text(&self) -> &'static str {
        CATALOG_JSON
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_and_clip_are_bounded() {
        assert_eq!(echo("get_status"), "\"get_status\"");
        let long = "\u{85}".repeat(100_000);
        let e = echo(&long);
        assert!(e.len() < ECHO_CHARS * 8 + 40, "{}", e.len());
        assert!(e.ends_with("(100000 characters)"));
        assert_eq!(clip("short".into(), 10), "short");
        assert!(clip("x".repeat(10_000), 100).len() < 130);
    }

    #[test]
    fn bundled_catalog_parses() {
        let c = Catalog::parse(CATALOG_JSON).unwrap();
        assert_eq!(c.actions.len(), 193);
        assert_eq!(c.categories.len(), 12);
        let aliases: usize = c.actions.iter().map(|a| a.aliases.len()).sum();
        assert_eq!(aliases, 6);
        assert_eq!(c.get("nc_get_rkey").unwrap().name, "get_rkey");
        assert_eq!(c.get(".ocr_image").unwrap().name, "ocr_image");
    }

    #[test]
    fn generated_file_is_fresh() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let fresh = generate::generate(root, true).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            fresh == CATALOG_JSON,
            "catalog/generated/catalog.json is stale: run `cargo run -p snowluma-catalog --bin gen-catalog`"
        );
    }

    /// The bundled catalog without the overlay's fields is the upstream
    /// file, byte for byte: every upstream field of every action survives,
    /// in upstream's key order, and nothing upstream has is replaced.
    #[test]
    fn every_upstream_field_survives_byte_for_byte() {
        let upstream = include_str!("../upstream/catalog.json");
        let generated: Value = serde_json::from_str(CATALOG_JSON).unwrap();
        let up: Value = serde_json::from_str(upstream).unwrap();
        let mut actions = Vec::new();
        for (g, u) in generated["actions"].as_array().unwrap().iter().zip(up["actions"].as_array().unwrap()) {
            let mut g = g.as_object().unwrap().clone();
            for field in def::OVERLAY_FIELDS {
                if u.get(field).is_none() {
                    assert!(g.shift_remove(field).is_some(), "{}: overlay field {field} missing", u["name"]);
                }
            }
            actions.push(Value::Object(g));
        }
        assert_eq!(actions.len(), up["actions"].as_array().unwrap().len());
        let rebuilt = serde_json::json!({"actions": actions, "categories": generated["categories"]});
        let text = serde_json::to_string_pretty(&rebuilt).unwrap() + "\n";
        assert!(text == upstream, "the catalog without overlay fields differs from catalog/upstream/catalog.json");
        assert_eq!(generated["version"], "1.14.12");
    }

    #[test]
    fn every_action_documents_results_and_examples() {
        let c = Catalog::bundled();
        for a in &c.actions {
            assert!(a.doc["returnsSchema"].is_object(), "{}", a.name);
            let ex = a.doc["examples"].as_array().unwrap();
            assert!(!ex.is_empty(), "{}", a.name);
            for e in ex {
                assert!(schema::validate(a.input_schema(), &e["params"]).is_empty(), "{}", a.name);
            }
            if a.support == "unsupported" {
                assert_eq!(a.doc["returnsSchema"], serde_json::json!({"not": {}}));
            }
        }
    }
}
