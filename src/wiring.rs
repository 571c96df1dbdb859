//! Composition: the system clock, tracing, the store, the provider and the executor.
//!
//! Owns [`SystemClock`] (the one reader of the system clock in Keel's own crates) and
//! [`Node`], everything a command needs to run workflows. It never decides anything.

use crate::ProviderArgs;
use adapters::provider_http::{HttpProvider, HttpProviderConfig, stripe_like};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use engine::clock::Clock;
use engine::executor::{Executor, Runtime};
use engine::failpoints::Failpoints;
use engine::provider::{Capability, PaymentProvider};
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

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The store's durability setting from its flag value.
pub fn durability(flag: &str) -> store::Durability {
    match flag {
        "normal" => store::Durability::Normal,
        _ => store::Durability::Full,
    }
}

/// The capability the operator declared for the provider.
pub fn capability(args: &ProviderArgs) -> Capability {
    let (dedup_by_key, lookup) = match args.tier.as_str() {
        "lookup" => (false, true),
        "dedup" => (true, false),
        "none" => (false, false),
        _ => (true, true),
    };
    Capability { dedup_by_key, lookup, consistency_window_ms: args.consistency_window_ms, ..stripe_like() }
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
                    eprintln!("keel: failpoint {point} fired: aborting");
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

/// Opens the event log.
pub fn open_store(db: &Path, durability: store::Durability) -> anyhow::Result<store::Store> {
    let options = store::Options { durability, failpoints: failpoints(), ..Default::default() };
    store::Store::open(db, options, Arc::new(SystemClock))
        .with_context(|| format!("cannot open the event log {}", db.display()))
}

/// Everything a command that runs workflows needs.
pub struct Node {
    /// The event log.
    pub store: store::Store,
    /// The executor over the store and the provider.
    pub executor: Executor,
}

impl Node {
    /// Opens the log and connects to the provider (the provider URL is required).
    pub fn open(
        db: &Path,
        durability: store::Durability,
        provider: &ProviderArgs,
        max_charge_minor: Option<i64>,
    ) -> anyhow::Result<Self> {
        let url = provider.url.clone().context(
            "no payment provider: pass --provider URL or set KEEL_PROVIDER_URL (e.g. a `keel-provider-sim serve` address)",
        )?;
        let config = HttpProviderConfig {
            capability: capability(provider),
            request_timeout_ms: provider.timeout_ms,
            ..HttpProviderConfig::new(url)
        };
        let provider: Arc<dyn PaymentProvider> = Arc::new(HttpProvider::new(config)?);
        Self::with_provider(db, durability, provider, max_charge_minor)
    }

    /// Opens the log with an already-built provider.
    pub fn with_provider(
        db: &Path,
        durability: store::Durability,
        provider: Arc<dyn PaymentProvider>,
        max_charge_minor: Option<i64>,
    ) -> anyhow::Result<Self> {
        let store = open_store(db, durability)?;
        let runtime = Runtime { log: Arc::new(store.clone()), provider, clock: Arc::new(SystemClock) };
        let executor = Executor::new(runtime, workflows::builtin(max_charge_minor)).with_failpoints(failpoints());
        Ok(Self { store, executor })
    }
}
