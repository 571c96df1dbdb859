//! Idempotency keys, lookup, capability modes and transport classification against the
//! simulator without faults.

use crate::support::{NO_FAULTS, Sim, TEST_KEY, charge, provider_at, refund};
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
    assert!(id.starts_with("pi_"), "{id}");
    assert_eq!(first, second, "a replay answers the stored evidence");
    assert_eq!(sim.effects_for(&request.idempotency_key), 1);
    let effect = &sim.effects()[0];
    assert_eq!((effect.amount_minor, effect.currency.as_str()), (4900, "eur"), "kept lower case, as Stripe");
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
    let paid = evidence_ref(&provider.execute(&request).await);
    let as_refund = engine::provider::EffectRequest {
        kind: EffectKind::Refund,
        payment_method: None,
        charge_ref: Some(paid),
        ..request.clone()
    };
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
    let paid = evidence_ref(&provider.execute(&charge("intent_0005c", 1000)).await);
    let request = refund("intent_0005", 800, &paid);
    let id = evidence_ref(&provider.execute(&request).await);
    assert!(id.starts_with("re_"), "{id}");
    match provider.lookup(EffectKind::Refund, &request.idempotency_key).await {
        LookupOutcome::Found(evidence) => assert_eq!(evidence.provider_ref, id),
        other => panic!("expected Found, got {other:?}"),
    }
    // A charge lookup searches PaymentIntents only: a refund's key is never found as a charge.
    assert_eq!(provider.lookup(EffectKind::Charge, &request.idempotency_key).await, LookupOutcome::Absent);
    let refunded = &sim.effects()[1];
    assert_eq!((refunded.kind, refunded.payment_intent.as_deref()), (EffectKind::Refund, Some(paid.as_str())));
    assert_eq!(refunded.currency, "eur", "a refund is in its PaymentIntent's currency");
}

#[tokio::test]
async fn a_refund_over_what_its_payment_intent_has_left_is_refused_and_makes_nothing() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let paid = evidence_ref(&provider.execute(&charge("intent_0013", 1000)).await);
    evidence_ref(&provider.execute(&refund("intent_0013a", 600, &paid)).await);
    // 400 `amount_too_large`: refused, never a decline, so nothing is released on it.
    assert_unknown(&provider.execute(&refund("intent_0013b", 500, &paid)).await, UnknownReason::Protocol);
    evidence_ref(&provider.execute(&refund("intent_0013c", 400, &paid)).await);
    // Nothing left: `charge_already_refunded`.
    assert_unknown(&provider.execute(&refund("intent_0013d", 1, &paid)).await, UnknownReason::Protocol);
    // No such PaymentIntent: `resource_missing`.
    assert_unknown(&provider.execute(&refund("intent_0013e", 1, "pi_nowhere")).await, UnknownReason::Protocol);
    let refunded: i64 = sim.effects().iter().filter(|e| e.kind == EffectKind::Refund).map(|e| e.amount_minor).sum();
    assert_eq!(refunded, 1000, "never more than was captured");
    // A refused key is left free: once the refund fits, it goes through under the same key.
    let fits = evidence_ref(&provider.execute(&charge("intent_0014", 100)).await);
    assert!(matches!(provider.execute(&refund("intent_0013e", 1, &fits)).await, CallOutcome::Succeeded(_)));
}

#[tokio::test]
async fn stripe_s_declining_test_payment_methods_decline_with_their_code() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    for (method, code) in [
        ("pm_card_chargeDeclined", "generic_decline"),
        ("pm_card_visa_chargeDeclined", "generic_decline"),
        ("pm_card_visa_chargeDeclinedInsufficientFunds", "insufficient_funds"),
    ] {
        let request = engine::provider::EffectRequest {
            payment_method: Some(engine::provider::Secret::new(method)),
            ..charge(&format!("intent_{method}"), 4900)
        };
        assert_eq!(provider.execute(&request).await, CallOutcome::Declined { code: code.into() });
        // Stripe stores a decline under its key: the resend is answered the same decline.
        assert_eq!(provider.execute(&request).await, CallOutcome::Declined { code: code.into() });
    }
    assert!(sim.effects().is_empty(), "a decline moves no money");
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
    // The search finds both PaymentIntents under the key: never one of them as the answer.
    match provider.lookup(EffectKind::Charge, &request.idempotency_key).await {
        LookupOutcome::Unavailable { detail } => assert!(detail.starts_with("inconsistent"), "{detail}"),
        other => panic!("expected an inconsistent search, got {other:?}"),
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
    let provider = provider_at(&format!("http://127.0.0.1:{port}"), 300, None);
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
    let fresh = provider_at(&url, 300, None);
    assert!(matches!(fresh.execute(&charge("intent_0012", 100)).await, CallOutcome::NotSent { .. }));
}

/// The simulator's own answers, checked over raw HTTP: the client's checks must not be what
/// makes the tests above pass. Stripe's idempotency: a replay is the stored answer with
/// `Idempotent-Replayed: true`, other parameters a 400 `idempotency_error`, a key in flight a
/// 409 that says a retry may cure it (`Stripe-Should-Retry: true`).
#[tokio::test]
async fn the_simulator_answers_key_reuse_conflicts_and_replays_as_stripe_does() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 400}]}"#).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/payment_intents", sim.server.base_url());
    let form = |amount: i64| {
        vec![
            ("amount", amount.to_string()),
            ("currency", "eur".to_owned()),
            ("payment_method", "pm_card_visa".to_owned()),
            ("confirm", "true".to_owned()),
            ("metadata[keel_intent_key]", "charge:t:i".to_owned()),
        ]
    };
    let post = |amount: i64| {
        client.post(&url).bearer_auth(TEST_KEY).header("Idempotency-Key", "charge:t:i").form(&form(amount)).send()
    };
    let read = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let notes = (header("idempotent-replayed"), header("stripe-should-retry"));
        let text = response.text().await.unwrap_or_else(|e| panic!("the answer is readable: {e}"));
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("answers are JSON: {e}: {text}"));
        (status, value, notes)
    };
    let answered = |sent: Result<reqwest::Response, reqwest::Error>| sent.unwrap_or_else(|e| panic!("answered: {e}"));

    let first = tokio::spawn(post(100));
    sim.until_effect("charge:t:i").await;
    let (status, conflict, notes) = read(answered(post(100).await)).await;
    assert_eq!((status, conflict["error"]["type"].as_str()), (409, Some("idempotency_error")), "{conflict}");
    assert_eq!(notes, (None, Some("true".to_owned())), "a key in flight may be retried");
    let first = first.await.unwrap_or_else(|e| panic!("the task completes: {e}"));
    let (status, original, notes) = read(answered(first)).await;
    assert_eq!(
        (status, original["object"].as_str(), original["status"].as_str()),
        (200, Some("payment_intent"), Some("succeeded"))
    );
    assert_eq!(notes, (None, None), "a first answer is no replay");

    let (status, reused, _) = read(answered(post(101).await)).await;
    assert_eq!(status, 400, "{reused}");
    assert_eq!(reused["error"]["type"], "idempotency_error");

    let (status, replay, notes) = read(answered(post(100).await)).await;
    assert_eq!((status, &replay), (200, &original), "a replay is the stored answer");
    assert_eq!(notes.0.as_deref(), Some("true"), "and says so");
    assert_eq!(sim.effects().len(), 1);
    assert_eq!(sim.effects()[0].replays, 1, "the simulator counts the replay on its effect");

    let missing = client.post(&url).bearer_auth(TEST_KEY).form(&form(100)).send().await;
    let (status, missing, _) = read(answered(missing)).await;
    assert_eq!((status, missing["error"]["code"].as_str()), (400, Some("idempotency_key_missing")));
    for key in [None, Some("sk_live_keel"), Some("pk_test_keel")] {
        let mut unkeyed = client.post(&url).header("Idempotency-Key", "charge:t:other").form(&form(100));
        if let Some(key) = key {
            unkeyed = unkeyed.bearer_auth(key);
        }
        let (status, refused, _) = read(answered(unkeyed.send().await)).await;
        assert_eq!((status, refused["error"]["type"].as_str()), (401, Some("invalid_request_error")), "{key:?}");
    }
    assert_eq!(sim.effects().len(), 1);
}
