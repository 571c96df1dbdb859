//! The binary's harnesses: `keel demo`, `keel soak` (with its hidden `keel soak-worker`) and
//! `keel bench`, and the `keel provider-sim` fallback they start the simulator with.
//!
//! These drive Keel rather than operate it: they start simulators and `keel` children, kill
//! them, and check or measure what happened. They live here, beside the operator commands
//! and not in them, because they prove the binary's own wiring ([`crate::wiring::Node`]) and
//! print through its [`crate::output::Output`] with its exit codes; a library could do
//! neither without a second copy of both. The dependency runs one way: a harness may use the
//! core modules (`wiring`, `output`, the arguments and exit codes of `main`), and no core
//! module names a harness.

pub mod bench;
pub mod demo;
pub mod soak;

use std::process::ExitCode;

/// `keel provider-sim ARGS…`: the simulator's own command line, for a harness that finds no
/// `keel-provider-sim` binary beside this one (`cargo run` builds only `keel`).
pub fn run_provider_sim(args: &[String]) -> ExitCode {
    provider_sim::cli_main_from(std::iter::once("keel-provider-sim".to_owned()).chain(args.iter().cloned()))
}
