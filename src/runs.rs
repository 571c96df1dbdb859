//! `keel runs`, `keel run show RUN_ID`, `keel run cancel RUN_ID`, `keel signal RUN_ID NAME`:
//! the operator's view of runs.
//!
//! Owns the translation between flags and run queries (a status parsed into the engine's
//! `RunStatus`, a workflow, a time), the rendering of a run with its budgets (and an agent
//! run's model cost, unknown — never 0 — once an answer had no price), the operator's
//! cancellation of a run and the signals an operator delivers. Every read is of entity rows
//! (`runs`, `intents`) or of one run's own stream (an agent run's facts, for its budgets):
//! never the whole log. It never decides whether a run may be cancelled or signalled (the
//! ledger does).

use crate::exit;
use crate::ops::{money, when};
use crate::output::{Failure, Outcome, Output, name_intent_keys, plural};
use crate::wiring::{SystemClock, open_store};
use agent::{AgentEvent, AgentState};
use chrono::{DateTime, Utc};
use engine::canonical::parse_strict;
use engine::clock::Clock as _;
use engine::event::{Cause, RunId, RunStatus, SignalName};
use engine::ledger::{Intent, Run, RunHistory};
use engine::limits::SIGNAL_PAYLOAD_MAX_BYTES;
use engine::log::{Ask, Asking, EventLog, LogError};
use serde::Serialize;
use serde_json::{Value, json};
use std::path::Path;
use store::{RunFilter, RunState};

/// The statuses `--status` accepts: `running`, then every way a run ends.
fn known_statuses() -> String {
    std::iter::once("running").chain(RunStatus::ALL.iter().map(RunStatus::as_str)).collect::<Vec<_>>().join(", ")
}

/// A `--status` value.
pub(crate) fn parse_status(name: &str) -> Result<RunState, Failure> {
    if name == "running" {
        return Ok(RunState::Running);
    }
    RunStatus::parse(name)
        .map(RunState::Finished)
        .ok_or_else(|| Failure::Usage(format!("unknown run status {name:?} (known: {})", known_statuses())))
}

/// A `--since` value: an RFC 3339 instant, or a duration ago (`90s`, `15m`, `2h`, `7d`).
pub(crate) fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Failure> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.to_utc());
    }
    let bad = || {
        Failure::Usage(format!(
            "--since {text:?} is neither an RFC 3339 instant (2026-01-31T12:00:00Z) nor a duration ago (90s, 15m, 2h, 7d)"
        ))
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (count, unit) = text.split_at(split);
    let count: i64 = count.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    count
        .checked_mul(seconds)
        .and_then(chrono::Duration::try_seconds)
        .and_then(|ago| now.checked_sub_signed(ago))
        .ok_or_else(bad)
}

/// The filter of `keel runs`, from its flags.
pub fn filter(status: Option<&str>, workflow: Option<String>, since: Option<&str>) -> Result<RunFilter, Failure> {
    Ok(RunFilter {
        state: status.map(parse_status).transpose()?,
        workflow: workflow.filter(|w| !w.is_empty()),
        since: since.map(|s| parse_since(s, SystemClock.now())).transpose()?,
    })
}

/// `keel runs`.
pub fn list(reader: &store::Reader, out: &Output, filter: &RunFilter) -> Outcome {
    print_runs(out, reader.runs_matching(filter)?)
}

/// `keel runs` on PostgreSQL, read a page at a time.
pub fn list_postgres(reader: &mut store_postgres::PgReader, out: &Output, filter: &RunFilter) -> Outcome {
    let mut rows = Vec::new();
    reader.each_run(filter.unfinished_only(), &mut |run, intents| {
        if filter.matches(&run) {
            rows.push(store::RunRow::from_run(&run, &intents));
        }
    })?;
    print_runs(out, rows)
}

/// A run listing, oldest first: what `keel runs` prints on either log.
fn print_runs(out: &Output, mut rows: Vec<store::RunRow>) -> Outcome {
    rows.sort_by(|a, b| a.started_at.cmp(&b.started_at).then_with(|| a.run_id.cmp(&b.run_id)));
    out.emit(&rows, || {
        if rows.is_empty() {
            outln!("no runs");
            return;
        }
        outln!(
            "{:<36} {:<21} {:<24} {:<20} {:>7} {:>15}",
            "RUN",
            "WORKFLOW",
            "STATUS",
            "STARTED",
            "INTENTS",
            "MONEY (minor)"
        );
        for row in &rows {
            let status = match &row.cancel_requested_by {
                Some(by) if row.status == "running" => format!("running (cancel by {by})"),
                _ => row.status.clone(),
            };
            let started =
                DateTime::parse_from_rfc3339(&row.started_at).map_or(row.started_at.clone(), |t| when(t.to_utc()));
            outln!(
                "{:<36} {:<21} {:<24} {:<20} {:>7} {:>15}",
                row.run_id,
                row.workflow,
                status,
                started,
                row.intents,
                row.cost_committed_minor
            );
        }
    });
    Ok(exit::OK)
}

/// One budget of a run: what it allows, what is used, what is left.
#[derive(Debug, Serialize)]
pub struct Budget {
    /// What it bounds (`cost_minor`, `attempts KEY`, `model_calls`…).
    pub name: String,
    /// How much is used.
    pub used: i64,
    /// The bound, when there is one.
    pub max: Option<i64>,
    /// What is left of it.
    pub remaining: Option<i64>,
}

impl Budget {
    fn new(name: impl Into<String>, used: impl TryInto<i64>, max: Option<i64>) -> Self {
        let used = used.try_into().unwrap_or(i64::MAX);
        Self { name: name.into(), used, max, remaining: max.map(|max| max.saturating_sub(used).max(0)) }
    }
}

fn int(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

/// An agent run's facts, folded from its stream's `history`.
fn agent_state(history: Option<RunHistory>, run_id: &RunId) -> anyhow::Result<Option<AgentState>> {
    let Some(history) = history else { return Ok(None) };
    let facts: Result<Vec<AgentEvent>, _> = history.agent_entries.into_iter().map(serde_json::from_value).collect();
    let facts = facts.map_err(|e| anyhow::anyhow!("run {run_id}: its agent facts do not decode: {e}"))?;
    Ok(Some(AgentState::from_events(&facts)))
}

/// Every budget of `run`: the spine's (money, deadline, network retries, each intent's
/// attempts and reconciliations) and, for an agent run, the harness's.
fn budgets(run: &Run, intents: &[Intent], agent: Option<&AgentState>, now: DateTime<Utc>) -> Vec<Budget> {
    let committed: i64 = intents.iter().filter(|i| i.money_committed()).map(|i| i.definition.amount_minor).sum();
    let mut out = vec![Budget::new("cost_minor", committed, run.limits.cost_minor_max)];
    // Time is a budget while the run runs; a finished run's deadline is only a date.
    if run.status.is_none() {
        let total_ms = (run.deadline_at - run.started_at).num_milliseconds().max(0);
        let used_ms = (now - run.started_at).num_milliseconds().clamp(0, total_ms);
        out.push(Budget::new("deadline_ms", used_ms, Some(total_ms)));
    }
    out.push(Budget::new(
        "network_retries",
        run.network_retries,
        Some(int(engine::limits::NETWORK_RETRIES_PER_RUN_MAX)),
    ));
    for intent in intents {
        let key = intent.key();
        out.push(Budget::new(format!("attempts {key}"), intent.attempts, Some(int(intent.attempts_max))));
        out.push(Budget::new(
            format!("reconciliations {key}"),
            intent.reconciliations,
            Some(int(intent.reconciliations_max)),
        ));
    }
    if let Some(state) = agent.filter(|s| s.header.is_some()) {
        let limits = &state.header().limits;
        out.push(Budget::new("model_calls", state.model_calls, Some(int(limits.model_calls_max))));
        out.push(Budget::new("tool_calls", state.tool_calls, Some(int(limits.tool_calls_max))));
        for (tool, max) in &limits.tool_calls_per_tool_max {
            let used = state.tool_calls_by_tool.get(tool).copied().unwrap_or(0);
            out.push(Budget::new(format!("tool_calls {tool}"), used, Some(int(*max))));
        }
        out.push(Budget::new("input_tokens", state.input_tokens_committed(), limits.input_tokens_max.map(int)));
        out.push(Budget::new("output_tokens", state.output_tokens_committed(), limits.output_tokens_max.map(int)));
        // A cost limit counts what calls hold; without one there is no cost budget to show
        // (the run's model cost, known or not, is `model_cost`).
        if let Some(max) = limits.cost_minor_max {
            out.push(Budget::new("agent_cost_minor", state.cost_committed_minor(), Some(max)));
        }
        out.push(Budget::new("schema_corrections", state.schema_corrections, Some(int(limits.schema_corrections_max))));
        out.push(Budget::new(
            "turns_without_progress",
            state.without_progress,
            Some(int(limits.no_progress_iterations_max)),
        ));
    }
    out
}

/// One run as `keel run show` renders it.
pub struct RunShown {
    /// Its state.
    pub run: Run,
    /// The intents it reserved.
    pub intents: Vec<Intent>,
    /// An agent run's facts, folded.
    pub agent: Option<AgentState>,
    /// Every budget, used and left.
    pub budgets: Vec<Budget>,
    /// What `keel run show --json` prints (and `GET /v1/runs/{id}` answers).
    pub document: serde_json::Value,
}

/// One run's state, intents, budgets at `now` and JSON document; `None` when no run has the
/// id. Reads the run's and its intents' rows (and an agent run's own stream).
///
/// # Errors
///
/// The log's, when it cannot be read; an agent fact that does not decode.
pub fn run_document(reader: &store::Reader, run_id: &RunId, now: DateTime<Utc>) -> anyhow::Result<Option<RunShown>> {
    let Some((run, intents)) = reader.run_state(run_id)? else {
        return Ok(None);
    };
    let agent = if run.is_agent() { agent_state(reader.history(run_id)?, run_id)? } else { None };
    Ok(Some(RunShown::new(run, intents, agent, now)))
}

/// [`run_document`] on PostgreSQL.
///
/// # Errors
///
/// As [`run_document`]'s.
pub fn run_document_postgres(
    reader: &mut store_postgres::PgReader,
    run_id: &RunId,
    now: DateTime<Utc>,
) -> anyhow::Result<Option<RunShown>> {
    let Some((run, intents)) = reader.run_state(run_id)? else {
        return Ok(None);
    };
    let agent = if run.is_agent() {
        let events = reader.stream(&run_id.stream())?;
        let history = (!events.is_empty())
            .then(|| engine::ledger::fold::history(&events))
            .transpose()
            .map_err(|e| anyhow::anyhow!("run {run_id}: its stream does not fold: {e}"))?;
        agent_state(history, run_id)?
    } else {
        None
    };
    Ok(Some(RunShown::new(run, intents, agent, now)))
}

impl RunShown {
    /// `run`'s rendering at `now`: its budgets and its JSON document.
    fn new(run: Run, intents: Vec<Intent>, agent: Option<AgentState>, now: DateTime<Utc>) -> Self {
        let budgets = budgets(&run, &intents, agent.as_ref(), now);
        let rows: Vec<store::IntentRow> = intents.iter().map(store::IntentRow::from_intent).collect();
        let document = json!({
            "run_id": run.run_id,
            "workflow": run.workflow,
            "status": run.status.map_or("running", |s| s.as_str()),
            "stop": run.status.map(|s| json!({"status": s.as_str(), "detail": run.detail})),
            "started_at": run.started_at,
            "deadline_at": run.deadline_at,
            "cancel_requested": run.cancel_requested,
            "wakes_at": run.wake_at,
            "limits": {
                "spine": run.limits,
                "agent": agent.as_ref().and_then(|s| s.header.as_ref()).map(|h| &h.limits),
            },
            "capabilities": agent.as_ref().and_then(|s| s.header.as_ref()).map(|h| &h.capabilities),
            "model_cost": agent.as_ref().filter(|s| s.header.is_some()).map(AgentState::model_cost),
            "budgets": budgets,
            "intents": rows,
        });
        RunShown { run, intents, agent, budgets, document: name_intent_keys(document) }
    }
}

/// `keel run show RUN_ID`.
pub fn show(reader: &store::Reader, out: &Output, run_id: &RunId) -> Outcome {
    print_shown(out, run_id, run_document(reader, run_id, SystemClock.now())?)
}

/// `keel run show RUN_ID` on PostgreSQL.
pub fn show_postgres(reader: &mut store_postgres::PgReader, out: &Output, run_id: &RunId) -> Outcome {
    print_shown(out, run_id, run_document_postgres(reader, run_id, SystemClock.now())?)
}

/// What `keel run show` prints of a run on either log.
fn print_shown(out: &Output, run_id: &RunId, shown: Option<RunShown>) -> Outcome {
    let Some(RunShown { run, intents, agent, budgets, document }) = shown else {
        return Err(Failure::NotFound(format!("no run {run_id} in this log")));
    };
    let status = run.status.map_or("running", |s| s.as_str());
    out.emit(&document, || {
        outln!("run {}: {status}", run.run_id);
        outln!("  workflow {}, started {}, deadline {}", run.workflow, when(run.started_at), when(run.deadline_at));
        match (run.status, &run.detail) {
            (Some(status), Some(detail)) => outln!("  stopped {}: {detail}", status.as_str()),
            (Some(status), None) => outln!("  stopped {}", status.as_str()),
            (None, _) => {}
        }
        if let Some(request) = &run.cancel_requested {
            outln!("  cancel requested by {} at {}: {}", request.by, when(request.at), request.reason);
        }
        if let Some(at) = run.wake_at {
            outln!("  waits on its timer until {}: `keel resume` continues it from then on", when(at));
        }
        if let Some(header) = agent.as_ref().and_then(|s| s.header.as_ref()) {
            let grants: Vec<&str> = header.capabilities.iter().map(String::as_str).collect();
            outln!("  capabilities: {}", if grants.is_empty() { "(none)".to_owned() } else { grants.join(", ") });
        }
        if let Some(cost) = agent.as_ref().filter(|s| s.header.is_some()).map(AgentState::model_cost) {
            outln!("  model cost: {cost}");
        }
        outln!("  budgets (used / max, left):");
        let width = budgets.iter().map(|b| b.name.len()).max().unwrap_or(0);
        for budget in &budgets {
            match (budget.max, budget.remaining) {
                (Some(max), Some(left)) => {
                    outln!("    {:<width$} {:>10} / {:<10} {left} left", budget.name, budget.used, max)
                }
                _ => outln!("    {:<width$} {:>10} / unbounded", budget.name, budget.used),
            }
        }
        if intents.is_empty() {
            outln!("  no intents");
        } else {
            outln!("  {}:", plural(intents.len() as u64, "intent"));
            for intent in &intents {
                outln!(
                    "    {:<18} {} {}",
                    intent.status.as_str(),
                    intent.key(),
                    money(intent.definition.amount_minor, &intent.definition.currency)
                );
            }
        }
    });
    Ok(exit::OK)
}

/// `keel run cancel RUN_ID --by NAME --reason WHY`.
pub async fn cancel(
    db: &Path,
    durability: store::Durability,
    out: &Output,
    run_id: &RunId,
    by: &str,
    reason: &str,
) -> Outcome {
    crate::ops::operator_text("--by", by)?;
    crate::ops::operator_text("--reason", reason)?;
    let store = open_store(db, durability)?;
    let ask = Ask::cancel_run(Cause::operator(by), run_id.clone(), by.to_owned(), reason.to_owned());
    let result = (&store as &dyn EventLog).ask(ask).await;
    store.shutdown()?;
    let run = match result {
        Ok(run) => run,
        Err(LogError::Refused(refusal)) => return Err(Failure::refusal(&refusal)),
        Err(other) => return Err(other.into()),
    };
    let request = run.cancel_requested.as_ref();
    let document = json!({
        "run_id": run.run_id,
        "status": "cancel_requested",
        "run_status": run.status.map_or("running", |s| s.as_str()),
        "cancel_requested": request,
    });
    out.emit(&document, || {
        match request {
            Some(request) if request.by == by && request.reason == reason => {
                outln!("run {run_id}: cancellation recorded (by {by}: {reason})");
            }
            Some(request) => outln!(
                "run {run_id}: already asked to stop by {} at {} ({}); nothing more recorded",
                request.by,
                when(request.at),
                request.reason
            ),
            None => outln!("run {run_id}: cancellation recorded"),
        }
        let next = if run.is_agent() {
            format!("`keel agent resume {run_id}` or `keel resume`")
        } else {
            "`keel resume`".to_owned()
        };
        outln!(
            "  it stops `cancelled` at its next guard: at once if a process drives it, otherwise when {next} picks it up"
        );
    });
    Ok(exit::OK)
}

/// `keel signal RUN_ID NAME [--payload JSON] --by NAME`: delivers a signal a workflow run
/// waits for (`Context::wait_signal`), recorded with its sender. The name and the payload are
/// checked before anything is opened (strict JSON: a repeated key is refused, never read as
/// its last value); the ledger refuses an unknown or finished run. Nothing is written unless
/// the whole command is accepted.
pub async fn signal(
    db: &Path,
    durability: store::Durability,
    out: &Output,
    run_id: &RunId,
    (name, payload): (&str, Option<&str>),
    by: &str,
) -> Outcome {
    crate::ops::operator_text("--by", by)?;
    let name = SignalName::parse(name).map_err(|why| Failure::Usage(format!("signal name {name:?}: {why}")))?;
    let payload = match payload {
        None => Value::Null,
        Some(text) if text.len() > SIGNAL_PAYLOAD_MAX_BYTES => {
            return Err(Failure::Usage(format!(
                "--payload is {} bytes, above the {SIGNAL_PAYLOAD_MAX_BYTES}-byte limit of a signal",
                text.len()
            )));
        }
        Some(text) => parse_strict(text).map_err(|e| Failure::Usage(format!("--payload is not strict JSON: {e}")))?,
    };
    let store = open_store(db, durability)?;
    let ask = Ask::deliver_signal(Cause::operator(by).for_run(run_id), run_id.clone(), name.clone(), payload.clone());
    let result = (&store as &dyn EventLog).ask(ask).await;
    store.shutdown()?;
    match result {
        Ok(_) => {}
        Err(LogError::Refused(refusal)) => return Err(Failure::refusal(&refusal)),
        Err(other) => return Err(other.into()),
    }
    let document = json!({ "run_id": run_id, "status": "delivered", "signal": name, "payload": payload, "by": by });
    out.emit(&document, || {
        outln!("run {run_id}: signal {name} delivered (by {by})");
        outln!("  `keel resume` continues the run if it waits for it");
    });
    Ok(exit::OK)
}
