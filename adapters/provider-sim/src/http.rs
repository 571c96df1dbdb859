//! The simulator's HTTP surface.
//!
//! Owns the routes, request validation, the order in which a request meets its fault and its
//! idempotency record, and the shape of every answer. It must never hold the fault lock or the
//! database across an `.await` on the network or a timer, and never log a payment method.
//!
//! # Order of a charge or refund
//!
//! 1. Validate the key and body (400 `invalid_request_error`, nothing stored, no fault drawn).
//! 2. Draw the fault for this request from the plan (in arrival order).
//! 3. `fail_before_effect` / `unavailable` answer at once, touching nothing.
//! 4. Otherwise claim the key in one transaction (shared with the claims that arrived meanwhile:
//!    group commit, answered after the commit): replay, conflict, reuse error, or commit the new
//!    answer (the effect, or the decline) with its record.
//! 5. `slow` / `timeout_after_effect` hold the answer; the record stays `in_flight` (so a
//!    concurrent request with the key gets 409) until the hold ends, then turns `done`. The hold
//!    runs in its own task so the record is completed even if the client hangs up.

// The simulator is a separate process standing in for a provider: it keeps its own time,
// like a real provider does, so it reads the system clock directly.
#![allow(clippy::disallowed_methods)]

use super::db::{Answer, Claim, ClaimRequest, Db, Stored};
use super::faults::{Fault, FaultState, Operation};
use super::{Config, EffectKind, EffectRecord, Error};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
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
        .route("/v1/charges", post(charge))
        .route("/v1/refunds", post(refund))
        .route("/v1/effects", get(list))
        .route("/v1/effects/{key}", get(lookup))
        .with_state(state)
}

/// A JSON answer with an explicit status.
struct Json(Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        raw(StatusCode::OK, self.0.to_string())
    }
}

fn raw(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    let body = json!({"error": {"type": kind, "code": code, "message": message}});
    raw(status, body.to_string())
}

fn stored(answer: Stored) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    raw(status, answer.body)
}

fn storage_error(e: &Error) -> Response {
    tracing::error!(error = %e, "simulator storage failed");
    error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "storage_error", "the simulator's database failed")
}

/// Runs a blocking database call on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Error> + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.map_err(|join| Error::Task(join.to_string()))?
}

async fn charge(state: Extract<State>, headers: HeaderMap, body: Bytes) -> Response {
    effect(state.0, Operation::Charge, &headers, &body).await
}

async fn refund(state: Extract<State>, headers: HeaderMap, body: Bytes) -> Response {
    effect(state.0, Operation::Refund, &headers, &body).await
}

#[derive(Deserialize)]
struct Metadata {
    order_id: String,
    intent_id: String,
    tenant: String,
}

#[derive(Deserialize)]
struct EffectBody {
    amount: i64,
    currency: String,
    /// Required for charges, ignored for refunds. Only checked for presence, never kept.
    payment_method: Option<String>,
    metadata: Metadata,
}

/// Parses and checks a charge or refund body; the error is the message for the client.
fn validate(operation: Operation, body: &[u8]) -> Result<(Value, EffectBody), String> {
    // Strict: a body that repeats a key (`"amount":100,"amount":999999`) is refused, never
    // read as its last value.
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    let value = engine::canonical::parse_strict(text).map_err(|e| format!("the body is not strict JSON: {e}"))?;
    let parsed: EffectBody =
        engine::canonical::decode(value.clone()).map_err(|e| format!("the body is malformed: {e}"))?;
    engine::money::check_amount(parsed.amount).map_err(|e| format!("amount: {e}"))?;
    if parsed.currency.is_empty() {
        return Err("currency must not be empty".into());
    }
    if operation == Operation::Charge && parsed.payment_method.as_deref().is_none_or(str::is_empty) {
        return Err("a charge needs a payment_method".into());
    }
    Ok((value, parsed))
}

async fn effect(state: State, operation: Operation, headers: &HeaderMap, body: &[u8]) -> Response {
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        Some(Ok(key)) if !key.is_empty() => key.to_owned(),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "idempotency_key_missing",
                "the simulator requires a non-empty ASCII Idempotency-Key header",
            );
        }
    };
    let (value, parsed) = match validate(operation, body) {
        Ok(ok) => ok,
        Err(message) => {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", "parameter_invalid", &message);
        }
    };
    let kind = match operation {
        Operation::Refund => EffectKind::Refund,
        _ => EffectKind::Charge,
    };
    // The operation is part of the hash, so a charge key reused for a refund is a reuse.
    let hash = engine::canonical::fingerprint(&json!({"operation": kind.as_str(), "body": value}));
    let fault = state.decide(operation);
    tracing::debug!(key = %key, kind = kind.as_str(), fault = fault.map(|f| f.name()), "effect request");

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
    let answer = if fault == Some(Fault::Decline) {
        let body = json!({"error": {"type": "card_error", "code": "card_declined", "message": "injected: decline"}});
        Answer::Decline(Stored { status: 402, body: body.to_string() })
    } else {
        let now = Utc::now();
        let prefix = if kind == EffectKind::Charge { "ch" } else { "re" };
        Answer::Effect(EffectRecord {
            id: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
            idempotency_key: key.clone(),
            kind,
            amount_minor: parsed.amount,
            currency: parsed.currency,
            order_id: parsed.metadata.order_id,
            intent_id: parsed.metadata.intent_id,
            tenant: parsed.metadata.tenant,
            created_at: now.to_rfc3339_opts(SecondsFormat::Millis, true),
            created_at_ms: now.timestamp_millis(),
            traceparent: traceparent(headers),
        })
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
            stored(answer)
        }
        Claim::Replay(answer) => {
            hold(hold_ms, state.inner.shutdown.clone()).await;
            stored(answer)
        }
        Claim::KeyReused => error(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            "idempotency_key_reused",
            "this Idempotency-Key was used with different parameters",
        ),
        Claim::InProgress => error(
            StatusCode::CONFLICT,
            "idempotency_error",
            "request_in_progress",
            "a request with this Idempotency-Key is still being processed",
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

async fn lookup(state: Extract<State>, headers: HeaderMap, Path(key): Path<String>) -> Response {
    let state = state.0;
    if !state.inner.lookup {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            "lookup_not_supported",
            "this provider has no lookup",
        );
    }
    let fault = state.decide(Operation::Lookup);
    tracing::debug!(key = %key, fault = fault.map(|f| f.name()), traceparent = ?headers.get("traceparent"), "lookup");
    if fault == Some(Fault::LookupUnavailable) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "service_unavailable",
            "injected: lookup_unavailable",
        );
    }
    let db = Arc::clone(&state.inner.db);
    let found = match blocking(move || db.lookup(&key)).await {
        Ok(found) => found,
        Err(e) => return storage_error(&e),
    };
    let visible = found.filter(|effect| match fault {
        Some(Fault::LookupLies) => false,
        Some(Fault::LookupAbsentForMs { ms }) => {
            let age_ms = Utc::now().timestamp_millis().saturating_sub(effect.created_at_ms);
            age_ms >= i64::try_from(ms).unwrap_or(i64::MAX)
        }
        _ => true,
    });
    match visible {
        Some(effect) => Json(effect.api_object()).into_response(),
        None => error(StatusCode::NOT_FOUND, "not_found", "resource_missing", "no effect with this idempotency key"),
    }
}

async fn list(state: Extract<State>) -> Response {
    let db = Arc::clone(&state.0.inner.db);
    match blocking(move || db.effects()).await {
        Ok(effects) => Json(json!({"object": "list", "data": effects})).into_response(),
        Err(e) => storage_error(&e),
    }
}
