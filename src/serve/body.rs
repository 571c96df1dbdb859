//! The body door: content type, size, strict JSON, then a typed request.
//!
//! Owns [`json`], the one way a handler reads a body. It checks the declared content type
//! (415), reads at most `API_BODY_MAX_BYTES` (413) within `API_BODY_READ_TIMEOUT_MS` (408, and
//! the connection is closed: the rest of a trickled body is not waited for), parses with `engine::canonical::
//! parse_strict` — the reader every other door uses, which refuses duplicate keys and
//! nesting deeper than `JSON_DEPTH_MAX` — and decodes into the handler's request type, whose
//! `deny_unknown_fields` refuses any field it does not name (400). The console's forms meet
//! the same door with their own media type ([`form`]). It never repairs input.

use super::error::{ApiError, Code};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use engine::limits::{API_BODY_MAX_BYTES, API_BODY_READ_TIMEOUT_MS};
use serde::de::DeserializeOwned;

/// The headers Keel reads, each of which a request may carry once.
const READ_ONCE: [HeaderName; 4] =
    [header::AUTHORIZATION, header::CONTENT_TYPE, header::CONTENT_LENGTH, HeaderName::from_static("idempotency-key")];

/// Refuses (400 `invalid_arguments`, nothing read further) a request that repeats one of the
/// headers Keel reads; passes every other request on.
pub async fn headers_once(request: Request, next: Next) -> Response {
    let repeated = READ_ONCE.into_iter().find(|name| request.headers().get_all(name).iter().nth(1).is_some());
    match repeated {
        Some(name) => ApiError::new(
            Code::InvalidArguments,
            format!("the request carries the {name} header more than once; send it once"),
        )
        .into_response(),
        None => next.run(request).await,
    }
}

/// Whether the request declares a body of `media` (any parameters).
fn declares(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|declared| declared.trim().eq_ignore_ascii_case(media))
}

/// Reads the body, at most `API_BODY_MAX_BYTES`.
async fn bytes(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let too_large =
        || ApiError::new(Code::BodyTooLarge, format!("the request body is larger than {API_BODY_MAX_BYTES} bytes"));
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|length: usize| length > API_BODY_MAX_BYTES) {
        return Err(too_large());
    }
    let read = tokio::time::timeout(
        std::time::Duration::from_millis(API_BODY_READ_TIMEOUT_MS),
        axum::body::to_bytes(body, API_BODY_MAX_BYTES),
    );
    match read.await {
        // On a well-formed request the only failure is the limit (a chunked body past it).
        Ok(read) => read.map_err(|_| too_large()),
        Err(_) => Err(ApiError::new(
            Code::RequestTimeout,
            format!("the request body did not arrive within {API_BODY_READ_TIMEOUT_MS} ms"),
        )),
    }
}

/// Reads the body (at most `API_BODY_MAX_BYTES`) as text; `None` when it is empty.
async fn text(headers: &HeaderMap, body: Body) -> Result<Option<String>, ApiError> {
    let bytes = bytes(headers, body).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    if !declares(headers, "application/json") {
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
    engine::canonical::decode(value).map_err(|error| {
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

/// A console form's body, read but not yet decoded: its CSRF field is checked before
/// anything else is.
pub struct Form {
    pairs: Vec<(String, String)>,
}

impl Form {
    /// The value of `name`, when the form carries it exactly once.
    pub fn field(&self, name: &str) -> Option<&str> {
        let mut values = self.pairs.iter().filter(|(field, _)| field == name).map(|(_, value)| value.as_str());
        match (values.next(), values.next()) {
            (Some(value), None) => Some(value),
            _ => None,
        }
    }

    /// The fields as URL-encoded `bytes` carry them.
    pub fn parse(bytes: &[u8]) -> Self {
        Self {
            pairs: form_urlencoded::parse(bytes).map(|(name, value)| (name.into_owned(), value.into_owned())).collect(),
        }
    }

    /// The form's fields but `csrf` (which the console checks first, through [`Form::field`])
    /// as `T`, whose `deny_unknown_fields` refuses a field it does not name, and whose derive
    /// refuses one named twice (400).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let map =
            self.pairs.iter().filter(|(name, _)| name != "csrf").map(|(name, value)| (name.as_str(), value.as_str()));
        T::deserialize(serde::de::value::MapDeserializer::new(map)).map_err(|error: serde::de::value::Error| {
            ApiError::new(Code::InvalidArguments, format!("the form does not fit: {error}"))
        })
    }
}

/// A form body: declared `application/x-www-form-urlencoded` (415), at most
/// `API_BODY_MAX_BYTES` (413), URL-encoded UTF-8 (400).
pub async fn form(headers: &HeaderMap, body: Body) -> Result<Form, ApiError> {
    let bytes = bytes(headers, body).await?;
    if !declares(headers, "application/x-www-form-urlencoded") {
        return Err(ApiError::new(
            Code::UnsupportedMediaType,
            "a form must be declared `Content-Type: application/x-www-form-urlencoded`",
        ));
    }
    Ok(Form::parse(&bytes))
}
