//! JSON text as Node's `JSON.parse` sees it (V8 11.3, Node 20): the error
//! message it throws for text it refuses, word for word, and for text it
//! accepts the nesting depth and whether the top value is an object.
//!
//! serde_json stops at 128 levels and words its errors its own way; the
//! Node server's texts quote V8 (`invalid JSON: Unexpected token 'h', "this
//! is not json" is not valid JSON`), so a frame we refuse is described as V8
//! would. The scan is iterative (no recursion, whatever the depth) and runs
//! only on text serde_json could not take, so it costs nothing on the way a
//! good answer takes. Positions count UTF-16 code units, as V8's do.

/// What V8 accepts: how deep it nests, and whether it is an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) top_is_object: bool,
    /// Deepest nesting of arrays and objects (0 for a scalar).
    pub(crate) depth: usize,
}

/// The messages of V8 that carry a position (`… at position N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    UnterminatedString,
    ExpectedPropNameOrRBrace,
    ExpectedCommaOrRBrack,
    ExpectedCommaOrRBrace,
    ExpectedDoubleQuotedPropertyName,
    ExponentPartMissingNumber,
    ExpectedColonAfterPropertyName,
    UnterminatedFractionalNumber,
    UnexpectedNonWhiteSpaceCharacter,
    BadEscapedCharacter,
    BadControlCharacter,
    BadUnicodeEscape,
    NoNumberAfterMinusSign,
}

impl At {
    fn text(self) -> &'static str {
        match self {
            At::UnterminatedString => "Unterminated string in JSON",
            At::ExpectedPropNameOrRBrace => "Expected property name or '}' in JSON",
            At::ExpectedCommaOrRBrack => "Expected ',' or ']' after array element in JSON",
            At::ExpectedCommaOrRBrace => "Expected ',' or '}' after property value in JSON",
            At::ExpectedDoubleQuotedPropertyName => "Expected double-quoted property name in JSON",
            At::ExponentPartMissingNumber => "Exponent part is missing a number in JSON",
            At::ExpectedColonAfterPropertyName => "Expected ':' after property name in JSON",
            At::UnterminatedFractionalNumber => "Unterminated fractional number in JSON",
            At::UnexpectedNonWhiteSpaceCharacter => "Unexpected non-whitespace character after JSON",
            At::BadEscapedCharacter => "Bad escaped character in JSON",
            At::BadControlCharacter => "Bad control character in string literal in JSON",
            At::BadUnicodeEscape => "Bad Unicode escape in JSON",
            At::NoNumberAfterMinusSign => "No number after minus sign in JSON",
        }
    }
}

/// Where and why the scan stopped.
#[derive(Debug)]
enum Stop {
    /// A message with a position (a byte offset here).
    At(At, usize),
    /// V8's "unexpected character" at this byte offset (the end of the
    /// text: "Unexpected end of JSON input").
    Unexpected(usize),
}

/// `Ok` with the shape of text V8's `JSON.parse` accepts, or `Err` with the
/// message it throws.
pub(crate) fn check(text: &str) -> Result<Shape, String> {
    scan(text.as_bytes()).map_err(|stop| message(text, stop))
}

#[derive(Clone, Copy)]
enum Open {
    Object,
    Array,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn scan(s: &[u8]) -> Result<Shape, Stop> {
    let mut i = 0usize;
    let mut stack: Vec<Open> = Vec::new();
    let mut depth = 0usize;
    let skip_ws = |i: &mut usize| {
        while *i < s.len() && is_ws(s[*i]) {
            *i += 1;
        }
    };
    skip_ws(&mut i);
    let top_is_object = s.get(i) == Some(&b'{');
    'value: loop {
        skip_ws(&mut i);
        match s.get(i).copied() {
            None => return Err(Stop::Unexpected(i)),
            Some(b'"') => i = string(s, i)?,
            Some(b'-' | b'0'..=b'9') => i = number(s, i)?,
            Some(b'{') => {
                i += 1;
                stack.push(Open::Object);
                depth = depth.max(stack.len());
                skip_ws(&mut i);
                if s.get(i) == Some(&b'}') {
                    i += 1;
                    stack.pop();
                } else {
                    if s.get(i) != Some(&b'"') {
                        return Err(Stop::At(At::ExpectedPropNameOrRBrace, i));
                    }
                    i = property_name(s, i, &skip_ws)?;
                    continue 'value;
                }
            }
            Some(b'[') => {
                i += 1;
                stack.push(Open::Array);
                depth = depth.max(stack.len());
                skip_ws(&mut i);
                if s.get(i) == Some(&b']') {
                    i += 1;
                    stack.pop();
                } else {
                    continue 'value;
                }
            }
            Some(b't') => i = literal(s, i, b"true")?,
            Some(b'f') => i = literal(s, i, b"false")?,
            Some(b'n') => i = literal(s, i, b"null")?,
            Some(_) => return Err(Stop::Unexpected(i)),
        }
        // A value ended: close what it ends, or go on to the next value.
        loop {
            let Some(open) = stack.last().copied() else {
                break 'value;
            };
            skip_ws(&mut i);
            match (open, s.get(i).copied()) {
                (Open::Object, Some(b',')) => {
                    i += 1;
                    skip_ws(&mut i);
                    if s.get(i) != Some(&b'"') {
                        return Err(Stop::At(At::ExpectedDoubleQuotedPropertyName, i));
                    }
                    i = property_name(s, i, &skip_ws)?;
                    continue 'value;
                }
                (Open::Object, Some(b'}')) | (Open::Array, Some(b']')) => {
                    i += 1;
                    stack.pop();
                }
                (Open::Array, Some(b',')) => {
                    i += 1;
                    continue 'value;
                }
                (Open::Object, _) => return Err(Stop::At(At::ExpectedCommaOrRBrace, i)),
                (Open::Array, _) => return Err(Stop::At(At::ExpectedCommaOrRBrack, i)),
            }
        }
    }
    skip_ws(&mut i);
    if i < s.len() {
        return Err(Stop::At(At::UnexpectedNonWhiteSpaceCharacter, i));
    }
    Ok(Shape { top_is_object, depth })
}

/// A property name at `i` (a `"`) and its colon; the offset after the colon.
fn property_name(s: &[u8], i: usize, skip_ws: &impl Fn(&mut usize)) -> Result<usize, Stop> {
    let mut i = string(s, i)?;
    skip_ws(&mut i);
    if s.get(i) != Some(&b':') {
        return Err(Stop::At(At::ExpectedColonAfterPropertyName, i));
    }
    Ok(i + 1)
}

/// A string starting at `i` (a `"`); the offset after its closing quote.
fn string(s: &[u8], mut i: usize) -> Result<usize, Stop> {
    i += 1;
    loop {
        let Some(&b) = s.get(i) else {
            return Err(Stop::At(At::UnterminatedString, i));
        };
        match b {
            b'"' => return Ok(i + 1),
            b'\\' => {
                i += 1;
                match s.get(i).copied() {
                    None => return Err(Stop::Unexpected(i)),
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 1,
                    Some(b'u') => {
                        for k in 1..=4 {
                            if !s.get(i + k).is_some_and(u8::is_ascii_hexdigit) {
                                return Err(Stop::At(At::BadUnicodeEscape, i + k));
                            }
                        }
                        i += 5;
                    }
                    // V8 reads one UTF-16 unit: beyond Latin-1 it is an
                    // unexpected character, within it a bad escape.
                    Some(c) if c >= 0xc4 => return Err(Stop::Unexpected(i)),
                    Some(_) => return Err(Stop::At(At::BadEscapedCharacter, i)),
                }
            }
            0..=0x1f => return Err(Stop::At(At::BadControlCharacter, i)),
            _ => i += 1,
        }
    }
}

/// A number starting at `i`; the offset after it.
fn number(s: &[u8], mut i: usize) -> Result<usize, Stop> {
    let digit = |i: usize| s.get(i).is_some_and(u8::is_ascii_digit);
    if s.get(i) == Some(&b'-') {
        i += 1;
        if !digit(i) {
            return Err(Stop::At(At::NoNumberAfterMinusSign, i));
        }
    }
    if s.get(i) == Some(&b'0') {
        i += 1;
        if digit(i) {
            // A leading zero: V8's "Unexpected number".
            return Err(Stop::Unexpected(i));
        }
    } else {
        while digit(i) {
            i += 1;
        }
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        if !digit(i) {
            return Err(Stop::At(At::UnterminatedFractionalNumber, i));
        }
        while digit(i) {
            i += 1;
        }
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digit(i) {
            return Err(Stop::At(At::ExponentPartMissingNumber, i));
        }
        while digit(i) {
            i += 1;
        }
    }
    Ok(i)
}

/// `true`, `false` or `null` at `i` (its first letter matched).
fn literal(s: &[u8], i: usize, word: &[u8]) -> Result<usize, Stop> {
    for (k, &w) in word.iter().enumerate().skip(1) {
        if s.get(i + k) != Some(&w) {
            return Err(Stop::Unexpected((i + k).min(s.len())));
        }
    }
    Ok(i + word.len())
}

/// V8's context: at most this many UTF-16 units either side of the token,
/// for texts of at least twice that plus one.
const MAX_CONTEXT: usize = 10;

fn utf16_offset(text: &str, byte: usize) -> usize {
    text.get(..byte).map_or(byte, |head| head.encode_utf16().count())
}

fn message(text: &str, stop: Stop) -> String {
    match stop {
        Stop::At(at, byte) => format!("{} at position {}", at.text(), utf16_offset(text, byte)),
        Stop::Unexpected(byte) => {
            let Some(c) = text.get(byte..).and_then(|rest| rest.chars().next()) else {
                return "Unexpected end of JSON input".to_owned();
            };
            let pos = utf16_offset(text, byte);
            match c {
                '"' => format!("Unexpected string in JSON at position {pos}"),
                '-' | '0'..='9' => format!("Unexpected number in JSON at position {pos}"),
                _ if matches!(text, "[object Object]" | "undefined" | "Infinity" | "NaN") => {
                    format!("\"{text}\" is not valid JSON")
                }
                _ => unexpected_token(text, c, pos),
            }
        }
    }
}

/// `Unexpected token 'c', "…" is not valid JSON`, with V8's ellipses.
fn unexpected_token(text: &str, c: char, pos: usize) -> String {
    let units: Vec<u16> = text.encode_utf16().collect();
    let len = units.len();
    let part = |from: usize, to: usize| String::from_utf16_lossy(&units[from.min(len)..to.min(len)]);
    if len < 2 * MAX_CONTEXT + 1 {
        format!("Unexpected token '{c}', \"{text}\" is not valid JSON")
    } else if pos < MAX_CONTEXT {
        format!("Unexpected token '{c}', \"{}\"... is not valid JSON", part(0, pos + MAX_CONTEXT))
    } else if pos < len - MAX_CONTEXT {
        format!("Unexpected token '{c}', ...\"{}\"... is not valid JSON", part(pos - MAX_CONTEXT, pos + MAX_CONTEXT))
    } else {
        format!("Unexpected token '{c}', ...\"{}\" is not valid JSON", part(pos - MAX_CONTEXT, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        check(text).expect_err(text)
    }

    /// V8's own texts (its message tests and what Node 20 prints).
    #[test]
    fn refusals_are_worded_as_v8_words_them() {
        let cases = [
            ("this is not json", "Unexpected token 'h', \"this is not json\" is not valid JSON"),
            ("Bad string", "Unexpected token 'B', \"Bad string\" is not valid JSON"),
            ("/", "Unexpected token '/', \"/\" is not valid JSON"),
            ("undefined", "\"undefined\" is not valid JSON"),
            ("NaN", "\"NaN\" is not valid JSON"),
            ("Infinity", "\"Infinity\" is not valid JSON"),
            ("[object Object]", "\"[object Object]\" is not valid JSON"),
            ("", "Unexpected end of JSON input"),
            ("   ", "Unexpected end of JSON input"),
            ("{\"status\":", "Unexpected end of JSON input"),
            ("tr", "Unexpected end of JSON input"),
            ("{", "Expected property name or '}' in JSON at position 1"),
            ("{ 1", "Expected property name or '}' in JSON at position 2"),
            ("{\"a\"", "Expected ':' after property name in JSON at position 4"),
            ("{\"a\":1", "Expected ',' or '}' after property value in JSON at position 6"),
            ("{\"a\":1,}", "Expected double-quoted property name in JSON at position 7"),
            ("[1 2]", "Expected ',' or ']' after array element in JSON at position 3"),
            ("{\"a\": 0.bs}", "Unterminated fractional number in JSON at position 8"),
            ("{\"a\": 3}a", "Unexpected non-whitespace character after JSON at position 8"),
            ("{\"b\" : \"\\a\"}", "Bad escaped character in JSON at position 9"),
            ("\"a\u{8}z\"", "Bad control character in string literal in JSON at position 2"),
            ("[\"\\t\\u", "Bad Unicode escape in JSON at position 6"),
            ("-", "No number after minus sign in JSON at position 1"),
            ("1e", "Exponent part is missing a number in JSON at position 2"),
            ("01", "Unexpected number in JSON at position 1"),
            ("{\"a\":\"abc", "Unterminated string in JSON at position 9"),
            ("tru1", "Unexpected number in JSON at position 3"),
            ("[1,]", "Unexpected token ']', \"[1,]\" is not valid JSON"),
        ];
        for (text, expected) in cases {
            assert_eq!(err(text), expected, "{text:?}");
        }
    }

    #[test]
    fn long_texts_get_v8s_context() {
        assert_eq!(err("x23456789012345678901234567890"), "Unexpected token 'x', \"x234567890\"... is not valid JSON");
        assert_eq!(
            err("{\"aaaaaaaaaaaaaa\": 1, bbbbbbbbbbbbbbbbbbbbbbbbbbbbb: 2}"),
            "Expected double-quoted property name in JSON at position 22"
        );
        assert_eq!(
            err("[1, 2, 3, 4, 5, 6, 7, x, 9, 10, 11, 12, 13]"),
            "Unexpected token 'x', ...\" 5, 6, 7, x, 9, 10, \"... is not valid JSON"
        );
        assert_eq!(
            err("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, x]"),
            "Unexpected token 'x', ...\", 10, 11, x]\" is not valid JSON"
        );
        // Positions count UTF-16 units.
        assert_eq!(err("[\"😀\" 1]"), "Expected ',' or ']' after array element in JSON at position 6");
    }

    #[test]
    fn accepted_text_has_a_shape() {
        assert_eq!(check(" {\"a\":[1,{}]} "), Ok(Shape { top_is_object: true, depth: 3 }));
        assert_eq!(check("[]"), Ok(Shape { top_is_object: false, depth: 1 }));
        assert_eq!(check("-0.5e+3"), Ok(Shape { top_is_object: false, depth: 0 }));
        let deep = format!("{{\"data\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(check(&deep), Ok(Shape { top_is_object: true, depth: 100_001 }));
        assert!(check("\"\\u00e9\\n😀\"").is_ok());
    }
}
