//! The support agent's refund desk, a sub-agent (issue 12): its budgets carved out of the
//! run's and recorded before it starts, its refund through the same intent lifecycle and the
//! same human approval, and a run killed mid-delegation resumed without a recorded model call
//! asked again nor a budget carved again. Real processes, a real simulator.

use crate::approvals::Desk;
use engine::event::{Event, RunId};
use serde_json::Value;

/// Every agent fact of run `run_id`, in order.
fn facts(desk: &Desk, run_id: &str) -> Vec<Value> {
    let reader = store::Reader::open(&desk.db).expect("opens");
    let events = reader.stream(&RunId::new(run_id).stream()).expect("reads");
    events
        .into_iter()
        .filter_map(|e| match e.event {
            Event::AgentRecorded { event, .. } => Some(event),
            _ => None,
        })
        .collect()
}

fn is_carve(fact: &Value) -> bool {
    fact["type"] == "Delegated" && fact["fact"]["type"] == "AgentRunStarted"
}

/// Approves the intent the run waits on, then resumes it to its end.
fn approve_and_resume(desk: &Desk, run_id: &str, report: &Value) -> (i32, Value) {
    let key = report["awaiting_approval"].as_str().unwrap_or_else(|| panic!("a refund to approve: {report}"));
    let (code, approved) = desk.keel(&["approve", key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    desk.keel(&["agent", "resume", run_id])
}

fn invariants_hold(desk: &Desk) {
    let report = testkit::invariants::check_files(&desk.db, &desk.dir.path().join("sim.db")).expect("readable");
    assert!(report.is_ok(), "{report:?}");
}

#[test]
fn the_refund_desk_refunds_once_after_a_human_approves_and_its_carve_precedes_its_first_call() {
    let desk = Desk::new();
    let (code, report) = desk.keel(&["agent", "run", "support", "--scenario", "delegate"]);
    assert_eq!((code, report["status"].as_str()), (2, Some("awaiting_approval")), "{report}");
    let run_id = report["run_id"].as_str().expect("a run id").to_owned();
    let (code, report) = approve_and_resume(&desk, &run_id, &report);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["status"], "completed", "{report}");
    assert_eq!(report["model_calls"], 6, "the agent's 3 and its desk's 3: {report}");
    assert_eq!(desk.refunds_at_provider(), 1);

    let facts = facts(&desk, &run_id);
    let carve = facts.iter().position(is_carve).expect("the desk's start is recorded");
    assert_eq!(facts[carve - 1]["type"], "ToolCallReserved", "in the batch of the delegation call's reservation");
    assert_eq!(facts[carve]["fact"]["limits"]["model_calls_max"], 4);
    let first_desk_call =
        facts.iter().position(|f| f["type"] == "Delegated" && f["fact"]["type"] == "ModelCallReserved");
    assert!(first_desk_call.is_some_and(|first| first > carve), "carved before the desk's first call");
    invariants_hold(&desk);
    desk.verify();
}

#[test]
fn a_run_killed_inside_its_desk_resumes_without_asking_a_recorded_answer_again_nor_carving_again() {
    let desk = Desk::new();
    // The 4th model call is the desk's second (its refund): the process dies once the call's
    // reservation is durable, before the model is asked.
    let output = desk
        .command(&["agent", "run", "support", "--scenario", "delegate"])
        .env("KEEL_TEST_ABORT_AT_MODEL_CALL", "4")
        .output()
        .expect("keel runs");
    assert_eq!(output.status.code(), None, "killed by abort()");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let run_id = stderr
        .split_whitespace()
        .skip_while(|w| *w != "run")
        .nth(1)
        .unwrap_or_else(|| panic!("the run id on stderr: {stderr}"))
        .to_owned();
    let before = facts(&desk, &run_id);
    let answered_before = before
        .iter()
        .filter(|f| f["type"] == "ModelAnswerRecorded" || f["fact"]["type"] == "ModelAnswerRecorded")
        .count();
    assert_eq!(answered_before, 3, "the agent's 2 answers and the desk's first");

    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!((code, report["status"].as_str()), (2, Some("awaiting_approval")), "{report}");
    let (code, report) = approve_and_resume(&desk, &run_id, &report);
    assert_eq!((code, report["status"].as_str()), (0, Some("completed")), "{report}");
    // 6 answers plus the call whose reservation outlived the process: it stays counted.
    assert_eq!(report["model_calls"], 7, "{report}");
    let after = facts(&desk, &run_id);
    assert_eq!(after[..before.len()], before[..], "a resume only appends");
    assert_eq!(after.iter().filter(|f| is_carve(f)).count(), 1, "carved once");
    let answers = after
        .iter()
        .filter(|f| f["type"] == "ModelAnswerRecorded" || f["fact"]["type"] == "ModelAnswerRecorded")
        .count();
    assert_eq!(answers, 6, "each answer recorded once: none of the first three asked again");
    assert_eq!(desk.refunds_at_provider(), 1);
    invariants_hold(&desk);
    desk.verify();
}
