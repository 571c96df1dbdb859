//! The operator's reads over HTTP: runs, a run's causal tree, seed 004's figures (JSON and
//! Prometheus text).
//!
//! Owns the query types and the tenant wall for runs: a run is a key's tenant's when it
//! reserved at least one intent and every one is that tenant's; any other run — another
//! tenant's, or one that reserved nothing — is answered exactly as a missing one (404). Every
//! document is the CLI's own (`runs::run_document`, `trace::build`, `metrics::report`,
//! `metrics::prometheus_lines`): it never renders a second copy, never writes, and never
//! decides anything.

use super::Server;
use super::api::authorized;
use super::auth::Need;
use super::error::{ApiError, Code, ErrorBody};
use crate::wiring::SystemClock;
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use clap::ValueEnum as _;
use engine::clock::Clock as _;
use engine::event::{Event, IntentKey, RunId};
use engine::ledger::Intent;
use engine::limits::{API_PAGE_LIMIT_DEFAULT, API_PAGE_LIMIT_MAX};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use store::keys::ApiKey;
use utoipa::IntoParams;

type Shared = State<Arc<Server>>;

/// `GET /v1/runs` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Only runs in this state: `running`, or how a run ended (`completed`, `failed`, …).
    pub status: Option<String>,
    /// Where the previous page stopped (its `next_cursor`).
    pub cursor: Option<String>,
    /// Runs per page (1 to `API_PAGE_LIMIT_MAX`).
    pub limit: Option<usize>,
}

/// `GET /v1/metrics` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Only intents reserved and runs started since: an RFC 3339 instant, or a duration ago
    /// (`90s`, `15m`, `2h`, `7d`).
    pub since: Option<String>,
    /// Segment by `operation`, `tool`, `model`, `prompt`, `policy` or `release`.
    pub by: Option<String>,
}

/// Whether the run `run_id` is `tenant`'s: every intent it proposed is — the ones it reserved,
/// and the ones it found already there (a deduplicated re-submission, a resend refused), which
/// its journal links it to though another run holds them. `false` for no such run, or a run
/// that proposed nothing.
pub(super) fn is_tenants_run(reader: &store::Reader, run_id: &RunId, tenant: &str) -> anyhow::Result<bool> {
    let Some((_, reserved)) = reader.run_state(run_id)? else { return Ok(false) };
    let linked = reader.stream(&run_id.stream())?.into_iter().filter_map(|stored| match stored.event {
        Event::StepRecorded { name, .. } => IntentKey::from_journal_step(&name),
        _ => None,
    });
    let proposed: Vec<IntentKey> = reserved.iter().map(Intent::key).cloned().chain(linked).collect();
    Ok(!proposed.is_empty() && proposed.iter().all(|key| key.tenant() == tenant))
}

fn no_run(run_id: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no run with id {run_id}"))
}

/// The run id in the path, if the run is `key`'s tenant's ([`is_tenants_run`]).
fn own_run(server: &Server, path: Result<Path<String>, PathRejection>, key: &ApiKey) -> Result<RunId, ApiError> {
    let Path(text) = path?;
    let run_id = RunId::new(text);
    match server.read(|reader| is_tenants_run(reader, &run_id, &key.tenant)) {
        Ok(true) => Ok(run_id),
        Ok(false) => Err(no_run(run_id.as_str())),
        Err(error) => Err(ApiError::internal(&error)),
    }
}

/// A run cursor is the last run id of the page before, hex-encoded.
fn decode_cursor(cursor: &str) -> Result<RunId, ApiError> {
    hex::decode(cursor)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|text| !text.is_empty())
        .map(RunId::new)
        .ok_or_else(|| ApiError::new(Code::InvalidArguments, "cursor is not one this server gave"))
}

/// `GET /v1/runs?status=&cursor=&limit=`: the key's tenant's runs in id order.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(RunsQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "{runs, next_cursor}: one page, in id order (as `keel runs --json`)", body = serde_json::Value),
        (status = 400, description = "invalid_arguments", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn runs(
    State(server): Shared,
    headers: HeaderMap,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let Query(query) = query?;
    let state = match query.status.as_deref() {
        None | Some("") => None,
        Some(name) => Some(
            crate::runs::parse_status(name)
                .map_err(|failure| ApiError::new(Code::InvalidArguments, failure.message()))?,
        ),
    };
    let limit = query.limit.unwrap_or(API_PAGE_LIMIT_DEFAULT);
    if !(1..=API_PAGE_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::new(Code::InvalidArguments, format!("limit must be 1 to {API_PAGE_LIMIT_MAX}")));
    }
    let after = query.cursor.as_deref().filter(|c| !c.is_empty()).map(decode_cursor).transpose()?;
    let mut rows = server
        .read(|reader| Ok(reader.runs_page(&key.tenant, state, after.as_ref(), limit + 1)?))
        .map_err(|error| ApiError::internal(&error))?;
    let next_cursor = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|row| hex::encode(row.run_id.as_bytes()))
    } else {
        None
    };
    Ok(Json(json!({"runs": rows, "next_cursor": next_cursor})).into_response())
}

/// `GET /v1/runs/{id}`: the run, its budgets and its intents, as `keel run show --json`.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path, description = "The run id")), security(("bearer" = [])),
    responses(
        (status = 200, description = "the run, its limits, budgets and intents", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's run)", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn run(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let run_id = own_run(&server, path, &key)?;
    let shown = server
        .read(|reader| crate::runs::run_document(reader, &run_id, SystemClock.now()))
        .map_err(|error| ApiError::internal(&error))?;
    match shown {
        Some(shown) => Ok(Json(shown.document).into_response()),
        None => Err(no_run(run_id.as_str())),
    }
}

/// `GET /v1/runs/{id}/trace`: the run's causal tree, as `keel trace --json`.
#[utoipa::path(get, path = "/v1/runs/{id}/trace", tag = "runs", params(("id" = String, Path, description = "The run id")), security(("bearer" = [])),
    responses(
        (status = 200, description = "{run_id, roots}: every event under the one that caused it", body = serde_json::Value),
        (status = 404, description = "not_found (also another tenant's run)", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn trace(
    State(server): Shared,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let run_id = own_run(&server, path, &key)?;
    let trace =
        server.read(|reader| crate::trace::build(reader, &run_id)).map_err(|error| ApiError::internal(&error))?;
    match trace {
        Some(trace) => Ok(Json(trace).into_response()),
        None => Err(no_run(run_id.as_str())),
    }
}

/// `GET /v1/metrics?since=&by=`: seed 004's figures over the key's tenant's intents and runs,
/// as `keel metrics --json`.
#[utoipa::path(get, path = "/v1/metrics", tag = "metrics", params(MetricsQuery), security(("bearer" = [])),
    responses(
        (status = 200, description = "{since, by, segments}", body = serde_json::Value),
        (status = 400, description = "invalid_arguments", body = ErrorBody),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn metrics(
    State(server): Shared,
    headers: HeaderMap,
    query: Result<Query<MetricsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let Query(query) = query?;
    let now = SystemClock.now();
    let since = query
        .since
        .as_deref()
        .map(|text| crate::runs::parse_since(text, now))
        .transpose()
        .map_err(|failure| ApiError::new(Code::InvalidArguments, failure.message()))?;
    let by = query
        .by
        .as_deref()
        .map(|name| {
            crate::metrics::By::from_str(name, false).map_err(|_| {
                ApiError::new(
                    Code::InvalidArguments,
                    format!("unknown by {name:?} (known: operation, tool, model, prompt, policy, release)"),
                )
            })
        })
        .transpose()?;
    let report = server
        .read(|reader| crate::metrics::report(reader, since, by, Some(&key.tenant), now))
        .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(report).into_response())
}

/// `GET /metrics`: the key's tenant's figures in the Prometheus text exposition format, as
/// `keel metrics --prometheus`.
#[utoipa::path(get, path = "/metrics", tag = "metrics", security(("bearer" = [])),
    responses(
        (status = 200, description = "text/plain; version=0.0.4: gauges named keel_*, with HELP and TYPE lines", body = String, content_type = "text/plain"),
        (status = 401, description = "missing_api_key, invalid_api_key, revoked_api_key", body = ErrorBody),
        (status = 429, description = "rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "not_ready: recovery still running", body = ErrorBody)
    ))]
pub async fn prometheus(State(server): Shared, headers: HeaderMap) -> Result<Response, ApiError> {
    let key = authorized(&server, &headers, Need::Read)?;
    let now = SystemClock.now();
    let report = server
        .read(|reader| crate::metrics::report(reader, None, None, Some(&key.tenant), now))
        .map_err(|e| ApiError::internal(&e))?;
    let mut text = crate::metrics::prometheus_lines(&report).join("\n");
    text.push('\n');
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    Ok(response)
}
