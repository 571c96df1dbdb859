//! The HTTP plumbing every payment provider client shares (today Keel's Stripe client,
//! [`crate::stripe`]).
//!
//! Owns the HTTP client and its timeouts, the W3C trace context each request carries, and the
//! reading of a transport failure as an outcome. It knows no provider's wire format: request
//! bodies and the meaning of an answer are the client's. It must never report "no effect"
//! unless the request provably never left the process, never retry on its own (retrying is
//! the engine's decision), and never follow a redirect.
//!
//! # Transport failures
//!
//! | What happened | Outcome |
//! |---|---|
//! | the request could not be built (e.g. a header that is not a valid value) | `NotSent` |
//! | connect error, including a connect timeout (`reqwest::Error::is_connect`) | `NotSent`: no TCP connection, so no request byte left |
//! | any other timeout (`is_timeout`), while sending or reading the answer | `Unknown { Timeout }` |
//! | any other transport error (reset, closed after sending, body cut) | `Unknown { ConnectionLost }` |
//!
//! Every body is read with `engine::canonical::parse_strict` ([`read_strict`]): an answer that
//! repeats a key says two things, so it proves neither.
//!
//! # Limits
//!
//! - System proxies are ignored, so that "connection refused" is about the provider itself.
//! - Timeouts: connect [`DEFAULT_CONNECT_TIMEOUT_MS`] by default, and a whole-request timeout
//!   the client chooses; both must be non-zero. A request's own time left
//!   (`EffectRequest::timeout_ms`) caps it further ([`capped`]).
//!
//! # Trace context
//!
//! With a [`CurrentTrace`] set, every charge, refund and lookup carries a W3C `traceparent`
//! header naming the span it is sent from (the attempt's, the reconciliation's), so the
//! provider's record of the call stays attached to its run. This crate knows no tracing
//! backend: the binary hands it the function that reads the current span's context. The
//! header is built here from typed ids, so it is always a valid header value: a trace context
//! can never keep a request from being sent.

use engine::money::Currency;
use engine::provider::{CallOutcome, EffectRequest, Evidence, UnknownReason};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use std::time::Duration;

/// Default connect timeout: loopback or a nearby provider answers a SYN in far less; a second
/// is long enough not to misreport a busy host and short enough to fail over quickly.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// The W3C Trace Context header every request carries when a trace context is at hand.
pub const TRACEPARENT: &str = "traceparent";

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A timeout of zero would make every call an unknown outcome.
    #[error("{name} must be at least 1 ms")]
    ZeroTimeout {
        /// Which timeout.
        name: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The W3C trace context of the span a request is sent from: its `traceparent` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
}

impl TraceContext {
    /// The context of span `span_id` in trace `trace_id`; `None` when either id is all zeros,
    /// which the W3C format declares invalid.
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self { trace_id, span_id, sampled })
    }

    /// The header's value: `00-{trace id}-{span id}-{flags}` in lower-case hex, flags `01`
    /// when sampled.
    pub fn traceparent(&self) -> String {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), u8::from(self.sampled))
    }
}

/// Reads the trace context of the calling span (the binary's tracing wiring). Called once per
/// request; `None` sends no `traceparent`.
pub type CurrentTrace = fn() -> Option<TraceContext>;

/// The HTTP client every payment provider adapter uses: both timeouts non-zero, no redirect
/// followed (a 3xx is an answer to classify, not a place to resend money to), system proxies
/// ignored (so "connection refused" is about the provider itself). HTTPS verifies the server
/// against the Mozilla root store compiled in (`webpki-roots`, reqwest's `rustls-tls`), never
/// the host's store.
pub(crate) fn client(connect_timeout_ms: u64, request_timeout_ms: u64) -> Result<reqwest::Client, Error> {
    if connect_timeout_ms == 0 {
        return Err(Error::ZeroTimeout { name: "connect_timeout_ms" });
    }
    if request_timeout_ms == 0 {
        return Err(Error::ZeroTimeout { name: "request_timeout_ms" });
    }
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .timeout(Duration::from_millis(request_timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()?)
}

/// `request` with the calling span's `traceparent`, when there is one.
pub(crate) fn traced(current_trace: Option<CurrentTrace>, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match current_trace.and_then(|current| current()) {
        Some(context) => request.header(TRACEPARENT, context.traceparent()),
        None => request,
    }
}

/// `post` with its run's time left as its timeout, when that is shorter than the client's
/// `request_timeout_ms` (a per-request timeout replaces the client's): a slow provider cannot
/// carry a call past its run's deadline.
pub(crate) fn capped(
    post: reqwest::RequestBuilder,
    request: &EffectRequest,
    request_timeout_ms: u64,
) -> reqwest::RequestBuilder {
    match request.timeout_ms.filter(|left| *left < request_timeout_ms) {
        Some(left_ms) => post.timeout(Duration::from_millis(left_ms.max(1))),
        None => post,
    }
}

/// Sends an effect's request and reads its whole answer: the status, headers and body, or
/// the outcome a transport failure proves (see the module's table: never sent, or unknown).
pub(crate) async fn exchange(post: reqwest::RequestBuilder) -> Result<(StatusCode, HeaderMap, Vec<u8>), CallOutcome> {
    let response = post.send().await.map_err(|e| classify_send_error(&e))?;
    let (status, headers) = (response.status(), response.headers().clone());
    match response.bytes().await {
        Ok(bytes) => Ok((status, headers, bytes.to_vec())),
        Err(e) if e.is_timeout() => {
            Err(unknown(UnknownReason::Timeout, format!("HTTP {status}, answer timed out: {e}")))
        }
        Err(e) => Err(unknown(UnknownReason::ConnectionLost, format!("HTTP {status}, answer cut: {e}"))),
    }
}

pub(crate) fn unknown(reason: UnknownReason, detail: String) -> CallOutcome {
    CallOutcome::Unknown { reason, detail }
}

/// Classifies an error from `send()`, i.e. before any status line was read.
pub(crate) fn classify_send_error(e: &reqwest::Error) -> CallOutcome {
    if e.is_builder() {
        // The request was refused while being built, before any socket was touched.
        CallOutcome::NotSent { detail: format!("request could not be built: {e}") }
    } else if e.is_connect() {
        // Checked before `is_timeout`: a connect timeout is also a timeout, but with no
        // connection no request byte can have left.
        CallOutcome::NotSent { detail: transport_detail(e) }
    } else if e.is_timeout() {
        unknown(UnknownReason::Timeout, transport_detail(e))
    } else {
        unknown(UnknownReason::ConnectionLost, transport_detail(e))
    }
}

/// The error with its whole source chain: reqwest's own message alone hides the cause.
pub(crate) fn transport_detail(e: &reqwest::Error) -> String {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    detail
}

/// Reads a body strictly (no duplicate key, see `engine::canonical::parse_strict`) into `T`.
pub(crate) fn read_strict<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let value = engine::canonical::parse_strict(text).map_err(|e| e.to_string())?;
    engine::canonical::decode(value).map_err(|e| e.to_string())
}

/// The evidence in a provider's object: a non-blank visible-ASCII id and a currency code,
/// upper-cased (ISO 4217 codes are case-insensitive on the wire; Stripe answers `eur`).
pub(crate) fn evidence_of(id: String, amount_minor: i64, currency: &str) -> Result<Evidence, String> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("the answer names no effect (id {id:?})"));
    }
    let currency = Currency::parse(currency).map_err(|e| e.to_string())?;
    Ok(Evidence { provider_ref: id, amount_minor, currency: currency.into_string() })
}

/// A short, printable excerpt of an answer for details: never the whole body.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    /// Enough to recognise an error body in a log line.
    const EXCERPT_MAX_CHARS: usize = 200;
    String::from_utf8_lossy(bytes).chars().take(EXCERPT_MAX_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_context_is_a_w3c_traceparent_and_zero_ids_are_none() {
        let mut trace_id = [0u8; 16];
        trace_id[0] = 0x4b;
        trace_id[15] = 0x36;
        let context = TraceContext::new(trace_id, [0, 0xf0, 0, 0, 0, 0, 0, 0x01], true).expect("non-zero ids");
        assert_eq!(context.traceparent(), "00-4b000000000000000000000000000036-00f0000000000001-01");
        let unsampled = TraceContext::new(trace_id, [1; 8], false).expect("non-zero ids");
        assert!(unsampled.traceparent().ends_with("-00"), "{}", unsampled.traceparent());
        assert_eq!(TraceContext::new([0; 16], [1; 8], true), None, "an all-zero trace id is invalid");
        assert_eq!(TraceContext::new(trace_id, [0; 8], true), None, "an all-zero span id is invalid");
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        assert!(matches!(client(0, 1), Err(Error::ZeroTimeout { name: "connect_timeout_ms" })));
        assert!(matches!(client(1, 0), Err(Error::ZeroTimeout { name: "request_timeout_ms" })));
        assert!(client(1, 1).is_ok());
    }
}
