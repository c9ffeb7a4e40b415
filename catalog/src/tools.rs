//! The documentation tools: `list_actions`, `get_action`, `search_actions`,
//! `list_categories`, and the catalog resources. Pure functions from
//! arguments (untrusted JSON) to a result value or a clear error.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::{ArgType, ToolArgs};
use crate::{ACTION_URI_TEMPLATE, CATALOG_URI, Catalog, search, tool_args};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DocError {
    #[error("invalid arguments for {tool}: {message}")]
    InvalidArguments { tool: &'static str, message: String },
    /// The name as [`crate::echo`] shows it.
    #[error("unknown action {0}: use search_actions or list_actions to find the right name")]
    UnknownAction(String),
    #[error("unknown category {given}; categories are: {known}")]
    UnknownCategory { given: String, known: String },
    #[error("unknown tool {0}")]
    UnknownTool(String),
    #[error("resource not found: {0}")]
    ResourceNotFound(String),
}

tool_args! {
    /// Arguments of `list_actions`: the filters and the page.
    pub struct ListActionsArgs for "list_actions" {
        /// Only actions of this category (exact name as list_categories gives it, e.g. 群管理).
        category: Option<String>,
        /// Only actions that change nothing (true) or only actions that do (false).
        read_only: Option<bool>,
        /// Only Stream API actions (true) or only ordinary ones (false).
        stream: Option<bool>,
        /// Page size (1-200). With limit or offset the result adds total and next_offset.
        #[minimum = 1]
        #[maximum = 200]
        limit: Option<u64>,
        /// Index of the first match to return.
        #[minimum = 0]
        offset: Option<u64>,
    }
}

tool_args! {
    /// Arguments of `search_actions`: the query, then the same filters and
    /// page as `list_actions`.
    pub struct SearchActionsArgs for "search_actions" {
        /// Text to look for; an empty query matches everything.
        query: String,
        /// Matching mode (default substring).
        #[name = "match"]
        #[serde(default)]
        mode: MatchMode,
        /// Only actions of this category (exact name as list_categories gives it, e.g. 群管理).
        category: Option<String>,
        /// Only actions that change nothing (true) or only actions that do (false).
        read_only: Option<bool>,
        /// Only Stream API actions (true) or only ordinary ones (false).
        stream: Option<bool>,
        /// Page size (1-200). With limit or offset the result adds total and next_offset.
        #[minimum = 1]
        #[maximum = 200]
        limit: Option<u64>,
        /// Index of the first match to return.
        #[minimum = 0]
        offset: Option<u64>,
    }
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum MatchMode {
    #[default]
    Substring,
    Keywords,
}

impl MatchMode {
    /// Every mode, by its name in arguments.
    const NAMES: [(MatchMode, &'static str); 2] =
        [(MatchMode::Substring, "substring"), (MatchMode::Keywords, "keywords")];
}

impl ArgType for MatchMode {
    fn schema() -> serde_json::Map<String, Value> {
        crate::args::string_enum(&MatchMode::NAMES.map(|(_, n)| n))
    }
}

tool_args! {
    /// Arguments of `get_action`.
    pub struct GetActionArgs for "get_action" {
        /// Action name or alias, e.g. get_status or nc_get_rkey.
        name: String,
    }
}

tool_args! {
    /// Arguments of `list_categories`: none.
    pub struct ListCategoriesArgs for "list_categories" {}
}

fn parse<T: ToolArgs>(args: &Value) -> Result<T, DocError> {
    let tool = T::TOOL;
    let args = if args.is_null() { json!({}) } else { args.clone() };
    if !args.is_object() {
        return Err(DocError::InvalidArguments { tool, message: "arguments must be a JSON object".into() });
    }
    serde_json::from_value(args)
        .map_err(|e| DocError::InvalidArguments { tool, message: crate::clip(e.to_string(), 512) })
}

/// A documentation tool: its name and input schema come from its argument
/// type, and its answer parses exactly that type.
#[derive(Clone, Copy)]
pub struct DocTool {
    pub name: &'static str,
    /// The tool's `inputSchema` ([`ToolArgs::input_schema`]).
    pub input_schema: fn() -> Value,
    answer: fn(&Catalog, &Value, &BTreeSet<String>) -> Result<Value, DocError>,
}

impl std::fmt::Debug for DocTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocTool").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Arguments that answer their tool.
trait DocArgs: ToolArgs {
    fn answer(self, catalog: &Catalog, denied: &BTreeSet<String>) -> Result<Value, DocError>;
}

fn answer<T: DocArgs>(catalog: &Catalog, args: &Value, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    parse::<T>(args)?.answer(catalog, denied)
}

impl DocTool {
    const fn of<T: DocArgs>() -> DocTool {
        DocTool { name: T::TOOL, input_schema: T::input_schema, answer: answer::<T> }
    }
}

pub const LIST_ACTIONS: DocTool = DocTool::of::<ListActionsArgs>();
pub const GET_ACTION: DocTool = DocTool::of::<GetActionArgs>();
pub const SEARCH_ACTIONS: DocTool = DocTool::of::<SearchActionsArgs>();
pub const LIST_CATEGORIES: DocTool = DocTool::of::<ListCategoriesArgs>();

/// Every documentation tool.
pub const DOC_TOOLS: [DocTool; 4] = [LIST_ACTIONS, GET_ACTION, SEARCH_ACTIONS, LIST_CATEGORIES];

/// `v` with `"denied_by_policy": true` when `name` is in `denied`.
fn flag(denied: &BTreeSet<String>, name: &str, mut v: Value) -> Value {
    if denied.contains(name)
        && let Value::Object(m) = &mut v
    {
        m.insert("denied_by_policy".into(), Value::Bool(true));
    }
    v
}

/// Answer one documentation tool. Actions in `denied` (the operator's
/// policy) stay listed, flagged `"denied_by_policy": true`.
pub fn call(catalog: &Catalog, tool: &str, args: &Value, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    match DOC_TOOLS.iter().find(|t| t.name == tool) {
        Some(t) => (t.answer)(catalog, args, denied),
        None => Err(DocError::UnknownTool(crate::echo(tool))),
    }
}

impl DocArgs for ListActionsArgs {
    fn answer(self, catalog: &Catalog, denied: &BTreeSet<String>) -> Result<Value, DocError> {
        let items = filtered(catalog, self.category.as_deref(), self.read_only, self.stream)?;
        page(
            Self::TOOL,
            items.into_iter().map(|(_, a)| flag(denied, &a.name, a.compact())).collect(),
            self.limit,
            self.offset,
        )
    }
}

impl DocArgs for SearchActionsArgs {
    fn answer(self, catalog: &Catalog, denied: &BTreeSet<String>) -> Result<Value, DocError> {
        let items = filtered(catalog, self.category.as_deref(), self.read_only, self.stream)?;
        let hits: Vec<Value> = match self.mode {
            MatchMode::Substring => {
                let q = search::SubstringQuery::new(&self.query);
                items
                    .into_iter()
                    .filter(|(_, a)| q.matches(a))
                    .map(|(_, a)| flag(denied, &a.name, a.compact()))
                    .collect()
            }
            MatchMode::Keywords => {
                let q = search::KeywordQuery::parse(&self.query)
                    .map_err(|e| DocError::InvalidArguments { tool: Self::TOOL, message: e.to_string() })?;
                let mut ranked: Vec<((u8, usize), usize, Value)> = items
                    .into_iter()
                    .filter_map(|(i, a)| q.rank(a).map(|r| (r, i, flag(denied, &a.name, a.compact()))))
                    .collect();
                ranked.sort_by_key(|(r, i, _)| (*r, *i));
                ranked.into_iter().map(|(_, _, v)| v).collect()
            }
        };
        page(Self::TOOL, hits, self.limit, self.offset)
    }
}

impl DocArgs for GetActionArgs {
    fn answer(self, catalog: &Catalog, denied: &BTreeSet<String>) -> Result<Value, DocError> {
        catalog
            .get(&self.name)
            .map(|a| flag(denied, &a.name, a.doc.clone()))
            .ok_or_else(|| DocError::UnknownAction(crate::echo(&self.name)))
    }
}

impl DocArgs for ListCategoriesArgs {
    fn answer(self, catalog: &Catalog, _denied: &BTreeSet<String>) -> Result<Value, DocError> {
        Ok(Value::Array(catalog.categories.iter().map(|(c, n)| json!({"category": c, "count": n})).collect()))
    }
}

fn filtered<'c>(
    catalog: &'c Catalog,
    category: Option<&str>,
    read_only: Option<bool>,
    stream: Option<bool>,
) -> Result<Vec<(usize, &'c crate::Action)>, DocError> {
    if let Some(c) = category
        && !catalog.categories.iter().any(|(k, _)| k == c)
    {
        let known = catalog.categories.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ");
        return Err(DocError::UnknownCategory { given: crate::echo(c), known });
    }
    Ok(catalog
        .actions
        .iter()
        .enumerate()
        .filter(|(_, a)| category.is_none_or(|c| a.category == c))
        .filter(|(_, a)| read_only.is_none_or(|r| a.read_only == r))
        .filter(|(_, a)| stream.is_none_or(|s| a.stream == s))
        .collect())
}

pub const MAX_LIMIT: u64 = 200;

fn page(tool: &'static str, items: Vec<Value>, limit: Option<u64>, offset: Option<u64>) -> Result<Value, DocError> {
    if limit.is_none() && offset.is_none() {
        return Ok(json!({"count": items.len(), "actions": items}));
    }
    let limit = limit.unwrap_or(MAX_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(DocError::InvalidArguments { tool, message: format!("limit must be between 1 and {MAX_LIMIT}") });
    }
    let offset = offset.unwrap_or(0);
    let total = items.len();
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(total);
    let end = start.saturating_add(limit as usize).min(total);
    let page: Vec<Value> = items[start..end].to_vec();
    let next = if end < total { json!(end) } else { Value::Null };
    Ok(json!({"count": page.len(), "total": total, "next_offset": next, "actions": page}))
}

/// A catalog resource: the whole catalog, or one action by name or alias.
pub fn read_resource(catalog: &Catalog, uri: &str) -> Result<String, DocError> {
    if uri == CATALOG_URI {
        return Ok(catalog.resource_text().to_owned());
    }
    let prefix = ACTION_URI_TEMPLATE.trim_end_matches("{name}");
    if let Some(name) = uri.strip_prefix(prefix)
        && let Some(a) = catalog.get(name)
    {
        return serde_json::to_string_pretty(&a.doc).map_err(|_| DocError::ResourceNotFound(crate::echo(uri)));
    }
    Err(DocError::ResourceNotFound(crate::echo(uri)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of the type a property's schema names (the smallest allowed
    /// integer, the first enum name).
    fn sample(schema: &Value) -> Value {
        if let Some(first) = schema["enum"].get(0) {
            return first.clone();
        }
        match schema["type"].as_str() {
            Some("string") => json!("x"),
            Some("boolean") => json!(true),
            Some("integer") => schema.get("minimum").cloned().unwrap_or(json!(0)),
            other => panic!("no sample for {other:?}"),
        }
    }

    fn parses(tool: &DocTool, args: Value) -> bool {
        let catalog = Catalog::bundled();
        !matches!(call(catalog, tool.name, &args, &BTreeSet::new()), Err(DocError::InvalidArguments { .. }))
    }

    /// Each documentation tool's advertised schema and its parser agree:
    /// every property is accepted with a value of its type, nothing else
    /// is, and exactly the `required` properties must be present.
    #[test]
    fn advertised_schemas_match_the_parsers() {
        for tool in DOC_TOOLS {
            let schema = (tool.input_schema)();
            assert_eq!(schema["type"], "object");
            assert_eq!(schema["additionalProperties"], false, "{}", tool.name);
            let props = schema["properties"].as_object().unwrap();
            let required: Vec<&str> = schema
                .get("required")
                .map(|r| r.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect())
                .unwrap_or_default();
            let all: serde_json::Map<String, Value> = props.iter().map(|(k, s)| (k.clone(), sample(s))).collect();
            assert!(parses(&tool, Value::Object(all.clone())), "{}: every property", tool.name);
            let mut extra = all.clone();
            extra.insert("unknown_property".into(), json!(1));
            assert!(!parses(&tool, Value::Object(extra)), "{}: an unknown property", tool.name);
            for name in props.keys() {
                let mut without = all.clone();
                without.remove(name);
                assert_eq!(
                    parses(&tool, Value::Object(without)),
                    !required.contains(&name.as_str()),
                    "{}: without {name}",
                    tool.name
                );
                let mut wrong = all.clone();
                wrong.insert(name.clone(), json!([]));
                assert!(!parses(&tool, Value::Object(wrong)), "{}: {name} of the wrong type", tool.name);
            }
        }
    }

    #[test]
    fn match_mode_names_are_the_parsed_ones() {
        for (mode, name) in MatchMode::NAMES {
            assert_eq!(serde_json::from_value::<MatchMode>(json!(name)).unwrap(), mode);
        }
        // Every variant is named (a new one fails to compile here).
        for (mode, _) in MatchMode::NAMES {
            match mode {
                MatchMode::Substring | MatchMode::Keywords => {}
            }
        }
        assert_eq!(MatchMode::NAMES.len(), 2);
    }

    #[test]
    fn the_table_answers_by_name() {
        let catalog = Catalog::bundled();
        let none = BTreeSet::new();
        assert!(call(catalog, "list_categories", &Value::Null, &none).is_ok());
        assert_eq!(call(catalog, "nope", &json!({}), &none), Err(DocError::UnknownTool(crate::echo("nope"))));
        assert!(matches!(
            call(catalog, "get_action", &json!([]), &none),
            Err(DocError::InvalidArguments { tool: "get_action", .. })
        ));
    }
}
