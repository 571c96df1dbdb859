//! Concurrency: 8 workers, each with its own `store::Store` (its own writer thread and
//! connection) on one SQLite file, propose 1 000 charges each; a quarter of the keys are
//! shared by every worker. Exactly one reservation wins per key (the writer's catch-up under
//! `BEGIN IMMEDIATE`), and the provider — one that does NOT deduplicate, so a second attempt
//! would show — holds exactly one effect per key.

use adapters::stripe::local_capability;
use chrono::{TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, Event, RunId, RunLimits};
use engine::executor::{Executor, RunRequest, Runtime};
use engine::memory::MemoryProvider;
use engine::provider::Capability;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use testkit::sample::{CARD_TOKEN, TENANT};

const WORKERS: usize = 8;
const INTENTS_PER_WORKER: usize = 1_000;
const SHARED_KEYS: usize = INTENTS_PER_WORKER / 4;
const IN_FLIGHT_PER_WORKER: usize = 32;

#[test]
fn eight_workers_on_one_database_reserve_each_key_once() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 5, 1, 8, 0, 0).single().expect("valid")));
    let provider = Arc::new(MemoryProvider::new(Capability {
        dedup_by_key: false,
        lookup: true,
        key_window_ms: 86_400_000,
        consistency_window_ms: 2_000,
        request_timeout_ms: 0,
    }));
    let threads: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let (db, clock, provider) = (db.clone(), clock.clone(), provider.clone());
            std::thread::spawn(move || {
                // Eight writers take turns on one lock on two cores: a batch may wait for seven others.
                let options = store::Options {
                    durability: store::Durability::Normal,
                    busy_timeout_ms: 60_000,
                    ..Default::default()
                };
                let store = store::Store::open(&db, options, clock.clone()).expect("opens");
                let runtime = Runtime {
                    log: Arc::new(store.clone()),
                    provider,
                    clock,
                    lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("worker")),
                };
                let executor = Executor::new(runtime, workflows::builtin(None));
                let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                tokio.block_on(async {
                    let ids: Vec<String> = (0..INTENTS_PER_WORKER)
                        .map(|j| {
                            if j % 4 == 0 {
                                format!("shared_{:06}_charge", (j / 4 + worker * 37) % SHARED_KEYS)
                            } else {
                                format!("worker_{worker}_{j:06}_charge")
                            }
                        })
                        .collect();
                    for chunk in ids.chunks(IN_FLIGHT_PER_WORKER) {
                        let runs = chunk.iter().map(|id| {
                            let executor = executor.clone();
                            let input = json!({"tenant_id": TENANT, "intent_id": id, "order_id": format!("order_{id}"),
                                               "amount_minor": 2_500, "currency": "EUR",
                                               "payment_method_token": CARD_TOKEN});
                            let request = RunRequest {
                                run_id: RunId::new(format!("w{worker}-{id}")),
                                limits: RunLimits {
                                    cost_minor_max: None,
                                    reconciliations_per_intent_max: 3,
                                    network_retries_max: None,
                                    reconciliations_max: None,
                                    ..RunLimits::default()
                                },
                                deadline_ms: 600_000,
                                cause: Cause::command("concurrency"),
                            };
                            tokio::spawn(async move { executor.start("charge", &input, request).await })
                        });
                        let handles: Vec<_> = runs.collect();
                        for handle in handles {
                            handle.await.expect("no panic").expect("an outcome");
                        }
                    }
                });
                store.shutdown().expect("clean shutdown");
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a worker thread");
    }

    let reader = store::Reader::open(&db).expect("opens");
    let events = reader.events_since(0).expect("reads");
    let mut reservations: HashMap<String, u32> = HashMap::new();
    for stored in &events {
        if let Event::IntentReserved { intent, .. } = &stored.event {
            *reservations.entry(intent.key.to_string()).or_default() += 1;
        }
    }
    let distinct = WORKERS * (INTENTS_PER_WORKER - SHARED_KEYS) + SHARED_KEYS;
    assert_eq!(reservations.len(), distinct, "every key reserved");
    assert!(reservations.values().all(|n| *n == 1), "exactly one reservation wins per key");
    let effects: Vec<testkit::Effect> = provider.effects().into_iter().map(testkit::Effect::from).collect();
    assert_eq!(effects.len(), distinct, "one effect per key, none duplicated");
    let report = testkit::invariants::check(&events, &effects);
    assert!(report.is_ok(), "{report:#?}");
    assert!(reader.verify().expect("verifies").is_ok());
}

/// A log that lets "another worker" complete a whole attempt on a key just before this
/// caller's own `StartAttempt` reaches the writer: the interleaving two concurrent
/// proposals of one key produce, made deterministic.
struct Interleaved {
    inner: Arc<engine::memory::MemoryLog>,
    raced: std::sync::atomic::AtomicBool,
}

impl engine::log::EventLog for Interleaved {
    fn execute(
        &self,
        command: engine::ledger::Command,
    ) -> engine::provider::BoxFuture<'_, Result<engine::ledger::Reply, engine::log::LogError>> {
        use engine::ledger::{Action, Command};
        use engine::provider::{CallOutcome, Evidence};
        Box::pin(async move {
            // This caller reserves without writing its first attempt ahead (as a caller without
            // the payment method would), which opens the window the other worker uses.
            let mut command = command;
            if let Action::Reserve { start_attempt, .. } = &mut command.action {
                *start_attempt = false;
            }
            if let Action::StartAttempt { key, run_id } = &command.action
                && !self.raced.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                // Another task acting for the same run, under its lease.
                let other = |action| Command::new(Cause::command("other worker"), action).under(command.lease.clone());
                self.inner.execute_now(&other(Action::StartAttempt { key: key.clone(), run_id: run_id.clone() }))?;
                let evidence =
                    Evidence { provider_ref: "ch_other".into(), amount_minor: 2_500, currency: "EUR".into() };
                self.inner.execute_now(&other(Action::RecordOutcome {
                    key: key.clone(),
                    attempt: 1,
                    outcome: CallOutcome::Succeeded(evidence),
                }))?;
            }
            self.inner.execute_now(&command)
        })
    }
}

/// Regression: a proposal that found the key reserved and lost the race for its first
/// attempt used to fail the whole run with an internal error ("is validated: no new
/// attempt"). It must report the intent's state instead — here, validated — and send nothing.
#[test]
fn a_proposal_that_loses_the_race_for_the_attempt_reports_the_winners_outcome() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 5, 1, 8, 0, 0).single().expect("valid")));
    let inner = Arc::new(engine::memory::MemoryLog::new(clock.clone()));
    let log = Arc::new(Interleaved { inner: inner.clone(), raced: std::sync::atomic::AtomicBool::new(false) });
    let provider = Arc::new(MemoryProvider::new(stripe()));
    let executor = Executor::new(
        Runtime {
            log,
            provider: provider.clone(),
            clock,
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("executor")),
        },
        workflows::builtin(None),
    );
    let input = json!({"tenant_id": TENANT, "intent_id": "order_3001_charge", "order_id": "order_3001",
                       "amount_minor": 2_500, "currency": "EUR", "payment_method_token": CARD_TOKEN});
    let request = RunRequest {
        run_id: RunId::new("late"),
        limits: RunLimits {
            cost_minor_max: None,
            reconciliations_per_intent_max: 3,
            network_retries_max: None,
            reconciliations_max: None,
            ..RunLimits::default()
        },
        deadline_ms: 600_000,
        cause: Cause::command("late"),
    };
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let outcome = tokio.block_on(executor.start("charge", &input, request)).expect("an outcome, not an error");
    assert_eq!(outcome.output["status"], "validated", "{}", outcome.output);
    assert_eq!(outcome.output["provider_ref"], "ch_other");
    assert_eq!(provider.effects().len(), 0, "this caller sent nothing");
}

/// A Stripe-like provider whose requests are over at once: a resend waits for the
/// consistency window only, not for a request timeout too.
fn stripe() -> Capability {
    Capability { request_timeout_ms: 0, ..local_capability() }
}
