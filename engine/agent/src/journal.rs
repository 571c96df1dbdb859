//! Where an agent run's facts are made durable.
//!
//! Owns [`AgentJournal`], the one door the harness writes through; [`LogJournal`], the
//! durable implementation over the spine's [`EventLog`] (one `AgentRecorded` event per fact
//! on the run's stream `run:<id>`, one commit per batch, checked by the ledger); and
//! [`MemoryJournal`], the in-memory implementation tests use. Neither does I/O of its own.
//!
//! # Contract
//!
//! - `append` is atomic: the whole batch is durable when it returns `Ok`, or none of it is.
//! - `load` returns every appended event, in append order.
//! - The harness appends a reservation before it spends (model call, tool body), so an `Ok`
//!   from `append` is the permission to spend.

use super::event::{AgentEvent, AgentState};
use engine::event::{Cause, IntentKey, RunId, RunLimits, RunVersions};
use engine::lease::{LeaseGrant, LeaseUse, Lessee};
use engine::ledger::{AgentRunStart, Refusal, SpineRequest};
use engine::log::{AgentBatch, Ask, Asking, EventLog, LogError};

use engine::provider::BoxFuture;
use std::sync::{Arc, Mutex};

/// Why the journal could not append or load.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The store is unavailable or refused the write; nothing of the batch is durable.
    #[error("agent journal unavailable: {detail}")]
    Unavailable {
        /// Human detail.
        detail: String,
    },
    /// An operator asked the run to stop (`keel run cancel`): the batch was refused, nothing
    /// of it written; the run records its `cancelled` stop instead.
    #[error("{detail}")]
    Cancelled {
        /// Who cancelled it and why.
        detail: String,
    },
    /// A test journal simulated a process death at this length.
    #[error("simulated crash: the journal holds {length} events")]
    Crashed {
        /// Events durable when the "process" died.
        length: usize,
    },
}

/// The durable journal of one agent run.
pub trait AgentJournal: Send + Sync {
    /// Appends a batch atomically.
    fn append(&self, events: Vec<AgentEvent>) -> BoxFuture<'_, Result<(), JournalError>>;
    /// Every event appended so far, in order.
    fn load(&self) -> BoxFuture<'_, Result<Vec<AgentEvent>, JournalError>>;
}

/// What a new agent run records in its `RunStarted`: how to resume it (never a secret), and
/// the spine's limits for the intents its effect tools reserve. The run's workflow and
/// deadline are its `AgentRunStarted`'s; its owner is the journal's lessee.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRun {
    /// The run's input as stored.
    pub input: serde_json::Value,
    /// The spine's limits for the run's intents.
    pub limits: RunLimits,
    /// The versions the run runs under: release, policy and model as the host knows them.
    /// Its `prompt` is the journal's to set: the fingerprint of the run's instructions and
    /// request, from its `AgentRunStarted`.
    pub versions: RunVersions,
}

/// The journal of one run in the spine's event log, written under the run's lease.
///
/// Each fact is one `AgentRecorded` event on `run:<id>`, its payload the fact as this module
/// serialises it: opaque to the spine, which checks only its position. The journal folds a
/// batch onto the run's state before appending it, so an impossible fact is refused and
/// nothing is written; and it says, in the same commit, what the batch means for the spine
/// (the run's end, an approval window, a deadline moved by a wait for a human).
///
/// A new run is started by its first batch (with `start`, this process holding the lease
/// with token 1); an existing run must be loaded first, and claimed by `lessee` before
/// (`executor::claim_run`). Every batch presents the lease; the batch that stops the run gives
/// it back.
pub struct LogJournal {
    log: Arc<dyn EventLog>,
    run_id: RunId,
    cause: Cause,
    start: Option<NewRun>,
    lessee: Lessee,
    /// The run's facts so far, folded: what a batch is checked against.
    state: Mutex<AgentState>,
}

impl LogJournal {
    /// The journal of `run_id`. `start` is what `RunStarted` records if the run does not
    /// exist yet (`None` to only resume an existing run).
    pub fn new(log: Arc<dyn EventLog>, run_id: RunId, cause: Cause, start: Option<NewRun>, lessee: Lessee) -> Self {
        let cause = cause.for_run(&run_id);
        Self { log, run_id, cause, start, lessee, state: Mutex::new(AgentState::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AgentState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The spine's part of a new run whose first batch is `events`.
    fn run_start(&self, events: &[AgentEvent]) -> Option<AgentRunStart> {
        let start = self.start.as_ref()?;
        let Some(AgentEvent::AgentRunStarted { workflow, deadline, system, prompt, .. }) = events.first() else {
            return None;
        };
        Some(AgentRunStart {
            workflow: workflow.clone(),
            deadline_at: *deadline,
            input: start.input.clone(),
            limits: start.limits.clone(),
            versions: RunVersions { prompt: Some(prompt_version(system, prompt)), ..start.versions.clone() },
            owner: Some(self.lessee.owner().clone()),
        })
    }
}

/// `prompt.version`: the first 12 hex digits of the SHA-256 of the run's system instructions
/// and request (a NUL between them), so two runs share a version exactly when they were
/// asked the same thing.
pub fn prompt_version(system: &str, prompt: &str) -> String {
    let digest = engine::canonical::sha256_hex(format!("{system}\0{prompt}").as_bytes());
    digest[..12].to_owned()
}

/// What a batch of facts means for the spine: the run's end (with what it spent on models,
/// `folded` being the run's state after the batch — none when an answer had no price: an
/// unknown cost is never recorded as 0), an approval window opened, a deadline
/// moved by the time a human took.
fn spine_requests(events: &[AgentEvent], folded: &AgentState) -> Vec<SpineRequest> {
    events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::RunStopped { status, detail, .. } => Some(SpineRequest::Finish {
                status: status.run_status(),
                detail: detail.clone(),
                cost_minor: folded.model_cost().cost_minor,
            }),
            AgentEvent::ApprovalAwaited { intent_key, closes_at, .. } => {
                IntentKey::parse(intent_key).map(|key| SpineRequest::OpenApprovalWindow { key, closes_at: *closes_at })
            }
            AgentEvent::ApprovalWaitEnded { deadline, .. } => {
                Some(SpineRequest::ExtendDeadline { deadline_at: *deadline })
            }
            _ => None,
        })
        .collect()
}

fn unavailable(error: &LogError) -> JournalError {
    JournalError::Unavailable { detail: error.to_string() }
}

impl AgentJournal for LogJournal {
    fn append(&self, events: Vec<AgentEvent>) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async move {
            // Folded onto a copy first: an impossible fact is refused, nothing written.
            let (position, folded) = {
                let state = self.state();
                let mut next = state.clone();
                for event in &events {
                    next.try_apply(event).map_err(|detail| JournalError::Unavailable { detail })?;
                }
                (state.events(), next)
            };
            let stops = events.iter().any(|e| matches!(e, AgentEvent::RunStopped { .. }));
            let grant = self.lessee.grant(&self.run_id);
            let lease = match (&grant, stops) {
                (Some(grant), true) => LeaseUse::Release(grant.clone()),
                (Some(grant), false) => LeaseUse::Hold(grant.clone()),
                (None, _) => LeaseUse::None,
            };
            let entries = events
                .iter()
                .map(|event| serde_json::to_value(event).expect("an agent fact serializes: plain data"))
                .collect();
            let batch = AgentBatch {
                run_id: self.run_id.clone(),
                position,
                entries,
                start: self.run_start(&events),
                spine: spine_requests(&events, &folded),
            };
            // A lease given back leaves the book before the release is asked for, so a
            // renewal answered after it never mistakes it for a takeover.
            if grant.is_some() && stops {
                self.lessee.forget(&self.run_id);
            }
            let record = Ask::record_agent_entries(self.cause.clone(), batch).under(lease);
            match self.log.ask(record).await {
                Ok(()) => {}
                Err(LogError::Refused(Refusal::RunCancelled { by, reason, .. })) => {
                    return Err(JournalError::Cancelled { detail: format!("cancelled by operator {by}: {reason}") });
                }
                Err(error) => return Err(unavailable(&error)),
            }
            *self.state() = folded;
            // The first batch of a new run started it under this process's lease.
            if grant.is_none() && !stops && position == 0 && self.start.is_some() {
                self.lessee.hold(&LeaseGrant { run_id: self.run_id.clone(), token: 1 });
            }
            Ok(())
        })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<AgentEvent>, JournalError>> {
        let load = Ask::load_run(self.cause.clone(), self.run_id.clone());
        Box::pin(async move {
            let entries = match self.log.ask(load).await {
                Ok(history) => history.agent_entries,
                Err(LogError::Refused(Refusal::UnknownRun(_))) => Vec::new(),
                Err(error) => return Err(unavailable(&error)),
            };
            let mut events = Vec::with_capacity(entries.len());
            for (position, entry) in entries.into_iter().enumerate() {
                let event: AgentEvent = serde_json::from_value(entry).map_err(|e| JournalError::Unavailable {
                    detail: format!("agent fact {position} of run {} does not decode: {e}", self.run_id),
                })?;
                events.push(event);
            }
            *self.state() = AgentState::from_events(&events);
            Ok(events)
        })
    }
}

/// An in-memory journal. `crash_after(n)` makes it die like a killed process: the first
/// batch that would take it past `n` events is refused whole, and so is every later one.
#[derive(Debug, Default)]
pub struct MemoryJournal {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: Vec<AgentEvent>,
    crash_after: Option<usize>,
    crashed: bool,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// A journal holding `events` (what a restarted process finds).
    pub fn with_events(events: Vec<AgentEvent>) -> Self {
        Self { inner: Mutex::new(Inner { events, crash_after: None, crashed: false }) }
    }

    /// A journal that "crashes" once it would hold more than `length` events.
    pub fn crash_after(length: usize) -> Self {
        Self { inner: Mutex::new(Inner { events: Vec::new(), crash_after: Some(length), crashed: false }) }
    }

    /// A copy of the events durable so far.
    pub fn events(&self) -> Vec<AgentEvent> {
        self.lock().events.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // No code panics while holding this lock (it only pushes to a Vec), so it is never poisoned.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl AgentJournal for MemoryJournal {
    fn append(&self, events: Vec<AgentEvent>) -> BoxFuture<'_, Result<(), JournalError>> {
        let result = {
            let mut inner = self.lock();
            let over = inner.crash_after.is_some_and(|max| inner.events.len() + events.len() > max);
            if inner.crashed || over {
                inner.crashed = true;
                Err(JournalError::Crashed { length: inner.events.len() })
            } else {
                inner.events.extend(events);
                Ok(())
            }
        };
        Box::pin(async move { result })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<AgentEvent>, JournalError>> {
        let events = self.events();
        Box::pin(async move { Ok(events) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AgentStatus;
    use engine::clock::ManualClock;
    use engine::event::Event;
    use engine::ledger::{Action, Command, Reply};
    use engine::memory::MemoryLog;

    fn started(run_id: &str) -> AgentEvent {
        AgentEvent::AgentRunStarted {
            run_id: run_id.into(),
            workflow: "ticket-review".into(),
            started_at: chrono::DateTime::UNIX_EPOCH,
            deadline: chrono::DateTime::UNIX_EPOCH + chrono::Duration::seconds(120),
            limits: Default::default(),
            capabilities: Default::default(),
            tools: Vec::new(),
            system: String::new(),
            prompt: "p".into(),
            script: None,
        }
    }

    fn process(pid: u32) -> Lessee {
        Lessee::new(engine::lease::LeaseOwner { host: "h".into(), pid, started: 1, nonce: format!("n{pid}") })
    }

    fn journal_of(log: &Arc<MemoryLog>, start: bool, lessee: Lessee) -> LogJournal {
        let start = start.then(|| NewRun {
            input: serde_json::json!({}),
            limits: engine::event::RunLimits {
                cost_minor_max: None,
                attempts_per_intent_max: 1,
                reconciliations_per_intent_max: 1,
                approval_threshold_minor: None,
                policy: None,
                network_retries_max: None,
                reconciliations_max: None,
            },
            versions: RunVersions::this_release(),
        });
        LogJournal::new(Arc::clone(log) as Arc<dyn EventLog>, RunId::new("r1"), Cause::command("test"), start, lessee)
    }

    fn journal(log: &Arc<MemoryLog>, start: bool) -> LogJournal {
        journal_of(log, start, process(1))
    }

    struct DeadOwner(u32);

    impl engine::lease::OwnerProbe for DeadOwner {
        fn liveness(&self, owner: &engine::lease::LeaseOwner) -> engine::lease::Liveness {
            if owner.pid == self.0 { engine::lease::Liveness::Dead } else { engine::lease::Liveness::Alive }
        }
    }

    #[tokio::test]
    async fn a_process_whose_run_was_taken_over_is_fenced_and_the_new_holder_goes_on() {
        let clock = Arc::new(ManualClock::new(chrono::DateTime::UNIX_EPOCH));
        let log = Arc::new(MemoryLog::new(clock).with_probe(Arc::new(DeadOwner(1))));
        let first = journal_of(&log, true, process(1));
        first
            .append(vec![started("r1"), AgentEvent::ModelCallReserved { call: 1, hold: None }])
            .await
            .expect("appends");

        // Process 2 claims the run: the host proves process 1 dead.
        let second = process(2);
        let claim = Action::ClaimRun { run_id: RunId::new("r1"), owner: second.owner().clone() };
        let Ok(Reply::Claimed(grant)) = log.execute_now(&Command::new(Cause::command("resume"), claim)) else {
            panic!("a run whose holder is dead can be claimed");
        };
        assert_eq!(grant.token, 2);
        second.hold(&grant);

        // Process 1 was not dead after all: its next batch is refused, nothing written.
        let before = log.events().len();
        let stale = first.append(vec![AgentEvent::ModelCallFailed { call: 1, detail: "late".into() }]).await;
        assert!(
            matches!(stale, Err(JournalError::Unavailable { ref detail }) if detail.contains("fencing token 2")),
            "{stale:?}"
        );
        assert_eq!(log.events().len(), before, "a fenced writer writes nothing");

        let resumed = journal_of(&log, false, second);
        assert_eq!(resumed.load().await.expect("loads").len(), 2, "the new holder folds what was recorded");
        resumed
            .append(vec![AgentEvent::ModelCallFailed { call: 1, detail: "lost".into() }])
            .await
            .expect("the new holder writes");

        // A third process cannot take it from a live holder.
        let third = Action::ClaimRun { run_id: RunId::new("r1"), owner: process(3).owner().clone() };
        let held = log.execute_now(&Command::new(Cause::command("resume"), third));
        assert!(matches!(held, Err(LogError::Refused(Refusal::LeaseHeld { .. }))), "{held:?}");
    }

    fn answered(call: u32, cost_minor: Option<i64>) -> [AgentEvent; 2] {
        let response = crate::ModelResponse {
            id: None,
            model: "m".into(),
            content: vec![crate::ResponseBlock::Text { text: "ok".into() }],
            stop_reason: crate::StopReason::EndTurn,
            usage: crate::Usage { input_tokens: Some(10), output_tokens: Some(2) },
        };
        [
            AgentEvent::ModelCallReserved { call, hold: None },
            AgentEvent::ModelAnswerRecorded { call, response, cost_minor },
        ]
    }

    /// The `cost_minor` of the `RunFinished` a run whose answers cost `costs` records.
    async fn finished_cost(costs: &[Option<i64>]) -> Option<i64> {
        let log = Arc::new(MemoryLog::new(Arc::new(ManualClock::new(chrono::DateTime::UNIX_EPOCH))));
        let journal = journal(&log, true);
        let mut events = vec![started("r1")];
        for (call, cost) in (1..).zip(costs) {
            events.extend(answered(call, *cost));
        }
        events.push(AgentEvent::RunStopped {
            status: AgentStatus::Completed,
            subject: "run".into(),
            count: 0,
            detail: None,
            text: None,
        });
        journal.append(events).await.expect("appends");
        let finished = log.events().into_iter().find_map(|e| match e.event {
            Event::RunFinished { cost_minor, .. } => Some(cost_minor),
            _ => None,
        });
        finished.expect("the stop finished the run")
    }

    #[tokio::test]
    async fn a_run_records_its_exact_cost_and_none_once_an_answer_had_no_price() {
        assert_eq!(finished_cost(&[Some(30), Some(12)]).await, Some(42), "every answer priced: the exact sum");
        assert_eq!(finished_cost(&[Some(30), None]).await, None, "one answer without a price: unknown, not 30");
        assert_eq!(finished_cost(&[None]).await, None, "no price at all: unknown, not 0");
        assert_eq!(finished_cost(&[]).await, Some(0), "no answer: nothing spent");
    }

    #[tokio::test]
    async fn batches_are_checked_by_folding_and_a_stop_finishes_the_run() {
        let log = Arc::new(MemoryLog::new(Arc::new(ManualClock::new(chrono::DateTime::UNIX_EPOCH))));
        assert_eq!(journal(&log, false).load().await, Ok(Vec::new()), "an unknown run has no facts");
        let refused = journal(&log, false).append(vec![started("r1")]).await;
        assert!(refused.is_err(), "a new run needs its RunStarted input and limits");
        let journal = journal(&log, true);
        let impossible = journal.append(vec![AgentEvent::ModelCallReserved { call: 1, hold: None }]).await;
        assert!(impossible.is_err(), "a new run starts with AgentRunStarted");
        journal
            .append(vec![started("r1"), AgentEvent::ModelCallReserved { call: 1, hold: None }])
            .await
            .expect("appends");
        let out_of_order = journal.append(vec![AgentEvent::ModelCallReserved { call: 3, hold: None }]).await;
        assert!(out_of_order.is_err(), "an impossible fact is refused, nothing written");
        assert_eq!(journal.load().await.expect("loads").len(), 2);
        let stop = AgentEvent::RunStopped {
            status: AgentStatus::ModelBudget,
            subject: "model".into(),
            count: 1,
            detail: None,
            text: None,
        };
        journal.append(vec![stop]).await.expect("appends");
        let types: Vec<&str> = log.events().iter().map(|e| e.event.type_name()).collect();
        assert_eq!(types, ["RunStarted", "AgentRecorded", "AgentRecorded", "AgentRecorded", "RunFinished"]);
        let finished = log.events().into_iter().last().map(|e| e.event);
        assert!(matches!(finished, Some(Event::RunFinished { status: engine::event::RunStatus::ModelBudget, .. })));
        let late = journal.append(vec![AgentEvent::ModelCallReserved { call: 2, hold: None }]).await;
        assert!(late.is_err(), "nothing is appended to a finished run");
    }
}
