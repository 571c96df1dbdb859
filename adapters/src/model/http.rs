//! What the two HTTP model clients share: configuration, timeouts, failure mapping.
//!
//! reqwest is built with rustls and the webpki root certificates (no system OpenSSL), so
//! `https://` base URLs — the real APIs — work; `http://` stays for local test servers.
//!
//! # Failure mapping
//!
//! | what happened                                   | [`TransportError`]            |
//! |-------------------------------------------------|-------------------------------|
//! | no answer within the timeout                    | `Timeout`                     |
//! | connection refused / lost, 5xx, 408, 429, 529   | `Unavailable`                 |
//! | any other non-2xx (400, 401, 403, 404…)         | `Rejected { status }`         |
//! | a 2xx body that is not a response object        | `Protocol`                    |
//!
//! Errors carry the status and a short body excerpt, never a header: the key stays out.

use engine::agent::TransportError;
use engine::limits;
use engine::provider::Secret;
use serde_json::Value;
use std::time::Duration;

/// Longest response-body excerpt kept in an error.
const BODY_EXCERPT_MAX_CHARS: usize = 300;

/// How to reach one model API.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Scheme, host and port, without a trailing path (e.g. `https://api.anthropic.com`).
    pub base_url: String,
    /// Model name sent with each request.
    pub model: String,
    /// The API key, read from the environment by the binary.
    pub api_key: Secret,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
}

impl HttpConfig {
    /// A configuration with the default timeouts of `engine::limits`.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>, api_key: Secret) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key,
            timeout: Duration::from_millis(limits::MODEL_HTTP_TIMEOUT_DEFAULT_MS),
            connect_timeout: Duration::from_millis(limits::MODEL_HTTP_CONNECT_TIMEOUT_DEFAULT_MS),
        }
    }

    /// `base_url` joined with `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }
}

/// A reqwest client with the configured timeouts.
#[derive(Debug)]
pub struct HttpTransport {
    client: reqwest::Client,
    config: HttpConfig,
}

impl HttpTransport {
    /// Builds the client.
    pub fn new(config: HttpConfig) -> Result<Self, TransportError> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| TransportError::Unavailable { detail: format!("cannot build the HTTP client: {e}") })?;
        Ok(Self { client, config })
    }

    /// The configuration.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    /// The client.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Sends `builder` and returns the JSON body of a 2xx answer.
    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Result<Value, TransportError> {
        let timeout_ms = u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX);
        let response = builder.send().await.map_err(|e| map_reqwest(&e, timeout_ms))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| map_reqwest(&e, timeout_ms))?;
        if !status.is_success() {
            let detail: String = text.chars().take(BODY_EXCERPT_MAX_CHARS).collect();
            let code = status.as_u16();
            return Err(if status.is_server_error() || matches!(code, 408 | 429) {
                TransportError::Unavailable { detail: format!("HTTP {code}: {detail}") }
            } else {
                TransportError::Rejected { status: code, detail }
            });
        }
        serde_json::from_str(&text)
            .map_err(|e| TransportError::Protocol { detail: format!("the body is not JSON: {e}") })
    }
}

fn map_reqwest(error: &reqwest::Error, timeout_ms: u64) -> TransportError {
    if error.is_timeout() {
        return TransportError::Timeout { ms: timeout_ms };
    }
    TransportError::Unavailable { detail: describe(error) }
}

/// The error's kind and root cause, without the URL reqwest would print.
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "answer body lost"
    } else {
        "request failed"
    };
    let mut root = None;
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        root = Some(cause.to_string());
        source = cause.source();
    }
    match root {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_owned(),
    }
}
