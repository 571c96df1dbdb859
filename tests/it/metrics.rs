//! `keel metrics` through the real binary (issue 10, seed 004): a small log whose outcomes
//! are known — a provider receipt, a deduplication, a decline, an answer lost after the
//! effect then found by reconciliation, an escalation with no lookup, agent runs stopped by
//! their model budget — and every figure checked exactly, unsegmented and segmented.

use crate::cli::{charge_args, keel, start_sim, temp};
use serde_json::Value;
use std::path::Path;

fn charge_on<'a>(intent_id: &'a str, order: &'a str, amount: &'a str) -> Vec<&'a str> {
    let mut args = charge_args(intent_id, amount);
    let at = args.iter().position(|a| *a == "--order").expect("charge_args names an order") + 1;
    args[at] = order;
    args
}

fn segment<'a>(report: &'a Value, value: &str) -> &'a Value {
    report["segments"]
        .as_array()
        .and_then(|segments| segments.iter().find(|s| s["segment"] == value))
        .unwrap_or_else(|| panic!("a segment {value}: {report}"))
}

/// Builds the log of known outcomes in `db`, against a simulator in `dir`.
fn known_log(dir: &Path, db: &Path) {
    let plan = r#"{"seed":1,"rules":[
        {"operation":"charge","fault":"decline","times":1},
        {"operation":"charge","fault":"timeout_after_effect","times":2,"ms":1500}]}"#;
    let sim = start_sim(dir, Some(plan));
    let url = Some(sim.url());
    let (code, out, _) = keel(db, url, &charge_on("metrics_declined", "order_m1", "1000"));
    assert_eq!((code, out["status"].as_str()), (2, Some("declined")), "{out}");
    let timeout = ["--provider-timeout-ms", "300"];
    let (code, out, _) = keel(db, url, &[&timeout[..], &charge_on("metrics_lost_answer", "order_m2", "2000")].concat());
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "{out}");
    let lost = out["intent_key"].as_str().expect("a key").to_owned();
    let no_lookup = ["--provider-timeout-ms", "300", "--provider-tier", "none"];
    let (code, out, _) = keel(db, url, &[&no_lookup[..], &charge_on("metrics_escalated", "order_m3", "3000")].concat());
    assert_eq!((code, out["status"].as_str()), (2, Some("escalated")), "{out}");
    for _ in 0..2 {
        let (code, out, _) = keel(db, url, &charge_on("metrics_paid_once", "order_m4", "4000"));
        assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");
    }
    let (code, out, _) = keel(db, url, &["reconcile", &lost]);
    assert_eq!(
        (code, out[0]["status"].as_str(), out[0]["source"].as_str()),
        (0, Some("validated"), Some("reconciled"))
    );
    for _ in 0..2 {
        let (code, out, _) = keel(db, None, &["agent", "run", "ticket-review", "--scenario", "budget"]);
        assert_eq!(out["status"], "model_budget", "{code} {out}");
    }
    let (code, out, _) = keel(db, None, &["agent", "run", "ticket-review", "--scenario", "complete"]);
    assert_eq!((code, out["status"].as_str()), (0, Some("completed")), "{out}");
}

#[test]
fn metrics_count_every_known_outcome_exactly() {
    let (dir, db) = temp();
    known_log(dir.path(), &db);

    let (code, report, stderr) = keel(&db, None, &["metrics"]);
    assert_eq!(code, 0, "{report} {stderr}");
    let all = &report["segments"][0];
    assert_eq!(report["segments"].as_array().map(Vec::len), Some(1), "unsegmented: one row: {report}");
    assert_eq!(all["intents"], 4, "declined, lost, escalated, paid: {all}");
    assert_eq!(all["validated"], 2, "paid by receipt, lost then found: {all}");
    assert_eq!(all["verified"], 2, "{all}");
    assert_eq!(all["outcome_verification_rate"], 1.0, "{all}");
    assert_eq!(all["ambiguous"], 1, "the escalated charge: {all}");
    assert_eq!(all["ambiguous_outcome_rate"], 0.25, "{all}");
    assert_eq!(all["retries_prevented"]["deduplicated"], 1, "{all}");
    assert_eq!(all["retries_prevented"]["reconciliation_found_effect"], 1, "{all}");
    assert_eq!(all["retries_prevented"]["total"], 2, "{all}");
    assert_eq!(all["runs"], 8, "five charge commands and three agent runs: {all}");
    assert_eq!(all["runs_stopped_by_budget"]["model_budget"], 2, "{all}");
    assert_eq!(all["runs_stopped_by_budget"]["tool_budget"], 0, "{all}");
    assert_eq!(all["time_to_definitive_outcome_ms"]["count"], 3, "declined, paid, found: {all}");
    let p50 = all["time_to_definitive_outcome_ms"]["p50"].as_i64().expect("a p50");
    let p99 = all["time_to_definitive_outcome_ms"]["p99"].as_i64().expect("a p99");
    assert!(p50 <= p99, "{all}");
    assert!(p99 >= 300, "the lost answer waited its 300 ms timeout before it was found: {all}");

    let (code, by_op, _) = keel(&db, None, &["metrics", "--by", "operation"]);
    assert_eq!(code, 0, "{by_op}");
    let charge = segment(&by_op, "charge");
    assert_eq!((charge["intents"].as_u64(), charge["validated"].as_u64()), (Some(4), Some(2)), "{by_op}");

    let (code, by_tool, _) = keel(&db, None, &["metrics", "--by", "tool"]);
    assert_eq!(code, 0, "{by_tool}");
    let charge = segment(&by_tool, "charge");
    assert_eq!(
        (charge["intents"].as_u64(), charge["runs"].as_u64()),
        (Some(4), Some(4)),
        "a workflow's own charges by their operation; a run under its first intent's tool: {by_tool}"
    );
    let runs: u64 = by_tool["segments"].as_array().expect("segments").iter().filter_map(|s| s["runs"].as_u64()).sum();
    assert_eq!(runs, 8, "the runs that reserved nothing of their own are counted too: {by_tool}");

    let (code, by_model, _) = keel(&db, None, &["metrics", "--by", "model"]);
    assert_eq!(code, 0, "{by_model}");
    let scripted = segment(&by_model, "scripted");
    assert_eq!(scripted["runs"], 3, "the agent runs record their model: {by_model}");
    assert_eq!(scripted["runs_stopped_by_budget"]["model_budget"], 2, "{by_model}");
    assert_eq!(scripted["intents"], 0, "{by_model}");

    let (code, by_release, _) = keel(&db, None, &["metrics", "--by", "release"]);
    assert_eq!(code, 0, "{by_release}");
    let release = segment(&by_release, env!("CARGO_PKG_VERSION"));
    assert_eq!((release["runs"].as_u64(), release["intents"].as_u64()), (Some(8), Some(4)), "{by_release}");

    let (code, later, _) = keel(&db, None, &["metrics", "--since", "2999-01-01T00:00:00Z"]);
    assert_eq!(code, 0, "{later}");
    assert_eq!((later["segments"][0]["intents"].as_u64(), later["segments"][0]["runs"].as_u64()), (Some(0), Some(0)));
}

#[test]
fn metrics_speak_prometheus_and_refuse_what_they_cannot_do() {
    let (dir, db) = temp();
    known_log(dir.path(), &db);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["metrics", "--prometheus", "--by", "operation"])
        .output()
        .expect("keel runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("# TYPE keel_outcome_verification_ratio gauge"), "{text}");
    assert!(text.contains("keel_ambiguous_outcome_ratio{operation=\"charge\"} 0.25"), "{text}");
    assert!(text.contains("keel_retries_prevented{operation=\"charge\"} 2"), "{text}");

    for bad in [&["metrics", "--by", "colour"][..], &["metrics", "--since", "yesterday"], &["metrics", "--prometheus"]]
    {
        let (code, out, stderr) = keel(&db, None, bad);
        assert_eq!(code, 64, "{bad:?} is a usage error: {out} {stderr}");
    }
    let (_missing_dir, missing) = temp();
    let (code, _, stderr) = keel(&missing, None, &["metrics"]);
    assert_eq!(code, 64, "a missing log is refused: {stderr}");
    assert!(!missing.exists(), "and not created");
}

#[test]
fn a_charge_proposed_again_while_its_answer_is_lost_is_a_refused_resend_in_every_format() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let url = Some(sim.url());
    let timeout = ["--provider-timeout-ms", "300"];
    let args = [&timeout[..], &charge_on("metrics_refused_resend", "order_r1", "2500")].concat();
    let (code, first, _) = keel(&db, url, &args);
    assert_eq!((code, first["status"].as_str()), (2, Some("outcome_unknown")), "{first}");
    let (code, again, stderr) = keel(&db, url, &args);
    assert_ne!(code, 0, "the second charge is not a success of its own: {again} {stderr}");
    let key = first["intent_key"].as_str().expect("a key");
    assert_eq!(again["intent_key"], key, "the same intent: {again}");
    assert_eq!(provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects").len(), 1, "one request");

    let (code, report, stderr) = keel(&db, None, &["metrics"]);
    assert_eq!(code, 0, "{report} {stderr}");
    let prevented = &report["segments"][0]["retries_prevented"];
    assert_eq!(prevented["refused_resends"], 1, "{report}");
    assert_eq!(prevented["deduplicated"], 0, "{report}");
    assert_eq!(prevented["total"], 1, "{report}");
    let (code, shown, _) = keel(&db, None, &["show", key]);
    assert_eq!(code, 0, "{shown}");
    let types: Vec<&str> =
        shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"ResendRefused"), "{types:?}");
    let (code, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "the rebuilt rows agree with the count: {verify}");

    let text = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--db")
            .arg(&db)
            .args(args)
            .output()
            .expect("keel runs");
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let human = text(&["metrics"]);
    assert!(human.contains("(0 deduplicated, 1 refused as a resend, 0 found by reconciliation)"), "{human}");
    let prometheus = text(&["metrics", "--prometheus"]);
    assert!(prometheus.contains("\nkeel_resends_refused 1\n"), "{prometheus}");
    assert!(prometheus.contains("\nkeel_retries_prevented 1\n"), "{prometheus}");
}
