//! `keel bench`: the charge workflow end to end at full durability.
//!
//! Owns the benchmark driver: N charges from C concurrent callers through the real store
//! (group commit, fsync per commit at `full`) against an in-process zero-latency provider,
//! then every charge re-submitted to check that no new effect happens. It reports
//! throughput, latency percentiles and commits (fsyncs) per intent. Nothing here is
//! asserted as a timing; it only measures.

use crate::exit;
use crate::output::Output;
use crate::wiring::Node;
use engine::event::{Cause, RunId, RunLimits};
use engine::executor::{IntentOutcome, RunRequest, ValidatedBy};
use engine::memory::MemoryProvider;
use serde::Serialize;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The benchmark's figures.
#[derive(Debug, Serialize)]
struct Report {
    intents: usize,
    concurrency: usize,
    durability: String,
    seconds: f64,
    intents_per_s: f64,
    events: u64,
    events_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    commits: u64,
    fsyncs_per_intent: f64,
    validated: usize,
    resubmitted_deduplicated: usize,
    effects_after_first_pass: usize,
    effects_after_resubmission: usize,
}

/// Runs the benchmark in a fresh database next to `db` (never in it).
pub async fn run(
    out: &Output,
    db: &Path,
    durability: store::Durability,
    intents: usize,
    concurrency: usize,
) -> anyhow::Result<u8> {
    if intents == 0 || concurrency == 0 {
        return Ok(out.usage_error("--intents and --concurrency must be at least 1"));
    }
    let dir = db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let bench_db = dir.join(format!("keel-bench-{}.db", uuid::Uuid::new_v4()));
    let provider = Arc::new(MemoryProvider::new(adapters::provider_http::stripe_like()));
    let node = Arc::new(Node::with_provider(&bench_db, durability, provider.clone(), None)?);
    let inputs: Arc<Vec<serde_json::Value>> = Arc::new(
        (0..intents)
            .map(|i| {
                json!({
                    "tenant_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
                    "intent_id": format!("bench_intent_{i:08}"),
                    "order_id": format!("order_{i:08}"),
                    "amount_minor": 1000 + (i % 9000) as i64,
                    "currency": "EUR",
                    "payment_method_token": "pm_bench_token_0123456789",
                })
            })
            .collect(),
    );

    let (first, latencies, seconds) = pass(&node, &inputs, concurrency, Expect::Validated).await?;
    let stats = node.store.stats();
    let effects_first = provider.effect_count();
    let (deduplicated, _, _) = pass(&node, &inputs, concurrency, Expect::Deduplicated).await?;
    let effects_after = provider.effect_count();
    node.shutdown()?;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", bench_db.display()));
    }

    let mut sorted = latencies;
    sorted.sort();
    let percentile = |p: f64| {
        sorted.get(((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let report = Report {
        intents,
        concurrency,
        durability: format!("{durability:?}").to_lowercase(),
        seconds,
        intents_per_s: intents as f64 / seconds,
        events: stats.events,
        events_per_s: stats.events as f64 / seconds,
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        commits: stats.commits,
        fsyncs_per_intent: stats.commits as f64 / intents as f64,
        validated: first,
        resubmitted_deduplicated: deduplicated,
        effects_after_first_pass: effects_first,
        effects_after_resubmission: effects_after,
    };
    let ok = first == intents && deduplicated == intents && effects_first == intents && effects_after == effects_first;
    out.emit(&report, || {
        println!("keel bench: {intents} charges, concurrency {concurrency}, durability {}", report.durability);
        println!(
            "  {:.0} intents/s, {:.0} events/s over {:.2} s",
            report.intents_per_s, report.events_per_s, report.seconds
        );
        println!("  latency p50 {:.2} ms, p99 {:.2} ms", report.p50_ms, report.p99_ms);
        println!(
            "  {} commits = {:.3} fsyncs per intent ({} events)",
            report.commits, report.fsyncs_per_intent, report.events
        );
        println!(
            "  re-submission: {deduplicated}/{intents} deduplicated, effects {effects_first} → {effects_after} {}",
            if ok { "(no new effect)" } else { "(MISMATCH)" }
        );
    });
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

/// What a pass expects of every outcome.
#[derive(Clone, Copy)]
enum Expect {
    /// Validated (the first pass: a new effect each).
    Validated,
    /// Returned as the stored result (the re-submission pass: no new effect).
    Deduplicated,
}

impl Expect {
    fn matches(self, outcome: &IntentOutcome) -> bool {
        match self {
            Self::Validated => outcome.is_validated(),
            Self::Deduplicated => outcome.source == Some(ValidatedBy::Deduplicated),
        }
    }
}

/// Runs every input once from `concurrency` callers; counts the outcomes that meet `expect`.
async fn pass(
    node: &Arc<Node>,
    inputs: &Arc<Vec<serde_json::Value>>,
    concurrency: usize,
    expect: Expect,
) -> anyhow::Result<(usize, Vec<Duration>, f64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (node, inputs, next) = (node.clone(), inputs.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut matched = 0;
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(input) = inputs.get(i) else { break };
                let request = RunRequest {
                    run_id: RunId::new(uuid::Uuid::new_v4().to_string()),
                    limits: RunLimits::default(),
                    deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
                    cause: Cause::command("bench"),
                };
                let began = Instant::now();
                let outcome = node.executor.start("charge", input, request).await?;
                latencies.push(began.elapsed());
                if outcome.intent.as_ref().is_some_and(|intent| expect.matches(intent)) {
                    matched += 1;
                }
            }
            anyhow::Ok((matched, latencies))
        }));
    }
    let mut matched = 0;
    let mut latencies = Vec::new();
    for worker in workers {
        let (m, l) = worker.await??;
        matched += m;
        latencies.extend(l);
    }
    Ok((matched, latencies, started.elapsed().as_secs_f64()))
}
