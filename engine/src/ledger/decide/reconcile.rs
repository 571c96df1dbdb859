//! Reconciliation: looking an effect up by its key after an unknown outcome, and what the
//! answer proves — with the rules that keep an "absent" from being believed too early and
//! a provider's answer from being taken for evidence it is not.

use super::Decider;
use crate::event::{AfterLookup, Event, IntentKey, LookupStatus, ReleaseReason, RunId, Source};
use crate::ledger::protocol::{Refusal, ReplyTarget, Step};
use crate::ledger::state::{Intent, IntentStatus};
use crate::limits;
use crate::provider::{Evidence, LookupOutcome};
use chrono::{DateTime, Utc};

impl Decider<'_> {
    pub(super) fn start_reconciliation(
        &mut self,
        key: &IntentKey,
        force: bool,
        run_id: &RunId,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let escalated_unproven = intent.status == IntentStatus::Escalated && !intent.absence_proven;
        if intent.status != IntentStatus::OutcomeUnknown && !(force && escalated_unproven) {
            return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Reconcile });
        }
        if !intent.capability.lookup {
            return Err(Refusal::NoLookup { key: key.clone(), tier: intent.capability.tier() });
        }
        if !force && !intent.reconcile_due(self.now) {
            return Err(Refusal::NotDue { key: key.clone(), due: intent.reconcile_after });
        }
        if intent.status == IntentStatus::OutcomeUnknown && intent.reconciliations >= intent.reconciliations_max {
            self.push(Event::IntentEscalated {
                key: key.clone(),
                reason: format!("all {} reconciliations spent", intent.reconciliations_max),
                absence_proven: false,
            });
            return Ok(self.answer(key, false));
        }
        // The run's own budget of automatic reconciliations, across its intents. An operator's
        // forced lookup is not automatic: it is never refused for it.
        if !force
            && intent.status == IntentStatus::OutcomeUnknown
            && let Some(max) = self.view.run(&intent.run_id).and_then(|run| run.limits.reconciliations_max)
        {
            let spent =
                self.view.run_intents(&intent.run_id).iter().fold(0u32, |sum, i| sum.saturating_add(i.reconciliations));
            if spent >= max {
                self.push(Event::IntentEscalated {
                    key: key.clone(),
                    reason: format!(
                        "the reconciliation budget of run {} is spent ({spent} of reconciliations_max = {max})",
                        intent.run_id
                    ),
                    absence_proven: false,
                });
                return Ok(self.answer(key, false));
            }
        }
        self.push(Event::ReconciliationStarted {
            key: key.clone(),
            reconciliation: intent.reconciliations + 1,
            run_id: Some(run_id.clone()),
        });
        Ok(self.answer(key, false))
    }

    pub(super) fn record_lookup(
        &mut self,
        key: &IntentKey,
        reconciliation: u32,
        outcome: &LookupOutcome,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if intent.status != IntentStatus::Reconciling || reconciliation != intent.reconciliations {
            return Err(Refusal::NoSuchLookup {
                key: key.clone(),
                status: intent.status,
                reconciliation,
                current: intent.reconciliations,
            });
        }
        let (status, evidence, detail) = match outcome {
            LookupOutcome::Found(evidence) => match evidence_mismatch(&intent, evidence) {
                None => (LookupStatus::Found, Some(evidence.clone()), String::new()),
                Some(why) => (LookupStatus::Inconsistent, Some(evidence.clone()), why),
            },
            LookupOutcome::Absent => (LookupStatus::Absent, None, String::new()),
            LookupOutcome::Unavailable { detail } => (LookupStatus::Unavailable, None, detail.clone()),
        };
        self.resolve_lookup(&intent, reconciliation, status, evidence, detail);
        Ok(self.answer(key, false))
    }

    /// What a lookup's answer means: validated, a resend allowed (absence proven past the
    /// request's end and the consistency window), a later look, or an escalation — recorded
    /// with the answer, so replay never re-decides with a new clock.
    pub(super) fn resolve_lookup(
        &mut self,
        intent: &Intent,
        reconciliation: u32,
        status: LookupStatus,
        evidence: Option<Evidence>,
        detail: String,
    ) {
        let key = intent.key().clone();
        let (after, escalation) = after_lookup(intent, reconciliation, status, &detail, self.now);
        self.push(Event::ReconciliationResolved {
            key: key.clone(),
            reconciliation,
            status,
            evidence: evidence.clone(),
            detail,
            after: after.clone(),
        });
        let run_ended = self.view.run(&intent.run_id).is_some_and(|run| run.is_agent() && run.status.is_some());
        if after == AfterLookup::ResendAllowed && run_ended {
            // Its agent run is over: nobody will send it again, so its money is freed now.
            self.push(Event::IntentReleased { key: key.clone(), reason: ReleaseReason::AbsentAfterRunEnded });
        }
        if after == AfterLookup::Validated
            && let Some(evidence) = evidence
        {
            self.push(Event::IntentValidated {
                key: key.clone(),
                attempt: intent.attempts,
                source: Source::Reconciled,
                evidence,
            });
        }
        if let Some((reason, absence_proven)) = escalation {
            self.push(Event::IntentEscalated { key, reason, absence_proven });
        }
    }
}

/// What a lookup's answer means for `intent` at `now`: the state after it, and the
/// escalation (its reason, and whether the effect's absence is proven) when a human must
/// take over.
fn after_lookup(
    intent: &Intent,
    reconciliation: u32,
    status: LookupStatus,
    detail: &str,
    now: DateTime<Utc>,
) -> (AfterLookup, Option<(String, bool)>) {
    let spent = reconciliation >= intent.reconciliations_max;
    let retry_or_escalate = |reason: String| {
        if spent {
            (AfterLookup::Escalated, Some((reason, false)))
        } else {
            (AfterLookup::RetryAt { reconcile_after: after_backoff_from(now, reconciliation + 1) }, None)
        }
    };
    match status {
        LookupStatus::Found => (AfterLookup::Validated, None),
        LookupStatus::Absent => {
            let window_end = intent.resend_window_end().unwrap_or(now);
            if now < window_end {
                if spent {
                    (
                        AfterLookup::Escalated,
                        Some(("absent, but only before the request was certainly over".to_owned(), false)),
                    )
                } else {
                    // Too early to believe: look again the moment the absence can be proof.
                    (AfterLookup::RetryAt { reconcile_after: window_end }, None)
                }
            } else if intent.attempts_spent() >= intent.attempts_max {
                (
                    AfterLookup::Escalated,
                    Some((format!("proven absent, all {} attempts spent", intent.attempts_max), true)),
                )
            } else if intent.capability.dedup_by_key && !intent.within_key_window(now) {
                (
                    AfterLookup::Escalated,
                    Some(("proven absent, but the idempotency-key window has passed".to_owned(), true)),
                )
            } else {
                (AfterLookup::ResendAllowed, None)
            }
        }
        LookupStatus::Unavailable => {
            retry_or_escalate(format!("lookup unavailable after {reconciliation} reconciliations"))
        }
        LookupStatus::Inconsistent => {
            retry_or_escalate(format!("lookup inconsistent after {reconciliation} reconciliations: {detail}"))
        }
        LookupStatus::Interrupted => {
            retry_or_escalate(format!("lookup interrupted after {reconciliation} reconciliations"))
        }
    }
}

/// When reconciliation number `n` is due after `now`.
fn after_backoff_from(now: DateTime<Utc>, n: u32) -> DateTime<Utc> {
    crate::clock::checked_plus_ms(now, limits::reconcile_backoff_ms(n))
        .expect("a clock's now plus a backoff bounded by limits.rs is a representable instant")
}

/// A provider reference an operator or a provider may give as evidence: not blank, no
/// control or invisible characters, visible ASCII (what providers' ids are made of).
pub(super) fn is_provider_ref(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic())
}

/// Why `evidence` does not prove `intent`'s effect: no effect named, or another amount or
/// currency than the intent's.
pub(super) fn evidence_mismatch(intent: &Intent, evidence: &Evidence) -> Option<String> {
    if !is_provider_ref(&evidence.provider_ref) {
        return Some(format!("the provider's answer names no effect (id {:?})", evidence.provider_ref));
    }
    let definition = &intent.definition;
    (evidence.amount_minor != definition.amount_minor || evidence.currency != definition.currency).then(|| {
        format!(
            "provider reports {} {} for {}, the intent is {} {}",
            evidence.amount_minor,
            evidence.currency,
            evidence.provider_ref,
            definition.amount_minor,
            definition.currency
        )
    })
}
