//! The intent lifecycle's rules, driven through the executor and the built-in workflows
//! against the in-memory log and provider (the same decide/apply code the SQLite store runs).
//! Each test names the rule it proves.

use adapters::stripe::local_capability;
use chrono::{TimeZone, Utc};
use engine::clock::{Clock, ManualClock};
use engine::event::{Cause, Event, IntentKey, RunId, RunLimits, SignalName};
use engine::executor::{
    Context, Executor, Prepared, Registered, Rejection, RunOutcome, RunRequest, Runtime, Workflow, WorkflowEnd,
    WorkflowError,
};
use engine::ledger::{Action, Command, IntentStatus, Ledger, Refusal};
use engine::log::{EventLog, LogError};
use engine::memory::{MemoryLog, MemoryProvider, Scripted};
use engine::provider::{BoxFuture, Capability, EffectKind};
use serde_json::{Value, json};
use std::sync::Arc;
use testkit::sample::{CARD_TOKEN, TENANT};

/// A Stripe-like provider whose requests are over at once: a resend waits for the
/// consistency window only, not for a request timeout too.
fn stripe() -> Capability {
    Capability { request_timeout_ms: 0, ..local_capability() }
}

struct Harness {
    clock: Arc<ManualClock>,
    log: Arc<MemoryLog>,
    provider: Arc<MemoryProvider>,
    executor: Executor,
}

impl Harness {
    fn new(capability: Capability) -> Self {
        let rules = engine::policy::Rules {
            max_amount_minor: 1_000_000,
            approval_threshold_minor: None,
            run_budget_minor: engine::limits::RUN_COST_DEFAULT_MINOR,
            currencies: None,
            irreversible_without_approval: false,
        };
        Self::with_workflows(capability, workflows::builtin(Some(rules)))
    }

    fn with_workflows(capability: Capability, workflows: Vec<Registered>) -> Self {
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("a valid instant")));
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let provider = Arc::new(MemoryProvider::new(capability));
        let runtime = Runtime {
            log: log.clone(),
            provider: provider.clone(),
            clock: clock.clone(),
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("lifecycle-test")),
        };
        Self { executor: Executor::new(runtime, workflows), clock, log, provider }
    }

    async fn run(&self, workflow: &str, input: &Value, limits: RunLimits) -> RunOutcome {
        let request = RunRequest {
            run_id: RunId::new(format!("run-{}", self.log.events().len())),
            limits,
            deadline_ms: 120_000,
            cause: Cause::command(workflow),
        };
        self.executor.start(workflow, input, request).await.expect("the run ends with an outcome")
    }

    async fn charge(&self, intent_id: &str, order: &str, amount_minor: i64) -> Value {
        self.run("charge", &charge_input(intent_id, order, amount_minor), limits()).await.output
    }

    async fn refund(&self, intent_id: &str, order: &str, amount_minor: i64) -> Value {
        self.run("refund", &json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order, "amount_minor": amount_minor, "currency": "EUR"}), limits())
            .await
            .output
    }

    fn ledger(&self) -> Ledger {
        self.log.ledger()
    }

    fn status(&self, key: &IntentKey) -> IntentStatus {
        self.ledger().intent(key).expect("the intent exists").status
    }

    async fn command(&self, action: Action) -> Result<engine::ledger::Reply, LogError> {
        self.command_by("ops", action).await
    }

    async fn command_by(&self, operator: &str, action: Action) -> Result<engine::ledger::Reply, LogError> {
        self.log.execute(Command::new(Cause::operator(operator), action)).await
    }
}

fn limits() -> RunLimits {
    RunLimits {
        cost_minor_max: None,
        reconciliations_per_intent_max: 3,
        network_retries_max: None,
        reconciliations_max: None,
        ..RunLimits::default()
    }
}

fn charge_input(intent_id: &str, order: &str, amount_minor: i64) -> Value {
    json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order, "amount_minor": amount_minor, "currency": "EUR", "payment_method_token": CARD_TOKEN})
}

fn charge_key(intent_id: &str) -> IntentKey {
    IntentKey::new(EffectKind::Charge, TENANT, intent_id)
}

fn text<'a>(value: &'a Value, name: &str) -> &'a str {
    value.get(name).and_then(Value::as_str).unwrap_or("")
}

#[tokio::test]
async fn same_key_same_payload_returns_the_stored_result_without_a_provider_call() {
    let h = Harness::new(stripe());
    let first = h.charge("order_1842_charge", "order_1842", 4900).await;
    assert_eq!(text(&first, "status"), "validated");
    assert_eq!(text(&first, "source"), "provider");
    let again = h.charge("order_1842_charge", "order_1842", 4900).await;
    assert_eq!(text(&again, "status"), "validated");
    assert_eq!(text(&again, "source"), "deduplicated");
    assert_eq!(text(&again, "provider_ref"), text(&first, "provider_ref"));
    assert_eq!(h.provider.effect_count(), 1);
    assert_eq!(h.ledger().intent(&charge_key("order_1842_charge")).expect("exists").attempts, 1);
}

#[tokio::test]
async fn same_key_other_payload_is_rejected_and_writes_nothing() {
    let h = Harness::new(stripe());
    h.charge("order_1842_charge", "order_1842", 4900).await;
    let before = h.log.events().len();
    let other = h.charge("order_1842_charge", "order_1842", 9900).await;
    assert_eq!(text(&other, "status"), "rejected");
    assert_eq!(text(&other, "code"), "intent_payload_mismatch");
    assert_eq!(h.log.events().len(), before, "a mismatch writes nothing, not even a run");
    assert_eq!(h.provider.effect_count(), 1);
}

#[tokio::test]
async fn invalid_input_and_policy_denial_write_nothing_and_do_not_burn_the_key() {
    let h = Harness::new(stripe());
    for (bad, code) in [
        (
            json!({"tenant_id": "not-a-uuid", "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": 4900, "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "short", "order_id": "o", "amount_minor": 4900, "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "", "amount_minor": 4900, "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": -1, "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": 4900, "currency": "GBP", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": 4900, "currency": "EUR", "payment_method_token": "short"}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": 4900, "currency": "EUR", "payment_method_token": CARD_TOKEN, "extra": true}),
            "invalid_arguments",
        ),
        (charge_input(&"i".repeat(121), "o", 4900), "invalid_arguments"),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "amount_minor": 49.5, "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (
            json!({"tenant_id": TENANT, "intent_id": "order_1842_charge", "order_id": "o", "currency": "EUR", "payment_method_token": CARD_TOKEN}),
            "invalid_arguments",
        ),
        (charge_input("order_1842_charge", "o", 2_000_000), "policy_denied"),
    ] {
        let out = h.run("charge", &bad, limits()).await;
        assert_eq!(out.output["code"], code, "{bad}");
        assert!(!out.written);
    }
    assert!(h.log.events().is_empty(), "rejections write nothing");
    let ok = h.charge("order_1842_charge", "o", 4900).await;
    assert_eq!(text(&ok, "status"), "validated", "the key was not burned by the rejections");
}

#[tokio::test]
async fn the_token_never_reaches_the_log() {
    let h = Harness::new(stripe());
    h.charge("order_1842_charge", "order_1842", 4900).await;
    let log = serde_json::to_string(&h.log.events()).expect("events serialize");
    assert!(!log.contains(CARD_TOKEN), "the payment method token is stored only as a hash");
    assert!(log.contains(&engine::canonical::sha256_hex(CARD_TOKEN.as_bytes())));
}

#[tokio::test]
async fn a_lost_answer_is_unknown_never_resent_blindly_and_reconciled_by_lookup() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::LoseAnswer]);
    let out = h.charge("order_1900_charge", "order_1900", 2500).await;
    assert_eq!(text(&out, "status"), "outcome_unknown");
    assert_eq!(h.provider.effect_count(), 1);
    // A resubmission before the reconciliation is due makes no new attempt.
    let again = h.charge("order_1900_charge", "order_1900", 2500).await;
    assert_eq!(text(&again, "status"), "outcome_unknown");
    assert_eq!(h.ledger().intent(&charge_key("order_1900_charge")).expect("exists").attempts, 1);
    let reconciled =
        h.executor.reconcile(&charge_key("order_1900_charge"), Cause::command("reconcile")).await.expect("reconciles");
    assert_eq!(reconciled.status.as_str(), "validated");
    assert_eq!(reconciled.source, Some(engine::executor::ValidatedBy::Reconciled));
    assert_eq!(h.provider.effect_count(), 1);
}

#[tokio::test]
async fn absence_resends_with_the_same_key_only_past_the_consistency_window() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::FailBeforeEffect]);
    let key = charge_key("order_2000_charge");
    let out = h.charge("order_2000_charge", "order_2000", 1000).await;
    assert_eq!(text(&out, "status"), "outcome_unknown");
    // Reconciled inside the window: absent is not yet proof.
    let early = h.executor.reconcile(&key, Cause::command("reconcile")).await.expect("reconciles");
    assert_eq!(early.status.as_str(), "outcome_unknown");
    assert_eq!(h.provider.effect_count(), 0);
    h.clock.advance_ms(2_500);
    // Past the window, the resubmitting caller (who holds the token) drives the resend.
    let resent = h.charge("order_2000_charge", "order_2000", 1000).await;
    assert_eq!(text(&resent, "status"), "validated", "{resent}");
    let intent = h.ledger().intent(&key).expect("exists").clone();
    assert_eq!(intent.attempts, 2);
    assert_eq!(h.provider.effect_count(), 1);
    let keys: Vec<_> = h
        .log
        .events()
        .iter()
        .filter(|e| matches!(e.event, Event::AttemptStarted { .. }))
        .map(|e| e.stream.clone())
        .collect();
    assert!(keys.iter().all(|s| s == &key.stream()), "every attempt uses the same key");
}

#[tokio::test]
async fn a_provider_without_keys_or_lookup_escalates_instead_of_resending() {
    let h = Harness::new(Capability { dedup_by_key: false, lookup: false, ..stripe() });
    h.provider.script([Scripted::LoseAnswer]);
    let out = h.charge("order_3000_charge", "order_3000", 1000).await;
    assert_eq!(text(&out, "status"), "escalated");
    h.clock.advance_ms(600_000);
    let again = h.charge("order_3000_charge", "order_3000", 1000).await;
    assert_eq!(text(&again, "status"), "escalated");
    assert_eq!(h.provider.effect_count(), 1, "no automatic resend");
}

#[tokio::test]
async fn a_dedup_only_provider_is_reconciled_by_resending_the_same_key() {
    let h = Harness::new(Capability { lookup: false, ..stripe() });
    h.provider.script([Scripted::LoseAnswer]);
    let out = h.charge("order_3100_charge", "order_3100", 1000).await;
    assert_eq!(text(&out, "status"), "outcome_unknown");
    h.clock.advance_ms(1_500);
    let again = h.charge("order_3100_charge", "order_3100", 1000).await;
    assert_eq!(text(&again, "status"), "validated");
    assert_eq!(h.provider.effect_count(), 1, "the provider deduplicated the resend");
}

#[tokio::test]
async fn past_the_key_window_no_resend_happens() {
    let h = Harness::new(Capability { key_window_ms: 10_000, ..stripe() });
    h.provider.script([Scripted::FailBeforeEffect]);
    let key = charge_key("order_3200_charge");
    h.charge("order_3200_charge", "order_3200", 1000).await;
    h.clock.advance_ms(11_000);
    let out = h.executor.reconcile(&key, Cause::command("reconcile")).await.expect("reconciles");
    assert_eq!(out.status.as_str(), "escalated");
    assert_eq!(h.provider.effect_count(), 0);
    assert!(h.ledger().intent(&key).expect("exists").absence_proven, "absence proven: its money is released");
}

#[tokio::test]
async fn reconciliations_are_bounded_then_escalated() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::LoseAnswer]);
    h.provider.lookups_unavailable(100);
    let key = charge_key("order_3300_charge");
    h.charge("order_3300_charge", "order_3300", 1000).await;
    for _ in 0..4 {
        h.clock.advance_ms(120_000);
        h.executor.reconcile_due(Cause::command("reconcile")).await.expect("reconciles");
    }
    assert_eq!(h.status(&key), IntentStatus::Escalated);
    assert!(
        h.executor.reconcile_due(Cause::command("reconcile")).await.expect("reconciles").is_empty(),
        "nothing left pending"
    );
    assert_eq!(h.ledger().intent(&key).expect("exists").reconciliations, 3);
}

#[tokio::test]
async fn a_decline_is_definitive_and_releases_the_money() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::Decline]);
    let run_limits = RunLimits { cost_minor_max: Some(1000), ..limits() };
    let out = h.run("charge", &charge_input("order_3400_charge", "order_3400", 1000), run_limits.clone()).await;
    assert_eq!(text(&out.output, "status"), "declined");
    let run = out.run_id;
    assert_eq!(h.ledger().run_cost_committed_minor(&run), 0);
    assert_eq!(h.provider.effect_count(), 0);
}

#[tokio::test]
async fn a_run_cannot_reserve_beyond_its_money_budget() {
    let h = Harness::new(stripe());
    let out = h
        .run(
            "charge",
            &charge_input("order_3500_charge", "order_3500", 5000),
            RunLimits { cost_minor_max: Some(4000), ..limits() },
        )
        .await;
    assert_eq!(out.output["code"], "budget_exhausted");
    assert!(h.log.events().is_empty());
}

#[tokio::test]
async fn three_refunds_of_the_whole_amount_give_one_success_and_two_rejections() {
    let h = Arc::new(Harness::new(stripe()));
    h.charge("order_4000_charge", "order_4000", 8990).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move { h.refund(&format!("order_4000_refund_{i}"), "order_4000", 8990).await }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(text(&task.await.expect("the task ends"), "status").to_owned());
    }
    statuses.sort();
    assert_eq!(statuses, ["rejected", "rejected", "validated"]);
    assert_eq!(h.ledger().order_refunds_committed_minor(TENANT, "order_4000", "EUR"), 8990);
}

#[tokio::test]
async fn an_unknown_refund_still_counts_against_the_charged_amount() {
    let h = Harness::new(stripe());
    h.charge("order_4100_charge", "order_4100", 5000).await;
    h.provider.script([Scripted::LoseAnswer]);
    let unknown = h.refund("order_4100_refund_1", "order_4100", 4000).await;
    assert_eq!(text(&unknown, "status"), "outcome_unknown");
    let next = h.refund("order_4100_refund_2", "order_4100", 2000).await;
    assert_eq!(text(&next, "status"), "rejected");
}

#[tokio::test]
async fn a_new_key_cannot_step_around_a_pending_intent() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::LoseAnswer]);
    h.charge("order_4200_charge", "order_4200", 1000).await;
    let other = h.charge("order_4200_charge_bis", "order_4200", 1000).await;
    assert_eq!(text(&other, "code"), "reference_pending");
    assert_eq!(h.provider.effect_count(), 1);
}

#[tokio::test]
async fn cancel_is_refused_while_an_outcome_is_unknown() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::LoseAnswer]);
    let key = charge_key("order_4300_charge");
    h.charge("order_4300_charge", "order_4300", 1000).await;
    let refused =
        h.command(Action::Cancel { key: key.clone(), by: "ana".into(), reason: "customer asked".into() }).await;
    assert!(matches!(refused, Err(LogError::Refused(Refusal::WrongStatus { .. }))), "{refused:?}");
    assert_eq!(h.status(&key), IntentStatus::OutcomeUnknown);
    h.executor.resolve(&key, "ana", "seen in dashboard", Some("ch_1".into()), None).await.expect("resolves");
    assert_eq!(h.status(&key), IntentStatus::Validated);
    let resolved = h.log.events().into_iter().last().expect("an event");
    assert_eq!(resolved.cause.actor, "operator:ana", "the operator's name is recorded");
}

#[tokio::test]
async fn approvals_are_bound_to_the_fingerprint_and_expire() {
    let h = Harness::new(stripe());
    let gated = RunLimits { approval_threshold_minor: Some(5_000), ..limits() };
    let key = charge_key("order_4400_charge");
    let out = h.run("charge", &charge_input("order_4400_charge", "order_4400", 100_000), gated.clone()).await;
    assert_eq!(out.status.as_str(), "suspended");
    assert_eq!(h.status(&key), IntentStatus::AwaitingApproval);
    assert_eq!(h.provider.effect_count(), 0);
    let wrong = h
        .command(Action::Approve {
            key: key.clone(),
            by: "lead".into(),
            ttl_ms: 60_000,
            fingerprint: Some("0".repeat(64)),
        })
        .await;
    assert!(
        matches!(wrong, Err(LogError::Refused(Refusal::FingerprintMismatch { .. }))),
        "an approval for another payload releases nothing"
    );
    h.command(Action::Approve { key: key.clone(), by: "lead".into(), ttl_ms: 60_000, fingerprint: None })
        .await
        .expect("approves");
    h.clock.advance_ms(61_000);
    let stale = h.run("charge", &charge_input("order_4400_charge", "order_4400", 100_000), gated.clone()).await;
    assert_eq!(stale.status.as_str(), "suspended", "a stale approval releases nothing");
    assert_eq!(h.provider.effect_count(), 0);
    h.command(Action::Approve { key: key.clone(), by: "lead".into(), ttl_ms: 60_000, fingerprint: None })
        .await
        .expect("approves");
    let done = h.run("charge", &charge_input("order_4400_charge", "order_4400", 100_000), gated).await;
    assert_eq!(text(&done.output, "status"), "validated");
    assert_eq!(h.provider.effect_count(), 1);
}

#[tokio::test]
async fn recovery_turns_an_in_flight_attempt_unknown_exactly_once() {
    let h = Harness::new(stripe());
    // Reserve and start an attempt by hand, as a worker would before dying.
    let key = charge_key("order_5000_charge");
    let run = RunId::new("crashed");
    let spec = engine::ledger::IntentSpec {
        definition: engine::event::IntentDefinition {
            key: key.clone(),
            kind: EffectKind::Charge,
            tenant: TENANT.into(),
            intent_id: "order_5000_charge".into(),
            order_id: "order_5000".into(),
            business_ref: "order_5000".into(),
            fingerprint: "f".repeat(64),
            amount_minor: 1000,
            currency: "EUR".into(),
            payload: json!({}),
            tool: None,
        },
        capability: stripe(),
        approval_required: false,
    };
    let start = engine::ledger::RunStart {
        run_id: run.clone(),
        workflow: "charge".into(),
        input: json!({}),
        deadline_at: engine::clock::checked_plus_ms(h.clock.now(), 120_000)
            .expect("two minutes from now is an instant"),
        limits: limits(),
        versions: Default::default(),
        owner: None,
    };
    h.log
        .execute(
            Command::new(
                Cause::command("test"),
                Action::Reserve { run_id: run.clone(), position: 0, spec, start_attempt: false },
            )
            .starting(Some(start)),
        )
        .await
        .expect("reserves");
    h.command(Action::StartAttempt { key: key.clone(), run_id: run }).await.expect("starts");
    let recover = || Action::Recover { owner: engine::lease::LeaseOwner::named("recovery"), run: None };
    let first = h.command(recover()).await.expect("recovers");
    let second = h.command(recover()).await.expect("recovers");
    assert!(matches!(first, engine::ledger::Reply::Recovered(ref r) if r.recovered == vec![key.clone()]));
    assert!(matches!(second, engine::ledger::Reply::Recovered(ref r) if r.recovered.is_empty()));
    let unknowns = h.log.events().iter().filter(|e| matches!(e.event, Event::OutcomeUnknown { .. })).count();
    assert_eq!(unknowns, 1);
    assert_eq!(h.provider.effect_count(), 0, "recovery never resends");
}

/// A workflow whose step names depend on a flag, to change the code between runs.
#[derive(Clone)]
struct Shifty(Arc<std::sync::atomic::AtomicBool>);

impl Workflow for Shifty {
    type Input = Value;

    fn name(&self) -> &'static str {
        "shifty"
    }
    fn prepare(&self, raw: &Value) -> Result<Prepared<Value>, Rejection> {
        Ok(Prepared::plain(raw.clone()))
    }
    fn run<'a>(&'a self, ctx: &'a mut Context, _input: Value) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let name = if self.0.load(std::sync::atomic::Ordering::SeqCst) { "renamed" } else { "original" };
            let first: u32 = ctx.step(name, || async { 7 }).await?;
            let approval = ctx.wait_signal(&SignalName::parse("go").expect("a valid name")).await?;
            ctx.sleep(10).await?;
            Ok(WorkflowEnd {
                status: engine::event::RunStatus::Completed,
                output: json!({"first": first, "signal": approval}),
                intent: None,
            })
        })
    }
}

#[tokio::test]
async fn replay_returns_recorded_steps_and_a_different_step_stops_the_run() {
    let shifty = Shifty(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let h = Harness::with_workflows(stripe(), vec![Registered::new(shifty.clone())]);
    let out = h.run("shifty", &json!({}), limits()).await;
    assert_eq!(out.status.as_str(), "suspended", "waits for its signal");
    let run_id = out.run_id.clone();
    let go = SignalName::parse("go").expect("a valid name");
    h.command(Action::DeliverSignal { run_id: run_id.clone(), name: go, payload: json!("approved") })
        .await
        .expect("delivers");
    let run = h.ledger().run(&run_id).expect("exists").clone();
    let resumed = h.executor.resume(&run, Cause::command("resume")).await.expect("resumes");
    assert_eq!(resumed.status.as_str(), "completed");
    assert_eq!(resumed.output["signal"], "approved");
    assert_eq!(resumed.output["first"], 7);

    // Same journal, changed code: the run stops nondeterministic_replay.
    let h2 = Harness::with_workflows(stripe(), vec![Registered::new(shifty.clone())]);
    let out = h2.run("shifty", &json!({}), limits()).await;
    shifty.0.store(true, std::sync::atomic::Ordering::SeqCst);
    let run = h2.ledger().run(&out.run_id).expect("exists").clone();
    let replayed = h2.executor.resume(&run, Cause::command("resume")).await.expect("resumes");
    assert_eq!(replayed.status.as_str(), "nondeterministic_replay");
}

#[tokio::test]
async fn replaying_the_log_gives_the_same_state() {
    let h = Harness::new(stripe());
    h.provider.script([Scripted::LoseAnswer, Scripted::Decline]);
    h.charge("order_6000_charge", "order_6000", 1000).await;
    h.charge("order_6001_charge", "order_6001", 1000).await;
    h.charge("order_6002_charge", "order_6002", 1000).await;
    let mut replayed = Ledger::new();
    for event in h.log.events() {
        replayed.apply(&event);
    }
    let live = h.ledger();
    for intent in live.intents() {
        assert_eq!(replayed.intent(intent.key()), Some(intent));
    }
    assert_eq!(replayed.runs().len(), live.runs().len());
}

fn refund_key(intent_id: &str) -> IntentKey {
    IntentKey::new(EffectKind::Refund, TENANT, intent_id)
}

fn held_refund(intent_id: &str, order: &str, hold: Value) -> Value {
    let mut input =
        json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order, "amount_minor": 400, "currency": "EUR"});
    if let (Some(map), Value::Object(hold)) = (input.as_object_mut(), hold) {
        map.extend(hold);
    }
    input
}

/// Every `TimerStarted` of the log: its run and fire time.
fn timers(h: &Harness) -> Vec<(RunId, chrono::DateTime<Utc>)> {
    h.log
        .events()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::TimerStarted { run_id, fire_at, .. } => Some((run_id, fire_at)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_long_timer_suspends_the_run_and_resume_continues_it_only_once_it_fired() {
    let h = Harness::new(stripe());
    h.charge("order_7000_charge", "order_7000", 1000).await;
    let started = h.clock.now();
    let out =
        h.run("refund", &held_refund("order_7000_refund", "order_7000", json!({"delay_ms": 2_000})), limits()).await;
    assert_eq!(out.status.as_str(), "suspended", "{:?}", out.output);
    let fire_at = engine::clock::checked_plus_ms(started, 2_000).expect("an instant");
    assert_eq!(out.wakes_at, Some(fire_at), "the suspension says until when");
    assert_eq!(h.clock.now(), started, "a long timer is not waited in process");
    assert!(h.ledger().intent(&refund_key("order_7000_refund")).is_none(), "nothing is reserved while it waits");
    assert_eq!(h.ledger().run(&out.run_id).and_then(|run| run.wake_at), Some(fire_at), "the run's state holds it");

    // Before the fire time a resume pass leaves it asleep and says when it wakes.
    h.clock.advance_ms(1_999);
    let early = h.executor.recover_and_resume(Cause::command("resume")).await.expect("resumes");
    assert!(early.resumed.is_empty(), "{:?}", early.resumed);
    assert_eq!(early.sleeping, vec![engine::executor::Asleep { run_id: out.run_id.clone(), wakes_at: fire_at }]);

    // At the fire time it continues, waiting no more, and completes.
    h.clock.advance_ms(1);
    let due = h.executor.recover_and_resume(Cause::command("resume")).await.expect("resumes");
    assert!(due.sleeping.is_empty());
    assert_eq!(due.resumed.len(), 1);
    assert_eq!(due.resumed[0].status.as_str(), "completed", "{:?}", due.resumed[0].output);
    assert_eq!(h.status(&refund_key("order_7000_refund")), IntentStatus::Validated);
    assert_eq!(h.ledger().run(&out.run_id).and_then(|run| run.wake_at), None, "the next entry clears it");
    assert_eq!(timers(&h), vec![(out.run_id.clone(), fire_at)], "one timer, its fire time never recomputed");
}

#[tokio::test]
async fn a_restart_replays_the_recorded_fire_time_instead_of_a_fresh_delay() {
    let h = Harness::new(stripe());
    h.charge("order_7001_charge", "order_7001", 1000).await;
    let started = h.clock.now();
    let out =
        h.run("refund", &held_refund("order_7001_refund", "order_7001", json!({"delay_ms": 5_000})), limits()).await;
    let fire_at = engine::clock::checked_plus_ms(started, 5_000).expect("an instant");
    // Resumed directly (as `keel agent resume`-style callers could) 3 s later: replay reads the
    // recorded fire time — a fresh delay would now fire at 8 s.
    h.clock.advance_ms(3_000);
    let run = h.ledger().run(&out.run_id).expect("exists").clone();
    let again = h.executor.resume(&run, Cause::command("resume")).await.expect("resumes");
    assert_eq!(again.wakes_at, Some(fire_at));
    assert_eq!(timers(&h).len(), 1, "no second timer");
}

#[tokio::test]
async fn a_short_timer_is_waited_in_process() {
    let h = Harness::new(stripe());
    h.charge("order_7002_charge", "order_7002", 1000).await;
    let started = h.clock.now();
    let delay = engine::limits::TIMER_IN_PROCESS_MAX_MS;
    let out =
        h.run("refund", &held_refund("order_7002_refund", "order_7002", json!({"delay_ms": delay})), limits()).await;
    assert_eq!(out.status.as_str(), "completed", "{:?}", out.output);
    assert_eq!(out.wakes_at, None);
    assert!(h.clock.now() >= engine::clock::checked_plus_ms(started, delay).expect("an instant"));
}

#[tokio::test]
async fn a_refund_after_a_signal_waits_for_it_and_shows_its_payload() {
    let h = Harness::new(stripe());
    h.charge("order_7003_charge", "order_7003", 1000).await;
    let hold = json!({"after_signal": "goods_returned"});
    let out = h.run("refund", &held_refund("order_7003_refund", "order_7003", hold), limits()).await;
    assert_eq!(out.status.as_str(), "suspended");
    let still = h.executor.recover_and_resume(Cause::command("resume")).await.expect("resumes");
    assert_eq!(still.resumed[0].status.as_str(), "suspended", "no signal yet");
    assert!(h.ledger().intent(&refund_key("order_7003_refund")).is_none());
    let name = SignalName::parse("goods_returned").expect("a valid name");
    let payload = json!({"parcel": "RT-118"});
    h.command_by("ana", Action::DeliverSignal { run_id: out.run_id.clone(), name, payload: payload.clone() })
        .await
        .expect("delivers");
    let done = h.executor.recover_and_resume(Cause::command("resume")).await.expect("resumes");
    assert_eq!(done.resumed[0].status.as_str(), "completed");
    assert_eq!(done.resumed[0].output["signal"], payload);
    let sent_by = h.log.events().into_iter().find(|e| matches!(e.event, Event::SignalDelivered { .. }));
    assert_eq!(sent_by.map(|e| e.cause.actor), Some("operator:ana".to_owned()), "recorded with its sender");
}

#[tokio::test]
async fn a_bad_hold_is_refused_before_anything_is_written() {
    let h = Harness::new(stripe());
    for hold in [
        json!({"after_signal": "goods returned"}),
        json!({"after_signal": ""}),
        json!({"after_signal": 7}),
        json!({"delay_ms": 0}),
        json!({"delay_ms": -5}),
        json!({"delay_ms": engine::limits::RUN_DEADLINE_MAX_MS + 1}),
    ] {
        let out = h.run("refund", &held_refund("order_7004_refund", "order_7004", hold.clone()), limits()).await;
        assert_eq!(out.status.as_str(), "rejected", "{hold}");
        assert!(!out.written, "{hold}");
    }
    assert!(h.log.events().is_empty());
}

#[tokio::test]
async fn a_signal_is_refused_for_an_unknown_or_finished_run_and_when_too_large() {
    let h = Harness::new(stripe());
    h.charge("order_7005_charge", "order_7005", 1000).await;
    let ledger = h.ledger();
    let finished = ledger.runs().first().expect("the charge's run").run_id.clone();
    let name = || SignalName::parse("go").expect("a valid name");
    let before = h.log.events().len();
    let unknown =
        h.command(Action::DeliverSignal { run_id: RunId::new("nope"), name: name(), payload: json!(1) }).await;
    assert!(matches!(unknown, Err(LogError::Refused(Refusal::UnknownRun(_)))), "{unknown:?}");
    let done = h.command(Action::DeliverSignal { run_id: finished, name: name(), payload: json!(1) }).await;
    assert!(matches!(done, Err(LogError::Refused(Refusal::RunFinished(_)))), "{done:?}");
    let out =
        h.run("refund", &held_refund("order_7005_refund", "order_7005", json!({"after_signal": "go"})), limits()).await;
    let before_big = h.log.events().len();
    let big = json!("x".repeat(engine::limits::SIGNAL_PAYLOAD_MAX_BYTES));
    let refused = h.command(Action::DeliverSignal { run_id: out.run_id, name: name(), payload: big }).await;
    assert!(matches!(refused, Err(LogError::Refused(Refusal::SignalTooLarge { .. }))), "{refused:?}");
    assert_eq!(h.log.events().len(), before_big, "nothing written");
    assert!(before_big > before);
}

#[tokio::test]
async fn a_timer_past_the_run_deadline_is_refused_before_anything_is_written() {
    let h = Harness::new(stripe());
    let hold = json!({"delay_ms": 120_001});
    let out = h.run("refund", &held_refund("order_7006_refund", "order_7006", hold), limits()).await;
    assert_eq!(out.status.as_str(), "deadline_exceeded", "{:?}", out.output);
    assert!(!out.written);
    assert!(h.log.events().is_empty(), "no timer recorded that could never fire in time");
}

#[tokio::test]
async fn a_signal_for_an_agent_run_is_refused_writing_nothing() {
    let h = Harness::new(stripe());
    let run_id = RunId::new("agent-run");
    let start = engine::ledger::AgentRunStart {
        workflow: "ticket-review".into(),
        deadline_at: engine::clock::checked_plus_ms(h.clock.now(), 60_000).expect("an instant"),
        input: json!({}),
        limits: limits(),
        versions: Default::default(),
        owner: None,
    };
    let batch = Action::RecordAgentEntries {
        run_id: run_id.clone(),
        position: 0,
        entries: vec![json!({"type": "agent_run_started"})],
        start: Some(start),
        spine: Vec::new(),
    };
    h.command(batch).await.expect("an agent run starts");
    let before = h.log.events().len();
    let name = SignalName::parse("go").expect("a valid name");
    let refused = h.command(Action::DeliverSignal { run_id, name, payload: json!(1) }).await;
    assert!(matches!(refused, Err(LogError::Refused(Refusal::SignalToAgentRun(_)))), "{refused:?}");
    assert_eq!(h.log.events().len(), before, "nothing written");
}
