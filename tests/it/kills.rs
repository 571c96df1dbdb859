//! Real process kills: `keel soak` SIGKILLs `keel` worker processes (and sometimes `keel
//! resume` itself) at seeded random moments while they run batches of charges and refunds
//! against a `keel-provider-sim` process with faults (colliding keys, a re-used key with
//! another amount, overdrawing refunds), restarts, heals, and checks every invariant.
//! CI delivers 300 kills here, with the payment-method vault on (`--vault`): the heal is
//! then only `keel resume` and `keel reconcile`, and nothing may be left unresolved; `keel
//! soak --kills N` runs as many as asked.

use serde_json::Value;
use std::process::Command;

#[test]
fn three_hundred_sigkills_break_no_invariant() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--json", "soak", "--kills", "300", "--seed", "20260101", "--vault", "--dir"])
        .arg(dir.path())
        .env_remove("KEEL_FAILPOINT")
        .output()
        .expect("keel soak runs");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    assert_eq!(output.status.code(), Some(0), "{report:#}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(report["kills"].as_u64().is_some_and(|k| k >= 300), "{report:#}");
    assert!(report["crash_unknowns"].as_u64().is_some_and(|n| n > 0), "some kills landed mid-attempt: {report:#}");
    assert_eq!(report["vault"], true, "{report:#}");
    assert!(report["fenced_late_answers"].as_u64().is_some(), "the late answers kept are counted: {report:#}");
    for counter in
        ["double_effects", "budget_refills", "unreconciled", "unresolved", "verify_failures", "blind_resends"]
    {
        assert_eq!(report[counter], 0, "{counter}: {report:#}");
    }
    assert_eq!(report["seed"], 20260101);
}
