//! `keel-provider-sim`: the Stripe-like payment provider simulator (see `provider_sim`).

fn main() -> std::process::ExitCode {
    provider_sim::cli_main()
}
