//! Measures the writer alone: `cargo run --release -p store --example throughput -- [INTENTS]
//! [CALLERS] [full|normal]`.
//!
//! Each intent is three commands from one caller — start a run and reserve the intent (3
//! events), start its attempt (1), record its success (1) — with `CALLERS` callers sharing
//! the store. Prints intents/s, events/s and commits (fsyncs) per intent. Nothing is
//! asserted: it only measures. The system clock is read here only to time the run.

use chrono::{DateTime, TimeDelta, Utc};
use engine::canonical::fingerprint;
use engine::clock::ManualClock;
use engine::event::{Cause, IntentDefinition, IntentKey, RunId, RunLimits};
use engine::ledger::{Action, Command, IntentSpec, RunStart};
use engine::log::EventLog;
use engine::provider::{CallOutcome, Capability, EffectKind, Evidence};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use store::{Durability, Options, Store};

fn commands(i: usize, start: DateTime<Utc>) -> [Command; 3] {
    let id = format!("bench_intent_{i:08}");
    let run_id = RunId::new(format!("run-{i:08}"));
    let key = IntentKey::new(EffectKind::Charge, "t1", &id);
    let amount_minor = 1_000 + (i % 9_000) as i64;
    let payload = json!({"order_id": format!("order_{i:08}"), "amount_minor": amount_minor, "currency": "EUR"});
    let spec = IntentSpec {
        definition: IntentDefinition {
            key: key.clone(),
            kind: EffectKind::Charge,
            tenant: "t1".to_owned(),
            intent_id: id.clone(),
            order_id: format!("order_{i:08}"),
            business_ref: format!("order_{i:08}"),
            fingerprint: fingerprint(&payload),
            amount_minor,
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
    let cause = Cause::command("bench").for_run(&run_id);
    [
        Command {
            cause: cause.clone(),
            start_run: Some(RunStart {
                run_id: run_id.clone(),
                workflow: "charge".to_owned(),
                input: json!({"intent_id": id}),
                deadline_at: start + TimeDelta::minutes(10),
                limits: RunLimits {
                    cost_minor_max: None,
                    attempts_per_intent_max: 3,
                    reconciliations_per_intent_max: 5,
                    approval_threshold_minor: None,
                    policy: None,
                    network_retries_max: None,
                    reconciliations_max: None,
                },
                versions: Default::default(),
                owner: None,
            }),
            lease: engine::lease::LeaseUse::None,
            keep: None,
            policy: None,
            action: Action::Reserve { run_id: run_id.clone(), position: 0, spec, start_attempt: false },
        },
        Command {
            cause: cause.clone(),
            start_run: None,
            lease: engine::lease::LeaseUse::None,
            keep: None,
            policy: None,
            action: Action::StartAttempt { key: key.clone(), run_id: run_id.clone() },
        },
        Command {
            cause,
            start_run: None,
            lease: engine::lease::LeaseUse::None,
            keep: None,
            policy: None,
            action: Action::RecordOutcome {
                key,
                attempt: 1,
                outcome: CallOutcome::Succeeded(Evidence {
                    provider_ref: format!("ch_{i}"),
                    amount_minor,
                    currency: "EUR".to_owned(),
                }),
            },
        },
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let intents: usize = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let callers: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let durability = match args.next().as_deref() {
        Some("normal") => Durability::Normal,
        _ => Durability::Full,
    };
    let dir = tempfile::tempdir_in(".")?;
    let path = dir.path().join("bench.db");
    let start = DateTime::parse_from_rfc3339("2025-03-01T12:00:00Z")?.to_utc();
    let store = Store::open(&path, Options { durability, ..Options::default() }, Arc::new(ManualClock::new(start)))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build()?;
    let next = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    runtime.block_on(async {
        let workers: Vec<_> = (0..callers)
            .map(|_| {
                let (store, next) = (store.clone(), Arc::clone(&next));
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= intents {
                            break;
                        }
                        for command in commands(i, start) {
                            store.execute(command).await.expect("the bench's commands are accepted");
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("worker");
        }
    });
    let seconds = began.elapsed().as_secs_f64();
    let stats = store.stats();
    store.shutdown()?;
    println!(
        "{intents} intents, {callers} callers, {durability:?}: {seconds:.2} s, {:.0} intents/s, {:.0} events/s, \
         {} batches, {} commits = {:.4} fsyncs/intent, {:.1} commands/batch",
        intents as f64 / seconds,
        stats.events as f64 / seconds,
        stats.batches,
        stats.commits,
        stats.commits as f64 / intents as f64,
        stats.commands as f64 / stats.batches as f64,
    );
    let verified = store::Reader::open(&path)?.verify()?;
    println!("verify: {verified}");
    Ok(())
}
