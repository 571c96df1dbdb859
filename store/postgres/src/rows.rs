//! The rows: events as stored and read back, and the entity rows (`intents`, `runs`).
//!
//! Owns every SQL statement that reads or writes `events`, `intents` and `runs`, the row
//! layout of `store/FORMAT.md` ("PostgreSQL"), and the decoding of a row back into its typed
//! value (an event checked against its own hash, an entity from its serde JSON). Nothing here
//! locks: the callers (`crate::tx`) take the entity's lock first.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use engine::append::Sealed;
use engine::event::{Cause, Event, StoredEvent, StreamId, chain_hash};
use engine::ledger::{Intent, IntentStatus, Run};
use postgres::GenericClient;
use postgres::Row;

/// The `SELECT` list of an event, matching [`decode_event`].
pub(crate) const EVENT_COLUMNS: &str = "seq, stream, stream_seq, at, type, cause, payload, prev_hash, hash";

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).expect("sequences and lengths stay below 2^63: PostgreSQL's bigint sequence ends there")
}

fn to_u64(n: i64, seq: u64, what: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| Error::corrupt(seq, format!("{what} {n} is negative")))
}

/// Inserts one sealed event.
pub(crate) fn insert_event(client: &mut impl GenericClient, sealed: &Sealed) -> Result<()> {
    let e = &sealed.stored;
    client.execute(
        "INSERT INTO events (seq, stream, stream_seq, at, type, cause, payload, prev_hash, hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &to_i64(e.seq),
            &e.stream.as_str(),
            &to_i64(e.stream_seq),
            &e.at,
            &e.event.type_name(),
            &sealed.cause,
            &sealed.payload,
            &e.prev_hash,
            &e.hash,
        ],
    )?;
    Ok(())
}

/// Inserts sealed events in one statement (arrays unnested), as [`insert_event`] would one by
/// one: what an import's batch writes.
pub(crate) fn insert_events(client: &mut impl GenericClient, sealed: &[Sealed]) -> Result<()> {
    let column = |f: fn(&Sealed) -> String| sealed.iter().map(f).collect::<Vec<String>>();
    let seqs: Vec<i64> = sealed.iter().map(|s| to_i64(s.stored.seq)).collect();
    let stream_seqs: Vec<i64> = sealed.iter().map(|s| to_i64(s.stored.stream_seq)).collect();
    let ats: Vec<DateTime<Utc>> = sealed.iter().map(|s| s.stored.at).collect();
    client.execute(
        "INSERT INTO events (seq, stream, stream_seq, at, type, cause, payload, prev_hash, hash) \
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::text[])",
        &[
            &seqs,
            &column(|s| s.stored.stream.as_str().to_owned()),
            &stream_seqs,
            &ats,
            &column(|s| s.stored.event.type_name().to_owned()),
            &column(|s| s.cause.clone()),
            &column(|s| s.payload.clone()),
            &column(|s| s.stored.prev_hash.clone()),
            &column(|s| s.stored.hash.clone()),
        ],
    )?;
    Ok(())
}

/// One event row decoded; `Err` names what does not decode. The hash is not checked here:
/// see [`check_hash`].
pub(crate) fn decode_event(row: &Row) -> Result<StoredEvent> {
    let seq = to_u64(row.get(0), 0, "seq")?;
    let stream: String = row.get(1);
    let stream_seq = to_u64(row.get(2), seq, "stream_seq")?;
    let at: DateTime<Utc> = row.get(3);
    let type_name: String = row.get(4);
    let cause: String = row.get(5);
    let payload: String = row.get(6);
    let cause: Cause =
        serde_json::from_str(&cause).map_err(|e| Error::corrupt(seq, format!("cause does not decode: {e}")))?;
    let payload: serde_json::Value =
        serde_json::from_str(&payload).map_err(|e| Error::corrupt(seq, format!("payload is not JSON: {e}")))?;
    let event = Event::from_stored(&type_name, &payload)
        .map_err(|e| Error::corrupt(seq, format!("{type_name} payload does not decode: {e}")))?;
    Ok(StoredEvent {
        seq,
        stream: StreamId::from_stored(stream),
        stream_seq,
        at,
        cause,
        event,
        prev_hash: row.get(7),
        hash: row.get(8),
    })
}

/// Whether the event's stored hash is the hash of what it holds.
pub(crate) fn check_hash(stored: &StoredEvent) -> Result<()> {
    let e = stored;
    let computed = chain_hash(&e.prev_hash, e.seq, &e.stream, e.stream_seq, e.at, &e.cause, &e.event);
    if computed != e.hash {
        return Err(Error::corrupt(e.seq, format!("hash mismatch (stored {}, computed {computed})", e.hash)));
    }
    Ok(())
}

/// One stream's events in stream order, each decoded and hash-checked.
pub(crate) fn stream_events(client: &mut impl GenericClient, stream: &StreamId) -> Result<Vec<StoredEvent>> {
    let rows = client.query(
        &format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream = $1 ORDER BY stream_seq"),
        &[&stream.as_str()],
    )?;
    rows.iter()
        .map(|row| {
            let stored = decode_event(row)?;
            check_hash(&stored)?;
            Ok(stored)
        })
        .collect()
}

/// How many events `stream` holds (its last `stream_seq`).
pub(crate) fn stream_length(client: &mut impl GenericClient, stream: &StreamId) -> Result<u64> {
    let row =
        client.query_one("SELECT coalesce(max(stream_seq), 0) FROM events WHERE stream = $1", &[&stream.as_str()])?;
    to_u64(row.get(0), 0, "stream length")
}

/// The hash and global sequence of `stream`'s event at `stream_seq`.
pub(crate) fn stream_event_at(
    client: &mut impl GenericClient,
    stream: &StreamId,
    stream_seq: u64,
) -> Result<Option<(String, u64)>> {
    let row = client.query_opt(
        "SELECT hash, seq FROM events WHERE stream = $1 AND stream_seq = $2",
        &[&stream.as_str(), &to_i64(stream_seq)],
    )?;
    row.map(|row| Ok((row.get(0), to_u64(row.get(1), 0, "seq")?))).transpose()
}

/// The next global sequence.
pub(crate) fn next_seq(client: &mut impl GenericClient) -> Result<u64> {
    let row = client.query_one("SELECT nextval('events_seq')", &[])?;
    to_u64(row.get(0), 0, "nextval")
}

/// An entity row as read: its state's JSON (kept to tell whether it changed) and the length
/// of its stream that state folds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntityRow {
    pub(crate) stream: StreamId,
    pub(crate) state: String,
    pub(crate) stream_len: u64,
}

impl EntityRow {
    fn from_row(row: &Row, stream: StreamId) -> Result<Self> {
        Ok(Self { stream, state: row.get("state"), stream_len: to_u64(row.get("stream_len"), 0, "stream_len")? })
    }

    pub(crate) fn intent(&self) -> Result<Intent> {
        serde_json::from_str(&self.state)
            .map_err(|e| Error::corrupt(0, format!("intents row of {}: state does not decode: {e}", self.stream)))
    }

    pub(crate) fn run(&self) -> Result<Run> {
        serde_json::from_str(&self.state)
            .map_err(|e| Error::corrupt(0, format!("runs row of {}: state does not decode: {e}", self.stream)))
    }
}

fn intent_rows(
    client: &mut impl GenericClient,
    filter: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<EntityRow>> {
    let rows = client.query(&format!("SELECT key, state, stream_len FROM intents WHERE {filter}"), params)?;
    rows.iter()
        .map(|row| {
            let key: String = row.get("key");
            EntityRow::from_row(row, StreamId::from_stored(format!("intent:{key}")))
        })
        .collect()
}

fn run_rows(
    client: &mut impl GenericClient,
    filter: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
) -> Result<Vec<EntityRow>> {
    let rows = client.query(&format!("SELECT run_id, state, stream_len FROM runs WHERE {filter}"), params)?;
    rows.iter()
        .map(|row| {
            let run_id: String = row.get("run_id");
            EntityRow::from_row(row, StreamId::from_stored(format!("run:{run_id}")))
        })
        .collect()
}

/// One intent's row, by key (served by the primary key).
pub(crate) fn intent_row(client: &mut impl GenericClient, key: &str) -> Result<Option<EntityRow>> {
    Ok(intent_rows(client, "key = $1", &[&key])?.pop())
}

/// One run's row, by id (served by the primary key).
pub(crate) fn run_row(client: &mut impl GenericClient, run_id: &str) -> Result<Option<EntityRow>> {
    Ok(run_rows(client, "run_id = $1", &[&run_id])?.pop())
}

/// One order's intents, in reservation order (`intents_by_order`).
pub(crate) fn order_rows(client: &mut impl GenericClient, tenant: &str, order_id: &str) -> Result<Vec<EntityRow>> {
    intent_rows(client, "tenant = $1 AND order_id = $2 ORDER BY reserved_seq", &[&tenant, &order_id])
}

/// The charges under one business reference, in reservation order (`intents_by_reference`).
pub(crate) fn reference_rows(client: &mut impl GenericClient, tenant: &str, reference: &str) -> Result<Vec<EntityRow>> {
    intent_rows(
        client,
        "tenant = $1 AND business_ref = $2 AND kind = 'charge' ORDER BY reserved_seq",
        &[&tenant, &reference],
    )
}

/// One run's intents, in reservation order (`intents_by_run`).
pub(crate) fn run_intent_rows(client: &mut impl GenericClient, run_id: &str) -> Result<Vec<EntityRow>> {
    intent_rows(client, "run_id = $1 ORDER BY reserved_seq", &[&run_id])
}

/// Intents in `statuses`, in key order, at most `limit` (`intents_by_status`).
pub(crate) fn status_rows(
    client: &mut impl GenericClient,
    statuses: &[IntentStatus],
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let names: Vec<&str> = statuses.iter().map(IntentStatus::as_str).collect();
    intent_rows(client, "status = ANY($1) ORDER BY key LIMIT $2", &[&names, &to_i64(limit as u64)])
}

/// Intents whose reconciliation is due at `now`, oldest due first, ties in key order, at most
/// `limit` (`intents_due`).
pub(crate) fn due_rows(client: &mut impl GenericClient, now: DateTime<Utc>, limit: usize) -> Result<Vec<EntityRow>> {
    intent_rows(client, "due_at <= $1 ORDER BY due_at, key LIMIT $2", &[&now, &to_i64(limit as u64)])
}

/// Runs not finished that may go on at `now` — no timer, or one that fired — in id order, at
/// most `limit` (`runs_awake`, `runs_sleeping`).
pub(crate) fn awake_rows(client: &mut impl GenericClient, now: DateTime<Utc>, limit: usize) -> Result<Vec<EntityRow>> {
    let now = now.timestamp_micros();
    run_rows(
        client,
        "(NOT finished AND wake_at IS NULL) OR wake_at <= $1 ORDER BY run_id LIMIT $2",
        &[&now, &to_i64(limit as u64)],
    )
}

/// Runs whose timer fires after `now`, soonest first, at most `limit` (`runs_sleeping`).
pub(crate) fn sleeping_rows(
    client: &mut impl GenericClient,
    now: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let now = now.timestamp_micros();
    run_rows(client, "wake_at > $1 ORDER BY wake_at, run_id LIMIT $2", &[&now, &to_i64(limit as u64)])
}

/// A run's `wake_at` column: its timer's fire time while it waits on one.
fn wake_column(run: &Run) -> Option<i64> {
    run.wake_at.filter(|_| run.status.is_none()).map(engine::clock::micros_rounded_up)
}

/// When an intent's reconciliation falls due, as `intents.due_at` indexes it: only while its
/// outcome is unknown (what `Intent::reconcile_due` asks), as the SQLite rows do.
pub(crate) fn due_at(intent: &Intent) -> Option<DateTime<Utc>> {
    (intent.status == IntentStatus::OutcomeUnknown).then_some(intent.reconcile_after).flatten()
}

/// Writes (or rewrites) an intent's row. `reserved_seq` is its `IntentReserved`'s sequence.
pub(crate) fn put_intent(
    client: &mut impl GenericClient,
    intent: &Intent,
    reserved_seq: u64,
    stream_len: u64,
) -> Result<()> {
    let d = &intent.definition;
    let state = serde_json::to_string(intent).expect("an intent serializes: plain fields");
    client.execute(
        "INSERT INTO intents (key, tenant, order_id, business_ref, kind, run_id, status, due_at, reserved_seq, \
         stream_len, state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (key) DO UPDATE SET status = excluded.status, due_at = excluded.due_at, \
         stream_len = excluded.stream_len, state = excluded.state",
        &[
            &d.key.as_str(),
            &d.tenant,
            &d.order_id,
            &d.business_ref,
            &d.kind.as_str(),
            &intent.run_id.as_str(),
            &intent.status.as_str(),
            &due_at(intent),
            &to_i64(reserved_seq),
            &to_i64(stream_len),
            &state,
        ],
    )?;
    Ok(())
}

/// Writes (or rewrites) a run's row.
pub(crate) fn put_run(client: &mut impl GenericClient, run: &Run, stream_len: u64) -> Result<()> {
    let state = serde_json::to_string(run).expect("a run serializes: plain fields");
    client.execute(
        "INSERT INTO runs (run_id, finished, stream_len, state, wake_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (run_id) DO UPDATE SET finished = excluded.finished, stream_len = excluded.stream_len, \
         state = excluded.state, wake_at = excluded.wake_at",
        &[&run.run_id.as_str(), &run.status.is_some(), &to_i64(stream_len), &state, &wake_column(run)],
    )?;
    Ok(())
}

/// Which indexed column of an intent's row says something else than its state (the queries
/// of a decision read those columns), if one does: what `verify` checks after the state.
pub(crate) fn intent_columns_differ(
    client: &mut impl GenericClient,
    intent: &Intent,
    reserved_seq: u64,
) -> Result<Option<String>> {
    let d = &intent.definition;
    let row = client.query_one(
        "SELECT tenant, order_id, business_ref, kind, run_id, status, due_at, reserved_seq FROM intents WHERE key = $1",
        &[&d.key.as_str()],
    )?;
    let text = |i: usize| row.get::<_, String>(i);
    let due: Option<DateTime<Utc>> = row.get(6);
    let found: i64 = row.get(7);
    let expected = [
        ("tenant", text(0), d.tenant.clone()),
        ("order_id", text(1), d.order_id.clone()),
        ("business_ref", text(2), d.business_ref.clone()),
        ("kind", text(3), d.kind.as_str().to_owned()),
        ("run_id", text(4), intent.run_id.as_str().to_owned()),
        ("status", text(5), intent.status.as_str().to_owned()),
        ("due_at", format!("{due:?}"), format!("{:?}", due_at(intent))),
        ("reserved_seq", found.to_string(), reserved_seq.to_string()),
    ];
    Ok(expected
        .into_iter()
        .find(|(_, found, expected)| found != expected)
        .map(|(column, found, expected)| format!("column {column} is {found} in the table, {expected} by its state")))
}

/// Which indexed column of a run's row (`finished`, `wake_at`) says something else than its
/// state, if one does.
pub(crate) fn run_columns_differ(client: &mut impl GenericClient, run: &Run) -> Result<Option<String>> {
    let row = client.query_one("SELECT finished, wake_at FROM runs WHERE run_id = $1", &[&run.run_id.as_str()])?;
    let (finished, wake_at): (bool, Option<i64>) = (row.get(0), row.get(1));
    if finished != run.status.is_some() {
        return Ok(Some(format!("column finished is {finished} in the table, {} by its state", run.status.is_some())));
    }
    let expected = wake_column(run);
    Ok((wake_at != expected).then(|| format!("column wake_at is {wake_at:?} in the table, {expected:?} by its state")))
}
