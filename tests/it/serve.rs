//! `keel serve` end to end: the real binary on 127.0.0.1 against the real simulator, driven
//! over raw HTTP/1.1. Every bad request gets a clear 4xx in the one error shape and writes
//! nothing; a key sees its own tenant only; an operator's name comes from the key.

use crate::cli::{start_sim, temp};
use provider_sim::Process;
use serde_json::{Value, json};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use testkit::sample::{CARD_TOKEN, TENANT};

pub(crate) const OTHER_TENANT: &str = "9b2d1e4f-0a3c-4e5b-8f6a-7c8d9e0f1a2b";

/// A `keel serve` child on a free port, stopped (SIGTERM) when dropped.
pub(crate) struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub(crate) addr: String,
}

impl Serve {
    pub(crate) fn start(db: &Path, sim: &Process, extra: &[&str]) -> Self {
        let serve = Self::spawn(db, sim, &[], extra);
        for _ in 0..200 {
            if serve.call("GET", "/readyz", &[], None).0 == 200 {
                return serve;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("keel serve never became ready");
    }

    /// `keel serve` started through `wrapper` (a command that runs the rest of the line, such
    /// as `prlimit`; empty for none), once it listens: over HTTP, or HTTPS when `extra` names a
    /// certificate. Not yet ready.
    pub(crate) fn spawn(db: &Path, sim: &Process, wrapper: &[&str], extra: &[&str]) -> Self {
        let keel = env!("CARGO_BIN_EXE_keel");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(keel);
                command
            }
            None => Command::new(keel),
        };
        let mut child = command
            .arg("--db")
            .arg(db)
            .args(["--provider", sim.url(), "serve", "--addr", "127.0.0.1:0"])
            .args(extra)
            .env_remove("KEEL_PROVIDER_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("keel serve starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("reads the first line");
        let line = line.trim();
        let addr = line
            .strip_prefix("listening on http://")
            .or_else(|| line.strip_prefix("listening on https://"))
            .unwrap_or_else(|| panic!("{line:?}"))
            .to_owned();
        Self { child, addr }
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        self.child.try_wait().expect("the child can be polled").is_none()
    }

    /// One request; the status, the headers (lower-case names) and the body as JSON.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, String, Value) {
        let (status, head, body) = self.call_text(method, path, headers, body);
        (status, head, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// One request; the status, the headers (lower-case names) and the body as text.
    pub(crate) fn call_text(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, String, String) {
        self.call_text_from(std::net::Ipv4Addr::LOCALHOST, method, path, headers, body)
    }

    /// [`Serve::call_text`] from the loopback address `client` (any of 127.0.0.0/8).
    pub(crate) fn call_text_from(
        &self,
        client: std::net::Ipv4Addr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, String, String) {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
        socket.bind(&std::net::SocketAddr::from((client, 0)).into()).expect("binds the client's address");
        let server: std::net::SocketAddr = self.addr.parse().expect("the server's address");
        socket.connect(&server.into()).expect("connects");
        let mut stream: std::net::TcpStream = socket.into();
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        let body = body.unwrap_or("");
        request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(request.as_bytes()).expect("sends");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).to_string();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer:?}"));
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    /// SIGTERM, then the exit code.
    pub(crate) fn stop(mut self) -> i32 {
        assert_eq!(terminate(self.child.id()), 0, "SIGTERM delivered");
        let status = self.child.wait().expect("keel serve exits");
        std::mem::forget(self);
        status.code().unwrap_or(-1)
    }
}

/// SIGTERM to our own child `pid`, through the `kill` command (no `unsafe` in the suite).
fn terminate(pid: u32) -> i32 {
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill runs");
    status.code().unwrap_or(-1)
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = terminate(self.child.id());
        let _ = self.child.wait();
    }
}

/// `keel keys create`; returns the secret.
pub(crate) fn create_key(db: &Path, tenant: &str, role: &str, name: &str) -> String {
    let (code, out, err) =
        crate::cli::keel(db, None, &["keys", "create", "--tenant", tenant, "--role", role, "--name", name]);
    assert_eq!(code, 0, "{out} {err}");
    out["secret"].as_str().expect("the secret is printed once").to_owned()
}

pub(crate) fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

pub(crate) fn charge_body(order: &str, amount: i64) -> String {
    json!({"order_id": order, "amount_minor": amount, "currency": "EUR", "payment_method_token": CARD_TOKEN})
        .to_string()
}

pub(crate) fn event_count(db: &Path) -> usize {
    store::Reader::open(db).expect("a reader").events_since(0).expect("events").len()
}

pub(crate) fn effects(dir: &Path) -> usize {
    provider_sim::list_effects(&dir.join("sim.db")).expect("the simulator's effects").len()
}

/// Asserts the one error shape and returns its code.
fn error_code(status: u16, body: &Value) -> String {
    assert!((400..500).contains(&status), "a 4xx, got {status}: {body}");
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "a message: {body}");
    assert!(error.get("details").is_some(), "details (null when none): {body}");
    error["code"].as_str().unwrap_or_else(|| panic!("a code: {body}")).to_owned()
}

#[test]
fn a_charge_over_http_is_validated_then_deduplicated_then_a_mismatch_is_a_409() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let secret = create_key(&db, TENANT, "submit", "billing-svc");
    let reader = bearer(&create_key(&db, TENANT, "read", "dash"));
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "read", "other-dash"));
    let serve = Serve::start(&db, &sim, &[]);
    let auth = bearer(&secret);
    let headers = [
        ("Authorization", auth.as_str()),
        ("Idempotency-Key", "order_1842_charge"),
        ("Content-Type", "application/json"),
    ];
    let (status, _, first) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_1842", 4900)));
    assert_eq!(status, 200, "{first}");
    let key = format!("charge:{TENANT}:order_1842_charge");
    assert_eq!((first["intent_key"].as_str(), first["status"].as_str()), (Some(key.as_str()), Some("validated")));
    assert_eq!(first["source"], "provider");

    let (status, _, again) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_1842", 4900)));
    assert_eq!((status, again["source"].as_str()), (200, Some("deduplicated")), "{again}");
    assert_eq!(again["provider_ref"], first["provider_ref"]);
    // The run that was answered from the stored result is the tenant's to read, and only its.
    let run = again["run_id"].as_str().expect("the re-submission's run");
    assert_ne!(Some(run), first["run_id"].as_str(), "a run of its own");
    for path in [format!("/v1/runs/{run}"), format!("/v1/runs/{run}/trace")] {
        let (status, _, read) = serve.call("GET", &path, &[("Authorization", &reader)], None);
        assert_eq!(status, 200, "{path}: {read}");
        let (status, _, hidden) = serve.call("GET", &path, &[("Authorization", &stranger)], None);
        assert_eq!((status, error_code(status, &hidden).as_str()), (404, "not_found"), "{path}");
    }

    let events = event_count(&db);
    let (status, _, mismatch) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_1842", 9900)));
    assert_eq!(error_code(status, &mismatch), "intent_payload_mismatch");
    assert_eq!(status, 409);
    assert_eq!(event_count(&db), events, "a mismatch writes nothing");
    assert_eq!(effects(dir.path()), 1, "one effect at the provider");

    // The body may repeat the identity, and must then agree with the key and the header.
    let repeated = json!({"tenant_id": TENANT.to_uppercase(), "intent_id": "order_1842_charge", "order_id": "order_1842",
        "amount_minor": 4900, "currency": "EUR", "payment_method_token": CARD_TOKEN});
    let (status, _, same) = serve.call("POST", "/v1/charges", &headers, Some(&repeated.to_string()));
    assert_eq!((status, same["source"].as_str()), (200, Some("deduplicated")), "{same}");

    let (status, _, shown) = serve.call("GET", &format!("/v1/intents/{key}"), &[("Authorization", &auth)], None);
    assert_eq!(status, 200, "{shown}");
    let actors: Vec<&str> =
        shown["events"].as_array().expect("events").iter().filter_map(|e| e["cause"]["actor"].as_str()).collect();
    assert!(actors.iter().all(|a| *a == "command:api:billing-svc"), "the key's name is the cause: {actors:?}");
    assert_eq!(serve.stop(), 0, "SIGTERM is a graceful stop");
    let (code, verify, _) = crate::cli::keel(&db, None, &["verify"]);
    assert_eq!(code, 0, "{verify}");
}

/// What is wrong, the headers, the body, the status and the code expected.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str, u16, &'a str);

#[test]
fn every_bad_request_is_a_clear_4xx_in_one_shape_and_writes_nothing() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = create_key(&db, TENANT, "submit", "svc");
    let read = create_key(&db, TENANT, "read", "dashboard");
    let revoked = create_key(&db, TENANT, "submit", "old-svc");
    let (code, _, _) = crate::cli::keel(&db, None, &["keys", "revoke", "old-svc"]);
    assert_eq!(code, 0);
    let operator = bearer(&create_key(&db, TENANT, "operator", "ops"));
    let serve = Serve::start(&db, &sim, &[]);
    let before = event_count(&db);
    let good = charge_body("order_77", 4900);
    let (ok, rd, old) = (bearer(&submit), bearer(&read), bearer(&revoked));
    // The last character changed to one it is not: a secret ending in '0' must not be "wronged" into itself.
    let last = if submit.ends_with('0') { '1' } else { '0' };
    let wrong_secret = format!("{}{last}", &submit[..submit.len() - 1]);
    assert_ne!(wrong_secret, submit, "the wrong secret differs from the right one");
    let wrong = bearer(&wrong_secret);
    let json_ct = ("Content-Type", "application/json");
    let idem = ("Idempotency-Key", "order_77_charge_1");
    let big = format!(
        r#"{{"order_id":"{}","amount_minor":1,"currency":"EUR","payment_method_token":"{CARD_TOKEN}"}}"#,
        "o".repeat(20_000)
    );
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let duplicate = format!(
        r#"{{"order_id":"o","amount_minor":100,"amount_minor":999999,"currency":"EUR","payment_method_token":"{CARD_TOKEN}"}}"#
    );
    let unknown = format!(
        r#"{{"order_id":"o","amount_minor":100,"currency":"EUR","payment_method_token":"{CARD_TOKEN}","by":"mallory"}}"#
    );
    let other_tenant = json!({"tenant_id": OTHER_TENANT, "order_id": "o", "amount_minor": 100, "currency": "EUR", "payment_method_token": CARD_TOKEN}).to_string();
    let negative = charge_body("order_77", -5);
    // serde's sequence form of the charge request: its fields by position.
    let sequence = json!([TENANT, null, "order_77", 4900, "EUR", CARD_TOKEN]).to_string();
    let other_key = ("Idempotency-Key", "order_77_charge_2");
    let cases: Vec<Case<'_>> = vec![
        (
            "the sequence form of a charge",
            vec![("Authorization", &ok), json_ct, idem],
            &sequence,
            400,
            "invalid_arguments",
        ),
        (
            "two Idempotency-Keys",
            vec![("Authorization", &ok), json_ct, idem, other_key],
            &good,
            400,
            "invalid_arguments",
        ),
        (
            "two Authorizations",
            vec![("Authorization", &ok), ("Authorization", &rd), json_ct, idem],
            &good,
            400,
            "invalid_arguments",
        ),
        ("two content types", vec![("Authorization", &ok), json_ct, json_ct, idem], &good, 400, "invalid_arguments"),
        ("no key", vec![json_ct, idem], &good, 401, "missing_api_key"),
        ("a wrong secret", vec![("Authorization", &wrong), json_ct, idem], &good, 401, "invalid_api_key"),
        ("not a bearer", vec![("Authorization", "Basic dXNlcjpwYXNz"), json_ct, idem], &good, 401, "invalid_api_key"),
        ("a revoked key", vec![("Authorization", &old), json_ct, idem], &good, 401, "revoked_api_key"),
        ("a read key charging", vec![("Authorization", &rd), json_ct, idem], &good, 403, "forbidden"),
        ("another tenant in the body", vec![("Authorization", &ok), json_ct, idem], &other_tenant, 403, "forbidden"),
        ("no Idempotency-Key", vec![("Authorization", &ok), json_ct], &good, 400, "invalid_arguments"),
        (
            "a short Idempotency-Key",
            vec![("Authorization", &ok), json_ct, ("Idempotency-Key", "short")],
            &good,
            400,
            "invalid_arguments",
        ),
        ("an oversized body", vec![("Authorization", &ok), json_ct, idem], &big, 413, "body_too_large"),
        ("malformed JSON", vec![("Authorization", &ok), json_ct, idem], "{\"order_id\": ", 400, "invalid_json"),
        ("duplicate keys", vec![("Authorization", &ok), json_ct, idem], &duplicate, 400, "invalid_json"),
        ("nesting too deep", vec![("Authorization", &ok), json_ct, idem], &deep, 400, "invalid_json"),
        ("an unknown field", vec![("Authorization", &ok), json_ct, idem], &unknown, 400, "invalid_arguments"),
        (
            "the wrong content type",
            vec![("Authorization", &ok), ("Content-Type", "text/plain"), idem],
            &good,
            415,
            "unsupported_media_type",
        ),
        ("no content type", vec![("Authorization", &ok), idem], &good, 415, "unsupported_media_type"),
        ("an invalid field", vec![("Authorization", &ok), json_ct, idem], &negative, 400, "invalid_arguments"),
    ];
    for (what, headers, body, status, code) in cases {
        let (got, _, answer) = serve.call("POST", "/v1/charges", &headers, Some(body));
        assert_eq!((got, error_code(got, &answer).as_str()), (status, code), "{what}: {answer}");
        let text = answer.to_string();
        assert!(!text.contains(&submit[5..]) && !text.contains(&revoked[5..]), "{what}: a secret echoed back: {text}");
        assert!(!text.contains(CARD_TOKEN), "{what}: the card token echoed back: {text}");
    }
    // The operators' bodies meet the same door: an array is not a resolution.
    let resolve = json!([null, true, "the bank says so", null]).to_string();
    let path = format!("/v1/intents/charge:{TENANT}:order_77_charge_1/resolve");
    let (status, _, answer) = serve.call("POST", &path, &[("Authorization", &operator), json_ct], Some(&resolve));
    assert_eq!((status, error_code(status, &answer).as_str()), (400, "invalid_arguments"), "{answer}");
    let (status, _, answer) = serve.call("GET", "/v1/nothing-here", &[("Authorization", &ok)], None);
    assert_eq!((status, error_code(status, &answer).as_str()), (404, "not_found"));
    let (status, _, answer) = serve.call("DELETE", "/v1/charges", &[("Authorization", &ok)], None);
    assert_eq!((status, error_code(status, &answer).as_str()), (405, "method_not_allowed"));
    assert_eq!(event_count(&db), before, "nothing was written");
    assert_eq!(effects(dir.path()), 0, "nothing reached the provider");
}

#[test]
fn a_key_sees_its_own_tenant_only_and_an_operator_is_named_by_its_key() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let operator = bearer(&create_key(&db, TENANT, "operator", "ops-ann"));
    let reader = bearer(&create_key(&db, TENANT, "read", "dash"));
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "operator", "ops-other"));
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "10000"]);
    let charge = |auth: &str, id: &str, amount: i64| {
        let headers = [("Authorization", auth), ("Idempotency-Key", id), ("Content-Type", "application/json")];
        serve.call("POST", "/v1/charges", &headers, Some(&charge_body(&format!("order_{id}"), amount)))
    };
    let (status, head, waiting) = charge(&submit, "big_charge_0001", 25_000);
    assert_eq!((status, waiting["status"].as_str()), (202, Some("awaiting_approval")), "{waiting}");
    assert!(head.contains("retry-after: 60"), "{head}");
    assert_eq!(waiting["retry_after_s"], 60);
    let key = format!("charge:{TENANT}:big_charge_0001");

    // Another tenant's key: the intent does not exist for it, whatever it asks.
    let missing = format!("charge:{OTHER_TENANT}:big_charge_0001");
    let before = event_count(&db);
    for (method, path, body) in [
        ("GET", format!("/v1/intents/{key}"), None),
        ("POST", format!("/v1/intents/{key}/approve"), Some("{}")),
        ("POST", format!("/v1/intents/{key}/cancel"), Some(r#"{"reason":"mine now"}"#)),
        ("POST", format!("/v1/intents/{missing}/approve"), Some("{}")),
    ] {
        let (status, _, answer) =
            serve.call(method, &path, &[("Authorization", &stranger), ("Content-Type", "application/json")], body);
        assert_eq!((status, error_code(status, &answer).as_str()), (404, "not_found"), "{path}: {answer}");
    }
    let (status, _, listed) = serve.call("GET", "/v1/intents", &[("Authorization", &stranger)], None);
    assert_eq!((status, listed["intents"].as_array().map(Vec::len)), (200, Some(0)), "{listed}");
    // A read key may not decide; a submit key neither; a body may not name the operator.
    for auth in [&reader, &submit] {
        let (status, _, answer) =
            serve.call("POST", &format!("/v1/intents/{key}/approve"), &[("Authorization", auth)], None);
        assert_eq!((status, error_code(status, &answer).as_str()), (403, "forbidden"), "{answer}");
    }
    let (status, _, answer) = serve.call(
        "POST",
        &format!("/v1/intents/{key}/approve"),
        &[("Authorization", &operator), ("Content-Type", "application/json")],
        Some(r#"{"by":"mallory"}"#),
    );
    assert_eq!((status, error_code(status, &answer).as_str()), (400, "invalid_arguments"), "{answer}");
    assert_eq!(event_count(&db), before, "no refused decision wrote anything");

    let (status, _, approved) =
        serve.call("POST", &format!("/v1/intents/{key}/approve"), &[("Authorization", &operator)], None);
    assert_eq!(status, 200, "{approved}");
    let (status, _, shown) = serve.call("GET", &format!("/v1/intents/{key}"), &[("Authorization", &reader)], None);
    assert_eq!(status, 200);
    let approval = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["type"] == "ApprovalGranted")
        .expect("an approval");
    assert_eq!(approval["cause"]["actor"], "operator:ops-ann", "{approval}");
    assert!(approval.to_string().contains("ops-ann") && !approval.to_string().contains("mallory"));

    // The submitter asks again after Retry-After: the approved charge goes through.
    let (status, _, done) = charge(&submit, "big_charge_0001", 25_000);
    assert_eq!((status, done["status"].as_str()), (200, Some("validated")), "{done}");
    assert_eq!(effects(dir.path()), 1);

    // Operator decisions the ledger refuses are 409 and write nothing.
    let before = event_count(&db);
    let (status, _, answer) = serve.call(
        "POST",
        &format!("/v1/intents/{key}/cancel"),
        &[("Authorization", &operator), ("Content-Type", "application/json")],
        Some(r#"{"reason":"too late"}"#),
    );
    assert_eq!((status, error_code(status, &answer).as_str()), (409, "refused"), "{answer}");
    assert_eq!(event_count(&db), before);
}

#[test]
fn an_unknown_outcome_is_a_202_with_when_to_ask_again() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let operator = bearer(&create_key(&db, TENANT, "operator", "ops-bob"));
    let serve = Serve::start(&db, &sim, &["--provider-timeout-ms", "300"]);
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "lost_answer_01"),
        ("Content-Type", "application/json"),
    ];
    let (status, head, unknown) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_lost", 2500)));
    assert_eq!((status, unknown["status"].as_str()), (202, Some("outcome_unknown")), "{unknown}");
    let seconds = unknown["retry_after_s"].as_u64().expect("retry_after_s");
    assert!((1..=60).contains(&seconds), "{unknown}");
    assert!(head.contains(&format!("retry-after: {seconds}")), "{head}");
    // The operator reconciles it now: the lookup finds the landed effect.
    let key = format!("charge:{TENANT}:lost_answer_01");
    let (status, _, reconciled) =
        serve.call("POST", &format!("/v1/intents/{key}/reconcile"), &[("Authorization", &operator)], None);
    assert_eq!((status, reconciled["status"].as_str()), (200, Some("validated")), "{reconciled}");
    assert_eq!(effects(dir.path()), 1);
}

#[test]
fn an_unknown_outcome_settles_while_its_caller_only_reads_it() {
    let (dir, db) = temp();
    let plan = r#"{"seed":1,"rules":[{"operation":"charge","fault":"timeout_after_effect","times":1,"ms":1500}]}"#;
    let sim = start_sim(dir.path(), Some(plan));
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let serve = Serve::start(&db, &sim, &["--provider-timeout-ms", "300", "--provider-consistency-window-ms", "0"]);
    let headers =
        [("Authorization", submit.as_str()), ("Idempotency-Key", "read_only_01"), ("Content-Type", "application/json")];
    let (status, _, unknown) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("order_read", 2500)));
    assert_eq!((status, unknown["status"].as_str()), (202, Some("outcome_unknown")), "{unknown}");
    let path = format!("/v1/intents/charge:{TENANT}:read_only_01");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let settled = loop {
        let (status, _, shown) = serve.call("GET", &path, &[("Authorization", &submit)], None);
        assert_eq!(status, 200, "{shown}");
        if shown["status"] == "validated" {
            break shown;
        }
        assert!(std::time::Instant::now() < deadline, "never reconciled in the background: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(settled["source"], "reconciled", "{settled}");
    assert_eq!(effects(dir.path()), 1);
}

#[test]
fn intents_are_paged_by_key_with_an_opaque_cursor_for_the_key_s_tenant() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "submit", "svc-other"));
    let serve = Serve::start(&db, &sim, &[]);
    let mut expected = Vec::new();
    for (auth, tenant, i) in [
        (&submit, TENANT, 1),
        (&submit, TENANT, 2),
        (&stranger, OTHER_TENANT, 3),
        (&submit, TENANT, 4),
        (&submit, TENANT, 5),
    ] {
        let id = format!("paged_charge_{i:04}");
        let headers =
            [("Authorization", auth.as_str()), ("Idempotency-Key", id.as_str()), ("Content-Type", "application/json")];
        let (status, _, out) =
            serve.call("POST", "/v1/charges", &headers, Some(&charge_body(&format!("o{i}"), 100 + i)));
        assert_eq!(status, 200, "{out}");
        if tenant == TENANT {
            expected.push(format!("charge:{TENANT}:{id}"));
        }
    }
    let mut seen = Vec::new();
    let mut path = "/v1/intents?limit=2".to_owned();
    let mut stranger_cursor = None;
    loop {
        let (status, _, page) = serve.call("GET", &path, &[("Authorization", &submit)], None);
        assert_eq!(status, 200, "{page}");
        let intents = page["intents"].as_array().expect("intents");
        assert!(intents.len() <= 2);
        seen.extend(intents.iter().map(|i| i["intent_key"].as_str().expect("a key").to_owned()));
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                stranger_cursor.get_or_insert(cursor.to_owned());
                path = format!("/v1/intents?limit=2&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(seen, expected, "every intent of the tenant once, in key order");
    let (status, _, validated) =
        serve.call("GET", "/v1/intents?state=validated&limit=10", &[("Authorization", &submit)], None);
    assert_eq!((status, validated["intents"].as_array().map(Vec::len)), (200, Some(4)));
    for (path, auth) in [
        ("/v1/intents?state=happy".to_owned(), &submit),
        ("/v1/intents?limit=0".to_owned(), &submit),
        ("/v1/intents?limit=1001".to_owned(), &submit),
        ("/v1/intents?cursor=zz".to_owned(), &submit),
        ("/v1/intents?colour=red".to_owned(), &submit),
        (format!("/v1/intents?cursor={}", stranger_cursor.expect("a cursor")), &stranger),
    ] {
        let (status, _, answer) = serve.call("GET", &path, &[("Authorization", auth)], None);
        assert_eq!((status, error_code(status, &answer).as_str()), (400, "invalid_arguments"), "{path}: {answer}");
    }
}

#[test]
fn a_key_over_its_rate_is_told_when_to_come_back_and_its_charge_is_not_written() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let other = bearer(&create_key(&db, TENANT, "read", "dash"));
    // One per second, a burst of two: spent by the first two reads, unless the machine is so
    // slow that a second passed between them (then the next read spends the refill).
    let serve = Serve::start(&db, &sim, &["--rate-per-s", "1"]);
    let before = event_count(&db);
    let reads: Vec<u16> =
        (0..4).map(|_| serve.call("GET", "/v1/intents", &[("Authorization", &submit)], None).0).collect();
    assert_eq!(reads[..2], [200, 200], "the burst serves two at once");
    assert!(reads.contains(&429), "four reads at once overrun one per second: {reads:?}");
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "rate_limited_01"),
        ("Content-Type", "application/json"),
    ];
    let (status, head, answer) = serve.call("POST", "/v1/charges", &headers, Some(&charge_body("o", 100)));
    assert_eq!((status, error_code(status, &answer).as_str()), (429, "rate_limited"), "{answer}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert_eq!(event_count(&db), before);
    assert_eq!(effects(dir.path()), 0);
    assert_eq!(
        serve.call("GET", "/v1/intents", &[("Authorization", &other)], None).0,
        200,
        "another key has its own bucket"
    );
    // A key revoked while the server runs is refused from its next request on.
    let (code, _, _) = crate::cli::keel(&db, None, &["keys", "revoke", "dash"]);
    assert_eq!(code, 0);
    let (status, _, answer) = serve.call("GET", "/v1/intents", &[("Authorization", &other)], None);
    assert_eq!((status, error_code(status, &answer).as_str()), (401, "revoked_api_key"), "{answer}");
}

#[test]
fn keys_are_listed_without_secrets_and_revoked_by_name_or_id() {
    let (_dir, db) = temp();
    let secret = create_key(&db, TENANT, "operator", "ops-cy");
    let (code, listed, _) = crate::cli::keel(&db, None, &["keys", "list"]);
    assert_eq!(code, 0);
    let text = listed.to_string();
    assert!(!text.contains(&secret[5..]) && !text.contains("secret"), "{text}");
    assert_eq!(listed[0]["name"], "ops-cy");
    let id = listed[0]["id"].as_str().expect("an id").to_owned();
    let (code, revoked, _) = crate::cli::keel(&db, None, &["keys", "revoke", &id]);
    assert_eq!((code, revoked["name"].as_str()), (0, Some("ops-cy")));
    assert!(revoked["revoked_at"].is_string());
    let (code, _, _) = crate::cli::keel(&db, None, &["keys", "revoke", "nobody"]);
    assert_eq!(code, 64, "an unknown key is not found (64, as every command's not-found)");
    for bad in [
        vec!["keys", "create", "--tenant", "not-a-uuid", "--role", "read", "--name", "x"],
        vec!["keys", "create", "--tenant", TENANT, "--role", "admin", "--name", "x"],
        vec!["keys", "create", "--tenant", TENANT, "--role", "read", "--name", "has space"],
        vec!["keys", "create", "--tenant", TENANT, "--role", "read", "--name", "ops-cy"],
    ] {
        let (code, out, _) = crate::cli::keel(&db, None, &bad);
        assert_eq!(code, 64, "{bad:?}: {out}");
    }
}

#[test]
fn the_openapi_document_is_served_and_every_route_it_names_answers() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let serve = Serve::start(&db, &sim, &[]);
    let (status, _, document) = serve.call("GET", "/openapi.json", &[], None);
    assert_eq!(status, 200);
    assert!(document["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", document["openapi"]);
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.len() >= 12, "{paths:?}");
    let key = format!("charge:{TENANT}:openapi_probe_01");
    for (path, item) in paths {
        for method in item.as_object().expect("a path item").keys() {
            let concrete = path.replace("{key}", &key).replace("{id}", "openapi_probe_run");
            let (status, _, answer) = serve.call(&method.to_uppercase(), &concrete, &[], None);
            let code = answer["error"]["code"].as_str().unwrap_or_default();
            assert!(
                code != "not_found" && code != "method_not_allowed",
                "{method} {path} is not served: {status} {answer}"
            );
            assert!(status == 200 || code == "missing_api_key", "{method} {path}: {status} {answer}");
        }
    }
    assert_eq!(event_count(&db), 0, "probing wrote nothing");
}

#[test]
fn recovery_runs_before_ready_attempts_left_by_a_crash_become_unknown() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    // A process that died with three attempts in flight (the bench's tenant).
    let left = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["bench-leave-in-flight", "--intents", "3"])
        .output()
        .expect("bench-leave-in-flight runs");
    assert!(left.status.success(), "{}", String::from_utf8_lossy(&left.stderr));
    let tenant = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
    let reader = bearer(&create_key(&db, tenant, "read", "dash"));
    let serve = Serve::start(&db, &sim, &[]);
    let (status, _, page) = serve.call("GET", "/v1/intents", &[("Authorization", &reader)], None);
    assert_eq!(status, 200, "{page}");
    let intents = page["intents"].as_array().expect("intents");
    assert_eq!(intents.len(), 3, "{page}");
    for intent in intents {
        assert_ne!(intent["status"], "attempting", "ready only once recovery has run: {intent}");
        let key = intent["intent_key"].as_str().expect("a key");
        let (_, _, shown) = serve.call("GET", &format!("/v1/intents/{key}"), &[("Authorization", &reader)], None);
        let types: Vec<&str> =
            shown["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
        assert!(types.contains(&"OutcomeUnknown"), "{types:?}");
    }
    assert_eq!(serve.stop(), 0);
}

#[test]
fn operator_bodies_meet_the_same_door_and_serve_needs_a_provider() {
    let (dir, db) = temp();
    let (code, out, _) = crate::cli::keel(&db, None, &["serve", "--addr", "127.0.0.1:0"]);
    assert_eq!(code, 64, "no provider is a usage error: {out}");
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let operator = bearer(&create_key(&db, TENANT, "operator", "ops-dee"));
    let serve = Serve::start(&db, &sim, &["--approval-threshold-minor", "100"]);
    let headers = [
        ("Authorization", submit.as_str()),
        ("Idempotency-Key", "door_charge_01"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(serve.call("POST", "/v1/charges", &headers, Some(&charge_body("o_door", 500))).0, 202);
    let before = event_count(&db);
    let path = format!("/v1/intents/charge:{TENANT}:door_charge_01/deny");
    let json_ct = ("Content-Type", "application/json");
    let long_reason = json!({"reason": "x".repeat(20_000)}).to_string();
    for (headers, body, status, code) in [
        (vec![("Authorization", operator.as_str()), json_ct], r#"{"reason":"a","reason":"b"}"#, 400, "invalid_json"),
        (
            vec![("Authorization", operator.as_str()), ("Content-Type", "text/plain")],
            r#"{"reason":"a"}"#,
            415,
            "unsupported_media_type",
        ),
        (vec![("Authorization", operator.as_str()), json_ct], long_reason.as_str(), 413, "body_too_large"),
        (vec![("Authorization", operator.as_str()), json_ct], r#"{"reason":"  "}"#, 400, "invalid_arguments"),
        (
            vec![("Authorization", operator.as_str()), json_ct],
            r#"{"reason":"a","by":"mallory"}"#,
            400,
            "invalid_arguments",
        ),
    ] {
        let (got, _, answer) = serve.call("POST", &path, &headers, Some(body));
        assert_eq!((got, error_code(got, &answer).as_str()), (status, code), "{body}: {answer}");
    }
    assert_eq!(event_count(&db), before, "no refused decision wrote anything");
    let (status, _, denied) =
        serve.call("POST", &path, &[("Authorization", &operator), json_ct], Some(r#"{"reason":"not ours"}"#));
    assert_eq!((status, denied["status"].as_str()), (200, Some("rejected")), "{denied}");
    assert_eq!(effects(dir.path()), 0);
}

#[test]
fn each_request_is_held_to_its_tenants_policy_and_records_it() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let policy = dir.path().join("keel.toml");
    std::fs::write(
        &policy,
        format!(
            "version = \"serve-test-1\"\n[tenants.\"{TENANT}\".operations.charge]\nmax_amount_minor = 1000\ncurrencies = [\"EUR\"]\n"
        ),
    )
    .expect("writes the policy");
    let strict = bearer(&create_key(&db, TENANT, "submit", "strict-svc"));
    let other = bearer(&create_key(&db, OTHER_TENANT, "submit", "other-svc"));
    let serve = Serve::start(&db, &sim, &["--policy", policy.to_str().expect("a UTF-8 path")]);
    let post = |secret: &str, id: &str, body: &str| {
        let headers = [("Authorization", secret), ("Idempotency-Key", id), ("Content-Type", "application/json")];
        serve.call("POST", "/v1/charges", &headers, Some(body))
    };
    let before = event_count(&db);
    let (status, _, answer) = post(&strict, "policy_over_0001", &charge_body("o-strict-1", 1_001));
    assert_eq!((status, error_code(status, &answer).as_str()), (422, "policy_denied"), "{answer}");
    assert_eq!((event_count(&db), effects(dir.path())), (before, 0), "refused before anything was written");
    let (status, _, answer) = post(&strict, "policy_at_00001", &charge_body("o-strict-2", 1_000));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["policy"]["version"], "serve-test-1", "the run records the policy it ran under: {answer}");
    // Another tenant has no section of its own: the policy's defaults (the built-in bounds).
    let (status, _, answer) = post(&other, "policy_other_001", &charge_body("o-other-1", 1_001));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(effects(dir.path()), 2);
}

#[test]
fn runs_traces_and_metrics_are_read_behind_a_key_and_the_tenant_wall() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let submit = bearer(&create_key(&db, TENANT, "submit", "svc"));
    let reader = bearer(&create_key(&db, TENANT, "read", "dash"));
    let stranger = bearer(&create_key(&db, OTHER_TENANT, "operator", "ops-other"));
    let serve = Serve::start(&db, &sim, &[]);
    let mut run_ids = Vec::new();
    for (i, id) in ["read_runs_0001", "read_runs_0002"].into_iter().enumerate() {
        let headers =
            [("Authorization", submit.as_str()), ("Idempotency-Key", id), ("Content-Type", "application/json")];
        let (status, _, out) =
            serve.call("POST", "/v1/charges", &headers, Some(&charge_body(&format!("o-run-{i}"), 700)));
        assert_eq!(status, 200, "{out}");
        run_ids.push(out["run_id"].as_str().expect("a run id").to_owned());
    }
    run_ids.sort();
    let before = event_count(&db);

    // Paged in id order, like the intents.
    let (status, _, first) = serve.call("GET", "/v1/runs?limit=1", &[("Authorization", &reader)], None);
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["runs"][0]["run_id"].as_str(), Some(run_ids[0].as_str()), "{first}");
    let cursor = first["next_cursor"].as_str().expect("a second page");
    let (_, _, second) =
        serve.call("GET", &format!("/v1/runs?limit=1&cursor={cursor}"), &[("Authorization", &reader)], None);
    assert_eq!(second["runs"][0]["run_id"].as_str(), Some(run_ids[1].as_str()), "{second}");
    assert!(second["next_cursor"].is_null(), "{second}");
    let (_, _, finished) = serve.call("GET", "/v1/runs?status=completed", &[("Authorization", &reader)], None);
    assert_eq!(finished["runs"].as_array().map(Vec::len), Some(2), "{finished}");
    let (_, _, running) = serve.call("GET", "/v1/runs?status=running", &[("Authorization", &reader)], None);
    assert_eq!(running["runs"].as_array().map(Vec::len), Some(0), "{running}");

    // One run, its trace; another tenant's key finds neither.
    let path = format!("/v1/runs/{}", run_ids[0]);
    let (status, _, shown) = serve.call("GET", &path, &[("Authorization", &reader)], None);
    assert_eq!((status, shown["run_id"].as_str()), (200, Some(run_ids[0].as_str())), "{shown}");
    assert_eq!(shown["intents"].as_array().map(Vec::len), Some(1), "{shown}");
    let (status, _, trace) = serve.call("GET", &format!("{path}/trace"), &[("Authorization", &reader)], None);
    assert_eq!(status, 200, "{trace}");
    assert_eq!(trace["roots"][0]["event"], "RunStarted", "{trace}");
    for probe in [path.clone(), format!("{path}/trace"), "/v1/runs/no-such-run".to_owned()] {
        let (status, _, answer) = serve.call("GET", &probe, &[("Authorization", &stranger)], None);
        assert_eq!((status, error_code(status, &answer).as_str()), (404, "not_found"), "{probe}: {answer}");
    }
    let (_, _, theirs) = serve.call("GET", "/v1/runs", &[("Authorization", &stranger)], None);
    assert_eq!(theirs["runs"].as_array().map(Vec::len), Some(0), "{theirs}");

    // The figures are the key's tenant's.
    let (status, _, figures) = serve.call("GET", "/v1/metrics?by=operation", &[("Authorization", &reader)], None);
    assert_eq!(status, 200, "{figures}");
    assert_eq!(
        (figures["segments"][0]["segment"].as_str(), figures["segments"][0]["intents"].as_u64()),
        (Some("charge"), Some(2))
    );
    let (_, _, theirs) = serve.call("GET", "/v1/metrics", &[("Authorization", &stranger)], None);
    assert_eq!(theirs["segments"][0]["intents"], 0, "another tenant's figures are its own: {theirs}");
    let (status, head, text) = serve.call_text("GET", "/metrics", &[("Authorization", &reader)], None);
    assert_eq!(status, 200, "{text}");
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    for line in [
        "# HELP keel_intents Intents reserved.",
        "# TYPE keel_intents gauge",
        "keel_intents 2",
        "keel_intents_validated 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in {text}");
    }
    assert!(text.lines().filter(|l| !l.starts_with('#')).all(|l| l.starts_with("keel_")), "{text}");

    for (path, auth, status, code) in [
        ("/v1/runs?status=happy", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/runs?limit=0", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/runs?cursor=zz", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/runs?colour=red", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/metrics?by=colour", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/metrics?since=yesterday", reader.as_str(), 400, "invalid_arguments"),
        ("/v1/runs", "Bearer keel_nope_nope", 401, "invalid_api_key"),
    ] {
        let (got, _, answer) = serve.call("GET", path, &[("Authorization", auth)], None);
        assert_eq!((got, error_code(got, &answer).as_str()), (status, code), "{path}: {answer}");
    }
    let (status, _, answer) = serve.call("GET", "/metrics", &[], None);
    assert_eq!((status, error_code(status, &answer).as_str()), (401, "missing_api_key"), "{answer}");
    assert_eq!(event_count(&db), before, "reading wrote nothing");
}

/// A self-signed certificate for `localhost` and its key, written as PEM files in `dir`.
pub(crate) fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("a self-signed certificate");
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let pem = certified.cert.pem();
    std::fs::write(&cert, &pem).expect("the certificate is written");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("the key is written");
    (cert, key, pem)
}

#[test]
fn with_a_certificate_it_serves_https_only_and_the_console_cookie_is_secure() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let reader = create_key(&db, TENANT, "read", "dash");
    let (cert, key, pem) = self_signed(dir.path(), "server");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--db")
        .arg(&db)
        .args(["--provider", sim.url(), "serve", "--addr", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("keel serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line).expect("the first line");
    let addr: std::net::SocketAddr =
        line.trim().strip_prefix("listening on https://").unwrap_or_else(|| panic!("{line:?}")).parse().expect("addr");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = std::net::TcpStream::connect(addr).expect("connects");
    plain.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("a timeout");
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("writes");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/1.1"), "plain HTTP is not answered: {:?}", String::from_utf8_lossy(&answer));

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("the test's certificate"))
        .resolve("localhost", addr)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client trusting the test's certificate");
    let base = format!("https://localhost:{}", addr.port());
    let (ready, runs, cookie) = runtime.block_on(async {
        let mut ready = 0;
        for _ in 0..200 {
            ready = client.get(format!("{base}/readyz")).send().await.expect("HTTPS answers").status().as_u16();
            if ready == 200 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let runs = client.get(format!("{base}/v1/runs")).bearer_auth(&reader).send().await.expect("runs");
        let login = client.get(format!("{base}/console/login")).send().await.expect("the login page");
        let cookie = login.headers().get("set-cookie").map(|v| v.to_str().expect("ascii").to_owned());
        (ready, runs.status().as_u16(), cookie)
    });
    assert_eq!((ready, runs), (200, 200), "the API answers over TLS");
    let cookie = cookie.expect("the login page gives a session");
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Secure"), "{cookie}");
    assert_eq!(terminate(child.id()), 0, "SIGTERM delivered");
    assert_eq!(child.wait().expect("keel serve exits").code(), Some(0), "a graceful stop over TLS too");
}

#[test]
fn a_certificate_that_cannot_serve_is_refused_at_start_naming_the_file() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    create_key(&db, TENANT, "read", "dash");
    let (cert, key, _) = self_signed(dir.path(), "server");
    let (_, other_key, _) = self_signed(dir.path(), "other");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").expect("written");
    let missing = dir.path().join("missing.crt");
    let path = |p: &Path| p.to_str().expect("utf-8 temp path").to_owned();
    let cases: Vec<(&str, Vec<String>, String)> = vec![
        (
            "a missing certificate file",
            vec!["--tls-cert".into(), path(&missing), "--tls-key".into(), path(&key)],
            path(&missing),
        ),
        (
            "a file that is not PEM",
            vec!["--tls-cert".into(), path(&not_pem), "--tls-key".into(), path(&key)],
            path(&not_pem),
        ),
        (
            "a key that is not PEM",
            vec!["--tls-cert".into(), path(&cert), "--tls-key".into(), path(&not_pem)],
            path(&not_pem),
        ),
        (
            "another certificate's key",
            vec!["--tls-cert".into(), path(&cert), "--tls-key".into(), path(&other_key)],
            path(&other_key),
        ),
        ("a certificate without its key", vec!["--tls-cert".into(), path(&cert)], "--tls-key".into()),
        ("a key without its certificate", vec!["--tls-key".into(), path(&key)], "--tls-cert".into()),
    ];
    let before = event_count(&db);
    for (what, flags, named) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--db")
            .arg(&db)
            .args(["--provider", sim.url(), "serve", "--addr", "127.0.0.1:0"])
            .args(&flags)
            .output()
            .expect("keel serve runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{what}: {stderr}");
        assert!(stderr.contains(&named), "{what}: the message names {named}: {stderr}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"), "{what}: nothing listened");
        assert!(!stderr.contains("PRIVATE KEY"), "{what}: no key material echoed: {stderr}");
    }
    assert_eq!(event_count(&db), before, "nothing was written");
}
