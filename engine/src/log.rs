//! The event log as the executor sees it.
//!
//! Owns [`EventLog`], the one door through which the executor changes durable state: it
//! sends a [`Command`] and gets back the [`Reply`] once the command's events are committed,
//! or the [`Refusal`] that wrote nothing — and [`Asking`], the typed way through that door:
//! an [`Ask<A>`] built by one constructor per kind of request answers with its own type `A`
//! ([`IntentAnswer`], [`Run`], [`RunHistory`], …), so no caller picks a [`Reply`] apart. The `store` (SQLite) and `store-postgres` crates
//! implement it; the engine never names SQL. Implementations must decide each command against a ledger that includes every
//! event committed before it (by any process), and answer only after the commit.

use crate::event::{Cause, IntentKey, RunId, RunStatus, SignalName};
use crate::facts::{Candidate, Conversation, ConversationId, Ticket};
use crate::lease::{LeaseGrant, LeaseOwner, LeaseUse};
use crate::ledger::{
    Action, AgentRunStart, Command, Intent, IntentSpec, Next, Recovery, Refusal, Reply, Run, RunHistory, RunStart,
    SpineRequest,
};
use crate::provider::{BoxFuture, CallOutcome, LookupOutcome, Secret};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::marker::PhantomData;

/// Why a command did not produce a reply.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The ledger refused the command; nothing was written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The log itself failed (I/O, corruption, shut down). Whether the command's events were
    /// committed is unknown to the caller only if `maybe_committed`.
    #[error("event log failure: {detail}")]
    Unavailable {
        /// What failed.
        detail: String,
        /// Whether the commit may have happened before the failure.
        maybe_committed: bool,
    },
    /// The log answered a request with another kind of reply: a bug in the log
    /// implementation. The command may have been committed.
    #[error(
        "the event log answered a request for {expected} with {got}: a bug in the log; the command may have been committed"
    )]
    Mismatched {
        /// What the request answers.
        expected: &'static str,
        /// What came back.
        got: &'static str,
    },
}

/// The durable event log.
pub trait EventLog: Send + Sync {
    /// Decides `command` against the current ledger, appends its events in one commit, and
    /// answers once they are durable.
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, LogError>>;

    /// The payment method kept for intent `key` by the log's vault, if it keeps them: what a
    /// resend needs when the caller who had the secret is gone. Kept by the reservation that
    /// carried it ([`Command::keep`]) and gone once the intent is final. The default is a log
    /// that keeps none ([`Unsealed::NoVault`]).
    fn unseal<'a>(&'a self, key: &'a IntentKey) -> BoxFuture<'a, Unsealed> {
        let _ = key;
        Box::pin(async { Unsealed::NoVault })
    }
}

/// What the log's vault holds for one intent.
#[derive(Clone, Debug)]
pub enum Unsealed {
    /// The payment method the intent was reserved with, decrypted and checked.
    Kept(Secret),
    /// This log keeps no payment methods (no vault key).
    NoVault,
    /// The vault holds nothing for the intent (it was reserved without a vault key, or its
    /// entry was purged).
    Missing,
    /// The entry exists but cannot be used: it does not authenticate (tampered with, or
    /// sealed under another key), or the vault could not be read. `why` never quotes the key
    /// nor the secret.
    Unreadable {
        /// Why, for humans.
        why: String,
    },
}

impl Unsealed {
    /// Why an intent that needs its payment method to be sent waits for its caller, given
    /// what the vault said (never for [`Unsealed::Kept`]).
    pub fn waiting_reason(&self) -> String {
        let why = match self {
            Self::Kept(_) => "its payment method is kept in the vault".to_owned(),
            Self::NoVault => "the payment method is never stored".to_owned(),
            Self::Missing => "the vault holds no payment method for it".to_owned(),
            Self::Unreadable { why } => format!("its vault entry cannot be used ({why})"),
        };
        format!("ready for the next attempt, but {why}: re-submit the same request (same key, same payload) to send it")
    }
}

/// A request whose reply has type `A`: built by one constructor per kind of command, so a
/// caller names what it asks and gets back what that request answers, never a [`Reply`] to
/// pick apart. The log's transport stays one [`Command`]; the downcast happens here, once.
#[must_use = "a request does nothing until it is asked"]
pub struct Ask<A> {
    command: Command,
    answer: PhantomData<fn() -> A>,
}

impl<A: Answer> Ask<A> {
    fn new(cause: Cause, action: Action) -> Self {
        Self { command: Command::new(cause, action), answer: PhantomData }
    }

    /// The same request, starting `run` in its commit if accepted.
    pub fn starting(mut self, run: Option<RunStart>) -> Self {
        self.command = self.command.starting(run);
        self
    }

    /// The same request, written under `lease`.
    pub fn under(mut self, lease: LeaseUse) -> Self {
        self.command = self.command.under(lease);
        self
    }

    /// The same request, decided under the policy in force `policy` too (see
    /// [`Command::policy`]).
    pub fn governed_by(mut self, policy: Option<crate::policy::Governing>) -> Self {
        self.command = self.command.governed_by(policy);
        self
    }

    /// The command this request sends.
    pub fn into_command(self) -> Command {
        self.command
    }
}

/// Requests answered with an intent's state and the next step for it.
impl Ask<IntentAnswer> {
    /// Reads one intent.
    pub fn observe(cause: Cause, key: IntentKey) -> Self {
        Self::new(cause, Action::Observe { key })
    }

    /// Reserves an intent for `run_id` at journal `position` (see [`Action::Reserve`]).
    pub fn reserve(cause: Cause, run_id: RunId, position: u32, spec: IntentSpec, start_attempt: bool) -> Self {
        Self::new(cause, Action::Reserve { run_id, position, spec, start_attempt })
    }

    /// The same request, carrying the reservation's payment method for the log's vault (see
    /// [`Command::keep`]).
    pub fn keeping(mut self, payment_method: Option<Secret>) -> Self {
        self.command.keep = payment_method;
        self
    }

    /// Writes the next attempt ahead, for `run_id`.
    pub fn start_attempt(cause: Cause, key: IntentKey, run_id: RunId) -> Self {
        Self::new(cause, Action::StartAttempt { key, run_id })
    }

    /// Records what attempt `attempt` came to.
    pub fn record_outcome(cause: Cause, key: IntentKey, attempt: u32, outcome: CallOutcome) -> Self {
        Self::new(cause, Action::RecordOutcome { key, attempt, outcome })
    }

    /// Starts the next reconciliation, for `run_id`; `force` ignores its due time.
    pub fn start_reconciliation(cause: Cause, key: IntentKey, force: bool, run_id: RunId) -> Self {
        Self::new(cause, Action::StartReconciliation { key, force, run_id })
    }

    /// Ends a charge that waited for its caller for `window_ms` (see [`Action::Abandon`]).
    pub fn abandon(cause: Cause, key: IntentKey, run_id: RunId, window_ms: u64) -> Self {
        Self::new(cause, Action::Abandon { key, run_id, window_ms })
    }

    /// Records what reconciliation `reconciliation`'s lookup answered.
    pub fn record_lookup(cause: Cause, key: IntentKey, reconciliation: u32, outcome: LookupOutcome) -> Self {
        Self::new(cause, Action::RecordLookup { key, reconciliation, outcome })
    }

    /// A human approves the intent (see [`Action::Approve`]).
    pub fn approve(cause: Cause, key: IntentKey, by: String, ttl_ms: u64, fingerprint: Option<String>) -> Self {
        Self::new(cause, Action::Approve { key, by, ttl_ms, fingerprint })
    }

    /// Records a lapsed approval expired (see [`Action::CheckApproval`]).
    pub fn check_approval(cause: Cause, key: IntentKey) -> Self {
        Self::new(cause, Action::CheckApproval { key })
    }

    /// A human denies the intent.
    pub fn deny(cause: Cause, key: IntentKey, by: String, reason: String) -> Self {
        Self::new(cause, Action::Deny { key, by, reason })
    }

    /// An operator cancels the intent.
    pub fn cancel(cause: Cause, key: IntentKey, by: String, reason: String) -> Self {
        Self::new(cause, Action::Cancel { key, by, reason })
    }

    /// An operator resolves the intent by hand (see [`Action::Resolve`]).
    pub fn resolve(cause: Cause, resolution: Resolution) -> Self {
        let Resolution { key, by, reason, landed, lookup, override_reason } = resolution;
        Self::new(cause, Action::Resolve { key, by, reason, landed, lookup, override_reason })
    }
}

/// An operator's resolution of an intent, as [`Ask::resolve`] sends it.
#[derive(Clone, Debug)]
pub struct Resolution {
    /// The intent.
    pub key: IntentKey,
    /// The operator.
    pub by: String,
    /// Why.
    pub reason: String,
    /// The provider's reference proving the effect; `None` asserts it is absent.
    pub landed: Option<String>,
    /// What the provider's lookup said just before, when it has one.
    pub lookup: Option<LookupOutcome>,
    /// Why the operator records an answer the provider contradicts.
    pub override_reason: Option<String>,
}

/// Requests answered with a run's state.
impl Ask<Run> {
    /// Starts the command's run (given with [`Ask::starting`]) and nothing else.
    pub fn start_run(cause: Cause) -> Self {
        Self::new(cause, Action::StartRun)
    }

    /// Reads one run.
    pub fn observe_run(cause: Cause, run_id: RunId) -> Self {
        Self::new(cause, Action::ObserveRun { run_id })
    }

    /// Records a journaled step's output at `position`.
    pub fn record_step(cause: Cause, run_id: RunId, position: u32, name: String, output: Value) -> Self {
        Self::new(cause, Action::RecordStep { run_id, position, name, output })
    }

    /// Starts a durable timer at `position`, firing at `fire_at`.
    pub fn start_timer(cause: Cause, run_id: RunId, position: u32, fire_at: DateTime<Utc>) -> Self {
        Self::new(cause, Action::StartTimer { run_id, position, fire_at })
    }

    /// Delivers a signal to a run; the cause names who sent it.
    pub fn deliver_signal(cause: Cause, run_id: RunId, name: SignalName, payload: Value) -> Self {
        Self::new(cause, Action::DeliverSignal { run_id, name, payload })
    }

    /// An operator asks a run to stop (see [`Action::CancelRun`]).
    pub fn cancel_run(cause: Cause, run_id: RunId, by: String, reason: String) -> Self {
        Self::new(cause, Action::CancelRun { run_id, by, reason })
    }

    /// Ends a run.
    pub fn finish_run(cause: Cause, run_id: RunId, status: RunStatus, detail: Option<String>) -> Self {
        Self::new(cause, Action::FinishRun { run_id, status, detail })
    }
}

impl Ask<RunHistory> {
    /// Reads what replaying a run needs.
    pub fn load_run(cause: Cause, run_id: RunId) -> Self {
        Self::new(cause, Action::LoadRun { run_id })
    }
}

impl Ask<Snapshot> {
    /// Reads the intents due for reconciliation and the unfinished runs.
    pub fn snapshot(cause: Cause) -> Self {
        Self::new(cause, Action::Snapshot)
    }
}

impl Ask<Recovery> {
    /// Recovers in-flight work nobody holds live, `owner` claiming those runs (see
    /// [`Action::Recover`]); `run` limits it to one run.
    pub fn recover(cause: Cause, owner: LeaseOwner, run: Option<RunId>) -> Self {
        Self::new(cause, Action::Recover { owner, run })
    }
}

impl Ask<LeaseGrant> {
    /// Takes a run's lease for `owner`.
    pub fn claim_run(cause: Cause, run_id: RunId, owner: LeaseOwner) -> Self {
        Self::new(cause, Action::ClaimRun { run_id, owner })
    }
}

impl Ask<Renewal> {
    /// Extends `owner`'s holds on `grants`.
    pub fn renew_leases(cause: Cause, owner: LeaseOwner, grants: Vec<LeaseGrant>) -> Self {
        Self::new(cause, Action::RenewLeases { owner, grants })
    }
}

/// Requests answered with nothing but their commit.
impl Ask<()> {
    /// Gives back leases.
    pub fn release_leases(cause: Cause, grants: Vec<LeaseGrant>) -> Self {
        Self::new(cause, Action::ReleaseLeases { grants })
    }

    /// Appends a batch of an agent run's entries (see [`Action::RecordAgentEntries`]).
    pub fn record_agent_entries(cause: Cause, batch: AgentBatch) -> Self {
        let AgentBatch { run_id, position, entries, start, spine } = batch;
        Self::new(cause, Action::RecordAgentEntries { run_id, position, entries, start, spine })
    }
}

/// A batch of agent entries, as [`Ask::record_agent_entries`] sends it.
#[derive(Clone, Debug)]
pub struct AgentBatch {
    /// The run.
    pub run_id: RunId,
    /// The number of agent entries recorded before this batch.
    pub position: u32,
    /// The entries, in order.
    pub entries: Vec<Value>,
    /// Used when the run does not exist yet.
    pub start: Option<AgentRunStart>,
    /// What the batch means for the spine.
    pub spine: Vec<SpineRequest>,
}

/// An intent after a command, and the step the executor must take next for it.
#[derive(Clone, Debug)]
pub struct IntentAnswer {
    /// The intent.
    pub intent: Intent,
    /// Whether the command reserved it.
    pub fresh: bool,
    /// What to do next.
    pub next: Next,
    /// For a refund: the provider's reference of the charge it returns money on, what its
    /// attempts send ([`crate::provider::EffectRequest::charge_ref`]); `None` for a charge.
    pub charge_ref: Option<String>,
}

/// The intents due for reconciliation and the unfinished runs, as of the command.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Due intents, oldest first.
    pub due: Vec<IntentKey>,
    /// Unfinished runs that may go on now (no timer, or one that fired), in id order.
    pub unfinished: Vec<Run>,
    /// Unfinished runs whose timer has not fired, soonest first: nothing continues them
    /// before they wake.
    pub sleeping: Vec<Run>,
    /// Reserved intents nobody is sending: waiting for their caller, or for the vault's
    /// payment method.
    pub waiting: Vec<IntentKey>,
}

/// What renewing leases found.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The runs whose leases another process took.
    pub lost: Vec<RunId>,
}

/// A reply's typed content, for the requests that answer with it.
pub trait Answer: Sized {
    /// What a request of this kind answers, in words (for a mismatch).
    const NAME: &'static str;

    /// The content of `reply`, or `None` when it answers another kind of request.
    fn from_reply(reply: Reply) -> Option<Self>;
}

impl Answer for IntentAnswer {
    const NAME: &'static str = "an intent";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Intent { intent, fresh, next, charge_ref } => {
                Some(Self { intent: *intent, fresh, next, charge_ref })
            }
            _ => None,
        }
    }
}

impl Answer for Run {
    const NAME: &'static str = "a run";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Run(run) => Some(*run),
            _ => None,
        }
    }
}

impl Answer for RunHistory {
    const NAME: &'static str = "a run's history";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::History(history) => Some(*history),
            _ => None,
        }
    }
}

impl Answer for Snapshot {
    const NAME: &'static str = "a snapshot";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Snapshot { due, unfinished, sleeping, waiting } => Some(Self { due, unfinished, sleeping, waiting }),
            _ => None,
        }
    }
}

impl Answer for Recovery {
    const NAME: &'static str = "a recovery report";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Recovered(recovery) => Some(recovery),
            _ => None,
        }
    }
}

impl Answer for LeaseGrant {
    const NAME: &'static str = "a lease grant";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Claimed(grant) => Some(grant),
            _ => None,
        }
    }
}

impl Answer for Renewal {
    const NAME: &'static str = "a renewal";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Renewed { lost } => Some(Self { lost }),
            _ => None,
        }
    }
}

impl Answer for Conversation {
    const NAME: &'static str = "a conversation's facts";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Facts(conversation) => Some(*conversation),
            _ => None,
        }
    }
}

/// Requests answered with a conversation's controlled facts (seed 001).
impl Ask<Conversation> {
    /// Admits the facts `candidates` propose for the user's `message`, whole or not at all,
    /// under `ticket` (`None`: the conversation's current one).
    pub fn apply_facts(
        cause: Cause,
        conversation: ConversationId,
        ticket: Option<Ticket>,
        message: String,
        candidates: Vec<Candidate>,
    ) -> Self {
        Self::new(cause, Action::ApplyFacts { conversation, ticket, message, candidates })
    }

    /// Forgets `key` (`None`: every fact) under `ticket` (`None`: the current one).
    pub fn forget_facts(
        cause: Cause,
        conversation: ConversationId,
        ticket: Option<Ticket>,
        key: Option<String>,
    ) -> Self {
        Self::new(cause, Action::ForgetFacts { conversation, ticket, key })
    }
}

impl Answer for () {
    const NAME: &'static str = "a commit";

    fn from_reply(reply: Reply) -> Option<Self> {
        match reply {
            Reply::Done => Some(()),
            _ => None,
        }
    }
}

/// The typed door to an [`EventLog`].
pub trait Asking {
    /// Sends `ask` and returns its typed answer.
    ///
    /// # Errors
    ///
    /// The refusal, the log's failure, or [`LogError::Mismatched`] when the log answered
    /// with another kind of reply (a bug in the log; the command may have been committed).
    fn ask<A: Answer + Send>(&self, ask: Ask<A>) -> BoxFuture<'_, Result<A, LogError>>;
}

impl Asking for dyn EventLog + '_ {
    fn ask<A: Answer + Send>(&self, ask: Ask<A>) -> BoxFuture<'_, Result<A, LogError>> {
        Box::pin(async move {
            let reply = self.execute(ask.command).await?;
            let got = reply.kind();
            A::from_reply(reply).ok_or(LogError::Mismatched { expected: A::NAME, got })
        })
    }
}
