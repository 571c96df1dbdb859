//! The agent loop: ask the model, let the guard dispose, repeat until a stop.
//!
//! Owns [`run`], which starts a run or resumes it from its journal, and [`RunSpec`].
//!
//! # Decisions come from the content
//!
//! After each recorded answer, before any of its tool calls runs, in this order:
//!
//! 1. its usage is unknown, or brought a total over its limit, under a token or cost limit →
//!    `token_budget` / `cost_budget`, saying which;
//! 2. output cut by the token limit (`max_tokens` / `length`) → `truncated`;
//! 3. a refusal (`refusal` / `content_filter`) → `incomplete`, its text kept and its tool
//!    calls never executed: a model that refuses has not asked for anything;
//! 4. no tool calls → final (whatever its stop reason, a missing one included): `completed`
//!    when the host's completion condition holds, else `incomplete`, the text kept;
//! 5. calls that share an id → the whole answer is refused as a correction the model may
//!    make (results are matched by id: none is dropped silently, none runs);
//! 6. otherwise every tool call goes through the guard and gets exactly one result, in the
//!    same turn, matched by call id, before the next model call.
//!
//! # The completion condition is checked first
//!
//! A stop that only says the model wanted more — a guard stop (`repeated_call`,
//! `tool_budget`…), a budget stop before a call, a truncated, refused or failed last call —
//! ends the run `completed` when the host's completion condition already holds: a second
//! `finish_review` after a finished review is not a `repeated_call`. Tool calls the guard
//! admits still run (an effect proposed after the condition holds goes through the guard
//! like any other); a stop that says something about the world — `cancelled`,
//! `outcome_unknown`, `nondeterministic_replay` — is never turned into a success.
//!
//! An answer over `AGENT_ANSWER_MAX_BYTES` or `AGENT_TOOL_CALLS_PER_ANSWER_MAX` (or, from
//! HTTP, `MODEL_RESPONSE_MAX_BYTES`) is never recorded: the call stays counted and the run
//! stops `answer_too_large`, naming the bound.
//!
//! # Reserve, then settle
//!
//! Each model call is reserved with a [`CallHold`]: its output cap (clamped to what is left
//! of `output_tokens_max`, so one call cannot overshoot it), its request size as an
//! input-token bound, and their cost at the dearest price of the run's table (the call is
//! not made when that would pass `cost_minor_max`, or cannot be priced under it). The
//! answer's `usage` settles the hold; a count the vendor did not give, and a call whose
//! answer is lost (a crash, a failure, an answer too large), keep it.
//!
//! # Resuming
//!
//! `run` folds the journal first. A recorded answer is never requested again; a call
//! reserved before a crash stays counted, with its hold. A run that started on a script (a
//! transcript) is resumed only on the same one, and with the same tools: another script, or
//! a registry whose tools differ, stops it `nondeterministic_replay` (naming the model call
//! after which replay diverged), never an internal error. A tool call reserved without a
//! result consumed its budget: a read tool's is recorded `interrupted`; an effect tool's goes
//! back through guard steps 8–11, where the spine finds the same intent (same key, same
//! fingerprint) and knows whether an attempt was sent — an attempt in flight at a crash is
//! reconciled, never resent blindly; an effect tool that cannot be continued stops the run
//! `outcome_unknown`.
//!
//! # Suspending
//!
//! When an effect call's intent awaits a human approval, `run` returns `awaiting_approval`
//! (naming the intent key) without recording anything: the call stays reserved without a
//! result, and the next `run` of the same journal asks the gate again.

use super::AgentError;
use super::budget::{AgentLimits, LimitsError};
use super::control::{Raced, race};
use super::event::{AgentEvent, AgentState, CallHold, ToolOutcome, ToolStamp, Turn};
use super::guard::{self, AgentEnv, GuardedScope, Invoked, Verdict};
use super::journal::JournalError;
use super::model::{ModelRequest, ModelResponse, ModelTransport, StopReason, ToolCall, TransportError};
use super::outcome::{AgentStatus, RunOutcome};
use super::registry::{EffectClass, Registry};
use engine::clock::checked_plus_ms;
use engine::limits;
use std::collections::BTreeSet;
use tracing::Instrument as _;

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
    /// The operator's policy version the run is decided under (`policy.version` on its span),
    /// when its host has one.
    pub policy_version: Option<String>,
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
    let span = tracing::info_span!(
        "agent.run",
        agent.run.id = %spec.run_id,
        prompt.version = %super::journal::prompt_version(&spec.system, &spec.prompt),
        policy.version = spec.policy_version.as_deref(),
        release.version = env!("CARGO_PKG_VERSION"),
    );
    async move {
        let mut scope = GuardedScope::open(env).await?.asking(transport);
        match drive(&mut scope, transport, registry, spec, completion).await {
            // An operator asked the run to stop: the refused batch wrote nothing, and the run's
            // next fact is its `cancelled` stop.
            Err(AgentError::Journal(JournalError::Cancelled { detail })) if scope.state().stop.is_none() => {
                let count = u64::from(scope.state().model_calls);
                let stop = AgentEvent::RunStopped {
                    status: AgentStatus::Cancelled,
                    subject: "run".into(),
                    count,
                    detail: Some(detail),
                    text: None,
                };
                scope.record(vec![stop]).await?;
                Ok(scope.state().outcome().expect("a run that recorded its stop has an outcome"))
            }
            other => other,
        }
    }
    .instrument(span)
    .await
}

/// What a tool call's guard decided, for its span: `accepted` (admitted to its body) or
/// `refused`, and the refusal's code (`unknown_tool`, `schema_correction`, a refusal code)
/// from the control events the call added.
fn validation(state: &AgentState, controls_before: usize) -> (&'static str, Option<String>) {
    let added = state.control.get(controls_before..).unwrap_or_default();
    let refused = added.iter().find(|c| c.kind != "tool_call" && c.kind != "model_call");
    match refused {
        Some(control) => ("refused", Some(control.kind.clone())),
        None if added.iter().any(|c| c.kind == "tool_call") => ("accepted", None),
        None => ("none", None),
    }
}

/// Records the budgets left on `span` (calls, input tokens, milliseconds to the deadline).
fn record_budget(span: &tracing::Span, state: &AgentState, now: chrono::DateTime<chrono::Utc>) {
    let limits = &state.header().limits;
    span.record("budget.remaining_calls", limits.model_calls_max.saturating_sub(state.model_calls_committed()));
    if let Some(max) = limits.input_tokens_max {
        span.record("budget.remaining_tokens", max.saturating_sub(state.input_tokens_committed()));
    }
    span.record("budget.remaining_ms", (state.header().deadline - now).num_milliseconds().max(0));
}

/// Drives an opened run — or the sub-agent its scope is focused on — to its stop (see
/// [`run`]).
pub(crate) async fn drive(
    scope: &mut GuardedScope<'_>,
    transport: &dyn ModelTransport,
    registry: &Registry,
    spec: &RunSpec,
    completion: Completion<'_>,
) -> Result<RunOutcome, AgentError> {
    let env = scope.env();
    let script = transport.script_fingerprint();
    let replayed_elsewhere = match &scope.state().header {
        None => {
            spec.limits.validate().map_err(AgentError::InvalidLimits)?;
            let now = env.clock.now();
            let deadline = checked_plus_ms(now, spec.limits.deadline_ms).ok_or_else(|| {
                AgentError::InvalidLimits(LimitsError::OutOfRange {
                    field: "deadline_ms".into(),
                    value: spec.limits.deadline_ms.to_string(),
                    range: format!("an instant after {now} that can be represented"),
                })
            })?;
            scope
                .record(vec![AgentEvent::AgentRunStarted {
                    run_id: spec.run_id.clone(),
                    workflow: spec.workflow.clone(),
                    started_at: now,
                    deadline,
                    limits: spec.limits.clone(),
                    capabilities: spec.capabilities.clone(),
                    tools: registry.stamps(),
                    system: spec.system.clone(),
                    prompt: spec.prompt.clone(),
                    script,
                }])
                .await?;
            None
        }
        Some(header) => {
            if header.run_id != spec.run_id {
                return Err(AgentError::RunMismatch { expected: spec.run_id.clone(), found: header.run_id.clone() });
            }
            let tools = registry.stamps();
            let changed_tools = (header.tools != tools).then(|| tools_changed(&header.tools, &tools));
            let changed_script =
                header.script.as_ref().filter(|recorded| script.as_ref() != Some(*recorded)).map(|recorded| {
                    let now =
                        script.as_deref().map_or("no script (a live model)".to_owned(), |s| format!("script {:.12}…", s));
                    format!("the run started on script {recorded:.12}…; this resume replays {now}: answers of two scripts are never mixed")
                });
            changed_tools.or(changed_script).map(|why| {
                let calls = scope.state().model_calls;
                format!("replay diverges from the journal after model call {calls}: {why}")
            })
        }
    };
    if let Some(detail) = replayed_elsewhere.filter(|_| scope.state().stop.is_none()) {
        let count = u64::from(scope.state().model_calls);
        let status = AgentStatus::NondeterministicReplay;
        let stop = AgentEvent::RunStopped { status, subject: "model".into(), count, detail: Some(detail), text: None };
        scope.record(vec![stop]).await?;
    }
    loop {
        if let Some(outcome) = scope.state().outcome() {
            return Ok(outcome);
        }
        if env.cancel.is_terminating() && !env.cancel.is_cancelled() {
            return Ok(scope.state().terminated());
        }
        if let Some(event) = conclusion(scope.state(), completion) {
            let event = or_completed(scope.state(), completion, event);
            scope.record(vec![event]).await?;
            continue;
        }
        if scope.state().open_turn_ref().is_some() {
            if let Some(events) = guard::refuse_reused_ids(scope.state()) {
                scope.record(events).await?;
                continue;
            }
            if let Some(intent_key) = answer_turn(scope, registry, completion).await? {
                return Ok(scope.state().suspended(&intent_key));
            }
            continue;
        }
        let (request, hold) = next_request(scope.state(), registry);
        if let Some(event) = before_model_call(scope, &hold) {
            let event = or_completed(scope.state(), completion, event);
            scope.record(vec![event]).await?;
            continue;
        }
        call_model(scope, transport, &request, hold, completion).await?;
    }
}

/// What differs between the tools a run started with and those of this resume, in words:
/// the first tool added, removed or changed (its version or schema).
fn tools_changed(recorded: &[ToolStamp], now: &[ToolStamp]) -> String {
    let by_name = |stamps: &[ToolStamp], name: &str| stamps.iter().find(|s| s.name == name).cloned();
    for stamp in recorded {
        match by_name(now, &stamp.name) {
            None => return format!("tool {} (version {}) is gone from the registry", stamp.name, stamp.version),
            Some(found) if found != *stamp => {
                return format!(
                    "tool {} changed (version {} → {}, schema {:.12}… → {:.12}…)",
                    stamp.name, stamp.version, found.version, stamp.schema_fingerprint, found.schema_fingerprint
                );
            }
            Some(_) => {}
        }
    }
    match now.iter().find(|stamp| by_name(recorded, &stamp.name).is_none()) {
        Some(added) => format!("tool {} (version {}) was added to the registry", added.name, added.version),
        None => "the tools are the same but in another order".to_owned(),
    }
}

/// `n thing` or `n things`, for the details a stop records.
pub(crate) fn count_of(n: impl Into<u64>, thing: &str) -> String {
    let n = n.into();
    if n == 1 { format!("1 {thing}") } else { format!("{n} {thing}s") }
}

/// The stop a fresh answer (none of its calls reserved or answered yet) calls for by itself,
/// in the order of the module docs.
fn conclusion(state: &AgentState, completion: Completion<'_>) -> Option<AgentEvent> {
    let turn = state.turns.last().filter(|t| !t.ended && t.results.is_empty() && t.reserved.is_empty())?;
    let calls = turn.response.tool_calls().len();
    let stop = |status: AgentStatus, subject: &str, count: u64, detail: Option<String>, text: Option<String>| {
        AgentEvent::RunStopped { status, subject: subject.to_owned(), count, detail, text }
    };
    if let Some(event) = budget_after_answer(state, turn) {
        return Some(event);
    }
    let count = u64::from(state.model_calls);
    match turn.response.stop_reason {
        StopReason::MaxTokens => {
            let detail =
                format!("output cut by the token limit; {} in it not executed", count_of(calls as u64, "tool call"));
            return Some(stop(AgentStatus::Truncated, "model", count, Some(detail), None));
        }
        StopReason::Refusal => {
            let detail = format!(
                "the model refused (stop reason refusal); {} in its answer not executed",
                count_of(calls as u64, "tool call")
            );
            return Some(stop(AgentStatus::Incomplete, "model", count, Some(detail), state.final_text()));
        }
        _ if calls > 0 => return None,
        _ => {}
    }
    let (status, detail) = if completion(state) {
        (AgentStatus::Completed, None)
    } else {
        (
            AgentStatus::Incomplete,
            Some("the model stopped and the host's completion condition does not hold".to_owned()),
        )
    };
    Some(stop(status, "run", u64::from(state.tool_calls), detail, state.final_text()))
}

/// `event`, or `completed` in its place when it is a stop that yields to the host's
/// completion condition and the condition holds (see the module docs).
fn or_completed(state: &AgentState, completion: Completion<'_>, event: AgentEvent) -> AgentEvent {
    match &event {
        AgentEvent::RunStopped { status, detail, .. } if status.yields_to_completion() && completion(state) => {
            let instead = detail.as_deref().map_or_else(String::new, |d| format!(" ({d})"));
            AgentEvent::RunStopped {
                status: AgentStatus::Completed,
                subject: "run".into(),
                count: u64::from(state.tool_calls),
                detail: Some(format!(
                    "the host's completion condition holds; the run would otherwise have stopped {}{instead}",
                    status.as_str()
                )),
                text: state.final_text(),
            }
        }
        _ => event,
    }
}

/// Under a token or cost limit, an answer whose usage is unknown, or that brought a total
/// over its limit, stops the run before anything of it runs.
fn budget_after_answer(state: &AgentState, turn: &Turn) -> Option<AgentEvent> {
    let limits = &state.header().limits;
    let (call, usage) = (turn.call, turn.response.usage);
    let stop = |status: AgentStatus, subject: &str, count: u64, detail: String| AgentEvent::RunStopped {
        status,
        subject: subject.to_owned(),
        count,
        detail: Some(detail),
        text: None,
    };
    let unknown = |what: &str, limit: &str| {
        format!(
            "the {what} usage of model call {call} was unknown (absent, or not a non-negative integer): \
             it cannot be counted against {limit}, so the run stops"
        )
    };
    let tokens = [
        ("input_tokens", limits.input_tokens_max, usage.input_tokens, state.input_tokens_committed()),
        ("output_tokens", limits.output_tokens_max, usage.output_tokens, state.output_tokens_committed()),
    ];
    for (subject, max, reported, committed) in tokens {
        let Some(max) = max else { continue };
        if reported.is_none() {
            let what = subject.trim_end_matches("_tokens");
            return Some(stop(AgentStatus::TokenBudget, subject, committed, unknown(what, &format!("{subject}_max"))));
        }
        if committed > max {
            let detail = format!("model call {call} brought {subject} to {committed}, over {subject}_max = {max}");
            return Some(stop(AgentStatus::TokenBudget, subject, committed, detail));
        }
    }
    let max = limits.cost_minor_max?;
    let cost = u64::try_from(state.cost_committed_minor()).unwrap_or(0);
    if usage.is_unknown() {
        return Some(stop(AgentStatus::CostBudget, "model", cost, unknown("token", "cost_minor_max")));
    }
    if state.unpriced_answers > 0 {
        let detail = format!("model {} has no price: cost cannot be bounded", turn.response.model);
        return Some(stop(AgentStatus::CostBudget, "model", cost, detail));
    }
    (state.cost_committed_minor() > max).then(|| {
        let detail = format!("model call {call} brought the cost to {cost} minor units, over cost_minor_max = {max}");
        stop(AgentStatus::CostBudget, "model", cost, detail)
    })
}

/// Gives every tool call of the open turn exactly one result, then closes the turn; or
/// returns the intent key a call awaits approval on, leaving the turn open.
async fn answer_turn(
    scope: &mut GuardedScope<'_>,
    registry: &Registry,
    completion: Completion<'_>,
) -> Result<Option<String>, AgentError> {
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
        let schema_version =
            registry.stamps().into_iter().find(|s| s.name == tool_call.name).map(|s| s.version).unwrap_or_default();
        let span = tracing::info_span!(
            "tool.call",
            agent.step.index = call,
            tool.name = %tool_call.name,
            tool.schema_version = %schema_version,
            tool.call_id = %tool_call.id,
            validation.outcome = tracing::field::Empty,
            validation.error_code = tracing::field::Empty,
        );
        let controls_before = scope.state().control.len();
        let reserved = turn.reserved.contains(&tool_call.id);
        let invoked = async {
            let invoked = if reserved {
                // Reserved, then the process died (or the run suspended) before its result.
                if let Some(invoked) = registry.resume_reserved(scope, &tool_call).await? {
                    invoked
                } else {
                    interrupted(scope, registry, &tool_call).await?;
                    Invoked::Recorded
                }
            } else if let Some(stop) = guard_stop_after_completion(scope, registry, &tool_call, completion) {
                scope.record(vec![stop]).await?;
                Invoked::Recorded
            } else {
                registry.invoke(scope, &tool_call).await?
            };
            Ok::<_, AgentError>(invoked)
        }
        .instrument(span.clone())
        .await?;
        let (outcome, code) = validation(scope.state(), controls_before);
        span.record("validation.outcome", outcome);
        if let Some(code) = code {
            span.record("validation.error_code", code.as_str());
        }
        if let Invoked::AwaitingApproval { intent_key } = invoked {
            return Ok(Some(intent_key));
        }
    }
    // Stopped, or paused by SIGTERM inside a sub-agent: the turn stays open.
    if scope.state().stop.is_some() || scope.env().cancel.is_terminating() {
        return Ok(None);
    }
    let state = scope.state();
    let turn = state.turns.last().expect("the open turn is still the last one: only this loop appends");
    let progress = turn.results.iter().any(|r| r.progress);
    let without_progress = if progress { 0 } else { state.without_progress + 1 };
    scope.record(vec![AgentEvent::TurnEnded { call, progress, without_progress }]).await?;
    Ok(None)
}

/// When the completion condition holds and the guard would stop the run on `call`, the stop
/// that ends it instead (`completed`, or the guard's own when it does not yield).
fn guard_stop_after_completion(
    scope: &GuardedScope<'_>,
    registry: &Registry,
    call: &ToolCall,
    completion: Completion<'_>,
) -> Option<AgentEvent> {
    let state = scope.state();
    if !completion(state) {
        return None;
    }
    let env = scope.env();
    // Whether the guard stops, not what a carve would take: the spine's money is not read.
    match guard::decide(state, registry, call, env.clock.now(), env.cancel.is_cancelled(), None) {
        Verdict::Stop(event) => Some(or_completed(state, completion, event)),
        Verdict::Admit(_) | Verdict::Refuse(_) => None,
    }
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

/// The next request and what it holds: its output cap is the per-call cap, clamped to what
/// is left of the output-token limit.
fn next_request(state: &AgentState, registry: &Registry) -> (ModelRequest, CallHold) {
    let header = state.header();
    let limits = &header.limits;
    let per_call = u64::from(limits.output_tokens_per_call);
    let output_cap = limits
        .output_tokens_max
        .map_or(per_call, |max| per_call.min(max.saturating_sub(state.output_tokens_committed())));
    let request = ModelRequest {
        system: header.system.clone(),
        messages: state.messages(),
        tools: registry.descriptors(),
        max_output_tokens: u32::try_from(output_cap).expect("the cap is at most output_tokens_per_call, a u32"),
    };
    let input_tokens = serde_json::to_vec(&request).map_or(u64::MAX, |bytes| bytes.len() as u64);
    let hold = CallHold {
        input_tokens,
        output_tokens: output_cap,
        cost_minor: limits.prices.ceiling_minor(input_tokens, output_cap),
    };
    (request, hold)
}

/// The budget checks before a model call, in order: cancellation, deadline, model calls,
/// tokens, cost (with the call's hold), progress.
fn before_model_call(scope: &GuardedScope<'_>, hold: &CallHold) -> Option<AgentEvent> {
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
    let calls = state.model_calls_committed();
    if calls >= limits.model_calls_max {
        let held = calls - state.model_calls;
        let detail = match held {
            0 => format!("{} made", count_of(calls, "model call")),
            _ => format!("{} made, {held} of them by or carved for sub-agents", count_of(calls, "model call")),
        };
        return Some(stop(AgentStatus::ModelBudget, "model", u64::from(calls), detail));
    }
    let input = state.input_tokens_committed();
    if limits.input_tokens_max.is_some_and(|max| input >= max) {
        return Some(stop(AgentStatus::TokenBudget, "input_tokens", input, "input token budget spent".into()));
    }
    let output = state.output_tokens_committed();
    if limits.output_tokens_max.is_some_and(|max| output >= max) {
        return Some(stop(AgentStatus::TokenBudget, "output_tokens", output, "output token budget spent".into()));
    }
    if let Some(max) = limits.cost_minor_max {
        let committed = state.cost_committed_minor();
        let cost = u64::try_from(committed).unwrap_or(0);
        if state.unpriced_answers > 0 {
            return Some(stop(
                AgentStatus::CostBudget,
                "model",
                cost,
                "a model answered that has no price: cost cannot be bounded".into(),
            ));
        }
        let Some(held) = hold.cost_minor else {
            return Some(stop(
                AgentStatus::CostBudget,
                "model",
                cost,
                "the price table is empty: a call's cost cannot be bounded".into(),
            ));
        };
        if committed.saturating_add(held) > max {
            let detail = format!(
                "the next call may cost up to {held} minor units and {} of cost_minor_max = {max} is left \
                 (calls whose answers were lost keep what they reserved)",
                max.saturating_sub(committed).max(0)
            );
            return Some(stop(AgentStatus::CostBudget, "model", cost, detail));
        }
    }
    if state.without_progress >= limits.no_progress_iterations_max {
        return Some(stop(
            AgentStatus::NoProgress,
            "run",
            u64::from(state.without_progress),
            format!("{} without progress", count_of(state.without_progress, "turn")),
        ));
    }
    None
}

/// Why an answer cannot be kept: more tool calls, or more bytes, than one answer may hold.
fn oversized(call: u32, response: &ModelResponse) -> Option<String> {
    let calls = response.tool_calls().len();
    if calls > limits::AGENT_TOOL_CALLS_PER_ANSWER_MAX {
        return Some(format!(
            "model call {call}: the answer proposes {calls} tool calls, over AGENT_TOOL_CALLS_PER_ANSWER_MAX = {}; \
             none was executed",
            limits::AGENT_TOOL_CALLS_PER_ANSWER_MAX
        ));
    }
    let bytes = serde_json::to_vec(response).map_or(usize::MAX, |b| b.len());
    (bytes > limits::AGENT_ANSWER_MAX_BYTES).then(|| {
        format!(
            "model call {call}: the answer is {bytes} bytes, over AGENT_ANSWER_MAX_BYTES = {}; it was not kept \
             and nothing of it was executed",
            limits::AGENT_ANSWER_MAX_BYTES
        )
    })
}

/// Reserves, sends, and records one model call.
async fn call_model(
    scope: &mut GuardedScope<'_>,
    transport: &dyn ModelTransport,
    request: &ModelRequest,
    hold: CallHold,
    completion: Completion<'_>,
) -> Result<(), AgentError> {
    let call = scope.state().model_calls + 1;
    let span = tracing::info_span!(
        "llm.call",
        agent.step.index = call,
        llm.model = tracing::field::Empty,
        llm.input_tokens = tracing::field::Empty,
        llm.output_tokens = tracing::field::Empty,
        llm.latency_ms = tracing::field::Empty,
        budget.remaining_calls = tracing::field::Empty,
        budget.remaining_tokens = tracing::field::Empty,
        budget.remaining_ms = tracing::field::Empty,
    );
    scope.record(vec![AgentEvent::ModelCallReserved { call, hold: Some(hold) }]).await?;
    let deadline = scope.state().header().deadline;
    let env = scope.env();
    let sent_at = env.clock.now();
    record_budget(&span, scope.state(), sent_at);
    let raced = race(transport.complete(request), env.timer.sleep_until(deadline), env.cancel.cancelled())
        .instrument(span.clone())
        .await;
    span.record("llm.latency_ms", (env.clock.now() - sent_at).num_milliseconds().max(0));
    if let Raced::Done(Ok(response)) = &raced {
        span.record("llm.model", response.model.as_str());
        if let Some(tokens) = response.usage.input_tokens {
            span.record("llm.input_tokens", tokens);
        }
        if let Some(tokens) = response.usage.output_tokens {
            span.record("llm.output_tokens", tokens);
        }
    }
    let stopped = |status: AgentStatus, subject: &str, count: u64, detail: String| AgentEvent::RunStopped {
        status,
        subject: subject.to_owned(),
        count,
        detail: Some(detail),
        text: None,
    };
    let state = scope.state();
    let failed = |status: AgentStatus, detail: String| {
        vec![
            AgentEvent::ModelCallFailed { call, detail: detail.clone() },
            or_completed(state, completion, stopped(status, "model", u64::from(call), detail)),
        ]
    };
    let limits = &scope.state().header().limits;
    match raced {
        Raced::Done(Ok(response)) => {
            if let Some(detail) = oversized(call, &response) {
                return scope.record(failed(AgentStatus::AnswerTooLarge, detail)).await;
            }
            let usage = response.usage;
            let input = usage.input_tokens.unwrap_or(hold.input_tokens);
            let output = usage.output_tokens.unwrap_or(hold.output_tokens);
            let cost_minor = limits.prices.cost_minor(&response.model, input, output);
            scope.record(vec![AgentEvent::ModelAnswerRecorded { call, response, cost_minor }]).await
        }
        Raced::Done(Err(error)) if error.is_internal() => {
            scope.record(vec![AgentEvent::ModelCallFailed { call, detail: error.to_string() }]).await?;
            Err(AgentError::Transport(error))
        }
        Raced::Done(Err(error @ TransportError::TooLarge { .. })) => {
            scope.record(failed(AgentStatus::AnswerTooLarge, format!("model call {call}: {error}"))).await
        }
        Raced::Done(Err(error)) => scope.record(failed(AgentStatus::ProviderUnavailable, error.to_string())).await,
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
