//! The operator commands: run an effect, list, show, reconcile, resume, operator decisions,
//! verify.
//!
//! Owns the translation between flags and engine commands, and each command's rendering
//! and exit code. It never touches SQL (the store does) nor decides a transition (the
//! ledger does).

use crate::output::{Failure, Outcome, Output, name_intent_keys, plural};
use crate::wiring::{Backend, Node, open_store};
use crate::{EffectArgs, LimitArgs, ProviderArgs, exit};
use engine::event::{AfterLookup, Cause, Event, IntentKey, OperatorText, RunId};
use engine::executor::{IntentOutcome, RunOutcome, RunRequest, WorkflowError};
use engine::ledger::{Intent, IntentStatus};
use engine::log::{Ask, Asking, IntentAnswer, LogError};
use engine::policy::{PolicyStamp, Rules};
use serde_json::{Map, Value, json};
use std::path::Path;

/// The request in `path` (`-`: stdin), read up to
/// `engine::limits::REQUEST_FILE_MAX_BYTES`.
///
/// # Errors
///
/// Which file could not be read, and why (too large, not UTF-8, the system's reason).
pub fn read_request(path: &str) -> Result<String, String> {
    let max = engine::limits::REQUEST_FILE_MAX_BYTES;
    let read = if path == "-" {
        engine::limits::read_text_at_most(std::io::stdin(), max)
    } else {
        std::fs::File::open(path).and_then(|file| engine::limits::read_text_at_most(file, max))
    };
    read.map_err(|e| if path == "-" { format!("cannot read stdin: {e}") } else { format!("cannot read {path}: {e}") })
}

/// Builds a workflow input from flags or `--input FILE|-`.
pub fn effect_input(args: &EffectArgs, payment_method_token: Option<&str>) -> Result<Value, String> {
    let mut input = match &args.input {
        Some(path) => {
            let text = read_request(path)?;
            // Strict: `{"amount_minor":100,"amount_minor":999999}` is refused, never read as its
            // last value.
            engine::canonical::parse_strict(&text).map_err(|e| format!("--input {path} is not strict JSON: {e}"))?
        }
        None => {
            let mut map = Map::new();
            let mut put = |name: &str, value: Option<Value>| {
                if let Some(value) = value {
                    map.insert(name.to_owned(), value);
                }
            };
            put("tenant_id", args.tenant.clone().map(Value::String));
            put("intent_id", args.intent_id.clone().map(Value::String));
            put("order_id", args.order.clone().map(Value::String));
            put("amount_minor", args.amount_minor.map(Value::from));
            put("currency", args.currency.clone().map(Value::String));
            Value::Object(map)
        }
    };
    if let (Some(token), Some(map)) = (payment_method_token, input.as_object_mut()) {
        map.entry("payment_method_token").or_insert_with(|| Value::String(token.to_owned()));
    }
    Ok(input)
}

/// An amount in its currency's major unit: `49.00 EUR`, `1500 XOF`.
pub fn money(amount_minor: i64, currency: &str) -> String {
    if currency == "XOF" {
        return format!("{amount_minor} {currency}");
    }
    let sign = if amount_minor < 0 { "-" } else { "" };
    let abs = amount_minor.unsigned_abs();
    format!("{sign}{}.{:02} {currency}", abs / 100, abs % 100)
}

/// A time as operators read it: `2026-01-31 12:00:00Z`.
pub fn when(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// An instant to the millisecond, for a timer's fire time (what a second would round).
fn instant(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Runs one charge or refund workflow and prints its outcome.
pub async fn run_effect<B: Backend>(
    node: &Node<B>,
    out: &Output,
    workflow: &str,
    input: &Value,
    limits: &LimitArgs,
    (rules, stamp): (&Rules, PolicyStamp),
) -> Outcome {
    let request = RunRequest {
        run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
        limits: crate::policy::run_limits(limits, rules, &stamp),
        deadline_ms: limits.deadline_ms,
        cause: Cause::command(workflow),
    };
    let outcome = node.executor.start(workflow, input, request).await;
    node.shutdown()?;
    let outcome = outcome?;
    out.emit(&run_document(&outcome, &stamp), || print_run(workflow, &outcome));
    Ok(if outcome.intent.as_ref().is_some_and(IntentOutcome::is_validated) { exit::OK } else { exit::CONTROLLED })
}

/// A charge's or refund's JSON document: the workflow's output with its run's id (when the
/// run was written) and status, and the policy it ran under — what `keel charge --json`
/// prints and `keel serve` answers.
pub fn run_document(outcome: &RunOutcome, stamp: &PolicyStamp) -> Value {
    let mut document = outcome.output.clone();
    if let Some(map) = document.as_object_mut() {
        // A proposal refused before anything was written has no run to name, and no
        // reserved intent whose limits it could show.
        if outcome.written {
            map.insert("run_id".to_owned(), json!(outcome.run_id));
        }
        if outcome.intent.as_ref().is_none_or(|intent| intent.attempts_max == 0) {
            for field in ["attempts", "attempts_max", "reconciliations", "reconciliations_max"] {
                map.remove(field);
            }
        }
        map.insert("run_status".to_owned(), json!(outcome.status));
        map.insert("recorded".to_owned(), json!(outcome.written));
        map.insert("policy".to_owned(), json!(stamp));
    }
    document
}

/// A run's outcome in one line (and its details): the intent it ended on, or why it was
/// refused before anything was written.
fn print_run(workflow: &str, outcome: &RunOutcome) {
    match (&outcome.intent, &outcome.rejection) {
        (Some(intent), _) => print_intent(workflow, intent),
        (None, Some(rejection)) => {
            outln!("{workflow} (no key) → rejected, code {}, nothing recorded", rejection.code.as_str());
            rejection.details.iter().for_each(|detail| outln!("  - {detail}"));
        }
        (None, None) => {
            outln!("{workflow} run {} → {}", outcome.run_id, outcome.status.as_str());
            if let Some(at) = outcome.wakes_at {
                outln!("  its timer fires at {}: `keel resume` continues it from then on", instant(at));
            }
        }
    }
}

fn print_intent(workflow: &str, outcome: &IntentOutcome) {
    let mut line = format!("{workflow} {} → {}", outcome.intent_key, outcome.status.as_str());
    if let Some(source) = outcome.source {
        line.push_str(&format!(", source {}", source.as_str()));
    }
    if let Some(code) = &outcome.code {
        line.push_str(&format!(", code {}", code.as_str()));
    }
    if let Some(provider_ref) = &outcome.provider_ref {
        line.push_str(&format!(", evidence {provider_ref}"));
    }
    if outcome.attempts_max > 0 {
        line.push_str(&format!(", {}", plural(outcome.attempts, "attempt")));
    }
    if let Some(at) = outcome.reconcile_after {
        line.push_str(&format!(", reconcile after {}", when(at)));
    }
    if let Some(unknown) = &outcome.unknown {
        line.push_str(&format!(", reason {}", unknown.reason.as_str()));
    }
    outln!("{line}");
    if let Some(unknown) = &outcome.unknown {
        outln!(
            "  {}",
            if unknown.retryable {
                "retryable: re-submit the same request (same key, same payload) to learn the outcome; Keel looks the \
                 effect up and never sends it twice"
            } else {
                "not retryable: escalated to an operator (`keel resolve`); a re-submission changes nothing"
            }
        );
    }
    outcome.details.iter().for_each(|detail| outln!("  - {detail}"));
}

fn print_outcome(outcome: &IntentOutcome) {
    print_intent(outcome.intent_key.as_str().split(':').next().unwrap_or("intent"), outcome);
}

/// An intent key typed by an operator.
pub fn parse_key(key: &str) -> Result<IntentKey, Failure> {
    IntentKey::parse(key).ok_or_else(|| {
        Failure::Usage(format!(
            "{key:?} is not an intent key (expected operation:tenant:intent_id, operation charge or refund)"
        ))
    })
}

/// An intent status typed by an operator; an unknown one is refused with the list.
pub fn parse_state(state: Option<&str>) -> Result<Option<IntentStatus>, Failure> {
    state
        .map(|name| {
            IntentStatus::parse(name).ok_or_else(|| {
                let known: Vec<&str> = engine::ledger::ALL_STATUSES.iter().map(|s| s.as_str()).collect();
                Failure::Usage(format!("unknown state {name:?} (known: {})", known.join(", ")))
            })
        })
        .transpose()
}

/// A reader on the log; with `--create`, a missing log is created first (empty).
pub fn reader(db: &Path, create: crate::CreateFlag) -> Result<store::Reader, Failure> {
    if create.create && !db.exists() {
        open_store(db, store::Durability::Full)?.shutdown()?;
    }
    store::Reader::open(db).map_err(|e| Failure::Internal(format!("cannot read the event log {}: {e}", db.display())))
}

/// `keel intents [--state S]`: each intent, and why it waits when it waits for its caller.
pub fn list_intents(reader: &store::Reader, out: &Output, state: Option<IntentStatus>) -> Outcome {
    let rows = reader.intents(state.map(|s| s.as_str()))?;
    let waiting = crate::stuck::waiting_rows(reader, &rows, engine::clock::Clock::now(&crate::wiring::SystemClock))?;
    print_intents(out, state, &rows, &waiting)
}

/// `keel intents [--state S]` on PostgreSQL (no vault there: a charge waiting for its payment
/// method waits for its caller), read a page at a time.
pub fn list_intents_postgres(
    reader: &mut store_postgres::PgReader,
    out: &Output,
    state: Option<IntentStatus>,
) -> Outcome {
    let now = engine::clock::Clock::now(&crate::wiring::SystemClock);
    let (mut rows, mut waiting) = (Vec::new(), Vec::new());
    reader.each_intent(state, &mut |intent| {
        waiting.push(crate::stuck::waiting_without_vault(&intent, now));
        rows.push(store::IntentRow::from_intent(&intent));
    })?;
    print_intents(out, state, &rows, &waiting)
}

/// An intent listing (a row an intent, and why it waits when it does): what `keel intents` prints
/// on either log.
fn print_intents(
    out: &Output,
    state: Option<IntentStatus>,
    rows: &[store::IntentRow],
    waiting: &[Option<crate::stuck::Waiting>],
) -> Outcome {
    let mut document = name_intent_keys(serde_json::to_value(rows)?);
    if let Value::Array(items) = &mut document {
        for (item, waits) in items.iter_mut().zip(waiting) {
            if let (Value::Object(map), Some(waits)) = (item, waits) {
                map.insert("waiting".to_owned(), serde_json::to_value(waits)?);
            }
        }
    }
    out.emit(&document, || {
        if rows.is_empty() {
            outln!("no intents{}", state.map(|s| format!(" in state {}", s.as_str())).unwrap_or_default());
            return;
        }
        let key_width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
        outln!(
            "{:<18} {:<key_width$} {:>14} {:>8} {:>15} {:<20} {}",
            "STATUS",
            "KEY",
            "AMOUNT",
            "ATTEMPTS",
            "RECONCILIATIONS",
            "LAST SENT",
            "RECONCILE AFTER"
        );
        for (row, waits) in rows.iter().zip(waiting) {
            let time = |t: &Option<String>| {
                t.as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map_or_else(|| "-".to_owned(), |t| when(t.to_utc()))
            };
            outln!(
                "{:<18} {:<key_width$} {:>14} {:>8} {:>15} {:<20} {}",
                row.status,
                row.key,
                money(row.amount_minor, &row.currency),
                format!("{}/{}", row.attempts, row.attempts_max),
                format!("{}/{}", row.reconciliations, row.reconciliations_max),
                time(&row.last_sent_at),
                time(&row.reconcile_after),
            );
            if let Some(crate::stuck::Waiting::Caller(reason) | crate::stuck::Waiting::Vault(reason)) = waits {
                outln!("  {reason}");
            }
        }
    });
    Ok(exit::OK)
}

/// What one event says, in a few words, for `keel show`'s history (and the console's).
pub fn describe(event: &Event) -> String {
    match event {
        Event::IntentReserved { intent, approval_required, .. } => format!(
            "{}{}",
            money(intent.amount_minor, &intent.currency),
            if *approval_required { ", approval required" } else { "" }
        ),
        Event::AttemptStarted { attempt, .. } => format!("attempt {attempt}"),
        Event::AttemptNotSent { attempt, detail, .. } => format!("attempt {attempt} never sent: {detail}"),
        Event::IntentValidated { source, evidence, .. } => format!(
            "{} by {}, {}",
            evidence.provider_ref,
            match source {
                engine::event::Source::Provider => "the provider",
                engine::event::Source::Reconciled => "reconciliation",
            },
            money(evidence.amount_minor, &evidence.currency)
        ),
        Event::IntentDeclined { code, .. } => format!("code {code}"),
        Event::OutcomeUnknown { reason, reconcile_after, .. } => format!(
            "{}{}",
            reason.as_str(),
            reconcile_after.map(|at| format!(", reconcile after {}", when(at))).unwrap_or_default()
        ),
        Event::ReconciliationStarted { reconciliation, .. } => format!("lookup {reconciliation}"),
        Event::ReconciliationResolved { reconciliation, status, evidence, detail, after, .. } => {
            let mut text = format!("lookup {reconciliation}: {}", status.as_str());
            if let Some(evidence) = evidence {
                text.push_str(&format!(
                    " {} ({})",
                    evidence.provider_ref,
                    money(evidence.amount_minor, &evidence.currency)
                ));
            }
            text.push_str(&match after {
                AfterLookup::Validated => " → validated".to_owned(),
                AfterLookup::ResendAllowed => " → resend allowed".to_owned(),
                AfterLookup::RetryAt { reconcile_after } => format!(" → look again after {}", when(*reconcile_after)),
                AfterLookup::Escalated => " → escalated".to_owned(),
            });
            if !detail.is_empty() {
                text.push_str(&format!(" ({detail})"));
            }
            text
        }
        Event::IntentEscalated { reason, .. } => reason.clone(),
        Event::ApprovalGranted { by, expires_at, .. } => format!("by {by}, valid until {}", when(*expires_at)),
        Event::ApprovalDenied { by, reason, .. } | Event::IntentCancelled { by, reason, .. } => {
            format!("by {by}: {reason}")
        }
        Event::IntentResolved { by, reason, landed, check, .. } => format!(
            "by {by}: {} ({reason}){}",
            landed.as_deref().map_or_else(|| "absent".to_owned(), |r| format!("landed {r}")),
            check.annotation()
        ),
        Event::ApprovalRequested { closes_at, .. } => format!("window closes {}", when(*closes_at)),
        Event::IntentReleased { reason, .. } => reason.to_string(),
        Event::IntentDeduplicated { run_id, .. } => format!("proposed again by run {run_id}"),
        Event::ResendRefused { run_id, .. } => {
            format!("proposed again by run {run_id}: no new attempt, the intent stands as it is")
        }
        _ => String::new(),
    }
}

/// `keel show KEY`.
pub fn show(reader: &store::Reader, out: &Output, key: &IntentKey) -> Outcome {
    print_intent_document(out, key, intent_document(reader, key)?)
}

/// `keel show KEY` on PostgreSQL (no vault there: a charge waiting for its payment method
/// waits for its caller).
pub fn show_postgres(reader: &mut store_postgres::PgReader, out: &Output, key: &IntentKey) -> Outcome {
    let Some(intent) = reader.intent(key)? else {
        return print_intent_document(out, key, None);
    };
    let events = reader.stream(&key.stream())?;
    let waiting = crate::stuck::waiting_without_vault(&intent, engine::clock::Clock::now(&crate::wiring::SystemClock));
    print_intent_document(out, key, Some(IntentDocument::new(key, intent, events, waiting)))
}

fn print_intent_document(out: &Output, key: &IntentKey, document: Option<IntentDocument>) -> Outcome {
    let Some(IntentDocument { intent, events, waiting, document }) = document else {
        return Err(Failure::NotFound(format!("no intent with key {key} in this log")));
    };
    out.emit(&document, || {
        outln!("{key}: {}", intent.status.as_str());
        outln!(
            "  {} {} for order {}, run {}, fingerprint {}",
            intent.definition.kind.as_str(),
            money(intent.definition.amount_minor, &intent.definition.currency),
            intent.definition.order_id,
            intent.run_id,
            intent.definition.fingerprint
        );
        outln!(
            "  attempts {}/{}, reconciliations {}/{}",
            intent.attempts,
            intent.attempts_max,
            intent.reconciliations,
            intent.reconciliations_max
        );
        if let Some(evidence) = &intent.evidence {
            outln!("  evidence {} ({})", evidence.provider_ref, money(evidence.amount_minor, &evidence.currency));
        }
        if let Some(note) = &intent.note {
            outln!("  note: {note}");
        }
        if let Some(crate::stuck::Waiting::Caller(reason) | crate::stuck::Waiting::Vault(reason)) = &waiting {
            outln!("  {reason}");
        }
        outln!("  history:");
        for e in &events {
            outln!(
                "    #{:<6} {} {:<24} {:<22} {}",
                e.seq,
                e.at.format("%H:%M:%S%.3f"),
                e.event.type_name(),
                e.cause.actor,
                describe(&e.event)
            );
        }
    });
    Ok(exit::OK)
}

/// One intent as `keel show` renders it.
pub struct IntentDocument {
    /// Its state.
    pub intent: Intent,
    /// Its stream, in order.
    pub events: Vec<engine::event::StoredEvent>,
    /// Why it waits, when it waits for its caller.
    pub waiting: Option<crate::stuck::Waiting>,
    /// What `keel show --json` prints (and `GET /v1/intents/{key}` answers).
    pub document: Value,
}

/// One intent's state, its events, why it waits and its JSON document; `None` when no intent
/// has the key.
///
/// # Errors
///
/// The log's, when it cannot be read.
pub fn intent_document(reader: &store::Reader, key: &IntentKey) -> anyhow::Result<Option<IntentDocument>> {
    let Some(intent) = reader.intent_state(key)? else {
        return Ok(None);
    };
    let events = reader.stream(&key.stream())?;
    let waiting = crate::stuck::waiting(reader, &intent, engine::clock::Clock::now(&crate::wiring::SystemClock))?;
    Ok(Some(IntentDocument::new(key, intent, events, waiting)))
}

impl IntentDocument {
    fn new(
        key: &IntentKey,
        intent: Intent,
        events: Vec<engine::event::StoredEvent>,
        waiting: Option<crate::stuck::Waiting>,
    ) -> Self {
        let history: Vec<Value> = events
            .iter()
            .map(|e| {
                json!({
                    "seq": e.seq,
                    "stream_seq": e.stream_seq,
                    "at": e.at,
                    "type": e.event.type_name(),
                    "cause": e.cause,
                    "payload": e.event.payload(),
                })
            })
            .collect();
        let document = json!({
            "intent_key": key.as_str(),
            "status": intent.status.as_str(),
            "source": intent.source,
            "code": intent.decline_code.as_deref().or(intent.abandoned.then(|| engine::ledger::RejectCode::Abandoned.as_str())),
            "attempts": intent.attempts,
            "reconciliations": intent.reconciliations,
            "waiting": waiting,
            "intent": intent,
            "events": history,
        });
        IntentDocument { intent, events, waiting, document: name_intent_keys(document) }
    }
}

/// What the other refunds of `intent`'s order already took: `(validated, held)` in minor
/// units — held is what refunds still pending keep reserved. What a human approving a refund
/// must see (seed 002), in `keel agent run` and on the console's approval page.
///
/// # Errors
///
/// The log's, when it cannot be read.
pub fn refunded_on_order(reader: &store::Reader, intent: &Intent) -> anyhow::Result<(i64, i64)> {
    let definition = &intent.definition;
    let others = reader.order_intents(&definition.tenant, &definition.order_id)?;
    let refunds =
        others.iter().filter(|i| i.definition.kind == engine::provider::EffectKind::Refund && i.key() != intent.key());
    let (mut refunded, mut held) = (0i64, 0i64);
    for other in refunds {
        match other.status {
            IntentStatus::Validated => refunded = refunded.saturating_add(other.definition.amount_minor),
            _ if other.money_committed() => held = held.saturating_add(other.definition.amount_minor),
            _ => {}
        }
    }
    Ok((refunded, held))
}

/// `keel reconcile KEY|--due`.
pub async fn reconcile<B: Backend>(node: &Node<B>, out: &Output, key: Option<&IntentKey>, due: bool) -> Outcome {
    let cause = Cause::command("reconcile");
    let outcomes = match key.filter(|_| !due) {
        None => node.executor.reconcile_due(cause).await,
        Some(key) => node.executor.reconcile(key, cause).await.map(|outcome| vec![outcome]),
    };
    node.shutdown()?;
    let outcomes = outcomes.map_err(workflow_failure)?;
    out.emit(&outcomes, || {
        if outcomes.is_empty() {
            outln!("nothing due for reconciliation");
        }
        outcomes.iter().for_each(print_outcome);
    });
    let all_validated = outcomes.iter().all(IntentOutcome::is_validated);
    Ok(if due || all_validated { exit::OK } else { exit::CONTROLLED })
}

/// A workflow error as a failure: the ledger's refusals keep their kind.
pub fn workflow_failure(error: WorkflowError) -> Failure {
    match error {
        WorkflowError::Log(LogError::Refused(refusal)) => Failure::refusal(&refusal),
        WorkflowError::Busy(refusal) => Failure::Refused(refusal.to_string()),
        other => Failure::Internal(other.to_string()),
    }
}

/// `keel resume`: the workflow runs and reconciliations, then the agent runs. A workflow run
/// that started under another policy than `policy` reserves under both (the stricter wins).
pub async fn resume(
    db: &Path,
    durability: store::Durability,
    provider: &ProviderArgs,
    policy: engine::policy::InForce,
    out: &Output,
) -> Outcome {
    let mut node = Node::open(db, durability, provider, None)?;
    node.executor = node.executor.clone().with_policy(policy);
    let report = node.executor.recover_and_resume(Cause::command("resume")).await;
    node.shutdown()?;
    let report = report.map_err(workflow_failure)?;
    let agents = crate::agent::resume_unfinished(db, durability, provider).await?;
    print_resume(out, &report, &agents)
}

/// `keel resume` on PostgreSQL: the workflow runs and reconciliations. Its agent runs are
/// listed `not_resumed` (agent runs run on SQLite only for now), never skipped unsaid.
pub async fn resume_postgres(node: &Node<store_postgres::PgLog>, out: &Output) -> Outcome {
    let cause = Cause::command("resume");
    let report = node.executor.recover_and_resume(cause.clone()).await;
    let snapshot = node.executor.runtime().log.ask(engine::log::Ask::snapshot(cause)).await;
    node.shutdown()?;
    let report = report.map_err(workflow_failure)?;
    let snapshot = snapshot.map_err(|error| workflow_failure(error.into()))?;
    let agents: Vec<crate::agent::AgentResumed> = snapshot
        .unfinished
        .iter()
        .chain(&snapshot.sleeping)
        .filter(|run| run.is_agent())
        .map(|run| crate::agent::AgentResumed::not_resumed(run, crate::on_postgres::AGENT_RUNS_ON_SQLITE_ONLY))
        .collect();
    print_resume(out, &report, &agents)
}

fn print_resume(
    out: &Output,
    report: &engine::executor::ResumeReport,
    agents: &[crate::agent::AgentResumed],
) -> Outcome {
    /// `keel resume --json`: the engine's report with the agent runs resumed beside it.
    #[derive(serde::Serialize)]
    struct Resumed<'a> {
        #[serde(flatten)]
        report: &'a engine::executor::ResumeReport,
        agent_runs: &'a [crate::agent::AgentResumed],
    }
    let document = serde_json::to_value(Resumed { report, agent_runs: agents })?;
    out.emit(&name_intent_keys(document), || {
        outln!(
            "recovered {}, resumed {} and {}, reconciled {}, left {} asleep",
            plural(report.recovered.len() as u64, "in-flight intent"),
            plural(report.resumed.len() as u64, "workflow run"),
            plural(agents.len() as u64, "agent run"),
            plural(report.reconciled.len() as u64, "intent"),
            plural(report.sleeping.len() as u64, "run")
        );
        for key in &report.recovered {
            outln!("  recovered {key}: outcome_unknown (crash)");
        }
        for run in &report.resumed {
            match run.wakes_at {
                Some(at) => {
                    outln!("  run {}: {} until its timer fires at {}", run.run_id, run.status.as_str(), instant(at))
                }
                None => outln!("  run {}: {}", run.run_id, run.status.as_str()),
            }
        }
        for run in &report.sleeping {
            let at = instant(run.wakes_at);
            outln!("  run {}: asleep, its timer fires at {at} (a `keel resume` from then on continues it)", run.run_id);
        }
        for run in agents {
            outln!("  agent run {} ({}): {}", run.run_id, run.workflow, run.summary());
        }
        report.reconciled.iter().for_each(print_outcome);
        for left in &report.left_to_their_owner {
            outln!("  left to its owner: {} ({})", left.subject, left.held_by);
        }
    });
    Ok(exit::OK)
}

/// An operator's text given in `flag` (`--by`, `--reason`, `--override`), checked by the rule
/// every door shares ([`OperatorText`]): blank is a usage error, before anything is opened.
///
/// # Errors
///
/// [`Failure::Usage`] naming the flag.
pub fn operator_text(flag: &str, text: &str) -> Result<OperatorText, Failure> {
    OperatorText::parse(flag, text).map_err(|blank| Failure::Usage(blank.to_string()))
}

/// Which operator decision a command records, to say what it did.
#[derive(Clone, Copy, Debug)]
pub enum Decision {
    /// `keel approve`.
    Approve,
    /// `keel deny`.
    Deny,
    /// `keel cancel`.
    Cancel,
    /// `keel resolve`.
    Resolve,
}

/// What `keel cancel|approve|deny` asks of one intent, with the operator's name.
#[derive(Debug)]
pub enum OperatorAsk {
    /// `keel cancel`.
    Cancel { by: String, reason: String },
    /// `keel approve`: for `ttl_ms`, of the intent whose fingerprint is the one reviewed.
    Approve { by: String, ttl_ms: u64, fingerprint: Option<String> },
    /// `keel deny`.
    Deny { by: String, reason: String },
}

impl OperatorAsk {
    fn by(&self) -> &str {
        match self {
            Self::Cancel { by, .. } | Self::Approve { by, .. } | Self::Deny { by, .. } => by,
        }
    }

    /// Checks the operator's text (`--by`, and `--reason` when the decision takes one).
    fn check(&self) -> Result<(), Failure> {
        operator_text("--by", self.by())?;
        match self {
            Self::Cancel { reason, .. } | Self::Deny { reason, .. } => operator_text("--reason", reason).map(drop),
            Self::Approve { .. } => Ok(()),
        }
    }

    fn decision(&self) -> Decision {
        match self {
            Self::Cancel { .. } => Decision::Cancel,
            Self::Approve { .. } => Decision::Approve,
            Self::Deny { .. } => Decision::Deny,
        }
    }

    fn ask(self, key: IntentKey) -> Ask<IntentAnswer> {
        let cause = Cause::operator(self.by());
        match self {
            Self::Cancel { by, reason } => Ask::cancel(cause, key, by, reason),
            Self::Approve { by, ttl_ms, fingerprint } => Ask::approve(cause, key, by, ttl_ms, fingerprint),
            Self::Deny { by, reason } => Ask::deny(cause, key, by, reason),
        }
    }
}

/// `keel cancel|approve|deny`: one operator decision, recorded with the name, on the log
/// `open` opens once `--by` is checked (a blank name opens nothing). `agent_run` says whether the intent's run is an agent's, for the hint printed
/// after an approval.
pub async fn operator<B: Backend>(
    open: impl FnOnce() -> anyhow::Result<B>,
    agent_run: impl FnOnce(&RunId) -> bool,
    out: &Output,
    key: IntentKey,
    request: OperatorAsk,
) -> Outcome {
    request.check()?;
    let decision = request.decision();
    let store = open()?;
    let result = store.event_log().ask(request.ask(key)).await;
    store.close()?;
    match result {
        Ok(answer) => print_decision(out, &answer.intent, decision, agent_run(&answer.intent.run_id)),
        Err(LogError::Refused(refusal)) => Err(Failure::refusal(&refusal)),
        Err(other) => Err(other.into()),
    }
}

/// Whether the run `run_id` of the SQLite log at `db` is an agent's (`false` when it cannot
/// be read: the hint it chooses is the plain one).
pub fn agent_run_in(db: &Path) -> impl FnOnce(&RunId) -> bool + '_ {
    move |run_id| {
        let run = store::Reader::open(db).ok().and_then(|reader| reader.run(run_id).ok().flatten());
        run.is_some_and(|run| run.workflow.starts_with(engine::ledger::AGENT_WORKFLOW_PREFIX))
    }
}

/// Prints what an operator decision did, and the intent it left. `agent`: its run is an
/// agent's (continued by `keel agent resume`, not by a re-submission).
fn print_decision(out: &Output, intent: &Intent, decision: Decision, agent: bool) -> Outcome {
    out.emit(&name_intent_keys(serde_json::to_value(intent)?), || {
        let key = intent.key();
        match (decision, &intent.approval) {
            (Decision::Approve, Some(approval)) => {
                outln!(
                    "approved {key} by {}, fingerprint {}…, valid until {}",
                    approval.by,
                    &approval.fingerprint[..12.min(approval.fingerprint.len())],
                    when(approval.expires_at)
                );
                if agent {
                    outln!("  nothing is sent yet: `keel agent resume {}` sends it", intent.run_id);
                } else {
                    outln!("  nothing is sent yet: re-submit the same request (same key, same payload) to send it");
                }
            }
            (Decision::Approve, None) => outln!("approved {key}: it is {}", intent.status.as_str()),
            (Decision::Deny, _) => outln!("denied {key}: it is {}, its money released", intent.status.as_str()),
            (Decision::Cancel, _) => outln!("cancelled {key}: it is {}", intent.status.as_str()),
            (Decision::Resolve, _) => outln!("resolved {key}: it is {}", intent.status.as_str()),
        }
        if let Some(note) = &intent.note {
            outln!("  note: {note}");
        }
    });
    Ok(exit::OK)
}

/// What an operator asserts with `keel resolve`.
pub struct Resolution {
    /// The provider's reference proving the effect; `None` for `--absent`.
    pub landed: Option<String>,
    /// The operator.
    pub by: String,
    /// Why.
    pub reason: String,
    /// Why the provider's contradicting answer is wrong, when the operator overrides it.
    pub override_reason: Option<String>,
}

/// `keel resolve KEY --landed REF|--absent [--override REASON]` on the log `open` opens:
/// checked with the provider when the intent's provider can look it up (`--provider` is then
/// required; without one, `intent_of` reads the intent to tell).
pub async fn resolve<B: Backend>(
    open: impl FnOnce() -> anyhow::Result<B>,
    intent_of: impl FnOnce(&IntentKey) -> Result<Option<Intent>, Failure>,
    provider: &ProviderArgs,
    out: &Output,
    key: &IntentKey,
    decision: Resolution,
) -> Outcome {
    operator_text("--by", &decision.by)?;
    operator_text("--reason", &decision.reason)?;
    decision.override_reason.as_deref().map(|why| operator_text("--override", why)).transpose()?;
    if provider.url.is_none() {
        match intent_of(key)? {
            None => return Err(Failure::NotFound(format!("no intent with key {key} in this log"))),
            Some(intent) if intent.capability.lookup => {
                return Err(Failure::MissingProvider(format!(
                    "intent {key}'s provider can look it up, so resolve checks with it first: pass --provider URL \
                     (or set KEEL_PROVIDER_URL)"
                )));
            }
            Some(_) => {}
        }
    }
    let resolved = match &provider.url {
        Some(_) => {
            let provider = crate::wiring::http_provider(provider)?;
            let node = Node::over(open()?, provider, None);
            let result = node
                .executor
                .resolve(key, &decision.by, &decision.reason, decision.landed, decision.override_reason)
                .await;
            node.shutdown()?;
            result
        }
        None => {
            let store = open()?;
            let resolution = engine::log::Resolution {
                key: key.clone(),
                by: decision.by.clone(),
                reason: decision.reason,
                landed: decision.landed,
                lookup: None,
                override_reason: decision.override_reason,
            };
            let result = store.event_log().ask(Ask::resolve(Cause::operator(&decision.by), resolution)).await;
            store.close()?;
            result.map(|answer| answer.intent).map_err(Into::into)
        }
    };
    match resolved {
        Ok(intent) => print_decision(out, &intent, Decision::Resolve, false),
        Err(error) => Err(workflow_failure(error)),
    }
}

/// The state of `key`'s intent in the SQLite log at `db`, for [`resolve`].
pub fn intent_in(db: &Path) -> impl FnOnce(&IntentKey) -> Result<Option<Intent>, Failure> + '_ {
    move |key| Ok(reader(db, crate::CreateFlag::default())?.intent_state(key)?)
}

/// `keel verify`.
pub fn verify(reader: &store::Reader, out: &Output) -> Outcome {
    // Progress on a terminal only: a pipe or `--json` gets the report alone.
    let progress = out.progress(0, "verify: hash chain");
    let mut phase = None;
    let report = reader.verify_with(&mut |step| {
        if phase != Some(step.phase) {
            let what = match step.phase {
                store::Phase::Chain => "verify: hash chain",
                store::Phase::Streams => "verify: replaying streams",
            };
            progress.phase(what, step.total);
            phase = Some(step.phase);
        }
        progress.set(step.done);
    })?;
    progress.finish();
    let checked = Checked { events: report.events, intents: report.intents, runs: report.runs, chain: "hash chain" };
    print_verify(out, &report, checked, report.first_mismatch(), report.mismatch_count)
}

/// `keel verify` on PostgreSQL: every stream's chain, every row against its stream replayed.
pub fn verify_postgres(reader: &mut store_postgres::PgReader, out: &Output) -> Outcome {
    let report = reader.verify()?;
    let checked = Checked {
        events: report.events,
        intents: report.intents,
        runs: report.runs,
        chain: "every stream's hash chain",
    };
    print_verify(out, &report, checked, report.first_mismatch(), report.mismatch_count)
}

/// What a `verify` report counted, for its line.
struct Checked {
    events: u64,
    intents: u64,
    runs: u64,
    /// What chain was checked: the log's, or each stream's.
    chain: &'static str,
}

fn print_verify(
    out: &Output,
    report: &impl serde::Serialize,
    checked: Checked,
    first: Option<&impl std::fmt::Display>,
    mismatches: u64,
) -> Outcome {
    out.emit(&name_intent_keys(serde_json::to_value(report)?), || match first {
        None => outln!(
            "ok: {}, {} intact, {} and {} match their replay",
            plural(checked.events, "event"),
            checked.chain,
            plural(checked.intents, "intent"),
            plural(checked.runs, "run")
        ),
        Some(mismatch) => outln!("FAILED ({}), first: {mismatch}", plural(mismatches, "mismatch")),
    });
    Ok(if first.is_none() { exit::OK } else { exit::INTERNAL })
}
