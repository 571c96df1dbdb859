//! Events to rows and back: the one place that knows the `events` columns.
//!
//! Every event read back is checked before anyone folds it (STYLE rule 6, "assert at both
//! ends"): its payload must decode, its hash must match the chain computation over its own
//! columns, and, when folded, it must follow the previous event (global sequence, stream
//! sequence, previous hash). A failure is [`Error::Corrupt`] naming the sequence, never a
//! panic.

use crate::error::{Error, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use engine::event::{Cause, Event, StoredEvent, StreamId, chain_hash};
use engine::ledger::Ledger;
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

/// The text form of every instant the store writes: RFC 3339, UTC, microseconds, `Z`. The
/// writer truncates its clock to microseconds, so `at` round-trips exactly; this is also the
/// form `chain_hash` hashes.
pub(crate) fn format_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a time written by [`format_time`].
pub(crate) fn parse_time(text: &str) -> std::result::Result<DateTime<Utc>, chrono::ParseError> {
    DateTime::parse_from_rfc3339(text).map(|at| at.with_timezone(&Utc))
}

/// A SQLite rowid or stream sequence as the engine counts it. Both are checked `>= 1` by the
/// schema, so a negative value means the file was edited by hand.
fn to_u64(value: i64, seq: u64, column: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::corrupt(seq, format!("negative {column} {value}")))
}

/// A sequence as SQLite stores it.
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).expect("sequences and counters stay below i64::MAX: SQLite rowids are i64")
}

/// The `SELECT` list matching [`RawEvent::from_row`].
pub(crate) const EVENT_COLUMNS: &str = "seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash";

/// One `events` row as stored, before any decoding.
#[derive(Clone, Debug)]
pub(crate) struct RawEvent {
    pub(crate) seq: i64,
    pub(crate) stream: String,
    pub(crate) stream_seq: i64,
    pub(crate) type_name: String,
    pub(crate) at: String,
    pub(crate) cause: String,
    pub(crate) payload: String,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
}

impl RawEvent {
    /// Reads a row selected with [`EVENT_COLUMNS`].
    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
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

    /// The global sequence, as the engine counts it (0 if the stored value is negative).
    pub(crate) fn seq(&self) -> u64 {
        u64::try_from(self.seq).unwrap_or(0)
    }

    /// Decodes the row into the engine's envelope without checking its hash.
    pub(crate) fn decode(&self) -> Result<StoredEvent> {
        let seq = to_u64(self.seq, 0, "seq")?;
        let stream_seq = to_u64(self.stream_seq, seq, "stream_seq")?;
        let at =
            parse_time(&self.at).map_err(|e| Error::corrupt(seq, format!("time {:?} does not parse: {e}", self.at)))?;
        let cause: Cause = serde_json::from_str(&self.cause)
            .map_err(|e| Error::corrupt(seq, format!("cause does not decode: {e}")))?;
        let payload: serde_json::Value = serde_json::from_str(&self.payload)
            .map_err(|e| Error::corrupt(seq, format!("payload is not JSON: {e}")))?;
        let event = Event::from_stored(&self.type_name, &payload)
            .map_err(|e| Error::corrupt(seq, format!("{} payload does not decode: {e}", self.type_name)))?;
        Ok(StoredEvent {
            seq,
            stream: StreamId::from_stored(self.stream.clone()),
            stream_seq,
            at,
            cause,
            event,
            prev_hash: self.prev_hash.clone(),
            hash: self.hash.clone(),
        })
    }

    /// Decodes the row and checks that its stored hash is the chain hash of its own columns
    /// (over its stored `prev_hash`; linking to the previous event is the fold's check).
    pub(crate) fn decode_checked(&self) -> Result<StoredEvent> {
        let stored = self.decode()?;
        let computed = recompute_hash(&stored);
        if computed != stored.hash {
            return Err(Error::corrupt(
                stored.seq,
                format!("hash mismatch (stored {}, computed {computed})", stored.hash),
            ));
        }
        Ok(stored)
    }
}

/// The chain hash of a decoded event, from its own fields.
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

/// Calls `each` with every event whose seq is above `after`, in seq order.
pub(crate) fn scan_events(conn: &Connection, after: u64, mut each: impl FnMut(RawEvent) -> Result<()>) -> Result<()> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE seq > ?1 ORDER BY seq"))?;
    let mut rows = statement.query([to_i64(after)])?;
    while let Some(row) = rows.next()? {
        each(RawEvent::from_row(row)?)?;
    }
    Ok(())
}

/// Checks that `stored` is the next event for `ledger`: the sequence after its last, the
/// stream after its last on that stream, the stream its event belongs on, and chained to its
/// last hash. These are exactly the conditions under which `Ledger::apply` must not panic
/// for structural reasons, so a corrupt log becomes an error instead.
pub(crate) fn check_follows(ledger: &Ledger, stored: &StoredEvent) -> Result<()> {
    let seq = stored.seq;
    if seq != ledger.last_seq() + 1 {
        return Err(Error::corrupt(seq, format!("expected seq {} next (gap or duplicate)", ledger.last_seq() + 1)));
    }
    let belongs = stored.event.stream();
    if stored.stream != belongs {
        return Err(Error::corrupt(
            seq,
            format!("stored on stream {} but the event belongs on {belongs}", stored.stream),
        ));
    }
    let expected = ledger.stream_length(&stored.stream) + 1;
    if stored.stream_seq != expected {
        return Err(Error::corrupt(
            seq,
            format!("stream_seq {} on stream {}, expected {expected}", stored.stream_seq, stored.stream),
        ));
    }
    if stored.prev_hash != ledger.last_hash() {
        return Err(Error::corrupt(
            seq,
            format!("prev_hash mismatch (stored {}, previous event's hash {})", stored.prev_hash, ledger.last_hash()),
        ));
    }
    Ok(())
}

/// Folds every event after `ledger.last_seq()` into `ledger`, checking each one first.
/// Returns how many were folded.
pub(crate) fn fold_new_events(conn: &Connection, ledger: &mut Ledger) -> Result<u64> {
    let mut folded = 0;
    scan_events(conn, ledger.last_seq(), |raw| {
        let stored = raw.decode_checked()?;
        check_follows(ledger, &stored)?;
        ledger.try_apply(&stored).map_err(|e| Error::corrupt(e.seq, e.to_string()))?;
        folded += 1;
        Ok(())
    })?;
    Ok(folded)
}

/// Reads and decodes (hash-checked) the events after `after`, for readers.
pub(crate) fn events_after(conn: &Connection, after: u64) -> Result<Vec<StoredEvent>> {
    let mut out = Vec::new();
    scan_events(conn, after, |raw| {
        out.push(raw.decode_checked()?);
        Ok(())
    })?;
    Ok(out)
}

/// Reads one stream's events in stream order.
pub(crate) fn stream_events(conn: &Connection, stream: &StreamId) -> Result<Vec<StoredEvent>> {
    let mut statement =
        conn.prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream = ?1 ORDER BY stream_seq"))?;
    let mut rows = statement.query([stream.as_str()])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(RawEvent::from_row(row)?.decode_checked()?);
    }
    Ok(out)
}

/// The largest stored seq (0 for an empty log).
pub(crate) fn max_seq(conn: &Connection) -> Result<u64> {
    let max: Option<i64> = conn.prepare_cached("SELECT max(seq) FROM events")?.query_row([], |row| row.get(0))?;
    to_u64(max.unwrap_or(0), 0, "max(seq)")
}

/// One event about to be appended, already encoded.
#[derive(Debug)]
pub(crate) struct NewEvent<'a> {
    pub(crate) seq: u64,
    pub(crate) stream: &'a str,
    pub(crate) stream_seq: u64,
    pub(crate) type_name: &'a str,
    pub(crate) at: &'a str,
    pub(crate) cause: &'a str,
    pub(crate) payload: &'a str,
    pub(crate) prev_hash: &'a str,
    pub(crate) hash: &'a str,
}

/// Appends one event. A collision on `seq` or on `(stream, stream_seq)` — a writer appending
/// from a stale view of the log — becomes [`Error::Conflict`]: the row is not written, so
/// the log cannot fork.
pub(crate) fn insert_event(conn: &Connection, row: &NewEvent<'_>) -> Result<()> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO events (seq, stream, stream_seq, type, at, cause, payload, prev_hash, hash) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let inserted = statement.execute(params![
        to_i64(row.seq),
        row.stream,
        to_i64(row.stream_seq),
        row.type_name,
        row.at,
        row.cause,
        row.payload,
        row.prev_hash,
        row.hash,
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
    let found_in_stream: Option<i64> = conn
        .query_row("SELECT max(stream_seq) FROM events WHERE stream = ?1", [row.stream], |r| r.get(0))
        .optional()
        .ok()
        .flatten()
        .flatten();
    if let Some(found) = found_in_stream.and_then(|f| u64::try_from(f).ok())
        && found >= row.stream_seq
    {
        return Some(Error::Conflict { stream: row.stream.to_owned(), expected: row.stream_seq, found });
    }
    let found = max_seq(conn).ok()?;
    (found >= row.seq).then(|| Error::Conflict { stream: "*".to_owned(), expected: row.seq, found })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Options, open_writer};

    fn row<'a>(seq: u64, stream: &'a str, stream_seq: u64, hash: &'a str) -> NewEvent<'a> {
        NewEvent {
            seq,
            stream,
            stream_seq,
            type_name: "RunStarted",
            at: "2025-03-01T12:00:00.000000Z",
            cause: r#"{"actor":"test"}"#,
            payload: "{}",
            prev_hash: engine::event::GENESIS_HASH,
            hash,
        }
    }

    #[test]
    fn a_writer_appending_from_a_stale_view_gets_a_conflict_not_a_fork() {
        let dir = tempfile::tempdir().expect("temp dir");
        let conn = open_writer(&dir.path().join("keel.db"), &Options::default()).expect("open");
        let hash = "a".repeat(64);
        insert_event(&conn, &row(1, "run:a", 1, &hash)).expect("first");
        insert_event(&conn, &row(2, "run:a", 2, &hash)).expect("second");

        // Fresh global position, stale stream position: the UNIQUE(stream, stream_seq) guard.
        match insert_event(&conn, &row(3, "run:a", 2, &hash)) {
            Err(Error::Conflict { stream, expected, found }) => {
                assert_eq!((stream.as_str(), expected, found), ("run:a", 2, 2));
            }
            other => panic!("expected a stream conflict, got {other:?}"),
        }
        // Stale global position on another stream: the seq primary key.
        match insert_event(&conn, &row(2, "run:b", 1, &hash)) {
            Err(error @ Error::Conflict { .. }) => {
                assert!(error.is_retryable());
                assert!(matches!(error, Error::Conflict { ref stream, expected: 2, found: 2 } if stream == "*"));
            }
            other => panic!("expected a sequence conflict, got {other:?}"),
        }
        assert_eq!(max_seq(&conn).expect("max"), 2);
        let count: i64 = conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0)).expect("count");
        assert_eq!(count, 2, "nothing was written by the stale writer");
    }

    #[test]
    fn another_constraint_stays_a_sqlite_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let conn = open_writer(&dir.path().join("keel.db"), &Options::default()).expect("open");
        let error = insert_event(&conn, &row(1, "run:a", 1, "short")).expect_err("CHECK(length(hash) = 64)");
        assert!(matches!(error, Error::Sqlite(_)), "{error:?}");
        assert!(!error.is_retryable());
    }
}
