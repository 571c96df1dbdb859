//! What the loop sends to a model and what it gets back, in no vendor's wire format.
//!
//! Owns [`ModelTransport`] (the one trait every transport implements: scripted, Anthropic
//! Messages over HTTP, OpenAI Chat Completions over HTTP), the normalised [`ModelResponse`]
//! and the [`ModelRequest`] built from the journal. Wire formats are parsed in the `adapters`
//! crate; this module only names the meaning.
//!
//! Tool-call arguments are kept as the raw JSON *text* the model produced
//! ([`ResponseBlock::ToolUse::arguments`]), so malformed or truncated arguments stay
//! detectable: the guard parses them and never guesses.

use engine::provider::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why the model stopped, normalised across vendors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its turn (Anthropic `end_turn`, OpenAI `stop`).
    EndTurn,
    /// The model asked for tools (Anthropic `tool_use`, OpenAI `tool_calls`).
    ToolUse,
    /// Output cut by the token limit (Anthropic `max_tokens`, OpenAI `length`).
    MaxTokens,
    /// The model or the vendor's filter refused (Anthropic `refusal`, OpenAI `content_filter`).
    Refusal,
    /// The answer carried no stop reason at all (`null` or absent).
    Missing,
    /// Any other reason, kept verbatim (e.g. `stop_sequence`, `pause_turn`).
    Other(String),
}

/// One block of a model answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A proposed tool call.
    ToolUse {
        /// The vendor's call id; the result is matched to the call by it.
        id: String,
        /// The tool the model names (it may not exist).
        name: String,
        /// The arguments as raw JSON text, exactly as produced (possibly malformed or cut).
        arguments: String,
    },
}

/// Tokens the vendor reports for one call. A count the vendor left out, or gave as anything
/// but a non-negative integer (`-5`, `1e12`, `412.5`, `"412"`), is `None`: unknown, never 0.
/// The loop then counts the call's reservation in its place and, under a token or cost
/// limit, stops the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    /// Output (completion) tokens.
    #[serde(default)]
    pub output_tokens: Option<u64>,
}

impl Usage {
    /// True when either count is unknown.
    pub fn is_unknown(&self) -> bool {
        self.input_tokens.is_none() || self.output_tokens.is_none()
    }
}

/// One model answer, normalised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The vendor's response id, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model that answered (used to price the call).
    pub model: String,
    /// Text and tool-call blocks, in order.
    pub content: Vec<ResponseBlock>,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// Tokens reported by the vendor.
    pub usage: Usage,
}

/// A proposed tool call, as the guard sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// Call id, matched by the result.
    pub id: String,
    /// Tool name as the model wrote it.
    pub name: String,
    /// Raw JSON text of the arguments.
    pub arguments: String,
}

impl ModelResponse {
    /// The concatenated text blocks.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.content {
            if let ResponseBlock::Text { text } = block {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
        }
        out
    }

    /// The call ids that more than one tool call of this answer uses, in first-use order.
    /// Results are matched to calls by id, so such an answer cannot be answered call by call.
    pub fn reused_call_ids(&self) -> Vec<String> {
        let calls = self.tool_calls();
        let mut reused: Vec<String> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            if calls[..i].iter().any(|c| c.id == call.id) && !reused.contains(&call.id) {
                reused.push(call.id.clone());
            }
        }
        reused
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.content
            .iter()
            .filter_map(|block| match block {
                ResponseBlock::ToolUse { id, name, arguments } => {
                    Some(ToolCall { id: id.clone(), name: name.clone(), arguments: arguments.clone() })
                }
                ResponseBlock::Text { .. } => None,
            })
            .collect()
    }
}

/// What the model is told about one tool: the only three texts it ever sees of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDescriptor {
    /// Tool name.
    pub name: String,
    /// What it does, when to use it, what it does not do.
    pub description: String,
    /// The strict JSON schema of its arguments.
    pub input_schema: Value,
}

/// The result of one tool call, sent back in the same turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultBlock {
    /// The call id this answers.
    pub call_id: String,
    /// What the model reads (already wrapped as untrusted data when it came from a third party).
    pub content: String,
    /// True when the call failed or was refused.
    pub is_error: bool,
}

/// One message of the conversation the loop replays to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The user's request.
    User {
        /// Its text.
        text: String,
    },
    /// A recorded model answer, sent back as is.
    Assistant {
        /// Its blocks.
        content: Vec<ResponseBlock>,
    },
    /// The results of every tool call of the previous assistant turn, one per call id.
    ToolResults {
        /// The results, in call order.
        results: Vec<ToolResultBlock>,
    },
}

/// One request to a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// System instructions.
    pub system: String,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools the model may propose.
    pub tools: Vec<ToolDescriptor>,
    /// Output token cap for this one call.
    pub max_output_tokens: u32,
}

/// Why a transport could not produce an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The provider could not be reached or said it is unavailable (connection refused, 5xx, 429).
    #[error("model provider unavailable: {detail}")]
    Unavailable {
        /// Human detail (never a key).
        detail: String,
    },
    /// No answer within the transport's timeout.
    #[error("model call timed out after {ms} ms")]
    Timeout {
        /// The timeout that elapsed.
        ms: u64,
    },
    /// The provider refused the request (4xx other than 408/429).
    #[error("model provider answered HTTP {status}: {detail}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// Body excerpt (never a key).
        detail: String,
    },
    /// The answer could not be understood.
    #[error("model answer could not be understood: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
    /// The answer is larger than a bound of Keel's: it was not read (or not kept) further.
    #[error("model answer over {limit} ({max_bytes} bytes): refused unread")]
    TooLarge {
        /// The bound's name in `engine::limits`.
        limit: &'static str,
        /// Its value.
        max_bytes: usize,
    },
    /// A scripted transcript has no response left: a fixture bug, not a provider state.
    #[error("transcript exhausted: it holds {responses} responses and call {call} was requested")]
    TranscriptExhausted {
        /// Responses in the transcript.
        responses: usize,
        /// The 1-based call that found nothing.
        call: usize,
    },
}

impl TransportError {
    /// True when the error is Keel's own (a fixture or configuration bug), not the provider's.
    pub fn is_internal(&self) -> bool {
        matches!(self, Self::TranscriptExhausted { .. })
    }
}

/// A way to ask a model. Object-safe; implementations live in `adapters::model`.
pub trait ModelTransport: Send + Sync {
    /// Sends one request and returns the normalised answer.
    fn complete<'a>(&'a self, request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>>;

    /// The fingerprint of the script this transport replays, when it replays one (a scripted
    /// transcript). The run records it when it starts; a resume whose transport replays
    /// another script stops the run `nondeterministic_replay` instead of mixing the answers
    /// of two scripts. `None` for a live model.
    fn script_fingerprint(&self) -> Option<String> {
        None
    }
}
