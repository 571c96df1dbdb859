//! The end of a charge nobody re-submits: an intent that waits for its caller (ready for its
//! next attempt, which needs a payment method neither recovery nor the vault has) past the
//! abandonment window is rejected `abandoned` when it has no effect — never sent, or its
//! effect proven absent — and escalated to a human otherwise.
//!
//! Waiting is counted from the latest attempt's send (the request that may still be
//! reconciled), or from the run's start for an intent never sent. This module only decides;
//! the executor asks once it found that nobody can send the intent.

use super::Decider;
use crate::event::{Event, IntentKey, RunId};
use crate::ledger::protocol::{Refusal, ReplyTarget, Step};
use crate::ledger::state::IntentStatus;

impl Decider<'_> {
    pub(super) fn abandon(&mut self, key: &IntentKey, run_id: &RunId, window_ms: u64) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let wrong = || Refusal::WrongStatus { key: key.clone(), status: intent.status, step: Step::Abandon };
        if &intent.run_id != run_id || !intent.waits_for_payment_method(self.now) {
            return Err(wrong());
        }
        let since = match intent.last_sent_at {
            Some(sent) => sent,
            None => self.view.run(&intent.run_id).ok_or_else(|| Refusal::UnknownRun(intent.run_id.clone()))?.started_at,
        };
        // A window past any date never closes.
        let until = crate::clock::checked_plus_ms(since, window_ms)
            .ok_or(Refusal::DurationOutOfRange { what: "an abandonment window", ms: window_ms })?;
        if self.now < until {
            return Err(Refusal::WaitingWindowOpen { key: key.clone(), since, until });
        }
        if intent.status == IntentStatus::Reserved {
            // Reserved after attempts: each was proven never sent, or its effect proven absent.
            let never_sent = intent.attempts_spent() == 0;
            self.push(Event::IntentAbandoned { key: key.clone(), waiting_since: since, window_ms, never_sent });
        } else {
            // Unknown, and only a resend with the same key could tell (a provider without a
            // lookup): nothing proves the effect absent, so a human decides.
            let reason = format!(
                "nobody re-submitted it within {window_ms} ms while it waited for its caller, and its effect is not \
                 proven absent (the provider offers no lookup): resolve it by hand"
            );
            self.push(Event::IntentEscalated { key: key.clone(), reason, absence_proven: false });
        }
        Ok(self.answer(key, false))
    }
}
