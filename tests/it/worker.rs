//! `keel worker` between real processes against a real simulator: a crashed charge finished
//! by one pass, two workers sharing crashed runs (one holder at a time, one effect per key),
//! a worker SIGKILLed mid-attempt taken over and reconciled by lookup, a SIGTERM that gives
//! every lease back, and bad flags that write nothing.

use crate::cli::{charge_args, start_sim, temp};
use engine::event::{Event, IntentKey};
use engine::ledger::IntentStatus;
use engine::provider::UnknownReason;
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// The provider request timeout of the takeover cases: a crashed attempt is proven absent
/// (and resent) only once it has passed, and the slow answer comes within it.
const TIMEOUT_MS: &str = "3000";
/// The refund's second attempt (its first request: the first one crashed unsent) is held
/// this long, the effect made first.
const SLOW_REFUND: &str = r#"{"seed": 1, "rules": [{"operation": "refund", "fault": "slow", "times": 1, "ms": 2500}]}"#;
const REFUND_ID: &str = "order_1842_refund";

fn keel(db: &Path, url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--db")
        .arg(db)
        .args(["--json", "--provider", url, "--provider-timeout-ms", TIMEOUT_MS])
        .args(["--provider-consistency-window-ms", "0"])
        .args(args)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_FAILPOINT")
        .env_remove("KEEL_LEASE_TTL_MS")
        .env_remove("KEEL_VAULT_KEY");
    command
}

/// Runs `args` with `failpoint` armed: the process must abort there.
fn crash(db: &Path, url: &str, args: &[&str], failpoint: &str) {
    let output = keel(db, url, args).env("KEEL_FAILPOINT", failpoint).output().expect("keel runs");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "keel must abort at {failpoint}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `keel worker --once`: its exit code and summary.
fn worker_once(db: &Path, url: &str, extra: &[&str]) -> (i32, Value) {
    let output = keel(db, url, &[&["worker", "--once", "--poll-ms", "50"][..], extra].concat()).output().expect("runs");
    let summary = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "one JSON summary, got {:?} (stderr {:?})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), summary)
}

fn spawn_worker(db: &Path, url: &str, extra: &[&str]) -> Child {
    keel(db, url, &[&["worker", "--poll-ms", "50", "--health-ms", "200"][..], extra].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel worker starts")
}

fn key(kind: &str, id: &str) -> IntentKey {
    IntentKey::parse(&format!("{kind}:{TENANT}:{id}")).expect("a key")
}

fn intent_status(db: &Path, key: &IntentKey) -> Option<(IntentStatus, u32)> {
    let intent = store::Reader::open(db).ok()?.intent_state(key).ok()??;
    Some((intent.status, intent.attempts))
}

fn events_of(db: &Path, key: &IntentKey) -> Vec<Event> {
    let reader = store::Reader::open(db).expect("opens");
    reader.stream(&key.stream()).expect("reads").into_iter().map(|e| e.event).collect()
}

fn effects_on(dir: &Path, key: &IntentKey) -> usize {
    let effects = provider_sim::list_effects(&dir.join("sim.db")).expect("the simulator's effects");
    effects.iter().filter(|e| e.idempotency_key == key.as_str()).count()
}

/// Every invariant over the log and the simulator's effects, and `verify`.
fn check_invariants(dir: &Path) {
    let report = testkit::invariants::check_files(&dir.join("keel.db"), &dir.join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:#?}");
    let verified = store::Reader::open(&dir.join("keel.db")).expect("opens").verify().expect("verifies");
    assert!(verified.is_ok(), "{verified}");
}

/// Every run's lease as the store keeps it: its fencing token, and whether it is held.
fn leases(db: &Path) -> Vec<(String, u64, bool)> {
    let connection = rusqlite::Connection::open(db).expect("opens");
    let mut query = connection
        .prepare("SELECT s.name, l.token, l.expires_at IS NOT NULL FROM leases l JOIN streams s ON s.id = l.run")
        .expect("prepares");
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn run_finishes(db: &Path) -> Vec<String> {
    let events = store::Reader::open(db).expect("opens").events_since(0).expect("reads");
    events
        .into_iter()
        .filter_map(|e| match e.event {
            Event::RunFinished { run_id, .. } => Some(run_id.to_string()),
            _ => None,
        })
        .collect()
}

/// Waits (at most 30 s) until `condition` holds.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn refund_args() -> Vec<&'static str> {
    let mut args = vec!["refund", "--tenant", TENANT, "--intent-id", REFUND_ID, "--order", "order_1842"];
    args.extend(["--amount-minor", "1000", "--currency", "EUR"]);
    args
}

/// A validated charge, then a refund that crashed right after its reservation (its first
/// attempt written ahead, never sent): a worker recovers it, proves it absent once the
/// request timeout has passed, and sends attempt 2 — which the simulator holds.
fn a_refund_left_crashed(dir: &Path, url: &str) -> IntentKey {
    let db = dir.join("keel.db");
    let charged = keel(&db, url, &charge_args("order_1842_charge", "4900")).output().expect("charge runs");
    assert_eq!(charged.status.code(), Some(0), "{}", String::from_utf8_lossy(&charged.stderr));
    crash(&db, url, &refund_args(), "after_reservation");
    key("refund", REFUND_ID)
}

#[test]
fn a_charge_killed_mid_attempt_is_finished_by_one_pass_with_one_effect() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    crash(&db, sim.url(), &charge_args("order_1842_charge", "4900"), "after_provider_answer");
    let charge = key("charge", "order_1842_charge");
    assert_eq!(intent_status(&db, &charge).map(|s| s.0), Some(IntentStatus::Attempting));

    let (code, summary) = worker_once(&db, sim.url(), &[]);
    assert_eq!(code, 0, "{summary:#}");
    assert_eq!(summary["state"], "stopped", "{summary:#}");
    assert_eq!(summary["recovered"], 1, "the dead attempt is recorded interrupted once: {summary:#}");
    assert_eq!(summary["unknown"], 0, "{summary:#}");
    assert_eq!(summary["leases_held"], 0, "every lease is given back: {summary:#}");

    assert_eq!(intent_status(&db, &charge).map(|s| s.0), Some(IntentStatus::Validated), "the intent is final");
    assert_eq!(effects_on(dir.path(), &charge), 1, "one effect: reconciled by lookup, never resent");
    let events = events_of(&db, &charge);
    assert!(
        events.iter().any(|e| matches!(e, Event::OutcomeUnknown { reason: UnknownReason::Crash, .. })),
        "{events:#?}"
    );
    assert_eq!(events.iter().filter(|e| matches!(e, Event::AttemptStarted { .. })).count(), 1, "{events:#?}");
    assert_eq!(run_finishes(&db).len(), 1, "its run is finished");
    check_invariants(dir.path());

    // Nothing is left: a second pass takes nothing on.
    let (code, again) = worker_once(&db, sim.url(), &[]);
    assert_eq!(code, 0, "{again:#}");
    assert_eq!(again["claimed"], 0, "{again:#}");
}

#[test]
fn an_agent_run_killed_mid_run_is_resumed_from_its_journal_by_one_pass() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let transcript = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/agent/ticket-review/complete.json");
    let killed = keel(&db, sim.url(), &["agent", "run", "ticket-review", "--transcript", transcript])
        .env("KEEL_TEST_ABORT_AT_MODEL_CALL", "2")
        .output()
        .expect("keel agent run runs");
    assert_ne!(killed.status.code(), Some(0), "the agent process died");
    let runs = || store::Reader::open(&db).expect("opens").runs().expect("runs");
    assert_eq!(runs().iter().map(|r| r.status.as_str()).collect::<Vec<_>>(), ["running"]);

    let (code, summary) = worker_once(&db, sim.url(), &[]);
    assert_eq!(code, 0, "{summary:#}");
    let units = summary["units"].as_array().expect("units");
    assert!(units.iter().any(|u| u["kind"] == "agent_run" && u["result"] == "done"), "{summary:#}");
    assert_eq!(runs().iter().map(|r| r.status.as_str()).collect::<Vec<_>>(), ["completed"], "{summary:#}");
    assert!(leases(&db).iter().all(|(_, _, live)| !live), "no lease is left held: {:?}", leases(&db));
    check_invariants(dir.path());

    // The same history, hand-made into a refill: its header allows one model call fewer than
    // the run made across the kill — what a resume that counted from zero would have written.
    let mut events = store::Reader::open(&db).expect("opens").events_since(0).expect("reads");
    let effects: Vec<testkit::Effect> =
        provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects").iter().map(Into::into).collect();
    let calls = events
        .iter()
        .filter(|e| matches!(&e.event, Event::AgentRecorded { event, .. } if event["type"] == "ModelCallReserved"))
        .count();
    for stored in &mut events {
        if let Event::AgentRecorded { event, .. } = &mut stored.event
            && event["type"] == "AgentRunStarted"
        {
            event["limits"]["model_calls_max"] = serde_json::json!(calls - 1);
        }
    }
    let report = testkit::invariants::check(&events, &effects);
    assert!(report.budget_refills > 0, "{report:#?}");
    assert!(report.details.iter().any(|d| d.contains("model calls of")), "{report:#?}");
}

#[test]
fn two_workers_finish_every_crashed_run_once_one_holder_at_a_time() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let ids: Vec<String> = (0..12).map(|n| format!("order_{}_charge", 2000 + n)).collect();
    for (n, id) in ids.iter().enumerate() {
        let order = format!("order_{}", 2000 + n);
        let mut args = charge_args(id, "4900");
        args[6] = &order;
        crash(&db, sim.url(), &args, "after_provider_answer");
    }
    let spawn = || {
        keel(&db, sim.url(), &["worker", "--once", "--concurrency", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("a worker starts")
    };
    let (first, second) = (spawn(), spawn());
    let mut units = Vec::new();
    for worker in [first, second] {
        let output = worker.wait_with_output().expect("the worker ends");
        let summary: Value = serde_json::from_slice(&output.stdout).expect("a JSON summary");
        assert_eq!(output.status.code(), Some(0), "{summary:#}\n{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(summary["leases_held"], 0, "{summary:#}");
        units.extend(summary["units"].as_array().expect("units").iter().cloned());
    }

    for id in &ids {
        let charge = key("charge", id);
        assert_eq!(intent_status(&db, &charge).map(|s| s.0), Some(IntentStatus::Validated), "{charge}");
        assert_eq!(effects_on(dir.path(), &charge), 1, "one effect on {charge}");
    }
    let finishes = run_finishes(&db);
    let distinct: BTreeSet<&String> = finishes.iter().collect();
    assert_eq!((finishes.len(), distinct.len()), (ids.len(), ids.len()), "every run finished once: {finishes:?}");
    // A fencing token is granted once: no two units, of either worker, held one run with
    // the same token — one holder at a time.
    let held: Vec<(String, u64)> =
        units.iter().filter_map(|unit| Some((unit["run_id"].as_str()?.to_owned(), unit["token"].as_u64()?))).collect();
    let distinct: BTreeSet<&(String, u64)> = held.iter().collect();
    assert_eq!(distinct.len(), held.len(), "a run was held twice under one token: {units:#?}");
    assert!(leases(&db).iter().all(|(_, _, live)| !live), "no lease is left held: {:?}", leases(&db));
    check_invariants(dir.path());
}

#[test]
fn a_worker_killed_mid_attempt_is_taken_over_and_its_attempt_reconciled_by_lookup() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(SLOW_REFUND));
    let refund = a_refund_left_crashed(dir.path(), sim.url());
    let mut first = spawn_worker(&db, sim.url(), &["--lease-ttl-ms", "1000"]);
    wait_until("the first worker's resend is in flight", || {
        intent_status(&db, &refund) == Some((IntentStatus::Attempting, 2))
    });
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");

    let (code, summary) = worker_once(&db, sim.url(), &["--lease-ttl-ms", "1000"]);
    assert_eq!(code, 0, "{summary:#}");
    assert_eq!(summary["recovered"], 1, "the killed worker's attempt is recorded interrupted: {summary:#}");
    assert_eq!(intent_status(&db, &refund), Some((IntentStatus::Validated, 2)), "final, no third attempt");
    assert_eq!(effects_on(dir.path(), &refund), 1, "one effect: the lookup found it, nothing was resent");
    let events = events_of(&db, &refund);
    let crashed: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::OutcomeUnknown { attempt, reason: UnknownReason::Crash, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(crashed, [1, 2], "each dead attempt becomes unknown once: {events:#?}");
    assert!(
        matches!(events.last(), Some(Event::IntentValidated { source: engine::event::Source::Reconciled, .. })),
        "{events:#?}"
    );
    check_invariants(dir.path());
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("kill runs");
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// The JSON lines a long-running worker printed on stdout.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(stdout);
    text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("a JSON object: {line}"))).collect()
}

#[test]
fn a_worker_stalled_past_its_lease_is_fenced_and_its_late_answer_is_kept() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(SLOW_REFUND));
    let refund = a_refund_left_crashed(dir.path(), sim.url());
    // Its own request timeout outlasts the stall: the answer it waits for stays definitive.
    let stalled = spawn_worker(&db, sim.url(), &["--lease-ttl-ms", "1000", "--provider-timeout-ms", "10000"]);
    wait_until("the worker's resend is in flight", || {
        intent_status(&db, &refund) == Some((IntentStatus::Attempting, 2))
    });
    // A long pause (or a partition): it stops renewing; once its lease expires another
    // worker takes the run over and reconciles the attempt instead of waiting for it.
    signal(&stalled, "STOP");
    wait_until("a second worker takes the expired run over", || {
        let (code, summary) = worker_once(&db, sim.url(), &["--lease-ttl-ms", "1000"]);
        assert_eq!(code, 0, "{summary:#}");
        summary["recovered"] == 1
    });
    assert_eq!(intent_status(&db, &refund).map(|s| s.0), Some(IntentStatus::Validated));
    signal(&stalled, "CONT");

    let late = |db: &Path| events_of(db, &refund).into_iter().any(|e| matches!(e, Event::LateAnswerRecorded { .. }));
    wait_until("the stalled worker's answer is recorded as evidence", || late(&db));
    signal(&stalled, "TERM");
    let output = stalled.wait_with_output().expect("the worker ends");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = json_lines(&output.stdout);
    let last = lines.last().expect("a summary line");
    assert_eq!(last["fenced"], 1, "the stalled worker stopped acting for the run it lost: {last:#}");
    assert_eq!(effects_on(dir.path(), &refund), 1, "one effect: the takeover looked it up, nothing was resent");
    let finishes = run_finishes(&db);
    let distinct: BTreeSet<&String> = finishes.iter().collect();
    assert_eq!(finishes.len(), distinct.len(), "each run finished once: {finishes:?}");
    check_invariants(dir.path());
}

#[test]
fn sigterm_stops_within_the_grace_and_gives_every_lease_back() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(SLOW_REFUND));
    let refund = a_refund_left_crashed(dir.path(), sim.url());
    // A lease far longer than the test: only a release lets another worker in before its end.
    let long_lease = ["--lease-ttl-ms", "600000"];
    let worker = spawn_worker(&db, sim.url(), &[&long_lease[..], &["--grace-ms", "100"]].concat());
    wait_until("the worker's resend is in flight", || {
        intent_status(&db, &refund) == Some((IntentStatus::Attempting, 2))
    });
    assert!(leases(&db).iter().any(|(_, _, live)| *live), "the worker holds the refund's run");
    signal(&worker, "TERM");

    let output = worker.wait_with_output().expect("the worker ends");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines = json_lines(&output.stdout);
    assert!(lines.iter().any(|line| line["state"] == "alive"), "a health line per interval: {stdout}");
    let last = lines.last().expect("a summary line");
    assert_eq!(last["state"], "stopped", "{stdout}");
    assert_eq!(last["cut_short"], 1, "the attempt held by the provider did not get to finish: {stdout}");
    assert_eq!(last["leases_held"], 0, "{stdout}");
    assert!(lines.iter().any(|line| line["state"] == "stopping"), "it said it was stopping: {stdout}");
    let before = leases(&db);
    assert!(before.iter().all(|(_, _, live)| !live), "every lease is given back: {before:?}");

    // Another worker takes the run at once (the lease is released, not waiting for its
    // expiry) and reconciles the cut-short attempt by lookup.
    let (code, summary) = worker_once(&db, sim.url(), &long_lease);
    assert_eq!(code, 0, "{summary:#}");
    assert_eq!(intent_status(&db, &refund).map(|s| s.0), Some(IntentStatus::Validated), "{summary:#}");
    assert_eq!(effects_on(dir.path(), &refund), 1);
    check_invariants(dir.path());
}

#[test]
fn bad_flags_are_a_clear_error_and_write_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let cases: [(&[&str], &str); 6] = [
        (&["worker", "--concurrency", "0", "--create"], "--concurrency"),
        (&["worker", "--concurrency", "65", "--create"], "--concurrency"),
        (&["worker", "--poll-ms", "0", "--create"], "--poll-ms"),
        (&["worker", "--grace-ms", "600001", "--create"], "--grace-ms"),
        (&["worker", "--health-ms", "10", "--create"], "--health-ms"),
        (&["worker", "--once"], "no event log"),
    ];
    for (args, named) in cases {
        let output = keel(&db, sim.url(), args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} names {named}: {stderr}");
        assert!(!db.exists(), "{args:?} wrote nothing");
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    let output = command
        .arg("--db")
        .arg(&db)
        .args(["worker", "--once", "--create"])
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(64), "a worker needs the provider");
    assert!(String::from_utf8_lossy(&output.stderr).contains("--provider"));
    assert!(!db.exists(), "nothing was created");
}

#[test]
fn the_help_teaches_what_it_claims_leases_stopping_and_the_health_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_keel")).args(["worker", "--help"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(0));
    // Words as a reader sees them, whatever the terminal's width wrapped.
    let help = String::from_utf8_lossy(&output.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    for taught in
        ["fencing token", "SIGTERM", "--grace-ms", "gives back every lease", "health", "--once", "outcome_unknown"]
    {
        assert!(help.contains(taught), "the help says {taught:?}: {help}");
    }
}
