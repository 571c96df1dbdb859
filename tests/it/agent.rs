//! `keel agent` end to end: seed 003's acceptance table through the real binary on a real
//! event log, a real process death mid-run resumed from the log, `keel verify` on logs
//! holding agent runs, and live runs (`--model-api`) against a local model API server.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Runs `keel --db DB --json ARGS` with exactly `env` added (no key nor OpenTelemetry
/// endpoint inherited from the host);
/// returns the exit code, stdout and stderr.
pub(crate) fn keel_raw(db: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("--db").arg(db).arg("--json").env_remove("KEEL_DB").env_remove("KEEL_PROVIDER_URL");
    command.env_remove("ANTHROPIC_API_KEY").env_remove("OPENAI_API_KEY");
    for otel in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME"] {
        command.env_remove(otel);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.args(args).output().expect("keel runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

pub(crate) fn keel(db: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let (code, stdout, _) = keel_raw(db, args, env);
    (code, serde_json::from_str(&stdout).unwrap_or(Value::Null))
}

pub(crate) fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = dir.path().join("keel.db");
    (dir, db)
}

pub(crate) fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(path).display().to_string()
}

/// (scenario, status, model calls, tool calls, exit code): seed 003's table.
const TABLE: [(&str, &str, u64, u64, i32); 8] = [
    ("complete", "completed", 3, 2, 0),
    ("incomplete", "incomplete", 1, 0, 2),
    ("forbidden", "permission_denied", 1, 0, 2),
    ("repeat", "repeated_call", 2, 1, 2),
    ("changing", "tool_budget", 5, 4, 2),
    ("budget", "model_budget", 1, 1, 2),
    ("deadline", "deadline_exceeded", 1, 0, 2),
    ("unavailable", "provider_unavailable", 1, 0, 2),
];

#[test]
fn every_seed_003_scenario_ends_exactly_as_the_seed_says_and_the_log_verifies() {
    let (_dir, db) = temp();
    for (scenario, status, model_calls, tool_calls, code) in TABLE {
        let (exit, report) = keel(&db, &["agent", "run", "ticket-review", "--scenario", scenario], &[]);
        assert_eq!(exit, code, "{scenario}: exit code, report {report}");
        assert_eq!(report["status"], status, "{scenario}: status");
        assert_eq!(report["model_calls"], model_calls, "{scenario}: model calls");
        assert_eq!(report["tool_calls"], tool_calls, "{scenario}: tool calls");
        let events = report["events"].as_array().expect("events");
        for event in events {
            let keys: Vec<&str> = event.as_object().expect("an object").keys().map(String::as_str).collect();
            assert_eq!(keys, ["count", "kind", "name"], "{scenario}: control events carry no arguments");
        }
        let last = events.last().expect("at least one event");
        if status != "completed" && status != "incomplete" {
            assert_eq!(last["kind"], status, "{scenario}: the stop is the last control event");
        }
        let run_id = report["run_id"].as_str().expect("a run id");
        let reader = store::Reader::open(&db).expect("the log opens");
        let row = reader.run(&engine::event::RunId::new(run_id)).expect("reads").expect("the run is projected");
        assert_eq!(row.workflow, "agent:ticket-review");
        assert_eq!(row.status, status, "{scenario}: the runs projection holds the agent status");
    }
    let (exit, report) = keel(&db, &["verify"], &[]);
    assert_eq!(exit, 0, "verify passes on a log of agent runs: {report}");
}

#[test]
fn forbidden_never_runs_the_body() {
    let (_dir, db) = temp();
    let (_, report) = keel(&db, &["agent", "run", "ticket-review", "--scenario", "forbidden"], &[]);
    let state = agent_state(&db, report["run_id"].as_str().expect("id"));
    assert_eq!(state.results().count(), 0, "no tool result: the body never ran");
}

/// An agent run's state, folded from its facts on the log.
pub(crate) fn agent_state(db: &Path, run_id: &str) -> agent::AgentState {
    let reader = store::Reader::open(db).expect("opens");
    let history = reader.history(&engine::event::RunId::new(run_id)).expect("reads").expect("the run");
    let facts: Vec<agent::AgentEvent> = history
        .agent_entries
        .into_iter()
        .map(|entry| serde_json::from_value(entry).expect("an agent fact decodes"))
        .collect();
    agent::AgentState::from_events(&facts)
}

/// A run's stored input.
pub(crate) fn run_input(db: &Path, run_id: &str) -> Value {
    let reader = store::Reader::open(db).expect("opens");
    reader.history(&engine::event::RunId::new(run_id)).expect("reads").expect("the run").input
}

#[test]
fn usage_errors_exit_64_with_a_message() {
    let (_dir, db) = temp();
    let cases: [&[&str]; 4] = [
        &["agent", "run", "ticket-review", "--scenario", "nope"],
        &["agent", "run", "ticket-review", "--transcript", "/nonexistent/transcript.json"],
        &["agent", "run", "ticket-review", "--scenario", "complete", "--limits", "{not json"],
        &["agent", "run", "ticket-review", "--scenario", "complete", "--limits", r#"{"model_call_max": 1}"#],
    ];
    for args in cases {
        let (exit, report) = keel(&db, args, &[]);
        assert_eq!(exit, 64, "{args:?}");
        assert_eq!(report["status"], "usage_error", "{args:?}");
        assert!(!report["error"].as_str().unwrap_or_default().is_empty(), "{args:?}: a clear message");
    }
}

#[test]
fn a_transcript_file_with_limits_and_capabilities_runs_as_given() {
    let (_dir, db) = temp();
    let transcript = fixture("agent/ticket-review/complete.json");
    let args = ["agent", "run", "ticket-review", "--transcript", &transcript, "--limits", r#"{"tool_calls_max": 1}"#];
    let (exit, report) = keel(&db, &args, &[]);
    assert_eq!((exit, report["status"].as_str()), (2, Some("tool_budget")), "{report}");
    assert_eq!(report["tool_calls"], 1);
    let args = ["agent", "run", "ticket-review", "--transcript", &transcript, "--capabilities", "review.finish"];
    let (exit, report) = keel(&db, &args, &[]);
    assert_eq!((exit, report["status"].as_str()), (2, Some("permission_denied")), "{report}");
}

/// Model answers recorded in the log, in order, by their response id.
pub(crate) fn recorded_answers(db: &Path, run_id: &str) -> Vec<String> {
    agent_state(db, run_id).turns.iter().map(|turn| turn.response.id.clone().unwrap_or_default()).collect()
}

#[test]
fn a_run_killed_at_its_fourth_model_call_resumes_with_one_tool_call_left_and_no_answer_requested_twice() {
    let (_dir, db) = temp();
    let transcript = fixture("agent/ticket-review/changing.json");
    let args = ["agent", "run", "ticket-review", "--transcript", &transcript];
    let (exit, _) = keel(&db, &args, &[("KEEL_TEST_ABORT_AT_MODEL_CALL", "4")]);
    assert_ne!(exit, 0, "the process died");
    let reader = store::Reader::open(&db).expect("opens");
    let runs = reader.runs().expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status.as_str(), "running", "killed: no RunFinished");
    let run_id = runs[0].run_id.clone();
    let before = recorded_answers(&db, &run_id);
    assert_eq!(before.len(), 3, "three answers recorded before the death");

    let (exit, report) = keel(&db, &["agent", "resume", &run_id], &[]);
    assert_eq!(exit, 2, "{report}");
    assert_eq!(report["status"], "tool_budget");
    assert_eq!(report["tool_calls"], 4, "exactly one more tool call under the limit of four");
    assert_eq!(report["model_calls"], 6, "the call reserved before the death stays counted");
    let after = recorded_answers(&db, &run_id);
    assert_eq!(after[..3], before[..], "recorded answers are kept");
    let mut distinct = after.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), after.len(), "no recorded answer was requested again: {after:?}");
    let (exit, report) = keel(&db, &["verify"], &[]);
    assert_eq!(exit, 0, "{report}");
}

/// Seed 002 through the real binary and a real simulator process: three identical refunds of
/// 89.90 on an order charged 89.90 wait for `keel approve`, then make exactly one refund.
#[test]
fn support_refunds_wait_for_keel_approve_and_reach_the_provider_once() {
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    let url = sim.url();
    let charge = crate::approvals::support_order_charge("charge-C-1042-000001");
    let charge: Vec<&str> = ["--provider", url].into_iter().chain(charge.iter().map(String::as_str)).collect();
    assert_eq!(keel(&db, &charge, &[]).0, 0, "the order is charged first");
    let (exit, report) = keel(&db, &["--provider", url, "agent", "run", "support", "--scenario", "repeat"], &[]);
    assert_eq!(exit, 2, "{report}");
    assert_eq!(report["status"], "awaiting_approval");
    let key = report["awaiting_approval"].as_str().expect("the intent key to approve").to_owned();
    let run_id = report["run_id"].as_str().expect("a run id").to_owned();
    let refunds = || {
        provider_sim::list_effects(&dir.path().join("sim.db"))
            .expect("the simulator's effects list")
            .into_iter()
            .filter(|e| e.id.starts_with("re_"))
            .count()
    };
    assert_eq!(refunds(), 0, "nothing is refunded before the approval");
    let (exit, approved) = keel(&db, &["approve", &key, "--by", "ana"], &[]);
    assert_eq!(exit, 0, "{approved}");
    let (exit, report) = keel(&db, &["--provider", url, "agent", "resume", &run_id], &[]);
    assert_eq!(exit, 0, "{report}");
    assert_eq!(report["status"], "completed");
    assert_eq!(refunds(), 1, "three identical calls, one refund at the provider");
    let (exit, report) = keel(&db, &["verify"], &[]);
    assert_eq!(exit, 0, "verify passes on a log holding the agent's intents: {report}");
}

/// Seed 002's agent runs any transcript (a conversation captured from a real model), against
/// the refund scenario's ticket and order: the same guard, approval and single refund, and a
/// resume rebuilds it from the recorded transcript path.
#[test]
fn support_runs_a_transcript_file_against_the_default_ticket() {
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    let url = sim.url();
    let charge = crate::approvals::support_order_charge("charge-C-1042-000002");
    let charge: Vec<&str> = ["--provider", url].into_iter().chain(charge.iter().map(String::as_str)).collect();
    assert_eq!(keel(&db, &charge, &[]).0, 0, "the order is charged first");
    let captured = dir.path().join("captured.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/agent/support/refund.json");
    std::fs::copy(fixture, &captured).expect("the transcript is copied");
    let path = captured.to_str().expect("utf-8");
    let (exit, report) = keel(&db, &["--provider", url, "agent", "run", "support", "--transcript", path], &[]);
    assert_eq!((exit, report["status"].as_str()), (2, Some("awaiting_approval")), "{report}");
    let key = report["awaiting_approval"].as_str().expect("the intent key to approve").to_owned();
    let run_id = report["run_id"].as_str().expect("a run id").to_owned();
    assert_eq!(keel(&db, &["approve", &key, "--by", "ana"], &[]).0, 0);
    let (exit, report) = keel(&db, &["--provider", url, "agent", "resume", &run_id], &[]);
    assert_eq!((exit, report["status"].as_str()), (0, Some("completed")), "{report}");
    let refunds = provider_sim::list_effects(&dir.path().join("sim.db"))
        .expect("the simulator's effects list")
        .into_iter()
        .filter(|e| e.id.starts_with("re_"))
        .count();
    assert_eq!(refunds, 1);
    // A transcript and a scenario at once is refused before anything is written.
    let (exit, _) =
        keel(&db, &["--provider", url, "agent", "run", "support", "--transcript", path, "--scenario", "refund"], &[]);
    assert_eq!(exit, 64);
}

/// Seed 002, exactly: every irreversible refund waits for a human by default, whatever its
/// amount (1.00 here, under the old 5.00 threshold); only the operator's policy changes that,
/// and the run records the threshold and the policy it ran under.
#[test]
fn every_support_refund_waits_for_a_human_unless_the_policy_says_otherwise() {
    let (dir, db) = temp();
    let sim = crate::cli::start_sim(dir.path(), None);
    let url = sim.url();
    let tenant = workflows::support_agent::TENANT;
    let charge = crate::approvals::support_order_charge("charge-C-1042-000003");
    let charge: Vec<&str> = ["--provider", url].into_iter().chain(charge.iter().map(String::as_str)).collect();
    assert_eq!(keel(&db, &charge, &[]).0, 0, "the order is charged first");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/agent/support/refund.json");
    let small = std::fs::read_to_string(fixture)
        .expect("the fixture")
        .replace("\"amount_minor\": 8990", "\"amount_minor\": 100");
    let transcript = dir.path().join("small.json");
    std::fs::write(&transcript, small).expect("written");
    let transcript = transcript.to_str().expect("utf-8");
    let run = |extra: &[&str]| {
        let mut args = vec!["--provider", url];
        args.extend_from_slice(extra);
        args.extend(["agent", "run", "support", "--transcript", transcript]);
        keel(&db, &args, &[])
    };
    let (exit, report) = run(&[]);
    assert_eq!((exit, report["status"].as_str()), (2, Some("awaiting_approval")), "by default: {report}");
    // What the human sees before saying yes: the amount, the order, what was refunded, and the
    // ticket's raw text marked untrusted.
    let approval = &report["approval"];
    assert_eq!((approval["amount_minor"].as_i64(), approval["order_id"].as_str()), (Some(100), Some("C-1042")));
    assert_eq!(
        (approval["already_refunded_minor"].as_i64(), approval["pending_refunds_minor"].as_i64()),
        (Some(0), Some(0))
    );
    assert_eq!(approval["ticket"]["untrusted"], true, "{approval}");
    assert!(approval["ticket"]["text"].as_str().is_some_and(|t| t.contains("arrived damaged")), "{approval}");
    let limits = crate::policy::run_limits(&db, report["run_id"].as_str().expect("a run id"));
    assert_eq!(limits.approval_threshold_minor, Some(0), "recorded: every refund");
    assert_eq!(limits.policy.map(|p| p.version).as_deref(), Some("builtin"));

    // The operator lets small refunds through, for this desk's tenant only.
    let policy = dir.path().join("policy.toml");
    let text =
        format!("version = \"desk-1\"\n[tenants.\"{tenant}\".operations.refund]\napproval_threshold_minor = 500\n");
    std::fs::write(&policy, text).expect("written");
    let (exit, report) = run(&["--policy", policy.to_str().expect("utf-8")]);
    // A new run refunds under its own key, below the policy's threshold: no approval.
    assert_eq!((exit, report["status"].as_str()), (0, Some("completed")), "{report}");
    let limits = crate::policy::run_limits(&db, report["run_id"].as_str().expect("a run id"));
    assert_eq!(limits.approval_threshold_minor, Some(500), "{exit} {report}");
    assert_eq!(limits.policy.map(|p| p.version).as_deref(), Some("desk-1"));

    // The next approval shows what the order already holds: 1.00 refunded, 1.00 pending.
    let (_, report) = run(&[]);
    let approval = &report["approval"];
    assert_eq!(
        (approval["already_refunded_minor"].as_i64(), approval["pending_refunds_minor"].as_i64()),
        (Some(100), Some(100)),
        "{report}"
    );
}

// ----- live model APIs (`--model-api`) against a local server -----------------------------------

pub(crate) const KEY: &str = "sk-keel-live-test-4f9c2e71-never-stored";

/// A local model API on 127.0.0.1: answers its fixture responses in order, on the route and
/// with the authentication of one API, and 401 to a request without the right key.
pub(crate) struct ModelServer {
    pub(crate) base_url: String,
    served: Served,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Clone)]
struct Served {
    openai: bool,
    answers: Arc<Mutex<VecDeque<Value>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn answer(State(served): State<Served>, headers: HeaderMap, body: String) -> (StatusCode, String) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authenticated = if served.openai {
        header("authorization") == Some(format!("Bearer {KEY}"))
    } else {
        header("x-api-key").as_deref() == Some(KEY) && header("anthropic-version").is_some()
    };
    if !authenticated {
        return (StatusCode::UNAUTHORIZED, r#"{"error":"invalid api key"}"#.into());
    }
    served.requests.lock().expect("test mutex").push(serde_json::from_str(&body).unwrap_or(Value::Null));
    match served.answers.lock().expect("test mutex").pop_front() {
        Some(response) => (StatusCode::OK, response.to_string()),
        None => (StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":"no more answers"}"#.into()),
    }
}

impl ModelServer {
    pub(crate) fn start(openai: bool, transcript: &str) -> Self {
        let text = std::fs::read_to_string(fixture(transcript)).expect("the fixture");
        let answers: VecDeque<Value> = serde_json::from_str(&text).expect("a JSON array");
        let served = Served { openai, answers: Arc::new(Mutex::new(answers)), requests: Arc::default() };
        let path = if openai { "/v1/chat/completions" } else { "/v1/messages" };
        let app = Router::new().route(path, post(answer)).with_state(served.clone());
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("binds a loopback port");
        let addr = listener.local_addr().expect("an address");
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self { base_url: format!("http://{addr}"), served, _runtime: runtime }
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        self.served.requests.lock().expect("test mutex").clone()
    }
}

/// Every file of the database (main, WAL, shared memory) as bytes.
pub(crate) fn database_bytes(db: &Path) -> Vec<u8> {
    let dir = db.parent().expect("a parent");
    let name = db.file_name().expect("a name").to_string_lossy().into_owned();
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the dir") {
        let path = entry.expect("an entry").path();
        if path.file_name().is_some_and(|f| f.to_string_lossy().starts_with(&name)) {
            bytes.extend(std::fs::read(&path).expect("readable"));
        }
    }
    assert!(!bytes.is_empty(), "the database exists");
    bytes
}

fn assert_key_absent(what: &str, text: &[u8]) {
    let key = KEY.as_bytes();
    assert!(!text.windows(key.len()).any(|w| w == key), "the API key leaked into {what}");
}

fn live_complete(api: &str, key_var: &str, transcript: &str) {
    let server = ModelServer::start(api == "openai", transcript);
    let (_dir, db) = temp();
    let args =
        ["agent", "run", "ticket-review", "--model-api", api, "--model", "m", "--model-base-url", &server.base_url];
    let (exit, stdout, stderr) = keel_raw(&db, &args, &[(key_var, KEY)]);
    let report: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert_eq!(exit, 0, "{api}: {stdout} {stderr}");
    assert_eq!(report["status"], "completed", "{api}");
    assert_eq!(report["model_calls"], 3, "{api}");
    assert_eq!(report["tool_calls"], 2, "{api}");
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{api}: one authenticated request per model call");
    assert!(requests.iter().all(|r| r["model"] == "m"), "{api}: the model name is sent");
    let run_id = report["run_id"].as_str().expect("a run id");
    let input = run_input(&db, run_id);
    assert_eq!(input["transport"], "http", "{api}");
    assert_eq!(input["api"], api);
    assert_eq!(input["model"], "m");
    assert_eq!(input["base_url"], server.base_url.as_str());
    assert_key_absent("stdout", stdout.as_bytes());
    assert_key_absent("stderr", stderr.as_bytes());
    assert_key_absent("the database", &database_bytes(&db));
    let (exit, report) = keel(&db, &["verify"], &[]);
    assert_eq!(exit, 0, "{report}");
}

#[test]
fn a_live_anthropic_run_completes_against_the_messages_api() {
    live_complete("anthropic", "ANTHROPIC_API_KEY", "agent/ticket-review/complete.json");
}

#[test]
fn a_live_openai_run_completes_against_chat_completions() {
    live_complete("openai", "OPENAI_API_KEY", "agent/ticket-review/complete-openai.json");
}

#[test]
fn a_live_run_without_its_key_is_a_usage_error_that_writes_nothing() {
    let (_dir, db) = temp();
    for (api, var) in [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")] {
        let args = ["agent", "run", "ticket-review", "--model-api", api, "--model", "m"];
        let (exit, report) = keel(&db, &args, &[]);
        assert_eq!(exit, 64, "{api}: {report}");
        assert_eq!(report["status"], "usage_error");
        assert!(report["error"].as_str().is_some_and(|e| e.contains(var)), "{api}: names {var}: {report}");
        assert!(!db.exists(), "{api}: nothing is written");
    }
    // One source of answers, exactly (clap refuses the rest).
    let cases: [&[&str]; 4] = [
        &["agent", "run", "ticket-review"],
        &["agent", "run", "ticket-review", "--scenario", "complete", "--model-api", "anthropic", "--model", "m"],
        &["agent", "run", "ticket-review", "--scenario", "complete", "--model", "m"],
        &["agent", "run", "ticket-review", "--model-api", "anthropic"],
    ];
    for args in cases {
        assert_eq!(keel(&db, args, &[("ANTHROPIC_API_KEY", KEY)]).0, 64, "{args:?}");
    }
    assert!(!db.exists(), "nothing is written");
}

#[test]
fn a_live_run_with_a_wrong_key_stops_and_never_shows_either_key() {
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
    let wrong = "sk-keel-wrong-key-0000";
    let (exit, stdout, stderr) = keel_raw(&db, &args, &[("ANTHROPIC_API_KEY", wrong)]);
    assert_eq!(exit, 2, "{stdout} {stderr}");
    assert!(server.requests().is_empty(), "the server refused every request");
    for text in [&stdout, &stderr] {
        assert!(!text.contains(wrong) && !text.contains(KEY), "{text}");
    }
}

#[test]
fn a_live_run_killed_mid_run_resumes_with_the_same_client_and_no_answer_requested_twice() {
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
    let env = [("ANTHROPIC_API_KEY", KEY), ("KEEL_TEST_ABORT_AT_MODEL_CALL", "2")];
    let (exit, _, _) = keel_raw(&db, &args, &env);
    assert_ne!(exit, 0, "the process died");
    assert_eq!(server.requests().len(), 1, "one answer requested before the death");
    let run_id = store::Reader::open(&db).expect("opens").runs().expect("runs")[0].run_id.clone();

    let (exit, report) = keel(&db, &["agent", "resume", &run_id], &[]);
    assert_eq!(exit, 64, "resume needs the key again: {report}");
    assert!(report["error"].as_str().is_some_and(|e| e.contains("ANTHROPIC_API_KEY")), "{report}");

    let (exit, stdout, stderr) = keel_raw(&db, &["agent", "resume", &run_id], &[("ANTHROPIC_API_KEY", KEY)]);
    let report: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert_eq!(exit, 0, "{stdout} {stderr}");
    assert_eq!(report["status"], "completed");
    assert_eq!(report["tool_calls"], 2);
    assert_eq!(report["model_calls"], 4, "the call reserved before the death stays counted");
    assert_eq!(server.requests().len(), 3, "the recorded answer was not requested again");
    assert_eq!(recorded_answers(&db, &run_id).len(), 3);
    assert_key_absent("stdout", stdout.as_bytes());
    assert_key_absent("stderr", stderr.as_bytes());
    assert_key_absent("the database", &database_bytes(&db));
}
