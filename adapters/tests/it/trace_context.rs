//! The W3C trace context across the payment boundary: Keel's Stripe client sends the calling span's
//! `traceparent` on every request, the simulator keeps it beside the effect, and neither a
//! malformed header nor a file older than the column fails anything.

use crate::support::{NO_FAULTS, Sim, TEST_KEY, charge, provider_at, refund};
use adapters::stripe::StripeProvider;
use adapters::transport::{TRACEPARENT, TraceContext};
use axum::http::HeaderMap;
use engine::provider::{CallOutcome, EffectKind, PaymentProvider};
use std::sync::{Arc, Mutex};

const TRACE_ID: [u8; 16] =
    [0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36];
const SPAN_ID: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
const EXPECTED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn current() -> Option<TraceContext> {
    TraceContext::new(TRACE_ID, SPAN_ID, true)
}

fn traced(base_url: &str) -> StripeProvider {
    provider_at(base_url, 300, Some(current))
}

#[tokio::test]
async fn the_simulator_records_the_traceparent_of_the_request_that_made_each_effect() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = traced(&sim.server.base_url());
    let charged = provider.execute(&charge("tp_0001", 4900)).await;
    let CallOutcome::Succeeded(paid) = charged else { panic!("the charge succeeds: {charged:?}") };
    let refunded = provider.execute(&refund("tp_0001", 4900, &paid.provider_ref)).await;
    assert!(matches!(refunded, CallOutcome::Succeeded(_)), "{refunded:?}");
    let untraced = sim.provider().execute(&charge("tp_0002", 100)).await;
    assert!(matches!(untraced, CallOutcome::Succeeded(_)), "{untraced:?}");
    let recorded: Vec<Option<String>> = sim.effects().into_iter().map(|e| e.traceparent).collect();
    let expected = Some(EXPECTED.to_owned());
    assert_eq!(recorded, [expected.clone(), expected, None], "a request without the header records none");
}

#[tokio::test]
async fn a_malformed_traceparent_is_ignored_and_never_fails_the_effect() {
    let sim = Sim::start(NO_FAULTS).await;
    let client = reqwest::Client::new();
    let malformed = [
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ];
    for (n, header) in malformed.iter().enumerate() {
        let form = [
            ("amount", "100".to_owned()),
            ("currency", "eur".to_owned()),
            ("payment_method", "pm_card_visa".to_owned()),
            ("confirm", "true".to_owned()),
            ("metadata[keel_order_id]", format!("o{n}")),
        ];
        let answer = client
            .post(format!("{}/v1/payment_intents", sim.server.base_url()))
            .bearer_auth(TEST_KEY)
            .header("Idempotency-Key", format!("charge:acme:malformed_{n}"))
            .header(TRACEPARENT, *header)
            .form(&form)
            .send()
            .await
            .unwrap_or_else(|e| panic!("the simulator answers: {e}"));
        assert_eq!(answer.status(), 200, "{header:?} is ignored, the charge is made");
    }
    let effects = sim.effects();
    assert_eq!(effects.len(), malformed.len());
    assert!(effects.iter().all(|e| e.traceparent.is_none()), "no malformed header is kept: {effects:#?}");
}

#[tokio::test]
async fn a_file_made_before_the_column_gets_it_and_keeps_its_effects() {
    let sim = Sim::start(NO_FAULTS).await;
    let first = sim.provider().execute(&charge("tp_0003", 4900)).await;
    assert!(matches!(first, CallOutcome::Succeeded(_)), "{first:?}");
    let (dir, db) = sim.stop().await;
    {
        // The file as a simulator without the column left it.
        let conn = rusqlite::Connection::open(&db).unwrap_or_else(|e| panic!("the db opens: {e}"));
        conn.execute_batch("ALTER TABLE effects DROP COLUMN traceparent")
            .unwrap_or_else(|e| panic!("the column can be dropped: {e}"));
    }
    let sim = Sim::restart(dir, db, NO_FAULTS).await;
    let effects = sim.effects();
    assert_eq!(effects.len(), 1, "{effects:#?}");
    assert_eq!(effects[0].traceparent, None, "an old row has no traceparent");
    let again = traced(&sim.server.base_url()).execute(&charge("tp_0004", 100)).await;
    assert!(matches!(again, CallOutcome::Succeeded(_)), "{again:?}");
    assert_eq!(sim.effects()[1].traceparent.as_deref(), Some(EXPECTED));
}

/// What a provider received: the `traceparent` of each request, by path.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[tokio::test]
async fn every_charge_refund_and_lookup_carries_the_calling_span_s_traceparent() {
    // A bare HTTP server that only notes the header: the simulator records it for effects
    // alone, and a lookup makes none.
    let seen: Seen = Arc::default();
    let noted = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri, headers: HeaderMap| {
        let noted = Arc::clone(&noted);
        async move {
            let header = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()).map(str::to_owned);
            noted.lock().unwrap_or_else(|p| p.into_inner()).push((uri.path().to_owned(), header));
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, "{}")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("binds: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("has an address: {e}"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let provider = traced(&format!("http://{addr}"));
    provider.execute(&charge("tp_0005", 4900)).await;
    provider.execute(&refund("tp_0005", 4900, "pi_tp_0005")).await;
    provider.lookup(EffectKind::Charge, "charge:acme:tp_0005").await;
    server.abort();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let paths: Vec<&str> = seen.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(paths, ["/v1/payment_intents", "/v1/refunds", "/v1/payment_intents/search"]);
    assert!(seen.iter().all(|(_, header)| header.as_deref() == Some(EXPECTED)), "{seen:?}");
}
