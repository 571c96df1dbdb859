//! The PostgreSQL schema and its forward-only, versioned migrations.
//!
//! Owns [`MIGRATIONS`] (version `n` is `MIGRATIONS[n - 1]`, applied once, in order, in one
//! transaction with the `keel_meta.schema_version` row they raise) and [`migrate`].
//! A migration is never edited once released: a change is a new one. `store/FORMAT.md`
//! ("PostgreSQL") describes the tables.

use crate::error::{Error, Result};
use postgres::Client;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[&str] = &[
    // Version 1: the event log, the entity rows, leases, commit ids.
    r"
    CREATE SEQUENCE events_seq AS bigint START 1;
    CREATE TABLE events (
        seq        bigint PRIMARY KEY,
        stream     text NOT NULL,
        stream_seq bigint NOT NULL CHECK (stream_seq >= 1),
        at         timestamptz NOT NULL,
        type       text NOT NULL,
        cause      text NOT NULL,
        payload    text NOT NULL,
        prev_hash  text NOT NULL,
        hash       text NOT NULL,
        -- A racing writer gets a conflict instead of a fork; also serves every stream read.
        UNIQUE (stream, stream_seq)
    );
    CREATE FUNCTION keel_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'keel events are append-only: % refused', TG_OP;
    END
    $$;
    CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
        FOR EACH ROW EXECUTE FUNCTION keel_events_append_only();
    CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
        FOR EACH STATEMENT EXECUTE FUNCTION keel_events_append_only();

    CREATE TABLE intents (
        key          text PRIMARY KEY,
        tenant       text NOT NULL,
        order_id     text NOT NULL,
        business_ref text NOT NULL,
        kind         text NOT NULL,
        run_id       text NOT NULL,
        status       text NOT NULL,
        due_at       timestamptz,
        reserved_seq bigint NOT NULL,
        stream_len   bigint NOT NULL,
        state        text NOT NULL
    );
    -- View::order_intents: one order's intents in reservation order.
    CREATE INDEX intents_by_order ON intents (tenant, order_id, reserved_seq);
    -- View::reference_charges: the charges under one business reference.
    CREATE INDEX intents_by_reference ON intents (tenant, business_ref, reserved_seq) WHERE kind = 'charge';
    -- View::run_intents: a run's intents in reservation order.
    CREATE INDEX intents_by_run ON intents (run_id, reserved_seq);
    -- View::in_flight and View::waiting: the intents in a few statuses, in key order.
    CREATE INDEX intents_by_status ON intents (status, key);
    -- View::due: unknown outcomes by due time.
    CREATE INDEX intents_due ON intents (due_at, key) WHERE due_at IS NOT NULL;

    CREATE TABLE runs (
        run_id     text PRIMARY KEY,
        finished   boolean NOT NULL,
        stream_len bigint NOT NULL,
        state      text NOT NULL,
        -- When the run's durable timer fires while it waits on one (microseconds since the
        -- epoch, rounded up: `engine::clock::micros_rounded_up` of its state's `wake_at`);
        -- NULL without a timer and once it finished.
        wake_at    bigint
    );
    -- View::awake_runs: unfinished runs waiting on no timer, in id order ...
    CREATE INDEX runs_awake ON runs (run_id) WHERE NOT finished AND wake_at IS NULL;
    -- ... and those whose timer fired; View::sleeping_runs: those whose timer has not.
    CREATE INDEX runs_sleeping ON runs (wake_at) WHERE wake_at IS NOT NULL;

    CREATE TABLE leases (
        run_id     text PRIMARY KEY,
        owner      text NOT NULL,
        token      bigint NOT NULL CHECK (token >= 1),
        expires_at timestamptz
    );

    -- One row per committed transaction that wrote anything: how a lost COMMIT answer is
    -- resolved (look the id up).
    CREATE TABLE commits (
        id uuid PRIMARY KEY,
        at timestamptz NOT NULL
    );
    ",
    // Version 2: where a migrated log came from (`keel migrate`): one row, its progress while
    // it is copied (`finished_at` NULL), its provenance after.
    r"
    CREATE TABLE keel_provenance (
        id            smallint PRIMARY KEY CHECK (id = 1),
        source        text NOT NULL,
        source_head   text NOT NULL,
        source_events bigint NOT NULL CHECK (source_events >= 0),
        copied_events bigint NOT NULL CHECK (copied_events >= 0),
        cursor        text,
        started_at    timestamptz NOT NULL,
        finished_at   timestamptz
    );
    ",
];

/// Brings the database to [`SCHEMA_VERSION`]: creates `keel_meta` if missing, then applies
/// every missing migration, in order, in one transaction (all or none). Concurrent callers
/// (several workers starting at once) serialise on an advisory lock, so each runs once.
/// Returns the version found before.
///
/// # Errors
///
/// [`Error::SchemaTooNew`] for a database migrated by a newer build, PostgreSQL's otherwise.
pub fn migrate(client: &mut Client) -> Result<i64> {
    let mut tx = client.transaction()?;
    let found = migrate_in(&mut tx)?;
    tx.commit()?;
    Ok(found)
}

/// [`migrate`] inside the caller's transaction, which commits it (an import checks the target
/// and creates the schema in one transaction: all or none).
///
/// # Errors
///
/// As [`migrate`].
pub(crate) fn migrate_in(tx: &mut postgres::Transaction<'_>) -> Result<i64> {
    // A fixed key of its own: no entity's lock hashes to a negative constant this small.
    tx.execute("SELECT pg_advisory_xact_lock(-7100)", &[])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS keel_meta (schema_version bigint NOT NULL)")?;
    let found: Option<i64> = tx.query_opt("SELECT schema_version FROM keel_meta", &[])?.map(|row| row.get(0));
    let found = match found {
        Some(version) => version,
        None => {
            tx.execute("INSERT INTO keel_meta (schema_version) VALUES (0)", &[])?;
            0
        }
    };
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew { found, supported: SCHEMA_VERSION });
    }
    for (version, sql) in (found + 1..).zip(&MIGRATIONS[usize::try_from(found).unwrap_or(0)..]) {
        tx.batch_execute(sql)?;
        tx.execute("UPDATE keel_meta SET schema_version = $1", &[&version])?;
        tracing::info!(version, "postgres schema migrated");
    }
    Ok(found)
}

/// The version the database is at (0 before any migration).
///
/// # Errors
///
/// PostgreSQL's.
pub fn version(client: &mut Client) -> Result<i64> {
    let exists: bool = client.query_one("SELECT to_regclass('keel_meta') IS NOT NULL", &[])?.get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client.query_opt("SELECT schema_version FROM keel_meta", &[])?.map_or(0, |row| row.get(0)))
}
