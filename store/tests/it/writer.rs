//! The writer's contract: refusals write nothing, time is stamped from the clock, state
//! survives a restart, causes name their parents, failures roll back, a batch waits out
//! another process's write lock up to its patience and keeps its bound, the verified point
//! and the in-batch crash point follow what is appended, shutdown closes.

use crate::support::{Fixture, charge, intent_of, key, outcome, start, start_and_reserve, start_attempt, succeed};
use chrono::SubsecRound;
use engine::event::{Cause, RunId};
use engine::ledger::{Action, Command, IntentStatus, Refusal, RejectCode, Reply};
use engine::limits::{VERIFIED_MARK_EVENTS, WRITER_BATCH_MAX};
use engine::log::{EventLog, LogError};
use engine::provider::{CallOutcome, UnknownReason};
use serde_json::json;

#[test]
fn a_refused_command_writes_nothing_not_even_its_run() {
    let fixture = Fixture::new();
    let store = &fixture.store;
    store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    let before = fixture.event_count();

    // Same key, another payload, in a run the command would start.
    let mismatch = store.execute_blocking(start_and_reserve("run-2", charge("intent-000001", 999)));
    match mismatch {
        Err(LogError::Refused(Refusal::Rejected { code, .. })) => assert_eq!(code, RejectCode::IntentPayloadMismatch),
        other => panic!("expected a payload mismatch, got {other:?}"),
    }
    let unknown = store.execute_blocking(start_attempt("run-1", "intent-nobody"));
    assert!(matches!(unknown, Err(LogError::Refused(Refusal::UnknownIntent(_)))), "{unknown:?}");

    assert_eq!(fixture.event_count(), before);
    let reader = store.reader().expect("reader");
    assert_eq!(reader.run(&RunId::new("run-2")).expect("read"), None);
    assert_eq!(reader.intent(&key("intent-000001")).expect("read").expect("row").amount_minor, 100);
    let stats = store.stats();
    assert_eq!(stats.refused, 2);
    assert_eq!(stats.commits, 1, "a batch of refusals commits nothing to disk");
}

#[test]
fn a_payload_above_the_limit_refuses_the_whole_command() {
    let fixture = Fixture::new();
    let mut spec = charge("intent-000001", 100);
    // RunStarted and StepRecorded are small; only IntentReserved, the third event, is too big.
    spec.definition.payload = json!({"note": "x".repeat(engine::limits::EVENT_PAYLOAD_MAX_BYTES)});
    let refused = fixture.store.execute_blocking(start_and_reserve("run-1", spec));
    match refused {
        Err(LogError::Refused(refusal @ Refusal::PayloadTooLarge { event_type: "IntentReserved", .. })) => {
            let message = refusal.to_string();
            assert!(message.starts_with("IntentReserved payload is "), "{message}");
            assert!(message.contains("limit"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(fixture.event_count(), 0);
    // The writer's ledger did not fold the first two events either: the run can still start.
    let reply = fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100)));
    assert!(intent_of(reply).1);
    assert!(fixture.store.reader().expect("reader").verify().expect("verify").is_ok());
}

#[test]
fn events_are_stamped_with_the_clock_truncated_to_microseconds() {
    let fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    fixture.clock.advance_ms(1_500);
    let (intent, _) = intent_of(fixture.store.execute_blocking(start_attempt("run-1", "intent-000001")));

    let first = start().trunc_subsecs(6);
    let later = (start() + chrono::TimeDelta::milliseconds(1_500)).trunc_subsecs(6);
    assert_ne!(first, start(), "the test clock has nanoseconds to drop");
    let events = fixture.store.reader().expect("reader").events_since(0).expect("events");
    let times: Vec<_> = events.iter().map(|e| e.at).collect();
    assert_eq!(times, vec![first, first, first, later]);
    assert_eq!(intent.last_sent_at, Some(later));
    // The writer's state and a fold of what it stored agree to the microsecond.
    let refolded = fixture.store.reader().expect("reader").ledger().expect("fold");
    assert_eq!(refolded.intent(&key("intent-000001")), Some(&intent));
}

/// Every event's cause names the event that caused it. An attempt's is its intent's first
/// event, the reservation, which an earlier batch wrote: the writer reads its seq from the log.
#[test]
fn an_attempt_in_a_later_batch_names_its_intents_reservation_as_its_cause() {
    let fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    fixture.store.execute_blocking(start_attempt("run-1", "intent-000001")).expect("attempt");
    let events = fixture.store.reader().expect("reader").events_since(0).expect("events");
    let parents: Vec<_> = events.iter().map(|e| (e.event.type_name(), e.cause.parent)).collect();
    assert_eq!(
        parents,
        [("RunStarted", None), ("StepRecorded", Some(1)), ("IntentReserved", Some(2)), ("AttemptStarted", Some(3))]
    );
}

/// Drives intents into several statuses and returns the replies' view of them.
fn varied_workload(fixture: &Fixture) {
    let store = &fixture.store;
    for (n, id) in
        ["intent-000001", "intent-000002", "intent-000003", "intent-000004", "intent-000005"].iter().enumerate()
    {
        let run = format!("run-{n}");
        store.execute_blocking(start_and_reserve(&run, charge(id, 100 * (n as i64 + 1)))).expect("reserved");
        if n == 4 {
            continue; // stays reserved
        }
        store.execute_blocking(start_attempt(&run, id)).expect("attempt");
        let result = match n {
            0 => succeed(id, 1, 100),
            1 => outcome(id, 1, CallOutcome::Declined { code: "card_declined".to_owned() }),
            2 => {
                outcome(id, 1, CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".to_owned() })
            }
            _ => outcome(id, 1, CallOutcome::NotSent { detail: "connection refused".to_owned() }),
        };
        store.execute_blocking(result).expect("outcome");
    }
    let finish = Command {
        cause: Cause::command("test"),
        start_run: None,
        lease: engine::lease::LeaseUse::None,
        keep: None,
        policy: None,
        action: Action::FinishRun {
            run_id: RunId::new("run-0"),
            status: engine::event::RunStatus::Completed,
            detail: None,
        },
    };
    store.execute_blocking(finish).expect("finished");
}

#[test]
fn state_after_a_restart_equals_state_before() {
    let mut fixture = Fixture::new();
    varied_workload(&fixture);
    let reader = fixture.store.reader().expect("reader");
    let ledger_before = reader.ledger().expect("fold");
    let (intents_before, runs_before) = (reader.intents(None).expect("intents"), reader.runs().expect("runs"));
    let statuses: Vec<&str> = intents_before.iter().map(|row| row.status.as_str()).collect();
    assert_eq!(statuses, ["validated", "declined", "outcome_unknown", "reserved", "reserved"]);
    assert_eq!(runs_before[0].status.as_str(), "completed");
    drop(reader);

    fixture.reopen();
    let reader = fixture.store.reader().expect("reader");
    let ledger_after = reader.ledger().expect("fold");
    assert_eq!(ledger_after.intents(), ledger_before.intents());
    assert_eq!(ledger_after.runs(), ledger_before.runs());
    assert_eq!(ledger_after.last_hash(), ledger_before.last_hash());
    assert_eq!(reader.intents(None).expect("intents"), intents_before);
    assert_eq!(reader.runs().expect("runs"), runs_before);
    assert_eq!(reader.intents(Some("declined")).expect("intents").len(), 1);

    // The reopened writer continues the same chain.
    fixture.store.execute_blocking(start_attempt("run-4", "intent-000005")).expect("attempt after restart");
    let events = reader.events_since(ledger_before.last_seq()).expect("new events");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].prev_hash, ledger_before.last_hash());
    assert!(reader.verify().expect("verify").is_ok());
}

#[test]
fn a_failed_batch_rolls_back_answers_unavailable_and_the_writer_goes_on() {
    let fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    // A projection write that fails after the batch's events were inserted and folded.
    fixture
        .raw()
        .execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON orders WHEN NEW.order_id = 'order-intent-000002' \
             BEGIN SELECT RAISE(ABORT, 'boom'); END",
        )
        .expect("install the fault");
    let failed = fixture.store.execute_blocking(start_and_reserve("run-2", charge("intent-000002", 666)));
    match failed {
        Err(LogError::Unavailable { detail, maybe_committed }) => {
            assert!(!maybe_committed);
            assert!(detail.contains("boom"), "{detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(fixture.event_count(), 3);
    assert_eq!(fixture.store.stats().failed_batches, 1);

    // The ledger was re-folded: the same seqs are reused, and the run can start for real.
    let (intent, fresh) =
        intent_of(fixture.store.execute_blocking(start_and_reserve("run-2", charge("intent-000003", 667))));
    assert!(fresh);
    assert_eq!(intent.last_seq, 6);
    assert_eq!(intent.status, IntentStatus::Reserved);
    assert!(fixture.store.reader().expect("reader").verify().expect("verify").is_ok());
}

#[test]
fn after_shutdown_every_handle_sees_the_store_closed() {
    let fixture = Fixture::new();
    let clone = fixture.store.clone();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    fixture.store.shutdown().expect("shutdown");
    fixture.store.shutdown().expect("a second shutdown is harmless");
    let answer = clone.execute_blocking(start_attempt("run-1", "intent-000001"));
    assert!(matches!(answer, Err(LogError::Unavailable { maybe_committed: false, .. })), "{answer:?}");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let answer = runtime.block_on(clone.execute(start_attempt("run-1", "intent-000001")));
    assert!(matches!(answer, Err(LogError::Unavailable { maybe_committed: false, .. })), "{answer:?}");
    assert_eq!(fixture.event_count(), 3);
}

#[test]
fn dropping_every_handle_drains_the_queue_before_the_thread_stops() {
    let fixture = Fixture::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("runtime");
    let store = fixture.store.clone();
    let answers = runtime.block_on(async move {
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let id = format!("intent-{i:06}");
                    store.execute(start_and_reserve(&format!("run-{i}"), charge(&id, 100))).await
                })
            })
            .collect();
        drop(store);
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        answers
    });
    let Fixture { path, store, .. } = fixture;
    drop(store);
    assert!(answers.iter().all(|a| matches!(a, Ok(Reply::Intent { fresh: true, .. }))));
    // The thread was joined: every answered command is in the file.
    let reader = store::Reader::open(&path).expect("reader");
    assert_eq!(reader.intents(None).expect("intents").len(), 32);
}

#[test]
fn the_wal_is_checkpointed_off_the_writer_so_it_stays_bounded() {
    let fixture = Fixture::new();
    // 1 200 commits, one reservation each: about 9 pages each, so without checkpoints the
    // WAL would hold some 40 MiB. The inline bound is 4 000 pages (16 MiB).
    for i in 0..1200 {
        fixture
            .store
            .execute_blocking(start_and_reserve(&format!("run-{i}"), charge(&format!("intent-{i:06}"), 100)))
            .expect("reserved");
    }
    // Measured while the store is open: closing the last connection checkpoints anyway.
    let wal = fixture.path.with_file_name("keel.db-wal");
    let wal_bytes = std::fs::metadata(&wal).map(|m| m.len()).expect("the WAL exists while the store is open");
    let bound = u64::from(store::WAL_AUTOCHECKPOINT_PAGES) * 4096 + 1024 * 1024;
    assert!(wal_bytes < bound, "the WAL grew to {wal_bytes} bytes, past the {bound}-byte bound");
    // And everything committed is in the database file or the WAL: nothing was lost.
    assert_eq!(fixture.event_count(), 1200 * 3);
}

/// A log's path in `dir`, store options whose busy timeout is short (50 ms: a lock held
/// longer outlasts many of them) and a manual clock.
fn impatient(
    dir: &tempfile::TempDir,
) -> (std::path::PathBuf, store::Options, std::sync::Arc<engine::clock::ManualClock>) {
    let options = store::Options { busy_timeout_ms: 50, ..store::Options::default() };
    (dir.path().join("keel.db"), options, std::sync::Arc::new(engine::clock::ManualClock::new(start())))
}

/// Another process's write lock on `path`, taken before this returns and given back once the
/// returned sender is told (or dropped); the handle ends with it.
fn hold_write_lock(path: &std::path::Path) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (held, release) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel::<()>());
    let holder_path = path.to_owned();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&holder_path).expect("a second connection");
        conn.execute_batch("BEGIN IMMEDIATE").expect("the write lock");
        held.0.send(()).expect("told");
        let _ = release.1.recv();
        conn.execute_batch("COMMIT").expect("the lock given back");
    });
    held.1.recv().expect("the lock is held");
    (release.0, holder)
}

/// Sixty-four `keel charge` processes opening one file: the open's migration check asks for
/// the write lock too, and SQLite's busy handler is not fair, so one process could lose it
/// for longer than a busy timeout and fail to open ("database is locked", `serve-bench`'s
/// spawned pass, 2 of 1 024). The open is as patient as a batch.
#[test]
fn an_open_waits_out_another_process_holding_the_write_lock_past_one_busy_timeout() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, options, clock) = impatient(&dir);
    store::Store::open(&path, options.clone(), clock.clone()).expect("the file is made").shutdown().expect("shutdown");
    let (release, holder) = hold_write_lock(&path);
    let opening = std::thread::spawn(move || store::Store::open(&path, options, clock));
    // Held for many of the opener's busy timeouts; an opener that gave up has ended by then.
    std::thread::sleep(std::time::Duration::from_millis(500));
    release.send(()).expect("release");
    holder.join().expect("the holder ends");
    let store = opening.join().expect("the opener returns").expect("the open waited for the lock, then opened");
    store.shutdown().expect("shutdown");
}

#[test]
fn a_batch_waits_out_another_process_holding_the_write_lock_past_one_busy_timeout() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, options, clock) = impatient(&dir);
    let store = store::Store::open(&path, options, clock).expect("the store opens");
    // Another process takes the write lock and keeps it for many of the writer's busy timeouts.
    let (release, holder) = hold_write_lock(&path);
    let answer = std::thread::scope(|scope| {
        let pending = scope.spawn(|| store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))));
        // Released only once the writer has asked again at least once: ordering, not timing.
        // (A writer that gives up instead ends the caller: then there is nothing to wait for.)
        while store.stats().lock_waits < 2 && !pending.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        release.send(()).expect("release");
        pending.join().expect("the caller returns")
    });
    holder.join().expect("the holder ends");
    let (intent, fresh) = intent_of(answer);
    assert!(fresh && intent.status == IntentStatus::Reserved, "the batch committed once the lock came back");
    let stats = store.stats();
    assert_eq!((stats.failed_batches, stats.events), (0, 3), "no batch failed, nothing lost: {stats:?}");
    store.shutdown().expect("shutdown");
}

/// Past its patience a batch stops asking: its callers learn the lock stayed taken, with
/// nothing committed, instead of waiting for ever behind a stuck process; the writer goes on.
#[test]
fn a_batch_gives_up_once_another_process_holds_the_write_lock_past_its_patience() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, options, clock) = impatient(&dir);
    // No patience at all: the first busy timeout ends the batch.
    let options = store::Options { write_lock_patience_ms: 0, ..options };
    let store = store::Store::open(&path, options, clock).expect("the store opens");
    let (release, holder) = hold_write_lock(&path);
    // The lock comes back only after the answer: a writer that kept asking never answers.
    let answer = store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100)));
    release.send(()).expect("release");
    holder.join().expect("the holder ends");
    match answer {
        Err(LogError::Unavailable { detail, maybe_committed }) => {
            assert!(!maybe_committed, "nothing is written before the lock is held");
            assert!(detail.starts_with("database busy"), "{detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let stats = store.stats();
    assert_eq!((stats.lock_waits, stats.failed_batches, stats.events), (0, 1, 0), "asked once: {stats:?}");
    assert!(intent_of(store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100)))).1);
    store.shutdown().expect("shutdown");
}

#[test]
fn a_batch_takes_at_most_the_batch_bound_of_the_commands_queued_behind_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, options, clock) = impatient(&dir);
    let store = store::Store::open(&path, options, clock).expect("the store opens");
    // Another process holds the write lock, so the writer's first batch waits with one command.
    let (release, holder) = hold_write_lock(&path);
    let waiting = store.clone();
    let first =
        std::thread::spawn(move || waiting.execute_blocking(start_and_reserve("run-0", charge("intent-000000", 100))));
    // Ordering, not timing: the first batch has asked for the lock, so it holds its one command.
    while store.stats().lock_waits == 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // One more than a batch's bound queued behind it: each future polled once has sent its
    // command and waits for the answer.
    let mut queued: Vec<_> = (1..=WRITER_BATCH_MAX + 1)
        .map(|i| store.execute(start_and_reserve(&format!("run-{i}"), charge(&format!("intent-{i:06}"), 100))))
        .collect();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for future in &mut queued {
        assert!(future.as_mut().poll(&mut cx).is_pending(), "answered before the lock came back");
    }
    release.send(()).expect("release");
    holder.join().expect("the holder ends");
    assert!(intent_of(first.join().expect("the first caller returns")).1);
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    for future in queued {
        assert!(intent_of(runtime.block_on(future)).1);
    }
    let stats = store.stats();
    assert_eq!(stats.commands, WRITER_BATCH_MAX as u64 + 2);
    assert_eq!(stats.batches, 3, "the first command, a full batch, then the one left over: {stats:?}");
    store.shutdown().expect("shutdown");
}

#[test]
fn the_verified_point_is_recorded_in_the_batch_that_passes_the_mark_and_not_before() {
    let fixture = Fixture::new();
    let verified = || -> u64 {
        let text: String = fixture
            .raw()
            .query_row("SELECT value FROM meta WHERE key = 'verified_seq'", [], |row| row.get(0))
            .expect("meta holds the verified point");
        text.parse().expect("a sequence")
    };
    let reserve = |i: u64| {
        let id = format!("intent-{i:06}");
        fixture.store.execute_blocking(start_and_reserve(&format!("run-{i}"), charge(&id, 100))).expect("reserved");
    };
    // Three events a reservation, one reservation a batch: `short` of them end just below the
    // mark, one more ends at or past it.
    let short = (VERIFIED_MARK_EVENTS - 1) / 3;
    for i in 0..short {
        reserve(i);
    }
    assert_eq!(verified(), 0, "recorded before the log grew by the mark");
    reserve(short);
    assert_eq!(verified(), 3 * (short + 1), "recorded by the batch that passed the mark, the store still open");
}

#[test]
fn only_a_batch_that_appends_passes_the_crash_point_before_its_commit() {
    let fired = std::sync::Arc::new(std::sync::Mutex::new(0_u32));
    let seen = std::sync::Arc::clone(&fired);
    let hook: engine::failpoints::Hook =
        std::sync::Arc::new(move |_| *seen.lock().expect("the count is never poisoned") += 1);
    let failpoints = engine::failpoints::Failpoints::armed(engine::failpoints::Point::InBatchBeforeCommit, 1, hook);
    let dir = tempfile::tempdir().expect("a temp dir");
    let clock = std::sync::Arc::new(engine::clock::ManualClock::new(start()));
    let options = store::Options { failpoints, ..store::Options::default() };
    let store = store::Store::open(&dir.path().join("keel.db"), options, clock).expect("the store opens");
    let refused = store.execute_blocking(start_attempt("run-1", "intent-nobody"));
    assert!(matches!(refused, Err(LogError::Refused(_))), "{refused:?}");
    assert_eq!(*fired.lock().expect("not poisoned"), 0, "a batch that appends nothing has nothing to lose");
    store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    assert_eq!(*fired.lock().expect("not poisoned"), 1, "the reservation's batch passed the point");
    store.shutdown().expect("shutdown");
}
