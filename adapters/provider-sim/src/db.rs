//! The simulator's durable state: one SQLite file.
//!
//! Owns the schema (effects, with the `traceparent` their request carried, and idempotency
//! records; a file older than the `traceparent` column gets it at open), the one transaction
//! that claims an idempotency key together with its effect, and recovery of records left in flight by a
//! killed simulator. It must never decide faults or speak HTTP, and it must never commit an
//! idempotency record without its effect or an effect without its record (except in
//! no-idempotency mode, where there are no records at all).
//!
//! # Concurrency
//!
//! One `rusqlite::Connection` behind a mutex: the simulator is a test tool whose throughput is
//! bounded by fsync anyway, and a single connection makes every claim trivially serial. Callers
//! run these blocking methods on tokio's blocking pool.
//!
//! # Recovery
//!
//! A record is `in_flight` only while the simulator delays its answer (`slow`,
//! `timeout_after_effect`); its effect and its answer were committed with it. So when a killed
//! simulator restarts, every in-flight record that has its effect is completed (`done`, with
//! the stored answer), and any in-flight record without an effect — impossible by construction,
//! but cheap to guard against — is deleted so the key can be used again.

use super::{EffectKind, EffectRecord, Error};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// How long a connection waits on a lock held by another connection (e.g. the `effects`
/// command reading while the server writes) before giving up.
const BUSY_TIMEOUT_MS: u64 = 5_000;

/// The schema. STRICT tables so a wrong type is an error, not a silent coercion.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS effects (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount_minor    INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    intent_id       TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    traceparent     TEXT
) STRICT;
-- Lookup by key answers the oldest effect for the key (several exist only without idempotency).
CREATE INDEX IF NOT EXISTS effects_by_key ON effects (idempotency_key, created_at_ms);
CREATE TABLE IF NOT EXISTS idempotency (
    key           TEXT PRIMARY KEY,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    status_code   INTEGER NOT NULL,
    response_body TEXT NOT NULL,
    effect_id     TEXT REFERENCES effects (id),
    created_at    TEXT NOT NULL
) STRICT;
";

/// An HTTP answer as stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    pub status: u16,
    pub body: String,
}

/// What a request wants committed under its key.
pub(crate) enum Answer {
    /// A new effect; its answer is the effect's API object with status 200.
    Effect(EffectRecord),
    /// A decline: no effect, but the answer is kept for replays.
    Decline(Stored),
}

/// The result of claiming a key.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The key was new: this answer was committed (with its effect, if any).
    New(Stored),
    /// The key was done with the same request: the stored answer, nothing new committed.
    Replay(Stored),
    /// The key was used with different parameters.
    KeyReused,
    /// The key's first request is still being answered.
    InProgress,
}

/// The simulator's database.
pub(crate) struct Db {
    conn: Mutex<Connection>,
}

impl Db {
    /// Opens (creating if needed) the database, applies the schema and recovers records left
    /// in flight. Returns the database and how many records recovery completed.
    pub(crate) fn open(path: &Path) -> Result<(Self, usize), Error> {
        let conn = Connection::open(path).map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        configure(&conn)?;
        conn.execute_batch(SCHEMA)?;
        add_traceparent(&conn)?;
        // Recovery runs before the server accepts anything, so no request can see a
        // half-recovered state.
        let deleted = conn.execute("DELETE FROM idempotency WHERE state = 'in_flight' AND effect_id IS NULL", [])?;
        let completed = conn.execute("UPDATE idempotency SET state = 'done' WHERE state = 'in_flight'", [])?;
        if deleted > 0 {
            tracing::warn!(deleted, "deleted in-flight idempotency records without an effect");
        }
        Ok((Self { conn: Mutex::new(conn) }, completed))
    }

    /// Opens an existing database for reading effects, without creating or recovering
    /// anything (the server may be running).
    pub(crate) fn open_existing(path: &Path) -> Result<Self, Error> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        configure(&conn)?;
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite itself consistent (the transaction is
        // rolled back on drop), so a poisoned mutex is safe to keep using.
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims `key` for a request whose canonical hash is `hash`, committing `answer` in the
    /// same transaction when the key is new. `in_flight` keeps the record in flight until
    /// [`Db::finish`]; `idempotency: false` skips records entirely.
    pub(crate) fn claim(
        &self,
        key: &str,
        hash: &str,
        answer: Answer,
        in_flight: bool,
        idempotency: bool,
        now: &str,
    ) -> Result<Claim, Error> {
        let mut conn = self.lock();
        // IMMEDIATE takes the write lock up front, so the read of the record and the insert
        // that follows cannot interleave with another writer.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if idempotency {
            let existing: Option<(String, String, i64, String)> = tx
                .query_row(
                    "SELECT request_hash, state, status_code, response_body FROM idempotency WHERE key = ?1",
                    params![key],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                )
                .optional()?;
            if let Some((stored_hash, state, status, body)) = existing {
                let claim = if stored_hash != hash {
                    Claim::KeyReused
                } else if state == "in_flight" {
                    Claim::InProgress
                } else {
                    Claim::Replay(Stored { status: status_code(status)?, body })
                };
                return Ok(claim);
            }
        }
        let (stored, effect_id) = match answer {
            Answer::Effect(effect) => {
                insert_effect(&tx, &effect)?;
                let body = effect.api_object().to_string();
                (Stored { status: 200, body }, Some(effect.id))
            }
            Answer::Decline(stored) => (stored, None),
        };
        if idempotency {
            // A decline has nothing to wait for, so it is never in flight.
            let state = if in_flight && effect_id.is_some() { "in_flight" } else { "done" };
            tx.execute(
                "INSERT INTO idempotency (key, request_hash, state, status_code, response_body, effect_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![key, hash, state, i64::from(stored.status), stored.body, effect_id, now],
            )?;
        }
        tx.commit()?;
        Ok(Claim::New(stored))
    }

    /// Marks `key`'s record done: its answer is being sent now.
    pub(crate) fn finish(&self, key: &str) -> Result<(), Error> {
        self.lock().execute("UPDATE idempotency SET state = 'done' WHERE key = ?1", params![key])?;
        Ok(())
    }

    /// The oldest effect stored under `key`.
    pub(crate) fn lookup(&self, key: &str) -> Result<Option<EffectRecord>, Error> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&format!(
            "{SELECT_EFFECT} WHERE idempotency_key = ?1 ORDER BY created_at_ms, rowid LIMIT 1"
        ))?;
        let row = stmt.query_row(params![key], read_effect).optional()?;
        row.transpose()
    }

    /// Every effect, in commit order.
    pub(crate) fn effects(&self) -> Result<Vec<EffectRecord>, Error> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&format!("{SELECT_EFFECT} ORDER BY rowid"))?;
        let rows = stmt.query_map([], read_effect)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }
}

fn configure(conn: &Connection) -> Result<(), Error> {
    // WAL lets the `effects` command read while the server writes.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: an answered effect survives power loss, like a real provider's.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
    Ok(())
}

/// A file made before effects recorded their `traceparent` gets the column (NULL in its old
/// rows); `CREATE TABLE IF NOT EXISTS` leaves an existing table as it is.
fn add_traceparent(conn: &Connection) -> Result<(), Error> {
    let has: bool = conn.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info('effects') WHERE name = 'traceparent'",
        [],
        |row| row.get(0),
    )?;
    if !has {
        conn.execute_batch("ALTER TABLE effects ADD COLUMN traceparent TEXT")?;
    }
    Ok(())
}

const SELECT_EFFECT: &str = "SELECT id, idempotency_key, kind, amount_minor, currency, order_id, intent_id, tenant, created_at, created_at_ms, traceparent FROM effects";

/// Reads one effect row. The outer `Result` is SQLite's, the inner one a row that breaks the
/// schema's promises.
fn read_effect(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<EffectRecord, Error>> {
    let kind: String = row.get(2)?;
    let kind = match kind.as_str() {
        "charge" => EffectKind::Charge,
        "refund" => EffectKind::Refund,
        other => return Ok(Err(Error::Corrupt(format!("effect kind {other:?}")))),
    };
    Ok(Ok(EffectRecord {
        id: row.get(0)?,
        idempotency_key: row.get(1)?,
        kind,
        amount_minor: row.get(3)?,
        currency: row.get(4)?,
        order_id: row.get(5)?,
        intent_id: row.get(6)?,
        tenant: row.get(7)?,
        created_at: row.get(8)?,
        created_at_ms: row.get(9)?,
        traceparent: row.get(10)?,
    }))
}

fn insert_effect(tx: &rusqlite::Transaction<'_>, e: &EffectRecord) -> Result<(), Error> {
    tx.execute(
        "INSERT INTO effects (id, idempotency_key, kind, amount_minor, currency, order_id, intent_id, tenant, created_at, created_at_ms, traceparent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            e.id,
            e.idempotency_key,
            e.kind.as_str(),
            e.amount_minor,
            e.currency,
            e.order_id,
            e.intent_id,
            e.tenant,
            e.created_at,
            e.created_at_ms,
            e.traceparent
        ],
    )?;
    Ok(())
}

fn status_code(stored: i64) -> Result<u16, Error> {
    u16::try_from(stored).map_err(|_| Error::Corrupt(format!("stored status code {stored}")))
}
