//! `keel agent run` and `keel agent resume`: the bounded agent harness on the event log.
//!
//! Owns the translation between flags and an agent run: which workflow, which transcript
//! (a named scenario, embedded in the binary, or a file), which limits and grants; the
//! journal (`agent::LogJournal` over the store, so every fact is on `run:<id>`); the
//! provider and the intent gate for the support agent's refunds; the real timer; ctrl-c wired to `Cancellation::cancel`; the rendering and the exit code. It
//! never decides a guard step or a budget (the engine does) and never touches SQL.
//!
//! # Transcripts
//!
//! Scenario transcripts are embedded with `include_str!` from `fixtures/agent/…`, so an
//! installed binary runs them without the repository. The run's stored input names the
//! scenario or the transcript file, which is how `keel agent resume` finds the same script.
//!
//! # Live models
//!
//! `--model-api anthropic|openai --model NAME [--model-base-url URL]` runs against the real
//! HTTP API instead ([`adapters::model::anthropic::AnthropicClient`],
//! [`adapters::model::openai::OpenAiClient`]). The key is read here, from `ANTHROPIC_API_KEY`
//! or `OPENAI_API_KEY`, on every `run` and `resume`, and goes straight into a
//! [`engine::provider::Secret`]: it is never printed, logged or stored. The run's input
//! records the API, the model and the base URL, so `keel agent resume` rebuilds the same
//! client; answers already journaled are never requested again (the loop replays them).
//!
//! # Test facility
//!
//! `KEEL_TEST_ABORT_AT_MODEL_CALL=N` makes this process call `std::process::abort()` when
//! the transport is asked for its Nth answer in this process (after the call's reservation
//! is durable): the crash tests kill a run at a precise point with a real process death.
//! `KEEL_TEST_ABORT_AFTER_MODEL_ANSWER=N` aborts once the transport has returned its Nth
//! answer, before it is recorded: an answer the vendor billed and the run never saw.

use crate::output::{Failure, Outcome, Output, plural};
use crate::wiring::{SystemClock, open_store};
use crate::{AgentCommand, exit};
use adapters::model::anthropic::AnthropicClient;
use adapters::model::http::{BaseUrl, HttpConfig};
use adapters::model::openai::OpenAiClient;
use adapters::model::scripted::{ScriptedTransport, Transcript};
use adapters::model::{BoxTransport, TokioTimer};
use agent::IntentGate;
use agent::{
    AgentEnv, AgentEvent, AgentJournal, AgentLimits, AgentState, AgentStatus, Cancellation, LogJournal, ModelRequest,
    ModelResponse, ModelTransport, NewRun, RunOutcome, TransportError,
};
use engine::clock::Clock;
use engine::event::{Cause, RunId, RunLimits, RunVersions};
use engine::log::{Ask, Asking, EventLog};
use engine::provider::{BoxFuture, Secret};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use workflows::support_agent;
use workflows::ticket_review::{self, Scenario};

/// The env var of the crash test facility (see the module docs).
pub const ABORT_AT_MODEL_CALL: &str = "KEEL_TEST_ABORT_AT_MODEL_CALL";
/// The env var of the lost-answer test facility (see the module docs).
pub const ABORT_AFTER_MODEL_ANSWER: &str = "KEEL_TEST_ABORT_AFTER_MODEL_ANSWER";

/// The embedded transcript of a ticket-review scenario.
fn scenario_transcript(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Complete => include_str!("../fixtures/agent/ticket-review/complete.json"),
        Scenario::Incomplete => include_str!("../fixtures/agent/ticket-review/incomplete.json"),
        Scenario::Forbidden => include_str!("../fixtures/agent/ticket-review/forbidden.json"),
        Scenario::Repeat => include_str!("../fixtures/agent/ticket-review/repeat.json"),
        Scenario::Changing => include_str!("../fixtures/agent/ticket-review/changing.json"),
        Scenario::Budget => include_str!("../fixtures/agent/ticket-review/budget.json"),
        Scenario::Deadline => include_str!("../fixtures/agent/ticket-review/deadline.json"),
        Scenario::Unavailable => include_str!("../fixtures/agent/ticket-review/unavailable.json"),
    }
}

/// The embedded transcript of a support scenario.
fn support_transcript(scenario: support_agent::Scenario) -> &'static str {
    use support_agent::Scenario as S;
    match scenario {
        S::Refund => include_str!("../fixtures/agent/support/refund.json"),
        S::Injection => include_str!("../fixtures/agent/support/injection.json"),
        S::Repeat => include_str!("../fixtures/agent/support/repeat.json"),
        S::ApprovalBound => include_str!("../fixtures/agent/support/approval-bound.json"),
        S::Delegate => include_str!("../fixtures/agent/support/delegate.json"),
    }
}

/// A live model API: which one, its model, where it is. Never the key.
#[derive(Clone, Debug)]
struct LiveModel {
    api: ModelApi,
    model: String,
    base_url: BaseUrl,
}

/// The model APIs `keel agent run --model-api` speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelApi {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Chat Completions.
    Openai,
}

impl ModelApi {
    /// Parses the `--model-api` value (and the name stored in a run's input).
    fn parse(name: &str) -> Option<Self> {
        match name {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::Openai),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
        }
    }

    /// The environment variable holding the key.
    fn key_var(self) -> &'static str {
        match self {
            Self::Anthropic => "ANTHROPIC_API_KEY",
            Self::Openai => "OPENAI_API_KEY",
        }
    }

    fn default_base_url(self) -> &'static str {
        match self {
            Self::Anthropic => "https://api.anthropic.com",
            Self::Openai => "https://api.openai.com",
        }
    }

    fn wire(self) -> &'static str {
        match self {
            Self::Anthropic => "Anthropic Messages",
            Self::Openai => "OpenAI Chat Completions",
        }
    }
}

/// Where a run's model answers come from, as stored in its `RunStarted` input.
#[derive(Clone, Debug)]
enum Script {
    Scenario(Scenario),
    /// A support run: the ticket and order of `case` (or of `ticket`, a ticket file's, stored
    /// whole in the run's input), the answers of its own transcript or of `transcript` (a
    /// captured conversation replayed against the agent).
    Support {
        case: support_agent::Scenario,
        transcript: Option<PathBuf>,
        ticket: Option<Box<support_agent::Case>>,
    },
    File(PathBuf),
    Live(LiveModel),
}

/// A script made ready to run: a transcript, or a live client's configuration (with its key).
enum Source {
    Transcript(Transcript),
    Http(ModelApi, HttpConfig),
}

impl Script {
    fn input(&self) -> Value {
        match self {
            Self::Scenario(s) => json!({"transport": "scripted", "scenario": s.name()}),
            Self::Support { case, transcript, ticket } => {
                let mut input = match transcript {
                    None => json!({"transport": "scripted", "scenario": case.name()}),
                    Some(path) => {
                        json!({"transport": "scripted", "transcript": path.display().to_string(), "case": case.name()})
                    }
                };
                if let Some(ticket) = ticket {
                    input["ticket"] = json!(ticket);
                }
                input
            }
            Self::File(path) => json!({"transport": "scripted", "transcript": path.display().to_string()}),
            Self::Live(live) => {
                json!({"transport": "http", "api": live.api.name(), "model": live.model, "base_url": live.base_url.as_str()})
            }
        }
    }

    /// The versions a new run records: this build, and the model that answers (`scripted`
    /// for a replayed transcript). The prompt's version is the journal's; no policy is
    /// versioned yet.
    fn versions(&self) -> RunVersions {
        let model = match self {
            Self::Live(live) => live.model.clone(),
            Self::Scenario(_) | Self::Support { .. } | Self::File(_) => "scripted".to_owned(),
        };
        RunVersions { model: Some(model), ..RunVersions::this_release() }
    }

    fn from_input(workflow: &str, input: &Value) -> Result<Self, String> {
        if input.get("transport").and_then(Value::as_str) == Some("http") {
            let field = |name: &str| input.get(name).and_then(Value::as_str);
            let api = field("api").and_then(ModelApi::parse).ok_or("the run's input names no known model API")?;
            let (Some(model), Some(base_url)) = (field("model"), field("base_url")) else {
                return Err("the run's input lacks the model or its base URL".into());
            };
            let base_url = BaseUrl::parse(base_url).map_err(|e| format!("the run's base URL: {e}"))?;
            return Ok(Self::Live(LiveModel { api, model: model.to_owned(), base_url }));
        }
        let transcript = input.get("transcript").and_then(Value::as_str).map(PathBuf::from);
        let ticket = match input.get("ticket") {
            Some(ticket) => Some(Box::new(
                serde_json::from_value(ticket.clone()).map_err(|e| format!("the run's stored ticket: {e}"))?,
            )),
            None => None,
        };
        if workflow == support_agent::WORKFLOW && transcript.is_some() {
            let name = input.get("case").and_then(Value::as_str).unwrap_or_default();
            let case = support_agent::Scenario::parse(name).ok_or_else(|| format!("unknown support case {name:?}"))?;
            return Ok(Self::Support { case, transcript, ticket });
        }
        if let Some(name) = input.get("scenario").and_then(Value::as_str) {
            let script = if workflow == support_agent::WORKFLOW {
                support_agent::Scenario::parse(name).map(|case| Self::Support { case, transcript: None, ticket })
            } else {
                Scenario::parse(name).map(Self::Scenario)
            };
            return script.ok_or_else(|| format!("unknown scenario {name:?}"));
        }
        match input.get("transcript").and_then(Value::as_str) {
            Some(path) => Ok(Self::File(PathBuf::from(path))),
            None => Err("the run's input names neither a scenario nor a transcript".into()),
        }
    }

    /// Reads the transcript, or the live API's key from the environment (`keel` reads it
    /// here and nowhere else).
    fn load(&self) -> Result<Source, String> {
        let parsed = match self {
            Self::Scenario(s) => Transcript::parse(scenario_transcript(*s)),
            Self::Support { case, transcript: None, .. } => Transcript::parse(support_transcript(*case)),
            Self::Support { transcript: Some(path), .. } => Transcript::from_file(path),
            Self::File(path) => Transcript::from_file(path),
            Self::Live(live) => {
                let var = live.api.key_var();
                let key = std::env::var(var).ok().filter(|k| !k.trim().is_empty()).ok_or_else(|| {
                    format!("--model-api {} needs its API key in the environment: set {var}", live.api.name())
                })?;
                let config = HttpConfig::new(live.base_url.clone(), live.model.clone(), Secret::new(key));
                return Ok(Source::Http(live.api, config));
            }
        };
        parsed.map(Source::Transcript).map_err(|e| e.to_string())
    }

    /// The ticket and order a support run acts on: its ticket file's, or its scenario's.
    fn case(&self) -> Option<support_agent::Case> {
        match self {
            Self::Support { ticket: Some(ticket), .. } => Some((**ticket).clone()),
            Self::Support { case, ticket: None, .. } => Some(case.case()),
            Self::Scenario(_) | Self::File(_) | Self::Live(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Scenario(s) => format!("scripted (scenario {}, embedded transcript)", s.name()),
            Self::Support { case, transcript: None, ticket: None } => {
                format!("scripted (scenario {}, embedded transcript)", case.name())
            }
            Self::Support { case, transcript: None, ticket: Some(ticket) } => {
                format!("scripted (scenario {}, embedded transcript; ticket {})", case.name(), ticket.id)
            }
            Self::Support { case, transcript: Some(path), ticket } => {
                let of =
                    ticket.as_ref().map_or(format!("scenario {}'s", case.name()), |t| format!("ticket {}'s", t.id));
                format!("scripted (transcript {}, {of} ticket and order)", path.display())
            }
            Self::File(path) => format!("scripted (transcript {})", path.display()),
            Self::Live(live) => {
                format!("http ({} API at {}, model {})", live.api.wire(), live.base_url, live.model)
            }
        }
    }
}

/// A transport that aborts the process at its Nth call, or after its Nth answer (the
/// crash-test facilities).
struct AbortAt {
    inner: BoxTransport,
    at: Option<u32>,
    after_answer: Option<u32>,
    calls: AtomicU32,
}

impl ModelTransport for AbortAt {
    fn complete<'a>(&'a self, request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.at == Some(call) {
            errln!("keel: {ABORT_AT_MODEL_CALL}={call}: aborting the process (test facility)");
            std::process::abort();
        }
        Box::pin(async move {
            let answer = self.inner.complete(request).await;
            if self.after_answer == Some(call) {
                errln!("keel: {ABORT_AFTER_MODEL_ANSWER}={call}: aborting the process (test facility)");
                std::process::abort();
            }
            answer
        })
    }

    fn script_fingerprint(&self) -> Option<String> {
        self.inner.script_fingerprint()
    }
}

/// Everything a run needs, resolved from flags (new run) or from the log (resume).
struct Plan {
    run_id: RunId,
    workflow: String,
    script: Script,
    limits: AgentLimits,
    capabilities: BTreeSet<String>,
    /// The spine's limits: the ones a resumed run recorded when it started; for a new run,
    /// the policy's (support: every refund waits for a human unless the policy says
    /// otherwise) or the defaults.
    spine: RunLimits,
    /// A new support run's request, with its ticket's facts; a resumed run's is its start's.
    prompt: String,
    /// The operator's policy in force, which the support agent's refunds are reserved under:
    /// loaded by `keel agent run|resume`; `None` under `keel resume`/`keel worker`, whose
    /// refunds then lower nothing (an irreversible refund waits for a human).
    policy: Option<engine::policy::InForce>,
}

/// `keel agent …`.
pub async fn dispatch(
    db: &Path,
    durability: store::Durability,
    provider: &crate::ProviderArgs,
    policy: &crate::policy::PolicyArgs,
    out: &Output,
    command: AgentCommand,
) -> Outcome {
    let (mut plan, resuming) = match command {
        AgentCommand::Run { workflow, scenario, transcript, ticket, model, limits, capabilities, .. } => {
            let sources =
                Sources { scenario: scenario.as_deref(), transcript: transcript.as_deref(), ticket: ticket.as_deref() };
            let mut plan = plan_new(&workflow, sources, &model, limits.as_deref(), capabilities.as_deref())
                .map_err(Failure::Usage)?;
            if let Some(case) = plan.script.case() {
                plan.prompt = support_agent::prompt(&ticket_facts(db, &case)?);
            }
            (plan, false)
        }
        AgentCommand::Resume { run_id, .. } => (plan_resume(db, &RunId::new(run_id))?, true),
    };
    if matches!(plan.script, Script::Support { .. }) {
        // Every refund waits for a human unless the operator's policy says otherwise: its
        // threshold, or its lowering of the irreversible default for refunds.
        let loaded = policy.load().map_err(Failure::Usage)?;
        if !resuming {
            let rules = loaded.policy.rules(support_agent::TENANT, engine::provider::EffectKind::Refund);
            let approval =
                support_agent::RefundApproval::of(rules.approval_threshold_minor, rules.irreversible_without_approval);
            plan.spine = RunLimits { policy: Some(loaded.stamp.clone()), ..support_agent::spine_limits(approval) };
        }
        plan.policy = Some(loaded.in_force());
    }
    // Before anything is opened: a missing key or transcript writes nothing.
    let source = plan.script.load().map_err(Failure::Usage)?;
    // The support agent's refunds go through the provider; ticket review needs none.
    if matches!(plan.script, Script::Support { .. }) {
        crate::required_provider(provider, "the support agent's refunds")?;
    }
    // First, so a run killed at any later point can be found (`keel runs`, `keel resume`).
    errln!("keel: agent run {} {} ({})", plan.run_id, if resuming { "resuming" } else { "started" }, plan.workflow);
    match drive(db, durability, provider, &plan, source, Mode::Interactive { resuming }).await? {
        Driven::Busy(refused) => Err(Failure::Refused(refused)),
        Driven::Ended { outcome, interrupted } => {
            let approval = match &outcome.awaiting_approval {
                Some(key) => approval_context(db, &plan, key)?,
                None => None,
            };
            print_outcome(out, &plan, &outcome, approval.as_ref());
            Ok(exit_code(&outcome, interrupted))
        }
    }
}

/// The exit code of an agent run's outcome: ctrl-c's `cancelled` is an interruption (130),
/// an operator's `keel run cancel` a controlled stop (2).
fn exit_code(outcome: &RunOutcome, interrupted: bool) -> u8 {
    if outcome.status == AgentStatus::Cancelled && !interrupted {
        return exit::CONTROLLED;
    }
    u8::try_from(outcome.exit_code()).unwrap_or(exit::INTERNAL)
}

/// The plan of an existing agent run, from its log: its workflow, script, limits and grants.
fn plan_resume(db: &Path, run_id: &RunId) -> Result<Plan, Failure> {
    let reader = store::Reader::open(db)
        .map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))?;
    let Some(history) = reader.history(run_id)?.filter(|h| h.run.is_agent()) else {
        return Err(Failure::NotFound(format!("no agent run {run_id} in this log")));
    };
    let workflow = history.run.workflow.trim_start_matches(engine::ledger::AGENT_WORKFLOW_PREFIX).to_owned();
    let script =
        Script::from_input(&workflow, &history.input).map_err(|m| Failure::Usage(format!("run {run_id}: {m}")))?;
    let facts: Result<Vec<AgentEvent>, _> = history.agent_entries.into_iter().map(serde_json::from_value).collect();
    let facts = facts.map_err(|e| Failure::Internal(format!("run {run_id}: its agent facts do not decode: {e}")))?;
    let state = AgentState::from_events(&facts);
    let Some(header) = state.header.as_ref() else {
        return Err(Failure::Usage(format!("run {run_id} never started its agent loop")));
    };
    Ok(Plan {
        limits: header.limits.clone(),
        capabilities: header.capabilities.clone(),
        run_id: run_id.clone(),
        workflow,
        script,
        spine: history.run.limits.clone(),
        prompt: header.prompt.clone(),
        policy: None,
    })
}

/// How a run is driven: by `keel agent run|resume` (ctrl-c and SIGTERM its own, waiting for
/// another live holder), or by `keel resume` (one run among others: a run held live
/// elsewhere is left to its holder).
#[derive(Clone, Copy)]
enum Mode {
    Interactive { resuming: bool },
    Recovery,
}

/// What driving a run came to.
enum Driven {
    /// Another live process holds the run: who.
    Busy(String),
    /// The run stopped or suspended; `interrupted` when ctrl-c stopped it.
    Ended { outcome: RunOutcome, interrupted: bool },
}

/// Opens the log, takes the run (when resuming), and drives it to its stop or suspension.
async fn drive(
    db: &Path,
    durability: store::Durability,
    provider: &crate::ProviderArgs,
    plan: &Plan,
    source: Source,
    mode: Mode,
) -> Result<Driven, Failure> {
    let (node, gate) = match plan.script {
        Script::Support { .. } => {
            let node = crate::wiring::Node::open(db, durability, provider, None)?;
            let mut gate = IntentGate::new(node.executor.runtime().clone(), Cause::command("agent"));
            if let Some(policy) = &plan.policy {
                gate = gate.under_policy(policy.clone());
            }
            (node, Some(Arc::new(gate)))
        }
        Script::Scenario(_) | Script::File(_) | Script::Live(_) => {
            let store = open_store(db, durability)?;
            let log: Arc<dyn EventLog> = Arc::new(store.clone());
            (crate::wiring::Node::without_provider(store, log), None)
        }
    };
    let log: Arc<dyn EventLog> = Arc::new(node.store.clone());
    let lessee = crate::wiring::lessee();
    let cause = Cause::command("agent");
    if !matches!(mode, Mode::Interactive { resuming: false }) {
        // One process acts for a run at a time: take its lease (refused while another
        // process holds it live), then recover what the run had in flight — an attempt its
        // dead owner sent becomes unknown and is reconciled before the run goes on.
        let patient = matches!(mode, Mode::Interactive { .. });
        if let Err(refused) = claim_and_recover(&*log, &lessee, &cause, &plan.run_id, patient).await {
            node.shutdown()?;
            return Ok(Driven::Busy(refused));
        }
    }
    let mut versions = plan.script.versions();
    versions.policy = plan.spine.policy.as_ref().map(|stamp| stamp.version.clone());
    let start = NewRun { input: plan.script.input(), limits: plan.spine.clone(), versions };
    let journal = LogJournal::new(Arc::clone(&log), plan.run_id.clone(), cause.clone(), Some(start), lessee.clone());
    let recorded = AgentState::from_events(&journal.load().await.map_err(|e| Failure::Internal(e.to_string()))?);
    let abort_at = std::env::var(ABORT_AT_MODEL_CALL).ok().and_then(|v| v.parse().ok());
    let after_answer = std::env::var(ABORT_AFTER_MODEL_ANSWER).ok().and_then(|v| v.parse().ok());
    let inner: BoxTransport = match source {
        Source::Transcript(transcript) => Box::new(ScriptedTransport::new(transcript).resuming(&recorded)),
        Source::Http(api, config) => {
            let client: Result<BoxTransport, TransportError> = match api {
                ModelApi::Anthropic => AnthropicClient::new(config).map(|c| Box::new(c) as BoxTransport),
                ModelApi::Openai => OpenAiClient::new(config).map(|c| Box::new(c) as BoxTransport),
            };
            match client {
                Ok(client) => client,
                Err(error) => {
                    node.shutdown()?;
                    return Err(Failure::Internal(format!("cannot build the {} client: {error}", api.wire())));
                }
            }
        }
    };
    let transport = AbortAt { inner, at: abort_at, after_answer, calls: AtomicU32::new(0) };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let timer = TokioTimer::new(Arc::clone(&clock));
    let cancel = Cancellation::new();
    let on_interrupt = cancel.clone();
    let interrupted = Arc::new(AtomicBool::new(false));
    let saw_ctrl_c = Arc::clone(&interrupted);
    // ctrl-c cancels the run (recorded `cancelled`, exit 130); SIGTERM pauses it between two
    // steps, resumable (exit 143). Under `keel resume`, the command's own handlers stop the
    // process instead: the run is left as a crash leaves it, and resumable.
    let watcher = matches!(mode, Mode::Interactive { .. }).then(|| {
        tokio::spawn(async move {
            let mut terminate = crate::wiring::sigterm();
            tokio::select! {
                signal = tokio::signal::ctrl_c() => if signal.is_ok() {
                    saw_ctrl_c.store(true, Ordering::SeqCst);
                    on_interrupt.cancel();
                },
                () = terminate.recv() => on_interrupt.terminate(),
            }
        })
    });
    let env = AgentEnv { journal: &journal, clock: &*clock, timer: &timer, cancel: &cancel, gate: None };
    let result = match (&plan.script, &gate) {
        (script @ Script::Support { .. }, Some(gate)) => {
            let case = script.case().expect("a support script has a case: Script::case");
            let granted = (plan.limits.clone(), plan.capabilities.clone());
            let run = (plan.run_id.as_str(), plan.prompt.clone());
            support_agent::run(env, &transport, run, &case, gate, granted, &plan.spine).await
        }
        _ => {
            ticket_review::run(env, &transport, plan.run_id.as_str(), plan.limits.clone(), plan.capabilities.clone())
                .await
        }
    };
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    // A run that stopped gave its lease back with its last facts; a suspended one (or one
    // cut short by an error) is given back here, so whoever resumes it need not wait.
    if let Some(grant) = lessee.grant(&plan.run_id) {
        engine::executor::release_runs(&*log, &lessee, &cause, vec![grant])
            .await
            .map_err(|e| Failure::Internal(e.to_string()))?;
    }
    node.shutdown()?;
    let outcome = result.map_err(|e| Failure::Internal(format!("agent run {} failed: {e}", plan.run_id)))?;
    Ok(Driven::Ended { outcome, interrupted: interrupted.load(Ordering::SeqCst) })
}

/// What `keel resume` did with one unfinished agent run.
#[derive(Debug, Serialize)]
pub struct AgentResumed {
    /// The run.
    pub run_id: String,
    /// Its agent workflow.
    pub workflow: String,
    /// Its status after the resume (`awaiting_approval` for one still suspended), or
    /// `not_resumed`.
    pub status: String,
    /// Model calls reserved, all resumes included.
    pub model_calls: u32,
    /// Tool attempts admitted.
    pub tool_calls: u32,
    /// Why it was not resumed (its API key is not set, another process holds it…), or why it
    /// stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AgentResumed {
    /// An agent run left as it is, saying why.
    pub fn not_resumed(run: &engine::ledger::Run, why: &str) -> Self {
        Self {
            run_id: run.run_id.to_string(),
            workflow: run.workflow.clone(),
            status: "not_resumed".into(),
            model_calls: 0,
            tool_calls: 0,
            detail: Some(why.to_owned()),
        }
    }

    /// The one line `keel resume` prints for it.
    pub fn summary(&self) -> String {
        let detail = self.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        format!(
            "{}, {}, {}{detail}",
            self.status,
            plural(self.model_calls, "model call"),
            plural(self.tool_calls, "tool call")
        )
    }
}

/// `keel resume`'s agent part: every unfinished agent run nobody holds live is resumed from
/// its journal (no recorded model answer requested again), one after another. A run that
/// cannot be (its API key is not set, its transcript is gone) is reported and left as it is.
pub async fn resume_unfinished(
    db: &Path,
    durability: store::Durability,
    provider: &crate::ProviderArgs,
) -> Result<Vec<AgentResumed>, Failure> {
    let reader = store::Reader::open(db)
        .map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))?;
    let running = store::RunFilter { state: Some(store::RunState::Running), ..store::RunFilter::default() };
    let runs: Vec<RunId> = reader
        .runs_matching(&running)?
        .into_iter()
        .filter(|row| row.workflow.starts_with(engine::ledger::AGENT_WORKFLOW_PREFIX))
        .map(|row| RunId::new(row.run_id))
        .collect();
    drop(reader);
    let mut out = Vec::new();
    for run_id in runs.into_iter().take(engine::limits::RESUME_PASS_MAX) {
        out.push(match resume_one(db, durability, provider, &run_id).await? {
            Ok(resumed) => resumed,
            Err(NotResumed { workflow, why }) => AgentResumed {
                run_id: run_id.to_string(),
                workflow,
                status: "not_resumed".into(),
                model_calls: 0,
                tool_calls: 0,
                detail: Some(why),
            },
        });
    }
    Ok(out)
}

/// Why an agent run was not resumed.
pub struct NotResumed {
    /// Its agent workflow (`?` when its plan cannot be read).
    pub workflow: String,
    /// Why: its API key is not set, its transcript is gone, another live process holds it….
    pub why: String,
}

/// Resumes one unfinished agent run from its journal, as `keel resume` does each (and `keel
/// worker` each it claims); a run that cannot be resumed is left as it is, saying why.
///
/// # Errors
///
/// The log's failure.
pub async fn resume_one(
    db: &Path,
    durability: store::Durability,
    provider: &crate::ProviderArgs,
    run_id: &RunId,
) -> Result<Result<AgentResumed, NotResumed>, Failure> {
    let plan = match plan_resume(db, run_id) {
        Ok(plan) => plan,
        Err(failure) => return Ok(Err(NotResumed { workflow: "?".into(), why: failure.message() })),
    };
    let source = match plan.script.load() {
        Ok(source) => source,
        Err(why) => return Ok(Err(NotResumed { workflow: plan.workflow, why })),
    };
    Ok(match drive(db, durability, provider, &plan, source, Mode::Recovery).await? {
        Driven::Busy(why) => Err(NotResumed { workflow: plan.workflow, why }),
        Driven::Ended { outcome, .. } => Ok(AgentResumed {
            run_id: run_id.to_string(),
            workflow: plan.workflow.clone(),
            status: outcome.status.as_str().to_owned(),
            model_calls: outcome.model_calls,
            tool_calls: outcome.tool_calls,
            detail: outcome.detail.clone(),
        }),
    })
}

/// The agent runs of a log on this machine, as `keel worker` resumes them: each through
/// [`resume_one`], on connections of its own to the log.
pub struct Resumer {
    db: std::path::PathBuf,
    durability: store::Durability,
    provider: crate::ProviderArgs,
}

impl Resumer {
    /// The agent runs of the log at `db`, reaching the payment provider through `provider`.
    pub fn new(db: &Path, durability: store::Durability, provider: &crate::ProviderArgs) -> Self {
        Self { db: db.to_owned(), durability, provider: provider.clone() }
    }
}

impl crate::worker::AgentRuns for Resumer {
    fn resume<'a>(&'a self, run_id: &'a RunId) -> engine::provider::BoxFuture<'a, Result<Option<String>, Failure>> {
        Box::pin(async move {
            let resumed = resume_one(&self.db, self.durability, &self.provider, run_id).await?;
            Ok(resumed.err().map(|not| not.why))
        })
    }
}

/// Takes the run's lease for this process and recovers the run's own attempts and lookups
/// in flight. While another live process holds the run (a concurrent `keel agent resume`),
/// waits for it to let go — it finished the run, suspended it, or died — telling the operator
/// so on stderr, at most [`engine::limits::AGENT_RESUME_WAIT_MAX_MS`]; then this resume goes
/// on from what that one recorded, so both report the run's true status. `Err` says, for the
/// operator, who still holds the run.
async fn claim_and_recover(
    log: &dyn EventLog,
    lessee: &engine::lease::Lessee,
    cause: &Cause,
    run_id: &RunId,
    patient: bool,
) -> anyhow::Result<(), String> {
    let started = std::time::Instant::now();
    let patience = std::time::Duration::from_millis(engine::limits::AGENT_RESUME_WAIT_MAX_MS);
    let mut told = false;
    loop {
        match engine::executor::claim_run(log, lessee, cause, run_id).await {
            Ok(_) => break,
            Err(engine::executor::WorkflowError::Busy(refusal)) => {
                if !patient {
                    return Err(refusal.to_string());
                }
                if started.elapsed() >= patience {
                    return Err(format!("{refusal}; still held after waiting, try again later"));
                }
                if !told {
                    errln!("keel: {refusal}: waiting for it to finish or suspend the run");
                    told = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(engine::limits::LEASE_POLL_MS)).await;
            }
            Err(other) => return Err(format!("cannot take run {run_id}: {other}")),
        }
    }
    let recover = Ask::recover(cause.clone(), lessee.owner().clone(), Some(run_id.clone()));
    log.ask(recover).await.map(drop).map_err(|error| format!("cannot recover run {run_id}: {error}"))
}

/// The facts declared on a support ticket's conversation (`keel facts apply ID`), none when
/// the log does not exist yet.
fn ticket_facts(db: &Path, case: &support_agent::Case) -> Result<engine::facts::Conversation, Failure> {
    let id = engine::facts::ConversationId::parse(&case.id).map_err(|e| Failure::Usage(format!("ticket id: {e}")))?;
    if !db.exists() {
        return Ok(engine::facts::Conversation::default());
    }
    let reader = store::Reader::open(db)
        .map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))?;
    let events = reader.stream(&id.stream())?;
    engine::facts::fold(&events).map_err(|e| Failure::Internal(format!("ticket {}'s facts: {e}", case.id)))
}

/// Where a new run's answers and (support) ticket come from, as the flags name them.
#[derive(Clone, Copy)]
struct Sources<'a> {
    scenario: Option<&'a str>,
    transcript: Option<&'a Path>,
    ticket: Option<&'a Path>,
}

/// A support run's script: a named scenario, or a transcript against the refund scenario's
/// ticket and order; either with `--ticket`'s instead.
fn support_script(sources: Sources<'_>, model: &crate::ModelArgs) -> Result<Script, String> {
    let known: Vec<&str> = support_agent::Scenario::ALL.iter().map(|s| s.name()).collect();
    let ticket = match sources.ticket {
        Some(path) => {
            let text = std::fs::File::open(path)
                .and_then(|file| engine::limits::read_text_at_most(file, engine::limits::TICKET_FILE_MAX_BYTES))
                .map_err(|e| format!("cannot read ticket {}: {e}", path.display()))?;
            let case = support_agent::Case::parse(&text).map_err(|e| format!("--ticket {}: {e}", path.display()))?;
            Some(Box::new(case))
        }
        None => None,
    };
    match (sources.scenario, sources.transcript) {
        // A transcript replays against the default scenario's ticket and order (refund's).
        (None, Some(path)) if model.model_api.is_none() => {
            let path =
                std::fs::canonicalize(path).map_err(|e| format!("cannot read transcript {}: {e}", path.display()))?;
            Ok(Script::Support { case: support_agent::Scenario::Refund, transcript: Some(path), ticket })
        }
        (Some(name), None) if model.model_api.is_none() => {
            let case = support_agent::Scenario::parse(name)
                .ok_or_else(|| format!("unknown support scenario {name:?} (known: {})", known.join(", ")))?;
            Ok(Script::Support { case, transcript: None, ticket })
        }
        _ => Err(format!(
            "support runs a named scenario (--scenario {}) or a transcript (--transcript FILE), against the \
             scenario's ticket and order (the refund scenario's for a transcript) or --ticket FILE's",
            known.join("|")
        )),
    }
}

fn plan_new(
    workflow: &str,
    sources: Sources<'_>,
    model: &crate::ModelArgs,
    limits: Option<&str>,
    capabilities: Option<&str>,
) -> Result<Plan, String> {
    let Sources { scenario, transcript, ticket } = sources;
    if workflow == support_agent::WORKFLOW {
        let script = support_script(sources, model)?;
        let all = support_agent::all_capabilities();
        return finish_plan(workflow, script, support_agent::limits(), all, limits, capabilities);
    }
    if ticket.is_some() {
        return Err(format!("--ticket is the support agent's; {workflow} reads no ticket file"));
    }
    if workflow != ticket_review::WORKFLOW {
        return Err(format!(
            "unknown agent workflow {workflow:?} (known: {}, {})",
            ticket_review::WORKFLOW,
            support_agent::WORKFLOW
        ));
    }
    let (script, plan_limits, grants) = match (scenario, transcript, model.model_api.as_deref()) {
        (Some(name), None, None) => {
            let known: Vec<&str> = Scenario::ALL.iter().map(Scenario::name).collect();
            let scenario = Scenario::parse(name)
                .ok_or_else(|| format!("unknown scenario {name:?} (known: {})", known.join(", ")))?;
            (Script::Scenario(scenario), scenario.limits(), scenario.capabilities())
        }
        (None, Some(path), None) => {
            let path =
                std::fs::canonicalize(path).map_err(|e| format!("cannot read transcript {}: {e}", path.display()))?;
            (Script::File(path), AgentLimits::default(), ticket_review::all_capabilities())
        }
        (None, None, Some(api)) => {
            let api = ModelApi::parse(api).ok_or_else(|| format!("unknown --model-api {api:?} (anthropic, openai)"))?;
            let model_name =
                model.model.as_deref().filter(|m| !m.trim().is_empty()).ok_or("--model-api needs --model NAME")?;
            // Refused before anything is recorded; the message never quotes the URL, which may
            // hold a credential.
            let base_url = BaseUrl::parse(model.model_base_url.as_deref().unwrap_or(api.default_base_url()))
                .map_err(|e| format!("--model-base-url: {e}"))?;
            let live = LiveModel { api, model: model_name.to_owned(), base_url };
            (Script::Live(live), AgentLimits::default(), ticket_review::all_capabilities())
        }
        _ => return Err("pass exactly one of --scenario NAME, --transcript FILE or --model-api API".into()),
    };
    finish_plan(workflow, script, plan_limits, grants, limits, capabilities)
}

/// Applies the `--limits` and `--capabilities` overrides to a new run's plan.
fn finish_plan(
    workflow: &str,
    script: Script,
    mut plan_limits: AgentLimits,
    mut grants: BTreeSet<String>,
    limits: Option<&str>,
    capabilities: Option<&str>,
) -> Result<Plan, String> {
    if let Some(text) = limits {
        let overrides = engine::canonical::parse_strict(text).map_err(|e| format!("--limits: {e}"))?;
        plan_limits = plan_limits.overridden_by(&overrides).map_err(|e| format!("--limits: {e}"))?;
    }
    plan_limits.validate().map_err(|e| format!("limits: {e}"))?;
    if let Some(list) = capabilities {
        let known = if workflow == support_agent::WORKFLOW {
            support_agent::all_capabilities()
        } else {
            ticket_review::all_capabilities()
        };
        grants = list.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect();
        if let Some(unknown) = grants.iter().find(|c| !known.contains(*c)) {
            let known: Vec<&str> = known.iter().map(String::as_str).collect();
            return Err(format!(
                "--capabilities: unknown capability {unknown:?} for {workflow} (known: {})",
                known.join(", ")
            ));
        }
    }
    Ok(Plan {
        run_id: RunId::new(uuid::Uuid::new_v4().to_string()),
        workflow: workflow.to_owned(),
        script,
        limits: plan_limits,
        capabilities: grants,
        spine: RunLimits::default(),
        prompt: support_agent::PROMPT.to_owned(),
        policy: None,
    })
}

/// What a human needs before approving a support refund (seed 002): the ticket's raw text,
/// marked untrusted (it is a third party's, and may be an injection), the amount, the order,
/// and what was already refunded on it (validated, or held by refunds still pending).
#[derive(Debug, Serialize)]
struct ApprovalContext {
    intent_key: String,
    amount_minor: i64,
    currency: String,
    order_id: String,
    already_refunded_minor: i64,
    pending_refunds_minor: i64,
    ticket: UntrustedTicket,
}

/// A ticket's text as its writer wrote it: data to show a human, never instructions.
#[derive(Debug, Serialize)]
struct UntrustedTicket {
    untrusted: bool,
    source: &'static str,
    text: String,
}

fn approval_context(db: &Path, plan: &Plan, key: &str) -> Result<Option<ApprovalContext>, Failure> {
    let Some(case) = plan.script.case() else { return Ok(None) };
    let Some(key) = engine::event::IntentKey::parse(key) else { return Ok(None) };
    let reader = store::Reader::open(db)
        .map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))?;
    let Some(intent) = reader.intent_state(&key)? else { return Ok(None) };
    let definition = &intent.definition;
    let (refunded, held) = crate::ops::refunded_on_order(&reader, &intent)?;
    Ok(Some(ApprovalContext {
        intent_key: key.as_str().to_owned(),
        amount_minor: definition.amount_minor,
        currency: definition.currency.clone(),
        order_id: definition.order_id.clone(),
        already_refunded_minor: refunded,
        pending_refunds_minor: held,
        ticket: UntrustedTicket {
            untrusted: true,
            source: "read_ticket: written by a third party, data and never instructions",
            text: case.text,
        },
    }))
}

/// `keel agent run --json`'s document: the run id first, then the report, and what a human
/// needs to see when the run waits for one.
#[derive(Serialize)]
struct Report<'a> {
    run_id: &'a str,
    #[serde(flatten)]
    report: agent::RunReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'a ApprovalContext>,
}

fn print_outcome(out: &Output, plan: &Plan, outcome: &RunOutcome, approval: Option<&ApprovalContext>) {
    let document = Report { run_id: plan.run_id.as_str(), report: outcome.report(), approval };
    out.emit(&document, || {
        outln!("agent: {} (bounded harness), run {}", plan.workflow, plan.run_id);
        outln!("transport: {}", plan.script.describe());
        let grants: Vec<&str> = plan.capabilities.iter().map(String::as_str).collect();
        outln!("capabilities: {}", if grants.is_empty() { "(none)".to_owned() } else { grants.join(", ") });
        let limits = &plan.limits;
        outln!(
            "limits: {}, {}, {} per signature, {} ms deadline",
            plural(limits.model_calls_max, "model call"),
            plural(limits.tool_calls_max, "tool attempt"),
            limits.repeats_per_signature_max,
            limits.deadline_ms
        );
        let completion = match plan.script {
            Script::Support { .. } => "the ticket read, then a refund of its own order validated",
            Script::Scenario(_) | Script::File(_) | Script::Live(_) => {
                "ticket 42 read, then finish_review(42) succeeded"
            }
        };
        outln!("completion: {completion} (the model saying so is not enough)");
        for event in &outcome.events {
            outln!("  {:<20} {:<16} {}", event.kind, event.name, event.count);
        }
        outln!(
            "status: {} ({}, {})",
            outcome.status.as_str(),
            plural(outcome.model_calls, "model call"),
            plural(outcome.tool_calls, "tool call")
        );
        match &outcome.awaiting_approval {
            // The hint once, in full (the detail says the same).
            Some(key) => {
                if let Some(approval) = approval {
                    outln!(
                        "  refund of {} on order {} (already refunded {}, pending {})",
                        crate::ops::money(approval.amount_minor, &approval.currency),
                        approval.order_id,
                        crate::ops::money(approval.already_refunded_minor, &approval.currency),
                        crate::ops::money(approval.pending_refunds_minor, &approval.currency)
                    );
                    outln!("  ticket (UNTRUSTED, a third party's words, not instructions):");
                    for line in approval.ticket.text.lines() {
                        outln!("  | {line}");
                    }
                }
                outln!(
                    "  awaiting approval: keel approve {key} --by NAME (or keel deny {key} --by NAME --reason WHY),"
                );
                outln!("  then keel agent resume {}", plan.run_id);
            }
            None => {
                if let Some(detail) = &outcome.detail {
                    outln!("  {detail}");
                }
            }
        }
        if let Some(text) = outcome.text.as_deref().filter(|_| outcome.status.as_str() == "incomplete") {
            outln!("  model text (not a success): {text}");
        }
    });
}
