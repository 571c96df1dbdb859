//! Connection settings and the forward-only schema migrations.
//!
//! Every PRAGMA Keel relies on is set here, explicitly, with the reason next to it: the
//! defaults of a SQLite build are not a contract. The schema is versioned by
//! `PRAGMA user_version`; [`MIGRATIONS`]`[i]` takes a database from version `i` to `i + 1`,
//! and a released migration is never edited (add the next one instead). `store/FORMAT.md`
//! describes the resulting tables in prose.

use crate::error::{Error, Result};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// How long a connection waits for another one's write lock before giving up with
/// [`Error::Busy`]. Two processes on one file take turns per batch, and a batch commits in
/// milliseconds, so five seconds only runs out when the other side is stuck.
// This is a tuning default of the store, not an engine bound, so it lives here rather than in
// `engine::limits`.
pub const BUSY_TIMEOUT_DEFAULT_MS: u64 = 5_000;

/// What an acknowledged commit survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `PRAGMA synchronous = FULL`: the WAL is fsynced at every commit, so an acknowledged
    /// commit survives power loss. The default, and what the SPEC promises.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: in WAL mode an acknowledged commit survives a crash of
    /// the process, but the last commits may be lost on power loss or an OS crash (the WAL is
    /// fsynced only at checkpoints). The log stays consistent either way: what is lost is a
    /// suffix, never a hole.
    Normal,
}

impl Durability {
    fn pragma_value(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// How [`crate::Store::open`] sets up the database.
#[derive(Clone)]
pub struct Options {
    /// What an acknowledged commit survives. Default [`Durability::Full`].
    pub durability: Durability,
    /// See [`BUSY_TIMEOUT_DEFAULT_MS`].
    pub busy_timeout_ms: u64,
    /// Crash points inside the writer (`in_batch_before_commit`, `after_commit_before_answer`).
    /// Disarmed by default; only crash tests arm them, through the binary's `KEEL_FAILPOINT`.
    pub failpoints: engine::failpoints::Failpoints,
    /// How long a run lease lasts unless renewed. Default
    /// [`engine::limits::LEASE_TTL_DEFAULT_MS`].
    pub lease_ttl_ms: u64,
    /// What the host can tell about another lease holder. Default: nothing (leases are taken
    /// only once expired); the binary passes a probe that reads `/proc`.
    pub owner_probe: std::sync::Arc<dyn engine::lease::OwnerProbe>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .finish_non_exhaustive()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Full,
            busy_timeout_ms: BUSY_TIMEOUT_DEFAULT_MS,
            failpoints: engine::failpoints::Failpoints::disarmed(),
            lease_ttl_ms: engine::limits::LEASE_TTL_DEFAULT_MS,
            owner_probe: std::sync::Arc::new(engine::lease::ExpiryOnly),
        }
    }
}

/// Version 1: the event log, its append-only triggers, the projections, `meta`.
const V1: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;

INSERT INTO meta (key, value) VALUES
    ('format', 'keel event log: see store/FORMAT.md'),
    ('hash_chain', 'sha256 over canonical JSON of (prev, seq, stream, stream_seq, at, type, cause, payload)');

-- The log. `seq` is the rowid: `events_since`, the fold on open and `verify` scan it in
-- order, and the writer's catch-up asks for max(seq), all through the rowid b-tree.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY CHECK (seq >= 1),
    stream     TEXT    NOT NULL,
    stream_seq INTEGER NOT NULL CHECK (stream_seq >= 1),
    type       TEXT    NOT NULL,
    at         TEXT    NOT NULL,
    cause      TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    prev_hash  TEXT    NOT NULL CHECK (length(prev_hash) = 64),
    hash       TEXT    NOT NULL CHECK (length(hash) = 64),
    -- Its index serves `Reader::stream` (one stream's history in stream order), and the
    -- constraint turns a writer racing on a stale view into a conflict instead of a fork.
    UNIQUE (stream, stream_seq)
) STRICT;

-- Append-only is the database's job, not a convention.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

-- Projection: one row per run, rebuilt from the fold by `verify`.
CREATE TABLE runs (
    run_id               TEXT    PRIMARY KEY,
    workflow             TEXT    NOT NULL,
    status               TEXT    NOT NULL,
    detail               TEXT,
    started_at           TEXT    NOT NULL,
    deadline_at          TEXT    NOT NULL,
    cost_committed_minor INTEGER NOT NULL,
    cost_minor_max       INTEGER,
    intents              INTEGER NOT NULL,
    journal_len          INTEGER NOT NULL,
    last_seq             INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Projection: one row per intent, rebuilt from the fold by `verify`.
CREATE TABLE intents (
    key                   TEXT    PRIMARY KEY,
    kind                  TEXT    NOT NULL,
    tenant                TEXT    NOT NULL,
    intent_id             TEXT    NOT NULL,
    order_id              TEXT    NOT NULL,
    business_ref          TEXT    NOT NULL,
    status                TEXT    NOT NULL,
    fingerprint           TEXT    NOT NULL,
    amount_minor          INTEGER NOT NULL,
    currency              TEXT    NOT NULL,
    run_id                TEXT    NOT NULL REFERENCES runs (run_id),
    capability            TEXT    NOT NULL,
    attempts              INTEGER NOT NULL,
    attempts_max          INTEGER NOT NULL,
    reconciliations       INTEGER NOT NULL,
    reconciliations_max   INTEGER NOT NULL,
    source                TEXT,
    provider_ref          TEXT,
    decline_code          TEXT,
    unknown_reason        TEXT,
    reconcile_after       TEXT,
    first_sent_at         TEXT,
    last_sent_at          TEXT,
    approval_required     INTEGER NOT NULL CHECK (approval_required IN (0, 1)),
    approval_expires_at   TEXT,
    absence_proven        INTEGER NOT NULL CHECK (absence_proven IN (0, 1)),
    note                  TEXT,
    duplicates_suppressed INTEGER NOT NULL,
    last_seq              INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- `keel intents --state S` (`Reader::intents(Some(status))`): filter by status, in key order.
CREATE INDEX intents_by_status ON intents (status, key);
"#;

/// Version 2: run leases (`engine::lease`): who holds each run, its fencing token and until
/// when. Operational state the holder renews every few seconds and that a claim, a renewal or
/// a release changes without any event, so it lives here, outside the hash chain and outside
/// `verify`'s rebuild (`RunStarted.owner` records who started a run, for the record).
const V2: &str = r#"
-- One row per run ever leased; a released hold keeps its row (and its token, so the next
-- claim takes the one after) with no expiry. Read by primary key when a command writes for a
-- run (the fencing check) or claims one (`ClaimRun`, `Recover`).
CREATE TABLE leases (
    run_id     TEXT    PRIMARY KEY,
    owner      TEXT    NOT NULL,
    token      INTEGER NOT NULL CHECK (token >= 1),
    expires_at TEXT
) STRICT, WITHOUT ROWID;
"#;

/// The migrations, in order: entry `i` takes `user_version` from `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// WAL pages after which a commit checkpoints inline (16 MiB at 4 KiB pages): four times
/// SQLite's default, because the background checkpointer usually keeps the WAL far shorter.
pub const WAL_AUTOCHECKPOINT_PAGES: u32 = 4_000;

/// Opens the writer's connection: creates the file if needed, sets every PRAGMA, migrates.
pub(crate) fn open_writer(path: &Path, options: &Options) -> Result<Connection> {
    let mut conn = Connection::open(path)?;
    // Wait for another process's write lock instead of failing at once: two `Store`s on one
    // file take turns per batch.
    conn.busy_timeout(Duration::from_millis(options.busy_timeout_ms))?;
    // WAL: readers never block the writer nor the writer them, and a commit is one append
    // plus one fsync of the WAL instead of a rollback journal's two.
    //
    // Switching a fresh file to WAL needs an exclusive lock, and SQLite answers BUSY at once
    // there instead of calling the busy handler: two processes opening a new file together
    // would see "database is locked". Retry within the same busy timeout.
    let patience = std::time::Instant::now() + Duration::from_millis(options.busy_timeout_ms);
    let mode: String = loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < patience =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => break other?,
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::corrupt(0, format!("the database refused WAL mode (journal_mode is {mode})")));
    }
    // FULL: an acknowledged commit survives power loss (the SPEC's default); NORMAL trades
    // the last commits on power loss for fewer fsyncs. See `Durability`.
    conn.pragma_update(None, "synchronous", options.durability.pragma_value())?;
    // Enforce `intents.run_id → runs`: a projection row never names a run the projection
    // lacks. The default depends on how SQLite was compiled (off in stock builds), so say it.
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Checkpoints normally run on their own thread (`checkpoint.rs`), not inside the
    // writer's COMMIT. This inline one is the bound for when that thread falls behind: at
    // WAL_AUTOCHECKPOINT_PAGES the commit checkpoints itself, as SQLite does by default at 1000.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    // 32 MiB of page cache: the writer's inserts and projection upserts touch the same hot
    // b-tree pages batch after batch; re-reading them was 5% of its time.
    conn.pragma_update(None, "cache_size", -32_768)?;
    // The writer reuses a handful of statements per event; keep them all prepared.
    conn.set_prepared_statement_cache_capacity(32);
    migrate(&mut conn)?;
    Ok(conn)
}

/// Opens a read-only connection for a reader and checks the schema version.
pub(crate) fn open_reader(path: &Path) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    // A reader may meet a writer's checkpoint or a migration in progress: wait, don't fail.
    conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_DEFAULT_MS))?;
    // Belt and braces over the read-only open: no statement on this connection may write.
    conn.pragma_update(None, "query_only", "ON")?;
    conn.set_prepared_statement_cache_capacity(16);
    let found = user_version(&conn)?;
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew { found, supported: SCHEMA_VERSION });
    }
    if found < SCHEMA_VERSION {
        return Err(Error::SchemaTooOld { found, supported: SCHEMA_VERSION });
    }
    Ok(conn)
}

fn user_version(conn: &Connection) -> Result<i64> {
    Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// Runs every migration the database lacks, in one IMMEDIATE transaction, so two processes
/// opening a fresh file at once migrate it exactly once (the second sees the new version).
fn migrate(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = user_version(&tx)?;
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew { found, supported: SCHEMA_VERSION });
    }
    let from = usize::try_from(found).map_err(|_| Error::corrupt(0, format!("negative user_version {found}")))?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(from) {
        tx.execute_batch(sql)?;
        let version = i64::try_from(index + 1).expect("a handful of migrations fits in i64");
        tx.pragma_update(None, "user_version", version)?;
        tracing::info!(version, "store schema migrated");
    }
    tx.commit()?;
    Ok(())
}
