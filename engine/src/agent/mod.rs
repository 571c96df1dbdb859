//! The bounded agent harness: the model proposes, the harness disposes.
//!
//! - [`model`] — [`ModelTransport`], the normalised [`ModelResponse`] and [`ModelRequest`].
//! - [`registry`] — [`Tool`]s with strict closed schemas, capabilities, effect classes,
//!   approval policies and invariants; their bodies are private.
//! - [`guard`] — the SPEC's eleven guard steps; [`Registry::invoke`] is the only way to a body.
//! - [`budget`] — [`AgentLimits`] and the [`PriceTable`].
//! - [`event`] — the durable facts ([`AgentEvent`]) and their fold ([`AgentState`]).
//! - [`journal`] — [`AgentJournal`], the door to durability, and [`MemoryJournal`].
//! - [`gate`] — [`EffectGate`], the hook the spine's intent lifecycle implements.
//! - [`control`] — deadline ([`Timer`]) and cancellation ([`Cancellation`]) without a clock.
//! - [`run_loop`] — [`run`]: start or resume a run and drive it to a stop.
//! - [`outcome`] — [`AgentStatus`], exit codes, [`RunOutcome`] and the CLI's [`RunReport`].
//!
//! *Architecture invariant*: this module does no I/O and never reads a clock. Transports,
//! journals, timers and gates are injected.

pub mod budget;
pub mod control;
pub mod event;
pub mod gate;
pub mod guard;
pub mod journal;
pub mod model;
pub mod outcome;
pub mod registry;
pub mod run_loop;

pub use budget::{AgentLimits, LimitsError, ModelPrice, PriceTable};
pub use control::{Cancellation, ManualTimer, Timer};
pub use event::{AgentEvent, AgentState, CallHold, CorrectionCode, ToolOutcome};
pub use gate::{ApprovalDecision, EffectGate, EffectIntent, EffectOutcome, EffectTicket, GateDecision};
pub use guard::{AgentEnv, GuardedScope, Invoked, Verdict, decide};
pub use journal::{AgentJournal, JournalError, LogJournal, MemoryJournal, NewRun};
pub use model::{
    Message, ModelRequest, ModelResponse, ModelTransport, ResponseBlock, StopReason, ToolCall, ToolDescriptor,
    ToolResultBlock, TransportError, Usage,
};
pub use outcome::{AgentStatus, ControlEvent, EXIT_INTERNAL, RunOutcome, RunReport};
pub use registry::{ApprovalPolicy, EffectClass, Registry, RegistryError, Tool, ToolContext, ToolOutput, ToolSpec};
pub use run_loop::{Completion, RunSpec, run};

/// An internal error of the harness: the run could not be driven (exit code 1). Stops the
/// model or the budgets cause are not errors: they are [`AgentStatus`]es.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The journal could not append or load.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The transport failed in a way that is Keel's own bug (e.g. an exhausted transcript).
    #[error(transparent)]
    Transport(TransportError),
    /// The journal holds another run.
    #[error("the journal holds run {found}, not {expected}")]
    RunMismatch {
        /// The run asked for.
        expected: String,
        /// The run found.
        found: String,
    },
    /// A new run's limits are out of their documented ranges (nothing was written).
    #[error("invalid limits: {0}")]
    InvalidLimits(LimitsError),
    /// The tools (names, versions or schemas) differ from those the run started with.
    #[error("run {run_id}: the tool registry differs from the one the run started with")]
    RegistryChanged {
        /// The run.
        run_id: String,
    },
}

#[cfg(test)]
mod tests;
