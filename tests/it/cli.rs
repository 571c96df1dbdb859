//! The operator CLI end to end: exit codes, JSON contracts, nothing written on bad input,
//! `verify` catching tampering. Runs the real binaries against a real simulator process.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";
const TOKEN: &str = "pm_card_visa_4242424242";

/// A provider simulator process on an ephemeral port; killed on drop. `.1` is its URL.
pub(crate) struct Sim(Child, pub(crate) String);

impl Sim {
    pub(crate) fn start(dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel-provider-sim"))
            .args(["serve", "--db"])
            .arg(dir.join("sim.db"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("the simulator starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped")).read_line(&mut line).expect("a first line");
        let url = line.trim().strip_prefix("listening on ").expect("the simulator announces its address").to_owned();
        Self(child, url)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn keel(db: &Path, url: Option<&str>, args: &[&str]) -> (i32, Value, String) {
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

fn charge_args<'a>(intent_id: &'a str, amount: &'a str) -> Vec<&'a str> {
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
        TOKEN,
    ]
}

fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    (dir, db)
}

#[test]
fn a_charge_is_validated_then_deduplicated_then_a_mismatch_is_rejected() {
    let (dir, db) = temp();
    let sim = Sim::start(dir.path());
    let (code, first, _) = keel(&db, Some(&sim.1), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "{first}");
    let key = format!("charge:{TENANT}:order_1842_charge");
    assert_eq!(first["intent_key"], key.as_str());
    assert_eq!(first["status"], "validated");
    assert_eq!(first["source"], "provider");
    assert_eq!(first["attempts"], 1);

    let (code, again, _) = keel(&db, Some(&sim.1), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0);
    assert_eq!(again["source"], "deduplicated");

    let (code, mismatch, _) = keel(&db, Some(&sim.1), &charge_args("order_1842_charge", "9900"));
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
    let sim = Sim::start(dir.path());
    let input = dir.path().join("bad.json");
    std::fs::write(&input, format!(r#"{{"tenant_id":"{TENANT}","intent_id":"short","order_id":"o","amount_minor":-3,"currency":"GBP","payment_method_token":"{TOKEN}","extra":1}}"#))
        .expect("writes");
    let (code, out, _) = keel(&db, Some(&sim.1), &["charge", "--input", input.to_str().expect("utf-8 path")]);
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
}

#[test]
fn verify_names_a_tampered_event() {
    let (dir, db) = temp();
    let sim = Sim::start(dir.path());
    assert_eq!(keel(&db, Some(&sim.1), &charge_args("order_1842_charge", "4900")).0, 0);
    let connection = rusqlite::Connection::open(&db).expect("opens");
    let blocked = connection.execute("UPDATE events SET payload = '{}' WHERE seq = 3", []);
    assert!(blocked.is_err(), "events are append-only");
    connection.execute_batch("DROP TRIGGER events_no_update").expect("drops the trigger");
    connection
        .execute("UPDATE events SET payload = replace(payload, '4900', '4901') WHERE seq = 3", [])
        .expect("tampers");
    drop(connection);
    let (code, report, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 1);
    assert!(report["mismatches"][0].to_string().contains('3'), "{report}");
}
