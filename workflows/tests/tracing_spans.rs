//! The traces carry seed 004's attribute names on run → intent → attempt → reconciliation,
//! and never a key's parts or the payment token: only their hashes.

use adapters::stripe::local_capability;
use chrono::{TimeZone, Utc};
use engine::clock::ManualClock;
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::{Executor, RunRequest, Runtime};
use engine::memory::{MemoryLog, MemoryProvider, Scripted};
use engine::provider::{Capability, EffectKind};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use testkit::sample::{CARD_TOKEN, TENANT};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span's name and its fields as recorded (at creation and later).
type Recorded = (String, BTreeMap<String, String>);

/// Every span seen.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Recorded>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}").trim_matches('"').to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        fields.insert("#id".to_owned(), id.into_u64().to_string());
        self.0.lock().expect("test lock").push((attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.0.lock().expect("test lock");
        if let Some((_, fields)) =
            spans.iter_mut().rev().find(|(_, f)| f.get("#id") == Some(&id.into_u64().to_string()))
        {
            values.record(&mut Fields(fields));
        }
    }
}

#[tokio::test]
async fn spans_carry_the_seed_attributes_and_no_secret() {
    let spans = Spans::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("an instant")));
    let log = Arc::new(MemoryLog::new(clock.clone()));
    let capability = Capability { request_timeout_ms: 0, ..local_capability() };
    let provider = Arc::new(MemoryProvider::new(capability));
    provider.script([Scripted::LoseAnswer]);
    let executor = Executor::new(
        Runtime {
            log,
            provider,
            clock,
            lessee: engine::lease::Lessee::new(engine::lease::LeaseOwner::named("tracing-test")),
        },
        workflows::builtin(None),
    );
    let input = json!({"tenant_id": TENANT, "intent_id": "order_1900_charge", "order_id": "order_1900",
                       "amount_minor": 2500, "currency": "EUR", "payment_method_token": CARD_TOKEN});
    let request = RunRequest {
        run_id: RunId::new("run-1"),
        limits: RunLimits::default(),
        deadline_ms: 60_000,
        cause: Cause::command("charge"),
    };
    executor.start("charge", &input, request).await.expect("the run ends");
    let key = IntentKey::new(EffectKind::Charge, TENANT, "order_1900_charge");
    executor.reconcile(&key, Cause::command("reconcile")).await.expect("reconciles");

    let spans = spans.0.lock().expect("test lock").clone();
    let find = |name: &str| spans.iter().find(|(n, _)| n == name).map(|(_, f)| f.clone()).unwrap_or_default();
    let run = find("run");
    assert_eq!(run.get("agent.run.id").map(String::as_str), Some("run-1"));
    assert!(run.contains_key("budget.remaining_ms"));
    let intent = find("intent");
    assert_eq!(intent.get("agent.intent.id").map(String::as_str), Some("order_1900_charge"));
    assert_eq!(intent.get("effect.idempotency_key_hash"), Some(&key.hash()));
    assert_eq!(intent.get("validation.outcome").map(String::as_str), Some("accepted"));
    assert_eq!(intent.get("retry.prevented").map(String::as_str), Some("false"));
    assert!(intent.contains_key("budget.remaining_attempts"), "{intent:?}");
    let attempt = find("attempt");
    assert_eq!(attempt.get("retry.attempt").map(String::as_str), Some("1"));
    assert_eq!(attempt.get("retry.reason").map(String::as_str), Some("first"));
    let reconciliation = find("reconciliation");
    assert_eq!(reconciliation.get("reconciliation.status").map(String::as_str), Some("found"));
    assert!(reconciliation.get("reconciliation.evidence_id").is_some_and(|id| !id.is_empty()));

    let everything = format!("{spans:?}");
    assert!(!everything.contains(CARD_TOKEN), "the payment token is never traced");
    assert!(!everything.contains(key.as_str()), "the intent key (it names the tenant) is traced only as a hash");
}
