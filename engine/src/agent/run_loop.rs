//! The agent loop: ask the model, let the guard dispose, repeat until a stop.
//!
//! Owns [`run`], which starts a run or resumes it from its journal, and [`RunSpec`].
//!
//! # Decisions come from the content
//!
//! After each recorded answer: output cut by the token limit (`max_tokens` / `length`) stops
//! the run `truncated` and none of its tool calls runs; an answer without tool calls is final
//! (whatever its stop reason, a missing one included) and the run is `completed` only when
//! the host's completion condition holds, else `incomplete` with the text kept; otherwise
//! every tool call goes through the guard and gets exactly one result, in the same turn,
//! matched by call id, before the next model call.
//!
//! # Resuming
//!
//! `run` folds the journal first. A recorded answer is never requested again; a call
//! reserved before a crash stays counted. A tool call reserved without a result consumed its
//! budget: a read tool's is recorded `interrupted`; an effect tool's goes back through guard
//! steps 8–11, where the spine finds the same intent (same key, same fingerprint) and knows
//! whether an attempt was sent — an attempt in flight at a crash is reconciled, never resent
//! blindly; an effect tool that cannot be continued stops the run `outcome_unknown`.
//!
//! # Suspending
//!
//! When an effect call's intent awaits a human approval, `run` returns `awaiting_approval`
//! (naming the intent key) without recording anything: the call stays reserved without a
//! result, and the next `run` of the same journal asks the gate again.

use super::AgentError;
use super::budget::AgentLimits;
use super::control::{Raced, race};
use super::event::{AgentEvent, AgentState, ToolOutcome};
use super::guard::{AgentEnv, GuardedScope, Invoked};
use super::model::{ModelRequest, ModelTransport, StopReason, ToolCall};
use super::outcome::{AgentStatus, RunOutcome};
use super::registry::{EffectClass, Registry};
use crate::clock::plus_ms;
use std::collections::BTreeSet;

/// What a new run starts with (ignored, apart from its id, when the journal already holds
/// the run: a restart never changes limits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// Run id.
    pub run_id: String,
    /// Workflow name.
    pub workflow: String,
    /// System instructions.
    pub system: String,
    /// The user's request.
    pub prompt: String,
    /// Limits.
    pub limits: AgentLimits,
    /// Granted capabilities.
    pub capabilities: BTreeSet<String>,
}

/// The host's own completion condition, over the run's recorded facts.
pub type Completion<'a> = &'a (dyn Fn(&AgentState) -> bool + Send + Sync);

/// Starts the run described by `spec`, or resumes it from `env.journal`, and drives it to a
/// stop. `Err` is an internal error (journal, fixture, registry drift): exit code 1.
pub async fn run(
    env: AgentEnv<'_>,
    transport: &dyn ModelTransport,
    registry: &Registry,
    spec: &RunSpec,
    completion: Completion<'_>,
) -> Result<RunOutcome, AgentError> {
    let mut scope = GuardedScope::open(env).await?;
    match &scope.state().header {
        None => {
            let now = env.clock.now();
            scope
                .record(vec![AgentEvent::AgentRunStarted {
                    run_id: spec.run_id.clone(),
                    workflow: spec.workflow.clone(),
                    started_at: now,
                    deadline: plus_ms(now, spec.limits.deadline_ms),
                    limits: spec.limits.clone(),
                    capabilities: spec.capabilities.clone(),
                    tools: registry.stamps(),
                    system: spec.system.clone(),
                    prompt: spec.prompt.clone(),
                }])
                .await?;
        }
        Some(header) => {
            if header.run_id != spec.run_id {
                return Err(AgentError::RunMismatch { expected: spec.run_id.clone(), found: header.run_id.clone() });
            }
            if header.tools != registry.stamps() {
                return Err(AgentError::RegistryChanged { run_id: header.run_id.clone() });
            }
        }
    }
    loop {
        if let Some(outcome) = scope.state().outcome() {
            return Ok(outcome);
        }
        if env.cancel.is_terminating() && !env.cancel.is_cancelled() {
            return Ok(scope.state().terminated());
        }
        if let Some(event) = conclusion(scope.state(), completion) {
            scope.record(vec![event]).await?;
            continue;
        }
        if scope.state().open_turn_ref().is_some() {
            if let Some(intent_key) = answer_turn(&mut scope, registry).await? {
                return Ok(scope.state().suspended(&intent_key));
            }
            continue;
        }
        if let Some(event) = before_model_call(&scope) {
            scope.record(vec![event]).await?;
            continue;
        }
        call_model(&mut scope, transport, registry).await?;
    }
}

/// The stop a recorded answer calls for by itself: truncation, or a final answer.
fn conclusion(state: &AgentState, completion: Completion<'_>) -> Option<AgentEvent> {
    let turn = state.turns.last().filter(|t| !t.ended)?;
    if turn.response.stop_reason == StopReason::MaxTokens {
        let cut = turn.response.tool_calls().len();
        return Some(AgentEvent::RunStopped {
            status: AgentStatus::Truncated,
            subject: "model".into(),
            count: u64::from(state.model_calls),
            detail: Some(format!("output cut by the token limit; {cut} tool call(s) in it were not executed")),
            text: None,
        });
    }
    if !turn.response.tool_calls().is_empty() {
        return None;
    }
    let text = state.final_text();
    let (status, detail) = if completion(state) {
        (AgentStatus::Completed, None)
    } else {
        (
            AgentStatus::Incomplete,
            Some("the model stopped and the host's completion condition does not hold".to_owned()),
        )
    };
    Some(AgentEvent::RunStopped { status, subject: "run".into(), count: u64::from(state.tool_calls), detail, text })
}

/// Gives every tool call of the open turn exactly one result, then closes the turn; or
/// returns the intent key a call awaits approval on, leaving the turn open.
async fn answer_turn(scope: &mut GuardedScope<'_>, registry: &Registry) -> Result<Option<String>, AgentError> {
    let turn = scope.state().open_turn_ref().expect("answer_turn is called with an open turn: checked by the loop");
    let call = turn.call;
    let calls = turn.response.tool_calls();
    for tool_call in calls {
        if scope.state().stop.is_some() || scope.env().cancel.is_terminating() {
            return Ok(None);
        }
        let turn = scope.state().turns.last().expect("the open turn is still the last one: only this loop appends");
        if turn.has_result(&tool_call.id) {
            continue;
        }
        let invoked = if turn.reserved.contains(&tool_call.id) {
            // Reserved, then the process died (or the run suspended) before its result.
            if let Some(invoked) = registry.resume_reserved(scope, &tool_call).await? {
                invoked
            } else {
                interrupted(scope, registry, &tool_call).await?;
                Invoked::Recorded
            }
        } else {
            registry.invoke(scope, &tool_call).await?
        };
        if let Invoked::AwaitingApproval { intent_key } = invoked {
            return Ok(Some(intent_key));
        }
    }
    if scope.state().stop.is_some() {
        return Ok(None);
    }
    let state = scope.state();
    let turn = state.turns.last().expect("the open turn is still the last one: only this loop appends");
    let progress = turn.results.iter().any(|r| r.progress);
    let without_progress = if progress { 0 } else { state.without_progress + 1 };
    scope.record(vec![AgentEvent::TurnEnded { call, progress, without_progress }]).await?;
    Ok(None)
}

/// Records a reserved call that cannot be continued as `interrupted`; for an effect tool the
/// run stops `outcome_unknown`.
async fn interrupted(
    scope: &mut GuardedScope<'_>,
    registry: &Registry,
    tool_call: &ToolCall,
) -> Result<(), AgentError> {
    let effect = registry.spec(&tool_call.name).map_or(EffectClass::Read, |s| s.effect);
    let mut events = vec![AgentEvent::ToolResultRecorded {
        call_id: tool_call.id.clone(),
        tool: tool_call.name.clone(),
        outcome: ToolOutcome::Interrupted,
        content: "interrupted by a restart before its result was recorded; its outcome is unknown.".into(),
        provenance: None,
        progress: false,
    }];
    if effect != EffectClass::Read {
        events.push(AgentEvent::RunStopped {
            status: AgentStatus::OutcomeUnknown,
            subject: tool_call.name.clone(),
            count: u64::from(scope.state().tool_calls),
            detail: Some(format!("{} was in flight when the run stopped", tool_call.name)),
            text: None,
        });
    }
    scope.record(events).await
}

/// The budget checks before a model call, in order: cancellation, deadline, model calls,
/// tokens, cost, progress.
fn before_model_call(scope: &GuardedScope<'_>) -> Option<AgentEvent> {
    let env = scope.env();
    let state = scope.state();
    let limits = &state.header().limits;
    let stop = |status: AgentStatus, subject: &str, count: u64, detail: String| AgentEvent::RunStopped {
        status,
        subject: subject.to_owned(),
        count,
        detail: Some(detail),
        text: None,
    };
    if env.cancel.is_cancelled() {
        return Some(stop(
            AgentStatus::Cancelled,
            "run",
            u64::from(state.model_calls),
            "cancelled by the caller".into(),
        ));
    }
    if env.clock.now() >= state.header().deadline {
        return Some(stop(
            AgentStatus::DeadlineExceeded,
            "run",
            limits.deadline_ms,
            "the run's deadline passed".into(),
        ));
    }
    if state.model_calls >= limits.model_calls_max {
        return Some(stop(
            AgentStatus::ModelBudget,
            "model",
            u64::from(state.model_calls),
            format!("{} model calls made", state.model_calls),
        ));
    }
    if limits.input_tokens_max.is_some_and(|max| state.input_tokens >= max) {
        return Some(stop(
            AgentStatus::TokenBudget,
            "input_tokens",
            state.input_tokens,
            "input token budget spent".into(),
        ));
    }
    if limits.output_tokens_max.is_some_and(|max| state.output_tokens >= max) {
        return Some(stop(
            AgentStatus::TokenBudget,
            "output_tokens",
            state.output_tokens,
            "output token budget spent".into(),
        ));
    }
    if let Some(max) = limits.cost_minor_max {
        let cost = u64::try_from(state.cost_minor).unwrap_or(0);
        if state.unpriced_answers > 0 {
            return Some(stop(
                AgentStatus::CostBudget,
                "model",
                cost,
                "a model answered that has no price: cost cannot be bounded".into(),
            ));
        }
        if state.cost_minor >= max {
            return Some(stop(AgentStatus::CostBudget, "model", cost, "cost budget spent".into()));
        }
    }
    if state.without_progress >= limits.no_progress_iterations_max {
        return Some(stop(
            AgentStatus::NoProgress,
            "run",
            u64::from(state.without_progress),
            format!("{} turns without progress", state.without_progress),
        ));
    }
    None
}

/// Reserves, sends, and records one model call.
async fn call_model(
    scope: &mut GuardedScope<'_>,
    transport: &dyn ModelTransport,
    registry: &Registry,
) -> Result<(), AgentError> {
    let call = scope.state().model_calls + 1;
    scope.record(vec![AgentEvent::ModelCallReserved { call }]).await?;
    let state = scope.state();
    let header = state.header();
    let request = ModelRequest {
        system: header.system.clone(),
        messages: state.messages(),
        tools: registry.descriptors(),
        max_output_tokens: header.limits.output_tokens_per_call,
    };
    let deadline = header.deadline;
    let env = scope.env();
    let raced = race(transport.complete(&request), env.timer.sleep_until(deadline), env.cancel.cancelled()).await;
    let stopped = |status: AgentStatus, subject: &str, count: u64, detail: String| AgentEvent::RunStopped {
        status,
        subject: subject.to_owned(),
        count,
        detail: Some(detail),
        text: None,
    };
    let limits = &scope.state().header().limits;
    match raced {
        Raced::Done(Ok(response)) => {
            let cost_minor =
                limits.prices.cost_minor(&response.model, response.usage.input_tokens, response.usage.output_tokens);
            scope.record(vec![AgentEvent::ModelAnswerRecorded { call, response, cost_minor }]).await
        }
        Raced::Done(Err(error)) if error.is_internal() => {
            scope.record(vec![AgentEvent::ModelCallFailed { call, detail: error.to_string() }]).await?;
            Err(AgentError::Transport(error))
        }
        Raced::Done(Err(error)) => {
            let detail = error.to_string();
            scope
                .record(vec![
                    AgentEvent::ModelCallFailed { call, detail: detail.clone() },
                    stopped(AgentStatus::ProviderUnavailable, "model", u64::from(call), detail),
                ])
                .await
        }
        Raced::Deadline => {
            let event = stopped(
                AgentStatus::DeadlineExceeded,
                "run",
                limits.deadline_ms,
                format!("model call {call} outlived the deadline"),
            );
            scope.record(vec![event]).await
        }
        Raced::Cancelled => {
            let event =
                stopped(AgentStatus::Cancelled, "run", u64::from(call), format!("cancelled during model call {call}"));
            scope.record(vec![event]).await
        }
    }
}
