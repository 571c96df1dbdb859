//! The fold of the event log, and every decision taken against it.
//!
//! Owns [`Ledger`]: the state of every intent and run, rebuilt by [`Ledger::apply`] from
//! stored events, and [`Ledger::decide`], the pure function that turns a [`Command`] into the
//! events to append (or a [`Refusal`], in which case nothing is written). The store calls
//! `decide` then `apply` for each command inside its write transaction, so a decision always
//! sees every event committed before it — that is what makes reservation atomic.
//!
//! This module never reads a clock (time comes in as `now`), never does I/O, and never
//! appends: it only says what to append.
//!
//! # Failure
//!
//! `apply` panics on an impossible transition, naming the stream and sequence: the log is
//! durable, so a restart after the fix is safe; folding past a corrupt fact is not.

use crate::agent::{AgentEvent, AgentState};
use crate::clock::{checked_plus_ms, ms_between};
use crate::event::{
    AfterLookup, Cause, Event, IntentDefinition, IntentKey, LateAnswer, LateVerdict, LookupStatus, ReleaseReason,
    ResolutionCheck, RunId, RunLimits, RunStatus, Source, StoredEvent, StreamId,
};
use crate::lease::{ClaimVerdict, LeaseEffect, LeaseGrant, LeaseOwner, LeaseUse, LeaseView, claim_verdict};
use crate::limits;
use crate::money::{Currency, check_amount, checked_sum};
use crate::provider::{CallOutcome, Capability, EffectKind, Evidence, LookupOutcome, UnknownReason};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// Where an intent is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    /// Key, fingerprint and money reserved; the next attempt may go.
    Reserved,
    /// Waiting for a human approval bound to the fingerprint.
    AwaitingApproval,
    /// An attempt is in flight (its `AttemptStarted` is durable, its outcome is not).
    Attempting,
    /// The effect is proven.
    Validated,
    /// The provider definitively refused: no effect.
    Declined,
    /// The effect may or may not have happened: reconcile before acting again.
    OutcomeUnknown,
    /// A reconciliation lookup is in flight.
    Reconciling,
    /// No automatic step is left: an operator must resolve it.
    Escalated,
    /// Cancelled (or resolved absent) by an operator: no effect.
    Cancelled,
    /// An approval was denied: no effect.
    Rejected,
}

impl IntentStatus {
    /// Stable snake_case name, as shown by the CLI and stored in projections.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Attempting => "attempting",
            Self::Validated => "validated",
            Self::Declined => "declined",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Reconciling => "reconciling",
            Self::Escalated => "escalated",
            Self::Cancelled => "cancelled",
            Self::Rejected => "rejected",
        }
    }

    /// Parses a name produced by [`IntentStatus::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        ALL_STATUSES.iter().copied().find(|s| s.as_str() == text)
    }
}

/// Every status, for help texts and parsing.
pub const ALL_STATUSES: [IntentStatus; 10] = [
    IntentStatus::Reserved,
    IntentStatus::AwaitingApproval,
    IntentStatus::Attempting,
    IntentStatus::Validated,
    IntentStatus::Declined,
    IntentStatus::OutcomeUnknown,
    IntentStatus::Reconciling,
    IntentStatus::Escalated,
    IntentStatus::Cancelled,
    IntentStatus::Rejected,
];

/// A human approval, bound to a fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Approval {
    /// The fingerprint approved.
    pub fingerprint: String,
    /// The approver.
    pub by: String,
    /// After this instant it releases nothing.
    pub expires_at: DateTime<Utc>,
}

/// The folded state of one intent.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Intent {
    /// What it is.
    #[serde(flatten)]
    pub definition: IntentDefinition,
    /// The run that reserved it; its money budget holds the amount.
    pub run_id: RunId,
    /// The provider's declared capability.
    pub capability: Capability,
    /// Where it is.
    pub status: IntentStatus,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts allowed.
    pub attempts_max: u32,
    /// Reconciliations started so far.
    pub reconciliations: u32,
    /// Reconciliations allowed before escalation.
    pub reconciliations_max: u32,
    /// When the key was first sent to the provider (the key window counts from here).
    pub first_sent_at: Option<DateTime<Utc>>,
    /// When the latest attempt was sent (the consistency window counts from here).
    pub last_sent_at: Option<DateTime<Utc>>,
    /// When the next reconciliation is due, while unknown.
    pub reconcile_after: Option<DateTime<Utc>>,
    /// Why the latest outcome is unknown.
    pub unknown_reason: Option<UnknownReason>,
    /// How it was validated.
    pub source: Option<Source>,
    /// The proof, once validated.
    pub evidence: Option<Evidence>,
    /// The provider's decline code.
    pub decline_code: Option<String>,
    /// Whether a human must approve before the first attempt.
    pub approval_required: bool,
    /// The latest approval.
    pub approval: Option<Approval>,
    /// Whether the effect is proven absent (for the latest attempt).
    pub absence_proven: bool,
    /// Why it escalated, or who cancelled / resolved it and why.
    pub note: Option<String>,
    /// Times the same key and fingerprint were proposed again after validation.
    pub duplicates_suppressed: u32,
    /// Attempts proven never sent (`AttemptNotSent`): they made no effect, so they do not
    /// count against `attempts_max`.
    #[serde(skip_serializing_if = "is_zero")]
    pub not_sent: u32,
    /// Whether the latest attempt was proven never sent (the next one is a network retry).
    #[serde(skip)]
    pub latest_not_sent: bool,
    /// The run that started the latest attempt.
    #[serde(skip)]
    pub latest_attempt_run: Option<RunId>,
    /// The run on whose behalf the attempt or lookup in flight was made (its lease holder
    /// is the one process allowed to act on it; recovery checks that lease).
    pub in_flight_run: Option<RunId>,
    /// Definitive answers that arrived after their attempt stopped being awaited.
    pub late_answers: u32,
    /// When the approval window of the run waiting on it closes (an approval after it is
    /// refused).
    pub approval_closes_at: Option<DateTime<Utc>>,
    /// Global sequence of the latest event on its stream.
    pub last_seq: u64,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

impl Intent {
    /// The intent key.
    pub fn key(&self) -> &IntentKey {
        &self.definition.key
    }

    /// Whether the amount counts against budgets and cumulative invariants: from
    /// reservation on, while the effect may exist, and once it is proven.
    pub fn money_committed(&self) -> bool {
        match self.status {
            IntentStatus::Reserved
            | IntentStatus::AwaitingApproval
            | IntentStatus::Attempting
            | IntentStatus::OutcomeUnknown
            | IntentStatus::Reconciling
            | IntentStatus::Validated => true,
            IntentStatus::Escalated => !self.absence_proven,
            IntentStatus::Declined | IntentStatus::Cancelled | IntentStatus::Rejected => false,
        }
    }

    /// Whether the intent is still open: for a charge, a second key for its business
    /// reference is refused meanwhile.
    pub fn pending(&self) -> bool {
        self.status != IntentStatus::Validated && self.money_committed()
    }

    /// Attempts that may have reached the provider: those started, less those proven never
    /// sent. This is what `attempts_max` bounds.
    pub fn attempts_spent(&self) -> u32 {
        // Every `AttemptNotSent` follows its own `AttemptStarted`, so this never goes below 0.
        self.attempts.saturating_sub(self.not_sent)
    }

    /// Whether the next attempt by `run_id` retries a request that run proved never sent.
    pub fn network_retry_by(&self, run_id: &RunId) -> bool {
        self.status == IntentStatus::Reserved
            && self.latest_not_sent
            && self.latest_attempt_run.as_ref() == Some(run_id)
    }

    /// When the latest request is certainly over and a lookup's "absent" can be believed:
    /// the send, plus the provider's request timeout (until then the request may still land),
    /// plus its consistency window. `None` when never sent; an instant past chrono's range
    /// reads as the latest one (a resend never comes).
    pub fn resend_window_end(&self) -> Option<DateTime<Utc>> {
        let sent = self.last_sent_at?;
        let wait = self.capability.request_timeout_ms.checked_add(self.capability.consistency_window_ms);
        Some(wait.and_then(|ms| checked_plus_ms(sent, ms)).unwrap_or(DateTime::<Utc>::MAX_UTC))
    }

    /// Whether the intent has reached an end no automatic step will change.
    pub fn settled(&self) -> bool {
        matches!(
            self.status,
            IntentStatus::Validated
                | IntentStatus::Declined
                | IntentStatus::Cancelled
                | IntentStatus::Rejected
                | IntentStatus::Escalated
        )
    }

    /// Whether a reconciliation is due at `now`.
    pub fn reconcile_due(&self, now: DateTime<Utc>) -> bool {
        self.status == IntentStatus::OutcomeUnknown && self.reconcile_after.is_some_and(|at| at <= now)
    }

    fn within_key_window(&self, now: DateTime<Utc>) -> bool {
        self.first_sent_at.is_none_or(|first| ms_between(first, now) < self.capability.key_window_ms)
    }
}

/// One entry of a run's journal.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JournalEntry {
    /// Position, from 0.
    pub position: u32,
    /// Step name (`intent:<key>` for intents, `timer` for timers, `signal:<name>` for waits).
    pub name: String,
    /// Recorded output (the timer's `fire_at` for timers).
    pub output: Value,
}

/// The folded state of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Run {
    /// The run.
    pub run_id: RunId,
    /// The workflow's name.
    pub workflow: String,
    /// Its input, secrets hashed.
    pub input: Value,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its absolute deadline.
    pub deadline_at: DateTime<Utc>,
    /// Its limits.
    pub limits: RunLimits,
    /// `None` while running.
    pub status: Option<RunStatus>,
    /// Detail of its end.
    pub detail: Option<String>,
    /// What it recorded, in order.
    pub journal: Vec<JournalEntry>,
    /// Signals delivered, in order, by name.
    pub signals: BTreeMap<String, Vec<Value>>,
    /// Intents it reserved.
    pub intents: Vec<IntentKey>,
    /// An agent run's journal (`AgentRecorded` facts), in order; empty for a workflow run.
    pub agent_events: Vec<AgentEvent>,
    /// The fold of `agent_events` (derived, so not part of the rendering).
    #[serde(skip)]
    pub agent: AgentState,
    /// Attempts this run started again after one it proved never sent (network retries),
    /// bounded by [`limits::NETWORK_RETRIES_PER_RUN_MAX`].
    #[serde(skip_serializing_if = "is_zero")]
    pub network_retries: u32,
    /// The process that started the run (it held the run's lease first).
    pub started_by: Option<LeaseOwner>,
    /// Global sequence of its latest event.
    pub last_seq: u64,
}

impl Run {
    /// Whether this is an agent run (resumed by `keel agent resume`, not by the workflow
    /// executor).
    pub fn is_agent(&self) -> bool {
        self.workflow.starts_with(AGENT_WORKFLOW_PREFIX)
    }
}

/// The prefix of an agent run's workflow name in `RunStarted` (`agent:ticket-review`).
pub const AGENT_WORKFLOW_PREFIX: &str = "agent:";

/// What the spine records in `RunStarted` when an agent run's first facts are appended.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRunStart {
    /// The run's input as stored (how to resume it: transport, transcript, never a secret).
    pub input: Value,
    /// The spine's limits for the intents the agent's effect tools reserve.
    pub limits: RunLimits,
    /// The process starting the run: it holds the run's lease (fencing token 1).
    pub owner: Option<LeaseOwner>,
}

/// What a caller asks the ledger to decide.
#[derive(Clone, Debug)]
pub struct Command {
    /// Who or what asks.
    pub cause: Cause,
    /// A run to start in the same commit, written only if the action is accepted: a
    /// rejected first proposal leaves nothing behind, not even the run.
    pub start_run: Option<RunStart>,
    /// The action.
    pub action: Action,
    /// The lease the command writes under: a write for a run must present the run's current
    /// fencing token (see [`crate::lease`]).
    pub lease: LeaseUse,
}

impl Command {
    /// `action` on behalf of `cause`, starting nothing, under no lease.
    pub fn new(cause: Cause, action: Action) -> Self {
        Self { cause, start_run: None, action, lease: LeaseUse::None }
    }

    /// The same command, starting `run` in its commit if accepted.
    pub fn starting(mut self, run: Option<RunStart>) -> Self {
        self.start_run = run;
        self
    }

    /// The same command, written under `lease`.
    pub fn under(mut self, lease: LeaseUse) -> Self {
        self.lease = lease;
        self
    }
}

/// A run to start.
#[derive(Clone, Debug)]
pub struct RunStart {
    /// The run's id.
    pub run_id: RunId,
    /// The workflow's name.
    pub workflow: String,
    /// Its input, secrets hashed.
    pub input: Value,
    /// Its absolute deadline.
    pub deadline_at: DateTime<Utc>,
    /// Its limits.
    pub limits: RunLimits,
    /// The process starting it: it holds the run's lease (fencing token 1).
    pub owner: Option<LeaseOwner>,
}

/// The definition of an intent to reserve.
#[derive(Clone, Debug)]
pub struct IntentSpec {
    /// What it is.
    pub definition: IntentDefinition,
    /// The provider's capability.
    pub capability: Capability,
    /// The caller requires a human approval whatever the run's threshold says (an agent
    /// tool whose policy asks for one): the stricter of the two wins.
    pub approval_required: bool,
}

/// Everything a command may ask.
#[derive(Clone, Debug)]
pub enum Action {
    /// Nothing beyond starting the run.
    StartRun,
    /// Read one intent (answered from the writer's state, so it sees every commit).
    Observe {
        /// The intent.
        key: IntentKey,
    },
    /// Read one run.
    ObserveRun {
        /// The run.
        run_id: RunId,
    },
    /// Read the intents due for reconciliation and the unfinished runs.
    Snapshot,
    /// Reserve key + fingerprint + money for `run_id`, journaled at `position`.
    Reserve {
        /// The reserving run.
        run_id: RunId,
        /// Journal position of the `intent` call.
        position: u32,
        /// The intent.
        spec: IntentSpec,
        /// Also write-ahead the first attempt in the same commit when the fresh intent may
        /// go at once (no approval needed, enough time left): one commit instead of two.
        start_attempt: bool,
    },
    /// Write-ahead the next attempt.
    StartAttempt {
        /// The intent.
        key: IntentKey,
        /// The run driving it.
        run_id: RunId,
    },
    /// Record an attempt's outcome.
    RecordOutcome {
        /// The intent.
        key: IntentKey,
        /// Which attempt.
        attempt: u32,
        /// What happened.
        outcome: CallOutcome,
    },
    /// Write-ahead the next reconciliation. `force` ignores `reconcile_after` (an operator's
    /// explicit request; the consistency window still guards any resend).
    StartReconciliation {
        /// The intent.
        key: IntentKey,
        /// Reconcile even if not yet due.
        force: bool,
        /// The run on whose behalf (whose lease the command holds).
        run_id: RunId,
    },
    /// Record a lookup's answer.
    RecordLookup {
        /// The intent.
        key: IntentKey,
        /// Which reconciliation.
        reconciliation: u32,
        /// What the provider said.
        outcome: LookupOutcome,
    },
    /// Recovery: every attempt without an outcome whose run nobody holds live becomes
    /// unknown (crash), every such interrupted lookup is recorded as such, and `owner` claims
    /// those runs' leases in the same commit. An attempt whose run is held live by another
    /// process is left alone: its owner is waiting for the answer. Exactly once: a second
    /// pass finds nothing. `run` limits it to one run's intents.
    Recover {
        /// The recovering process.
        owner: LeaseOwner,
        /// Only the intents in flight for this run (`None`: every run).
        run: Option<RunId>,
    },
    /// Take a run's lease, unless another process holds it live (see [`crate::lease`]).
    ClaimRun {
        /// The run.
        run_id: RunId,
        /// The claimant.
        owner: LeaseOwner,
    },
    /// Extend the holds of `grants`; a grant whose token is no longer current is reported
    /// lost (another process claimed the run).
    RenewLeases {
        /// The holder.
        owner: LeaseOwner,
        /// What it holds.
        grants: Vec<LeaseGrant>,
    },
    /// End the holds of `grants` that are still current: the process is done with them.
    ReleaseLeases {
        /// What it gives back.
        grants: Vec<LeaseGrant>,
    },
    /// A human approves an intent, bound to its fingerprint.
    Approve {
        /// The intent.
        key: IntentKey,
        /// The approver.
        by: String,
        /// Validity.
        ttl_ms: u64,
        /// The fingerprint the approver saw; refused if it is not the intent's.
        fingerprint: Option<String>,
    },
    /// Checks an approved intent's approval at `now`: one that lapsed is recorded expired
    /// (`ApprovalExpired`), so the intent awaits a fresh one instead of waiting on a dead one.
    CheckApproval {
        /// The intent.
        key: IntentKey,
    },
    /// A human denies an intent.
    Deny {
        /// The intent.
        key: IntentKey,
        /// The approver.
        by: String,
        /// Why.
        reason: String,
    },
    /// An operator cancels an intent with nothing in flight or unknown.
    Cancel {
        /// The intent.
        key: IntentKey,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
    },
    /// An operator resolves an unknown or escalated intent by hand. When the intent's provider
    /// can look effects up, `lookup` is what it said just before: an answer it contradicts is
    /// refused unless `override_reason` says why the operator knows better.
    Resolve {
        /// The intent.
        key: IntentKey,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
        /// Provider reference proving the effect; `None` asserts it is absent.
        landed: Option<String>,
        /// The provider's lookup, made by the executor before deciding; `None` when the
        /// intent's provider offers none.
        lookup: Option<LookupOutcome>,
        /// The operator's reason for recording an answer the provider contradicts.
        override_reason: Option<String>,
    },
    /// Record a journaled step's output.
    RecordStep {
        /// The run.
        run_id: RunId,
        /// Its position.
        position: u32,
        /// Its name.
        name: String,
        /// Its output.
        output: Value,
    },
    /// Start a durable timer.
    StartTimer {
        /// The run.
        run_id: RunId,
        /// Its position.
        position: u32,
        /// When it fires.
        fire_at: DateTime<Utc>,
    },
    /// Deliver a signal to a run.
    DeliverSignal {
        /// The run.
        run_id: RunId,
        /// The signal's name.
        name: String,
        /// Its payload.
        payload: Value,
    },
    /// Append a batch of an agent run's facts atomically. The batch must fold onto the run's
    /// agent state; a new run starts with `AgentRunStarted` and needs `start`. A batch that
    /// stops the run also finishes it (`RunFinished`, same commit).
    RecordAgent {
        /// The run.
        run_id: RunId,
        /// The facts, in order.
        events: Vec<AgentEvent>,
        /// Used when the run does not exist yet.
        start: Option<AgentRunStart>,
    },
    /// End a run.
    FinishRun {
        /// The run.
        run_id: RunId,
        /// How it ended.
        status: RunStatus,
        /// Detail.
        detail: Option<String>,
    },
}

impl Action {
    /// The run this action writes for, whose lease it must hold (see [`crate::lease`]).
    /// Reads, operator decisions on intents, signals and provider answers write for no run:
    /// an answer is evidence whoever brings it.
    pub fn fenced_run(&self) -> Option<&RunId> {
        match self {
            Self::Reserve { run_id, .. }
            | Self::StartAttempt { run_id, .. }
            | Self::StartReconciliation { run_id, .. }
            | Self::RecordStep { run_id, .. }
            | Self::StartTimer { run_id, .. }
            | Self::RecordAgent { run_id, .. }
            | Self::FinishRun { run_id, .. } => Some(run_id),
            Self::StartRun
            | Self::Observe { .. }
            | Self::ObserveRun { .. }
            | Self::Snapshot
            | Self::RecordOutcome { .. }
            | Self::RecordLookup { .. }
            | Self::Recover { .. }
            | Self::ClaimRun { .. }
            | Self::RenewLeases { .. }
            | Self::ReleaseLeases { .. }
            | Self::Approve { .. }
            | Self::CheckApproval { .. }
            | Self::Deny { .. }
            | Self::Cancel { .. }
            | Self::Resolve { .. }
            | Self::DeliverSignal { .. } => None,
        }
    }
}

/// Why a proposal was rejected before any reservation. Nothing is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectCode {
    /// The input does not satisfy the contract.
    InvalidArguments,
    /// A policy refuses it (e.g. amount above the per-charge maximum).
    PolicyDenied,
    /// The run's money budget (or deadline) cannot cover it.
    BudgetExhausted,
    /// The key was reserved with a different fingerprint.
    IntentPayloadMismatch,
    /// A cumulative invariant would break (refunds above the amount charged).
    InvariantViolated,
    /// Another key for the same business reference is still pending.
    ReferencePending,
}

impl RejectCode {
    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::InvalidArguments => "invalid_arguments",
            Self::PolicyDenied => "policy_denied",
            Self::BudgetExhausted => "budget_exhausted",
            Self::IntentPayloadMismatch => "intent_payload_mismatch",
            Self::InvariantViolated => "invariant_violated",
            Self::ReferencePending => "reference_pending",
        }
    }
}

/// A command the ledger refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A proposal rejected before reservation.
    #[error("rejected ({}): {detail}", code.as_str())]
    Rejected {
        /// Why.
        code: RejectCode,
        /// Details for the caller.
        detail: String,
    },
    /// The command does not apply to the intent's current state.
    #[error("{0}")]
    NotAllowed(String),
    /// No such intent.
    #[error("no intent with key {0}")]
    UnknownIntent(IntentKey),
    /// No such run.
    #[error("no run with id {0}")]
    UnknownRun(RunId),
    /// A request proven never sent may not be retried again by this run: its network
    /// retries are spent. The intent stays reserved; a new submission continues it.
    #[error("run {run_id}: all {spent} network retries spent, the provider could not be reached")]
    NetworkRetriesSpent {
        /// The run.
        run_id: RunId,
        /// Retries it made.
        spent: u32,
    },
    /// The command writes for a run whose lease another process took: its token is stale.
    #[error(
        "run {run_id} is now held by {holder} (fencing token {current}); this writer presented {}: its writes are refused",
        presented.map_or_else(|| "no token".to_owned(), |t| format!("token {t}"))
    )]
    Fenced {
        /// The run.
        run_id: RunId,
        /// The token presented, if any.
        presented: Option<u64>,
        /// The current token.
        current: u64,
        /// The current holder.
        holder: LeaseOwner,
    },
    /// Another process holds the run's lease live.
    #[error("run {run_id} is held by {owner} until {expires_at} (it renews while it works)")]
    LeaseHeld {
        /// The run.
        run_id: RunId,
        /// The live holder.
        owner: LeaseOwner,
        /// Until when, unless renewed.
        expires_at: DateTime<Utc>,
    },
    /// Replayed code asked for something else than what is recorded at this position.
    #[error("nondeterministic replay at position {position}: recorded {recorded:?}, asked {asked:?}")]
    Nondeterministic {
        /// The journal position.
        position: u32,
        /// What the journal holds there.
        recorded: String,
        /// What the code asked.
        asked: String,
    },
}

/// The answer to an accepted command, read after its events were folded
/// ([`Ledger::reply_after`]).
#[derive(Clone, Debug)]
pub enum Reply {
    /// Nothing to say.
    Done,
    /// An intent's state. `fresh` is true when this command reserved it.
    Intent {
        /// The intent after the command.
        intent: Box<Intent>,
        /// Whether this command reserved it.
        fresh: bool,
    },
    /// A run's state.
    Run(Box<Run>),
    /// What recovery did.
    Recovered(Recovery),
    /// The run's lease, now held by the claimant.
    Claimed(LeaseGrant),
    /// Grants that could not be renewed: another process claimed their runs.
    Renewed {
        /// The runs lost.
        lost: Vec<RunId>,
    },
    /// Intents due for reconciliation and runs not yet finished.
    Snapshot {
        /// Due intents, oldest first.
        due: Vec<IntentKey>,
        /// Unfinished runs.
        unfinished: Vec<Run>,
    },
}

/// What a reply refers to, resolved after the events are applied.
#[derive(Clone, Debug)]
pub enum ReplyTarget {
    /// Nothing.
    Done,
    /// An intent, and whether the command reserved it.
    Intent(IntentKey, bool),
    /// A run.
    Run(RunId),
    /// What recovery did.
    Recovered(Recovery),
    /// A claimed lease.
    Claimed(LeaseGrant),
    /// Renewal result.
    Renewed(Vec<RunId>),
    /// Due intents and unfinished runs as of `now`.
    Snapshot(DateTime<Utc>),
}

/// What one recovery pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Intents whose attempt or lookup in flight it recorded as interrupted (`crash`).
    pub recovered: Vec<IntentKey>,
    /// The runs whose leases it claimed for them (the recovering process now holds them).
    pub claimed: Vec<LeaseGrant>,
    /// Intents left alone because another process holds their run live, with that holder.
    pub held_elsewhere: Vec<(IntentKey, LeaseOwner)>,
}

/// What [`Ledger::decide`] decided: the events to append, what to answer, and the lease
/// changes the store applies in the same transaction.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Events to append, in order.
    pub events: Vec<Event>,
    /// What to answer after they are folded.
    pub target: ReplyTarget,
    /// Lease expiries to write.
    pub leases: Vec<LeaseEffect>,
}

/// The fold of the whole log.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    intents: HashMap<IntentKey, Intent>,
    runs: HashMap<RunId, Run>,
    /// (tenant, order id) → intents on that order, for cumulative invariants.
    orders: HashMap<(String, String), Vec<IntentKey>>,
    /// (tenant, operation, business reference) → intents, for the "new key while pending" rule.
    references: HashMap<(String, EffectKind, String), Vec<IntentKey>>,
    stream_lengths: HashMap<StreamId, u64>,
    last_seq: u64,
    last_hash: Option<String>,
}

impl Ledger {
    /// An empty ledger: the state before the first event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Global sequence of the last applied event (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Hash of the last applied event (the genesis hash when empty).
    pub fn last_hash(&self) -> &str {
        self.last_hash.as_deref().unwrap_or(crate::event::GENESIS_HASH)
    }

    /// Number of events on `stream` so far.
    pub fn stream_length(&self, stream: &StreamId) -> u64 {
        self.stream_lengths.get(stream).copied().unwrap_or(0)
    }

    /// One intent.
    pub fn intent(&self, key: &IntentKey) -> Option<&Intent> {
        self.intents.get(key)
    }

    /// Every intent, in key order.
    pub fn intents(&self) -> Vec<&Intent> {
        let mut all: Vec<&Intent> = self.intents.values().collect();
        all.sort_by(|a, b| a.key().cmp(b.key()));
        all
    }

    /// One run.
    pub fn run(&self, run_id: &RunId) -> Option<&Run> {
        self.runs.get(run_id)
    }

    /// Every run, in id order.
    pub fn runs(&self) -> Vec<&Run> {
        let mut all: Vec<&Run> = self.runs.values().collect();
        all.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        all
    }

    /// Money the run has committed (reserved, held while unknown, or spent), in minor units of
    /// the run's one currency.
    pub fn run_cost_committed_minor(&self, run_id: &RunId) -> i64 {
        self.run_sum(run_id, Intent::money_committed)
            .expect("a run's reserved amounts sum inside i64: Reserve refuses one that would not, apply asserts it")
    }

    /// Money left in the run's budget, `None` when unbounded (negative if over it, which the
    /// ledger never lets happen).
    pub fn run_cost_remaining_minor(&self, run_id: &RunId) -> Option<i64> {
        let run = self.runs.get(run_id)?;
        let max = run.limits.cost_minor_max?;
        max.checked_sub(self.run_cost_committed_minor(run_id))
    }

    /// Validated charges on an order in `currency`, in minor units.
    pub fn order_charged_minor(&self, tenant: &str, order_id: &str, currency: &str) -> i64 {
        self.order_sum(tenant, order_id, EffectKind::Charge, currency, |i| i.status == IntentStatus::Validated)
            .expect("an order's reserved amounts sum inside i64: Reserve refuses one that would not, apply asserts it")
    }

    /// Refunds on an order in `currency` that are reserved, unknown or validated, in minor
    /// units.
    pub fn order_refunds_committed_minor(&self, tenant: &str, order_id: &str, currency: &str) -> i64 {
        self.order_sum(tenant, order_id, EffectKind::Refund, currency, Intent::money_committed)
            .expect("an order's reserved amounts sum inside i64: Reserve refuses one that would not, apply asserts it")
    }

    /// The currencies an order's charges were reserved in (empty when it has none).
    pub fn order_charge_currencies(&self, tenant: &str, order_id: &str) -> Vec<&str> {
        let mut currencies: Vec<&str> = self
            .order_intents(tenant, order_id)
            .filter(|intent| intent.definition.kind == EffectKind::Charge)
            .map(|intent| intent.definition.currency.as_str())
            .collect();
        currencies.sort_unstable();
        currencies.dedup();
        currencies
    }

    fn order_intents(&self, tenant: &str, order_id: &str) -> impl Iterator<Item = &Intent> {
        self.orders
            .get(&(tenant.to_owned(), order_id.to_owned()))
            .into_iter()
            .flatten()
            .filter_map(|key| self.intents.get(key))
    }

    /// The checked sum of an order's amounts of one kind and currency that `counts`.
    fn order_sum(
        &self,
        tenant: &str,
        order_id: &str,
        kind: EffectKind,
        currency: &str,
        counts: impl Fn(&Intent) -> bool,
    ) -> Option<i64> {
        checked_sum(
            self.order_intents(tenant, order_id)
                .filter(|intent| {
                    intent.definition.kind == kind && intent.definition.currency == currency && counts(intent)
                })
                .map(|intent| intent.definition.amount_minor),
        )
    }

    /// The checked sum of a run's amounts that `counts`.
    fn run_sum(&self, run_id: &RunId, counts: impl Fn(&Intent) -> bool) -> Option<i64> {
        self.runs.get(run_id).map_or(Some(0), |run| {
            checked_sum(
                run.intents
                    .iter()
                    .filter_map(|key| self.intents.get(key))
                    .filter(|intent| counts(intent))
                    .map(|intent| intent.definition.amount_minor),
            )
        })
    }

    /// Why reserving `definition` for `run_id` would make a money sum overflow, if it would:
    /// every amount the run reserved, and every amount of the order of the same kind and
    /// currency, must sum inside `i64` whatever their statuses become.
    fn reservation_overflows(&self, run_id: &RunId, definition: &IntentDefinition) -> Option<String> {
        let amount = definition.amount_minor;
        let run = self.run_sum(run_id, |_| true).and_then(|sum| sum.checked_add(amount));
        let order = self
            .order_sum(&definition.tenant, &definition.order_id, definition.kind, &definition.currency, |_| true)
            .and_then(|sum| sum.checked_add(amount));
        match (run, order) {
            (None, _) => Some(format!("run {run_id}'s reserved amounts would overflow with {amount} more")),
            (_, None) => Some(format!(
                "order {}'s {} total in {} would overflow with {amount} more",
                definition.order_id,
                definition.kind.as_str(),
                definition.currency
            )),
            _ => None,
        }
    }

    /// Intents whose reconciliation is due at `now`, oldest due first.
    pub fn due_for_reconciliation(&self, now: DateTime<Utc>) -> Vec<IntentKey> {
        let mut due: Vec<&Intent> = self.intents.values().filter(|i| i.reconcile_due(now)).collect();
        due.sort_by_key(|i| (i.reconcile_after, i.key().clone()));
        due.into_iter().map(|i| i.key().clone()).collect()
    }

    /// Runs that have not finished.
    pub fn unfinished_runs(&self) -> Vec<RunId> {
        let mut open: Vec<RunId> =
            self.runs.values().filter(|r| r.status.is_none()).map(|r| r.run_id.clone()).collect();
        open.sort();
        open
    }

    /// Turns a reply target into the reply, reading the state after the decision's events.
    pub fn reply_after(&self, target: &ReplyTarget) -> Reply {
        match target {
            ReplyTarget::Done => Reply::Done,
            ReplyTarget::Intent(key, fresh) => match self.intents.get(key) {
                Some(intent) => Reply::Intent { intent: Box::new(intent.clone()), fresh: *fresh },
                None => Reply::Done,
            },
            ReplyTarget::Run(run_id) => match self.runs.get(run_id) {
                Some(run) => Reply::Run(Box::new(run.clone())),
                None => Reply::Done,
            },
            ReplyTarget::Recovered(recovery) => Reply::Recovered(recovery.clone()),
            ReplyTarget::Claimed(grant) => Reply::Claimed(grant.clone()),
            ReplyTarget::Renewed(lost) => Reply::Renewed { lost: lost.clone() },
            ReplyTarget::Snapshot(now) => Reply::Snapshot {
                due: self.due_for_reconciliation(*now),
                unfinished: self.unfinished_runs().iter().filter_map(|id| self.runs.get(id)).cloned().collect(),
            },
        }
    }

    /// Folds one stored event. Panics on an impossible transition, naming stream and seq.
    pub fn apply(&mut self, stored: &StoredEvent) {
        assert_eq!(
            stored.seq,
            self.last_seq + 1,
            "events fold in global order without gaps (stream {})",
            stored.stream
        );
        let stream_length = self.stream_lengths.entry(stored.stream.clone()).or_insert(0);
        assert_eq!(
            stored.stream_seq,
            *stream_length + 1,
            "stream {} folds in order without gaps at seq {}",
            stored.stream,
            stored.seq
        );
        assert_eq!(stored.stream, stored.event.stream(), "event at seq {} is on its own stream", stored.seq);
        *stream_length += 1;
        self.last_seq = stored.seq;
        self.last_hash = Some(stored.hash.clone());
        let at = stored.at;
        let seq = stored.seq;
        let fail =
            |what: &str| -> ! { panic!("impossible transition at seq {seq} on stream {}: {what}", stored.stream) };

        match &stored.event {
            Event::RunStarted { run_id, workflow, input, deadline_at, limits, owner } => {
                if self.runs.contains_key(run_id) {
                    fail("run started twice");
                }
                self.runs.insert(
                    run_id.clone(),
                    Run {
                        run_id: run_id.clone(),
                        workflow: workflow.clone(),
                        input: input.clone(),
                        started_at: at,
                        deadline_at: *deadline_at,
                        limits: limits.clone(),
                        status: None,
                        detail: None,
                        journal: Vec::new(),
                        signals: BTreeMap::new(),
                        intents: Vec::new(),
                        agent_events: Vec::new(),
                        agent: AgentState::default(),
                        network_retries: 0,
                        started_by: owner.clone(),
                        last_seq: seq,
                    },
                );
            }
            Event::RunDeadlineExtended { run_id, deadline_at } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("deadline of an unknown run"));
                if *deadline_at < run.deadline_at {
                    fail("a deadline moved back");
                }
                run.deadline_at = *deadline_at;
                run.last_seq = seq;
            }
            Event::StepRecorded { run_id, position, name, output } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("step on an unknown run"));
                if *position as usize != run.journal.len() {
                    fail("journal position out of order");
                }
                run.journal.push(JournalEntry { position: *position, name: name.clone(), output: output.clone() });
                run.last_seq = seq;
            }
            Event::TimerStarted { run_id, position, fire_at } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("timer on an unknown run"));
                if *position as usize != run.journal.len() {
                    fail("journal position out of order");
                }
                run.journal.push(JournalEntry {
                    position: *position,
                    name: "timer".to_owned(),
                    output: Value::String(fire_at.to_rfc3339()),
                });
                run.last_seq = seq;
            }
            Event::SignalDelivered { run_id, name, payload } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("signal to an unknown run"));
                run.signals.entry(name.clone()).or_default().push(payload.clone());
                run.last_seq = seq;
            }
            Event::AgentRecorded { run_id, event } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("agent fact on an unknown run"));
                if run.status.is_some() {
                    fail("agent fact on a finished run");
                }
                if let Err(why) = run.agent.try_apply(event) {
                    fail(&why);
                }
                run.agent_events.push(event.clone());
                run.last_seq = seq;
            }
            Event::RunFinished { run_id, status, detail } => {
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("finish of an unknown run"));
                if run.status.is_some() {
                    fail("run finished twice");
                }
                run.status = Some(*status);
                run.detail = detail.clone();
                run.last_seq = seq;
            }
            Event::IntentReserved {
                intent,
                run_id,
                capability,
                attempts_max,
                reconciliations_max,
                approval_required,
            } => {
                if self.intents.contains_key(&intent.key) {
                    fail("intent reserved twice");
                }
                if !self.runs.contains_key(run_id) {
                    fail("intent reserved by an unknown run");
                }
                if self.reservation_overflows(run_id, intent).is_some() {
                    fail("a reservation makes a money sum overflow");
                }
                let run = self.runs.get_mut(run_id).unwrap_or_else(|| fail("intent reserved by an unknown run"));
                run.intents.push(intent.key.clone());
                run.last_seq = seq;
                self.orders
                    .entry((intent.tenant.clone(), intent.order_id.clone()))
                    .or_default()
                    .push(intent.key.clone());
                self.references
                    .entry((intent.tenant.clone(), intent.kind, intent.business_ref.clone()))
                    .or_default()
                    .push(intent.key.clone());
                self.intents.insert(
                    intent.key.clone(),
                    Intent {
                        definition: intent.clone(),
                        run_id: run_id.clone(),
                        capability: *capability,
                        status: if *approval_required {
                            IntentStatus::AwaitingApproval
                        } else {
                            IntentStatus::Reserved
                        },
                        attempts: 0,
                        attempts_max: *attempts_max,
                        reconciliations: 0,
                        reconciliations_max: *reconciliations_max,
                        first_sent_at: None,
                        last_sent_at: None,
                        reconcile_after: None,
                        unknown_reason: None,
                        source: None,
                        evidence: None,
                        decline_code: None,
                        approval_required: *approval_required,
                        approval: None,
                        absence_proven: false,
                        note: None,
                        duplicates_suppressed: 0,
                        not_sent: 0,
                        latest_not_sent: false,
                        latest_attempt_run: None,
                        in_flight_run: None,
                        late_answers: 0,
                        approval_closes_at: None,
                        last_seq: seq,
                    },
                );
            }
            other => {
                let key = other.intent_key().unwrap_or_else(|| fail("event without an intent key"));
                let intent = self.intents.get_mut(key).unwrap_or_else(|| fail("event on an unknown intent"));
                let retrying = match other {
                    Event::AttemptStarted { run_id, .. } if intent.network_retry_by(run_id) => Some(run_id.clone()),
                    _ => None,
                };
                apply_to_intent(intent, other, at).unwrap_or_else(|what| fail(what));
                intent.last_seq = seq;
                if let Some(run_id) = retrying {
                    let run = self.runs.get_mut(&run_id).unwrap_or_else(|| fail("a retry by an unknown run"));
                    run.network_retries += 1;
                }
            }
        }
    }

    /// Decides what to append for `command` at `now`. Pure: the caller appends the events and
    /// then folds them with [`Ledger::apply`].
    ///
    /// `leases` answers what the log itself does not hold: when each run's lease expires and
    /// whether a holder still runs (see [`crate::lease`]).
    pub fn decide(&self, command: &Command, now: DateTime<Utc>, leases: &dyn LeaseView) -> Result<Decision, Refusal> {
        let mut events = Vec::new();
        let mut lease_effects = Vec::new();
        let run_start = command.start_run.as_ref();
        if let Some(start) = run_start {
            if self.runs.contains_key(&start.run_id) {
                return Err(Refusal::NotAllowed(format!("run {} already exists", start.run_id)));
            }
            events.push(Event::RunStarted {
                run_id: start.run_id.clone(),
                workflow: start.workflow.clone(),
                input: start.input.clone(),
                deadline_at: start.deadline_at,
                limits: start.limits.clone(),
                owner: start.owner.clone(),
            });
            if let Some(owner) = &start.owner {
                lease_effects.push(LeaseEffect::Hold {
                    run_id: start.run_id.clone(),
                    owner: owner.clone(),
                    token: 1,
                    expires_at: bounded_later(now, leases.ttl_ms()),
                });
            }
        }
        if let Some(run_id) = command.action.fenced_run() {
            check_fence(run_id, &command.lease, leases)?;
        }
        let target = match &command.action {
            Action::StartRun => match run_start {
                Some(start) => ReplyTarget::Run(start.run_id.clone()),
                None => return Err(Refusal::NotAllowed("StartRun without a run to start".to_owned())),
            },
            Action::Observe { key } => {
                self.existing(key)?;
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::Snapshot => ReplyTarget::Snapshot(now),
            Action::ObserveRun { run_id } => {
                self.runs.get(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                ReplyTarget::Run(run_id.clone())
            }
            Action::Reserve { run_id, position, spec, start_attempt } => {
                self.decide_reserve(run_start, run_id, *position, spec, *start_attempt, now, &mut events)?
            }
            Action::StartAttempt { key, run_id } => {
                self.decide_start_attempt(key, run_id, run_start, now, &mut events)?
            }
            Action::RecordOutcome { key, attempt, outcome } => {
                self.decide_outcome(key, *attempt, outcome, now, &mut events)?
            }
            Action::StartReconciliation { key, force, run_id } => {
                self.decide_start_reconciliation(key, *force, run_id, now, &mut events)?
            }
            Action::RecordLookup { key, reconciliation, outcome } => {
                self.decide_lookup(key, *reconciliation, outcome, now, &mut events)?
            }
            Action::Recover { owner, run } => {
                self.decide_recover(owner, run.as_ref(), now, leases, &mut events, &mut lease_effects)
            }
            Action::ClaimRun { run_id, owner } => self.decide_claim(run_id, owner, now, leases, &mut lease_effects)?,
            Action::RenewLeases { owner, grants } => {
                let mut lost = Vec::new();
                for grant in grants {
                    match leases.holder(&grant.run_id) {
                        Some(row) if row.token == grant.token && &row.owner == owner && row.expires_at.is_some() => {
                            lease_effects.push(LeaseEffect::Hold {
                                run_id: grant.run_id.clone(),
                                owner: owner.clone(),
                                token: grant.token,
                                expires_at: bounded_later(now, leases.ttl_ms()),
                            });
                        }
                        _ => lost.push(grant.run_id.clone()),
                    }
                }
                ReplyTarget::Renewed(lost)
            }
            Action::ReleaseLeases { grants } => {
                for grant in grants {
                    if leases.holder(&grant.run_id).is_some_and(|row| row.token == grant.token) {
                        lease_effects.push(LeaseEffect::Release { run_id: grant.run_id.clone() });
                    }
                }
                ReplyTarget::Done
            }
            Action::Approve { key, by, ttl_ms, fingerprint } => {
                let intent = self.existing(key)?;
                if intent.status != IntentStatus::AwaitingApproval {
                    return Err(Refusal::NotAllowed(format!(
                        "intent {key} is {}, not awaiting approval",
                        intent.status.as_str()
                    )));
                }
                if let Some(closes_at) = intent.approval_closes_at
                    && now >= closes_at
                {
                    return Err(Refusal::NotAllowed(format!(
                        "approval refused: the approval window of intent {key} closed at {closes_at}; its run \
                         stops deadline_exceeded and the intent is released when it resumes"
                    )));
                }
                if let Some(seen) = fingerprint
                    && seen != &intent.definition.fingerprint
                {
                    return Err(Refusal::NotAllowed(format!(
                        "approval refused: fingerprint {seen} is not the intent's ({})",
                        intent.definition.fingerprint
                    )));
                }
                let expires_at = checked_plus_ms(now, *ttl_ms).ok_or_else(|| {
                    Refusal::NotAllowed(format!("an approval valid for {ttl_ms} ms would expire past any date"))
                })?;
                events.push(Event::ApprovalGranted {
                    key: key.clone(),
                    fingerprint: intent.definition.fingerprint.clone(),
                    by: by.clone(),
                    expires_at,
                });
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::CheckApproval { key } => {
                let intent = self.existing(key)?;
                let lapsed = intent.status == IntentStatus::Reserved
                    && intent.approval_required
                    && intent.attempts == 0
                    && intent.approval.as_ref().is_some_and(|approval| approval.expires_at <= now);
                if lapsed {
                    events.push(Event::ApprovalExpired { key: key.clone() });
                }
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::Deny { key, by, reason } => {
                let intent = self.existing(key)?;
                if intent.status != IntentStatus::AwaitingApproval {
                    return Err(Refusal::NotAllowed(format!(
                        "intent {key} is {}, not awaiting approval",
                        intent.status.as_str()
                    )));
                }
                events.push(Event::ApprovalDenied { key: key.clone(), by: by.clone(), reason: reason.clone() });
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::Cancel { key, by, reason } => {
                let intent = self.existing(key)?;
                if !matches!(intent.status, IntentStatus::Reserved | IntentStatus::AwaitingApproval) {
                    return Err(Refusal::NotAllowed(format!(
                        "intent {key} is {}: only a reserved or awaiting-approval intent can be cancelled \
                         (an attempt in flight or unknown must be reconciled or resolved first)",
                        intent.status.as_str()
                    )));
                }
                events.push(Event::IntentCancelled { key: key.clone(), by: by.clone(), reason: reason.clone() });
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::Resolve { key, by, reason, landed, lookup, override_reason } => {
                let intent = self.existing(key)?;
                let check =
                    decide_resolution(intent, landed.as_deref(), lookup.as_ref(), override_reason.as_deref(), now)?;
                events.push(Event::IntentResolved {
                    key: key.clone(),
                    by: by.clone(),
                    reason: reason.clone(),
                    landed: landed.clone(),
                    check,
                });
                ReplyTarget::Intent(key.clone(), false)
            }
            Action::RecordStep { run_id, position, name, output } => {
                self.check_journal_position(run_start, run_id, *position)?;
                events.push(Event::StepRecorded {
                    run_id: run_id.clone(),
                    position: *position,
                    name: name.clone(),
                    output: output.clone(),
                });
                ReplyTarget::Run(run_id.clone())
            }
            Action::StartTimer { run_id, position, fire_at } => {
                self.check_journal_position(run_start, run_id, *position)?;
                events.push(Event::TimerStarted { run_id: run_id.clone(), position: *position, fire_at: *fire_at });
                ReplyTarget::Run(run_id.clone())
            }
            Action::DeliverSignal { run_id, name, payload } => {
                let run = self.runs.get(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                if run.status.is_some() {
                    return Err(Refusal::NotAllowed(format!("run {run_id} has finished")));
                }
                events.push(Event::SignalDelivered {
                    run_id: run_id.clone(),
                    name: name.clone(),
                    payload: payload.clone(),
                });
                ReplyTarget::Run(run_id.clone())
            }
            Action::RecordAgent { run_id, events: batch, start } => {
                if run_start.is_some() {
                    return Err(Refusal::NotAllowed("an agent run starts with its first facts, not start_run".into()));
                }
                self.decide_record_agent(run_id, batch, start.as_ref(), now, leases, &mut events, &mut lease_effects)?
            }
            Action::FinishRun { run_id, status, detail } => {
                let run = self.runs.get(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                if run.status.is_some() {
                    return Err(Refusal::NotAllowed(format!("run {run_id} has already finished")));
                }
                events.push(Event::RunFinished { run_id: run_id.clone(), status: *status, detail: detail.clone() });
                ReplyTarget::Run(run_id.clone())
            }
        };
        if let LeaseUse::Release(grant) = &command.lease
            && leases.holder(&grant.run_id).is_some_and(|row| row.token == grant.token)
        {
            lease_effects.push(LeaseEffect::Release { run_id: grant.run_id.clone() });
        }
        Ok(Decision { events, target, leases: lease_effects })
    }

    /// Claims `run_id` for `owner` unless another process holds it live.
    fn decide_claim(
        &self,
        run_id: &RunId,
        owner: &LeaseOwner,
        now: DateTime<Utc>,
        leases: &dyn LeaseView,
        effects: &mut Vec<LeaseEffect>,
    ) -> Result<ReplyTarget, Refusal> {
        let run = self.runs.get(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
        match self.claim(run, owner, now, leases, effects) {
            Ok(grant) => Ok(ReplyTarget::Claimed(grant)),
            Err((holder, expires_at)) => Err(Refusal::LeaseHeld { run_id: run_id.clone(), owner: holder, expires_at }),
        }
    }

    /// The claim rule applied to one run: the grant (the next token when the hold changes
    /// hands) or the live holder.
    fn claim(
        &self,
        run: &Run,
        owner: &LeaseOwner,
        now: DateTime<Utc>,
        leases: &dyn LeaseView,
        effects: &mut Vec<LeaseEffect>,
    ) -> Result<LeaseGrant, (LeaseOwner, DateTime<Utc>)> {
        let run_id = &run.run_id;
        let expires_at = bounded_later(now, leases.ttl_ms());
        let holder = leases.holder(run_id);
        let token = match claim_verdict(holder.as_ref(), owner, now, |o| leases.liveness(o)) {
            ClaimVerdict::Held(token) => token,
            ClaimVerdict::Free => holder.map_or(0, |row| row.token) + 1,
            ClaimVerdict::HeldElsewhere { owner, expires_at } => return Err((owner, expires_at)),
        };
        effects.push(LeaseEffect::Hold { run_id: run_id.clone(), owner: owner.clone(), token, expires_at });
        Ok(LeaseGrant { run_id: run_id.clone(), token })
    }

    /// Checks an agent batch by folding it onto a copy of the run's agent state: an
    /// impossible fact is refused and nothing is written.
    #[allow(clippy::too_many_arguments)] // One call site; the lease pair is the decision's output.
    fn decide_record_agent(
        &self,
        run_id: &RunId,
        batch: &[AgentEvent],
        start: Option<&AgentRunStart>,
        now: DateTime<Utc>,
        leases: &dyn LeaseView,
        events: &mut Vec<Event>,
        effects: &mut Vec<LeaseEffect>,
    ) -> Result<ReplyTarget, Refusal> {
        let refuse = |why: String| Refusal::NotAllowed(format!("run {run_id}: {why}"));
        if batch.is_empty() {
            return Err(refuse("an empty agent batch".into()));
        }
        let mut state = match self.runs.get(run_id) {
            Some(run) if run.status.is_some() => return Err(refuse("has finished".into())),
            Some(run) if run.agent.header.is_none() => return Err(refuse("is not an agent run".into())),
            Some(run) => run.agent.clone(),
            None => {
                let start = start.ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                let Some(AgentEvent::AgentRunStarted { run_id: agent_run, workflow, deadline, .. }) = batch.first()
                else {
                    return Err(refuse("a new agent run must start with AgentRunStarted".into()));
                };
                if agent_run != run_id.as_str() {
                    return Err(refuse(format!("AgentRunStarted names run {agent_run}")));
                }
                events.push(Event::RunStarted {
                    run_id: run_id.clone(),
                    workflow: format!("{AGENT_WORKFLOW_PREFIX}{workflow}"),
                    input: start.input.clone(),
                    deadline_at: *deadline,
                    limits: start.limits.clone(),
                    owner: start.owner.clone(),
                });
                if let Some(owner) = &start.owner {
                    effects.push(LeaseEffect::Hold {
                        run_id: run_id.clone(),
                        owner: owner.clone(),
                        token: 1,
                        expires_at: bounded_later(now, leases.ttl_ms()),
                    });
                }
                AgentState::default()
            }
        };
        for event in batch {
            state.try_apply(event).map_err(refuse)?;
            events.push(Event::AgentRecorded { run_id: run_id.clone(), event: event.clone() });
            events.extend(self.spine_side_of(run_id, event));
        }
        if let Some(stop) = &state.stop {
            let status = stop.status.run_status();
            events.push(Event::RunFinished { run_id: run_id.clone(), status, detail: stop.detail.clone() });
            // Nothing will send what the run reserved and never sent: release it.
            let run_intents = self.runs.get(run_id).map(|run| run.intents.as_slice()).unwrap_or_default();
            for key in run_intents {
                if self
                    .intents
                    .get(key)
                    .is_some_and(|i| matches!(i.status, IntentStatus::Reserved | IntentStatus::AwaitingApproval))
                {
                    events.push(Event::IntentReleased { key: key.clone(), reason: ReleaseReason::RunEnded { status } });
                }
            }
        }
        Ok(ReplyTarget::Done)
    }

    /// What an agent fact means for the spine, in the same commit: a wait for approval opens
    /// the intent's approval window; the end of a wait moves the run's deadline.
    fn spine_side_of(&self, run_id: &RunId, event: &AgentEvent) -> Option<Event> {
        match event {
            AgentEvent::ApprovalAwaited { intent_key, closes_at, .. } => {
                let key = IntentKey::parse(intent_key)?;
                let awaiting = self.intents.get(&key)?.status == IntentStatus::AwaitingApproval;
                awaiting.then_some(Event::ApprovalRequested { key, closes_at: *closes_at })
            }
            AgentEvent::ApprovalWaitEnded { deadline, .. } => {
                let run = self.runs.get(run_id)?;
                (*deadline > run.deadline_at)
                    .then_some(Event::RunDeadlineExtended { run_id: run_id.clone(), deadline_at: *deadline })
            }
            _ => None,
        }
    }

    fn existing(&self, key: &IntentKey) -> Result<&Intent, Refusal> {
        self.intents.get(key).ok_or_else(|| Refusal::UnknownIntent(key.clone()))
    }

    fn check_journal_position(
        &self,
        run_start: Option<&RunStart>,
        run_id: &RunId,
        position: u32,
    ) -> Result<(), Refusal> {
        let recorded = match self.runs.get(run_id) {
            Some(run) if run.status.is_some() => return Err(Refusal::NotAllowed(format!("run {run_id} has finished"))),
            Some(run) => run.journal.len(),
            None if run_start.is_some_and(|s| &s.run_id == run_id) => 0,
            None => return Err(Refusal::UnknownRun(run_id.clone())),
        };
        if position as usize != recorded {
            return Err(Refusal::NotAllowed(format!(
                "run {run_id}: journal position {position} asked, next free is {recorded}"
            )));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // One call site; the arguments are the command's fields.
    fn decide_reserve(
        &self,
        run_start: Option<&RunStart>,
        run_id: &RunId,
        position: u32,
        spec: &IntentSpec,
        start_attempt: bool,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) -> Result<ReplyTarget, Refusal> {
        let definition = &spec.definition;
        let key = &definition.key;
        let (limits, deadline_at) = match (self.runs.get(run_id), run_start) {
            (Some(run), _) if run.status.is_some() => {
                return Err(Refusal::NotAllowed(format!("run {run_id} has finished")));
            }
            (Some(run), _) => (run.limits.clone(), run.deadline_at),
            (None, Some(start)) if &start.run_id == run_id => (start.limits.clone(), start.deadline_at),
            (None, _) => return Err(Refusal::UnknownRun(run_id.clone())),
        };
        let step_name = format!("intent:{key}");
        // A run that already reserved this intent (an agent call polled while it waits for an
        // approval, or resumed after a crash) asks again: it finds the intent, and nothing is
        // written — polling never grows the log.
        let already_linked =
            self.runs.get(run_id).is_some_and(|run| run.journal.iter().any(|entry| entry.name == step_name));
        if already_linked && let Some(existing) = self.intents.get(key) {
            if existing.definition.fingerprint != definition.fingerprint {
                return Err(Refusal::Rejected {
                    code: RejectCode::IntentPayloadMismatch,
                    detail: format!("intent {key} was reserved with another payload"),
                });
            }
            // Proposed again once its effect is proven: a repetition prevented, worth a fact.
            if existing.status == IntentStatus::Validated {
                events.push(Event::IntentDeduplicated { key: key.clone(), run_id: run_id.clone() });
            }
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }
        let journal_link = Event::StepRecorded {
            run_id: run_id.clone(),
            position,
            name: step_name,
            output: Value::String(key.as_str().to_owned()),
        };
        self.check_journal_position(run_start, run_id, position)?;

        if let Some(existing) = self.intents.get(key) {
            if existing.definition.fingerprint != definition.fingerprint {
                return Err(Refusal::Rejected {
                    code: RejectCode::IntentPayloadMismatch,
                    detail: format!(
                        "intent {key} was reserved with another payload (fingerprint {}…, this one {}…)",
                        &existing.definition.fingerprint[..12.min(existing.definition.fingerprint.len())],
                        &definition.fingerprint[..12.min(definition.fingerprint.len())]
                    ),
                });
            }
            events.push(journal_link);
            if existing.status == IntentStatus::Validated {
                events.push(Event::IntentDeduplicated { key: key.clone(), run_id: run_id.clone() });
            }
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }

        let invalid = |detail: String| Refusal::Rejected { code: RejectCode::InvalidArguments, detail };
        check_amount(definition.amount_minor).map_err(|e| invalid(format!("amount_minor: {e}")))?;
        if !Currency::is_canonical(&definition.currency) {
            return Err(invalid(format!(
                "currency: {:?} is not an upper-case ISO 4217 code (parse it with engine::money::Currency)",
                definition.currency
            )));
        }
        if let Some(other) = self.run_currency(run_id).filter(|c| *c != definition.currency) {
            return Err(invalid(format!(
                "run {run_id} moves {other}: its money budget is one sum, so it cannot also move {}",
                definition.currency
            )));
        }
        if now >= deadline_at {
            return Err(Refusal::Rejected {
                code: RejectCode::BudgetExhausted,
                detail: format!("run {run_id} passed its deadline {deadline_at}"),
            });
        }
        // A second charge key for the same reference asserts a second charge: refused while the
        // first is open. Refunds are not bound by it: distinct refunds of one order are distinct
        // intents, and the cumulative invariant below is what protects the order.
        let reference = (definition.tenant.clone(), definition.kind, definition.business_ref.clone());
        if let Some(pending) = self
            .references
            .get(&reference)
            .into_iter()
            .flatten()
            .filter_map(|k| self.intents.get(k))
            .find(|i| i.definition.kind == EffectKind::Charge && i.pending())
        {
            return Err(Refusal::Rejected {
                code: RejectCode::ReferencePending,
                detail: format!(
                    "intent {} for the same {} reference {:?} is still {}: a new key cannot step around it",
                    pending.key(),
                    definition.kind.as_str(),
                    definition.business_ref,
                    pending.status.as_str()
                ),
            });
        }
        if let Some(detail) = self.reservation_overflows(run_id, definition) {
            return Err(Refusal::Rejected { code: RejectCode::InvariantViolated, detail });
        }
        if definition.kind == EffectKind::Refund {
            self.check_refund(definition)?;
        }
        if let Some(max) = limits.cost_minor_max {
            let committed = self.run_cost_committed_minor(run_id);
            let after = committed.checked_add(definition.amount_minor);
            if after.is_none_or(|after| after > max) {
                return Err(Refusal::Rejected {
                    code: RejectCode::BudgetExhausted,
                    detail: format!(
                        "run {run_id} has committed {committed} of its {max} minor-unit budget; {} more asked",
                        definition.amount_minor
                    ),
                });
            }
        }
        let approval_required = spec.approval_required
            || limits.approval_threshold_minor.is_some_and(|threshold| definition.amount_minor > threshold);
        events.push(journal_link);
        events.push(Event::IntentReserved {
            intent: definition.clone(),
            run_id: run_id.clone(),
            capability: spec.capability,
            attempts_max: limits.attempts_per_intent_max.max(1),
            reconciliations_max: limits.reconciliations_per_intent_max,
            approval_required,
        });
        // The same checks `StartAttempt` makes, for an intent never sent: attempts left (at
        // least one), key window unused, no approval pending, time left to reconcile.
        if start_attempt && !approval_required && ms_between(now, deadline_at) >= limits::RECONCILIATION_RESERVE_MS {
            events.push(Event::AttemptStarted { key: key.clone(), attempt: 1, run_id: run_id.clone() });
        }
        Ok(ReplyTarget::Intent(key.clone(), true))
    }

    /// The currency of the money a run already reserved, if it reserved any.
    fn run_currency(&self, run_id: &RunId) -> Option<&str> {
        let run = self.runs.get(run_id)?;
        run.intents.first().and_then(|key| self.intents.get(key)).map(|intent| intent.definition.currency.as_str())
    }

    /// A refund's currency must be its order's charge's, and refunds reserved, unknown or
    /// validated in that currency never exceed what was charged in it.
    fn check_refund(&self, definition: &IntentDefinition) -> Result<(), Refusal> {
        let (tenant, order, currency) = (&definition.tenant, &definition.order_id, &definition.currency);
        let charged_in = self.order_charge_currencies(tenant, order);
        if !charged_in.is_empty() && !charged_in.contains(&currency.as_str()) {
            return Err(Refusal::Rejected {
                code: RejectCode::InvalidArguments,
                detail: format!(
                    "currency: order {order} was charged in {}, a refund of it cannot be in {currency}",
                    charged_in.join(", ")
                ),
            });
        }
        let charged = self.order_charged_minor(tenant, order, currency);
        let refunded = self.order_refunds_committed_minor(tenant, order, currency);
        let after = refunded.checked_add(definition.amount_minor);
        if after.is_none_or(|after| after > charged) {
            return Err(Refusal::Rejected {
                code: RejectCode::InvariantViolated,
                detail: format!(
                    "refund of {} {currency} on order {order} would bring refunds (reserved, unknown or validated) \
                     from {refunded} above the {charged} {currency} charged",
                    definition.amount_minor
                ),
            });
        }
        Ok(())
    }

    fn decide_start_attempt(
        &self,
        key: &IntentKey,
        run_id: &RunId,
        run_start: Option<&RunStart>,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let deadline_at = match (self.runs.get(run_id), run_start) {
            (Some(run), _) => run.deadline_at,
            (None, Some(start)) if &start.run_id == run_id => start.deadline_at,
            (None, _) => return Err(Refusal::UnknownRun(run_id.clone())),
        };
        let resend_by_key = intent.status == IntentStatus::OutcomeUnknown
            && !intent.capability.lookup
            && intent.capability.dedup_by_key
            && intent.reconcile_due(now);
        if intent.status != IntentStatus::Reserved && !resend_by_key {
            return Err(Refusal::NotAllowed(format!(
                "intent {key} is {}: no new attempt{}",
                intent.status.as_str(),
                match intent.status {
                    IntentStatus::Attempting => " while one is in flight",
                    IntentStatus::OutcomeUnknown | IntentStatus::Reconciling => " before reconciliation",
                    IntentStatus::AwaitingApproval => " without an approval",
                    _ => "",
                }
            )));
        }
        if intent.approval_required {
            match &intent.approval {
                Some(approval)
                    if approval.fingerprint == intent.definition.fingerprint && approval.expires_at > now => {}
                Some(approval) if approval.expires_at <= now => {
                    events.push(Event::ApprovalExpired { key: key.clone() });
                    return Ok(ReplyTarget::Intent(key.clone(), false));
                }
                _ => {
                    return Err(Refusal::NotAllowed(format!("intent {key} has no valid approval for its fingerprint")));
                }
            }
        }
        if intent.attempts_spent() >= intent.attempts_max {
            events.push(Event::IntentEscalated {
                key: key.clone(),
                reason: format!("all {} attempts spent", intent.attempts_max),
                absence_proven: intent.absence_proven,
            });
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }
        if intent.network_retry_by(run_id) {
            let spent = self.runs.get(run_id).map_or(0, |run| run.network_retries);
            if spent >= limits::NETWORK_RETRIES_PER_RUN_MAX {
                return Err(Refusal::NetworkRetriesSpent { run_id: run_id.clone(), spent });
            }
        }
        if intent.capability.dedup_by_key && !intent.within_key_window(now) {
            events.push(Event::IntentEscalated {
                key: key.clone(),
                reason: "the provider's idempotency-key window has passed: a resend would not be deduplicated"
                    .to_owned(),
                absence_proven: intent.absence_proven,
            });
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }
        let left_ms = ms_between(now, deadline_at);
        if left_ms < limits::RECONCILIATION_RESERVE_MS {
            return Err(Refusal::NotAllowed(format!(
                "deadline: {left_ms} ms left, fewer than the {} ms an effect needs to be reconciled",
                limits::RECONCILIATION_RESERVE_MS
            )));
        }
        events.push(Event::AttemptStarted { key: key.clone(), attempt: intent.attempts + 1, run_id: run_id.clone() });
        Ok(ReplyTarget::Intent(key.clone(), false))
    }

    fn decide_outcome(
        &self,
        key: &IntentKey,
        attempt: u32,
        outcome: &CallOutcome,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if attempt == 0 || attempt > intent.attempts {
            return Err(Refusal::NotAllowed(format!(
                "outcome for attempt {attempt} of {key}, but the latest attempt is {}",
                intent.attempts
            )));
        }
        if intent.status != IntentStatus::Attempting || attempt != intent.attempts {
            // The attempt stopped being awaited (recovery declared it crashed, its lease was
            // taken, a later attempt went out): a definitive answer is still evidence.
            self.decide_late_answer(intent, attempt, outcome, events);
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }
        match outcome {
            CallOutcome::Succeeded(evidence) => match evidence_mismatch(intent, evidence) {
                None => events.push(Event::IntentValidated {
                    key: key.clone(),
                    attempt,
                    source: Source::Provider,
                    evidence: evidence.clone(),
                }),
                Some(why) => self.unknown(intent, attempt, UnknownReason::Protocol, why, now, events),
            },
            CallOutcome::Declined { code } => {
                events.push(Event::IntentDeclined { key: key.clone(), attempt, code: code.clone() })
            }
            CallOutcome::NotSent { detail } => {
                events.push(Event::AttemptNotSent { key: key.clone(), attempt, detail: detail.clone() })
            }
            CallOutcome::Unknown { reason, detail } => {
                self.unknown(intent, attempt, *reason, detail.clone(), now, events)
            }
        }
        Ok(ReplyTarget::Intent(key.clone(), false))
    }

    /// A definitive answer for an attempt no longer awaited: recorded, then it settles an
    /// intent that is still open, agrees with one that is settled the same way, or
    /// contradicts it (the intent escalates: a human must look). An answer that is not
    /// definitive (unknown, not sent) adds nothing.
    fn decide_late_answer(&self, intent: &Intent, attempt: u32, outcome: &CallOutcome, events: &mut Vec<Event>) {
        use IntentStatus as S;
        let key = intent.key().clone();
        let latest = attempt == intent.attempts;
        let (answer, verdict, follow) = match outcome {
            CallOutcome::Unknown { .. } | CallOutcome::NotSent { .. } => return,
            CallOutcome::Succeeded(evidence) => {
                let answer = LateAnswer::Succeeded { evidence: evidence.clone() };
                let contradicted = |detail: String| {
                    let escalate = Event::IntentEscalated {
                        key: key.clone(),
                        reason: format!("a late provider answer contradicts the intent: {detail}"),
                        absence_proven: false,
                    };
                    (LateVerdict::Contradicted { detail }, Some(escalate))
                };
                let (verdict, follow) = if let Some(why) = evidence_mismatch(intent, evidence) {
                    contradicted(why)
                } else {
                    match intent.status {
                        S::Validated => match &intent.evidence {
                            Some(known) if known.provider_ref == evidence.provider_ref => {
                                (LateVerdict::Consistent, None)
                            }
                            known => contradicted(format!(
                                "the provider reports {} for attempt {attempt}, the intent was validated by {}",
                                evidence.provider_ref,
                                known.as_ref().map_or("nothing", |e| e.provider_ref.as_str())
                            )),
                        },
                        S::Escalated if intent.absence_proven => contradicted(format!(
                            "the provider reports {} for attempt {attempt}, the effect was proven absent",
                            evidence.provider_ref
                        )),
                        S::Declined | S::Cancelled | S::Rejected => contradicted(format!(
                            "the provider reports {} for attempt {attempt}, the intent was {}",
                            evidence.provider_ref,
                            intent.status.as_str()
                        )),
                        S::Attempting
                        | S::OutcomeUnknown
                        | S::Reconciling
                        | S::Reserved
                        | S::AwaitingApproval
                        | S::Escalated => (
                            LateVerdict::Settled,
                            Some(Event::IntentValidated {
                                key: key.clone(),
                                attempt,
                                source: Source::Reconciled,
                                evidence: evidence.clone(),
                            }),
                        ),
                    }
                };
                (answer, verdict, follow)
            }
            CallOutcome::Declined { code } => {
                let answer = LateAnswer::Declined { code: code.clone() };
                match intent.status {
                    // A decline of the latest attempt is the definitive "no effect" the intent
                    // was waiting for; of an earlier one, it says nothing about the later one.
                    S::OutcomeUnknown | S::Reconciling | S::Reserved if latest => (
                        answer,
                        LateVerdict::Settled,
                        Some(Event::IntentDeclined { key: key.clone(), attempt, code: code.clone() }),
                    ),
                    S::Escalated if latest && !intent.absence_proven => (
                        answer,
                        LateVerdict::Settled,
                        Some(Event::IntentDeclined { key: key.clone(), attempt, code: code.clone() }),
                    ),
                    S::Validated if latest => {
                        let detail =
                            format!("the provider declined attempt {attempt} ({code}), the intent was validated");
                        let escalate = Event::IntentEscalated {
                            key: key.clone(),
                            reason: format!("a late provider answer contradicts the intent: {detail}"),
                            absence_proven: false,
                        };
                        (answer, LateVerdict::Contradicted { detail }, Some(escalate))
                    }
                    _ => (answer, LateVerdict::Consistent, None),
                }
            }
        };
        events.push(Event::LateAnswerRecorded { key, attempt, answer, verdict });
        events.extend(follow);
    }

    /// Records an unknown outcome, and escalates at once when the tier allows no
    /// reconciliation at all.
    fn unknown(
        &self,
        intent: &Intent,
        attempt: u32,
        reason: UnknownReason,
        detail: String,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) {
        let key = intent.key().clone();
        let can_reconcile = intent.capability.lookup || intent.capability.dedup_by_key;
        events.push(Event::OutcomeUnknown {
            key: key.clone(),
            attempt,
            reason,
            detail,
            reconcile_after: can_reconcile.then(|| after_backoff(now, intent.reconciliations + 1)),
        });
        if !can_reconcile {
            events.push(Event::IntentEscalated {
                key,
                reason: "the provider has neither idempotency keys nor a lookup: Keel never resends after an unknown \
                         outcome"
                    .to_owned(),
                absence_proven: false,
            });
        }
    }

    fn decide_start_reconciliation(
        &self,
        key: &IntentKey,
        force: bool,
        run_id: &RunId,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        let escalated_unproven = intent.status == IntentStatus::Escalated && !intent.absence_proven;
        if intent.status != IntentStatus::OutcomeUnknown && !(force && escalated_unproven) {
            return Err(Refusal::NotAllowed(format!(
                "intent {key} is {}: nothing to reconcile",
                intent.status.as_str()
            )));
        }
        if !intent.capability.lookup {
            return Err(Refusal::NotAllowed(format!(
                "intent {key}: the provider (tier {}) offers no lookup",
                intent.capability.tier()
            )));
        }
        if !force && !intent.reconcile_due(now) {
            return Err(Refusal::NotAllowed(format!(
                "intent {key}: reconciliation not due before {}",
                intent.reconcile_after.map_or_else(|| "never".to_owned(), |at| at.to_rfc3339())
            )));
        }
        if intent.status == IntentStatus::OutcomeUnknown && intent.reconciliations >= intent.reconciliations_max {
            events.push(Event::IntentEscalated {
                key: key.clone(),
                reason: format!("all {} reconciliations spent", intent.reconciliations_max),
                absence_proven: false,
            });
            return Ok(ReplyTarget::Intent(key.clone(), false));
        }
        events.push(Event::ReconciliationStarted {
            key: key.clone(),
            reconciliation: intent.reconciliations + 1,
            run_id: Some(run_id.clone()),
        });
        Ok(ReplyTarget::Intent(key.clone(), false))
    }

    fn decide_lookup(
        &self,
        key: &IntentKey,
        reconciliation: u32,
        outcome: &LookupOutcome,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) -> Result<ReplyTarget, Refusal> {
        let intent = self.existing(key)?;
        if intent.status != IntentStatus::Reconciling || reconciliation != intent.reconciliations {
            return Err(Refusal::NotAllowed(format!(
                "intent {key} is {} (reconciliation {}): no lookup {reconciliation} awaits an answer",
                intent.status.as_str(),
                intent.reconciliations
            )));
        }
        let (status, evidence, detail) = match outcome {
            LookupOutcome::Found(evidence) => match evidence_mismatch(intent, evidence) {
                None => (LookupStatus::Found, Some(evidence.clone()), String::new()),
                Some(why) => (LookupStatus::Inconsistent, Some(evidence.clone()), why),
            },
            LookupOutcome::Absent => (LookupStatus::Absent, None, String::new()),
            LookupOutcome::Unavailable { detail } => (LookupStatus::Unavailable, None, detail.clone()),
        };
        self.resolve_lookup(intent, reconciliation, status, evidence, detail, now, events);
        Ok(ReplyTarget::Intent(key.clone(), false))
    }

    #[allow(clippy::too_many_arguments)] // One call site per lookup source; a struct would only rename them.
    fn resolve_lookup(
        &self,
        intent: &Intent,
        reconciliation: u32,
        status: LookupStatus,
        evidence: Option<Evidence>,
        detail: String,
        now: DateTime<Utc>,
        events: &mut Vec<Event>,
    ) {
        let key = intent.key().clone();
        let spent = reconciliation >= intent.reconciliations_max;
        let retry_or_escalate = |reason: String| {
            if spent {
                (AfterLookup::Escalated, Some((reason, false)))
            } else {
                (AfterLookup::RetryAt { reconcile_after: after_backoff(now, reconciliation + 1) }, None)
            }
        };
        let (after, escalation) = match status {
            LookupStatus::Found => (AfterLookup::Validated, None),
            LookupStatus::Absent => {
                let window_end = intent.resend_window_end().unwrap_or(now);
                if now < window_end {
                    if spent {
                        (
                            AfterLookup::Escalated,
                            Some(("absent, but only before the request was certainly over".to_owned(), false)),
                        )
                    } else {
                        // Too early to believe: look again the moment the absence can be proof.
                        (AfterLookup::RetryAt { reconcile_after: window_end }, None)
                    }
                } else if intent.attempts_spent() >= intent.attempts_max {
                    (
                        AfterLookup::Escalated,
                        Some((format!("proven absent, all {} attempts spent", intent.attempts_max), true)),
                    )
                } else if intent.capability.dedup_by_key && !intent.within_key_window(now) {
                    (
                        AfterLookup::Escalated,
                        Some(("proven absent, but the idempotency-key window has passed".to_owned(), true)),
                    )
                } else {
                    (AfterLookup::ResendAllowed, None)
                }
            }
            LookupStatus::Unavailable => {
                retry_or_escalate(format!("lookup unavailable after {reconciliation} reconciliations"))
            }
            LookupStatus::Inconsistent => {
                retry_or_escalate(format!("lookup inconsistent after {reconciliation} reconciliations: {detail}"))
            }
            LookupStatus::Interrupted => {
                retry_or_escalate(format!("lookup interrupted after {reconciliation} reconciliations"))
            }
        };
        events.push(Event::ReconciliationResolved {
            key: key.clone(),
            reconciliation,
            status,
            evidence: evidence.clone(),
            detail,
            after: after.clone(),
        });
        let run_ended = self.runs.get(&intent.run_id).is_some_and(|run| run.is_agent() && run.status.is_some());
        if after == AfterLookup::ResendAllowed && run_ended {
            // Its agent run is over: nobody will send it again, so its money is freed now.
            events.push(Event::IntentReleased { key: key.clone(), reason: ReleaseReason::AbsentAfterRunEnded });
        }
        if after == AfterLookup::Validated
            && let Some(evidence) = evidence
        {
            events.push(Event::IntentValidated {
                key: key.clone(),
                attempt: intent.attempts,
                source: Source::Reconciled,
                evidence,
            });
        }
        if let Some((reason, absence_proven)) = escalation {
            events.push(Event::IntentEscalated { key, reason, absence_proven });
        }
    }

    /// Recovery for `owner`: claims the run of every attempt or lookup in flight that no
    /// process holds live, and records those as interrupted; leaves the others alone.
    fn decide_recover(
        &self,
        owner: &LeaseOwner,
        only: Option<&RunId>,
        now: DateTime<Utc>,
        leases: &dyn LeaseView,
        events: &mut Vec<Event>,
        effects: &mut Vec<LeaseEffect>,
    ) -> ReplyTarget {
        let driving_run = |intent: &Intent| intent.in_flight_run.clone().unwrap_or_else(|| intent.run_id.clone());
        let mut touched: Vec<&Intent> = self
            .intents
            .values()
            .filter(|i| matches!(i.status, IntentStatus::Attempting | IntentStatus::Reconciling))
            .filter(|i| only.is_none_or(|run| &driving_run(i) == run))
            .collect();
        touched.sort_by(|a, b| a.key().cmp(b.key()));
        // One claim per run, decided before any intent of it is touched.
        let mut verdicts: BTreeMap<RunId, Result<Option<LeaseGrant>, LeaseOwner>> = BTreeMap::new();
        for intent in &touched {
            let run_id = driving_run(intent);
            if verdicts.contains_key(&run_id) {
                continue;
            }
            let verdict = match self.runs.get(&run_id) {
                Some(run) => self.claim(run, owner, now, leases, effects).map(Some).map_err(|(holder, _)| holder),
                None => Ok(None),
            };
            verdicts.insert(run_id, verdict);
        }
        let mut recovery = Recovery::default();
        for intent in touched {
            match &verdicts[&driving_run(intent)] {
                Err(holder) => recovery.held_elsewhere.push((intent.key().clone(), holder.clone())),
                Ok(_) => {
                    self.recover_intent(intent, now, events);
                    recovery.recovered.push(intent.key().clone());
                }
            }
        }
        recovery.claimed = verdicts.into_values().filter_map(|verdict| verdict.ok().flatten()).collect();
        ReplyTarget::Recovered(recovery)
    }

    /// The interrupted attempt or lookup of one intent, as recovery records it.
    fn recover_intent(&self, intent: &Intent, now: DateTime<Utc>, events: &mut Vec<Event>) {
        match intent.status {
            IntentStatus::Attempting => {
                let can_reconcile = intent.capability.lookup || intent.capability.dedup_by_key;
                events.push(Event::OutcomeUnknown {
                    key: intent.key().clone(),
                    attempt: intent.attempts,
                    reason: UnknownReason::Crash,
                    detail: "the process died with this attempt in flight".to_owned(),
                    reconcile_after: can_reconcile.then_some(now),
                });
                if !can_reconcile {
                    events.push(Event::IntentEscalated {
                        key: intent.key().clone(),
                        reason: "crashed mid-attempt on a provider with neither idempotency keys nor a lookup"
                            .to_owned(),
                        absence_proven: false,
                    });
                }
            }
            _ => self.resolve_lookup(
                intent,
                intent.reconciliations,
                LookupStatus::Interrupted,
                None,
                "the process died during the lookup".to_owned(),
                now,
                events,
            ),
        }
    }
}

/// Refuses a write for `run_id` that does not present the run's current fencing token. A
/// run never leased (one started by this very command, or before leases existed) is not
/// fenced.
fn check_fence(run_id: &RunId, lease: &LeaseUse, leases: &dyn LeaseView) -> Result<(), Refusal> {
    let Some(current) = leases.holder(run_id) else {
        return Ok(());
    };
    match lease.grant() {
        Some(grant) if &grant.run_id == run_id && grant.token == current.token => Ok(()),
        presented => Err(Refusal::Fenced {
            run_id: run_id.clone(),
            presented: presented.filter(|g| &g.run_id == run_id).map(|g| g.token),
            current: current.token,
            holder: current.owner,
        }),
    }
}

/// When reconciliation number `n` is due after `now`.
fn after_backoff(now: DateTime<Utc>, n: u32) -> DateTime<Utc> {
    bounded_later(now, limits::reconcile_backoff_ms(n))
}

/// `now` plus a delay that a bound in [`limits`] keeps short (a backoff, a lease TTL: at most
/// an hour). A clock tells real times, millennia away from chrono's limits, so this is an
/// instant; a clock that does not is a bug worth stopping for.
fn bounded_later(now: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    checked_plus_ms(now, ms).expect("a clock's now plus a delay bounded by limits.rs is a representable instant")
}

/// What an operator's resolution is, checked against what the provider's lookup said. A
/// contradiction, or a lookup that could not answer, is refused unless overridden with a
/// reason.
fn decide_resolution(
    intent: &Intent,
    landed: Option<&str>,
    lookup: Option<&LookupOutcome>,
    override_reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<ResolutionCheck, Refusal> {
    let key = intent.key();
    if !matches!(intent.status, IntentStatus::OutcomeUnknown | IntentStatus::Escalated) {
        return Err(Refusal::NotAllowed(format!(
            "intent {key} is {}: only an outcome_unknown or escalated intent can be resolved by hand",
            intent.status.as_str()
        )));
    }
    if landed.is_some_and(|r| !is_provider_ref(r)) {
        return Err(Refusal::NotAllowed("--landed needs the provider's reference as evidence".to_owned()));
    }
    if let Some(reason) = override_reason
        && reason.trim().is_empty()
    {
        return Err(Refusal::NotAllowed("--override needs the reason the provider's answer is wrong".to_owned()));
    }
    let says = match (lookup, landed) {
        (None, _) if intent.capability.lookup => {
            return Err(Refusal::NotAllowed(format!(
                "intent {key}: its provider can look it up, so a resolution must be checked with it first"
            )));
        }
        (None, _) => {
            let detail = format!("the provider (tier {}) offers no lookup", intent.capability.tier());
            return Ok(ResolutionCheck::Unverified { detail });
        }
        // A provider that can look up but did not answer is not a provider that agrees: an
        // unreachable --provider must not be a way around the check.
        (Some(LookupOutcome::Unavailable { detail }), _) => format!("nothing: its lookup is unavailable ({detail})"),
        (Some(LookupOutcome::Found(evidence)), Some(landed))
            if evidence.provider_ref == landed && evidence_mismatch(intent, evidence).is_none() =>
        {
            return Ok(ResolutionCheck::Confirmed);
        }
        (Some(LookupOutcome::Found(evidence)), _) => format!(
            "it holds {} for {} {} under this key",
            evidence.provider_ref, evidence.amount_minor, evidence.currency
        ),
        (Some(LookupOutcome::Absent), None) if intent.resend_window_end().is_none_or(|end| now >= end) => {
            return Ok(ResolutionCheck::Confirmed);
        }
        (Some(LookupOutcome::Absent), None) => {
            let detail = "absent, but the request may not be over yet: a lookup may still miss it".to_owned();
            return Ok(ResolutionCheck::Unverified { detail });
        }
        (Some(LookupOutcome::Absent), Some(_)) => "it has no effect under this key".to_owned(),
    };
    match override_reason {
        Some(reason) => Ok(ResolutionCheck::Overridden { provider_says: says, reason: reason.to_owned() }),
        None => Err(Refusal::NotAllowed(format!(
            "intent {key}: the provider contradicts this resolution: {says}; nothing was recorded \
             (pass --override REASON to record it anyway)"
        ))),
    }
}

/// A provider reference an operator or a provider may give as evidence: not blank, no
/// control or invisible characters, visible ASCII (what providers' ids are made of).
fn is_provider_ref(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic())
}

fn evidence_mismatch(intent: &Intent, evidence: &Evidence) -> Option<String> {
    if !is_provider_ref(&evidence.provider_ref) {
        return Some(format!("the provider's answer names no effect (id {:?})", evidence.provider_ref));
    }
    let definition = &intent.definition;
    (evidence.amount_minor != definition.amount_minor || evidence.currency != definition.currency).then(|| {
        format!(
            "provider reports {} {} for {}, the intent is {} {}",
            evidence.amount_minor,
            evidence.currency,
            evidence.provider_ref,
            definition.amount_minor,
            definition.currency
        )
    })
}

/// Folds one intent event. `Err` names the impossible transition.
fn apply_to_intent(intent: &mut Intent, event: &Event, at: DateTime<Utc>) -> Result<(), &'static str> {
    use IntentStatus as S;
    match event {
        Event::IntentDeduplicated { .. } => {
            intent.duplicates_suppressed += 1;
        }
        Event::ApprovalGranted { fingerprint, by, expires_at, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("approval of an intent not awaiting one");
            }
            intent.approval =
                Some(Approval { fingerprint: fingerprint.clone(), by: by.clone(), expires_at: *expires_at });
            intent.status = S::Reserved;
        }
        Event::ApprovalExpired { .. } => {
            intent.approval = None;
            intent.status = S::AwaitingApproval;
        }
        Event::ApprovalDenied { by, reason, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("denial of an intent not awaiting approval");
            }
            intent.status = S::Rejected;
            intent.note = Some(format!("denied by {by}: {reason}"));
        }
        Event::AttemptStarted { attempt, run_id, .. } => {
            if *attempt != intent.attempts + 1 {
                return Err("attempt numbers must follow each other");
            }
            if !matches!(intent.status, S::Reserved | S::OutcomeUnknown) {
                return Err("attempt started while not ready");
            }
            intent.attempts = *attempt;
            intent.status = S::Attempting;
            intent.latest_not_sent = false;
            intent.latest_attempt_run = Some(run_id.clone());
            intent.first_sent_at.get_or_insert(at);
            intent.last_sent_at = Some(at);
            intent.absence_proven = false;
            intent.reconcile_after = None;
            intent.in_flight_run = Some(run_id.clone());
        }
        Event::AttemptNotSent { .. } => {
            if intent.status != S::Attempting {
                return Err("not-sent outcome without an attempt in flight");
            }
            intent.status = S::Reserved;
            intent.absence_proven = true;
            intent.not_sent += 1;
            intent.latest_not_sent = true;
            intent.in_flight_run = None;
        }
        Event::IntentValidated { source, evidence, .. } => {
            intent.in_flight_run = None;
            intent.status = S::Validated;
            intent.source = Some(*source);
            intent.evidence = Some(evidence.clone());
            intent.reconcile_after = None;
            intent.unknown_reason = None;
        }
        Event::IntentDeclined { code, .. } => {
            // In flight, or a late answer settling an intent that was still open.
            if !matches!(intent.status, S::Attempting | S::OutcomeUnknown | S::Reconciling | S::Reserved | S::Escalated)
            {
                return Err("decline of an intent that is neither in flight nor open");
            }
            intent.in_flight_run = None;
            intent.status = S::Declined;
            intent.decline_code = Some(code.clone());
        }
        Event::OutcomeUnknown { reason, reconcile_after, .. } => {
            if intent.status != S::Attempting {
                return Err("unknown outcome without an attempt in flight");
            }
            intent.status = S::OutcomeUnknown;
            intent.unknown_reason = Some(*reason);
            intent.reconcile_after = *reconcile_after;
            intent.in_flight_run = None;
        }
        Event::ReconciliationStarted { reconciliation, run_id, .. } => {
            if !matches!(intent.status, S::OutcomeUnknown | S::Escalated) {
                return Err("reconciliation of an intent that is not unknown");
            }
            if *reconciliation != intent.reconciliations + 1 {
                return Err("reconciliation numbers must follow each other");
            }
            intent.reconciliations = *reconciliation;
            intent.status = S::Reconciling;
            intent.in_flight_run = Some(run_id.clone().unwrap_or_else(|| intent.run_id.clone()));
        }
        Event::ReconciliationResolved { after, .. } => {
            if intent.status != S::Reconciling {
                return Err("lookup answer without a reconciliation in flight");
            }
            intent.in_flight_run = None;
            match after {
                AfterLookup::Validated | AfterLookup::Escalated => intent.status = S::OutcomeUnknown,
                AfterLookup::ResendAllowed => {
                    intent.status = S::Reserved;
                    intent.absence_proven = true;
                    intent.reconcile_after = None;
                }
                AfterLookup::RetryAt { reconcile_after } => {
                    intent.status = S::OutcomeUnknown;
                    intent.reconcile_after = Some(*reconcile_after);
                }
            }
        }
        Event::IntentEscalated { reason, absence_proven, .. } => {
            intent.in_flight_run = None;
            intent.status = S::Escalated;
            intent.absence_proven = *absence_proven;
            intent.reconcile_after = None;
            intent.note = Some(reason.clone());
        }
        Event::IntentCancelled { by, reason, .. } => {
            if !matches!(intent.status, S::Reserved | S::AwaitingApproval) {
                return Err("cancel with an attempt in flight or unknown");
            }
            intent.status = S::Cancelled;
            intent.note = Some(format!("cancelled by {by}: {reason}"));
        }
        Event::IntentResolved { by, reason, landed, check, .. } => {
            if !matches!(intent.status, S::OutcomeUnknown | S::Escalated) {
                return Err("manual resolution of an intent that is not unknown or escalated");
            }
            match landed {
                Some(provider_ref) => {
                    intent.status = S::Validated;
                    intent.source = Some(Source::Reconciled);
                    intent.evidence = Some(Evidence {
                        provider_ref: provider_ref.clone(),
                        amount_minor: intent.definition.amount_minor,
                        currency: intent.definition.currency.clone(),
                    });
                    intent.note = Some(format!("resolved landed by {by}{}: {reason}", check.annotation()));
                }
                None => {
                    intent.status = S::Cancelled;
                    intent.absence_proven = true;
                    intent.note = Some(format!("resolved absent by {by}{}: {reason}", check.annotation()));
                }
            }
            intent.reconcile_after = None;
        }
        Event::ApprovalRequested { closes_at, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("an approval window for an intent not awaiting approval");
            }
            intent.approval_closes_at = Some(*closes_at);
        }
        Event::IntentReleased { reason, .. } => {
            if !matches!(intent.status, S::Reserved | S::AwaitingApproval) {
                return Err("release of an intent that may have an effect in flight or unknown");
            }
            intent.status = S::Rejected;
            intent.note = Some(format!("released: {reason}"));
        }
        Event::LateAnswerRecorded { verdict, .. } => {
            intent.late_answers += 1;
            if let LateVerdict::Contradicted { detail } = verdict {
                intent.note = Some(format!("a late provider answer contradicts the intent: {detail}"));
            }
        }
        Event::IntentReserved { .. }
        | Event::RunStarted { .. }
        | Event::RunDeadlineExtended { .. }
        | Event::StepRecorded { .. }
        | Event::TimerStarted { .. }
        | Event::SignalDelivered { .. }
        | Event::AgentRecorded { .. }
        | Event::RunFinished { .. } => return Err("not an intent event"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
