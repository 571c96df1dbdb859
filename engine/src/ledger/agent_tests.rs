//! An agent run at the ledger's boundary: its batches of opaque entries (where they may go,
//! into which runs), what a batch asks of the spine in the same commit (its end and the
//! release of what it never sent, an approval window, a later deadline), and the decisions
//! that read what an agent run left behind (an approval inside its window, the money of an
//! absent charge whose run ended). The agent crate and the binary's agent suites drive the
//! same through the harness; this table pins each rule where the spine decides it.

use super::tests::{decided, key, nine_am, plus, reserve, run, spec, tier, types, variant};
use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, RunId, RunLimits, RunStatus};
use crate::lease::{LeaseGrant, LeaseOwner, LeaseUse};
use crate::log::LogError;
use crate::memory::MemoryLog;
use crate::provider::{CallOutcome, LookupOutcome, UnknownReason};
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// The agent run of every row (the workflow run, where a row needs one, is `run()`).
fn agent() -> RunId {
    RunId::new("agent-1")
}

/// The agent run's deadline, as its first batch fixes it: an hour after nine.
fn deadline() -> DateTime<Utc> {
    plus(3_600_000)
}

/// When the approval window the rows open closes: ten minutes after nine.
const WINDOW_MS: u64 = 600_000;

/// One step of a history.
enum Given {
    /// A batch of one entry at agent position `n`, starting the agent run when it is new.
    Batch(u32, Vec<SpineRequest>),
    /// The workflow run `run()` (not an agent run) reserves the fixture's charge, sent at once.
    WorkflowRun,
    /// The agent run reserves the fixture's charge at journal position 0: held for a human
    /// when `approval`, its first attempt written ahead otherwise.
    Reserved { approval: bool },
    /// The first attempt's answer is lost.
    Lost,
    /// A lookup of the lost answer starts.
    Reconciling,
    /// An operator asks the agent run to stop.
    Cancelled,
    /// The clock moves on.
    Later(u64),
}

/// What the command must come to: these events, in order, or a refusal of this variant of
/// [`Refusal`] that writes nothing.
type Expect = Result<&'static [&'static str], &'static str>;

struct Row {
    name: &'static str,
    given: Vec<Given>,
    command: Action,
    expect: Expect,
}

/// A batch of `entries` entries for `run_id` at `position`, with what it asks of the spine; it
/// starts the agent run if there is none.
fn batch_for(run_id: RunId, position: u32, entries: usize, spine: Vec<SpineRequest>) -> Action {
    let start = AgentRunStart {
        workflow: "ticket-review".into(),
        deadline_at: deadline(),
        input: serde_json::json!({}),
        limits: RunLimits::default(),
        versions: Default::default(),
        owner: None,
    };
    let entries = (0..entries).map(|n| serde_json::json!({ "entry": n })).collect();
    Action::RecordAgentEntries { run_id, position, entries, start: Some(start), spine }
}

/// The agent run's batch of one entry at `position`.
fn batch(position: u32, spine: Vec<SpineRequest>) -> Action {
    batch_for(agent(), position, 1, spine)
}

fn finish(status: RunStatus) -> SpineRequest {
    SpineRequest::Finish { status, detail: None, cost_minor: None }
}

fn open_window() -> SpineRequest {
    SpineRequest::OpenApprovalWindow { key: key(), closes_at: plus(WINDOW_MS) }
}

fn extend_to(deadline_at: DateTime<Utc>) -> SpineRequest {
    SpineRequest::ExtendDeadline { deadline_at }
}

fn approve() -> Action {
    Action::Approve { key: key(), by: "ann".into(), ttl_ms: 60_000, fingerprint: None }
}

fn lookup(outcome: LookupOutcome) -> Action {
    Action::RecordLookup { key: key(), reconciliation: 1, outcome }
}

/// The agent run started, its charge reserved and sent, the answer lost, the run ended
/// (`ended`), and a lookup started.
fn lost_then_looked_up(ended: bool) -> Vec<Given> {
    let mut given = vec![Given::Batch(0, vec![]), Given::Reserved { approval: false }, Given::Lost];
    if ended {
        given.push(Given::Batch(1, vec![finish(RunStatus::OutcomeUnknown)]));
    }
    given.push(Given::Reconciling);
    given
}

fn awaiting_in_window(later_ms: u64) -> Vec<Given> {
    vec![
        Given::Batch(0, vec![]),
        Given::Reserved { approval: true },
        Given::Batch(1, vec![open_window()]),
        Given::Later(later_ms),
    ]
}

fn rows() -> Vec<Row> {
    let started = || vec![Given::Batch(0, vec![])];
    vec![
        // Where a batch goes.
        Row {
            name: "a new agent run starts with its first batch",
            given: vec![],
            command: batch(0, vec![]),
            expect: Ok(&["RunStarted", "AgentRecorded"]),
        },
        Row {
            name: "a batch of two entries records both, in order",
            given: started(),
            command: batch_for(agent(), 1, 2, vec![]),
            expect: Ok(&["AgentRecorded", "AgentRecorded"]),
        },
        Row {
            name: "a batch for a run that does not exist, and no start",
            given: vec![],
            command: Action::RecordAgentEntries {
                run_id: agent(),
                position: 0,
                entries: vec![serde_json::json!({})],
                start: None,
                spine: vec![],
            },
            expect: Err("UnknownRun"),
        },
        Row {
            name: "an empty batch",
            given: started(),
            command: batch_for(agent(), 1, 0, vec![]),
            expect: Err("AgentBatch"),
        },
        Row {
            name: "the next batch at the next position",
            given: started(),
            command: batch(1, vec![]),
            expect: Ok(&["AgentRecorded"]),
        },
        Row {
            name: "a batch at a position already taken",
            given: started(),
            command: batch(0, vec![]),
            expect: Err("AgentPosition"),
        },
        Row {
            name: "a batch past the next position",
            given: started(),
            command: batch(2, vec![]),
            expect: Err("AgentPosition"),
        },
        Row {
            name: "a batch for an agent run that finished",
            given: vec![Given::Batch(0, vec![]), Given::Batch(1, vec![finish(RunStatus::Completed)])],
            command: batch(2, vec![]),
            expect: Err("RunFinished"),
        },
        Row {
            name: "a batch for a workflow run",
            given: vec![Given::WorkflowRun],
            command: batch_for(run(), 0, 1, vec![]),
            expect: Err("AgentBatch"),
        },
        Row {
            name: "a run asked to stop takes no batch that does not stop it",
            given: vec![Given::Batch(0, vec![]), Given::Cancelled],
            command: batch(1, vec![]),
            expect: Err("RunCancelled"),
        },
        Row {
            name: "a run asked to stop takes the batch that stops it",
            given: vec![Given::Batch(0, vec![]), Given::Cancelled],
            command: batch(1, vec![finish(RunStatus::Cancelled)]),
            expect: Ok(&["AgentRecorded", "RunFinished"]),
        },
        // What a batch asks of the spine.
        Row {
            name: "a run's end releases the charge it reserved and never sent",
            given: vec![Given::Batch(0, vec![]), Given::Reserved { approval: true }],
            command: batch(1, vec![finish(RunStatus::Completed)]),
            expect: Ok(&["AgentRecorded", "RunFinished", "IntentReleased"]),
        },
        Row {
            name: "a run's end leaves a charge in flight to its answer",
            given: vec![Given::Batch(0, vec![]), Given::Reserved { approval: false }],
            command: batch(1, vec![finish(RunStatus::OutcomeUnknown)]),
            expect: Ok(&["AgentRecorded", "RunFinished"]),
        },
        Row {
            name: "an approval window opens for a charge awaiting approval",
            given: vec![Given::Batch(0, vec![]), Given::Reserved { approval: true }],
            command: batch(1, vec![open_window()]),
            expect: Ok(&["AgentRecorded", "ApprovalRequested"]),
        },
        Row {
            name: "no approval window for a charge already sent",
            given: vec![Given::Batch(0, vec![]), Given::Reserved { approval: false }],
            command: batch(1, vec![open_window()]),
            expect: Ok(&["AgentRecorded"]),
        },
        Row {
            name: "no approval window for a charge never reserved",
            given: started(),
            command: batch(1, vec![open_window()]),
            expect: Ok(&["AgentRecorded"]),
        },
        Row {
            name: "a later deadline moves the run's",
            given: started(),
            command: batch(1, vec![extend_to(deadline() + chrono::Duration::milliseconds(1))]),
            expect: Ok(&["AgentRecorded", "RunDeadlineExtended"]),
        },
        Row {
            name: "the same deadline moves nothing",
            given: started(),
            command: batch(1, vec![extend_to(deadline())]),
            expect: Ok(&["AgentRecorded"]),
        },
        Row {
            name: "an earlier deadline never moves the run's back",
            given: started(),
            command: batch(1, vec![extend_to(deadline() - chrono::Duration::milliseconds(1))]),
            expect: Ok(&["AgentRecorded"]),
        },
        // What follows from an agent run's facts.
        Row {
            name: "an approval inside the window the agent opened",
            given: awaiting_in_window(WINDOW_MS - 1),
            command: approve(),
            expect: Ok(&["ApprovalGranted"]),
        },
        Row {
            name: "an approval the moment the window closes",
            given: awaiting_in_window(WINDOW_MS),
            command: approve(),
            expect: Err("ApprovalWindowClosed"),
        },
        Row {
            name: "an absence proven after the agent run ended frees the money",
            given: lost_then_looked_up(true),
            command: lookup(LookupOutcome::Absent),
            expect: Ok(&["ReconciliationResolved", "IntentReleased"]),
        },
        Row {
            name: "an absence proven while the agent run goes on leaves the resend to it",
            given: lost_then_looked_up(false),
            command: lookup(LookupOutcome::Absent),
            expect: Ok(&["ReconciliationResolved"]),
        },
        Row {
            name: "a lookup that could not answer after the agent run ended proves nothing",
            given: lost_then_looked_up(true),
            command: lookup(LookupOutcome::Unavailable { detail: "503".into() }),
            expect: Ok(&["ReconciliationResolved"]),
        },
    ]
}

/// The log after `given`, and its clock.
fn history(given: &[Given]) -> MemoryLog {
    let clock = Arc::new(ManualClock::new(nine_am()));
    let log = MemoryLog::new(clock.clone());
    let command = |action| Command::new(Cause::command("test"), action);
    for step in given {
        let appended = match step {
            Given::Batch(position, spine) => log.execute_now(&command(batch(*position, spine.clone()))),
            Given::WorkflowRun => log.execute_now(&reserve(tier(true, true), RunLimits::default(), true)),
            Given::Reserved { approval } => {
                let reserve =
                    Action::Reserve { run_id: agent(), position: 0, spec: spec(*approval), start_attempt: !approval };
                log.execute_now(&command(reserve))
            }
            Given::Lost => {
                let timeout = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() };
                log.execute_now(&command(Action::RecordOutcome { key: key(), attempt: 1, outcome: timeout }))
            }
            Given::Reconciling => {
                log.execute_now(&command(Action::StartReconciliation { key: key(), force: true, run_id: agent() }))
            }
            Given::Cancelled => {
                let cancel = Action::CancelRun { run_id: agent(), by: "ann".into(), reason: "runaway".into() };
                log.execute_now(&Command::new(Cause::operator("ann"), cancel))
            }
            Given::Later(ms) => {
                clock.advance_ms(i64::try_from(*ms).expect("a delay of minutes"));
                continue;
            }
        };
        appended.unwrap_or_else(|e| panic!("the history is accepted: {e}"));
    }
    log
}

#[test]
fn each_agent_command_appends_what_the_table_says_or_is_refused_with_nothing_written() {
    for row in rows() {
        let log = history(&row.given);
        let got = decided(&log, Command::new(Cause::command("test"), row.command));
        match (got, row.expect) {
            (Ok(events), Ok(expected)) => assert_eq!(types(&events), expected, "{}", row.name),
            (Err(refusal), Err(expected)) => assert_eq!(variant(&refusal), expected, "{}", row.name),
            (got, expected) => panic!("{}: expected {expected:?}, got {got:?}", row.name),
        }
    }
}

/// An agent run's first batch starts it as an agent run (its workflow under the agent prefix,
/// its deadline the harness's), held by the process that started it: a later batch must
/// present that process's fencing token.
#[test]
fn an_agent_run_starts_with_its_first_batch_held_by_its_starter() {
    let log = history(&[]);
    let mut first = batch(0, vec![]);
    if let Action::RecordAgentEntries { start: Some(start), .. } = &mut first {
        start.owner = Some(LeaseOwner::named("harness"));
    }
    decided(&log, Command::new(Cause::command("test"), first)).expect("the first batch starts the run");
    let started = log.ledger().run(&agent()).cloned().expect("the run");
    assert!(started.is_agent());
    assert_eq!(started.workflow, format!("{AGENT_WORKFLOW_PREFIX}ticket-review"));
    assert_eq!((started.deadline_at, started.agent_entries, started.status), (deadline(), 1, None));

    let unheld = log.execute_now(&Command::new(Cause::command("test"), batch(1, vec![])));
    assert!(matches!(unheld, Err(LogError::Refused(Refusal::Fenced { current: 1, .. }))), "{unheld:?}");
    let held = Command::new(Cause::command("test"), batch(1, vec![]))
        .under(LeaseUse::Hold(LeaseGrant { run_id: agent(), token: 1 }));
    assert_eq!(types(&decided(&log, held).expect("the starter's token")), ["AgentRecorded"]);
}
