//! Model-based property tests: random sequences of proposals, duplicates, mismatches,
//! crashes, restarts, provider answers, reconciliations, cancellations and manual
//! resolutions, run against Keel's executor over the in-memory log and provider (the same
//! decide/apply code the SQLite store runs), and checked after every step against a
//! reference model and Keel's invariants. A crash panics at a failpoint in the middle of an
//! operation and rebuilds the log by folding the committed events; a restart is
//! `recover_and_resume`. 1 000 cases by default (`PROPTEST_CASES` raises it); failures are
//! persisted under `tests/proptest-regressions/` (committed).

use chrono::{TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::{Executor, RunRequest, Runtime};
use engine::failpoints::{Failpoints, Point};
use engine::ledger::{Action, Command, IntentStatus};
use engine::log::EventLog;
use engine::memory::{MemoryLog, MemoryProvider, Scripted};
use engine::provider::{Capability, EffectKind};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use testkit::invariants::{self, Effect};
use testkit::sample::{CARD_TOKEN, TENANT};

const ORDERS: u8 = 3;

#[derive(Clone, Debug)]
enum Op {
    Propose(u8),
    Mismatch(u8),
    Refund(u8),
    /// A second, partial refund of the order under its own key.
    RefundPart(u8, u8),
    /// A refund whose amount would overflow the order's refunded total.
    RefundHuge(u8),
    /// A refund in another currency than the order's charge.
    RefundOtherCurrency(u8),
    Provider(Scripted),
    LookupLies(u32),
    LookupUnavailable(u32),
    CrashDuring(u8, Point),
    Restart,
    Reconcile,
    Advance(u32),
    Cancel(u8),
    Resolve(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let scripted = prop_oneof![
        Just(Scripted::Succeed),
        Just(Scripted::TimeoutBeforeEffect),
        Just(Scripted::LoseAnswer),
        Just(Scripted::FailAfterEffect),
        Just(Scripted::FailBeforeEffect),
        Just(Scripted::Decline),
        Just(Scripted::ConflictInFlight),
        Just(Scripted::Refuse),
    ];
    let point = prop_oneof![
        Just(Point::AfterReservation),
        Just(Point::AfterAttemptStarted),
        Just(Point::AfterProviderAnswer),
        Just(Point::AfterReconciliationStarted),
        Just(Point::AfterLookup),
    ];
    prop_oneof![
        4 => (0..ORDERS).prop_map(Op::Propose),
        1 => (0..ORDERS).prop_map(Op::Mismatch),
        2 => (0..ORDERS).prop_map(Op::Refund),
        1 => ((0..ORDERS), (1..4u8)).prop_map(|(i, n)| Op::RefundPart(i, n)),
        1 => (0..ORDERS).prop_map(Op::RefundHuge),
        1 => (0..ORDERS).prop_map(Op::RefundOtherCurrency),
        4 => scripted.prop_map(Op::Provider),
        1 => (1..3u32).prop_map(Op::LookupLies),
        1 => (1..3u32).prop_map(Op::LookupUnavailable),
        2 => ((0..ORDERS), point).prop_map(|(i, p)| Op::CrashDuring(i, p)),
        2 => Just(Op::Restart),
        2 => Just(Op::Reconcile),
        2 => (0..5_000u32).prop_map(Op::Advance),
        1 => (0..ORDERS).prop_map(Op::Cancel),
        1 => (0..ORDERS).prop_map(Op::Resolve),
    ]
}

fn capability() -> impl Strategy<Value = Capability> {
    (any::<bool>(), any::<bool>()).prop_map(|(dedup_by_key, lookup)| Capability {
        dedup_by_key,
        lookup,
        key_window_ms: 86_400_000,
        consistency_window_ms: 2_000,
        request_timeout_ms: 0,
    })
}

fn amount(i: u8) -> i64 {
    1_000 + i64::from(i) * 100
}

fn charge(i: u8, bump: i64) -> Value {
    json!({"tenant_id": TENANT, "intent_id": format!("model_order_{i}_charge"), "order_id": format!("order_{i}"),
           "amount_minor": amount(i) + bump, "currency": "EUR", "payment_method_token": CARD_TOKEN})
}

fn refund(i: u8) -> Value {
    refund_of(i, "refund", amount(i) / 2, "EUR")
}

fn refund_of(i: u8, name: &str, amount_minor: i64, currency: &str) -> Value {
    json!({"tenant_id": TENANT, "intent_id": format!("model_order_{i}_{name}"), "order_id": format!("order_{i}"),
           "amount_minor": amount_minor, "currency": currency})
}

fn charge_key(i: u8) -> IntentKey {
    IntentKey::new(EffectKind::Charge, TENANT, &format!("model_order_{i}_charge"))
}

/// The system under test, rebuilt after each crash.
struct World {
    clock: Arc<ManualClock>,
    provider: Arc<MemoryProvider>,
    log: Arc<MemoryLog>,
    runs: u32,
    /// Reference model: the amount each charge key was first reserved with.
    reserved: HashMap<u8, i64>,
}

impl World {
    fn executor(&self, failpoints: Failpoints) -> Executor {
        let runtime = Runtime {
            log: self.log.clone(),
            provider: self.provider.clone(),
            clock: self.clock.clone(),
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("model-test")),
        };
        Executor::new(runtime, workflows::builtin(None)).with_failpoints(failpoints)
    }

    fn request(&mut self) -> RunRequest {
        self.runs += 1;
        RunRequest {
            run_id: RunId::new(format!("model-{}", self.runs)),
            limits: RunLimits {
                cost_minor_max: Some(10_000),
                reconciliations_per_intent_max: 3,
                network_retries_max: None,
                reconciliations_max: None,
                ..RunLimits::default()
            },
            deadline_ms: 600_000,
            cause: Cause::command("model"),
        }
    }

    /// Drops every handle and folds the committed events into a fresh log: a restart.
    fn crash(&mut self) {
        self.log = Arc::new(MemoryLog::from_events(self.clock.clone(), self.log.events()));
    }

    async fn start(&mut self, workflow: &str, input: Value, failpoints: Failpoints) -> Option<Value> {
        let request = self.request();
        let executor = self.executor(failpoints);
        let (workflow, input) = (workflow.to_owned(), input);
        let result = tokio::spawn(async move { executor.start(&workflow, &input, request).await }).await;
        match result {
            Ok(outcome) => Some(outcome.expect("a run ends with an outcome").output),
            Err(_) => None, // the failpoint fired: crashed
        }
    }

    fn provider_dedups(&self) -> bool {
        use engine::provider::PaymentProvider as _;
        self.provider.capability().dedup_by_key
    }

    fn effects(&self) -> Vec<Effect> {
        self.provider.effects().into_iter().map(Effect::from).collect()
    }

    /// Invariants that hold after every step (liveness only at the end).
    fn check(&self, at_end: bool) -> Result<(), TestCaseError> {
        let events = self.log.events();
        let report = invariants::check(&events, &self.effects());
        let mut relevant = report.clone();
        if !at_end {
            relevant.unreconciled = 0;
        }
        prop_assert!(relevant.is_ok(), "{report:#?}");
        let refolded = MemoryLog::from_events(self.clock.clone(), events);
        prop_assert_eq!(invariants::render(&refolded.ledger()), invariants::render(&self.log.ledger()));
        Ok(())
    }
}

fn crashing(point: Point) -> Failpoints {
    Failpoints::armed(point, 1, Arc::new(|point| panic!("model crash at {point}")))
}

async fn step(world: &mut World, op: &Op) -> Result<(), TestCaseError> {
    match op {
        Op::Propose(i) | Op::Mismatch(i) => {
            let bump = if matches!(op, Op::Mismatch(_)) { 7 } else { 0 };
            let before = world.log.events().len();
            let validated_before = world.log.ledger().intent(&charge_key(*i)).map(|x| x.status);
            let effects_before = world.provider.effects().len();
            let out = world.start("charge", charge(*i, bump), Failpoints::disarmed()).await.expect("no crash armed");
            match world.reserved.get(i) {
                Some(&first) if first != amount(*i) + bump => {
                    prop_assert_eq!(&out["code"], "intent_payload_mismatch", "{}", out);
                    prop_assert_eq!(world.log.events().len(), before, "a mismatch writes nothing");
                }
                Some(_) if validated_before == Some(IntentStatus::Validated) => {
                    prop_assert_eq!(&out["source"], "deduplicated", "{}", out);
                    prop_assert_eq!(world.provider.effects().len(), effects_before, "no new effect");
                }
                Some(_) => {}
                None => {
                    if world.log.ledger().intent(&charge_key(*i)).is_some() {
                        world.reserved.insert(*i, amount(*i) + bump);
                    }
                }
            }
        }
        Op::Refund(i) => {
            world.start("refund", refund(*i), Failpoints::disarmed()).await.expect("no crash armed");
        }
        Op::RefundPart(i, n) => {
            world
                .start("refund", refund_of(*i, &format!("part_{n}"), amount(*i) / 4, "EUR"), Failpoints::disarmed())
                .await
                .expect("no crash armed");
        }
        Op::RefundHuge(i) | Op::RefundOtherCurrency(i) => {
            let (name, amount_minor, currency) = match op {
                Op::RefundHuge(_) => ("huge", i64::MAX - amount(*i) / 4, "EUR"),
                _ => ("other_currency", amount(*i) / 4, "USD"),
            };
            let before = world.log.events().len();
            let effects_before = world.provider.effects().len();
            let out = world
                .start("refund", refund_of(*i, name, amount_minor, currency), Failpoints::disarmed())
                .await
                .expect("no crash armed");
            prop_assert_eq!(&out["status"], "rejected", "{}", out);
            prop_assert_eq!(world.log.events().len(), before, "a refused refund writes nothing");
            prop_assert_eq!(world.provider.effects().len(), effects_before, "and reaches no provider");
        }
        Op::Provider(behaviour) => world.provider.script([behaviour.clone()]),
        // A lookup that lies "absent" defeats a provider that cannot deduplicate: no engine can
        // tell the lie from a proven absence past the consistency window (the capability table
        // in SPEC.md). Lies are played only against key-deduplicating providers, where a
        // resend is answered with the original effect.
        Op::LookupLies(n) if world.provider_dedups() => world.provider.lookups_absent(*n),
        Op::LookupLies(_) => {}
        Op::LookupUnavailable(n) => world.provider.lookups_unavailable(*n),
        Op::CrashDuring(i, point) => {
            let crashed = world.start("charge", charge(*i, 0), crashing(*point)).await.is_none();
            if !world.reserved.contains_key(i) && world.log.ledger().intent(&charge_key(*i)).is_some() {
                world.reserved.insert(*i, amount(*i));
            }
            if crashed {
                world.crash();
            }
        }
        Op::Restart => {
            world.crash();
            world.executor(Failpoints::disarmed()).recover_and_resume(Cause::command("model")).await.expect("recovers");
        }
        Op::Reconcile => {
            world.executor(Failpoints::disarmed()).reconcile_due(Cause::command("model")).await.expect("reconciles");
        }
        Op::Advance(ms) => world.clock.advance_ms(i64::from(*ms)),
        Op::Cancel(i) => {
            let before = world.log.events().len();
            let status = world.log.ledger().intent(&charge_key(*i)).map(|x| x.status);
            let result = world
                .log
                .execute(Command::new(
                    Cause::operator("model"),
                    Action::Cancel { key: charge_key(*i), by: "model".into(), reason: "test".into() },
                ))
                .await;
            let allowed = matches!(status, Some(IntentStatus::Reserved | IntentStatus::AwaitingApproval));
            prop_assert_eq!(result.is_ok(), allowed);
            if !allowed {
                prop_assert_eq!(world.log.events().len(), before, "a refused cancel writes nothing");
            }
        }
        Op::Resolve(i) => {
            let key = charge_key(*i);
            let status = world.log.ledger().intent(&key).map(|x| x.status);
            if matches!(status, Some(IntentStatus::OutcomeUnknown | IntentStatus::Escalated)) {
                // The operator checks the provider's dashboard: the truth, not a lookup.
                let landed = world
                    .provider
                    .effects()
                    .into_iter()
                    .find(|e| e.idempotency_key == key.as_str())
                    .map(|e| e.provider_ref);
                // Checked with the provider's lookup first; a lookup that lies is overridden.
                let executor = world.executor(Failpoints::disarmed());
                let checked = executor.resolve(&key, "model", "checked", landed.clone(), None).await;
                if checked.is_err() {
                    let overridden = executor.resolve(&key, "model", "checked", landed, Some("dashboard".into())).await;
                    prop_assert!(overridden.is_ok(), "an overridden resolution is recorded: {:?}", overridden.err());
                }
            }
        }
    }
    world.check(false)
}

/// Heals the provider and lets Keel finish: every unknown must end resolved or escalated.
async fn heal(world: &mut World) -> Result<(), TestCaseError> {
    world.provider.heal();
    for _ in 0..6 {
        world.clock.advance_ms(120_000);
        world.executor(Failpoints::disarmed()).recover_and_resume(Cause::command("heal")).await.expect("recovers");
        for i in 0..ORDERS {
            let bump = world.reserved.get(&i).map_or(0, |first| first - amount(i));
            world.start("charge", charge(i, bump), Failpoints::disarmed()).await.expect("no crash armed");
        }
    }
    world.check(true)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1_000),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn keel_matches_its_model_under_random_faults_crashes_and_operators(
        capability in capability(),
        ops in proptest::collection::vec(op(), 1..24),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 3, 1, 9, 0, 0).single().expect("valid")));
            let mut world = World {
                log: Arc::new(MemoryLog::new(clock.clone())),
                provider: Arc::new(MemoryProvider::new(capability)),
                clock,
                runs: 0,
                reserved: HashMap::new(),
            };
            for op in &ops {
                step(&mut world, op).await?;
            }
            heal(&mut world).await
        })?;
    }
}
