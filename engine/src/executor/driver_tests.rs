//! The intent driver at the engine's boundary: an intent reserved for a run with
//! [`reserve_for_run`] and taken as far as it may go now with [`drive_intent`], over the
//! in-memory log and provider and a manual clock. What the provider is asked (only once the
//! attempt is durable, under the intent's key, with the run's time left), what each answer
//! leads to (a lookup after a lost answer, a retry after a request that never left, a wait
//! for the caller's payment method), how a refusal that may be a race is answered, and what
//! the caller is told ([`IntentOutcome`], as the CLI renders it), the lease it claimed given
//! back, and the attempt span that says why each attempt was sent.

use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, Event, IntentKey, RunId, RunLimits, RunStatus};
use crate::lease::{LeaseGrant, LeaseOwner, LeaseUse};
use crate::ledger::{Action, Command, IntentStatus, Refusal, RejectCode, Reply, RunStart, Step};
use crate::log::Unsealed;
use crate::memory::{MemoryLog, MemoryProvider, Scripted};
use crate::provider::{BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, LookupOutcome};
use chrono::{DateTime, TimeZone, Utc};
use serde_json::json;
use std::future::Future;
use std::sync::{Arc, Mutex};

const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";

/// The run's deadline: an hour after the clock's start.
const RUN_MS: u64 = 3_600_000;

/// Polls `future` to its end: everything here answers at once (the in-memory log and
/// provider, a manual clock whose sleeps move it), so a future that is still pending is a bug.
fn now_or_never<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the in-memory log, provider and clock never make a test wait"),
    }
}

/// A provider that keys and looks effects up, answering at once (no request timeout, no
/// consistency window).
fn capability() -> Capability {
    Capability {
        dedup_by_key: true,
        lookup: true,
        key_window_ms: 86_400_000,
        consistency_window_ms: 0,
        request_timeout_ms: 0,
    }
}

/// One request the provider was asked, and how many attempts of its intent the log held
/// started at that moment.
struct Asked {
    request: EffectRequest,
    started_in_log: usize,
}

/// The in-memory provider, recording every request with what the log held when it came.
struct Watching {
    inner: MemoryProvider,
    log: Arc<MemoryLog>,
    asked: Mutex<Vec<Asked>>,
}

impl crate::provider::PaymentProvider for Watching {
    fn capability(&self) -> Capability {
        self.inner.capability()
    }

    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        let started_in_log = self
            .log
            .events()
            .iter()
            .filter(
                |e| matches!(&e.event, Event::AttemptStarted { key, .. } if key.as_str() == request.idempotency_key),
            )
            .count();
        self.asked.lock().expect("test mutex").push(Asked { request: request.clone(), started_in_log });
        self.inner.execute(request)
    }

    fn lookup<'a>(&'a self, kind: EffectKind, idempotency_key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        self.inner.lookup(kind, idempotency_key)
    }
}

/// What the log does to the driver's next `StartReconciliation`, once: another process's
/// command committed first (if any), then the driver's own forwarded, or refused with
/// `refusal` instead.
struct Interference {
    first: Option<Command>,
    refusal: Option<Refusal>,
}

/// The in-memory log, with an [`Interference`] armed or not.
struct Racing {
    inner: Arc<MemoryLog>,
    armed: Mutex<Option<Interference>>,
}

impl crate::log::EventLog for Racing {
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, crate::log::LogError>> {
        let interference = match command.action {
            Action::StartReconciliation { .. } => self.armed.lock().expect("test mutex").take(),
            _ => None,
        };
        let answer = match interference {
            None => self.inner.execute_now(&command),
            Some(Interference { first, refusal }) => {
                if let Some(first) = first {
                    self.inner.execute_now(&first).expect("the other process's command is accepted");
                }
                match refusal {
                    Some(refusal) => Err(crate::log::LogError::Refused(refusal)),
                    None => self.inner.execute_now(&command),
                }
            }
        };
        Box::pin(std::future::ready(answer))
    }
}

/// A started run (`run-1`, held by this process with token 1) over the in-memory log.
struct Rig {
    clock: Arc<ManualClock>,
    log: Arc<MemoryLog>,
    racing: Arc<Racing>,
    provider: Arc<Watching>,
    runtime: Runtime,
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("a valid instant")
}

fn run_id() -> RunId {
    RunId::new("run-1")
}

/// The run's lease, as this process holds it.
fn held() -> LeaseUse {
    LeaseUse::Hold(LeaseGrant { run_id: run_id(), token: 1 })
}

fn owner() -> LeaseOwner {
    LeaseOwner::named("driver-test")
}

fn run_start(run_id: RunId, owner: Option<LeaseOwner>) -> RunStart {
    RunStart {
        run_id,
        workflow: "charge".into(),
        input: json!({}),
        deadline_at: crate::clock::plus_ms(t0(), RUN_MS),
        limits: RunLimits { cost_minor_max: Some(10_000), ..RunLimits::default() },
        versions: Default::default(),
        owner,
    }
}

impl Rig {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(t0()));
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let racing = Arc::new(Racing { inner: log.clone(), armed: Mutex::new(None) });
        let inner = MemoryProvider::new(capability());
        let provider = Arc::new(Watching { inner, log: log.clone(), asked: Mutex::new(Vec::new()) });
        let lessee = crate::lease::Lessee::new(owner());
        let start =
            Command::new(Cause::command("test"), Action::StartRun).starting(Some(run_start(run_id(), Some(owner()))));
        log.execute_now(&start).expect("the run starts");
        lessee.hold(&LeaseGrant { run_id: run_id(), token: 1 });
        let runtime = Runtime { log: racing.clone(), provider: provider.clone(), clock: clock.clone(), lessee };
        Self { clock, log, racing, provider, runtime }
    }

    /// Reserves `request` for the run (nothing sent), and returns its key.
    fn reserve(&self, request: &IntentRequest) -> Result<IntentKey, Box<IntentOutcome>> {
        match now_or_never(reserve_for_run(
            &self.runtime,
            &Cause::command("test"),
            &run_id(),
            request,
            HumanApproval::NotRequired,
            None,
        )) {
            Ok(Reservation::Reserved(answer)) => Ok(answer.intent.key().clone()),
            Ok(Reservation::Rejected(outcome)) => Err(Box::new(outcome)),
            Err(e) => panic!("the reservation is decided: {e}"),
        }
    }

    /// The order's charge (49.00 EUR), reserved, sent and validated through the log alone
    /// (the caller with the payment method did it): what a refund is checked against.
    fn charged(&self) {
        let request = charge(4_900);
        let key = IntentKey::new(request.kind, &request.tenant, &request.intent_id);
        let position = self.log.ledger().run(&run_id()).expect("the run").journal_len;
        let spec = driver::intent_spec(&self.runtime, &key, &request, false);
        let reserve = Action::Reserve { run_id: run_id(), position, spec, start_attempt: true };
        self.log.execute_now(&Command::new(Cause::command("test"), reserve).under(held())).expect("reserved");
        let evidence =
            crate::provider::Evidence { provider_ref: "ch_0".into(), amount_minor: 4_900, currency: "EUR".into() };
        let answer = Action::RecordOutcome { key, attempt: 1, outcome: CallOutcome::Succeeded(evidence) };
        self.log.execute_now(&Command::new(Cause::command("test"), answer)).expect("charged");
    }

    /// Drives `key` as an agent's gate does: with a cause of its own that names no run (the
    /// driver acts for the intent's run whatever its caller's cause says).
    fn drive(&self, key: &IntentKey) -> Result<IntentOutcome, WorkflowError> {
        now_or_never(drive_intent(&self.runtime, Cause::command("agent"), key, None))
    }

    /// The charge reserved and sent, its answer lost, its lookup due.
    fn lost_and_due(&self) -> IntentKey {
        self.charged();
        self.provider.inner.script([Scripted::LoseAnswer]);
        let key = self.reserve(&refund(1_000)).expect("reserved");
        let unknown = self.drive(&key).expect("driven");
        assert_eq!(unknown.status, OutcomeStatus::Intent(IntentStatus::OutcomeUnknown));
        self.clock.advance_ms(i64::try_from(crate::limits::reconcile_backoff_ms(1)).expect("small"));
        key
    }

    fn asked(&self) -> Vec<(u64, String, usize)> {
        let asked = self.provider.asked.lock().expect("test mutex");
        asked
            .iter()
            .map(|a| (a.request.timeout_ms.unwrap_or(0), a.request.idempotency_key.clone(), a.started_in_log))
            .collect()
    }

    /// `run-2`, started by the command, proposes the same refund as `key`'s.
    fn proposed_by_another_run(&self, key: &IntentKey) -> Command {
        let other = RunId::new("run-2");
        let spec = driver::intent_spec(&self.runtime, key, &refund(1_000), false);
        let reserve = Action::Reserve { run_id: other.clone(), position: 0, spec, start_attempt: false };
        Command::new(Cause::command("other"), reserve).starting(Some(run_start(other, None)))
    }

    fn arm(&self, first: Option<Command>, refusal: Option<Refusal>) {
        *self.racing.armed.lock().expect("test mutex") = Some(Interference { first, refusal });
    }
}

fn charge(amount_minor: i64) -> IntentRequest {
    let payload = json!({"order_id": "order_1", "amount_minor": amount_minor, "currency": "EUR"});
    IntentRequest {
        kind: EffectKind::Charge,
        tenant: TENANT.into(),
        intent_id: "order_1_charge".into(),
        order_id: "order_1".into(),
        business_ref: "order_1".into(),
        amount_minor,
        currency: "EUR".into(),
        payload,
        payment_method: None,
        tool: None,
    }
}

fn refund(amount_minor: i64) -> IntentRequest {
    let payload = json!({"order_id": "order_1", "refund_minor": amount_minor, "currency": "EUR"});
    IntentRequest {
        kind: EffectKind::Refund,
        intent_id: "order_1_refund".into(),
        business_ref: "order_1_refund".into(),
        payload,
        ..charge(amount_minor)
    }
}

/// The outcome as the CLI's JSON shows it.
fn shown(outcome: &IntentOutcome) -> serde_json::Value {
    serde_json::to_value(outcome).expect("an outcome serialises")
}

#[test]
fn an_attempt_is_durable_before_the_provider_is_asked_under_the_intents_key_with_the_runs_time_left() {
    let rig = Rig::new();
    rig.charged();
    let key = rig.reserve(&refund(1_000)).expect("reserved");
    rig.clock.advance_ms(1_000);
    let outcome = rig.drive(&key).expect("driven");
    assert_eq!(rig.asked(), [(RUN_MS - 1_000, key.as_str().to_owned(), 1)], "one request, after AttemptStarted");
    assert!(outcome.is_validated());
    assert_eq!(outcome.run_status(), RunStatus::Completed);
    let shown = shown(&outcome);
    assert_eq!(
        (&shown["status"], &shown["source"], &shown["provider_ref"]),
        (&json!("validated"), &json!("provider"), &json!("re_1"))
    );
    assert_eq!(shown.get("code"), None, "a validated refund carries no code");
}

#[test]
fn a_lost_answer_is_looked_up_once_due_and_never_resent() {
    let rig = Rig::new();
    rig.charged();
    rig.provider.inner.script([Scripted::LoseAnswer]);
    let key = rig.reserve(&refund(1_000)).expect("reserved");
    let unknown = rig.drive(&key).expect("driven");
    assert!(!unknown.is_validated());
    assert_eq!(unknown.run_status(), RunStatus::OutcomeUnknown);
    assert_eq!(shown(&unknown)["status"], json!("outcome_unknown"));
    assert!(unknown.reconcile_after.is_some(), "a lookup is due later");
    // Not due yet: nothing happens.
    let early = rig.drive(&key).expect("driven");
    assert_eq!((early.status, early.reconciliations), (OutcomeStatus::Intent(IntentStatus::OutcomeUnknown), 0));
    rig.clock.advance_ms(i64::try_from(crate::limits::reconcile_backoff_ms(1)).expect("small"));
    let found = rig.drive(&key).expect("driven");
    assert_eq!(rig.asked().len(), 1, "the effect the lost answer made is found, not made again");
    assert_eq!((found.reconciliations, &shown(&found)["source"]), (1, &json!("reconciled")));
    assert!(found.is_validated());
}

#[test]
fn a_charge_is_never_sent_without_its_payment_method_and_a_refund_that_never_left_is_retried_after_its_backoff() {
    let rig = Rig::new();
    let key = rig.reserve(&charge(4_900)).expect("reserved");
    let waiting = rig.drive(&key).expect("driven");
    assert_eq!(rig.asked().len(), 0, "nothing is sent without the payment method");
    assert_eq!((waiting.status, waiting.attempts), (OutcomeStatus::Intent(IntentStatus::Reserved), 0));
    assert_eq!(waiting.details.last(), Some(&Unsealed::NoVault.waiting_reason()));

    // A refund needs no payment method: sent, and once proven never sent, retried after the
    // network backoff, with the time that backoff took off the run's.
    let rig = Rig::new();
    rig.charged();
    rig.provider.inner.script([Scripted::Refuse]);
    let key = rig.reserve(&refund(1_000)).expect("reserved");
    let refunded = rig.drive(&key).expect("driven");
    assert!(refunded.is_validated(), "{refunded:?}");
    let backoff = crate::limits::network_retry_backoff_ms(1);
    assert!(backoff > 0);
    let timeouts: Vec<u64> = rig.asked().iter().map(|(timeout, ..)| *timeout).collect();
    assert_eq!(timeouts, [RUN_MS, RUN_MS - backoff], "the retry waited {backoff} ms");
}

/// The driver's `StartReconciliation` refused because the intent moved under it is answered
/// with the intent as it is now; a refusal when nothing moved, or one that is no race, is
/// returned as it is.
#[test]
fn a_refusal_that_may_be_a_race_is_answered_with_the_fresh_intent_only_when_it_moved() {
    let wrong_status = |key: &IntentKey| Refusal::WrongStatus {
        key: key.clone(),
        status: IntentStatus::OutcomeUnknown,
        step: Step::Reconcile,
    };
    // Another process of the same run started the lookup first: the driver's is refused.
    let rig = Rig::new();
    let key = rig.lost_and_due();
    let first = Command::new(
        Cause::command("other"),
        Action::StartReconciliation { key: key.clone(), force: false, run_id: run_id() },
    )
    .under(held());
    rig.arm(Some(first), None);
    let outcome = rig.drive(&key);
    assert!(outcome.is_ok(), "the fresh intent says what is left: {outcome:?}");

    // Another run proposed the same key (a resend refused): the intent's latest event is
    // new, nothing else of it changed.
    let rig = Rig::new();
    let key = rig.lost_and_due();
    rig.arm(Some(rig.proposed_by_another_run(&key)), Some(wrong_status(&key)));
    let moved = rig.drive(&key).expect("a move of the intent's latest event is a move");
    assert!(moved.is_validated(), "{moved:?}");

    // Nothing moved: the refusal is the answer.
    let rig = Rig::new();
    let key = rig.lost_and_due();
    rig.arm(None, Some(wrong_status(&key)));
    let refused = rig.drive(&key);
    assert!(matches!(refused, Err(WorkflowError::Log(LogError::Refused(Refusal::WrongStatus { .. })))), "{refused:?}");

    // A refusal that is no race is returned even though the intent moved.
    let rig = Rig::new();
    let key = rig.lost_and_due();
    rig.arm(Some(rig.proposed_by_another_run(&key)), Some(Refusal::UnknownRun(run_id())));
    let refused = rig.drive(&key);
    assert!(matches!(refused, Err(WorkflowError::Log(LogError::Refused(Refusal::UnknownRun(_))))), "{refused:?}");
}

#[test]
fn a_proposal_refused_before_anything_is_written_ends_the_run_rejected_or_out_of_budget() {
    let rig = Rig::new();
    let over = rig.reserve(&charge(10_001)).expect_err("over the run's budget of 100.00");
    assert_eq!(over.code, Some(OutcomeCode::Rejected(RejectCode::BudgetExhausted)));
    assert_eq!(over.run_status(), RunStatus::CostBudget);
    let invalid = rig.reserve(&charge(0)).expect_err("no amount");
    assert_eq!(shown(&invalid)["status"], json!("rejected"));
    assert_eq!(invalid.run_status(), RunStatus::Rejected);
    assert!(!invalid.is_validated());
    assert!(rig.log.events().iter().all(|e| !matches!(e.event, Event::IntentReserved { .. })), "nothing written");
}

#[test]
fn an_outcome_says_how_the_intent_ended_declined_or_abandoned_and_the_run_ends_the_same() {
    let rig = Rig::new();
    rig.charged();
    rig.provider.inner.script([Scripted::Decline]);
    let key = rig.reserve(&refund(1_000)).expect("reserved");
    let declined = rig.drive(&key).expect("driven");
    assert_eq!((&shown(&declined)["status"], &shown(&declined)["code"]), (&json!("declined"), &json!("card_declined")));
    assert_eq!(declined.run_status(), RunStatus::Declined);

    // A charge never sent, waiting for a caller who never came back, is abandoned.
    let rig = Rig::new();
    let key = rig.reserve(&charge(4_900)).expect("reserved");
    rig.drive(&key).expect("driven");
    rig.clock.advance_ms(60_000);
    let abandon = Action::Abandon { key: key.clone(), run_id: run_id(), window_ms: 60_000 };
    rig.log.execute_now(&Command::new(Cause::command("test"), abandon).under(held())).expect("abandoned");
    let abandoned = rig.drive(&key).expect("driven");
    assert_eq!(abandoned.code, Some(OutcomeCode::Rejected(RejectCode::Abandoned)), "{abandoned:?}");
    assert_eq!(abandoned.run_status(), RunStatus::Rejected);
}

#[test]
fn a_runs_end_and_an_intents_source_read_in_text_as_in_json() {
    assert_eq!(serde_json::to_value(RunEnd::Finished(RunStatus::Completed)).expect("serialises"), json!("completed"));
    assert_eq!(serde_json::to_value(RunEnd::Suspended).expect("serialises"), json!("suspended"));
    for by in [ValidatedBy::Provider, ValidatedBy::Deduplicated, ValidatedBy::Reconciled] {
        assert_eq!(serde_json::to_value(by).expect("serialises"), json!(by.as_str()), "{by:?}");
    }
}

/// A driver acting for a run whose lease this process does not hold claims it for the time
/// of the work and gives it back: another process may take the run at once.
#[test]
fn a_driver_gives_back_the_lease_it_claimed_for_the_work() {
    let rig = Rig::new();
    rig.charged();
    let key = rig.reserve(&refund(1_000)).expect("reserved");
    rig.runtime.lessee.forget(&run_id());
    assert!(rig.drive(&key).expect("driven").is_validated());
    assert_eq!(rig.runtime.lessee.grant(&run_id()), None, "this process holds nothing after the work");
    let other = Action::ClaimRun { run_id: run_id(), owner: LeaseOwner::named("another-process") };
    let claimed = rig.log.execute_now(&Command::new(Cause::command("other"), other));
    assert!(matches!(claimed, Ok(Reply::Claimed(_))), "free for another process: {claimed:?}");
}

/// One span: its name and its fields, as text.
type Span = (String, std::collections::BTreeMap<String, String>);

/// The spans a test's thread opens.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Span>>>);

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl tracing::Subscriber for Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = std::collections::BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().expect("test mutex");
        spans.push((attrs.metadata().name().to_owned(), fields));
        tracing::span::Id::from_u64(u64::try_from(spans.len()).expect("a few spans"))
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The process's subscriber, collecting every span of every test's thread (a thread's own
/// default misses the spans of callsites another thread met first): a test reads its own by
/// its intent's key.
fn spans() -> &'static Spans {
    static SPANS: std::sync::OnceLock<Spans> = std::sync::OnceLock::new();
    SPANS.get_or_init(|| {
        let spans = Spans::default();
        tracing::subscriber::set_global_default(spans.clone()).expect("no other engine test sets a subscriber");
        spans
    })
}

/// Seed 004's attempt span says why each attempt was sent: the first, or a resend after the
/// effect was proven absent.
#[test]
fn an_attempts_span_says_why_it_was_sent() {
    let spans = spans();
    let rig = Rig::new();
    rig.charged();
    rig.provider.inner.script([Scripted::TimeoutBeforeEffect]);
    let traced = IntentRequest { intent_id: "order_1_refund_traced".into(), ..refund(1_000) };
    let key = rig.reserve(&traced).expect("reserved");
    rig.drive(&key).expect("driven");
    rig.clock.advance_ms(i64::try_from(crate::limits::reconcile_backoff_ms(1)).expect("small"));
    assert!(rig.drive(&key).expect("driven").is_validated(), "looked up absent, resent, validated");
    let hash = key.hash().to_string();
    let reasons: Vec<(String, String)> = spans
        .0
        .lock()
        .expect("test mutex")
        .iter()
        .filter(|(name, fields)| name == "attempt" && fields.get("effect.idempotency_key_hash") == Some(&hash))
        .map(|(_, fields)| (fields["retry.attempt"].clone(), fields["retry.reason"].clone()))
        .collect();
    assert_eq!(reasons, [("1".to_owned(), "first".to_owned()), ("2".to_owned(), "proven_absent".to_owned())]);
}
