//! Money safety through the real `keel` binary: overflowing amounts, currencies, durations out
//! of range, duplicate JSON keys, ids that cannot travel, operator resolutions checked against
//! the provider, a provider that cannot be reached, and the JSON output contract. Runs against
//! the real simulator process, or a hand-written provider on 127.0.0.1 where the simulator
//! cannot misbehave the way a test needs.

use crate::cli::{charge_args, keel, start_sim, temp};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use provider_sim::Process;
use serde_json::Value;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use testkit::sample::{CARD_TOKEN, TENANT};

fn refund_args<'a>(intent_id: &'a str, order: &'a str, amount: &'a str, currency: &'a str) -> Vec<&'a str> {
    vec![
        "refund",
        "--tenant",
        TENANT,
        "--intent-id",
        intent_id,
        "--order",
        order,
        "--amount-minor",
        amount,
        "--currency",
        currency,
    ]
}

/// `charge_args` with another currency.
fn charge_in<'a>(intent_id: &'a str, amount: &'a str, currency: &'a str) -> Vec<&'a str> {
    let mut args = charge_args(intent_id, amount);
    let at = args.iter().position(|a| *a == "--currency").expect("charge_args names a currency") + 1;
    args[at] = currency;
    args
}

/// Events in the log (0 when the file does not exist yet).
fn event_count(db: &Path) -> u64 {
    if !db.exists() {
        return 0;
    }
    let (_, verify, _) = keel(db, None, &["verify"]);
    verify["events"].as_u64().expect("verify counts events")
}

/// The simulator's effects, as it lists them.
fn effects(dir: &Path) -> Vec<provider_sim::EffectRecord> {
    provider_sim::list_effects(&dir.join("sim.db")).expect("the simulator's effects")
}

fn last_event(db: &Path, key: &str) -> Value {
    let (_, shown, _) = keel(db, None, &["show", key]);
    shown["events"].as_array().and_then(|e| e.last()).cloned().expect("the intent has events")
}

/// A payment provider written by hand: `answer(method, path, body)` decides every answer.
struct FakeProvider {
    url: String,
    _runtime: tokio::runtime::Runtime,
}

type Answer = Arc<dyn Fn(&str, &str, &str) -> (u16, String) + Send + Sync>;

async fn fake_handler(
    State(answer): State<Answer>,
    method: axum::http::Method,
    uri: Uri,
    body: String,
) -> (StatusCode, String) {
    let (status, text) = answer(method.as_str(), uri.path(), &body);
    (StatusCode::from_u16(status).expect("a valid status"), text)
}

impl FakeProvider {
    fn start(answer: impl Fn(&str, &str, &str) -> (u16, String) + Send + Sync + 'static) -> Self {
        let answer: Answer = Arc::new(answer);
        let app = Router::new().fallback(fake_handler).with_state(answer);
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("binds a loopback port");
        let addr = listener.local_addr().expect("an address");
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { url: format!("http://{addr}"), _runtime: runtime }
    }
}

/// The amount a form-encoded request body asks for.
fn asked_amount(body: &str) -> i64 {
    form_urlencoded::parse(body.as_bytes())
        .find(|(name, _)| name == "amount")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or_default()
}

/// A search result holding `intents`, as Stripe answers one.
fn search_result(intents: &[Value]) -> String {
    serde_json::json!({"object": "search_result", "has_more": false, "data": intents}).to_string()
}

/// The key Keel charges `intent` under.
fn charge_key(intent: &str) -> String {
    format!("charge:{TENANT}:{intent}")
}

#[test]
fn a_refund_that_would_overflow_the_refunded_total_is_refused_before_the_provider() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    assert_eq!(keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "100")).0, 0);
    let (code, first, _) = keel(&db, Some(sim.url()), &refund_args("order_1842_refund_1", "order_1842", "1", "EUR"));
    assert_eq!(code, 0, "{first}");
    let before = event_count(&db);
    let (code, out, _) =
        keel(&db, Some(sim.url()), &refund_args("order_1842_refund_2", "order_1842", "9223372036854775807", "EUR"));
    assert_eq!(code, 2, "{out}");
    assert_eq!(out["code"], "invalid_arguments", "{out}");
    assert!(out["details"].to_string().contains("amount_minor"), "{out}");
    let (code, out, _) = keel(&db, Some(sim.url()), &charge_args("order_1843_charge", "1000000000001"));
    assert_eq!((code, out["code"].as_str()), (2, Some("invalid_arguments")), "{out}");
    assert_eq!(event_count(&db), before, "nothing was written");
    assert_eq!(effects(dir.path()).len(), 2, "one charge and one refund of 1 at the provider");
    let (code, verify, _) = keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "{verify}");
}

#[test]
fn a_refund_in_another_currency_than_the_charge_is_refused_and_writes_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    assert_eq!(keel(&db, Some(sim.url()), &charge_in("order_1842_charge", "4900", "XOF")).0, 0);
    let before = event_count(&db);
    let (code, out, _) = keel(&db, Some(sim.url()), &refund_args("order_1842_refund", "order_1842", "4900", "EUR"));
    assert_eq!(code, 2, "{out}");
    assert!(["invalid_arguments", "invariant_violated"].contains(&out["code"].as_str().unwrap_or("")), "{out}");
    assert_eq!(event_count(&db), before);
    assert_eq!(effects(dir.path()).len(), 1, "no refund reached the provider");
}

#[test]
fn a_currency_flag_is_case_insensitive_and_stored_upper_case() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, out, _) = keel(&db, Some(sim.url()), &charge_in("order_1842_charge", "4900", "eur"));
    assert_eq!(code, 0, "{out}");
    let (_, shown, _) = keel(&db, None, &["show", out["intent_key"].as_str().expect("a key")]);
    assert_eq!(shown["intent"]["currency"], "EUR", "{shown}");
    assert_eq!(effects(dir.path())[0].currency, "eur", "the provider is sent the code, in Stripe's lower case");
}

#[test]
fn money_and_duration_flags_out_of_range_are_usage_errors_that_write_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let charge = charge_args("order_1842_charge", "4900");
    for extra in [
        &["--deadline-ms", "18446744073709551615"][..],
        &["--deadline-ms", "9223372036854775807"],
        &["--cost-budget-minor=-9223372036854775808"],
        &["--approval-threshold-minor=-1"],
        &["--max-charge-minor=-1"],
        &["--provider-timeout-ms", "18446744073709551615"],
        &["--provider-consistency-window-ms", "18446744073709551615"],
    ] {
        let (code, out, stderr) = keel(&db, Some(sim.url()), &[&charge[..], extra].concat());
        assert_eq!(code, 64, "{extra:?}: {out} {stderr}");
        assert_eq!(out["status"], "usage_error", "{extra:?}: {out}");
    }
    assert!(!db.exists(), "nothing was created");
    assert!(effects(dir.path()).is_empty());

    let mut gated = charge_args("order_1844_charge", "5000");
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (_, waiting, _) = keel(&db, Some(sim.url()), &gated);
    let key = waiting["intent_key"].as_str().expect("a key").to_owned();
    let before = event_count(&db);
    for ttl in ["9000000000000000", "18446744073709551615"] {
        let (code, out, stderr) = keel(&db, None, &["approve", &key, "--by", "lead", "--ttl-ms", ttl]);
        assert_eq!(code, 64, "--ttl-ms {ttl}: {out} {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(event_count(&db), before, "no approval was recorded");
}

#[test]
fn duplicate_keys_in_an_input_file_are_refused_and_nothing_is_charged() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let input = dir.path().join("dup.json");
    for text in [
        format!(
            r#"{{"tenant_id":"{TENANT}","intent_id":"order_1842_charge","order_id":"order_1842","amount_minor":100,"amount_minor":999999,"currency":"EUR","payment_method_token":"{CARD_TOKEN}"}}"#
        ),
        format!(
            r#"{{"tenant_id":"{TENANT}","intent_id":"order_1842_charge","order_id":"order_1842","amount_minor":100,"currency":"EUR","currency":"USD","payment_method_token":"{CARD_TOKEN}"}}"#
        ),
    ] {
        std::fs::write(&input, text).expect("writes");
        let (code, out, stderr) = keel(&db, Some(sim.url()), &["charge", "--input", input.to_str().expect("utf-8")]);
        assert_eq!(code, 64, "{out} {stderr}");
        assert!(out["error"].to_string().contains("duplicate"), "{out}");
    }
    assert_eq!(event_count(&db), 0);
    assert!(effects(dir.path()).is_empty());
}

#[test]
fn a_fault_plan_with_duplicate_keys_is_refused_by_the_simulator() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let plan = dir.path().join("plan.json");
    for text in [
        r#"{"seed": 1, "seed": 2, "rules": []}"#,
        r#"{"rules": [{"operation": "charge", "fault": "decline", "fault": "slow", "ms": 10}]}"#,
    ] {
        std::fs::write(&plan, text).expect("writes");
        let output = Command::new(env!("CARGO_BIN_EXE_keel-provider-sim"))
            .args(["serve", "--db"])
            .arg(dir.path().join("sim.db"))
            .arg("--faults")
            .arg(&plan)
            .output()
            .expect("the simulator runs");
        assert!(!output.status.success(), "{text} must be refused");
        assert!(String::from_utf8_lossy(&output.stderr).contains("duplicate"), "{text}");
    }
}

/// One raw HTTP/1.1 request with a form body and a test key; returns the status code.
fn post(url: &str, path: &str, key: &str, body: &str) -> u16 {
    let addr = url.strip_prefix("http://").expect("an http URL");
    let mut stream = std::net::TcpStream::connect(addr).expect("connects");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk_test_keel\r\nIdempotency-Key: {key}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("sends");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("reads the answer");
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line")
}

#[test]
fn the_simulator_refuses_a_request_body_with_duplicate_keys() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sim = start_sim(dir.path(), None);
    let body =
        "amount=100&amount=999999&currency=eur&payment_method=pm_card_visa&confirm=true&metadata[keel_order_id]=o";
    assert_eq!(post(sim.url(), "/v1/payment_intents", "charge:t:dup_1", body), 400);
    let nested = "amount=100&payment_intent=pi_x&metadata[keel_order_id]=o&metadata[keel_order_id]=p";
    assert_eq!(post(sim.url(), "/v1/refunds", "refund:t:dup_2", nested), 400);
    assert!(effects(dir.path()).is_empty(), "nothing was charged");
}

#[test]
fn a_provider_answering_a_lower_case_currency_is_validated_by_answer_and_by_lookup() {
    let provider = FakeProvider::start(|method, path, body| {
        let lost = body.contains("order_1843");
        match (method, path) {
            ("POST", "/v1/payment_intents") if lost => (503, r#"{"error":{"type":"api_error","code":"busy"}}"#.into()),
            ("POST", "/v1/payment_intents") => (
                200,
                format!(
                    r#"{{"id":"pi_lower","object":"payment_intent","amount":{},"currency":"eur","status":"succeeded"}}"#,
                    asked_amount(body)
                ),
            ),
            ("GET", "/v1/payment_intents/search") => (
                200,
                search_result(&[serde_json::json!({"id": "pi_found", "object": "payment_intent", "amount": 2500,
                    "currency": "eur", "status": "succeeded",
                    "metadata": {"keel_intent_key": charge_key("order_1843_charge")}})]),
            ),
            _ => (404, r#"{"error":{"type":"not_found"}}"#.into()),
        }
    });
    let (_dir, db) = temp();
    let (code, out, _) = keel(&db, Some(&provider.url), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], "validated", "{out}");
    let (_, shown, _) = keel(&db, None, &["show", out["intent_key"].as_str().expect("a key")]);
    assert_eq!(shown["intent"]["evidence"]["currency"], "EUR", "normalised at the adapter: {shown}");

    let mut lost = charge_args("order_1843_charge", "2500");
    lost[6] = "order_1843";
    let (code, out, _) = keel(&db, Some(&provider.url), &lost);
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "{out}");
    let key = out["intent_key"].as_str().expect("a key").to_owned();
    let (code, out, _) = keel(&db, Some(&provider.url), &["reconcile", &key]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out[0]["status"], "validated", "{out}");
}

#[test]
fn empty_or_contradictory_provider_answers_are_never_evidence() {
    let provider = FakeProvider::start(|method, _path, body| match method {
        "POST" if body.contains("order_1842") => (
            200,
            format!(
                r#"{{"id":"","object":"payment_intent","amount":{},"currency":"eur","status":"succeeded"}}"#,
                asked_amount(body)
            ),
        ),
        "POST" => (
            200,
            format!(
                r#"{{"id":"pi_dup","object":"payment_intent","amount":{},"currency":"eur","status":"failed","status":"succeeded"}}"#,
                asked_amount(body)
            ),
        ),
        _ => (
            200,
            search_result(&[serde_json::json!({"id": "  ", "object": "payment_intent", "amount": 4900,
                "currency": "eur", "status": "succeeded",
                "metadata": {"keel_intent_key": charge_key("order_1842_charge")}})]),
        ),
    });
    let (_dir, db) = temp();
    let (code, out, _) = keel(&db, Some(&provider.url), &charge_args("order_1842_charge", "4900"));
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "an empty id proves nothing: {out}");
    let key = out["intent_key"].as_str().expect("a key").to_owned();
    let (_, out, _) = keel(&db, Some(&provider.url), &["reconcile", &key]);
    assert_ne!(out[0]["status"], "validated", "a blank id from a lookup proves nothing: {out}");
    let mut other = charge_args("order_1850_charge", "4900");
    other[6] = "order_1850";
    let (code, out, _) = keel(&db, Some(&provider.url), &other);
    assert_eq!(
        (code, out["status"].as_str()),
        (2, Some("outcome_unknown")),
        "a duplicate key is a protocol error: {out}"
    );
    let (code, out, _) =
        keel(&db, None, &["resolve", &key, "--landed", "  ", "--by", "ana", "--reason", "r", "--override", "blank"]);
    assert_ne!(code, 0, "an operator's blank evidence is refused: {out}");
}

fn lost_answer_sim(dir: &Path) -> Process {
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    start_sim(dir, Some(plan))
}

/// A charge whose effect landed at the simulator while its answer was lost.
fn landed_but_unknown(db: &Path, sim: &Process) -> String {
    let (code, out, _) = keel(
        db,
        Some(sim.url()),
        &[&["--provider-timeout-ms", "300"][..], &charge_args("order_1900_charge", "2500")].concat(),
    );
    assert_eq!((code, out["status"].as_str()), (2, Some("outcome_unknown")), "{out}");
    out["intent_key"].as_str().expect("a key").to_owned()
}

#[test]
fn resolve_refuses_what_the_provider_contradicts_unless_overridden_with_a_reason() {
    let (dir, db) = temp();
    let sim = lost_answer_sim(dir.path());
    let key = landed_but_unknown(&db, &sim);
    let real = effects(dir.path())[0].id.clone();
    let before = event_count(&db);
    for decision in [&["--landed", "ch_DOES_NOT_EXIST"][..], &["--absent"]] {
        let args = [&["resolve", &key][..], decision, &["--by", "ana", "--reason", "looked"]].concat();
        let (code, out, stderr) = keel(&db, Some(sim.url()), &args);
        assert_eq!(code, 2, "{decision:?}: {out} {stderr}");
        assert!(out["error"].to_string().contains(&real), "{decision:?}: says what the provider says: {out}");
    }
    assert_eq!(event_count(&db), before, "refusals write nothing");
    let (code, out, _) = keel(&db, None, &["resolve", &key, "--landed", &real, "--by", "ana", "--reason", "r"]);
    assert_eq!(code, 64, "a provider that can look up must be asked: {out}");

    let args = ["resolve", &key, "--landed", "ch_DOES_NOT_EXIST", "--by", "ana", "--reason", "dashboard"];
    let (code, out, _) =
        keel(&db, Some(sim.url()), &[&args[..], &["--override", "the bank statement shows it"]].concat());
    assert_eq!(code, 0, "{out}");
    let last = last_event(&db, &key);
    assert_eq!(last["type"], "IntentResolved");
    let payload = last["payload"].to_string();
    assert!(payload.contains("the bank statement shows it"), "the override and its reason are recorded: {payload}");
    assert!(payload.contains(&real), "so is what the provider said: {payload}");
}

#[test]
fn resolve_landed_that_the_provider_confirms_is_recorded_as_verified() {
    let (dir, db) = temp();
    let sim = lost_answer_sim(dir.path());
    let key = landed_but_unknown(&db, &sim);
    let real = effects(dir.path())[0].id.clone();
    let (code, out, _) =
        keel(&db, Some(sim.url()), &["resolve", &key, "--landed", &real, "--by", "ana", "--reason", "r"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], "validated");
    let payload = last_event(&db, &key)["payload"].clone();
    assert_eq!(payload["check"]["verdict"], "confirmed", "{payload}");
}

#[test]
fn resolve_without_a_lookup_records_that_it_is_unverified() {
    let (dir, db) = temp();
    let sim = lost_answer_sim(dir.path());
    let args =
        [&["--provider-timeout-ms", "300", "--provider-tier", "none"][..], &charge_args("order_1900_charge", "2500")];
    let (code, out, _) = keel(&db, Some(sim.url()), &args.concat());
    assert_eq!((code, out["status"].as_str()), (2, Some("escalated")), "{out}");
    let key = out["intent_key"].as_str().expect("a key").to_owned();
    let real = effects(dir.path())[0].id.clone();
    let (code, out, _) = keel(&db, None, &["resolve", &key, "--landed", &real, "--by", "ana", "--reason", "r"]);
    assert_eq!(code, 0, "{out}");
    let payload = last_event(&db, &key)["payload"].clone();
    assert_eq!(payload["check"]["verdict"], "unverified", "{payload}");
}

#[test]
fn a_provider_that_refuses_connections_leaves_the_intent_pending_for_a_resubmission() {
    let (dir, db) = temp();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        format!("http://{}", listener.local_addr().expect("an address"))
    };
    let (code, out, _) = keel(&db, Some(&closed), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 2, "{out}");
    assert_eq!(out["status"], "provider_unavailable", "a clear controlled outcome: {out}");
    let key = out["intent_key"].as_str().expect("a key").to_owned();
    let (_, shown, _) = keel(&db, None, &["show", &key]);
    assert_eq!(shown["status"], "reserved", "pending, not escalated: {shown}");
    let types: Vec<&str> =
        shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.iter().filter(|t| **t == "AttemptNotSent").count() > 1, "retried: {types:?}");
    assert!(!types.contains(&"IntentEscalated"), "{types:?}");

    let sim = start_sim(dir.path(), None);
    let (code, out, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    assert_eq!(code, 0, "the same request, re-submitted, continues the intent: {out}");
    assert_eq!(effects(dir.path()).len(), 1);
}

#[test]
fn the_provider_request_timeout_is_stored_with_the_intent() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let (code, out, _) = keel(
        &db,
        Some(sim.url()),
        &[&["--provider-timeout-ms", "700"][..], &charge_args("order_1842_charge", "4900")].concat(),
    );
    assert_eq!(code, 0, "{out}");
    let (_, shown, _) = keel(&db, None, &["show", out["intent_key"].as_str().expect("a key")]);
    assert_eq!(shown["intent"]["capability"]["request_timeout_ms"], 700, "{shown}");
}

#[test]
fn ids_that_cannot_travel_are_invalid_and_write_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    for (intent_id, order) in [
        ("order_1842_charge\u{7}", "order_1842"),
        ("order_1842\u{200b}_charge", "order_1842"),
        ("order_1842_chargé", "order_1842"),
        ("order_1842_charge", "order\u{1b}[31m1842"),
        ("order_1842_charge", "order_1842\u{2060}"),
        ("order_1842_charge", "ordér_1842"),
    ] {
        let mut args = charge_args(intent_id, "4900");
        args[6] = order;
        let (code, out, _) = keel(&db, Some(sim.url()), &args);
        assert_eq!((code, out["code"].as_str()), (2, Some("invalid_arguments")), "{intent_id:?} {order:?}: {out}");
    }
    let mut tenant = charge_args("order_1842_charge", "4900");
    tenant[2] = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d1ﾐ";
    let (code, out, _) = keel(&db, Some(sim.url()), &tenant);
    assert_eq!((code, out["code"].as_str()), (2, Some("invalid_arguments")), "{out}");
    assert_eq!(event_count(&db), 0);
    assert!(effects(dir.path()).is_empty());
}

#[test]
fn operator_commands_find_an_intent_keyed_by_an_upper_case_tenant() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut gated = charge_args("order_1842_charge", "5000");
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (code, waiting, _) = keel(&db, Some(sim.url()), &gated);
    assert_eq!(code, 2, "{waiting}");
    let upper = format!("charge:{}:order_1842_charge", TENANT.to_ascii_uppercase());
    let (code, shown, _) = keel(&db, None, &["show", &upper]);
    assert_eq!(code, 0, "{shown}");
    assert_eq!(shown["status"], "awaiting_approval");
    let (code, approved, _) = keel(&db, None, &["approve", &upper, "--by", "lead"]);
    assert_eq!(code, 0, "{approved}");
}

/// Runs `keel` with exactly `args` (no `--json` added) and parses stdout as one document.
fn keel_exact(db: &Path, args: &[&str]) -> (i32, Result<Value, String>) {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(db)
        .env_remove("KEEL_PROVIDER_URL")
        .env_remove("KEEL_DB")
        .args(args)
        .output()
        .expect("keel runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    (output.status.code().unwrap_or(-1), serde_json::from_str(&stdout).map_err(|e| format!("{e}: {stdout:?}")))
}

#[test]
fn every_usage_error_under_json_prints_one_json_document() {
    let (_dir, db) = temp();
    for args in [
        &["--json", "charge", "--amount-minor", "abc"][..],
        &["charge", "--amount-minor", "abc", "--json"],
        &["intents", "--bogus", "--json"],
        &["--json", "no-such-command"],
        &["--json"],
        &["resolve", "charge:t:order_1842_charge", "--by", "ana", "--reason", "r", "--json"],
        &["show", "--json"],
        &["--json", "show", "not-a-key"],
    ] {
        let (code, document) = keel_exact(&db, args);
        assert_eq!(code, 64, "{args:?}");
        let document = document.unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON document: {e}"));
        assert_eq!(document["status"], "usage_error", "{args:?}: {document}");
        assert!(document["error"].as_str().is_some_and(|e| !e.is_empty()), "{args:?}: {document}");
    }
}

/// Every object field named `name`, anywhere in `value`.
fn fields_named(value: &Value, name: &str) -> usize {
    match value {
        Value::Object(map) => map.iter().map(|(k, v)| usize::from(k == name) + fields_named(v, name)).sum(),
        Value::Array(items) => items.iter().map(|v| fields_named(v, name)).sum(),
        _ => 0,
    }
}

#[test]
fn every_json_output_names_the_intent_key_intent_key() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let mut outputs = Vec::new();
    let (_, charged, _) = keel(&db, Some(sim.url()), &charge_args("order_1842_charge", "4900"));
    let key = charged["intent_key"].as_str().expect("a key").to_owned();
    outputs.push(("charge", charged));
    let mut gated = charge_args("order_1843_charge", "5000");
    gated[6] = "order_1843";
    gated.extend(["--approval-threshold-minor", "1000"]);
    let (_, waiting, _) = keel(&db, Some(sim.url()), &gated);
    let gated_key = waiting["intent_key"].as_str().expect("a key").to_owned();
    outputs.push(("charge awaiting approval", waiting));
    outputs
        .push(("refund", keel(&db, Some(sim.url()), &refund_args("order_1842_refund", "order_1842", "100", "EUR")).1));
    outputs.push(("intents", keel(&db, None, &["intents"]).1));
    outputs.push(("show", keel(&db, None, &["show", &key]).1));
    outputs.push(("approve", keel(&db, None, &["approve", &gated_key, "--by", "lead"]).1));
    outputs.push(("reconcile", keel(&db, Some(sim.url()), &["reconcile", &key]).1));
    outputs.push(("resume", keel(&db, Some(sim.url()), &["resume"]).1));
    for (command, output) in &outputs {
        assert_ne!(output, &Value::Null, "{command} printed JSON");
        assert_eq!(fields_named(output, "key"), 0, "{command} names a key `key`: {output}");
    }
    let rows = outputs[3].1.as_array().expect("intents lists rows");
    assert!(rows.iter().all(|row| row["intent_key"].is_string()), "{rows:?}");
    assert_eq!(outputs[4].1["intent"]["intent_key"], key.as_str());
}

#[test]
fn resolve_with_a_provider_that_cannot_answer_is_refused_unless_overridden() {
    let (dir, db) = temp();
    let sim = lost_answer_sim(dir.path());
    let key = landed_but_unknown(&db, &sim);
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        format!("http://{}", listener.local_addr().expect("an address"))
    };
    let before = event_count(&db);
    let args = ["resolve", &key, "--absent", "--by", "ana", "--reason", "r"];
    let (code, out, _) = keel(&db, Some(&closed), &args);
    assert_eq!(code, 2, "an unreachable lookup is no check: {out}");
    assert_eq!(event_count(&db), before);
    let (code, out, _) =
        keel(&db, Some(&closed), &[&args[..], &["--override", "provider down, bank says no"]].concat());
    assert_eq!(code, 0, "{out}");
    assert_eq!(last_event(&db, &key)["payload"]["check"]["verdict"], "overridden");
}
