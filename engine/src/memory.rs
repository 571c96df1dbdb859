//! An in-memory [`EventLog`], for tests and models.
//!
//! Owns [`MemoryLog`]: the same decide → append → fold cycle as the SQLite store, with the
//! same hash chain, kept in a `Vec`. It is what engine tests and the crash-replay model run
//! against; it must never be used where durability is promised. One mutex serialises every
//! command, which is what the store's single writer does too.

use crate::append::{Chaining, End, Head, Sealed, Tail, seal};
use crate::clock::Clock;
use crate::event::{RunId, StoredEvent, StreamId};
use crate::lease::{ExpiryOnly, LeaseEffect, LeaseOwner, LeaseRow, LeaseView, Liveness, OwnerProbe};
use crate::ledger::{Command, Ledger, Reply};
use crate::log::{EventLog, LogError};
use crate::provider::BoxFuture;
use chrono::SubsecRound;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// A log kept in memory.
pub struct MemoryLog {
    clock: Arc<dyn Clock>,
    probe: Arc<dyn OwnerProbe>,
    state: Mutex<State>,
}

/// The fold, the events, and the run leases (operational state, like the store's `leases`
/// table: not in the events, so a restart from events starts with none).
struct State {
    ledger: Ledger,
    events: Vec<StoredEvent>,
    leases: BTreeMap<RunId, LeaseRow>,
    /// Each stream's first sequence (the parent of most of its later events).
    firsts: HashMap<StreamId, u64>,
}

/// The leases as the ledger reads them while deciding.
struct Leases<'a> {
    rows: &'a BTreeMap<RunId, LeaseRow>,
    probe: &'a dyn OwnerProbe,
}

impl LeaseView for Leases<'_> {
    fn holder(&self, run_id: &RunId) -> Option<LeaseRow> {
        self.rows.get(run_id).cloned()
    }

    fn liveness(&self, owner: &LeaseOwner) -> Liveness {
        self.probe.liveness(owner)
    }

    fn ttl_ms(&self) -> u64 {
        crate::limits::LEASE_TTL_DEFAULT_MS
    }
}

impl MemoryLog {
    /// An empty log stamping times from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::from_events(clock, Vec::new())
    }

    /// A log holding `events`, folded afresh: what a process sees when it restarts on a log
    /// whose committed prefix is `events`. No lease is live: every earlier process is gone.
    pub fn from_events(clock: Arc<dyn Clock>, events: Vec<StoredEvent>) -> Self {
        let mut ledger = Ledger::new();
        events.iter().for_each(|event| ledger.apply(event));
        let mut firsts = HashMap::new();
        for event in &events {
            firsts.entry(event.stream.clone()).or_insert(event.seq);
        }
        let state = State { ledger, events, leases: BTreeMap::new(), firsts };
        Self { clock, probe: Arc::new(ExpiryOnly), state: Mutex::new(state) }
    }

    /// The same log, telling owners' liveness with `probe` (tests that keep two "processes"
    /// on one log say which of them is dead).
    pub fn with_probe(mut self, probe: Arc<dyn OwnerProbe>) -> Self {
        self.probe = probe;
        self
    }

    /// Every event appended so far.
    pub fn events(&self) -> Vec<StoredEvent> {
        self.lock().events.clone()
    }

    /// A copy of the current fold.
    pub fn ledger(&self) -> Ledger {
        self.lock().ledger.clone()
    }

    /// Decides and appends one command synchronously.
    pub fn execute_now(&self, command: &Command) -> Result<Reply, LogError> {
        let now = self.clock.now().trunc_subsecs(6);
        let mut state = self.lock();
        let State { ledger, events, leases, firsts } = &mut *state;
        let decision = crate::ledger::decide(&*ledger, &Leases { rows: leases, probe: &*self.probe }, command, now)?;
        let head = Head { last_seq: ledger.last_seq(), last_hash: ledger.last_hash() };
        let mut seq_of = |tail: Tail<'_>, end: End| match (tail, end) {
            (Tail::Intent(key), End::Latest) => ledger.intent(key).map(|i| i.last_seq),
            (Tail::Run(run_id), End::Latest) => ledger.run(run_id).map(|r| r.last_seq),
            (Tail::Intent(key), End::First) => firsts.get(&key.stream()).copied(),
            (Tail::Run(run_id), End::First) => firsts.get(&run_id.stream()).copied(),
        };
        let sealed = seal(
            decision.events,
            &command.cause,
            now,
            Chaining::Global(head),
            &mut |stream| ledger.stream_length(stream),
            &mut seq_of,
        )?;
        for effect in decision.leases {
            match effect {
                LeaseEffect::Hold { run_id, owner, token, expires_at } => {
                    leases.insert(run_id, LeaseRow { owner, token, expires_at: Some(expires_at) });
                }
                LeaseEffect::Release { run_id } => {
                    if let Some(row) = leases.get_mut(&run_id) {
                        row.expires_at = None;
                    }
                }
            }
        }
        for Sealed { stored, .. } in sealed {
            firsts.entry(stored.stream.clone()).or_insert(stored.seq);
            ledger.apply(&stored);
            events.push(stored);
        }
        Ok(crate::ledger::reply_after(&*ledger, &decision.target))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock is an impossible transition in `apply`: the state is
        // then unusable, and so is every later test step. Propagating is right.
        self.state.lock().expect("the memory log's mutex is poisoned only after an impossible transition panicked")
    }
}

impl EventLog for MemoryLog {
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, LogError>> {
        Box::pin(async move { self.execute_now(&command) })
    }
}

/// What the in-memory provider does with the next call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scripted {
    /// Perform the effect and answer it.
    Succeed,
    /// Perform the effect, then lose the answer (timeout after effect).
    LoseAnswer,
    /// Answer 5xx without performing the effect.
    FailBeforeEffect,
    /// Decline definitively.
    Decline,
    /// Refuse the connection: proven never sent.
    Refuse,
    /// Time out before the request reached the provider: no effect, but unknown to Keel.
    TimeoutBeforeEffect,
    /// Perform the effect, then answer 5xx (unknown to Keel).
    FailAfterEffect,
    /// Answer 409 "the key is in flight elsewhere" without acting (unknown to Keel).
    ConflictInFlight,
}

/// One effect the in-memory provider performed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEffect {
    /// The idempotency key the request carried.
    pub idempotency_key: String,
    /// Charge or refund.
    pub kind: crate::provider::EffectKind,
    /// The request's tenant.
    pub tenant: String,
    /// The request's intent id.
    pub intent_id: String,
    /// The request's order.
    pub order_id: String,
    /// The amount moved.
    pub amount_minor: i64,
    /// The currency, as the request carried it.
    pub currency: String,
    /// The provider's reference.
    pub provider_ref: String,
}

/// An in-process, zero-latency payment provider: deduplicates on the idempotency key (same
/// key → the same effect), answers lookups, and follows a queue of scripted behaviours
/// (default: succeed). Used by `keel bench` and by tests; it crosses no process boundary.
pub struct MemoryProvider {
    capability: crate::provider::Capability,
    state: Mutex<MemoryProviderState>,
}

#[derive(Default)]
struct MemoryProviderState {
    effects: std::collections::HashMap<String, crate::provider::Evidence>,
    effect_count: usize,
    performed: Vec<MemoryEffect>,
    script: std::collections::VecDeque<Scripted>,
    lookups_absent: u32,
    lookups_unavailable: u32,
}

impl MemoryProvider {
    /// A provider with the given capability and no scripted faults.
    pub fn new(capability: crate::provider::Capability) -> Self {
        Self { capability, state: Mutex::new(MemoryProviderState::default()) }
    }

    /// Queues behaviours for the next calls, in order.
    pub fn script(&self, behaviours: impl IntoIterator<Item = Scripted>) {
        self.lock().script.extend(behaviours);
    }

    /// The next `n` lookups answer "absent" whatever the truth (eventual consistency, or a lie).
    pub fn lookups_absent(&self, n: u32) {
        self.lock().lookups_absent = n;
    }

    /// The next `n` lookups are unavailable.
    pub fn lookups_unavailable(&self, n: u32) {
        self.lock().lookups_unavailable = n;
    }

    /// Effects performed so far (with deduplication, at most one per key unless the
    /// capability says the provider cannot deduplicate).
    pub fn effect_count(&self) -> usize {
        self.lock().effect_count
    }

    /// Every effect performed, in order (a provider without deduplication may hold several
    /// per key).
    pub fn effects(&self) -> Vec<MemoryEffect> {
        self.lock().performed.clone()
    }

    /// Drops every queued behaviour and lookup fault: the provider is healthy again.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.script.clear();
        state.lookups_absent = 0;
        state.lookups_unavailable = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryProviderState> {
        self.state.lock().expect("the memory provider's mutex is never held across a panic")
    }
}

impl crate::provider::PaymentProvider for MemoryProvider {
    fn capability(&self) -> crate::provider::Capability {
        self.capability
    }

    fn execute<'a>(
        &'a self,
        request: &'a crate::provider::EffectRequest,
    ) -> BoxFuture<'a, crate::provider::CallOutcome> {
        use crate::provider::{CallOutcome, Evidence, UnknownReason};
        Box::pin(async move {
            let mut state = self.lock();
            let behaviour = state.script.pop_front().unwrap_or(Scripted::Succeed);
            match behaviour {
                // A provider that deduplicates answers a key it already acted on with the
                // stored result: it cannot decline an effect it made.
                Scripted::Decline => match state.effects.get(&request.idempotency_key) {
                    Some(evidence) if self.capability.dedup_by_key => return CallOutcome::Succeeded(evidence.clone()),
                    _ => return CallOutcome::Declined { code: "card_declined".to_owned() },
                },
                Scripted::Refuse => return CallOutcome::NotSent { detail: "connection refused".to_owned() },
                Scripted::FailBeforeEffect => {
                    return CallOutcome::Unknown {
                        reason: UnknownReason::ProviderUnavailable,
                        detail: "500".to_owned(),
                    };
                }
                Scripted::TimeoutBeforeEffect => {
                    return CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer".to_owned() };
                }
                Scripted::ConflictInFlight => {
                    return CallOutcome::Unknown {
                        reason: UnknownReason::ProviderUnavailable,
                        detail: "409 request_in_progress".to_owned(),
                    };
                }
                Scripted::Succeed | Scripted::LoseAnswer | Scripted::FailAfterEffect => {}
            }
            let existing = state.effects.get(&request.idempotency_key).cloned();
            let evidence = match existing {
                Some(evidence) if self.capability.dedup_by_key => evidence,
                _ => {
                    state.effect_count += 1;
                    let evidence = Evidence {
                        provider_ref: format!("{}_{}", &request.kind.as_str()[..2], state.effect_count),
                        amount_minor: request.amount_minor,
                        currency: request.currency.clone(),
                    };
                    state.effects.insert(request.idempotency_key.clone(), evidence.clone());
                    state.performed.push(MemoryEffect {
                        idempotency_key: request.idempotency_key.clone(),
                        kind: request.kind,
                        tenant: request.tenant.clone(),
                        intent_id: request.intent_id.clone(),
                        order_id: request.order_id.clone(),
                        amount_minor: request.amount_minor,
                        currency: request.currency.clone(),
                        provider_ref: evidence.provider_ref.clone(),
                    });
                    evidence
                }
            };
            if behaviour == Scripted::LoseAnswer {
                return CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "answer lost".to_owned() };
            }
            if behaviour == Scripted::FailAfterEffect {
                return CallOutcome::Unknown {
                    reason: UnknownReason::ProviderUnavailable,
                    detail: "502 after the effect".to_owned(),
                };
            }
            CallOutcome::Succeeded(evidence)
        })
    }

    fn lookup<'a>(
        &'a self,
        _kind: crate::provider::EffectKind,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, crate::provider::LookupOutcome> {
        use crate::provider::LookupOutcome;
        Box::pin(async move {
            let mut state = self.lock();
            if state.lookups_unavailable > 0 {
                state.lookups_unavailable -= 1;
                return LookupOutcome::Unavailable { detail: "scripted unavailability".to_owned() };
            }
            if state.lookups_absent > 0 {
                state.lookups_absent -= 1;
                return LookupOutcome::Absent;
            }
            match state.effects.get(idempotency_key) {
                Some(evidence) => LookupOutcome::Found(evidence.clone()),
                None => LookupOutcome::Absent,
            }
        })
    }
}
