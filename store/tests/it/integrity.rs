//! Append-only, the hash chain, and `verify` against tampering.

use crate::support::{Fixture, charge, key, start_and_reserve, start_attempt, succeed};
use engine::event::chain_hash;
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

/// Forgets the verified point, as after a crash before the writer recorded it: the next open
/// checks every event.
fn forget_verified_point(fixture: &Fixture) {
    fixture.raw().execute("UPDATE meta SET value = '0' WHERE key = 'verified_seq'", []).expect("reset");
}

/// The stream id of an intent.
const INTENT_STREAM: &str = "(SELECT id FROM streams WHERE name = 'intent:' || ?1)";

#[test]
fn updates_and_deletes_on_events_are_refused_by_the_database() {
    let fixture = populated();
    let raw = fixture.raw();
    let update = raw.execute("UPDATE events SET payload = x'00' WHERE seq = 1", []).expect_err("update refused");
    assert!(update.to_string().contains("events are append-only"), "{update}");
    let delete = raw.execute("DELETE FROM events WHERE seq = 1", []).expect_err("delete refused");
    assert!(delete.to_string().contains("events are append-only"), "{delete}");
    let legacy = raw
        .execute(
            "INSERT INTO events_v1 (seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash) \
             VALUES (9, 'run:x', 1, 'RunStarted', 'x', '{}', '{}', ?1, ?1)",
            ["0".repeat(64)],
        )
        .expect_err("the old table takes no new rows");
    assert!(legacy.to_string().contains("events_v1 is closed"), "{legacy}");
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
fn a_tampered_payload_is_named_by_verify_and_refused_by_an_open_that_checks_it() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_update").expect("drop the trigger");
    // `amount_minor` (key 11), an unsigned integer (tag 3), 100 → 1: the reservation of seq 3.
    let changed = raw
        .execute("UPDATE events SET payload = CAST(replace(payload, x'0b0364', x'0b0301') AS BLOB) WHERE seq = 3", [])
        .expect("tamper");
    assert_eq!(changed, 1);

    match first_mismatch(&fixture) {
        Mismatch::Event { seq, detail } => {
            assert_eq!(seq, 3);
            assert!(detail.starts_with("hash mismatch (stored "), "{detail}");
        }
        other => panic!("expected an event mismatch, got {other}"),
    }
    // The writer recorded seq 8 as verified at shutdown: open checks only what follows, so it
    // opens (in constant time) and `verify` is what finds the edit.
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _).expect("opens");
    reopened.shutdown().expect("shutdown");
    // After a crash the tail since the last recorded point is checked, and refused.
    forget_verified_point(&fixture);
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    assert!(matches!(reopened, Err(Error::Corrupt { seq: 3, .. })), "{reopened:?}");
}

#[test]
fn a_missing_event_is_a_gap_for_verify_and_for_open() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_delete").expect("drop the trigger");
    raw.execute("DELETE FROM events WHERE seq = 4", []).expect("tamper");
    match first_mismatch(&fixture) {
        Mismatch::Event { seq, detail } => {
            assert_eq!(seq, 5);
            assert!(detail.contains("expected seq 4 next"), "{detail}");
        }
        other => panic!("expected an event mismatch, got {other}"),
    }
    forget_verified_point(&fixture);
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    assert!(matches!(reopened, Err(Error::Corrupt { seq: 5, .. })), "{reopened:?}");
}

#[test]
fn a_rewritten_hash_breaks_the_chain_at_that_event() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_update").expect("drop the trigger");
    // Seq 4 rehashed over another previous hash: its own content no longer checks.
    let reader = store::Reader::open(&fixture.path).expect("reader");
    let fourth = reader.events_since(3).expect("events")[0].clone();
    let hash =
        chain_hash(&"ab".repeat(32), 4, &fourth.stream, fourth.stream_seq, fourth.at, &fourth.cause, &fourth.event);
    raw.execute("UPDATE events SET hash = ?1 WHERE seq = 4", [hex::decode(&hash).expect("hex")]).expect("tamper");
    forget_verified_point(&fixture);
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    match reopened {
        Err(Error::Corrupt { seq, detail }) => {
            assert_eq!(seq, 4);
            assert!(detail.contains("hash mismatch"), "{detail}");
        }
        other => panic!("expected Corrupt at seq 4, got {other:?}"),
    }
    assert!(matches!(first_mismatch(&fixture), Mismatch::Event { seq: 4, .. }));
}

#[test]
fn a_deleted_intent_row_is_named_by_verify() {
    let fixture = populated();
    let raw = fixture.raw();
    raw.pragma_update(None, "foreign_keys", "OFF").expect("foreign keys off");
    let removed = raw
        .execute(&format!("DELETE FROM intents WHERE stream = {INTENT_STREAM}"), [key("intent-000001").as_str()])
        .expect("delete");
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
fn a_changed_intent_status_column_is_named_with_both_values() {
    let fixture = populated();
    fixture
        .raw()
        .execute(
            &format!("UPDATE intents SET status = 4 WHERE stream = {INTENT_STREAM}"),
            [key("intent-000001").as_str()],
        )
        .expect("update");
    let mismatch = first_mismatch(&fixture);
    assert_eq!(
        mismatch.to_string(),
        "intents row charge:t1:intent-000001: column status is 4 in the table, 1 by its state"
    );
}

#[test]
fn a_changed_run_finished_column_is_named_with_both_values() {
    let fixture = populated();
    fixture
        .raw()
        .execute("UPDATE runs SET finished = 1 WHERE stream = (SELECT id FROM streams WHERE name = 'run:run-1')", [])
        .expect("update");
    assert_eq!(first_mismatch(&fixture).to_string(), "runs row run-1: column finished is true, the state says false");
}

#[test]
fn a_corrupt_intent_state_is_named_with_the_first_differing_field() {
    let fixture = populated();
    // Intent 1's row given intent 2's (validated) state.
    fixture
        .raw()
        .execute(
            &format!(
                "UPDATE intents SET state = (SELECT state FROM intents WHERE stream = {}) WHERE stream = {INTENT_STREAM}",
                INTENT_STREAM.replace("?1", "?2")
            ),
            [key("intent-000001").as_str(), key("intent-000002").as_str()],
        )
        .expect("update");
    let mismatch = first_mismatch(&fixture).to_string();
    assert!(
        mismatch.starts_with("intents row charge:t1:intent-000001: attempts is 1 in the table, 0 by replay"),
        "{mismatch}"
    );
    fixture.raw().execute("UPDATE intents SET state = x'ff'", []).expect("update");
    let mismatch = first_mismatch(&fixture).to_string();
    assert!(mismatch.contains("does not decode"), "{mismatch}");
}

#[test]
fn a_missing_order_entry_is_named_by_verify() {
    let fixture = populated();
    fixture.raw().execute("DELETE FROM orders WHERE order_id = 'order-intent-000002'", []).expect("delete");
    let mismatch = first_mismatch(&fixture).to_string();
    assert_eq!(mismatch, "intents row charge:t1:intent-000002: missing from orders under order order-intent-000002");
}

#[test]
fn deleted_and_extra_run_rows_are_named_by_verify() {
    let fixture = populated();
    let raw = fixture.raw();
    // A careless tool with foreign keys off can delete a run its intents still name.
    raw.pragma_update(None, "foreign_keys", "OFF").expect("foreign keys off");
    raw.execute("DELETE FROM runs WHERE stream = (SELECT id FROM streams WHERE name = 'run:run-1')", [])
        .expect("delete");
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert_eq!(
        report.first_mismatch().map(ToString::to_string).as_deref(),
        Some("runs row run-1: missing from the table (the replay has it)")
    );

    raw.execute("INSERT INTO streams (name) VALUES ('run:run-ghost')", []).expect("a ghost's name");
    raw.execute(
        "INSERT INTO runs (stream, finished, state) \
         SELECT (SELECT id FROM streams WHERE name = 'run:run-ghost'), finished, state FROM runs \
         WHERE stream = (SELECT id FROM streams WHERE name = 'run:run-2')",
        [],
    )
    .expect("insert a ghost");
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert_eq!(report.mismatch_count, 2);
    assert_eq!(report.mismatches[1].to_string(), "runs row run-ghost: in the table but not in the replay");
}

#[test]
fn an_event_that_skips_a_place_on_its_stream_is_refused_by_an_open_that_checks_it_and_named_by_verify() {
    let fixture = populated();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    raw.execute_batch("DROP TRIGGER events_no_update").expect("drop the trigger");
    // Seq 8, the last event, moved one place further on its stream and hashed anew: the global
    // chain and its own hash check, only its stream has a gap.
    let reader = store::Reader::open(&fixture.path).expect("reader");
    let last = reader.events_since(7).expect("events")[0].clone();
    let skipped = last.stream_seq + 1;
    let hash = chain_hash(&last.prev_hash, 8, &last.stream, skipped, last.at, &last.cause, &last.event);
    let changed = raw
        .execute(
            "UPDATE events SET stream_seq = ?1, hash = ?2 WHERE seq = 8",
            rusqlite::params![i64::try_from(skipped).expect("a small stream"), hex::decode(&hash).expect("hex")],
        )
        .expect("tamper");
    assert_eq!(changed, 1);
    forget_verified_point(&fixture);
    let reopened = Store::open(&fixture.path, Options::default(), Arc::clone(&fixture.clock) as _);
    match reopened {
        Err(Error::Corrupt { seq, detail }) => {
            assert_eq!(seq, 8);
            assert!(detail.contains("does not follow its previous event"), "{detail}");
        }
        other => panic!("expected Corrupt at seq 8, got {other:?}"),
    }
    assert!(matches!(first_mismatch(&fixture), Mismatch::Event { seq: 8, .. }));
}

/// Another writer's events, appended inside this writer's batch at the one moment its write
/// lock otherwise rules out: after it read the stream positions and the log's head it appends
/// at, before it inserts. A trigger makes them the moment the writer gives the actor
/// `command:racer` its id (its last write before the batch's events); each row is `(seq,
/// stream, stream_seq)`. The row's content is never read: the insert it collides with fails.
fn race_the_writer(fixture: &Fixture, rows: &[(u64, &str, u64)]) {
    let inserts: String = rows
        .iter()
        .map(|(seq, stream, stream_seq)| {
            format!(
                "INSERT INTO events (seq, stream, stream_seq, type, at, actor, payload, hash) VALUES ({seq}, \
                 (SELECT id FROM streams WHERE name = '{stream}'), {stream_seq}, 11, 0, NEW.id, x'', zeroblob(32));"
            )
        })
        .collect();
    fixture
        .raw()
        .execute_batch(&format!(
            "CREATE TRIGGER racer AFTER INSERT ON actors WHEN NEW.name = 'command:racer' BEGIN {inserts} END"
        ))
        .expect("install the racing writer");
}

/// Intent 1's first attempt, asked by the actor `race_the_writer` waits for: its
/// `AttemptStarted` is seq 9 and place 2 on the intent's stream.
fn racing_attempt() -> engine::ledger::Command {
    engine::ledger::Command { cause: engine::event::Cause::command("racer"), ..start_attempt("run-1", "intent-000001") }
}

/// The answer to an append that lost its race: the batch failed, nothing committed, with the
/// conflict's own words — not SQLite's — and the log as it was. Then, the racer gone, the
/// same command appends where it meant to.
fn assert_lost_the_race(fixture: &Fixture, conflict: Error) {
    match fixture.store.execute_blocking(racing_attempt()) {
        Err(engine::log::LogError::Unavailable { detail, maybe_committed }) => {
            assert!(!maybe_committed);
            assert_eq!(detail, conflict.to_string());
        }
        other => panic!("expected the conflict {conflict}, got {other:?}"),
    }
    assert_eq!(fixture.event_count(), 8, "the racer's rows went with the rolled-back batch");
    fixture.raw().execute_batch("DROP TRIGGER racer").expect("the racer gone");
    fixture.store.execute_blocking(racing_attempt()).expect("the attempt, appended once nothing races it");
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.events, 9);
}

#[test]
fn an_append_that_lost_its_stream_position_to_another_writer_is_a_conflict_naming_the_stream() {
    let fixture = populated();
    let stream = key("intent-000001").stream().to_string();
    // Places 2 and 3 of the intent's stream, far above the log's head: only the stream collides.
    race_the_writer(&fixture, &[(100, &stream, 2), (101, &stream, 3)]);
    assert_lost_the_race(&fixture, Error::Conflict { stream, expected: 2, found: 3 });
}

#[test]
fn an_append_that_lost_its_global_seq_to_another_writer_is_a_conflict_on_the_whole_log() {
    let fixture = populated();
    // Seqs 9 and 10, on another stream far past its end: only the global sequence collides.
    let other = key("intent-000002").stream().to_string();
    race_the_writer(&fixture, &[(9, &other, 100), (10, &other, 101)]);
    assert_lost_the_race(&fixture, Error::Conflict { stream: "*".to_owned(), expected: 9, found: 10 });
}
