//! Many callers, two threads, two stores on one file: group commit and atomic reservation.

use crate::support::{Fixture, charge, intent_of, key, start_and_reserve, start_attempt, succeed};
use engine::ledger::IntentStatus;
use engine::log::EventLog;
use std::sync::{Arc, Barrier};
use store::Store;

#[test]
fn sixty_four_concurrent_callers_share_commits_and_are_answered_after_them() {
    const CALLERS: usize = 64;
    let fixture = Fixture::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("runtime");
    let store = fixture.store.clone();
    runtime.block_on(async move {
        let tasks: Vec<_> = (0..CALLERS)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    // Each caller reads through its own connection: what it sees there was
                    // committed before its answer arrived.
                    let reader = store.reader().expect("reader");
                    let id = format!("intent-{i:06}");
                    let run = format!("run-{i}");
                    let (intent, fresh) = intent_of(store.execute(start_and_reserve(&run, charge(&id, 100))).await);
                    assert!(fresh);
                    assert_eq!(reader.intent(intent.key()).expect("read").expect("committed").status, "reserved");
                    intent_of(store.execute(start_attempt(&run, &id)).await);
                    assert_eq!(reader.intent(&key(&id)).expect("read").expect("row").status, "attempting");
                    let (intent, _) = intent_of(store.execute(succeed(&id, 1, 100)).await);
                    assert_eq!(intent.status, IntentStatus::Validated);
                    assert_eq!(reader.intent(&key(&id)).expect("read").expect("row").status, "validated");
                    assert!(store.stats().commits >= 1);
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("caller");
        }
    });
    let stats = fixture.store.stats();
    let commands = (CALLERS * 3) as u64;
    assert_eq!(stats.commands, commands);
    assert_eq!(stats.events, (CALLERS * 5) as u64);
    assert!(stats.batches < commands, "no batching: {stats:?}");
    assert!(stats.commits < commands, "one commit per command: {stats:?}");
    assert!(stats.commits <= stats.batches);
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.intents, CALLERS as u64);
}

/// Two threads race to reserve the same keys through `stores.0` and `stores.1`; returns, per
/// key, which side got `fresh: true`, after checking the loser saw the winner's run.
fn race(stores: (Store, Store), keys: usize) -> Vec<bool> {
    let barrier = Arc::new(Barrier::new(2));
    let side = |store: Store, name: &'static str| {
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || {
            (0..keys)
                .map(|k| {
                    barrier.wait();
                    let id = format!("intent-race-{k:04}");
                    let run = format!("run-{name}-{k}");
                    let (intent, fresh) = intent_of(store.execute_blocking(start_and_reserve(&run, charge(&id, 100))));
                    (fresh, intent.run_id.as_str().to_owned(), run)
                })
                .collect::<Vec<_>>()
        })
    };
    let a = side(stores.0, "a");
    let b = side(stores.1, "b");
    let (a, b) = (a.join().expect("side a"), b.join().expect("side b"));
    a.into_iter()
        .zip(b)
        .map(|((a_fresh, a_sees, a_run), (b_fresh, b_sees, b_run))| {
            assert!(a_fresh != b_fresh, "exactly one reservation wins");
            let winner = if a_fresh { &a_run } else { &b_run };
            assert_eq!(&a_sees, winner, "both sides see the winner's reservation");
            assert_eq!(&b_sees, winner, "both sides see the winner's reservation");
            a_fresh
        })
        .collect()
}

#[test]
fn two_threads_reserving_one_key_get_exactly_one_fresh_reservation() {
    let fixture = Fixture::new();
    let winners = race((fixture.store.clone(), fixture.store.clone()), 20);
    assert_eq!(winners.len(), 20);
    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.intents, 20);
    assert_eq!(report.runs, 40, "the loser's run starts too, and journals the shared intent");
}

#[test]
fn two_stores_on_one_file_never_fork_and_each_sees_the_others_commits() {
    let fixture = Fixture::new();
    let other = fixture.second_store();
    let winners = race((fixture.store.clone(), other.clone()), 30);

    // Catch-up: this store drives an intent the other process reserved, and the other way.
    let k = winners.iter().position(|a_won| !*a_won).unwrap_or(0);
    let id = format!("intent-race-{k:04}");
    let run = if winners[k] { format!("run-a-{k}") } else { format!("run-b-{k}") };
    let reply = fixture.store.execute_blocking(start_attempt(&run, &id));
    assert_eq!(intent_of(reply).0.status, IntentStatus::Attempting);
    let reply = other.execute_blocking(succeed(&id, 1, 100));
    assert_eq!(intent_of(reply).0.status, IntentStatus::Validated);

    let report = fixture.store.reader().expect("reader").verify().expect("verify");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.intents, 30);
    let (ours, theirs) = (fixture.store.stats(), other.stats());
    assert_eq!(ours.events + theirs.events, report.events);
    assert!(ours.events > 0 && theirs.events > 0, "both processes appended: {ours:?} {theirs:?}");
    other.shutdown().expect("shutdown");
    assert!(matches!(fixture.store.execute_blocking(start_attempt(&run, &id)), Err(engine::log::LogError::Refused(_))));
}

/// Regression: eight stores opening one brand-new file at the same instant all open it. The
/// switch to WAL takes an exclusive lock and SQLite answers BUSY there without waiting, so
/// all but one used to fail with "database is locked" (found by the 8-worker test of the
/// root suite).
#[test]
fn eight_stores_opening_a_new_file_at_once_all_succeed() {
    for round in 0..5 {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join(format!("fresh-{round}.db"));
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let clock = Arc::new(engine::clock::ManualClock::new(crate::support::start()));
                    let store = Store::open(&path, store::Options::default(), clock).expect("opens despite the race");
                    store.shutdown().expect("shuts down");
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread failed");
        }
    }
}

#[test]
fn a_cached_entity_is_dropped_when_another_process_appends_to_its_stream() {
    let fixture = Fixture::new();
    let other = fixture.second_store();
    // This store reserves the intent and keeps it (and its run) in its cache.
    let (reserved, _) =
        intent_of(fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))));
    assert_eq!(reserved.status, IntentStatus::Reserved);
    // The other process moves it on: an attempt, then its success.
    intent_of(other.execute_blocking(start_attempt("run-1", "intent-000001")));
    intent_of(other.execute_blocking(succeed("intent-000001", 1, 100)));
    // Deciding from its cache, this store would see it reserved and start attempt 1 again;
    // its catch-up dropped the cached entity, so it sees the validated intent instead.
    let again = fixture.store.execute_blocking(start_attempt("run-1", "intent-000001"));
    assert!(
        !matches!(again, Err(engine::log::LogError::Unavailable { .. })),
        "decided on a stale view, the append would have collided: {again:?}"
    );
    assert_eq!(fixture.store.stats().failed_batches, 0);
    let observed = fixture.store.execute_blocking(engine::ledger::Command::new(
        engine::event::Cause::command("test"),
        engine::ledger::Action::Observe { key: key("intent-000001") },
    ));
    let (intent, _) = intent_of(observed);
    assert_eq!((intent.status, intent.attempts), (IntentStatus::Validated, 1));
    other.shutdown().expect("shutdown");
    assert!(fixture.store.reader().expect("reader").verify().expect("verify").is_ok());
}
