//! An adversarial pass over the policy and the operator's commands (issue 22, part B),
//! through the real `keel` binary: a policy installed while a run waits holds it when it
//! resumes (the stricter of the two, never the looser), a run waiting on a signal stops at its
//! deadline, operator text is never blank, a policy value the door would refuse is refused,
//! and an API key's id and name cannot be confused.

use crate::cli::{charge_args, keel, start_sim, temp};
use engine::event::{Event, StoredEvent};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use testkit::sample::TENANT;

/// Every event of the log, through a reader.
fn events(db: &Path) -> Vec<StoredEvent> {
    store::Reader::open(db).expect("a reader").events_since(0).expect("the events")
}

fn write_policy(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the policy is written");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// `keel --policy POLICY refund … --after-signal goods_returned` of `amount` on order_1842:
/// the run waits, and its id is returned.
fn refund_waiting(db: &Path, sim: &str, policy: &str, intent_id: &str, amount: &str) -> String {
    let args = [
        "--policy",
        policy,
        "refund",
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
        "--after-signal",
        "goods_returned",
    ];
    let (code, waiting, stderr) = keel(db, Some(sim), &args);
    assert_eq!((code, waiting["run_status"].as_str()), (2, Some("suspended")), "{waiting} {stderr}");
    waiting["run_id"].as_str().expect("the run is recorded").to_owned()
}

fn signal(db: &Path, run_id: &str) {
    let (code, sent, stderr) = keel(db, None, &["signal", run_id, "goods_returned", "--by", "ana"]);
    assert_eq!((code, sent["status"].as_str()), (0, Some("delivered")), "{sent} {stderr}");
}

/// The resumed run `run_id` in a `keel resume` report.
fn resumed<'a>(report: &'a Value, run_id: &str) -> &'a Value {
    let runs = report["resumed"].as_array().expect("a list of resumed runs");
    runs.iter().find(|run| run["run_id"] == run_id).unwrap_or_else(|| panic!("{run_id} resumed: {report}"))
}

/// The policy stamp the reservation of `intent_id` records, if it records one.
fn reserved_under(db: &Path, intent_id: &str) -> Option<engine::policy::PolicyStamp> {
    events(db).into_iter().find_map(|stored| match stored.event {
        Event::IntentReserved { intent, policy, .. } if intent.intent_id == intent_id => Some(policy),
        _ => None,
    })?
}

/// The status of refund `intent_id`, `absent` when it was never reserved.
fn intent_status(db: &Path, intent_id: &str) -> String {
    let (_, shown, _) = keel(db, None, &["show", &format!("refund:{TENANT}:{intent_id}")]);
    match shown["reason"].as_str() {
        Some("not_found") => "absent".to_owned(),
        _ => shown["status"].as_str().expect("a status").to_owned(),
    }
}

const LOOSE: &str = "version = \"loose\"\n[defaults]\nmax_amount_minor = 8000\n";

const STRICT: &str = "version = \"strict\"\n[operations.refund]\nmax_amount_minor = 2500\n\
                      approval_threshold_minor = 1000\nrun_budget_minor = 2000\n";

// ----- item 1: a policy installed while a run waits ----------------------------------------

#[test]
fn a_policy_tightened_while_a_refund_waits_holds_it_when_it_resumes_and_is_recorded() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (loose, strict) =
        (write_policy(dir.path(), "loose.toml", LOOSE), write_policy(dir.path(), "strict.toml", STRICT));
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    // Each refund is within the loose policy, and waits on a signal.
    let over_max = refund_waiting(&db, sim.url(), &loose, "refund_over_max", "3000");
    let over_threshold = refund_waiting(&db, sim.url(), &loose, "refund_over_threshold", "1800");
    let over_budget = refund_waiting(&db, sim.url(), &loose, "refund_over_budget", "2200");
    for run_id in [&over_max, &over_threshold, &over_budget] {
        signal(&db, run_id);
    }

    // The operator installed the strict policy meanwhile: the runs resume under it.
    let (code, report, stderr) = keel(&db, Some(sim.url()), &["--policy", &strict, "resume"]);
    assert_eq!(code, 0, "{report} {stderr}");

    let refused = resumed(&report, &over_max);
    assert_eq!(refused["status"], "rejected", "3000 is above the new maximum of 2500: {refused}");
    let detail = refused["output"].to_string();
    assert!(detail.contains("policy_denied") && detail.contains("2500"), "{detail}");
    assert!(
        detail.contains("strict") && detail.contains(&engine::canonical::sha256_hex(STRICT.as_bytes())),
        "{detail}"
    );
    assert_eq!(intent_status(&db, "refund_over_max"), "absent", "nothing reserved");

    assert_eq!(intent_status(&db, "refund_over_threshold"), "awaiting_approval", "1800 is above the new threshold");
    let stamp = reserved_under(&db, "refund_over_threshold").expect("the reservation records the policy in force");
    assert_eq!((stamp.version.as_str(), stamp.sha256), ("strict", engine::canonical::sha256_hex(STRICT.as_bytes())));

    let budget = resumed(&report, &over_budget);
    assert_eq!(budget["status"], "cost_budget", "2200 is above the new run budget of 2000: {budget}");
    assert!(budget["output"].to_string().contains("budget_exhausted"), "{budget}");
    assert_eq!(intent_status(&db, "refund_over_budget"), "absent", "nothing reserved");
}

#[test]
fn a_looser_policy_installed_while_a_refund_waits_does_not_loosen_it() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (loose, strict) =
        (write_policy(dir.path(), "loose.toml", LOOSE), write_policy(dir.path(), "strict.toml", STRICT));
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let over_threshold = refund_waiting(&db, sim.url(), &strict, "refund_over_threshold", "1800");
    let run_budget = refund_waiting(&db, sim.url(), &strict, "refund_within_max", "2400");
    signal(&db, &over_threshold);
    signal(&db, &run_budget);

    let (code, report, stderr) = keel(&db, Some(sim.url()), &["--policy", &loose, "resume"]);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(
        intent_status(&db, "refund_over_threshold"),
        "awaiting_approval",
        "the threshold the run started with still holds: {report}"
    );
    let stamp = reserved_under(&db, "refund_over_threshold").expect("decided under the loose policy too");
    assert_eq!(stamp.version, "loose");
    let budget = resumed(&report, &run_budget);
    assert_eq!(budget["status"], "cost_budget", "the run's own budget of 2000 still holds: {budget}");
    assert!(budget["output"].to_string().contains("budget_exhausted"), "{budget}");
}

#[test]
fn keel_worker_holds_a_waiting_refund_to_the_policy_installed_meanwhile() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (loose, strict) =
        (write_policy(dir.path(), "loose.toml", LOOSE), write_policy(dir.path(), "strict.toml", STRICT));
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let run_id = refund_waiting(&db, sim.url(), &loose, "refund_over_threshold", "1800");
    signal(&db, &run_id);
    let (code, _, stderr) = keel(&db, Some(sim.url()), &["--policy", &strict, "worker", "--once", "--poll-ms", "50"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(intent_status(&db, "refund_over_threshold"), "awaiting_approval", "1800 is above the new threshold");
    let stamp = reserved_under(&db, "refund_over_threshold").expect("the reservation records the policy in force");
    assert_eq!(stamp.version, "strict");
}

#[test]
fn keel_serve_holds_the_runs_it_resumes_to_the_policy_it_was_started_with() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (loose, strict) =
        (write_policy(dir.path(), "loose.toml", LOOSE), write_policy(dir.path(), "strict.toml", STRICT));
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let run_id = refund_waiting(&db, sim.url(), &loose, "refund_over_threshold", "1800");
    signal(&db, &run_id);
    let serve = crate::serve::Serve::start(&db, &sim, &["--policy", &strict]);
    assert_eq!(intent_status(&db, "refund_over_threshold"), "awaiting_approval", "1800 is above the new threshold");
    let stamp = reserved_under(&db, "refund_over_threshold").expect("the reservation records the policy in force");
    assert_eq!(stamp.version, "strict");
    assert_eq!(serve.stop(), 0);
}

#[test]
fn a_run_resumed_under_its_own_policy_records_nothing_more() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let loose = write_policy(dir.path(), "loose.toml", LOOSE);
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let run_id = refund_waiting(&db, sim.url(), &loose, "refund_same_policy", "3000");
    signal(&db, &run_id);
    let (code, report, stderr) = keel(&db, Some(sim.url()), &["--policy", &loose, "resume"]);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(resumed(&report, &run_id)["status"], "completed", "{report}");
    assert_eq!(reserved_under(&db, "refund_same_policy"), None, "its RunStarted already says which policy");
}

// ----- item 3: a wait past the run's deadline ----------------------------------------------

/// `keel refund … HOLD --deadline-ms 1500` of 1000 on order_1842: the run waits, and its id is
/// returned.
fn refund_held(db: &Path, sim: &str, intent_id: &str, hold: &[&str]) -> String {
    let mut args = vec!["refund", "--tenant", TENANT, "--intent-id", intent_id, "--order", "order_1842"];
    args.extend(["--amount-minor", "1000", "--currency", "EUR", "--deadline-ms", "1500"]);
    args.extend(hold);
    let (code, waiting, stderr) = keel(db, Some(sim), &args);
    assert_eq!((code, waiting["run_status"].as_str()), (2, Some("suspended")), "{waiting} {stderr}");
    waiting["run_id"].as_str().expect("the run is recorded").to_owned()
}

fn run_status(db: &Path, run_id: &str) -> String {
    let (code, shown, stderr) = keel(db, None, &["run", "show", run_id]);
    assert_eq!(code, 0, "{shown} {stderr}");
    shown["status"].as_str().expect("a status").to_owned()
}

#[test]
fn a_run_waiting_past_its_deadline_ends_deadline_exceeded_and_a_late_signal_is_refused() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let started = std::time::Instant::now();
    let never_signalled = refund_held(&db, sim.url(), "refund_never_signalled", &["--after-signal", "goods_returned"]);
    let signalled_late = refund_held(&db, sim.url(), "refund_signalled_late", &["--after-signal", "goods_returned"]);
    let in_time = refund_held(&db, sim.url(), "refund_signalled_in_time", &["--after-signal", "goods_returned"]);
    let timer = refund_held(&db, sim.url(), "refund_on_a_timer", &["--delay-ms", "1200"]);
    signal(&db, &in_time);
    // A deadline is an instant on the wall clock: only waiting past it can show what happens then.
    std::thread::sleep(Duration::from_millis(1_600).saturating_sub(started.elapsed()));

    let before = events(&db).len();
    let (code, late, _) = keel(&db, None, &["signal", &signalled_late, "goods_returned", "--by", "ana"]);
    assert_eq!((code, late["status"].as_str()), (2, Some("refused")), "{late}");
    let error = late["error"].as_str().unwrap_or_default();
    assert!(error.contains("deadline") && error.contains("too late"), "a clear message: {error}");
    assert_eq!(events(&db).len(), before, "a late signal writes nothing");

    let (code, report, stderr) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{report} {stderr}");
    for run_id in [&never_signalled, &signalled_late, &in_time, &timer] {
        assert_eq!(resumed(&report, run_id)["status"], "deadline_exceeded", "{run_id}: {report}");
        assert_eq!(run_status(&db, run_id), "deadline_exceeded");
    }
    for intent_id in
        ["refund_never_signalled", "refund_signalled_late", "refund_signalled_in_time", "refund_on_a_timer"]
    {
        assert_eq!(intent_status(&db, intent_id), "absent", "{intent_id}: nothing reserved past the deadline");
    }
}

#[test]
fn keel_worker_ends_a_run_waiting_past_its_deadline() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let started = std::time::Instant::now();
    let run_id = refund_held(&db, sim.url(), "refund_never_signalled", &["--after-signal", "goods_returned"]);
    std::thread::sleep(Duration::from_millis(1_600).saturating_sub(started.elapsed()));
    let (code, _, stderr) = keel(&db, Some(sim.url()), &["worker", "--once", "--poll-ms", "50"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(run_status(&db, &run_id), "deadline_exceeded");
}

// ----- item 4: operator text is never blank ------------------------------------------------

#[test]
fn every_operator_command_refuses_blank_text_with_the_apis_words_and_writes_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, charged, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "7000"));
    assert_eq!(code, 0, "{charged} {stderr}");
    let key = charged["intent_key"].as_str().expect("the intent's key").to_owned();
    let run_id = refund_held(&db, sim.url(), "refund_waiting", &["--after-signal", "goods_returned"]);
    let key = key.as_str();
    let blank: [(&[&str], &str); 16] = [
        (&["resolve", key, "--absent", "--by", "ana", "--reason", ""], "--reason"),
        (&["resolve", key, "--absent", "--by", "ana", "--reason", " \t"], "--reason"),
        (&["resolve", key, "--absent", "--by", "", "--reason", "checked"], "--by"),
        (&["resolve", key, "--absent", "--by", "ana", "--reason", "checked", "--override", " "], "--override"),
        (&["cancel", key, "--by", "ana", "--reason", ""], "--reason"),
        (&["cancel", key, "--by", "  ", "--reason", "duplicate"], "--by"),
        (&["deny", key, "--by", "ana", "--reason", "\n"], "--reason"),
        (&["deny", key, "--by", "", "--reason", "too much"], "--by"),
        (&["approve", key, "--by", ""], "--by"),
        (&["approve", key, "--by", " "], "--by"),
        (&["run", "cancel", &run_id, "--by", "ana", "--reason", ""], "--reason"),
        (&["run", "cancel", &run_id, "--by", "ana", "--reason", "   "], "--reason"),
        (&["run", "cancel", &run_id, "--by", "", "--reason", "stuck"], "--by"),
        (&["signal", &run_id, "goods_returned", "--by", ""], "--by"),
        (&["signal", &run_id, "goods_returned", "--by", "\t"], "--by"),
        (&["resolve", key, "--landed", "ch_1", "--by", "ana", "--reason", ""], "--reason"),
    ];
    let before = events(&db).len();
    for (args, flag) in blank {
        let (code, refused, _) = keel(&db, Some(sim.url()), args);
        assert_eq!(code, 64, "{args:?}: {refused}");
        // The HTTP API's words for a blank `reason`, with the flag's name.
        assert_eq!(refused["error"], format!("{flag}: required, and not blank"), "{args:?}: {refused}");
    }
    assert_eq!(events(&db).len(), before, "nothing written");
}

#[test]
fn the_api_refuses_a_blank_reason_or_override_with_the_clis_words_and_writes_nothing() {
    use crate::serve::{Serve, bearer, charge_body, create_key, event_count};
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let operator = bearer(&create_key(&db, TENANT, "operator", "ops-dee"));
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "100"]);
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "blank_charge_01"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(serve.call("POST", "/v1/charges", &headers, Some(&charge_body("o_blank", 500))).0, 202);
    let before = event_count(&db);
    let intent = format!("/v1/intents/charge:{TENANT}:blank_charge_01");
    let operate = [("Authorization", operator.as_str()), ("Content-Type", "application/json")];
    for (decision, body, field) in [
        ("deny", r#"{"reason": " "}"#, "reason"),
        ("cancel", r#"{"reason": ""}"#, "reason"),
        ("resolve", r#"{"absent": true, "reason": "\t"}"#, "reason"),
        ("resolve", r#"{"absent": true, "reason": "checked", "override": "  "}"#, "override"),
    ] {
        let (status, _, answer) = serve.call("POST", &format!("{intent}/{decision}"), &operate, Some(body));
        assert_eq!(status, 400, "{decision} {body}: {answer}");
        assert_eq!(answer["error"]["message"], format!("{field}: required, and not blank"), "{answer}");
    }
    assert_eq!(event_count(&db), before, "nothing written");
}

// ----- item 5: a policy value the door would refuse ----------------------------------------

#[test]
fn a_policy_value_the_door_would_refuse_is_a_usage_error_naming_file_key_and_value() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let tenant = TENANT.to_ascii_uppercase();
    let cases: [(&str, String, &[&str]); 9] = [
        ("an unsupported currency", "[defaults]\ncurrencies = [\"zzz\"]\n".into(), &["defaults.currencies", "\"zzz\""]),
        (
            "an unsupported currency of a tenant's operation",
            format!("[tenants.\"{tenant}\".operations.refund]\ncurrencies = [\"EUR\", \"GBP\"]\n"),
            &["operations.refund.currencies", "\"GBP\"", "EUR, USD, XOF"],
        ),
        (
            "a threshold above the maximum",
            "[operations.charge]\nmax_amount_minor = 1000\napproval_threshold_minor = 1001\n".into(),
            &["operations.charge.approval_threshold_minor", "1001", "1000"],
        ),
        (
            "a threshold above a tenant's maximum",
            format!(
                "[defaults]\napproval_threshold_minor = 700\n[tenants.\"{tenant}\".defaults]\nmax_amount_minor = 500\n"
            ),
            &["approval_threshold_minor", "700", "500", &tenant],
        ),
        (
            "an amount past the bound",
            "[defaults]\nmax_amount_minor = 1000000000001\n".into(),
            &["defaults.max_amount_minor", "1000000000001"],
        ),
        (
            "a negative budget",
            "[operations.refund]\nrun_budget_minor = -5\n".into(),
            &["operations.refund.run_budget_minor", "-5"],
        ),
        (
            "a negative threshold",
            "[defaults]\napproval_threshold_minor = -1\n".into(),
            &["defaults.approval_threshold_minor", "-1"],
        ),
        ("an unknown key", "[defaults]\nmax_amount_minor = 5\nmaximum = 1\n".into(), &["maximum"]),
        (
            "a tenant the door would refuse",
            "[tenants.\"not-a-uuid\".defaults]\n".into(),
            &["tenants", "not-a-uuid", "UUID"],
        ),
    ];
    for (name, body, needles) in cases {
        let policy = write_policy(dir.path(), "bad.toml", &format!("version = \"v\"\n{body}"));
        let (code, out, _) = keel(&db, Some(sim.url()), &["--policy", &policy, "resume", "--create"]);
        assert_eq!(code, 64, "{name}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains("bad.toml"), "{name}: the error names the file: {error}");
        for needle in needles {
            assert!(error.contains(needle), "{name}: the error names {needle:?}: {error}");
        }
        let charge = [vec!["--policy", policy.as_str()], charge_args("order_1842_badpol", "500")].concat();
        let (code, out, _) = keel(&db, Some(sim.url()), &charge);
        assert_eq!(code, 64, "{name}: a charge is refused too: {out}");
        assert!(!db.exists(), "{name}: nothing is written");
    }
}

#[test]
fn a_policy_read_is_bounded_even_from_a_file_without_a_length() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, out, _) = keel(&db, Some(sim.url()), &["--policy", "/dev/zero", "resume", "--create"]);
    assert_eq!(code, 64, "{out}");
    let error = out["error"].as_str().unwrap_or_default();
    assert!(error.contains("/dev/zero") && error.contains("larger than"), "{error}");
    assert!(!db.exists(), "nothing is written");
}

// ----- item 6: a key's id and another's name -----------------------------------------------

fn create_key(db: &Path, name: &str) -> (i32, Value) {
    let (code, created, _) =
        keel(db, None, &["keys", "create", "--tenant", TENANT, "--role", "operator", "--name", name]);
    (code, created)
}

fn live_keys(db: &Path) -> Vec<String> {
    let book = store::keys::KeyBook::open(db).expect("the key table opens");
    let keys = book.list().expect("the keys");
    keys.into_iter().filter(|key| key.revoked_at.is_none()).map(|key| key.name).collect()
}

#[test]
fn a_key_name_shaped_like_an_id_is_refused_and_an_ambiguous_revoke_revokes_nothing() {
    let (_dir, db) = temp();
    let (code, first) = create_key(&db, "ops-ann");
    assert_eq!(code, 0, "{first}");
    let id = first["id"].as_str().expect("an id").to_owned();
    for shaped in [id.clone(), id.to_ascii_uppercase(), "0123456789abcdef".to_owned()] {
        let (code, refused) = create_key(&db, &shaped);
        assert_eq!(code, 64, "{shaped}: {refused}");
        assert!(refused["error"].as_str().is_some_and(|e| e.contains("shape of a key id")), "{refused}");
    }
    assert_eq!(live_keys(&db), ["ops-ann"], "nothing created");

    // A key an older keel let through: its name is the first key's id.
    let book = store::keys::KeyBook::open(&db).expect("the key table opens");
    let legacy = store::keys::ApiKey {
        id: "fedcba9876543210".to_owned(),
        name: id.clone(),
        tenant: TENANT.to_owned(),
        role: store::keys::Role::Read,
        secret_sha256: "ab".repeat(32),
        created_at: chrono::DateTime::parse_from_rfc3339(first["created_at"].as_str().expect("an instant"))
            .expect("RFC 3339")
            .to_utc(),
        revoked_at: None,
    };
    book.create(&legacy).expect("the legacy key");
    drop(book);
    let (code, refused, _) = keel(&db, None, &["keys", "revoke", &id]);
    assert_eq!(code, 64, "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("fedcba9876543210") && error.contains("ops-ann") && error.contains("nothing revoked"),
        "{error}"
    );
    assert_eq!(live_keys(&db).len(), 2, "nothing revoked");

    // Each is revoked by its other handle.
    let (code, revoked, _) = keel(&db, None, &["keys", "revoke", "ops-ann"]);
    assert_eq!((code, revoked["id"].as_str()), (0, Some(id.as_str())), "{revoked}");
    assert_eq!(live_keys(&db), [id], "only the named key is revoked");
}
