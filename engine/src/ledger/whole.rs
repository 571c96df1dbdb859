//! The fold of a whole log, kept in memory.
//!
//! Owns [`Ledger`]: every intent and run, folded from every event with [`super::fold`], the
//! indexes the [`View`] questions need, and the chain's head. It is what the in-memory log
//! (`crate::memory`) decides over, what `verify`'s reference replay and the test kit's
//! invariants read, and the reference model the store's per-entity view is tested against.
//! Its memory grows with the log: never what a production command decides over.

use super::fold::{self, Entities, FoldError};
use super::state::{Intent, IntentStatus, Run, RunHistory};
use super::view::View;
use crate::append::ChainRule;
use crate::event::{IntentKey, RunId, StoredEvent, StreamId};
use crate::facts::{Conversation, ConversationId};
use crate::money::checked_sum;
use crate::provider::EffectKind;
use chrono::{DateTime, Utc};
use std::collections::HashMap;

/// The fold of the whole log.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    intents: HashMap<IntentKey, Intent>,
    runs: HashMap<RunId, Run>,
    /// (tenant, order id) → intents on that order.
    orders: HashMap<(String, String), Vec<IntentKey>>,
    /// (tenant, business reference) → charges under it.
    references: HashMap<(String, String), Vec<IntentKey>>,
    /// run → intents it reserved.
    run_intents: HashMap<RunId, Vec<IntentKey>>,
    /// run → its stream, for histories.
    run_streams: HashMap<RunId, Vec<StoredEvent>>,
    stream_lengths: HashMap<StreamId, u64>,
    /// Conversations' controlled facts.
    conversations: HashMap<ConversationId, Conversation>,
    last_seq: u64,
    last_hash: Option<String>,
    /// Which chain [`Ledger::try_apply`] checks.
    rule: ChainRule,
    /// Each stream's last hash, under [`ChainRule::PerStream`] only.
    stream_hashes: HashMap<StreamId, String>,
}

impl Ledger {
    /// An empty ledger: the state before the first event.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty ledger over a log chained per stream ([`ChainRule::PerStream`]): sequences
    /// must increase (gaps allowed) and each event must chain to its stream's previous one.
    pub fn per_stream() -> Self {
        Self { rule: ChainRule::PerStream, ..Self::default() }
    }

    /// Global sequence of the last applied event (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Hash of the last applied event (the genesis hash when empty).
    pub fn last_hash(&self) -> &str {
        self.last_hash.as_deref().unwrap_or(crate::event::GENESIS_HASH)
    }

    /// Number of events on `stream` so far.
    pub fn stream_length(&self, stream: &StreamId) -> u64 {
        self.stream_lengths.get(stream).copied().unwrap_or(0)
    }

    /// One intent.
    pub fn intent(&self, key: &IntentKey) -> Option<&Intent> {
        self.intents.get(key)
    }

    /// Every intent, in key order.
    pub fn intents(&self) -> Vec<&Intent> {
        let mut all: Vec<&Intent> = self.intents.values().collect();
        all.sort_by(|a, b| a.key().cmp(b.key()));
        all
    }

    /// One run.
    pub fn run(&self, run_id: &RunId) -> Option<&Run> {
        self.runs.get(run_id)
    }

    /// Every run, in id order.
    pub fn runs(&self) -> Vec<&Run> {
        let mut all: Vec<&Run> = self.runs.values().collect();
        all.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        all
    }

    /// Money the run has committed (reserved, held while unknown, or spent), in minor units of
    /// the run's one currency.
    pub fn run_cost_committed_minor(&self, run_id: &RunId) -> i64 {
        committed_minor(self.run_intents.get(run_id).into_iter().flatten().filter_map(|k| self.intents.get(k)))
    }

    /// Money left in the run's budget, `None` when unbounded (negative if over it, which the
    /// ledger never lets happen).
    pub fn run_cost_remaining_minor(&self, run_id: &RunId) -> Option<i64> {
        let max = self.runs.get(run_id)?.limits.cost_minor_max?;
        max.checked_sub(self.run_cost_committed_minor(run_id))
    }

    /// Validated charges on an order in `currency`, in minor units.
    pub fn order_charged_minor(&self, tenant: &str, order_id: &str, currency: &str) -> i64 {
        let charges = self.order_keys(tenant, order_id).filter_map(|k| self.intents.get(k)).filter(|i| {
            i.definition.kind == EffectKind::Charge
                && i.definition.currency == currency
                && i.status == IntentStatus::Validated
        });
        checked_sum(charges.map(|i| i.definition.amount_minor))
            .expect("an order's amounts sum inside i64: Reserve refuses one that would not")
    }

    /// Refunds on an order in `currency` that are reserved, unknown or validated.
    pub fn order_refunds_committed_minor(&self, tenant: &str, order_id: &str, currency: &str) -> i64 {
        let refunds = self
            .order_keys(tenant, order_id)
            .filter_map(|k| self.intents.get(k))
            .filter(|i| i.definition.kind == EffectKind::Refund && i.definition.currency == currency);
        committed_minor(refunds)
    }

    fn order_keys(&self, tenant: &str, order_id: &str) -> impl Iterator<Item = &IntentKey> {
        self.orders.get(&(tenant.to_owned(), order_id.to_owned())).into_iter().flatten()
    }

    /// Intents whose reconciliation is due at `now`, oldest due first.
    pub fn due_for_reconciliation(&self, now: DateTime<Utc>) -> Vec<IntentKey> {
        let mut due: Vec<&Intent> = self.intents.values().filter(|i| i.reconcile_due(now)).collect();
        due.sort_by_key(|i| (i.reconcile_after, i.key().clone()));
        due.into_iter().map(|i| i.key().clone()).collect()
    }

    /// Folds one stored event after checking that it follows: the next global sequence (under
    /// [`ChainRule::PerStream`], a greater one), the next sequence of its stream, on the stream
    /// its event belongs on, chained to the last hash (under [`ChainRule::PerStream`], its
    /// stream's last hash).
    ///
    /// # Errors
    ///
    /// [`FoldError`] when it does not follow or is an impossible transition; the ledger must
    /// then not be used.
    pub fn try_apply(&mut self, stored: &StoredEvent) -> Result<(), FoldError> {
        let fail = |what: &'static str| FoldError { seq: stored.seq, stream: stored.stream.clone(), what };
        match self.rule {
            ChainRule::Global if stored.seq != self.last_seq + 1 => {
                return Err(fail("events fold in global order without gaps"));
            }
            ChainRule::PerStream if stored.seq <= self.last_seq => {
                return Err(fail("events fold in increasing sequence order"));
            }
            _ => {}
        }
        if stored.stream != stored.event.stream() {
            return Err(fail("an event on another stream than its own"));
        }
        if stored.stream_seq != self.stream_length(&stored.stream) + 1 {
            return Err(fail("a stream folds in order without gaps"));
        }
        let before = match self.rule {
            ChainRule::Global => self.last_hash(),
            ChainRule::PerStream => {
                self.stream_hashes.get(&stored.stream).map_or(crate::event::GENESIS_HASH, String::as_str)
            }
        };
        if stored.prev_hash != before {
            return Err(fail("an event not chained to the one before"));
        }
        fold::apply(self, stored)?;
        if let Some(id) = stored.event.conversation() {
            crate::facts::apply(self.conversations.entry(id.clone()).or_default(), stored)?;
        }
        *self.stream_lengths.entry(stored.stream.clone()).or_insert(0) += 1;
        self.last_seq = stored.seq;
        self.last_hash = Some(stored.hash.clone());
        if self.rule == ChainRule::PerStream {
            self.stream_hashes.insert(stored.stream.clone(), stored.hash.clone());
        }
        if let Some(run_id) = stored.event.subject() {
            self.run_streams.entry(run_id.clone()).or_default().push(stored.clone());
        }
        Ok(())
    }

    /// Folds one stored event this process just decided and appended.
    ///
    /// # Panics
    ///
    /// On an impossible transition: the decision that produced it is a bug, and folding past
    /// it would corrupt every later decision.
    pub fn apply(&mut self, stored: &StoredEvent) {
        if let Err(error) = self.try_apply(stored) {
            panic!("{error}");
        }
    }
}

/// The checked sum of the amounts whose money counts (reserved, in flight, unknown, spent).
fn committed_minor<'a>(intents: impl Iterator<Item = &'a Intent>) -> i64 {
    checked_sum(intents.filter(|i| i.money_committed()).map(|i| i.definition.amount_minor))
        .expect("a run's or an order's amounts sum inside i64: Reserve refuses one that would not")
}

impl Entities for Ledger {
    fn intent_mut(&mut self, key: &IntentKey) -> Option<&mut Intent> {
        self.intents.get_mut(key)
    }

    fn has_intent(&mut self, key: &IntentKey) -> bool {
        self.intents.contains_key(key)
    }

    fn insert_intent(&mut self, intent: Intent) {
        let definition = &intent.definition;
        let key = definition.key.clone();
        self.orders.entry((definition.tenant.clone(), definition.order_id.clone())).or_default().push(key.clone());
        if definition.kind == EffectKind::Charge {
            self.references
                .entry((definition.tenant.clone(), definition.business_ref.clone()))
                .or_default()
                .push(key.clone());
        }
        self.run_intents.entry(intent.run_id.clone()).or_default().push(key.clone());
        self.intents.insert(key, intent);
    }

    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut Run> {
        self.runs.get_mut(run_id)
    }

    fn insert_run(&mut self, run: Run) {
        self.runs.insert(run.run_id.clone(), run);
    }
}

impl View for Ledger {
    fn intent(&self, key: &IntentKey) -> Option<Intent> {
        self.intents.get(key).cloned()
    }

    fn run(&self, run_id: &RunId) -> Option<Run> {
        self.runs.get(run_id).cloned()
    }

    fn history(&self, run_id: &RunId) -> Option<RunHistory> {
        fold::history(self.run_streams.get(run_id)?).ok()
    }

    fn order_intents(&self, tenant: &str, order_id: &str) -> Vec<Intent> {
        self.order_keys(tenant, order_id).filter_map(|k| self.intents.get(k)).cloned().collect()
    }

    fn reference_charges(&self, tenant: &str, reference: &str) -> Vec<Intent> {
        let keys = self.references.get(&(tenant.to_owned(), reference.to_owned()));
        keys.into_iter().flatten().filter_map(|k| self.intents.get(k)).cloned().collect()
    }

    fn run_intents(&self, run_id: &RunId) -> Vec<Intent> {
        self.run_intents.get(run_id).into_iter().flatten().filter_map(|k| self.intents.get(k)).cloned().collect()
    }

    fn in_flight(&self, limit: usize) -> Vec<Intent> {
        let mut open: Vec<&Intent> = self
            .intents
            .values()
            .filter(|i| matches!(i.status, IntentStatus::Attempting | IntentStatus::Reconciling))
            .collect();
        open.sort_by(|a, b| a.key().cmp(b.key()));
        open.into_iter().take(limit).cloned().collect()
    }

    fn due(&self, now: DateTime<Utc>, limit: usize) -> Vec<IntentKey> {
        self.due_for_reconciliation(now).into_iter().take(limit).collect()
    }

    fn awake_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run> {
        let mut open: Vec<&Run> = self.runs.values().filter(|r| r.status.is_none() && !r.sleeping(now)).collect();
        open.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        open.into_iter().take(limit).cloned().collect()
    }

    fn sleeping_runs(&self, now: DateTime<Utc>, limit: usize) -> Vec<Run> {
        let mut sleeping: Vec<&Run> = self.runs.values().filter(|r| r.sleeping(now)).collect();
        sleeping.sort_by(|a, b| a.wake_at.cmp(&b.wake_at).then_with(|| a.run_id.cmp(&b.run_id)));
        sleeping.into_iter().take(limit).cloned().collect()
    }

    fn waiting(&self, limit: usize) -> Vec<IntentKey> {
        let mut waiting: Vec<&IntentKey> =
            self.intents.values().filter(|i| i.status == IntentStatus::Reserved).map(Intent::key).collect();
        waiting.sort();
        waiting.into_iter().take(limit).cloned().collect()
    }

    fn conversation(&self, id: &ConversationId) -> Conversation {
        self.conversations.get(id).cloned().unwrap_or_default()
    }
}
