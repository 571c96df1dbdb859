//! Money safety through the executor and the built-in workflows, against the in-memory log:
//! amounts and sums that would overflow, currencies, partial refunds, the resend guard, and
//! requests proven never sent. Each test names the rule it proves; a provider that misbehaves
//! in a way the in-memory one cannot is written here, by hand.

use adapters::stripe::local_capability;
use chrono::{DateTime, TimeZone, Utc};
use engine::clock::{Clock, ManualClock};
use engine::event::{Cause, Event, IntentKey, RunId, RunLimits};
use engine::executor::{
    Context, Executor, IntentRequest, Prepared, Registered, Rejection, RunOutcome, RunRequest, Runtime, Workflow,
    WorkflowEnd, WorkflowError, end_with,
};
use engine::ledger::IntentStatus;
use engine::memory::{MemoryLog, MemoryProvider, Scripted};
use engine::provider::{
    BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, Evidence, LookupOutcome, PaymentProvider, Secret,
    UnknownReason,
};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use testkit::sample::{CARD_TOKEN, TENANT};

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("a valid instant")
}

struct Harness {
    clock: Arc<ManualClock>,
    log: Arc<MemoryLog>,
    executor: Executor,
}

impl Harness {
    fn new(provider: Arc<dyn PaymentProvider>, clock: Arc<ManualClock>) -> Self {
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let runtime = Runtime {
            log: log.clone(),
            provider,
            clock: clock.clone(),
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("money-test")),
        };
        let mut workflows = workflows::builtin(None);
        workflows.push(Registered::new(Unchecked));
        Self { executor: Executor::new(runtime, workflows), clock, log }
    }

    fn memory(capability: Capability) -> (Self, Arc<MemoryProvider>) {
        let provider = Arc::new(MemoryProvider::new(capability));
        (Self::new(provider.clone(), Arc::new(ManualClock::new(start()))), provider)
    }

    async fn run(&self, workflow: &str, input: &Value) -> RunOutcome {
        let request = RunRequest {
            run_id: RunId::new(format!("run-{}", self.log.events().len())),
            limits: RunLimits {
                cost_minor_max: None,
                attempts_per_intent_max: 3,
                reconciliations_per_intent_max: 5,
                approval_threshold_minor: None,
                policy: None,
                network_retries_max: None,
                reconciliations_max: None,
            },
            deadline_ms: 600_000,
            cause: Cause::command(workflow),
        };
        self.executor.start(workflow, input, request).await.expect("the run ends with an outcome")
    }

    async fn charge(&self, intent_id: &str, order: &str, amount_minor: i64, currency: &str) -> Value {
        let input = json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order,
                           "amount_minor": amount_minor, "currency": currency, "payment_method_token": CARD_TOKEN});
        self.run("charge", &input).await.output
    }

    async fn refund(&self, intent_id: &str, order: &str, amount_minor: i64, currency: &str) -> Value {
        let input = json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order,
                           "amount_minor": amount_minor, "currency": currency});
        self.run("refund", &input).await.output
    }

    /// An intent straight through `Context::intent`, past every input check.
    async fn unchecked(&self, kind: &str, intent_id: &str, amount_minor: i64, currency: &str) -> Value {
        let input = json!({"kind": kind, "intent_id": intent_id, "order_id": "order_7000",
                           "amount_minor": amount_minor, "currency": currency});
        self.run("unchecked", &input).await.output
    }

    fn events(&self) -> Vec<Event> {
        self.log.events().into_iter().map(|e| e.event).collect()
    }
}

/// Hands its input to `Context::intent` without any validation: what a caller of the engine's
/// API could do, so the ledger's own checks are what is tested.
struct Unchecked;

impl Workflow for Unchecked {
    type Input = Value;

    fn name(&self) -> &'static str {
        "unchecked"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared<Value>, Rejection> {
        Ok(Prepared::plain(raw.clone()))
    }

    fn run<'a>(&'a self, ctx: &'a mut Context, input: Value) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let text = |name: &str| input[name].as_str().unwrap_or_default().to_owned();
            let kind = if text("kind") == "charge" { EffectKind::Charge } else { EffectKind::Refund };
            let request = IntentRequest {
                kind,
                tenant: TENANT.to_owned(),
                intent_id: text("intent_id"),
                order_id: text("order_id"),
                business_ref: text("order_id"),
                amount_minor: input["amount_minor"].as_i64().unwrap_or_default(),
                currency: text("currency"),
                payload: input.clone(),
                payment_method: (kind == EffectKind::Charge).then(|| Secret::new(CARD_TOKEN)),
                tool: None,
            };
            let outcome = ctx.intent(request).await?;
            end_with(&outcome)
        })
    }
}

fn code(out: &Value) -> &str {
    out["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_refund_whose_total_would_overflow_is_refused_by_the_ledger_and_writes_nothing() {
    let (h, provider) = Harness::memory(local_capability());
    assert_eq!(h.unchecked("charge", "order_7000_charge", 100, "EUR").await["status"], "validated");
    assert_eq!(h.unchecked("refund", "order_7000_refund_1", 1, "EUR").await["status"], "validated");
    let before = h.events().len();
    for (intent_id, amount) in [("order_7000_refund_2", i64::MAX), ("order_7000_refund_3", i64::MAX - 1)] {
        let out = h.unchecked("refund", intent_id, amount, "EUR").await;
        assert_eq!(out["status"], "rejected", "{out}");
        assert!(["invalid_arguments", "invariant_violated"].contains(&code(&out)), "{out}");
    }
    let out = h.unchecked("charge", "order_7001_charge", i64::MAX, "EUR").await;
    assert_eq!(out["status"], "rejected", "a charge above the maximum is refused by the ledger too: {out}");
    assert_eq!(h.events().len(), before, "refusals write nothing");
    assert_eq!(provider.effect_count(), 2, "no provider call for a refused amount");
}

#[tokio::test]
async fn amounts_above_the_documented_maximum_are_invalid_at_input() {
    let (h, provider) = Harness::memory(local_capability());
    let over = engine::limits::AMOUNT_MINOR_MAX + 1;
    let charge = h.charge("order_7100_charge", "order_7100", over, "EUR").await;
    assert_eq!(code(&charge), "invalid_arguments", "{charge}");
    assert!(charge["details"].to_string().contains("amount_minor"), "{charge}");
    assert_eq!(h.charge("order_7100_charge", "order_7100", 100, "EUR").await["status"], "validated");
    let before = h.events().len();
    for amount in [over, i64::MAX] {
        let refund = h.refund("order_7100_refund", "order_7100", amount, "EUR").await;
        assert_eq!(code(&refund), "invalid_arguments", "{refund}");
    }
    assert_eq!(h.events().len(), before);
    assert_eq!(provider.effect_count(), 1);
}

#[tokio::test]
async fn a_refund_in_another_currency_than_its_charge_is_refused_and_writes_nothing() {
    let (h, provider) = Harness::memory(local_capability());
    assert_eq!(h.charge("order_7200_charge", "order_7200", 4900, "XOF").await["status"], "validated");
    let before = h.events().len();
    for currency in ["EUR", "USD"] {
        let out = h.refund("order_7200_refund_1", "order_7200", 4900, currency).await;
        assert_eq!(out["status"], "rejected", "{out}");
        assert!(["invalid_arguments", "invariant_violated"].contains(&code(&out)), "{out}");
    }
    let out = h.unchecked("refund", "order_7200_refund_2", 10, "xof").await;
    assert_eq!(out["status"], "rejected", "a lower-case code never reaches the ledger's totals: {out}");
    assert_eq!(h.events().len(), before);
    assert_eq!(provider.effect_count(), 1);
    assert_eq!(h.refund("order_7200_refund_1", "order_7200", 4900, "XOF").await["status"], "validated");
}

#[tokio::test]
async fn a_currency_is_case_insensitive_on_input_and_upper_case_inside() {
    let (h, _) = Harness::memory(local_capability());
    let out = h.charge("order_7300_charge", "order_7300", 4900, "eur").await;
    assert_eq!(out["status"], "validated", "{out}");
    let key = IntentKey::new(EffectKind::Charge, TENANT, "order_7300_charge");
    assert_eq!(h.log.ledger().intent(&key).expect("reserved").definition.currency, "EUR");
    let again = h.charge("order_7300_charge", "order_7300", 4900, "EUR").await;
    assert_eq!(again["source"], "deduplicated", "eur and EUR are the same payload: {again}");
    assert_eq!(h.refund("order_7300_refund", "order_7300", 4900, "Eur").await["status"], "validated");
}

#[tokio::test]
async fn distinct_partial_refunds_of_one_order_go_through_while_one_is_pending() {
    let (h, provider) = Harness::memory(local_capability());
    assert_eq!(h.charge("order_7400_charge", "order_7400", 5000, "EUR").await["status"], "validated");
    provider.script([Scripted::LoseAnswer]);
    assert_eq!(h.refund("order_7400_refund_1", "order_7400", 1000, "EUR").await["status"], "outcome_unknown");
    let second = h.refund("order_7400_refund_2", "order_7400", 1000, "EUR").await;
    assert_eq!(second["status"], "validated", "a second refund is another intent, not a way around one: {second}");
    let third = h.refund("order_7400_refund_3", "order_7400", 3001, "EUR").await;
    assert_eq!(code(&third), "invariant_violated", "the cumulative invariant still protects the order: {third}");
    assert_eq!(h.refund("order_7400_refund_4", "order_7400", 3000, "EUR").await["status"], "validated");
    assert_eq!(provider.effect_count(), 4);
}

/// A provider (tier `lookup`, no deduplication) that answers 503 at once but commits the effect
/// `commit_after_ms` after receiving the request; its lookup sees an effect once committed.
struct LateCommit {
    clock: Arc<ManualClock>,
    commit_after_ms: i64,
    capability: Capability,
    committed_at: Mutex<Vec<DateTime<Utc>>>,
}

impl LateCommit {
    fn effects_by(&self, now: DateTime<Utc>) -> usize {
        self.committed_at.lock().expect("test mutex").iter().filter(|at| **at <= now).count()
    }
}

impl PaymentProvider for LateCommit {
    fn capability(&self) -> Capability {
        self.capability
    }

    fn execute<'a>(&'a self, _request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let at = self.clock.now() + chrono::TimeDelta::milliseconds(self.commit_after_ms);
            self.committed_at.lock().expect("test mutex").push(at);
            CallOutcome::Unknown { reason: UnknownReason::ProviderUnavailable, detail: "503, still working".into() }
        })
    }

    fn lookup<'a>(&'a self, _kind: EffectKind, _key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            if self.effects_by(self.clock.now()) > 0 {
                LookupOutcome::Found(Evidence {
                    provider_ref: "re_late".into(),
                    amount_minor: 5000,
                    currency: "EUR".into(),
                })
            } else {
                LookupOutcome::Absent
            }
        })
    }
}

#[tokio::test]
async fn a_resend_after_absence_waits_for_the_request_timeout_plus_the_consistency_window() {
    let clock = Arc::new(ManualClock::new(start()));
    let capability = Capability {
        dedup_by_key: false,
        lookup: true,
        key_window_ms: 86_400_000,
        consistency_window_ms: 2_000,
        request_timeout_ms: 10_000,
    };
    let provider = Arc::new(LateCommit {
        clock: clock.clone(),
        commit_after_ms: 4_000,
        capability,
        committed_at: Mutex::new(Vec::new()),
    });
    let h = Harness::new(provider.clone(), clock.clone());
    let key = IntentKey::new(EffectKind::Charge, TENANT, "order_7500_charge");
    let out = h.charge("order_7500_charge", "order_7500", 5000, "EUR").await;
    assert_eq!(out["status"], "outcome_unknown", "{out}");
    for _ in 0..40 {
        h.clock.advance_ms(1_000);
        h.executor.reconcile_due(Cause::command("reconcile")).await.expect("reconciles");
        // The caller re-submits whenever Keel says the charge may go again.
        if h.log.ledger().intent(&key).is_some_and(|i| i.status == IntentStatus::Reserved) {
            h.charge("order_7500_charge", "order_7500", 5000, "EUR").await;
        }
    }
    assert_eq!(provider.effects_by(h.clock.now()), 1, "one request, one effect: no resend while it may still land");
    let intent = h.log.ledger().intent(&key).expect("reserved").clone();
    assert_eq!(intent.status, IntentStatus::Validated, "{intent:?}");
    assert_eq!(intent.attempts, 1);
}

#[tokio::test]
async fn a_request_proven_never_sent_is_retried_with_backoff_and_stays_pending_for_the_caller() {
    let (h, provider) = Harness::memory(local_capability());
    provider.script(std::iter::repeat_n(Scripted::Refuse, 50));
    let before = h.clock.now();
    let out = h.charge("order_7600_charge", "order_7600", 1000, "EUR").await;
    assert_eq!(out["status"], "provider_unavailable", "a clear controlled outcome: {out}");
    assert!(h.clock.now() > before, "the retries waited (through the clock) between sends");
    let key = IntentKey::new(EffectKind::Charge, TENANT, "order_7600_charge");
    let intent = h.log.ledger().intent(&key).expect("reserved").clone();
    assert_eq!(intent.status, IntentStatus::Reserved, "pending, never escalated for a request that never left");
    let sent = h.events().iter().filter(|e| matches!(e, Event::AttemptStarted { .. })).count();
    assert!(sent > 1 && sent < 50, "retried, within a bound: {sent} attempts");
    provider.heal();
    let again = h.charge("order_7600_charge", "order_7600", 1000, "EUR").await;
    assert_eq!(again["status"], "validated", "a re-submission of the same key continues it: {again}");
    assert_eq!(provider.effect_count(), 1);
}

/// A provider whose success carries an empty id: not evidence of anything.
struct EmptyEvidence;

impl PaymentProvider for EmptyEvidence {
    fn capability(&self) -> Capability {
        local_capability()
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            CallOutcome::Succeeded(Evidence {
                provider_ref: String::new(),
                amount_minor: request.amount_minor,
                currency: request.currency.clone(),
            })
        })
    }

    fn lookup<'a>(&'a self, _kind: EffectKind, _key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async {
            LookupOutcome::Found(Evidence { provider_ref: " ".into(), amount_minor: 1000, currency: "EUR".into() })
        })
    }
}

#[tokio::test]
async fn empty_evidence_is_never_a_validation() {
    let h = Harness::new(Arc::new(EmptyEvidence), Arc::new(ManualClock::new(start())));
    let out = h.charge("order_7700_charge", "order_7700", 1000, "EUR").await;
    assert_eq!(out["status"], "outcome_unknown", "an empty provider id proves nothing: {out}");
    let key = IntentKey::new(EffectKind::Charge, TENANT, "order_7700_charge");
    let reconciled = h.executor.reconcile(&key, Cause::command("reconcile")).await.expect("reconciles");
    assert_ne!(reconciled.status.as_str(), "validated", "a blank id from a lookup proves nothing either");
    assert!(!h.events().iter().any(|e| matches!(e, Event::IntentValidated { .. })));
}

#[tokio::test]
async fn ids_with_control_invisible_or_non_ascii_characters_are_invalid_and_write_nothing() {
    let (h, provider) = Harness::memory(local_capability());
    let charge = |tenant: &str, intent_id: &str, order: &str| {
        json!({"tenant_id": tenant, "intent_id": intent_id, "order_id": order, "amount_minor": 100,
               "currency": "EUR", "payment_method_token": CARD_TOKEN})
    };
    for bad in [
        charge(TENANT, "order_7800_charge\u{7}", "order_7800"),
        charge(TENANT, "order_7800\u{200b}_charge", "order_7800"),
        charge(TENANT, "order_7800_chargé", "order_7800"),
        charge(TENANT, "order 7800 charge", "order_7800"),
        charge(TENANT, "order_7800_charge", "order\u{0}7800"),
        charge(TENANT, "order_7800_charge", "order_7800\u{feff}"),
        charge(TENANT, "order_7800_charge", "ordér_7800"),
        charge("3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d1\u{ff10}", "order_7800_charge", "order_7800"),
    ] {
        let out = h.run("charge", &bad).await;
        assert_eq!(code(&out.output), "invalid_arguments", "{bad}: {}", out.output);
        assert!(!out.written, "{bad}");
    }
    assert!(h.events().is_empty(), "nothing was written");
    assert_eq!(provider.effect_count(), 0);
}

/// Records what each request carries beside the effect, then lets the in-memory provider act.
struct Recording {
    inner: MemoryProvider,
    seen: Mutex<Vec<(EffectKind, Option<String>, String)>>,
}

impl PaymentProvider for Recording {
    fn capability(&self) -> Capability {
        self.inner.capability()
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        let seen = (request.kind, request.charge_ref.clone(), request.fingerprint.clone());
        self.seen.lock().expect("test mutex").push(seen);
        self.inner.execute(request)
    }

    fn lookup<'a>(&'a self, kind: EffectKind, key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        self.inner.lookup(kind, key)
    }
}

#[tokio::test]
async fn a_refund_request_names_its_orders_one_charge_and_every_request_its_fingerprint() {
    let provider = Arc::new(Recording { inner: MemoryProvider::new(local_capability()), seen: Mutex::default() });
    let h = Harness::new(provider.clone(), Arc::new(ManualClock::new(start())));
    let charged = h.charge("order_7900_charge", "order_7900", 5_000, "EUR").await;
    let charge_ref = charged["provider_ref"].as_str().expect("the charge's evidence").to_owned();
    h.refund("order_7900_refund", "order_7900", 1_000, "EUR").await;
    // An order charged twice has no single charge to name: a provider that refunds one
    // charge at a time is told so (it does not guess).
    h.charge("order_7901_charge_a", "order_7901", 2_000, "EUR").await;
    h.charge("order_7901_charge_b", "order_7901", 3_000, "EUR").await;
    h.refund("order_7901_refund", "order_7901", 1_000, "EUR").await;
    let seen = provider.seen.lock().expect("test mutex").clone();
    let refs: Vec<(EffectKind, Option<&str>)> = seen.iter().map(|(kind, r, _)| (*kind, r.as_deref())).collect();
    assert_eq!(
        refs,
        [
            (EffectKind::Charge, None),
            (EffectKind::Refund, Some(charge_ref.as_str())),
            (EffectKind::Charge, None),
            (EffectKind::Charge, None),
            (EffectKind::Refund, None),
        ]
    );
    let stored = h.log.ledger().intent(&IntentKey::new(EffectKind::Charge, TENANT, "order_7900_charge")).cloned();
    assert_eq!(seen.first().map(|(_, _, f)| f.clone()), stored.map(|i| i.definition.fingerprint));
}
