//! The documentation tools: `list_actions`, `get_action`, `search_actions`,
//! `list_categories`, and the catalog resources. Pure functions from
//! arguments (untrusted JSON) to a result value or a clear error.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ACTION_URI_TEMPLATE, CATALOG_URI, Catalog, search};

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Filters {
    category: Option<String>,
    read_only: Option<bool>,
    stream: Option<bool>,
    limit: Option<u64>,
    offset: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(rename = "match", default)]
    mode: MatchMode,
    category: Option<String>,
    read_only: Option<bool>,
    stream: Option<bool>,
    limit: Option<u64>,
    offset: Option<u64>,
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum MatchMode {
    #[default]
    Substring,
    Keywords,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetArgs {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

fn parse<T: for<'de> Deserialize<'de>>(tool: &'static str, args: &Value) -> Result<T, DocError> {
    let args = if args.is_null() { json!({}) } else { args.clone() };
    if !args.is_object() {
        return Err(DocError::InvalidArguments { tool, message: "arguments must be a JSON object".into() });
    }
    serde_json::from_value(args)
        .map_err(|e| DocError::InvalidArguments { tool, message: crate::clip(e.to_string(), 512) })
}

/// Answer one documentation tool. Actions in `denied` (the operator's
/// policy) stay listed, flagged `"denied_by_policy": true`.
pub fn call(catalog: &Catalog, tool: &str, args: &Value, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    let flag = |name: &str, mut v: Value| {
        if denied.contains(name)
            && let Value::Object(m) = &mut v
        {
            m.insert("denied_by_policy".into(), Value::Bool(true));
        }
        v
    };
    match tool {
        "list_actions" => {
            let f: Filters = parse("list_actions", args)?;
            let items = filtered(catalog, f.category.as_deref(), f.read_only, f.stream)?;
            page(
                "list_actions",
                items.into_iter().map(|(_, a)| flag(&a.name, a.compact())).collect(),
                f.limit,
                f.offset,
            )
        }
        "search_actions" => {
            let s: SearchArgs = parse("search_actions", args)?;
            let items = filtered(catalog, s.category.as_deref(), s.read_only, s.stream)?;
            let hits: Vec<Value> = match s.mode {
                MatchMode::Substring => {
                    let q = search::SubstringQuery::new(&s.query);
                    items.into_iter().filter(|(_, a)| q.matches(a)).map(|(_, a)| flag(&a.name, a.compact())).collect()
                }
                MatchMode::Keywords => {
                    let q = search::KeywordQuery::parse(&s.query)
                        .map_err(|e| DocError::InvalidArguments { tool: "search_actions", message: e.to_string() })?;
                    let mut ranked: Vec<((u8, usize), usize, Value)> = items
                        .into_iter()
                        .filter_map(|(i, a)| q.rank(a).map(|r| (r, i, flag(&a.name, a.compact()))))
                        .collect();
                    ranked.sort_by_key(|(r, i, _)| (*r, *i));
                    ranked.into_iter().map(|(_, _, v)| v).collect()
                }
            };
            page("search_actions", hits, s.limit, s.offset)
        }
        "get_action" => {
            let g: GetArgs = parse("get_action", args)?;
            catalog
                .get(&g.name)
                .map(|a| flag(&a.name, a.doc.clone()))
                .ok_or_else(|| DocError::UnknownAction(crate::echo(&g.name)))
        }
        "list_categories" => {
            let _: NoArgs = parse("list_categories", args)?;
            Ok(Value::Array(catalog.categories.iter().map(|(c, n)| json!({"category": c, "count": n})).collect()))
        }
        other => Err(DocError::UnknownTool(crate::echo(other))),
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
