//! The event log as the executor sees it.
//!
//! Owns [`EventLog`], the one door through which the executor changes durable state: it
//! sends a [`Command`] and gets back the [`Reply`] once the command's events are committed,
//! or the [`Refusal`] that wrote nothing. The `store` crate implements it; the engine never
//! names SQL. Implementations must decide each command against a ledger that includes every
//! event committed before it (by any process), and answer only after the commit.

use crate::ledger::{Command, Refusal, Reply};
use crate::provider::BoxFuture;

/// Why a command did not produce a reply.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The ledger refused the command; nothing was written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The log itself failed (I/O, corruption, shut down). Whether the command's events were
    /// committed is unknown to the caller only if `maybe_committed`.
    #[error("event log failure: {detail}")]
    Unavailable {
        /// What failed.
        detail: String,
        /// Whether the commit may have happened before the failure.
        maybe_committed: bool,
    },
}

/// The durable event log.
pub trait EventLog: Send + Sync {
    /// Decides `command` against the current ledger, appends its events in one commit, and
    /// answers once they are durable.
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, LogError>>;
}
