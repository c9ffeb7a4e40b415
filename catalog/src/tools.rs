//! The documentation tools: `list_actions`, `get_action`, `search_actions`,
//! `list_categories`, and the catalog resources. Pure functions from
//! arguments (untrusted JSON) to a result value or a clear error.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::{ACTION_URI_TEMPLATE, CATALOG_URI, Catalog, search};

/// Why a documentation tool refuses; the texts are the tool error's text.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DocError {
    /// One of the spec's added arguments (filters, page, match) is invalid;
    /// Node's own arguments are never refused (as Node: a wrong type counts
    /// as absent).
    #[error("{0}")]
    InvalidArguments(String),
    /// The name as [`crate::json_echo`] shows it.
    #[error("未找到 action: {0}。用 list_actions / search_actions 查可用项。")]
    UnknownAction(String),
    /// The name as [`crate::plain_echo`] shows it.
    #[error("未知工具: {0}")]
    UnknownTool(String),
    #[error("unknown resource: {0}")]
    ResourceNotFound(String),
}

/// Node's `category` property (`list_actions`; `search_actions` adds it).
const CATEGORY: &str = "按分类过滤，如 群管理 / 消息 / 好友";
const READ_ONLY: &str = "只要只读 action（true）或只要会改变状态的 action（false）。Only read-only (true) or only state-changing (false) actions.";
const STREAM: &str = "只要 Stream Action（true）或只要普通 action（false）。Only Stream API actions (true) or only ordinary ones (false).";
const LIMIT: &str = "分页大小（1–200）。给出 limit 或 offset 时，count 为本页数量，并另含 total 与 next_offset。Page size (1-200); with limit or offset the result adds total and next_offset.";
const OFFSET: &str = "从第几个匹配项开始（非负整数，默认 0）。Index of the first match to return (default 0).";
const MATCH: &str = "匹配方式：substring（默认，大小写不敏感的子串匹配，按目录顺序）或 keywords（空格分隔的关键词取交集，识别常用中英文同义词，名称或别名完全相同者排在最前）。Matching mode: substring (default) or keywords.";

fn prop(ty: &str, description: &str) -> Value {
    json!({"type": ty, "description": description})
}

/// The filters and page both list tools accept (the spec's additions).
fn filters(props: &mut Map<String, Value>) {
    props.insert("read_only".into(), prop("boolean", READ_ONLY));
    props.insert("stream".into(), prop("boolean", STREAM));
    props.insert("limit".into(), json!({"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": LIMIT}));
    props.insert("offset".into(), json!({"type": "integer", "minimum": 0, "description": OFFSET}));
}

fn object(props: Map<String, Value>, required: &[&str]) -> Value {
    let mut s = Map::new();
    s.insert("type".into(), json!("object"));
    s.insert("properties".into(), Value::Object(props));
    if !required.is_empty() {
        s.insert("required".into(), json!(required));
    }
    s.insert("additionalProperties".into(), json!(false));
    Value::Object(s)
}

fn list_actions_schema() -> Value {
    let mut p = Map::new();
    p.insert("category".into(), prop("string", CATEGORY));
    filters(&mut p);
    object(p, &[])
}

fn get_action_schema() -> Value {
    let mut p = Map::new();
    p.insert("name".into(), prop("string", "action 名（接受别名）"));
    object(p, &["name"])
}

fn search_actions_schema() -> Value {
    let mut p = Map::new();
    p.insert("query".into(), prop("string", "关键字"));
    p.insert("match".into(), json!({"type": "string", "enum": ["substring", "keywords"], "description": MATCH}));
    p.insert("category".into(), prop("string", CATEGORY));
    filters(&mut p);
    object(p, &["query"])
}

fn list_categories_schema() -> Value {
    object(Map::new(), &[])
}

/// The arguments as an object: Node treats anything else as `{}`.
fn fields(args: &Value) -> Map<String, Value> {
    args.as_object().cloned().unwrap_or_default()
}

/// A string argument of Node's: anything but a string is `""`.
fn node_string<'a>(args: &'a Map<String, Value>, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or("")
}

fn flag_arg(args: &Map<String, Value>, key: &str) -> Result<Option<bool>, DocError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(DocError::InvalidArguments(format!("{key} 必须是布尔值（true 或 false）。"))),
    }
}

/// The filters and page of the list tools.
#[derive(Debug, Default)]
struct Filter<'a> {
    /// Node's rule: a non-string or empty category is no filter.
    category: Option<&'a str>,
    read_only: Option<bool>,
    stream: Option<bool>,
    limit: Option<u64>,
    offset: Option<u64>,
}

impl<'a> Filter<'a> {
    fn parse(args: &'a Map<String, Value>) -> Result<Filter<'a>, DocError> {
        let limit = match args.get("limit") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_LIMIT).contains(&n) => Some(n),
                _ => return Err(DocError::InvalidArguments(format!("limit 必须是 1 到 {MAX_LIMIT} 之间的整数。"))),
            },
        };
        let offset = match args.get("offset") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) => Some(n),
                None => return Err(DocError::InvalidArguments("offset 必须是非负整数。".into())),
            },
        };
        Ok(Filter {
            category: Some(node_string(args, "category")).filter(|c| !c.is_empty()),
            read_only: flag_arg(args, "read_only")?,
            stream: flag_arg(args, "stream")?,
            limit,
            offset,
        })
    }

    fn select<'c>(&self, catalog: &'c Catalog) -> Vec<(usize, &'c crate::Action)> {
        catalog
            .actions
            .iter()
            .enumerate()
            .filter(|(_, a)| self.category.is_none_or(|c| a.category == c))
            .filter(|(_, a)| self.read_only.is_none_or(|r| a.read_only == r))
            .filter(|(_, a)| self.stream.is_none_or(|s| a.stream == s))
            .collect()
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum MatchMode {
    Substring,
    Keywords,
}

impl MatchMode {
    fn parse(args: &Map<String, Value>) -> Result<MatchMode, DocError> {
        match args.get("match") {
            None | Some(Value::Null) => Ok(MatchMode::Substring),
            Some(Value::String(s)) if s == "substring" => Ok(MatchMode::Substring),
            Some(Value::String(s)) if s == "keywords" => Ok(MatchMode::Keywords),
            Some(_) => Err(DocError::InvalidArguments("match 必须是 \"substring\" 或 \"keywords\"。".into())),
        }
    }
}

/// A documentation tool: its name, its advertised input schema (Node's
/// properties, then the spec's additions) and its answer.
#[derive(Clone, Copy)]
pub struct DocTool {
    pub name: &'static str,
    /// The tool's `inputSchema`.
    pub input_schema: fn() -> Value,
    answer: Answer,
}

/// A documentation tool's answer: the catalog, the arguments (an object)
/// and the actions the policy denies.
type Answer = fn(&Catalog, &Map<String, Value>, &BTreeSet<String>) -> Result<Value, DocError>;

impl std::fmt::Debug for DocTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocTool").field("name", &self.name).finish_non_exhaustive()
    }
}

pub const LIST_ACTIONS: DocTool =
    DocTool { name: "list_actions", input_schema: list_actions_schema, answer: list_actions };
pub const GET_ACTION: DocTool = DocTool { name: "get_action", input_schema: get_action_schema, answer: get_action };
pub const SEARCH_ACTIONS: DocTool =
    DocTool { name: "search_actions", input_schema: search_actions_schema, answer: search_actions };
pub const LIST_CATEGORIES: DocTool =
    DocTool { name: "list_categories", input_schema: list_categories_schema, answer: list_categories };

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
/// policy) stay listed, flagged `"denied_by_policy": true`. Arguments are
/// read as Node reads them: anything but an object is `{}`, unknown keys
/// are ignored.
pub fn call(catalog: &Catalog, tool: &str, args: &Value, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    match DOC_TOOLS.iter().find(|t| t.name == tool) {
        Some(t) => (t.answer)(catalog, &fields(args), denied),
        None => Err(DocError::UnknownTool(crate::plain_echo(tool))),
    }
}

fn list_actions(catalog: &Catalog, args: &Map<String, Value>, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    let f = Filter::parse(args)?;
    let items = f.select(catalog).into_iter().map(|(_, a)| flag(denied, a.name, a.compact())).collect();
    page(items, f.limit, f.offset)
}

fn search_actions(catalog: &Catalog, args: &Map<String, Value>, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    let f = Filter::parse(args)?;
    let query = node_string(args, "query");
    let items = f.select(catalog);
    let hits: Vec<Value> = match MatchMode::parse(args)? {
        MatchMode::Substring => {
            let q = search::SubstringQuery::new(query);
            items.into_iter().filter(|(_, a)| q.matches(a)).map(|(_, a)| flag(denied, a.name, a.compact())).collect()
        }
        MatchMode::Keywords => {
            let q = search::KeywordQuery::parse(query).map_err(|e| DocError::InvalidArguments(e.to_string()))?;
            let mut ranked: Vec<((u8, usize), usize, Value)> = items
                .into_iter()
                .filter_map(|(i, a)| q.rank(a).map(|r| (r, i, flag(denied, a.name, a.compact()))))
                .collect();
            ranked.sort_by_key(|(r, i, _)| (*r, *i));
            ranked.into_iter().map(|(_, _, v)| v).collect()
        }
    };
    page(hits, f.limit, f.offset)
}

fn get_action(catalog: &Catalog, args: &Map<String, Value>, denied: &BTreeSet<String>) -> Result<Value, DocError> {
    let name = node_string(args, "name");
    catalog
        .get(name)
        .map(|a| flag(denied, a.name, a.parse_doc()))
        .ok_or_else(|| DocError::UnknownAction(crate::json_echo(name)))
}

fn list_categories(catalog: &Catalog, _: &Map<String, Value>, _: &BTreeSet<String>) -> Result<Value, DocError> {
    Ok(Value::Array(catalog.categories.iter().map(|(c, n)| json!({"category": c, "count": n})).collect()))
}

pub const MAX_LIMIT: u64 = 200;

fn page(items: Vec<Value>, limit: Option<u64>, offset: Option<u64>) -> Result<Value, DocError> {
    if limit.is_none() && offset.is_none() {
        return Ok(json!({"count": items.len(), "actions": items}));
    }
    let limit = limit.unwrap_or(MAX_LIMIT);
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
        return serde_json::to_string_pretty(&a.parse_doc())
            .map_err(|_| DocError::ResourceNotFound(crate::plain_echo(uri)));
    }
    Err(DocError::ResourceNotFound(crate::plain_echo(uri)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(tool: &str, args: Value) -> Result<Value, DocError> {
        call(Catalog::bundled(), tool, &args, &BTreeSet::new())
    }

    fn count(v: &Value) -> u64 {
        v["count"].as_u64().unwrap()
    }

    /// Node's arguments are read as Node reads them: a wrong type is the
    /// empty value, unknown keys are ignored, anything but an object is `{}`.
    #[test]
    fn node_arguments_are_never_refused() {
        let all = Catalog::bundled().actions.len() as u64;
        assert_eq!(count(&ask("list_actions", json!({"category": ""})).unwrap()), all);
        assert_eq!(count(&ask("list_actions", json!({"category": 5})).unwrap()), all);
        assert_eq!(count(&ask("list_actions", json!({"category": "没有"})).unwrap()), 0);
        assert_eq!(count(&ask("list_actions", json!({"category": " 群管理"})).unwrap()), 0);
        assert_eq!(count(&ask("list_actions", json!({"extra": 1})).unwrap()), all);
        assert_eq!(count(&ask("list_actions", json!([1])).unwrap()), all);
        assert_eq!(count(&ask("search_actions", json!({})).unwrap()), all);
        assert_eq!(count(&ask("search_actions", json!({"query": 7})).unwrap()), all);
        assert_eq!(
            ask("get_action", json!({"name": null})).unwrap_err().to_string(),
            "未找到 action: \"\"。用 list_actions / search_actions 查可用项。"
        );
        assert!(ask("list_categories", json!({"anything": true})).is_ok());
    }

    /// The spec's added arguments are checked, with texts in Node's style.
    #[test]
    fn added_arguments_are_checked() {
        for (tool, args) in [
            ("list_actions", json!({"limit": 0})),
            ("list_actions", json!({"limit": 201})),
            ("list_actions", json!({"limit": "3"})),
            ("list_actions", json!({"offset": -1})),
            ("list_actions", json!({"read_only": "yes"})),
            ("search_actions", json!({"query": "x", "stream": 1})),
            ("search_actions", json!({"query": "x", "match": "regex"})),
        ] {
            assert!(matches!(ask(tool, args.clone()), Err(DocError::InvalidArguments(_))), "{tool} {args}");
        }
        let page = ask("list_actions", json!({"limit": 2, "offset": 1})).unwrap();
        assert_eq!((page["count"].as_u64(), page["next_offset"].as_u64()), (Some(2), Some(3)));
    }

    /// Each tool's advertised schema lists Node's property first, then ours,
    /// and refuses nothing it advertises.
    #[test]
    fn advertised_properties_are_accepted() {
        let sample = |s: &Value| match s["type"].as_str() {
            Some("string") => s["enum"].get(0).cloned().unwrap_or(json!("get_status")),
            Some("boolean") => json!(true),
            Some("integer") => s.get("minimum").cloned().unwrap_or(json!(1)),
            other => panic!("{other:?}"),
        };
        for tool in DOC_TOOLS {
            let schema = (tool.input_schema)();
            let props = schema["properties"].as_object().unwrap();
            let args: Map<String, Value> = props.iter().map(|(k, s)| (k.clone(), sample(s))).collect();
            assert!(ask(tool.name, Value::Object(args)).is_ok(), "{}", tool.name);
        }
    }

    #[test]
    fn the_table_answers_by_name() {
        assert!(ask("list_categories", Value::Null).is_ok());
        assert_eq!(ask("nope", json!({})), Err(DocError::UnknownTool("nope".into())));
    }
}
