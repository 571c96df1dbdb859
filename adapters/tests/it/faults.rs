//! Every fault of the plan, observed through Keel's Stripe client, and the sample plans in
//! `fixtures/faults/`.

use crate::support::{Sim, charge};
use engine::provider::{CallOutcome, EffectKind, EffectRequest, LookupOutcome, PaymentProvider, UnknownReason};
use provider_sim::FaultPlan;
use std::time::{Duration, Instant};

fn reason(outcome: &CallOutcome) -> UnknownReason {
    match outcome {
        CallOutcome::Unknown { reason, .. } => *reason,
        other => panic!("expected Unknown, got {other:?}"),
    }
}

#[tokio::test]
async fn fail_before_effect_is_unknown_and_leaves_nothing() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "fail_before_effect", "times": 1}]}"#).await;
    let provider = sim.provider();
    let request = charge("f_0001", 4900);
    assert_eq!(reason(&provider.execute(&request).await), UnknownReason::ProviderUnavailable);
    assert!(sim.effects().is_empty());
    // No idempotency record was kept: the same key now goes through as a first request.
    assert!(matches!(provider.execute(&request).await, CallOutcome::Succeeded(_)));
    assert_eq!(sim.effects().len(), 1);
}

#[tokio::test]
async fn timeout_after_effect_is_a_timeout_then_the_lookup_finds_it() {
    let sim =
        Sim::start(r#"{"rules": [{"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 5000}]}"#)
            .await;
    let provider = sim.provider();
    let request = charge("f_0002", 4900);
    let started = Instant::now();
    assert_eq!(reason(&provider.execute(&request).await), UnknownReason::Timeout);
    assert!(started.elapsed() < Duration::from_millis(2_000), "the client gave up at its own timeout");
    assert_eq!(sim.effects_for(&request.idempotency_key), 1, "the effect happened");
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Found(evidence) => assert_eq!(evidence.provider_ref, sim.effects()[0].id),
        other => panic!("expected Found, got {other:?}"),
    }
    // The answer is still held, so the key is in flight: a resend is told so, not re-executed.
    assert_eq!(reason(&provider.execute(&request).await), UnknownReason::ProviderUnavailable);
    assert_eq!(sim.effects_for(&request.idempotency_key), 1);
    // Shutting down cuts the hold short rather than waiting 5 s.
    let stopping = Instant::now();
    let _kept = sim.stop().await;
    assert!(stopping.elapsed() < Duration::from_millis(2_000), "shutdown ends held answers");
}

#[tokio::test]
async fn unavailable_is_unknown_with_no_effect() {
    let sim = Sim::start(r#"{"rules": [{"operation": "any", "fault": "unavailable", "times": 1}]}"#).await;
    let provider = sim.provider();
    assert_eq!(reason(&provider.execute(&charge("f_0003", 4900)).await), UnknownReason::ProviderUnavailable);
    assert!(sim.effects().is_empty());
}

#[tokio::test]
async fn decline_is_definitive_and_replays() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "decline", "times": 1}]}"#).await;
    let provider = sim.provider();
    let request = charge("f_0004", 4900);
    let declined = CallOutcome::Declined { code: "generic_decline".into() };
    assert_eq!(provider.execute(&request).await, declined);
    assert!(sim.effects().is_empty());
    // The rule is spent: the second decline comes from the stored answer for the key.
    assert_eq!(provider.execute(&request).await, declined);
    assert!(sim.effects().is_empty());
    // Another key is not declined.
    assert!(matches!(provider.execute(&charge("f_0004b", 4900)).await, CallOutcome::Succeeded(_)));
}

#[tokio::test]
async fn slow_answers_after_the_delay() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 200}]}"#).await;
    let provider = sim.provider_with_timeout(2_000);
    let started = Instant::now();
    assert!(matches!(provider.execute(&charge("f_0005", 4900)).await, CallOutcome::Succeeded(_)));
    assert!(started.elapsed() >= Duration::from_millis(200), "answered after {:?}", started.elapsed());
    assert_eq!(sim.effects().len(), 1);
}

#[tokio::test]
async fn the_run_time_left_caps_a_slow_call_and_its_outcome_is_unknown() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 1500}]}"#).await;
    let provider = sim.provider_with_timeout(5_000);
    let request = EffectRequest { timeout_ms: Some(200), ..charge("f_0010", 4900) };
    let started = Instant::now();
    let outcome = provider.execute(&request).await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, CallOutcome::Unknown { reason: UnknownReason::Timeout, .. }),
        "a call past the time left is unknown, never failed: {outcome:?}"
    );
    assert!(took < Duration::from_millis(1_000), "gave up at the time left, not the 5 s timeout: {took:?}");
    // A time left longer than the request timeout changes nothing: the timeout still governs.
    let roomy = EffectRequest { timeout_ms: Some(60_000), ..charge("f_0011", 4900) };
    assert!(matches!(provider.execute(&roomy).await, CallOutcome::Succeeded(_)));
}

#[tokio::test]
async fn lookup_absent_for_ms_hides_young_effects_only() {
    let window_ms = 300;
    let plan =
        format!(r#"{{"rules": [{{"operation": "lookup", "fault": "lookup_absent_for_ms", "ms": {window_ms}}}]}}"#);
    let sim = Sim::start(&plan).await;
    let provider = sim.provider();
    let request = charge("f_0006", 4900);
    let committed = Instant::now();
    assert!(matches!(provider.execute(&request).await, CallOutcome::Succeeded(_)));
    assert_eq!(provider.lookup(EffectKind::Charge, &request.idempotency_key).await, LookupOutcome::Absent);
    // Waiting out the window is the behaviour under test, not a stand-in for a signal.
    tokio::time::sleep(Duration::from_millis(window_ms + 50).saturating_sub(committed.elapsed())).await;
    assert!(matches!(provider.lookup(EffectKind::Charge, &request.idempotency_key).await, LookupOutcome::Found(_)));
}

#[tokio::test]
async fn lookup_lies_answers_absent_for_an_existing_effect() {
    let sim = Sim::start(r#"{"rules": [{"operation": "lookup", "fault": "lookup_lies", "times": 1}]}"#).await;
    let provider = sim.provider();
    let request = charge("f_0007", 4900);
    assert!(matches!(provider.execute(&request).await, CallOutcome::Succeeded(_)));
    assert_eq!(provider.lookup(EffectKind::Charge, &request.idempotency_key).await, LookupOutcome::Absent);
    assert_eq!(sim.effects_for(&request.idempotency_key), 1, "the effect exists all the same");
    assert!(matches!(provider.lookup(EffectKind::Charge, &request.idempotency_key).await, LookupOutcome::Found(_)));
}

#[tokio::test]
async fn lookup_unavailable_is_unavailable() {
    let sim = Sim::start(r#"{"rules": [{"operation": "lookup", "fault": "lookup_unavailable", "times": 1}]}"#).await;
    let provider = sim.provider();
    let request = charge("f_0008", 4900);
    assert!(matches!(provider.execute(&request).await, CallOutcome::Succeeded(_)));
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Unavailable { detail } => assert!(detail.contains("503"), "{detail}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// The outcome kinds of 24 charges with distinct keys under a probabilistic plan.
async fn probabilistic_run(seed: u64) -> Vec<&'static str> {
    let plan = format!(
        r#"{{"seed": {seed}, "rules": [
            {{"operation": "charge", "fault": "decline", "probability": 0.3}},
            {{"operation": "charge", "fault": "unavailable", "probability": 0.3}}]}}"#
    );
    let sim = Sim::start(&plan).await;
    let provider = sim.provider();
    let mut kinds = Vec::new();
    for i in 0..24 {
        kinds.push(match provider.execute(&charge(&format!("p_{i:04}"), 100)).await {
            CallOutcome::Succeeded(_) => "ok",
            CallOutcome::Declined { .. } => "declined",
            CallOutcome::Unknown { .. } => "unknown",
            CallOutcome::NotSent { .. } => "not_sent",
        });
    }
    kinds
}

#[tokio::test]
async fn a_probabilistic_plan_replays_exactly_for_its_seed() {
    let first = probabilistic_run(11).await;
    assert_eq!(first, probabilistic_run(11).await);
    assert_ne!(first, probabilistic_run(12).await, "another seed gives another schedule");
    for kind in ["ok", "declined", "unknown"] {
        assert!(first.contains(&kind), "24 draws at these odds include {kind}: {first:?}");
    }
}

#[test]
fn every_sample_plan_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/faults");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{} is readable: {e}", dir.display()));
    let mut count = 0;
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("directory entries are readable: {e}")).path();
        let plan = FaultPlan::load(&path).unwrap_or_else(|e| panic!("{} must parse: {e}", path.display()));
        assert!(plan.rule_count() > 0, "{} has rules", path.display());
        count += 1;
    }
    assert!(count >= 8, "one sample per fault, found {count}");
}

#[test]
fn an_invalid_plan_file_names_the_rule() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory can be made: {e}"));
    let path = dir.path().join("bad.json");
    std::fs::write(&path, r#"{"rules": [{"operation":"charge","fault":"slow","times":1},{"operation":"charge","fault":"nope","times":1}]}"#)
        .unwrap_or_else(|e| panic!("the plan can be written: {e}"));
    let e = FaultPlan::load(&path).err().unwrap_or_else(|| panic!("an unknown fault is refused"));
    assert!(e.to_string().contains("rule 1: unknown fault \"nope\""), "{e}");
    let missing =
        FaultPlan::load(&dir.path().join("missing.json")).err().unwrap_or_else(|| panic!("a missing file is refused"));
    assert!(missing.to_string().contains("missing.json"), "{missing}");
}
