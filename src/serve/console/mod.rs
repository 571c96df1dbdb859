//! The operator console: server-rendered pages for people, served by `keel serve` itself.
//!
//! Owns the console's routes (the table [`routes`], apart from the API's: they are pages, not
//! part of the OpenAPI contract), the login and logout, and each page: the intents by state
//! with their counts (the ambiguous ones first), an intent's history with causes and evidence,
//! its approval page (seed 002: what a human must see before saying yes), the runs with their
//! causal trees, the metrics with small SVG charts, and the forms that reconcile, cancel,
//! resolve, approve and deny.
//!
//! # Who may do what
//!
//! Login takes an operator or read key (a submit key is a service's, refused), at most
//! `CONSOLE_LOGINS_PER_MIN` attempts a minute per client address (`auth::login_attempt`,
//! before the form's secret is checked) and as many failures per presented key id
//! (`auth::login_failed`: a right secret is never refused for what others tried with its
//! id); past either, 429 with `Retry-After` and how else to get in. The session
//! (`session`) remembers the key's id, and every request checks the key again (a revoked key
//! is signed out) and spends its rate like an API request. A read key sees no form and every
//! POST it makes is refused (403). Every form POST carries the session's CSRF token, checked
//! before anything else is read: a missing or wrong one is 403 and nothing is written. The
//! tenant wall is the API's: another tenant's intent or run is not found.
//!
//! # What it must never do
//!
//! Decide or write anything itself: a form becomes the API's typed `Asked` and goes through
//! `api::carry_out`, the executor path the API takes, recorded under the key's name. Render a
//! text as markup: every page is built with `html::Html`, where only literals of this source
//! are markup. Fetch an asset from elsewhere: the shell and stylesheet are in the binary, and
//! the Content-Security-Policy allows this origin only, and no script at all.

mod html;
mod session;

pub use session::Sessions;

use super::Server;
use super::api::{Asked, carry_out, intent_exists, nonempty, own_intent, ready};
use super::auth::{self, Need};
use super::body;
use super::error::ApiError;
use super::reads::is_tenants_run;
use crate::keys::{Refused, check_token};
use crate::ops::{describe, money, when};
use crate::wiring::SystemClock;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use engine::clock::Clock as _;
use engine::event::{IntentKey, RunId};
use engine::ledger::{Intent, IntentStatus};
use engine::limits::{APPROVAL_TTL_DEFAULT_MS, CONSOLE_LIST_MAX};
use engine::provider::LookupOutcome;
use html::{Html, bar_chart, page, segment};
use serde::Deserialize;
use session::Current;
use std::net::SocketAddr;
use std::sync::Arc;
use store::keys::{ApiKey, Role};
use tokio::time::Instant;

type Shared = State<Arc<Server>>;

/// Every page and form of the console.
pub fn routes() -> Vec<(Method, &'static str, MethodRouter<Arc<Server>>)> {
    vec![
        (Method::GET, "/", get(home)),
        (Method::GET, "/console/console.css", get(stylesheet)),
        (Method::GET, "/console/login", get(login_form)),
        (Method::POST, "/console/login", post(login)),
        (Method::POST, "/console/logout", post(logout)),
        (Method::GET, "/console/intents", get(intents)),
        (Method::GET, "/console/intents/{key}", get(intent)),
        (Method::GET, "/console/intents/{key}/approval", get(approval)),
        (Method::POST, "/console/intents/{key}/reconcile", post(reconcile)),
        (Method::POST, "/console/intents/{key}/cancel", post(cancel)),
        (Method::POST, "/console/intents/{key}/resolve", post(resolve)),
        (Method::POST, "/console/intents/{key}/approve", post(approve)),
        (Method::POST, "/console/intents/{key}/deny", post(deny)),
        (Method::GET, "/console/runs", get(runs)),
        (Method::GET, "/console/runs/{id}", get(run)),
        (Method::GET, "/console/metrics", get(metrics)),
    ]
}

/// The states that need a human's judgement, listed first.
const AMBIGUOUS: [IntentStatus; 4] =
    [IntentStatus::OutcomeUnknown, IntentStatus::Reconciling, IntentStatus::Escalated, IntentStatus::AwaitingApproval];

/// Why a console request was not served.
enum Refusal {
    /// No session (or it ended): the login form.
    SignIn,
    /// A page saying why, with its status.
    Page(StatusCode, String),
    /// A page saying what the API would answer: its status, message and `Retry-After`.
    Api(ApiError),
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Self {
        Self::Api(error)
    }
}

fn internal(error: &dyn std::fmt::Display) -> Refusal {
    ApiError::internal(error).into()
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::SignIn => redirect("/console/login", None),
            Self::Page(status, message) => refused_page(status, &message),
            Self::Api(error) => {
                let mut response = refused_page(error.status(), error.message());
                if let Some(seconds) = error.retry_after_s() {
                    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                }
                response
            }
        }
    }
}

/// The page of a refusal: its status and why.
fn refused_page(status: StatusCode, message: &str) -> Response {
    let mut body = Html::new();
    body.tag("<h1>").text(status.canonical_reason().unwrap_or("Refused")).tag("</h1>");
    body.element("<p class=\"error\">", message, "</p>");
    body.tag("<p><a href=\"/console/intents\">Back to the intents</a></p>");
    respond(status, page("Refused", None, body), None)
}

/// A page, with the console's protective headers (and a cookie to set).
fn respond(status: StatusCode, page: String, cookie: Option<String>) -> Response {
    let mut response = (status, page).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    protect(headers);
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, value);
    }
    response
}

/// No script, no frame, no asset but this origin's; nothing cached, nothing referred.
fn protect(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

/// 303 to `location` (and a cookie to set).
fn redirect(location: &str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, value);
    }
    protect(headers);
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, value);
    }
    response
}

/// A signed-in request: its key (checked again now) and its session.
struct SignedIn {
    key: ApiKey,
    session: Current,
}

impl SignedIn {
    /// Whether the key may make decisions (an operator's; a read key's pages show no form).
    fn decides(&self) -> bool {
        Need::Operate.allows(self.key.role)
    }

    fn page(&self, title: &str, body: Html) -> Response {
        let signed_in = Some((self.key.name.as_str(), self.key.role.as_str(), self.session.csrf.as_str()));
        respond(StatusCode::OK, page(title, signed_in, body), None)
    }
}

/// The session's key, if it is still valid, may do what `need` asks, and its rate allows one
/// more request. A session whose key was revoked ends.
fn signed_in(server: &Server, headers: &HeaderMap, need: Need) -> Result<SignedIn, Refusal> {
    ready(server)?;
    let session = server.sessions.current(headers, Instant::now()).ok_or(Refusal::SignIn)?;
    let key_id = session.key_id.as_deref().ok_or(Refusal::SignIn)?;
    let key = match server.keys.find(key_id).map_err(|error| internal(&error))? {
        Some(key) if key.revoked_at.is_none() => key,
        _ => {
            server.sessions.end(&session);
            return Err(Refusal::SignIn);
        }
    };
    Ok(SignedIn { key: auth::admit(&server.buckets, key, need)?, session })
}

/// A form POST of a signed-in session: the CSRF token first (403 when missing or wrong,
/// before anything else is looked at), then the key, which must be an operator's.
async fn posted(server: &Server, headers: &HeaderMap, body: Body) -> Result<(SignedIn, body::Form), Refusal> {
    ready(server)?;
    let forbidden = |why: &str| Refusal::Page(StatusCode::FORBIDDEN, why.to_owned());
    let session = server
        .sessions
        .current(headers, Instant::now())
        .ok_or_else(|| forbidden("no console session: log in, then use the page's form"))?;
    let form = body::form(headers, body).await?;
    if !session.csrf_matches(form.field("csrf")) {
        return Err(forbidden("the form's CSRF token is missing or not this session's: reload the page"));
    }
    if session.key_id.is_none() {
        return Err(forbidden("not signed in: log in first"));
    }
    Ok((signed_in(server, headers, Need::Operate)?, form))
}

/// `GET /`: the intents, or the login form.
async fn home() -> Response {
    redirect("/console/intents", None)
}

/// `GET /console/console.css`.
async fn stylesheet() -> Response {
    let mut response = html::STYLESHEET.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/css; charset=utf-8"));
    protect(headers);
    response
}

/// The login form, with `message` above it; `cookie` gives the browser a new session.
fn login_page(status: StatusCode, session: &Current, message: Option<&str>, cookie: Option<String>) -> Response {
    let mut body = Html::new();
    body.tag("<h1>Log in</h1>");
    if let Some(message) = message {
        body.element("<p class=\"error\" id=\"login-error\">", message, "</p>");
    }
    body.tag("<p>Paste an <strong>operator</strong> key (reads and decides) or a <strong>read</strong> key ")
        .tag("(reads only), as <code>keel keys create</code> printed it. A submit key is a service's and ")
        .tag("cannot open the console.</p>")
        .tag("<form method=\"post\" action=\"/console/login\" class=\"decision\">")
        .csrf(&session.csrf)
        .tag("<label>API key <input type=\"password\" name=\"secret\" id=\"secret\" autocomplete=\"off\"></label>")
        .tag("<button type=\"submit\" id=\"login\">Log in</button></form>");
    respond(status, page("Log in", None, body), cookie)
}

/// `GET /console/login`.
async fn login_form(State(server): Shared, headers: HeaderMap) -> Response {
    let now = Instant::now();
    match server.sessions.current(&headers, now) {
        Some(session) if session.key_id.is_some() => redirect("/console/intents", None),
        Some(session) => login_page(StatusCode::OK, &session, None, None),
        None => {
            let session = server.sessions.begin(now);
            login_page(StatusCode::OK, &session, None, Some(server.sessions.set_cookie(&session)))
        }
    }
}

/// The login form's fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginForm {
    secret: String,
}

/// `POST /console/login`: an operator or read key opens a session.
async fn login(
    State(server): Shared,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    ready(&server)?;
    let forbidden = |why: &str| Refusal::Page(StatusCode::FORBIDDEN, why.to_owned());
    let now = Instant::now();
    let session = server
        .sessions
        .current(&headers, now)
        .ok_or_else(|| forbidden("the login form expired: open /console/login again"))?;
    let form = body::form(&headers, body).await?;
    if !session.csrf_matches(form.field("csrf")) {
        return Err(forbidden("the form's CSRF token is missing or not this session's: reload the page"));
    }
    let LoginForm { secret } = form.decode()?;
    auth::login_attempt(&server.logins, client.ip())?;
    let refuse = |status, message: &str| Ok(login_page(status, &session, Some(message), None));
    let key = match check_token(&server.keys, secret.trim()).map_err(|error| internal(&error))? {
        Ok(key) => key,
        Err(why) => {
            auth::login_failed(&server.logins, secret.trim())?;
            return match why {
                Refused::Revoked => refuse(StatusCode::UNAUTHORIZED, "That key was revoked."),
                Refused::Invalid | Refused::Missing => {
                    refuse(StatusCode::UNAUTHORIZED, "That is not a valid API key: nothing was signed in.")
                }
            };
        }
    };
    if key.role == Role::Submit {
        return refuse(
            StatusCode::FORBIDDEN,
            "A submit key is a service's: the console takes an operator or a read key.",
        );
    }
    let signed = server.sessions.sign_in(&session, &key.id, now);
    tracing::info!(key = %key.name, "keel serve: console login");
    Ok(redirect("/console/intents", Some(server.sessions.set_cookie(&signed))))
}

/// `POST /console/logout`.
async fn logout(State(server): Shared, headers: HeaderMap, body: Body) -> Result<Response, Refusal> {
    let session = server
        .sessions
        .current(&headers, Instant::now())
        .ok_or(Refusal::Page(StatusCode::FORBIDDEN, "no console session".to_owned()))?;
    let form = body::form(&headers, body).await?;
    if !session.csrf_matches(form.field("csrf")) {
        return Err(Refusal::Page(StatusCode::FORBIDDEN, "the form's CSRF token is missing or wrong".to_owned()));
    }
    server.sessions.end(&session);
    Ok(redirect("/console/login", Some(server.sessions.clear_cookie())))
}

fn intent_path(key: &str) -> String {
    format!("/console/intents/{}", segment(key))
}

fn run_path(run_id: &str) -> String {
    format!("/console/runs/{}", segment(run_id))
}

/// `GET /console/intents`: the tenant's intents by state, with counts; ambiguous ones first.
async fn intents(State(server): Shared, headers: HeaderMap) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let tenant = operator.key.tenant.clone();
    let counts = server.read(|reader| Ok(reader.intent_counts(&tenant)?)).map_err(|e| internal(&e))?;
    let order: Vec<IntentStatus> = AMBIGUOUS
        .iter()
        .copied()
        .chain(engine::ledger::ALL_STATUSES.iter().copied().filter(|s| !AMBIGUOUS.contains(s)))
        .collect();
    let count_of = |status: IntentStatus| counts.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
    let mut body = Html::new();
    body.tag("<h1>Intents</h1><table id=\"counts\"><tr><th>State</th><th>Intents</th></tr>");
    for status in &order {
        body.tag(if AMBIGUOUS.contains(status) { "<tr class=\"ambiguous\"><td>" } else { "<tr><td>" })
            .text(status.as_str())
            .tag("</td><td>")
            .text(&count_of(*status).to_string())
            .tag("</td></tr>");
    }
    body.tag("</table>");
    for status in order.iter().copied().filter(|s| count_of(*s) > 0) {
        let rows = server
            .read(|reader| Ok(reader.intents_page(&tenant, Some(status), None, CONSOLE_LIST_MAX)?))
            .map_err(|e| internal(&e))?;
        body.tag("<h2 id=\"state-").text(status.as_str()).tag("\">").text(status.as_str()).tag("</h2>");
        body.tag("<table><tr><th>Intent</th><th>Amount</th><th>Order</th><th>Attempts</th><th></th></tr>");
        for row in &rows {
            body.tag("<tr><td class=\"mono\">").link(&intent_path(&row.key), &row.key).tag("</td><td>");
            body.text(&money(row.amount_minor, &row.currency)).tag("</td><td>").text(&row.order_id).tag("</td><td>");
            body.text(&format!("{}/{}", row.attempts, row.attempts_max)).tag("</td><td>");
            if status == IntentStatus::AwaitingApproval {
                body.link(&format!("{}/approval", intent_path(&row.key)), "review the approval");
            }
            body.tag("</td></tr>");
        }
        body.tag("</table>");
        let more = count_of(status).saturating_sub(rows.len() as u64);
        if more > 0 {
            body.element(
                "<p>",
                &format!("and {more} more (GET /v1/intents?state={} pages through them)", status.as_str()),
                "</p>",
            );
        }
    }
    Ok(operator.page("Intents", body))
}

/// The intent in the path, its document, for a signed-in key of its tenant.
fn shown_intent(server: &Server, operator: &SignedIn, key: &str) -> Result<crate::ops::IntentDocument, Refusal> {
    let intent_key = own_intent(key, &operator.key)?;
    server
        .read(|reader| crate::ops::intent_document(reader, &intent_key))
        .map_err(|e| internal(&e))?
        .ok_or_else(|| super::api::not_found(intent_key.as_str()).into())
}

/// Whether an operator's resolution applies to `status` (the provider's lookup is shown then).
fn resolvable(status: IntentStatus) -> bool {
    matches!(status, IntentStatus::OutcomeUnknown | IntentStatus::Reconciling | IntentStatus::Escalated)
}

/// `GET /console/intents/{key}`: state, evidence, history with causes, and the forms.
async fn intent(State(server): Shared, headers: HeaderMap, Path(key): Path<String>) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let shown = shown_intent(&server, &operator, &key)?;
    let intent = &shown.intent;
    let key = intent.key().as_str().to_owned();
    let mut body = Html::new();
    body.tag("<h1 class=\"mono\">").text(&key).tag("</h1>");
    body.tag("<table id=\"summary\">");
    let row = |body: &mut Html, name: &'static str, value: &str| {
        body.tag("<tr><th>").tag(name).tag("</th><td>").text(value).tag("</td></tr>");
    };
    row(&mut body, "State", intent.status.as_str());
    row(&mut body, "Operation", intent.definition.kind.as_str());
    row(&mut body, "Amount", &money(intent.definition.amount_minor, &intent.definition.currency));
    row(&mut body, "Order", &intent.definition.order_id);
    row(&mut body, "Fingerprint", &intent.definition.fingerprint);
    row(&mut body, "Attempts", &format!("{}/{}", intent.attempts, intent.attempts_max));
    row(&mut body, "Reconciliations", &format!("{}/{}", intent.reconciliations, intent.reconciliations_max));
    if let Some(evidence) = &intent.evidence {
        row(
            &mut body,
            "Evidence",
            &format!("{} ({})", evidence.provider_ref, money(evidence.amount_minor, &evidence.currency)),
        );
    }
    if let Some(note) = &intent.note {
        row(&mut body, "Note", note);
    }
    if let Some(crate::stuck::Waiting::Caller(reason) | crate::stuck::Waiting::Vault(reason)) = &shown.waiting {
        row(&mut body, "Waiting", reason);
    }
    body.tag("<tr><th>Run</th><td class=\"mono\">").link(&run_path(intent.run_id.as_str()), intent.run_id.as_str());
    body.tag("</td></tr></table>");
    if intent.status == IntentStatus::AwaitingApproval {
        body.tag("<p class=\"notice\">It awaits a human approval: ")
            .link(&format!("{}/approval", intent_path(&key)), "review what you approve")
            .tag("</p>");
    }
    body.tag("<h2>History</h2><table id=\"history\"><tr><th>#</th><th>At</th><th>Event</th><th>Caused by</th><th>After</th><th>What</th></tr>");
    for event in &shown.events {
        body.tag("<tr><td>").text(&event.seq.to_string()).tag("</td><td>").text(&when(event.at));
        body.tag("</td><td>").text(event.event.type_name()).tag("</td><td>").text(&event.cause.actor);
        body.tag("</td><td>").text(&event.cause.parent.map_or(String::new(), |p| format!("#{p}")));
        body.tag("</td><td>").text(&describe(&event.event)).tag("</td></tr>");
    }
    body.tag("</table>");
    if operator.decides() {
        body.append(decision_forms(&server, &operator, intent).await);
    }
    Ok(operator.page(&key, body))
}

/// The forms an operator may use on `intent` now; the provider's lookup beside resolve.
async fn decision_forms(server: &Server, operator: &SignedIn, intent: &Intent) -> Html {
    let action = |decision: &str| format!("{}/{decision}", intent_path(intent.key().as_str()));
    let csrf = operator.session.csrf.as_str();
    let mut forms = Html::new();
    forms.tag("<h2>Decide</h2>");
    if resolvable(intent.status) {
        forms.tag("<form method=\"post\" class=\"decision\" action=\"").text(&action("reconcile")).tag("\">");
        forms
            .csrf(csrf)
            .tag("<button type=\"submit\" id=\"reconcile\">Reconcile now (ask the provider)</button></form>");
        forms.tag("<div class=\"side-by-side\"><form method=\"post\" class=\"decision\" id=\"resolve-form\" action=\"");
        forms.text(&action("resolve")).tag("\">").csrf(csrf);
        forms.tag("<label><input type=\"radio\" name=\"outcome\" value=\"landed\"> It landed, provider reference:")
            .tag(" <input type=\"text\" name=\"landed_ref\"></label>")
            .tag("<label><input type=\"radio\" name=\"outcome\" value=\"absent\"> It did not happen</label>")
            .tag("<label>Reason (recorded) <input type=\"text\" name=\"reason\"></label>")
            .tag("<label>Override the provider's answer, because: <input type=\"text\" name=\"override_reason\"></label>")
            .tag("<button type=\"submit\">Resolve</button></form>");
        forms.tag("<div class=\"decision\" id=\"lookup\"><strong>The provider's lookup, now:</strong> ");
        if intent.capability.lookup {
            let provider = &server.node.executor.runtime().provider;
            let text = match provider.lookup(intent.definition.kind, intent.key().as_str()).await {
                LookupOutcome::Found(evidence) => format!(
                    "found {} ({}): a resolution saying it landed agrees",
                    evidence.provider_ref,
                    money(evidence.amount_minor, &evidence.currency)
                ),
                LookupOutcome::Absent => {
                    "no effect with this key (an absence may be premature inside the provider's consistency window)"
                        .to_owned()
                }
                LookupOutcome::Unavailable { detail } => format!("unavailable: {detail}"),
            };
            forms.text(&text);
        } else {
            forms.text("this provider cannot look effects up: a resolution is recorded unverified");
        }
        forms.tag("</div></div>");
    }
    if matches!(intent.status, IntentStatus::Reserved | IntentStatus::OutcomeUnknown | IntentStatus::Escalated) {
        forms.tag("<form method=\"post\" class=\"decision\" action=\"").text(&action("cancel")).tag("\">").csrf(csrf);
        forms
            .tag("<label>Cancel it, because (recorded) <input type=\"text\" name=\"reason\"></label>")
            .tag("<button type=\"submit\">Cancel the intent</button></form>");
    }
    forms
}

/// `GET /console/intents/{key}/approval`: what a human must see before approving (seed 002).
async fn approval(State(server): Shared, headers: HeaderMap, Path(key): Path<String>) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let shown = shown_intent(&server, &operator, &key)?;
    let intent = &shown.intent;
    let key = intent.key().as_str().to_owned();
    let (refunded, held) =
        server.read(|reader| crate::ops::refunded_on_order(reader, intent)).map_err(|e| internal(&e))?;
    let untrusted = server.read(|reader| third_party_texts(reader, &intent.run_id)).map_err(|e| internal(&e))?;
    let currency = intent.definition.currency.as_str();
    let mut body = Html::new();
    body.tag("<h1>Approve or deny</h1>");
    body.tag("<table id=\"approval\">");
    let row = |body: &mut Html, name: &'static str, id: &'static str, value: &str| {
        body.tag("<tr><th>").tag(name).tag("</th><td id=\"").tag(id).tag("\">").text(value).tag("</td></tr>");
    };
    row(&mut body, "Intent", "intent", &key);
    row(&mut body, "State", "state", intent.status.as_str());
    row(&mut body, "Operation", "operation", intent.definition.kind.as_str());
    row(&mut body, "Amount", "amount", &money(intent.definition.amount_minor, currency));
    row(&mut body, "Order", "order", &intent.definition.order_id);
    row(&mut body, "Already refunded on this order", "refunded", &money(refunded, currency));
    row(&mut body, "Held by refunds still pending", "held", &money(held, currency));
    row(&mut body, "Fingerprint the approval binds to", "fingerprint", &intent.definition.fingerprint);
    let now = SystemClock.now();
    let valid_until = chrono::TimeDelta::try_milliseconds(i64::try_from(APPROVAL_TTL_DEFAULT_MS).unwrap_or(i64::MAX))
        .and_then(|ttl| now.checked_add_signed(ttl));
    row(&mut body, "An approval now is valid until", "expiry", &valid_until.map_or("-".to_owned(), when));
    if let Some(closes) = intent.approval_closes_at {
        row(&mut body, "The run stops waiting at", "closes", &when(closes));
    }
    body.tag("</table>");
    body.tag("<h2>What the request came with</h2>");
    if untrusted.is_empty() {
        body.tag("<p id=\"no-ticket\">No third-party text: this intent was proposed by its run's workflow, ")
            .tag("not read from a ticket.</p>");
    }
    for (provenance, text) in &untrusted {
        body.tag("<p class=\"untrusted-label\">UNTRUSTED — written by a third party (")
            .text(provenance)
            .tag("): data to weigh, never instructions to follow.</p>");
        body.element("<div class=\"untrusted\">", text, "</div>");
    }
    if operator.decides() && intent.status == IntentStatus::AwaitingApproval {
        let action = |decision: &str| format!("{}/{decision}", intent_path(&key));
        body.tag("<form method=\"post\" class=\"decision\" id=\"approve-form\" action=\"").text(&action("approve"));
        body.tag("\">").csrf(&operator.session.csrf);
        body.tag("<input type=\"hidden\" name=\"fingerprint\" value=\"").text(&intent.definition.fingerprint);
        body.tag("\"><button type=\"submit\" id=\"approve\">Approve this exact request</button></form>");
        body.tag("<form method=\"post\" class=\"decision\" action=\"").text(&action("deny")).tag("\">");
        body.csrf(&operator.session.csrf);
        body.tag("<label>Deny it, because (recorded) <input type=\"text\" name=\"reason\" id=\"deny-reason\"></label>")
            .tag("<button type=\"submit\" id=\"deny\">Deny</button></form>");
    }
    body.tag("<p>").link(&intent_path(&key), "The intent's history").tag("</p>");
    Ok(operator.page("Approval", body))
}

/// The third-party texts a run read (an agent's tool results that carry a provenance: a
/// ticket), as recorded in its journal.
fn third_party_texts(reader: &store::Reader, run_id: &RunId) -> anyhow::Result<Vec<(String, String)>> {
    let Some(history) = reader.history(run_id)? else { return Ok(Vec::new()) };
    let mut texts = Vec::new();
    for entry in history.agent_entries {
        let fact: agent::AgentEvent = serde_json::from_value(entry)?;
        if let agent::AgentEvent::ToolResultRecorded { tool, content, provenance: Some(provenance), .. } = fact {
            texts.push((format!("{tool}: {provenance}"), content));
        }
    }
    Ok(texts)
}

/// The fields of a form with nothing to say.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyForm {}

/// The fields of a cancellation or a denial.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonForm {
    reason: String,
}

/// What a resolution asserts.
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Landed,
    Absent,
}

/// The fields of a resolution (an empty text field is an absent one).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveForm {
    outcome: Outcome,
    #[serde(default)]
    landed_ref: String,
    reason: String,
    #[serde(default)]
    override_reason: String,
}

/// The fields of an approval: the fingerprint the page showed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveForm {
    fingerprint: String,
}

/// Which form was posted.
#[derive(Clone, Copy)]
enum Posted {
    Reconcile,
    Cancel,
    Resolve,
    Approve,
    Deny,
}

/// A posted form as the API's checked decision.
fn asked(posted: Posted, form: &body::Form) -> Result<Asked, ApiError> {
    let filled = |text: String| Some(text.trim().to_owned()).filter(|t| !t.is_empty());
    Ok(match posted {
        Posted::Reconcile => {
            let EmptyForm {} = form.decode()?;
            Asked::Reconcile
        }
        Posted::Cancel | Posted::Deny => {
            let ReasonForm { reason } = form.decode()?;
            nonempty("reason", &reason)?;
            if matches!(posted, Posted::Cancel) { Asked::Cancel { reason } } else { Asked::Deny { reason } }
        }
        Posted::Approve => {
            let ApproveForm { fingerprint } = form.decode()?;
            nonempty("fingerprint", &fingerprint)?;
            Asked::Approve { fingerprint: Some(fingerprint), ttl_ms: APPROVAL_TTL_DEFAULT_MS }
        }
        Posted::Resolve => {
            let ResolveForm { outcome, landed_ref, reason, override_reason } = form.decode()?;
            nonempty("reason", &reason)?;
            let landed = match (outcome, filled(landed_ref)) {
                (Outcome::Landed, Some(reference)) => Some(reference),
                (Outcome::Absent, None) => None,
                (Outcome::Landed, None) => {
                    return Err(ApiError::new(
                        super::error::Code::InvalidArguments,
                        "it landed: give the provider's reference",
                    ));
                }
                (Outcome::Absent, Some(_)) => {
                    return Err(ApiError::new(
                        super::error::Code::InvalidArguments,
                        "it did not happen: leave the provider reference empty",
                    ));
                }
            };
            Asked::Resolve { landed, reason, override_reason: filled(override_reason) }
        }
    })
}

/// One decision form: CSRF, role, tenant wall, fields, existence — then the API's executor
/// path, and back to the intent.
async fn decide(
    server: &Server,
    posted_form: Posted,
    key: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let (operator, form) = posted(server, headers, body).await?;
    let intent_key: IntentKey = own_intent(key, &operator.key)?;
    let asked = asked(posted_form, &form)?;
    if !intent_exists(server, &intent_key)? {
        return Err(super::api::not_found(intent_key.as_str()).into());
    }
    let path = intent_path(intent_key.as_str());
    carry_out(server, &operator.key, intent_key, asked).await?;
    Ok(redirect(&path, None))
}

/// `POST /console/intents/{key}/reconcile`.
async fn reconcile(
    State(server): Shared,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Body,
) -> Result<Response, Refusal> {
    decide(&server, Posted::Reconcile, &key, &headers, body).await
}

/// `POST /console/intents/{key}/cancel`.
async fn cancel(
    State(server): Shared,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Body,
) -> Result<Response, Refusal> {
    decide(&server, Posted::Cancel, &key, &headers, body).await
}

/// `POST /console/intents/{key}/resolve`.
async fn resolve(
    State(server): Shared,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Body,
) -> Result<Response, Refusal> {
    decide(&server, Posted::Resolve, &key, &headers, body).await
}

/// `POST /console/intents/{key}/approve`.
async fn approve(
    State(server): Shared,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Body,
) -> Result<Response, Refusal> {
    decide(&server, Posted::Approve, &key, &headers, body).await
}

/// `POST /console/intents/{key}/deny`.
async fn deny(
    State(server): Shared,
    headers: HeaderMap,
    Path(key): Path<String>,
    body: Body,
) -> Result<Response, Refusal> {
    decide(&server, Posted::Deny, &key, &headers, body).await
}

/// `GET /console/runs`: the tenant's latest runs.
async fn runs(State(server): Shared, headers: HeaderMap) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let tenant = operator.key.tenant.clone();
    let rows = server
        .read(|reader| Ok(reader.runs_page(&tenant, None, None, engine::limits::API_PAGE_LIMIT_DEFAULT)?))
        .map_err(|e| internal(&e))?;
    let mut body = Html::new();
    body.tag("<h1>Runs</h1><table id=\"runs\"><tr><th>Run</th><th>Workflow</th><th>Status</th><th>Started</th><th>Intents</th><th>Money (minor)</th></tr>");
    for row in &rows {
        body.tag("<tr><td class=\"mono\">").link(&run_path(&row.run_id), &row.run_id).tag("</td><td>");
        body.text(&row.workflow).tag("</td><td>").text(&row.status).tag("</td><td>").text(&row.started_at);
        body.tag("</td><td>").text(&row.intents.to_string()).tag("</td><td>");
        body.text(&row.cost_committed_minor.to_string()).tag("</td></tr>");
    }
    body.tag("</table>");
    if rows.len() == engine::limits::API_PAGE_LIMIT_DEFAULT {
        body.tag("<p>The first runs only: GET /v1/runs pages through them all.</p>");
    }
    Ok(operator.page("Runs", body))
}

/// `GET /console/runs/{id}`: the run, its budgets, its intents and its causal tree.
async fn run(State(server): Shared, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let run_id = RunId::new(id);
    let now = SystemClock.now();
    let missing = || Refusal::Page(StatusCode::NOT_FOUND, format!("no run with id {run_id}"));
    if !server.read(|reader| is_tenants_run(reader, &run_id, &operator.key.tenant)).map_err(|e| internal(&e))? {
        return Err(missing());
    }
    let shown = server.read(|reader| crate::runs::run_document(reader, &run_id, now)).map_err(|e| internal(&e))?;
    let shown = shown.ok_or_else(missing)?;
    let trace =
        server.read(|reader| crate::trace::build(reader, &run_id)).map_err(|e| internal(&e))?.ok_or_else(missing)?;
    let mut body = Html::new();
    body.tag("<h1 class=\"mono\">Run ").text(run_id.as_str()).tag("</h1><table>");
    body.tag("<tr><th>Workflow</th><td>").text(&shown.run.workflow).tag("</td></tr>");
    body.tag("<tr><th>Status</th><td>").text(shown.run.status.map_or("running", |s| s.as_str())).tag("</td></tr>");
    body.tag("<tr><th>Started</th><td>").text(&when(shown.run.started_at)).tag("</td></tr>");
    body.tag("<tr><th>Deadline</th><td>").text(&when(shown.run.deadline_at)).tag("</td></tr></table>");
    body.tag("<h2>Budgets</h2><table><tr><th>Budget</th><th>Used</th><th>Max</th><th>Left</th></tr>");
    for budget in &shown.budgets {
        let optional = |value: Option<i64>| value.map_or("unbounded".to_owned(), |v| v.to_string());
        body.tag("<tr><td>").text(&budget.name).tag("</td><td>").text(&budget.used.to_string()).tag("</td><td>");
        body.text(&optional(budget.max)).tag("</td><td>").text(&optional(budget.remaining)).tag("</td></tr>");
    }
    body.tag("</table><h2>Intents</h2><ul>");
    for intent in &shown.intents {
        body.tag("<li class=\"mono\">").link(&intent_path(intent.key().as_str()), intent.key().as_str()).tag(" ");
        body.text(intent.status.as_str()).tag("</li>");
    }
    body.tag("</ul><h2>Causal tree</h2>");
    body.tag("<ul class=\"tree\" id=\"trace\">");
    for root in &trace.roots {
        tree_node(&mut body, root);
    }
    body.tag("</ul>");
    Ok(operator.page("Run", body))
}

fn tree_node(body: &mut Html, node: &crate::trace::Node) {
    body.tag("<li><strong>").text(&node.event).tag("</strong> #").text(&node.seq.to_string()).tag(" ");
    body.text(&node.at);
    if node.duration_ms > 0 {
        body.text(&format!(" (+{} ms)", node.duration_ms));
    }
    if let Some(detail) = &node.detail {
        body.tag(" — ").text(detail);
    }
    if let Some(status) = &node.status {
        body.tag(" [").text(status).tag("]");
    }
    body.tag(" <em>").text(&node.actor).tag("</em>");
    if !node.children.is_empty() {
        body.tag("<ul class=\"tree\">");
        for child in &node.children {
            tree_node(body, child);
        }
        body.tag("</ul>");
    }
    body.tag("</li>");
}

/// `GET /console/metrics`: the tenant's figures, by operation, with small charts.
async fn metrics(State(server): Shared, headers: HeaderMap) -> Result<Response, Refusal> {
    let operator = signed_in(&server, &headers, Need::Read)?;
    let tenant = operator.key.tenant.clone();
    let now = SystemClock.now();
    let report = server
        .read(|reader| crate::metrics::report(reader, None, Some(crate::metrics::By::Operation), Some(&tenant), now))
        .map_err(|e| internal(&e))?;
    let counts = server.read(|reader| Ok(reader.intent_counts(&tenant)?)).map_err(|e| internal(&e))?;
    let mut body = Html::new();
    body.tag("<h1>Metrics</h1>");
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    let by_state: Vec<(String, f64)> = counts.iter().map(|(s, n)| (s.as_str().to_owned(), *n as f64)).collect();
    body.append(bar_chart("Intents by state", &by_state, None, ""));
    let label = |f: &crate::metrics::Figures| f.segment.clone().unwrap_or_else(|| "(none)".to_owned());
    let rate = |pick: &dyn Fn(&crate::metrics::Figures) -> Option<f64>| -> Vec<(String, f64)> {
        report.segments.iter().map(|f| (label(f), pick(f).unwrap_or(0.0) * 100.0)).collect()
    };
    body.append(bar_chart("Outcome verification rate", &rate(&|f| f.outcome_verification_rate), Some(100.0), " %"));
    body.append(bar_chart("Ambiguous outcome rate", &rate(&|f| f.ambiguous_outcome_rate), Some(100.0), " %"));
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    let prevented: Vec<(String, f64)> =
        report.segments.iter().map(|f| (label(f), f.retries_prevented.total as f64)).collect();
    body.append(bar_chart("Retries prevented", &prevented, None, ""));
    #[allow(clippy::cast_precision_loss, reason = "milliseconds far below 2^53")]
    let settle: Vec<(String, f64)> = report
        .segments
        .iter()
        .flat_map(|f| {
            let times = &f.time_to_definitive_outcome_ms;
            [
                (format!("{} p50", label(f)), times.p50.unwrap_or(0) as f64),
                (format!("{} p99", label(f)), times.p99.unwrap_or(0) as f64),
            ]
        })
        .collect();
    body.append(bar_chart("Time to a definitive outcome", &settle, None, " ms"));
    body.tag("<h2>Drift</h2>");
    if report.drift.is_empty() {
        body.tag("<p id=\"drift\">No rate moved when a release, policy, prompt or model changed.</p>");
    } else {
        body.tag("<table id=\"drift\"><tr><th>Rate</th><th>Dimension</th><th>From</th><th>To</th><th>Before</th><th>After</th></tr>");
        for moved in &report.drift {
            body.tag("<tr><td>").text(moved.rate).tag("</td><td>").text(moved.dimension).tag("</td><td>");
            body.text(&moved.from_version).tag("</td><td>").text(&moved.to_version).tag("</td><td>");
            body.text(&format!("{:.3}", moved.before)).tag("</td><td>").text(&format!("{:.3}", moved.after));
            body.tag("</td></tr>");
        }
        body.tag("</table>");
    }
    body.tag(
        "<p>The same figures: <code>GET /v1/metrics</code> (JSON) and <code>GET /metrics</code> (Prometheus).</p>",
    );
    Ok(operator.page("Metrics", body))
}

#[cfg(test)]
mod tests {
    use super::super::api::Asked;
    use super::{Posted, asked, body};

    fn form(text: &str) -> body::Form {
        body::Form::parse(text.as_bytes())
    }

    #[test]
    fn a_resolution_form_says_one_thing_or_is_refused() {
        for (text, ok) in [
            ("csrf=t&outcome=landed&landed_ref=ch_1&reason=seen+in+dashboard", true),
            ("csrf=t&outcome=absent&reason=not+there", true),
            ("csrf=t&outcome=landed&reason=no+ref", false),
            ("csrf=t&outcome=absent&landed_ref=ch_1&reason=both", false),
            ("csrf=t&outcome=maybe&reason=x", false),
            ("csrf=t&outcome=absent&reason=+", false),
            ("csrf=t&outcome=absent&reason=a&reason=b", false),
            ("csrf=t&outcome=absent&reason=a&by=mallory", false),
        ] {
            assert_eq!(asked(Posted::Resolve, &form(text)).is_ok(), ok, "{text}");
        }
        let Ok(Asked::Resolve { landed, override_reason, .. }) =
            asked(Posted::Resolve, &form("csrf=t&outcome=landed&landed_ref=ch_1&reason=r&override_reason="))
        else {
            panic!("a resolution");
        };
        assert_eq!((landed.as_deref(), override_reason), (Some("ch_1"), None), "an empty field is an absent one");
    }

    #[test]
    fn an_approval_is_bound_to_the_fingerprint_the_page_showed() {
        let Ok(Asked::Approve { fingerprint, .. }) = asked(Posted::Approve, &form("csrf=t&fingerprint=abc")) else {
            panic!("an approval");
        };
        assert_eq!(fingerprint.as_deref(), Some("abc"));
        assert!(asked(Posted::Approve, &form("csrf=t")).is_err(), "no fingerprint, no approval");
        assert!(asked(Posted::Deny, &form("csrf=t&reason=")).is_err(), "a denial says why");
    }
}
