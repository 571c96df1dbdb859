//! `keel`, the operator binary: argument parsing, wiring, output, exit codes.
//!
//! This is the only place that reads argv and the environment, reads the system clock
//! ([`wiring::SystemClock`]), and uses `anyhow`. Every command prints a human rendering by
//! default and one JSON document with `--json`. The operator commands live in `ops` and
//! `agent`; the harnesses that drive Keel (`demo`, `soak`, `bench`) in [`harness`], which no
//! operator command imports.
//!
//! Exit codes: 0 validated / ok; 2 a controlled outcome (rejected, declined, unknown,
//! escalated, cancelled, refused); 1 internal error; 64 usage error; 130 interrupted.

mod agent;
mod harness;
mod keys;
mod ops;
mod output;
mod serve;
mod wiring;

use clap::{Args, Parser, Subcommand};
use engine::log::Ask;
use std::path::PathBuf;
use std::process::ExitCode;

/// Keel: a durable execution engine for effectful operations.
///
/// Every proposal, decision, attempt and outcome is an event in an append-only SQLite log.
/// A repeated intent never makes a second effect; an ambiguous outcome is reconciled with
/// the provider before anything acts again.
#[derive(Parser, Debug)]
#[command(name = "keel", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// The event log (SQLite, created if missing).
    #[arg(long, global = true, env = "KEEL_DB", default_value = "./keel.db")]
    db: PathBuf,

    /// Print one JSON document instead of the human rendering.
    #[arg(long, global = true)]
    json: bool,

    /// Durability of acknowledged appends: `full` survives power loss (fsync per commit),
    /// `normal` survives a process crash but may lose the last commits on power loss.
    #[arg(long, global = true, env = "KEEL_DURABILITY", default_value = "full", value_parser = ["full", "normal"])]
    durability: String,

    /// How long a run's lease lasts unless its holder renews it, in ms. Another process may
    /// take a run over (and reconcile its attempts) only once its holder's lease expired or
    /// the holder is proven dead on this host; a holder renews at a third of it.
    #[arg(long, global = true, env = "KEEL_LEASE_TTL_MS", default_value_t = engine::limits::LEASE_TTL_DEFAULT_MS,
          value_parser = clap::value_parser!(u64).range(engine::limits::LEASE_TTL_MIN_MS..=engine::limits::LEASE_TTL_MAX_MS))]
    lease_ttl_ms: u64,

    #[command(flatten)]
    provider: ProviderArgs,

    #[command(subcommand)]
    command: Command,
}

/// How to reach the payment provider.
#[derive(Args, Debug, Clone)]
pub struct ProviderArgs {
    /// Base URL of the Stripe-like payment provider (e.g. a `keel-provider-sim`).
    #[arg(long = "provider", global = true, env = "KEEL_PROVIDER_URL")]
    url: Option<String>,

    /// What the provider can do for exactly-once: `dedup+lookup` (Stripe), `lookup`,
    /// `dedup`, or `none`. Decides what Keel may do after an unknown outcome.
    #[arg(long = "provider-tier", global = true, default_value = "dedup+lookup",
          value_parser = ["dedup+lookup", "lookup", "dedup", "none"])]
    tier: String,

    /// How long a lookup may miss a fresh effect, in ms (resends wait at least this long after
    /// the request is certainly over). At most one hour.
    #[arg(long = "provider-consistency-window-ms", global = true, default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    consistency_window_ms: u64,

    /// Per-request timeout towards the provider, in ms. Past it the outcome is unknown, and a
    /// resend waits at least this long after the send. 1 ms to one hour.
    #[arg(long = "provider-timeout-ms", global = true, default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=engine::limits::PROVIDER_WAIT_MAX_MS))]
    timeout_ms: u64,
}

/// Limits of a new run.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest amount a single charge may take, in minor units (policy; `policy_denied` above).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    max_charge_minor: Option<i64>,
    /// Money the run may move, in minor units (`budget_exhausted` above).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
    cost_budget_minor: Option<i64>,
    /// Attempts per intent, the first included.
    #[arg(long, default_value_t = engine::limits::ATTEMPTS_PER_INTENT_DEFAULT)]
    max_attempts: u32,
    /// Reconciliations per intent before it escalates.
    #[arg(long, default_value_t = engine::limits::RECONCILIATIONS_PER_INTENT_DEFAULT)]
    max_reconciliations: u32,
    /// Amount above which a human must approve (`keel approve`), in minor units.
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
pub enum AgentCommand {
    /// Run an agent workflow on a scripted transcript or a live model API. Exit 0 completed; 2
    /// incomplete or any controlled stop (permission_denied, repeated_call, tool_budget,
    /// model_budget, deadline_exceeded, provider_unavailable, awaiting approval…); 130 on
    /// ctrl-c.
    ///
    /// The model's answers come from exactly one of --scenario, --transcript or --model-api.
    ///
    /// Live (ticket-review): `--model-api anthropic --model NAME` reads the key from
    /// ANTHROPIC_API_KEY, `--model-api openai --model NAME` from OPENAI_API_KEY (exit 64 when
    /// it is unset). The key is never printed, logged or stored; the run records the API, the
    /// model and the base URL, so `keel agent resume RUN_ID` rebuilds the same client (the
    /// key again from the environment) and never requests a recorded answer again.
    #[command(group(clap::ArgGroup::new("source").required(true).args(["scenario", "transcript", "model_api"])))]
    Run {
        /// The agent workflow: ticket-review, or support (refunds: needs --provider URL).
        workflow: String,
        /// A named scenario (ticket-review: complete, incomplete, forbidden, repeat, changing,
        /// budget, deadline, unavailable; support: refund, injection, repeat, approval-bound),
        /// its transcript embedded in the binary.
        #[arg(long)]
        scenario: Option<String>,
        /// A JSON array of model responses, each a complete Anthropic Messages or OpenAI Chat
        /// Completions response object (a captured transcript replays as is).
        #[arg(long, value_name = "FILE")]
        transcript: Option<PathBuf>,
        /// A live model API instead of a script.
        #[command(flatten)]
        model: ModelArgs,
        /// JSON object overriding the default limits, e.g. {"model_calls_max": 1}.
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// Capabilities granted, comma-separated (default: all the workflow's).
        #[arg(long, value_name = "a,b")]
        capabilities: Option<String>,
    },
    /// Resume an agent run from the log: recorded model answers are never requested again,
    /// every counter continues where it was.
    Resume {
        /// The run id (printed by `keel agent run`).
        run_id: String,
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
    /// rejected, declined, unknown or escalated. Re-submitting the same request is safe: the
    /// same key and payload return the stored result without calling the provider.
    Charge {
        #[command(flatten)]
        effect: EffectArgs,
        /// The payment method token (≥ 20 chars). Never stored or logged: only its hash.
        #[arg(long, env = "KEEL_PAYMENT_METHOD_TOKEN", hide_env_values = true)]
        payment_method_token: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Refund (part of) a charged order. Refunds reserved, unknown or validated on an order
    /// never exceed what was charged on it.
    Refund {
        #[command(flatten)]
        effect: EffectArgs,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List intents, optionally only those in one state.
    Intents {
        /// reserved, awaiting_approval, attempting, validated, declined, outcome_unknown,
        /// reconciling, escalated, cancelled, rejected.
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one intent: its state and its full ordered event history.
    Show {
        /// The intent key, `operation:tenant:intent_id`.
        key: String,
    },
    /// Reconcile one intent now (lookup by its key), or every intent whose reconciliation is due.
    Reconcile {
        /// The intent key.
        #[arg(required_unless_present = "due", conflicts_with = "due")]
        key: Option<String>,
        /// Reconcile every intent that is due.
        #[arg(long)]
        due: bool,
    },
    /// Recover after a crash: in-flight attempts become outcome_unknown (crash) exactly once,
    /// unfinished runs are replayed, due reconciliations run.
    Resume,
    /// Cancel an intent that has nothing in flight or unknown.
    Cancel {
        /// The intent key.
        key: String,
        /// The operator's name (recorded).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Resolve an unknown or escalated intent by hand, with evidence.
    ///
    /// When the intent's provider can look effects up (its tier has a lookup), Keel asks it
    /// first (--provider is then required) and refuses an answer it contradicts, saying what
    /// it says (exit 2, nothing written), unless --override gives the reason you know better;
    /// both are recorded. Without a lookup, the event records the resolution as unverified.
    Resolve {
        /// The intent key.
        key: String,
        /// The provider's reference proving the effect landed.
        #[arg(long, required_unless_present = "absent", conflicts_with = "absent")]
        landed: Option<String>,
        /// Assert, from your own check, that the effect did not happen.
        #[arg(long)]
        absent: bool,
        /// Record the resolution even though the provider contradicts it, for this reason.
        #[arg(long = "override", value_name = "REASON")]
        override_reason: Option<String>,
        /// The operator's name (recorded).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
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
    },
    /// Deny an intent awaiting approval: it ends rejected, its money released.
    Deny {
        /// The intent key.
        key: String,
        /// The approver's name (recorded).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Serve the HTTP API (charges, refunds, intents, operator decisions) on one long-lived
    /// process and store, authenticated by API keys (`keel keys`). Stops gracefully on
    /// SIGTERM or SIGINT (exit 0).
    Serve(serve::ServeArgs),
    /// API keys for `keel serve`: `keel keys create --tenant T --role submit|read|operator
    /// --name N`, `keel keys revoke NAME|ID`, `keel keys list`.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Check the hash chain, rebuild every entity row by replaying its stream and compare,
    /// in bounded memory (progress on a terminal). The one command that reads the whole log.
    /// Exit 1 naming the first mismatch.
    Verify,
    /// Run the demo: charges and refunds through a provider simulator child process, a lost
    /// answer reconciled, a worker killed with SIGKILL and recovered.
    Demo {
        /// Keep the demo's files in DIR instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Benchmark the charge workflow end to end against an in-process zero-latency provider
    /// at the chosen durability, then re-submit everything and check no new effect.
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
    /// what `resume` costs with attempts in flight.
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
    /// unreconciled, verify_failures, seed, …); exit 1 on any violation.
    Soak {
        /// SIGKILLs to deliver (workers and, sometimes, `keel resume` itself).
        #[arg(long, default_value_t = 300)]
        kills: u64,
        /// Seed of the schedule, the workload and the simulator's fault plan.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Keep the soak's files in DIR (kept on failure in any case).
        #[arg(long)]
        dir: Option<PathBuf>,
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
    /// Run the Stripe-like provider simulator (same as the `keel-provider-sim` binary).
    #[command(name = "provider-sim", hide = true, disable_help_flag = true)]
    ProviderSim {
        /// Arguments for the simulator.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Exit codes, as documented in `--help` and the README.
pub mod exit {
    /// Validated / ok.
    pub const OK: u8 = 0;
    /// Internal error.
    pub const INTERNAL: u8 = 1;
    /// A controlled outcome: rejected, declined, unknown, escalated, cancelled, refused.
    pub const CONTROLLED: u8 = 2;
    /// Bad invocation.
    pub const USAGE: u8 = 64;
    /// Interrupted by the caller (SIGINT).
    pub const INTERRUPTED: u8 = 130;
    /// Stopped by SIGTERM: a graceful stop, the run resumable.
    pub const TERMINATED: u8 = 143;
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() => {
            // `--json` may stand anywhere, even where parsing stopped: look for it in argv.
            let json = std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
            let out = output::Output { json };
            return ExitCode::from(out.usage_error(error.render().to_string().trim_end()));
        }
        Err(help_or_version) => {
            let _ = help_or_version.print();
            return ExitCode::from(exit::OK);
        }
    };
    let out = output::Output { json: cli.json };
    if let Command::ProviderSim { args } = &cli.command {
        return harness::run_provider_sim(args);
    }
    wiring::init_tracing();
    wiring::init_lease_ttl(cli.lease_ttl_ms);
    // Read once, here: libraries receive the parsed value, never the environment.
    if let Err(message) = wiring::init_failpoints(std::env::var("KEEL_FAILPOINT").ok().as_deref()) {
        return ExitCode::from(out.usage_error(&format!("KEEL_FAILPOINT: {message}")));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return ExitCode::from(out.internal_error(&format!("cannot start the async runtime: {error}"))),
    };
    // An agent run handles ctrl-c itself (it records its `cancelled` stop, then exits 130).
    // So does `keel serve` (a graceful stop: in-flight requests finish, then exit 0).
    if matches!(cli.command, Command::Agent { .. } | Command::Serve(_)) {
        let code = runtime.block_on(dispatch(cli)).unwrap_or_else(|error| out.internal_error(&format!("{error:#}")));
        return ExitCode::from(code);
    }
    let code = runtime.block_on(async {
        let command = dispatch(cli);
        tokio::pin!(command);
        let finished = |result: anyhow::Result<u8>| match result {
            Ok(code) => code,
            Err(error) => out.internal_error(&format!("{error:#}")),
        };
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
                    Err(_) => eprintln!("keel: the step in progress did not finish within the grace period"),
                }
                eprintln!("keel: stopped by SIGTERM; whatever was acknowledged is durable, `keel resume` continues it");
                exit::TERMINATED
            }
        }
    });
    ExitCode::from(code)
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let out = output::Output { json: cli.json };
    let durability = wiring::durability(&cli.durability);
    let needs_provider = matches!(
        cli.command,
        Command::Charge { .. }
            | Command::Refund { .. }
            | Command::Reconcile { .. }
            | Command::Resume
            | Command::Serve(_)
    );
    if needs_provider && cli.provider.url.is_none() {
        return Ok(out.usage_error(
            "no payment provider: pass --provider URL or set KEEL_PROVIDER_URL (e.g. the address `keel-provider-sim serve` prints)",
        ));
    }
    match cli.command {
        Command::Agent { command } => agent::dispatch(&cli.db, durability, &cli.provider, &out, command).await,
        Command::Charge { effect, payment_method_token, limits } => {
            let input = match ops::effect_input(&effect, payment_method_token.as_deref()) {
                Ok(input) => input,
                Err(message) => return Ok(out.usage_error(&message)),
            };
            let node = wiring::Node::open(&cli.db, durability, &cli.provider, limits.max_charge_minor)?;
            ops::run_effect(&node, &out, "charge", &input, &limits).await
        }
        Command::Refund { effect, limits } => {
            let input = match ops::effect_input(&effect, None) {
                Ok(input) => input,
                Err(message) => return Ok(out.usage_error(&message)),
            };
            let node = wiring::Node::open(&cli.db, durability, &cli.provider, limits.max_charge_minor)?;
            ops::run_effect(&node, &out, "refund", &input, &limits).await
        }
        Command::Intents { state } => ops::list_intents(&cli.db, &out, state.as_deref()),
        Command::Show { key } => ops::show(&cli.db, &out, &key),
        Command::Reconcile { key, due } => {
            let node = wiring::Node::open(&cli.db, durability, &cli.provider, None)?;
            ops::reconcile(&node, &out, key.as_deref(), due).await
        }
        Command::Resume => {
            let node = wiring::Node::open(&cli.db, durability, &cli.provider, None)?;
            ops::resume(&node, &out).await
        }
        Command::Cancel { key, by, reason } => {
            ops::operator(
                &cli.db,
                durability,
                &out,
                &key,
                |cause, key| Ask::cancel(cause, key, by.clone(), reason.clone()),
                &by,
            )
            .await
        }
        Command::Resolve { key, landed, absent: _, override_reason, by, reason } => {
            let decision = ops::Resolution { landed, by, reason, override_reason };
            ops::resolve(&cli.db, durability, &cli.provider, &out, &key, decision).await
        }
        Command::Approve { key, by, fingerprint, ttl_ms } => {
            ops::operator(
                &cli.db,
                durability,
                &out,
                &key,
                |cause, key| Ask::approve(cause, key, by.clone(), ttl_ms, fingerprint.clone()),
                &by,
            )
            .await
        }
        Command::Deny { key, by, reason } => {
            ops::operator(
                &cli.db,
                durability,
                &out,
                &key,
                |cause, key| Ask::deny(cause, key, by.clone(), reason.clone()),
                &by,
            )
            .await
        }
        Command::Serve(args) => serve::run(&cli.db, durability, &cli.provider, &out, args).await,
        Command::Keys { command } => keys::dispatch(&cli.db, &out, command),
        Command::Verify => ops::verify(&cli.db, &out),
        Command::Demo { dir } => harness::demo::run(&out, dir).await,
        Command::Bench { intents, concurrency, keep, first } => {
            let args = harness::bench::Args { intents, concurrency, keep, first };
            harness::bench::run(&out, &cli.db, durability, args).await
        }
        Command::ServeBench { intents, concurrency, spawned, max_seconds, dir } => {
            let args = harness::serve_bench::Args { intents, concurrency, spawned, max_seconds, dir };
            harness::serve_bench::run(&out, args).await
        }
        Command::BenchScale { dir, sizes, runs, in_flight } => {
            harness::scale::run(&out, &dir, &sizes, runs, in_flight).await
        }
        Command::BenchLeaveInFlight { intents, first } => {
            harness::bench::leave_in_flight(&cli.db, durability, first, intents).await
        }
        Command::Soak { kills, seed, dir } => harness::soak::run(&out, kills, seed, dir).await,
        Command::SoakWorker { seed, round } => {
            let node = wiring::Node::open(&cli.db, durability, &cli.provider, None)?;
            harness::soak::worker(&node, seed, round).await
        }
        Command::ProviderSim { .. } => unreachable!("handled before the runtime starts"),
    }
}
