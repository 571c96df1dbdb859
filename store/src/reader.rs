//! Readers: their own read-only connections, never the writer's.
//!
//! A [`Reader`] serves the CLI and tests: events, one stream, the projections, the fold, and
//! [`Reader::verify`], which checks the whole file against itself. In WAL mode a reader sees
//! the last commit that finished before its statement (or transaction) started, and never
//! blocks the writer.

use crate::codec::{self, RawEvent, check_follows, recompute_hash};
use crate::error::{Error, Result};
use crate::projection::{INTENT_COLUMNS, IntentRow, RUN_COLUMNS, RunRow, first_difference, select_sql};
use crate::schema;
use engine::event::{GENESIS_HASH, IntentKey, RunId, StoredEvent, StreamId};
use engine::ledger::{Intent, Ledger, RunHistory};
use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// Mismatches [`Reader::verify`] lists before it stops listing (it still counts). The first
/// one is what an operator acts on; a hundred show the extent without flooding a terminal.
// A reporting bound of the store, not an engine bound, so it lives here.
pub const VERIFY_MISMATCHES_MAX: usize = 100;

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
    /// An `intents` row differs from the replay, or is missing or extra.
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
        codec::events_after(&self.conn, seq)
    }

    /// One stream's events, in stream order, each decoded and hash-checked.
    pub fn stream(&self, stream: &StreamId) -> Result<Vec<StoredEvent>> {
        codec::stream_events(&self.conn, stream)
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

    /// The `intents` projection in key order, only those with `status` when given (a status
    /// name from `IntentStatus::as_str`; an unknown name matches nothing).
    pub fn intents(&self, status: Option<&str>) -> Result<Vec<IntentRow>> {
        let select = select_sql("intents", &INTENT_COLUMNS);
        let mut out = Vec::new();
        match status {
            Some(status) => {
                let mut statement = self.conn.prepare_cached(&format!("{select} WHERE status = ?1 ORDER BY key"))?;
                for row in statement.query_map([status], IntentRow::from_row)? {
                    out.push(row?);
                }
            }
            None => {
                let mut statement = self.conn.prepare_cached(&format!("{select} ORDER BY key"))?;
                for row in statement.query_map([], IntentRow::from_row)? {
                    out.push(row?);
                }
            }
        }
        Ok(out)
    }

    /// One `intents` row.
    pub fn intent(&self, key: &IntentKey) -> Result<Option<IntentRow>> {
        let select = select_sql("intents", &INTENT_COLUMNS);
        let mut statement = self.conn.prepare_cached(&format!("{select} WHERE key = ?1"))?;
        Ok(statement.query_row([key.as_str()], IntentRow::from_row).optional()?)
    }

    /// The `runs` projection in id order.
    pub fn runs(&self) -> Result<Vec<RunRow>> {
        let select = select_sql("runs", &RUN_COLUMNS);
        let mut statement = self.conn.prepare_cached(&format!("{select} ORDER BY run_id"))?;
        let rows = statement.query_map([], RunRow::from_row)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// One `runs` row.
    pub fn run(&self, run_id: &RunId) -> Result<Option<RunRow>> {
        let select = select_sql("runs", &RUN_COLUMNS);
        let mut statement = self.conn.prepare_cached(&format!("{select} WHERE run_id = ?1"))?;
        Ok(statement.query_row([run_id.as_str()], RunRow::from_row).optional()?)
    }

    /// The fold of the whole log, every event checked (decoding, hash, chain, order) before
    /// it is applied.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first event that does not check.
    ///
    /// # Panics
    ///
    /// When the fold meets an impossible transition in a log whose chain checks: a bug in
    /// the engine or a log written by one. [`Reader::verify`] reports it instead.
    pub fn ledger(&self) -> Result<Ledger> {
        // One read transaction: one snapshot from the first event to the last.
        let snapshot = self.conn.unchecked_transaction()?;
        let mut ledger = Ledger::new();
        codec::fold_new_events(&snapshot, &mut ledger)?;
        Ok(ledger)
    }

    /// Checks the whole file: every event in order (gap-free `seq` and `stream_seq`, the hash
    /// chain recomputed, every payload decoded, the fold accepting it), then every projection
    /// row against the one rebuilt from the replay (missing, extra, differing columns).
    ///
    /// Mismatches are data in the report, never an `Err` and never a panic; the first one is
    /// named precisely. After the first bad event the replay stops (what follows cannot be
    /// trusted) and the projections are not compared.
    ///
    /// # Errors
    ///
    /// Only when the database cannot be read ([`Error::Sqlite`], [`Error::Busy`]).
    pub fn verify(&self) -> Result<VerifyReport> {
        // One snapshot for events and projections, so a concurrent commit cannot look like
        // a mismatch.
        let snapshot = self.conn.unchecked_transaction()?;
        let mut report = VerifyReport {
            events: 0,
            intents: 0,
            runs: 0,
            intent_rows: 0,
            run_rows: 0,
            last_hash: GENESIS_HASH.to_owned(),
            mismatches: Vec::new(),
            mismatch_count: 0,
        };
        let mut ledger = Ledger::new();
        let mut replay_ok = true;
        codec::scan_events(&snapshot, 0, |raw| {
            report.events += 1;
            if replay_ok && let Err(detail) = check_and_fold(&mut ledger, &raw) {
                report.push(Mismatch::Event { seq: raw.seq(), detail });
                replay_ok = false;
            }
            Ok(())
        })?;
        report.last_hash = ledger.last_hash().to_owned();
        report.intents = ledger.intents().len() as u64;
        report.runs = ledger.runs().len() as u64;

        let table_intents = read_all(&snapshot, "intents", &INTENT_COLUMNS, IntentRow::from_row, |r| r.key.clone())?;
        let table_runs = read_all(&snapshot, "runs", &RUN_COLUMNS, RunRow::from_row, |r| r.run_id.clone())?;
        report.intent_rows = table_intents.len() as u64;
        report.run_rows = table_runs.len() as u64;
        if !replay_ok {
            return Ok(report);
        }
        let replay_intents: BTreeMap<String, IntentRow> =
            ledger.intents().into_iter().map(|i| (i.key().as_str().to_owned(), IntentRow::from_intent(i))).collect();
        let replay_runs: BTreeMap<String, RunRow> =
            ledger.runs().into_iter().map(|r| (r.run_id.as_str().to_owned(), RunRow::from_run(r, &ledger))).collect();
        for (key, detail) in compare(&INTENT_COLUMNS, &table_intents, &replay_intents) {
            report.push(Mismatch::Intent { key, detail });
        }
        for (run_id, detail) in compare(&RUN_COLUMNS, &table_runs, &replay_runs) {
            report.push(Mismatch::Run { run_id, detail });
        }
        Ok(report)
    }
}

/// Checks one raw event against the replay so far and folds it. `Err` says what is wrong.
fn check_and_fold(ledger: &mut Ledger, raw: &RawEvent) -> std::result::Result<(), String> {
    let expected = ledger.last_seq() + 1;
    if raw.seq != codec::to_i64(expected) {
        return Err(format!("expected seq {expected} next (gap or duplicate)"));
    }
    let detail = |error: Error| match error {
        Error::Corrupt { detail, .. } => detail,
        other => other.to_string(),
    };
    let stored = raw.decode().map_err(detail)?;
    check_follows(ledger, &stored).map_err(detail)?;
    let computed = recompute_hash(&stored);
    if computed != stored.hash {
        return Err(format!("hash mismatch (stored {}, computed {computed})", stored.hash));
    }
    ledger.try_apply(&stored).map_err(|error| format!("the fold rejects it: {error}"))
}

fn read_all<T>(
    conn: &Connection,
    table: &str,
    columns: &[&str],
    from_row: fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    key: fn(&T) -> String,
) -> Result<BTreeMap<String, T>> {
    let mut statement = conn.prepare(&select_sql(table, columns))?;
    let mut out = BTreeMap::new();
    for row in statement.query_map([], from_row)? {
        let row = row?;
        out.insert(key(&row), row);
    }
    Ok(out)
}

/// Every difference between the table's rows and the replay's, in key order.
fn compare<T: Serialize>(
    columns: &[&'static str],
    table: &BTreeMap<String, T>,
    replay: &BTreeMap<String, T>,
) -> Vec<(String, String)> {
    let mut keys: Vec<&String> = table.keys().chain(replay.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let detail = match (table.get(key), replay.get(key)) {
                (None, Some(_)) => "missing from the table (the replay has it)".to_owned(),
                (Some(_), None) => "in the table but not in the replay".to_owned(),
                (Some(stored), Some(rebuilt)) => {
                    let (column, in_table, by_replay) = first_difference(columns, stored, rebuilt)?;
                    format!("{column} is {in_table} in the table, {by_replay} by replay")
                }
                (None, None) => return None,
            };
            Some((key.clone(), detail))
        })
        .collect()
}
