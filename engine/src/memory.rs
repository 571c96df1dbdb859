//! An in-memory [`EventLog`], for tests and models.
//!
//! Owns [`MemoryLog`]: the same decide → append → fold cycle as the SQLite store, with the
//! same hash chain, kept in a `Vec`. It is what engine tests and the crash-replay model run
//! against; it must never be used where durability is promised. One mutex serialises every
//! command, which is what the store's single writer does too.

use crate::clock::Clock;
use crate::event::{StoredEvent, chain_hash};
use crate::ledger::{Command, Ledger, Reply};
use crate::log::{EventLog, LogError};
use crate::provider::BoxFuture;
use chrono::SubsecRound;
use std::sync::{Arc, Mutex};

/// A log kept in memory.
pub struct MemoryLog {
    clock: Arc<dyn Clock>,
    state: Mutex<(Ledger, Vec<StoredEvent>)>,
}

impl MemoryLog {
    /// An empty log stamping times from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self { clock, state: Mutex::new((Ledger::new(), Vec::new())) }
    }

    /// Every event appended so far.
    pub fn events(&self) -> Vec<StoredEvent> {
        self.lock().1.clone()
    }

    /// A copy of the current fold.
    pub fn ledger(&self) -> Ledger {
        self.lock().0.clone()
    }

    /// Decides and appends one command synchronously.
    pub fn execute_now(&self, command: &Command) -> Result<Reply, LogError> {
        let now = self.clock.now().trunc_subsecs(6);
        let mut state = self.lock();
        let (ledger, events) = &mut *state;
        let (decided, target) = ledger.decide(command, now)?;
        for event in decided {
            let stream = event.stream();
            let seq = ledger.last_seq() + 1;
            let stream_seq = ledger.stream_length(&stream) + 1;
            let prev_hash = ledger.last_hash().to_owned();
            let hash = chain_hash(&prev_hash, seq, &stream, stream_seq, now, &command.cause, &event);
            let stored =
                StoredEvent { seq, stream, stream_seq, at: now, cause: command.cause.clone(), event, prev_hash, hash };
            ledger.apply(&stored);
            events.push(stored);
        }
        Ok(ledger.reply_after(&target))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Ledger, Vec<StoredEvent>)> {
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
                Scripted::Decline => return CallOutcome::Declined { code: "card_declined".to_owned() },
                Scripted::Refuse => return CallOutcome::NotSent { detail: "connection refused".to_owned() },
                Scripted::FailBeforeEffect => {
                    return CallOutcome::Unknown {
                        reason: UnknownReason::ProviderUnavailable,
                        detail: "500".to_owned(),
                    };
                }
                Scripted::Succeed | Scripted::LoseAnswer => {}
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
                    evidence
                }
            };
            if behaviour == Scripted::LoseAnswer {
                return CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "answer lost".to_owned() };
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
