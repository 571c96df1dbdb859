//! Importing a log decided elsewhere: the PostgreSQL half of `keel migrate` (SQLite to
//! PostgreSQL).
//!
//! Owns [`Import`] (the bounded batches, each one transaction), [`Source`] (what names the
//! log being copied), [`Provenance`] (the `keel_provenance` row: where this log came from,
//! how far its copy went) and [`unfinished`] (what `PgLog::open` asks before it writes).
//!
//! Events arrive whole stream by whole stream, already decided: each keeps its `seq`, its
//! stream, its `stream_seq`, its instant, type, cause and payload byte for byte, and is
//! chained anew on its stream (`engine::append::reseal`) — after its own hash was checked
//! over the source's chain. Each stream's entity row is built by the fold the writers run
//! (`fold::history` for a run, `fold::intent_alone` for an intent, whose network retries are
//! added to the rows of the runs that made them: runs must come first). A batch of streams,
//! its rows and the provenance row's progress commit together, so an interrupted import
//! resumes after the last stream it committed.
//!
//! It must never decide anything (no number, no parent, no instant) nor write into a log
//! that holds anything but this same import: a stream that would break its chain, its
//! numbering or its fold is refused, and the whole batch with it.

use crate::error::{Error, Result};
use crate::rows;
use chrono::{DateTime, Utc};
use engine::append::Sealed;
use engine::event::{GENESIS_HASH, RunId, StoredEvent, StreamId};
use engine::ledger::{Intent, Run};
use engine::limits::PG_IMPORT_BATCH_EVENTS;
use postgres::{Client, Transaction};
use serde::Serialize;
use std::collections::BTreeMap;

/// The log being imported, as its own verification named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The hash of its chain's last event (the genesis hash for an empty log).
    pub head_hash: String,
    /// How many events it holds.
    pub events: u64,
}

/// The `keel_provenance` row: the log this one was imported from, and how far the copy went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Provenance {
    /// What kind of log it came from (`sqlite`).
    pub source: String,
    /// The source chain's head hash when the import started.
    pub source_head: String,
    /// The source's event count.
    pub source_events: u64,
    /// Events copied so far.
    pub copied_events: u64,
    /// The last stream copied whole (in the caller's order), `None` before the first.
    pub cursor: Option<String>,
    /// When the import started.
    pub started_at: DateTime<Utc>,
    /// When it finished; `None` while it is unfinished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// How [`Import::begin`] found the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Empty: the import starts from the first stream.
    Fresh,
    /// Holding this same import, interrupted: it goes on after `cursor`.
    Resumed(Provenance),
}

/// An import in progress, on its own connection.
pub struct Import {
    client: Client,
    provenance: Provenance,
    /// Whole streams waiting for the next batch.
    pending: Vec<Vec<StoredEvent>>,
    pending_events: usize,
}

const PROVENANCE_COLUMNS: &str = "source, source_head, source_events, copied_events, cursor, started_at, finished_at";

/// The provenance row, if the log has one.
pub(crate) fn provenance(client: &mut impl postgres::GenericClient) -> Result<Option<Provenance>> {
    let row = client.query_opt(&format!("SELECT {PROVENANCE_COLUMNS} FROM keel_provenance WHERE id = 1"), &[])?;
    row.map(|row| {
        let count = |i: usize, what: &str| {
            u64::try_from(row.get::<_, i64>(i)).map_err(|_| Error::corrupt(0, format!("keel_provenance {what}")))
        };
        Ok(Provenance {
            source: row.get(0),
            source_head: row.get(1),
            source_events: count(2, "source_events")?,
            copied_events: count(3, "copied_events")?,
            cursor: row.get(4),
            started_at: row.get(5),
            finished_at: row.get(6),
        })
    })
    .transpose()
}

/// The unfinished import this log holds, if any: a log half imported must not be written to.
///
/// # Errors
///
/// PostgreSQL's.
pub fn unfinished(client: &mut Client) -> Result<Option<Provenance>> {
    Ok(provenance(client)?.filter(|found| found.finished_at.is_none()))
}

/// The first thing the target database holds, said in words (`the table public.unrelated`);
/// `None` when it holds nothing: no table, view, sequence or index in any schema of its own,
/// Keel's or another application's. PostgreSQL's own schemas (`pg_*`, `information_schema`)
/// do not count.
fn contents(tx: &mut Transaction<'_>) -> Result<Option<String>> {
    let found = tx.query_opt(
        "SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' \
         ORDER BY n.nspname, c.relname LIMIT 1",
        &[],
    )?;
    Ok(found.map(|row| {
        let (schema, name, kind): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let kind = match kind.as_str() {
            "r" | "p" => "table",
            "v" => "view",
            "m" => "materialized view",
            "S" => "sequence",
            "i" | "I" => "index",
            "f" => "foreign table",
            _ => "relation",
        };
        format!("it holds the {kind} {schema}.{name}")
    }))
}

/// Whether the target holds an import's provenance row (finished or not): then the import's
/// own rules apply (resume the same source, refuse another or a finished one).
fn holds_import(tx: &mut Transaction<'_>) -> Result<bool> {
    let table: bool = tx.query_one("SELECT to_regclass('keel_provenance') IS NOT NULL", &[])?.get(0);
    Ok(table && provenance(tx)?.is_some())
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).expect("counts and sequences stay below 2^63: PostgreSQL's bigint")
}

impl Import {
    /// Connects to `url`, brings its schema up to date, and starts importing `source`: into
    /// an empty log (a new provenance row, stamped `now`), or after the last stream an
    /// interrupted import of the same source committed.
    ///
    /// # Errors
    ///
    /// [`Error::NotEmpty`] for a log holding anything else (nothing is written),
    /// [`Error::OtherImport`] for one half-imported from another source (or another state of
    /// this one), [`Error::Imported`] for one whose import already finished; PostgreSQL's.
    pub fn begin(url: &str, source: &Source, now: DateTime<Utc>) -> Result<(Import, Start)> {
        let mut client = crate::writer::connect(url)?;
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&IMPORT_LOCK])?;
        // Checked before Keel's schema is created, in the transaction that creates it and
        // records the import: a target without an import of its own must hold nothing at all,
        // and a failed start leaves it as it was.
        if !holds_import(&mut tx)?
            && let Some(what) = contents(&mut tx)?
        {
            return Err(Error::NotEmpty { what });
        }
        crate::schema::migrate_in(&mut tx)?;
        let start = match provenance(&mut tx)? {
            Some(found) if found.finished_at.is_some() => return Err(Error::Imported { found: Box::new(found) }),
            Some(found) if found.source_head != source.head_hash || found.source_events != source.events => {
                return Err(Error::OtherImport { found: Box::new(found) });
            }
            Some(found) => Start::Resumed(found),
            None => {
                tx.execute(
                    "INSERT INTO keel_provenance (id, source, source_head, source_events, copied_events, started_at) \
                     VALUES (1, 'sqlite', $1, $2, 0, $3)",
                    &[&source.head_hash, &to_i64(source.events), &now],
                )?;
                Start::Fresh
            }
        };
        let provenance = provenance(&mut tx)?.expect("the row was read or written just above, in this transaction");
        tx.commit()?;
        Ok((Import { client, provenance, pending: Vec::new(), pending_events: 0 }, start))
    }

    /// Where the import stands (as last committed).
    pub fn provenance(&self) -> &Provenance {
        &self.provenance
    }

    /// Adds one whole stream, in stream order; commits a batch once `PG_IMPORT_BATCH_EVENTS`
    /// events wait (a stream is never split: a larger one is a batch alone). An empty stream
    /// (a name without events) is skipped.
    ///
    /// # Errors
    ///
    /// [`Error::ImportRefused`] for a stream that would break its chain, its numbering or
    /// its fold (the batch it was in is not written); PostgreSQL's.
    pub fn push_stream(&mut self, events: Vec<StoredEvent>) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        self.pending_events += events.len();
        self.pending.push(events);
        if self.pending_events >= PG_IMPORT_BATCH_EVENTS { self.commit_pending() } else { Ok(()) }
    }

    /// Commits the streams waiting, their rows and the progress, in one transaction (the
    /// import stays unfinished: [`Import::finish`] ends it, once the caller checked the copy).
    ///
    /// # Errors
    ///
    /// As [`Import::push_stream`]; [`Error::OtherImport`] when another process moved the
    /// import on meanwhile (nothing of this batch is written).
    pub fn commit_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let streams = std::mem::take(&mut self.pending);
        self.pending_events = 0;
        let mut tx = self.client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&IMPORT_LOCK])?;
        // Another process importing into the same log moved the cursor: refuse, never interleave.
        let found = provenance(&mut tx)?.ok_or_else(|| Error::corrupt(0, "keel_provenance vanished"))?;
        if found != self.provenance {
            return Err(Error::OtherImport { found: Box::new(found) });
        }
        refuse_streams_held(&mut tx, &streams)?;
        let mut copied = 0;
        let mut cursor = None;
        let mut batch = Batch::default();
        for events in streams {
            copied += events.len() as u64;
            cursor = Some(events[0].stream.as_str().to_owned());
            batch.add(events)?;
        }
        batch.write(&mut tx)?;
        let copied = self.provenance.copied_events + copied;
        tx.execute(
            "UPDATE keel_provenance SET copied_events = $1, cursor = $2 WHERE id = 1",
            &[&to_i64(copied), &cursor],
        )?;
        // Whoever appends after the import numbers after every imported event.
        tx.execute("SELECT setval('events_seq', (SELECT max(seq) FROM events))", &[])?;
        tx.commit()?;
        self.provenance.copied_events = copied;
        self.provenance.cursor = cursor;
        Ok(())
    }

    /// Commits what waits and marks the import finished at `now`: from then on the log is
    /// an ordinary one, open to writers.
    ///
    /// # Errors
    ///
    /// As [`Import::push_stream`]; [`Error::ImportRefused`] when fewer or more events were
    /// copied than the source holds.
    pub fn finish(mut self, now: DateTime<Utc>) -> Result<Provenance> {
        self.commit_pending()?;
        let Provenance { copied_events, source_events, .. } = self.provenance;
        if copied_events != source_events {
            return Err(Error::ImportRefused {
                seq: 0,
                stream: String::new(),
                detail: format!("{copied_events} events copied, the source holds {source_events}"),
            });
        }
        self.client.execute("UPDATE keel_provenance SET finished_at = $1 WHERE id = 1", &[&now])?;
        self.provenance.finished_at = Some(now);
        Ok(self.provenance)
    }
}

/// The advisory lock an import's transactions take: one import at a time per log. A
/// negative constant of its own, like the migrations' (-7100).
const IMPORT_LOCK: i64 = -7101;

fn refused(stored: &StoredEvent, detail: impl Into<String>) -> Error {
    Error::ImportRefused { seq: stored.seq, stream: stored.stream.as_str().to_owned(), detail: detail.into() }
}

/// Refuses a batch naming a stream twice, or a stream that already holds events in the target.
fn refuse_streams_held(tx: &mut Transaction<'_>, streams: &[Vec<StoredEvent>]) -> Result<()> {
    let mut names = BTreeMap::new();
    for events in streams {
        if names.insert(events[0].stream.as_str(), &events[0]).is_some() {
            return Err(refused(&events[0], "the stream comes twice in one import"));
        }
    }
    let listed: Vec<&str> = names.keys().copied().collect();
    match rows::streams_holding_events(tx, &listed)?.first().and_then(|held| names.get(held.as_str())) {
        Some(first) => Err(refused(first, "the stream already holds events in the target")),
        None => Ok(()),
    }
}

/// What one batch writes, gathered before anything is: its events chained anew, and the rows
/// they fold into — written in a few statements (arrays unnested), not a round trip a row.
#[derive(Default)]
struct Batch {
    sealed: Vec<Sealed>,
    /// Each intent with its `IntentReserved`'s sequence and its stream's length.
    intents: Vec<(Intent, u64, u64)>,
    /// The runs folded in this batch, with their streams' lengths.
    runs: BTreeMap<RunId, (Run, u64)>,
    /// Network retries counted on intent streams, per run: the count and the first event of
    /// the intent stream that counted them (named when the run was never imported).
    retries: BTreeMap<RunId, (u32, StoredEvent)>,
}

impl Batch {
    /// Checks one stream's numbering, re-chains it and folds it into its entity row.
    fn add(&mut self, events: Vec<StoredEvent>) -> Result<()> {
        let stream = events[0].stream.clone();
        let first = self.sealed.len();
        for (i, stored) in events.into_iter().enumerate() {
            let previous = (i > 0).then(|| &self.sealed[self.sealed.len() - 1].stored);
            if stored.stream != stream || stored.event.stream() != stream {
                return Err(refused(&stored, format!("not an event of stream {stream}")));
            }
            if stored.stream_seq != i as u64 + 1 {
                return Err(refused(&stored, format!("stream_seq {}, expected {}", stored.stream_seq, i + 1)));
            }
            if stored.seq == 0 || previous.is_some_and(|p| p.seq >= stored.seq) {
                return Err(refused(&stored, "a sequence not above its stream's previous one"));
            }
            let prev_hash = previous.map_or(GENESIS_HASH, |p| p.hash.as_str()).to_owned();
            let seq = stored.seq;
            self.sealed.push(engine::append::reseal(stored, &prev_hash).map_err(|e| Error::ImportRefused {
                seq,
                stream: stream.as_str().to_owned(),
                detail: e.to_string(),
            })?);
        }
        let events: Vec<StoredEvent> = self.sealed[first..].iter().map(|s| s.stored.clone()).collect();
        self.fold(&stream, &events)
    }

    /// The entity row of one stream, folded alone as the writers fold it.
    fn fold(&mut self, stream: &StreamId, events: &[StoredEvent]) -> Result<()> {
        let first = &events[0];
        let len = events.len() as u64;
        let fold_refused =
            |e: engine::ledger::FoldError| refused(first, format!("the fold rejects seq {}: {e}", e.seq));
        let name = stream.as_str();
        if name.starts_with("run:") {
            let run = engine::ledger::fold::history(events).map_err(fold_refused)?.run;
            self.runs.insert(run.run_id.clone(), (run, len));
        } else if name.starts_with("intent:") {
            let (intent, retries) = engine::ledger::fold::intent_alone(events).map_err(fold_refused)?;
            self.intents.push((intent, first.seq, len));
            for (run_id, n) in retries {
                self.retries.entry(run_id).or_insert_with(|| (0, first.clone())).0 += n;
            }
        } else if name.starts_with("facts:") {
            engine::facts::fold(events).map_err(fold_refused)?;
        } else {
            return Err(refused(first, "a stream of no known kind"));
        }
        Ok(())
    }

    /// Inserts the events and writes the rows, the network retries added to the rows of the
    /// runs that made them (in this batch, or imported before it).
    fn write(mut self, tx: &mut Transaction<'_>) -> Result<()> {
        rows::insert_events(tx, &self.sealed)?;
        let elsewhere: Vec<&str> =
            self.retries.keys().filter(|run_id| !self.runs.contains_key(*run_id)).map(RunId::as_str).collect();
        for row in rows::runs_rows(tx, &elsewhere)? {
            let run = row.run()?;
            self.runs.insert(run.run_id.clone(), (run, row.stream_len));
        }
        for (run_id, (n, first)) in self.retries {
            let (run, _) = self
                .runs
                .get_mut(&run_id)
                .ok_or_else(|| refused(&first, format!("a retry by run {run_id}, not imported before it")))?;
            run.network_retries += n;
        }
        let runs: Vec<(&Run, u64)> = self.runs.values().map(|(run, len)| (run, *len)).collect();
        rows::put_runs(tx, &runs)?;
        let intents: Vec<rows::IntentRow<'_>> = self.intents.iter().map(|(i, seq, len)| (i, *seq, *len)).collect();
        rows::put_intents(tx, &intents)
    }
}
