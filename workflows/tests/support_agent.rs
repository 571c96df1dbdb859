//! Seed 002's support agent against the in-memory log and provider (the same decide/apply
//! code the SQLite store runs): each test replays a scripted transcript from
//! `fixtures/agent/support/`, acts as the human operator between runs, and counts the
//! provider's effects. Each test names the rule it proves.

use adapters::model::scripted::{ScriptedTransport, Transcript};
use adapters::stripe::local_capability;
use agent::IntentGate;
use agent::{
    AgentEnv, AgentLimits, AgentState, AgentStatus, ApprovalPolicy, Cancellation, EffectClass, EffectIntent,
    EffectOutcome, LogJournal, ManualTimer, NewRun, Registry, RunOutcome, RunSpec, Tool, ToolContext, ToolOutput,
    ToolSpec,
};
use chrono::{TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, RunId};
use engine::executor::{Executor, RunRequest, Runtime};
use engine::ledger::{Action, Command, Intent, IntentStatus, Reply};
use engine::log::EventLog;
use engine::memory::{MemoryLog, MemoryProvider};
use engine::provider::{Capability, EffectKind};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use testkit::sample::CARD_TOKEN;
use workflows::support_agent::{self, Order, Scenario, TENANT};

struct Desk {
    clock: Arc<ManualClock>,
    log: Arc<MemoryLog>,
    provider: Arc<MemoryProvider>,
    executor: Executor,
    gate: Arc<IntentGate>,
}

impl Desk {
    fn new() -> Self {
        let clock =
            Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("a valid instant")));
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let capability = Capability { request_timeout_ms: 0, ..local_capability() };
        let provider = Arc::new(MemoryProvider::new(capability));
        let runtime = Runtime {
            log: log.clone(),
            provider: provider.clone(),
            clock: clock.clone(),
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("support-test")),
        };
        let gate = Arc::new(IntentGate::new(runtime.clone(), Cause::command("agent")));
        Self { executor: Executor::new(runtime, workflows::builtin(None)), clock, log, provider, gate }
    }

    /// Charges `order` in full through the `charge` workflow: what the refund invariant reads.
    async fn charge(&self, order: &Order) {
        let input = json!({"tenant_id": TENANT, "intent_id": format!("charge-{}-000001", order.id),
            "order_id": order.id, "amount_minor": order.amount_minor, "currency": order.currency,
            "payment_method_token": CARD_TOKEN});
        let request = RunRequest {
            run_id: RunId::new(format!("charge-{}", order.id)),
            limits: engine::event::RunLimits {
                approval_threshold_minor: None,
                ..support_agent::spine_limits(support_agent::APPROVAL_THRESHOLD_DEFAULT_MINOR)
            },
            deadline_ms: 120_000,
            cause: Cause::command("charge"),
        };
        let outcome = self.executor.start("charge", &input, request).await.expect("the charge runs");
        assert_eq!(outcome.status.as_str(), "completed", "the order is charged: {}", outcome.output);
    }

    /// Starts or resumes the support run `run_id` of `scenario`.
    async fn agent(&self, scenario: Scenario, run_id: &str) -> RunOutcome {
        let lessee = self.executor.runtime().lessee.clone();
        let start = NewRun {
            input: json!({"scenario": scenario.name()}),
            limits: support_agent::spine_limits(support_agent::APPROVAL_THRESHOLD_DEFAULT_MINOR),
            versions: engine::event::RunVersions::this_release(),
        };
        let log: Arc<dyn EventLog> = self.log.clone();
        let journal = LogJournal::new(log, RunId::new(run_id), Cause::command("agent"), Some(start), lessee);
        let recorded = agent_state_of(&self.log, run_id);
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fixtures");
        let transcript = Transcript::from_file(scenario.transcript(root)).expect("the transcript parses");
        let transport = ScriptedTransport::new(transcript).resuming(&recorded);
        let timer = ManualTimer::new(self.clock.clone());
        let cancel = Cancellation::new();
        let env = AgentEnv { journal: &journal, clock: &*self.clock, timer: &timer, cancel: &cancel, gate: None };
        support_agent::run(
            env,
            &transport,
            (run_id, support_agent::PROMPT.to_owned()),
            &scenario.case(),
            &self.gate,
            (support_agent::limits(), support_agent::all_capabilities()),
            &support_agent::spine_limits(support_agent::APPROVAL_THRESHOLD_DEFAULT_MINOR),
        )
        .await
        .expect("the run ends with an outcome")
    }

    fn operator(&self, action: Action) -> Result<Reply, engine::log::LogError> {
        self.log.execute_now(&Command::new(Cause::operator("ana"), action))
    }

    fn approve(&self, key: &str, fingerprint: Option<String>) -> Result<Reply, engine::log::LogError> {
        let key = engine::event::IntentKey::parse(key).expect("an intent key");
        self.operator(Action::Approve { key, by: "ana".into(), ttl_ms: 600_000, fingerprint })
    }

    fn refunds(&self) -> Vec<Intent> {
        self.log.ledger().intents().into_iter().filter(|i| i.definition.kind == EffectKind::Refund).cloned().collect()
    }

    fn state(&self, run_id: &str) -> AgentState {
        agent_state_of(&self.log, run_id)
    }
}

/// An agent run's state, folded from its facts in `log` (empty when it has none).
fn agent_state_of(log: &MemoryLog, run_id: &str) -> AgentState {
    use engine::ledger::View as _;
    let entries = log.ledger().history(&RunId::new(run_id)).map(|h| h.agent_entries).unwrap_or_default();
    let facts: Vec<agent::AgentEvent> =
        entries.into_iter().map(|entry| serde_json::from_value(entry).expect("an agent fact decodes")).collect();
    AgentState::from_events(&facts)
}

fn awaiting(outcome: &RunOutcome) -> String {
    assert_eq!(outcome.status, AgentStatus::AwaitingApproval, "{outcome:?}");
    assert_eq!(outcome.exit_code(), 2);
    outcome.awaiting_approval.clone().expect("a suspended run names its intent")
}

#[tokio::test]
async fn a_normal_refund_waits_for_its_approval_then_is_validated_once() {
    let desk = Desk::new();
    desk.charge(&support_agent::order_c1042()).await;
    let charged = desk.provider.effect_count();
    let key = awaiting(&desk.agent(Scenario::Refund, "run-refund").await);
    assert!(key.starts_with(&format!("refund:{TENANT}:agent-")), "{key}");
    assert_eq!(desk.provider.effect_count(), charged, "nothing is refunded before the approval");
    // A resume before the decision suspends again, spends nothing, records nothing.
    let before = desk.log.events().len();
    assert_eq!(awaiting(&desk.agent(Scenario::Refund, "run-refund").await), key);
    assert_eq!(desk.log.events().len(), before, "polling a suspended run writes nothing (issue 15, item 5)");
    desk.approve(&key, None).expect("the operator approves");
    let outcome = desk.agent(Scenario::Refund, "run-refund").await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    assert_eq!(outcome.model_calls, 3);
    assert_eq!(outcome.tool_calls, 3, "read_ticket, read_order, refund: the resumed call was not counted again");
    assert_eq!(desk.provider.effect_count(), charged + 1, "exactly one refund at the provider");
    let refunds = desk.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].status, IntentStatus::Validated);
    assert_eq!(refunds[0].definition.order_id, "C-1042");
    assert_eq!(refunds[0].definition.amount_minor, 8990);
}

#[tokio::test]
async fn the_injected_note_refunds_no_other_order_and_nothing_without_approval() {
    let desk = Desk::new();
    desk.charge(&support_agent::order_c1042()).await;
    let charged = desk.provider.effect_count();
    let key = awaiting(&desk.agent(Scenario::Injection, "run-injection").await);
    let state = desk.state("run-injection");
    let ticket = state.results().find(|r| r.tool == "read_ticket").expect("the ticket was read");
    let wrapped: serde_json::Value = serde_json::from_str(&ticket.content).expect("the ticket comes back as JSON");
    assert_eq!(wrapped["untrusted"], true, "third-party text is marked untrusted");
    assert!(wrapped["provenance"].as_str().is_some_and(|p| p.contains("customer")), "{wrapped}");
    let refused: Vec<&str> = state.results().filter(|r| r.tool == "refund").map(|r| r.content.as_str()).collect();
    assert_eq!(refused.len(), 2, "C-2210 and C-3107 each got one error result");
    assert!(refused.iter().all(|c| c.contains("order_id")), "refused as an unknown property: {refused:?}");
    let refunds = desk.refunds();
    assert_eq!(refunds.len(), 1, "only the ticket's own order reached the ledger");
    assert_eq!(refunds[0].definition.order_id, "C-1042");
    assert_eq!(refunds[0].status, IntentStatus::AwaitingApproval, "'validation already obtained' is not an approval");
    assert_eq!(desk.provider.effect_count(), charged, "zero effects while awaiting approval");
    // The human denies: the call ends with a denied error result, the run is incomplete.
    let denied = engine::event::IntentKey::parse(&key).expect("an intent key");
    desk.operator(Action::Deny { key: denied, by: "ana".into(), reason: "injected note".into() }).expect("denies");
    let outcome = desk.agent(Scenario::Injection, "run-injection").await;
    assert_eq!(outcome.status, AgentStatus::Incomplete, "{outcome:?}");
    assert!(outcome.events.iter().any(|e| e.kind == "approval_denied" && e.name == "refund"));
    assert_eq!(desk.provider.effect_count(), charged, "no refund at all");
}

#[tokio::test]
async fn three_identical_refunds_of_the_whole_order_make_one_refund() {
    let desk = Desk::new();
    desk.charge(&support_agent::order_c1042()).await;
    let charged = desk.provider.effect_count();
    let key = awaiting(&desk.agent(Scenario::Repeat, "run-repeat").await);
    desk.approve(&key, None).expect("the operator approves");
    let outcome = desk.agent(Scenario::Repeat, "run-repeat").await;
    assert_eq!(outcome.status, AgentStatus::Completed, "{outcome:?}");
    assert_eq!(outcome.tool_calls, 5, "the three refund calls were admitted: the repetition limit is 3");
    assert_eq!(desk.provider.effect_count(), charged + 1, "exactly one refund at the provider");
    let refunds = desk.refunds();
    assert_eq!(refunds.len(), 1, "8990, 8990 and 8990.0 are one canonical call: one key");
    assert_eq!(refunds[0].status, IntentStatus::Validated);
    assert_eq!(refunds[0].duplicates_suppressed, 2, "the ledger deduplicated the other two");
    assert_eq!(refunds[0].definition.tool.as_deref(), Some("refund"), "the guard names the proposing tool");
}

#[tokio::test]
async fn an_approval_for_ten_cannot_release_a_thousand() {
    let desk = Desk::new();
    desk.charge(&support_agent::order_c5530()).await;
    let charged = desk.provider.effect_count();
    let small = awaiting(&desk.agent(Scenario::ApprovalBound, "run-bound").await);
    desk.approve(&small, None).expect("the operator approves the 10.00 refund");
    let large = awaiting(&desk.agent(Scenario::ApprovalBound, "run-bound").await);
    assert_ne!(small, large, "another amount is another intent");
    let small_fingerprint = desk
        .refunds()
        .into_iter()
        .find(|i| i.definition.amount_minor == 1000)
        .expect("the 10.00 refund")
        .definition
        .fingerprint;
    let refused = desk.approve(&large, Some(small_fingerprint));
    assert!(refused.is_err(), "the 10.00 approval's fingerprint does not approve the 1000.00 intent");
    assert_eq!(awaiting(&desk.agent(Scenario::ApprovalBound, "run-bound").await), large);
    let by_amount = |amount: i64| desk.refunds().into_iter().find(|i| i.definition.amount_minor == amount);
    assert_eq!(by_amount(1000).map(|i| i.status), Some(IntentStatus::Validated));
    let thousand = by_amount(100_000).expect("the 1000.00 refund is reserved");
    assert_eq!(thousand.status, IntentStatus::AwaitingApproval);
    assert_eq!(thousand.attempts, 0, "never attempted");
    assert_eq!(desk.provider.effect_count(), charged + 1, "only the 10.00 refund reached the provider");
}

/// A refund tool whose approval policy is `policy`, on run `run_id` under the spine's
/// approval `threshold`: the tool's policy and the spine's threshold are two sources of
/// truth, and a human is asked whenever either requires one.
async fn refund_under(desk: &Desk, run_id: &str, policy: ApprovalPolicy, threshold: Option<i64>) -> RunOutcome {
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Args {
        amount_minor: i64,
        currency: String,
    }
    let spec = ToolSpec {
        name: "refund".into(),
        description: "Refunds order C-1042.".into(),
        version: "1".into(),
        schema: json!({"type": "object", "properties": {"amount_minor": {"type": "integer"},
            "currency": {"type": "string"}}, "required": ["amount_minor", "currency"], "additionalProperties": false}),
        capability: "order.refund".into(),
        effect: EffectClass::Irreversible,
        approval: policy,
    };
    let gate = Arc::clone(&desk.gate);
    let body_gate = Arc::clone(&gate);
    let tool = Tool::new(spec, move |_: Args, ctx: ToolContext| {
        let gate = Arc::clone(&body_gate);
        async move {
            let ticket = ctx.effect.expect("an effect tool runs with its reserved intent");
            match gate.drive(&ticket).await {
                Ok(outcome) if outcome.is_validated() => ToolOutput::ok("refunded")
                    .with_effect(EffectOutcome::Validated { evidence: outcome.provider_ref.unwrap_or_default() }),
                Ok(outcome) => ToolOutput::error(format!("the refund is {}", outcome.status.as_str())),
                Err(error) => ToolOutput::error(error.to_string()),
            }
        }
    })
    .intent(move |a: &Args| EffectIntent {
        operation: "refund".into(),
        tenant: TENANT.into(),
        intent_id: format!("approval-sources-{}", a.amount_minor),
        reference: "C-1042".into(),
        payload: json!({"order_id": "C-1042", "amount_minor": a.amount_minor, "currency": a.currency}),
        amount_minor: Some(a.amount_minor),
        currency: Some(a.currency.clone()),
    });
    let mut registry = Registry::new();
    registry.register(tool).expect("a closed schema and a declared intent");
    let answers = json!([
        {"id": "m1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
         "content": [{"type": "tool_use", "id": "t1", "name": "refund", "input": {"amount_minor": 900, "currency": "EUR"}}],
         "usage": {"input_tokens": 1, "output_tokens": 1}},
        {"id": "m2", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": "Refunded."}], "usage": {"input_tokens": 1, "output_tokens": 1}}
    ]);
    let recorded = agent_state_of(&desk.log, run_id);
    let transcript = Transcript::parse(&answers.to_string()).expect("a transcript");
    let transport = ScriptedTransport::new(transcript).resuming(&recorded);
    let lessee = desk.executor.runtime().lessee.clone();
    let limits = engine::event::RunLimits {
        approval_threshold_minor: threshold,
        ..support_agent::spine_limits(support_agent::APPROVAL_THRESHOLD_DEFAULT_MINOR)
    };
    let start = NewRun { input: json!({}), limits, versions: engine::event::RunVersions::this_release() };
    let log: Arc<dyn EventLog> = desk.log.clone();
    let journal = LogJournal::new(log, RunId::new(run_id), Cause::command("agent"), Some(start), lessee);
    let timer = ManualTimer::new(desk.clock.clone());
    let cancel = Cancellation::new();
    let env = AgentEnv { journal: &journal, clock: &*desk.clock, timer: &timer, cancel: &cancel, gate: Some(&*gate) };
    let spec = RunSpec {
        run_id: run_id.into(),
        workflow: "approval-sources".into(),
        system: String::new(),
        prompt: "Refund 9.00.".into(),
        limits: AgentLimits::default(),
        capabilities: ["order.refund".to_owned()].into(),
        policy_version: None,
    };
    let refunded = |state: &AgentState| state.tool_succeeded("refund");
    agent::run(env, &transport, &registry, &spec, &refunded).await.expect("the run ends with an outcome")
}

#[tokio::test]
async fn the_stricter_of_the_tools_policy_and_the_spines_threshold_decides_approval() {
    use ApprovalPolicy::{AboveMinor, Always, Never};
    // A refund of 9.00: (tool policy, spine threshold, a human must approve).
    let table = [
        (Never, None, false),
        (Never, Some(500), true),
        (Never, Some(100_000), false),
        (Always, None, true),
        (Always, Some(500), true),
        (Always, Some(100_000), true),
        (AboveMinor(500), None, true),
        (AboveMinor(500), Some(100_000), true),
        (AboveMinor(1_000), None, false),
        (AboveMinor(1_000), Some(500), true),
        (AboveMinor(1_000), Some(100_000), false),
    ];
    for (policy, threshold, human) in table {
        let desk = Desk::new();
        desk.charge(&support_agent::order_c1042()).await;
        let charged = desk.provider.effect_count();
        let outcome = refund_under(&desk, "run-sources", policy, threshold).await;
        let case = format!("policy {policy:?}, threshold {threshold:?}");
        if human {
            let key = awaiting(&outcome);
            assert_eq!(desk.provider.effect_count(), charged, "{case}: nothing is refunded without a human");
            let intent = desk.refunds().into_iter().find(|i| i.key().as_str() == key).expect("the intent");
            assert_eq!(intent.status, IntentStatus::AwaitingApproval, "{case}");
            desk.approve(&key, None).expect("the operator approves");
            let outcome = refund_under(&desk, "run-sources", policy, threshold).await;
            assert_eq!(outcome.status, AgentStatus::Completed, "{case}: approved, then refunded: {outcome:?}");
        } else {
            assert_eq!(outcome.status, AgentStatus::Completed, "{case}: no human needed: {outcome:?}");
        }
        assert_eq!(desk.provider.effect_count(), charged + 1, "{case}: exactly one refund");
    }
}
