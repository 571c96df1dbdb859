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
//! | a redirect (3xx): never followed                | `Protocol`                    |
//! | any other non-2xx (400, 401, 403, 404…)         | `Rejected { status }`         |
//! | a body over [`limits::MODEL_RESPONSE_MAX_BYTES`]| `TooLarge` (not read further) |
//! | a 2xx body that is not a response object        | `Protocol`                    |
//!
//! # What never leaves this module
//!
//! The key travels in a header, to the configured origin only: redirects are never followed
//! (a 307 to another port, or from 127.0.0.1 to localhost, would carry `x-api-key` along), so
//! a redirect is a protocol error. Every text that comes back — an error body quoting the
//! key, an answer echoing it, a transport error — is scrubbed of the key
//! ([`Secret::scrub`]) before any error or answer is built from it, so the key reaches
//! neither the journal nor a log line. A [`BaseUrl`] never carries credentials.

use agent::TransportError;
use engine::limits;
use engine::provider::Secret;
use serde_json::Value;
use std::time::Duration;

/// Longest response-body excerpt kept in an error.
const BODY_EXCERPT_MAX_CHARS: usize = 300;

/// Where a model API lives: an `http://` or `https://` origin, optionally with a path, and
/// nothing that could be a secret — no `user:password@`, no query, no fragment — since the
/// run records it in the log so that a resume rebuilds the same client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl(String);

/// Why a base URL was refused. Never quotes the URL: it may hold a credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BaseUrlError {
    /// Not a URL at all.
    #[error("not a URL: {detail}")]
    Invalid {
        /// The parser's reason.
        detail: String,
    },
    /// Another scheme than `http` or `https`.
    #[error("the scheme must be http or https")]
    Scheme,
    /// `user:password@` in the URL.
    #[error("the URL carries credentials (user:password@): the key comes from the environment, never from the URL")]
    Credentials,
    /// A query or a fragment.
    #[error("the URL has a query or a fragment: give the API's origin (and path) only")]
    QueryOrFragment,
}

impl BaseUrl {
    /// Parses and checks a base URL; a trailing `/` is dropped.
    pub fn parse(text: &str) -> Result<Self, BaseUrlError> {
        let url = reqwest::Url::parse(text).map_err(|e| BaseUrlError::Invalid { detail: e.to_string() })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(BaseUrlError::Scheme);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(BaseUrlError::Credentials);
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(BaseUrlError::QueryOrFragment);
        }
        Ok(Self(url.as_str().trim_end_matches('/').to_owned()))
    }

    /// The URL, without a trailing slash.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How to reach one model API.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Scheme, host, port and optional path (e.g. `https://api.anthropic.com`).
    pub base_url: BaseUrl,
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
    pub fn new(base_url: BaseUrl, model: impl Into<String>, api_key: Secret) -> Self {
        Self {
            base_url,
            model: model.into(),
            api_key,
            timeout: Duration::from_millis(limits::MODEL_HTTP_TIMEOUT_DEFAULT_MS),
            connect_timeout: Duration::from_millis(limits::MODEL_HTTP_CONNECT_TIMEOUT_DEFAULT_MS),
        }
    }

    /// `base_url` joined with `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.as_str())
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
            .redirect(reqwest::redirect::Policy::none())
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

    /// Sends `builder` and returns the JSON body of a 2xx answer, scrubbed of the key.
    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Result<Value, TransportError> {
        let key = &self.config.api_key;
        let timeout_ms = u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX);
        let response = builder.send().await.map_err(|e| map_reqwest(&e, timeout_ms, key))?;
        let status = response.status();
        let bytes = self.read_bounded(response, timeout_ms).await?;
        let text = String::from_utf8_lossy(&bytes);
        let parsed = engine::canonical::parse_strict(&text).map(|mut value| {
            key.scrub_json(&mut value);
            value
        });
        if !status.is_success() {
            // The excerpt is cut only after the key is scrubbed, so no piece of it survives.
            let scrubbed = match &parsed {
                Ok(value) => value.to_string(),
                Err(_) => key.scrub(&text),
            };
            let detail: String = scrubbed.chars().take(BODY_EXCERPT_MAX_CHARS).collect();
            let code = status.as_u16();
            return Err(if status.is_redirection() {
                TransportError::Protocol {
                    detail: format!("HTTP {code}: a redirect, refused (a model API's redirect is never followed)"),
                }
            } else if status.is_server_error() || matches!(code, 408 | 429) {
                TransportError::Unavailable { detail: format!("HTTP {code}: {detail}") }
            } else {
                TransportError::Rejected { status: code, detail }
            });
        }
        parsed.map_err(|e| TransportError::Protocol { detail: format!("the body is not JSON: {e}") })
    }

    /// Reads at most [`limits::MODEL_RESPONSE_MAX_BYTES`] of the body: past them the answer is
    /// refused unread, so an oversized answer costs neither memory nor time.
    async fn read_bounded(&self, mut response: reqwest::Response, timeout_ms: u64) -> Result<Vec<u8>, TransportError> {
        let max = limits::MODEL_RESPONSE_MAX_BYTES;
        let too_large = TransportError::TooLarge { limit: "MODEL_RESPONSE_MAX_BYTES", max_bytes: max };
        if response.content_length().is_some_and(|length| usize::try_from(length).map_or(true, |l| l > max)) {
            return Err(too_large);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| map_reqwest(&e, timeout_ms, &self.config.api_key))? {
            if body.len() + chunk.len() > max {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

fn map_reqwest(error: &reqwest::Error, timeout_ms: u64, key: &Secret) -> TransportError {
    if error.is_timeout() {
        return TransportError::Timeout { ms: timeout_ms };
    }
    TransportError::Unavailable { detail: key.scrub(&describe(error)) }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_never_carries_a_secret() {
        assert_eq!(BaseUrl::parse("http://127.0.0.1:8080/").map(|u| u.to_string()), Ok("http://127.0.0.1:8080".into()));
        assert_eq!(
            BaseUrl::parse("https://api.openai.com/v2/").map(|u| u.to_string()),
            Ok("https://api.openai.com/v2".into())
        );
        assert_eq!(BaseUrl::parse("http://u:p@127.0.0.1/"), Err(BaseUrlError::Credentials));
        assert_eq!(BaseUrl::parse("http://token@127.0.0.1/"), Err(BaseUrlError::Credentials));
        assert_eq!(BaseUrl::parse("http://127.0.0.1/?key=k"), Err(BaseUrlError::QueryOrFragment));
        assert_eq!(BaseUrl::parse("http://127.0.0.1/#k"), Err(BaseUrlError::QueryOrFragment));
        assert_eq!(BaseUrl::parse("file:///etc/passwd"), Err(BaseUrlError::Scheme));
        assert!(BaseUrl::parse("127.0.0.1:80").is_err());
        let refused = BaseUrl::parse("http://user:hunter2@host/").expect_err("credentials").to_string();
        assert!(!refused.contains("hunter2"), "{refused}");
    }
}
