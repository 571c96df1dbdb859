//! Every decision: a [`Command`] in, the events to append (or a [`Refusal`]) out.
//!
//! Owns [`decide`] and [`reply_after`]. One file per part of the lifecycle — [`reserve`]
//! (key, fingerprint, money and the invariants, atomically), [`attempt`] (write-ahead
//! attempts and their outcomes, late answers included), [`reconcile`] (lookups and what they
//! prove), [`recover`] (in-flight work whose process died), [`operator`] (approvals, denials,
//! cancellations, resolutions), [`abandon`] (the end of a charge nobody re-submits), [`runs`] (journals, timers, signals, agent entries, ends) and
//! [`leases`] (claims, renewals, releases, fencing).
//!
//! A decision reads only the entities it is about, through a [`View`] (indexed reads inside
//! the store's transaction), and never reads a clock: `now` is an input. It is pure: the
//! caller appends the events and applies the lease effects, in one commit, or nothing.

mod abandon;
mod attempt;
mod facts;
mod leases;
mod operator;
mod reconcile;
mod recover;
mod reserve;
mod runs;

use super::next::{Launched, Next};
use super::protocol::{Action, Command, Decision, Refusal, Reply, ReplyTarget};
use super::state::Intent;
use super::view::View;
use crate::event::{Event, IntentKey, RunId};
use crate::lease::{LeaseEffect, LeaseUse, LeaseView};
use crate::limits;
use chrono::{DateTime, Utc};

/// Decides what to append for `command` at `now`, reading `view` (the entities) and `leases`
/// (who holds which run). Nothing is written on `Err`.
///
/// # Errors
///
/// The [`Refusal`] that explains why the command cannot be carried out.
pub fn decide(
    view: &dyn View,
    leases: &dyn LeaseView,
    command: &Command,
    now: DateTime<Utc>,
) -> Result<Decision, Refusal> {
    let acting = command.action.fenced_run().or(command.cause.run_id.as_ref()).cloned();
    let mut decider = Decider {
        view,
        leases,
        now,
        acting,
        governing: command.policy.as_ref(),
        events: Vec::new(),
        effects: Vec::new(),
    };
    let start = command.start_run.as_ref();
    if let Some(start) = start {
        decider.start_run(start)?;
    }
    if let Some(run_id) = command.action.fenced_run() {
        leases::check_fence(run_id, &command.lease, leases)?;
    }
    let target = decider.action(&command.action, start)?;
    if let LeaseUse::Release(grant) = &command.lease {
        decider.release(grant);
    }
    Ok(Decision { events: decider.events, target, leases: decider.effects })
}

/// The reply to an accepted command, read from `view` once its events are applied.
pub fn reply_after(view: &dyn View, target: &ReplyTarget) -> Reply {
    match target {
        ReplyTarget::Done => Reply::Done,
        ReplyTarget::Intent { key, fresh, launched, acting, now } => match view.intent(key) {
            Some(intent) => {
                let next = Next::after(&intent, *launched, *now, acting.as_ref());
                let charge_ref = refunded_charge(view, &intent);
                Reply::Intent { intent: Box::new(intent), fresh: *fresh, next, charge_ref }
            }
            None => Reply::Done,
        },
        ReplyTarget::Run(run_id) => view.run(run_id).map_or(Reply::Done, |run| Reply::Run(Box::new(run))),
        ReplyTarget::History(run_id) => {
            view.history(run_id).map_or(Reply::Done, |history| Reply::History(Box::new(history)))
        }
        ReplyTarget::Recovered(recovery) => Reply::Recovered(recovery.clone()),
        ReplyTarget::Claimed(grant) => Reply::Claimed(grant.clone()),
        ReplyTarget::Renewed(lost) => Reply::Renewed { lost: lost.clone() },
        ReplyTarget::Snapshot(now) => Reply::Snapshot {
            due: view.due(*now, limits::RECONCILE_PASS_MAX),
            waiting: view.waiting(limits::WAITING_PASS_MAX),
            unfinished: view.awake_runs(*now, limits::RESUME_PASS_MAX),
            sleeping: view.sleeping_runs(*now, limits::RESUME_PASS_MAX),
        },
        ReplyTarget::Facts(conversation) => Reply::Facts(Box::new(view.conversation(conversation))),
    }
}

/// For a refund, the provider's reference of the charge it gives money back on: the one
/// validated charge of its order in its currency. `None` for a charge, and when the order has
/// no such charge or several (a provider refunds one charge at a time; which one to pick is
/// not this slice's to decide, so the adapter is told there is no single one). One indexed
/// read of the order's intents, for refunds only.
fn refunded_charge(view: &dyn View, intent: &Intent) -> Option<String> {
    if intent.definition.kind != crate::provider::EffectKind::Refund {
        return None;
    }
    let charges: Vec<String> = view
        .order_intents(&intent.definition.tenant, &intent.definition.order_id)
        .into_iter()
        .filter(|i| i.definition.kind == crate::provider::EffectKind::Charge)
        .filter(|i| i.definition.currency == intent.definition.currency)
        .filter_map(|i| i.evidence.map(|evidence| evidence.provider_ref))
        .collect();
    match charges.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// One decision in progress: what it reads, and what it has decided so far.
struct Decider<'a> {
    view: &'a dyn View,
    leases: &'a dyn LeaseView,
    now: DateTime<Utc>,
    /// The run the command acts for (its cause's, or the one the action names).
    acting: Option<RunId>,
    /// The policy in force where the command was sent, for a reservation ([`Command::policy`]).
    governing: Option<&'a crate::policy::Governing>,
    events: Vec<Event>,
    effects: Vec<LeaseEffect>,
}

impl Decider<'_> {
    fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Dispatches one action to the part of the lifecycle it belongs to.
    fn action(&mut self, action: &Action, start: Option<&super::protocol::RunStart>) -> Result<ReplyTarget, Refusal> {
        match action {
            Action::StartRun => match start {
                Some(start) => Ok(ReplyTarget::Run(start.run_id.clone())),
                None => Err(Refusal::NoRunToStart),
            },
            Action::Observe { key } => {
                self.existing(key)?;
                Ok(self.answer(key, false))
            }
            Action::ObserveRun { run_id } => {
                self.view.run(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                Ok(ReplyTarget::Run(run_id.clone()))
            }
            Action::LoadRun { run_id } => {
                self.view.run(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                Ok(ReplyTarget::History(run_id.clone()))
            }
            Action::Snapshot => Ok(ReplyTarget::Snapshot(self.now)),
            Action::Reserve { run_id, position, spec, start_attempt } => {
                self.reserve(start, run_id, *position, spec, *start_attempt)
            }
            Action::StartAttempt { key, run_id } => self.start_attempt(key, run_id, start),
            Action::RecordOutcome { key, attempt, outcome } => self.record_outcome(key, *attempt, outcome),
            Action::StartReconciliation { key, force, run_id } => self.start_reconciliation(key, *force, run_id),
            Action::RecordLookup { key, reconciliation, outcome } => self.record_lookup(key, *reconciliation, outcome),
            Action::Recover { owner, run } => Ok(self.recover(owner, run.as_ref())),
            Action::ClaimRun { run_id, owner } => self.claim_run(run_id, owner),
            Action::RenewLeases { owner, grants } => Ok(self.renew(owner, grants)),
            Action::ReleaseLeases { grants } => {
                grants.iter().for_each(|grant| self.release(grant));
                Ok(ReplyTarget::Done)
            }
            Action::Approve { key, by, ttl_ms, fingerprint } => self.approve(key, by, *ttl_ms, fingerprint.as_deref()),
            Action::CheckApproval { key } => self.check_approval(key),
            Action::Deny { key, by, reason } => self.deny(key, by, reason),
            Action::Cancel { key, by, reason } => self.cancel(key, by, reason),
            Action::CancelRun { run_id, by, reason } => self.cancel_run(run_id, by, reason),
            Action::Resolve { key, by, reason, landed, lookup, override_reason } => {
                self.resolve(key, by, reason, landed.as_deref(), lookup.as_ref(), override_reason.as_deref())
            }
            Action::RecordStep { run_id, position, name, output } => {
                self.record_step(start, run_id, *position, name, output)
            }
            Action::StartTimer { run_id, position, fire_at } => self.start_timer(start, run_id, *position, *fire_at),
            Action::DeliverSignal { run_id, name, payload } => self.deliver_signal(run_id, name, payload),
            Action::RecordAgentEntries { run_id, position, entries, start: agent_start, spine } => {
                if start.is_some() {
                    return Err(Refusal::AgentBatch {
                        run_id: run_id.clone(),
                        why: "an agent run starts with its entries",
                    });
                }
                self.record_agent_entries(run_id, *position, entries, agent_start.as_ref(), spine)
            }
            Action::Abandon { key, run_id, window_ms } => self.abandon(key, run_id, *window_ms),
            Action::FinishRun { run_id, status, detail } => self.finish_run(run_id, *status, detail.clone()),
            Action::ApplyFacts { conversation, ticket, message, candidates } => {
                self.apply_facts(conversation, *ticket, message, candidates)
            }
            Action::ForgetFacts { conversation, ticket, key } => {
                self.forget_facts(conversation, *ticket, key.as_deref())
            }
        }
    }

    /// The reply naming `key`: what this decision launched for it (an attempt written
    /// ahead, a reconciliation started) is read from the events decided so far, so it must be
    /// the decision's last word.
    fn answer(&self, key: &IntentKey, fresh: bool) -> ReplyTarget {
        let launched = self
            .events
            .iter()
            .rev()
            .find_map(|event| match event {
                Event::AttemptStarted { key: started, .. } if started == key => Some(Launched::Attempt),
                Event::ReconciliationStarted { key: started, .. } if started == key => Some(Launched::Lookup),
                _ => None,
            })
            .unwrap_or(Launched::Nothing);
        ReplyTarget::Intent { key: key.clone(), fresh, launched, acting: self.acting.clone(), now: self.now }
    }

    fn existing(&self, key: &IntentKey) -> Result<super::state::Intent, Refusal> {
        self.view.intent(key).ok_or_else(|| Refusal::UnknownIntent(key.clone()))
    }

    /// `now` plus a delay that a bound in [`limits`] keeps short (a backoff, a lease's time to
    /// live: at most an hour). A clock tells real times, millennia away from chrono's limits,
    /// so this is an instant; a clock that does not is a bug worth stopping for.
    fn later(&self, ms: u64) -> DateTime<Utc> {
        crate::clock::checked_plus_ms(self.now, ms)
            .expect("a clock's now plus a delay bounded by limits.rs is a representable instant")
    }
}
