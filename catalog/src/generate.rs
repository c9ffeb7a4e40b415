//! The generator: reads every authored definition, validates it, and renders
//! the bundled catalog (`catalog/generated/catalog.json`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::def::{ActionDef, Support};

/// The categories in SnowLuma's order.
pub const CATEGORIES: [(&str, &str); 11] = [
    ("信息", "info"),
    ("消息", "message"),
    ("好友", "friend"),
    ("群信息", "group-info"),
    ("群管理", "group-admin"),
    ("群文件", "group-file"),
    ("请求", "request"),
    ("扩展", "extension"),
    ("群相册", "group-album"),
    ("空间", "qzone"),
    ("流式接口", "stream"),
];

/// The SnowLuma catalog snapshot the facts were taken from.
pub const SOURCE_SNAPSHOT: &str = "2026.07.24";

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid definition: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{count} definition problem(s):\n{list}")]
    Invalid { count: usize, list: String },
}

/// Catalog order: SnowLuma sorts names with `_` before `.` before digits
/// before letters, case-insensitively.
pub fn order_key(name: &str) -> Vec<(u8, char)> {
    name.chars()
        .map(|c| {
            let class = match c {
                '_' => 1,
                '.' => 2,
                c if c.is_ascii_digit() => 3,
                _ => 4,
            };
            (class, c.to_ascii_lowercase())
        })
        .collect()
}

pub fn file_stem(name: &str) -> String {
    match name.strip_prefix('.') {
        Some(rest) => format!("dot.{rest}"),
        None => name.to_owned(),
    }
}

/// Read every definition below `defs_dir`.
pub fn load_defs(defs_dir: &Path) -> Result<Vec<(PathBuf, ActionDef)>, GenError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GenError::Io { path, source }
    };
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(defs_dir)
        .map_err(io(defs_dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(io(&f))?;
            let def: ActionDef =
                serde_json::from_str(&text).map_err(|source| GenError::Parse { path: f.clone(), source })?;
            out.push((f, def));
        }
    }
    Ok(out)
}

/// Validate and render. `strict` also demands every authored text field.
pub fn generate(defs_dir: &Path, strict: bool) -> Result<String, GenError> {
    let mut defs = load_defs(defs_dir)?;
    let mut problems = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (path, d) in &defs {
        let mut p = |m: String| problems.push(format!("{}: {m}", path.display()));
        let slug = CATEGORIES.iter().find(|(c, _)| *c == d.category).map(|(_, s)| *s);
        match slug {
            None => p(format!("unknown category {:?}", d.category)),
            Some(slug) => {
                let expect = format!("{slug}/{}.json", file_stem(&d.name));
                if !path.ends_with(&expect) {
                    p(format!("file should be {expect}"));
                }
            }
        }
        for n in std::iter::once(&d.name).chain(&d.aliases) {
            if let Some(prev) = seen.insert(n.clone(), d.name.clone()) {
                p(format!("name {n:?} also used by {prev}"));
            }
        }
        check_def(d, strict, &mut p);
    }
    if !problems.is_empty() {
        return Err(GenError::Invalid { count: problems.len(), list: problems.join("\n") });
    }
    defs.sort_by_key(|a| order_key(&a.1.name));
    let actions: Vec<Value> = defs.iter().map(|(_, d)| render_action(d)).collect();
    let categories: Vec<Value> = CATEGORIES
        .iter()
        .map(|(c, _)| json!({"category": c, "count": defs.iter().filter(|(_, d)| d.category == *c).count()}))
        .collect();
    let body = json!({"categories": categories, "actions": actions});
    let digest = fnv1a(body.to_string().as_bytes());
    let doc = json!({
        "version": format!("{SOURCE_SNAPSHOT}+{digest:016x}"),
        "categories": body["categories"],
        "actions": body["actions"],
    });
    let mut text = serde_json::to_string_pretty(&doc)
        .map_err(|source| GenError::Parse { path: defs_dir.to_path_buf(), source })?;
    text.push('\n');
    Ok(text)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn check_def(d: &ActionDef, strict: bool, p: &mut impl FnMut(String)) {
    if strict {
        for (field, v) in [
            ("summary", &d.summary),
            ("summary_zh", &d.summary_zh),
            ("description", &d.description),
            ("returns", &d.returns),
        ] {
            if v.trim().is_empty() {
                p(format!("{field} is empty"));
            }
        }
        for prm in &d.params {
            if prm.description.trim().is_empty() {
                p(format!("param {} has no description", prm.name));
            }
        }
        if d.examples.is_empty() {
            p("needs at least one example".into());
        }
        if d.invariants.iter().any(|i| i.contains("TODO")) {
            p("invariants still hold a TODO".into());
        }
    }
    if d.summary.chars().count() > 120 {
        p("summary longer than 120 characters".into());
    }
    let not_any = json!({"not": {}});
    match (&d.returns_schema, d.support) {
        (Value::Object(_), Support::Unsupported) if d.returns_schema != not_any => {
            p("unsupported actions return {\"not\": {}}".into())
        }
        (Value::Object(_), Support::Supported | Support::Placeholder) if d.returns_schema == not_any => {
            p("{\"not\": {}} is only for unsupported actions".into())
        }
        (Value::Object(_), _) => {}
        (Value::Null, _) if !strict => {}
        _ => p("returns_schema must be a JSON Schema object".into()),
    }
    let input = input_schema(d);
    for (i, ex) in d.examples.iter().enumerate() {
        if strict && ex.summary.trim().is_empty() {
            p(format!("example {i} has no summary"));
        }
        let params = Value::Object(ex.params.clone());
        for err in crate::schema::validate(&input, &params) {
            p(format!("example {i}: {err}"));
        }
    }
}

/// The action's input schema, built from its parameters.
pub fn input_schema(d: &ActionDef) -> Value {
    let mut props = Map::new();
    for prm in &d.params {
        let mut s = match &prm.schema {
            Value::Object(m) => m.clone(),
            _ => Map::new(),
        };
        if !prm.description.is_empty() {
            s.insert("description".into(), json!(prm.description));
        }
        if let Some(def) = &prm.default {
            s.insert("default".into(), def.clone());
        }
        if let Some(role) = &prm.role {
            s.insert("x-role".into(), json!(role));
        }
        props.insert(prm.name.clone(), Value::Object(s));
    }
    let required: Vec<&str> = d.params.iter().filter(|p| p.required).map(|p| p.name.as_str()).collect();
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Value::Object(props));
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema.insert("additionalProperties".into(), json!(true));
    Value::Object(schema)
}

fn render_action(d: &ActionDef) -> Value {
    let params: Vec<Value> = d
        .params
        .iter()
        .map(|p| {
            let mut m = Map::new();
            m.insert("name".into(), json!(p.name));
            m.insert("type".into(), json!(p.ty));
            m.insert("required".into(), json!(p.required));
            if let Some(v) = &p.default {
                m.insert("default".into(), v.clone());
            }
            if let Some(v) = &p.values {
                m.insert("values".into(), json!(v));
            }
            if let Some(v) = &p.role {
                m.insert("role".into(), json!(v));
            }
            m.insert("description".into(), json!(p.description));
            Value::Object(m)
        })
        .collect();
    let examples: Vec<Value> = d
        .examples
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("summary".into(), json!(e.summary));
            m.insert("params".into(), Value::Object(e.params.clone()));
            if let Some(n) = &e.notes {
                m.insert("notes".into(), json!(n));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "name": d.name,
        "aliases": d.aliases,
        "category": d.category,
        "summary": d.summary,
        "summary_zh": d.summary_zh,
        "description": d.description,
        "readOnly": d.read_only,
        "stream": d.stream,
        "support": d.support.as_str(),
        "params": params,
        "invariants": d.invariants,
        "inputSchema": input_schema(d),
        "returns": d.returns,
        "returnsSchema": if d.returns_schema.is_null() { json!({}) } else { d.returns_schema.clone() },
        "examples": examples,
    })
}
