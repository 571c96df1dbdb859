//! Composition: the system clock, tracing, the store, the provider and the executor.
//!
//! Owns [`SystemClock`] (the one reader of the system clock in Keel's own crates), the
//! tracing subscriber (logs on stderr, and spans over OTLP through `telemetry`),
//! [`ProcProbe`] and this process's lease identity ([`lessee`]), the lease renewal loop, and
//! [`Node`], everything a command needs to run workflows, over one [`Backend`]: SQLite's
//! `store::Store` (the default) or PostgreSQL's `PgLog` ([`open_postgres`]). It never decides
//! anything.

use crate::ProviderArgs;
use crate::telemetry::Otlp;
use adapters::stripe::{StripeConfig, StripeProvider};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use engine::clock::Clock;
use engine::executor::{Executor, Runtime};
use engine::failpoints::Failpoints;
use engine::lease::{LeaseOwner, Lessee, Liveness, OwnerProbe};
use engine::provider::{Capability, PaymentProvider};
use std::io::IsTerminal as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one sanctioned reader of the system clock.
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings; nothing when `quiet`, the
/// harnesses whose expected warnings are the point). `json`: one JSON object a line. Text is
/// coloured only on a terminal and without `NO_COLOR` (`no_color`, read by `main`).
///
/// With `otlp` (the OpenTelemetry variables `main` read), every span at `info` and above —
/// whatever `RUST_LOG` says of the logs — is also exported over OTLP; the returned [`Flush`]
/// sends the last ones when `main` drops it. An exporter that cannot be built is a warning,
/// and the process runs without export.
///
/// [`Flush`]: crate::telemetry::Flush
pub fn init_tracing(json: bool, quiet: bool, no_color: bool, otlp: Option<&Otlp>) -> crate::telemetry::Flush {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(if quiet { "off" } else { "warn" }));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs =
        if json { logs.json().boxed() } else { logs.with_ansi(!no_color && std::io::stderr().is_terminal()).boxed() };
    let (tracer, flush, refused) = match otlp.map(|otlp| otlp.start().map_err(|error| (otlp, error))) {
        None => (None, crate::telemetry::Flush::none(), None),
        Some(Ok((tracer, flush))) => (Some(tracer), flush, None),
        Some(Err(refused)) => (None, crate::telemetry::Flush::none(), Some(refused)),
    };
    let export = tracer.map(|tracer| {
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    let _ = tracing_subscriber::registry().with(logs.with_filter(filter)).with(export).try_init();
    if let Some((otlp, error)) = refused {
        tracing::warn!(%error, url = %otlp.traces_url, "OTLP export is off: the exporter refused its settings");
    }
    flush
}

/// The store's durability setting from its flag value.
pub fn durability(flag: &str) -> store::Durability {
    match flag {
        "normal" => store::Durability::Normal,
        _ => store::Durability::Full,
    }
}

/// The capability the operator declared for the provider: the tier and consistency window
/// given (by default Stripe's search lag, or the loopback window for a local fake), over
/// Stripe's 24 h key window.
pub fn capability(args: &ProviderArgs) -> Capability {
    let (dedup_by_key, lookup) = match args.tier.as_str() {
        "lookup" => (false, true),
        "dedup" => (true, false),
        "none" => (false, false),
        _ => (true, true),
    };
    Capability {
        dedup_by_key,
        lookup,
        consistency_window_ms: args.consistency_window_ms,
        ..adapters::stripe::capability()
    }
}

/// The crash points armed for this process, parsed once by `main` from `KEEL_FAILPOINT`.
static FAILPOINTS: OnceLock<Failpoints> = OnceLock::new();

/// Reads `KEEL_FAILPOINT` (`NAME` or `NAME:N`) once. An armed point ends the process with
/// `std::process::abort()` on its Nth hit: no destructor, no flush, no rollback — a crash.
///
/// # Errors
///
/// The parse error, for a misspelt point (a typo must not silently disarm a crash test).
pub fn init_failpoints(spec: Option<&str>) -> Result<(), String> {
    let failpoints = match spec.filter(|s| !s.is_empty()) {
        None => Failpoints::disarmed(),
        Some(spec) => {
            let (point, nth) = Failpoints::parse_spec(spec)?;
            Failpoints::armed(
                point,
                nth,
                Arc::new(|point| {
                    errln!("keel: failpoint {point} fired: aborting");
                    std::process::abort()
                }),
            )
        }
    };
    let _ = FAILPOINTS.set(failpoints);
    Ok(())
}

/// The process's failpoints (disarmed unless `init_failpoints` armed one).
pub fn failpoints() -> Failpoints {
    FAILPOINTS.get().cloned().unwrap_or_default()
}

/// The run lease time to live for this process, set once by `main` from `--lease-ttl-ms`.
static LEASE_TTL_MS: OnceLock<u64> = OnceLock::new();

/// Records the lease time to live (checked by `main` against the limits).
pub fn init_lease_ttl(ttl_ms: u64) {
    let _ = LEASE_TTL_MS.set(ttl_ms);
}

fn lease_ttl_ms() -> u64 {
    LEASE_TTL_MS.get().copied().unwrap_or(engine::limits::LEASE_TTL_DEFAULT_MS)
}

/// This process as a lease holder: host, pid, start time, and a nonce — its pid space
/// ([`pid_space`]), then a random part. One per process, shared by every store handle and
/// executor in it.
pub fn lessee() -> Lessee {
    static LESSEE: OnceLock<Lessee> = OnceLock::new();
    LESSEE
        .get_or_init(|| {
            let pid = std::process::id();
            Lessee::new(LeaseOwner {
                host: host_name(),
                pid,
                started: proc_stat(pid).map_or(0, |stat| stat.started),
                nonce: format!("{}/{}", pid_space(), uuid::Uuid::new_v4().simple()),
            })
        })
        .clone()
}

/// Where this process's pids mean what `/proc` says: the running kernel (its boot id) and
/// the pid namespace, `BOOT_ID:NAMESPACE`; empty when either cannot be read. A host name
/// alone does not say it: two machines may share one (`localhost`, an image's default), and
/// so may containers with pid namespaces of their own — a holder's pid is absent from
/// another's `/proc` while it runs.
fn pid_space() -> &'static str {
    static SPACE: OnceLock<String> = OnceLock::new();
    SPACE.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|id| id.trim().to_owned());
        let namespace = std::fs::read_link("/proc/self/ns/pid").map(|link| link.display().to_string());
        match (boot, namespace) {
            (Ok(boot), Ok(namespace)) if !boot.is_empty() => {
                // `pid:[4026531836]`: the namespace's inode is what tells one from another.
                let inode: String = namespace.chars().filter(char::is_ascii_digit).collect();
                format!("{boot}:{inode}")
            }
            _ => String::new(),
        }
    })
}

/// Whether `owner` announced this process's pid space in its nonce (a holder written before
/// the nonce carried it did not: its liveness is unknown).
fn shares_pid_space(owner: &LeaseOwner) -> bool {
    let space = pid_space();
    !space.is_empty() && owner.nonce.strip_prefix(space).is_some_and(|rest| rest.starts_with('/'))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// What `/proc/PID/stat` says about a process.
struct ProcStat {
    /// Field 22: start time, in clock ticks since boot.
    started: u64,
    /// Field 3 is `Z`: exited, not yet reaped — dead.
    zombie: bool,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so read after the
    // last ')'. The fields after it start at field 3.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat { zombie: fields.first() == Some(&"Z"), started: fields.get(19)?.parse().ok()? })
}

/// Tells whether a lease holder in this process's pid space (this host, this kernel, this
/// pid namespace) still runs, from `/proc`: the same pid with the same start time, not a
/// zombie. Holders elsewhere — another host, or one that only shares its host name — are
/// unknown (their expiry counts).
pub struct ProcProbe;

impl OwnerProbe for ProcProbe {
    fn liveness(&self, owner: &LeaseOwner) -> Liveness {
        if owner.host != host_name() || owner.started == 0 || !shares_pid_space(owner) {
            return Liveness::Unknown;
        }
        match proc_stat(owner.pid) {
            Some(stat) if stat.started == owner.started && !stat.zombie => Liveness::Alive,
            _ => Liveness::Dead,
        }
    }
}

/// A receiver of this process's SIGTERMs (a supervisor asking it to stop). A failure to
/// install the handler leaves the default (the process dies), which is logged.
pub fn sigterm() -> Sigterm {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => Sigterm(Some(signal)),
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM: a SIGTERM ends the process at once");
            Sigterm(None)
        }
    }
}

/// See [`sigterm`].
pub struct Sigterm(Option<tokio::signal::unix::Signal>);

impl Sigterm {
    /// Resolves at the next SIGTERM (never, when the handler could not be installed).
    pub async fn recv(&mut self) {
        match &mut self.0 {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Renews this process's leases at a third of their time to live, for as long as the
/// process runs. A lease it loses (another process took the run) is dropped from its book:
/// its writes for that run are refused from then on.
pub fn keep_leases(log: Arc<dyn engine::log::EventLog>) -> tokio::task::JoinHandle<()> {
    let lessee = lessee();
    tokio::spawn(async move {
        let period = std::time::Duration::from_millis(lease_ttl_ms() / 3);
        let cause = engine::event::Cause::command("lease renewal");
        loop {
            tokio::time::sleep(period).await;
            match engine::executor::renew_leases(&*log, &lessee, &cause).await {
                Ok(lost) => {
                    for run_id in lost {
                        tracing::warn!(%run_id, "another process took this run over: this one stops acting for it");
                    }
                }
                Err(error) => tracing::warn!(%error, "lease renewal failed; retrying"),
            }
        }
    })
}

/// Opens the event log.
pub fn open_store(db: &Path, durability: store::Durability) -> anyhow::Result<store::Store> {
    let options = store::Options {
        durability,
        failpoints: failpoints(),
        lease_ttl_ms: lease_ttl_ms(),
        owner_probe: Arc::new(ProcProbe),
        vault: crate::vault::key(),
        ..Default::default()
    };
    store::Store::open(db, options, Arc::new(SystemClock))
        .with_context(|| format!("cannot open the event log {}", db.display()))
}

/// The provider of a node that must never reach one: every call is a bug, reported as
/// "never sent" so nothing is believed to have happened.
struct NoProvider;

impl PaymentProvider for NoProvider {
    fn capability(&self) -> Capability {
        Capability { dedup_by_key: false, lookup: false, ..adapters::stripe::capability() }
    }

    fn execute<'a>(
        &'a self,
        _request: &'a engine::provider::EffectRequest,
    ) -> engine::provider::BoxFuture<'a, engine::provider::CallOutcome> {
        Box::pin(async {
            engine::provider::CallOutcome::NotSent { detail: "this command has no payment provider".to_owned() }
        })
    }

    fn lookup<'a>(
        &'a self,
        _kind: engine::provider::EffectKind,
        _idempotency_key: &'a str,
    ) -> engine::provider::BoxFuture<'a, engine::provider::LookupOutcome> {
        Box::pin(async {
            engine::provider::LookupOutcome::Unavailable { detail: "this command has no payment provider".to_owned() }
        })
    }
}

/// A log backend as a [`Node`] holds it: the event log its executor writes through, and how
/// it is shut down. SQLite's `store::Store` (the embedded default, untouched) and
/// PostgreSQL's `PgLog`.
pub trait Backend: Clone + Send + Sync + 'static {
    /// The log, as the executor and the lease renewal loop write to it.
    fn event_log(&self) -> Arc<dyn engine::log::EventLog>;
    /// Lets the log finish every queued command, then closes it.
    fn close(&self) -> anyhow::Result<()>;
    /// Transactions committed that wrote something, so far.
    fn commits(&self) -> u64;
    /// Events written so far, when the backend counts them (SQLite does).
    fn events(&self) -> Option<u64>;
}

impl Backend for store::Store {
    fn event_log(&self) -> Arc<dyn engine::log::EventLog> {
        Arc::new(self.clone())
    }
    fn close(&self) -> anyhow::Result<()> {
        Ok(self.shutdown()?)
    }
    fn commits(&self) -> u64 {
        self.stats().commits
    }
    fn events(&self) -> Option<u64> {
        Some(self.stats().events)
    }
}

impl Backend for store_postgres::PgLog {
    fn event_log(&self) -> Arc<dyn engine::log::EventLog> {
        Arc::new(self.clone())
    }
    fn close(&self) -> anyhow::Result<()> {
        postgres_blocking(|| self.shutdown());
        Ok(())
    }
    fn commits(&self) -> u64 {
        self.stats().commits
    }
    fn events(&self) -> Option<u64> {
        None
    }
}

/// Connects to the PostgreSQL log at `url` (migrating its schema) with `writers`
/// connections (default `PG_WRITERS_DEFAULT`), this process's lease time to live and owner
/// probe. The error names the server and database, never the password.
pub fn open_postgres(url: &crate::backend::PgUrl, writers: Option<usize>) -> anyhow::Result<store_postgres::PgLog> {
    let options = store_postgres::Options {
        writers: writers.unwrap_or(engine::limits::PG_WRITERS_DEFAULT),
        lease_ttl_ms: lease_ttl_ms(),
        owner_probe: Arc::new(ProcProbe),
    };
    postgres_blocking(|| store_postgres::PgLog::open(&url.url(), options, Arc::new(SystemClock)))
        .with_context(|| format!("cannot open the event log in PostgreSQL at {} ({url})", url.server()))
}

/// Runs `f`, which connects to PostgreSQL or drops a connection, off the async runtime's
/// worker: the synchronous client runs a runtime of its own, which may not start (nor stop)
/// inside another. Outside any runtime, `f` just runs.
pub fn postgres_blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(f),
        Err(_) => f(),
    }
}

/// The payment provider the flags name (its URL is required), spoken to in Stripe's API with
/// its key.
pub fn http_provider(provider: &ProviderArgs) -> anyhow::Result<Arc<dyn PaymentProvider>> {
    let url = provider.url.clone().context(
        "no payment provider: pass --provider URL or set KEEL_PROVIDER_URL (e.g. a `keel-provider-sim serve` address)",
    )?;
    let key = provider.key.as_ref().map_err(|message| anyhow::anyhow!("{message}"))?;
    let throttle = provider.rate_per_s.map(|rate_per_s| Arc::new(adapters::flow::Throttle::new(rate_per_s)));
    let config = StripeConfig {
        capability: capability(provider),
        request_timeout_ms: provider.timeout_ms,
        current_trace: Some(crate::telemetry::current_trace),
        throttle: throttle.clone(),
        ..StripeConfig::new(url, Arc::clone(key))
    };
    let stripe = StripeProvider::new(config)?;
    Ok(match throttle {
        Some(throttle) => Arc::new(adapters::flow::RateLimited::new(stripe, throttle)),
        None => Arc::new(stripe),
    })
}

/// Everything a command that runs workflows needs, over one log backend (SQLite unless said).
pub struct Node<B: Backend = store::Store> {
    /// The event log.
    pub store: B,
    /// The executor over the store and the provider.
    pub executor: Executor,
    /// The lease renewal loop, stopped with the node.
    keeper: tokio::task::JoinHandle<()>,
}

impl<B: Backend> Drop for Node<B> {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl<B: Backend> Node<B> {
    /// Stops the lease renewal loop, then lets the store finish every queued command.
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.keeper.abort();
        self.store.close()
    }

    /// A node over an open backend and an already-built provider: the built-in workflows,
    /// this process's failpoints, lease identity and renewal loop.
    pub fn over(store: B, provider: Arc<dyn PaymentProvider>, rules: Option<engine::policy::Rules>) -> Self {
        let log = store.event_log();
        let keeper = keep_leases(Arc::clone(&log));
        let runtime = Runtime { log, provider, clock: Arc::new(SystemClock), lessee: lessee() };
        let executor = Executor::new(runtime, workflows::builtin(rules))
            .with_failpoints(failpoints())
            .with_abandon_after(crate::vault::abandon_after_ms());
        Self { store, executor, keeper }
    }
}

impl Node {
    /// Opens the log and connects to the provider (the provider URL is required).
    pub fn open(
        db: &Path,
        durability: store::Durability,
        provider: &ProviderArgs,
        rules: Option<engine::policy::Rules>,
    ) -> anyhow::Result<Self> {
        Self::with_provider(db, durability, http_provider(provider)?, rules)
    }

    /// A node over an open store for commands that never reach a payment provider (the
    /// ticket-review agent): the lease renewal loop only.
    pub fn without_provider(store: store::Store, log: Arc<dyn engine::log::EventLog>) -> Self {
        let keeper = keep_leases(Arc::clone(&log));
        let runtime = Runtime { log, provider: Arc::new(NoProvider), clock: Arc::new(SystemClock), lessee: lessee() };
        Self { store, executor: Executor::new(runtime, Vec::new()), keeper }
    }

    /// Opens the log with an already-built provider.
    pub fn with_provider(
        db: &Path,
        durability: store::Durability,
        provider: Arc<dyn PaymentProvider>,
        rules: Option<engine::policy::Rules>,
    ) -> anyhow::Result<Self> {
        Ok(Self::over(open_store(db, durability)?, provider, rules))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_holder_in_this_pid_space_is_proven_alive_or_dead() {
        let me = lessee().owner().clone();
        assert!(!pid_space().is_empty(), "Linux gives a boot id and a pid namespace");
        assert_eq!(ProcProbe.liveness(&me), Liveness::Alive);
        let restarted = LeaseOwner { started: me.started + 1, ..me.clone() };
        assert_eq!(ProcProbe.liveness(&restarted), Liveness::Dead, "a reused pid is not its holder");
        // The same host name, pid and start time in another container or on another machine:
        // this /proc says nothing about it, whatever it shows for that pid.
        let elsewhere = LeaseOwner { nonce: format!("0-0:1/{}", uuid::Uuid::new_v4().simple()), ..me.clone() };
        assert_eq!(ProcProbe.liveness(&elsewhere), Liveness::Unknown);
        let gone_elsewhere = LeaseOwner { pid: u32::MAX, ..elsewhere };
        assert_eq!(ProcProbe.liveness(&gone_elsewhere), Liveness::Unknown, "absent here is not dead there");
        let unannounced = LeaseOwner { nonce: uuid::Uuid::new_v4().simple().to_string(), ..me };
        assert_eq!(ProcProbe.liveness(&unannounced), Liveness::Unknown);
    }
}
