//! Folding events into the entities they are about: the one fold both the whole-log
//! [`super::Ledger`] and the store's per-entity projections run.
//!
//! Owns [`Entities`] (where the fold finds and keeps the intents and runs an event
//! touches), [`apply`] (one event into them), [`history`] (a run's own stream into its
//! [`RunHistory`]) and [`FoldError`]. An event concerns the entity of its stream, and — for
//! a network retry — the run that made it; nothing here reads the rest of the log.
//!
//! # Failure
//!
//! An impossible transition is an [`FoldError`] naming the event's sequence and stream:
//! callers that write (the store's writer) treat it as a bug and stop; `verify` reports it.

use super::state::{Approval, CancelRequest, Intent, IntentStatus, JournalEntry, Run, RunHistory};
use crate::event::{AfterLookup, Event, IntentKey, LateVerdict, ResolutionCheck, RunId, Source, StoredEvent, StreamId};
use crate::provider::Evidence;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::BTreeMap;

/// An event the fold cannot apply: the log is corrupt, or the code that wrote it is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("impossible transition at seq {seq} on stream {stream}: {what}")]
pub struct FoldError {
    /// The event's global sequence.
    pub seq: u64,
    /// Its stream.
    pub stream: StreamId,
    /// What is impossible.
    pub what: &'static str,
}

/// Where [`apply`] finds and keeps the entities an event concerns: the whole-log ledger's
/// maps, or the store's rows (loaded on demand, written back after the command).
pub trait Entities {
    /// The intent with `key`, to change it.
    fn intent_mut(&mut self, key: &IntentKey) -> Option<&mut Intent>;
    /// Whether an intent with `key` exists.
    fn has_intent(&mut self, key: &IntentKey) -> bool;
    /// Keeps a new intent.
    fn insert_intent(&mut self, intent: Intent);
    /// The run `run_id`, to change it.
    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut Run>;
    /// Keeps a new run.
    fn insert_run(&mut self, run: Run);
}

/// Folds one stored event into the entities it concerns.
///
/// # Errors
///
/// [`FoldError`] on an impossible transition; the entities may then be half-updated and
/// must not be used.
pub fn apply(entities: &mut dyn Entities, stored: &StoredEvent) -> Result<(), FoldError> {
    let fail = |what: &'static str| FoldError { seq: stored.seq, stream: stored.stream.clone(), what };
    let (seq, at) = (stored.seq, stored.at);
    match &stored.event {
        Event::RunStarted { run_id, workflow, deadline_at, limits, versions, .. } => {
            if entities.run_mut(run_id).is_some() {
                return Err(fail("run started twice"));
            }
            entities.insert_run(Run::started(
                run_id.clone(),
                workflow.clone(),
                at,
                *deadline_at,
                limits.clone(),
                versions.clone(),
                seq,
            ));
        }
        Event::IntentReserved {
            intent,
            run_id,
            capability,
            attempts_max,
            reconciliations_max,
            approval_required,
            ..
        } => {
            if entities.has_intent(&intent.key) {
                return Err(fail("intent reserved twice"));
            }
            if entities.run_mut(run_id).is_none() {
                return Err(fail("intent reserved by an unknown run"));
            }
            entities.insert_intent(Intent {
                definition: intent.clone(),
                run_id: run_id.clone(),
                capability: *capability,
                status: if *approval_required { IntentStatus::AwaitingApproval } else { IntentStatus::Reserved },
                attempts: 0,
                attempts_max: *attempts_max,
                reconciliations: 0,
                reconciliations_max: *reconciliations_max,
                first_sent_at: None,
                last_sent_at: None,
                reconcile_after: None,
                unknown_reason: None,
                source: None,
                evidence: None,
                decline_code: None,
                approval_required: *approval_required,
                approval: None,
                absence_proven: false,
                note: None,
                released: None,
                duplicates_suppressed: 0,
                resends_refused: 0,
                not_sent: 0,
                latest_not_sent: false,
                latest_attempt_run: None,
                in_flight_run: None,
                late_answers: 0,
                approval_closes_at: None,
                abandoned: false,
                operator_word: false,
                last_seq: seq,
            });
        }
        // A conversation's facts are no intent's and no run's: `facts::fold` reads them.
        Event::FactsAdmitted { .. } | Event::FactsForgotten { .. } => {}
        event => match (event.intent_key(), event.subject()) {
            (Some(key), _) => {
                let intent = entities.intent_mut(key).ok_or_else(|| fail("event on an unknown intent"))?;
                let retrying = match event {
                    Event::AttemptStarted { run_id, .. } if intent.network_retry_by(run_id) => Some(run_id.clone()),
                    _ => None,
                };
                apply_to_intent(intent, event, at).map_err(fail)?;
                intent.last_seq = seq;
                if let Some(run_id) = retrying {
                    let run = entities.run_mut(&run_id).ok_or_else(|| fail("a retry by an unknown run"))?;
                    run.network_retries += 1;
                }
            }
            (None, Some(run_id)) => {
                let run = entities.run_mut(run_id).ok_or_else(|| fail("event on an unknown run"))?;
                apply_to_run(run, event, at).map_err(fail)?;
                run.last_seq = seq;
            }
            (None, None) => return Err(fail("an event about neither an intent nor a run")),
        },
    }
    Ok(())
}

/// Folds one run event (other than its start).
fn apply_to_run(run: &mut Run, event: &Event, at: DateTime<Utc>) -> Result<(), &'static str> {
    match event {
        Event::RunDeadlineExtended { deadline_at, .. } => {
            if *deadline_at < run.deadline_at {
                return Err("a deadline moved back");
            }
            run.deadline_at = *deadline_at;
        }
        Event::StepRecorded { position, .. } => {
            if *position != run.journal_len {
                return Err("journal position out of order");
            }
            run.journal_len += 1;
            // The run went past its timer (or never had one).
            run.wake_at = None;
        }
        Event::TimerStarted { position, fire_at, .. } => {
            if *position != run.journal_len {
                return Err("journal position out of order");
            }
            run.journal_len += 1;
            run.wake_at = Some(*fire_at);
        }
        Event::SignalDelivered { .. } => {}
        Event::AgentRecorded { .. } => {
            if run.status.is_some() {
                return Err("agent fact on a finished run");
            }
            run.agent_entries += 1;
        }
        Event::RunCancelRequested { by, reason, .. } => {
            if run.status.is_some() {
                return Err("a cancellation of a finished run");
            }
            run.cancel_requested = Some(CancelRequest { by: by.clone(), reason: reason.clone(), at });
        }
        Event::RunFinished { status, detail, cost_minor, .. } => {
            if run.status.is_some() {
                return Err("run finished twice");
            }
            run.status = Some(*status);
            run.detail = detail.clone();
            run.wake_at = None;
            run.cost_minor = *cost_minor;
        }
        _ => return Err("not a run event"),
    }
    Ok(())
}

/// Folds a run's own stream, in stream order, into what replaying it needs.
///
/// # Errors
///
/// [`FoldError`] when the stream does not start with its `RunStarted` or holds an
/// impossible transition.
pub fn history(stream: &[StoredEvent]) -> Result<RunHistory, FoldError> {
    let Some(first) = stream.first() else {
        return Err(FoldError { seq: 0, stream: StreamId::from_stored(String::new()), what: "an empty run stream" });
    };
    let Event::RunStarted { input, .. } = &first.event else {
        return Err(FoldError { seq: first.seq, stream: first.stream.clone(), what: "a run stream not started" });
    };
    let mut one = OneRun(None);
    let mut journal = Vec::new();
    let mut signals: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut agent_entries = Vec::new();
    for stored in stream {
        apply(&mut one, stored)?;
        match &stored.event {
            Event::StepRecorded { position, name, output, .. } => {
                journal.push(JournalEntry { position: *position, name: name.clone(), output: output.clone() });
            }
            Event::TimerStarted { position, fire_at, .. } => journal.push(JournalEntry {
                position: *position,
                name: "timer".to_owned(),
                output: Value::String(fire_at.to_rfc3339()),
            }),
            Event::SignalDelivered { name, payload, .. } => {
                signals.entry(name.clone()).or_default().push(payload.clone())
            }
            Event::AgentRecorded { event, .. } => agent_entries.push(event.clone()),
            _ => {}
        }
    }
    let run =
        one.0.ok_or(FoldError { seq: first.seq, stream: first.stream.clone(), what: "a run stream not started" })?;
    Ok(RunHistory { run, input: input.clone(), journal, signals, agent_entries })
}

/// Folds an intent's own stream, in stream order, into its state: what `keel show` needs
/// without reading anything else (the run side of a network retry is not this fold's).
///
/// # Errors
///
/// [`FoldError`] when the stream does not start with its `IntentReserved` or holds an
/// impossible transition.
pub fn intent(stream: &[StoredEvent]) -> Result<Intent, FoldError> {
    intent_alone(stream).map(|(intent, _)| intent)
}

/// One intent's own stream folded alone, like [`intent`], with the network retries it counts
/// against each run that made one ([`Run::network_retries`] is the sum of those over every
/// intent stream): what a store's `verify` needs to rebuild a run's row stream by stream.
///
/// # Errors
///
/// As [`intent`].
pub fn intent_alone(stream: &[StoredEvent]) -> Result<(Intent, BTreeMap<RunId, u32>), FoldError> {
    let Some(first) = stream.first() else {
        return Err(FoldError { seq: 0, stream: StreamId::from_stored(String::new()), what: "an empty intent stream" });
    };
    let mut one = OneIntent { intent: None, runs: BTreeMap::new(), at: first.at };
    for stored in stream {
        apply(&mut one, stored)?;
    }
    let intent = one.intent.ok_or(FoldError {
        seq: first.seq,
        stream: first.stream.clone(),
        what: "an intent stream not reserved",
    })?;
    let retries = one
        .runs
        .into_iter()
        .filter(|(_, run)| run.network_retries > 0)
        .map(|(run_id, run)| (run_id, run.network_retries))
        .collect();
    Ok((intent, retries))
}

/// The entities of one intent's own stream, with a stand-in for every run it names (the runs
/// are on their own streams; the fold only needs them to exist, and counts retries on them).
struct OneIntent {
    intent: Option<Intent>,
    runs: BTreeMap<RunId, Run>,
    /// The stream's first instant, the stand-ins' start.
    at: DateTime<Utc>,
}

impl Entities for OneIntent {
    fn intent_mut(&mut self, _key: &IntentKey) -> Option<&mut Intent> {
        self.intent.as_mut()
    }
    fn has_intent(&mut self, _key: &IntentKey) -> bool {
        self.intent.is_some()
    }
    fn insert_intent(&mut self, intent: Intent) {
        self.intent = Some(intent);
    }
    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut Run> {
        let at = self.at;
        Some(self.runs.entry(run_id.clone()).or_insert_with(|| Run::stand_in(run_id, at)))
    }
    fn insert_run(&mut self, run: Run) {
        self.runs.insert(run.run_id.clone(), run);
    }
}

/// The entities of one run's own stream: the run alone (its intents are on their streams).
struct OneRun(Option<Run>);

impl Entities for OneRun {
    fn intent_mut(&mut self, _key: &IntentKey) -> Option<&mut Intent> {
        None
    }
    fn has_intent(&mut self, _key: &IntentKey) -> bool {
        false
    }
    fn insert_intent(&mut self, _intent: Intent) {}
    fn run_mut(&mut self, _run_id: &RunId) -> Option<&mut Run> {
        self.0.as_mut()
    }
    fn insert_run(&mut self, run: Run) {
        self.0 = Some(run);
    }
}

/// Folds one intent event (other than its reservation). `Err` names the impossible
/// transition.
fn apply_to_intent(intent: &mut Intent, event: &Event, at: DateTime<Utc>) -> Result<(), &'static str> {
    use IntentStatus as S;
    match event {
        Event::IntentDeduplicated { .. } => {
            intent.duplicates_suppressed += 1;
        }
        Event::ResendRefused { .. } => {
            if intent.status.refuses_resend() {
                intent.resends_refused += 1;
            } else {
                return Err("a resend refused while the intent could take one");
            }
        }
        Event::ApprovalGranted { fingerprint, by, expires_at, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("approval of an intent not awaiting one");
            }
            intent.approval =
                Some(Approval { fingerprint: fingerprint.clone(), by: by.clone(), expires_at: *expires_at });
            intent.status = S::Reserved;
        }
        Event::ApprovalExpired { .. } => {
            intent.approval = None;
            intent.status = S::AwaitingApproval;
        }
        Event::ApprovalDenied { by, reason, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("denial of an intent not awaiting approval");
            }
            intent.status = S::Rejected;
            intent.note = Some(format!("denied by {by}: {reason}"));
        }
        Event::AttemptStarted { attempt, run_id, .. } => {
            if *attempt != intent.attempts + 1 {
                return Err("attempt numbers must follow each other");
            }
            if !matches!(intent.status, S::Reserved | S::OutcomeUnknown) {
                return Err("attempt started while not ready");
            }
            intent.attempts = *attempt;
            intent.status = S::Attempting;
            intent.latest_not_sent = false;
            intent.latest_attempt_run = Some(run_id.clone());
            intent.first_sent_at.get_or_insert(at);
            intent.last_sent_at = Some(at);
            intent.absence_proven = false;
            intent.reconcile_after = None;
            intent.in_flight_run = Some(run_id.clone());
        }
        Event::AttemptNotSent { .. } => {
            if intent.status != S::Attempting {
                return Err("not-sent outcome without an attempt in flight");
            }
            intent.status = S::Reserved;
            intent.absence_proven = true;
            intent.not_sent += 1;
            intent.latest_not_sent = true;
            intent.in_flight_run = None;
        }
        Event::IntentValidated { source, evidence, .. } => {
            intent.in_flight_run = None;
            intent.status = S::Validated;
            intent.source = Some(*source);
            intent.evidence = Some(evidence.clone());
            intent.reconcile_after = None;
            intent.unknown_reason = None;
        }
        Event::IntentDeclined { code, .. } => {
            // In flight, or a late answer settling an intent that was still open.
            if !matches!(intent.status, S::Attempting | S::OutcomeUnknown | S::Reconciling | S::Reserved | S::Escalated)
            {
                return Err("decline of an intent that is neither in flight nor open");
            }
            intent.in_flight_run = None;
            intent.status = S::Declined;
            intent.decline_code = Some(code.clone());
        }
        Event::OutcomeUnknown { reason, reconcile_after, .. } => {
            if intent.status != S::Attempting {
                return Err("unknown outcome without an attempt in flight");
            }
            intent.status = S::OutcomeUnknown;
            intent.unknown_reason = Some(*reason);
            intent.reconcile_after = *reconcile_after;
            intent.in_flight_run = None;
        }
        Event::ReconciliationStarted { reconciliation, run_id, .. } => {
            if !matches!(intent.status, S::OutcomeUnknown | S::Escalated) {
                return Err("reconciliation of an intent that is not unknown");
            }
            if *reconciliation != intent.reconciliations + 1 {
                return Err("reconciliation numbers must follow each other");
            }
            intent.reconciliations = *reconciliation;
            intent.status = S::Reconciling;
            intent.in_flight_run = Some(run_id.clone().unwrap_or_else(|| intent.run_id.clone()));
        }
        Event::ReconciliationResolved { after, .. } => {
            if intent.status != S::Reconciling {
                return Err("lookup answer without a reconciliation in flight");
            }
            intent.in_flight_run = None;
            match after {
                AfterLookup::Validated | AfterLookup::Escalated => intent.status = S::OutcomeUnknown,
                AfterLookup::ResendAllowed => {
                    intent.status = S::Reserved;
                    intent.absence_proven = true;
                    intent.reconcile_after = None;
                }
                AfterLookup::RetryAt { reconcile_after } => {
                    intent.status = S::OutcomeUnknown;
                    intent.reconcile_after = Some(*reconcile_after);
                }
            }
        }
        Event::IntentEscalated { reason, absence_proven, .. } => {
            intent.in_flight_run = None;
            intent.status = S::Escalated;
            intent.absence_proven = *absence_proven;
            intent.reconcile_after = None;
            intent.note = Some(reason.clone());
        }
        Event::IntentCancelled { by, reason, .. } => {
            if !matches!(intent.status, S::Reserved | S::AwaitingApproval) {
                return Err("cancel with an attempt in flight or unknown");
            }
            intent.status = S::Cancelled;
            intent.note = Some(format!("cancelled by {by}: {reason}"));
        }
        Event::IntentResolved { by, reason, landed, check, .. } => {
            if !matches!(intent.status, S::OutcomeUnknown | S::Escalated) {
                return Err("manual resolution of an intent that is not unknown or escalated");
            }
            match landed {
                Some(provider_ref) => {
                    intent.status = S::Validated;
                    intent.source = Some(Source::Reconciled);
                    intent.evidence = Some(Evidence {
                        provider_ref: provider_ref.clone(),
                        amount_minor: intent.definition.amount_minor,
                        currency: intent.definition.currency.clone(),
                    });
                    intent.note = Some(format!("resolved landed by {by}{}: {reason}", check.annotation()));
                    intent.operator_word = !matches!(check, ResolutionCheck::Confirmed);
                }
                None => {
                    intent.status = S::Cancelled;
                    intent.absence_proven = true;
                    intent.note = Some(format!("resolved absent by {by}{}: {reason}", check.annotation()));
                }
            }
            intent.reconcile_after = None;
        }
        Event::ApprovalRequested { closes_at, .. } => {
            if intent.status != S::AwaitingApproval {
                return Err("an approval window for an intent not awaiting approval");
            }
            intent.approval_closes_at = Some(*closes_at);
        }
        Event::IntentReleased { reason, .. } => {
            if !matches!(intent.status, S::Reserved | S::AwaitingApproval) {
                return Err("release of an intent that may have an effect in flight or unknown");
            }
            intent.status = S::Rejected;
            intent.note = Some(format!("released: {reason}"));
            intent.released = Some(reason.clone());
        }
        Event::IntentAbandoned { waiting_since, window_ms, never_sent, .. } => {
            if intent.status != S::Reserved {
                return Err("abandonment of an intent that is not ready for its next attempt");
            }
            intent.status = S::Rejected;
            intent.abandoned = true;
            let proof = if *never_sent { "never sent" } else { "proven absent" };
            intent.note = Some(format!(
                "abandoned: waited for its caller since {} ({window_ms} ms allowed); {proof}, so its money and \
                 order reference are freed",
                waiting_since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ));
        }
        Event::LateAnswerRecorded { verdict, .. } => {
            intent.late_answers += 1;
            if let LateVerdict::Contradicted { detail } = verdict {
                intent.note = Some(format!("a late provider answer contradicts the intent: {detail}"));
            }
        }
        Event::IntentReserved { .. }
        | Event::RunStarted { .. }
        | Event::RunDeadlineExtended { .. }
        | Event::StepRecorded { .. }
        | Event::TimerStarted { .. }
        | Event::SignalDelivered { .. }
        | Event::AgentRecorded { .. }
        | Event::FactsAdmitted { .. }
        | Event::FactsForgotten { .. }
        | Event::RunFinished { .. }
        | Event::RunCancelRequested { .. } => return Err("not an intent event"),
    }
    Ok(())
}
