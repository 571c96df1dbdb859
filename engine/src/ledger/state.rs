//! The state the ledger folds and decides over: one intent, one run.
//!
//! Owns [`IntentStatus`], [`Intent`] (everything known about one intent, folded from its own
//! stream), [`Run`] (the state of one run a decision needs — not its journal, which
//! [`RunHistory`] carries when a run is replayed), [`JournalEntry`] and [`Recovery`]. These
//! are the entity states the store keeps one row of each (the projections), so every field
//! a decision reads is here, and nothing that needs the whole log is.
//!
//! This module only defines state and the questions it answers about itself; folding events
//! into it is [`super::fold`], deciding over it is [`super::decide`].

use crate::clock::{checked_plus_ms, ms_between};
use crate::event::{IntentDefinition, IntentKey, RunId, RunLimits, RunStatus, RunVersions, Source};
use crate::lease::{LeaseGrant, LeaseOwner};
use crate::provider::{Capability, Evidence, UnknownReason};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

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

    /// Whether another run's proposal of an intent in this status is a resend Keel refuses
    /// (`ResendRefused`): an attempt went out and its effect is not proven (in flight,
    /// unknown, reconciling, escalated), or the intent ended without an effect (declined,
    /// cancelled, rejected). A validated intent's is a deduplication; a reserved or
    /// approval-awaiting one has sent nothing yet. Every status is named, so a new one must be
    /// placed here.
    pub fn refuses_resend(self) -> bool {
        match self {
            Self::Attempting | Self::OutcomeUnknown | Self::Reconciling | Self::Escalated => true,
            Self::Declined | Self::Cancelled | Self::Rejected => true,
            Self::Validated | Self::Reserved | Self::AwaitingApproval => false,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The fingerprint approved.
    pub fingerprint: String,
    /// The approver.
    pub by: String,
    /// After this instant it releases nothing.
    pub expires_at: DateTime<Utc>,
}

/// The folded state of one intent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Why Keel released it unsent, when it did (`IntentReleased`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<crate::event::ReleaseReason>,
    /// Times the same key and fingerprint were proposed again after validation.
    pub duplicates_suppressed: u32,
    /// Times another run proposed it again while it could take no new attempt from it
    /// (`ResendRefused`; absent from rows written before the count).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resends_refused: u32,
    /// Attempts proven never sent (`AttemptNotSent`): they made no effect, so they do not
    /// count against `attempts_max`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_sent: u32,
    /// Whether the latest attempt was proven never sent (the next one is a network retry).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub latest_not_sent: bool,
    /// The run that started the latest attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_attempt_run: Option<RunId>,
    /// The run on whose behalf the attempt or lookup in flight was made (its lease holder
    /// is the one process allowed to act on it; recovery checks that lease).
    pub in_flight_run: Option<RunId>,
    /// Definitive answers that arrived after their attempt stopped being awaited.
    pub late_answers: u32,
    /// When the approval window of the run waiting on it closes (an approval after it is
    /// refused).
    pub approval_closes_at: Option<DateTime<Utc>>,
    /// Whether it was rejected `abandoned`: it waited for its caller past the abandonment
    /// window with no effect (`IntentAbandoned`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// Whether an operator's `keel resolve --landed` validated it without the provider's
    /// lookup agreeing (unverified or overridden): its evidence is the operator's word.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator_word: bool,
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

    /// Whether the intent waits for its caller at `now`: ready for its next attempt, which
    /// needs a payment method that only the caller (or the log's vault) has.
    pub fn waits_for_payment_method(&self, now: DateTime<Utc>) -> bool {
        self.definition.kind.needs_payment_method()
            && matches!(
                super::next::Next::after(self, super::next::Launched::Nothing, now, None),
                super::next::Next::Attempt { .. }
            )
    }

    /// Whether a reconciliation is due at `now`.
    pub fn reconcile_due(&self, now: DateTime<Utc>) -> bool {
        self.status == IntentStatus::OutcomeUnknown && self.reconcile_after.is_some_and(|at| at <= now)
    }

    pub(crate) fn within_key_window(&self, now: DateTime<Utc>) -> bool {
        self.first_sent_at.is_none_or(|first| ms_between(first, now) < self.capability.key_window_ms)
    }
}

/// One entry of a run's journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position, from 0.
    pub position: u32,
    /// Step name (`intent:<key>` for intents, `timer` for timers, `signal:<name>` for waits).
    pub name: String,
    /// Recorded output (the timer's `fire_at` for timers).
    pub output: Value,
}

/// The state of one run that decisions read: what it is, its limits and deadline, how far
/// its journal goes, how it ended. Its journal itself, its signals and its agent entries are
/// in [`RunHistory`], read from the run's stream when it is replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The run.
    pub run_id: RunId,
    /// The workflow's name.
    pub workflow: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its absolute deadline (moved later only by a wait for a human).
    pub deadline_at: DateTime<Utc>,
    /// Its limits.
    pub limits: RunLimits,
    /// `None` while running.
    pub status: Option<RunStatus>,
    /// Detail of its end.
    pub detail: Option<String>,
    /// Entries in its journal (steps, intent links, timers): the next position.
    pub journal_len: u32,
    /// When its durable timer fires, while the run waits on one: the `fire_at` of a
    /// `TimerStarted` that is its journal's latest entry (the next entry, or its end, clears
    /// it). `keel resume` resumes a run only once this has passed; replay never recomputes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<DateTime<Utc>>,
    /// Agent facts it recorded (an agent run's opaque journal): the next agent position.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub agent_entries: u32,
    /// Attempts this run started again after one it proved never sent (network retries),
    /// bounded by [`crate::limits::NETWORK_RETRIES_PER_RUN_MAX`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub network_retries: u32,
    /// An operator's request that the run stop (`keel run cancel`): it stops `cancelled` at
    /// its next guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<CancelRequest>,
    /// The versions it runs under, from its `RunStarted` (unknown in runs started before
    /// they were recorded).
    #[serde(default, skip_serializing_if = "RunVersions::is_unknown")]
    pub versions: RunVersions,
    /// What it spent on models, from its `RunFinished` (`None` while running, for runs
    /// that call no model, and for an agent run whose cost is unknown: an answer from a
    /// model without a price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_minor: Option<i64>,
    /// Global sequence of its latest event.
    pub last_seq: u64,
}

/// An operator's request that a run stop, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// The operator.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

impl CancelRequest {
    /// The run's stop detail: who cancelled it and why.
    pub fn detail(&self) -> String {
        format!("cancelled by operator {}: {}", self.by, self.reason)
    }
}

impl Run {
    /// A run as its `RunStarted` makes it: nothing journaled, spent or asked for yet.
    pub fn started(
        run_id: RunId,
        workflow: String,
        started_at: DateTime<Utc>,
        deadline_at: DateTime<Utc>,
        limits: RunLimits,
        versions: RunVersions,
        last_seq: u64,
    ) -> Self {
        Self {
            run_id,
            workflow,
            started_at,
            deadline_at,
            limits,
            status: None,
            detail: None,
            journal_len: 0,
            wake_at: None,
            agent_entries: 0,
            network_retries: 0,
            cancel_requested: None,
            versions,
            cost_minor: None,
            last_seq,
        }
    }

    /// A stand-in for a run that lives on its own stream, for a fold of one intent's stream
    /// alone: it only needs the run to exist (and counts the network retries made for it).
    pub fn stand_in(run_id: &RunId, at: DateTime<Utc>) -> Self {
        Self::started(run_id.clone(), String::new(), at, at, RunLimits::default(), RunVersions::default(), 0)
    }

    /// Whether this is an agent run (resumed by `keel agent resume`, not by the workflow
    /// executor).
    pub fn is_agent(&self) -> bool {
        self.workflow.starts_with(AGENT_WORKFLOW_PREFIX)
    }

    /// Whether the run waits at `now` on a timer that has not fired: nothing may continue it
    /// before [`Run::wake_at`].
    pub fn sleeping(&self, now: DateTime<Utc>) -> bool {
        self.status.is_none() && self.wake_at.is_some_and(|at| at > now)
    }
}

/// The prefix of an agent run's workflow name in `RunStarted` (`agent:ticket-review`).
pub const AGENT_WORKFLOW_PREFIX: &str = "agent:";

/// Everything needed to replay a run: its state, its stored input, its journal, the
/// signals delivered to it and (for an agent run) its opaque agent entries, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct RunHistory {
    /// The run's state.
    pub run: Run,
    /// Its input as stored in `RunStarted` (secrets hashed).
    pub input: Value,
    /// Its journal, in position order.
    pub journal: Vec<JournalEntry>,
    /// Signals delivered, by name, in order.
    pub signals: BTreeMap<String, Vec<Value>>,
    /// An agent run's facts, as the harness recorded them.
    pub agent_entries: Vec<Value>,
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
