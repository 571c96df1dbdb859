//! Stripe's own faults, played by the simulator on Stripe's wire format, through the real
//! `keel` binary: a key in flight answered 409, an idempotent replay after a lost answer, and
//! a search that lags.
//!
//! Each test starts a `keel-provider-sim` with a plan, runs `keel` against it with a tier, a
//! consistency window and a request timeout, and checks what Keel recorded (`keel show`)
//! against what the simulator counts (`provider_sim::list_effects`). Waiting out a hold or a
//! window is the behaviour under test here, never a stand-in for a signal.

use crate::cli::{keel, start_sim};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::sample::{CARD_TOKEN, TENANT};

/// Keel's request timeout in these tests: far below every hold the plans play.
const REQUEST_TIMEOUT_MS: u64 = 300;

/// One log and one simulator, with the provider flags every call of a test carries.
struct Bench {
    dir: tempfile::TempDir,
    db: PathBuf,
    url: String,
    flags: Vec<String>,
    _sim: provider_sim::Process,
}

impl Bench {
    fn start(plan: &str, tier: &str, window_ms: u64) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let sim = start_sim(dir.path(), Some(plan));
        let flags = [
            "--provider-tier",
            tier,
            "--provider-consistency-window-ms",
            &window_ms.to_string(),
            "--provider-timeout-ms",
            &REQUEST_TIMEOUT_MS.to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Self { db: dir.path().join("keel.db"), url: sim.url().to_owned(), flags, dir, _sim: sim }
    }

    /// `keel --provider URL FLAGS ARGS`: exit code and JSON.
    fn keel(&self, args: &[&str]) -> (i32, Value) {
        let all: Vec<&str> = self.flags.iter().map(String::as_str).chain(args.iter().copied()).collect();
        let (code, json, stderr) = keel(&self.db, Some(&self.url), &all);
        assert!(!json.is_null(), "keel {args:?} prints JSON (stderr {stderr})");
        (code, json)
    }

    /// The same charge of 49.00 EUR, submitted (or re-submitted) by its caller.
    fn charge(&self) -> (i32, Value) {
        self.keel(&[
            "charge",
            "--tenant",
            TENANT,
            "--intent-id",
            "order_2301_charge",
            "--order",
            "order_2301",
            "--amount-minor",
            "4900",
            "--currency",
            "EUR",
            "--payment-method-token",
            CARD_TOKEN,
        ])
    }

    fn show(&self) -> Value {
        let (code, shown) = self.keel(&["show", &key()]);
        assert_eq!(code, 0, "{shown}");
        shown
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        let shown = self.show();
        shown["events"].as_array().expect("a history").iter().filter(|e| e["type"] == kind).cloned().collect()
    }

    /// Waits until the last unknown outcome is due for reconciliation (a resend in tier
    /// `dedup`): the backoff the log recorded, counted from now, which is after it began.
    fn until_due(&self) {
        let shown = self.show();
        let unknown = self.events("OutcomeUnknown").pop().expect("an unknown outcome");
        let instant = |value: &Value| value.as_str().expect("an instant").parse::<DateTime<Utc>>().expect("RFC 3339");
        let backoff = instant(&shown["intent"]["reconcile_after"]) - instant(&unknown["at"]);
        std::thread::sleep(backoff.to_std().expect("a backoff is positive") + Duration::from_millis(50));
    }

    fn effects(&self) -> Vec<provider_sim::EffectRecord> {
        provider_sim::list_effects(&sim_db(self.dir.path())).expect("the simulator's effects")
    }

    fn verify(&self) {
        let (code, report) = self.keel(&["verify"]);
        assert_eq!(code, 0, "{report}");
        let report = testkit::invariants::check_files(&self.db, &sim_db(self.dir.path())).expect("readable");
        assert!(report.is_ok(), "{report:#?}");
    }
}

fn sim_db(dir: &Path) -> PathBuf {
    dir.join("sim.db")
}

fn key() -> String {
    format!("charge:{TENANT}:order_2301_charge")
}

/// Sleeps until `ms` have passed since `since`.
fn until(since: Instant, ms: u64) {
    std::thread::sleep(Duration::from_millis(ms).saturating_sub(since.elapsed()));
}

/// The first answer is held 5 s (its effect committed, its key in flight) and the first search
/// lies: Keel, told the charge is absent once its request is over, resends under the key while
/// the first request still holds it. Stripe answers that 409 (`idempotency_error`, retry
/// later): the outcome stays unknown — never a decline, never a release — and the next
/// lookup finds the one PaymentIntent: validated, one effect.
#[test]
fn a_key_in_flight_is_answered_409_the_outcome_stays_unknown_then_reconciles_to_one_effect() {
    let plan = r#"{"seed": 1, "rules": [
        {"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 5000},
        {"operation": "lookup", "fault": "lookup_lies", "times": 1}]}"#;
    let bench = Bench::start(plan, "dedup+lookup", 0);
    let (code, first) = bench.charge();
    assert_eq!((code, first["status"].as_str()), (2, Some("outcome_unknown")), "{first}");
    assert_eq!(bench.effects().len(), 1, "the effect landed, its answer is held");

    std::thread::sleep(Duration::from_millis(REQUEST_TIMEOUT_MS + 50));
    let (_, lied) = bench.keel(&["reconcile", &key()]);
    assert_eq!(lied[0]["status"], "reserved", "the lie is believed (window 0): a resend may go: {lied}");

    let (code, conflict) = bench.charge();
    assert_eq!((code, conflict["status"].as_str()), (2, Some("outcome_unknown")), "{conflict}");
    let unknown = bench.events("OutcomeUnknown");
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    let resend = &unknown[1]["payload"];
    assert_eq!(resend["reason"], "provider_unavailable", "{resend}");
    let detail = resend["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("409") && detail.contains("Stripe-Should-Retry: true"), "{detail}");
    assert_eq!(bench.effects().len(), 1, "the key in flight made nothing more");

    let (code, found) = bench.keel(&["reconcile", &key()]);
    assert_eq!((code, found[0]["status"].as_str()), (0, Some("validated")), "{found}");
    let effects = bench.effects();
    assert_eq!(effects.len(), 1);
    assert_eq!(bench.show()["intent"]["evidence"]["provider_ref"], effects[0].id.as_str());
    bench.verify();
}

/// A provider that deduplicates but cannot be searched (tier `dedup`): the first answer is
/// lost (held past Keel's timeout), so Keel resends under the same key once the hold is over.
/// Stripe answers the stored PaymentIntent with `Idempotent-Replayed: true`: Keel validates
/// the one effect, the simulator counts one effect and one replay.
#[test]
fn a_resend_after_a_lost_answer_is_replayed_and_both_sides_count_one_effect() {
    let hold_ms = 1_000;
    let plan = format!(
        r#"{{"seed": 1, "rules": [{{"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": {hold_ms}}}]}}"#
    );
    let bench = Bench::start(&plan, "dedup", 0);
    let sent = Instant::now();
    let (code, lost) = bench.charge();
    assert_eq!((code, lost["status"].as_str()), (2, Some("outcome_unknown")), "{lost}");
    assert_eq!(bench.effects().len(), 1);

    // Once the hold is over (the key's answer stored) and the resend is due.
    until(sent, hold_ms + 100);
    bench.until_due();
    let (code, replayed) = bench.charge();
    assert_eq!((code, replayed["status"].as_str()), (0, Some("validated")), "{replayed}");
    assert_eq!(bench.events("AttemptStarted").len(), 2, "the resend was sent");
    let effects = bench.effects();
    assert_eq!(effects.len(), 1, "one PaymentIntent: {effects:#?}");
    assert_eq!(effects[0].replays, 1, "the resend was answered from the key's stored answer");
    assert_eq!(replayed["provider_ref"], effects[0].id.as_str(), "{replayed}");
    let validated = bench.events("IntentValidated");
    assert_eq!(validated.len(), 1, "Keel records one effect: {validated:?}");
    bench.verify();
}

/// Stripe's search lags (here 1.2 s behind each PaymentIntent) and Keel declares a 1.5 s
/// consistency window. The first answer is lost; a search inside the window does not see the
/// PaymentIntent — and that "absent" is not believed: the intent stays unknown, and the caller's
/// re-submission sends nothing. Once the window has passed the search finds it: validated,
/// one request, one effect.
#[test]
fn an_absence_seen_inside_the_search_lag_is_never_believed_and_nothing_is_resent() {
    let window_ms = 1_500;
    let plan = r#"{"seed": 1, "rules": [
        {"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 400},
        {"operation": "lookup", "fault": "lookup_absent_for_ms", "ms": 1200}]}"#;
    let bench = Bench::start(plan, "dedup+lookup", window_ms);
    let sent = Instant::now();
    let (code, lost) = bench.charge();
    assert_eq!((code, lost["status"].as_str()), (2, Some("outcome_unknown")), "{lost}");

    until(sent, REQUEST_TIMEOUT_MS + 50);
    let (_, early) = bench.keel(&["reconcile", &key()]);
    assert_ne!(early[0]["status"], "reserved", "an absence inside the window is no proof: {early}");
    let looked = bench.events("ReconciliationResolved");
    assert_eq!(looked.len(), 1, "{looked:?}");
    assert_eq!(looked[0]["payload"]["status"], "absent", "the search did not see it: {looked:?}");
    let (code, again) = bench.charge();
    assert_eq!((code, again["status"].as_str()), (2, Some("outcome_unknown")), "{again}");
    assert!(sent.elapsed() < Duration::from_millis(1_200), "all of this inside the lag: {:?}", sent.elapsed());
    assert_eq!(bench.events("AttemptStarted").len(), 1, "nothing was resent");

    until(sent, REQUEST_TIMEOUT_MS + window_ms + 100);
    let (code, found) = bench.keel(&["reconcile", &key()]);
    assert_eq!((code, found[0]["status"].as_str()), (0, Some("validated")), "{found}");
    assert_eq!(bench.events("AttemptStarted").len(), 1, "one request, ever");
    assert_eq!(bench.effects().len(), 1);
    bench.verify();
}
