//! Delegations: a sub-agent as a tool, its carve, its count limit, its effects, its crashes.

use super::*;

const DESK: &str = "refund_desk";
const CAPS: &[&str] = &["ticket.read", "order.refund", "desk.delegate"];

/// The sub-agent's limits as it asks for them.
fn desk_limits() -> AgentLimits {
    AgentLimits { model_calls_max: 3, tool_calls_max: 2, deadline_ms: 60_000, ..AgentLimits::default() }
}

/// The rig's tools, and a refund desk: a sub-agent with the same tools of its own.
fn with_desk(rig: &mut Rig, limits: AgentLimits) {
    let desk = Delegation::new("1", registry(&rig.bodies), "You are the refund desk.", limits, |state: &AgentState| {
        state.tool_succeeded("refund")
    });
    let mut parent = registry(&rig.bodies);
    parent.delegate(DESK, "Hands a refund to the refund desk.", "desk.delegate", desk).expect("the desk registers");
    rig.registry = parent;
}

fn ask_desk(id: &str, question: &str) -> Step {
    calls(id, DESK, &json!({ "question": question }).to_string())
}

fn desk_done(state: &AgentState) -> bool {
    state.tool_succeeded(DESK)
}

/// The parent reads, delegates a refund, and concludes; the desk refunds and says so.
fn desk_script() -> Vec<Step> {
    vec![
        calls("p1", "read_ticket", r#"{"input":42}"#),
        ask_desk("p2", "Refund 5.00 EUR on order C-1042 with key k1."),
        refund("d1", "k1", 500, "EUR"),
        says("Refunded 5.00 EUR (re_1)."),
        says("The desk refunded the order."),
    ]
}

async fn go_desk(rig: &Rig, journal: &MemoryJournal, script: &Script, limits: AgentLimits) -> RunOutcome {
    run(rig.env(journal), script, &rig.registry, &spec(limits, CAPS), &desk_done).await.expect("no internal error")
}

fn carves(events: &[AgentEvent]) -> usize {
    events
        .iter()
        .filter(
            |e| matches!(e, AgentEvent::Delegated { fact, .. } if matches!(**fact, AgentEvent::AgentRunStarted { .. })),
        )
        .count()
}

#[tokio::test]
async fn a_sub_agent_starts_from_the_question_alone_after_its_carve_is_recorded() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let journal = MemoryJournal::new();
    let script = Script::new(desk_script());
    let outcome = go_desk(&rig, &journal, &script, AgentLimits::default()).await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    assert_eq!((outcome.model_calls, outcome.tool_calls), (5, 3), "the desk's calls are the run's");
    assert_eq!(rig.refunds(), 1);

    // The desk's first request: its own instructions and tools, and the question, nothing else.
    let requests = script.requests.lock().expect("test mutex");
    let first = &requests[2];
    assert_eq!(first.system, "You are the refund desk.");
    assert_eq!(first.messages, vec![Message::User { text: "Refund 5.00 EUR on order C-1042 with key k1.".into() }]);
    assert!(!first.tools.iter().any(|t| t.name == DESK), "a sub-agent is offered no delegation");
    // The parent reads only the desk's conclusion, marked as a model's unverified text.
    let Some(Message::ToolResults { results }) = requests[4].messages.last() else { panic!("the desk's result") };
    assert!(
        results[0].content.contains("Refunded 5.00 EUR (re_1).") && results[0].content.contains(r#""untrusted":true"#)
    );
    assert!(!results[0].content.contains("refunded 500 EUR (refund:t1:k1)"), "never the desk's own tool results");

    // The carve is in the batch of the call's reservation, before the desk's first call.
    let events = journal.events();
    let reserved = events
        .iter()
        .position(|e| matches!(e, AgentEvent::ToolCallReserved { tool, .. } if tool == DESK))
        .expect("the delegation call was reserved");
    let AgentEvent::Delegated { fact, .. } = &events[reserved + 1] else { panic!("the carve follows its reservation") };
    let AgentEvent::AgentRunStarted { limits, run_id, .. } = &**fact else { panic!("the carve is the desk's start") };
    assert_eq!((limits.model_calls_max, limits.tool_calls_max, limits.delegations_max), (3, 2, Some(0)));
    assert_eq!(run_id, "run-1/p2");
    // The desk's effect went through the gate under the parent's run: the spine knows no other.
    assert_eq!(rig.gate.reservations(), vec![("run-1".to_owned(), "refund:t1:k1".to_owned())]);
}

#[tokio::test]
async fn a_carve_is_what_the_parent_has_left_and_holds_it_until_the_sub_agent_stops() {
    let mut rig = Rig::new();
    // The desk asks for 6 model calls; the parent may make 4 and has made 1.
    with_desk(
        &mut rig,
        AgentLimits { model_calls_max: 6, tool_calls_max: 6, no_progress_iterations_max: 10, ..desk_limits() },
    );
    let journal = MemoryJournal::new();
    let mut steps = vec![ask_desk("p1", "Refund what you can.")];
    steps.extend((1..=6).map(|i| calls(&format!("d{i}"), "read_ticket", &format!(r#"{{"input":{i}}}"#))));
    let script = Script::new(steps);
    let limits = AgentLimits { model_calls_max: 4, tool_calls_max: 10, ..AgentLimits::default() };
    let outcome = go_desk(&rig, &journal, &script, limits).await;
    let state = AgentState::from_events(&journal.events());
    let desk = &state.delegations["p1"];
    assert_eq!(desk.header().limits.model_calls_max, 3, "clamped to what was left");
    assert_eq!(desk.stop.as_ref().map(|s| s.status), Some(AgentStatus::ModelBudget));
    assert_eq!(outcome.status, AgentStatus::ModelBudget, "the desk spent the parent's calls: {outcome:?}");
    assert_eq!((outcome.model_calls, script.calls()), (4, 4), "never more calls than the parent's budget");
    assert_eq!(state.model_calls_committed(), 4);
    // Before the desk's first call its whole carve is held against the parent.
    let events = journal.events();
    let carve = events.iter().position(|e| matches!(e, AgentEvent::Delegated { .. })).expect("a carve");
    let started = AgentState::from_events(&events[..=carve]);
    assert_eq!((started.model_calls, started.model_calls_committed()), (1, 4));
}

#[tokio::test]
async fn past_its_delegation_budget_the_run_stops_delegation_budget() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let script = Script::new(vec![
        ask_desk("p1", "Refund 5.00 EUR with key k1."),
        says("Nothing to refund."),
        ask_desk("p2", "Refund 5.00 EUR with key k2."),
    ]);
    let limits = AgentLimits { delegations_max: Some(1), ..AgentLimits::default() };
    let outcome = go_desk(&rig, &MemoryJournal::new(), &script, limits).await;
    assert_eq!(outcome.status, AgentStatus::DelegationBudget);
    assert_eq!(kinds(&outcome).last(), Some(&ev("delegation_budget", DESK, 1)));
    assert_eq!(outcome.status.run_status().as_str(), "delegation_budget");
}

#[tokio::test]
async fn a_sub_agent_awaiting_a_human_suspends_its_parent_and_both_waits_end_together() {
    let mut rig = Rig::new();
    rig.gate = MemoryGate::new(ApprovalDecision::Pending);
    with_desk(&mut rig, desk_limits());
    let journal = MemoryJournal::new();
    let mut steps = desk_script();
    steps[2] = refund("d1", "k1", 20_000, "EUR");
    let limits = AgentLimits::default();
    let outcome = go_desk(&rig, &journal, &Script::new(steps), limits.clone()).await;
    assert_eq!(outcome.status, AgentStatus::AwaitingApproval);
    assert_eq!(outcome.awaiting_approval.as_deref(), Some("refund:t1:k1"));
    let state = AgentState::from_events(&journal.events());
    assert!(state.approval_wait("p2").is_some_and(|w| !w.ended), "the parent waits on its delegation call");

    // Approved: the resumed desk refunds; its wait and its parent's end in one batch.
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let answered = state.answers_made() as usize;
    let mut steps = desk_script();
    steps[2] = refund("d1", "k1", 20_000, "EUR");
    let resumed = MemoryJournal::with_events(journal.events());
    let outcome = go_desk(&rig, &resumed, &Script::skipping(steps, answered), limits).await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    assert_eq!(rig.refunds(), 1);
    let events = resumed.events();
    let ended =
        events.iter().position(|e| matches!(e, AgentEvent::ApprovalWaitEnded { call_id, .. } if call_id == "p2"));
    let child_ended = events.iter().position(
        |e| matches!(e, AgentEvent::Delegated { fact, .. } if matches!(**fact, AgentEvent::ApprovalWaitEnded { .. })),
    );
    assert_eq!(ended.zip(child_ended).map(|(p, c)| p - c), Some(1), "the parent's wait ends right after the desk's");
}

#[tokio::test]
async fn a_crash_anywhere_in_a_delegation_neither_rebills_a_model_call_nor_carves_again() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let full = MemoryJournal::new();
    let reference = go_desk(&rig, &full, &Script::new(desk_script()), AgentLimits::default()).await;
    assert_eq!(reference.status, AgentStatus::Completed);
    let length = full.events().len();
    let carve = full.events().iter().position(|e| matches!(e, AgentEvent::Delegated { .. })).expect("a carve");
    for crash_at in carve - 1..length {
        let mut rig = Rig::new();
        with_desk(&mut rig, desk_limits());
        let crashing = MemoryJournal::crash_after(crash_at);
        let first = Script::new(desk_script());
        let spec = spec(AgentLimits::default(), CAPS);
        let run1 = run(rig.env(&crashing), &first, &rig.registry, &spec, &desk_done).await;
        assert!(matches!(run1, Err(AgentError::Journal(JournalError::Crashed { .. }))), "crash at {crash_at}");
        let survived = crashing.events();
        let answered = AgentState::from_events(&survived).answers_made() as usize;
        let restarted = MemoryJournal::with_events(survived);
        let second = Script::skipping(desk_script(), answered);
        let outcome = go_desk(&rig, &restarted, &second, AgentLimits::default()).await;
        let end = AgentState::from_events(&restarted.events());
        assert_eq!(outcome.status, AgentStatus::Completed, "crash at {crash_at}: {outcome:?}");
        assert_eq!(carves(&restarted.events()), 1, "crash at {crash_at}: carved once");
        assert_eq!(
            first.calls() + second.calls(),
            end.model_calls_made() as usize,
            "crash at {crash_at}: the transport was asked once per reserved call, a recorded answer never again"
        );
        assert!(end.model_calls_committed() <= AgentLimits::default().model_calls_max);
        assert!(rig.refunds() <= 1, "crash at {crash_at}: the resumed refund is the same intent");
    }
}

#[test]
fn the_fold_refuses_a_second_carve_and_a_carve_past_what_is_left() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let full = MemoryJournal::new();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(go_desk(&rig, &full, &Script::new(desk_script()), AgentLimits::default()));
    let events = full.events();
    let carve = events.iter().position(|e| matches!(e, AgentEvent::Delegated { .. })).expect("a carve");
    let mut state = AgentState::from_events(&events[..=carve]);
    assert!(state.clone().try_apply(&events[carve]).is_err_and(|why| why.contains("carved twice")));
    let mut greedy = AgentState::from_events(&events[..carve]);
    let AgentEvent::Delegated { call_id, fact } = &events[carve] else { unreachable!("found above") };
    let mut bigger = (**fact).clone();
    if let AgentEvent::AgentRunStarted { limits, .. } = &mut bigger {
        limits.model_calls_max = 5;
    }
    let refill = AgentEvent::Delegated { call_id: call_id.clone(), fact: Box::new(bigger) };
    assert!(greedy.try_apply(&refill).is_err_and(|why| why.contains("model calls")), "5 asked with 4 left");
    let nested = AgentEvent::Delegated { call_id: call_id.clone(), fact: Box::new(refill) };
    assert!(state.try_apply(&nested).is_err_and(|why| why.contains("delegates nothing")));
}

#[test]
fn a_sub_agent_that_delegates_is_refused_at_registration() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let nested =
        Delegation::new("1", std::mem::take(&mut rig.registry), "Nested.", desk_limits(), |_: &AgentState| true);
    let refused = Registry::new().delegate("outer", "Delegates to a delegating desk.", "desk.delegate", nested);
    assert!(matches!(refused, Err(RegistryError::NestedDelegation { nested, .. }) if nested == DESK));
}

/// Limits that price `test-model` at one minor unit an input token, under a cost cap of
/// 10 000.
fn priced_limits() -> AgentLimits {
    let price = ModelPrice { input_minor_per_mtok: 1_000_000, output_minor_per_mtok: 0 };
    let prices = PriceTable(BTreeMap::from([("test-model".to_owned(), price)]));
    AgentLimits { prices, cost_minor_max: Some(10_000), ..AgentLimits::default() }
}

#[tokio::test]
async fn a_sub_agents_model_cost_is_its_parents() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let journal = MemoryJournal::new();
    let limits = priced_limits();
    let outcome = go_desk(&rig, &journal, &Script::new(desk_script()), limits).await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    let state = AgentState::from_events(&journal.events());
    // Five answers of 100 input tokens at one minor unit a token: the desk's two included.
    assert_eq!((state.cost_minor, state.model_cost().cost_minor), (300, Some(500)));
}

#[tokio::test]
async fn a_sub_agents_answer_without_a_price_makes_its_parents_cost_unknown() {
    let mut rig = Rig::new();
    with_desk(&mut rig, desk_limits());
    let journal = MemoryJournal::new();
    let limits = priced_limits();
    // The desk's first answer comes from a model the table does not price.
    let mut steps = desk_script();
    if let Step::Answer(response) = &mut steps[2] {
        response.model = "unpriced-model".into();
    }
    go_desk(&rig, &journal, &Script::new(steps), limits).await;
    let state = AgentState::from_events(&journal.events());
    assert_eq!(state.unpriced_answers, 0, "the parent's own answers were all priced");
    assert_eq!(state.delegations["p2"].unpriced_answers, 1);
    assert_eq!(state.model_cost(), ModelCost { cost_minor: None, unpriced_answers: 1 }, "unknown, never a partial sum");
    assert_eq!(state.model_cost().to_string(), "unknown (1 answer without a price)");
}

/// The desk's money carve, from its start in `events`.
fn desk_money(events: &[AgentEvent]) -> Option<i64> {
    AgentState::from_events(events).delegations.get("p2").and_then(|desk| desk.header().limits.money_minor_max)
}

#[tokio::test]
async fn a_sub_agents_money_cap_is_the_smaller_of_what_it_asks_and_what_the_run_has_left() {
    // The run may move 10 000; the parent refunds 3 000 itself before it delegates.
    let script = || {
        Script::new(vec![
            refund("p1", "k0", 3_000, "EUR"),
            ask_desk("p2", "Refund what is left."),
            says("Nothing to refund."),
            says("Done."),
        ])
    };
    for (asked, carved) in [(Some(9_000), 7_000), (Some(2_000), 2_000), (None, 7_000)] {
        let mut rig = Rig::new();
        rig.gate = MemoryGate::new(ApprovalDecision::Approved).with_money_budget(10_000);
        with_desk(&mut rig, AgentLimits { money_minor_max: asked, ..desk_limits() });
        let journal = MemoryJournal::new();
        go_desk(&rig, &journal, &script(), AgentLimits::default()).await;
        assert_eq!(desk_money(&journal.events()), Some(carved), "asked {asked:?} with 7 000 left");
    }
    // A run without a money budget carves what the desk asks, or no cap at all.
    let mut rig = Rig::new();
    with_desk(&mut rig, AgentLimits { money_minor_max: None, ..desk_limits() });
    let journal = MemoryJournal::new();
    go_desk(&rig, &journal, &script(), AgentLimits::default()).await;
    assert_eq!(desk_money(&journal.events()), None, "no cap beyond the run's, which has none");
}

/// The desk refunds 600 of its 1 000, then asks for 500 more.
fn capped_script() -> Vec<Step> {
    vec![
        calls("p1", "read_ticket", r#"{"input":42}"#),
        ask_desk("p2", "Refund 6.00 EUR with key k1, then 5.00 EUR with key k2."),
        refund("d1", "k1", 600, "EUR"),
        refund("d2", "k2", 500, "EUR"),
        says("Refunded 6.00 EUR; 5.00 EUR more was refused."),
        says("The desk refunded 6.00 EUR."),
    ]
}

fn capped_rig() -> Rig {
    let mut rig = Rig::new();
    with_desk(&mut rig, AgentLimits { money_minor_max: Some(1_000), no_progress_iterations_max: 4, ..desk_limits() });
    rig
}

fn refused_codes(events: &[AgentEvent]) -> Vec<String> {
    let state = AgentState::from_events(events);
    let desk = state.delegations.get("p2").map(|desk| desk.control.clone()).unwrap_or_default();
    desk.into_iter().filter(|e| e.kind == "budget_exhausted").map(|e| e.name).collect()
}

#[tokio::test]
async fn a_refund_within_a_sub_agents_cap_goes_through_and_one_past_it_is_refused_before_any_reservation() {
    let rig = capped_rig();
    let journal = MemoryJournal::new();
    let outcome = go_desk(&rig, &journal, &Script::new(capped_script()), AgentLimits::default()).await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    assert_eq!(rig.refunds(), 1, "the 600 went through, the 500 never reached a body");
    assert_eq!(
        rig.gate.reservations(),
        vec![("run-1".to_owned(), "refund:t1:k1".to_owned())],
        "the refund past the cap reserved nothing"
    );
    let events = journal.events();
    assert_eq!(refused_codes(&events), ["refund"], "refused by the cap, by name");
    let refusal = events.iter().find_map(|e| match e {
        AgentEvent::Delegated { fact, .. } => match &**fact {
            AgentEvent::ToolCallRefused { code, message, .. } if code == "budget_exhausted" => Some(message.clone()),
            _ => None,
        },
        _ => None,
    });
    let refusal = refusal.expect("the refusal is the desk's result");
    assert!(
        refusal.contains("may move 1000 minor units (its money cap) and has committed 600; 500 more asked"),
        "{refusal}"
    );
    assert_eq!(AgentState::from_events(&events).delegations["p2"].money_committed_minor(), 600);
}

#[tokio::test]
async fn after_a_crash_a_sub_agents_spent_money_is_still_spent() {
    let full = MemoryJournal::new();
    let reference = go_desk(&capped_rig(), &full, &Script::new(capped_script()), AgentLimits::default()).await;
    assert_eq!(reference.status, AgentStatus::Completed);
    let length = full.events().len();
    let carve = full.events().iter().position(|e| matches!(e, AgentEvent::Delegated { .. })).expect("a carve");
    for crash_at in carve..length {
        let rig = capped_rig();
        let crashing = MemoryJournal::crash_after(crash_at);
        let spec = spec(AgentLimits::default(), CAPS);
        let run1 = run(rig.env(&crashing), &Script::new(capped_script()), &rig.registry, &spec, &desk_done).await;
        assert!(matches!(run1, Err(AgentError::Journal(JournalError::Crashed { .. }))), "crash at {crash_at}");
        let survived = crashing.events();
        let answered = AgentState::from_events(&survived).answers_made() as usize;
        let restarted = MemoryJournal::with_events(survived);
        let second = Script::skipping(capped_script(), answered);
        let outcome = go_desk(&rig, &restarted, &second, AgentLimits::default()).await;
        assert_eq!(outcome.status, AgentStatus::Completed, "crash at {crash_at}: {outcome:?}");
        let events = restarted.events();
        assert_eq!(refused_codes(&events), ["refund"], "crash at {crash_at}: the 500 is still past the cap");
        let desk = &AgentState::from_events(&events).delegations["p2"];
        assert_eq!(desk.money_committed_minor(), 600, "crash at {crash_at}: the 600 is counted once");
        assert!(rig.refunds() <= 1, "crash at {crash_at}: one refund body at most");
    }
}
