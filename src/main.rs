//! `keel`, the operator binary: argument parsing, wiring, output, exit codes.
//!
//! This is the only place that reads argv and the environment, reads the system clock
//! ([`wiring::SystemClock`]), and uses `anyhow`. Every command prints a human rendering by
//! default and one JSON document with `--json`. The operator commands live in `ops` and
//! `agent`; the harnesses that drive Keel (`demo`, `soak`, `bench`) in [`harness`], which no
//! operator command imports.
//!
//! Exit codes: one table, `output::exit`, and one mapping from every failure to its code,
//! `output::Failure` (the README's table).

#[macro_use]
mod output;
mod agent;
mod backend;
mod facts;
mod harness;
mod keys;
mod metrics;
mod migrate;
mod on_postgres;
mod ops;
mod policy;
mod runs;
mod serve;
mod stuck;
mod telemetry;
mod trace;
mod vault;
mod wiring;
mod worker;

use clap::{Args, Parser, Subcommand};
use engine::provider::EffectKind;
use std::path::PathBuf;
use std::process::ExitCode;

/// Keel: a durable execution engine for effectful operations.
///
/// Every proposal, decision, attempt and outcome is an event in an append-only SQLite log.
/// A repeated intent never makes a second effect; an ambiguous outcome is reconciled with
/// the provider before anything acts again.
///
/// Exit codes: 0 ok; 1 internal error; 2 a controlled outcome (rejected, declined, unknown,
/// escalated, cancelled, awaiting approval, refused); 64 usage (bad input, no event log, no
/// provider, no such intent or run); 130 interrupted; 143 stopped by SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "keel", version, propagate_version = true, max_term_width = 100, subcommand_required = true)]
pub struct Cli {
    /// The event log (SQLite) [default: ./keel.db]. Only commands that write new work
    /// create it; the others refuse a missing one unless given --create. The same as
    /// `--store sqlite:PATH`.
    #[arg(long, global = true, env = "KEEL_DB", value_name = "PATH")]
    db: Option<PathBuf>,

    /// Where the event log lives: `sqlite:PATH` (the embedded default, as --db PATH) or
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`, for many workers on many machines.
    /// On PostgreSQL: charge, refund, resume, reconcile, worker, show, verify, bench and soak; the
    /// password is never printed.
    #[arg(long, global = true, env = "KEEL_STORE", value_name = "STORE", hide_env_values = true)]
    store: Option<String>,

    /// Print one JSON document instead of the human rendering.
    #[arg(long, global = true)]
    json: bool,

    /// Logs on stderr: `text` (no colour off a terminal or with NO_COLOR) or `json`, one
    /// object a line. Filtered by RUST_LOG (default: warnings).
    #[arg(long, global = true, value_name = "FORMAT", env = "KEEL_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,

    /// The store and provider options given before the subcommand (`keel --provider URL
    /// charge …`), accepted for every subcommand and hidden from help: each subcommand's help
    /// shows the ones it uses.
    #[command(flatten)]
    before: BeforeSubcommand,

    #[command(flatten)]
    vault: vault::VaultArgs,

    #[command(flatten)]
    policy: policy::PolicyArgs,

    #[command(subcommand)]
    command: Command,
}

/// The store and provider options, given before the subcommand. A subcommand's own flag
/// wins over these; these win over the environment, which wins over the defaults.
#[derive(Args, Debug, Clone, Default)]
struct BeforeSubcommand {
    #[arg(long, hide = true, env = "KEEL_DURABILITY", value_parser = ["full", "normal"])]
    durability: Option<String>,
    #[arg(long, hide = true, env = "KEEL_LEASE_TTL_MS",
          value_parser = clap::value_parser!(u64).range(engine::limits::LEASE_TTL_MIN_MS..=engine::limits::LEASE_TTL_MAX_MS))]
    lease_ttl_ms: Option<u64>,
    #[arg(long = "provider", value_name = "URL", hide = true, env = "KEEL_PROVIDER_URL")]
    provider: Option<String>,
    #[arg(long = "stripe-key-file", value_name = "PATH", hide = true)]
    stripe_key_file: Option<PathBuf>,
    #[arg(long = "provider-tier", hide = true, value_parser = ["dedup+lookup", "lookup", "dedup", "none"])]
    provider_tier: Option<String>,
    #[arg(long = "provider-consistency-window-ms", hide = true,
          value_parser = clap::value_parser!(u64).range(..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    provider_consistency_window_ms: Option<u64>,
    #[arg(long = "provider-timeout-ms", hide = true,
          value_parser = clap::value_parser!(u64).range(1..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    provider_timeout_ms: Option<u64>,
    #[arg(long = "provider-rate-per-s", hide = true,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(engine::limits::PROVIDER_RATE_PER_S_MAX)))]
    provider_rate_per_s: Option<u32>,
}

/// How commands that write append to the event log.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Event log")]
struct StoreFlags {
    /// Durability of acknowledged appends: `full` survives power loss (fsync per commit),
    /// `normal` survives a process crash but may lose the last commits on power loss.
    /// [default: full] [env: KEEL_DURABILITY]
    #[arg(long, value_parser = ["full", "normal"])]
    durability: Option<String>,

    /// How long a run's lease lasts unless its holder renews it, in ms. Another process may
    /// take a run over (and reconcile its attempts) only once its holder's lease expired or
    /// the holder is proven dead on this host; a holder renews at a third of it.
    /// [default: 30000] [env: KEEL_LEASE_TTL_MS]
    #[arg(long, value_parser = clap::value_parser!(u64).range(engine::limits::LEASE_TTL_MIN_MS..=engine::limits::LEASE_TTL_MAX_MS))]
    lease_ttl_ms: Option<u64>,
}

/// Whether a missing event log is created.
#[derive(Args, Debug, Clone, Copy, Default)]
#[command(next_help_heading = "Event log")]
pub(crate) struct CreateFlag {
    /// Create the event log when it does not exist (without it, a missing log is refused:
    /// exit 64).
    #[arg(long)]
    pub(crate) create: bool,
}

/// Who takes an operator's decision and why: both recorded with it.
#[derive(Args, Debug, Clone)]
struct Decided {
    /// The operator's name (recorded).
    #[arg(long)]
    by: String,
    /// Why (recorded).
    #[arg(long)]
    reason: String,
}

/// How to reach the payment provider.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Payment provider")]
struct ProviderFlags {
    /// Base URL of the payment provider, spoken to in Stripe's API (PaymentIntents and
    /// Refunds, form-encoded, Stripe-Version pinned): https://api.stripe.com, or http:// to a
    /// loopback address only — the address `keel-provider-sim serve` prints, or another local
    /// fake. [env: KEEL_PROVIDER_URL]
    #[arg(long = "provider", value_name = "URL")]
    url: Option<String>,

    /// A file holding the Stripe secret key (`sk_…` or restricted `rk_…`), read once at start
    /// and never stored, logged or printed; wins over KEEL_STRIPE_SECRET_KEY. An https://
    /// provider refuses to start without a key; a plain http:// loopback provider (the
    /// simulator) without one is sent the public test key `sk_test_keel_loopback`.
    #[arg(long = "stripe-key-file", value_name = "PATH")]
    stripe_key_file: Option<PathBuf>,

    /// What the provider can do for exactly-once: `dedup+lookup` (Stripe), `lookup`,
    /// `dedup`, or `none`. Decides what Keel may do after an unknown outcome.
    /// [default: dedup+lookup]
    #[arg(long = "provider-tier", value_name = "TIER", value_parser = ["dedup+lookup", "lookup", "dedup", "none"])]
    tier: Option<String>,

    /// How long a lookup may miss a fresh effect, in ms (resends wait at least this long after
    /// the request is certainly over). At most one hour. [default: 60000, Stripe's search lag;
    /// 2000 for a plain http:// loopback provider]
    #[arg(long = "provider-consistency-window-ms", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    consistency_window_ms: Option<u64>,

    /// Per-request timeout towards the provider, in ms. Past it the outcome is unknown, and a
    /// resend waits at least this long after the send. 1 ms to one hour. [default: 30000;
    /// 5000 for a plain http:// loopback provider]
    #[arg(long = "provider-timeout-ms", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    timeout_ms: Option<u64>,

    /// The most requests a second the provider takes (its rate limit: Stripe answers 429 past
    /// it). Keel never sends faster — charges, refunds and lookups alike, spaced evenly, the
    /// waiting requests taking turns tenant by tenant — so it never causes a 429 and the
    /// unknown outcome that comes with it. A request waits after its attempt is recorded; one
    /// that could not leave before its run's deadline is not sent. [default: no limit]
    #[arg(long = "provider-rate-per-s", id = "provider_rate", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(engine::limits::PROVIDER_RATE_PER_S_MAX)))]
    rate_per_s: Option<u32>,
}

/// The environment variable holding the Stripe secret key.
const STRIPE_KEY_ENV: &str = "KEEL_STRIPE_SECRET_KEY";

/// Largest Stripe key file read: a key and its newline fit many times over; a larger file is
/// not a key file.
const STRIPE_KEY_FILE_MAX_BYTES: u64 = 4_096;

/// A Stripe secret key, or why none could be had: [`required_provider`] reports the reason as
/// a usage error before anything is written. The reason never quotes the key.
pub type StripeKey = Result<std::sync::Arc<adapters::stripe::SecretKey>, String>;

/// The variable naming the release every run records (`release.version`), instead of this
/// build's version: a deployment's own name for what it runs.
const RELEASE_ENV: &str = "KEEL_RELEASE";

/// The Stripe secret key, from `file` when given, else from the environment, else — for a
/// plain http:// loopback provider only (the simulator, a local fake) — the public test key
/// [`adapters::stripe::LOOPBACK_TEST_KEY`]. The error never quotes the key.
fn stripe_key(file: Option<&std::path::Path>, url: Option<&str>) -> StripeKey {
    let (text, source) = match file {
        Some(path) => {
            // Read through the one bounded reader every file door uses.
            let read = std::fs::File::open(path)
                .and_then(|file| engine::limits::read_text_at_most(file, STRIPE_KEY_FILE_MAX_BYTES));
            match read {
                Ok(text) => (zeroize::Zeroizing::new(text), format!("the Stripe key file {}", path.display())),
                Err(error) if error.kind() == std::io::ErrorKind::FileTooLarge => {
                    return Err(format!(
                        "the Stripe key file {} is larger than {STRIPE_KEY_FILE_MAX_BYTES} bytes: not a key",
                        path.display()
                    ));
                }
                Err(error) => return Err(format!("cannot read the Stripe key file {}: {error}", path.display())),
            }
        }
        None => match std::env::var(STRIPE_KEY_ENV) {
            Ok(text) => (zeroize::Zeroizing::new(text), STRIPE_KEY_ENV.to_owned()),
            Err(std::env::VarError::NotPresent) if url.is_some_and(adapters::stripe::is_loopback_http) => (
                zeroize::Zeroizing::new(adapters::stripe::LOOPBACK_TEST_KEY.to_owned()),
                "the loopback test key".to_owned(),
            ),
            Err(std::env::VarError::NotPresent) => {
                return Err(format!(
                    "the payment provider needs its Stripe secret key: set {STRIPE_KEY_ENV} or pass --stripe-key-file \
                     PATH (only a plain http:// loopback provider, such as keel-provider-sim, goes without)"
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => return Err(format!("{STRIPE_KEY_ENV} is not UTF-8")),
        },
    };
    adapters::stripe::SecretKey::parse(&text).map(std::sync::Arc::new).map_err(|error| format!("{source}: {error}"))
}

/// How to reach the payment provider, resolved from the flags, the options before the
/// subcommand, the environment and the defaults.
#[derive(Debug, Clone)]
pub struct ProviderArgs {
    /// Base URL, when given.
    pub url: Option<String>,
    /// The Stripe secret key sent to it.
    pub key: StripeKey,
    /// The capability tier.
    pub tier: String,
    /// The consistency window, ms.
    pub consistency_window_ms: u64,
    /// The per-request timeout, ms.
    pub timeout_ms: u64,
    /// The most requests a second it takes, when declared.
    pub rate_per_s: Option<u32>,
}

/// The provider `keel bench` charges through: the HTTP one when its own `--provider` names it,
/// else the in-process one (the environment's `KEEL_PROVIDER_URL` never switches a benchmark).
fn bench_provider(before: &BeforeSubcommand, flags: &ProviderFlags) -> harness::bench::Through {
    match flags.url {
        Some(_) => harness::bench::Through::Http(before.provider(Some(flags))),
        None => harness::bench::Through::InProcess,
    }
}

impl BeforeSubcommand {
    fn provider(&self, flags: Option<&ProviderFlags>) -> ProviderArgs {
        let flags = flags.cloned().unwrap_or_default();
        let url = flags.url.or_else(|| self.provider.clone());
        let key = stripe_key(flags.stripe_key_file.as_deref().or(self.stripe_key_file.as_deref()), url.as_deref());
        // A local fake answers at once and lags as its plan says: Stripe's own minute of search
        // lag and 30 s timeout would only slow every recovery against it.
        let (consistency_window_ms, timeout_ms) = if url.as_deref().is_some_and(adapters::stripe::is_loopback_http) {
            (adapters::stripe::LOOPBACK_CONSISTENCY_WINDOW_MS, adapters::stripe::LOOPBACK_REQUEST_TIMEOUT_MS)
        } else {
            (adapters::stripe::STRIPE_SEARCH_LAG_MS, adapters::stripe::STRIPE_REQUEST_TIMEOUT_DEFAULT_MS)
        };
        ProviderArgs {
            url,
            key,
            tier: flags.tier.or_else(|| self.provider_tier.clone()).unwrap_or_else(|| "dedup+lookup".to_owned()),
            consistency_window_ms: flags
                .consistency_window_ms
                .or(self.provider_consistency_window_ms)
                .unwrap_or(consistency_window_ms),
            timeout_ms: flags.timeout_ms.or(self.provider_timeout_ms).unwrap_or(timeout_ms),
            rate_per_s: flags.rate_per_s.or(self.provider_rate_per_s),
        }
    }

    fn durability(&self, flags: Option<&StoreFlags>) -> store::Durability {
        let flag = flags.and_then(|f| f.durability.clone()).or_else(|| self.durability.clone());
        wiring::durability(flag.as_deref().unwrap_or("full"))
    }

    fn lease_ttl_ms(&self, flags: Option<&StoreFlags>) -> u64 {
        flags.and_then(|f| f.lease_ttl_ms).or(self.lease_ttl_ms).unwrap_or(engine::limits::LEASE_TTL_DEFAULT_MS)
    }
}

/// Limits of a new run.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest amount a single charge or refund may take, in minor units (`policy_denied`
    /// above). Only tightens the operator's policy: a value above it is refused (exit 64).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    max_charge_minor: Option<i64>,
    /// Money the run may move, in minor units (`budget_exhausted` above). Default: the
    /// policy's run budget; a value above it is refused (exit 64).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    cost_budget_minor: Option<i64>,
    /// Attempts per intent, the first included.
    #[arg(long, default_value_t = engine::limits::ATTEMPTS_PER_INTENT_DEFAULT)]
    max_attempts: u32,
    /// Reconciliations per intent before it escalates.
    #[arg(long, default_value_t = engine::limits::RECONCILIATIONS_PER_INTENT_DEFAULT)]
    max_reconciliations: u32,
    /// Automatic reconciliations the run's intents may make together; past it an intent still
    /// unknown escalates, naming the run's reconciliation budget. At most 10000.
    #[arg(long, default_value_t = engine::limits::RECONCILIATIONS_PER_RUN_DEFAULT,
          value_parser = clap::value_parser!(u32).range(..=i64::from(engine::limits::RECONCILIATIONS_PER_RUN_LIMIT)))]
    max_run_reconciliations: u32,
    /// Network retries the run may make (attempts again after one proven never sent); past
    /// them the run stops `provider_unavailable`, the intent kept reserved. At most 100.
    #[arg(long, default_value_t = engine::limits::NETWORK_RETRIES_PER_RUN_MAX,
          value_parser = clap::value_parser!(u32).range(..=i64::from(engine::limits::NETWORK_RETRIES_PER_RUN_LIMIT)))]
    max_network_retries: u32,
    /// Amount above which a human must approve (`keel approve`), in minor units. Only
    /// tightens the policy's threshold: a higher one is refused (exit 64).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    approval_threshold_minor: Option<i64>,
    /// Run deadline from start, in ms (an absolute instant is stored). At most 30 days.
    #[arg(long, default_value_t = engine::limits::RUN_DEADLINE_DEFAULT_MS,
          value_parser = clap::value_parser!(u64).range(..=engine::limits::RUN_DEADLINE_MAX_MS))]
    deadline_ms: u64,
}

/// The fields of a charge or refund, from flags or a JSON file.
#[derive(Args, Debug, Clone)]
pub struct EffectArgs {
    /// Tenant id (a UUID).
    #[arg(long)]
    tenant: Option<String>,
    /// Your stable id for this intent (12–120 chars). Re-use it to retry: never a new one.
    #[arg(long)]
    intent_id: Option<String>,
    /// The order.
    #[arg(long)]
    order: Option<String>,
    /// Amount in integer minor units (4900 = 49.00).
    #[arg(long)]
    amount_minor: Option<i64>,
    /// Currency: EUR, USD or XOF.
    #[arg(long)]
    currency: Option<String>,
    /// Read the whole request as JSON from FILE (`-` for stdin) instead of flags, e.g.
    /// {"tenant_id": "…", "intent_id": "…", "order_id": "…", "amount_minor": 4900,
    /// "currency": "EUR", "payment_method_token": "…"}.
    #[arg(long, value_name = "FILE|-", conflicts_with_all = ["tenant", "intent_id", "order", "amount_minor", "currency"])]
    input: Option<String>,
}

/// What a refund waits for before it is reserved.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Hold")]
pub struct HoldArgs {
    /// Wait for the signal NAME first (e.g. goods_returned): `keel signal RUN_ID NAME --by
    /// YOU` delivers it; its payload is shown in the run's output.
    #[arg(long, value_name = "NAME", conflicts_with = "input")]
    after_signal: Option<String>,
    /// Then wait this long on a durable timer (a cooling-off period), in ms. Up to a second
    /// is waited in process; a longer wait suspends the run until its fire time. It must
    /// fire before the run's deadline (--deadline-ms), or nothing is recorded.
    #[arg(long, value_name = "MS", conflicts_with = "input")]
    delay_ms: Option<u64>,
}

/// A live model API for `keel agent run` (ticket-review).
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Run against a live model API over HTTP(S) instead of a script: anthropic (Messages,
    /// key in ANTHROPIC_API_KEY) or openai (Chat Completions, key in OPENAI_API_KEY).
    #[arg(long, value_name = "API", value_parser = ["anthropic", "openai"], requires = "model")]
    model_api: Option<String>,
    /// The model name sent with each request (with --model-api), e.g. claude-sonnet-4-5.
    #[arg(long, value_name = "NAME", requires = "model_api", conflicts_with_all = ["scenario", "transcript"])]
    model: Option<String>,
    /// The API's base URL (with --model-api). Default: https://api.anthropic.com or
    /// https://api.openai.com.
    #[arg(long, value_name = "URL", requires = "model_api", conflicts_with_all = ["scenario", "transcript"])]
    model_base_url: Option<String>,
}

/// `keel agent …`: bounded agent runs on the event log.
#[derive(Subcommand, Debug)]
pub(crate) enum AgentCommand {
    /// Run an agent workflow on a scripted transcript or a live model API. Exit 0 completed; 2
    /// incomplete or any controlled stop (permission_denied, repeated_call, tool_budget,
    /// model_budget, deadline_exceeded, provider_unavailable, awaiting approval, cancelled by
    /// an operator…); 130 on ctrl-c. The run id is printed on stderr as the run starts.
    ///
    /// The model's answers come from exactly one of --scenario, --transcript or --model-api.
    ///
    /// Live (ticket-review): `--model-api anthropic --model NAME` reads the key from
    /// ANTHROPIC_API_KEY, `--model-api openai --model NAME` from OPENAI_API_KEY (exit 64 when
    /// it is unset). The key is never printed, logged or stored; the run records the API, the
    /// model and the base URL, so `keel agent resume RUN_ID` (or `keel resume`) rebuilds the
    /// same client (the key again from the environment) and never requests a recorded answer
    /// again.
    #[command(group(clap::ArgGroup::new("source").required(true).args(["scenario", "transcript", "model_api"])))]
    Run {
        /// The agent workflow: ticket-review, or support (refunds: needs --provider URL, and
        /// order C-1042 charged in the log — see the README).
        workflow: String,
        /// A named scenario (ticket-review: complete, incomplete, forbidden, repeat, changing,
        /// budget, deadline, unavailable; support: refund, injection, repeat, approval-bound,
        /// delegate), its transcript embedded in the binary.
        #[arg(long)]
        scenario: Option<String>,
        /// A JSON array of model responses, each a complete Anthropic Messages or OpenAI Chat
        /// Completions response object (a captured transcript replays as is), e.g.
        /// fixtures/agent/ticket-review/complete.json. For support, it is replayed against the
        /// refund scenario's ticket and order, or --ticket's.
        #[arg(long, value_name = "FILE")]
        transcript: Option<PathBuf>,
        /// Support only: the ticket and its order, a JSON object {"id", "text", "order": {"id",
        /// "amount_minor", "currency", "status"}} (the order must be charged in the log). Stored
        /// in the run, so a resume acts on the same one. The facts declared on conversation ID
        /// (`keel facts apply ID`) go into the request as unverified assertions.
        #[arg(long, value_name = "FILE")]
        ticket: Option<PathBuf>,
        /// A live model API instead of a script.
        #[command(flatten)]
        model: ModelArgs,
        /// JSON object overriding the default limits, e.g. {"model_calls_max": 1}.
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// Capabilities granted, comma-separated (default: all the workflow's; an unknown one
        /// is refused, naming the known ones).
        #[arg(long, value_name = "a,b")]
        capabilities: Option<String>,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Resume an agent run from the log: recorded model answers are never requested again,
    /// every counter continues where it was.
    Resume {
        /// The run id (printed by `keel agent run`, listed by `keel runs`).
        run_id: String,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
}

/// `keel run …`: one run.
#[derive(Subcommand, Debug)]
pub(crate) enum RunCommand {
    /// Show one run: its status, limits, every budget's use and what is left, its intents,
    /// and why it stopped.
    Show {
        /// The run id.
        run_id: String,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// Ask a run to stop: recorded with the operator's name and reason; the run stops
    /// `cancelled` at its next guard (its next reservation, attempt, step or model call). An
    /// attempt already in flight is reconciled as usual. A finished run refuses (exit 2).
    Cancel {
        /// The run id.
        run_id: String,
        #[command(flatten)]
        decided: Decided,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
    },
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Bounded agent runs: `keel agent run WORKFLOW --scenario S | --transcript FILE |
    /// --model-api API --model NAME`, `keel agent resume RUN_ID`.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Charge a payment method for an order: reserve, attempt (write-ahead), classify.
    ///
    /// Exit 0 when validated (by the provider, deduplicated, or reconciled); 2 when
    /// rejected, declined, unknown, escalated or awaiting approval. Re-submitting the same
    /// request is safe: the same key and payload return the stored result without calling
    /// the provider.
    Charge {
        #[command(flatten)]
        effect: EffectArgs,
        /// The payment method: a Stripe PaymentMethod id (`pm_…`, e.g. `pm_card_visa`). Never
        /// stored or logged: only its hash.
        #[arg(long, env = "KEEL_PAYMENT_METHOD_TOKEN", hide_env_values = true)]
        payment_method_token: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Refund (part of) a charged order. Refunds reserved, unknown or validated on an order
    /// never exceed what was charged on it.
    ///
    /// With --after-signal or --delay-ms the refund waits before anything is reserved: the
    /// run is recorded and suspended (exit 2, `run_status: suspended`), `keel signal` delivers
    /// the signal, and `keel resume` continues it once the signal is there and its timer has
    /// fired — never earlier, and a restart never moves the fire time.
    Refund {
        #[command(flatten)]
        effect: EffectArgs,
        #[command(flatten)]
        hold: HoldArgs,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// A conversation's controlled facts (seed 001): `keel facts apply CONVERSATION --message
    /// TEXT`, `keel facts show CONVERSATION`, `keel facts forget CONVERSATION [KEY]`.
    Facts {
        #[command(subcommand)]
        command: facts::FactsCommand,
    },
    /// List intents (a header, then one line each: status, key, amount, attempts,
    /// reconciliations, when last sent), optionally only those in one state, or only what
    /// needs a human (`--stuck`).
    Intents {
        /// reserved, awaiting_approval, attempting, validated, declined, outcome_unknown,
        /// reconciling, escalated, cancelled, rejected.
        #[arg(long)]
        state: Option<String>,
        /// Only what needs a human — escalated, awaiting approval, or a charge waiting for its
        /// caller — with the reason and since when, oldest first.
        #[arg(long, conflicts_with = "state")]
        stuck: bool,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// Show one intent: its state and its full ordered event history.
    Show {
        /// The intent key, `operation:tenant:intent_id`.
        key: String,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// List runs (oldest first), optionally only those in one status, of one workflow, or
    /// started since a time.
    Runs {
        /// running, or how a run ended: completed, rejected, declined, outcome_unknown,
        /// escalated, cancelled, deadline_exceeded, cost_budget, … (an unknown one is refused,
        /// naming them all).
        #[arg(long, value_name = "STATUS")]
        status: Option<String>,
        /// charge, refund, ticket-review, support (or agent:ticket-review).
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// Runs started at or after this RFC 3339 instant (2026-01-31T12:00:00Z) or this long
        /// ago (90s, 15m, 2h, 7d).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// Seed 004's reliability figures: outcome verification rate, ambiguous outcome rate,
    /// retries prevented, cost per validated intent, runs stopped by each budget, p50/p99 time
    /// to a definitive outcome. Read from the metrics projection, never from the events.
    Metrics {
        /// Only intents reserved and runs started at or after this RFC 3339 instant
        /// (2026-01-31T12:00:00Z) or this long ago (90s, 15m, 2h, 7d).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Segment every figure by this dimension.
        #[arg(long, value_enum, value_name = "DIMENSION")]
        by: Option<metrics::By>,
        /// Print the Prometheus text exposition format (not with --json).
        #[arg(long, conflicts_with = "drift")]
        prometheus: bool,
        /// Print only the rates that moved when a release, policy, prompt or model changed,
        /// naming the dimension and the version from which each changed.
        #[arg(long)]
        drift: bool,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// A run as a causal tree: run → steps, model and tool calls → intents → attempts →
    /// reconciliations → operators' actions, each with its time, duration, status and (in an
    /// agent run) budget counters, built from the parent each event records. `--json` gives
    /// the tree.
    Trace {
        /// The run id (`keel runs` lists them).
        run_id: String,
        #[command(flatten)]
        create: CreateFlag,
    },
    /// One run: `keel run show RUN_ID`, `keel run cancel RUN_ID --by NAME --reason WHY`.
    Run {
        #[command(subcommand)]
        command: RunCommand,
    },
    /// Deliver a signal to a workflow run that waits for it (a refund's --after-signal),
    /// recorded with your name. `keel resume` then continues the run with the payload.
    ///
    /// The payload is strict JSON (a repeated key is refused), at most 16 KiB; without one
    /// it is null. An unknown run or a bad name or payload is a usage error (64), a finished
    /// run or an agent run (which waits for no signal) a refusal (2); either way nothing is
    /// written.
    Signal {
        /// The run id (printed by `keel refund`, listed by `keel runs --status running`).
        run_id: String,
        /// The signal's name: ASCII letters, digits, '_', '-', '.' (at most 64).
        name: String,
        /// The signal's payload, as JSON (e.g. '{"parcel": "RT-118"}').
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// Who sends it (recorded).
        #[arg(long)]
        by: String,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Reconcile one intent now (lookup by its key), or every intent whose reconciliation is due.
    #[command(override_usage = "keel reconcile [OPTIONS] <KEY|--due>")]
    #[command(group(clap::ArgGroup::new("target").required(true).args(["key", "due"])))]
    Reconcile {
        /// The intent key.
        #[arg(conflicts_with = "due")]
        key: Option<String>,
        /// Reconcile every intent that is due.
        #[arg(long)]
        due: bool,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Recover after a crash: in-flight attempts become outcome_unknown (crash) exactly once,
    /// unfinished runs are replayed (agent runs from their journal, no recorded model answer
    /// asked again), due reconciliations run. A run waiting on a durable timer that has not
    /// fired is left asleep, and said when it wakes (`sleeping` in --json).
    Resume {
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Claim due work and carry it out, until SIGTERM or SIGINT (or one pass with --once).
    ///
    /// What it claims, each pass (every --poll-ms): unfinished runs nobody holds live —
    /// workflow runs replayed from their journal, agent runs resumed from theirs, a run whose
    /// timer fired —, intents due for reconciliation, and charges reserved that nobody is
    /// sending (as `keel resume` and `keel reconcile --due` do). While it holds nothing, a pass
    /// starts by recording every attempt or lookup left in flight by a dead process
    /// `outcome_unknown (crash)`; a lookup settles it, never a blind resend.
    ///
    /// Leases: each unit of work first claims its run's lease with the next fencing token
    /// (at most --concurrency at once, one per run), so two workers — on one log, in any
    /// number of processes — never act for one run at once. A run another live process holds
    /// is left to it. The lease is renewed at a third of --lease-ttl-ms while the unit works;
    /// a run taken over (this worker was presumed dead) is fenced: its later writes are
    /// refused, a definitive provider answer it got is still recorded.
    ///
    /// Stopping: on SIGTERM or SIGINT the worker claims nothing more, lets its units finish
    /// for --grace-ms, cuts short the ones left (an attempt in flight stays written ahead,
    /// for whoever takes the run to reconcile), gives back every lease it holds (another
    /// worker takes those runs at once) and exits 0 with a summary.
    ///
    /// Health: every --health-ms a line on stderr, e.g. `keel worker: alive · claimed 3 ·
    /// done 2 · in flight 1 · leases held 1 · unknown 0 · left 0 · fenced 0 · failed 0 ·
    /// recovered 1`; with --json one JSON object a line on stdout instead, fields `state`
    /// (alive, stopping, stopped), `passes`, `claimed`, `done`, `settled`, `in_flight`, `leases_held`,
    /// `unknown` (intents left outcome_unknown or escalated, as last seen), `left` (units left
    /// to another live holder), `fenced`, `failed`, `cut_short`, `recovered`; the last line is
    /// the summary (`state` stopped).
    ///
    /// --once: one pass, then the summary (with --json one document, the same fields plus
    /// `units`: each unit's `run_id`, `kind`, `intent_key`, `token` and `result` — done,
    /// settled, left, fenced, failed — with its `detail`). Exit 0 when everything it
    /// touched is settled, 2 when an intent is left unknown or escalated, 1 when a unit
    /// failed.
    Worker {
        /// Units of work carried out at once (1 to 64).
        #[arg(long, default_value_t = engine::limits::WORKER_CONCURRENCY_DEFAULT as u64,
              value_parser = clap::value_parser!(u64).range(1..=engine::limits::WORKER_CONCURRENCY_MAX as u64))]
        concurrency: u64,
        /// The wait between two passes over the due work, in ms (10 ms to 10 minutes).
        #[arg(long, value_name = "MS", default_value_t = engine::limits::WORKER_POLL_DEFAULT_MS,
              value_parser = clap::value_parser!(u64).range(engine::limits::WORKER_POLL_MIN_MS..=engine::limits::WORKER_POLL_MAX_MS))]
        poll_ms: u64,
        /// How often the health line is printed, in ms (at least 100).
        #[arg(long, value_name = "MS", default_value_t = engine::limits::WORKER_HEALTH_DEFAULT_MS,
              value_parser = clap::value_parser!(u64).range(engine::limits::WORKER_HEALTH_MIN_MS..))]
        health_ms: u64,
        /// How long a stopping worker lets its units finish, in ms (at most 10 minutes).
        #[arg(long, value_name = "MS", default_value_t = engine::limits::SHUTDOWN_GRACE_MS,
              value_parser = clap::value_parser!(u64).range(..=engine::limits::WORKER_GRACE_MAX_MS))]
        grace_ms: u64,
        /// One pass over everything due, then exit with the summary.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Cancel an intent that has nothing in flight or unknown.
    Cancel {
        /// The intent key.
        key: String,
        #[command(flatten)]
        decided: Decided,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Resolve an unknown or escalated intent by hand, with evidence: --landed REF or --absent.
    ///
    /// When the intent's provider can look effects up (its tier has a lookup), Keel asks it
    /// first (--provider is then required) and refuses an answer it contradicts, saying what
    /// it says (exit 2, nothing written), unless --override gives the reason you know better;
    /// both are recorded. Without a lookup, the event records the resolution as unverified.
    #[command(override_usage = "keel resolve [OPTIONS] <KEY> <--landed REF|--absent> --by NAME --reason WHY")]
    #[command(group(clap::ArgGroup::new("evidence").required(true).args(["landed", "absent"])))]
    Resolve {
        /// The intent key.
        key: String,
        /// The provider's reference proving the effect landed (or --absent).
        #[arg(long, value_name = "REF", conflicts_with = "absent")]
        landed: Option<String>,
        /// Assert, from your own check, that the effect did not happen (or --landed REF).
        #[arg(long)]
        absent: bool,
        /// Record the resolution even though the provider contradicts it, for this reason.
        #[arg(long = "override", value_name = "REASON")]
        override_reason: Option<String>,
        #[command(flatten)]
        decided: Decided,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Approve an intent awaiting approval, bound to its payload fingerprint.
    Approve {
        /// The intent key.
        key: String,
        /// The approver's name (recorded).
        #[arg(long)]
        by: String,
        /// The fingerprint you reviewed (from `keel show`); refused if it is not the intent's.
        #[arg(long)]
        fingerprint: Option<String>,
        /// How long the approval stays valid, in ms. At most 30 days.
        #[arg(long, default_value_t = engine::limits::APPROVAL_TTL_DEFAULT_MS,
              value_parser = clap::value_parser!(u64).range(..=engine::limits::APPROVAL_TTL_MAX_MS))]
        ttl_ms: u64,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Deny an intent awaiting approval: it ends rejected, its money released.
    Deny {
        /// The intent key.
        key: String,
        #[command(flatten)]
        decided: Decided,
        #[command(flatten)]
        create: CreateFlag,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// The payment-method vault: `keel vault purge --older-than D`, `keel vault rotate
    /// --new-key-file FILE`.
    Vault {
        #[command(subcommand)]
        command: vault::VaultCommand,
    },
    /// Serve the HTTP API (charges, refunds, intents, operator decisions) on one long-lived
    /// process and store, authenticated by API keys (`keel keys`). Stops gracefully on
    /// SIGTERM or SIGINT (exit 0).
    Serve {
        #[command(flatten)]
        args: serve::ServeArgs,
        #[command(flatten)]
        store: StoreFlags,
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// API keys for `keel serve`: `keel keys create --tenant T --role submit|read|operator
    /// --name N`, `keel keys revoke NAME|ID`, `keel keys list`.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Move this SQLite log (--db) into an empty PostgreSQL database: verify the log (one that
    /// does not check is refused: exit 1, nothing written), copy every event stream by stream
    /// — each keeps its seq, instant, type, cause and payload, chained anew on its stream —
    /// build the entity rows by the same folds, then verify PostgreSQL and check that both
    /// sides agree (events, every intent's and run's row).
    ///
    /// Stop every Keel process on the log first: leases are not copied. A target that holds
    /// anything is refused (exit 64, nothing written), unless it is this same migration
    /// interrupted: it then resumes where it stopped. A log whose vault holds payment methods
    /// is refused unless --without-vault (PostgreSQL has no vault). Progress on a terminal.
    ///
    /// Example: keel --db keel.db migrate --to postgres://keel@db.internal/keel
    Migrate {
        /// The target database: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE (its password
        /// is never printed).
        #[arg(long, value_name = "URL")]
        to: String,
        /// Migrate even though the vault holds payment methods, leaving them behind: those
        /// charges can then be reconciled or escalated after a crash, never resent.
        #[arg(long)]
        without_vault: bool,
    },
    /// Check the hash chain, rebuild every entity row by replaying its stream and compare,
    /// in bounded memory (progress on a terminal). The one command that reads the whole log.
    /// Exit 1 naming the first mismatch.
    Verify {
        #[command(flatten)]
        create: CreateFlag,
    },
    /// Run the demo: charges and refunds through a provider simulator child process, a lost
    /// answer reconciled, a worker killed with SIGKILL and recovered. Its files are removed
    /// when every promise held, unless --keep or --dir.
    Demo {
        /// Keep the demo's files in DIR instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Keep the temporary directory even when every promise held.
        #[arg(long)]
        keep: bool,
    },
    /// Benchmark the charge workflow end to end against an in-process zero-latency provider
    /// (or a provider over HTTP in Stripe's API, given its URL) at the chosen durability, then
    /// re-submit everything and check no new effect (progress on a terminal).
    Bench {
        /// Intents to charge.
        #[arg(long, default_value_t = 20_000)]
        intents: usize,
        /// Concurrent callers.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Leave the benchmark's log at PATH (extended if it exists) instead of deleting it.
        #[arg(long, value_name = "PATH")]
        keep: Option<PathBuf>,
        /// Number of the first charge (`bench_intent_N`): to extend a kept log with new ones.
        #[arg(long, default_value_t = 0)]
        first: usize,
        /// Durability of the benchmark's appends: `full` (fsync per commit) or `normal`
        /// (SQLite's; PostgreSQL commits as its server is set up).
        #[arg(long, value_parser = ["full", "normal"], default_value = "full")]
        durability: String,
        /// `keel bench` processes on one store, each with --concurrency callers on its own
        /// range of keys; each one's figures are reported and the total (1 to 64).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
        processes: u64,
        /// Bench in the store given (--store, --db) as it is, instead of a fresh one next to
        /// it (what each process of --processes is told).
        #[arg(long, hide = true, conflicts_with = "keep")]
        in_place: bool,
        /// Charge through the HTTP provider this names (--provider URL) instead of the
        /// in-process one; only this flag switches it (KEEL_PROVIDER_URL does not).
        #[command(flatten)]
        provider: ProviderFlags,
    },
    /// Measure `keel serve` under concurrent HTTP clients (loopback, a real server and
    /// simulator child, distinct keys, then a re-submission pass), next to `keel bench` at the
    /// same concurrency and to spawning `keel charge` per request. Bounded in count and time.
    #[command(name = "serve-bench")]
    ServeBench {
        /// Charges through `keel serve` (and through `keel bench`).
        #[arg(long, default_value_t = 5_000)]
        intents: usize,
        /// Concurrent HTTP clients (and `keel bench` callers, and `keel charge` processes).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// `keel charge` processes to spawn for the comparison.
        #[arg(long, default_value_t = 256)]
        spawned: usize,
        /// Each pass stops starting requests after this many seconds.
        #[arg(long, default_value_t = 120)]
        max_seconds: u64,
        /// Keep the run's files in DIR instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Measure what `charge`, `show`, `intents --state` and `resume` cost (wall time, peak RSS,
    /// via /usr/bin/time) on logs of growing size, built in DIR and reused by later calls, and
    /// what `resume` costs with attempts in flight (progress on a terminal).
    #[command(name = "bench-scale")]
    BenchScale {
        /// Where the logs are built and kept.
        #[arg(long, default_value = "keel-scale")]
        dir: PathBuf,
        /// Log sizes, in charges.
        #[arg(long, value_delimiter = ',', default_value = "0,10000,100000,1000000")]
        sizes: Vec<usize>,
        /// Runs of each command (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Attempts left in flight for the `resume` measurement (0: skip it).
        #[arg(long, default_value_t = 10_000)]
        in_flight: usize,
    },
    /// Start charges whose provider never answers and end the process once every attempt is
    /// durable: the log is left as a crash mid-attempt leaves it (used by `bench-scale`).
    #[command(name = "bench-leave-in-flight", hide = true)]
    BenchLeaveInFlight {
        /// Charges to leave in flight.
        #[arg(long)]
        intents: usize,
        /// Number of the first charge.
        #[arg(long, default_value_t = 0)]
        first: usize,
    },
    /// Long-run crash proof: SIGKILL `keel` workers at random moments under load (charges and
    /// refunds, colliding keys, provider faults), restart, heal, then check every invariant.
    ///
    /// Prints the invariant report (kills, intents, double_effects, budget_refills,
    /// unreconciled, verify_failures, seed, …); exit 1 on any violation. Progress on a
    /// terminal. Its files are removed when every invariant held, unless --keep or --dir.
    Soak {
        /// SIGKILLs to deliver (workers and, sometimes, `keel resume` itself).
        #[arg(long, default_value_t = 300)]
        kills: u64,
        /// Seed of the schedule, the workload and the simulator's fault plan.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Keep the soak's files in DIR (kept in any case).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Keep the temporary directory even when every invariant held (it is kept on failure).
        #[arg(long)]
        keep: bool,
        /// Give every child a throwaway payment-method vault key, and heal with `keel resume`
        /// and `keel reconcile` alone (no re-submission): every intent must end resolved.
        #[arg(long)]
        vault: bool,
    },
    /// One soak round's worker (started and killed by `keel soak`).
    #[command(name = "soak-worker", hide = true)]
    SoakWorker {
        /// The soak's seed.
        #[arg(long)]
        seed: u64,
        /// The round.
        #[arg(long)]
        round: u64,
    },
    /// Run the provider simulator (Stripe's API) (same as the `keel-provider-sim` binary).
    #[command(name = "provider-sim", hide = true, disable_help_flag = true)]
    ProviderSim {
        /// Arguments for the simulator.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Exit codes, as documented in `--help` and the README (the table is `output::exit`).
pub use output::exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() => {
            // `--json` may stand anywhere, even where parsing stopped: look for it in argv.
            let json = std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
            let out = output::Output { json };
            let text = error.render().to_string();
            let text = text.trim_end();
            // `keel` alone: the help, as it is (its first line is not an error message).
            if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({"status": "usage_error", "reason": "bad_input", "error": "a subcommand is required"})
                    );
                }
                errln!("{text}");
                return ExitCode::from(exit::USAGE);
            }
            return ExitCode::from(out.usage_error(text.strip_prefix("error: ").unwrap_or(text)));
        }
        Err(help_or_version) => {
            let text = help_or_version.render().to_string();
            outln!("{}", text.trim_end());
            return ExitCode::from(exit::OK);
        }
    };
    let out = output::Output { json: cli.json };
    if let Command::ProviderSim { args } = &cli.command {
        return harness::run_provider_sim(args);
    }
    // The demo and the soak keep their children's expected warnings (a timeout they cause on
    // purpose) off the terminal unless RUST_LOG asks for them.
    let quiet = matches!(cli.command, Command::Demo { .. } | Command::Soak { .. });
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let otlp = telemetry::Otlp::from_vars(
        std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok(),
        std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok(),
        std::env::var("OTEL_SERVICE_NAME").ok(),
    );
    // Dropped last, after the runtime: the spans of the whole command are flushed, within a
    // bound, when `main` returns.
    let _flush = wiring::init_tracing(cli.log_format == "json", quiet, no_color, otlp.as_ref());
    // Read once, here, into zeroized memory; the message of a bad key never quotes it.
    let env_key = std::env::var(vault::KEY_ENV).ok().map(zeroize::Zeroizing::new);
    if let Err(message) = vault::init(&cli.vault, env_key) {
        return ExitCode::from(out.usage_error(&message));
    }
    // Read once, here: libraries receive the parsed value, never the environment.
    if let Err(message) = wiring::init_failpoints(std::env::var("KEEL_FAILPOINT").ok().as_deref()) {
        return ExitCode::from(out.usage_error(&format!("KEEL_FAILPOINT: {message}")));
    }
    if let Ok(release) = std::env::var(RELEASE_ENV) {
        let chars = release.chars().count();
        if !(1..=engine::limits::RELEASE_NAME_MAX_CHARS).contains(&chars)
            || !release.bytes().all(|b| b.is_ascii_graphic())
        {
            return ExitCode::from(out.usage_error(&format!(
                "{RELEASE_ENV}: a release is 1 to {} visible ASCII characters",
                engine::limits::RELEASE_NAME_MAX_CHARS
            )));
        }
        engine::event::RunVersions::name_release(release);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return ExitCode::from(out.internal_error(&format!("cannot start the async runtime: {error}"))),
    };
    let finished = |result: output::Outcome| match result {
        Ok(code) => code,
        Err(failure) => out.fail(&failure),
    };
    // An agent run handles ctrl-c itself (it records its `cancelled` stop, then exits 130).
    // So does `keel serve` (a graceful stop: in-flight requests finish, then exit 0).
    // So does `keel worker` (it stops claiming, lets its work finish, gives its leases back).
    if matches!(cli.command, Command::Agent { .. } | Command::Serve { .. } | Command::Worker { .. }) {
        return ExitCode::from(finished(runtime.block_on(dispatch(cli))));
    }
    let code = runtime.block_on(async {
        let command = dispatch(cli);
        tokio::pin!(command);
        let mut terminate = wiring::sigterm();
        tokio::select! {
            result = &mut command => finished(result),
            _ = tokio::signal::ctrl_c() => out.interrupted(
                "interrupted; whatever was acknowledged is durable, `keel resume` continues it",
            ),
            () = terminate.recv() => {
                // A graceful stop: the step in progress (an attempt at the provider, a commit)
                // gets a grace period to finish and be recorded; then the process stops.
                let grace = std::time::Duration::from_millis(engine::limits::SHUTDOWN_GRACE_MS);
                match tokio::time::timeout(grace, &mut command).await {
                    Ok(result) => {
                        finished(result);
                    }
                    Err(_) => errln!("keel: the step in progress did not finish within the grace period"),
                }
                errln!("keel: stopped by SIGTERM; whatever was acknowledged is durable, `keel resume` continues it");
                exit::TERMINATED
            }
        }
    });
    ExitCode::from(code)
}

/// Refuses a missing event log unless `--create`: recovery, inspection and operator
/// commands never start an empty one by accident (`keel --db typo.db resume`).
fn existing_log(db: &std::path::Path, create: CreateFlag) -> Result<(), output::Failure> {
    if create.create || db.exists() { Ok(()) } else { Err(output::Failure::MissingDatabase(db.to_owned())) }
}

/// The provider, required: its URL, an https:// (or plain http:// loopback) one, and a usable
/// key — refused here, before anything is written.
fn required_provider(provider: &ProviderArgs, what: &str) -> Result<(), output::Failure> {
    let Some(url) = &provider.url else {
        return Err(output::Failure::MissingProvider(format!(
            "{what} needs the payment provider: pass --provider URL or set KEEL_PROVIDER_URL (e.g. \
             https://api.stripe.com, or the address `keel-provider-sim serve` prints)"
        )));
    };
    adapters::stripe::base_url(url).map_err(|error| output::Failure::Usage(error.to_string()))?;
    provider.key.as_ref().map_err(|message| output::Failure::Usage(message.clone()))?;
    Ok(())
}

/// The operator's rules for one charge or refund (flags applied) and the stamp its run
/// records; a malformed policy or a flag that loosens it is the usage error's message.
fn policy_rules(
    args: &policy::PolicyArgs,
    kind: EffectKind,
    input: &serde_json::Value,
    limits: &LimitArgs,
) -> Result<(engine::policy::Rules, engine::policy::PolicyStamp), output::Failure> {
    let loaded = args.load().map_err(output::Failure::Usage)?;
    let rules = loaded.rules_for(kind, input, limits).map_err(output::Failure::Usage)?;
    Ok((rules, loaded.stamp))
}

/// A refund's workflow input: its fields, and what it waits for first.
fn refund_input(effect: &EffectArgs, hold: HoldArgs) -> Result<serde_json::Value, output::Failure> {
    let mut input = ops::effect_input(effect, None).map_err(output::Failure::Usage)?;
    if let Some(map) = input.as_object_mut() {
        map.extend(hold.after_signal.map(|name| ("after_signal".to_owned(), name.into())));
        map.extend(hold.delay_ms.map(|ms| ("delay_ms".to_owned(), ms.into())));
    }
    Ok(input)
}

/// What a command's store and provider options come to.
struct Setting {
    durability: store::Durability,
    provider: ProviderArgs,
}

async fn dispatch(cli: Cli) -> output::Outcome {
    let out = output::Output { json: cli.json };
    let location = backend::locate(cli.store.as_deref(), cli.db.as_deref()).map_err(output::Failure::Usage)?;
    let db = match location {
        backend::Location::Sqlite(path) => path,
        backend::Location::Postgres(url) => return on_postgres::dispatch(cli, &url, &out).await,
    };
    let db = db.as_path();
    let before = cli.before;
    // Each command's store and provider options over those given before the subcommand.
    let setting = |store: Option<&StoreFlags>, provider: Option<&ProviderFlags>| {
        wiring::init_lease_ttl(before.lease_ttl_ms(store));
        Setting { durability: before.durability(store), provider: before.provider(provider) }
    };
    // The commands that may resend a charge need the vault's key when the log keeps one.
    let sends = matches!(
        cli.command,
        Command::Charge { .. }
            | Command::Reconcile { .. }
            | Command::Resume { .. }
            | Command::Serve { .. }
            | Command::SoakWorker { .. }
            | Command::Worker { .. }
    );
    vault::preflight(db, sends)?.map_err(output::Failure::Usage)?;
    match cli.command {
        Command::Agent { command } => {
            let (store, provider, create) = match &command {
                AgentCommand::Run { store, provider, .. } => (store, provider, CreateFlag { create: true }),
                AgentCommand::Resume { store, provider, create, .. } => (store, provider, *create),
            };
            existing_log(db, create)?;
            let setting = setting(Some(store), Some(provider));
            agent::dispatch(db, setting.durability, &setting.provider, &cli.policy, &out, command).await
        }
        Command::Charge { effect, payment_method_token, limits, store, provider } => {
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "charge")?;
            let input = ops::effect_input(&effect, payment_method_token.as_deref()).map_err(output::Failure::Usage)?;
            let (rules, stamp) = policy_rules(&cli.policy, EffectKind::Charge, &input, &limits)?;
            let node = wiring::Node::open(db, setting.durability, &setting.provider, Some(rules.clone()))?;
            ops::run_effect(&node, &out, "charge", &input, &limits, (&rules, stamp)).await
        }
        Command::Refund { effect, hold, limits, store, provider } => {
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "refund")?;
            let input = refund_input(&effect, hold)?;
            let (rules, stamp) = policy_rules(&cli.policy, EffectKind::Refund, &input, &limits)?;
            let node = wiring::Node::open(db, setting.durability, &setting.provider, Some(rules.clone()))?;
            ops::run_effect(&node, &out, "refund", &input, &limits, (&rules, stamp)).await
        }
        Command::Facts { command } => Ok(facts::dispatch(db, before.durability(None), &out, command).await?),
        Command::Intents { stuck: true, create, .. } => {
            existing_log(db, create)?;
            Ok(stuck::list(db, &out, engine::clock::Clock::now(&wiring::SystemClock))?)
        }
        Command::Intents { state, create, .. } => {
            let state = ops::parse_state(state.as_deref())?;
            existing_log(db, create)?;
            ops::list_intents(&ops::reader(db, create)?, &out, state)
        }
        Command::Show { key, create } => {
            let key = ops::parse_key(&key)?;
            existing_log(db, create)?;
            ops::show(&ops::reader(db, create)?, &out, &key)
        }
        Command::Metrics { since, by, prometheus, drift, create } => {
            metrics::check_format(&out, prometheus)?;
            existing_log(db, create)?;
            let shown = match (prometheus, drift) {
                (true, _) => metrics::Shown::Prometheus,
                (false, true) => metrics::Shown::Drift,
                (false, false) => metrics::Shown::Figures,
            };
            metrics::show(&ops::reader(db, create)?, &out, since.as_deref(), by, shown)
        }
        Command::Runs { status, workflow, since, create } => {
            let filter = runs::filter(status.as_deref(), workflow, since.as_deref())?;
            existing_log(db, create)?;
            runs::list(&ops::reader(db, create)?, &out, &filter)
        }
        Command::Trace { run_id, create } => {
            existing_log(db, create)?;
            trace::show(&ops::reader(db, create)?, &out, &engine::event::RunId::new(run_id))
        }
        Command::Run { command: RunCommand::Show { run_id, create } } => {
            existing_log(db, create)?;
            runs::show(&ops::reader(db, create)?, &out, &engine::event::RunId::new(run_id))
        }
        Command::Run { command: RunCommand::Cancel { run_id, decided: Decided { by, reason }, create, store } } => {
            existing_log(db, create)?;
            let setting = setting(Some(&store), None);
            runs::cancel(db, setting.durability, &out, &engine::event::RunId::new(run_id), &by, &reason).await
        }
        Command::Signal { run_id, name, payload, by, create, store } => {
            existing_log(db, create)?;
            let setting = setting(Some(&store), None);
            let run_id = engine::event::RunId::new(run_id);
            runs::signal(db, setting.durability, &out, &run_id, (&name, payload.as_deref()), &by).await
        }
        Command::Reconcile { key, due, create, store, provider } => {
            let key = key.as_deref().map(ops::parse_key).transpose()?;
            existing_log(db, create)?;
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "reconcile")?;
            let node = wiring::Node::open(db, setting.durability, &setting.provider, None)?;
            ops::reconcile(&node, &out, key.as_ref(), due).await
        }
        Command::Resume { create, store, provider } => {
            existing_log(db, create)?;
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "resume")?;
            let policy = cli.policy.in_force()?;
            ops::resume(db, setting.durability, &setting.provider, policy, &out).await
        }
        Command::Worker { concurrency, poll_ms, health_ms, grace_ms, once, create, store, provider } => {
            existing_log(db, create)?;
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "worker")?;
            let settings = worker::Settings::from_flags(concurrency, poll_ms, health_ms, grace_ms, once);
            let policy = cli.policy.in_force()?;
            let node = wiring::Node::open(db, setting.durability, &setting.provider, None)?;
            let agents = std::sync::Arc::new(agent::Resumer::new(db, setting.durability, &setting.provider));
            let executor = node.executor.clone().with_policy(policy);
            let outcome = worker::Worker::new(executor, agents, settings).run(&out, worker::stop()).await;
            node.shutdown()?;
            outcome
        }
        Command::Cancel { key, decided: Decided { by, reason }, create, store } => {
            let key = ops::parse_key(&key)?;
            existing_log(db, create)?;
            let setting = setting(Some(&store), None);
            let request = ops::OperatorAsk::Cancel { by, reason };
            ops::operator(|| wiring::open_store(db, setting.durability), ops::agent_run_in(db), &out, key, request)
                .await
        }
        Command::Resolve {
            key,
            landed,
            absent: _,
            override_reason,
            decided: Decided { by, reason },
            create,
            store,
            provider,
        } => {
            let key = ops::parse_key(&key)?;
            existing_log(db, create)?;
            let setting = setting(Some(&store), Some(&provider));
            let decision = ops::Resolution { landed, by, reason, override_reason };
            let open = || wiring::open_store(db, setting.durability);
            ops::resolve(open, ops::intent_in(db), &setting.provider, &out, &key, decision).await
        }
        Command::Approve { key, by, fingerprint, ttl_ms, create, store } => {
            let key = ops::parse_key(&key)?;
            existing_log(db, create)?;
            let setting = setting(Some(&store), None);
            let request = ops::OperatorAsk::Approve { by, ttl_ms, fingerprint };
            ops::operator(|| wiring::open_store(db, setting.durability), ops::agent_run_in(db), &out, key, request)
                .await
        }
        Command::Deny { key, decided: Decided { by, reason }, create, store } => {
            let key = ops::parse_key(&key)?;
            existing_log(db, create)?;
            let setting = setting(Some(&store), None);
            let request = ops::OperatorAsk::Deny { by, reason };
            ops::operator(|| wiring::open_store(db, setting.durability), ops::agent_run_in(db), &out, key, request)
                .await
        }
        Command::Serve { args, store, provider } => {
            let setting = setting(Some(&store), Some(&provider));
            required_provider(&setting.provider, "serve")?;
            let policy = cli.policy.load().map_err(output::Failure::Usage)?;
            let tls = args.tls().map_err(|e| output::Failure::Usage(e.to_string()))?;
            Ok(serve::run(db, setting.durability, &setting.provider, policy, &out, args, tls).await?)
        }
        Command::Keys { command } => {
            existing_log(db, CreateFlag { create: true })?;
            Ok(keys::dispatch(db, &out, command)?)
        }
        Command::Vault { command } => {
            existing_log(db, CreateFlag { create: false })?;
            Ok(vault::dispatch(db, &out, command, engine::clock::Clock::now(&wiring::SystemClock))?)
        }
        Command::Migrate { to, without_vault } => {
            existing_log(db, CreateFlag { create: false })?;
            let now = || engine::clock::Clock::now(&wiring::SystemClock);
            let args = migrate::Args { to, without_vault };
            // The PostgreSQL client blocks: on a thread of its own, off the async runtime.
            std::thread::scope(|scope| scope.spawn(|| migrate::run(db, &args, &out, &now)).join())
                .unwrap_or_else(|_| Err(output::Failure::Internal("the migration thread panicked".to_owned())))
        }
        Command::Verify { create } => {
            existing_log(db, create)?;
            ops::verify(&ops::reader(db, create)?, &out)
        }
        Command::Demo { dir, keep } => Ok(harness::demo::run(&out, dir, keep).await?),
        Command::Bench { intents, concurrency, keep, first, durability, processes, in_place, provider } => {
            let processes = usize::try_from(processes).expect("--processes is at most 64");
            let provider = bench_provider(&before, &provider);
            let args = harness::bench::Args { intents, concurrency, keep, first, processes, in_place, provider };
            let location = backend::Location::Sqlite(db.to_owned());
            Ok(harness::bench::run(&out, &location, wiring::durability(&durability), args).await?)
        }
        Command::ServeBench { intents, concurrency, spawned, max_seconds, dir } => {
            let args = harness::serve_bench::Args { intents, concurrency, spawned, max_seconds, dir };
            Ok(harness::serve_bench::run(&out, args).await?)
        }
        Command::BenchScale { dir, sizes, runs, in_flight } => {
            Ok(harness::scale::run(&out, &dir, &sizes, runs, in_flight).await?)
        }
        Command::BenchLeaveInFlight { intents, first } => {
            let setting = setting(None, None);
            Ok(harness::bench::leave_in_flight(db, setting.durability, first, intents).await?)
        }
        Command::Soak { kills, seed, dir, keep, vault } => {
            Ok(harness::soak::run(&out, None, harness::soak::Args { kills, seed, dir, keep, vault }).await?)
        }
        Command::SoakWorker { seed, round } => {
            let setting = setting(None, None);
            let node = wiring::Node::open(db, setting.durability, &setting.provider, None)?;
            Ok(harness::soak::worker(&node, seed, round).await?)
        }
        Command::ProviderSim { .. } => unreachable!("handled before the runtime starts"),
    }
}
