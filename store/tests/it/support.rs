//! Builders shared by the store's tests: a clock, runs, intents and the commands on them.

use chrono::{DateTime, TimeDelta, Utc};
use engine::canonical::fingerprint;
use engine::clock::ManualClock;
use engine::event::{Cause, IntentDefinition, IntentKey, RunId, RunLimits};
use engine::ledger::{Action, Command, Intent, IntentSpec, Reply, RunStart};
use engine::log::LogError;
use engine::provider::{CallOutcome, Capability, EffectKind, Evidence};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use store::{MIGRATIONS, Options, Store};
use tempfile::TempDir;

/// The tests' start instant. Its nanoseconds check that the writer truncates to micros.
pub fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2025-03-01T12:00:00.123456789Z").expect("a valid literal").to_utc()
}

/// A fresh directory holding `keel.db`, a manual clock, and a store on it.
pub struct Fixture {
    /// Keeps the directory alive.
    pub _dir: TempDir,
    /// The database file.
    pub path: PathBuf,
    /// The clock the store stamps with.
    pub clock: Arc<ManualClock>,
    /// The store.
    pub store: Store,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("keel.db");
        let clock = Arc::new(ManualClock::new(start()));
        let store = Store::open(&path, Options::default(), clock.clone()).expect("the store opens");
        Self { _dir: dir, path, clock, store }
    }

    /// A second store on the same file: what another process would be.
    pub fn second_store(&self) -> Store {
        Store::open(&self.path, Options::default(), self.clock.clone()).expect("a second store opens")
    }

    /// Shuts the store down and opens it again on the same file.
    pub fn reopen(&mut self) {
        self.store.shutdown().expect("clean shutdown");
        self.store = Store::open(&self.path, Options::default(), self.clock.clone()).expect("the store reopens");
    }

    /// A raw connection, as an attacker or a buggy tool would have.
    pub fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.path).expect("a raw connection")
    }

    /// Events in the log, counted through a reader.
    pub fn event_count(&self) -> usize {
        self.store.reader().expect("a reader").events_since(0).expect("events read").len()
    }
}

pub fn limits() -> RunLimits {
    RunLimits {
        cost_minor_max: None,
        attempts_per_intent_max: 3,
        reconciliations_per_intent_max: 5,
        approval_threshold_minor: None,
        policy: None,
        network_retries_max: None,
        reconciliations_max: None,
    }
}

pub fn run_start(run_id: &str) -> RunStart {
    RunStart {
        run_id: RunId::new(run_id),
        workflow: "charge".to_owned(),
        input: json!({"run": run_id}),
        deadline_at: start() + TimeDelta::minutes(10),
        limits: limits(),
        versions: Default::default(),
        owner: None,
    }
}

pub fn capability() -> Capability {
    Capability {
        dedup_by_key: true,
        lookup: true,
        key_window_ms: 86_400_000,
        consistency_window_ms: 1_000,
        request_timeout_ms: 0,
    }
}

/// A charge of `amount_minor` EUR for intent `id` of tenant `t1`, on its own order.
pub fn charge(id: &str, amount_minor: i64) -> IntentSpec {
    let payload = json!({"order_id": format!("order-{id}"), "amount_minor": amount_minor, "currency": "EUR"});
    IntentSpec {
        definition: IntentDefinition {
            key: IntentKey::new(EffectKind::Charge, "t1", id),
            kind: EffectKind::Charge,
            tenant: "t1".to_owned(),
            intent_id: id.to_owned(),
            order_id: format!("order-{id}"),
            business_ref: format!("order-{id}"),
            fingerprint: fingerprint(&payload),
            amount_minor,
            currency: "EUR".to_owned(),
            payload,
            tool: None,
        },
        capability: capability(),
        approval_required: false,
    }
}

pub fn key(id: &str) -> IntentKey {
    IntentKey::new(EffectKind::Charge, "t1", id)
}

/// Starts run `run_id` and reserves `spec` as its first journal entry, in one command.
pub fn start_and_reserve(run_id: &str, spec: IntentSpec) -> Command {
    Command {
        cause: Cause::command("test").for_run(&RunId::new(run_id)),
        start_run: Some(run_start(run_id)),
        lease: engine::lease::LeaseUse::None,
        keep: None,
        policy: None,
        action: Action::Reserve { run_id: RunId::new(run_id), position: 0, spec, start_attempt: false },
    }
}

pub fn start_attempt(run_id: &str, id: &str) -> Command {
    Command {
        cause: Cause::command("test"),
        start_run: None,
        lease: engine::lease::LeaseUse::None,
        keep: None,
        policy: None,
        action: Action::StartAttempt { key: key(id), run_id: RunId::new(run_id) },
    }
}

pub fn succeed(id: &str, attempt: u32, amount_minor: i64) -> Command {
    Command {
        cause: Cause::command("test"),
        start_run: None,
        lease: engine::lease::LeaseUse::None,
        keep: None,
        policy: None,
        action: Action::RecordOutcome {
            key: key(id),
            attempt,
            outcome: CallOutcome::Succeeded(Evidence {
                provider_ref: format!("ch_{id}"),
                amount_minor,
                currency: "EUR".to_owned(),
            }),
        },
    }
}

pub fn outcome(id: &str, attempt: u32, outcome: CallOutcome) -> Command {
    Command {
        cause: Cause::command("test"),
        start_run: None,
        lease: engine::lease::LeaseUse::None,
        keep: None,
        policy: None,
        action: Action::RecordOutcome { key: key(id), attempt, outcome },
    }
}

/// The intent of a reply, and whether the command reserved it.
pub fn intent_of(reply: Result<Reply, LogError>) -> (Intent, bool) {
    match reply {
        Ok(Reply::Intent { intent, fresh, .. }) => (*intent, fresh),
        other => panic!("expected an intent reply, got {other:?}"),
    }
}

/// Whether `needle` occurs in `haystack`, byte for byte.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A new file at `path` as schema `version` left it: the migrations up to it, nothing else.
pub fn file_at_version(path: &std::path::Path, version: usize) {
    let mut conn = rusqlite::Connection::open(path).expect("creates the file");
    let tx = conn.transaction().expect("a transaction");
    for migration in &MIGRATIONS[..version] {
        tx.execute_batch(migration.sql).expect("the old migrations");
        if let Some(then) = migration.then {
            then(&tx).expect("its Rust half");
        }
    }
    tx.pragma_update(None, "user_version", i64::try_from(version).expect("a small version")).expect("the version");
    tx.commit().expect("commit");
}
