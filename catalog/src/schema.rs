//! A small JSON Schema checker for the subset the catalog uses: `type`,
//! `enum`, `const`, `not`, numeric and length bounds, `properties`,
//! `required`, `additionalProperties`, `items`, `minItems`, `maxItems`,
//! `anyOf`, `oneOf`. Unknown keywords (e.g. `pattern`, `format`) are not
//! enforced. It checks examples at generation time and, later, answers to
//! input requests against the catalog's parameter schemas.

use serde_json::Value;

/// Every violation found, each prefixed with the JSON path (`$.a.b[0]`).
pub fn validate(schema: &Value, value: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    check(schema, value, "$", &mut errs);
    errs
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_i64().is_some() || v.as_u64().is_some() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
    let s = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errs.push(format!("{path}: no value is allowed here"));
            return;
        }
        Value::Object(s) => s,
        _ => return,
    };
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(|t| type_ok(t, v)),
            _ => true,
        };
        if !ok {
            errs.push(format!("{path}: expected {}, got {}", t_display(t), type_name(v)));
            return;
        }
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.contains(v)
    {
        errs.push(format!("{path}: must be one of {}", Value::Array(options.clone())));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        errs.push(format!("{path}: must equal {c}"));
    }
    if let Some(n) = s.get("not")
        && validate(n, v).is_empty()
    {
        errs.push(format!("{path}: value {v} is not allowed here"));
    }
    check_bounds(s, v, path, errs);
    check_members(s, v, path, errs);
    if let Some(Value::Array(any)) = s.get("anyOf")
        && !any.iter().any(|a| validate(a, v).is_empty())
    {
        errs.push(format!("{path}: matches none of the allowed forms"));
    }
    if let Some(Value::Array(one)) = s.get("oneOf") {
        let n = one.iter().filter(|a| validate(a, v).is_empty()).count();
        if n != 1 {
            errs.push(format!("{path}: must match exactly one allowed form (matches {n})"));
        }
    }
}

/// The numeric, length and count bounds (`minimum` … `maxItems`).
fn check_bounds(s: &serde_json::Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<String>) {
    if let Some(x) = v.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && x < min
        {
            errs.push(format!("{path}: must be at least {min}"));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && x > max
        {
            errs.push(format!("{path}: must be at most {max}"));
        }
    }
    if let Some(text) = v.as_str() {
        let len = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            errs.push(format!("{path}: must have at least {min} characters"));
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            errs.push(format!("{path}: must have at most {max} characters"));
        }
    }
    if let Value::Array(items) = v {
        if let Some(min) = s.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            errs.push(format!("{path}: needs at least {min} items"));
        }
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
            && (items.len() as u64) > max
        {
            errs.push(format!("{path}: allows at most {max} items"));
        }
    }
}

/// The members: `items` of an array; `required`, `properties` and
/// `additionalProperties` of an object.
fn check_members(s: &serde_json::Map<String, Value>, v: &Value, path: &str, errs: &mut Vec<String>) {
    if let Value::Array(items) = v
        && let Some(item_schema) = s.get("items")
    {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"), errs);
        }
    }
    if let Value::Object(obj) = v {
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    errs.push(format!("{path}: missing required property {r:?}"));
                }
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(ps, val, &format!("{path}.{k}"), errs),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => errs.push(format!("{path}: unknown property {k:?}")),
                    Some(extra @ Value::Object(_)) => check(extra, val, &format!("{path}.{k}"), errs),
                    _ => {}
                },
            }
        }
    }
}

fn t_display(t: &Value) -> String {
    match t {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" or "),
        _ => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_the_subset() {
        let s = json!({"type":"object","properties":{"id":{"type":"integer","not":{"const":0}},"n":{"type":"integer","minimum":1}},"required":["id"],"additionalProperties":false});
        assert!(validate(&s, &json!({"id": -5, "n": 2})).is_empty());
        assert_eq!(validate(&s, &json!({"n": 0})).len(), 2);
        assert_eq!(validate(&s, &json!({"id": 0})).len(), 1);
        assert_eq!(validate(&s, &json!({"id": "1"})).len(), 1);
        assert_eq!(validate(&s, &json!({"id": 1, "x": 1})).len(), 1);
        assert!(validate(&json!({"type":["string","null"]}), &Value::Null).is_empty());
    }
}
