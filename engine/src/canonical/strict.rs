//! A strict JSON reader for every door where outside text enters Keel.
//!
//! Owns [`parse_strict`] and [`StrictJsonError`]. `serde_json` accepts a document whose
//! object repeats a key and keeps the last value, so `{"amount_minor":100,"amount_minor":999999}`
//! reads as 999 999 — what a reviewer sees and what Keel acts on would differ. This reader
//! refuses that, refuses nesting deeper than [`JSON_DEPTH_MAX`], and refuses a number literal
//! that is not exactly an integer but whose nearest `f64` is one (`41.99999999999999999`): a
//! typed reader would silently see 42.
//!
//! Numbers follow the canonical-JSON rule of the parent module: a literal whose decimal
//! value is exactly an integer (`42`, `42.0`, `4.2e1`, `120e-1`) becomes an integer when it
//! fits `i64`/`u64`; any other literal becomes the nearest `f64`.
//!
//! It never repairs input: no trailing commas, no comments, no single quotes, nothing after
//! the document but whitespace. It does no I/O; callers bound the text's size at their door.

use crate::limits::JSON_DEPTH_MAX;
use serde_json::{Map, Number, Value};
use std::fmt;

/// Why a text was refused. `offset` is the byte offset where reading stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} (at byte {offset})")]
pub struct StrictJsonError {
    /// What is wrong.
    pub kind: StrictJsonErrorKind,
    /// Byte offset in the text.
    pub offset: usize,
}

/// The kinds of refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StrictJsonErrorKind {
    /// Not JSON: what was expected.
    Syntax(String),
    /// The text ended inside the document.
    UnexpectedEnd,
    /// An object names the same key twice; `path` is where (`$.a.b`).
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// The object holding it, as a `$`-rooted path.
        path: String,
    },
    /// Arrays and objects nest deeper than [`JSON_DEPTH_MAX`].
    TooDeep,
    /// A literal that is not exactly an integer but reads as one as an `f64`.
    InexactNumber(String),
    /// A literal too large for an `f64`.
    NumberOutOfRange(String),
}

impl fmt::Display for StrictJsonErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(what) => write!(f, "not valid JSON: {what}"),
            Self::UnexpectedEnd => write!(f, "not valid JSON: the text ends inside the document"),
            Self::DuplicateKey { key, path } => write!(f, "duplicate key {key:?} in the object at {path}"),
            Self::TooDeep => write!(f, "JSON nested deeper than {JSON_DEPTH_MAX} levels"),
            Self::InexactNumber(literal) => {
                write!(f, "number {literal} is not exactly an integer, yet reads as one: write it exactly")
            }
            Self::NumberOutOfRange(literal) => write!(f, "number {literal} is out of range"),
        }
    }
}

/// Parses `text` as one JSON document, refusing duplicate keys, nesting deeper than
/// [`JSON_DEPTH_MAX`] and inexact integral numbers.
///
/// ```
/// use engine::canonical::parse_strict;
/// assert_eq!(parse_strict(r#"{"a": 4.2e1}"#).unwrap(), serde_json::json!({"a": 42}));
/// let error = parse_strict(r#"{"amount_minor":100,"amount_minor":999999}"#).unwrap_err();
/// assert!(error.to_string().contains("duplicate key \"amount_minor\""));
/// assert!(parse_strict(r#"{"input": 41.99999999999999999}"#).is_err());
/// ```
///
/// # Errors
///
/// [`StrictJsonError`], naming what is wrong and where.
pub fn parse_strict(text: &str) -> Result<Value, StrictJsonError> {
    let mut reader = Reader { text, bytes: text.as_bytes(), at: 0 };
    reader.skip_whitespace();
    let value = reader.value(0, &mut String::from("$"))?;
    reader.skip_whitespace();
    if reader.at != reader.bytes.len() {
        return Err(reader.error(StrictJsonErrorKind::Syntax("trailing characters after the document".into())));
    }
    Ok(value)
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, kind: StrictJsonErrorKind) -> StrictJsonError {
        StrictJsonError { kind, offset: self.at }
    }

    fn syntax(&self, what: &str) -> StrictJsonError {
        if self.at >= self.bytes.len() {
            return self.error(StrictJsonErrorKind::UnexpectedEnd);
        }
        self.error(StrictJsonErrorKind::Syntax(what.to_owned()))
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect_literal(&mut self, literal: &str, value: Value) -> Result<Value, StrictJsonError> {
        if self.text[self.at..].starts_with(literal) {
            self.at += literal.len();
            Ok(value)
        } else {
            Err(self.syntax(&format!("expected {literal}")))
        }
    }

    /// One value; `path` names where it is, for duplicate-key errors.
    fn value(&mut self, depth: usize, path: &mut String) -> Result<Value, StrictJsonError> {
        match self.peek() {
            None => Err(self.error(StrictJsonErrorKind::UnexpectedEnd)),
            Some(b'{') => self.object(depth + 1, path),
            Some(b'[') => self.array(depth + 1, path),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.expect_literal("true", Value::Bool(true)),
            Some(b'f') => self.expect_literal("false", Value::Bool(false)),
            Some(b'n') => self.expect_literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.syntax("expected a value")),
        }
    }

    fn object(&mut self, depth: usize, path: &mut String) -> Result<Value, StrictJsonError> {
        if depth > JSON_DEPTH_MAX {
            return Err(self.error(StrictJsonErrorKind::TooDeep));
        }
        self.at += 1; // '{'
        let mut map = Map::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a string key"));
            }
            let key_at = self.at;
            let key = self.string()?;
            if map.contains_key(&key) {
                return Err(StrictJsonError {
                    kind: StrictJsonErrorKind::DuplicateKey { key, path: path.clone() },
                    offset: key_at,
                });
            }
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.syntax("expected ':' after an object key"));
            }
            self.at += 1;
            self.skip_whitespace();
            let outer = path.len();
            push_key(path, &key);
            let value = self.value(depth, path)?;
            path.truncate(outer);
            map.insert(key, value);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.syntax("expected ',' or '}' in an object")),
            }
        }
    }

    fn array(&mut self, depth: usize, path: &mut String) -> Result<Value, StrictJsonError> {
        if depth > JSON_DEPTH_MAX {
            return Err(self.error(StrictJsonErrorKind::TooDeep));
        }
        self.at += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            let outer = path.len();
            path.push_str(&format!("[{}]", items.len()));
            items.push(self.value(depth, path)?);
            path.truncate(outer);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.syntax("expected ',' or ']' in an array")),
            }
        }
    }

    /// A string token, decoded by serde_json (escapes, surrogate pairs, control characters).
    fn string(&mut self) -> Result<String, StrictJsonError> {
        let start = self.at;
        let mut at = start + 1;
        loop {
            match self.bytes.get(at) {
                None => {
                    self.at = at;
                    return Err(self.error(StrictJsonErrorKind::UnexpectedEnd));
                }
                Some(b'\\') => at += 2,
                Some(b'"') => break,
                Some(_) => at += 1,
            }
        }
        let token = &self.text[start..=at];
        let decoded = serde_json::from_str::<String>(token).map_err(|e| StrictJsonError {
            kind: StrictJsonErrorKind::Syntax(format!("bad string: {e}")),
            offset: start,
        })?;
        self.at = at + 1;
        Ok(decoded)
    }

    /// A number token: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Result<Value, StrictJsonError> {
        let start = self.at;
        let digits = |reader: &mut Self| {
            let from = reader.at;
            while matches!(reader.peek(), Some(b'0'..=b'9')) {
                reader.at += 1;
            }
            reader.at - from
        };
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let int_start = self.at;
        let int_len = digits(self);
        if int_len == 0 || (int_len > 1 && self.bytes[int_start] == b'0') {
            return Err(self.syntax("bad number: expected digits without a leading zero"));
        }
        let int_part = &self.text[int_start..int_start + int_len];
        let mut frac_part = "";
        if self.peek() == Some(b'.') {
            self.at += 1;
            let frac_start = self.at;
            if digits(self) == 0 {
                return Err(self.syntax("bad number: expected digits after '.'"));
            }
            frac_part = &self.text[frac_start..self.at];
        }
        let mut exponent: i64 = 0;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let exponent_negative = match self.peek() {
                Some(b'-') => {
                    self.at += 1;
                    true
                }
                Some(b'+') => {
                    self.at += 1;
                    false
                }
                _ => false,
            };
            let exp_start = self.at;
            if digits(self) == 0 {
                return Err(self.syntax("bad number: expected digits in the exponent"));
            }
            // Saturate absurd exponents: beyond ±10^6 the value is 0, integral, or out of
            // range whatever the digits are, and the checks below see that.
            let magnitude: i64 = self.text[exp_start..self.at].parse().unwrap_or(1_000_000).min(1_000_000);
            exponent = if exponent_negative { -magnitude } else { magnitude };
        }
        let literal = &self.text[start..self.at];
        exact_number(literal, negative, int_part, frac_part, exponent)
            .map_err(|kind| StrictJsonError { kind, offset: start })
    }
}

fn push_key(path: &mut String, key: &str) {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&serde_json::to_string(key).expect("serializing a &str to JSON cannot fail"));
        path.push(']');
    }
}

/// The value of a number literal: an integer when its decimal value is exactly one that fits
/// `i64`/`u64`, else the nearest `f64` — refused when that `f64` is integral although the
/// literal is not.
fn exact_number(
    literal: &str,
    negative: bool,
    int_part: &str,
    frac_part: &str,
    exponent: i64,
) -> Result<Value, StrictJsonErrorKind> {
    // The literal is ±0.D × 10^… ; write it as ±D × 10^scale with D free of trailing zeros.
    let all_digits: String = format!("{int_part}{frac_part}");
    let significant = all_digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    let scale = exponent - i64::try_from(frac_part.len()).unwrap_or(i64::MAX)
        + i64::try_from(significant.len() - trimmed.len()).unwrap_or(0);
    if trimmed.is_empty() {
        return Ok(Value::Number(Number::from(0u64))); // Every spelling of zero, -0 included.
    }
    if scale >= 0 {
        // Integral. Exact when the integer has at most 20 digits (u64::MAX has 20).
        let length = i64::try_from(trimmed.len()).unwrap_or(i64::MAX).saturating_add(scale);
        if length <= 20 {
            let text = format!("{trimmed}{}", "0".repeat(usize::try_from(scale).unwrap_or(0)));
            if negative {
                if let Ok(value) = format!("-{text}").parse::<i64>() {
                    return Ok(Value::Number(Number::from(value)));
                }
            } else if let Ok(value) = text.parse::<u64>() {
                return Ok(Value::Number(Number::from(value)));
            }
        }
        // Too large for a 64-bit integer: the nearest f64, as serde_json reads it.
        return float(literal).map(Value::Number);
    }
    let number = float(literal)?;
    if number.as_f64().is_some_and(|f| f.fract() == 0.0) {
        return Err(StrictJsonErrorKind::InexactNumber(literal.to_owned()));
    }
    Ok(Value::Number(number))
}

fn float(literal: &str) -> Result<Number, StrictJsonErrorKind> {
    literal
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .ok_or_else(|| StrictJsonErrorKind::NumberOutOfRange(literal.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(text: &str) -> StrictJsonErrorKind {
        parse_strict(text).expect_err("the text must be refused").kind
    }

    #[test]
    fn reads_what_serde_json_reads_for_well_formed_documents() {
        for text in [
            r#"{"a":[1,2.5,-3,"x\u00e9\ud83d\ude00",true,false,null],"b":{"c":{}}}"#,
            "[]",
            "  \"just a string\"  ",
            "-12.75e-3",
            r#"{"":1,"sp ace":"tab\tok"}"#,
            "18446744073709551615",
            "-9223372036854775808",
            "1e400000000000000000000000",
        ] {
            if text.starts_with("1e4") {
                assert!(matches!(kind(text), StrictJsonErrorKind::NumberOutOfRange(_)));
                continue;
            }
            let strict = parse_strict(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let loose: Value = serde_json::from_str(text).expect("valid JSON");
            assert_eq!(crate::canonical::to_string(&strict), crate::canonical::to_string(&loose), "{text}");
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth_and_named() {
        let error = parse_strict(r#"{"amount_minor":100,"amount_minor":999999}"#).expect_err("duplicate");
        assert_eq!(error.kind, StrictJsonErrorKind::DuplicateKey { key: "amount_minor".into(), path: "$".into() });
        assert_eq!(error.offset, 20);
        assert_eq!(
            kind(r#"{"a":[{"x":1},{"b":{"k":1,"k":2}}]}"#),
            StrictJsonErrorKind::DuplicateKey { key: "k".into(), path: "$.a[1].b".into() }
        );
        // The same key spelled with an escape is the same key.
        assert!(matches!(kind(r#"{"a":1,"\u0061":2}"#), StrictJsonErrorKind::DuplicateKey { .. }));
        // Equal keys in sibling objects are fine.
        assert!(parse_strict(r#"[{"a":1},{"a":2}]"#).is_ok());
    }

    #[test]
    fn integral_spellings_become_integers_and_inexact_ones_are_refused() {
        assert_eq!(parse_strict("42.0").expect("integral"), json!(42));
        assert_eq!(parse_strict("4.2e1").expect("integral"), json!(42));
        assert_eq!(parse_strict("120e-1").expect("integral"), json!(12));
        assert_eq!(parse_strict("-0.0").expect("zero"), json!(0));
        assert!(parse_strict("42").expect("integer").is_u64());
        assert_eq!(parse_strict("0.5").expect("float"), json!(0.5));
        assert_eq!(parse_strict("41.5").expect("float"), json!(41.5));
        assert!(matches!(kind("41.99999999999999999"), StrictJsonErrorKind::InexactNumber(_)));
        assert!(matches!(kind(r#"{"input": 41.99999999999999999}"#), StrictJsonErrorKind::InexactNumber(_)));
        assert!(matches!(kind("1.0000000000000000001e3"), StrictJsonErrorKind::InexactNumber(_)));
        // 2^64 is integral but too large for u64: the nearest f64, like serde_json.
        assert!(parse_strict("18446744073709551616").expect("large").is_f64());
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(JSON_DEPTH_MAX), "]".repeat(JSON_DEPTH_MAX));
        assert!(parse_strict(&deep).is_ok());
        let deeper = format!("{}{}", "[".repeat(JSON_DEPTH_MAX + 1), "]".repeat(JSON_DEPTH_MAX + 1));
        assert_eq!(kind(&deeper), StrictJsonErrorKind::TooDeep);
        let objects = format!("{}1{}", r#"{"a":"#.repeat(JSON_DEPTH_MAX + 1), "}".repeat(JSON_DEPTH_MAX + 1));
        assert_eq!(kind(&objects), StrictJsonErrorKind::TooDeep);
    }

    #[test]
    fn malformed_text_is_refused_never_repaired() {
        for text in [
            "",
            "{",
            "[1,]",
            r#"{"a":1,}"#,
            "{'a':1}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "tru",
            "nul",
            "[1] x",
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            "\"unterminated",
            "\"bad \\q escape\"",
            "\"raw \u{1} control\"",
            "+1",
            "// comment\n1",
            "NaN",
            "Infinity",
        ] {
            assert!(parse_strict(text).is_err(), "{text:?} must be refused");
        }
        assert_eq!(kind("[1,2"), StrictJsonErrorKind::UnexpectedEnd);
    }
}
