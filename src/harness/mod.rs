//! The binary's harnesses: `keel demo`, `keel soak` (with its hidden `keel soak-worker`, and
//! its PostgreSQL chaos in `chaos`),
//! `keel bench` (with its hidden `keel bench-leave-in-flight`), `keel bench-scale` and
//! `keel serve-bench`, and the
//! `keel provider-sim` fallback they start the simulator with.
//!
//! These drive Keel rather than operate it: they start simulators and `keel` children, kill
//! them, and check or measure what happened. They live here, beside the operator commands
//! and not in them, because they prove the binary's own wiring ([`crate::wiring::Node`]) and
//! print through its [`crate::output::Output`] with its exit codes; a library could do
//! neither without a second copy of both. The dependency runs one way: a harness may use the
//! core modules (`wiring`, `output`, the arguments and exit codes of `main`), and no core
//! module names a harness.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod latency;
pub mod scale;
pub mod serve_bench;
pub mod soak;

use anyhow::Context as _;
use provider_sim::Process;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

/// A simulator child process serving `db`, with a fault plan when given (written beside it,
/// pretty, for whoever reads the files a harness keeps).
///
/// It runs the simulator binary next to this one or, when that was not built (`cargo run`
/// builds only `keel`), this binary's hidden `provider-sim` subcommand.
fn start_sim(db: &Path, plan: Option<&Value>, stderr: Stdio) -> anyhow::Result<Process> {
    let plan = plan.map(serde_json::to_string_pretty).transpose()?;
    let me = std::env::current_exe()?;
    let sibling = me.with_file_name("keel-provider-sim");
    let mut command = if sibling.exists() {
        Command::new(sibling)
    } else {
        let mut command = Command::new(me);
        command.arg("provider-sim");
        command
    };
    command.stderr(stderr);
    Process::serve(command, db, plan.as_deref()).context("cannot start the provider simulator")
}

/// `keel provider-sim ARGS…`: the simulator's own command line, for [`start_sim`].
pub fn run_provider_sim(args: &[String]) -> ExitCode {
    provider_sim::cli_main_from(std::iter::once("keel-provider-sim".to_owned()).chain(args.iter().cloned()))
}
