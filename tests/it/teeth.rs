//! Tests with teeth (issue 14): each one is the user's side of a promise that a hand-made
//! mutation of the decision code broke without any test failing. Each names, in its doc, the
//! mutation it kills; each was seen failing with that mutation applied. Through the real
//! `keel` binary, against the real simulator or a hand-written misbehaving provider.
//!
//! - attempts are bounded: a resend loop escalates once its attempts are spent, whether the
//!   resend follows a proven absence (tier `dedup+lookup`) or the key alone (tier `dedup`);
//! - a resend is not started when the run's deadline leaves no time to reconcile it;
//! - a lookup or a direct answer that reports another amount or currency never validates;
//! - a tool call proposed after the run's deadline is not admitted.

use crate::cli::start_sim;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::sample::TENANT;

/// The provider request timeout the desk tells Keel: a lookup's absence is proof only after it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;

/// A provider that fails every charge before acting: each attempt is unknown to Keel, and
/// each lookup proves it absent.
const CHARGES_FAIL: &str =
    r#"{"seed": 1, "rules": [{"operation": "charge", "fault": "fail_before_effect", "probability": 1.0}]}"#;

/// One log, one provider, one tier; lookups trust absence at once (no consistency window).
struct Desk {
    _dir: tempfile::TempDir,
    db: PathBuf,
    url: String,
    tier: &'static str,
}

impl Desk {
    fn new(dir: tempfile::TempDir, url: String, tier: &'static str) -> Self {
        let db = dir.path().join("keel.db");
        Self { _dir: dir, db, url, tier }
    }

    fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .arg("--db")
            .arg(&self.db)
            .args(["--json", "--provider", &self.url, "--provider-tier", self.tier])
            .args(["--provider-consistency-window-ms", "0", "--provider-timeout-ms", &REQUEST_TIMEOUT_MS.to_string()])
            .args(args)
            .env_remove("KEEL_DB")
            .env_remove("KEEL_PROVIDER_URL")
            .env_remove("KEEL_FAILPOINT");
        command
    }

    /// `keel reconcile KEY` once the last request is certainly over: an absence seen before
    /// the request timeout has passed is not proof (the request may still land) and is looked
    /// at again later, which is not what these tests are about.
    fn reconcile_after_the_request(&self, key: &str) -> (i32, Value) {
        std::thread::sleep(Duration::from_millis(REQUEST_TIMEOUT_MS + 50));
        self.keel(&["reconcile", key])
    }

    fn keel<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(&self, args: &[S]) -> (i32, Value) {
        let output = self.command(args).output().expect("keel runs");
        let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
            panic!(
                "keel {args:?} prints one JSON document, got {:?} (stderr {:?})",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.code().unwrap_or(-1), json)
    }

    /// `keel show KEY`: the intent as stored, and its history.
    fn show(&self, key: &str) -> Value {
        let (code, shown) = self.keel(&["show", key]);
        assert_eq!(code, 0, "{shown}");
        shown
    }

    /// How many attempts the log says were started (each one a request that may have left).
    fn attempts_started(&self, key: &str) -> usize {
        events_of(&self.show(key), "AttemptStarted").len()
    }

    fn verify(&self) {
        let (code, report) = self.keel(&["verify"]);
        assert_eq!(code, 0, "{report}");
    }
}

fn events_of(shown: &Value, kind: &str) -> Vec<Value> {
    shown["events"].as_array().expect("a history").iter().filter(|e| e["type"] == kind).cloned().collect()
}

/// `keel charge` of 49.00 EUR for intent `order_N_charge` on order `order_N` (each intent its
/// own order: a second key on a pending order is refused by design).
fn charge_args(n: &str) -> Vec<String> {
    let mut args: Vec<String> =
        ["charge", "--tenant", TENANT, "--amount-minor", "4900", "--currency", "EUR"].map(str::to_owned).to_vec();
    args.extend(["--intent-id".into(), format!("order_{n}_charge"), "--order".into(), format!("order_{n}")]);
    args.extend(["--payment-method-token".into(), "pm_card_visa_4242424242".into()]);
    args
}

fn charge_key(n: &str) -> String {
    format!("charge:{TENANT}:order_{n}_charge")
}

fn with(mut args: Vec<String>, more: &[&str]) -> Vec<String> {
    args.extend(more.iter().map(|s| (*s).to_owned()));
    args
}

/// Waits, in real time, until the last unknown outcome of `key` is due for reconciliation: the
/// backoff is the subject here, not a stand-in for synchronisation. The wait is the backoff
/// the log recorded (`reconcile_after` less the instant of the `OutcomeUnknown`), counted
/// from now, which is after that instant.
fn wait_until_due(desk: &Desk, key: &str) {
    let shown = desk.show(key);
    let unknown = events_of(&shown, "OutcomeUnknown").pop().expect("an unknown outcome");
    let instant = |value: &Value| value.as_str().expect("an instant").parse::<DateTime<Utc>>().expect("RFC 3339");
    let backoff = instant(&shown["intent"]["reconcile_after"]) - instant(&unknown["at"]);
    std::thread::sleep(backoff.to_std().expect("a backoff is positive") + Duration::from_millis(50));
}

fn effects_at(sim_db: &Path) -> usize {
    provider_sim::list_effects(sim_db).expect("the simulator's effects").len()
}

// ----- attempts are bounded ----------------------------------------------------------------------

/// Kills: the "all attempts spent" check after a lookup proves absence removed
/// (`resolve_lookup`), alone or together with the one in `StartAttempt`. A caller that
/// re-submits after every proven absence gets exactly `--max-attempts` requests sent, and the
/// lookup that proves the last one absent escalates the intent (an operator must look): it
/// does not hand back "ready for the next attempt".
#[test]
fn a_resend_loop_after_proven_absences_escalates_once_its_attempts_are_spent() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), Some(CHARGES_FAIL));
    let sim_db = dir.path().join("sim.db");
    let desk = Desk::new(dir, sim.url().to_owned(), "dedup+lookup");
    let charge = with(charge_args("7001"), &["--max-attempts", "2"]);
    let key = charge_key("7001");

    let (code, first) = desk.keel(&charge);
    assert_eq!((code, first["status"].as_str(), first["attempts"].as_u64()), (2, Some("outcome_unknown"), Some(1)));
    let (_, absent) = desk.reconcile_after_the_request(&key);
    assert_eq!(absent[0]["status"], "reserved", "proven absent with an attempt left: a resend may go: {absent}");

    let (code, second) = desk.keel(&charge);
    assert_eq!((code, second["status"].as_str(), second["attempts"].as_u64()), (2, Some("outcome_unknown"), Some(2)));
    let (code, spent) = desk.reconcile_after_the_request(&key);
    assert_eq!(code, 2, "{spent}");
    assert_eq!(spent[0]["status"], "escalated", "proven absent with no attempt left: escalated, {spent}");
    assert_eq!(spent[0]["attempts"], 2);
    let shown = desk.show(&key);
    assert_eq!(shown["intent"]["absence_proven"], true, "{shown}");
    let note = shown["intent"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("all 2 attempts spent"), "the escalation says why: {note:?}");

    // The caller keeps re-submitting: nothing more is sent.
    for _ in 0..2 {
        let (code, again) = desk.keel(&charge);
        assert_eq!((code, again["status"].as_str(), again["attempts"].as_u64()), (2, Some("escalated"), Some(2)));
    }
    assert_eq!(desk.attempts_started(&key), 2, "exactly --max-attempts requests were sent");
    assert_eq!(effects_at(&sim_db), 0);
    desk.verify();
}

/// Kills: the "all attempts spent" check in `StartAttempt` removed, alone or with the one
/// after a lookup. A provider that deduplicates but offers no lookup is resent by its key
/// alone whenever a reconciliation is due — no lookup ever bounds that loop, only the
/// attempts: the third re-submission escalates instead of sending a third request.
#[test]
fn a_resend_loop_by_key_alone_escalates_once_its_attempts_are_spent() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), Some(CHARGES_FAIL));
    let sim_db = dir.path().join("sim.db");
    let desk = Desk::new(dir, sim.url().to_owned(), "dedup");
    let charge = with(charge_args("7002"), &["--max-attempts", "2"]);
    let key = charge_key("7002");

    let (_, first) = desk.keel(&charge);
    assert_eq!((first["status"].as_str(), first["attempts"].as_u64()), (Some("outcome_unknown"), Some(1)), "{first}");
    wait_until_due(&desk, &key);
    let (_, second) = desk.keel(&charge);
    assert_eq!(
        (second["status"].as_str(), second["attempts"].as_u64()),
        (Some("outcome_unknown"), Some(2)),
        "{second}"
    );
    wait_until_due(&desk, &key);
    let (code, third) = desk.keel(&charge);
    assert_eq!(code, 2, "{third}");
    assert_eq!((third["status"].as_str(), third["attempts"].as_u64()), (Some("escalated"), Some(2)), "{third}");
    let details = third["details"].to_string();
    assert!(details.contains("all 2 attempts spent"), "the escalation says why: {details}");
    assert_eq!(desk.attempts_started(&key), 2, "exactly --max-attempts requests were sent");
    assert_eq!(effects_at(&sim_db), 0);
    desk.verify();
}

// ----- no effect without the time to reconcile it ------------------------------------------------

/// Kills: the deadline reserve removed from `StartAttempt`. A resend (and a first send
/// after a reservation) made by a run with less time left than the provider's request timeout
/// plus the first reconciliation backoff (`limits::reconciliation_reserve_ms`) is
/// not started: nothing leaves, and the intent is released — rejected, its money and its
/// order freed — rather than left reserved, blocking its order.
#[test]
fn a_resend_is_not_started_when_the_deadline_leaves_no_time_to_reconcile_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let plan = r#"{"seed": 1, "rules": [{"operation": "charge", "fault": "fail_before_effect", "times": 1}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let sim_db = dir.path().join("sim.db");
    let desk = Desk::new(dir, sim.url().to_owned(), "dedup+lookup");
    let charge = charge_args("7003");
    let key = charge_key("7003");

    let (_, first) = desk.keel(&charge);
    assert_eq!(first["status"], "outcome_unknown", "{first}");
    let (_, absent) = desk.reconcile_after_the_request(&key);
    assert_eq!(absent[0]["status"], "reserved", "proven absent: a resend may go: {absent}");

    // One millisecond short of the reserve (the reconciliation of the resend would be the second).
    let short = (engine::limits::reconciliation_reserve_ms(REQUEST_TIMEOUT_MS, 2) - 1).to_string();
    let (code, hurried) = desk.keel(&with(charge.clone(), &["--deadline-ms", &short]));
    assert_eq!(code, 2, "{hurried}");
    assert_eq!(hurried["run_status"], "deadline_exceeded", "{hurried}");
    let shown = desk.show(&key);
    assert_eq!((shown["status"].as_str(), shown["attempts"].as_u64()), (Some("rejected"), Some(1)), "{shown}");
    assert_eq!(desk.attempts_started(&key), 1, "the resend was not started");

    // A first send too: reserved by a run that cannot reconcile it, never sent, released.
    let hurried_first = with(charge_args("7004"), &["--deadline-ms", "1500"]);
    let (code, fresh) = desk.keel(&hurried_first);
    assert_eq!(code, 2, "{fresh}");
    assert_eq!(desk.attempts_started(&charge_key("7004")), 0, "nothing was sent: {fresh}");
    assert_eq!(desk.show(&charge_key("7004"))["status"], "rejected");
    assert_eq!(effects_at(&sim_db), 0);

    // The released intent stays what it is (same key: its stored outcome, never a send); its
    // order is free for a new intent, which goes and lands once.
    let (code, again) = desk.keel(&charge);
    assert_eq!((code, again["status"].as_str()), (2, Some("rejected")), "{again}");
    assert_eq!(desk.attempts_started(&key), 1);
    let mut renewed = charge_args("7003");
    let at = renewed.iter().position(|a| a == "order_7003_charge").expect("the intent id");
    renewed[at] = "order_7003_charge_again".to_owned();
    let (code, resent) = desk.keel(&renewed);
    assert_eq!((code, resent["status"].as_str()), (0, Some("validated")), "{resent}");
    assert_eq!(effects_at(&sim_db), 1);
    desk.verify();
}

// ----- evidence must match the intent --------------------------------------------------------------

/// What the misbehaving provider answers: to a charge (a status and a body), and to every
/// lookup (a 200 with a succeeded charge of `lookup_amount` `lookup_currency`).
#[derive(Clone)]
struct Answers {
    charge: (u16, Value),
    lookup: (i64, &'static str),
}

/// A Stripe-like provider on 127.0.0.1 that says whatever `Answers` holds.
struct Liar {
    url: String,
    answers: Arc<Mutex<Answers>>,
    charges: Arc<Mutex<u32>>,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Clone)]
struct Told {
    answers: Arc<Mutex<Answers>>,
    charges: Arc<Mutex<u32>>,
}

/// A succeeded PaymentIntent as Stripe answers it (its currency lower case), under `key`.
fn succeeded(id: &str, amount: i64, currency: &str, key: &str) -> Value {
    json!({"id": id, "object": "payment_intent", "amount": amount, "currency": currency.to_ascii_lowercase(),
           "status": "succeeded", "metadata": {"keel_intent_key": key}})
}

async fn charge_answer(State(told): State<Told>) -> (StatusCode, String) {
    *told.charges.lock().expect("test mutex") += 1;
    let (status, body) = told.answers.lock().expect("test mutex").charge.clone();
    (StatusCode::from_u16(status).expect("a status code"), body.to_string())
}

/// A search for the key the query names finds one succeeded PaymentIntent under it.
async fn lookup_answer(State(told): State<Told>, RawQuery(query): RawQuery) -> (StatusCode, String) {
    let (amount, currency) = told.answers.lock().expect("test mutex").lookup;
    let clause = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(name, _)| name == "query")
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default();
    let key = clause
        .strip_prefix("metadata['keel_intent_key']:'")
        .and_then(|rest| rest.strip_suffix('\''))
        .unwrap_or_default();
    let page = json!({"object": "search_result", "has_more": false, "data": [succeeded("pi_reported", amount, currency, key)]});
    (StatusCode::OK, page.to_string())
}

impl Liar {
    fn start() -> Self {
        let unavailable = json!({"error": {"type": "api_error", "code": "unavailable", "message": "try later"}});
        let answers = Arc::new(Mutex::new(Answers { charge: (503, unavailable), lookup: (4_900, "EUR") }));
        let told = Told { answers: answers.clone(), charges: Arc::default() };
        let app = Router::new()
            .route("/v1/payment_intents", post(charge_answer))
            .route("/v1/payment_intents/search", get(lookup_answer))
            .with_state(told.clone());
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("binds a loopback port");
        let addr = listener.local_addr().expect("an address");
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { url: format!("http://{addr}"), answers, charges: told.charges, _runtime: runtime }
    }

    fn answer(&self, charge: (u16, Value), lookup: (i64, &'static str)) {
        *self.answers.lock().expect("test mutex") = Answers { charge, lookup };
    }

    fn charges(&self) -> u32 {
        *self.charges.lock().expect("test mutex")
    }
}

/// The lookups of an intent's history: (status, decision).
fn lookups(shown: &Value) -> Vec<(String, Value)> {
    events_of(shown, "ReconciliationResolved")
        .iter()
        .map(|e| (e["payload"]["status"].as_str().unwrap_or_default().to_owned(), e["payload"]["after"].clone()))
        .collect()
}

/// Kills: the evidence-vs-intent comparison removed (amount; or amount and currency; or
/// currency). A charge of 49.00 EUR whose answer was lost is looked up; the provider reports
/// a succeeded charge under its key for 49.01 EUR, or for 49.00 USD: that is not this intent's
/// effect, so it is recorded `inconsistent` and, with no reconciliation left, escalated — never
/// validated. The same lookup reporting 49.00 EUR validates (the control).
#[test]
fn a_lookup_that_reports_another_amount_or_currency_never_validates_the_intent() {
    let liar = Liar::start();
    let desk = Desk::new(tempfile::tempdir().expect("a temp dir"), liar.url.clone(), "dedup+lookup");
    let cases: [(&str, (i64, &str), &str); 3] = [
        ("7101", (4_901, "EUR"), "escalated"),
        ("7102", (4_900, "USD"), "escalated"),
        ("7103", (4_900, "EUR"), "validated"),
    ];
    let unavailable = json!({"error": {"type": "api_error", "code": "unavailable", "message": "try later"}});
    for (n, lookup, expected) in cases {
        liar.answer((503, unavailable.clone()), lookup);
        let charge = with(charge_args(n), &["--max-reconciliations", "1"]);
        let (_, lost) = desk.keel(&charge);
        assert_eq!(lost["status"], "outcome_unknown", "{n}: {lost}");
        let key = charge_key(n);
        let (_, looked) = desk.keel(&["reconcile", &key]);
        assert_eq!(looked[0]["status"], expected, "{n}: the lookup reported {lookup:?}: {looked}");
        let shown = desk.show(&key);
        let seen = lookups(&shown);
        assert_eq!(seen.len(), 1, "{n}: one lookup: {seen:?}");
        if expected == "validated" {
            assert_eq!(shown["source"], "reconciled");
            assert_eq!(seen[0].0, "found");
        } else {
            assert_eq!(seen[0].0, "inconsistent", "{n}: {seen:?}");
            assert!(shown["intent"]["evidence"].is_null(), "{n}: no evidence is the intent's: {shown}");
            let note = shown["intent"]["note"].as_str().unwrap_or_default();
            assert!(note.contains(&format!("provider reports {} {}", lookup.0, lookup.1)), "{n}: {note:?}");
        }
    }
    assert_eq!(liar.charges(), 3, "one request per charge: a lookup never resends");
    desk.verify();
}

/// Kills, through the lookup that follows: the evidence-vs-intent comparison removed. A
/// charge of 49.00 EUR answered "succeeded" for 49.01 EUR or for 49.00 USD is not validated —
/// the answer is a protocol error, the outcome unknown — and when the lookup repeats the same
/// story the intent escalates. (The adapter refuses such a direct answer too, so removing the
/// ledger's comparison alone is caught on this path by the ledger's own tests, which feed it
/// the answer without an adapter.) The same answer for 49.00 EUR validates (the control).
#[test]
fn a_direct_answer_that_reports_another_amount_or_currency_never_validates_the_intent() {
    let liar = Liar::start();
    let desk = Desk::new(tempfile::tempdir().expect("a temp dir"), liar.url.clone(), "dedup+lookup");
    let cases: [(&str, (i64, &str), &str); 3] = [
        ("7201", (4_901, "EUR"), "outcome_unknown"),
        ("7202", (4_900, "USD"), "outcome_unknown"),
        ("7203", (4_900, "EUR"), "validated"),
    ];
    for (n, (amount, currency), expected) in cases {
        liar.answer((200, succeeded("pi_reported", amount, currency, &charge_key(n))), (amount, currency));
        let charge = with(charge_args(n), &["--max-reconciliations", "1"]);
        let (_, answered) = desk.keel(&charge);
        assert_eq!(answered["status"], expected, "{n}: answered {amount} {currency}: {answered}");
        let key = charge_key(n);
        let shown = desk.show(&key);
        if expected == "validated" {
            assert_eq!(shown["source"], "provider", "{shown}");
            continue;
        }
        let unknown = events_of(&shown, "OutcomeUnknown");
        assert_eq!(unknown.len(), 1, "{n}: {shown}");
        assert_eq!(unknown[0]["payload"]["reason"], "protocol", "{n}: {unknown:?}");
        let (_, looked) = desk.keel(&["reconcile", &key]);
        assert_eq!(looked[0]["status"], "escalated", "{n}: the lookup tells the same story: {looked}");
        assert!(desk.show(&key)["intent"]["evidence"].is_null(), "{n}: never validated");
    }
    assert_eq!(liar.charges(), 3, "one request per charge, never a resend");
    desk.verify();
}

// ----- the guard's first step: the run's deadline --------------------------------------------------

/// Kills: the guard's "run deadline passed" check (step 1) removed. A run dies right after
/// its first model answer — which proposes `read_ticket` — is committed, before the call is
/// reserved; it is resumed once its deadline has passed. The proposal is now after the
/// deadline: the run stops `deadline_exceeded` and the call is never reserved nor run.
///
/// Through the binary, because the crash makes "proposed after the deadline" deterministic:
/// in an uninterrupted run the answer arrives before the deadline (the model call races it)
/// and the guard runs microseconds later.
#[test]
fn a_tool_call_proposed_after_the_deadline_is_not_admitted() {
    let (_dir, db) = crate::agent::temp();
    let transcript = crate::agent::fixture("agent/ticket-review/complete.json");
    let limits = r#"{"deadline_ms": 2500}"#;
    let run = ["agent", "run", "ticket-review", "--transcript", &transcript, "--limits", limits];
    // Commits of a run, in order: its start, the first model call's reservation, its answer.
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .arg("--json")
        .args(run)
        .env_remove("KEEL_DB")
        .env_remove("KEEL_PROVIDER_URL")
        .env("KEEL_FAILPOINT", "after_commit_before_answer:3")
        .output()
        .expect("keel runs");
    assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{}", String::from_utf8_lossy(&output.stderr));
    let ledger = store::Reader::open(&db).expect("opens").ledger().expect("folds");
    let run = ledger.runs().into_iter().next().expect("the run was started").clone();
    let state = crate::agent::agent_state(&db, run.run_id.as_str());
    assert_eq!(state.turns.len(), 1, "the first answer is recorded");
    assert_eq!(state.turns[0].response.tool_calls().len(), 1, "it proposes one tool call");
    assert_eq!(state.tool_calls, 0, "the call is not reserved yet");

    // The deadline is the subject: wait it out (its length, counted from now, after the start).
    let length = (run.deadline_at - run.started_at).to_std().expect("a deadline after the start");
    std::thread::sleep(length + Duration::from_millis(50));

    let (code, report) = crate::agent::keel(&db, &["agent", "resume", run.run_id.as_str()], &[]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["status"], "deadline_exceeded", "{report}");
    assert_eq!(report["tool_calls"], 0, "the call proposed after the deadline was not admitted: {report}");
    let ledger = store::Reader::open(&db).expect("opens").ledger().expect("folds");
    assert!(ledger.run(&run.run_id).is_some(), "the run");
    let after = crate::agent::agent_state(&db, run.run_id.as_str());
    assert_eq!(after.tool_calls, 0);
    assert_eq!(after.results().count(), 0, "the body never ran");
    let (code, report) = crate::agent::keel(&db, &["verify"], &[]);
    assert_eq!(code, 0, "{report}");
}
