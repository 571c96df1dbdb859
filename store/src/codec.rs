//! Events to rows and back: the one place that knows the event columns of both layouts.
//!
//! A log holds rows of two layouts (`store/FORMAT.md`): `events_v1`, the text rows written
//! by schema versions 1 and 2 and kept exactly as they were, and `events`, the compact rows
//! written since version 3 (integer stream and actor ids, integer times, packed payloads
//! without the fields their stream already names, a 32-byte hash and no stored previous
//! hash). Global sequences continue from one table to the other, and so does the chain: both
//! layouts hash the same content with `engine::event::chain_hash`.
//!
//! Every event read back is checked before anyone folds it (STYLE rule 6, "assert at both
//! ends"): its payload must decode, its hash must match the chain computation over its own
//! content and the previous event's hash. A failure is [`Error::Corrupt`] naming the
//! sequence, never a panic.

use crate::error::{Error, Result};
use crate::packed;
use chrono::{DateTime, SecondsFormat, Utc};
use engine::event::{Cause, Event, GENESIS_HASH, RunId, StoredEvent, StreamId, chain_hash};
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};
use serde_json::Value;

/// The text form of instants in `events_v1` and `leases`: RFC 3339, UTC, microseconds, `Z`.
pub(crate) fn format_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a time written by [`format_time`].
pub(crate) fn parse_time(text: &str) -> std::result::Result<DateTime<Utc>, chrono::ParseError> {
    DateTime::parse_from_rfc3339(text).map(|at| at.with_timezone(&Utc))
}

/// An instant as the compact layout stores it: microseconds since the Unix epoch. The writer
/// truncates its clock to microseconds, so this is exact.
pub(crate) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// The instant of [`micros`].
pub(crate) fn from_micros(us: i64, seq: u64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| Error::corrupt(seq, format!("time {us} µs is out of range")))
}

/// A SQLite rowid or stream sequence as the engine counts it. Both are checked `>= 1` by the
/// schema, so a negative value means the file was edited by hand.
pub(crate) fn to_u64(value: i64, seq: u64, column: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::corrupt(seq, format!("negative {column} {value}")))
}

/// A sequence as SQLite stores it.
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).expect("sequences and counters stay below i64::MAX: SQLite rowids are i64")
}

/// The stored `type` codes of the compact layout: code `i + 1` is `TYPES[i]`. Append-only.
pub const TYPES: [&str; 30] = [
    "RunStarted",
    "RunDeadlineExtended",
    "StepRecorded",
    "TimerStarted",
    "SignalDelivered",
    "RunFinished",
    "IntentReserved",
    "IntentDeduplicated",
    "ApprovalGranted",
    "ApprovalDenied",
    "AttemptStarted",
    "AttemptNotSent",
    "IntentValidated",
    "IntentDeclined",
    "OutcomeUnknown",
    "ReconciliationStarted",
    "ReconciliationResolved",
    "IntentEscalated",
    "ApprovalExpired",
    "IntentCancelled",
    "IntentResolved",
    "LateAnswerRecorded",
    "AgentRecorded",
    "ApprovalRequested",
    "IntentReleased",
    "RunCancelRequested",
    "IntentAbandoned",
    "FactsAdmitted",
    "FactsForgotten",
    "ResendRefused",
];

/// The stored code of an event type.
pub(crate) fn type_code(name: &str) -> i64 {
    let index = TYPES.iter().position(|t| *t == name).expect("every event type has a stored code in codec::TYPES");
    i64::try_from(index + 1).expect("a few dozen codes fit in i64")
}

fn type_name(code: i64, seq: u64) -> Result<&'static str> {
    usize::try_from(code)
        .ok()
        .and_then(|c| c.checked_sub(1))
        .and_then(|i| TYPES.get(i).copied())
        .ok_or_else(|| Error::corrupt(seq, format!("unknown type code {code}")))
}

/// The hex form of a stored 32-byte hash.
pub(crate) fn hash_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// The 32 bytes of a hex hash (as `StoredEvent` carries it).
pub(crate) fn hash_bytes(hex_hash: &str) -> Vec<u8> {
    hex::decode(hex_hash).expect("a chain hash is 64 hex digits: seal and the readers only make those")
}

/// The packed payload of `event` on `stream`: its fields less those the stream names (the
/// intent key, the run id, and a key's operation, tenant and intent id when the key spells
/// them exactly) and a journal link's name (`intent:` and the key it records).
/// [`unpack_payload`] puts them back, so the event reads back equal.
pub(crate) fn pack_payload(stream: &StreamId, event: &Event) -> Vec<u8> {
    let mut payload = event.payload();
    if let Value::Object(map) = &mut payload {
        if let Some(key) = stream.as_str().strip_prefix("intent:") {
            remove_if(map, "key", key);
            if let Some(Value::Object(intent)) = map.get_mut("intent") {
                remove_if(intent, "key", key);
                let parts = (intent.get("kind"), intent.get("tenant"), intent.get("intent_id"));
                if let (Some(Value::String(kind)), Some(Value::String(tenant)), Some(Value::String(id))) = parts
                    && !tenant.contains(':')
                    && key == format!("{kind}:{tenant}:{id}")
                {
                    intent.remove("kind");
                    intent.remove("tenant");
                    intent.remove("intent_id");
                }
            }
        } else if let Some(run_id) = stream.as_str().strip_prefix("run:") {
            remove_if(map, "run_id", run_id);
            // A journal link (`intent:<key>` recording `<key>`) names its key once.
            if let Some(Value::String(output)) = map.get("output") {
                let link = format!("intent:{output}");
                remove_if(map, "name", &link);
            }
        }
    }
    packed::encode(&payload)
}

fn remove_if(map: &mut serde_json::Map<String, Value>, field: &str, expected: &str) {
    if map.get(field).and_then(Value::as_str) == Some(expected) {
        map.remove(field);
    }
}

/// The event of a packed payload stored on `stream` with type `type_name`.
pub(crate) fn unpack_payload(stream: &str, type_name: &str, bytes: &[u8], seq: u64) -> Result<Event> {
    let payload = unpack_value(stream, type_name, bytes, seq)?;
    Event::from_stored(type_name, &payload)
        .map_err(|e| Error::corrupt(seq, format!("{type_name} payload does not decode: {e}")))
}

/// The whole payload (as JSON) of a packed payload stored on `stream` with type `type_name`:
/// what [`pack_payload`] left out put back.
fn unpack_value(stream: &str, type_name: &str, bytes: &[u8], seq: u64) -> Result<Value> {
    let mut payload =
        packed::decode(bytes).map_err(|e| Error::corrupt(seq, format!("payload does not unpack: {e}")))?;
    if let Value::Object(map) = &mut payload {
        if let Some(key) = stream.strip_prefix("intent:") {
            if type_name == "IntentReserved" {
                if let Some(Value::Object(intent)) = map.get_mut("intent") {
                    intent.entry("key").or_insert_with(|| Value::String(key.to_owned()));
                    if !intent.contains_key("tenant") {
                        let mut parts = key.splitn(3, ':');
                        for field in ["kind", "tenant", "intent_id"] {
                            let part = parts.next().unwrap_or_default();
                            intent.insert(field.to_owned(), Value::String(part.to_owned()));
                        }
                    }
                }
            } else {
                map.entry("key").or_insert_with(|| Value::String(key.to_owned()));
            }
        } else if let Some(run_id) = stream.strip_prefix("run:") {
            map.entry("run_id").or_insert_with(|| Value::String(run_id.to_owned()));
            if type_name == "StepRecorded"
                && !map.contains_key("name")
                && let Some(Value::String(output)) = map.get("output")
            {
                let link = format!("intent:{output}");
                map.insert("name".to_owned(), Value::String(link));
            }
        }
    }
    Ok(payload)
}

/// The chain hash of a decoded event, from its own fields and its stored previous hash.
pub(crate) fn recompute_hash(stored: &StoredEvent) -> String {
    chain_hash(
        &stored.prev_hash,
        stored.seq,
        &stored.stream,
        stored.stream_seq,
        stored.at,
        &stored.cause,
        &stored.event,
    )
}

/// Checks that a decoded event's hash is the chain hash of its content.
pub(crate) fn check_hash(stored: &StoredEvent) -> Result<()> {
    let computed = recompute_hash(stored);
    if computed != stored.hash {
        return Err(Error::corrupt(stored.seq, format!("hash mismatch (stored {}, computed {computed})", stored.hash)));
    }
    Ok(())
}

/// The `SELECT` list of a legacy row, matching [`LegacyRow::from_row`].
const LEGACY_COLUMNS: &str = "seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash";

/// One `events_v1` row as stored.
struct LegacyRow {
    seq: i64,
    stream: String,
    stream_seq: i64,
    type_name: String,
    at: String,
    cause: String,
    payload: String,
    prev_hash: String,
    hash: String,
}

impl LegacyRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            seq: row.get(0)?,
            stream: row.get(1)?,
            stream_seq: row.get(2)?,
            type_name: row.get(3)?,
            at: row.get(4)?,
            cause: row.get(5)?,
            payload: row.get(6)?,
            prev_hash: row.get(7)?,
            hash: row.get(8)?,
        })
    }

    fn decode(self) -> Result<StoredEvent> {
        let seq = to_u64(self.seq, 0, "seq")?;
        let stream_seq = to_u64(self.stream_seq, seq, "stream_seq")?;
        let at =
            parse_time(&self.at).map_err(|e| Error::corrupt(seq, format!("time {:?} does not parse: {e}", self.at)))?;
        let cause: Cause = serde_json::from_str(&self.cause)
            .map_err(|e| Error::corrupt(seq, format!("cause does not decode: {e}")))?;
        let payload: Value = serde_json::from_str(&self.payload)
            .map_err(|e| Error::corrupt(seq, format!("payload is not JSON: {e}")))?;
        let event = Event::from_stored(&self.type_name, &payload)
            .map_err(|e| Error::corrupt(seq, format!("{} payload does not decode: {e}", self.type_name)))?;
        Ok(StoredEvent {
            seq,
            stream: StreamId::from_stored(self.stream),
            stream_seq,
            at,
            cause,
            event,
            prev_hash: self.prev_hash,
            hash: self.hash,
        })
    }
}

/// The `SELECT` list of a compact row with its names joined, matching [`CompactRow::from_row`].
/// `LEFT JOIN`s, so a dangling id is reported by name instead of hiding the row. `e.*` brings
/// `cause_parent` when the table has it: version 3's migration reads the compact table
/// before version 7 adds that column (it holds no row then, and no event before version 7
/// records a parent).
const COMPACT_SELECT: &str = "SELECT e.seq, s.name, e.stream, e.stream_seq, e.type, e.at, a.name, e.cause_run, \
     c.name, e.payload, e.hash, e.* FROM events e LEFT JOIN streams s ON s.id = e.stream \
     LEFT JOIN actors a ON a.id = e.actor LEFT JOIN streams c ON c.id = e.cause_run";

/// One `events` row as stored, names joined.
struct CompactRow {
    seq: i64,
    stream: Option<String>,
    stream_id: i64,
    stream_seq: i64,
    type_code: i64,
    at: i64,
    actor: Option<String>,
    cause_run_id: Option<i64>,
    cause_run: Option<String>,
    payload: Vec<u8>,
    hash: Vec<u8>,
    cause_parent: Option<i64>,
}

impl CompactRow {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            seq: row.get(0)?,
            stream: row.get(1)?,
            stream_id: row.get(2)?,
            stream_seq: row.get(3)?,
            type_code: row.get(4)?,
            at: row.get(5)?,
            actor: row.get(6)?,
            cause_run_id: row.get(7)?,
            cause_run: row.get(8)?,
            payload: row.get(9)?,
            hash: row.get(10)?,
            cause_parent: match row.get("cause_parent") {
                Err(rusqlite::Error::InvalidColumnName(_)) => None,
                other => other?,
            },
        })
    }

    /// The event, chained to `prev_hash` (the previous row's hash: the compact layout does
    /// not store it).
    fn decode(self, prev_hash: String) -> Result<StoredEvent> {
        let seq = to_u64(self.seq, 0, "seq")?;
        let stream_seq = to_u64(self.stream_seq, seq, "stream_seq")?;
        let stream = self
            .stream
            .ok_or_else(|| Error::corrupt(seq, format!("stream id {} is not in streams", self.stream_id)))?;
        let type_name = type_name(self.type_code, seq)?;
        let at = from_micros(self.at, seq)?;
        let actor = self.actor.ok_or_else(|| Error::corrupt(seq, "its actor id is not in actors"))?;
        let run_id = match (self.cause_run_id, self.cause_run) {
            (None, _) => None,
            (Some(_), Some(name)) => Some(RunId::new(
                name.strip_prefix("run:").ok_or_else(|| Error::corrupt(seq, format!("cause run {name:?}")))?,
            )),
            (Some(id), None) => return Err(Error::corrupt(seq, format!("cause run stream {id} is not in streams"))),
        };
        let parent = self.cause_parent.map(|p| to_u64(p, seq, "cause_parent")).transpose()?;
        let event = unpack_payload(&stream, type_name, &self.payload, seq)?;
        if self.hash.len() != 32 {
            return Err(Error::corrupt(seq, format!("a {}-byte hash", self.hash.len())));
        }
        Ok(StoredEvent {
            seq,
            stream: StreamId::from_stored(stream),
            stream_seq,
            at,
            cause: Cause { actor, run_id, parent },
            event,
            prev_hash,
            hash: hash_hex(&self.hash),
        })
    }
}

/// The hash of event `seq` (the genesis hash for 0), from whichever table holds it.
pub(crate) fn hash_at(conn: &Connection, seq: u64) -> Result<Option<String>> {
    if seq == 0 {
        return Ok(Some(GENESIS_HASH.to_owned()));
    }
    let compact: Option<Vec<u8>> = conn
        .prepare_cached("SELECT hash FROM events WHERE seq = ?1")?
        .query_row([to_i64(seq)], |row| row.get(0))
        .optional()?;
    if let Some(bytes) = compact {
        return Ok(Some(hash_hex(&bytes)));
    }
    Ok(conn
        .prepare_cached("SELECT hash FROM events_v1 WHERE seq = ?1")?
        .query_row([to_i64(seq)], |row| row.get(0))
        .optional()?)
}

/// Calls `each` with every event whose seq is above `after`, in seq order, decoded and
/// chained (`prev_hash` is the stored one for legacy rows, the previous row's hash for
/// compact ones) but not hash-checked: callers check what they need ([`check_hash`], the
/// links). A row that does not decode stops the scan with its error.
pub(crate) fn scan_events(
    conn: &Connection,
    after: u64,
    mut each: impl FnMut(StoredEvent) -> Result<()>,
) -> Result<()> {
    let mut prev = hash_at(conn, after)?.unwrap_or_else(|| GENESIS_HASH.to_owned());
    let mut legacy =
        conn.prepare_cached(&format!("SELECT {LEGACY_COLUMNS} FROM events_v1 WHERE seq > ?1 ORDER BY seq"))?;
    let mut rows = legacy.query([to_i64(after)])?;
    let mut last = after;
    while let Some(row) = rows.next()? {
        let stored = LegacyRow::from_row(row)?.decode()?;
        (prev, last) = (stored.hash.clone(), stored.seq);
        each(stored)?;
    }
    let mut compact = conn.prepare_cached(&format!("{COMPACT_SELECT} WHERE e.seq > ?1 ORDER BY e.seq"))?;
    let mut rows = compact.query([to_i64(last)])?;
    while let Some(row) = rows.next()? {
        let stored = CompactRow::from_row(row)?.decode(prev)?;
        prev = stored.hash.clone();
        each(stored)?;
    }
    Ok(())
}

/// Calls `each` with one stream's events in stream order, decoded but not hash-checked
/// (a compact row's `prev_hash` is left empty: it is the previous row's, read only to check).
pub(crate) fn scan_stream(
    conn: &Connection,
    stream: &StreamId,
    each: &mut dyn FnMut(StoredEvent) -> Result<()>,
) -> Result<()> {
    let mut legacy =
        conn.prepare_cached(&format!("SELECT {LEGACY_COLUMNS} FROM events_v1 WHERE stream = ?1 ORDER BY stream_seq"))?;
    let mut rows = legacy.query([stream.as_str()])?;
    while let Some(row) = rows.next()? {
        each(LegacyRow::from_row(row)?.decode()?)?;
    }
    let mut compact = conn.prepare_cached(&format!(
        "{COMPACT_SELECT} WHERE e.stream = (SELECT id FROM streams WHERE name = ?1) ORDER BY e.stream_seq"
    ))?;
    let mut rows = compact.query([stream.as_str()])?;
    while let Some(row) = rows.next()? {
        each(CompactRow::from_row(row)?.decode(String::new())?)?;
    }
    Ok(())
}

/// Reads one stream's events in stream order, each decoded and hash-checked (a compact
/// row's previous hash read from the row before it).
pub(crate) fn stream_events(conn: &Connection, stream: &StreamId) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::new();
    scan_stream(conn, stream, &mut |mut stored| {
        if stored.prev_hash.is_empty() {
            stored.prev_hash = hash_at(conn, stored.seq - 1)?
                .ok_or_else(|| Error::corrupt(stored.seq, "the event before it is missing"))?;
        }
        check_hash(&stored)?;
        out.push(stored);
        Ok(())
    })?;
    Ok(out)
}

/// The first event of the stream with id `stream_id` named `name` (its `RunStarted` or
/// `IntentReserved`), decoded but not hash-checked: what an entity row leaves out is read
/// from it, and `verify` checks every row's hash.
pub(crate) fn first_event(conn: &Connection, stream_id: i64, name: &str) -> Result<Option<StoredEvent>> {
    let compact = conn
        .prepare_cached(&format!("{COMPACT_SELECT} WHERE e.stream = ?1 AND e.stream_seq = 1"))?
        .query_row([stream_id], CompactRow::from_row)
        .optional()?;
    if let Some(row) = compact {
        // Not hash-checked, so the previous hash is not read.
        return row.decode(String::new()).map(Some);
    }
    let legacy = conn
        .prepare_cached(&format!("SELECT {LEGACY_COLUMNS} FROM events_v1 WHERE stream = ?1 AND stream_seq = 1"))?
        .query_row([name], LegacyRow::from_row)
        .optional()?;
    legacy.map(LegacyRow::decode).transpose()
}

/// The type and whole payload (as JSON) of the first event of the stream with id
/// `stream_id` named `name` — its `RunStarted` or `IntentReserved` — without building the
/// event: what an entity row leaves out is read from it. Not hash-checked (`verify` checks
/// every row's hash).
pub(crate) fn first_payload(conn: &Connection, stream_id: i64, name: &str) -> Result<Option<(&'static str, Value)>> {
    let compact: Option<(i64, i64, Vec<u8>)> = conn
        .prepare_cached("SELECT seq, type, payload FROM events WHERE stream = ?1 AND stream_seq = 1")?
        .query_row([stream_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    if let Some((seq, code, bytes)) = compact {
        let seq = to_u64(seq, 0, "seq")?;
        let type_name = type_name(code, seq)?;
        return Ok(Some((type_name, unpack_value(name, type_name, &bytes, seq)?)));
    }
    let legacy: Option<(i64, String, String)> = conn
        .prepare_cached("SELECT seq, type, payload FROM events_v1 WHERE stream = ?1 AND stream_seq = 1")?
        .query_row([name], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    let Some((seq, stored_type, text)) = legacy else {
        return Ok(None);
    };
    let seq = to_u64(seq, 0, "seq")?;
    let type_name = TYPES
        .iter()
        .copied()
        .find(|t| *t == stored_type)
        .ok_or_else(|| Error::corrupt(seq, format!("unknown type {stored_type:?}")))?;
    let payload = serde_json::from_str(&text).map_err(|e| Error::corrupt(seq, format!("payload is not JSON: {e}")))?;
    Ok(Some((type_name, payload)))
}

/// The largest stored seq and its hash (0 and the genesis hash for an empty log).
pub(crate) fn head(conn: &Connection) -> Result<(u64, String)> {
    let compact: Option<(i64, Vec<u8>)> = conn
        .prepare_cached("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    if let Some((seq, hash)) = compact {
        return Ok((to_u64(seq, 0, "seq")?, hash_hex(&hash)));
    }
    let legacy: Option<(i64, String)> = conn
        .prepare_cached("SELECT seq, hash FROM events_v1 ORDER BY seq DESC LIMIT 1")?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    match legacy {
        Some((seq, hash)) => Ok((to_u64(seq, 0, "seq")?, hash)),
        None => Ok((0, GENESIS_HASH.to_owned())),
    }
}

/// The number of events on a stream so far (its last `stream_seq`), from whichever table
/// holds its latest event.
pub(crate) fn stream_length(conn: &Connection, stream_id: Option<i64>, name: &str) -> Result<u64> {
    if let Some(id) = stream_id {
        let max: Option<i64> = conn
            .prepare_cached("SELECT max(stream_seq) FROM events WHERE stream = ?1")?
            .query_row([id], |row| row.get(0))?;
        if let Some(max) = max {
            return to_u64(max, 0, "stream_seq");
        }
    }
    let max: Option<i64> = conn
        .prepare_cached("SELECT max(stream_seq) FROM events_v1 WHERE stream = ?1")?
        .query_row([name], |row| row.get(0))?;
    to_u64(max.unwrap_or(0), 0, "stream_seq")
}

/// Whether event `stream_seq - 1` of the stream exists below `seq`: the check that a stream
/// has no gap at `stream_seq`, one index lookup per event.
pub(crate) fn follows_in_stream(conn: &Connection, stream: &StreamId, stream_seq: u64, seq: u64) -> Result<bool> {
    if stream_seq == 1 {
        return Ok(true);
    }
    let (name, before) = (stream.as_str(), to_i64(stream_seq - 1));
    let compact: Option<i64> = conn
        .prepare_cached(
            "SELECT e.seq FROM events e JOIN streams s ON s.id = e.stream WHERE s.name = ?1 AND e.stream_seq = ?2",
        )?
        .query_row(params![name, before], |row| row.get(0))
        .optional()?;
    let found = match compact {
        Some(found) => Some(found),
        None => conn
            .prepare_cached("SELECT seq FROM events_v1 WHERE stream = ?1 AND stream_seq = ?2")?
            .query_row(params![name, before], |row| row.get(0))
            .optional()?,
    };
    Ok(found.is_some_and(|found| found < to_i64(seq)))
}

/// One event about to be appended, already encoded.
#[derive(Debug)]
pub(crate) struct NewEvent<'a> {
    pub(crate) seq: u64,
    pub(crate) stream: i64,
    pub(crate) stream_name: &'a str,
    pub(crate) stream_seq: u64,
    pub(crate) type_code: i64,
    pub(crate) at: i64,
    pub(crate) actor: i64,
    pub(crate) cause_run: Option<i64>,
    pub(crate) cause_parent: Option<u64>,
    pub(crate) payload: &'a [u8],
    pub(crate) hash: &'a [u8],
}

/// The global sequence of `stream`'s first event, in whichever table holds it (`None` when
/// the stream has none): one indexed read of `UNIQUE (stream, stream_seq)`.
pub(crate) fn first_seq(conn: &Connection, stream: &StreamId) -> Result<Option<u64>> {
    let seq: Option<i64> = conn
        .prepare_cached(
            "SELECT e.seq FROM events e JOIN streams s ON s.id = e.stream WHERE s.name = ?1 AND e.stream_seq = 1 \
             UNION ALL SELECT seq FROM events_v1 WHERE stream = ?1 AND stream_seq = 1 LIMIT 1",
        )?
        .query_row([stream.as_str()], |row| row.get(0))
        .optional()?;
    seq.map(|s| to_u64(s, 0, "seq")).transpose()
}

/// Appends one event. A collision on `seq` or on `(stream, stream_seq)` — a writer appending
/// from a stale view of the log — becomes [`Error::Conflict`]: the row is not written, so
/// the log cannot fork.
pub(crate) fn insert_event(conn: &Connection, row: &NewEvent<'_>) -> Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO events (seq, stream, stream_seq, type, at, actor, cause_run, payload, hash, cause_parent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    let inserted = statement.execute(params![
        to_i64(row.seq),
        row.stream,
        to_i64(row.stream_seq),
        row.type_code,
        row.at,
        row.actor,
        row.cause_run,
        row.payload,
        row.hash,
        row.cause_parent.map(to_i64),
    ]);
    match inserted {
        Ok(_) => Ok(()),
        Err(error) if error.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
            Err(classify_conflict(conn, row).unwrap_or(Error::Sqlite(error)))
        }
        Err(error) => Err(error.into()),
    }
}

/// Names the conflict a refused insert ran into, or `None` if it was another constraint.
fn classify_conflict(conn: &Connection, row: &NewEvent<'_>) -> Option<Error> {
    let found = stream_length(conn, Some(row.stream), row.stream_name).ok()?;
    if found >= row.stream_seq {
        return Some(Error::Conflict { stream: row.stream_name.to_owned(), expected: row.stream_seq, found });
    }
    let (found, _) = head(conn).ok()?;
    (found >= row.seq).then(|| Error::Conflict { stream: "*".to_owned(), expected: row.seq, found })
}

/// The id of stream `name`, if it has one.
pub(crate) fn stream_id(conn: &Connection, name: &str) -> Result<Option<i64>> {
    Ok(conn.prepare_cached("SELECT id FROM streams WHERE name = ?1")?.query_row([name], |row| row.get(0)).optional()?)
}

/// The id of stream `name`, given it the next one if it has none yet.
pub(crate) fn ensure_stream(conn: &Connection, name: &str) -> Result<i64> {
    if let Some(id) = stream_id(conn, name)? {
        return Ok(id);
    }
    conn.prepare_cached("INSERT INTO streams (name) VALUES (?1)")?.execute([name])?;
    Ok(conn.last_insert_rowid())
}

/// The id of actor `name`, given it the next one if it has none yet.
pub(crate) fn ensure_actor(conn: &Connection, name: &str) -> Result<i64> {
    let found: Option<i64> =
        conn.prepare_cached("SELECT id FROM actors WHERE name = ?1")?.query_row([name], |row| row.get(0)).optional()?;
    if let Some(id) = found {
        return Ok(id);
    }
    conn.prepare_cached("INSERT INTO actors (name) VALUES (?1)")?.execute([name])?;
    Ok(conn.last_insert_rowid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::event::{IntentDefinition, IntentKey};
    use engine::provider::{Capability, EffectKind};
    use serde_json::json;

    #[test]
    fn every_type_has_a_distinct_code() {
        for (i, name) in TYPES.iter().enumerate() {
            assert_eq!(type_code(name), i as i64 + 1);
            assert_eq!(type_name(i as i64 + 1, 0).expect("known"), *name);
        }
        assert!(type_name(0, 0).is_err());
        assert!(type_name(TYPES.len() as i64 + 1, 0).is_err());
    }

    #[test]
    fn a_payload_without_its_stream_fields_unpacks_to_the_same_event() {
        let key = IntentKey::new(EffectKind::Charge, "7c9e6679-7425-40de-944b-e07fc1f90ae7", "bench_intent_1");
        let reserved = Event::IntentReserved {
            intent: IntentDefinition {
                key: key.clone(),
                kind: EffectKind::Charge,
                tenant: "7c9e6679-7425-40de-944b-e07fc1f90ae7".to_owned(),
                intent_id: "bench_intent_1".to_owned(),
                order_id: "o1".to_owned(),
                business_ref: "o1".to_owned(),
                fingerprint: "ab".repeat(32),
                amount_minor: 4900,
                currency: "EUR".to_owned(),
                payload: json!({"amount_minor": 4900}),
                tool: None,
            },
            run_id: RunId::new("96fb8b79-660d-46fa-a6cf-17002314e6cf"),
            capability: Capability {
                dedup_by_key: true,
                lookup: true,
                key_window_ms: 1,
                consistency_window_ms: 2,
                request_timeout_ms: 3,
            },
            attempts_max: 3,
            reconciliations_max: 5,
            approval_required: false,
            policy: None,
            approval_lowered_by: None,
        };
        // A tenant holding ':' cannot be split back from the key: it is kept.
        let colon = IntentKey::new(EffectKind::Refund, "a:b", "c");
        let run = RunId::new("r1");
        let cases = [
            (key.stream(), reserved),
            (key.stream(), Event::AttemptStarted { key: key.clone(), attempt: 1, run_id: run.clone() }),
            (colon.stream(), Event::ApprovalExpired { key: colon.clone() }),
            (
                run.stream(),
                Event::RunFinished {
                    run_id: run.clone(),
                    status: engine::event::RunStatus::Completed,
                    detail: None,
                    cost_minor: None,
                },
            ),
            (
                run.stream(),
                Event::StepRecorded {
                    run_id: run.clone(),
                    position: 0,
                    name: format!("intent:{key}"),
                    output: serde_json::Value::String(key.as_str().to_owned()),
                },
            ),
            // Not a link: kept whole.
            (
                run.stream(),
                Event::StepRecorded {
                    run_id: run.clone(),
                    position: 1,
                    name: "intent:x".to_owned(),
                    output: json!("y"),
                },
            ),
        ];
        for (stream, event) in cases {
            let packed = pack_payload(&stream, &event);
            let back = unpack_payload(stream.as_str(), event.type_name(), &packed, 1).expect("unpacks");
            assert_eq!(back, event);
            assert!(packed.len() < engine::canonical::to_string(&event.payload()).len() / 2 + 8, "{event:?}");
        }
    }
}
