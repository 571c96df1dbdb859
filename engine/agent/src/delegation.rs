//! Sub-agents exposed as tools: a delegation (seed 002's "sous-agent", seed 004's
//! "nombre maximal de délégations").
//!
//! Owns [`Delegation`] — a sub-agent: its own [`Registry`], instructions, the limits it asks
//! for and its host's completion condition —, the argument a model gives it
//! ([`DelegateArgs`]: one question), the carve (guard step 7b, [`carve`]) and step 10 of a
//! delegation call ([`answer`]): the sub-agent's bounded loop, whose conclusion is the
//! call's result.
//!
//! # The carve is durable before the sub-agent starts
//!
//! A delegation call passes guard steps 1–7 like any tool (capability, schema, tool budget,
//! repetition). Then the run's delegation count is checked (past `delegations_max` the run
//! stops `delegation_budget`) and the sub-agent's limits are carved: what it asks for,
//! clamped to what its parent has left of every dimension — model calls, tool calls, input
//! and output tokens, model cost, time (its deadline is never past its parent's), and the
//! money its effects may move: what it asks for, clamped to what the spine run has left of
//! its money budget (read through the gate just before) and to the parent's own cap. Its
//! `AgentRunStarted`, those limits included, is recorded (as a `Delegated` fact) in the same
//! batch as the call's `ToolCallReserved`, before the sub-agent's first model call; from then
//! on the parent's state counts the whole carve as committed, and once the sub-agent stops,
//! what it really committed (`AgentState::carved`). The fold refuses a carve past what the
//! parent had left and a second carve for one call, so neither a crash nor a replay refills
//! a budget: a resumed run folds the same carve and the sub-agent's own journal back. The
//! money a sub-agent's effect calls may move is recorded with each call's reservation and
//! counted against its carve by the guard (step 7c), before the gate reserves the intent: a
//! refund past it is refused `budget_exhausted`, and a resume counts what the journal holds.
//! (The fold checks a money carve against the parent's own cap only; what the spine run had
//! left is the spine's, which checks every reservation against the run's budget anyway.)
//!
//! # What a sub-agent is
//!
//! A complete loop with an empty history: its conversation starts from the question alone,
//! it never sees its parent's. Its facts live on its parent's journal (one stream, one
//! lease, one commit per batch), so its recorded model answers are never asked again on
//! resume; its transport is its parent's. Its effects go through the same guard and the same
//! [`crate::EffectGate`] under its parent's spine run: keys, fingerprints, the run's money
//! budget, approvals and reconciliation are the spine's. A sub-agent waiting for a human
//! suspends its parent (the parent's wait opens the approval window and ends with the
//! sub-agent's). Its conclusion comes back as the call's result, marked as a model's
//! unverified text.
//!
//! This module never runs a sub-agent's tool but through its registry's guard, never lets a
//! sub-agent start a sub-agent of its own (the registry refuses it, the fold too), and never
//! carves more than the parent has left.

use super::AgentError;
use super::budget::AgentLimits;
use super::event::{AgentEvent, AgentState, ToolOutcome};
use super::guard::{GuardedScope, Invoked, render_content, wait_for_approval};
use super::model::ToolCall;
use super::outcome::AgentStatus;
use super::registry::Registry;
use super::run_loop::{RunSpec, count_of, drive};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The provenance of a sub-agent's conclusion in its parent's conversation.
const CONCLUSION_PROVENANCE: &str = "sub-agent: a model's conclusion, unverified";

/// A sub-agent, registered as a tool with [`Registry::delegate`].
pub struct Delegation {
    pub(crate) registry: Registry,
    pub(crate) system: String,
    pub(crate) limits: AgentLimits,
    pub(crate) version: String,
    pub(crate) completion: Box<dyn Fn(&AgentState) -> bool + Send + Sync>,
}

impl Delegation {
    /// A sub-agent of contract `version` with its own tools, instructions, the limits it asks
    /// for (each clamped to what its parent has left when it starts) and its host's
    /// completion condition over its own facts.
    pub fn new(
        version: impl Into<String>,
        registry: Registry,
        system: impl Into<String>,
        limits: AgentLimits,
        completion: impl Fn(&AgentState) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self { registry, system: system.into(), limits, version: version.into(), completion: Box::new(completion) }
    }
}

/// A delegation's argument: the sub-agent knows nothing of the conversation, so the question
/// must say everything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateArgs {
    /// What the sub-agent is asked, whole.
    pub question: String,
}

impl DelegateArgs {
    /// The closed schema of a delegation tool.
    pub(crate) fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "question": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Everything the sub-agent needs: it sees nothing of this conversation."
                }
            },
            "required": ["question"],
            "additionalProperties": false
        })
    }
}

fn stop(status: AgentStatus, subject: &str, count: u64, detail: String) -> AgentEvent {
    AgentEvent::RunStopped { status, subject: subject.to_owned(), count, detail: Some(detail), text: None }
}

/// The smaller of two bounds, `None` being no bound.
fn smaller<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Guard step 7b for delegation call `call_id` of `tool`, whose reservation is not folded
/// yet: the sub-agent's `AgentRunStarted` (wrapped in `Delegated`), its limits carved out of
/// what `state` has left at `now` — its money out of `money_left`, what the spine run has
/// left of its money budget (`None`: it has none), and of the run's own cap; or the stop when
/// the run may start no sub-agent. Pure.
pub(crate) fn carve(
    state: &AgentState,
    delegation: &Delegation,
    (tool, call_id): (&str, &str),
    question: &str,
    (now, money_left): (DateTime<Utc>, Option<i64>),
) -> Result<AgentEvent, Box<AgentEvent>> {
    let header = state.header();
    let parent = &header.limits;
    let started = u32::try_from(state.delegations.len()).unwrap_or(u32::MAX);
    let max = parent.delegations_max();
    if started >= max {
        let detail = format!("{} started, delegations_max = {max}", count_of(started, "sub-agent"));
        return Err(Box::new(stop(AgentStatus::DelegationBudget, tool, started.into(), detail)));
    }
    let model_left = parent.model_calls_max.saturating_sub(state.model_calls_committed());
    if model_left == 0 {
        let detail = "no model call is left to carve for a sub-agent".to_owned();
        return Err(Box::new(stop(AgentStatus::ModelBudget, "model", state.model_calls_committed().into(), detail)));
    }
    // This call's own reservation is not folded yet: it is one of the tool calls spent.
    let tools_left = parent.tool_calls_max.saturating_sub(state.tool_calls_committed().saturating_add(1));
    let tokens_left = |max: Option<u64>, committed: u64| max.map(|max| max.saturating_sub(committed));
    let cost_left = parent.cost_minor_max.map(|max| max.saturating_sub(state.cost_committed_minor()).max(0));
    let own_money_left = parent.money_minor_max.map(|max| max.saturating_sub(state.money_committed_minor()).max(0));
    let asked = &delegation.limits;
    let deadline =
        engine::clock::checked_plus_ms(now, asked.deadline_ms).map_or(header.deadline, |d| d.min(header.deadline));
    let limits = AgentLimits {
        model_calls_max: asked.model_calls_max.min(model_left),
        tool_calls_max: asked.tool_calls_max.min(tools_left),
        input_tokens_max: smaller(
            asked.input_tokens_max,
            tokens_left(parent.input_tokens_max, state.input_tokens_committed()),
        ),
        output_tokens_max: smaller(
            asked.output_tokens_max,
            tokens_left(parent.output_tokens_max, state.output_tokens_committed()),
        ),
        cost_minor_max: smaller(asked.cost_minor_max, cost_left),
        money_minor_max: smaller(asked.money_minor_max, smaller(money_left.map(|left| left.max(0)), own_money_left)),
        deadline_ms: u64::try_from((deadline - now).num_milliseconds()).unwrap_or(0),
        delegations_max: Some(0),
        prices: parent.prices.clone(),
        ..asked.clone()
    };
    let start = AgentEvent::AgentRunStarted {
        run_id: format!("{}/{call_id}", header.run_id),
        workflow: tool.to_owned(),
        started_at: now,
        deadline,
        limits,
        capabilities: header.capabilities.clone(),
        tools: delegation.registry.stamps(),
        system: delegation.system.clone(),
        prompt: question.to_owned(),
        script: header.script.clone(),
    };
    Ok(AgentEvent::Delegated { call_id: call_id.to_owned(), fact: Box::new(start) })
}

/// Guard step 10 of a reserved delegation call: drives its sub-agent (started, or resumed
/// from the facts its parent's journal holds) to a stop, then records its conclusion as the
/// call's one result. A sub-agent suspended on an approval suspends the call; one paused by
/// SIGTERM leaves it reserved without a result.
pub(crate) async fn answer(
    scope: &mut GuardedScope<'_>,
    delegation: &Delegation,
    call: &ToolCall,
    tool: &str,
) -> Result<Invoked, AgentError> {
    let Some(transport) = scope.transport() else {
        let refused = AgentEvent::ToolCallRefused {
            call_id: call.id.clone(),
            tool: tool.to_owned(),
            code: "delegation_unavailable".into(),
            message: format!("{tool} cannot run: a sub-agent runs only inside an agent loop."),
        };
        scope.record(vec![refused]).await?;
        return Ok(Invoked::Recorded);
    };
    let header = scope
        .state()
        .delegations
        .get(&call.id)
        .expect("a reserved delegation call has its carve: both are recorded in one batch")
        .header()
        .clone();
    let spec = RunSpec {
        run_id: header.run_id,
        workflow: header.workflow,
        system: header.system,
        prompt: header.prompt,
        limits: header.limits,
        capabilities: header.capabilities,
        policy_version: None,
    };
    scope.focus(&call.id);
    let driven = Box::pin(drive(scope, transport, &delegation.registry, &spec, &*delegation.completion)).await;
    scope.unfocus();
    let outcome = driven?;
    match (outcome.status, outcome.awaiting_approval) {
        (AgentStatus::AwaitingApproval, Some(intent_key)) => {
            return wait_for_approval(scope, &call.id, tool, intent_key).await;
        }
        (AgentStatus::Terminated, _) => return Ok(Invoked::Recorded),
        _ => {}
    }
    let status = outcome.status;
    let content = json!({
        "sub_agent": tool,
        "status": status.as_str(),
        "conclusion": outcome.text,
        "detail": outcome.detail.filter(|_| status != AgentStatus::Completed),
        "model_calls": outcome.model_calls,
        "tool_calls": outcome.tool_calls,
    })
    .to_string();
    let result = match status {
        AgentStatus::Completed => ToolOutcome::Succeeded,
        AgentStatus::OutcomeUnknown => ToolOutcome::Unknown,
        _ => ToolOutcome::Failed,
    };
    let mut events = vec![AgentEvent::ToolResultRecorded {
        call_id: call.id.clone(),
        tool: tool.to_owned(),
        outcome: result,
        content: render_content(&content, Some(CONCLUSION_PROVENANCE)),
        provenance: Some(CONCLUSION_PROVENANCE.to_owned()),
        progress: status == AgentStatus::Completed,
    }];
    if result == ToolOutcome::Unknown {
        let detail = format!("an effect of the sub-agent {tool} is ambiguous");
        events.push(stop(AgentStatus::OutcomeUnknown, tool, scope.state().tool_calls.into(), detail));
    }
    scope.record(events).await?;
    Ok(Invoked::Recorded)
}
