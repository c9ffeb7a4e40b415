//! The generator: SnowLuma's upstream catalog plus our overlay, validated,
//! rendered as the bundled catalog (`catalog/generated/catalog.json`).
//!
//! Each generated action is the upstream entry, every field and key order
//! as upstream has it, followed by the overlay's fields
//! ([`crate::def::OVERLAY_FIELDS`]). The generator fails when upstream has
//! an action the overlay does not cover (or the other way round), so moving
//! to a new SnowLuma release is: drop in its catalog, author the missing
//! overlay entries, regenerate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::def::{OverlayDef, Support};

/// The category directories of the overlay, by SnowLuma category.
pub const CATEGORY_SLUGS: [(&str, &str); 12] = [
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
    ("系统表情", "system-face"),
    ("流式接口", "stream"),
];

/// Where the upstream snapshot came from and which SnowLuma release it
/// belongs to (`catalog/upstream/SOURCE.json`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Source {
    /// The catalog's `version`: the SnowLuma release, as Node reports its
    /// package version.
    pub snowluma_version: String,
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{count} catalog problem(s):\n{list}")]
    Invalid { count: usize, list: String },
}

pub fn file_stem(name: &str) -> String {
    match name.strip_prefix('.') {
        Some(rest) => format!("dot.{rest}"),
        None => name.to_owned(),
    }
}

fn read(path: &Path) -> Result<String, GenError> {
    std::fs::read_to_string(path).map_err(|source| GenError::Io { path: path.to_path_buf(), source })
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, GenError> {
    serde_json::from_str(text).map_err(|source| GenError::Parse { path: path.to_path_buf(), source })
}

/// Read every overlay file below `dir`, with its path.
pub fn load_overlay(dir: &Path) -> Result<Vec<(PathBuf, OverlayDef)>, GenError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GenError::Io { path, source }
    };
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&d)
            .map_err(io(&d))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for f in files {
            let text = read(&f)?;
            out.push((f.clone(), parse(&f, &text)?));
        }
    }
    Ok(out)
}

/// The catalog directory's three inputs.
#[derive(Debug)]
pub struct Inputs {
    pub upstream_text: String,
    pub source: Source,
    pub overlay: Vec<(PathBuf, OverlayDef)>,
}

impl Inputs {
    /// Read `catalog/upstream/` and `catalog/overlay/` below `root`.
    pub fn load(root: &Path) -> Result<Inputs, GenError> {
        let up = root.join("upstream/catalog.json");
        let src = root.join("upstream/SOURCE.json");
        Ok(Inputs {
            upstream_text: read(&up)?,
            source: parse(&src, &read(&src)?)?,
            overlay: load_overlay(&root.join("overlay"))?,
        })
    }
}

/// Validate and render. `strict` also demands every authored text.
pub fn generate(root: &Path, strict: bool) -> Result<String, GenError> {
    render(&Inputs::load(root)?, strict)
}

/// [`generate`] from inputs already read.
pub fn render(inputs: &Inputs, strict: bool) -> Result<String, GenError> {
    let up_path = Path::new("catalog/upstream/catalog.json");
    let upstream: Map<String, Value> = parse(up_path, &inputs.upstream_text)?;
    let mut problems = Vec::new();
    let actions = upstream.get("actions").and_then(Value::as_array).cloned().unwrap_or_default();
    let categories = upstream.get("categories").cloned().unwrap_or(Value::Null);
    if actions.is_empty() || !categories.is_array() {
        problems.push("upstream catalog: expected non-empty `actions` and `categories` arrays".to_owned());
    }
    let mut by_name: BTreeMap<&str, (&Path, &OverlayDef)> = BTreeMap::new();
    for (path, o) in &inputs.overlay {
        if let Some((prev, _)) = by_name.insert(o.name.as_str(), (path.as_path(), o)) {
            problems.push(format!("{}: overlay for {} also in {}", path.display(), o.name, prev.display()));
        }
    }
    let mut used = BTreeSet::new();
    let mut out = Vec::with_capacity(actions.len());
    for a in &actions {
        let Some(entry) = a.as_object() else {
            problems.push("upstream catalog: an action is not an object".to_owned());
            continue;
        };
        let name = entry.get("name").and_then(Value::as_str).unwrap_or_default();
        let category = entry.get("category").and_then(Value::as_str).unwrap_or_default();
        let Some(slug) = CATEGORY_SLUGS.iter().find(|(c, _)| *c == category).map(|(_, s)| *s) else {
            problems.push(format!("{name}: upstream category {category:?} has no overlay directory (CATEGORY_SLUGS)"));
            continue;
        };
        let Some((path, o)) = by_name.get(name) else {
            if strict {
                problems.push(format!("{name}: no overlay (write catalog/overlay/{slug}/{}.json)", file_stem(name)));
            } else {
                out.push(Value::Object(merged(entry, &OverlayDef::draft(name))));
            }
            continue;
        };
        used.insert(name.to_owned());
        let expect = format!("{slug}/{}.json", file_stem(name));
        if !path.ends_with(&expect) {
            problems.push(format!("{}: should be catalog/overlay/{expect}", path.display()));
        }
        let mut p = |m: String| problems.push(format!("{}: {m}", path.display()));
        check(entry, o, strict, &mut p);
        out.push(Value::Object(merged(entry, o)));
    }
    for (name, (path, _)) in &by_name {
        if !used.contains(*name) {
            problems.push(format!("{}: overlay for {name}, which upstream does not have", path.display()));
        }
    }
    if !problems.is_empty() {
        return Err(GenError::Invalid { count: problems.len(), list: problems.join("\n") });
    }
    let doc = json!({
        "version": inputs.source.snowluma_version,
        "categories": categories,
        "actions": out,
    });
    let mut text =
        serde_json::to_string_pretty(&doc).map_err(|source| GenError::Parse { path: up_path.into(), source })?;
    text.push('\n');
    Ok(text)
}

/// The upstream entry with the overlay's fields appended.
fn merged(entry: &Map<String, Value>, o: &OverlayDef) -> Map<String, Value> {
    let mut m = entry.clone();
    if let Some(s) = &o.returns_schema
        && !m.contains_key("returnsSchema")
    {
        m.insert("returnsSchema".into(), s.clone());
    }
    m.insert("support".into(), json!(o.support.as_str()));
    m.insert("summary_en".into(), json!(o.summary_en));
    m.insert("description_en".into(), json!(o.description_en));
    m.insert("params_en".into(), Value::Object(o.params_en.clone()));
    m.insert("invariants_en".into(), json!(o.invariants_en));
    m.insert("returns_en".into(), json!(o.returns_en));
    let examples: Vec<Value> = o
        .examples
        .iter()
        .map(|e| {
            let mut x = Map::new();
            x.insert("summary".into(), json!(e.summary));
            x.insert("params".into(), Value::Object(e.params.clone()));
            if let Some(n) = &e.notes {
                x.insert("notes".into(), json!(n));
            }
            Value::Object(x)
        })
        .collect();
    m.insert("examples".into(), Value::Array(examples));
    m
}

fn check(entry: &Map<String, Value>, o: &OverlayDef, strict: bool, p: &mut impl FnMut(String)) {
    for field in crate::def::OVERLAY_FIELDS {
        if field != "returnsSchema" && entry.contains_key(field) {
            p(format!("upstream now has {field}; the overlay must not replace it (rename the overlay field)"));
        }
    }
    if strict {
        for (field, v) in
            [("summary_en", &o.summary_en), ("description_en", &o.description_en), ("returns_en", &o.returns_en)]
        {
            if v.trim().is_empty() {
                p(format!("{field} is empty"));
            }
        }
        if o.examples.is_empty() {
            p("needs at least one example".into());
        }
    }
    if o.summary_en.chars().count() > 120 {
        p("summary_en longer than 120 characters".into());
    }
    // Every upstream parameter described, and nothing else.
    let params: Vec<&str> = entry
        .get("params")
        .and_then(Value::as_array)
        .map(|ps| ps.iter().filter_map(|q| q.get("name").and_then(Value::as_str)).collect())
        .unwrap_or_default();
    for q in &params {
        match o.params_en.get(*q) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            Some(Value::String(_)) | None if !strict => {}
            _ => p(format!("params_en has no English description of {q}")),
        }
    }
    for k in o.params_en.keys() {
        if !params.contains(&k.as_str()) {
            p(format!("params_en describes {k}, which upstream's params do not have"));
        }
    }
    let up_invariants = entry.get("invariants").and_then(Value::as_array).map_or(0, Vec::len);
    if strict && o.invariants_en.len() != up_invariants {
        p(format!("invariants_en has {} entries; upstream has {up_invariants}", o.invariants_en.len()));
    }
    // returnsSchema: upstream's wins; ours only where upstream has none.
    let not_any = json!({"not": {}});
    let schema = match (entry.get("returnsSchema"), &o.returns_schema) {
        (Some(_), Some(_)) => {
            p("upstream has a returnsSchema; remove the overlay's (upstream's wins)".into());
            None
        }
        (Some(s), None) => Some(s),
        (None, Some(s)) => Some(s),
        (None, None) => {
            if strict {
                p("upstream has no returnsSchema; the overlay must author one".into());
            }
            None
        }
    };
    if let Some(s) = schema {
        if !s.is_object() {
            p("returnsSchema must be a JSON Schema object".into());
        }
        if o.support == Support::Unsupported && o.returns_schema.is_some() && *s != not_any {
            p("unsupported actions return {\"not\": {}}".into());
        }
        if o.support != Support::Unsupported && *s == not_any {
            p("{\"not\": {}} is only for unsupported actions".into());
        }
    }
    let input = entry.get("inputSchema").cloned().unwrap_or(Value::Null);
    for (i, ex) in o.examples.iter().enumerate() {
        if strict && ex.summary.trim().is_empty() {
            p(format!("example {i} has no summary"));
        }
        for err in crate::schema::validate(&input, &Value::Object(ex.params.clone())) {
            p(format!("example {i}: {err}"));
        }
    }
}
