//! Operators' decisions on an intent: approving (bound to its fingerprint, within its
//! approval window), checking an approval for lapse, denying, cancelling, and resolving by
//! hand — checked against what the provider's lookup says.

use super::Decider;
use super::reconcile::{evidence_mismatch, is_provider_ref};
use crate::event::{Event, IntentKey, ResolutionCheck};
use crate::ledger::protocol::{Refusal, ReplyTarget, Step};
use crate::ledger::state::{Intent, IntentStatus};
use crate::provider::LookupOutcome;
use chrono::{DateTime, Utc};

impl Decider<'_> {
    pub(super) fn approve(
        &mut self,
        key: &IntentKey,
        by: &str,
        ttl_ms: u64,
        fingerprint: Option<&str>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if intent.status != IntentStatus::AwaitingApproval {
            return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Approve });
        }
        if let Some(closes_at) = intent.approval_closes_at
            && self.now >= closes_at
        {
            return Err(Refusal::ApprovalWindowClosed { key: key.clone(), closes_at });
        }
        if let Some(seen) = fingerprint
            && seen != intent.definition.fingerprint
        {
            return Err(Refusal::FingerprintMismatch {
                seen: seen.to_owned(),
                expected: intent.definition.fingerprint.clone(),
            });
        }
        let expires_at = crate::clock::checked_plus_ms(self.now, ttl_ms)
            .ok_or(Refusal::DurationOutOfRange { what: "an approval valid", ms: ttl_ms })?;
        self.push(Event::ApprovalGranted {
            key: key.clone(),
            fingerprint: intent.definition.fingerprint.clone(),
            by: by.to_owned(),
            expires_at,
        });
        Ok(self.answer(key, false))
    }

    /// An approval that lapsed before anything was sent is recorded expired, so the intent
    /// awaits a fresh one instead of waiting on a dead one.
    pub(super) fn check_approval(&mut self, key: &IntentKey) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let lapsed = intent.status == IntentStatus::Reserved
            && intent.approval_required
            && intent.attempts == 0
            && intent.approval.as_ref().is_some_and(|approval| approval.expires_at <= self.now);
        if lapsed {
            self.push(Event::ApprovalExpired { key: key.clone() });
        }
        Ok(self.answer(key, false))
    }

    pub(super) fn deny(&mut self, key: &IntentKey, by: &str, reason: &str) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if intent.status != IntentStatus::AwaitingApproval {
            return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Deny });
        }
        self.push(Event::ApprovalDenied { key: key.clone(), by: by.to_owned(), reason: reason.to_owned() });
        Ok(self.answer(key, false))
    }

    pub(super) fn cancel(&mut self, key: &IntentKey, by: &str, reason: &str) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if !matches!(intent.status, IntentStatus::Reserved | IntentStatus::AwaitingApproval) {
            return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Cancel });
        }
        self.push(Event::IntentCancelled { key: key.clone(), by: by.to_owned(), reason: reason.to_owned() });
        Ok(self.answer(key, false))
    }

    pub(super) fn resolve(
        &mut self,
        key: &IntentKey,
        by: &str,
        reason: &str,
        landed: Option<&str>,
        lookup: Option<&LookupOutcome>,
        override_reason: Option<&str>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let check = decide_resolution(&intent, landed, lookup, override_reason, self.now)?;
        self.push(Event::IntentResolved {
            key: key.clone(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            landed: landed.map(str::to_owned),
            check,
        });
        Ok(self.answer(key, false))
    }
}

/// What an operator's resolution is, checked against what the provider's lookup said. A
/// contradiction, or a lookup that could not answer, is refused unless overridden with a
/// reason.
fn decide_resolution(
    intent: &Intent,
    landed: Option<&str>,
    lookup: Option<&LookupOutcome>,
    override_reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<ResolutionCheck, Refusal> {
    let key = intent.key();
    if !matches!(intent.status, IntentStatus::OutcomeUnknown | IntentStatus::Escalated) {
        return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Resolve });
    }
    if landed.is_some_and(|r| !is_provider_ref(r)) {
        return Err(Refusal::ResolutionInput("--landed needs the provider's reference as evidence"));
    }
    if let Some(reason) = override_reason
        && reason.trim().is_empty()
    {
        return Err(Refusal::ResolutionInput("--override needs the reason the provider's answer is wrong"));
    }
    let says = match (lookup, landed) {
        (None, _) if intent.capability.lookup => return Err(Refusal::ResolutionUnchecked(key.clone())),
        (None, _) => {
            let detail = format!("the provider (tier {}) offers no lookup", intent.capability.tier());
            return Ok(ResolutionCheck::Unverified { detail });
        }
        // A provider that can look up but did not answer is not a provider that agrees: an
        // unreachable --provider must not be a way around the check.
        (Some(LookupOutcome::Unavailable { detail }), _) => format!("nothing: its lookup is unavailable ({detail})"),
        (Some(LookupOutcome::Found(evidence)), Some(landed))
            if evidence.provider_ref == landed && evidence_mismatch(intent, evidence).is_none() =>
        {
            return Ok(ResolutionCheck::Confirmed);
        }
        (Some(LookupOutcome::Found(evidence)), _) => format!(
            "it holds {} for {} {} under this key",
            evidence.provider_ref, evidence.amount_minor, evidence.currency
        ),
        (Some(LookupOutcome::Absent), None) if intent.resend_window_end().is_none_or(|end| now >= end) => {
            return Ok(ResolutionCheck::Confirmed);
        }
        (Some(LookupOutcome::Absent), None) => {
            let detail = "absent, but the request may not be over yet: a lookup may still miss it".to_owned();
            return Ok(ResolutionCheck::Unverified { detail });
        }
        (Some(LookupOutcome::Absent), Some(_)) => "it has no effect under this key".to_owned(),
    };
    match override_reason {
        Some(reason) => Ok(ResolutionCheck::Overridden { provider_says: says, reason: reason.to_owned() }),
        None => Err(Refusal::ResolutionContradicted { key: key.clone(), provider_says: says }),
    }
}
