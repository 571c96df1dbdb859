//! `keel soak`: real process kills under load, then Keel's invariants.
//!
//! Owns the soak loop. It starts the provider simulator as a child process with a seeded
//! fault plan (lost answers, 5xx, declines, lying and unavailable lookups), then, round after
//! round, starts a `keel soak-worker` child that runs a small batch of charges and refunds
//! concurrently (drawn from a shared pool of keys, so some collide, some re-use a key with
//! another amount, some refunds overdraw), and SIGKILLs it after a seeded delay. Every few
//! rounds it starts `keel resume` and sometimes kills that too (a crash during recovery).
//! Then it heals: restarts the simulator without faults, resumes, re-submits every charge
//! (the token is never stored) and forces a reconciliation of whatever is still unknown, for
//! a bounded number of passes. With `--vault` every child gets a throwaway vault key and the
//! heal re-submits nothing: it is only `keel resume`, `keel reconcile --due` and `keel
//! reconcile KEY` child processes, as an operator would run them, and every intent must end
//! resolved. Finally it checks every invariant over the log and the simulator's effects
//! (`testkit::invariants`) and prints the report. Exit 0 only when no invariant broke.

use super::start_sim;
use crate::output::Output;
use crate::wiring::Node;
use crate::{ProviderArgs, exit};
use anyhow::Context as _;
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::RunRequest;
use engine::ledger::IntentStatus;
use provider_sim::Rng;
use serde::Serialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const TENANT: &str = "5b2d6c1a-8e3f-4a7b-9c0d-1e2f3a4b5c6d";
const TOKEN: &str = "pm_soak_card_visa_4242424242";
/// Intents per worker round: small, so a kill is cheap and lands mid-batch.
pub const ROUND_INTENTS: u64 = 8;
/// Longest wait before a kill, in ms: a debug worker starts, opens its log and runs its
/// batch in 10–60 ms, so kills land before, during and (rarely) after its attempts.
const KILL_DELAY_MAX_MS: u64 = 60;
/// Heal passes before an unknown outcome counts as left unreconciled.
const HEAL_PASSES: usize = 6;
/// The provider timeout of workers: shorter than the simulator's held answers.
const WORKER_TIMEOUT_MS: u64 = 200;
/// The provider timeout while healing: the healthy simulator answers at once.
const HEAL_TIMEOUT_MS: u64 = 5_000;

/// The invariant report of a soak.
#[derive(Debug, Serialize)]
struct SoakReport {
    seed: u64,
    kills: u64,
    recovery_kills: u64,
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
    /// Whether the children kept payment methods in a vault (`--vault`).
    vault: bool,
    /// Intents left neither final nor awaiting a human's approval after healing: reserved,
    /// in flight or unknown. Must be 0 with the vault (nothing waits for a caller).
    unresolved: u64,
    verify_failures: u64,
    evidence_mismatches: u64,
    statuses: std::collections::BTreeMap<String, u64>,
    details: Vec<String>,
    ok: bool,
    dir: PathBuf,
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
        attempts_per_intent_max: engine::limits::ATTEMPTS_PER_INTENT_DEFAULT,
        reconciliations_per_intent_max: engine::limits::RECONCILIATIONS_PER_INTENT_DEFAULT,
        approval_threshold_minor: None,
        policy: None,
        network_retries_max: None,
        reconciliations_max: None,
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
pub async fn worker(node: &Node, seed: u64, round: u64) -> anyhow::Result<u8> {
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

fn keel(db: &Path, url: &str, vault_key: Option<&str>, timeout_ms: u64) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("--db")
        .arg(db)
        .args(["--provider", url])
        .args(["--provider-timeout-ms", &timeout_ms.to_string()])
        .args(["--provider-consistency-window-ms", "0"])
        .env_remove("KEEL_FAILPOINT")
        .env_remove(crate::vault::KEY_ENV)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(key) = vault_key {
        command.env(crate::vault::KEY_ENV, key);
    }
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

/// Runs one heal child (`keel resume`, `keel reconcile …`) to its end.
fn heal_child(db: &Path, url: &str, vault_key: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut command = keel(db, url, Some(vault_key), HEAL_TIMEOUT_MS)?;
    command.args(args);
    let status = command.status().with_context(|| format!("run keel {args:?}"))?;
    anyhow::ensure!(status.code().is_some_and(|c| c == 0 || c == 2), "keel {args:?} ended with {status}");
    Ok(())
}

/// The heal with the vault: only what an operator runs — `keel resume`, `keel reconcile
/// --due`, and `keel reconcile KEY` for what is still unknown — never a re-submission.
fn heal_with_vault(db: &Path, url: &str, vault_key: &str) -> anyhow::Result<()> {
    for _ in 0..HEAL_PASSES {
        heal_child(db, url, vault_key, &["resume"])?;
        heal_child(db, url, vault_key, &["reconcile", "--due"])?;
        let ledger = store::Reader::open(db)?.ledger()?;
        let unknown: Vec<String> = ledger
            .intents()
            .into_iter()
            .filter(|i| i.status == IntentStatus::OutcomeUnknown)
            .map(|i| i.key().as_str().to_owned())
            .collect();
        let reserved = ledger.intents().iter().any(|i| i.status == IntentStatus::Reserved);
        if unknown.is_empty() && !reserved {
            break;
        }
        for key in &unknown {
            heal_child(db, url, vault_key, &["reconcile", key])?;
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

/// `keel soak --kills N --seed S`.
pub async fn run(
    out: &Output,
    kills: u64,
    seed: u64,
    dir: Option<PathBuf>,
    keep: bool,
    vault: bool,
) -> anyhow::Result<u8> {
    // A directory of the caller's is kept; a temporary one only with --keep or on failure.
    let keep = keep || dir.is_some();
    let vault_key = vault.then(soak_vault_key);
    let vault_key = vault_key.as_deref();
    let dir = match dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("keel-soak-{seed}-{}", uuid::Uuid::new_v4())),
    };
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("keel.db");
    let sim_db = dir.join("provider-sim.db");
    let plan = json!({"seed": seed, "rules": [
        {"operation": "any", "fault": "timeout_after_effect", "probability": 0.08, "ms": WORKER_TIMEOUT_MS * 2},
        {"operation": "any", "fault": "unavailable", "probability": 0.05},
        {"operation": "any", "fault": "fail_before_effect", "probability": 0.05},
        {"operation": "charge", "fault": "decline", "probability": 0.03},
        {"operation": "lookup", "fault": "lookup_unavailable", "probability": 0.1},
        {"operation": "lookup", "fault": "lookup_lies", "probability": 0.05},
        {"operation": "lookup", "fault": "lookup_absent_for_ms", "ms": 100}
    ]});
    let sim = start_sim(&sim_db, Some(&plan), Stdio::null())?;
    let mut rng = Rng::new(seed);
    let (mut killed, mut recovery_kills, mut round) = (0u64, 0u64, 0u64);
    let progress = out.progress(kills, "soak: kills");
    while killed < kills {
        progress.set(killed);
        let mut worker = keel(&db, sim.url(), vault_key, WORKER_TIMEOUT_MS)?;
        worker.args(["soak-worker", "--seed", &seed.to_string(), "--round", &round.to_string()]);
        if kill_after(worker, 5 + rng.below(KILL_DELAY_MAX_MS))? {
            killed += 1;
        }
        round += 1;
        if round % 4 == 0 {
            let mut resume = keel(&db, sim.url(), vault_key, WORKER_TIMEOUT_MS)?;
            resume.arg("resume");
            if rng.chance(0.5) && killed < kills {
                if kill_after(resume, rng.below(KILL_DELAY_MAX_MS))? {
                    killed += 1;
                    recovery_kills += 1;
                }
            } else {
                resume.status().context("run keel resume")?;
            }
        }
    }
    progress.finish();
    drop(sim);

    // Heal: a healthy provider, recovery, re-submissions, forced reconciliations.
    let sim = start_sim(&sim_db, None, Stdio::null())?;
    match vault_key {
        Some(key) => heal_with_vault(&db, sim.url(), key)?,
        None => heal_by_resubmitting(&db, sim.url(), seed).await?,
    }
    drop(sim);
    report(out, &db, &sim_db, &dir, Counts { seed, kills: killed, recovery_kills, rounds: round, vault, keep })
}

/// The heal without the vault: recovery, re-submissions of what waits for its caller (the
/// token a caller still holds), forced reconciliations of what is unknown.
async fn heal_by_resubmitting(db: &Path, url: &str, seed: u64) -> anyhow::Result<()> {
    let db = db.to_owned();
    let provider = ProviderArgs {
        url: Some(url.to_owned()),
        tier: "dedup+lookup".to_owned(),
        consistency_window_ms: 0,
        timeout_ms: HEAL_TIMEOUT_MS,
    };
    for _ in 0..HEAL_PASSES {
        let node = Node::open(&db, store::Durability::Full, &provider, None)?;
        node.executor.recover_and_resume(Cause::command("soak heal")).await?;
        let ledger = store::Reader::open(&db)?.ledger()?;
        let open: Vec<IntentKey> = ledger
            .intents()
            .into_iter()
            .filter(|i| matches!(i.status, IntentStatus::OutcomeUnknown | IntentStatus::Reserved))
            .map(|i| i.key().clone())
            .collect();
        if open.is_empty() {
            node.shutdown()?;
            break;
        }
        for key in &open {
            let intent = ledger.intent(key).expect("listed from this ledger");
            if intent.status == IntentStatus::OutcomeUnknown {
                node.executor.reconcile(key, Cause::command("soak heal")).await?;
            }
            let after = store::Reader::open(&db)?.ledger()?;
            if key.as_str().starts_with("charge:")
                && after.intent(key).is_some_and(|i| i.status == IntentStatus::Reserved)
                && let Some(n) = pool_index(key)
            {
                // Re-submit exactly what was reserved (a worker may have proposed the bumped
                // amount first): same key, same payload, and the token a caller still holds.
                let bump = intent.definition.amount_minor - (1_000 + (n % 50) as i64 * 10);
                node.executor.start("charge", &charge_input(seed, n, bump), request("charge")).await?;
            }
        }
        node.shutdown()?;
    }
    Ok(())
}

/// What the soak loop counted.
struct Counts {
    seed: u64,
    kills: u64,
    recovery_kills: u64,
    rounds: u64,
    vault: bool,
    /// Keep the directory even when every invariant held.
    keep: bool,
}

/// Checks every invariant over the healed log and prints the report.
fn report(out: &Output, db: &Path, sim_db: &Path, dir: &Path, counts: Counts) -> anyhow::Result<u8> {
    let Counts { seed, kills: killed, recovery_kills, rounds: round, vault, keep } = counts;
    let report = testkit::invariants::check_files(db, sim_db).map_err(|e| anyhow::anyhow!("{e}"))?;
    let reader = store::Reader::open(db)?;
    let crash_unknowns = reader
        .events_since(0)?
        .iter()
        .filter(|e| {
            matches!(
                &e.event,
                engine::event::Event::OutcomeUnknown { reason: engine::provider::UnknownReason::Crash, .. }
            )
        })
        .count() as u64;
    let ledger = reader.ledger()?;
    let mut statuses = std::collections::BTreeMap::new();
    let mut unresolved = 0;
    for intent in ledger.intents() {
        *statuses.entry(intent.status.as_str().to_owned()).or_insert(0) += 1;
        if !intent.settled() && intent.status != IntentStatus::AwaitingApproval {
            unresolved += 1;
        }
    }
    // With the vault nothing may be left waiting for a caller.
    let ok = report.is_ok() && (!vault || unresolved == 0);
    let soak = SoakReport {
        seed,
        kills: killed,
        recovery_kills,
        rounds: round,
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
        vault,
        unresolved,
        verify_failures: report.verify_failures,
        evidence_mismatches: report.evidence_mismatches,
        statuses,
        ok,
        details: report.details.clone(),
        dir: dir.to_owned(),
    };
    out.emit(&soak, || {
        outln!(
            "soak seed {seed}: {} kills ({} during recovery) over {} rounds, {} intents, {} effects, {} events, \
             {} attempts caught in flight",
            soak.kills,
            soak.recovery_kills,
            soak.rounds,
            soak.intents,
            soak.effects,
            soak.events,
            soak.crash_unknowns
        );
        outln!(
            "  double_effects {}  budget_refills {}  unreconciled {}  unresolved {}{}  verify_failures {}  \
             blind_resends {}  write_ahead_violations {}  refund_overdraws {}  key_mismatches {}  evidence_mismatches {}",
            soak.double_effects,
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
        outln!("{} ({files} in {})", if soak.ok { "every invariant held" } else { "INVARIANTS BROKEN" }, dir.display());
    });
    if soak.ok && !keep {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(if soak.ok { exit::OK } else { exit::INTERNAL })
}

/// The pool index `n` of a soak charge key `charge:TENANT:soak_SEED_NNNNNN_charge`.
fn pool_index(key: &IntentKey) -> Option<u64> {
    let id = key.as_str().rsplit(':').next()?;
    id.strip_suffix("_charge")?.rsplit('_').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::provider::EffectKind;

    #[test]
    fn a_pool_key_names_its_index() {
        let key = IntentKey::new(EffectKind::Charge, TENANT, "soak_7_000042_charge");
        assert_eq!(pool_index(&key), Some(42));
    }
}
