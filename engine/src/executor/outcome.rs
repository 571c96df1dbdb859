//! What a caller learns from the executor: where an intent stands ([`IntentOutcome`]) and
//! how a run came out ([`RunOutcome`]).
//!
//! Owns those two values and their statuses, typed ([`OutcomeStatus`], [`ValidatedBy`],
//! [`OutcomeCode`], [`UnknownOutcome`], [`RunEnd`]) until the binary renders them: they serialise to the
//! strings the CLI's JSON shows, but nothing in the engine compares strings. This module
//! never reads the log; it describes intents it is given.

use super::workflow::Rejection;
use crate::event::{IntentKey, RunId, RunStatus, Source};
use crate::ledger::{Intent, IntentStatus, RejectCode};
use crate::provider::UnknownReason;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// Where an intent stands after Keel did everything it may do now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntentOutcome {
    /// The intent key.
    pub intent_key: IntentKey,
    /// The intent's status, or why there is none to show.
    pub status: OutcomeStatus,
    /// How it was validated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<ValidatedBy>,
    /// Why it was rejected or declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<OutcomeCode>,
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
    /// Why the outcome is unknown and whether to submit again, while it is unknown: the
    /// caller reads `reason` and `retryable` beside the status, as the log records them.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<UnknownOutcome>,
    /// Human detail.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

/// An outcome's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeStatus {
    /// The intent's own status (`rejected` too for a proposal refused before anything was
    /// written).
    Intent(IntentStatus),
    /// No request could reach the provider within the run's network retries: nothing was
    /// sent, the intent stays reserved for a new submission.
    ProviderUnavailable,
}

impl OutcomeStatus {
    /// The status as the CLI shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intent(status) => status.as_str(),
            Self::ProviderUnavailable => "provider_unavailable",
        }
    }
}

impl Serialize for OutcomeStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// How a validated intent came to be validated, as this call saw it (read back by clients of
/// the JSON answers, such as `keel serve-bench`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValidatedBy {
    /// The provider confirmed this call's attempt.
    Provider,
    /// Validated earlier: this call returned the stored result.
    Deduplicated,
    /// A lookup (or a late answer) proved it.
    Reconciled,
}

impl ValidatedBy {
    /// The source as the CLI shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Deduplicated => "deduplicated",
            Self::Reconciled => "reconciled",
        }
    }
}

/// Why an intent's outcome is unknown, and what its caller may do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct UnknownOutcome {
    /// The reason the log records on the attempt's `OutcomeUnknown` (`timeout`,
    /// `connection_lost`, `provider_unavailable`, `protocol`, `crash`, `interrupted`).
    pub reason: UnknownReason,
    /// Whether re-submitting the same request with the same key is useful and safe, now or
    /// once its time to ask again has passed: true while the outcome awaits reconciliation
    /// (Keel looks the effect up and never resends blindly, so a re-submission drives that,
    /// and returns the effect once proven); false once it is escalated to an operator (a
    /// re-submission changes nothing until a human resolves it).
    pub retryable: bool,
}

impl UnknownOutcome {
    /// What an intent of `status` whose last attempt was declared unknown for `reason` tells
    /// its caller: nothing unless its outcome is still unknown.
    pub fn of(status: IntentStatus, reason: Option<UnknownReason>) -> Option<Self> {
        let retryable = match status {
            IntentStatus::OutcomeUnknown | IntentStatus::Reconciling => true,
            IntentStatus::Escalated => false,
            IntentStatus::Reserved
            | IntentStatus::AwaitingApproval
            | IntentStatus::Attempting
            | IntentStatus::Validated
            | IntentStatus::Declined
            | IntentStatus::Rejected
            | IntentStatus::Cancelled => return None,
        };
        Some(Self { reason: reason?, retryable })
    }
}

/// Why an intent was refused or declined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutcomeCode {
    /// Keel refused the proposal before writing anything.
    Rejected(RejectCode),
    /// The provider declined, with its own code.
    Declined(String),
}

impl OutcomeCode {
    /// The code as the CLI shows it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Rejected(code) => code.as_str(),
            Self::Declined(code) => code,
        }
    }
}

impl Serialize for OutcomeCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl IntentOutcome {
    /// Where `intent` stands; `deduplicated` when this call found it already validated.
    pub(crate) fn of(intent: &Intent, deduplicated: bool) -> Self {
        let source = intent.source.map(|source| match (deduplicated, source) {
            (true, _) => ValidatedBy::Deduplicated,
            (false, Source::Provider) => ValidatedBy::Provider,
            (false, Source::Reconciled) => ValidatedBy::Reconciled,
        });
        Self {
            intent_key: intent.key().clone(),
            status: OutcomeStatus::Intent(intent.status),
            source,
            code: match &intent.decline_code {
                Some(code) => Some(OutcomeCode::Declined(code.clone())),
                None if intent.abandoned => Some(OutcomeCode::Rejected(RejectCode::Abandoned)),
                None => None,
            },
            attempts: intent.attempts,
            attempts_max: intent.attempts_max,
            reconciliations: intent.reconciliations,
            reconciliations_max: intent.reconciliations_max,
            provider_ref: intent.evidence.as_ref().map(|e| e.provider_ref.clone()),
            reconcile_after: intent.reconcile_after,
            unknown: UnknownOutcome::of(intent.status, intent.unknown_reason),
            details: intent.note.iter().cloned().collect(),
        }
    }

    /// A proposal refused before anything was written.
    pub(crate) fn rejected(key: &IntentKey, code: RejectCode, detail: String) -> Self {
        Self {
            intent_key: key.clone(),
            status: OutcomeStatus::Intent(IntentStatus::Rejected),
            source: None,
            code: Some(OutcomeCode::Rejected(code)),
            attempts: 0,
            attempts_max: 0,
            reconciliations: 0,
            reconciliations_max: 0,
            provider_ref: None,
            reconcile_after: None,
            unknown: None,
            details: vec![detail],
        }
    }

    /// The provider could not be reached within the run's network retries: nothing was sent.
    pub(crate) fn unreachable(intent: &Intent, retries: u32) -> Self {
        let mut outcome = Self::of(intent, false).with_detail(format!(
            "the provider could not be reached ({} proven never sent, {} network {}): no request left, the intent \
             stays reserved; re-submit the same request (same key, same payload) to try again",
            if intent.not_sent == 1 { "1 attempt".to_owned() } else { format!("{} attempts", intent.not_sent) },
            retries,
            if retries == 1 { "retry" } else { "retries" }
        ));
        outcome.status = OutcomeStatus::ProviderUnavailable;
        outcome
    }

    pub(crate) fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.details.push(detail.into());
        self
    }

    /// Whether the intent's effect is proven.
    pub fn is_validated(&self) -> bool {
        self.status == OutcomeStatus::Intent(IntentStatus::Validated)
    }

    /// The run status this outcome implies when it is the run's last word.
    pub fn run_status(&self) -> RunStatus {
        match self.status {
            OutcomeStatus::Intent(IntentStatus::Validated) => RunStatus::Completed,
            // The run's money budget, across its intents, is spent: a controlled stop named for
            // its dimension, not a rejection of the caller's input.
            OutcomeStatus::Intent(IntentStatus::Rejected)
                if self.code == Some(OutcomeCode::Rejected(RejectCode::BudgetExhausted)) =>
            {
                RunStatus::CostBudget
            }
            OutcomeStatus::Intent(IntentStatus::Rejected) => RunStatus::Rejected,
            OutcomeStatus::Intent(IntentStatus::Declined) => RunStatus::Declined,
            OutcomeStatus::Intent(IntentStatus::Escalated) => RunStatus::Escalated,
            OutcomeStatus::Intent(IntentStatus::Cancelled) => RunStatus::Cancelled,
            OutcomeStatus::ProviderUnavailable => RunStatus::ProviderUnavailable,
            OutcomeStatus::Intent(
                IntentStatus::Reserved
                | IntentStatus::AwaitingApproval
                | IntentStatus::Attempting
                | IntentStatus::OutcomeUnknown
                | IntentStatus::Reconciling,
            ) => RunStatus::OutcomeUnknown,
        }
    }
}

/// A workflow run's result as the caller sees it.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: RunId,
    /// How it ended, or that it waits.
    pub status: RunEnd,
    /// When it waits on a durable timer: when that fires (`keel resume` continues it then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wakes_at: Option<DateTime<Utc>>,
    /// Whether anything was written (a run rejected at its first proposal writes nothing).
    pub written: bool,
    /// The intent the run's outcome is about, when it ended on (or waits for) one.
    #[serde(skip)]
    pub intent: Option<IntentOutcome>,
    /// Why the run was refused before anything was written, when it was.
    #[serde(skip)]
    pub rejection: Option<Rejection>,
    /// The workflow's output, as its caller is shown it.
    pub output: Value,
    /// Whether another process took the run over while this one worked (this one was
    /// presumed dead): its finish was refused (fenced), and the new holder ends the run.
    #[serde(skip)]
    pub taken_over: bool,
}

/// Where a run is once the executor stops driving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// It ended with this status (or was refused before anything was written: `rejected`).
    Finished(RunStatus),
    /// It waits (a timer, a signal, an approval, a resubmission); `keel resume` continues it.
    Suspended,
}

impl RunEnd {
    /// The status as the CLI shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finished(status) => status.as_str(),
            Self::Suspended => "suspended",
        }
    }
}

impl Serialize for RunEnd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_outcome_says_why_and_whether_to_submit_again_until_it_is_known() {
        use IntentStatus as S;
        let timeout = Some(UnknownReason::Timeout);
        assert_eq!(
            UnknownOutcome::of(S::OutcomeUnknown, timeout),
            Some(UnknownOutcome { reason: UnknownReason::Timeout, retryable: true })
        );
        assert_eq!(UnknownOutcome::of(S::Reconciling, Some(UnknownReason::Crash)).map(|u| u.retryable), Some(true));
        assert_eq!(UnknownOutcome::of(S::Escalated, timeout).map(|u| u.retryable), Some(false), "an operator's now");
        for known in [S::Validated, S::Declined, S::Rejected, S::Cancelled, S::Reserved, S::Attempting] {
            assert_eq!(UnknownOutcome::of(known, timeout), None, "{known:?}");
        }
        let json = serde_json::to_value(UnknownOutcome { reason: UnknownReason::ConnectionLost, retryable: false })
            .expect("serialises");
        assert_eq!(json, serde_json::json!({"reason": "connection_lost", "retryable": false}));
    }
}
