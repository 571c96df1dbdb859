//! The ledger at its boundary: given a history (commands already decided), one more command
//! and the time, the events it appends — or its refusal — as data.

use super::*;
use crate::clock::ManualClock;
use crate::event::{
    AfterLookup, Cause, Event, IntentDefinition, IntentKey, LateVerdict, LookupStatus, RunId, RunLimits, RunStatus,
};
use crate::lease::LeaseOwner;
use crate::lease::{LeaseGrant, LeaseUse};
use crate::limits;
use crate::log::LogError;
use crate::memory::MemoryLog;
use crate::provider::{CallOutcome, EffectKind, LookupOutcome, UnknownReason};
use crate::provider::{Capability, Evidence};
use chrono::{DateTime, TimeZone, Utc};

use std::sync::Arc;

const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";

pub(super) fn run() -> RunId {
    RunId::new("run-1")
}

pub(super) fn key() -> IntentKey {
    IntentKey::new(EffectKind::Charge, TENANT, "order_1_charge")
}

pub(super) fn evidence(provider_ref: &str) -> Evidence {
    Evidence { provider_ref: provider_ref.into(), amount_minor: 4_900, currency: "EUR".into() }
}

/// The instant every fixture starts at; its run's deadline is an hour later.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("valid")
}

/// `ms` after the fixtures' start (`t0`).
pub(super) fn plus(ms: u64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds(i64::try_from(ms).expect("a small delay"))
}

fn stripe() -> Capability {
    tier(true, true)
}

/// A provider that deduplicates by key and/or looks effects up, answering at once (no
/// request timeout, no consistency window), keys valid a day.
pub(super) fn tier(dedup_by_key: bool, lookup: bool) -> Capability {
    Capability { dedup_by_key, lookup, key_window_ms: 86_400_000, consistency_window_ms: 0, request_timeout_ms: 0 }
}

/// The instant the boundary table's histories start at (`t0`).
pub(super) fn nine_am() -> DateTime<Utc> {
    t0()
}

/// The fixture's charge (49.00 EUR for a provider that keys and looks effects up), held for a
/// human when `approval_required`: what any run reserves it with.
pub(super) fn spec(approval_required: bool) -> IntentSpec {
    Fixture { approval_required, ..Fixture::default() }.spec()
}

/// The command that reserves the fixture's charge for `run()` (deadline `t0` + 1 h),
/// starting the run with it, the first attempt written ahead when `start_attempt`.
pub(super) fn reserve(capability: Capability, limits: RunLimits, start_attempt: bool) -> Command {
    Fixture { capability, limits, start_attempt, approval_required: false }.reservation()
}

/// One charge of 49.00 EUR reserved by `run-1` (deadline `t0` + 1 h) for a provider of
/// `capability`, under `limits`; its first attempt started with the reservation when
/// `start_attempt`, and held for a human when `approval_required`.
struct Fixture {
    capability: Capability,
    limits: RunLimits,
    start_attempt: bool,
    approval_required: bool,
}

impl Default for Fixture {
    fn default() -> Self {
        Self { capability: stripe(), limits: RunLimits::default(), start_attempt: true, approval_required: false }
    }
}

impl Fixture {
    fn spec(&self) -> IntentSpec {
        let payload = serde_json::json!({"order_id": "order_1", "amount_minor": 4_900, "currency": "EUR"});
        IntentSpec {
            definition: IntentDefinition {
                key: key(),
                kind: EffectKind::Charge,
                tenant: TENANT.into(),
                intent_id: "order_1_charge".into(),
                order_id: "order_1".into(),
                business_ref: "order_1".into(),
                fingerprint: crate::canonical::fingerprint(&payload),
                amount_minor: 4_900,
                currency: "EUR".into(),
                payload,
                tool: None,
            },
            capability: self.capability,
            approval_required: self.approval_required,
        }
    }

    /// The command that starts `run-1` and reserves the intent.
    fn reservation(self) -> Command {
        let spec = self.spec();
        let start = RunStart { limits: self.limits, ..run_start(run(), plus(3_600_000)) };
        let reserve = Action::Reserve { run_id: run(), position: 0, spec, start_attempt: self.start_attempt };
        Command::new(Cause::command("test"), reserve).starting(Some(start))
    }

    /// The log, and the clock it reads (at `t0`).
    fn reserve(self) -> (MemoryLog, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(t0()));
        let log = MemoryLog::new(clock.clone());
        log.execute_now(&self.reservation()).expect("reserved");
        (log, clock)
    }
}

fn run_start(run_id: RunId, deadline_at: DateTime<Utc>) -> RunStart {
    RunStart {
        run_id,
        workflow: "charge".into(),
        input: serde_json::json!({}),
        deadline_at,
        limits: RunLimits::default(),
        versions: Default::default(),
        owner: None,
    }
}

/// A log with one charge of 49.00 EUR reserved and its first attempt in flight.
fn attempting() -> MemoryLog {
    Fixture::default().reserve().0
}

/// The same, for an intent allowed one attempt only.
fn attempting_once() -> MemoryLog {
    Fixture { limits: RunLimits { attempts_per_intent_max: 1, ..RunLimits::default() }, ..Fixture::default() }
        .reserve()
        .0
}

/// The same, for an intent allowed two reconciliations only.
fn attempting_reconciled_twice_at_most() -> MemoryLog {
    let limits = RunLimits { reconciliations_per_intent_max: 2, ..RunLimits::default() };
    Fixture { limits, ..Fixture::default() }.reserve().0
}

fn act(log: &MemoryLog, action: Action) -> Result<Reply, LogError> {
    log.execute_now(&Command::new(Cause::command("test"), action))
}

fn outcome(log: &MemoryLog, attempt: u32, outcome: CallOutcome) -> Result<Reply, LogError> {
    act(log, Action::RecordOutcome { key: key(), attempt, outcome })
}

fn recover(log: &MemoryLog) {
    act(log, Action::Recover { owner: LeaseOwner::named("recovery"), run: None }).expect("recovers");
}

/// `action` under the lease recovery took on the run.
fn held(log: &MemoryLog, action: Action) -> Result<Reply, LogError> {
    let hold = LeaseUse::Hold(LeaseGrant { run_id: run(), token: 1 });
    log.execute_now(&Command::new(Cause::command("test"), action).under(hold))
}

/// What the recovering process does next for the run it claimed: one lookup.
fn look_up(log: &MemoryLog, found: LookupOutcome) {
    let next = log.ledger().intent(&key()).expect("the intent").reconciliations + 1;
    held(log, Action::StartReconciliation { key: key(), force: true, run_id: run() }).expect("started");
    act(log, Action::RecordLookup { key: key(), reconciliation: next, outcome: found }).expect("recorded");
}

/// The resend a proven absence allows, by the run that holds the lease, and its outcome.
fn resend(log: &MemoryLog, outcome_of_it: CallOutcome) {
    held(log, Action::StartAttempt { key: key(), run_id: run() }).expect("a resend after a proven absence");
    let attempt = log.ledger().intent(&key()).expect("the intent").attempts;
    outcome(log, attempt, outcome_of_it).expect("its outcome is recorded");
}

fn unavailable() -> LookupOutcome {
    LookupOutcome::Unavailable { detail: "503".into() }
}

fn timeout() -> CallOutcome {
    CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() }
}

/// What a history does to one late answer: the verdict recorded, the event that follows it
/// in the same commit (if any), and the intent's status after.
struct Case {
    name: &'static str,
    history: fn(&MemoryLog),
    late: CallOutcome,
    verdict: Option<&'static str>,
    follows: Option<&'static str>,
    status: IntentStatus,
}

fn succeeded(provider_ref: &str) -> CallOutcome {
    CallOutcome::Succeeded(evidence(provider_ref))
}

#[test]
fn a_late_definitive_answer_settles_agrees_or_contradicts_never_vanishes() {
    let declined = || CallOutcome::Declined { code: "card_declined".into() };
    let cases = [
        Case {
            name: "declared crashed, then the success arrives",
            history: recover,
            late: succeeded("ch_1"),
            verdict: Some("settled"),
            follows: Some("IntentValidated"),
            status: IntentStatus::Validated,
        },
        Case {
            name: "declared crashed, then the decline arrives",
            history: recover,
            late: declined(),
            verdict: Some("settled"),
            follows: Some("IntentDeclined"),
            status: IntentStatus::Declined,
        },
        Case {
            name: "resolved absent by an operator, then the success arrives",
            history: |log| {
                recover(log);
                let resolve = Action::Resolve {
                    key: key(),
                    by: "ana".into(),
                    reason: "not seen".into(),
                    landed: None,
                    lookup: Some(LookupOutcome::Absent),
                    override_reason: None,
                };
                act(log, resolve).expect("resolved");
            },
            late: succeeded("ch_1"),
            verdict: Some("contradicted"),
            follows: Some("IntentEscalated"),
            status: IntentStatus::Escalated,
        },
        Case {
            name: "validated by a lookup, the same receipt arrives",
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Found(evidence("ch_1")));
            },
            late: succeeded("ch_1"),
            verdict: Some("consistent"),
            follows: None,
            status: IntentStatus::Validated,
        },
        Case {
            name: "validated by a lookup, another receipt arrives for the same key",
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Found(evidence("ch_1")));
            },
            late: succeeded("ch_2"),
            verdict: Some("contradicted"),
            follows: Some("IntentEscalated"),
            status: IntentStatus::Escalated,
        },
        Case {
            name: "proven absent (a resend is allowed), then the success arrives: no resend",
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Absent);
            },
            late: succeeded("ch_1"),
            verdict: Some("settled"),
            follows: Some("IntentValidated"),
            status: IntentStatus::Validated,
        },
        Case {
            name: "a success for another amount",
            history: recover,
            late: CallOutcome::Succeeded(Evidence { amount_minor: 1, ..evidence("ch_1") }),
            verdict: Some("contradicted"),
            follows: Some("IntentEscalated"),
            status: IntentStatus::Escalated,
        },
        Case {
            name: "a late unknown adds nothing",
            history: recover,
            late: CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "again".into() },
            verdict: None,
            follows: None,
            status: IntentStatus::OutcomeUnknown,
        },
    ];
    for case in cases {
        let log = attempting();
        (case.history)(&log);
        let before = log.events().len();
        outcome(&log, 1, case.late.clone()).unwrap_or_else(|e| panic!("{}: a late answer is accepted: {e}", case.name));
        let appended: Vec<Event> = log.events()[before..].iter().map(|e| e.event.clone()).collect();
        let verdict = appended.first().and_then(|e| match e {
            Event::LateAnswerRecorded { verdict, .. } => Some(match verdict {
                LateVerdict::Settled => "settled",
                LateVerdict::Consistent => "consistent",
                LateVerdict::Contradicted { .. } => "contradicted",
            }),
            _ => None,
        });
        assert_eq!(verdict, case.verdict, "{}: {appended:#?}", case.name);
        assert_eq!(appended.get(1).map(Event::type_name), case.follows, "{}: {appended:#?}", case.name);
        assert_eq!(appended.len(), usize::from(case.verdict.is_some()) + usize::from(case.follows.is_some()));
        let intent = log.ledger().intent(&key()).cloned().expect("the intent");
        assert_eq!(intent.status, case.status, "{}", case.name);
        assert_eq!(intent.money_committed(), case.status != IntentStatus::Declined, "{}: money", case.name);
    }
}

#[test]
fn an_answer_for_an_attempt_never_started_is_refused_and_writes_nothing() {
    let log = attempting();
    let before = log.events().len();
    let refused = outcome(&log, 2, succeeded("ch_1"));
    assert!(
        matches!(refused, Err(LogError::Refused(Refusal::NoSuchAttempt { attempt: 2, latest: 1, .. }))),
        "{refused:?}"
    );
    assert_eq!(log.events().len(), before);
}

fn declined() -> CallOutcome {
    CallOutcome::Declined { code: "card_declined".into() }
}

/// A late answer to `attempt` after a history that escalated the intent, resent it, or
/// validated it: the verdict, the event that follows, the status and whether the money is
/// still held.
struct Late {
    name: &'static str,
    start: fn() -> MemoryLog,
    history: fn(&MemoryLog),
    attempt: u32,
    late: CallOutcome,
    verdict: &'static str,
    follows: Option<&'static str>,
    status: IntentStatus,
    money_held: bool,
}

/// The history shared by several cases: the first attempt declared crashed, proven absent,
/// resent, and the resend's answer lost.
fn resent_and_lost(log: &MemoryLog) {
    recover(log);
    look_up(log, LookupOutcome::Absent);
    resend(log, timeout());
}

#[test]
fn a_late_answer_after_an_escalation_or_a_resend_settles_only_what_it_proves() {
    let cases = [
        Late {
            name: "escalated with its absence proven (attempts spent), then that attempt's success arrives",
            start: attempting_once,
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Absent);
            },
            attempt: 1,
            late: succeeded("ch_1"),
            verdict: "contradicted",
            follows: Some("IntentEscalated"),
            status: IntentStatus::Escalated,
            money_held: true,
        },
        Late {
            name: "escalated with its absence proven, then that attempt's decline arrives",
            start: attempting_once,
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Absent);
            },
            attempt: 1,
            late: declined(),
            verdict: "consistent",
            follows: None,
            status: IntentStatus::Escalated,
            money_held: false,
        },
        Late {
            name: "escalated, never proven (lookups spent), then the success arrives",
            start: attempting_reconciled_twice_at_most,
            history: |log| {
                recover(log);
                look_up(log, unavailable());
                look_up(log, unavailable());
            },
            attempt: 1,
            late: succeeded("ch_1"),
            verdict: "settled",
            follows: Some("IntentValidated"),
            status: IntentStatus::Validated,
            money_held: true,
        },
        Late {
            name: "escalated, never proven, then the decline arrives",
            start: attempting_reconciled_twice_at_most,
            history: |log| {
                recover(log);
                look_up(log, unavailable());
                look_up(log, unavailable());
            },
            attempt: 1,
            late: declined(),
            verdict: "settled",
            follows: Some("IntentDeclined"),
            status: IntentStatus::Declined,
            money_held: false,
        },
        Late {
            name: "resent, the resend unknown, then the first attempt's decline: it says nothing of the resend",
            start: attempting,
            history: resent_and_lost,
            attempt: 1,
            late: declined(),
            verdict: "consistent",
            follows: None,
            status: IntentStatus::OutcomeUnknown,
            money_held: true,
        },
        Late {
            name: "resent, escalated never proven, then the first attempt's decline: it says nothing of the resend",
            start: attempting_reconciled_twice_at_most,
            history: |log| {
                resent_and_lost(log);
                look_up(log, unavailable());
            },
            attempt: 1,
            late: declined(),
            verdict: "consistent",
            follows: None,
            status: IntentStatus::Escalated,
            money_held: true,
        },
        Late {
            name: "validated by the provider, then a decline of the same attempt",
            start: attempting,
            history: |log| {
                outcome(log, 1, succeeded("ch_1")).expect("validated");
            },
            attempt: 1,
            late: declined(),
            verdict: "contradicted",
            follows: Some("IntentEscalated"),
            status: IntentStatus::Escalated,
            money_held: true,
        },
        Late {
            name: "validated by a resend, then the first attempt's decline",
            start: attempting,
            history: |log| {
                recover(log);
                look_up(log, LookupOutcome::Absent);
                resend(log, succeeded("ch_2"));
            },
            attempt: 1,
            late: declined(),
            verdict: "consistent",
            follows: None,
            status: IntentStatus::Validated,
            money_held: true,
        },
    ];
    for case in cases {
        let log = (case.start)();
        (case.history)(&log);
        let before = log.events().len();
        outcome(&log, case.attempt, case.late.clone())
            .unwrap_or_else(|e| panic!("{}: a late answer is accepted: {e}", case.name));
        let appended: Vec<Event> = log.events()[before..].iter().map(|e| e.event.clone()).collect();
        let verdict = match appended.first() {
            Some(Event::LateAnswerRecorded { verdict: LateVerdict::Settled, .. }) => "settled",
            Some(Event::LateAnswerRecorded { verdict: LateVerdict::Consistent, .. }) => "consistent",
            Some(Event::LateAnswerRecorded { verdict: LateVerdict::Contradicted { .. }, .. }) => "contradicted",
            other => panic!("{}: the answer is recorded first, got {other:?}", case.name),
        };
        assert_eq!(verdict, case.verdict, "{}: {appended:#?}", case.name);
        assert_eq!(appended.get(1).map(Event::type_name), case.follows, "{}: {appended:#?}", case.name);
        assert_eq!(appended.len(), 1 + usize::from(case.follows.is_some()), "{}", case.name);
        let intent = log.ledger().intent(&key()).cloned().expect("the intent");
        assert_eq!(intent.status, case.status, "{}", case.name);
        assert_eq!(intent.money_committed(), case.money_held, "{}: money", case.name);
    }
}

/// Appends `action` at the clock's time; returns the events it appended, or its refusal
/// (which must append nothing).
pub(super) fn decided(log: &MemoryLog, command: Command) -> Result<Vec<Event>, Refusal> {
    let before = log.events().len();
    match log.execute_now(&command) {
        Ok(_) => Ok(log.events()[before..].iter().map(|e| e.event.clone()).collect()),
        Err(LogError::Refused(refusal)) => {
            assert_eq!(log.events().len(), before, "a refusal writes nothing: {refusal}");
            Err(refusal)
        }
        Err(other) => panic!("the in-memory log refuses or appends, got {other}"),
    }
}

/// The name of a refusal's variant (`WrongStatus`, `UnknownRun`, …): what a table expects.
pub(super) fn variant(refusal: &Refusal) -> String {
    format!("{refusal:?}").chars().take_while(char::is_ascii_alphanumeric).collect()
}

fn start_attempt(run_id: RunId) -> Command {
    Command::new(Cause::command("test"), Action::StartAttempt { key: key(), run_id })
}

pub(super) fn types(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::type_name).collect()
}

#[test]
fn after_an_unknown_outcome_only_a_provider_without_lookup_is_resent_by_key_and_only_when_due() {
    let lookup_only = Capability { dedup_by_key: false, ..stripe() };
    let dedup_only = Capability { lookup: false, ..stripe() };
    for (tier, capability) in [("dedup+lookup", stripe()), ("lookup", lookup_only), ("dedup", dedup_only)] {
        let (log, clock) = Fixture { capability, ..Fixture::default() }.reserve();
        outcome(&log, 1, timeout()).expect("unknown");
        let due = log.ledger().intent(&key()).and_then(|i| i.reconcile_after).expect("a reconciliation is due");
        assert_eq!(due, plus(limits::reconcile_backoff_ms(1)), "{tier}");
        let early = decided(&log, start_attempt(run()));
        assert!(
            matches!(early, Err(Refusal::WrongStatus { step: Step::Attempt, .. })),
            "{tier}: not before it is due: {early:?}"
        );
        clock.advance_ms(10_000);
        let late = decided(&log, start_attempt(run()));
        if tier == "dedup" {
            let events = late.unwrap_or_else(|r| panic!("{tier}: the key alone allows a resend once due: {r}"));
            assert!(matches!(events.as_slice(), [Event::AttemptStarted { attempt: 2, .. }]), "{tier}: {events:#?}");
        } else {
            assert!(
                matches!(late, Err(Refusal::WrongStatus { step: Step::Attempt, .. })),
                "{tier}: reconcile before acting again: {late:?}"
            );
        }
    }
}

#[test]
fn a_start_attempt_may_start_its_run_in_the_same_command_and_only_that_run() {
    let reserved = || Fixture { start_attempt: false, ..Fixture::default() }.reserve().0;
    let log = reserved();
    let other = RunId::new("run-2");
    let starting = start_attempt(other.clone()).starting(Some(run_start(other.clone(), plus(3_600_000))));
    let events = decided(&log, starting).expect("an attempt by the run this command starts");
    assert_eq!(types(&events), ["RunStarted", "AttemptStarted"]);
    assert!(matches!(&events[1], Event::AttemptStarted { attempt: 1, run_id, .. } if run_id == &other));

    // That run's deadline is the one checked: too short, and the intent is released.
    let log = reserved();
    let hurried = start_attempt(other.clone()).starting(Some(run_start(other.clone(), plus(999))));
    let events = decided(&log, hurried).expect("decided");
    assert_eq!(types(&events), ["RunStarted", "IntentReleased"]);

    // A command that starts one run cannot attempt for another that does not exist.
    let log = reserved();
    let stranger = RunId::new("run-3");
    let mismatched = start_attempt(stranger.clone()).starting(Some(run_start(other, plus(3_600_000))));
    let refused = decided(&log, mismatched);
    assert!(matches!(&refused, Err(Refusal::UnknownRun(id)) if id == &stranger), "{refused:?}");
}

#[test]
fn an_effect_starts_with_exactly_the_reconciliation_reserve_left_and_not_a_millisecond_less() {
    let deadline = 3_600_000;
    for capability in [stripe(), Capability { request_timeout_ms: 5_000, ..stripe() }] {
        // The reserve is the provider's request timeout plus the first reconciliation's backoff.
        let reserve = limits::reconciliation_reserve_ms(capability.request_timeout_ms, 1);
        assert_eq!(reserve, capability.request_timeout_ms + limits::RECONCILE_BACKOFF_BASE_MS);
        for (left_ms, starts) in [(reserve, true), (reserve - 1, false)] {
            let fixture = || Fixture { capability, ..Fixture::default() };
            // By `StartAttempt`, for an intent reserved earlier: too late, it is released.
            let (log, clock) = Fixture { start_attempt: false, ..fixture() }.reserve();
            clock.advance_ms(i64::try_from(deadline - left_ms).expect("small"));
            let events = decided(&log, start_attempt(run())).expect("decided");
            let expected: &[&str] = if starts { &["AttemptStarted"] } else { &["IntentReleased"] };
            assert_eq!(types(&events), expected, "{left_ms} ms left");
            // With the reservation, in the command that starts the run: not written ahead.
            let clock = Arc::new(ManualClock::new(t0()));
            let log = MemoryLog::new(clock.clone());
            clock.advance_ms(i64::try_from(deadline - left_ms).expect("small"));
            let events = decided(&log, fixture().reservation()).expect("reserved");
            assert_eq!(types(&events).contains(&"AttemptStarted"), starts, "{left_ms} ms left: {events:#?}");
        }
    }
}

#[test]
fn an_approval_releases_an_attempt_strictly_before_it_expires() {
    for (after_ms, valid) in [(999, true), (1_000, false)] {
        let (log, clock) = Fixture { approval_required: true, ..Fixture::default() }.reserve();
        let approve = Action::Approve { key: key(), by: "ana".into(), ttl_ms: 1_000, fingerprint: None };
        act(&log, approve).expect("approved");
        clock.advance_ms(after_ms);
        let events = decided(&log, start_attempt(run())).expect("decided");
        let expected: &[&str] = if valid { &["AttemptStarted"] } else { &["ApprovalExpired"] };
        assert_eq!(types(&events), expected, "{after_ms} ms after an approval valid 1 000 ms");
    }
}

#[test]
fn a_lookup_that_settles_nothing_is_retried_after_a_backoff_that_doubles() {
    let log = attempting();
    recover(&log);
    let after = |log: &MemoryLog| log.ledger().intent(&key()).and_then(|i| i.reconcile_after);
    assert_eq!(after(&log), Some(t0()), "a crashed attempt is looked up at once");
    look_up(&log, unavailable());
    assert_eq!(after(&log), Some(plus(limits::reconcile_backoff_ms(2))), "the second lookup waits 2 s");
    look_up(&log, unavailable());
    assert_eq!(after(&log), Some(plus(limits::reconcile_backoff_ms(3))), "the third 4 s");
    assert_eq!(limits::reconcile_backoff_ms(3), 4 * limits::reconcile_backoff_ms(1));

    // An absence seen before the request is certainly over (here: inside the consistency
    // window): looked at again the moment the absence can be proof, the window's end.
    for (window_ms, due_ms) in [(500, 500), (5_000, 5_000)] {
        let capability = Capability { consistency_window_ms: window_ms, ..stripe() };
        let (log, _) = Fixture { capability, ..Fixture::default() }.reserve();
        recover(&log);
        look_up(&log, LookupOutcome::Absent);
        assert_eq!(after(&log), Some(plus(due_ms)), "a window of {window_ms} ms");
    }
}

#[test]
fn evidence_for_another_amount_or_currency_is_not_this_intents_effect() {
    let others =
        [Evidence { amount_minor: 4_901, ..evidence("ch_1") }, Evidence { currency: "USD".into(), ..evidence("ch_1") }];
    for other in others {
        // A direct answer: the outcome is unknown (a protocol error), never validated.
        let log = attempting();
        outcome(&log, 1, CallOutcome::Succeeded(other.clone())).expect("recorded");
        let intent = log.ledger().intent(&key()).cloned().expect("the intent");
        assert_eq!(intent.status, IntentStatus::OutcomeUnknown, "{other:?}");
        assert!(intent.evidence.is_none(), "{other:?}");
        let last = log.events().last().map(|e| e.event.clone());
        assert!(matches!(last, Some(Event::OutcomeUnknown { reason: UnknownReason::Protocol, .. })), "{last:?}");
        // A lookup: inconsistent, retried later, never validated.
        let log = attempting();
        recover(&log);
        look_up(&log, LookupOutcome::Found(other.clone()));
        let resolved = log.events().iter().rev().find_map(|e| match &e.event {
            Event::ReconciliationResolved { status, after, .. } => Some((*status, after.clone())),
            _ => None,
        });
        assert!(
            matches!(resolved, Some((LookupStatus::Inconsistent, AfterLookup::RetryAt { .. }))),
            "{other:?}: {resolved:?}"
        );
        assert_eq!(log.ledger().intent(&key()).map(|i| i.status), Some(IntentStatus::OutcomeUnknown), "{other:?}");
    }
    // The control: the same evidence for the intent's own amount and currency validates.
    let log = attempting();
    outcome(&log, 1, succeeded("ch_1")).expect("recorded");
    assert_eq!(log.ledger().intent(&key()).map(|i| i.status), Some(IntentStatus::Validated));
}

/// An operator's `keel run cancel`: recorded once, then every write that moves the run on is
/// refused (its end and the answers for what it has in flight are not), and a finished run
/// refuses the request.
#[test]
fn a_cancelled_run_takes_nothing_but_its_end_and_the_answers_it_awaits() {
    let log = attempting();
    let cancel = |by: &str| {
        Command::new(Cause::operator(by), Action::CancelRun { run_id: run(), by: by.into(), reason: "runaway".into() })
    };
    let recorded = decided(&log, cancel("ana")).expect("recorded");
    assert_eq!(types(&recorded), ["RunCancelRequested"]);
    assert_eq!(decided(&log, cancel("bob")).expect("accepted"), Vec::<Event>::new(), "asked once");
    let request = log.ledger().run(&run()).and_then(|r| r.cancel_requested.clone()).expect("on the run");
    assert_eq!((request.by.as_str(), request.at), ("ana", t0()));

    // The answer of the attempt in flight is evidence whoever brings it.
    outcome(&log, 1, timeout()).expect("recorded");
    let refused = decided(&log, start_attempt(run()));
    assert!(matches!(refused, Err(Refusal::RunCancelled { ref by, .. }) if by == "ana"), "{refused:?}");
    let step = Action::RecordStep { run_id: run(), position: 1, name: "s".into(), output: serde_json::json!(1) };
    assert!(matches!(decided(&log, Command::new(Cause::command("test"), step)), Err(Refusal::RunCancelled { .. })));
    // Reconciling what it left unknown still goes on.
    assert!(
        decided(
            &log,
            Command::new(
                Cause::command("test"),
                Action::StartReconciliation { key: key(), force: true, run_id: run() }
            )
        )
        .is_ok()
    );

    let finish = Action::FinishRun { run_id: run(), status: RunStatus::Cancelled, detail: Some(request.detail()) };
    assert_eq!(types(&decided(&log, Command::new(Cause::command("test"), finish)).expect("ends")), ["RunFinished"]);
    let late = decided(&log, cancel("ana"));
    assert!(matches!(late, Err(Refusal::RunAlreadyFinished { status: RunStatus::Cancelled, .. })), "{late:?}");
}
