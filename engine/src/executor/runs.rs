//! The run executor: starts runs, resumes them by replay, recovers what a dead process left
//! in flight, and reconciles what is due.
//!
//! Owns [`Executor`], [`RunRequest`], [`ResumeReport`], [`LeftAlone`] and [`Asleep`]. Every
//! run it drives it drives under the run's lease — the one this process holds, or one it
//! claims and gives back — and a run another live process holds is left to it and reported,
//! never touched. A run that waits on a durable timer not yet fired is not replayed either: a
//! resume pass reports it asleep, with when it wakes, and takes it on once it is due. Agent
//! runs are not resumed here: they need their transport and tools, and `keel agent resume`
//! continues them.

use super::context::Context;
use super::driver::Leased;
use super::leases::{claim_run, release_runs};
use super::outcome::{IntentOutcome, OutcomeStatus, RunEnd, RunOutcome};
use super::workflow::{Registered, Rejection, WorkflowEnd, outcome_json};
use super::{Runtime, WorkflowError};
use crate::clock::{checked_plus_ms, ms_between};
use crate::event::{Cause, IntentKey, RunId, RunLimits, RunStatus, RunVersions};
use crate::failpoints::{Failpoints, Point};
use crate::lease::{LeaseGrant, LeaseUse};
use crate::ledger::{Intent, IntentStatus, Refusal, RejectCode, Run, RunStart};
use crate::limits;
use crate::log::{Ask, Asking, LogError, Resolution, Snapshot};
use crate::policy::InForce;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::{Instrument, info_span};

/// Limits and identity for a new run.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The new run's id.
    pub run_id: RunId,
    /// Its limits.
    pub limits: RunLimits,
    /// Its deadline, counted from now.
    pub deadline_ms: u64,
    /// What caused it (`command:charge`, …).
    pub cause: Cause,
}

/// Starts, resumes and reconciles.
#[derive(Clone)]
pub struct Executor {
    runtime: Runtime,
    workflows: BTreeMap<&'static str, Registered>,
    failpoints: Failpoints,
    /// How long a charge may wait for its caller before the reconciliation pass ends it.
    abandon_after_ms: u64,
    /// The operator's policy in force in this process: a run started under another one is
    /// held to it as well when it reserves (see [`crate::policy::Governing`]).
    policy: Option<Arc<InForce>>,
}

/// What `recover_and_resume` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResumeReport {
    /// Intents whose in-flight attempt or lookup recovery recorded as interrupted.
    pub recovered: Vec<IntentKey>,
    /// Runs resumed, with their new status.
    pub resumed: Vec<RunOutcome>,
    /// Reconciliations performed, with the intents' new status.
    pub reconciled: Vec<IntentOutcome>,
    /// What was left alone because another process holds it live: the intent key or run
    /// id, and why (the holder and until when).
    pub left_to_their_owner: Vec<LeftAlone>,
    /// Runs left asleep: their durable timer has not fired (soonest first).
    pub sleeping: Vec<Asleep>,
}

/// A run a resume pass left alone because its timer has not fired yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Asleep {
    /// The run.
    pub run_id: RunId,
    /// When its timer fires: the first instant a resume pass continues it.
    pub wakes_at: DateTime<Utc>,
}

/// Something recovery left alone: another live process is working on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeftAlone {
    /// The intent key or run id.
    pub subject: String,
    /// Who holds it, in words.
    pub held_by: String,
}

impl Executor {
    /// An executor over `runtime` with the given workflows.
    pub fn new(runtime: Runtime, workflows: Vec<Registered>) -> Self {
        let workflows = workflows.into_iter().map(|w| (w.name(), w)).collect();
        Self {
            runtime,
            workflows,
            failpoints: Failpoints::disarmed(),
            abandon_after_ms: limits::ABANDON_AFTER_DEFAULT_MS,
            policy: None,
        }
    }

    /// The same executor under the operator's policy in force `policy`: a run it resumes
    /// that started under another policy (it waited on a signal, a timer, while the operator
    /// installed this one) reserves under both, the stricter of each limit winning, and its
    /// reservation records this policy's stamp. Without one, a run keeps its own limits only.
    pub fn with_policy(mut self, policy: InForce) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// The same executor ending charges that waited for their caller `ms` (instead of
    /// [`limits::ABANDON_AFTER_DEFAULT_MS`]): see [`Executor::reconcile_due`].
    pub fn with_abandon_after(mut self, ms: u64) -> Self {
        self.abandon_after_ms = ms;
        self
    }

    /// The same executor with `failpoints` armed at its event boundaries (crash tests only;
    /// the default is disarmed).
    pub fn with_failpoints(mut self, failpoints: Failpoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Starts a new run of `workflow` with a raw input. A rejected input writes nothing.
    ///
    /// # Errors
    ///
    /// An unknown workflow, the log's failure, or a workflow error other than its outcome.
    pub async fn start(
        &self,
        workflow: &str,
        raw_input: &Value,
        request: RunRequest,
    ) -> Result<RunOutcome, WorkflowError> {
        let registered = self.workflow(workflow)?;
        let prepared = match registered.prepare(raw_input) {
            Ok(prepared) => prepared,
            Err(rejection) => return Ok(rejected(request.run_id, &rejection)),
        };
        let deadline_at = checked_plus_ms(self.runtime.clock.now(), request.deadline_ms)
            .filter(|_| request.deadline_ms <= limits::RUN_DEADLINE_MAX_MS);
        let Some(deadline_at) = deadline_at else {
            let detail =
                format!("deadline_ms: {} is above the maximum of {}", request.deadline_ms, limits::RUN_DEADLINE_MAX_MS);
            let rejection = Rejection { code: RejectCode::InvalidArguments, details: vec![detail] };
            return Ok(rejected(request.run_id, &rejection));
        };
        let ctx = Context {
            runtime: self.runtime.clone(),
            run_id: request.run_id.clone(),
            workflow: workflow.to_owned(),
            pending_start: Some(RunStart {
                run_id: request.run_id.clone(),
                workflow: workflow.to_owned(),
                input: prepared.input.clone(),
                deadline_at,
                limits: request.limits.clone(),
                // The policy the run is held to, as its limits record it.
                versions: RunVersions {
                    policy: request.limits.policy.as_ref().map(|stamp| stamp.version.clone()),
                    ..RunVersions::this_release()
                },
                owner: Some(self.runtime.lessee.owner().clone()),
            }),
            journal: Vec::new(),
            position: 0,
            deadline_at,
            secrets: prepared.secrets,
            cause: request.cause,
            failpoints: self.failpoints.clone(),
            lease: None,
            policy: self.policy.clone(),
        };
        let (run_id, cause) = (request.run_id, ctx.cause.clone());
        let outcome = self.drive_run(registered, ctx, prepared.input).await?;
        // A run that suspends (a timer, a signal, an approval) gives its lease back, as a
        // resumed one does: whoever continues it later claims it, even while this process
        // lives on (`keel serve`).
        if let Some(grant) = self.runtime.lessee.grant(&run_id) {
            release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, vec![grant]).await?;
        }
        Ok(outcome)
    }

    /// Resumes one unfinished run by replaying its journal, under its lease: the one this
    /// process holds, or one it claims ([`WorkflowError::Busy`] when another process holds
    /// it live). The lease is given back when the replay stops.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Busy`], an unknown workflow, the log's failure.
    pub async fn resume(&self, run: &Run, cause: Cause) -> Result<RunOutcome, WorkflowError> {
        let registered = self.workflow(&run.workflow)?;
        let lease = match self.runtime.lessee.grant(&run.run_id) {
            Some(grant) => grant,
            None => claim_run(&*self.runtime.log, &self.runtime.lessee, &cause, &run.run_id).await?,
        };
        let history = self.runtime.log.ask(Ask::load_run(cause.clone(), run.run_id.clone())).await?;
        let ctx = Context {
            runtime: self.runtime.clone(),
            run_id: run.run_id.clone(),
            workflow: run.workflow.clone(),
            pending_start: None,
            journal: history.journal,
            position: 0,
            deadline_at: history.run.deadline_at,
            secrets: BTreeMap::new(),
            cause: cause.clone(),
            failpoints: self.failpoints.clone(),
            lease: Some(lease.clone()),
            policy: self.policy.clone(),
        };
        let outcome = match &history.run.cancel_requested {
            // An operator asked it to stop: its next guard is now, before anything is replayed.
            Some(request) => self.stop_cancelled(ctx, request.detail()).await,
            None => self.drive_run(registered, ctx, history.input).await,
        };
        // A finished run released its lease with its `RunFinished`; a suspended one is given
        // back here, so whoever continues it later can claim it.
        if self.runtime.lessee.grant(&run.run_id).is_some() {
            release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, vec![lease]).await?;
        }
        outcome
    }

    fn workflow(&self, name: &str) -> Result<Registered, WorkflowError> {
        self.workflows
            .get(name)
            .cloned()
            .ok_or_else(|| WorkflowError::Failed(format!("no workflow named {name:?} is registered")))
    }

    /// Runs (or replays) the workflow to its end or its suspension, and records the end.
    async fn drive_run(
        &self,
        workflow: Registered,
        mut ctx: Context,
        input: Value,
    ) -> Result<RunOutcome, WorkflowError> {
        let span = info_span!(
            "run",
            agent.run.id = %ctx.run_id,
            workflow = %ctx.workflow,
            budget.remaining_ms = ms_between(self.runtime.clock.now(), ctx.deadline_at),
            release.version = env!("CARGO_PKG_VERSION"),
        );
        async {
            let end = match workflow.run(&mut ctx, input).await {
                Ok(end) => end,
                Err(WorkflowError::Suspended { reason, intent }) => return Ok(suspended(&ctx, reason, intent)),
                Err(WorkflowError::Sleeping { until }) => return Ok(sleeping(&ctx, until)),
                Err(WorkflowError::DeadlineExceeded(why)) => stopped(RunStatus::DeadlineExceeded, why),
                Err(WorkflowError::Cancelled(why)) => stopped(RunStatus::Cancelled, why),
                Err(WorkflowError::Limit { status, detail }) => stopped(status, detail),
                Err(WorkflowError::Nondeterministic(refusal)) => {
                    stopped(RunStatus::NondeterministicReplay, refusal.to_string())
                }
                Err(other) => return Err(other),
            };
            let written = ctx.started();
            let (end, taken_over) = if written { self.finish(&mut ctx, end).await? } else { (end, false) };
            tracing::info!(status = end.status.as_str(), written, "run ended");
            Ok(RunOutcome {
                run_id: ctx.run_id.clone(),
                status: RunEnd::Finished(end.status),
                wakes_at: None,
                written,
                intent: end.intent,
                rejection: None,
                output: end.output,
                taken_over,
            })
        }
        .instrument(span)
        .await
    }

    /// Ends a run an operator cancelled, without replaying it.
    async fn stop_cancelled(&self, mut ctx: Context, why: String) -> Result<RunOutcome, WorkflowError> {
        let (end, taken_over) = self.finish(&mut ctx, stopped(RunStatus::Cancelled, why)).await?;
        Ok(RunOutcome {
            run_id: ctx.run_id.clone(),
            status: RunEnd::Finished(end.status),
            wakes_at: None,
            written: true,
            intent: end.intent,
            rejection: None,
            output: end.output,
            taken_over,
        })
    }

    /// Records the run's end, giving back its lease in the same commit. A run another
    /// process took while this one finished its work (this one was presumed dead) keeps what
    /// it learned; the new holder ends it, and the caller is told so (`true`: taken over).
    async fn finish(&self, ctx: &mut Context, mut end: WorkflowEnd) -> Result<(WorkflowEnd, bool), WorkflowError> {
        let detail = end.output.get("details").and_then(|d| d.get(0)).and_then(Value::as_str).map(str::to_owned);
        let lease = ctx.lease.clone().map_or(LeaseUse::None, LeaseUse::Release);
        // Out of the book before the release is asked for, so a renewal answered after the
        // release never mistakes it for a takeover.
        if let Some(grant) = &ctx.lease {
            self.runtime.lessee.forget(&grant.run_id);
        }
        let finish = Ask::finish_run(ctx.cause.clone().for_run(&ctx.run_id), ctx.run_id.clone(), end.status, detail);
        match ctx.ask_under(finish, lease).await {
            Ok(_) => Ok((end, false)),
            Err(LogError::Refused(refusal @ Refusal::Fenced { .. })) => {
                tracing::warn!(%refusal, "the run was taken over; its new holder finishes it");
                add_detail(&mut end.output, format!("{refusal}; the new holder finishes the run"));
                Ok((end, true))
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Reconciles one intent now (an operator's explicit request: even if not yet due), then
    /// takes it as far as allowed (a proven absence past the window resends with the same key
    /// when no secret is needed), under its run's lease ([`WorkflowError::Busy`] when another
    /// process holds that run live).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Busy`]; the log's failure or refusal.
    pub async fn reconcile(&self, key: &IntentKey, cause: Cause) -> Result<IntentOutcome, WorkflowError> {
        let intent = self.runtime.log.ask(Ask::observe(cause.clone(), key.clone())).await?.intent;
        let leased = Leased::for_its_run(&self.runtime, cause, &self.failpoints, intent.run_id.clone()).await?;
        let outcome = async {
            let reconcilable = intent.status == IntentStatus::OutcomeUnknown
                || (intent.status == IntentStatus::Escalated && !intent.absence_proven);
            if reconcilable && intent.capability.lookup {
                let answer = leased.driver.reconcile_now(&intent).await?;
                leased.driver.drive(answer, None).await
            } else {
                leased.driver.drive_from(&intent, None).await
            }
        }
        .await;
        leased.release().await?;
        match outcome {
            // The lookup was made; a resend its run has no time left to reconcile is not
            // started, and the intent is reported where it stands.
            Err(WorkflowError::DeadlineExceeded(why)) => {
                let now = self.runtime.log.ask(Ask::observe(Cause::command("reconcile"), key.clone())).await?.intent;
                Ok(IntentOutcome::of(&now, false).with_detail(why))
            }
            other => other,
        }
    }

    /// An operator's manual resolution of an unknown or escalated intent, checked with the
    /// provider first when it can look effects up: an answer the lookup contradicts is refused
    /// (nothing written) unless `override_reason` says why; where no lookup is possible the
    /// recorded event says the resolution is unverified. `landed` is the provider's reference
    /// proving the effect, `None` asserts it is absent.
    ///
    /// # Errors
    ///
    /// The ledger's refusal (wrong status, contradicted, …); the log's failure.
    pub async fn resolve(
        &self,
        key: &IntentKey,
        by: &str,
        reason: &str,
        landed: Option<String>,
        override_reason: Option<String>,
    ) -> Result<Intent, WorkflowError> {
        let cause = Cause::operator(by);
        let intent = self.runtime.log.ask(Ask::observe(cause.clone(), key.clone())).await?.intent;
        let lookup = if intent.capability.lookup {
            Some(self.runtime.provider.lookup(intent.definition.kind, key.as_str()).await)
        } else {
            None
        };
        let resolution = Resolution {
            key: key.clone(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            landed,
            lookup,
            override_reason,
        };
        Ok(self.runtime.log.ask(Ask::resolve(cause, resolution)).await?.intent)
    }

    /// Recovery: every attempt without an outcome whose run no live process holds becomes
    /// `outcome_unknown (crash)` exactly once, this process taking those runs' leases; then
    /// unfinished runs are replayed and due reconciliations run. What another live process
    /// holds is left to it and reported.
    ///
    /// # Errors
    ///
    /// The log's failure; a run that cannot be replayed.
    pub async fn recover_and_resume(&self, cause: Cause) -> Result<ResumeReport, WorkflowError> {
        let recover = Ask::recover(cause.clone(), self.runtime.lessee.owner().clone(), None);
        let recovery = self.runtime.log.ask(recover).await?;
        let mut report = ResumeReport {
            recovered: recovery.recovered,
            left_to_their_owner: recovery
                .held_elsewhere
                .iter()
                .map(|(key, owner)| LeftAlone { subject: key.to_string(), held_by: owner.to_string() })
                .collect(),
            ..ResumeReport::default()
        };
        for grant in &recovery.claimed {
            self.runtime.lessee.hold(grant);
        }
        self.failpoints.hit(Point::AfterRecover);
        let resumed = self.resume_all(&cause, &mut report).await;
        let still_held: Vec<LeaseGrant> =
            recovery.claimed.into_iter().filter(|grant| self.runtime.lessee.grant(&grant.run_id).is_some()).collect();
        release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, still_held).await?;
        resumed.map(|()| report)
    }

    /// Replays every unfinished workflow run, then reconciles what is due.
    async fn resume_all(&self, cause: &Cause, report: &mut ResumeReport) -> Result<(), WorkflowError> {
        let snapshot = self.runtime.log.ask(Ask::snapshot(cause.clone())).await?;
        // A run whose timer has not fired is not replayed: it would only suspend again.
        report.sleeping = snapshot
            .sleeping
            .into_iter()
            .filter(|run| !run.is_agent())
            .filter_map(|run| Some(Asleep { wakes_at: run.wake_at?, run_id: run.run_id }))
            .collect();
        for run in snapshot.unfinished.into_iter().filter(|run| !run.is_agent()) {
            match self.resume(&run, cause.clone()).await {
                Ok(outcome) => report.resumed.push(outcome),
                Err(WorkflowError::Busy(refusal)) => report
                    .left_to_their_owner
                    .push(LeftAlone { subject: run.run_id.to_string(), held_by: refusal.to_string() }),
                Err(other) => return Err(other),
            }
        }
        let (reconciled, busy) = self.reconcile_due_reporting(cause.clone()).await?;
        report.reconciled = reconciled;
        report.left_to_their_owner.extend(busy);
        Ok(())
    }

    /// Reconciles every intent whose reconciliation is due, at most
    /// [`limits::RECONCILE_PASS_MAX`] per pass, and takes on the charges reserved that nobody
    /// is sending, at most [`limits::WAITING_PASS_MAX`]: each is sent with the payment method
    /// the log's vault kept, or, waiting for its caller past the abandonment window, ended
    /// (rejected `abandoned` when it has no effect, escalated otherwise). An intent whose run
    /// another live process holds is left to it.
    ///
    /// # Errors
    ///
    /// The log's failure.
    pub async fn reconcile_due(&self, cause: Cause) -> Result<Vec<IntentOutcome>, WorkflowError> {
        Ok(self.reconcile_due_reporting(cause).await?.0)
    }

    async fn reconcile_due_reporting(
        &self,
        cause: Cause,
    ) -> Result<(Vec<IntentOutcome>, Vec<LeftAlone>), WorkflowError> {
        let mut outcomes = Vec::new();
        let mut busy = Vec::new();
        let snapshot = self.runtime.log.ask(Ask::snapshot(cause.clone())).await?;
        for key in due_intents(&snapshot) {
            let intent = self.runtime.log.ask(Ask::observe(cause.clone(), key.clone())).await?.intent;
            match self.reconcile_due_intent(&intent, cause.clone()).await? {
                Due::Done(outcome) => outcomes.push(outcome),
                Due::LeftAlone(left) => busy.push(left),
                Due::NotDue => {}
            }
        }
        Ok((outcomes, busy))
    }

    /// Reconciles one intent of a reconciliation pass, read just before (`intent`), if it
    /// is still due or still a charge nobody is sending; see [`Executor::reconcile_due`].
    /// Under its run's lease: the one this process holds (kept), or one claimed for the time
    /// of the work and given back.
    ///
    /// # Errors
    ///
    /// The log's failure.
    pub async fn reconcile_due_intent(&self, intent: &Intent, cause: Cause) -> Result<Due, WorkflowError> {
        let key = intent.key();
        let now = self.runtime.clock.now();
        let unsent_charge = intent.status == IntentStatus::Reserved && intent.definition.kind.needs_payment_method();
        if !intent.reconcile_due(now) && !unsent_charge {
            return Ok(Due::NotDue); // Someone else got to it first, or nothing is left to do here.
        }
        let left_alone =
            |refusal: Refusal| Due::LeftAlone(LeftAlone { subject: key.to_string(), held_by: refusal.to_string() });
        let leased =
            match Leased::for_its_run(&self.runtime, cause.clone(), &self.failpoints, intent.run_id.clone()).await {
                Ok(leased) => leased,
                Err(WorkflowError::Busy(refusal)) => return Ok(left_alone(refusal)),
                Err(other) => return Err(other),
            };
        let outcome = match leased.driver.drive_from(intent, None).await {
            Ok(outcome) => self.abandon_if_due(&leased, key, outcome).await,
            failed => failed,
        };
        leased.release().await?;
        match outcome {
            Ok(outcome) => Ok(Due::Done(outcome)),
            // A resend its run has no time left to reconcile is not started: the intent
            // stays where it is, and recovery goes on with the others.
            Err(WorkflowError::DeadlineExceeded(why)) => {
                let now = self.runtime.log.ask(Ask::observe(cause, key.clone())).await?.intent;
                Ok(Due::Done(IntentOutcome::of(&now, false).with_detail(why)))
            }
            Err(WorkflowError::Busy(refusal)) => Ok(left_alone(refusal)),
            Err(other) => Err(other),
        }
    }
}

/// The intents one reconciliation pass takes on, in order: those due for reconciliation (at
/// most [`limits::RECONCILE_PASS_MAX`]), then the charges reserved that nobody is sending (at
/// most [`limits::WAITING_PASS_MAX`]).
pub fn due_intents(snapshot: &Snapshot) -> Vec<IntentKey> {
    let due = snapshot.due.iter().take(limits::RECONCILE_PASS_MAX);
    let waiting = snapshot.waiting.iter().take(limits::WAITING_PASS_MAX);
    due.chain(waiting).cloned().collect()
}

/// What one intent of a reconciliation pass came to ([`Executor::reconcile_due_intent`]).
#[derive(Clone, Debug)]
pub enum Due {
    /// Reconciled (or sent, or ended), with where it stands now.
    Done(IntentOutcome),
    /// No longer due: another process got to it first, or nothing is left to do.
    NotDue,
    /// Another live process holds its run.
    LeftAlone(LeftAlone),
}

impl Executor {
    /// Ends a charge that still waits for its caller once it has waited the abandonment
    /// window (the ledger decides: abandoned when it has no effect, escalated otherwise); one
    /// whose window is still open is reported with when it closes.
    async fn abandon_if_due(
        &self,
        leased: &Leased<'_>,
        key: &IntentKey,
        outcome: IntentOutcome,
    ) -> Result<IntentOutcome, WorkflowError> {
        // Only an intent left reserved or unknown may wait for its caller: nothing to read for
        // the others.
        let open =
            matches!(outcome.status, OutcomeStatus::Intent(IntentStatus::Reserved | IntentStatus::OutcomeUnknown));
        if !open {
            return Ok(outcome);
        }
        let driver = &leased.driver;
        let intent = driver.observe(key).await?.intent;
        if !intent.waits_for_payment_method(self.runtime.clock.now()) {
            return Ok(outcome);
        }
        let ask = Ask::abandon(driver.cause.clone(), key.clone(), driver.run_id.clone(), self.abandon_after_ms)
            .under(driver.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold));
        match self.runtime.log.ask(ask).await {
            Ok(answer) => {
                tracing::warn!(
                    effect.idempotency_key_hash = %key.hash(),
                    status = answer.intent.status.as_str(),
                    "nobody re-submitted the charge within the abandonment window"
                );
                Ok(IntentOutcome::of(&answer.intent, false))
            }
            Err(LogError::Refused(Refusal::WaitingWindowOpen { until, .. })) => Ok(outcome.with_detail(format!(
                "unless it is re-submitted, it is abandoned (or escalated, if its effect is not proven absent) after {}",
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ))),
            Err(LogError::Refused(refusal)) if refusal.may_be_a_race() => Ok(outcome),
            Err(other) => Err(other.into()),
        }
    }
}

/// A run refused before anything was written.
fn rejected(run_id: RunId, rejection: &Rejection) -> RunOutcome {
    RunOutcome {
        run_id,
        status: RunEnd::Finished(RunStatus::Rejected),
        wakes_at: None,
        written: false,
        intent: None,
        rejection: Some(rejection.clone()),
        output: json!({ "status": "rejected", "code": rejection.code.as_str(), "details": rejection.details }),
        taken_over: false,
    }
}

/// A run that waits: what its caller is told meanwhile.
fn suspended(ctx: &Context, reason: String, intent: Option<Box<IntentOutcome>>) -> RunOutcome {
    let output = match intent.as_deref().map(outcome_json) {
        Some(Ok(output)) => output,
        _ => json!({ "status": "suspended", "details": [reason] }),
    };
    RunOutcome {
        run_id: ctx.run_id.clone(),
        status: RunEnd::Suspended,
        wakes_at: None,
        written: ctx.started(),
        intent: intent.map(|i| *i),
        rejection: None,
        output,
        taken_over: false,
    }
}

/// A run that waits on its durable timer: when it fires, and that `keel resume` continues
/// it then.
fn sleeping(ctx: &Context, until: DateTime<Utc>) -> RunOutcome {
    let when = until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let detail = format!("its timer fires at {when}: `keel resume` continues it from then on");
    RunOutcome {
        run_id: ctx.run_id.clone(),
        status: RunEnd::Suspended,
        wakes_at: Some(until),
        written: ctx.started(),
        intent: None,
        rejection: None,
        output: json!({ "status": "suspended", "wakes_at": when, "details": [detail] }),
        taken_over: false,
    }
}

/// A run the executor stops (deadline, nondeterminism), with why.
fn stopped(status: RunStatus, why: String) -> WorkflowEnd {
    WorkflowEnd { status, output: json!({ "status": status.as_str(), "details": [why] }), intent: None }
}

/// Adds a detail line to a workflow's output.
fn add_detail(output: &mut Value, detail: String) {
    if let Some(details) = output.get_mut("details").and_then(Value::as_array_mut) {
        details.push(Value::String(detail));
    } else if let Some(map) = output.as_object_mut() {
        map.insert("details".into(), json!([detail]));
    }
}
