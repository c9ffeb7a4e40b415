//! Helpers for reading JSON text without building it as a `Value`.

use serde_json::value::RawValue;

/// A `deserialize_with` for an optional member whose presence counts even
/// when it is `null`: the member's text, `null` included (`Option` alone
/// would read `null` as absent). Use with `#[serde(borrow, default)]`.
pub fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue as serde::Deserialize>::deserialize(d).map(Some)
}

/// JSON text written again through a serde serializer, without building
/// it as a `Value`: the same bytes as parsing it into a `serde_json::Value`
/// and serializing that (every number, string and nesting goes through the
/// same calls), for text in which no object repeats a key. A repeated key
/// (which a parsed object keeps once, with the last value, at the first
/// one's place), text that is not one JSON value, or nesting beyond
/// serde_json's limit fails the serialization instead: the caller then
/// takes the `Value` path.
#[derive(Clone, Copy)]
pub struct Transcoded<'a>(pub &'a str);

impl serde::Serialize for Transcoded<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut de = serde_json::Deserializer::from_str(self.0);
        let out = serde::Deserializer::deserialize_any(&mut de, transcode::Visit(s)).map_err(S::Error::custom)?;
        de.end().map_err(S::Error::custom)?;
        Ok(out)
    }
}

/// [`Transcoded`]'s plumbing: each value the deserializer visits is handed
/// to the serializer as it is read.
mod transcode {
    use std::borrow::Cow;
    use std::cell::Cell;
    use std::fmt;

    use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess};
    use serde::ser::{self, SerializeMap, SerializeSeq, Serializer};

    /// Keys of one object compared one by one up to this many; beyond it,
    /// through a set.
    const LINEAR_KEYS: usize = 16;

    pub(super) struct Visit<S>(pub(super) S);

    /// A deserializer positioned at a value, as something to serialize.
    struct Next<D>(Cell<Option<D>>);

    impl<'de, D: Deserializer<'de>> ser::Serialize for Next<D> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::Error;
            let d = self.0.take().ok_or_else(|| S::Error::custom("a value transcoded twice"))?;
            d.deserialize_any(Visit(s)).map_err(S::Error::custom)
        }
    }

    fn err<E: de::Error>(e: impl fmt::Display) -> E {
        E::custom(e)
    }

    impl<'de, S: Serializer> de::Visitor<'de> for Visit<S> {
        type Value = S::Ok;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<S::Ok, E> {
            self.0.serialize_bool(v).map_err(err)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<S::Ok, E> {
            self.0.serialize_i64(v).map_err(err)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<S::Ok, E> {
            self.0.serialize_u64(v).map_err(err)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<S::Ok, E> {
            self.0.serialize_f64(v).map_err(err)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Ok, E> {
            self.0.serialize_str(v).map_err(err)
        }
        fn visit_unit<E: de::Error>(self) -> Result<S::Ok, E> {
            self.0.serialize_unit().map_err(err)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<S::Ok, A::Error> {
            let mut out = self.0.serialize_seq(seq.size_hint()).map_err(err)?;
            while seq.next_element_seed(Element(&mut out))?.is_some() {}
            out.end().map_err(err)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<S::Ok, A::Error> {
            let mut out = self.0.serialize_map(map.size_hint()).map_err(err)?;
            // The keys seen: the first few in place (no allocation for the
            // usual object), the rest in a set.
            let mut few: [Cow<'de, str>; LINEAR_KEYS] = std::array::from_fn(|_| Cow::Borrowed(""));
            let mut count = 0;
            let mut many: Option<std::collections::HashSet<Cow<'de, str>>> = None;
            while let Some(key) = map.next_key_seed(Key)? {
                let repeated = match &many {
                    Some(set) => set.contains(&key),
                    None => few[..count].contains(&key),
                };
                if repeated {
                    return Err(err("a repeated key"));
                }
                out.serialize_key(&*key).map_err(err)?;
                map.next_value_seed(Member(&mut out))?;
                match &mut many {
                    Some(set) => {
                        set.insert(key);
                    }
                    None if count < LINEAR_KEYS => {
                        few[count] = key;
                        count += 1;
                    }
                    None => {
                        let mut set: std::collections::HashSet<Cow<'de, str>> = few.iter().cloned().collect();
                        set.insert(key);
                        many = Some(set);
                    }
                }
            }
            out.end().map_err(err)
        }
    }

    /// An array's element, serialized into the array being written.
    struct Element<'a, T>(&'a mut T);

    impl<'de, T: SerializeSeq> DeserializeSeed<'de> for Element<'_, T> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.0.serialize_element(&Next(Cell::new(Some(d)))).map_err(err)
        }
    }

    /// An object's member value, serialized into the object being written.
    struct Member<'a, T>(&'a mut T);

    impl<'de, T: SerializeMap> DeserializeSeed<'de> for Member<'_, T> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.0.serialize_value(&Next(Cell::new(Some(d)))).map_err(err)
        }
    }

    /// An object's key, borrowed from the text when it has no escapes.
    struct Key;

    impl<'de> DeserializeSeed<'de> for Key {
        type Value = Cow<'de, str>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
            d.deserialize_str(Key)
        }
    }

    impl<'de> de::Visitor<'de> for Key {
        type Value = Cow<'de, str>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_owned()))
        }
    }
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

    /// Transcoded text is the text parsed into a `Value` and written
    /// again, byte for byte, compact and pretty; what a `Value` would not
    /// keep as written (a repeated key) or cannot parse is refused.
    #[test]
    fn transcoding_writes_what_a_parsed_value_writes() {
        let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        let many: String = (0..40).map(|i| format!(r#""k{i}":{i}"#)).collect::<Vec<_>>().join(",");
        for text in [
            r#"{"status":"ok","retcode":0,"data":{"online":true,"good":true}}"#,
            r#" { "a" : [ 1 , -2 , 3.5 , 1e3 , -0 , -0.0 , 1E-7 , 18446744073709551615 , 18446744073709551616 , -9223372036854775809 ] } "#,
            r#"{"s":"\u00e9\n\"\u0001\/\ud83d\ude00 é","t":"","u":null,"v":false}"#,
            r#"[]"#,
            r#"{}"#,
            r#"[{},[],{"a":{}}]"#,
            r#""a string""#,
            r#"12"#,
            r#"null"#,
            r#"{"\u0061":1,"b":2}"#,
            &deep,
            &format!("{{{many}}}"),
        ] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&Transcoded(text)).unwrap(), serde_json::to_string(&value).unwrap());
            assert_eq!(
                serde_json::to_string_pretty(&Transcoded(text)).unwrap(),
                serde_json::to_string_pretty(&value).unwrap()
            );
        }
        let repeated_far: String = (0..40).map(|i| format!(r#""k{}":{i}"#, i % 39)).collect::<Vec<_>>().join(",");
        for refused in [
            r#"{"a":1,"a":2}"#.to_owned(),
            r#"{"a":1,"\u0061":2}"#.to_owned(),
            format!("{{{repeated_far}}}"),
            r#"{"a":1"#.to_owned(),
            r#"{"a":1} x"#.to_owned(),
            "".to_owned(),
            format!("{}1{}", "[".repeat(200), "]".repeat(200)),
        ] {
            assert!(serde_json::to_string(&Transcoded(&refused)).is_err(), "{refused}");
        }
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
