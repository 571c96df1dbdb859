//! Attempts: starting one (write-ahead, every bound checked first) and recording its
//! outcome — the definitive one, the unknown one, and the answer that arrives after its
//! attempt stopped being awaited, which is evidence all the same.

use super::Decider;
use crate::clock::ms_between;
use crate::event::{Event, IntentKey, LateAnswer, LateVerdict, ReleaseReason, RunId, Source};
use crate::ledger::protocol::{Refusal, ReplyTarget, RunStart, Step};
use crate::ledger::state::{Intent, IntentStatus};
use crate::limits;
use crate::provider::{CallOutcome, Evidence, UnknownReason};

impl Decider<'_> {
    pub(super) fn start_attempt(
        &mut self,
        key: &IntentKey,
        run_id: &RunId,
        start: Option<&RunStart>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        self.refuse_cancelled(run_id)?;
        let deadline_at = match (self.view.run(run_id), start) {
            (Some(run), _) => run.deadline_at,
            (None, Some(start)) if &start.run_id == run_id => start.deadline_at,
            (None, _) => return Err(Refusal::UnknownRun(run_id.clone())),
        };
        let resend_by_key = intent.status == IntentStatus::OutcomeUnknown
            && !intent.capability.lookup
            && intent.capability.dedup_by_key
            && intent.reconcile_due(self.now);
        if intent.status != IntentStatus::Reserved && !resend_by_key {
            return Err(Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Attempt });
        }
        if intent.approval_required {
            match &intent.approval {
                Some(approval)
                    if approval.fingerprint == intent.definition.fingerprint && approval.expires_at > self.now => {}
                Some(approval) if approval.expires_at <= self.now => {
                    self.push(Event::ApprovalExpired { key: key.clone() });
                    return Ok(self.answer(key, false));
                }
                _ => return Err(Refusal::NoValidApproval(key.clone())),
            }
        }
        if intent.attempts_spent() >= intent.attempts_max {
            self.push(Event::IntentEscalated {
                key: key.clone(),
                reason: format!("all {} attempts spent", intent.attempts_max),
                absence_proven: intent.absence_proven,
            });
            return Ok(self.answer(key, false));
        }
        if intent.network_retry_by(run_id) {
            let run = self.view.run(run_id);
            let spent = run.as_ref().map_or(0, |run| run.network_retries);
            let max = run
                .and_then(|run| run.limits.network_retries_max)
                .or_else(|| start.and_then(|start| start.limits.network_retries_max))
                .unwrap_or(limits::NETWORK_RETRIES_PER_RUN_MAX);
            if spent >= max {
                return Err(Refusal::NetworkRetriesSpent { run_id: run_id.clone(), spent });
            }
        }
        if intent.capability.dedup_by_key && !intent.within_key_window(self.now) {
            self.push(Event::IntentEscalated {
                key: key.clone(),
                reason: "the provider's idempotency-key window has passed: a resend would not be deduplicated"
                    .to_owned(),
                absence_proven: intent.absence_proven,
            });
            return Ok(self.answer(key, false));
        }
        let left_ms = ms_between(self.now, deadline_at);
        let needed_ms =
            limits::reconciliation_reserve_ms(intent.capability.request_timeout_ms, intent.reconciliations + 1);
        if left_ms < needed_ms {
            // Never sent (or proven absent): nothing will send it for this run, and leaving it
            // reserved would hold its money and block its order. An unknown outcome resent by
            // key may have an effect: it stays held, and reconciliation goes on.
            if intent.status == IntentStatus::Reserved {
                let reason = ReleaseReason::DeadlineReserve { left_ms, needed_ms };
                self.push(Event::IntentReleased { key: key.clone(), reason });
                return Ok(self.answer(key, false));
            }
            return Err(Refusal::DeadlineReserve { run_id: run_id.clone(), left_ms, needed_ms });
        }
        self.push(Event::AttemptStarted { key: key.clone(), attempt: intent.attempts + 1, run_id: run_id.clone() });
        Ok(self.answer(key, false))
    }

    pub(super) fn record_outcome(
        &mut self,
        key: &IntentKey,
        attempt: u32,
        outcome: &CallOutcome,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if attempt == 0 || attempt > intent.attempts {
            return Err(Refusal::NoSuchAttempt { key: key.clone(), attempt, latest: intent.attempts });
        }
        if intent.status != IntentStatus::Attempting || attempt != intent.attempts {
            // The attempt stopped being awaited (recovery declared it crashed, its lease was
            // taken, a later attempt went out): a definitive answer is still evidence.
            self.late_answer(&intent, attempt, outcome);
            return Ok(self.answer(key, false));
        }
        match outcome {
            CallOutcome::Succeeded(evidence) => match super::reconcile::evidence_mismatch(&intent, evidence) {
                None => self.push(Event::IntentValidated {
                    key: key.clone(),
                    attempt,
                    source: Source::Provider,
                    evidence: evidence.clone(),
                }),
                Some(why) => self.unknown(&intent, attempt, UnknownReason::Protocol, why),
            },
            CallOutcome::Declined { code } => {
                self.push(Event::IntentDeclined { key: key.clone(), attempt, code: code.clone() })
            }
            CallOutcome::NotSent { detail } => {
                self.push(Event::AttemptNotSent { key: key.clone(), attempt, detail: detail.clone() })
            }
            CallOutcome::Unknown { reason, detail } => self.unknown(&intent, attempt, *reason, detail.clone()),
        }
        Ok(self.answer(key, false))
    }

    /// A definitive answer for an attempt no longer awaited: recorded, then it settles an
    /// intent that is still open, agrees with one that is settled the same way, or
    /// contradicts it (the intent escalates: a human must look). An answer that is not
    /// definitive (unknown, not sent) adds nothing.
    fn late_answer(&mut self, intent: &Intent, attempt: u32, outcome: &CallOutcome) {
        let (answer, verdict, follow) = match outcome {
            CallOutcome::Unknown { .. } | CallOutcome::NotSent { .. } => return,
            CallOutcome::Succeeded(evidence) => {
                let (verdict, follow) = late_success(intent, attempt, evidence);
                (LateAnswer::Succeeded { evidence: evidence.clone() }, verdict, follow)
            }
            CallOutcome::Declined { code } => {
                let (verdict, follow) = late_decline(intent, attempt, code);
                (LateAnswer::Declined { code: code.clone() }, verdict, follow)
            }
        };
        self.push(Event::LateAnswerRecorded { key: intent.key().clone(), attempt, answer, verdict });
        if let Some(follow) = follow {
            self.push(follow);
        }
    }

    /// Records an unknown outcome, and escalates at once when the tier allows no
    /// reconciliation at all.
    fn unknown(&mut self, intent: &Intent, attempt: u32, reason: UnknownReason, detail: String) {
        let key = intent.key().clone();
        let can_reconcile = intent.capability.lookup || intent.capability.dedup_by_key;
        self.push(Event::OutcomeUnknown {
            key: key.clone(),
            attempt,
            reason,
            detail,
            reconcile_after: can_reconcile
                .then(|| self.later(limits::reconcile_backoff_ms(intent.reconciliations + 1))),
        });
        if !can_reconcile {
            self.push(Event::IntentEscalated {
                key,
                reason: "the provider has neither idempotency keys nor a lookup: Keel never resends after an unknown \
                         outcome"
                    .to_owned(),
                absence_proven: false,
            });
        }
    }
}

/// A late answer's verdict, and the event that follows it (a settlement or an escalation).
type Verdict = (LateVerdict, Option<Event>);

/// A contradiction: the intent escalates, a human must look.
fn contradicted(intent: &Intent, detail: String) -> Verdict {
    let escalate = Event::IntentEscalated {
        key: intent.key().clone(),
        reason: format!("a late provider answer contradicts the intent: {detail}"),
        absence_proven: false,
    };
    (LateVerdict::Contradicted { detail }, Some(escalate))
}

/// A late success: it settles an open intent, agrees with the same validation, and
/// contradicts anything else (another effect, a proven absence, a decline).
fn late_success(intent: &Intent, attempt: u32, evidence: &Evidence) -> Verdict {
    use IntentStatus as S;
    if let Some(why) = super::reconcile::evidence_mismatch(intent, evidence) {
        return contradicted(intent, why);
    }
    let reported = &evidence.provider_ref;
    match intent.status {
        S::Validated => match &intent.evidence {
            Some(known) if &known.provider_ref == reported => (LateVerdict::Consistent, None),
            known => contradicted(
                intent,
                format!(
                    "the provider reports {reported} for attempt {attempt}, the intent was validated by {}",
                    known.as_ref().map_or("nothing", |e| e.provider_ref.as_str())
                ),
            ),
        },
        S::Escalated if intent.absence_proven => contradicted(
            intent,
            format!("the provider reports {reported} for attempt {attempt}, the effect was proven absent"),
        ),
        S::Declined | S::Cancelled | S::Rejected => contradicted(
            intent,
            format!("the provider reports {reported} for attempt {attempt}, the intent was {}", intent.status.as_str()),
        ),
        S::Attempting | S::OutcomeUnknown | S::Reconciling | S::Reserved | S::AwaitingApproval | S::Escalated => {
            let settle = Event::IntentValidated {
                key: intent.key().clone(),
                attempt,
                source: Source::Reconciled,
                evidence: evidence.clone(),
            };
            (LateVerdict::Settled, Some(settle))
        }
    }
}

/// A late decline: of the latest attempt, it is the definitive "no effect" an open intent
/// was waiting for, and contradicts a validation; of an earlier one, it says nothing about
/// the later one.
fn late_decline(intent: &Intent, attempt: u32, code: &str) -> Verdict {
    use IntentStatus as S;
    let latest = attempt == intent.attempts;
    let settle = || Some(Event::IntentDeclined { key: intent.key().clone(), attempt, code: code.to_owned() });
    match intent.status {
        S::OutcomeUnknown | S::Reconciling | S::Reserved if latest => (LateVerdict::Settled, settle()),
        S::Escalated if latest && !intent.absence_proven => (LateVerdict::Settled, settle()),
        S::Validated if latest => {
            contradicted(intent, format!("the provider declined attempt {attempt} ({code}), the intent was validated"))
        }
        _ => (LateVerdict::Consistent, None),
    }
}
