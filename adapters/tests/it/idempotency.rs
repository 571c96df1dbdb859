//! Idempotency keys, lookup, capability modes and transport classification against the
//! simulator without faults.

use crate::support::{NO_FAULTS, Sim, charge, provider_at, refund};
use engine::provider::{CallOutcome, EffectKind, LookupOutcome, PaymentProvider, UnknownReason};

fn evidence_ref(outcome: &CallOutcome) -> String {
    match outcome {
        CallOutcome::Succeeded(evidence) => evidence.provider_ref.clone(),
        other => panic!("expected a success, got {other:?}"),
    }
}

fn assert_unknown(outcome: &CallOutcome, reason: UnknownReason) {
    match outcome {
        CallOutcome::Unknown { reason: found, .. } => assert_eq!(*found, reason, "{outcome:?}"),
        other => panic!("expected Unknown({reason:?}), got {other:?}"),
    }
}

#[tokio::test]
async fn same_key_same_parameters_answers_the_same_effect_once() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = charge("intent_0001", 4900);
    let first = provider.execute(&request).await;
    let second = provider.execute(&request).await;
    let id = evidence_ref(&first);
    assert!(id.starts_with("ch_"), "{id}");
    assert_eq!(first, second, "a replay answers the stored evidence");
    assert_eq!(sim.effects_for(&request.idempotency_key), 1);
    let effect = &sim.effects()[0];
    assert_eq!((effect.amount_minor, effect.currency.as_str()), (4900, "EUR"));
    assert_eq!(
        (effect.order_id.as_str(), effect.intent_id.as_str(), effect.tenant.as_str()),
        ("order_intent_0001", "intent_0001", "acme")
    );
    assert_eq!(effect.kind, EffectKind::Charge);
}

#[tokio::test]
async fn same_key_other_amount_is_unknown_not_a_decline() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = charge("intent_0002", 4900);
    evidence_ref(&provider.execute(&request).await);
    let changed = engine::provider::EffectRequest { amount_minor: 5000, ..request.clone() };
    assert_unknown(&provider.execute(&changed).await, UnknownReason::Protocol);
    assert_eq!(sim.effects_for(&request.idempotency_key), 1);
    assert_eq!(sim.effects()[0].amount_minor, 4900, "the first parameters stand");
}

#[tokio::test]
async fn a_key_used_for_a_charge_cannot_be_reused_for_a_refund() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = charge("intent_0003", 4900);
    evidence_ref(&provider.execute(&request).await);
    let as_refund =
        engine::provider::EffectRequest { kind: EffectKind::Refund, payment_method: None, ..request.clone() };
    assert_unknown(&provider.execute(&as_refund).await, UnknownReason::Protocol);
    assert_eq!(sim.effects().len(), 1);
}

#[tokio::test]
async fn concurrent_same_key_gets_one_success_and_one_conflict() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 400}]}"#).await;
    let provider = sim.provider_with_timeout(5_000);
    let request = charge("intent_0004", 1200);
    let first = {
        let provider = provider.clone();
        let request = request.clone();
        tokio::spawn(async move { provider.execute(&request).await })
    };
    // The slow request has committed its effect and is holding its answer: its key is in flight.
    sim.until_effect(&request.idempotency_key).await;
    assert_unknown(&provider.execute(&request).await, UnknownReason::ProviderUnavailable);
    let first = first.await.unwrap_or_else(|e| panic!("the first request's task completes: {e}"));
    evidence_ref(&first);
    assert_eq!(sim.effects_for(&request.idempotency_key), 1);
    // Once answered, the key replays the stored success.
    assert_eq!(provider.execute(&request).await, first);
}

#[tokio::test]
async fn refunds_are_refund_objects_and_lookup_checks_the_kind() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = refund("intent_0005", 800);
    let id = evidence_ref(&provider.execute(&request).await);
    assert!(id.starts_with("re_"), "{id}");
    match provider.lookup(EffectKind::Refund, &request.idempotency_key).await {
        LookupOutcome::Found(evidence) => assert_eq!(evidence.provider_ref, id),
        other => panic!("expected Found, got {other:?}"),
    }
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Unavailable { detail } => {
            assert!(detail.starts_with("inconsistent"), "{detail}")
        }
        other => panic!("a refund looked up as a charge is inconsistent, got {other:?}"),
    }
    assert_eq!(sim.effects()[0].kind, EffectKind::Refund);
}

#[tokio::test]
async fn lookup_finds_keys_with_colons_and_misses_unknown_ones() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = charge("order_intent_0006", 4900);
    let id = evidence_ref(&provider.execute(&request).await);
    assert!(request.idempotency_key.contains(':'));
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Found(evidence) => {
            assert_eq!(
                (evidence.provider_ref.as_str(), evidence.amount_minor, evidence.currency.as_str()),
                (id.as_str(), 4900, "EUR")
            );
        }
        other => panic!("expected Found, got {other:?}"),
    }
    assert_eq!(provider.lookup(EffectKind::Charge, "charge:acme:never_sent").await, LookupOutcome::Absent);
    assert_eq!(provider.lookup(EffectKind::Charge, "charge:acme/with/slashes?and#more").await, LookupOutcome::Absent);
}

#[tokio::test]
async fn an_invalid_request_is_unknown_not_a_decline() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    // The simulator refuses a zero amount with 400 invalid_request_error: not a business
    // refusal, so it must not release anything.
    assert_unknown(&provider.execute(&charge("intent_0007", 0)).await, UnknownReason::Protocol);
    assert!(sim.effects().is_empty());
}

#[tokio::test]
async fn without_idempotency_every_request_is_a_new_effect() {
    let sim = Sim::start_with(NO_FAULTS, |config| config.idempotency = false).await;
    let provider = sim.provider();
    let request = charge("intent_0008", 4900);
    let first = evidence_ref(&provider.execute(&request).await);
    let second = evidence_ref(&provider.execute(&request).await);
    assert_ne!(first, second);
    assert_eq!(sim.effects_for(&request.idempotency_key), 2, "the key is still recorded on each effect");
    // A lookup answers the oldest effect for the key.
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Found(evidence) => assert_eq!(evidence.provider_ref, first),
        other => panic!("expected Found, got {other:?}"),
    }
}

#[tokio::test]
async fn without_lookup_a_lookup_is_unavailable() {
    let sim = Sim::start_with(NO_FAULTS, |config| config.lookup = false).await;
    let provider = sim.provider();
    let request = charge("intent_0009", 4900);
    evidence_ref(&provider.execute(&request).await);
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Unavailable { detail } => assert!(detail.contains("501"), "{detail}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_refused_is_not_sent() {
    // Bind then drop a listener: the port was free a moment ago and nothing listens on it now.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("can bind loopback: {e}"));
        listener.local_addr().unwrap_or_else(|e| panic!("a bound socket has an address: {e}")).port()
    };
    let provider = provider_at(&format!("http://127.0.0.1:{port}"), 300);
    match provider.execute(&charge("intent_0010", 4900)).await {
        CallOutcome::NotSent { detail } => assert!(!detail.contains("pm_card_visa"), "{detail}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
    assert!(matches!(provider.lookup(EffectKind::Charge, "charge:acme:x").await, LookupOutcome::Unavailable { .. }));
}

#[tokio::test]
async fn a_stopped_simulator_refuses_connections() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let url = sim.server.base_url();
    evidence_ref(&provider.execute(&charge("intent_0011", 100)).await);
    let _kept = sim.stop().await;
    // A fresh client, so no pooled connection is involved: the connect itself is refused.
    let fresh = provider_at(&url, 300);
    assert!(matches!(fresh.execute(&charge("intent_0012", 100)).await, CallOutcome::NotSent { .. }));
}

/// The simulator's own answers, checked over raw HTTP: the client's checks must not be what
/// makes the tests above pass.
#[tokio::test]
async fn the_simulator_answers_key_reuse_and_conflicts_itself() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 400}]}"#).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/charges", sim.server.base_url());
    let body = |amount: i64| {
        serde_json::json!({"amount": amount, "currency": "EUR", "payment_method": "pm_card_visa",
            "metadata": {"order_id": "o", "intent_id": "i", "tenant": "t"}})
    };
    let post = |amount: i64| client.post(&url).header("Idempotency-Key", "charge:t:i").json(&body(amount)).send();
    let read = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_else(|e| panic!("the answer is readable: {e}"));
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("answers are JSON: {e}: {text}"));
        (status, value)
    };

    let first = tokio::spawn(post(100));
    sim.until_effect("charge:t:i").await;
    let (status, conflict) = read(post(100).await.unwrap_or_else(|e| panic!("the simulator answers: {e}"))).await;
    assert_eq!((status, conflict["error"]["code"].as_str()), (409, Some("request_in_progress")), "{conflict}");
    let first =
        first.await.unwrap_or_else(|e| panic!("the task completes: {e}")).unwrap_or_else(|e| panic!("answered: {e}"));
    let (status, original) = read(first).await;
    assert_eq!(status, 200, "{original}");

    let (status, reused) = read(post(101).await.unwrap_or_else(|e| panic!("the simulator answers: {e}"))).await;
    assert_eq!(status, 400, "{reused}");
    assert_eq!(reused["error"]["type"], "idempotency_error");
    assert_eq!(reused["error"]["code"], "idempotency_key_reused");

    let (status, replay) = read(post(100).await.unwrap_or_else(|e| panic!("the simulator answers: {e}"))).await;
    assert_eq!((status, &replay), (200, &original), "a replay is the stored answer");
    assert_eq!(sim.effects().len(), 1);

    let missing = client.post(&url).json(&body(100)).send().await.unwrap_or_else(|e| panic!("answered: {e}"));
    let (status, missing) = read(missing).await;
    assert_eq!((status, missing["error"]["code"].as_str()), (400, Some("idempotency_key_missing")));
    assert_eq!(sim.effects().len(), 1);
}
