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

/// How long the writer keeps asking for the write lock before a batch fails, in busy
/// timeouts of [`Options::busy_timeout_ms`] each (the default of
/// [`Options::write_lock_patience_ms`]). SQLite's busy handler is not fair: with
/// several processes writing one file under load, one of them can lose the lock for longer
/// than one timeout while the others take turns. Nothing of the batch is written before the
/// lock is held, so asking again is safe; past this the other side is taken to be stuck and
/// the callers are told (`LogError::Unavailable`, nothing committed).
pub const WRITE_LOCK_PATIENCE_MS: u64 = 60_000;

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
    /// How long an open or a batch keeps asking for a write lock another process holds.
    /// Default [`WRITE_LOCK_PATIENCE_MS`]; a test of what happens past it shortens it.
    pub write_lock_patience_ms: u64,
    /// Crash points inside the writer (`in_batch_before_commit`, `after_commit_before_answer`).
    /// Disarmed by default; only crash tests arm them, through the binary's `KEEL_FAILPOINT`.
    pub failpoints: engine::failpoints::Failpoints,
    /// How long a run lease lasts unless renewed. Default
    /// [`engine::limits::LEASE_TTL_DEFAULT_MS`].
    pub lease_ttl_ms: u64,
    /// What the host can tell about another lease holder. Default: nothing (leases are taken
    /// only once expired); the binary passes a probe that reads `/proc`.
    pub owner_probe: std::sync::Arc<dyn engine::lease::OwnerProbe>,
    /// The payment-method vault's key: with one, a reservation's payment method is sealed
    /// beside the log and [`engine::log::EventLog::unseal`] opens it; without, nothing is
    /// kept (entries of final intents are deleted either way). Default: none.
    pub vault: Option<crate::vault::VaultKey>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .field("write_lock_patience_ms", &self.write_lock_patience_ms)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("vault", &self.vault.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Full,
            busy_timeout_ms: BUSY_TIMEOUT_DEFAULT_MS,
            write_lock_patience_ms: WRITE_LOCK_PATIENCE_MS,
            failpoints: engine::failpoints::Failpoints::disarmed(),
            lease_ttl_ms: engine::limits::LEASE_TTL_DEFAULT_MS,
            owner_probe: std::sync::Arc::new(engine::lease::ExpiryOnly),
            vault: None,
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

/// Version 3: the compact layout (`store/FORMAT.md`, "Version 3"). The text rows of versions
/// 1 and 2 stay as they are in `events_v1`, closed to new rows; new events go to the compact
/// `events`, the chain continuing across. The projections become entity rows holding each
/// intent's and run's whole state, rebuilt from the old rows by [`rebuild_entities`].
const V3: &str = r#"
-- The text rows of versions 1 and 2, untouched: their hashes are over exactly these bytes.
ALTER TABLE events RENAME TO events_v1;
DROP TRIGGER events_no_update;
DROP TRIGGER events_no_delete;
CREATE TRIGGER events_v1_no_update BEFORE UPDATE ON events_v1
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;
CREATE TRIGGER events_v1_no_delete BEFORE DELETE ON events_v1
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;
CREATE TRIGGER events_v1_no_insert BEFORE INSERT ON events_v1
BEGIN
    SELECT RAISE(ABORT, 'events_v1 is closed: new events are appended to events');
END;

-- The old projections are derived: dropped and rebuilt as entity rows below.
DROP INDEX intents_by_status;
DROP TABLE intents;
DROP TABLE runs;

-- Stream names, numbered in order of first use (so new ids land on the right edge of every
-- b-tree keyed by them). The UNIQUE index serves every lookup by intent key or run id.
CREATE TABLE streams (
    id   INTEGER PRIMARY KEY,
    name TEXT    NOT NULL UNIQUE
) STRICT;

-- Who caused events (`command:charge`, `recovery`, `operator:ann`): a handful of names.
-- The UNIQUE index serves the writer's lookup of an actor's id.
CREATE TABLE actors (
    id   INTEGER PRIMARY KEY,
    name TEXT    NOT NULL UNIQUE
) STRICT;

-- The log since version 3. `seq` is the rowid: the scans in seq order (`verify`, catch-up,
-- the tail check at open) and the head read (`ORDER BY seq DESC LIMIT 1`) use its b-tree.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY CHECK (seq >= 1),
    stream     INTEGER NOT NULL REFERENCES streams (id),
    stream_seq INTEGER NOT NULL CHECK (stream_seq >= 1),
    type       INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    actor      INTEGER NOT NULL REFERENCES actors (id),
    cause_run  INTEGER REFERENCES streams (id),
    payload    BLOB    NOT NULL,
    hash       BLOB    NOT NULL CHECK (length(hash) = 32),
    -- Its index serves one stream's history in stream order (`Reader::stream`, a run's
    -- replay, an entity's first event) and the stream's length; the constraint turns a
    -- writer racing on a stale view into a conflict instead of a fork.
    UNIQUE (stream, stream_seq)
) STRICT;

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only');
END;

-- Entity row: one run's whole state (`engine::ledger::Run`, packed), rewritten in the
-- transaction of every event that changes it.
CREATE TABLE runs (
    stream   INTEGER PRIMARY KEY REFERENCES streams (id),
    finished INTEGER NOT NULL CHECK (finished IN (0, 1)),
    state    BLOB    NOT NULL
) STRICT;

-- `View::unfinished_runs` and `keel resume`: only the runs still running are in it.
CREATE INDEX runs_unfinished ON runs (stream) WHERE finished = 0;

-- Entity row: one intent's state (`engine::ledger::Intent` but its definition, packed),
-- rewritten in the transaction of every event that changes it.
CREATE TABLE intents (
    stream INTEGER PRIMARY KEY REFERENCES streams (id),
    run    INTEGER NOT NULL REFERENCES runs (stream),
    status INTEGER NOT NULL CHECK (status BETWEEN 1 AND 10),
    due_at INTEGER,
    state  BLOB    NOT NULL
) STRICT;

-- `keel intents --state S` and `View::in_flight` (recovery): one status's intents. Ids grow
-- with time, so an intent moving status lands near the right edge of its new status.
CREATE INDEX intents_by_status ON intents (status);
-- `View::due` (`keel reconcile --due`, `keel resume`): only unknown intents with a due time.
CREATE INDEX intents_due ON intents (due_at) WHERE due_at IS NOT NULL;
-- `View::run_intents`: a run's money budget and what it leaves behind.
CREATE INDEX intents_by_run ON intents (run);

-- `View::order_intents`: an order's cumulative invariants. Written once, at reservation.
CREATE TABLE orders (
    tenant   TEXT    NOT NULL,
    order_id TEXT    NOT NULL,
    intent   INTEGER NOT NULL REFERENCES intents (stream),
    PRIMARY KEY (tenant, order_id, intent)
) STRICT, WITHOUT ROWID;

-- `View::reference_charges`: charges whose business reference is not their order id (the
-- others are found through `orders`). Written once, at reservation.
CREATE TABLE refs (
    tenant       TEXT    NOT NULL,
    business_ref TEXT    NOT NULL,
    intent       INTEGER NOT NULL REFERENCES intents (stream),
    PRIMARY KEY (tenant, business_ref, intent)
) STRICT, WITHOUT ROWID;

-- The last sequence whose chain a writer checked (or wrote): `Store::open` checks only the
-- events after it. 0 after this migration, so the first open checks the older rows once.
INSERT INTO meta (key, value) VALUES ('verified_seq', '0');
UPDATE meta SET value = 'sha256 over canonical JSON of (prev, seq, stream, stream_seq, at, type, cause, payload), both layouts'
    WHERE key = 'hash_chain';
"#;

/// Version 4: compact lease rows. A lease names its run by stream id and its holder by an id
/// in `owners` (a process holds many runs: its host, pid, start time and nonce were repeated in
/// every row), so a run's lease costs a few bytes instead of about 150.
const V4: &str = r#"
-- Lease holders (`engine::lease::LeaseOwner` as JSON), one row per process that ever held a
-- run. The UNIQUE index serves the writer's lookup of a holder's id.
CREATE TABLE owners (
    id    INTEGER PRIMARY KEY,
    owner TEXT    NOT NULL UNIQUE
) STRICT;

-- One row per run ever leased; a released hold keeps its row (and its token, so the next
-- claim takes the one after) with no expiry. Read by primary key when a command writes for a
-- run (the fencing check) or claims one (`ClaimRun`, `Recover`).
CREATE TABLE leases_v4 (
    run        INTEGER PRIMARY KEY REFERENCES streams (id),
    owner      INTEGER NOT NULL REFERENCES owners (id),
    token      INTEGER NOT NULL CHECK (token >= 1),
    expires_at TEXT
) STRICT;

INSERT INTO owners (owner) SELECT DISTINCT owner FROM leases ORDER BY owner;
INSERT OR IGNORE INTO streams (name) SELECT 'run:' || run_id FROM leases ORDER BY run_id;
INSERT INTO leases_v4 (run, owner, token, expires_at)
    SELECT s.id, o.id, l.token, l.expires_at FROM leases l
    JOIN streams s ON s.name = 'run:' || l.run_id
    JOIN owners o ON o.owner = l.owner;
DROP TABLE leases;
ALTER TABLE leases_v4 RENAME TO leases;
"#;

/// Version 5: the payment-method vault, outside the hash chain (like `leases`). An entry is
/// kept by the reservation that carried the secret and deleted in the commit that makes its
/// intent final; `store::vault` owns every statement on these tables.
const V5: &str = r#"
-- One sealed payment method per intent that may still need a resend: AES-256-GCM, a random
-- 12-byte nonce first, the intent key as associated data. Read and deleted by primary key
-- (`unseal`, shredding in the writer's commit).
CREATE TABLE vault (
    intent_key TEXT    PRIMARY KEY,
    sealed     BLOB    NOT NULL CHECK (length(sealed) >= 28),
    kept_at    INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Serves `keel vault purge --older-than D`: the entries kept before an instant.
CREATE INDEX vault_by_kept_at ON vault (kept_at);

-- The key check value: a fixed text sealed under the vault's key, so that a process started
-- with another key is refused before it keeps anything. One row, once a key was used.
CREATE TABLE vault_key (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    check_value BLOB    NOT NULL,
    set_at      INTEGER NOT NULL
) STRICT;
"#;

/// Version 6: API keys for `keel serve` (`crate::keys`). Outside the event log and its hash
/// chain: a key is who may knock at the door, not a fact about an effect. The events a key's
/// request causes name the key (its name, in the cause), so the audit trail stays in the log.
const V6: &str = r#"
-- One row per API key ever created; a revoked key keeps its row (with `revoked_at`), so a
-- name is never reused and a request signed with an old secret is told it was revoked.
-- Read by primary key on every request (`KeyBook::find`); `name` is UNIQUE for
-- `keel keys revoke NAME`.
CREATE TABLE api_keys (
    id            TEXT    PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    tenant        TEXT    NOT NULL,
    role          TEXT    NOT NULL CHECK (role IN ('submit', 'read', 'operator')),
    secret_sha256 TEXT    NOT NULL CHECK (length(secret_sha256) = 64),
    created_at    TEXT    NOT NULL,
    revoked_at    TEXT
) STRICT;
"#;

/// Version 7: the metrics projection (`store::metrics`), one narrow row per intent and per
/// run, written in the transaction of every event that changes the entity, so `keel metrics`
/// reads integer columns instead of the events, filled from the entity rows already there;
/// and each event's causing event (`cause.parent`, `keel trace`).
const V7: &str = r#"
-- One row per intent: its operation (1 charge, 2 refund), status (the `intents.status`
-- codes), evidence once validated (0 none, 1 the provider's receipt, 2 a lookup, 3 an
-- operator's unconfirmed word), deduplications, when it was reserved, when its outcome became
-- definitive, and while unknown when it becomes ambiguous (all microseconds since the epoch).
CREATE TABLE intent_facts (
    intent       INTEGER PRIMARY KEY REFERENCES intents (stream),
    run          INTEGER NOT NULL REFERENCES runs (stream),
    kind         INTEGER NOT NULL CHECK (kind IN (1, 2)),
    status       INTEGER NOT NULL CHECK (status BETWEEN 1 AND 10),
    evidence     INTEGER NOT NULL CHECK (evidence BETWEEN 0 AND 3),
    dedups       INTEGER NOT NULL CHECK (dedups >= 0),
    reserved_at  INTEGER NOT NULL,
    settled_at   INTEGER,
    ambiguous_at INTEGER
) STRICT;

-- `keel metrics --since T`: the intents reserved since an instant.
CREATE INDEX intent_facts_by_reserved ON intent_facts (reserved_at);
-- `keel metrics --by operation`: a run's intents.
CREATE INDEX intent_facts_by_run ON intent_facts (run);

-- One row per run: when it started, its workflow, how it ended (`RunStatus` name, NULL while
-- running), what it spent on models, and the versions it ran under (NULL when unknown).
CREATE TABLE run_facts (
    run        INTEGER PRIMARY KEY REFERENCES runs (stream),
    started_at INTEGER NOT NULL,
    workflow   TEXT    NOT NULL,
    status     TEXT,
    cost_minor INTEGER NOT NULL,
    release    TEXT,
    prompt     TEXT,
    policy     TEXT,
    model      TEXT
) STRICT;

-- `keel metrics --since T`: the runs started since an instant.
CREATE INDEX run_facts_by_started ON run_facts (started_at);

-- The cause's parent: the seq of the event that caused this one (`keel trace`). NULL for a
-- run's first event and for every event written before it was recorded.
ALTER TABLE events ADD COLUMN cause_parent INTEGER CHECK (cause_parent >= 1);
"#;

/// Version 8: durable timers. A run waiting on its timer (`Run::wake_at`) carries the fire
/// time in a column, so a resume pass finds the runs whose timer is due, and those still
/// asleep, through an index instead of replaying every unfinished run.
const V8: &str = r#"
-- When the run's durable timer fires, while it waits on one (microseconds since the epoch,
-- the `wake_at` of its state); NULL without a timer and once it finished.
ALTER TABLE runs ADD COLUMN wake_at INTEGER;

-- `View::sleeping_runs` (asleep: fires after now) and the due half of `View::awake_runs`
-- (fired: at or before now), by fire time.
CREATE INDEX runs_sleeping ON runs (wake_at) WHERE wake_at IS NOT NULL;
-- The other half of `View::awake_runs`: unfinished runs waiting on no timer.
CREATE INDEX runs_awake ON runs (stream) WHERE finished = 0 AND wake_at IS NULL;
"#;

/// Version 9: the metrics projection counts refused resends (`ResendRefused`, a new event)
/// and names the agent tool that proposed each intent (`IntentDefinition::tool`, a new
/// field): every file before it has neither, so 0 and NULL are every old row's exact values.
const V9: &str = r#"
-- Another run's proposals of the intent while no new attempt could come of them: the
-- intent's `resends_refused` (`keel metrics`: retries prevented).
ALTER TABLE intent_facts ADD COLUMN refused INTEGER NOT NULL DEFAULT 0 CHECK (refused >= 0);
-- The agent tool whose call proposed the intent; NULL for a workflow's own intent
-- (`keel metrics --by tool` reads its operation then).
ALTER TABLE intent_facts ADD COLUMN tool TEXT;
"#;

/// Version 10: the metrics projection tells an unknown model cost from a cost of 0. An agent
/// run some of whose answers had no price records no cost (`RunFinished.cost_minor` absent),
/// and `run_facts.cost_minor` holds 0 for it; the back-fill marks the finished agent runs the
/// file already holds without a recorded cost.
const V10: &str = r#"
-- 1 when the run is a finished agent run whose model cost is unknown (an answer from a model
-- without a price, or a run recorded before its cost was): `keel metrics` counts such runs
-- and computes no average over them.
ALTER TABLE run_facts ADD COLUMN cost_unknown INTEGER NOT NULL DEFAULT 0 CHECK (cost_unknown IN (0, 1));
"#;

/// Version 11: per-entry data keys for the vault (`store::vault`, "Shredding"). An entry kept
/// from now on is sealed under a random data key of its own, itself sealed under the vault key
/// in a slot of the keys file beside the log, which shredding zeroes in place: a deleted
/// entry's bytes lingering in free pages or the WAL then open under no key. Entries already
/// there keep no slot and stay sealed under the vault key itself (`keel vault rotate` gives
/// them one).
const V11: &str = r#"
-- The slot of the entry's data key in the keys file (`<log>-vault-keys`); NULL for an entry
-- kept before version 11, sealed under the vault key itself.
ALTER TABLE vault ADD COLUMN slot INTEGER CHECK (slot >= 0);
-- One entry per slot. Serves the free-slot search of `keep` (the lowest slot no entry holds)
-- and the slots `sweep` must keep.
CREATE UNIQUE INDEX vault_by_slot ON vault (slot) WHERE slot IS NOT NULL;
"#;

/// One forward migration: its SQL, then what it must compute in Rust.
pub struct Migration {
    /// The statements.
    pub sql: &'static str,
    /// Run after the statements, in the same transaction.
    pub then: Option<fn(&Connection) -> Result<()>>,
}

/// The migrations, in order: entry `i` takes `user_version` from `i` to `i + 1`.
pub const MIGRATIONS: &[Migration] = &[
    Migration { sql: V1, then: None },
    Migration { sql: V2, then: None },
    Migration { sql: V3, then: Some(rebuild_entities) },
    Migration { sql: V4, then: None },
    Migration { sql: V5, then: None },
    Migration { sql: V6, then: None },
    Migration { sql: V7, then: Some(crate::metrics::backfill) },
    Migration { sql: V8, then: Some(crate::rebuild::wake_timers) },
    Migration { sql: V9, then: None },
    Migration { sql: V10, then: Some(crate::metrics::backfill_cost_unknown) },
    Migration { sql: V11, then: None },
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Version 3's Rust half: names every stream of the old rows (in order of first appearance)
/// and rebuilds the entity rows by replaying each stream alone (`crate::rebuild`). Reads the
/// old events once, stream by stream: the one migration step whose cost is the history's.
fn rebuild_entities(conn: &Connection) -> Result<()> {
    conn.execute_batch(
        // Foreign keys are checked at commit: intents are rebuilt before their runs.
        "PRAGMA defer_foreign_keys = ON;
         INSERT INTO streams (name) SELECT stream FROM events_v1 GROUP BY stream ORDER BY min(seq);",
    )?;
    crate::rebuild::replay_streams(conn, &mut |found| crate::rebuild::write(conn, found), &mut |_| {})?;
    Ok(())
}

/// WAL pages after which a commit checkpoints inline (16 MiB at 4 KiB pages): four times
/// SQLite's default, because the background checkpointer usually keeps the WAL far shorter.
pub const WAL_AUTOCHECKPOINT_PAGES: u32 = 4_000;

/// Opens the writer's connection: creates the file if needed, sets every PRAGMA, migrates.
pub(crate) fn open_writer(path: &Path, options: &Options) -> Result<Connection> {
    create_owner_only(path);
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
    // Enforce every `REFERENCES`: an event names a stream and an actor that exist, an entity
    // row names its stream and run. The default depends on how SQLite was compiled (off in stock builds), so say it.
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Overwrite deleted content with zeros: a shredded vault entry, a revoked key's row, must
    // not linger in a page's free space or on the freelist, where the next reader of the file
    // finds it. Off in stock builds. Every connection that deletes goes through here (the
    // writer, `keel vault rotate|purge`); the WAL's old frames are `store::vault`'s concern.
    conn.pragma_update(None, "secure_delete", "ON")?;
    // Checkpoints normally run on their own thread (`checkpoint.rs`), not inside the
    // writer's COMMIT. This inline one is the bound for when that thread falls behind: at
    // WAL_AUTOCHECKPOINT_PAGES the commit checkpoints itself, as SQLite does by default at 1000.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    // 32 MiB of page cache: the writer's inserts and projection upserts touch the same hot
    // b-tree pages batch after batch; re-reading them was 5% of its time.
    conn.pragma_update(None, "cache_size", -32_768)?;
    // The writer reuses a handful of statements per event; keep them all prepared.
    conn.set_prepared_statement_cache_capacity(32);
    with_write_lock_patience(
        options.write_lock_patience_ms,
        || migrate(&mut conn),
        |detail| {
            tracing::warn!(%detail, "another process holds the event log's write lock while this one opens; asking again");
        },
    )?;
    Ok(conn)
}

/// Creates the database file `path`, empty and readable by its owner only (0600), unless it
/// exists. SQLite would create it 0644 (less the umask) and gives the `-wal` and `-shm` it
/// creates the database's mode, while the log holds every payment event, the vault and the
/// API keys' hashes: the mode is set here, before SQLite's first byte. An empty file is an
/// empty database to SQLite. A file that exists keeps the mode its owner gave it; one that
/// cannot be created here (no such directory) is left to SQLite's open, whose error says so.
fn create_owner_only(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    if let Err(error) = created
        && error.kind() != std::io::ErrorKind::AlreadyExists
    {
        tracing::debug!(%error, path = %path.display(), "the log's file was not created owner-only beforehand");
    }
}

/// Runs `work`, whose first statement asks for the write lock, again while another process
/// holds that lock, up to `patience_ms` ([`Options::write_lock_patience_ms`]): each try
/// waits one busy timeout in SQLite's handler (which is not fair: under many processes one
/// can lose the lock for longer than a timeout while the others take turns), and `waited` is
/// told of each. `work` must write nothing before it holds the lock, so a try that failed
/// left nothing behind.
pub(crate) fn with_write_lock_patience<T>(
    patience_ms: u64,
    mut work: impl FnMut() -> Result<T>,
    mut waited: impl FnMut(&str),
) -> Result<T> {
    let patience = std::time::Instant::now() + Duration::from_millis(patience_ms);
    loop {
        match work() {
            Err(Error::Busy { detail }) if std::time::Instant::now() < patience => waited(&detail),
            other => return other,
        }
    }
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
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(from) {
        tx.execute_batch(migration.sql)?;
        if let Some(then) = migration.then {
            then(&tx)?;
        }
        let version = i64::try_from(index + 1).expect("a handful of migrations fits in i64");
        tx.pragma_update(None, "user_version", version)?;
        tracing::info!(version, "store schema migrated");
    }
    tx.commit()?;
    Ok(())
}
