//! `keel trace RUN_ID`: a run as a causal tree, for people (`--json` gives the tree).
//!
//! Owns building the tree from the events' recorded links — each event's `cause.parent`, the
//! event that caused it, set when it was sealed — and rendering it with each node's time,
//! duration (to its last descendant), status and, in an agent run, its budget counters. It
//! reads the run's own stream and the streams of the intents the run reserved, never the
//! whole log, and it never infers a link: an event whose parent is not among them (or that
//! records none, being older than the links) is a root.

use crate::exit;
use crate::output::{Failure, Outcome, Output};
use agent::{AgentEvent, AgentState, ModelCost};
use chrono::{DateTime, SecondsFormat, Utc};
use engine::event::{Event, RunId, StoredEvent};
use engine::ledger::fold;
use serde::Serialize;
use std::collections::BTreeMap;

/// One node of the tree: an event, what it says, and what it caused.
#[derive(Serialize)]
pub struct Node {
    /// The event's global sequence.
    pub seq: u64,
    /// The event's type (`AttemptStarted`; an agent fact's own type, e.g. `ModelCallReserved`).
    pub event: String,
    /// Its stream.
    pub stream: String,
    /// When, RFC 3339 to the millisecond.
    pub at: String,
    /// Milliseconds from this event to its last descendant (0 for a leaf).
    pub duration_ms: i64,
    /// Who caused it.
    pub actor: String,
    /// What it says, in a few words (`attempt 1`, `lookup found`, `tool refund_order`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Its entity's status after it: the intent's, or the run's once it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// An agent run's counters after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Counters>,
    /// What it caused.
    pub children: Vec<Node>,
    #[serde(skip)]
    at_time: DateTime<Utc>,
}

/// An agent run's budget counters after one of its facts.
#[derive(Clone, Serialize)]
pub struct Counters {
    /// Model calls.
    pub model_calls: u32,
    /// Tool calls.
    pub tool_calls: u32,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Model cost so far, its sub-agents' included: `cost_minor` (minor units, `null` once an
    /// answer had no price — unknown, never 0) and `unpriced_answers`.
    #[serde(flatten)]
    pub cost: ModelCost,
    /// Schema corrections.
    pub schema_corrections: u32,
}

/// A run's causal tree: what `keel trace --json` prints and `GET /v1/runs/{id}/trace` answers.
#[derive(Serialize)]
pub struct Trace {
    /// The run.
    pub run_id: String,
    /// The events with no recorded parent among the run's and its intents'.
    pub roots: Vec<Node>,
}

/// One event, described, before it is placed in the tree.
struct Described {
    event: StoredEvent,
    name: String,
    detail: Option<String>,
    status: Option<String>,
    budget: Option<Counters>,
}

fn describe_intent_event(event: &Event) -> Option<String> {
    match event {
        Event::IntentReserved { intent, .. } => {
            Some(format!("{} {} {}", intent.key, intent.amount_minor, intent.currency))
        }
        Event::AttemptStarted { attempt, .. } => Some(format!("attempt {attempt}")),
        Event::OutcomeUnknown { reason, .. } => Some(format!("unknown: {}", reason.as_str())),
        Event::ReconciliationStarted { reconciliation, .. } => Some(format!("reconciliation {reconciliation}")),
        Event::ReconciliationResolved { status, .. } => Some(format!("lookup {}", status.as_str())),
        Event::IntentValidated { source, evidence, .. } => Some(format!(
            "{} {}",
            if *source == engine::event::Source::Provider { "receipt" } else { "reconciled" },
            evidence.provider_ref
        )),
        Event::IntentDeclined { code, .. } => Some(format!("declined {code}")),
        _ => None,
    }
}

/// The run's events and its intents' events, in global order, each described with the state
/// of its entity right after it.
fn described(run: Vec<StoredEvent>, intents: Vec<Vec<StoredEvent>>) -> anyhow::Result<Vec<Described>> {
    let mut out = Vec::new();
    let mut agent = AgentState::default();
    let mut is_agent = false;
    for stored in run {
        let mut name = stored.event.type_name().to_owned();
        let mut detail = None;
        let mut budget = None;
        match &stored.event {
            Event::AgentRecorded { event, .. } => {
                let fact: AgentEvent = serde_json::from_value(event.clone())
                    .map_err(|e| anyhow::anyhow!("event {}: an agent fact that does not decode: {e}", stored.seq))?;
                agent.try_apply(&fact).map_err(|e| anyhow::anyhow!("event {}: {e}", stored.seq))?;
                is_agent = true;
                name = fact.type_name().to_owned();
                detail = match &fact {
                    AgentEvent::ToolCallReserved { tool, call_id, .. } => Some(format!("tool {tool} ({call_id})")),
                    AgentEvent::ModelCallReserved { call, .. } | AgentEvent::ModelAnswerRecorded { call, .. } => {
                        Some(format!("model call {call}"))
                    }
                    AgentEvent::RunStopped { status, .. } => Some(status.as_str().to_owned()),
                    _ => None,
                };
                budget = Some(Counters {
                    model_calls: agent.model_calls,
                    tool_calls: agent.tool_calls,
                    input_tokens: agent.input_tokens,
                    output_tokens: agent.output_tokens,
                    cost: agent.model_cost(),
                    schema_corrections: agent.schema_corrections,
                });
            }
            Event::RunStarted { workflow, .. } => detail = Some(workflow.clone()),
            Event::StepRecorded { name: step, position, .. } => detail = Some(format!("step {position}: {step}")),
            _ => {}
        }
        let status = match &stored.event {
            Event::RunFinished { status, .. } => Some(status.as_str().to_owned()),
            _ => None,
        };
        let budget = budget.filter(|_| is_agent);
        out.push(Described { event: stored, name, detail, status, budget });
    }
    for stream in intents {
        for end in 1..=stream.len() {
            let intent = fold::intent(&stream[..end])
                .map_err(|e| anyhow::anyhow!("the intent's stream does not fold: {e:?}"))?;
            let stored = stream[end - 1].clone();
            let detail = describe_intent_event(&stored.event);
            out.push(Described {
                name: stored.event.type_name().to_owned(),
                event: stored,
                detail,
                status: Some(intent.status.as_str().to_owned()),
                budget: None,
            });
        }
    }
    out.sort_by_key(|d| d.event.seq);
    Ok(out)
}

/// Places every event under its recorded parent; an event without one among them is a root.
fn tree(events: Vec<Described>) -> Vec<Node> {
    let present: std::collections::BTreeSet<u64> = events.iter().map(|d| d.event.seq).collect();
    let mut children: BTreeMap<Option<u64>, Vec<Described>> = BTreeMap::new();
    for described in events {
        let parent = described.event.cause.parent.filter(|p| present.contains(p));
        children.entry(parent).or_default().push(described);
    }
    fn build(described: Described, children: &mut BTreeMap<Option<u64>, Vec<Described>>) -> Node {
        let kids: Vec<Node> = children
            .remove(&Some(described.event.seq))
            .unwrap_or_default()
            .into_iter()
            .map(|child| build(child, children))
            .collect();
        let at_time = described.event.at;
        let last = kids.iter().map(|k| k.at_time + chrono::TimeDelta::milliseconds(k.duration_ms)).max();
        let duration_ms = last.map_or(0, |last| (last - at_time).num_milliseconds().max(0));
        Node {
            seq: described.event.seq,
            event: described.name,
            stream: described.event.stream.to_string(),
            at: at_time.to_rfc3339_opts(SecondsFormat::Millis, true),
            duration_ms,
            actor: described.event.cause.actor.clone(),
            detail: described.detail,
            status: described.status,
            budget: described.budget,
            children: kids,
            at_time,
        }
    }
    let roots = children.remove(&None).unwrap_or_default();
    roots.into_iter().map(|root| build(root, &mut children)).collect()
}

/// The causal tree of `run_id`; `None` when no run has the id. Reads the run's stream and
/// its intents' streams.
///
/// # Errors
///
/// The log's; an event that does not decode or fold.
pub fn build(reader: &store::Reader, run_id: &RunId) -> anyhow::Result<Option<Trace>> {
    let Some((_, intents)) = reader.run_state(run_id)? else {
        return Ok(None);
    };
    let run = reader.stream(&run_id.stream())?;
    let mut streams = Vec::new();
    for intent in &intents {
        streams.push(reader.stream(&intent.key().stream())?);
    }
    Ok(Some(Trace { run_id: run_id.to_string(), roots: tree(described(run, streams)?) }))
}

/// `keel trace RUN_ID`.
pub fn show(reader: &store::Reader, out: &Output, run_id: &RunId) -> Outcome {
    let Some(trace) = build(reader, run_id)? else {
        return Err(Failure::NotFound(format!("no run with id {run_id} (keel runs lists them)")));
    };
    out.emit(&trace, || {
        for root in &trace.roots {
            print_node(root, 0);
        }
    });
    Ok(exit::OK)
}

fn print_node(node: &Node, depth: usize) {
    let mut line = format!("{}{} #{} {}", "  ".repeat(depth), node.event, node.seq, node.at);
    if node.duration_ms > 0 {
        line.push_str(&format!(" (+{} ms)", node.duration_ms));
    }
    if let Some(detail) = &node.detail {
        line.push_str(&format!("  {detail}"));
    }
    if let Some(status) = &node.status {
        line.push_str(&format!("  [{status}]"));
    }
    if let Some(budget) = &node.budget {
        line.push_str(&format!(
            "  calls {}/{} tokens {}+{} cost {}",
            budget.model_calls, budget.tool_calls, budget.input_tokens, budget.output_tokens, budget.cost
        ));
    }
    if !node.actor.starts_with("command:") && node.actor != "run" {
        line.push_str(&format!("  by {}", node.actor));
    }
    outln!("{line}");
    for child in &node.children {
        print_node(child, depth + 1);
    }
}
