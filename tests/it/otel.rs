//! OTLP export through the real binary: a local OTLP/HTTP receiver in this test (`POST
//! /v1/traces`, protobuf bodies decoded with the protocol's own types) takes what `keel`
//! exports when `OTEL_EXPORTER_OTLP_ENDPOINT` points at it, and the suite checks the span
//! tree, seed 004's attribute names, that no attribute carries a secret or a tool's
//! arguments, that the provider simulator recorded the same trace, and that a dead or silent
//! collector costs a charge nothing.

use crate::agent::{KEY, ModelServer, keel_raw, temp};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use testkit::sample::{CARD_TOKEN, TENANT};

/// One exported span and the service that exported it.
#[derive(Clone, Debug)]
struct Exported {
    service: Option<String>,
    span: Span,
}

/// A local OTLP/HTTP receiver: every span of every export it was sent, in arrival order.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    _runtime: tokio::runtime::Runtime,
}

async fn export(
    State(spans): State<Arc<Mutex<Vec<Exported>>>>,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let mut received = spans.lock().expect("test mutex");
    for resource in request.resource_spans {
        let service = resource.resource.as_ref().and_then(|r| string(&r.attributes, "service.name"));
        for scope in resource.scope_spans {
            received.extend(scope.spans.into_iter().map(|span| Exported { service: service.clone(), span }));
        }
    }
    (StatusCode::OK, protobuf, ExportTraceServiceResponse::default().encode_to_vec())
}

impl Collector {
    fn start() -> Self {
        let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
        let app = axum::Router::new().route("/v1/traces", post(export)).with_state(Arc::clone(&spans));
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("binds a loopback port");
        let addr = listener.local_addr().expect("an address");
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { endpoint: format!("http://{addr}"), spans, _runtime: runtime }
    }

    /// What was exported so far. `keel` flushes its spans before it exits, so after a
    /// command returns its spans are here.
    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().expect("test mutex").clone()
    }
}

fn value(attributes: &[KeyValue], key: &str) -> Option<AnyValue> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.clone())
}

fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    match value(attributes, key)?.value? {
        any_value::Value::StringValue(text) => Some(text),
        _ => None,
    }
}

/// A value as text: a string as it is (so a search finds what it holds), anything else as
/// its debug rendering.
fn render(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        other => format!("{other:?}"),
    }
}

/// Every attribute value of a span and of its events, as text.
fn texts(span: &Span) -> Vec<String> {
    let attributes = span.attributes.iter().chain(span.events.iter().flat_map(|e| e.attributes.iter()));
    let mut out: Vec<String> = attributes.filter_map(|kv| kv.value.as_ref()).map(render).collect();
    out.extend(span.events.iter().map(|e| e.name.clone()));
    out.push(span.name.clone());
    out
}

fn keys(span: &Span) -> Vec<&str> {
    span.attributes.iter().map(|kv| kv.key.as_str()).collect()
}

fn named<'a>(spans: &'a [Exported], name: &str) -> Vec<&'a Span> {
    spans.iter().map(|e| &e.span).filter(|s| s.name == name).collect()
}

fn only<'a>(spans: &'a [Exported], name: &str) -> &'a Span {
    match named(spans, name).as_slice() {
        [span] => span,
        other => panic!("one {name} span expected, found {}: {spans:#?}", other.len()),
    }
}

fn assert_has(span: &Span, names: &[&str]) {
    for name in names {
        assert!(keys(span).contains(name), "{} has no {name}: {:?}", span.name, keys(span));
    }
}

fn assert_child(child: &Span, parent: &Span) {
    assert_eq!(child.trace_id, parent.trace_id, "{} is in {}'s trace", child.name, parent.name);
    assert_eq!(child.parent_span_id, parent.span_id, "{} is under {}", child.name, parent.name);
}

fn assert_nowhere(spans: &[Exported], secret: &str, what: &str) {
    for exported in spans {
        for text in texts(&exported.span) {
            assert!(!text.contains(secret), "{what} in span {}: {text}", exported.span.name);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn charge<'a>(url: &'a str, intent_id: &'a str) -> Vec<&'a str> {
    vec![
        "--provider",
        url,
        "charge",
        "--tenant",
        TENANT,
        "--intent-id",
        intent_id,
        "--order",
        "order_otel",
        "--amount-minor",
        "4900",
        "--currency",
        "EUR",
        "--payment-method-token",
        CARD_TOKEN,
    ]
}

#[test]
fn a_charge_exports_run_intent_attempt_and_the_provider_keeps_the_same_trace() {
    let collector = Collector::start();
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()), ("OTEL_SERVICE_NAME", "keel-under-test")];
    let (code, stdout, stderr) = keel_raw(&db, &charge(sim.url(), "order_otel_charge_1"), &env);
    assert_eq!(code, 0, "{stdout} {stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["status"], "validated", "{report}");

    let spans = collector.spans();
    assert!(spans.iter().all(|e| e.service.as_deref() == Some("keel-under-test")), "{spans:#?}");
    let run = only(&spans, "run");
    assert!(run.parent_span_id.is_empty(), "the run span is the root");
    let intent = only(&spans, "intent");
    let attempt = only(&spans, "attempt");
    assert_child(intent, run);
    assert_child(attempt, intent);
    assert_has(run, &["agent.run.id", "release.version", "budget.remaining_ms"]);
    assert_has(
        intent,
        &["agent.intent.id", "agent.run.id", "effect.idempotency_key_hash", "tool.name", "validation.outcome"],
    );
    assert_has(attempt, &["retry.attempt", "retry.reason", "retry.prevented", "effect.idempotency_key_hash"]);
    assert_eq!(string(&run.attributes, "agent.run.id").as_deref(), report["run_id"].as_str(), "{report}");
    assert_eq!(string(&intent.attributes, "validation.outcome").as_deref(), Some("accepted"));
    assert_nowhere(&spans, CARD_TOKEN, "the card token");

    let effects = provider_sim::list_effects(&dir.path().join("sim.db")).expect("the simulator's effects");
    let [effect] = effects.as_slice() else { panic!("one effect: {effects:#?}") };
    let traceparent = effect.traceparent.as_deref().expect("the charge carried a traceparent");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], hex(&run.trace_id), "the provider's record is in the run's trace");
    assert_eq!(parts[2], hex(&attempt.span_id), "sent from the attempt's span");
}

#[test]
fn an_agent_run_exports_its_model_and_tool_calls_under_it_and_never_its_key_or_arguments() {
    let collector = Collector::start();
    let server = ModelServer::start(false, "agent/ticket-review/complete.json");
    let (_dir, db) = temp();
    let args = [
        "agent",
        "run",
        "ticket-review",
        "--model-api",
        "anthropic",
        "--model",
        "m",
        "--model-base-url",
        &server.base_url,
    ];
    let traces = format!("{}/v1/traces", collector.endpoint);
    let env = [("ANTHROPIC_API_KEY", KEY), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.as_str())];
    let (code, stdout, stderr) = keel_raw(&db, &args, &env);
    assert_eq!(code, 0, "{stdout} {stderr}");

    let spans = collector.spans();
    assert!(spans.iter().all(|e| e.service.as_deref() == Some("keel")), "the default service name: {spans:#?}");
    let run = only(&spans, "agent.run");
    assert!(run.parent_span_id.is_empty(), "the agent run is the root");
    assert_has(run, &["agent.run.id", "prompt.version", "release.version"]);
    let calls = named(&spans, "llm.call");
    let tools = named(&spans, "tool.call");
    assert_eq!((calls.len(), tools.len()), (3, 2), "three model calls, two tool calls: {spans:#?}");
    for call in &calls {
        assert_child(call, run);
        assert_has(
            call,
            &[
                "agent.step.index",
                "llm.model",
                "llm.input_tokens",
                "llm.output_tokens",
                "llm.latency_ms",
                "budget.remaining_calls",
                "budget.remaining_tokens",
                "budget.remaining_ms",
            ],
        );
    }
    for tool in &tools {
        assert_child(tool, run);
        assert_has(
            tool,
            &["agent.step.index", "tool.name", "tool.schema_version", "tool.call_id", "validation.outcome"],
        );
    }
    let names: Vec<Option<String>> = tools.iter().map(|t| string(&t.attributes, "tool.name")).collect();
    assert_eq!(names, [Some("read_ticket".to_owned()), Some("finish_review".to_owned())]);
    assert_nowhere(&spans, KEY, "the API key");
    // The tools' arguments, as the model sent them and as Keel stores them.
    for arguments in [r#"{"input":42}"#, r#""input": 42"#, r#"input: 42"#] {
        assert_nowhere(&spans, arguments, "a tool's arguments");
    }
    assert!(spans.iter().all(|e| !keys(&e.span).iter().any(|k| k.contains("argument"))), "{spans:#?}");
}

#[test]
fn a_support_refund_resumed_after_its_approval_is_sent_from_its_tool_call_in_the_run_s_trace() {
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    let url = sim.url();
    let charge = crate::approvals::support_order_charge("charge-C-1042-000001");
    let charge: Vec<&str> = ["--provider", url].into_iter().chain(charge.iter().map(String::as_str)).collect();
    assert_eq!(keel_raw(&db, &charge, &[]).0, 0, "the order is charged first, without export");
    let first = Collector::start();
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", first.endpoint.as_str())];
    let (code, stdout, _) =
        keel_raw(&db, &["--provider", url, "agent", "run", "support", "--scenario", "refund"], &exporting);
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!((code, report["status"].as_str()), (2, Some("awaiting_approval")), "{report}");
    let spans = first.spans();
    let run = only(&spans, "agent.run");
    assert_eq!(string(&run.attributes, "policy.version").as_deref(), Some("builtin"), "the run's policy: {run:#?}");
    assert!(named(&spans, "attempt").is_empty(), "nothing is sent before the approval");

    let key = report["awaiting_approval"].as_str().expect("the intent to approve");
    let run_id = report["run_id"].as_str().expect("a run id");
    assert_eq!(keel_raw(&db, &["approve", key, "--by", "ana"], &[]).0, 0);
    let second = Collector::start();
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", second.endpoint.as_str())];
    let (code, stdout, stderr) = keel_raw(&db, &["--provider", url, "agent", "resume", run_id], &exporting);
    assert_eq!(code, 0, "{stdout} {stderr}");
    let spans = second.spans();
    let run = only(&spans, "agent.run");
    let attempt = only(&spans, "attempt");
    let refund = named(&spans, "tool.call")
        .into_iter()
        .find(|t| string(&t.attributes, "tool.name").as_deref() == Some("refund"))
        .unwrap_or_else(|| panic!("the refund's tool call: {spans:#?}"));
    assert_child(refund, run);
    assert_child(attempt, refund);
    assert_nowhere(&spans, CARD_TOKEN, "the card token");
    let effects = provider_sim::list_effects(&dir.path().join("sim.db")).expect("the simulator's effects");
    let refunded: Vec<_> = effects.iter().filter(|e| e.id.starts_with("re_")).collect();
    let [refunded] = refunded.as_slice() else { panic!("one refund: {effects:#?}") };
    let traceparent = refunded.traceparent.as_deref().expect("the refund carried a traceparent");
    assert_eq!(traceparent.split('-').nth(1), Some(hex(&run.trace_id).as_str()), "in the resumed run's trace");
    assert_eq!(traceparent.split('-').nth(2), Some(hex(&attempt.span_id).as_str()), "sent from the attempt");
}

#[test]
fn a_dead_or_silent_collector_costs_a_charge_nothing_but_its_spans() {
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    // A port nothing listens on any more: every export is refused at connect.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("an address");
    // A collector that takes the connection and never answers: every export waits its timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let silent_addr = silent.local_addr().expect("an address");
    let held = std::thread::spawn(move || silent.incoming().take(4).filter_map(Result::ok).collect::<Vec<_>>());
    for (n, endpoint) in [format!("http://{closed}"), format!("http://{silent_addr}")].iter().enumerate() {
        let intent_id = format!("order_otel_dead_{n}");
        let (code, stdout, stderr) =
            keel_raw(&db, &charge(sim.url(), &intent_id), &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]);
        assert_eq!(code, 0, "{endpoint}: {stdout} {stderr}");
        let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
        assert_eq!(report["status"], "validated", "{endpoint}: {report}");
    }
    // An endpoint the exporter cannot even parse: a warning, and the charge as usual.
    let (code, stdout, stderr) = keel_raw(
        &db,
        &charge(sim.url(), "order_otel_dead_2"),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://bad host:4318")],
    );
    assert_eq!(code, 0, "{stdout} {stderr}");
    assert!(stderr.contains("OTLP export is off"), "the refusal is said: {stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["status"], "validated", "{report}");
    let effects = provider_sim::list_effects(&dir.path().join("sim.db")).expect("the simulator's effects");
    assert_eq!(effects.len(), 3, "each charge reached the provider once: {effects:#?}");
    let traced: Vec<bool> = effects.iter().map(|e| e.traceparent.is_some()).collect();
    assert_eq!(traced, [true, true, false], "a dead collector still has its trace context; no exporter, none");
    drop(held);
}
