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
        Self::under(None)
    }

    /// A desk whose gate reserves under the operator's policy `policy`.
    fn under(policy: Option<engine::policy::InForce>) -> Self {
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
        let mut gate = IntentGate::new(runtime.clone(), Cause::command("agent"));
        if let Some(policy) = policy {
            gate = gate.under_policy(policy);
        }
        let gate = Arc::new(gate);
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
                ..support_agent::spine_limits(support_agent::RefundApproval::Every)
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
            limits: support_agent::spine_limits(support_agent::RefundApproval::Every),
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
            &support_agent::spine_limits(support_agent::RefundApproval::Every),
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

/// A refund tool of class `effect` whose approval policy is `policy`, on run `run_id` under
/// the spine's approval `threshold`: the tool's policy (or, for an irreversible tool that
/// names none, its class) and the spine's threshold are two sources of truth, and a human is
/// asked whenever either requires one.
async fn refund_under(
    desk: &Desk,
    run_id: &str,
    (effect, policy): (EffectClass, ApprovalPolicy),
    threshold: Option<i64>,
) -> RunOutcome {
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
        effect,
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
        ..support_agent::spine_limits(support_agent::RefundApproval::Every)
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

/// The operator's policy that lowers the irreversible default for the desk's refunds.
fn lowering_refunds() -> engine::policy::InForce {
    let document = json!({"version": "desk-lowered",
        "tenants": {TENANT: {"operations": {"refund": {"irreversible_without_approval": true}}}}});
    let bytes = document.to_string();
    let door = |code: &str| engine::money::Currency::parse(code).map_err(|e| e.to_string());
    let document = serde_json::from_str(&bytes).expect("the policy decodes");
    let policy = engine::policy::Policy::from_document(document, &door).expect("the policy is valid");
    let stamp = engine::policy::PolicyStamp::of_file(&policy, bytes.as_bytes());
    engine::policy::InForce { policy, stamp }
}

#[tokio::test]
async fn the_stricter_of_the_tools_policy_or_class_and_the_spines_threshold_decides_approval() {
    use ApprovalPolicy::{AboveMinor, Always, Never};
    use EffectClass::{Irreversible, Mutation};
    // A refund of 9.00: (tool class and policy, spine threshold, the operator's policy lowers
    // the irreversible default, a human must approve).
    let table = [
        ((Mutation, Never), None, false, false),
        ((Mutation, Never), Some(500), false, true),
        ((Mutation, Never), Some(100_000), false, false),
        ((Mutation, Always), None, false, true),
        ((Mutation, Always), Some(500), false, true),
        ((Mutation, Always), Some(100_000), false, true),
        ((Mutation, AboveMinor(500)), None, false, true),
        ((Mutation, AboveMinor(500)), Some(100_000), false, true),
        ((Mutation, AboveMinor(1_000)), None, false, false),
        ((Mutation, AboveMinor(1_000)), Some(500), false, true),
        ((Mutation, AboveMinor(1_000)), Some(100_000), false, false),
        // An irreversible tool that names no approval waits for a human by its class…
        ((Irreversible, Never), None, false, true),
        ((Irreversible, Never), Some(100_000), false, true),
        // …unless the operator's policy lowers it (the threshold still applies)…
        ((Irreversible, Never), None, true, false),
        ((Irreversible, Never), Some(100_000), true, false),
        ((Irreversible, Never), Some(500), true, true),
        // …and a tool's own policy is its own word; a mutation is not lowered, nor raised.
        ((Irreversible, AboveMinor(1_000)), None, false, false),
        ((Irreversible, Always), None, true, true),
        ((Mutation, Never), None, true, false),
    ];
    for (tool, threshold, lowered, human) in table {
        let desk = Desk::under(lowered.then(lowering_refunds));
        desk.charge(&support_agent::order_c1042()).await;
        let charged = desk.provider.effect_count();
        let outcome = refund_under(&desk, "run-sources", tool, threshold).await;
        let case = format!("tool {tool:?}, threshold {threshold:?}, lowered {lowered}");
        if human {
            let key = awaiting(&outcome);
            assert_eq!(desk.provider.effect_count(), charged, "{case}: nothing is refunded without a human");
            let intent = desk.refunds().into_iter().find(|i| i.key().as_str() == key).expect("the intent");
            assert_eq!(intent.status, IntentStatus::AwaitingApproval, "{case}");
            desk.approve(&key, None).expect("the operator approves");
            let outcome = refund_under(&desk, "run-sources", tool, threshold).await;
            assert_eq!(outcome.status, AgentStatus::Completed, "{case}: approved, then refunded: {outcome:?}");
        } else {
            assert_eq!(outcome.status, AgentStatus::Completed, "{case}: no human needed: {outcome:?}");
        }
        assert_eq!(desk.provider.effect_count(), charged + 1, "{case}: exactly one refund");
        // The reservation a lowering affected records the policy that lowered it, and only it.
        let lowered_by = desk.log.events().into_iter().find_map(|stored| match stored.event {
            engine::event::Event::IntentReserved { intent, approval_lowered_by, .. }
                if intent.kind == EffectKind::Refund =>
            {
                Some(approval_lowered_by)
            }
            _ => None,
        });
        let expected = (lowered && tool == (Irreversible, Never)).then(|| lowering_refunds().stamp);
        assert_eq!(lowered_by, Some(expected), "{case}");
    }
}

/// A transport that keeps the refund tool's description from each request it is sent: what
/// the model was told.
struct Told {
    inner: ScriptedTransport,
    refund: std::sync::Mutex<Vec<String>>,
}

impl agent::ModelTransport for Told {
    fn complete<'a>(
        &'a self,
        request: &'a agent::ModelRequest,
    ) -> engine::provider::BoxFuture<'a, Result<agent::ModelResponse, agent::TransportError>> {
        let told = request.tools.iter().filter(|tool| tool.name == "refund").map(|tool| tool.description.clone());
        self.refund.lock().expect("never poisoned: nothing panics holding it").extend(told);
        self.inner.complete(request)
    }

    fn script_fingerprint(&self) -> Option<String> {
        self.inner.script_fingerprint()
    }
}

/// The refund scenario (a full refund of 89.90) under the operator's policy `policy`
/// (`None`: the built-in one), as `keel agent run support` starts it: what the model was told
/// of the refund tool, and how the run ended.
async fn refund_scenario_under(policy: Option<engine::policy::InForce>) -> (Vec<String>, RunOutcome) {
    let rules = policy
        .as_ref()
        .map_or_else(engine::policy::Policy::builtin, |p| p.policy.clone())
        .rules(TENANT, EffectKind::Refund);
    let approval =
        support_agent::RefundApproval::of(rules.approval_threshold_minor, rules.irreversible_without_approval);
    let desk = Desk::under(policy);
    desk.charge(&support_agent::order_c1042()).await;
    let spine = support_agent::spine_limits(approval);
    let start =
        NewRun { input: json!({}), limits: spine.clone(), versions: engine::event::RunVersions::this_release() };
    let log: Arc<dyn EventLog> = desk.log.clone();
    let lessee = desk.executor.runtime().lessee.clone();
    let journal = LogJournal::new(log, RunId::new("told"), Cause::command("agent"), Some(start), lessee);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fixtures");
    let transcript = Transcript::from_file(Scenario::Refund.transcript(root)).expect("the transcript parses");
    let transport = Told { inner: ScriptedTransport::new(transcript), refund: std::sync::Mutex::default() };
    let (timer, cancel) = (ManualTimer::new(desk.clock.clone()), Cancellation::new());
    let env = AgentEnv { journal: &journal, clock: &*desk.clock, timer: &timer, cancel: &cancel, gate: None };
    let outcome = support_agent::run(
        env,
        &transport,
        ("told", support_agent::PROMPT.to_owned()),
        &Scenario::Refund.case(),
        &desk.gate,
        (support_agent::limits(), support_agent::all_capabilities()),
        &spine,
    )
    .await
    .expect("the run ends with an outcome");
    let told = transport.refund.into_inner().expect("never poisoned: nothing panics holding it");
    (told, outcome)
}

#[tokio::test]
async fn the_refund_tool_tells_the_model_the_approval_rule_in_force_and_the_guard_applies_it() {
    let policy = |version: &str, refund: serde_json::Value| {
        let bytes = json!({"version": version, "tenants": {TENANT: {"operations": {"refund": refund}}}}).to_string();
        let door = |code: &str| engine::money::Currency::parse(code).map_err(|e| e.to_string());
        let document = serde_json::from_str(&bytes).expect("the policy decodes");
        let policy = engine::policy::Policy::from_document(document, &door).expect("the policy is valid");
        let stamp = engine::policy::PolicyStamp::of_file(&policy, bytes.as_bytes());
        Some(engine::policy::InForce { policy, stamp })
    };
    // (policy, what the model is told, the 89.90 refund waits for a human)
    let cases = [
        (None, "Every refund waits for a human's approval", true),
        (policy("above-100", json!({"approval_threshold_minor": 10_000})), "amount_minor above 10000 waits", false),
        (policy("above-50", json!({"approval_threshold_minor": 5_000})), "amount_minor above 5000 waits", true),
        (policy("lowered", json!({"irreversible_without_approval": true})), "without a human's approval", false),
    ];
    let mut descriptions = std::collections::BTreeSet::new();
    for (policy, says, waits) in cases {
        let name = policy.as_ref().map_or("builtin".to_owned(), |p| p.stamp.version.clone());
        let (told, outcome) = refund_scenario_under(policy).await;
        assert!(!told.is_empty() && told.iter().all(|d| d.contains(says)), "{name}: the model was told {told:?}");
        assert!(told.iter().all(|d| !d.contains("5.00")), "{name}: no constant left: {told:?}");
        let expected = if waits { AgentStatus::AwaitingApproval } else { AgentStatus::Completed };
        assert_eq!(outcome.status, expected, "{name}: told {told:?}, the guard did otherwise");
        descriptions.insert(told[0].clone());
    }
    assert_eq!(descriptions.len(), 4, "each policy its own description: {descriptions:#?}");
}

/// A policy whose refunds for the desk's tenant are at most `max_amount_minor`.
fn refunds_at_most(max_amount_minor: i64) -> engine::policy::InForce {
    let document = json!({"version": format!("refunds-at-most-{max_amount_minor}"),
        "tenants": {TENANT: {"operations": {"refund": {"max_amount_minor": max_amount_minor}}}}});
    let bytes = document.to_string();
    let door = |code: &str| engine::money::Currency::parse(code).map_err(|e| e.to_string());
    let document = serde_json::from_str(&bytes).expect("the policy decodes");
    let policy = engine::policy::Policy::from_document(document, &door).expect("the policy is valid");
    let stamp = engine::policy::PolicyStamp::of_file(&policy, bytes.as_bytes());
    engine::policy::InForce { policy, stamp }
}

#[tokio::test]
async fn an_agent_run_under_a_policy_it_did_not_start_with_is_held_to_the_stricter_of_the_two() {
    use ApprovalPolicy::Never;
    // The run started under no policy of its own; the gate holds the one in force now, whose
    // refunds are at most 5.00: the 9.00 refund is refused and nothing is reserved.
    let desk = Desk::under(Some(refunds_at_most(500)));
    desk.charge(&support_agent::order_c1042()).await;
    refund_under(&desk, "stricter-run", (EffectClass::Mutation, Never), None).await;
    assert!(desk.refunds().is_empty(), "nothing is reserved over the newer maximum: {:?}", desk.refunds());
    let state = desk.state("stricter-run");
    assert!(!state.tool_succeeded("refund"), "the refund did not run");

    // A policy as loose as the run's own changes nothing: the refund is reserved.
    let loose = Desk::under(Some(refunds_at_most(100_000)));
    loose.charge(&support_agent::order_c1042()).await;
    refund_under(&loose, "looser-run", (EffectClass::Mutation, Never), None).await;
    assert_eq!(loose.refunds().len(), 1, "{:?}", loose.refunds());
}
