//! The body door: content type, size, strict JSON, then a typed request.
//!
//! Owns [`json`], the one way a handler reads a body. It checks the declared content type
//! (415), reads at most `API_BODY_MAX_BYTES` (413), parses with `engine::canonical::
//! parse_strict` — the reader every other door uses, which refuses duplicate keys and
//! nesting deeper than `JSON_DEPTH_MAX` — and decodes into the handler's request type, whose
//! `deny_unknown_fields` refuses any field it does not name (400). It never repairs input.

use super::error::{ApiError, Code};
use axum::body::Body;
use axum::http::{HeaderMap, header};
use engine::limits::API_BODY_MAX_BYTES;
use serde::de::DeserializeOwned;

/// Whether the request declares a JSON body (`application/json`, any parameters).
fn declares_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Reads the body (at most `API_BODY_MAX_BYTES`) as text; `None` when it is empty.
async fn text(headers: &HeaderMap, body: Body) -> Result<Option<String>, ApiError> {
    let too_large =
        || ApiError::new(Code::BodyTooLarge, format!("the request body is larger than {API_BODY_MAX_BYTES} bytes"));
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|length: usize| length > API_BODY_MAX_BYTES) {
        return Err(too_large());
    }
    // On a well-formed request the only failure is the limit (a chunked body past it).
    let bytes = axum::body::to_bytes(body, API_BODY_MAX_BYTES).await.map_err(|_| too_large())?;
    if bytes.is_empty() {
        return Ok(None);
    }
    if !declares_json(headers) {
        return Err(ApiError::new(
            Code::UnsupportedMediaType,
            "the request body must be JSON, declared `Content-Type: application/json`",
        ));
    }
    String::from_utf8(bytes.to_vec())
        .map(Some)
        .map_err(|_| ApiError::new(Code::InvalidJson, "the request body is not UTF-8 text"))
}

/// Decodes a strict JSON body into `T`; an empty body is `{}` when `empty_is_object`, else
/// refused.
async fn decode<T: DeserializeOwned>(headers: &HeaderMap, body: Body, empty_is_object: bool) -> Result<T, ApiError> {
    let text = match text(headers, body).await? {
        Some(text) => text,
        None if empty_is_object => "{}".to_owned(),
        None => return Err(ApiError::new(Code::InvalidJson, "the request needs a JSON body")),
    };
    let value = engine::canonical::parse_strict(&text)
        .map_err(|error| ApiError::new(Code::InvalidJson, format!("the request body is not strict JSON: {error}")))?;
    serde_json::from_value(value).map_err(|error| {
        ApiError::new(Code::InvalidArguments, format!("the request body does not fit the contract: {error}"))
    })
}

/// A request whose body is required.
pub async fn json<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<T, ApiError> {
    decode(headers, body, false).await
}

/// A request whose body may be empty (an operator decision with nothing to add).
pub async fn json_or_empty<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> Result<T, ApiError> {
    decode(headers, body, true).await
}
