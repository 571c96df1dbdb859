//! A human approval is the step the support agent exists for: an approval given long after
//! the run started, an approval that lapsed, a window nobody answered in time, and polling a
//! suspended run — each ends in a truthful status with nothing left held (issue 15, items 1,
//! 2 and 5). Through the real binary and a real simulator process.

use crate::cli::start_sim;
use provider_sim::Process;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::sample::CARD_TOKEN;

/// The provider request timeout every desk command runs with.
pub(crate) const PROVIDER_TIMEOUT_MS: u64 = 2_000;

pub(crate) struct Desk {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) db: PathBuf,
    pub(crate) sim: Process,
}

impl Desk {
    /// A log where order C-1042 was charged 89.90 EUR, and a simulator to refund it.
    pub(crate) fn new() -> Self {
        Self::with_faults(None)
    }

    /// The same, the simulator following a fault plan.
    pub(crate) fn with_faults(plan: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let db = dir.path().join("keel.db");
        let sim = start_sim(dir.path(), plan);
        let desk = Self { dir, db, sim };
        let (code, charged) = desk.keel(&[
            "charge",
            "--tenant",
            workflows::support_agent::TENANT,
            "--intent-id",
            "charge-C-1042-000001",
            "--order",
            "C-1042",
            "--amount-minor",
            "8990",
            "--currency",
            "EUR",
            "--payment-method-token",
            CARD_TOKEN,
        ]);
        assert_eq!(code, 0, "the order is charged first: {charged}");
        desk
    }

    /// `keel --db DB --json --provider SIM ARGS`, not yet run.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .arg("--db")
            .arg(&self.db)
            .args(["--json", "--provider", self.sim.url(), "--provider-consistency-window-ms", "0"])
            // Above the slowest held answer these tests use (1.5 s); an absence is believed
            // only once a request's timeout has passed since it was sent.
            .args(["--provider-timeout-ms", &PROVIDER_TIMEOUT_MS.to_string()])
            .args(args)
            .env_remove("KEEL_DB")
            .env_remove("KEEL_PROVIDER_URL");
        command
    }

    pub(crate) fn keel(&self, args: &[&str]) -> (i32, Value) {
        let output = self.command(args).output().expect("keel runs");
        let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (output.status.code().unwrap_or(-1), json)
    }

    /// Starts the `refund` scenario with `limits`: it suspends on the refund's approval.
    pub(crate) fn suspended_refund(&self, limits: &str) -> (String, String) {
        let (code, report) = self.keel(&["agent", "run", "support", "--scenario", "refund", "--limits", limits]);
        assert_eq!(code, 2, "{report}");
        assert_eq!(report["status"], "awaiting_approval", "{report}");
        let key = report["awaiting_approval"].as_str().expect("the intent to approve").to_owned();
        (report["run_id"].as_str().expect("a run id").to_owned(), key)
    }

    pub(crate) fn refunds_at_provider(&self) -> usize {
        provider_sim::list_effects(&self.dir.path().join("sim.db"))
            .expect("the simulator's effects")
            .into_iter()
            .filter(|e| e.id.starts_with("re_"))
            .count()
    }

    pub(crate) fn intent_status(&self, key: &str) -> String {
        let (code, shown) = self.keel(&["show", key]);
        assert_eq!(code, 0, "{shown}");
        shown["status"].as_str().expect("a status").to_owned()
    }

    pub(crate) fn event_count(&self) -> usize {
        store::Reader::open(&self.db).expect("opens").events_since(0).expect("reads").len()
    }

    pub(crate) fn verify(&self) {
        let (code, report) = self.keel(&["verify"]);
        assert_eq!(code, 0, "{report}");
    }
}

/// Lets real time pass: what these tests are about (a deadline, a window, a lapse).
fn wait_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn run_events(db: &Path, run_id: &str) -> Vec<engine::event::Event> {
    let reader = store::Reader::open(db).expect("opens");
    let run = engine::event::RunId::new(run_id);
    reader.stream(&run.stream()).expect("reads").into_iter().map(|e| e.event).collect()
}

#[test]
fn an_approval_given_after_the_run_deadline_still_completes_the_refund_once() {
    let desk = Desk::new();
    // 3.5 s of working time (a refund needs 2 s of it left to be reconciled); the human
    // takes longer than the whole of it to approve.
    let (run_id, key) = desk.suspended_refund(r#"{"deadline_ms": 3500}"#);
    wait_ms(4_000);
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 0, "the wait for a human is not working time: {report}");
    assert_eq!(report["status"], "completed");
    assert_eq!(desk.intent_status(&key), "validated");
    assert_eq!(desk.refunds_at_provider(), 1);
    let extended = run_events(&desk.db, &run_id)
        .into_iter()
        .any(|e| matches!(e, engine::event::Event::RunDeadlineExtended { .. }));
    assert!(extended, "the deadline moved by the time waited, as a recorded fact");
    desk.verify();
}

#[test]
fn a_lapsed_approval_suspends_the_run_again_and_a_fresh_one_completes_it() {
    let desk = Desk::new();
    let (run_id, key) = desk.suspended_refund("{}");
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana", "--ttl-ms", "300"]);
    assert_eq!(code, 0, "{approved}");
    wait_ms(600);
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["status"], "awaiting_approval", "a lapsed approval asks for a fresh one: {report}");
    assert_eq!(report["awaiting_approval"], key.as_str());
    assert_eq!(desk.intent_status(&key), "awaiting_approval", "approvable again, not stranded");
    assert_eq!(desk.refunds_at_provider(), 0, "nothing was sent on a lapsed approval");
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["status"], "completed");
    assert_eq!(desk.refunds_at_provider(), 1);
    desk.verify();
}

#[test]
fn a_window_nobody_answered_ends_the_run_and_releases_the_refund() {
    let desk = Desk::new();
    let (run_id, key) = desk.suspended_refund(r#"{"approval_wait_ms": 500}"#);
    wait_ms(800);
    let before = desk.event_count();
    let (code, refused) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 2, "an approval after the window closed is refused: {refused}");
    assert!(refused["error"].as_str().is_some_and(|e| e.contains("window")), "{refused}");
    assert_eq!(desk.event_count(), before, "a refused approval writes nothing");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["status"], "deadline_exceeded", "{report}");
    assert_eq!(desk.intent_status(&key), "rejected", "the refund is released, its money freed");
    assert_eq!(desk.refunds_at_provider(), 0);
    // The order is not blocked: a new refund of it is judged on its own.
    let (code, again) = desk.keel(&["agent", "run", "support", "--scenario", "refund"]);
    assert_eq!(code, 2, "{again}");
    assert_eq!(again["status"], "awaiting_approval", "not reference_pending, not invariant_violated: {again}");
    desk.verify();
}

#[test]
fn polling_a_suspended_run_writes_nothing() {
    let desk = Desk::new();
    let (run_id, _key) = desk.suspended_refund("{}");
    let after_first = desk.event_count();
    for _ in 0..5 {
        let (code, report) = desk.keel(&["agent", "resume", &run_id]);
        assert_eq!(code, 2, "{report}");
        assert_eq!(report["status"], "awaiting_approval");
    }
    assert_eq!(desk.event_count(), after_first, "polling a suspended run never grows the log");
}
