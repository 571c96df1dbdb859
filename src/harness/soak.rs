//! `keel soak`: real process kills under load, then Keel's invariants, on a SQLite log or
//! on PostgreSQL (`--store postgres://…`).
//!
//! Owns the soak's driver: where its log is ([`Log`]), the workload (a shared pool of keys,
//! so some collide, some re-use a key with another amount, some refunds overdraw), the
//! simulator's fault plan (every fault kind it has: lost and late answers, 5xx, declines,
//! lying, lagging and unavailable lookups), the heal and the report. It starts the provider
//! simulator as a child process with that plan, then, round after round, starts `keel
//! soak-worker` children that run a small batch of charges and refunds concurrently and
//! SIGKILLs them after a seeded delay:
//!
//! - on SQLite, one child a round, and every few rounds `keel resume`, sometimes killed too
//!   (a crash during recovery);
//! - on PostgreSQL, the chaos of [`super::chaos`]: two children a round submitting the same
//!   batch, four `keel worker` processes SIGKILLed (and restarted) or SIGSTOPped past their
//!   lease at random, and a TCP proxy between every child and the database cutting
//!   connections mid-transaction and mid-`COMMIT`, and partitioning one worker away past its
//!   lease. It runs in a fresh database on the named
//!   server, never in the one named.
//!
//! Then it heals: stops the faults (the simulator restarted without its plan, the proxy
//! gone), and runs what an operator would, as child processes — `keel resume` (SQLite) or
//! `keel worker --once` (PostgreSQL), `keel reconcile --due`, `keel reconcile KEY` for what
//! is still unknown, and, without a vault, `keel charge` again for a charge that waits for
//! its caller (the token is never stored) — for a bounded number of passes. With `--vault`
//! (SQLite) every child gets a throwaway vault key and nothing is re-submitted. Finally it
//! checks every invariant over the log and the simulator's effects (`testkit::invariants`),
//! plus that no effect's answer was lost, and prints the report. Exit 0 only when no
//! invariant broke.
//!
//! It never runs in an operator's log: its SQLite file is in its own directory, its
//! PostgreSQL database a fresh one.

use super::start_sim;
use crate::backend::PgUrl;
use crate::exit;
use crate::output::Output;
use crate::wiring::{Backend, Node};
use anyhow::Context as _;
use engine::event::{Cause, Event, RunId, RunLimits, StoredEvent};
use engine::executor::RunRequest;
use engine::ledger::{IntentStatus, Ledger};
use engine::provider::{EffectKind, UnknownReason};
use provider_sim::Rng;
use serde::Serialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use store_postgres::proxy::Cuts;
use testkit::invariants::{self, Effect};

const TENANT: &str = "5b2d6c1a-8e3f-4a7b-9c0d-1e2f3a4b5c6d";
const TOKEN: &str = "pm_soak_card_visa_4242424242";
/// Intents per worker round: small, so a kill is cheap and lands mid-batch.
pub const ROUND_INTENTS: u64 = 8;
/// Longest wait before a kill on SQLite, in ms: a debug worker starts, opens its log and
/// runs its batch in 10–60 ms, so kills land before, during and (rarely) after its attempts.
const KILL_DELAY_MAX_MS: u64 = 60;
/// Heal passes before an unknown outcome counts as left unreconciled.
const HEAL_PASSES: usize = 6;
/// The provider timeout of workers: shorter than the simulator's held answers.
pub(super) const WORKER_TIMEOUT_MS: u64 = 200;
/// The provider timeout while healing: the healthy simulator answers at once.
const HEAL_TIMEOUT_MS: u64 = 5_000;

/// The invariant report of a soak.
#[derive(Debug, Serialize)]
struct SoakReport {
    seed: u64,
    /// `sqlite` or `postgres`.
    store: &'static str,
    kills: u64,
    /// Kills of `keel resume` (SQLite) or of `keel worker` processes (PostgreSQL): crashes
    /// during recovery and takeover.
    recovery_kills: u64,
    /// `keel worker` processes SIGSTOPped past their lease, then let go on (PostgreSQL).
    stalls: u64,
    /// Connections the proxy cut, by moment (PostgreSQL).
    proxy_cuts: Option<Cuts>,
    /// `keel worker` processes that ended by themselves during the chaos (PostgreSQL): a
    /// worker stops only when told.
    worker_exits: u64,
    rounds: u64,
    intents: u64,
    effects: u64,
    events: u64,
    /// Attempts a kill left in flight, turned `outcome_unknown (crash)` by recovery: the
    /// proof that kills landed mid-attempt.
    crash_unknowns: u64,
    double_effects: u64,
    key_mismatches: u64,
    write_ahead_violations: u64,
    blind_resends: u64,
    budget_refills: u64,
    refund_overdraws: u64,
    unreconciled: u64,
    /// Effects at the provider whose intent let its money go (declined, released, rejected,
    /// escalated with absence proven) or does not exist: a definitive answer the log lost.
    lost_answers: u64,
    /// Definitive answers that reached a worker after its attempt stopped being awaited —
    /// its lease taken, its attempt declared crashed and reconciled by another — and were
    /// kept as evidence (`LateAnswerRecorded`) although its own writes were fenced: the
    /// proof that fencing kept the answers it refused to act on.
    fenced_late_answers: u64,
    /// Whether the children kept payment methods in a vault (`--vault`).
    vault: bool,
    /// Intents left neither final nor awaiting a human's approval after healing: reserved,
    /// in flight or unknown. Must be 0 with the vault (nothing waits for a caller) and on
    /// PostgreSQL (the heal re-submits what waits for its caller).
    unresolved: u64,
    verify_failures: u64,
    evidence_mismatches: u64,
    statuses: std::collections::BTreeMap<String, u64>,
    details: Vec<String>,
    ok: bool,
    dir: PathBuf,
    /// The PostgreSQL database the soak ran in (dropped when every invariant held, unless
    /// `--keep`).
    database: Option<String>,
}

/// One charge or refund of the pool: its key, payload and workflow follow from `n` alone,
/// so every worker and the heal phase agree on what key `n` means.
fn charge_input(seed: u64, n: u64, bump: i64) -> Value {
    json!({"tenant_id": TENANT, "intent_id": format!("soak_{seed}_{n:06}_charge"), "order_id": format!("order_{seed}_{n}"),
           "amount_minor": 1_000 + (n % 50) as i64 * 10 + bump, "currency": "EUR", "payment_method_token": TOKEN})
}

fn refund_input(seed: u64, n: u64, second: bool) -> Value {
    let charged = 1_000 + (n % 50) as i64 * 10;
    let (suffix, amount) = if second { ("b", charged / 2 + 7) } else { ("a", charged / 2) };
    json!({"tenant_id": TENANT, "intent_id": format!("soak_{seed}_{n:06}_refund_{suffix}"), "order_id": format!("order_{seed}_{n}"),
           "amount_minor": amount, "currency": "EUR"})
}

/// What round `round` of seed `seed` submits: `(workflow, input)`.
fn round_batch(seed: u64, round: u64) -> Vec<(&'static str, Value)> {
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(round));
    let pool = ROUND_INTENTS * (round + 1);
    (0..ROUND_INTENTS)
        .map(|_| {
            let n = rng.below(pool);
            match rng.below(20) {
                0 => ("charge", charge_input(seed, n, 1)), // same key, another amount: rejected
                1..=4 => ("refund", refund_input(seed, n, false)),
                5 => ("refund", refund_input(seed, n, true)),
                _ => ("charge", charge_input(seed, n, 0)),
            }
        })
        .collect()
}

fn limits() -> RunLimits {
    RunLimits {
        cost_minor_max: Some(100_000),
        network_retries_max: None,
        reconciliations_max: None,
        ..RunLimits::default()
    }
}

fn request(workflow: &str) -> RunRequest {
    RunRequest {
        run_id: RunId::new(uuid::Uuid::new_v4().to_string()),
        limits: limits(),
        deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
        cause: Cause::command(&format!("soak {workflow}")),
    }
}

/// `keel soak-worker`: runs one round's batch concurrently, then exits (if not killed first).
pub async fn worker<B: Backend>(node: &Node<B>, seed: u64, round: u64) -> anyhow::Result<u8> {
    let runs = round_batch(seed, round).into_iter().map(|(workflow, input)| {
        let executor = node.executor.clone();
        async move { executor.start(workflow, &input, request(workflow)).await }
    });
    for result in futures_join(runs).await {
        result?;
    }
    node.shutdown()?;
    Ok(exit::OK)
}

/// Runs futures concurrently on the current runtime and collects their results in order.
async fn futures_join<F, T>(futures: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("a soak task does not panic: errors are values"));
    }
    out
}

/// Where a soak's log is, as its children reach it.
#[derive(Clone, Debug)]
pub(super) enum Log {
    /// A SQLite file in the soak's directory.
    Sqlite(PathBuf),
    /// A PostgreSQL database (directly, or through the chaos proxy).
    Postgres(PgUrl),
}

impl Log {
    /// Every event, in sequence order.
    fn events(&self) -> anyhow::Result<Vec<StoredEvent>> {
        match self {
            Self::Sqlite(db) => Ok(store::Reader::open(db)?.events_since(0)?),
            Self::Postgres(url) => {
                crate::wiring::postgres_blocking(|| Ok(store_postgres::PgReader::open(&url.url())?.events()?))
            }
        }
    }

    /// The fold of the whole log.
    fn ledger(&self) -> anyhow::Result<Ledger> {
        match self {
            Self::Sqlite(db) => Ok(store::Reader::open(db)?.ledger()?),
            Self::Postgres(url) => {
                crate::wiring::postgres_blocking(|| Ok(store_postgres::PgReader::open(&url.url())?.ledger()?))
            }
        }
    }

    /// `keel verify`: `Some((mismatches, the first))` when anything does not check.
    fn verify(&self) -> anyhow::Result<Option<(u64, String)>> {
        let found = match self {
            Self::Sqlite(db) => {
                let report = store::Reader::open(db)?.verify()?;
                (report.mismatch_count, report.first_mismatch().map(ToString::to_string))
            }
            Self::Postgres(url) => crate::wiring::postgres_blocking(|| -> anyhow::Result<_> {
                let report = store_postgres::PgReader::open(&url.url())?.verify()?;
                Ok((report.mismatch_count, report.first_mismatch().map(ToString::to_string)))
            })?,
        };
        Ok(match found {
            (0, None) => None,
            (count, first) => Some((count.max(1), first.unwrap_or_default())),
        })
    }
}

/// A `keel` child on `log`, reaching the provider at `url` with `timeout_ms`, its output
/// dropped. A PostgreSQL URL goes by `KEEL_STORE`, never argv (it may hold a password).
pub(super) fn keel(log: &Log, url: &str, vault_key: Option<&str>, timeout_ms: u64) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    match log {
        Log::Sqlite(db) => {
            command.arg("--db").arg(db).env_remove("KEEL_STORE");
        }
        Log::Postgres(store) => {
            command.env("KEEL_STORE", store.url()).env_remove("KEEL_DB");
            command.args(["--lease-ttl-ms", &super::chaos::LEASE_TTL_MS.to_string()]);
        }
    }
    command
        .args(["--provider", url])
        .args(["--provider-timeout-ms", &timeout_ms.to_string()])
        .args(["--provider-consistency-window-ms", "0"])
        .env_remove("KEEL_FAILPOINT")
        // The simulator is sent the loopback test key, never the environment's.
        .env_remove("KEEL_STRIPE_SECRET_KEY")
        .env_remove("KEEL_LEASE_TTL_MS")
        .env_remove(crate::vault::KEY_ENV)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(key) = vault_key {
        command.env(crate::vault::KEY_ENV, key);
    }
    Ok(command)
}

/// `keel soak-worker --seed S --round R` on `log`.
pub(super) fn soak_worker(
    log: &Log,
    url: &str,
    vault_key: Option<&str>,
    seed: u64,
    round: u64,
) -> anyhow::Result<Command> {
    let mut command = keel(log, url, vault_key, WORKER_TIMEOUT_MS)?;
    command.args(["soak-worker", "--seed", &seed.to_string(), "--round", &round.to_string()]);
    Ok(command)
}

/// A throwaway vault key for one soak: 32 bytes of two random (v4) UUIDs, 244 bits from the
/// operating system's generator, base64 as `KEEL_VAULT_KEY` takes it. It lives in the
/// children's environment only, for the soak's own log.
fn soak_vault_key() -> String {
    use base64::Engine as _;
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    base64::engine::general_purpose::STANDARD.encode(bytes.as_slice())
}

/// Runs one heal child (`keel resume`, `keel reconcile …`, `keel charge …`) to its end.
fn heal_child(log: &Log, url: &str, vault_key: Option<&str>, args: &[&str]) -> anyhow::Result<()> {
    let mut command = keel(log, url, vault_key, HEAL_TIMEOUT_MS)?;
    command.args(args);
    let status = command.status().with_context(|| format!("run keel {args:?}"))?;
    anyhow::ensure!(status.code().is_some_and(|c| c == 0 || c == 2), "keel {args:?} ended with {status}");
    Ok(())
}

/// The heal: only what an operator runs, until nothing is left in flight — `keel resume`
/// (`keel worker --once` on PostgreSQL), `keel reconcile --due`, `keel reconcile KEY` for
/// what is still unknown, and without a vault `keel charge` again, with the token a caller
/// still holds, for a charge reserved and waiting for its caller.
fn heal(log: &Log, url: &str, vault_key: Option<&str>) -> anyhow::Result<()> {
    let resume: &[&str] = match log {
        // Every child may have been killed before it made the file: the heal's first makes it.
        Log::Sqlite(_) => &["resume", "--create"],
        Log::Postgres(_) => &["worker", "--once", "--poll-ms", "50"],
    };
    for _ in 0..HEAL_PASSES {
        heal_child(log, url, vault_key, resume)?;
        heal_child(log, url, vault_key, &["reconcile", "--due"])?;
        let ledger = log.ledger()?;
        let open: Vec<_> = ledger
            .intents()
            .into_iter()
            .filter(|i| !i.settled() && i.status != IntentStatus::AwaitingApproval)
            .collect();
        if open.is_empty() {
            break;
        }
        for intent in open {
            let key = intent.key().as_str();
            match intent.status {
                IntentStatus::OutcomeUnknown => heal_child(log, url, vault_key, &["reconcile", key])?,
                IntentStatus::Reserved if vault_key.is_none() && intent.definition.kind == EffectKind::Charge => {
                    // Exactly what was reserved (a worker may have proposed the bumped amount
                    // first): the same key and payload, and the token the caller still holds.
                    let d = &intent.definition;
                    let amount = d.amount_minor.to_string();
                    heal_child(
                        log,
                        url,
                        vault_key,
                        &[
                            "charge",
                            "--tenant",
                            &d.tenant,
                            "--intent-id",
                            &d.intent_id,
                            "--order",
                            &d.order_id,
                            "--amount-minor",
                            &amount,
                            "--currency",
                            &d.currency,
                            "--payment-method-token",
                            TOKEN,
                        ],
                    )?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Starts `command`, waits a seeded delay, SIGKILLs it. True when the kill hit a live process.
fn kill_after(mut command: Command, delay_ms: u64) -> anyhow::Result<bool> {
    let mut child = command.spawn().context("start a keel child")?;
    std::thread::sleep(Duration::from_millis(delay_ms));
    let alive = child.try_wait()?.is_none();
    if alive {
        child.kill().context("SIGKILL a keel child")?;
    }
    child.wait()?;
    Ok(alive)
}

/// What `keel soak` was asked.
#[derive(Clone, Debug)]
pub struct Args {
    /// SIGKILLs to deliver.
    pub kills: u64,
    /// The seed of the schedule, the workload and the fault plan.
    pub seed: u64,
    /// The caller's directory for its files (kept).
    pub dir: Option<PathBuf>,
    /// Keep the files (and the PostgreSQL database) even when every invariant held.
    pub keep: bool,
    /// A throwaway vault key for every child (SQLite only).
    pub vault: bool,
}

/// What the chaos of one soak did.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub kills: u64,
    pub recovery_kills: u64,
    pub stalls: u64,
    pub proxy_cuts: Option<Cuts>,
    pub worker_exits: u64,
    pub rounds: u64,
    /// What went wrong in the chaos itself (a worker that ended by itself, and why).
    pub details: Vec<String>,
}

/// The simulator's fault plan: every fault kind it has, on charges, refunds and lookups.
fn fault_plan(seed: u64) -> Value {
    json!({"seed": seed, "rules": [
        {"operation": "any", "fault": "timeout_after_effect", "probability": 0.08, "ms": WORKER_TIMEOUT_MS * 2},
        {"operation": "any", "fault": "slow", "probability": 0.04, "ms": WORKER_TIMEOUT_MS * 3 / 2},
        {"operation": "any", "fault": "unavailable", "probability": 0.05},
        {"operation": "any", "fault": "fail_before_effect", "probability": 0.05},
        {"operation": "charge", "fault": "decline", "probability": 0.03},
        {"operation": "lookup", "fault": "lookup_unavailable", "probability": 0.1},
        {"operation": "lookup", "fault": "lookup_lies", "probability": 0.05},
        {"operation": "lookup", "fault": "lookup_absent_for_ms", "ms": 100}
    ]})
}

/// `keel soak --kills N --seed S`, on SQLite (`postgres` is `None`) or in a fresh database
/// on the PostgreSQL server of `postgres`.
pub async fn run(out: &Output, postgres: Option<&PgUrl>, args: Args) -> anyhow::Result<u8> {
    let Args { kills, seed, dir, keep, vault } = args;
    if vault && postgres.is_some() {
        return Ok(out.usage_error("--vault keeps payment methods in a SQLite vault: it does not run on PostgreSQL"));
    }
    // A directory of the caller's is kept; a temporary one only with --keep or on failure.
    let keep = keep || dir.is_some();
    let vault_key = vault.then(soak_vault_key);
    let vault_key = vault_key.as_deref();
    let dir = match dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("keel-soak-{seed}-{}", uuid::Uuid::new_v4())),
    };
    std::fs::create_dir_all(&dir)?;
    let (log, database) = match postgres {
        None => (Log::Sqlite(dir.join("keel.db")), None),
        Some(server) => {
            let name = format!("keel_soak_{seed}_{}", uuid::Uuid::new_v4().simple());
            crate::wiring::postgres_blocking(|| store_postgres::admin::create_database(&server.url(), &name))
                .with_context(|| {
                    format!("cannot create the soak's database on {} (it needs CREATEDB)", server.server())
                })?;
            let url = server.with_database(&name);
            // Its schema is made once, before any child opens it.
            crate::wiring::postgres_blocking(|| crate::wiring::open_postgres(&url, Some(1)).map(|log| log.shutdown()))?;
            (Log::Postgres(url), Some((server.clone(), name)))
        }
    };
    let sim_db = dir.join("provider-sim.db");
    let sim = start_sim(&sim_db, Some(&fault_plan(seed)), Stdio::null())?;
    let mut rng = Rng::new(seed);
    let progress = out.progress(kills, "soak: kills");
    let counts = match &log {
        Log::Sqlite(_) => sqlite_rounds(&log, sim.url(), vault_key, &mut rng, kills, seed, &progress)?,
        Log::Postgres(url) => super::chaos::run(url, sim.url(), &dir, &mut rng, kills, seed, &progress)?,
    };
    progress.finish();
    drop(sim);

    // Heal: a healthy provider, then only what an operator would run.
    let sim = start_sim(&sim_db, None, Stdio::null())?;
    heal(&log, sim.url(), vault_key)?;
    drop(sim);
    let ok = report(
        out,
        &log,
        &sim_db,
        &dir,
        &counts,
        Flags { seed, vault, keep, database: database.as_ref().map(|(_, name)| name.as_str()) },
    )?;
    if ok && !keep {
        let _ = std::fs::remove_dir_all(&dir);
        if let Some((server, name)) = &database
            && let Err(error) =
                crate::wiring::postgres_blocking(|| store_postgres::admin::drop_database(&server.url(), name))
        {
            errln!("keel soak: could not drop its database {name}: {error}");
        }
    }
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

/// The SQLite rounds: one `keel soak-worker` a round, killed after a seeded delay; every
/// four rounds `keel resume`, killed half the time.
fn sqlite_rounds(
    log: &Log,
    url: &str,
    vault_key: Option<&str>,
    rng: &mut Rng,
    kills: u64,
    seed: u64,
    progress: &crate::output::Progress,
) -> anyhow::Result<Counts> {
    let mut counts = Counts::default();
    while counts.kills < kills {
        progress.set(counts.kills);
        if kill_after(soak_worker(log, url, vault_key, seed, counts.rounds)?, 5 + rng.below(KILL_DELAY_MAX_MS))? {
            counts.kills += 1;
        }
        counts.rounds += 1;
        if counts.rounds % 4 == 0 {
            let mut resume = keel(log, url, vault_key, WORKER_TIMEOUT_MS)?;
            resume.arg("resume");
            if rng.chance(0.5) && counts.kills < kills {
                if kill_after(resume, rng.below(KILL_DELAY_MAX_MS))? {
                    counts.kills += 1;
                    counts.recovery_kills += 1;
                }
            } else {
                resume.status().context("run keel resume")?;
            }
        }
    }
    Ok(counts)
}

/// What the report says about the soak itself.
struct Flags<'a> {
    seed: u64,
    vault: bool,
    /// Keep the directory even when every invariant held.
    keep: bool,
    database: Option<&'a str>,
}

/// Checks every invariant over the healed log and prints the report: whether all held.
fn report(
    out: &Output,
    log: &Log,
    sim_db: &Path,
    dir: &Path,
    counts: &Counts,
    flags: Flags<'_>,
) -> anyhow::Result<bool> {
    let Flags { seed, vault, keep, database } = flags;
    let events = log.events()?;
    let effects: Vec<Effect> = provider_sim::list_effects(sim_db)
        .with_context(|| format!("cannot read the simulator's effects in {}", sim_db.display()))?
        .iter()
        .map(Effect::from)
        .collect();
    let mut report = match log {
        Log::Sqlite(_) => invariants::check(&events, &effects),
        Log::Postgres(_) => invariants::check_per_stream(&events, &effects),
    };
    if let Some((count, first)) = log.verify()? {
        report.verify_failures += count;
        report.note(format!("verify: {first}"));
    }
    let crash_unknowns = events
        .iter()
        .filter(|e| matches!(&e.event, Event::OutcomeUnknown { reason: UnknownReason::Crash, .. }))
        .count() as u64;
    let fenced_late_answers =
        events.iter().filter(|e| matches!(&e.event, Event::LateAnswerRecorded { .. })).count() as u64;
    let ledger = log.ledger()?;
    let mut lost_answers = 0;
    for effect in &effects {
        let kept = engine::event::IntentKey::parse(&effect.idempotency_key)
            .and_then(|key| ledger.intent(&key))
            .is_some_and(engine::ledger::Intent::money_committed);
        if !kept {
            lost_answers += 1;
            report.note(format!("{}: an effect at the provider whose intent let its money go", effect.idempotency_key));
        }
    }
    let mut statuses = std::collections::BTreeMap::new();
    let mut unresolved = 0;
    for intent in ledger.intents() {
        *statuses.entry(intent.status.as_str().to_owned()).or_insert(0) += 1;
        if !intent.settled() && intent.status != IntentStatus::AwaitingApproval {
            unresolved += 1;
        }
    }
    let postgres = matches!(log, Log::Postgres(_));
    // With the vault, or on PostgreSQL where the heal re-submits, nothing may be left waiting.
    let ok =
        report.is_ok() && lost_answers == 0 && counts.worker_exits == 0 && (!(vault || postgres) || unresolved == 0);
    let mut details = counts.details.clone();
    details.extend(report.details.iter().cloned());
    let soak = SoakReport {
        seed,
        store: if postgres { "postgres" } else { "sqlite" },
        kills: counts.kills,
        recovery_kills: counts.recovery_kills,
        stalls: counts.stalls,
        proxy_cuts: counts.proxy_cuts,
        worker_exits: counts.worker_exits,
        rounds: counts.rounds,
        intents: report.intents,
        effects: report.effects,
        events: report.events,
        crash_unknowns,
        double_effects: report.double_effects,
        key_mismatches: report.key_mismatches,
        write_ahead_violations: report.write_ahead_violations,
        blind_resends: report.blind_resends,
        budget_refills: report.budget_refills,
        refund_overdraws: report.refund_overdraws,
        unreconciled: report.unreconciled,
        lost_answers,
        fenced_late_answers,
        vault,
        unresolved,
        verify_failures: report.verify_failures,
        evidence_mismatches: report.evidence_mismatches,
        statuses,
        ok,
        details,
        dir: dir.to_owned(),
        database: database.map(str::to_owned),
    };
    out.emit(&soak, || print_report(&soak, keep));
    Ok(soak.ok)
}

fn print_report(soak: &SoakReport, keep: bool) {
    let during = if soak.store == "postgres" { "of keel worker" } else { "during recovery" };
    outln!(
        "soak seed {} on {}: {} kills ({} {during}) over {} rounds, {} intents, {} effects, {} events, \
         {} attempts caught in flight, {} late answers kept from fenced workers",
        soak.seed,
        soak.store,
        soak.kills,
        soak.recovery_kills,
        soak.rounds,
        soak.intents,
        soak.effects,
        soak.events,
        soak.crash_unknowns,
        soak.fenced_late_answers
    );
    if let Some(cuts) = &soak.proxy_cuts {
        outln!(
            "  connections cut: {} mid-transaction, {} instead of COMMIT, {} after COMMIT; {} partitions past the \
             lease; {} workers stalled past their lease; {} workers ended by themselves",
            cuts.mid_transaction,
            cuts.before_commit,
            cuts.after_commit,
            cuts.partitions,
            soak.stalls,
            soak.worker_exits
        );
    }
    outln!(
        "  double_effects {}  lost_answers {}  budget_refills {}  unreconciled {}  unresolved {}{}  verify_failures {}  \
         blind_resends {}  write_ahead_violations {}  refund_overdraws {}  key_mismatches {}  evidence_mismatches {}",
        soak.double_effects,
        soak.lost_answers,
        soak.budget_refills,
        soak.unreconciled,
        soak.unresolved,
        if soak.vault { " (vault on)" } else { "" },
        soak.verify_failures,
        soak.blind_resends,
        soak.write_ahead_violations,
        soak.refund_overdraws,
        soak.key_mismatches,
        soak.evidence_mismatches
    );
    outln!("  statuses {:?}", soak.statuses);
    soak.details.iter().for_each(|d| outln!("  ✘ {d}"));
    let files = if soak.ok && !keep { "its files removed; --keep keeps them" } else { "files kept" };
    let database = soak.database.as_deref().map(|name| format!(", database {name}")).unwrap_or_default();
    outln!(
        "{} ({files} in {}{database})",
        if soak.ok { "every invariant held" } else { "INVARIANTS BROKEN" },
        soak.dir.display()
    );
}
