//! The store's per-entity decisions against the whole-log reference model.
//!
//! Random histories of commands — reservations sharing orders and references, attempts and
//! their outcomes, reconciliations, approvals, cancellations, recoveries, durable timers and
//! the resume pass's snapshot of the runs awake and asleep, run ends, restarts
//! of the store (a cold cache) and clock steps — are sent to a `Store` (decisions over its
//! entity rows and cache) and to an in-memory `MemoryLog` (decisions over the whole-log
//! `Ledger`, the reference). Every reply must be the same, the two logs must be the same
//! event for event (so the same hash chain), and at the end the store's entity rows must be
//! what the reference folded, and `verify` must pass. Failing cases shrink and print their
//! history; `PROPTEST_CASES` raises the count.

use crate::support::start;
use chrono::{DateTime, TimeDelta, Utc};
use engine::canonical::fingerprint;
use engine::clock::ManualClock;
use engine::event::{Cause, IntentDefinition, IntentKey, RunId, RunLimits};
use engine::lease::LeaseOwner;
use engine::ledger::{Action, Command, IntentSpec, RunStart, View as _};
use engine::memory::MemoryLog;
use engine::provider::{CallOutcome, Capability, EffectKind, Evidence, LookupOutcome, UnknownReason};
use proptest::prelude::*;
use serde_json::json;
use std::sync::Arc;
use store::{Durability, IntentRow, Options, RunRow, Store};

#[derive(Clone, Debug)]
enum Op {
    Reserve { run: u8, intent: u8, refund: bool, order: u8, reference: u8, amount: u16, go: bool, start: bool },
    StartAttempt { intent: u8, refund: bool, run: u8 },
    Outcome { intent: u8, refund: bool, attempt: u8, outcome: u8 },
    Reconcile { intent: u8, refund: bool, run: u8, force: bool },
    Lookup { intent: u8, refund: bool, reconciliation: u8, outcome: u8 },
    Approve { intent: u8, refund: bool },
    Deny { intent: u8, refund: bool },
    Cancel { intent: u8, refund: bool },
    Recover,
    Snapshot,
    Finish { run: u8 },
    Timer { run: u8, ms: u16, start: bool },
    LoadRun { run: u8 },
    Reopen,
    Advance { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    let intent = 0u8..6;
    prop_oneof![
        6 => (0u8..3, intent.clone(), any::<bool>(), 0u8..3, 0u8..3, 1u16..400, any::<bool>(), any::<bool>()).prop_map(
            |(run, intent, refund, order, reference, amount, go, start)| Op::Reserve {
                run, intent, refund, order, reference, amount, go, start
            }
        ),
        4 => (intent.clone(), any::<bool>(), 0u8..3).prop_map(|(intent, refund, run)| Op::StartAttempt { intent, refund, run }),
        4 => (intent.clone(), any::<bool>(), 1u8..3, 0u8..4)
            .prop_map(|(intent, refund, attempt, outcome)| Op::Outcome { intent, refund, attempt, outcome }),
        2 => (intent.clone(), any::<bool>(), 0u8..3, any::<bool>())
            .prop_map(|(intent, refund, run, force)| Op::Reconcile { intent, refund, run, force }),
        2 => (intent.clone(), any::<bool>(), 1u8..3, 0u8..3)
            .prop_map(|(intent, refund, reconciliation, outcome)| Op::Lookup { intent, refund, reconciliation, outcome }),
        1 => (intent.clone(), any::<bool>()).prop_map(|(intent, refund)| Op::Approve { intent, refund }),
        1 => (intent.clone(), any::<bool>()).prop_map(|(intent, refund)| Op::Deny { intent, refund }),
        1 => (intent, any::<bool>()).prop_map(|(intent, refund)| Op::Cancel { intent, refund }),
        1 => Just(Op::Recover),
        1 => Just(Op::Snapshot),
        1 => (0u8..3).prop_map(|run| Op::Finish { run }),
        // A timer firing now (0 ms) sits exactly on the edge a decision's instant compares it with.
        2 => (0u8..3, prop_oneof![Just(0u16), 1u16..3_000], any::<bool>())
            .prop_map(|(run, ms, start)| Op::Timer { run, ms, start }),
        1 => (0u8..3).prop_map(|run| Op::LoadRun { run }),
        1 => Just(Op::Reopen),
        1 => (1u16..5_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn kind(refund: bool) -> EffectKind {
    if refund { EffectKind::Refund } else { EffectKind::Charge }
}

fn key(intent: u8, refund: bool) -> IntentKey {
    IntentKey::new(kind(refund), "t1", &format!("intent_{intent:04}"))
}

fn run_id(run: u8) -> RunId {
    RunId::new(format!("run-{run}"))
}

fn spec(intent: u8, refund: bool, order: u8, reference: u8, amount: u16) -> IntentSpec {
    let payload = json!({"order_id": format!("o{order}"), "amount_minor": amount, "currency": "EUR"});
    IntentSpec {
        definition: IntentDefinition {
            key: key(intent, refund),
            kind: kind(refund),
            tenant: "t1".to_owned(),
            intent_id: format!("intent_{intent:04}"),
            order_id: format!("o{order}"),
            // Reference 0 is the order id itself (entered through `orders` only).
            business_ref: if reference == 0 { format!("o{order}") } else { format!("ref{reference}") },
            fingerprint: fingerprint(&payload),
            amount_minor: i64::from(amount),
            currency: "EUR".to_owned(),
            payload,
            tool: None,
        },
        capability: Capability {
            dedup_by_key: intent % 3 != 2,
            lookup: intent % 3 != 1,
            key_window_ms: 86_400_000,
            consistency_window_ms: 1_000,
            request_timeout_ms: 500,
        },
        approval_required: intent % 4 == 3,
    }
}

fn run_start(run: u8, now: DateTime<Utc>) -> RunStart {
    RunStart {
        run_id: run_id(run),
        workflow: "charge".to_owned(),
        input: json!({"run": run}),
        deadline_at: now + TimeDelta::minutes(10),
        limits: RunLimits {
            cost_minor_max: Some(900),
            attempts_per_intent_max: 3,
            reconciliations_per_intent_max: 2,
            approval_threshold_minor: Some(300),
            policy: None,
            network_retries_max: None,
            reconciliations_max: None,
        },
        versions: Default::default(),
        owner: None,
    }
}

fn evidence(intent: u8, amount: i64) -> Evidence {
    Evidence { provider_ref: format!("ch_{intent}"), amount_minor: amount, currency: "EUR".to_owned() }
}

/// The command for `op`, given what the reference knows (journal positions, amounts, the
/// attempt and reconciliation in flight), so most commands are plausible ones.
fn command(op: &Op, model: &MemoryLog, now: DateTime<Utc>) -> Option<Command> {
    let ledger = model.ledger();
    let cause = |run: Option<u8>| match run {
        Some(run) => Cause::command("prop").for_run(&run_id(run)),
        None => Cause::command("prop"),
    };
    let amount_of = |k: &IntentKey| ledger.intent(k).map_or(1, |i| i.definition.amount_minor);
    Some(match op {
        Op::Reserve { run, intent, refund, order, reference, amount, go, start } => {
            let position = ledger.run(&run_id(*run)).map_or(0, |r| r.journal_len);
            let action = Action::Reserve {
                run_id: run_id(*run),
                position,
                spec: spec(*intent, *refund, *order, *reference, *amount),
                start_attempt: *go,
            };
            Command::new(cause(Some(*run)), action).starting(start.then(|| run_start(*run, now)))
        }
        Op::StartAttempt { intent, refund, run } => {
            Command::new(cause(Some(*run)), Action::StartAttempt { key: key(*intent, *refund), run_id: run_id(*run) })
        }
        Op::Outcome { intent, refund, attempt, outcome } => {
            let k = key(*intent, *refund);
            let outcome = match outcome {
                0 => CallOutcome::Succeeded(evidence(*intent, amount_of(&k))),
                1 => CallOutcome::Declined { code: "card_declined".to_owned() },
                2 => CallOutcome::NotSent { detail: "refused".to_owned() },
                _ => CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".to_owned() },
            };
            Command::new(cause(None), Action::RecordOutcome { key: k, attempt: u32::from(*attempt), outcome })
        }
        Op::Reconcile { intent, refund, run, force } => Command::new(
            cause(Some(*run)),
            Action::StartReconciliation { key: key(*intent, *refund), force: *force, run_id: run_id(*run) },
        ),
        Op::Lookup { intent, refund, reconciliation, outcome } => {
            let k = key(*intent, *refund);
            let outcome = match outcome {
                0 => LookupOutcome::Found(evidence(*intent, amount_of(&k))),
                1 => LookupOutcome::Absent,
                _ => LookupOutcome::Unavailable { detail: "503".to_owned() },
            };
            Command::new(
                cause(None),
                Action::RecordLookup { key: k, reconciliation: u32::from(*reconciliation), outcome },
            )
        }
        Op::Approve { intent, refund } => Command::new(
            Cause::operator("ana"),
            Action::Approve { key: key(*intent, *refund), by: "ana".to_owned(), ttl_ms: 2_000, fingerprint: None },
        ),
        Op::Deny { intent, refund } => Command::new(
            Cause::operator("ana"),
            Action::Deny { key: key(*intent, *refund), by: "ana".to_owned(), reason: "no".to_owned() },
        ),
        Op::Cancel { intent, refund } => Command::new(
            Cause::operator("bob"),
            Action::Cancel { key: key(*intent, *refund), by: "bob".to_owned(), reason: "left".to_owned() },
        ),
        Op::Recover => Command::new(Cause::recovery(), Action::Recover { owner: LeaseOwner::named("prop"), run: None }),
        Op::Snapshot => Command::new(cause(None), Action::Snapshot),
        Op::Finish { run } => Command::new(
            cause(Some(*run)),
            Action::FinishRun { run_id: run_id(*run), status: engine::event::RunStatus::Completed, detail: None },
        ),
        Op::LoadRun { run } => Command::new(cause(None), Action::LoadRun { run_id: run_id(*run) }),
        Op::Timer { run, ms, start } => {
            let position = ledger.run(&run_id(*run)).map_or(0, |r| r.journal_len);
            let fire_at = now + TimeDelta::milliseconds(i64::from(*ms));
            let action = Action::StartTimer { run_id: run_id(*run), position, fire_at };
            Command::new(cause(Some(*run)), action).starting(start.then(|| run_start(*run, now)))
        }
        Op::Reopen | Op::Advance { .. } => return None,
    })
}

fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("keel.db");
    let clock = Arc::new(ManualClock::new(start()));
    let options = || Options { durability: Durability::Normal, ..Options::default() };
    let mut store = Store::open(&path, options(), clock.clone()).expect("opens");
    let model = MemoryLog::new(clock.clone());
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Reopen => {
                store.shutdown().expect("shutdown");
                store = Store::open(&path, options(), clock.clone()).expect("reopens");
            }
            Op::Advance { ms } => clock.advance_ms(i64::from(*ms)),
            _ => {
                use engine::clock::Clock as _;
                let Some(command) = command(op, &model, clock.now()) else { continue };
                let expected = format!("{:?}", model.execute_now(&command));
                let found = format!("{:?}", store.execute_blocking(command));
                prop_assert_eq!(found, expected, "op {} ({:?}) decided differently", i, op);
            }
        }
    }
    let reader = store.reader().expect("a reader");
    let stored = reader.events_since(0).expect("events");
    let reference = model.events();
    prop_assert_eq!(stored.len(), reference.len());
    for (a, b) in stored.iter().zip(&reference) {
        prop_assert_eq!(a, b, "the two logs differ at seq {}", b.seq);
    }
    let ledger = model.ledger();
    let rows: Vec<IntentRow> = ledger.intents().into_iter().map(IntentRow::from_intent).collect();
    prop_assert_eq!(reader.intents(None).expect("intents"), rows);
    let runs: Vec<RunRow> =
        ledger.runs().into_iter().map(|r| RunRow::from_run(r, &ledger.run_intents(&r.run_id))).collect();
    prop_assert_eq!(reader.runs().expect("runs"), runs);
    let report = reader.verify().expect("verify runs");
    prop_assert!(report.is_ok(), "{}", report);
    store.shutdown().expect("shutdown");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn per_entity_decisions_equal_whole_log_decisions(ops in proptest::collection::vec(op(), 1..60)) {
        check(&ops)?;
    }
}
