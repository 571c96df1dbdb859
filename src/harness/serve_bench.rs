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

use super::start_sim;
use crate::exit;
use crate::output::Output;
use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::{Value, json};
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

/// One pass's figures.
#[derive(Debug, Serialize)]
struct Pass {
    requests: usize,
    ok: usize,
    seconds: f64,
    per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Pass {
    fn of(ok: usize, mut latencies: Vec<Duration>, seconds: f64) -> Self {
        latencies.sort();
        let percentile = |p: f64| {
            let index = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
            latencies.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        Self {
            requests: latencies.len(),
            ok,
            seconds,
            per_s: ok as f64 / seconds,
            p50_ms: percentile(0.50),
            p99_ms: percentile(0.99),
        }
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
    bench_in_process: Value,
    /// `keel bench --provider URL`: the same charges through a simulator of its own.
    bench_through_simulator: Value,
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

    let serve = http_pass(&client, &base, &key, args.intents, args.concurrency, budget, Want::Provider).await?;
    let effects_after_serve = provider_sim::list_effects(&dir.join("sim.db"))?.len();
    let again = http_pass(&client, &base, &key, serve.requests, args.concurrency, budget, Want::Deduplicated).await?;
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
        serve_vs_bench: ratio(per_s(&bench)),
        serve_vs_bench_same_provider: ratio(per_s(&bench_http)),
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
    let bench_ok = |bench: &Value| bench["validated"] == bench["intents"] && bench["intents"].as_u64().is_some();
    let ok = report.serve.ok == report.serve.requests
        && effects_after_serve == report.serve.ok
        && effects_after_resubmission == effects_after_serve
        && report.serve_resubmitted.ok == report.serve_resubmitted.requests
        && bench_ok(&report.bench_in_process)
        && bench_ok(&report.bench_through_simulator)
        && report.bench_through_simulator["resubmitted_deduplicated"] == report.bench_through_simulator["intents"]
        && report.bench_through_simulator["intents"].as_u64()
            == u64::try_from(effects_after_bench_through_simulator).ok();
    out.emit(&report, || print(&report, ok));
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

fn print(report: &Report, ok: bool) {
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
    };
    outln!("keel serve-bench: concurrency {}", report.concurrency);
    line("keel serve (HTTP, new keys)", &report.serve);
    line("keel serve (re-submitted)", &report.serve_resubmitted);
    outln!(
        "  dedup rate {:.3}; simulator effects {} → {} {}",
        report.dedup_rate,
        report.effects_after_serve,
        report.effects_after_resubmission,
        if ok { "(no new effect)" } else { "(MISMATCH)" }
    );
    let bench = |name: &str, bench: &Value| {
        outln!(
            "  {name:<28} {:>13} in {:>6.2} s = {:>8.0}/s, p50 {:>7.2} ms, p99 {:>7.2} ms",
            bench["intents"],
            bench["seconds"].as_f64().unwrap_or(0.0),
            per_s(bench),
            bench["p50_ms"].as_f64().unwrap_or(0.0),
            bench["p99_ms"].as_f64().unwrap_or(0.0)
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

/// A `keel bench` report's charges per second.
fn per_s(bench: &Value) -> f64 {
    bench["intents_per_s"].as_f64().unwrap_or(0.0)
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

fn create_key(dir: &Path) -> anyhow::Result<String> {
    let output = keel(dir)?
        .args(["keys", "create", "--tenant", super::bench::BENCH_TENANT, "--role", "submit", "--name", "serve-bench"])
        .output()?;
    let document: Value = serde_json::from_slice(&output.stdout).context("keel keys create prints JSON")?;
    document["secret"].as_str().map(str::to_owned).context("keel keys create printed no secret")
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

/// What every answer of a pass must be.
#[derive(Clone, Copy)]
enum Want {
    /// A new effect.
    Provider,
    /// The stored result.
    Deduplicated,
}

impl Want {
    fn source(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Deduplicated => "deduplicated",
        }
    }
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
    want: Want,
) -> anyhow::Result<Pass> {
    wait_ready(client, base).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, url, auth) =
            (client.clone(), next.clone(), format!("{base}/v1/charges"), format!("Bearer {key}"));
        workers.push(tokio::spawn(async move {
            let (mut ok, mut latencies) = (0, Vec::new());
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
                let status = answer.status().as_u16();
                let document: Value = answer.json().await?;
                latencies.push(began.elapsed());
                if status == 200 && document["source"] == want.source() {
                    ok += 1;
                }
            }
            anyhow::Ok((ok, latencies))
        }));
    }
    let (mut ok, mut latencies) = (0, Vec::new());
    for worker in workers {
        let (o, l) = worker.await??;
        ok += o;
        latencies.extend(l);
    }
    Ok(Pass::of(ok, latencies, started.elapsed().as_secs_f64()))
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
fn keel_bench(db: &Path, provider: Option<&str>, intents: usize, concurrency: usize) -> anyhow::Result<Value> {
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
            let (mut ok, mut latencies) = (0, Vec::new());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || started.elapsed() > budget {
                    break;
                }
                let began = Instant::now();
                let status = tokio::process::Command::new(std::env::current_exe()?)
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
                    .stderr(Stdio::null())
                    .status()
                    .await?;
                latencies.push(began.elapsed());
                if status.success() {
                    ok += 1;
                }
            }
            anyhow::Ok((ok, latencies))
        }));
    }
    let (mut ok, mut latencies) = (0, Vec::new());
    for worker in workers {
        let (o, l) = worker.await??;
        ok += o;
        latencies.extend(l);
    }
    Ok(Pass::of(ok, latencies, started.elapsed().as_secs_f64()))
}
