//! The `intents` and `runs` projections: rows derived from the fold.
//!
//! A row is a function of the [`Ledger`] alone ([`IntentRow::from_intent`],
//! [`RunRow::from_run`]): the writer upserts the rows a batch touched in the batch's own
//! transaction, and `verify` rebuilds every row the same way and compares. Nothing else ever
//! writes these tables. Times are stored in the store's one text form (RFC 3339,
//! microseconds, `Z`).

use crate::codec::{format_time, to_i64};
use engine::event::Source;
use engine::ledger::{Intent, Ledger, Run, View as _};
use rusqlite::{Connection, params};
use serde::Serialize;
use std::sync::LazyLock;

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

/// The `intents` columns, in table order (and in [`IntentRow`] field order).
pub(crate) const INTENT_COLUMNS: [&str; 29] = [
    "key",
    "kind",
    "tenant",
    "intent_id",
    "order_id",
    "business_ref",
    "status",
    "fingerprint",
    "amount_minor",
    "currency",
    "run_id",
    "capability",
    "attempts",
    "attempts_max",
    "reconciliations",
    "reconciliations_max",
    "source",
    "provider_ref",
    "decline_code",
    "unknown_reason",
    "reconcile_after",
    "first_sent_at",
    "last_sent_at",
    "approval_required",
    "approval_expires_at",
    "absence_proven",
    "note",
    "duplicates_suppressed",
    "last_seq",
];

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
    /// Global sequence of its latest event.
    pub last_seq: i64,
}

/// The `runs` columns, in table order (and in [`RunRow`] field order).
pub(crate) const RUN_COLUMNS: [&str; 11] = [
    "run_id",
    "workflow",
    "status",
    "detail",
    "started_at",
    "deadline_at",
    "cost_committed_minor",
    "cost_minor_max",
    "intents",
    "journal_len",
    "last_seq",
];

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

    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            key: row.get(0)?,
            kind: row.get(1)?,
            tenant: row.get(2)?,
            intent_id: row.get(3)?,
            order_id: row.get(4)?,
            business_ref: row.get(5)?,
            status: row.get(6)?,
            fingerprint: row.get(7)?,
            amount_minor: row.get(8)?,
            currency: row.get(9)?,
            run_id: row.get(10)?,
            capability: row.get(11)?,
            attempts: row.get(12)?,
            attempts_max: row.get(13)?,
            reconciliations: row.get(14)?,
            reconciliations_max: row.get(15)?,
            source: row.get(16)?,
            provider_ref: row.get(17)?,
            decline_code: row.get(18)?,
            unknown_reason: row.get(19)?,
            reconcile_after: row.get(20)?,
            first_sent_at: row.get(21)?,
            last_sent_at: row.get(22)?,
            approval_required: row.get(23)?,
            approval_expires_at: row.get(24)?,
            absence_proven: row.get(25)?,
            note: row.get(26)?,
            duplicates_suppressed: row.get(27)?,
            last_seq: row.get(28)?,
        })
    }

    pub(crate) fn upsert(&self, conn: &Connection) -> rusqlite::Result<()> {
        static SQL: LazyLock<String> = LazyLock::new(|| upsert_sql("intents", &INTENT_COLUMNS));
        conn.prepare_cached(&SQL)?.execute(params![
            self.key,
            self.kind,
            self.tenant,
            self.intent_id,
            self.order_id,
            self.business_ref,
            self.status,
            self.fingerprint,
            self.amount_minor,
            self.currency,
            self.run_id,
            self.capability,
            self.attempts,
            self.attempts_max,
            self.reconciliations,
            self.reconciliations_max,
            self.source,
            self.provider_ref,
            self.decline_code,
            self.unknown_reason,
            self.reconcile_after,
            self.first_sent_at,
            self.last_sent_at,
            self.approval_required,
            self.approval_expires_at,
            self.absence_proven,
            self.note,
            self.duplicates_suppressed,
            self.last_seq,
        ])?;
        Ok(())
    }
}

impl RunRow {
    /// The row the projection holds for `run`, whose money is summed from `ledger`.
    pub fn from_run(run: &Run, ledger: &Ledger) -> Self {
        Self {
            run_id: run.run_id.as_str().to_owned(),
            workflow: run.workflow.clone(),
            status: run.status.map_or("running", |s| s.as_str()).to_owned(),
            detail: run.detail.clone(),
            started_at: format_time(run.started_at),
            deadline_at: format_time(run.deadline_at),
            cost_committed_minor: ledger.run_cost_committed_minor(&run.run_id),
            cost_minor_max: run.limits.cost_minor_max,
            intents: i64::try_from(ledger.run_intents(&run.run_id).len()).expect("a run's intents fit in i64"),
            journal_len: i64::from(run.journal_len),
            last_seq: to_i64(run.last_seq),
        }
    }

    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            run_id: row.get(0)?,
            workflow: row.get(1)?,
            status: row.get(2)?,
            detail: row.get(3)?,
            started_at: row.get(4)?,
            deadline_at: row.get(5)?,
            cost_committed_minor: row.get(6)?,
            cost_minor_max: row.get(7)?,
            intents: row.get(8)?,
            journal_len: row.get(9)?,
            last_seq: row.get(10)?,
        })
    }

    pub(crate) fn upsert(&self, conn: &Connection) -> rusqlite::Result<()> {
        static SQL: LazyLock<String> = LazyLock::new(|| upsert_sql("runs", &RUN_COLUMNS));
        conn.prepare_cached(&SQL)?.execute(params![
            self.run_id,
            self.workflow,
            self.status,
            self.detail,
            self.started_at,
            self.deadline_at,
            self.cost_committed_minor,
            self.cost_minor_max,
            self.intents,
            self.journal_len,
            self.last_seq,
        ])?;
        Ok(())
    }
}

/// `INSERT … ON CONFLICT (first column) DO UPDATE SET every other column`: an update in
/// place, so the row keeps its b-tree slot (unlike `INSERT OR REPLACE`, a delete + insert).
fn upsert_sql(table: &str, columns: &[&str]) -> String {
    let names = columns.join(", ");
    let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
    let updates: Vec<String> = columns[1..].iter().map(|c| format!("{c} = excluded.{c}")).collect();
    format!(
        "INSERT INTO {table} ({names}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}",
        placeholders.join(", "),
        columns[0],
        updates.join(", ")
    )
}

/// `SELECT every column FROM table`, for [`IntentRow::from_row`] / [`RunRow::from_row`].
pub(crate) fn select_sql(table: &str, columns: &[&str]) -> String {
    format!("SELECT {} FROM {table}", columns.join(", "))
}

/// The first column where two rows differ, in column order, with both values as text.
pub(crate) fn first_difference<T: Serialize>(
    columns: &[&'static str],
    table: &T,
    replay: &T,
) -> Option<(&'static str, String, String)> {
    let table = serde_json::to_value(table).expect("rows serialize: plain fields");
    let replay = serde_json::to_value(replay).expect("rows serialize: plain fields");
    columns.iter().find_map(|&column| {
        let (a, b) = (&table[column], &replay[column]);
        (a != b).then(|| (column, show(a), show(b)))
    })
}

fn show(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Upserts the rows of `intents` and `runs` (and of the run of every intent) from `ledger`.
///
/// Runs are written first: an intent row then always finds its run, so the foreign key is
/// checked by one primary-key lookup and no violation is ever outstanding (an outstanding
/// one would make SQLite scan `intents` for every run inserted after it).
pub(crate) fn write_rows<'a>(
    conn: &Connection,
    ledger: &'a Ledger,
    intents: impl IntoIterator<Item = &'a engine::event::IntentKey>,
    runs: impl IntoIterator<Item = &'a engine::event::RunId>,
) -> rusqlite::Result<()> {
    let intents: Vec<&Intent> = intents
        .into_iter()
        .map(|key| ledger.intent(key).expect("a touched intent is in the ledger: its event was just folded"))
        .collect();
    // The run's committed money follows its intents' statuses.
    let mut run_ids: Vec<&engine::event::RunId> = runs.into_iter().chain(intents.iter().map(|i| &i.run_id)).collect();
    run_ids.sort_unstable();
    run_ids.dedup();
    for run_id in run_ids {
        let run = ledger.run(run_id).expect("a touched run is in the ledger: its event was just folded");
        RunRow::from_run(run, ledger).upsert(conn)?;
    }
    for intent in intents {
        IntentRow::from_intent(intent).upsert(conn)?;
    }
    Ok(())
}
