//! The adapter against canned Stripe answers from a local HTTP server: one test per row of the
//! module's tables, each through [`StripeProvider`] itself (request built, sent, answer read).

use super::*;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap as AxumHeaders, Method, StatusCode as AxumStatus, Uri};
use std::collections::VecDeque;
use std::sync::Mutex;

const KEY: &str = "sk_test_keel_4eC39HqLyjWDarjtT1zdp7dc";

/// One canned answer: status, extra headers, body.
type Canned = (u16, Vec<(&'static str, &'static str)>, String);

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    uri: Uri,
    headers: AxumHeaders,
    body: String,
}

#[derive(Clone, Default)]
struct Served {
    answers: Arc<Mutex<VecDeque<Canned>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn answer(
    State(served): State<Served>,
    method: Method,
    uri: Uri,
    headers: AxumHeaders,
    body: String,
) -> axum::response::Response {
    served.seen.lock().expect("test mutex").push(Seen { method, uri, headers, body });
    let next = served.answers.lock().expect("test mutex").pop_front();
    let (status, extra, body) = next.unwrap_or((500, Vec::new(), r#"{"error":{"type":"api_error"}}"#.into()));
    let mut response = axum::response::Response::new(axum::body::Body::from(body));
    *response.status_mut() = AxumStatus::from_u16(status).expect("a canned status is valid");
    for (name, value) in extra {
        response.headers_mut().insert(name, value.parse().expect("a canned header value is valid"));
    }
    response
}

/// A local server answering `answers` in order, and a provider pointed at it.
async fn stripe(answers: Vec<Canned>) -> (StripeProvider, Served) {
    let served = Served { answers: Arc::new(Mutex::new(answers.into())), seen: Arc::default() };
    let app = Router::new().fallback(answer).with_state(served.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds a loopback port");
    let addr = listener.local_addr().expect("has an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let key = Arc::new(SecretKey::parse(KEY).expect("the test key is well formed"));
    let provider = StripeProvider::new(StripeConfig::new(format!("http://{addr}"), key)).expect("a loopback URL");
    (provider, served)
}

fn charge() -> EffectRequest {
    EffectRequest {
        kind: EffectKind::Charge,
        idempotency_key: "charge:t:order_1842_charge".into(),
        tenant: "t".into(),
        intent_id: "order_1842_charge".into(),
        order_id: "order_1842".into(),
        amount_minor: 4900,
        currency: "EUR".into(),
        payment_method: Some(Secret::new("pm_card_visa")),
        fingerprint: "ab".repeat(32),
        charge_ref: None,
        timeout_ms: None,
    }
}

fn refund() -> EffectRequest {
    EffectRequest {
        kind: EffectKind::Refund,
        idempotency_key: "refund:t:order_1842_refund".into(),
        intent_id: "order_1842_refund".into(),
        amount_minor: 1000,
        payment_method: None,
        charge_ref: Some("pi_3Keel".into()),
        ..charge()
    }
}

fn intent(status: &str, amount: i64, currency: &str) -> String {
    serde_json::json!({"id": "pi_3Keel", "object": "payment_intent", "amount": amount, "currency": currency,
        "status": status, "metadata": {"keel_intent_key": "charge:t:order_1842_charge"}})
    .to_string()
}

fn ok(body: String) -> Canned {
    (200, Vec::new(), body)
}

async fn execute(answers: Vec<Canned>, request: &EffectRequest) -> (CallOutcome, Vec<Seen>) {
    let (provider, served) = stripe(answers).await;
    let outcome = provider.execute(request).await;
    let seen = served.seen.lock().expect("test mutex").clone();
    (outcome, seen)
}

fn is_unknown(outcome: &CallOutcome, expected: UnknownReason) -> bool {
    matches!(outcome, CallOutcome::Unknown { reason, .. } if *reason == expected)
}

#[tokio::test]
async fn a_charge_is_a_confirmed_off_session_payment_intent_with_the_key_the_version_and_the_metadata() {
    let (outcome, seen) = execute(vec![ok(intent("succeeded", 4900, "eur"))], &charge()).await;
    assert_eq!(
        outcome,
        CallOutcome::Succeeded(Evidence {
            provider_ref: "pi_3Keel".into(),
            amount_minor: 4900,
            currency: "EUR".into()
        })
    );
    let [request] = seen.as_slice() else { panic!("one request, got {seen:?}") };
    assert_eq!((request.method.as_str(), request.uri.path()), ("POST", "/v1/payment_intents"));
    let header = |name: &str| request.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert_eq!(header("authorization"), format!("Bearer {KEY}"));
    assert_eq!(header("stripe-version"), STRIPE_VERSION);
    assert_eq!(header("idempotency-key"), "charge:t:order_1842_charge");
    assert_eq!(header("content-type"), "application/x-www-form-urlencoded");
    let form: Vec<(String, String)> = url::form_urlencoded::parse(request.body.as_bytes()).into_owned().collect();
    let expected = [
        ("amount", "4900"),
        ("currency", "eur"),
        ("payment_method", "pm_card_visa"),
        ("payment_method_types[]", "card"),
        ("confirm", "true"),
        ("off_session", "true"),
        ("metadata[keel_intent_key]", "charge:t:order_1842_charge"),
        ("metadata[keel_fingerprint]", &"ab".repeat(32)),
        ("metadata[keel_tenant]", "t"),
        ("metadata[keel_intent_id]", "order_1842_charge"),
        ("metadata[keel_order_id]", "order_1842"),
    ];
    let expected: Vec<(String, String)> = expected.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    assert_eq!(form, expected);
}

#[tokio::test]
async fn a_succeeded_payment_intent_must_match_the_amount_currency_and_id_asked() {
    for bad in [
        intent("succeeded", 4901, "eur"),
        intent("succeeded", 4900, "usd"),
        intent("succeeded", 4900, "euro"),
        intent("succeeded", 4900, "eur").replace("pi_3Keel", "ch_3Keel"),
        intent("succeeded", 4900, "eur").replace("payment_intent", "charge"),
        r#"{"id":"pi_1","object":"payment_intent","amount":1,"amount":4900,"currency":"eur","status":"succeeded"}"#
            .into(),
        "<html>".into(),
    ] {
        let (outcome, _) = execute(vec![ok(bad.clone())], &charge()).await;
        assert!(is_unknown(&outcome, UnknownReason::Protocol), "{bad}: {outcome:?}");
    }
}

#[tokio::test]
async fn a_card_error_is_a_decline_with_its_decline_code() {
    let body = r#"{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds",
        "payment_intent":{"id":"pi_3Keel","object":"payment_intent","status":"requires_payment_method"}}}"#;
    let (outcome, _) = execute(vec![(402, Vec::new(), body.into())], &charge()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "insufficient_funds".into() });
    let expired = r#"{"error":{"type":"card_error","code":"expired_card"}}"#;
    let (outcome, _) = execute(vec![(402, Vec::new(), expired.into())], &charge()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "expired_card".into() });
}

#[tokio::test]
async fn localstripes_decline_reads_as_one_but_no_other_402_does() {
    // localstripe 1.15.10 answers a charge decline with this body (type invalid_request_error).
    let localstripe = r#"{"error":{"charge":"ch_1","code":"card_declined","message":"Your card was declined.","type":"invalid_request_error"}}"#;
    let (outcome, _) = execute(vec![(402, Vec::new(), localstripe.into())], &charge()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "card_declined".into() });
    for bad in [
        r#"{"error":{"type":"invalid_request_error","code":"parameter_invalid"}}"#,
        r#"{"error":{"type":"card_error","code":"card_declined","payment_intent":{"status":"succeeded"}}}"#,
        r#"{"error":{"type":"invalid_request_error","type":"card_error","code":"x"}}"#,
        "Payment Required",
    ] {
        let (outcome, _) = execute(vec![(402, Vec::new(), bad.into())], &charge()).await;
        assert!(is_unknown(&outcome, UnknownReason::Protocol), "{bad}: {outcome:?}");
    }
}

#[tokio::test]
async fn a_payment_intent_left_unpaid_is_a_decline_and_processing_is_not_final() {
    let failed = serde_json::json!({"id": "pi_3Keel", "object": "payment_intent", "amount": 4900, "currency": "eur",
        "status": "requires_payment_method", "last_payment_error": {"type": "card_error", "code": "card_declined",
        "decline_code": "do_not_honor"}});
    let (outcome, _) = execute(vec![ok(failed.to_string())], &charge()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "do_not_honor".into() });
    let (outcome, _) = execute(vec![ok(intent("requires_action", 4900, "eur"))], &charge()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "requires_action".into() });
    let (outcome, _) = execute(vec![ok(intent("processing", 4900, "eur"))], &charge()).await;
    assert!(is_unknown(&outcome, UnknownReason::ProviderUnavailable), "{outcome:?}");
    for odd in ["requires_confirmation", "requires_capture", "canceled", "unheard_of"] {
        let (outcome, _) = execute(vec![ok(intent(odd, 4900, "eur"))], &charge()).await;
        assert!(is_unknown(&outcome, UnknownReason::Protocol), "{odd}: {outcome:?}");
    }
}

#[tokio::test]
async fn an_idempotency_error_a_conflict_a_throttle_and_a_5xx_are_unknown_with_stripes_headers() {
    let idempotency = r#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}"#;
    let (outcome, _) = execute(vec![(400, Vec::new(), idempotency.into())], &charge()).await;
    assert!(is_unknown(&outcome, UnknownReason::Protocol), "{outcome:?}");
    let headers = vec![("Request-Id", "req_42"), ("Stripe-Should-Retry", "true"), ("Idempotent-Replayed", "false")];
    for status in [409, 429, 500, 502, 503] {
        let (outcome, _) = execute(vec![(status, headers.clone(), "{}".into())], &charge()).await;
        match outcome {
            CallOutcome::Unknown { reason: UnknownReason::ProviderUnavailable, detail } => assert!(
                detail.ends_with("[Request-Id: req_42, Stripe-Should-Retry: true, Idempotent-Replayed: false]"),
                "{status}: {detail}"
            ),
            other => panic!("{status}: {other:?}"),
        }
    }
    for status in [400, 401, 403, 404, 301] {
        let (outcome, _) =
            execute(vec![(status, Vec::new(), r#"{"error":{"type":"invalid_request_error"}}"#.into())], &charge())
                .await;
        assert!(is_unknown(&outcome, UnknownReason::Protocol), "{status}: {outcome:?}");
    }
}

#[tokio::test]
async fn a_timeout_is_unknown_and_a_refused_connection_is_not_sent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("has an address");
    // Accepts, reads, never answers.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let key = Arc::new(SecretKey::parse(KEY).expect("well formed"));
    let mut config = StripeConfig::new(format!("http://{addr}"), Arc::clone(&key));
    config.request_timeout_ms = 200;
    let outcome = StripeProvider::new(config).expect("valid").execute(&charge()).await;
    assert!(is_unknown(&outcome, UnknownReason::Timeout), "{outcome:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("addr");
    let outcome = StripeProvider::new(StripeConfig::new(format!("http://{closed}"), key))
        .expect("valid")
        .execute(&charge())
        .await;
    assert!(matches!(outcome, CallOutcome::NotSent { .. }), "{outcome:?}");
}

#[tokio::test]
async fn a_connection_lost_after_the_request_is_unknown() {
    use tokio::io::AsyncReadExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("has an address");
    // Reads the request, then hangs up without a word: Stripe may have acted.
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = socket.read(&mut buffer).await;
        }
    });
    let key = Arc::new(SecretKey::parse(KEY).expect("well formed"));
    let outcome =
        StripeProvider::new(StripeConfig::new(format!("http://{addr}"), key)).expect("valid").execute(&charge()).await;
    assert!(is_unknown(&outcome, UnknownReason::ConnectionLost), "{outcome:?}");
}

#[tokio::test]
async fn a_refund_names_the_charges_payment_intent_and_reads_stripes_refund() {
    let body = serde_json::json!({"id": "re_3Keel", "object": "refund", "amount": 1000, "currency": "eur",
        "status": "succeeded", "payment_intent": "pi_3Keel"});
    let (outcome, seen) = execute(vec![ok(body.to_string())], &refund()).await;
    assert_eq!(
        outcome,
        CallOutcome::Succeeded(Evidence {
            provider_ref: "re_3Keel".into(),
            amount_minor: 1000,
            currency: "EUR".into()
        })
    );
    let [request] = seen.as_slice() else { panic!("one request, got {seen:?}") };
    assert_eq!(request.uri.path(), "/v1/refunds");
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(request.body.as_bytes()).into_owned().collect();
    assert_eq!(form.get("payment_intent").map(String::as_str), Some("pi_3Keel"));
    assert_eq!(form.get("amount").map(String::as_str), Some("1000"));
    assert_eq!(form.get("metadata[keel_intent_key]").map(String::as_str), Some("refund:t:order_1842_refund"));
    assert!(!form.contains_key("payment_method") && !form.contains_key("currency"), "{form:?}");

    let failed = serde_json::json!({"id": "re_3Keel", "object": "refund", "amount": 1000, "currency": "eur",
        "status": "failed", "failure_reason": "expired_or_canceled_card"});
    let (outcome, _) = execute(vec![ok(failed.to_string())], &refund()).await;
    assert_eq!(outcome, CallOutcome::Declined { code: "expired_or_canceled_card".into() });
    let pending = body.to_string().replace("succeeded", "pending");
    let (outcome, _) = execute(vec![ok(pending)], &refund()).await;
    assert!(is_unknown(&outcome, UnknownReason::ProviderUnavailable), "{outcome:?}");
    let more = body.to_string().replace("1000", "1001");
    let (outcome, _) = execute(vec![ok(more)], &refund()).await;
    assert!(is_unknown(&outcome, UnknownReason::Protocol), "{outcome:?}");
}

#[tokio::test]
async fn a_refund_without_a_single_charge_is_never_sent() {
    let (outcome, seen) = execute(Vec::new(), &EffectRequest { charge_ref: None, ..refund() }).await;
    assert!(matches!(outcome, CallOutcome::NotSent { .. }), "{outcome:?}");
    assert!(seen.is_empty(), "nothing reached the server: {seen:?}");
}

#[tokio::test]
async fn an_echoed_key_is_scrubbed_from_every_detail() {
    let echo = format!(r#"{{"error":{{"type":"invalid_request_error","message":"Invalid API Key provided: {KEY}"}}}}"#);
    let (outcome, _) = execute(vec![(401, Vec::new(), echo)], &charge()).await;
    match outcome {
        CallOutcome::Unknown { detail, .. } => {
            assert!(!detail.contains(KEY) && detail.contains(REDACTED_MARK), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

const REDACTED_MARK: &str = engine::provider::REDACTED;

#[tokio::test]
async fn an_echoed_payment_method_is_scrubbed_from_every_detail() {
    let token = "pm_card_secret_7d1e5f3a9b2c";
    let request = EffectRequest { payment_method: Some(Secret::new(token)), ..charge() };
    let echo =
        format!(r#"{{"error":{{"type":"invalid_request_error","message":"No such PaymentMethod: '{token}'"}}}}"#);
    let (outcome, seen) = execute(vec![(400, Vec::new(), echo)], &request).await;
    assert!(seen.iter().any(|s| s.body.contains(token)), "Stripe got the token");
    match outcome {
        CallOutcome::Unknown { detail, .. } => {
            assert!(!detail.contains(token) && detail.contains(REDACTED_MARK), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn other_successes_redirects_and_repeated_fields_are_protocol_errors() {
    for status in [201, 204, 302, 307] {
        let (outcome, _) = execute(vec![(status, Vec::new(), intent("succeeded", 4900, "eur"))], &charge()).await;
        assert!(is_unknown(&outcome, UnknownReason::Protocol), "{status}: {outcome:?}");
    }
    // A body that says two things proves neither.
    let twice =
        intent("succeeded", 4900, "eur").replacen(r#""status":"#, r#""status":"requires_payment_method","status":"#, 1);
    let (outcome, _) = execute(vec![ok(twice)], &charge()).await;
    assert!(is_unknown(&outcome, UnknownReason::Protocol), "{outcome:?}");
}

#[test]
fn the_capability_carries_the_request_timeout() {
    let key = Arc::new(SecretKey::parse(KEY).expect("the test key is well formed"));
    let config = StripeConfig { request_timeout_ms: 1_234, ..StripeConfig::new("http://127.0.0.1:9", key) };
    assert_eq!(StripeProvider::new(config).expect("a loopback URL").capability().request_timeout_ms, 1_234);
}

fn search(data: serde_json::Value) -> Canned {
    ok(serde_json::json!({"object": "search_result", "data": data, "has_more": false}).to_string())
}

fn found_intent(status: &str) -> serde_json::Value {
    serde_json::from_str(&intent(status, 4900, "eur")).expect("a canned intent is JSON")
}

#[tokio::test]
async fn a_charge_is_looked_up_by_metadata_search() {
    let (provider, served) = stripe(vec![search(serde_json::json!([found_intent("succeeded")]))]).await;
    let outcome = provider.lookup(EffectKind::Charge, "charge:t:order_1842_charge").await;
    assert_eq!(
        outcome,
        LookupOutcome::Found(Evidence { provider_ref: "pi_3Keel".into(), amount_minor: 4900, currency: "EUR".into() })
    );
    let seen = served.seen.lock().expect("test mutex").clone();
    let [request] = seen.as_slice() else { panic!("one request, got {seen:?}") };
    assert_eq!((request.method.as_str(), request.uri.path()), ("GET", "/v1/payment_intents/search"));
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(request.uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
    assert_eq!(
        query.get("query").map(String::as_str),
        Some("metadata['keel_intent_key']:'charge:t:order_1842_charge'")
    );
    assert_eq!(quoted(r"it's \ here"), r"'it\'s \\ here'");
}

#[tokio::test]
async fn a_search_says_absent_only_when_it_found_nothing_paid() {
    let key = "charge:t:order_1842_charge";
    let rows = [
        (search(serde_json::json!([])), "absent"),
        (search(serde_json::json!([found_intent("requires_payment_method"), found_intent("canceled")])), "absent"),
        (search(serde_json::json!([found_intent("processing")])), "unavailable"),
        (search(serde_json::json!([found_intent("succeeded"), found_intent("succeeded")])), "unavailable"),
        (ok(r#"{"object":"search_result","data":[],"has_more":true}"#.into()), "unavailable"),
        (ok(r#"{"object":"list","data":[]}"#.into()), "unavailable"),
        (ok(r#"{"object":"search_result","data":[],"data":[]}"#.into()), "unavailable"),
        // localstripe has no search route: its 404 is no absence.
        (
            (404, Vec::new(), r#"{"error":{"message":"Not Found","type":"invalid_request_error"}}"#.into()),
            "unavailable",
        ),
        ((500, Vec::new(), "{}".into()), "unavailable"),
    ];
    for (answer, expected) in rows {
        let body = answer.2.clone();
        let (provider, _) = stripe(vec![answer]).await;
        let outcome = provider.lookup(EffectKind::Charge, key).await;
        let got = match outcome {
            LookupOutcome::Absent => "absent",
            LookupOutcome::Unavailable { .. } => "unavailable",
            LookupOutcome::Found(_) => "found",
        };
        assert_eq!(got, expected, "{body}");
    }
    // Another key's PaymentIntent in the result is not this key's effect.
    let other = serde_json::json!([found_intent("succeeded")]);
    let (provider, _) = stripe(vec![search(other)]).await;
    assert_eq!(provider.lookup(EffectKind::Charge, "charge:t:another").await, LookupOutcome::Absent);
}

#[tokio::test]
async fn a_refund_is_looked_up_among_the_latest_refunds_and_a_miss_is_an_absence_only_in_the_whole_list() {
    let key = "refund:t:order_1842_refund";
    let mine = |status: &str| {
        serde_json::json!({"id": "re_3Keel", "object": "refund", "amount": 1000, "currency": "eur", "status": status,
            "metadata": {"keel_intent_key": key}})
    };
    let list =
        |data: serde_json::Value| ok(serde_json::json!({"object": "list", "data": data, "has_more": true}).to_string());
    let (provider, served) = stripe(vec![list(serde_json::json!([mine("succeeded")]))]).await;
    assert_eq!(
        provider.lookup(EffectKind::Refund, key).await,
        LookupOutcome::Found(Evidence { provider_ref: "re_3Keel".into(), amount_minor: 1000, currency: "EUR".into() })
    );
    let seen = served.seen.lock().expect("test mutex").clone();
    assert_eq!(
        seen.first().map(|s| (s.uri.path().to_owned(), s.uri.query().map(str::to_owned))),
        Some(("/v1/refunds".into(), Some("limit=100".into())))
    );
    let (provider, _) = stripe(vec![list(serde_json::json!([mine("failed")]))]).await;
    assert_eq!(provider.lookup(EffectKind::Refund, key).await, LookupOutcome::Absent);
    for data in [
        serde_json::json!([]),
        serde_json::json!([mine("pending")]),
        serde_json::json!([mine("succeeded"), mine("succeeded")]),
    ] {
        let (provider, _) = stripe(vec![list(data.clone())]).await;
        assert!(matches!(provider.lookup(EffectKind::Refund, key).await, LookupOutcome::Unavailable { .. }), "{data}");
    }
    // The whole list (no more pages) without the key: the account has no such refund.
    let whole = ok(serde_json::json!({"object": "list", "data": [], "has_more": false}).to_string());
    let (provider, _) = stripe(vec![whole]).await;
    assert_eq!(provider.lookup(EffectKind::Refund, key).await, LookupOutcome::Absent);
}

#[test]
fn the_key_is_checked_and_never_shown() {
    let key = SecretKey::parse(&format!("  {KEY}\n")).expect("surrounding whitespace is a file's, not the key's");
    assert!(!format!("{key:?} {key}").contains("sk_"), "{key:?}");
    assert_eq!(key.authorization().map(|v| v.is_sensitive()), Some(true));
    assert!(SecretKey::parse("rk_live_abc").is_ok());
    for (bad, error) in [
        ("", KeyError::Empty),
        (" \n", KeyError::Empty),
        ("pk_test_abc", KeyError::Prefix),
        ("sk_", KeyError::Prefix),
        ("sk_test abc", KeyError::Characters),
        ("sk_test_\u{7f}", KeyError::Characters),
        ("sk_tést", KeyError::Characters),
    ] {
        assert_eq!(SecretKey::parse(bad).map(|_| ()), Err(error), "{bad:?}");
    }
    let long = format!("sk_{}", "a".repeat(STRIPE_KEY_MAX_CHARS));
    assert_eq!(SecretKey::parse(&long).map(|_| ()), Err(KeyError::TooLong));
    for error in [KeyError::Empty, KeyError::Prefix, KeyError::Characters, KeyError::TooLong] {
        assert!(!error.to_string().contains(KEY));
    }
}

#[test]
fn only_https_or_a_loopback_http_url_is_accepted() {
    for good in ["https://api.stripe.com", "http://127.0.0.1:12111", "http://[::1]:80/base", "http://localhost:1"] {
        assert!(base_url(good).is_ok(), "{good}");
    }
    for bad in [
        "http://api.stripe.com",
        "http://10.0.0.1:80",
        "http://127.0.0.1.nip.io",
        "ftp://127.0.0.1",
        "https://api.stripe.com/?x=1",
        "https://sk_test_x@api.stripe.com",
        "not a url",
    ] {
        assert!(matches!(base_url(bad), Err(Error::BaseUrl { .. })), "{bad}");
    }
    assert_eq!(
        base_url("https://api.stripe.com/base").map(|u| u.to_string()).ok().as_deref(),
        Some("https://api.stripe.com/base/")
    );
}

#[test]
fn stripe_declares_dedup_and_lookup_with_its_search_lag_and_key_window() {
    let declared = capability();
    assert_eq!(declared.tier(), "dedup+lookup");
    assert_eq!(declared.consistency_window_ms, STRIPE_SEARCH_LAG_MS);
    assert_eq!(declared.key_window_ms, 24 * 60 * 60 * 1_000);
}

#[tokio::test]
async fn a_throttled_answer_holds_the_declared_rate_off_for_its_retry_after() {
    for (retry_after, held_ms) in
        [(Some("3"), 3_000), (None, THROTTLED_RETRY_AFTER_DEFAULT_MS), (Some("86400"), THROTTLED_RETRY_AFTER_MAX_MS)]
    {
        let (mut provider, _) = stripe(vec![(
            429,
            retry_after.map(|seconds| vec![("Retry-After", seconds)]).unwrap_or_default(),
            r#"{"error":{"type":"rate_limit_error"}}"#.into(),
        )])
        .await;
        let throttle = Arc::new(crate::flow::Throttle::new(10));
        provider.throttle = Some(Arc::clone(&throttle));
        let asked = tokio::time::Instant::now();
        let outcome = provider.execute(&charge()).await;
        assert!(is_unknown(&outcome, UnknownReason::ProviderUnavailable), "{outcome:?}");
        let next = throttle.next_at().expect("the throttle was told");
        assert!(next >= asked + std::time::Duration::from_millis(held_ms), "{retry_after:?}: held until {next:?}");
        assert!(next <= tokio::time::Instant::now() + std::time::Duration::from_millis(held_ms), "{retry_after:?}");
    }
}
