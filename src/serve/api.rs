//! The routes of `keel serve` and their handlers.
//!
//! Owns the request types (`deny_unknown_fields`: a field the contract does not name is
//! refused), the mapping from an executor outcome to an HTTP status, and the tenant wall: a
//! key sees its own tenant's intents only, and another tenant's intent is answered exactly as
//! a missing one (404). Every handler authorizes first, then checks the request, then acts:
//! a refused request never reaches the executor, so it writes nothing. It never decides a
//! transition (the ledger does) nor touches SQL (the store does).

use super::Server;
use super::auth::{Need, authorize};
use super::body;
use super::error::{ApiError, Code, ErrorBody};
use crate::output::name_intent_keys;
use crate::wiring::SystemClock;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::clock::Clock as _;
use engine::event::{Cause, IntentKey, RunId};
use engine::executor::{IntentOutcome, OutcomeCode, OutcomeStatus, RunOutcome, RunRequest, WorkflowError};
use engine::ledger::{IntentStatus, RejectCode};
use engine::limits::{
    API_PAGE_LIMIT_DEFAULT, API_PAGE_LIMIT_MAX, API_RETRY_AFTER_HUMAN_S, API_RETRY_AFTER_IN_FLIGHT_S,
    APPROVAL_TTL_DEFAULT_MS, APPROVAL_TTL_MAX_MS, INTENT_ID_MAX_CHARS, INTENT_ID_MIN_CHARS,
};
use engine::log::{Ask, Asking as _, LogError};
use engine::money::Currency;
use engine::policy::{PolicyStamp, Rules};
use engine::provider::EffectKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use store::keys::ApiKey;
use utoipa::{IntoParams, ToSchema};

type Shared = State<Arc<Server>>;

/// `POST /v1/charges`: the CLI's charge contract. The intent id is the `Idempotency-Key`
/// header and the tenant the key's; the body may repeat them, and must then agree.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    /// The key's tenant, if repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// The `Idempotency-Key`, if repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<String>,
    /// The order.
    pub order_id: String,
    /// Amount in integer minor units.
    pub amount_minor: i64,
    /// EUR, USD or XOF.
    pub currency: String,
    /// The payment method token (never stored: only its hash).
    pub payment_method_token: String,
}

/// `POST /v1/refunds`: the CLI's refund contract, identity as for a charge.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// The key's tenant, if repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// The `Idempotency-Key`, if repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<String>,
    /// The charged order.
    pub order_id: String,
    /// Amount in integer minor units.
    pub amount_minor: i64,
    /// The charge's currency.
    pub currency: String,
}

/// A request that names who it is for (the key's tenant, the header's intent id).
trait Identified: Serialize {
    /// What the request is: a charge or a refund (its workflow's name).
    const KIND: EffectKind;
    fn identity(&mut self) -> (&mut Option<String>, &mut Option<String>);
    /// The amount and currency the operator's rules are checked against.
    fn money(&self) -> (i64, &str);
}

impl Identified for ChargeRequest {
    const KIND: EffectKind = EffectKind::Charge;
    fn identity(&mut self) -> (&mut Option<String>, &mut Option<String>) {
        (&mut self.tenant_id, &mut self.intent_id)
    }
    fn money(&self) -> (i64, &str) {
        (self.amount_minor, &self.currency)
    }
}

impl Identified for RefundRequest {
    const KIND: EffectKind = EffectKind::Refund;
    fn identity(&mut self) -> (&mut Option<String>, &mut Option<String>) {
        (&mut self.tenant_id, &mut self.intent_id)
    }
    fn money(&self) -> (i64, &str) {
        (self.amount_minor, &self.currency)
    }
}

/// `POST /v1/intents/{key}/cancel` and `/deny`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasonRequest {
    /// Why (recorded).
    pub reason: String,
}

/// `POST /v1/intents/{key}/resolve`: exactly one of `landed` and `absent: true`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// The provider's reference proving the effect landed.
    #[serde(default)]
    pub landed: Option<String>,
    /// The operator asserts the effect did not happen.
    #[serde(default)]
    pub absent: bool,
    /// Why (recorded).
    pub reason: String,
    /// Record it although the provider's lookup contradicts it, for this reason.
    #[serde(default, rename = "override")]
    pub override_reason: Option<String>,
}

/// `POST /v1/intents/{key}/approve`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    /// The fingerprint reviewed; refused if it is not the intent's.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// How long the approval stays valid, ms (default one hour, at most 30 days).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `POST /v1/intents/{key}/reconcile`: nothing to say (an empty body or `{}`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

/// `GET /v1/intents` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only intents in this state.
    pub state: Option<String>,
    /// Where the previous page stopped (its `next_cursor`).
    pub cursor: Option<String>,
    /// Intents per page (1 to `API_PAGE_LIMIT_MAX`).
    pub limit: Option<usize>,
}

/// Whether recovery is done; every `/v1` route waits for it.
pub(super) fn ready(server: &Server) -> Result<(), ApiError> {
    if server.ready.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(ApiError::new(Code::NotReady, "recovery is still running; try again shortly")
            .retry_after(API_RETRY_AFTER_IN_FLIGHT_S))
    }
}

pub(super) fn authorized(server: &Server, headers: &HeaderMap, need: Need) -> Result<ApiKey, ApiError> {
    ready(server)?;
    authorize(&server.keys, &server.buckets, headers, need)
}

/// The `Idempotency-Key` header: the intent id, 12 to 120 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let invalid = |why: String| ApiError::new(Code::InvalidArguments, why);
    let value = headers.get("idempotency-key").ok_or_else(|| {
        invalid("the Idempotency-Key header is required: your stable id for this intent (re-use it to retry)".into())
    })?;
    let text = value
        .to_str()
        .ok()
        .filter(|text| text.chars().all(|c| c.is_ascii_graphic()))
        .ok_or_else(|| invalid("Idempotency-Key must be visible ASCII characters only".into()))?;
    let chars = text.chars().count();
    if !(INTENT_ID_MIN_CHARS..=INTENT_ID_MAX_CHARS).contains(&chars) {
        return Err(invalid(format!(
            "Idempotency-Key must be {INTENT_ID_MIN_CHARS} to {INTENT_ID_MAX_CHARS} characters (got {chars})"
        )));
    }
    Ok(text.to_owned())
}

/// Fills the request's identity from the key and the header, refusing a body that names
/// another tenant or another intent id.
fn identify<R: Identified>(mut request: R, key: &ApiKey, intent_id: &str) -> Result<Value, ApiError> {
    let (tenant, id) = request.identity();
    if let Some(named) = tenant.as_deref()
        && !named.eq_ignore_ascii_case(&key.tenant)
    {
        return Err(ApiError::new(Code::Forbidden, format!("key {} acts for its own tenant only", key.name)));
    }
    if id.as_deref().is_some_and(|named| named != intent_id) {
        return Err(ApiError::new(
            Code::InvalidArguments,
            "intent_id in the body differs from the Idempotency-Key header",
        ));
    }
    *tenant = Some(key.tenant.clone());
    *id = Some(intent_id.to_owned());
    serde_json::to_value(&request).map_err(|error| ApiError::internal(&error))
}

fn run_request(server: &Server, key: &ApiKey, rules: &Rules) -> RunRequest {
    let limits = &server.limits;
    RunRequest {
        run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
        limits: crate::policy::run_limits(limits, rules, &server.policy.stamp),
        deadline_ms: limits.deadline_ms,
        cause: Cause::command(&format!("api:{}", key.name)),
    }
}

/// `POST /v1/charges`.
#[utoipa::path(post, path = "/v1/charges", tag = "effects", request_body = ChargeRequest, params(("Idempotency-Key" = String, Header, description = "Your stable id for this intent (12-120 visible ASCII): the intent id. Re-use it to retry.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "validated (source provider, reconciled or deduplicated)", body = serde_json::Value),
        (status = 202, description = "not known yet: the intent's state, Retry-After and retry_after_s; an unknown outcome adds reason (why, as the log records it) and retryable (whether re-submitting the same request is useful)", body = serde_json::Value),
        (status = 402, description = "declined by the provider (its code)", body = ErrorBody),
        (status = 409, description = "intent_payload_mismatch, reference_pending or cancelled", body = ErrorBody),
        (status = 413, description = "body_too_large", body = ErrorBody),
        (status = 415, description = "unsupported_media_type", body = ErrorBody),
        (status = 422, description = "policy_denied, budget_exhausted or invariant_violated", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn charge(State(server): Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    effect::<ChargeRequest>(&server, headers, body).await
}

/// `POST /v1/refunds`.
#[utoipa::path(post, path = "/v1/refunds", tag = "effects", request_body = RefundRequest, params(("Idempotency-Key" = String, Header, description = "Your stable id for this intent (12-120 visible ASCII): the intent id. Re-use it to retry.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "validated (source provider, reconciled or deduplicated)", body = serde_json::Value),
        (status = 202, description = "not known yet: the intent's state, Retry-After and retry_after_s; an unknown outcome adds reason (why, as the log records it) and retryable (whether re-submitting the same request is useful)", body = serde_json::Value),
        (status = 402, description = "declined by the provider (its code)", body = ErrorBody),
        (status = 409, description = "intent_payload_mismatch, reference_pending or cancelled", body = ErrorBody),
        (status = 413, description = "body_too_large", body = ErrorBody),
        (status = 415, description = "unsupported_media_type", body = ErrorBody),
        (status = 422, description = "policy_denied, budget_exhausted or invariant_violated", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn refund(State(server): Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    effect::<RefundRequest>(&server, headers, body).await
}

async fn effect<R: Identified + serde::de::DeserializeOwned>(
    server: &Server,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = authorized(server, &headers, Need::Submit)?;
    let intent_id = idempotency_key(&headers)?;
    let request: R = body::json(&headers, body).await?;
    let (amount_minor, currency) = request.money();
    let currency = Currency::parse(currency).ok();
    let input = identify(request, &key, &intent_id)?;
    // The key's tenant's rules, tightened by the server's flags; refused before anything is
    // written when they do not allow the effect (an invalid currency is the workflow's to say).
    let policy_denied = |message: String| ApiError::new(Code::Rejected(RejectCode::PolicyDenied), message);
    let rules = server.policy.rules_for(R::KIND, &input, &server.limits).map_err(policy_denied)?;
    if let Some(why) = currency.and_then(|currency| rules.denies(amount_minor, currency.as_str())) {
        return Err(policy_denied(why));
    }
    let outcome = server
        .node
        .executor
        .start(R::KIND.as_str(), &input, run_request(server, &key, &rules))
        .await
        .map_err(|error| ApiError::internal(&error))?;
    respond(&outcome, &server.policy.stamp)
}

/// An effect's outcome as HTTP: 200 validated (first time or deduplicated), 202 not yet
/// known (with `Retry-After`), 402 declined, 409 a payload mismatch or a cancellation, 400 or
/// 422 refused before anything was sent.
fn respond(outcome: &RunOutcome, stamp: &PolicyStamp) -> Result<Response, ApiError> {
    let document = name_intent_keys(crate::ops::run_document(outcome, stamp));
    let intent = match (&outcome.intent, &outcome.rejection) {
        (Some(intent), _) => intent,
        (None, Some(rejection)) => {
            return Err(ApiError::new(Code::Rejected(rejection.code), rejection.details.join("; "))
                .with_details(json!(rejection.details)));
        }
        (None, None) => return Err(ApiError::internal(&format!("run {} ended without an intent", outcome.run_id))),
    };
    let message = || intent.details.join("; ");
    match intent.status {
        OutcomeStatus::Intent(IntentStatus::Validated) => Ok((StatusCode::OK, Json(document)).into_response()),
        OutcomeStatus::Intent(IntentStatus::Rejected) => {
            let code = match &intent.code {
                Some(OutcomeCode::Rejected(code)) => *code,
                _ => RejectCode::InvalidArguments,
            };
            Err(ApiError::new(Code::Rejected(code), message()).with_details(document))
        }
        OutcomeStatus::Intent(IntentStatus::Declined) => {
            let code = intent.code.as_ref().map_or("declined", OutcomeCode::as_str).to_owned();
            Err(ApiError::new(Code::Declined(code), "the provider declined").with_details(document))
        }
        OutcomeStatus::Intent(IntentStatus::Cancelled) => {
            Err(ApiError::new(Code::Cancelled, "an operator cancelled this intent").with_details(document))
        }
        OutcomeStatus::ProviderUnavailable
        | OutcomeStatus::Intent(
            IntentStatus::Reserved
            | IntentStatus::AwaitingApproval
            | IntentStatus::Attempting
            | IntentStatus::OutcomeUnknown
            | IntentStatus::Reconciling
            | IntentStatus::Escalated,
        ) => Ok(pending(intent, document)),
    }
}

/// 202: the outcome is not known yet. The body is the intent's state (an unknown outcome's
/// `reason` and `retryable` with it, from the typed outcome); `Retry-After` (and
/// `retry_after_s`) say when to ask again — re-submit the same request, or read the intent.
fn pending(intent: &IntentOutcome, mut document: Value) -> Response {
    let seconds = match (intent.reconcile_after, intent.status) {
        (Some(at), _) => {
            let left = (at - SystemClock.now()).num_milliseconds();
            u64::try_from(left).map_or(1, |ms| ms.div_ceil(1000).max(1))
        }
        (None, OutcomeStatus::Intent(IntentStatus::AwaitingApproval | IntentStatus::Escalated)) => {
            API_RETRY_AFTER_HUMAN_S
        }
        (None, _) => API_RETRY_AFTER_IN_FLIGHT_S,
    };
    if let Some(map) = document.as_object_mut() {
        map.insert("retry_after_s".to_owned(), json!(seconds));
    }
    let mut response = (StatusCode::ACCEPTED, Json(document)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// The tenant part of a key (`operation:tenant:intent_id`).
fn tenant_of(key: &IntentKey) -> &str {
    key.as_str().split(':').nth(1).unwrap_or_default()
}

pub(super) fn not_found(key: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no intent with key {key}"))
}

/// The intent key in the path, if it is one of `key`'s tenant's: another tenant's intent is
/// not found, exactly like an intent that does not exist.
fn own_key(path: Result<Path<String>, PathRejection>, key: &ApiKey) -> Result<IntentKey, ApiError> {
    let Path(text) = path?;
    own_intent(&text, key)
}

/// `text` as an intent key of `key`'s tenant: another tenant's is not found (the console's
/// paths meet the same wall).
pub(super) fn own_intent(text: &str, key: &ApiKey) -> Result<IntentKey, ApiError> {
    let intent_key = IntentKey::parse(text).ok_or_else(|| {
        ApiError::new(
            Code::InvalidArguments,
            format!("{text:?} is not an intent key (expected operation:tenant:intent_id, operation charge or refund)"),
        )
    })?;
    if tenant_of(&intent_key) != key.tenant {
        return Err(not_found(text));
    }
    Ok(intent_key)
}

/// `GET /v1/intents?state=&cursor=&limit=`: the key's tenant's intents in key order.
#[utoipa::path(get, path = "/v1/intents", tag = "intents", params(ListQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "{intents, next_cursor}: one page, in key order", body = serde_json::Value),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn list(
    State(server): Shared,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let Query(query) = query?;
    let status = match query.state.as_deref() {
        None | Some("") => None,
        Some(name) => Some(IntentStatus::parse(name).ok_or_else(|| {
            let known: Vec<&str> = engine::ledger::ALL_STATUSES.iter().map(|s| s.as_str()).collect();
            ApiError::new(Code::InvalidArguments, format!("unknown state {name:?} (known: {})", known.join(", ")))
        })?),
    };
    let limit = query.limit.unwrap_or(API_PAGE_LIMIT_DEFAULT);
    if !(1..=API_PAGE_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::new(Code::InvalidArguments, format!("limit must be 1 to {API_PAGE_LIMIT_MAX}")));
    }
    let after =
        query.cursor.as_deref().filter(|c| !c.is_empty()).map(|cursor| decode_cursor(cursor, &key)).transpose()?;
    let mut rows = server
        .read(|reader| Ok(reader.intents_page(&key.tenant, status, after.as_ref(), limit + 1)?))
        .map_err(|error| ApiError::internal(&error))?;
    let next_cursor = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|row| hex::encode(row.key.as_bytes()))
    } else {
        None
    };
    let intents = serde_json::to_value(&rows).map_err(|error| ApiError::internal(&error))?;
    Ok(Json(json!({"intents": name_intent_keys(intents), "next_cursor": next_cursor})).into_response())
}

/// A cursor is the last key of the page before, hex-encoded: opaque to clients, and only
/// valid for the tenant that was given it.
fn decode_cursor(cursor: &str, key: &ApiKey) -> Result<IntentKey, ApiError> {
    hex::decode(cursor)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| IntentKey::parse(&text))
        .filter(|intent_key| tenant_of(intent_key) == key.tenant)
        .ok_or_else(|| ApiError::new(Code::InvalidArguments, "cursor is not one this server gave for this key"))
}

/// `GET /v1/intents/{key}`: state and history, as `keel show --json`.
#[utoipa::path(get, path = "/v1/intents/{key}", tag = "intents", params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")), security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent's state and its ordered events", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn show(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let intent_key = own_key(path, &key)?;
    let document = server
        .read(|reader| crate::ops::intent_document(reader, &intent_key))
        .map_err(|error| ApiError::internal(&error))?;
    match document {
        Some(shown) => Ok(Json(shown.document).into_response()),
        None => Err(not_found(intent_key.as_str())),
    }
}

/// The operator decisions of `POST /v1/intents/{key}/{decision}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Reconcile,
    Cancel,
    Resolve,
    Approve,
    Deny,
}

/// `POST /v1/intents/{key}/reconcile`: look the effect up now (role operator; an empty body or `{}`).
#[utoipa::path(post, path = "/v1/intents/{key}/reconcile", tag = "operators", request_body = EmptyRequest, params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent after the decision", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 409, description = "refused by the ledger: nothing written", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn reconcile(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    decide(&server, Decision::Reconcile, headers, path, body).await
}

/// `POST /v1/intents/{key}/cancel`: cancel an intent with nothing in flight (role operator).
#[utoipa::path(post, path = "/v1/intents/{key}/cancel", tag = "operators", request_body = ReasonRequest, params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent after the decision", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 409, description = "refused by the ledger: nothing written", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn cancel(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    decide(&server, Decision::Cancel, headers, path, body).await
}

/// `POST /v1/intents/{key}/resolve`: resolve by hand, checked with the provider first (role operator).
#[utoipa::path(post, path = "/v1/intents/{key}/resolve", tag = "operators", request_body = ResolveRequest, params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent after the decision", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 409, description = "refused by the ledger: nothing written", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn resolve(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    decide(&server, Decision::Resolve, headers, path, body).await
}

/// `POST /v1/intents/{key}/approve`: approve, bound to the fingerprint (role operator; the body may be empty).
#[utoipa::path(post, path = "/v1/intents/{key}/approve", tag = "operators", request_body = ApproveRequest, params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent after the decision", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 409, description = "refused by the ledger: nothing written", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn approve(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    decide(&server, Decision::Approve, headers, path, body).await
}

/// `POST /v1/intents/{key}/deny`: deny: the intent ends rejected, its money released (role operator).
#[utoipa::path(post, path = "/v1/intents/{key}/deny", tag = "operators", request_body = ReasonRequest, params(("key" = String, Path, description = "The intent key, operation:tenant:intent_id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the intent after the decision", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's intent)", body = ErrorBody),
        (status = 409, description = "refused by the ledger: nothing written", body = ErrorBody),
        (status = 400, description = "invalid_arguments or invalid_json", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 403, description = "forbidden: the key's role", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn deny(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    decide(&server, Decision::Deny, headers, path, body).await
}

/// One operator decision: the operator's name is the key's, never the body's.
async fn decide(
    server: &Server,
    decision: Decision,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let key = authorized(server, &headers, Need::Operate)?;
    let intent_key = own_key(path, &key)?;
    let exists = intent_exists(server, &intent_key)?;
    // The body is checked before the intent is looked for, so a malformed request is a 400
    // whether or not the intent exists.
    let asked = checked_body(decision, &headers, body).await?;
    if !exists {
        return Err(not_found(intent_key.as_str()));
    }
    Ok(Json(carry_out(server, &key, intent_key, asked).await?).into_response())
}

/// Whether the log holds `intent_key`.
pub(super) fn intent_exists(server: &Server, intent_key: &IntentKey) -> Result<bool, ApiError> {
    server.read(|reader| Ok(reader.intent(intent_key)?.is_some())).map_err(|e| ApiError::internal(&e))
}

/// Carries out a checked decision on an existing intent of `key`'s tenant, recorded under
/// `key`'s name: the executor path both the API and the console's forms take. Returns the
/// intent after it (a reconciliation's outcome for `Reconcile`).
pub(super) async fn carry_out(
    server: &Server,
    key: &ApiKey,
    intent_key: IntentKey,
    asked: Asked,
) -> Result<Value, ApiError> {
    let cause = Cause::operator(&key.name);
    let by = key.name.clone();
    let log = &*server.node.executor.runtime().log;
    let asked = match asked {
        Asked::Reconcile => {
            let outcome = server.node.executor.reconcile(&intent_key, cause).await.map_err(workflow_error)?;
            let document = serde_json::to_value(&outcome).map_err(|e| ApiError::internal(&e))?;
            return Ok(name_intent_keys(document));
        }
        Asked::Cancel { reason } => {
            log.ask(Ask::cancel(cause, intent_key, by, reason)).await.map(|a| a.intent).map_err(WorkflowError::from)
        }
        Asked::Deny { reason } => {
            log.ask(Ask::deny(cause, intent_key, by, reason)).await.map(|a| a.intent).map_err(WorkflowError::from)
        }
        Asked::Approve { fingerprint, ttl_ms } => {
            let ask = Ask::approve(cause, intent_key, by, ttl_ms, fingerprint);
            log.ask(ask).await.map(|answer| answer.intent).map_err(WorkflowError::from)
        }
        Asked::Resolve { landed, reason, override_reason } => {
            server.node.executor.resolve(&intent_key, &by, &reason, landed, override_reason).await
        }
    };
    match asked {
        Ok(intent) => Ok(name_intent_keys(serde_json::to_value(&intent).map_err(|e| ApiError::internal(&e))?)),
        Err(error) => Err(workflow_error(error)),
    }
}

/// An operator decision's body, checked: what the decision asks for.
pub(super) enum Asked {
    Reconcile,
    Cancel { reason: String },
    Deny { reason: String },
    Approve { fingerprint: Option<String>, ttl_ms: u64 },
    Resolve { landed: Option<String>, reason: String, override_reason: Option<String> },
}

/// Reads and checks the body of `decision` (the shared door, then its own fields).
async fn checked_body(decision: Decision, headers: &HeaderMap, body: Body) -> Result<Asked, ApiError> {
    Ok(match decision {
        Decision::Reconcile => {
            body::json_or_empty::<EmptyRequest>(headers, body).await?;
            Asked::Reconcile
        }
        Decision::Cancel | Decision::Deny => {
            let ReasonRequest { reason } = body::json(headers, body).await?;
            nonempty("reason", &reason)?;
            if decision == Decision::Cancel { Asked::Cancel { reason } } else { Asked::Deny { reason } }
        }
        Decision::Approve => {
            let ApproveRequest { fingerprint, ttl_ms } = body::json_or_empty(headers, body).await?;
            let ttl_ms = ttl_ms.unwrap_or(APPROVAL_TTL_DEFAULT_MS);
            if ttl_ms > APPROVAL_TTL_MAX_MS {
                return Err(ApiError::new(
                    Code::InvalidArguments,
                    format!("ttl_ms must be at most {APPROVAL_TTL_MAX_MS}"),
                ));
            }
            Asked::Approve { fingerprint, ttl_ms }
        }
        Decision::Resolve => {
            let ResolveRequest { landed, absent, reason, override_reason } = body::json(headers, body).await?;
            nonempty("reason", &reason)?;
            override_reason.as_deref().map(|why| nonempty("override", why)).transpose()?;
            if landed.is_some() == absent {
                return Err(ApiError::new(
                    Code::InvalidArguments,
                    "give exactly one of `landed` (the provider's reference) and `absent: true`",
                ));
            }
            Asked::Resolve { landed, reason, override_reason }
        }
    })
}

/// An operator's text (a reason, a fingerprint), checked by the rule every door shares
/// ([`engine::event::OperatorText`]).
pub(super) fn nonempty(field: &str, value: &str) -> Result<(), ApiError> {
    engine::event::OperatorText::parse(field, value)
        .map(drop)
        .map_err(|blank| ApiError::new(Code::InvalidArguments, blank.to_string()))
}

/// A refusal is the ledger's answer (409, nothing written); a run another process works on
/// is busy (409 too); anything else is internal.
fn workflow_error(error: WorkflowError) -> ApiError {
    match error {
        WorkflowError::Log(LogError::Refused(refusal)) => ApiError::new(Code::Refused, refusal.to_string()),
        WorkflowError::Busy(refusal) => ApiError::new(Code::Refused, refusal.to_string()),
        other => ApiError::internal(&other),
    }
}

/// `GET /healthz`: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "the process answers", body = serde_json::Value)))]
pub async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: 200 once recovery has run, 503 before.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "ready: recovery has run", body = serde_json::Value),
    (status = 503, description = "not_ready", body = ErrorBody)))]
pub async fn readyz(State(server): Shared) -> Result<Response, ApiError> {
    ready(&server)?;
    Ok(Json(json!({"status": "ready"})).into_response())
}

/// Any other path.
pub async fn no_route() -> ApiError {
    ApiError::new(Code::NotFound, "no such route (see /openapi.json)")
}

/// A known path with another method.
pub async fn no_method() -> ApiError {
    ApiError::new(Code::MethodNotAllowed, "this route does not take that method")
}
