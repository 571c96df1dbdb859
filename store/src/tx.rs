//! The writer's per-entity state inside one transaction: what a decision reads
//! ([`TxView`], an [`engine::ledger::View`]) and where the fold keeps what it changes
//! ([`TxEntities`], an [`engine::ledger::fold::Entities`]).
//!
//! Both read through the writer's bounded [`Cache`] and fall back to indexed reads of the
//! entity rows on the write connection (`crate::rows`), so a decision costs the size of the
//! entities it is about, never the size of the log. [`TxEntities`] loads the rows a
//! command's events touch, lets the fold change them, and [`TxEntities::write_back`] writes
//! them in the same transaction before the next command is decided — so later SQL reads of
//! the batch see them — then refreshes the cache.
//!
//! A read that fails is remembered and reported by `finish`, so the batch fails instead of
//! deciding on a guess.

use crate::cache::{Cache, Entity};
use crate::codec;
use crate::error::{Error, Result};
use crate::rows;
use chrono::{DateTime, Utc};
use engine::event::{IntentKey, RunId, StreamId};
use engine::ledger::fold::Entities;
use engine::ledger::{Intent, Run, RunHistory, View};
use rusqlite::Connection;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

/// Reads through the cache: stream ids, lengths and entities.
///
/// Besides the bounded cache it keeps every entity it loaded (`memo`) for as long as it
/// lives — one command — so a command that reads more entities than the cache holds (a
/// recovery pass: up to `RECOVERY_PASS_MAX` intents and their runs) loads each once, for its
/// decision and for its fold. That memory is bounded by what one command may read.
pub(crate) struct Store<'a> {
    conn: &'a Connection,
    cache: &'a RefCell<Cache>,
    memo: RefCell<HashMap<i64, Entity>>,
}

impl<'a> Store<'a> {
    /// Reads on `conn` through `cache`, for one command (or one batch's replies).
    pub(crate) fn new(conn: &'a Connection, cache: &'a RefCell<Cache>) -> Self {
        Self { conn, cache, memo: RefCell::new(HashMap::new()) }
    }

    /// The id of stream `name`, if it has one.
    pub(crate) fn id(&self, name: &StreamId) -> Result<Option<i64>> {
        if let Some(id) = self.cache.borrow_mut().id(name) {
            return Ok(Some(id));
        }
        let id = codec::stream_id(self.conn, name.as_str())?;
        if let Some(id) = id {
            self.cache.borrow_mut().set_id(name, id);
        }
        Ok(id)
    }

    /// The id of stream `name`, assigned if it had none.
    pub(crate) fn ensure_id(&self, name: &StreamId) -> Result<i64> {
        if let Some(id) = self.id(name)? {
            return Ok(id);
        }
        let id = codec::ensure_stream(self.conn, name.as_str())?;
        self.cache.borrow_mut().set_id(name, id);
        Ok(id)
    }

    /// How many events stream `name` holds.
    pub(crate) fn stream_length(&self, name: &StreamId) -> Result<u64> {
        let Some(id) = self.id(name)? else {
            return codec::stream_length(self.conn, None, name.as_str());
        };
        if let Some(len) = self.cache.borrow_mut().entry(id).and_then(|e| e.len) {
            return Ok(len);
        }
        let len = codec::stream_length(self.conn, Some(id), name.as_str())?;
        self.cache.borrow_mut().entry_or_default(id).len = Some(len);
        Ok(len)
    }

    /// Records that stream `id` now holds `len` events.
    pub(crate) fn set_length(&self, id: i64, len: u64) {
        self.cache.borrow_mut().entry_or_default(id).len = Some(len);
    }

    fn cached(&self, id: i64) -> Option<Entity> {
        if let Some(entity) = self.memo.borrow().get(&id) {
            return Some(entity.clone());
        }
        self.cache.borrow_mut().entry(id).and_then(|e| e.entity.clone())
    }

    fn keep(&self, id: i64, entity: Entity) {
        self.memo.borrow_mut().insert(id, entity.clone());
        self.cache.borrow_mut().entry_or_default(id).entity = Some(entity);
    }

    /// The intent with stream id `id`.
    pub(crate) fn intent_at(&self, id: i64) -> Result<Option<Intent>> {
        if let Some(Entity::Intent(intent)) = self.cached(id) {
            return Ok(Some(*intent));
        }
        let intent = rows::intent_at(self.conn, id)?;
        if let Some(intent) = &intent {
            self.keep(id, Entity::Intent(Box::new(intent.clone())));
        }
        Ok(intent)
    }

    /// The run with stream id `id`.
    pub(crate) fn run_at(&self, id: i64) -> Result<Option<Run>> {
        if let Some(Entity::Run(run)) = self.cached(id) {
            return Ok(Some(*run));
        }
        let run = rows::run_at(self.conn, id)?;
        if let Some(run) = &run {
            self.keep(id, Entity::Run(Box::new(run.clone())));
        }
        Ok(run)
    }

    /// The intent with `key`, and its stream id.
    pub(crate) fn intent(&self, key: &IntentKey) -> Result<Option<(i64, Intent)>> {
        let Some(id) = self.id(&key.stream())? else {
            return Ok(None);
        };
        Ok(self.intent_at(id)?.map(|intent| (id, intent)))
    }

    /// The run `run_id`, and its stream id.
    pub(crate) fn run(&self, run_id: &RunId) -> Result<Option<(i64, Run)>> {
        let Some(id) = self.id(&run_id.stream())? else {
            return Ok(None);
        };
        Ok(self.run_at(id)?.map(|run| (id, run)))
    }

    fn intents(&self, ids: Vec<i64>) -> Result<Vec<Intent>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.intent_at(id)?);
        }
        Ok(out)
    }

    fn runs_at(&self, ids: Vec<i64>) -> Result<Vec<Run>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.run_at(id)?);
        }
        Ok(out)
    }
}

/// The view a decision reads: [`Store`] plus the first failure.
pub(crate) struct TxView<'a> {
    store: &'a Store<'a>,
    failure: RefCell<Option<Error>>,
}

impl<'a> TxView<'a> {
    pub(crate) fn new(store: &'a Store<'a>) -> Self {
        Self { store, failure: RefCell::new(None) }
    }

    /// The first read failure, if any.
    pub(crate) fn finish(self) -> Result<()> {
        self.failure.into_inner().map_or(Ok(()), Err)
    }

    fn or_note<T>(&self, read: Result<T>, fallback: T) -> T {
        read.unwrap_or_else(|error| {
            self.failure.borrow_mut().get_or_insert(error);
            fallback
        })
    }

    /// How many events stream `name` holds (for `seal`).
    pub(crate) fn stream_length(&self, name: &StreamId) -> u64 {
        self.or_note(self.store.stream_length(name), 0)
    }
}

impl View for TxView<'_> {
    fn intent(&self, key: &IntentKey) -> Option<Intent> {
        self.or_note(self.store.intent(key), None).map(|(_, intent)| intent)
    }

    fn run(&self, run_id: &RunId) -> Option<Run> {
        self.or_note(self.store.run(run_id), None).map(|(_, run)| run)
    }

    fn history(&self, run_id: &RunId) -> Option<RunHistory> {
        let events = self.or_note(codec::stream_events(self.store.conn, &run_id.stream()), Vec::new());
        if events.is_empty() {
            return None;
        }
        let history = engine::ledger::fold::history(&events).map_err(|e| Error::corrupt(e.seq, e.to_string()));
        self.or_note(history.map(Some), None)
    }

    fn conversation(&self, id: &engine::facts::ConversationId) -> engine::facts::Conversation {
        let events = self.or_note(codec::stream_events(self.store.conn, &id.stream()), Vec::new());
        let folded = engine::facts::fold(&events).map_err(|e| Error::corrupt(e.seq, e.to_string()));
        self.or_note(folded, engine::facts::Conversation::default())
    }

    fn order_intents(&self, tenant: &str, order_id: &str) -> Vec<Intent> {
        let ids = rows::order_intent_ids(self.store.conn, tenant, order_id);
        self.or_note(ids.and_then(|ids| self.store.intents(ids)), Vec::new())
    }

    fn reference_charges(&self, tenant: &str, reference: &str) -> Vec<Intent> {
        let ids = rows::reference_charge_ids(self.store.conn, tenant, reference);
        let candidates = self.or_note(ids.and_then(|ids| self.store.intents(ids)), Vec::new());
        candidates
            .into_iter()
            .filter(|i| {
                i.definition.kind == engine::provider::EffectKind::Charge && i.definition.business_ref == reference
            })
            .collect()
    }

    fn run_intents(&self, run_id: &RunId) -> Vec<Intent> {
        let read = || -> Result<Vec<Intent>> {
            let Some(run) = self.store.id(&run_id.stream())? else {
                return Ok(Vec::new());
            };
            self.store.intents(rows::run_intent_ids(self.store.conn, run)?)
        };
        self.or_note(read(), Vec::new())
    }

    fn in_flight(&self, limit: usize) -> Vec<Intent> {
        let ids = rows::in_flight_ids(self.store.conn, limit);
        self.or_note(ids.and_then(|ids| self.store.intents(ids)), Vec::new())
    }

    fn due(&self, now: DateTime<Utc>, limit: usize) -> Vec<IntentKey> {
        let ids = rows::due_ids(self.store.conn, codec::micros(now), limit);
        let intents = self.or_note(ids.and_then(|ids| self.store.intents(ids)), Vec::new());
        intents.into_iter().map(|intent| intent.key().clone()).collect()
    }

    fn waiting(&self, limit: usize) -> Vec<IntentKey> {
        let ids = rows::reserved_ids(self.store.conn, limit);
        let intents = self.or_note(ids.and_then(|ids| self.store.intents(ids)), Vec::new());
        intents.into_iter().map(|intent| intent.key().clone()).collect()
    }

    fn awake_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run> {
        let ids = rows::awake_run_ids(self.store.conn, codec::micros(now), limit);
        self.or_note(ids.and_then(|ids| self.store.runs_at(ids)), Vec::new())
    }

    fn sleeping_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run> {
        let ids = rows::sleeping_run_ids(self.store.conn, codec::micros(now), limit);
        self.or_note(ids.and_then(|ids| self.store.runs_at(ids)), Vec::new())
    }
}

/// An entity a command's events changed, waiting to be written back.
struct Touched {
    entity: Entity,
    /// Created by this command: its order and reference entries are written too.
    new: bool,
}

/// The entities a command's events touch, loaded on demand and changed in place by the
/// fold, then written back by [`TxEntities::write_back`].
pub(crate) struct TxEntities<'a> {
    store: &'a Store<'a>,
    /// By stream id; a `BTreeMap` so write-back order is deterministic.
    touched: BTreeMap<i64, Touched>,
    failure: Option<Error>,
}

impl<'a> TxEntities<'a> {
    pub(crate) fn new(store: &'a Store<'a>) -> Self {
        Self { store, touched: BTreeMap::new(), failure: None }
    }

    fn note(&mut self, error: Error) {
        self.failure.get_or_insert(error);
    }

    /// Loads stream `name`'s entity into `touched` (if it has one) and returns its id.
    fn load(&mut self, name: &StreamId, intent: bool) -> Option<i64> {
        let id = match self.store.id(name) {
            Ok(Some(id)) => id,
            Ok(None) => return None,
            Err(error) => {
                self.note(error);
                return None;
            }
        };
        if self.touched.contains_key(&id) {
            return Some(id);
        }
        let loaded = if intent {
            self.store.intent_at(id).map(|i| i.map(|i| Entity::Intent(Box::new(i))))
        } else {
            self.store.run_at(id).map(|r| r.map(|r| Entity::Run(Box::new(r))))
        };
        match loaded {
            Ok(Some(entity)) => {
                self.touched.insert(id, Touched { entity, new: false });
                Some(id)
            }
            Ok(None) => None,
            Err(error) => {
                self.note(error);
                None
            }
        }
    }

    fn insert(&mut self, name: &StreamId, entity: Entity) {
        // The event creating it was inserted first, so its stream has an id.
        match self.store.id(name) {
            Ok(Some(id)) => {
                self.touched.insert(id, Touched { entity, new: true });
            }
            Ok(None) => self.note(Error::corrupt(0, format!("stream {name} has no id although its event was written"))),
            Err(error) => self.note(error),
        }
    }

    /// Writes every touched entity's row (runs first: an intent row names its run's), the
    /// order and reference entries of new intents, and refreshes the cache.
    /// `now` is the instant of the events that touched them (the metrics rows keep it).
    pub(crate) fn write_back(mut self, now: DateTime<Utc>) -> Result<()> {
        if let Some(error) = self.failure.take() {
            return Err(error);
        }
        let conn = self.store.conn;
        for (&id, touched) in &self.touched {
            if let Entity::Run(run) = &touched.entity {
                rows::put_run(conn, id, run)?;
                crate::metrics::put_run_facts(conn, id, run)?;
                crate::metrics::put_run_cost_unknown(conn, id, run)?;
            }
        }
        for (&id, touched) in &self.touched {
            if let Entity::Intent(intent) = &touched.entity {
                let run = self.store.id(&intent.run_id.stream())?.ok_or_else(|| {
                    Error::corrupt(
                        intent.last_seq,
                        format!("intent {} names run {} without a stream", intent.key(), intent.run_id),
                    )
                })?;
                rows::put_intent(conn, id, run, intent)?;
                crate::metrics::put_intent_facts(conn, id, run, intent, now)?;
                if touched.new {
                    rows::put_intent_maps(conn, id, intent)?;
                }
            }
        }
        for (id, touched) in self.touched {
            self.store.keep(id, touched.entity);
        }
        Ok(())
    }
}

impl Entities for TxEntities<'_> {
    fn intent_mut(&mut self, key: &IntentKey) -> Option<&mut Intent> {
        let id = self.load(&key.stream(), true)?;
        match &mut self.touched.get_mut(&id)?.entity {
            Entity::Intent(intent) => Some(intent),
            Entity::Run(_) => None,
        }
    }

    fn has_intent(&mut self, key: &IntentKey) -> bool {
        self.load(&key.stream(), true).is_some()
    }

    fn insert_intent(&mut self, intent: Intent) {
        let name = intent.key().stream();
        self.insert(&name, Entity::Intent(Box::new(intent)));
    }

    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut Run> {
        let id = self.load(&run_id.stream(), false)?;
        match &mut self.touched.get_mut(&id)?.entity {
            Entity::Run(run) => Some(run),
            Entity::Intent(_) => None,
        }
    }

    fn insert_run(&mut self, run: Run) {
        let name = run.run_id.stream();
        self.insert(&name, Entity::Run(Box::new(run)));
    }
}
