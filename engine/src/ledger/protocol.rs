//! The ledger's protocol: what a caller asks ([`Command`], [`Action`]), why it may be
//! refused ([`Refusal`], typed: a caller matches a variant, never a message), and what it is
//! answered ([`Reply`]) — plus the [`Decision`] the store turns into a commit.
//!
//! Every refusal writes nothing. Typed helpers that send one request and read its one reply
//! live with the log ([`crate::log`]).

use super::next::{Launched, Next};
use super::state::{Intent, IntentStatus, Recovery, Run, RunHistory};
use crate::event::{Cause, Event, IntentDefinition, IntentKey, RunId, RunLimits, RunStatus, RunVersions, SignalName};
use crate::facts::{Candidate, Conversation, ConversationId, FactsRefusal, Ticket};
use crate::lease::{LeaseEffect, LeaseGrant, LeaseOwner, LeaseUse};
use crate::provider::{CallOutcome, Capability, LookupOutcome, Secret};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::fmt;

/// What the spine records in `RunStarted` when an agent run's first entries are appended.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRunStart {
    /// The agent workflow (`ticket-review`; stored as `agent:ticket-review`).
    pub workflow: String,
    /// The run's absolute deadline, as the harness fixed it.
    pub deadline_at: DateTime<Utc>,
    /// The run's input as stored (how to resume it: transport, transcript, never a secret).
    pub input: Value,
    /// The spine's limits for the intents the agent's effect tools reserve.
    pub limits: RunLimits,
    /// The versions the run runs under (release, prompt, policy, model).
    pub versions: RunVersions,
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
    /// The payment method of a reservation, for the log's vault (see
    /// [`crate::log::EventLog::unseal`]): a log that keeps payment methods seals it beside
    /// the intent in the reservation's own commit, if the reservation is accepted and the
    /// intent is not final. It is never part of an event; a log without a vault ignores it.
    pub keep: Option<Secret>,
    /// The operator's policy in force where the command was sent, for the intent a
    /// reservation is about (see [`crate::policy::Governing`]): a run started under another
    /// policy is held to its rules as well as to its own, and the reservation records its
    /// stamp. `None`: the run's own limits only (a library caller with no policy).
    pub policy: Option<crate::policy::Governing>,
}

impl Command {
    /// `action` on behalf of `cause`, starting nothing, under no lease.
    pub fn new(cause: Cause, action: Action) -> Self {
        Self { cause, start_run: None, action, lease: LeaseUse::None, keep: None, policy: None }
    }

    /// The same command, decided under the policy in force `policy` too.
    pub fn governed_by(mut self, policy: Option<crate::policy::Governing>) -> Self {
        self.policy = policy;
        self
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
    /// The versions it runs under (release, prompt, policy, model).
    pub versions: RunVersions,
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
    /// Read one run's state.
    ObserveRun {
        /// The run.
        run_id: RunId,
    },
    /// Read what replaying a run needs: its input, journal, signals and agent entries, from
    /// its own stream.
    LoadRun {
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
    /// An operator asks a run to stop: recorded (`RunCancelRequested`), the run stops
    /// `cancelled` at its next guard. A finished run refuses; a second request changes nothing.
    CancelRun {
        /// The run.
        run_id: RunId,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
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
    /// Deliver a signal to a run (refused for a finished run, and for a payload larger than
    /// [`crate::limits::SIGNAL_PAYLOAD_MAX_BYTES`]).
    DeliverSignal {
        /// The run.
        run_id: RunId,
        /// The signal's name.
        name: SignalName,
        /// Its payload.
        payload: Value,
    },
    /// Append a batch of an agent run's entries atomically, at the run's next agent
    /// position (the spine checks the position, not the entries: they are the harness's own
    /// facts, opaque here). A new run starts with its first batch and needs `start`. The
    /// `spine` requests say what the batch means for the run and its intents, applied in the
    /// same commit.
    RecordAgentEntries {
        /// The run.
        run_id: RunId,
        /// Where the batch goes: the number of agent entries recorded so far.
        position: u32,
        /// The entries, in order, as the harness serialises them.
        entries: Vec<Value>,
        /// Used when the run does not exist yet.
        start: Option<AgentRunStart>,
        /// What the batch means for the spine.
        spine: Vec<SpineRequest>,
    },
    /// Ends a charge that waited for its caller (ready for its next attempt, no payment
    /// method at hand) for at least `window_ms`: rejected `abandoned` when it has no effect
    /// (never sent, or proven absent), escalated to a human otherwise. The executor asks it
    /// under the run's lease, once it found neither the caller nor the vault could send it.
    Abandon {
        /// The intent.
        key: IntentKey,
        /// Its run (whose lease the command holds).
        run_id: RunId,
        /// How long it must have waited.
        window_ms: u64,
    },
    /// Admit a batch of controlled facts for a conversation, whole or not at all.
    ApplyFacts {
        /// The conversation.
        conversation: ConversationId,
        /// The ticket the update was taken under (`None`: the conversation's current one).
        ticket: Option<Ticket>,
        /// The current user message.
        message: String,
        /// The facts proposed for it.
        candidates: Vec<Candidate>,
    },
    /// Forget one fact of a conversation, or all of them.
    ForgetFacts {
        /// The conversation.
        conversation: ConversationId,
        /// The ticket the update was taken under (`None`: the conversation's current one).
        ticket: Option<Ticket>,
        /// The key; `None`: every fact.
        key: Option<String>,
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
            | Self::RecordAgentEntries { run_id, .. }
            | Self::Abandon { run_id, .. }
            | Self::FinishRun { run_id, .. } => Some(run_id),
            Self::StartRun
            | Self::Observe { .. }
            | Self::ObserveRun { .. }
            | Self::LoadRun { .. }
            | Self::Snapshot
            | Self::RecordOutcome { .. }
            | Self::RecordLookup { .. }
            | Self::Recover { .. }
            | Self::ClaimRun { .. }
            | Self::RenewLeases { .. }
            | Self::ReleaseLeases { .. }
            | Self::ApplyFacts { .. }
            | Self::ForgetFacts { .. }
            | Self::Approve { .. }
            | Self::CheckApproval { .. }
            | Self::Deny { .. }
            | Self::Cancel { .. }
            | Self::CancelRun { .. }
            | Self::Resolve { .. }
            | Self::DeliverSignal { .. } => None,
        }
    }
}

/// What an agent batch means for the spine: requests the harness makes in the same commit as
/// its entries, because the spine cannot read those entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpineRequest {
    /// The run stopped: record its `RunFinished`, and release what it reserved and never
    /// sent (nothing else will send it).
    Finish {
        /// How it ended.
        status: RunStatus,
        /// Why, for humans.
        detail: Option<String>,
        /// What the run spent on models, in minor units.
        cost_minor: Option<i64>,
    },
    /// An effect call waits for a human: the intent's approval window closes at `closes_at`.
    OpenApprovalWindow {
        /// The intent awaiting approval.
        key: IntentKey,
        /// When the window closes.
        closes_at: DateTime<Utc>,
    },
    /// The run waited for a human, outside its working time: its deadline moves.
    ExtendDeadline {
        /// The new absolute deadline.
        deadline_at: DateTime<Utc>,
    },
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
    /// Reserved, then nobody re-submitted it within the abandonment window while it waited
    /// for its caller; it had no effect (never sent, or proven absent).
    Abandoned,
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
            Self::Abandoned => "abandoned",
        }
    }
}

/// The lifecycle step a refused command asked for, to say what was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Approving.
    Approve,
    /// Denying.
    Deny,
    /// Cancelling.
    Cancel,
    /// Resolving by hand.
    Resolve,
    /// Starting an attempt.
    Attempt,
    /// Starting a reconciliation.
    Reconcile,
    /// Recording a lookup's answer.
    Lookup,
    /// Ending an intent nobody re-submitted.
    Abandon,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Approve => "no approval: it does not await one",
            Self::Deny => "no denial: it does not await an approval",
            Self::Cancel => {
                "only a reserved or awaiting-approval intent can be cancelled (an attempt in flight or unknown \
                 must be reconciled or resolved first)"
            }
            Self::Resolve => "only an outcome_unknown or escalated intent can be resolved by hand",
            Self::Attempt => "no new attempt now",
            Self::Reconcile => "nothing to reconcile",
            Self::Lookup => "no lookup awaits an answer",
            Self::Abandon => "only a charge that waits for its caller (ready for its next attempt) can be abandoned",
        })
    }
}

/// A command the ledger refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// A proposal rejected before reservation.
    #[error("rejected ({}): {detail}", code.as_str())]
    Rejected {
        /// Why.
        code: RejectCode,
        /// Details for the caller.
        detail: String,
    },
    /// No such intent.
    #[error("no intent with key {0}")]
    UnknownIntent(IntentKey),
    /// No such run.
    #[error("no run with id {0}")]
    UnknownRun(RunId),
    /// A run with this id exists already.
    #[error("run {0} already exists")]
    RunExists(RunId),
    /// `StartRun` without a run to start.
    #[error("StartRun without a run to start")]
    NoRunToStart,
    /// The run has finished: nothing more is written for it.
    #[error("run {0} has finished")]
    RunFinished(RunId),
    /// An operator asked the run to stop: it writes nothing more but its end.
    #[error("run {run_id} was cancelled by operator {by} ({reason}): it stops cancelled")]
    RunCancelled {
        /// The run.
        run_id: RunId,
        /// The operator.
        by: String,
        /// Why.
        reason: String,
    },
    /// A cancellation of a run that has already ended.
    #[error("run {run_id} already finished ({}): there is nothing to cancel", status.as_str())]
    RunAlreadyFinished {
        /// The run.
        run_id: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// The intent's status does not allow the step.
    #[error("intent {key} is {}: {step}", status.as_str())]
    WrongStatus {
        /// The intent.
        key: IntentKey,
        /// Where it is.
        status: IntentStatus,
        /// What was asked.
        step: Step,
    },
    /// An approval after the intent's approval window closed.
    #[error(
        "approval refused: the approval window of intent {key} closed at {closes_at}; its run stops \
         deadline_exceeded and the intent is released when it resumes"
    )]
    ApprovalWindowClosed {
        /// The intent.
        key: IntentKey,
        /// When the window closed.
        closes_at: DateTime<Utc>,
    },
    /// The approver saw another payload than the intent's.
    #[error("approval refused: fingerprint {seen} is not the intent's ({expected})")]
    FingerprintMismatch {
        /// What the approver reviewed.
        seen: String,
        /// The intent's.
        expected: String,
    },
    /// An attempt of an intent that needs an approval it lacks.
    #[error("intent {0} has no valid approval for its fingerprint")]
    NoValidApproval(IntentKey),
    /// A duration that would put an instant past any date.
    #[error("{what} of {ms} ms would end past any date")]
    DurationOutOfRange {
        /// What the duration is.
        what: &'static str,
        /// The duration.
        ms: u64,
    },
    /// A facts update refused whole (seed 001): the previous facts are kept.
    #[error(transparent)]
    Facts(#[from] FactsRefusal),
    /// Too little time is left before the run's deadline to reconcile a resend of an intent
    /// whose outcome is unknown (a reserved intent is released instead).
    #[error("deadline: {left_ms} ms left, fewer than the {needed_ms} ms an effect needs to be reconciled")]
    DeadlineReserve {
        /// The run.
        run_id: RunId,
        /// Time left.
        left_ms: u64,
        /// Time a new attempt needs.
        needed_ms: u64,
    },
    /// An outcome for an attempt that was never started.
    #[error("outcome for attempt {attempt} of {key}, but the latest attempt is {latest}")]
    NoSuchAttempt {
        /// The intent.
        key: IntentKey,
        /// The attempt named.
        attempt: u32,
        /// The latest one started.
        latest: u32,
    },
    /// A lookup answer for a reconciliation that is not the one in flight.
    #[error("intent {key} is {} (reconciliation {current}): no lookup {reconciliation} awaits an answer", status.as_str())]
    NoSuchLookup {
        /// The intent.
        key: IntentKey,
        /// Where it is.
        status: IntentStatus,
        /// The reconciliation named.
        reconciliation: u32,
        /// The latest one started.
        current: u32,
    },
    /// A reconciliation of an intent whose provider offers no lookup.
    #[error("intent {key}: the provider (tier {tier}) offers no lookup")]
    NoLookup {
        /// The intent.
        key: IntentKey,
        /// The provider's tier.
        tier: &'static str,
    },
    /// An abandonment asked before the intent waited its window.
    #[error("intent {key} waits for its caller since {}: not abandoned before {}", since.to_rfc3339(), until.to_rfc3339())]
    WaitingWindowOpen {
        /// The intent.
        key: IntentKey,
        /// Since when it waits.
        since: DateTime<Utc>,
        /// When the window closes.
        until: DateTime<Utc>,
    },
    /// A reconciliation asked before it is due (without `force`).
    #[error("intent {key}: reconciliation not due before {}", due.map_or_else(|| "never".to_owned(), |at| at.to_rfc3339()))]
    NotDue {
        /// The intent.
        key: IntentKey,
        /// When it is due, if ever.
        due: Option<DateTime<Utc>>,
    },
    /// A journal write at another position than the run's next one.
    #[error("run {run_id}: journal position {asked} asked, next free is {next}")]
    JournalPosition {
        /// The run.
        run_id: RunId,
        /// The position asked.
        asked: u32,
        /// The next free one.
        next: u32,
    },
    /// An agent batch at another position than the run's next agent position.
    #[error("run {run_id}: agent entries at position {asked} asked, the run has {next}")]
    AgentPosition {
        /// The run.
        run_id: RunId,
        /// The position asked.
        asked: u32,
        /// The entries the run has.
        next: u32,
    },
    /// An agent batch that is empty, or that starts a new run without its start.
    #[error("run {run_id}: {why}")]
    AgentBatch {
        /// The run.
        run_id: RunId,
        /// What is wrong.
        why: &'static str,
    },
    /// A resolution's evidence is not a provider reference, or its override has no reason.
    #[error("{0}")]
    ResolutionInput(&'static str),
    /// A resolution of an intent whose provider can look it up, without its lookup.
    #[error("intent {0}: its provider can look it up, so a resolution must be checked with it first")]
    ResolutionUnchecked(IntentKey),
    /// The provider contradicts the operator's resolution.
    #[error(
        "intent {key}: the provider contradicts this resolution: {provider_says}; nothing was recorded \
         (pass --override REASON to record it anyway)"
    )]
    ResolutionContradicted {
        /// The intent.
        key: IntentKey,
        /// What the provider says.
        provider_says: String,
    },
    /// A signal for an agent run: the harness waits for no signal (what an agent run waits
    /// on is an approval, given with `keel approve`).
    #[error(
        "run {0} is an agent run: it waits for no signal (an approval it waits on is given with `keel approve KEY`)"
    )]
    SignalToAgentRun(RunId),
    /// A signal for a run whose absolute deadline has passed: it would wake a run that may
    /// no longer act, so it is not recorded, and the run ends `deadline_exceeded` when it is
    /// next resumed.
    #[error(
        "run {run_id} passed its deadline at {deadline_at}: the signal arrived too late and is not recorded; \
         `keel resume` (or `keel worker`) ends the run deadline_exceeded"
    )]
    SignalPastDeadline {
        /// The run.
        run_id: RunId,
        /// Its deadline.
        deadline_at: DateTime<Utc>,
    },
    /// A signal's payload is larger than a signal may carry.
    #[error("run {run_id}: the signal's payload is {bytes} bytes as canonical JSON, above the {max}-byte limit")]
    SignalTooLarge {
        /// The run.
        run_id: RunId,
        /// The payload's size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// One of the command's events is larger than the log accepts.
    #[error("{event_type} payload is {bytes} bytes, above the {max}-byte limit: nothing was written")]
    PayloadTooLarge {
        /// The event's type.
        event_type: &'static str,
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
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

impl Refusal {
    /// Whether the refusal says the intent or run moved under the caller (another caller
    /// committed first), so the fresh state decides what is left to do; the others say the
    /// command itself cannot be.
    pub fn may_be_a_race(&self) -> bool {
        matches!(
            self,
            Self::WrongStatus { .. }
                | Self::NoSuchAttempt { .. }
                | Self::NoSuchLookup { .. }
                | Self::NotDue { .. }
                | Self::WaitingWindowOpen { .. }
        )
    }
}

/// The answer to an accepted command, read after its events were folded.
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
        /// What the run that sent the command must do next for it.
        next: Next,
        /// For a refund: its order's charge's provider reference (see
        /// [`crate::provider::EffectRequest::charge_ref`]); `None` for a charge.
        charge_ref: Option<String>,
    },
    /// A run's state.
    Run(Box<Run>),
    /// What replaying a run needs.
    History(Box<RunHistory>),
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
        /// Unfinished runs that may go on now (no timer, or one that fired).
        unfinished: Vec<Run>,
        /// Unfinished runs whose timer has not fired, soonest first.
        sleeping: Vec<Run>,
        /// Reserved intents nobody is sending (see [`super::View::waiting`]).
        waiting: Vec<IntentKey>,
    },
    /// A conversation's facts after the command.
    Facts(Box<Conversation>),
}

impl Reply {
    /// What kind of reply this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Done => "a commit",
            Self::Intent { .. } => "an intent",
            Self::Run(_) => "a run",
            Self::History(_) => "a run's history",
            Self::Recovered(_) => "a recovery report",
            Self::Claimed(_) => "a lease grant",
            Self::Renewed { .. } => "a renewal",
            Self::Snapshot { .. } => "a snapshot",
            Self::Facts(_) => "a conversation's facts",
        }
    }
}

/// What a reply refers to, resolved after the events are applied.
#[derive(Clone, Debug)]
pub enum ReplyTarget {
    /// Nothing.
    Done,
    /// An intent: whether the command reserved it, what it launched, and for whom, at
    /// which instant (what [`Next`] is computed from).
    Intent {
        /// The intent.
        key: IntentKey,
        /// Whether the command reserved it.
        fresh: bool,
        /// What the command started.
        launched: Launched,
        /// The run the command acted for.
        acting: Option<RunId>,
        /// The decision's instant.
        now: DateTime<Utc>,
    },
    /// A run.
    Run(RunId),
    /// A run's history.
    History(RunId),
    /// What recovery did.
    Recovered(Recovery),
    /// A claimed lease.
    Claimed(LeaseGrant),
    /// Renewal result.
    Renewed(Vec<RunId>),
    /// Due intents and unfinished runs as of `now`.
    Snapshot(DateTime<Utc>),
    /// A conversation's facts.
    Facts(ConversationId),
}

/// What [`super::decide`] decided: the events to append, what to answer, and the lease
/// changes the store applies in the same transaction.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Events to append, in order.
    pub events: Vec<Event>,
    /// What to answer after they are folded.
    pub target: ReplyTarget,
    /// Lease holds to write.
    pub leases: Vec<LeaseEffect>,
}
