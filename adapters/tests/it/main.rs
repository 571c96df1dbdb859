//! Integration tests of the adapters crate: the simulator started in-process and driven
//! through `HttpProvider`, as the engine would drive a real provider. One test binary keeps
//! link time down.

mod faults;
mod idempotency;
mod restart;
mod support;
mod trace_context;
