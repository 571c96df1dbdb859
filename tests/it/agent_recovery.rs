//! Agent runs that crash, race and are interrupted mid-refund: one resume wins, every
//! status is true, nothing is resent after its run ended, and an interrupt or a SIGTERM is
//! recorded where the run stands (issue 15, items 3, 4 and 6). Real processes, real signals.

use crate::approvals::Desk;
use serde_json::Value;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The simulator commits the first refund at once and holds its answer for `ms`.
fn slow_refund(ms: u64) -> String {
    format!(r#"{{"seed": 1, "rules": [{{"operation": "refund", "fault": "slow", "times": 1, "ms": {ms}}}]}}"#)
}

fn spawn(desk: &Desk, args: &[&str]) -> Child {
    desk.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("keel starts")
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "one JSON document, got {:?} (stderr {:?})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("kill runs");
    assert!(status.success(), "kill -{name}");
}

/// Waits (at most 20 s) until the intent `key` is in `status`.
fn wait_for_status(desk: &Desk, key: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let key = engine::event::IntentKey::parse(key).expect("a key");
    loop {
        let now = store::Reader::open(&desk.db)
            .ok()
            .and_then(|r| r.ledger().ok())
            .and_then(|l| l.intent(&key).map(|i| i.status.as_str().to_owned()));
        if now.as_deref() == Some(status) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {key} to be {status} (it is {now:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A support refund approved and resumed in a child process that is now at the provider.
fn refund_at_the_provider(desk: &Desk) -> (String, String, Child) {
    let (run_id, key) = desk.suspended_refund("{}");
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    let child = spawn(desk, &["agent", "resume", &run_id]);
    wait_for_status(desk, &key, "attempting");
    // `attempting` is durable before the request leaves: wait until the provider has the
    // refund (and holds its answer), or a kill could land before the request is sent — a
    // different scenario, whose lookup rightly answers "absent, too early to believe".
    let deadline = Instant::now() + Duration::from_secs(20);
    while desk.refunds_at_provider() == 0 {
        assert!(Instant::now() < deadline, "timed out waiting for the refund to reach the provider");
        std::thread::sleep(Duration::from_millis(20));
    }
    (run_id, key, child)
}

#[test]
fn an_agent_resume_after_a_crash_mid_refund_reconciles_before_it_decides() {
    let desk = Desk::with_faults(Some(&slow_refund(1_500)));
    let (run_id, key, mut child) = refund_at_the_provider(&desk);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 0, "the resume reconciled the refund in flight, then went on: {report}");
    assert_eq!(report["status"], "completed");
    assert_eq!(desk.intent_status(&key), "validated");
    assert_eq!(desk.refunds_at_provider(), 1, "reconciled, never resent");
    desk.verify();
}

#[test]
fn a_refund_whose_agent_run_ended_is_released_not_resent_by_keel_resume() {
    // The provider fails before acting: the refund's outcome is unknown and the run stops so.
    let plan = r#"{"seed": 1, "rules": [{"operation": "refund", "fault": "fail_before_effect", "times": 1}]}"#;
    let desk = Desk::with_faults(Some(plan));
    let (run_id, key) = desk.suspended_refund("{}");
    assert_eq!(desk.keel(&["approve", &key, "--by", "ana"]).0, 0);
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["status"], "outcome_unknown", "{report}");
    // Later, recovery reconciles: the effect is proven absent, and its run is over.
    // The first reconciliation's backoff (1 s) and the request's timeout: an absence is proof
    // only once the request is certainly over.
    std::thread::sleep(Duration::from_millis(crate::approvals::PROVIDER_TIMEOUT_MS + 100));
    let (code, resumed) = desk.keel(&["resume"]);
    assert_eq!(code, 0, "{resumed}");
    assert_eq!(desk.intent_status(&key), "rejected", "released: nothing will send it now");
    assert_eq!(desk.refunds_at_provider(), 0, "never resent on behalf of a finished run");
    desk.verify();
}

#[test]
fn of_two_concurrent_agent_resumes_one_works_and_both_report_the_true_status() {
    let desk = Desk::with_faults(Some(&slow_refund(1_500)));
    let (run_id, key, first) = refund_at_the_provider(&desk);
    // The second resume finds the run held by the first, alive: it waits, then reports.
    let second = spawn(&desk, &["agent", "resume", &run_id]);
    let (first, second) = (first.wait_with_output().expect("ends"), second.wait_with_output().expect("ends"));
    for output in [&first, &second] {
        let report = json_of(output);
        assert_eq!(output.status.code(), Some(0), "each exits with the run's true status: {report}");
        assert_eq!(report["status"], "completed", "{report}");
    }
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("waiting"),
        "the second says it waited for the first: {}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(desk.intent_status(&key), "validated");
    assert_eq!(desk.refunds_at_provider(), 1);
    desk.verify();
}

#[test]
fn ctrl_c_during_a_refund_at_the_provider_records_cancelled_and_leaves_it_to_reconciliation() {
    let desk = Desk::with_faults(Some(&slow_refund(1_500)));
    let (_run_id, key, child) = refund_at_the_provider(&desk);
    signal(&child, "INT");
    let output = child.wait_with_output().expect("ends");
    let report = json_of(&output);
    assert_eq!(output.status.code(), Some(130), "{report}");
    assert_eq!(report["status"], "cancelled", "{report}");
    assert_eq!(desk.intent_status(&key), "outcome_unknown", "not cancelled while the refund may have landed");
    let (code, reconciled) = desk.keel(&["reconcile", &key]);
    assert_eq!(code, 0, "{reconciled}");
    assert_eq!(desk.intent_status(&key), "validated", "reconciliation found the refund");
    assert_eq!(desk.refunds_at_provider(), 1);
    desk.verify();
}

#[test]
fn sigterm_lets_the_refund_finish_then_pauses_the_run_resumable() {
    let desk = Desk::with_faults(Some(&slow_refund(1_000)));
    let (run_id, key, child) = refund_at_the_provider(&desk);
    signal(&child, "TERM");
    let output = child.wait_with_output().expect("ends");
    let report = json_of(&output);
    assert_eq!(output.status.code(), Some(143), "{report}");
    assert_eq!(report["status"], "terminated", "{report}");
    assert_eq!(desk.intent_status(&key), "validated", "the step in progress finished and was recorded");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!(code, 0, "the paused run resumes: {report}");
    assert_eq!(report["status"], "completed");
    assert_eq!(desk.refunds_at_provider(), 1);
    desk.verify();
}
