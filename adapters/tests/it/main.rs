//! Integration tests of the adapters crate: the simulator started in-process and driven
//! through Keel's Stripe client (`StripeProvider`), as the engine would drive Stripe itself. One test binary keeps
//! link time down.

mod faults;
mod idempotency;
mod restart;
mod support;
mod trace_context;
