//! The operator CLI end to end: exit codes, JSON contracts, nothing written on bad input,
//! `verify` catching tampering. Runs the real binaries against a real simulator process.

use provider_sim::Process;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use testkit::sample::{CARD_TOKEN, TENANT};

/// A simulator child process on `dir/sim.db` (the real `keel-provider-sim` binary), with a
/// fault plan when given.
pub(crate) fn start_sim(dir: &Path, plan: Option<&str>) -> Process {
    let binary = Command::new(env!("CARGO_BIN_EXE_keel-provider-sim"));
    Process::serve(binary, &dir.join("sim.db"), plan).unwrap_or_else(|e| panic!("the simulator starts: {e}"))
}

pub(crate) fn keel(db: &Path, url: Option<&str>, args: &[&str]) -> (i32, Value, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("--db").arg(db).arg("--json").env_remove("KEEL_PROVIDER_URL").env_remove("KEEL_DB");
    if let Some(url) = url {
        command.args(["--provider", url]);
    }
    let output = command.args(args).output().expect("keel runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), json, String::from_utf8_lossy(&output.stderr).to_string())
}

pub(crate) fn charge_args<'a>(intent_id: &'a str, amount: &'a str) -> Vec<&'a str> {
    vec![
        "charge",
        "--tenant",
        TENANT,
        "--intent-id",
        intent_id,
        "--order",
        "order_1842",
        "--amount-minor",
        amount,
        "--currency",
        "EUR",
        "--payment-method-token",
        CARD_TOKEN,
    ]
}

pub(crate) fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    (dir, db)
}

#[test]
fn a_charge_is_validated_then_deduplicated_then_a_mismatch_is_rejected() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, first, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "{first}");
    let key = format!("charge:{TENANT}:order_1842_charge");
    assert_eq!(first["intent_key"], key.as_str());
    assert_eq!(first["status"], "validated");
    assert_eq!(first["source"], "provider");
    assert_eq!(first["attempts"], 1);

    let (code, again, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0);
    assert_eq!(again["source"], "deduplicated");

    let (code, mismatch, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "9900"));
    assert_eq!(code, 2);
    assert_eq!(mismatch["status"], "rejected");
    assert_eq!(mismatch["code"], "intent_payload_mismatch");

    let (code, shown, _) = keel(&db, None, &["show", &key]);
    assert_eq!(code, 0);
    assert_eq!(shown["status"], "validated");
    let types: Vec<&str> =
        shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["IntentReserved", "AttemptStarted", "IntentValidated", "IntentDeduplicated"]);

    let effects = Command::new(env!("CARGO_BIN_EXE_keel-provider-sim"))
        .args(["effects", "--json", "--db"])
        .arg(dir.path().join("sim.db"))
        .output()
        .expect("effects runs");
    assert_eq!(String::from_utf8_lossy(&effects.stdout).lines().count(), 1, "one effect at the provider");

    let (code, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "{verify}");
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let input = dir.path().join("bad.json");
    std::fs::write(&input, format!(r#"{{"tenant_id":"{TENANT}","intent_id":"short","order_id":"o","amount_minor":-3,"currency":"GBP","payment_method_token":"{CARD_TOKEN}","extra":1}}"#))
        .expect("writes");
    let (code, out, _) = keel(&db, Some(sim.url()), &["charge", "--input", input.to_str().expect("utf-8 path")]);
    assert_eq!(code, 2);
    assert_eq!(out["code"], "invalid_arguments");
    let details = out["details"].to_string();
    for field in ["intent_id", "amount_minor", "currency", "extra"] {
        assert!(details.contains(field), "{field} is named in {details}");
    }
    let (_, intents, _) = keel(&db, None, &["intents"]);
    assert_eq!(intents, Value::Array(vec![]), "nothing was written");
    let (_, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(verify["events"], 0);
}

#[test]
fn usage_errors_exit_64() {
    let (_dir, db) = temp();
    assert_eq!(keel(&db, None, &["charge", "--amount-minor", "abc"]).0, 64);
    assert_eq!(keel(&db, None, &["intents", "--state", "bogus"]).0, 64);
    assert_eq!(keel(&db, None, &["show", "not-a-key"]).0, 64);
    assert_eq!(keel(&db, None, &["resolve", "charge:t:order_1842_charge", "--by", "ana", "--reason", "r"]).0, 64);
    let (code, _, stderr) = keel(&db, None, &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 64, "a charge without a provider is a usage error");
    assert!(stderr.contains("--provider"), "{stderr}");
    assert!(!db.exists(), "nothing was created");
}

#[test]
fn verify_names_a_tampered_event() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    assert_eq!(keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900")).0, 0);
    let connection = rusqlite::Connection::open(&db).expect("opens");
    let blocked = connection.execute("UPDATE events SET payload = '{}' WHERE seq = 3", []);
    assert!(blocked.is_err(), "events are append-only");
    connection.execute_batch("DROP TRIGGER events_no_update").expect("drops the trigger");
    connection.execute("UPDATE events SET at = at + 1 WHERE seq = 3", []).expect("tampers");
    drop(connection);
    let (code, report, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 1);
    assert!(report["mismatches"][0].to_string().contains('3'), "{report}");
}

#[test]
fn operator_decisions_are_refused_or_recorded_with_the_operators_name() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":3000}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let mut lost = charge_args("order_1900_charge", "2500");
    lost.extend(["--max-attempts", "3"]);
    let (code, unknown, _) = keel(&db, Some(sim.url()), &[&["--provider-timeout-ms", "300"][..], &lost].concat());
    assert_eq!(code, 2, "{unknown}");
    assert_eq!(unknown["status"], "outcome_unknown");
    let key = unknown["intent_key"].as_str().expect("a key").to_owned();

    let (code, refused, _) = keel(&db, None, &["cancel", &key, "--by", "ana", "--reason", "customer asked"]);
    assert_eq!(code, 2, "cancel is refused while the outcome is unknown: {refused}");
    let landed = provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects")[0].id.clone();
    let (code, resolved, _) = keel(
        &db,
        Some(sim.url()),
        &["resolve", &key, "--landed", &landed, "--by", "ana", "--reason", "in the dashboard"],
    );
    assert_eq!(code, 0, "{resolved}");
    assert_eq!(resolved["status"], "validated");
    let (_, shown, _) = keel(&db, None, &["show", &key]);
    let last = shown["events"].as_array().and_then(|e| e.last()).expect("events").clone();
    assert_eq!(last["type"], "IntentResolved");
    assert_eq!(last["cause"]["actor"], "operator:ana");
}

#[test]
fn an_approval_is_bound_to_the_fingerprint_and_a_denial_ends_the_intent() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let gated = |intent: &'static str| {
        let mut args = charge_args(intent, "5000");
        args.extend(["--approval-threshold-minor", "1000"]);
        args
    };
    let (code, waiting, _) = keel(&db, Some(sim.url()), &gated("order_1842_charge"));
    assert_eq!(code, 2, "{waiting}");
    assert_eq!(waiting["status"], "awaiting_approval");
    let key = waiting["intent_key"].as_str().expect("a key").to_owned();

    let wrong = "0".repeat(64);
    assert_eq!(keel(&db, None, &["approve", &key, "--by", "lead", "--fingerprint", &wrong]).0, 2);
    assert_eq!(keel(&db, None, &["approve", &key, "--by", "lead"]).0, 0);
    let (code, done, _) = keel(&db, Some(sim.url()), &gated("order_1842_charge"));
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["status"], "validated");

    let mut other = charge_args("order_1843_charge", "5000");
    other[6] = "order_1843";
    other.extend(["--approval-threshold-minor", "1000"]);
    let (_, waiting, _) = keel(&db, Some(sim.url()), &other);
    let denied_key = waiting["intent_key"].as_str().expect("a key").to_owned();
    let (code, denied, _) = keel(&db, None, &["deny", &denied_key, "--by", "lead", "--reason", "suspicious"]);
    assert_eq!(code, 0, "{denied}");
    assert_eq!(denied["status"], "rejected");
    let (code, after, _) = keel(&db, Some(sim.url()), &other);
    assert_eq!(code, 2);
    assert_eq!(after["status"], "rejected");
    let (_, intents, _) = keel(&db, None, &["intents", "--state", "validated"]);
    assert_eq!(intents.as_array().map(Vec::len), Some(1), "only the approved charge reached the provider");
}
