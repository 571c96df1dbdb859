//! Keel's bounded agent harness: the model proposes, the harness disposes.
//!
//! A crate above `engine`, which stores its facts as opaque, position-checked journal
//! entries and knows nothing of it. Its main types:
//!
//! - [`Registry`] of [`Tool`]s ([`ToolSpec`]: strict closed schemas, capabilities, effect
//!   classes, approval policies, invariants). A body is private: [`Registry::invoke`], the
//!   SPEC's eleven guard steps ([`guard`]), is the only way to it.
//! - [`ModelTransport`], the normalised [`ModelResponse`] and [`ModelRequest`] ([`model`]);
//!   the HTTP and scripted transports live in `adapters`.
//! - [`AgentLimits`], the [`PriceTable`] and the [`ModelCost`] it measures ([`budget`]).
//! - [`AgentEvent`], the durable facts, and their fold [`AgentState`] ([`event`]).
//! - [`AgentJournal`], the door to durability: [`LogJournal`] over the engine's `EventLog`,
//!   [`MemoryJournal`] for tests ([`journal`]).
//! - [`EffectGate`], the hook an effect tool goes through, and [`MemoryGate`] for tests
//!   ([`gate`]); [`IntentGate`], its implementation over the executor's intent lifecycle
//!   ([`intent_gate`]).
//! - [`Timer`] (deadlines) and [`Cancellation`] without a clock ([`control`]).
//! - [`run`], which starts or resumes a run and drives it to a stop ([`run_loop`]), and its
//!   [`AgentStatus`]es, exit codes, [`RunOutcome`] and the CLI's [`RunReport`] ([`outcome`]).
//! - [`WorkflowModel`]: model calls from a workflow's own journal, reserved before they run
//!   and never re-billed on replay ([`workflow_model`]).
//!
//! *Architecture invariant*: this crate does no I/O and never reads a clock. Transports,
//! journals, timers and gates are injected.
//!
//! ```
//! use agent::{ApprovalPolicy, EffectClass, Registry, RegistryError, Tool, ToolContext, ToolOutput, ToolSpec};
//! use serde_json::json;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Ticket {
//!     id: String,
//! }
//!
//! let spec = |schema| ToolSpec {
//!     name: "read_ticket".into(),
//!     description: "Reads a ticket.".into(),
//!     version: "1".into(),
//!     schema,
//!     capability: "ticket.read".into(),
//!     effect: EffectClass::Read,
//!     approval: ApprovalPolicy::Never,
//! };
//! let read = |ticket: Ticket, _: ToolContext| async move { ToolOutput::ok(format!("ticket {}", ticket.id)) };
//! let closed = json!({"type": "object", "properties": {"id": {"type": "string"}},
//!                     "required": ["id"], "additionalProperties": false});
//! let mut registry = Registry::new();
//! registry.register(Tool::new(spec(closed), read)).expect("a closed schema registers");
//!
//! // A schema that lets unknown properties through is refused before any model sees it.
//! let open = json!({"type": "object", "properties": {"id": {"type": "string"}}});
//! let refused = Registry::new().register(Tool::new(spec(open), read));
//! assert!(matches!(refused, Err(RegistryError::SchemaNotClosed { .. })));
//! ```

pub mod budget;
pub mod control;
pub mod delegation;
pub mod event;
pub mod gate;
pub mod guard;
pub mod intent_gate;
pub mod journal;
pub mod model;
pub mod outcome;
pub mod registry;
pub mod run_loop;
pub mod workflow_model;

pub use budget::{AgentLimits, LimitsError, ModelCost, ModelPrice, PriceTable};
pub use control::{Cancellation, ManualTimer, Timer};
pub use delegation::{DelegateArgs, Delegation};
pub use event::{AgentEvent, AgentState, CallHold, Carved, CorrectionCode, ToolOutcome};
pub use gate::{
    ApprovalAsk, ApprovalDecision, EffectGate, EffectIntent, EffectOutcome, EffectTicket, GateDecision, MemoryGate,
};
pub use guard::{AgentEnv, GuardedScope, Invoked, Verdict, decide};
pub use intent_gate::IntentGate;
pub use journal::{AgentJournal, JournalError, LogJournal, MemoryJournal, NewRun, prompt_version};
pub use model::{
    Message, ModelRequest, ModelResponse, ModelTransport, ResponseBlock, StopReason, ToolCall, ToolDescriptor,
    ToolResultBlock, TransportError, Usage,
};
pub use outcome::{AgentStatus, ControlEvent, EXIT_INTERNAL, RunOutcome, RunReport};
pub use registry::{ApprovalPolicy, EffectClass, Registry, RegistryError, Tool, ToolContext, ToolOutput, ToolSpec};
pub use run_loop::{Completion, RunSpec, run};
pub use workflow_model::{ModelAnswer, ModelBudget, ModelHold, ModelSpent, WorkflowModel};

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
}

#[cfg(test)]
mod tests;
