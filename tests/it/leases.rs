//! Run leases between real processes: `keel resume` never takes an attempt whose owner is
//! alive, a worker that was presumed dead is fenced, and the definitive answer it brings back
//! is recorded anyway (issue 7, item 6).

use crate::cli::{charge_args, start_sim};
use engine::event::{Event, IntentKey, LateVerdict};
use engine::ledger::IntentStatus;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// The simulator holds the first charge's answer for `ms` (the effect is made first).
fn slow_charge(ms: u64) -> String {
    format!(r#"{{"seed": 1, "rules": [{{"operation": "charge", "fault": "slow", "times": 1, "ms": {ms}}}]}}"#)
}

fn keel(db: &Path, url: &str, extra: &[&str], args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--db")
        .arg(db)
        .args(["--json", "--provider", url, "--provider-timeout-ms", "10000"])
        .args(["--provider-consistency-window-ms", "5000"])
        .args(extra)
        .args(args)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_FAILPOINT")
        .env_remove("KEEL_LEASE_TTL_MS");
    command
}

fn spawn_charge(db: &Path, url: &str, extra: &[&str], id: &str) -> Child {
    keel(db, url, extra, &charge_args(id, "4900"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel charge starts")
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "one JSON document on stdout, got {:?} (stderr {:?})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn status_of(db: &Path, key: &IntentKey) -> Option<IntentStatus> {
    let reader = store::Reader::open(db).ok()?;
    reader.ledger().ok()?.intent(key).map(|i| i.status)
}

/// Waits (at most 20 s) until `condition` holds.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("kill runs");
    assert!(status.success(), "kill -{name} {}", child.id());
}

fn effects_on(dir: &Path, key: &IntentKey) -> usize {
    let effects = provider_sim::list_effects(&dir.join("sim.db")).expect("the simulator's effects");
    effects.iter().filter(|e| e.idempotency_key == key.as_str()).count()
}

fn events_of(db: &Path, key: &IntentKey) -> Vec<Event> {
    let reader = store::Reader::open(db).expect("opens");
    reader.stream(&key.stream()).expect("reads").into_iter().map(|e| e.event).collect()
}

#[test]
fn resume_leaves_an_attempt_whose_worker_is_alive_to_that_worker() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    let sim = start_sim(dir.path(), Some(&slow_charge(2_500)));
    let key = IntentKey::parse(&format!("charge:{TENANT}:order_7001_charge")).expect("a key");
    let worker = spawn_charge(&db, sim.url(), &[], "order_7001_charge");
    wait_until("the worker's attempt is written ahead", || status_of(&db, &key) == Some(IntentStatus::Attempting));

    // Two resumes while the worker waits for the provider: neither touches its attempt.
    for _ in 0..2 {
        let resumed = keel(&db, sim.url(), &[], &["resume"]).output().expect("keel resume runs");
        assert_eq!(resumed.status.code(), Some(0), "{}", String::from_utf8_lossy(&resumed.stderr));
        let report = json_of(&resumed);
        assert_eq!(report["recovered"], serde_json::json!([]), "{report}");
        let left: Vec<&str> = report["left_to_their_owner"]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|l| l["subject"].as_str())
            .collect();
        assert!(left.contains(&key.as_str()), "resume says it left the live attempt alone: {report}");
    }

    let output = worker.wait_with_output().expect("the worker ends");
    let answer = json_of(&output);
    assert_eq!(output.status.code(), Some(0), "the worker exits with its true outcome: {answer}");
    assert_eq!(answer["status"], "validated");
    assert_eq!(answer["source"], "provider");
    assert_eq!(effects_on(dir.path(), &key), 1);
    assert!(
        !events_of(&db, &key).iter().any(|e| matches!(e, Event::OutcomeUnknown { .. })),
        "nothing declared the live attempt crashed"
    );
    let report = store::Reader::open(&db).expect("opens").verify().expect("verifies");
    assert!(report.is_ok(), "{report}");
}

#[test]
fn a_worker_presumed_dead_is_fenced_and_its_late_answer_is_kept() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    let sim = start_sim(dir.path(), Some(&slow_charge(3_000)));
    let key = IntentKey::parse(&format!("charge:{TENANT}:order_7002_charge")).expect("a key");
    let short_lease = ["--lease-ttl-ms", "1500"];
    let worker = spawn_charge(&db, sim.url(), &short_lease, "order_7002_charge");
    wait_until("the worker's attempt is written ahead", || status_of(&db, &key) == Some(IntentStatus::Attempting));

    // The worker stops renewing (a long pause, a partition): once its lease expires, a
    // resume takes the run over and reconciles the attempt instead of waiting for it.
    signal(&worker, "STOP");
    let mut taken = Value::Null;
    wait_until("a resume takes the expired run over", || {
        let resumed = keel(&db, sim.url(), &short_lease, &["resume"]).output().expect("keel resume runs");
        taken = json_of(&resumed);
        taken["recovered"].as_array().is_some_and(|r| r.iter().any(|k| k == key.as_str()))
    });
    signal(&worker, "CONT");

    // The worker was alive after all: the provider's answer reaches it, and it is kept.
    let output = worker.wait_with_output().expect("the worker ends");
    let answer = json_of(&output);
    assert_eq!(output.status.code(), Some(0), "the worker exits with the intent's true outcome: {answer}");
    assert_eq!(answer["status"], "validated", "{answer}");
    let events = events_of(&db, &key);
    let late: Vec<&LateVerdict> = events
        .iter()
        .filter_map(|e| match e {
            Event::LateAnswerRecorded { verdict, .. } => Some(verdict),
            _ => None,
        })
        .collect();
    assert_eq!(late.len(), 1, "the late answer is recorded as evidence: {events:#?}");
    assert!(matches!(late[0], LateVerdict::Settled | LateVerdict::Consistent), "{late:?}");
    assert_eq!(status_of(&db, &key), Some(IntentStatus::Validated));
    assert_eq!(effects_on(dir.path(), &key), 1, "one effect: the takeover reconciled, it never resent");

    // The stale worker's finish was refused (fenced): the resume that took the run over
    // replayed and finished it.
    let finished_by = |db: &Path| {
        store::Reader::open(db)
            .expect("opens")
            .events_since(0)
            .expect("reads")
            .into_iter()
            .filter(|e| matches!(e.event, Event::RunFinished { .. }))
            .map(|e| e.cause.actor)
            .collect::<Vec<String>>()
    };
    assert_eq!(
        finished_by(&db),
        ["command:resume"],
        "only the run's new holder finished it; the fenced worker could not"
    );
    let runs = store::Reader::open(&db).expect("opens").runs().expect("runs");
    assert!(runs.iter().all(|r| r.status != "running"), "every run ends: {runs:#?}");
    let report = store::Reader::open(&db).expect("opens").verify().expect("verifies");
    assert!(report.is_ok(), "{report}");
}
