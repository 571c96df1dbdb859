//! Keel's invariants, checked over an event log and the provider's own record of effects.
//!
//! Owns [`check`] (pure: events + effects in, [`Report`] out), [`check_files`] (the same over
//! a Keel database and a simulator database, plus `verify`) and [`Effect`], the provider's
//! side of the story. Every check reads only ground truth — stored events and the effects the
//! provider counted — never the executor's opinion of what happened.
//!
//! | # | invariant | how it is checked |
//! |---|---|---|
//! | 1 | at most one effect per intent key | effects grouped by idempotency key; an agent run's intents reserved by a tool are no more than the calls of it the guard admitted (a replayed call keeps its key) |
//! | 2 | the key is the intent key, always | each effect's key is `IntentKey::new(kind, tenant, intent_id)` and names a reserved intent |
//! | 3 | write-ahead | each key has at least as many committed `AttemptStarted` as effects |
//! | 4 | no blind resend | attempt n > 1 follows a proven absence (`AttemptNotSent`, lookup `resend_allowed`) or a key-deduplicating provider without lookup; one `OutcomeUnknown` per attempt |
//! | 5 | budgets never refilled | folding event by event, an intent's money is released only by a release fact (decline, release of an intent never sent, cancel, denial, proven-absent escalation, resolved absent), no run's remaining budget goes negative, and every other spent counter — attempts and reconciliations per intent, network retries and reconciliations per run — stays within its limit (a fold of the log cannot go down; a refilled count shows as spending past its limit), no attempt starts after its run's deadline (time), and an agent run's model calls, tool calls, input and output tokens, model cost and money its effect calls may move stay within the limits its journal's header recorded, its sub-agents' carves counted, each sub-agent within its carve, and no model or tool call of it is reserved after its deadline |
//! | 6 | replay is deterministic | two folds of the log render identically; `verify` (files) passes |
//! | 8 | refunds ≤ charged | after every event, per order: refunds reserved, unknown or validated ≤ validated charges; and the provider's refunds ≤ its charges |
//! | 9 | liveness | at the end no intent is left `attempting`, `outcome_unknown` or `reconciling` |
//!
//! Invariant 7 (a mismatch or a validation failure writes nothing) is a property of a call,
//! not of a log: the harness ([`crate::Kit`]) probes it.
//!
//! A validated intent must also carry evidence the provider confirms (its `provider_ref` is an
//! effect on that key), and a declined one must have no effect.

use engine::event::{AfterLookup, Event, IntentKey, StoredEvent};
use engine::ledger::{IntentStatus, Ledger};
use engine::provider::EffectKind;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Details kept per report: enough to debug, bounded for soak runs.
pub const DETAILS_MAX: usize = 50;

/// One effect as the provider recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Effect {
    /// The idempotency key the request carried.
    pub idempotency_key: String,
    /// Charge or refund.
    pub kind: EffectKind,
    /// Tenant from the request's metadata.
    pub tenant: String,
    /// Intent id from the request's metadata.
    pub intent_id: String,
    /// Order from the request's metadata.
    pub order_id: String,
    /// Amount moved.
    pub amount_minor: i64,
    /// The currency it moved in, upper case (totals are per currency).
    pub currency: String,
    /// The provider's id (the evidence a validated intent must carry).
    pub provider_ref: String,
}

impl From<engine::memory::MemoryEffect> for Effect {
    fn from(effect: engine::memory::MemoryEffect) -> Self {
        Self {
            idempotency_key: effect.idempotency_key,
            kind: effect.kind,
            tenant: effect.tenant,
            intent_id: effect.intent_id,
            order_id: effect.order_id,
            amount_minor: effect.amount_minor,
            currency: effect.currency,
            provider_ref: effect.provider_ref,
        }
    }
}

impl From<&provider_sim::EffectRecord> for Effect {
    fn from(record: &provider_sim::EffectRecord) -> Self {
        Self {
            idempotency_key: record.idempotency_key.clone(),
            kind: record.kind,
            tenant: record.tenant.clone(),
            intent_id: record.intent_id.clone(),
            order_id: record.order_id.clone(),
            amount_minor: record.amount_minor,
            currency: record.currency.to_ascii_uppercase(),
            provider_ref: record.id.clone(),
        }
    }
}

/// What the checks found. Every counter must be zero; `details` says where.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Events checked.
    pub events: u64,
    /// Intents in the log.
    pub intents: u64,
    /// Effects at the provider.
    pub effects: u64,
    /// 1: keys with more than one effect.
    pub double_effects: u64,
    /// 2: effects whose key is not the intent key of their own metadata, or names no intent.
    pub key_mismatches: u64,
    /// 3: effects without a committed `AttemptStarted` before them.
    pub write_ahead_violations: u64,
    /// 4: attempts sent again without a proven absence, or unknowns recorded twice.
    pub blind_resends: u64,
    /// 5: money released without a release fact, a run's budget below zero, a spent counter
    /// past its limit, an attempt after its run's deadline.
    pub budget_refills: u64,
    /// 6: two folds of the log that differ, or `verify` failures.
    pub verify_failures: u64,
    /// 8: orders whose refunds exceed their charges.
    pub refund_overdraws: u64,
    /// 9: intents left attempting, outcome_unknown or reconciling.
    pub unreconciled: u64,
    /// Validated without the provider's evidence, or declined with an effect.
    pub evidence_mismatches: u64,
    /// 7: a payload mismatch or an invalid input that wrote something (probed by the kit).
    pub mismatch_writes: u64,
    /// 1 for an agent: an agent run whose tool reserved more intents than the guard admitted
    /// calls of it — an effect call that took a new key when it was replayed.
    pub effect_calls_rekeyed: u64,
    /// 5 for a model: a recorded model answer asked of the transport again, or a reserved
    /// call sent twice (counted by the kit, [`crate::agents::check_requests`]).
    pub model_calls_repeated: u64,
    /// The first problems found, at most [`DETAILS_MAX`].
    pub details: Vec<String>,
}

impl Report {
    /// Whether every invariant held.
    pub fn is_ok(&self) -> bool {
        self.violations() == 0
    }

    /// The number of violations of any kind.
    pub fn violations(&self) -> u64 {
        self.double_effects
            + self.key_mismatches
            + self.write_ahead_violations
            + self.blind_resends
            + self.budget_refills
            + self.verify_failures
            + self.refund_overdraws
            + self.unreconciled
            + self.evidence_mismatches
            + self.mismatch_writes
            + self.model_calls_repeated
            + self.effect_calls_rekeyed
    }

    /// Adds a detail (kept only while fewer than [`DETAILS_MAX`]).
    pub fn note(&mut self, detail: String) {
        if self.details.len() < DETAILS_MAX {
            self.details.push(detail);
        }
    }
}

/// Renders a fold as canonical JSON: every intent and run, in key order.
pub fn render(ledger: &Ledger) -> serde_json::Value {
    use engine::ledger::View as _;
    let runs: Vec<serde_json::Value> = ledger
        .runs()
        .into_iter()
        .map(|run| {
            let history = ledger.history(&run.run_id);
            serde_json::json!({
                "run": run,
                "input": history.as_ref().map(|h| &h.input),
                "journal": history.as_ref().map(|h| &h.journal),
                "signals": history.as_ref().map(|h| &h.signals),
                "agent_entries": history.as_ref().map(|h| &h.agent_entries),
                "intents": ledger.run_intents(&run.run_id).iter().map(|i| i.key().clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "intents": ledger.intents(), "runs": runs })
}

/// Checks every invariant over `events` (the whole log of one chain, in order) and `effects`.
pub fn check(events: &[StoredEvent], effects: &[Effect]) -> Report {
    check_folding(events, effects, Ledger::new)
}

/// [`check`] over a log chained per stream (PostgreSQL's), `events` in sequence order.
pub fn check_per_stream(events: &[StoredEvent], effects: &[Effect]) -> Report {
    check_folding(events, effects, Ledger::per_stream)
}

/// [`check`], folding into ledgers made by `empty` (which says how the log is chained).
fn check_folding(events: &[StoredEvent], effects: &[Effect], empty: fn() -> Ledger) -> Report {
    let mut report = Report { events: events.len() as u64, effects: effects.len() as u64, ..Report::default() };

    // Fold event by event, checking what must hold at every prefix.
    let mut ledger = empty();
    let mut attempts_started: HashMap<IntentKey, u64> = HashMap::new();
    let mut resend_licensed: HashMap<IntentKey, bool> = HashMap::new();
    let mut unknowns: HashMap<(IntentKey, u32), u32> = HashMap::new();
    let mut agents: HashMap<engine::event::RunId, agent::AgentState> = HashMap::new();
    for stored in events {
        let key = stored.event.intent_key();
        let before = key.and_then(|k| ledger.intent(k)).cloned();
        if let (Event::AttemptStarted { key, attempt, .. }, Some(before)) = (&stored.event, &before) {
            *attempts_started.entry(key.clone()).or_default() += 1;
            let licensed = resend_licensed.insert(key.clone(), false).unwrap_or(false);
            let dedup_resend = before.capability.dedup_by_key
                && !before.capability.lookup
                && before.status == IntentStatus::OutcomeUnknown;
            if *attempt > 1 && !licensed && !dedup_resend {
                report.blind_resends += 1;
                report.note(format!("seq {}: attempt {attempt} of {key} without a proven absence", stored.seq));
            }
        }
        match &stored.event {
            Event::AttemptNotSent { key, .. } => {
                resend_licensed.insert(key.clone(), true);
            }
            Event::ReconciliationResolved { key, after: AfterLookup::ResendAllowed, .. } => {
                resend_licensed.insert(key.clone(), true);
            }
            Event::OutcomeUnknown { key, attempt, .. } => {
                let seen = unknowns.entry((key.clone(), *attempt)).or_default();
                *seen += 1;
                if *seen > 1 {
                    report.blind_resends += 1;
                    report.note(format!("seq {}: attempt {attempt} of {key} became unknown twice", stored.seq));
                }
            }
            _ => {}
        }
        ledger.apply(stored);
        within_budgets(&ledger, stored, &mut report);
        if let Event::AgentRecorded { run_id, event } = &stored.event {
            within_agent_budgets(agents.entry(run_id.clone()).or_default(), stored, event, &mut report);
        }
        let (Some(key), Some(before)) = (key, before) else { continue };
        let Some(after) = ledger.intent(key) else { continue };
        if before.money_committed() && !after.money_committed() && !releases(&stored.event) {
            report.budget_refills += 1;
            report.note(format!("seq {}: {key} released its money without a release fact", stored.seq));
        }
        if ledger.run_cost_remaining_minor(&after.run_id).is_some_and(|left| left < 0) {
            report.budget_refills += 1;
            report.note(format!("seq {}: run {} is over its budget", stored.seq, after.run_id));
        }
        let (tenant, order, currency) =
            (&after.definition.tenant, &after.definition.order_id, &after.definition.currency);
        let refunds = ledger.order_refunds_committed_minor(tenant, order, currency);
        let charged = ledger.order_charged_minor(tenant, order, currency);
        if refunds > charged {
            report.refund_overdraws += 1;
            report.note(format!(
                "seq {}: order {order} has {refunds} {currency} refunded of {charged} charged",
                stored.seq
            ));
        }
    }

    // 6: a second fold renders the same state.
    let mut again = empty();
    events.iter().for_each(|e| again.apply(e));
    if render(&again) != render(&ledger) {
        report.verify_failures += 1;
        report.note("two folds of the same log differ".to_owned());
    }

    same_key_on_replay(&ledger, &agents, &mut report);

    let intents = ledger.intents();
    report.intents = intents.len() as u64;
    let mut by_key: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    for effect in effects {
        by_key.entry(effect.idempotency_key.as_str()).or_default().push(effect);
    }
    for (key, found) in &by_key {
        if found.len() > 1 {
            report.double_effects += 1;
            report.note(format!("{key}: {} effects at the provider", found.len()));
        }
        for effect in found {
            let own = IntentKey::new(effect.kind, &effect.tenant, &effect.intent_id);
            let intent = IntentKey::parse(key).and_then(|k| ledger.intent(&k).map(|i| i.key().clone()));
            if own.as_str() != *key || intent.is_none() {
                report.key_mismatches += 1;
                report
                    .note(format!("effect {} carries key {key}, not a reserved intent's own key", effect.provider_ref));
            }
        }
        let started = IntentKey::parse(key).and_then(|k| attempts_started.get(&k).copied()).unwrap_or(0);
        if (found.len() as u64) > started {
            report.write_ahead_violations += 1;
            report.note(format!("{key}: {} effect(s) but {started} committed AttemptStarted", found.len()));
        }
    }
    // Per order and currency, in i128: a provider that moved absurd amounts must be reported,
    // not overflow the check.
    let mut per_order: HashMap<(&str, &str, &str), (i128, i128)> = HashMap::new();
    for effect in effects {
        let sums = per_order.entry((&effect.tenant, &effect.order_id, &effect.currency)).or_default();
        match effect.kind {
            EffectKind::Charge => sums.0 += i128::from(effect.amount_minor),
            EffectKind::Refund => sums.1 += i128::from(effect.amount_minor),
        }
    }
    for ((_, order, currency), (charged, refunded)) in per_order {
        if refunded > charged {
            report.refund_overdraws += 1;
            report.note(format!("order {order}: the provider refunded {refunded} {currency} of {charged} charged"));
        }
    }

    for intent in &intents {
        let key = intent.key().as_str();
        let found = by_key.get(key).map(Vec::as_slice).unwrap_or_default();
        match intent.status {
            IntentStatus::Attempting | IntentStatus::OutcomeUnknown | IntentStatus::Reconciling => {
                report.unreconciled += 1;
                report.note(format!("{key} left {}", intent.status.as_str()));
            }
            IntentStatus::Validated => {
                let resolved_by_hand = intent.note.as_deref().is_some_and(|n| n.starts_with("resolved landed"));
                let proven = intent
                    .evidence
                    .as_ref()
                    .is_some_and(|e| found.iter().any(|effect| effect.provider_ref == e.provider_ref));
                if !proven && !resolved_by_hand && !effects.is_empty() {
                    report.evidence_mismatches += 1;
                    report.note(format!("{key} validated without an effect at the provider"));
                }
            }
            IntentStatus::Declined if !found.is_empty() => {
                report.evidence_mismatches += 1;
                report.note(format!("{key} declined but the provider holds an effect"));
            }
            _ => {}
        }
    }
    report
}

/// Invariant 5 for every spent counter, not only money. The counters are folds of an
/// append-only log, so a restart cannot lower them; what a refill does — a process that
/// rebuilt a count from zero, or from anything but the log — is spend past a limit. So after
/// every event: attempts (those proven never sent aside) and reconciliations per intent,
/// network retries and reconciliations per run stay within their limits, and time: no attempt
/// starts after its run's deadline.
fn within_budgets(ledger: &Ledger, stored: &StoredEvent, report: &mut Report) {
    use engine::ledger::View as _;
    let Some(intent) = stored.event.intent_key().and_then(|key| ledger.intent(key)) else { return };
    let key = intent.key().as_str();
    let mut spend = |entity: &str, dimension: &str, spent: u32, max: u32| {
        if spent > max {
            report.budget_refills += 1;
            report.note(format!("seq {}: {entity} spent {spent} {dimension} of {max} allowed", stored.seq));
        }
    };
    spend(key, "attempts", intent.attempts_spent(), intent.attempts_max);
    spend(key, "reconciliations", intent.reconciliations, intent.reconciliations_max);
    let Some(run) = ledger.run(&intent.run_id) else { return };
    let run_id = run.run_id.as_str();
    let network_max = run.limits.network_retries_max.unwrap_or(engine::limits::NETWORK_RETRIES_PER_RUN_MAX);
    spend(run_id, "network retries", run.network_retries, network_max);
    if let Some(max) = run.limits.reconciliations_max {
        let spent = ledger.run_intents(&run.run_id).iter().fold(0u32, |sum, i| sum.saturating_add(i.reconciliations));
        spend(run_id, "run reconciliations", spent, max);
    }
    // The run that started the attempt (a re-submission's own run may resend another's intent).
    if let Event::AttemptStarted { attempt, .. } = &stored.event
        && let Some(starter) = intent.latest_attempt_run.as_ref().and_then(|id| ledger.run(id))
        && stored.at > starter.deadline_at
    {
        report.budget_refills += 1;
        report.note(format!(
            "seq {}: attempt {attempt} of {key} started at {} after its run's deadline {}",
            stored.seq, stored.at, starter.deadline_at
        ));
    }
}

/// Invariant 1 for an agent: a replayed effect call finds the intent its first try reserved,
/// so a run never holds more intents reserved by a tool than calls of it the guard admitted
/// (its sub-agents' included). One more is a call that took a new key on replay — an intent
/// id derived from a process, a clock or a counter instead of the run and the call — and
/// may have charged twice.
fn same_key_on_replay(ledger: &Ledger, agents: &HashMap<engine::event::RunId, agent::AgentState>, report: &mut Report) {
    use engine::ledger::View as _;
    for (run_id, state) in agents {
        let mut reserved: BTreeMap<String, u32> = BTreeMap::new();
        for intent in ledger.run_intents(run_id) {
            if let Some(tool) = intent.definition.tool {
                *reserved.entry(tool).or_default() += 1;
            }
        }
        for (tool, intents) in reserved {
            let admitted_by = |s: &agent::AgentState| s.tool_calls_by_tool.get(&tool).copied().unwrap_or(0);
            let admitted = state.delegations.values().fold(admitted_by(state), |sum, c| sum + admitted_by(c));
            if intents > admitted {
                report.effect_calls_rekeyed += 1;
                report.note(format!(
                    "agent run {run_id}: {tool} reserved {intents} intents in {admitted} admitted call(s): a replayed \
                     call took a new key"
                ));
            }
        }
    }
}

/// Invariant 5 for an agent run: folding its journal fact by fact, its model calls, tool
/// calls, input and output tokens and model cost stay within the limits its header recorded,
/// and no call is reserved after its deadline — a resumed run that started counting again
/// would pass them.
fn within_agent_budgets(
    state: &mut agent::AgentState,
    stored: &StoredEvent,
    fact: &serde_json::Value,
    report: &mut Report,
) {
    let seq = stored.seq;
    let fact = match serde_json::from_value::<agent::AgentEvent>(fact.clone()) {
        Ok(fact) => fact,
        Err(why) => {
            report.verify_failures += 1;
            report.note(format!("seq {seq}: an agent fact does not decode: {why}"));
            return;
        }
    };
    if let Err(why) = state.try_apply(&fact) {
        report.verify_failures += 1;
        report.note(format!("seq {seq}: an agent fact does not fold: {why}"));
        return;
    }
    let Some(header) = &state.header else { return };
    // Time: no model or tool call reserved after the run's deadline (as waits for a human
    // moved it) — a resumed run that restarted its clock would.
    let reserves =
        matches!(fact, agent::AgentEvent::ModelCallReserved { .. } | agent::AgentEvent::ToolCallReserved { .. });
    if reserves && stored.at > header.deadline {
        report.budget_refills += 1;
        report.note(format!(
            "seq {seq}: agent run {} reserved a call at {} after its deadline {}",
            header.run_id, stored.at, header.deadline
        ));
    }
    // The run's calls count what its sub-agents hold; each sub-agent keeps within its carve.
    let committed = (state.model_calls_committed(), state.tool_calls_committed());
    within_header(state, committed, seq, report);
    for child in state.delegations.values() {
        within_header(child, (child.model_calls, child.tool_calls), seq, report);
    }
}

/// One agent run's (or sub-agent's) calls, `(model, tool)`, tokens, model cost and the money
/// its effect calls may move against its header.
fn within_header(state: &agent::AgentState, (model_calls, tool_calls): (u32, u32), seq: u64, report: &mut Report) {
    let header = state.header();
    let limits = &header.limits;
    let over = [
        ("model calls", i128::from(model_calls), Some(i128::from(limits.model_calls_max))),
        ("tool calls", i128::from(tool_calls), Some(i128::from(limits.tool_calls_max))),
        ("input tokens", i128::from(state.input_tokens), limits.input_tokens_max.map(i128::from)),
        ("output tokens", i128::from(state.output_tokens), limits.output_tokens_max.map(i128::from)),
        ("minor units of model cost", i128::from(state.cost_minor), limits.cost_minor_max.map(i128::from)),
        ("minor units of money", i128::from(state.money_committed_minor()), limits.money_minor_max.map(i128::from)),
    ];
    for (dimension, spent, max) in over {
        if let Some(max) = max
            && spent > max
        {
            report.budget_refills += 1;
            report.note(format!("seq {seq}: agent run {} spent {spent} {dimension} of {max} allowed", header.run_id));
        }
    }
}

/// Whether an event is one that may release an intent's money.
fn releases(event: &Event) -> bool {
    matches!(
        event,
        Event::IntentDeclined { .. }
            | Event::IntentReleased { .. }
            | Event::IntentCancelled { .. }
            | Event::IntentAbandoned { .. }
            | Event::ApprovalDenied { .. }
            | Event::IntentEscalated { absence_proven: true, .. }
            | Event::IntentResolved { landed: None, .. }
    )
}

/// Why the files could not be checked at all.
#[derive(Debug)]
pub struct Unreadable(pub String);

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreadable {}

/// [`check`] over a Keel database and a provider simulator's database, plus `keel verify`
/// (hash chain, projections rebuilt by replay): each mismatch counts as a verify failure.
///
/// # Errors
///
/// When either file cannot be read.
pub fn check_files(keel_db: &Path, sim_db: &Path) -> Result<Report, Unreadable> {
    let reader = store::Reader::open(keel_db).map_err(|e| Unreadable(format!("{}: {e}", keel_db.display())))?;
    let events = reader.events_since(0).map_err(|e| Unreadable(e.to_string()))?;
    let effects: Vec<Effect> = if sim_db.exists() {
        provider_sim::list_effects(sim_db)
            .map_err(|e| Unreadable(format!("{}: {e}", sim_db.display())))?
            .iter()
            .map(Effect::from)
            .collect()
    } else {
        Vec::new()
    };
    let mut report = check(&events, &effects);
    let verify = reader.verify().map_err(|e| Unreadable(e.to_string()))?;
    if !verify.is_ok() {
        report.verify_failures += verify.mismatch_count.max(1);
        if let Some(first) = verify.first_mismatch() {
            report.note(format!("verify: {first}"));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use engine::clock::ManualClock;
    use engine::event::{Cause, RunId, RunLimits};
    use engine::executor::{Executor, RunRequest, Runtime};
    use engine::lease::{LeaseOwner, Lessee};
    use engine::memory::{MemoryLog, MemoryProvider};
    use std::sync::Arc;

    /// A real history: one charge, validated at its first attempt.
    fn charged() -> (Vec<StoredEvent>, Vec<Effect>) {
        let start = chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("a valid instant");
        let clock = Arc::new(ManualClock::new(start));
        let (log, provider) = (
            Arc::new(MemoryLog::new(clock.clone())),
            Arc::new(MemoryProvider::new(adapters::stripe::local_capability())),
        );
        let runtime = Runtime {
            log: log.clone(),
            provider: provider.clone(),
            clock,
            lessee: Lessee::new(LeaseOwner::named("t")),
        };
        let executor = Executor::new(runtime, workflows::builtin(None));
        let input = serde_json::json!({"tenant_id": crate::sample::TENANT, "intent_id": "order_1_charge",
            "order_id": "order_1", "amount_minor": 500, "currency": "EUR", "payment_method_token": crate::sample::CARD_TOKEN});
        let limits = RunLimits {
            cost_minor_max: None,
            attempts_per_intent_max: 3,
            reconciliations_per_intent_max: 3,
            network_retries_max: None,
            reconciliations_max: None,
            ..RunLimits::default()
        };
        let request = RunRequest { run_id: RunId::new("r1"), limits, deadline_ms: 60_000, cause: Cause::command("t") };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(executor.start("charge", &input, request)).expect("the charge runs");
        (log.events(), provider.effects().into_iter().map(Effect::from).collect())
    }

    /// A real agent run on the in-memory log: one answer, no tool, completed.
    fn an_agent_run() -> Vec<StoredEvent> {
        use agent::{AgentEnv, Cancellation, LogJournal, ManualTimer, NewRun, Registry, RunSpec};
        let start = chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("a valid instant");
        let clock = Arc::new(ManualClock::new(start));
        let log = Arc::new(MemoryLog::new(clock.clone()));
        let lessee = Lessee::new(LeaseOwner::named("t"));
        let new_run = NewRun {
            input: serde_json::json!({}),
            limits: crate::default_limits(),
            versions: engine::event::RunVersions::this_release(),
        };
        let journal = LogJournal::new(log.clone(), RunId::new("a1"), Cause::command("t"), Some(new_run), lessee);
        let answer = serde_json::json!([{"id": "m1", "type": "message", "role": "assistant", "model": "m",
            "stop_reason": "end_turn", "content": [{"type": "text", "text": "Done."}],
            "usage": {"input_tokens": 1, "output_tokens": 1}}]);
        let transcript = adapters::model::scripted::Transcript::parse(&answer.to_string()).expect("a transcript");
        let transport = adapters::model::scripted::ScriptedTransport::new(transcript);
        let (timer, cancel) = (ManualTimer::new(clock.clone()), Cancellation::new());
        let env = AgentEnv { journal: &journal, clock: &*clock, timer: &timer, cancel: &cancel, gate: None };
        let spec = RunSpec {
            run_id: "a1".into(),
            workflow: "w".into(),
            system: String::new(),
            prompt: "Say done.".into(),
            limits: agent::AgentLimits::default(),
            capabilities: Default::default(),
            policy_version: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let done = |_: &agent::AgentState| true;
        runtime.block_on(agent::run(env, &transport, &Registry::new(), &spec, &done)).expect("the run ends");
        log.events()
    }

    #[test]
    fn an_agent_call_reserved_after_its_deadline_is_a_refilled_time_budget() {
        let mut events = an_agent_run();
        assert!(check(&events, &[]).is_ok(), "{:?}", check(&events, &[]));
        let reserved = events.iter().find(|e| fact_type(&e.event) == Some("ModelCallReserved"));
        let at = reserved.expect("the run reserved its model call").at;
        // Hand-made: the header's deadline before the call — what a resumed run that
        // restarted its clock from a new start would write.
        for stored in &mut events {
            if fact_type(&stored.event) == Some("AgentRunStarted")
                && let Event::AgentRecorded { event, .. } = &mut stored.event
            {
                event["deadline"] = serde_json::json!(at - chrono::Duration::milliseconds(1));
            }
        }
        let report = check(&events, &[]);
        assert!(report.details.iter().any(|d| d.contains("after its deadline")), "{report:?}");
    }

    /// The type of an agent fact, when `event` holds one.
    fn fact_type(event: &Event) -> Option<&str> {
        let Event::AgentRecorded { event, .. } = event else { return None };
        event.get("type").and_then(serde_json::Value::as_str)
    }

    #[test]
    fn a_real_history_spends_within_every_budget() {
        let (events, effects) = charged();
        let report = check(&events, &effects);
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.effects, 1);
    }

    #[test]
    fn an_attempt_counter_refilled_past_its_limit_is_caught() {
        let (mut events, effects) = charged();
        // Hand-made: the intent is reserved with no attempt left, yet an attempt follows — what
        // a process that rebuilt its counter from zero after a restart would write.
        for stored in &mut events {
            if let Event::IntentReserved { attempts_max, .. } = &mut stored.event {
                *attempts_max = 0;
            }
        }
        let report = check(&events, &effects);
        assert!(report.budget_refills >= 1, "{report:?}");
        assert!(report.details.iter().any(|d| d.contains("1 attempts of 0 allowed")), "{report:?}");
    }

    #[test]
    fn an_attempt_after_the_deadline_is_a_refilled_time_budget() {
        let (mut events, effects) = charged();
        let started = events.iter().find(|e| matches!(e.event, Event::AttemptStarted { .. })).map(|e| e.at);
        let started = started.expect("the charge started an attempt");
        for stored in &mut events {
            if let Event::RunStarted { deadline_at, .. } = &mut stored.event {
                *deadline_at = started - chrono::Duration::milliseconds(1);
            }
        }
        let report = check(&events, &effects);
        assert!(report.budget_refills >= 1, "{report:?}");
        assert!(report.details.iter().any(|d| d.contains("after its run's deadline")), "{report:?}");
    }
}
