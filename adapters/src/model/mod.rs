//! Model transports: the engine's [`ModelTransport`] over the real wire formats.
//!
//! - [`anthropic`] — the **Anthropic Messages** format: parsing a response object, building a
//!   request, and [`anthropic::AnthropicClient`] over HTTP (`x-api-key`, `anthropic-version`).
//! - [`openai`] — the **OpenAI Chat Completions** format: parsing (tool-call arguments are a
//!   JSON *string*, kept raw), building, and [`openai::OpenAiClient`] (`Authorization: Bearer`).
//! - [`scripted`] — [`scripted::ScriptedTransport`], which replays a transcript file: a JSON
//!   array of complete responses in either format (detected per entry), plus two scripted
//!   conditions, `{"keel_scripted": "hang"}` and `{"keel_scripted": "unavailable"}`.
//! - [`http`] — what both HTTP clients share: [`http::HttpConfig`] (base URL, model, key as an
//!   [`engine::provider::Secret`], explicit timeouts) and the mapping of HTTP failures to
//!   [`TransportError`]s.
//!
//! Also [`TokioTimer`], the real [`Timer`] the binary hands the agent loop.
//!
//! The API key is read from the environment by the binary and passed in; nothing here reads
//! the environment, and no error, log line or `Debug` output contains the key.
//!
//! ```
//! use adapters::model::scripted::{ScriptedTransport, Transcript};
//! let transcript = Transcript::parse(r#"[{"keel_scripted": "unavailable"}]"#).unwrap();
//! let transport = ScriptedTransport::new(transcript);
//! assert_eq!(transport.calls_made(), 0);
//! ```

pub mod anthropic;
pub mod http;
pub mod openai;
pub mod scripted;

use agent::{ModelResponse, ModelTransport, Timer, TransportError};
use engine::clock::{Clock, ms_between};
use engine::provider::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The two wire formats Keel speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFormat {
    /// Anthropic Messages (`"type": "message"`).
    Anthropic,
    /// OpenAI Chat Completions (`"object": "chat.completion"`).
    Openai,
}

impl WireFormat {
    /// Detects the format of one response object.
    pub fn detect(value: &Value) -> Option<Self> {
        if value.get("type").and_then(Value::as_str) == Some("message") {
            return Some(Self::Anthropic);
        }
        if value.get("object").and_then(Value::as_str) == Some("chat.completion") || value.get("choices").is_some() {
            return Some(Self::Openai);
        }
        None
    }

    /// Parses one response object in this format.
    pub fn parse(self, value: &Value) -> Result<ModelResponse, TransportError> {
        match self {
            Self::Anthropic => anthropic::parse_response(value),
            Self::Openai => openai::parse_response(value),
        }
    }
}

/// Parses one response object, detecting its format.
pub fn parse_response(value: &Value) -> Result<ModelResponse, TransportError> {
    let format = WireFormat::detect(value).ok_or_else(|| TransportError::Protocol {
        detail: "neither an Anthropic Messages response (\"type\": \"message\") nor an OpenAI Chat Completions response (\"object\": \"chat.completion\")".into(),
    })?;
    format.parse(value)
}

/// A [`Timer`] over tokio's timer and a [`Clock`]: waits until the clock reads `at`.
/// Sleeps in bounded slices and re-reads the clock, so a clock that jumps is still honoured.
#[derive(Clone)]
pub struct TokioTimer {
    clock: Arc<dyn Clock>,
}

impl TokioTimer {
    /// A timer reading `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self { clock }
    }
}

impl Timer for TokioTimer {
    fn sleep_until(&self, at: chrono::DateTime<chrono::Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            const SLICE_MS: u64 = 1_000;
            loop {
                let left = ms_between(self.clock.now(), at);
                if left == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(left.min(SLICE_MS))).await;
            }
        })
    }
}

/// Any transport, boxed (the binary picks one at run time).
pub type BoxTransport = Box<dyn ModelTransport>;

fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// A token count: a non-negative integer, or `None` (absent, negative, a float such as
/// `1e12` or `412.5`, a string) — unknown, never 0.
fn count_field(value: &Value, key: &str) -> Option<u64> {
    value.get(key).and_then(Value::as_u64)
}

fn protocol(detail: impl Into<String>) -> TransportError {
    TransportError::Protocol { detail: detail.into() }
}

#[cfg(test)]
mod tests;
