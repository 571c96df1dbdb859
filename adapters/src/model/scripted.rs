//! A transport that replays a transcript of real model responses.
//!
//! # Transcript files
//!
//! A transcript is a JSON array; entry *n* answers model call *n*. Each entry is either
//!
//! - a complete **Anthropic Messages** response object (`"type": "message"`), or
//! - a complete **OpenAI Chat Completions** response object (`"object": "chat.completion"`),
//!
//! detected per entry, so a response captured from either API replays as is; or one of two
//! scripted conditions:
//!
//! - `{"keel_scripted": "hang"}` — the call never answers (the deadline must stop the run);
//! - `{"keel_scripted": "unavailable"}` — the call fails as an unreachable provider.
//!
//! The format may also be declared for the whole file: `{"format": "openai", "responses":
//! [ … ]}` (or `"anthropic"`); entries are then parsed in that format without detection.
//! Asking for more responses than the transcript holds is
//! [`TransportError::TranscriptExhausted`]: a fixture bug, reported as an internal error.

use super::{WireFormat, parse_response};
use agent::{AgentState, ModelRequest, ModelResponse, ModelTransport, TransportError};
use engine::provider::BoxFuture;
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One entry of a transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScriptStep {
    /// Answer with this response.
    Respond(ModelResponse),
    /// Never answer.
    Hang,
    /// Fail as an unavailable provider.
    Unavailable,
}

/// Why a transcript could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TranscriptError {
    /// The file could not be read.
    #[error("cannot read transcript {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not JSON, or not an array / `{"format","responses"}` object.
    #[error("transcript is not a JSON array of responses: {detail}")]
    Shape {
        /// What was wrong.
        detail: String,
    },
    /// One entry is not a response in a known format.
    #[error("transcript entry {index}: {source}")]
    Entry {
        /// 0-based index.
        index: usize,
        /// Why.
        source: TransportError,
    },
}

/// A parsed transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript {
    steps: Vec<ScriptStep>,
    fingerprint: String,
}

impl Transcript {
    /// Parses transcript text.
    pub fn parse(text: &str) -> Result<Self, TranscriptError> {
        let value: Value =
            engine::canonical::parse_strict(text).map_err(|e| TranscriptError::Shape { detail: e.to_string() })?;
        let (declared, entries) = match &value {
            Value::Array(entries) => (None, entries),
            Value::Object(map) => {
                let format = map
                    .get("format")
                    .cloned()
                    .map(engine::canonical::decode::<WireFormat>)
                    .transpose()
                    .map_err(|e| TranscriptError::Shape { detail: format!("format: {e}") })?;
                let entries = map.get("responses").and_then(Value::as_array).ok_or_else(|| TranscriptError::Shape {
                    detail: "an object transcript needs a \"responses\" array".into(),
                })?;
                (format, entries)
            }
            _ => return Err(TranscriptError::Shape { detail: "expected an array".into() }),
        };
        let steps = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                parse_step(entry, declared).map_err(|source| TranscriptError::Entry { index, source })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { steps, fingerprint: engine::canonical::fingerprint(&value) })
    }

    /// The fingerprint of its canonical JSON: the same for a re-indented copy, different for
    /// any edit of what it says.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Reads and parses a transcript file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TranscriptError> {
        let path = path.as_ref();
        let text = std::fs::File::open(path)
            .and_then(|file| engine::limits::read_text_at_most(file, engine::limits::TRANSCRIPT_FILE_MAX_BYTES))
            .map_err(|source| TranscriptError::Io { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    /// The entries.
    pub fn steps(&self) -> &[ScriptStep] {
        &self.steps
    }
}

fn parse_step(entry: &Value, declared: Option<WireFormat>) -> Result<ScriptStep, TransportError> {
    if let Some(condition) = entry.get("keel_scripted") {
        return match condition.as_str() {
            Some("hang") => Ok(ScriptStep::Hang),
            Some("unavailable") => Ok(ScriptStep::Unavailable),
            _ => Err(TransportError::Protocol { detail: format!("unknown keel_scripted condition {condition}") }),
        };
    }
    let response = match declared {
        Some(format) => format.parse(entry)?,
        None => parse_response(entry)?,
    };
    Ok(ScriptStep::Respond(response))
}

/// Replays a [`Transcript`], one entry per call.
#[derive(Debug)]
pub struct ScriptedTransport {
    transcript: Transcript,
    next: AtomicUsize,
    calls: AtomicUsize,
}

impl ScriptedTransport {
    /// Starts at the first entry.
    pub fn new(transcript: Transcript) -> Self {
        Self { transcript, next: AtomicUsize::new(0), calls: AtomicUsize::new(0) }
    }

    /// Reads a transcript file and starts at its first entry.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TranscriptError> {
        Ok(Self::new(Transcript::from_file(path)?))
    }

    /// Positions the script after the answers a resumed run already recorded, so they are
    /// never replayed (a call reserved but never answered consumed no entry).
    pub fn resuming(self, state: &AgentState) -> Self {
        self.next.store(state.answers_made() as usize, Ordering::SeqCst);
        self
    }

    /// Calls made through this transport.
    pub fn calls_made(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl ModelTransport for ScriptedTransport {
    fn script_fingerprint(&self) -> Option<String> {
        Some(self.transcript.fingerprint().to_owned())
    }

    fn complete<'a>(&'a self, _request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let steps = self.transcript.steps();
        Box::pin(async move {
            match steps.get(index) {
                Some(ScriptStep::Respond(response)) => Ok(response.clone()),
                Some(ScriptStep::Hang) => std::future::pending().await,
                Some(ScriptStep::Unavailable) => {
                    Err(TransportError::Unavailable { detail: "scripted: the model provider is unavailable".into() })
                }
                None => Err(TransportError::TranscriptExhausted { responses: steps.len(), call: index + 1 }),
            }
        })
    }
}
