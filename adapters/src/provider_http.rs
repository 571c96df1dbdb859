//! A [`PaymentProvider`] over a Stripe-like HTTP API (the one `keel-provider-sim` speaks).
//!
//! Owns the HTTP client, its timeouts, the request bodies and — above all — the mapping from
//! what came back (or did not) to a [`CallOutcome`] or [`LookupOutcome`]. It must never report
//! "no effect" unless the provider said so definitively or the request provably never left
//! the process, never retry on its own (retrying is the engine's decision), never follow a
//! redirect, and never log or store the payment method.
//!
//! # Charge and refund outcomes
//!
//! | What happened | Outcome |
//! |---|---|
//! | 200, body with a non-blank `id`, `object` = the kind, `status` = `succeeded`, same amount and currency (currency compared case-insensitively, recorded upper case) | `Succeeded(Evidence { provider_ref: id, amount_minor, currency })` |
//! | 200 with a body that does not parse (duplicate keys included), a blank or missing `id`, or another object/status/amount/currency | `Unknown { Protocol }` |
//! | other 2xx, 1xx, 3xx | `Unknown { Protocol }` |
//! | 402 with `error.type` = `card_error` | `Declined { code: error.code }` (`card_error` if the code is missing) |
//! | 402 without a `card_error` body | `Unknown { Protocol }` |
//! | 400 `idempotency_error` (key reused with other parameters) | `Unknown { Protocol }`: the provider refuses, but an effect may exist under that key |
//! | 409 (`request_in_progress`: the key is in flight elsewhere) | `Unknown { ProviderUnavailable }` |
//! | 429 | `Unknown { ProviderUnavailable }` |
//! | 5xx | `Unknown { ProviderUnavailable }` |
//! | any other 4xx (400 `invalid_request_error`, 401, 403, 404…) | `Unknown { Protocol }`: not a business refusal, a bug or misconfiguration an operator must see; it never releases money |
//! | the request could not be built (e.g. a key that is not a valid header value) | `NotSent` |
//! | connect error, including a connect timeout (`reqwest::Error::is_connect`) | `NotSent`: no TCP connection, so no request byte left |
//! | any other timeout (`is_timeout`), while sending or reading the answer | `Unknown { Timeout }` |
//! | any other transport error (reset, closed after sending, body cut) | `Unknown { ConnectionLost }` |
//!
//! Every body is read with `engine::canonical::parse_strict`: an answer that repeats a key
//! says two things, so it proves neither.
//!
//! Only `Declined` and `NotSent` mean "no effect". The only decline is a 402 `card_error`:
//! every other refusal is treated as "may have happened", because releasing a reservation on
//! a misread answer is the one mistake that can double-charge.
//!
//! # Lookup outcomes
//!
//! | What happened | Outcome |
//! |---|---|
//! | 200, a non-blank `id`, `object` = the kind and `status` = `succeeded` | `Found(Evidence)` (currency upper case) |
//! | 200 with another object or status | `Unavailable { "inconsistent: …" }` |
//! | 200 that does not parse (duplicate keys included), a blank `id`, a currency that is not a code | `Unavailable { "protocol: …" }` |
//! | 404 with `error.type` = `not_found` (parsed strictly: a repeated key is no answer) | `Absent` |
//! | 404 without that body (a wrong base URL looks like this) | `Unavailable` |
//! | 501, 5xx, any other status, timeout, any transport error | `Unavailable` |
//!
//! # Limits
//!
//! - Plain `http://` only: this is the simulator's format, and the simulator speaks no TLS.
//!   Real Stripe, over HTTPS, is [`crate::stripe`]'s.
//! - System proxies are ignored, so that "connection refused" is about the provider itself.
//! - Timeouts: connect [`DEFAULT_CONNECT_TIMEOUT_MS`], whole request (connect, send, answer)
//!   [`DEFAULT_REQUEST_TIMEOUT_MS`], both overridable and both required to be non-zero.
//!
//! # Trace context
//!
//! With [`HttpProviderConfig::current_trace`] set, every charge, refund and lookup carries a
//! W3C `traceparent` header naming the span it is sent from (the attempt's, the
//! reconciliation's), so the provider's record of the call stays attached to its run. This
//! crate knows no tracing backend: the binary hands it the function that reads the current
//! span's context. The header is built here from typed ids, so it is always a valid header
//! value: a trace context can never keep a request from being sent.

use engine::money::Currency;
use engine::provider::{
    BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, Evidence, LookupOutcome, PaymentProvider,
    UnknownReason,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::HeaderMap;
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use std::time::Duration;

/// Default connect timeout: loopback or a nearby provider answers a SYN in far less; a second
/// is long enough not to misreport a busy host and short enough to fail over quickly.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// Default timeout of a whole request: above a payment provider's usual latency (well under a
/// second) with margin, and well below any workflow deadline.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// The W3C Trace Context header every request carries when a trace context is at hand.
pub const TRACEPARENT: &str = "traceparent";

/// Stripe keeps idempotency keys for at least 24 hours.
pub const STRIPE_KEY_WINDOW_MS: u64 = 24 * 60 * 60 * 1_000;

/// How long a Stripe-like lookup may still miss a fresh effect.
pub const STRIPE_LIKE_CONSISTENCY_WINDOW_MS: u64 = 2_000;

/// A provider that deduplicates on the key and can look effects up (tier `dedup+lookup`), keeps
/// keys 24 h and may miss an effect for 2 s. Override fields for other providers, e.g.
/// `Capability { lookup: false, ..stripe_like() }` for a simulator run with `--no-lookup`.
pub fn stripe_like() -> Capability {
    Capability {
        dedup_by_key: true,
        lookup: true,
        key_window_ms: STRIPE_KEY_WINDOW_MS,
        consistency_window_ms: STRIPE_LIKE_CONSISTENCY_WINDOW_MS,
        request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
    }
}

/// Why an [`HttpProvider`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The base URL does not parse or is not `http://`.
    #[error("invalid provider base URL {url:?}: {reason}")]
    BaseUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
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

/// How to reach a provider.
#[derive(Clone, Debug)]
pub struct HttpProviderConfig {
    /// E.g. `http://127.0.0.1:4242`; paths `/v1/...` are appended to it.
    pub base_url: String,
    /// What the provider can do, declared to the engine as is — except its
    /// `request_timeout_ms`, which is this client's own `request_timeout_ms`.
    pub capability: Capability,
    /// How long to wait for a TCP connection. Default [`DEFAULT_CONNECT_TIMEOUT_MS`].
    pub connect_timeout_ms: u64,
    /// How long a whole request may take. Default [`DEFAULT_REQUEST_TIMEOUT_MS`].
    pub request_timeout_ms: u64,
    /// Where each request's `traceparent` comes from. Default `None`: no header.
    pub current_trace: Option<CurrentTrace>,
}

impl HttpProviderConfig {
    /// A Stripe-like provider at `base_url` with the default timeouts.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            capability: stripe_like(),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            current_trace: None,
        }
    }
}

/// A payment provider reached over HTTP.
#[derive(Clone, Debug)]
pub struct HttpProvider {
    client: reqwest::Client,
    base: Url,
    capability: Capability,
    current_trace: Option<CurrentTrace>,
}

/// Everything but unreserved characters is encoded, so `:` and `/` in keys stay inside one
/// path segment whatever the server's router does with them.
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

impl HttpProvider {
    /// Builds the client. Fails only on a bad configuration, never on the network.
    pub fn new(config: HttpProviderConfig) -> Result<Self, Error> {
        let client = client(config.connect_timeout_ms, config.request_timeout_ms)?;
        let bad = |reason: String| Error::BaseUrl { url: config.base_url.clone(), reason };
        let mut base = Url::parse(&config.base_url).map_err(|e| bad(e.to_string()))?;
        if base.scheme() != "http" {
            return Err(bad("only http:// is supported (no TLS is compiled in)".into()));
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(bad("a base URL has no query or fragment".into()));
        }
        // A trailing slash makes `join("v1/…")` append rather than replace the last segment.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        // How long a request may still be in flight is this client's timeout, whatever was
        // declared: the ledger waits for it before believing an "absent".
        let capability = Capability { request_timeout_ms: config.request_timeout_ms, ..config.capability };
        Ok(Self { client, base, capability, current_trace: config.current_trace })
    }

    fn url(&self, path: &str) -> Result<Url, String> {
        self.base.join(path).map_err(|e| format!("cannot build the URL for {path}: {e}"))
    }

    fn traced(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        traced(self.current_trace, request)
    }

    async fn call(&self, request: &EffectRequest) -> CallOutcome {
        let path = match request.kind {
            EffectKind::Charge => "v1/charges",
            EffectKind::Refund => "v1/refunds",
        };
        let url = match self.url(path) {
            Ok(url) => url,
            Err(detail) => return CallOutcome::NotSent { detail },
        };
        let mut body = serde_json::json!({
            "amount": request.amount_minor,
            "currency": request.currency,
            "metadata": {
                "order_id": request.order_id,
                "intent_id": request.intent_id,
                "tenant": request.tenant,
            },
        });
        if let (Some(method), Some(fields)) = (&request.payment_method, body.as_object_mut()) {
            // The one place the secret is exposed: into the request body, never into a log.
            fields.insert("payment_method".into(), method.expose().into());
        }
        let post = self.traced(self.client.post(url)).header("Idempotency-Key", &request.idempotency_key).json(&body);
        match exchange(capped(post, request, self.capability.request_timeout_ms)).await {
            Ok((status, _, bytes)) => classify_effect_answer(request, status, &bytes),
            Err(outcome) => outcome,
        }
    }

    async fn find(&self, kind: EffectKind, key: &str) -> LookupOutcome {
        let path = format!("v1/effects/{}", utf8_percent_encode(key, KEY_SEGMENT));
        let url = match self.url(&path) {
            Ok(url) => url,
            Err(detail) => return LookupOutcome::Unavailable { detail },
        };
        let response = match self.traced(self.client.get(url)).send().await {
            Ok(response) => response,
            Err(e) => {
                return LookupOutcome::Unavailable { detail: transport_detail(&e) };
            }
        };
        let status = response.status();
        match response.bytes().await {
            Ok(bytes) => classify_lookup_answer(kind, status, &bytes),
            Err(e) => {
                LookupOutcome::Unavailable { detail: format!("HTTP {status}, answer lost: {}", transport_detail(&e)) }
            }
        }
    }
}

impl PaymentProvider for HttpProvider {
    fn capability(&self) -> Capability {
        self.capability
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            // A provider may echo the payment method back: it is scrubbed before it is logged.
            let outcome = match &request.payment_method {
                Some(secret) => self.call(request).await.scrubbed(secret),
                None => self.call(request).await,
            };
            tracing::debug!(
                effect.idempotency_key_hash = %engine::canonical::sha256_hex(request.idempotency_key.as_bytes()),
                kind = request.kind.as_str(),
                outcome = ?outcome,
                "provider call"
            );
            outcome
        })
    }

    fn lookup<'a>(&'a self, kind: EffectKind, idempotency_key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            let outcome = self.find(kind, idempotency_key).await;
            tracing::debug!(
                effect.idempotency_key_hash = %engine::canonical::sha256_hex(idempotency_key.as_bytes()),
                kind = kind.as_str(),
                outcome = ?outcome,
                "provider lookup"
            );
            outcome
        })
    }
}

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

/// The provider's object for an effect, as much of it as Keel reads.
#[derive(Deserialize)]
struct ProviderObject {
    id: String,
    object: String,
    amount: i64,
    currency: String,
    status: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type")]
    kind: String,
    code: Option<String>,
}

/// Reads a body strictly (no duplicate key, see `engine::canonical::parse_strict`) into `T`.
pub(crate) fn read_strict<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let value = engine::canonical::parse_strict(text).map_err(|e| e.to_string())?;
    engine::canonical::decode(value).map_err(|e| e.to_string())
}

fn error_body(bytes: &[u8]) -> Option<ErrorDetail> {
    read_strict::<ErrorBody>(bytes).ok().map(|b| b.error)
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

fn classify_effect_answer(request: &EffectRequest, status: StatusCode, bytes: &[u8]) -> CallOutcome {
    let protocol = |detail: String| unknown(UnknownReason::Protocol, detail);
    let unavailable = |detail: String| unknown(UnknownReason::ProviderUnavailable, detail);
    match status.as_u16() {
        200 => {
            let object: ProviderObject = match read_strict(bytes) {
                Ok(object) => object,
                Err(e) => {
                    return protocol(format!("HTTP 200 with an unreadable body ({e}): {}", excerpt(bytes)));
                }
            };
            if object.object != request.kind.as_str() {
                return protocol(format!("HTTP 200 with a {:?} object for a {}", object.object, request.kind.as_str()));
            }
            if object.status != "succeeded" {
                return protocol(format!("HTTP 200 with status {:?}", object.status));
            }
            let evidence = match evidence_of(object.id, object.amount, &object.currency) {
                Ok(evidence) => evidence,
                Err(e) => return protocol(format!("HTTP 200 without evidence: {e}")),
            };
            if evidence.amount_minor != request.amount_minor || evidence.currency != request.currency {
                return protocol(format!(
                    "HTTP 200 for {} {} but {} {} was asked",
                    evidence.amount_minor, evidence.currency, request.amount_minor, request.currency
                ));
            }
            CallOutcome::Succeeded(evidence)
        }
        402 => match error_body(bytes) {
            Some(error) if error.kind == "card_error" => {
                CallOutcome::Declined { code: error.code.unwrap_or_else(|| "card_error".to_owned()) }
            }
            _ => protocol(format!("HTTP 402 without a card_error: {}", excerpt(bytes))),
        },
        400 => match error_body(bytes) {
            Some(error) if error.kind == "idempotency_error" => protocol(format!(
                "idempotency key refused ({}): an effect may exist under it",
                error.code.as_deref().unwrap_or("no code")
            )),
            _ => protocol(format!("HTTP 400: {}", excerpt(bytes))),
        },
        409 => unavailable(format!("HTTP 409, the key is in flight elsewhere: {}", excerpt(bytes))),
        429 => unavailable(format!("HTTP 429: {}", excerpt(bytes))),
        500..=599 => unavailable(format!("HTTP {status}: {}", excerpt(bytes))),
        _ => protocol(format!("HTTP {status}: {}", excerpt(bytes))),
    }
}

fn classify_lookup_answer(kind: EffectKind, status: StatusCode, bytes: &[u8]) -> LookupOutcome {
    let unavailable = |detail: String| LookupOutcome::Unavailable { detail };
    match status.as_u16() {
        200 => {
            let object: ProviderObject = match read_strict(bytes) {
                Ok(object) => object,
                Err(e) => {
                    return unavailable(format!("protocol: HTTP 200 with an unreadable body ({e})"));
                }
            };
            if object.object != kind.as_str() {
                return unavailable(format!("inconsistent: a {:?} object for a {} key", object.object, kind.as_str()));
            }
            if object.status != "succeeded" {
                return unavailable(format!("inconsistent: status {:?}", object.status));
            }
            match evidence_of(object.id, object.amount, &object.currency) {
                Ok(evidence) => LookupOutcome::Found(evidence),
                Err(e) => unavailable(format!("protocol: HTTP 200 without evidence: {e}")),
            }
        }
        404 => match error_body(bytes) {
            Some(error) if error.kind == "not_found" => LookupOutcome::Absent,
            _ => unavailable(format!("HTTP 404 without a not_found error: {}", excerpt(bytes))),
        },
        _ => unavailable(format!("HTTP {status}: {}", excerpt(bytes))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> EffectRequest {
        EffectRequest {
            kind: EffectKind::Charge,
            idempotency_key: "charge:t:i".into(),
            tenant: "t".into(),
            intent_id: "i".into(),
            order_id: "o".into(),
            amount_minor: 4900,
            currency: "EUR".into(),
            payment_method: None,
            fingerprint: "f".repeat(64),
            charge_ref: None,
            timeout_ms: None,
        }
    }

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

    fn ok(status: u16) -> StatusCode {
        StatusCode::from_u16(status).unwrap_or_else(|e| panic!("{status} is a valid status code: {e}"))
    }

    #[test]
    fn success_needs_matching_object_status_amount_and_currency() {
        let r = request();
        let body = br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"eur","status":"succeeded"}"#;
        assert_eq!(
            classify_effect_answer(&r, ok(200), body),
            CallOutcome::Succeeded(Evidence {
                provider_ref: "ch_1".into(),
                amount_minor: 4900,
                currency: "EUR".into()
            })
        );
        for bad in [
            &br#"{"id":"re_1","object":"refund","amount":4900,"currency":"EUR","status":"succeeded"}"#[..],
            br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"EUR","status":"pending"}"#,
            br#"{"id":"ch_1","object":"charge","amount":4901,"currency":"EUR","status":"succeeded"}"#,
            br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"USD","status":"succeeded"}"#,
            b"not json",
        ] {
            assert!(
                matches!(
                    classify_effect_answer(&r, ok(200), bad),
                    CallOutcome::Unknown { reason: UnknownReason::Protocol, .. }
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_lower_case_currency_is_normalised_and_a_blank_or_duplicated_answer_is_no_evidence() {
        let r = request();
        let lower = br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"eur","status":"succeeded"}"#;
        match classify_effect_answer(&r, ok(200), lower) {
            CallOutcome::Succeeded(evidence) => assert_eq!(evidence.currency, "EUR"),
            other => panic!("expected Succeeded, got {other:?}"),
        }
        match classify_lookup_answer(EffectKind::Charge, ok(200), lower) {
            LookupOutcome::Found(evidence) => assert_eq!(evidence.currency, "EUR"),
            other => panic!("expected Found, got {other:?}"),
        }
        for bad in [
            &br#"{"id":"","object":"charge","amount":4900,"currency":"EUR","status":"succeeded"}"#[..],
            br#"{"id":" ","object":"charge","amount":4900,"currency":"EUR","status":"succeeded"}"#,
            br#"{"object":"charge","amount":4900,"currency":"EUR","status":"succeeded"}"#,
            br#"{"id":"ch_1","object":"charge","amount":1,"amount":4900,"currency":"EUR","status":"succeeded"}"#,
            br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"EUR","status":"failed","status":"succeeded"}"#,
            br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"E\u0055R","status":"succeeded","id":"ch_2"}"#,
            br#"{"id":"ch_1","object":"charge","amount":4900,"currency":"EURO","status":"succeeded"}"#,
        ] {
            assert!(
                matches!(
                    classify_effect_answer(&r, ok(200), bad),
                    CallOutcome::Unknown { reason: UnknownReason::Protocol, .. }
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
            assert!(
                matches!(classify_lookup_answer(EffectKind::Charge, ok(200), bad), LookupOutcome::Unavailable { .. }),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let duplicated = br#"{"error":{"type":"invalid_request_error","type":"card_error","code":"x"}}"#;
        assert!(matches!(classify_effect_answer(&r, ok(402), duplicated), CallOutcome::Unknown { .. }));
        let absent_twice = br#"{"error":{"type":"api_error","type":"not_found"}}"#;
        assert!(matches!(
            classify_lookup_answer(EffectKind::Charge, ok(404), absent_twice),
            LookupOutcome::Unavailable { .. }
        ));
    }

    #[test]
    fn the_capability_carries_the_request_timeout() -> Result<(), Error> {
        let mut config = HttpProviderConfig::new("http://127.0.0.1:9");
        config.request_timeout_ms = 1_234;
        assert_eq!(HttpProvider::new(config)?.capability().request_timeout_ms, 1_234);
        Ok(())
    }

    #[test]
    fn only_a_card_error_is_a_decline() {
        let r = request();
        let card = br#"{"error":{"type":"card_error","code":"insufficient_funds"}}"#;
        assert_eq!(
            classify_effect_answer(&r, ok(402), card),
            CallOutcome::Declined { code: "insufficient_funds".into() }
        );
        let other = br#"{"error":{"type":"invalid_request_error","code":"parameter_invalid"}}"#;
        for status in [400, 401, 402, 403, 404, 422] {
            assert!(
                matches!(
                    classify_effect_answer(&r, ok(status), other),
                    CallOutcome::Unknown { reason: UnknownReason::Protocol, .. }
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn transient_statuses_are_unavailable() {
        let r = request();
        for status in [409, 429, 500, 502, 503, 504] {
            assert!(
                matches!(
                    classify_effect_answer(&r, ok(status), b""),
                    CallOutcome::Unknown { reason: UnknownReason::ProviderUnavailable, .. }
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn redirects_and_other_successes_are_protocol_errors() {
        let r = request();
        for status in [201, 204, 301, 302, 307] {
            assert!(
                matches!(
                    classify_effect_answer(&r, ok(status), b""),
                    CallOutcome::Unknown { reason: UnknownReason::Protocol, .. }
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn a_bare_404_is_not_an_absence() {
        assert_eq!(
            classify_lookup_answer(EffectKind::Charge, ok(404), br#"{"error":{"type":"not_found"}}"#),
            LookupOutcome::Absent
        );
        assert!(matches!(
            classify_lookup_answer(EffectKind::Charge, ok(404), b"<html>Not Found</html>"),
            LookupOutcome::Unavailable { .. }
        ));
    }

    #[test]
    fn a_lookup_of_the_wrong_kind_is_inconsistent() {
        let body = br#"{"id":"re_1","object":"refund","amount":1,"currency":"EUR","status":"succeeded"}"#;
        match classify_lookup_answer(EffectKind::Charge, ok(200), body) {
            LookupOutcome::Unavailable { detail } => {
                assert!(detail.starts_with("inconsistent"), "{detail}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn config_is_validated() {
        let mut config = HttpProviderConfig::new("https://example.com");
        assert!(matches!(HttpProvider::new(config.clone()), Err(Error::BaseUrl { .. })));
        config.base_url = "http://127.0.0.1:1".into();
        config.request_timeout_ms = 0;
        assert!(matches!(HttpProvider::new(config), Err(Error::ZeroTimeout { .. })));
    }

    #[test]
    fn keys_are_one_path_segment() -> Result<(), Error> {
        let provider = HttpProvider::new(HttpProviderConfig::new("http://127.0.0.1:9/base"))?;
        let key = "charge:t/1:order intent?#%";
        let path = format!("v1/effects/{}", utf8_percent_encode(key, KEY_SEGMENT));
        let url = provider.url(&path).unwrap_or_else(|e| panic!("a percent-encoded path joins: {e}"));
        assert_eq!(url.as_str(), "http://127.0.0.1:9/base/v1/effects/charge%3At%2F1%3Aorder%20intent%3F%23%25");
        Ok(())
    }
}
