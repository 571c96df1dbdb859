//! `keel serve-bench`: what a charge costs through `keel serve`, next to `keel bench` and to
//! spawning `keel charge` per request, measured in the same run.
//!
//! Owns the load generator: a real `keel serve` child (loopback only, `--addr 127.0.0.1:0`)
//! in front of a simulator child, a submit key made with `keel keys create`, C concurrent
//! HTTP clients charging N distinct keys, then every charge re-submitted (the dedup pass: the
//! simulator must see no new effect); then `keel bench` at the same concurrency twice: with the
//! in-process zero-latency provider, and through a simulator child of its own over HTTP — the
//! same provider `keel serve` charged, so that the two differ by the HTTP door alone; then S
//! `keel charge` processes against the first simulator. Every pass is bounded by its count and
//! by `--max-seconds`. It measures and checks the effect counts; it asserts no timing.

use super::bench::Report as BenchReport;
use super::latency::Latencies;
use super::start_sim;
use crate::exit;
use crate::output::Output;
use anyhow::{Context as _, bail};
use engine::executor::ValidatedBy;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What `keel serve-bench` was asked.
pub struct Args {
    /// Charges through `keel serve` (and through `keel bench`).
    pub intents: usize,
    /// Concurrent HTTP clients (and `keel bench` callers, and `keel charge` processes).
    pub concurrency: usize,
    /// `keel charge` processes spawned for the comparison.
    pub spawned: usize,
    /// Upper bound of each pass, in seconds: a pass stops starting requests past it.
    pub max_seconds: u64,
    /// Keep the run's files here instead of a temporary directory.
    pub dir: Option<PathBuf>,
}

/// How many failed requests a pass describes (the count is always whole).
const FAILURES_SHOWN: usize = 5;

/// One pass's figures.
#[derive(Debug, Serialize)]
struct Pass {
    requests: usize,
    ok: usize,
    seconds: f64,
    per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// What the first failed requests answered (at most `FAILURES_SHOWN`): a benchmark that
    /// lost a request says why.
    failures: Vec<String>,
}

/// What one load-generating task saw: its successes, its latencies, its first failures.
#[derive(Default)]
struct Tally {
    ok: usize,
    latencies: Latencies,
    failures: Vec<String>,
}

impl Tally {
    fn record(&mut self, began: Instant, failure: Option<String>) {
        self.latencies.record(began.elapsed());
        match failure {
            None => self.ok += 1,
            Some(failure) if self.failures.len() < FAILURES_SHOWN => self.failures.push(failure),
            Some(_) => {}
        }
    }

    fn merge(mut self, other: Self) -> Self {
        self.ok += other.ok;
        self.latencies.merge(&other.latencies);
        self.failures.extend(other.failures);
        self.failures.truncate(FAILURES_SHOWN);
        self
    }
}

impl Pass {
    fn of(tally: Tally, seconds: f64) -> Self {
        let Tally { ok, latencies, failures } = tally;
        Self {
            requests: usize::try_from(latencies.count()).expect("a pass's requests fit in memory's address space"),
            ok,
            seconds,
            per_s: ok as f64 / seconds,
            p50_ms: latencies.percentile_ms(0.50),
            p99_ms: latencies.percentile_ms(0.99),
            failures,
        }
    }

    /// Joins the tallies of a pass's tasks.
    async fn join(
        workers: Vec<tokio::task::JoinHandle<anyhow::Result<Tally>>>,
        started: Instant,
    ) -> anyhow::Result<Self> {
        let mut tally = Tally::default();
        for worker in workers {
            tally = tally.merge(worker.await??);
        }
        Ok(Self::of(tally, started.elapsed().as_secs_f64()))
    }
}

/// The run's figures.
#[derive(Debug, Serialize)]
struct Report {
    concurrency: usize,
    serve: Pass,
    serve_resubmitted: Pass,
    dedup_rate: f64,
    effects_after_serve: usize,
    effects_after_resubmission: usize,
    bench_in_process: BenchReport,
    /// `keel bench --provider URL`: the same charges through a simulator of its own.
    bench_through_simulator: BenchReport,
    effects_after_bench_through_simulator: usize,
    spawned_keel_charge: Pass,
    /// Serve over `keel bench` with the in-process provider (serve pays the simulator too).
    serve_vs_bench: f64,
    /// Serve over `keel bench` through the simulator: the same provider on both sides.
    serve_vs_bench_same_provider: f64,
    serve_vs_spawn: f64,
}

/// A child stopped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

fn keel(dir: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.arg("--db").arg(dir.join("keel.db")).arg("--json").env_remove("KEEL_PROVIDER_URL");
    Ok(command)
}

/// Runs the three measurements and prints them.
pub async fn run(out: &Output, args: Args) -> anyhow::Result<u8> {
    if args.intents == 0 || args.concurrency == 0 || args.max_seconds == 0 {
        return Ok(out.usage_error("--intents, --concurrency and --max-seconds must be at least 1"));
    }
    let temp = tempfile_dir(args.dir.as_deref())?;
    let dir = temp.path().to_owned();
    let sim = start_sim(&dir.join("sim.db"), None, Stdio::null())?;
    let key = create_key(&dir)?;
    let (server, addr) = start_serve(&dir, sim.url())?;
    let base = format!("http://{addr}");
    let client = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency).build()?;
    let budget = Duration::from_secs(args.max_seconds);

    let serve = http_pass(&client, &base, &key, args.intents, args.concurrency, budget, ValidatedBy::Provider).await?;
    let effects_after_serve = provider_sim::list_effects(&dir.join("sim.db"))?.len();
    let again =
        http_pass(&client, &base, &key, serve.requests, args.concurrency, budget, ValidatedBy::Deduplicated).await?;
    let effects_after_resubmission = provider_sim::list_effects(&dir.join("sim.db"))?.len();
    drop(server);

    let bench = keel_bench(&dir.join("bench.db"), None, args.intents, args.concurrency)?;
    let bench_sim = start_sim(&dir.join("bench-sim.db"), None, Stdio::null())?;
    let bench_http = keel_bench(&dir.join("bench-http.db"), Some(bench_sim.url()), args.intents, args.concurrency)?;
    let effects_after_bench_through_simulator = provider_sim::list_effects(&dir.join("bench-sim.db"))?.len();
    drop(bench_sim);
    let spawned = spawn_pass(&dir, sim.url(), args.spawned, args.concurrency, budget).await?;

    let ratio = |over: f64| if over > 0.0 { serve.per_s / over } else { 0.0 };
    let report = Report {
        concurrency: args.concurrency,
        dedup_rate: again.ok as f64 / again.requests.max(1) as f64,
        serve_vs_bench: ratio(bench.intents_per_s),
        serve_vs_bench_same_provider: ratio(bench_http.intents_per_s),
        serve_vs_spawn: ratio(spawned.per_s),
        serve,
        serve_resubmitted: again,
        effects_after_serve,
        effects_after_resubmission,
        bench_in_process: bench,
        bench_through_simulator: bench_http,
        effects_after_bench_through_simulator,
        spawned_keel_charge: spawned,
    };
    let effects_ok = effects_after_serve == report.serve.ok && effects_after_resubmission == effects_after_serve;
    let ok = effects_ok
        && report.serve.ok == report.serve.requests
        && report.serve_resubmitted.ok == report.serve_resubmitted.requests
        && report.bench_in_process.ok()
        && report.bench_through_simulator.ok()
        && report.bench_through_simulator.intents == effects_after_bench_through_simulator
        && report.spawned_keel_charge.ok == report.spawned_keel_charge.requests;
    out.emit(&report, || print(&report, effects_ok));
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

fn print(report: &Report, effects_ok: bool) {
    let line = |name: &str, pass: &Pass| {
        outln!(
            "  {name:<28} {:>6}/{:<6} in {:>6.2} s = {:>8.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms",
            pass.ok,
            pass.requests,
            pass.seconds,
            pass.per_s,
            pass.p50_ms,
            pass.p99_ms
        );
        for failure in &pass.failures {
            outln!("    failed: {failure}");
        }
    };
    outln!("keel serve-bench: concurrency {}", report.concurrency);
    line("keel serve (HTTP, new keys)", &report.serve);
    line("keel serve (re-submitted)", &report.serve_resubmitted);
    outln!(
        "  dedup rate {:.3}; simulator effects {} → {} {}",
        report.dedup_rate,
        report.effects_after_serve,
        report.effects_after_resubmission,
        if effects_ok { "(one effect per charge, no new effect)" } else { "(MISMATCH)" }
    );
    let bench = |name: &str, bench: &BenchReport| {
        outln!(
            "  {name:<28} {:>13} in {:>6.2} s = {:>8.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms",
            bench.intents,
            bench.seconds,
            bench.intents_per_s,
            bench.p50_ms,
            bench.p99_ms
        );
    };
    bench("keel bench (in process)", &report.bench_in_process);
    bench("keel bench (simulator, HTTP)", &report.bench_through_simulator);
    outln!("  simulator effects after keel bench through it: {}", report.effects_after_bench_through_simulator);
    line("keel charge spawned per req", &report.spawned_keel_charge);
    outln!(
        "  serve / bench in process = {:.2}; serve / bench through the simulator = {:.2}; serve / spawned = {:.1}×",
        report.serve_vs_bench,
        report.serve_vs_bench_same_provider,
        report.serve_vs_spawn
    );
}

/// The run's directory: `--dir`, or a temporary one removed at the end.
fn tempfile_dir(dir: Option<&Path>) -> anyhow::Result<RunDir> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Ok(RunDir { path: dir.to_owned(), remove: false })
        }
        None => {
            let path = std::env::temp_dir().join(format!("keel-serve-bench-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path)?;
            Ok(RunDir { path, remove: true })
        }
    }
}

/// A directory, removed when dropped unless the caller named it.
struct RunDir {
    path: PathBuf,
    remove: bool,
}

impl RunDir {
    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// What `keel keys create --json` prints that the load generator needs.
#[derive(Deserialize)]
struct CreatedKey {
    secret: String,
}

/// What `keel serve` answers a charge with that the load generator checks.
#[derive(Deserialize)]
struct ChargeAnswer {
    source: Option<ValidatedBy>,
}

fn create_key(dir: &Path) -> anyhow::Result<String> {
    let output = keel(dir)?
        .args(["keys", "create", "--tenant", super::bench::BENCH_TENANT, "--role", "submit", "--name", "serve-bench"])
        .output()?;
    let created: CreatedKey = serde_json::from_slice(&output.stdout).context("keel keys create prints its key")?;
    Ok(created.secret)
}

fn start_serve(dir: &Path, provider: &str) -> anyhow::Result<(Reaped, String)> {
    let rate = engine::limits::API_RATE_PER_S_MAX.to_string();
    let mut child = keel(dir)?
        .args(["--provider", provider, "serve", "--addr", "127.0.0.1:0", "--rate-per-s", &rate])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let reaped = Reaped(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let addr = line.trim().strip_prefix("listening on http://").context("keel serve printed no address")?.to_owned();
    Ok((reaped, addr))
}

fn charge_body(i: usize) -> String {
    json!({
        "order_id": format!("order_{i:08}"),
        "amount_minor": 1000 + (i % 9000) as i64,
        "currency": "EUR",
        "payment_method_token": "pm_bench_token_0123456789",
    })
    .to_string()
}

/// Charges `0..count` from `concurrency` HTTP clients, each intent its own key.
async fn http_pass(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    count: usize,
    concurrency: usize,
    budget: Duration,
    want: ValidatedBy,
) -> anyhow::Result<Pass> {
    wait_ready(client, base).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, url, auth) =
            (client.clone(), next.clone(), format!("{base}/v1/charges"), format!("Bearer {key}"));
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || started.elapsed() > budget {
                    break;
                }
                let began = Instant::now();
                let answer = client
                    .post(&url)
                    .header("Authorization", &auth)
                    .header("Idempotency-Key", format!("serve_bench_{i:08}"))
                    .header("Content-Type", "application/json")
                    .body(charge_body(i))
                    .send()
                    .await?;
                let status = answer.status();
                let body = answer.bytes().await?;
                let source = serde_json::from_slice::<ChargeAnswer>(&body).ok().and_then(|answer| answer.source);
                let failure = (!(status == reqwest::StatusCode::OK && source == Some(want))).then(|| {
                    let body = String::from_utf8_lossy(&body);
                    format!(
                        "{status}, expected source {}: {}",
                        want.as_str(),
                        body.chars().take(300).collect::<String>()
                    )
                });
                tally.record(began, failure);
            }
            anyhow::Ok(tally)
        }));
    }
    Pass::join(workers, started).await
}

async fn wait_ready(client: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    for _ in 0..400 {
        if client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("keel serve never became ready")
}

/// `keel bench --intents N --concurrency C --json` in its own log `db`, through the provider
/// at `provider` (`--provider URL`) or the in-process one, parsed.
fn keel_bench(db: &Path, provider: Option<&str>, intents: usize, concurrency: usize) -> anyhow::Result<BenchReport> {
    let mut command = Command::new(std::env::current_exe()?);
    command.arg("--db").arg(db).args([
        "--json",
        "bench",
        "--intents",
        &intents.to_string(),
        "--concurrency",
        &concurrency.to_string(),
    ]);
    if let Some(url) = provider {
        command.args(["--provider", url]);
    }
    let output = command.output()?;
    serde_json::from_slice(&output.stdout).context("keel bench prints JSON")
}

/// `count` `keel charge` processes, `concurrency` at a time, against the simulator, each
/// opening the log and the provider client anew: what a caller in another language paid
/// before `keel serve`.
async fn spawn_pass(
    dir: &Path,
    provider: &str,
    count: usize,
    concurrency: usize,
    budget: Duration,
) -> anyhow::Result<Pass> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, dir, provider) = (next.clone(), dir.join("spawned"), provider.to_owned());
        std::fs::create_dir_all(&dir)?;
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || started.elapsed() > budget {
                    break;
                }
                let began = Instant::now();
                let output = tokio::process::Command::new(std::env::current_exe()?)
                    .arg("--db")
                    .arg(dir.join("keel.db"))
                    .args(["--provider", &provider, "charge", "--tenant", super::bench::BENCH_TENANT])
                    .args([
                        "--intent-id",
                        &format!("spawned_charge_{i:08}"),
                        "--order",
                        &format!("spawned_order_{i:08}"),
                    ])
                    .args([
                        "--amount-minor",
                        "1000",
                        "--currency",
                        "EUR",
                        "--payment-method-token",
                        "pm_bench_token_0123456789",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .output()
                    .await?;
                let failure = (!output.status.success()).then(|| {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    format!("keel charge {}: {}", output.status, stderr.trim().chars().take(300).collect::<String>())
                });
                tally.record(began, failure);
            }
            anyhow::Ok(tally)
        }));
    }
    Pass::join(workers, started).await
}
