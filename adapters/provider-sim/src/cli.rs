//! The `keel-provider-sim` command line.
//!
//! Owns argument parsing, the `serve` and `effects` commands, logging set-up and exit codes.
//! It must never print anything but the `listening on …` line to stdout before serving (a
//! parent process reads that line to learn the port), and never print a payment method.
//!
//! Exit codes: 0 success (including a graceful stop on SIGTERM/SIGINT), 64 invalid usage or
//! fault plan, 1 any other error (database, socket).

use super::{Config, FaultPlan, Server};
use clap::{Args, Parser, Subcommand};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code for a refused invocation or fault plan (BSD `EX_USAGE`).
const EXIT_USAGE: u8 = 64;

const FAULTS_HELP: &str = "\
FAULT PLAN FORMAT (--faults PLAN.json):

  {\"seed\": 7, \"rules\": [
    {\"operation\": \"charge\", \"fault\": \"timeout_after_effect\", \"times\": 1, \"ms\": 2000},
    {\"operation\": \"any\",    \"fault\": \"unavailable\", \"probability\": 0.1},
    {\"operation\": \"lookup\", \"fault\": \"lookup_absent_for_ms\", \"ms\": 1500}
  ]}

  seed         optional, default 0; seeds the PRNG of probability rules, so the same plan and
               the same order of requests give the same faults.
  operation    charge | refund | lookup | any
  times        fire on the first N matching requests, then the rule is spent (N >= 1)
  probability  fire on each matching request with probability P in [0, 1]
               (exactly one of times/probability; lookup_absent_for_ms may have neither,
               meaning every lookup)
  ms           see the faults below

  Rules are checked in order for each request; the first rule that fires decides it.

FAULTS:
  fail_before_effect    500 api_error; no effect, no idempotency record
  timeout_after_effect  commit the effect, hold the answer ms (default 30000): the client
                        times out; the key answers 409 while held
  unavailable           503; no effect
  decline               a charge: 402 card_error/card_declined (generic_decline); a refund:
                        a failed Refund; no effect; a replay with the same key gets the
                        same decline
  slow                  commit the effect, answer after ms (default 1000)
  lookup_absent_for_ms  a search or refund list misses objects younger than ms (required):
                        Stripe's search lag
  lookup_lies           a search or refund list finds nothing although the objects exist
  lookup_unavailable    a lookup answers 503

An invalid plan is refused at start with the rule's index, exit code 64.

EXAMPLES:
  keel-provider-sim serve --db sim.db
  keel-provider-sim serve --db sim.db --faults fixtures/faults/timeout_after_effect.json
  keel-provider-sim serve --db sim.db --no-idempotency --no-lookup --addr 127.0.0.1:4242
  keel-provider-sim effects --db sim.db --json

EXIT CODES: 0 success or a graceful stop (SIGTERM/SIGINT), 64 invalid fault plan,
1 any other error (database, socket).";

/// A payment provider simulator speaking Stripe's API for testing Keel, with durable state and faults.
#[derive(Debug, Parser)]
#[command(name = "keel-provider-sim", version, after_long_help = FAULTS_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API until SIGTERM or SIGINT.
    ///
    /// Prints exactly `listening on http://127.0.0.1:PORT` as the first line of stdout once
    /// the socket accepts connections; logs go to stderr (RUST_LOG, default `warn`).
    ///
    /// Example: keel-provider-sim serve --db sim.db --faults fixtures/faults/decline.json
    #[command(after_long_help = FAULTS_HELP)]
    Serve(ServeArgs),
    /// List every effect the simulator performed, in commit order, with the W3C traceparent
    /// of the request that made it (`-` when it carried none).
    ///
    /// Safe while a server is running on the same database.
    ///
    /// Example: keel-provider-sim effects --db sim.db --json | wc -l
    Effects(EffectsArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The SQLite file holding the simulator's state (created if missing; kept across restarts).
    #[arg(long, value_name = "PATH")]
    db: PathBuf,
    /// The address to listen on; port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// A JSON fault plan to play (format below).
    #[arg(long, value_name = "PLAN.json")]
    faults: Option<PathBuf>,
    /// Ignore Idempotency-Key: every request makes a new effect (the key is still recorded).
    #[arg(long)]
    no_idempotency: bool,
    /// Have no lookup: GET /v1/payment_intents/search and GET /v1/refunds answer 501.
    #[arg(long)]
    no_lookup: bool,
}

#[derive(Debug, Args)]
struct EffectsArgs {
    /// The simulator's SQLite file.
    #[arg(long, value_name = "PATH")]
    db: PathBuf,
    /// One JSON object per line per effect (id, idempotency_key, kind, amount_minor, currency,
    /// order_id, intent_id, tenant, created_at, created_at_ms, traceparent, payment_intent,
    /// metadata, replays) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `keel-provider-sim` with the process's arguments and returns its exit code.
pub fn cli_main() -> ExitCode {
    run(Cli::parse())
}

/// Runs the simulator with explicit arguments (the first one is the program name); `keel
/// provider-sim …` uses it so the demo works from the one `keel` binary too.
pub fn cli_main_from(args: impl IntoIterator<Item = String>) -> ExitCode {
    run(Cli::parse_from(args))
}

fn run(cli: Cli) -> ExitCode {
    init_tracing();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Effects(args) => effects(&args),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second initialisation (a test calling cli_main twice) is harmless, so its error is ignored.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn serve(args: ServeArgs) -> ExitCode {
    let faults = match &args.faults {
        Some(path) => match FaultPlan::load(path) {
            Ok(plan) => plan,
            Err(e) => {
                eprintln!("keel-provider-sim: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => FaultPlan::none(),
    };
    let config = Config {
        db_path: args.db,
        addr: args.addr,
        faults,
        idempotency: !args.no_idempotency,
        lookup: !args.no_lookup,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("keel-provider-sim: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let server = match Server::start(config).await {
            Ok(server) => server,
            Err(e) => {
                eprintln!("keel-provider-sim: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut stdout = std::io::stdout().lock();
        // The parent reads this line to learn the port; it must be out before we wait.
        if writeln!(stdout, "listening on {}", server.base_url()).and_then(|()| stdout.flush()).is_err() {
            eprintln!("keel-provider-sim: cannot write the listening line to stdout");
            return ExitCode::FAILURE;
        }
        drop(stdout);
        if let Err(e) = stop_signal().await {
            eprintln!("keel-provider-sim: cannot wait for signals: {e}");
        }
        match server.shutdown().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keel-provider-sim: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Resolves on the first SIGTERM or SIGINT.
async fn stop_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

fn effects(args: &EffectsArgs) -> ExitCode {
    let effects = match super::list_effects(&args.db) {
        Ok(effects) => effects,
        Err(e) => {
            eprintln!("keel-provider-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        effects.iter().try_for_each(|effect| {
            let line = serde_json::to_string(effect).map_err(std::io::Error::other)?;
            writeln!(out, "{line}")
        })
    } else {
        write_table(&mut out, &effects)
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not worth a failure exit.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel-provider-sim: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_table(out: &mut impl std::io::Write, effects: &[super::EffectRecord]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<35} {:<6} {:>12} {:<4} {:<20} {:<24} {:<55} IDEMPOTENCY_KEY",
        "ID", "KIND", "AMOUNT_MINOR", "CUR", "ORDER_ID", "CREATED_AT", "TRACEPARENT"
    )?;
    for e in effects {
        writeln!(
            out,
            "{:<35} {:<6} {:>12} {:<4} {:<20} {:<24} {:<55} {}",
            e.id,
            e.kind.as_str(),
            e.amount_minor,
            e.currency,
            e.order_id,
            e.created_at,
            e.traceparent.as_deref().unwrap_or("-"),
            e.idempotency_key
        )?;
    }
    writeln!(out, "{} effect{}", effects.len(), if effects.len() == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
