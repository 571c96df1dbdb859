//! Canonical JSON and payload fingerprints.
//!
//! Owns the one byte representation Keel hashes: object keys sorted by code point, numbers
//! normalised so that `42`, `42.0` and `4.2e1` give the same bytes, no insignificant
//! whitespace. String case and whitespace, array order and `null` stay significant.
//! It must never lowercase, trim or reorder anything a typed reader would see as different.
//!
//! Its submodule `strict` owns [`parse_strict`], the reader every outside JSON door uses
//! (duplicate keys, excessive nesting and inexact integers refused), and `typed` owns
//! [`decode`], the typed reading after it (a struct read from an object only, never from the
//! array serde would also take).

mod strict;
mod typed;

pub use strict::{StrictJsonError, StrictJsonErrorKind, parse_strict};
pub use typed::decode;

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Returns the canonical JSON text of `value`.
///
/// ```
/// use serde_json::json;
/// let a = engine::canonical::to_string(&json!({"b": 42, "a": [1, null]}));
/// let b = engine::canonical::to_string(&json!({"a": [1.0, null], "b": 4.2e1}));
/// assert_eq!(a, b);
/// assert_eq!(a, r#"{"a":[1,null],"b":42}"#);
/// ```
pub fn to_string(value: &Value) -> String {
    let mut out = String::with_capacity(64);
    write_value(&mut out, value);
    out
}

/// Lowercase hex SHA-256 of the canonical JSON of `value`: the payload fingerprint.
pub fn fingerprint(value: &Value) -> String {
    sha256_hex(to_string(value).as_bytes())
}

/// Lowercase hex SHA-256 of raw bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // serde_json's map may preserve insertion order depending on features; sort
            // explicitly by code point so the bytes never depend on it.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.chars().cmp(b.0.chars()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// Integers print as integers; a float with an integral value that an f64 holds exactly
/// prints as that integer, so `42`, `42.0` and `4.2e1` agree. Other floats print in Rust's
/// shortest round-trip form, which is a function of the f64 value alone.
fn write_number(out: &mut String, n: &serde_json::Number) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        const EXACT_INTEGER_MAX: f64 = 9_007_199_254_740_992.0; // 2^53
        if f == 0.0 {
            out.push('0'); // -0.0 and 0.0 mean the same amount.
        } else if f.fract() == 0.0 && f.abs() <= EXACT_INTEGER_MAX {
            let _ = write!(out, "{}", f as i64);
        } else {
            let _ = write!(out, "{f:?}");
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    // serde_json's string escaping is deterministic (it escapes only what JSON requires),
    // so reuse it rather than hand-roll escapes.
    out.push_str(&serde_json::to_string(s).expect("serializing a &str to JSON cannot fail"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(text: &str) -> String {
        to_string(&serde_json::from_str(text).expect("test JSON is valid"))
    }

    #[test]
    fn numbers_that_mean_the_same_give_the_same_bytes() {
        assert_eq!(canon("42"), "42");
        assert_eq!(canon("42.0"), "42");
        assert_eq!(canon("4.2e1"), "42");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("0.5"), "0.5");
        assert_eq!(canon("5e-1"), "0.5");
        assert_ne!(canon("42.5"), canon("42"));
    }

    #[test]
    fn key_order_is_irrelevant_and_whitespace_is_dropped() {
        assert_eq!(canon(r#"{ "b" : 1, "a" : 2 }"#), r#"{"a":2,"b":1}"#);
        assert_eq!(canon(r#"{"a":{"z":1,"y":2}}"#), r#"{"a":{"y":2,"z":1}}"#);
    }

    #[test]
    fn case_whitespace_array_order_and_null_stay_significant() {
        assert_ne!(canon(r#"{"a":"X"}"#), canon(r#"{"a":"x"}"#));
        assert_ne!(canon(r#"{"a":"x "}"#), canon(r#"{"a":"x"}"#));
        assert_ne!(canon("[1,2]"), canon("[2,1]"));
        assert_ne!(canon(r#"{"a":null}"#), canon("{}"));
        assert_ne!(canon(r#"{"a":null}"#), canon(r#"{"a":0}"#));
    }

    #[test]
    fn keys_sort_by_code_point_not_by_utf16() {
        // U+FF5E sorts after U+1F600 in UTF-16 order but before it by code point.
        assert_eq!(canon(r#"{"😀":1,"～":2}"#), "{\"～\":2,\"😀\":1}");
    }

    #[test]
    fn fingerprint_is_lowercase_hex_sha256() {
        let f = fingerprint(&json!({"amount_minor": 4900}));
        assert_eq!(f.len(), 64);
        assert!(f.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_eq!(f, fingerprint(&json!({"amount_minor": 4900.0})));
    }
}
