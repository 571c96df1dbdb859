//! Adversarial provider behaviours: every fault the simulator can play, as a named plan in
//! `fixtures/adversarial/NAME.json` with the final status Keel must reach and the effects the
//! provider must hold (`{"plan", "sim"?, "tier"?, "heal"?, "expect": {"status", "source"?,
//! "effects"}}`).
//! One `check(path)`: a charge against an in-process simulator with that plan, then the
//! provider heals and Keel gets a bounded number of passes (advance the clock, resume,
//! re-submit the same charge), then the status, the effect count and every invariant.

use adapters::stripe::{LOOPBACK_TEST_KEY, SecretKey, StripeConfig, StripeProvider, local_capability};
use chrono::{TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::{Executor, RunRequest, Runtime};
use engine::memory::MemoryLog;
use engine::provider::{Capability, EffectKind, PaymentProvider};
use provider_sim::{Config, FaultPlan, Server};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use testkit::sample::{CARD_TOKEN, TENANT};

const PASSES: usize = 6;

fn provider(server: &Server, tier: &str) -> Arc<dyn PaymentProvider> {
    let (dedup_by_key, lookup) = match tier {
        "lookup" => (false, true),
        "dedup" => (true, false),
        "none" => (false, false),
        _ => (true, true),
    };
    let capability = Capability { dedup_by_key, lookup, consistency_window_ms: 500, ..local_capability() };
    let key = Arc::new(SecretKey::parse(LOOPBACK_TEST_KEY).expect("the loopback test key is well formed"));
    let config = StripeConfig { capability, request_timeout_ms: 300, ..StripeConfig::new(server.base_url(), key) };
    Arc::new(StripeProvider::new(config).expect("a valid client"))
}

async fn check(path: &Path) {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?").to_owned();
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("reads")).expect("JSON");
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim_db = dir.path().join("sim.db");
    let sim = |faults: FaultPlan| Config {
        faults,
        idempotency: fixture["sim"]["idempotency"].as_bool().unwrap_or(true),
        lookup: fixture["sim"]["lookup"].as_bool().unwrap_or(true),
        ..Config::new(&sim_db)
    };
    let tier = fixture["tier"].as_str().unwrap_or("dedup+lookup");
    let plan = FaultPlan::from_json(&fixture["plan"].to_string()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 2, 1, 10, 0, 0).single().expect("valid")));
    let log = Arc::new(MemoryLog::new(clock.clone()));
    let input = json!({"tenant_id": TENANT, "intent_id": format!("adversarial_{name}"), "order_id": format!("order_{name}"),
                       "amount_minor": 4_900, "currency": "EUR", "payment_method_token": CARD_TOKEN});
    let mut runs = 0;
    let mut request = || {
        runs += 1;
        RunRequest {
            run_id: RunId::new(format!("{name}-{runs}")),
            limits: RunLimits {
                cost_minor_max: None,
                reconciliations_per_intent_max: 3,
                network_retries_max: None,
                reconciliations_max: None,
                ..RunLimits::default()
            },
            deadline_ms: 3_600_000,
            cause: Cause::command("adversarial"),
        }
    };
    let executor = |server: &Server| {
        let runtime = Runtime {
            log: log.clone(),
            provider: provider(server, tier),
            clock: clock.clone(),
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("adversarial-test")),
        };
        Executor::new(runtime, workflows::builtin(None))
    };

    let server = Server::start(sim(plan.clone())).await.expect("the simulator starts");
    let first = executor(&server).start("charge", &input, request()).await.expect("an outcome");
    // A few passes with the faults still on (lookups that lie or lag), then heal.
    for _ in 0..2 {
        clock.advance_ms(1_000);
        executor(&server).recover_and_resume(Cause::command("adversarial")).await.expect("resumes");
    }
    server.shutdown().await.expect("stops");
    // `"heal": false` keeps the faults for good: liveness then means escalation.
    let healed = if fixture["heal"] == json!(false) { plan } else { FaultPlan::none() };
    let server = Server::start(sim(healed)).await.expect("the simulator restarts");
    for _ in 0..PASSES {
        clock.advance_ms(120_000);
        let executor = executor(&server);
        executor.recover_and_resume(Cause::command("adversarial")).await.expect("resumes");
        executor.start("charge", &input, request()).await.expect("an outcome");
    }
    server.shutdown().await.expect("stops");

    let key = IntentKey::new(EffectKind::Charge, TENANT, &format!("adversarial_{name}"));
    let ledger = log.ledger();
    let intent = ledger.intent(&key).unwrap_or_else(|| panic!("{name}: the intent exists ({first:?})"));
    let effects: Vec<testkit::Effect> =
        provider_sim::list_effects(&sim_db).expect("effects").iter().map(testkit::Effect::from).collect();
    let expect = &fixture["expect"];
    assert_eq!(intent.status.as_str(), expect["status"], "{name}: {intent:#?}");
    if let Some(source) = expect["source"].as_str() {
        assert_eq!(intent.source.map(|s| format!("{s:?}").to_lowercase()), Some(source.to_owned()), "{name}");
    }
    assert_eq!(Some(effects.len() as u64), expect["effects"].as_u64(), "{name}: effects {effects:#?}");
    let report = testkit::invariants::check(&log.events(), &effects);
    assert!(report.is_ok(), "{name}: {report:#?}");
}

#[test]
fn every_adversarial_provider_plan_ends_in_its_expected_status() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/adversarial");
    let mut paths: Vec<_> =
        std::fs::read_dir(&dir).expect("the fixtures").map(|e| e.expect("an entry").path()).collect();
    paths.sort();
    assert!(paths.len() >= 10, "every provider behaviour has a plan");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    for path in &paths {
        runtime.block_on(check(path));
    }
}
