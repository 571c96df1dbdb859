//! Readers: their own read-only connections, never the writer's.
//!
//! A [`Reader`] serves the CLI and tests: events, one stream, the entity rows as listings,
//! and [`Reader::verify`], which checks the whole file against itself. In WAL mode a reader
//! sees the last commit that finished before its statement (or transaction) started, and
//! never blocks the writer.
//!
//! # Cost
//!
//! [`Reader::open`] only checks the schema version. [`Reader::intent_state`],
//! [`Reader::stream`], [`Reader::history`], [`Reader::intent`] and [`Reader::intents`] with a
//! status read what they return through an index. [`Reader::verify`] and [`Reader::ledger`]
//! read everything: `verify` streams (one stream's events in memory at a time),
//! `ledger` folds the whole log into memory and is for checkers and tests, never commands.

use crate::chain::Chain;
use crate::codec;
use crate::error::{Error, Result};
use crate::projection::{IntentRow, RunRow};
use crate::rebuild::{self, Found, MapCounts};
use crate::rows;
use crate::schema;
use engine::event::{GENESIS_HASH, IntentKey, RunId, StoredEvent, StreamId};
use engine::ledger::{Intent, IntentStatus, Ledger, Run, RunHistory};
use rusqlite::Connection;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::path::Path;

/// Mismatches [`Reader::verify`] lists before it stops listing (it still counts). The first
/// one is what an operator acts on; a hundred show the extent without flooding a terminal.
// A reporting bound of the store, not an engine bound, so it lives here.
pub const VERIFY_MISMATCHES_MAX: usize = 100;

/// Where a run stands, as `keel runs --status` selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Not finished.
    Running,
    /// Finished with this status.
    Finished(engine::event::RunStatus),
}

/// Which runs [`Reader::runs_matching`] lists.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs of this workflow (`charge`, `ticket-review` or `agent:ticket-review`).
    pub workflow: Option<String>,
    /// Only runs started at or after this instant.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

impl RunFilter {
    /// Whether only unfinished runs can match: a store reads those through their index.
    pub fn unfinished_only(&self) -> bool {
        matches!(self.state, Some(RunState::Running))
    }

    /// Whether `run` is one this filter selects (whichever store it was read from).
    pub fn matches(&self, run: &Run) -> bool {
        let state_matches = match self.state {
            None => true,
            Some(RunState::Running) => run.status.is_none(),
            Some(RunState::Finished(status)) => run.status == Some(status),
        };
        let workflow_matches = self.workflow.as_deref().is_none_or(|w| {
            run.workflow == w || run.workflow.strip_prefix(engine::ledger::AGENT_WORKFLOW_PREFIX) == Some(w)
        });
        state_matches && workflow_matches && self.since.is_none_or(|since| run.started_at >= since)
    }
}

/// A read-only view of the log, on its own connection.
#[derive(Debug)]
pub struct Reader {
    conn: Connection,
}

/// One thing `verify` found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mismatch {
    /// An event does not check: gap, broken chain, undecodable, refused by the fold.
    Event {
        /// Its sequence.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// An `intents` row (or its `orders`/`refs` entries) differs from the replay, or is
    /// missing or extra.
    Intent {
        /// The intent key.
        key: String,
        /// What differs.
        detail: String,
    },
    /// A `runs` row differs from the replay, or is missing or extra.
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
            Self::Event { seq, detail } => write!(f, "event seq {seq}: {detail}"),
            Self::Intent { key, detail } => write!(f, "intents row {key}: {detail}"),
            Self::Run { run_id, detail } => write!(f, "runs row {run_id}: {detail}"),
        }
    }
}

/// What [`Reader::verify`] checked and found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Events in the log.
    pub events: u64,
    /// Intents the replay folded.
    pub intents: u64,
    /// Runs the replay folded.
    pub runs: u64,
    /// Rows in the `intents` table.
    pub intent_rows: u64,
    /// Rows in the `runs` table.
    pub run_rows: u64,
    /// Hash of the last event that checked (the genesis hash for an empty log).
    pub last_hash: String,
    /// What is wrong, first found first; at most [`VERIFY_MISMATCHES_MAX`].
    pub mismatches: Vec<Mismatch>,
    /// How many mismatches were found in all (may exceed the list).
    pub mismatch_count: u64,
}

impl VerifyReport {
    /// Whether the log and its projections check.
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

/// What [`Reader::verify_with`] is doing, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Checking the hash chain, event by event in sequence order.
    Chain,
    /// Replaying each stream alone and comparing its entity row.
    Streams,
}

/// How far [`Reader::verify_with`] got in its current phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The phase.
    pub phase: Phase,
    /// Events (chain) or streams (streams) done.
    pub done: u64,
    /// How many there are.
    pub total: u64,
}

/// How often verify reports progress: every this many events or streams.
const PROGRESS_EVERY: u64 = 4_096;

impl Reader {
    /// Opens a read-only connection on the log at `path`.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaTooNew`] / [`Error::SchemaTooOld`] when the file is not at this build's
    /// schema version (open it with [`crate::Store::open`] to migrate), [`Error::Sqlite`] when
    /// it cannot be opened.
    pub fn open(path: &Path) -> Result<Reader> {
        Ok(Reader { conn: schema::open_reader(path)? })
    }

    /// Every event after `seq` (0 for all), in order, each decoded and hash-checked.
    pub fn events_since(&self, seq: u64) -> Result<Vec<StoredEvent>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let mut out = Vec::new();
        codec::scan_events(&snapshot, seq, |stored| {
            codec::check_hash(&stored)?;
            out.push(stored);
            Ok(())
        })?;
        Ok(out)
    }

    /// At most `limit` stream names after `after` (exclusive; `None` from the first), in name
    /// order (code-point order: `facts:`, `intent:`, `run:`), through the names' unique index:
    /// how a migration walks the log stream by stream in bounded memory. A name may have no
    /// events (a run only named by a cause).
    ///
    /// # Errors
    ///
    /// SQLite's.
    pub fn streams_after(&self, after: Option<&StreamId>, limit: usize) -> Result<Vec<StreamId>> {
        let mut statement =
            self.conn.prepare_cached("SELECT name FROM streams WHERE name > ?1 ORDER BY name LIMIT ?2")?;
        let after = after.map_or("", StreamId::as_str);
        let names = statement.query_map(rusqlite::params![after, codec::to_i64(limit as u64)], |row| row.get(0))?;
        names.map(|name| Ok(StreamId::from_stored(name?))).collect()
    }

    /// One intent's entity row, decoded (one indexed read).
    ///
    /// # Errors
    ///
    /// SQLite's, or [`Error::Corrupt`] for a row that does not decode.
    pub fn intent_entity(&self, key: &IntentKey) -> Result<Option<Intent>> {
        let snapshot = self.conn.unchecked_transaction()?;
        Ok(rows::intent_by_key(&snapshot, key)?.map(|(_, intent)| intent))
    }

    /// One run's entity row, decoded (one indexed read).
    ///
    /// # Errors
    ///
    /// SQLite's, or [`Error::Corrupt`] for a row that does not decode.
    pub fn run_entity(&self, run_id: &RunId) -> Result<Option<Run>> {
        let snapshot = self.conn.unchecked_transaction()?;
        Ok(rows::run_by_id(&snapshot, run_id)?.map(|(_, run)| run))
    }

    /// How many payment methods the vault holds (sealed, never opened here).
    ///
    /// # Errors
    ///
    /// SQLite's.
    pub fn vault_entries(&self) -> Result<u64> {
        count(&self.conn, "vault")
    }

    /// One stream's events, in stream order, each decoded and hash-checked.
    pub fn stream(&self, stream: &StreamId) -> Result<Vec<StoredEvent>> {
        let snapshot = self.conn.unchecked_transaction()?;
        codec::stream_events(&snapshot, stream)
    }

    /// One intent's state, folded from its own stream (hash-checked): what `keel show`
    /// needs, read without anything else.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when the stream does not decode, check or fold.
    pub fn intent_state(&self, key: &IntentKey) -> Result<Option<Intent>> {
        let events = self.stream(&key.stream())?;
        if events.is_empty() {
            return Ok(None);
        }
        engine::ledger::fold::intent(&events).map(Some).map_err(|e| Error::corrupt(e.seq, e.to_string()))
    }

    /// What the payment-method vault holds for intent `key`: checked (it authenticates or
    /// not) when `vault_key` is given, only seen otherwise. One indexed read.
    ///
    /// # Errors
    ///
    /// SQLite's.
    pub fn vault_entry(
        &self,
        key: &IntentKey,
        vault_key: Option<&crate::vault::VaultKey>,
    ) -> Result<crate::vault::EntryState> {
        crate::vault::entry_state(&self.conn, vault_key, key)
    }

    /// Whether a vault key was ever used on this database (its payment methods then need it).
    ///
    /// # Errors
    ///
    /// SQLite's.
    pub fn vault_configured(&self) -> Result<bool> {
        crate::vault::configured(&self.conn)
    }

    /// Whether `vault_key` opens this database's vault (its key check value).
    ///
    /// # Errors
    ///
    /// SQLite's.
    pub fn vault_key_opens(&self, vault_key: &crate::vault::VaultKey) -> Result<bool> {
        crate::vault::key_opens(&self.conn, vault_key)
    }

    /// What replaying one run needs, folded from its own stream (hash-checked).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when the stream does not decode, check or fold.
    pub fn history(&self, run_id: &RunId) -> Result<Option<RunHistory>> {
        let events = self.stream(&run_id.stream())?;
        if events.is_empty() {
            return Ok(None);
        }
        engine::ledger::fold::history(&events).map(Some).map_err(|e| Error::corrupt(e.seq, e.to_string()))
    }

    /// The intents in key order, only those with `status` when given (a status name from
    /// `IntentStatus::as_str`; an unknown name matches nothing). With a status, the cost is
    /// that status's intents (an index); without, every intent.
    pub fn intents(&self, status: Option<&str>) -> Result<Vec<IntentRow>> {
        let status = match status {
            Some(name) => match IntentStatus::parse(name) {
                Some(status) => Some(status),
                None => return Ok(Vec::new()),
            },
            None => None,
        };
        let snapshot = self.conn.unchecked_transaction()?;
        Ok(rows::intents_listed(&snapshot, status)?.iter().map(IntentRow::from_intent).collect())
    }

    /// Every intent of one order (charges and refunds), in reservation order: what a human
    /// approving a refund needs to see of what was already refunded. Its cost is that order's
    /// intents (the `orders` index), never the log's size.
    pub fn order_intents(&self, tenant: &str, order_id: &str) -> Result<Vec<Intent>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let mut intents = Vec::new();
        for id in rows::order_intent_ids(&snapshot, tenant, order_id)? {
            intents.extend(rows::intent_at(&snapshot, id)?);
        }
        Ok(intents)
    }

    /// One page of `tenant`'s intents in key order, after the intent `after` (exclusive;
    /// `None` for the first page), at most `limit`, only those in `status` when given. The
    /// cost is the page's (an index range), never the log's.
    ///
    /// # Errors
    ///
    /// The database's, or [`Error::Corrupt`] for a row that does not decode.
    pub fn intents_page(
        &self,
        tenant: &str,
        status: Option<IntentStatus>,
        after: Option<&IntentKey>,
        limit: usize,
    ) -> Result<Vec<IntentRow>> {
        let after = after.map(|key| key.stream().as_str().to_owned()).unwrap_or_default();
        let snapshot = self.conn.unchecked_transaction()?;
        Ok(rows::tenant_intents_page(&snapshot, tenant, status, &after, limit)?
            .iter()
            .map(IntentRow::from_intent)
            .collect())
    }

    /// How many of `tenant`'s intents are in each status; statuses with none are absent. Its
    /// cost is the tenant's intents' index entries, never the log.
    ///
    /// # Errors
    ///
    /// The database's, or [`Error::Corrupt`] for a status code it does not know.
    pub fn intent_counts(&self, tenant: &str) -> Result<Vec<(IntentStatus, u64)>> {
        let snapshot = self.conn.unchecked_transaction()?;
        rows::tenant_intent_counts(&snapshot, tenant)
    }

    /// One page of `tenant`'s runs after `after` (`None` for the first page), in id order, at
    /// most `limit`, only those in `state` when given. A run is a tenant's when it reserved at
    /// least one intent and every one is that tenant's; a run that reserved none is no
    /// tenant's. The cost is the tenant's intents' index entries and the runs read, never
    /// the log.
    ///
    /// # Errors
    ///
    /// The database's, or [`Error::Corrupt`] for a row that does not decode.
    pub fn runs_page(
        &self,
        tenant: &str,
        state: Option<RunState>,
        after: Option<&RunId>,
        limit: usize,
    ) -> Result<Vec<RunRow>> {
        let after = after.map(|run_id| run_id.stream().as_str().to_owned()).unwrap_or_default();
        let snapshot = self.conn.unchecked_transaction()?;
        let keep = |run: &Run| match state {
            None => true,
            Some(RunState::Running) => run.status.is_none(),
            Some(RunState::Finished(status)) => run.status == Some(status),
        };
        let mut out = Vec::new();
        for (stream, run) in rows::tenant_runs_page(&snapshot, tenant, &after, limit, &keep)? {
            out.push(RunRow::from_run(&run, &run_intents(&snapshot, stream)?));
        }
        Ok(out)
    }

    /// One intent's row.
    pub fn intent(&self, key: &IntentKey) -> Result<Option<IntentRow>> {
        let snapshot = self.conn.unchecked_transaction()?;
        Ok(rows::intent_by_key(&snapshot, key)?.map(|(_, intent)| IntentRow::from_intent(&intent)))
    }

    /// Every run's row, in id order.
    pub fn runs(&self) -> Result<Vec<RunRow>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let mut out = Vec::new();
        for (stream, run) in rows::runs_listed(&snapshot)? {
            out.push(RunRow::from_run(&run, &run_intents(&snapshot, stream)?));
        }
        Ok(out)
    }

    /// The runs `filter` selects, in id order, read from the run rows (the unfinished ones
    /// through their index); never the log.
    pub fn runs_matching(&self, filter: &RunFilter) -> Result<Vec<RunRow>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let mut out = Vec::new();
        for (stream, run) in rows::runs_where(&snapshot, filter.unfinished_only())? {
            if filter.matches(&run) {
                out.push(RunRow::from_run(&run, &run_intents(&snapshot, stream)?));
            }
        }
        Ok(out)
    }

    /// Seed 004's figures (see [`crate::metrics`]) at `now`, over the intents reserved and
    /// the runs started at or after `since`, by segment; only `tenant`'s intents and runs when
    /// given (a run is a tenant's as [`Reader::runs_page`] says).
    pub fn metrics(
        &self,
        since: Option<chrono::DateTime<chrono::Utc>>,
        by: Option<crate::metrics::Dimension>,
        tenant: Option<&str>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<crate::metrics::Segment>> {
        let snapshot = self.conn.unchecked_transaction()?;
        crate::metrics::figures(&snapshot, since, by, tenant, now)
    }

    /// One run's state and the intents it reserved, from their rows.
    pub fn run_state(&self, run_id: &RunId) -> Result<Option<(Run, Vec<Intent>)>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let Some((stream, run)) = rows::run_by_id(&snapshot, run_id)? else {
            return Ok(None);
        };
        Ok(Some((run, run_intents(&snapshot, stream)?)))
    }

    /// One run's row.
    pub fn run(&self, run_id: &RunId) -> Result<Option<RunRow>> {
        let snapshot = self.conn.unchecked_transaction()?;
        let Some((stream, run)) = rows::run_by_id(&snapshot, run_id)? else {
            return Ok(None);
        };
        Ok(Some(RunRow::from_run(&run, &run_intents(&snapshot, stream)?)))
    }

    /// The fold of the whole log, every event checked (decoding, hash, chain, order) before
    /// it is applied. Its memory grows with the log: for checkers and tests.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first event that does not check.
    pub fn ledger(&self) -> Result<Ledger> {
        // One read transaction: one snapshot from the first event to the last.
        let snapshot = self.conn.unchecked_transaction()?;
        let mut ledger = Ledger::new();
        codec::scan_events(&snapshot, 0, |stored| {
            codec::check_hash(&stored)?;
            ledger.try_apply(&stored).map_err(|e| Error::corrupt(e.seq, e.to_string()))
        })?;
        Ok(ledger)
    }

    /// [`Reader::verify_with`] without progress reports.
    ///
    /// # Errors
    ///
    /// Only when the database cannot be read ([`Error::Sqlite`], [`Error::Busy`]).
    pub fn verify(&self) -> Result<VerifyReport> {
        self.verify_with(&mut |_| {})
    }

    /// Checks the whole file, in bounded memory: every event in sequence order (gap-free
    /// `seq`, the hash chain recomputed, every payload decoded), then every stream replayed
    /// alone (gap-free `stream_seq`, the fold accepting it) and its entity row compared with
    /// the replay (missing, extra, differing fields, indexed columns, order and reference
    /// entries). `progress` is called every few thousand events or streams.
    ///
    /// Mismatches are data in the report, never an `Err` and never a panic; the first one is
    /// named precisely. After the first bad event the chain is not trusted and the rows are
    /// not compared.
    ///
    /// # Errors
    ///
    /// Only when the database cannot be read ([`Error::Sqlite`], [`Error::Busy`]).
    pub fn verify_with(&self, progress: &mut dyn FnMut(Progress)) -> Result<VerifyReport> {
        // One snapshot for events and rows, so a concurrent commit cannot look like a mismatch.
        let snapshot = self.conn.unchecked_transaction()?;
        let mut report = VerifyReport {
            events: 0,
            intents: 0,
            runs: 0,
            intent_rows: count(&snapshot, "intents")?,
            run_rows: count(&snapshot, "runs")?,
            last_hash: GENESIS_HASH.to_owned(),
            mismatches: Vec::new(),
            mismatch_count: 0,
        };
        let (total, _) = codec::head(&snapshot)?;
        let mut chain = Chain { last_seq: 0, last_hash: GENESIS_HASH.to_owned() };
        let mut chain_ok = true;
        let scanned = codec::scan_events(&snapshot, 0, |stored| {
            report.events += 1;
            if chain_ok && let Err(error) = chain.check(&snapshot, &stored, false) {
                report.push(event_mismatch(error));
                chain_ok = false;
            }
            if report.events.is_multiple_of(PROGRESS_EVERY) {
                progress(Progress { phase: Phase::Chain, done: report.events, total });
            }
            Ok(())
        });
        match scanned {
            Ok(()) => {}
            Err(error @ Error::Corrupt { .. }) => {
                if chain_ok {
                    report.push(event_mismatch(error));
                }
                chain_ok = false;
            }
            Err(other) => return Err(other),
        }
        report.last_hash = chain.last_hash.clone();
        if !chain_ok {
            return Ok(report);
        }
        self.compare_rows(&snapshot, &mut report, progress)?;
        Ok(report)
    }

    /// The streams pass of `verify`.
    fn compare_rows(
        &self,
        conn: &Connection,
        report: &mut VerifyReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let streams: i64 = conn.query_row("SELECT coalesce(max(id), 0) FROM streams", [], |row| row.get(0))?;
        let total = codec::to_u64(streams, 0, "max(id)")?;
        let mut tally = Tally::default();
        let replayed_events = rebuild::replay_streams(
            conn,
            &mut |found| {
                if let Some(mismatch) = compare_one(conn, found, report, &mut tally)? {
                    report.push(mismatch);
                }
                Ok(())
            },
            &mut |done| {
                if done.is_multiple_of(PROGRESS_EVERY) {
                    progress(Progress { phase: Phase::Streams, done, total });
                }
            },
        )?;
        if replayed_events != report.events {
            let detail = format!("{} events belong to no stream", report.events.abs_diff(replayed_events));
            report.push(Mismatch::Event { seq: 0, detail });
        }
        // Every row either matched a replayed entity or is extra.
        if report.intent_rows > tally.intent_rows {
            for key in rebuild::extra_rows(conn, "intents", "intent:")? {
                report.push(Mismatch::Intent { key, detail: "in the table but not in the replay".to_owned() });
            }
        }
        if report.run_rows > tally.run_rows {
            for run_id in rebuild::extra_rows(conn, "runs", "run:")? {
                report.push(Mismatch::Run { run_id, detail: "in the table but not in the replay".to_owned() });
            }
        }
        for (table, expected) in [("orders", tally.maps.orders), ("refs", tally.maps.refs)] {
            let found = count(conn, table)?;
            if found != expected {
                let detail = format!("{found} entries, the intents call for {expected}");
                report.push(Mismatch::Intent { key: format!("({table})"), detail });
            }
        }
        Ok(())
    }
}

/// The intents a run reserved.
fn run_intents(conn: &Connection, stream: i64) -> Result<Vec<Intent>> {
    let mut out = Vec::new();
    for id in rows::run_intent_ids(conn, stream)? {
        out.extend(rows::intent_at(conn, id)?);
    }
    Ok(out)
}

fn count(conn: &Connection, table: &str) -> Result<u64> {
    let n: i64 = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))?;
    codec::to_u64(n, 0, "count")
}

fn event_mismatch(error: Error) -> Mismatch {
    match error {
        Error::Corrupt { seq, detail } => Mismatch::Event { seq, detail },
        other => Mismatch::Event { seq: 0, detail: other.to_string() },
    }
}

/// What the streams pass has seen of the rows.
#[derive(Default)]
struct Tally {
    /// Replayed intents that have a row.
    intent_rows: u64,
    /// Replayed runs that have a row.
    run_rows: u64,
    /// The order and reference entries the replayed intents call for.
    maps: MapCounts,
}

/// Compares one replayed stream with its row; counts what it replayed.
fn compare_one(
    conn: &Connection,
    found: Found,
    report: &mut VerifyReport,
    tally: &mut Tally,
) -> Result<Option<Mismatch>> {
    match found {
        Found::Broken { seq, detail } => Ok(Some(Mismatch::Event { seq, detail })),
        Found::Intent { stream, run, intent } => {
            report.intents += 1;
            let key = intent.key().as_str().to_owned();
            let detail = match rows::intent_record(conn, stream)? {
                None => Some("missing from the table (the replay has it)".to_owned()),
                Some(record) => {
                    tally.intent_rows += 1;
                    match record.decode(conn) {
                        Err(error) => Some(format!("does not decode: {error}")),
                        Ok(stored) => differs(&stored, &intent)
                            .or_else(|| record.columns_match(&intent, run))
                            .map_or_else(|| tally.maps.check(conn, stream, &intent), |d| Ok(Some(d)))?,
                    }
                }
            };
            Ok(detail.map(|detail| Mismatch::Intent { key, detail }))
        }
        Found::Run { stream, run } => {
            report.runs += 1;
            let run_id = run.run_id.as_str().to_owned();
            let detail = match rows::run_record(conn, stream)? {
                None => Some("missing from the table (the replay has it)".to_owned()),
                Some(record) => {
                    tally.run_rows += 1;
                    match record.decode() {
                        Err(error) => Some(format!("does not decode: {error}")),
                        Ok(stored) => match differs(&stored, &run) {
                            Some(detail) => Some(detail),
                            None => record.columns_match(conn, &run)?,
                        },
                    }
                }
            };
            Ok(detail.map(|detail| Mismatch::Run { run_id, detail }))
        }
        Found::Empty => Ok(None),
    }
}

/// The first field where the table's entity differs from the replay's, said in words.
fn differs<T: Serialize + PartialEq>(table: &T, replay: &T) -> Option<String> {
    if table == replay {
        return None;
    }
    let (table, replay) = (to_object(table), to_object(replay));
    let mut fields: Vec<&String> = table.keys().chain(replay.keys()).collect();
    fields.sort();
    fields.dedup();
    let field = fields.into_iter().find(|f| table.get(*f) != replay.get(*f))?;
    let show = |v: Option<&Value>| match v {
        None | Some(Value::Null) => "absent".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    Some(format!("{field} is {} in the table, {} by replay", show(table.get(field)), show(replay.get(field))))
}

fn to_object<T: Serialize>(value: &T) -> serde_json::Map<String, Value> {
    match serde_json::to_value(value).expect("entities serialize: plain fields") {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}
