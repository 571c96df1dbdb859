//! An unknown outcome says why (issue 29): `keel charge` (JSON and human) and `keel serve`'s
//! 202 give the typed reason the log records and whether re-submitting the same request is
//! useful and safe — true while the outcome awaits reconciliation, false once escalated.
//! Through the real binaries, against the simulator with a timeout fault.

use crate::cli::{charge_args, keel, start_sim, temp};
use crate::serve::{Serve, bearer, charge_body, create_key};
use std::process::Command;
use testkit::sample::TENANT;

/// Two charges whose answers are held past the request timeout: the effects land, the answers
/// are lost.
const LOST: &str = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":2,"ms":1500}]}"#;

#[test]
fn a_charge_whose_answer_timed_out_says_timeout_and_retryable_in_json_and_in_words() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(LOST));
    let lost = [&["--provider-timeout-ms", "300"][..], &charge_args("order_lost_cli", "2500")].concat();
    let (code, unknown, _) = keel(&db, Some(sim.url()), &lost);
    assert_eq!((code, unknown["status"].as_str()), (2, Some("outcome_unknown")), "{unknown}");
    assert_eq!(
        (unknown["reason"].as_str(), unknown["retryable"].as_bool()),
        (Some("timeout"), Some(true)),
        "{unknown}"
    );

    // In words, for a human at a terminal: another charge, of another order, lost the same way.
    let mut again = charge_args("order_lost_cli_2", "2500");
    again[6] = "order_lost_cli_2";
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--provider", sim.url(), "--provider-timeout-ms", "300"])
        .args(&again)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .output()
        .expect("keel runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("outcome_unknown") && stdout.contains("reason timeout"), "{stdout}");
    assert!(stdout.contains("retryable: re-submit the same request"), "{stdout}");
}

#[test]
fn an_unknown_outcome_escalated_at_once_is_not_retryable() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(LOST));
    // A provider that neither deduplicates nor answers lookups: nothing can settle it but a human.
    let flags = ["--provider-timeout-ms", "300", "--provider-tier", "none"];
    let (code, escalated, _) =
        keel(&db, Some(sim.url()), &[&flags[..], &charge_args("order_lost_none", "2500")].concat());
    assert_eq!((code, escalated["status"].as_str()), (2, Some("escalated")), "{escalated}");
    assert_eq!(
        (escalated["reason"].as_str(), escalated["retryable"].as_bool()),
        (Some("timeout"), Some(false)),
        "{escalated}"
    );
}

#[test]
fn the_api_s_202_for_an_unknown_outcome_says_timeout_and_retryable() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), Some(LOST));
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let serve = Serve::start(&db, &sim, &["--provider-timeout-ms", "300"]);
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "lost_answer_29"),
        ("Content-Type", "application/json"),
    ];
    let (status, _, unknown) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_lost_api", 2500)));
    assert_eq!((status, unknown["status"].as_str()), (202, Some("outcome_unknown")), "{unknown}");
    assert_eq!(
        (unknown["reason"].as_str(), unknown["retryable"].as_bool()),
        (Some("timeout"), Some(true)),
        "{unknown}"
    );
    assert!(unknown["retry_after_s"].as_u64().is_some(), "{unknown}");
}
