//! What the executor must do next for an intent, as the ledger decided it.
//!
//! Owns [`Next`] and the one rule that derives it from an intent's state after a command:
//! the reply to every intent command carries it, so the executor's driver interprets the
//! ledger's decision (send, look up, ask for an attempt, stop) instead of re-deciding from
//! the status. This module only reads an intent already folded; it never decides events.

use super::state::{Intent, IntentStatus};
use crate::event::RunId;
use crate::limits;
use chrono::{DateTime, Utc};

/// The next step for an intent, from the point of view of the run that sent the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// This command wrote attempt `attempt` ahead: call the provider now, then record its
    /// outcome.
    Send {
        /// The attempt to send.
        attempt: u32,
    },
    /// This command started reconciliation `reconciliation`: look the effect up now, then
    /// record the answer.
    LookUp {
        /// The reconciliation to carry out.
        reconciliation: u32,
    },
    /// An attempt may be asked for (never sent, a request proven never sent, or an unknown
    /// outcome the provider deduplicates by key and whose backoff has passed), after waiting
    /// `backoff_ms` (a network retry's backoff; 0 otherwise).
    Attempt {
        /// How long to wait before asking.
        backoff_ms: u64,
    },
    /// A reconciliation is due: ask to start one.
    Reconcile,
    /// Nothing to do before `until`: the outcome is unknown and the next reconciliation is
    /// not yet due.
    WaitUntil {
        /// When the next reconciliation is due.
        until: DateTime<Utc>,
    },
    /// A human must approve the intent before any attempt.
    AwaitApproval,
    /// An attempt or a lookup is in flight, started by another command: its sender records
    /// what comes back (or recovery does, if it died).
    InFlight,
    /// The intent is settled (validated, declined, cancelled, rejected) or escalated to a
    /// human: Keel does nothing more on its own.
    Done,
}

/// What the command that produced a reply started, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launched {
    /// Nothing: the intent moved (or not) without a request to make.
    Nothing,
    /// An attempt, written ahead.
    Attempt,
    /// A reconciliation.
    Lookup,
}

impl Next {
    /// The next step for `intent` at `now`, after a command that `launched` what it says,
    /// sent on behalf of `acting` (the run whose network retries a resend would spend).
    pub fn after(intent: &Intent, launched: Launched, now: DateTime<Utc>, acting: Option<&RunId>) -> Self {
        use IntentStatus as S;
        match (intent.status, launched) {
            (S::Attempting, Launched::Attempt) => Self::Send { attempt: intent.attempts },
            (S::Reconciling, Launched::Lookup) => Self::LookUp { reconciliation: intent.reconciliations },
            (S::Attempting | S::Reconciling, _) => Self::InFlight,
            (S::AwaitingApproval, _) => Self::AwaitApproval,
            (S::Reserved, _) => {
                let retry = acting.is_some_and(|run_id| intent.network_retry_by(run_id));
                Self::Attempt { backoff_ms: if retry { limits::network_retry_backoff_ms(intent.not_sent) } else { 0 } }
            }
            (S::OutcomeUnknown, _) => match intent.reconcile_after {
                Some(until) if until > now => Self::WaitUntil { until },
                // Recorded unknown with no way to reconcile: escalation follows in the same
                // commit, so this is only seen mid-fold.
                None => Self::Done,
                Some(_) if intent.capability.lookup => Self::Reconcile,
                // No lookup, but the provider deduplicates by key: a resend is the reconciliation.
                Some(_) => Self::Attempt { backoff_ms: 0 },
            },
            (S::Validated | S::Declined | S::Cancelled | S::Rejected | S::Escalated, _) => Self::Done,
        }
    }
}
