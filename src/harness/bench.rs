//! `keel bench`: the charge workflow end to end at full durability.
//!
//! Owns the benchmark driver: N charges from C concurrent callers through the real store
//! (group commit, fsync per commit at `full`) against an in-process zero-latency provider,
//! then every charge re-submitted to check that no new effect happens. It reports
//! throughput, latency percentiles, commits (fsyncs) per intent, the re-submission pass's
//! deduplications per second and, with `--keep`, the log's bytes per charge. Nothing here is
//! asserted as a timing; it only measures.
//!
//! [`build`] is the same first pass without the re-submission, which the scale benchmark
//! (`super::scale`) uses to grow its logs; [`leave_in_flight`] writes charges whose provider
//! never answers and exits once every attempt is durable, as a crash would leave them.

use crate::exit;
use crate::output::{Output, Progress};
use crate::wiring::Node;
use engine::event::{Cause, RunId, RunLimits};
use engine::executor::{IntentOutcome, RunRequest, ValidatedBy};
use engine::memory::MemoryProvider;
use engine::provider::{BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, LookupOutcome, PaymentProvider};
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
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
    dedups_per_s: f64,
    /// The kept log's size after the run (main file and WAL), when `--keep` names one.
    kept_bytes: Option<u64>,
    effects_after_first_pass: usize,
    effects_after_resubmission: usize,
}

/// What `keel bench` was asked.
pub struct Args {
    /// Charges to make.
    pub intents: usize,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Leave the log at this path (extending it if it exists) instead of a temporary file.
    pub keep: Option<PathBuf>,
    /// Number of the first charge (`bench_intent_<first>`), to extend a kept log.
    pub first: usize,
}

/// The charge inputs `first .. first + count`.
fn inputs(first: usize, count: usize) -> Arc<Vec<serde_json::Value>> {
    Arc::new(
        (first..first + count)
            .map(|i| {
                json!({
                    "tenant_id": BENCH_TENANT,
                    "intent_id": format!("bench_intent_{i:08}"),
                    "order_id": format!("order_{i:08}"),
                    "amount_minor": 1000 + (i % 9000) as i64,
                    "currency": "EUR",
                    "payment_method_token": "pm_bench_token_0123456789",
                })
            })
            .collect(),
    )
}

/// The tenant of every benchmark charge.
pub const BENCH_TENANT: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

fn file_bytes(db: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(format!("{}{suffix}", db.display())).ok())
        .map(|m| m.len())
        .sum()
}

/// Runs the benchmark in a fresh database next to `db` (never in it), or in `--keep`'s.
pub async fn run(out: &Output, db: &Path, durability: store::Durability, args: Args) -> anyhow::Result<u8> {
    let Args { intents, concurrency, keep, first } = args;
    if intents == 0 || concurrency == 0 {
        return Ok(out.usage_error("--intents and --concurrency must be at least 1"));
    }
    let dir = db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let bench_db = keep.clone().unwrap_or_else(|| dir.join(format!("keel-bench-{}.db", uuid::Uuid::new_v4())));
    let provider = Arc::new(MemoryProvider::new(adapters::provider_http::stripe_like()));
    let node = Arc::new(Node::with_provider(&bench_db, durability, provider.clone(), None)?);
    let inputs = inputs(first, intents);

    let progress = out.progress(intents as u64, "bench: charging");
    let (first_pass, latencies, seconds) =
        pass(&node, &inputs, concurrency, Expect::Validated, progress.clone()).await?;
    progress.phase("bench: re-submitting", intents as u64);
    let stats = node.store.stats();
    let effects_first = provider.effect_count();
    let (deduplicated, _, dedup_seconds) =
        pass(&node, &inputs, concurrency, Expect::Deduplicated, progress.clone()).await?;
    progress.finish();
    let effects_after = provider.effect_count();
    node.shutdown()?;
    drop(node);
    let kept_bytes = keep.as_ref().map(|path| file_bytes(path));
    if keep.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", bench_db.display()));
        }
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
        validated: first_pass,
        resubmitted_deduplicated: deduplicated,
        dedups_per_s: deduplicated as f64 / dedup_seconds,
        kept_bytes,
        effects_after_first_pass: effects_first,
        effects_after_resubmission: effects_after,
    };
    let ok =
        first_pass == intents && deduplicated == intents && effects_first == intents && effects_after == effects_first;
    out.emit(&report, || {
        outln!("keel bench: {intents} charges, concurrency {concurrency}, durability {}", report.durability);
        outln!(
            "  {:.0} intents/s, {:.0} events/s over {:.2} s",
            report.intents_per_s, report.events_per_s, report.seconds
        );
        outln!("  latency p50 {:.2} ms, p99 {:.2} ms", report.p50_ms, report.p99_ms);
        outln!(
            "  {} commits = {:.3} fsyncs per intent ({} events)",
            report.commits, report.fsyncs_per_intent, report.events
        );
        outln!(
            "  re-submission: {deduplicated}/{intents} deduplicated ({:.0}/s), effects {effects_first} → {effects_after} {}",
            report.dedups_per_s,
            if ok { "(no new effect)" } else { "(MISMATCH)" }
        );
        if let (Some(path), Some(bytes)) = (&keep, kept_bytes) {
            outln!("  kept {} ({bytes} bytes, both passes' events)", path.display());
        }
    });
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

/// Charges `first .. first + count` into the log at `db` (created or extended), with no
/// re-submission: how the scale benchmark grows its logs. Returns how many validated.
pub async fn build(
    db: &Path,
    durability: store::Durability,
    first: usize,
    count: usize,
    concurrency: usize,
    progress: Progress,
) -> anyhow::Result<usize> {
    let provider = Arc::new(MemoryProvider::new(adapters::provider_http::stripe_like()));
    let node = Arc::new(Node::with_provider(db, durability, provider, None)?);
    let (validated, _, _) = pass(&node, &inputs(first, count), concurrency, Expect::Validated, progress).await?;
    node.shutdown()?;
    Ok(validated)
}

/// A provider that never answers: every attempt stays in flight.
struct Silent;

impl PaymentProvider for Silent {
    fn capability(&self) -> Capability {
        adapters::provider_http::stripe_like()
    }

    fn execute<'a>(&'a self, _request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(std::future::pending())
    }

    fn lookup<'a>(&'a self, _kind: EffectKind, _key: &'a str) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(std::future::pending())
    }
}

/// Starts `count` charges (from `first`) whose provider never answers, waits until every
/// one's attempt is durable, and ends the process without shutting anything down: the log
/// is left with `count` attempts in flight and their runs unfinished, their lease holder
/// dead — what `keel resume` recovers. Never returns.
pub async fn leave_in_flight(
    db: &Path,
    durability: store::Durability,
    first: usize,
    count: usize,
) -> anyhow::Result<u8> {
    let node = Arc::new(Node::with_provider(db, durability, Arc::new(Silent), None)?);
    let before = node.store.stats().events;
    for input in Arc::unwrap_or_clone(inputs(first, count)) {
        let node = node.clone();
        tokio::spawn(async move {
            let request = RunRequest {
                run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
                limits: RunLimits::default(),
                deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
                cause: Cause::command("bench"),
            };
            let _ = node.executor.start("charge", &input, request).await;
        });
    }
    // A charge's first commit holds its run's start, its journal link, its reservation and
    // its attempt: four events.
    let target = before + 4 * count as u64;
    while node.store.stats().events < target {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outln!("{count} attempts in flight in {}", db.display());
    std::process::exit(i32::from(exit::OK))
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
    progress: Progress,
) -> anyhow::Result<(usize, Vec<Duration>, f64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (node, inputs, next, progress) = (node.clone(), inputs.clone(), next.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            let mut matched = 0;
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(input) = inputs.get(i) else { break };
                let request = RunRequest {
                    // Time-ordered ids (UUIDv7), as the binary's: the runs' stream names sort
                    // as they come.
                    run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
                    limits: RunLimits::default(),
                    deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
                    cause: Cause::command("bench"),
                };
                let began = Instant::now();
                let outcome = node.executor.start("charge", input, request).await?;
                latencies.push(began.elapsed());
                progress.inc(1);
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
