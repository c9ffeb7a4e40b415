//! The arguments of the execution tools as the client sent them: read as
//! Node reads them, and `params` kept as the client's text (never parsed
//! in the supervisor unless a gate must look inside). The gates
//! (`gates.rs`), the transfer plan, the target scope and the pacing read
//! them from here.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Value, json};
use snowluma_proto::JsonText;

/// The arguments of `query_action` / `invoke_action`, read as Node reads
/// them: a non-string `action` is `""` (an unknown action), unknown
/// arguments are ignored, and `execution` is checked only once the action
/// is known ([`execution`]), in Node's order.
#[derive(Debug)]
pub struct ExecArgs {
    /// The action as the caller wrote it (an alias stays an alias).
    pub action: String,
    pub params: Option<Params>,
    /// `execution` as given (`Some(Null)` when it was `null`).
    pub(crate) execution: Option<Value>,
    /// `execution.input_file`, once [`execution`] accepted it.
    pub(crate) input_file: Option<String>,
    /// `execution.idempotency_key`, once [`execution`] accepted it.
    pub(crate) idempotency_key: Option<String>,
}

impl ExecArgs {
    /// `execution.input_file`, when given (after [`execution`]).
    pub fn input_file(&self) -> Option<&str> {
        self.input_file.as_deref()
    }
}

/// The tool's arguments (anything but an object counts as `{}`, as in Node).
pub fn arguments(args: Value) -> ExecArgs {
    let mut m = match args {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let action = match m.remove("action") {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    ExecArgs {
        action,
        params: m.remove("params").map(Params::Value),
        execution: m.remove("execution"),
        input_file: None,
        idempotency_key: None,
    }
}

/// A tool's arguments as the client's JSON text (an object).
#[derive(Debug, Clone)]
pub enum Args {
    Raw(Arc<RawValue>),
    Value(Value),
}

impl From<Value> for Args {
    fn from(v: Value) -> Args {
        Args::Value(v)
    }
}

impl Args {
    /// The parsed arguments (for the tools that read them all).
    pub fn into_value(self) -> Value {
        match self {
            Args::Value(v) => v,
            Args::Raw(raw) => serde_json::from_str(raw.get()).unwrap_or_else(|_| json!({})),
        }
    }
}

/// The arguments of `query_action` / `invoke_action`, read from their text
/// as [`arguments`] reads a value, except that `params` stays text: the
/// supervisor forwards it unread. Unknown arguments are skipped unparsed.
pub fn exec_arguments(args: Args) -> ExecArgs {
    let raw = match args {
        Args::Value(v) => return arguments(v),
        Args::Raw(raw) => raw,
    };
    // Each member's text, `null` included (`"execution": null` is refused,
    // unlike no execution).
    #[derive(serde::Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, default, deserialize_with = "snowluma_proto::json::present")]
        action: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "snowluma_proto::json::present")]
        params: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "snowluma_proto::json::present")]
        execution: Option<&'a RawValue>,
    }
    // A duplicate argument (the last one counts, as in a parsed object) is
    // not this shape: read it as a value.
    let Ok(f) = serde_json::from_str::<Fields>(raw.get()) else {
        return arguments(Args::Raw(raw).into_value());
    };
    let action = f.action.and_then(|a| serde_json::from_str::<String>(a.get()).ok()).unwrap_or_default();
    let execution = f.execution.and_then(|e| serde_json::from_str(e.get()).ok());
    let params = f.params.map(|p| {
        // `p` borrows from `raw`'s text: its place in it.
        let start = p.get().as_ptr() as usize - raw.get().as_ptr() as usize;
        Params::Raw { args: raw.clone(), span: start..start + p.get().len() }
    });
    ExecArgs { action, params, execution, input_file: None, idempotency_key: None }
}

/// `params`: a parsed value, or its place in the arguments' text (forwarded
/// to the network executor as it came, never parsed here).
#[derive(Debug, Clone)]
pub enum Params {
    Value(Value),
    Raw { args: Arc<RawValue>, span: std::ops::Range<usize> },
}

impl Params {
    /// The text of `params` forwarded unread (`None` for a parsed value).
    pub fn text(&self) -> Option<&str> {
        match self {
            Params::Raw { args, span } => args.get().get(span.clone()),
            Params::Value(_) => None,
        }
    }

    pub fn is_object(&self) -> bool {
        match self {
            Params::Value(v) => v.is_object(),
            Params::Raw { .. } => self.text().is_some_and(|t| t.starts_with('{')),
        }
    }

    /// The JSON text sent to the network executor.
    pub fn json_text(&self) -> JsonText {
        match (self, self.text()) {
            (Params::Raw { .. }, Some(t)) => JsonText(t.to_owned()),
            (Params::Value(v), _) => JsonText::from_value(v),
            _ => JsonText("{}".to_owned()),
        }
    }

    /// The parsed value (an audit digest, input completion).
    pub fn to_value(&self) -> Value {
        match self {
            Params::Value(v) => v.clone(),
            Params::Raw { .. } => self.text().and_then(|t| serde_json::from_str(t).ok()).unwrap_or_else(|| json!({})),
        }
    }

    /// The top-level member `key`, when present: parsed alone, the others
    /// skipped unread.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Params::Value(v) => v.get(key).cloned(),
            Params::Raw { .. } => self.text().and_then(|t| member(t, key, true)).flatten(),
        }
    }

    /// Whether the top-level member `key` is present (nothing is parsed).
    pub fn has(&self, key: &str) -> bool {
        match self {
            Params::Value(v) => v.get(key).is_some(),
            Params::Raw { .. } => self.text().and_then(|t| member(t, key, false)).is_some(),
        }
    }
}

impl crate::transfers::PlanParams for Params {
    fn has(&self, key: &str) -> bool {
        Params::has(self, key)
    }
    fn get(&self, key: &str) -> Option<Value> {
        Params::get(self, key)
    }
}

/// Whether the JSON object `text` has a member `key` (`Some`), and, with
/// `keep`, the last one's value; the other members are skipped unbuilt.
fn member(text: &str, key: &str, keep: bool) -> Option<Option<Value>> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Find<'k>(&'k str, bool);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<Option<Value>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if k == self.0 && self.1 {
                    found = Some(Some(map.next_value::<Value>()?));
                } else {
                    map.next_value::<IgnoredAny>()?;
                    if k == self.0 {
                        found = Some(None);
                    }
                }
            }
            Ok(found)
        }
    }
    serde_json::Deserializer::from_str(text).deserialize_map(Find(key, keep)).ok().flatten()
}
