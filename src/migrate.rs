//! `keel migrate --to postgres://…`: moves an embedded SQLite log into PostgreSQL.
//!
//! Owns the command: the source verified first (a log that does not check is refused, nothing
//! written), the vault's decision (a log whose vault holds payment methods is refused unless
//! `--without-vault`: PostgreSQL has no vault, and a charge whose token is left behind can no
//! longer be resent after a crash), the copy stream by stream through
//! `store_postgres::Import` — the runs' streams first (an intent's network retries count on
//! its run's row), then every other stream, each pass in name order, which is the order an
//! interrupted migration resumes in —, then the checks after the copy (PostgreSQL's `verify`,
//! and both sides agreeing: event, intent and run counts, and every intent's and run's row
//! equal), the progress bar and the summary.
//!
//! It never writes to the SQLite log, never names SQL, and never prints the target URL's
//! password. Leases are not copied: they name processes on the SQLite log's machine, which
//! must all be stopped before a migration; on PostgreSQL every run starts unleased and the
//! first worker to claim it reconciles what was in flight.

use crate::backend::PgUrl;
use crate::output::{Failure, Outcome, Output, exit, plural};
use chrono::{DateTime, Utc};
use engine::event::{IntentKey, RunId, StreamId};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;
use store_postgres::{Import, PgReader, Source, Start};

/// Stream names read from SQLite at a time (a few KiB).
const NAMES_PAGE: usize = 1_000;

/// What `keel migrate` was asked.
pub struct Args {
    /// The target database's URL, as given (password included: only [`run`] reads it, as a
    /// [`PgUrl`]).
    pub to: String,
    /// Migrate a log whose vault holds payment methods, leaving them behind.
    pub without_vault: bool,
}

impl std::fmt::Debug for Args {
    /// The target as a [`PgUrl`] shows it (its password hidden), or nothing of it when it is
    /// not one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = PgUrl::parse(&self.to).map_or_else(|_| "(not a postgres:// URL)".to_owned(), |url| url.to_string());
        f.debug_struct("Args").field("to", &to).field("without_vault", &self.without_vault).finish()
    }
}

/// The `--json` summary.
#[derive(Serialize)]
struct Summary {
    status: &'static str,
    /// The target, its password hidden.
    to: String,
    /// Whether this run finished a migration an earlier one started.
    resumed: bool,
    events: u64,
    streams: u64,
    intents: u64,
    runs: u64,
    /// Events this run copied (less than `events` when it resumed).
    copied_events: u64,
    /// Payment methods the SQLite vault held, not migrated.
    vault_entries_left: u64,
    /// The SQLite chain's head hash, recorded in the target's provenance.
    source_head: String,
    seconds: f64,
    events_per_second: f64,
}

fn target_error(to: &PgUrl, error: &store_postgres::Error) -> Failure {
    use store_postgres::Error;
    match error {
        Error::NotEmpty { .. } | Error::OtherImport { .. } | Error::Imported { .. } => {
            Failure::Usage(format!("{to}: {error}; nothing written"))
        }
        Error::Postgres(_) => Failure::Usage(format!("cannot migrate into {to}: {error}")),
        _ => Failure::Internal(format!("migrating into {to}: {error}")),
    }
}

/// Runs `keel migrate` from the log at `db`.
pub fn run(db: &Path, args: &Args, out: &Output, now: &dyn Fn() -> DateTime<Utc>) -> Outcome {
    let Ok(to) = PgUrl::parse(&args.to) else {
        // Not quoted: what is not a URL may still hold its password.
        return Err(Failure::Usage(
            "--to takes a postgres:// URL naming its server and one database \
             (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE)"
                .to_owned(),
        ));
    };
    let started = Instant::now();
    let reader = store::Reader::open(db)
        .map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))?;
    let vault_entries = reader.vault_entries()?;
    if vault_entries > 0 && !args.without_vault {
        return Err(Failure::Usage(format!(
            "the log's vault holds {}, which PostgreSQL cannot keep (the vault is SQLite-only): pass \
             --without-vault to migrate without them (those charges can then no longer be resent after a \
             crash, only reconciled or escalated); nothing written",
            plural(vault_entries, "payment method")
        )));
    }
    let source = verify_source(&reader, out)?;
    let (mut import, start) = Import::begin(&to.url(), &source, now()).map_err(|e| target_error(&to, &e))?;
    let resumed = matches!(start, Start::Resumed(_));
    let before = import.provenance().copied_events;
    if let Start::Resumed(found) = &start {
        errln!(
            "keel: resuming the migration of this log: {} of {} copied",
            plural(found.copied_events, "event"),
            found.source_events
        );
    }
    copy(&reader, &mut import, &to, source.events, out)?;
    let pg = check_target(&reader, &to, &source)?;
    let provenance = import.finish(now()).map_err(|e| target_error(&to, &e))?;
    if vault_entries > 0 {
        errln!("keel: {} of the SQLite vault not migrated (--without-vault)", plural(vault_entries, "payment method"));
    }
    let seconds = started.elapsed().as_secs_f64();
    let copied_events = provenance.copied_events - before;
    let summary = Summary {
        status: "migrated",
        to: to.to_string(),
        resumed,
        events: pg.events,
        streams: pg.streams,
        intents: pg.intents,
        runs: pg.runs,
        copied_events,
        vault_entries_left: vault_entries,
        source_head: provenance.source_head,
        seconds,
        events_per_second: if seconds > 0.0 { copied_events as f64 / seconds } else { 0.0 },
    };
    out.emit(&summary, || {
        outln!(
            "migrated {} ({}, {}) into {} in {:.1} s ({:.0} events/s); PostgreSQL verifies and both sides agree",
            plural(summary.events, "event"),
            plural(summary.intents, "intent"),
            plural(summary.runs, "run"),
            summary.to,
            summary.seconds,
            summary.events_per_second
        );
    });
    Ok(exit::OK)
}

/// Verifies the SQLite log: its chain's head and event count name it; a log that does not
/// verify is refused before anything is written.
fn verify_source(reader: &store::Reader, out: &Output) -> Result<Source, Failure> {
    let progress = out.progress(0, "migrate: verifying the SQLite log");
    let report = reader.verify_with(&mut |step| {
        progress.phase("migrate: verifying the SQLite log", step.total);
        progress.set(step.done);
    })?;
    progress.finish();
    if let Some(first) = report.first_mismatch() {
        return Err(Failure::Internal(format!(
            "the SQLite log does not verify ({}, first: {first}): nothing migrated; `keel verify` shows more",
            plural(report.mismatch_count, "mismatch")
        )));
    }
    Ok(Source { head_hash: report.last_hash, events: report.events })
}

/// Calls `each` with every stream name of one pass, in name order, after `after`: the runs'
/// streams (`runs_pass`), or every other one.
fn walk(
    reader: &store::Reader,
    runs_pass: bool,
    mut after: Option<StreamId>,
    each: &mut dyn FnMut(&StreamId) -> Result<(), Failure>,
) -> Result<(), Failure> {
    loop {
        let page = reader.streams_after(after.as_ref(), NAMES_PAGE)?;
        let Some(last) = page.last().cloned() else { return Ok(()) };
        for name in &page {
            let is_run = name.as_str().starts_with("run:");
            if is_run == runs_pass {
                each(name)?;
            } else if runs_pass || is_run {
                // Past the runs (first pass), or into them (second pass): the pass is over.
                return Ok(());
            }
        }
        after = Some(last);
    }
}

/// Copies every stream not yet copied, runs first, each pass in name order, and commits.
fn copy(reader: &store::Reader, import: &mut Import, to: &PgUrl, total: u64, out: &Output) -> Result<(), Failure> {
    let progress = out.progress(total, "migrate: copying events");
    progress.set(import.provenance().copied_events);
    let cursor = import.provenance().cursor.clone().map(StreamId::from_stored);
    let in_runs = cursor.as_ref().is_none_or(|c| c.as_str().starts_with("run:"));
    let mut copy_one = |name: &StreamId| -> Result<(), Failure> {
        let events = reader.stream(name)?;
        let n = events.len() as u64;
        import.push_stream(events).map_err(|e| target_error(to, &e))?;
        progress.inc(n);
        Ok(())
    };
    if in_runs {
        // The runs pass from the first run's name (or after the cursor), then the other from the start.
        let from = cursor.unwrap_or_else(|| StreamId::from_stored("run:".to_owned()));
        walk(reader, true, Some(from), &mut copy_one)?;
        walk(reader, false, None, &mut copy_one)?;
    } else {
        walk(reader, false, cursor, &mut copy_one)?;
    }
    progress.finish();
    import.commit_pending().map_err(|e| target_error(to, &e))
}

/// The entities of a page of stream names, compared together.
#[derive(Default)]
struct Page {
    intents: Vec<IntentKey>,
    runs: Vec<RunId>,
}

/// PostgreSQL's `verify`, then both sides compared: counts, and every intent's and run's row.
fn check_target(reader: &store::Reader, to: &PgUrl, source: &Source) -> Result<store_postgres::VerifyReport, Failure> {
    let unreachable = |e: store_postgres::Error| target_error(to, &e);
    let mut pg = PgReader::open(&to.url()).map_err(unreachable)?;
    let report = pg.verify().map_err(unreachable)?;
    if let Some(first) = report.first_mismatch() {
        return Err(Failure::Internal(format!(
            "the PostgreSQL log does not verify after the copy ({}, first: {first}); the migration stays unfinished",
            plural(report.mismatch_count, "mismatch")
        )));
    }
    let disagree = |what: String| {
        Failure::Internal(format!("the two logs disagree after the copy: {what}; the migration stays unfinished"))
    };
    if report.events != source.events {
        return Err(disagree(format!("{} events in SQLite, {} in PostgreSQL", source.events, report.events)));
    }
    // A page of names at a time: one query on each side's rows, not a round trip an entity.
    let mut page = Page::default();
    let mut compare_page = |page: &mut Page| -> Result<(), Failure> {
        let (keys, run_ids) = (std::mem::take(&mut page.intents), std::mem::take(&mut page.runs));
        for (key, row) in keys.iter().zip(pg.intents(&keys).map_err(unreachable)?) {
            if reader.intent_entity(key)? != row {
                return Err(disagree(format!("intent {key} differs")));
            }
        }
        for (run_id, row) in run_ids.iter().zip(pg.runs(&run_ids).map_err(unreachable)?) {
            if reader.run_entity(run_id)? != row {
                return Err(disagree(format!("run {run_id} differs")));
            }
        }
        Ok(())
    };
    let mut compare = |name: &StreamId| -> Result<(), Failure> {
        let text = name.as_str();
        if let Some(key) = text.strip_prefix("intent:") {
            let key = IntentKey::parse(key).ok_or_else(|| disagree(format!("stream {text} names no intent key")))?;
            page.intents.push(key);
        } else if let Some(run_id) = text.strip_prefix("run:") {
            page.runs.push(RunId::new(run_id));
        }
        if page.intents.len() + page.runs.len() >= NAMES_PAGE { compare_page(&mut page) } else { Ok(()) }
    };
    walk(reader, true, Some(StreamId::from_stored("run:".to_owned())), &mut compare)?;
    walk(reader, false, None, &mut compare)?;
    compare_page(&mut page)?;
    Ok(report)
}
