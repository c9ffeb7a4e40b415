//! Helpers for reading JSON text without building it as a `Value`.

use serde_json::value::RawValue;

/// A `deserialize_with` for an optional member whose presence counts even
/// when it is `null`: the member's text, `null` included (`Option` alone
/// would read `null` as absent). Use with `#[serde(borrow, default)]`.
pub fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue as serde::Deserialize>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(serde::Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, default, deserialize_with = "present")]
        a: Option<&'a RawValue>,
    }

    #[test]
    fn null_is_present_and_absent_is_not() {
        let f: Fields = serde_json::from_str(r#"{"a":null}"#).unwrap();
        assert_eq!(f.a.map(RawValue::get), Some("null"));
        let f: Fields = serde_json::from_str(r#"{"a": [1, 2]}"#).unwrap();
        assert_eq!(f.a.map(RawValue::get), Some("[1, 2]"));
        let f: Fields = serde_json::from_str("{}").unwrap();
        assert!(f.a.is_none());
    }
}
