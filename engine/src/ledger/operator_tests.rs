//! Operators' decisions at the ledger's boundary: approving (bound to the fingerprint; the
//! approval window, opened by an agent's batch, is `agent_tests`'), an approval's lapse,
//! denying, cancelling, and resolving by hand
//! against what the provider's lookup says. The binary's suites drive the same through
//! `keel approve|deny|cancel|resolve`; these pin each rule where it is decided.

use super::tests::{evidence, key, nine_am, reserve, tier};
use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, Event, ResolutionCheck, RunLimits};
use crate::log::LogError;
use crate::memory::MemoryLog;
use crate::provider::{CallOutcome, Capability, Evidence, LookupOutcome, UnknownReason};
use std::sync::Arc;

/// The fixture's charge (49.00 EUR), waiting for a human: its run approves nothing above 0.
fn awaiting() -> (MemoryLog, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(nine_am()));
    let log = MemoryLog::new(clock.clone());
    let limits = RunLimits { approval_threshold_minor: Some(0), ..RunLimits::default() };
    log.execute_now(&reserve(tier(true, true), limits, true)).expect("reserved");
    (log, clock)
}

/// The fixture's charge sent to a provider of `capability`, its answer lost.
fn unknown(capability: Capability) -> (MemoryLog, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(nine_am()));
    let log = MemoryLog::new(clock.clone());
    log.execute_now(&reserve(capability, RunLimits::default(), true)).expect("reserved");
    let timeout = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() };
    act(&log, Action::RecordOutcome { key: key(), attempt: 1, outcome: timeout }).expect("recorded");
    (log, clock)
}

/// Moves `clock` to `instant` (forward or back).
fn move_to(clock: &ManualClock, instant: chrono::DateTime<chrono::Utc>) {
    let now = crate::clock::Clock::now(clock);
    clock.advance_ms((instant - now).num_milliseconds());
}

fn act(log: &MemoryLog, action: Action) -> Result<Vec<Event>, Refusal> {
    let before = log.events().len();
    match log.execute_now(&Command::new(Cause::operator("ann"), action)) {
        Ok(_) => Ok(log.events()[before..].iter().map(|stored| stored.event.clone()).collect()),
        Err(LogError::Refused(refusal)) => {
            assert_eq!(log.events().len(), before, "a refusal writes nothing");
            Err(refusal)
        }
        Err(other) => panic!("the in-memory log fails only by refusing, got {other}"),
    }
}

fn types(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::type_name).collect()
}

fn approve(fingerprint: Option<String>) -> Action {
    Action::Approve { key: key(), by: "ann".into(), ttl_ms: 60_000, fingerprint }
}

fn fingerprint(log: &MemoryLog) -> String {
    log.ledger().intent(&key()).expect("the intent").definition.fingerprint.clone()
}

#[test]
fn an_approval_binds_the_fingerprint() {
    let (log, _) = awaiting();
    assert!(matches!(act(&log, approve(Some("0".repeat(64)))), Err(Refusal::FingerprintMismatch { .. })));
    let granted = act(&log, approve(Some(fingerprint(&log)))).expect("the fingerprint seen is the intent's");
    assert_eq!(types(&granted), ["ApprovalGranted"]);
    // Approved once: no longer waiting, so neither approved nor denied again.
    assert!(matches!(act(&log, approve(None)), Err(Refusal::WrongStatus { .. })));
    let deny = Action::Deny { key: key(), by: "bob".into(), reason: "no".into() };
    assert!(matches!(act(&log, deny), Err(Refusal::WrongStatus { .. })));
}

#[test]
fn an_approval_lapses_at_its_expiry_and_not_before() {
    let (log, clock) = awaiting();
    act(&log, approve(None)).expect("approved");
    let expires_at = log.ledger().intent(&key()).and_then(|i| i.approval.clone()).expect("approved").expires_at;
    let check = || act(&log, Action::CheckApproval { key: key() }).expect("checked");
    move_to(&clock, expires_at - chrono::Duration::milliseconds(1));
    assert_eq!(types(&check()), Vec::<&str>::new(), "still valid");
    move_to(&clock, expires_at);
    assert_eq!(types(&check()), ["ApprovalExpired"]);
    // A charge that needs no approval has none to lapse.
    let (log, clock) = unknown(tier(true, true));
    move_to(&clock, expires_at);
    assert_eq!(types(&act(&log, Action::CheckApproval { key: key() }).expect("checked")), Vec::<&str>::new());
}

#[test]
fn deny_and_cancel_only_where_they_can_act() {
    let (log, _) = awaiting();
    let deny = Action::Deny { key: key(), by: "bob".into(), reason: "not this one".into() };
    assert_eq!(types(&act(&log, deny).expect("denied")), ["ApprovalDenied"]);
    let (log, _) = awaiting();
    let cancel = || Action::Cancel { key: key(), by: "bob".into(), reason: "duplicate".into() };
    assert_eq!(types(&act(&log, cancel()).expect("cancelled while it waits")), ["IntentCancelled"]);
    let (log, _) = unknown(tier(true, true));
    assert!(matches!(act(&log, cancel()), Err(Refusal::WrongStatus { .. })), "never while its outcome is unknown");
    let deny = Action::Deny { key: key(), by: "bob".into(), reason: "no".into() };
    assert!(matches!(act(&log, deny), Err(Refusal::WrongStatus { .. })), "nothing waits for a human");
}

/// What `keel resolve` comes to: the check recorded, or the refusal.
fn resolve(
    log: &MemoryLog,
    landed: Option<&str>,
    lookup: Option<LookupOutcome>,
    override_reason: Option<&str>,
) -> Result<ResolutionCheck, Refusal> {
    let action = Action::Resolve {
        key: key(),
        by: "ann".into(),
        reason: "checked by phone".into(),
        landed: landed.map(str::to_owned),
        lookup,
        override_reason: override_reason.map(str::to_owned),
    };
    let events = act(log, action)?;
    match events.as_slice() {
        [Event::IntentResolved { check, .. }, ..] => Ok(check.clone()),
        other => panic!("a resolution records IntentResolved first, got {:?}", types(other)),
    }
}

#[test]
fn a_resolution_is_checked_against_the_providers_lookup() {
    let found = |e: Evidence| Some(LookupOutcome::Found(e));
    let fresh = || unknown(tier(true, true)).0;
    assert_eq!(resolve(&fresh(), Some("ch_1"), found(evidence("ch_1")), None), Ok(ResolutionCheck::Confirmed));
    for (landed, lookup, why) in [
        (Some("ch_2"), found(evidence("ch_1")), "another reference"),
        (Some("ch_1"), found(Evidence { amount_minor: 1, ..evidence("ch_1") }), "another amount"),
        (Some("ch_1"), found(Evidence { currency: "USD".into(), ..evidence("ch_1") }), "another currency"),
        (Some("ch_1"), Some(LookupOutcome::Absent), "landed, but the provider holds nothing"),
        (None, found(evidence("ch_1")), "absent, but the provider holds it"),
        (Some("ch_1"), Some(LookupOutcome::Unavailable { detail: "503".into() }), "the lookup did not answer"),
    ] {
        assert!(
            matches!(resolve(&fresh(), landed, lookup.clone(), None), Err(Refusal::ResolutionContradicted { .. })),
            "{why}: refused"
        );
        let overridden = resolve(&fresh(), landed, lookup, Some("the bank's statement says so"));
        assert!(matches!(overridden, Ok(ResolutionCheck::Overridden { .. })), "{why}: recorded when overridden");
    }
    assert!(matches!(resolve(&fresh(), None, None, None), Err(Refusal::ResolutionUnchecked(_))), "not looked up");
    assert!(matches!(resolve(&fresh(), Some("ch 1"), None, None), Err(Refusal::ResolutionInput(_))), "not a ref");
    let blank = resolve(&fresh(), Some("ch_1"), found(evidence("ch_2")), Some("  "));
    assert!(matches!(blank, Err(Refusal::ResolutionInput(_))), "an override needs a reason");
    let no_lookup = unknown(tier(true, false)).0;
    assert!(matches!(resolve(&no_lookup, Some("ch_1"), None, None), Ok(ResolutionCheck::Unverified { .. })));
}

#[test]
fn an_absence_confirms_only_once_a_lookup_can_no_longer_miss_the_effect() {
    let slow = Capability { consistency_window_ms: 60_000, ..tier(true, true) };
    let (log, clock) = unknown(slow);
    let end = log.ledger().intent(&key()).and_then(|i| i.resend_window_end()).expect("sent, so a window");
    move_to(&clock, end - chrono::Duration::milliseconds(1));
    let early = resolve(&log, None, Some(LookupOutcome::Absent), None);
    assert!(matches!(early, Ok(ResolutionCheck::Unverified { .. })), "too early to be proof: {early:?}");
    let (log, clock) = unknown(slow);
    move_to(&clock, end);
    assert_eq!(resolve(&log, None, Some(LookupOutcome::Absent), None), Ok(ResolutionCheck::Confirmed));
    // Only an intent whose outcome is unknown (or escalated) is resolved by hand.
    let (log, _) = awaiting();
    assert!(matches!(resolve(&log, None, Some(LookupOutcome::Absent), None), Err(Refusal::WrongStatus { .. })));
}
