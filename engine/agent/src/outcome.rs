//! How an agent run ends and what it reports.
//!
//! Owns [`AgentStatus`] (SPEC "Runs and their statuses"), its exit-code mapping, the ordered
//! [`ControlEvent`]s (kind, name, count — never arguments) and [`RunOutcome`], whose
//! [`RunOutcome::report`] is exactly what `keel agent run --json` prints. A run suspended on
//! an approval reports `awaiting_approval` without having stopped: nothing of it is recorded.

use serde::{Deserialize, Serialize};

/// How an agent run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// The host's own completion condition holds (the model saying "done" is not enough).
    Completed,
    /// The model stopped and the completion condition does not hold; its text is kept.
    Incomplete,
    /// A tool was proposed whose capability the run was not granted.
    PermissionDenied,
    /// A canonical signature exceeded its repetition budget.
    RepeatedCall,
    /// The tool-call budget (total or per tool) was spent.
    ToolBudget,
    /// The model-call budget was spent.
    ModelBudget,
    /// The input or output token budget was spent.
    TokenBudget,
    /// The cost budget was spent (or a call could not be priced under a cost limit).
    CostBudget,
    /// The schema-correction budget was spent (unknown tools, malformed or invalid arguments).
    SchemaBudget,
    /// The absolute deadline passed.
    DeadlineExceeded,
    /// Too many consecutive turns without progress.
    NoProgress,
    /// The model's output was cut by the token limit; a cut tool call is never executed.
    Truncated,
    /// The model provider could not answer.
    ProviderUnavailable,
    /// An effect is still ambiguous.
    OutcomeUnknown,
    /// The caller cancelled the run.
    Cancelled,
    /// A model answer over one of Keel's size bounds (`MODEL_RESPONSE_MAX_BYTES`,
    /// `AGENT_ANSWER_MAX_BYTES`, `AGENT_TOOL_CALLS_PER_ANSWER_MAX`, named in the detail): it
    /// was not kept, the call stays counted, nothing of it ran.
    AnswerTooLarge,
    /// A resume replays another script than the one the run started with (an edited
    /// transcript): mixing the answers of two scripts is never done silently.
    NondeterministicReplay,
    /// A sub-agent was asked for past the run's delegation budget (`delegations_max`).
    DelegationBudget,
    /// Not a stop: the process was asked to stop gracefully (SIGTERM) and paused the run
    /// between two steps, every step so far recorded; `keel agent resume` continues it.
    /// Never recorded.
    Terminated,
    /// Not a stop: the run is suspended on an effect call reserved without a result until a
    /// human approves (`keel approve KEY --by NAME`) or denies its intent; `keel agent resume`
    /// continues it. Never recorded: `AgentState::try_apply` refuses it in `RunStopped`.
    AwaitingApproval,
}

impl AgentStatus {
    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Incomplete => "incomplete",
            Self::PermissionDenied => "permission_denied",
            Self::RepeatedCall => "repeated_call",
            Self::ToolBudget => "tool_budget",
            Self::ModelBudget => "model_budget",
            Self::TokenBudget => "token_budget",
            Self::CostBudget => "cost_budget",
            Self::SchemaBudget => "schema_budget",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NoProgress => "no_progress",
            Self::Truncated => "truncated",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Cancelled => "cancelled",
            Self::AnswerTooLarge => "answer_too_large",
            Self::NondeterministicReplay => "nondeterministic_replay",
            Self::DelegationBudget => "delegation_budget",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Terminated => "terminated",
        }
    }

    /// The run status the spine records in `RunFinished` for this agent status.
    pub fn run_status(&self) -> engine::event::RunStatus {
        use engine::event::RunStatus as R;
        match self {
            Self::Completed => R::Completed,
            Self::Incomplete => R::Incomplete,
            Self::PermissionDenied => R::PermissionDenied,
            Self::RepeatedCall => R::RepeatedCall,
            Self::ToolBudget => R::ToolBudget,
            Self::ModelBudget => R::ModelBudget,
            Self::TokenBudget => R::TokenBudget,
            Self::CostBudget => R::CostBudget,
            Self::SchemaBudget => R::SchemaBudget,
            Self::DeadlineExceeded => R::DeadlineExceeded,
            Self::NoProgress => R::NoProgress,
            Self::Truncated => R::Truncated,
            Self::ProviderUnavailable => R::ProviderUnavailable,
            Self::OutcomeUnknown => R::OutcomeUnknown,
            Self::Cancelled => R::Cancelled,
            Self::AnswerTooLarge => R::AnswerTooLarge,
            Self::NondeterministicReplay => R::NondeterministicReplay,
            Self::DelegationBudget => R::DelegationBudget,
            Self::AwaitingApproval | Self::Terminated => {
                unreachable!("a suspension or a pause never finishes a run: try_apply refuses it")
            }
        }
    }

    /// True for every controlled stop (everything but `completed`, `incomplete` and the
    /// `awaiting_approval` suspension).
    pub fn is_controlled_stop(&self) -> bool {
        !matches!(self, Self::Completed | Self::Incomplete | Self::AwaitingApproval | Self::Terminated)
    }

    /// True for a stop that only says the model wanted more (a guard or budget stop, a
    /// truncated, refused or failed call): once the host's completion condition holds, the
    /// run ends `completed` instead. `cancelled` (the caller's word), `outcome_unknown` (an
    /// ambiguous effect) and `nondeterministic_replay` (facts that no longer agree) say
    /// something about the world and never yield.
    pub fn yields_to_completion(&self) -> bool {
        match self {
            Self::Incomplete
            | Self::PermissionDenied
            | Self::RepeatedCall
            | Self::ToolBudget
            | Self::ModelBudget
            | Self::TokenBudget
            | Self::CostBudget
            | Self::SchemaBudget
            | Self::DeadlineExceeded
            | Self::NoProgress
            | Self::Truncated
            | Self::ProviderUnavailable
            | Self::AnswerTooLarge
            | Self::DelegationBudget => true,
            Self::Completed
            | Self::Cancelled
            | Self::OutcomeUnknown
            | Self::NondeterministicReplay
            | Self::AwaitingApproval
            | Self::Terminated => false,
        }
    }

    /// The process exit code (SPEC): 0 completed, 130 cancelled by the caller, 143 paused by
    /// SIGTERM (resumable), 2 any other controlled stop, incomplete, or a suspension awaiting
    /// approval. Internal errors (exit 1) are not statuses: they are the `Err` of the run.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Completed => 0,
            Self::Cancelled => 130,
            Self::Terminated => 143,
            _ => 2,
        }
    }
}

/// Exit code for an internal error (a bug, a broken journal, an exhausted fixture).
pub const EXIT_INTERNAL: i32 = 1;

/// One ordered control event: what the harness did, never with arguments or keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlEvent {
    /// `model_call`, `tool_call`, `unknown_tool`, `schema_correction`, a refusal code, or the
    /// status of a controlled stop.
    pub kind: String,
    /// `model`, a tool name, or `run`.
    pub name: String,
    /// The running count of that kind (for a stop: the count of the dimension that stopped).
    pub count: u64,
}

/// What a finished (or stopped) run reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// How it ended.
    pub status: AgentStatus,
    /// Model calls reserved (a failed or interrupted call counts).
    pub model_calls: u32,
    /// Tool attempts admitted by the guard.
    pub tool_calls: u32,
    /// Ordered control events.
    pub events: Vec<ControlEvent>,
    /// The model's final text (kept for `incomplete`, never shown as success).
    pub text: Option<String>,
    /// Why the run stopped, for humans (never arguments or secrets).
    pub detail: Option<String>,
    /// The intent key a suspended run waits on (`awaiting_approval` only).
    pub awaiting_approval: Option<String>,
}

/// The JSON the CLI prints: `{"status","model_calls","tool_calls","events":[{"kind","name","count"}]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    /// Status name.
    pub status: AgentStatus,
    /// Model calls reserved.
    pub model_calls: u32,
    /// Tool attempts admitted.
    pub tool_calls: u32,
    /// Ordered control events.
    pub events: Vec<ControlEvent>,
    /// The intent key a suspended run waits on (`keel approve KEY --by NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_approval: Option<String>,
}

impl RunOutcome {
    /// The CLI's JSON report.
    pub fn report(&self) -> RunReport {
        RunReport {
            status: self.status,
            model_calls: self.model_calls,
            tool_calls: self.tool_calls,
            events: self.events.clone(),
            awaiting_approval: self.awaiting_approval.clone(),
        }
    }

    /// The process exit code for this outcome.
    pub fn exit_code(&self) -> i32 {
        self.status.exit_code()
    }
}
