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
pub mod index;
pub mod safety;
pub mod schema;
pub mod search;
pub mod tools;
pub mod transfers;

pub use transfers::FileTransfer;

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

/// One action of the bundled catalog: build-time data ([`index`]), its
/// contract parsed only when asked for.
#[derive(Debug)]
pub struct Action {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub category: &'static str,
    /// Upstream's (Chinese) one-line summary; 12 upstream actions have none.
    pub summary: Option<&'static str>,
    /// Our English summary (overlay).
    pub summary_en: &'static str,
    pub read_only: bool,
    /// Upstream marks Stream API actions with `"stream": true` (absent: false).
    pub stream: bool,
    /// A file the server moves itself (see [`transfers`]).
    pub transfer: Option<FileTransfer>,
    pub support: &'static str,
    /// Names of the top-level required parameters.
    pub required: &'static [&'static str],
    /// Where the complete contract is in [`CATALOG_JSON`].
    doc_span: (usize, usize),
    /// The contract, parsed on first use by [`Action::doc`].
    doc: OnceLock<Value>,
    /// Lower-cased texts for search ([`search::SearchText`]).
    pub(crate) search_text: search::SearchText,
}

impl Action {
    /// The compact form used by list and search results: Node's entry
    /// (`name, category, summary?, aliases, readOnly, stream`, in that
    /// order), then our English summary.
    pub fn compact(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("name".into(), Value::String(self.name.to_owned()));
        m.insert("category".into(), Value::String(self.category.to_owned()));
        if let Some(s) = self.summary {
            m.insert("summary".into(), Value::String(s.to_owned()));
        }
        m.insert("aliases".into(), serde_json::json!(self.aliases));
        m.insert("readOnly".into(), Value::Bool(self.read_only));
        m.insert("stream".into(), Value::Bool(self.stream));
        m.insert("summary_en".into(), Value::String(self.summary_en.to_owned()));
        Value::Object(m)
    }

    /// The complete contract's text, as `generated/catalog.json` has it:
    /// the upstream entry followed by the overlay's fields.
    pub fn doc_json(&self) -> &'static str {
        &CATALOG_JSON[self.doc_span.0..self.doc_span.1]
    }

    /// The complete contract, parsed now and not kept: for answers that
    /// hand it out (so a process asked for every contract once does not
    /// keep them all).
    pub fn parse_doc(&self) -> Value {
        serde_json::from_str(self.doc_json()).unwrap_or(Value::Null)
    }

    /// The complete contract, parsed on first use and kept: for the
    /// gates, which read the same few actions' parameters on every call.
    pub fn doc(&self) -> &Value {
        // The span is one JSON object of CATALOG_JSON: the `every_doc_span_is_its_action`
        // test parses every one; a span that did not parse would read as null.
        self.doc.get_or_init(|| self.parse_doc())
    }

    pub fn input_schema(&self) -> &Value {
        &self.doc()["inputSchema"]
    }
}

/// The bundled catalog: build-time data, nothing parsed at start-up.
#[derive(Debug)]
pub struct Catalog {
    pub version: &'static str,
    pub categories: &'static [(&'static str, usize)],
    pub actions: &'static [Action],
    /// Every name and alias, sorted, with its action's index.
    index: &'static [(&'static str, usize)],
}

mod generated {
    use std::sync::OnceLock;

    use crate::search::SearchText;
    use crate::{Action, FileTransfer};

    include!("../generated/index.rs");
}

static BUNDLED: Catalog = Catalog {
    version: generated::VERSION,
    categories: &generated::CATEGORIES,
    actions: &generated::ACTIONS,
    index: &generated::INDEX,
};

impl Catalog {
    /// The catalog compiled into this binary.
    pub fn bundled() -> &'static Catalog {
        &BUNDLED
    }

    /// Look up a canonical name or an alias (exact, case-sensitive: OneBot
    /// action names are).
    pub fn get(&self, name: &str) -> Option<&Action> {
        let i = self.index.binary_search_by(|(n, _)| (*n).cmp(name)).ok()?;
        self.actions.get(self.index[i].1)
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
    fn bundled_catalog_is_indexed() {
        let c = Catalog::bundled();
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

    /// The compiled-in index is `gen-catalog`'s rendering of the bundled
    /// text, so every name, flag and span is the catalog's.
    #[test]
    fn generated_index_is_fresh() {
        let fresh = index::render(CATALOG_JSON).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            fresh == include_str!("../generated/index.rs"),
            "catalog/generated/index.rs is stale: run `cargo run -p snowluma-catalog --bin gen-catalog`"
        );
    }

    /// Each action's span is exactly its own entry of the catalog text.
    #[test]
    fn every_doc_span_is_its_action() {
        let whole: Value = serde_json::from_str(CATALOG_JSON).unwrap();
        let entries = whole["actions"].as_array().unwrap();
        assert_eq!(entries.len(), Catalog::bundled().actions.len());
        for (a, entry) in Catalog::bundled().actions.iter().zip(entries) {
            assert_eq!(&a.parse_doc(), entry, "{}", a.name);
            assert_eq!(a.doc(), entry, "{}", a.name);
            assert_eq!(entry["name"], a.name);
        }
        for (n, _) in BUNDLED.index {
            assert!(Catalog::bundled().get(n).is_some(), "{n}");
        }
        assert!(Catalog::bundled().get("no_such_action").is_none());
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
        for a in c.actions {
            assert!(a.doc()["returnsSchema"].is_object(), "{}", a.name);
            let ex = a.doc()["examples"].as_array().unwrap();
            assert!(!ex.is_empty(), "{}", a.name);
            for e in ex {
                assert!(schema::validate(a.input_schema(), &e["params"]).is_empty(), "{}", a.name);
            }
            if a.support == "unsupported" {
                assert_eq!(a.doc()["returnsSchema"], serde_json::json!({"not": {}}));
            }
        }
    }
}
