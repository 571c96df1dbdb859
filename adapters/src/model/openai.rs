//! The OpenAI Chat Completions wire format and its HTTP client.
//!
//! A response is `{"id","object":"chat.completion","model","choices":[{"index":0,"message":
//! {"role":"assistant","content",…,"tool_calls":[{"id","type":"function","function":{"name",
//! "arguments":"<JSON string>"}}]},"finish_reason"}],"usage":{"prompt_tokens",
//! "completion_tokens"}}`. The `arguments` string is kept exactly as produced, so malformed or
//! cut arguments reach the guard as they are. Only `choices[0]` is read.

use super::http::{HttpConfig, HttpTransport};
use super::{count_field, protocol, str_field};
use agent::{Message, ModelRequest, ModelResponse, ModelTransport, ResponseBlock, StopReason, TransportError, Usage};
use engine::provider::BoxFuture;
use serde_json::{Value, json};

/// Parses one Chat Completions response object.
pub fn parse_response(value: &Value) -> Result<ModelResponse, TransportError> {
    if let Some(object) = str_field(value, "object")
        && object != "chat.completion"
    {
        return Err(protocol(format!("OpenAI response object {object:?}, expected \"chat.completion\"")));
    }
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| protocol("OpenAI response without choices"))?;
    let message = choice.get("message").ok_or_else(|| protocol("OpenAI choice without a message"))?;
    let mut content = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) if !text.is_empty() => content.push(ResponseBlock::Text { text: text.clone() }),
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(text) = str_field(part, "text") {
                    content.push(ResponseBlock::Text { text: text.to_owned() });
                }
            }
        }
        _ => {}
    }
    let refusal = str_field(message, "refusal").filter(|r| !r.is_empty());
    if let Some(refusal) = refusal {
        content.push(ResponseBlock::Text { text: refusal.to_owned() });
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let id = str_field(call, "id").ok_or_else(|| protocol(format!("tool call {i} without an id")))?;
            let function = call.get("function").ok_or_else(|| protocol(format!("tool call {i} without a function")))?;
            let name = str_field(function, "name").ok_or_else(|| protocol(format!("tool call {i} without a name")))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(raw)) => raw.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            content.push(ResponseBlock::ToolUse { id: id.to_owned(), name: name.to_owned(), arguments });
        }
    }
    let stop_reason = match choice.get("finish_reason") {
        None | Some(Value::Null) => StopReason::Missing,
        Some(Value::String(reason)) => match reason.as_str() {
            "stop" => StopReason::EndTurn,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "length" => StopReason::MaxTokens,
            "content_filter" => StopReason::Refusal,
            other => StopReason::Other(other.to_owned()),
        },
        Some(other) => return Err(protocol(format!("finish_reason is not a string: {other}"))),
    };
    let stop_reason =
        if refusal.is_some() && stop_reason == StopReason::EndTurn { StopReason::Refusal } else { stop_reason };
    let usage = value.get("usage").map_or(Usage::default(), |u| Usage {
        input_tokens: count_field(u, "prompt_tokens"),
        output_tokens: count_field(u, "completion_tokens"),
    });
    Ok(ModelResponse {
        id: str_field(value, "id").map(str::to_owned),
        model: str_field(value, "model").unwrap_or("unknown").to_owned(),
        content,
        stop_reason,
        usage,
    })
}

/// Builds the Chat Completions request body for `request`. Recorded tool-call arguments
/// are sent back verbatim (they are a string in this format).
pub fn request_body(model: &str, request: &ModelRequest) -> Value {
    let mut messages = vec![json!({"role": "system", "content": request.system})];
    for message in &request.messages {
        match message {
            Message::User { text } => messages.push(json!({"role": "user", "content": text})),
            Message::Assistant { content } => {
                let text: Vec<&str> = content
                    .iter()
                    .filter_map(|b| match b {
                        ResponseBlock::Text { text } => Some(text.as_str()),
                        ResponseBlock::ToolUse { .. } => None,
                    })
                    .collect();
                let calls: Vec<Value> = content
                    .iter()
                    .filter_map(|b| match b {
                        ResponseBlock::ToolUse { id, name, arguments } => Some(
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                        ),
                        ResponseBlock::Text { .. } => None,
                    })
                    .collect();
                let mut assistant = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text.join("\n")) }});
                if !calls.is_empty() {
                    assistant["tool_calls"] = Value::Array(calls);
                }
                messages.push(assistant);
            }
            Message::ToolResults { results } => {
                for r in results {
                    messages.push(json!({"role": "tool", "tool_call_id": r.call_id, "content": r.content}));
                }
            }
        }
    }
    let tools: Vec<Value> = request
        .tools
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}))
        .collect();
    json!({
        "model": model,
        "max_completion_tokens": request.max_output_tokens,
        "messages": messages,
        "tools": tools,
    })
}

/// The OpenAI Chat Completions API over HTTP: `POST {base_url}/v1/chat/completions`.
#[derive(Debug)]
pub struct OpenAiClient {
    http: HttpTransport,
}

impl OpenAiClient {
    /// A client for `config` (base URL e.g. `https://api.openai.com`).
    pub fn new(config: HttpConfig) -> Result<Self, TransportError> {
        Ok(Self { http: HttpTransport::new(config)? })
    }
}

impl ModelTransport for OpenAiClient {
    fn complete<'a>(&'a self, request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
        Box::pin(async move {
            let config = self.http.config();
            let body = request_body(&config.model, request);
            let builder = self
                .http
                .client()
                .post(config.url("/v1/chat/completions"))
                .bearer_auth(config.api_key.expose())
                .json(&body);
            let value = self.http.send(builder).await?;
            parse_response(&value)
        })
    }
}
