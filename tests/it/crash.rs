//! Every failpoint, hit by the real `keel` binary against a real `keel-provider-sim` process:
//! the process aborts at the point (`KEEL_FAILPOINT`, `std::process::abort()`: no destructor
//! runs), restarts (`keel resume`, and the caller re-submitting the same charge, since the
//! token is never stored; refunds resend by themselves), and every invariant is checked over
//! the log and the simulator's own effects. Cases include second crashes during recovery.

use crate::cli::{charge_args, start_sim};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Command;

/// One step of a crash case: a command, and the failpoint it must die at (if any).
#[derive(Clone, Copy)]
enum Step {
    Charge(Option<&'static str>),
    Refund(Option<&'static str>),
    Resume(Option<&'static str>),
    Reconcile(Option<&'static str>),
    /// Let the crashed attempt's request timeout pass: until then it may still land, so
    /// Keel does not believe a lookup's "absent" (real time passing, not synchronisation).
    WaitOutTimeout,
}

/// The provider request timeout every step runs with (the consistency window is 0).
const REQUEST_TIMEOUT_MS: u64 = 300;

const CHARGE_ID: &str = "order_5150_charge";
const REFUND_ID: &str = "order_5150_refund";
/// The simulator commits the first charge and holds its answer past the client's timeout.
const LOST_ANSWER: &str =
    r#"{"seed": 1, "rules": [{"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 1500}]}"#;

fn key(kind: &str, id: &str) -> String {
    format!("{kind}:{TENANT}:{id}")
}

fn run_step(dir: &Path, url: &str, step: Step) {
    let db = dir.join("keel.db");
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--db")
        .arg(&db)
        .args(["--json", "--provider", url, "--provider-timeout-ms", &REQUEST_TIMEOUT_MS.to_string()])
        .args(["--provider-consistency-window-ms", "0"])
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_FAILPOINT");
    let charge = charge_args(CHARGE_ID, "4900");
    let refund_key = key("charge", CHARGE_ID);
    let failpoint = match step {
        Step::Charge(fp) => {
            command.args(&charge);
            fp
        }
        Step::Refund(fp) => {
            command.args(["refund", "--tenant", TENANT, "--intent-id", REFUND_ID, "--order", "order_1842"]);
            command.args(["--amount-minor", "1000", "--currency", "EUR"]);
            fp
        }
        Step::Resume(fp) => {
            command.arg("resume");
            fp
        }
        Step::Reconcile(fp) => {
            command.args(["reconcile", &refund_key]);
            fp
        }
        Step::WaitOutTimeout => {
            std::thread::sleep(std::time::Duration::from_millis(REQUEST_TIMEOUT_MS + 100));
            return;
        }
    };
    if let Some(point) = failpoint {
        command.env("KEEL_FAILPOINT", point);
    }
    let output = command.output().expect("keel runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    match failpoint {
        Some(point) => assert_eq!(
            output.status.signal(),
            Some(libc::SIGABRT),
            "keel must abort at {point}; it ended with {:?}: {stderr}",
            output.status
        ),
        None => assert!(
            output.status.code().is_some_and(|c| c == 0 || c == 2),
            "keel ended with {:?}: {stderr}",
            output.status
        ),
    }
}

/// Runs the steps, then checks the final status of `(kind, id)` and every invariant.
fn check(plan: Option<&str>, steps: &[Step], kind: &str, id: &str, expected: &str) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), plan);
    for step in steps {
        run_step(dir.path(), sim.url(), *step);
    }
    let db = dir.path().join("keel.db");
    // Invariants first: a broken promise is the finding, a surprising status only its echo.
    let report = testkit::invariants::check_files(&db, &dir.path().join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:#?}");
    let ledger = store::Reader::open(&db).expect("opens").ledger().expect("folds");
    let intent_key = engine::event::IntentKey::parse(&key(kind, id)).expect("a key");
    let intent = ledger.intent(&intent_key).expect("the intent exists");
    assert_eq!(intent.status.as_str(), expected, "{intent:#?}");
    let effects = provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects");
    let on_key = effects.iter().filter(|e| e.idempotency_key == intent_key.as_str()).count();
    assert_eq!(on_key, usize::from(expected == "validated"), "effects on {intent_key}");
}

use Step::{Charge, Reconcile, Refund, Resume, WaitOutTimeout};
use testkit::sample::TENANT;

#[test]
fn after_reservation() {
    check(
        None,
        &[Charge(Some("after_reservation")), Resume(None), WaitOutTimeout, Charge(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn after_attempt_started_then_resubmitted() {
    check(
        None,
        &[Charge(Some("after_attempt_started")), Resume(None), WaitOutTimeout, Charge(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn after_provider_answer_is_reconciled_not_resent() {
    check(None, &[Charge(Some("after_provider_answer")), Resume(None)], "charge", CHARGE_ID, "validated");
}

#[test]
fn in_batch_before_commit_loses_the_whole_batch() {
    // Hit 2: the batch holding AttemptStarted (hit 1 is the reservation's).
    check(
        None,
        &[Charge(Some("in_batch_before_commit:2")), Resume(None), Charge(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn after_commit_before_answer() {
    check(
        None,
        &[Charge(Some("after_commit_before_answer:2")), Resume(None), Charge(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn after_reconciliation_started() {
    check(
        Some(LOST_ANSWER),
        &[Charge(None), Reconcile(Some("after_reconciliation_started")), Resume(None), Reconcile(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn after_lookup() {
    check(
        Some(LOST_ANSWER),
        &[Charge(None), Reconcile(Some("after_lookup")), Resume(None), Reconcile(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn a_second_crash_after_recover() {
    check(
        None,
        &[
            Charge(Some("after_attempt_started")),
            Resume(Some("after_recover")),
            Resume(None),
            WaitOutTimeout,
            Charge(None),
        ],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn a_second_crash_inside_recoverys_lookup() {
    check(
        None,
        // The interrupted lookup is due again after a backoff; the operator forces it.
        &[Charge(Some("after_provider_answer")), Resume(Some("after_lookup")), Resume(None), Reconcile(None)],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn a_second_crash_inside_recoverys_commit() {
    check(
        None,
        &[
            Charge(Some("after_attempt_started")),
            Resume(Some("in_batch_before_commit")),
            Resume(None),
            WaitOutTimeout,
            Charge(None),
        ],
        "charge",
        CHARGE_ID,
        "validated",
    );
}

#[test]
fn a_refund_crashed_mid_attempt_is_resent_by_resume_alone() {
    check(
        None,
        &[Charge(None), Refund(Some("after_attempt_started")), WaitOutTimeout, Resume(None)],
        "refund",
        REFUND_ID,
        "validated",
    );
}

#[test]
fn a_misspelt_failpoint_is_a_usage_error_not_a_silent_pass() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(dir.path().join("keel.db"))
        .arg("verify")
        .env("KEEL_FAILPOINT", "after_atempt_started")
        .output()
        .expect("keel runs");
    assert_eq!(output.status.code(), Some(64));
}

/// The canary: built with `--features engine/canary-skip-write-ahead` the executor calls the
/// provider before `AttemptStarted` is durable, and this test (like the rest of the suite)
/// must FAIL: the crash leaves an effect at the provider with no attempt in the log.
/// `cargo test -p keel --features engine/canary-skip-write-ahead --test it -- canary`
#[test]
fn canary_a_crash_right_after_the_provider_call_leaves_a_written_ahead_attempt() {
    check(None, &[Charge(Some("after_provider_answer")), Resume(None)], "charge", CHARGE_ID, "validated");
}

/// A process killed while it created the log leaves a hot journal (the creation's
/// transaction half written, in rollback-journal mode before the log turns to WAL), made here
/// the way a kill leaves it: the file and its journal copied while the transaction is open.
/// Every command that writes next — `keel resume`, a re-submitted charge — must roll it back
/// and go on, never fail on a read-only open.
#[test]
fn a_log_killed_while_it_was_created_is_rolled_back_and_resumed() {
    let (dir, _) = crate::cli::temp();
    let half = dir.path().join("half.db");
    let creating = rusqlite::Connection::open(&half).expect("opens");
    creating.execute_batch("PRAGMA journal_mode=DELETE; PRAGMA cache_size=1; BEGIN; CREATE TABLE t(x);").expect("runs");
    for _ in 0..2_000 {
        creating.execute("INSERT INTO t VALUES (?1)", [&"x".repeat(500)]).expect("inserts");
    }
    let db = dir.path().join("keel.db");
    std::fs::copy(&half, &db).expect("copies the file");
    std::fs::copy(dir.path().join("half.db-journal"), dir.path().join("keel.db-journal")).expect("and its journal");
    drop(creating);
    let sim = start_sim(dir.path(), None);
    let keel = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.arg("--db").arg(&db).args(["--provider", sim.url(), "--provider-consistency-window-ms", "0"]);
        command.args(args).env_remove("KEEL_FAILPOINT").env_remove("KEEL_VAULT_KEY").env_remove("KEEL_STORE");
        command.output().expect("keel runs")
    };
    let resumed = keel(&["resume"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", String::from_utf8_lossy(&resumed.stderr));
    let charged = keel(&charge_args(CHARGE_ID, "4900"));
    assert_eq!(charged.status.code(), Some(0), "{}", String::from_utf8_lossy(&charged.stderr));
    let verified = store::Reader::open(&db).expect("opens").verify().expect("verifies");
    assert!(verified.is_ok() && verified.events > 0, "{verified}");
}
