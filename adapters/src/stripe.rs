//! A [`PaymentProvider`] on Stripe's own API: PaymentIntents for charges, Refunds for refunds.
//!
//! Owns the requests Keel sends Stripe (form-encoded, `Authorization: Bearer` with the secret
//! key, `Stripe-Version` pinned to [`STRIPE_VERSION`], the intent key as `Idempotency-Key`),
//! Stripe's [`SecretKey`], and the mapping from Stripe's documented answers to a
//! [`CallOutcome`] or [`LookupOutcome`]. The HTTP plumbing (client, timeouts, transport
//! failures) is [`crate::transport`]'s.
//!
//! It must never report "no effect" unless Stripe said so definitively (a card decline, a
//! PaymentIntent left without a payment, a failed refund) or the request provably never left;
//! never read an error page as an absence; never retry on its own; and never show the secret
//! key: not in a log, an event, an error, a trace attribute or an echoed body.
//!
//! # Charges: `POST /v1/payment_intents`
//!
//! `amount`, `currency` (lower case), `payment_method`, `payment_method_types[]=card`,
//! `confirm=true`, `off_session=true`, `metadata[keel_intent_key]`, `metadata[keel_fingerprint]`,
//! `metadata[keel_tenant]`, `metadata[keel_intent_id]`, `metadata[keel_order_id]`.
//! Naming the card type keeps Stripe from asking for a `return_url` (redirect-based methods
//! are what automatic payment methods would add).
//!
//! | What happened | Outcome |
//! |---|---|
//! | 200, a `payment_intent` in `succeeded`, id `pi_…`, the amount and currency asked (currency compared case-insensitively, recorded upper case) | `Succeeded(Evidence { provider_ref: pi_… })` |
//! | 200, in `requires_payment_method` or `requires_action` (off-session, nobody can act) | `Declined { last_payment_error's decline_code, else its code, else the status }` |
//! | 200, in `processing` | `Unknown { ProviderUnavailable }`: not final, reconcile later |
//! | 200, another status, object, amount or currency, or a body that does not parse | `Unknown { Protocol }` |
//!
//! # Refunds: `POST /v1/refunds`
//!
//! `payment_intent` (the charge's evidence, [`EffectRequest::charge_ref`]), `amount`, the same
//! metadata. A refund without a single charge to refund is not sent (`NotSent`).
//!
//! | What happened | Outcome |
//! |---|---|
//! | 200, a `refund` in `succeeded`, id `re_…`, the amount and currency asked | `Succeeded(Evidence { provider_ref: re_… })` |
//! | 200, in `failed` or `canceled` | `Declined { failure_reason, else refund_<status> }` |
//! | 200, in `pending` or `requires_action` | `Unknown { ProviderUnavailable }`: not final |
//! | 200, anything else | `Unknown { Protocol }` |
//!
//! # Errors, both kinds
//!
//! | What happened | Outcome |
//! |---|---|
//! | 402, `error.type` = `card_error` (or `error.code` = `card_declined`, see below), its PaymentIntent (if given) not paid | `Declined { decline_code, else code, else card_error }` |
//! | 402 otherwise, or naming a PaymentIntent in `succeeded`/`processing`/`requires_capture` | `Unknown { Protocol }` |
//! | 400 `idempotency_error` (the key reused with other parameters) | `Unknown { Protocol }`: an effect may exist under the key |
//! | 409 (the key is in flight), 429, 5xx | `Unknown { ProviderUnavailable }` |
//! | any other status (400, 401, 403, 404…) | `Unknown { Protocol }`: a misconfiguration an operator must see; it never releases money |
//! | transport failures | as [`crate::transport`]: connect error `NotSent`, timeout `Unknown { Timeout }`, anything else `Unknown { ConnectionLost }` |
//!
//! Every `Unknown` detail ends with the answer's `Request-Id`, `Stripe-Should-Retry` and
//! `Idempotent-Replayed` headers when Stripe sent them (an outcome has no other field for them).
//!
//! Stripe answers a decline 402 with `type: card_error`. localstripe 1.15.10 answers it 402
//! with `type: invalid_request_error` and `code: card_declined`; Stripe's `card_declined` code
//! names a decline whatever the type, so both are read as one.
//!
//! # Lookups
//!
//! | What | How | Outcome |
//! |---|---|---|
//! | a charge | `GET /v1/payment_intents/search?query=metadata['keel_intent_key']:'KEY'` | one `succeeded` → `Found`; two → `Unavailable` (inconsistent); one not final (`processing`, `requires_confirmation`, `requires_capture`) → `Unavailable`; none, or only unpaid ones (`requires_payment_method`, `requires_action`, `canceled`) → `Absent` |
//! | a refund | `GET /v1/refunds?limit=100`, matched on `metadata[keel_intent_key]` | one `succeeded` → `Found`; `pending`/`requires_action` → `Unavailable`; only `failed`/`canceled` → `Absent`; not among them → `Absent` when the page is the whole list (`has_more: false`: the account has no more refunds), else `Unavailable`: Stripe has no search on refunds, and a lookup is not given the charge whose refunds it would list, so a refund missing from a partial list is never an absence |
//! | any 404 (localstripe has no search route), other status, unreadable body, transport failure | | `Unavailable`: never `Absent` |
//!
//! Stripe documents search as eventually consistent, usually within a minute: the adapter
//! declares [`STRIPE_SEARCH_LAG_MS`] as its consistency window, and Stripe's 24 h key window
//! ([`STRIPE_KEY_WINDOW_MS`]), in [`capability`].
//!
//! # Transport
//!
//! HTTPS to any host, verified against the Mozilla root store compiled in (`webpki-roots`);
//! plain `http://` only to a loopback address (a local fake): any other `http://` URL is
//! refused when the provider is built ([`base_url`]).

use crate::transport::{
    self, CurrentTrace, capped, evidence_of, excerpt, exchange, read_strict, traced, transport_detail, unknown,
};
use engine::provider::{
    BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, Evidence, LookupOutcome, PaymentProvider, Secret,
    UnknownReason,
};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use zeroize::Zeroizing;

/// Where Stripe's API lives.
pub const STRIPE_API_BASE: &str = "https://api.stripe.com";

/// The API version every request pins with `Stripe-Version`, so an account's default version
/// (which its owner may upgrade at any time) never changes what Keel reads. 2024-06-20: a
/// PaymentIntent carries `latest_charge` (no `charges` list), refunds take `payment_intent`,
/// and automatic payment methods are on unless `payment_method_types` is given — which Keel
/// gives. Changing it is a change of wire format: re-read Stripe's changelog first.
pub const STRIPE_VERSION: &str = "2024-06-20";

/// Stripe keeps idempotency keys for at least 24 hours.
pub const STRIPE_KEY_WINDOW_MS: u64 = 24 * 60 * 60 * 1_000;

/// How long Stripe's search may miss a fresh PaymentIntent: its documentation calls search
/// eventually consistent, with data "usually" searchable within a minute. The adapter's
/// consistency window: Keel believes an absence only this long after the request is over.
pub const STRIPE_SEARCH_LAG_MS: u64 = 60_000;

/// How long a 429 without a readable `Retry-After` holds a declared rate's throttle off: Stripe
/// asks clients to back off and retry "after a short delay"; a second is its own SDKs' first wait.
pub const THROTTLED_RETRY_AFTER_DEFAULT_MS: u64 = 1_000;

/// The longest a 429's `Retry-After` holds the throttle off: past a minute the provider is
/// down more than throttled, and each request's own deadline decides.
pub const THROTTLED_RETRY_AFTER_MAX_MS: u64 = 60_000;

/// Default timeout of one request to Stripe: a confirmed PaymentIntent usually answers within
/// a few seconds, but the card network may take longer; Stripe's own libraries wait 80 s.
/// 30 s keeps unknown outcomes rare without holding a run far past its deadline (a run's time
/// left still caps each request).
pub const STRIPE_REQUEST_TIMEOUT_DEFAULT_MS: u64 = 30_000;

/// The key Keel sends a plain `http://` loopback provider (the simulator, a local fake) when
/// the operator gave none: a test key (`sk_test_…`, which the simulator requires and any fake
/// accepts), public and no secret — printed here, in the source. Only [`is_loopback_http`]
/// URLs get it, and only when no key is given; an `https://` provider never does.
pub const LOOPBACK_TEST_KEY: &str = "sk_test_keel_loopback";

/// The consistency window Keel declares for a plain `http://` loopback provider unless told
/// otherwise: the simulator's search lags only as its fault plan says, and 2 s covers the
/// lag its sample plans play, so recovery tests need not wait out Stripe's minute.
pub const LOOPBACK_CONSISTENCY_WINDOW_MS: u64 = 2_000;

/// The request timeout Keel uses for a plain `http://` loopback provider unless told
/// otherwise: loopback answers in milliseconds; 5 s is far above that and keeps a held
/// answer (the simulator's `timeout_after_effect`) from stalling a run for Stripe's 30 s.
pub const LOOPBACK_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// Longest secret key accepted: Stripe's keys are about a hundred characters; 255 is Stripe's
/// own bound on object ids, far above any key, short enough for one header.
pub const STRIPE_KEY_MAX_CHARS: usize = 255;

/// PaymentIntents one search page returns: a key has one (a resend under it is deduplicated),
/// so more than this means something else wrote under the key.
const SEARCH_PAGE: &str = "10";

/// Refunds one lookup reads: the most recent ones, one page (Stripe's largest).
const REFUND_PAGE: &str = "100";

/// The metadata field carrying the intent key.
const KEY_FIELD: &str = "keel_intent_key";

/// The form field setting [`KEY_FIELD`].
const KEY_METADATA: &str = "metadata[keel_intent_key]";

/// The form field setting the intent's payload fingerprint in the metadata.
const FINGERPRINT_METADATA: &str = "metadata[keel_fingerprint]";

/// The form fields naming the effect's tenant, intent and order in the metadata: what an
/// operator reads in Stripe's dashboard, and what the simulator counts effects by.
const OWNER_METADATA: [&str; 3] = ["metadata[keel_tenant]", "metadata[keel_intent_id]", "metadata[keel_order_id]"];

/// Stripe's capability: it deduplicates on `Idempotency-Key` for 24 h and can look a charge up
/// by metadata search, which lags up to [`STRIPE_SEARCH_LAG_MS`] (tier `dedup+lookup`).
pub fn capability() -> Capability {
    Capability {
        dedup_by_key: true,
        lookup: true,
        key_window_ms: STRIPE_KEY_WINDOW_MS,
        consistency_window_ms: STRIPE_SEARCH_LAG_MS,
        request_timeout_ms: STRIPE_REQUEST_TIMEOUT_DEFAULT_MS,
    }
}

/// Stripe's capability as a local fake plays it ([`capability`] with
/// [`LOOPBACK_CONSISTENCY_WINDOW_MS`] and [`LOOPBACK_REQUEST_TIMEOUT_MS`]): what the binary
/// declares for the simulator, and what in-process providers in tests declare.
pub fn local_capability() -> Capability {
    Capability {
        consistency_window_ms: LOOPBACK_CONSISTENCY_WINDOW_MS,
        request_timeout_ms: LOOPBACK_REQUEST_TIMEOUT_MS,
        ..capability()
    }
}

/// Whether `text` is a plain `http://` URL to a loopback address (`127.0.0.0/8`, `::1`,
/// `localhost`): the only plain-text provider [`base_url`] accepts, a local fake.
pub fn is_loopback_http(text: &str) -> bool {
    Url::parse(text).is_ok_and(|url| url.scheme() == "http" && is_loopback(&url))
}

fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>();
    host.eq_ignore_ascii_case("localhost") || ip.is_ok_and(|ip| ip.is_loopback())
}

/// A Stripe secret (`sk_…`) or restricted (`rk_…`) key, held in memory only: zeroized when
/// dropped, and its `Debug` and `Display` never show it.
pub struct SecretKey(Zeroizing<String>);

/// Why a secret key was refused. Its messages never quote the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// Nothing but whitespace.
    #[error("the Stripe secret key is empty")]
    Empty,
    /// Not `sk_…` or `rk_…`.
    #[error("the Stripe secret key must start with sk_ (secret) or rk_ (restricted)")]
    Prefix,
    /// A character Stripe's keys never hold (they are letters, digits and `_`).
    #[error("the Stripe secret key holds a character other than a letter, a digit or _")]
    Characters,
    /// Longer than [`STRIPE_KEY_MAX_CHARS`].
    #[error("the Stripe secret key is longer than {STRIPE_KEY_MAX_CHARS} characters")]
    TooLong,
}

impl SecretKey {
    /// The key in `text`, around which whitespace (a key file's final newline) is ignored.
    ///
    /// # Errors
    ///
    /// Why the text is not a Stripe key; the message never quotes it.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let key = text.trim();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > STRIPE_KEY_MAX_CHARS {
            return Err(KeyError::TooLong);
        }
        if !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(KeyError::Characters);
        }
        let rest = key.strip_prefix("sk_").or_else(|| key.strip_prefix("rk_")).ok_or(KeyError::Prefix)?;
        if rest.is_empty() {
            return Err(KeyError::Prefix);
        }
        Ok(Self(Zeroizing::new(key.to_owned())))
    }

    /// The `Authorization` header's value, marked sensitive (never printed by the HTTP stack).
    fn authorization(&self) -> Option<HeaderValue> {
        let bearer = Zeroizing::new(format!("Bearer {}", self.0.as_str()));
        let mut value = HeaderValue::from_str(&bearer).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    /// `outcome` with the key removed from every text a peer may have echoed it in.
    fn scrubbed(&self, outcome: CallOutcome) -> CallOutcome {
        outcome.scrubbed(&Secret::new(self.0.as_str()))
    }

    /// `outcome`'s detail with the key removed.
    fn scrubbed_lookup(&self, outcome: LookupOutcome) -> LookupOutcome {
        match outcome {
            LookupOutcome::Unavailable { detail } => {
                LookupOutcome::Unavailable { detail: Secret::new(self.0.as_str()).scrub(&detail) }
            }
            other => other,
        }
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey([redacted])")
    }
}

impl fmt::Display for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a [`StripeProvider`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The base URL does not parse, is neither `https://` nor a loopback `http://`, or has a
    /// query or fragment.
    #[error("invalid Stripe base URL {url:?}: {reason}")]
    BaseUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (a zero timeout included).
    #[error(transparent)]
    Client(#[from] transport::Error),
}

/// The base URL `text` as the adapter uses it (with a trailing `/`), or why it is refused:
/// `https://` to any host; `http://` only to a loopback address (`127.0.0.0/8`, `::1`,
/// `localhost`), so a secret key never crosses a network in clear.
///
/// # Errors
///
/// [`Error::BaseUrl`], saying why.
pub fn base_url(text: &str) -> Result<Url, Error> {
    let bad = |reason: &str| Error::BaseUrl { url: text.to_owned(), reason: reason.to_owned() };
    let mut url = Url::parse(text).map_err(|e| bad(&e.to_string()))?;
    let loopback = is_loopback(&url);
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(bad("plain http:// is only for a loopback address (127.0.0.1, ::1, localhost): use https://"));
        }
        _ => return Err(bad("the scheme must be https:// (or http:// to a loopback address)")),
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a base URL has no query or fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("the key goes in the Authorization header, never in the URL"));
    }
    // A trailing slash makes `join("v1/…")` append rather than replace the last segment.
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// How to reach Stripe.
#[derive(Clone, Debug)]
pub struct StripeConfig {
    /// [`STRIPE_API_BASE`], or a local fake's `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The secret key, sent as `Authorization: Bearer` and nowhere else.
    pub key: Arc<SecretKey>,
    /// What Stripe can do, declared to the engine as is — except its `request_timeout_ms`,
    /// which is this client's own. Default [`capability`].
    pub capability: Capability,
    /// How long to wait for a TCP connection (and TLS). Default
    /// [`transport::DEFAULT_CONNECT_TIMEOUT_MS`].
    pub connect_timeout_ms: u64,
    /// How long a whole request may take. Default [`STRIPE_REQUEST_TIMEOUT_DEFAULT_MS`].
    pub request_timeout_ms: u64,
    /// Where each request's `traceparent` comes from. Default `None`: no header.
    pub current_trace: Option<CurrentTrace>,
    /// The throttle a declared rate sends through (`flow::RateLimited`): told of every 429,
    /// with its `Retry-After`. Default `None`.
    pub throttle: Option<Arc<crate::flow::Throttle>>,
}

impl StripeConfig {
    /// Stripe at `base_url` with `key`, its declared capability and the default timeouts.
    pub fn new(base_url: impl Into<String>, key: Arc<SecretKey>) -> Self {
        Self {
            base_url: base_url.into(),
            key,
            capability: capability(),
            connect_timeout_ms: transport::DEFAULT_CONNECT_TIMEOUT_MS,
            request_timeout_ms: STRIPE_REQUEST_TIMEOUT_DEFAULT_MS,
            current_trace: None,
            throttle: None,
        }
    }
}

/// Stripe, as a payment provider.
#[derive(Clone, Debug)]
pub struct StripeProvider {
    client: reqwest::Client,
    base: Url,
    key: Arc<SecretKey>,
    capability: Capability,
    current_trace: Option<CurrentTrace>,
    throttle: Option<Arc<crate::flow::Throttle>>,
}

/// A PaymentIntent, as much of it as Keel reads.
#[derive(Deserialize)]
struct PaymentIntent {
    id: String,
    object: String,
    amount: i64,
    currency: String,
    status: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    last_payment_error: Option<ErrorDetail>,
}

/// A Refund, as much of it as Keel reads.
#[derive(Deserialize)]
struct Refund {
    id: String,
    object: String,
    amount: i64,
    currency: String,
    status: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    failure_reason: Option<String>,
}

/// A page of a list or a search.
#[derive(Deserialize)]
struct Page<T> {
    object: String,
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

/// Stripe's error object (also a PaymentIntent's `last_payment_error`).
#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
    /// The PaymentIntent the error is about, when it is one (Stripe sends it on a decline).
    #[serde(default)]
    payment_intent: Option<StatusOnly>,
}

impl ErrorDetail {
    /// The most precise code: the issuer's `decline_code`, else Stripe's `code`.
    fn best_code(&self) -> Option<String> {
        self.decline_code.clone().or_else(|| self.code.clone()).filter(|code| !code.trim().is_empty())
    }
}

#[derive(Deserialize)]
struct StatusOnly {
    status: String,
}

/// The headers Stripe documents for retries and replays, and its request id, for a detail.
fn stripe_notes(headers: &HeaderMap) -> String {
    /// Enough for any value Stripe sends in these headers (`req_…`, `true`).
    const NOTE_MAX_CHARS: usize = 64;
    let notes: Vec<String> = ["Request-Id", "Stripe-Should-Retry", "Idempotent-Replayed"]
        .into_iter()
        .filter_map(|name| {
            let value = headers.get(name)?.to_str().ok()?;
            let value: String = value.chars().filter(char::is_ascii_graphic).take(NOTE_MAX_CHARS).collect();
            Some(format!("{name}: {value}"))
        })
        .collect();
    if notes.is_empty() { String::new() } else { format!(" [{}]", notes.join(", ")) }
}

/// `outcome` with `notes` appended to its detail when it is unknown.
fn noted(outcome: CallOutcome, notes: &str) -> CallOutcome {
    match outcome {
        CallOutcome::Unknown { reason, detail } => CallOutcome::Unknown { reason, detail: format!("{detail}{notes}") },
        other => other,
    }
}

/// The evidence of a succeeded object, checked against the request: an id with Stripe's
/// prefix for the kind, the amount and currency asked.
fn checked_evidence(
    request: &EffectRequest,
    prefix: &str,
    id: String,
    amount: i64,
    currency: &str,
) -> Result<Evidence, String> {
    if !id.starts_with(prefix) {
        return Err(format!("the answer's id {id:?} is not a {prefix}… id"));
    }
    let evidence = evidence_of(id, amount, currency)?;
    if evidence.amount_minor != request.amount_minor || evidence.currency != request.currency {
        return Err(format!(
            "{} {} moved but {} {} was asked",
            evidence.amount_minor, evidence.currency, request.amount_minor, request.currency
        ));
    }
    Ok(evidence)
}

/// A charge's answer: a PaymentIntent, or an error.
fn classify_charge(request: &EffectRequest, status: StatusCode, bytes: &[u8]) -> CallOutcome {
    let protocol = |detail: String| unknown(UnknownReason::Protocol, detail);
    let intent: PaymentIntent = match answered(status, bytes, "payment_intent", |intent: &PaymentIntent| &intent.object)
    {
        Ok(intent) => intent,
        Err(outcome) => return outcome,
    };
    match intent.status.as_str() {
        "succeeded" => match checked_evidence(request, "pi_", intent.id, intent.amount, &intent.currency) {
            Ok(evidence) => CallOutcome::Succeeded(evidence),
            Err(e) => protocol(format!("HTTP 200, PaymentIntent succeeded, but {e}")),
        },
        "requires_payment_method" | "requires_action" => CallOutcome::Declined {
            code: intent.last_payment_error.and_then(|e| e.best_code()).unwrap_or(intent.status),
        },
        "processing" => unknown(
            UnknownReason::ProviderUnavailable,
            format!("PaymentIntent {} is processing: not final, to reconcile later", intent.id),
        ),
        other => protocol(format!("HTTP 200 with PaymentIntent {} in status {other:?}", intent.id)),
    }
}

/// A refund's answer: a Refund, or an error.
fn classify_refund(request: &EffectRequest, status: StatusCode, bytes: &[u8]) -> CallOutcome {
    let protocol = |detail: String| unknown(UnknownReason::Protocol, detail);
    let refund: Refund = match answered(status, bytes, "refund", |refund: &Refund| &refund.object) {
        Ok(refund) => refund,
        Err(outcome) => return outcome,
    };
    match refund.status.as_str() {
        "succeeded" => match checked_evidence(request, "re_", refund.id, refund.amount, &refund.currency) {
            Ok(evidence) => CallOutcome::Succeeded(evidence),
            Err(e) => protocol(format!("HTTP 200, refund succeeded, but {e}")),
        },
        "failed" | "canceled" => CallOutcome::Declined {
            code: refund.failure_reason.filter(|r| !r.trim().is_empty()).unwrap_or(format!("refund_{}", refund.status)),
        },
        "pending" | "requires_action" => unknown(
            UnknownReason::ProviderUnavailable,
            format!("refund {} is {}: not final, to reconcile later", refund.id, refund.status),
        ),
        other => protocol(format!("HTTP 200 with refund {} in status {other:?}", refund.id)),
    }
}

/// The object a 200 carries, when it reads strictly and is an `object` (`payment_intent`,
/// `refund`); otherwise the outcome the answer is instead (an error status, or unknown).
fn answered<T: serde::de::DeserializeOwned>(
    status: StatusCode,
    bytes: &[u8],
    object: &str,
    object_of: impl Fn(&T) -> &String,
) -> Result<T, CallOutcome> {
    let protocol = |detail: String| unknown(UnknownReason::Protocol, detail);
    if status != StatusCode::OK {
        return Err(classify_error(status, bytes));
    }
    let answer: T = read_strict(bytes)
        .map_err(|e| protocol(format!("HTTP 200 with an unreadable body ({e}): {}", excerpt(bytes))))?;
    match object_of(&answer) {
        named if named == object => Ok(answer),
        other => Err(protocol(format!("HTTP 200 with a {other:?} object where a {object} was expected"))),
    }
}

/// Any answer but a 200: Stripe's error statuses.
fn classify_error(status: StatusCode, bytes: &[u8]) -> CallOutcome {
    let protocol = |detail: String| unknown(UnknownReason::Protocol, detail);
    let unavailable = |detail: String| unknown(UnknownReason::ProviderUnavailable, detail);
    let error = read_strict::<ErrorBody>(bytes).ok().map(|body| body.error);
    match status.as_u16() {
        402 => match error {
            Some(error)
                if error.kind.as_deref() == Some("card_error") || error.code.as_deref() == Some("card_declined") =>
            {
                match error.payment_intent.as_ref().map(|intent| intent.status.as_str()) {
                    Some(paid @ ("succeeded" | "processing" | "requires_capture")) => {
                        protocol(format!("HTTP 402 card error, but its PaymentIntent is {paid}: {}", excerpt(bytes)))
                    }
                    _ => CallOutcome::Declined { code: error.best_code().unwrap_or_else(|| "card_error".to_owned()) },
                }
            }
            _ => protocol(format!("HTTP 402 without a card error: {}", excerpt(bytes))),
        },
        400 => match error {
            Some(error) if error.kind.as_deref() == Some("idempotency_error") => protocol(format!(
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

/// A charge's search answer.
fn classify_search(key: &str, status: StatusCode, bytes: &[u8]) -> LookupOutcome {
    let unavailable = |detail: String| LookupOutcome::Unavailable { detail };
    if status != StatusCode::OK {
        // A 404 is the route missing (localstripe has no search) or a wrong base URL: never
        // an absence, which only an empty search result proves.
        return unavailable(format!("HTTP {status}: {}", excerpt(bytes)));
    }
    let page: Page<PaymentIntent> = match read_strict(bytes) {
        Ok(page) => page,
        Err(e) => return unavailable(format!("protocol: HTTP 200 with an unreadable body ({e})")),
    };
    if page.object != "search_result" {
        return unavailable(format!("protocol: HTTP 200 with a {:?} object for a search", page.object));
    }
    if page.has_more {
        return unavailable(format!("inconsistent: more than {SEARCH_PAGE} PaymentIntents under one key"));
    }
    let mine = page.data.into_iter().filter(|intent| intent.metadata.get(KEY_FIELD).map(String::as_str) == Some(key));
    let mut paid = Vec::new();
    for intent in mine {
        if intent.object != "payment_intent" {
            return unavailable(format!("protocol: a {:?} object in a PaymentIntent search", intent.object));
        }
        match intent.status.as_str() {
            "succeeded" => paid.push(intent),
            "requires_payment_method" | "requires_action" | "canceled" => {}
            other => return unavailable(format!("PaymentIntent {} is {other}: not final", intent.id)),
        }
    }
    match paid.as_slice() {
        [] => LookupOutcome::Absent,
        [intent] => match evidence_of(intent.id.clone(), intent.amount, &intent.currency) {
            Ok(evidence) => LookupOutcome::Found(evidence),
            Err(e) => unavailable(format!("protocol: {e}")),
        },
        more => unavailable(format!("inconsistent: {} PaymentIntents succeeded under one key", more.len())),
    }
}

/// A refund's lookup answer: the most recent refunds, matched on the key.
fn classify_refunds(key: &str, status: StatusCode, bytes: &[u8]) -> LookupOutcome {
    let unavailable = |detail: String| LookupOutcome::Unavailable { detail };
    if status != StatusCode::OK {
        return unavailable(format!("HTTP {status}: {}", excerpt(bytes)));
    }
    let page: Page<Refund> = match read_strict(bytes) {
        Ok(page) => page,
        Err(e) => return unavailable(format!("protocol: HTTP 200 with an unreadable body ({e})")),
    };
    if page.object != "list" {
        return unavailable(format!("protocol: HTTP 200 with a {:?} object for a list", page.object));
    }
    let complete = !page.has_more;
    let mine: Vec<Refund> = page
        .data
        .into_iter()
        .filter(|refund| refund.metadata.get(KEY_FIELD).map(String::as_str) == Some(key))
        .collect();
    if mine.is_empty() {
        // A page without more is every refund of the account: none under the key is an
        // absence (lists, unlike search, are not eventually consistent).
        if complete {
            return LookupOutcome::Absent;
        }
        return unavailable(format!(
            "not among the {REFUND_PAGE} most recent refunds: absence unproven (Stripe has no search on refunds)"
        ));
    }
    let mut paid = Vec::new();
    for refund in mine {
        match refund.status.as_str() {
            "succeeded" => paid.push(refund),
            "failed" | "canceled" => {}
            other => return unavailable(format!("refund {} is {other}: not final", refund.id)),
        }
    }
    match paid.as_slice() {
        [] => LookupOutcome::Absent,
        [refund] => match evidence_of(refund.id.clone(), refund.amount, &refund.currency) {
            Ok(evidence) => LookupOutcome::Found(evidence),
            Err(e) => unavailable(format!("protocol: {e}")),
        },
        more => unavailable(format!("inconsistent: {} refunds succeeded under one key", more.len())),
    }
}

/// A search query's string literal: single quotes, with `\` and `'` escaped (Stripe's search
/// query language).
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl StripeProvider {
    /// Builds the client. Fails only on a bad configuration, never on the network.
    ///
    /// # Errors
    ///
    /// A base URL [`base_url`] refuses, or a client that cannot be built (a zero timeout).
    pub fn new(config: StripeConfig) -> Result<Self, Error> {
        let base = base_url(&config.base_url)?;
        let client = transport::client(config.connect_timeout_ms, config.request_timeout_ms)?;
        let capability = Capability { request_timeout_ms: config.request_timeout_ms, ..config.capability };
        let (key, current_trace, throttle) = (config.key, config.current_trace, config.throttle);
        Ok(Self { client, base, key, capability, current_trace, throttle })
    }

    /// A request to `path` with the key, the pinned version and the trace context.
    fn request(&self, method: reqwest::Method, path: &str) -> Result<reqwest::RequestBuilder, String> {
        let url = self.base.join(path).map_err(|e| format!("cannot build the URL for {path}: {e}"))?;
        let authorization =
            self.key.authorization().ok_or_else(|| "the secret key is not a valid header value".to_owned())?;
        let request = self
            .client
            .request(method, url)
            .header(AUTHORIZATION, authorization)
            .header("Stripe-Version", STRIPE_VERSION);
        Ok(traced(self.current_trace, request))
    }

    /// The form of one effect: its own fields, then the metadata every effect carries.
    fn form(request: &EffectRequest) -> Result<Vec<(&'static str, String)>, String> {
        let mut form = vec![("amount", request.amount_minor.to_string())];
        match request.kind {
            EffectKind::Charge => {
                let method =
                    request.payment_method.as_ref().ok_or_else(|| "a charge needs a payment method".to_owned())?;
                form.extend([
                    ("currency", request.currency.to_ascii_lowercase()),
                    // The one place the payment method is exposed: into the request body.
                    ("payment_method", method.expose().to_owned()),
                    ("payment_method_types[]", "card".to_owned()),
                    ("confirm", "true".to_owned()),
                    ("off_session", "true".to_owned()),
                ]);
            }
            EffectKind::Refund => {
                let charge = request.charge_ref.as_ref().ok_or_else(|| {
                    format!(
                        "order {} has no single validated charge in {} to refund (a Stripe refund names one PaymentIntent)",
                        request.order_id, request.currency
                    )
                })?;
                form.push(("payment_intent", charge.clone()));
            }
        }
        form.extend([
            (KEY_METADATA, request.idempotency_key.clone()),
            (FINGERPRINT_METADATA, request.fingerprint.clone()),
        ]);
        let [tenant, intent, order] = OWNER_METADATA;
        form.extend([
            (tenant, request.tenant.clone()),
            (intent, request.intent_id.clone()),
            (order, request.order_id.clone()),
        ]);
        Ok(form)
    }

    /// A 429 holds the throttle off for its `Retry-After` (whole seconds, as Stripe sends it;
    /// [`THROTTLED_RETRY_AFTER_DEFAULT_MS`] when absent or unreadable, capped at
    /// [`THROTTLED_RETRY_AFTER_MAX_MS`]).
    fn throttled(&self, status: StatusCode, headers: &HeaderMap) {
        let Some(throttle) = self.throttle.as_ref().filter(|_| status == StatusCode::TOO_MANY_REQUESTS) else {
            return;
        };
        let asked_ms = headers
            .get("Retry-After")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map_or(THROTTLED_RETRY_AFTER_DEFAULT_MS, |seconds| seconds.saturating_mul(1_000));
        throttle.hold_off(std::time::Duration::from_millis(asked_ms.min(THROTTLED_RETRY_AFTER_MAX_MS)));
    }

    async fn call(&self, request: &EffectRequest) -> CallOutcome {
        let path = match request.kind {
            EffectKind::Charge => "v1/payment_intents",
            EffectKind::Refund => "v1/refunds",
        };
        let post = match Self::form(request).and_then(|form| Ok(self.request(reqwest::Method::POST, path)?.form(&form)))
        {
            Ok(post) => post.header("Idempotency-Key", &request.idempotency_key),
            Err(detail) => return CallOutcome::NotSent { detail },
        };
        let (status, headers, bytes) = match exchange(capped(post, request, self.capability.request_timeout_ms)).await {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };
        self.throttled(status, &headers);
        let outcome = match request.kind {
            EffectKind::Charge => classify_charge(request, status, &bytes),
            EffectKind::Refund => classify_refund(request, status, &bytes),
        };
        noted(outcome, &stripe_notes(&headers))
    }

    async fn find(&self, kind: EffectKind, key: &str) -> LookupOutcome {
        let (path, query) = match kind {
            EffectKind::Charge => (
                "v1/payment_intents/search",
                vec![
                    ("query", format!("metadata[{}]:{}", quoted(KEY_FIELD), quoted(key))),
                    ("limit", SEARCH_PAGE.to_owned()),
                ],
            ),
            EffectKind::Refund => ("v1/refunds", vec![("limit", REFUND_PAGE.to_owned())]),
        };
        let get = match self.request(reqwest::Method::GET, path) {
            Ok(get) => get.query(&query),
            Err(detail) => return LookupOutcome::Unavailable { detail },
        };
        let response = match get.send().await {
            Ok(response) => response,
            Err(e) => return LookupOutcome::Unavailable { detail: transport_detail(&e) },
        };
        let status = response.status();
        self.throttled(status, response.headers());
        match response.bytes().await {
            Ok(bytes) => match kind {
                EffectKind::Charge => classify_search(key, status, &bytes),
                EffectKind::Refund => classify_refunds(key, status, &bytes),
            },
            Err(e) => {
                LookupOutcome::Unavailable { detail: format!("HTTP {status}, answer lost: {}", transport_detail(&e)) }
            }
        }
    }
}

impl PaymentProvider for StripeProvider {
    fn capability(&self) -> Capability {
        self.capability
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            // Stripe may echo the key or the payment method back: both are scrubbed before
            // the outcome is logged or returned.
            let outcome = self.key.scrubbed(self.call(request).await);
            let outcome = match &request.payment_method {
                Some(method) => outcome.scrubbed(method),
                None => outcome,
            };
            tracing::debug!(
                effect.idempotency_key_hash = %engine::canonical::sha256_hex(request.idempotency_key.as_bytes()),
                kind = request.kind.as_str(),
                outcome = ?outcome,
                "stripe call"
            );
            outcome
        })
    }

    fn lookup<'a>(&'a self, kind: EffectKind, idempotency_key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            let outcome = self.key.scrubbed_lookup(self.find(kind, idempotency_key).await);
            tracing::debug!(
                effect.idempotency_key_hash = %engine::canonical::sha256_hex(idempotency_key.as_bytes()),
                kind = kind.as_str(),
                outcome = ?outcome,
                "stripe lookup"
            );
            outcome
        })
    }
}

#[cfg(test)]
mod tests;
