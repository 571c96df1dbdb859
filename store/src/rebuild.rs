//! Rebuilding entity rows from the events, stream by stream, in bounded memory.
//!
//! Owns [`replay_streams`]: every stream in id order, each read alone through its
//! `(stream, stream_seq)` index and folded with `engine::ledger::fold` (`intent_alone`, `history`) — the fold the
//! writer runs — into the entity it is about. Version 3's migration writes what it finds
//! ([`write`]); `verify` compares it with the rows.
//!
//! Memory is one stream's events at a time, plus one counter per run that made network
//! retries (an `AttemptStarted` on an intent's stream that counts against the run driving
//! it, [`Run::network_retries`]): intent streams are replayed first, counting those, then
//! run streams.

use crate::codec::{self, to_i64};
use crate::error::{Error, Result};
use crate::rows;
use engine::event::{Event, RunId, StoredEvent, StreamId};
use engine::ledger::fold;
use engine::ledger::{Intent, Run};
use rusqlite::{Connection, params};
use std::collections::HashMap;

/// What replaying one stream alone found.
pub(crate) enum Found {
    /// An intent's stream.
    Intent {
        /// Its stream id.
        stream: i64,
        /// Its run's stream id.
        run: i64,
        /// Its state.
        intent: Box<Intent>,
    },
    /// A run's stream.
    Run {
        /// Its stream id.
        stream: i64,
        /// Its state.
        run: Box<Run>,
    },
    /// A name with no events (a run only named by a cause).
    Empty,
    /// The stream does not replay: the first bad event and what is wrong with it.
    Broken {
        /// Its sequence.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
}

/// Reads a stream's events in stream order, decoded (not hash-checked: the chain pass of
/// `verify` and the open-time tail check do that), checking that they number 1, 2, 3 … and
/// belong on it.
fn read_stream(conn: &Connection, name: &str) -> Result<std::result::Result<Vec<StoredEvent>, (u64, String)>> {
    let mut events = Vec::new();
    let mut failure = None;
    let stream = StreamId::from_stored(name.to_owned());
    let each = |stored: StoredEvent, events: &mut Vec<StoredEvent>, failure: &mut Option<(u64, String)>| {
        if failure.is_some() {
            return;
        }
        let expected = events.len() as u64 + 1;
        if stored.stream_seq != expected {
            *failure =
                Some((stored.seq, format!("stream_seq {} on stream {name}, expected {expected}", stored.stream_seq)));
        } else if stored.event.stream() != stream {
            *failure = Some((
                stored.seq,
                format!("stored on stream {name} but the event belongs on {}", stored.event.stream()),
            ));
        } else {
            events.push(stored);
        }
    };
    let scanned = codec::scan_stream(conn, &stream, &mut |stored| {
        each(stored, &mut events, &mut failure);
        Ok(())
    });
    match scanned {
        Ok(()) => Ok(failure.map_or(Ok(events), Err)),
        Err(Error::Corrupt { seq, detail }) => Ok(Err((seq, detail))),
        Err(other) => Err(other),
    }
}

/// Whether run `run_id` started (its stream's first event is its `RunStarted`) before `seq`.
fn started_before(conn: &Connection, run_id: &RunId, seq: u64) -> Result<bool> {
    let name = run_id.stream();
    let Some(id) = codec::stream_id(conn, name.as_str())? else {
        return Ok(false);
    };
    Ok(codec::first_event(conn, id, name.as_str())?
        .is_some_and(|first| first.seq < seq && matches!(first.event, Event::RunStarted { .. })))
}

/// Replays one intent's stream. `retries` gains the network retries it counts against runs.
fn replay_intent(
    conn: &Connection,
    stream: i64,
    events: &[StoredEvent],
    retries: &mut HashMap<RunId, u32>,
) -> Result<Found> {
    let Some(first) = events.first() else {
        return Ok(Found::Empty);
    };
    let (intent, run_retries) = match fold::intent_alone(events) {
        Ok(found) => found,
        Err(error) => return Ok(Found::Broken { seq: error.seq, detail: format!("the fold rejects it: {error}") }),
    };
    if !started_before(conn, &intent.run_id, first.seq)? {
        return Ok(Found::Broken {
            seq: first.seq,
            detail: format!("reserved by run {}, never started", intent.run_id),
        });
    }
    for (run_id, count) in run_retries {
        if !started_before(conn, &run_id, first.seq.max(intent.last_seq))? {
            return Ok(Found::Broken { seq: intent.last_seq, detail: format!("a retry by unknown run {run_id}") });
        }
        *retries.entry(run_id).or_insert(0) += count;
    }
    let run = codec::stream_id(conn, intent.run_id.stream().as_str())?
        .ok_or_else(|| Error::corrupt(first.seq, format!("run {} has no stream", intent.run_id)))?;
    Ok(Found::Intent { stream, run, intent: Box::new(intent) })
}

/// Replays one run's stream, with the network retries counted against it on intent streams.
fn replay_run(stream: i64, events: &[StoredEvent], retries: &mut HashMap<RunId, u32>) -> Found {
    if events.is_empty() {
        return Found::Empty;
    }
    match fold::history(events) {
        Ok(history) => {
            let mut run = history.run;
            run.network_retries = retries.remove(&run.run_id).unwrap_or(0);
            Found::Run { stream, run: Box::new(run) }
        }
        Err(error) => Found::Broken { seq: error.seq, detail: format!("the fold rejects it: {error}") },
    }
}

/// Replays one conversation's facts stream: it has no row, but it must fold (every update
/// under the ticket the conversation had).
fn replay_conversation(events: &[StoredEvent]) -> Found {
    match engine::facts::fold(events) {
        Ok(_) => Found::Empty,
        Err(error) => Found::Broken { seq: error.seq, detail: format!("the fold rejects it: {error}") },
    }
}

/// Replays every stream, intents first, calling `each` with what it finds; `progress` is
/// told how many streams were replayed so far. Returns the number of events read.
pub(crate) fn replay_streams(
    conn: &Connection,
    each: &mut dyn FnMut(Found) -> Result<()>,
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    let mut retries: HashMap<RunId, u32> = HashMap::new();
    let mut done = 0;
    let mut events = 0;
    for intents_pass in [true, false] {
        let mut statement = conn.prepare("SELECT id, name FROM streams ORDER BY id")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let (stream, name): (i64, String) = (row.get(0)?, row.get(1)?);
            if intents_pass != name.starts_with("intent:") {
                continue;
            }
            let found = match read_stream(conn, &name)? {
                Err((seq, detail)) => Found::Broken { seq, detail },
                Ok(stream_events) => {
                    events += stream_events.len() as u64;
                    if intents_pass {
                        replay_intent(conn, stream, &stream_events, &mut retries)?
                    } else if name.starts_with("facts:") {
                        replay_conversation(&stream_events)
                    } else {
                        replay_run(stream, &stream_events, &mut retries)
                    }
                }
            };
            each(found)?;
            done += 1;
            progress(done);
        }
    }
    Ok(events)
}

/// Version 8's Rust half: the unfinished runs written before `wake_at` was folded get it
/// from their own stream (a run whose journal ends on a `TimerStarted` waits on it), and
/// their row and column are rewritten. Reads only the unfinished runs' streams.
pub(crate) fn wake_timers(conn: &Connection) -> Result<()> {
    let unfinished = rows::runs_where(conn, true)?;
    for (stream, mut run) in unfinished {
        let name = run.run_id.stream();
        let events = read_stream(conn, name.as_str())?.map_err(|(seq, detail)| Error::corrupt(seq, detail))?;
        let history = fold::history(&events)
            .map_err(|error| Error::corrupt(error.seq, format!("the fold rejects it: {error}")))?;
        run.wake_at = history.run.wake_at;
        rows::put_run(conn, stream, &run)?;
    }
    Ok(())
}

/// Writes what a replay found as rows (version 3's migration). A stream that does not
/// replay stops the migration: the file is corrupt.
pub(crate) fn write(conn: &Connection, found: Found) -> Result<()> {
    match found {
        Found::Intent { stream, run, intent } => {
            rows::put_intent(conn, stream, run, &intent)?;
            rows::put_intent_maps(conn, stream, &intent)
        }
        Found::Run { stream, run } => rows::put_run_v3(conn, stream, &run),
        Found::Empty => Ok(()),
        Found::Broken { seq, detail } => Err(Error::corrupt(seq, detail)),
    }
}

/// How many `orders` and `refs` entries the intents replayed so far call for, to compare
/// with the tables' counts.
#[derive(Default)]
pub(crate) struct MapCounts {
    pub(crate) orders: u64,
    pub(crate) refs: u64,
}

impl MapCounts {
    /// Counts `intent`'s entries, and says which of them is missing from the tables.
    pub(crate) fn check(&mut self, conn: &Connection, stream: i64, intent: &Intent) -> Result<Option<String>> {
        let definition = &intent.definition;
        self.orders += 1;
        let in_orders: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM orders WHERE tenant = ?1 AND order_id = ?2 AND intent = ?3)")?
            .query_row(params![definition.tenant, definition.order_id, stream], |row| row.get(0))?;
        if !in_orders {
            return Ok(Some(format!("missing from orders under order {}", definition.order_id)));
        }
        if definition.kind == engine::provider::EffectKind::Charge && definition.business_ref != definition.order_id {
            self.refs += 1;
            let in_refs: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM refs WHERE tenant = ?1 AND business_ref = ?2 AND intent = ?3)",
                )?
                .query_row(params![definition.tenant, definition.business_ref, stream], |row| row.get(0))?;
            if !in_refs {
                return Ok(Some(format!("missing from refs under reference {}", definition.business_ref)));
            }
        }
        Ok(None)
    }
}

/// Rows of `table` (`intents` or `runs`) whose stream is not a replayed entity of that kind:
/// their names (or ids, when the stream is gone). Only called when the counts disagree.
pub(crate) fn extra_rows(conn: &Connection, table: &str, prefix: &str) -> Result<Vec<String>> {
    let sql = format!(
        "SELECT t.stream, s.name FROM {table} t LEFT JOIN streams s ON s.id = t.stream \
         WHERE s.name IS NULL OR substr(s.name, 1, ?1) != ?2 \
         OR (NOT EXISTS (SELECT 1 FROM events e WHERE e.stream = t.stream) \
             AND NOT EXISTS (SELECT 1 FROM events_v1 v WHERE v.stream = s.name)) ORDER BY t.stream"
    );
    let mut statement = conn.prepare(&sql)?;
    let rows = statement.query_map(params![to_i64(prefix.len() as u64), prefix], |row| {
        Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
    })?;
    rows.map(|row| {
        let (stream, name) = row?;
        Ok(name.map_or_else(|| format!("stream {stream}"), |n| n.strip_prefix(prefix).unwrap_or(&n).to_owned()))
    })
    .collect()
}
