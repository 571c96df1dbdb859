//! The operator commands: run an effect, list, show, reconcile, resume, operator decisions,
//! verify.
//!
//! Owns the translation between flags and engine commands, and each command's rendering
//! and exit code. It never touches SQL (the store does) nor decides a transition (the
//! ledger does).

use crate::output::{Output, name_intent_keys};
use crate::wiring::{Node, open_store};
use crate::{EffectArgs, LimitArgs, ProviderArgs, exit};
use anyhow::Context as _;
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::{IntentOutcome, RunOutcome, RunRequest};
use engine::ledger::{Intent, IntentStatus};
use engine::log::{Ask, Asking, EventLog, IntentAnswer, LogError};
use serde_json::{Map, Value, json};
use std::io::{IsTerminal as _, Read as _};
use std::path::Path;

/// Builds a workflow input from flags or `--input FILE|-`.
pub fn effect_input(args: &EffectArgs, payment_method_token: Option<&str>) -> Result<Value, String> {
    let mut input = match &args.input {
        Some(path) => {
            let text = if path == "-" {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).map_err(|e| format!("cannot read stdin: {e}"))?;
                text
            } else {
                std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?
            };
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

/// Runs one charge or refund workflow and prints its outcome.
pub async fn run_effect(
    node: &Node,
    out: &Output,
    workflow: &str,
    input: &Value,
    limits: &LimitArgs,
) -> anyhow::Result<u8> {
    let request = RunRequest {
        run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
        limits: RunLimits {
            cost_minor_max: limits.cost_budget_minor,
            attempts_per_intent_max: limits.max_attempts,
            reconciliations_per_intent_max: limits.max_reconciliations,
            approval_threshold_minor: limits.approval_threshold_minor,
        },
        deadline_ms: limits.deadline_ms,
        cause: Cause::command(workflow),
    };
    let outcome = node.executor.start(workflow, input, request).await?;
    node.shutdown()?;
    out.emit(&run_document(&outcome), || print_run(workflow, &outcome));
    Ok(if outcome.intent.as_ref().is_some_and(IntentOutcome::is_validated) { exit::OK } else { exit::CONTROLLED })
}

/// A charge's or refund's JSON document: the workflow's output with its run's id and status
/// (what `keel charge --json` prints and `keel serve` answers).
pub fn run_document(outcome: &RunOutcome) -> Value {
    let mut document = outcome.output.clone();
    if let Some(map) = document.as_object_mut() {
        map.insert("run_id".to_owned(), json!(outcome.run_id));
        map.insert("run_status".to_owned(), json!(outcome.status));
    }
    document
}

/// A run's outcome in one line (and its details): the intent it ended on, or why it was
/// refused before anything was written.
fn print_run(workflow: &str, outcome: &RunOutcome) {
    match (&outcome.intent, &outcome.rejection) {
        (Some(intent), _) => print_intent(workflow, intent),
        (None, Some(rejection)) => {
            println!("{workflow} (no key) → rejected, code {}", rejection.code.as_str());
            rejection.details.iter().for_each(|detail| println!("  - {detail}"));
        }
        (None, None) => println!("{workflow} run {} → {}", outcome.run_id, outcome.status.as_str()),
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
    line.push_str(&format!(", {} attempt(s)", outcome.attempts));
    if let Some(at) = outcome.reconcile_after {
        line.push_str(&format!(", reconcile after {}", at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)));
    }
    println!("{line}");
    outcome.details.iter().for_each(|detail| println!("  - {detail}"));
}

fn print_outcome(outcome: &IntentOutcome) {
    print_intent(outcome.intent_key.as_str().split(':').next().unwrap_or("intent"), outcome);
}

fn parse_key(key: &str) -> Result<IntentKey, String> {
    IntentKey::parse(key).ok_or_else(|| {
        format!("{key:?} is not an intent key (expected operation:tenant:intent_id, operation charge or refund)")
    })
}

/// `keel intents [--state S]`.
pub fn list_intents(db: &Path, out: &Output, state: Option<&str>) -> anyhow::Result<u8> {
    if let Some(state) = state
        && IntentStatus::parse(state).is_none()
    {
        let known: Vec<&str> = engine::ledger::ALL_STATUSES.iter().map(|s| s.as_str()).collect();
        return Ok(out.usage_error(&format!("unknown state {state:?} (known: {})", known.join(", "))));
    }
    let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
    let rows = reader.intents(state)?;
    out.emit(&name_intent_keys(serde_json::to_value(&rows)?), || {
        if rows.is_empty() {
            println!("no intents{}", state.map(|s| format!(" in state {s}")).unwrap_or_default());
        }
        for row in &rows {
            println!(
                "{:<18} {:<60} {:>10} {} attempts={} reconciliations={}",
                row.status, row.key, row.amount_minor, row.currency, row.attempts, row.reconciliations
            );
        }
    });
    Ok(exit::OK)
}

/// `keel show KEY`.
pub fn show(db: &Path, out: &Output, key: &str) -> anyhow::Result<u8> {
    let key = match parse_key(key) {
        Ok(key) => key,
        Err(message) => return Ok(out.usage_error(&message)),
    };
    let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
    let Some((intent, events, document)) = intent_document(&reader, &key)? else {
        return Ok(out.refused(&format!("no intent with key {key}")));
    };
    out.emit(&document, || {
        println!("{key}: {}", intent.status.as_str());
        println!(
            "  {} {} {} for order {}, fingerprint {}",
            intent.definition.kind.as_str(),
            intent.definition.amount_minor,
            intent.definition.currency,
            intent.definition.order_id,
            intent.definition.fingerprint
        );
        println!(
            "  attempts {}/{}, reconciliations {}/{}",
            intent.attempts, intent.attempts_max, intent.reconciliations, intent.reconciliations_max
        );
        if let Some(evidence) = &intent.evidence {
            println!("  evidence {} ({} {})", evidence.provider_ref, evidence.amount_minor, evidence.currency);
        }
        if let Some(note) = &intent.note {
            println!("  note: {note}");
        }
        println!("  history:");
        for e in &events {
            println!(
                "    #{:<6} {} {:<24} by {}",
                e.seq,
                e.at.format("%H:%M:%S%.3f"),
                e.event.type_name(),
                e.cause.actor
            );
        }
    });
    Ok(exit::OK)
}

/// One intent's state, its events and the JSON document `keel show --json` prints (and
/// `GET /v1/intents/{key}` answers); `None` when no intent has the key.
pub fn intent_document(
    reader: &store::Reader,
    key: &IntentKey,
) -> anyhow::Result<Option<(Intent, Vec<engine::event::StoredEvent>, Value)>> {
    let Some(intent) = reader.intent_state(key)? else {
        return Ok(None);
    };
    let events = reader.stream(&key.stream())?;
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
        "code": intent.decline_code,
        "attempts": intent.attempts,
        "reconciliations": intent.reconciliations,
        "intent": intent,
        "events": history,
    });
    Ok(Some((intent, events, name_intent_keys(document))))
}

/// `keel reconcile KEY|--due`.
pub async fn reconcile(node: &Node, out: &Output, key: Option<&str>, due: bool) -> anyhow::Result<u8> {
    let cause = Cause::command("reconcile");
    let outcomes = if due {
        node.executor.reconcile_due(cause).await?
    } else {
        let key = match parse_key(key.unwrap_or_default()) {
            Ok(key) => key,
            Err(message) => return Ok(out.usage_error(&message)),
        };
        match node.executor.reconcile(&key, cause).await {
            Ok(outcome) => vec![outcome],
            Err(engine::executor::WorkflowError::Log(LogError::Refused(refusal))) => {
                return Ok(out.refused(&refusal.to_string()));
            }
            Err(other) => return Err(other.into()),
        }
    };
    node.shutdown()?;
    out.emit(&outcomes, || {
        if outcomes.is_empty() {
            println!("nothing due for reconciliation");
        }
        outcomes.iter().for_each(print_outcome);
    });
    let all_validated = outcomes.iter().all(IntentOutcome::is_validated);
    Ok(if due || all_validated { exit::OK } else { exit::CONTROLLED })
}

/// `keel resume`.
pub async fn resume(node: &Node, out: &Output) -> anyhow::Result<u8> {
    let report = node.executor.recover_and_resume(Cause::command("resume")).await?;
    node.shutdown()?;
    out.emit(&report, || {
        println!(
            "recovered {} in-flight intent(s), resumed {} run(s), reconciled {} intent(s)",
            report.recovered.len(),
            report.resumed.len(),
            report.reconciled.len()
        );
        for key in &report.recovered {
            println!("  recovered {key}: outcome_unknown (crash)");
        }
        for run in &report.resumed {
            println!("  run {}: {}", run.run_id, run.status.as_str());
        }
        report.reconciled.iter().for_each(print_outcome);
    });
    Ok(exit::OK)
}

/// `keel cancel|resolve|approve|deny`: one operator decision, recorded with the name.
pub async fn operator(
    db: &Path,
    durability: store::Durability,
    out: &Output,
    key: &str,
    ask: impl FnOnce(Cause, IntentKey) -> Ask<IntentAnswer>,
    by: &str,
) -> anyhow::Result<u8> {
    let key = match parse_key(key) {
        Ok(key) => key,
        Err(message) => return Ok(out.usage_error(&message)),
    };
    if by.trim().is_empty() {
        return Ok(out.usage_error("--by needs the operator's name"));
    }
    let store = open_store(db, durability)?;
    let result = (&store as &dyn EventLog).ask(ask(Cause::operator(by), key)).await;
    store.shutdown()?;
    match result {
        Ok(answer) => print_decision(out, &answer.intent),
        Err(LogError::Refused(refusal)) => Ok(out.refused(&refusal.to_string())),
        Err(other) => Err(other.into()),
    }
}

/// Prints the intent an operator decision left.
fn print_decision(out: &Output, intent: &Intent) -> anyhow::Result<u8> {
    out.emit(&name_intent_keys(serde_json::to_value(intent)?), || {
        println!("{}: {}", intent.key(), intent.status.as_str());
        if let Some(note) = &intent.note {
            println!("  note: {note}");
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

/// `keel resolve KEY --landed REF|--absent [--override REASON]`: checked with the provider
/// when the intent's provider can look it up (`--provider` is then required).
pub async fn resolve(
    db: &Path,
    durability: store::Durability,
    provider: &ProviderArgs,
    out: &Output,
    key: &str,
    decision: Resolution,
) -> anyhow::Result<u8> {
    let key = match parse_key(key) {
        Ok(key) => key,
        Err(message) => return Ok(out.usage_error(&message)),
    };
    if decision.by.trim().is_empty() {
        return Ok(out.usage_error("--by needs the operator's name"));
    }
    if provider.url.is_none() {
        let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
        if reader.intent_state(&key)?.is_some_and(|intent| intent.capability.lookup) {
            return Ok(out.usage_error(&format!(
                "intent {key}'s provider can look it up, so resolve checks with it first: pass --provider URL \
                 (or set KEEL_PROVIDER_URL)"
            )));
        }
    }
    let resolved = match &provider.url {
        Some(_) => {
            let node = Node::open(db, durability, provider, None)?;
            let result = node
                .executor
                .resolve(&key, &decision.by, &decision.reason, decision.landed, decision.override_reason)
                .await;
            node.store.shutdown()?;
            result
        }
        None => {
            let store = open_store(db, durability)?;
            let resolution = engine::log::Resolution {
                key: key.clone(),
                by: decision.by.clone(),
                reason: decision.reason,
                landed: decision.landed,
                lookup: None,
                override_reason: decision.override_reason,
            };
            let result = (&store as &dyn EventLog).ask(Ask::resolve(Cause::operator(&decision.by), resolution)).await;
            store.shutdown()?;
            result.map(|answer| answer.intent).map_err(Into::into)
        }
    };
    match resolved {
        Ok(intent) => print_decision(out, &intent),
        Err(engine::executor::WorkflowError::Log(LogError::Refused(refusal))) => Ok(out.refused(&refusal.to_string())),
        Err(other) => Err(other.into()),
    }
}

/// `keel verify`.
pub fn verify(db: &Path, out: &Output) -> anyhow::Result<u8> {
    if !db.exists() {
        return Ok(out.usage_error(&format!("{} does not exist", db.display())));
    }
    let reader = store::Reader::open(db).with_context(|| format!("cannot read {}", db.display()))?;
    // Progress on a terminal only: a pipe or `--json` gets the report alone.
    let show_progress = !out.json && std::io::stderr().is_terminal();
    let report = reader.verify_with(&mut |progress| {
        if show_progress {
            let phase = match progress.phase {
                store::Phase::Chain => "hash chain, events",
                store::Phase::Streams => "replaying streams",
            };
            eprint!("\rverify: {phase} {}/{}   ", progress.done, progress.total);
        }
    })?;
    if show_progress {
        eprint!("\r\x1b[2K");
    }
    out.emit(&name_intent_keys(serde_json::to_value(&report)?), || match report.first_mismatch() {
        None => println!(
            "ok: {} events, hash chain intact, {} intents and {} runs match their replay",
            report.events, report.intents, report.runs
        ),
        Some(mismatch) => println!("FAILED ({} mismatches), first: {mismatch}", report.mismatch_count),
    });
    Ok(if report.is_ok() { exit::OK } else { exit::INTERNAL })
}
