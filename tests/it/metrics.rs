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

/// `keel … charge` under the release `release` (`KEEL_RELEASE`), with `extra` flags before the
/// charge's own.
fn charge_under(db: &Path, url: &str, release: &str, intent_id: &str, extra: &[&str]) -> Value {
    let order = format!("order_{intent_id}");
    let mut args = vec!["--provider", url];
    args.extend(charge_on(intent_id, &order, "1000"));
    args.extend(extra);
    let (_, stdout, stderr) = crate::agent::keel_raw(db, &args, &[("KEEL_RELEASE", release)]);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout} {stderr}"))
}

#[test]
fn drift_names_the_release_from_which_a_rate_changed_and_by_how_much() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    // Release 2026.11: four charges, none submitted again. Release 2026.12: four charges, two
    // of them submitted again (a retry the log answers) — retries prevented per intent go
    // from 0 to a half.
    for n in 0..4 {
        let out = charge_under(&db, sim.url(), "2026.11", &format!("drift_old_{n:04}"), &[]);
        assert_eq!(out["status"], "validated", "{out}");
    }
    for n in 0..4 {
        let id = format!("drift_new_{n:04}");
        let out = charge_under(&db, sim.url(), "2026.12", &id, &[]);
        assert_eq!(out["status"], "validated", "{out}");
        if n < 2 {
            let again = charge_under(&db, sim.url(), "2026.12", &id, &[]);
            assert_eq!(again["source"], "deduplicated", "{again}");
        }
    }
    let (code, report, _) = keel(&db, None, &["metrics", "--drift"]);
    assert_eq!(code, 0, "{report}");
    let drift = report["drift"].as_array().expect("a list");
    assert_eq!(drift.len(), 1, "one rate moved, once: {report}");
    let moved = &drift[0];
    assert_eq!(
        (
            moved["dimension"].as_str(),
            moved["rate"].as_str(),
            moved["from_version"].as_str(),
            moved["to_version"].as_str()
        ),
        (Some("release"), Some("retries_prevented_rate"), Some("2026.11"), Some("2026.12")),
        "{moved}"
    );
    assert_eq!((moved["before"].as_f64(), moved["after"].as_f64()), (Some(0.0), Some(0.5)), "{moved}");

    let (code, figures, _) = keel(&db, None, &["metrics", "--by", "release"]);
    assert_eq!(code, 0);
    let new = segment(&figures, "2026.12");
    assert_eq!(new["retries_prevented"]["deduplicated"], 2, "{new}");
    assert_eq!(new["runs_stopped"]["cost_budget"]["runs"], 0, "{new}");
    assert_eq!(new["runs_stopped"]["cost_budget"]["proportion"].as_f64(), Some(0.0), "{new}");
    assert_eq!(new["runs_stopped"]["repeated_call"]["runs"], 0, "every stop reason is listed: {new}");
    assert!(new["cost_includes"].as_str().is_some_and(|text| text.contains("model calls")), "{new}");

    let human = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["metrics", "--drift"])
        .output()
        .expect("keel runs");
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("retries_prevented_rate went from 0.000 to 0.500 when release changed from 2026.11 to 2026.12"),
        "{text}"
    );
    let prometheus = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["metrics", "--prometheus"])
        .output()
        .expect("keel runs");
    let gauges = String::from_utf8_lossy(&prometheus.stdout);
    // The API answers the same drift to the tenant's read key.
    let reader = crate::serve::bearer(&crate::serve::create_key(&db, testkit::sample::TENANT, "read", "dash"));
    let serve = crate::serve::Serve::start(&db, &sim, &[]);
    let (status, _, api) = serve.call("GET", "/v1/metrics", &[("Authorization", &reader)], None);
    assert_eq!((status, &api["drift"]), (200, &report["drift"]), "{api}");
    assert!(
        gauges.contains(
            r#"keel_drift{dimension="release",rate="retries_prevented_rate",from="2026.11",to="2026.12"} 0.5"#
        ),
        "{gauges}"
    );
}

#[test]
fn a_release_name_that_cannot_be_a_label_is_refused_before_anything_is_written() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    for bad in ["", "two words", &"r".repeat(engine::limits::RELEASE_NAME_MAX_CHARS + 1)] {
        let mut args = vec!["--provider", sim.url()];
        args.extend(charge_on("drift_bad_release", "order_bad", "1000"));
        let (code, stdout, _) = crate::agent::keel_raw(&db, &args, &[("KEEL_RELEASE", bad)]);
        assert_eq!(code, 64, "{bad:?}: {stdout}");
        assert!(stdout.contains("KEEL_RELEASE"), "{stdout}");
        assert!(!db.exists(), "nothing is written");
    }
}
