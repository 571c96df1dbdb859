//! The simulator's HTTP surface: Stripe's subset ([`super::stripe`]) and its own extras.
//!
//! Owns the routes, the order in which a request meets its key check, its fault and its
//! idempotency record, which lookups a fault hides, and the headers of every answer
//! (`Request-Id`, `Stripe-Should-Retry`, `Idempotent-Replayed`). It must never hold the fault
//! lock or the database across an `.await` on the network or a timer, and never log a payment
//! method.
//!
//! # Order of a charge or refund
//!
//! 1. Check the API key (401), the `Idempotency-Key` and the form (400 `invalid_request_error`):
//!    nothing stored, no fault drawn.
//! 2. Draw the fault for this request from the plan (in arrival order).
//! 3. `fail_before_effect` / `unavailable` answer at once, touching nothing.
//! 4. Otherwise claim the key in one transaction (shared with the claims that arrived meanwhile:
//!    group commit, answered after the commit): replay, conflict, reuse error, a refund refused
//!    for its PaymentIntent, or commit the new answer (the effect, or the decline) with its
//!    record.
//! 5. `slow` / `timeout_after_effect` hold the answer; the record stays `in_flight` (so a
//!    concurrent request with the key gets 409) until the hold ends, then turns `done`. The hold
//!    runs in its own task so the record is completed even if the client hangs up.
//!
//! # Lookups
//!
//! A search or a refund list draws one lookup fault: `lookup_unavailable` answers 503,
//! `lookup_lies` hides every object, `lookup_absent_for_ms` hides those younger than its window
//! (Stripe's search lag).

// The simulator is a separate process standing in for a provider: it keeps its own time,
// like a real provider does, so it reads the system clock directly.
#![allow(clippy::disallowed_methods)]

use super::db::{Answer, Claim, ClaimRequest, Db, Stored};
use super::faults::{Fault, FaultState, Operation};
use super::stripe;
use super::{Config, EffectKind, EffectRecord, Error};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State as Extract};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Shared server state.
#[derive(Clone)]
pub(crate) struct State {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Db>,
    faults: Mutex<FaultState>,
    idempotency: bool,
    lookup: bool,
    shutdown: watch::Receiver<bool>,
}

impl State {
    pub(crate) fn new(db: Arc<Db>, config: &Config, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                faults: Mutex::new(FaultState::new(&config.faults)),
                idempotency: config.idempotency,
                lookup: config.lookup,
                shutdown,
            }),
        }
    }

    fn decide(&self, operation: Operation) -> Option<Fault> {
        // The fault state is plain data; a panic elsewhere cannot leave it half-updated in a
        // way that matters more than the panic itself, so a poisoned lock is reused.
        let mut faults = self.inner.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.decide(operation)
    }
}

pub(crate) fn router(state: State) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/payment_intents", post(payment_intents))
        .route("/v1/payment_intents/search", get(search))
        .route("/v1/refunds", post(refunds).get(list_refunds))
        .route("/v1/effects", get(list))
        .with_state(state)
}

/// A JSON answer with an explicit status.
struct Json(Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        answer(StatusCode::OK, self.0.to_string(), false)
    }
}

/// An answer as Stripe sends it: JSON, a `Request-Id`, `Stripe-Should-Retry: true` on the
/// statuses a retry may cure (409, 429, 5xx), and `Idempotent-Replayed: true` on a stored
/// answer replayed for its key.
fn answer(status: StatusCode, body: String, replayed: bool) -> Response {
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    let headers = response.headers_mut();
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    if let Ok(value) = header::HeaderValue::from_str(&request_id) {
        headers.insert("request-id", value);
    }
    let retry = matches!(status.as_u16(), 409 | 429 | 500..=599);
    if retry {
        headers.insert("stripe-should-retry", header::HeaderValue::from_static("true"));
    }
    if replayed {
        headers.insert("idempotent-replayed", header::HeaderValue::from_static("true"));
    }
    response
}

fn status_of(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    answer(status, stripe::error(kind, code, None, message).to_string(), false)
}

fn stored(stored: Stored, replayed: bool) -> Response {
    answer(status_of(stored.status), stored.body, replayed)
}

fn storage_error(e: &Error) -> Response {
    tracing::error!(error = %e, "simulator storage failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "storage_error", "the simulator's database failed")
}

/// Runs a blocking database call on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Error> + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.map_err(|join| Error::Task(join.to_string()))?
}

/// The request's `Idempotency-Key`, or the 400 that refuses it (the simulator requires one).
fn idempotency_key(headers: &HeaderMap) -> Result<String, Box<Response>> {
    match headers.get("idempotency-key").map(|v| v.to_str()) {
        Some(Ok(key)) if !key.is_empty() => Ok(key.to_owned()),
        _ => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "idempotency_key_missing",
            "the simulator requires a non-empty ASCII Idempotency-Key header",
        ))),
    }
}

/// A 401 in Stripe's shape unless the request carries a test key.
fn unauthorized(headers: &HeaderMap) -> Option<Response> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    (!stripe::is_test_key(authorization)).then(|| {
        let body = stripe::error(
            "invalid_request_error",
            "api_key_invalid",
            None,
            "the simulator needs a test API key: Authorization: Bearer sk_test_…",
        );
        answer(StatusCode::UNAUTHORIZED, body.to_string(), false)
    })
}

fn refused(refusal: stripe::Refusal) -> Response {
    answer(status_of(refusal.status), refusal.body.to_string(), false)
}

/// A new effect's record from a Stripe request: its id, its key, what the metadata says.
fn stripe_effect(
    kind: EffectKind,
    key: &str,
    amount: i64,
    currency: String,
    metadata: std::collections::BTreeMap<String, String>,
    headers: &HeaderMap,
) -> EffectRecord {
    let now = Utc::now();
    let prefix = if kind == EffectKind::Charge { "pi" } else { "re" };
    let field = |name: &str| metadata.get(name).cloned().unwrap_or_default();
    EffectRecord {
        id: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
        idempotency_key: key.to_owned(),
        kind,
        amount_minor: amount,
        currency,
        order_id: field("keel_order_id"),
        intent_id: field("keel_intent_id"),
        tenant: field("keel_tenant"),
        created_at: now.to_rfc3339_opts(SecondsFormat::Millis, true),
        created_at_ms: now.timestamp_millis(),
        traceparent: traceparent(headers),
        payment_intent: None,
        metadata,
        replays: 0,
    }
}

/// `POST /v1/payment_intents`: a PaymentIntent confirmed at once.
async fn payment_intents(state: Extract<State>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = unauthorized(&headers) {
        return refused;
    }
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(refused) => return *refused,
    };
    let params = match stripe::charge_params(&body) {
        Ok(params) => params,
        Err(refusal) => return refused(refusal),
    };
    let made = stripe_effect(
        EffectKind::Charge,
        &key,
        params.amount,
        params.currency.clone(),
        params.metadata.clone(),
        &headers,
    );
    let declined = stripe::declined(
        params.decline.unwrap_or("generic_decline"),
        &params,
        &made.id,
        made.created_at_ms.div_euclid(1000),
    );
    let ask = EffectAsk {
        operation: Operation::Charge,
        hash: params.fingerprint,
        effect: made,
        key,
        declined: Stored { status: 402, body: declined.to_string() },
        declines: params.decline.is_some(),
    };
    effect(state.0, ask).await
}

/// `POST /v1/refunds`: a Refund of part or all of a PaymentIntent.
async fn refunds(state: Extract<State>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = unauthorized(&headers) {
        return refused;
    }
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(refused) => return *refused,
    };
    let params = match stripe::refund_params(&body) {
        Ok(params) => params,
        Err(refusal) => return refused(refusal),
    };
    // The currency is the PaymentIntent's, set when the refund is claimed.
    let mut made = stripe_effect(EffectKind::Refund, &key, params.amount, String::new(), params.metadata, &headers);
    made.payment_intent = Some(params.payment_intent);
    // A refund the fault plan declines is a Refund in `failed`: Stripe refuses no refund with
    // a 402. No effect is kept for it.
    let mut failed = stripe::object(&made);
    if let Some(fields) = failed.as_object_mut() {
        fields.insert("status".to_owned(), "failed".into());
        fields.insert("failure_reason".to_owned(), "declined".into());
    }
    let ask = EffectAsk {
        operation: Operation::Refund,
        hash: params.fingerprint,
        effect: made,
        key,
        declined: Stored { status: 200, body: failed.to_string() },
        declines: false,
    };
    effect(state.0, ask).await
}

/// One charge or refund, read and checked, ready to meet its fault and its key.
struct EffectAsk {
    operation: Operation,
    /// The `Idempotency-Key`.
    key: String,
    /// What a replay must match: the operation and its parameters.
    hash: String,
    /// The effect made if the request goes through.
    effect: EffectRecord,
    /// What a decline answers (the `decline` fault, or a payment method that declines).
    declined: Stored,
    /// The request declines whatever the plan says (Stripe's declining test methods).
    declines: bool,
}

async fn effect(state: State, ask: EffectAsk) -> Response {
    let EffectAsk { operation, key, hash, effect, declined, declines } = ask;
    let fault = state.decide(operation);
    tracing::debug!(key = %key, kind = effect.kind.as_str(), fault = fault.map(|f| f.name()), "effect request");

    let hold_ms = match fault {
        Some(Fault::FailBeforeEffect) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "internal_error",
                "injected: fail_before_effect",
            );
        }
        Some(Fault::Unavailable) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "api_error", "service_unavailable", "injected: unavailable");
        }
        Some(Fault::TimeoutAfterEffect { ms } | Fault::Slow { ms }) => ms,
        _ => 0,
    };
    let answer = if declines || fault == Some(Fault::Decline) {
        Answer::Decline(declined)
    } else {
        Answer::Effect(Box::new(effect))
    };

    let db = Arc::clone(&state.inner.db);
    let request = ClaimRequest {
        key: key.clone(),
        hash,
        answer,
        in_flight: hold_ms > 0,
        idempotency: state.inner.idempotency,
        now: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
    };
    let claim = blocking(move || db.claim(request)).await;
    let claim = match claim {
        Ok(claim) => claim,
        Err(e) => return storage_error(&e),
    };
    match claim {
        Claim::New(answer) => {
            if hold_ms > 0 {
                // The hold and the completion run in their own task: if the client hangs up
                // and this handler is dropped, the record still turns `done`.
                let db = Arc::clone(&state.inner.db);
                let shutdown = state.inner.shutdown.clone();
                let finished = tokio::spawn(async move {
                    hold(hold_ms, shutdown).await;
                    blocking(move || db.finish(&key)).await
                });
                match finished.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return storage_error(&e),
                    Err(join) => return storage_error(&Error::Task(join.to_string())),
                }
            }
            stored(answer, false)
        }
        Claim::Replay(answer) => {
            hold(hold_ms, state.inner.shutdown.clone()).await;
            stored(answer, true)
        }
        Claim::Refused(answer) => stored(answer, false),
        Claim::KeyReused => error(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            "idempotency_key_reused",
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        ),
        Claim::InProgress => error(
            StatusCode::CONFLICT,
            "idempotency_error",
            "idempotency_key_in_use",
            "There is currently another in-progress request using this Idempotency-Key; try again later.",
        ),
    }
}

/// The request's W3C `traceparent` when it is well formed (version `00`, a 32-digit trace id
/// and a 16-digit span id in lower-case hex, neither all zeros, two digits of flags, joined by
/// `-`); anything else is ignored, as a provider ignores a header it cannot read: it never
/// fails the request.
fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |part: &str| part.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, span, flags]
            if *version == "00"
                && hex(trace, 32)
                && hex(span, 16)
                && hex(flags, 2)
                && nonzero(trace)
                && nonzero(span) =>
        {
            Some(value.to_owned())
        }
        _ => None,
    }
}

/// Waits `ms`, or less if the server is shutting down.
async fn hold(ms: u64, mut shutdown: watch::Receiver<bool>) {
    if ms == 0 {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
        // An error means the server is gone, which also ends the hold.
        _ = shutdown.wait_for(|stopping| *stopping) => {}
    }
}

async fn list(state: Extract<State>) -> Response {
    let db = Arc::clone(&state.0.inner.db);
    match blocking(move || db.effects()).await {
        Ok(effects) => Json(json!({"object": "list", "data": effects})).into_response(),
        Err(e) => storage_error(&e),
    }
}

/// The lookup fault for one search or list, or the answer that ends it: 401 without a test
/// key, 501 without lookups, 503 for `lookup_unavailable`.
fn lookup_fault(state: &State, headers: &HeaderMap) -> Result<Option<Fault>, Box<Response>> {
    if let Some(refused) = unauthorized(headers) {
        return Err(Box::new(refused));
    }
    if !state.inner.lookup {
        return Err(Box::new(error(
            StatusCode::NOT_IMPLEMENTED,
            "api_error",
            "lookup_not_supported",
            "this provider has no lookup",
        )));
    }
    let fault = state.decide(Operation::Lookup);
    tracing::debug!(fault = fault.map(|f| f.name()), traceparent = ?headers.get("traceparent"), "lookup");
    if fault == Some(Fault::LookupUnavailable) {
        return Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "service_unavailable",
            "injected: lookup_unavailable",
        )));
    }
    Ok(fault)
}

/// Whether a lookup under `fault` sees `effect`: not when it lies, not while younger than
/// the lag.
fn visible(fault: Option<Fault>, effect: &EffectRecord) -> bool {
    match fault {
        Some(Fault::LookupLies) => false,
        Some(Fault::LookupAbsentForMs { ms }) => {
            let age_ms = Utc::now().timestamp_millis().saturating_sub(effect.created_at_ms);
            age_ms >= i64::try_from(ms).unwrap_or(i64::MAX)
        }
        _ => true,
    }
}

/// Query parameters of a search or a list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    query: Option<String>,
    limit: Option<String>,
}

impl ListQuery {
    /// `limit`: 1 to [`stripe::PAGE_LIMIT_MAX`], default [`stripe::PAGE_LIMIT_DEFAULT`].
    fn limit(&self) -> Result<usize, stripe::Refusal> {
        match self.limit.as_deref() {
            None => Ok(stripe::PAGE_LIMIT_DEFAULT),
            Some(text) => {
                text.parse::<usize>().ok().filter(|n| (1..=stripe::PAGE_LIMIT_MAX).contains(n)).ok_or_else(|| {
                    stripe::Refusal::invalid(
                        "parameter_invalid_integer",
                        Some("limit"),
                        format!("limit must be from 1 to {}", stripe::PAGE_LIMIT_MAX),
                    )
                })
            }
        }
    }
}

/// A page of `found` (fetched with one more than `limit`) as `object`, after the fault.
fn lookup_page(object: &str, url: &str, fault: Option<Fault>, found: Vec<EffectRecord>, limit: usize) -> Response {
    let has_more = found.len() > limit;
    let shown: Vec<EffectRecord> = found.into_iter().take(limit).filter(|effect| visible(fault, effect)).collect();
    Json(stripe::page(object, url, &shown, has_more)).into_response()
}

fn unknown_parameter() -> stripe::Refusal {
    stripe::Refusal::invalid("parameter_unknown", None, "a search or list takes query and limit only")
}

/// `GET /v1/payment_intents/search?query=metadata['FIELD']:'VALUE'`.
async fn search(
    state: Extract<State>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let state = state.0;
    let fault = match lookup_fault(&state, &headers) {
        Ok(fault) => fault,
        Err(answer) => return *answer,
    };
    let Ok(Query(query)) = query else {
        return refused(unknown_parameter());
    };
    let (limit, (field, value)) = match query.limit().and_then(|limit| {
        let clause = query.query.as_deref().ok_or_else(|| {
            stripe::Refusal::invalid("parameter_missing", Some("query"), "Missing required param: query.")
        })?;
        Ok((limit, stripe::search_query(clause)?))
    }) {
        Ok(ok) => ok,
        Err(refusal) => return refused(refusal),
    };
    let db = Arc::clone(&state.inner.db);
    match blocking(move || db.search_charges(&field, &value, limit + 1)).await {
        Ok(found) => lookup_page("search_result", "/v1/payment_intents/search", fault, found, limit),
        Err(e) => storage_error(&e),
    }
}

/// `GET /v1/refunds?limit=N`: the most recent refunds.
async fn list_refunds(
    state: Extract<State>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let state = state.0;
    let fault = match lookup_fault(&state, &headers) {
        Ok(fault) => fault,
        Err(answer) => return *answer,
    };
    let limit = match query.as_ref().map_err(|_| unknown_parameter()).and_then(|Query(query)| query.limit()) {
        Ok(limit) => limit,
        Err(refusal) => return refused(refusal),
    };
    let db = Arc::clone(&state.inner.db);
    match blocking(move || db.recent_refunds(limit + 1)).await {
        Ok(found) => lookup_page("list", "/v1/refunds", fault, found, limit),
        Err(e) => storage_error(&e),
    }
}
