//! The Anthropic Messages wire format and its HTTP client.
//!
//! A response is `{"id","type":"message","role":"assistant","model","content":[…],
//! "stop_reason","usage":{"input_tokens","output_tokens"}}`; content blocks are `text` and
//! `tool_use` (`id`, `name`, `input` object). The `input` object is re-serialised as the
//! raw argument text; a string `input` (how a cut, streamed input is captured) is kept as is.
//! Other block types (e.g. `thinking`) are skipped.

use super::http::{HttpConfig, HttpTransport};
use super::{count_field, protocol, str_field};
use agent::{Message, ModelRequest, ModelResponse, ModelTransport, ResponseBlock, StopReason, TransportError, Usage};
use engine::provider::BoxFuture;
use serde_json::{Value, json};

/// The `anthropic-version` header Keel sends.
pub const API_VERSION: &str = "2023-06-01";

/// Parses one Messages response object.
pub fn parse_response(value: &Value) -> Result<ModelResponse, TransportError> {
    if let Some(kind) = str_field(value, "type")
        && kind != "message"
    {
        return Err(protocol(format!("Anthropic response of type {kind:?}, expected \"message\"")));
    }
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| protocol("Anthropic response without a content array"))?;
    let mut content = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        match str_field(block, "type") {
            Some("text") => {
                content.push(ResponseBlock::Text { text: str_field(block, "text").unwrap_or_default().to_owned() })
            }
            Some("tool_use") => {
                let id = str_field(block, "id").ok_or_else(|| protocol(format!("tool_use block {i} without an id")))?;
                let name =
                    str_field(block, "name").ok_or_else(|| protocol(format!("tool_use block {i} without a name")))?;
                let arguments = match block.get("input") {
                    Some(Value::String(raw)) => raw.clone(),
                    Some(input) => input.to_string(),
                    None => String::new(),
                };
                content.push(ResponseBlock::ToolUse { id: id.to_owned(), name: name.to_owned(), arguments });
            }
            _ => {}
        }
    }
    let stop_reason = match value.get("stop_reason") {
        None | Some(Value::Null) => StopReason::Missing,
        Some(Value::String(reason)) => match reason.as_str() {
            "end_turn" => StopReason::EndTurn,
            "tool_use" => StopReason::ToolUse,
            // Both mean the output was cut before its end.
            "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
            "refusal" => StopReason::Refusal,
            other => StopReason::Other(other.to_owned()),
        },
        Some(other) => return Err(protocol(format!("stop_reason is not a string: {other}"))),
    };
    let usage = value.get("usage").map_or(Usage::default(), |u| Usage {
        input_tokens: count_field(u, "input_tokens"),
        output_tokens: count_field(u, "output_tokens"),
    });
    Ok(ModelResponse {
        id: str_field(value, "id").map(str::to_owned),
        model: str_field(value, "model").unwrap_or("unknown").to_owned(),
        content,
        stop_reason,
        usage,
    })
}

/// Builds the Messages request body for `request`.
///
/// A recorded tool call whose arguments are not a JSON object (it was refused as malformed)
/// is replayed with an empty `input`, so the conversation stays valid; its error result says
/// what was wrong.
pub fn request_body(model: &str, request: &ModelRequest) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|message| match message {
            Message::User { text } => json!({"role": "user", "content": text}),
            Message::Assistant { content } => {
                let blocks: Vec<Value> = content
                    .iter()
                    .map(|block| match block {
                        ResponseBlock::Text { text } => json!({"type": "text", "text": text}),
                        ResponseBlock::ToolUse { id, name, arguments } => {
                            let input = serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                            json!({"type": "tool_use", "id": id, "name": name, "input": input})
                        }
                    })
                    .collect();
                json!({"role": "assistant", "content": blocks})
            }
            Message::ToolResults { results } => {
                let blocks: Vec<Value> = results
                    .iter()
                    .map(|r| json!({"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}))
                    .collect();
                json!({"role": "user", "content": blocks})
            }
        })
        .collect();
    let tools: Vec<Value> = request
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
        .collect();
    json!({
        "model": model,
        "max_tokens": request.max_output_tokens,
        "system": request.system,
        "tools": tools,
        "messages": messages,
    })
}

/// The Anthropic Messages API over HTTP: `POST {base_url}/v1/messages`.
#[derive(Debug)]
pub struct AnthropicClient {
    http: HttpTransport,
}

impl AnthropicClient {
    /// A client for `config` (base URL e.g. `https://api.anthropic.com`).
    pub fn new(config: HttpConfig) -> Result<Self, TransportError> {
        Ok(Self { http: HttpTransport::new(config)? })
    }
}

impl ModelTransport for AnthropicClient {
    fn complete<'a>(&'a self, request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
        Box::pin(async move {
            let config = self.http.config();
            let body = request_body(&config.model, request);
            let url = config.url("/v1/messages");
            let builder = self
                .http
                .client()
                .post(url)
                .header("x-api-key", config.api_key.expose())
                .header("anthropic-version", API_VERSION)
                .json(&body);
            let value = self.http.send(builder).await?;
            parse_response(&value)
        })
    }
}
