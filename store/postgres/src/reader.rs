//! Reading the PostgreSQL log outside any command: one stream, one intent, one run, the
//! whole-log fold, and [`verify`].
//!
//! Every read runs in its own REPEATABLE READ, read-only transaction on a connection of its
//! own, so it sees one snapshot and never takes an entity's lock (it never delays a writer).
//!
//! # Cost
//!
//! [`PgReader::stream`], [`PgReader::intent`] and [`PgReader::run`] read what they return
//! through an index, as [`PgReader::run_state`] does a run and its intents.
//! [`PgReader::each_intent`] and [`PgReader::each_run`] read a page at a time (a keyset cursor
//! on an index), holding one page in memory. [`PgReader::ledger`] folds the whole log into memory (checkers and tests
//! only). [`PgReader::verify`] reads everything, a page of streams in memory at a time (their
//! names, events and rows), plus one retry counter per run that made network retries.

use crate::error::{Error, Result};
use crate::rows::{self, EVENT_COLUMNS, EntityRow};
use engine::event::{GENESIS_HASH, IntentKey, RunId, StoredEvent, StreamId};
use engine::ledger::{Intent, IntentStatus, Ledger, Run};
use postgres::{Client, IsolationLevel, Transaction};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroUsize;

/// Mismatches [`PgReader::verify`] lists before it only counts them.
pub const VERIFY_MISMATCHES_MAX: usize = 100;

/// Streams `verify` reads a page at a time: one query for their names (the keyset page), one
/// for their events and one for each kind of row, not three round trips a stream; and the
/// entity rows it reads back afterwards, a page of keys a query.
const VERIFY_PAGE_STREAMS: usize = 500;

/// Intents [`PgReader::each_intent`] reads a query, and runs [`PgReader::each_run`] does (with
/// their intents in one more): one round trip for a page of full states, as `verify`'s pages.
const LIST_PAGE: usize = 500;

/// A read-only handle on the log, with its own connection.
pub struct PgReader {
    client: Client,
    /// Streams (or entity rows) `verify` reads a query.
    verify_page: usize,
    /// Intents or runs `each_intent` and `each_run` read a query.
    list_page: usize,
}

/// One thing `verify` found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mismatch {
    /// An event does not check: a gap in its stream, a broken link of its stream's chain, a
    /// hash that is not its own, undecodable, refused by the fold.
    Event {
        /// Its sequence.
        seq: u64,
        /// Its stream.
        stream: String,
        /// What is wrong.
        detail: String,
    },
    /// An `intents` row differs from its stream replayed alone, or is missing or extra.
    Intent {
        /// The intent key.
        key: String,
        /// What differs.
        detail: String,
    },
    /// A `runs` row differs from its stream replayed alone, or is missing or extra.
    Run {
        /// The run id.
        run_id: String,
        /// What differs.
        detail: String,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Event { seq, stream, detail } => write!(f, "event seq {seq} on {stream}: {detail}"),
            Self::Intent { key, detail } => write!(f, "intents row {key}: {detail}"),
            Self::Run { run_id, detail } => write!(f, "runs row {run_id}: {detail}"),
        }
    }
}

/// What [`PgReader::verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Events in the log.
    pub events: u64,
    /// Streams in the log.
    pub streams: u64,
    /// Intents replayed.
    pub intents: u64,
    /// Runs replayed.
    pub runs: u64,
    /// Rows in `intents`.
    pub intent_rows: u64,
    /// Rows in `runs`.
    pub run_rows: u64,
    /// What is wrong, first found first; at most [`VERIFY_MISMATCHES_MAX`].
    pub mismatches: Vec<Mismatch>,
    /// How many mismatches were found in all.
    pub mismatch_count: u64,
    /// Where the log came from when it was migrated (`keel migrate`): the source chain's head
    /// hash, its event count, when the copy started and finished.
    pub provenance: Option<crate::import::Provenance>,
}

impl VerifyReport {
    /// Whether the log and its rows check.
    pub fn is_ok(&self) -> bool {
        self.mismatch_count == 0
    }

    /// The first thing found wrong.
    pub fn first_mismatch(&self) -> Option<&Mismatch> {
        self.mismatches.first()
    }

    fn push(&mut self, mismatch: Mismatch) {
        self.mismatch_count += 1;
        if self.mismatches.len() < VERIFY_MISMATCHES_MAX {
            self.mismatches.push(mismatch);
        }
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} events, {} intents, {} runs: ", self.events, self.intents, self.runs)?;
        match self.first_mismatch() {
            None => write!(f, "ok"),
            Some(first) => write!(f, "{} mismatch(es), first: {first}", self.mismatch_count),
        }
    }
}

impl PgReader {
    /// Connects to the database at `url`.
    ///
    /// # Errors
    ///
    /// PostgreSQL's.
    pub fn open(url: &str) -> Result<Self> {
        Ok(Self { client: crate::writer::connect(url)?, verify_page: VERIFY_PAGE_STREAMS, list_page: LIST_PAGE })
    }

    /// Whether the database at `url` holds a Keel log (its schema was ever created), asked on
    /// a connection of its own, connected again when it is lost on the way (as
    /// [`PgLog::open`](crate::PgLog::open) is): a connection dropped while a process starts
    /// is not the end of it.
    ///
    /// # Errors
    ///
    /// PostgreSQL's, once connecting again gave up.
    pub fn holds_log(url: &str) -> Result<bool> {
        Ok(crate::writer::reconnecting(url, |client| Ok(crate::schema::version(client)? > 0))?.1)
    }

    fn snapshot(&mut self) -> Result<Transaction<'_>> {
        Ok(self.client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start()?)
    }

    /// One stream's events in stream order, each decoded and hash-checked.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for an event that does not decode or check; PostgreSQL's.
    pub fn stream(&mut self, stream: &StreamId) -> Result<Vec<StoredEvent>> {
        let mut tx = self.snapshot()?;
        rows::stream_events(&mut tx, stream)
    }

    /// One intent's row.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a row that does not decode; PostgreSQL's.
    pub fn intent(&mut self, key: &IntentKey) -> Result<Option<Intent>> {
        Ok(self.intents(std::slice::from_ref(key))?.pop().flatten())
    }

    /// The rows of `keys`, in their order (`None` where an intent has no row), read in one
    /// query.
    ///
    /// # Errors
    ///
    /// As [`PgReader::intent`].
    pub fn intents(&mut self, keys: &[IntentKey]) -> Result<Vec<Option<Intent>>> {
        let mut tx = self.snapshot()?;
        let names: Vec<&str> = keys.iter().map(IntentKey::as_str).collect();
        let mut found = rows::indexed_intents(&mut tx, &names)?;
        names.iter().map(|key| found.remove(*key).map(|row| row.entity.intent()).transpose()).collect()
    }

    /// Hands `each` every intent in key order, only those in `status` when given, read in one
    /// snapshot a page of [`LIST_PAGE`] at a time (a keyset cursor: `key > last ORDER
    /// BY key LIMIT page`, on `intents_by_status` with a status, the primary key without). It
    /// holds one page, whatever the log holds. Returns how many it handed.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a row that does not decode; PostgreSQL's.
    pub fn each_intent(&mut self, status: Option<IntentStatus>, each: &mut impl FnMut(Intent)) -> Result<u64> {
        let limit = self.list_page;
        let mut tx = self.snapshot()?;
        let (mut after, mut handed) = (None::<String>, 0u64);
        loop {
            let page = rows::intents_page(&mut tx, status, after.as_deref(), limit)?;
            let full = page.len() == limit;
            for row in page {
                let intent = row.intent()?;
                after = Some(intent.key().as_str().to_owned());
                handed += 1;
                each(intent);
            }
            if !full {
                return Ok(handed);
            }
        }
    }

    /// Hands `each` every run in id order, only the unfinished with `unfinished_only`, with the
    /// intents it reserved in reservation order, read in one snapshot a page of [`LIST_PAGE`]
    /// runs at a time (a keyset cursor on the primary key, then the page's intents in one query
    /// on `intents_by_run`). It holds one page, whatever the log holds. Returns how many it
    /// handed.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a row that does not decode; PostgreSQL's.
    pub fn each_run(&mut self, unfinished_only: bool, each: &mut impl FnMut(Run, Vec<Intent>)) -> Result<u64> {
        let limit = self.list_page;
        let mut tx = self.snapshot()?;
        let (mut after, mut handed) = (None::<String>, 0u64);
        loop {
            let page = rows::runs_page(&mut tx, unfinished_only, after.as_deref(), limit)?;
            let full = page.len() == limit;
            let runs: Vec<Run> = page.iter().map(EntityRow::run).collect::<Result<_>>()?;
            let ids: Vec<&str> = runs.iter().map(|run| run.run_id.as_str()).collect();
            let mut intents: BTreeMap<RunId, Vec<Intent>> = BTreeMap::new();
            for row in rows::runs_intent_rows(&mut tx, &ids)? {
                let intent = row.intent()?;
                intents.entry(intent.run_id.clone()).or_default().push(intent);
            }
            for run in runs {
                after = Some(run.run_id.as_str().to_owned());
                handed += 1;
                let reserved = intents.remove(&run.run_id).unwrap_or_default();
                each(run, reserved);
            }
            if !full {
                return Ok(handed);
            }
        }
    }

    /// One run's row and the rows of the intents it reserved, in reservation order, read in
    /// one snapshot through the primary key and `intents_by_run`.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a row that does not decode; PostgreSQL's.
    pub fn run_state(&mut self, run_id: &RunId) -> Result<Option<(Run, Vec<Intent>)>> {
        let mut tx = self.snapshot()?;
        let Some(row) = rows::run_row(&mut tx, run_id.as_str())? else { return Ok(None) };
        let intents = rows::run_intent_rows(&mut tx, run_id.as_str())?;
        Ok(Some((row.run()?, intents.iter().map(EntityRow::intent).collect::<Result<_>>()?)))
    }

    /// One run's row.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a row that does not decode; PostgreSQL's.
    pub fn run(&mut self, run_id: &RunId) -> Result<Option<Run>> {
        Ok(self.runs(std::slice::from_ref(run_id))?.pop().flatten())
    }

    /// The rows of `run_ids`, in their order (`None` where a run has no row), read in one
    /// query.
    ///
    /// # Errors
    ///
    /// As [`PgReader::run`].
    pub fn runs(&mut self, run_ids: &[RunId]) -> Result<Vec<Option<Run>>> {
        let mut tx = self.snapshot()?;
        let names: Vec<&str> = run_ids.iter().map(RunId::as_str).collect();
        let mut found = rows::indexed_runs(&mut tx, &names)?;
        names.iter().map(|run_id| found.remove(*run_id).map(|row| row.entity.run()).transpose()).collect()
    }

    /// The fold of the whole log in sequence order, every event hash-checked and checked to
    /// follow on its stream's chain (`Ledger::per_stream`). Its memory grows with the log:
    /// for checkers and tests.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first event that does not check.
    pub fn ledger(&mut self) -> Result<Ledger> {
        let mut ledger = Ledger::per_stream();
        for stored in self.events()? {
            ledger.try_apply(&stored).map_err(|e| Error::corrupt(e.seq, e.to_string()))?;
        }
        Ok(ledger)
    }

    /// Every event of the log in sequence order, each checked against its own hash, read in
    /// one snapshot: what the invariant checks fold (a whole-log read, for checkers and tests).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first event that does not decode or hash.
    pub fn events(&mut self) -> Result<Vec<StoredEvent>> {
        let mut tx = self.snapshot()?;
        let rows = tx.query(&format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY seq"), &[])?;
        rows.iter()
            .map(|row| {
                let stored = rows::decode_event(row)?;
                rows::check_hash(&stored)?;
                Ok(stored)
            })
            .collect()
    }

    /// Reads `streams` streams (or entity rows) a query in [`PgReader::verify`] instead of
    /// 500: its report is the same whatever the page; tests make pages small to check that
    /// nothing is lost at their boundaries.
    #[must_use]
    pub fn with_verify_page(mut self, streams: NonZeroUsize) -> Self {
        self.verify_page = streams.get();
        self
    }

    /// Reads `items` intents or runs a query in [`PgReader::each_intent`] and
    /// [`PgReader::each_run`] instead of 500: what they hand is the same whatever the page;
    /// tests make pages small to check that nothing is lost or repeated at their boundaries.
    #[must_use]
    pub fn with_list_page(mut self, items: NonZeroUsize) -> Self {
        self.list_page = items.get();
        self
    }

    /// Checks the whole log against itself, in one snapshot: every stream's chain (numbered
    /// 1, 2, 3 … with increasing sequences, each event linked to its stream's previous one
    /// and carrying its own hash, decoded, on the stream it belongs on, accepted by the fold),
    /// then every entity row against its stream replayed alone (missing, extra, differing,
    /// its indexed columns, the stream length it folds).
    ///
    /// Mismatches are data in the report, never an `Err`.
    ///
    /// # Cost
    ///
    /// Reads everything once, a page of stream names at a time (a keyset cursor on the
    /// `(stream, stream_seq)` index: `stream > last ORDER BY stream LIMIT page`), then the
    /// `intents` and `runs` rows a page at a time the same way. It holds one page's names,
    /// events and rows, plus a counter per run that made network retries (from the intents'
    /// pass to its run's stream): no list of every stream or entity, whatever the history.
    ///
    /// # Errors
    ///
    /// Only when the database cannot be read.
    pub fn verify(&mut self) -> Result<VerifyReport> {
        let page = self.verify_page;
        let mut tx = self.snapshot()?;
        let mut report = VerifyReport { provenance: crate::import::provenance(&mut tx)?, ..VerifyReport::default() };
        let mut retries: BTreeMap<RunId, u32> = BTreeMap::new();
        // Intent streams first: they count the network retries the run rows hold.
        for intents in [true, false] {
            let mut after: Option<String> = None;
            loop {
                let names = rows::stream_names_after(&mut tx, after.as_deref(), intents, page)?;
                let Some(last) = names.last() else { break };
                after = Some(last.clone());
                report.streams += names.len() as u64;
                verify_page(&mut tx, &names, &mut retries, &mut report)?;
            }
        }
        for (run_id, n) in retries {
            report.push(Mismatch::Run {
                run_id: run_id.to_string(),
                detail: format!("{n} network retries by a run with no stream"),
            });
        }
        rows_without_events(&mut tx, Table::Intents, page, &mut report)?;
        rows_without_events(&mut tx, Table::Runs, page, &mut report)?;
        Ok(report)
    }
}

/// Checks one page of streams: each one's chain, then its entity row against its replay.
fn verify_page(
    tx: &mut Transaction<'_>,
    names: &[String],
    retries: &mut BTreeMap<RunId, u32>,
    report: &mut VerifyReport,
) -> Result<()> {
    let page: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut events_of = rows::streams_rows(tx, &page)?;
    let keys: Vec<&str> = page.iter().filter_map(|name| name.strip_prefix("intent:")).collect();
    let intent_rows = rows::indexed_intents(tx, &keys)?;
    let run_ids: Vec<&str> = page.iter().filter_map(|name| name.strip_prefix("run:")).collect();
    let run_rows = rows::indexed_runs(tx, &run_ids)?;
    for name in page {
        let stream = StreamId::from_stored(name.to_owned());
        let found = events_of.remove(name).unwrap_or_default();
        let Some(events) = checked_stream(found, &stream, report) else { continue };
        report.events += events.len() as u64;
        let len = events.len() as u64;
        if let Some(key) = name.strip_prefix("intent:") {
            report.intents += 1;
            match engine::ledger::fold::intent_alone(&events) {
                Ok((intent, counted)) => {
                    for (run_id, n) in counted {
                        *retries.entry(run_id).or_insert(0) += n;
                    }
                    let row = intent_rows.get(key);
                    if compare_intent(key, &intent, len, row.map(|r| &r.entity), report) {
                        let reserved_seq = events.first().map_or(0, |e| e.seq);
                        if let Some(detail) = row.and_then(|r| r.intent_columns_differ(&intent, reserved_seq)) {
                            report.push(Mismatch::Intent { key: key.to_owned(), detail });
                        }
                    }
                }
                Err(error) => report.push(fold_mismatch(&error)),
            }
        } else if let Some(run_id) = name.strip_prefix("run:") {
            report.runs += 1;
            match engine::ledger::fold::history(&events) {
                Ok(history) => {
                    let mut run = history.run;
                    run.network_retries = retries.remove(&run.run_id).unwrap_or(0);
                    let row = run_rows.get(run_id);
                    if compare_run(run_id, &run, len, row.map(|r| &r.entity), report)
                        && let Some(detail) = row.and_then(|r| r.run_columns_differ(&run))
                    {
                        report.push(Mismatch::Run { run_id: run_id.to_owned(), detail });
                    }
                }
                Err(error) => report.push(fold_mismatch(&error)),
            }
        } else if name.starts_with("facts:") {
            if let Err(error) = engine::facts::fold(&events) {
                report.push(fold_mismatch(&error));
            }
        } else if let Some(first) = events.first() {
            report.push(Mismatch::Event {
                seq: first.seq,
                stream: name.to_owned(),
                detail: "a stream of no known kind".to_owned(),
            });
        }
    }
    Ok(())
}

/// The entity tables `verify` reads back for rows whose stream holds no event.
#[derive(Clone, Copy)]
enum Table {
    Intents,
    Runs,
}

/// Counts `table`'s rows, a page at a time in key order, and reports each one whose stream
/// holds no event (a stream with events has its entity even when it does not check).
fn rows_without_events(tx: &mut Transaction<'_>, table: Table, page: usize, report: &mut VerifyReport) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let rows = match table {
            Table::Intents => rows::intent_keys_after(tx, after.as_deref(), page)?,
            Table::Runs => rows::run_ids_after(tx, after.as_deref(), page)?,
        };
        let Some((last, _)) = rows.last() else { return Ok(()) };
        after = Some(last.clone());
        for (name, has_events) in rows {
            match table {
                Table::Intents => report.intent_rows += 1,
                Table::Runs => report.run_rows += 1,
            }
            if has_events {
                continue;
            }
            let detail = "a row without events".to_owned();
            report.push(match table {
                Table::Intents => Mismatch::Intent { key: name, detail },
                Table::Runs => Mismatch::Run { run_id: name, detail },
            });
        }
    }
}

fn fold_mismatch(error: &engine::ledger::FoldError) -> Mismatch {
    Mismatch::Event {
        seq: error.seq,
        stream: error.stream.to_string(),
        detail: format!("the fold rejects it: {error}"),
    }
}

/// One stream's events, each checked to follow on the stream's chain; `None` (and the first
/// mismatch reported) when one does not.
fn checked_stream(found: Vec<postgres::Row>, stream: &StreamId, report: &mut VerifyReport) -> Option<Vec<StoredEvent>> {
    let name = stream.as_str();
    let mut events: Vec<StoredEvent> = Vec::new();
    for row in found {
        let seq = row.get::<_, i64>(0).try_into().unwrap_or(0);
        let bad = |detail: String| Mismatch::Event { seq, stream: name.to_owned(), detail };
        let stored = match rows::decode_event(&row) {
            Ok(stored) => stored,
            Err(error) => {
                report.push(bad(error.to_string()));
                return None;
            }
        };
        let expected = events.len() as u64 + 1;
        let prev = events.last().map_or(GENESIS_HASH, |e| e.hash.as_str());
        let problem = if stored.stream_seq != expected {
            Some(format!("stream_seq {}, expected {expected}", stored.stream_seq))
        } else if events.last().is_some_and(|e| e.seq >= stored.seq) {
            Some("a sequence not above its stream's previous one".to_owned())
        } else if stored.prev_hash != prev {
            Some(format!("not linked to its stream's previous event (prev {}, expected {prev})", stored.prev_hash))
        } else if stored.event.stream() != *stream {
            Some(format!("stored on {name} but the event belongs on {}", stored.event.stream()))
        } else {
            rows::check_hash(&stored).err().map(|e| match e {
                Error::Corrupt { detail, .. } => detail,
                other => other.to_string(),
            })
        };
        if let Some(detail) = problem {
            report.push(bad(detail));
            return None;
        }
        events.push(stored);
    }
    Some(events)
}

/// Compares an intent's row with its replay; `true` when its state matches (its indexed
/// columns are compared next).
fn compare_intent(key: &str, replayed: &Intent, len: u64, row: Option<&EntityRow>, report: &mut VerifyReport) -> bool {
    let mismatch = |detail: String| Mismatch::Intent { key: key.to_owned(), detail };
    let Some(row) = row else {
        report.push(mismatch("missing: the stream has events but no row".to_owned()));
        return false;
    };
    if row.stream_len != len {
        report.push(mismatch(format!("folds {} events of its stream, which holds {len}", row.stream_len)));
        return false;
    }
    match row.intent() {
        Ok(stored) if &stored == replayed => return true,
        Ok(_) => report.push(mismatch("its state differs from its stream replayed".to_owned())),
        Err(error) => report.push(mismatch(error.to_string())),
    }
    false
}

/// Compares a run's row with its replay; `true` when its state matches.
fn compare_run(run_id: &str, replayed: &Run, len: u64, row: Option<&EntityRow>, report: &mut VerifyReport) -> bool {
    let mismatch = |detail: String| Mismatch::Run { run_id: run_id.to_owned(), detail };
    let Some(row) = row else {
        report.push(mismatch("missing: the stream has events but no row".to_owned()));
        return false;
    };
    if row.stream_len != len {
        report.push(mismatch(format!("folds {} events of its stream, which holds {len}", row.stream_len)));
        return false;
    }
    match row.run() {
        Ok(stored) if &stored == replayed => return true,
        Ok(_) => report.push(mismatch("its state differs from its stream replayed".to_owned())),
        Err(error) => report.push(mismatch(error.to_string())),
    }
    false
}
