//! `keel worker`: a long-running process that claims due work and carries it out, or one
//! pass of it with `--once`.
//!
//! Owns [`Worker`] (the loop, its shutdown and its health line), [`Schedule`] (which unit of
//! work goes next: one pass over everything due, never two units of one run at once),
//! [`Health`] (the counters the health line and the summary print), [`UnitReport`] (what one
//! unit came to) and [`AgentRuns`] (how the backend resumes one agent run).
//!
//! It never decides a transition (the ledger does), never names SQL or a backend (it talks
//! to the log through [`EventLog`] and acts through the [`Executor`] that `keel resume` and
//! `keel reconcile --due` use, one unit at a time), and never acts for a run without holding
//! its lease.
//!
//! # What it claims
//!
//! A pass reads one snapshot of the log: every unfinished run (a workflow run to replay, an
//! agent run to resume: a run whose lease expired or whose holder is proven dead, or a run
//! suspended on a timer, a signal or a resubmission), every intent due for reconciliation,
//! and every charge reserved that nobody is sending. Each becomes a unit of work; units run
//! at most `--concurrency` at once, and at most one per run. When the worker holds nothing,
//! a pass starts with a recovery: every attempt or lookup in flight whose run no live process
//! holds becomes `outcome_unknown (crash)` — never resent blindly — and is reconciled by its
//! unit.
//!
//! # Leases
//!
//! A unit first claims its run's lease ([`claim_run`]: the next fencing token, or this
//! worker's own when it holds the run already); a run another live process holds is left to
//! it. Under the lease it recovers the run's own work in flight, reads the run or intent
//! afresh, acts, and gives the lease back — after asking the log whether it still holds it.
//! The process's renewal loop renews every lease held; one another process took is dropped
//! from the book, so the unit's later writes are refused and it reports itself `fenced` —
//! while a definitive answer it got from the provider is still recorded. A run may get units
//! in two passes in a row, each under its own token; never two at once.
//!
//! # Shutdown
//!
//! On SIGTERM or SIGINT the worker stops claiming, lets its units finish for at most
//! `--grace-ms`, cuts short the ones still running (an attempt in flight stays written ahead,
//! so whoever takes the run reconciles it), gives back every lease it holds — another worker
//! can claim those runs at once, without waiting for an expiry — and exits 0 with its summary.

use crate::output::{Failure, Outcome, Output, exit};
use engine::event::{Cause, IntentKey, RunId};
use engine::executor::{Due, Executor, IntentOutcome, OutcomeStatus, WorkflowError, claim_run, release_runs};
use engine::lease::LeaseGrant;
use engine::ledger::{Intent, IntentStatus, Refusal, Run};
use engine::log::{Ask, Asking, EventLog};
use engine::provider::BoxFuture;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// How the backend resumes one agent run (an agent run needs its transport and tools, which
/// the executor does not have). The worker holds the run's lease while it is called.
pub trait AgentRuns: Send + Sync {
    /// Resumes `run_id` from its journal, to its stop or suspension: `Ok(None)` when it was
    /// resumed, `Ok(Some(why))` when it could not be (its API key is not set, …).
    fn resume<'a>(&'a self, run_id: &'a RunId) -> BoxFuture<'a, Result<Option<String>, Failure>>;
}

/// The worker's settings, from its flags.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Units carried out at once, 1 to [`engine::limits::WORKER_CONCURRENCY_MAX`].
    pub concurrency: usize,
    /// The wait between two passes.
    pub poll: Duration,
    /// How often the health line is printed.
    pub health: Duration,
    /// How long a stopping worker lets its units finish.
    pub grace: Duration,
    /// One pass, then exit.
    pub once: bool,
}

impl Settings {
    /// The settings from `keel worker`'s flags (clap keeps each within its bounds).
    pub fn from_flags(concurrency: u64, poll_ms: u64, health_ms: u64, grace_ms: u64, once: bool) -> Self {
        Self {
            concurrency: usize::try_from(concurrency)
                .expect("--concurrency is at most WORKER_CONCURRENCY_MAX, which is a usize"),
            poll: Duration::from_millis(poll_ms),
            health: Duration::from_millis(health_ms),
            grace: Duration::from_millis(grace_ms),
            once,
        }
    }
}

/// Resolves at the first SIGTERM or SIGINT: what stops a worker.
pub async fn stop() {
    let mut terminate = crate::wiring::sigterm();
    // A SIGINT handler that cannot be installed disables its branch (SIGTERM still stops).
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => {}
        () = terminate.recv() => {}
    }
}

/// One unit of work: what the worker does for one run under its lease.
#[derive(Clone, Debug)]
enum Unit {
    /// An unfinished workflow run, replayed from its journal.
    Run(RunId),
    /// An unfinished agent run, resumed from its journal by the backend's [`AgentRuns`].
    Agent(RunId),
    /// An intent due for reconciliation, or a charge reserved that nobody is sending, acted
    /// on for its run.
    Intent { key: IntentKey, run_id: RunId },
}

impl Unit {
    /// The run whose lease the unit needs.
    fn run_id(&self) -> &RunId {
        match self {
            Self::Run(run_id) | Self::Agent(run_id) | Self::Intent { run_id, .. } => run_id,
        }
    }
}

/// Which unit goes next: the units of one pass in order, at most one running per run. A
/// unit whose run is busy when its turn comes is dropped: the next pass finds it again if
/// it is still due.
#[derive(Debug, Default)]
struct Schedule {
    queue: VecDeque<Unit>,
    busy: BTreeSet<RunId>,
}

impl Schedule {
    /// Starts a pass over `units` (the previous pass is over: its queue is empty).
    fn plan(&mut self, units: Vec<Unit>) {
        debug_assert!(self.queue.is_empty(), "a pass starts once the previous one is over");
        self.queue = units.into();
    }

    /// The next unit whose run is not busy, its run now busy.
    fn next(&mut self) -> Option<Unit> {
        while let Some(unit) = self.queue.pop_front() {
            if self.busy.insert(unit.run_id().clone()) {
                return Some(unit);
            }
        }
        None
    }

    /// The unit of `run_id` is over.
    fn done(&mut self, run_id: &RunId) {
        let was_busy = self.busy.remove(run_id);
        debug_assert!(was_busy, "only a running unit ends");
    }

    /// Whether the pass has no unit left to start.
    fn pass_over(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether no unit runs.
    fn idle(&self) -> bool {
        self.busy.is_empty()
    }

    /// Drops the units not started (a stopping worker claims nothing more).
    fn stop(&mut self) {
        self.queue.clear();
    }
}

/// What one unit came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result", content = "detail")]
pub enum UnitResult {
    /// Carried out: the run replayed to its end or its suspension, the intent reconciled (or
    /// sent, or ended).
    Done,
    /// Nothing was left to do once the lease was held: the run had ended, the intent was no
    /// longer due (another process got to it first).
    Settled,
    /// Another live process holds the run: left to it (who, and until when).
    Left(String),
    /// Another process took the run while this worker acted for it: its later writes were
    /// refused.
    Fenced(String),
    /// It failed (the log's failure, an agent run that cannot be resumed…).
    Failed(String),
}

/// What a unit was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitKind {
    /// A workflow run replayed.
    Run,
    /// An agent run resumed.
    AgentRun,
    /// An intent reconciled (or sent, or ended).
    Intent,
}

/// One unit's report.
#[derive(Clone, Debug, Serialize)]
pub struct UnitReport {
    /// The run it acted for.
    pub run_id: RunId,
    /// What it was.
    pub kind: UnitKind,
    /// The intent, for an intent's unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_key: Option<IntentKey>,
    /// The fencing token it held the run with (`None`: it never held it).
    pub token: Option<u64>,
    /// What it came to.
    #[serde(flatten)]
    pub result: UnitResult,
    /// Attempts and lookups in flight it recorded interrupted (`crash`).
    #[serde(skip)]
    recovered: usize,
    /// The intent it left and whether it is still open (unknown or escalated).
    #[serde(skip)]
    intent: Option<(IntentKey, bool)>,
}

/// The worker's state, as its health line and summary print it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Claiming and carrying out work.
    Alive,
    /// Stopping: it claims nothing more, its units finish.
    Stopping,
    /// Stopped: every lease given back.
    Stopped,
}

/// The counters of the health line (and the summary): since the worker started, except the
/// gauges `in_flight`, `leases_held` and `unknown`.
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    /// The worker's state.
    pub state: State,
    /// Passes begun.
    pub passes: u64,
    /// Units taken on.
    pub claimed: u64,
    /// Units carried out.
    pub done: u64,
    /// Units that found nothing left to do once they held the lease.
    pub settled: u64,
    /// Units running now.
    pub in_flight: usize,
    /// Run leases the process holds now.
    pub leases_held: usize,
    /// Intents its units left `outcome_unknown` or escalated, as last seen: a later pass (or
    /// a human) must take them further.
    pub unknown: usize,
    /// Units left to another live holder of their run.
    pub left: u64,
    /// Units fenced: another process took their run.
    pub fenced: u64,
    /// Units that failed.
    pub failed: u64,
    /// Units cut short by the shutdown.
    pub cut_short: u64,
    /// Attempts and lookups in flight recorded interrupted.
    pub recovered: u64,
}

impl Health {
    /// The health line: `keel worker: alive · claimed 3 · done 2 · …`.
    fn line(&self) -> String {
        let state = match self.state {
            State::Alive => "alive",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
        };
        format!(
            "keel worker: {state} · claimed {} · done {} · in flight {} · leases held {} · unknown {} · left {} · \
             fenced {} · failed {} · recovered {}",
            self.claimed,
            self.done,
            self.in_flight,
            self.leases_held,
            self.unknown,
            self.left,
            self.fenced,
            self.failed,
            self.recovered
        )
    }
}

/// The worker over one backend's executor (its log, provider and lease book) and agent runs.
pub struct Worker {
    executor: Executor,
    agents: Arc<dyn AgentRuns>,
    settings: Settings,
    cause: Cause,
}

/// What the worker counts as it goes.
struct Tally {
    health: Health,
    /// The intents left open, as last seen (the `unknown` gauge).
    open: BTreeSet<IntentKey>,
    /// Every unit's report (`--once` only: a long-running worker keeps counters alone).
    reports: Vec<UnitReport>,
    /// Why each run's last unit failed, while it keeps failing: a failure is printed when it
    /// starts or changes, not at every pass (an agent run whose API key is not set).
    failing: BTreeMap<RunId, String>,
}

impl Tally {
    fn new(health: Health) -> Self {
        Self { health, open: BTreeSet::new(), reports: Vec::new(), failing: BTreeMap::new() }
    }

    /// Whether `report` is a failure its run did not have at its last unit (a unit that
    /// did not fail clears its run's).
    fn newly_failing(&mut self, report: &UnitReport) -> bool {
        match &report.result {
            UnitResult::Failed(why) => self.failing.insert(report.run_id.clone(), why.clone()).as_ref() != Some(why),
            _ => {
                self.failing.remove(&report.run_id);
                false
            }
        }
    }

    fn count(&mut self, report: UnitReport, keep: bool) {
        let health = &mut self.health;
        match &report.result {
            UnitResult::Done => health.done += 1,
            UnitResult::Settled => health.settled += 1,
            UnitResult::Left(_) => health.left += 1,
            UnitResult::Fenced(_) => health.fenced += 1,
            UnitResult::Failed(_) => health.failed += 1,
        }
        health.recovered += report.recovered as u64;
        if self.newly_failing(&report)
            && let UnitResult::Failed(why) = &report.result
        {
            errln!("keel worker: run {}: {why}", report.run_id);
        }
        if let Some((key, open)) = &report.intent {
            if *open {
                self.open.insert(key.clone());
            } else {
                self.open.remove(key);
            }
        }
        self.health.unknown = self.open.len();
        if keep {
            self.reports.push(report);
        }
    }
}

/// The summary `keel worker` prints when it stops.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    #[serde(flatten)]
    health: &'a Health,
    /// `--once`: every unit, in the order they ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    units: Option<&'a [UnitReport]>,
}

impl Worker {
    /// A worker acting through `executor`, agent runs through `agents`.
    pub fn new(executor: Executor, agents: Arc<dyn AgentRuns>, settings: Settings) -> Self {
        Self { executor, agents, settings, cause: Cause::command("worker") }
    }

    fn log(&self) -> &dyn EventLog {
        &*self.executor.runtime().log
    }

    /// Runs until `stop` resolves (SIGTERM, SIGINT) or, with `--once`, until one pass is
    /// over; then gives back every lease and prints the summary.
    ///
    /// # Errors
    ///
    /// The log's failure when giving the leases back.
    pub async fn run(self, out: &Output, stop: impl std::future::Future<Output = ()>) -> Outcome {
        let this = Arc::new(self);
        let settings = this.settings;
        let mut tally = Tally::new(this.health(State::Alive));
        let mut schedule = Schedule::default();
        let mut units = Units::default();
        let mut health = tokio::time::interval(settings.health);
        health.tick().await; // The first tick is immediate: the first line comes one interval in.
        let mut next_pass = Box::pin(tokio::time::sleep(Duration::ZERO));
        tokio::pin!(stop);
        let stopped = loop {
            tokio::select! {
                () = &mut stop => break true,
                Some(ended) = units.set.join_next_with_id(), if !units.set.is_empty() => {
                    units.ended(ended, &mut schedule, &mut tally, settings.once);
                }
                () = &mut next_pass, if schedule.pass_over() && (!settings.once || tally.health.passes == 0) => {
                    this.begin_pass(&mut schedule, &mut tally).await;
                    next_pass.as_mut().reset(tokio::time::Instant::now() + settings.poll);
                }
                _ = health.tick(), if !settings.once => {
                    this.print_health(out, &mut tally, State::Alive, units.set.len());
                }
            }
            while units.set.len() < settings.concurrency {
                let Some(unit) = schedule.next() else { break };
                tally.health.claimed += 1;
                units.start(&this, unit);
            }
            if settings.once && tally.health.passes > 0 && schedule.pass_over() && units.set.is_empty() {
                break false;
            }
        };
        schedule.stop();
        if stopped {
            this.print_health(out, &mut tally, State::Stopping, units.set.len());
            this.drain(&mut units, &mut schedule, &mut tally).await;
        }
        // Every lease this process still holds goes back, so another worker takes those runs
        // at once.
        let lessee = &this.executor.runtime().lessee;
        release_runs(this.log(), lessee, &this.cause, lessee.grants()).await.map_err(crate::ops::workflow_failure)?;
        tally.health = Health { state: State::Stopped, ..this.health_of(&tally) };
        this.print_summary(out, &tally);
        Ok(exit_code(&tally.health, settings.once))
    }

    /// Reads the due work into a new pass.
    async fn begin_pass(&self, schedule: &mut Schedule, tally: &mut Tally) {
        tally.health.passes += 1;
        match self.plan(schedule.idle()).await {
            Ok((plan, recovered)) => {
                tally.health.recovered += recovered;
                schedule.plan(plan);
            }
            Err(error) => {
                errln!("keel worker: cannot read the due work: {error}");
                tally.health.failed += 1;
            }
        }
    }

    /// Lets the units finish for the grace period, then cuts short the ones left.
    async fn drain(&self, units: &mut Units, schedule: &mut Schedule, tally: &mut Tally) {
        let deadline = tokio::time::Instant::now() + self.settings.grace;
        while !units.set.is_empty() {
            match tokio::time::timeout_at(deadline, units.set.join_next_with_id()).await {
                Ok(Some(ended)) => units.ended(ended, schedule, tally, self.settings.once),
                Ok(None) => break,
                Err(_) => {
                    let cut = units.set.len() as u64;
                    units.set.abort_all();
                    while units.set.join_next().await.is_some() {}
                    errln!("keel worker: {cut} unit(s) still running after the grace period were cut short");
                    tally.health.cut_short += cut;
                    break;
                }
            }
        }
    }

    /// The counters with the gauges read now.
    fn health_of(&self, tally: &Tally) -> Health {
        Health { leases_held: self.executor.runtime().lessee.grants().len(), ..tally.health.clone() }
    }

    fn health(&self, state: State) -> Health {
        Self::empty_health(state, self.executor.runtime().lessee.grants().len())
    }

    /// Every counter at zero.
    fn empty_health(state: State, leases_held: usize) -> Health {
        Health {
            state,
            passes: 0,
            claimed: 0,
            done: 0,
            settled: 0,
            in_flight: 0,
            leases_held,
            unknown: 0,
            left: 0,
            fenced: 0,
            failed: 0,
            cut_short: 0,
            recovered: 0,
        }
    }

    fn print_health(&self, out: &Output, tally: &mut Tally, state: State, in_flight: usize) {
        tally.health.state = state;
        let health = Health { in_flight, ..self.health_of(tally) };
        if out.json {
            match serde_json::to_string(&health) {
                Ok(line) => outln!("{line}"),
                Err(error) => errln!("keel worker: cannot render the health line: {error}"),
            }
        } else {
            errln!("{}", health.line());
        }
    }

    fn print_summary(&self, out: &Output, tally: &Tally) {
        let summary = Summary { health: &tally.health, units: self.settings.once.then_some(&tally.reports[..]) };
        if out.json && !self.settings.once {
            // A long-running worker's stdout is one JSON object a line: the summary is the last.
            match serde_json::to_string(&summary) {
                Ok(line) => outln!("{line}"),
                Err(error) => errln!("keel worker: cannot render the summary: {error}"),
            }
            return;
        }
        out.emit(&summary, || {
            let h = &tally.health;
            outln!(
                "keel worker: stopped after {} · {} done · {} settled already · {} left to their holder · {} fenced · \
                 {} failed · {} cut short · {} recovered · {} unknown",
                crate::output::plural(h.passes, "pass"),
                crate::output::plural(h.done, "unit"),
                h.settled,
                h.left,
                h.fenced,
                h.failed,
                h.cut_short,
                h.recovered,
                h.unknown
            );
            for report in &tally.reports {
                let subject = report.intent_key.as_ref().map_or_else(|| report.run_id.to_string(), ToString::to_string);
                let result = match &report.result {
                    UnitResult::Done => "done".to_owned(),
                    UnitResult::Settled => "settled already".to_owned(),
                    UnitResult::Left(why) => format!("left: {why}"),
                    UnitResult::Fenced(why) => format!("fenced: {why}"),
                    UnitResult::Failed(why) => format!("failed: {why}"),
                };
                let kind = match report.kind {
                    UnitKind::Run => "run",
                    UnitKind::AgentRun => "agent run",
                    UnitKind::Intent => "intent",
                };
                outln!("  {kind} {subject}: {result}");
            }
        });
    }

    /// The units of a new pass, and how many attempts or lookups in flight its recovery
    /// recorded interrupted. Recovery runs only while this worker holds nothing
    /// (`holds_nothing`): it must never declare crashed an attempt one of its own units is
    /// sending.
    async fn plan(&self, holds_nothing: bool) -> Result<(Vec<Unit>, u64), WorkflowError> {
        let log = self.log();
        let lessee = &self.executor.runtime().lessee;
        let mut recovered = 0;
        if holds_nothing && lessee.grants().is_empty() {
            let recovery = log.ask(Ask::recover(self.cause.clone(), lessee.owner().clone(), None)).await?;
            recovered = recovery.recovered.len() as u64;
            // Its claims go back at once: each run's unit claims it again, in turn.
            release_runs(log, lessee, &self.cause, recovery.claimed).await?;
        }
        let snapshot = log.ask(Ask::snapshot(self.cause.clone())).await?;
        let mut units: Vec<Unit> = snapshot
            .unfinished
            .iter()
            .map(|run| if run.is_agent() { Unit::Agent(run.run_id.clone()) } else { Unit::Run(run.run_id.clone()) })
            .collect();
        for key in engine::executor::due_intents(&snapshot) {
            let intent = log.ask(Ask::observe(self.cause.clone(), key.clone())).await?.intent;
            units.push(Unit::Intent { key, run_id: intent.run_id });
        }
        Ok((units, recovered))
    }

    /// One unit: claim its run, act under the lease, give the lease back.
    async fn carry_out(&self, unit: Unit) -> UnitReport {
        let run_id = unit.run_id().clone();
        let (kind, intent_key) = match &unit {
            Unit::Run(_) => (UnitKind::Run, None),
            Unit::Agent(_) => (UnitKind::AgentRun, None),
            Unit::Intent { key, .. } => (UnitKind::Intent, Some(key.clone())),
        };
        let mut report =
            UnitReport { run_id, kind, intent_key, token: None, result: UnitResult::Done, recovered: 0, intent: None };
        let runtime = self.executor.runtime();
        let grant = match claim_run(self.log(), &runtime.lessee, &self.cause, &report.run_id).await {
            Ok(grant) => grant,
            Err(error) => {
                report.result = failed(error);
                return report;
            }
        };
        report.token = Some(grant.token);
        if let Err(error) = self.act(unit, &mut report).await {
            report.result = failed(error);
        }
        if let Err(error) = self.give_back(&grant, &mut report).await {
            report.result = UnitResult::Failed(format!("cannot give its lease back: {error}"));
        }
        report
    }

    /// Gives back `grant` if this process still holds it, after asking the log whether it
    /// does: a unit whose run another process took while it worked is reported fenced (its
    /// writes from then on were refused; an answer it brought back was kept as evidence).
    async fn give_back(&self, grant: &LeaseGrant, report: &mut UnitReport) -> Result<(), WorkflowError> {
        let lessee = &self.executor.runtime().lessee;
        let held = lessee.grant(&grant.run_id).as_ref() == Some(grant);
        let lost = if held {
            let renew = Ask::renew_leases(self.cause.clone(), lessee.owner().clone(), vec![grant.clone()]);
            self.log().ask(renew).await?.lost.contains(&grant.run_id)
        } else {
            // The executor gives back a run it ended or suspended, an agent's resume its run;
            // an intent's unit keeps the lease to its end, so a grant gone from the book was
            // lost (the renewal loop found another holder).
            report.kind == UnitKind::Intent
        };
        if lost {
            lessee.forget_grant(grant);
            if report.result == UnitResult::Done {
                let why = "another process took the run over while this worker acted for it";
                report.result = UnitResult::Fenced(why.to_owned());
            }
            return Ok(());
        }
        if held {
            release_runs(self.log(), lessee, &self.cause, vec![grant.clone()]).await?;
        }
        Ok(())
    }

    /// Acts for the unit's run, whose lease this process holds.
    async fn act(&self, unit: Unit, report: &mut UnitReport) -> Result<(), WorkflowError> {
        let log = self.log();
        let cause = self.cause.clone();
        match unit {
            Unit::Agent(run_id) => {
                // The agent's own resume recovers its work in flight, under the lease it finds held.
                match self.agents.resume(&run_id).await {
                    Ok(None) => {}
                    Ok(Some(why)) => report.result = UnitResult::Failed(format!("agent run not resumed: {why}")),
                    Err(failure) => report.result = UnitResult::Failed(failure.message()),
                }
            }
            Unit::Run(run_id) => {
                self.recover(report).await?;
                // Read afresh under the lease: another worker may have ended it since the snapshot.
                let run: Run = log.ask(Ask::observe_run(cause.clone(), run_id)).await?;
                if run.status.is_some() {
                    report.result = UnitResult::Settled;
                    return Ok(());
                }
                let outcome = self.executor.resume(&run, cause).await?;
                report.intent = outcome.intent.as_ref().map(open_intent);
                if outcome.taken_over {
                    let why = "another process took the run over: this worker's finish was refused (fenced)";
                    report.result = UnitResult::Fenced(why.to_owned());
                }
            }
            Unit::Intent { key, .. } => {
                self.recover(report).await?;
                let intent: Intent = log.ask(Ask::observe(cause.clone(), key)).await?.intent;
                match self.executor.reconcile_due_intent(&intent, cause).await? {
                    Due::Done(outcome) => report.intent = Some(open_intent(&outcome)),
                    Due::NotDue => report.result = UnitResult::Settled,
                    Due::LeftAlone(left) => report.result = UnitResult::Left(left.held_by),
                }
            }
        }
        Ok(())
    }

    /// Records the unit's run's attempts and lookups in flight interrupted: this process
    /// holds the run and none of its units acts for it, so whoever sent them is gone (or
    /// lost the run).
    async fn recover(&self, report: &mut UnitReport) -> Result<(), WorkflowError> {
        let owner = self.executor.runtime().lessee.owner().clone();
        let recover = Ask::recover(self.cause.clone(), owner, Some(report.run_id.clone()));
        report.recovered = self.log().ask(recover).await?.recovered.len();
        Ok(())
    }
}

/// The units running, each task's run known by its id (so a unit that panicked still frees
/// its run).
#[derive(Default)]
struct Units {
    set: JoinSet<UnitReport>,
    runs: BTreeMap<tokio::task::Id, RunId>,
}

impl Units {
    fn start(&mut self, worker: &Arc<Worker>, unit: Unit) {
        let run_id = unit.run_id().clone();
        let worker = Arc::clone(worker);
        let task = self.set.spawn(async move { worker.carry_out(unit).await });
        self.runs.insert(task.id(), run_id);
    }

    /// Counts a unit that ended and frees its run. A unit that panicked (a bug) is counted
    /// failed; the lease it held goes back with the others when the worker stops.
    fn ended(
        &mut self,
        ended: Result<(tokio::task::Id, UnitReport), tokio::task::JoinError>,
        schedule: &mut Schedule,
        tally: &mut Tally,
        keep: bool,
    ) {
        let (id, report) = match ended {
            Ok((id, report)) => (id, Some(report)),
            Err(error) => {
                errln!("keel worker: a unit of work ended badly: {error}");
                tally.health.failed += 1;
                (error.id(), None)
            }
        };
        if let Some(run_id) = self.runs.remove(&id) {
            schedule.done(&run_id);
        }
        if let Some(report) = report {
            tally.count(report, keep);
        }
    }
}

/// The exit code of a stopped worker. One a signal stopped exits 0: its failures were
/// reported as they happened. `--once` says what the pass left: 1 when a unit failed, 2 when
/// an intent is left unknown or escalated, else 0.
fn exit_code(health: &Health, once: bool) -> u8 {
    if !once {
        exit::OK
    } else if health.failed > 0 {
        exit::INTERNAL
    } else if health.unknown > 0 {
        exit::CONTROLLED
    } else {
        exit::OK
    }
}

/// The intent an outcome names, and whether it is left open: unknown or escalated.
fn open_intent(outcome: &IntentOutcome) -> (IntentKey, bool) {
    let open = matches!(outcome.status, OutcomeStatus::Intent(IntentStatus::OutcomeUnknown | IntentStatus::Escalated));
    (outcome.intent_key.clone(), open)
}

/// An error as a unit's result: a live holder leaves the run to it, a lost lease fences.
fn failed(error: WorkflowError) -> UnitResult {
    match error {
        WorkflowError::Busy(refusal @ Refusal::LeaseHeld { .. }) => UnitResult::Left(refusal.to_string()),
        WorkflowError::Busy(refusal) => UnitResult::Fenced(refusal.to_string()),
        other => UnitResult::Failed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> Unit {
        Unit::Run(RunId::new(id))
    }

    fn intent(id: &str, run: &str) -> Unit {
        let key = IntentKey::parse(&format!("charge:t:{id}")).expect("a key");
        Unit::Intent { key, run_id: RunId::new(run) }
    }

    fn ids(schedule: &mut Schedule) -> Vec<String> {
        std::iter::from_fn(|| schedule.next()).map(|unit| unit.run_id().to_string()).collect()
    }

    #[test]
    fn a_pass_takes_every_unit_once_in_order_and_never_two_of_one_run() {
        let mut schedule = Schedule::default();
        schedule.plan(vec![run("a"), intent("intent_of_a_000", "a"), run("b"), intent("intent_of_c_000", "c")]);
        let first = schedule.next().expect("a unit");
        assert_eq!(first.run_id(), &RunId::new("a"));
        // While a's unit runs, a's intent is dropped from this pass: the next pass finds it.
        assert_eq!(ids(&mut schedule), ["b", "c"]);
        assert!(schedule.pass_over());
        assert!(!schedule.idle());
        for run_id in ["a", "b", "c"] {
            schedule.done(&RunId::new(run_id));
        }
        assert!(schedule.idle());
    }

    #[test]
    fn a_run_is_free_again_once_its_unit_is_done() {
        let mut schedule = Schedule::default();
        schedule.plan(vec![run("a")]);
        assert!(schedule.next().is_some());
        schedule.done(&RunId::new("a"));
        schedule.plan(vec![intent("intent_of_a_000", "a")]);
        assert_eq!(ids(&mut schedule), ["a"], "the run's intent gets its turn in the next pass");
    }

    #[test]
    fn a_stopping_worker_starts_nothing_more() {
        let mut schedule = Schedule::default();
        schedule.plan(vec![run("a"), run("b")]);
        schedule.stop();
        assert!(schedule.next().is_none());
        assert!(schedule.pass_over());
    }

    #[test]
    fn a_run_that_keeps_failing_the_same_way_is_told_once() {
        let mut tally = Tally::new(Worker::empty_health(State::Alive, 0));
        let report = |result| UnitReport {
            run_id: RunId::new("a"),
            kind: UnitKind::AgentRun,
            intent_key: None,
            token: Some(1),
            result,
            recovered: 0,
            intent: None,
        };
        let no_key = || report(UnitResult::Failed("ANTHROPIC_API_KEY is not set".into()));
        assert!(tally.newly_failing(&no_key()));
        assert!(!tally.newly_failing(&no_key()), "the same failure again, at the next pass");
        assert!(tally.newly_failing(&report(UnitResult::Failed("another reason".into()))));
        assert!(!tally.newly_failing(&report(UnitResult::Done)));
        assert!(tally.newly_failing(&no_key()), "failing again after a unit that did not");
    }

    #[test]
    fn once_exits_with_what_the_pass_left_a_long_running_worker_with_zero() {
        let health = |failed, unknown| Health { failed, unknown, ..Worker::empty_health(State::Stopped, 0) };
        assert_eq!(exit_code(&health(0, 0), true), exit::OK);
        assert_eq!(exit_code(&health(0, 2), true), exit::CONTROLLED, "an intent left unknown");
        assert_eq!(exit_code(&health(1, 2), true), exit::INTERNAL, "a failure wins");
        assert_eq!(exit_code(&health(1, 2), false), exit::OK, "a signal stopped it; failures were reported");
    }

    #[test]
    fn only_a_lost_lease_fences_a_live_holder_leaves_the_run_to_it() {
        let owner = engine::lease::LeaseOwner::named("other");
        let at = chrono::DateTime::from_timestamp(10, 0).expect("an instant");
        let held = Refusal::LeaseHeld { run_id: RunId::new("a"), owner: owner.clone(), expires_at: at };
        assert!(matches!(failed(WorkflowError::Busy(held)), UnitResult::Left(_)));
        let fenced = Refusal::Fenced { run_id: RunId::new("a"), presented: Some(1), current: 2, holder: owner };
        assert!(matches!(failed(WorkflowError::Busy(fenced)), UnitResult::Fenced(_)));
        assert!(matches!(failed(WorkflowError::Failed("x".into())), UnitResult::Failed(_)));
    }
}
