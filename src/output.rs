//! Printing: one JSON document with `--json`, a short human rendering otherwise.
//!
//! Owns [`Output`]. Errors and logs go to stderr; results to stdout. It never decides an
//! exit code on its own except for usage errors.

use serde::Serialize;
use serde_json::Value;

/// Renames every object field `key` in `document` to `intent_key`: the one name Keel's JSON
/// outputs give an intent key, whatever the engine type or stored payload calls it.
pub fn name_intent_keys(mut document: Value) -> Value {
    rename_keys(&mut document);
    document
}

fn rename_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(key) = map.remove("key") {
                map.insert("intent_key".to_owned(), key);
            }
            map.values_mut().for_each(rename_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(rename_keys),
        _ => {}
    }
}

/// Where and how results are printed.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// Print JSON.
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON (with `--json`) or calls `human` to print the rendering.
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce()) {
        if self.json {
            match serde_json::to_string_pretty(value) {
                Ok(text) => println!("{text}"),
                Err(error) => eprintln!("keel: cannot render JSON: {error}"),
            }
        } else {
            human();
        }
    }

    /// Reports a bad invocation and returns the usage exit code.
    pub fn usage_error(&self, message: &str) -> u8 {
        if self.json {
            println!("{}", serde_json::json!({"status": "usage_error", "error": message}));
        }
        eprintln!("keel: {message}");
        crate::exit::USAGE
    }

    /// Reports an internal error and returns its exit code.
    pub fn internal_error(&self, message: &str) -> u8 {
        if self.json {
            println!("{}", serde_json::json!({"status": "error", "error": message}));
        }
        eprintln!("keel: error: {message}");
        crate::exit::INTERNAL
    }

    /// Reports an interruption by the caller and returns its exit code.
    pub fn interrupted(&self, message: &str) -> u8 {
        if self.json {
            println!("{}", serde_json::json!({"status": "interrupted", "error": message}));
        }
        eprintln!("keel: {message}");
        crate::exit::INTERRUPTED
    }

    /// Reports a controlled refusal (nothing written) and returns its exit code.
    pub fn refused(&self, message: &str) -> u8 {
        if self.json {
            println!("{}", serde_json::json!({"status": "refused", "error": message}));
        }
        eprintln!("keel: refused: {message}");
        crate::exit::CONTROLLED
    }
}
