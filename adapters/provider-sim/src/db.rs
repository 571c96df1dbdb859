//! The simulator's durable state: one SQLite file.
//!
//! Owns the schema (effects, with the `traceparent` their request carried, a refund's
//! PaymentIntent and the request's metadata; idempotency records, with how many replays each
//! answered; a file older than a column gets it at open), the one transaction that claims an
//! idempotency key together with its effect (a refund checked against what its PaymentIntent
//! has left in the same transaction), the metadata search and the refund list, and recovery of
//! records left in flight by a killed simulator. It must never decide faults or speak HTTP, and it must never commit an
//! idempotency record without its effect or an effect without its record (except in
//! no-idempotency mode, where there are no records at all).
//!
//! # Concurrency
//!
//! One `rusqlite::Connection` behind a mutex: a single connection makes every claim serial.
//! Claims are group-committed, as a real provider's storage would: the claims that queue up
//! while one transaction commits are made together in the next (each in its own savepoint,
//! in arrival order), and each is answered only after its transaction is durable, so one
//! fsync serves many concurrent requests. Callers run these blocking methods on tokio's
//! blocking pool.
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
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, mpsc};

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
    traceparent     TEXT,
    payment_intent  TEXT,
    metadata        TEXT
) STRICT;
CREATE TABLE IF NOT EXISTS idempotency (
    key           TEXT PRIMARY KEY,
    request_hash  TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    status_code   INTEGER NOT NULL,
    response_body TEXT NOT NULL,
    effect_id     TEXT REFERENCES effects (id),
    created_at    TEXT NOT NULL,
    replays       INTEGER NOT NULL DEFAULT 0
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
    /// A new effect; its answer is the effect's API object with status 200. A refund naming
    /// a PaymentIntent is checked against it first, and takes its currency.
    Effect(Box<EffectRecord>),
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
    /// The refund cannot be made (no such PaymentIntent, or more than it has left): this
    /// error answer, nothing committed, the key left free.
    Refused(Stored),
}

/// One request's claim of a key, as [`Db::claim`] queues it.
pub(crate) struct ClaimRequest {
    /// The `Idempotency-Key`.
    pub key: String,
    /// The canonical hash of the request (operation and body).
    pub hash: String,
    /// What to commit when the key is new.
    pub answer: Answer,
    /// Keep the record `in_flight` until [`Db::finish`].
    pub in_flight: bool,
    /// `false`: no records at all (the simulator's no-idempotency mode).
    pub idempotency: bool,
    /// The record's creation time, RFC 3339.
    pub now: String,
}

/// A queued claim and where its answer goes.
struct Queued {
    request: ClaimRequest,
    reply: mpsc::SyncSender<Result<Claim, Error>>,
}

/// The simulator's database.
pub(crate) struct Db {
    conn: Mutex<Connection>,
    /// Claims waiting for the connection: the next holder commits them together.
    queued: Mutex<Vec<Queued>>,
}

impl Db {
    /// Opens (creating if needed) the database, applies the schema and recovers records left
    /// in flight. Returns the database and how many records recovery completed.
    pub(crate) fn open(path: &Path) -> Result<(Self, usize), Error> {
        let conn = Connection::open(path).map_err(|source| Error::Open { path: path.display().to_string(), source })?;
        configure(&conn)?;
        conn.execute_batch(SCHEMA)?;
        for column in ["traceparent", "payment_intent", "metadata"] {
            add_column(&conn, "effects", column, "TEXT")?;
        }
        add_column(&conn, "idempotency", "replays", "INTEGER NOT NULL DEFAULT 0")?;
        // After the columns exist: a refund's check sums the refunds of its PaymentIntent; the
        // effect listing reads each effect's replays.
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS refunds_by_payment_intent ON effects (payment_intent);
             CREATE INDEX IF NOT EXISTS idempotency_by_effect ON idempotency (effect_id);",
        )?;
        // Recovery runs before the server accepts anything, so no request can see a
        // half-recovered state.
        let deleted = conn.execute("DELETE FROM idempotency WHERE state = 'in_flight' AND effect_id IS NULL", [])?;
        let completed = conn.execute("UPDATE idempotency SET state = 'done' WHERE state = 'in_flight'", [])?;
        if deleted > 0 {
            tracing::warn!(deleted, "deleted in-flight idempotency records without an effect");
        }
        Ok((Self { conn: Mutex::new(conn), queued: Mutex::new(Vec::new()) }, completed))
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
        Ok(Self { conn: Mutex::new(conn), queued: Mutex::new(Vec::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite itself consistent (the transaction is
        // rolled back on drop), so a poisoned mutex is safe to keep using.
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims `request.key`, committing `request.answer` in the same transaction when the key
    /// is new; answers once that transaction is durable.
    ///
    /// Group commit: the claim is queued, and whichever caller holds the connection next
    /// claims every queued key in one transaction (each in its own savepoint, in arrival
    /// order, so a later claim of the same key sees the earlier one), commits once, then
    /// answers each. A claim is never answered before the commit holding it.
    pub(crate) fn claim(&self, request: ClaimRequest) -> Result<Claim, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.queue().push(Queued { request, reply });
        {
            let mut conn = self.lock();
            let batch = std::mem::take(&mut *self.queue());
            // Empty when an earlier holder of the connection took this claim with its batch.
            if !batch.is_empty() {
                claim_batch(&mut conn, batch);
            }
        }
        answer.recv().map_err(|_| Error::Task("a batch of claims ended without answering (a panic)".to_owned()))?
    }

    fn queue(&self) -> MutexGuard<'_, Vec<Queued>> {
        // A queue is plain data pushed and taken whole: a panic cannot leave it half-updated.
        self.queued.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks `key`'s record done: its answer is being sent now.
    pub(crate) fn finish(&self, key: &str) -> Result<(), Error> {
        self.lock().execute("UPDATE idempotency SET state = 'done' WHERE key = ?1", params![key])?;
        Ok(())
    }

    /// The PaymentIntents whose metadata `field` is `value`, newest first, at most `limit`.
    pub(crate) fn search_charges(&self, field: &str, value: &str, limit: usize) -> Result<Vec<EffectRecord>, Error> {
        // A JSON path quotes the field, so any field name but one holding `"` is one member.
        if field.contains('"') {
            return Ok(Vec::new());
        }
        let path = format!("$.\"{field}\"");
        self.effects_where(
            "WHERE kind = 'charge' AND json_extract(metadata, ?1) = ?2 ORDER BY rowid DESC LIMIT ?3",
            params![path, value, i64::try_from(limit).unwrap_or(i64::MAX)],
        )
    }

    /// The most recent refunds, newest first, at most `limit`.
    pub(crate) fn recent_refunds(&self, limit: usize) -> Result<Vec<EffectRecord>, Error> {
        self.effects_where(
            "WHERE kind = 'refund' ORDER BY rowid DESC LIMIT ?1",
            params![i64::try_from(limit).unwrap_or(i64::MAX)],
        )
    }

    fn effects_where(&self, clause: &str, params: impl rusqlite::Params) -> Result<Vec<EffectRecord>, Error> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&format!("{SELECT_EFFECT} {clause}"))?;
        let rows = stmt.query_map(params, read_effect)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }

    /// Every effect, in commit order.
    pub(crate) fn effects(&self) -> Result<Vec<EffectRecord>, Error> {
        self.effects_where("ORDER BY rowid", [])
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

/// A file made before `table` had `column` gets it, declared `declaration` (NULL or its
/// default in old rows): `CREATE TABLE IF NOT EXISTS` leaves an existing table as it is.
/// Every name is one of this module's constants, never a request's.
fn add_column(conn: &Connection, table: &str, column: &str, declaration: &str) -> Result<(), Error> {
    let has: bool = conn.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        params![table, column],
        |row| row.get(0),
    )?;
    if !has {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {declaration}"))?;
    }
    Ok(())
}

const SELECT_EFFECT: &str = "SELECT id, idempotency_key, kind, amount_minor, currency, order_id, intent_id, tenant, created_at, created_at_ms, traceparent, payment_intent, metadata, coalesce((SELECT replays FROM idempotency WHERE idempotency.effect_id = effects.id), 0) FROM effects";

/// Reads one effect row. The outer `Result` is SQLite's, the inner one a row that breaks the
/// schema's promises.
fn read_effect(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<EffectRecord, Error>> {
    let kind: String = row.get(2)?;
    let kind = match kind.as_str() {
        "charge" => EffectKind::Charge,
        "refund" => EffectKind::Refund,
        other => return Ok(Err(Error::Corrupt(format!("effect kind {other:?}")))),
    };
    let metadata: Option<String> = row.get(12)?;
    let metadata = match metadata.map(|text| serde_json::from_str(&text)) {
        None => BTreeMap::new(),
        Some(Ok(metadata)) => metadata,
        Some(Err(e)) => return Ok(Err(Error::Corrupt(format!("effect metadata: {e}")))),
    };
    let replays: i64 = row.get(13)?;
    let Ok(replays) = u64::try_from(replays) else {
        return Ok(Err(Error::Corrupt(format!("{replays} replays"))));
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
        payment_intent: row.get(11)?,
        metadata,
        replays,
    }))
}

/// Claims every key of `batch` in one transaction and answers each: its own claim once the
/// transaction is committed, or the commit's failure.
fn claim_batch(conn: &mut Connection, batch: Vec<Queued>) {
    let (requests, replies): (Vec<ClaimRequest>, Vec<_>) =
        batch.into_iter().map(|queued| (queued.request, queued.reply)).unzip();
    match claim_all(conn, requests) {
        Ok(claims) => {
            for (reply, claim) in replies.into_iter().zip(claims) {
                // A caller that is gone (its task was dropped) needs no answer.
                let _ = reply.send(claim);
            }
        }
        Err(error) => {
            let message = error.to_string();
            for reply in replies {
                let _ = reply.send(Err(Error::Batch(message.clone())));
            }
        }
    }
}

/// Every claim of `requests` in one `IMMEDIATE` transaction (the read of a record and the
/// insert that follows cannot interleave with another writer), each in a savepoint: one that
/// fails is rolled back alone and answered with its error.
fn claim_all(conn: &mut Connection, requests: Vec<ClaimRequest>) -> Result<Vec<Result<Claim, Error>>, Error> {
    let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut claims = Vec::with_capacity(requests.len());
    for request in requests {
        let savepoint = tx.savepoint()?;
        let claim = claim_one(&savepoint, request);
        if claim.is_ok() {
            savepoint.commit()?;
        }
        claims.push(claim);
    }
    tx.commit()?;
    Ok(claims)
}

/// One claim inside the batch's transaction: replay, conflict, reuse error, or the new
/// answer (the effect, or the decline) with its record.
fn claim_one(conn: &Connection, request: ClaimRequest) -> Result<Claim, Error> {
    let ClaimRequest { key, hash, answer, in_flight, idempotency, now } = request;
    if idempotency {
        let existing: Option<(String, String, i64, String)> = conn
            .prepare_cached("SELECT request_hash, state, status_code, response_body FROM idempotency WHERE key = ?1")?
            .query_row(params![key], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
            .optional()?;
        if let Some((stored_hash, state, status, body)) = existing {
            let claim = if stored_hash != hash {
                Claim::KeyReused
            } else if state == "in_flight" {
                Claim::InProgress
            } else {
                conn.prepare_cached("UPDATE idempotency SET replays = replays + 1 WHERE key = ?1")?
                    .execute(params![key])?;
                Claim::Replay(Stored { status: status_code(status)?, body })
            };
            return Ok(claim);
        }
    }
    let (stored, effect_id) = match answer {
        Answer::Effect(mut effect) => {
            if let Some(refused) = refund_check(conn, &mut effect)? {
                return Ok(Claim::Refused(refused));
            }
            insert_effect(conn, &effect)?;
            let body = crate::stripe::object(&effect).to_string();
            (Stored { status: 200, body }, Some(effect.id))
        }
        Answer::Decline(stored) => (stored, None),
    };
    if idempotency {
        // A decline has nothing to wait for, so it is never in flight.
        let state = if in_flight && effect_id.is_some() { "in_flight" } else { "done" };
        conn.prepare_cached(
            "INSERT INTO idempotency (key, request_hash, state, status_code, response_body, effect_id, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![key, hash, state, i64::from(stored.status), stored.body, effect_id, now])?;
    }
    Ok(Claim::New(stored))
}

/// For a refund naming a PaymentIntent: Stripe's refusal when there is no such PaymentIntent
/// or the refund is more than it has left (`charge_already_refunded` when nothing is left,
/// `amount_too_large` otherwise); else `None`, with the refund's currency set to its
/// PaymentIntent's. Runs inside the claim's transaction, so two refunds cannot both take the
/// last of a PaymentIntent.
fn refund_check(conn: &Connection, effect: &mut EffectRecord) -> Result<Option<Stored>, Error> {
    let Some(intent) = effect.payment_intent.as_deref() else {
        return Ok(None);
    };
    let refused = |code: &str, message: String| {
        let body = crate::stripe::error("invalid_request_error", code, Some("payment_intent"), &message);
        Ok(Some(Stored { status: 400, body: body.to_string() }))
    };
    let paid: Option<(i64, String)> = conn
        .prepare_cached("SELECT amount_minor, currency FROM effects WHERE id = ?1 AND kind = 'charge'")?
        .query_row(params![intent], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((captured, currency)) = paid else {
        return refused("resource_missing", format!("No such payment_intent: '{intent}'"));
    };
    let refunded: i64 = conn
        .prepare_cached(
            "SELECT coalesce(sum(amount_minor), 0) FROM effects WHERE payment_intent = ?1 AND kind = 'refund'",
        )?
        .query_row(params![intent], |row| row.get(0))?;
    let left = captured.saturating_sub(refunded);
    if left <= 0 {
        return refused("charge_already_refunded", format!("PaymentIntent {intent} has already been refunded."));
    }
    if effect.amount_minor > left {
        return refused(
            "amount_too_large",
            format!(
                "Refund amount ({}) is greater than unrefunded amount on PaymentIntent ({left}).",
                effect.amount_minor
            ),
        );
    }
    effect.currency = currency;
    Ok(None)
}

fn insert_effect(conn: &Connection, e: &EffectRecord) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO effects (id, idempotency_key, kind, amount_minor, currency, order_id, intent_id, tenant, created_at, created_at_ms, traceparent, payment_intent, metadata)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
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
        e.traceparent,
        e.payment_intent,
        serde_json::to_string(&e.metadata).map_err(|e| Error::Corrupt(format!("metadata: {e}")))?,
    ])?;
    Ok(())
}

fn status_code(stored: i64) -> Result<u16, Error> {
    u16::try_from(stored).map_err(|_| Error::Corrupt(format!("stored status code {stored}")))
}

#[cfg(test)]
mod tests {
    use super::{Answer, Claim, ClaimRequest, Db};
    use crate::{EffectKind, EffectRecord};
    use std::sync::Arc;

    fn request(key: &str, n: usize) -> ClaimRequest {
        let effect = EffectRecord {
            id: format!("ch_{key}_{n}"),
            idempotency_key: key.to_owned(),
            kind: EffectKind::Charge,
            amount_minor: 100,
            currency: "EUR".to_owned(),
            order_id: "order".to_owned(),
            intent_id: key.to_owned(),
            tenant: "tenant".to_owned(),
            created_at: "2026-01-01T00:00:00.000Z".to_owned(),
            created_at_ms: 0,
            traceparent: None,
            payment_intent: None,
            metadata: Default::default(),
            replays: 0,
        };
        ClaimRequest {
            key: key.to_owned(),
            hash: "same request".to_owned(),
            answer: Answer::Effect(Box::new(effect)),
            in_flight: false,
            idempotency: true,
            now: "2026-01-01T00:00:00.000Z".to_owned(),
        }
    }

    #[test]
    fn claims_racing_on_the_same_keys_commit_one_effect_per_key_whatever_the_batches() {
        let path = std::env::temp_dir().join(format!("sim-claims-{}.db", uuid::Uuid::new_v4()));
        let (db, _) = Db::open(&path).expect("the database opens");
        let db = Arc::new(db);
        let (threads, keys) = (8, 25);
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let db = Arc::clone(&db);
                std::thread::spawn(move || {
                    (0..keys)
                        .map(|k| db.claim(request(&format!("key_{k}"), thread)).expect("a claim"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let claims: Vec<Claim> = handles.into_iter().flat_map(|h| h.join().expect("a claiming thread")).collect();
        let new = claims.iter().filter(|claim| matches!(claim, Claim::New(_))).count();
        let replays = claims.iter().filter(|claim| matches!(claim, Claim::Replay(_))).count();
        assert_eq!((new, replays), (keys, keys * (threads - 1)), "one new claim per key, every other a replay");
        let effects = db.effects().expect("the effects");
        assert_eq!(effects.len(), keys);
        assert!(effects.iter().all(|e| e.replays == (threads - 1) as u64), "each replay is counted on its effect");
        drop(db);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
