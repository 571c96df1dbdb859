//! Journaled workflows and the replaying executor.
//!
//! - [`workflow`] — the workflow API: [`Workflow`] (a typed input, an async function over a
//!   [`Context`]), [`IntentRequest`], [`end_with`], and [`Registered`], a workflow as the
//!   executor holds it.
//! - [`context`] — [`Context`], the journal a workflow's operations go through
//!   ([`Context::step`], [`Context::intent`], [`Context::sleep`], [`Context::wait_signal`],
//!   [`Context::billed_call`]).
//! - [`driver`] — the intent driver, shared by workflows and agents ([`reserve_for_run`],
//!   [`drive_intent`]): it carries out the ledger's [`crate::ledger::Next`] step, never
//!   re-deciding from a status.
//! - [`runs`] — [`Executor`]: starts runs, resumes them after a crash by re-running the
//!   function against its journal, recovers in-flight work, reconciles what is due.
//! - [`leases`] — claiming, renewing and giving back run leases.
//! - [`outcome`] — what callers learn ([`IntentOutcome`], [`RunOutcome`]), typed.
//!
//! # Replay
//!
//! Every journaled operation takes the next position in the run's journal. On resume the
//! function runs again from the top: a position already recorded returns its recorded
//! output without doing anything; the first unrecorded one proceeds. If the code asks for a
//! different step than the one recorded at a position, the run stops
//! `nondeterministic_replay` — never silently.
//!
//! # Order of effects
//!
//! Decide, persist, then act: `AttemptStarted` is durable before the provider is called; the
//! outcome is recorded after. A transport failure is recorded as `OutcomeUnknown`, never as a
//! failure, and the next step is a lookup, never a blind resend.
//!
//! # Secrets
//!
//! Secrets (payment method tokens) live in the [`Context`] of the invocation that received
//! them and nowhere else: the run's stored input holds their hashes. A resumed run without
//! the secret can reconcile; it resends only with the payment method the log's vault kept
//! (sealed in the reservation's commit, when the log has a vault key, and shredded once the
//! intent is final). Otherwise the caller re-presents the same request (same key, same
//! fingerprint) and that invocation drives the next attempt.
//!
//! This module does no I/O of its own: it talks to the log through [`EventLog`] and to the
//! provider through [`PaymentProvider`], and reads and waits on time through [`Clock`].

mod context;
mod driver;
#[cfg(test)]
mod driver_tests;
mod leases;
mod outcome;
mod runs;
mod workflow;

pub use context::{Billed, Context};
pub use driver::{HumanApproval, Reservation, drive_intent, reserve_for_run};
pub use leases::{claim_run, release_runs, renew_leases};
pub use outcome::{IntentOutcome, OutcomeCode, OutcomeStatus, RunEnd, RunOutcome, UnknownOutcome, ValidatedBy};
pub use runs::{Asleep, Due, Executor, LeftAlone, ResumeReport, RunRequest, due_intents};
pub use workflow::{IntentRequest, Prepared, Registered, Rejection, Workflow, WorkflowEnd, end_with};

use crate::clock::Clock;
use crate::lease::Lessee;
use crate::ledger::Refusal;
use crate::log::{EventLog, LogError};
use crate::provider::PaymentProvider;
use std::sync::Arc;

/// What a workflow run needs from the outside world.
#[derive(Clone)]
pub struct Runtime {
    /// The durable log.
    pub log: Arc<dyn EventLog>,
    /// The payment provider.
    pub provider: Arc<dyn PaymentProvider>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// This process's identity and the run leases it holds.
    pub lessee: Lessee,
}

/// Why a workflow stopped without an outcome of its own.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// Replayed code asked for another step than the one recorded.
    #[error(transparent)]
    Nondeterministic(Refusal),
    /// The run cannot go on now (waiting for a signal, an approval, a resubmission); it stays
    /// open and `keel resume` continues it.
    #[error("suspended: {reason}")]
    Suspended {
        /// Why, and what would continue it.
        reason: String,
        /// The intent it waits on, when it waits on one (an approval).
        intent: Option<Box<IntentOutcome>>,
    },
    /// The run waits on a durable timer that fires at `until` (recorded in its journal):
    /// it stays open, and `keel resume` continues it once that instant has passed.
    #[error("suspended until its timer fires at {until}")]
    Sleeping {
        /// When the timer fires.
        until: chrono::DateTime<chrono::Utc>,
    },
    /// A limit of the workflow's own (a model call or token budget) stops the run with
    /// `status`, a controlled stop named for its dimension.
    #[error("{detail}")]
    Limit {
        /// The stop.
        status: crate::event::RunStatus,
        /// Which limit, and what was spent.
        detail: String,
    },
    /// The run's deadline passed.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// An operator asked the run to stop (`keel run cancel`): it ends `cancelled`.
    #[error("{0}")]
    Cancelled(String),
    /// A recorded output no longer decodes into the type the code asks for.
    #[error("recorded output at position {position} does not decode: {detail}")]
    Undecodable {
        /// The position.
        position: u32,
        /// The decoder's message.
        detail: String,
    },
    /// The run's stored input no longer decodes into the workflow's input type.
    #[error("the run's stored input does not decode into the workflow's input: {0}")]
    StoredInput(String),
    /// Another process holds the run's lease live (it is working on it), or took it from
    /// this one: this process must not act for the run.
    #[error(transparent)]
    Busy(Refusal),
    /// The log failed.
    #[error(transparent)]
    Log(LogError),
    /// The workflow's own logic failed.
    #[error("workflow failed: {0}")]
    Failed(String),
}

impl From<LogError> for WorkflowError {
    fn from(error: LogError) -> Self {
        match error {
            LogError::Refused(refusal @ Refusal::Nondeterministic { .. }) => Self::Nondeterministic(refusal),
            LogError::Refused(refusal @ (Refusal::Fenced { .. } | Refusal::LeaseHeld { .. })) => Self::Busy(refusal),
            LogError::Refused(Refusal::RunCancelled { by, reason, .. }) => {
                Self::Cancelled(format!("cancelled by operator {by}: {reason}"))
            }
            other => Self::Log(other),
        }
    }
}
