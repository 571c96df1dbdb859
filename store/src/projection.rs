//! What listings show of an intent or a run: [`IntentRow`] and [`RunRow`], flat rows derived
//! from the entity states (`keel intents`, `keel verify --json`, the test kit).
//!
//! A row is a function of its entity alone ([`IntentRow::from_intent`]; a run's row also
//! sums its intents' money, [`RunRow::from_run`]). The stored entity rows are
//! `crate::rows`; these are their public face. Times are RFC 3339, microseconds, `Z`.

use crate::codec::{format_time, to_i64};
use engine::event::Source;
use engine::ledger::{Intent, Run};
use engine::money::checked_sum;
use serde::Serialize;

/// One row of the `intents` projection: what `keel intents` lists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IntentRow {
    /// The intent key, `operation:tenant:intent_id`.
    pub key: String,
    /// `charge` or `refund`.
    pub kind: String,
    /// The tenant.
    pub tenant: String,
    /// The caller's intent id.
    pub intent_id: String,
    /// The order the effect is for.
    pub order_id: String,
    /// The business reference a second key may not use while this one is pending.
    pub business_ref: String,
    /// Lifecycle status (`IntentStatus::as_str`).
    pub status: String,
    /// Payload fingerprint.
    pub fingerprint: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The reserving run.
    pub run_id: String,
    /// The provider's capability tier (`dedup+lookup`, `lookup`, `dedup`, `none`).
    pub capability: String,
    /// Attempts started.
    pub attempts: i64,
    /// Attempts allowed.
    pub attempts_max: i64,
    /// Reconciliations started.
    pub reconciliations: i64,
    /// Reconciliations allowed.
    pub reconciliations_max: i64,
    /// How it was validated (`provider`, `reconciled`).
    pub source: Option<String>,
    /// The provider's reference for the effect, once proven.
    pub provider_ref: Option<String>,
    /// The provider's decline code.
    pub decline_code: Option<String>,
    /// Why the latest outcome is unknown.
    pub unknown_reason: Option<String>,
    /// When the next reconciliation is due.
    pub reconcile_after: Option<String>,
    /// When the key was first sent.
    pub first_sent_at: Option<String>,
    /// When the latest attempt was sent.
    pub last_sent_at: Option<String>,
    /// Whether a human must approve.
    pub approval_required: bool,
    /// Until when the current approval holds.
    pub approval_expires_at: Option<String>,
    /// Whether the effect is proven absent.
    pub absence_proven: bool,
    /// Escalation reason, or who cancelled / resolved it and why.
    pub note: Option<String>,
    /// Duplicate proposals answered from the stored outcome.
    pub duplicates_suppressed: i64,
    /// Global sequence of the intent's latest event.
    pub last_seq: i64,
}

/// One row of the `runs` projection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunRow {
    /// The run.
    pub run_id: String,
    /// The workflow's name.
    pub workflow: String,
    /// `running` until it finishes, then its `RunStatus::as_str`.
    pub status: String,
    /// Detail of its end.
    pub detail: Option<String>,
    /// When it started.
    pub started_at: String,
    /// Its absolute deadline.
    pub deadline_at: String,
    /// Money committed (reserved, held while unknown, or spent), minor units.
    pub cost_committed_minor: i64,
    /// Its money budget, when bounded.
    pub cost_minor_max: Option<i64>,
    /// Intents it reserved.
    pub intents: i64,
    /// Entries in its journal.
    pub journal_len: i64,
    /// The operator who asked it to stop (`keel run cancel`), while or since it was asked.
    pub cancel_requested_by: Option<String>,
    /// Why.
    pub cancel_reason: Option<String>,
    /// Global sequence of its latest event.
    pub last_seq: i64,
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Provider => "provider",
        Source::Reconciled => "reconciled",
    }
}

impl IntentRow {
    /// The row the projection holds for `intent`.
    pub fn from_intent(intent: &Intent) -> Self {
        let definition = &intent.definition;
        Self {
            key: definition.key.as_str().to_owned(),
            kind: definition.kind.as_str().to_owned(),
            tenant: definition.tenant.clone(),
            intent_id: definition.intent_id.clone(),
            order_id: definition.order_id.clone(),
            business_ref: definition.business_ref.clone(),
            status: intent.status.as_str().to_owned(),
            fingerprint: definition.fingerprint.clone(),
            amount_minor: definition.amount_minor,
            currency: definition.currency.clone(),
            run_id: intent.run_id.as_str().to_owned(),
            capability: intent.capability.tier().to_owned(),
            attempts: i64::from(intent.attempts),
            attempts_max: i64::from(intent.attempts_max),
            reconciliations: i64::from(intent.reconciliations),
            reconciliations_max: i64::from(intent.reconciliations_max),
            source: intent.source.map(|s| source_name(s).to_owned()),
            provider_ref: intent.evidence.as_ref().map(|e| e.provider_ref.clone()),
            decline_code: intent.decline_code.clone(),
            unknown_reason: intent.unknown_reason.map(|r| r.as_str().to_owned()),
            reconcile_after: intent.reconcile_after.map(format_time),
            first_sent_at: intent.first_sent_at.map(format_time),
            last_sent_at: intent.last_sent_at.map(format_time),
            approval_required: intent.approval_required,
            approval_expires_at: intent.approval.as_ref().map(|a| format_time(a.expires_at)),
            absence_proven: intent.absence_proven,
            note: intent.note.clone(),
            duplicates_suppressed: i64::from(intent.duplicates_suppressed),
            last_seq: to_i64(intent.last_seq),
        }
    }
}

impl RunRow {
    /// The row of `run`, whose money is summed from `intents` (the intents it reserved).
    pub fn from_run(run: &Run, intents: &[Intent]) -> Self {
        let committed = checked_sum(intents.iter().filter(|i| i.money_committed()).map(|i| i.definition.amount_minor))
            .expect("a run's amounts sum inside i64: Reserve refuses one that would not");
        Self {
            run_id: run.run_id.as_str().to_owned(),
            workflow: run.workflow.clone(),
            status: run.status.map_or("running", |s| s.as_str()).to_owned(),
            detail: run.detail.clone(),
            started_at: format_time(run.started_at),
            deadline_at: format_time(run.deadline_at),
            cost_committed_minor: committed,
            cost_minor_max: run.limits.cost_minor_max,
            intents: i64::try_from(intents.len()).expect("a run's intents fit in i64"),
            journal_len: i64::from(run.journal_len),
            cancel_requested_by: run.cancel_requested.as_ref().map(|c| c.by.clone()),
            cancel_reason: run.cancel_requested.as_ref().map(|c| c.reason.clone()),
            last_seq: to_i64(run.last_seq),
        }
    }
}
