//! Journaled workflows and the replaying executor.
//!
//! Owns [`Workflow`] (an async function over a [`Context`]), the context's journaled
//! operations — [`Context::step`], [`Context::intent`], [`Context::sleep`],
//! [`Context::wait_signal`] — and [`Executor`], which starts runs, resumes them after a crash
//! by re-running the function against its journal, and drives intents through their
//! lifecycle ([`Executor::reconcile`], [`Executor::recover_and_resume`]).
//!
//! # Replay
//!
//! Every journaled operation takes the next position in the run's journal. On resume the
//! function runs again from the top: a position already recorded returns its recorded
//! output without doing anything; the first unrecorded one proceeds. If the code asks for a
//! different step than the one recorded at a position, the run stops
//! `nondeterministic_replay` — never silently.
//!
//! # Order of effects
//!
//! Decide, persist, then act: `AttemptStarted` is durable before the provider is called; the
//! outcome is recorded after. A transport failure is recorded as `OutcomeUnknown`, never as a
//! failure, and the next step is a lookup, never a blind resend.
//!
//! # Secrets
//!
//! Secrets (payment method tokens) live in the [`Context`] of the invocation that received
//! them and nowhere else: the run's stored input holds their hashes. A resumed run without
//! the secret can reconcile but not resend; the caller re-presents the same request (same
//! key, same fingerprint) and that invocation drives the next attempt.
//!
//! This module does no I/O of its own: it talks to the log through [`EventLog`] and to the
//! provider through [`PaymentProvider`].

use crate::clock::{Clock, checked_plus_ms, ms_between};
use crate::event::{Cause, IntentDefinition, IntentKey, RunId, RunLimits, RunStatus, Source};
use crate::failpoints::{Failpoints, Point};
use crate::lease::{LeaseGrant, LeaseUse, Lessee};
use crate::ledger::{Action, Command, Intent, IntentSpec, IntentStatus, Refusal, RejectCode, Reply, Run, RunStart};
use crate::log::{EventLog, LogError};
use crate::provider::{BoxFuture, CallOutcome, EffectKind, EffectRequest, LookupOutcome, PaymentProvider, Secret};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use tracing::{Instrument, info_span};

/// The outcome status of an intent whose provider could not be reached within the run's
/// network retries: nothing was sent, the intent stays reserved for a new submission.
pub const PROVIDER_UNAVAILABLE: &str = "provider_unavailable";

/// What a workflow run needs from the outside world.
#[derive(Clone)]
pub struct Runtime {
    /// The durable log.
    pub log: Arc<dyn EventLog>,
    /// The payment provider.
    pub provider: Arc<dyn PaymentProvider>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// This process's identity and the run leases it holds.
    pub lessee: Lessee,
}

/// Why a workflow stopped without an outcome of its own.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// Replayed code asked for another step than the one recorded.
    #[error(transparent)]
    Nondeterministic(Refusal),
    /// The run cannot go on now (waiting for a signal, an approval, a resubmission); it stays
    /// open and `keel resume` continues it.
    #[error("suspended: {reason}")]
    Suspended {
        /// Why, and what would continue it.
        reason: String,
        /// What the caller is told meanwhile (an intent's outcome when one is waiting).
        output: Option<Value>,
    },
    /// The run's deadline passed.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// A recorded output no longer decodes into the type the code asks for.
    #[error("recorded output at position {position} does not decode: {detail}")]
    Undecodable {
        /// The position.
        position: u32,
        /// The decoder's message.
        detail: String,
    },
    /// Another process holds the run's lease live (it is working on it), or took it from
    /// this one: this process must not act for the run.
    #[error(transparent)]
    Busy(Refusal),
    /// The log failed.
    #[error(transparent)]
    Log(LogError),
    /// The workflow's own logic failed.
    #[error("workflow failed: {0}")]
    Failed(String),
}

impl From<LogError> for WorkflowError {
    fn from(error: LogError) -> Self {
        match error {
            LogError::Refused(refusal @ Refusal::Nondeterministic { .. }) => Self::Nondeterministic(refusal),
            LogError::Refused(refusal @ (Refusal::Fenced { .. } | Refusal::LeaseHeld { .. })) => Self::Busy(refusal),
            other => Self::Log(other),
        }
    }
}

/// How a workflow ended, in its own words.
#[derive(Clone, Debug, Serialize)]
pub struct WorkflowEnd {
    /// The run's final status.
    pub status: RunStatus,
    /// What the workflow returns to its caller.
    pub output: Value,
}

/// A prepared workflow input: what is stored, and the secrets kept in memory.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    /// The input as stored in `RunStarted` (secrets replaced by their hashes).
    pub stored_input: Value,
    /// Secrets for this invocation only, by name.
    pub secrets: BTreeMap<String, Secret>,
}

/// A proposal refused before anything was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// Why.
    pub code: RejectCode,
    /// Details, one per problem.
    pub details: Vec<String>,
}

/// A journaled workflow: an async function over a [`Context`].
pub trait Workflow: Send + Sync {
    /// The registered name (stored in `RunStarted`).
    fn name(&self) -> &'static str;

    /// Validates a raw input and splits off its secrets. A rejection writes nothing.
    fn prepare(&self, raw: &Value) -> Result<Prepared, Rejection>;

    /// Runs (or replays) the workflow. `input` is the stored input.
    fn run<'a>(&'a self, ctx: &'a mut Context, input: Value) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>>;
}

/// What the caller asks of an intent.
#[derive(Clone, Debug)]
pub struct IntentRequest {
    /// Charge or refund.
    pub kind: EffectKind,
    /// Tenant.
    pub tenant: String,
    /// The caller's intent id.
    pub intent_id: String,
    /// The order.
    pub order_id: String,
    /// The business reference a second key may not use while this one is pending.
    pub business_ref: String,
    /// Amount, minor units.
    pub amount_minor: i64,
    /// Currency.
    pub currency: String,
    /// The effect-defining payload (secrets hashed); its canonical hash is the fingerprint.
    pub payload: Value,
    /// The payment method, when the effect needs one.
    pub payment_method: Option<Secret>,
}

/// Where an intent stands after Keel did everything it may do now.
#[derive(Clone, Debug, Serialize)]
pub struct IntentOutcome {
    /// The intent key.
    pub intent_key: String,
    /// `validated`, `rejected`, `declined`, `outcome_unknown`, `escalated`, `cancelled`,
    /// `awaiting_approval`, `pending`… (the intent's status, or `rejected` when refused, or
    /// [`PROVIDER_UNAVAILABLE`] when no request could reach the provider).
    pub status: String,
    /// How it was validated: `provider`, `deduplicated` or `reconciled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The rejection code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub attempts_max: u32,
    /// Reconciliations made.
    pub reconciliations: u32,
    /// Reconciliations allowed before escalation.
    pub reconciliations_max: u32,
    /// The provider's reference, once proven.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<String>,
    /// When the next reconciliation is due.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconcile_after: Option<DateTime<Utc>>,
    /// Human detail.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

impl IntentOutcome {
    fn of(intent: &Intent, deduplicated: bool) -> Self {
        let source = intent.source.map(|s| {
            if deduplicated {
                "deduplicated".to_owned()
            } else {
                match s {
                    Source::Provider => "provider".to_owned(),
                    Source::Reconciled => "reconciled".to_owned(),
                }
            }
        });
        Self {
            intent_key: intent.key().to_string(),
            status: intent.status.as_str().to_owned(),
            source,
            code: intent.decline_code.clone(),
            attempts: intent.attempts,
            attempts_max: intent.attempts_max,
            reconciliations: intent.reconciliations,
            reconciliations_max: intent.reconciliations_max,
            provider_ref: intent.evidence.as_ref().map(|e| e.provider_ref.clone()),
            reconcile_after: intent.reconcile_after,
            details: intent.note.iter().cloned().collect(),
        }
    }

    fn rejected(key: &IntentKey, code: RejectCode, detail: String) -> Self {
        Self {
            intent_key: key.to_string(),
            status: "rejected".to_owned(),
            source: None,
            code: Some(code.as_str().to_owned()),
            attempts: 0,
            attempts_max: 0,
            reconciliations: 0,
            reconciliations_max: 0,
            provider_ref: None,
            reconcile_after: None,
            details: vec![detail],
        }
    }

    /// The provider could not be reached within the run's network retries: nothing was sent.
    fn unreachable(intent: &Intent, retries: u32) -> Self {
        let mut outcome = Self::of(intent, false).with_detail(format!(
            "the provider could not be reached ({} attempt(s) proven never sent, {retries} network retries): no \
             request left, the intent stays reserved; re-submit the same request (same key, same payload) to try \
             again",
            intent.not_sent
        ));
        outcome.status = PROVIDER_UNAVAILABLE.to_owned();
        outcome
    }

    fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.details.push(detail.into());
        self
    }

    /// The run status this outcome implies when it is the run's last word.
    pub fn run_status(&self) -> RunStatus {
        match self.status.as_str() {
            "validated" => RunStatus::Completed,
            "rejected" => RunStatus::Rejected,
            "declined" => RunStatus::Declined,
            "escalated" => RunStatus::Escalated,
            "cancelled" => RunStatus::Cancelled,
            PROVIDER_UNAVAILABLE => RunStatus::ProviderUnavailable,
            _ => RunStatus::OutcomeUnknown,
        }
    }
}

/// The journaled context a workflow runs in.
pub struct Context {
    runtime: Runtime,
    run_id: RunId,
    workflow: String,
    /// The run to start with the first durable command (so a rejected first proposal leaves
    /// nothing behind). `None` once started.
    pending_start: Option<RunStart>,
    journal: Vec<crate::ledger::JournalEntry>,
    position: u32,
    deadline_at: DateTime<Utc>,
    secrets: BTreeMap<String, Secret>,
    cause: Cause,
    failpoints: Failpoints,
    /// The run's lease, once this process holds it: every write for the run presents it.
    lease: Option<LeaseGrant>,
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

    async fn execute(&mut self, action: Action) -> Result<Reply, LogError> {
        self.execute_under(action, self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold)).await
    }

    async fn execute_under(&mut self, action: Action, lease: LeaseUse) -> Result<Reply, LogError> {
        let command = Command::new(self.cause.clone().for_run(&self.run_id), action)
            .starting(self.pending_start.clone())
            .under(lease);
        let reply = self.runtime.log.execute(command).await?;
        self.started_now();
        Ok(reply)
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

    /// Runs `body` once and records its output; on replay returns the recorded output.
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
        self.execute(Action::RecordStep { run_id: self.run_id.clone(), position, name: name.to_owned(), output })
            .await?;
        Ok(value)
    }

    /// A durable timer: waits `ms` from the first time this position ran, across restarts.
    pub async fn sleep(&mut self, ms: u64) -> Result<(), WorkflowError> {
        let position = self.next_position();
        let fire_at = match self.recorded(position, "timer")? {
            Some(Value::String(text)) => DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| WorkflowError::Undecodable { position, detail: e.to_string() })?,
            Some(other) => {
                return Err(WorkflowError::Undecodable { position, detail: format!("timer output {other}") });
            }
            None => {
                let fire_at = checked_plus_ms(self.runtime.clock.now(), ms).ok_or_else(|| {
                    WorkflowError::DeadlineExceeded(format!("a timer of {ms} ms fires after any deadline"))
                })?;
                self.execute(Action::StartTimer { run_id: self.run_id.clone(), position, fire_at }).await?;
                fire_at
            }
        };
        if fire_at > self.deadline_at {
            return Err(WorkflowError::DeadlineExceeded(format!("timer fires at {fire_at}, after the deadline")));
        }
        let wait_ms = ms_between(self.runtime.clock.now(), fire_at);
        if wait_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
        }
        Ok(())
    }

    /// Waits for a signal named `name`. Returns its payload once delivered (recorded, so
    /// replay returns the same one); suspends the run while none is there.
    pub async fn wait_signal(&mut self, name: &str) -> Result<Value, WorkflowError> {
        let position = self.next_position();
        let step_name = format!("signal:{name}");
        if let Some(output) = self.recorded(position, &step_name)? {
            return Ok(output.clone());
        }
        if self.pending_start.is_some() {
            // A signal can only be delivered to a run that exists: start it now.
            self.execute(Action::StartRun).await?;
        }
        let history = match self.execute(Action::LoadRun { run_id: self.run_id.clone() }).await? {
            Reply::History(history) => history,
            _ => return Err(WorkflowError::Failed("loading a run did not return its history".to_owned())),
        };
        let consumed = history.journal.iter().filter(|entry| entry.name == step_name).count();
        match history.signals.get(name).and_then(|delivered| delivered.get(consumed)) {
            Some(payload) => {
                let payload = payload.clone();
                self.execute(Action::RecordStep {
                    run_id: self.run_id.clone(),
                    position,
                    name: step_name,
                    output: payload.clone(),
                })
                .await?;
                Ok(payload)
            }
            None => Err(WorkflowError::Suspended { reason: format!("waiting for signal {name:?}"), output: None }),
        }
    }

    /// Runs an intent through its lifecycle as far as Keel may take it now: reservation
    /// (atomic with the journal entry), deduplication, write-ahead attempts, outcome
    /// classification, reconciliation when due.
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
            let step_name = format!("intent:{key}");
            let replayed = self.recorded(position, &step_name)?.is_some();
            let (intent, deduplicated) = if replayed {
                (observe(&*self.runtime.log, &key, &self.cause).await?, false)
            } else {
                self.check_deadline()?;
                // With everything needed to send at hand, the first attempt is written ahead in
                // the reservation's own commit (the canary, which breaks write-ahead, never does).
                let start_attempt = cfg!(not(feature = "canary-skip-write-ahead"))
                    && (!request.kind.needs_payment_method() || request.payment_method.is_some());
                let cause = self.cause.clone().for_run(&self.run_id);
                let reserve = Command::new(
                    cause.clone(),
                    Action::Reserve {
                        run_id: self.run_id.clone(),
                        position,
                        spec: intent_spec(&self.runtime, &key, &request),
                        start_attempt,
                    },
                )
                .starting(self.pending_start.clone())
                .under(self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold));
                match reserve_intent(&self.runtime, &key, reserve).await? {
                    Reservation::Rejected(outcome) => return Ok(outcome),
                    Reservation::Reserved { intent, fresh } => {
                        self.started_now();
                        let deduplicated = !fresh && intent.status == IntentStatus::Validated;
                        // Proposed again while validated, in flight or unknown: no new attempt.
                        let prevented = !fresh
                            && matches!(
                                intent.status,
                                IntentStatus::Validated
                                    | IntentStatus::Attempting
                                    | IntentStatus::OutcomeUnknown
                                    | IntentStatus::Reconciling
                            );
                        tracing::Span::current().record("retry.prevented", prevented);
                        if !deduplicated {
                            self.failpoints.hit(Point::AfterReservation);
                        }
                        let intent = if fresh && intent.status == IntentStatus::Attempting {
                            let driver = self.driver();
                            driver.send(&intent, false, request.payment_method.as_ref()).await?
                        } else {
                            *intent
                        };
                        (intent, deduplicated)
                    }
                }
            };
            let span = tracing::Span::current();
            span.record("validation.outcome", "accepted");
            if deduplicated {
                tracing::info!("same key and fingerprint already validated: stored result returned");
                return Ok(IntentOutcome::of(&intent, true));
            }
            let outcome = self.driver().drive(intent, request.payment_method.as_ref()).await?;
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

    /// The intent driver acting for this run, under its lease.
    fn driver(&self) -> Driver<'_> {
        Driver {
            runtime: &self.runtime,
            cause: self.cause.clone().for_run(&self.run_id),
            failpoints: &self.failpoints,
            run_id: self.run_id.clone(),
            lease: self.lease.clone(),
        }
    }
}

/// What a reservation came to.
#[derive(Clone, Debug)]
pub enum Reservation {
    /// Reserved now (`fresh`), or the same key with the same fingerprint found (validated,
    /// pending, unknown… the intent says which).
    Reserved {
        /// The intent as the reservation left it.
        intent: Box<Intent>,
        /// Whether this call created it.
        fresh: bool,
    },
    /// Refused before anything was written (mismatch, invariant, reference pending, budget).
    Rejected(IntentOutcome),
}

fn intent_spec(runtime: &Runtime, key: &IntentKey, request: &IntentRequest) -> IntentSpec {
    IntentSpec {
        definition: IntentDefinition {
            key: key.clone(),
            kind: request.kind,
            tenant: request.tenant.clone(),
            intent_id: request.intent_id.clone(),
            order_id: request.order_id.clone(),
            business_ref: request.business_ref.clone(),
            fingerprint: crate::canonical::fingerprint(&request.payload),
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
            payload: request.payload.clone(),
        },
        capability: runtime.provider.capability(),
        approval_required: false,
    }
}

/// One `Reserve` command: key + fingerprint + money and the journal link, atomically.
async fn reserve_intent(runtime: &Runtime, key: &IntentKey, reserve: Command) -> Result<Reservation, WorkflowError> {
    match runtime.log.execute(reserve).await {
        Ok(Reply::Intent { intent, fresh }) => Ok(Reservation::Reserved { intent, fresh }),
        Ok(_) => Err(WorkflowError::Failed("a reservation did not return its intent".to_owned())),
        Err(LogError::Refused(Refusal::Rejected { code, detail })) => {
            tracing::Span::current().record("validation.outcome", "rejected");
            tracing::Span::current().record("validation.error_code", code.as_str());
            tracing::info!(code = code.as_str(), "proposal rejected; nothing written");
            Ok(Reservation::Rejected(IntentOutcome::rejected(key, code, detail)))
        }
        Err(other) => Err(other.into()),
    }
}

/// Reserves one intent for an already started run (an agent's effect call), journaled at the
/// run's next free position, without sending anything: the caller checks approval, then
/// [`drive_intent`] takes it on. The same key with the same fingerprint returns the existing
/// intent (`fresh: false`), so a resumed call finds what its first try reserved. The run's
/// lease must be held by this process (`runtime.lessee`). `approval_required` makes the
/// intent wait for a human even when the run's threshold would not (the stricter wins).
pub async fn reserve_for_run(
    runtime: &Runtime,
    cause: &Cause,
    run_id: &RunId,
    request: &IntentRequest,
    approval_required: bool,
) -> Result<Reservation, WorkflowError> {
    let key = IntentKey::new(request.kind, &request.tenant, &request.intent_id);
    let position =
        match runtime.log.execute(Command::new(cause.clone(), Action::ObserveRun { run_id: run_id.clone() })).await? {
            Reply::Run(run) => run.journal_len,
            _ => return Err(WorkflowError::Failed("observing a run did not return it".to_owned())),
        };
    let reserve = Command::new(
        cause.clone(),
        Action::Reserve {
            run_id: run_id.clone(),
            position,
            spec: IntentSpec { approval_required, ..intent_spec(runtime, &key, request) },
            start_attempt: false,
        },
    )
    .under(runtime.lessee.grant(run_id).map_or(LeaseUse::None, LeaseUse::Hold));
    reserve_intent(runtime, &key, reserve).await
}

/// Takes one reserved intent as far as the lifecycle allows now — the same [`Driver`] a
/// workflow's [`Context::intent`] uses: an approval it lacks stops it before any attempt,
/// an attempt in flight or unknown is reconciled (when due), never resent blindly.
pub async fn drive_intent(runtime: &Runtime, cause: Cause, key: &IntentKey) -> Result<IntentOutcome, WorkflowError> {
    let intent = observe(&*runtime.log, key, &cause).await?;
    // Agent effects are not on the crash-test failpoints' paths: they stay disarmed here.
    drive_for_its_run(runtime, cause, &Failpoints::disarmed(), intent).await
}

/// Drives an intent on behalf of the run that reserved it, without any secret: what
/// operators, recovery and an agent's effect call do (a charge that must be resent waits for
/// its caller). Acts under the run's lease: the one this process holds, or one claimed for
/// the time of the drive and released after; a run another process holds live is left to it
/// ([`WorkflowError::Busy`]).
async fn drive_for_its_run(
    runtime: &Runtime,
    cause: Cause,
    failpoints: &Failpoints,
    intent: Intent,
) -> Result<IntentOutcome, WorkflowError> {
    let run_id = intent.run_id.clone();
    let (lease, claimed) = match runtime.lessee.grant(&run_id) {
        Some(grant) => (grant, false),
        None => (claim_run(&*runtime.log, &runtime.lessee, &cause, &run_id).await?, true),
    };
    let driver = Driver { runtime, cause: cause.clone(), failpoints, run_id, lease: Some(lease.clone()) };
    let outcome = driver.drive(intent, None).await;
    if claimed {
        release_runs(&*runtime.log, &runtime.lessee, &cause, vec![lease]).await?;
    }
    outcome
}

/// Takes `run_id`'s lease for `lessee`, unless another process holds it live
/// ([`WorkflowError::Busy`]).
pub async fn claim_run(
    log: &dyn EventLog,
    lessee: &Lessee,
    cause: &Cause,
    run_id: &RunId,
) -> Result<LeaseGrant, WorkflowError> {
    let claim = Action::ClaimRun { run_id: run_id.clone(), owner: lessee.owner().clone() };
    match log.execute(Command::new(cause.clone(), claim)).await? {
        Reply::Claimed(grant) => {
            lessee.hold(&grant);
            Ok(grant)
        }
        _ => Err(WorkflowError::Failed("a claim did not return its grant".to_owned())),
    }
}

/// Gives back leases `lessee` is done with.
pub async fn release_runs(
    log: &dyn EventLog,
    lessee: &Lessee,
    cause: &Cause,
    grants: Vec<LeaseGrant>,
) -> Result<(), WorkflowError> {
    if grants.is_empty() {
        return Ok(());
    }
    for grant in &grants {
        lessee.forget(&grant.run_id);
    }
    log.execute(Command::new(cause.clone(), Action::ReleaseLeases { grants })).await?;
    Ok(())
}

/// Renews every lease `lessee` holds; returns the runs it lost to another process (whose
/// later writes from here will be fenced). The binary calls it at a third of the lease's
/// time to live.
pub async fn renew_leases(log: &dyn EventLog, lessee: &Lessee, cause: &Cause) -> Result<Vec<RunId>, WorkflowError> {
    let grants = lessee.grants();
    if grants.is_empty() {
        return Ok(Vec::new());
    }
    let renew = Action::RenewLeases { owner: lessee.owner().clone(), grants };
    match log.execute(Command::new(cause.clone(), renew)).await? {
        Reply::Renewed { lost } => {
            for run_id in &lost {
                lessee.forget(run_id);
            }
            Ok(lost)
        }
        _ => Err(WorkflowError::Failed("a renewal did not return what it lost".to_owned())),
    }
}

async fn observe(log: &dyn EventLog, key: &IntentKey, cause: &Cause) -> Result<Intent, LogError> {
    match log.execute(Command::new(cause.clone(), Action::Observe { key: key.clone() })).await? {
        Reply::Intent { intent, .. } => Ok(*intent),
        _ => Err(LogError::Refused(Refusal::UnknownIntent(key.clone()))),
    }
}

/// Drives one intent through the lifecycle, as far as allowed now, acting for `run_id`.
struct Driver<'a> {
    runtime: &'a Runtime,
    cause: Cause,
    failpoints: &'a Failpoints,
    /// The run on whose behalf attempts and lookups are made.
    run_id: RunId,
    /// That run's lease, presented with every write for it.
    lease: Option<LeaseGrant>,
}

impl Driver<'_> {
    async fn execute_intent(&self, action: Action) -> Result<Intent, LogError> {
        let lease = self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold);
        match self.runtime.log.execute(Command::new(self.cause.clone(), action).under(lease)).await? {
            Reply::Intent { intent, .. } => Ok(*intent),
            _ => Err(LogError::Unavailable {
                detail: "an intent command did not return its intent".to_owned(),
                maybe_committed: true,
            }),
        }
    }

    async fn drive(&self, mut intent: Intent, payment_method: Option<&Secret>) -> Result<IntentOutcome, WorkflowError> {
        let needs_payment_method = intent.definition.kind.needs_payment_method();
        loop {
            let now = self.runtime.clock.now();
            intent = match intent.status {
                IntentStatus::Validated
                | IntentStatus::Declined
                | IntentStatus::Cancelled
                | IntentStatus::Rejected
                | IntentStatus::Escalated
                | IntentStatus::AwaitingApproval
                | IntentStatus::Attempting
                | IntentStatus::Reconciling => return Ok(IntentOutcome::of(&intent, false)),
                IntentStatus::OutcomeUnknown if !intent.reconcile_due(now) => {
                    return Ok(IntentOutcome::of(&intent, false));
                }
                IntentStatus::OutcomeUnknown if intent.capability.lookup => {
                    match self.reconcile_once(&intent, false).await {
                        Ok(next) => next,
                        Err(LogError::Refused(refusal)) if refusal.may_be_a_race() => {
                            self.raced(&intent, refusal).await?
                        }
                        Err(other) => return Err(other.into()),
                    }
                }
                IntentStatus::OutcomeUnknown | IntentStatus::Reserved => {
                    if needs_payment_method && payment_method.is_none() {
                        return Ok(IntentOutcome::of(&intent, false).with_detail(
                            "ready for the next attempt, but the payment method is never stored: re-submit the same \
                             request (same key, same payload) to send it",
                        ));
                    }
                    if intent.network_retry_by(&self.run_id) {
                        // The last request never left: no effect, so wait and knock again.
                        let wait_ms = crate::limits::network_retry_backoff_ms(intent.not_sent);
                        self.runtime.clock.sleep_ms(wait_ms).await;
                    }
                    match self.attempt(&intent, payment_method).await {
                        Ok(next) => next,
                        Err(LogError::Refused(Refusal::NetworkRetriesSpent { spent, .. })) => {
                            return Ok(IntentOutcome::unreachable(&intent, spent));
                        }
                        Err(LogError::Refused(refusal @ Refusal::DeadlineReserve { .. })) => {
                            return Err(WorkflowError::DeadlineExceeded(refusal.to_string()));
                        }
                        Err(LogError::Refused(refusal)) if refusal.may_be_a_race() => {
                            self.raced(&intent, refusal).await?
                        }
                        Err(other) => return Err(other.into()),
                    }
                }
            };
        }
    }

    /// A step refused because the intent moved under us: another caller (a concurrent
    /// duplicate proposal, another worker's reconciliation) committed first. The fresh state
    /// decides what is left to do — usually nothing: it is in flight, unknown, or validated.
    /// When nothing moved, the refusal was not a race and is returned as is.
    async fn raced(&self, seen: &Intent, refusal: Refusal) -> Result<Intent, LogError> {
        let fresh = observe(&*self.runtime.log, seen.key(), &self.cause).await?;
        let moved = fresh.status != seen.status
            || fresh.attempts != seen.attempts
            || fresh.reconciliations != seen.reconciliations
            || fresh.last_seq != seen.last_seq;
        if moved { Ok(fresh) } else { Err(LogError::Refused(refusal)) }
    }

    /// One write-ahead attempt: `AttemptStarted` durable, then the provider, then the outcome.
    async fn attempt(&self, intent: &Intent, payment_method: Option<&Secret>) -> Result<Intent, LogError> {
        let key = intent.key().clone();
        #[cfg(feature = "canary-skip-write-ahead")]
        let early_outcome = {
            // CANARY (never on by default): calls the provider before `AttemptStarted` is
            // durable, which breaks write-ahead. The crash-replay suite must fail with it.
            let request = self.request(intent, payment_method);
            let outcome = self.runtime.provider.execute(&request).await;
            self.failpoints.hit(Point::AfterProviderAnswer);
            outcome
        };
        let started =
            self.execute_intent(Action::StartAttempt { key: key.clone(), run_id: self.run_id.clone() }).await?;
        if started.status != IntentStatus::Attempting {
            // Escalated (attempts or key window spent) or approval expired: nothing was sent.
            return Ok(started);
        }
        #[cfg(not(feature = "canary-skip-write-ahead"))]
        return self.send(&started, intent.absence_proven, payment_method).await;
        #[cfg(feature = "canary-skip-write-ahead")]
        return self.record(&started, &self.attempt_span(&started, intent.absence_proven), early_outcome).await;
    }

    /// Sends an attempt whose `AttemptStarted` is durable, then records its outcome.
    async fn send(
        &self,
        started: &Intent,
        after_absence: bool,
        payment_method: Option<&Secret>,
    ) -> Result<Intent, LogError> {
        self.failpoints.hit(Point::AfterAttemptStarted);
        let span = self.attempt_span(started, after_absence);
        let request = self.request(started, payment_method);
        let outcome = self.runtime.provider.execute(&request).instrument(span.clone()).await;
        // A provider may echo the payment method back (an error quoting the request): it is
        // scrubbed before the outcome is logged or stored.
        let outcome = match payment_method {
            Some(secret) => outcome.scrubbed(secret),
            None => outcome,
        };
        self.failpoints.hit(Point::AfterProviderAnswer);
        self.record(started, &span, outcome).await
    }

    fn attempt_span(&self, started: &Intent, after_absence: bool) -> tracing::Span {
        let attempt = started.attempts;
        info_span!(
            "attempt",
            retry.attempt = attempt,
            retry.reason = if attempt == 1 { "first" } else if after_absence { "proven_absent" } else { "unknown_outcome" },
            retry.prevented = false,
            effect.idempotency_key_hash = %started.key().hash(),
            budget.remaining_attempts = started.attempts_max.saturating_sub(attempt),
        )
    }

    /// Records an attempt's outcome (the write after the provider answered).
    async fn record(&self, started: &Intent, span: &tracing::Span, outcome: CallOutcome) -> Result<Intent, LogError> {
        span.in_scope(|| match &outcome {
            CallOutcome::Succeeded(e) => tracing::info!(provider_ref = %e.provider_ref, "attempt validated"),
            CallOutcome::Declined { code } => tracing::info!(code = %code, "attempt declined"),
            CallOutcome::NotSent { detail } => tracing::warn!(detail = %detail, "attempt never sent"),
            CallOutcome::Unknown { reason, detail } => {
                tracing::warn!(reason = reason.as_str(), detail = %detail, "outcome unknown: reconcile before acting again")
            }
        });
        self.execute_intent(Action::RecordOutcome { key: started.key().clone(), attempt: started.attempts, outcome })
            .await
    }

    /// The request for one attempt: always the intent key as the idempotency key.
    fn request(&self, intent: &Intent, payment_method: Option<&Secret>) -> EffectRequest {
        EffectRequest {
            kind: intent.definition.kind,
            idempotency_key: intent.key().as_str().to_owned(),
            tenant: intent.definition.tenant.clone(),
            intent_id: intent.definition.intent_id.clone(),
            order_id: intent.definition.order_id.clone(),
            amount_minor: intent.definition.amount_minor,
            currency: intent.definition.currency.clone(),
            payment_method: payment_method.cloned(),
        }
    }

    /// One reconciliation: `ReconciliationStarted` durable, then the lookup, then its answer.
    async fn reconcile_once(&self, intent: &Intent, force: bool) -> Result<Intent, LogError> {
        let key = intent.key().clone();
        let started = self
            .execute_intent(Action::StartReconciliation { key: key.clone(), force, run_id: self.run_id.clone() })
            .await?;
        if started.status != IntentStatus::Reconciling {
            return Ok(started); // Escalated: reconciliations spent.
        }
        self.failpoints.hit(Point::AfterReconciliationStarted);
        let reconciliation = started.reconciliations;
        let span = info_span!(
            "reconciliation",
            reconciliation.number = reconciliation,
            reconciliation.status = tracing::field::Empty,
            reconciliation.evidence_id = tracing::field::Empty,
            effect.idempotency_key_hash = %key.hash(),
        );
        let outcome =
            self.runtime.provider.lookup(started.definition.kind, key.as_str()).instrument(span.clone()).await;
        span.record(
            "reconciliation.status",
            match &outcome {
                LookupOutcome::Found(_) => "found",
                LookupOutcome::Absent => "absent",
                LookupOutcome::Unavailable { .. } => "unavailable",
            },
        );
        if let LookupOutcome::Found(evidence) = &outcome {
            span.record("reconciliation.evidence_id", evidence.provider_ref.as_str());
        }
        self.failpoints.hit(Point::AfterLookup);
        let after = self.execute_intent(Action::RecordLookup { key, reconciliation, outcome }).await?;
        span.in_scope(|| tracing::info!(status = after.status.as_str(), "reconciliation recorded"));
        Ok(after)
    }
}

/// A workflow run's result as the caller sees it.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: String,
    /// Its status: a [`RunStatus`] name, or `suspended` while it waits.
    pub status: String,
    /// Whether anything was written (a run rejected at its first proposal writes nothing).
    pub written: bool,
    /// The workflow's output.
    pub output: Value,
}

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
    workflows: BTreeMap<&'static str, Arc<dyn Workflow>>,
    failpoints: Failpoints,
}

/// What `recover_and_resume` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResumeReport {
    /// Intents whose in-flight attempt or lookup recovery recorded as interrupted.
    pub recovered: Vec<String>,
    /// Runs resumed, with their new status.
    pub resumed: Vec<RunOutcome>,
    /// Reconciliations performed, with the intents' new status.
    pub reconciled: Vec<IntentOutcome>,
    /// What was left alone because another process holds it live: the intent key or run
    /// id, and why (the holder and until when).
    pub left_to_their_owner: Vec<LeftAlone>,
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
    pub fn new(runtime: Runtime, workflows: Vec<Arc<dyn Workflow>>) -> Self {
        let workflows = workflows.into_iter().map(|w| (w.name(), w)).collect();
        Self { runtime, workflows, failpoints: Failpoints::disarmed() }
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
    pub async fn start(
        &self,
        workflow: &str,
        raw_input: &Value,
        request: RunRequest,
    ) -> Result<RunOutcome, WorkflowError> {
        let workflow_impl = self.workflow(workflow)?;
        let prepared = match workflow_impl.prepare(raw_input) {
            Ok(prepared) => prepared,
            Err(rejection) => {
                return Ok(RunOutcome {
                    run_id: request.run_id.to_string(),
                    status: RunStatus::Rejected.as_str().to_owned(),
                    written: false,
                    output: serde_json::json!({
                        "status": "rejected",
                        "code": rejection.code.as_str(),
                        "details": rejection.details,
                    }),
                });
            }
        };
        let deadline_at = checked_plus_ms(self.runtime.clock.now(), request.deadline_ms)
            .filter(|_| request.deadline_ms <= crate::limits::RUN_DEADLINE_MAX_MS);
        let Some(deadline_at) = deadline_at else {
            return Ok(RunOutcome {
                run_id: request.run_id.to_string(),
                status: RunStatus::Rejected.as_str().to_owned(),
                written: false,
                output: serde_json::json!({
                    "status": "rejected",
                    "code": RejectCode::InvalidArguments.as_str(),
                    "details": [format!(
                        "deadline_ms: {} is above the maximum of {}",
                        request.deadline_ms,
                        crate::limits::RUN_DEADLINE_MAX_MS
                    )],
                }),
            });
        };
        let ctx = Context {
            runtime: self.runtime.clone(),
            run_id: request.run_id.clone(),
            workflow: workflow.to_owned(),
            pending_start: Some(RunStart {
                run_id: request.run_id.clone(),
                workflow: workflow.to_owned(),
                input: prepared.stored_input.clone(),
                deadline_at,
                limits: request.limits.clone(),
                owner: Some(self.runtime.lessee.owner().clone()),
            }),
            journal: Vec::new(),
            position: 0,
            deadline_at,
            secrets: prepared.secrets,
            cause: request.cause,
            failpoints: self.failpoints.clone(),
            lease: None,
        };
        self.drive_run(workflow_impl, ctx, prepared.stored_input).await
    }

    /// Resumes one unfinished run by replaying its journal, under its lease: the one this
    /// process holds, or one it claims ([`WorkflowError::Busy`] when another process holds
    /// it live). The lease is given back when the replay stops.
    pub async fn resume(&self, run: &Run, cause: Cause) -> Result<RunOutcome, WorkflowError> {
        let workflow_impl = self.workflow(&run.workflow)?;
        let lease = match self.runtime.lessee.grant(&run.run_id) {
            Some(grant) => grant,
            None => claim_run(&*self.runtime.log, &self.runtime.lessee, &cause, &run.run_id).await?,
        };
        let load = Command::new(cause.clone(), Action::LoadRun { run_id: run.run_id.clone() });
        let history = match self.runtime.log.execute(load).await? {
            Reply::History(history) => history,
            _ => return Err(WorkflowError::Failed("loading a run did not return its history".to_owned())),
        };
        let ctx = Context {
            runtime: self.runtime.clone(),
            run_id: run.run_id.clone(),
            workflow: run.workflow.clone(),
            pending_start: None,
            journal: history.journal.clone(),
            position: 0,
            deadline_at: history.run.deadline_at,
            secrets: BTreeMap::new(),
            cause: cause.clone(),
            failpoints: self.failpoints.clone(),
            lease: Some(lease.clone()),
        };
        let outcome = self.drive_run(workflow_impl, ctx, history.input.clone()).await;
        // A finished run released its lease with its `RunFinished`; a suspended one is given
        // back here, so whoever continues it later can claim it.
        if self.runtime.lessee.grant(&run.run_id).is_some() {
            release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, vec![lease]).await?;
        }
        outcome
    }

    fn workflow(&self, name: &str) -> Result<Arc<dyn Workflow>, WorkflowError> {
        self.workflows
            .get(name)
            .cloned()
            .ok_or_else(|| WorkflowError::Failed(format!("no workflow named {name:?} is registered")))
    }

    async fn drive_run(
        &self,
        workflow: Arc<dyn Workflow>,
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
            let result = workflow.run(&mut ctx, input).await;
            let (status, output, finish) = match result {
                Ok(end) => (end.status, end.output, true),
                Err(WorkflowError::Suspended { reason, output }) => {
                    let run_id = ctx.run_id.to_string();
                    return Ok(RunOutcome {
                        run_id,
                        status: "suspended".to_owned(),
                        written: ctx.started(),
                        output: output
                            .unwrap_or_else(|| serde_json::json!({ "status": "suspended", "details": [reason] })),
                    });
                }
                Err(WorkflowError::DeadlineExceeded(why)) => (
                    RunStatus::DeadlineExceeded,
                    serde_json::json!({"status": "deadline_exceeded", "details": [why]}),
                    true,
                ),
                Err(WorkflowError::Nondeterministic(refusal)) => (
                    RunStatus::NondeterministicReplay,
                    serde_json::json!({"status": "nondeterministic_replay", "details": [refusal.to_string()]}),
                    true,
                ),
                Err(
                    other @ (WorkflowError::Log(_)
                    | WorkflowError::Busy(_)
                    | WorkflowError::Undecodable { .. }
                    | WorkflowError::Failed(_)),
                ) => {
                    return Err(other);
                }
            };
            let written = ctx.started();
            let mut output = output;
            if finish && written {
                let detail = output.get("details").and_then(|d| d.get(0)).and_then(Value::as_str).map(str::to_owned);
                let lease = ctx.lease.clone().map_or(LeaseUse::None, LeaseUse::Release);
                let finished =
                    ctx.execute_under(Action::FinishRun { run_id: ctx.run_id.clone(), status, detail }, lease);
                match finished.await {
                    Ok(_) => {}
                    // Another process took the run while this one finished its work (this one
                    // was presumed dead): what it learned is recorded; the new holder ends the run.
                    Err(LogError::Refused(refusal @ Refusal::Fenced { .. })) => {
                        tracing::warn!(%refusal, "the run was taken over; its new holder finishes it");
                        if let Some(details) = output.get_mut("details").and_then(Value::as_array_mut) {
                            details.push(Value::String(format!("{refusal}; the new holder finishes the run")));
                        } else if let Some(map) = output.as_object_mut() {
                            map.insert(
                                "details".into(),
                                serde_json::json!([format!("{refusal}; the new holder finishes the run")]),
                            );
                        }
                    }
                    Err(other) => return Err(other.into()),
                }
                if let Some(grant) = &ctx.lease {
                    self.runtime.lessee.forget(&grant.run_id);
                }
            }
            tracing::info!(status = status.as_str(), written, "run ended");
            Ok(RunOutcome { run_id: ctx.run_id.to_string(), status: status.as_str().to_owned(), written, output })
        }
        .instrument(span)
        .await
    }

    /// Reconciles one intent now (an operator's explicit request: even if not yet due), then
    /// takes it as far as allowed (a proven absence past the window resends with the same key
    /// when no secret is needed), under its run's lease ([`WorkflowError::Busy`] when another
    /// process holds that run live).
    pub async fn reconcile(&self, key: &IntentKey, cause: Cause) -> Result<IntentOutcome, WorkflowError> {
        let intent = observe(&*self.runtime.log, key, &cause).await?;
        let run_id = intent.run_id.clone();
        let (lease, claimed) = match self.runtime.lessee.grant(&run_id) {
            Some(grant) => (grant, false),
            None => (claim_run(&*self.runtime.log, &self.runtime.lessee, &cause, &run_id).await?, true),
        };
        let driver = Driver {
            runtime: &self.runtime,
            cause: cause.clone(),
            failpoints: &self.failpoints,
            run_id,
            lease: Some(lease.clone()),
        };
        let outcome = async {
            let reconcilable = matches!(intent.status, IntentStatus::OutcomeUnknown)
                || (intent.status == IntentStatus::Escalated && !intent.absence_proven);
            let intent = if reconcilable && intent.capability.lookup {
                driver.reconcile_once(&intent, true).await?
            } else {
                intent
            };
            driver.drive(intent, None).await
        }
        .await;
        if claimed {
            release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, vec![lease]).await?;
        }
        outcome
    }

    /// An operator's manual resolution of an unknown or escalated intent, checked with the
    /// provider first when it can look effects up: an answer the lookup contradicts is refused
    /// (nothing written) unless `override_reason` says why; where no lookup is possible the
    /// recorded event says the resolution is unverified. `landed` is the provider's reference
    /// proving the effect, `None` asserts it is absent.
    pub async fn resolve(
        &self,
        key: &IntentKey,
        by: &str,
        reason: &str,
        landed: Option<String>,
        override_reason: Option<String>,
    ) -> Result<Intent, WorkflowError> {
        let cause = Cause::operator(by);
        let intent = observe(&*self.runtime.log, key, &cause).await?;
        let lookup = if intent.capability.lookup {
            Some(self.runtime.provider.lookup(intent.definition.kind, key.as_str()).await)
        } else {
            None
        };
        let action = Action::Resolve {
            key: key.clone(),
            by: by.to_owned(),
            reason: reason.to_owned(),
            landed,
            lookup,
            override_reason,
        };
        match self.runtime.log.execute(Command::new(cause, action)).await? {
            Reply::Intent { intent, .. } => Ok(*intent),
            _ => Err(WorkflowError::Failed("a resolution did not return its intent".to_owned())),
        }
    }

    /// Recovery: every attempt without an outcome whose run no live process holds becomes
    /// `outcome_unknown (crash)` exactly once, this process taking those runs' leases; then
    /// unfinished runs are replayed and due reconciliations run. What another live process
    /// holds is left to it and reported.
    pub async fn recover_and_resume(&self, cause: Cause) -> Result<ResumeReport, WorkflowError> {
        let mut report = ResumeReport::default();
        let recover = Action::Recover { owner: self.runtime.lessee.owner().clone(), run: None };
        let claimed = match self.runtime.log.execute(Command::new(cause.clone(), recover)).await? {
            Reply::Recovered(recovery) => {
                report.recovered = recovery.recovered.iter().map(ToString::to_string).collect();
                report.left_to_their_owner = recovery
                    .held_elsewhere
                    .iter()
                    .map(|(key, owner)| LeftAlone { subject: key.to_string(), held_by: owner.to_string() })
                    .collect();
                recovery.claimed
            }
            _ => return Err(WorkflowError::Failed("recovery did not report what it did".to_owned())),
        };
        for grant in &claimed {
            self.runtime.lessee.hold(grant);
        }
        self.failpoints.hit(Point::AfterRecover);
        let result = async {
            // Agent runs need their transport and tools: `keel agent resume` continues them.
            for run in self.unfinished_runs(&cause).await?.into_iter().filter(|run| !run.is_agent()) {
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
        .await;
        let still_held: Vec<LeaseGrant> =
            claimed.into_iter().filter(|grant| self.runtime.lessee.grant(&grant.run_id).is_some()).collect();
        release_runs(&*self.runtime.log, &self.runtime.lessee, &cause, still_held).await?;
        result.map(|()| report)
    }

    /// Reconciles every intent whose reconciliation is due, at most
    /// [`crate::limits::RECONCILE_PASS_MAX`] per pass; an intent whose run another live
    /// process holds is left to it.
    pub async fn reconcile_due(&self, cause: Cause) -> Result<Vec<IntentOutcome>, WorkflowError> {
        Ok(self.reconcile_due_reporting(cause).await?.0)
    }

    async fn reconcile_due_reporting(
        &self,
        cause: Cause,
    ) -> Result<(Vec<IntentOutcome>, Vec<LeftAlone>), WorkflowError> {
        let mut outcomes = Vec::new();
        let mut busy = Vec::new();
        for key in self.due(&cause).await?.into_iter().take(crate::limits::RECONCILE_PASS_MAX) {
            let intent = observe(&*self.runtime.log, &key, &cause).await?;
            if !intent.reconcile_due(self.runtime.clock.now()) {
                continue; // Someone else got to it first.
            }
            match drive_for_its_run(&self.runtime, cause.clone(), &self.failpoints, intent).await {
                Ok(outcome) => outcomes.push(outcome),
                Err(WorkflowError::Busy(refusal)) => {
                    busy.push(LeftAlone { subject: key.to_string(), held_by: refusal.to_string() })
                }
                Err(other) => return Err(other),
            }
        }
        Ok((outcomes, busy))
    }

    async fn unfinished_runs(&self, cause: &Cause) -> Result<Vec<Run>, WorkflowError> {
        Ok(self.snapshot(cause).await?.1)
    }

    async fn due(&self, cause: &Cause) -> Result<Vec<IntentKey>, WorkflowError> {
        Ok(self.snapshot(cause).await?.0)
    }

    /// Due intents and unfinished runs, read through the log so they include every commit.
    async fn snapshot(&self, cause: &Cause) -> Result<(Vec<IntentKey>, Vec<Run>), WorkflowError> {
        match self.runtime.log.execute(Command::new(cause.clone(), Action::Snapshot)).await? {
            Reply::Snapshot { due, unfinished } => Ok((due, unfinished)),
            _ => Err(WorkflowError::Failed("a snapshot did not return one".to_owned())),
        }
    }
}

/// Maps an intent's outcome to the end of a single-intent workflow.
pub fn end_with(outcome: &IntentOutcome) -> Result<WorkflowEnd, WorkflowError> {
    let output = serde_json::to_value(outcome).map_err(|e| WorkflowError::Failed(e.to_string()))?;
    if outcome.status == "awaiting_approval" {
        let key = &outcome.intent_key;
        let reason =
            format!("intent {key} awaits approval: `keel approve {key} --by NAME`, then re-submit the same request");
        let mut output = output;
        if let Some(details) = output.as_object_mut() {
            details.insert("details".to_owned(), serde_json::json!([reason]));
        }
        return Err(WorkflowError::Suspended { reason, output: Some(output) });
    }
    Ok(WorkflowEnd { status: outcome.run_status(), output })
}
