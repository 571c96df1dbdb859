//! Append-only, the hash chain, and `verify` against tampering.

use crate::support::{Fixture, charge, key, start_and_reserve, start_attempt, succeed};
use engine::canonical;
use engine::event::{Cause, Event, RunId, chain_hash};
use std::sync::Arc;
use store::{Error, Mismatch, Options, Store};

/// A log with two runs and two intents, one of them validated. Seqs 1–3 are run-1's start,
/// journal link and reservation of intent-000001.
fn populated() -> Fixture {
    let fixture = Fixture::new();
    let store = &fixture.store;
    store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserve 1");
    store.execute_blocking(start_and_reserve("run-2", charge("intent-000002", 250))).expect("reserve 2");
    store.execute_blocking(start_attempt("run-2", "intent-000002")).expect("attempt");
    store.execute_blocking(succeed("intent-000002", 1, 250)).expect("validated");
    fixture
}

fn first_mismatch(fixture: &Fixture) -> Mismatch {
    let report = fixture.store.reader().expect("reader").verify().expect("verify runs");
    assert!(!report.is_ok(), "verify should fail: {report}");
    report.first_mismatch().expect("a mismatch").clone()
}

#[test]
fn updates_and_deletes_on_events_are_refused_by_the_database() {
    let fixture = populated();
    let raw = fixture.raw();
    let update = raw.execute("UPDATE events SET payload = '{}' WHERE seq = 1", []).expect_err("update refused");
    assert!(update.to_string().contains("events are append-only"), "{update}");
    let delete = raw.execute("DELETE FROM events WHERE seq = 1", []).expect_err("delete refused");
    assert!(delete.to_string().contains("events are append-only"), "{delete}");
    assert_eq!(fixture.event_count(), 8);
}

#[test]
fn a_clean_log_verifies_with_counts() {
    let fixture = populated();
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!((report.events, report.intents, report.runs), (8, 2, 2));
    assert_eq!((report.intent_rows, report.run_rows), (2, 2));
    let last = fixture.store.reader().expect("reader").events_since(7).expect("last event");
    assert_eq!(report.last_hash, last[0].hash);
}

#[test]
fn a_tampered_payload_is_named_by_verify_and_refused_on_reopen() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_update").expect("drop the trigger");
    let changed = raw
        .execute(
            "UPDATE events SET payload = replace(payload, '\"amount_minor\":100', '\"amount_minor\":1') WHERE seq = 3",
            [],
        )
        .expect("tamper");
    assert_eq!(changed, 1);

    match first_mismatch(&fixture) {
        Mismatch::Event { seq, detail } => {
            assert_eq!(seq, 3);
            assert!(detail.starts_with("hash mismatch (stored "), "{detail}");
        }
        other => panic!("expected an event mismatch, got {other}"),
    }
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    assert!(matches!(reopened, Err(Error::Corrupt { seq: 3, .. })), "{reopened:?}");
}

#[test]
fn a_broken_link_in_the_chain_is_refused_on_reopen() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_update").expect("drop the trigger");
    // Rewrite seq 4 with a self-consistent hash over a wrong prev_hash: only the link breaks.
    let reader = store::Reader::open(&fixture.path).expect("reader");
    let mut fourth = reader.events_since(3).expect("events")[0].clone();
    fourth.prev_hash = "ab".repeat(32);
    let hash =
        chain_hash(&fourth.prev_hash, 4, &fourth.stream, fourth.stream_seq, fourth.at, &fourth.cause, &fourth.event);
    raw.execute("UPDATE events SET prev_hash = ?1, hash = ?2 WHERE seq = 4", [&fourth.prev_hash, &hash])
        .expect("tamper");

    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    match reopened {
        Err(Error::Corrupt { seq, detail }) => {
            assert_eq!(seq, 4);
            assert!(detail.contains("prev_hash mismatch"), "{detail}");
        }
        other => panic!("expected Corrupt at seq 4, got {other:?}"),
    }
    assert!(matches!(first_mismatch(&fixture), Mismatch::Event { seq: 4, .. }));
}

#[test]
fn an_impossible_transition_with_a_valid_chain_is_reported_not_panicked() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let reader = store::Reader::open(&fixture.path).expect("reader");
    let events = reader.events_since(0).expect("events");
    let last = events.last().expect("events exist");
    // Attempt 7 of an intent that never had attempt 1: well-formed, correctly chained,
    // impossible.
    let event = Event::AttemptStarted { key: key("intent-000001"), attempt: 7, run_id: RunId::new("run-1") };
    let stream = event.stream();
    let stream_seq = events.iter().filter(|e| e.stream == stream).count() as u64 + 1;
    let cause = Cause::command("forger");
    let seq = last.seq + 1;
    let hash = chain_hash(&last.hash, seq, &stream, stream_seq, last.at, &cause, &event);
    fixture
        .raw()
        .execute(
            "INSERT INTO events (seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            rusqlite::params![
                seq as i64,
                stream.as_str(),
                stream_seq as i64,
                event.type_name(),
                last.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                canonical::to_string(&serde_json::to_value(&cause).expect("cause")),
                canonical::to_string(&event.payload()),
                last.hash,
                hash,
            ],
        )
        .expect("forge");

    match first_mismatch(&fixture) {
        Mismatch::Event { seq: found, detail } => {
            assert_eq!(found, seq);
            assert!(detail.starts_with("the fold rejects it: impossible transition"), "{detail}");
        }
        other => panic!("expected an event mismatch, got {other}"),
    }
}

#[test]
fn a_deleted_intent_row_is_named_by_verify() {
    let fixture = populated();
    let removed =
        fixture.raw().execute("DELETE FROM intents WHERE key = ?1", [key("intent-000001").as_str()]).expect("delete");
    assert_eq!(removed, 1);
    assert_eq!(
        first_mismatch(&fixture),
        Mismatch::Intent {
            key: "charge:t1:intent-000001".to_owned(),
            detail: "missing from the table (the replay has it)".to_owned()
        }
    );
}

#[test]
fn a_changed_intent_status_is_named_with_both_values() {
    let fixture = populated();
    fixture
        .raw()
        .execute("UPDATE intents SET status = 'validated' WHERE key = ?1", [key("intent-000001").as_str()])
        .expect("update");
    let mismatch = first_mismatch(&fixture);
    assert_eq!(
        mismatch.to_string(),
        "intents row charge:t1:intent-000001: status is validated in the table, reserved by replay"
    );
}

#[test]
fn deleted_and_extra_run_rows_are_named_by_verify() {
    let fixture = populated();
    let raw = fixture.raw();
    // A careless tool with foreign keys off can delete a run its intents still name.
    raw.pragma_update(None, "foreign_keys", "OFF").expect("foreign keys off");
    raw.execute("DELETE FROM runs WHERE run_id = 'run-1'", []).expect("delete");
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert_eq!(
        report.first_mismatch().map(ToString::to_string).as_deref(),
        Some("runs row run-1: missing from the table (the replay has it)")
    );

    raw.execute(
        "INSERT INTO runs SELECT 'run-ghost', workflow, status, detail, started_at, deadline_at, cost_committed_minor, \
         cost_minor_max, intents, journal_len, last_seq FROM runs WHERE run_id = 'run-2'",
        [],
    )
    .expect("insert a ghost");
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert_eq!(report.mismatch_count, 2);
    assert_eq!(report.mismatches[1].to_string(), "runs row run-ghost: in the table but not in the replay");
}
