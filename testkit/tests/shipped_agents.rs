//! Keel's own agents under the kit (issue 12): `ticket_review` and `support_agent` (its
//! refund, and its refund desk — a sub-agent — doing it), each with its scripted transcript
//! from `fixtures/agent/`, crashed at seeded journal commits and, for the refunds, under every
//! provider fault. The kit checks what it checks for a user's agent: no recorded model call
//! asked again, no replayed effect call re-keyed, no counter refilled (its sub-agent's carve
//! included), and every invariant of the log. A failing seed is printed with how to replay it.

use adapters::model::scripted::Transcript;
use engine::executor::Registered;
use serde_json::json;
use std::path::Path;
use testkit::{Agent, AgentHost, Kit, SeedReport};
use workflows::support_agent::{self, Scenario as Support};
use workflows::ticket_review::{self, ReviewTask, Scenario as Review};

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures"))
}

/// Seed 003's complete review: read ticket 42, finish the review, say so.
fn ticket_review_agent() -> Agent {
    let transcript = Transcript::from_file(Review::Complete.transcript(fixtures())).expect("the transcript parses");
    // The review's host state (ticket read, review finished) is rebuilt from what the
    // journal recorded, in every process, as `ticket_review::run` does.
    let tools = |host: &AgentHost<'_>| ticket_review::registry(&ReviewTask::restore(host.recorded));
    Agent::new(ticket_review::WORKFLOW, transcript, tools, ticket_review::is_complete)
        .prompt(ticket_review::SYSTEM, ticket_review::PROMPT)
        .limits(Review::Complete.limits())
        .capabilities([ticket_review::CAP_READ, ticket_review::CAP_FINISH])
}

/// The support agent over `scenario`'s ticket and transcript. No refund waits for a human
/// here (the kit plays no operator): the tool's threshold is above any amount, and the kit's
/// spine limits set none.
fn support_agent(scenario: Support) -> Agent {
    let transcript = Transcript::from_file(scenario.transcript(fixtures())).expect("the transcript parses");
    let case = scenario.case();
    let tools = move |host: &AgentHost<'_>| {
        support_agent::registry(
            host.run_id,
            &case,
            host.gate,
            support_agent::RefundApproval::Above(engine::limits::AMOUNT_MINOR_MAX),
        )
    };
    Agent::new(support_agent::WORKFLOW, transcript, tools, support_agent::is_complete)
        .prompt(support_agent::SYSTEM, support_agent::PROMPT)
        .limits(support_agent::limits())
        .capabilities([
            support_agent::CAP_TICKET,
            support_agent::CAP_ORDER,
            support_agent::CAP_REFUND,
            support_agent::CAP_DELEGATE,
        ])
}

/// The kit over `scenario`'s support run and the charge of its order (which a refund needs:
/// the ledger refunds no more than was charged), in a seeded order.
fn support_kit(scenario: Support) -> Kit {
    let order = scenario.case().order;
    let charge = json!({"tenant_id": support_agent::TENANT, "intent_id": format!("charge-{}-000001", order.id),
        "order_id": order.id, "amount_minor": order.amount_minor, "currency": order.currency,
        "payment_method_token": testkit::sample::CARD_TOKEN});
    Kit::new(vec![Registered::new(workflows::charge::Charge::default())])
        .submit("charge", charge)
        .agent(support_agent(scenario))
        .crash_probability(0.8)
}

fn some_seed_crashed(reports: &[SeedReport]) -> bool {
    reports.iter().any(|r| r.crashes > 0)
}

#[test]
fn the_ticket_review_under_crashes_never_asks_a_recorded_answer_again() {
    let kit = Kit::new(Vec::new()).agent(ticket_review_agent()).seeds(1, 4).crash_probability(0.8);
    let reports = kit.run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(some_seed_crashed(&reports), "some seed crashed the review: {reports:#?}");
}

#[test]
fn the_support_agent_refunds_once_at_most_under_crashes_and_faults() {
    let reports = support_kit(Support::Refund).seeds(1, 4).run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(some_seed_crashed(&reports), "some seed crashed the agent: {reports:#?}");
    assert!(reports.iter().all(|r| r.report.effects <= 2), "one charge and one refund at most: {reports:#?}");
}

#[test]
fn the_support_agents_refund_desk_refunds_once_at_most_under_crashes_and_faults() {
    let reports = support_kit(Support::Delegate).seeds(1, 4).run().unwrap_or_else(|failure| panic!("{failure}"));
    assert!(some_seed_crashed(&reports), "some seed crashed the agent or its desk: {reports:#?}");
    assert!(reports.iter().all(|r| r.report.effects <= 2), "one charge and one refund at most: {reports:#?}");
}
