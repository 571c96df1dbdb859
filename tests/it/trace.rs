//! `keel trace RUN_ID` through the real binary (issue 10): the causal tree of a charge whose
//! answer was lost then found by reconciliation, and of an agent run that refunded an order,
//! built from the parent every event records.

use crate::cli::{charge_args, keel, start_sim, temp};
use serde_json::Value;

/// The tree as `(depth, event)` lines, in order, for shape assertions.
fn shape(nodes: &Value, depth: usize, out: &mut Vec<(usize, String)>) {
    for node in nodes.as_array().expect("a list of nodes") {
        out.push((depth, node["event"].as_str().expect("an event type").to_owned()));
        shape(&node["children"], depth + 1, out);
    }
}

fn flat(trace: &Value) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    shape(&trace["roots"], 0, &mut out);
    out
}

#[test]
fn a_lost_answer_then_its_reconciliation_is_one_tree() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let args = [&["--provider-timeout-ms", "300"][..], &charge_args("trace_lost_answer", "2500")].concat();
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "{out}");
    let key = out["intent_key"].as_str().expect("a key").to_owned();
    let run_id = out["run_id"].as_str().expect("a run id").to_owned();
    let (code, out, _) = keel(&db, Some(sim.url()), &["reconcile", &key]);
    assert_eq!(code, 0, "{out}");

    let (code, trace, stderr) = keel(&db, None, &["trace", &run_id]);
    assert_eq!(code, 0, "{trace} {stderr}");
    let expected: &[(usize, &str)] = &[
        (0, "RunStarted"),
        (1, "StepRecorded"),
        (2, "IntentReserved"),
        (3, "AttemptStarted"),
        (4, "OutcomeUnknown"),
        (3, "ReconciliationStarted"),
        (4, "ReconciliationResolved"),
        (5, "IntentValidated"),
        (1, "RunFinished"),
    ];
    let shape = flat(&trace);
    let shape: Vec<(usize, &str)> = shape.iter().map(|(d, e)| (*d, e.as_str())).collect();
    assert_eq!(shape, expected, "{trace}");
    let reserved = &trace["roots"][0]["children"][0]["children"][0];
    assert_eq!(reserved["status"], "reserved", "{reserved}");
    let attempt = &reserved["children"][0];
    assert_eq!((attempt["detail"].as_str(), attempt["status"].as_str()), (Some("attempt 1"), Some("attempting")));
    let unknown = &attempt["children"][0];
    assert_eq!(
        (unknown["detail"].as_str(), unknown["status"].as_str()),
        (Some("unknown: timeout"), Some("outcome_unknown"))
    );
    assert!(attempt["duration_ms"].as_i64().is_some_and(|ms| ms >= 300), "the attempt waited its timeout: {attempt}");
    let found = &reserved["children"][1]["children"][0];
    assert_eq!(found["detail"], "lookup found", "{found}");
    assert_eq!(found["children"][0]["status"], "validated", "{found}");
    assert_eq!(found["children"][0]["actor"], "command:reconcile", "{found}");

    let human = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["trace", &run_id])
        .output()
        .expect("keel runs");
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.lines().any(|l| l.starts_with("      ReconciliationStarted #")), "indented by depth: {text}");

    let before = std::fs::metadata(&db).expect("the log").len();
    let (code, out, _) = keel(&db, None, &["trace", "no-such-run"]);
    assert_eq!(code, 64, "an unknown run is refused: {out}");
    assert_eq!(std::fs::metadata(&db).expect("the log").len(), before, "and nothing is written");
}

#[test]
fn an_agent_refund_hangs_its_intent_under_the_tool_call_and_the_approval_under_the_intent() {
    let desk = crate::approvals::Desk::new();
    let (run_id, key) = desk.suspended_refund("{}");
    let (code, approved) = desk.keel(&["approve", &key, "--by", "ana"]);
    assert_eq!(code, 0, "{approved}");
    let (code, report) = desk.keel(&["agent", "resume", &run_id]);
    assert_eq!((code, report["status"].as_str()), (0, Some("completed")), "{report}");

    let (code, trace) = desk.keel(&["trace", &run_id]);
    assert_eq!(code, 0, "{trace}");
    let roots = trace["roots"].as_array().expect("roots");
    assert_eq!(roots.len(), 1, "one root, the run: {trace}");
    let run = &roots[0];
    assert_eq!(run["event"], "RunStarted");
    let children = run["children"].as_array().expect("the run's facts");
    let tool_call = children
        .iter()
        .find(|c| c["event"] == "ToolCallReserved" && !c["children"].as_array().is_none_or(Vec::is_empty))
        .unwrap_or_else(|| panic!("the effect tool's call caused the reservation: {trace}"));
    assert!(tool_call["budget"]["tool_calls"].as_u64().is_some_and(|n| n >= 1), "{tool_call}");
    let link = &tool_call["children"][0];
    assert_eq!(link["event"], "StepRecorded", "the tool call's journal link: {tool_call}");
    let reserved = &link["children"][0];
    assert_eq!(reserved["event"], "IntentReserved", "{tool_call}");
    assert_eq!(reserved["status"], "awaiting_approval", "{reserved}");
    let under: Vec<&str> =
        reserved["children"].as_array().expect("the intent's").iter().filter_map(|c| c["event"].as_str()).collect();
    assert!(under.contains(&"ApprovalGranted") && under.contains(&"AttemptStarted"), "{under:?}");
    let granted = reserved["children"].as_array().expect("children").iter().find(|c| c["event"] == "ApprovalGranted");
    assert_eq!(granted.map(|g| g["actor"].clone()), Some(serde_json::json!("operator:ana")), "{reserved}");
    let attempt = reserved["children"].as_array().expect("children").iter().find(|c| c["event"] == "AttemptStarted");
    assert_eq!(attempt.map(|a| a["children"][0]["event"].clone()), Some(serde_json::json!("IntentValidated")));
    assert_eq!(children.last().map(|c| c["event"].clone()), Some(serde_json::json!("RunFinished")), "{trace}");
    assert!(children.iter().any(|c| c["event"] == "ModelAnswerRecorded" && c["budget"]["model_calls"] == 1), "{trace}");
}
