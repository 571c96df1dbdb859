//! The agent harness's durable facts and their fold.
//!
//! Owns [`AgentEvent`] — every fact an agent run appends to its journal, past tense — and
//! [`AgentState`], the pure fold of those facts (`AgentState::apply`). Every counter the
//! guard and the loop read (model calls, tool calls in total / per tool / per signature,
//! tokens, cost, schema corrections, turns without progress) and the conversation replayed
//! to the model are derived from the journal alone, so folding it after a crash restores
//! them exactly.
//!
//! # Ordering (reserve before spend)
//!
//! - `ModelCallReserved` is appended before the transport is called; `ModelAnswerRecorded`
//!   after. A reservation without an answer was consumed (the call may have been billed);
//!   a recorded answer is never requested again.
//! - `ToolCallReserved` is appended before the intent gate and the tool body run; exactly one
//!   result event follows for each call id (`ToolResultRecorded`, `ToolCallRefused`,
//!   `SchemaCorrectionCounted` or `UnknownToolCounted`). A reservation found without a result
//!   on resume still consumed its budget: an effect tool's call goes back through guard
//!   steps 8–11 (its intent key is stable, so the spine finds the same intent and never
//!   resends blindly); a read tool's call is recorded `interrupted`.
//! - A run suspended awaiting approval records nothing: its effect call stays reserved
//!   without a result until the resume.
//! - A delegation call's `ToolCallReserved` and its sub-agent's start (`Delegated` holding
//!   its `AgentRunStarted`: the carve) are one batch, before the sub-agent's first model
//!   call; the sub-agent's facts follow, each wrapped in `Delegated`, then the call's one
//!   `ToolResultRecorded` (its conclusion). The fold holds the carve against the parent's
//!   budgets until the sub-agent stops, then what it committed.
//! - `RunStopped` is the last event of a run.
//!
//! An event variant is never edited once released; add a new one.

use super::budget::{AgentLimits, ModelCost};
use super::model::{Message, ModelResponse, ResponseBlock, ToolResultBlock};
use super::outcome::{AgentStatus, ControlEvent, RunOutcome};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The version of a tool a run was started with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolStamp {
    /// Tool name.
    pub name: String,
    /// Tool version.
    pub version: String,
    /// Fingerprint of its schema's canonical JSON.
    pub schema_fingerprint: String,
}

/// Why arguments were refused at the schema step (a correction the model may make).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionCode {
    /// Not JSON at all: a protocol error, never guessed at.
    MalformedArguments,
    /// JSON cut before its end: a protocol error, never completed by guessing.
    TruncatedArguments,
    /// JSON that does not bind to the strict schema (unknown property, wrong type, missing field).
    InvalidArguments,
    /// Several tool calls of one answer share a call id: results are matched to calls by id,
    /// so none of the answer's calls is executed (a protocol error, never a silent drop).
    ReusedCallId,
}

impl CorrectionCode {
    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::MalformedArguments => "malformed_arguments",
            Self::TruncatedArguments => "truncated_arguments",
            Self::InvalidArguments => "invalid_arguments",
            Self::ReusedCallId => "reused_call_id",
        }
    }
}

/// How an admitted tool call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcome {
    /// The body returned a result.
    Succeeded,
    /// The body returned an error result.
    Failed,
    /// The body reported an effect whose outcome is ambiguous.
    Unknown,
    /// The body was interrupted (deadline, cancellation, crash) after its reservation.
    Interrupted,
    /// The call never reached the body (unknown tool, schema, invariant, gate, approval).
    Refused,
}

/// What a model call holds against the run's budgets from its reservation until its answer
/// settles it from `usage`: the request's size as an input-token bound, its output-token cap,
/// and their cost at the dearest price of the run's table. A call whose answer is lost (a
/// crash, a failure, an answer too large to keep) keeps its hold: it may have been billed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallHold {
    /// Input tokens held: the request's size in bytes (every token covers at least one).
    pub input_tokens: u64,
    /// Output tokens held: the request's output cap.
    pub output_tokens: u64,
    /// Cost held, minor units; `None` when the price table is empty (the call is unbounded).
    pub cost_minor: Option<i64>,
}

/// One durable fact of an agent run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
#[allow(
    clippy::large_enum_variant,
    reason = "AgentRunStarted, the largest, is one per run and is built and folded a handful of times: \
              boxing its limits would cost every reader a deref for no measurable gain"
)]
pub enum AgentEvent {
    /// The run started: its limits, absolute deadline, grants and tools are fixed here.
    AgentRunStarted {
        /// Run id.
        run_id: String,
        /// Workflow name (e.g. `ticket-review`).
        workflow: String,
        /// When it started.
        started_at: DateTime<Utc>,
        /// Absolute deadline, fixed once.
        deadline: DateTime<Utc>,
        /// Every bound of the run.
        limits: AgentLimits,
        /// Capabilities granted to this run.
        capabilities: BTreeSet<String>,
        /// The tools visible to the model, with their versions.
        tools: Vec<ToolStamp>,
        /// System instructions.
        system: String,
        /// The user's request.
        prompt: String,
        /// Fingerprint of the script the transport replays (a transcript), when it replays
        /// one: a resume with another script stops `nondeterministic_replay`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<String>,
    },
    /// A model call was reserved; the transport is called after this is durable.
    ModelCallReserved {
        /// 1-based call number.
        call: u32,
        /// What the call holds until its answer settles it (absent in runs written before
        /// calls held anything).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hold: Option<CallHold>,
    },
    /// A model answer was received and recorded; it is never requested again.
    ModelAnswerRecorded {
        /// The call it answers.
        call: u32,
        /// The normalised answer.
        response: ModelResponse,
        /// Its cost in minor units, `None` when the model has no price.
        cost_minor: Option<i64>,
    },
    /// The reserved model call failed (the reservation stays consumed).
    ModelCallFailed {
        /// The call that failed.
        call: u32,
        /// Human detail (never a key).
        detail: String,
    },
    /// The model named a tool that is not in the run's registry (error result, counted).
    UnknownToolCounted {
        /// Call id.
        call_id: String,
        /// The name it used, cut to `AGENT_TOOL_NAME_MAX_CHARS`.
        name: String,
        /// Unknown tools so far.
        count: u32,
        /// The error result the model reads.
        message: String,
    },
    /// Arguments were refused at the schema step (error result, counted as a correction).
    SchemaCorrectionCounted {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// Why.
        code: CorrectionCode,
        /// Schema corrections so far (unknown tools included).
        count: u32,
        /// The error result the model reads.
        message: String,
    },
    /// The call was refused after binding (invariant, intent gate, approval): an error result.
    ToolCallRefused {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// Stable code, e.g. `invariant_violated`, `intent_payload_mismatch`, `approval_denied`.
        code: String,
        /// The error result the model reads.
        message: String,
    },
    /// A tool attempt was admitted and its counters reserved, before the body runs.
    ToolCallReserved {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// SHA-256 of the canonical signature (tool name + canonical bound arguments).
        signature: String,
        /// Tool attempts in the run, this one included.
        total: u32,
        /// Attempts of this tool, this one included.
        per_tool: u32,
        /// Attempts of this signature, this one included.
        per_signature: u32,
        /// Money the call's effect may move (its intent's amount), minor units, when it moves
        /// money: what a money cap counts, from the journal, unless the call is then refused
        /// (absent in runs written before calls counted it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        money_minor: Option<i64>,
    },
    /// An admitted tool call ended; its result is what the model reads.
    ToolResultRecorded {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// How it ended.
        outcome: ToolOutcome,
        /// What the model reads (wrapped as untrusted data when it came from a third party).
        content: String,
        /// Where third-party text came from, when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provenance: Option<String>,
        /// The result is new evidence or a state change.
        progress: bool,
    },
    /// Every tool call of a turn got its result.
    TurnEnded {
        /// The model call whose answer the turn answered.
        call: u32,
        /// Some result of the turn made progress.
        progress: bool,
        /// Consecutive turns without progress, this one included.
        without_progress: u32,
    },
    /// A reserved effect call's intent awaits a human decision: the run suspends and its
    /// working time stops. The wait is bounded: past `closes_at` without a decision the run
    /// stops `deadline_exceeded` and the intent is released. Recorded once per wait, never
    /// per poll.
    ApprovalAwaited {
        /// The reserved call.
        call_id: String,
        /// The intent a human must approve or deny.
        intent_key: String,
        /// When the wait began.
        since: DateTime<Utc>,
        /// When the approval window closes.
        closes_at: DateTime<Utc>,
    },
    /// A human decided (approved or denied) on a call's intent: the run's working time goes
    /// on, its deadline moved by the time spent waiting.
    ApprovalWaitEnded {
        /// The call that waited.
        call_id: String,
        /// The run's new absolute deadline.
        deadline: DateTime<Utc>,
    },
    /// A fact of the sub-agent a delegation call started (`call_id`, reserved without a
    /// result in the open turn), kept on its parent's journal. Its first fact is the
    /// sub-agent's `AgentRunStarted`, recorded in the batch of the call's `ToolCallReserved`:
    /// its limits are the carve, held against the parent's budgets before the sub-agent makes
    /// any call. A sub-agent delegates nothing.
    Delegated {
        /// The delegation call.
        call_id: String,
        /// The sub-agent's fact.
        fact: Box<AgentEvent>,
    },
    /// The run ended. Always the last event.
    RunStopped {
        /// How.
        status: AgentStatus,
        /// `model`, a tool name, or `run`.
        subject: String,
        /// The count of the dimension that stopped it.
        count: u64,
        /// Why, for humans (never arguments or secrets).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// The model's final text (completed / incomplete).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
    },
}

impl AgentEvent {
    /// The event's type name, as stored.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::AgentRunStarted { .. } => "AgentRunStarted",
            Self::ModelCallReserved { .. } => "ModelCallReserved",
            Self::ModelAnswerRecorded { .. } => "ModelAnswerRecorded",
            Self::ModelCallFailed { .. } => "ModelCallFailed",
            Self::UnknownToolCounted { .. } => "UnknownToolCounted",
            Self::SchemaCorrectionCounted { .. } => "SchemaCorrectionCounted",
            Self::ToolCallRefused { .. } => "ToolCallRefused",
            Self::ToolCallReserved { .. } => "ToolCallReserved",
            Self::ToolResultRecorded { .. } => "ToolResultRecorded",
            Self::TurnEnded { .. } => "TurnEnded",
            Self::ApprovalAwaited { .. } => "ApprovalAwaited",
            Self::ApprovalWaitEnded { .. } => "ApprovalWaitEnded",
            Self::Delegated { .. } => "Delegated",
            Self::RunStopped { .. } => "RunStopped",
        }
    }
}

/// The fixed part of a run, from `AgentRunStarted`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunHeader {
    /// Run id.
    pub run_id: String,
    /// Workflow name.
    pub workflow: String,
    /// Start instant.
    pub started_at: DateTime<Utc>,
    /// Absolute deadline.
    pub deadline: DateTime<Utc>,
    /// Limits.
    pub limits: AgentLimits,
    /// Granted capabilities.
    pub capabilities: BTreeSet<String>,
    /// Tools and versions.
    pub tools: Vec<ToolStamp>,
    /// System instructions.
    pub system: String,
    /// User request.
    pub prompt: String,
    /// Fingerprint of the script the run started with.
    pub script: Option<String>,
}

/// One recorded tool result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedResult {
    /// Call id.
    pub call_id: String,
    /// Tool name (as the model wrote it, for unknown tools).
    pub tool: String,
    /// How it ended.
    pub outcome: ToolOutcome,
    /// What the model reads.
    pub content: String,
    /// The result is new evidence or a state change.
    pub progress: bool,
}

/// One model answer and the results of its tool calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// The model call it answers.
    pub call: u32,
    /// The recorded answer.
    pub response: ModelResponse,
    /// Results, in the order they were recorded.
    pub results: Vec<RecordedResult>,
    /// Call ids reserved by the guard.
    pub reserved: BTreeSet<String>,
    /// `TurnEnded` was recorded.
    pub ended: bool,
}

impl Turn {
    /// True when `call_id` already has a result.
    pub fn has_result(&self, call_id: &str) -> bool {
        self.results.iter().any(|r| r.call_id == call_id)
    }
}

/// One call's wait for a human decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalWait {
    /// The intent awaiting approval.
    pub intent_key: String,
    /// When the current wait began.
    pub since: DateTime<Utc>,
    /// When the approval window closes.
    pub closes_at: DateTime<Utc>,
    /// A decision ended the current wait.
    pub ended: bool,
}

/// How the run stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopRecord {
    /// Status.
    pub status: AgentStatus,
    /// Detail.
    pub detail: Option<String>,
    /// Final text.
    pub text: Option<String>,
}

/// The fold of an agent run's journal. Pure: `apply` is the only way it changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentState {
    /// The fixed part, once started.
    pub header: Option<RunHeader>,
    /// Model calls reserved.
    pub model_calls: u32,
    /// Model answers recorded.
    pub answers: u32,
    /// Tool attempts admitted.
    pub tool_calls: u32,
    /// Tool attempts admitted, per tool.
    pub tool_calls_by_tool: BTreeMap<String, u32>,
    /// Admitted attempts per signature hash.
    pub signatures: BTreeMap<String, u32>,
    /// Unknown tools proposed.
    pub unknown_tools: u32,
    /// Schema corrections (unknown tools included).
    pub schema_corrections: u32,
    /// Calls refused after binding.
    pub refusals: u32,
    /// Input tokens of the answered calls (a count the vendor did not give is the call's hold).
    pub input_tokens: u64,
    /// Output tokens of the answered calls (likewise).
    pub output_tokens: u64,
    /// Cost of the answered calls, minor units (an unpriced answer counts its hold).
    pub cost_minor: i64,
    /// Answers from models without a price.
    pub unpriced_answers: u32,
    /// Answers whose usage was unknown (absent or invalid), in either count.
    pub unknown_usage_answers: u32,
    /// Holds of the calls not settled by an answer: in flight, failed, or lost to a crash.
    pub holds: BTreeMap<u32, CallHold>,
    /// Consecutive turns without progress.
    pub without_progress: u32,
    /// Every recorded answer with its results.
    pub turns: Vec<Turn>,
    /// Ordered control events.
    pub control: Vec<ControlEvent>,
    /// Set once `RunStopped` is recorded.
    pub stop: Option<StopRecord>,
    /// Waits for a human decision, by call id.
    pub approval_waits: BTreeMap<String, ApprovalWait>,
    /// The sub-agents the run started, folded, by the call id of their delegation.
    pub delegations: BTreeMap<String, AgentState>,
    /// Money each admitted effect call may move, by model call and call id: every one the
    /// guard reserved and nothing refused (a declined or unknown one included — the fold
    /// cannot tell a decline from an effect, so a cap counts what was asked for).
    money: BTreeMap<(u32, String), i64>,
    events: u64,
}

/// What a run's sub-agents hold of its budgets: a running one its whole carve (its limits),
/// a stopped one what it committed — its calls, its tokens and cost spent and still held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carved {
    /// Model calls.
    pub model_calls: u32,
    /// Tool attempts.
    pub tool_calls: u32,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Model cost, minor units.
    pub cost_minor: i64,
    /// Money its effect tools may move, minor units.
    pub money_minor: i64,
}

impl Carved {
    fn add(self, other: Self) -> Self {
        Self {
            model_calls: self.model_calls.saturating_add(other.model_calls),
            tool_calls: self.tool_calls.saturating_add(other.tool_calls),
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cost_minor: self.cost_minor.saturating_add(other.cost_minor),
            money_minor: self.money_minor.saturating_add(other.money_minor),
        }
    }
}

impl AgentState {
    /// Folds a whole journal.
    pub fn from_events(events: &[AgentEvent]) -> Self {
        let mut state = Self::default();
        for event in events {
            state.apply(event);
        }
        state
    }

    /// The run header.
    ///
    /// # Panics
    /// Before `AgentRunStarted` was applied: callers only ask a started run.
    pub fn header(&self) -> &RunHeader {
        self.header.as_ref().expect("the run header exists: every caller folds AgentRunStarted first")
    }

    /// Applies one event. An impossible transition is a bug in the writer (or a corrupt
    /// journal): it panics with the event's position, since durable state makes restart safe.
    pub fn apply(&mut self, event: &AgentEvent) {
        if let Err(why) = self.try_apply(event) {
            panic!("{why}");
        }
    }

    /// Applies one event, or says why it is impossible after the events applied so far
    /// (naming its position). On `Err` the state is unusable: callers that check a batch
    /// before writing it (the ledger's `decide`) fold a copy and drop it.
    pub fn try_apply(&mut self, event: &AgentEvent) -> Result<(), String> {
        let position = self.events;
        self.events += 1;
        let name = event.type_name();
        macro_rules! ensure {
            ($cond:expr, $($why:tt)+) => {
                if !($cond) {
                    return Err(format!($($why)+));
                }
            };
        }
        ensure!(self.stop.is_none(), "agent journal position {position}: {name} after RunStopped");
        if !matches!(event, AgentEvent::AgentRunStarted { .. }) {
            ensure!(self.header.is_some(), "agent journal position {position}: {name} before AgentRunStarted");
        }
        match event {
            AgentEvent::AgentRunStarted {
                run_id,
                workflow,
                started_at,
                deadline,
                limits,
                capabilities,
                tools,
                system,
                prompt,
                script,
            } => {
                ensure!(self.header.is_none(), "agent journal position {position}: a second AgentRunStarted");
                self.header = Some(RunHeader {
                    run_id: run_id.clone(),
                    workflow: workflow.clone(),
                    started_at: *started_at,
                    deadline: *deadline,
                    limits: limits.clone(),
                    capabilities: capabilities.clone(),
                    tools: tools.clone(),
                    system: system.clone(),
                    prompt: prompt.clone(),
                    script: script.clone(),
                });
            }
            AgentEvent::ModelCallReserved { call, hold } => {
                ensure!(*call == self.model_calls + 1, "agent journal position {position}: model call out of order");
                ensure!(
                    self.turns.last().is_none_or(|t| t.ended || t.response.tool_calls().is_empty()),
                    "agent journal position {position}: model call reserved while a turn is open"
                );
                self.model_calls = *call;
                if let Some(hold) = hold {
                    self.holds.insert(*call, *hold);
                }
                self.push_control("model_call", "model", u64::from(*call));
            }
            AgentEvent::ModelAnswerRecorded { call, response, cost_minor } => {
                ensure!(*call == self.model_calls, "agent journal position {position}: answer to an unreserved call");
                ensure!(
                    self.turns.last().is_none_or(|t| t.call < *call),
                    "agent journal position {position}: second answer to call {call}"
                );
                self.answers += 1;
                // The answer settles the call's hold; what the vendor did not tell stays held.
                let held = self.holds.remove(call).unwrap_or_default();
                let usage = response.usage;
                self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens.unwrap_or(held.input_tokens));
                self.output_tokens =
                    self.output_tokens.saturating_add(usage.output_tokens.unwrap_or(held.output_tokens));
                if usage.is_unknown() {
                    self.unknown_usage_answers += 1;
                }
                match cost_minor {
                    Some(cost) => self.cost_minor = self.cost_minor.saturating_add(*cost),
                    None => {
                        self.unpriced_answers += 1;
                        self.cost_minor = self.cost_minor.saturating_add(held.cost_minor.unwrap_or(0));
                    }
                }
                self.turns.push(Turn {
                    call: *call,
                    response: response.clone(),
                    results: Vec::new(),
                    reserved: BTreeSet::new(),
                    ended: false,
                });
            }
            AgentEvent::ModelCallFailed { call, .. } => {
                ensure!(*call == self.model_calls, "agent journal position {position}: failure of an unreserved call");
            }
            AgentEvent::UnknownToolCounted { call_id, name, count, message } => {
                ensure!(*count == self.unknown_tools + 1, "agent journal position {position}: unknown-tool count");
                self.unknown_tools = *count;
                self.schema_corrections += 1;
                self.push_control("unknown_tool", name, u64::from(*count));
                self.push_result(position, call_id, name, ToolOutcome::Refused, message, false)?;
            }
            AgentEvent::SchemaCorrectionCounted { call_id, tool, count, message, .. } => {
                ensure!(*count == self.schema_corrections + 1, "agent journal position {position}: correction count");
                self.schema_corrections = *count;
                self.push_control("schema_correction", tool, u64::from(*count));
                self.push_result(position, call_id, tool, ToolOutcome::Refused, message, false)?;
            }
            AgentEvent::ToolCallRefused { call_id, tool, code, message } => {
                // A reserved call refused (by the ledger, a human, a missing gate) moved nothing.
                if let Some(turn) = self.turns.last() {
                    self.money.remove(&(turn.call, call_id.clone()));
                }
                self.refusals += 1;
                self.push_control(code, tool, u64::from(self.refusals));
                self.push_result(position, call_id, tool, ToolOutcome::Refused, message, false)?;
            }
            AgentEvent::ToolCallReserved { call_id, tool, signature, total, per_tool, per_signature, money_minor } => {
                ensure!(*total == self.tool_calls + 1, "agent journal position {position}: tool count");
                let tool_count = self.tool_calls_by_tool.entry(tool.clone()).or_default();
                ensure!(*per_tool == *tool_count + 1, "agent journal position {position}: per-tool count");
                *tool_count = *per_tool;
                let signature_count = self.signatures.entry(signature.clone()).or_default();
                ensure!(*per_signature == *signature_count + 1, "agent journal position {position}: signature count");
                *signature_count = *per_signature;
                self.tool_calls = *total;
                let turn = self.open_turn(position, call_id)?;
                ensure!(
                    turn.reserved.insert(call_id.clone()),
                    "agent journal position {position}: call reserved twice"
                );
                let model_call = turn.call;
                if let Some(amount) = money_minor {
                    ensure!(*amount >= 0, "agent journal position {position}: a negative amount of money");
                    self.money.insert((model_call, call_id.clone()), *amount);
                }
                self.push_control("tool_call", tool, u64::from(*total));
            }
            AgentEvent::ToolResultRecorded { call_id, tool, outcome, content, progress, .. } => {
                let turn = self.open_turn(position, call_id)?;
                ensure!(
                    turn.reserved.contains(call_id),
                    "agent journal position {position}: result of a call the guard never admitted"
                );
                self.push_result(position, call_id, tool, *outcome, content, *progress)?;
            }
            AgentEvent::TurnEnded { call, progress, without_progress } => {
                let expected = if *progress { 0 } else { self.without_progress + 1 };
                ensure!(*without_progress == expected, "agent journal position {position}: progress count");
                self.without_progress = *without_progress;
                let Some(turn) = self.turns.last_mut() else {
                    return Err(format!("agent journal position {position}: TurnEnded before any answer"));
                };
                ensure!(turn.call == *call, "agent journal position {position}: TurnEnded for another call");
                let answered = turn.response.tool_calls().iter().all(|c| turn.has_result(&c.id));
                ensure!(answered, "agent journal position {position}: turn ended with a call unanswered");
                turn.ended = true;
            }
            AgentEvent::ApprovalAwaited { call_id, intent_key, since, closes_at } => {
                let turn = self.open_turn(position, call_id)?;
                ensure!(
                    turn.reserved.contains(call_id) && !turn.has_result(call_id),
                    "agent journal position {position}: a wait for a call that is not reserved without a result"
                );
                ensure!(
                    self.approval_waits.get(call_id).is_none_or(|w| w.ended),
                    "agent journal position {position}: a second wait while one is open"
                );
                ensure!(since < closes_at, "agent journal position {position}: an approval window that closes first");
                self.approval_waits.insert(
                    call_id.clone(),
                    ApprovalWait { intent_key: intent_key.clone(), since: *since, closes_at: *closes_at, ended: false },
                );
            }
            AgentEvent::ApprovalWaitEnded { call_id, deadline } => {
                let Some(wait) = self.approval_waits.get_mut(call_id).filter(|w| !w.ended) else {
                    return Err(format!("agent journal position {position}: the end of a wait that is not open"));
                };
                wait.ended = true;
                let header = self.header.as_mut().expect("checked above: every event but the first follows the header");
                ensure!(*deadline >= header.deadline, "agent journal position {position}: a deadline moved back");
                header.deadline = *deadline;
            }
            AgentEvent::Delegated { call_id, fact } => self.apply_delegated(position, call_id, fact)?,
            AgentEvent::RunStopped { status, subject, count, detail, text } => {
                ensure!(
                    !matches!(status, AgentStatus::AwaitingApproval | AgentStatus::Terminated),
                    "agent journal position {position}: {} is a pause, not a stop",
                    status.as_str()
                );
                if status.is_controlled_stop() {
                    self.push_control(status.as_str(), subject, *count);
                }
                self.stop = Some(StopRecord { status: *status, detail: detail.clone(), text: text.clone() });
            }
        }
        Ok(())
    }

    /// Folds a sub-agent's fact: its start is checked against what the parent had left, so
    /// a carve never exceeds the parent's budgets nor is made twice for one call.
    fn apply_delegated(&mut self, position: u64, call_id: &str, fact: &AgentEvent) -> Result<(), String> {
        let at = |why: String| format!("agent journal position {position}: sub-agent of call {call_id}: {why}");
        if matches!(fact, AgentEvent::Delegated { .. }) {
            return Err(at("a sub-agent delegates nothing".into()));
        }
        let turn = self.open_turn(position, call_id)?;
        if !turn.reserved.contains(call_id) || turn.has_result(call_id) {
            return Err(at("its call is not reserved without a result".into()));
        }
        if let AgentEvent::AgentRunStarted { limits, deadline, .. } = fact {
            if self.delegations.contains_key(call_id) {
                return Err(at("carved twice".into()));
            }
            let max = self.header().limits.delegations_max();
            if self.delegations.len() >= max as usize {
                return Err(at(format!("past delegations_max = {max}")));
            }
            if limits.delegations_max != Some(0) {
                return Err(at("a sub-agent may start no sub-agent of its own".into()));
            }
            if *deadline > self.header().deadline {
                return Err(at("its deadline is past its parent's".into()));
            }
            if let Some(over) = self.over_carve(limits) {
                return Err(at(over));
            }
        }
        let Some(child) = self.delegations.get_mut(call_id) else {
            if !matches!(fact, AgentEvent::AgentRunStarted { .. }) {
                return Err(at("a fact before its start".into()));
            }
            let mut child = AgentState::default();
            child.try_apply(fact).map_err(at)?;
            self.delegations.insert(call_id.to_owned(), child);
            return Ok(());
        };
        child.try_apply(fact).map_err(at)
    }

    /// Which dimension of a carve exceeds what the run has left, if one does.
    fn over_carve(&self, carve: &AgentLimits) -> Option<String> {
        let limits = &self.header().limits;
        let over = |dimension: &str, asked: u64, left: u64| {
            (asked > left).then(|| format!("a carve of {asked} {dimension} with {left} left"))
        };
        let left = |max: u64, committed: u64| max.saturating_sub(committed);
        over(
            "model calls",
            carve.model_calls_max.into(),
            left(limits.model_calls_max.into(), self.model_calls_committed().into()),
        )
        .or_else(|| {
            over(
                "tool calls",
                carve.tool_calls_max.into(),
                left(limits.tool_calls_max.into(), self.tool_calls_committed().into()),
            )
        })
        .or_else(|| {
            let max = limits.input_tokens_max?;
            over("input tokens", carve.input_tokens_max.unwrap_or(u64::MAX), left(max, self.input_tokens_committed()))
        })
        .or_else(|| {
            let max = limits.output_tokens_max?;
            over(
                "output tokens",
                carve.output_tokens_max.unwrap_or(u64::MAX),
                left(max, self.output_tokens_committed()),
            )
        })
        .or_else(|| {
            let max = limits.cost_minor_max?;
            let asked = carve.cost_minor_max.map_or(u64::MAX, |c| u64::try_from(c).unwrap_or(0));
            let committed = u64::try_from(self.cost_committed_minor()).unwrap_or(0);
            over("cost minor units", asked, left(u64::try_from(max).unwrap_or(0), committed))
        })
        .or_else(|| {
            // Against the run's own cap; what its spine run has left is the spine's to check,
            // at every reservation.
            let max = limits.money_minor_max?;
            let asked = carve.money_minor_max.map_or(u64::MAX, |m| u64::try_from(m).unwrap_or(0));
            let committed = u64::try_from(self.money_committed_minor()).unwrap_or(0);
            over("money minor units", asked, left(u64::try_from(max).unwrap_or(0), committed))
        })
    }

    /// What the run's sub-agents hold of its budgets (see [`Carved`]).
    pub fn carved(&self) -> Carved {
        self.delegations.values().fold(Carved::default(), |sum, child| {
            let limits = &child.header().limits;
            let held = match child.stop {
                Some(_) => Carved {
                    model_calls: child.model_calls,
                    tool_calls: child.tool_calls,
                    input_tokens: child.input_tokens_committed(),
                    output_tokens: child.output_tokens_committed(),
                    cost_minor: child.cost_committed_minor(),
                    money_minor: child.money_committed_minor(),
                },
                None => Carved {
                    model_calls: limits.model_calls_max,
                    tool_calls: limits.tool_calls_max,
                    input_tokens: limits.input_tokens_max.unwrap_or_else(|| child.input_tokens_committed()),
                    output_tokens: limits.output_tokens_max.unwrap_or_else(|| child.output_tokens_committed()),
                    cost_minor: limits.cost_minor_max.unwrap_or_else(|| child.cost_committed_minor()),
                    money_minor: limits.money_minor_max.unwrap_or_else(|| child.money_committed_minor()),
                },
            };
            sum.add(held)
        })
    }

    /// Model calls reserved by the run and held by its sub-agents.
    pub fn model_calls_committed(&self) -> u32 {
        self.model_calls.saturating_add(self.carved().model_calls)
    }

    /// Tool attempts admitted by the run and held by its sub-agents.
    pub fn tool_calls_committed(&self) -> u32 {
        self.tool_calls.saturating_add(self.carved().tool_calls)
    }

    /// Model calls reserved by the run and by its sub-agents: what the run's transport was
    /// asked, or may have been.
    pub fn model_calls_made(&self) -> u32 {
        self.delegations.values().fold(self.model_calls, |sum, child| sum.saturating_add(child.model_calls))
    }

    /// Model cost of the answered calls of the run and of its sub-agents: what the spine
    /// records as the run's model cost when it finishes. Unknown once any of those answers
    /// came from a model without a price — what such an answer holds (its call's hold) bounds
    /// the budgets, but it is no measure of what the vendor billed.
    pub fn model_cost(&self) -> ModelCost {
        let unpriced_answers = self
            .delegations
            .values()
            .fold(self.unpriced_answers, |sum, child| sum.saturating_add(child.unpriced_answers));
        let priced = self.delegations.values().fold(self.cost_minor, |sum, child| sum.saturating_add(child.cost_minor));
        ModelCost { cost_minor: (unpriced_answers == 0).then_some(priced), unpriced_answers }
    }

    /// Tool attempts admitted by the run and by its sub-agents.
    pub fn tool_calls_made(&self) -> u32 {
        self.delegations.values().fold(self.tool_calls, |sum, child| sum.saturating_add(child.tool_calls))
    }

    /// Answers recorded by the run and by its sub-agents, in the order the transport gave
    /// them: what a replayed script has already given.
    pub fn answers_made(&self) -> u32 {
        self.delegations.values().fold(self.answers, |sum, child| sum.saturating_add(child.answers))
    }

    fn push_control(&mut self, kind: &str, name: &str, count: u64) {
        self.control.push(ControlEvent { kind: kind.to_owned(), name: name.to_owned(), count });
    }

    fn open_turn(&mut self, position: u64, call_id: &str) -> Result<&mut Turn, String> {
        let Some(turn) = self.turns.last_mut() else {
            return Err(format!("agent journal position {position}: tool event before any answer"));
        };
        if turn.ended {
            return Err(format!("agent journal position {position}: tool event after its turn ended"));
        }
        if !turn.response.tool_calls().iter().any(|c| c.id == call_id) {
            return Err(format!(
                "agent journal position {position}: tool event for a call id the answer does not hold"
            ));
        }
        Ok(turn)
    }

    fn push_result(
        &mut self,
        position: u64,
        call_id: &str,
        tool: &str,
        outcome: ToolOutcome,
        content: &str,
        progress: bool,
    ) -> Result<(), String> {
        let turn = self.open_turn(position, call_id)?;
        if turn.has_result(call_id) {
            return Err(format!("agent journal position {position}: second result for one call id"));
        }
        turn.results.push(RecordedResult {
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            outcome,
            content: content.to_owned(),
            progress,
        });
        Ok(())
    }

    /// Input tokens spent and held: the answered calls' plus every unsettled hold, and what
    /// the run's sub-agents hold.
    pub fn input_tokens_committed(&self) -> u64 {
        let own = self.holds.values().fold(self.input_tokens, |sum, h| sum.saturating_add(h.input_tokens));
        own.saturating_add(self.carved().input_tokens)
    }

    /// Output tokens spent and held.
    pub fn output_tokens_committed(&self) -> u64 {
        let own = self.holds.values().fold(self.output_tokens, |sum, h| sum.saturating_add(h.output_tokens));
        own.saturating_add(self.carved().output_tokens)
    }

    /// Cost spent and held, minor units: what the run (its sub-agents included) may already
    /// owe its model vendor.
    pub fn cost_committed_minor(&self) -> i64 {
        let own = self.holds.values().fold(self.cost_minor, |sum, h| sum.saturating_add(h.cost_minor.unwrap_or(0)));
        own.saturating_add(self.carved().cost_minor)
    }

    /// Money the run's admitted effect calls may move, and what its sub-agents hold of it
    /// (see [`Carved`]), minor units: what a money cap counts. Folded from the journal, so a
    /// resumed run finds it spent.
    pub fn money_committed_minor(&self) -> i64 {
        let own = self.money.values().fold(0_i64, |sum, amount| sum.saturating_add(*amount));
        own.saturating_add(self.carved().money_minor)
    }

    /// The last turn, when it still has tool calls to answer or has not been closed.
    pub fn open_turn_ref(&self) -> Option<&Turn> {
        self.turns.last().filter(|t| !t.ended && !t.response.tool_calls().is_empty())
    }

    /// True when some recorded result of `tool` succeeded.
    pub fn tool_succeeded(&self, tool: &str) -> bool {
        self.results().any(|r| r.tool == tool && r.outcome == ToolOutcome::Succeeded)
    }

    /// Every recorded result, in order.
    pub fn results(&self) -> impl Iterator<Item = &RecordedResult> {
        self.turns.iter().flat_map(|t| t.results.iter())
    }

    /// The conversation to send to the model: the request, then each answer followed by the
    /// results of its tool calls in call order (one per call id).
    pub fn messages(&self) -> Vec<Message> {
        let mut messages = vec![Message::User { text: self.header().prompt.clone() }];
        for turn in &self.turns {
            if !turn.response.reused_call_ids().is_empty() {
                // Refused whole: replaying calls that share an id would be refused by the
                // vendor too, so the model reads its text and why none of its calls ran.
                messages.extend(refused_answer(turn));
                continue;
            }
            messages.push(Message::Assistant { content: turn.response.content.clone() });
            let calls = turn.response.tool_calls();
            if calls.is_empty() {
                continue;
            }
            let results = calls
                .iter()
                .filter_map(|call| {
                    turn.results.iter().find(|r| r.call_id == call.id).map(|r| ToolResultBlock {
                        call_id: r.call_id.clone(),
                        content: r.content.clone(),
                        is_error: r.outcome != ToolOutcome::Succeeded,
                    })
                })
                .collect();
            messages.push(Message::ToolResults { results });
        }
        messages
    }

    /// The outcome, once stopped.
    pub fn outcome(&self) -> Option<RunOutcome> {
        let stop = self.stop.as_ref()?;
        Some(RunOutcome {
            status: stop.status,
            model_calls: self.model_calls_made(),
            tool_calls: self.tool_calls_made(),
            events: self.control.clone(),
            text: stop.text.clone(),
            detail: stop.detail.clone(),
            awaiting_approval: None,
        })
    }

    /// What a run paused by a graceful stop reports (nothing is recorded).
    pub fn terminated(&self) -> RunOutcome {
        RunOutcome {
            status: AgentStatus::Terminated,
            model_calls: self.model_calls_made(),
            tool_calls: self.tool_calls_made(),
            events: self.control.clone(),
            text: None,
            detail: Some(format!(
                "stopped by SIGTERM between two steps; every step is recorded: keel agent resume {} continues it",
                self.header().run_id
            )),
            awaiting_approval: None,
        }
    }

    /// How many facts were folded: the run's next agent position in the spine.
    pub fn events(&self) -> u32 {
        u32::try_from(self.events).expect("an agent run holds far fewer than u32::MAX facts: its budgets bound them")
    }

    /// The wait of `call_id` for a human decision, if it ever waited.
    pub fn approval_wait(&self, call_id: &str) -> Option<&ApprovalWait> {
        self.approval_waits.get(call_id)
    }

    /// What a run suspended on the approval of `intent_key` reports.
    pub fn suspended(&self, intent_key: &str) -> RunOutcome {
        RunOutcome {
            status: AgentStatus::AwaitingApproval,
            model_calls: self.model_calls_made(),
            tool_calls: self.tool_calls_made(),
            events: self.control.clone(),
            text: None,
            detail: Some(format!(
                "intent {intent_key} awaits a human decision: keel approve {intent_key} --by NAME (or keel deny), \
                 then keel agent resume {}",
                self.header().run_id
            )),
            awaiting_approval: Some(intent_key.to_owned()),
        }
    }

    /// The last answer's text blocks, if the last answer is a final one.
    pub fn final_text(&self) -> Option<String> {
        let turn = self.turns.last()?;
        let has_text = turn.response.content.iter().any(|b| matches!(b, ResponseBlock::Text { .. }));
        has_text.then(|| turn.response.text())
    }
}

/// How an answer refused for reusing call ids is replayed: its text, then the refusal.
fn refused_answer(turn: &Turn) -> [Message; 2] {
    let mut content: Vec<ResponseBlock> =
        turn.response.content.iter().filter(|b| matches!(b, ResponseBlock::Text { .. })).cloned().collect();
    if content.is_empty() {
        content.push(ResponseBlock::Text { text: "(tool calls that reused call ids)".into() });
    }
    let refusals: Vec<&str> = turn.results.iter().map(|r| r.content.as_str()).collect();
    [Message::Assistant { content }, Message::User { text: refusals.join("\n") }]
}
