//! Decisions about runs: starting one, its journal (steps, timers), signals, an agent run's
//! entries and what they mean for the spine, and its end.

use super::Decider;
use crate::event::{Event, ReleaseReason, RunId, RunStatus, SignalName};
use crate::ledger::protocol::{AgentRunStart, Refusal, ReplyTarget, RunStart, SpineRequest};
use crate::ledger::state::{AGENT_WORKFLOW_PREFIX, IntentStatus, Run};
use crate::limits;
use chrono::{DateTime, Utc};
use serde_json::Value;

impl Decider<'_> {
    /// A run to start in the same commit as the command's own events.
    pub(super) fn start_run(&mut self, start: &RunStart) -> Result<(), Refusal> {
        if self.view.run(&start.run_id).is_some() {
            return Err(Refusal::RunExists(start.run_id.clone()));
        }
        self.push(Event::RunStarted {
            run_id: start.run_id.clone(),
            workflow: start.workflow.clone(),
            input: start.input.clone(),
            deadline_at: start.deadline_at,
            limits: start.limits.clone(),
            versions: start.versions.clone(),
        });
        if let Some(owner) = &start.owner {
            self.hold_new_run(&start.run_id, owner);
        }
        Ok(())
    }

    /// The run `run_id` as a decision about it sees it: already in the view, or started by
    /// this very command. A finished run takes nothing more.
    pub(super) fn open_run(&self, run_id: &RunId, start: Option<&RunStart>) -> Result<OpenRun, Refusal> {
        match (self.view.run(run_id), start) {
            (Some(run), _) if run.status.is_some() => Err(Refusal::RunFinished(run_id.clone())),
            (Some(run), _) => {
                Ok(OpenRun { deadline_at: run.deadline_at, limits: run.limits.clone(), journal_len: run.journal_len })
            }
            (None, Some(start)) if &start.run_id == run_id => {
                Ok(OpenRun { deadline_at: start.deadline_at, limits: start.limits.clone(), journal_len: 0 })
            }
            (None, _) => Err(Refusal::UnknownRun(run_id.clone())),
        }
    }

    /// [`Self::open_run`] for a write that moves the run forward (a reservation, an attempt, a
    /// journal step): refused once an operator asked the run to stop.
    pub(super) fn working_run(&self, run_id: &RunId, start: Option<&RunStart>) -> Result<OpenRun, Refusal> {
        self.refuse_cancelled(run_id)?;
        self.open_run(run_id, start)
    }

    /// Refuses a write for a run an operator asked to stop (its end is still accepted).
    pub(super) fn refuse_cancelled(&self, run_id: &RunId) -> Result<(), Refusal> {
        match self.view.run(run_id).and_then(|run| run.cancel_requested.filter(|_| run.status.is_none())) {
            Some(request) => {
                Err(Refusal::RunCancelled { run_id: run_id.clone(), by: request.by, reason: request.reason })
            }
            None => Ok(()),
        }
    }

    /// An operator's request that a run stop. Idempotent: a run already asked keeps the first
    /// request.
    pub(super) fn cancel_run(&mut self, run_id: &RunId, by: &str, reason: &str) -> Result<ReplyTarget, Refusal> {
        let run = self.view.run(run_id).ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
        if let Some(status) = run.status {
            return Err(Refusal::RunAlreadyFinished { run_id: run_id.clone(), status });
        }
        if run.cancel_requested.is_none() {
            self.push(Event::RunCancelRequested {
                run_id: run_id.clone(),
                by: by.to_owned(),
                reason: reason.to_owned(),
            });
        }
        Ok(ReplyTarget::Run(run_id.clone()))
    }

    /// Refuses a journal write anywhere but the run's next free position.
    pub(super) fn check_position(&self, run_id: &RunId, run: &OpenRun, position: u32) -> Result<(), Refusal> {
        if position != run.journal_len {
            return Err(Refusal::JournalPosition { run_id: run_id.clone(), asked: position, next: run.journal_len });
        }
        Ok(())
    }

    pub(super) fn record_step(
        &mut self,
        start: Option<&RunStart>,
        run_id: &RunId,
        position: u32,
        name: &str,
        output: &Value,
    ) -> Result<ReplyTarget, Refusal> {
        let run = self.working_run(run_id, start)?;
        self.check_position(run_id, &run, position)?;
        self.push(Event::StepRecorded {
            run_id: run_id.clone(),
            position,
            name: name.to_owned(),
            output: output.clone(),
        });
        Ok(ReplyTarget::Run(run_id.clone()))
    }

    pub(super) fn start_timer(
        &mut self,
        start: Option<&RunStart>,
        run_id: &RunId,
        position: u32,
        fire_at: DateTime<Utc>,
    ) -> Result<ReplyTarget, Refusal> {
        let run = self.working_run(run_id, start)?;
        self.check_position(run_id, &run, position)?;
        self.push(Event::TimerStarted { run_id: run_id.clone(), position, fire_at });
        Ok(ReplyTarget::Run(run_id.clone()))
    }

    pub(super) fn deliver_signal(
        &mut self,
        run_id: &RunId,
        name: &SignalName,
        payload: &Value,
    ) -> Result<ReplyTarget, Refusal> {
        let run = self.open_run(run_id, None)?;
        if self.view.run(run_id).is_some_and(|run| run.is_agent()) {
            return Err(Refusal::SignalToAgentRun(run_id.clone()));
        }
        if self.now >= run.deadline_at {
            return Err(Refusal::SignalPastDeadline { run_id: run_id.clone(), deadline_at: run.deadline_at });
        }
        let bytes = crate::canonical::to_string(payload).len();
        if bytes > limits::SIGNAL_PAYLOAD_MAX_BYTES {
            return Err(Refusal::SignalTooLarge {
                run_id: run_id.clone(),
                bytes,
                max: limits::SIGNAL_PAYLOAD_MAX_BYTES,
            });
        }
        self.push(Event::SignalDelivered {
            run_id: run_id.clone(),
            name: name.as_str().to_owned(),
            payload: payload.clone(),
        });
        Ok(ReplyTarget::Run(run_id.clone()))
    }

    pub(super) fn finish_run(
        &mut self,
        run_id: &RunId,
        status: RunStatus,
        detail: Option<String>,
    ) -> Result<ReplyTarget, Refusal> {
        self.open_run(run_id, None)?;
        self.push(Event::RunFinished { run_id: run_id.clone(), status, detail, cost_minor: None });
        Ok(ReplyTarget::Run(run_id.clone()))
    }

    /// An agent batch: its entries at the run's next agent position (the spine checks where
    /// they go, the harness what they say), then what the batch asks of the spine.
    pub(super) fn record_agent_entries(
        &mut self,
        run_id: &RunId,
        position: u32,
        entries: &[Value],
        start: Option<&AgentRunStart>,
        spine: &[SpineRequest],
    ) -> Result<ReplyTarget, Refusal> {
        if entries.is_empty() {
            return Err(Refusal::AgentBatch { run_id: run_id.clone(), why: "an empty agent batch" });
        }
        let run = match self.view.run(run_id) {
            Some(run) if run.status.is_some() => return Err(Refusal::RunFinished(run_id.clone())),
            Some(run) if !run.is_agent() => {
                return Err(Refusal::AgentBatch { run_id: run_id.clone(), why: "is not an agent run" });
            }
            Some(run) => Some(run),
            None => {
                let start = start.ok_or_else(|| Refusal::UnknownRun(run_id.clone()))?;
                self.start_agent_run(run_id, start)?;
                None
            }
        };
        // A run an operator asked to stop takes only the batch that stops it.
        if !spine.iter().any(|request| matches!(request, SpineRequest::Finish { .. })) {
            self.refuse_cancelled(run_id)?;
        }
        let next = run.as_ref().map_or(0, |run| run.agent_entries);
        if position != next {
            return Err(Refusal::AgentPosition { run_id: run_id.clone(), asked: position, next });
        }
        for entry in entries {
            self.push(Event::AgentRecorded { run_id: run_id.clone(), event: entry.clone() });
        }
        for request in spine {
            self.spine_request(run_id, run.as_ref(), request);
        }
        Ok(ReplyTarget::Done)
    }

    fn start_agent_run(&mut self, run_id: &RunId, start: &AgentRunStart) -> Result<(), Refusal> {
        let run_start = RunStart {
            run_id: run_id.clone(),
            workflow: format!("{AGENT_WORKFLOW_PREFIX}{}", start.workflow),
            input: start.input.clone(),
            deadline_at: start.deadline_at,
            limits: start.limits.clone(),
            versions: start.versions.clone(),
            owner: start.owner.clone(),
        };
        self.start_run(&run_start)
    }

    /// What an agent batch means for the spine, recorded in the same commit.
    fn spine_request(&mut self, run_id: &RunId, run: Option<&Run>, request: &SpineRequest) {
        match request {
            SpineRequest::Finish { status, detail, cost_minor } => {
                self.push(Event::RunFinished {
                    run_id: run_id.clone(),
                    status: *status,
                    detail: detail.clone(),
                    cost_minor: *cost_minor,
                });
                // Nothing will send what the run reserved and never sent: release it.
                for intent in self.view.run_intents(run_id) {
                    if matches!(intent.status, IntentStatus::Reserved | IntentStatus::AwaitingApproval) {
                        let reason = ReleaseReason::RunEnded { status: *status };
                        self.push(Event::IntentReleased { key: intent.key().clone(), reason });
                    }
                }
            }
            SpineRequest::OpenApprovalWindow { key, closes_at } => {
                if self.view.intent(key).is_some_and(|i| i.status == IntentStatus::AwaitingApproval) {
                    self.push(Event::ApprovalRequested { key: key.clone(), closes_at: *closes_at });
                }
            }
            SpineRequest::ExtendDeadline { deadline_at } => {
                if run.is_some_and(|run| *deadline_at > run.deadline_at) {
                    self.push(Event::RunDeadlineExtended { run_id: run_id.clone(), deadline_at: *deadline_at });
                }
            }
        }
    }
}

/// An open run as a decision sees it (existing, or started by the same command).
pub(super) struct OpenRun {
    pub(super) deadline_at: DateTime<Utc>,
    pub(super) limits: crate::event::RunLimits,
    pub(super) journal_len: u32,
}
