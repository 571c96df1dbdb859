//! Printing: one JSON document with `--json`, a short human rendering otherwise.
//!
//! Owns [`Output`]. Errors and logs go to stderr; results to stdout. It never decides an
//! exit code on its own except for usage errors.

use serde::Serialize;

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

    /// Reports a controlled refusal (nothing written) and returns its exit code.
    pub fn refused(&self, message: &str) -> u8 {
        if self.json {
            println!("{}", serde_json::json!({"status": "refused", "error": message}));
        }
        eprintln!("keel: refused: {message}");
        crate::exit::CONTROLLED
    }
}
