//! The `leases` table: when each run's current hold expires.
//!
//! Owns [`TableView`], the [`LeaseView`] the ledger reads inside the writer's transaction,
//! and [`apply`], which writes a decision's [`LeaseEffect`]s in the same transaction as its
//! events. The holder and fencing token of a run are facts in the events; only the expiry
//! lives here (see `engine::lease` and `store/FORMAT.md`). Nothing else writes the table.

use crate::codec::{format_time, parse_time, to_i64};
use crate::error::{Error, Result};
use chrono::{DateTime, Utc};
use engine::event::RunId;
use engine::lease::{LeaseEffect, LeaseOwner, LeaseView, Liveness, OwnerProbe};
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

    fn read(&self, run_id: &RunId) -> Result<Option<DateTime<Utc>>> {
        let text: Option<String> = self
            .conn
            .prepare_cached("SELECT expires_at FROM leases WHERE run_id = ?1")?
            .query_row([run_id.as_str()], |row| row.get(0))
            .optional()?;
        text.map(|t| parse_time(&t).map_err(|e| Error::corrupt(0, format!("lease expiry {t:?} of run {run_id}: {e}"))))
            .transpose()
    }
}

impl LeaseView for TableView<'_> {
    fn expires_at(&self, run_id: &RunId) -> Option<DateTime<Utc>> {
        match self.read(run_id) {
            Ok(expiry) => expiry,
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

/// Writes lease changes, in order, inside the caller's transaction.
pub(crate) fn apply(conn: &Connection, effects: &[LeaseEffect]) -> Result<()> {
    for effect in effects {
        match effect {
            LeaseEffect::Hold { run_id, token, expires_at } => {
                conn.prepare_cached(
                    "INSERT INTO leases (run_id, token, expires_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (run_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at",
                )?
                .execute(params![run_id.as_str(), to_i64(*token), format_time(*expires_at)])?;
            }
            LeaseEffect::Release { run_id } => {
                conn.prepare_cached("DELETE FROM leases WHERE run_id = ?1")?.execute([run_id.as_str()])?;
            }
        }
    }
    Ok(())
}
