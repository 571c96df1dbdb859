//! `keel demo`: Keel's promises, shown end to end against real processes.
//!
//! Owns the demo script. It starts the provider simulator as a child process (restarting it
//! with a different fault plan between scenes: its state is durable), runs charges and
//! refunds in-process, runs one charge in a child `keel` worker that it kills with SIGKILL
//! mid-attempt, recovers with `resume`, and checks every expectation against the log and the
//! simulator's own count of effects. It exits 0 only when every expectation held.

use super::start_sim;
use crate::output::Output;
use crate::wiring::Node;
use crate::{ProviderArgs, exit};
use anyhow::{Context as _, bail};
use engine::event::{Cause, IntentKey, RunId, RunLimits};
use engine::executor::{IntentOutcome, RunOutcome, RunRequest};
use engine::provider::EffectKind;
use provider_sim::Process;
use serde::Serialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

const TOKEN: &str = "pm_demo_card_visa_4242424242";

/// One checked expectation.
#[derive(Debug, Serialize)]
struct Scene {
    scene: &'static str,
    intent_key: String,
    expected: String,
    got: String,
    effects_at_provider: usize,
    ok: bool,
}

/// The simulator at `url`, spoken to in Stripe's API with the public loopback test key
/// (whatever key the environment holds: the demo never sends one to its simulator).
fn provider_args(url: &str, timeout_ms: u64) -> ProviderArgs {
    let key = adapters::stripe::SecretKey::parse(adapters::stripe::LOOPBACK_TEST_KEY)
        .map(std::sync::Arc::new)
        .map_err(|e| e.to_string());
    ProviderArgs {
        url: Some(url.to_owned()),
        key,
        tier: "dedup+lookup".to_owned(),
        consistency_window_ms: 500,
        timeout_ms,
        rate_per_s: None,
    }
}

fn charge_input(intent_id: &str, order: &str, amount_minor: i64) -> Value {
    json!({
        "tenant_id": TENANT, "intent_id": intent_id, "order_id": order,
        "amount_minor": amount_minor, "currency": "EUR", "payment_method_token": TOKEN,
    })
}

fn refund_input(intent_id: &str, order: &str, amount_minor: i64) -> Value {
    json!({"tenant_id": TENANT, "intent_id": intent_id, "order_id": order, "amount_minor": amount_minor, "currency": "EUR"})
}

fn request(workflow: &str) -> RunRequest {
    RunRequest {
        run_id: RunId::new(uuid::Uuid::new_v4().to_string()),
        limits: RunLimits::default(),
        deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
        cause: Cause::command(&format!("demo {workflow}")),
    }
}

struct Demo {
    db: PathBuf,
    sim_db: PathBuf,
    scenes: Vec<Scene>,
    human: bool,
}

impl Demo {
    /// The simulator, serving the demo's provider state with `plan`: its state is durable,
    /// so the demo restarts it between scenes to change the plan.
    fn sim(&self, plan: Option<Value>) -> anyhow::Result<Process> {
        start_sim(&self.sim_db, plan.as_ref(), Stdio::inherit())
    }

    fn effects(&self, key: &IntentKey) -> anyhow::Result<usize> {
        let effects = provider_sim::list_effects(&self.sim_db)?;
        Ok(effects.iter().filter(|e| e.idempotency_key == key.as_str()).count())
    }

    /// Records a scene: `got` must equal `expected` and the provider must hold exactly
    /// `expected_effects` effects for `key`.
    fn check(
        &mut self,
        scene: &'static str,
        key: &IntentKey,
        expected: &str,
        got: String,
        expected_effects: usize,
    ) -> anyhow::Result<()> {
        let effects = self.effects(key)?;
        let ok = got == expected && effects == expected_effects;
        if self.human {
            outln!(
                "{} {scene}\n    {key}\n    expected {expected}, got {got}; effects at the provider: {effects}",
                if ok { "✔" } else { "✘" }
            );
        }
        self.scenes.push(Scene {
            scene,
            intent_key: key.to_string(),
            expected: expected.to_owned(),
            got,
            effects_at_provider: effects,
            ok,
        });
        Ok(())
    }

    async fn run_effect(
        &self,
        sim: &Process,
        workflow: &str,
        input: &Value,
        timeout_ms: u64,
    ) -> anyhow::Result<String> {
        let node = Node::open(&self.db, store::Durability::Full, &provider_args(sim.url(), timeout_ms), None)?;
        let outcome = node.executor.start(workflow, input, request(workflow)).await?;
        node.shutdown()?;
        Ok(describe(&outcome))
    }
}

/// An outcome as the demo's expectations spell it: `validated (provider)`, `rejected
/// (intent_payload_mismatch)`, `outcome_unknown`…
fn describe(outcome: &RunOutcome) -> String {
    match (&outcome.intent, &outcome.rejection) {
        (Some(intent), _) => describe_intent(intent),
        (None, Some(rejection)) => format!("rejected ({})", rejection.code.as_str()),
        (None, None) => outcome.status.as_str().to_owned(),
    }
}

fn describe_intent(intent: &IntentOutcome) -> String {
    match (intent.source, &intent.code) {
        (Some(source), _) => format!("{} ({})", intent.status.as_str(), source.as_str()),
        (None, Some(code)) => format!("{} ({})", intent.status.as_str(), code.as_str()),
        (None, None) => intent.status.as_str().to_owned(),
    }
}

/// Runs the demo. Its temporary directory is removed when every promise held, unless
/// `keep`; a `dir` of the caller's is always kept.
pub async fn run(out: &Output, dir: Option<PathBuf>, keep: bool) -> anyhow::Result<u8> {
    let keep = keep || dir.is_some();
    let dir = match dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            dir
        }
        None => std::env::temp_dir().join(format!("keel-demo-{}", uuid::Uuid::new_v4())),
    };
    std::fs::create_dir_all(&dir)?;
    let mut demo =
        Demo { db: dir.join("keel.db"), sim_db: dir.join("provider-sim.db"), scenes: Vec::new(), human: !out.json };
    if demo.human {
        let kept = if keep { "kept" } else { "removed at the end unless a promise fails (--keep keeps them)" };
        outln!("Keel demo — files in {} ({kept})\n", dir.display());
    }
    let key = |kind, id: &str| IntentKey::new(kind, TENANT, id);

    // 1–3: a charge, the same charge again, the same key with another amount.
    let sim = demo.sim(None)?;
    let first = charge_input("order_1842_charge", "order_1842", 4900);
    let got = demo.run_effect(&sim, "charge", &first, 5_000).await?;
    demo.check("a charge of 49.00 EUR", &key(EffectKind::Charge, "order_1842_charge"), "validated (provider)", got, 1)?;
    let got = demo.run_effect(&sim, "charge", &first, 5_000).await?;
    demo.check(
        "the same charge of 49.00 EUR re-submitted",
        &key(EffectKind::Charge, "order_1842_charge"),
        "validated (deduplicated)",
        got,
        1,
    )?;
    let got = demo.run_effect(&sim, "charge", &charge_input("order_1842_charge", "order_1842", 9900), 5_000).await?;
    demo.check(
        "the same key with another amount (99.00 EUR) — nothing written",
        &key(EffectKind::Charge, "order_1842_charge"),
        "rejected (intent_payload_mismatch)",
        got,
        1,
    )?;
    drop(sim);

    // 4: the provider takes the money but the answer is lost.
    let sim = demo.sim(Some(
        json!({"seed": 4, "rules": [{"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 5000}]}),
    ))?;
    let lost = key(EffectKind::Charge, "order_1900_charge");
    let got = demo.run_effect(&sim, "charge", &charge_input("order_1900_charge", "order_1900", 2500), 800).await?;
    demo.check("a charge of 25.00 EUR whose answer is lost (timeout after effect)", &lost, "outcome_unknown", got, 1)?;
    let node = Node::open(&demo.db, store::Durability::Full, &provider_args(sim.url(), 5_000), None)?;
    let reconciled = node.executor.reconcile(&lost, Cause::command("demo reconcile")).await?;
    node.shutdown()?;
    let got = describe_intent(&reconciled);
    demo.check("… then `keel reconcile` looks the 25.00 EUR up by its key", &lost, "validated (reconciled)", got, 1)?;
    drop(sim);

    // 5: a worker process killed with SIGKILL mid-attempt, recovered by `resume`.
    let sim = demo
        .sim(Some(json!({"seed": 5, "rules": [{"operation": "charge", "fault": "slow", "times": 1, "ms": 3000}]})))?;
    let killed = key(EffectKind::Charge, "order_2001_charge");
    kill_worker_mid_attempt(&demo.db, sim.url(), &killed).await?;
    let left = store::Reader::open(&demo.db)?
        .intent_state(&killed)?
        .map_or_else(|| "no intent".to_owned(), |intent| intent.status.as_str().to_owned());
    demo.check(
        "a `keel charge` of 15.00 EUR killed with SIGKILL while its attempt was in flight",
        &killed,
        "attempting",
        left,
        1,
    )?;
    let node = Node::open(&demo.db, store::Durability::Full, &provider_args(sim.url(), 5_000), None)?;
    let report = node.executor.recover_and_resume(Cause::command("demo resume")).await?;
    node.shutdown()?;
    let recovered = report.recovered.iter().any(|k| k.as_str() == killed.as_str());
    let ledger = store::Reader::open(&demo.db)?.ledger()?;
    let got = match ledger.intent(&killed) {
        Some(intent) => match intent.source {
            Some(engine::event::Source::Reconciled) => format!("{} (reconciled)", intent.status.as_str()),
            Some(engine::event::Source::Provider) => format!("{} (provider)", intent.status.as_str()),
            None => intent.status.as_str().to_owned(),
        },
        None => "no intent".to_owned(),
    };
    let got = if recovered { got } else { format!("{got} (not recovered as crash)") };
    demo.check(
        "… then `keel resume`: the crash recorded as outcome_unknown, the 15.00 EUR reconciled",
        &killed,
        "validated (reconciled)",
        got,
        1,
    )?;
    drop(sim);

    // 6: refunds, bounded by the amount charged.
    let sim = demo.sim(None)?;
    let got = demo.run_effect(&sim, "refund", &refund_input("order_1842_refund_1", "order_1842", 4000), 5_000).await?;
    demo.check(
        "a refund of 40.00 EUR on the 49.00 EUR order",
        &key(EffectKind::Refund, "order_1842_refund_1"),
        "validated (provider)",
        got,
        1,
    )?;
    let got = demo.run_effect(&sim, "refund", &refund_input("order_1842_refund_2", "order_1842", 2000), 5_000).await?;
    demo.check(
        "a second refund of 20.00 EUR (would exceed 49.00 EUR)",
        &key(EffectKind::Refund, "order_1842_refund_2"),
        "rejected (invariant_violated)",
        got,
        0,
    )?;
    drop(sim);

    let reader = store::Reader::open(&demo.db)?;
    let verify = reader.verify()?;
    let all_ok = demo.scenes.iter().all(|s| s.ok) && verify.is_ok();
    let document = json!({"ok": all_ok, "dir": dir, "scenes": demo.scenes, "verify": verify});
    out.emit(&crate::output::name_intent_keys(document), || {
        outln!(
            "\n{} `keel verify`: {} events, hash chain and projections {}",
            if verify.is_ok() { "✔" } else { "✘" },
            verify.events,
            verify.first_mismatch().map_or_else(|| "intact".to_owned(), ToString::to_string)
        );
        outln!("\n{}.", if all_ok { "Every promise held" } else { "SOME EXPECTATIONS FAILED" });
        if keep || !all_ok {
            outln!("Inspect the log with `keel --db {0} intents`, then `keel --db {0} show KEY`.", demo.db.display());
        } else {
            outln!(
                "Its files were removed; `keel demo --keep` keeps them to inspect with `keel --db DIR/keel.db intents`."
            );
        }
    });
    if all_ok && !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(if all_ok { exit::OK } else { exit::INTERNAL })
}

/// Starts `keel charge` as a child process against a slow provider, waits until its
/// `AttemptStarted` is durable and the request is in flight, then kills it with SIGKILL.
async fn kill_worker_mid_attempt(db: &Path, url: &str, key: &IntentKey) -> anyhow::Result<()> {
    let mut worker = Command::new(std::env::current_exe()?)
        .args(["--db"])
        .arg(db)
        .args(["--provider", url, "--provider-timeout-ms", "10000", "--json", "charge"])
        // The simulator is sent the loopback test key, never the environment's.
        .env_remove("KEEL_STRIPE_SECRET_KEY")
        .args(["--tenant", TENANT, "--intent-id", "order_2001_charge", "--order", "order_2001"])
        .args(["--amount-minor", "1500", "--currency", "EUR", "--payment-method-token", TOKEN])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the worker")?;
    let started = Instant::now();
    loop {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = worker.kill();
            bail!("the worker never started its attempt");
        }
        if let Some(status) = worker.try_wait()? {
            bail!("the worker exited ({status}) before it could be killed");
        }
        let attempted = store::Reader::open(db)
            .and_then(|r| r.stream(&key.stream()))
            .map(|events| events.iter().any(|e| e.event.type_name() == "AttemptStarted"))
            .unwrap_or(false);
        if attempted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // AttemptStarted is durable; give the request time to reach the provider (which holds
    // its answer for 3 s after committing the effect), then kill without warning.
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.kill().context("SIGKILL the worker")?;
    worker.wait()?;
    Ok(())
}
