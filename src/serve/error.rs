//! The API's one error shape, `{"error": {"code", "message", "details"}}`, and its codes.
//!
//! Owns [`ApiError`] and [`Code`]: every refusal a handler returns goes through here, so a
//! client parses one shape whatever went wrong. Codes are the CLI's where the CLI has one
//! (`invalid_arguments`, `intent_payload_mismatch`, `refused`, a provider's decline code…).
//! A message never carries a secret: nothing here echoes a header or a body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::ledger::RejectCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// What went wrong, as the API names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Code {
    /// The request's fields, query or headers break the contract (the CLI's code).
    InvalidArguments,
    /// The body is not strict JSON (syntax, a duplicate key, too deep).
    InvalidJson,
    /// The body is larger than `API_BODY_MAX_BYTES`.
    BodyTooLarge,
    /// The body is not declared `application/json`.
    UnsupportedMediaType,
    /// The body did not arrive within `API_BODY_READ_TIMEOUT_MS`.
    RequestTimeout,
    /// No `Authorization: Bearer …`.
    MissingApiKey,
    /// A key that proves nothing.
    InvalidApiKey,
    /// A revoked key.
    RevokedApiKey,
    /// The key's role may not do this, or the body names another tenant.
    Forbidden,
    /// No such route, or no such intent for this key's tenant.
    NotFound,
    /// The route exists, the method does not.
    MethodNotAllowed,
    /// The key's rate limit is spent.
    RateLimited,
    /// Recovery has not finished yet.
    NotReady,
    /// The ledger refused an operator decision (the CLI's `refused`): nothing written.
    Refused,
    /// Keel refused the proposal (the CLI's codes).
    Rejected(RejectCode),
    /// The provider declined, with its own code.
    Declined(String),
    /// The intent was cancelled by an operator.
    Cancelled,
    /// The store or the executor failed.
    Internal,
}

impl Code {
    /// The code as clients read it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::InvalidArguments => "invalid_arguments",
            Self::InvalidJson => "invalid_json",
            Self::BodyTooLarge => "body_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::RequestTimeout => "request_timeout",
            Self::MissingApiKey => "missing_api_key",
            Self::InvalidApiKey => "invalid_api_key",
            Self::RevokedApiKey => "revoked_api_key",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RateLimited => "rate_limited",
            Self::NotReady => "not_ready",
            Self::Refused => "refused",
            Self::Rejected(code) => code.as_str(),
            Self::Declined(code) => code,
            Self::Cancelled => "cancelled",
            Self::Internal => "internal_error",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::InvalidArguments | Self::InvalidJson | Self::Rejected(RejectCode::InvalidArguments) => {
                StatusCode::BAD_REQUEST
            }
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::MissingApiKey | Self::InvalidApiKey | Self::RevokedApiKey => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::Refused
            | Self::Cancelled
            | Self::Rejected(
                RejectCode::IntentPayloadMismatch | RejectCode::ReferencePending | RejectCode::Abandoned,
            ) => StatusCode::CONFLICT,
            Self::Rejected(RejectCode::PolicyDenied | RejectCode::BudgetExhausted | RejectCode::InvariantViolated) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::Declined(_) => StatusCode::PAYMENT_REQUIRED,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A refused or failed request.
#[derive(Debug)]
pub struct ApiError {
    code: Code,
    message: String,
    details: Value,
    retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: Value::Null, retry_after_s: None }
    }

    /// The same error with `details` (a list of problems, or the intent it is about).
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The same error, telling the client when to try again.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// The HTTP status it is answered with.
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// Its sentence for a human.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The `Retry-After` it carries, in seconds (a 429, a 503 before recovery is done).
    pub fn retry_after_s(&self) -> Option<u64> {
        self.retry_after_s
    }

    /// An internal failure: logged in full, shown as a generic message (the store's text may
    /// name files and rows a client has no business seeing).
    pub fn internal(error: &dyn std::fmt::Display) -> Self {
        tracing::error!(%error, "keel serve: request failed");
        Self::new(Code::Internal, "internal error; the server logged the cause")
    }
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorFields,
}

/// See [`ErrorBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorFields {
    /// A stable snake_case code (the CLI's where it has one).
    pub code: String,
    /// A sentence for a human.
    pub message: String,
    /// The problems found, or the intent the error is about; `null` when none.
    pub details: Value,
}

/// A path segment axum could not extract: `invalid_arguments`, with axum's reason.
impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::PathRejection) -> Self {
        Self::new(Code::InvalidArguments, rejection.body_text())
    }
}

/// A query string axum could not decode into the route's parameters: `invalid_arguments`,
/// with axum's reason.
impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::QueryRejection) -> Self {
        Self::new(Code::InvalidArguments, rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let body = ErrorBody {
            error: ErrorFields { code: self.code.as_str().to_owned(), message: self.message, details: self.details },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if matches!(self.code, Code::RequestTimeout | Code::BodyTooLarge) {
            // The rest of the body is not read: the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
