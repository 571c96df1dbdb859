//! The metrics projection (schema version 7; `refused` and `tool` since version 9,
//! `cost_unknown` since version 10) and the figures `keel metrics` reads from it.
//!
//! Owns the tables `intent_facts` and `run_facts`: one narrow row per intent and per run,
//! derived from the entity's state and written by the writer in the transaction of every
//! event that changes the entity (so they are never behind the log), and the aggregate
//! queries over them. Seed 004's figures are computed here from these integer columns and
//! their indexes, never from a scan of the events: their cost is one pass over narrow rows.
//!
//! It must never decide anything nor be read by a decision: it is derived, for operators.

use crate::codec::micros;
use crate::error::Result;
use crate::rows::status_code;
use chrono::{DateTime, Utc};
use engine::event::{RunStatus, Source};
use engine::ledger::{Intent, IntentStatus, Run};
use engine::provider::EffectKind;
use rusqlite::{Connection, params};
use std::collections::BTreeMap;

/// How a validated intent's effect is proven, as `intent_facts.evidence` stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EvidenceCode {
    /// Not validated.
    None = 0,
    /// The provider's receipt for the attempt.
    Receipt = 1,
    /// A lookup found it (a reconciliation, or an operator's resolution the lookup confirmed).
    Lookup = 2,
    /// An operator's word the provider did not confirm.
    OperatorWord = 3,
}

fn evidence_code(intent: &Intent) -> EvidenceCode {
    match (intent.status, intent.source) {
        (IntentStatus::Validated, Some(Source::Provider)) => EvidenceCode::Receipt,
        (IntentStatus::Validated, Some(Source::Reconciled)) if intent.operator_word => EvidenceCode::OperatorWord,
        (IntentStatus::Validated, Some(Source::Reconciled)) => EvidenceCode::Lookup,
        _ => EvidenceCode::None,
    }
}

fn kind_code(kind: EffectKind) -> i64 {
    match kind {
        EffectKind::Charge => 1,
        EffectKind::Refund => 2,
    }
}

/// Whether the intent's outcome is definitive: its effect proven, or proven absent.
fn definitive(status: IntentStatus) -> bool {
    matches!(
        status,
        IntentStatus::Validated | IntentStatus::Declined | IntentStatus::Cancelled | IntentStatus::Rejected
    )
}

/// When the intent's unknown outcome becomes ambiguous: the end of its normal reconciliation
/// window (the request certainly over, the provider's consistency window passed, so a lookup
/// could have settled it). `None` unless its outcome is unknown.
fn ambiguous_at(intent: &Intent, now: DateTime<Utc>) -> Option<i64> {
    matches!(intent.status, IntentStatus::OutcomeUnknown | IntentStatus::Reconciling | IntentStatus::Escalated)
        .then(|| micros(intent.resend_window_end().unwrap_or(now)))
}

/// Writes the intent's metrics row at `now`, the instant of the events that changed it: its
/// reservation time is kept from the first write, its definitive time from the first write
/// that saw it definitive.
pub(crate) fn put_intent_facts(
    conn: &Connection,
    stream: i64,
    run: i64,
    intent: &Intent,
    now: DateTime<Utc>,
) -> Result<()> {
    let at = micros(now);
    conn.prepare_cached(
        "INSERT INTO intent_facts (intent, run, kind, status, evidence, dedups, reserved_at, settled_at, ambiguous_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (intent) DO UPDATE SET status = excluded.status, evidence = excluded.evidence, \
         dedups = excluded.dedups, settled_at = coalesce(intent_facts.settled_at, excluded.settled_at), \
         ambiguous_at = excluded.ambiguous_at",
    )?
    .execute(params![
        stream,
        run,
        kind_code(intent.definition.kind),
        status_code(intent.status),
        evidence_code(intent) as i64,
        intent.duplicates_suppressed,
        at,
        definitive(intent.status).then_some(at),
        ambiguous_at(intent, now),
    ])?;
    // Version 8's columns, written apart and only for an intent that has one: the version-7
    // back-fill runs this function on a version-7 table, over logs that hold neither a
    // `ResendRefused` nor a tool (both are newer than the table), so it never names them.
    if intent.resends_refused > 0 || intent.definition.tool.is_some() {
        conn.prepare_cached("UPDATE intent_facts SET refused = ?2, tool = ?3 WHERE intent = ?1")?.execute(params![
            stream,
            intent.resends_refused,
            intent.definition.tool
        ])?;
    }
    Ok(())
}

/// Writes the run's metrics row: its versions, how it ended, what it spent on models.
pub(crate) fn put_run_facts(conn: &Connection, stream: i64, run: &Run) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO run_facts (run, started_at, workflow, status, cost_minor, release, prompt, policy, model) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (run) DO UPDATE SET status = excluded.status, cost_minor = excluded.cost_minor",
    )?
    .execute(params![
        stream,
        micros(run.started_at),
        run.workflow,
        run.status.map(|s| s.as_str()),
        run.cost_minor.unwrap_or(0),
        run.versions.release,
        run.versions.prompt,
        run.versions.policy,
        run.versions.model,
    ])?;
    Ok(())
}

/// Whether `run`'s model cost is unknown: a finished agent run that recorded none.
fn cost_unknown(run: &Run) -> bool {
    run.is_agent() && run.status.is_some() && run.cost_minor.is_none()
}

/// Version 10's column, written apart and only for a run whose cost is unknown (it is set
/// once, when the run finishes, and never goes back): the version-7 back-fill writes a
/// version-7 table through [`put_run_facts`], which never names it.
pub(crate) fn put_run_cost_unknown(conn: &Connection, stream: i64, run: &Run) -> Result<()> {
    if cost_unknown(run) {
        conn.prepare_cached("UPDATE run_facts SET cost_unknown = 1 WHERE run = ?1")?.execute([stream])?;
    }
    Ok(())
}

/// Version 10's Rust half: marks the finished agent runs already in the file that recorded
/// no cost.
pub(crate) fn backfill_cost_unknown(conn: &Connection) -> Result<()> {
    for (stream, run) in crate::rows::runs_listed(conn)? {
        put_run_cost_unknown(conn, stream, &run)?;
    }
    Ok(())
}

/// Version 6's Rust half: a row for every intent and run already in the file. An intent's
/// reservation time is its stream's first event's, and a definitive intent's settled time
/// its latest event's (a later deduplication of a validated intent moves it: the one
/// approximation of the back-fill, which new rows do not make).
pub(crate) fn backfill(conn: &Connection) -> Result<()> {
    for (stream, run) in crate::rows::runs_listed(conn)? {
        put_run_facts(conn, stream, &run)?;
    }
    let mut ids = conn.prepare("SELECT stream, run FROM intents ORDER BY stream")?;
    let ids: Vec<(i64, i64)> =
        ids.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
    for (stream, run) in ids {
        let Some(intent) = crate::rows::intent_at(conn, stream)? else { continue };
        let first = event_at(conn, "SELECT at FROM events WHERE stream = ?1 ORDER BY stream_seq LIMIT 1", stream)?;
        let latest =
            event_at(conn, "SELECT at FROM events WHERE seq = ?1", i64::try_from(intent.last_seq).unwrap_or(i64::MAX))?;
        let (Some(first), Some(latest)) = (first, latest) else { continue };
        put_intent_facts(conn, stream, run, &intent, first)?;
        if definitive(intent.status) || ambiguous_at(&intent, latest).is_some() {
            conn.execute(
                "UPDATE intent_facts SET settled_at = ?2, ambiguous_at = ?3 WHERE intent = ?1",
                params![stream, definitive(intent.status).then_some(micros(latest)), ambiguous_at(&intent, latest)],
            )?;
        }
    }
    Ok(())
}

fn event_at(conn: &Connection, sql: &str, key: i64) -> Result<Option<DateTime<Utc>>> {
    use rusqlite::OptionalExtension;
    let at: Option<i64> = conn.query_row(sql, [key], |row| row.get(0)).optional()?;
    Ok(at.and_then(DateTime::from_timestamp_micros))
}

/// What the figures are segmented by (`keel metrics --by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    /// The intent's operation (`charge`, `refund`).
    Operation,
    /// The agent tool whose call proposed it (`refund`); a workflow's own intent by its
    /// operation, the tool a workflow calls (as its `intent` span's `tool.name` says).
    Tool,
    /// The run's `model`.
    Model,
    /// The run's `prompt.version`.
    Prompt,
    /// The run's `policy.version`.
    Policy,
    /// The run's `release.version`.
    Release,
}

impl Dimension {
    /// The SQL expression of the segment, over `intent_facts i` and `run_facts r`.
    fn column(self) -> &'static str {
        match self {
            Self::Operation => "CASE i.kind WHEN 1 THEN 'charge' WHEN 2 THEN 'refund' END",
            Self::Tool => "coalesce(i.tool, CASE i.kind WHEN 1 THEN 'charge' WHEN 2 THEN 'refund' END)",
            Self::Model => "r.model",
            Self::Prompt => "r.prompt",
            Self::Policy => "r.policy",
            Self::Release => "r.release",
        }
    }

    /// The same over `run_facts r` alone: a run's operation and tool are those of its first
    /// intent (none for a run that reserved none).
    fn run_column(self) -> &'static str {
        match self {
            Self::Operation => {
                "(SELECT CASE i.kind WHEN 1 THEN 'charge' WHEN 2 THEN 'refund' END FROM intent_facts i \
                 WHERE i.run = r.run ORDER BY i.intent LIMIT 1)"
            }
            Self::Tool => {
                "(SELECT coalesce(i.tool, CASE i.kind WHEN 1 THEN 'charge' WHEN 2 THEN 'refund' END) \
                 FROM intent_facts i WHERE i.run = r.run ORDER BY i.intent LIMIT 1)"
            }
            other => other.column(),
        }
    }
}

/// The figures of one segment (or of the whole log when not segmented).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Segment {
    /// The segment's value; `None` when unsegmented, or when the run records none.
    pub value: Option<String>,
    /// Intents reserved in the window.
    pub intents: u64,
    /// Of them, validated.
    pub validated: u64,
    /// Validated with a provider receipt or a lookup as evidence.
    pub verified: u64,
    /// Unknown past their normal reconciliation window (escalated ones included).
    pub ambiguous: u64,
    /// Proposals of a validated intent answered from the log (`IntentDeduplicated`).
    pub deduplicated: u64,
    /// Proposals by another run while no new attempt could come of them (`ResendRefused`).
    pub refused_resends: u64,
    /// Validated by a lookup after an unknown outcome: a resend the reconciliation prevented.
    pub reconciled_found: u64,
    /// Runs started in the window.
    pub runs: u64,
    /// What those runs spent on models, in minor units, over the runs whose cost is known.
    pub cost_minor: i64,
    /// Of those runs, the ones whose model cost is unknown (an answer without a price): not
    /// in `cost_minor`.
    pub cost_unknown_runs: u64,
    /// Runs that ended otherwise than completed, by their status (budget stops and every
    /// other controlled stop).
    pub stops: BTreeMap<&'static str, u64>,
    /// Milliseconds from reservation to a definitive outcome, ascending.
    pub settle_ms: Vec<i64>,
    /// When the segment's first run in the window started: the order in which a version
    /// (release, policy, prompt, model) came after another.
    pub first_run_at: Option<DateTime<Utc>>,
}

impl Segment {
    /// Validated intents whose evidence is a receipt or a lookup, over validated intents.
    pub fn verification_rate(&self) -> Option<f64> {
        ratio(self.verified, self.validated)
    }

    /// Ambiguous intents over intents.
    pub fn ambiguous_rate(&self) -> Option<f64> {
        ratio(self.ambiguous, self.intents)
    }

    /// Runs stopped by a budget (the statuses of [`BUDGET_STOPS`]).
    pub fn budget_stopped(&self) -> u64 {
        BUDGET_STOPS.iter().map(|status| self.stops.get(status.as_str()).copied().unwrap_or(0)).sum()
    }

    /// Repeated effects the log prevented: deduplications, refused resends and
    /// reconciliations that found the effect.
    pub fn retries_prevented(&self) -> u64 {
        self.deduplicated + self.refused_resends + self.reconciled_found
    }

    /// Model cost over validated intents (minor units; tools and reconciliations cost
    /// nothing Keel can count). None when some run's cost is unknown: an average over an
    /// unknown is unknown.
    pub fn cost_per_validated(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss, reason = "costs and counts far below 2^53")]
        (self.validated > 0 && self.cost_unknown_runs == 0).then(|| self.cost_minor as f64 / self.validated as f64)
    }

    /// The `q`-quantile (0 < q ≤ 1) of the time to a definitive outcome, nearest rank.
    pub fn settle_quantile_ms(&self, q: f64) -> Option<i64> {
        if self.settle_ms.is_empty() {
            return None;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank within the list's length"
        )]
        let rank = ((q * self.settle_ms.len() as f64).ceil() as usize).clamp(1, self.settle_ms.len());
        Some(self.settle_ms[rank - 1])
    }
}

/// `part / whole`, `None` over nothing.
pub fn ratio(part: u64, whole: u64) -> Option<f64> {
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The run statuses that are a budget's stop.
pub const BUDGET_STOPS: [RunStatus; 9] = [
    RunStatus::RepeatedCall,
    RunStatus::ToolBudget,
    RunStatus::ModelBudget,
    RunStatus::TokenBudget,
    RunStatus::CostBudget,
    RunStatus::SchemaBudget,
    RunStatus::DeadlineExceeded,
    RunStatus::NoProgress,
    RunStatus::DelegationBudget,
];

/// Seed 004's figures over the intents reserved and runs started at or after `since`, at
/// `now`, by segment (one unsegmented row when `by` is `None`), in segment order; only one
/// tenant's intents and runs when `tenant` is given (a run is a tenant's as
/// `rows::tenant_runs_page` says: it reserved intents, all of that tenant).
pub(crate) fn figures(
    conn: &Connection,
    since: Option<DateTime<Utc>>,
    by: Option<Dimension>,
    tenant: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<Segment>> {
    let since = since.map_or(i64::MIN, micros);
    let key = by.map_or("NULL", Dimension::column);
    // Every query takes the same parameters: `?1` since, `?2` now, `?3` the tenant (NULL
    // unscoped), `?4`..`?7` its intents' stream-name ranges (unused numbers bind nothing).
    let [a, b, c, d] = tenant.map(crate::rows::tenant_ranges).unwrap_or_default();
    let within = |name: &str| format!("(({name} >= ?4 AND {name} < ?5) OR ({name} >= ?6 AND {name} < ?7))");
    let intent_scope = format!("(?3 IS NULL OR i.intent IN (SELECT id FROM streams s WHERE {}))", within("s.name"));
    let run_scope = format!(
        "(?3 IS NULL OR (r.run IN (SELECT i.run FROM intents i JOIN streams si ON si.id = i.stream WHERE {}) \
         AND NOT EXISTS (SELECT 1 FROM intents j JOIN streams sj ON sj.id = j.stream \
         WHERE j.run = r.run AND NOT {})))",
        within("si.name"),
        within("sj.name")
    );
    let bound = params![since, micros(now), tenant, a, b, c, d];
    let mut segments: BTreeMap<Option<String>, Segment> = BTreeMap::new();
    let intents = format!(
        "SELECT {key}, count(*), sum(i.status = 4), sum(i.status = 4 AND i.evidence IN (1, 2)), \
         sum(i.ambiguous_at IS NOT NULL AND (i.status = 8 OR i.ambiguous_at <= ?2)), sum(i.dedups), \
         sum(i.status = 4 AND i.evidence = 2), sum(i.refused) \
         FROM intent_facts i JOIN run_facts r ON r.run = i.run WHERE i.reserved_at >= ?1 AND {intent_scope} \
         GROUP BY 1"
    );
    let mut statement = conn.prepare(&intents)?;
    let mut rows = statement.query(bound)?;
    while let Some(row) = rows.next()? {
        let value: Option<String> = row.get(0)?;
        let segment = segments.entry(value.clone()).or_insert_with(|| Segment { value, ..Segment::default() });
        segment.intents = row.get(1)?;
        segment.validated = row.get(2)?;
        segment.verified = row.get(3)?;
        segment.ambiguous = row.get(4)?;
        segment.deduplicated = row.get(5)?;
        segment.reconciled_found = row.get(6)?;
        segment.refused_resends = row.get(7)?;
    }
    let settle = format!(
        "SELECT {key}, (i.settled_at - i.reserved_at) / 1000 FROM intent_facts i JOIN run_facts r ON r.run = i.run \
         WHERE i.reserved_at >= ?1 AND i.settled_at IS NOT NULL AND {intent_scope}"
    );
    let mut statement = conn.prepare(&settle)?;
    let mut rows = statement.query(bound)?;
    while let Some(row) = rows.next()? {
        let value: Option<String> = row.get(0)?;
        let segment = segments.entry(value.clone()).or_insert_with(|| Segment { value, ..Segment::default() });
        segment.settle_ms.push(row.get(1)?);
    }
    let run_key = by.map_or("NULL", Dimension::run_column);
    let runs = format!(
        "SELECT {run_key}, r.status, count(*), sum(r.cost_minor), sum(r.cost_unknown), min(r.started_at) \
         FROM run_facts r WHERE r.started_at >= ?1 AND {run_scope} GROUP BY 1, 2"
    );
    let mut statement = conn.prepare(&runs)?;
    let mut rows = statement.query(bound)?;
    while let Some(row) = rows.next()? {
        let value: Option<String> = row.get(0)?;
        let status: Option<String> = row.get(1)?;
        let count: u64 = row.get(2)?;
        let segment = segments.entry(value.clone()).or_insert_with(|| Segment { value, ..Segment::default() });
        segment.runs += count;
        segment.cost_minor = segment.cost_minor.saturating_add(row.get(3)?);
        segment.cost_unknown_runs += row.get::<_, u64>(4)?;
        let first = row.get::<_, Option<i64>>(5)?.and_then(DateTime::from_timestamp_micros);
        segment.first_run_at = segment.first_run_at.into_iter().chain(first).min();
        if let Some(stop) = status.as_deref().and_then(RunStatus::parse).filter(|s| *s != RunStatus::Completed) {
            *segment.stops.entry(stop.as_str()).or_default() += count;
        }
    }
    let mut segments: Vec<Segment> = segments.into_values().collect();
    for segment in &mut segments {
        segment.settle_ms.sort_unstable();
    }
    if segments.is_empty() && by.is_none() {
        segments.push(Segment::default());
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::Segment;

    #[test]
    fn no_cost_per_validated_intent_is_computed_over_a_run_of_unknown_cost() {
        let known = Segment { validated: 4, cost_minor: 10, ..Segment::default() };
        assert_eq!(known.cost_per_validated(), Some(2.5));
        let unknown = Segment { cost_unknown_runs: 1, ..known };
        assert_eq!(unknown.cost_per_validated(), None, "10 is the known part only: no average of it");
    }
}
