//! Golden logs: committed event logs (`fixtures/golden/*.events.jsonl`, one stored row per
//! line in the column form of `store/FORMAT.md`) that must keep decoding, hash-chaining and
//! folding to the same state (`*.state.json`) on every future version of Keel. Together they
//! hold every `Event` variant. One `check(name)`: a missing log is generated once from the
//! scenario below and committed; a missing state is written; `UPDATE_EXPECT=1` refreshes the
//! state (never the log: old logs are the point).

use chrono::{DateTime, TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, Event, IntentDefinition, IntentKey, RunId, RunLimits, RunStatus, StoredEvent, StreamId};
use engine::ledger::{Action, Command, IntentSpec, Ledger, RunStart};
use engine::memory::MemoryLog;
use engine::provider::{CallOutcome, Capability, EffectKind, Evidence, LookupOutcome, UnknownReason};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use testkit::sample::TENANT;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden")
}

fn row(e: &StoredEvent) -> Value {
    json!({"seq": e.seq, "stream": e.stream.as_str(), "stream_seq": e.stream_seq, "type": e.event.type_name(),
           "at": e.at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(), "cause": e.cause, "payload": e.event.payload(),
           "prev_hash": e.prev_hash, "hash": e.hash})
}

fn decode(line: &str) -> StoredEvent {
    let v: Value = serde_json::from_str(line).expect("a JSON row");
    let text = |n: &str| v[n].as_str().unwrap_or_else(|| panic!("{n} is text in {line}")).to_owned();
    let event = Event::from_stored(&text("type"), &v["payload"]).expect("the payload decodes into its event");
    let stored = StoredEvent {
        seq: v["seq"].as_u64().expect("seq"),
        stream: StreamId::from_stored(text("stream")),
        stream_seq: v["stream_seq"].as_u64().expect("stream_seq"),
        at: DateTime::parse_from_rfc3339(&text("at")).expect("an RFC 3339 instant").to_utc(),
        cause: serde_json::from_value(v["cause"].clone()).expect("a cause"),
        event,
        prev_hash: text("prev_hash"),
        hash: text("hash"),
    };
    let hash = engine::event::chain_hash(
        &stored.prev_hash,
        stored.seq,
        &stored.stream,
        stored.stream_seq,
        stored.at,
        &stored.cause,
        &stored.event,
    );
    assert_eq!(hash, stored.hash, "the chain hash of seq {} still checks", stored.seq);
    stored
}

/// Decodes, chain-checks and folds `fixtures/golden/NAME.events.jsonl`, and compares the
/// rendered state with `NAME.state.json`. Returns the event types seen.
fn check(name: &str, scenario: fn() -> Vec<StoredEvent>) -> Vec<&'static str> {
    let log_path = dir().join(format!("{name}.events.jsonl"));
    if !log_path.exists() {
        let lines: Vec<String> = scenario().iter().map(|e| row(e).to_string()).collect();
        std::fs::write(&log_path, lines.join("\n") + "\n").expect("writes the golden log");
    }
    let text = std::fs::read_to_string(&log_path).expect("reads the golden log");
    let events: Vec<StoredEvent> = text.lines().filter(|l| !l.trim().is_empty()).map(decode).collect();
    let mut prev = engine::event::GENESIS_HASH.to_owned();
    let mut ledger = Ledger::new();
    for event in &events {
        assert_eq!(event.prev_hash, prev, "seq {} chains to the one before", event.seq);
        prev = event.hash.clone();
        ledger.apply(event);
    }
    let mut state = testkit::invariants::render(&ledger);
    // Conversations' facts, for the logs that hold some (older goldens' states stay as they were).
    let conversations: std::collections::BTreeMap<&str, engine::facts::Conversation> = events
        .iter()
        .filter_map(|e| e.event.conversation())
        .map(|id| (id.as_str(), engine::ledger::View::conversation(&ledger, id)))
        .collect();
    if let (false, Some(map)) = (conversations.is_empty(), state.as_object_mut()) {
        map.insert("conversations".to_owned(), serde_json::to_value(&conversations).expect("renders"));
    }
    let rendered = serde_json::to_string_pretty(&state).expect("renders") + "\n";
    let state_path = dir().join(format!("{name}.state.json"));
    if !state_path.exists() || std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&state_path, &rendered).expect("writes the golden state");
    }
    let expected = std::fs::read_to_string(&state_path).expect("reads the golden state");
    assert_eq!(rendered, expected, "{name}: the log no longer folds to its golden state (UPDATE_EXPECT=1 if intended)");
    events.iter().map(|e| e.event.type_name()).collect()
}

fn every_variant() -> Vec<StoredEvent> {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).single().expect("valid")));
    let log = MemoryLog::new(clock.clone());
    let run = RunId::new("golden-run-1");
    let cap = stripe_like(true);
    let mut position = 0u32;
    let exec = |action: Action, start: Option<RunStart>| {
        log.execute_now(&Command::new(Cause::command("golden").for_run(&run), action).starting(start))
    };
    let key = |id: &str| IntentKey::new(EffectKind::Charge, TENANT, id);
    let spec = |id: &str, amount: i64| IntentSpec {
        definition: IntentDefinition {
            key: key(id),
            kind: EffectKind::Charge,
            tenant: TENANT.into(),
            intent_id: id.into(),
            order_id: format!("order_{id}"),
            business_ref: format!("order_{id}"),
            fingerprint: engine::canonical::fingerprint(&json!({"id": id, "amount": amount})),
            amount_minor: amount,
            currency: "EUR".into(),
            payload: json!({"id": id, "amount": amount}),
            tool: None,
        },
        capability: cap,
        approval_required: false,
    };
    let mut reserve = |id: &str, amount: i64, start: Option<RunStart>| {
        let result = exec(
            Action::Reserve { run_id: run.clone(), position, spec: spec(id, amount), start_attempt: false },
            start,
        );
        position += 1;
        result.expect("reserved");
    };
    let ok = |e: Result<engine::ledger::Reply, engine::log::LogError>| {
        e.expect("accepted");
    };
    let start = RunStart {
        run_id: run.clone(),
        workflow: "golden".into(),
        input: json!({"note": "every event variant"}),
        deadline_at: Utc.with_ymd_and_hms(2025, 3, 2, 12, 0, 0).single().expect("valid"),
        limits: RunLimits {
            cost_minor_max: Some(1_000_000),
            attempts_per_intent_max: 3,
            reconciliations_per_intent_max: 2,
            approval_threshold_minor: Some(50_000),
            policy: None,
            network_retries_max: None,
            reconciliations_max: None,
        },
        versions: Default::default(),
        owner: None,
    };
    let evidence = |r: &str, amount| Evidence { provider_ref: r.into(), amount_minor: amount, currency: "EUR".into() };
    // RunStarted, StepRecorded, IntentReserved; AttemptStarted, AttemptNotSent, IntentValidated.
    reserve("golden_validated_1", 4_900, Some(start));
    ok(exec(Action::StartAttempt { key: key("golden_validated_1"), run_id: run.clone() }, None));
    ok(exec(
        Action::RecordOutcome {
            key: key("golden_validated_1"),
            attempt: 1,
            outcome: CallOutcome::NotSent { detail: "refused".into() },
        },
        None,
    ));
    ok(exec(Action::StartAttempt { key: key("golden_validated_1"), run_id: run.clone() }, None));
    ok(exec(
        Action::RecordOutcome {
            key: key("golden_validated_1"),
            attempt: 2,
            outcome: CallOutcome::Succeeded(evidence("ch_1", 4_900)),
        },
        None,
    ));
    // IntentDeduplicated.
    reserve("golden_validated_1", 4_900, None);
    // ApprovalGranted, ApprovalExpired, ApprovalDenied.
    reserve("golden_approval_1", 90_000, None);
    let k = key("golden_approval_1");
    ok(exec(Action::Approve { key: k.clone(), by: "ana".into(), ttl_ms: 1_000, fingerprint: None }, None));
    clock.advance_ms(2_000);
    ok(exec(Action::StartAttempt { key: k.clone(), run_id: run.clone() }, None));
    ok(exec(Action::Deny { key: k, by: "ana".into(), reason: "too much".into() }, None));
    // IntentDeclined.
    reserve("golden_declined_1", 1_000, None);
    ok(exec(Action::StartAttempt { key: key("golden_declined_1"), run_id: run.clone() }, None));
    let declined = CallOutcome::Declined { code: "card_declined".into() };
    ok(exec(Action::RecordOutcome { key: key("golden_declined_1"), attempt: 1, outcome: declined }, None));
    // OutcomeUnknown, ReconciliationStarted, ReconciliationResolved (retry, then found).
    reserve("golden_reconciled_1", 2_500, None);
    let k = key("golden_reconciled_1");
    ok(exec(Action::StartAttempt { key: k.clone(), run_id: run.clone() }, None));
    let lost = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".into() };
    ok(exec(Action::RecordOutcome { key: k.clone(), attempt: 1, outcome: lost.clone() }, None));
    ok(exec(Action::StartReconciliation { key: k.clone(), force: true, run_id: run.clone() }, None));
    let unavailable = LookupOutcome::Unavailable { detail: "503".into() };
    ok(exec(Action::RecordLookup { key: k.clone(), reconciliation: 1, outcome: unavailable.clone() }, None));
    ok(exec(Action::StartReconciliation { key: k.clone(), force: true, run_id: run.clone() }, None));
    let found = LookupOutcome::Found(evidence("ch_2", 2_500));
    ok(exec(Action::RecordLookup { key: k, reconciliation: 2, outcome: found }, None));
    // IntentEscalated: every reconciliation unavailable.
    reserve("golden_escalated_1", 3_000, None);
    let k = key("golden_escalated_1");
    ok(exec(Action::StartAttempt { key: k.clone(), run_id: run.clone() }, None));
    ok(exec(Action::RecordOutcome { key: k.clone(), attempt: 1, outcome: lost }, None));
    for n in 1..=2 {
        ok(exec(Action::StartReconciliation { key: k.clone(), force: true, run_id: run.clone() }, None));
        ok(exec(Action::RecordLookup { key: k.clone(), reconciliation: n, outcome: unavailable.clone() }, None));
    }
    // Recovery's OutcomeUnknown (crash), then IntentResolved by an operator.
    reserve("golden_crashed_1", 1_500, None);
    ok(exec(Action::StartAttempt { key: key("golden_crashed_1"), run_id: run.clone() }, None));
    ok(exec(Action::Recover { owner: engine::lease::LeaseOwner::named("golden"), run: None }, None));
    let resolve = Action::Resolve {
        key: key("golden_crashed_1"),
        by: "ana".into(),
        reason: "not in dashboard".into(),
        landed: None,
        lookup: Some(LookupOutcome::Absent),
        override_reason: None,
    };
    ok(exec(resolve, None));
    // IntentCancelled.
    reserve("golden_cancelled_1", 700, None);
    ok(exec(Action::Cancel { key: key("golden_cancelled_1"), by: "ana".into(), reason: "customer left".into() }, None));
    // TimerStarted, SignalDelivered, StepRecorded, RunFinished.
    let fire_at = clock.now_plus(60_000);
    ok(exec(Action::StartTimer { run_id: run.clone(), position, fire_at }, None));
    ok(exec(
        Action::DeliverSignal {
            run_id: run.clone(),
            name: engine::event::SignalName::parse("approved").expect("a valid name"),
            payload: json!({"by": "ana"}),
        },
        None,
    ));
    ok(exec(
        Action::RecordStep {
            run_id: run.clone(),
            position: position + 1,
            name: "signal:approved".into(),
            output: json!({"by": "ana"}),
        },
        None,
    ));
    ok(exec(Action::FinishRun { run_id: run.clone(), status: RunStatus::Completed, detail: None }, None));
    log.events()
}

trait NowPlus {
    fn now_plus(&self, ms: u64) -> DateTime<Utc>;
}

impl NowPlus for ManualClock {
    fn now_plus(&self, ms: u64) -> DateTime<Utc> {
        use engine::clock::Clock as _;
        engine::clock::checked_plus_ms(self.now(), ms).expect("the golden scenario's times are in range")
    }
}

/// An operator's `keel run cancel` (version 1 of `RunCancelRequested`): the run's next
/// attempt is refused, and it ends `cancelled`, the intent it reserved left reserved.
fn run_cancelled() -> Vec<StoredEvent> {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).single().expect("valid")));
    let log = MemoryLog::new(clock.clone());
    let run = RunId::new("golden-cancelled-run-1");
    let exec = |cause: Cause, action: Action, start: Option<RunStart>| {
        log.execute_now(&Command::new(cause, action).starting(start))
    };
    let key = IntentKey::new(EffectKind::Charge, TENANT, "golden_run_cancelled_1");
    let payload = json!({"id": "golden_run_cancelled_1", "amount": 1_200});
    let spec = IntentSpec {
        definition: IntentDefinition {
            key: key.clone(),
            kind: EffectKind::Charge,
            tenant: TENANT.into(),
            intent_id: "golden_run_cancelled_1".into(),
            order_id: "order_golden_run_cancelled_1".into(),
            business_ref: "order_golden_run_cancelled_1".into(),
            fingerprint: engine::canonical::fingerprint(&payload),
            amount_minor: 1_200,
            currency: "EUR".into(),
            payload,
            tool: None,
        },
        capability: stripe_like(true),
        approval_required: false,
    };
    let start = RunStart {
        run_id: run.clone(),
        workflow: "golden".into(),
        input: json!({"note": "cancelled by an operator"}),
        deadline_at: Utc.with_ymd_and_hms(2025, 3, 2, 12, 0, 0).single().expect("valid"),
        limits: RunLimits::default(),
        versions: Default::default(),
        owner: None,
    };
    let for_run = Cause::command("golden").for_run(&run);
    let reserve = Action::Reserve { run_id: run.clone(), position: 0, spec, start_attempt: false };
    exec(for_run.clone(), reserve, Some(start)).expect("reserved");
    clock.advance_ms(1_000);
    let cancel = Action::CancelRun { run_id: run.clone(), by: "ana".into(), reason: "runaway".into() };
    exec(Cause::operator("ana"), cancel, None).expect("recorded");
    let refused = exec(for_run.clone(), Action::StartAttempt { key, run_id: run.clone() }, None);
    assert!(
        matches!(refused, Err(engine::log::LogError::Refused(engine::ledger::Refusal::RunCancelled { .. }))),
        "{refused:?}"
    );
    let finish = Action::FinishRun {
        run_id: run.clone(),
        status: RunStatus::Cancelled,
        detail: Some("cancelled by operator ana: runaway".into()),
    };
    exec(for_run, finish, None).expect("finished");
    log.events()
}

/// A whole agent run (seed 003's `complete` scenario) on the log: `AgentRecorded` facts.
fn agent_run() -> Vec<StoredEvent> {
    use adapters::model::scripted::ScriptedTransport;
    use agent::{AgentEnv, Cancellation, LogJournal, ManualTimer};
    use workflows::ticket_review::{Scenario, run};
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).single().expect("valid")));
    let log = Arc::new(MemoryLog::new(clock.clone()));
    let scenario = Scenario::parse("complete").expect("a seed-003 scenario");
    let transport =
        ScriptedTransport::from_file(scenario.transcript(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")))
            .expect("the transcript parses");
    let start = agent::NewRun {
        input: json!({"scenario": "complete"}),
        limits: RunLimits::default(),
        versions: engine::event::RunVersions::default(),
    };
    let shared: Arc<dyn engine::log::EventLog> = log.clone();
    let lessee = engine::lease::Lessee::new(engine::lease::LeaseOwner::named("golden"));
    let journal = LogJournal::new(shared, RunId::new("golden-agent-1"), Cause::command("golden"), Some(start), lessee);
    let timer = ManualTimer::new(clock.clone());
    let cancel = Cancellation::new();
    let env = AgentEnv { journal: &journal, clock: &*clock, timer: &timer, cancel: &cancel, gate: None };
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let outcome = tokio
        .block_on(run(env, &transport, "golden-agent-1", scenario.limits(), scenario.capabilities()))
        .expect("the run ends");
    assert_eq!(outcome.exit_code(), 0, "the scenario completes");
    log.events()
}

/// The end of what nobody re-submits: a charge never sent and one proven absent, both
/// abandoned past the window; one only a resend could reconcile (keys, no lookup), escalated.
fn abandoned() -> Vec<StoredEvent> {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2025, 6, 1, 9, 0, 0).single().expect("valid")));
    let log = MemoryLog::new(clock.clone());
    let run = RunId::new("golden-abandon-1");
    let exec = |action: Action, start: Option<RunStart>| {
        log.execute_now(&Command::new(Cause::command("golden").for_run(&run), action).starting(start))
            .unwrap_or_else(|e| panic!("accepted: {e}"));
    };
    let key = |id: &str| IntentKey::new(EffectKind::Charge, TENANT, id);
    let spec = |id: &str, lookup: bool| IntentSpec {
        definition: IntentDefinition {
            key: key(id),
            kind: EffectKind::Charge,
            tenant: TENANT.into(),
            intent_id: id.into(),
            order_id: format!("order_{id}"),
            business_ref: format!("order_{id}"),
            fingerprint: engine::canonical::fingerprint(&json!({"id": id})),
            amount_minor: 2_500,
            currency: "EUR".into(),
            payload: json!({"id": id}),
            tool: None,
        },
        capability: stripe_like(lookup),
        approval_required: false,
    };
    let start = RunStart {
        run_id: run.clone(),
        workflow: "charge".into(),
        input: json!({"note": "abandonment"}),
        deadline_at: Utc.with_ymd_and_hms(2025, 6, 2, 9, 0, 0).single().expect("valid"),
        limits: RunLimits::default(),
        versions: engine::event::RunVersions::default(),
        owner: None,
    };
    let ids = [("golden_never_sent", true), ("golden_proven_absent", true), ("golden_no_lookup", false)];
    for (position, (id, lookup)) in ids.into_iter().enumerate() {
        let position = u32::try_from(position).expect("three positions");
        let start = (position == 0).then(|| start.clone());
        exec(Action::Reserve { run_id: run.clone(), position, spec: spec(id, lookup), start_attempt: true }, start);
    }
    let outcome = |id: &str, outcome: CallOutcome| Action::RecordOutcome { key: key(id), attempt: 1, outcome };
    exec(outcome("golden_never_sent", CallOutcome::NotSent { detail: "refused".into() }), None);
    let timeout = || CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".into() };
    exec(outcome("golden_proven_absent", timeout()), None);
    exec(outcome("golden_no_lookup", timeout()), None);
    clock.advance_ms(i64::try_from(engine::limits::reconcile_backoff_ms(1) + 1).expect("a backoff fits"));
    let absent = key("golden_proven_absent");
    exec(Action::StartReconciliation { key: absent.clone(), force: false, run_id: run.clone() }, None);
    exec(Action::RecordLookup { key: absent, reconciliation: 1, outcome: LookupOutcome::Absent }, None);
    clock.advance_ms(60_000);
    for (id, _) in ids {
        exec(Action::Abandon { key: key(id), run_id: run.clone(), window_ms: 60_000 }, None);
    }
    log.events()
}

/// A charge whose answer was lost, proposed again by two other runs: two `ResendRefused`.
fn resend_refused() -> Vec<StoredEvent> {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).single().expect("valid")));
    let log = MemoryLog::new(clock.clone());
    let key = IntentKey::new(EffectKind::Charge, TENANT, "golden_resend_refused");
    let spec = || golden_charge("golden_resend_refused", 3_100, false);
    let propose = |run: &str| {
        let run = RunId::new(run);
        let start = RunStart {
            run_id: run.clone(),
            workflow: "charge".into(),
            input: json!({"note": "the same charge, again"}),
            deadline_at: Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).single().expect("valid"),
            limits: RunLimits::default(),
            versions: engine::event::RunVersions::default(),
            owner: None,
        };
        let reserve = Action::Reserve { run_id: run.clone(), position: 0, spec: spec(), start_attempt: true };
        log.execute_now(&Command::new(Cause::command("golden").for_run(&run), reserve).starting(Some(start)))
            .unwrap_or_else(|e| panic!("accepted: {e}"));
    };
    propose("golden-resend-1");
    let lost = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".into() };
    let outcome = Action::RecordOutcome { key: key.clone(), attempt: 1, outcome: lost };
    log.execute_now(&Command::new(Cause::command("golden"), outcome)).unwrap_or_else(|e| panic!("recorded: {e}"));
    clock.advance_ms(100);
    propose("golden-resend-2");
    propose("golden-resend-3");
    log.events()
}

/// A provider that deduplicates by key (and looks effects up when `lookup`), answering at once.
fn stripe_like(lookup: bool) -> Capability {
    Capability {
        dedup_by_key: true,
        lookup,
        key_window_ms: 86_400_000,
        consistency_window_ms: 0,
        request_timeout_ms: 0,
    }
}

/// A charge of `amount_minor` EUR with id `id` (its own order and reference) for a provider
/// with keys and a lookup.
fn golden_charge(id: &str, amount_minor: i64, approval_required: bool) -> IntentSpec {
    let payload = json!({"id": id, "amount": amount_minor});
    IntentSpec {
        definition: IntentDefinition {
            key: IntentKey::new(EffectKind::Charge, TENANT, id),
            kind: EffectKind::Charge,
            tenant: TENANT.into(),
            intent_id: id.into(),
            order_id: format!("order_{id}"),
            business_ref: format!("order_{id}"),
            fingerprint: engine::canonical::fingerprint(&payload),
            amount_minor,
            currency: "EUR".into(),
            payload,
            tool: None,
        },
        capability: stripe_like(true),
        approval_required,
    }
}

/// What the other logs leave out: an agent run's requests of the spine — an approval window
/// for the charge it holds for a human (`ApprovalRequested`), a later deadline
/// (`RunDeadlineExtended`), its end releasing that charge, never sent (`IntentReleased`) —
/// and a workflow's validated charge contradicted by a late decline (`LateAnswerRecorded`,
/// then escalated).
fn spine_and_late() -> Vec<StoredEvent> {
    use engine::ledger::{AgentRunStart, SpineRequest};
    let at = |hour, minute| Utc.with_ymd_and_hms(2026, 12, 1, hour, minute, 0).single().expect("valid");
    let clock = Arc::new(ManualClock::new(at(10, 0)));
    let log = MemoryLog::new(clock.clone());
    let ok = |result: Result<_, engine::log::LogError>| result.unwrap_or_else(|e| panic!("accepted: {e}"));
    let agent_run = RunId::new("golden-agent-spine");
    let for_agent = Cause::command("golden").for_run(&agent_run);
    let batch = |position: u32, spine: Vec<SpineRequest>| {
        let start = AgentRunStart {
            workflow: "ticket-review".into(),
            deadline_at: at(11, 0),
            input: json!({"note": "the spine's requests"}),
            limits: RunLimits::default(),
            versions: engine::event::RunVersions::default(),
            owner: None,
        };
        let entries = vec![json!({"entry": position})];
        Action::RecordAgentEntries { run_id: agent_run.clone(), position, entries, start: Some(start), spine }
    };
    let held = golden_charge("golden_spine_held", 2_500, true);
    let held_key = held.definition.key.clone();
    ok(log.execute_now(&Command::new(for_agent.clone(), batch(0, vec![]))));
    let reserve = Action::Reserve { run_id: agent_run.clone(), position: 0, spec: held, start_attempt: false };
    ok(log.execute_now(&Command::new(for_agent.clone(), reserve)));
    clock.advance_ms(1_000);
    let window = SpineRequest::OpenApprovalWindow { key: held_key, closes_at: at(10, 10) };
    ok(log.execute_now(&Command::new(for_agent.clone(), batch(1, vec![window]))));
    clock.advance_ms(1_000);
    let later = SpineRequest::ExtendDeadline { deadline_at: at(11, 30) };
    ok(log.execute_now(&Command::new(for_agent.clone(), batch(2, vec![later]))));
    clock.advance_ms(1_000);
    let finish = SpineRequest::Finish { status: RunStatus::Completed, detail: None, cost_minor: None };
    ok(log.execute_now(&Command::new(for_agent, batch(3, vec![finish]))));

    let run = RunId::new("golden-late-1");
    let start = RunStart {
        run_id: run.clone(),
        workflow: "charge".into(),
        input: json!({"note": "a late decline"}),
        deadline_at: at(11, 0),
        limits: RunLimits::default(),
        versions: engine::event::RunVersions::default(),
        owner: None,
    };
    let charge = golden_charge("golden_late_declined", 4_200, false);
    let key = charge.definition.key.clone();
    let reserve = Action::Reserve { run_id: run.clone(), position: 0, spec: charge, start_attempt: true };
    ok(log.execute_now(&Command::new(Cause::command("golden").for_run(&run), reserve).starting(Some(start))));
    let evidence = Evidence { provider_ref: "ch_golden_late".into(), amount_minor: 4_200, currency: "EUR".into() };
    let answer = |outcome| Action::RecordOutcome { key: key.clone(), attempt: 1, outcome };
    ok(log.execute_now(&Command::new(Cause::command("golden"), answer(CallOutcome::Succeeded(evidence)))));
    clock.advance_ms(5_000);
    let decline = CallOutcome::Declined { code: "card_declined".into() };
    ok(log.execute_now(&Command::new(Cause::command("golden"), answer(decline))));
    log.events()
}

/// Seed 001's sequence on the log: controlled facts admitted, corrected, forgotten.
fn facts_and_releases() -> Vec<StoredEvent> {
    use engine::facts::{ConversationId, declarations};
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("valid")));
    let log = MemoryLog::new(clock.clone());
    let conversation = ConversationId::parse("golden-conversation").expect("a valid id");
    let cause = || Cause::command("golden");
    for message in ["module=Reporting; database=PostgreSQL", "module=Billing; database=SQL Server 2022"] {
        let apply = Action::ApplyFacts {
            conversation: conversation.clone(),
            ticket: None,
            message: message.to_owned(),
            candidates: declarations(message),
        };
        log.execute_now(&Command::new(cause(), apply)).expect("admitted");
        clock.advance_ms(1_000);
    }
    for key in [Some("module".to_owned()), None] {
        let forget = Action::ForgetFacts { conversation: conversation.clone(), ticket: None, key };
        log.execute_now(&Command::new(cause(), forget)).expect("forgotten");
    }
    log.events()
}

#[test]
fn golden_logs_keep_replaying_to_the_same_state_and_cover_every_event() {
    let mut seen = check("every_variant_v1", every_variant);
    seen.extend(check("agent_v1", agent_run));
    seen.extend(check("run_cancelled_v1", run_cancelled));
    seen.extend(check("abandoned_v1", abandoned));
    seen.extend(check("facts_v1", facts_and_releases));
    seen.extend(check("resend_refused_v1", resend_refused));
    seen.extend(check("spine_and_late_v1", spine_and_late));
    // Every type the stored layout has a code for, so a new event type needs a golden log.
    for variant in &store::EVENT_TYPES {
        assert!(seen.contains(variant), "the golden logs hold no {variant}");
    }
}
