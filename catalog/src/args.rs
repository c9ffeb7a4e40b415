//! Tool arguments described once: [`tool_args!`] declares the struct that
//! parses a tool's arguments (serde, unknown fields refused) and generates
//! the tool's advertised input schema from the same field list, so the two
//! cannot disagree.
//!
//! A property's schema is its Rust type's ([`ArgType`]: `string`, `boolean`,
//! `integer`, an enum's names), then the field's `#[minimum = N]` and
//! `#[maximum = N]`, then its doc comment as the description. A property is
//! required unless its type is an `Option` or the field has
//! `#[serde(default)]`.

use serde_json::{Map, Value, json};

/// The arguments of one tool, parsed from the client's (untrusted) JSON.
pub trait ToolArgs: serde::de::DeserializeOwned {
    /// The tool these arguments belong to (named in parse errors).
    const TOOL: &'static str;

    /// The tool's `inputSchema`, generated from the struct's fields.
    fn input_schema() -> Value;
}

/// A Rust type as a JSON property of a tool's arguments.
pub trait ArgType {
    /// Whether the property may be left out.
    const OPTIONAL: bool = false;

    /// The property's schema before its constraints and description.
    fn schema() -> Map<String, Value>;
}

fn typed(name: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("type".into(), json!(name));
    m
}

impl ArgType for String {
    fn schema() -> Map<String, Value> {
        typed("string")
    }
}

impl ArgType for bool {
    fn schema() -> Map<String, Value> {
        typed("boolean")
    }
}

impl ArgType for u64 {
    fn schema() -> Map<String, Value> {
        typed("integer")
    }
}

impl<T: ArgType> ArgType for Option<T> {
    const OPTIONAL: bool = true;

    fn schema() -> Map<String, Value> {
        T::schema()
    }
}

/// A string property limited to `names` (an enum's serialized names).
pub fn string_enum(names: &[&str]) -> Map<String, Value> {
    let mut m = typed("string");
    m.insert("enum".into(), json!(names));
    m
}

/// One property: the type's schema, the constraints in order, then the
/// description (the field's doc comment, its lines joined by spaces).
#[doc(hidden)]
pub fn property(mut schema: Map<String, Value>, constraints: &[(&str, Value)], doc: &[&str]) -> Value {
    for (k, v) in constraints {
        schema.insert((*k).to_owned(), v.clone());
    }
    let description = doc.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
    if !description.is_empty() {
        schema.insert("description".into(), json!(description));
    }
    Value::Object(schema)
}

/// The object schema of a tool's arguments: its properties in field order,
/// no others allowed, and `required` when some property is.
#[doc(hidden)]
pub fn object(properties: Vec<(&str, Value, bool)>) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for (name, schema, optional) in properties {
        if !optional {
            required.push(json!(name));
        }
        props.insert(name.to_owned(), schema);
    }
    let mut s = json!({"type": "object", "properties": props, "additionalProperties": false});
    if !required.is_empty()
        && let Value::Object(m) = &mut s
    {
        m.insert("required".into(), Value::Array(required));
    }
    s
}

/// Declares a tool's argument struct and implements [`ToolArgs`] for it.
///
/// ```
/// use snowluma_catalog::{args::ToolArgs, tool_args};
///
/// tool_args! {
///     /// Arguments of `get_action`.
///     pub struct GetArgs for "get_action" {
///         /// Action name or alias, e.g. get_status or nc_get_rkey.
///         pub name: String,
///     }
/// }
/// assert_eq!(GetArgs::TOOL, "get_action");
/// assert_eq!(GetArgs::input_schema()["required"], serde_json::json!(["name"]));
/// ```
///
/// Per field, in this order, each optional: doc comment lines (the
/// description), `#[name = "json_name"]` (the property's name when it is
/// not the field's), `#[serde(default)]`, `#[minimum = N]`, `#[maximum = N]`.
#[macro_export]
macro_rules! tool_args {
    (
        $(#[doc = $sdoc:literal])*
        $vis:vis struct $name:ident for $tool:literal {
            $(
                $(#[doc = $doc:literal])*
                $(#[name = $json:literal])?
                $(#[serde($default:ident)])?
                $(#[minimum = $min:literal])?
                $(#[maximum = $max:literal])?
                $fvis:vis $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[doc = $sdoc])*
        #[derive(Debug, ::serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name {
            $(
                $(#[doc = $doc])*
                $(#[serde(rename = $json)])?
                $(#[serde($default)])?
                $fvis $field: $ty,
            )*
        }

        impl $crate::args::ToolArgs for $name {
            const TOOL: &'static str = $tool;

            fn input_schema() -> ::serde_json::Value {
                $crate::args::object(::std::vec![$(
                    (
                        { let _n = ::std::stringify!($field); $(let _n = $json;)? _n },
                        $crate::args::property(
                            <$ty as $crate::args::ArgType>::schema(),
                            &[
                                $(("minimum", ::serde_json::json!($min)),)?
                                $(("maximum", ::serde_json::json!($max)),)?
                            ],
                            &[$($doc),*],
                        ),
                        <$ty as $crate::args::ArgType>::OPTIONAL $(|| ::std::stringify!($default) == "default")?,
                    )
                ),*])
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::tool_args! {
        /// A test tool.
        pub struct Sample for "sample" {
            /// First line
            /// and second line.
            pub text: String,
            #[name = "flag"]
            #[serde(default)]
            pub on: bool,
            /// Bounded.
            #[minimum = 1]
            #[maximum = 9]
            pub n: Option<u64>,
        }
    }

    #[test]
    fn schema_follows_the_declaration() {
        assert_eq!(Sample::TOOL, "sample");
        let s = serde_json::to_string(&Sample::input_schema()).unwrap();
        assert_eq!(
            s,
            r#"{"type":"object","properties":{"text":{"type":"string","description":"First line and second line."},"flag":{"type":"boolean"},"n":{"type":"integer","minimum":1,"maximum":9,"description":"Bounded."}},"additionalProperties":false,"required":["text"]}"#
        );
        let a: Sample = serde_json::from_value(json!({"text": "t", "flag": true, "n": 3})).unwrap();
        assert!(a.on && a.text == "t" && a.n == Some(3));
        let a: Sample = serde_json::from_value(json!({"text": "t"})).unwrap();
        assert!(!a.on && a.n.is_none());
        assert!(serde_json::from_value::<Sample>(json!({"text": "t", "on": true})).is_err());
        assert!(serde_json::from_value::<Sample>(json!({"flag": true})).is_err());
    }
}
