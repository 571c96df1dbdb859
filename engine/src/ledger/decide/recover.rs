//! Recovery: attempts and lookups in flight whose process is gone become interrupted facts
//! — `OutcomeUnknown (crash)`, an interrupted lookup — exactly once, the recovering process
//! claiming their runs' leases in the same commit. What a live process holds is left to it.

use super::Decider;
use crate::event::{Event, LookupStatus, RunId};
use crate::lease::{LeaseGrant, LeaseOwner};
use crate::ledger::protocol::{Refusal, ReplyTarget};
use crate::ledger::state::{Intent, IntentStatus, Recovery};
use crate::limits;
use crate::provider::UnknownReason;
use std::collections::BTreeMap;

impl Decider<'_> {
    /// Recovery for `owner`: claims the run of every attempt or lookup in flight that no
    /// process holds live, and records those as interrupted; leaves the others alone. At
    /// most [`limits::RECOVERY_PASS_MAX`] intents per pass: a second pass takes the rest.
    pub(super) fn recover(&mut self, owner: &LeaseOwner, only: Option<&RunId>) -> ReplyTarget {
        let driving_run = |intent: &Intent| intent.in_flight_run.clone().unwrap_or_else(|| intent.run_id.clone());
        let touched: Vec<Intent> = self
            .view
            .in_flight(limits::RECOVERY_PASS_MAX)
            .into_iter()
            .filter(|intent| only.is_none_or(|run| &driving_run(intent) == run))
            .collect();
        // One claim per run, decided before any intent of it is touched.
        let mut verdicts: BTreeMap<RunId, Result<Option<LeaseGrant>, LeaseOwner>> = BTreeMap::new();
        for intent in &touched {
            let run_id = driving_run(intent);
            if verdicts.contains_key(&run_id) {
                continue;
            }
            let verdict = match self.view.run(&run_id) {
                Some(run) => match self.claim(&run, owner) {
                    Ok(grant) => Ok(Some(grant)),
                    Err(Refusal::LeaseHeld { owner: holder, .. }) => Err(holder),
                    Err(_) => Ok(None),
                },
                None => Ok(None),
            };
            verdicts.insert(run_id, verdict);
        }
        let mut recovery = Recovery::default();
        for intent in &touched {
            match &verdicts[&driving_run(intent)] {
                Err(holder) => recovery.held_elsewhere.push((intent.key().clone(), holder.clone())),
                Ok(_) => {
                    self.recover_intent(intent);
                    recovery.recovered.push(intent.key().clone());
                }
            }
        }
        recovery.claimed = verdicts.into_values().filter_map(|verdict| verdict.ok().flatten()).collect();
        ReplyTarget::Recovered(recovery)
    }

    /// The interrupted attempt or lookup of one intent, as recovery records it.
    fn recover_intent(&mut self, intent: &Intent) {
        let now = self.now;
        match intent.status {
            IntentStatus::Attempting => {
                let can_reconcile = intent.capability.lookup || intent.capability.dedup_by_key;
                self.push(Event::OutcomeUnknown {
                    key: intent.key().clone(),
                    attempt: intent.attempts,
                    reason: UnknownReason::Crash,
                    detail: "the process died with this attempt in flight".to_owned(),
                    reconcile_after: can_reconcile.then_some(now),
                });
                if !can_reconcile {
                    self.push(Event::IntentEscalated {
                        key: intent.key().clone(),
                        reason: "crashed mid-attempt on a provider with neither idempotency keys nor a lookup"
                            .to_owned(),
                        absence_proven: false,
                    });
                }
            }
            _ => self.resolve_lookup(
                intent,
                intent.reconciliations,
                LookupStatus::Interrupted,
                None,
                "the process died during the lookup".to_owned(),
            ),
        }
    }
}
