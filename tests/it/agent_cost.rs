//! An agent run's model cost through the real binary (issue 12): a cost that cannot be
//! measured — an answer from a model without a price — is unknown in `keel run show`, `keel
//! trace` and `keel metrics`, never 0; a priced run's cost is exact.

use crate::agent::{fixture, keel, temp};
use serde_json::{Value, json};
use std::path::Path;

/// One minor unit per token, in and out: a run's cost is its tokens.
const PRICES: &str =
    r#"{"prices": {"claude-sonnet-4-5": {"input_minor_per_mtok": 1000000, "output_minor_per_mtok": 1000000}}}"#;

/// `keel --db DB ARGS`, for people (no `--json`): its stdout.
fn keel_text(db: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("KEEL_DB")
        .output()
        .expect("keel runs");
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a ticket review over `transcript` with `limits` (none: no prices); its run id.
fn review(db: &Path, transcript: &str, limits: Option<&str>, status: &str) -> String {
    let mut args = vec!["agent", "run", "ticket-review", "--transcript", transcript];
    args.extend(limits.map(|limits| ["--limits", limits]).into_iter().flatten());
    let (_, report) = keel(db, &args, &[]);
    assert_eq!(report["status"], status, "{report}");
    report["run_id"].as_str().expect("a run id").to_owned()
}

/// The budget counters of the trace's last agent fact (the run's stop).
fn last_counters(trace: &Value) -> Value {
    fn walk(node: &Value, last: &mut Option<(u64, Value)>) {
        if let Some(budget) = node.get("budget").filter(|b| !b.is_null()) {
            let seq = node["seq"].as_u64().expect("a seq");
            if last.as_ref().is_none_or(|(at, _)| seq > *at) {
                *last = Some((seq, budget.clone()));
            }
        }
        for child in node["children"].as_array().into_iter().flatten() {
            walk(child, last);
        }
    }
    let mut last = None;
    for root in trace["roots"].as_array().into_iter().flatten() {
        walk(root, &mut last);
    }
    last.map(|(_, budget)| budget).expect("an agent fact with counters")
}

#[test]
fn a_model_cost_without_a_price_is_unknown_in_run_show_trace_and_metrics_and_a_priced_one_is_exact() {
    let (dir, db) = temp();
    let complete = fixture("agent/ticket-review/complete.json");
    // The same review, its second answer from a model the table does not price.
    let mut answers: Value =
        serde_json::from_str(&std::fs::read_to_string(&complete).expect("the fixture")).expect("JSON");
    answers[1]["model"] = json!("unpriced-model");
    let mixed = dir.path().join("mixed.json");
    std::fs::write(&mixed, answers.to_string()).expect("writes the transcript");
    let mixed = mixed.display().to_string();

    let unpriced = review(&db, &complete, None, "completed");
    let priced = review(&db, &complete, Some(PRICES), "completed");
    // A priced run is bounded in cost: the answer it cannot price stops it before its next call.
    let half = review(&db, &mixed, Some(PRICES), "cost_budget");

    let model_cost = |run: &str| keel(&db, &["run", "show", run], &[]).1["model_cost"].clone();
    assert_eq!(model_cost(&unpriced), json!({"cost_minor": null, "unpriced_answers": 3}), "no price table");
    assert_eq!(
        model_cost(&priced),
        json!({"cost_minor": 412 + 38 + 412 + 38 + 520 + 12, "unpriced_answers": 0}),
        "every answer priced: its tokens at one minor unit each"
    );
    assert_eq!(model_cost(&half), json!({"cost_minor": null, "unpriced_answers": 1}), "one of two answers unpriced");
    let shown = keel_text(&db, &["run", "show", &unpriced]);
    assert!(shown.contains("model cost: unknown (3 answers without a price)"), "{shown}");
    let shown = keel_text(&db, &["run", "show", &priced]);
    assert!(shown.contains("model cost: 1432 minor units"), "{shown}");

    let counters = |run: &str| last_counters(&keel(&db, &["trace", run], &[]).1);
    let unknown = counters(&half);
    assert_eq!((unknown["cost_minor"].clone(), unknown["unpriced_answers"].clone()), (Value::Null, json!(1)));
    assert_eq!(counters(&priced)["cost_minor"], 1432);
    let traced = keel_text(&db, &["trace", &half]);
    assert!(traced.contains("cost unknown (1 answer without a price)"), "{traced}");

    // The spine recorded no cost for the two unknown runs: metrics sum the known one and
    // count the others.
    let (_, report) = keel(&db, &["metrics"], &[]);
    let all = &report["segments"][0];
    assert_eq!((all["runs"].as_u64(), all["cost_minor"].as_i64()), (Some(3), Some(1432)), "{all}");
    assert_eq!(all["cost_unknown_runs"], 2, "{all}");
    let text = keel_text(&db, &["metrics"]);
    assert!(text.contains("1432 minor units over 3 run(s); 2 run(s) of unknown cost"), "{text}");
    let scraped = keel_text(&db, &["metrics", "--prometheus"]);
    assert!(scraped.lines().any(|line| line == "keel_runs_cost_unknown 2"), "{scraped}");
}
