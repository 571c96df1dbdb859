//! Seed 003's acceptance table, checked over the fixture transcripts (real Anthropic and
//! OpenAI response formats), plus a golden rendering of each run's JSON report under
//! `fixtures/agent/ticket-review/expected/` (missing goldens are written;
//! `UPDATE_EXPECT=1` rewrites them).

use super::*;
use adapters::model::scripted::ScriptedTransport;
use agent::{AgentEvent, AgentStatus, Cancellation, ControlEvent, JournalError, ManualTimer, MemoryJournal};
use engine::clock::ManualClock;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

struct Rig {
    clock: Arc<ManualClock>,
    timer: ManualTimer,
    cancel: Cancellation,
}

impl Rig {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(chrono::DateTime::UNIX_EPOCH));
        Self { timer: ManualTimer::new(Arc::clone(&clock)), clock, cancel: Cancellation::new() }
    }
    fn env<'a>(&'a self, journal: &'a MemoryJournal) -> AgentEnv<'a> {
        AgentEnv { journal, clock: &*self.clock, timer: &self.timer, cancel: &self.cancel, gate: None }
    }
}

async fn check(scenario: Scenario) -> (RunOutcome, Vec<AgentEvent>) {
    let rig = Rig::new();
    let journal = MemoryJournal::new();
    let transport = ScriptedTransport::from_file(scenario.transcript(fixtures())).expect("transcript loads");
    let outcome = run(rig.env(&journal), &transport, "run-1", scenario.limits(), scenario.capabilities())
        .await
        .expect("no internal error");
    let golden = fixtures().join("agent/ticket-review/expected").join(format!("{}.json", scenario.name()));
    let rendered = format!("{}\n", serde_json::to_string_pretty(&outcome.report()).expect("serializes"));
    if std::env::var_os("UPDATE_EXPECT").is_some() || !golden.exists() {
        std::fs::create_dir_all(golden.parent().expect("has a parent")).expect("creates the golden dir");
        std::fs::write(&golden, &rendered).expect("writes the golden");
    }
    let expected = std::fs::read_to_string(&golden).expect("golden exists");
    assert_eq!(rendered, expected, "{}: report differs from {}", scenario.name(), golden.display());
    (outcome, journal.events())
}

fn ev(kind: &str, name: &str, count: u64) -> ControlEvent {
    ControlEvent { kind: kind.into(), name: name.into(), count }
}

fn mc(n: u64) -> ControlEvent {
    ev("model_call", "model", n)
}

fn bodies(events: &[AgentEvent]) -> usize {
    events.iter().filter(|e| matches!(e, AgentEvent::ToolResultRecorded { .. })).count()
}

#[tokio::test]
async fn scenario_complete() {
    let (o, _) = check(Scenario::Complete).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::Completed, 2, 3, 0));
    let read = ev("tool_call", "read_ticket", 1);
    assert_eq!(o.events, vec![mc(1), read, mc(2), ev("tool_call", "finish_review", 2), mc(3)]);
    assert_eq!(o.text.as_deref(), Some("Review finished."));
}

#[tokio::test]
async fn scenario_incomplete() {
    let (o, _) = check(Scenario::Incomplete).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::Incomplete, 0, 1, 2));
    assert_eq!(o.text.as_deref(), Some("Review finished."), "the text is kept, never as success");
    assert_eq!(o.events, vec![mc(1)]);
}

#[tokio::test]
async fn scenario_forbidden() {
    let (o, events) = check(Scenario::Forbidden).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::PermissionDenied, 0, 1, 2));
    assert_eq!(o.events, vec![mc(1), ev("permission_denied", "read_ticket", 0)]);
    assert_eq!(bodies(&events), 0, "the body never runs");
    let visible = events.iter().any(|e| {
        matches!(e, AgentEvent::AgentRunStarted { tools, capabilities, .. }
            if tools.iter().any(|t| t.name == "read_ticket") && !capabilities.contains(CAP_READ))
    });
    assert!(visible, "read_ticket was visible, ticket.read was not granted");
}

#[tokio::test]
async fn scenario_repeat() {
    let (o, _) = check(Scenario::Repeat).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::RepeatedCall, 1, 2, 2));
    assert_eq!(o.events, vec![mc(1), ev("tool_call", "read_ticket", 1), mc(2), ev("repeated_call", "read_ticket", 1)]);
}

#[tokio::test]
async fn scenario_changing() {
    let (o, events) = check(Scenario::Changing).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::ToolBudget, 4, 5, 2));
    let mut expected = Vec::new();
    for i in 1..=4 {
        expected.extend([mc(i), ev("tool_call", "read_ticket", i)]);
    }
    expected.extend([mc(5), ev("tool_budget", "read_ticket", 4)]);
    assert_eq!(o.events, expected);
    assert_eq!(bodies(&events), 4, "four admitted attempts ran, each answered NotFound");
}

#[tokio::test]
async fn scenario_budget() {
    let (o, _) = check(Scenario::Budget).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::ModelBudget, 1, 1, 2));
    assert_eq!(o.events, vec![mc(1), ev("tool_call", "read_ticket", 1), ev("model_budget", "model", 1)]);
}

#[tokio::test]
async fn scenario_deadline() {
    let (o, _) = check(Scenario::Deadline).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::DeadlineExceeded, 0, 1, 2));
    assert_eq!(o.events, vec![mc(1), ev("deadline_exceeded", "run", 1_000)]);
}

#[tokio::test]
async fn scenario_unavailable() {
    let (o, _) = check(Scenario::Unavailable).await;
    assert_eq!((o.status, o.tool_calls, o.model_calls, o.exit_code()), (AgentStatus::ProviderUnavailable, 0, 1, 2));
    assert_eq!(o.events, vec![mc(1), ev("provider_unavailable", "model", 1)]);
}

#[tokio::test]
async fn scenario_names_round_trip_and_the_report_is_the_cli_json() {
    for scenario in Scenario::ALL {
        assert_eq!(Scenario::parse(scenario.name()), Some(scenario));
    }
    let (o, _) = check(Scenario::Repeat).await;
    let json = serde_json::to_value(o.report()).expect("serializes");
    let keys: Vec<&String> = json.as_object().expect("an object").keys().collect();
    assert_eq!(keys.len(), 4);
    assert_eq!(json["status"], "repeated_call");
    assert_eq!(json["events"][1], serde_json::json!({"kind": "tool_call", "name": "read_ticket", "count": 1}));
}

#[tokio::test]
async fn scenario_changing_resumed_after_a_crash_keeps_its_counters() {
    let reference = MemoryJournal::new();
    let rig = Rig::new();
    let transport = ScriptedTransport::from_file(Scenario::Changing.transcript(fixtures())).expect("loads");
    let caps = all_capabilities();
    run(rig.env(&reference), &transport, "run-1", AgentLimits::default(), caps.clone()).await.expect("runs");
    // Die right after the third tool result is durable.
    let events = reference.events();
    let cut = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, AgentEvent::ToolResultRecorded { .. }))
        .nth(2)
        .map(|(i, _)| i + 1)
        .expect("three results");
    let crashing = MemoryJournal::crash_after(cut);
    let transport = ScriptedTransport::from_file(Scenario::Changing.transcript(fixtures())).expect("loads");
    let died = run(rig.env(&crashing), &transport, "run-1", AgentLimits::default(), caps.clone()).await;
    assert!(matches!(died, Err(AgentError::Journal(JournalError::Crashed { .. }))));
    // Restart: new process, same journal, transcript positioned after the recorded answers.
    let journal = MemoryJournal::with_events(crashing.events());
    let state = AgentState::from_events(&journal.events());
    assert_eq!(state.tool_calls, 3);
    let transport =
        ScriptedTransport::from_file(Scenario::Changing.transcript(fixtures())).expect("loads").resuming(&state);
    let o = run(rig.env(&journal), &transport, "run-1", AgentLimits::default(), caps).await.expect("resumes");
    assert_eq!((o.status, o.tool_calls, o.model_calls), (AgentStatus::ToolBudget, 4, 5));
    assert_eq!(transport.calls_made(), 2, "answers 1-3 were recorded and never requested again");
}

#[test]
fn registry_schemas_are_closed() {
    let task = Arc::new(ReviewTask::default());
    let registry = registry(&task);
    assert_eq!(registry.descriptors().len(), 2);
}
