//! Keel on PostgreSQL through the real binary (`--store postgres://…`), on a throwaway
//! cluster the suite starts itself (installed when missing; one that cannot start fails the
//! test, never skips): a charge, its re-submission, refunds, `show` and `verify`; a charge
//! killed mid-attempt finished by `keel worker --once`, and by `keel resume` then `keel
//! reconcile`; two workers on one database sharing
//! crashed runs; a worker partitioned from the database past its lease, taken over, fenced,
//! its late answer kept, and one that starts partitioned away; the operator's commands
//! (`intents`, `resolve`, `approve`, `deny`, `cancel`, `runs`, `run show`) as on SQLite; and
//! every bad store argument refused, writing nothing, never printing a password.

use crate::cli::{charge_args, start_sim, temp};
use engine::event::{Event, IntentKey, ResolutionCheck};
use engine::ledger::IntentStatus;
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use store_postgres::PgReader;
use store_postgres::proxy::{Cut, Heal, Proxy};
use testkit::sample::TENANT;

/// A fresh database on the suite's cluster.
fn database(label: &str) -> String {
    let cluster = store_postgres::cluster::shared().unwrap_or_else(|e| panic!("{e}"));
    cluster.database(label).unwrap_or_else(|e| panic!("{e}"))
}

/// `keel --json --store STORE [--provider URL] ARGS`, the environment cleared of Keel's.
fn keel(store: &str, provider: Option<&str>, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.args(["--json", "--store", store]);
    if let Some(url) = provider {
        command.args(["--provider", url, "--provider-consistency-window-ms", "0"]);
    }
    command.args(args);
    for var in ["KEEL_PROVIDER_URL", "KEEL_DB", "KEEL_STORE", "KEEL_FAILPOINT", "KEEL_LEASE_TTL_MS", "KEEL_VAULT_KEY"] {
        command.env_remove(var);
    }
    command
}

/// Runs it: exit code, stdout as JSON (`null` when it is not), stderr.
fn run(mut command: Command) -> (i32, Value, String) {
    let output = command.output().expect("keel runs");
    let stdout = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), stdout, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn key(kind: &str, id: &str) -> IntentKey {
    IntentKey::parse(&format!("{kind}:{TENANT}:{id}")).expect("a key")
}

fn reader(url: &str) -> PgReader {
    PgReader::open(url).expect("a reader connects")
}

fn intent_status(url: &str, key: &IntentKey) -> Option<IntentStatus> {
    reader(url).intent(key).expect("reads").map(|intent| intent.status)
}

fn effects_on(dir: &Path, key: &IntentKey) -> usize {
    let effects = provider_sim::list_effects(&dir.join("sim.db")).expect("the simulator's effects");
    effects.iter().filter(|e| e.idempotency_key == key.as_str()).count()
}

fn verify_clean(url: &str) {
    let report = reader(url).verify().expect("verify reads");
    assert!(report.is_ok(), "{report}");
}

fn refund_args<'a>(intent_id: &'a str, amount: &'a str) -> Vec<&'a str> {
    let mut args = vec!["refund", "--tenant", TENANT, "--intent-id", intent_id, "--order", "order_1842"];
    args.extend(["--amount-minor", amount, "--currency", "EUR"]);
    args
}

/// Runs `args` with `failpoint` armed: the process must abort there.
fn crash(url: &str, provider: &str, args: &[&str], failpoint: &str) {
    let output = keel(url, Some(provider), args).env("KEEL_FAILPOINT", failpoint).output().expect("keel runs");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "keel must abort at {failpoint}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn summary(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "one JSON summary, got {:?} (stderr {:?})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn charge_resubmission_refunds_show_and_verify_run_on_postgres() {
    let url = database("cli");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let charge = key("charge", "order_1842_charge");

    let (code, first, stderr) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!(code, 0, "{first} {stderr}");
    assert_eq!((first["status"].as_str(), first["source"].as_str()), (Some("validated"), Some("provider")), "{first}");
    let (code, again, _) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!((code, again["source"].as_str()), (0, Some("deduplicated")), "{again}");
    assert_eq!(effects_on(dir.path(), &charge), 1, "the re-submission made no second effect");

    let (code, refund, _) = run(keel(&url, Some(sim.url()), &refund_args("order_1842_refund_1", "1000")));
    assert_eq!((code, refund["status"].as_str()), (0, Some("validated")), "{refund}");
    let (code, over, _) = run(keel(&url, Some(sim.url()), &refund_args("order_1842_refund_2", "3901")));
    assert_eq!((code, over["status"].as_str()), (2, Some("rejected")), "refunds above the charge: {over}");
    let refused = key("refund", "order_1842_refund_2");
    assert_eq!(effects_on(dir.path(), &refused), 0, "never sent");
    let held = reader(&url).intent(&refused).expect("reads").is_some_and(|intent| intent.money_committed());
    assert!(!held, "the refused refund holds no money");

    let (code, shown, _) = run(keel(&url, None, &["show", charge.as_str()]));
    assert_eq!((code, shown["status"].as_str()), (0, Some("validated")), "{shown}");
    let types: Vec<&str> =
        shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["IntentReserved", "AttemptStarted", "IntentValidated", "IntentDeduplicated"]);
    let (code, missing, _) = run(keel(&url, None, &["show", key("charge", "order_0000_nothing").as_str()]));
    assert_eq!((code, missing["reason"].as_str()), (64, Some("not_found")), "{missing}");

    let (code, verified, stderr) = run(keel(&url, None, &["verify"]));
    assert_eq!(code, 0, "{verified} {stderr}");
    assert_eq!(verified["mismatch_count"], 0, "{verified}");
    assert!(verified["events"].as_u64().is_some_and(|n| n > 0), "{verified}");
}

#[test]
fn a_charge_killed_mid_attempt_on_postgres_is_finished_by_one_worker_pass_with_one_effect() {
    let url = database("crash");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    crash(&url, sim.url(), &charge_args("order_1842_charge", "4900"), "after_provider_answer");
    let charge = key("charge", "order_1842_charge");
    assert_eq!(intent_status(&url, &charge), Some(IntentStatus::Attempting), "the attempt was left in flight");

    let output = keel(&url, Some(sim.url()), &["worker", "--once", "--poll-ms", "50"]).output().expect("runs");
    let done = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{done:#}");
    assert_eq!(done["recovered"], 1, "the dead attempt is recorded interrupted once: {done:#}");
    assert_eq!(done["leases_held"], 0, "{done:#}");
    assert_eq!(intent_status(&url, &charge), Some(IntentStatus::Validated));
    assert_eq!(effects_on(dir.path(), &charge), 1, "reconciled by lookup, never resent");
    let events: Vec<Event> =
        reader(&url).stream(&charge.stream()).expect("reads").into_iter().map(|e| e.event).collect();
    assert_eq!(events.iter().filter(|e| matches!(e, Event::AttemptStarted { .. })).count(), 1, "{events:#?}");
    verify_clean(&url);
}

#[test]
fn resume_and_reconcile_due_finish_a_crashed_charge_on_postgres() {
    let url = database("resume");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    crash(&url, sim.url(), &charge_args("order_1842_charge", "4900"), "after_provider_answer");
    let charge = key("charge", "order_1842_charge");

    let (code, resumed, stderr) = run(keel(&url, Some(sim.url()), &["resume"]));
    assert_eq!(code, 0, "{resumed} {stderr}");
    assert_eq!(resumed["recovered"], serde_json::json!([charge.as_str()]), "{resumed:#}");
    assert_eq!(intent_status(&url, &charge), Some(IntentStatus::Validated), "{resumed:#}");
    assert_eq!(effects_on(dir.path(), &charge), 1, "reconciled by lookup, never resent");

    let (code, due, stderr) = run(keel(&url, Some(sim.url()), &["reconcile", "--due"]));
    assert_eq!((code, due.clone()), (0, serde_json::json!([])), "nothing is left due: {stderr}");
    let (code, one, stderr) = run(keel(&url, Some(sim.url()), &["reconcile", charge.as_str()]));
    assert_eq!(code, 0, "{one} {stderr}");
    assert_eq!(one[0]["status"], "validated", "{one:#}");
    assert_eq!(effects_on(dir.path(), &charge), 1);
    verify_clean(&url);
}

#[test]
fn two_workers_on_one_postgres_database_finish_every_crashed_run_once() {
    let url = database("two_workers");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let ids: Vec<String> = (0..8).map(|n| format!("order_{}_charge", 2000 + n)).collect();
    for (n, id) in ids.iter().enumerate() {
        let order = format!("order_{}", 2000 + n);
        let mut args = charge_args(id, "4900");
        args[6] = &order;
        crash(&url, sim.url(), &args, "after_provider_answer");
    }
    let spawn = || {
        keel(&url, Some(sim.url()), &["worker", "--once", "--concurrency", "2", "--poll-ms", "50"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("a worker starts")
    };
    let (first, second) = (spawn(), spawn());
    let mut units = Vec::new();
    for worker in [first, second] {
        let output = worker.wait_with_output().expect("the worker ends");
        let done = summary(&output);
        assert_eq!(output.status.code(), Some(0), "{done:#}\n{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(done["leases_held"], 0, "{done:#}");
        units.extend(done["units"].as_array().expect("units").iter().cloned());
    }
    for id in &ids {
        let charge = key("charge", id);
        assert_eq!(intent_status(&url, &charge), Some(IntentStatus::Validated), "{charge}");
        assert_eq!(effects_on(dir.path(), &charge), 1, "one effect on {charge}");
    }
    let ledger = reader(&url).ledger().expect("folds");
    let mut finishes = Vec::new();
    for run in ledger.runs() {
        let events = reader(&url).stream(&run.run_id.stream()).expect("reads");
        let finished = events.iter().filter(|e| matches!(e.event, Event::RunFinished { .. })).count();
        finishes.push((run.run_id.to_string(), finished));
    }
    assert_eq!(finishes.len(), ids.len(), "{finishes:?}");
    assert!(finishes.iter().all(|(_, n)| *n == 1), "every run finished once: {finishes:?}");
    let held: Vec<(String, u64)> =
        units.iter().filter_map(|unit| Some((unit["run_id"].as_str()?.to_owned(), unit["token"].as_u64()?))).collect();
    let distinct: BTreeSet<&(String, u64)> = held.iter().collect();
    assert_eq!(distinct.len(), held.len(), "a run was held twice under one token: {units:#?}");
    verify_clean(&url);
}

/// Waits (at most 60 s) until `condition` holds.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The refund's second attempt (its first crashed unsent) is held this long by the
/// simulator, the effect made first.
const SLOW_REFUND: &str = r#"{"seed": 1, "rules": [{"operation": "refund", "fault": "slow", "times": 1, "ms": 2500}]}"#;

#[test]
fn a_worker_partitioned_from_postgres_past_its_lease_is_fenced_and_its_late_answer_is_kept() {
    let url = database("partition");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), Some(SLOW_REFUND));
    let (code, charged, stderr) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!(code, 0, "{charged} {stderr}");
    // Its first attempt written ahead, never sent: a worker proves it absent once the request
    // timeout has passed, then sends attempt 2, which the simulator holds.
    let timeout = ["--provider-timeout-ms", "3000"];
    crash(&url, sim.url(), &[&timeout[..], &refund_args("order_1842_refund", "1000")].concat(), "after_reservation");
    let refund = key("refund", "order_1842_refund");
    let attempts = |url: &str| reader(url).intent(&refund).expect("reads").map(|i| (i.status, i.attempts));

    let cluster = store_postgres::cluster::shared().unwrap_or_else(|e| panic!("{e}"));
    let proxy = Proxy::start(([127, 0, 0, 1], cluster.port()).into()).expect("the proxy listens");
    let through = url.replace(&format!(":{}/", cluster.port()), &format!(":{}/", proxy.port()));
    // Its own request timeout outlasts the partition: the answer it waits for stays definitive.
    let worker = ["worker", "--poll-ms", "50", "--health-ms", "200", "--lease-ttl-ms", "1000"];
    let partitioned = keel(&through, Some(sim.url()), &[&worker[..], &["--provider-timeout-ms", "10000"]].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel worker starts");
    wait_until("the worker's resend is in flight", || attempts(&url) == Some((IntentStatus::Attempting, 2)));
    // Cut off from the database, not closed: it renews nothing, and once its lease expires
    // a worker on a direct connection takes the run over and reconciles the attempt.
    proxy.arm(Cut::Partition { ms: 600_000, heal: Heal::Resume });
    wait_until("a second worker takes the expired run over", || {
        let output = keel(&url, Some(sim.url()), &["worker", "--once", "--poll-ms", "50", "--lease-ttl-ms", "1000"])
            .output()
            .expect("runs");
        let done = summary(&output);
        assert_eq!(output.status.code(), Some(0), "{done:#}");
        done["recovered"] == 1
    });
    assert_eq!(attempts(&url), Some((IntentStatus::Validated, 2)), "final, no third attempt");
    assert_eq!(effects_on(dir.path(), &refund), 1, "the takeover looked it up, nothing was resent");
    assert!(proxy.held() > 0, "the partition held the first worker's connections");

    proxy.heal();
    let late = || {
        let events = reader(&url).stream(&refund.stream()).expect("reads");
        events.iter().any(|e| matches!(e.event, Event::LateAnswerRecorded { .. }))
    };
    wait_until("the partitioned worker's answer is recorded as evidence", late);
    let status = Command::new("kill").args(["-TERM", &partitioned.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let output = partitioned.wait_with_output().expect("the worker ends");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last: Value = stdout.lines().last().and_then(|line| serde_json::from_str(line).ok()).unwrap_or(Value::Null);
    assert_eq!(last["fenced"], 1, "the partitioned worker stopped acting for the run it lost: {stdout}");
    assert_eq!(effects_on(dir.path(), &refund), 1, "one effect in the end");
    let ledger = reader(&url).ledger().expect("folds");
    for run in ledger.runs() {
        let events = reader(&url).stream(&run.run_id.stream()).expect("reads");
        let finished = events.iter().filter(|e| matches!(e.event, Event::RunFinished { .. })).count();
        assert!(finished <= 1, "{} finished {finished} times", run.run_id);
    }
    verify_clean(&url);
}

#[test]
fn a_worker_that_starts_while_the_database_is_partitioned_away_connects_again_once_it_heals() {
    let url = database("start_partitioned");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    crash(&url, sim.url(), &charge_args("order_1842_charge", "4900"), "after_provider_answer");
    let cluster = store_postgres::cluster::shared().unwrap_or_else(|e| panic!("{e}"));
    let proxy = Proxy::start(([127, 0, 0, 1], cluster.port()).into()).expect("the proxy listens");
    let through = url.replace(&format!(":{}/", cluster.port()), &format!(":{}/", proxy.port()));
    // Its first connection is held, then closed, as after a TCP timeout.
    proxy.arm(Cut::Partition { ms: 600_000, heal: Heal::Close });
    let worker = keel(&through, Some(sim.url()), &["worker", "--once", "--poll-ms", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel worker starts");
    wait_until("the worker's first connection is held", || proxy.held() > 0);
    proxy.heal();
    let output = worker.wait_with_output().expect("the worker ends");
    let done = summary(&output);
    assert_eq!(output.status.code(), Some(0), "{done:#}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(done["recovered"], 1, "it went on to recover the crashed charge: {done:#}");
    assert_eq!(intent_status(&url, &key("charge", "order_1842_charge")), Some(IntentStatus::Validated));
    verify_clean(&url);
}

fn event_count(url: &str) -> usize {
    reader(url).events().expect("reads").len()
}

/// `keel --store STORE ARGS` as an operator reads it: its text, not `--json`.
fn keel_text(store: &str, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--store", store])
        .args(args)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .env_remove("KEEL_STORE")
        .output()
        .expect("keel runs");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The intent keys `keel intents --state STATE` lists.
fn listed(url: &str, state: &str) -> Vec<String> {
    let (code, listed, stderr) = run(keel(url, None, &["intents", "--state", state]));
    assert_eq!(code, 0, "{listed} {stderr}");
    let rows = listed.as_array().unwrap_or_else(|| panic!("a list: {listed}"));
    rows.iter().map(|row| row["intent_key"].as_str().expect("each row names its intent").to_owned()).collect()
}

/// An intent whose answer was lost on PostgreSQL is listed by `intents --state`, refused a
/// cancel and a resolution the provider's lookup contradicts (writing nothing), then resolved
/// with the reference the provider confirms, as on SQLite; bad input is the same usage error.
#[test]
fn an_unknown_charge_is_listed_and_resolved_against_the_providers_lookup_on_postgres() {
    let url = database("resolve");
    let (dir, _) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let lost = [&["--provider-timeout-ms", "300"][..], &charge_args("order_1900_charge", "2500")].concat();
    let (code, unknown, stderr) = run(keel(&url, Some(sim.url()), &lost));
    assert_eq!((code, unknown["status"].as_str()), (2, Some("outcome_unknown")), "{unknown} {stderr}");
    let charge = key("charge", "order_1900_charge");
    assert_eq!(listed(&url, "outcome_unknown"), [charge.as_str()]);
    assert!(listed(&url, "validated").is_empty());
    let (code, text) = keel_text(&url, &["intents"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with("STATUS") && text.contains(charge.as_str()), "a header, then its row: {text}");

    let before = event_count(&url);
    let (code, bogus, _) = run(keel(&url, None, &["intents", "--state", "bogus"]));
    assert_eq!((code, bogus["status"].as_str()), (64, Some("usage_error")), "{bogus}");
    assert!(bogus["error"].as_str().is_some_and(|e| e.contains("outcome_unknown")), "names the states: {bogus}");
    let nothing = key("charge", "order_0000_nothing");
    let args = ["resolve", nothing.as_str(), "--absent", "--by", "ana", "--reason", "r"];
    let (code, missing, _) = run(keel(&url, None, &args));
    assert_eq!((code, missing["reason"].as_str()), (64, Some("not_found")), "{missing}");
    let (code, refused, _) = run(keel(&url, None, &["cancel", charge.as_str(), "--by", "ana", "--reason", "asked"]));
    assert_eq!(code, 2, "cancel is refused while the outcome is unknown: {refused}");
    let real = provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects")[0].id.clone();
    let args = ["resolve", charge.as_str(), "--landed", "ch_DOES_NOT_EXIST", "--by", "ana", "--reason", "looked"];
    let (code, contradicted, _) = run(keel(&url, Some(sim.url()), &args));
    assert_eq!(code, 2, "{contradicted}");
    assert!(contradicted["error"].to_string().contains(&real), "says what the provider says: {contradicted}");
    let args = ["resolve", charge.as_str(), "--landed", &real, "--by", "ana", "--reason", "r"];
    let (code, unasked, _) = run(keel(&url, None, &args));
    assert_eq!(code, 64, "a provider that can look up must be asked: {unasked}");
    assert_eq!(event_count(&url), before, "refusals and bad input write nothing");

    let (code, resolved, stderr) = run(keel(&url, Some(sim.url()), &args));
    assert_eq!((code, resolved["status"].as_str()), (0, Some("validated")), "{resolved} {stderr}");
    let events = reader(&url).stream(&charge.stream()).expect("reads");
    let last = events.last().expect("events");
    let Event::IntentResolved { by, landed, check, .. } = &last.event else { panic!("resolved last: {last:?}") };
    assert_eq!((by.as_str(), landed.as_deref()), ("ana", Some(real.as_str())));
    assert_eq!(*check, ResolutionCheck::Confirmed, "the provider's lookup agreed");
    assert_eq!(listed(&url, "validated"), [charge.as_str()]);
    assert!(listed(&url, "outcome_unknown").is_empty());
    assert_eq!(effects_on(dir.path(), &charge), 1);
    verify_clean(&url);
}

/// A charge above the approval threshold on PostgreSQL waits, listed, until approved (bound to
/// its fingerprint), then is effected once when re-submitted; another is denied and never
/// effected.
#[test]
fn an_approved_charge_is_effected_once_and_a_denied_one_never_on_postgres() {
    let url = database("approve");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let gated = |intent_id: &'static str, order: &'static str| {
        let mut args = charge_args(intent_id, "5000");
        args[6] = order;
        args.extend(["--approval-threshold-minor", "1000"]);
        args
    };
    let approved = gated("order_1842_charge", "order_1842");
    let (code, waiting, stderr) = run(keel(&url, Some(sim.url()), &approved));
    assert_eq!((code, waiting["status"].as_str()), (2, Some("awaiting_approval")), "{waiting} {stderr}");
    let charge = key("charge", "order_1842_charge");
    assert_eq!(listed(&url, "awaiting_approval"), [charge.as_str()]);

    let before = event_count(&url);
    let wrong = "0".repeat(64);
    let (code, refused, _) =
        run(keel(&url, None, &["approve", charge.as_str(), "--by", "lead", "--fingerprint", &wrong]));
    assert_eq!(code, 2, "{refused}");
    let (code, blank, _) = run(keel(&url, None, &["approve", charge.as_str(), "--by", " "]));
    assert_eq!((code, blank["status"].as_str()), (64, Some("usage_error")), "{blank}");
    assert_eq!(event_count(&url), before, "a refused approval writes nothing");
    assert_eq!(effects_on(dir.path(), &charge), 0);
    let (code, text) = keel_text(&url, &["approve", charge.as_str(), "--by", "lead"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with(&format!("approved {charge} by lead")), "{text}");
    let (code, done, _) = run(keel(&url, Some(sim.url()), &approved));
    assert_eq!((code, done["status"].as_str()), (0, Some("validated")), "{done}");
    let (code, again, _) = run(keel(&url, Some(sim.url()), &approved));
    assert_eq!((code, again["source"].as_str()), (0, Some("deduplicated")), "{again}");
    assert_eq!(effects_on(dir.path(), &charge), 1, "effected exactly once");

    let other = gated("order_1843_charge", "order_1843");
    let (code, waiting, _) = run(keel(&url, Some(sim.url()), &other));
    assert_eq!((code, waiting["status"].as_str()), (2, Some("awaiting_approval")), "{waiting}");
    let denied = key("charge", "order_1843_charge");
    let (code, shown, _) = run(keel(&url, None, &["deny", denied.as_str(), "--by", "lead", "--reason", "suspicious"]));
    assert_eq!((code, shown["status"].as_str()), (0, Some("rejected")), "{shown}");
    let (code, after, _) = run(keel(&url, Some(sim.url()), &other));
    assert_eq!((code, after["status"].as_str()), (2, Some("rejected")), "{after}");
    assert_eq!(effects_on(dir.path(), &denied), 0, "a denied charge is never effected");
    assert_eq!(listed(&url, "validated"), [charge.as_str()]);
    assert_eq!(listed(&url, "rejected"), [denied.as_str()]);
    verify_clean(&url);
}

/// `keel cancel` on PostgreSQL ends an intent that has nothing in flight, recorded with the
/// operator's name and reason; an unknown key is refused as on SQLite and writes nothing.
#[test]
fn cancel_ends_a_waiting_intent_with_the_operators_name_on_postgres() {
    let url = database("cancel");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let mut args = charge_args("order_1844_charge", "5000");
    args.extend(["--approval-threshold-minor", "1000"]);
    let (code, waiting, _) = run(keel(&url, Some(sim.url()), &args));
    assert_eq!((code, waiting["status"].as_str()), (2, Some("awaiting_approval")), "{waiting}");
    let charge = key("charge", "order_1844_charge");
    let before = event_count(&url);
    let nothing = key("charge", "order_0000_nothing");
    let (code, missing, _) = run(keel(&url, None, &["cancel", nothing.as_str(), "--by", "ana", "--reason", "r"]));
    assert_eq!((code, missing["reason"].as_str()), (64, Some("not_found")), "{missing}");
    assert_eq!(event_count(&url), before, "an unknown key writes nothing");
    let (code, cancelled, _) = run(keel(&url, None, &["cancel", charge.as_str(), "--by", "ana", "--reason", "asked"]));
    assert_eq!((code, cancelled["status"].as_str()), (0, Some("cancelled")), "{cancelled}");
    let last = reader(&url).stream(&charge.stream()).expect("reads").pop().expect("events");
    assert_eq!(last.cause.actor, "operator:ana", "{last:?}");
    assert!(matches!(last.event, Event::IntentCancelled { .. }), "{last:?}");
    assert_eq!(listed(&url, "cancelled"), [charge.as_str()]);
    assert_eq!(effects_on(dir.path(), &charge), 0);
    verify_clean(&url);
}

/// `keel runs` on PostgreSQL lists and filters the runs as on SQLite (by status, workflow and
/// start), and `keel run show` renders one with its intents and budgets; bad input and an
/// unknown run are the same usage errors.
#[test]
fn runs_are_listed_filtered_and_shown_on_postgres() {
    let url = database("runs");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, charged, _) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!(code, 0, "{charged}");
    let charge_run = charged["run_id"].as_str().expect("a run").to_owned();
    let (code, refunded, _) = run(keel(&url, Some(sim.url()), &refund_args("order_1842_refund_1", "1000")));
    assert_eq!(code, 0, "{refunded}");
    let refund_run = refunded["run_id"].as_str().expect("a run").to_owned();
    let ids = |args: &[&str]| -> Vec<String> {
        let (code, listed, stderr) = run(keel(&url, None, &[&["runs"][..], args].concat()));
        assert_eq!(code, 0, "{args:?}: {listed} {stderr}");
        let rows = listed.as_array().unwrap_or_else(|| panic!("a list: {listed}"));
        rows.iter().map(|row| row["run_id"].as_str().expect("each row names its run").to_owned()).collect()
    };
    assert_eq!(ids(&[]), [charge_run.as_str(), refund_run.as_str()], "oldest first");
    assert_eq!(ids(&["--status", "completed", "--workflow", "refund"]), [refund_run.as_str()]);
    assert_eq!(ids(&["--workflow", "charge", "--since", "1h"]), [charge_run.as_str()]);
    assert!(ids(&["--since", "2999-01-01T00:00:00Z"]).is_empty());
    assert!(ids(&["--status", "running"]).is_empty());

    let (code, shown, stderr) = run(keel(&url, None, &["run", "show", &charge_run]));
    assert_eq!((code, shown["status"].as_str()), (0, Some("completed")), "{shown} {stderr}");
    assert_eq!(shown["intents"][0]["intent_key"], key("charge", "order_1842_charge").as_str(), "{shown}");
    let budgets = shown["budgets"].as_array().expect("budgets");
    let money = budgets.iter().find(|b| b["name"] == "cost_minor").expect("a money budget");
    assert_eq!(money["used"].as_i64(), Some(4900), "{shown}");
    let (code, text) = keel_text(&url, &["run", "show", &refund_run]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with(&format!("run {refund_run}: completed")), "{text}");

    let (code, bogus, _) = run(keel(&url, None, &["runs", "--status", "bogus"]));
    assert_eq!((code, bogus["status"].as_str()), (64, Some("usage_error")), "{bogus}");
    assert!(bogus["error"].as_str().is_some_and(|e| e.contains("deadline_exceeded")), "names them: {bogus}");
    let (code, missing, _) = run(keel(&url, None, &["run", "show", "no-such-run"]));
    assert_eq!((code, missing["reason"].as_str()), (64, Some("not_found")), "{missing}");
}

/// Asserts that the database at `url` holds no Keel log: nothing, not even its tables, was
/// written there.
fn assert_no_log(url: &str) {
    let (code, report, stderr) = run(keel(url, None, &["verify"]));
    assert_eq!((code, report["reason"].as_str()), (64, Some("missing_database")), "{report} {stderr}");
}

/// A read or a recovery on a database that holds no Keel log is refused as a missing SQLite
/// file is (64, `missing_database`, the URL's password never printed) and creates nothing
/// there; with `--create` it starts an empty log.
#[test]
fn a_database_without_a_log_is_refused_by_reads_and_recoveries_unless_create() {
    let (dir, _db) = temp();
    let sim = start_sim(dir.path(), None);
    let url = database("no_log");
    let secret = "hunter3-never-printed";
    let with_password = url.replacen("postgres://postgres@", &format!("postgres://postgres:{secret}@"), 1);
    let charge = key("charge", "order_0001_missing");
    let commands: [&[&str]; 5] =
        [&["verify"], &["show", charge.as_str()], &["resume"], &["reconcile", "--due"], &["worker", "--once"]];
    for args in commands {
        let (code, report, stderr) = run(keel(&with_password, Some(sim.url()), args));
        assert_eq!((code, report["reason"].as_str()), (64, Some("missing_database")), "{args:?}: {report} {stderr}");
        assert!(stderr.contains("no event log in the PostgreSQL database"), "{args:?}: {stderr}");
        assert!(!stderr.contains(secret) && !report.to_string().contains(secret), "{args:?}: {stderr}");
    }
    assert_no_log(&url);
    let (code, verified, stderr) = run(keel(&url, None, &["verify", "--create"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(verified["events"].as_u64(), Some(0), "{verified}");
}

#[test]
fn every_bad_store_argument_is_a_usage_error_that_writes_nothing_and_never_prints_a_password() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let url = database("bad_store");
    let secret = "hunter2-never-printed";
    let with_password = url.replacen("postgres://postgres@", &format!("postgres://postgres:{secret}@"), 1);
    let charge = charge_args("order_1842_charge", "4900");
    let no_log = db.to_str().expect("a utf-8 path");
    let other = format!("sqlite:{}", dir.path().join("other.db").display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            ["--store", "mysql://keel:hunter2-never-printed@h/k"]
                .iter()
                .copied()
                .chain(charge.iter().copied())
                .collect(),
            "sqlite:PATH",
        ),
        (["--store", "keel.db"].iter().copied().chain(charge.iter().copied()).collect(), "postgres://"),
        (["--store", "sqlite:"].iter().copied().chain(charge.iter().copied()).collect(), "sqlite:PATH"),
        (
            ["--store", "postgres://keel:hunter2-never-printed@h:port/k"]
                .iter()
                .copied()
                .chain(charge.iter().copied())
                .collect(),
            "postgres://",
        ),
        (
            ["--store", &other, "--db", no_log].iter().copied().chain(charge.iter().copied()).collect(),
            "two different logs",
        ),
        (
            ["--store", &with_password, "--db", no_log].iter().copied().chain(charge.iter().copied()).collect(),
            "two different logs",
        ),
        (
            vec!["--store", &with_password, "metrics"],
            "charge, refund, resume, reconcile, worker, intents, show, resolve, approve, deny, cancel, runs, run \
             show, verify, bench and soak",
        ),
        (vec!["--store", &with_password, "trace", "run-1"], "does not run on PostgreSQL"),
        (vec!["--store", &with_password, "intents", "--stuck"], "intents --stuck does not run on PostgreSQL"),
    ];
    for (args, named) in &cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.args(["--provider", sim.url()]).args(args);
        for var in ["KEEL_PROVIDER_URL", "KEEL_DB", "KEEL_STORE", "KEEL_VAULT_KEY"] {
            command.env_remove(var);
        }
        let output = command.output().expect("runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?} says {named:?}: {stderr}");
        assert!(!stderr.contains(secret) && !stdout.contains(secret), "{args:?} printed the password: {stderr}");
        assert!(!db.exists() && !dir.path().join("other.db").exists(), "{args:?} wrote no SQLite log");
    }
    // KEEL_STORE is read as --store is.
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--provider", sim.url(), "metrics"])
        .env("KEEL_STORE", &with_password)
        .env_remove("KEEL_DB")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(64), "{}", String::from_utf8_lossy(&output.stderr));
    // A vault key with a PostgreSQL store: the vault is SQLite's for now.
    let key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let (code, _, stderr) = run({
        let mut command = keel(&with_password, Some(sim.url()), &charge);
        command.env("KEEL_VAULT_KEY", key);
        command
    });
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("SQLite-only") && !stderr.contains(secret), "{stderr}");
    assert_no_log(&url);

    // An unreachable server: named by host and port, the password never printed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("its address").port();
    let down = format!("postgres://keel:{secret}@127.0.0.1:{port}/keel");
    let (code, out, stderr) = run(keel(&down, Some(sim.url()), &charge));
    assert_eq!(code, 1, "an unreachable server is an error: {stderr}");
    assert_eq!(out["status"], "error", "{out}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "names the server: {stderr}");
    assert!(!stderr.contains(secret) && !out.to_string().contains(secret), "{stderr}");
    assert_eq!(effects_on(dir.path(), &key_of_charge()), 0, "nothing reached the provider");

    // A password in a reachable URL is not printed either (the cluster trusts local users).
    let (code, verified, stderr) = run(keel(&with_password, None, &["verify", "--create"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!verified.to_string().contains(secret) && !stderr.contains(secret));
}

fn key_of_charge() -> IntentKey {
    key("charge", "order_1842_charge")
}

#[test]
fn a_refund_that_would_wait_on_a_signal_is_refused_on_postgres_writing_nothing() {
    let url = database("after_signal");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let input = dir.path().join("refund.json");
    let body = serde_json::json!({
        "tenant_id": TENANT, "intent_id": "order_1842_refund", "order_id": "order_1842",
        "amount_minor": 1000, "currency": "EUR", "after_signal": "goods_returned",
    });
    std::fs::write(&input, body.to_string()).expect("the input is written");
    let flag = [refund_args("order_1842_refund", "1000"), vec!["--after-signal", "goods_returned"]].concat();
    let file = vec!["refund", "--input", input.to_str().expect("a UTF-8 path")];
    for args in [flag, file] {
        let (code, refused, stderr) = run(keel(&url, Some(sim.url()), &args));
        assert_eq!((code, refused["status"].as_str()), (64, Some("usage_error")), "{args:?}: {refused} {stderr}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(error.contains("--after-signal") && error.contains("keel signal"), "a clear error: {error}");
        assert!(!PgReader::holds_log(&url).expect("the database answers"), "nothing written");
    }
    // A timer is not refused: `keel resume` and `keel worker` continue it here.
    let (code, charged, stderr) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!(code, 0, "{charged} {stderr}");
    let delayed = [refund_args("order_1842_refund", "1000"), vec!["--delay-ms", "10"]].concat();
    let (code, refund, stderr) = run(keel(&url, Some(sim.url()), &delayed));
    assert_eq!((code, refund["status"].as_str()), (0, Some("validated")), "{refund} {stderr}");
}

#[test]
fn a_refund_held_on_a_timer_on_postgres_is_held_to_the_policy_installed_meanwhile() {
    let url = database("policy_resume");
    let (dir, _) = temp();
    let sim = start_sim(dir.path(), None);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("the policy is written");
        path.to_str().expect("a UTF-8 path").to_owned()
    };
    let loose = write("loose.toml", "version = \"loose\"\n");
    let strict = write("strict.toml", "version = \"strict\"\n[operations.refund]\napproval_threshold_minor = 500\n");
    let (code, charged, stderr) = run(keel(&url, Some(sim.url()), &charge_args("order_1842_charge", "4900")));
    assert_eq!(code, 0, "{charged} {stderr}");
    let started = Instant::now();
    let held = [vec!["--policy", loose.as_str()], refund_args("order_1842_refund", "1000"), vec!["--delay-ms", "1100"]];
    let (code, waiting, stderr) = run(keel(&url, Some(sim.url()), &held.concat()));
    assert_eq!((code, waiting["run_status"].as_str()), (2, Some("suspended")), "{waiting} {stderr}");
    // A timer fires on the wall clock: only waiting past it shows what resume does then.
    std::thread::sleep(Duration::from_millis(1_200).saturating_sub(started.elapsed()));
    let (code, report, stderr) = run(keel(&url, Some(sim.url()), &["--policy", &strict, "resume"]));
    assert_eq!(code, 0, "{report} {stderr}");
    let refund = key("refund", "order_1842_refund");
    assert_eq!(intent_status(&url, &refund), Some(IntentStatus::AwaitingApproval), "{report}");
    assert_eq!(effects_on(dir.path(), &refund), 0, "nothing sent before a human approves");
}
