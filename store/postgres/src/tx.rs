//! One command's transaction: what its decision reads ([`Tx`], an [`engine::ledger::View`]
//! and an [`engine::lease::LeaseView`]) and where the fold keeps what it changes
//! ([`TxEntities`], an [`engine::ledger::fold::Entities`]).
//!
//! # Locking
//!
//! Every read by key — an intent, a run, a run's history, a conversation, an order's
//! intents, a reference's charges, a run's lease — first takes that entity's
//! transaction-scoped advisory lock (`crate::locks`), so under READ COMMITTED the read sees
//! every commit made before the lock was granted, and nobody else decides on that entity
//! until this transaction ends. Range reads (in flight, due, waiting, unfinished) take no
//! lock: what they return is remembered as read *unlocked*, and
//!
//! - a later read of the same entity by key (by the decision or the fold) takes its lock and
//!   reads it again; if it changed, the command fails with [`Error::Stale`] and is run again;
//! - an event appended on its stream is numbered after the length read with it, so a racing
//!   append makes `UNIQUE(stream, stream_seq)` refuse one of the two (run again), never fork.
//!
//! A read that fails is remembered and reported by [`Tx::finish`], so the command fails
//! instead of deciding on a guess. It never commits: `crate::writer` does.
//!
//! # Round trips
//!
//! What sealing and folding need of the log — the hash of each stream's last event (the chain
//! goes on from it) and the sequence of its first (a reservation's order, a cause's parent) —
//! is read for every stream of the command's events at once ([`Tx::prefetch_ends`]) and kept,
//! and the fold's rows go back in one statement per table ([`TxEntities::write_back`]).

use crate::error::{Error, Result};
use crate::locks::Lock;
use crate::rows::{self, EntityRow};
use engine::event::{IntentKey, RunId, StreamId};
use engine::facts::{Conversation, ConversationId};
use engine::lease::{LeaseEffect, LeaseOwner, LeaseRow, LeaseView, Liveness, OwnerProbe};
use engine::ledger::fold::Entities;
use engine::ledger::{Intent, IntentStatus, Run, RunHistory, View};
use postgres::Transaction;
use postgres::types::Type;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

/// An entity as this command knows it.
#[derive(Clone, Debug)]
struct Known {
    /// The row as read (`None`: no such entity when read).
    row: Option<EntityRow>,
    /// Read under the entity's lock.
    locked: bool,
}

/// The command's reads, through its transaction.
pub(crate) struct Tx<'t, 'c> {
    tx: RefCell<&'t mut Transaction<'c>>,
    probe: &'t dyn OwnerProbe,
    ttl_ms: u64,
    locked: RefCell<HashSet<i64>>,
    known: RefCell<HashMap<StreamId, Known>>,
    /// Each stream's length as this command knows it (read with its entity, or written).
    lengths: RefCell<HashMap<StreamId, u64>>,
    /// Events of the log read so far, by `(stream, stream_seq)`: their hash and sequence.
    events: RefCell<HashMap<(StreamId, u64), (String, u64)>>,
    failure: RefCell<Option<Error>>,
}

impl<'t, 'c> Tx<'t, 'c> {
    pub(crate) fn new(tx: &'t mut Transaction<'c>, probe: &'t dyn OwnerProbe, ttl_ms: u64) -> Self {
        Self {
            tx: RefCell::new(tx),
            probe,
            ttl_ms,
            locked: RefCell::default(),
            known: RefCell::default(),
            lengths: RefCell::default(),
            events: RefCell::default(),
            failure: RefCell::default(),
        }
    }

    /// Runs `f` on the transaction.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Transaction<'c>) -> Result<T>) -> Result<T> {
        let mut tx = self.tx.borrow_mut();
        f(&mut tx)
    }

    /// The first read failure, if any (and forgets it).
    pub(crate) fn finish(&self) -> Result<()> {
        self.failure.borrow_mut().take().map_or(Ok(()), Err)
    }

    fn or_note<T>(&self, read: Result<T>, fallback: T) -> T {
        read.unwrap_or_else(|error| {
            self.failure.borrow_mut().get_or_insert(error);
            fallback
        })
    }

    fn lock(&self, lock: Lock<'_>) -> Result<()> {
        let key = lock.key();
        if self.locked.borrow().contains(&key) {
            return Ok(());
        }
        self.with(|tx| Ok(tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &[(&key, Type::INT8)])?))?;
        self.locked.borrow_mut().insert(key);
        Ok(())
    }

    /// The entity row of `stream` read under its lock (once per command). `Err(Stale)` when
    /// an earlier unlocked read of it saw another state.
    fn locked_row(
        &self,
        stream: &StreamId,
        read: impl FnOnce(&mut Transaction<'c>) -> Result<Option<EntityRow>>,
    ) -> Result<Option<EntityRow>> {
        if let Some(known) = self.known.borrow().get(stream)
            && known.locked
        {
            return Ok(known.row.clone());
        }
        self.lock(Lock::Stream(stream))?;
        let row = self.with(read)?;
        let length = match &row {
            Some(row) => row.stream_len,
            // No entity: a stream without a row may still hold events (a run only named).
            None => self.with(|tx| rows::stream_length(tx, stream))?,
        };
        let earlier = self.known.borrow_mut().insert(stream.clone(), Known { row: row.clone(), locked: true });
        if let Some(earlier) = earlier
            && earlier.row != row
        {
            return Err(Error::Stale { stream: stream.to_string() });
        }
        self.lengths.borrow_mut().insert(stream.clone(), length);
        Ok(row)
    }

    fn intent_row(&self, key: &IntentKey) -> Result<Option<EntityRow>> {
        self.locked_row(&key.stream(), |tx| rows::intent_row(tx, key.as_str()))
    }

    fn run_row(&self, run_id: &RunId) -> Result<Option<EntityRow>> {
        self.locked_row(&run_id.stream(), |tx| rows::run_row(tx, run_id.as_str()))
    }

    /// One intent, read under its lock.
    pub(crate) fn read_intent(&self, key: &IntentKey) -> Result<Option<Intent>> {
        self.intent_row(key)?.map(|row| row.intent()).transpose()
    }

    /// One run, read under its lock.
    pub(crate) fn read_run(&self, run_id: &RunId) -> Result<Option<Run>> {
        self.run_row(run_id)?.map(|row| row.run()).transpose()
    }

    /// Rows read by a range: what this command already knows of an entity wins (it may be
    /// newer: written by this command); the others are remembered as read unlocked.
    fn ranged(&self, read: Vec<EntityRow>) -> Vec<EntityRow> {
        let mut known = self.known.borrow_mut();
        let mut lengths = self.lengths.borrow_mut();
        read.into_iter()
            .filter_map(|row| match known.get(&row.stream) {
                Some(seen) => seen.row.clone(),
                None => {
                    lengths.insert(row.stream.clone(), row.stream_len);
                    known.insert(row.stream.clone(), Known { row: Some(row.clone()), locked: false });
                    Some(row)
                }
            })
            .collect()
    }

    fn intents_of(&self, read: Result<Vec<EntityRow>>) -> Result<Vec<Intent>> {
        self.ranged(read?).iter().map(EntityRow::intent).collect()
    }

    /// How many events `stream` holds, as this command knows it; read under the stream's
    /// lock when it does not know yet.
    pub(crate) fn stream_length(&self, stream: &StreamId) -> Result<u64> {
        if let Some(&length) = self.lengths.borrow().get(stream) {
            return Ok(length);
        }
        self.lock(Lock::Stream(stream))?;
        let length = self.with(|tx| rows::stream_length(tx, stream))?;
        self.lengths.borrow_mut().insert(stream.clone(), length);
        Ok(length)
    }

    /// The hash and sequence of `stream`'s event at `stream_seq`, read once per command (or
    /// with [`Tx::prefetch_ends`]).
    pub(crate) fn event_at(&self, stream: &StreamId, stream_seq: u64) -> Result<Option<(String, u64)>> {
        let at = (stream.clone(), stream_seq);
        if let Some(known) = self.events.borrow().get(&at) {
            return Ok(Some(known.clone()));
        }
        let found = self.with(|tx| rows::events_at(tx, &[(stream, stream_seq)]))?;
        self.events.borrow_mut().extend(found);
        Ok(self.events.borrow().get(&at).cloned())
    }

    /// Reads, in one statement, the first and the last event of each of `streams` that holds
    /// any (their lengths known, or read under their locks first): what sealing events on them
    /// and folding those events ask [`Tx::event_at`] for.
    pub(crate) fn prefetch_ends(&self, streams: &[&StreamId]) -> Result<()> {
        let mut wanted = Vec::with_capacity(2 * streams.len());
        for &stream in streams {
            let length = self.stream_length(stream)?;
            for stream_seq in [1, length] {
                let key = (stream.clone(), stream_seq);
                if stream_seq >= 1 && !self.events.borrow().contains_key(&key) && !wanted.contains(&key) {
                    wanted.push(key);
                }
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let at: Vec<(&StreamId, u64)> = wanted.iter().map(|(stream, stream_seq)| (stream, *stream_seq)).collect();
        let found = self.with(|tx| rows::events_at(tx, &at))?;
        self.events.borrow_mut().extend(found);
        Ok(())
    }

    /// Records that `stream` now holds `length` events (this command appended them).
    pub(crate) fn set_length(&self, stream: &StreamId, length: u64) {
        self.lengths.borrow_mut().insert(stream.clone(), length);
    }

    /// A stream's events read under its lock, its length remembered.
    fn locked_stream(&self, stream: &StreamId) -> Result<Vec<engine::event::StoredEvent>> {
        self.lock(Lock::Stream(stream))?;
        let events = self.with(|tx| rows::stream_events(tx, stream))?;
        self.lengths.borrow_mut().entry(stream.clone()).or_insert(events.len() as u64);
        Ok(events)
    }

    /// Remembers an entity this command wrote, as its row now holds it.
    pub(crate) fn wrote(&self, row: EntityRow) {
        self.known.borrow_mut().insert(row.stream.clone(), Known { row: Some(row), locked: true });
    }

    /// Writes lease changes, in order.
    pub(crate) fn apply_leases(&self, effects: &[LeaseEffect]) -> Result<()> {
        self.with(|tx| {
            for effect in effects {
                match effect {
                    LeaseEffect::Hold { run_id, owner, token, expires_at } => {
                        let owner = serde_json::to_string(owner).expect("a lease owner serializes: plain fields");
                        let token = i64::try_from(*token).map_err(|_| Error::corrupt(0, format!("token {token}")))?;
                        tx.execute_typed(
                            "INSERT INTO leases (run_id, owner, token, expires_at) VALUES ($1, $2, $3, $4) \
                             ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
                             expires_at = excluded.expires_at",
                            &[
                                (&run_id.as_str(), Type::TEXT),
                                (&owner, Type::TEXT),
                                (&token, Type::INT8),
                                (expires_at, Type::TIMESTAMPTZ),
                            ],
                        )?;
                    }
                    LeaseEffect::Release { run_id } => {
                        tx.execute_typed(
                            "UPDATE leases SET expires_at = NULL WHERE run_id = $1",
                            &[(&run_id.as_str(), Type::TEXT)],
                        )?;
                    }
                }
            }
            Ok(())
        })
    }

    fn lease(&self, run_id: &RunId) -> Result<Option<LeaseRow>> {
        self.lock(Lock::Stream(&run_id.stream()))?;
        let row = self.with(|tx| {
            Ok(tx.query_typed_opt(
                "SELECT owner, token, expires_at FROM leases WHERE run_id = $1",
                &[(&run_id.as_str(), Type::TEXT)],
            )?)
        })?;
        let Some(row) = row else { return Ok(None) };
        let bad = |what: String| Error::corrupt(0, format!("lease of run {run_id}: {what}"));
        let owner: String = row.get(0);
        let owner: LeaseOwner = serde_json::from_str(&owner).map_err(|e| bad(format!("owner {owner:?}: {e}")))?;
        let token: i64 = row.get(1);
        let token = u64::try_from(token).map_err(|_| bad(format!("token {token}")))?;
        Ok(Some(LeaseRow { owner, token, expires_at: row.get(2) }))
    }
}

impl View for Tx<'_, '_> {
    fn intent(&self, key: &IntentKey) -> Option<Intent> {
        let read = self.read_intent(key);
        self.or_note(read, None)
    }

    fn run(&self, run_id: &RunId) -> Option<Run> {
        let read = self.read_run(run_id);
        self.or_note(read, None)
    }

    fn history(&self, run_id: &RunId) -> Option<RunHistory> {
        let read = || -> Result<Option<RunHistory>> {
            let events = self.locked_stream(&run_id.stream())?;
            if events.is_empty() {
                return Ok(None);
            }
            engine::ledger::fold::history(&events).map(Some).map_err(|e| Error::corrupt(e.seq, e.to_string()))
        };
        self.or_note(read(), None)
    }

    fn order_intents(&self, tenant: &str, order_id: &str) -> Vec<Intent> {
        let read = || {
            self.lock(Lock::Order { tenant, order_id })?;
            self.intents_of(self.with(|tx| rows::order_rows(tx, tenant, order_id)))
        };
        self.or_note(read(), Vec::new())
    }

    fn reference_charges(&self, tenant: &str, reference: &str) -> Vec<Intent> {
        let read = || {
            self.lock(Lock::Reference { tenant, reference })?;
            self.intents_of(self.with(|tx| rows::reference_rows(tx, tenant, reference)))
        };
        self.or_note(read(), Vec::new())
    }

    fn run_intents(&self, run_id: &RunId) -> Vec<Intent> {
        let read = || {
            // A run's intents are reserved under the run's own lock (a reservation reads its run).
            self.lock(Lock::Stream(&run_id.stream()))?;
            self.intents_of(self.with(|tx| rows::run_intent_rows(tx, run_id.as_str())))
        };
        self.or_note(read(), Vec::new())
    }

    fn in_flight(&self, limit: usize) -> Vec<Intent> {
        let read = self.with(|tx| rows::status_rows(tx, &[IntentStatus::Attempting, IntentStatus::Reconciling], limit));
        let read = self.intents_of(read);
        self.or_note(read, Vec::new())
    }

    fn due(&self, now: chrono::DateTime<chrono::Utc>, limit: usize) -> Vec<IntentKey> {
        let read = self.intents_of(self.with(|tx| rows::due_rows(tx, now, limit)));
        self.or_note(read, Vec::new()).into_iter().map(|intent| intent.key().clone()).collect()
    }

    fn awake_runs(&self, now: chrono::DateTime<chrono::Utc>, limit: usize) -> Vec<Run> {
        let read = self.with(|tx| rows::awake_rows(tx, now, limit));
        let read = read.and_then(|read| self.ranged(read).iter().map(EntityRow::run).collect());
        self.or_note(read, Vec::new())
    }

    fn sleeping_runs(&self, now: chrono::DateTime<chrono::Utc>, limit: usize) -> Vec<Run> {
        let read = self.with(|tx| rows::sleeping_rows(tx, now, limit));
        let read = read.and_then(|read| self.ranged(read).iter().map(EntityRow::run).collect());
        self.or_note(read, Vec::new())
    }

    fn waiting(&self, limit: usize) -> Vec<IntentKey> {
        let read = self.intents_of(self.with(|tx| rows::status_rows(tx, &[IntentStatus::Reserved], limit)));
        self.or_note(read, Vec::new()).into_iter().map(|intent| intent.key().clone()).collect()
    }

    fn conversation(&self, id: &ConversationId) -> Conversation {
        let read = || {
            let events = self.locked_stream(&id.stream())?;
            engine::facts::fold(&events).map_err(|e| Error::corrupt(e.seq, e.to_string()))
        };
        self.or_note(read(), Conversation::default())
    }
}

impl LeaseView for Tx<'_, '_> {
    fn holder(&self, run_id: &RunId) -> Option<LeaseRow> {
        let read = self.lease(run_id);
        self.or_note(read, None)
    }

    fn liveness(&self, owner: &LeaseOwner) -> Liveness {
        self.probe.liveness(owner)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

/// An entity a command's events changed, waiting to be written back.
enum Touched {
    Intent {
        intent: Box<Intent>,
        /// Its reservation's sequence (kept by the row for reservation order).
        reserved_seq: u64,
    },
    Run(Box<Run>),
}

/// The entities a command's events touch, loaded under their locks and changed in place by
/// the fold, then written back by [`TxEntities::write_back`].
pub(crate) struct TxEntities<'a, 't, 'c> {
    tx: &'a Tx<'t, 'c>,
    /// By stream; a `BTreeMap` so write-back order (hence lock order on rows) is fixed.
    touched: BTreeMap<StreamId, Touched>,
    failure: Option<Error>,
}

impl<'a, 't, 'c> TxEntities<'a, 't, 'c> {
    pub(crate) fn new(tx: &'a Tx<'t, 'c>) -> Self {
        Self { tx, touched: BTreeMap::new(), failure: None }
    }

    fn note(&mut self, error: Error) {
        self.failure.get_or_insert(error);
    }

    /// The first read failure of the fold so far, if any (and forgets it).
    pub(crate) fn failed(&mut self) -> Result<()> {
        self.failure.take().map_or(Ok(()), Err)
    }

    fn load_intent(&mut self, key: &IntentKey) -> Option<&mut Touched> {
        let stream = key.stream();
        if !self.touched.contains_key(&stream) {
            let row = match self.tx.intent_row(key) {
                Ok(row) => row?,
                Err(error) => {
                    self.note(error);
                    return None;
                }
            };
            let reserved_seq = self.tx.event_at(&stream, 1);
            match (row.intent(), reserved_seq) {
                (Ok(intent), Ok(Some((_, reserved_seq)))) => {
                    self.touched.insert(stream.clone(), Touched::Intent { intent: Box::new(intent), reserved_seq });
                }
                (Err(error), _) | (_, Err(error)) => {
                    self.note(error);
                    return None;
                }
                (Ok(_), Ok(None)) => {
                    self.note(Error::corrupt(0, format!("intent {key} has a row but no events")));
                    return None;
                }
            }
        }
        self.touched.get_mut(&stream)
    }

    fn load_run(&mut self, run_id: &RunId) -> Option<&mut Touched> {
        let stream = run_id.stream();
        if !self.touched.contains_key(&stream) {
            match self.tx.run_row(run_id).and_then(|row| row.map(|row| row.run()).transpose()) {
                Ok(Some(run)) => {
                    self.touched.insert(stream.clone(), Touched::Run(Box::new(run)));
                }
                Ok(None) => return None,
                Err(error) => {
                    self.note(error);
                    return None;
                }
            }
        }
        self.touched.get_mut(&stream)
    }

    /// Writes every touched entity's row with its stream's length — the intents in one
    /// statement, the runs in another — and remembers the rows.
    pub(crate) fn write_back(mut self) -> Result<()> {
        if let Some(error) = self.failure.take() {
            return Err(error);
        }
        let mut intents = Vec::new();
        let mut runs = Vec::new();
        let mut written = Vec::with_capacity(self.touched.len());
        for (stream, touched) in &self.touched {
            let stream_len = self.tx.stream_length(stream)?;
            let state = match touched {
                Touched::Intent { intent, reserved_seq } => {
                    intents.push((&**intent, *reserved_seq, stream_len));
                    serde_json::to_string(intent).expect("an intent serializes: plain fields")
                }
                Touched::Run(run) => {
                    runs.push((&**run, stream_len));
                    serde_json::to_string(run).expect("a run serializes: plain fields")
                }
            };
            written.push(EntityRow { stream: stream.clone(), state, stream_len });
        }
        if !intents.is_empty() {
            self.tx.with(|tx| rows::put_intents(tx, &intents))?;
        }
        if !runs.is_empty() {
            self.tx.with(|tx| rows::put_runs(tx, &runs))?;
        }
        for row in written {
            self.tx.wrote(row);
        }
        Ok(())
    }
}

impl Entities for TxEntities<'_, '_, '_> {
    fn intent_mut(&mut self, key: &IntentKey) -> Option<&mut Intent> {
        match self.load_intent(key)? {
            Touched::Intent { intent, .. } => Some(intent),
            Touched::Run(_) => None,
        }
    }

    fn has_intent(&mut self, key: &IntentKey) -> bool {
        self.load_intent(key).is_some()
    }

    fn insert_intent(&mut self, intent: Intent) {
        let reserved_seq = intent.last_seq;
        self.touched.insert(intent.key().stream(), Touched::Intent { intent: Box::new(intent), reserved_seq });
    }

    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut Run> {
        match self.load_run(run_id)? {
            Touched::Run(run) => Some(run),
            Touched::Intent { .. } => None,
        }
    }

    fn insert_run(&mut self, run: Run) {
        self.touched.insert(run.run_id.stream(), Touched::Run(Box::new(run)));
    }
}
