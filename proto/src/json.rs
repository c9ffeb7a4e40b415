//! Helpers for reading JSON text without building it as a `Value`.

use serde_json::Value;
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

/// JSON text that serde_json would write back unchanged, written out in
/// one pass: compact (what serializing its `Value` writes) and pretty
/// (what `to_string_pretty` of it writes), the pretty text already escaped
/// as the inside of a JSON string (its quotes as `\"`, its newlines as
/// `\n`). Taken only for text whose every token a `Value` round trip
/// writes as it is: strings without escapes, integers of at most
/// [`CANONICAL_DIGITS`] digits other than `-0`, `true`, `false`, `null`;
/// objects without repeated keys, at most [`CANONICAL_KEYS`] members, and
/// nesting at most [`CANONICAL_DEPTH`] deep. Whitespace between tokens is
/// dropped, as a round trip drops it. `None` for any other text (a float,
/// an escape, a long object, text that is not one JSON value): the caller
/// then takes [`Transcoded`], whose bytes these are where both apply.
pub fn canonical(text: &str) -> Option<Canonical> {
    let mut w = CanonicalWriter {
        text: text.as_bytes(),
        at: 0,
        compact: Vec::with_capacity(text.len()),
        pretty: Vec::with_capacity(text.len() + text.len() / 2 + 16),
        keys: Vec::new(),
    };
    w.value(0)?;
    w.skip_space();
    (w.at == w.text.len()).then_some(Canonical { compact: w.compact, pretty_escaped: w.pretty })
}

/// [`canonical`]'s two writings of one text.
pub struct Canonical {
    /// The compact text (valid JSON, UTF-8).
    pub compact: Vec<u8>,
    /// The pretty text, escaped as the inside of a JSON string.
    pub pretty_escaped: Vec<u8>,
}

/// Integers longer than this are left to [`Transcoded`] (every integer of
/// up to 18 digits fits both `i64` and `u64`, so it reads back as written).
pub const CANONICAL_DIGITS: usize = 18;
/// Objects with more members are left to [`Transcoded`] (each key is
/// compared with the ones before it).
pub const CANONICAL_KEYS: usize = 16;
/// Deeper nesting is left to [`Transcoded`] (which keeps serde_json's limit).
pub const CANONICAL_DEPTH: usize = 64;

struct CanonicalWriter<'a> {
    text: &'a [u8],
    at: usize,
    compact: Vec<u8>,
    pretty: Vec<u8>,
    /// The keys of the objects being read, innermost last.
    keys: Vec<&'a [u8]>,
}

impl<'a> CanonicalWriter<'a> {
    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    /// Both writings of the same bytes.
    fn both(&mut self, bytes: &[u8]) {
        self.compact.extend_from_slice(bytes);
        self.pretty.extend_from_slice(bytes);
    }

    /// A newline and `depth` levels of serde_json's two-space indent, in
    /// the pretty writing (escaped).
    fn newline(&mut self, depth: usize) {
        self.pretty.extend_from_slice(b"\\n");
        for _ in 0..depth {
            self.pretty.extend_from_slice(b"  ");
        }
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        self.skip_space();
        match *self.text.get(self.at)? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => {
                let s = self.string()?;
                self.quoted(s);
                Some(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.integer(),
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Option<()> {
        if !self.text[self.at..].starts_with(word) {
            return None;
        }
        self.at += word.len();
        self.both(word);
        Some(())
    }

    /// An integer that reads back as written; anything else in number
    /// position (a fraction, an exponent, `-0`, a long one, no number) is
    /// refused.
    fn integer(&mut self) -> Option<()> {
        let start = self.at;
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        let digits = self.at;
        while self.text.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        let n = self.at - digits;
        if n == 0 || n > CANONICAL_DIGITS {
            return None;
        }
        // `0` alone; `-0` reads back as `0`, and `01` is not JSON.
        if self.text[digits] == b'0' && (n > 1 || digits > start) {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.text.get(self.at) {
            return None;
        }
        let token = &self.text[start..self.at];
        self.both(token);
        Some(())
    }

    /// A string's contents (after its opening quote, up to its closing
    /// one), when it has no escapes. The text is UTF-8 already; a control
    /// character is not JSON and is refused.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.at += 1;
        let start = self.at;
        loop {
            match *self.text.get(self.at)? {
                b'"' => break,
                b'\\' => return None,
                b if b < 0x20 => return None,
                _ => self.at += 1,
            }
        }
        let s = &self.text[start..self.at];
        self.at += 1;
        Some(s)
    }

    /// A string without escapes in both writings: as it is, compact; with
    /// its quotes escaped, pretty.
    fn quoted(&mut self, s: &[u8]) {
        self.compact.push(b'"');
        self.compact.extend_from_slice(s);
        self.compact.push(b'"');
        self.pretty.extend_from_slice(b"\\\"");
        self.pretty.extend_from_slice(s);
        self.pretty.extend_from_slice(b"\\\"");
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        if self.open(depth, b'{', b'}')? {
            return Some(());
        }
        let first_key = self.keys.len();
        loop {
            self.skip_space();
            if self.text.get(self.at) != Some(&b'"') {
                return None;
            }
            let key = self.string()?;
            if self.keys.len() - first_key >= CANONICAL_KEYS || self.keys[first_key..].contains(&key) {
                return None;
            }
            self.item(self.keys.len() == first_key, depth);
            self.keys.push(key);
            self.quoted(key);
            self.skip_space();
            if self.text.get(self.at) != Some(&b':') {
                return None;
            }
            self.at += 1;
            self.compact.push(b':');
            self.pretty.extend_from_slice(b": ");
            self.value(depth)?;
            if self.next(b'}')? {
                break;
            }
        }
        self.keys.truncate(first_key);
        self.close(depth, b'}');
        Some(())
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if self.open(depth, b'[', b']')? {
            return Some(());
        }
        let mut first = true;
        loop {
            self.item(first, depth);
            first = false;
            self.value(depth)?;
            if self.next(b']')? {
                break;
            }
        }
        self.close(depth, b']');
        Some(())
    }

    /// Open an object or array at `depth` (its bracket is next): true when
    /// it is empty, and so already closed (`{}`, `[]`, as serde_json writes
    /// an empty one).
    fn open(&mut self, depth: usize, open: u8, close: u8) -> Option<bool> {
        if depth > CANONICAL_DEPTH {
            return None;
        }
        self.at += 1;
        self.both(&[open]);
        self.skip_space();
        if self.text.get(self.at) != Some(&close) {
            return Some(false);
        }
        self.at += 1;
        self.both(&[close]);
        Some(true)
    }

    /// Before a member or element: the comma after the one before (none
    /// for the first), then its own line.
    fn item(&mut self, first: bool, depth: usize) {
        if !first {
            self.compact.push(b',');
            self.pretty.push(b',');
        }
        self.newline(depth);
    }

    /// After a member or element: true at the end of its object or array
    /// (`close`, read), false after a comma.
    fn next(&mut self, close: u8) -> Option<bool> {
        self.skip_space();
        let b = *self.text.get(self.at)?;
        self.at += 1;
        match b {
            b',' => Some(false),
            b if b == close => Some(true),
            _ => None,
        }
    }

    /// The end of an object or array that had members: on a line of its
    /// own, at its opening's indent.
    fn close(&mut self, depth: usize, close: u8) {
        self.newline(depth - 1);
        self.both(&[close]);
    }
}

/// The top-level members `names` of the JSON text `text`, judged as
/// `serde_json::from_str::<Value>` judges the text (the same parser, and
/// every value read through the calls a `Value` is read with, so the same
/// errors and limits: numbers past `f64`, nesting past serde_json's 128
/// levels, bad strings and escapes, trailing text), without building the
/// rest: each named member as a `Value` (the last one when a name repeats,
/// as a parsed object keeps it), every other value read and dropped.
/// `Ok(None)`: the text is JSON but not an object.
pub fn members<const N: usize>(text: &str, names: [&str; N]) -> serde_json::Result<Option<[Option<Value>; N]>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let picked = serde::de::DeserializeSeed::deserialize(members::Top(&names), &mut de)?;
    de.end()?;
    Ok(picked)
}

/// [`members`]'s plumbing.
mod members {
    use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;

    /// The text's one value, whose members named in `.0` are kept.
    pub(super) struct Top<'n, const N: usize>(pub(super) &'n [&'n str; N]);

    impl<'de, const N: usize> DeserializeSeed<'de> for Top<'_, N> {
        type Value = Option<[Option<Value>; N]>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de, const N: usize> Visitor<'de> for Top<'_, N> {
        type Value = Option<[Option<Value>; N]>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Dropped.visit_seq(seq).map(|_| None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = [const { None }; N];
            while let Some(at) = map.next_key_seed(Name(self.0))? {
                match at {
                    Some(i) => out[i] = Some(map.next_value::<Value>()?),
                    None => {
                        map.next_value::<Dropped>()?;
                    }
                }
            }
            Ok(Some(out))
        }
    }

    /// A member's name: its place among the names kept, if it is one.
    struct Name<'n, const N: usize>(&'n [&'n str; N]);

    impl<'de, const N: usize> DeserializeSeed<'de> for Name<'_, N> {
        type Value = Option<usize>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            // A name is read as `Value` reads one (as a string).
            d.deserialize_any(self)
        }
    }

    impl<const N: usize> Visitor<'_> for Name<'_, N> {
        type Value = Option<usize>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a member's name")
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(self.0.iter().position(|n| *n == v))
        }
    }

    /// Any value, read as `Value` reads it, and dropped.
    pub(super) struct Dropped;

    impl<'de> serde::Deserialize<'de> for Dropped {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Dropped)
        }
    }

    impl<'de> Visitor<'de> for Dropped {
        type Value = Dropped;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_str<E>(self, _: &str) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_unit<E>(self) -> Result<Dropped, E> {
            Ok(Dropped)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Dropped, A::Error> {
            while seq.next_element::<Dropped>()?.is_some() {}
            Ok(Dropped)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Dropped, A::Error> {
            // Names are strings, read as `Value` reads them, and dropped.
            while map.next_entry::<Dropped, Dropped>()?.is_some() {}
            Ok(Dropped)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What [`members`] stands for: the text parsed into a `Value`, and
    /// the named members of the object it is.
    fn members_by_value<const N: usize>(text: &str, names: [&str; N]) -> Result<Option<[Option<Value>; N]>, ()> {
        let v: Value = serde_json::from_str(text).map_err(|_| ())?;
        Ok(v.as_object().map(|o| names.map(|n| o.get(n).cloned())))
    }

    /// Members are what a parsed `Value` holds, and text is refused where
    /// a `Value` refuses it: repeated and escaped names, members of every
    /// kind, numbers past f64, nesting at and past serde_json's limit, bad
    /// strings and escapes, trailing text, tops other than an object; then
    /// the same corpus mutated at random.
    #[test]
    fn members_are_what_a_parsed_value_holds() {
        const NAMES: [&str; 3] = ["self_id", "post_type", "group_id"];
        let deep = |n: usize| format!(r#"{{"self_id":1,"x":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
        let deep_object = |n: usize| format!(r#"{{"self_id":1,"x":{}1{}}}"#, r#"{"a":"#.repeat(n), "}".repeat(n));
        let deep_member = |n: usize| format!(r#"{{"group_id":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
        let mut corpus: Vec<String> = [
            r#"{"self_id":1,"post_type":"message"}"#,
            r#"{"post_type":"meta_event","self_id":1,"group_id":{"a":[1,2,{"b":null}]}}"#,
            r#"{"self_id":1,"self_id":2,"post_type":"message"}"#,
            r#"{"self_id":1,"self_id":"1"}"#,
            r#"{"post_type":"notice","post_type":null}"#,
            r#"{"self\u005fid":1,"post_type":"meta\u005fevent"}"#,
            r#"{"self_id":1.0,"group_id":1e0}"#,
            r#"{"self_id":-1,"group_id":-0}"#,
            r#"{"self_id":9223372036854775807,"group_id":9223372036854775808}"#,
            r#"{"self_id":-9223372036854775808,"group_id":-9223372036854775809}"#,
            r#"{"self_id":18446744073709551615,"group_id":18446744073709551616}"#,
            r#"{"self_id":null,"post_type":true,"group_id":false}"#,
            r#"{"self_id":[1],"post_type":{"a":1},"group_id":""}"#,
            r#"{}"#,
            r#"{"n":1e400}"#,
            r#"{"self_id":-1e400}"#,
            r#"{"n":1e-400}"#,
            r#"{"n":123456789012345678901234567890}"#,
            r#"{"n":01}"#,
            r#"{"n":1.}"#,
            r#"{"n":-}"#,
            r#"{"s":"\x"}"#,
            r#"{"s":"\ud800"}"#,
            r#"{"post_type":"\ud800\udc00"}"#,
            r#"{"s":"\u12"}"#,
            "{\"s\":\"a\u{1}b\"}",
            "{\"s\u{1}\":1}",
            "{\"post_type\":\"\u{1}\"}",
            r#"{"a":[1,{"b":[null,true,false,"c"]}]}"#,
            r#"{"self_id":1,}"#,
            r#"{"self_id":1} "#,
            r#"{"self_id":1} x"#,
            r#"{"self_id":1}{}"#,
            r#"{"self_id":1 "post_type":"message"}"#,
            r#"{"self_id":1,"post_type":"message""#,
            r#" {"self_id":1}"#,
            r#"{"a":[1,2,]}"#,
            r#"{1:2}"#,
            "[1]",
            "[1,",
            "[]",
            "1",
            "\"s\"",
            "null",
            "true",
            "",
            "nope",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        for n in [1, 100, 126, 127, 128, 129, 200] {
            corpus.extend([deep(n), deep_object(n), deep_member(n)]);
        }
        for text in &corpus {
            assert_eq!(members(text, NAMES).map_err(|_| ()), members_by_value(text, NAMES), "{text}");
        }
        // Both sides of what a `Value` takes are in the corpus.
        assert!(members(&deep(126), NAMES).is_ok() && members(&deep(200), NAMES).is_err());
        assert!(members(&deep_member(126), NAMES).is_ok() && members(&deep_member(200), NAMES).is_err());
        assert!(members(r#"{"n":1e400}"#, NAMES).is_err());
        // Characters of JSON's syntax inserted, replaced and removed at
        // random (xorshift, fixed seed).
        let alphabet: Vec<char> = "{}[],:\"\\ 01-9.eE+tfnul_sefidpostypemtagrou\u{1}é".chars().collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let (mut objects, mut refused) = (0, 0);
        for _ in 0..30_000 {
            let mut chars: Vec<char> = corpus[next(corpus.len())].chars().collect();
            for _ in 0..1 + next(3) {
                let at = next(chars.len() + 1);
                match next(3) {
                    0 => chars.insert(at, alphabet[next(alphabet.len())]),
                    1 if at < chars.len() => chars[at] = alphabet[next(alphabet.len())],
                    _ if at < chars.len() => {
                        chars.remove(at);
                    }
                    _ => {}
                }
            }
            let text: String = chars.into_iter().collect();
            let ours = members(&text, NAMES).map_err(|_| ());
            assert_eq!(ours, members_by_value(&text, NAMES), "{text}");
            match ours {
                Ok(Some(_)) => objects += 1,
                Err(()) => refused += 1,
                Ok(None) => {}
            }
        }
        // The mutations reach objects and refusals alike.
        assert!(objects > 1000 && refused > 1000, "{objects} objects, {refused} refused");
    }

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

    /// What a `Value` round trip writes of `text`: compact, and pretty as
    /// the inside of a JSON string.
    fn round_trip(text: &str) -> (String, String) {
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        let pretty = serde_json::to_string(&serde_json::to_string_pretty(&value).unwrap()).unwrap();
        (serde_json::to_string(&value).unwrap(), pretty[1..pretty.len() - 1].to_owned())
    }

    fn written(c: Canonical) -> (String, String) {
        (String::from_utf8(c.compact).unwrap(), String::from_utf8(c.pretty_escaped).unwrap())
    }

    /// Canonical text is written as a round trip writes it, compact and
    /// pretty (escaped), whitespace and all; every token a round trip
    /// would write otherwise, and every text that is not one JSON value,
    /// is left to the general path.
    #[test]
    fn canonical_text_is_written_as_a_round_trip_writes_it() {
        let deepest = format!("{}1{}", "[".repeat(CANONICAL_DEPTH), "]".repeat(CANONICAL_DEPTH));
        let widest: String = (0..CANONICAL_KEYS).map(|i| format!(r#""k{i}":{i}"#)).collect::<Vec<_>>().join(",");
        for text in [
            r#"{"status":"ok","retcode":0,"data":{"online":true,"good":true}}"#,
            " { \"a\" : [ 1 , -2 , 0 , 123456789012345678 , -123456789012345678 ] ,\n\t\"b\":{ } , \"c\" : [ ] }\r\n",
            "{\"s\":\"é ✓ 😀 / \u{7f}\",\"t\":\"\",\"u\":null,\"v\":false,\"w\":true}",
            r#"[{},[],{"a":{}},[[1],[2,[3]]]]"#,
            r#""a string""#,
            "12",
            "-7",
            "0",
            "null",
            r#"{"a":{"a":{"a":1}},"b":[{"a":1,"b":2}]}"#,
            &deepest,
            &format!("{{{widest}}}"),
        ] {
            let c = canonical(text).unwrap_or_else(|| panic!("taken: {text}"));
            assert_eq!(written(c), round_trip(text), "{text}");
        }
        let deeper = format!("{}1{}", "[".repeat(CANONICAL_DEPTH + 1), "]".repeat(CANONICAL_DEPTH + 1));
        let wider: String = (0..=CANONICAL_KEYS).map(|i| format!(r#""k{i}":{i}"#)).collect::<Vec<_>>().join(",");
        for refused in [
            "1.5".to_owned(),
            "1e3".to_owned(),
            "1E3".to_owned(),
            "-0".to_owned(),
            "01".to_owned(),
            "-".to_owned(),
            "1234567890123456789".to_owned(),
            r#"{"a":"\n"}"#.to_owned(),
            r#"{"a\u0062":1}"#.to_owned(),
            "\"tab\there\"".to_owned(),
            r#"{"a":1,"a":2}"#.to_owned(),
            r#"{"a":1,"b":{"a":1,"a":2}}"#.to_owned(),
            r#"{"a":1"#.to_owned(),
            r#"{"a":1} x"#.to_owned(),
            r#"{"a":1,}"#.to_owned(),
            r#"[1,]"#.to_owned(),
            r#"{"a" 1}"#.to_owned(),
            r#"{1:2}"#.to_owned(),
            "tru".to_owned(),
            "nulls".to_owned(),
            "".to_owned(),
            "   ".to_owned(),
            deeper,
            format!("{{{wider}}}"),
        ] {
            assert!(canonical(&refused).is_none(), "{refused}");
        }
    }

    /// Random values, written compact, pretty and with stray whitespace:
    /// whenever canonical text is taken, its writings are the round trip's;
    /// and text built of canonical tokens only is always taken.
    #[test]
    fn canonical_writings_match_round_trips_of_random_values() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn value(next: &mut impl FnMut() -> u64, depth: u32, plain: bool) -> serde_json::Value {
            use serde_json::Value;
            let pick = next() % if depth > 4 { 5 } else { 8 };
            match pick {
                0 => Value::Null,
                1 => Value::Bool(next().is_multiple_of(2)),
                2 => {
                    let n = (next() % 1_000_000_000_000) as i64 - 500_000_000_000;
                    Value::from(n >> (next() % 40))
                }
                3 if !plain => Value::from((next() % 10_000) as f64 / 8.0),
                4 if !plain => Value::from(["a\"b", "x\ny", "\u{1}", "\\", "é"][(next() % 5) as usize]),
                3 | 4 => Value::from(["", "a", "é ✓", "two words", "😀"][(next() % 5) as usize]),
                5 => Value::Array((0..next() % 4).map(|_| value(next, depth + 1, plain)).collect()),
                _ => Value::Object(
                    (0..next() % 5)
                        .map(|i| (format!("k{}", (i * 7 + next() % 3) % 9), value(next, depth + 1, plain)))
                        .collect(),
                ),
            }
        }
        for round in 0..2000_u32 {
            let plain = round.is_multiple_of(2);
            let v = value(&mut next, 0, plain);
            let compact = serde_json::to_string(&v).unwrap();
            let spaced: String = compact
                .chars()
                .flat_map(|c| {
                    let pad = if matches!(c, ',' | ':' | '[' | '{') { " \n\t" } else { "" };
                    std::iter::once(c).chain(pad.chars())
                })
                .collect();
            for text in [compact.clone(), serde_json::to_string_pretty(&v).unwrap(), spaced] {
                // A string holding `,` or `:` would have been padded inside:
                // the generator's strings hold neither.
                match canonical(&text) {
                    Some(c) => assert_eq!(written(c), round_trip(&text), "{text}"),
                    None => assert!(!plain, "plain text refused: {text}"),
                }
            }
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
