//! Reservation: key + fingerprint + money, checked against the run's budget and the order's
//! cumulative invariants, atomically — and, when the caller can send at once, the first
//! attempt written ahead in the same commit. A run started under another policy than the one
//! in force where the reservation is sent ([`crate::policy::Governing`]) is held to both: the
//! stricter of each limit, the reservation recording the newer policy's stamp.

use super::Decider;
use super::runs::OpenRun;
use crate::clock::ms_between;
use crate::event::{Event, IntentDefinition, IntentKey, RunId, RunLimits};
use crate::ledger::protocol::{IntentSpec, Refusal, RejectCode, ReplyTarget, RunStart};
use crate::ledger::state::{Intent, IntentStatus};
use crate::limits;
use crate::money::{Currency, check_amount, checked_sum};
use crate::policy::{Governing, stricter_threshold};
use crate::provider::EffectKind;
use serde_json::Value;

fn rejected(code: RejectCode, detail: String) -> Refusal {
    Refusal::Rejected { code, detail }
}

impl Decider<'_> {
    pub(super) fn reserve(
        &mut self,
        start: Option<&RunStart>,
        run_id: &RunId,
        position: u32,
        spec: &IntentSpec,
        start_attempt: bool,
    ) -> Result<ReplyTarget, Refusal> {
        let definition = &spec.definition;
        let key = &definition.key;
        let run = self.working_run(run_id, start)?;
        if let Some(existing) = self.view.intent(key) {
            return self.reserve_again(run_id, &run, position, definition, &existing);
        }
        let (run, policy) = self.governed(run);
        self.check_policy(definition, policy.as_ref())?;
        self.check_new_intent(run_id, &run, definition)?;
        self.check_position(run_id, &run, position)?;
        let approval_required = spec.approval_required
            || run.limits.approval_threshold_minor.is_some_and(|threshold| definition.amount_minor > threshold);
        self.push(journal_link(run_id, position, key));
        self.push(Event::IntentReserved {
            intent: definition.clone(),
            run_id: run_id.clone(),
            capability: spec.capability,
            attempts_max: run.limits.attempts_per_intent_max.max(1),
            reconciliations_max: run.limits.reconciliations_per_intent_max,
            approval_required,
            policy: policy.map(|governing| governing.stamp),
            approval_lowered_by: self.governing.filter(|g| g.approval_lowered).map(|g| g.stamp.clone()),
        });
        // The same checks `StartAttempt` makes, for an intent never sent: attempts left (at
        // least one), key window unused, no approval pending, time left to reconcile.
        let time_left = ms_between(self.now, run.deadline_at)
            >= limits::reconciliation_reserve_ms(spec.capability.request_timeout_ms, 1);
        if start_attempt && !approval_required && time_left {
            self.push(Event::AttemptStarted { key: key.clone(), attempt: 1, run_id: run_id.clone() });
        }
        Ok(self.answer(key, true))
    }

    /// The run as a new reservation is held to: under the policy in force where the command
    /// was sent when that is not the one the run started under, its money budget and approval
    /// threshold are the stricter of the run's and that policy's (never the looser), and that
    /// policy is returned, for its maximum and currencies to be checked too and its stamp
    /// recorded. Under the run's own policy (or none), the run as it is.
    fn governed(&self, run: OpenRun) -> (OpenRun, Option<Governing>) {
        let Some(governing) = self.governing.filter(|g| run.limits.policy.as_ref() != Some(&g.stamp)) else {
            return (run, None);
        };
        let rules = &governing.rules;
        let budget = run.limits.cost_minor_max.map_or(rules.run_budget_minor, |own| own.min(rules.run_budget_minor));
        let limits = RunLimits {
            cost_minor_max: Some(budget),
            approval_threshold_minor: stricter_threshold(
                run.limits.approval_threshold_minor,
                rules.approval_threshold_minor,
            ),
            ..run.limits
        };
        (OpenRun { limits, ..run }, Some(governing.clone()))
    }

    /// Refuses (`policy_denied`) an intent outside the maximum or the currencies of the policy
    /// in force, for a run started under another one: the run's own policy was checked when
    /// the run was admitted, so both hold — the stricter wins.
    fn check_policy(&self, definition: &IntentDefinition, policy: Option<&Governing>) -> Result<(), Refusal> {
        let Some(governing) = policy else {
            return Ok(());
        };
        match governing.rules.denies(definition.amount_minor, &definition.currency) {
            None => Ok(()),
            Some(why) => Err(rejected(
                RejectCode::PolicyDenied,
                format!(
                    "{why}, under policy version {} (sha256 {}), installed since the run started",
                    governing.stamp.version, governing.stamp.sha256
                ),
            )),
        }
    }

    /// The same key proposed again: the stored intent when the payload is the same (a
    /// repetition prevented), a mismatch when it is not. A run that already reserved the
    /// intent (an agent call polled while it waits for an approval, or resumed after a
    /// crash) finds it without writing anything: polling never grows the log.
    fn reserve_again(
        &mut self,
        run_id: &RunId,
        run: &OpenRun,
        position: u32,
        definition: &IntentDefinition,
        existing: &Intent,
    ) -> Result<ReplyTarget, Refusal> {
        let key = &definition.key;
        if existing.definition.fingerprint != definition.fingerprint {
            let short = |f: &str| f[..12.min(f.len())].to_owned();
            return Err(rejected(
                RejectCode::IntentPayloadMismatch,
                format!(
                    "intent {key} was reserved with another payload (fingerprint {}…, this one {}…)",
                    short(&existing.definition.fingerprint),
                    short(&definition.fingerprint)
                ),
            ));
        }
        let another_run = &existing.run_id != run_id;
        if another_run {
            self.check_position(run_id, run, position)?;
            self.push(journal_link(run_id, position, key));
        }
        // Proposed again once its effect is proven: a repetition prevented, worth a fact.
        if existing.status == IntentStatus::Validated {
            self.push(Event::IntentDeduplicated { key: key.clone(), run_id: run_id.clone() });
        }
        // Proposed again by another run while no new attempt may come of it: a resend refused,
        // worth a fact too. The run that reserved it polls and resumes without writing one.
        if another_run && existing.status.refuses_resend() {
            self.push(Event::ResendRefused { key: key.clone(), run_id: run_id.clone() });
        }
        Ok(self.answer(key, false))
    }

    /// Everything a new intent must satisfy before it is reserved, in order: a valid amount
    /// and currency, the run's one currency and deadline, no pending charge under the same
    /// reference, sums that cannot overflow, a refund within what its order was charged, and
    /// the run's money budget.
    fn check_new_intent(&self, run_id: &RunId, run: &OpenRun, definition: &IntentDefinition) -> Result<(), Refusal> {
        let invalid = |detail: String| rejected(RejectCode::InvalidArguments, detail);
        check_amount(definition.amount_minor).map_err(|e| invalid(format!("amount_minor: {e}")))?;
        if !Currency::is_canonical(&definition.currency) {
            return Err(invalid(format!(
                "currency: {:?} is not an upper-case ISO 4217 code (parse it with engine::money::Currency)",
                definition.currency
            )));
        }
        let run_intents = self.view.run_intents(run_id);
        if let Some(other) = run_intents.first().map(|i| &i.definition.currency).filter(|c| **c != definition.currency)
        {
            return Err(invalid(format!(
                "run {run_id} moves {other}: its money budget is one sum, so it cannot also move {}",
                definition.currency
            )));
        }
        if self.now >= run.deadline_at {
            let detail = format!("run {run_id} passed its deadline {}", run.deadline_at);
            return Err(rejected(RejectCode::BudgetExhausted, detail));
        }
        if definition.kind == EffectKind::Charge {
            self.check_reference(definition)?;
        }
        let order_intents = self.view.order_intents(&definition.tenant, &definition.order_id);
        check_overflow(run_id, definition, &run_intents, &order_intents)?;
        if definition.kind == EffectKind::Refund {
            check_refund(definition, &order_intents)?;
        }
        if let Some(max) = run.limits.cost_minor_max {
            let committed = committed_minor(&run_intents);
            if committed.checked_add(definition.amount_minor).is_none_or(|after| after > max) {
                return Err(rejected(
                    RejectCode::BudgetExhausted,
                    format!(
                        "run {run_id} has committed {committed} of its {max} minor-unit budget; {} more asked",
                        definition.amount_minor
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A second charge key for the same reference asserts a second charge: refused while the
    /// first is open. Refunds are not bound by it: distinct refunds of one order are distinct
    /// intents, and the cumulative invariant is what protects the order.
    fn check_reference(&self, definition: &IntentDefinition) -> Result<(), Refusal> {
        let charges = self.view.reference_charges(&definition.tenant, &definition.business_ref);
        match charges.iter().find(|intent| intent.pending()) {
            None => Ok(()),
            Some(pending) => Err(rejected(
                RejectCode::ReferencePending,
                format!(
                    "intent {} for the same {} reference {:?} is still {}: a new key cannot step around it",
                    pending.key(),
                    definition.kind.as_str(),
                    definition.business_ref,
                    pending.status.as_str()
                ),
            )),
        }
    }
}

/// The journal entry that links a run to an intent it reserved (or found).
fn journal_link(run_id: &RunId, position: u32, key: &IntentKey) -> Event {
    Event::StepRecorded {
        run_id: run_id.clone(),
        position,
        name: key.journal_step(),
        output: Value::String(key.as_str().to_owned()),
    }
}

/// The checked sum of the amounts whose money counts (reserved, in flight, unknown, spent).
fn committed_minor(intents: &[Intent]) -> i64 {
    checked_sum(intents.iter().filter(|i| i.money_committed()).map(|i| i.definition.amount_minor))
        .expect("a run's or an order's amounts sum inside i64: a reservation that would not is refused")
}

/// Refuses a reservation that would make a money sum overflow: every amount the run
/// reserved, and every amount of the order of the same kind and currency, must sum inside
/// `i64` whatever their statuses become.
fn check_overflow(
    run_id: &RunId,
    definition: &IntentDefinition,
    run_intents: &[Intent],
    order_intents: &[Intent],
) -> Result<(), Refusal> {
    let amount = definition.amount_minor;
    let run = checked_sum(run_intents.iter().map(|i| i.definition.amount_minor)).and_then(|s| s.checked_add(amount));
    let same = order_intents
        .iter()
        .filter(|i| i.definition.kind == definition.kind && i.definition.currency == definition.currency);
    let order = checked_sum(same.map(|i| i.definition.amount_minor)).and_then(|s| s.checked_add(amount));
    let detail = match (run, order) {
        (None, _) => format!("run {run_id}'s reserved amounts would overflow with {amount} more"),
        (_, None) => format!(
            "order {}'s {} total in {} would overflow with {amount} more",
            definition.order_id,
            definition.kind.as_str(),
            definition.currency
        ),
        _ => return Ok(()),
    };
    Err(rejected(RejectCode::InvariantViolated, detail))
}

/// A refund's currency must be its order's charge's, and refunds reserved, unknown or
/// validated in that currency never exceed what was charged in it.
fn check_refund(definition: &IntentDefinition, order_intents: &[Intent]) -> Result<(), Refusal> {
    let (order, currency) = (&definition.order_id, &definition.currency);
    let charges: Vec<&Intent> = order_intents.iter().filter(|i| i.definition.kind == EffectKind::Charge).collect();
    let mut charged_in: Vec<&str> = charges.iter().map(|i| i.definition.currency.as_str()).collect();
    charged_in.sort_unstable();
    charged_in.dedup();
    if !charged_in.is_empty() && !charged_in.contains(&currency.as_str()) {
        return Err(rejected(
            RejectCode::InvalidArguments,
            format!(
                "currency: order {order} was charged in {}, a refund of it cannot be in {currency}",
                charged_in.join(", ")
            ),
        ));
    }
    let validated = charges
        .iter()
        .filter(|i| i.definition.currency == *currency && i.status == IntentStatus::Validated)
        .map(|i| i.definition.amount_minor);
    let charged =
        checked_sum(validated).expect("an order's amounts sum inside i64: a reservation that would not is refused");
    let refunds: Vec<Intent> = order_intents
        .iter()
        .filter(|i| i.definition.kind == EffectKind::Refund && i.definition.currency == *currency)
        .cloned()
        .collect();
    let refunded = committed_minor(&refunds);
    if refunded.checked_add(definition.amount_minor).is_none_or(|after| after > charged) {
        return Err(rejected(
            RejectCode::InvariantViolated,
            format!(
                "refund of {} {currency} on order {order} would bring refunds (reserved, unknown or validated) \
                 from {refunded} above the {charged} {currency} charged",
                definition.amount_minor
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The overflow refusal, over intents forged past the input bound: no history a caller can
    //! write holds amounts this large (each is at most `AMOUNT_MINOR_MAX`), so only a forged
    //! intent reaches the sums that would not fit in `i64`.

    use super::*;
    use crate::clock::ManualClock;
    use crate::event::RunLimits;
    use crate::ledger::tests::{key, nine_am, reserve, tier};
    use crate::memory::MemoryLog;
    use std::sync::Arc;

    /// The fixture's charge (49.00 EUR on order_1), its amount, kind and currency replaced.
    fn forged(amount_minor: i64, kind: EffectKind, currency: &str) -> Intent {
        let log = MemoryLog::new(Arc::new(ManualClock::new(nine_am())));
        log.execute_now(&reserve(tier(true, true), RunLimits::default(), false)).expect("reserved");
        let mut intent = log.ledger().intent(&key()).expect("the fixture's intent").clone();
        intent.definition.amount_minor = amount_minor;
        intent.definition.kind = kind;
        intent.definition.currency = currency.into();
        intent
    }

    fn overflows(amount: i64, run: &[Intent], order: &[Intent]) -> bool {
        let definition = forged(amount, EffectKind::Charge, "EUR").definition;
        match check_overflow(&RunId::new("run-1"), &definition, run, order) {
            Ok(()) => false,
            Err(Refusal::Rejected { code: RejectCode::InvariantViolated, .. }) => true,
            Err(other) => panic!("an overflow is an invariant refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_sum_that_would_not_fit_is_refused_and_the_largest_that_fits_passes() {
        let almost = || forged(i64::MAX - 10, EffectKind::Charge, "EUR");
        // The run's sum, whatever the kind or currency of what it reserved.
        assert!(!overflows(10, &[almost()], &[]));
        assert!(overflows(11, &[almost()], &[]));
        assert!(overflows(11, &[forged(i64::MAX - 10, EffectKind::Refund, "USD")], &[]));
        // The order's sum counts its intents of the same kind and currency only.
        assert!(!overflows(10, &[], &[almost()]));
        assert!(overflows(11, &[], &[almost()]));
        assert!(!overflows(11, &[], &[forged(i64::MAX - 10, EffectKind::Refund, "EUR")]));
        assert!(!overflows(11, &[], &[forged(i64::MAX - 10, EffectKind::Charge, "USD")]));
    }
}
