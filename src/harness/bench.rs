//! `keel bench`: the charge workflow end to end at full durability, on SQLite or PostgreSQL.
//!
//! Owns the benchmark driver: N charges from C concurrent callers through the real store
//! (SQLite: group commit, fsync per commit at `full`; PostgreSQL: its pool of writers) in a
//! fresh store of its own (a new file, a new database), against an in-process zero-latency provider
//! or, with `--provider URL`, a provider over HTTP in Stripe's API (what `keel serve` and `keel charge`
//! charge through), then every charge re-submitted to check that no new effect happens. It reports
//! throughput, latency percentiles, commits (fsyncs) per intent, the re-submission pass's
//! deduplications per second and, with `--keep`, the log's bytes per charge. With
//! `--processes N` it starts N `keel bench --in-place` processes on that one store, each on
//! its own range of keys, and reports each one's figures and the total. Nothing here is
//! asserted as a timing; it only measures.
//!
//! [`build`] is the same first pass without the re-submission, which the scale benchmark
//! (`super::scale`) uses to grow its logs; [`leave_in_flight`] writes charges whose provider
//! never answers and exits once every attempt is durable, as a crash would leave them.

use super::latency::Latencies;
use crate::ProviderArgs;
use crate::backend::{Location, PgUrl};
use crate::exit;
use crate::output::{Output, Progress};
use crate::wiring::{Backend, Node};
use anyhow::Context as _;
use engine::event::{Cause, RunId, RunLimits};
use engine::executor::{IntentOutcome, RunRequest, ValidatedBy};
use engine::memory::MemoryProvider;
use engine::provider::{BoxFuture, CallOutcome, Capability, EffectKind, EffectRequest, LookupOutcome, PaymentProvider};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The benchmark's figures, for one process (what `keel bench --json` prints, read back by
/// `--processes` and by `keel serve-bench`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Report {
    backend: LogKind,
    provider: ProviderKind,
    pub(crate) intents: usize,
    concurrency: usize,
    durability: String,
    pub(crate) seconds: f64,
    pub(crate) intents_per_s: f64,
    /// Events written (SQLite counts them; PostgreSQL's writers do not).
    events: Option<u64>,
    events_per_s: Option<f64>,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    commits: u64,
    /// Commits per intent: fsyncs per intent at `full` on SQLite.
    commits_per_intent: f64,
    validated: usize,
    resubmitted_deduplicated: usize,
    dedups_per_s: f64,
    /// The kept log's size after the run (main file and WAL), when `--keep` names one.
    kept_bytes: Option<u64>,
    /// The provider's effects, counted when it is the in-process one (an HTTP provider's are
    /// counted by whoever runs it).
    effects_after_first_pass: Option<usize>,
    effects_after_resubmission: Option<usize>,
}

impl Report {
    /// Whether every charge validated once, and every re-submission was answered from the
    /// log (so it made no provider call); with the in-process provider, whether its effects
    /// say the same.
    pub(crate) fn ok(&self) -> bool {
        self.validated == self.intents
            && self.resubmitted_deduplicated == self.intents
            && self.effects_after_first_pass.is_none_or(|effects| effects == self.intents)
            && self.effects_after_resubmission == self.effects_after_first_pass
    }
}

/// Which backend a report measured.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum LogKind {
    Sqlite,
    Postgres,
}

/// Which provider a report charged through.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ProviderKind {
    InProcess,
    Http,
}

/// The provider a benchmark charges through.
pub enum Through {
    /// In process, zero latency (`engine::memory::MemoryProvider`): the store and the executor
    /// alone.
    InProcess,
    /// The HTTP provider these arguments name (`--provider URL`).
    Http(ProviderArgs),
}

/// The figures of `--processes N`: each process's, and the total.
#[derive(Debug, Serialize)]
struct Processes {
    backend: LogKind,
    processes: usize,
    concurrency_each: usize,
    intents: usize,
    /// The slowest process's first pass: the total rate is over it.
    seconds: f64,
    /// Every process's charges over the slowest one's time.
    intents_per_s: f64,
    /// The processes' own rates, summed (above the total when they did not overlap fully).
    intents_per_s_summed: f64,
    /// The worst process's p99.
    p99_ms_max: f64,
    per_process: Vec<Report>,
}

/// What `keel bench` was asked.
pub struct Args {
    /// Charges to make (split over the processes).
    pub intents: usize,
    /// Concurrent callers (in each process).
    pub concurrency: usize,
    /// Leave the log at this path (extending it if it exists) instead of a temporary file.
    pub keep: Option<PathBuf>,
    /// Number of the first charge (`bench_intent_<first>`), to extend a kept log.
    pub first: usize,
    /// `keel bench` processes on one store, each on its own range of keys.
    pub processes: usize,
    /// Bench in the store given, as it is, instead of a fresh one (what each process of
    /// `--processes` is told).
    pub in_place: bool,
    /// The provider every charge goes to.
    pub provider: Through,
}

/// The charge inputs `first .. first + count`, each made when it is asked for: a benchmark
/// of a million charges holds none of them.
#[derive(Clone, Copy)]
struct Inputs {
    first: usize,
    count: usize,
}

impl Inputs {
    /// The `i`-th input, past the last one `None`.
    fn get(self, i: usize) -> Option<serde_json::Value> {
        let n = self.first + i;
        (i < self.count).then(|| {
            json!({
                "tenant_id": BENCH_TENANT,
                "intent_id": format!("bench_intent_{n:08}"),
                "order_id": format!("order_{n:08}"),
                "amount_minor": 1000 + (n % 9000) as i64,
                "currency": "EUR",
                "payment_method_token": "pm_bench_token_0123456789",
            })
        })
    }

    fn all(self) -> impl Iterator<Item = serde_json::Value> {
        (0..self.count).filter_map(move |i| self.get(i))
    }
}

/// A benchmark charge's run: a time-ordered id (UUIDv7, as the binary's: the runs' stream
/// names sort as they come), the default limits and deadline.
fn bench_run() -> RunRequest {
    RunRequest {
        run_id: RunId::new(uuid::Uuid::now_v7().to_string()),
        limits: RunLimits::default(),
        deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
        cause: Cause::command("bench"),
    }
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

/// The store one benchmark runs in, and what is removed once it is over.
struct Fresh {
    location: Location,
    made: Made,
}

/// What a benchmark made for itself.
enum Made {
    /// Nothing: `--in-place`, or `--keep`'s file.
    Nothing,
    /// A SQLite file next to the log named.
    File(PathBuf),
    /// A database on the PostgreSQL server named (dropped through `server`'s database).
    Database { server: PgUrl, name: String },
}

impl Fresh {
    /// A new SQLite file next to `db` (never `db`), `--keep`'s path, or a new database on
    /// the PostgreSQL server of `url`; or the store itself with `--in-place`. Its schema is
    /// made here, once, before any process of `--processes` opens it.
    fn make(
        location: &Location,
        keep: Option<&Path>,
        in_place: bool,
        durability: store::Durability,
    ) -> anyhow::Result<Self> {
        let fresh = match (location, keep) {
            _ if in_place => Self { location: location.clone(), made: Made::Nothing },
            (Location::Sqlite(_), Some(path)) => {
                Self { location: Location::Sqlite(path.to_owned()), made: Made::Nothing }
            }
            (Location::Sqlite(db), None) => {
                let dir = db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let path = dir.join(format!("keel-bench-{}.db", uuid::Uuid::new_v4()));
                Self { location: Location::Sqlite(path.clone()), made: Made::File(path) }
            }
            (Location::Postgres(url), _) => {
                let name = format!("keel_bench_{}", uuid::Uuid::new_v4().simple());
                store_postgres::admin::create_database(&url.url(), &name).with_context(|| {
                    format!("cannot create the benchmark's database on {} (it needs CREATEDB)", url.server())
                })?;
                let location = Location::Postgres(url.with_database(&name));
                Self { location, made: Made::Database { server: url.clone(), name } }
            }
        };
        match &fresh.location {
            Location::Sqlite(path) => crate::wiring::open_store(path, durability)?.shutdown()?,
            Location::Postgres(url) => crate::wiring::open_postgres(url, Some(1))?.shutdown(),
        }
        Ok(fresh)
    }

    fn remove(&self) {
        match &self.made {
            Made::Nothing => {}
            Made::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Made::Database { server, name } => {
                if let Err(error) = store_postgres::admin::drop_database(&server.url(), name) {
                    errln!("keel bench: could not drop its database {name}: {error}");
                }
            }
        }
    }
}

/// Runs the benchmark in a fresh store next to `location` (never in it), in `--keep`'s, or
/// with `--in-place` in `location` itself; over `--processes` processes when more than one.
pub async fn run(out: &Output, location: &Location, durability: store::Durability, args: Args) -> anyhow::Result<u8> {
    if args.intents == 0 || args.concurrency == 0 || args.processes == 0 {
        return Ok(out.usage_error("--intents, --concurrency and --processes must be at least 1"));
    }
    if args.processes > args.intents {
        return Ok(out.usage_error("--processes must not be above --intents: each process charges at least one"));
    }
    if let (Location::Postgres(url), Some(_)) = (location, &args.keep) {
        return Ok(out.usage_error(&format!(
            "--keep PATH keeps a SQLite file: on PostgreSQL, bench in a database of your own with --store {url} \
             --in-place"
        )));
    }
    let fresh =
        crate::wiring::postgres_blocking(|| Fresh::make(location, args.keep.as_deref(), args.in_place, durability))?;
    let result = if args.processes > 1 {
        across_processes(out, &fresh.location, durability, &args).await
    } else {
        one_process(out, &fresh.location, durability, &args).await
    };
    crate::wiring::postgres_blocking(|| fresh.remove());
    result
}

/// One process: both passes, the report.
async fn one_process(
    out: &Output,
    location: &Location,
    durability: store::Durability,
    args: &Args,
) -> anyhow::Result<u8> {
    // The in-process provider is kept to count its effects; an HTTP one counts its own.
    let (provider, counted): (Arc<dyn PaymentProvider>, Option<Arc<MemoryProvider>>) = match &args.provider {
        Through::InProcess => {
            let memory = Arc::new(MemoryProvider::new(adapters::stripe::local_capability()));
            (memory.clone(), Some(memory))
        }
        Through::Http(provider) => (crate::wiring::http_provider(provider)?, None),
    };
    let counted = counted.as_deref();
    let report = match location {
        Location::Sqlite(path) => {
            let node = Node::with_provider(path, durability, provider, None)?;
            let mut report = measure(out, node, counted, args, (LogKind::Sqlite, durability)).await?;
            report.kept_bytes = args.keep.as_deref().map(file_bytes);
            report
        }
        Location::Postgres(url) => {
            let node = Node::over(crate::wiring::open_postgres(url, None)?, provider, None);
            measure(out, node, counted, args, (LogKind::Postgres, durability)).await?
        }
    };
    let ok = report.ok();
    out.emit(&report, || print_report(&report, args.keep.as_deref()));
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

/// Both passes over `node`.
async fn measure<B: Backend>(
    out: &Output,
    node: Node<B>,
    counted: Option<&MemoryProvider>,
    args: &Args,
    (backend, durability): (LogKind, store::Durability),
) -> anyhow::Result<Report> {
    let Args { intents, concurrency, first, .. } = *args;
    let node = Arc::new(node);
    let inputs = Inputs { first, count: intents };
    let (commits_before, events_before) = (node.store.commits(), node.store.events());
    let progress = out.progress(intents as u64, "bench: charging");
    let (first_pass, latencies, seconds) =
        pass(&node, inputs, concurrency, Expect::Validated, progress.clone()).await?;
    progress.phase("bench: re-submitting", intents as u64);
    let commits = node.store.commits() - commits_before;
    let events = node.store.events().zip(events_before).map(|(after, before)| after - before);
    let effects_first = counted.map(MemoryProvider::effect_count);
    let (deduplicated, _, dedup_seconds) =
        pass(&node, inputs, concurrency, Expect::Deduplicated, progress.clone()).await?;
    progress.finish();
    let effects_after = counted.map(MemoryProvider::effect_count);
    node.shutdown()?;
    drop(node);
    Ok(Report {
        backend,
        provider: match args.provider {
            Through::InProcess => ProviderKind::InProcess,
            Through::Http(_) => ProviderKind::Http,
        },
        intents,
        concurrency,
        durability: format!("{durability:?}").to_lowercase(),
        seconds,
        intents_per_s: intents as f64 / seconds,
        events,
        events_per_s: events.map(|events| events as f64 / seconds),
        p50_ms: latencies.percentile_ms(0.50),
        p99_ms: latencies.percentile_ms(0.99),
        commits,
        commits_per_intent: commits as f64 / intents as f64,
        validated: first_pass,
        resubmitted_deduplicated: deduplicated,
        dedups_per_s: deduplicated as f64 / dedup_seconds,
        kept_bytes: None,
        effects_after_first_pass: effects_first,
        effects_after_resubmission: effects_after,
    })
}

fn print_report(report: &Report, keep: Option<&Path>) {
    let backend = match report.backend {
        LogKind::Sqlite => "SQLite",
        LogKind::Postgres => "PostgreSQL",
    };
    let provider = match report.provider {
        ProviderKind::InProcess => "the in-process provider",
        ProviderKind::Http => "the HTTP provider",
    };
    outln!(
        "keel bench: {} charges on {backend} through {provider}, concurrency {}, durability {}",
        report.intents,
        report.concurrency,
        report.durability
    );
    match report.events_per_s {
        Some(events_per_s) => {
            outln!("  {:.0} intents/s, {events_per_s:.0} events/s over {:.2} s", report.intents_per_s, report.seconds)
        }
        None => outln!("  {:.0} intents/s over {:.2} s", report.intents_per_s, report.seconds),
    }
    outln!("  latency p50 {:.2} ms, p99 {:.2} ms", report.p50_ms, report.p99_ms);
    outln!("  {} commits = {:.3} per intent", report.commits, report.commits_per_intent);
    let effects = match (report.effects_after_first_pass, report.effects_after_resubmission) {
        (Some(first), Some(after)) => format!(", effects {first} → {after}"),
        _ => String::new(),
    };
    outln!(
        "  re-submission: {}/{} deduplicated ({:.0}/s){effects} {}",
        report.resubmitted_deduplicated,
        report.intents,
        report.dedups_per_s,
        if report.ok() { "(no new effect)" } else { "(MISMATCH)" }
    );
    if let (Some(path), Some(bytes)) = (keep, report.kept_bytes) {
        outln!("  kept {} ({bytes} bytes, both passes' events)", path.display());
    }
}

/// `--processes N`: N `keel bench --in-place` children on `location`, each on its own range
/// of keys, started together; their reports, and the total.
async fn across_processes(
    out: &Output,
    location: &Location,
    durability: store::Durability,
    args: &Args,
) -> anyhow::Result<u8> {
    let exe = std::env::current_exe().context("cannot find the keel binary to start the processes")?;
    let (each, extra) = (args.intents / args.processes, args.intents % args.processes);
    let mut children = Vec::with_capacity(args.processes);
    let mut first = args.first;
    for index in 0..args.processes {
        let intents = each + usize::from(index < extra);
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["bench", "--in-place", "--json"])
            .args(["--intents", &intents.to_string(), "--first", &first.to_string()])
            .args(["--concurrency", &args.concurrency.to_string()])
            .args(["--durability", &format!("{durability:?}").to_lowercase()])
            .args(provider_flags(&args.provider))
            // The store goes by the environment: a password never shows in the process list.
            .env(
                "KEEL_STORE",
                match location {
                    Location::Sqlite(path) => format!("sqlite:{}", path.display()),
                    Location::Postgres(url) => url.url(),
                },
            )
            .env_remove("KEEL_DB")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        children.push(command.spawn().context("cannot start a bench process")?);
        first += intents;
    }
    // Every process ends before any report is read: one that failed leaves none writing to
    // the store the caller then removes.
    let mut outputs = Vec::with_capacity(children.len());
    for child in children {
        outputs.push(child.wait_with_output().await?);
    }
    let mut reports = Vec::with_capacity(outputs.len());
    for output in outputs {
        let report: Report = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("a bench process ended {} without its report", output.status))?;
        reports.push(report);
    }
    let seconds = reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let total = Processes {
        backend: reports[0].backend,
        processes: reports.len(),
        concurrency_each: args.concurrency,
        intents: reports.iter().map(|r| r.intents).sum(),
        seconds,
        intents_per_s: reports.iter().map(|r| r.intents).sum::<usize>() as f64 / seconds,
        intents_per_s_summed: reports.iter().map(|r| r.intents_per_s).sum(),
        p99_ms_max: reports.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        per_process: reports,
    };
    let ok = total.per_process.iter().all(Report::ok);
    out.emit(&total, || {
        outln!(
            "keel bench: {} processes × concurrency {}, {} charges: {:.0} intents/s in all over {:.2} s (their own \
             rates sum to {:.0}/s), worst p99 {:.2} ms",
            total.processes,
            total.concurrency_each,
            total.intents,
            total.intents_per_s,
            total.seconds,
            total.intents_per_s_summed,
            total.p99_ms_max
        );
        for (index, report) in total.per_process.iter().enumerate() {
            outln!(
                "  process {}: {:.0} intents/s over {:.2} s, p50 {:.2} ms, p99 {:.2} ms{}",
                index + 1,
                report.intents_per_s,
                report.seconds,
                report.p50_ms,
                report.p99_ms,
                if report.ok() { "" } else { " (MISMATCH)" }
            );
        }
    });
    Ok(if ok { exit::OK } else { exit::INTERNAL })
}

/// The flags that give a `keel bench` child the same provider.
fn provider_flags(provider: &Through) -> Vec<String> {
    match provider {
        Through::InProcess => Vec::new(),
        Through::Http(provider) => [
            ("--provider", provider.url.clone()),
            ("--provider-tier", Some(provider.tier.clone())),
            ("--provider-consistency-window-ms", Some(provider.consistency_window_ms.to_string())),
            ("--provider-timeout-ms", Some(provider.timeout_ms.to_string())),
        ]
        .into_iter()
        .filter_map(|(flag, value)| value.map(|value| [flag.to_owned(), value]))
        .flatten()
        .collect(),
    }
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
    let provider = Arc::new(MemoryProvider::new(adapters::stripe::local_capability()));
    let node = Arc::new(Node::with_provider(db, durability, provider, None)?);
    let (validated, _, _) = pass(&node, Inputs { first, count }, concurrency, Expect::Validated, progress).await?;
    node.shutdown()?;
    Ok(validated)
}

/// A provider that never answers: every attempt stays in flight.
struct Silent;

impl PaymentProvider for Silent {
    fn capability(&self) -> Capability {
        adapters::stripe::local_capability()
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
    for input in (Inputs { first, count }).all() {
        let node = node.clone();
        tokio::spawn(async move {
            let _ = node.executor.start("charge", &input, bench_run()).await;
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
async fn pass<B: Backend>(
    node: &Arc<Node<B>>,
    inputs: Inputs,
    concurrency: usize,
    expect: Expect,
    progress: Progress,
) -> anyhow::Result<(usize, Latencies, f64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (node, next, progress) = (node.clone(), next.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            let mut matched = 0;
            let mut latencies = Latencies::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(input) = inputs.get(i) else { break };
                let began = Instant::now();
                let outcome = node.executor.start("charge", &input, bench_run()).await?;
                latencies.record(began.elapsed());
                progress.inc(1);
                if outcome.intent.as_ref().is_some_and(|intent| expect.matches(intent)) {
                    matched += 1;
                }
            }
            anyhow::Ok((matched, latencies))
        }));
    }
    let mut matched = 0;
    let mut latencies = Latencies::default();
    for worker in workers {
        let (m, l) = worker.await??;
        matched += m;
        latencies.merge(&l);
    }
    Ok((matched, latencies, started.elapsed().as_secs_f64()))
}
