//! Your agent in the kit: its tools, its scripted transcript, its runs under crashes.
//!
//! Owns [`Agent`] (what a user gives: the tools it registers in a [`Registry`], given the
//! run's [`AgentHost`]; its system prompt, request, limits, grants and completion condition;
//! the transcript of the model's answers), [`drive`] (starts the agent's run, or resumes it
//! after a crash the way a restarted process does: take its lease, recover what it had in
//! flight, replay its journal) and the count of what the model was asked: every request the
//! transport receives is appended, before it is answered, to a file of the seed
//! ([`Request`]), which survives a SIGKILL; [`check_requests`] holds that count against the
//! journal — no recorded model call asked again.
//!
//! It must never decide an agent step, a budget or an intent transition (the harness and the
//! ledger do), and never judge a run by what a process believed: only by the log, and by
//! what the transport was asked.

use crate::invariants::Report;
use adapters::model::TokioTimer;
use adapters::model::scripted::{ScriptedTransport, Transcript};
use agent::{
    AgentEnv, AgentJournal as _, AgentLimits, AgentState, Cancellation, IntentGate, LogJournal, ModelRequest,
    ModelResponse, ModelTransport, NewRun, Registry, RunSpec, TransportError,
};
use engine::clock::ManualClock;
use engine::event::{Cause, RunId, RunLimits, RunVersions};
use engine::executor::Runtime;
use engine::log::{Ask, Asking as _};
use engine::policy::InForce;
use engine::provider::{BoxFuture, Secret};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Tools = Arc<dyn Fn(&AgentHost<'_>) -> Registry + Send + Sync>;
type Done = Arc<dyn Fn(&AgentState) -> bool + Send + Sync>;

/// What the kit hands your tools when it builds them for one process of the run.
pub struct AgentHost<'a> {
    /// The run's id: derive your intent ids from it, and from the call, never from a process.
    pub run_id: &'a str,
    /// The intent lifecycle your effect tools reserve and drive through.
    pub gate: &'a Arc<IntentGate>,
    /// The run's journal as this process found it, folded (empty for a new run): a tool whose
    /// host state derives from the recorded facts rebuilds it from here, as a restarted
    /// process must — nothing else survives a crash.
    pub recorded: &'a AgentState,
}

/// A user's agent and the model's scripted answers. Build it with [`Agent::new`], give it to
/// [`crate::Kit::agent`].
#[derive(Clone)]
pub struct Agent {
    workflow: String,
    transcript: Transcript,
    tools: Tools,
    done: Done,
    system: String,
    prompt: String,
    limits: AgentLimits,
    capabilities: BTreeSet<String>,
    spine: RunLimits,
    card: Option<String>,
    policy: Option<InForce>,
}

impl Agent {
    /// The agent `workflow`, whose model answers with `transcript` (one entry per model
    /// call) and whose tools `tools` registers, for every process that runs it. It is done
    /// when `done` holds over its recorded facts.
    pub fn new(
        workflow: &str,
        transcript: Transcript,
        tools: impl Fn(&AgentHost<'_>) -> Registry + Send + Sync + 'static,
        done: impl Fn(&AgentState) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            workflow: workflow.to_owned(),
            transcript,
            tools: Arc::new(tools),
            done: Arc::new(done),
            system: String::new(),
            prompt: String::new(),
            limits: AgentLimits::default(),
            capabilities: BTreeSet::new(),
            spine: crate::default_limits(),
            card: None,
            policy: None,
        }
    }

    /// Its system instructions and the user's request.
    pub fn prompt(mut self, system: &str, prompt: &str) -> Self {
        (self.system, self.prompt) = (system.to_owned(), prompt.to_owned());
        self
    }

    /// Its limits (model calls, tool calls, tokens, cost, deadline…).
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The capabilities the run is granted.
    pub fn capabilities<'a>(mut self, granted: impl IntoIterator<Item = &'a str>) -> Self {
        self.capabilities = granted.into_iter().map(str::to_owned).collect();
        self
    }

    /// The spine's limits for the intents its effect tools reserve (money, attempts…).
    pub fn spine(mut self, limits: RunLimits) -> Self {
        self.spine = limits;
        self
    }

    /// Runs it under the operator's policy `policy`, which its effect tools' intents are
    /// reserved under: an irreversible tool that names no approval policy waits for a human
    /// (which the kit never gives) unless `policy` lowers it for the operation
    /// (`irreversible_without_approval`); the runs record `policy`'s stamp.
    pub fn under_policy(mut self, policy: InForce) -> Self {
        self.spine.policy = Some(policy.stamp.clone());
        self.policy = Some(policy);
        self
    }

    /// Binds a payment method to its runs: its effect tools may then charge, with this card
    /// (the model never sees it).
    pub fn paying_with(mut self, card: &str) -> Self {
        self.card = Some(card.to_owned());
        self
    }
}

/// One request the transport received: which process asked, for which run, and where the
/// run's journal stood — the model calls it had reserved and the answers it had recorded
/// (the transcript entry asked for). Appended before the answer is given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The process (the kit's number for it).
    pub process: u64,
    /// The agent run.
    pub run_id: String,
    /// Model calls reserved, its sub-agents' included: the call being asked is the last.
    pub reserved: u32,
    /// Answers recorded, its sub-agents' included: the transcript entry being asked for.
    pub answered: u32,
}

/// Where one process writes its requests, and who it is.
pub(crate) struct Recorder {
    /// The seed's request file, shared by every process.
    pub file: PathBuf,
    /// This process's number.
    pub process: u64,
}

/// The transport the kit gives an agent: the scripted one, each request appended to the
/// seed's file first, with the journal's position read from the log.
struct Counted<'a> {
    inner: ScriptedTransport,
    recorder: &'a Recorder,
    peek: LogJournal,
    run_id: String,
}

impl ModelTransport for Counted<'_> {
    fn complete<'a>(&'a self, request: &'a ModelRequest) -> BoxFuture<'a, Result<ModelResponse, TransportError>> {
        Box::pin(async move {
            let unavailable = |detail: String| TransportError::Unavailable { detail };
            let events = self.peek.load().await.map_err(|e| unavailable(format!("testkit cannot peek: {e}")))?;
            let state = AgentState::from_events(&events);
            let line = Request {
                process: self.recorder.process,
                run_id: self.run_id.clone(),
                reserved: state.model_calls_made(),
                answered: state.answers_made(),
            };
            append(&self.recorder.file, &line).map_err(unavailable)?;
            self.inner.complete(request).await
        })
    }

    fn script_fingerprint(&self) -> Option<String> {
        self.inner.script_fingerprint()
    }
}

/// Appends one line with a single `write` on a file opened to append: the kernel holds it
/// once the call returns, so a SIGKILL right after cannot lose it.
fn append(file: &Path, request: &Request) -> Result<(), String> {
    let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .map_err(|e| format!("testkit cannot open {}: {e}", file.display()))?;
    out.write_all(&line).map_err(|e| format!("testkit cannot write {}: {e}", file.display()))
}

/// Every request in the seed's file (none when no model was asked).
///
/// # Errors
///
/// When the file cannot be read or a line is not a [`Request`].
pub(crate) fn requests(file: &Path) -> Result<Vec<Request>, String> {
    if !file.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    text.lines().map(|line| serde_json::from_str(line).map_err(|e| format!("a request line: {e}"))).collect()
}

/// Starts run `run_id` of `agent` (when `start`), or resumes it as a restarted process does
/// (its lease taken, what it had in flight recovered, its journal replayed); nothing when it
/// stopped, or when it never started and `start` is false.
///
/// # Errors
///
/// When the log refuses or the harness fails (an internal error, never a stop).
pub(crate) async fn drive(
    agent: &Agent,
    runtime: &Runtime,
    clock: &Arc<ManualClock>,
    run_id: &str,
    recorder: &Recorder,
    start: bool,
) -> Result<(), String> {
    let (log, lessee, cause, id) = (&runtime.log, &runtime.lessee, Cause::command("testkit agent"), RunId::new(run_id));
    let peek = || LogJournal::new(Arc::clone(log), id.clone(), cause.clone(), None, lessee.clone());
    let before = AgentState::from_events(&peek().load().await.map_err(|e| e.to_string())?);
    if before.stop.is_some() {
        return settle(agent, runtime, clock, &cause, &id).await;
    }
    if before.header.is_none() && !start {
        return Ok(());
    }
    if before.header.is_some() {
        engine::executor::claim_run(&**log, lessee, &cause, &id).await.map_err(|e| format!("claim {run_id}: {e}"))?;
        let recover = Ask::recover(cause.clone(), lessee.owner().clone(), Some(id.clone()));
        log.ask(recover).await.map_err(|e| format!("recover {run_id}: {e}"))?;
    }
    let start =
        NewRun { input: serde_json::json!({}), limits: agent.spine.clone(), versions: RunVersions::this_release() };
    let journal = LogJournal::new(Arc::clone(log), id.clone(), cause.clone(), Some(start), lessee.clone());
    let recorded = AgentState::from_events(&journal.load().await.map_err(|e| e.to_string())?);
    let transport = Counted {
        inner: ScriptedTransport::new(agent.transcript.clone()).resuming(&recorded),
        recorder,
        peek: peek(),
        run_id: run_id.to_owned(),
    };
    let mut gate = IntentGate::new(runtime.clone(), cause.clone());
    if let Some(card) = &agent.card {
        gate = gate.paying_with(Secret::new(card));
    }
    if let Some(policy) = &agent.policy {
        gate = gate.under_policy(policy.clone());
    }
    let gate = Arc::new(gate);
    let registry = (agent.tools)(&AgentHost { run_id, gate: &gate, recorded: &recorded });
    let spec = RunSpec {
        run_id: run_id.to_owned(),
        workflow: agent.workflow.clone(),
        system: agent.system.clone(),
        prompt: agent.prompt.clone(),
        limits: agent.limits.clone(),
        capabilities: agent.capabilities.clone(),
        policy_version: None,
    };
    // A real timer on the kit's clock: the tools' charges cross real HTTP, so a deadline is
    // met only when the kit moves its clock past it, never by waiting for a slow answer.
    let (timer, cancel) = (TokioTimer::new(Arc::clone(clock) as Arc<dyn engine::clock::Clock>), Cancellation::new());
    let env = AgentEnv { journal: &journal, clock: &**clock, timer: &timer, cancel: &cancel, gate: Some(&*gate) };
    let result = agent::run(env, &transport, &registry, &spec, &*agent.done).await;
    // A run cut short (suspended, or by an error) gives its lease back, so the next may take it.
    if let Some(grant) = lessee.grant(&id) {
        engine::executor::release_runs(&**log, lessee, &cause, vec![grant]).await.map_err(|e| e.to_string())?;
    }
    result.map_err(|e| format!("agent run {run_id} failed: {e}"))?;
    settle(agent, runtime, clock, &cause, &id).await
}

/// After a run stopped, its host — who holds the card — takes its charges that are not
/// settled on, waiting (on the kit's clock) until each next step is due, within the run's
/// time: an outcome lost at a provider without lookup is resolved only by a resend with the
/// same key, which needs the card — as a workflow's caller re-submits.
async fn settle(
    agent: &Agent,
    runtime: &Runtime,
    clock: &ManualClock,
    cause: &Cause,
    id: &RunId,
) -> Result<(), String> {
    use engine::clock::Clock as _;
    let Some(card) = agent.card.as_deref().map(Secret::new) else { return Ok(()) };
    let history = runtime.log.ask(Ask::load_run(cause.clone(), id.clone())).await.map_err(|e| e.to_string())?;
    let keys = history.journal.iter().filter_map(|entry| entry.name.strip_prefix("intent:"));
    for key in keys.filter_map(engine::event::IntentKey::parse) {
        let intent = runtime.log.ask(Ask::observe(cause.clone(), key.clone())).await.map_err(|e| e.to_string())?;
        // Each pass spends an attempt or a reconciliation, or stops: the loop is bounded.
        let steps = intent.intent.attempts_max.saturating_add(intent.intent.reconciliations_max);
        for _ in 0..=steps {
            let outcome = match engine::executor::drive_intent(runtime, cause.clone(), &key, Some(&card)).await {
                Ok(outcome) => outcome,
                // Past its run's deadline nothing may be sent: the intent stays as it is,
                // for the invariants to judge (an unknown left is a liveness failure).
                Err(engine::executor::WorkflowError::DeadlineExceeded(_)) => break,
                Err(error) => return Err(format!("settle {key}: {error}")),
            };
            let Some(due) = outcome.reconcile_after else { break };
            clock.advance_ms((due - clock.now()).num_milliseconds().max(1));
        }
    }
    Ok(())
}

/// Every agent run's journal in the log at `keel_db`, folded: the ground truth the requests
/// are held against.
///
/// # Errors
///
/// When the log cannot be read or a fact does not fold (which `invariants` reports too).
pub(crate) fn journals(keel_db: &Path) -> Result<BTreeMap<String, AgentState>, String> {
    let reader = store::Reader::open(keel_db).map_err(|e| e.to_string())?;
    let mut runs: BTreeMap<String, AgentState> = BTreeMap::new();
    for stored in reader.events_since(0).map_err(|e| e.to_string())? {
        if let engine::event::Event::AgentRecorded { run_id, event } = stored.event {
            let fact: agent::AgentEvent =
                serde_json::from_value(event).map_err(|e| format!("seq {}: {e}", stored.seq))?;
            runs.entry(run_id.as_str().to_owned()).or_default().try_apply(&fact)?;
        }
    }
    Ok(runs)
}

/// Holds what the transport was asked against the journals (`runs`, each agent run's final
/// fold) and the processes that died (`died`): no reserved call asked twice; every recorded
/// answer asked for exactly once, except a call whose process died before its answer was
/// recorded (then the next process asks the same entry again, once). Each breach counts as a
/// `model_calls_repeated`; a recorded answer the transport was never asked for is a
/// `verify_failures` (the count itself is wrong).
pub fn check_requests(
    requests: &[Request],
    runs: &BTreeMap<String, AgentState>,
    died: &BTreeSet<u64>,
    report: &mut Report,
) {
    let mut per_call: BTreeMap<(&str, u32), u32> = BTreeMap::new();
    let mut per_entry: BTreeMap<(&str, u32), Vec<u64>> = BTreeMap::new();
    for request in requests {
        *per_call.entry((&request.run_id, request.reserved)).or_default() += 1;
        per_entry.entry((&request.run_id, request.answered)).or_default().push(request.process);
    }
    for ((run, call), asked) in &per_call {
        if *asked > 1 {
            report.model_calls_repeated += 1;
            report.note(format!("agent run {run}: model call {call} was sent {asked} times"));
        }
    }
    for ((run, entry), processes) in &per_entry {
        let survivors = processes.iter().filter(|p| !died.contains(p)).count();
        let mut seen = BTreeSet::new();
        let same_process = processes.iter().any(|p| !seen.insert(*p));
        if survivors > 1 || same_process {
            report.model_calls_repeated += 1;
            report.note(format!(
                "agent run {run}: answer {} was asked for {} times, by processes {processes:?} of which only {:?} died",
                entry + 1,
                processes.len(),
                processes.iter().filter(|p| died.contains(p)).collect::<Vec<_>>()
            ));
        }
    }
    for (run, state) in runs {
        for entry in 0..state.answers_made() {
            if !per_entry.contains_key(&(run.as_str(), entry)) {
                report.verify_failures += 1;
                report.note(format!("agent run {run}: answer {} is recorded but was never asked for", entry + 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(process: u64, reserved: u32, answered: u32) -> Request {
        Request { process, run_id: "r".to_owned(), reserved, answered }
    }

    fn answered(answers: u32) -> BTreeMap<String, AgentState> {
        let mut state = AgentState::default();
        state.answers = answers;
        [("r".to_owned(), state)].into()
    }

    #[test]
    fn an_answer_lost_with_its_process_may_be_asked_again_once() {
        // Process 1 asked for answer 2 (call 2) and died before recording it; process 2
        // reserved call 3 and asked for the same entry.
        let requests = [asked(1, 1, 0), asked(1, 2, 1), asked(2, 3, 1), asked(2, 4, 2)];
        let mut report = Report::default();
        check_requests(&requests, &answered(3), &[1].into(), &mut report);
        assert!(report.is_ok(), "{report:?}");
    }

    #[test]
    fn a_recorded_answer_asked_again_is_caught() {
        // Process 1 survived: the entry it was answered is recorded, yet process 2 asked it again.
        let requests = [asked(1, 1, 0), asked(2, 2, 0)];
        let mut report = Report::default();
        check_requests(&requests, &answered(1), &BTreeSet::new(), &mut report);
        assert_eq!(report.model_calls_repeated, 1, "{report:?}");
    }

    #[test]
    fn a_reserved_call_sent_twice_is_caught() {
        let requests = [asked(1, 1, 0), asked(1, 1, 0)];
        let mut report = Report::default();
        check_requests(&requests, &answered(1), &[1].into(), &mut report);
        assert_eq!(report.model_calls_repeated, 2, "{report:?}");
    }

    #[test]
    fn a_recorded_answer_nobody_asked_for_means_the_count_is_wrong() {
        let mut report = Report::default();
        check_requests(&[asked(1, 1, 0)], &answered(2), &BTreeSet::new(), &mut report);
        assert_eq!(report.verify_failures, 1, "{report:?}");
    }
}
