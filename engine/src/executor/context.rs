//! The journaled context a workflow runs in.
//!
//! Owns [`Context`] and its journaled operations — [`Context::step`], [`Context::sleep`],
//! [`Context::wait_signal`], [`Context::intent`]. Each takes the next position in the run's
//! journal: replayed, a recorded position returns its recorded output and does nothing; the
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
use crate::event::{Cause, IntentKey, RunId};
use crate::failpoints::{Failpoints, Point};
use crate::lease::{LeaseGrant, LeaseUse};
use crate::ledger::{IntentStatus, JournalEntry, Refusal, Run, RunStart};
use crate::log::{Answer, Ask, Asking, LogError};
use crate::provider::Secret;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use tracing::{Instrument, info_span};

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

    /// A durable timer: waits `ms` from the first time this position ran, across restarts,
    /// on the runtime's clock.
    ///
    /// # Errors
    ///
    /// A timer that would fire after the run's deadline, a replay mismatch, or the log's
    /// refusal.
    pub async fn sleep(&mut self, ms: u64) -> Result<(), WorkflowError> {
        let position = self.next_position();
        let fire_at = match self.recorded(position, "timer")? {
            Some(recorded) => serde_json::from_value::<DateTime<Utc>>(recorded.clone())
                .map_err(|e| WorkflowError::Undecodable { position, detail: format!("timer output: {e}") })?,
            None => {
                let fire_at = checked_plus_ms(self.runtime.clock.now(), ms).ok_or_else(|| {
                    WorkflowError::DeadlineExceeded(format!("a timer of {ms} ms fires after any deadline"))
                })?;
                self.ask(Ask::start_timer(self.run_cause(), self.run_id.clone(), position, fire_at)).await?;
                fire_at
            }
        };
        if fire_at > self.deadline_at {
            return Err(WorkflowError::DeadlineExceeded(format!("timer fires at {fire_at}, after the deadline")));
        }
        let wait_ms = ms_between(self.runtime.clock.now(), fire_at);
        if wait_ms > 0 {
            self.runtime.clock.sleep_ms(wait_ms).await;
        }
        Ok(())
    }

    /// Waits for a signal named `name`. Returns its payload once delivered (recorded, so
    /// replay returns the same one); suspends the run while none is there.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while no signal is there; a replay mismatch or the log's
    /// refusal.
    pub async fn wait_signal(&mut self, name: &str) -> Result<Value, WorkflowError> {
        let position = self.next_position();
        let step_name = format!("signal:{name}");
        if let Some(output) = self.recorded(position, &step_name)? {
            return Ok(output.clone());
        }
        if self.pending_start.is_some() {
            // A signal can only be delivered to a run that exists: start it now.
            let _: Run = self.ask(Ask::start_run(self.run_cause())).await?;
        }
        let history = self.ask(Ask::load_run(self.run_cause(), self.run_id.clone())).await?;
        let consumed = history.journal.iter().filter(|entry| entry.name == step_name).count();
        let Some(payload) = history.signals.get(name).and_then(|delivered| delivered.get(consumed)).cloned() else {
            return Err(WorkflowError::Suspended { reason: format!("waiting for signal {name:?}"), intent: None });
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
            let replayed = self.recorded(position, &format!("intent:{key}"))?.is_some();
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
            .keeping(request.payment_method.clone());
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
