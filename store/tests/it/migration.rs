//! Version 3's migration: a file written by schema version 2 (its text rows, here the golden
//! logs of `fixtures/golden/`) opens, keeps verifying, folds to the same state, and takes
//! new compact rows that continue its chain — even on its old streams.

use crate::support::start;
use engine::canonical;
use engine::clock::ManualClock;
use engine::event::{Cause, IntentDefinition, IntentKey, RunId, RunLimits, StoredEvent};
use engine::ledger::{Action, Command, IntentSpec, Ledger, Reply, RunStart};
use engine::provider::{Capability, EffectKind};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use store::{IntentRow, MIGRATIONS, Options, Reader, SCHEMA_VERSION, Store};

const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";

fn golden(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden").join(name);
    let text = std::fs::read_to_string(&path).expect("the golden log");
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("a JSON row")).collect()
}

/// A file at schema version 2 holding `rows` in the version-1 layout, as Keel wrote them.
fn v2_file(path: &Path, rows: &[Value]) {
    let mut conn = rusqlite::Connection::open(path).expect("creates the file");
    let tx = conn.transaction().expect("a transaction");
    for migration in &MIGRATIONS[..2] {
        tx.execute_batch(migration.sql).expect("the old migrations");
    }
    tx.pragma_update(None, "user_version", 2).expect("version 2");
    for row in rows {
        let text = |n: &str| row[n].as_str().unwrap_or_else(|| panic!("{n} is text")).to_owned();
        tx.execute(
            "INSERT INTO events (seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            rusqlite::params![
                row["seq"].as_i64(),
                text("stream"),
                row["stream_seq"].as_i64(),
                text("type"),
                text("at"),
                canonical::to_string(&row["cause"]),
                canonical::to_string(&row["payload"]),
                text("prev_hash"),
                text("hash"),
            ],
        )
        .expect("an old row");
    }
    tx.commit().expect("commit");
}

/// The reference: the golden rows folded by the whole-log ledger.
fn folded(rows: &[Value]) -> Ledger {
    let reader_free: Vec<StoredEvent> = rows
        .iter()
        .map(|row| {
            let event = engine::event::Event::from_stored(row["type"].as_str().expect("type"), &row["payload"])
                .expect("decodes");
            StoredEvent {
                seq: row["seq"].as_u64().expect("seq"),
                stream: engine::event::StreamId::from_stored(row["stream"].as_str().expect("stream").to_owned()),
                stream_seq: row["stream_seq"].as_u64().expect("stream_seq"),
                at: chrono::DateTime::parse_from_rfc3339(row["at"].as_str().expect("at")).expect("time").to_utc(),
                cause: serde_json::from_value(row["cause"].clone()).expect("cause"),
                event,
                prev_hash: row["prev_hash"].as_str().expect("prev").to_owned(),
                hash: row["hash"].as_str().expect("hash").to_owned(),
            }
        })
        .collect();
    let mut ledger = Ledger::new();
    reader_free.iter().for_each(|e| ledger.apply(e));
    ledger
}

#[test]
fn a_version_2_file_migrates_keeps_verifying_and_continues_its_chain() {
    let rows = golden("every_variant_v1.events.jsonl");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("old.db");
    v2_file(&path, &rows);
    let reference = folded(&rows);

    let clock = Arc::new(ManualClock::new(start()));
    let store = Store::open(&path, Options::default(), clock.clone()).expect("migrates and opens");
    let raw = rusqlite::Connection::open(&path).expect("raw");
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let reader = Reader::open(&path).expect("a reader");
    let report = reader.verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.events, rows.len() as u64);
    assert_eq!(report.last_hash, reference.last_hash());
    // The rebuilt entity rows are the reference's fold, and so is the store's own fold.
    let expected: Vec<IntentRow> = reference.intents().into_iter().map(IntentRow::from_intent).collect();
    assert_eq!(reader.intents(None).expect("intents"), expected);
    assert_eq!(reader.ledger().expect("fold").intents(), reference.intents());
    assert_eq!(reader.runs().expect("runs").len(), reference.runs().len());

    // A new run proposes a validated old intent again: its deduplication lands on the old
    // intent's stream, in the new layout, chained to the last old row.
    let run = RunId::new("after-migration");
    let id = "golden_validated_1";
    let payload = json!({"id": id, "amount": 4_900});
    let spec = IntentSpec {
        definition: IntentDefinition {
            key: IntentKey::new(EffectKind::Charge, TENANT, id),
            kind: EffectKind::Charge,
            tenant: TENANT.to_owned(),
            intent_id: id.to_owned(),
            order_id: format!("order_{id}"),
            business_ref: format!("order_{id}"),
            fingerprint: canonical::fingerprint(&payload),
            amount_minor: 4_900,
            currency: "EUR".to_owned(),
            payload,
            tool: None,
        },
        capability: Capability {
            dedup_by_key: true,
            lookup: true,
            key_window_ms: 86_400_000,
            consistency_window_ms: 0,
            request_timeout_ms: 0,
        },
        approval_required: false,
    };
    let command = Command::new(
        Cause::command("after").for_run(&run),
        Action::Reserve { run_id: run.clone(), position: 0, spec, start_attempt: false },
    )
    .starting(Some(RunStart {
        run_id: run.clone(),
        workflow: "charge".to_owned(),
        input: json!({}),
        deadline_at: start() + chrono::TimeDelta::minutes(10),
        limits: RunLimits::default(),
        versions: Default::default(),
        owner: None,
    }));
    let before = reference.intent(&IntentKey::new(EffectKind::Charge, TENANT, id)).expect("golden intent").clone();
    match store.execute_blocking(command) {
        Ok(Reply::Intent { intent, fresh, .. }) => {
            assert!(!fresh);
            assert_eq!(intent.duplicates_suppressed, before.duplicates_suppressed + 1);
        }
        other => panic!("expected the stored intent, got {other:?}"),
    }
    store.shutdown().expect("shutdown");
    let report = reader.verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.events, rows.len() as u64 + 3);
    let key = IntentKey::new(EffectKind::Charge, TENANT, id);
    let history = reader.stream(&key.stream()).expect("a stream across both layouts");
    assert_eq!(history.last().map(|e| e.event.type_name()), Some("IntentDeduplicated"));
    assert_eq!(reader.intent_state(&key).expect("folds").expect("exists").duplicates_suppressed, 2);
    let compact: i64 = raw.query_row("SELECT count(*) FROM events", [], |r| r.get(0)).expect("count");
    assert_eq!(compact, 3, "new rows are compact; old rows stay where they were");
    // And it reopens in constant time: everything up to its head was recorded as checked.
    Store::open(&path, Options::default(), clock).expect("reopens").shutdown().expect("shutdown");
}

#[test]
fn the_agent_golden_log_migrates_and_verifies() {
    let rows = golden("agent_v1.events.jsonl");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("agent.db");
    v2_file(&path, &rows);
    let store = Store::open(&path, Options::default(), Arc::new(ManualClock::new(start()))).expect("migrates");
    store.shutdown().expect("shutdown");
    let reader = Reader::open(&path).expect("reader");
    let report = reader.verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(reader.ledger().expect("fold").runs(), folded(&rows).runs());
}

#[test]
fn a_corrupt_version_2_file_is_refused_by_its_migration() {
    let mut rows = golden("every_variant_v1.events.jsonl");
    rows[2]["payload"]["intent"]["amount_minor"] = json!(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bad.db");
    v2_file(&path, &rows);
    let opened = Store::open(&path, Options::default(), Arc::new(ManualClock::new(start())));
    assert!(matches!(opened, Err(store::Error::Corrupt { seq: 3, .. })), "{opened:?}");
}

#[test]
fn version_3_leases_keep_their_holder_token_and_expiry_in_version_4() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v3.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("creates the file");
        let tx = conn.transaction().expect("a transaction");
        for migration in &MIGRATIONS[..3] {
            tx.execute_batch(migration.sql).expect("the old migrations");
            if let Some(then) = migration.then {
                then(&tx).expect("its Rust half");
            }
        }
        tx.pragma_update(None, "user_version", 3).expect("version 3");
        let owner = r#"{"host":"h","nonce":"n","pid":7,"started":9}"#;
        for (run, token, expires) in [("r1", 3, Some("2025-03-01T12:00:00.000000Z")), ("r2", 1, None)] {
            tx.execute(
                "INSERT INTO leases (run_id, owner, token, expires_at) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![run, owner, token, expires],
            )
            .expect("a version-3 lease");
        }
        tx.commit().expect("commit");
    }
    Store::open(&path, Options::default(), Arc::new(ManualClock::new(start())))
        .expect("migrates")
        .shutdown()
        .expect("shutdown");
    let raw = rusqlite::Connection::open(&path).expect("raw");
    let rows: Vec<(String, String, i64, Option<String>)> = raw
        .prepare(
            "SELECT s.name, o.owner, l.token, l.expires_at FROM leases l JOIN streams s ON s.id = l.run \
             JOIN owners o ON o.id = l.owner ORDER BY s.name",
        )
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let owner = r#"{"host":"h","nonce":"n","pid":7,"started":9}"#.to_owned();
    assert_eq!(
        rows,
        [
            ("run:r1".to_owned(), owner.clone(), 3, Some("2025-03-01T12:00:00.000000Z".to_owned())),
            ("run:r2".to_owned(), owner, 1, None),
        ]
    );
    let owners: i64 = raw.query_row("SELECT count(*) FROM owners", [], |r| r.get(0)).expect("count");
    assert_eq!(owners, 1, "one holder, one row");
}

/// The metrics rows of every intent and run, in order, as text.
fn facts(conn: &rusqlite::Connection) -> Vec<String> {
    let mut out = Vec::new();
    for sql in [
        "SELECT intent, run, kind, status, evidence, dedups, reserved_at, settled_at, ambiguous_at FROM intent_facts ORDER BY intent",
        "SELECT run, started_at, workflow, status, cost_minor, release, prompt, policy, model FROM run_facts ORDER BY run",
    ] {
        let mut statement = conn.prepare(sql).expect("the metrics tables exist");
        let rows = statement
            .query_map([], |row| {
                (0..9)
                    .map(|i| row.get::<_, rusqlite::types::Value>(i).map(|v| format!("{v:?}")))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("reads");
        out.extend(rows.map(|r| r.expect("a row").join("|")));
    }
    out
}

#[test]
fn version_7_fills_the_metrics_rows_of_a_version_6_file_as_the_writer_writes_them() {
    use crate::support::{Fixture, charge, outcome, start_and_reserve, start_attempt, succeed};
    use engine::provider::{CallOutcome, UnknownReason};
    let mut fixture = Fixture::new();
    for (id, run) in [("metrics_paid_0001", "r1"), ("metrics_lost_0002", "r2"), ("metrics_open_0003", "r3")] {
        fixture.store.execute_blocking(start_and_reserve(run, charge(id, 1_000))).expect("reserved");
        fixture.clock.advance_ms(7);
    }
    fixture.store.execute_blocking(start_attempt("r1", "metrics_paid_0001")).expect("attempt");
    fixture.clock.advance_ms(40);
    fixture.store.execute_blocking(succeed("metrics_paid_0001", 1, 1_000)).expect("validated");
    fixture.store.execute_blocking(start_attempt("r2", "metrics_lost_0002")).expect("attempt");
    fixture.clock.advance_ms(5);
    let lost = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() };
    fixture.store.execute_blocking(outcome("metrics_lost_0002", 1, lost)).expect("unknown");
    fixture.store.shutdown().expect("shutdown");
    let written = facts(&fixture.raw());
    assert_eq!(written.len(), 6, "three intents and three runs: {written:?}");

    // The same file as version 6 had it: no metrics tables, no cause parents (its events'
    // parents are lost with the column, so only the metrics are compared below, not the chain),
    // and none of version 8's timer column.
    let raw = fixture.raw();
    raw.execute_batch(
        "DROP TABLE intent_facts; DROP TABLE run_facts; ALTER TABLE events DROP COLUMN cause_parent; \
         DROP INDEX runs_sleeping; DROP INDEX runs_awake; ALTER TABLE runs DROP COLUMN wake_at; \
         DROP INDEX vault_by_slot; ALTER TABLE vault DROP COLUMN slot; PRAGMA user_version = 6;",
    )
    .expect("back to v6");
    assert!(matches!(Reader::open(&fixture.path), Err(store::Error::SchemaTooOld { found: 6, .. })));
    drop(raw);
    fixture.reopen();
    fixture.store.shutdown().expect("shutdown");
    let raw = fixture.raw();
    let version: i64 = raw.pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(facts(&raw), written, "the back-fill writes what the writer wrote");
    let segments = Reader::open(&fixture.path).expect("reader").metrics(None, None, None, start()).expect("figures");
    assert_eq!((segments[0].intents, segments[0].validated, segments[0].runs), (3, 1, 3));
    assert_eq!(
        segments[0].settle_ms,
        vec![61],
        "the paid charge: reserved at 0 ms, validated at 61 ms (three reservations 7 ms apart, then 40 ms in flight)"
    );
}

/// What a resume pass sees: the runs it would replay and those it leaves asleep.
fn resume_pass(store: &Store) -> (Vec<String>, Vec<String>) {
    match store.execute_blocking(Command::new(Cause::command("resume"), Action::Snapshot)) {
        Ok(Reply::Snapshot { unfinished, sleeping, .. }) => {
            let ids = |runs: Vec<engine::ledger::Run>| runs.into_iter().map(|r| r.run_id.to_string()).collect();
            (ids(unfinished), ids(sleeping))
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

#[test]
fn version_8_fills_the_fire_time_of_runs_waiting_on_a_timer_and_resume_reads_it() {
    use crate::support::{Fixture, run_start};
    let mut fixture = Fixture::new();
    let timer = |run: &str, ms: i64| {
        let fire_at = start() + chrono::TimeDelta::milliseconds(ms);
        let action = Action::StartTimer { run_id: RunId::new(run), position: 0, fire_at };
        Command::new(Cause::command("test"), action).starting(Some(run_start(run)))
    };
    fixture.store.execute_blocking(timer("r-asleep", 60_000)).expect("a long timer");
    fixture.store.execute_blocking(timer("r-due", 1_000)).expect("a short timer");
    let start_only = Command::new(Cause::command("test"), Action::StartRun).starting(Some(run_start("r-plain")));
    fixture.store.execute_blocking(start_only).expect("a run without a timer");
    fixture.store.shutdown().expect("shutdown");

    // The same file as version 7 had it: no column, no indexes (nor version 9's and 10's columns).
    let raw = fixture.raw();
    raw.execute_batch(
        "DROP INDEX runs_sleeping; DROP INDEX runs_awake; ALTER TABLE runs DROP COLUMN wake_at; \
         ALTER TABLE intent_facts DROP COLUMN refused; ALTER TABLE intent_facts DROP COLUMN tool; \
         ALTER TABLE run_facts DROP COLUMN cost_unknown; \
         DROP INDEX vault_by_slot; ALTER TABLE vault DROP COLUMN slot; PRAGMA user_version = 7;",
    )
    .expect("back to v7");
    drop(raw);
    fixture.clock.advance_ms(2_000);
    fixture.reopen();
    let column = |run: &str| -> Option<i64> {
        fixture
            .raw()
            .query_row(
                "SELECT r.wake_at FROM runs r JOIN streams s ON s.id = r.stream WHERE s.name = ?1",
                [format!("run:{run}")],
                |row| row.get(0),
            )
            .expect("the run's row")
    };
    // Rounded up: the tests' instants have nanoseconds (`start()`).
    let micros = |ms: i64| (start() + chrono::TimeDelta::milliseconds(ms)).timestamp_micros() + 1;
    assert_eq!(column("r-asleep"), Some(micros(60_000)));
    assert_eq!(column("r-due"), Some(micros(1_000)));
    assert_eq!(column("r-plain"), None);
    assert_eq!(
        resume_pass(&fixture.store),
        (vec!["r-due".to_owned(), "r-plain".to_owned()], vec!["r-asleep".to_owned()]),
        "two seconds in: the fired timer and the run without one are resumed, the other sleeps"
    );
    fixture.store.shutdown().expect("shutdown");
    let report = Reader::open(&fixture.path).expect("reader").verify().expect("verifies");
    assert!(report.is_ok(), "{:?}", report.first_mismatch());
    let version: i64 = fixture.raw().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn version_9_counts_refused_resends_and_names_the_proposing_tool_on_a_version_8_file() {
    use crate::support::{Fixture, charge, outcome, start_and_reserve, start_attempt};
    use engine::provider::{CallOutcome, UnknownReason};
    use store::metrics::Dimension;
    let mut fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("r1", charge("v8_lost_0001", 1_000))).expect("reserved");
    fixture.store.execute_blocking(start_attempt("r1", "v8_lost_0001")).expect("attempt");
    let lost = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() };
    fixture.store.execute_blocking(outcome("v8_lost_0001", 1, lost)).expect("unknown");
    fixture.store.shutdown().expect("shutdown");

    // The same file as version 8 had it: no column for either (nor version 10's).
    let raw = fixture.raw();
    raw.execute_batch(
        "ALTER TABLE intent_facts DROP COLUMN refused; ALTER TABLE intent_facts DROP COLUMN tool; \
         ALTER TABLE run_facts DROP COLUMN cost_unknown; \
         DROP INDEX vault_by_slot; ALTER TABLE vault DROP COLUMN slot; PRAGMA user_version = 8;",
    )
    .expect("back to v8");
    drop(raw);
    fixture.reopen();
    let old: (i64, Option<String>) = fixture
        .raw()
        .query_row("SELECT refused, tool FROM intent_facts", [], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("the old row has both columns");
    assert_eq!(old, (0, None), "the event and the field are newer than the row: 0 and none are exact");

    // Another run proposes the unknown charge again; an agent's tool proposes another.
    fixture.store.execute_blocking(start_and_reserve("r2", charge("v8_lost_0001", 1_000))).expect("answered");
    let mut credit = charge("v8_credit_0002", 500);
    credit.definition.tool = Some("issue_credit".to_owned());
    fixture.store.execute_blocking(start_and_reserve("r3", credit)).expect("reserved");
    fixture.store.shutdown().expect("shutdown");
    let version: i64 = fixture.raw().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let reader = Reader::open(&fixture.path).expect("reader");
    let all = reader.metrics(None, None, None, start()).expect("figures");
    assert_eq!((all[0].refused_resends, all[0].retries_prevented()), (1, 1), "{all:?}");
    let by_tool = reader.metrics(None, Some(Dimension::Tool), None, start()).expect("figures");
    let segments: Vec<(Option<&str>, u64, u64)> =
        by_tool.iter().map(|s| (s.value.as_deref(), s.intents, s.refused_resends)).collect();
    assert_eq!(
        segments,
        [(None, 0, 0), (Some("charge"), 1, 1), (Some("issue_credit"), 1, 0)],
        "a workflow's charge by its operation, the agent's by its tool; the run that only proposed again \
         reserved nothing"
    );
    let report = reader.verify().expect("verify runs");
    assert!(report.is_ok(), "the rebuilt rows agree: {report:?}");
}

#[test]
fn version_10_marks_the_finished_agent_runs_that_recorded_no_model_cost() {
    use crate::support::Fixture;
    use engine::event::{RunStatus, RunVersions};
    use engine::ledger::{AgentRunStart, SpineRequest};
    let mut fixture = Fixture::new();
    // Three agent runs: finished with a cost, finished without one, still running.
    for (run, finish) in [("a-priced", Some(Some(42))), ("a-unpriced", Some(None)), ("a-running", None)] {
        let spine: Vec<SpineRequest> = finish
            .map(|cost_minor| SpineRequest::Finish { status: RunStatus::Completed, detail: None, cost_minor })
            .into_iter()
            .collect();
        let start = AgentRunStart {
            workflow: "ticket-review".to_owned(),
            deadline_at: start() + chrono::TimeDelta::minutes(10),
            input: json!({}),
            limits: RunLimits::default(),
            versions: RunVersions::default(),
            owner: None,
        };
        let batch = engine::log::AgentBatch {
            run_id: RunId::new(run),
            position: 0,
            entries: vec![json!({"type": "opaque to the spine"})],
            start: Some(start),
            spine,
        };
        let command = engine::log::Ask::record_agent_entries(Cause::command("test"), batch).into_command();
        fixture.store.execute_blocking(command).expect("the agent batch is recorded");
    }
    fixture.store.shutdown().expect("shutdown");
    let unknown = |raw: &rusqlite::Connection| -> Vec<(String, i64, i64)> {
        let mut statement = raw
            .prepare(
                "SELECT s.name, f.cost_minor, f.cost_unknown FROM run_facts f JOIN streams s ON s.id = f.run \
                 ORDER BY s.name",
            )
            .expect("prepares");
        let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?))).expect("queries");
        rows.collect::<rusqlite::Result<_>>().expect("reads")
    };
    let expected = vec![
        ("run:a-priced".to_owned(), 42, 0),
        ("run:a-running".to_owned(), 0, 0),
        ("run:a-unpriced".to_owned(), 0, 1),
    ];
    assert_eq!(unknown(&fixture.raw()), expected, "the writer marks the run that recorded no cost");

    // The same file as version 9 had it: no column; the migration fills it from the run rows.
    let raw = fixture.raw();
    raw.execute_batch(
        "ALTER TABLE run_facts DROP COLUMN cost_unknown; DROP INDEX vault_by_slot; ALTER TABLE vault DROP COLUMN slot; \
         PRAGMA user_version = 9;",
    )
    .expect("back to v9");
    drop(raw);
    fixture.reopen();
    fixture.store.shutdown().expect("shutdown");
    assert_eq!(unknown(&fixture.raw()), expected, "the back-fill marks what the writer marks");
    let reader = Reader::open(&fixture.path).expect("reader");
    let all = reader.metrics(None, None, None, start()).expect("figures");
    assert_eq!((all[0].runs, all[0].cost_minor, all[0].cost_unknown_runs), (3, 42, 1), "{all:?}");
}
