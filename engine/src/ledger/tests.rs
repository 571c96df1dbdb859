//! The ledger at its boundary: given a history (commands already decided), one more command
//! and the time, the events it appends — or its refusal — as data.

use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, Event, IntentDefinition, IntentKey, LateVerdict, RunId, RunLimits};
use crate::lease::LeaseOwner;
use crate::lease::{LeaseGrant, LeaseUse};
use crate::log::LogError;
use crate::memory::MemoryLog;
use crate::provider::{CallOutcome, EffectKind, LookupOutcome, UnknownReason};
use crate::provider::{Capability, Evidence};
use chrono::TimeZone;
use chrono::Utc;
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

/// A log with one charge of 49.00 EUR reserved and its first attempt in flight.
fn attempting() -> MemoryLog {
    let log = MemoryLog::new(Arc::new(ManualClock::new(nine_am())));
    log.execute_now(&reserve(tier(true, true), RunLimits::default(), true)).expect("reserved");
    log
}

/// A provider that deduplicates by key and/or looks effects up, answering at once (no
/// request timeout, no consistency window), keys valid a day.
pub(super) fn tier(dedup_by_key: bool, lookup: bool) -> Capability {
    Capability { dedup_by_key, lookup, key_window_ms: 86_400_000, consistency_window_ms: 0, request_timeout_ms: 0 }
}

/// 2026-12-01 09:00 UTC, when every boundary history starts.
pub(super) fn nine_am() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("a valid instant")
}

/// The command that reserves the charge of 49.00 EUR for `run()` (deadline 10:00), starting
/// the run with it, the first attempt written ahead when `start_attempt`.
pub(super) fn reserve(capability: Capability, limits: RunLimits, start_attempt: bool) -> Command {
    let payload = serde_json::json!({"order_id": "order_1", "amount_minor": 4_900, "currency": "EUR"});
    let spec = IntentSpec {
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
        },
        capability,
        approval_required: false,
    };
    let start = RunStart {
        run_id: run(),
        workflow: "charge".into(),
        input: serde_json::json!({}),
        deadline_at: Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).single().expect("a valid instant"),
        limits,
        owner: None,
    };
    let reserve = Action::Reserve { run_id: run(), position: 0, spec, start_attempt };
    Command::new(Cause::command("test").for_run(&run()), reserve).starting(Some(start))
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

/// What the recovering process does next for the run it claimed: one lookup.
fn look_up(log: &MemoryLog, found: LookupOutcome) {
    let hold = LeaseUse::Hold(LeaseGrant { run_id: run(), token: 1 });
    let start = Action::StartReconciliation { key: key(), force: true, run_id: run() };
    log.execute_now(&Command::new(Cause::command("test"), start).under(hold)).expect("started");
    act(log, Action::RecordLookup { key: key(), reconciliation: 1, outcome: found }).expect("recorded");
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
