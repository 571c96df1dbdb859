//! The guard's rules the scenarios of the parent module leave unchecked: an answer whose
//! tool calls reuse an id (none of its calls runs, each id is answered once, within the
//! schema-correction budget), and an approval wait polled while its window is open (nothing
//! recorded) and after it closed (the run stops). Same rig: the in-test transport, the
//! in-memory journal and gate, a manual clock.

use super::*;

/// One answer of three read calls, two of them under the id `c1`.
fn reusing_an_id() -> Step {
    let calls = vec![
        tool_use("c1", "read_ticket", r#"{"input":42}"#),
        tool_use("c1", "read_ticket", r#"{"input":7}"#),
        tool_use("c2", "read_ticket", r#"{"input":42}"#),
    ];
    Step::Answer(response(calls, StopReason::ToolUse))
}

/// How the journal answered each call id of a refused answer: the code, and the correction
/// count for a reused id.
fn answers(journal: &MemoryJournal) -> Vec<(String, String, Option<u32>)> {
    journal
        .events()
        .iter()
        .filter_map(|event| match event {
            AgentEvent::SchemaCorrectionCounted { call_id, code, count, message, .. } => {
                assert!(message.contains("2 tool calls of this answer use the id \"c1\""), "{message}");
                Some((call_id.clone(), code.as_str().to_owned(), Some(*count)))
            }
            AgentEvent::ToolCallRefused { call_id, code, .. } => Some((call_id.clone(), code.clone(), None)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn agent_an_answer_that_reuses_a_call_id_runs_none_of_its_calls_and_answers_each_id_once() {
    let rig = Rig::new();
    let journal = MemoryJournal::new();
    let script = Script::new(vec![reusing_an_id(), calls("c3", "read_ticket", r#"{"input":42}"#), says("Done.")]);
    let outcome = go(&rig, &journal, &script, AgentLimits::default(), ALL).await;
    assert_eq!(outcome.status, AgentStatus::Completed);
    assert_eq!(rig.reads(), 1, "only the call proposed again under its own id ran");
    let expected =
        [("c1".to_owned(), "reused_call_id".to_owned(), Some(1)), ("c2".into(), "answer_refused".into(), None)];
    assert_eq!(answers(&journal), expected);

    // No correction left: the run stops at the reused id, and nothing runs.
    let rig = Rig::new();
    let journal = MemoryJournal::new();
    let limits = AgentLimits { schema_corrections_max: 0, ..AgentLimits::default() };
    let outcome = go(&rig, &journal, &Script::new(vec![reusing_an_id()]), limits, ALL).await;
    assert_eq!(outcome.status, AgentStatus::SchemaBudget);
    assert_eq!(rig.reads(), 0);
    assert_eq!(answers(&journal), []);
}

#[tokio::test]
async fn agent_an_approval_wait_records_nothing_while_its_window_is_open_and_stops_the_run_once_it_closed() {
    let steps = || vec![refund("c1", "k1", 20_000, "EUR"), says("ok")];
    // Each process its own rig (a fresh gate, the clock at the wait's start), waiting on a human.
    let waiting = || {
        let mut rig = Rig::new();
        rig.gate = MemoryGate::new(ApprovalDecision::Pending);
        rig
    };
    let journal = MemoryJournal::new();
    let outcome = go(&waiting(), &journal, &Script::new(steps()), AgentLimits::default(), ALL).await;
    assert_eq!(outcome.status, AgentStatus::AwaitingApproval);
    let recorded = journal.events().len();

    let window_ms = AgentLimits::default().approval_wait_ms();
    let rig = waiting();
    rig.clock.advance_ms(i64::try_from(window_ms - 1).expect("a window of hours"));
    let polled = go(&rig, &journal, &Script::skipping(steps(), 1), AgentLimits::default(), ALL).await;
    assert_eq!(polled.status, AgentStatus::AwaitingApproval);
    assert_eq!(journal.events().len(), recorded, "a poll inside the window records nothing");

    let rig = waiting();
    rig.clock.advance_ms(i64::try_from(window_ms).expect("a window of hours"));
    let closed = go(&rig, &journal, &Script::skipping(steps(), 1), AgentLimits::default(), ALL).await;
    assert_eq!(closed.status, AgentStatus::DeadlineExceeded);
    assert!(closed.detail.as_deref().is_some_and(|d| d.contains("approval window closed")), "{:?}", closed.detail);
    assert_eq!(rig.refunds(), 0, "nothing was refunded without a human");
}
