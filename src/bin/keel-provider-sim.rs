//! `keel-provider-sim`: the Stripe-like payment provider simulator (see `adapters::sim`).

fn main() -> std::process::ExitCode {
    adapters::sim::cli_main()
}
