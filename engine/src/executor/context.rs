//! The journaled context a workflow runs in.
//!
//! Owns [`Context`] and its journaled operations — [`Context::step`], [`Context::sleep`],
//! [`Context::wait_signal`], [`Context::intent`], [`Context::billed_call`] — and [`Billed`].
//! Each takes the next position in the run's journal: replayed, a recorded position returns its recorded output and does nothing; the
//! first unrecorded one proceeds. Asked for another step than the one recorded, it stops the
//! run `nondeterministic_replay`, never silently. Time is read and waited on through the
//! runtime's [`crate::clock::Clock`], never tokio's timer directly, so tests drive it.
//!
//! A new run is written with its first durable command (so a proposal rejected first leaves
//! nothing behind); from then on every write for it presents its lease.

use super::driver::{self, Driver, Reservation};
use super::outcome::IntentOutcome;
use super::workflow::IntentRequest;
use super::{Runtime, WorkflowError};
use crate::clock::{checked_plus_ms, ms_between};
use crate::event::{Cause, IntentKey, RunId, SignalName};
use crate::failpoints::{Failpoints, Point};
use crate::lease::{LeaseGrant, LeaseUse};
use crate::ledger::{IntentStatus, JournalEntry, Refusal, Run, RunStart};
use crate::limits;
use crate::log::{Answer, Ask, Asking, LogError};
use crate::policy::InForce;
use crate::provider::Secret;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use tracing::{Instrument, info_span};

/// What [`Context::billed_call`] hands back: every hold the call reserved (more than one
/// when a process died during an earlier try, which may have been billed) and its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Billed<H, T> {
    /// The holds, in the order they were reserved; the answered try's is the last.
    pub holds: Vec<H>,
    /// The answer.
    pub answer: T,
    /// Whether the answer was read from the journal (the call was not made by this process).
    pub replayed: bool,
}

/// The journaled context a workflow runs in.
pub struct Context {
    pub(super) runtime: Runtime,
    pub(super) run_id: RunId,
    pub(super) workflow: String,
    /// The run to start with the first durable command (so a rejected first proposal leaves
    /// nothing behind). `None` once started.
    pub(super) pending_start: Option<RunStart>,
    pub(super) journal: Vec<JournalEntry>,
    pub(super) position: u32,
    pub(super) deadline_at: DateTime<Utc>,
    pub(super) secrets: BTreeMap<String, Secret>,
    pub(super) cause: Cause,
    pub(super) failpoints: Failpoints,
    /// The run's lease, once this process holds it: every write for the run presents it.
    pub(super) lease: Option<LeaseGrant>,
    /// The operator's policy in force in this process, which a reservation is decided under
    /// beside the run's own (see [`crate::policy::Governing`]).
    pub(super) policy: Option<Arc<InForce>>,
}

impl Context {
    /// The run's id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// A secret handed to this invocation, if any.
    pub fn secret(&self, name: &str) -> Option<Secret> {
        self.secrets.get(name).cloned()
    }

    /// The run's absolute deadline.
    pub fn deadline_at(&self) -> DateTime<Utc> {
        self.deadline_at
    }

    /// Whether the run has written anything yet.
    pub fn started(&self) -> bool {
        self.pending_start.is_none()
    }

    /// Runs `body` once and records its output; on replay returns the recorded output.
    ///
    /// # Errors
    ///
    /// A replay that asks for another step, a recorded output that no longer decodes, the
    /// deadline, or the log's refusal.
    pub async fn step<T, F, Fut>(&mut self, name: &str, body: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let position = self.next_position();
        if let Some(output) = self.recorded(position, name)? {
            return serde_json::from_value(output.clone())
                .map_err(|e| WorkflowError::Undecodable { position, detail: e.to_string() });
        }
        self.check_deadline()?;
        let value = body().await;
        let output = serde_json::to_value(&value).map_err(|e| WorkflowError::Failed(format!("step {name}: {e}")))?;
        self.ask(Ask::record_step(self.run_cause(), self.run_id.clone(), position, name.to_owned(), output)).await?;
        Ok(value)
    }

    /// One call to a service that bills for it (a model), journaled so that replay never
    /// makes it again. Reserve before spend: `admit` names what the call may spend (its
    /// hold, as the caller counts it), recorded at this position (`reserve:NAME`) before
    /// `call` runs; the answer is recorded at the next (`answer:NAME`). Replayed, a recorded
    /// answer is returned with its holds and `call` never runs.
    ///
    /// A reservation with no answer after it (the process died during the call) may have
    /// been billed: it stays spent — returned in [`Billed::holds`] with the others — and
    /// the call is reserved again, `admit` being given the holds already spent so it can
    /// refuse when the budget is gone. So a caller that counts every hold and answer it is
    /// handed rebuilds its budget from the journal: a restart never refills it.
    ///
    /// # Errors
    ///
    /// `admit`'s refusal (nothing written), the deadline, a replay that asks for another
    /// step, a recorded value that no longer decodes, or the log's refusal.
    pub async fn billed_call<H, T, A, F, Fut>(
        &mut self,
        name: &str,
        admit: A,
        call: F,
    ) -> Result<Billed<H, T>, WorkflowError>
    where
        H: Serialize + DeserializeOwned,
        T: Serialize + DeserializeOwned,
        A: FnOnce(&[H]) -> Result<H, WorkflowError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let (reserve, answer) = (format!("reserve:{name}"), format!("answer:{name}"));
        let mut holds: Vec<H> = Vec::new();
        fn decode<V: DeserializeOwned>(value: &Value, position: u32) -> Result<V, WorkflowError> {
            serde_json::from_value(value.clone())
                .map_err(|e| WorkflowError::Undecodable { position, detail: e.to_string() })
        }
        while let Some(entry) = self.journal.get(self.position as usize) {
            let position = self.position;
            if entry.name == reserve {
                holds.push(decode(&entry.output, position)?);
            } else if entry.name == answer && !holds.is_empty() {
                let answered = decode(&entry.output, position)?;
                self.position += 1;
                return Ok(Billed { holds, answer: answered, replayed: true });
            } else {
                let asked = if holds.is_empty() { reserve } else { answer };
                return Err(WorkflowError::Nondeterministic(Refusal::Nondeterministic {
                    position,
                    recorded: entry.name.clone(),
                    asked,
                }));
            }
            self.position += 1;
        }
        self.check_deadline()?;
        let hold = admit(&holds)?;
        let encode = |what: &str, value: serde_json::Result<Value>| {
            value.map_err(|e| WorkflowError::Failed(format!("{what} of billed call {name}: {e}")))
        };
        let position = self.next_position();
        let recorded = encode("the hold", serde_json::to_value(&hold))?;
        self.ask(Ask::record_step(self.run_cause(), self.run_id.clone(), position, reserve, recorded)).await?;
        holds.push(hold);
        let answered = call().await;
        let position = self.next_position();
        let recorded = encode("the answer", serde_json::to_value(&answered))?;
        self.ask(Ask::record_step(self.run_cause(), self.run_id.clone(), position, answer, recorded)).await?;
        self.failpoints.hit(Point::AfterCallAnswered);
        Ok(Billed { holds, answer: answered, replayed: false })
    }

    /// A durable timer: waits `ms` from the first time this position ran, across restarts,
    /// on the runtime's clock. The fire time is recorded (`TimerStarted`) before any wait and
    /// read back on replay, never recomputed, so a restart never moves it. A wait of at most
    /// [`limits::TIMER_IN_PROCESS_MAX_MS`] is spent asleep here; a longer one suspends the
    /// run until the fire time ([`WorkflowError::Sleeping`]), and `keel resume` continues it
    /// once it is due.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Sleeping`] while a long timer has not fired; a timer that would fire
    /// after the run's deadline (refused before it is recorded), a replay mismatch, or the
    /// log's refusal.
    pub async fn sleep(&mut self, ms: u64) -> Result<(), WorkflowError> {
        let position = self.next_position();
        let fire_at = match self.recorded(position, "timer")? {
            Some(recorded) => serde_json::from_value::<DateTime<Utc>>(recorded.clone())
                .map_err(|e| WorkflowError::Undecodable { position, detail: format!("timer output: {e}") })?,
            None => {
                let fire_at = checked_plus_ms(self.runtime.clock.now(), ms)
                    .filter(|at| *at <= self.deadline_at)
                    .ok_or_else(|| timer_past_deadline(ms, self.deadline_at))?;
                self.ask(Ask::start_timer(self.run_cause(), self.run_id.clone(), position, fire_at)).await?;
                self.failpoints.hit(Point::AfterTimerStarted);
                fire_at
            }
        };
        // A recorded timer past a deadline an earlier build let through stops here too.
        if fire_at > self.deadline_at {
            return Err(timer_past_deadline(ms, self.deadline_at));
        }
        let wait_ms = ms_between(self.runtime.clock.now(), fire_at);
        if wait_ms > limits::TIMER_IN_PROCESS_MAX_MS {
            return Err(WorkflowError::Sleeping { until: fire_at });
        }
        if wait_ms > 0 {
            self.runtime.clock.sleep_ms(wait_ms).await;
        }
        Ok(())
    }

    /// Waits for a signal named `name`. Returns its payload once delivered (recorded, so
    /// replay returns the same one); suspends the run while none is there, and only until
    /// the run's deadline: a wait not over by then stops the run `deadline_exceeded` (the
    /// ledger refuses a signal that comes after it).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while no signal is there;
    /// [`WorkflowError::DeadlineExceeded`] once the deadline has passed; a replay mismatch or
    /// the log's refusal.
    pub async fn wait_signal(&mut self, name: &SignalName) -> Result<Value, WorkflowError> {
        let position = self.next_position();
        let step_name = format!("signal:{name}");
        if let Some(output) = self.recorded(position, &step_name)? {
            return Ok(output.clone());
        }
        self.check_deadline()?;
        if self.pending_start.is_some() {
            // A signal can only be delivered to a run that exists: start it now.
            let _: Run = self.ask(Ask::start_run(self.run_cause())).await?;
        }
        let history = self.ask(Ask::load_run(self.run_cause(), self.run_id.clone())).await?;
        let consumed = history.journal.iter().filter(|entry| entry.name == step_name).count();
        let Some(payload) = history.signals.get(name.as_str()).and_then(|delivered| delivered.get(consumed)).cloned()
        else {
            let reason =
                format!("waiting for signal {name:?}: `keel signal {} {name} --by NAME` delivers it", self.run_id);
            return Err(WorkflowError::Suspended { reason, intent: None });
        };
        self.ask(Ask::record_step(self.run_cause(), self.run_id.clone(), position, step_name, payload.clone())).await?;
        Ok(payload)
    }

    /// Runs an intent through its lifecycle as far as Keel may take it now: reservation
    /// (atomic with the journal entry), deduplication, write-ahead attempts, outcome
    /// classification, reconciliation when due.
    ///
    /// # Errors
    ///
    /// The deadline, a replay mismatch, a lease another process holds, or the log's failure.
    /// A proposal the ledger rejects is an outcome (`rejected`), not an error.
    pub async fn intent(&mut self, request: IntentRequest) -> Result<IntentOutcome, WorkflowError> {
        let key = IntentKey::new(request.kind, &request.tenant, &request.intent_id);
        let span = info_span!(
            "intent",
            agent.intent.id = %request.intent_id,
            agent.run.id = %self.run_id,
            effect.idempotency_key_hash = %key.hash(),
            tool.name = request.kind.as_str(),
            validation.outcome = tracing::field::Empty,
            validation.error_code = tracing::field::Empty,
            retry.prevented = tracing::field::Empty,
            budget.remaining_ms = ms_between(self.runtime.clock.now(), self.deadline_at),
            budget.remaining_attempts = tracing::field::Empty,
            budget.remaining_reconciliations = tracing::field::Empty,
        );
        async {
            let position = self.next_position();
            let replayed = self.recorded(position, &key.journal_step())?.is_some();
            let answer = if replayed {
                self.driver().observe(&key).await?
            } else {
                match self.reserve(position, &key, &request).await? {
                    Reservation::Rejected(outcome) => return Ok(outcome),
                    Reservation::Reserved(answer) => *answer,
                }
            };
            let span = tracing::Span::current();
            span.record("validation.outcome", "accepted");
            let deduplicated = !answer.fresh && answer.intent.status == IntentStatus::Validated;
            if deduplicated {
                tracing::info!("same key and fingerprint already validated: stored result returned");
                return Ok(IntentOutcome::of(&answer.intent, true));
            }
            let outcome = self.driver().drive(answer, request.payment_method.as_ref()).await?;
            span.record("budget.remaining_attempts", outcome.attempts_max.saturating_sub(outcome.attempts));
            span.record(
                "budget.remaining_reconciliations",
                outcome.reconciliations_max.saturating_sub(outcome.reconciliations),
            );
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    /// Reserves the intent at `position`, starting the run with it if it is new. With
    /// everything needed to send at hand, the first attempt is written ahead in the
    /// reservation's own commit (the canary, which breaks write-ahead, never does).
    async fn reserve(
        &mut self,
        position: u32,
        key: &IntentKey,
        request: &IntentRequest,
    ) -> Result<Reservation, WorkflowError> {
        self.check_deadline()?;
        let start_attempt = cfg!(not(feature = "canary-skip-write-ahead"))
            && (!request.kind.needs_payment_method() || request.payment_method.is_some());
        let spec = driver::intent_spec(&self.runtime, key, request, false);
        let reserve = Ask::reserve(self.run_cause(), self.run_id.clone(), position, spec, start_attempt)
            .starting(self.pending_start.clone())
            .under(self.lease_use())
            .keeping(request.payment_method.clone())
            .governed_by(self.policy.as_ref().map(|policy| policy.governing(&request.tenant, request.kind)));
        let reservation = driver::reserve(&self.runtime, key, reserve).await?;
        if let Reservation::Reserved(answer) = &reservation {
            self.started_now();
            // Proposed again while validated, in flight or unknown: no new attempt.
            let prevented = !answer.fresh
                && matches!(
                    answer.intent.status,
                    IntentStatus::Validated
                        | IntentStatus::Attempting
                        | IntentStatus::OutcomeUnknown
                        | IntentStatus::Reconciling
                );
            tracing::Span::current().record("retry.prevented", prevented);
            if answer.fresh || answer.intent.status != IntentStatus::Validated {
                self.failpoints.hit(Point::AfterReservation);
            }
        }
        Ok(reservation)
    }

    /// The intent driver acting for this run, under its lease.
    fn driver(&self) -> Driver<'_> {
        Driver {
            runtime: &self.runtime,
            cause: self.run_cause(),
            failpoints: &self.failpoints,
            run_id: self.run_id.clone(),
            lease: self.lease.clone(),
            deadline_at: Some(self.deadline_at),
        }
    }

    fn next_position(&mut self) -> u32 {
        let position = self.position;
        self.position += 1;
        position
    }

    fn recorded(&self, position: u32, asked: &str) -> Result<Option<&Value>, WorkflowError> {
        match self.journal.get(position as usize) {
            None => Ok(None),
            Some(entry) if entry.name == asked => Ok(Some(&entry.output)),
            Some(entry) => Err(WorkflowError::Nondeterministic(Refusal::Nondeterministic {
                position,
                recorded: entry.name.clone(),
                asked: asked.to_owned(),
            })),
        }
    }

    fn run_cause(&self) -> Cause {
        self.cause.clone().for_run(&self.run_id)
    }

    fn lease_use(&self) -> LeaseUse {
        self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold)
    }

    /// Sends `ask` for this run: starting it if it is not yet, under its lease.
    async fn ask<A: Answer + Send>(&mut self, ask: Ask<A>) -> Result<A, LogError> {
        self.ask_under(ask, self.lease_use()).await
    }

    pub(super) async fn ask_under<A: Answer + Send>(&mut self, ask: Ask<A>, lease: LeaseUse) -> Result<A, LogError> {
        let answer = self.runtime.log.ask(ask.starting(self.pending_start.clone()).under(lease)).await?;
        self.started_now();
        Ok(answer)
    }

    /// The run exists from now on; when this command started it, this process holds its
    /// lease with the first fencing token.
    fn started_now(&mut self) {
        if let Some(start) = self.pending_start.take()
            && start.owner.is_some()
        {
            let grant = LeaseGrant { run_id: start.run_id, token: 1 };
            self.runtime.lessee.hold(&grant);
            self.lease = Some(grant);
        }
    }

    fn check_deadline(&self) -> Result<(), WorkflowError> {
        let now = self.runtime.clock.now();
        if now >= self.deadline_at {
            return Err(WorkflowError::DeadlineExceeded(format!("deadline {} passed", self.deadline_at)));
        }
        Ok(())
    }
}

/// Why a timer is refused (before it is recorded): it would fire after the run's deadline.
fn timer_past_deadline(ms: u64, deadline_at: DateTime<Utc>) -> WorkflowError {
    WorkflowError::DeadlineExceeded(format!("a timer of {ms} ms would fire after the run's deadline {deadline_at}"))
}
