//! Durable timers and signals through the real binary (issue 12): a refund held on a 2 s timer
//! whose process dies while it waits is resumed by `keel resume` only at or after its fire
//! time, the fire time never moving; `keel signal` delivers a signal a refund waits for,
//! refusing a bad one with nothing written.

use crate::cli::{charge_args, keel, start_sim, temp};
use chrono::{DateTime, Utc};
use engine::event::{Event, RunId};
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Command;
use testkit::sample::TENANT;

fn refund_args<'a>(intent_id: &'a str, hold: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["refund", "--tenant", TENANT, "--intent-id", intent_id, "--order", "order_1842"];
    args.extend(["--amount-minor", "1000", "--currency", "EUR"]);
    args.extend(hold);
    args
}

/// Every event of the log, through a reader.
fn events(db: &Path) -> Vec<engine::event::StoredEvent> {
    store::Reader::open(db).expect("a reader").events_since(0).expect("the events")
}

fn timers(db: &Path) -> Vec<(RunId, DateTime<Utc>)> {
    events(db)
        .into_iter()
        .filter_map(|e| match e.event {
            Event::TimerStarted { run_id, fire_at, .. } => Some((run_id, fire_at)),
            _ => None,
        })
        .collect()
}

fn instant(value: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().expect("an instant")).expect("RFC 3339").to_utc()
}

#[test]
fn a_refund_killed_while_its_timer_waits_resumes_only_once_the_timer_fired() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, _, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "{stderr}");

    // The process dies right after the timer's fire time is durable, while the run waits.
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--json", "--provider", sim.url()])
        .args(refund_args("order_1842_refund", &["--delay-ms", "2000"]))
        .env_remove("KEEL_DB")
        .env_remove("KEEL_PROVIDER_URL")
        .env("KEEL_FAILPOINT", "after_timer_started")
        .output()
        .expect("keel runs");
    // The fire time is at most two seconds after this instant (the timer started before).
    let died = std::time::Instant::now();
    assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{}", String::from_utf8_lossy(&output.stderr));
    let recorded = timers(&db);
    assert_eq!(recorded.len(), 1, "the timer was recorded before the crash");
    let (run_id, fire_at) = recorded[0].clone();

    // Before the fire time: left asleep, saying when; nothing reserved.
    let (code, early, stderr) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(early["resumed"], json!([]), "{early}");
    assert_eq!(early["sleeping"][0]["run_id"], json!(run_id), "{early}");
    assert_eq!(instant(&early["sleeping"][0]["wakes_at"]), fire_at, "the fire time recorded, not a fresh one");
    let (_, shown, _) = keel(&db, None, &["run", "show", run_id.as_str()]);
    assert_eq!(instant(&shown["wakes_at"]), fire_at, "`keel run show` says until when: {shown}");
    let (_, intents, _) = keel(&db, None, &["intents"]);
    let refunds = intents.as_array().into_iter().flatten().filter(|i| i["kind"] == "refund").count();
    assert_eq!(refunds, 0, "nothing is reserved while the run waits: {intents}");
    let human = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--provider", sim.url(), "resume"])
        .env_remove("KEEL_DB")
        .output()
        .expect("keel runs");
    let said = String::from_utf8_lossy(&human.stdout);
    assert!(said.contains(&format!("run {run_id}: asleep, its timer fires at")), "{said}");

    // At or after the fire time: continued, completed, the fire time never moved.
    // A timer is waited for by wall time: nothing else could say it fired.
    let fired = died + std::time::Duration::from_millis(2_050);
    std::thread::sleep(fired.saturating_duration_since(std::time::Instant::now()));
    let (code, due, stderr) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(due["sleeping"], json!([]), "{due}");
    assert_eq!(due["resumed"][0]["run_id"], json!(run_id), "{due}");
    assert_eq!(due["resumed"][0]["status"], "completed", "{due}");
    assert_eq!(timers(&db), recorded, "one timer, its fire time never recomputed");
    let (_, shown, _) = keel(&db, None, &["show", &format!("refund:{TENANT}:order_1842_refund")]);
    assert_eq!(shown["status"], "validated", "{shown}");
}

#[test]
fn keel_signal_delivers_what_a_refund_waits_for_and_refuses_a_bad_one_writing_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, _, stderr) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "{stderr}");
    let (code, waiting, stderr) =
        keel(&db, Some(sim.url()), &refund_args("order_1842_refund", &["--after-signal", "goods_returned"]));
    assert_eq!((code, waiting["run_status"].as_str()), (2, Some("suspended")), "{waiting} {stderr}");
    let run_id = waiting["run_id"].as_str().expect("the run is recorded").to_owned();

    let before = events(&db).len();
    let refused: [(&[&str], i32, &str); 7] = [
        (&["signal", &run_id, "goods returned", "--by", "ana"], 64, "bad_input"),
        (&["signal", &run_id, "", "--by", "ana"], 64, "bad_input"),
        (&["signal", &run_id, "goods_returned", "--payload", r#"{"a": 1, "a": 2}"#, "--by", "ana"], 64, "bad_input"),
        (&["signal", &run_id, "goods_returned", "--payload", "{not json", "--by", "ana"], 64, "bad_input"),
        (&["signal", &run_id, "goods_returned", "--by", " "], 64, "bad_input"),
        (&["signal", "no-such-run", "goods_returned", "--by", "ana"], 64, "not_found"),
        (
            &[
                "signal",
                &run_id,
                "goods_returned",
                "--payload",
                &format!("\"{}\"", "x".repeat(17 * 1024)),
                "--by",
                "ana",
            ],
            64,
            "bad_input",
        ),
    ];
    for (args, expected, reason) in refused {
        let (code, answer, _) = keel(&db, None, args);
        assert_eq!((code, answer["reason"].as_str()), (expected, Some(reason)), "{:?}: {answer}", &args[..3]);
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "a clear error: {answer}");
    }
    assert_eq!(events(&db).len(), before, "nothing written by a refused signal");

    let payload = r#"{"parcel": "RT-118"}"#;
    let (code, sent, stderr) =
        keel(&db, None, &["signal", &run_id, "goods_returned", "--payload", payload, "--by", "ana"]);
    assert_eq!((code, sent["status"].as_str()), (0, Some("delivered")), "{sent} {stderr}");
    let delivered = events(&db).into_iter().find(|e| matches!(e.event, Event::SignalDelivered { .. }));
    assert_eq!(delivered.map(|e| e.cause.actor), Some("operator:ana".to_owned()), "recorded with its sender");

    let (code, resumed, stderr) = keel(&db, Some(sim.url()), &["resume"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(resumed["resumed"][0]["status"], "completed", "{resumed}");
    assert_eq!(resumed["resumed"][0]["output"]["signal"], json!({"parcel": "RT-118"}), "{resumed}");

    // The run is finished: a signal is refused (2), nothing written.
    let before = events(&db).len();
    let (code, late, _) = keel(&db, None, &["signal", &run_id, "goods_returned", "--by", "ana"]);
    assert_eq!((code, late["status"].as_str()), (2, Some("refused")), "{late}");
    assert_eq!(events(&db).len(), before);
}
