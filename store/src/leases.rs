//! The `leases` table: who holds each run, its fencing token, and until when (a run by its
//! stream id, a holder by its id in `owners`).
//!
//! Owns [`TableView`], the [`LeaseView`] the ledger reads inside the writer's transaction,
//! and [`apply`], which writes a decision's [`LeaseEffect`]s in the same transaction as its
//! events (see `engine::lease` and `store/FORMAT.md`). Nothing else writes the table.

use crate::codec::{format_time, parse_time, to_i64};
use crate::error::{Error, Result};
use engine::event::RunId;
use engine::lease::{LeaseEffect, LeaseOwner, LeaseRow, LeaseView, Liveness, OwnerProbe};
use rusqlite::{Connection, OptionalExtension, params};
use std::cell::RefCell;

/// The table as the ledger reads it. A read that fails is remembered and reported by
/// [`TableView::finish`], so the batch fails instead of deciding on a guess.
pub(crate) struct TableView<'a> {
    conn: &'a Connection,
    probe: &'a dyn OwnerProbe,
    ttl_ms: u64,
    failure: RefCell<Option<Error>>,
}

impl<'a> TableView<'a> {
    pub(crate) fn new(conn: &'a Connection, probe: &'a dyn OwnerProbe, ttl_ms: u64) -> Self {
        Self { conn, probe, ttl_ms, failure: RefCell::new(None) }
    }

    /// The first read failure, if any.
    pub(crate) fn finish(self) -> Result<()> {
        self.failure.into_inner().map_or(Ok(()), Err)
    }

    fn read(&self, run_id: &RunId) -> Result<Option<LeaseRow>> {
        let row: Option<(String, i64, Option<String>)> = self
            .conn
            .prepare_cached(
                "SELECT o.owner, l.token, l.expires_at FROM leases l JOIN owners o ON o.id = l.owner \
                 WHERE l.run = (SELECT id FROM streams WHERE name = ?1)",
            )?
            .query_row([run_id.stream().as_str()], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .optional()?;
        let Some((owner, token, expires_at)) = row else {
            return Ok(None);
        };
        let bad = |what: String| Error::corrupt(0, format!("lease of run {run_id}: {what}"));
        let owner: LeaseOwner = serde_json::from_str(&owner).map_err(|e| bad(format!("owner {owner:?}: {e}")))?;
        let token = u64::try_from(token).map_err(|_| bad(format!("token {token}")))?;
        let expires_at =
            expires_at.map(|t| parse_time(&t).map_err(|e| bad(format!("expiry {t:?}: {e}")))).transpose()?;
        Ok(Some(LeaseRow { owner, token, expires_at }))
    }
}

impl LeaseView for TableView<'_> {
    fn holder(&self, run_id: &RunId) -> Option<LeaseRow> {
        match self.read(run_id) {
            Ok(row) => row,
            Err(error) => {
                self.failure.borrow_mut().get_or_insert(error);
                None
            }
        }
    }

    fn liveness(&self, owner: &LeaseOwner) -> Liveness {
        self.probe.liveness(owner)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

/// Writes lease changes, in order, inside the caller's transaction. A run's stream gets its
/// id here if the lease comes before its first event (a run started with its lease).
pub(crate) fn apply(conn: &Connection, effects: &[LeaseEffect]) -> Result<()> {
    for effect in effects {
        match effect {
            LeaseEffect::Hold { run_id, owner, token, expires_at } => {
                let run = crate::codec::ensure_stream(conn, run_id.stream().as_str())?;
                let owner = serde_json::to_string(owner).expect("a lease owner serializes: plain fields");
                conn.prepare_cached(
                    "INSERT INTO leases (run, owner, token, expires_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (run) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
                     expires_at = excluded.expires_at",
                )?
                .execute(params![
                    run,
                    owner_id(conn, &owner)?,
                    to_i64(*token),
                    format_time(*expires_at)
                ])?;
            }
            LeaseEffect::Release { run_id } => {
                conn.prepare_cached(
                    "UPDATE leases SET expires_at = NULL WHERE run = (SELECT id FROM streams WHERE name = ?1)",
                )?
                .execute([run_id.stream().as_str()])?;
            }
        }
    }
    Ok(())
}

/// The id of a holder, given the next one if it has none yet.
fn owner_id(conn: &Connection, owner: &str) -> Result<i64> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT id FROM owners WHERE owner = ?1")?
        .query_row([owner], |row| row.get(0))
        .optional()?;
    if let Some(id) = found {
        return Ok(id);
    }
    conn.prepare_cached("INSERT INTO owners (owner) VALUES (?1)")?.execute([owner])?;
    Ok(conn.last_insert_rowid())
}
