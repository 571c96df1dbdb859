//! Keel's pure core: what happened, what it means, and what to do next.
//!
//! - [`event`] — the stored facts ([`event::Event`]) and their envelope; the hash chain.
//! - [`append`] — the one append rule (encode, bound, number, chain) every log applies.
//! - [`ledger`] — the fold of those facts ([`ledger::Ledger`]) and every decision taken
//!   against it: reservation, attempts, outcomes, reconciliation, approvals, runs.
//! - [`canonical`] — canonical JSON and payload fingerprints.
//! - [`provider`] — the payment provider contract and its typed outcomes.
//! - [`executor`] — journaled workflows and the replaying executor.
//! - [`facts`] — controlled facts (seed 001): explicit user assertions with their quotes,
//!   admitted whole or refused whole, evicted, corrected and forgotten by the rules.
//! - [`failpoints`] — named crash points at every event boundary (disarmed by default).
//! - [`money`] — currency codes, bounded amounts and checked sums of minor units.
//! - [`policy`] — the operator's policy per tenant and operation, and the caller's flags that
//!   may only tighten it.
//! - [`lease`] — run leases and fencing tokens: who may act for a run.
//! - [`clock`] and [`limits`] — time as an input, and every bound in one file.
//!
//! The engine does no I/O and never reads a clock: the store appends, the adapters reach the
//! network, the binary supplies the time.
//!
//! ```
//! use engine::canonical::fingerprint;
//! use serde_json::json;
//! // Two spellings of one payload give one fingerprint.
//! assert_eq!(fingerprint(&json!({"amount_minor": 4900, "currency": "EUR"})),
//!            fingerprint(&json!({"currency": "EUR", "amount_minor": 4.9e3})));
//! ```
pub mod append;
pub mod canonical;
pub mod clock;
pub mod event;
pub mod executor;
pub mod facts;
pub mod failpoints;
pub mod lease;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod memory;
pub mod money;
pub mod policy;
pub mod provider;
