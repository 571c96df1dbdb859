//! Controlled facts (seed 001) through the real `keel` binary: the seed's sequence as a
//! fixture (`fixtures/facts/seed-001.json`), every command a new process — so the facts
//! survive a restart, unlike the seed's — and every refusal: the whole batch refused, the
//! previous facts kept, the message saying there is no fallback, nothing written.

use crate::cli::{keel, temp};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// One step of a facts fixture: a user message applied, or a forget; then the facts expected
/// (key → [value, evidence]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    #[serde(default)]
    apply: Option<String>,
    #[serde(default, deserialize_with = "forget_field")]
    forget: Option<Option<String>>,
    expect: BTreeMap<String, (String, String)>,
}

/// `"forget": null` (everything) is not the same as no `forget` at all.
fn forget_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

fn facts_of(document: &Value) -> BTreeMap<String, (String, String)> {
    document["facts"]
        .as_array()
        .expect("a facts list")
        .iter()
        .map(|f| {
            let text = |n: &str| f[n].as_str().expect("a text field").to_owned();
            (text("key"), (text("value"), text("evidence")))
        })
        .collect()
}

fn show(db: &Path, conversation: &str) -> Value {
    let (code, shown, stderr) = keel(db, None, &["facts", "show", conversation]);
    assert_eq!(code, 0, "{shown} {stderr}");
    shown
}

fn events(db: &Path) -> u64 {
    let (_, verify, _) = keel(db, None, &["verify"]);
    verify["events"].as_u64().expect("verify counts events")
}

#[test]
fn the_seeds_sequence_corrects_forgets_and_survives_a_restart() {
    let (_dir, db) = temp();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/facts/seed-001.json");
    let steps: Vec<Step> = serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).expect("steps");
    for (n, step) in steps.iter().enumerate() {
        let (code, out, stderr) = match (&step.apply, &step.forget) {
            (Some(message), None) => keel(&db, None, &["facts", "apply", "ticket-42", "--message", message]),
            (None, Some(Some(key))) => keel(&db, None, &["facts", "forget", "ticket-42", key]),
            (None, Some(None)) => keel(&db, None, &["facts", "forget", "ticket-42"]),
            _ => panic!("step {n}: one of apply or forget"),
        };
        assert_eq!(code, 0, "step {n}: {out} {stderr}");
        assert_eq!(facts_of(&out), step.expect, "step {n}: what the command answers");
        assert_eq!(facts_of(&show(&db, "ticket-42")), step.expect, "step {n}: what a new process reads back");
        assert_eq!(out["unverified"], true, "facts are shown as unverified assertions");
    }
    let (code, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "{verify}");
    // Two batches and two forgets; the questions wrote nothing.
    assert_eq!(verify["events"], 4, "{verify}");
    // Another conversation shares nothing.
    assert!(facts_of(&show(&db, "ticket-43")).is_empty());
}

#[test]
fn every_bad_batch_is_refused_whole_keeps_the_previous_facts_and_writes_nothing() {
    let (dir, db) = temp();
    let (code, _, _) = keel(&db, None, &["facts", "apply", "c", "--message", "product=Keel; version=1.2"]);
    assert_eq!(code, 0);
    let before = facts_of(&show(&db, "c"));
    let written = events(&db);
    let candidates = |name: &str, json: &str| {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, json).expect("written");
        path.to_str().expect("utf-8").to_owned()
    };
    let long_value = format!("log={}", "x".repeat(257));
    let long_message = format!("module=Billing {}", "y".repeat(4_096));
    let wrong_evidence = candidates(
        "wrong_evidence",
        r#"[{"key": "module", "value": "Billing", "evidence": "module=Billing, I think"}]"#,
    );
    let not_in_evidence =
        candidates("not_in_evidence", r#"[{"key": "module", "value": "Billing", "evidence": "module"}]"#);
    let guessed = candidates("guessed", r#"[{"key": "module", "value": "Bill", "evidence": "module=Billing"}]"#);
    let duplicate = candidates(
        "duplicate",
        r#"[{"key": "module", "value": "Billing", "evidence": "module=Billing"},
            {"key": "module", "value": "Billing", "evidence": "module=Billing"}]"#,
    );
    let missing = candidates("missing", r#"[{"key": "module", "value": "Billing", "evidence": ""}]"#);
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("an unknown key", vec!["--message", "module=Billing; colour=blue"], "colour"),
        ("six facts", vec!["--message", "product=a; module=b; priority=c; database=d; version=e; log=f"], "6 facts"),
        ("a value too long", vec!["--message", &long_value], "256"),
        ("a message too long", vec!["--message", &long_message], "4096"),
        ("an evidence not quoted", vec!["--message", "module=Billing", "--candidates", &wrong_evidence], "exact quote"),
        (
            "a value not in its evidence",
            vec!["--message", "module=Billing", "--candidates", &not_in_evidence],
            "evidence",
        ),
        ("a semantic guess", vec!["--message", "module=Billing", "--candidates", &guessed], "no semantic guess"),
        ("a duplicate candidate", vec!["--message", "module=Billing", "--candidates", &duplicate], "twice"),
        ("a missing evidence", vec!["--message", "module=Billing", "--candidates", &missing], "evidence"),
        ("a stale ticket", vec!["--message", "module=Billing", "--ticket", "0:0"], "stale"),
    ];
    for (name, extra, needle) in cases {
        let mut args = vec!["facts", "apply", "c"];
        args.extend(extra);
        let (code, out, _) = keel(&db, None, &args);
        assert_eq!((code, out["status"].as_str()), (2, Some("refused")), "{name}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains(needle), "{name}: names {needle:?}: {error}");
        assert!(error.contains("no fallback") || error.contains("stale"), "{name}: says there is no fallback: {error}");
        assert_eq!(facts_of(&show(&db, "c")), before, "{name}: the previous facts are kept");
        assert_eq!(events(&db), written, "{name}: nothing is written");
    }
    // An update taken before a forget cannot bring a forgotten fact back.
    let ticket = show(&db, "c")["ticket"].as_str().expect("a ticket").to_owned();
    assert_eq!(keel(&db, None, &["facts", "forget", "c", "version"]).0, 0);
    let (code, out, _) = keel(&db, None, &["facts", "apply", "c", "--message", "version=1.2", "--ticket", &ticket]);
    assert_eq!(code, 2, "{out}");
    assert!(!facts_of(&show(&db, "c")).contains_key("version"), "the forgotten fact stays forgotten");
    let (code, out, _) = keel(&db, None, &["facts", "forget", "c", "colour"]);
    assert_eq!((code, out["status"].as_str()), (2, Some("refused")), "{out}");
}

#[test]
fn bad_invocations_are_usage_errors_that_write_nothing() {
    let (_dir, db) = temp();
    for args in [
        vec!["facts", "apply", "", "--message", "module=Billing"],
        vec!["facts", "apply", "a b", "--message", "module=Billing"],
        vec!["facts", "apply", "c", "--message", "module=Billing", "--ticket", "one:two"],
        vec!["facts", "apply", "c", "--message", "module=Billing", "--candidates", "/nonexistent.json"],
        vec!["facts", "show", "a b"],
    ] {
        let (code, out, _) = keel(&db, None, &args);
        assert_eq!((code, out["status"].as_str()), (64, Some("usage_error")), "{args:?}: {out}");
        assert!(!db.exists(), "{args:?}: nothing is written");
    }
}

#[test]
fn a_new_key_past_five_evicts_the_oldest_turn_first() {
    let (_dir, db) = temp();
    for message in ["version=1; product=Keel", "module=Billing; database=PG; log=none", "symptom=slow"] {
        assert_eq!(keel(&db, None, &["facts", "apply", "e", "--message", message]).0, 0, "{message}");
    }
    let facts = facts_of(&show(&db, "e"));
    assert_eq!(facts.len(), 5);
    assert!(!facts.contains_key("product"), "turn 0's first key ordinally went: {facts:?}");
    assert!(facts.contains_key("version") && facts.contains_key("symptom"), "{facts:?}");
}
