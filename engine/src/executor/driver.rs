//! The intent driver: takes one intent through its lifecycle as far as Keel may now, for
//! workflows ([`super::Context::intent`]), agents ([`reserve_for_run`], [`drive_intent`]),
//! operators and recovery alike.
//!
//! Owns [`Driver`] and [`Reservation`]. The driver does not decide: every reply to an intent
//! command carries the ledger's [`Next`] step, and the driver carries it out — send the
//! attempt the ledger wrote ahead, look the effect up, ask for the next attempt or
//! reconciliation, or stop. Decide, persist, then act: `AttemptStarted` is durable before
//! the provider is called, and the outcome is recorded after; a transport failure is
//! recorded `outcome_unknown`, and the next step is a lookup, never a blind resend. A secret
//! (the payment method) is passed in by the invocation that has it; without it, a resend
//! asks the log's vault ([`crate::log::EventLog::unseal`]), and an intent whose vault has
//! nothing usable waits for its caller, saying why.

use super::leases::{claim_run, release_runs};
use super::outcome::IntentOutcome;
use super::workflow::IntentRequest;
use super::{Runtime, WorkflowError};
use crate::clock::ms_between;
use crate::event::{Cause, IntentDefinition, IntentKey, ReleaseReason, RunId};
use crate::failpoints::{Failpoints, Point};
use crate::lease::{LeaseGrant, LeaseUse};
use crate::ledger::{Intent, IntentSpec, Next, Refusal, Run};
use crate::log::{Ask, Asking, IntentAnswer, LogError, Unsealed};
use crate::policy::Governing;
use crate::provider::{CallOutcome, EffectRequest, LookupOutcome, Secret};
use chrono::{DateTime, Utc};
use tracing::{Instrument, info_span};

/// What a reservation came to.
#[derive(Clone, Debug)]
pub enum Reservation {
    /// Reserved now (`fresh`), or the same key with the same fingerprint found (validated,
    /// pending, unknown… the intent says which), with the next step for it.
    Reserved(Box<IntentAnswer>),
    /// Refused before anything was written (mismatch, invariant, reference pending, budget).
    Rejected(IntentOutcome),
}

/// The intent as the ledger reserves it: its definition from `request`, the provider's
/// capability, and whether it must wait for a human regardless of the run's threshold.
pub(super) fn intent_spec(
    runtime: &Runtime,
    key: &IntentKey,
    request: &IntentRequest,
    approval_required: bool,
) -> IntentSpec {
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
            tool: request.tool.clone(),
        },
        capability: runtime.provider.capability(),
        approval_required,
    }
}

/// One reservation: key + fingerprint + money and the journal link, atomically. A proposal
/// the ledger rejects is a [`Reservation::Rejected`], with nothing written.
pub(super) async fn reserve(
    runtime: &Runtime,
    key: &IntentKey,
    reserve: Ask<IntentAnswer>,
) -> Result<Reservation, WorkflowError> {
    match runtime.log.ask(reserve).await {
        Ok(answer) => Ok(Reservation::Reserved(Box::new(answer))),
        Err(LogError::Refused(Refusal::Rejected { code, detail })) => {
            tracing::Span::current().record("validation.outcome", "rejected");
            tracing::Span::current().record("validation.error_code", code.as_str());
            tracing::info!(code = code.as_str(), "proposal rejected; nothing written");
            Ok(Reservation::Rejected(IntentOutcome::rejected(key, code, detail)))
        }
        Err(other) => Err(other.into()),
    }
}

/// What the caller of a reservation asks of a human, beside its run's approval threshold (the
/// stricter of the two wins).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HumanApproval {
    /// A human approves before the first attempt (an agent tool's approval policy asks for
    /// one, or its irreversible class does).
    Required,
    /// The caller asks for none: the run's threshold alone decides.
    NotRequired,
    /// The caller's irreversible class would ask for one, and the operator's policy in force
    /// lowered it for the intent's tenant and operation (these rules): the run's threshold
    /// alone decides, the reservation is held to these rules as well when its run started
    /// under another policy, and it records their stamp (`IntentReserved`'s
    /// `approval_lowered_by`).
    LoweredBy(crate::policy::Governing),
}

/// Reserves one intent for an already started run (an agent's effect call), journaled at the
/// run's next free position, without sending anything: the caller checks approval, then
/// [`drive_intent`] takes it on. The same key with the same fingerprint returns the existing
/// intent (`fresh: false`), so a resumed call finds what its first try reserved. The run's
/// lease must be held by this process (`runtime.lessee`). `approval` may make the intent
/// wait for a human even when the run's threshold would not (the stricter wins). `policy` is
/// the operator's policy in force for the request's tenant and operation, when the caller holds
/// one: a run that started under another is held to the stricter of the two, as a resumed
/// workflow is.
///
/// # Errors
///
/// The log's failure or refusal (a rejected proposal is a [`Reservation::Rejected`]).
pub async fn reserve_for_run(
    runtime: &Runtime,
    cause: &Cause,
    run_id: &RunId,
    request: &IntentRequest,
    approval: HumanApproval,
    policy: Option<Governing>,
) -> Result<Reservation, WorkflowError> {
    let key = IntentKey::new(request.kind, &request.tenant, &request.intent_id);
    let run: Run = runtime.log.ask(Ask::observe_run(cause.clone(), run_id.clone())).await?;
    let (approval_required, governing) = match approval {
        HumanApproval::Required => (true, policy),
        HumanApproval::NotRequired => (false, policy),
        HumanApproval::LoweredBy(governing) => (false, Some(governing.lowering_approval())),
    };
    let spec = intent_spec(runtime, &key, request, approval_required);
    let ask = Ask::reserve(cause.clone(), run_id.clone(), run.journal_len, spec, false)
        .governed_by(governing)
        .under(runtime.lessee.grant(run_id).map_or(LeaseUse::None, LeaseUse::Hold));
    reserve(runtime, &key, ask).await
}

/// Takes one reserved intent as far as the lifecycle allows now — the same [`Driver`] a
/// workflow's [`super::Context::intent`] uses: an approval it lacks stops it before any
/// attempt, an attempt in flight or unknown is reconciled (when due), never resent blindly.
/// `payment_method` is the invocation's secret for a charge (a refund needs none); without
/// it a charge's attempt takes it from the log's vault, or waits for its caller.
///
/// # Errors
///
/// [`WorkflowError::Busy`] when another process holds the intent's run live; the log's
/// failure.
pub async fn drive_intent(
    runtime: &Runtime,
    cause: Cause,
    key: &IntentKey,
    payment_method: Option<&Secret>,
) -> Result<IntentOutcome, WorkflowError> {
    let answer = runtime.log.ask(Ask::observe(cause.clone(), key.clone())).await?;
    // Agent effects are not on the crash-test failpoints' paths: they stay disarmed here.
    let disarmed = Failpoints::disarmed();
    let run: Run = runtime.log.ask(Ask::observe_run(cause.clone(), answer.intent.run_id.clone())).await?;
    // Its commands act for the intent's run whatever the caller's cause names, so the ledger
    // counts a network retry as that run's and makes it wait its backoff.
    let cause = cause.for_run(&answer.intent.run_id);
    let mut leased = Leased::for_its_run(runtime, cause, &disarmed, answer.intent.run_id.clone()).await?;
    // The agent's effect acts inside its run's time: a request gets at most what is left.
    leased.driver.deadline_at = Some(run.deadline_at);
    let outcome = leased.driver.drive_from(&answer.intent, payment_method).await;
    leased.release().await?;
    outcome
}

/// A driver acting for an intent's run without any secret of its own — what operators,
/// recovery and an agent's effect call use (a charge that must be resent takes its payment
/// method from the log's vault, or waits for its caller) — under the
/// run's lease: the one this process holds, or one claimed for the time of the work and
/// given back by [`Leased::release`].
pub(super) struct Leased<'a> {
    pub(super) driver: Driver<'a>,
    claimed: Option<LeaseGrant>,
}

impl<'a> Leased<'a> {
    /// The driver for `run_id`; a run another process holds live is left to it
    /// ([`WorkflowError::Busy`]).
    pub(super) async fn for_its_run(
        runtime: &'a Runtime,
        cause: Cause,
        failpoints: &'a Failpoints,
        run_id: RunId,
    ) -> Result<Self, WorkflowError> {
        let (lease, claimed) = match runtime.lessee.grant(&run_id) {
            Some(grant) => (grant, None),
            None => {
                let grant = claim_run(&*runtime.log, &runtime.lessee, &cause, &run_id).await?;
                (grant.clone(), Some(grant))
            }
        };
        let driver = Driver { runtime, cause, failpoints, run_id, lease: Some(lease), deadline_at: None };
        Ok(Self { driver, claimed })
    }

    /// Gives back the lease if it was claimed for this work.
    pub(super) async fn release(self) -> Result<(), WorkflowError> {
        let Driver { runtime, cause, .. } = self.driver;
        release_runs(&*runtime.log, &runtime.lessee, &cause, self.claimed.into_iter().collect()).await
    }
}

/// Drives one intent, acting for `run_id` under its lease.
pub(super) struct Driver<'a> {
    pub(super) runtime: &'a Runtime,
    pub(super) cause: Cause,
    pub(super) failpoints: &'a Failpoints,
    /// The run on whose behalf attempts and lookups are made.
    pub(super) run_id: RunId,
    /// That run's lease, presented with every write for it.
    pub(super) lease: Option<LeaseGrant>,
    /// That run's deadline, when the driver acts inside it (a workflow's context, an agent's
    /// effect call): a request is given at most the time left. Operators and recovery act
    /// outside any run's time, and the ledger's reserve already bounds every attempt it writes
    /// ahead.
    pub(super) deadline_at: Option<DateTime<Utc>>,
}

impl Driver<'_> {
    /// The intent as the ledger has it now, with the next step for this run.
    pub(super) async fn observe(&self, key: &IntentKey) -> Result<IntentAnswer, LogError> {
        self.runtime.log.ask(Ask::observe(self.cause.clone().for_run(&self.run_id), key.clone())).await
    }

    /// Carries out the ledger's next steps for the intent until it says stop, and reports
    /// where the intent stands.
    pub(super) async fn drive(
        &self,
        mut answer: IntentAnswer,
        payment_method: Option<&Secret>,
    ) -> Result<IntentOutcome, WorkflowError> {
        // Whether the attempt about to be sent follows a proven absence (for its span).
        let mut after_absence = false;
        // The payment method the log's vault kept, when the invocation has none.
        let mut kept: Option<Secret> = None;
        loop {
            let payment_method = payment_method.or(kept.as_ref());
            answer = match answer.next {
                Next::Send { .. } => {
                    let request = self.request(&answer.intent, payment_method, answer.charge_ref.clone());
                    self.send(&answer.intent, after_absence, request, payment_method).await?
                }
                Next::LookUp { .. } => self.look_up(&answer.intent).await?,
                Next::Attempt { .. }
                    if answer.intent.definition.kind.needs_payment_method() && payment_method.is_none() =>
                {
                    match self.runtime.log.unseal(answer.intent.key()).await {
                        Unsealed::Kept(secret) => {
                            tracing::info!(
                                effect.idempotency_key_hash = %answer.intent.key().hash(),
                                "payment method unsealed from the vault for the next attempt"
                            );
                            kept = Some(secret);
                            continue;
                        }
                        waiting => {
                            if let Unsealed::Unreadable { why } = &waiting {
                                tracing::warn!(%why, "the vault entry cannot be used: the intent waits for its caller");
                            }
                            return Ok(IntentOutcome::of(&answer.intent, false).with_detail(waiting.waiting_reason()));
                        }
                    }
                }
                Next::Attempt { backoff_ms } => {
                    after_absence = answer.intent.absence_proven;
                    let started = match self.attempt(&answer, backoff_ms, payment_method).await {
                        Err(LogError::Refused(Refusal::NetworkRetriesSpent { spent, .. })) => {
                            return Ok(IntentOutcome::unreachable(&answer.intent, spent));
                        }
                        Err(LogError::Refused(refusal @ Refusal::DeadlineReserve { .. })) => {
                            return Err(WorkflowError::DeadlineExceeded(refusal.to_string()));
                        }
                        other => other?,
                    };
                    // The ledger released it for lack of time: the run is out of time.
                    if let Some(reason @ ReleaseReason::DeadlineReserve { .. }) = &started.intent.released {
                        return Err(WorkflowError::DeadlineExceeded(format!(
                            "{} released: {reason}",
                            started.intent.key()
                        )));
                    }
                    started
                }
                Next::Reconcile => {
                    let key = answer.intent.key().clone();
                    self.step(&answer, Ask::start_reconciliation(self.cause.clone(), key, false, self.run_id.clone()))
                        .await?
                }
                Next::WaitUntil { .. } | Next::AwaitApproval | Next::InFlight | Next::Done => {
                    return Ok(IntentOutcome::of(&answer.intent, false));
                }
            };
        }
    }

    /// Asks for the next attempt, after `backoff_ms` (a network retry: the last request never
    /// left, so there is no effect to wait on, only the network).
    async fn attempt(
        &self,
        seen: &IntentAnswer,
        backoff_ms: u64,
        payment_method: Option<&Secret>,
    ) -> Result<IntentAnswer, LogError> {
        if backoff_ms > 0 {
            self.runtime.clock.sleep_ms(backoff_ms).await;
        }
        let ask = Ask::start_attempt(self.cause.clone(), seen.intent.key().clone(), self.run_id.clone());
        #[cfg(feature = "canary-skip-write-ahead")]
        {
            // CANARY (never on by default): calls the provider before `AttemptStarted` is
            // durable, which breaks write-ahead. The crash-replay suite must fail with it.
            let outcome = self
                .runtime
                .provider
                .execute(&self.request(&seen.intent, payment_method, seen.charge_ref.clone()))
                .await;
            self.failpoints.hit(Point::AfterProviderAnswer);
            let started = self.step(seen, ask).await?;
            if !matches!(started.next, Next::Send { .. }) {
                return Ok(started);
            }
            let span = self.attempt_span(&started.intent, seen.intent.absence_proven);
            self.record(&started.intent, &span, outcome).await
        }
        #[cfg(not(feature = "canary-skip-write-ahead"))]
        {
            let _ = payment_method; // sent by the `Next::Send` the answer carries
            self.step(seen, ask).await
        }
    }

    /// [`Self::drive`] from an intent read before (without its next step for this run).
    pub(super) async fn drive_from(
        &self,
        intent: &Intent,
        payment_method: Option<&Secret>,
    ) -> Result<IntentOutcome, WorkflowError> {
        let answer = self.observe(intent.key()).await?;
        self.drive(answer, payment_method).await
    }

    /// Asks for one step (an attempt, a reconciliation). A refusal because the intent moved
    /// under us — another caller (a concurrent duplicate proposal, another worker's
    /// reconciliation) committed first — is answered with the fresh state, which says what is
    /// left to do: usually nothing, it is in flight, unknown or validated. When nothing
    /// moved, the refusal was not a race and is returned as is.
    async fn step(&self, seen: &IntentAnswer, ask: Ask<IntentAnswer>) -> Result<IntentAnswer, LogError> {
        let lease = self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold);
        match self.runtime.log.ask(ask.under(lease)).await {
            Ok(answer) => Ok(answer),
            Err(LogError::Refused(refusal)) if refusal.may_be_a_race() => {
                let fresh = self.observe(seen.intent.key()).await?;
                let (before, now) = (&seen.intent, &fresh.intent);
                let moved = now.status != before.status
                    || now.attempts != before.attempts
                    || now.reconciliations != before.reconciliations
                    || now.last_seq != before.last_seq;
                if moved { Ok(fresh) } else { Err(LogError::Refused(refusal)) }
            }
            Err(other) => Err(other),
        }
    }

    /// Sends the attempt the ledger wrote ahead, then records its outcome.
    async fn send(
        &self,
        started: &Intent,
        after_absence: bool,
        request: EffectRequest,
        payment_method: Option<&Secret>,
    ) -> Result<IntentAnswer, LogError> {
        self.failpoints.hit(Point::AfterAttemptStarted);
        let span = self.attempt_span(started, after_absence);
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
        let reason = if attempt == 1 {
            "first"
        } else if after_absence {
            "proven_absent"
        } else {
            "unknown_outcome"
        };
        info_span!(
            "attempt",
            retry.attempt = attempt,
            retry.reason = reason,
            retry.prevented = false,
            effect.idempotency_key_hash = %started.key().hash(),
            budget.remaining_attempts = started.attempts_max.saturating_sub(attempt),
        )
    }

    /// Records an attempt's outcome (the write after the provider answered).
    async fn record(
        &self,
        started: &Intent,
        span: &tracing::Span,
        outcome: CallOutcome,
    ) -> Result<IntentAnswer, LogError> {
        span.in_scope(|| match &outcome {
            CallOutcome::Succeeded(e) => tracing::info!(provider_ref = %e.provider_ref, "attempt validated"),
            CallOutcome::Declined { code } => tracing::info!(code = %code, "attempt declined"),
            CallOutcome::NotSent { detail } => tracing::warn!(detail = %detail, "attempt never sent"),
            CallOutcome::Unknown { reason, detail } => {
                tracing::warn!(reason = reason.as_str(), detail = %detail, "outcome unknown: reconcile before acting again")
            }
        });
        let ask = Ask::record_outcome(self.cause.clone(), started.key().clone(), started.attempts, outcome);
        self.runtime.log.ask(ask).await
    }

    /// The request for one attempt: always the intent key as the idempotency key, and at most
    /// the run's time left to take.
    fn request(&self, intent: &Intent, payment_method: Option<&Secret>, charge_ref: Option<String>) -> EffectRequest {
        let now = self.runtime.clock.now();
        EffectRequest {
            timeout_ms: self.deadline_at.map(|deadline| ms_between(now, deadline).max(1)),
            kind: intent.definition.kind,
            idempotency_key: intent.key().as_str().to_owned(),
            tenant: intent.definition.tenant.clone(),
            intent_id: intent.definition.intent_id.clone(),
            order_id: intent.definition.order_id.clone(),
            amount_minor: intent.definition.amount_minor,
            currency: intent.definition.currency.clone(),
            payment_method: payment_method.cloned(),
            fingerprint: intent.definition.fingerprint.clone(),
            charge_ref,
        }
    }

    /// Forces a reconciliation now (an operator's request: due or not, and for an
    /// escalated intent whose absence is not proven).
    pub(super) async fn reconcile_now(&self, intent: &Intent) -> Result<IntentAnswer, WorkflowError> {
        let ask = Ask::start_reconciliation(self.cause.clone(), intent.key().clone(), true, self.run_id.clone());
        let lease = self.lease.clone().map_or(LeaseUse::None, LeaseUse::Hold);
        Ok(self.runtime.log.ask(ask.under(lease)).await?)
    }

    /// The lookup of a reconciliation the ledger started, then its answer recorded.
    async fn look_up(&self, started: &Intent) -> Result<IntentAnswer, LogError> {
        self.failpoints.hit(Point::AfterReconciliationStarted);
        let key = started.key().clone();
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
        let after = self.runtime.log.ask(Ask::record_lookup(self.cause.clone(), key, reconciliation, outcome)).await?;
        span.in_scope(|| tracing::info!(status = after.intent.status.as_str(), "reconciliation recorded"));
        Ok(after)
    }
}
