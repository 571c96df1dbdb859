//! The spine's state, its fold, and every decision taken against it.
//!
//! - [`state`] — the entities: [`Intent`] (one intent, folded from its stream) and [`Run`]
//!   (what decisions need of one run); [`RunHistory`] (what replaying a run needs).
//! - [`fold`] — [`fold::apply`], one event into the entities it concerns: the one fold the
//!   whole-log [`Ledger`] and the store's per-entity projections both run.
//! - [`view`] — [`View`], what a decision reads: entities one by one, never the whole log.
//! - [`protocol`] — [`Command`], [`Action`], the typed [`Refusal`], [`Reply`], [`Decision`].
//! - [`next`] — [`Next`], the step an intent's reply tells the executor to take.
//! - [`decide()`] — a command in, the events to append (or a refusal) out; one submodule per
//!   part of the lifecycle.
//! - [`Ledger`] — the fold of a whole log in memory (the in-memory log, `verify`'s reference
//!   replay, the test kit), itself a [`View`].
//!
//! The store calls [`decide()`] for each command inside its write transaction, over a view of
//! the rows that transaction sees, so a decision always sees every event committed before it
//! — that is what makes reservation atomic.
//!
//! This module never reads a clock (time comes in as `now`), never does I/O, and never
//! appends: it only says what to append.

pub mod fold;
mod next;
mod protocol;
mod state;
mod view;
mod whole;

mod decide;

pub use decide::{decide, reply_after};
pub use fold::FoldError;
pub use next::{Launched, Next};
pub use protocol::{
    Action, AgentRunStart, Command, Decision, IntentSpec, Refusal, RejectCode, Reply, ReplyTarget, RunStart,
    SpineRequest, Step,
};
pub use state::{
    AGENT_WORKFLOW_PREFIX, ALL_STATUSES, Approval, CancelRequest, Intent, IntentStatus, JournalEntry, Recovery, Run,
    RunHistory,
};
pub use view::View;
pub use whole::Ledger;

#[cfg(test)]
mod agent_tests;
#[cfg(test)]
mod boundary_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod operator_tests;
#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod tests;
