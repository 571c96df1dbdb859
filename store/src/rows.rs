//! Entity rows: one `intents` row per intent and one `runs` row per run, each holding the
//! entity's whole folded state, plus the `orders` and `refs` maps a reservation reads.
//!
//! Owns the row layout of `store/FORMAT.md` ("Entity rows") and every query a decision's
//! [`engine::ledger::View`] needs, each one an indexed read whose cost is the size of what it
//! returns: [`intent_by_key`], [`run_by_id`], [`order_intent_ids`], [`reference_charge_ids`],
//! [`run_intent_ids`], [`in_flight_ids`], [`due_ids`], [`awake_run_ids`], [`sleeping_run_ids`]. The writer
//! layers its bounded cache over these; readers use them as they are.
//!
//! An intent row keeps its mutable state packed; its definition (immutable since its
//! reservation) is read back from the stream's first event rather than stored twice. A run
//! row keeps the whole `Run` but its id, which is its stream's name.

use crate::codec::{self, first_payload, micros, to_i64};
use crate::error::{Error, Result};
use crate::packed;
use engine::event::{IntentKey, RunId};
use engine::ledger::{Intent, IntentStatus, Run};
use engine::provider::EffectKind;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

/// The stored code of an intent status (`store/FORMAT.md`). Exhaustive, so a new status
/// does not compile until it has a code.
pub(crate) fn status_code(status: IntentStatus) -> i64 {
    match status {
        IntentStatus::Reserved => 1,
        IntentStatus::AwaitingApproval => 2,
        IntentStatus::Attempting => 3,
        IntentStatus::Validated => 4,
        IntentStatus::Declined => 5,
        IntentStatus::OutcomeUnknown => 6,
        IntentStatus::Reconciling => 7,
        IntentStatus::Escalated => 8,
        IntentStatus::Cancelled => 9,
        IntentStatus::Rejected => 10,
    }
}

/// The fields of an `Intent` that come from its definition (flattened into it), left out of
/// its packed state.
const DEFINITION_FIELDS: [&str; 10] = [
    "key",
    "kind",
    "tenant",
    "intent_id",
    "order_id",
    "business_ref",
    "fingerprint",
    "amount_minor",
    "currency",
    "payload",
];

/// When an intent's reconciliation falls due, as `intents.due_at` indexes it: only while
/// its outcome is unknown (what `Intent::reconcile_due` asks).
fn due_at(intent: &Intent) -> Option<i64> {
    (intent.status == IntentStatus::OutcomeUnknown).then_some(intent.reconcile_after.map(micros)).flatten()
}

/// The fields of an `Intent` fixed by its `IntentReserved` (read back from it), left out of
/// its packed state with its definition.
const RESERVATION_FIELDS: [&str; 5] =
    ["run_id", "capability", "attempts_max", "reconciliations_max", "approval_required"];

/// `value`'s fields but `left_out` and those that are `null` (an absent `Option` field
/// deserializes as `None`).
fn without(value: Value, left_out: &[&str]) -> Value {
    match value {
        Value::Object(map) => {
            Value::Object(map.into_iter().filter(|(k, v)| !v.is_null() && !left_out.contains(&k.as_str())).collect())
        }
        other => other,
    }
}

/// The packed state of an intent: everything its reservation does not say.
fn pack_intent(intent: &Intent) -> Vec<u8> {
    let value = serde_json::to_value(intent).expect("an intent serializes: plain fields");
    packed::encode(&without(without(value, &DEFINITION_FIELDS), &RESERVATION_FIELDS))
}

/// The packed state of a run: everything but its id.
fn pack_run(run: &Run) -> Vec<u8> {
    let value = serde_json::to_value(run).expect("a run serializes: plain fields");
    packed::encode(&without(value, &["run_id"]))
}

/// Writes (or rewrites) an intent's row. `run` is its run's stream id.
pub(crate) fn put_intent(conn: &Connection, stream: i64, run: i64, intent: &Intent) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO intents (stream, run, status, due_at, state) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (stream) DO UPDATE SET status = excluded.status, due_at = excluded.due_at, \
         state = excluded.state",
    )?
    .execute(params![stream, run, status_code(intent.status), due_at(intent), pack_intent(intent)])?;
    Ok(())
}

/// Writes the order and reference entries of a newly reserved intent. A charge's reference
/// is entered only when it differs from its order id: [`reference_charge_ids`] reads the
/// order map for the others.
pub(crate) fn put_intent_maps(conn: &Connection, stream: i64, intent: &Intent) -> Result<()> {
    let definition = &intent.definition;
    conn.prepare_cached("INSERT INTO orders (tenant, order_id, intent) VALUES (?1, ?2, ?3)")?.execute(params![
        definition.tenant,
        definition.order_id,
        stream
    ])?;
    if definition.kind == EffectKind::Charge && definition.business_ref != definition.order_id {
        conn.prepare_cached("INSERT INTO refs (tenant, business_ref, intent) VALUES (?1, ?2, ?3)")?
            .execute(params![definition.tenant, definition.business_ref, stream])?;
    }
    Ok(())
}

/// Writes (or rewrites) a run's row.
pub(crate) fn put_run(conn: &Connection, stream: i64, run: &Run) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO runs (stream, finished, state, wake_at) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (stream) DO UPDATE SET finished = excluded.finished, state = excluded.state, \
         wake_at = excluded.wake_at",
    )?
    .execute(params![stream, run.status.is_some(), pack_run(run), run.wake_at.map(wake_micros)])?;
    Ok(())
}

/// A timer's fire time as the `wake_at` column holds it: microseconds, rounded up
/// ([`engine::clock::micros_rounded_up`]).
fn wake_micros(fire_at: chrono::DateTime<chrono::Utc>) -> i64 {
    engine::clock::micros_rounded_up(fire_at)
}

/// Writes a run's row as version 3's migration lays it out, before version 8 added
/// `wake_at` (whose own migration then fills the column from the runs' streams).
pub(crate) fn put_run_v3(conn: &Connection, stream: i64, run: &Run) -> Result<()> {
    conn.prepare_cached("INSERT INTO runs (stream, finished, state) VALUES (?1, ?2, ?3)")?.execute(params![
        stream,
        run.status.is_some(),
        pack_run(run)
    ])?;
    Ok(())
}

/// An intent row as stored, with its stream's name.
pub(crate) struct IntentRecord {
    pub(crate) stream: i64,
    pub(crate) name: String,
    pub(crate) run: i64,
    pub(crate) status: i64,
    pub(crate) due_at: Option<i64>,
    pub(crate) state: Vec<u8>,
}

const INTENT_SELECT: &str = "SELECT i.stream, s.name, i.run, i.status, i.due_at, i.state FROM intents i \
     JOIN streams s ON s.id = i.stream";

impl IntentRecord {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            stream: row.get(0)?,
            name: row.get(1)?,
            run: row.get(2)?,
            status: row.get(3)?,
            due_at: row.get(4)?,
            state: row.get(5)?,
        })
    }

    /// The intent: its packed state and its definition, read from its reservation.
    pub(crate) fn decode(&self, conn: &Connection) -> Result<Intent> {
        let bad = |what: String| Error::corrupt(0, format!("intents row of {}: {what}", self.name));
        let mut state = match packed::decode(&self.state).map_err(|e| bad(format!("state does not unpack: {e}")))? {
            Value::Object(map) => map,
            _ => return Err(bad("state is not an object".to_owned())),
        };
        let (type_name, reservation) =
            first_payload(conn, self.stream, &self.name)?.ok_or_else(|| bad("no events".to_owned()))?;
        let Value::Object(mut reservation) = reservation else {
            return Err(bad(format!("its {type_name} payload is not an object")));
        };
        if type_name != "IntentReserved" {
            return Err(bad(format!("its stream starts with {type_name}")));
        }
        // The reservation's payload holds the definition (`intent`) and the reservation's
        // fields under the names the intent's state uses.
        if let Some(Value::Object(definition)) = reservation.remove("intent") {
            state.extend(definition);
        }
        for field in RESERVATION_FIELDS {
            if let Some(value) = reservation.remove(field) {
                state.insert(field.to_owned(), value);
            }
        }
        serde_json::from_value(Value::Object(state)).map_err(|e| bad(format!("state does not decode: {e}")))
    }

    /// Whether the indexed columns say what the state says: `verify` checks this.
    pub(crate) fn columns_match(&self, intent: &Intent, run: i64) -> Option<String> {
        let show = |v: Option<i64>| v.map_or_else(|| "NULL".to_owned(), |v| v.to_string());
        [
            ("run", Some(self.run), Some(run)),
            ("status", Some(self.status), Some(status_code(intent.status))),
            ("due_at", self.due_at, due_at(intent)),
        ]
        .into_iter()
        .find(|(_, found, expected)| found != expected)
        .map(|(column, found, expected)| {
            format!("column {column} is {} in the table, {} by its state", show(found), show(expected))
        })
    }
}

/// A run row as stored, with its stream's name.
pub(crate) struct RunRecord {
    pub(crate) stream: i64,
    pub(crate) name: String,
    pub(crate) finished: bool,
    pub(crate) state: Vec<u8>,
}

// Without `wake_at`: version 7's migration lists the runs before version 8 added it.
const RUN_SELECT: &str = "SELECT r.stream, s.name, r.finished, r.state FROM runs r JOIN streams s ON s.id = r.stream";

impl RunRecord {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self { stream: row.get(0)?, name: row.get(1)?, finished: row.get(2)?, state: row.get(3)? })
    }

    /// The run.
    pub(crate) fn decode(&self) -> Result<Run> {
        let bad = |what: String| Error::corrupt(0, format!("runs row of {}: {what}", self.name));
        let run_id = self.name.strip_prefix("run:").ok_or_else(|| bad("not a run stream".to_owned()))?;
        let mut state = match packed::decode(&self.state).map_err(|e| bad(format!("state does not unpack: {e}")))? {
            Value::Object(map) => map,
            _ => return Err(bad("state is not an object".to_owned())),
        };
        state.insert("run_id".to_owned(), Value::String(run_id.to_owned()));
        serde_json::from_value(Value::Object(state)).map_err(|e| bad(format!("state does not decode: {e}")))
    }

    /// Whether the indexed columns say what the state says.
    pub(crate) fn columns_match(&self, conn: &Connection, run: &Run) -> Result<Option<String>> {
        if self.finished != run.status.is_some() {
            let said = run.status.is_some();
            return Ok(Some(format!("column finished is {}, the state says {said}", self.finished)));
        }
        let column: Option<i64> = conn
            .prepare_cached("SELECT wake_at FROM runs WHERE stream = ?1")?
            .query_row([self.stream], |row| row.get(0))?;
        let wake_at = run.wake_at.map(wake_micros);
        Ok((column != wake_at).then(|| format!("column wake_at is {column:?}, the state says {wake_at:?} (µs)")))
    }
}

/// One intent row by its stream id.
pub(crate) fn intent_record(conn: &Connection, stream: i64) -> Result<Option<IntentRecord>> {
    Ok(conn
        .prepare_cached(&format!("{INTENT_SELECT} WHERE i.stream = ?1"))?
        .query_row([stream], IntentRecord::from_row)
        .optional()?)
}

/// One run row by its stream id.
pub(crate) fn run_record(conn: &Connection, stream: i64) -> Result<Option<RunRecord>> {
    Ok(conn
        .prepare_cached(&format!("{RUN_SELECT} WHERE r.stream = ?1"))?
        .query_row([stream], RunRecord::from_row)
        .optional()?)
}

/// One intent and its stream id, by key.
pub(crate) fn intent_by_key(conn: &Connection, key: &IntentKey) -> Result<Option<(i64, Intent)>> {
    let Some(stream) = codec::stream_id(conn, key.stream().as_str())? else {
        return Ok(None);
    };
    intent_record(conn, stream)?.map(|record| Ok((stream, record.decode(conn)?))).transpose()
}

/// One run and its stream id, by id.
pub(crate) fn run_by_id(conn: &Connection, run_id: &RunId) -> Result<Option<(i64, Run)>> {
    let Some(stream) = codec::stream_id(conn, run_id.stream().as_str())? else {
        return Ok(None);
    };
    run_record(conn, stream)?.map(|record| Ok((stream, record.decode()?))).transpose()
}

fn ids(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<i64>> {
    let mut statement = conn.prepare_cached(sql)?;
    let ids = statement.query_map(params, |row| row.get(0))?.collect::<rusqlite::Result<_>>()?;
    Ok(ids)
}

/// The intents of one order, in reservation order. Served by the `orders` primary key.
pub(crate) fn order_intent_ids(conn: &Connection, tenant: &str, order_id: &str) -> Result<Vec<i64>> {
    ids(
        conn,
        "SELECT intent FROM orders WHERE tenant = ?1 AND order_id = ?2 ORDER BY intent",
        params![tenant, order_id],
    )
}

/// The intents that may be charges under one business reference, in reservation order: those
/// entered under it in `refs`, and those whose order id is the reference (a charge whose
/// reference is its order id is entered there only). The caller keeps the charges whose
/// reference it is.
pub(crate) fn reference_charge_ids(conn: &Connection, tenant: &str, reference: &str) -> Result<Vec<i64>> {
    // Two primary-key range reads; merged here rather than by a `UNION`'s temporary b-tree.
    let mut all = ids(
        conn,
        "SELECT intent FROM refs WHERE tenant = ?1 AND business_ref = ?2 \
         UNION ALL SELECT intent FROM orders WHERE tenant = ?1 AND order_id = ?2",
        params![tenant, reference],
    )?;
    all.sort_unstable();
    all.dedup();
    Ok(all)
}

/// The intents a run reserved, in reservation order. Served by `intents_by_run`.
pub(crate) fn run_intent_ids(conn: &Connection, run: i64) -> Result<Vec<i64>> {
    ids(conn, "SELECT stream FROM intents WHERE run = ?1 ORDER BY stream", [run])
}

/// Intents with an attempt or a lookup in flight, in key order, at most `limit`. Served by
/// `intents_by_status`; the sort is over the in-flight ones only.
pub(crate) fn in_flight_ids(conn: &Connection, limit: usize) -> Result<Vec<i64>> {
    ids(
        conn,
        "SELECT i.stream FROM intents i JOIN streams s ON s.id = i.stream WHERE i.status IN (?1, ?2) \
         ORDER BY s.name LIMIT ?3",
        params![status_code(IntentStatus::Attempting), status_code(IntentStatus::Reconciling), to_i64(limit as u64)],
    )
}

/// Intents reserved (the next attempt may go, nobody is sending it), in key order, at most
/// `limit`. Served by `intents_by_status`; the sort is over the reserved ones only.
pub(crate) fn reserved_ids(conn: &Connection, limit: usize) -> Result<Vec<i64>> {
    ids(
        conn,
        "SELECT i.stream FROM intents i JOIN streams s ON s.id = i.stream WHERE i.status = ?1 \
         ORDER BY s.name LIMIT ?2",
        params![status_code(IntentStatus::Reserved), to_i64(limit as u64)],
    )
}

/// Intents whose reconciliation is due at `now` (µs), oldest due first, ties in key order, at
/// most `limit`. Served by `intents_due`.
pub(crate) fn due_ids(conn: &Connection, now: i64, limit: usize) -> Result<Vec<i64>> {
    ids(
        conn,
        "SELECT i.stream FROM intents i JOIN streams s ON s.id = i.stream WHERE i.due_at <= ?1 \
         ORDER BY i.due_at, s.name LIMIT ?2",
        params![now, to_i64(limit as u64)],
    )
}

/// Runs not finished that may go on at `now` (µs) — no timer (served by `runs_awake`), or
/// one that fired (served by `runs_sleeping`) — in id order, at most `limit`.
pub(crate) fn awake_run_ids(conn: &Connection, now: i64, limit: usize) -> Result<Vec<i64>> {
    let mut named: Vec<(String, i64)> = Vec::new();
    for sql in [
        "SELECT s.name, r.stream FROM runs r JOIN streams s ON s.id = r.stream \
         WHERE r.finished = 0 AND r.wake_at IS NULL ORDER BY s.name LIMIT ?2",
        "SELECT s.name, r.stream FROM runs r JOIN streams s ON s.id = r.stream \
         WHERE r.wake_at <= ?1 ORDER BY s.name LIMIT ?2",
    ] {
        let mut statement = conn.prepare_cached(sql)?;
        let rows = statement.query_map(params![now, to_i64(limit as u64)], |row| Ok((row.get(0)?, row.get(1)?)))?;
        named.extend(rows.collect::<rusqlite::Result<Vec<_>>>()?);
    }
    // The two sets are disjoint; the first `limit` of their union in id order is in the
    // first `limit` of each.
    named.sort();
    Ok(named.into_iter().take(limit).map(|(_, stream)| stream).collect())
}

/// Runs whose timer fires after `now` (µs), soonest first, at most `limit`. Served by
/// `runs_sleeping` (a finished run's `wake_at` is NULL).
pub(crate) fn sleeping_run_ids(conn: &Connection, now: i64, limit: usize) -> Result<Vec<i64>> {
    ids(
        conn,
        "SELECT r.stream FROM runs r JOIN streams s ON s.id = r.stream WHERE r.wake_at > ?1 \
         ORDER BY r.wake_at, s.name LIMIT ?2",
        params![now, to_i64(limit as u64)],
    )
}

/// Intents in `status` (every intent when `None`), in key order. Served by
/// `intents_by_status` for one status.
pub(crate) fn intents_listed(conn: &Connection, status: Option<IntentStatus>) -> Result<Vec<Intent>> {
    let mut out = Vec::new();
    let (sql, code) = match status {
        Some(status) => (format!("{INTENT_SELECT} WHERE i.status = ?1 ORDER BY s.name"), status_code(status)),
        None => (format!("{INTENT_SELECT} WHERE ?1 = ?1 ORDER BY s.name"), 0),
    };
    let mut statement = conn.prepare_cached(&sql)?;
    let records: Vec<IntentRecord> =
        statement.query_map([code], IntentRecord::from_row)?.collect::<rusqlite::Result<_>>()?;
    for record in records {
        out.push(record.decode(conn)?);
    }
    Ok(out)
}

/// The stream names of one tenant's intents: `[intent:charge:T:, intent:charge:T;)` and the
/// same for refunds (`;` is the character after `:`), as the four bounds of two ranges of the
/// `streams` name index.
pub(crate) fn tenant_ranges(tenant: &str) -> [String; 4] {
    let from = |kind: EffectKind| format!("intent:{}:{tenant}:", kind.as_str());
    let to = |kind: EffectKind| format!("intent:{}:{tenant};", kind.as_str());
    [from(EffectKind::Charge), to(EffectKind::Charge), from(EffectKind::Refund), to(EffectKind::Refund)]
}

/// One tenant's intents after `after` (a stream name; `""` for the first page), in key order,
/// at most `limit`, only those with `status` when given. Two range scans of the `streams`
/// name index (the tenant's charges, then its refunds): the cost is the page, not the log.
pub(crate) fn tenant_intents_page(
    conn: &Connection,
    tenant: &str,
    status: Option<IntentStatus>,
    after: &str,
    limit: usize,
) -> Result<Vec<Intent>> {
    let [charges_from, charges_to, refunds_from, refunds_to] = tenant_ranges(tenant);
    let sql = format!(
        "{INTENT_SELECT} WHERE ((s.name >= ?1 AND s.name < ?2) OR (s.name >= ?3 AND s.name < ?4)) \
         AND s.name > ?5 AND (?6 = 0 OR i.status = ?6) ORDER BY s.name LIMIT ?7"
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut statement = conn.prepare_cached(&sql)?;
    let records: Vec<IntentRecord> = statement
        .query_map(
            params![charges_from, charges_to, refunds_from, refunds_to, after, status.map_or(0, status_code), limit],
            IntentRecord::from_row,
        )?
        .collect::<rusqlite::Result<_>>()?;
    records.into_iter().map(|record| record.decode(conn)).collect()
}

/// How many of one tenant's intents are in each status (statuses with none are absent). The
/// same two ranges as [`tenant_intents_page`]: the cost is the tenant's intents' index
/// entries, never the log.
pub(crate) fn tenant_intent_counts(conn: &Connection, tenant: &str) -> Result<Vec<(IntentStatus, u64)>> {
    let [charges_from, charges_to, refunds_from, refunds_to] = tenant_ranges(tenant);
    let mut statement = conn.prepare_cached(
        "SELECT i.status, count(*) FROM intents i JOIN streams s ON s.id = i.stream \
         WHERE (s.name >= ?1 AND s.name < ?2) OR (s.name >= ?3 AND s.name < ?4) GROUP BY i.status",
    )?;
    let counts: Vec<(i64, i64)> = statement
        .query_map(params![charges_from, charges_to, refunds_from, refunds_to], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    counts
        .into_iter()
        .map(|(code, count)| {
            let status = engine::ledger::ALL_STATUSES
                .iter()
                .copied()
                .find(|status| status_code(*status) == code)
                .ok_or_else(|| Error::corrupt(0, format!("an intent row with status code {code}")))?;
            Ok((status, u64::try_from(count).unwrap_or(0)))
        })
        .collect()
}

/// One tenant's runs after `after` (a run stream name; `""` for the first page), in id
/// order, the first `limit` that `keep` keeps. A run is a tenant's when it reserved at least
/// one intent and every intent it reserved is that tenant's (a run that reserved none belongs
/// to no tenant). Read through the tenant's intents' name ranges and `intents_by_run`; rows
/// are decoded one at a time and the scan stops at `limit`, so the cost is the tenant's
/// intents' index entries plus the runs read, never the log.
pub(crate) fn tenant_runs_page(
    conn: &Connection,
    tenant: &str,
    after: &str,
    limit: usize,
    keep: &dyn Fn(&Run) -> bool,
) -> Result<Vec<(i64, Run)>> {
    let [charges_from, charges_to, refunds_from, refunds_to] = tenant_ranges(tenant);
    let tenants = |name: &str| format!("(({name} >= ?1 AND {name} < ?2) OR ({name} >= ?3 AND {name} < ?4))");
    let sql = format!(
        "{RUN_SELECT} WHERE s.name > ?5 \
         AND r.stream IN (SELECT i.run FROM intents i JOIN streams si ON si.id = i.stream WHERE {}) \
         AND NOT EXISTS (SELECT 1 FROM intents j JOIN streams sj ON sj.id = j.stream \
                         WHERE j.run = r.stream AND NOT {}) \
         ORDER BY s.name",
        tenants("si.name"),
        tenants("sj.name")
    );
    let mut statement = conn.prepare_cached(&sql)?;
    let mut rows =
        statement.query_map(params![charges_from, charges_to, refunds_from, refunds_to, after], RunRecord::from_row)?;
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(record) = rows.next().transpose()? else { break };
        let run = record.decode()?;
        if keep(&run) {
            out.push((record.stream, run));
        }
    }
    Ok(out)
}

/// Every run, in id order.
pub(crate) fn runs_listed(conn: &Connection) -> Result<Vec<(i64, Run)>> {
    let mut statement = conn.prepare_cached(&format!("{RUN_SELECT} ORDER BY s.name"))?;
    let records: Vec<RunRecord> = statement.query_map([], RunRecord::from_row)?.collect::<rusqlite::Result<_>>()?;
    records.into_iter().map(|record| Ok((record.stream, record.decode()?))).collect()
}

/// Every run, or only those not finished (served by `runs_unfinished`), in id order.
pub(crate) fn runs_where(conn: &Connection, unfinished_only: bool) -> Result<Vec<(i64, Run)>> {
    if !unfinished_only {
        return runs_listed(conn);
    }
    let mut statement = conn.prepare_cached(&format!("{RUN_SELECT} WHERE r.finished = 0 ORDER BY s.name"))?;
    let records: Vec<RunRecord> = statement.query_map([], RunRecord::from_row)?.collect::<rusqlite::Result<_>>()?;
    records.into_iter().map(|record| Ok((record.stream, record.decode()?))).collect()
}

/// The intent with stream id `stream`.
pub(crate) fn intent_at(conn: &Connection, stream: i64) -> Result<Option<Intent>> {
    intent_record(conn, stream)?.map(|record| record.decode(conn)).transpose()
}

/// The run with stream id `stream`.
pub(crate) fn run_at(conn: &Connection, stream: i64) -> Result<Option<Run>> {
    run_record(conn, stream)?.map(|record| record.decode()).transpose()
}
