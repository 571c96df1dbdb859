//! Bounded by default, and the operator's policy, through the real `keel` binary: every run
//! records the limits and the policy (version, hash) it ran under; a policy file is checked
//! at start (a bad one is a usage error naming its line or field, with nothing written); its
//! per-tenant and per-operation rules hold; a caller's flag tightens it and never loosens it.

use crate::cli::{charge_args, keel, start_sim, temp};
use engine::event::{Event, RunId, RunLimits};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use testkit::sample::TENANT;

const OTHER_TENANT: &str = "00000000-0000-4000-8000-00000000beef";

/// The limits run `run_id` recorded in its `RunStarted`.
pub(crate) fn run_limits(db: &Path, run_id: &str) -> RunLimits {
    let reader = store::Reader::open(db).expect("the log opens");
    let events = reader.stream(&RunId::new(run_id).stream()).expect("the run's stream");
    match &events.first().expect("the run has events").event {
        Event::RunStarted { limits, .. } => limits.clone(),
        other => panic!("a run starts with RunStarted, not {other:?}"),
    }
}

fn write_policy(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the policy is written");
    path.to_str().expect("a UTF-8 path").to_owned()
}

fn sha256_of(path: &str) -> String {
    engine::canonical::sha256_hex(&std::fs::read(path).expect("the policy reads back"))
}

/// `args` with `--order` set to `order` (one order per charge: a pending one blocks its order).
fn on_order<'a>(mut args: Vec<&'a str>, order: &'a str) -> Vec<&'a str> {
    let at = args.iter().position(|a| *a == "--order").expect("the args name an order") + 1;
    args[at] = order;
    args
}

fn with_policy<'a>(policy: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--policy", policy];
    all.extend_from_slice(args);
    all
}

const POLICY: &str = r#"
# The operator's policy (keel.toml).
version = "2026-12-01.1"

[defaults]
max_amount_minor = 5000
run_budget_minor = 20000
currencies = ["EUR", "usd"]

[operations.refund]
max_amount_minor = 3000

[tenants."TENANT".defaults]
max_amount_minor = 1000

[tenants."TENANT".operations.charge]
approval_threshold_minor = 800
"#;

fn policy_text() -> String {
    POLICY.replace("TENANT", &TENANT.to_ascii_uppercase())
}

#[test]
fn without_a_policy_a_run_is_bounded_by_the_builtin_one_and_records_it() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, out, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_default", "4900"));
    assert_eq!(code, 0, "{out} {stderr}");
    assert_eq!(out["policy"]["version"], "builtin", "{out}");
    let limits = run_limits(&db, out["run_id"].as_str().expect("a run id"));
    assert_eq!(limits.cost_minor_max, Some(engine::limits::RUN_COST_DEFAULT_MINOR), "money is bounded by default");
    assert_eq!(limits.network_retries_max, Some(engine::limits::NETWORK_RETRIES_PER_RUN_MAX), "so are network retries");
    assert_eq!(limits.reconciliations_max, Some(engine::limits::RECONCILIATIONS_PER_RUN_DEFAULT), "and lookups");
    let stamp = limits.policy.expect("the run records its policy");
    assert_eq!((stamp.version.as_str(), stamp.sha256.len()), ("builtin", 64));

    // The built-in maximum holds without any flag.
    let over = (engine::limits::EFFECT_AMOUNT_DEFAULT_MAX_MINOR + 1).to_string();
    let (code, out, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_default_over", &over));
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
}

#[test]
fn a_policy_file_decides_per_tenant_and_operation_and_every_run_records_it() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let policy = write_policy(dir.path(), "policy.toml", &policy_text());

    // The tenant's own maximum (1000), not the file's (5000).
    let (code, out, _) = keel(&db, Some(sim.url()), &with_policy(&policy, &charge_args("order_1842_pol_over", "1500")));
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
    assert!(out["details"].to_string().contains("1000"), "the refusal names the maximum: {out}");

    // Under it, above the tenant's charge approval threshold (800): it waits for a human.
    let (code, out, _) = keel(
        &db,
        Some(sim.url()),
        &with_policy(&policy, &on_order(charge_args("order_1842_pol_gated", "900"), "o_gated")),
    );
    assert_eq!((code, out["status"].as_str()), (2, Some("awaiting_approval")), "{out}");
    let limits = run_limits(&db, out["run_id"].as_str().expect("a run id"));
    assert_eq!((limits.cost_minor_max, limits.approval_threshold_minor), (Some(20_000), Some(800)));
    let stamp = limits.policy.expect("the run records its policy");
    assert_eq!(stamp.version, "2026-12-01.1");
    assert_eq!(stamp.sha256, sha256_of(&policy), "the hash is the file's: `sha256sum` gives it");
    assert_eq!(out["policy"]["sha256"], stamp.sha256.as_str(), "and the JSON output says it");

    let (code, out, _) = keel(&db, Some(sim.url()), &with_policy(&policy, &charge_args("order_1842_pol_ok", "700")));
    assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");

    // A currency outside the allowed ones.
    let mut xof = on_order(charge_args("order_1842_pol_xof", "700"), "o_xof");
    let at = xof.iter().position(|a| *a == "EUR").expect("charge_args names EUR");
    xof[at] = "XOF";
    let (code, out, _) = keel(&db, Some(sim.url()), &with_policy(&policy, &xof));
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
    assert!(out["details"].to_string().contains("EUR, USD"), "the refusal names what is allowed: {out}");

    // Another tenant gets the file's defaults, not this tenant's section.
    let mut other = on_order(charge_args("order_1842_pol_other", "4000"), "o_other");
    let at = other.iter().position(|a| *a == TENANT).expect("charge_args names the tenant");
    other[at] = OTHER_TENANT;
    let (code, out, _) = keel(&db, Some(sim.url()), &with_policy(&policy, &other));
    assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");

    // A refund is held to the refund section (3000) for the other tenant.
    let refund = |intent: &'static str, amount: &'static str| {
        vec![
            "refund",
            "--tenant",
            OTHER_TENANT,
            "--intent-id",
            intent,
            "--order",
            "order_1842",
            "--amount-minor",
            amount,
            "--currency",
            "EUR",
        ]
    };
    let (code, out, _) = keel(&db, Some(sim.url()), &with_policy(&policy, &refund("order_1842_pol_refund", "3500")));
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
}

#[test]
fn a_flag_may_tighten_the_policy_and_never_loosen_it() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let policy = write_policy(dir.path(), "policy.toml", &policy_text());
    for (flag, value) in
        [("--max-charge-minor", "1001"), ("--cost-budget-minor", "20001"), ("--approval-threshold-minor", "801")]
    {
        let mut args = with_policy(&policy, &charge_args("order_1842_loosen", "500"));
        args.extend([flag, value]);
        let (code, out, _) = keel(&db, Some(sim.url()), &args);
        assert_eq!(code, 64, "{flag} {value}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains(flag) && error.contains("loosen"), "{flag}: {error}");
        assert!(error.contains("2026-12-01.1"), "the refusal names the policy version: {error}");
        assert!(!db.exists(), "{flag}: nothing is written");
    }
    // The run-level retry and reconciliation budgets have their bounds too.
    for (flag, value) in [("--max-network-retries", "101"), ("--max-run-reconciliations", "10001")] {
        let mut args = charge_args("order_1842_loosen", "500");
        args.extend([flag, value]);
        let (code, out, _) = keel(&db, Some(sim.url()), &args);
        assert_eq!(code, 64, "{flag} {value}: {out}");
        assert!(!db.exists(), "{flag}: nothing is written");
    }
    // Without a policy file the built-in policy is the ceiling.
    let over = (engine::limits::RUN_COST_DEFAULT_MINOR + 1).to_string();
    let mut args = charge_args("order_1842_loosen", "500");
    args.extend(["--cost-budget-minor", &over]);
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!(code, 64, "{out}");
    assert!(out["error"].as_str().is_some_and(|e| e.contains("builtin")), "{out}");
    assert!(!db.exists(), "nothing is written");

    // Tighter flags apply and are recorded.
    let mut args = with_policy(&policy, &charge_args("order_1842_tighter", "600"));
    args.extend(["--max-charge-minor", "500"]);
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
    let mut args = with_policy(&policy, &charge_args("order_1842_tighter_budget", "600"));
    args.extend(["--cost-budget-minor", "100"]);
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!((code, out["code"].as_str()), (2, Some("budget_exhausted")), "{out}");
    assert_eq!(out["run_status"], "cost_budget", "the run stops naming its money budget: {out}");
}

#[test]
fn a_malformed_policy_is_a_usage_error_naming_its_line_or_field_and_writes_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let cases = [
        ("unknown top-level field", "version = \"v\"\nmax_amount = 5\n", vec!["line 2", "max_amount"]),
        (
            "unknown field in a section",
            "version = \"v\"\n\n[defaults]\nmax_amount_minor = 5\napproval = 1\n",
            vec!["line 5", "approval"],
        ),
        ("unknown operation", "version = \"v\"\n[operations.payout]\nmax_amount_minor = 5\n", vec!["payout"]),
        ("not TOML", "version = \"v\"\n[defaults\n", vec!["line 2"]),
        ("no version", "[defaults]\nmax_amount_minor = 5\n", vec!["version"]),
        ("a string for a number", "version = \"v\"\n[defaults]\nmax_amount_minor = \"5\"\n", vec!["line 3"]),
        (
            "a negative amount",
            "version = \"v\"\n[defaults]\nrun_budget_minor = -1\n",
            vec!["defaults.run_budget_minor"],
        ),
        (
            "an amount past the bound",
            "version = \"v\"\n[operations.charge]\nmax_amount_minor = 1000000000001\n",
            vec!["operations.charge.max_amount_minor"],
        ),
        ("a bad currency", "version = \"v\"\n[defaults]\ncurrencies = [\"EURO\"]\n", vec!["defaults.currencies"]),
        ("a tenant that is not a UUID", "version = \"v\"\n[tenants.acme.defaults]\n", vec!["tenants", "UUID"]),
        ("the reserved version", "version = \"builtin\"\n", vec!["version"]),
    ];
    for (name, text, needles) in cases {
        let policy = write_policy(dir.path(), "bad.toml", text);
        let (code, out, _) =
            keel(&db, Some(sim.url()), &with_policy(&policy, &charge_args("order_1842_badpol", "500")));
        assert_eq!(code, 64, "{name}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains("bad.toml"), "{name}: the error names the file: {error}");
        for needle in needles {
            assert!(error.contains(needle), "{name}: the error names {needle:?}: {error}");
        }
        assert!(!db.exists(), "{name}: nothing is written");
    }
    let missing = dir.path().join("missing.toml");
    let args = with_policy(missing.to_str().expect("utf-8"), &charge_args("order_1842_badpol", "500"));
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    assert_eq!(code, 64, "{out}");
    assert!(!db.exists(), "a missing policy file writes nothing");
}

#[test]
fn keel_toml_in_the_working_directory_is_the_policy_when_no_flag_names_one() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    write_policy(dir.path(), "keel.toml", &policy_text());
    let run = |args: &[&str]| -> (i32, Value) {
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .current_dir(dir.path())
            .args(["--db", db.to_str().expect("utf-8"), "--json", "--provider", sim.url()])
            .env_remove("KEEL_POLICY")
            .args(args)
            .output()
            .expect("keel runs");
        let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (output.status.code().unwrap_or(-1), json)
    };
    let (code, out) = run(&charge_args("order_1842_cwd_over", "1500"));
    assert_eq!((code, out["code"].as_str()), (2, Some("policy_denied")), "{out}");
    let (code, out) = run(&charge_args("order_1842_cwd_ok", "700"));
    assert_eq!((code, out["policy"]["version"].as_str()), (0, Some("2026-12-01.1")), "{out}");
}

// ----- the deadline bounds the provider call ------------------------------------------------------

/// The intent's state and its event types, from `keel show`.
fn shown(db: &Path, key: &str) -> (String, Vec<String>) {
    let (_, shown, _) = keel(db, None, &["show", key]);
    let types = shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).map(String::from);
    (shown["status"].as_str().unwrap_or_default().to_owned(), types.collect())
}

#[test]
fn an_effect_is_not_started_when_the_time_left_cannot_cover_its_reconciliation_and_is_released() {
    let (dir, db) = temp();
    // The issue's case: a 3 s deadline, a provider 4 s slow, its 5 s request timeout.
    let sim =
        start_sim(dir.path(), Some(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 4000}]}"#));
    let hurried = |intent: &'static str, deadline: &'static str, timeout: &'static str| {
        let mut args = vec!["--provider-timeout-ms", timeout];
        args.extend(charge_args(intent, "4900"));
        args.extend(["--deadline-ms", deadline]);
        args
    };
    let started = std::time::Instant::now();
    let (code, out, stderr) = keel(&db, Some(sim.url()), &hurried("order_1842_hurried", "3000", "5000"));
    assert_eq!(code, 2, "{out} {stderr}");
    assert_eq!(out["run_status"], "deadline_exceeded", "{out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "nothing waited on the slow provider");
    let key = format!("charge:{TENANT}:order_1842_hurried");
    let (status, types) = shown(&db, &key);
    assert_eq!(status, "rejected", "released, not left reserved: {types:?}");
    assert_eq!(types, ["IntentReserved", "IntentReleased"], "never written ahead, never sent");
    assert!(provider_sim::list_effects(&dir.path().join("sim.db")).expect("effects").is_empty());

    // The reserve is the request timeout plus the first backoff (5 s + 1 s), not a fixed 2 s:
    // 5.9 s is not enough either.
    let (code, out, _) = keel(&db, Some(sim.url()), &hurried("order_1842_hurried_2", "5900", "5000"));
    assert_eq!((code, out["run_status"].as_str()), (2, Some("deadline_exceeded")), "{out}");

    // Its money and its order reference are free: the same order, with the time, is charged.
    let (code, out, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_in_time", "4900"));
    assert_eq!((code, out["status"].as_str()), (0, Some("validated")), "{out}");
    let (code, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "{verify}");
}

#[test]
fn a_slow_provider_never_validates_past_the_deadline() {
    let (dir, db) = temp();
    let sim =
        start_sim(dir.path(), Some(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 2500}]}"#));
    // 2 s timeout + 1 s backoff = 3 s reserve: a 3.2 s deadline lets the attempt start, and the
    // 2.5 s slow answer is cut by the request timeout, before the deadline.
    let mut args = vec!["--provider-timeout-ms", "2000"];
    args.extend(charge_args("order_1842_slow", "4900"));
    args.extend(["--deadline-ms", "3200"]);
    let started = std::time::Instant::now();
    let (code, out, _) = keel(&db, Some(sim.url()), &args);
    let took = started.elapsed();
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "{out}");
    assert!(took < std::time::Duration::from_millis(3_200), "the call ended before the deadline: {took:?}");
    let key = format!("charge:{TENANT}:order_1842_slow");
    let (status, types) = shown(&db, &key);
    assert_eq!(status, "outcome_unknown", "{types:?}");
    assert!(!types.contains(&"IntentValidated".to_owned()), "no validation after the deadline: {types:?}");
}
