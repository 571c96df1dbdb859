//! The rows: events as stored and read back, and the entity rows (`intents`, `runs`).
//!
//! Owns every SQL statement that reads or writes `events`, `intents` and `runs`, the row
//! layout of `store/FORMAT.md` ("PostgreSQL"), and the decoding of a row back into its typed
//! value (an event checked against its own hash, an entity from its serde JSON). Nothing here
//! locks: the callers (`crate::tx`) take the entity's lock first.
//!
//! The statements a command runs go with their parameters' types (`query_typed`,
//! `execute_typed`): the server parses each in the same round trip that runs it, where an
//! untyped one is prepared first, in a round trip of its own. What a command writes goes in
//! one statement per table, its rows as arrays unnested.

use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use engine::append::Sealed;
use engine::event::{Cause, Event, StoredEvent, StreamId, chain_hash};
use engine::ledger::{Intent, IntentStatus, Run};
use postgres::GenericClient;
use postgres::Row;
use postgres::types::{ToSql, Type};
use std::collections::HashMap;

/// A statement parameter with its type.
pub(crate) type Typed<'a> = (&'a (dyn ToSql + Sync), Type);

/// The `SELECT` list of an event, matching [`decode_event`].
pub(crate) const EVENT_COLUMNS: &str = "seq, stream, stream_seq, at, type, cause, payload, prev_hash, hash";

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).expect("sequences and lengths stay below 2^63: PostgreSQL's bigint sequence ends there")
}

fn to_u64(n: i64, seq: u64, what: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| Error::corrupt(seq, format!("{what} {n} is negative")))
}

/// Inserts sealed events in one statement (arrays unnested): what a command appends, what an
/// import's batch copies.
pub(crate) fn insert_events(client: &mut impl GenericClient, sealed: &[Sealed]) -> Result<()> {
    let column = |f: fn(&Sealed) -> String| sealed.iter().map(f).collect::<Vec<String>>();
    let seqs: Vec<i64> = sealed.iter().map(|s| to_i64(s.stored.seq)).collect();
    let stream_seqs: Vec<i64> = sealed.iter().map(|s| to_i64(s.stored.stream_seq)).collect();
    let ats: Vec<DateTime<Utc>> = sealed.iter().map(|s| s.stored.at).collect();
    client.execute_typed(
        "INSERT INTO events (seq, stream, stream_seq, at, type, cause, payload, prev_hash, hash) \
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::text[])",
        &[
            (&seqs, Type::INT8_ARRAY),
            (&column(|s| s.stored.stream.as_str().to_owned()), Type::TEXT_ARRAY),
            (&stream_seqs, Type::INT8_ARRAY),
            (&ats, Type::TIMESTAMPTZ_ARRAY),
            (&column(|s| s.stored.event.type_name().to_owned()), Type::TEXT_ARRAY),
            (&column(|s| s.cause.clone()), Type::TEXT_ARRAY),
            (&column(|s| s.payload.clone()), Type::TEXT_ARRAY),
            (&column(|s| s.stored.prev_hash.clone()), Type::TEXT_ARRAY),
            (&column(|s| s.stored.hash.clone()), Type::TEXT_ARRAY),
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
    let rows = client.query_typed(
        &format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream = $1 ORDER BY stream_seq"),
        &[(&stream.as_str(), Type::TEXT)],
    )?;
    rows.iter()
        .map(|row| {
            let stored = decode_event(row)?;
            check_hash(&stored)?;
            Ok(stored)
        })
        .collect()
}

/// The event rows of `streams`, undecoded, each stream's in stream order.
pub(crate) fn streams_rows(
    client: &mut impl GenericClient,
    streams: &[&str],
) -> Result<std::collections::BTreeMap<String, Vec<Row>>> {
    let query = format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream = ANY($1) ORDER BY stream, stream_seq");
    let mut grouped: std::collections::BTreeMap<String, Vec<Row>> = std::collections::BTreeMap::new();
    for row in client.query(&query, &[&streams])? {
        grouped.entry(row.get("stream")).or_default().push(row);
    }
    Ok(grouped)
}

/// The next `limit` stream names after `after` (from the first without it), in name order:
/// the intent streams (`intents`) or every other one. A keyset page of the
/// `(stream, stream_seq)` index: what `verify` walks instead of every name at once.
pub(crate) fn stream_names_after(
    client: &mut impl GenericClient,
    after: Option<&str>,
    intents: bool,
    limit: usize,
) -> Result<Vec<String>> {
    let limit = i64::try_from(limit).expect("a page size far below 2^63");
    let rows = match after {
        None => client.query_typed(
            "SELECT DISTINCT stream FROM events WHERE starts_with(stream, 'intent:') = $1 \
             ORDER BY stream LIMIT $2",
            &[(&intents, Type::BOOL), (&limit, Type::INT8)],
        )?,
        Some(after) => client.query_typed(
            "SELECT DISTINCT stream FROM events WHERE stream > $1 AND starts_with(stream, 'intent:') = $2 \
             ORDER BY stream LIMIT $3",
            &[(&after, Type::TEXT), (&intents, Type::BOOL), (&limit, Type::INT8)],
        )?,
    };
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The next `limit` rows of `intents` after the key `after`, in key order: each key, and
/// whether its stream holds any event.
pub(crate) fn intent_keys_after(
    client: &mut impl GenericClient,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, bool)>> {
    entity_keys_after(client, "key", "intents", "intent:", after, limit)
}

/// As [`intent_keys_after`], for `runs`.
pub(crate) fn run_ids_after(
    client: &mut impl GenericClient,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, bool)>> {
    entity_keys_after(client, "run_id", "runs", "run:", after, limit)
}

fn entity_keys_after(
    client: &mut impl GenericClient,
    column: &str,
    table: &str,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, bool)>> {
    let limit = i64::try_from(limit).expect("a page size far below 2^63");
    let select = format!(
        "SELECT {column}, EXISTS (SELECT 1 FROM events WHERE events.stream = '{prefix}' || {column}) FROM {table}"
    );
    let rows = match after {
        None => client.query_typed(&format!("{select} ORDER BY {column} LIMIT $1"), &[(&limit, Type::INT8)])?,
        Some(after) => client.query_typed(
            &format!("{select} WHERE {column} > $1 ORDER BY {column} LIMIT $2"),
            &[(&after, Type::TEXT), (&limit, Type::INT8)],
        )?,
    };
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// How many events `stream` holds (its last `stream_seq`).
pub(crate) fn stream_length(client: &mut impl GenericClient, stream: &StreamId) -> Result<u64> {
    let row = client.query_typed_one(
        "SELECT coalesce(max(stream_seq), 0) FROM events WHERE stream = $1",
        &[(&stream.as_str(), Type::TEXT)],
    )?;
    to_u64(row.get(0), 0, "stream length")
}

/// Which of `streams` hold events already, in name order.
pub(crate) fn streams_holding_events(client: &mut impl GenericClient, streams: &[&str]) -> Result<Vec<String>> {
    // One probe of the `(stream, stream_seq)` index a name: `stream = ANY(…)` over thousands
    // of names lets the planner scan the whole table instead.
    let rows = client.query(
        "SELECT name FROM unnest($1::text[]) AS name \
         WHERE EXISTS (SELECT 1 FROM events WHERE events.stream = name) ORDER BY name",
        &[&streams],
    )?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The hash and global sequence of each event asked for by `(stream, stream_seq)`, in one
/// statement (one probe of the `(stream, stream_seq)` index each); those not in the log are
/// absent from the answer.
pub(crate) fn events_at(
    client: &mut impl GenericClient,
    at: &[(&StreamId, u64)],
) -> Result<HashMap<(StreamId, u64), (String, u64)>> {
    let streams: Vec<&str> = at.iter().map(|(stream, _)| stream.as_str()).collect();
    let stream_seqs: Vec<i64> = at.iter().map(|(_, stream_seq)| to_i64(*stream_seq)).collect();
    let rows = client.query_typed(
        "SELECT e.stream, e.stream_seq, e.hash, e.seq FROM unnest($1::text[], $2::bigint[]) AS k(stream, stream_seq) \
         JOIN events e ON e.stream = k.stream AND e.stream_seq = k.stream_seq",
        &[(&streams, Type::TEXT_ARRAY), (&stream_seqs, Type::INT8_ARRAY)],
    )?;
    rows.iter()
        .map(|row| {
            let seq = to_u64(row.get(3), 0, "seq")?;
            let stream_seq = to_u64(row.get(1), seq, "stream_seq")?;
            Ok(((StreamId::from_stored(row.get(0)), stream_seq), (row.get(2), seq)))
        })
        .collect()
}

/// `n` fresh global sequences in one call, ascending.
pub(crate) fn next_seqs(client: &mut impl GenericClient, n: usize) -> Result<Vec<u64>> {
    let rows = client
        .query_typed("SELECT nextval('events_seq') FROM generate_series(1, $1)", &[(&to_i64(n as u64), Type::INT8)])?;
    let mut seqs = rows.iter().map(|row| to_u64(row.get(0), 0, "nextval")).collect::<Result<Vec<u64>>>()?;
    // One call's values ascend already; sorted so the order never rests on the plan.
    seqs.sort_unstable();
    Ok(seqs)
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

fn intent_rows(client: &mut impl GenericClient, filter: &str, params: &[Typed<'_>]) -> Result<Vec<EntityRow>> {
    let rows = client.query_typed(&format!("SELECT key, state, stream_len FROM intents WHERE {filter}"), params)?;
    rows.iter()
        .map(|row| {
            let key: String = row.get("key");
            EntityRow::from_row(row, StreamId::from_stored(format!("intent:{key}")))
        })
        .collect()
}

fn run_rows(client: &mut impl GenericClient, filter: &str, params: &[Typed<'_>]) -> Result<Vec<EntityRow>> {
    let rows = client.query_typed(&format!("SELECT run_id, state, stream_len FROM runs WHERE {filter}"), params)?;
    rows.iter()
        .map(|row| {
            let run_id: String = row.get("run_id");
            EntityRow::from_row(row, StreamId::from_stored(format!("run:{run_id}")))
        })
        .collect()
}

/// One intent's row, by key (served by the primary key).
pub(crate) fn intent_row(client: &mut impl GenericClient, key: &str) -> Result<Option<EntityRow>> {
    Ok(intent_rows(client, "key = $1", &[(&key, Type::TEXT)])?.pop())
}

/// One run's row, by id (served by the primary key).
pub(crate) fn run_row(client: &mut impl GenericClient, run_id: &str) -> Result<Option<EntityRow>> {
    Ok(run_rows(client, "run_id = $1", &[(&run_id, Type::TEXT)])?.pop())
}

/// The rows of the runs in `run_ids` that exist (served by the primary key).
pub(crate) fn runs_rows(client: &mut impl GenericClient, run_ids: &[&str]) -> Result<Vec<EntityRow>> {
    run_rows(client, "run_id = ANY($1)", &[(&run_ids, Type::TEXT_ARRAY)])
}

/// One order's intents, in reservation order (`intents_by_order`).
pub(crate) fn order_rows(client: &mut impl GenericClient, tenant: &str, order_id: &str) -> Result<Vec<EntityRow>> {
    intent_rows(
        client,
        "tenant = $1 AND order_id = $2 ORDER BY reserved_seq",
        &[(&tenant, Type::TEXT), (&order_id, Type::TEXT)],
    )
}

/// The charges under one business reference, in reservation order (`intents_by_reference`).
pub(crate) fn reference_rows(client: &mut impl GenericClient, tenant: &str, reference: &str) -> Result<Vec<EntityRow>> {
    intent_rows(
        client,
        "tenant = $1 AND business_ref = $2 AND kind = 'charge' ORDER BY reserved_seq",
        &[(&tenant, Type::TEXT), (&reference, Type::TEXT)],
    )
}

/// One run's intents, in reservation order (`intents_by_run`).
pub(crate) fn run_intent_rows(client: &mut impl GenericClient, run_id: &str) -> Result<Vec<EntityRow>> {
    intent_rows(client, "run_id = $1 ORDER BY reserved_seq", &[(&run_id, Type::TEXT)])
}

/// Intents in `statuses`, in key order, at most `limit` (`intents_by_status`).
pub(crate) fn status_rows(
    client: &mut impl GenericClient,
    statuses: &[IntentStatus],
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let names: Vec<&str> = statuses.iter().map(IntentStatus::as_str).collect();
    intent_rows(
        client,
        "status = ANY($1) ORDER BY key LIMIT $2",
        &[(&names, Type::TEXT_ARRAY), (&to_i64(limit as u64), Type::INT8)],
    )
}

/// The next `limit` intents after the key `after` (exclusive; `None` from the first), in key
/// order, only those in `status` when given: a keyset page of `intents_by_status` with a
/// status, of the primary key without.
pub(crate) fn intents_page(
    client: &mut impl GenericClient,
    status: Option<IntentStatus>,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let limit = to_i64(limit as u64);
    // The empty string sorts before every key, in every collation.
    let after = after.unwrap_or_default();
    match status {
        Some(status) => intent_rows(
            client,
            "status = $1 AND key > $2 ORDER BY key LIMIT $3",
            &[(&status.as_str(), Type::TEXT), (&after, Type::TEXT), (&limit, Type::INT8)],
        ),
        None => intent_rows(client, "key > $1 ORDER BY key LIMIT $2", &[(&after, Type::TEXT), (&limit, Type::INT8)]),
    }
}

/// The next `limit` runs after the id `after` (exclusive; `None` from the first), in id
/// order, only the unfinished with `unfinished_only`: a keyset page of the primary key.
pub(crate) fn runs_page(
    client: &mut impl GenericClient,
    unfinished_only: bool,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let limit = to_i64(limit as u64);
    // The empty string sorts before every id, in every collation.
    let after = after.unwrap_or_default();
    let filter = if unfinished_only {
        "NOT finished AND run_id > $1 ORDER BY run_id LIMIT $2"
    } else {
        "run_id > $1 ORDER BY run_id LIMIT $2"
    };
    run_rows(client, filter, &[(&after, Type::TEXT), (&limit, Type::INT8)])
}

/// The intents the runs `run_ids` reserved, by run then in reservation order (`intents_by_run`).
pub(crate) fn runs_intent_rows(client: &mut impl GenericClient, run_ids: &[&str]) -> Result<Vec<EntityRow>> {
    intent_rows(client, "run_id = ANY($1) ORDER BY run_id, reserved_seq", &[(&run_ids, Type::TEXT_ARRAY)])
}

/// Intents whose reconciliation is due at `now`, oldest due first, ties in key order, at most
/// `limit` (`intents_due`).
pub(crate) fn due_rows(client: &mut impl GenericClient, now: DateTime<Utc>, limit: usize) -> Result<Vec<EntityRow>> {
    intent_rows(
        client,
        "due_at <= $1 ORDER BY due_at, key LIMIT $2",
        &[(&now, Type::TIMESTAMPTZ), (&to_i64(limit as u64), Type::INT8)],
    )
}

/// Runs not finished that may go on at `now` — no timer, or one that fired — in id order, at
/// most `limit` (`runs_awake`, `runs_sleeping`).
pub(crate) fn awake_rows(client: &mut impl GenericClient, now: DateTime<Utc>, limit: usize) -> Result<Vec<EntityRow>> {
    let now = now.timestamp_micros();
    run_rows(
        client,
        "(NOT finished AND wake_at IS NULL) OR wake_at <= $1 ORDER BY run_id LIMIT $2",
        &[(&now, Type::INT8), (&to_i64(limit as u64), Type::INT8)],
    )
}

/// Runs whose timer fires after `now`, soonest first, at most `limit` (`runs_sleeping`).
pub(crate) fn sleeping_rows(
    client: &mut impl GenericClient,
    now: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<EntityRow>> {
    let now = now.timestamp_micros();
    run_rows(
        client,
        "wake_at > $1 ORDER BY wake_at, run_id LIMIT $2",
        &[(&now, Type::INT8), (&to_i64(limit as u64), Type::INT8)],
    )
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

/// An intent's row to write: the intent, its `IntentReserved`'s sequence, its stream's length.
pub(crate) type IntentRow<'a> = (&'a Intent, u64, u64);

/// Writes (or rewrites) intents' rows in one statement (arrays unnested): what a command's
/// fold changed, what an import's batch copies. The keys must be distinct.
pub(crate) fn put_intents(client: &mut impl GenericClient, intents: &[IntentRow<'_>]) -> Result<()> {
    let text = |f: fn(&Intent) -> String| intents.iter().map(|(intent, ..)| f(intent)).collect::<Vec<String>>();
    let states: Vec<String> = intents
        .iter()
        .map(|(intent, ..)| serde_json::to_string(intent).expect("an intent serializes: plain fields"))
        .collect();
    let due: Vec<Option<DateTime<Utc>>> = intents.iter().map(|(intent, ..)| due_at(intent)).collect();
    let reserved: Vec<i64> = intents.iter().map(|(_, reserved_seq, _)| to_i64(*reserved_seq)).collect();
    let lengths: Vec<i64> = intents.iter().map(|(_, _, stream_len)| to_i64(*stream_len)).collect();
    client.execute_typed(
        "INSERT INTO intents (key, tenant, order_id, business_ref, kind, run_id, status, due_at, reserved_seq, \
         stream_len, state) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
         $6::text[], $7::text[], $8::timestamptz[], $9::bigint[], $10::bigint[], $11::text[]) \
         ON CONFLICT (key) DO UPDATE SET status = excluded.status, due_at = excluded.due_at, \
         stream_len = excluded.stream_len, state = excluded.state",
        &[
            (&text(|i| i.definition.key.as_str().to_owned()), Type::TEXT_ARRAY),
            (&text(|i| i.definition.tenant.clone()), Type::TEXT_ARRAY),
            (&text(|i| i.definition.order_id.clone()), Type::TEXT_ARRAY),
            (&text(|i| i.definition.business_ref.clone()), Type::TEXT_ARRAY),
            (&text(|i| i.definition.kind.as_str().to_owned()), Type::TEXT_ARRAY),
            (&text(|i| i.run_id.as_str().to_owned()), Type::TEXT_ARRAY),
            (&text(|i| i.status.as_str().to_owned()), Type::TEXT_ARRAY),
            (&due, Type::TIMESTAMPTZ_ARRAY),
            (&reserved, Type::INT8_ARRAY),
            (&lengths, Type::INT8_ARRAY),
            (&states, Type::TEXT_ARRAY),
        ],
    )?;
    Ok(())
}

/// Writes (or rewrites) runs' rows in one statement (arrays unnested): what a command's fold
/// changed, what an import's batch copies. The run ids must be distinct.
pub(crate) fn put_runs(client: &mut impl GenericClient, runs: &[(&Run, u64)]) -> Result<()> {
    let ids: Vec<&str> = runs.iter().map(|(run, _)| run.run_id.as_str()).collect();
    let finished: Vec<bool> = runs.iter().map(|(run, _)| run.status.is_some()).collect();
    let lengths: Vec<i64> = runs.iter().map(|(_, stream_len)| to_i64(*stream_len)).collect();
    let states: Vec<String> =
        runs.iter().map(|(run, _)| serde_json::to_string(run).expect("a run serializes: plain fields")).collect();
    let wakes: Vec<Option<i64>> = runs.iter().map(|(run, _)| wake_column(run)).collect();
    client.execute_typed(
        "INSERT INTO runs (run_id, finished, stream_len, state, wake_at) \
         SELECT * FROM unnest($1::text[], $2::boolean[], $3::bigint[], $4::text[], $5::bigint[]) \
         ON CONFLICT (run_id) DO UPDATE SET finished = excluded.finished, stream_len = excluded.stream_len, \
         state = excluded.state, wake_at = excluded.wake_at",
        &[
            (&ids, Type::TEXT_ARRAY),
            (&finished, Type::BOOL_ARRAY),
            (&lengths, Type::INT8_ARRAY),
            (&states, Type::TEXT_ARRAY),
            (&wakes, Type::INT8_ARRAY),
        ],
    )?;
    Ok(())
}

/// An entity row as `verify` reads it: the row, with its indexed columns as the table holds
/// them (what a decision's queries read), to compare with its state.
pub(crate) struct IndexedRow {
    pub(crate) entity: EntityRow,
    columns: Row,
}

const INTENT_INDEXED: &str = "tenant, order_id, business_ref, kind, run_id, status, due_at, reserved_seq";
const RUN_INDEXED: &str = "finished, wake_at";

/// The rows of the intents in `keys` that exist, by key, with their indexed columns.
pub(crate) fn indexed_intents(
    client: &mut impl GenericClient,
    keys: &[&str],
) -> Result<std::collections::BTreeMap<String, IndexedRow>> {
    let query = format!("SELECT key, state, stream_len, {INTENT_INDEXED} FROM intents WHERE key = ANY($1)");
    client
        .query(&query, &[&keys])?
        .into_iter()
        .map(|row| {
            let key: String = row.get("key");
            let entity = EntityRow::from_row(&row, StreamId::from_stored(format!("intent:{key}")))?;
            Ok((key, IndexedRow { entity, columns: row }))
        })
        .collect()
}

/// The rows of the runs in `run_ids` that exist, by id, with their indexed columns.
pub(crate) fn indexed_runs(
    client: &mut impl GenericClient,
    run_ids: &[&str],
) -> Result<std::collections::BTreeMap<String, IndexedRow>> {
    let query = format!("SELECT run_id, state, stream_len, {RUN_INDEXED} FROM runs WHERE run_id = ANY($1)");
    client
        .query(&query, &[&run_ids])?
        .into_iter()
        .map(|row| {
            let run_id: String = row.get("run_id");
            let entity = EntityRow::from_row(&row, StreamId::from_stored(format!("run:{run_id}")))?;
            Ok((run_id, IndexedRow { entity, columns: row }))
        })
        .collect()
}

impl IndexedRow {
    /// Which indexed column of an intent's row says something else than its state, if one
    /// does: what `verify` checks after the state.
    pub(crate) fn intent_columns_differ(&self, intent: &Intent, reserved_seq: u64) -> Option<String> {
        let d = &intent.definition;
        let text = |column: &str| self.columns.get::<_, String>(column);
        let due: Option<DateTime<Utc>> = self.columns.get("due_at");
        let found: i64 = self.columns.get("reserved_seq");
        let expected = [
            ("tenant", text("tenant"), d.tenant.clone()),
            ("order_id", text("order_id"), d.order_id.clone()),
            ("business_ref", text("business_ref"), d.business_ref.clone()),
            ("kind", text("kind"), d.kind.as_str().to_owned()),
            ("run_id", text("run_id"), intent.run_id.as_str().to_owned()),
            ("status", text("status"), intent.status.as_str().to_owned()),
            ("due_at", format!("{due:?}"), format!("{:?}", due_at(intent))),
            ("reserved_seq", found.to_string(), reserved_seq.to_string()),
        ];
        expected.into_iter().find(|(_, found, expected)| found != expected).map(|(column, found, expected)| {
            format!("column {column} is {found} in the table, {expected} by its state")
        })
    }

    /// Which indexed column of a run's row (`finished`, `wake_at`) says something else than
    /// its state, if one does.
    pub(crate) fn run_columns_differ(&self, run: &Run) -> Option<String> {
        let (finished, wake_at): (bool, Option<i64>) = (self.columns.get("finished"), self.columns.get("wake_at"));
        if finished != run.status.is_some() {
            return Some(format!("column finished is {finished} in the table, {} by its state", run.status.is_some()));
        }
        let expected = wake_column(run);
        (wake_at != expected).then(|| format!("column wake_at is {wake_at:?} in the table, {expected:?} by its state"))
    }
}
